"""``processing_guarantee="exactly_once"`` without a broker: a task's writes, marker and input
offsets go into its own transaction; a fenced producer tears only its task (nothing of the
transaction reaches the local store, the consumer rejoins, the loop goes on); configuration.

The producers are fakes recording what a transactional producer would be asked; the broker
tests in ``tests/integration/test_runtime_eos.py`` run the real thing.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.errors import (
    InvalidProducerEpoch,
    InvalidTransactionTimeout,
    KafkaConnectionError,
    ProducerFenced,
    UnknownError,
)

from streamassign import Subtopology, TaskId, TopicPartition, Topology
from streamassign.errors import (
    OutputWriteError,
    ProducerStartError,
    RuntimeConfigError,
    WritesAbandonedError,
)
from streamassign.runtime import (
    COMMIT_KEY,
    App,
    MemoryStore,
    StoreState,
    TaskContext,
    end_offsets,
    transactions,
)
from streamassign.runtime.tasks import ActiveTask
from streamassign.runtime.transactions import TaskProducers, transactional_id

TOPIC = "events"


class Ack:
    def __init__(self, offset: int) -> None:
        self.offset = offset


class TxnProducer:
    """Records a transactional producer's calls; ``fenced`` makes every call fail as a
    producer whose transactional id a newer owner initialised."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None]] = []
        self.calls: list[str] = []
        self.offsets: list[dict[Any, int]] = []
        self.fenced = False

    def _check(self) -> None:
        if self.fenced:
            raise ProducerFenced()

    async def begin_transaction(self) -> None:
        self._check()
        self.calls.append("begin")

    async def send(
        self, topic: str, value: bytes | None, key: bytes | None = None, **_: Any
    ) -> asyncio.Future[Ack]:
        self._check()
        self.sent.append((topic, key, value))
        future: asyncio.Future[Ack] = asyncio.get_running_loop().create_future()
        future.set_result(Ack(len(self.sent) - 1))
        return future

    async def send_offsets_to_transaction(self, offsets: dict[Any, int], group: str) -> None:
        self._check()
        self.offsets.append(offsets)

    async def commit_transaction(self) -> None:
        self._check()
        self.calls.append("commit")

    async def abort_transaction(self) -> None:
        self.calls.append("abort")

    async def stop(self) -> None:
        self.calls.append("stop")


class Count:
    async def process(self, ctx: TaskContext, record: Any) -> None:
        counts = ctx.store("counts")
        total = int(counts.get(record.key) or b"0") + 1
        counts.put(record.key, str(total).encode())
        ctx.send("out", str(total).encode(), key=record.key)


class Rec:
    def __init__(self, partition: int, offset: int, key: bytes) -> None:
        self.topic, self.partition, self.offset, self.timestamp = TOPIC, partition, offset, offset
        self.key, self.value, self.headers = key, b"", ()


def make(tmp_path: Path) -> tuple[App, dict[int, ActiveTask], dict[int, TxnProducer], list[int]]:
    """An exactly-once app with two tasks on consumer 0, each with its fake producer;
    returns the consumers asked to rejoin too."""
    topology = Topology([Subtopology(0, [TOPIC], stores=["counts"])], name="app")
    app = App(
        topology,
        {0: Count},
        bootstrap_servers="unused:1",
        state_dir=tmp_path,
        store_kind="memory",
        processing_guarantee="exactly_once",
    )
    producers = TaskProducers("app", "unused:1", {})
    app._clients.task_producers = producers
    rejoins: list[int] = []
    app.host.request_rejoin = rejoins.append  # type: ignore[method-assign]
    tasks, fakes = {}, {}
    for p in (0, 1):
        changelog = TopicPartition("app-counts-changelog", p)
        state = StoreState.open("counts", changelog, MemoryStore())
        task = ActiveTask(TaskId(0, p), 0, {"counts": state}, Count())
        app._actives[task.task_id] = task
        fakes[p] = TxnProducer()
        producers.producers[task.task_id] = fakes[p]  # type: ignore[assignment]
        tasks[p] = task
    return app, tasks, fakes, rejoins


