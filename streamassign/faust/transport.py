"""A Faust transport that uses the app's assignor also when the app has no tables.

Faust's aiokafka driver hands the consumer ``app.assignor`` only when the app has changelog
tables or ``table_standby_replicas > 0``; otherwise it silently uses aiokafka's round robin. With
``broker="streamassign://host:9092"`` (this transport, registered under the ``faust.transports``
entry point) the worker's consumer always uses ``app.assignor``. With
``STREAMASSIGN_FAUST_SWITCH=1`` in the worker's environment (a rolling switch) it offers second
what Faust would use (``PartitionAssignor.fallback_assignors``), so workers can be switched to
or from Faust's assignor one at a time. Only then: aiokafka up to 0.14 sends one JoinGroup per
offered protocol at every join (the first with ours alone, then with both; aio-libs/aiokafka
pull request 1168), the broker takes the second for changed metadata and starts another
rebalance, and a group of such workers can rebalance without end (docs/faust.md).

Its consumer also closes a window in which Faust 0.15 drops records around every rebalance
(docs/faust.md, "Exactness"): after recovery Faust resumes fetching the stream (source)
partitions, seeks them to their committed offsets, and only then resumes flow control, which
empties every agent's queue. Records fetched in between (the one at the committed offset first)
are thrown away unprocessed, and Faust's commit check lets the next commit pass a gap of one
offset, so that record is lost. This consumer keeps a stream partition paused when Faust
resumes it during a rebalance (``app.rebalancing``, or from a revoke until the resume that
releases this rebalance's stream partitions), until the next ``resume_flow()`` (which
Faust calls right after resuming flow control), so nothing is fetched for it before the queues
are emptied; outside a rebalance a resume takes effect at once. Its consumer thread puts back
records aiokafka hands out that Faust would drop: across a rebalance (a table recovery then
waits for ever for its changelog records) or for partitions Faust took out of its active set
while the fetch waited (``_ConsumerThread._fetch_records``). Three watchdogs say what a
rebalance would leave stuck in silence: held partitions never released; a table recovery that
applies nothing for ``recovery_stall_after`` seconds (one WARNING per stall, with the
partitions behind and their offsets); and a rebalance that keeps the flow stopped (a revoke,
join, Faust callback or recovery set-up that never ends, or rebalance after rebalance: one
WARNING per episode, ``_flowstop``). A fourth says what a rebalance would leave frozen after
it ended: an assigned stream partition that receives nothing for ``stream_freeze_after``
seconds (two ``broker_request_timeout`` by default) while records wait, the flow is resumed
and no rebalance is under way gets one WARNING with its position and lag, and is resumed if it
was left paused in Faust's consumer (``_freeze``).

After a lost group membership (a zombie: a stall past the session timeout) it rewinds the tables'
persisted changelog offsets to the last ones the membership proved, before Faust's recovery reads
them (``_proven``), and its producer holds the changelog sends that follow such a stall until the
membership is proven (sent) or lost (dropped: a zombie's writes from stale table state,
``_stallhold``); the offsets Faust acknowledged but did not commit are forgotten after a lost
membership (their events' changelog sends may have been dropped: processed again, never committed
past, ``_forget_acks_if_lost``), and no commit goes out after a stop that dropped held sends
(``_commits_refused``). A table store write that fails (a full disk) stops the worker before any
commit can pass the record Faust acks anyway (``_storefail``). Everything else is Faust's aiokafka
transport unchanged.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP
from faust.types import tuples as faust_tuples

from ..aiokafka import closing
from ..aiokafka.closing import release_consumer, retrieve_failure, stop_within
from ..aiokafka.floods import BrokerAwayLines
from ..aiokafka.rejoin import current_assignment, fetch_states, member_id, membership, rewind
from ..repeats import Repeats
from ._app import exactly_once, recovery_interrupted
from ._eos import warn_if_exactly_once
from ._flowstop import ASSIGNING, JOINING, RECOVERING, REVOKING, FlowStop, Step
from ._freeze import FreezeWatch, Frozen, StreamLook
from ._proven import ProvenOffsets, changelog_stores, proofs_file
from ._stallhold import StallHoldProducer
from ._storefail import SourceCountMismatch, StoreFailure, StoreFailureGuard, crash_app

__all__ = ["SWITCH_ENV", "Transport"]

log = logging.getLogger("streamassign.faust")

#: Set to 1 in a worker's environment to offer Faust's protocol after ours (a rolling switch).
SWITCH_ENV = "STREAMASSIGN_FAUST_SWITCH"

#: The lock Faust's ``ack()`` holds while it records an offset (faust-streaming 0.15; before
#: it, acks ran on the event loop's thread alone, as the assignment callback does).
_ACK_LOCK: contextlib.AbstractContextManager[Any] = (
    getattr(faust_tuples, "ack_lock", None) or contextlib.nullcontext()
)


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    #: aiokafka's lines repeated while a broker is away (about 70/s in a worker, 20,000 in
    #: a 5-minute outage), held back while the consumer runs: the filter the runtime's
    #: ``App`` uses, shared with any other of the process (``BrokerAwayLines.attach``).
    _broker_away_lines: BrokerAwayLines | None = None

    async def on_start(self) -> None:
        if self._broker_away_lines is None:
            self._broker_away_lines = BrokerAwayLines.attach()
        warn_if_exactly_once(self.app)  # in a worker only, whichever assignor
        await super().on_start()

    async def on_thread_stop(self) -> None:
        """Faust's, with aiokafka's consumer stop given ``closing.CLOSE_TIMEOUT`` as the
        runtime's consumers are: cut off from the coordinator, its LeaveGroup waits for an
        answer up to ``broker_request_timeout`` (90 s by default), so a worker stopped during
        a network cut took that long to exit. Cut, the member is left to the coordinator,
        which drops it at its session timeout, as a crashed one (Faust committed before)."""
        try:
            _abandon_commit_requests(self._consumer)
            # Faust's own first step (the thread's method queue), then its consumer's stop.
            await super(faust_aiokafka.AIOKafkaConsumerThread, self).on_thread_stop()
            if self._consumer is not None:
                await _stop_consumer_within(self._consumer)
        finally:
            lines, self._broker_away_lines = self._broker_away_lines, None
            held_back = lines.detach() if lines is not None else None
            if held_back:
                log.warning("%s", held_back)

    async def subscribe(self, topics: Iterable[str]) -> None:
        """Faust's, then the assignor's join-error watch starts on the consumer thread: a
        principal without READ on the group fails at the coordinator lookup, before any join
        (where the assignor starts the watch itself), and aiokafka keeps that error for a poll
        Faust never makes."""
        await super().subscribe(topics)
        await self.call_thread(self._watch_join_errors)

    async def _watch_join_errors(self) -> None:
        join_errors = getattr(self.app.assignor, "join_errors", None)
        consumer = getattr(self, "_consumer", None)  # Faust's, set when the thread starts
        if join_errors is not None and consumer is not None:
            join_errors.joining(consumer)

    async def _highwaters(self, partitions: list[TP]) -> Mapping[TP, int]:
        """Faust's, but under exactly_once asked of the broker as under at-least-once
        (ListOffsets; the consumer reads committed, so the answer is the last stable offset),
        with the same failure: an error out of aiokafka's ``end_offsets``. Faust returns
        aiokafka's cached last stable offset, which is None until a fetch of the partition
        has come back in this assignment; its recovery reads None as -1 and raises
        ``ConsistencyError`` for any table partition with a persisted offset (a standby
        taking over, a recovery restarted by a rebalance, a restart): the worker crashed, and
        crashed again after every restart while the group moved."""
        if not self.consumer.in_transaction:
            return await super()._highwaters(partitions)
        ended: Mapping[TP, int] = await self._ensure_consumer().end_offsets(partitions)
        return ended

    def _create_worker_consumer(self, *args: Any, **kwargs: Any) -> Any:
        # (transport) in faust-streaming 0.15, (transport, loop) in older releases.
        consumer = super()._create_worker_consumer(*args, **kwargs)
        assignor = self.app.assignor
        if self._assignor is not assignor:  # Faust picked round robin: the app has no tables
            log.info("stateless app: using %s instead of round robin", type(assignor).__name__)
            self._assignor = assignor
        # Ours, then what Faust would use while switching (see fallback_assignors). aiokafka
        # reads the strategy list when the consumer starts, which is after this.
        fallbacks: tuple[Any, ...] = ()
        if os.environ.get(SWITCH_ENV, "").strip() == "1":
            fallbacks = getattr(assignor, "fallback_assignors", lambda: ())()
            log.info("%s=1: offering %s after ours", SWITCH_ENV, [f.name for f in fallbacks])
        consumer._partition_assignment_strategy = (assignor, *fallbacks)
        return consumer

    async def _seek_wait(self, consumer: Any, partitions: Mapping[TP, Any]) -> None:
        """Faust's, but an offset that is no offset (None) seeks 0 instead of raising out of
        aiokafka's ``seek`` (``Offset must be a positive integer``), which ended Faust's
        recovery and the worker (the scale audit, 256 partitions, either assignor). Faust's
        recovery seeks None for a partition a rebalance added after it read its offsets; the
        rebalance has set its restart signal, so the recovery restarts right after and seeks
        again from the offsets it reads then (the partitions stay paused meanwhile)."""
        unknown = {tp: offset for tp, offset in partitions.items() if not _is_offset(offset)}
        if unknown:
            log.info(
                "a rebalance interrupted Faust's recovery: it asked to seek %d partition(s) to no "
                "offset (%s); seeking 0 in their place, the recovery restarts and seeks them again",
                len(unknown),
                ", ".join(
                    f"{tp.topic}[{tp.partition}]: {o!r}" for tp, o in sorted(unknown.items())[:5]
                ),
            )
            partitions = {tp: (0 if tp in unknown else o) for tp, o in partitions.items()}
        await super()._seek_wait(consumer, partitions)

    async def _fetch_records(
        self,
        consumer: Any,
        active_partitions: Any,
        timeout: float | None = None,
        max_records: int | None = None,
    ) -> Any:
        """Faust's, but records Faust would drop are put back (rewound, so that they are
        fetched again), not handed on: all of them when taken from a newer assignment than the
        one the call began in or after Faust stopped the flow, and otherwise those of
        partitions no longer in Faust's active set (nor in its buffer-full set).

        aiokafka's ``fetched_records`` waits out a rebalance that starts while it waits and
        then drains the new assignment's records for the partitions in Faust's active set,
        which it reads live; an empty set means every partition to aiokafka
        (``if partitions and ...``). Right after an assignment Faust pauses every partition at
        once, and at the end of a table recovery it pauses the changelog partitions
        (``pause_partitions(active_tps)``): both empty the set while a fetch may wait, and the
        fetch then drains every buffered partition, stream partitions included (aiokafka keeps
        prefetching them: Faust pauses only in its own set). Faust's ``getmany`` drops what is
        outside the set it asked with, without a seek; its later seek to the committed offsets
        leaves alone a partition with no commit yet (a new app, partition or source topic), so
        those records would be lost, and a changelog partition's records were taken past the
        recovery's start, so its recovery would wait for ever (a worker stuck in recovery,
        `No event received for active tp`)."""
        assignment = current_assignment(consumer)
        records = await super()._fetch_records(
            consumer, active_partitions, timeout=timeout, max_records=max_records
        )
        if not records:
            return records
        if current_assignment(consumer) is not assignment or not self.consumer.flow_active:
            dropped = set(records)
        else:
            dropped = self._dropped_by_faust(records, active_partitions)
        if not dropped:
            return records
        # Nothing else ran on this loop since the records were taken: the rewind is exact.
        rewound = rewind(consumer, {tp: records[tp] for tp in dropped})
        log.debug("put back records Faust would drop: %s", sorted(rewound)[:10])
        return {tp: batch for tp, batch in records.items() if tp not in dropped}

    def _dropped_by_faust(self, records: Mapping[TP, Any], active_partitions: Any) -> set[TP]:
        """The partitions of ``records`` Faust's ``getmany`` drops: outside ``active_partitions``
        (Faust's live set, which its main thread may change) and its buffer-full set. Each a
        membership test, not an iteration of a set another thread may resize meanwhile."""
        if active_partitions is None:  # a client-only app: Faust keeps everything
            return set()
        buffered = self.consumer._buffered_partitions
        return {tp for tp in records if tp not in active_partitions and tp not in buffered}


def _is_offset(offset: object) -> bool:
    """An offset aiokafka's ``seek`` takes (an int from 0; not a bool)."""
    return isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0


def _readable_end(state: Any, read_committed: bool) -> int | None:
    """The offset a partition can be read up to as aiokafka last fetched it: its highwater, or
    under read_committed its last stable offset when lower (a transaction still open: nothing
    past it is handed out, whatever waits behind). Under read_uncommitted the position may pass
    the last stable offset; -1 is Kafka's "none known"."""
    highwater: int | None = getattr(state, "highwater", None)
    lso = getattr(state, "lso", None)
    if not read_committed or not isinstance(lso, int) or lso < 0:
        return highwater
    return lso if highwater is None else min(highwater, lso)


def _partition_name(tp: TP) -> str:
    return f"{tp.topic}[{tp.partition}]"


def _first_ten(rows: list[str]) -> str:
    more = f" and {len(rows) - 10} more" if len(rows) > 10 else ""
    return ", ".join(rows[:10]) + more


def _partition_list(tps: Iterable[TP]) -> str:
    """``topic[partition]`` of each, sorted, at most 10 and how many more."""
    return _first_ten([_partition_name(tp) for tp in sorted(tps)])


def _abandon_commit_requests(consumer: Any) -> None:
    """Mark seen the failure of each offset commit request still under way when the consumer
    thread stops (a stop that abandoned a commit sent into a cut: the method queue's stop
    cancels the commit, but aiokafka shields its request, which fails when the connections
    close): nobody awaits it, and asyncio would log it as "Task exception was never
    retrieved" with aiokafka's trace. Found by their coroutine: the coordinator's
    ``_do_commit_offsets`` (or the wrap on it)."""
    commit = getattr(getattr(consumer, "_coordinator", None), "_do_commit_offsets", None)
    code = getattr(getattr(commit, "__func__", commit), "__code__", None)
    if code is None:
        return
    for task in asyncio.all_tasks():
        if getattr(task.get_coro(), "cr_code", None) is code:
            task.add_done_callback(retrieve_failure)


async def _stop_consumer_within(consumer: Any) -> None:
    """Stop aiokafka's ``consumer`` within ``closing.CLOSE_TIMEOUT``; cut, what its stop left
    running is released (heartbeat, fetcher, connections)."""
    abandoned = "its LeaveGroup is abandoned (the group drops it at its session timeout)"
    log.info(
        "stopping the worker's consumer (if the broker does not answer: cut after %g s, "
        "then its local parts released)",
        closing.CLOSE_TIMEOUT,
    )
    if not await stop_within("the worker's consumer", consumer, abandoned, log):
        await release_consumer("the worker's consumer", consumer, log)


class _Ticker:
    """Calls ``check`` every ``period`` seconds on the running event loop until it returns
    False or ``stop()`` is called: the worker's watchdogs, which look for what Faust's recovery
    leaves stuck without a word (or with one that names no positions)."""

    def __init__(self, check: Callable[[], bool]) -> None:
        self._check = check
        self._timer: asyncio.TimerHandle | None = None
        #: The check's failure logged last: a check failing at every tick logs its traceback
        #: once, not every few seconds for ever.
        self._failures = Repeats()

    @property
    def running(self) -> bool:
        return self._timer is not None

    def start(self, period: float) -> None:
        """Start ticking (a running ticker goes on as it was)."""
        if self._timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on an event loop (no running app): nothing to watch
            return
        self._timer = loop.call_later(period, self._tick, loop, period)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self, loop: asyncio.AbstractEventLoop, period: float) -> None:
        self._timer = None
        name = getattr(self._check, "__name__", "")
        try:
            again = self._check()
        except Exception as exc:  # a watchdog that stops in silence would hide the next stall
            if self._failures.changed((type(exc), str(exc))):
                log.exception("watchdog %s failed; it goes on (repeats logged at DEBUG)", name)
            else:
                log.debug("watchdog %s failed again: %r", name, exc)
            again = True
        else:
            if self._failures.ended():
                log.info("watchdog %s works again", name)
        if again:
            self._timer = loop.call_later(period, self._tick, loop, period)


