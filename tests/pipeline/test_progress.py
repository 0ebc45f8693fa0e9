"""The progress of Spark actions as a log shows it (no terminal, no Spark: a stand-in
status tracker)."""

from __future__ import annotations

import contextlib
import io
import re
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from streamassign.pipeline.progress import run_tracked


class _EightTasksDone:
    """A status tracker whose group ran one stage of 8 tasks, all done."""

    def getJobIdsForGroup(self, group: str) -> list[int]:
        return [1]

    def getJobInfo(self, job: int) -> Any:
        return SimpleNamespace(stageIds=[0])

    def getStageInfo(self, stage: int) -> Any:
        return SimpleNamespace(numCompletedTasks=8, numTasks=8)


def _session() -> Any:
    context = SimpleNamespace(
        setJobGroup=lambda *a, **k: None, statusTracker=lambda: _EightTasksDone()
    )
    return SimpleNamespace(sparkContext=context)


def test_a_log_gets_the_whole_line_at_80_columns() -> None:
    """An audit found, outside a terminal, ``simulating  Spark tasks (1 stage), 31,000
    rebalances (counted as tasks finish) …``: rich cropped the finished bar to 80 columns and
    the task count and the elapsed time were what went."""
    log = io.StringIO()
    console = Console(file=log, width=80)
    assert not console.is_terminal
    detail = "31,000 rebalances (counted as tasks finish)"
    assert run_tracked(_session(), "simulating", console, lambda: 7, lambda: detail) == 7
    assert re.fullmatch(
        r"simulating 8/8 Spark tasks \(1 stage\), 31,000 rebalances \(counted as tasks finish\) "
        r"0:00:0\d\n",
        log.getvalue(),
    ), log.getvalue()


@pytest.mark.parametrize("interrupted", [False, True])
def test_a_plain_step_ends_in_one_plain_line_in_a_log(interrupted: bool) -> None:
    """A review's log of a start-up interrupted outside a terminal showed rich's last frame,
    ``⠋ starting Spark (local[*]) 0:00:01``; a finished step kept two spaces of indent."""
    from streamassign.pipeline.progress import plain_step

    log = io.StringIO()
    console = Console(file=log, width=80)
    with contextlib.suppress(KeyboardInterrupt), plain_step("starting Spark (local[*])", console):
        if interrupted:
            raise KeyboardInterrupt
    assert re.fullmatch(r"starting Spark \(local\[\*\]\) 0:00:0\d\n", log.getvalue()), (
        log.getvalue()
    )
