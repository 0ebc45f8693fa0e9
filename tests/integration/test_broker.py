"""Smoke tests proving the assembled Kafka 4 broker works with aiokafka.

They cover what the rest of the integration suite relies on: topic administration,
produce/fetch across partitions, and classic consumer-group coordination (join/sync with a
client-side assignor, offset commit/fetch).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

pytestmark = pytest.mark.kafka

PARTITIONS = 6
RECORDS = 1000
TEST_TIMEOUT = 90.0


async def _produce(
    bootstrap: str, topic: str, count: int, *, partitions: int | None = None
) -> dict[int, list[int]]:
    """Produce values 0..count-1 and return them in offset order per partition.

    Records are keyed (default partitioner) unless ``partitions`` is given, in which case
    record ``i`` goes explicitly to partition ``i % partitions``.
    """
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        pending = [
            await producer.send(
                topic,
                value=str(i).encode(),
                key=f"key-{i}".encode(),
                partition=None if partitions is None else i % partitions,
            )
            for i in range(count)
        ]
        metadata = await asyncio.gather(*pending)
    finally:
        await producer.stop()
    by_partition: dict[int, list[tuple[int, int]]] = {}
    for value, meta in enumerate(metadata):
        by_partition.setdefault(meta.partition, []).append((meta.offset, value))
    return {p: [v for _, v in sorted(pairs)] for p, pairs in by_partition.items()}


async def _consume_all(bootstrap: str, topic: str, expected: int) -> dict[int, list[int]]:
    """Read ``expected`` records from every partition of ``topic`` (no consumer group)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        await consumer.seek_to_beginning()
        seen: dict[int, list[int]] = {}
        count = 0
        while count < expected:
            batches = await consumer.getmany(timeout_ms=1000, max_records=500)
            for tp, records in batches.items():
                for record in records:
                    assert record.offset == len(seen.get(tp.partition, [])), "offset gap"
                    assert record.value is not None
                    seen.setdefault(tp.partition, []).append(int(record.value))
                    count += 1
        return seen
    finally:
        await consumer.stop()


def test_produce_and_consume_1000_records(
    kafka_bootstrap: str, kafka_topic_factory: Callable[..., str]
) -> None:
    topic = kafka_topic_factory(PARTITIONS)

    async def scenario() -> tuple[dict[int, list[int]], dict[int, list[int]]]:
        produced = await _produce(kafka_bootstrap, topic, RECORDS)
        consumed = await _consume_all(kafka_bootstrap, topic, RECORDS)
        return produced, consumed

    produced, consumed = asyncio.run(asyncio.wait_for(scenario(), TEST_TIMEOUT))

    assert set(produced) == set(range(PARTITIONS)), "keys should spread over all partitions"
    assert consumed == produced  # same records, same partitions, same order
    assert sorted(v for values in consumed.values() for v in values) == list(range(RECORDS))


async def _wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.1)


async def _two_member_group(
    bootstrap: str, topic: str, group_id: str
) -> tuple[list[set[int]], list[set[int]], list[dict[int, int]]]:
    """Run two round-robin consumers in one group; return assignments, received, committed."""
    consumers = [
        AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group_id,
            client_id=f"{group_id}-member-{i}",
            partition_assignment_strategy=(RoundRobinPartitionAssignor,),
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            heartbeat_interval_ms=300,  # rejoin quickly when the second member arrives
        )
        for i in range(2)
    ]
    try:
        await asyncio.gather(*(c.start() for c in consumers))

        def partitions_of(c: AIOKafkaConsumer) -> set[int]:
            return {tp.partition for tp in c.assignment()}

        def balanced() -> bool:
            first, second = (partitions_of(c) for c in consumers)
            return len(first) == len(second) == 3 and first | second == set(range(PARTITIONS))

        await _wait_until(balanced, 60, "both members to own 3 partitions each")
        assignments = [partitions_of(c) for c in consumers]

        # Four records per partition: each member must fetch exactly its own partitions' data.
        await _produce(bootstrap, topic, PARTITIONS * 4, partitions=PARTITIONS)
        received: list[set[int]] = [set(), set()]
        counts = [0, 0]

        async def drain(i: int) -> None:
            while counts[i] < 4 * len(assignments[i]):
                batches = await consumers[i].getmany(timeout_ms=500)
                for tp, records in batches.items():
                    received[i].add(tp.partition)
                    counts[i] += len(records)

        await asyncio.gather(drain(0), drain(1))
        await asyncio.gather(*(c.commit() for c in consumers))
        committed: list[dict[int, int]] = []
        for c in consumers:
            offsets = {tp.partition: await c.committed(tp) for tp in c.assignment()}
            committed.append({p: o for p, o in offsets.items() if o is not None})
        return assignments, received, committed
    finally:
        await asyncio.gather(*(c.stop() for c in consumers), return_exceptions=True)


def test_consumer_group_round_robin_splits_partitions_3_3(
    kafka_bootstrap: str,
    kafka_topic_factory: Callable[..., str],
    kafka_group_id_factory: Callable[..., str],
) -> None:
    topic = kafka_topic_factory(PARTITIONS)
    group_id = kafka_group_id_factory()

    assignments, received, committed = asyncio.run(
        asyncio.wait_for(_two_member_group(kafka_bootstrap, topic, group_id), TEST_TIMEOUT)
    )

    first, second = assignments
    assert len(first) == len(second) == 3
    assert first.isdisjoint(second)
    assert first | second == set(range(PARTITIONS))
    assert received == assignments, "each member fetches exactly its assigned partitions"
    assert committed == [dict.fromkeys(a, 4) for a in assignments], "offset commit/fetch"


def test_cluster_ids_never_look_like_an_option() -> None:
    """``kafka-storage format -t <id>`` reads an id starting with ``-`` as an option and the
    broker never starts (1 start in 64 before this was fixed)."""
    from tests.integration.conftest import kafka_script

    ids = [kafka_script()._random_cluster_id() for _ in range(2000)]
    assert not [i for i in ids if i.startswith("-")]
    assert len(set(ids)) == len(ids) and all(len(i) == 22 for i in ids)
