"""A changelog request aiokafka had written when a worker was cut off from the broker is
recalled when the silence hold begins (``streamassign.aiokafka.sender.abort_in_flight``): its
connection is reset, discarding the bytes still in this host's buffers, and aiokafka retries
its batches into the gated accumulator. When it happens and when not, on aiokafka's real
sender with stand-in connections; the real connection's case is in
tests/integration/test_aiokafka_abort.py."""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.client import AIOKafkaClient, ConnectionGroup
from aiokafka.conn import CloseReason
from aiokafka.producer.message_accumulator import MessageAccumulator
from aiokafka.producer.sender import Sender
from aiokafka.structs import TopicPartition

from streamassign.aiokafka.accumulator import HOLD, SEND
from streamassign.aiokafka.sender import abort_in_flight, gate_sends

from .test_faust_stallhold import CHANGELOG, SINK, Worker, run
from .test_faust_stallpartition import _beating, _partitioned

CHANGELOG_TP = TopicPartition(CHANGELOG, 0)
SINK_TP = TopicPartition(SINK, 0)


class Transport:
    """asyncio's transport of a connection, as the abort uses it: a real socket under it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.aborted = False

    def get_extra_info(self, name: str) -> Any:
        return self.sock if name == "socket" else None

    def abort(self) -> None:
        self.aborted = True


class Connection:
    """aiokafka's connection to one broker, recording how it was closed."""

    def __init__(self, sock: socket.socket) -> None:
        self.transport = Transport(sock)
        self._writer: Any = SimpleNamespace(transport=self.transport)
        self.closed: list[Any] = []

    def close(self, reason: Any = None) -> None:
        self.closed.append(reason)
        self._writer = None


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    """Real sockets under the stand-in connections (their SO_LINGER is read back)."""
    opened: list[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()


def _producer(sockets: list[socket.socket], nodes: int = 1, **sender: Any) -> Any:
    """aiokafka's producer parts: a real sender and accumulator, a connection per node."""
    conns = {}
    for node_id in range(1, nodes + 1):
        left, right = socket.socketpair()
        sockets.extend((left, right))
        conns[(node_id, ConnectionGroup.DEFAULT)] = Connection(left)
    client = SimpleNamespace(_conns=conns)
    cluster = SimpleNamespace(leader_for_partition=lambda tp: 1)
    accumulator = MessageAccumulator(cluster, 16384, 0, 30)
    options: dict[str, Any] = {"acks": -1, "txn_manager": None, **sender}
    real = Sender(
        client,
        message_accumulator=accumulator,
        retry_backoff_ms=100,
        request_timeout_ms=1000,
        **options,
    )
    return SimpleNamespace(_message_accumulator=accumulator, _sender=real, client=client)


async def _made(make: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``make(...)`` inside an event loop (aiokafka's accumulator wants a running one)."""
    return make(*args, **kwargs)


def _in_flight(producer: Any, node_id: int, *tps: TopicPartition) -> None:
    """As aiokafka's sender marks a request it made: its node in flight, its partitions muted."""
    producer._sender._in_flight.add(node_id)
    producer._sender._muted_partitions.update(tps)


def _unanswered(producer: Any) -> dict[int, asyncio.Event]:
    """The sender's request, before a gate wraps it, as aiokafka's once written: unanswered
    until its node's event is set, then its marks undone."""
    sender = producer._sender
    answers: dict[int, asyncio.Event] = collections.defaultdict(asyncio.Event)

    async def in_flight(node_id: int, batches: dict[Any, Any]) -> None:
        await answers[node_id].wait()
        sender._in_flight.discard(node_id)
        sender._muted_partitions.difference_update(batches)

    sender._send_produce_req = in_flight
    return answers


def _request(producer: Any, node_id: int, *tps: TopicPartition) -> asyncio.Future[None]:
    """A request of ``tps`` to ``node_id``, as aiokafka's sender makes it (marks, then the
    request's task, through the gate when there is one)."""
    _in_flight(producer, node_id, *tps)
    return asyncio.ensure_future(producer._sender._send_produce_req(node_id, dict.fromkeys(tps)))


def _conn(producer: Any, node_id: int = 1) -> Connection:
    conn: Connection = producer.client._conns[(node_id, ConnectionGroup.DEFAULT)]
    return conn


def _linger(conn: Connection) -> tuple[int, int]:
    raw = conn.transport.sock.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER, 8)
    on, seconds = struct.unpack("ii", raw)
    return on, seconds


def _is_changelog(tp: Any) -> bool:
    return bool(tp.topic == CHANGELOG)


def _gated_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, producer: Any) -> Worker:
    worker = _beating(Worker(tmp_path, monkeypatch))
    worker.producer._producer = producer
    worker.producer._stall_gate(producer)
    assert worker.producer._stall_gated
    return worker


def test_a_silence_hold_resets_the_connection_with_a_changelog_request_in_flight(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    sockets: list[socket.socket],
) -> None:
    """Once, when the hold begins: SO_LINGER 0 (the kernel discards what is unsent), asyncio's
    buffer dropped, aiokafka's close as a broken connection (its request retried); the hold's
    WARNING counts it."""

    async def cut() -> Any:
        producer = _producer(sockets)
        _unanswered(producer)
        worker = _gated_worker(tmp_path, monkeypatch, producer)
        _request(producer, 1, CHANGELOG_TP, SINK_TP)
        await asyncio.sleep(0)  # written
        worker.start()
        assert await worker.heartbeat()
        _partitioned(worker, 7.0)
        assert worker.producer.stall_hold.holding
        return producer

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        producer = run(cut())
    conn = _conn(producer)
    assert _linger(conn) == (1, 0)
    assert conn.transport.aborted and conn.closed == [CloseReason.CONNECTION_BROKEN]
    assert "reset 1 connection(s) with a changelog request in flight" in caplog.text
    assert "unsent bytes discarded" in caplog.text


def test_a_stall_s_hold_resets_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    sockets: list[socket.socket],
) -> None:
    """A stopped process's kernel sent the request meanwhile: nothing is left to recall, and a
    reset would only have aiokafka send it again."""

    async def stall() -> Any:
        producer = _producer(sockets)
        _unanswered(producer)
        worker = _gated_worker(tmp_path, monkeypatch, producer)
        base = time.monotonic()
        worker.producer.clock = lambda: base + worker.skew  # only the stall moves it
        _request(producer, 1, CHANGELOG_TP)
        await asyncio.sleep(0)  # written
        worker.start()
        worker.stall(9.0)
        worker.look()
        assert worker.producer.stall_hold.holding
        return producer

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        producer = run(stall())
    assert _conn(producer).closed == [] and not _conn(producer).transport.aborted
    assert "the event loop did not run for 9.0 s" in caplog.text
    assert "reset" not in caplog.text


