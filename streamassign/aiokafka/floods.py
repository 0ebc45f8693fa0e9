"""Bounding the lines aiokafka repeats while a broker is unreachable.

aiokafka's client logs each failed connection and metadata update, and a producer whose
partition has no known leader asks for a metadata update again as soon as one fails, without
the backoff its code promises (``aiokafka/producer/sender.py``, ``_sender_routine``; the same
class of bug as aio-libs/aiokafka#1155): with the connection refused, one producer logged
about 2,000 lines/s for as long as a restarted broker was away (42,800 lines for 20 s). The
runtime cannot change that loop; ``BrokerAwayLines`` keeps its lines to one per cause per
``LINES_WINDOW`` and says how many it held back. aiokafka's lines name no client, so the
filter applies to every client of the process while an ``App`` runs (``App.start`` attaches
one to the ``aiokafka`` logger, ``App.stop`` removes it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

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
        key = (record.msg, str(args[0]) if args else "")
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
