"""Stores open and close off the event loop, and no rebalance callback waits for them (issue 21
§6): a task whose stores are still opening (or still closing from a moment ago) is assigned at
once as restoring, its input paused, and runs once the state updater has read its changelog
from the opened store. Stores here are real RocksDB stores made slow on purpose (a hook of
``TaskStores``), the changelog and the producer an in-memory log."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from streamassign import Subtopology, TaskId, Topology
from streamassign.errors import StoreNotOpenError
from streamassign.runtime import COMMIT_KEY, App, RocksDBStore
from streamassign.runtime.stores import StoreKind
from streamassign.runtime.tasks import ActiveTask

from .test_runtime_membership import CHANGELOG, Log
from .test_runtime_processing import Adder, Committer, Rec

TASK = TaskId(0, 0)
#: Seconds a slow store takes to open and to close (as a large RocksDB store does).
SLOW = 1.0


class SlowRocksDB(RocksDBStore):
    """Opening and closing take ``SLOW`` s, in whatever thread does them; counts both."""

    opened = 0
    closed = 0
    fail = False

    def __init__(self, path: str | Path) -> None:
        time.sleep(SLOW)
        if SlowRocksDB.fail:
            raise OSError(f"{path}: unreadable")
        super().__init__(path)
        SlowRocksDB.opened += 1

    def close(self) -> None:
        time.sleep(SLOW)
        super().close()
        SlowRocksDB.closed += 1


def open_slow(kind: StoreKind, path: Path) -> RocksDBStore:
    return SlowRocksDB(path)


class LoopWatch:
    """The longest the event loop went without running a 10 ms ticker (a stalled loop sends
    no heartbeats)."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            self.longest = max(self.longest, now - last)
            last = now

    def start(self) -> None:
        self._task = asyncio.create_task(self._tick())

    def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()


def make(tmp_path: Path) -> tuple[App, Log]:
    SlowRocksDB.opened = SlowRocksDB.closed = 0
    SlowRocksDB.fail = False
    topology = Topology([Subtopology(0, ["events"], stores=["totals"])], name="app")
    app = App(topology, {0: Adder}, bootstrap_servers="unused:1", state_dir=tmp_path)
    app._stores.open_store = open_slow
    log = Log()
    app._clients.producer = log  # type: ignore[assignment]
    app._clients.restorer = log  # type: ignore[assignment]
    app._clients.changelog_reader = log  # type: ignore[assignment]
    app.host.consumers.append(Committer())  # type: ignore[arg-type]
    return app, log


async def quick(callback: Awaitable[None]) -> float:
    """Run a rebalance callback; the seconds it took."""
    started = time.monotonic()
    await callback
    return time.monotonic() - started


async def until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def process(app: App, task: ActiveTask, first: int, count: int) -> None:
    for offset in range(first, first + count):
        await app._processing.process(task, Rec(offset, b"k%d" % (offset % 7), b"1"))
    await app._commits.commit(0)


def test_slow_opens_and_closes_stall_no_callback_and_the_table_stays_exact(
    tmp_path: Path,
) -> None:
    app, log = make(tmp_path)
    callbacks: list[float] = []

    async def rebalance(change: Callable[[], Awaitable[None]]) -> None:
        app._rebalancing.add(0)
        callbacks.append(await quick(app._rebalance_started(0)))
        callbacks.append(await quick(change()))
        callbacks.append(await quick(app._rebalance_completed(0)))

    async def run() -> tuple[ActiveTask, float, int]:
        watch = LoopWatch()
        watch.start()
        updater = asyncio.create_task(app._state_updater_loop())
        await rebalance(lambda: app._assign(0, frozenset([TASK])))
        first = app._actives[TASK]
        assert first.restoring and SlowRocksDB.opened == 0  # assigned before its store opened
        await until(lambda: not first.restoring, "the first restore")
        await process(app, first, 0, 100)
        committed = len(log.records[CHANGELOG])
        # Revoked (its store starts closing, slowly), then at once assigned here again: the
        # new open waits for the close, in a thread, and no callback waits for either.
        await rebalance(lambda: app._revoke(0, frozenset([TASK])))
        await rebalance(lambda: app._assign(0, frozenset([TASK])))
        second = app._actives[TASK]
        assert second.restoring and SlowRocksDB.closed == 0
        await until(lambda: not second.restoring, "the second restore")
        await process(app, second, 100, 50)
        app._stopped.set()
        await updater
        watch.stop()
        return second, watch.longest, committed

    task, longest, committed = asyncio.run(run())
    assert (SlowRocksDB.opened, SlowRocksDB.closed) == (2, 1)
    assert max(callbacks) < SLOW / 2  # no callback waited for an open or a close
    assert longest < SLOW / 2  # nor did the loop (heartbeats)
    expected = {b"k%d" % k: b"%d" % sum(1 for i in range(150) if i % 7 == k) for k in range(7)}
    table = dict(task.stores["totals"].items())
    assert {k: v for k, v in table.items() if not k.endswith(b"-copy")} == expected
    assert log.replay() == table
    cold, local = app.restore_events
    assert (cold.source, cold.start) == ("cold", 0)
    # The reopened store held the first 100 records: it starts there and reads nothing again.
    assert (local.source, local.start, local.records) == ("local", committed, 0)