def test_a_silence_hold_without_a_changelog_request_in_flight_resets_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    sockets: list[socket.socket],
) -> None:

    async def cut() -> Any:
        producer = _producer(sockets)
        _unanswered(producer)
        worker = _gated_worker(tmp_path, monkeypatch, producer)
        _request(producer, 1, SINK_TP)
        await asyncio.sleep(0)  # written
        worker.start()
        _partitioned(worker, 7.0)
        assert worker.producer.stall_hold.holding
        return producer

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        producer = run(cut())
    assert _conn(producer).closed == []
    assert "reset 0 connection(s)" in caplog.text


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"acks": 0}, "acks=0: its records already count as written"),
        ({"txn_manager": object()}, "idempotent: a dropped batch fails the partition's later ones"),
    ],
)
def test_an_acks_0_or_idempotent_sender_is_not_reset(
    sockets: list[socket.socket], options: dict[str, Any], why: str
) -> None:
    producer = run(_made(_producer, sockets, **options))
    _in_flight(producer, 1, CHANGELOG_TP)
    assert abort_in_flight(producer, _is_changelog) == 0, why
    assert _conn(producer).closed == []


def test_a_sender_of_another_shape_is_not_reset(sockets: list[socket.socket]) -> None:
    producer = run(_made(_producer, sockets))
    _in_flight(producer, 1, CHANGELOG_TP)
    other = SimpleNamespace(_sender=SimpleNamespace(_in_flight={1}, _acks=-1, _txn_manager=None))
    assert abort_in_flight(other, _is_changelog) == 0
    producer.client._conns = None  # connections kept elsewhere
    assert abort_in_flight(producer, _is_changelog) == 0
    assert abort_in_flight(SimpleNamespace(), _is_changelog) == 0


