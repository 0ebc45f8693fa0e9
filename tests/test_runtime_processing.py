"""The runtime's per-record path without a broker: skipping replays, undoing a failed record's
writes, the two error policies, and what reaches the changelog and the outputs.

The producer is replaced by a recorder (a unit test of the task logic; the broker tests in
``tests/integration/test_runtime.py`` run the real thing).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.errors import KafkaTimeoutError

from streamassign import Subtopology, TaskId, TopicPartition, Topology
from streamassign.errors import StoreIOError
from streamassign.runtime import (
    COMMIT_KEY,
    App,
    MemoryStore,
    ProcessingError,
    StoreState,
    TaskContext,
)
from streamassign.runtime.tasks import (
    POSITION_HEADER,
    UPSTREAM_HEADER,
    ActiveTask,
    mark_of,
    tear,
)

TOPIC = "events"
CHANGELOG = TopicPartition("app-totals-changelog", 0)


class Recorder:
    """Stands in for AIOKafkaProducer.send: records what would be produced."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None]] = []
        self.headers: list[Any] = []

    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: Any = None,
        headers: Any = None,
    ) -> asyncio.Future[None]:
        self.sent.append((topic, key, value))
        self.headers.append(headers)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future


class Rec:
    def __init__(
        self, offset: int, key: bytes, value: bytes, topic: str = TOPIC, headers: Any = ()
    ) -> None:
        self.topic, self.partition, self.offset, self.timestamp = topic, 0, offset, offset
        self.key, self.value, self.headers = key, value, headers


class Adder:
    """Adds the value to two keys, then fails on value ``b"boom"`` (after writing once)."""

    async def process(self, ctx: TaskContext, record: Any) -> None:
        table = ctx.store("totals")
        for suffix in (b"", b"-copy"):
            key = record.key + suffix
            if record.value == b"boom" and suffix:
                raise ValueError("bad record")
            table.put(key, str(int(table.get(key) or b"0") + int(record.value)).encode())
        ctx.send("out", table.get(record.key), key=record.key)


def make(tmp_path: Path, policy: str) -> tuple[App, ActiveTask, Recorder]:
    topology = Topology([Subtopology(0, [TOPIC], stores=["totals"])], name="app")
    app = App(
        topology,
        {0: Adder},
        bootstrap_servers="unused:1",
        state_dir=tmp_path,
        processing_errors=policy,  # type: ignore[arg-type]
    )
    recorder = Recorder()
    app._clients.producer = recorder  # type: ignore[assignment]
    state = StoreState.open("totals", CHANGELOG, MemoryStore())
    task = ActiveTask(TaskId(0, 0), 0, {"totals": state}, Adder())
    return app, task, recorder


def test_replayed_records_are_skipped_and_counted_once(tmp_path: Path) -> None:
    app, task, recorder = make(tmp_path, "stop")

    async def run() -> None:
        for offset, value in enumerate([b"1", b"2", b"3"]):
            await app._processing.process(task, Rec(offset, b"k", value))
        task.stores["totals"].committed(marker_offset=99)
        for offset, value in enumerate([b"1", b"2", b"3"]):  # the input read again
            await app._processing.process(task, Rec(offset, b"k", value))
        await app._processing.process(task, Rec(3, b"k", b"4"))

    asyncio.run(run())
    assert task.context.store("totals").get(b"k") == b"10"
    assert task.skipped == 3 and task.processed == 4
    assert task.offsets == {TopicPartition(TOPIC, 0): 4}
    changelog = [(k, v) for t, k, v in recorder.sent if t == CHANGELOG.topic]
    assert changelog[-2:] == [(b"k", b"10"), (b"k-copy", b"10")]
    assert [v for t, _, v in recorder.sent if t == "out"] == [b"1", b"3", b"6", b"10"]


