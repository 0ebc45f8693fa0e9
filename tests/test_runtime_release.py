"""What a stop that ``closing.stop_within`` cut leaves running is released: aiokafka's real
producer against a broker that never answers (a local socket that reads and stays silent),
and the private parts of aiokafka the releases reach, checked on the installed version."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import logging
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.client import AIOKafkaClient, CoordinationType
from aiokafka.consumer.fetcher import Fetcher
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.producer.message_accumulator import MessageAccumulator, MessageBatch
from aiokafka.producer.sender import Sender
from aiokafka.protocol.admin import ApiVersionResponse_v0
from aiokafka.protocol.metadata import MetadataResponse_v0
from aiokafka.protocol.transaction import EndTxnRequest
from aiokafka.structs import TopicPartition as KafkaTopicPartition

from streamassign import Subtopology, Topology
from streamassign.aiokafka import closing
from streamassign.errors import WritesAbandonedError
from streamassign.runtime import App
from streamassign.runtime import transactions as runtime_transactions

LOG = logging.getLogger("t")

TOPIC = "out"


class Nothing:
    async def process(self, ctx: object, record: object) -> None: ...


#: The API versions the silent broker claims (a Kafka 3.x broker's, for the requests here).
API_VERSIONS = [(0, 0, 9), (3, 0, 12), (18, 0, 3), (22, 0, 4)]


class SilentBroker:
    """A listening socket that answers a connection's ApiVersions request (so aiokafka sends
    its produce requests) and no other: a broker that stopped answering (frozen, or cut off
    by a partition) with the connection still up. It records every request it reads."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.api_keys: list[int] = []
        self.connections = 0
        self.port = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                request = await reader.readexactly(size)
                self.received.extend(request)
                api_key, _, correlation_id = struct.unpack(">hhi", request[:8])
                self.api_keys.append(api_key)
                if api_key == ApiVersionResponse_v0.API_KEY:
                    body = (
                        struct.pack(">i", correlation_id)
                        + ApiVersionResponse_v0(0, API_VERSIONS).encode()
                    )
                    writer.write(struct.pack(">i", len(body)) + body)
        writer.close()


@asynccontextmanager
async def silent_broker() -> AsyncIterator[SilentBroker]:
    broker = SilentBroker()
    server = await asyncio.start_server(broker._serve, "127.0.0.1", 0)
    broker.port = server.sockets[0].getsockname()[1]
    async with server:
        yield broker


async def started_producer(
    broker: SilentBroker, transactional_id: str | None = None
) -> AIOKafkaProducer:
    """aiokafka's producer with its sender running, given the metadata a bootstrap would
    have read (the silent broker answers no metadata request): one partition led by it.
    Transactional, it is in a transaction, with what its init, coordinator lookup and
    AddPartitionsToTxn would have given it (the silent broker answers none): a producer id,
    the silent broker as its coordinator, the partition added."""
    producer = AIOKafkaProducer(
        bootstrap_servers=f"127.0.0.1:{broker.port}",
        linger_ms=0,
        transactional_id=transactional_id,
    )
    metadata = MetadataResponse_v0(
        [(0, "127.0.0.1", broker.port)], [(0, TOPIC, [(0, 0, 0, [0], [0])])]
    )
    producer.client.cluster.update_metadata(metadata)
    if transactional_id is not None:
        transaction = producer._txn_manager
        transaction.set_pid_and_epoch(1, 0)
        producer._sender._coordinators[CoordinationType.TRANSACTION] = 0
        await producer.begin_transaction()
        transaction._txn_partitions.add(KafkaTopicPartition(TOPIC, 0))
    await producer._sender.start()
    return producer


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not condition():
            await asyncio.sleep(0.01)


def aiokafka_tasks() -> list[str]:
    names = (t.get_coro().__qualname__ for t in asyncio.all_tasks() if not t.done())
    return sorted(
        n
        for n in names
        if n.split(".")[0]
        in {"Sender", "MessageAccumulator", "AIOKafkaConnection", "AIOKafkaClient"}
    )


