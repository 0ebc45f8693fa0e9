"""The runtime's Kafka clients on a real broker, one ``App`` in the test's process.

Checked: an at-least-once application reads its input ``read_committed`` (an upstream
transactional producer's aborted records are never counted); a backlog written to an output
topic whose ``max.message.bytes`` is below the shared producer's batch size goes through
(batches capped at start), and a record larger than that limit stops the application with
one ``OutputWriteError`` naming topic, size and limit.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTopicPartition

from streamassign import Subtopology, Topology
from streamassign.runtime import App, Record, TaskContext

from .conftest import GroupIdFactory, TopicFactory

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


def make_app(bootstrap: str, group: str, source: str, tmp: Path, **options: Any) -> App:
    topology = Topology([Subtopology(0, [source], stores=["counts"])], name=group)
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


async def read_topic(bootstrap: str, topic: str) -> list[Any]:
    """Every record of ``topic`` up to its end, ``read_committed``."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", isolation_level="read_committed"
    )
    await consumer.start()
    try:
        tps = [KafkaTopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        out: list[Any] = []
        todo = {tp for tp in tps if ends[tp] > 0}
        while todo:
            for records in (await consumer.getmany(*todo, timeout_ms=500)).values():
                out.extend(records)
            todo = {tp for tp in todo if await consumer.position(tp) < ends[tp]}
        return out
    finally:
        await consumer.stop()


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
