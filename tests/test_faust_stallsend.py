"""Changelog records handed to aiokafka before a stall stay in its accumulator while the stall
hold is on (``streamassign.aiokafka.accumulator``): aiokafka's real accumulator, drained as its
sender drains it, with the stall hold's producer deciding each drain (no broker)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.producer.message_accumulator import MessageAccumulator
from aiokafka.structs import TopicPartition

from streamassign.aiokafka.accumulator import DROP, HOLD, SEND, drop_gated, gate_drains

from .test_faust_stallhold import CHANGELOG, SINK, Worker, released, run

CHANGELOG_TP = TopicPartition(CHANGELOG, 0)
SINK_TP = TopicPartition(SINK, 0)


def _accumulator() -> MessageAccumulator:
    cluster = SimpleNamespace(leader_for_partition=lambda tp: 1)
    return MessageAccumulator(cluster, 16384, 0, 30)


def _drained(accumulator: MessageAccumulator) -> set[TopicPartition]:
    """What aiokafka's sender would send now; sent at once (delivered without offsets)."""
    nodes, _unknown = accumulator.drain_by_nodes(ignore_nodes=set(), muted_partitions=set())
    for batches in nodes.values():
        for batch in batches.values():
            batch.done_noack()
    return {tp for batches in nodes.values() for tp in batches}


async def _append(accumulator: MessageAccumulator, tp: TopicPartition) -> asyncio.Future[Any]:
    record: asyncio.Future[Any] = await accumulator.add_message(tp, b"k", b"v", timeout=1)
    return record


def _is_changelog(tp: Any) -> bool:
    return bool(tp.topic == CHANGELOG)


def test_a_held_drain_keeps_changelog_batches_and_a_dropped_one_removes_them() -> None:
    async def scenario() -> None:
        accumulator = _accumulator()
        decided = [HOLD]
        assert gate_drains(accumulator, lambda: decided[0], _is_changelog)
        await _append(accumulator, CHANGELOG_TP)
        await _append(accumulator, SINK_TP)
        assert _drained(accumulator) == {SINK_TP}  # the sink is never held
        assert _drained(accumulator) == set()
        decided[0] = SEND
        assert _drained(accumulator) == {CHANGELOG_TP}
        record = await _append(accumulator, CHANGELOG_TP)
        batch = accumulator._batches[CHANGELOG_TP][0]
        decided[0] = DROP
        assert _drained(accumulator) == set()
        assert CHANGELOG_TP not in accumulator._batches
        assert batch.future.done() and not record.done()  # a flush returns; nothing written
        await asyncio.wait_for(accumulator.flush(), 1)
        assert drop_gated(accumulator, _is_changelog) == 0

    run(scenario())


def test_an_accumulator_of_another_shape_is_left_alone(caplog: pytest.LogCaptureFixture) -> None:
    other = SimpleNamespace(drain_by_nodes=lambda nodes: None)
    with caplog.at_level(logging.WARNING, "streamassign.aiokafka"):
        assert not gate_drains(other, lambda: HOLD, _is_changelog)
    assert "unknown shape" in caplog.text
    assert other.drain_by_nodes(1) is None


def _gated(worker: Worker) -> MessageAccumulator:
    accumulator = _accumulator()
    worker.producer._producer = SimpleNamespace(_message_accumulator=accumulator)
    worker.producer._stall_gated = gate_drains(
        accumulator, worker.producer._stall_drain_rule, worker.producer._is_changelog
    )
    return accumulator


def test_a_record_aiokafka_held_before_a_stall_waits_for_the_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        worker = Worker(tmp_path, monkeypatch)
        accumulator = _gated(worker)
        worker.start()
        await _append(accumulator, CHANGELOG_TP)  # handed to aiokafka before the stall
        worker.stall(10.0)
        assert _drained(accumulator) == set()  # the drain is the first to see the stall
        assert worker.producer.stall_hold.holding
        await worker.heartbeat()
        worker.look()
        await released(worker.producer)
        assert _drained(accumulator) == {CHANGELOG_TP}

    run(scenario())