def test_a_commit_is_one_transaction_per_task_with_its_marker_and_offsets(tmp_path: Path) -> None:
    app, tasks, fakes, rejoins = make(tmp_path)

    async def run() -> None:
        for offset in range(3):
            await app._processing.process(tasks[0], Rec(0, offset, b"k"))
        await app._processing.process(tasks[1], Rec(1, 0, b"j"))
        await app._commits.commit(0)

    asyncio.run(run())
    for p, (records, key) in {0: (3, b"k"), 1: (1, b"j")}.items():
        fake = fakes[p]
        assert fake.calls == ["begin", "commit"]
        assert [t for t, _, _ in fake.sent] == [
            *["app-counts-changelog", "out"] * records,
            "app-counts-changelog",
        ]
        assert fake.sent[-1][1] == COMMIT_KEY  # the marker, inside the transaction
        assert fake.offsets == [{KafkaTopicPartition(TOPIC, p): records}]
        state = tasks[p].stores["counts"]
        assert dict(state.store.items()) == {key: str(records).encode()}
        assert state.position == len(fake.sent) and state.end is None
    assert rejoins == []


def test_a_task_with_a_record_running_on_a_sibling_consumer_is_not_committed(
    tmp_path: Path,
) -> None:
    """Task 0_0 moved to consumer 0 while a record of it still runs on consumer 1 (its
    processor awaiting): consumer 0's commit leaves it out (its transaction stays open, its
    stores uncommitted) and commits the other task; once the record returned, it commits."""
    app, tasks, fakes, _ = make(tmp_path)

    async def run() -> None:
        await app._processing.process(tasks[0], Rec(0, 0, b"k"))
        await app._processing.process(tasks[1], Rec(1, 0, b"j"))
        tasks[0].running = 1
        await app._commits.commit(0)
        assert fakes[0].calls == ["begin"] and fakes[0].offsets == []
        assert dict(tasks[0].stores["counts"].store.items()) == {}
        assert fakes[1].calls == ["begin", "commit"]
        tasks[0].running = None
        await app._commits.commit(0)

    asyncio.run(run())
    assert fakes[0].calls == ["begin", "commit"]
    assert fakes[0].offsets == [{KafkaTopicPartition(TOPIC, 0): 1}]
    assert dict(tasks[0].stores["counts"].store.items()) == {b"k": b"1"}


def test_a_fenced_commit_tears_only_its_task_and_rejoins(tmp_path: Path) -> None:
    app, tasks, fakes, rejoins = make(tmp_path)

    async def run() -> None:
        await app._processing.process(tasks[0], Rec(0, 0, b"k"))
        await app._processing.process(tasks[1], Rec(1, 0, b"j"))
        fakes[0].fenced = True  # a newer owner of task 0_0 initialised its producer
        await app._commits.commit(0)
        await asyncio.gather(*app._clients.task_producers.closing)  # type: ignore[union-attr]

    asyncio.run(run())
    assert tasks[0].torn and dict(tasks[0].stores["counts"].store.items()) == {}
    assert tasks[0].offsets == {}  # its input is read again from the committed offsets
    assert TaskId(0, 0) not in app._clients.task_producers.producers  # type: ignore[union-attr]
    assert "stop" in fakes[0].calls  # closed (off the loop's path), never used again
    assert not tasks[1].torn and dict(tasks[1].stores["counts"].store.items()) == {b"j": b"1"}
    assert rejoins == [0]


