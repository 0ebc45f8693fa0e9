"""A changelog send waiting in aiokafka for room in a batch the stall hold keeps back: aiokafka
gives up after Faust's ``producer_request_timeout`` (20 min) with KafkaTimeoutError, which
Faust's producer buffer does not catch (the worker crashed in a 21-minute network cut). During
a hold the send joins the held sends instead; outside one the error is Faust's, as before.
aiokafka's real accumulator, with Faust's send reduced to what it does around it (no broker)."""

from __future__ import annotations

import ast
import asyncio
import inspect
import logging
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import KafkaError, KafkaTimeoutError, NotLeaderForPartitionError
from aiokafka.producer.message_accumulator import MessageAccumulator
from aiokafka.structs import TopicPartition
from faust.exceptions import ProducerSendError
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.transport.producer import ProducerBuffer

from streamassign.aiokafka.accumulator import gate_drains
from streamassign.faust._stallhold import TICK, HeldSend, StallHold

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
        return HeldSend(send=None, result=None, began=at, number=int(at))  # type: ignore[arg-type]

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


def _frozen(worker: Worker) -> None:
    """The worker's clock moves only by its stalls (``Worker.stall``)."""
    base = time.monotonic()
    worker.producer.clock = lambda: base + worker.skew


def test_a_send_timing_out_as_a_release_ends_is_sent_again_once_signalled_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """aiokafka's wait ends by its timeout just after the hold let the batch go: the send was
    never added, nothing of its partition went out after it (Faust's buffer awaits it), so
    it goes out again instead of crashing Faust's buffer; Faust's ``on_produce_message``
    is told of it once."""
    worker = Worker(tmp_path, monkeypatch)
    _frozen(worker)  # the timeout in the release's very moment, however loaded the machine

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


def test_a_send_timing_out_a_while_after_a_release_is_faust_s_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its wait spanned a short hold released well before aiokafka gave up: it waited for
    something else (a partition leader away), and sent again it would wait that long again.
    Faust's error, as for a timeout with no hold in its wait."""
    worker = Worker(tmp_path, monkeypatch)
    _frozen(worker)

    async def scenario() -> list[bytes]:
        aiokafka = GivesUpAfterRelease(b"early")
        _faust_sends_to(worker, monkeypatch, aiokafka)
        waiting = await _held_then_released(worker, later=None)
        worker.stall(5 * TICK)  # a few ticks on, within the hold's thresholds
        worker.look()
        aiokafka.give_up.set_result(None)
        with pytest.raises(ProducerSendError) as raised:
            await asyncio.wait_for(waiting, 1.0)
        assert isinstance(raised.value.__cause__, KafkaTimeoutError)
        assert not worker.producer.stall_hold.holding
        return aiokafka.taken

    assert run(scenario()) == []