def test_a_record_aiokafka_held_before_a_stall_is_dropped_with_the_membership(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        worker = Worker(tmp_path, monkeypatch)
        accumulator = _gated(worker)
        worker.start()
        record = await _append(accumulator, CHANGELOG_TP)
        await _append(accumulator, SINK_TP)
        worker.stall(10.0)
        assert _drained(accumulator) == {SINK_TP}
        worker.coordinator.member_id = ""  # aiokafka's reset: the membership is lost
        worker.look()
        assert CHANGELOG_TP not in accumulator._batches  # at the verdict, not the next drain
        late = await _append(accumulator, CHANGELOG_TP)  # a send already inside aiokafka
        assert _drained(accumulator) == set()
        assert not record.done() and not late.done()
        await asyncio.wait_for(accumulator.flush(), 1)

    run(scenario())


def test_the_installed_aiokafka_producer_s_accumulator_is_gated() -> None:
    async def scenario() -> None:
        producer = AIOKafkaProducer(bootstrap_servers="localhost:1")
        assert gate_drains(producer._message_accumulator, lambda: SEND, _is_changelog)

    run(scenario())


def test_a_send_waiting_for_room_in_a_dropped_batch_is_let_go() -> None:
    """Left waiting on the dropped batch it would block Faust's producer buffer until
    aiokafka's timeout (20 min in Faust), every later changelog write queued behind it."""

    async def scenario() -> None:
        cluster = SimpleNamespace(leader_for_partition=lambda tp: 1)
        accumulator = MessageAccumulator(cluster, 200, 0, 30)  # a batch of a few records
        decided = [HOLD]
        assert gate_drains(accumulator, lambda: decided[0], _is_changelog)
        while True:  # fill the batch until a send waits for room
            send = asyncio.ensure_future(
                accumulator.add_message(CHANGELOG_TP, b"k", b"v" * 40, timeout=30)
            )
            for _ in range(3):
                await asyncio.sleep(0)
            if not send.done():
                break
        assert _drained(accumulator) == set()  # held
        decided[0] = DROP
        assert drop_gated(accumulator, _is_changelog) == 1
        async with asyncio.timeout(5):
            record = await send  # appended to a new batch at once
        assert not record.done()
        assert _drained(accumulator) == set()  # dropped in turn: the membership is lost

    asyncio.run(scenario())


def test_a_batch_aiokafka_put_back_for_a_retry_drops_cleanly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A batch re-enqueued after a produce error has left aiokafka's pending set while its
    first drain's callback will still remove it: no KeyError from that callback."""

    async def scenario() -> None:
        accumulator = _accumulator()
        decided = [SEND]
        assert gate_drains(accumulator, lambda: decided[0], _is_changelog)
        await _append(accumulator, CHANGELOG_TP)
        nodes, _ = accumulator.drain_by_nodes(ignore_nodes=set(), muted_partitions=set())
        accumulator.reenqueue(nodes[1][CHANGELOG_TP])  # as the sender after an error
        decided[0] = DROP
        assert drop_gated(accumulator, _is_changelog) == 1
        for _ in range(3):
            await asyncio.sleep(0)
        assert not accumulator._pending_batches

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(scenario())
    assert "KeyError" not in caplog.text


def test_a_rule_that_raises_lets_the_batches_go(caplog: pytest.LogCaptureFixture) -> None:
    """The rule runs in aiokafka's sender task, where a raise fails every batch of the
    producer: a failing rule sends as aiokafka would, logged."""

    def broken() -> str:
        raise RuntimeError("a bug")

    async def scenario() -> None:
        accumulator = _accumulator()
        assert gate_drains(accumulator, broken, _is_changelog)
        await _append(accumulator, CHANGELOG_TP)
        assert _drained(accumulator) == {CHANGELOG_TP}

    asyncio.run(scenario())
    assert "deciding what may leave aiokafka's accumulator failed; sending" in caplog.text
