"""A changelog batch aiokafka's sender drained just before a stall is held or dropped with the
stall hold (``streamassign.aiokafka.sender``): the request it goes into is made on a later
step of the loop, after the resume. aiokafka's real sender and accumulator, the sender's own
routine running; the broker is a stand-in recording what each produce request carried."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.producer.message_accumulator import MessageAccumulator
from aiokafka.producer.sender import Sender
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition

from streamassign.aiokafka.accumulator import HOLD, SEND, gate_drains
from streamassign.aiokafka.sender import gate_sends

from .test_faust_stallhold import CHANGELOG, SINK, Worker, released, run

CHANGELOG_TP = TopicPartition(CHANGELOG, 0)
SINK_TP = TopicPartition(SINK, 0)


class Broker:
    """aiokafka's client as its sender uses it with acks=0: each record a request carried."""

    #: The broker's version, as aiokafka before 0.14 reads it to pick the request's version.
    api_version = (2, 1)

    def __init__(self) -> None:
        self.landed: list[tuple[str, bytes]] = []

    async def send(self, node_id: int, request: Any) -> None:
        topics = getattr(request, "_topics", None) or request.topics  # aiokafka 0.14, older
        for topic, partitions in topics:
            for _partition, buffer in partitions:
                batch = MemoryRecords(bytes(buffer)).next_batch()
                self.landed.extend((topic, record.value) for record in batch)


def _aiokafka() -> tuple[MessageAccumulator, Sender, Broker]:
    cluster = SimpleNamespace(leader_for_partition=lambda tp: 1)
    accumulator = MessageAccumulator(cluster, 16384, 0, 30)
    broker = Broker()
    older = {"linger_ms": 0} if "linger_ms" in inspect.signature(Sender).parameters else {}
    sender = Sender(
        broker,
        acks=0,
        txn_manager=None,
        message_accumulator=accumulator,
        retry_backoff_ms=100,
        request_timeout_ms=1000,
        **older,
    )
    return accumulator, sender, broker


async def _gated(worker: Worker) -> tuple[MessageAccumulator, Sender, Broker]:
    """aiokafka's producer parts as the stall hold's producer gates them, its sender running."""
    accumulator, sender, broker = _aiokafka()
    producer = SimpleNamespace(_message_accumulator=accumulator, _sender=sender)
    worker.producer._producer = producer
    worker.producer._stall_gate(producer)
    assert worker.producer._stall_gated
    worker.start()
    await sender.start()
    return accumulator, sender, broker


def _stop_after_the_next_drain(accumulator: MessageAccumulator, stop: Callable[[], None]) -> None:
    """The process stops right after the sender's next drain that takes batches, before the
    request's task runs (``stop`` moves the worker's clock on)."""
    drain = accumulator.drain_by_nodes

    def drain_then_stop(ignore_nodes: Any, muted_partitions: Any = frozenset()) -> Any:
        nodes, unknown = drain(ignore_nodes, muted_partitions)
        if nodes:
            accumulator.drain_by_nodes = drain  # type: ignore[method-assign]
            stop()
        return nodes, unknown

    accumulator.drain_by_nodes = drain_then_stop  # type: ignore[method-assign]


async def _append(accumulator: MessageAccumulator, tp: TopicPartition, value: bytes) -> Any:
    return await accumulator.add_message(tp, b"k", value, timeout=5)


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not condition():
            await asyncio.sleep(0.001)


def _idle(sender: Sender) -> bool:
    """No request in flight and no partition muted: every partition drains again."""
    return not sender._in_flight and not sender._muted_partitions


