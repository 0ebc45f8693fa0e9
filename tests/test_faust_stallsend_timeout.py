"""A changelog send waiting in aiokafka for room in a batch the stall hold keeps back: aiokafka
gives up after Faust's ``producer_request_timeout`` (20 min) with KafkaTimeoutError, which
Faust's producer buffer does not catch (the worker crashed in a 21-minute network cut). During
a hold the send joins the held sends instead; outside one the error is Faust's, as before.
aiokafka's real accumulator, with Faust's send reduced to what it does around it (no broker)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import KafkaError, KafkaTimeoutError, NotLeaderForPartitionError
from aiokafka.producer.message_accumulator import MessageAccumulator
from aiokafka.structs import TopicPartition
from faust.exceptions import ProducerSendError
from faust.transport.drivers import aiokafka as faust_aiokafka

from streamassign.aiokafka.accumulator import gate_drains
from streamassign.faust import _stallhold
from streamassign.faust._stallhold import HeldSend, StallHold

from .test_faust_stallhold import CHANGELOG, Worker, released, run
from .test_faust_stallsend import _drained

CHANGELOG_TP = TopicPartition(CHANGELOG, 0)
#: aiokafka's wait for room, as Faust's ``producer_request_timeout`` sets it (1200 s there).
ROOM_TIMEOUT = 0.02
#: A value of which a few fill a batch of BATCH_BYTES.
VALUE = b"v" * 40
BATCH_BYTES = 200


def _through_aiokafka(
    worker: Worker, monkeypatch: pytest.MonkeyPatch, *, gated: bool = True
) -> MessageAccumulator:
    """Faust's send into aiokafka's real accumulator, gated by the worker's hold (unless not
    ``gated``: an aiokafka of another shape): aiokafka's ``add_message`` with the request
    timeout, its errors wrapped as Faust wraps them."""
    cluster = SimpleNamespace(leader_for_partition=lambda tp: 1)
    accumulator = MessageAccumulator(cluster, BATCH_BYTES, 0, 30)
    producer = worker.producer
    producer._producer = SimpleNamespace(_message_accumulator=accumulator)
    if gated:
        producer._stall_gated = gate_drains(
            accumulator, producer._stall_drain_rule, producer._is_changelog
        )

    async def faust_send(_self: Any, topic: str, key: Any, value: Any, *_: Any, **__: Any) -> Any:
        try:
            return await accumulator.add_message(CHANGELOG_TP, key, value, ROOM_TIMEOUT)
        except KafkaError as exc:
            raise ProducerSendError(f"Error while sending: {exc!r}") from exc

    monkeypatch.setattr(faust_aiokafka.Producer, "send", faust_send)
    return accumulator


async def _waiting_for_room(worker: Worker) -> asyncio.Future[Any]:
    """Fill the changelog partition's batch until a send waits for room (no drain: cut off)."""
    while True:
        send = asyncio.ensure_future(worker.send(CHANGELOG, VALUE))
        for _ in range(3):
            await asyncio.sleep(0)
        if not send.done():
            return send


def test_a_send_that_times_out_waiting_during_a_hold_is_held_and_released_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """It was made before the sends held meanwhile: it goes out ahead of them."""
    worker = Worker(tmp_path, monkeypatch)

    added: list[bytes] = []

    async def scenario() -> list[Any]:
        accumulator = _through_aiokafka(worker, monkeypatch)
        worker.start()
        waiting = await _waiting_for_room(worker)
        add_message = accumulator.add_message

        async def recording(*args: Any) -> Any:  # what aiokafka took in, in order
            taken = await add_message(*args)
            added.append(args[2])
            return taken

        accumulator.add_message = recording  # type: ignore[method-assign]
        worker.stall(10.0)  # the hold begins: the full batch stays in
        later = await worker.send(CHANGELOG, b"later")
        assert _drained(accumulator) == set()
        early = await asyncio.wait_for(waiting, 1.0)  # aiokafka gave up; no raise
        hold = worker.producer.stall_hold
        assert [held.result for held in hold.held] == [early, later]
        await worker.heartbeat()
        worker.look()  # the membership proven: released
        while hold.holding:
            _drained(accumulator)  # as aiokafka's sender drains, the full batch first
            await asyncio.sleep(0)
        _drained(accumulator)
        await asyncio.sleep(0)
        return [early, later]

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        results = run(scenario())
    assert all(result.done() and result.exception() is None for result in results)
    assert added == [VALUE, b"later"]  # the send that waited reached aiokafka first
    assert "waited" in caplog.text and "it is held with the rest" in caplog.text
    assert "released 2 held changelog send(s)" in caplog.text