def test_skip_policy_undoes_the_failed_records_writes(tmp_path: Path) -> None:
    app, task, recorder = make(tmp_path, "skip")

    async def run() -> None:
        await app._processing.process(task, Rec(0, b"k", b"5"))
        await app._processing.process(task, Rec(1, b"k", b"boom"))  # wrote k once, then raised
        await app._processing.process(task, Rec(2, b"k", b"1"))

    asyncio.run(run())
    table = task.context.store("totals")
    assert (table.get(b"k"), table.get(b"k-copy")) == (b"6", b"6")
    assert all(v != b"boom" for _, _, v in recorder.sent)
    assert task.offsets == {TopicPartition(TOPIC, 0): 3}  # the bad record is passed over


def test_a_store_failure_stops_even_under_the_skip_policy(tmp_path: Path) -> None:
    """Review: a damaged block raised ``StoreIOError`` in the processor, and "skip" passed
    over every record touching it (offsets committed, the records' effects gone for good)."""
    app, task, _ = make(tmp_path, "skip")

    class DamagedBlock:
        async def process(self, ctx: TaskContext, record: Any) -> None:
            raise StoreIOError("store x: a read failed: Corruption: block checksum mismatch")

    task.processor = DamagedBlock()
    with pytest.raises(ProcessingError, match="block checksum"):
        asyncio.run(app._processing.process(task, Rec(0, b"k", b"5")))
    assert task.offsets == {}


def test_stop_policy_raises_and_does_not_move_the_offset(tmp_path: Path) -> None:
    app, task, _ = make(tmp_path, "stop")

    async def run() -> None:
        await app._processing.process(task, Rec(0, b"k", b"5"))
        await app._processing.process(task, Rec(1, b"k", b"boom"))

    with pytest.raises(ProcessingError, match="events-0@1"):
        asyncio.run(run())
    assert task.context.store("totals").get(b"k") == b"5"  # the partial write was undone
    assert task.offsets == {TopicPartition(TOPIC, 0): 1}


class Gated:
    """Writes ``a``, awaits a gate (an awaited lookup, say), then writes ``b``."""

    gate: asyncio.Event

    async def process(self, ctx: TaskContext, record: Any) -> None:
        table = ctx.store("totals")
        table.put(b"a", b"1")
        await self.gate.wait()
        table.put(b"b", b"1")


