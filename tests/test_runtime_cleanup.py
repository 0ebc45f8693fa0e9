"""The runtime deletes the local state of tasks it no longer holds (``state_cleanup_delay_ms``),
and never that of a task it holds in any role. No broker: the task changes are driven by hand
(the broker test is in tests/integration/test_runtime.py)."""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from streamassign import Subtopology, TaskId, TopicPartition, Topology
from streamassign.assignment import ClientAssignment
from streamassign.localstate import StateDirectory
from streamassign.runtime import App, RuntimeConfigError
from streamassign.runtime.cleanup import StateCleanup

TOPOLOGY = Topology([Subtopology(0, ["events"], stores=["totals"])], name="app")
DELAY_MS = 1000
T = [TaskId(0, p) for p in range(6)]


class Nothing:
    async def process(self, ctx: object, record: object) -> None: ...


def app_with_state(tmp_path: Path, **options: object) -> App:
    """An app whose state directory holds a checkpoint of every task (from an earlier run)."""
    state = StateDirectory(tmp_path)
    for task in T:
        state.write_checkpoint(task, {TopicPartition("app-totals-changelog", task.partition): 9})
    state.close()
    return App(
        TOPOLOGY,
        {0: Nothing},
        bootstrap_servers="x:1",
        state_dir=tmp_path,
        threads=2,
        store_kind="memory",
        **{"state_cleanup_delay_ms": DELAY_MS, **options},  # type: ignore[arg-type]
    )


def cleanup_of(app: App) -> StateCleanup:
    assert app._cleanup is not None
    return app._cleanup


def test_only_state_not_held_for_the_delay_is_removed(tmp_path: Path) -> None:
    app = app_with_state(tmp_path)
    cleanup = cleanup_of(app)
    state = app.host.state

    async def run() -> None:
        await app._add_standbys(1, frozenset({T[1]}))  # a standby
        app._stores.parked[T[2]] = ({}, "kept")  # left a role in the rebalance under way
        app.host._known[0] = ClientAssignment(active=frozenset({T[3]}))  # not opened yet
        app.host._restored = {1: frozenset({T[4]})}  # claimed back after the restart
        now = time.monotonic()
        cleanup.started = now - DELAY_MS / 1000  # on disk at start, a delay ago
        app._changes = 1  # a task change under way: what is held is unknown
        assert cleanup.retire(now) is None
        app._changes = 0
        assert cleanup.retire(now - 0.01) == []  # not a whole delay yet
        assert cleanup.retire(now) == [T[0], T[5]]
        assert set(state.offset_sums()) == {T[1], T[2], T[3], T[4]}
        assert set(app.host.offset_sums()) == {T[1], T[2], T[3], T[4]}

        # Tasks released later count from then: the standby and the parked task close.
        await app._remove_standbys(1, frozenset({T[1]}))
        await asyncio.gather(*app._stores.close_parked())
        closed = app._stores.closed_at[T[1]]
        assert closed >= now and app._stores.closed_at[T[2]] >= now
        assert cleanup.retire(closed + 0.99 * DELAY_MS / 1000) == []
        last = max(app._stores.closed_at.values()) + DELAY_MS / 1000
        assert cleanup.retire(last) == [T[1], T[2]]
        assert T[1] not in app._stores.closed_at  # forgotten with the state

        # A task last seen held at a check counts from that check (it has no close).
        app.host._known[0] = ClientAssignment()  # T[3] unassigned before it ever opened
        assert cleanup.retire(last + 0.5) == []  # T[4] still claimed: seen held then
        app.host._restored = {}
        assert cleanup.retire(last + 0.99 * DELAY_MS / 1000) == []
        assert cleanup.retire(last + DELAY_MS / 1000) == [T[3]]
        assert cleanup.retire(last + 0.5 + 0.99 * DELAY_MS / 1000) == []
        assert cleanup.retire(last + 0.5 + DELAY_MS / 1000) == [T[4]]
        assert state.local_tasks() == set() and state.delete_retired() == 6
        assert list((tmp_path / "tasks").iterdir()) == []
        app._stores.shutdown()

    asyncio.run(run())


def test_the_cleanup_loop_deletes_in_the_background_and_stops_with_the_app(
    tmp_path: Path,
) -> None:
    app = app_with_state(tmp_path, state_cleanup_delay_ms=50)
    leftover = tmp_path / "tasks" / "0_0.removed-0123456789ab"  # a crash mid-delete
    (leftover / "totals.rocksdb").mkdir(parents=True)

    async def run() -> None:
        await app._add_standbys(0, frozenset({T[1]}))
        loop = asyncio.create_task(cleanup_of(app).run(app._stopped))
        deadline = time.monotonic() + 10
        while app.host.state.local_tasks() != {T[1]} or leftover.exists():
            assert time.monotonic() < deadline, sorted((tmp_path / "tasks").iterdir())
            await asyncio.sleep(0.01)
        app._stopped.set()
        await asyncio.wait_for(loop, 5)

    asyncio.run(run())
    assert sorted(p.name for p in (tmp_path / "tasks").iterdir()) == ["0_1"]


def test_stop_does_not_wait_for_a_delete_under_way(tmp_path: Path) -> None:
    """A large store being deleted in its thread must not hold up the final commits and the
    group leave: ``stop`` leaves the delete to finish in its thread."""
    app = app_with_state(tmp_path, state_cleanup_delay_ms=50)
    deleting, release = threading.Event(), threading.Event()

    def slow_delete() -> int:
        deleting.set()
        release.wait(30)
        return 0

    app.host.state.delete_retired = slow_delete  # type: ignore[method-assign]

    async def run() -> None:
        cleaning = app._cleaning = asyncio.create_task(cleanup_of(app).run(app._stopped))
        assert await asyncio.to_thread(deleting.wait, 10)
        await asyncio.wait_for(app.stop(), 10)
        assert cleaning.done() and app._cleaning is None  # while the delete still runs
        release.set()

    asyncio.run(run())


