"""A task that moves between two consumers of one process while the first is inside a long batch
(``threads >= 2``, issue 21): the first stops at once, sends and commits nothing more for it,
and the new owner goes on from where this process's copy of the task got to, so every record is
applied and sent once. Without a broker: the producer and the consumers are fakes (the broker
test is ``tests/integration/test_runtime_threads.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from aiokafka import TopicPartition as KafkaTopicPartition

from streamassign import Subtopology, TaskId, TopicPartition, Topology
from streamassign.assignment import ClientAssignment
from streamassign.errors import TaskMovedError
from streamassign.runtime import App, MemoryStore, StoreState, TaskContext
from streamassign.runtime.processing import YIELD_EVERY
from streamassign.runtime.tasks import ActiveTask
from tests.test_runtime_processing import TOPIC, Committer, Rec

TASK = TaskId(0, 0)
CHANGELOG = TopicPartition("app-counts-changelog", 0)
INPUT = KafkaTopicPartition(TOPIC, 0)


class Count:
    """Counts records per key and sends every record's offset to ``out``; awaits ``gate``
    (when set) before its writes on the record at offset ``stall_at``."""

    gate: asyncio.Event | None = None
    stalled = False
    stall_at = -1

    async def process(self, ctx: TaskContext, record: Any) -> None:
        if record.offset == self.stall_at and self.gate is not None:
            Count.stalled = True
            await self.gate.wait()
        counts = ctx.store("counts")
        counts.put(record.key, str(int(counts.get(record.key) or b"0") + 1).encode())
        ctx.send("out", str(record.offset).encode(), key=record.key)


class Recorder:
    """Stands in for the producer: records what is sent, acknowledges it at once at its
    offset in its topic."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None]] = []
        self.ends: Counter[str] = Counter()

    async def send(
        self, topic: str, value: bytes | None, key: bytes | None = None, **_: Any
    ) -> asyncio.Future[Any]:
        offset = self.ends[topic]
        self.ends[topic] += 1
        self.sent.append((topic, key, value))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(SimpleNamespace(offset=offset))
        return future


class Consumer(Committer):
    """An input consumer: records seeks and commits."""

    def __init__(self) -> None:
        super().__init__()
        self.seeks: list[tuple[KafkaTopicPartition, int]] = []
        self.paused_tps: set[KafkaTopicPartition] = set()

    def seek(self, tp: KafkaTopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))

    def assignment(self) -> set[KafkaTopicPartition]:
        return {INPUT}

    def paused(self) -> set[KafkaTopicPartition]:
        return set(self.paused_tps)

    def pause(self, *tps: KafkaTopicPartition) -> None:
        self.paused_tps.update(tps)

    def resume(self, *tps: KafkaTopicPartition) -> None:
        self.paused_tps.difference_update(tps)


def make(tmp_path: Path) -> tuple[App, ActiveTask, Recorder, list[Consumer]]:
    """An app with two consumers; task 0_0 runs on consumer 0."""
    topology = Topology([Subtopology(0, [TOPIC], stores=["counts"])], name="app")
    app = App(topology, {0: Count}, bootstrap_servers="unused:1", state_dir=tmp_path, threads=2)
    recorder = Recorder()
    app._clients.producer = recorder  # type: ignore[assignment]
    consumers = [Consumer(), Consumer()]
    app.host.consumers.extend(consumers)  # type: ignore[arg-type]
    state = StoreState.open("counts", CHANGELOG, MemoryStore())
    task = ActiveTask(TASK, 0, {"counts": state}, Count())
    app._actives[TASK] = task
    return app, task, recorder, consumers


def batch(first: int, last: int) -> dict[KafkaTopicPartition, list[Rec]]:
    return {INPUT: [Rec(offset, b"k%d" % (offset % 3), b"1") for offset in range(first, last)]}


def outputs(recorder: Recorder) -> list[int]:
    return [int(v or b"") for t, _, v in recorder.sent if t == "out"]


async def batch_of(app: App, index: int, records: dict[Any, list[Rec]]) -> None:
    """One batch of consumer ``index``, as its loop runs it."""
    current = functools.partial(app._still_current, index, app._epochs[index])
    consumer = app.host.consumers[index]
    await app._processing.process_batch(index, consumer, records, current=current)


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