class _RebalanceListener(faust_aiokafka.ConsumerRebalanceListener):
    """Faust's, but a revoke first lets the consumer note which streams had events since the
    last rebalance: Faust's listener then has its monitor forget them
    (``app.on_rebalance_start()``), before any of the consumer's callbacks runs."""

    def on_partitions_revoked(self, revoked: Iterable[Any]) -> Any:
        consumer = self._thread.consumer
        if isinstance(consumer, _Consumer):
            consumer.note_streams_before_rebalance()
        return super().on_partitions_revoked(revoked)

    async def on_partitions_assigned(self, assigned: Iterable[Any]) -> None:
        """Faust's, but first the consumer notes the member id the assignment was made
        under, read here (the consumer thread, right after the join) as Faust reads the
        generation: a new one means the membership was lost (``_proven``)."""
        consumer = self._thread.consumer
        if isinstance(consumer, _Consumer):
            consumer.note_membership(membership(getattr(self._thread, "_consumer", None)))
        # The join error watch ends at any assignment, also one of aiokafka's round robin
        # (an app without tables during a rolling switch), which never reaches our assignor.
        assignor = getattr(getattr(consumer, "app", None), "assignor", None)
        join_errors = getattr(assignor, "join_errors", None)
        if join_errors is not None:
            join_errors.joined()
        await super().on_partitions_assigned(assigned)


