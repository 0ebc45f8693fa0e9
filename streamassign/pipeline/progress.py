"""Progress of the pipeline's commands on the terminal (rich), on stderr.

:func:`run_tracked` shows a Spark action's tasks as they complete: the action runs in a
worker thread, in a job group of its own, while the calling thread polls Spark's status tracker
(jobs of the group, their stages, completed and total tasks) twice a second.
:func:`plain_step` shows a step without Spark (a spinner and the elapsed time). Outside a
terminal each step ends in one line, so logs get one line per step.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import secrets
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final, TypeVar, cast

import attrs
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

__all__ = [
    "INTERRUPTING_SIGNALS",
    "deferred_signals",
    "interrupt_on_signals",
    "plain_step",
    "quiet_py4j",
    "run_tracked",
    "stderr_console",
    "stderr_joins_stdout",
]

_POLL_S = 0.5
#: How long a cancelled action may take to stop after Ctrl-C.
_CANCEL_WAIT_S = 30.0

T = TypeVar("T")

#: Signals that stop a command as Ctrl-C does: SIGTERM (``timeout``, a CI job cancelled, a
#: service stopped) and SIGHUP (its terminal closed). Each ends in ``KeyboardInterrupt(signum)``.
INTERRUPTING_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def stderr_console(quiet: bool = False) -> Console:
    """Where progress goes: stderr, so that stdout stays parseable (``--json``); nowhere when
    ``quiet`` (stderr would land in a JSON stdout: :func:`stderr_joins_stdout`)."""
    return Console(stderr=True, quiet=quiet)


def stderr_joins_stdout() -> bool:
    """Whether what this process writes to stderr lands in its stdout's file or pipe.

    Under ``spark-submit`` it always does: Spark's PythonRunner starts the driver with its
    stderr redirected into its stdout (``PYSPARK_GATEWAY_PORT`` tells that the JVM launched
    us). Elsewhere, when both are one file or pipe (``> out 2>&1``) that is not a terminal: on
    a terminal progress is for the eyes and never reaches a reader of stdout.
    """
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        return True
    try:
        same = os.path.samestat(os.fstat(1), os.fstat(2))
        return same and not os.isatty(2)
    except OSError:  # a closed stdout or stderr: nothing written there is read
        return False


@contextmanager
def _progress(console: Console) -> Iterator[Progress]:
    """The bar of a Spark action on a terminal. Elsewhere (a log, a pipe, spark-submit's
    output) rich would print the finished bar once, cropped to the console's width (80
    columns): a long detail pushed out the task count and the elapsed time. There each task
    ends in one plain line instead, as long as it needs (:func:`_log_line`)."""
    live = console.is_terminal
    bar = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("Spark tasks {task.fields[detail]}"),
        TimeElapsedColumn(),
        console=console,
        disable=not live,
    )
    with bar:
        try:
            yield bar
        finally:  # interrupted or failed too: the log shows how far it got
            if not live:
                for task in bar.tasks:
                    console.print(_log_line(task), soft_wrap=True, markup=False, highlight=False)


def _log_line(task: Task) -> str:
    """``simulating 8/8 Spark tasks (1 stage), 31,000 rebalances ... 0:01:19``: the bar's
    columns as text."""
    done = f"{int(task.completed)}/{int(task.total) if task.total is not None else '?'}"
    seconds = task.finished_time if task.finished_time is not None else task.elapsed
    elapsed = datetime.timedelta(seconds=int(seconds or 0))
    return f"{task.description} {done} Spark tasks {task.fields['detail']} {elapsed}"


def _tasks_of_group(tracker: Any, group: str) -> tuple[int, int, int]:
    """(completed tasks, total tasks, stages seen) over every job of ``group``."""
    done = total = stages = 0
    for job_id in tracker.getJobIdsForGroup(group):
        job = tracker.getJobInfo(job_id)
        for stage_id in job.stageIds if job is not None else ():
            stage = tracker.getStageInfo(stage_id)
            if stage is None:  # not submitted yet, or skipped
                continue
            stages += 1
            done += stage.numCompletedTasks
            total += stage.numTasks
    return done, total, stages


def run_tracked(
    spark: Any,
    description: str,
    console: Console,
    action: Callable[[], T],
    detail: Callable[[], str] | None = None,
) -> T:
    """Run ``action`` (Spark jobs) and show its tasks as one bar; ``detail`` adds text.

    The action runs in a worker thread, in a job group of its own; this thread polls the status
    tracker. Ctrl-C cancels the group's jobs, waits for the worker to stop, and raises
    ``KeyboardInterrupt`` here: no Py4J call is interrupted halfway (pyspark's own handler
    would cancel from inside the running call and print pages of Py4J errors). A second Ctrl-C
    stops waiting.
    """
    sc = spark.sparkContext
    group = f"streamassign-{secrets.token_hex(4)}"
    outcome: dict[str, Any] = {}

    def work() -> None:
        # Interrupt running tasks on cancel: Ctrl-C should free the executors at once.
        sc.setJobGroup(group, description, interruptOnCancel=True)
        try:
            outcome["value"] = action()
        except BaseException as exc:  # handed to the calling thread
            outcome["error"] = exc

    worker = threading.Thread(target=work, name=f"{group}-action", daemon=True)
    with _progress(console) as bar, _interrupt_flag() as interrupted:
        task = bar.add_task(description, total=None, detail="")
        worker.start()
        while worker.is_alive() and not interrupted.is_set():
            worker.join(_POLL_S)
            with contextlib.suppress(Exception):  # progress must never fail the job
                _update(sc, group, bar, task, detail)
        if interrupted.is_set():
            _cancel(sc, group, worker)
            raise KeyboardInterrupt(interrupted.signum)
        if "error" in outcome:
            raise outcome["error"]
        # Done: the final counts, every task done (skipped stages never complete).
        _update(sc, group, bar, task, detail)
        total = bar.tasks[0].total or 0
        bar.update(task, completed=total, total=total)
    return cast(T, outcome["value"])


def _cancel(sc: Any, group: str, worker: threading.Thread) -> None:
    """Cancel ``group``'s jobs and wait for ``worker``; quietly, and not at all when the JVM
    is gone (a signal to the whole process group stops it too): the interrupt is what counts."""
    with contextlib.suppress(Exception):
        # Cancelled tasks and writers log pages of expected errors: keep them off screen.
        sc.setLogLevel("OFF")
        sc.cancelJobGroup(group)
        worker.join(_CANCEL_WAIT_S)
        sc.setLogLevel("WARN")


class _Interrupted(threading.Event):
    """Set by the first interrupting signal; ``signum`` is which."""

    signum: int = signal.SIGINT


@contextmanager
def _interrupt_flag() -> Iterator[_Interrupted]:
    """An event set by the first Ctrl-C, SIGTERM or SIGHUP (the second one raises at once), in
    the main thread; elsewhere an event nobody sets."""
    flag = _Interrupted()

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


def _update(
    sc: Any, group: str, bar: Progress, task: TaskID, detail: Callable[[], str] | None
) -> None:
    done, total, stages = _tasks_of_group(sc.statusTracker(), group)
    done = min(done, total)  # a retried task counts twice
    text = f"({stages} stage{'s' if stages != 1 else ''})"
    if detail is not None:
        text += f", {detail()}"
    bar.update(task, completed=done, total=total or None, detail=text)


@contextmanager
def plain_step(description: str, console: Console) -> Iterator[None]:
    """A spinner and the elapsed time while the block runs. Outside a terminal one plain
    line when it ends, interrupted or failed too (rich would print its last frame there: a
    spinner's character for an unfinished step, two spaces for a finished one)."""
    live = console.is_terminal
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        disable=not live,
    ) as bar:
        task = bar.add_task(description, total=1)
        try:
            yield
            bar.update(task, completed=1)
        finally:
            if not live:
                seconds = bar.tasks[0].finished_time or bar.tasks[0].elapsed or 0
                line = f"{description} {datetime.timedelta(seconds=int(seconds))}"
                console.print(line, soft_wrap=True, markup=False, highlight=False)