def asyncio_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What asyncio logged at ERROR once what the scenario left is collected: a task
    destroyed pending, an unclosed producer or connection, a future whose exception nobody
    retrieved, an exception in a done callback."""
    gc.collect()
    return [
        r.getMessage() for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR
    ]


def test_a_cut_stop_of_the_shared_producer_sends_nothing_more(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``stop_within`` cancelled the shared producer's stop, waiting for acks,
    and the warning called its writes abandoned; but aiokafka's sender ran on, with its
    connections, and delivered them whenever the broker answered again, however late (after
    the next owner's compensation, in an event loop that lives on). Now the sender ends, the
    connections close, and every write it still held fails with ``WritesAbandonedError``:
    one queued behind the write in flight never reaches the broker."""
    monkeypatch.setattr(closing, "CLOSE_TIMEOUT", 0.2)
    one = Topology([Subtopology(0, ["events"])], name="app")
    app = App(one, {0: Nothing}, bootstrap_servers="x:1", state_dir=tmp_path)

    async def scenario() -> None:
        async with silent_broker() as broker:
            producer = await started_producer(broker)
            in_flight = await producer.send(TOPIC, b"in-flight")
            await until(lambda: b"in-flight" in broker.received)
            queued = await producer.send(TOPIC, b"queued")  # its partition waits for an ack
            app._clients.producer = producer
            await asyncio.wait_for(app._stop_clients(), 10)
            assert aiokafka_tasks() == []
            assert isinstance(queued.exception(), WritesAbandonedError)
            assert in_flight.done()
            assert b"queued" not in broker.received

    with caplog.at_level(logging.WARNING, "streamassign"):
        asyncio.run(scenario())
        app.host.state.close()  # its lock file (only its run's stop closes it)
        assert asyncio_errors(caplog) == []
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("streamassign")]
    assert warnings == [
        "the shared producer did not stop within 0.2 s (broker unreachable?): its "
        "unacknowledged writes are abandoned"
    ]


