"""The state updater (``restore.py``) without a broker: restores in bounded steps that let the
event loop run between them, a handover only at the changelog's end, no record read twice when
other restores come and go, nothing applied for a task torn mid-restore, and standbys read by
the same reader. An in-memory log stands in for the changelog reader."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiokafka import TopicPartition as KafkaTopicPartition

from streamassign import TaskId, TopicPartition
from streamassign.runtime import COMMIT_KEY, MemoryStore, StoreState
from streamassign.runtime._clients import Clients
from streamassign.runtime.changelog import encode_marker
from streamassign.runtime.restore import Restoring, StateUpdater
from streamassign.runtime.standbys import Standbys
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
        self.updater = StateUpdater(clients, self.standbys, checkpoint, restored, max_records)


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