def test_every_node_in_flight_is_reset_each_on_its_own(
    sockets: list[socket.socket], caplog: pytest.LogCaptureFixture
) -> None:
    """A socket already closed (SO_LINGER fails) is still aborted; a connection whose close
    raises is logged and the next node's is reset; one still connecting is skipped."""
    producer = run(_made(_producer, sockets, nodes=3))
    for node_id in (1, 2, 3, 4):
        _in_flight(producer, node_id, CHANGELOG_TP)
    _conn(producer, 1).transport.sock.close()

    def broken(reason: Any = None) -> None:
        raise RuntimeError("a bug")

    _conn(producer, 2).close = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="streamassign.aiokafka"):
        assert abort_in_flight(producer, _is_changelog) == 2
    assert _conn(producer, 1).transport.aborted and _conn(producer, 1).closed
    assert _linger(_conn(producer, 3)) == (1, 0) and _conn(producer, 3).closed
    assert "resetting aiokafka's connection to node 2 failed" in caplog.text


def test_only_the_nodes_whose_request_carries_a_changelog_batch_are_reset(
    sockets: list[socket.socket],
) -> None:
    """Two leaders, a request in flight to each, through the gated sender: node 1's carries a
    changelog batch (and a sink one), node 2's the sink's alone; node 2's is not reset (sent
    again, it would be a duplicate if the broker had written it). Node 1's answered, its next
    request carries the sink's alone: then nothing is reset."""

    async def requests() -> tuple[int, int, Connection, Any]:
        producer = _producer(sockets, nodes=2)
        answers = _unanswered(producer)
        assert gate_sends(producer._sender, lambda: SEND, _is_changelog)
        first = _request(producer, 1, CHANGELOG_TP, SINK_TP)
        last = _request(producer, 2, TopicPartition(SINK, 1))
        await asyncio.sleep(0)  # both written
        reset = abort_in_flight(producer, _is_changelog)
        answers[1].set()
        await first
        first_conn = _conn(producer, 1)
        answers[1].clear()
        left, right = socket.socketpair()  # aiokafka connects again
        sockets.extend((left, right))
        producer.client._conns[(1, ConnectionGroup.DEFAULT)] = Connection(left)
        again = _request(producer, 1, SINK_TP)
        await asyncio.sleep(0)
        reset_again = abort_in_flight(producer, _is_changelog)
        answers[1].set()
        answers[2].set()
        await asyncio.gather(again, last)
        return reset, reset_again, first_conn, producer

    reset, reset_again, first_conn, producer = run(requests())
    assert reset == 1 and first_conn.closed == [CloseReason.CONNECTION_BROKEN]
    assert reset_again == 0
    assert _conn(producer, 1).closed == [] and not _conn(producer, 1).transport.aborted
    assert _conn(producer, 2).closed == [] and not _conn(producer, 2).transport.aborted


def test_a_changelog_partition_anywhere_in_its_request_is_noted(
    sockets: list[socket.socket],
) -> None:
    """A request's batches in aiokafka's order, the changelog's last behind two sink ones: a
    note of fewer than all its partitions would let this request escape the reset, its
    changelog batch landing after the new owner's writes."""

    async def request() -> tuple[int, Any]:
        producer = _producer(sockets)
        answers = _unanswered(producer)
        assert gate_sends(producer._sender, lambda: SEND, _is_changelog)
        made = _request(producer, 1, SINK_TP, TopicPartition(SINK, 1), CHANGELOG_TP)
        await asyncio.sleep(0)  # written
        reset = abort_in_flight(producer, _is_changelog)
        answers[1].set()
        await made
        return reset, producer

    reset, producer = run(request())
    assert reset == 1 and _conn(producer).closed == [CloseReason.CONNECTION_BROKEN]


def test_a_changelog_batch_the_gate_held_is_not_noted(sockets: list[socket.socket]) -> None:
    """A hold takes the changelog's batch out of a request of it and a sink's: the request
    that goes out carries the sink's alone, so its connection is not reset (the sink's batch
    would be sent again); the changelog's batch waits in the accumulator."""

    async def held() -> tuple[int, Any]:
        producer = _producer(sockets)
        answers = _unanswered(producer)
        accumulator = producer._message_accumulator
        assert gate_sends(producer._sender, lambda: HOLD, _is_changelog)
        for tp in (CHANGELOG_TP, SINK_TP):
            await accumulator.add_message(tp, b"k", b"v", timeout=1)
        drained, _unknown = accumulator.drain_by_nodes(ignore_nodes=set(), muted_partitions=set())
        assert list(drained[1]) == [CHANGELOG_TP, SINK_TP]
        _in_flight(producer, 1, *drained[1])
        made = asyncio.ensure_future(producer._sender._send_produce_req(1, drained[1]))
        await asyncio.sleep(0)  # the sink's written
        reset = abort_in_flight(producer, _is_changelog)
        answers[1].set()
        await made
        return reset, producer

    reset, producer = run(held())
    assert reset == 0 and _conn(producer).closed == []
    assert [batch.tp for batch in producer._message_accumulator._batches[CHANGELOG_TP]] == [
        CHANGELOG_TP
    ]