def test_a_send_made_after_at_the_same_clock_reading_keeps_a_waiting_one_from_going_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A coarse clock (Windows': 15.6 ms) reads the same for two sends: the one made after,
    handed to aiokafka first, still keeps the first from going again behind it."""
    worker = Worker(tmp_path, monkeypatch)
    producer, hold = worker.producer, worker.producer.stall_hold

    async def scenario() -> bool:
        async def handed() -> Any:
            return asyncio.get_running_loop().create_future()

        result = asyncio.get_running_loop().create_future()
        waiting = HeldSend(handed, result, 5.0, hold.number())
        later = HeldSend(handed, result, 5.0, hold.number())
        await producer._faust_send(later)
        hold.released_at = 5.0  # the release in the same moment as the timeout
        return producer._may_send_again(waiting, 5.0)

    assert not run(scenario())


def _full_buffer(worker: Worker) -> list[int]:
    """The worker's Faust producer buffer, one message past full for good (no sending task):
    each event's ``wait_until_ebb`` waits, logs in Faust's way, and returns at once (a
    stand-in ``flush_atmost``). The sizes it was asked to flush down by."""
    buffer: Any = worker.producer.buffer
    for _ in range(buffer.max_messages + 1):
        buffer.pending.put_nowait(None)
    flushed: list[int] = []

    async def flush_atmost(max_messages: int) -> int:
        flushed.append(max_messages)
        return 0

    buffer.flush_atmost = flush_atmost
    return flushed


def _faust_producer_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Faust's buffer's lines, their times left out."""
    return [
        r.getMessage().split(" took ")[0]
        for r in caplog.records
        if r.name == "faust.transport.producer"
    ]


async def _release(worker: Worker) -> None:
    assert await worker.heartbeat()
    worker.look()
    await asyncio.wait_for(released(worker.producer), 1.0)


def test_faust_s_buffer_full_lines_during_a_hold_are_counted_in_one_line_per_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Faust's buffer logs ``producer buffer full size N`` and ``producer flush took S`` once
    per event while its send waits for room in a batch the hold keeps back: the hold's first
    pass, the rest are counted in one line once it ended (a hold begun before the tick that
    tells the last one's count does not add to it); outside a hold every one passes. Each
    event still waits for the buffer to ebb."""
    worker = Worker(tmp_path, monkeypatch)
    flushed = _full_buffer(worker)
    buffer: Any = worker.producer.buffer

    async def scenario() -> None:
        worker.start()
        worker.stall(10.0)
        worker.look()  # the first hold
        for _ in range(500):
            await buffer.wait_until_ebb()
        await _release(worker)
        worker.stall(10.0)  # the second, begun by a send before any tick
        assert worker.producer.stall_hold.check(worker.producer.clock())
        for _ in range(3):
            await buffer.wait_until_ebb()
        await _release(worker)
        worker.look()  # the next tick tells
        await buffer.wait_until_ebb()  # no hold: Faust's

    with caplog.at_level(logging.INFO):
        run(scenario())
    assert _faust_producer_lines(caplog) == 3 * ["producer buffer full size 101", "producer flush"]
    told = [r.getMessage() for r in caplog.records if "was full" in r.getMessage()]
    assert told == [
        f"Faust's producer buffer was full {times} times during the hold (up to 101 messages: "
        'its changelog send waited for room): its "producer buffer full" WARNING and "producer '
        'flush took" INFO after the first were not logged'
        for times in (500, 3)
    ]
    assert flushed == [100] * 504


def test_another_app_s_buffer_full_lines_are_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Two apps in one process log to Faust's one logger: the hold of one leaves the other's
    lines alone, and counts only its own."""
    holding = Worker(tmp_path / "holding", monkeypatch)
    other = Worker(tmp_path / "other", monkeypatch)
    _full_buffer(holding)
    _full_buffer(other)

    async def scenario() -> None:
        holding.start()
        other.start()
        holding.stall(10.0)
        holding.look()
        for _ in range(3):
            await holding.producer.buffer.wait_until_ebb()
            await other.producer.buffer.wait_until_ebb()
        await _release(holding)
        holding.look()

    with caplog.at_level(logging.INFO):
        run(scenario())
    assert _faust_producer_lines(caplog) == 4 * ["producer buffer full size 101", "producer flush"]
    told = [r.getMessage() for r in caplog.records if "was full" in r.getMessage()]
    assert len(told) == 1 and "was full 3 times" in told[0]


def test_faust_s_buffer_wait_is_the_one_the_fold_repeats() -> None:
    """During a hold, the fold waits as Faust's ``ProducerBuffer.wait_until_ebb`` does, without
    its two lines: one ``await self.flush_atmost(self.max_messages)`` when
    ``self.size > self.max_messages``. A Faust whose wait does more must fail here, not be
    silently folded into the old one."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(ProducerBuffer.wait_until_ebb)))
    awaited = [ast.unparse(node.value) for node in ast.walk(tree) if isinstance(node, ast.Await)]
    assert awaited == ["self.flush_atmost(self.max_messages)"]
    body = tree.body[0].body  # type: ignore[attr-defined]
    ifs = [statement for statement in body if isinstance(statement, ast.If)]
    assert [ast.unparse(statement.test) for statement in ifs] == ["self.size > self.max_messages"]
    assert all(isinstance(s, ast.Expr) for s in body if not isinstance(s, ast.If))  # docstring