def test_a_cut_close_of_a_task_producer_sends_nothing_more(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for an exactly-once task's producer closed (its abort and stop) within
    ``CLOSE_TIMEOUT``: the next owner's init fences its transaction, but its sender and
    connections ran on."""
    monkeypatch.setattr(closing, "CLOSE_TIMEOUT", 0.2)

    async def scenario() -> None:
        async with silent_broker() as broker:
            producer = await started_producer(broker)
            await producer.send(TOPIC, b"in-flight")
            await until(lambda: b"in-flight" in broker.received)
            queued = await producer.send(TOPIC, b"queued")
            await asyncio.wait_for(runtime_transactions._close(producer, abort=False), 10)
            assert aiokafka_tasks() == []
            assert isinstance(queued.exception(), WritesAbandonedError)
            assert b"queued" not in broker.received

    with caplog.at_level(logging.WARNING, "streamassign"):
        asyncio.run(scenario())
        assert asyncio_errors(caplog) == []
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("streamassign")]
    assert warnings == [
        "a task's producer did not close within 0.2 s (broker unreachable?): its "
        "unacknowledged writes are abandoned"
    ]


@pytest.mark.parametrize(
    ("failure", "said"),
    [
        (RuntimeError("its sender failed"), "RuntimeError('its sender failed')"),
        (asyncio.CancelledError(), "its stop raised CancelledError"),
    ],
)
def test_a_task_producer_whose_stop_fails_is_released(
    caplog: pytest.LogCaptureFixture, failure: BaseException, said: str
) -> None:
    """aiokafka marks a producer closed before its stop's first step, so a step that fails
    skips the others for good: its sender and connections ran on, unreleased. A
    ``CancelledError`` nobody asked for (its sender's routine, cancelled, re-raises a
    request task's cancellation) while the close is not cancelled is such a failure too: the
    close ended there, cancelled, and the task producers' stop (a gather of the closes,
    exceptions returned) swallowed it, nothing released."""

    async def scenario() -> None:
        async with silent_broker() as broker:
            producer = await started_producer(broker)

            async def failing_stop() -> None:
                producer._closed = True  # (aiokafka's stop, first)
                raise failure

            producer.stop = failing_stop
            await asyncio.wait_for(runtime_transactions._close(producer, abort=False), 10)
            assert aiokafka_tasks() == []

    with caplog.at_level(logging.WARNING, "streamassign"):
        asyncio.run(scenario())
        assert asyncio_errors(caplog) == []
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("streamassign")]
    assert warnings == [f"a task's producer did not close cleanly ({said})"]


def test_a_cancelled_close_of_a_task_producer_is_still_cancelled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A close cancelled while the producer stops (the application's stop cancelled) ends
    cancelled, with no release (it would warn of each step it cannot do to this stand-in):
    the cancel is the caller's, not a failed stop."""

    async def scenario() -> None:
        began = asyncio.Event()

        class SlowStop:
            async def stop(self) -> None:
                began.set()
                await asyncio.sleep(60)

        closing_it = asyncio.ensure_future(
            runtime_transactions._close(SlowStop(), abort=False)  # type: ignore[arg-type]
        )
        await began.wait()
        closing_it.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing_it

    with caplog.at_level(logging.WARNING, "streamassign"):
        asyncio.run(asyncio.wait_for(scenario(), 5.0))
    assert [r.getMessage() for r in caplog.records if r.name.startswith("streamassign")] == []


def test_a_cut_abort_of_a_task_producer_leaves_nothing_running(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exactly-once task's producer closed with its abort, which waits for
    the acks of what it holds (its end-transaction request waits for them), is cut in the
    abort. Its sender's routine, cancelled, waits for its requests one at a time, and the
    second cancel ended only the one it awaited: the abort's end-transaction task ran on,
    reconnected once its writes failed, and sent its EndTxn after the release; and the
    producer, whose stop never ran, was logged "Unclosed" at garbage collection. Now every
    task of the sender ends and the producer is closed."""
    monkeypatch.setattr(closing, "CLOSE_TIMEOUT", 0.2)

    async def scenario() -> None:
        async with silent_broker() as broker:
            producer = await started_producer(broker, transactional_id="app-0_0")
            await producer.send(TOPIC, b"in-flight")
            await until(lambda: b"in-flight" in broker.received)
            queued = await producer.send(TOPIC, b"queued")
            await asyncio.wait_for(runtime_transactions._close(producer, abort=True), 10)
            assert aiokafka_tasks() == []
            assert isinstance(queued.exception(), WritesAbandonedError)
            for _ in range(3):  # what the release woke up runs now, if anything still can
                await asyncio.sleep(0)
            assert aiokafka_tasks() == []
            assert broker.connections == 1
            assert EndTxnRequest.API_KEY not in broker.api_keys

    with caplog.at_level(logging.WARNING, "streamassign"):
        asyncio.run(scenario())
        assert asyncio_errors(caplog) == []
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("streamassign")]
    assert warnings == [
        "a task's producer did not close within 0.2 s (broker unreachable?): its "
        "unacknowledged writes are abandoned"
    ]


class Closes:
    def __init__(self, closed: list[str], name: str) -> None:
        self.closed, self.name = closed, name

    async def close(self) -> None:
        self.closed.append(self.name)


def test_a_failed_release_step_does_not_skip_the_next_ones(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One ``suppress`` around every step meant that the first step failing (an
    aiokafka that renamed ``_stop_heartbeat_task``) silently skipped closing the fetcher and
    the connections. Each step now runs on its own, and a failed one is logged."""
    closed: list[str] = []

    class Renamed:  # a consumer whose coordinator lacks the methods the release calls
        _coordinator = object()
        _fetcher = Closes(closed, "fetcher")
        _client = Closes(closed, "client")

    with caplog.at_level(logging.WARNING, "streamassign"):
        asyncio.run(closing.release_consumer("consumer 0", Renamed(), logging.getLogger("t")))
    assert closed == ["fetcher", "client"]
    assert "consumer 0: could not stop its heartbeat after its stop was cut" in caplog.text


def test_a_client_stop_raising_cancelled_error_is_a_cut_stop_not_a_cancel(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """aiokafka's fetcher re-raises its fetch tasks' cancellation from its close when the
    broker is away: the runtime's stop ended there (CancelledError out of ``App.stop``,
    the shared producer never stopped nor released). Now that stop is a cut one: False, so
    its caller releases the client and goes on with the next steps."""

    class FetcherCancelled:
        async def stop(self) -> None:
            raise asyncio.CancelledError

    async def stop() -> bool:
        return await closing.stop_within("consumer 0", FetcherCancelled(), "left", LOG)

    with caplog.at_level(logging.WARNING, "t"):
        assert asyncio.run(stop()) is False
    assert "consumer 0 did not stop cleanly (its stop raised CancelledError): left" in caplog.text


def test_a_release_step_raising_cancelled_error_does_not_skip_the_next_ones(
    caplog: pytest.LogCaptureFixture,
) -> None:
    closed: list[str] = []

    class FetcherCancelled:
        async def close(self) -> None:
            raise asyncio.CancelledError  # aiokafka's fetcher close, the broker away

    class Consumer:
        _coordinator = object()
        _fetcher = FetcherCancelled()
        _client = Closes(closed, "client")

    with caplog.at_level(logging.WARNING, "t"):
        asyncio.run(closing.release_consumer("consumer 0", Consumer(), LOG))
    assert closed == ["client"]
    assert "consumer 0: could not close its fetcher after its stop was cut (Cancelled" in (
        caplog.text
    )


def test_a_cancelled_stop_within_is_still_cancelled() -> None:
    async def cancel_the_stop() -> None:
        began = asyncio.Event()

        class Slow:
            async def stop(self) -> None:
                began.set()
                await asyncio.sleep(60)

        stopping = asyncio.ensure_future(closing.stop_within("c", Slow(), "left", LOG))
        await began.wait()  # cancelled inside the client's stop, not before it
        stopping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stopping

    asyncio.run(asyncio.wait_for(cancel_the_stop(), 5.0))


def test_the_aiokafka_parts_the_releases_reach_exist() -> None:
    """The releases reach aiokafka's private attributes; an upgrade that renames one must
    fail here rather than leave a cut client running with only a warning."""
    for cls, methods in (
        (GroupCoordinator, ["_stop_heartbeat_task", "_stop_commit_offsets_refresh_task"]),
        (Fetcher, ["close"]),
        (AIOKafkaClient, ["close"]),
        (Sender, ["sender_task", "_sender_routine"]),
        (MessageAccumulator, ["fail_all"]),
        (MessageBatch, ["failure"]),
    ):
        missing = [m for m in methods if not hasattr(cls, m)]
        assert not missing, f"{cls.__name__} lacks {missing}"
    # A consumer's parts exist once it started (no broker here): its start sets them.
    start = inspect.getsource(AIOKafkaConsumer.start) + inspect.getsource(AIOKafkaConsumer)
    batch = inspect.getsource(MessageBatch.__init__)
    for attribute in ("self._coordinator =", "self._fetcher =", "self._client ="):
        assert attribute in start, f"AIOKafkaConsumer no longer sets {attribute}"
    for attribute in ("self._msg_futures =", "self._drain_waiter ="):
        assert attribute in batch, f"MessageBatch no longer sets {attribute}"
    fetcher = inspect.getsource(Fetcher.__init__)
    assert "self._pending_tasks = set()" in fetcher, "Fetcher no longer keeps _pending_tasks"
    assert "self._fetch_task =" in fetcher, "Fetcher no longer keeps _fetch_task"

    async def producer_parts() -> None:
        producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:1")
        assert producer._closed is False  # what its stop sets, and its __del__ reads
        assert isinstance(producer._sender, Sender)
        accumulator = producer._message_accumulator
        assert isinstance(accumulator, MessageAccumulator)
        assert isinstance(accumulator._batches, dict)
        assert isinstance(accumulator._pending_batches, set)
        assert isinstance(producer.client, AIOKafkaClient)
        await producer.stop()  # never started: nothing to wait for
        assert producer._closed is True

    asyncio.run(producer_parts())
