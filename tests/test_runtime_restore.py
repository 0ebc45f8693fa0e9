"""The state updater (``restore.py``) without a broker: restores in bounded steps that let the
event loop run between them, a handover only at the changelog's end, no record read twice when
other restores come and go, nothing applied for a task torn mid-restore, and standbys read by
the same reader. An in-memory log stands in for the changelog reader."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition as KafkaTopicPartition

from streamassign import Subtopology, TaskId, TopicPartition, Topology
from streamassign.localstate import StateDirectory
from streamassign.runtime import COMMIT_KEY, MemoryStore, RocksDBStore, StoreState
from streamassign.runtime._clients import Clients
from streamassign.runtime.changelog import encode_marker
from streamassign.runtime.restore import Restoring, StateUpdater
from streamassign.runtime.standbys import Standbys
from streamassign.runtime.task_stores import TaskStores
from streamassign.runtime.tasks import ActiveTask, tear

from .test_runtime_membership import Log
from .test_runtime_processing import Adder

TOPIC = "app-totals-changelog"


def fill(log: Log, partition: int, records: int, marker_every: int) -> dict[bytes, bytes]:
    """``records`` distinct keys in ``partition``, a marker after every ``marker_every`` and
    one at the end; returns the table they make."""
    table = {}
    for i in range(records):
        key, value = b"k%d-%d" % (partition, i), b"%d" % i
        log.records[(TOPIC, partition)].append((key, value))
        table[key] = value
        if (i + 1) % marker_every == 0 or i + 1 == records:
            log.records[(TOPIC, partition)].append((COMMIT_KEY, encode_marker({})))
    return table


def task(partition: int) -> ActiveTask:
    state = StoreState.open("totals", TopicPartition(TOPIC, partition), MemoryStore())
    return ActiveTask(TaskId(0, partition), 0, {"totals": state}, Adder())


class GatedLog(Log):
    """End offset lookups that wait for ``gate`` (a slow broker) and then fail if ``fail``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self.asked = asyncio.Event()
        self.fail = False

    async def end_offsets(self, tps: list[KafkaTopicPartition]) -> dict[KafkaTopicPartition, int]:
        self.asked.set()
        await self.gate.wait()
        if self.fail:
            raise TimeoutError("broker slow")
        return await super().end_offsets(tps)


class Harness:
    def __init__(self, max_records: int, log: Log | None = None) -> None:
        self.log = log if log is not None else Log()
        self.standbys = Standbys()
        self.handed: list[Restoring] = []
        self.checkpoints = 0

        async def restored(entry: Restoring) -> bool:
            self.handed.append(entry)
            entry.task.restoring = False
            return True

        def checkpoint(task: TaskId, states: object) -> None:
            self.checkpoints += 1

        clients = Clients(changelog_reader=self.log)  # type: ignore[arg-type]

        async def empty_in_place(task: TaskId, state: StoreState) -> None:
            state.drop_unclosed()
            state.store, state.position, state.applied = MemoryStore(), 0, {}

        self.updater = StateUpdater(
            clients, self.standbys, checkpoint, restored, empty_in_place, max_records
        )


def test_a_restore_runs_in_bounded_steps_and_the_loop_runs_between_them(tmp_path: Path) -> None:
    h = Harness(max_records=500)
    table = fill(h.log, 0, 5_000, marker_every=700)
    restoring = task(0)

    async def run() -> tuple[int, int]:
        ticks = steps = 0
        stopped = asyncio.Event()

        async def tick() -> None:
            nonlocal ticks
            while not stopped.is_set():
                ticks += 1
                await asyncio.sleep(0)

        ticker = asyncio.create_task(tick())
        h.updater.add(restoring, "cold")
        while h.updater.restoring:
            await h.updater.step(3600.0, timeout_ms=0)
            assert not h.handed or not h.updater.restoring  # handed over only at the end
            steps += 1
            await asyncio.sleep(0)
        stopped.set()
        await ticker
        return ticks, steps

    ticks, steps = asyncio.run(run())
    changelog = len(h.log.records[(TOPIC, 0)])
    assert steps >= changelog // 500  # never more than 500 records in one step
    assert ticks >= steps - 1  # other coroutines ran between the steps
    assert [e.task for e in h.handed] == [restoring] and not restoring.restoring
    state = restoring.stores["totals"]
    assert dict(state.store.items()) == table and state.position == changelog
    assert h.handed[0].records == changelog  # every record read once
    assert h.handed[0].ends == {TopicPartition(TOPIC, 0): changelog}


