"""Bounding the lines aiokafka repeats while a broker is unreachable.

aiokafka's client logs each failed connection and metadata update, and a producer whose
partition has no known leader asks for a metadata update again as soon as one fails, without
the backoff its code promises (``aiokafka/producer/sender.py``, ``_sender_routine``; the same
class of bug as aio-libs/aiokafka#1155): with the connection refused, one producer logged
about 2,000 lines/s for as long as a restarted broker was away (42,800 lines for 20 s), in a
busy loop on the event loop. ``back_off_metadata_updates`` restores the backoff on the
runtime's producers; ``BrokerAwayLines`` keeps the lines of every client to one per cause
per ``LINES_WINDOW`` and says how many it held back. aiokafka's lines name no client, so the
filter applies to every client of the process while an ``App`` runs (``App.start`` attaches
one to the ``aiokafka`` logger, ``App.stop`` removes it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

#: The ``aiokafka`` logger, which logs the lines below (``aiokafka/client.py``).
AIOKAFKA_LOGGER = "aiokafka"

#: aiokafka's lines (their format strings) that repeat while a broker is unreachable.
REPEATING = frozenset(
    {
        "Unable connect to node with id %s: %s",
        'Unable connect to "%s:%s": %s',
        "Unable to update metadata from %s",
        "Unable to request metadata from node with id %s: %r",
    }
)

#: Seconds during which a repeating line with the same first argument (a node) is logged
#: once; the next one after them says how many were held back.
LINES_WINDOW = 30.0


#: Seconds a producer waits after a failed metadata update before the next one, if its
#: client has no ``retry_backoff_ms`` of its own to go by (aiokafka's default: 100 ms).
METADATA_BACKOFF = 0.1


def back_off_metadata_updates(producer: Any) -> None:
    """Make ``producer``'s client wait its ``retry_backoff_ms`` after a failed metadata update
    before it starts another. aiokafka's sender asks for one again as soon as one fails while
    a batch's partition has no known leader (see the module docstring): with the broker
    refusing connections that loop ran 2,900 updates/s and took 57% of a core (95% with its
    lines filtered) on the event loop every consumer shares. The client's
    ``force_metadata_update`` is replaced on this one instance (aiokafka calls it through the
    instance; ``tests/test_runtime_release.py`` checks the installed aiokafka still does)."""
    client = producer.client
    # Never undone, and need not be: the client is this producer's own (made in its
    # ``__init__``, shared with no other client) and a stopped producer is never started
    # again, so the replacement ends with it; the class's method stays untouched for every
    # other client. A backoff timer still pending at stop only ends a future nobody awaits.
    backoff = getattr(client, "_retry_backoff", METADATA_BACKOFF)
    client.force_metadata_update = _MetadataBackoff(client.force_metadata_update, backoff)


class _MetadataBackoff:
    """A client's ``force_metadata_update`` that, within ``backoff`` s of a failed update,
    returns a future ending (False: nothing updated) when the backoff does, instead of
    starting an update."""

    def __init__(self, force: Callable[[], asyncio.Future[bool]], backoff: float) -> None:
        self._force = force
        self._backoff = backoff
        #: When the last update failed (the loop's time); None: it succeeded.
        self._failed_at: float | None = None
        #: The update whose outcome is watched (``_note``), once per update.
        self._watched: asyncio.Future[bool] | None = None
        #: What callers within the backoff wait on.
        self._waiting: asyncio.Future[bool] | None = None

    def __call__(self) -> asyncio.Future[bool]:
        loop = asyncio.get_running_loop()
        if self._failed_at is not None:
            left = self._failed_at + self._backoff - loop.time()
            if left > 0:
                if self._waiting is None or self._waiting.done():
                    self._waiting = loop.create_future()
                    loop.call_later(left, _end_backoff, self._waiting)
                # Shielded, as aiokafka's own method does: one caller cancelled must not
                # cancel the others (the sender task ends quietly on CancelledError).
                return asyncio.shield(self._waiting)
        update = self._force()
        if update is not self._watched:
            self._watched = update
            update.add_done_callback(self._note)
        return update

    def _note(self, update: asyncio.Future[bool]) -> None:
        failed = update.cancelled() or update.exception() is not None or not update.result()
        self._failed_at = asyncio.get_running_loop().time() if failed else None


def _end_backoff(waiting: asyncio.Future[bool]) -> None:
    if not waiting.done():
        waiting.set_result(False)


class BrokerAwayLines(logging.Filter):
    """Passes the first of each repeating line (``REPEATING``, per node) in a window of
    ``window`` s and holds back the rest, counted: the next one passed after the window
    ends with ``(N similar lines suppressed in the last <s> s)``, and ``summary`` says what
    was held back since. Any other line passes unchanged."""

    def __init__(self, window: float = LINES_WINDOW, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.window = window
        self._clock = clock
        #: When the window of each (line, node) began.
        self._window_began: dict[tuple[str, str], float] = {}
        #: Lines held back in the current window of each (line, node).
        self._held_back: dict[tuple[str, str], int] = {}
        #: Lines held back since the filter was made.
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not isinstance(record.msg, str) or record.msg not in REPEATING:
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        # Per node: every argument but the error text that ends the longer lines (host and
        # port both: two brokers on one host are two nodes).
        node = args[:-1] if len(args) > 1 else args
        key = (record.msg, ":".join(map(str, node)))
        now = self._clock()
        began = self._window_began.get(key)
        if began is not None and now - began < self.window:
            self._held_back[key] = self._held_back.get(key, 0) + 1
            self.suppressed += 1
            return False
        self._window_began[key] = now
        held_back = self._held_back.pop(key, 0)
        if held_back:
            record.msg = f"{record.msg} (%d similar lines suppressed in the last %g s)"
            record.args = (*args, held_back, self.window)
        return True

    def summary(self) -> str | None:
        """What was held back and not yet said (then forgotten), or None."""
        held_back = sum(self._held_back.values())
        self._held_back.clear()
        if not held_back:
            return None
        return (
            f"aiokafka: {held_back} similar lines suppressed (failed connections and metadata "
            f"updates, logged once per node per {self.window:g} s; broker unreachable?)"
        )