@contextlib.contextmanager
def stalling_at(offset: int) -> Iterator[None]:
    """Processors await ``Count.gate`` on the record at ``offset``; the class state is reset
    after (it outlives the test)."""
    Count.stall_at = offset
    try:
        yield
    finally:
        Count.gate, Count.stall_at, Count.stalled = None, -1, False


async def stalled_batch(app: App, records: dict[Any, list[Rec]]) -> asyncio.Task[None]:
    """Consumer 0's batch of ``records``, started and awaiting inside its record at
    ``Count.stall_at`` until ``Count.gate`` is set."""
    Count.gate = asyncio.Event()
    stalled = asyncio.create_task(batch_of(app, 0, records))
    await until(lambda: Count.stalled)
    return stalled


async def batch_interrupted_at_its_first_yield(
    app: App, task: ActiveTask, interrupt: Callable[[int], Awaitable[None]]
) -> None:
    """A long batch of consumer 0 under its lock (as the consumer loop holds it around a
    batch); ``interrupt(0)`` runs once the batch first yields."""

    async def at_the_first_yield() -> None:
        await until(lambda: task.processed > 0)
        await interrupt(0)

    interrupting = asyncio.create_task(at_the_first_yield())
    async with app._locks[0]:
        await batch_of(app, 0, batch(0, 1000))
    await interrupting


def test_a_task_moved_mid_batch_is_dropped_there_and_its_new_owner_goes_on(
    tmp_path: Path,
) -> None:
    app, task, recorder, consumers = make(tmp_path)

    async def move_at_the_first_yield() -> None:
        await until(lambda: task.processed > 0)
        await app._assign(1, frozenset({TASK}))  # the rebalance gave it to the sibling

    async def run() -> None:
        mover = asyncio.create_task(move_at_the_first_yield())
        await batch_of(app, 0, batch(0, 1000))
        await mover
        assert task.consumer == 1 and task.processed == YIELD_EVERY
        assert outputs(recorder) == list(range(YIELD_EVERY))  # nothing sent after the move
        assert consumers[0].seeks == [(INPUT, YIELD_EVERY)]  # the rest is read again
        await app._commits.commit(0)  # consumer 0 commits nothing of a task it lost
        assert consumers[0].commits == []
        # Consumer 1 reads from the committed offset (0): what consumer 0 processed of the
        # task is skipped, the rest processed once, and consumer 1 commits all of it.
        await batch_of(app, 1, batch(0, 1000))
        await app._commits.commit(1)

    asyncio.run(run())
    assert outputs(recorder) == list(range(1000))
    assert task.processed == 1000 and task.skipped == YIELD_EVERY
    counts = dict(task.stores["counts"].store.items())
    assert counts == {b"k0": b"334", b"k1": b"333", b"k2": b"333"}
    assert consumers[1].commits == [{INPUT: 1000}]
    assert consumers[0].commits == []


def test_a_record_running_when_its_task_moves_is_undone_and_run_by_the_new_owner(
    tmp_path: Path,
) -> None:
    """The processor awaits on one record (a lookup, say) past the rebalance timeout; the
    task moves meanwhile. The sibling neither processes nor commits the task while that record
    runs; the record's writes are then undone, nothing of it sent, and the sibling runs it."""
    app, task, recorder, consumers = make(tmp_path)

    async def run() -> None:
        stalled = await stalled_batch(app, batch(0, 10))
        assert task.processed == 5  # inside the record at offset 5
        await app._assign(1, frozenset({TASK}))
        # The record still runs on consumer 0: consumer 1 reads the task's records again later.
        await asyncio.wait_for(batch_of(app, 1, batch(0, 10)), 5)
        assert consumers[1].seeks == [(INPUT, 0)] and task.processed == 5
        app._pause_restoring(1)  # as consumer 1's loop does before every fetch
        assert consumers[1].paused_tps == {INPUT}  # not fetched and rewound on every loop
        await app._commits.commit(1)
        assert consumers[1].commits == []  # no commit of a task inside a sibling's record
        Count.gate.set()
        await stalled
        assert task.processed == 5 and outputs(recorder) == list(range(5))
        assert task.stores["counts"].get(b"k2") == b"1"  # offset 5's write undone (k2: 2, 5)
        app._pause_restoring(1)
        assert consumers[1].paused_tps == set()  # fetched again
        await app._commits.commit(0)
        assert consumers[0].commits == []
        await batch_of(app, 1, batch(0, 10))
        await app._commits.commit(1)

    with stalling_at(5):
        asyncio.run(run())
    assert outputs(recorder) == list(range(10))
    assert dict(task.stores["counts"].store.items()) == {b"k0": b"4", b"k1": b"3", b"k2": b"3"}
    assert consumers[1].commits == [{INPUT: 10}]