def test_a_standby_is_read_and_offered_to_queries_only_once_open(tmp_path: Path) -> None:
    app, log = make(tmp_path)

    async def run() -> dict[bytes, bytes]:
        for offset in range(5):  # an active elsewhere committed 5 records
            await log.send(CHANGELOG[0], b"%d" % offset, key=b"k%d" % offset, partition=0)
        await log.send(CHANGELOG[0], b'{"applied":{"events":4}}', key=COMMIT_KEY, partition=0)
        updater = asyncio.create_task(app._state_updater_loop())
        assert await quick(app._add_standbys(0, frozenset([TASK]))) < SLOW / 2
        assert TASK in app._standbys.opening and app.replica(TASK, "totals") is None
        await until(lambda: TASK in app._standbys.states, "the standby's store to open")
        state = app._standbys.states[TASK]["totals"]
        await until(lambda: state.position == len(log.records[CHANGELOG]), "the standby")
        found = app.replica(TASK, "totals")
        assert found is not None and found[0] == "standby"
        table = dict(state.store.items())
        await app._remove_standbys(0, frozenset([TASK]))
        await asyncio.gather(*app._stores.close_parked())
        app._stopped.set()
        await updater
        return table

    assert asyncio.run(run()) == {b"k%d" % i: b"%d" % i for i in range(5)}
    assert (SlowRocksDB.opened, SlowRocksDB.closed) == (1, 1)


def test_a_store_that_cannot_be_opened_stops_the_application(tmp_path: Path) -> None:
    app, _ = make(tmp_path)
    SlowRocksDB.fail = True

    async def run() -> None:
        loop = asyncio.create_task(
            app._fail_on_error(app._state_updater_loop(), "the state updater")
        )
        await app._assign(0, frozenset([TASK]))
        await asyncio.wait_for(app.wait(), 30)
        await loop

    asyncio.run(run())
    assert isinstance(app.failure, StoreNotOpenError)
    assert "totals" in str(app.failure) and "unreadable" in str(app.failure)


def test_closing_a_task_whose_stores_still_open_closes_the_opened_stores(tmp_path: Path) -> None:
    app, _ = make(tmp_path)
    opened_in: list[str] = []
    original = app._stores.open

    def open_and_note(task: TaskId) -> dict[str, object]:
        opened_in.append(threading.current_thread().name)
        return original(task)  # type: ignore[return-value]

    app._stores.open = open_and_note  # type: ignore[method-assign,assignment]

    async def run() -> None:
        states, how = await app._stores.take(TASK)
        assert how == "open"
        await app._stores.close(TASK, states)  # waits for the open, then closes what it opened
        assert app._stores.opening == {} and app._stores.closing == {}
        with pytest.raises(StoreNotOpenError):
            app._stores.open_store = open_slow
            SlowRocksDB.fail = True
            states, _ = await app._stores.take(TASK)
            states["totals"].store.get(b"k")  # a placeholder refuses to be read

    asyncio.run(run())
    assert (SlowRocksDB.opened, SlowRocksDB.closed) == (1, 1)
    assert opened_in and threading.main_thread().name not in opened_in
