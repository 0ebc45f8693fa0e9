"""Commits of active tasks, and the checks that keep a member that left the group from
committing stale state (issue 21; see ``docs/runtime.md``, "Exact table state" and "Members
that drop out of the group").

A commit: data and output acks, then a commit marker per store with pending writes (only if
this member still holds its membership and nobody else wrote the changelog since), then the
local stores and checkpoints, then the input offsets.

At least once, a member that stopped (a pause, a stalled VM) after its end check and before
its markers went out sends them when it wakes, after the records of the task's new owner. So
only a member the broker still accepts writes over another writer's records: before it does,
it commits again input offsets the group holds (``fence``, the *membership fence*), which
the group coordinator refuses for an evicted member or a stale generation. This costs one
round trip, and only when another writer's records were found.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Awaitable, Iterable, Iterator, Mapping, Sequence, Set
from typing import Any, TypeVar

from aiokafka import AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    CommitFailedError,
    InvalidTopicError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    PolicyViolationError,
    RecordListTooLargeError,
    TopicAuthorizationFailedError,
    UnsupportedForMessageFormatError,
)

from .. import TaskId, TopicPartition
from ..aiokafka.closing import retrieve_failure
from ..aiokafka.streams import ProcessHost
from ..errors import (
    ChangelogReadTimeoutError,
    CommitRetriesExhaustedError,
    EndOffsetsTimeoutError,
    InternalTopicError,
    MissingChangelogError,
    OutputNotAuthorizedError,
    OutputWriteError,
    ReassertionFailedError,
)
from ._clients import Clients
from .changelog import COMMIT_KEY, StoreState
from .restore import ChangelogLookups
from .task_stores import TaskStores
from .tasks import ActiveTask, tear
from .transactions import (
    TaskProducers,
    rejoin_cures,
    transactional_id_refusal,
    transactional_id_refused,
)

log = logging.getLogger("streamassign.runtime")

#: Seconds one commit (from its end check on: one deadline, shared by its fences and every
#: reassertion) goes on reading the keys other writers wrote before its markers while a
#: changelog cannot be read in time (a consumer that is rebalancing tries once). After that
#: the owner writes its pending values again, so none is lost, and the task is torn and
#: restored. Also the fence's no-answer limit: a member the broker has not answered by then
#: is taken for evicted (so this assumes ``session_timeout_ms`` below it; aiokafka's default
#: is 10 s).
REASSERT_PATIENCE = 120.0

#: Seconds the membership fence waits for the group coordinator (aiokafka retries retriable
#: errors until then); no answer in time confirms nothing either way.
FENCE_TIMEOUT = 15.0
#: Seconds a commit waits for its writes' acks before it asks whether the changelogs still
#: exist (sends to a deleted one are retried for ``request_timeout_ms``, 40 s by default).
ACKS_CHECK_AFTER = 5.0

T = TypeVar("T")

#: Seconds between two tries of the membership fence that got no answer.
FENCE_BACKOFF = 1.0
#: Seconds the consumer loop waits after its first commit that failed on a passing broker
#: error (``Commits.commit_or_retry``), doubled at each failure in a row up to
#: ``RETRY_BACKOFF_MAX``.
RETRY_BACKOFF = 0.5
RETRY_BACKOFF_MAX = 8.0
#: Seconds of such failures in a row after which the application stops: an error that lasts
#: (``min.insync.replicas`` above the live replicas, a deleted output partition) would have
#: it tear, rejoin and replay its input for good (Kafka Streams' ``task.timeout.ms`` default).
RETRY_LIMIT = 300.0


class Membership(enum.Enum):
    """What the membership fence (``Commits.fence``) learnt of a member."""

    #: The broker accepted it in the generation its tasks were assigned in.
    HELD = "held"
    #: Refused, reset by aiokafka, or no answer in time: its tasks are torn, it rejoins.
    LOST = "lost"
    #: Nothing to commit again: the group holds no input offset of its tasks.
    UNPROVEN = "unproven"


class Commits:
    """Commits the active tasks in ``actives``, consumer by consumer."""

    def __init__(
        self,
        host: ProcessHost,
        clients: Clients,
        actives: Mapping[TaskId, ActiveTask],
        lookups: ChangelogLookups,
        stores: TaskStores,
        rebalancing: Set[int] = frozenset(),
    ) -> None:
        self.host = host
        self.clients = clients
        self.actives = actives
        self.lookups = lookups
        self.stores = stores
        #: Consumers whose rebalance has started (the app's set): their group waits.
        self.rebalancing = rebalancing
        #: Per consumer, its commits failed in a row on a passing broker error, and when
        #: the first failed (``commit_or_retry``).
        self.failing: dict[int, tuple[int, float]] = {}

    async def commit(self, index: int) -> None:
        """Data and output acks, then changelog markers and their acks, then local stores and
        checkpoints, then input offsets. A failed write raises before any marker is produced,
        so no marker ever closes writes the changelog may not hold."""
        if self.clients.task_producers is not None:
            await self.commit_transactions(index)
            return
        tasks = self.committable(index)
        with busy(tasks, index):
            await self._commit_tasks(index, tasks)

    def committable(self, index: int) -> list[ActiveTask]:
        """``index``'s tasks that can commit now: not torn, not restoring, no record of
        theirs running (on a sibling consumer they moved from), no commit of theirs under way."""
        return [
            t
            for t in self.actives.values()
            if t.consumer == index and not t.torn and not t.restoring and t.running is None
        ]

    async def _commit_tasks(self, index: int, tasks: list[ActiveTask]) -> None:
        producer = self.clients.producer
        assert producer is not None
        futures = [f for t in tasks for f in t.futures]
        if futures:  # a failed write raises: nothing is committed
            await self.checked(_acks(index, futures), tasks)
        for task in tasks:
            task.futures.clear()
        dirty = [t for t in tasks if any(s.dirty for s in t.stores.values())]
        # One deadline for the whole commit (its fences and key reads), so a commit stays
        # within REASSERT_PATIENCE of waiting, not one per step.
        deadline = asyncio.get_running_loop().time() + REASSERT_PATIENCE
        if not await self.sole_writer(index, dirty, deadline):
            return
        tasks = [t for t in tasks if not t.torn]
        done = await self.write_markers(index, tasks, deadline)
        tasks = [t for t in tasks if not t.torn]
        if done:
            # Off the loop and not interrupted halfway: a cancel waits for the local writes.
            committed = [(state, offset) for task, state, offset in done if not task.torn]
            writes = asyncio.ensure_future(asyncio.to_thread(_write_committed, committed))
            try:
                await asyncio.shield(writes)
            except asyncio.CancelledError:
                await asyncio.wait([writes])
                raise
        for task in tasks:
            # Not fsync'd: every commit writes it, and one a crash loses is only older (the
            # restore replays a little more); closing a task writes a durable one.
            self.stores.checkpoint(task.task_id, task.stores, durable=False)
        offsets = {}
        for task in tasks:
            for tp, offset in task.offsets.items():
                if task.committed.get(tp) != offset:
                    offsets[KafkaTopicPartition(*tp)] = offset
        if not offsets:
            return
        try:
            await self.host.consumers[index].commit(offsets)
        except KafkaError as exc:
            # The group is rebalancing (or these partitions moved): the state is committed,
            # so whoever reads these records again skips them in the stores.
            log.warning("consumer %d: input offsets not committed (%s)", index, _refusal(exc))
            return
        for task in tasks:
            task.committed.update(task.offsets)

    async def checked(self, step: Awaitable[T], tasks: Sequence[ActiveTask]) -> T:
        """``step`` (a commit's wait for acks, or a transaction's commit); while it takes
        longer than ``ACKS_CHECK_AFTER`` s, whether the changelogs of ``tasks`` still exist
        is asked (at most every ``CHECK_INTERVAL`` s), racing ``step``: ``step`` ending
        first ends the wait at once (the ask is dropped); a deleted changelog raises
        ``MissingChangelogError`` (``step`` is left to end by itself) rather than the commit
        waiting for writes the broker retries for ``request_timeout_ms``. A cancelled caller
        cancels ``step``."""
        waiting = asyncio.ensure_future(step)
        check = self.lookups.check
        try:
            while check is not None and not waiting.done():
                done, _ = await asyncio.wait([waiting], timeout=ACKS_CHECK_AFTER)
                if not done and check.due():
                    changelogs = [s.changelog for t in tasks for s in t.stores.values()]
                    await _race(waiting, check.refuse_missing(changelogs))
        except MissingChangelogError:
            waiting.add_done_callback(retrieve_failure)
            raise
        except BaseException:  # cancelled (a stop's grace), interrupted: the step with it
            waiting.cancel()
            # A cancelled gather (the wait for a task's acks) ends with CancelledError as its
            # failure, not cancelled; nobody awaits it now: asyncio would print it, one per task.
            waiting.add_done_callback(retrieve_failure)
            raise
        return await waiting

    async def commit_transactions(self, index: int) -> None:
        """Exactly once: each task of ``index`` commits its own transaction (its changelog
        writes, a marker per dirty store, its outputs and its input offsets); a task whose
        transaction fails is torn and restored after a rejoin, the others commit. A member
        that lost its membership commits nothing (its transactions are aborted when its
        tasks' producers are closed or renewed). Every task's commit ends before an error
        of one is raised (``OutputWriteError``: the application stops): none is torn while
        another still writes its stores."""
        if self.lost(index):
            return
        tasks = self.committable(index)
        with busy(tasks, index):
            results = await asyncio.gather(
                *(self._commit_transaction(index, t) for t in tasks), return_exceptions=True
            )
        errors = [r for r in results if isinstance(r, BaseException)]
        for error in errors:
            if not isinstance(error, Exception):  # cancelled, interrupted
                raise error
        if errors:
            raise errors[0]

    async def _commit_transaction(self, index: int, task: ActiveTask) -> None:
        producers = self.clients.task_producers
        assert producers is not None
        sent = {tp: o for tp, o in task.offsets.items() if task.committed.get(tp) != o}
        offsets = {KafkaTopicPartition(*tp): o for tp, o in sent.items()}
        dirty = [s for s in task.stores.values() if s.dirty]
        if not offsets and not dirty and task.task_id not in producers.open:
            return
        try:
            producer = await producers.sending(task.task_id)
            if task.futures:
                await self.checked(asyncio.gather(*task.futures), [task])
            task.futures.clear()
            markers = await _send_markers(producer, dirty)
            acks = await self.checked(asyncio.gather(*markers), [task])
            await self.checked(
                producers.commit(task.task_id, offsets, self.host.application_id), [task]
            )
        except InternalTopicError:  # a changelog gone: stop (its transaction aborted)
            tear(task)
            producers.fail(task.task_id)
            raise
        except Exception as exc:
            if rejoin_cures(exc):
                self.transaction_failed(index, task, exc)
                return
            tear(task)
            producers.fail(task.task_id)  # aborts the transaction
            raise _unwritable(task.task_id, exc, producers) from exc
        if task.torn:  # while it committed (the consumer left the group): restored later
            return
        writes = [(s, ack.offset) for s, ack in zip(dirty, acks, strict=True)]
        local = asyncio.ensure_future(asyncio.to_thread(_write_committed, writes))
        try:
            await asyncio.shield(local)
        except asyncio.CancelledError:
            await asyncio.wait([local])
            raise
        for state in task.stores.values():
            state.end = None  # a transaction marker follows our records: fencing checks
        self.stores.checkpoint(task.task_id, task.stores, durable=False)
        task.committed.update(sent)

    def transaction_failed(self, index: int, task: ActiveTask, exc: Exception) -> None:
        """Exactly once: ``task``'s transaction failed (fenced by a newer owner, or a write
        failed): it is aborted, the task's uncommitted state dropped, and the consumer
        rejoins; the task is restored with a new producer if the assignment gives it back."""
        log.warning(
            "consumer %d: task %s: transaction failed (%r); aborted, its uncommitted state "
            "is dropped, restored before it runs again",
            index,
            task.task_id,
            exc,
        )
        tear(task)
        producers = self.clients.task_producers
        if producers is not None:
            producers.fail(task.task_id)
        self.host.request_rejoin(index)

    async def commit_or_retry(self, index: int) -> None:
        """The consumer loop's commit. One that fails on a passing broker error (``passing``:
        a partition leader or broker away, as while a broker restarts) commits nothing: the
        consumer's tasks are torn as a crash would leave them (writes that landed without a
        marker are an orphan tail the restore compensates), the loop waits a backoff
        (``RETRY_BACKOFF`` doubled up to ``RETRY_BACKOFF_MAX``) and rejoins the group, and
        the tasks are restored and their input re-read before they run again (at least
        once). One WARNING per run of such failures, one INFO when a commit succeeds again.
        Any other failure is raised (the application stops)."""
        try:
            await self.commit(index)
        except Exception as exc:
            if not passing(exc):
                raise
            await self._retry_later(index, exc)
            return
        if index in self.failing and not self._recovering(index):
            count, since = self.failing.pop(index)
            log.info(
                "consumer %d: committing again, after %d failed commit(s) over %.1f s",
                index,
                count,
                asyncio.get_running_loop().time() - since,
            )

    def _recovering(self, index: int) -> bool:
        """Whether a task of consumer ``index`` is still torn or restoring: a commit then
        commits nothing of it, so it does not show the broker error has passed."""
        return any(t.consumer == index and (t.torn or t.restoring) for t in self.actives.values())

    async def _retry_later(self, index: int, exc: Exception) -> None:
        loop = asyncio.get_running_loop()
        count, since = self.failing.get(index, (0, loop.time()))
        if loop.time() - since > RETRY_LIMIT:
            raise CommitRetriesExhaustedError(
                f"consumer {index}: commits failed for {loop.time() - since:.0f} s "
                f"({count + 1} in a row; the last: {exc!r}); the broker error did not pass "
                "(too few in-sync replicas for min.insync.replicas? a deleted output "
                "partition?); stopping"
            ) from exc
        self.failing[index] = (count + 1, since)
        backoff = min(RETRY_BACKOFF * 2**count, RETRY_BACKOFF_MAX)
        mine = [t for t in self.actives.values() if t.consumer == index and not t.torn]
        for task in mine:
            tear(task)
        (log.warning if count == 0 else log.debug)(
            "consumer %d: commit failed (%r: a partition leader or broker away?); the "
            "uncommitted state of %d task(s) is dropped, they are restored and their input "
            "re-read after a rejoin in %g s; retried like this while it lasts (said once "
            "until a commit succeeds)",
            index,
            exc,
            len(mine),
            backoff,
        )
        await asyncio.sleep(backoff)
        if not self.host.stopping:  # else the stop leaves the group with the tasks torn
            self.host.request_rejoin(index)

    async def commit_safely(self, index: int) -> None:
        """Commit; on failure drop the consumer's uncommitted state as a crash would (its
        writes may be in the changelog without a marker): each task is restored (and its
        orphan writes compensated) before it runs again, and its input is re-read."""
        try:
            await self.commit(index)
        except (OutputWriteError, InternalTopicError):  # would fail again: stop
            raise
        except Exception as exc:
            log.warning(
                "consumer %d: commit failed (%r); its tasks' uncommitted state is dropped, "
                "restored from the changelog and the input re-read",
                index,
                exc,
            )
            for task in self.actives.values():
                if task.consumer == index:
                    tear(task)

    async def write_markers(
        self, index: int, tasks: Sequence[ActiveTask], deadline: float
    ) -> list[tuple[ActiveTask, StoreState, int]]:
        """A marker per store with pending writes, acknowledged; each must land where its
        owner's records end (``StoreState.end``). One that lands later closed another
        writer's records too: unless the membership fence (``fence``) finds the member lost
        (then it writes nothing more, its tasks are torn), it writes its values after them
        (``reassert``), else (three tries, keys unknown) its task is torn. Once any fence
        finds the member lost, nothing more is written for any of its tasks."""
        producer = self.clients.producer
        assert producer is not None
        for task in tasks:
            for state in task.stores.values():
                if state.overwritten is not None and not self.stopped(task):
                    await self.write_over(task, state, state.overwritten, deadline)
        if self.lost(index):  # a fence of write_over refused it: a zombie writes no marker
            return []
        tasks = [t for t in tasks if not t.torn]
        markers = []
        for task in tasks:
            for state in task.stores.values():
                if state.dirty:
                    tp = state.changelog
                    expected = state.end
                    future = await producer.send(
                        tp.topic, state.marker(), key=COMMIT_KEY, partition=tp.partition
                    )
                    markers.append((task, state, expected, future))
        if markers:
            await asyncio.gather(*(f for *_, f in markers))
        landed = [(t, s, e, f.result().offset) for t, s, e, f in markers]
        late = [s for _, s, e, o in landed if e is not None and o is not None and o != e]
        # A member whose marker closed another writer's records may be the zombie: it asks
        # the broker first (once a commit; not again for stores sole_writer checked).
        unchecked = [t for t, s, *_ in landed if s in late and s.overwritten is None]
        if unchecked and await self.fence(index, unchecked, deadline) is Membership.LOST:
            return []  # a zombie (or no answer): its tasks are torn, it rejoins
        done, failed = [], []
        for task, state, _, offset in landed:  # every task's pending writes intact
            if self.lost(index):  # a fence of give_up refused it: nothing more is written
                return []
            if task.torn:
                continue
            if state in late:
                assert offset is not None
                offset = await self.reassert(task, state, offset, deadline)
            if offset is None:
                failed.append(task)
            else:
                done.append((task, state, offset))
        for task in failed:
            tear(task)
            self.host.request_rejoin(index)
        return done

    async def sole_writer(self, index: int, dirty: Sequence[ActiveTask], deadline: float) -> bool:
        """Whether ``index`` may write markers: it is still the member its tasks were
        assigned to (else every task of it is torn: a zombie commits nothing). A task whose
        changelog another writer extended since this owner last read or wrote it is kept
        if the broker confirms this member (``fence``): its commit writes this owner's
        values after those records (``StoreState.overwritten``). Otherwise such a task is
        torn and the consumer rejoins (the task is restored or leaves); refused, every task
        of the consumer is torn. False also when the ends cannot be read (commit later)."""
        if self.lost(index):
            return False
        checked = [s for t in dirty for s in t.stores.values() if s.end is not None]
        if not checked or self.clients.restorer is None:
            return True
        try:
            ends = await self.lookups.ends(checked)
        except (KafkaError, TimeoutError) as exc:
            log.warning("consumer %d: %s; committing later", index, ends_unknown(exc))
            return False
        if self.lost(index):  # learnt while we waited
            return False
        foreign = {}
        for task in dirty:
            stale = {
                s.name: (ends[s.changelog], s.end)
                for s in task.stores.values()
                if s.end is not None and ends[s.changelog] != s.end
            }
            if stale:
                foreign[task] = stale
        if not foreign:
            return True
        # Only records after ours can be written over; a changelog that ends before our
        # records (truncated) is restored from.
        ahead = all(end > mine for stale in foreign.values() for end, mine in stale.values())
        unproven = Membership.UNPROVEN  # a truncated changelog: restored from
        membership = await self.fence(index, list(foreign), deadline) if ahead else unproven
        if membership is Membership.LOST:
            return False
        for task, stale in foreign.items():
            self.written_elsewhere(index, task, stale, membership is Membership.HELD)
        if membership is not Membership.HELD:
            self.host.request_rejoin(index)
        return True

    def written_elsewhere(
        self, index: int, task: ActiveTask, stale: Mapping[str, tuple[int, int]], keep: bool
    ) -> None:
        """Another writer extended the changelogs of ``task``'s stores in ``stale`` (name:
        end, expected end): ``keep`` (the broker confirmed this member) marks them for
        ``write_over`` (``StoreState.overwritten``), else the task is torn."""
        if keep:
            log.warning(
                "consumer %d: task %s: its changelog was written by another writer (end, "
                "expected: %s) while the broker still accepts this member; this owner's "
                "value of each key whose last value there is not its own is written after "
                "them, before its marker",
                index,
                task.task_id,
                stale,
            )
            for state in task.stores.values():
                if state.name in stale:
                    state.overwritten = stale[state.name][0]
            return
        log.warning(
            "consumer %d: task %s: its changelog was written by another writer "
            "(end, expected: %s); its uncommitted state is dropped, no marker written",
            index,
            task.task_id,
            stale,
        )
        tear(task)

    async def fence(self, index: int, tasks: Sequence[ActiveTask], deadline: float) -> Membership:
        """The membership fence: whether the group coordinator still accepts ``index`` as the
        member its ``tasks`` were assigned to, asked by committing again input offsets the
        group holds for them (the group's offsets do not change). ``HELD``: no other member
        can own them before that generation ends. ``LOST``: refused (``CommitFailedError``:
        unknown member, stale generation, a rebalance completing), reset by aiokafka, or no
        answer by ``deadline`` (the loop's clock; tried again until then): every task of
        ``index`` is torn and it rejoins. ``UNPROVEN``: the group holds no offset of theirs."""
        # aiokafka sends the member id and generation it holds when it builds the request;
        # one it reset (a heartbeat answered UnknownMemberId) commits as a "simple consumer"
        # (generation -1), which a group with no members accepts. So an answer proves the
        # membership only if the member and generation are still those of the assignment,
        # before and after (no new generation can start meanwhile: a rebalance's revoke
        # callback waits for this consumer's lock, which a commit holds).
        loop = asyncio.get_running_loop()
        while not self.lost(index):
            try:
                offsets = await self.fence_offsets(index, tasks)
                if not offsets:
                    return Membership.UNPROVEN
                await asyncio.wait_for(self.host.consumers[index].commit(offsets), FENCE_TIMEOUT)
            except CommitFailedError as exc:
                return self.drop_membership(index, f"is refused by the broker ({_refusal(exc)})")
            except (KafkaError, TimeoutError) as exc:
                if loop.time() + FENCE_BACKOFF < deadline:
                    log.warning("consumer %d: membership not confirmed yet (%r)", index, exc)
                    await asyncio.sleep(FENCE_BACKOFF)
                    continue
                # No answer for that long: its heartbeats go unanswered too, so the group
                # has most likely evicted it, and a zombie must write nothing.
                return self.drop_membership(index, f"gets no answer from the broker ({exc!r})")
            if not self.lost(index):
                return Membership.HELD
        return Membership.LOST

    def drop_membership(self, index: int, why: str) -> Membership:
        """The fence found ``index`` out of the group: tear its tasks and rejoin."""
        self.tear_consumer(index, why)
        self.host.request_rejoin(index)
        return Membership.LOST

    async def fence_offsets(
        self, index: int, tasks: Sequence[ActiveTask]
    ) -> dict[KafkaTopicPartition, int]:
        """Input offsets the group holds for ``tasks``: those this member committed, else
        (its first commit since it took them over) the first one the group holds of their
        partitions, looked up (only then: an OffsetFetch a partition). Empty: none."""
        mine = {KafkaTopicPartition(*tp): o for t in tasks for tp, o in t.committed.items()}
        if mine:
            return mine
        consumer = self.host.consumers[index]
        for tp in sorted({tp for t in tasks for tp in t.offsets}):
            kafka_tp = KafkaTopicPartition(*tp)
            offset = await asyncio.wait_for(consumer.committed(kafka_tp), FENCE_TIMEOUT)
            if offset is not None:
                return {kafka_tp: offset}
        return {}

    def stopped(self, task: ActiveTask) -> bool:
        """Whether nothing more may be written for ``task``: torn, or its member lost."""
        return task.torn or self.lost(task.consumer)

    def lost(self, index: int) -> bool:
        """``index`` lost its membership since its last assignment: tear its tasks."""
        if not self.host.member_lost(index):
            return False
        self.tear_consumer(index, "left the group (evicted)")
        return True

    def tear_consumer(self, index: int, why: str) -> None:
        mine = [t for t in self.actives.values() if t.consumer == index and not t.torn]
        for task in mine:
            tear(task)
        if mine:
            log.warning(
                "consumer %d %s: the uncommitted state of %d task(s) is dropped and no "
                "marker written; they are restored before they run here again",
                index,
                why,
                len(mine),
            )

    async def reassert(
        self, task: ActiveTask, state: StoreState, marker: int, deadline: float
    ) -> int | None:
        """Another writer's records landed in ``state``'s changelog after this owner's last
        marker and before its marker at ``marker``, which closed them too. Write this owner's
        value of every key written since its last marker (another writer's records can sit
        between this owner's) whose last value there is not this owner's, then a marker after
        them, so that the changelog ends at this owner's state; its offset, or None after
        three tries or when their keys cannot be read by ``deadline`` (the loop's clock): then
        the task is torn by the caller, after ``give_up`` wrote its pending values again."""
        tp = state.changelog
        first = state.position
        for _ in range(3):
            written = await self.keys_written(task, tp, first, marker, deadline)
            if written is None:
                await self.give_up(task, state, marker, deadline)
                return None
            # A key whose last value there is this owner's needs nothing (often all: the
            # other writer's records were only a marker); ours, the last, closes them.
            keys = sorted(k for k, v in written.items() if v != owners_value(state, k))
            if not keys:
                return marker
            # Asked again: the keys can take up to the commit's patience to read, long
            # enough for the group to evict this member and a new owner to write meanwhile.
            fenced = await self.fence(task.consumer, [task], deadline)
            if fenced is Membership.LOST or self.stopped(task):  # a zombie writes nothing
                return None
            log.warning(
                "task %s: %s[%d] offsets %d to %d (since this owner's last marker, up to "
                "this commit's) hold another writer's records; writing this owner's value of "
                "the %d key(s) written there again",
                task.task_id,
                tp.topic,
                tp.partition,
                first,
                marker,
                len(keys),
            )
            expected, landed = await self.write_again(state, keys, marker)
            if landed == expected:
                return landed
            first, marker = marker + 1, landed
        log.error("task %s: %s[%d] keeps being written by another writer", task.task_id, *tp)
        await self.give_up(task, state, marker, deadline)
        return None

    async def write_over(
        self, task: ActiveTask, state: StoreState, end: int, deadline: float
    ) -> None:
        """``sole_writer`` found another writer's records after this owner's, up to ``end``,
        and the broker confirmed this owner: write its value of every key whose last value
        there is not its own before its marker, so one marker closes both (a crash between
        two markers would restore the other writer's values). The broker is asked once more
        (``fence``) after the keys are read, before they are written. Keys not read in time:
        the marker lands late and ``reassert`` tries again."""
        written = await self.keys_written(task, state.changelog, state.position, end, deadline)
        if written is None or self.stopped(task):
            return
        keys = sorted(k for k, v in written.items() if v != owners_value(state, k))
        # Reading the keys can take up to the commit's deadline: the member may have been
        # evicted meanwhile, so the broker is asked again right before writing.
        if keys and await self.fence(task.consumer, [task], deadline) is not Membership.HELD:
            return  # lost: nothing is written; unproven: the marker lands late (reassert)
        state.end = end
        await asyncio.gather(*await self.send_values(state, keys))  # a failure: no marker

    async def send_values(
        self, state: StoreState, keys: Iterable[bytes]
    ) -> list[asyncio.Future[Any]]:
        """Send this owner's value of ``keys`` to ``state``'s changelog (after ``state.end``,
        which each moves on); their acks."""
        producer = self.clients.producer
        assert producer is not None
        tp = state.changelog
        futures = []
        for key in keys:
            state.pending[key] = value = owners_value(state, key)
            futures.append(await producer.send(tp.topic, value, key=key, partition=tp.partition))
            state.produced()
        return futures

    async def write_again(
        self, state: StoreState, keys: Iterable[bytes], after: int
    ) -> tuple[int, int]:
        """Write this owner's value of ``keys`` to ``state``'s changelog again after offset
        ``after``, then a marker: where that marker should land, and where it landed."""
        producer = self.clients.producer
        assert producer is not None
        tp = state.changelog
        state.end = after + 1
        futures = await self.send_values(state, keys)
        expected = state.end
        futures.append(
            await producer.send(tp.topic, state.marker(), key=COMMIT_KEY, partition=tp.partition)
        )
        acks = await asyncio.gather(*futures)
        return expected, acks[-1].offset

    async def give_up(
        self, task: ActiveTask, state: StoreState, marker: int, deadline: float
    ) -> None:
        """The keys another writer's records (closed by this owner's marker) wrote are not
        known: write every pending value of ``state`` again after them, so the restore that
        follows (the caller tears the task) applies none of the other writer's values over
        this owner's updates since its last commit. A key only the other writer wrote keeps
        its value. Nothing is written by a member that lost its membership (or a torn task):
        the other writer is then the task's new owner; the broker is asked (``fence``), as
        it may have been out for the whole ``REASSERT_PATIENCE``. Raises
        ``ReassertionFailedError`` (the application stops) when that write fails: tearing the
        task then would lose those updates silently."""
        tp = state.changelog
        if task.torn:
            return
        if await self.fence(task.consumer, [task], deadline) is Membership.LOST:
            return  # a zombie's values must not follow (the task is torn)
        try:
            await self.write_again(state, list(state.pending), marker)
        except Exception as exc:
            raise ReassertionFailedError(
                f"task {task.task_id}: another writer's records in {tp.topic}[{tp.partition}] "
                f"were closed by this owner's marker, and its {len(state.pending)} pending "
                f"value(s) could not be written again after them ({exc!r}): stopping, a "
                "restore would apply the other writer's values over them"
            ) from exc
        log.error(
            "task %s: %s[%d]: the keys of another writer's records closed by this owner's "
            "marker are unknown; its %d pending value(s) written again after them, the task "
            "is restored (a key only the other writer wrote keeps that writer's value)",
            task.task_id,
            tp.topic,
            tp.partition,
            len(state.pending),
        )

    async def keys_written(
        self, task: ActiveTask, tp: TopicPartition, first: int, end: int, deadline: float
    ) -> dict[bytes, bytes | None] | None:
        """The keys ``reassert`` may write again, each with its last value there. A changelog
        not read in time is read again (each try bounded), while the member keeps its
        membership and the task, until ``deadline`` (the commit's, see ``REASSERT_PATIENCE``),
        and only once while the consumer is rebalancing (its whole group waits for this
        commit). None when giving up."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                return await self.lookups.keys_written(tp, first, end)
            except ChangelogReadTimeoutError as exc:
                if (
                    self.lost(task.consumer)
                    or task.torn
                    or task.consumer in self.rebalancing
                    or loop.time() >= deadline
                ):
                    log.error("task %s: %s; giving up", task.task_id, exc)
                    return None
                log.warning("task %s: %s; reading them again", task.task_id, exc)

    async def check_ends(self, consumer: int, tasks: frozenset[TaskId]) -> None:
        """Tear every task of ``tasks`` whose changelog another writer wrote while it was
        suspended here (its end is not where this owner's records end), so it is restored
        rather than resumed; all of them when the ends cannot be read."""
        tasks = frozenset(t for t in tasks if not self.actives[t].restoring)  # ends known later
        states = [
            s
            for t in sorted(tasks)
            if not self.actives[t].torn
            for s in self.actives[t].stores.values()
        ]
        if not states or self.clients.restorer is None:
            return
        try:
            ends = await self.lookups.ends(states)
        except (KafkaError, TimeoutError) as exc:
            log.warning("consumer %d: %s; restoring", consumer, ends_unknown(exc))
            ends = {}
        for task_id in sorted(tasks):
            task = self.actives[task_id]
            stale = {
                s.name: (ends.get(s.changelog), s.end)
                for s in task.stores.values()
                if ends.get(s.changelog) != (s.end if s.end is not None else s.position)
            }
            if stale and not task.torn:
                log.warning(
                    "consumer %d: task %s: changelog written elsewhere meanwhile (end, "
                    "expected: %s); restoring it instead of resuming",
                    consumer,
                    task_id,
                    stale,
                )
                tear(task)

    # -- restores --------------------------------------------------------------------------------


async def _race(step: asyncio.Future[Any], asking: Awaitable[Any]) -> None:
    """Wait for ``step`` or ``asking``, whichever ends first; ``asking``'s
    ``MissingChangelogError`` is raised unless ``step`` ended, its other failures dropped
    (not known: the step waits on), and it is cancelled if ``step`` ends first."""
    ask = asyncio.ensure_future(asking)
    try:
        await asyncio.wait([step, ask], return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not ask.done():
            ask.cancel()  # ends at its next step; nobody awaits it
        ask.add_done_callback(retrieve_failure)
    if step.done() or not ask.done() or ask.cancelled():
        return
    failure = ask.exception()
    if isinstance(failure, MissingChangelogError):
        raise failure


async def _send_markers(
    producer: AIOKafkaProducer, dirty: Sequence[StoreState]
) -> list[asyncio.Future[Any]]:
    """A marker for each of ``dirty`` in its changelog (futures of their acks). A send that
    raises (the producer's sender died meanwhile) leaves the markers already sent to fail
    with nobody awaiting them: their failures are marked seen (the raised one is the cause)."""
    markers: list[asyncio.Future[Any]] = []
    try:
        for state in dirty:
            tp = state.changelog
            sent = await producer.send(
                tp.topic, state.marker(), key=COMMIT_KEY, partition=tp.partition
            )
            markers.append(sent)
    except BaseException:
        for sent in markers:
            sent.add_done_callback(retrieve_failure)
        raise
    return markers


def ends_unknown(exc: BaseException) -> str:
    """What a failed changelog end lookup (``ChangelogLookups.ends``) says."""
    if isinstance(exc, EndOffsetsTimeoutError):  # names the partitions and the cause
        return str(exc)
    return f"changelog ends unknown ({exc!r})"


def owners_value(state: StoreState, key: bytes) -> bytes | None:
    """``key``'s value in this owner's view of ``state``: uncommitted, else committed."""
    return state.pending[key] if key in state.pending else state.store.get(key)


def _write_committed(markers: Iterable[tuple[StoreState, int]]) -> None:
    for state, offset in markers:
        state.committed(offset)


@contextlib.contextmanager
def busy(tasks: Iterable[ActiveTask], index: int) -> Iterator[None]:
    """Mark ``tasks`` as running on consumer ``index`` while it commits them: one that moves
    to a sibling consumer meanwhile (a commit outlasting ``max_poll_interval_ms``) is neither
    processed nor committed there until this commit ends."""
    tasks = list(tasks)
    for task in tasks:
        task.running = index
    try:
        yield
    finally:
        for task in tasks:
            if task.running == index:
                task.running = None


#: Refusals a retry meets again (the same record, topic and rights): they stop the app.
#: In the consumer loop (``commit_or_retry``) a passing broker error tears the consumer's
#: tasks, which are restored and retried, and anything else stops it too (an unknown error,
#: a corrupt transfer, an unknown producer id; a keyless record to a compacted topic is
#: refused as INVALID_RECORD, which aiokafka reports as ``UnknownError``); the commit of a
#: rebalance or a stop (``commit_safely``) tears and retries for all but these.
PERMANENT_REFUSALS: tuple[type[KafkaError], ...] = (
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    TopicAuthorizationFailedError,
    ClusterAuthorizationFailedError,
    InvalidTopicError,
    PolicyViolationError,
    UnsupportedForMessageFormatError,
)


def _unwritable(task: TaskId, exc: Exception, producers: TaskProducers) -> OutputWriteError:
    """The error stopping the application when ``task``'s transaction failed with ``exc``,
    which no rejoin cures: ``OutputNotAuthorizedError`` naming the ACL when the broker refused
    the task's transactional id (WRITE on it taken away while the application runs)."""
    if transactional_id_refused(exc):
        return OutputNotAuthorizedError(
            f"task {task}: its transaction cannot be written: "
            + transactional_id_refusal(producers.application_id, task, producers.principal)
            + "; aborted, stopping (it would be refused again)"
        )
    return OutputWriteError(
        f"task {task}: its transaction cannot be written ({exc!r}); aborted, "
        "stopping (retrying would fail the same way)"
    )


def _refusal(exc: BaseException) -> str:
    """A broker's refusal in a line: aiokafka's ``CommitFailedError`` carries paragraphs of
    advice about ``max_poll_interval_ms``, wrong for an eviction after a network cut."""
    if isinstance(exc, CommitFailedError):
        return "CommitFailedError: the group rebalanced without this member"
    return repr(exc)


async def _acks(index: int, futures: Sequence[asyncio.Future[Any]]) -> None:
    """Wait for the acks of ``futures`` (writes of consumer ``index``'s tasks). A write the
    broker refused for good (``PERMANENT_REFUSALS``: a record or batch larger than its
    topic's ``max.message.bytes``, not authorised, an invalid topic) raises
    ``OutputWriteError``: the application stops rather than restoring and refusing again.
    Any other error is raised as it is: a passing one (``passing``: a leader or broker
    away, as while a broker restarts) tears the consumer's tasks, which are restored after a
    rejoin and retried (``Commits.commit_or_retry``, and ``commit_safely`` in a rebalance or
    at stop); anything else stops the application."""
    try:
        await asyncio.gather(*futures)
    except PERMANENT_REFUSALS as exc:
        if isinstance(exc, TopicAuthorizationFailedError):  # the principal may describe it
            raise OutputNotAuthorizedError(  # (else the send itself was refused) but not write
                f"consumer {index}: the broker refused a write as not authorized ({exc!r}): "
                "grant WRITE on the topics its tasks write to (sinks, changelogs, repartition "
                "topics); nothing committed, stopping (it would be refused again)"
            ) from exc
        hint = ""
        if isinstance(exc, MessageSizeTooLargeError):  # to a topic the topology does not name
            hint = (
                " (larger than a topic's max.message.bytes: list the topics processors send "
                "to as sink_topics, so batches are capped below their limits at start)"
            )
        raise OutputWriteError(
            f"consumer {index}: the broker refused a write ({exc!r}){hint}; nothing "
            "committed, stopping (it would be refused again)"
        ) from exc


def passing(exc: BaseException) -> bool:
    """Whether a commit's failure passes by itself: an error Kafka calls retriable (no
    leader, not enough in-sync replicas, a request timed out, a connection lost) or a write
    aiokafka expired (``KafkaTimeoutError``: its partition had no leader for
    ``request_timeout_ms``). Refusals that a retry meets again are ``OutputWriteError``s by
    then, not ``KafkaError``s."""
    if isinstance(exc, KafkaTimeoutError):
        return True
    return isinstance(exc, KafkaError) and bool(exc.retriable)
