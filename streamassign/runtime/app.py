"""The runtime application: a topology, a processor per subtopology, N consumers in one process.

Built on ``ProcessHost`` (the protocol, stickiness reporting, per-task callbacks). ``App``
wires the parts from its arguments, checked by ``settings``; each part is in its own module:
``tasks`` (a task and the processor's view of it), ``processing`` (records through
processors), ``commits`` (commits and the membership checks), ``restore`` (the state
updater, reading changelogs for restores, standbys and warmups; and changelog lookups),
``standbys`` (the standby stores), ``task_stores`` (opening, handing over and closing
stores) and ``transactions`` (exactly once: a transactional producer per task).
``changelog.py`` says how writes, commits and restores keep table state exact under
at-least-once delivery; ``docs/runtime.md`` has the whole design.

Concurrency: one asyncio loop. Each consumer has its own processing loop and lock; a rebalance
takes the lock, commits, and bumps an epoch so a batch fetched before it is dropped (its offsets
were not committed; the next owner reads it again). The rebalance callbacks only open or hand
over stores: the state updater (``restore.py``, its own loop) restores a newly assigned task
while its input partitions are paused, and hands it back (``_restored``, under its consumer's
lock) to compensate orphan writes and resume its input.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import Awaitable, Coroutine, Mapping, Sequence
from typing import Any, Literal

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.errors import GroupAuthorizationFailedError, KafkaConnectionError

from .. import TaskId, TopicPartition
from ..aiokafka import closing
from ..aiokafka.bootstrap import (
    CERTIFICATE,
    CLOSED,
    NOT_SASL,
    RESET,
    ConnectFailure,
    ConnectFailures,
)
from ..aiokafka.closing import Release, release_consumer, release_producer, stop_within
from ..aiokafka.floods import BrokerAwayLines
from ..aiokafka.streams import ProcessHost, TaskListener
from ..errors import (
    CommitRetriesExhaustedError,
    ErrorCode,
    GroupNotAuthorizedError,
    InternalTopicError,
    NotAuthorizedError,
    OutputWriteError,
    RuntimeConfigError,
    StartStoppedError,
    StoreIOError,
    StoreNotOpenError,
    TransactionFailedError,
)
from ..protocol import LATEST_VERSION
from ..streams import ACCEPTABLE_RECOVERY_LAG
from ..topology import Topology
from ._clients import (
    AIOKAFKA_BATCH_BYTES,
    SHARED_BATCH_BYTES,
    Clients,
    capped_batches,
    connection_settings,
    principal,
    with_connection,
)
from ._topics import (
    BROKER_DEFAULT_REPLICATION,
    ChangelogCheck,
    ensure_internal_topics,
    max_message_bytes,
    written_topics,
)
from .changelog import StoreState
from .cleanup import StateCleanup
from .commits import Commits
from .end_offsets import EndOffsetsCache, changelog_partitions
from .processing import GATE_REUSE, CutOffGate, ErrorPolicy, Processing, ProcessingError
from .restore import ChangelogLookups, Restoring, StateUpdater
from .settings import PROCESSING_GUARANTEES as PROCESSING_GUARANTEES
from .settings import STATE_CLEANUP_DELAY_MS, ProcessingGuarantee, Settings
from .standbys import Standbys, is_open
from .stores import DEFAULT_ROCKSDB_MEMORY_MIB, RocksDBMemory, StoreKind
from .task_stores import TaskStores, start_of
from .tasks import (
    ActiveTask,
    Processor,
    ProcessorFactory,
    Record,
    RestoreEvent,
    Table,
    TaskContext,
    drop_writes,
    source_of,
    tear,
)
from .transactions import OrphanTransactions, TaskProducers

__all__ = [
    "App",
    "ErrorPolicy",
    "ProcessingError",
    "ProcessingGuarantee",
    "Processor",
    "ProcessorFactory",
    "Record",
    "RestoreEvent",
    "RuntimeConfigError",
    "Table",
    "TaskContext",
]

log = logging.getLogger("streamassign.runtime")

#: aiokafka's default ``max_poll_interval_ms``.
AIOKAFKA_MAX_POLL_INTERVAL_MS = 300_000

#: aiokafka's default ``session_timeout_ms``.
AIOKAFKA_SESSION_TIMEOUT_MS = 10_000

#: aiokafka's default ``heartbeat_interval_ms``.
AIOKAFKA_HEARTBEAT_INTERVAL_MS = 3_000

#: Seconds a task change cancelled at stop may take to unwind before ``stop()`` goes on
#: without it: its cleanups are local store writes finishing in their thread and producer
#: stops (an orphan check's), each bounded by ``closing.CLOSE_TIMEOUT``.
UNWIND_TIMEOUT = closing.CLOSE_TIMEOUT + 5.0

#: How many of the latest restores ``App.restore_events`` keeps (a few per task per
#: rebalance; the logs have every one).
RESTORE_EVENTS_KEPT = 1000

#: A partition no consumer is ever assigned: ``getmany`` restricted to it returns nothing
#: (see ``App._poll_nothing``).
_NO_PARTITION = KafkaTopicPartition("", -1)


class App:
    """A stream processing application (see the module docstring and ``docs/runtime.md``).

    ``topology``: a ``Topology`` or the path of a topology TOML file (its ``name`` is the
    application id); ``processors``: a processor factory per subtopology id. ``store_kind``:
    ``"rocksdb"`` (persistent, sticky across restarts) or ``"memory"``.

    ``high_availability=True``: actives move only onto caught-up state; new owners first get
    warmups (run like standbys) and take over at a probing rebalance every
    ``probing_rebalance_interval_ms`` (see ``docs/ha.md``). The process then keeps every
    stateful task's changelog end offsets cached (``end_offsets``) for exact lags when it leads.

    ``replication_factor``: replicas of the internal topics (changelogs, repartition topics)
    the application creates; -1 (the default, as Kafka Streams' since 3.0) takes the broker's
    ``default.replication.factor``. Topics that exist are left as they are. With one replica,
    a broker restart leaves their partitions without a leader until it is back.

    ``state_cleanup_delay_ms`` (Kafka Streams' ``state.cleanup.delay.ms``): the local state of
    a task this process has not held for that long is deleted (``cleanup.py``); None keeps it.

    ``rocksdb_memory_mib``: the memory all RocksDB stores of this App share for memtables and
    block cache (per App: two Apps in one process have one each; ``stores.RocksDBMemory``).
    Each open store needs ~4 MiB of it: beyond ``rocksdb_memory_mib / 4`` stores the memory
    grows to ~4 MiB per store (warned, again as they double). Each store's memtables are at
    most 2 x 8 MiB.

    ``max_version``: the highest streams protocol version this process speaks, 1 to
    ``LATEST_VERSION`` (``ProcessHost(max_version=...)``). An upgrade does not need it
    (version probing); a capped leader reads no topology announcement, see
    ``docs/runtime.md``.
    """

    def __init__(
        self,
        topology: Topology | str | os.PathLike[str],
        processors: Mapping[int, ProcessorFactory],
        *,
        bootstrap_servers: str,
        state_dir: str | os.PathLike[str],
        threads: int = 1,
        num_standby_replicas: int = 0,
        store_kind: StoreKind = "rocksdb",
        commit_interval_ms: int = 1000,
        processing_errors: ErrorPolicy = "stop",
        processing_guarantee: ProcessingGuarantee = "at_least_once",
        replication_factor: int = BROKER_DEFAULT_REPLICATION,
        endpoint: str | None = None,
        consumer_config: Mapping[str, Any] | None = None,
        producer_config: Mapping[str, Any] | None = None,
        high_availability: bool = False,
        acceptable_recovery_lag: int = ACCEPTABLE_RECOVERY_LAG,
        max_warmup_replicas: int = 2,
        probing_rebalance_interval_ms: int = 600_000,
        state_cleanup_delay_ms: int | None = STATE_CLEANUP_DELAY_MS,
        rocksdb_memory_mib: int = DEFAULT_ROCKSDB_MEMORY_MIB,
        max_version: int = LATEST_VERSION,
    ) -> None:
        settings = Settings(
            topology=topology,
            store_kind=store_kind,
            processors=processors,
            processing_errors=processing_errors,
            processing_guarantee=processing_guarantee,
            producer_config=producer_config,
            commit_interval_ms=commit_interval_ms,
            consumer_config=consumer_config,
            state_cleanup_delay_ms=state_cleanup_delay_ms,
            rocksdb_memory_mib=rocksdb_memory_mib,
            max_version=max_version,
        )
        #: The bound all this App's RocksDB stores share (None with in-memory stores).
        self.rocksdb_memory = (
            RocksDBMemory.of(settings.rocksdb_memory_mib)
            if settings.store_kind == "rocksdb"
            else None
        )
        self.processing_guarantee = settings.processing_guarantee
        #: Seconds a transaction may stay open before the broker aborts it (exactly once).
        self.transaction_timeout = settings.transaction_timeout_ms / 1000
        self.topology = settings.topology
        self.processors = dict(settings.processors)
        self.store_kind = settings.store_kind
        self.commit_interval = settings.commit_interval_ms / 1000
        #: Seconds ``stop()`` lets each loop finish its current record before cancelling it.
        self.stop_grace = 30.0
        valid = type(replication_factor) is int and (
            replication_factor >= 1 or replication_factor == BROKER_DEFAULT_REPLICATION
        )
        if not valid:
            raise RuntimeConfigError(
                f"replication_factor={replication_factor!r}: expected 1 or more, or -1 for the "
                "broker's default.replication.factor"
            )
        self.replication_factor = replication_factor
        self.consumer_config = dict(settings.consumer_config)
        self.producer_config = dict(settings.producer_config)
        #: TLS/SASL settings of ``consumer_config``, for the process's other clients.
        self.connection_config = connection_settings(self.consumer_config)
        #: Changelog end offsets of every stateful task, for the leader's lags (HA only).
        self.end_offsets: EndOffsetsCache | None = (
            EndOffsetsCache(committed=self.exactly_once) if high_availability else None
        )
        self.host = ProcessHost(
            self.topology,
            bootstrap_servers=bootstrap_servers,
            state_dir=state_dir,
            threads=threads,
            endpoint=endpoint,
            num_standby_replicas=num_standby_replicas,
            listener=_Listener(self),
            consumer_config=self.consumer_config,
            high_availability=high_availability,
            acceptable_recovery_lag=acceptable_recovery_lag,
            max_warmup_replicas=max_warmup_replicas,
            probing_rebalance_interval_ms=probing_rebalance_interval_ms,
            end_offsets=self.end_offsets,
            max_version=max_version,
        )
        self.bootstrap_servers = bootstrap_servers
        self.threads = threads
        #: The latest restores of active tasks, oldest first (tests and benchmarks read it);
        #: bounded so that a process that runs for months does not grow with its rebalances.
        self.restore_events: list[RestoreEvent] = []
        self.failure: BaseException | None = None
        #: Whether ``run()`` drives this App: its ``stop()`` cleans up a failed start, under
        #: the line filter (a broker away at start logs its retries there too).
        self._in_run = False
        self._wire(settings.processing_errors, settings.state_cleanup_delay_ms)

    def _wire(self, processing_errors: ErrorPolicy, cleanup_delay_ms: int | None) -> None:
        """The parts (see the module docstring) and what the loops share."""
        self._clients = Clients()
        self._actives: dict[TaskId, ActiveTask] = {}
        self._standbys = Standbys()
        self._stores = TaskStores(
            self.topology, self.store_kind, self.host.state, self._standbys, self.rocksdb_memory
        )
        check = ChangelogCheck(self.topology, self.bootstrap_servers, self.connection_config)
        self._updater = StateUpdater(
            self._clients,
            self._standbys,
            self._stores.checkpoint,
            self._restored,
            check=check,
            start_over=self._stores.start_over,
        )
        self._lookups = ChangelogLookups(self._clients, check)
        self._processing = Processing(
            self.topology,
            self._clients,
            self._actives,
            processing_errors,
            self._transaction_failed if self.exactly_once else None,
            check,
        )
        self._rebalancing: set[int] = set()
        self._commits = Commits(
            self.host, self._clients, self._actives, self._lookups, self._stores, self._rebalancing
        )
        self._repartition = frozenset(self.topology.repartition_topics)
        self._init_loop_state()
        #: At least once: aborts what a crashed exactly-once owner left open (``start``).
        self._orphans: OrphanTransactions | None = None
        #: Deletes the local state of tasks no longer held (None: kept for good).
        self._cleanup = (
            None
            if cleanup_delay_ms is None
            else StateCleanup(self.host.state, cleanup_delay_ms, self._held_tasks, self._stores)
        )
        self._cleaning: asyncio.Task[None] | None = None
        #: When ``stop()`` began (``time.monotonic()``), for its warnings.
        self._stop_began = 0.0
        #: Whether ``stop()`` was called: a ``start()`` under way ends at its next step.
        self._stop_asked = False
        #: Done when the ``start()`` under way has ended (None: none began).
        self._start_ended: asyncio.Future[None] | None = None
        #: Done when the ``stop()`` under way has ended (None: none is).
        self._stop_ended: asyncio.Future[bool] | None = None
        #: The time limit (none) of the clients' starts, which ``stop()`` moves to now.
        self._clients_cut: asyncio.Timeout | None = None
        #: Holds back aiokafka's repeated broker-away lines, start to stop (shared; None: off).
        self._broker_away_lines: BrokerAwayLines | None = None

    def _init_loop_state(self) -> None:
        """What the consumer loops, the host callbacks and ``stop()`` share."""
        self._suspended: dict[int, frozenset[TaskId]] = {}
        self._locks = [asyncio.Lock() for _ in range(self.threads)]
        self._epochs = [0] * self.threads
        #: When each consumer's last poll ended (for the out-of-group line).
        self._polled_at = [time.monotonic()] * self.threads
        #: Consumers found out of the group and not assigned since (for the rejoin line).
        self._out_of_group: set[int] = set()
        self._stopped = asyncio.Event()
        #: Set by ``stop()`` once the loops have ended: task changes are no-ops from then on.
        self._closing = False
        self._changes = 0  # task changes (host callbacks) under way
        self._changes_done = asyncio.Event()
        self._changes_done.set()
        #: Each change under way as its own task, with its consumer and what it does: what
        #: ``stop()`` cancels when one outlasts the grace (``_abandon_changes``).
        self._changing: dict[asyncio.Task[None], tuple[int, str]] = {}
        #: Consumers whose cancelled change still ran after ``UNWIND_TIMEOUT``: it may be
        #: writing to their tasks' stores in a thread, so ``stop()`` leaves those open.
        self._unwinding: set[int] = set()
        self._loops: list[asyncio.Task[None]] = []
        #: At least once: stops a consumer's processing while it is probably out of its group
        #: unknowingly (exactly once fences such a zombie's writes; see ``_cut_off``).
        session = self.consumer_config.get("session_timeout_ms", AIOKAFKA_SESSION_TIMEOUT_MS)
        interval = self.consumer_config.get("heartbeat_interval_ms", AIOKAFKA_HEARTBEAT_INTERVAL_MS)
        self._gate = (
            None
            if self.exactly_once
            else CutOffGate.of(self.threads, session / 1000, interval / 1000)
        )

    @property
    def state(self) -> Any:
        return self.host.state

    @property
    def exactly_once(self) -> bool:
        return self.processing_guarantee == "exactly_once"

    @property
    def isolation_level(self) -> str:
        """What the input consumers and the query server read: ``read_committed`` (aborted
        transactions skipped, up to the last stable offset) unless ``consumer_config`` sets
        ``read_uncommitted`` (at least once only). Changelog readers read ``read_committed``
        always (see ``start``)."""
        return str(self.consumer_config["isolation_level"])

    @property
    def processing_errors(self) -> ErrorPolicy:
        return self._processing.errors

    @processing_errors.setter
    def processing_errors(self, policy: ErrorPolicy) -> None:
        self._processing.errors = policy

    @property
    def processed(self) -> int:
        """Records processed by this process's actives."""
        return self._processing.processed

    @property
    def skipped(self) -> int:
        """Records skipped as replays (already in every store of their task)."""
        return self._processing.skipped

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Create internal topics, start the producer, the restore consumers and the host.
        ``stop()`` during it ends it with ``StartStoppedError``: at once while its clients
        start or its consumers wait for their first assignment, else at its next step."""
        if self._stop_asked:
            started = self._start_ended is not None
            raise StartStoppedError.refusing_start("the application", started, "make a new App")
        self._start_ended = asyncio.get_running_loop().create_future()
        try:
            await self._start_filtered()
        finally:
            self._start_ended.set_result(None)

    async def _start_filtered(self) -> None:
        """``start()`` under the broker-away line filter, failures worded."""
        if self._broker_away_lines is None:  # detached: stop()
            self._broker_away_lines = BrokerAwayLines.attach()
        try:
            with ConnectFailures(self.connection_config.get("sasl_mechanism")) as failures:
                try:
                    await self._start_steps()
                except KafkaConnectionError as exc:
                    worded = _with_reason(exc, failures.reason())
                    if worded is exc:
                        raise  # its own cause kept (a reset, a TLS error under "closed")
                    raise worded from exc
        except BaseException:  # a caller not using ``run()`` may never stop() a failed start
            if not self._in_run:
                self._detach_broker_away_lines()
            raise

    async def _start_steps(self) -> None:
        """The steps of ``start()``, in order."""
        stores_on_disk = self.store_kind == "rocksdb" and any(
            sub.stateful for sub in self.topology.subtopologies
        )
        if stores_on_disk:  # refused before joining, not at the claimed opens
            self.state.probe_writes()
        counts = await ensure_internal_topics(
            self.topology,
            self.bootstrap_servers,
            replication_factor=self.replication_factor,
            admin_config=self.connection_config,
            state=self.state,  # a deleted changelog it holds data of is refused
        )
        if self.store_kind == "memory":  # checkpoints of a previous run describe nothing now
            self.state.delete_checkpoints()
        if self.end_offsets is not None:  # known before the first rebalance
            self._raise_if_stop_asked("after creating the internal topics")
            self.end_offsets.track(changelog_partitions(self.topology, counts))
            await self.end_offsets.start(self.bootstrap_servers, self.connection_config)
        self._raise_if_stop_asked("before making the producers")
        await self._make_producers()
        self._raise_if_stop_asked("before starting the clients")
        await self._start_clients()
        self._raise_if_stop_asked("before joining the group")
        await self._join_group()
        self._raise_if_stop_asked("as it joined the group")  # (no await from here to the loops)
        log.info(
            "process %s started: %d consumer(s), %s stores, %d standby replica(s), %s",
            self.host.process_id,
            self.threads,
            self.store_kind,
            self.host.num_standby_replicas,
            self.processing_guarantee,
        )
        loops = [
            self._fail_on_error(self._consume(i), f"consumer {i}") for i in range(self.threads)
        ]
        loops.append(self._fail_on_error(self._state_updater_loop(), "the state updater"))
        self._loops = [asyncio.create_task(loop) for loop in loops]
        if self._cleanup is not None:  # (fails never: a failed check is logged and retried)
            self._cleaning = asyncio.create_task(self._cleanup.run(self._stopped))

    def _raise_if_stop_asked(self, when: str) -> None:
        if self._stop_asked:
            raise StartStoppedError(f"the application's start was stopped {when}")

    async def _make_producers(self) -> None:
        """The producers' configuration (batches capped below the written topics' limits)
        and the producers: the shared one (at least once, not started yet, with the orphan
        transaction check) or the task producers (exactly once, started per task)."""
        clients = self._clients
        clients.limits = await max_message_bytes(
            self.bootstrap_servers,
            written_topics(self.topology),
            admin_config=self.connection_config,
        )
        # Idempotent: a retried send is neither duplicated nor reordered in the changelog.
        producer_config = capped_batches(
            {
                "acks": "all",
                "linger_ms": 5,
                "enable_idempotence": True,
                **with_connection(self.producer_config, self.connection_config),
            },
            clients.limits,
            AIOKAFKA_BATCH_BYTES if self.exactly_once else SHARED_BATCH_BYTES,
        )
        clients.compressed = producer_config.get("compression_type") is not None
        clients.principal = principal(producer_config)
        if self.exactly_once:  # each task's own transactional producer (fencing), no other
            clients.task_producers = TaskProducers(
                self.host.application_id,
                self.bootstrap_servers,
                producer_config,
                principal=clients.principal,
            )
        else:
            clients.shared_producer(self.bootstrap_servers, producer_config)
            self._orphans = OrphanTransactions(
                self.host.application_id,
                self.bootstrap_servers,
                producer_config,
                self.connection_config,
                principal=clients.principal,
            )

    async def _start_clients(self) -> None:
        """Start the restore and changelog readers and the shared producer, if any."""
        clients = self._clients
        # Changelogs are read read_committed in both modes: at least once writes no
        # transactions (so nothing changes), but a changelog an exactly-once run wrote may hold
        # aborted commits, store markers included, which a restore must not apply.
        restore_config = {
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",
            "isolation_level": "read_committed",
            **self.connection_config,
        }
        clients.restorer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap_servers, **restore_config
        )
        clients.changelog_reader = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap_servers, **restore_config
        )
        starts = [clients.restorer.start(), clients.changelog_reader.start()]
        if clients.producer is not None:
            starts.append(clients.producer.start())
        # No time limit but the stop: the shared producer's start (idempotent) asks for its
        # producer id for ever while the broker is away. stop() moves this limit to now,
        # which cancels the starts (as TaskProducers.renew's time limit cancels a producer's
        # start) and waits for them to end: none finishes after the stop.
        cut = self._clients_cut = asyncio.timeout(None)
        try:
            async with cut:
                await _all_or_none(starts)
        except TimeoutError as exc:
            if not cut.expired():  # raised by a start itself
                raise
            # asyncio.timeout raised this from the cut's CancelledError, which _all_or_none
            # raised from a start's failure, if one failed.
            cancel = exc.__cause__
            raise StartStoppedError(
                "the application's start was stopped while its clients started"
            ) from (cancel.__cause__ if cancel is not None else None)
        finally:
            self._clients_cut = None

    async def _join_group(self) -> None:
        """Start the host (its consumers join the group); a group the principal may not use
        raises ``GroupNotAuthorizedError`` naming the ACL, not aiokafka's bare error."""
        try:
            await self.host.start()
        except GroupAuthorizationFailedError as exc:
            raise self._group_refused() from exc

    def _group_refused(self) -> GroupNotAuthorizedError:
        group = self.host.application_id
        return GroupNotAuthorizedError(
            f"consumer group {group!r} not authorized for {principal(self.connection_config)}: "
            f"grant READ on group {group!r} (joining, heartbeats and offset commits need it)"
        )

    def _state_updater_loop(self) -> Coroutine[Any, Any, None]:
        return self._updater.run(self._stopped, lambda: self.commit_interval)

    async def _fail_on_error(self, loop: Awaitable[None], what: str) -> None:
        """Run a loop; its failure stops the application (once, clearly), never silently
        ends the loop while the rest goes on."""
        try:
            await loop
        except asyncio.CancelledError:
            raise
        except GroupAuthorizationFailedError as exc:  # the group's READ taken away
            refused = self._group_refused()
            refused.__cause__ = exc
            self._note_failure(what, refused, "stopping the application")
            self._stopped.set()
        except Exception as exc:
            self._note_failure(what, exc, "stopping the application")
            self._stopped.set()

    async def wait(self) -> None:
        """Until ``stop()``, a requested shutdown or a failure."""
        await self._stopped.wait()

    async def run(self) -> None:
        """``start``, wait, ``stop``; re-raises what stopped the application, if anything.
        A failed start is cleaned up too (producer, consumers, stores). A ``stop()`` during
        the start (a SIGTERM handler's) ends it, and ``run()`` returns once stopped."""
        self._in_run = True
        try:
            await self.start()  # (subclasses may override it)
            await self.wait()
        except StartStoppedError:
            if not self._stop_asked:  # raised by a subclass's start, not by a stop
                raise
            log.info("the start was stopped (stop() was called while starting)")
        finally:
            await self.stop()
        if self.failure is not None:
            raise ProcessingError(f"the application stopped: {self.failure!r}") from self.failure

    async def stop(self) -> None:
        """Commit (unless a failure stopped us), flush and checkpoint every store, close.
        Each step runs even if one before it failed: that failure is logged and kept as
        ``failure`` (unless there is one already), which ``run()`` raises. ``stop()`` itself
        raises none of them: a caller of ``start()`` and ``stop()`` checks ``failure``
        after it (a commit at stop the broker refused, say).

        Called while ``start()`` is under way, it first lets the start end (it raises
        ``StartStoppedError`` at once while its clients start or it waits for the first
        assignment, else at its next step), then stops whatever the start had made. A
        second ``stop()`` while one is under way waits for that one (and runs, should that
        one be cancelled)."""
        while self._stop_ended is not None:
            under_way = self._stop_ended
            await asyncio.wait([under_way])
            if under_way.result():
                return
        self._stop_ended = ended = asyncio.get_running_loop().create_future()
        self._stop_began = time.monotonic()
        self._stop_asked = True
        completed = False
        try:
            await self._start_unwound()
            await self._stop_steps()
            completed = True
        finally:  # even a cancelled stop: the filter must not outlive the App
            self._detach_broker_away_lines()
            self._stop_ended = None
            ended.set_result(completed)
        log.info("process %s stopped", self.host.process_id)

    async def _start_unwound(self) -> None:
        """Wait for a ``start()`` under way to end. The clients' starts are cancelled and
        ``begin_stop`` ends the wait for the first assignment; each other step ends at its
        clients' timeouts (see "A stop during the start" in ``docs/runtime.md``)."""
        self.host.begin_stop()
        cut = self._clients_cut
        if cut is not None and not cut.expired():  # their stop is then the stop steps' to do
            cut.reschedule(asyncio.get_running_loop().time())
        starting = self._start_ended
        if starting is None or starting.done():
            return
        log.info("stop() called while starting: waiting for the start to end")
        await asyncio.wait([starting])

    def _detach_broker_away_lines(self) -> None:
        """Detaches the line filter (``start``), saying what it held back and not yet said."""
        if self._broker_away_lines is None:
            return
        held_back = self._broker_away_lines.detach()
        self._broker_away_lines = None
        if held_back is not None:
            log.warning("%s", held_back)

    async def _stop_steps(self) -> None:
        """The steps of ``stop()``, in order."""
        # First: a rebalance during the grace, commits and closes below (consumers of other
        # processes leaving) must not start tasks here, nor save them as restart claims.
        self.host.begin_stop()
        self._stopped.set()
        if self._cleaning is not None:  # a delete under way finishes in its thread, unawaited:
            self._cleaning.cancel()  # it must not hold up the commits and leaving the group
            await asyncio.gather(self._cleaning, return_exceptions=True)
            self._cleaning = None
        cut = await self._stop_loops()
        self._closing = True  # host callbacks from here on change nothing
        await self._stop_step(self._commit_at_stop(cut), "the commit at stop")
        await self._stop_step(self._stop_task_producers(), "stopping the task producers")
        await self._stop_step(self._close_every_store(), "closing the stores")
        await self._stop_step(self.host.stop(), "leaving the group")
        if self.end_offsets is not None:
            await self._stop_step(self.end_offsets.stop(), "stopping the end offsets reader")
        await self._stop_step(self._stop_clients(), "stopping the clients")

    async def _stop_step(self, step: Awaitable[None], what: str) -> None:
        """One step of ``stop()``. A failure is logged and kept (for ``run()`` to raise as
        ``ProcessingError``), and the steps after it still run: a failed commit at stop must
        not leave stores open (their locks held, not checkpointed), the consumers in the
        group (the others wait a session timeout for them) or the clients running."""
        try:
            await step
        except Exception as exc:
            self._note_failure(what, exc, "stopping anyway")

    def _note_failure(self, what: str, exc: Exception, then: str) -> None:
        """Log a failed loop or stop step and keep the first failure for ``run()``. A failure
        whose message says what and why (``_says_why``) is one line, and so is a later one of
        the first failure's type (each consumer meeting the same full disk, say; its trace at
        DEBUG); any other keeps its trace, a bug after the first failure too. Called from the
        ``except`` block, where ``log.exception`` finds the trace."""
        again = "failed too" if self.failure is not None else "failed"
        if _says_why(exc):
            log.error("%s %s; %s: %s", what, again, then, exc)
        elif self.failure is not None and type(exc) is type(self.failure):
            log.error("%s %s; %s: %s", what, again, then, _one_line(exc))
            log.debug("%s %s", what, again, exc_info=True)
        else:
            log.exception("%s %s; %s", what, again, then)
        if self.failure is None:
            self.failure = exc

    async def _stop_loops(self) -> set[int]:
        """Cooperative: each loop finishes the record it is on and exits. Only a loop stuck
        past the grace period is cancelled; its consumer then commits nothing (its tasks'
        uncommitted state is dropped, so the next owner recovers as after a crash). Returns
        the consumers whose loop was cut."""
        cut: set[int] = set()
        if self._loops:
            _, stuck = await asyncio.wait(self._loops, timeout=self.stop_grace)
            for loop in stuck:
                loop.cancel()
            await asyncio.gather(*self._loops, return_exceptions=True)
            cut = {i for i, loop in enumerate(self._loops[: self.threads]) if loop in stuck}
        self._loops.clear()
        return cut

    async def _stop_task_producers(self) -> None:
        """Exactly once: open transactions are aborted (if the broker is reachable; else the
        broker aborts them at their timeout, or the next owner's producer fences them)."""
        if self._clients.task_producers is not None:
            await self._clients.task_producers.stop()
        if self._orphans is not None:
            await self._orphans.stop()

    async def _close_every_store(self) -> None:
        """Close (checkpointing them) the stores of actives, standbys and parked tasks, and
        wait for every close under way; then end the store threads. The actives of a
        consumer whose cancelled change did not unwind are left open (to the process's
        exit), and those its commit still holds (moved to a sibling consumer meanwhile:
        ``commits.busy``): the change may still write to them in a thread, and a RocksDB
        store closed under a write could be damaged. Not checkpointed, they are restored at
        restart. The closes take at most ``task_stores.STORES_CLOSE_TIMEOUT`` together
        (``TaskStores.close_all``: those not begun by then are left open)."""
        closing = [
            t
            for t in self._actives.values()
            if t.consumer not in self._unwinding and t.running not in self._unwinding
        ]
        closes = [self._stores.close(t.task_id, t.stores) for t in closing]
        for task in closing:
            drop_writes(task)  # after a failure, writes not committed are not awaited
        self._actives.clear()
        parked = [(t, states) for t, (states, _) in self._stores.parked.items()]
        for task_id, states in [*self._standbys.clear(), *parked]:
            closes.append(self._stores.close(task_id, states))
        self._stores.parked.clear()
        try:
            await self._stores.close_all(closes)  # at most ``STORES_CLOSE_TIMEOUT``
        finally:
            self._stores.shutdown()

    async def _commit_at_stop(self, cut: set[int]) -> None:
        """Wait for the task changes under way, then (unless a failure stopped the
        application, one of those changes' included) commit every consumer's tasks but those
        of a consumer whose loop was cut at the grace (torn). Both take at most ``stop_grace``
        together: with the broker unreachable acks never come, to a rebalance callback
        committing as to a commit here. Then a change still under way is cancelled
        (``_abandon_changes``), as is a commit still waiting, and their consumers' tasks are
        torn, as a cut loop's. Input offsets are committed only after the commit's writes
        and markers are acknowledged, so a torn task's input is read again."""
        behind = []
        if self.failure is None and self.host.consumers:
            for i in range(self.threads):
                if i in cut:
                    log.warning("consumer %d did not stop in time; its tasks are not committed", i)
                    self._tear_consumer_tasks(i)
                else:
                    behind.append(i)
        try:
            async with asyncio.timeout(self.stop_grace):
                await self._changes_done.wait()
                if self.failure is not None:  # a change failed meanwhile: commit nothing
                    behind.clear()
                while behind:
                    async with self._locks[behind[0]]:
                        await self._commits.commit_safely(behind[0])
                    behind.pop(0)
        except TimeoutError:
            abandoned = await self._abandon_changes()
            for i in behind:
                if i in abandoned:  # said once, by ``_abandon_changes``
                    continue
                log.warning(
                    "consumer %d: its commit at stop did not end within %g s after the "
                    "consumer loops stopped (%.1f s after the stop began; broker "
                    "unreachable?); its tasks are not committed",
                    i,
                    self.stop_grace,
                    time.monotonic() - self._stop_began,
                )
                self._tear_consumer_tasks(i)

    async def _abandon_changes(self) -> set[int]:
        """Cancel the task changes still under way at the end of the stop's grace, one line
        each, and tear their consumers' tasks (once the cancelled change has ended, or after
        ``UNWIND_TIMEOUT`` with one more line: a stop must end). Such a
        change is a rebalance callback waiting for acks: aiokafka never expires a batch
        whose partition leader is unreachable. What it was committing is not committed
        (input offsets follow acknowledged writes and markers), so it is processed again
        after a restart, as a cut commit's. Returns those consumers."""
        changes = dict(self._changing)
        for change, (consumer, what) in changes.items():
            change.cancel()
            log.warning(
                "consumer %d: a task change (%s) did not end within %g s after the consumer "
                "loops stopped (%.1f s after the stop began; broker unreachable?); cancelled, "
                "its tasks are not committed (read again at restart)",
                consumer,
                what,
                self.stop_grace,
                time.monotonic() - self._stop_began,
            )
        if changes:  # a cancel ends a change only once it runs (its local writes finish)
            _, unwinding = await asyncio.wait(changes, timeout=UNWIND_TIMEOUT)
            for change in unwinding:
                log.warning(
                    "consumer %d: the cancelled task change (%s) did not end within %g s of "
                    "its cancel; stopping without waiting for it (its tasks' stores are left "
                    "open, not closed under a write it may still make; restored at restart)",
                    *changes[change],
                    UNWIND_TIMEOUT,
                )
                self._unwinding.add(changes[change][0])
        consumers = {consumer for consumer, _ in changes.values()}
        for consumer in consumers:
            self._tear_consumer_tasks(consumer)
        return consumers

    def _tear_consumer_tasks(self, consumer: int) -> None:
        for task in self._actives.values():
            if task.consumer == consumer:
                tear(task)

    async def _stop_clients(self) -> None:
        """Stop the shared producer and the restore and changelog readers, each within
        ``closing.CLOSE_TIMEOUT`` (as the task producers and the consumers): aiokafka's
        producer waits for every batch it holds to be acknowledged, for ever while the
        broker is unreachable. Its writes then abandoned belong to commits that did not end
        (input offsets are committed only after a commit's writes are acknowledged): their
        records are read and processed again, their writes compensated at the next
        restore. ``release_producer`` makes sure they are not sent later (after that
        compensation: the event loop may live on, as under a supervisor restarting
        ``run()``); the readers' fetches and connections are closed likewise."""
        clients = self._clients
        abandoned = "its requests are abandoned"
        named: tuple[tuple[str, Any, str, Release], ...] = (
            (
                "the shared producer",
                clients.producer,
                "its unacknowledged writes are abandoned",
                release_producer,
            ),
            ("the restore reader", clients.restorer, abandoned, release_consumer),
            ("the changelog reader", clients.changelog_reader, abandoned, release_consumer),
        )

        async def stop(name: str, client: Any, abandoned: str, release: Release) -> None:
            if not await stop_within(name, client, abandoned, log):
                await release(name, client, log)

        await asyncio.gather(*(stop(*named_client) for named_client in named if named_client[1]))

    async def request_shutdown(self) -> None:
        """Stop every process of the application (``SHUTDOWN_REQUESTED`` in the protocol)."""
        log.info("requesting the shutdown of the whole application")
        await self.host.request_shutdown()

    # -- queries ---------------------------------------------------------------------------------

    @property
    def active_tasks(self) -> frozenset[TaskId]:
        return frozenset(self._actives)

    @property
    def restoring_tasks(self) -> frozenset[TaskId]:
        """Active tasks whose stores are being restored (their input paused): a subset of
        ``active_tasks``."""
        return frozenset(t for t, task in self._actives.items() if task.restoring or task.torn)

    def _store_positions(self) -> dict[TaskId, int]:
        """Per task whose stores are open here and that is not a running active (a standby or
        warmup, an active restoring or torn, stores parked after a revoke), its stores'
        changelog positions summed: how far its state is now, which its checkpoint says only
        as of the last commit interval. What the host reports at a join (``_Listener``)."""
        held = [
            *((t, states) for t, (states, _) in self._stores.parked.items()),
            *self._standbys.states.items(),
            *((t, a.stores) for t, a in self._actives.items() if a.restoring or a.torn),
        ]
        return {
            t: sum(s.position for s in states.values())
            for t, states in held
            if states and is_open(states)
        }

    @property
    def standby_tasks(self) -> frozenset[TaskId]:
        return frozenset(self._standbys.states)

    @property
    def failing_standbys(self) -> dict[TaskId, BaseException]:
        """Standbys (warmups too) whose stores failed to open, tried again with a backoff."""
        return self._stores.failing

    def table(self, task: TaskId, store: str) -> dict[bytes, bytes]:
        """Committed plus pending content of an active task's store (inspection, tests)."""
        return dict(self._actives[task].stores[store].items())

    def replica(
        self, task: TaskId, store: str
    ) -> tuple[Literal["active", "standby"], StoreState] | None:
        """This process's copy of ``store`` of ``task`` for interactive queries
        (``runtime/queries.py``): the active's (not while it restores, or while its state was
        dropped and awaits a restore) or a standby's (warmups too), else None. It changes at
        every task change: read it at once, with no ``await`` in between."""
        active = self._actives.get(task)
        if active is not None:
            return None if active.torn or active.restoring else ("active", active.stores[store])
        standby = self._standbys.states.get(task)
        return None if standby is None else ("standby", standby[store])

    async def changelog_read_position(self, changelog: TopicPartition) -> int | None:
        """Exactly once: how far the state updater has read ``changelog`` (past transaction
        markers, which a store's position never counts); None when it does not read it, or
        in at-least-once (nothing to skip)."""
        reader = self._clients.changelog_reader
        if not self.exactly_once or reader is None:
            return None
        tp = KafkaTopicPartition(*changelog)
        try:
            if tp not in reader.assignment():
                return None
            return int(await asyncio.wait_for(reader.position(tp), 1.0))
        except Exception:  # unassigned meanwhile, or no position yet: the lag stands
            return None

    def _held_tasks(self) -> frozenset[TaskId] | None:
        """Every task whose local state this process uses or may open in a moment: active on
        any consumer (restoring or torn too), standby or warmup (opening too, or wanted once
        revoked), parked, opening or closing, assigned but not opened yet, or claimed back
        after a restart. None while task changes are under way: a callback moves a task
        between these across an ``await`` (in none of them meanwhile)."""
        if self._changes or self._rebalancing or self._closing:
            return None
        standbys, stores = self._standbys, self._stores
        held = {*self._actives, *standbys.states, *standbys.opening, *standbys.owner}
        held |= {*standbys.wanted, *stores.parked, *stores.opening, *stores.closing}
        for i in range(self.threads):
            assigned = self.host.tasks(i)
            held |= assigned.active | assigned.standby | assigned.warmup
            held |= self.host.restored_active(i)
        return frozenset(held)

    # -- processing ------------------------------------------------------------------------------

    async def _consume(self, index: int) -> None:
        """Consumer ``index``'s loop, with its gate watched beside it (``CutOffGate.watch``:
        the gate closes, and says so, as the silence passes its threshold, also while the
        loop waits in a commit). A failed watcher stops the application as a failed loop
        does: the gate would otherwise fall back to the loop's own looks, unsaid."""
        if self._gate is None:
            await self._consume_records(index)
            return
        watch = self._gate.watch(
            index,
            self.host.consumers[index],
            self.host.member_lost,
            lambda: index in self._rebalancing,
        )
        watching = asyncio.ensure_future(
            self._fail_on_error(watch, f"consumer {index}'s gate watcher")
        )
        watching.set_name(f"consumer {index}'s gate watcher")
        try:
            await self._consume_records(index)
        finally:
            watching.cancel()
            await asyncio.wait([watching])

    async def _consume_records(self, index: int) -> None:
        consumer = self.host.consumers[index]
        committed_at = time.monotonic()
        next_commit = committed_at + self.commit_interval
        while not self._stopped.is_set():
            # Tasks change, or probably out of the group: take no record meanwhile.
            if index in self._rebalancing or self._cut_off(index):
                await self._poll_nothing(index)
                continue
            epoch = self._epochs[index]
            self._pause_restoring(index)
            batch = await consumer.getmany(timeout_ms=100)
            self._polled_at[index] = time.monotonic()
            async with self._locks[index]:
                if epoch != self._epochs[index] or self._cut_off(index):
                    # A rebalance came between (the records may even be of the new
                    # assignment), or the consumer is probably out of the group: process
                    # nothing, read them again.
                    self._processing.rewind(consumer, batch.values())
                    continue
                if batch:
                    # Exactly once, a batch slower than half the transaction timeout is cut
                    # (the rest read again after the commit): the transaction must end
                    # before the broker aborts it. Not sooner: a cut batch is fetched again.
                    deadline = (
                        max(next_commit, committed_at + self.transaction_timeout / 2)
                        if self.exactly_once
                        else None
                    )
                    # Stops at once when a rebalance starts here (its commit waits for this
                    # lock) or a task moves to a sibling consumer (see ``process_batch``).
                    current = functools.partial(self._still_current, index, epoch)
                    await self._processing.process_batch(index, consumer, batch, deadline, current)
                if time.monotonic() >= next_commit:
                    await self._commits.commit_or_retry(index)
                    committed_at = time.monotonic()
                    next_commit = committed_at + self.commit_interval

    async def _poll_nothing(self, index: int) -> None:
        """Consumer ``index`` is rebalancing (or cut off, ``_cut_off``): poll, but take no
        record, for up to 10 ms (as long as the loop slept here before: the loop sees the
        rebalance end as soon).

        aiokafka rejoins only a consumer that polled within ``max_poll_interval_ms``
        (``GroupCoordinator.ensure_active_group`` skips the join of an idle one, and tries
        again forever): one whose rebalance started while a record ran long (the revoke
        callback waits for this loop's lock) never came back into the group. Its idle time
        counts from the end of its last ``getmany``, or is zero while one is under way
        (``fetch_context``); during the join ``getmany`` waits for the new assignment.

        The poll asks for a partition never assigned: aiokafka then hands out no record, so
        those fetched stay in its buffer with their positions unchanged (aiokafka drops them
        at the new assignment; they are fetched again from the committed or sought
        position), and no record of the new assignment is taken before its tasks are set up
        (restores paused, exactly-once seeks).
        ``stop()`` does not wait for a join that never ends: the poll is then cancelled."""
        poll = asyncio.ensure_future(
            self.host.consumers[index].getmany(_NO_PARTITION, timeout_ms=10)
        )
        stopped = asyncio.ensure_future(self._stopped.wait())
        try:
            await asyncio.wait([poll, stopped], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not poll.done():  # stopping (or this loop cancelled): it may wait for ever
                poll.cancel()
                await asyncio.wait([poll])  # (a cancel only ends a task once it runs)
        if poll.cancelled() or (self._stopped.is_set() and poll.exception() is not None):
            return
        poll.result()  # a coordination error: raised like the consumer loop's own poll
        self._polled_at[index] = time.monotonic()

    def _still_current(self, index: int, epoch: int) -> bool:
        """Consumer ``index`` is still at ``epoch``, not rebalancing, and not cut off."""
        return (
            self._epochs[index] == epoch
            and index not in self._rebalancing
            and not self._cut_off(index, GATE_REUSE)
        )

    def _cut_off(self, index: int, reuse: float = 0.0) -> bool:
        """Whether consumer ``index`` is probably out of its group without knowing it (no
        heartbeat accepted for about its session timeout, or its member id reset): it
        processes nothing then (``CutOffGate``). At least once only: exactly once, the new
        owner's transactions fence a zombie's writes, and its batch stops at the first
        fenced send."""
        if self._gate is None:
            return False
        return self._gate.closed(index, self.host.consumers[index], self.host.member_lost, reuse)

    # -- task changes (called by the host) -------------------------------------------------------

    async def _assign(self, consumer: int, tasks: frozenset[TaskId]) -> None:
        new: list[tuple[TaskId, dict[str, StoreState], str]] = []
        try:
            for task_id in sorted(tasks):
                task = self._actives.get(task_id)
                if task is not None:
                    log.info(
                        "task %s moved from consumer %d to %d", task_id, task.consumer, consumer
                    )
                    task.consumer = consumer
                    if task.torn:  # its state was dropped: restore it like a crashed owner's
                        new.append((task_id, task.stores, "kept"))
                    continue
                self._standbys.wanted.pop(task_id, None)
                states, how = await self._stores.take(task_id)
                new.append((task_id, states, source_of(states, how)))
            # Waits (a flush, producer starts, orphan aborts) before the tasks hold them.
            await self._start_tasks(consumer, new)
        except asyncio.CancelledError:
            self._park_unheld([(task_id, states) for task_id, states, _ in new])
            raise

    def _park_unheld(self, taken: Sequence[tuple[TaskId, dict[str, StoreState]]]) -> None:
        """A task change cancelled (by ``stop()``, past its grace) after taking these stores
        and before an active or a standby held them: park them, so ``stop()`` (or the
        rebalance's end) closes them. Else nothing would: their RocksDB locks stay held (a
        new ``App`` of this process cannot open them) and they are never checkpointed."""
        standbys = self._standbys
        for task_id, states in taken:
            active = self._actives.get(task_id)
            if (
                (active is not None and active.stores is states)
                or standbys.states.get(task_id) is states
                or standbys.opening.get(task_id) is states
            ):
                continue
            if task_id in self._stores.parked:  # (parked again meanwhile: not ours to drop)
                self._stores.close(task_id, states)
            else:
                self._stores.parked[task_id] = (states, "kept")

    async def _start_tasks(
        self, consumer: int, new: Sequence[tuple[TaskId, dict[str, StoreState], str]]
    ) -> None:
        """Run ``new`` tasks: a stateless one at once, a stateful one once the state updater
        has restored its stores (its input is paused until then: ``_restored``)."""
        producer = self._clients.producer
        if any(source == "kept" for _, _, source in new) and producer is not None:
            await producer.flush()  # a torn task's writes in flight: in the changelog
        if self._clients.task_producers is not None:
            await self._renew_producers(consumer, [task_id for task_id, _, _ in new])
        elif self._orphans is not None and self._clients.restorer is not None:
            # Before the restores look up their ends: a crashed exactly-once owner's open
            # transaction would hold them back (see ``OrphanTransactions``).
            changelogs = {t: [s.changelog for s in states.values()] for t, states, _ in new}
            await self._orphans.abort(self._clients.restorer, changelogs)
        for task_id, states, source in new:
            processor = self.processors[task_id.subtopology]()
            task = ActiveTask(task_id, consumer, states, processor, repartition=self._repartition)
            replaced = self._actives.get(task_id)
            if replaced is not None:  # a torn task restored as a new copy
                replaced.released = True
            self._actives[task_id] = task
            if not states:
                self._updater.cancel(task_id)
                log.info("consumer %d: task %s assigned (stateless)", consumer, task_id)
                continue
            self._updater.add(task, source)
            log.info(
                "consumer %d: task %s assigned (state: %s, from changelog offset %s); "
                "restoring, its input paused",
                consumer,
                task_id,
                source,
                start_of(states),
            )
        self._pause_restoring(consumer)

    async def _renew_producers(self, consumer: int, tasks: Sequence[TaskId]) -> None:
        """Exactly once: a new transactional producer per task, initialised before its
        restore looks up the changelog ends (so a fenced zombie's open transaction is aborted
        first and the restore reads to a stable end), then the task's input from its
        committed offsets as they are after that (a zombie's last commit included).
        A producer that cannot start (``ProducerStartError``: ``TaskProducers.renew``
        retries retriable errors until its start timeout and wraps every other) stops the
        application."""
        producers = self._clients.task_producers
        assert producers is not None
        results = await asyncio.gather(*(producers.renew(t) for t in tasks), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        assigned = self._assigned(consumer)
        mine = sorted(tp for tp in assigned if self.topology.task_of(TopicPartition(*tp)) in tasks)
        if not mine:
            return
        kafka_consumer = self.host.consumers[consumer]
        # Concurrently (aiokafka has one OffsetFetch per call): this holds up the rebalance.
        lookups = await asyncio.gather(
            *(kafka_consumer.committed(tp) for tp in mine), return_exceptions=True
        )
        for tp, committed in zip(mine, lookups, strict=True):
            if isinstance(committed, asyncio.CancelledError):
                raise committed
            if isinstance(committed, BaseException):  # aiokafka's own lookup stands
                log.warning(
                    "consumer %d: committed offset of %s[%d] unknown (%r)", consumer, *tp, committed
                )
            elif committed is not None:
                with contextlib.suppress(Exception):  # unassigned meanwhile
                    kafka_consumer.seek(tp, committed)

    def _assigned(self, consumer: int) -> set[KafkaTopicPartition]:
        """``consumer``'s assigned partitions; none between generations."""
        if consumer >= len(self.host.consumers):
            return set()
        try:
            return set(self.host.consumers[consumer].assignment())
        except Exception:  # no assignment (between generations)
            return set()

    def _seek_committed(self, consumer: int) -> None:
        """Exactly once: position the input of ``consumer``'s running tasks at the offsets
        this process committed in their last transactions. After a rebalance aiokafka reads
        positions with an OffsetFetch that does not ask for stable offsets, so it can return
        the offset from before a transaction whose markers are still being written (a kept
        task, or one moved here from a sibling consumer, would process again what it
        committed: a stateless task would emit its outputs twice)."""
        for tp in sorted(self._assigned(consumer)):
            task = self._actives.get(self.topology.task_of(TopicPartition(*tp)))
            if task is None or task.consumer != consumer or task.torn:
                continue
            offset = task.committed.get(TopicPartition(*tp))
            if offset is not None:
                with contextlib.suppress(Exception):  # unassigned meanwhile
                    self.host.consumers[consumer].seek(tp, offset)

    def _transaction_failed(self, task: ActiveTask, exc: Exception) -> None:
        self._commits.transaction_failed(task.consumer, task, exc)

    async def _restored(self, entry: Restoring) -> bool:
        """The state updater restored ``entry``: undo orphan writes, resume the task's input.
        False: not now (its consumer is in a rebalance; asked again at the next step)."""
        task = entry.task
        if self._actives.get(task.task_id) is not task or not task.restoring or self._closing:
            return True  # revoked, replaced or torn meanwhile: this restore is void
        index = task.consumer
        if index in self._rebalancing:
            return False
        async with self._locks[index]:
            if task.consumer != index or index in self._rebalancing or not task.restoring:
                return False
            if self._commits.lost(index):  # tears it: restored again after the rebalance
                return True
            assert entry.ends is not None
            compensated = 0
            for state in task.stores.values():
                if not self.exactly_once:  # (with transactions, fencing replaces end checks)
                    state.end = entry.ends[state.changelog]  # the active's records land here
                keys = state.compensate(entry.ends[state.changelog])
                compensated += len(keys)
                cl = state.changelog
                task.outbox.extend(
                    (cl.topic, cl.partition, k, state.pending[k], None) for k in keys
                )
            try:
                await self._processing.send_outbox(task)
            except TransactionFailedError as exc:  # exactly once, fenced: after a rejoin
                self._transaction_failed(task, exc)
                return True
            task.restoring = False
            seconds = time.monotonic() - entry.started
            event = RestoreEvent(
                task.task_id, entry.source, entry.start, entry.records, seconds, compensated
            )
            self.restore_events.append(event)
            if len(self.restore_events) > RESTORE_EVENTS_KEPT:  # a list still: users slice it
                del self.restore_events[0]
            self._stores.checkpoint(task.task_id, task.stores)
            self._pause_restoring(index)
        log.info(
            "consumer %d: task %s restored (state: %s, %d changelog records in %.1f s%s); running",
            index,
            task.task_id,
            entry.source,
            event.records,
            seconds,
            f", {compensated} uncommitted writes of an earlier owner undone" if compensated else "",
        )
        return True

    def _pause_restoring(self, index: int) -> None:
        """Pause exactly the input partitions of ``index``'s tasks that cannot process now
        (restoring, torn until their restore, or with a record still running on the sibling
        consumer they moved from: else ``index`` would fetch and rewind them on every loop),
        and those of tasks ``index`` does not run (a leader of another topology version
        assigned them by a reused subtopology id: rewound at every fetch, they spun the loop);
        a new assignment resets pauses, so every fetch of the consumer loop calls this again."""
        if index >= len(self.host.consumers):
            return
        consumer = self.host.consumers[index]
        try:
            assigned = consumer.assignment()
            paused = consumer.paused()
        except Exception:  # no assignment (between generations): nothing to pause
            return
        hold = set()
        for tp in assigned:
            task = self._actives.get(self.topology.task_of(TopicPartition(*tp)))
            if (
                task is None
                or task.consumer != index
                or task.restoring
                or task.torn
                or task.running not in (None, index)
            ):
                hold.add(tp)
        with contextlib.suppress(Exception):  # a partition just unassigned
            if hold - paused:
                consumer.pause(*(hold - paused))
            if paused - hold:
                consumer.resume(*(paused - hold))

    async def _revoke(self, consumer: int, tasks: frozenset[TaskId]) -> None:
        for task_id in sorted(tasks):
            task = self._actives.get(task_id)
            if task is None or task.consumer != consumer:
                continue  # already moved to another consumer of this process
            del self._actives[task_id]
            task.released = True  # a record of it still running writes none of its stores
            self._updater.cancel(task_id)  # its stores keep what they restored so far
            if self._clients.task_producers is not None:  # committed at the rebalance's start
                self._clients.task_producers.close(task_id)
            if task_id in self._standbys.wanted:
                owner = self._standbys.wanted.pop(task_id)
                try:
                    await self._standbys.add(task_id, task.stores, owner)
                except asyncio.CancelledError:  # no longer active, not yet a standby
                    self._park_unheld([(task_id, task.stores)])
                    raise
                log.info(
                    "consumer %d: task %s revoked; its stores stay here as a standby",
                    consumer,
                    task_id,
                )
            else:
                self._stores.parked[task_id] = (task.stores, "kept")
                log.info(
                    "consumer %d: task %s revoked (its stores stay open until the rebalance "
                    "ends, for another consumer of this process that may take it)",
                    consumer,
                    task_id,
                )

    async def _add_standbys(self, consumer: int, tasks: frozenset[TaskId]) -> None:
        for task_id in sorted(tasks):
            if not self.topology.subtopology(task_id.subtopology).stores:
                continue
            if task_id in self._actives:  # still active on another consumer until it revokes
                self._standbys.wanted[task_id] = consumer
                continue
            if task_id in self._standbys.states:  # moves from another consumer of this process
                self._standbys.owner[task_id] = consumer
                continue
            states, how = await self._stores.take(task_id, standby=True)
            try:
                await self._standbys.add(task_id, states, consumer)
            except asyncio.CancelledError:  # taken, not yet a standby
                self._park_unheld([(task_id, states)])
                raise
            log.info(
                "consumer %d: standby %s added (state: %s, from changelog offset %s)",
                consumer,
                task_id,
                source_of(states, how),
                start_of(states),
            )

    async def _remove_standbys(self, consumer: int, tasks: frozenset[TaskId]) -> None:
        for task_id in sorted(tasks):
            states = await self._standbys.remove(consumer, task_id)
            if states is not None:
                self._stores.parked[task_id] = (states, "standby")
                log.info("consumer %d: standby %s removed", consumer, task_id)

    async def _membership_lost(self, consumer: int) -> None:
        # Before the lock: a consumer stuck in a batch past max_poll_interval holds it, and
        # the new epoch stops that batch at its next record (``_still_current``), not at its
        # end. A batch fetched as a zombie is not processed either.
        self._epochs[consumer] += 1
        self._note_out_of_group(consumer)
        async with self._locks[consumer]:
            self._epochs[consumer] += 1  # also one fetched while this waited for the lock
            self._commits.tear_consumer(consumer, "was out of the group")

    def _note_out_of_group(self, consumer: int) -> None:
        """One line when ``consumer`` is found out of the group (the broker removed it, or
        aiokafka left for it after ``max_poll_interval_ms`` without a poll), one when it is
        assigned again (``_rebalance_completed``)."""
        if consumer in self._out_of_group:
            return
        self._out_of_group.add(consumer)
        log.warning(
            "consumer %d is out of the group (evicted: no heartbeat reached the broker within "
            "the session timeout, as when cut off from it; or left after max_poll_interval_ms "
            "(%d ms) without a poll; its last poll ended %.1f s ago): its tasks may run "
            "elsewhere meanwhile; rejoining",
            consumer,
            self.consumer_config.get("max_poll_interval_ms", AIOKAFKA_MAX_POLL_INTERVAL_MS),
            time.monotonic() - self._polled_at[consumer],
        )

    async def _rebalance_started(self, consumer: int) -> None:
        self._rebalancing.add(consumer)
        async with self._locks[consumer]:
            if self.host.member_lost(consumer):  # while a record ran long, say
                self._note_out_of_group(consumer)
            self._epochs[consumer] += 1
            self._suspended[consumer] = frozenset(
                t for t, task in self._actives.items() if task.consumer == consumer
            )
            await self._commits.commit_safely(consumer)
        if self.end_offsets is not None:  # the leader's lags: as of this rebalance's commits
            self.end_offsets.refresh_soon()
        suspended = self._suspended[consumer]
        if suspended:
            torn = sum(1 for t in suspended if t in self._actives and self._actives[t].torn)
            log.info(
                "consumer %d: rebalance; suspended %d task(s), %s",
                consumer,
                len(suspended),
                f"{torn} with their uncommitted state dropped" if torn else "committed",
            )

    async def _rebalance_completed(self, consumer: int) -> None:
        # Tasks the host says ``consumer`` kept but that a sibling consumer took meanwhile
        # (``consumer`` was out of the group, say stuck in a batch, and got them back): the
        # host's view of ``consumer`` did not change, so no assignment callback came.
        back = frozenset(
            t
            for t in self.host.tasks(consumer).active
            if (task := self._actives.get(t)) is None or task.consumer != consumer
        )
        if back:
            await self._assign(consumer, back)
        mine = frozenset(t for t, task in self._actives.items() if task.consumer == consumer)
        kept = mine & self._suspended.pop(consumer, frozenset())
        # Before the consumer processes again (a write of its own would move an end). Every
        # running task of it, not only those it kept: one moved here from a sibling consumer
        # (whose callbacks may come later) ran there, and that consumer may have been out of
        # the group unnoticed while another member wrote the changelog.
        try:
            if not self.exactly_once:  # else fencing: a task written elsewhere fails to commit
                await self._commits.check_ends(consumer, mine)
            torn = [
                (t, self._actives[t].stores, "kept") for t in sorted(mine) if self._actives[t].torn
            ]
            if torn:  # its state was dropped (or is stale) and it stayed here: restore it
                await self._start_tasks(consumer, torn)
            if self.exactly_once:
                self._seek_committed(consumer)
        finally:
            self._rebalancing.discard(consumer)
        self._pause_restoring(consumer)  # the new assignment has no pauses yet
        if consumer in self._out_of_group:
            self._out_of_group.discard(consumer)
            membership = self.host.membership(consumer)
            log.info(
                "consumer %d rejoined the group (generation %s): %d active task(s)",
                consumer,
                "?" if membership is None else membership[1],
                len(mine),
            )
        restoring = {t for t in mine if self._actives[t].restoring}
        resumed = kept - restoring
        if resumed:
            log.info(
                "consumer %d: resumed %s (same consumer, same member, changelogs at their "
                "ends: no close, no restore)",
                consumer,
                ", ".join(map(str, sorted(resumed))),
            )
        if not self._rebalancing:  # every consumer has its new tasks: close what nobody took
            # Not awaited: this callback holds up the member's rejoin (no heartbeats).
            self._stores.close_parked()


def _says_why(exc: Exception) -> bool:
    """Whether ``exc``'s message alone says what failed and why, with nothing a trace would
    add: a write or internal-topic failure, an authorization refusal (it names the resource
    and the ACL), commits failing past their retries (the last error), a store's (its
    directory and RocksDB's status), and a store's failed open (it names the store, with the
    ``StoreIOError`` it caused)."""
    if isinstance(exc, StoreNotOpenError):  # without a cause: a store used too early, a bug
        return isinstance(exc.__cause__, StoreIOError)
    says_why = (
        OutputWriteError,
        InternalTopicError,
        NotAuthorizedError,
        StoreIOError,
        CommitRetriesExhaustedError,
    )
    return isinstance(exc, says_why)


def _one_line(exc: Exception) -> str:
    """``exc`` for a one-line log: its type and message."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class _Listener(TaskListener):
    """Task changes from the host; a failure stops the application (clearly, once) rather
    than leaving a consumer with partitions but no tasks."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def _guard(self, consumer: int, change: Coroutine[Any, Any, None], what: str) -> None:
        """Run one change unless the app is closing (its stores may be closed by then);
        ``stop()`` waits for the changes under way, and cancels one still running after its
        grace (``App._abandon_changes``). Each runs as its own task: cancelled, only the
        change ends, and this callback returns to aiokafka's coordination task (which a
        consumer's stop waits for). Either way it returns once its change has ended."""
        app = self.app
        if app._closing:
            change.close()
            log.info("%s skipped: the application is stopping", what)
            return
        app._changes += 1
        app._changes_done.clear()
        running = asyncio.ensure_future(app._fail_on_error(change, what))
        app._changing[running] = (consumer, what)
        try:
            await asyncio.wait([running])  # (``_fail_on_error`` raises nothing but a cancel)
        except asyncio.CancelledError:  # the callback itself was cancelled: its change too,
            running.cancel()  # which is under way until it unwinds (its local writes end)
            await asyncio.wait([running])
            raise
        finally:
            del app._changing[running]
            app._changes -= 1
            if not app._changes:
                app._changes_done.set()

    async def on_active_assigned(self, consumer: int, tasks: frozenset[TaskId]) -> None:
        await self._guard(consumer, self.app._assign(consumer, tasks), "assigning tasks")

    async def on_active_revoked(self, consumer: int, tasks: frozenset[TaskId]) -> None:
        await self._guard(consumer, self.app._revoke(consumer, tasks), "revoking tasks")

    async def on_standby_added(self, consumer: int, tasks: frozenset[TaskId]) -> None:
        await self._guard(consumer, self.app._add_standbys(consumer, tasks), "adding standbys")

    async def on_standby_removed(self, consumer: int, tasks: frozenset[TaskId]) -> None:
        await self._guard(consumer, self.app._remove_standbys(consumer, tasks), "removing standbys")

    async def on_rebalance_started(self, consumer: int) -> None:
        await self._guard(consumer, self.app._rebalance_started(consumer), "starting a rebalance")

    async def on_rebalance_completed(self, consumer: int) -> None:
        await self._guard(
            consumer, self.app._rebalance_completed(consumer), "completing a rebalance"
        )

    async def on_membership_lost(self, consumer: int) -> None:
        await self._guard(
            consumer, self.app._membership_lost(consumer), "dropping a zombie's state"
        )

    async def on_error(self, consumer: int, code: ErrorCode) -> None:
        log.error("consumer %d: no tasks this round: the leader reported %s", consumer, code.name)

    def restoring_actives(self) -> frozenset[TaskId]:
        # Stateful ones only: a torn stateless task (a failed commit) has no offset sum to
        # report instead, and would be claimed by no process.
        actives = self.app._actives
        return frozenset(t for t in self.app.restoring_tasks if actives[t].stores)

    def store_offset_sums(self) -> dict[TaskId, int]:
        return self.app._store_positions()

    async def on_shutdown_requested(self) -> None:
        log.info("the application's shutdown was requested; stopping")
        self.app._stopped.set()


#: Per kind of failed connection, what to check, in the runtime's setting names.
_PROTOCOL_ASKED = "is security_protocol the listener's, in consumer_config and producer_config?"
_CONNECT_HINTS = {
    CERTIFICATE: " (is the CA of ssl_context the broker's?)",
    CLOSED: f" ({_PROTOCOL_ASKED})",
    NOT_SASL: f" ({_PROTOCOL_ASKED})",
    # Not proof of the protocol: a broker over max.connections.per.ip resets a hello too.
    RESET: f" ({_PROTOCOL_ASKED} or the broker refusing more connections from this address)",
}


def _with_reason(exc: KafkaConnectionError, failure: ConnectFailure | None) -> KafkaConnectionError:
    """aiokafka's "Unable to bootstrap from [...]", which says the same for a dead broker, a
    wrong password and an untrusted certificate, with why the last connection failed (the
    same type: a caller catching it still does); any other ``exc`` as it is."""
    if failure is None or not str(exc).startswith("KafkaConnectionError: Unable to bootstrap"):
        return exc
    text = failure.text + _CONNECT_HINTS.get(failure.kind, "")
    return KafkaConnectionError(f"{' '.join(map(str, exc.args))}: {text}")


async def _all_or_none(starts: Sequence[Coroutine[Any, Any, None]]) -> None:
    """Run ``starts`` together; the first failure (or a cancel) cancels the others and is
    raised once every one has ended: a start left running would finish after its client
    was stopped, or never end (a producer asking for its id while the broker is away).
    Each later cancel (a stop's cut, Ctrl-C) is passed on to the starts still running, as
    ``gather`` passes each on before a failure: a start that caught the first must not
    hold the stop. A cancel wins over a failure (the stop was asked for), which is then
    logged once at WARNING and raised as the cancel's ``__cause__``."""
    cancels_before = _cancels_asked()
    running = [asyncio.ensure_future(start) for start in starts]
    gathered = asyncio.gather(*running)
    try:
        await gathered
    except BaseException as first:
        # A cancel in the turn after a start failed comes out of the gather in its place.
        cancel = first if isinstance(first, asyncio.CancelledError) else None
        for task in running:
            task.cancel()
        while not all(task.done() for task in running):
            try:
                await asyncio.wait(running)  # (their failures are retrieved by the gather)
            except asyncio.CancelledError as exc:  # a stop's cut or Ctrl-C: raised after
                cancel = exc
                for task in running:
                    task.cancel()
        if cancel is None and _cancels_asked() > cancels_before:
            # A cancel in the same turn as the failure, before the gather's callback ran:
            # the gather took it and ended with the failure; only the task's count keeps it.
            cancel = asyncio.CancelledError()
        if cancel is None:
            raise
        # The gather's own outcome first: a cancel in the turn after it ended with the
        # failure replaced only what this task was woken with.
        failure = _first_failure(gathered)
        if failure is None:
            failure = _start_failure(running)
        if failure is None:
            raise cancel from None
        log.warning("a client's start failed as the start was stopped: %r", failure)
        raise cancel from failure


def _first_failure(gathered: asyncio.Future[Any]) -> BaseException | None:
    """The failure ``gathered`` ended with, if it ended with one other than a cancel."""
    if not gathered.done() or gathered.cancelled():
        return None
    failure = gathered.exception()
    return None if isinstance(failure, asyncio.CancelledError) else failure


def _cancels_asked() -> int:
    """How many cancels were asked of the current task and not yet taken back."""
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0


def _start_failure(starts: Sequence[asyncio.Future[None]]) -> BaseException | None:
    """The first failure other than a cancel among ended ``starts``, if any."""
    for start in starts:
        if start.done() and not start.cancelled():
            failure = start.exception()
            if failure is not None and not isinstance(failure, asyncio.CancelledError):
                return failure
    return None
