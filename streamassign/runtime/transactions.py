"""One transactional producer per active task, for ``processing_guarantee="exactly_once"``.

Why per task (Kafka Streams' EOS "alpha", Faust's design): aiokafka 0.14 sends
``TxnOffsetCommit`` v0, which carries no member id and no generation, so the group coordinator
cannot fence a zombie by its group metadata (KIP-447, EOS v2). What fences it is the
transactional id: the task's id is derived from the application id and the task id, so the
task's next owner, initialising its producer (``renew``), bumps the producer epoch, aborts the
zombie's open transaction and makes every later write or commit of the zombie fail
(``ProducerFenced``). A producer that failed once is never used again: the task is torn and
gets a new producer only when an assignment gives it back (``renew`` from a rebalance
callback), so a zombie never fences the task's real owner.

At least once, ``OrphanTransactions`` does the same init for a task whose changelog holds an
open transaction when it starts (an exactly-once owner crashed just before a switch of modes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.errors import (
    ConcurrentTransactions,
    IllegalOperation,
    InvalidProducerEpoch,
    InvalidProducerIdMapping,
    InvalidTxnState,
    KafkaError,
    KafkaTimeoutError,
    OutOfOrderSequenceNumber,
    ProducerFenced,
    TransactionalIdAuthorizationFailed,
)

from .. import TaskId, TopicPartition
from ..aiokafka import closing
from ..aiokafka.floods import back_off_metadata_updates
from ..errors import (
    ProducerStartError,
    TransactionalIdNotAuthorizedError,
    TransactionFailedError,
    WritesAbandonedError,
)
from .end_offsets import list_offsets

log = logging.getLogger("streamassign.runtime")

#: Seconds a task's producer may take to start (find its transaction coordinator, initialise
#: its producer id), retries included. aiokafka retries COORDINATOR_NOT_AVAILABLE forever,
#: and this runs inside a rebalance callback: unbounded, the rebalance and ``stop()`` hang.
START_TIMEOUT = 60.0

#: Seconds between two tries to start a producer after a retriable error.
START_BACKOFF = 1.0

#: At least once: seconds the check for open transactions (``ListOffsets``) and the producer
#: inits that abort them may take each (in a rebalance callback). Past it the task's
#: restore goes on without them.
ORPHANS_TIMEOUT = 10.0

#: A transaction failing with one of these is cured by a new producer after a rejoin: it was
#: fenced by a newer owner, or is in a state only a new producer leaves (the broker aborted
#: it at its timeout, or aiokafka refuses an operation in the transaction's state), or
#: timed out, or its writes were abandoned (a producer released after its stop was cut:
#: the broker was unreachable, a passing condition).
_FENCING = (
    ProducerFenced,
    InvalidProducerEpoch,
    InvalidTxnState,
    InvalidProducerIdMapping,
    ConcurrentTransactions,
    OutOfOrderSequenceNumber,
    IllegalOperation,
    KafkaTimeoutError,
    WritesAbandonedError,
)


def rejoin_cures(exc: BaseException) -> bool:
    """Whether a failed transaction is retried (task torn, restored with a new producer after
    a rejoin) rather than stopping the application: fencing and transaction-state errors,
    retriable ones and timeouts, abandoned writes, and a task without producer (failed
    before). A record the broker rejects (too large, keyless to a compacted topic, not
    authorised) fails again."""
    if isinstance(exc, TransactionFailedError) and exc.__cause__ is None:
        return True
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, _FENCING):
            return True
        if isinstance(cause, KafkaError) and cause.retriable:
            return True
        cause = cause.__cause__
    return False


def transactional_id(application_id: str, task: TaskId) -> str:
    """The transactional id of ``task``'s producer: the same on every process."""
    return f"{application_id}-{task}"


def transactional_id_refused(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) is the broker refusing a
    transactional id: the principal lacks WRITE on it."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, TransactionalIdAuthorizationFailed):
            return True
        cause = cause.__cause__
    return False