def test_none_keeps_the_state_for_good(tmp_path: Path) -> None:
    app = app_with_state(tmp_path, state_cleanup_delay_ms=None)
    assert app._cleanup is None


@pytest.mark.parametrize("delay", [0, -1, 1.5, True, "600000", 2**63, 10**400])
def test_a_bad_delay_is_refused_with_one_line(tmp_path: Path, delay: object) -> None:
    with pytest.raises(
        RuntimeConfigError, match=r"state_cleanup_delay_ms must be an int >= 1 and <= 2\*\*63 - 1"
    ):
        App(
            TOPOLOGY,
            {0: Nothing},
            bootstrap_servers="x:1",
            state_dir=tmp_path,
            state_cleanup_delay_ms=delay,  # type: ignore[arg-type]
        )


def test_a_linked_task_directory_is_logged_as_a_link_whose_target_is_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = app_with_state(tmp_path / "state")
    elsewhere = tmp_path / "other-volume" / "0_0"
    shutil.move(app.host.state.task_dir(T[0]), elsewhere)
    app.host.state.task_dir(T[0]).symlink_to(elsewhere)
    cleanup = cleanup_of(app)
    with caplog.at_level(logging.INFO, "streamassign.runtime"):
        assert cleanup.retire(cleanup.started + DELAY_MS / 1000) == T
    assert app.host.state.delete_retired() == len(T)
    assert (elsewhere / "checkpoint").is_file()  # never followed
    assert (
        f"task 0_0: local state removed (a link to {elsewhere}: link removed, its target kept)"
        in (caplog.records[0].getMessage())
    )
    app._stores.shutdown()


def test_a_check_failing_every_time_logs_its_traceback_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cleanup = cleanup_of(app_with_state(tmp_path))

    def broken() -> frozenset[TaskId]:
        raise RuntimeError("a bug")

    cleanup.held_tasks = broken
    with caplog.at_level(logging.INFO, "streamassign.runtime"):
        assert [cleanup._check() for _ in range(3)] == [False] * 3
    assert [(r.getMessage(), r.exc_info is not None) for r in caplog.records] == [
        ("checking for local state to remove failed; trying again later", True),
        *[
            (
                "checking for local state to remove failed again (RuntimeError('a bug')); "
                "trying again later",
                False,
            )
        ]
        * 2,
    ]


def test_a_bug_that_ends_the_cleanup_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cleanup = cleanup_of(app_with_state(tmp_path))

    async def broken() -> None:
        raise RuntimeError("a bug")

    cleanup._delete = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, "streamassign.runtime"):
        asyncio.run(asyncio.wait_for(cleanup.run(asyncio.Event()), 10))
    assert [(r.getMessage(), r.exc_info is not None) for r in caplog.records] == [
        ("the state cleanup stopped; local state of tasks no longer held is kept", True)
    ]


def test_a_delete_runs_only_after_a_check_that_retired_something(tmp_path: Path) -> None:
    """A delete is a thread hop and a directory listing: not worth it after every check. The
    first runs at start (what a crash left retired, mid-delete)."""
    app = app_with_state(tmp_path, state_cleanup_delay_ms=50)
    cleanup, state = cleanup_of(app), app.host.state
    deletes, checks = [], []
    real_delete, real_retire = state.delete_retired, cleanup.retire
    state.delete_retired = lambda: deletes.append(real_delete()) or 0  # type: ignore[method-assign]
    cleanup.retire = lambda now: checks.append(real_retire(now)) or checks[-1]  # type: ignore[method-assign]

    async def run() -> None:
        await app._add_standbys(0, frozenset({T[1]}))
        loop = asyncio.create_task(cleanup.run(app._stopped))
        deadline = time.monotonic() + 20
        while len([c for c in checks if c == []]) < 5:  # five checks retiring nothing
            assert time.monotonic() < deadline, checks
            await asyncio.sleep(0.01)
        app._stopped.set()
        await asyncio.wait_for(loop, 5)

    asyncio.run(run())
    assert deletes[0] == 0  # at start: nothing retired yet
    assert len(deletes) == 1 + len([c for c in checks if c])
    assert sum(deletes) == len(T) - 1 and state.local_tasks() == {T[1]}
    app._stores.shutdown()


EXIT_WHILE_DELETING = """
import asyncio, sys, threading, time
from streamassign import Subtopology, Topology
from streamassign.runtime import App

class Nothing:
    async def process(self, ctx, record): ...

topology = Topology([Subtopology(0, ["events"], stores=["totals"])], name="app")
app = App(topology, {0: Nothing}, bootstrap_servers="x:1", state_dir=sys.argv[1],
          state_cleanup_delay_ms=50)
deleting = threading.Event()

def slow_delete():
    deleting.set()
    time.sleep(120)  # a huge store

app.host.state.delete_retired = slow_delete

async def main():
    app._cleaning = asyncio.create_task(app._cleanup.run(app._stopped))
    await asyncio.to_thread(deleting.wait, 60)
    await app.stop()

asyncio.run(main())
print("returned")
"""


def test_the_process_exits_without_waiting_for_a_delete_under_way(tmp_path: Path) -> None:
    """``asyncio.run`` joins the default executor's threads, and the interpreter's exit those
    of every ThreadPoolExecutor: the delete runs in a daemon thread of its own (safe to cut:
    the next start deletes what is left)."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", EXIT_WHILE_DELETING, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0 and done.stdout == "returned\n", done.stderr
    assert time.monotonic() - started < 60  # the delete would take 120 s
