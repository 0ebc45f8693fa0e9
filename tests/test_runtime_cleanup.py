"""The runtime deletes the local state of tasks it no longer holds (``state_cleanup_delay_ms``),
and never that of a task it holds in any role. No broker: the task changes are driven by hand
(the broker test is in tests/integration/test_runtime.py)."""

from __future__ import annotations

import asyncio
import logging
import random
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from streamassign import Subtopology, TaskId, TopicPartition, Topology
from streamassign.assignment import ClientAssignment
from streamassign.localstate import StateDirectory
from streamassign.runtime import App, RuntimeConfigError
from streamassign.runtime.app import _Listener
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


# -- never the state of a held task --------------------------------------------------------------

#: Every part of what the app holds, each putting one task into it the way the app does
#: (only the keys count).
HELD_PARTS: dict[str, Callable[[App, TaskId], None]] = {
    "active": lambda app, t: app._actives.__setitem__(t, object()),
    "standby open": lambda app, t: app._standbys.states.__setitem__(t, {}),
    "standby opening": lambda app, t: app._standbys.opening.__setitem__(t, {}),
    "standby owner": lambda app, t: app._standbys.owner.__setitem__(t, 1),
    "standby wanted": lambda app, t: app._standbys.wanted.__setitem__(t, 1),
    "parked": lambda app, t: app._stores.parked.__setitem__(t, ({}, "kept")),
    "stores opening": lambda app, t: app._stores.opening.__setitem__(t, object()),
    "stores closing": lambda app, t: app._stores.closing.__setitem__(t, object()),
    "assigned active": lambda app, t: app.host._known.__setitem__(
        1, ClientAssignment(active=frozenset({t}))
    ),
    "assigned standby": lambda app, t: app.host._known.__setitem__(
        1, ClientAssignment(standby=frozenset({t}))
    ),
    "assigned warmup": lambda app, t: app.host._known.__setitem__(
        1, ClientAssignment(warmup=frozenset({t}))
    ),
    "claimed after a restart": lambda app, t: setattr(app.host, "_restored", {1: frozenset({t})}),
}


@pytest.mark.parametrize("part", HELD_PARTS)
def test_each_part_of_what_is_held_alone_keeps_its_task_state(tmp_path: Path, part: str) -> None:
    app = app_with_state(tmp_path)
    cleanup = cleanup_of(app)
    HELD_PARTS[part](app, T[2])
    assert cleanup.retire(cleanup.started + DELAY_MS / 1000) == [t for t in T if t != T[2]]
    assert app.host.state.local_tasks() == {T[2]}
    assert app.host.state.read_checkpoint(T[2])  # whole
    app._stores.shutdown()


@pytest.mark.parametrize("under_way", ["rebalance", "task change", "stop"])
def test_no_check_while_what_is_held_may_change(tmp_path: Path, under_way: str) -> None:
    """A rebalance moves tasks between the parts of what is held across awaits (in none of
    them meanwhile), as do the host's callbacks and the closes of ``stop``."""
    app = app_with_state(tmp_path)
    cleanup = cleanup_of(app)
    if under_way == "rebalance":
        app._rebalancing.add(1)
    elif under_way == "task change":
        app._changes = 1
    else:
        app._closing = True
    assert cleanup.retire(cleanup.started + 10 * DELAY_MS / 1000) is None
    assert app.host.state.local_tasks() == set(T)
    app._stores.shutdown()


class WatchedStore:
    """A persistent store that notes a violation whenever its directory is gone while it is
    open (checked at each write, at close and at the end, in the thread that uses it)."""

    persistent = True

    def __init__(self, path: Path, rng: random.Random, violations: list[str]) -> None:
        time.sleep(rng.random() * 0.004)  # opens take a while, in the store threads
        path.mkdir(parents=True, exist_ok=True)
        self.marker = path / "marker"
        self.token = uuid.uuid4().hex
        self.marker.write_text(self.token)
        self.rng, self.violations = rng, violations

    def check(self, when: str) -> None:
        try:
            intact = self.marker.read_text() == self.token
        except OSError:
            intact = False
        if not intact:
            self.violations.append(f"{when}: {self.marker} gone while its store is open")

    def get(self, key: bytes) -> None:
        return None

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        return iter(())

    def meta(self, name: str) -> None:
        return None

    def write(self, writes: object, meta: object) -> None:
        self.check("write")

    def close(self) -> None:
        time.sleep(self.rng.random() * 0.004)
        self.check("close")


