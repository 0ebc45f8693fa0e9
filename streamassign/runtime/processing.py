"""The per-record path of active tasks: a fetched batch grouped by task, each record through its
task's processor, its writes and sends produced (see ``docs/runtime.md``, "Errors").

Records of a task that cannot run them now (restoring, torn, not this consumer's) are rewound,
so they are fetched again, never skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Literal

import attrs
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    IllegalOperation,
    ProducerFenced,
    TopicAuthorizationFailedError,
)

from .. import TaskId, TopicPartition
from ..aiokafka.rejoin import HeartbeatSilence
from ..errors import (
    MissingChangelogError,
    OutputNotAuthorizedError,
    StoreIOError,
    TransactionFailedError,
)
from ..errors import ProcessingError as ProcessingError
from ..topology import Topology
from ._clients import Clients
from ._topics import CHECK_TIMEOUT, ChangelogCheck
from .tasks import ActiveTask, Record, mark_of, tear, timestamp_of, undo

log = logging.getLogger("streamassign.runtime")

ErrorPolicy = Literal["stop", "skip"]

#: Records processed between two yields to the event loop. A processor that awaits nothing
#: and sends that do not fill a producer batch never yield: without this, a large fetch
#: (tens of thousands of records) would run as one step, its writes sent only after it and
#: heartbeats, status and queries held meanwhile.
YIELD_EVERY = 200


@attrs.define
class _Progress:
    """How far one batch got: whether a record ran (the deadline cuts only after one) and
    how many went through (for the yields)."""

    deadline: float | None
    started: bool = False
    done: int = 0

    def past_deadline(self) -> bool:
        return self.started and self.deadline is not None and time.monotonic() >= self.deadline


#: A consumer's heartbeat silence (seconds) this much short of its session timeout closes its
#: processing gate: the broker counts the session from a heartbeat's arrival, after its send,
#: so it cannot have expired the member earlier; as Faust's stall hold, two of its ticks.
GATE_MARGIN = 0.2

#: A closing silence is at least this much longer than the heartbeat interval: aiokafka lets
#: the interval come near the session timeout, and a silence of one interval is no sign.
GATE_INTERVAL_SLACK = 1.0

#: Seconds a gate's answer is reused for the check before each record (``CutOffGate.closed``'s
#: ``reuse``): a fresh one costs ~1.7 µs, 7 % of a record's path; this one ~0.2 µs.
GATE_REUSE = 0.05

#: Seconds between a gate watcher's looks (``CutOffGate.watch``) when no silence is due to
#: pass the threshold sooner: how late it sees a member id reset, or the gate open again, while
#: the consumer's loop waits elsewhere.
GATE_RELOOK = 1.0

#: A watcher wakes this long after the silence should pass the threshold (``closed`` asks
#: for more than the threshold; a timer may fire a clock tick early).
GATE_PAST = 0.001


@attrs.define(eq=False)
class CutOffGate:
    """Whether each consumer may process: not while it is probably out of its group without
    knowing it. A member cut off from the broker past its session timeout keeps what it
    fetched; at the heal it would process (and output) all of it before a refused request
    tells it its tasks run elsewhere. The gate closes when no heartbeat was accepted for the
    session less ``GATE_MARGIN`` (``HeartbeatSilence``), or when the membership is lost
    (aiokafka reset the member id: its heartbeat routine stops, so the silence reads 0,
    before the revoke callback); it opens at an accepted heartbeat or a new assignment. One
    WARNING when it closes, one INFO when it opens."""

    #: The consumers' session timeout (seconds), and the silence that closes the gate.
    session: float
    threshold: float
    silences: list[HeartbeatSilence]
    clock: Callable[[], float] = time.monotonic
    #: How ``watch`` waits, in ``clock``'s seconds (the event loop's clock is monotonic too).
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    #: Per consumer: since when its gate is closed (None: open), and the send time of its
    #: last accepted heartbeat then (to say why it opened).
    closed_since: list[float | None] = attrs.field(factory=list)
    answered_then: list[float] = attrs.field(factory=list)
    #: Per consumer: when its gate was last looked at (``reuse``), and its answer then.
    looked_at: list[float] = attrs.field(factory=list)
    answer: list[bool] = attrs.field(factory=list)

    @classmethod
    def of(
        cls,
        consumers: int,
        session: float,
        heartbeat_interval: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> CutOffGate:
        return cls(
            session=session,
            threshold=max(session - GATE_MARGIN, heartbeat_interval + GATE_INTERVAL_SLACK),
            silences=[HeartbeatSilence(clock) for _ in range(consumers)],
            clock=clock,
            sleep=sleep,
            closed_since=[None] * consumers,
            answered_then=[float("-inf")] * consumers,
            looked_at=[float("-inf")] * consumers,
            answer=[False] * consumers,
        )

    def closed(
        self, index: int, consumer: Any, lost: Callable[[int], bool], reuse: float = 0.0
    ) -> bool:
        """Is consumer ``index``'s gate closed now? ``lost(index)``: its membership is lost.
        An answer at most ``reuse`` seconds old is given again."""
        now = self.clock()
        if reuse and now - self.looked_at[index] < reuse:
            return self.answer[index]
        self.looked_at[index] = now
        silence = self.silences[index].seconds(consumer)
        cut_off = silence > self.threshold
        closed = cut_off or lost(index)
        if closed and self.closed_since[index] is None:
            self._closed(index, silence if cut_off else None)
        elif not closed and self.closed_since[index] is not None:
            self._opened(index)
        self.answer[index] = closed
        return closed

    async def watch(
        self, index: int, consumer: Any, lost: Callable[[int], bool], paused: Callable[[], bool]
    ) -> None:
        """Look at consumer ``index``'s gate as its silence passes the threshold (and at least
        every ``GATE_RELOOK`` s), whatever the consumer's loop awaits meanwhile: a commit
        under way at a cut waits for its own bounds (15 s measured), and the gate's WARNING,
        and the answer the check before each record reuses, would wait with it. Not while
        ``paused()`` (rebalancing: the membership reads lost until the new assignment).
        Runs until cancelled."""
        while True:
            wait = GATE_RELOOK
            if not paused() and not self.closed(index, consumer, lost):
                due = self.threshold - self.silences[index].seconds(consumer)
                wait = min(wait, max(due, 0.0) + GATE_PAST)
            await self.sleep(wait)

    def _closed(self, index: int, silence: float | None) -> None:
        self.closed_since[index] = self.clock()
        self.answered_then[index] = self.silences[index].answers.answered
        if silence is not None:
            log.warning(
                "consumer %d: no heartbeat accepted for %.1f s (session timeout %.1f s): "
                "cut off from its group's coordinator or the process paused, and evicted "
                "then; processing nothing (what it fetched is read again) until a heartbeat is "
                "accepted or it rejoins",
                index,
                silence,
                self.session,
            )
        else:  # INFO: aiokafka's reset is followed by the "out of the group" WARNING
            log.info(
                "consumer %d: its member id was reset (the broker no longer knows it): its "
                "tasks may run elsewhere; processing nothing (what it fetched is read "
                "again) until it rejoins",
                index,
            )

    def _opened(self, index: int) -> None:
        since = self.closed_since[index]
        self.closed_since[index] = None
        accepted = self.silences[index].answers.answered > self.answered_then[index]
        log.info(
            "consumer %d: processing again after %.1f s (%s)",
            index,
            self.clock() - (since or 0.0),
            "a heartbeat was accepted" if accepted else "assigned again after a rejoin",
        )


class Processing:
    """Runs records through the processors of the active tasks in ``actives``."""

    def __init__(
        self,
        topology: Topology,
        clients: Clients,
        actives: Mapping[TaskId, ActiveTask],
        errors: ErrorPolicy,
        transaction_failed: Callable[[ActiveTask, Exception], None] | None = None,
        check: ChangelogCheck | None = None,
    ) -> None:
        self.topology = topology
        #: Asked whether a changelog partition the producer does not know exists (a send to
        #: it would wait ``request_timeout_ms``, logging all along).
        self.check = check
        self.clients = clients
        self.actives = actives
        self.errors = errors
        #: Exactly once: called (after the task is torn) when a task's transaction failed
        #: (its producer fenced); the task waits for its restore, the loop goes on.
        self.transaction_failed = transaction_failed
        self.processed = 0
        self.skipped = 0
        #: (consumer, task) pairs whose records came to a consumer not running the task,
        #: warned about once until the task runs there.
        self._not_run: set[tuple[int, TaskId]] = set()

    async def process_batch(
        self,
        index: int,
        consumer: AIOKafkaConsumer,
        batch: Mapping[Any, list[Any]],
        deadline: float | None = None,
        current: Callable[[], bool] | None = None,
    ) -> None:
        """Process ``batch``; past ``deadline`` (``time.monotonic()``, after at least one
        record) the rest is rewound, read again after the commit the caller makes now: a
        batch slower than the transaction timeout still gets through (exactly once).

        Before every record, consumer ``index`` must still own the record's task (see
        ``owns``) and ``current()`` hold (the caller's consumer is still at the generation
        it fetched the batch in, and not rebalancing). If not, the batch stops there: the
        rest is neither applied nor sent, and rewound (a task that moved is read by its new
        owner from where this process's copy of it got to; see ``process``)."""
        by_task: dict[TaskId, list[list[Any]]] = {}
        for tp, records in batch.items():
            by_task.setdefault(self.topology.task_of(TopicPartition(*tp)), []).append(records)
        progress = _Progress(deadline)
        for task_id, lists in sorted(by_task.items()):
            task = self.actives.get(task_id)
            if not self._runs_here(index, task_id, task) or task is None:  # (None: for mypy)
                self.rewind(consumer, lists)  # read them again later
                continue
            batch_goes_on = await self._process_task_records(
                index, consumer, task, by_task, current, progress
            )
            if not batch_goes_on:
                return

    def _runs_here(self, index: int, task_id: TaskId, task: ActiveTask | None) -> bool:
        """Whether consumer ``index`` can run ``task``'s records now: an active of this
        process, not restoring, not torn, no record of it still running on a sibling consumer
        it moved from, on ``index``."""
        if task is not None and (task.torn or task.restoring or task.running is not None):
            log.debug(
                "consumer %d: task %s waits (its restore, or its record running on "
                "the consumer it moved from)",
                index,
                task_id,
            )
            return False
        if task is None or task.consumer != index:
            # The consumer loop pauses such partitions before its next fetch (``App``), so
            # this is once per episode, not a loop; the line is too (repeats at DEBUG).
            news = (index, task_id) not in self._not_run
            self._not_run.add((index, task_id))
            log.log(
                logging.WARNING if news else logging.DEBUG,
                "consumer %d: records of task %s it does not run: rewound, its partitions "
                "paused while it does not run here (repeats at DEBUG)",
                index,
                task_id,
            )
            return False
        self._not_run.discard((index, task_id))
        return True

    async def _process_task_records(
        self,
        index: int,
        consumer: AIOKafkaConsumer,
        task: ActiveTask,
        by_task: Mapping[TaskId, list[list[Any]]],
        current: Callable[[], bool] | None,
        progress: _Progress,
    ) -> bool:
        """``task``'s records of the batch; False when the batch stops here (the task moved,
        the consumer is rebalancing, or the deadline passed: the rest is rewound)."""
        lists = by_task[task.task_id]
        # Co-partitioned partitions of one task: in timestamp order, as Kafka Streams.
        ordered: Iterable[Any] = (
            lists[0] if len(lists) == 1 else heapq.merge(*lists, key=timestamp_of)
        )
        for record in ordered:
            if task.torn:  # its transaction failed: it re-reads from its committed offsets
                return True
            moved = not self.owns(index, task)
            if moved or not (current is None or current()):
                log.log(
                    logging.WARNING if moved else logging.INFO,
                    "consumer %d: task %s %s: the rest of its batch is rewound, not processed",
                    index,
                    task.task_id,
                    "moved" if moved else "stopped (its consumer rebalancing or cut off)",
                )
                self._rewind_unprocessed(consumer, task, by_task)
                return False
            if progress.past_deadline():
                self._rewind_unprocessed(consumer, task, by_task)
                return False
            progress.started = True
            task.running = index
            try:
                went_through = await self.process(task, record, owner=index)
            finally:
                task.running = None
            if not went_through:  # moved while it ran: checked again just above
                continue
            progress.done += 1
            if progress.done % YIELD_EVERY == 0:
                await asyncio.sleep(0)
        return True

    def owns(self, index: int, task: ActiveTask) -> bool:
        """Whether consumer ``index`` still runs ``task``: the task is still this process's
        active (not revoked, not replaced by a restored copy) and still on ``index`` (with
        several consumers per process, a rebalance can move it to a sibling consumer while
        ``index`` is inside a long batch: ``index`` then must not process it any more)."""
        return self.actives.get(task.task_id) is task and task.consumer == index

    def _rewind_unprocessed(
        self,
        consumer: AIOKafkaConsumer,
        task: ActiveTask,
        by_task: Mapping[TaskId, list[list[Any]]],
    ) -> None:
        """Past the deadline in ``task``: rewind its records not processed yet, and every
        record of the tasks after it."""
        for records in by_task[task.task_id]:
            if records:
                first = records[0]
                tp = TopicPartition(first.topic, first.partition)
                offset = max(first.offset, task.offsets.get(tp, first.offset))
                with contextlib.suppress(Exception):  # no longer assigned: nothing to rewind
                    consumer.seek(KafkaTopicPartition(*tp), offset)
        for task_id, lists in sorted(by_task.items()):
            if task_id > task.task_id:
                self.rewind(consumer, lists)

    @staticmethod
    def rewind(consumer: AIOKafkaConsumer, batches: Iterable[list[Any]]) -> None:
        """Seek back to the first record of every partition in ``batches`` that is still
        assigned, so records fetched but not processed are fetched again, never skipped."""
        for records in batches:
            if records:
                first = records[0]
                tp = KafkaTopicPartition(first.topic, first.partition)
                with contextlib.suppress(Exception):  # no longer assigned: nothing to rewind
                    consumer.seek(tp, first.offset)

    async def process(self, task: ActiveTask, record: Record, owner: int | None = None) -> bool:
        """Process one record of ``task``. False: the task moved away from consumer
        ``owner`` while its processor ran; the record's writes are undone, nothing of it is
        sent, and its new owner processes it."""
        tp = TopicPartition(record.topic, record.partition)
        stores = task.stores.values()
        mark = mark_of(record)
        if self._skip_if_processed(task, tp, record.offset, mark):
            return True
        task.current, task.mark, task.sends = record, mark, 0
        try:
            await task.processor.process(task.context, record)
        except Exception as exc:
            undo(task)
            if owner is not None and not self.owns(owner, task):
                return False  # its new owner processes it (and meets the error, if any)
            self._processor_failed(task, record, exc)
        except BaseException:  # cancelled (or interrupted) mid-record: commit none of it
            undo(task)
            if owner is None or self.owns(owner, task):  # else its new owner's, untouched
                tear(task)
            raise
        finally:
            task.current = task.mark = None
        if owner is not None and not self.owns(owner, task):
            undo(task)  # moved meanwhile: the record is neither applied nor sent here
            return False
        task.journal.clear()
        for s in stores:
            s.mark_processed(*mark)
        try:
            await self.send_outbox(task)
        except TransactionFailedError as exc:  # exactly once: its transaction is lost
            tear(task)
            if self.transaction_failed is None:
                raise
            self.transaction_failed(task, exc)
            return True
        except BaseException:  # part of the record's writes may be out: commit none of them
            tear(task)
            raise
        task.offsets[tp] = record.offset + 1
        task.processed += 1
        self.processed += 1
        return True

    def _skip_if_processed(
        self, task: ActiveTask, tp: TopicPartition, offset: int, mark: tuple[str, int]
    ) -> bool:
        """Whether ``task`` already processed the record at ``offset`` (then counted as
        skipped): below the task's offset (processed, not committed yet, on a sibling
        consumer it moved from or before a commit of its input offsets failed), or marked
        seen by every store (a replay after a crash, a rebalance or a move)."""
        done = task.offsets.get(tp)
        stores = task.stores.values()
        already = done is not None and offset < done
        if not (already or (stores and all(s.seen(*mark) for s in stores))):
            return False
        task.skipped += 1
        self.skipped += 1
        task.offsets[tp] = max(offset + 1, done or 0)
        return True

    def _processor_failed(self, task: ActiveTask, record: Record, exc: Exception) -> None:
        """The processor raised on ``record``: stop (``ProcessingError``) or skip it, as the
        error policy says. A store's own failure (a damaged block, a failing disk) stops
        whatever the policy: skipping would drop every record that touches it, for good."""
        if self.errors == "stop" or isinstance(exc, StoreIOError):
            raise ProcessingError(
                f"task {task.task_id}: processing {record.topic}-{record.partition}"
                f"@{record.offset} failed: {exc!r}"
            ) from exc
        log.warning(
            "task %s: skipped %s-%d@%d after the processor raised %r",
            task.task_id,
            record.topic,
            record.partition,
            record.offset,
            exc,
        )

    async def send_outbox(self, task: ActiveTask) -> None:
        """Produce the task's outbox (exactly once: in its transaction; a fenced or failed
        producer raises ``TransactionFailedError``)."""
        if not task.outbox:
            return
        producer = await self.clients.producer_for(task.task_id)
        changelogs = task.by_changelog
        for topic, partition, key, value, headers in task.outbox:
            state = (
                changelogs.get(TopicPartition(topic, partition)) if partition is not None else None
            )
            if (
                state is not None
                and self.check is not None
                and not _known(producer.producer, state.changelog)
            ):
                await self._check_changelog(producer.producer, self.check, state.changelog)
            try:
                sent = await producer.send(
                    topic, value, key=key, partition=partition, headers=headers
                )
            except (ProducerFenced, IllegalOperation) as exc:  # only transactional ones do
                raise TransactionFailedError(f"task {task.task_id}: {exc!r}") from exc
            except (TopicAuthorizationFailedError, ClusterAuthorizationFailedError) as exc:
                # raised while the send waits for the topic's metadata, before any ack
                raise OutputNotAuthorizedError(
                    f"task {task.task_id}: writing to topic {topic!r} not authorized for "
                    f"{self.clients.principal}: grant WRITE on topic {topic!r} ({exc!r}); "
                    "nothing committed, stopping (it would be refused again)"
                ) from exc
            task.futures.append(sent)
            if state is not None:
                state.produced()
        task.outbox.clear()

    async def _check_changelog(
        self, producer: AIOKafkaProducer, check: ChangelogCheck, changelog: TopicPartition
    ) -> None:
        """Before a send to ``changelog``, which ``producer``'s metadata lacks: its metadata
        refreshed, and if still lacking the broker asked, so a deleted changelog (or one
        without this partition) stops the application (``MissingChangelogError``) rather
        than the send waiting (``request_timeout_ms``, ~1,000 log lines a second) and the
        application going on without committing. Anything else: the send goes on. At most
        every ``CHECK_INTERVAL`` s (``check.due``): in an outage each ask may take up to
        twice ``CHECK_TIMEOUT``, and every send would ask."""
        if not check.due():
            return
        with contextlib.suppress(Exception):  # unreachable: the send waits as it would
            async with asyncio.timeout(CHECK_TIMEOUT):
                await producer.client.add_topic(changelog.topic)  # first send: not tracked yet
                if not _known(producer, changelog):
                    await producer.client.force_metadata_update()
        if _known(producer, changelog):
            return
        try:
            await check.refuse_missing([changelog])
        except MissingChangelogError:
            raise
        except Exception:  # not known (the cluster away?): the send goes on
            pass


def _known(producer: AIOKafkaProducer, tp: TopicPartition) -> bool:
    """Whether ``producer``'s metadata has partition ``tp`` (a send to it waits for none)."""
    client = getattr(producer, "client", None)
    if client is None:  # a stand-in producer without metadata (unit tests)
        return True
    return client.cluster.leader_for_partition(tp) is not None  # O(1): asked per record