def test_a_send_on_a_fenced_producer_tears_the_task_and_the_batch_goes_on(tmp_path: Path) -> None:
    app, tasks, fakes, rejoins = make(tmp_path)
    fakes[0].fenced = True
    batch = {
        KafkaTopicPartition(TOPIC, 0): [Rec(0, 0, b"k"), Rec(0, 1, b"k")],
        KafkaTopicPartition(TOPIC, 1): [Rec(1, 0, b"j")],
    }

    class Consumer:
        def seek(self, *_: Any) -> None:
            pass

    asyncio.run(app._processing.process_batch(0, Consumer(), batch))  # type: ignore[arg-type]
    assert tasks[0].torn and tasks[0].processed == 0
    assert tasks[1].processed == 1 and not tasks[1].torn
    assert rejoins == [0]


def test_configuration(tmp_path: Path) -> None:
    topology = Topology([Subtopology(0, [TOPIC], stores=["counts"])], name="app")
    common: dict[str, Any] = {"bootstrap_servers": "unused:1"}
    with pytest.raises(RuntimeConfigError, match="processing_guarantee"):
        App(topology, {0: Count}, processing_guarantee="twice", state_dir=tmp_path / "a", **common)  # type: ignore[arg-type]
    for guarantee in ("exactly_once", "at_least_once"):  # a shared one would break both
        with pytest.raises(RuntimeConfigError, match="transactional_id"):
            App(
                topology,
                {0: Count},
                processing_guarantee=guarantee,  # type: ignore[arg-type]
                producer_config={"transactional_id": "mine"},
                state_dir=tmp_path / "b",
                **common,
            )
    for timeout in ("60s", None, 0):  # one line, not a ValueError deep in int()
        with pytest.raises(RuntimeConfigError, match="transaction_timeout_ms must be an int"):
            App(
                topology,
                {0: Count},
                producer_config={"transaction_timeout_ms": timeout},
                state_dir=tmp_path / "g",
                **common,
            )
    with pytest.raises(RuntimeConfigError, match="transaction_timeout_ms"):
        App(
            topology,
            {0: Count},
            processing_guarantee="exactly_once",
            commit_interval_ms=60_000,
            state_dir=tmp_path / "e",
            **common,
        )
    eos = App(
        topology,
        {0: Count},
        processing_guarantee="exactly_once",
        state_dir=tmp_path / "c",
        **common,
    )
    assert eos.consumer_config["isolation_level"] == "read_committed"
    assert eos.isolation_level == "read_committed"
    alo = App(topology, {0: Count}, state_dir=tmp_path / "d", **common)
    assert alo.processing_guarantee == "at_least_once"
    # read_committed in both modes: aborted records of a transactional upstream never count
    assert alo.consumer_config["isolation_level"] == alo.isolation_level == "read_committed"
    dirty = {"isolation_level": "read_uncommitted"}
    alo = App(topology, {0: Count}, state_dir=tmp_path / "f", consumer_config=dirty, **common)
    assert alo.isolation_level == "read_uncommitted"  # asked for explicitly: kept
    with pytest.raises(RuntimeConfigError, match="read_committed"):
        App(
            topology,
            {0: Count},
            processing_guarantee="exactly_once",
            consumer_config=dirty,
            state_dir=tmp_path / "g",
            **common,
        )
    assert transactional_id("app", TaskId(0, 3)) == "app-0_3"


def fail_sends(fake: TxnProducer, exc: Exception) -> None:
    """Every later send of ``fake`` is acknowledged with ``exc`` (a broker's rejection)."""

    async def send(topic: str, value: bytes | None, key: bytes | None = None, **_: Any) -> Any:
        future: asyncio.Future[Ack] = asyncio.get_running_loop().create_future()
        future.set_exception(exc)
        return future

    fake.send = send  # type: ignore[method-assign]