async def _no_broker(*args: object, **kw: object) -> None:
    return None


async def interleave(tmp_path: Path, seed: int) -> tuple[list[str], int]:
    """Rebalances of two consumers applied at random times, through the app's listener in the
    order the host calls it, against a cleanup with a 1 ms delay checking every few ms.
    Returns the violations and how many checks retired something."""
    rng = random.Random(seed)
    violations: list[str] = []
    app = App(
        Topology([Subtopology(0, ["events"], stores=["totals", "counts"])], name="app"),
        {0: Nothing},
        bootstrap_servers="x:1",
        state_dir=tmp_path,
        threads=2,
        store_kind="rocksdb",
        num_standby_replicas=1,
        state_cleanup_delay_ms=1,
    )
    app._stores.open_store = lambda kind, path: WatchedStore(
        path, random.Random(rng.random()), violations
    )
    app._commits.commit_safely = _no_broker  # type: ignore[method-assign]
    app._commits.check_ends = _no_broker  # type: ignore[method-assign]
    listener, host, cleanup = _Listener(app), app.host, cleanup_of(app)
    checking = asyncio.Event()
    retired = 0

    async def check_often() -> None:
        nonlocal retired
        while not checking.is_set():
            if cleanup._check():
                retired += 1
                await cleanup._delete()
            await asyncio.sleep(rng.random() * 0.002)

    async def rebalance(consumer: int, now: ClientAssignment) -> None:
        await listener.on_rebalance_started(consumer)
        await asyncio.sleep(rng.random() * 0.005)
        before, host._known[consumer] = host._known[consumer], now
        await asyncio.sleep(0)
        standby_before, standby_now = before.standby | before.warmup, now.standby | now.warmup
        for callback, tasks in (  # (``ProcessHost._assigned``'s order)
            (listener.on_active_revoked, before.active - now.active),
            (listener.on_standby_removed, standby_before - standby_now),
            (listener.on_active_assigned, now.active - before.active),
            (listener.on_standby_added, standby_now - standby_before),
        ):
            if tasks:
                await callback(consumer, tasks)
        await listener.on_rebalance_completed(consumer)

    checks = asyncio.create_task(check_often())
    for _ in range(12):
        plan = {c: [set[TaskId](), set[TaskId](), set[TaskId]()] for c in (0, 1)}
        for task in T[:5]:
            # Active, standby and warmup consumer; None: another process.
            for role, consumer in enumerate(rng.sample([0, 1, None, None, None], 3)):
                if consumer is not None and not any(task in r for r in plan[consumer]):
                    plan[consumer][role].add(task)
        consumers = [c for c in (0, 1) if rng.random() < 0.8] or [0]
        await asyncio.sleep(rng.random() * 0.01)
        await asyncio.gather(
            *(rebalance(c, ClientAssignment(*map(frozenset, plan[c]))) for c in consumers)
        )
        await asyncio.sleep(rng.random() * 0.02)
    await asyncio.sleep(0.02)
    for task_id, task in app._actives.items():
        for state in task.stores.values():
            if isinstance(state.store, WatchedStore):
                state.store.check(f"end, active {task_id}")
    for task_id, states in app._standbys.states.items():
        for state in states.values():
            if isinstance(state.store, WatchedStore):
                state.store.check(f"end, standby {task_id}")
    checking.set()
    await checks
    app._stopped.set()
    closes = [app._stores.close(t.task_id, t.stores) for t in app._actives.values()]
    closes += [app._stores.close(t, s) for t, s in app._standbys.clear()]
    closes += [app._stores.close(t, s) for t, (s, _) in app._stores.parked.items()]
    await asyncio.gather(*closes, *app._stores.closing.values())
    app._stores.shutdown()
    host.state.close()
    return violations, retired


@settings(
    max_examples=4,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # a seed shrinks to nothing simpler
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(seed=st.integers(0, 2**32 - 1))
def test_random_interleavings_never_delete_the_state_of_an_open_store(
    tmp_path_factory: pytest.TempPathFactory, seed: int
) -> None:
    """Stores open and close in threads with random latency while rebalances come and go;
    a check in between must never retire a directory whose store is (or is about to be)
    open. Each example takes about 0.3 s; a failure prints its seed (``interleave(path, seed)``
    replays it, give or take thread timing)."""
    violations, retired = asyncio.run(interleave(tmp_path_factory.mktemp("state"), seed))
    assert violations == []
    assert retired > 0  # the cleanup had work to do
