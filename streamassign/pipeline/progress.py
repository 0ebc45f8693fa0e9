"""Progress of the pipeline's commands on the terminal (rich), on stderr.

The signal handling these steps run under is in :mod:`.signals` (no rich: executors import it).

:func:`run_tracked` shows a Spark action's tasks as they complete: the action runs in a
worker thread, in a job group of its own, while the calling thread polls Spark's status tracker
(jobs of the group, their stages, completed and total tasks) twice a second.
:func:`plain_step` shows a step without Spark (a spinner and the elapsed time). Outside a
terminal each step ends in one line, so logs get one line per step.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import secrets
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

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

from .signals import interrupt_flag

__all__ = [
    "plain_step",
    "run_tracked",
    "stderr_console",
    "stderr_joins_stdout",
]

_POLL_S = 0.5
#: How long a cancelled action may take to stop after Ctrl-C.
_CANCEL_WAIT_S = 30.0

T = TypeVar("T")


def stderr_console(quiet: bool = False) -> Console:
    """Where progress goes: stderr, so that stdout stays parseable (``--json``); nowhere when
    ``quiet`` (stderr would land in a JSON stdout: :func:`stderr_joins_stdout`)."""
    return Console(stderr=True, quiet=quiet, emoji=False)  # run ids and paths verbatim


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
    # Text columns without markup: a description names the master (spark://[fd00::1]:7077).
    bar = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("Spark tasks {task.fields[detail]}", markup=False),
        TimeElapsedColumn(),
        console=console,
        disable=not live,
    )
    with _started_on_terminal(bar, live):
        try:
            yield bar
        finally:  # interrupted or failed too: the log shows how far it got
            if not live:
                for task in bar.tasks:
                    console.print(_log_line(task), soft_wrap=True, markup=False, highlight=False)


def _started_on_terminal(bar: Progress, live: bool) -> contextlib.AbstractContextManager[Any]:
    """``bar`` itself on a terminal; elsewhere a bar that is never started or stopped: rich
    before 14.3 prints an empty line when a Progress stops outside a terminal, even a disabled
    one (its tasks and their times work unstarted)."""
    # An if, not a conditional expression: mypy before 1.20 joins the two branches to object.
    if live:
        return bar
    return contextlib.nullcontext()


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
    with _progress(console) as bar, interrupt_flag() as interrupted:
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
    bar = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}", markup=False),
        TimeElapsedColumn(),
        console=console,
        disable=not live,
    )
    with _started_on_terminal(bar, live):
        task = bar.add_task(description, total=1)
        try:
            yield
            bar.update(task, completed=1)
        finally:
            if not live:
                seconds = bar.tasks[0].finished_time or bar.tasks[0].elapsed or 0
                line = f"{description} {datetime.timedelta(seconds=int(seconds))}"
                console.print(line, soft_wrap=True, markup=False, highlight=False)