def test_a_rejected_write_aborts_and_stops_instead_of_rejoining_forever(tmp_path: Path) -> None:
    """A record the broker rejects (here: a keyless record to a compacted topic, which the
    broker answers with an unknown error) would fail again after any number of rejoins."""
    app, tasks, fakes, rejoins = make(tmp_path)
    fail_sends(fakes[0], UnknownError())

    async def run() -> None:
        await app._processing.process(tasks[0], Rec(0, 0, b"k"))
        await app._processing.process(tasks[1], Rec(1, 0, b"j"))
        with pytest.raises(OutputWriteError, match="task 0_0"):
            await app._commits.commit_safely(0)
        await asyncio.gather(*app._clients.task_producers.closing)  # type: ignore[union-attr]

    asyncio.run(run())
    assert rejoins == []
    assert tasks[0].torn and "abort" in fakes[0].calls  # its transaction is aborted
    assert dict(tasks[1].stores["counts"].store.items()) == {b"j": b"1"}  # the other committed


def test_a_transaction_state_error_tears_and_rejoins(tmp_path: Path) -> None:
    app, tasks, fakes, rejoins = make(tmp_path)
    fail_sends(fakes[0], InvalidProducerEpoch())  # e.g. aborted by the broker at its timeout

    async def run() -> None:
        await app._processing.process(tasks[0], Rec(0, 0, b"k"))
        await app._commits.commit(0)

    asyncio.run(run())
    assert tasks[0].torn and rejoins == [0]


def test_an_abandoned_write_tears_and_rejoins(tmp_path: Path) -> None:
    """A write a released producer abandoned (``WritesAbandonedError``: the
    broker was unreachable) is no refusal; it was reported as one that "cannot be written",
    and the application stopped for a passing condition."""
    app, tasks, fakes, rejoins = make(tmp_path)
    fail_sends(fakes[0], WritesAbandonedError("a task's producer was released"))

    async def run() -> None:
        await app._processing.process(tasks[0], Rec(0, 0, b"k"))
        await app._commits.commit(0)

    asyncio.run(run())
    assert tasks[0].torn and rejoins == [0]
    assert app.failure is None


def test_no_task_is_torn_while_another_still_commits(tmp_path: Path) -> None:
    """One task's commit fails unexpectedly while another's is still under way: that one
    ends (its store written with the state its marker closes) before anything is torn, so no
    store's position passes writes it never applied."""
    app, tasks, fakes, _ = make(tmp_path)
    fail_sends(fakes[0], RuntimeError("unexpected"))
    slow = fakes[1].commit_transaction

    async def commit_later() -> None:
        await asyncio.sleep(0.05)
        await slow()

    fakes[1].commit_transaction = commit_later  # type: ignore[method-assign]

    async def run() -> None:
        await app._processing.process(tasks[0], Rec(0, 0, b"k"))
        await app._processing.process(tasks[1], Rec(1, 0, b"j"))
        with pytest.raises(OutputWriteError):
            await app._commits.commit_safely(0)
        await asyncio.sleep(0.1)  # anything still running would have finished by now

    asyncio.run(run())
    state = tasks[1].stores["counts"]
    assert state.position == len(fakes[1].sent)
    assert dict(state.store.items()) == {b"j": b"1"}