@pytest.mark.parametrize("ending", ["raises", "is cancelled"])
def test_a_request_that_ends_without_an_answer_leaves_no_note(
    sockets: list[socket.socket], ending: str
) -> None:
    """aiokafka's request task ends by an exception too (its sender closed with the request
    in flight cancels it): its note goes with it, or the node's next request, of the sink's
    alone, would be reset as if it carried the changelog's."""

    async def ended() -> tuple[int, Any]:
        producer = _producer(sockets)
        answers = _unanswered(producer)
        sender = producer._sender
        unanswered = sender._send_produce_req

        async def failing(node_id: int, batches: dict[Any, Any]) -> None:
            await unanswered(node_id, batches)
            raise RuntimeError("aiokafka's request failed")

        sender._send_produce_req = failing
        assert gate_sends(sender, lambda: SEND, _is_changelog)
        first = _request(producer, 1, CHANGELOG_TP)
        await asyncio.sleep(0)  # written
        if ending == "raises":
            answers[1].set()
        else:
            first.cancel()
        with pytest.raises((RuntimeError, asyncio.CancelledError)):
            await first
        answers[1].clear()
        again = _request(producer, 1, SINK_TP)
        await asyncio.sleep(0)  # written
        reset = abort_in_flight(producer, _is_changelog)
        again.cancel()
        return reset, producer

    reset, producer = run(ended())
    assert reset == 0 and _conn(producer).closed == []


def test_a_gated_request_not_yet_written_is_not_reset(sockets: list[socket.socket]) -> None:
    """Marked in flight, its task not yet run (or still connecting): it writes nothing before
    it asks the rule, which the hold has changed by then; its connection may carry another
    request of other topics."""

    async def made() -> tuple[int, Any]:
        producer = _producer(sockets)
        _unanswered(producer)
        assert gate_sends(producer._sender, lambda: SEND, _is_changelog)
        request = _request(producer, 1, CHANGELOG_TP)
        reset = abort_in_flight(producer, _is_changelog)  # before the request's task runs
        request.cancel()
        return reset, producer

    reset, producer = run(made())
    assert reset == 0 and _conn(producer).closed == []


def test_a_silence_hold_resets_nothing_when_the_drains_are_not_gated(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    sockets: list[socket.socket],
) -> None:
    """An accumulator of another shape: its drains are not gated, so nothing would hold the
    batches a reset hands back; they would be sent again at once. The hold begins and says
    it reset nothing."""

    async def cut() -> Any:
        producer = _producer(sockets)
        producer._message_accumulator = SimpleNamespace()  # the sender's own is aiokafka's
        worker = _beating(Worker(tmp_path, monkeypatch))
        worker.producer._producer = producer
        worker.producer._stall_gate(producer)
        assert not worker.producer._stall_gated
        _in_flight(producer, 1, CHANGELOG_TP)
        worker.start()
        assert await worker.heartbeat()
        _partitioned(worker, 7.0)
        assert worker.producer.stall_hold.holding
        return producer

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        producer = run(cut())
    assert _conn(producer).closed == [] and not _conn(producer).transport.aborted
    assert "reset 0 connection(s) with a changelog request in flight" in caplog.text
    assert abort_in_flight(producer, _is_changelog) == 1  # what the guard kept from happening


def test_the_installed_aiokafka_producer_has_the_shape_the_abort_relies_on(
    sockets: list[socket.socket],
) -> None:
    async def shape() -> tuple[int, Connection]:
        producer = AIOKafkaProducer(bootstrap_servers="localhost:1")
        left, right = socket.socketpair()
        sockets.extend((left, right))
        conn = Connection(left)
        producer.client._conns[(1, ConnectionGroup.DEFAULT)] = conn
        _in_flight(producer, 1, CHANGELOG_TP)
        return abort_in_flight(producer, _is_changelog), conn

    reset, conn = run(shape())
    assert reset == 1 and conn.closed == [CloseReason.CONNECTION_BROKEN]


