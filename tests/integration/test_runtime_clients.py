"""The runtime's Kafka clients on a real broker, one ``App`` in the test's process.

Checked: an at-least-once application reads its input ``read_committed`` (an upstream
transactional producer's aborted records are never counted); a backlog written to an output
topic whose ``max.message.bytes`` is below the shared producer's batch size goes through
(batches capped at start), and a record larger than that limit stops the application with
one ``OutputWriteError`` naming topic, size and limit, unless the producers compress it
below the limit (then it goes through). With a broker of its own, frozen while a rebalance
callback commits, ``stop()`` ends and nothing is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from streamassign import Subtopology, Topology
from streamassign.aiokafka import closing
from streamassign.errors import OutputWriteError
from streamassign.runtime import App, ProcessingError, Record, TaskContext
from streamassign.runtime.tasks import ProcessorFactory

from .conftest import GroupIdFactory, TopicFactory, _create_topic, kafka_script
from .test_runtime import _read_topic

PARTITIONS = 2
DEADLINE = 60.0


class Counts:
    """Counts records per key in store ``counts``; with ``output`` set, sends one record per
    input record there (``<partition>:<offset>`` padded to ``pad`` bytes; a value ``big``
    sends ``big_size`` bytes instead)."""

    output: str | None = None
    pad = 0
    big_size = 0

    async def process(self, ctx: TaskContext, record: Record) -> None:
        table = ctx.store("counts")
        key = record.key or b""
        table.put(key, b"%d" % (int(table.get(key) or b"0") + 1))
        if self.output is not None:
            value = b"%d:%d" % (record.partition, record.offset)
            if record.value == b"big":
                value = value.ljust(self.big_size, b"x")
            ctx.send(self.output, value.ljust(self.pad, b"."), key=key)


@contextlib.contextmanager
def counts_sending_to(output: str, pad: int = 0, big_size: int = 0) -> Iterator[None]:
    """``Counts`` sends to ``output`` (see ``Counts``); the class state is reset after (it
    outlives the test)."""
    Counts.output, Counts.pad, Counts.big_size = output, pad, big_size
    try:
        yield
    finally:
        Counts.output, Counts.pad, Counts.big_size = None, 0, 0


def make_app(
    bootstrap: str, group: str, source: str, tmp: Path, declare: bool = True, **options: Any
) -> App:
    """The counting app; ``declare``: name ``Counts.output`` as a sink topic."""
    sinks = [Counts.output] if Counts.output and declare else []
    topology = Topology(
        [Subtopology(0, [source], stores=["counts"], sink_topics=sinks)], name=group
    )
    return App(
        topology,
        {0: Counts},
        bootstrap_servers=bootstrap,
        state_dir=tmp,
        store_kind="memory",
        commit_interval_ms=200,
        **options,
    )


def table(app: App) -> dict[bytes, int]:
    out: Counter[bytes] = Counter()
    for task in app.active_tasks:
        for key, value in app.table(task, "counts").items():
            out[key] += int(value)
    return dict(out)


async def until(what: str, condition: Callable[[], bool], app: App) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert app.failure is None, app.failure
        assert time.monotonic() < deadline, f"not within {DEADLINE:g} s: {what}"
        await asyncio.sleep(0.1)


async def run_app(app: App, scenario: Callable[[], Awaitable[None]]) -> None:
    await app.start()
    try:
        await scenario()
    finally:
        await app.stop()


async def produce(
    bootstrap: str, topic: str, keys: list[bytes], partitioned: bool = False, value: bytes = b"1"
) -> None:
    """One record per key; ``partitioned``: the i-th to partition i."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=256 * 1024
    )
    await producer.start()
    try:
        futures = [
            await producer.send(topic, value, key=key, partition=i if partitioned else None)
            for i, key in enumerate(keys)
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def transactions(bootstrap: str, topic: str, aborted: int, committed: int) -> None:
    """An upstream transactional producer: ``aborted`` records (keys ``a<i>``) in a
    transaction it aborts, then ``committed`` (keys ``c<i>``) in one it commits."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"{topic}-up")
    await producer.start()
    try:
        for prefix, count, commit in ((b"a", aborted, False), (b"c", committed, True)):
            await producer.begin_transaction()
            futures = [await producer.send(topic, b"1", key=b"%s%d" % (prefix, i % 50))
                       for i in range(count)]  # fmt: skip
            await asyncio.gather(*futures)
            await (producer.commit_transaction() if commit else producer.abort_transaction())
    finally:
        await producer.stop()


def test_at_least_once_never_counts_an_upstream_aborted_transaction(
    kafka_bootstrap: str,
    kafka_topic_factory: TopicFactory,
    kafka_group_id_factory: GroupIdFactory,
    tmp_path: Path,
) -> None:
    """An upstream transactional producer writes 3,000 records and aborts, then 2,000 and
    commits; a plain producer then writes one record to each partition. The at-least-once
    app (default consumer settings) counts the 2,000 and the last ones, none of the aborted."""
    source = kafka_topic_factory(PARTITIONS, prefix="upstream")
    app = make_app(kafka_bootstrap, kafka_group_id_factory("rc"), source, tmp_path)
    assert app.isolation_level == "read_committed"

    async def scenario() -> None:
        await transactions(kafka_bootstrap, source, aborted=3000, committed=2000)
        # One to each partition: once both are counted, everything before them is.
        lasts = [b"last%d" % p for p in range(PARTITIONS)]
        await produce(kafka_bootstrap, source, lasts, partitioned=True)
        await until("the last records counted", lambda: set(lasts) <= set(table(app)), app)
        counts = table(app)
        assert not [k for k in counts if k.startswith(b"a")], "aborted records were counted"
        assert sum(v for k, v in counts.items() if k.startswith(b"c")) == 2000
        assert sum(counts.values()) == 2000 + len(lasts)

    asyncio.run(run_app(app, scenario))


#: ``max.message.bytes`` of the output topics below: a quarter of the shared producer's
#: default batch size (256 KiB).
SMALL_LIMIT = 65_536


def big_record_topics(
    bootstrap: str, topic_factory: TopicFactory, prefix: str, keys: list[bytes]
) -> tuple[str, str]:
    """An input holding one record per key, then one (value ``big``) whose output is large,
    and an output topic taking ``SMALL_LIMIT`` bytes."""
    source = topic_factory(PARTITIONS, prefix=f"{prefix}-in")
    output = topic_factory(
        PARTITIONS, prefix=f"{prefix}-out", config={"max.message.bytes": str(SMALL_LIMIT)}
    )
    asyncio.run(produce(bootstrap, source, keys))
    asyncio.run(produce(bootstrap, source, [b"big"], value=b"big"))
    return source, output


@pytest.mark.parametrize(
    ("guarantee", "limit"),
    [("at_least_once", SMALL_LIMIT), ("exactly_once", 8192)],
    ids=["at-least-once", "exactly-once"],
)
def test_a_backlog_to_a_topic_with_a_small_max_message_bytes_goes_through(
    kafka_bootstrap: str,
    kafka_topic_factory: TopicFactory,
    kafka_group_id_factory: GroupIdFactory,
    tmp_path: Path,
    guarantee: str,
    limit: int,
) -> None:
    """24,000 records already in the input, each sending a 100-byte output to a topic whose
    ``max.message.bytes`` is below the producer's batch size (at least once: 64 KiB against
    the shared producer's 256 KiB; exactly once: 8 KiB against a task producer's 16 KiB):
    processed with no error (batches capped at start), every input offset output exactly
    once, the table exact."""
    total = 24_000
    source = kafka_topic_factory(PARTITIONS, prefix="backlog")
    output = kafka_topic_factory(
        PARTITIONS, prefix="small-out", config={"max.message.bytes": str(limit)}
    )
    keys = [b"k%d" % (i % 100) for i in range(total)]
    asyncio.run(produce(kafka_bootstrap, source, keys))
    group = kafka_group_id_factory("backlog")

    async def scenario() -> None:
        await until("the backlog processed", lambda: app.processed >= total, app)
        await until("committed", lambda: sum(table(app).values()) == total, app)

    with counts_sending_to(output, pad=100):
        app = make_app(kafka_bootstrap, group, source, tmp_path, processing_guarantee=guarantee)
        asyncio.run(run_app(app, scenario))
    assert app.failure is None, app.failure
    outputs = asyncio.run(_read_topic(kafka_bootstrap, output, "read_committed", PARTITIONS))
    seen = Counter(value.split(b".")[0] for value in outputs)
    assert len(seen) == total and max(seen.values()) == 1


@pytest.mark.parametrize(
    ("declared", "guarantee"),
    [(True, "at_least_once"), (False, "at_least_once"), (True, "exactly_once")],
    ids=["declared", "undeclared", "declared-eos"],
)
def test_a_record_larger_than_its_topics_limit_stops_with_one_line(
    kafka_bootstrap: str,
    kafka_topic_factory: TopicFactory,
    kafka_group_id_factory: GroupIdFactory,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    declared: bool,
    guarantee: str,
) -> None:
    """An input record whose output is 100,000 bytes, to a topic taking 64 KiB: the app
    stops once, with one ``OutputWriteError`` log line (no traceback). Declared as a sink
    topic, the record is refused before it is sent, the error naming topic, size and limit;
    not declared, the broker refuses it and the commit stops the app (at least once)."""
    source, output = big_record_topics(
        kafka_bootstrap, kafka_topic_factory, "big", [b"a", b"b", b"c"]
    )
    group = kafka_group_id_factory("big")

    async def run() -> None:
        async with asyncio.timeout(DEADLINE):
            await app.run()

    with counts_sending_to(output, big_size=100_000):
        app = make_app(
            kafka_bootstrap,
            group,
            source,
            tmp_path,
            declare=declared,
            processing_guarantee=guarantee,
        )
        with (
            caplog.at_level(logging.INFO, "streamassign.runtime"),
            pytest.raises(ProcessingError) as stopped,
        ):
            asyncio.run(run())
    failure = stopped.value.__cause__
    assert isinstance(failure, OutputWriteError), failure
    if declared:
        assert f"topic {output!r}" in str(failure) and "max.message.bytes (65536)" in str(failure)
        size = int(str(failure).split("a record of ")[1].split(" bytes")[0])
        assert 100_000 < size < 100_200
    else:
        assert "MessageSizeTooLargeError" in str(failure) and "sink_topics" in str(failure)
    # The app's own lines: aiokafka logs a transient GroupCoordinatorNotAvailableError at
    # ERROR while a just-started broker elects its group coordinator (seen running alone).
    errors = [
        r
        for r in caplog.records
        if r.levelno >= logging.ERROR and r.name.startswith("streamassign")
    ]
    assert len(errors) == 1 and errors[0].exc_info is None, errors
    assert str(failure) in errors[0].getMessage()


def test_a_large_record_that_compresses_below_the_limit_goes_through(
    kafka_bootstrap: str,
    kafka_topic_factory: TopicFactory,
    kafka_group_id_factory: GroupIdFactory,
    tmp_path: Path,
) -> None:
    """With ``compression_type="gzip"`` a 100,000-byte output (mostly one repeated byte) to
    a declared 64 KiB topic is sent: the broker applies the limit to the compressed batch,
    so the runtime does not refuse it before (it did, and stopped the app)."""
    source, output = big_record_topics(kafka_bootstrap, kafka_topic_factory, "gz", [b"a", b"b"])

    async def scenario() -> None:
        await until("committed", lambda: sum(table(app).values()) == 3, app)

    with counts_sending_to(output, big_size=100_000):
        app = make_app(
            kafka_bootstrap,
            kafka_group_id_factory("gz"),
            source,
            tmp_path,
            producer_config={"compression_type": "gzip"},
        )
        asyncio.run(run_app(app, scenario))
    assert app.failure is None, app.failure
    outputs = asyncio.run(_read_topic(kafka_bootstrap, output, "read_committed", PARTITIONS))
    assert sorted(map(len, outputs))[-1] == 100_000 and len(outputs) == 3


class FreezingCounts(Counts):
    """Counts; the record keyed ``freeze`` first freezes the broker: its write and those
    after it are never acknowledged."""

    def __init__(self, freeze: Callable[[], None]) -> None:
        self.freeze = freeze

    async def process(self, ctx: TaskContext, record: Record) -> None:
        if record.key == b"freeze":
            self.freeze()
        await super().process(ctx, record)


def aiokafka_tasks() -> list[str]:
    """The tasks of aiokafka's clients still running in this event loop."""
    names = (t.get_coro().__qualname__ for t in asyncio.all_tasks() if not t.done())
    owners = {"Sender", "MessageAccumulator", "AIOKafkaConnection", "AIOKafkaClient"}
    owners |= {"Fetcher", "GroupCoordinator", "BaseCoordinator"}
    return sorted(name for name in names if name.split(".")[0] in owners)