def test_unreadable_markers_are_one_warning_per_store_and_restore(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A foreign writer of the reserved key may leave one unreadable marker after another;
    each still closes its commit. A restore says so once per store over all its steps (the
    first one's offset), and the next restore of the same store says it again."""
    h = Harness(max_records=3)
    records = h.log.records[(TOPIC, 0)]
    for i in range(4):
        records += [(b"k%d" % i, b"%d" % i), (COMMIT_KEY, b'{"applied": {"in": true}}')]
    restoring = task(0)

    async def restore_twice() -> None:
        for _ in range(2):
            h.updater.add(restoring, "kept")
            while h.updater.restoring:
                await h.updater.step(3600.0, timeout_ms=0)
            records.extend([(b"k9", b"9"), (COMMIT_KEY, b'{"applied": {"in": 1e300}}')])

    with caplog.at_level(logging.WARNING, logger="streamassign.runtime"):
        asyncio.run(restore_twice())
    warnings = [r.getMessage() for r in caplog.records if "commit marker" in r.getMessage()]
    assert [w.split(" has applied offsets")[0] for w in warnings] == [
        f"store totals: the commit marker at {TOPIC}[0]@1",
        f"store totals: the commit marker at {TOPIC}[0]@9",
    ]
    state = restoring.stores["totals"]
    assert state.position == 10 and state.applied == {}
    assert dict(state.store.items()) == {
        b"k0": b"0",
        b"k1": b"1",
        b"k2": b"2",
        b"k3": b"3",
        b"k9": b"9",
    }
    assert len(h.handed) == 2


def test_restores_coming_and_going_read_nothing_twice() -> None:
    h = Harness(max_records=300)
    fill(h.log, 0, 3_000, marker_every=1_000)  # long stretches without a marker
    fill(h.log, 1, 10, marker_every=10)
    first, second = task(0), task(1)

    async def run() -> None:
        h.updater.add(first, "cold")
        for _ in range(3):
            await h.updater.step(3600.0, timeout_ms=0)
        h.updater.add(second, "cold")  # the reader is reassigned mid-way
        await h.updater.settle()

    asyncio.run(run())
    records = {e.task.task_id.partition: e.records for e in h.handed}
    assert records == {p: len(h.log.records[(TOPIC, p)]) for p in (0, 1)}


def test_a_task_torn_mid_restore_gets_nothing_more_and_is_not_handed_over() -> None:
    h = Harness(max_records=100)
    fill(h.log, 0, 1_000, marker_every=250)
    torn = task(0)

    async def run() -> None:
        h.updater.add(torn, "cold")
        for _ in range(4):
            await h.updater.step(3600.0, timeout_ms=0)
        tear(torn)  # e.g. the member lost its membership
        position = torn.stores["totals"].position
        for _ in range(3):
            await h.updater.step(3600.0, timeout_ms=0)
        h.updater.add(other, "cold")  # the reader is reassigned without the torn task's
        await h.updater.settle()
        assert torn.stores["totals"].position == position  # nothing applied since

    fill(h.log, 1, 10, marker_every=10)
    other = task(1)
    asyncio.run(run())
    assert not torn.restoring and torn.torn
    assert h.updater.restoring == {}  # the void restore was dropped (handed over as torn)
    assert [e.task for e in h.handed if e.task.torn] == [torn]


def test_standbys_and_restores_share_the_reader() -> None:
    h = Harness(max_records=1_000)
    standby_table = fill(h.log, 0, 2_000, marker_every=500)
    fill(h.log, 1, 2_000, marker_every=500)
    standby = StoreState.open("totals", TopicPartition(TOPIC, 0), MemoryStore())
    active = task(1)

    async def run() -> None:
        await h.standbys.add(TaskId(0, 0), {"totals": standby}, 0)
        h.updater.add(active, "cold")
        await h.updater.settle()
        for _ in range(5):  # the standby is read on after the restore is handed over
            await h.updater.step(0.0, timeout_ms=0)

    asyncio.run(run())
    assert [e.task for e in h.handed] == [active]
    assert dict(standby.store.items()) == standby_table
    assert h.checkpoints > 0


def test_a_failed_ends_lookup_leaves_the_reader_reading_and_a_cancel_breaks_nothing() -> None:
    """A restore added while another runs, whose end offsets lookup fails: the reader goes on
    with what it read (not reassigned without positions), and a restore cancelled while a
    step awaits the broker does not break the step."""
    log = GatedLog()
    h = Harness(max_records=100, log=log)
    first_table = fill(log, 0, 5_000, marker_every=700)
    fill(log, 1, 10, marker_every=10)
    first, second = task(0), task(1)

    async def run() -> None:
        h.updater.add(first, "cold")
        for _ in range(2):
            await h.updater.step(3600.0, timeout_ms=0)
        log.fail = True
        h.updater.add(second, "cold")  # its lookup fails: the next step tries again
        stepping = asyncio.create_task(h.updater.step(3600.0, timeout_ms=0))
        await asyncio.sleep(0.005)  # the step awaits the broker meanwhile, if at all
        h.updater.cancel(second.task_id)  # revoked meanwhile
        log.fail = False
        await stepping
        assert log.positions[KafkaTopicPartition(TOPIC, 0)] == 200  # read on from there
        await h.updater.settle()

    asyncio.run(run())
    assert [e.task for e in h.handed] == [first]
    assert dict(first.stores["totals"].store.items()) == first_table
    assert h.handed[0].records == len(log.records[(TOPIC, 0)])  # nothing read twice


def test_the_standbys_lock_is_free_while_ends_are_looked_up() -> None:
    """Rebalance callbacks wait on ``standbys.lock`` and send no heartbeats meanwhile: a slow
    lookup must not hold it. A change made meanwhile is planned again."""
    log = GatedLog()
    h = Harness(max_records=1_000, log=log)
    fill(log, 0, 10, marker_every=10)
    table = fill(log, 1, 10, marker_every=10)
    first, second = task(0), task(1)

    async def run() -> bool:
        log.gate.clear()
        h.updater.add(first, "cold")
        stepping = asyncio.create_task(h.updater.step(3600.0, timeout_ms=0))
        await log.asked.wait()
        locked = h.standbys.lock.locked()
        h.updater.cancel(first.task_id)  # revoked while the lookup waits
        h.updater.add(second, "cold")
        log.gate.set()
        await stepping
        await h.updater.settle()
        return locked

    assert asyncio.run(run()) is False
    assert [e.task for e in h.handed] == [second]
    assert dict(second.stores["totals"].store.items()) == table


class StableLog(Log):
    """End offsets read_committed: ``stable`` per partition (the last stable offset, behind
    the log end while a transaction's markers are not written); high watermarks: the log end."""

    def __init__(self) -> None:
        super().__init__()
        self.stable: dict[int, int] = {}

    async def end_offsets(self, tps: list[KafkaTopicPartition]) -> dict[KafkaTopicPartition, int]:
        ends = await super().end_offsets(tps)
        return {tp: self.stable.get(tp.partition, end) for tp, end in ends.items()}


def high_watermarks(log: Log) -> Any:
    async def read(_reader: Any, tps: list[KafkaTopicPartition]) -> dict[Any, int]:
        return await Log.end_offsets(log, tps)

    return read


def test_a_store_past_the_last_stable_offset_but_not_the_high_watermark_waits() -> None:
    """Before, a store at a just-committed transaction's end stopped the application
    (ChangelogBehindStateError) while the markers were not written: 119 of 200 commits."""
    log = StableLog()
    h = Harness(max_records=1_000, log=log)
    h.updater.high_watermarks = high_watermarks(log)
    table = fill(log, 0, 10, marker_every=10)
    restoring = task(0)
    restoring.stores["totals"].store.write(table, {})
    restoring.stores["totals"].position = 11  # everything, as its owner wrote it
    log.stable[0] = 9  # the commit's markers not written yet

    async def run() -> None:
        h.updater.add(restoring, "kept")
        for _ in range(3):
            await h.updater.step(3600.0, timeout_ms=0)
        assert h.updater.restoring and not h.handed  # looks again, nothing lost
        del log.stable[0]  # the markers are written
        await h.updater.settle()

    asyncio.run(run())
    assert [e.task for e in h.handed] == [restoring]
    state = restoring.stores["totals"]
    assert state.position == 11 and dict(state.store.items()) == table


def test_a_store_past_the_high_watermark_is_set_aside_and_restored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before, the application stopped (ChangelogBehindStateError), and every restart again:
    a crash loop after a truncation (unclean leader election) or a recreated topic."""
    h = Harness(max_records=1_000)
    h.updater.high_watermarks = high_watermarks(h.log)
    table = fill(h.log, 0, 5, marker_every=5)  # the recreated topic: 6 offsets
    restoring = task(0)
    restoring.stores["totals"].store.write({b"old": b"1"}, {})
    restoring.stores["totals"].position = 1_976
    asides: list[TaskId] = []

    async def start_over(task_id: TaskId, state: StoreState) -> Path:
        asides.append(task_id)
        state.store, state.position = MemoryStore(), 0
        return Path("/state/tasks/0_0/totals.rocksdb.damaged-x")

    h.updater.start_over = start_over

    async def run() -> None:
        h.updater.add(restoring, "local")
        await h.updater.settle()

    with caplog.at_level(logging.ERROR, "streamassign.runtime"):
        asyncio.run(run())
    assert asides == [TaskId(0, 0)] and [e.task for e in h.handed] == [restoring]
    state = restoring.stores["totals"]
    assert dict(state.store.items()) == table and state.position == 6
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert f"{TOPIC}[0]" in line and "offset 1976" in line and "end 6" in line
    assert "totals.rocksdb.damaged-x" in line


def test_start_over_sets_a_rocksdb_store_aside_and_opens_an_empty_one(tmp_path: Path) -> None:
    topology = Topology([Subtopology(0, ["events"], stores=["totals"])], name="app")
    state_dir = StateDirectory(tmp_path)
    stores = TaskStores(topology, "rocksdb", state_dir, Standbys())
    task_id = TaskId(0, 0)

    async def run() -> Path | None:
        states = stores.open(task_id)
        state = states["totals"]
        state.restore(0, b"k", b"v")
        state.restore(1, COMMIT_KEY, encode_marker({}))
        assert state.position == 2
        aside = await stores.start_over(task_id, state)
        assert state.position == 0 and list(state.store.items()) == []
        state.store.close()
        stores.shutdown()
        return aside

    try:
        aside = asyncio.run(run())
        assert aside is not None and aside.name.startswith("totals.rocksdb.damaged-")
        kept = RocksDBStore(aside)
        try:
            assert list(kept.items()) == [(b"k", b"v")]  # never deleted
        finally:
            kept.close()
    finally:
        state_dir.close()


class ResettingLog(Log):
    """A reader seeked past a partition's end restarts at its start (aiokafka's
    ``auto_offset_reset="earliest"`` on an out-of-range position)."""

    async def getmany(
        self, *tps: KafkaTopicPartition, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[Any, Any]:
        for tp in tps or self.assigned:
            if self.positions.get(tp, 0) > len(self.records[(tp.topic, tp.partition)]):
                self.positions[tp] = 0
        return await super().getmany(*tps, timeout_ms=timeout_ms, max_records=max_records)


def test_a_standby_on_a_recreated_changelog_is_set_aside_not_mixed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before, a standby at offset 1976 applied the recreated topic's records (from offset 0)
    onto its old store and moved its position back: a mix of two logs."""
    log = ResettingLog()
    h = Harness(max_records=1_000, log=log)
    table = fill(log, 0, 5, marker_every=5)
    standby = StoreState("totals", TopicPartition(TOPIC, 0), MemoryStore(), position=1_976)
    standby.store.write({b"old": b"1"}, {})
    asides: list[TaskId] = []

    async def start_over(task_id: TaskId, state: StoreState) -> Path | None:
        asides.append(task_id)
        state.store, state.position = MemoryStore(), 0
        return None

    h.updater.start_over = start_over

    async def run() -> None:
        await h.standbys.add(TaskId(0, 0), {"totals": standby}, 0)
        for _ in range(6):
            await h.updater.step(3600.0, timeout_ms=0)

    with caplog.at_level(logging.ERROR, "streamassign.runtime"):
        asyncio.run(run())
    assert asides == [TaskId(0, 0)]
    assert dict(standby.store.items()) == table and standby.position == 6
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert f"{TOPIC}[0]" in line and "offset 1976 read offset 0" in line


def test_a_restore_whose_changelog_is_recreated_midway_finishes_on_the_new_log() -> None:
    """Review: set aside mid-restore, the restore kept the old log's end (36) and waited for
    it for ever on a recreated log of 4 records; it looks its ends up again."""
    log = ResettingLog()
    h = Harness(max_records=5, log=log)
    h.updater.high_watermarks = high_watermarks(log)
    fill(log, 0, 30, marker_every=5)
    restoring = task(0)
    totals = restoring.stores["totals"]
    for offset, (key, value) in enumerate(log.records[(TOPIC, 0)][:12]):
        totals.restore(offset, key, value)

    async def start_over(task_id: TaskId, state: StoreState) -> None:
        state.store, state.position, state.applied = MemoryStore(), 0, {}

    h.updater.start_over = start_over

    async def run() -> None:
        h.updater.add(restoring, "local")
        for _ in range(3):
            await h.updater.step(3600.0, timeout_ms=0)
        log.records[(TOPIC, 0)] = []  # recreated: shorter than where the reader is
        recreated = fill(log, 0, 3, marker_every=3)
        for _ in range(50):
            await h.updater.step(3600.0, timeout_ms=0)
            if h.handed:
                break
        assert [e.task.task_id for e in h.handed] == [TaskId(0, 0)]
        assert dict(totals.store.items()) == recreated

    asyncio.run(run())


def test_a_close_right_after_start_over_leaves_the_task_openable(tmp_path: Path) -> None:
    """Review: the swap ran in a store thread; a rebalance closing the task meanwhile closed
    the old store twice and never the new one, whose lock then failed the task's next open
    here. The swap has no await now: the close closes the new store."""
    topology = Topology([Subtopology(0, ["events"], stores=["totals"])], name="app")
    stores = TaskStores(topology, "rocksdb", StateDirectory(tmp_path), Standbys())
    task_id = TaskId(0, 0)

    async def run() -> None:
        states = stores.open(task_id)
        swap = asyncio.ensure_future(stores.start_over(task_id, states["totals"]))
        await asyncio.sleep(0)
        await asyncio.wait([swap, stores.close(task_id, states)])
        assert swap.exception() is None
        again = await asyncio.to_thread(stores.open, task_id)  # assigned here again
        again["totals"].store.close()
        stores.shutdown()

    asyncio.run(run())