def test_a_send_that_times_out_after_the_membership_is_lost_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = Worker(tmp_path, monkeypatch)

    async def scenario() -> asyncio.Future[Any]:
        # Ungated, the lost membership's drop leaves the full batch, and the send waiting.
        _through_aiokafka(worker, monkeypatch, gated=False)
        worker.start()
        waiting = await _waiting_for_room(worker)
        worker.coordinator.member_id = ""  # aiokafka's reset: lost
        worker.look()
        result: asyncio.Future[Any] = await asyncio.wait_for(waiting, 1.0)
        return result

    assert not run(scenario()).done()  # dropped: never reported written
    assert worker.producer.stall_hold.dropped_since_lost == 1


def test_a_send_that_times_out_outside_a_hold_fails_as_in_faust(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No hold (a partition leader away, the coordinator reachable): Faust's error, as before."""
    worker = Worker(tmp_path, monkeypatch)

    async def scenario() -> None:
        _through_aiokafka(worker, monkeypatch)
        worker.start()
        waiting = await _waiting_for_room(worker)
        with pytest.raises(ProducerSendError) as raised:
            await asyncio.wait_for(waiting, 1.0)
        assert isinstance(raised.value.__cause__, KafkaTimeoutError)
        assert not worker.producer.stall_hold.holding

    run(scenario())


def test_another_send_error_during_a_hold_is_faust_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = Worker(tmp_path, monkeypatch)

    async def scenario() -> None:
        answer = asyncio.get_running_loop().create_future()

        async def failing(*_: Any, **__: Any) -> Any:
            await answer
            raise ProducerSendError("Error while sending") from NotLeaderForPartitionError()

        monkeypatch.setattr(faust_aiokafka.Producer, "send", failing)
        worker.start()
        waiting = asyncio.ensure_future(worker.send(CHANGELOG, b"v"))
        await asyncio.sleep(0)
        worker.stall(10.0)
        worker.look()
        assert worker.producer.stall_hold.holding
        answer.set_result(None)
        with pytest.raises(ProducerSendError):
            await waiting
        assert not worker.producer.stall_hold.held

    run(scenario())


def test_a_late_send_joins_ahead_of_the_sends_made_after_it() -> None:
    hold = StallHold(threshold=4.9, silence_threshold=4.9, deadline=7.0)

    def made(at: float) -> HeldSend:
        return HeldSend(send=None, result=None, began=at)  # type: ignore[arg-type]

    for at in (20.0, 21.0):
        hold.held.append(made(at))
    for at in (10.0, 12.0, 30.0):
        hold.hold_late(made(at))
    assert [held.began for held in hold.held] == [10.0, 12.0, 20.0, 21.0, 30.0]


#: Faust's own send (the ``Worker`` puts a recording stand-in in its place).
FAUST_SEND = faust_aiokafka.Producer.send


class GivesUpAfterRelease:
    """aiokafka's producer under Faust's real send: the first send of ``waits`` waits for
    room until ``give_up`` ends it with aiokafka's timeout; what it took in, in order."""

    def __init__(self, waits: bytes) -> None:
        self.waits = waits
        self.give_up: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.taken: list[bytes] = []
        self.gave_up = False

    async def send(self, topic: str, value: bytes, **_: Any) -> asyncio.Future[Any]:
        if value == self.waits and not self.gave_up:
            await self.give_up
            self.gave_up = True
            raise KafkaTimeoutError()
        self.taken.append(value)
        done = asyncio.get_running_loop().create_future()
        done.set_result(SimpleNamespace(topic=topic, offset=len(self.taken) - 1))
        return done


def _faust_sends_to(worker: Worker, monkeypatch: pytest.MonkeyPatch, aiokafka: Any) -> list[Any]:
    """Faust's real send into ``aiokafka``; the ``on_produce_message`` signals it sends."""
    monkeypatch.setattr(faust_aiokafka.Producer, "send", FAUST_SEND)
    worker.producer._producer = aiokafka
    signalled: list[Any] = []

    def on_produce_message(sender: Any, **message: Any) -> None:
        signalled.append(message["value"])

    worker.app.on_produce_message.connect(on_produce_message)
    return signalled


async def _held_then_released(worker: Worker, *, later: bytes | None) -> asyncio.Future[Any]:
    """A send waits for room, a hold begins (``later`` sent and held meanwhile), and the
    membership is proven: the release ends. The send, still waiting."""
    worker.start()
    waiting = asyncio.ensure_future(worker.send(CHANGELOG, b"early"))
    for _ in range(3):
        await asyncio.sleep(0)
    worker.stall(10.0)
    worker.look()  # the hold begins: the full batch stays in
    if later is not None:
        await worker.send(CHANGELOG, later)
    assert await worker.heartbeat()
    worker.look()
    await asyncio.wait_for(released(worker.producer), 1.0)
    assert not waiting.done()
    return waiting


def test_a_send_timing_out_as_a_release_ends_is_sent_again_once_signalled_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """aiokafka's wait ends by its timeout just after the hold let the batch go: the send was
    never added, nothing of its partition went out after it (Faust's buffer awaits it), so
    it goes out again instead of crashing Faust's buffer; Faust's ``on_produce_message``
    is told of it once."""
    worker = Worker(tmp_path, monkeypatch)

    async def scenario() -> tuple[GivesUpAfterRelease, list[Any], Any]:
        aiokafka = GivesUpAfterRelease(b"early")
        signalled = _faust_sends_to(worker, monkeypatch, aiokafka)
        waiting = await _held_then_released(worker, later=None)
        aiokafka.give_up.set_result(None)
        sent = await asyncio.wait_for(waiting, 1.0)
        return aiokafka, signalled, await sent

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        aiokafka, signalled, written = run(scenario())
    assert aiokafka.taken == [b"early"] and written.offset == 0
    assert signalled == [b"early"]
    assert "kept back until" in caplog.text and "sent again" in caplog.text


def test_a_send_timing_out_after_a_later_one_went_out_is_faust_s_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A send made after it (outside Faust's buffer) was released to aiokafka first: sent
    again, the waiting one would land behind it, a key's stale value last. Faust's error."""
    worker = Worker(tmp_path, monkeypatch)

    async def scenario() -> list[bytes]:
        aiokafka = GivesUpAfterRelease(b"early")
        _faust_sends_to(worker, monkeypatch, aiokafka)
        waiting = await _held_then_released(worker, later=b"later")
        aiokafka.give_up.set_result(None)
        with pytest.raises(ProducerSendError) as raised:
            await asyncio.wait_for(waiting, 1.0)
        assert isinstance(raised.value.__cause__, KafkaTimeoutError)
        return aiokafka.taken

    assert run(scenario()) == [b"later"]


def test_a_send_held_after_it_timed_out_is_signalled_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Timed out during the hold, then released: Faust's send runs twice for it, its
    ``on_produce_message`` once; a send held from the start is signalled at its release."""
    worker = Worker(tmp_path, monkeypatch)

    async def scenario() -> tuple[list[bytes], list[Any]]:
        aiokafka = GivesUpAfterRelease(b"early")
        signalled = _faust_sends_to(worker, monkeypatch, aiokafka)
        worker.start()
        waiting = asyncio.ensure_future(worker.send(CHANGELOG, b"early"))
        for _ in range(3):
            await asyncio.sleep(0)
        worker.stall(10.0)
        later = await worker.send(CHANGELOG, b"later")
        aiokafka.give_up.set_result(None)
        early = await asyncio.wait_for(waiting, 1.0)  # held
        assert await worker.heartbeat()
        worker.look()
        await asyncio.wait_for(asyncio.gather(early, later), 1.0)
        return aiokafka.taken, signalled

    taken, signalled = run(scenario())
    assert taken == [b"early", b"later"]
    assert sorted(signalled) == [b"early", b"later"]


def test_faust_s_buffer_full_lines_during_a_hold_are_folded_into_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Faust's buffer logs ``producer buffer full size N`` once per event while its send
    waits for room in a batch the hold keeps back: the first passes, the rest are counted in
    one line once the hold ended; outside a hold every one passes."""
    worker = Worker(tmp_path, monkeypatch)
    faust_producer_log = logging.getLogger(_stallhold.FAUST_PRODUCER_LOG)

    def buffer_full(size: int) -> None:  # as Faust's ``wait_until_ebb`` logs
        faust_producer_log.warning(f"producer buffer full size {size}")
        faust_producer_log.info("producer flush took 0.1")

    async def scenario() -> None:
        worker.start()
        worker.stall(10.0)
        worker.look()  # the hold begins
        for size in range(1001, 1501):
            buffer_full(size)
        assert await worker.heartbeat()
        worker.look()  # released
        await asyncio.wait_for(released(worker.producer), 1.0)
        worker.look()  # the next tick tells
        buffer_full(1002)  # no hold: Faust's

    faust_producer_log.addFilter(worker.producer._buffer_full)  # as the producer's start does
    try:
        with caplog.at_level(logging.INFO):
            run(scenario())
    finally:
        faust_producer_log.removeFilter(worker.producer._buffer_full)
    faust_said = [r.getMessage() for r in caplog.records if r.name == faust_producer_log.name]
    assert faust_said == [
        "producer buffer full size 1001",
        "producer flush took 0.1",
        "producer buffer full size 1002",
        "producer flush took 0.1",
    ]
    told = [r.getMessage() for r in caplog.records if "was full" in r.getMessage()]
    assert told == [
        "Faust's producer buffer was full 500 times during the hold (up to 1500 messages: its "
        'changelog send waited for room): its "producer buffer full" WARNING after the first '
        "was not logged"
    ]
