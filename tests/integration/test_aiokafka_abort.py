"""A produce request written when the link to the broker died is recalled by
``abort_in_flight``: aiokafka's real producer and connection, the session's broker behind an
in-test proxy that stops reading (a tiny receive buffer), so a large changelog request stays in
the client's buffers (asyncio's and the kernel's) as behind a dead link. Reset, it never lands
when the proxy reads again: aiokafka retries its batch into the gated accumulator, which holds
it and drops it at the verdict. The control, not reset, shows it lands then. Both buffers are
covered: with the kernel's send queue holding the request, SO_LINGER 0 is what discards it;
with a full socket, asyncio's abort is (its plain close flushes the buffer first)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from streamassign.aiokafka.accumulator import DROP, HOLD, SEND, drop_gated, gate_drains
from streamassign.aiokafka.sender import abort_in_flight, gate_sends

from .conftest import TopicFactory

#: Far more than the proxy's receive buffer takes; within the kernel send buffer set below.
RECORD = b"v" * 200_000
DEADLINE = 30.0


class StallingProxy:
    """Forwards connections to the broker; paused, it stops reading what clients send, and its
    receive buffer (about 2 KB, inherited from the listening socket) fills at once."""

    def __init__(self, broker: tuple[str, int]) -> None:
        self.broker = broker
        self.reading = asyncio.Event()
        self.reading.set()
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.listener.setblocking(False)
        self.port: int = self.listener.getsockname()[1]
        self.tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._spawn(self._accept())

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            client, _ = await loop.sock_accept(self.listener)
            upstream = socket.socket()
            upstream.setblocking(False)
            await loop.sock_connect(upstream, self.broker)
            self._spawn(self._forward(client, upstream))

    async def _forward(self, client: socket.socket, upstream: socket.socket) -> None:
        pumps = {
            asyncio.ensure_future(self._pump(client, upstream, self.reading)),
            asyncio.ensure_future(self._pump(upstream, client, None)),
        }
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            client.close()
            upstream.close()

    @staticmethod
    async def _pump(src: socket.socket, dst: socket.socket, gate: asyncio.Event | None) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                if gate is not None:
                    await gate.wait()
                data = await loop.sock_recv(src, 65536)
                if not data:
                    return
                await loop.sock_sendall(dst, data)
        except OSError:  # a reset connection: the other side is closed with it
            return

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.listener.close()


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(DEADLINE):
        while not condition():
            await asyncio.sleep(0.01)


def _request_written(producer: AIOKafkaProducer) -> bool:
    """A produce request written and waiting for its answer on one of the connections."""
    return any(conn._requests for conn in producer.client._conns.values())


def _buffered(producer: AIOKafkaProducer) -> int:
    """Bytes waiting in asyncio's write buffers of the producer's connections."""
    return sum(
        conn._writer.transport.get_write_buffer_size()
        for conn in producer.client._conns.values()
        if conn._writer is not None
    )


def _set_send_buffers(producer: AIOKafkaProducer, size: int) -> None:
    """The kernel's send buffer of the producer's connections: large, it takes the whole
    request; small (a full socket), the rest waits in asyncio's buffer."""
    for conn in producer.client._conns.values():
        sock = conn._writer.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)


async def _cut_with_a_request_in_flight(
    bootstrap: str, topic: str, *, reset: bool, full_socket: bool
) -> tuple[int, int, bool, int, int]:
    """Write a large changelog record (partition 0) while the proxy reads nothing, reset the
    connection or not, let the proxy read again, then send a record to partition 1 and wait
    for it. The changelog's end offset then, the connections reset, whether the changelog
    record was written, the batches a DROP verdict drops, and the request's bytes that waited
    in asyncio's buffer (with ``full_socket``, not in the kernel's)."""
    host, _, port = bootstrap.rpartition(":")
    proxy = StallingProxy((host, int(port)))
    proxy.start()
    rule = [SEND]
    changelog = TopicPartition(topic, 0)

    def gated(tp: Any) -> bool:
        return bool(tp == changelog)

    producer = AIOKafkaProducer(
        bootstrap_servers=f"127.0.0.1:{proxy.port}",
        acks=1,
        max_batch_size=512 * 1024,
        request_timeout_ms=int(DEADLINE * 1000),
    )
    broker_metadata = producer.client.cluster.broker_metadata

    def via_proxy(node_id: Any) -> Any:  # every connection of the producer through the proxy
        broker = broker_metadata(node_id)
        return None if broker is None else broker._replace(host="127.0.0.1", port=proxy.port)

    producer.client.cluster.broker_metadata = via_proxy
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    await producer.start()
    try:
        assert gate_drains(producer._message_accumulator, lambda: rule[0], gated)
        assert gate_sends(producer._sender, lambda: rule[0], gated)
        await producer.send_and_wait(topic, b"warm", partition=1)
        _set_send_buffers(producer, 4096 if full_socket else 1 << 20)
        proxy.reading.clear()
        record = await producer.send(topic, RECORD, partition=0)
        await _until(lambda: _request_written(producer))
        buffered = _buffered(producer)
        rule[0] = HOLD  # the silence hold begins
        aborted = abort_in_flight(producer, gated) if reset else 0
        if reset:
            batches = producer._message_accumulator._batches
            await _until(lambda: bool(batches.get(changelog)))
            assert batches[changelog][0].retry_count >= 1 and not record.done()
        proxy.reading.set()  # the heal
        async with asyncio.timeout(DEADLINE):
            await producer.send_and_wait(topic, b"marker", partition=1)
        if not reset:
            async with asyncio.timeout(DEADLINE):
                await record
        end = (await consumer.end_offsets([changelog]))[changelog]
        rule[0] = DROP  # the membership was lost
        dropped = drop_gated(producer._message_accumulator, gated)
        assert (await consumer.end_offsets([changelog]))[changelog] == end
        return end, aborted, record.done(), dropped, buffered
    finally:
        await producer.stop()
        await consumer.stop()
        await proxy.close()


@pytest.mark.parametrize("full_socket", [False, True], ids=["kernel-queue", "asyncio-buffer"])
def test_a_request_reset_at_the_cut_never_lands_and_is_dropped_at_the_verdict(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory, full_socket: bool
) -> None:
    topic = kafka_topic_factory(2, prefix="abort-reset")
    *outcome, buffered = asyncio.run(
        _cut_with_a_request_in_flight(kafka_bootstrap, topic, reset=True, full_socket=full_socket)
    )
    assert outcome == [0, 1, False, 1]
    assert (buffered > 0) == full_socket


@pytest.mark.parametrize("full_socket", [False, True], ids=["kernel-queue", "asyncio-buffer"])
def test_control_a_request_not_reset_lands_when_the_link_heals(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory, full_socket: bool
) -> None:
    """What the reset prevents: the bytes held in the client's buffers all through the cut
    reach the broker when the proxy reads again, after anything written meanwhile."""
    topic = kafka_topic_factory(2, prefix="abort-control")
    *outcome, buffered = asyncio.run(
        _cut_with_a_request_in_flight(kafka_bootstrap, topic, reset=False, full_socket=full_socket)
    )
    assert outcome == [1, 0, True, 0]
    assert (buffered > 0) == full_socket