def test_a_rebalance_starting_mid_batch_stops_it_and_commits_what_was_processed(
    tmp_path: Path,
) -> None:
    """The rebalance's commit waits for the batch (the consumer's lock): the batch stops at its
    next record, so the member rejoins within the rebalance timeout and keeps its tasks."""
    app, task, recorder, consumers = make(tmp_path)

    asyncio.run(batch_interrupted_at_its_first_yield(app, task, app._rebalance_started))
    assert task.processed == YIELD_EVERY and outputs(recorder) == list(range(YIELD_EVERY))
    assert consumers[0].seeks == [(INPUT, YIELD_EVERY)]
    assert consumers[0].commits == [{INPUT: YIELD_EVERY}]


def test_a_consumer_given_back_a_task_its_sibling_took_runs_it_again(tmp_path: Path) -> None:
    """Consumer 1 left the group stuck in a batch; consumer 0 took its task 0_0; at the next
    generation 0_0 is consumer 1's again. The host's view of consumer 1 never changed (0_0
    before and after), so no assignment callback comes: completing the rebalance moves it."""
    app, task, _, _ = make(tmp_path)
    app.host._known[1] = ClientAssignment(active=frozenset({TASK}))  # what the group gave it

    async def run() -> None:
        await app._rebalance_started(1)
        await app._rebalance_completed(1)

    asyncio.run(run())
    assert app._actives[TASK] is task and task.consumer == 1


def test_a_task_given_back_stops_the_sibling_and_is_read_from_its_committed_offsets(
    tmp_path: Path,
) -> None:
    """Exactly once, as above, while consumer 0 (the sibling that took the task) is inside a
    record of it: consumer 1 gets it back positioned at the offsets this process committed,
    and consumer 0's batch stops there (the record undone, the rest rewound)."""
    app, task, recorder, consumers = make(tmp_path)
    app.processing_guarantee = "exactly_once"  # the seek to the committed offsets
    app.host._known[1] = ClientAssignment(active=frozenset({TASK}))

    async def run() -> None:
        task.committed = {TopicPartition(TOPIC, 0): 3}  # its last transaction's offsets
        stalled = await stalled_batch(app, batch(0, 10))
        await app._rebalance_started(1)
        await app._rebalance_completed(1)
        assert task.consumer == 1 and consumers[1].seeks == [(INPUT, 3)]
        assert consumers[1].paused_tps == {INPUT}  # until consumer 0's record returns
        Count.gate.set()
        await stalled

    with stalling_at(5):
        asyncio.run(run())
    assert task.processed == 5 and outputs(recorder) == list(range(5))
    assert consumers[0].seeks == [(INPUT, 5)]  # the rest of consumer 0's batch read again
    assert task.running is None and not task.torn


def test_a_consumer_out_of_the_group_stops_its_batch_at_the_next_record(tmp_path: Path) -> None:
    """The host reports the membership lost (stuck past ``max_poll_interval_ms``) before any
    rebalance callback, while the batch holds the consumer's lock: the batch stops at its next
    record (a zombie's), not at its end, and the rest is read again."""
    app, task, recorder, consumers = make(tmp_path)

    asyncio.run(batch_interrupted_at_its_first_yield(app, task, app._membership_lost))
    assert task.processed == YIELD_EVERY and outputs(recorder) == list(range(YIELD_EVERY))
    assert consumers[0].seeks == [(INPUT, YIELD_EVERY)]
    assert task.torn  # torn by the membership loss: restored before it runs again