def frozen_broker_app(bootstrap: str, tmp: Path, processor: ProcessorFactory) -> App:
    """Commits only at rebalances and at stop; the consumers' requests to a broker that does
    not answer time out in 3 s (aiokafka's JoinGroup after a rebalance callback, which a
    consumer's stop waits for, would take 40 s)."""
    topology = Topology([Subtopology(0, ["in"], stores=["counts"])], name="frozen")
    timeouts = {"request_timeout_ms": 3000, "session_timeout_ms": 2000}
    return App(
        topology,
        {0: processor},
        bootstrap_servers=bootstrap,
        state_dir=tmp,
        store_kind="memory",
        commit_interval_ms=600_000,
        consumer_config={**timeouts, "heartbeat_interval_ms": 500},
    )


@pytest.mark.kafka
def test_stop_ends_while_a_rebalance_commit_waits_for_a_frozen_broker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The case docs/runtime.md left unbounded: a rebalance callback commits while the broker
    does not answer (frozen: aiokafka never expires the batches), and ``stop()`` waited for
    it for ever. Now the change is cancelled after ``stop_grace`` with one line, ``stop()``
    ends, leaving no aiokafka task running (its cut producer's sender, say), and once the
    broker answers again a restarted app counts every input record exactly once: what the
    callback was committing was not committed, and is read again."""
    script = kafka_script()
    try:
        broker = script.start_broker(
            data_dir=tmp_path / "kafka",
            die_with_parent=True,
            # Not fenced by its own controller (same JVM) for the freeze when it wakes: for
            # a moment its metadata would list no broker, failing the restarted app's start.
            properties={"broker.session.timeout.ms": "120000"},
        )
    except script.KafkaScriptError as exc:  # an external broker on a machine without Kafka
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no broker of its own: {exc}")
    frozen: list[bool] = []

    def freeze() -> None:
        if not frozen:
            os.kill(broker.process.pid, signal.SIGSTOP)
            frozen.append(True)

    monkeypatch.setattr(closing, "CLOSE_TIMEOUT", 1.0)  # the producer's acks never come
    app = frozen_broker_app(broker.bootstrap, tmp_path / "one", lambda: FreezingCounts(freeze))
    app.stop_grace = 1.0
    inputs = [b"k%d" % (i % 50) for i in range(1000)] + [b"freeze"]

    def rebalancing() -> bool:  # the rebalance callback of consumer 0 under way
        return 0 in app._rebalancing and app._changes > 0

    async def freeze_in_a_rebalance() -> float:
        await app.start()
        await until("the broker frozen", lambda: bool(frozen), app)
        app.host.request_rejoin(0)
        await until("a rebalance callback under way", rebalancing, app)
        started = time.monotonic()
        await asyncio.wait_for(app.stop(), 30)
        took = time.monotonic() - started
        # The cut producer stop once left its sender (and connections) running, to
        # deliver the abandoned writes whenever the broker answered again.
        deadline = time.monotonic() + 5
        while aiokafka_tasks():  # a flush the release failed ends a moment later
            assert time.monotonic() < deadline, f"left running: {aiokafka_tasks()}"
            await asyncio.sleep(0.05)
        return took

    try:
        asyncio.run(_create_topic(broker.bootstrap, "in", PARTITIONS, {}))
        asyncio.run(produce(broker.bootstrap, "in", inputs[:-1]))
        asyncio.run(produce(broker.bootstrap, "in", inputs[-1:]))  # after every other record
        with caplog.at_level(logging.WARNING, "streamassign.runtime"):
            took = asyncio.run(freeze_in_a_rebalance())
        assert "a task change (starting a rebalance) did not end within 1 s" in caplog.text
        assert took < 20, f"stop() took {took:.1f} s"
        os.kill(broker.process.pid, signal.SIGCONT)
        again = frozen_broker_app(broker.bootstrap, tmp_path / "two", Counts)
        counts: dict[bytes, int] = {}

        async def recount() -> None:
            def counted() -> bool:
                return sum(table(again).values()) >= len(inputs) and not again.restoring_tasks

            await until("every input record counted again", counted, again)
            counts.update(table(again))

        asyncio.run(run_app(again, recount))
        assert counts == Counter(inputs)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(broker.process.pid, signal.SIGCONT)  # a frozen JVM does not stop
        broker.stop()