def test_a_producer_that_cannot_start_stops_with_one_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transactions, "START_BACKOFF", 0.01)
    starts: list[TaskId] = []

    def producers_failing(*errors: Exception | None, timeout: float = 5.0) -> TaskProducers:
        producers = TaskProducers("app", "unused:1", {}, start_timeout=timeout)
        outcomes = list(errors)

        async def start(task: TaskId) -> Any:
            starts.append(task)
            error = outcomes.pop(0) if outcomes else None
            if error is not None:
                raise error
            if not outcomes and errors and errors[-1] is not None:
                await asyncio.Event().wait()  # the coordinator never answers
            return TxnProducer()

        producers._start = start  # type: ignore[method-assign]
        return producers

    task = TaskId(0, 0)
    # Rejected by the broker (above transaction.max.timeout.ms): not tried again.
    with pytest.raises(ProducerStartError, match="InvalidTransactionTimeout"):
        asyncio.run(producers_failing(InvalidTransactionTimeout()).renew(task))
    assert len(starts) == 1
    # A retriable error, then a start: the producer is there.
    producers = producers_failing(KafkaConnectionError(), None)
    asyncio.run(producers.renew(task))
    assert task in producers.producers and len(starts) == 3
    # No coordinator ever (aiokafka retries COORDINATOR_NOT_AVAILABLE forever): bounded.
    with pytest.raises(ProducerStartError, match=r"transaction\.state\.log\.replication\.factor"):
        asyncio.run(producers_failing(KafkaConnectionError(), timeout=0.2).renew(task))
    # A configuration aiokafka refuses: one error, no retries.
    bad = TaskProducers("app", "unused:1", {"acks": 0})
    with pytest.raises(ProducerStartError, match="acks"):
        asyncio.run(bad.renew(task))
    # The application stops on it (raised out of the assignment, not a rejoin).
    app, _, _, rejoins = make(tmp_path)
    app._actives.clear()
    app._clients.task_producers = producers_failing(InvalidTransactionTimeout())
    with pytest.raises(ProducerStartError):
        asyncio.run(app._start_tasks(0, [(task, {}, "cold")]))
    assert rejoins == []


def test_running_tasks_are_positioned_at_their_last_committed_offsets_after_a_rebalance(
    tmp_path: Path,
) -> None:
    """aiokafka's OffsetFetch after a rebalance may return the offset from before a
    transaction whose markers are still being written: a task kept (or moved here from a
    sibling consumer) would process again what it committed."""
    app, tasks, _, _ = make(tmp_path)

    class Consumer:
        def __init__(self) -> None:
            self.seeks: list[tuple[KafkaTopicPartition, int]] = []

        def assignment(self) -> set[KafkaTopicPartition]:
            return {KafkaTopicPartition(TOPIC, 0), KafkaTopicPartition(TOPIC, 1)}

        def paused(self) -> set[KafkaTopicPartition]:
            return set()

        def seek(self, tp: KafkaTopicPartition, offset: int) -> None:
            self.seeks.append((tp, offset))

    consumer = Consumer()
    app.host.consumers = [consumer]  # type: ignore[list-item]

    async def run() -> None:
        for offset in range(3):
            await app._processing.process(tasks[0], Rec(0, offset, b"k"))
        await app._commits.commit(0)  # task 0_1 committed nothing
        await app._rebalance_completed(0)

    asyncio.run(run())
    assert consumer.seeks == [(KafkaTopicPartition(TOPIC, 0), 3)]


def test_a_batch_past_the_commit_deadline_is_cut_and_the_rest_read_again(tmp_path: Path) -> None:
    """Exactly once, a batch slower than the transaction timeout must still get through: past
    its commit deadline the loop stops processing, rewinds the rest and commits."""
    app, tasks, _, _ = make(tmp_path)
    seeks: list[tuple[KafkaTopicPartition, int]] = []

    class Consumer:
        def seek(self, tp: KafkaTopicPartition, offset: int) -> None:
            seeks.append((tp, offset))

    batch = {
        KafkaTopicPartition(TOPIC, 0): [Rec(0, 5, b"k"), Rec(0, 6, b"k"), Rec(0, 7, b"k")],
        KafkaTopicPartition(TOPIC, 1): [Rec(1, 0, b"j")],
    }
    asyncio.run(app._processing.process_batch(0, Consumer(), batch, deadline=0.0))  # type: ignore[arg-type]
    assert tasks[0].processed == 1 and tasks[1].processed == 0  # at least one record
    assert seeks == [(KafkaTopicPartition(TOPIC, 0), 6), (KafkaTopicPartition(TOPIC, 1), 0)]