def transactional_id_refusal(application_id: str, task: TaskId, principal: str) -> str:
    """The words naming the ACL that ``task``'s refused transactional id needs."""
    txn_id = transactional_id(application_id, task)
    return (
        f"transactional id {txn_id!r} not authorized for {principal}: grant WRITE on "
        f"transactional id {txn_id!r} (a PREFIXED ACL on {application_id + '-'!r} covers "
        "every task's producer)"
    )


class TaskProducers:
    """The transactional producer of each active task of this process, and its transaction."""

    def __init__(
        self,
        application_id: str,
        bootstrap_servers: str,
        config: Mapping[str, Any],
        start_timeout: float = START_TIMEOUT,
        principal: str = "the application's principal",
    ):
        self.application_id = application_id
        self.bootstrap_servers = bootstrap_servers
        self.config = dict(config)
        self.start_timeout = start_timeout
        #: Who the producers write as (``_clients.principal``), for a refused id's line.
        self.principal = principal
        self.producers: dict[TaskId, AIOKafkaProducer] = {}
        #: Tasks with a transaction begun and not committed or aborted yet.
        self.open: set[TaskId] = set()
        #: Producers closing in the background (``stop`` waits for them).
        self.closing: set[asyncio.Future[None]] = set()

    async def renew(self, task: TaskId) -> None:
        """A new producer for ``task``, initialised: from here on every earlier producer of
        the task (here or on a zombie) is fenced and its open transaction aborted. Call only
        when an assignment gave the task to this process. Retriable errors are tried again
        until ``start_timeout``; raises ``ProducerStartError`` (the application stops), a
        ``TransactionalIdNotAuthorizedError`` naming the ACL when the id is refused."""
        self.close(task)
        try:
            async with asyncio.timeout(self.start_timeout):
                while True:
                    try:
                        self.producers[task] = await self._start(task)
                        return
                    except KafkaError as exc:
                        if not exc.retriable:
                            raise
                        log.warning("task %s: producer start failed (%r); retrying", task, exc)
                    await asyncio.sleep(START_BACKOFF)
        except TimeoutError as exc:
            raise ProducerStartError(
                f"task {task}: its transactional producer did not start within "
                f"{self.start_timeout:g} s (no transaction coordinator: is the broker's "
                "transaction.state.log.replication.factor (default 3) above its number of "
                "brokers, or transaction.state.log.min.isr not met?)"
            ) from exc
        except Exception as exc:  # a bad configuration, a rejected id or timeout
            if transactional_id_refused(exc):
                raise TransactionalIdNotAuthorizedError(
                    f"task {task}: its transactional producer cannot start: "
                    + transactional_id_refusal(self.application_id, task, self.principal)
                ) from exc
            raise ProducerStartError(
                f"task {task}: its transactional producer cannot start: {exc!r}"
            ) from exc

    async def _start(self, task: TaskId) -> AIOKafkaProducer:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap_servers,
            transactional_id=transactional_id(self.application_id, task),
            **self.config,
        )
        back_off_metadata_updates(producer)
        try:
            await producer.start()  # InitProducerId: fences, waits for the old transaction
        except BaseException:
            self._close_later(producer, False)
            raise
        return producer

    async def sending(self, task: TaskId) -> AIOKafkaProducer:
        """``task``'s producer, in a transaction (begun now if none is open)."""
        producer = self.producers.get(task)
        if producer is None:
            raise TransactionFailedError(f"task {task} has no producer (it failed before)")
        if task not in self.open:
            try:
                await producer.begin_transaction()
            except Exception as exc:
                raise TransactionFailedError(f"task {task}: begin failed: {exc!r}") from exc
            self.open.add(task)
        return producer

    async def commit(
        self, task: TaskId, offsets: Mapping[KafkaTopicPartition, int], group_id: str
    ) -> None:
        """Add ``offsets`` (input offsets of ``group_id``) to ``task``'s transaction and commit
        it; raises ``TransactionFailedError`` (then call ``fail``)."""
        producer = await self.sending(task)
        try:
            if offsets:
                await producer.send_offsets_to_transaction(dict(offsets), group_id)
            await producer.commit_transaction()
        except Exception as exc:
            raise TransactionFailedError(f"task {task}: commit failed: {exc!r}") from exc
        self.open.discard(task)

    def fail(self, task: TaskId) -> None:
        """``task``'s transaction failed: its producer is closed (its open transaction is
        aborted, or is by the task's next owner) and not replaced until ``renew``."""
        self.close(task)

    def close(self, task: TaskId) -> None:
        """Close ``task``'s producer in the background, aborting its open transaction."""
        producer = self.producers.pop(task, None)
        was_open = task in self.open
        self.open.discard(task)
        if producer is not None:
            self._close_later(producer, was_open)

    def _close_later(self, producer: AIOKafkaProducer, abort: bool) -> None:
        closing = asyncio.ensure_future(_close(producer, abort))
        self.closing.add(closing)
        closing.add_done_callback(self.closing.discard)

    async def stop(self) -> None:
        """Close every producer (aborting open transactions) and wait for them."""
        for task in list(self.producers):
            self.close(task)
        if self.closing:
            await asyncio.gather(*self.closing, return_exceptions=True)