def test_connecting_first_costs_no_step_of_the_loop_on_a_live_connection() -> None:
    """The request's gate awaits ``client.ready(node)`` before it decides: on a live
    connection that returns without suspending, so the request goes out as soon as before."""

    async def ready_steps() -> bool:
        client = AIOKafkaClient(bootstrap_servers="localhost:1")
        live = SimpleNamespace(connected=lambda: True)
        client._conns[(1, ConnectionGroup.DEFAULT)] = live
        coroutine = client.ready(1)
        try:
            coroutine.send(None)
        except StopIteration as done:
            return bool(done.value)
        coroutine.close()
        raise AssertionError("ready() suspended on a live connection")

    assert run(ready_steps())


def test_a_request_still_connecting_at_a_stall_decides_once_connected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request's task starts, its connection is being made; the hold begins meanwhile:
    connected, the request hands the changelog's batch back rather than write it."""
    from .test_faust_stallsend_inflight import _append, _gated, _idle, _until

    async def scenario() -> tuple[list[Any], int]:
        worker = Worker(tmp_path, monkeypatch)
        accumulator, sender, broker = await _gated(worker)
        connecting = asyncio.Event()
        connected = asyncio.Event()

        async def ready(node_id: int) -> bool:
            connecting.set()
            await connected.wait()
            return True

        broker.ready = ready  # type: ignore[attr-defined]
        await _append(accumulator, CHANGELOG_TP, b"stale")
        await asyncio.wait_for(connecting.wait(), 5)
        worker.stall(10.0)  # the cut, seen as a stall here: the hold begins while it connects
        connected.set()
        await _until(lambda: CHANGELOG_TP in accumulator._batches and _idle(sender))
        await sender.close()
        return broker.landed, accumulator._batches[CHANGELOG_TP][0].retry_count

    landed, retries = run(scenario())
    assert landed == [] and retries == 1


def test_a_request_the_lost_membership_drops_does_not_wait_for_a_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decided DROP (or HOLD) before connecting, the request hands its changelog batch over at
    once: a dead leader's connection would keep it, and a flush waiting on it, for minutes."""
    from .test_faust_stallsend_inflight import _append, _gated, _stop_after_the_next_drain, _until

    async def scenario() -> tuple[bool, bool]:
        worker = Worker(tmp_path, monkeypatch)
        accumulator, sender, broker = await _gated(worker)
        connecting = asyncio.Event()

        async def ready(node_id: int) -> bool:
            connecting.set()
            await asyncio.Event().wait()  # a dead link: never connected
            return False

        broker.ready = ready  # type: ignore[attr-defined]

        def stall_and_lose() -> None:
            worker.stall(10.0)
            worker.coordinator.member_id = ""
            worker.look()

        _stop_after_the_next_drain(accumulator, stall_and_lose)
        await _append(accumulator, CHANGELOG_TP, b"stale")
        await _until(lambda: not accumulator._pending_batches and not sender._in_flight)
        await asyncio.wait_for(accumulator.flush(), 1)
        await sender.close()
        return connecting.is_set(), bool(broker.landed)

    assert run(scenario()) == (False, False)


def test_a_changelog_request_whose_leader_cannot_be_reached_connects_once_then_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request's gate connected first and failed: the request is not sent (its send would
    connect again, a second wait on a dead leader); its batch goes back, as aiokafka's retry
    does, and the next request connects and writes it."""
    from .test_faust_stallsend_inflight import _append, _gated, _idle, _until

    async def scenario() -> tuple[list[bool], list[Any]]:
        worker = Worker(tmp_path, monkeypatch)
        accumulator, sender, broker = await _gated(worker)
        sender._retry_backoff = 0.01
        answers = [False, True]
        asked: list[bool] = []

        async def ready(node_id: int) -> bool:
            asked.append(answers[len(asked)])
            return asked[-1]

        broker.ready = ready  # type: ignore[attr-defined]
        record = await _append(accumulator, CHANGELOG_TP, b"v")
        await _until(lambda: record.done() and _idle(sender))
        await sender.close()
        return asked, broker.landed

    asked, landed = run(scenario())
    assert asked == [False, True]
    assert landed == [(CHANGELOG, b"v")]
