"""A task's transactional producer whose aiokafka sender died (its transactional id refused,
fenced by a newer owner, a sequence out of order) leaves nothing for asyncio to print as
"Future exception was never retrieved" once the runtime drops it: the failure reached the
runtime through the writes it awaited; the futures aiokafka failed besides (the
transaction's waiter, each held batch's drain waiter) are marked seen when it closes. Nor do
markers already sent when a later marker's send raises."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.errors import (
    KafkaError,
    OutOfOrderSequenceNumber,
    ProducerFenced,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)

from streamassign import TaskId, TopicPartition
from streamassign.aiokafka.closing import mark_failures_seen
from streamassign.runtime.changelog import StoreState
from streamassign.runtime.commits import _send_markers
from streamassign.runtime.stores import MemoryStore
from streamassign.runtime.transactions import TaskProducers

TASK = TaskId(0, 0)
HELD = [KafkaTopicPartition("app-counts-changelog", 0), KafkaTopicPartition("out", 0)]


def unretrieved_failures() -> list[str]:
    """The live futures whose failure nobody retrieved (each one asyncio would print as
    "Future exception was never retrieved" when collected)."""
    futures = [o for o in gc.get_objects() if isinstance(o, asyncio.Future)]
    return [repr(f) for f in futures if f.done() and getattr(f, "_log_traceback", False)]


def noticing(printed: list[str]) -> None:
    """Collect in ``printed`` what the running loop would print."""
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: printed.append(context["message"]))


async def dead_producer(error: KafkaError) -> tuple[AIOKafkaProducer, list[asyncio.Future[Any]]]:
    """A producer in a transaction holding a batch for each of ``HELD``, whose sender died
    with ``error`` (aiokafka's own callback for that ran); and its writes' futures."""
    producer = AIOKafkaProducer(bootstrap_servers="unused:1", transactional_id="app-0_0")
    internals: Any = producer
    internals._txn_manager.set_pid_and_epoch(1, 0)
    await producer.begin_transaction()
    accumulator = internals._message_accumulator
    writes = [await accumulator.add_message(tp, b"k", b"v", timeout=1) for tp in HELD]

    async def sender_routine() -> None:
        raise error

    sender = asyncio.ensure_future(sender_routine())
    await asyncio.wait([sender])
    internals._sender._fail_all(sender)
    return producer, writes


@pytest.mark.parametrize(
    "error",
    [TransactionalIdAuthorizationFailed("app-0_0"), ProducerFenced(), OutOfOrderSequenceNumber()],
    ids=["refused", "fenced", "out-of-order"],
)
def test_a_dead_producers_failures_are_not_printed_once_it_is_dropped(error: KafkaError) -> None:
    printed: list[str] = []

    async def run() -> None:
        noticing(printed)
        producer, writes = await dead_producer(error)
        with pytest.raises(type(error)):
            await asyncio.gather(*writes)  # how the runtime learns it (its commit's ack wait)
        producers = TaskProducers("app", "unused:1", {})
        producers.producers[TASK] = producer
        producers.open.add(TASK)
        producers.fail(TASK)  # closed in the background, its transaction aborted
        await producers.stop()
        assert TASK not in producers.producers
        del producer, writes, producers
        gc.collect()

    asyncio.run(run())
    gc.collect()
    assert unretrieved_failures() == []
    assert printed == []


def test_markers_sent_before_a_send_raises_are_not_printed() -> None:
    printed: list[str] = []
    died = ProducerFenced()

    class DyingProducer:
        """Takes one marker (acknowledged with ``died`` later), then refuses to send."""

        def __init__(self) -> None:
            self.sent: list[asyncio.Future[Any]] = []

        async def send(self, *_: Any, **__: Any) -> asyncio.Future[Any]:
            if self.sent:
                raise died
            self.sent.append(asyncio.get_running_loop().create_future())
            return self.sent[-1]

    async def run() -> None:
        noticing(printed)
        producer = DyingProducer()
        states = [
            StoreState.open(name, TopicPartition(f"app-{name}-changelog", 0), MemoryStore())
            for name in ("counts", "sums")
        ]
        with pytest.raises(ProducerFenced):
            await _send_markers(producer, states)  # type: ignore[arg-type]
        producer.sent[0].set_exception(died)
        await asyncio.sleep(0)  # its callbacks run
        del producer
        gc.collect()

    asyncio.run(run())
    gc.collect()
    assert unretrieved_failures() == []
    assert printed == []


def test_an_abortable_failure_is_not_printed_once_the_transaction_is_aborted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A write refused (no WRITE on the output) fails the transaction's waiter; the abort
    replaces that waiter, so it must be marked seen before the abort, not only at the end."""
    printed: list[str] = []

    async def run() -> None:
        noticing(printed)
        producer = AIOKafkaProducer(bootstrap_servers="unused:1", transactional_id="app-0_0")
        internals: Any = producer
        internals._txn_manager.set_pid_and_epoch(1, 0)
        await producer.begin_transaction()
        internals._txn_manager.error_transaction(TopicAuthorizationFailedError("out"))

        async def abort_as_aiokafka_begins_it(manager: Any = internals._txn_manager) -> None:
            manager.aborting_transaction()  # no broker to finish it

        monkeypatch.setattr(producer, "abort_transaction", abort_as_aiokafka_begins_it)
        producers = TaskProducers("app", "unused:1", {})
        producers.producers[TASK] = producer
        producers.open.add(TASK)
        producers.fail(TASK)
        await producers.stop()
        del producer, internals, producers
        gc.collect()

    asyncio.run(run())
    gc.collect()
    assert unretrieved_failures() == []
    assert printed == []


def test_marking_failures_seen_never_raises_on_another_shape() -> None:
    """A close goes on whatever aiokafka's internals look like."""

    class Batch:
        pass

    odd = type("Producer", (), {})()
    odd._message_accumulator = type("Accumulator", (), {"_batches": {"tp": [Batch()]}})()
    odd._txn_manager = object()
    mark_failures_seen(odd)
    mark_failures_seen(None)