class Ends:
    """A consumer's ``end_offsets``: ``ends`` per partition, each call logged as ``name``
    in ``calls``; ``error`` fails the call."""

    def __init__(self, name: str, ends: dict[int, int], calls: list[str]) -> None:
        self.name, self.ends, self.calls = name, ends, calls
        self.error: Exception | None = None

    async def end_offsets(self, tps: list[KafkaTopicPartition]) -> dict[KafkaTopicPartition, int]:
        self.calls.append(self.name)
        if self.error is not None:
            raise self.error
        return {tp: self.ends[tp.partition] for tp in tps}

    async def stop(self) -> None:
        pass


def test_at_least_once_inits_a_producer_only_for_tasks_with_an_open_transaction() -> None:
    """``OrphanTransactions``: high watermarks read before last stable offsets (a plain write
    in between must not look like a transaction); a producer initialised (and closed) for
    each task whose changelog has its last stable offset below the high watermark, none for
    the others; a failed check is logged and gives no task (the restore goes on)."""
    calls: list[str] = []
    highwater = Ends("high watermarks", {0: 10, 1: 7, 2: 5}, calls)
    stable = Ends("last stable offsets", {0: 4, 1: 7, 2: 6}, calls)  # 2: written in between
    orphans = transactions.OrphanTransactions("app", "unused:1", {}, {})
    orphans._highwater = highwater  # type: ignore[assignment]
    started: list[TaskId] = []

    async def renew(task: TaskId) -> None:
        started.append(task)

    orphans.producers.renew = renew  # type: ignore[method-assign]
    changelogs = {TaskId(0, p): [TopicPartition("cl", p)] for p in range(3)}

    async def run() -> None:
        assert await orphans.abort(stable, changelogs) == {TaskId(0, 0)}  # type: ignore[arg-type]
        assert calls == ["high watermarks", "last stable offsets"]
        assert started == [TaskId(0, 0)]
        stable.error = KafkaConnectionError()
        assert await orphans.abort(stable, changelogs) == set()  # type: ignore[arg-type]
        assert started == [TaskId(0, 0)]
        await orphans.stop()

    asyncio.run(run())


def test_two_consumers_first_checks_start_one_high_watermark_consumer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With threads >= 2 two consumers start tasks at once: one high-watermark consumer is
    made and stopped (before, each made one and the first was never stopped)."""
    made: list[object] = []
    stopped: list[object] = []

    class HighWaters:  # as ``OrphanTransactions`` makes it (``AIOKafkaConsumer``)
        def __init__(self, **config: Any) -> None:
            made.append(self)

        async def start(self) -> None:
            await asyncio.sleep(0.02)  # a broker round trip: the second check starts meanwhile

        async def stop(self) -> None:
            stopped.append(self)

        async def end_offsets(
            self, tps: list[KafkaTopicPartition]
        ) -> dict[KafkaTopicPartition, int]:
            return {tp: 5 for tp in tps}

    monkeypatch.setattr(transactions, "AIOKafkaConsumer", HighWaters)
    orphans = transactions.OrphanTransactions("app", "unused:1", {}, {})
    stable = Ends("last stable offsets", {0: 5, 1: 5}, [])

    async def run() -> None:
        await asyncio.gather(
            orphans.abort(stable, {TaskId(0, 0): [TopicPartition("cl", 0)]}),  # type: ignore[arg-type]
            orphans.abort(stable, {TaskId(0, 1): [TopicPartition("cl", 1)]}),  # type: ignore[arg-type]
        )
        await orphans.stop()

    asyncio.run(run())
    assert len(made) == 1 and stopped == made


class Leaderless(Ends):
    """A call naming partition 1 (no leader) never answers, as aiokafka retries it."""

    async def end_offsets(self, tps: list[KafkaTopicPartition]) -> dict[KafkaTopicPartition, int]:
        if any(tp.partition == 1 for tp in tps):
            await asyncio.Event().wait()
        return await super().end_offsets(tps)


def test_a_leaderless_partition_costs_the_list_fallback_not_the_whole_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One partition without a leader: the others are still checked, each partition asked
    on its own (``end_offsets.list_offsets``), within two list timeouts, not the check's
    whole bound; the leaderless one is not checked."""
    monkeypatch.setattr(end_offsets, "LIST_TIMEOUT", 0.05)
    calls: list[str] = []
    orphans = transactions.OrphanTransactions("app", "unused:1", {}, {}, timeout=30.0)
    orphans._highwater = Leaderless("hw", {0: 10, 1: 10, 2: 10}, calls)  # type: ignore[assignment]
    stable = Leaderless("lso", {0: 4, 1: 4, 2: 10}, calls)
    started: list[TaskId] = []

    async def renew(task: TaskId) -> None:
        started.append(task)

    orphans.producers.renew = renew  # type: ignore[method-assign]
    changelogs = {TaskId(0, p): [TopicPartition("cl", p)] for p in range(3)}

    async def run() -> set[TaskId]:
        async with asyncio.timeout(5):
            return await orphans.abort(stable, changelogs)  # type: ignore[arg-type]

    assert asyncio.run(run()) == {TaskId(0, 0)} and started == [TaskId(0, 0)]