class _Consumer(faust_aiokafka.Consumer):
    RebalanceListener = _RebalanceListener

    #: Seconds a table recovery may apply nothing from a changelog it still lags on before the
    #: worker warns (Faust warns too, but every 5 s for ever and without offsets).
    recovery_stall_after: float = 30.0

    #: Seconds an assigned stream partition with records waiting may receive nothing, the flow
    #: resumed and no rebalance under way, before the worker warns (``_freeze``); None: two
    #: ``broker_request_timeout`` (a fetch from a broker that went away fails after one).
    stream_freeze_after: float | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Stream partitions Faust resumed, held paused until the next ``resume_flow()``.
        self._held_streams: set[TP] = set()
        #: How long the current holds have lasted, in ``broker_request_timeout`` periods.
        self._held_periods = 0
        #: Warns when partitions stay held (Faust's recovery never resumed the flow).
        self._hold_watch = _Ticker(self._on_hold_watch)
        #: Warns when a rebalance keeps the flow stopped (the current episode, if any).
        self._flow_watch = _Ticker(self._on_flow_watch)
        self._init_recovery_watch()
        self._init_freeze_watch()
        #: Since when each assigned stream partition counts as started, for Faust's "Stream
        #: has not started processing" (``monotonic()``, Faust's livelock clock): its
        #: assignment, then the ``resume_flow()`` at which its records could flow
        #: (``_restart_streams``). Changelog partitions have no stream and are not in it.
        self._started_at: dict[TP, float] = {}
        #: Stream partitions whose start the next ``resume_flow()`` renews: assigned by this
        #: rebalance or with a stream event since their start (kept while still paused).
        self._restarting: set[TP] = set()
        #: The stream partitions with an event since the last rebalance, as Faust's monitor
        #: had them when this rebalance began, before it forgot them (``_RebalanceListener``,
        #: on the consumer thread; taken by ``on_partitions_revoked``).
        self._evented_before_rebalance: frozenset[TP] = frozenset()
        self._flow_stop: FlowStop | None = None
        #: Whether Faust's recovery may still resume this rebalance's stream partitions: from
        #: every revoke to the resume_flow() after its assignment that releases them (or finds
        #: none assigned). Not the flow watch's episode: that one ends at the first resume,
        #: which for a table with a changelog to read comes before the stream partitions'.
        self._streams_pending = False
        #: Whether this rebalance's assignment has come (a resume before it is the previous
        #: rebalance's recovery finishing late). Kept here, not from the watch's steps, so that
        #: the hold never depends on the watch's hooks.
        self._assigned_since_revoke = False
        #: The flow watch's hook failures logged (hook, exception type): each traceback once,
        #: not at every rebalance.
        self._flow_hook_failures: set[tuple[str, type[Exception]]] = set()
        #: The tables' changelog offsets last proven in this worker's membership, rewound to
        #: after it lost the membership (a zombie's own writes: ``_proven``).
        self.proven_offsets = ProvenOffsets()
        #: The member id of the assignment Faust is about to take (``_RebalanceListener``).
        self._assigned_as: str | None = None
        #: The producer's count of lost memberships at the last assignment
        #: (``_forget_acks_if_lost``).
        self._losses_at_assignment = 0
        #: Whether a commit the stall hold refuses was told (``_commits_refused``).
        self._commit_refusal_told = False
        #: Latches the first failed table store write: no commit from then on, and the
        #: worker stops (``_storefail``).
        self.store_guard = StoreFailureGuard(self._on_store_failure)
        #: The crash a failed store write scheduled (kept: the loop holds tasks weakly).
        self._store_crash: concurrent.futures.Future[Any] | None = None
        if (recovery_done := getattr(self.app, "on_rebalance_complete", None)) is not None:
            # Weak: the class-level signal keeps it (as the assignor's, ``PartitionAssignor``);
            # the app keeps its consumer (``app._consumer``), so it fires while the app lives.
            recovery_done.connect(self._on_recovery_completed, weak=True)

    def _init_recovery_watch(self) -> None:
        #: Warns when a table recovery stops applying changelog records.
        self._recovery_watch = _Ticker(self._on_recovery_watch)
        #: The recovery's applied offsets at its last progress, and when (loop time).
        self._recovery_seen: tuple[dict[TP, int | None], float] | None = None
        #: Whether the current stall was reported (once per stall).
        self._recovery_stall_told = False

    def _init_freeze_watch(self) -> None:
        #: Warns when an assigned stream partition receives nothing while it could (started
        #: at the first rebalance's release, then for the worker's life).
        self._freeze_watch = _Ticker(self._on_freeze_watch)
        self._freeze: FreezeWatch | None = None
        #: ``app.rebalancing_count`` at the watch's last look: a rebalance begun and ended
        #: between two looks restarts the clocks too.
        self._freeze_rebalances = 0
        #: Stream partitions the app paused itself: not frozen. Faust's recovery resumes every
        #: stream partition, so a rebalance forgets them.
        self._app_paused: set[TP] = set()
        #: Inside Faust's assignment callback, which pauses every assigned partition.
        self._in_faust_assignment = False

    def _new_consumer_thread(self) -> _ConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    def resume_partitions(self, tps: Iterable[TP]) -> None:
        """During a rebalance: changelog partitions at once, stream partitions at the next
        ``resume_flow()``; otherwise (the app pausing and resuming a partition itself) at once.

        Faust's recovery resumes the stream partitions before it seeks them and resumes flow
        control (which empties the agents' queues): what the fetcher delivered in between would
        be dropped unprocessed and then committed past (see the module docstring). Faust calls
        ``resume_flow()`` before ``app.on_rebalance_end()``, so the hold always ends first.
        Changelog partitions resumed during a rebalance start the recovery watch. A rebalance
        is under way while ``app.rebalancing`` says so or from a revoke until its streams are
        released (``_streams_released``): the previous rebalance's recovery may clear the
        former during the next rebalance's join."""
        tps = set(tps)
        streams: set[TP] = set()
        if self.app.rebalancing or self._streams_pending:
            changelogs = self.app.tables.changelog_topics
            streams = {tp for tp in tps if tp.topic not in changelogs}
            self._hold(streams)
            if tps - streams:
                self._watch_recovery()
        self._app_paused -= tps
        super().resume_partitions(tps - streams)

    def pause_partitions(self, tps: Iterable[TP]) -> None:
        tps = set(tps)
        self._held_streams -= tps
        # Faust pauses stream partitions only with the flow stopped (its revoke, its stop) or
        # in its assignment callback; any other pause is the app's, also one made while
        # Faust's recovery seeks (the hold then keeps it paused past the release).
        if self.flow_active and not self._in_faust_assignment:
            self._app_paused |= {tp for tp in tps if not self._is_changelog_tp(tp)}
        if not self._held_streams:
            self._hold_watch.stop()
        super().pause_partitions(tps)

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        """Faust's (which stops the flow, if anything was assigned); the start of an episode
        the flow watch follows until the ``resume_flow()`` of this rebalance's recovery, which
        ends every rebalance, also one that assigns nothing. The watch learns the rebalance's
        steps: Faust's revoke callbacks, then the group's join. A revoke before the flow
        resumed is another rebalance. The watch's hooks never stop Faust's callbacks. Every
        revoke also starts the stream partitions' hold (``resume_partitions``)."""
        self._streams_pending, self._assigned_since_revoke = True, False
        self._app_paused.clear()
        evented, self._evented_before_rebalance = self._evented_before_rebalance, frozenset()
        self._restarting |= evented
        self._flow_hook(self._flow_revoked)
        await super().on_partitions_revoked(revoked)
        # Before the join: Faust's commit timer runs on while the worker rejoins, and a commit
        # sent after the new SyncGroup would be accepted (``_forget_acks_if_lost``).
        self._proven_hook(self._forget_acks_if_lost)
        self._flow_hook(self._enter_flow_step, JOINING)

    async def on_partitions_assigned(self, assigned: set[TP], generation_id: int = 0) -> None:
        """Faust's; the flow watch learns the rebalance's next steps: Faust's assignment
        callbacks, then its table recovery setting up (which resumes the flow)."""
        # Before Faust's callback: it signals this rebalance's recovery, which (with no
        # stream_recovery_delay) may resume the flow before the callback returns.
        self._assigned_since_revoke = True
        self._start_streams(assigned)
        self._flow_hook(self._enter_flow_step, ASSIGNING)
        # Before Faust's callback: its table recovery writes the stores and reads the
        # persisted offsets there.
        self._proven_hook(self._guard_stores)
        self._proven_hook(self._rewind_if_lost)
        # Again before Faust's callback (its recovery seeks and then resumes the flow): a
        # membership lost after the revoke.
        self._proven_hook(self._forget_acks_if_lost)
        self._in_faust_assignment = True
        try:
            await super().on_partitions_assigned(assigned, generation_id)
        finally:
            self._in_faust_assignment = False
        self._proven_hook(self._prove_assignment)
        self._flow_hook(self._enter_flow_step, RECOVERING)

    def note_membership(self, membership: tuple[str, int] | None) -> None:
        """The member id and generation the coming assignment was made under (None: not
        readable). Called on the consumer thread before it hands the assignment over."""
        self._assigned_as = membership[0] if membership is not None else None

    def _proven_hook(self, hook: Callable[[], None]) -> None:
        """``hook()``; a failure is logged and Faust's rebalance goes on (raised into its
        callback it would end the worker's rebalance, not just the rewind)."""
        try:
            hook()
        except Exception:
            log.exception("the changelog offset check failed in %s", hook.__name__)

    def _rewind_if_lost(self) -> None:
        """Not under exactly_once: Faust commits through its transactions there, never
        ``_commit`` (nothing would be proven since the last rebalance), and never persists an
        active's changelog offset (faust-streaming 0.15.3 keys ``persist_offset_on_commit``
        by the changelog partition, ``on_commit`` looks it up by the source partitions): a
        zombie's own writes do not move its offsets, which only a recovery (a standby's)
        writes; such a run removes a leftover proofs file, which those offsets move past. At
        the first assignment of a run the last run's proofs are taken from the state directory
        (a zombie killed before it rejoined: ``_proven``), every changelog partition assigned
        now counting as unproven if that file is garbled. Only the changelog partitions of
        this assignment (actives and standbys, which Faust opens) are read or rewound
        (``_proven``)."""
        under_transactions = exactly_once(self.app)
        stores = changelog_stores(self.app)
        assignor, changelogs = self.app.assignor, self.app.tables.changelog_topics
        assigned = assignor.assigned_actives() | assignor.assigned_standbys()
        assigned_changelogs = {tp for tp in assigned if tp.topic in changelogs}
        if not self.proven_offsets.opened:  # the first assignment of this run: the last's proofs
            file = proofs_file(self.app, stores, maintained=not under_transactions)
            self.proven_offsets.open(file, assigned_changelogs)
        if not under_transactions:
            self.proven_offsets.rewind_if_lost(self._assigned_as, stores, assigned_changelogs)

    def _forget_acks_if_lost(self) -> None:
        """After a membership lost since the last assignment, forget every offset Faust
        acknowledged and has not committed. Faust's revoke forgets the revoked partitions'
        acknowledged offsets, then waits for its agents' current events; those it cannot commit
        there (the commit is refused without a membership, and Faust's own last commit of the
        revoke takes only the offsets up to the first hole: an event of a concurrent agent not
        finished before the revoke, a transaction marker, or a commit of its timer still under
        way) stay acknowledged, while their changelog sends were dropped (``_stallhold``). Kept,
        the next commit of the same partitions could pass them before they are processed again.
        Forgotten, no commit passes them: the assignment reads every partition again from its
        committed offset, so they are processed again whether forgotten or not. Checked at the
        end of the revoke (Faust's commit timer runs on while the worker rejoins) and again at
        the assignment (a membership lost after the revoke). All partitions, not only the
        assigned ones: rebalancing is eager (aiokafka), so the revoke forgot every partition
        held and no event has flowed since; what is acknowledged now came after that, and a
        partition assigned elsewhere would keep its offsets until it came back. Without a
        loss nothing is forgotten: the revoke flushed those sends."""
        hold = getattr(self.app.producer, "stall_hold", None)  # None: not this transport's
        losses = int(getattr(hold, "losses", 0))
        if losses == self._losses_at_assignment:
            return
        self._losses_at_assignment = losses
        with _ACK_LOCK:
            partitions = sum(1 for offsets in self._acked.values() if offsets)
            forgotten = sum(len(offsets) for offsets in self._acked.values())
            self._acked.clear()
            self._acked_index.clear()
            self._gap.clear()
        if forgotten:
            log.info(
                "forgot %d acknowledged offset(s) of %d partition(s), not committed: this "
                "worker's group membership was lost since the last assignment, and their "
                "events' changelog sends may have been dropped; they are processed again from "
                "the committed offsets before any commit passes them",
                forgotten,
                partitions,
            )

    def _prove_assignment(self) -> None:
        """The assignment Faust just took proves its active changelog partitions' offsets."""
        changelogs = self.app.tables.changelog_topics
        actives = {tp for tp in self.app.assignor.assigned_actives() if tp.topic in changelogs}
        self.proven_offsets.assigned(self._assigned_as, actives, changelog_stores(self.app))

    def _on_recovery_completed(self, sender: Any = None, **kwargs: Any) -> None:
        """Faust's ``on_rebalance_complete``: its recovery read the held offsets, unless the
        restore was interrupted (``recovery_interrupted``), which proves nothing: each later
        membership loss would rewind the restore to that join's offsets, and a worker losing
        its membership again and again would restore the same records for ever. Faust
        announces a completion again, its signal clear, once a restore has really ended."""
        self._proven_hook(self._prove_recovery)

    def _prove_recovery(self) -> None:
        if not recovery_interrupted(self.app):
            self.proven_offsets.recovered(changelog_stores(self.app))

    async def _commit(self, offsets: Mapping[TP, int]) -> bool:
        """Faust's; a commit that succeeds under the member id of the current assignment
        proves the tables' persisted offsets as they were before it (Faust flushed its
        producer first, so they include every changelog write acknowledged by then). None
        once the worker stopped with changelog sends held: they were dropped (Faust's stop
        flushes, then commits; ``_stallhold``), and a commit could pass their events."""
        if self._commits_refused(offsets):
            return False
        before = self._member_id()
        snapshot = None
        if before and before == self.proven_offsets.held_as:
            try:
                snapshot = self.proven_offsets.snapshot(changelog_stores(self.app))
            except Exception:  # the commit goes on; the last proof stays
                log.exception("cannot read the tables' persisted offsets before a commit")
        committed = await self._commit_by_stop_deadline(offsets)
        if committed and snapshot is not None and self._member_id() == before:
            self.proven_offsets.prove(snapshot)
        return committed

    async def _commit_by_stop_deadline(self, offsets: Mapping[TP, int]) -> bool:
        """Faust's commit (aiokafka's, on the consumer thread), ended by the stop's deadline
        once the worker stops (``StallHoldProducer.until_stop_deadline``): a commit request
        sent as a cut began is retried until a coordinator answers, and Faust's stop waits
        for a commit under way before its own. Cut, it is abandoned and commits are refused
        from then on; the consumer thread's stop ends its retries."""
        producer = self.app.producer
        if not isinstance(producer, StallHoldProducer) or not producer.bounds_stops():
            return bool(await super()._commit(offsets))
        committing = asyncio.ensure_future(super()._commit(offsets))
        if await producer.until_stop_deadline(committing):
            return bool(committing.result())
        producer.commit_cut_at_stop(len(offsets))
        return False

    def _commits_refused(self, offsets: Mapping[TP, int]) -> bool:
        """Whether the producer refuses commits at this stop (``commits_refused``): the first
        refusal is told at INFO, the next at DEBUG (Faust's stop commits more than once)."""
        hold = getattr(self.app.producer, "stall_hold", None)  # None: not this transport's
        if not getattr(hold, "commits_refused", False):
            return False
        log.log(
            logging.DEBUG if self._commit_refusal_told else logging.INFO,
            "a commit of %d offset(s) refused: this worker stops, and writes of its events "
            "were dropped (held during a cut) or not acknowledged in time; the partitions' "
            "next owner processes these events again",
            len(offsets),
        )
        self._commit_refusal_told = True
        return True

    def _member_id(self) -> str | None:
        return member_id(getattr(self._thread, "_consumer", None))

    def _guard_stores(self) -> None:
        self.store_guard.watch(changelog_stores(self.app).values())
        self.store_guard.watch_tables(self.app.tables.values())

    def _on_store_failure(
        self, failure: StoreFailure | SourceCountMismatch, exc: BaseException
    ) -> None:
        self._store_crash = crash_app(self.app, exc)

    async def _commit_tps(self, tps: Iterable[TP], start_new_transaction: bool) -> bool:
        """Faust's, refused once a table store write failed (or a table's check of its source
        partition count did): the event being processed then is acked by Faust although its
        table update never happened, so any commit from then on could pass it. Every commit
        of Faust (at-least-once and transactions, its timer, its revoke and its stop) comes
        through here, before it sends the messages attached to the offsets and flushes its
        producer (stopped by then: ``Cannot flush``)."""
        if self.store_guard.failed:
            log.debug("a commit refused: a table write failed")
            return False
        return bool(await super()._commit_tps(tps, start_new_transaction))

    async def on_stop(self) -> None:
        """Faust's (its last commit); then the proofs are saved again if their last save
        failed (``ProvenOffsets.save_if_failed``). The freeze watch stops first: it would
        only restart its clocks from now on."""
        self._freeze_watch.stop()
        try:
            await super().on_stop()
        finally:
            self._proven_hook(self.proven_offsets.save_if_failed)

    def verify_event_path(self, now: float, tp: TP) -> None:
        """Faust's livelock check, but not for a stream partition with no event yet within
        ``stream_processing_timeout`` of its start (``_started_at``): Faust counts its "Stream
        has not started processing" from the worker's start, so every worker older than that
        (5 min) logged it as an ERROR at rebalances for partitions it had just been given,
        still paused for the table recovery (the soak audit: 36 in 22 minutes, with either
        assignor). A stream that stays silent with records waiting is still reported, a
        timeout after its start: after its assignment, or after the end of the first
        rebalance since its last event. Changelog partitions (a table's, a standby's) never
        have a stream event: Faust's check (its fetch path's) as it is."""
        started = self._started_at.get(tp)
        fresh = started is not None and now - started < self.app.conf.stream_processing_timeout
        if fresh and tp not in getattr(self.app.monitor, "stream_inbound_time", {}):
            return
        super().verify_event_path(now, tp)

    def _start_streams(self, assigned: set[TP]) -> None:
        """An assignment: its stream partitions new to this worker start now and are renewed
        at the resumes to come (``_restart_streams``); those it kept keep their start."""
        now = time.monotonic()
        streams = {tp for tp in assigned if not self._is_changelog_tp(tp)}
        new = streams - self._started_at.keys()
        self._started_at = {tp: self._started_at.get(tp, now) for tp in streams}
        self._restarting = (self._restarting & streams) | new

    def _restart_streams(self, now: float) -> None:
        """A ``resume_flow()``: the start of each stream partition just assigned or with an
        event since its start is now. The flow is stopped during a rebalance (a recovery may
        take longer than the timeout), and Faust forgets every stream's last event at the
        rebalance's start and end, also of the partitions it kept. One that had none since its
        start is not renewed: renewed at every rebalance, a stream stuck across rebalances
        less than a timeout apart would never be reported. A partition still paused
        (the first resumes of a table recovery; the streams are resumed at its last) is renewed
        again at the next resume. Its events come from Faust's monitor: those of this
        rebalance's revoke now, those before it as the revoke listener found them."""
        inbound = getattr(self.app.monitor, "stream_inbound_time", {})
        restarted = {tp for tp in self._started_at if tp in self._restarting or tp in inbound}
        for tp in restarted:
            self._started_at[tp] = now
        self._restarting = restarted & self._paused_partitions

    def note_streams_before_rebalance(self) -> None:
        """Note the stream partitions with an event since the last rebalance before Faust
        forgets them (its ``app.on_rebalance_start()``). Called by ``_RebalanceListener`` on
        the consumer thread; one assignment, which ``on_partitions_revoked`` takes on the
        loop's thread after it. ``frozenset`` of a dict copies its keys without running
        Python code (their stored hashes), so the GIL makes it atomic against the loop's
        thread adding an event."""
        self._evented_before_rebalance = frozenset(
            getattr(self.app.monitor, "stream_inbound_time", None) or ()
        )

    def resume_flow(self) -> None:
        now = time.monotonic()
        super().resume_flow()
        held, self._held_streams = self._held_streams, set()
        self._hold_watch.stop()
        if held:  # only what is still assigned: a rebalance may have taken some away
            held &= set(self.assignment())
        if held:
            super().resume_partitions(held)
        self._restart_streams(now)  # after the release: the released ones can flow
        if self._streams_pending and self._assigned_since_revoke:
            self._streams_pending = not self._streams_released(held)
        if not self._streams_pending:
            self._watch_freezes()
        self._flow_hook(self._flow_resumed)

    def _streams_released(self, held: set[TP]) -> bool:
        """Is this ``resume_flow()`` (after the assignment) the one that ends the hold? Faust's
        recovery resumes the stream partitions before its last ``resume_flow()``, so the one
        that released some, or any once no stream partition is assigned. Its first one (the
        changelog to read) or one from the previous recovery finishing late is not."""
        if held:
            return True
        changelogs = self.app.tables.changelog_topics
        return not any(tp.topic not in changelogs for tp in self.assignment())

    def _flow_hook(self, hook: Callable[..., None], *args: Any) -> None:
        """``hook(*args)``, the flow watch's part of a Faust callback: a failure is logged (its
        traceback once per hook and kind, repeats at DEBUG) and Faust's callback goes on.
        Raised into Faust's revoke it would skip the whole revoke (aiokafka logs it and joins
        anyway: no flow stop, no producer flush); into its recovery, end it. The episode is
        dropped: with its steps unknown it might never end (every resume taken for a stale
        one) and warn of a stall that is not there. The hold does not depend on it."""
        try:
            hook(*args)
        except Exception as exc:
            self._flow_stop = None
            self._flow_watch.stop()
            failure = (getattr(hook, "__name__", ""), type(exc))
            if failure in self._flow_hook_failures:
                log.debug("the flow watch failed again in %s: %r", failure[0], exc)
            else:
                self._flow_hook_failures.add(failure)
                log.exception("the flow watch failed in %s; Faust goes on", failure[0])

    def _hold(self, streams: set[TP]) -> None:
        if not streams:
            return
        self._held_streams |= streams
        if not self._hold_watch.running:
            self._held_periods = 0
            # Once per ``broker_request_timeout``, Faust's bound on its post-recovery seek.
            self._hold_watch.start(float(self.app.conf.broker_request_timeout))

    def _on_hold_watch(self) -> bool:
        """Are the held partitions released? If Faust's recovery stops between its resume and
        its ``resume_flow()`` (a seek that times out ends its recovery task), they would stay
        paused without a word."""
        if not self._held_streams:
            return False
        self._held_periods += 1
        log.warning(
            "stream partitions %s still paused %.0f s after Faust's recovery resumed them: "
            "it has not resumed the flow (its recovery may have stopped, e.g. after a seek "
            "that timed out: see Faust's log above); restart this worker",
            sorted(self._held_streams)[:10],
            self._held_periods * float(self.app.conf.broker_request_timeout),
        )
        return True

    def _flow_step_bounds(self) -> dict[Step, float]:
        """How long each step of a rebalance may make no progress.

        - The revoke: the rebalance timeout; a member whose revoke (its agents finishing their
          events) takes longer misses the join, and the group goes on without it.
        - The join: the broker holds a JoinGroup up to the rebalance timeout for a member slow
          to rejoin (a normal rebalance), and the member whose own JoinGroup started the
          rebalance (a worker starting or rejoining) waits all of it, then the SyncGroup. The
          longest timeout among the members counts (it may exceed this worker's during a
          rollout): a relative margin, a session timeout (or ``recovery_stall_after``) more.
        - Faust's assignment callback (which reports no progress): not before Faust's own
          flight recorder names where it is (0.95 session timeout, 57 s by default); that also
          covers a RocksDB table partition locked by another process, which Faust retries
          30 times 1 s apart before it gives up.
        - The recovery setting up: after Faust's ``stream_recovery_delay``,
          ``recovery_stall_after`` and not less than ``broker_request_timeout``: each of its
          requests there (the producer's flush, highwaters, offsets, seeks) may take that
          long (a leader failover) and reports no progress."""
        conf = self.app.conf
        stall = self.recovery_stall_after
        rebalance_timeout = float(conf.broker_rebalance_timeout)
        session_timeout = float(conf.broker_session_timeout)
        delay = float(conf.stream_recovery_delay)  # before the set-up's first request
        recovering = stall + delay
        return {
            REVOKING: max(stall, rebalance_timeout),
            JOINING: rebalance_timeout + max(stall, session_timeout),
            ASSIGNING: max(recovering, session_timeout),
            RECOVERING: delay + max(stall, float(conf.broker_request_timeout)),
        }

    def _flow_revoked(self) -> None:
        """A revoke: the start of an episode, or another rebalance in the current one. Not
        ``app.rebalancing``: the previous rebalance's recovery may clear it after this revoke
        (Faust's listener sets it for this one first; that recovery's ``on_rebalance_end()``
        comes after its ``resume_flow()`` and an await)."""
        if self._flow_stop is not None:
            self._enter_flow_step(REVOKING, new_rebalance=True)
            return
        now = asyncio.get_running_loop().time()
        bounds = self._flow_step_bounds()
        episode_bound = bounds[JOINING] + bounds[RECOVERING]
        progress = self._rebalance_progress()
        self._flow_stop = FlowStop(now, time.time(), episode_bound, progress=progress)
        self._flow_stop.enter(REVOKING, now, bounds[REVOKING])
        self._flow_watch.start(self.recovery_stall_after / 4)

    def _enter_flow_step(self, step: Step, *, new_rebalance: bool = False) -> None:
        if self._flow_stop is None:
            return
        now = asyncio.get_running_loop().time()
        bound = self._flow_step_bounds()[step]
        self._flow_stop.enter(step, now, bound, new_rebalance=new_rebalance)

    def _flow_resumed(self) -> None:
        """Faust resumed the flow: the episode ends if this rebalance's assignment has come. A
        resume while the revoke or the join is under way is the previous rebalance's recovery
        finishing late (it goes on until this rebalance's assignment signals it): this
        rebalance's recovery will resume the flow again."""
        stop = self._flow_stop
        if stop is None or stop.step in (REVOKING, JOINING):
            return
        self._flow_stop = None
        self._flow_watch.stop()
        if stop.told:
            stopped = asyncio.get_running_loop().time() - stop.since
            log.info("Faust's flow resumed after %.1f s: the rebalance ended", stopped)

    def _rebalance_progress(self) -> tuple[Any, ...]:
        """What the flow watch compares between looks: Faust's rebalance count and generation
        (public ``AppT`` attributes) and whether its recovery started (``Recovery.in_recovery``;
        None for a Faust without them: then only the steps count)."""
        recovery: Any = getattr(self.app.tables, "recovery", None)
        return (
            getattr(self.app, "rebalancing_count", None),
            getattr(self.app, "consumer_generation_id", None),
            getattr(recovery, "in_recovery", None),
        )

    def _on_flow_watch(self) -> bool:
        """Has the rebalance that stopped the flow moved on since the last look? One WARNING
        per episode if it has not for its step's bound, or if the flow stays stopped through
        rebalance after rebalance (``_flowstop.FlowStop``). Stream partitions held meanwhile
        mean Faust's recovery got to its last step: the hold watch's to report. Not
        ``app.rebalancing``, which the previous rebalance's recovery may clear during this one."""
        stop = self._flow_stop
        if stop is None or self.should_stop or self.app.should_stop:
            self._flow_stop = None  # the episode ended without resume_flow() (a stopping app)
            return False
        if self._held_streams:
            return True
        line = stop.look(asyncio.get_running_loop().time(), self._rebalance_progress())
        if line is not None:
            log.warning(line)
        return True

    def _rebalancing_or_stopping(self) -> bool:
        return bool(
            self.app.rebalancing
            or self._streams_pending
            or self.should_stop
            or self.app.should_stop
        )

    def _freeze_bound(self) -> float:
        if self.stream_freeze_after is not None:
            return float(self.stream_freeze_after)
        return 2 * float(self.app.conf.broker_request_timeout)

    def _watch_freezes(self) -> None:
        if self._freeze is None:
            self._freeze = FreezeWatch(self._freeze_bound())
            self._freeze_rebalances = int(getattr(self.app, "rebalancing_count", 0) or 0)
        # Several looks per bound, so that a freeze is told soon after it lasted that long.
        self._freeze_watch.start(self._freeze.bound / 4)

    def _on_freeze_watch(self) -> bool:
        """Has each assigned stream partition with records waiting received something within
        the bound? Looks only while the flow is resumed and no rebalance or recovery is under
        way (the clocks restart otherwise: the other watches cover those). One WARNING per
        freeze (``_report_frozen``), one INFO line when a reported partition moves again. A
        rebalance begun and ended between two looks restarts the clocks too: a partition still
        before it was sought and released again."""
        watch = self._freeze
        if watch is None or self.should_stop or self.app.should_stop:
            return False
        recovery: Any = getattr(self.app.tables, "recovery", None)
        in_recovery = bool(getattr(recovery, "in_recovery", False))
        rebalances = int(getattr(self.app, "rebalancing_count", 0) or 0)
        rebalanced, self._freeze_rebalances = rebalances != self._freeze_rebalances, rebalances
        if not self.flow_active or self._rebalancing_or_stopping() or in_recovery or rebalanced:
            watch.restart()
            return True
        received = int(getattr(self.app.monitor, "messages_received_total", 0) or 0)
        now = asyncio.get_running_loop().time()
        frozen, moving = watch.look(now, self._stream_looks(), received)
        if frozen:
            self._report_frozen(frozen)
        if moving:
            log.info("stream partitions %s receive records again", _partition_list(moving))
        return True

    def _stream_looks(self) -> dict[TP, StreamLook]:
        """The assigned stream partitions the app did not pause: aiokafka's fetch position and
        last fetched highwater of each, and where Faust's consumer has it. Read without a lock
        from aiokafka's thread (a snapshot: the watch compares looks a period apart)."""
        consumer = getattr(self._thread, "_consumer", None)
        assignment = current_assignment(consumer)
        if consumer is None or assignment is None:
            return {}
        active = self._active_partitions or set()
        buffer_full = self._buffered_partitions
        # set() of a dict copies it without letting aiokafka's thread run in between.
        fetched = set(getattr(getattr(consumer, "_fetcher", None), "_records", None) or ())
        looks = {}
        for tp in consumer.assignment():
            tp = TP(tp.topic, tp.partition)
            state = assignment.state_value(tp)
            if state is None or self._is_changelog_tp(tp) or tp in self._app_paused:
                continue
            looks[tp] = StreamLook(
                position=getattr(state, "_position", None),
                highwater=_readable_end(state, read_committed=bool(self.in_transaction)),
                paused_by_faust=tp not in active and tp not in buffer_full,
                buffer_full=tp in buffer_full,
                records_buffered=tp in fetched,
            )
        return looks

    def _report_frozen(self, frozen: list[Frozen]) -> None:
        """One WARNING naming the frozen partitions with their positions and lag. Those left
        out of Faust's active set (paused in Faust's consumer after the rebalance ended, not by
        the app nor by its flow control) are resumed: Faust's recovery resumes every stream
        partition and sought them to their committed offsets, and nothing of them was handed
        out since, so they resume where Faust's commits stand."""
        paused = {f.partition for f in frozen if f.paused_by_faust}
        if paused:
            super().resume_partitions(paused)
        fetching = fetch_states(
            getattr(self._thread, "_consumer", None), [f.partition for f in frozen]
        )
        rows = [
            f"{_partition_name(f.partition)} at {f.position} of {f.highwater} "
            f"(lag {'?' if f.lag is None else f.lag}; still for {f.still_for:.0f} s; Faust: "
            f"{'paused' if f.paused_by_faust else 'active'}; aiokafka: "
            f"{fetching.get(f.partition, '?')})"
            for f in sorted(frozen, key=lambda f: f.partition)
        ]
        actions = []
        if paused:
            actions.append(
                "those Faust paused were left paused in its consumer after the last "
                "rebalance (not by the app, nor by its flow control): resumed them now"
            )
        if len(paused) < len(frozen):
            actions.append(
                "Faust asks aiokafka for the others and receives nothing; aiokafka's state of "
                "each is above (node N busy: a fetch to broker N has not returned). A fetch "
                "stuck in aiokafka ends if the worker restarts or at the next rebalance; a "
                "leader this worker cannot reach, or records at the partition's end removed "
                "(a compacted topic), keep it still after a restart too"
            )
        log.warning(
            "stream partitions receive nothing although records wait, the flow is resumed "
            "and no rebalance is under way: %s; %s",
            _first_ten(rows),
            "; ".join(actions),
        )

    def _watch_recovery(self) -> None:
        if not self._recovery_watch.running:
            self._recovery_seen, self._recovery_stall_told = None, False
            # Several looks per bound, so that a stall is told soon after it lasted that long.
            self._recovery_watch.start(self.recovery_stall_after / 4)

    def _on_recovery_watch(self) -> bool:
        """Has the table recovery applied anything since the last look? One WARNING per stall
        while some changelog partition is behind (naming them, with offsets), one INFO line if
        it moves again. A recovery whose fetcher stopped reading logs only Faust's ``No event
        received for active tp``, every 5 s, without positions (docs/faust.md, "Topics that do
        not exist yet"). While the flow is stopped (a rebalance interrupted the recovery, or
        the next one is setting up) nothing can be applied: the clock restarts instead, and a
        rebalance that never resumes the flow is the flow watch's to report (the hold watch's
        once stream partitions are held)."""
        recovery: Any = getattr(self.app.tables, "recovery", None)  # Faust's Recovery service
        if recovery is None or not recovery.in_recovery:
            self._recovery_seen = None
            return False
        now = asyncio.get_running_loop().time()
        applied = {tp: recovery.active_offsets.get(tp) for tp in recovery.active_tps}
        if not self.flow_active:  # a new stall (and no "moving again") once the flow resumes
            self._recovery_seen, self._recovery_stall_told = (applied, now), False
            return True
        if self._recovery_seen is None or self._recovery_seen[0] != applied:
            if self._recovery_stall_told and self._recovery_seen is not None:
                log.info("table recovery moving again after %.1f s", now - self._recovery_seen[1])
            self._recovery_seen, self._recovery_stall_told = (applied, now), False
            return True
        stalled_for = now - self._recovery_seen[1]
        if stalled_for < self.recovery_stall_after or self._recovery_stall_told:
            return True
        highwaters = recovery.active_highwaters
        behind = sorted(
            tp
            for tp, offset in applied.items()
            if highwaters.get(tp) is not None and (offset is None or offset < highwaters[tp])
        )
        if behind:  # else caught up: Faust ends the recovery
            self._recovery_stall_told = True
            log.warning(
                "table recovery has applied nothing for %.1f s; changelog partitions behind: "
                "%s; Faust's fetcher may have stopped reading them: restart this worker if it "
                "does not move",
                stalled_for,
                self._describe_behind(behind, applied, highwaters),
            )
        return True

    def _describe_behind(
        self, behind: list[TP], applied: Mapping[TP, int | None], highwaters: Mapping[TP, Any]
    ) -> str:
        """Each of ``behind`` (at most 10): ``topic[partition] applied/highwater``, then what
        Faust's consumer (in its active set or not, the offset it last handed on) and aiokafka
        (``fetch_states``) make of it: where a stalled recovery's records stop."""
        # Not _get_active_partitions(), which sets Faust's active set when it has none.
        active = self._active_partitions or set()
        fetching = fetch_states(getattr(self._thread, "_consumer", None), behind[:10])
        rows = [
            f"{_partition_name(tp)} {applied[tp]}/{highwaters[tp]} (Faust: "
            f"{'active' if tp in active else 'inactive'}, handed on to "
            f"{self._read_offset.get(tp)}; aiokafka: {fetching.get(tp, '?')})"
            for tp in behind
        ]
        return _first_ten(rows)


class Transport(faust_aiokafka.Transport):
    """Faust's aiokafka transport whose consumer always uses ``app.assignor``."""

    Consumer = _Consumer
    Producer = StallHoldProducer