def test_a_record_cancelled_after_its_task_moved_leaves_the_new_owner_s_task_whole(
    tmp_path: Path,
) -> None:
    """The old consumer's loop is cancelled (a stop past its grace period) inside a record
    whose task moved to the sibling: the record is undone, the task is not torn (its new
    owner's uncommitted progress stays)."""
    app, task, recorder, _ = make(tmp_path)

    async def run() -> None:
        stalled = await stalled_batch(app, batch(0, 10))
        await app._assign(1, frozenset({TASK}))
        stalled.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stalled

    with stalling_at(5):
        asyncio.run(run())
    assert not task.torn and task.consumer == 1 and task.running is None
    assert task.processed == 5 and task.offsets == {TopicPartition(TOPIC, 0): 5}
    assert task.stores["counts"].get(b"k2") == b"1"  # offset 5's write undone
    assert outputs(recorder) == list(range(5))


def test_a_task_moved_during_its_commit_waits_for_the_commit_on_the_sibling(
    tmp_path: Path,
) -> None:
    """A commit slower than ``max_poll_interval_ms`` (an acknowledgement that takes long): the
    task moves to the sibling meanwhile, which neither processes nor commits it (its input
    paused) until the commit ends."""
    app, task, recorder, consumers = make(tmp_path)

    async def run() -> None:
        await batch_of(app, 0, batch(0, 5))
        ack: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        task.futures.append(ack)  # a write not acknowledged yet
        committing = asyncio.create_task(app._commits.commit(0))
        await until(lambda: task.running == 0)
        await app._assign(1, frozenset({TASK}))
        app._pause_restoring(1)
        assert consumers[1].paused_tps == {INPUT}
        await batch_of(app, 1, batch(5, 10))  # fetched before the pause: read again later
        await app._commits.commit(1)
        assert task.processed == 5 and consumers[1].seeks == [(INPUT, 5)]
        assert consumers[1].commits == []
        ack.set_result(SimpleNamespace(offset=0))
        await committing
        assert task.running is None
        app._pause_restoring(1)
        assert consumers[1].paused_tps == set()
        await batch_of(app, 1, batch(5, 10))
        await app._commits.commit(1)

    asyncio.run(run())
    assert outputs(recorder) == list(range(10)) and task.processed == 10
    assert consumers[1].commits[-1] == {INPUT: 10}


class WriteAwaitWrite:
    """Writes, awaits ``gate`` on the record at offset ``Count.stall_at``, writes again."""

    def __init__(self) -> None:
        self.refused: list[Exception] = []

    async def process(self, ctx: TaskContext, record: Any) -> None:
        counts = ctx.store("counts")
        counts.put(b"before", str(record.offset).encode())
        if record.offset == Count.stall_at and Count.gate is not None:
            Count.stalled = True
            await Count.gate.wait()
        try:
            counts.put(b"after", str(record.offset).encode())
        except TaskMovedError as exc:
            self.refused.append(exc)
            raise


def test_a_write_after_the_task_moved_is_refused_and_the_record_undone(tmp_path: Path) -> None:
    """The processor wrote, awaited, and writes again once its task moved to the sibling: the
    store (the new owner's now) refuses the write, the record is undone, nothing sent."""
    app, task, recorder, _ = make(tmp_path)
    processor = task.processor = WriteAwaitWrite()

    async def run() -> None:
        stalled = await stalled_batch(app, batch(0, 10))
        await app._assign(1, frozenset({TASK}))
        Count.gate.set()
        await stalled

    with stalling_at(3):
        asyncio.run(run())
    assert len(processor.refused) == 1
    state = task.stores["counts"]
    assert state.get(b"before") == b"2" and state.get(b"after") == b"2"  # offset 3 undone
    assert task.processed == 3 and not task.torn and task.running is None
    assert [k for t, k, _ in recorder.sent if t == CHANGELOG.topic] == [b"before", b"after"] * 3