async def _close(producer: AIOKafkaProducer, abort: bool) -> None:
    """Abort (best effort: a fenced producer cannot) and stop, bounded by
    ``closing.CLOSE_TIMEOUT``; cut, or failed (a ``CancelledError`` raised while this close
    is not cancelled too, as in ``closing.stop_within``), what the stop left running is
    released (the next owner's init fences its transaction, but its sender and connections
    would run on)."""
    try:
        async with asyncio.timeout(closing.CLOSE_TIMEOUT):
            if abort:
                # An abortable error (a write refused) failed the transaction's waiter, which
                # the abort replaces: seen first, or asyncio prints it.
                closing.mark_failures_seen(producer)
                with contextlib.suppress(Exception):
                    await producer.abort_transaction()
            await producer.stop()
    except TimeoutError:  # its sender would deliver what it holds whenever the broker is back
        log.warning(
            "a task's producer did not close within %g s (broker unreachable?): its "
            "unacknowledged writes are abandoned",
            closing.CLOSE_TIMEOUT,
        )
        await closing.release_producer("a task's producer", producer, log)
    except asyncio.CancelledError:  # a request task's, which its sender awaited
        if closing.cancelled_itself():
            raise
        log.warning("a task's producer did not close cleanly (its stop raised CancelledError)")
        await closing.release_producer("a task's producer", producer, log)
    except Exception as exc:  # the broker aborts it at the next owner's init or its timeout
        log.warning("a task's producer did not close cleanly (%r)", exc)
        # aiokafka marked it closed before the failed step: the steps after it never run.
        await closing.release_producer("a task's producer", producer, log)
    finally:
        closing.mark_failures_seen(producer)


