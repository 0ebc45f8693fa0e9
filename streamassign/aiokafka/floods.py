"""Bounding the lines aiokafka repeats while a broker is unreachable.

aiokafka's client logs each failed connection and metadata update, and a producer whose
partition has no known leader asks for a metadata update again as soon as one fails, without
the backoff its code promises (``aiokafka/producer/sender.py``, ``_sender_routine``; the same
class of bug as aio-libs/aiokafka#1155): with the connection refused, one producer logged
about 2,000 lines/s for as long as a restarted broker was away (42,800 lines for 20 s), in a
busy loop on the event loop. Its other clients log each retry too, every ``retry_backoff_ms``
(the fetchers, the group coordinators, the producers' senders: about 50 lines/s for a runtime
with 3 tasks). ``back_off_metadata_updates`` restores the backoff on the runtime's producers;
``BrokerAwayLines`` keeps each of those lines to one per node and cause per ``LINES_WINDOW``
and says how many it held back. aiokafka's lines name no client, so the filter applies to
every client of the process while an ``App`` runs (``App.start`` attaches it to aiokafka's
loggers, ``App.stop`` detaches it; one filter, shared by the ``App``s of a process). Detached
by the last, it stays on the loggers, switched off: it passes every line.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import attrs

#: The ``aiokafka`` logger, which logs the client's lines below (``aiokafka/client.py``).
AIOKAFKA_LOGGER = "aiokafka"

#: aiokafka's lines (their format strings, by the logger that logs them) that repeat while a
#: broker is unreachable, and what the summary calls them. A logger's filter sees only the
#: records logged on that logger, not its children's, so the filter goes on each of these
#: loggers. Measured with a broker stopped for 19 s under a runtime ``App`` (3 tasks,
#: exactly once, records flowing): the fetchers' line about 19/s, the group coordinators'
#: about 19/s, the task producers' about 9/s; each other line at most a few times.
REPEATING: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        AIOKAFKA_LOGGER: frozenset(
            {
                "Unable connect to node with id %s: %s",
                'Unable connect to "%s:%s": %s',
                "Unable to update metadata from %s",
                "Unable to request metadata from node with id %s: %r",
            }
        ),
        # Each fetch to a node not ready fails at once, and is retried every
        # ``retry_backoff_ms`` (100 ms) per consumer.
        "aiokafka.consumer.fetcher": frozenset(
            {"Failed fetch messages from %s: %s", "Failed fetch offsets from %s: %s"}
        ),
        # The coordinator lookup, retried every ``retry_backoff_ms`` per consumer.
        "aiokafka.consumer.group_coordinator": frozenset({"Group Coordinator Request failed: %s"}),
        # A batch sent to a node not ready, retried every ``retry_backoff_ms`` per producer.
        "aiokafka.producer.sender": frozenset({"Got error produce response: %s"}),
    }
)

#: What the summary calls the lines of each logger.
KINDS: Mapping[str, str] = MappingProxyType(
    {
        AIOKAFKA_LOGGER: "failed connections and metadata updates",
        "aiokafka.consumer.fetcher": "failed fetches",
        "aiokafka.consumer.group_coordinator": "failed coordinator lookups",
        "aiokafka.producer.sender": "failed produce requests",
    }
)

#: Seconds during which a repeating line is logged once; the next one after them says how
#: many were held back.
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


#: Seconds without a repeating line after which its next one begins another episode (the
#: cause went away and came back: another outage) and passes, saying what the last held back.
EPISODE_GAP = 10.0

#: Guards ``attach``/``detach`` of the shared filter (whose users are counted on it) against
#: two threads at once: a Faust worker's consumer runs in its own thread. A lock, no data;
#: made anew in a forked child (``_after_fork_in_child``).
_ATTACHING = threading.Lock()

_Key = tuple[str, str, tuple[str, ...]]


@attrs.define
class _Line:
    """One repeating line's current window: when it began, when the line last came, how many
    were held back and not yet said, and since when (for the span the count is over)."""

    began: float
    last: float
    held: int = 0
    held_since: float = 0.0


class BrokerAwayLines(logging.Filter):
    """Passes the first of each repeating line (``REPEATING``) in a window of ``window`` s and
    holds back the rest, counted: the next one passed, after the window or after a gap of
    ``EPISODE_GAP`` s (another outage), ends with ``(N similar lines suppressed over <s> s)``,
    and ``summary`` says what was held back and not yet said. Any other line passes
    unchanged. Lines are told apart by their logger, format string and arguments' text,
    which name the node and the cause: a line for another node or another error is the first
    of its own and passes.

    One filter serves every ``App`` of the process (``attach``, ``detach``): a record goes
    through the filters of the logger it is logged on only once, so with one filter per
    ``App`` the first would hold back every repeat and the second would count none of them,
    and its ``App``'s stop would say nothing was held back. Being shared, it is found on the
    loggers (the logging module's state: aiokafka's loggers are the process's) rather than
    held by us; it outlives an ``App`` never stopped, and counts are the process's. It holds
    lines back only while attached (``active``); detached by its last user it stays on the
    loggers, switched off. Its state is locked: aiokafka's clients log from every thread
    that runs one. In a forked child, found on the loggers there, it starts afresh: switched
    off, with no user counted and its lock made anew (``_after_fork_in_child``)."""

    def __init__(self, window: float = LINES_WINDOW, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.window = window
        self._clock = clock
        self._lock = threading.Lock()
        #: Each repeating line (logger, format string, arguments' text) seen lately.
        self._lines: dict[_Key, _Line] = {}
        #: Counts of lines swept while held back and not yet said, per kind (``KINDS``).
        self._unsaid: dict[str, int] = {}
        #: When lines were last swept (``_forget_ended``).
        self._swept = clock()
        #: Lines held back since the filter was made.
        self.suppressed = 0
        #: The ``App``s (and Faust workers) that attached this filter and have not detached it
        #: yet.
        self.users = 0
        #: Whether it holds lines back: False once its last user detached it, until the next
        #: attach. Changed under ``_lock``.
        self._on = True

    @property
    def active(self) -> bool:
        """Whether it holds lines back (False once detached by its last user)."""
        return self._on

    @classmethod
    def attach(cls) -> BrokerAwayLines:
        """The process's filter on every logger of ``REPEATING``, switched on, one more user
        counted. The shared filter is found where it already is, on the ``aiokafka`` logger's
        ``filters``, else made and put first among each logger's filters: one that renders
        the message (redaction, structured logging) would leave ours nothing to recognise.
        Only that first attach of a process changes the loggers' lists: ``detach`` leaves the
        filter there, switched off, so no later start or stop of an ``App`` or a Faust worker
        touches them, and a user's ``addFilter`` or ``removeFilter`` in another thread
        meanwhile is never lost (replacing the lists at every attach and detach would lose
        some). The list is replaced, not changed: other threads log through it
        meanwhile (``Filterer.filter`` iterates it unlocked), and an insert in place would
        shift the filters under them, applying one of the user's twice."""
        with _ATTACHING:
            found = (f for f in logging.getLogger(AIOKAFKA_LOGGER).filters if isinstance(f, cls))
            lines = next(found, None) or cls()
            for name in REPEATING:
                logger = logging.getLogger(name)
                if lines not in logger.filters:
                    logger.filters = [lines, *logger.filters]
            with lines._lock:
                if not lines._on:  # switched on again: its windows count from now
                    lines._on, lines._swept = True, lines._clock()
                lines.users += 1
        return lines

    def detach(self) -> str | None:
        """One user fewer; the last one switches the filter off: it then passes every line,
        counts none and forgets the lines it had seen (a later attach starts afresh). Returns
        what was held back and not yet said (``summary``): with two ``App``s, the first to
        stop says what both had held back so far (aiokafka's lines name no client)."""
        with _ATTACHING, self._lock:
            by_kind = self._take_unsaid()
            self.users = max(self.users - 1, 0)
            if not self.users:
                self._on = False
                self._lines.clear()
                self._unsaid.clear()
        return self._summarise(by_kind)

    def filter(self, record: logging.LogRecord) -> bool:
        # Switched off (detached), a record costs this attribute read.
        if not self._on:
            return True
        if not isinstance(record.msg, str) or record.msg not in REPEATING.get(record.name, ()):
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        key = (record.name, record.msg, tuple(map(_text, args)))
        with self._lock:
            if not self._on:  # switched off meanwhile: nothing is kept after detach
                return True
            now = self._clock()
            line = self._lines.get(key)
            if line is not None and self._goes_on(line, now):
                if not line.held:
                    line.held_since = now
                line.held += 1
                line.last = now
                self.suppressed += 1
                return False
            self._lines.pop(key, None)  # what it held back is said by this record
            self._forget_ended(now)
            self._lines[key] = _Line(now, now)
        if line is not None and line.held:
            record.msg = f"{record.msg} (%d similar lines suppressed over %s)"
            record.args = (*args, line.held, _span(line.last - line.held_since))
        return True

    def _goes_on(self, line: _Line, now: float) -> bool:
        """Whether ``line`` comes again in its window and its episode (held back then)."""
        return now - line.began < self.window and now - line.last < EPISODE_GAP

    def _forget_ended(self, now: float) -> None:
        """At most once per window, drops the lines whose window ended with nothing held back,
        and those whose episode ended (their count kept per kind for ``summary``), so that
        lines naming nodes or errors long gone do not pile up in a long-running process (and
        a busy process does not scan them at every line)."""
        if now - self._swept < self.window:
            return
        self._swept = now
        ended = [
            (key, line)
            for key, line in self._lines.items()
            if now - line.began >= self.window and (not line.held or now - line.last >= EPISODE_GAP)
        ]
        for (logger, _, _), line in ended:
            self._unsaid[KINDS[logger]] = self._unsaid.get(KINDS[logger], 0) + line.held
        for key, _ in ended:
            del self._lines[key]

    def summary(self) -> str | None:
        """What was held back and not yet said (then forgotten), or None."""
        with self._lock:
            by_kind = self._take_unsaid()
        return self._summarise(by_kind)

    def _take_unsaid(self) -> dict[str, int]:
        """The counts held back and not yet said, by kind, then forgotten (under ``_lock``)."""
        by_kind, self._unsaid = {k: n for k, n in self._unsaid.items() if n}, {}
        for (logger, _, _), line in self._lines.items():
            if line.held:
                by_kind[KINDS[logger]] = by_kind.get(KINDS[logger], 0) + line.held
                line.held = 0
        return by_kind

    def _start_afresh_in_forked_child(self) -> None:
        """After ``os.fork``, in the child, which has only the forking thread: a new lock (a
        thread of the parent may have held this one at the fork, and would never release it
        here) and the state of a filter no one uses yet. The users counted are the parent's
        ``App``s, whose threads and loops do not run in the child (counted, the child's own
        ``App``'s stop would never switch the filter off), and what was held back is the
        parent's to say. Switched off: the child's own first attach switches it on."""
        self._lock = threading.Lock()
        self.users = 0
        self._on = False
        self._lines = {}
        self._unsaid = {}
        self.suppressed = 0

    def _summarise(self, by_kind: Mapping[str, int]) -> str | None:
        """The summary line of ``by_kind`` (``_take_unsaid``), or None if nothing was held."""
        if not by_kind:
            return None
        kinds = ", ".join(f"{count} {kind}" for kind, count in by_kind.items())
        return (
            f"aiokafka: {sum(by_kind.values())} similar lines suppressed ({kinds}; each line "
            f"logged once per {self.window:g} s; broker unreachable?)"
        )


def _after_fork_in_child() -> None:
    """Unlocks what a thread of the parent may have held at the fork: the attach lock, made
    anew, and the shared filter, found where ``attach`` put it and started afresh. The
    loggers are read from logging's registry, not through ``getLogger``: that takes no lock
    and makes no logger in a child that has none."""
    global _ATTACHING
    _ATTACHING = threading.Lock()
    registered = logging.Logger.manager.loggerDict
    loggers = [registered.get(name) for name in REPEATING]
    shared = {
        id(f): f
        for logger in loggers
        if isinstance(logger, logging.Logger)
        for f in logger.filters
        if isinstance(f, BrokerAwayLines)
    }
    for lines in shared.values():
        lines._start_afresh_in_forked_child()


if hasattr(os, "register_at_fork"):  # not on Windows, WASI or Emscripten: no fork there
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _text(argument: object) -> str:
    """An argument's text in a line's key. A list (aiokafka's ``Unable to update metadata
    from %s`` names its brokers in a shuffled order) counts by its sorted items, so each
    order is not a line of its own."""
    if isinstance(argument, list | tuple | set | frozenset):
        return repr(sorted(map(str, argument)))
    return str(argument)


def _span(seconds: float) -> str:
    """How long a count of held-back lines is over, for the line that says it."""
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