def test_a_hanging_check_is_given_up_at_its_bound_and_a_cancel_closes_the_producers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The check's bound (``timeout``, 10 s by default) ends a check that hangs: logged, no
    task (the restore goes on). An abort cancelled while the producers initialise still
    closes them."""
    hanging = Leaderless("hw", {1: 10}, [])
    orphans = transactions.OrphanTransactions("app", "unused:1", {}, {}, timeout=0.1)
    orphans._highwater = hanging  # type: ignore[assignment]
    closed: list[str] = []

    async def close() -> None:
        closed.append("stopped")

    async def renew(task: TaskId) -> None:
        await asyncio.Event().wait()

    orphans.producers.stop = close  # type: ignore[method-assign]
    orphans.producers.renew = renew  # type: ignore[method-assign]

    async def run() -> None:
        with caplog.at_level("WARNING", "streamassign.runtime"):
            changelogs = {TaskId(0, 1): [TopicPartition("cl", 1)]}
            assert await orphans.abort(hanging, changelogs) == set()  # type: ignore[arg-type]
        assert "not checked" in caplog.records[-1].getMessage()
        orphans._highwater = Ends("hw", {0: 10}, [])  # type: ignore[assignment]
        stable = Ends("lso", {0: 4}, [])
        aborting = asyncio.ensure_future(
            orphans.abort(stable, {TaskId(0, 0): [TopicPartition("cl", 0)]})  # type: ignore[arg-type]
        )
        await asyncio.sleep(0.05)
        aborting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await aborting

    asyncio.run(asyncio.wait_for(run(), 5))
    assert closed == ["stopped"]


def test_at_least_once_aborts_orphan_transactions_before_the_restore_starts(
    tmp_path: Path,
) -> None:
    """The restore reads its end ``read_committed``: an open transaction must be aborted
    before the state updater takes the task, or the restore stops short of it."""
    from .test_runtime_membership import TASK, make

    app, _, _, _ = make(tmp_path)
    order: list[str] = []

    class Orphans:
        async def abort(self, stable: Any, changelogs: Any) -> set[TaskId]:
            order.append(f"abort {sorted(changelogs)}")
            return set()

    app._orphans = Orphans()  # type: ignore[assignment]
    add = app._updater.add

    def adding(task: ActiveTask, source: str) -> Any:
        order.append(f"restore {task.task_id}")
        return add(task, source)

    app._updater.add = adding  # type: ignore[method-assign]

    async def run() -> None:
        await app._start_tasks(0, [(TASK, app._stores.open(TASK), "cold")])
        await app._updater.settle()

    asyncio.run(run())
    assert order == [f"abort {[TASK]}", f"restore {TASK}"]
