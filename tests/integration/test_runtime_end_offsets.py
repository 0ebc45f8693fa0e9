"""The high-availability end offsets on a real broker, exactly once (``committed=True``).

A changelog written transactionally ends with a transaction marker, and may end with an
aborted transaction; neither is in any store's position. The cache must report, for each
changelog partition, the position a caught-up copy has (one past the last committed commit
marker), so that such a copy's lag is 0: before, an aborted tail of 16 offsets or more made
it report the last stable offset, and an idle partition's copy never looked caught up.
"""

from __future__ import annotations

import asyncio
import uuid

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTopicPartition

from streamassign import TaskId, TopicPartition
from streamassign.runtime.changelog import COMMIT_KEY, StoreState, encode_marker
from streamassign.runtime.end_offsets import COMMITTED_TAIL, EndOffsetsCache
from streamassign.runtime.stores import MemoryStore

from .conftest import TopicFactory

PARTITIONS = 3
COMPACTED = {"cleanup.policy": "compact"}


async def commit(producer: AIOKafkaProducer, topic: str, partition: int, keys: int) -> None:
    """One committed transaction as an exactly-once commit writes it: data, then a marker."""
    await producer.begin_transaction()
    for k in range(keys):
        await producer.send(topic, b"%d" % k, key=b"k%d" % k, partition=partition)
    await producer.send(topic, encode_marker({"in": keys}), key=COMMIT_KEY, partition=partition)
    await producer.commit_transaction()


async def abort(producer: AIOKafkaProducer, topic: str, partition: int, records: int) -> None:
    """An aborted transaction (a crashed or fenced writer's) of ``records`` offsets and a
    marker of its own at the end."""
    await producer.begin_transaction()
    for k in range(records - 1):
        await producer.send(topic, b"x", key=b"k%d" % k, partition=partition)
    await producer.send(topic, encode_marker({"in": 10**6}), key=COMMIT_KEY, partition=partition)
    await producer.abort_transaction()


async def caught_up(bootstrap: str, topic: str) -> tuple[dict[int, int], dict[int, int]]:
    """The store position of a copy restored to the end of each partition (what a caught-up
    standby reports), and each partition's last stable offset."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False
    )
    await consumer.start()
    try:
        tps = [KafkaTopicPartition(topic, p) for p in range(PARTITIONS)]
        stable = await consumer.end_offsets(tps)
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        states = {
            tp: StoreState("s", TopicPartition(topic, tp.partition), MemoryStore()) for tp in tps
        }
        deadline = asyncio.get_running_loop().time() + 30
        while any([await consumer.position(tp) < stable[tp] for tp in tps]):
            assert asyncio.get_running_loop().time() < deadline, "changelog not read in 30 s"
            for tp, records in (await consumer.getmany(timeout_ms=200)).items():
                for r in records:
                    if r.offset < stable[tp]:
                        states[tp].restore(r.offset, r.key, r.value)
        return (
            {tp.partition: states[tp].position for tp in tps},
            {tp.partition: stable[tp] for tp in tps},
        )
    finally:
        await consumer.stop()


async def scenario(bootstrap: str, topic: str) -> None:
    tasks = {TaskId(0, p): (TopicPartition(topic, p),) for p in range(PARTITIONS)}
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=f"end-offsets-{uuid.uuid4().hex[:8]}"
    )
    await producer.start()
    cache = EndOffsetsCache(committed=True, interval=600)  # refreshed by hand below
    try:
        for p in range(PARTITIONS):
            await commit(producer, topic, p, keys=5)
        await abort(producer, topic, 0, records=4 * COMMITTED_TAIL + 37)  # several windows
        await abort(producer, topic, 1, records=COMMITTED_TAIL + 1)  # just past the old tail
        cache.track(tasks)
        await cache.start(bootstrap)  # reads once
        positions, stable = await caught_up(bootstrap, topic)
        assert stable[0] - positions[0] > COMMITTED_TAIL  # the old fallback's case
        assert stable[1] - positions[1] > COMMITTED_TAIL
        assert stable[2] - positions[2] == 1  # a transaction marker only
        lags = {t: end - positions[t.partition] for t, end in cache().items()}
        assert lags == dict.fromkeys(tasks, 0)

        # Idle, read again: the same; and the reader fetches nothing in between.
        assert await cache.refresh()
        assert {t: end - positions[t.partition] for t, end in cache().items()} == lags
        assert cache._consumer is not None and not cache._consumer.assignment()

        # More writes: a commit after the aborted tail, a new aborted tail on a committed one.
        await commit(producer, topic, 0, keys=3)
        await abort(producer, topic, 2, records=2 * COMMITTED_TAIL)
        await abort(producer, topic, 1, records=3)
        assert await cache.refresh()
        positions, stable = await caught_up(bootstrap, topic)
        assert stable[2] - positions[2] > COMMITTED_TAIL
        assert {t: end - positions[t.partition] for t, end in cache().items()} == lags
    finally:
        await cache.stop()
        await producer.stop()


def test_a_caught_up_copy_has_lag_0_whatever_aborted_tail_its_changelog_has(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(PARTITIONS, prefix="endoffsets-changelog", config=COMPACTED)
    asyncio.run(scenario(kafka_bootstrap, topic))
