"""Signals for the pipeline's commands: Ctrl-C, SIGTERM and SIGHUP as one interrupt.

:func:`interrupt_on_signals` makes SIGTERM and SIGHUP stop a command as Ctrl-C does,
:func:`deferred_signals` holds them over a step that must not stop halfway (a JVM start, a run
published), :func:`interrupt_flag` turns them into an event a polling loop checks, and
:func:`quiet_py4j` keeps py4j's traces of a JVM the same signal stopped off the screen.

Standard library only: Spark's executors import :mod:`.runs` (through :mod:`.spark`), which
defers signals while it publishes, on a Python that may have nothing but pyspark and the
shipped code (no rich, which :mod:`.progress` needs).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final

import attrs

__all__ = [
    "INTERRUPTING_SIGNALS",
    "Interrupted",
    "deferred_signals",
    "interrupt_flag",
    "interrupt_on_signals",
    "quiet_py4j",
]

#: Signals that stop a command as Ctrl-C does: SIGTERM (``timeout``, a CI job cancelled, a
#: service stopped) and SIGHUP (its terminal closed). Each ends in ``KeyboardInterrupt(signum)``.
INTERRUPTING_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(threading.Event):
    """Set by the first interrupting signal; ``signum`` is which."""

    signum: int = signal.SIGINT


@contextmanager
def interrupt_flag() -> Iterator[Interrupted]:
    """An event set by the first Ctrl-C, SIGTERM or SIGHUP (the second one raises at once), in
    the main thread; elsewhere an event nobody sets."""
    flag = Interrupted()

    def handler(signum: int, frame: Any) -> None:
        if flag.is_set():
            raise KeyboardInterrupt(signum)
        flag.signum = signum
        flag.set()

    with _handling(handler):
        yield flag


@contextmanager
def interrupt_on_signals() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGHUP raise ``KeyboardInterrupt(signum)`` as Ctrl-C
    raises ``KeyboardInterrupt``, so that the same cleanup runs (a partial run deleted, the
    session stopped); by default they would end the process with nothing cleaned up. Only in
    the main thread (elsewhere it does nothing)."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(signum)

    with _handling(handler, INTERRUPTING_SIGNALS[1:]):
        yield


@contextmanager
def deferred_signals() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP wait until the block ends, then raise
    ``KeyboardInterrupt(signum)`` (the first one's): for steps that must not stop halfway.
    A JVM start stopped halfway leaves the JVM running for good; a run published halfway
    leaves the new run deleted and the old one aside. A block that raises after a signal
    raises ``KeyboardInterrupt(signum)`` from that (the JVM the signal stopped too fails its
    start): the signal is what counts. A second signal ends at once: the handlers of before
    the block are put back and get it (a Spark master that never answers would otherwise
    leave only ``kill -9``). Only in the main thread (elsewhere it does nothing)."""
    received: list[int] = []
    taken_over: dict[int, Any] = {}

    def handler(signum: int, frame: Any) -> None:
        received.append(signum)
        if len(received) > 1:  # the user insists: as if the block were not deferred
            _restore(taken_over)
            os.kill(os.getpid(), signum)

    try:
        with _handling(handler, taken_when_ignored=()) as previous:
            taken_over.update(previous)
            yield
    except KeyboardInterrupt:
        raise  # a second signal's, or the block's own
    except BaseException as exc:
        if received:
            raise KeyboardInterrupt(received[0]) from exc
        raise
    if received:
        raise KeyboardInterrupt(received[0])


class _NotFromPy4J(logging.Filter):
    """Drops the records py4j logs on the root logger (``logging.exception``) before raising."""

    def filter(self, record: logging.LogRecord) -> bool:
        return f"{os.sep}py4j{os.sep}" not in record.pathname


@contextmanager
def quiet_py4j() -> Iterator[None]:
    """No py4j log records, on its own logger or the root one, while the block runs; then
    py4j's level as it was and the filter gone (an embedding notebook keeps py4j's logs after
    the command). For a command that may be interrupted: every call to a JVM that the signal
    also stopped (the whole process group got it) logs a 30-line trace before raising what
    the cleanup suppresses or the command says in one line. Other loggers stay as they were."""
    py4j, root = logging.getLogger("py4j"), logging.getLogger()
    level, dropped = py4j.level, _NotFromPy4J()
    py4j.setLevel(logging.CRITICAL + 1)  # and its children
    root.addFilter(dropped)
    try:
        yield
    finally:
        root.removeFilter(dropped)
        py4j.setLevel(level)


@attrs.frozen
class _Taken:
    """A signal handler of this module's: a nested block may take the signal over from it."""

    handler: Callable[[int, Any], None]

    def __call__(self, signum: int, frame: Any) -> None:
        self.handler(signum, frame)


def _may_take(signum: int, taken_when_ignored: tuple[int, ...]) -> bool:
    """Whether to handle ``signum`` as it is handled now. SIGTERM and SIGHUP only from their
    default (ending the process) or from this module: one ignored stays ignored (``nohup``
    ignores SIGHUP so that a closed terminal does not stop the run), and an embedding caller's
    own handler keeps running. SIGINT unless ignored, or even then if in
    ``taken_when_ignored``: Ctrl-C stops a tracked action in a background job too."""
    current = signal.getsignal(signum)
    if signum == signal.SIGINT:
        return signum in taken_when_ignored or current is not signal.SIG_IGN
    return current is signal.SIG_DFL or isinstance(current, _Taken)


@contextmanager
def _handling(
    handler: Callable[[int, Any], None],
    signums: tuple[int, ...] = INTERRUPTING_SIGNALS,
    taken_when_ignored: tuple[int, ...] = (signal.SIGINT,),
) -> Iterator[dict[int, Any]]:
    """``handler`` for those of ``signums`` it may take (:func:`_may_take`) while the block
    runs (main thread only), then the handlers that were there before (yielded: signal to
    handler, empty off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield {}
        return
    taken = _Taken(handler)
    previous: dict[int, Any] = {}
    try:
        # Inside the try, each noted before it is taken: a signal whose handler raises while
        # they are installed leaves none of them taken for good.
        for signum in signums:
            if _may_take(signum, taken_when_ignored):
                previous[signum] = signal.getsignal(signum)
                signal.signal(signum, taken)
        yield previous
    finally:
        _restore(previous)


def _restore(handlers: dict[int, Any]) -> None:
    """Put ``handlers`` back, each whatever another's restore raised (its handler ran at once)."""
    if not handlers:
        return
    (signum, before), *rest = handlers.items()
    try:
        signal.signal(signum, before)
    finally:
        _restore(dict(rest))