class OrphanTransactions:
    """At least once: the transactions an exactly-once owner of a task left open when it
    crashed (the application was switched to at least once right after).

    Until the broker aborts such a transaction (``transaction_timeout_ms``), it holds the
    changelog partition's last stable offset back: the task's restore, which reads
    ``read_committed``, stops there, while its at-least-once writes land past the open
    transaction, so each commit's end check fails and the consumer rejoins, every commit
    interval, group-wide. ``abort`` does what an exactly-once owner does when a task starts:
    it initialises a producer with the task's transactional id (``renew``), which fences the
    crashed owner and aborts its transaction, and closes it. Only for tasks whose changelogs
    have a last stable offset below their high watermark: the cost is otherwise two
    ``ListOffsets`` requests per rebalance that starts stateful tasks (each falling back to
    one per partition, see ``end_offsets.list_offsets``, so a leaderless partition costs
    seconds, not the whole ``timeout``). Only changelog partitions are checked: an open
    transaction of a stateless task, or one holding only output writes, is not aborted here
    (its readers ``read_committed`` wait for the broker's ``transaction_timeout_ms``).
    """

    def __init__(
        self,
        application_id: str,
        bootstrap_servers: str,
        producer_config: Mapping[str, Any],
        connection_config: Mapping[str, Any],
        timeout: float = ORPHANS_TIMEOUT,
        principal: str = "the application's principal",
    ):
        self.producers = TaskProducers(
            application_id,
            bootstrap_servers,
            producer_config,
            start_timeout=timeout,
            principal=principal,
        )
        self.bootstrap_servers = bootstrap_servers
        self.connection_config = dict(connection_config)
        self.timeout = timeout
        #: Reads high watermarks (``read_uncommitted``); started at the first check, once
        #: (``_starting``: two consumers' first checks may run at once).
        self._highwater: AIOKafkaConsumer | None = None
        self._starting = asyncio.Lock()

    async def abort(
        self, stable: AIOKafkaConsumer, changelogs: Mapping[TaskId, Sequence[TopicPartition]]
    ) -> set[TaskId]:
        """Abort the open transactions in the changelogs of the tasks of ``changelogs`` (their
        changelog partitions); ``stable`` reads ``read_committed`` (last stable offsets).
        Returns the tasks whose producer was initialised. A failure is logged, not raised:
        the restore then reads to the last stable offset, as without this step, and the
        broker aborts the transaction at its timeout."""
        try:
            tasks = await asyncio.wait_for(self._open(stable, changelogs), self.timeout)
        except Exception as exc:  # a KafkaError, a timeout: the broker aborts it in time
            log.warning("open transactions in changelogs not checked (%r)", exc)
            return set()
        try:
            results = await asyncio.gather(
                *(self.producers.renew(t) for t in tasks), return_exceptions=True
            )
        finally:  # also when cancelled: no producer left open
            await self.producers.stop()
        aborted = set()
        for task, result in zip(tasks, results, strict=True):
            if isinstance(result, asyncio.CancelledError):
                raise result
            if isinstance(result, BaseException):
                log.warning(
                    "task %s: the open transaction in its changelog was not aborted (%r); "
                    "its restore stops before it until the broker aborts it",
                    task,
                    result,
                )
            else:
                aborted.add(task)
        if aborted:
            log.info(
                "tasks %s: an earlier exactly-once owner's open transactions aborted "
                "(transactional producers initialised and closed)",
                ", ".join(map(str, sorted(aborted))),
            )
        return aborted

    async def _open(
        self, stable: AIOKafkaConsumer, changelogs: Mapping[TaskId, Sequence[TopicPartition]]
    ) -> list[TaskId]:
        """The tasks with a changelog partition whose last stable offset is below its high
        watermark (an open transaction, or one whose markers are still being written)."""
        tps = sorted({KafkaTopicPartition(*tp) for tps in changelogs.values() for tp in tps})
        if not tps:
            return []
        highwater = await self._highwater_consumer()
        # The high watermarks first: a last stable offset read after them and still below one
        # is held back by a transaction open since before (at least once writes move both
        # ends alike; read the other way round, a write in between looks like a transaction).
        # A partition either lookup misses (no leader) is not checked.
        hw = await list_offsets(highwater, tps)
        lso = await list_offsets(stable, tps)
        return [
            task
            for task, partitions in sorted(changelogs.items())
            if any(tp in hw and tp in lso and lso[tp] < hw[tp] for tp in map(_kafka, partitions))
        ]

    async def _highwater_consumer(self) -> AIOKafkaConsumer:
        async with self._starting:
            if self._highwater is None:
                consumer = AIOKafkaConsumer(
                    bootstrap_servers=self.bootstrap_servers,
                    enable_auto_commit=False,
                    isolation_level="read_uncommitted",
                    **self.connection_config,
                )
                try:
                    await consumer.start()
                except BaseException:
                    with contextlib.suppress(Exception):
                        await consumer.stop()
                    raise
                self._highwater = consumer
            return self._highwater

    async def stop(self) -> None:
        await self.producers.stop()
        if self._highwater is not None:
            await self._highwater.stop()
            self._highwater = None


def _kafka(tp: TopicPartition) -> KafkaTopicPartition:
    return KafkaTopicPartition(*tp)