def test_a_batch_drained_just_before_a_stall_goes_back_and_out_after_the_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request made after the resume leaves the changelog's batch back at the front of the
    accumulator (the sink's goes out); a record appended meanwhile waits behind it; at the
    release both go out in order, and a later one after them."""

    async def scenario() -> list[tuple[str, bytes]]:
        worker = Worker(tmp_path, monkeypatch)
        accumulator, sender, broker = await _gated(worker)
        _stop_after_the_next_drain(accumulator, lambda: worker.stall(10.0))
        record = await _append(accumulator, CHANGELOG_TP, b"a")
        await _append(accumulator, SINK_TP, b"out")  # drained into the same request
        # The sink's batch leaves aiokafka's pending set in its future's callback, a loop turn
        # after the request ends: waited for too, or a loaded machine reads it still there.
        await _until(
            lambda: bool(broker.landed) and _idle(sender) and not accumulator._pending_batches
        )
        assert worker.producer.stall_hold.holding  # the request was the first to see the stall
        assert len(accumulator._batches[CHANGELOG_TP]) == 1
        late = asyncio.ensure_future(_append(accumulator, CHANGELOG_TP, b"b"))
        await asyncio.sleep(0.05)
        assert broker.landed == [(SINK, b"out")] and not record.done() and not late.done()
        await worker.heartbeat()
        worker.look()
        await released(worker.producer)
        await _until(lambda: late.done() and len(broker.landed) == 3 and _idle(sender))
        await _append(accumulator, CHANGELOG_TP, b"c")
        await _until(lambda: len(broker.landed) == 4)
        assert record.done()
        await sender.close()
        return broker.landed

    landed = run(scenario())
    assert landed == [(SINK, b"out"), (CHANGELOG, b"a"), (CHANGELOG, b"b"), (CHANGELOG, b"c")]


def test_a_batch_taken_back_goes_ahead_of_a_newer_one_of_its_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step queued before the request's (an agent's changelog send) appends a newer batch of
    the same partition between the drain and the request: the drained batch goes back in
    front of it, so at the release the older value lands first, not last."""

    async def scenario() -> list[tuple[str, bytes]]:
        worker = Worker(tmp_path, monkeypatch)
        accumulator, sender, broker = await _gated(worker)
        newer: list[Any] = []

        def stop_with_a_newer_send_queued() -> None:
            worker.stall(10.0)
            newer.append(asyncio.ensure_future(_append(accumulator, CHANGELOG_TP, b"b")))

        _stop_after_the_next_drain(accumulator, stop_with_a_newer_send_queued)
        await _append(accumulator, CHANGELOG_TP, b"a")
        await _until(lambda: bool(newer) and newer[0].done() and _idle(sender))
        assert worker.producer.stall_hold.holding and broker.landed == []
        assert len(accumulator._batches[CHANGELOG_TP]) == 2
        await worker.heartbeat()
        worker.look()
        await released(worker.producer)
        await _until(lambda: len(broker.landed) == 2 and _idle(sender))
        await sender.close()
        return broker.landed

    assert run(scenario()) == [(CHANGELOG, b"a"), (CHANGELOG, b"b")]


def test_a_batch_drained_just_before_a_stall_is_dropped_with_the_membership(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Handed back to the accumulator by the request, then dropped at the verdict (counted in
    its WARNING): never sent, its record's future never done; once the worker joined again a
    later record of the partition goes out."""

    async def scenario() -> tuple[list[tuple[str, bytes]], Any]:
        worker = Worker(tmp_path, monkeypatch)
        accumulator, sender, broker = await _gated(worker)
        _stop_after_the_next_drain(accumulator, lambda: worker.stall(10.0))
        record = await _append(accumulator, CHANGELOG_TP, b"stale")
        hold = worker.producer.stall_hold
        await _until(lambda: hold.holding and CHANGELOG_TP in accumulator._batches)
        assert _idle(sender) and accumulator._batches[CHANGELOG_TP][0].retry_count == 1
        worker.coordinator.member_id = ""  # aiokafka's reset: the membership is lost
        worker.look()
        assert CHANGELOG_TP not in accumulator._batches
        await asyncio.wait_for(accumulator.flush(), 1)  # a flush does not wait on it
        worker.coordinator.member_id = "m-2"
        worker.look()
        await _append(accumulator, CHANGELOG_TP, b"new")
        await _until(lambda: bool(broker.landed))
        await sender.close()
        return broker.landed, record

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        landed, record = run(scenario())
    assert landed == [(CHANGELOG, b"new")]
    assert not record.done()
    assert "and 1 batch(es) aiokafka held from before it" in caplog.text


def test_a_batch_drained_before_the_membership_was_found_lost_is_dropped_by_its_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The loss is known when the request is made (the tick resolved the hold first): the
    request drops the batch itself; nothing deadlocks after it."""

    async def scenario() -> tuple[list[tuple[str, bytes]], Any]:
        worker = Worker(tmp_path, monkeypatch)
        accumulator, sender, broker = await _gated(worker)

        def stall_and_lose() -> None:
            worker.stall(10.0)
            worker.coordinator.member_id = ""
            worker.look()

        _stop_after_the_next_drain(accumulator, stall_and_lose)
        record = await _append(accumulator, CHANGELOG_TP, b"stale")
        await _append(accumulator, SINK_TP, b"out")
        # The accumulator forgets a batch in callbacks after the request: waited for, too
        # (under load the check came between, with 2 batches still pending).
        await _until(
            lambda: (
                bool(broker.landed)
                and _idle(sender)
                and not accumulator._batches
                and not accumulator._pending_batches
            )
        )
        await asyncio.wait_for(accumulator.flush(), 1)
        worker.coordinator.member_id = "m-2"
        worker.look()
        await _append(accumulator, CHANGELOG_TP, b"new")
        await _until(lambda: len(broker.landed) == 2)
        await sender.close()
        return broker.landed, record

    with caplog.at_level(logging.WARNING, logger="streamassign.aiokafka"):
        landed, record = run(scenario())
    assert landed == [(SINK, b"out"), (CHANGELOG, b"new")]
    assert not record.done()
    assert (
        "dropped 1 changelog batch(es) aiokafka had drained before a stall into a request not "
        "yet made (the membership was lost)" in caplog.text
    )


def test_a_pause_under_the_threshold_sends_the_drained_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> list[tuple[str, bytes]]:
        worker = Worker(tmp_path, monkeypatch)
        accumulator, sender, broker = await _gated(worker)
        _stop_after_the_next_drain(accumulator, lambda: worker.stall(1.0))
        record = await _append(accumulator, CHANGELOG_TP, b"a")
        await _until(lambda: record.done() and _idle(sender))
        assert not worker.producer.stall_hold.holding
        await sender.close()
        return broker.landed

    assert run(scenario()) == [(CHANGELOG, b"a")]


def test_the_installed_aiokafka_producer_s_sender_is_gated_unless_idempotent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An idempotent producer's drained batch has sequence numbers: dropping it would make the
    broker refuse the partition's later batches, so its sender is left alone."""

    async def scenario() -> tuple[bool, bool]:
        plain = AIOKafkaProducer(bootstrap_servers="localhost:1")
        idempotent = AIOKafkaProducer(bootstrap_servers="localhost:1", enable_idempotence=True)
        return (
            gate_sends(plain._sender, lambda: SEND, _is_changelog),
            gate_sends(idempotent._sender, lambda: SEND, _is_changelog),
        )

    with caplog.at_level(logging.WARNING, logger="streamassign.aiokafka"):
        assert run(scenario()) == (True, False)
    assert "aiokafka's producer is idempotent" in caplog.text


def test_a_sender_of_another_shape_is_left_alone(caplog: pytest.LogCaptureFixture) -> None:
    async def send(node_id: int) -> None:
        return None

    other = SimpleNamespace(_send_produce_req=send, _txn_manager=None)
    with caplog.at_level(logging.WARNING, logger="streamassign.aiokafka"):
        assert not gate_sends(other, lambda: HOLD, _is_changelog)
    assert "sender has an unknown shape" in caplog.text
    assert other._send_produce_req is send


def test_a_rule_that_raises_lets_the_request_go(caplog: pytest.LogCaptureFixture) -> None:
    """The rule runs in the request's task, whose raise would end aiokafka's sender routine and
    fail every batch: a failing rule sends as aiokafka would, logged."""
    rule_raises = [False]

    def rule() -> str:
        if rule_raises[0]:
            raise RuntimeError("a bug")
        return SEND

    async def scenario() -> list[tuple[str, bytes]]:
        accumulator, sender, broker = _aiokafka()
        assert gate_drains(accumulator, rule, _is_changelog)
        assert gate_sends(sender, rule, _is_changelog)
        await sender.start()
        _stop_after_the_next_drain(accumulator, lambda: rule_raises.__setitem__(0, True))
        record = await _append(accumulator, CHANGELOG_TP, b"a")
        await _until(record.done)
        await sender.close()
        return broker.landed

    assert run(scenario()) == [(CHANGELOG, b"a")]
    assert "deciding what may leave aiokafka's sender failed; sending" in caplog.text


def _is_changelog(tp: Any) -> bool:
    return bool(tp.topic == CHANGELOG)