class Producer:
    """A producer whose acks the test controls: a data write's future stays open until
    ``ack`` (or ``fail``); markers are acknowledged at once with their changelog offset."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None]] = []
        self.open: list[asyncio.Future[Any]] = []

    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: Any = None,
        headers: Any = None,
    ) -> asyncio.Future[Any]:
        self.sent.append((topic, key, value))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if key == COMMIT_KEY:
            future.set_result(SimpleNamespace(offset=self.count(topic) - 1))
        else:
            self.open.append(future)
        return future

    async def flush(self) -> None:
        pass

    def markers(self) -> int:
        return sum(1 for _, key, _ in self.sent if key == COMMIT_KEY)

    def count(self, topic: str) -> int:
        """Records sent to ``topic`` (its partition 0's end offset)."""
        return sum(1 for t, _, _ in self.sent if t == topic)


class Unread:
    """A changelog reader that finds each changelog ending after the records ``producer``
    sent to it and reads none of them (the test's store restores nothing)."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer

    def assign(self, tps: list[Any]) -> None: ...

    def seek(self, tp: Any, offset: int) -> None: ...

    async def position(self, tp: Any) -> int:
        return self.producer.count(tp.topic)

    async def end_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return {tp: self.producer.count(tp.topic) for tp in tps}

    async def getmany(self, *tps: Any, timeout_ms: int = 0, max_records: Any = None) -> dict:  # type: ignore[type-arg]
        return {}


class Committer:
    def __init__(self) -> None:
        self.commits: list[dict[Any, int]] = []

    async def commit(self, offsets: dict[Any, int]) -> None:
        self.commits.append(offsets)

    async def committed(self, tp: Any) -> int | None:
        """The group's committed offset of ``tp`` (None: none)."""
        offsets = [c[tp] for c in self.commits if tp in c]
        return offsets[-1] if offsets else None


def gated(tmp_path: Path) -> tuple[App, ActiveTask, Producer, Committer]:
    app, task, _ = make(tmp_path, "stop")
    producer, committer = Producer(), Committer()
    app._clients.producer = producer  # type: ignore[assignment]
    app.host.consumers.append(committer)  # type: ignore[arg-type]
    task.processor = Gated()
    Gated.gate = asyncio.Event()
    app._actives[task.task_id] = task
    return app, task, producer, committer


def test_a_record_cancelled_halfway_is_never_committed(tmp_path: Path) -> None:
    app, task, producer, committer = gated(tmp_path)
    state = task.stores["totals"]

    async def run() -> None:
        Gated.gate.set()
        await app._processing.process(task, Rec(0, b"k", b"1"))  # a whole record: a=1, b=1
        Gated.gate.clear()
        half = asyncio.create_task(app._processing.process(task, Rec(1, b"k", b"1")))
        await asyncio.sleep(0.01)
        half.cancel()  # as a stop() past its grace period does
        with pytest.raises(asyncio.CancelledError):
            await half
        for future in producer.open:
            future.set_result(None)
        await app._commits.commit(0)

    asyncio.run(run())
    assert task.torn
    assert producer.markers() == 0  # no marker closes the half record (nor anything after it)
    assert committer.commits == []
    assert (state.pending, state.pending_applied) == ({}, {})
    assert dict(state.store.items()) == {}


def test_markers_wait_for_every_data_ack(tmp_path: Path) -> None:
    app, task, producer, committer = gated(tmp_path)
    Gated.gate.set()

    async def run() -> None:
        await app._processing.process(task, Rec(0, b"k", b"1"))
        commit = asyncio.create_task(app._commits.commit(0))
        await asyncio.sleep(0.01)
        assert producer.markers() == 0  # the writes are not acknowledged yet
        for future in producer.open:
            future.set_result(None)
        await commit

    asyncio.run(run())
    assert producer.markers() == 1
    assert dict(task.stores["totals"].store.items()) == {b"a": b"1", b"b": b"1"}
    assert committer.commits == [{KafkaTopicPartition(TOPIC, 0): 1}]


def test_a_failed_data_write_commits_nothing(tmp_path: Path) -> None:
    app, task, producer, committer = gated(tmp_path)
    Gated.gate.set()

    async def run() -> None:
        await app._processing.process(task, Rec(0, b"k", b"1"))
        producer.open[0].set_result(None)
        producer.open[1].set_exception(KafkaTimeoutError())
        await app._commits.commit(0)

    with pytest.raises(KafkaTimeoutError):
        asyncio.run(run())
    assert producer.markers() == 0
    assert committer.commits == []
    assert dict(task.stores["totals"].store.items()) == {}


def test_a_commit_failing_at_a_rebalance_drops_state_and_restores_before_running(
    tmp_path: Path,
) -> None:
    app, task, producer, committer = gated(tmp_path)
    Gated.gate.set()

    async def run() -> ActiveTask:
        await app._processing.process(task, Rec(0, b"k", b"1"))
        for future in producer.open:
            future.set_exception(KafkaTimeoutError())
        await app._rebalance_started(0)  # its commit fails: logged, not raised
        assert task.torn and task.stores["totals"].pending_applied == {}
        await app._rebalance_completed(0)  # the task stayed on consumer 0
        app._clients.changelog_reader = Unread(producer)  # type: ignore[assignment]
        await app._updater.settle()
        again = app._actives[task.task_id]
        assert again is not task and not again.torn
        await app._processing.process(again, Rec(0, b"k", b"1"))  # re-read: processed, not skipped
        for future in producer.open[2:]:
            future.set_result(None)
        await app._commits.commit(0)
        return again

    again = asyncio.run(run())
    assert again.skipped == 0 and again.processed == 1
    # A fresh processor from the factory (Adder) did the replay; counted once.
    assert dict(again.stores["totals"].store.items()) == {b"k": b"1", b"k-copy": b"1"}
    assert committer.commits == [{KafkaTopicPartition(TOPIC, 0): 1}]
    assert [e.source for e in app.restore_events] == ["kept"]


class Split:
    """Upstream of a repartition topic: one record per word."""

    async def process(self, ctx: TaskContext, record: Any) -> None:
        for word in record.value.split():
            ctx.send("app-words", b"1", key=word)


class CountWords:
    async def process(self, ctx: TaskContext, record: Any) -> None:
        counts = ctx.store("counts")
        counts.put(record.key, str(int(counts.get(record.key) or b"0") + 1).encode())


def test_a_replayed_upstream_record_is_counted_once_downstream(tmp_path: Path) -> None:
    """The upstream task processes a sentence, crashes before committing its input, and its
    heir processes it again: the words reach the repartition topic twice, at new offsets.
    The downstream store applies each word once (upstream partition and position in the
    headers), also when the first copy was cut after one word."""
    topology = Topology(
        [
            Subtopology(0, ["sentences"], sink_topics=["app-words"]),
            Subtopology(1, ["app-words"], stores=["counts"]),
        ],
        repartition_topics={"app-words": None},
        name="app",
    )
    app = App(topology, {0: Split, 1: CountWords}, bootstrap_servers="x:1", state_dir=tmp_path)
    recorder = Recorder()
    app._clients.producer = recorder  # type: ignore[assignment]
    rep = frozenset(topology.repartition_topics)
    state = StoreState.open("counts", TopicPartition("app-counts-changelog", 0), MemoryStore())
    down = ActiveTask(TaskId(1, 0), 0, {"counts": state}, CountWords(), repartition=rep)
    sentence = Rec(7, b"s", b"to be or not to be", topic="sentences")

    async def run() -> None:
        for _ in range(2):  # the owner, then its heir after a crash
            upstream = ActiveTask(TaskId(0, 0), 0, {}, Split(), repartition=rep)
            await app._processing.process(upstream, sentence)
        words = [
            (k, h)
            for (t, k, _), h in zip(recorder.sent, recorder.headers, strict=True)
            if t == "app-words"
        ]
        copies = [words[0], *words]  # the first word even three times
        for offset, (word, headers) in enumerate(copies):
            await app._processing.process(
                down, Rec(offset, word, b"1", topic="app-words", headers=headers)
            )

    asyncio.run(run())
    counts = dict(state.items())
    assert counts == {b"be": b"2", b"not": b"1", b"or": b"1", b"to": b"2"}
    assert down.processed == 6 and down.skipped == 7


@pytest.mark.parametrize(
    "position",
    [b"1_000", b" 12 ", b"+5", b"-3", b"", b"12\n", b"\xd9\xa1", b"9" * 40, b"%d" % 2**83],
)
def test_a_position_header_not_written_by_streamassign_is_not_a_mark(position: bytes) -> None:
    """A foreign producer's repartition record naming a real upstream: ``int()`` took these,
    and a huge one made the stores skip that upstream's every later record, for good."""
    headers = [(UPSTREAM_HEADER, b"sentences[0]"), (POSITION_HEADER, position)]
    assert mark_of(Rec(4, b"w", b"1", topic="app-words", headers=headers)) == ("app-words", 4)


@pytest.mark.parametrize("position", [0, 7 * 2**20 + 3, 2**83 - 1])
def test_a_position_header_streamassign_writes_is_the_mark(position: int) -> None:
    headers = [(UPSTREAM_HEADER, b"sentences[0]"), (POSITION_HEADER, b"%d" % position)]
    mark = mark_of(Rec(4, b"w", b"1", topic="app-words", headers=headers))
    assert mark == ("sentences[0]", position)


def test_a_torn_tasks_failed_writes_are_not_logged_as_unretrieved(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Writes dropped by a tear fail later (fenced producer, deleted topic): asyncio logged
    each as "Future exception was never retrieved" with a trace."""
    import gc

    _, task, _ = make(tmp_path, "stop")

    async def run() -> None:
        pending = [asyncio.get_running_loop().create_future() for _ in range(3)]
        task.futures.extend(pending)
        tear(task)
        for sent in pending:
            sent.set_exception(KafkaTimeoutError())
        await asyncio.sleep(0)  # the done callbacks run

    asyncio.run(run())
    gc.collect()
    assert "never retrieved" not in caplog.text
