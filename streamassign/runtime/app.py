"""The runtime application: a topology, a processor per subtopology, N consumers in one process.

Built on ``ProcessHost`` (the protocol, stickiness reporting, per-task callbacks). Per task it
keeps a processor instance and its stores (``StoreState``: a local store plus its changelog
partition); see ``changelog.py`` for how writes, commits and restores keep table state exact
under at-least-once delivery, and ``docs/runtime.md`` for the whole design.

Concurrency: one asyncio loop. Each consumer has its own processing loop and lock; a rebalance
takes the lock, commits, and bumps an epoch so a batch fetched before it is dropped (its offsets
were not committed; the next owner reads it again). One plain consumer (no group) keeps standby
stores up to date; another restores stores of newly assigned actives, from their position to
the changelog's end.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import attrs
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.errors import KafkaError

from .. import TaskId, TopicPartition
from ..aiokafka.streams import ProcessHost, TaskListener
from ..errors import ErrorCode, StreamAssignError
from ..streams import ACCEPTABLE_RECOVERY_LAG
from ..topology import Topology
from ._topics import ensure_internal_topics
from .changelog import COMMIT_KEY, StoreState
from .end_offsets import EndOffsetsCache, changelog_partitions
from .stores import STORE_KINDS, StoreKind, open_store, require_store_library

log = logging.getLogger("streamassign.runtime")

ErrorPolicy = Literal["stop", "skip"]

#: Seconds a changelog end offset lookup may take (at commits and resumes).
_ENDS_TIMEOUT = 5.0


class RuntimeConfigError(StreamAssignError, ValueError):
    """The application is configured inconsistently (e.g. a subtopology without processor)."""


class ProcessingError(StreamAssignError):
    """A processor raised; the application stopped without committing the failed record."""


class Record(Protocol):
    """An input record (aiokafka's ``ConsumerRecord`` has these fields)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None


class Processor(Protocol):
    """Processes the records of one task; one instance per task, made by a factory."""

    async def process(self, ctx: TaskContext, record: Record) -> None: ...


ProcessorFactory = Callable[[], Processor]


@attrs.frozen
class RestoreEvent:
    """One restore of one task's stores, for logs, tests and benchmarks.

    ``source``: ``standby`` (took over a standby of this process), ``kept`` (state kept in
    memory from a moment ago in this process), ``local`` (persistent store on disk), ``cold``
    (nothing local: from the changelog's start). ``start``: the changelog offsets the
    restore started from, summed over the task's stores (0: from scratch). ``compensated``:
    uncommitted writes of a crashed owner (or of a failed commit) undone.
    """

    task: TaskId
    source: str
    start: int
    records: int
    seconds: float
    compensated: int = 0


class Table:
    """A processor's view of one store: reads see the task's own uncommitted writes."""

    def __init__(self, task: _ActiveTask, state: StoreState) -> None:
        self._task = task
        self._state = state

    def get(self, key: bytes) -> bytes | None:
        return self._state.get(key)

    def items(self) -> Iterable[tuple[bytes, bytes]]:
        return self._state.items()

    def put(self, key: bytes, value: bytes | None) -> None:
        """Write (``None`` deletes); goes to the changelog, committed with the task."""
        state = self._state
        mark = self._task.mark
        if mark is not None and state.seen(*mark):
            return  # this store already holds this record's effect (replay after a crash)
        self._task.journal.append((state, key, key in state.pending, state.pending.get(key)))
        state.put(key, value)
        cl = state.changelog
        self._task.outbox.append((cl.topic, cl.partition, key, value, None))

    def delete(self, key: bytes) -> None:
        self.put(key, None)


class TaskContext:
    """What a processor sees of its task: its id, its stores, and ``send`` for output."""

    def __init__(self, task: _ActiveTask) -> None:
        self._task = task
        self.task_id = task.task_id
        self._tables = {name: Table(task, state) for name, state in task.stores.items()}

    def store(self, name: str) -> Table:
        try:
            return self._tables[name]
        except KeyError:
            raise KeyError(
                f"task {self.task_id} has no store {name!r} (its stores: {sorted(self._tables)})"
            ) from None

    def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        partition: int | None = None,
    ) -> None:
        """Produce to an output or repartition topic (partitioned by key when no partition is
        given); acknowledged before the input offset is committed (at least once). A record
        to a repartition topic carries where it comes from (input record and rank), so the
        stores of the subtopology reading it apply a replayed copy only once."""
        task = self._task
        headers = None
        if topic in task.repartition and task.current is not None:
            headers = _upstream_headers(task.current, task.sends)
            task.sends += 1
        task.outbox.append((topic, partition, key, value, headers))


#: One record to produce: topic, partition, key, value, headers.
_Send = tuple[str, int | None, bytes | None, bytes | None, list[tuple[str, bytes]] | None]

#: Headers of a repartition record: its upstream input partition, and its position there
#: (input offset * _RANK_LIMIT + rank among the records that input record sent).
UPSTREAM_HEADER = "streamassign.upstream"
POSITION_HEADER = "streamassign.position"
_RANK_LIMIT = 1 << 20


def _upstream_headers(record: Record, rank: int) -> list[tuple[str, bytes]]:
    if rank >= _RANK_LIMIT:
        raise ValueError(f"one input record sent more than {_RANK_LIMIT} repartition records")
    upstream = f"{record.topic}[{record.partition}]".encode()
    position = str(record.offset * _RANK_LIMIT + rank).encode()
    return [(UPSTREAM_HEADER, upstream), (POSITION_HEADER, position)]


def _mark_of(record: Record) -> tuple[str, int]:
    """The name and position under which the stores track ``record`` as applied: for a
    repartition record, its upstream input partition and position (stable across upstream
    replays, which give the same record a new offset); else its own topic and offset."""
    headers = dict(getattr(record, "headers", None) or ())
    upstream, position = headers.get(UPSTREAM_HEADER), headers.get(POSITION_HEADER)
    if upstream is not None and position is not None:
        try:
            return upstream.decode(), int(position)
        except ValueError:  # not ours: track it by its own offset
            pass
    return record.topic, record.offset


@attrs.define(eq=False)
class _ActiveTask:
    task_id: TaskId
    consumer: int
    stores: dict[str, StoreState]
    processor: Processor
    context: TaskContext = attrs.field(init=False)
    #: Next input offset to commit, per source partition.
    offsets: dict[TopicPartition, int] = attrs.field(factory=dict)
    committed: dict[TopicPartition, int] = attrs.field(factory=dict)
    futures: list[asyncio.Future[Any]] = attrs.field(factory=list)
    outbox: list[_Send] = attrs.field(factory=list)
    journal: list[tuple[StoreState, bytes, bool, bytes | None]] = attrs.field(factory=list)
    current: Record | None = None
    #: What identifies the current record in the stores' applied offsets (see ``_mark_of``).
    mark: tuple[str, int] | None = None
    #: Repartition topics (their records carry upstream headers), and how many records the
    #: current record has sent to them so far.
    repartition: frozenset[str] = frozenset()
    sends: int = 0
    processed: int = 0
    skipped: int = 0
    #: Its uncommitted state was dropped (cancelled mid-record, failed commit): it must be
    #: restored from its changelog before it processes or commits again.
    torn: bool = False
    #: Its stores by changelog partition (to count what each one's owner produced).
    by_changelog: dict[TopicPartition, StoreState] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.context = TaskContext(self)
        self.by_changelog = {s.changelog: s for s in self.stores.values()}


def _source_of(states: Mapping[str, StoreState], how: str) -> str:
    if how == "open":
        return "local" if any(s.position for s in states.values()) else "cold"
    return how


class App:
    """A stream processing application (see the module docstring and ``docs/runtime.md``).

    ``topology``: a ``Topology`` or the path of a topology TOML file (its ``name`` is the
    application id); ``processors``: a processor factory per subtopology id. ``store_kind``:
    ``"rocksdb"`` (persistent, sticky across restarts) or ``"memory"``.

    ``high_availability=True``: actives move only onto caught-up state; new owners first get
    warmups (run like standbys) and take over at a probing rebalance every
    ``probing_rebalance_interval_ms`` (see ``docs/ha.md``). The process then keeps every
    stateful task's changelog end offsets cached (``end_offsets``) for exact lags when it leads.
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
        replication_factor: int = 1,
        endpoint: str | None = None,
        consumer_config: Mapping[str, Any] | None = None,
        producer_config: Mapping[str, Any] | None = None,
        high_availability: bool = False,
        acceptable_recovery_lag: int = ACCEPTABLE_RECOVERY_LAG,
        max_warmup_replicas: int = 2,
        probing_rebalance_interval_ms: int = 600_000,
    ) -> None:
        require_store_library(store_kind)
        if not isinstance(topology, Topology):
            topology = Topology.load(Path(topology))
        ids = set(topology.subtopology_ids)
        if set(processors) != ids:
            raise RuntimeConfigError(
                f"processors are needed for exactly the subtopologies {sorted(ids)}, "
                f"got {sorted(processors)}"
            )
        if store_kind not in STORE_KINDS:
            raise RuntimeConfigError(f"store_kind must be one of {STORE_KINDS}, got {store_kind!r}")
        if processing_errors not in ("stop", "skip"):
            raise RuntimeConfigError("processing_errors must be 'stop' or 'skip'")
        if commit_interval_ms < 1:
            raise RuntimeConfigError(f"commit_interval_ms must be >= 1, got {commit_interval_ms}")
        for sub in topology.subtopologies:
            if len(sub.stores) > 1:
                log.warning(
                    "subtopology %d has %d stores: each store's changelog commits on its own, "
                    "so a crash between their markers can leave them at different inputs "
                    "(see Limits in docs/runtime.md)",
                    sub.id,
                    len(sub.stores),
                )
        self.topology = topology
        self._repartition = frozenset(topology.repartition_topics)
        self.processors = dict(processors)
        self.store_kind = store_kind
        self.commit_interval = commit_interval_ms / 1000
        #: Seconds ``stop()`` lets each loop finish its current record before cancelling it.
        self.stop_grace = 30.0
        self.processing_errors = processing_errors
        self.replication_factor = replication_factor
        # A new application reads its input from the start, as Kafka Streams does.
        self.consumer_config = {"auto_offset_reset": "earliest", **(consumer_config or {})}
        self.producer_config = dict(producer_config or {})
        #: Changelog end offsets of every stateful task, for the leader's lags (HA only).
        self.end_offsets: EndOffsetsCache | None = EndOffsetsCache() if high_availability else None
        self.host = ProcessHost(
            topology,
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
        )
        self.bootstrap_servers = bootstrap_servers
        self.threads = threads
        #: Every restore of active tasks, in order (tests and benchmarks read it).
        self.restore_events: list[RestoreEvent] = []
        self.processed = 0
        self.skipped = 0
        self.failure: BaseException | None = None
        self._actives: dict[TaskId, _ActiveTask] = {}
        self._standbys: dict[TaskId, dict[str, StoreState]] = {}
        #: The consumer each standby belongs to (a standby may move between consumers of
        #: this process, and their callbacks run in any order).
        self._standby_owner: dict[TaskId, int] = {}
        #: Standbys of tasks still active here until their consumer revokes them, by consumer.
        self._want_standby: dict[TaskId, int] = {}
        #: Stores of tasks that left an active or standby role during the current rebalance
        #: (with that role), so another consumer of this process can take them without restoring.
        self._parked: dict[TaskId, tuple[dict[str, StoreState], str]] = {}
        self._suspended: dict[int, frozenset[TaskId]] = {}
        self._rebalancing: set[int] = set()
        self._locks = [asyncio.Lock() for _ in range(threads)]
        self._epochs = [0] * threads
        self._standby_lock = asyncio.Lock()
        self._standby_dirty = False
        self._restore_lock = asyncio.Lock()
        self._stopped = asyncio.Event()
        #: Set by ``stop()`` once the loops have ended: task changes are no-ops from then on.
        self._closing = False
        self._changes = 0  # task changes (host callbacks) under way
        self._changes_done = asyncio.Event()
        self._changes_done.set()
        self._loops: list[asyncio.Task[None]] = []
        self._producer: AIOKafkaProducer | None = None
        self._restorer: AIOKafkaConsumer | None = None
        self._standby_reader: AIOKafkaConsumer | None = None
        self._checkpointed: dict[TaskId, dict[TopicPartition, int]] = {}
        #: Stores closing in a thread, by task (opened again only once closed).
        self._store_closes: dict[TaskId, asyncio.Future[None]] = {}

    @property
    def state(self) -> Any:
        return self.host.state

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Create internal topics, start the producer, the restore consumers and the host."""
        counts = await ensure_internal_topics(
            self.topology, self.bootstrap_servers, replication_factor=self.replication_factor
        )
        if self.end_offsets is not None:  # known before the first rebalance
            self.end_offsets.track(changelog_partitions(self.topology, counts))
            await self.end_offsets.start(self.bootstrap_servers)
        if self.store_kind == "memory":  # checkpoints of a previous run describe nothing now
            for task in self.state.offset_sums():
                self.state.delete_checkpoint(task)
        # Idempotent: a retried send is neither duplicated nor reordered in the changelog.
        producer_config = {
            "acks": "all",
            "linger_ms": 5,
            "enable_idempotence": True,
            **self.producer_config,
        }
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap_servers, **producer_config
        )
        restore_config = {"enable_auto_commit": False, "auto_offset_reset": "earliest"}
        self._restorer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap_servers, **restore_config
        )
        self._standby_reader = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap_servers, **restore_config
        )
        await asyncio.gather(
            self._producer.start(), self._restorer.start(), self._standby_reader.start()
        )
        await self.host.start()
        log.info(
            "process %s started: %d consumer(s), %s stores, %d standby replica(s)",
            self.host.process_id,
            self.threads,
            self.store_kind,
            self.host.num_standby_replicas,
        )
        loops = [
            self._fail_on_error(self._consume(i), f"consumer {i}") for i in range(self.threads)
        ]
        loops.append(self._fail_on_error(self._standby_loop(), "the standby reader"))
        self._loops = [asyncio.create_task(loop) for loop in loops]

    async def _fail_on_error(self, loop: Awaitable[None], what: str) -> None:
        """Run a loop; its failure stops the application (once, clearly), never silently
        ends the loop while the rest goes on."""
        try:
            await loop
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("%s failed; stopping the application", what)
            if self.failure is None:
                self.failure = exc
            self._stopped.set()

    async def wait(self) -> None:
        """Until ``stop()``, a requested shutdown or a failure."""
        await self._stopped.wait()

    async def run(self) -> None:
        """``start``, wait, ``stop``; re-raises what stopped the application, if anything.
        A failed start is cleaned up too (producer, consumers, stores)."""
        try:
            await self.start()
            await self.wait()
        finally:
            await self.stop()
        if self.failure is not None:
            raise ProcessingError(f"the application stopped: {self.failure!r}") from self.failure

    async def stop(self) -> None:
        """Commit (unless a failure stopped us), flush and checkpoint every store, close."""
        self._stopped.set()
        # Cooperative: each loop finishes the record it is on and exits. Only a loop stuck
        # past the grace period is cancelled; its consumer then commits nothing (its tasks'
        # uncommitted state is dropped, so the next owner recovers as after a crash).
        cut: set[int] = set()
        if self._loops:
            _, stuck = await asyncio.wait(self._loops, timeout=self.stop_grace)
            for loop in stuck:
                loop.cancel()
            await asyncio.gather(*self._loops, return_exceptions=True)
            cut = {i for i, loop in enumerate(self._loops[: self.threads]) if loop in stuck}
        self._loops.clear()
        self._closing = True  # host callbacks from here on change nothing
        await self._changes_done.wait()
        if self.failure is None and self.host.consumers:
            for i in range(self.threads):
                if i in cut:
                    log.warning("consumer %d did not stop in time; its tasks are not committed", i)
                    for task in self._actives.values():
                        if task.consumer == i:
                            _tear(task)
                    continue
                async with self._locks[i]:
                    await self._commit_safely(i)
        closes = [self._close_states(t.task_id, t.stores) for t in self._actives.values()]
        self._actives.clear()
        parked = [(t, states) for t, (states, _) in self._parked.items()]
        for task_id, states in [*self._standbys.items(), *parked]:
            closes.append(self._close_states(task_id, states))
        self._standbys.clear()
        self._standby_owner.clear()
        self._parked.clear()
        await asyncio.gather(*closes, *self._store_closes.values())
        await self.host.stop()
        if self.end_offsets is not None:
            await self.end_offsets.stop()
        clients = [c for c in (self._producer, self._restorer, self._standby_reader) if c]
        await asyncio.gather(*(c.stop() for c in clients), return_exceptions=True)
        log.info("process %s stopped", self.host.process_id)

    async def request_shutdown(self) -> None:
        """Stop every process of the application (``SHUTDOWN_REQUESTED`` in the protocol)."""
        log.info("requesting the shutdown of the whole application")
        await self.host.request_shutdown()

    # -- queries ---------------------------------------------------------------------------------

    @property
    def active_tasks(self) -> frozenset[TaskId]:
        return frozenset(self._actives)

    @property
    def standby_tasks(self) -> frozenset[TaskId]:
        return frozenset(self._standbys)

    def table(self, task: TaskId, store: str) -> dict[bytes, bytes]:
        """Committed plus pending content of an active task's store (inspection, tests)."""
        return dict(self._actives[task].stores[store].items())

    def replica(
        self, task: TaskId, store: str
    ) -> tuple[Literal["active", "standby"], StoreState] | None:
        """This process's copy of ``store`` of ``task`` for interactive queries
        (``runtime/queries.py``): the active's (not while its state was dropped and awaits a
        restore) or a standby's (warmups too), else None. It changes at every task change:
        read it at once, with no ``await`` in between."""
        active = self._actives.get(task)
        if active is not None:
            return None if active.torn else ("active", active.stores[store])
        standby = self._standbys.get(task)
        return None if standby is None else ("standby", standby[store])

    # -- processing ------------------------------------------------------------------------------

    async def _consume(self, index: int) -> None:
        consumer = self.host.consumers[index]
        next_commit = time.monotonic() + self.commit_interval
        while not self._stopped.is_set():
            if index in self._rebalancing:  # tasks change: fetch nothing meanwhile
                await asyncio.sleep(0.01)
                continue
            epoch = self._epochs[index]
            batch = await consumer.getmany(timeout_ms=100)
            async with self._locks[index]:
                if epoch != self._epochs[index]:
                    # A rebalance came between (the records may even be of the new
                    # assignment): process nothing, read them again.
                    self._rewind(consumer, batch.values())
                    continue
                if batch:
                    await self._process_batch(index, batch)
                if time.monotonic() >= next_commit:
                    await self._commit(index)
                    next_commit = time.monotonic() + self.commit_interval

    async def _process_batch(self, index: int, batch: Mapping[Any, list[Any]]) -> None:
        consumer = self.host.consumers[index]
        by_task: dict[TaskId, list[list[Any]]] = {}
        for tp, records in batch.items():
            by_task.setdefault(self.topology.task_of(TopicPartition(*tp)), []).append(records)
        for task_id, lists in sorted(by_task.items()):
            task = self._actives.get(task_id)
            if task is None or task.consumer != index or task.torn:  # read them again later
                if task is not None and task.torn:
                    log.debug("consumer %d: task %s waits for its restore", index, task_id)
                else:
                    log.warning("consumer %d: records of task %s it does not run", index, task_id)
                self._rewind(consumer, lists)
                continue
            # Co-partitioned partitions of one task: in timestamp order, as Kafka Streams.
            ordered: Iterable[Any] = (
                lists[0] if len(lists) == 1 else heapq.merge(*lists, key=_timestamp)
            )
            for record in ordered:
                await self._process(task, record)

    @staticmethod
    def _rewind(consumer: AIOKafkaConsumer, batches: Iterable[list[Any]]) -> None:
        """Seek back to the first record of every partition in ``batches`` that is still
        assigned, so records fetched but not processed are fetched again, never skipped."""
        for records in batches:
            if records:
                first = records[0]
                tp = KafkaTopicPartition(first.topic, first.partition)
                with contextlib.suppress(Exception):  # no longer assigned: nothing to rewind
                    consumer.seek(tp, first.offset)

    async def _process(self, task: _ActiveTask, record: Record) -> None:
        tp = TopicPartition(record.topic, record.partition)
        stores = task.stores.values()
        mark = _mark_of(record)
        if stores and all(s.seen(*mark) for s in stores):
            task.skipped += 1  # already in every store: a replay after a crash or rebalance
            self.skipped += 1
            task.offsets[tp] = record.offset + 1
            return
        task.current, task.mark, task.sends = record, mark, 0
        try:
            await task.processor.process(task.context, record)
        except Exception as exc:
            _undo(task)
            if self.processing_errors == "stop":
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
        except BaseException:  # cancelled (or interrupted) mid-record: commit none of it
            _undo(task)
            _tear(task)
            raise
        finally:
            task.current = task.mark = None
        task.journal.clear()
        for s in stores:
            s.mark_processed(*mark)
        try:
            await self._send_outbox(task)
        except BaseException:  # part of the record's writes may be out: commit none of them
            _tear(task)
            raise
        task.offsets[tp] = record.offset + 1
        task.processed += 1
        self.processed += 1

    async def _send_outbox(self, task: _ActiveTask) -> None:
        producer = self._producer
        assert producer is not None
        changelogs = task.by_changelog
        for topic, partition, key, value, headers in task.outbox:
            task.futures.append(
                await producer.send(topic, value, key=key, partition=partition, headers=headers)
            )
            state = (
                changelogs.get(TopicPartition(topic, partition)) if partition is not None else None
            )
            if state is not None:
                state.produced()
        task.outbox.clear()

    async def _commit(self, index: int) -> None:
        """Data and output acks, then changelog markers and their acks, then local stores and
        checkpoints, then input offsets. A failed write raises before any marker is produced,
        so no marker ever closes writes the changelog may not hold."""
        producer = self._producer
        assert producer is not None
        tasks = [t for t in self._actives.values() if t.consumer == index and not t.torn]
        futures = [f for t in tasks for f in t.futures]
        if futures:
            await asyncio.gather(*futures)  # a failed write raises: nothing is committed
        for task in tasks:
            task.futures.clear()
        dirty = [t for t in tasks if any(s.dirty for s in t.stores.values())]
        if not await self._sole_writer(index, dirty):
            return
        tasks = [t for t in tasks if not t.torn]
        done = await self._write_markers(index, tasks)
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
            self._checkpoint(task.task_id, task.stores, durable=False)
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
            log.warning("consumer %d: input offsets not committed (%r)", index, exc)
            return
        for task in tasks:
            task.committed.update(task.offsets)

    async def _commit_safely(self, index: int) -> None:
        """Commit; on failure drop the consumer's uncommitted state as a crash would (its
        writes may be in the changelog without a marker): each task is restored (and its
        orphan writes compensated) before it runs again, and its input is re-read."""
        try:
            await self._commit(index)
        except Exception as exc:
            log.warning(
                "consumer %d: commit failed (%r); its tasks' uncommitted state is dropped, "
                "restored from the changelog and the input re-read",
                index,
                exc,
            )
            for task in self._actives.values():
                if task.consumer == index:
                    _tear(task)

    async def _write_markers(
        self, index: int, tasks: Sequence[_ActiveTask]
    ) -> list[tuple[_ActiveTask, StoreState, int]]:
        """A marker per store with pending writes, acknowledged; each must land where its
        owner's records end (``StoreState.end``). One that lands later closed another
        writer's records too: ``_reassert`` writes ours after them, or the task is torn."""
        producer = self._producer
        assert producer is not None
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
        done, failed = [], []
        for task, state, expected, future in markers:  # every task's pending writes intact
            offset: int | None = future.result().offset
            if expected is not None and offset is not None and offset != expected:
                offset = await self._reassert(task, state, expected, offset)
            if offset is None:
                failed.append(task)
            else:
                done.append((task, state, offset))
        for task in failed:
            _tear(task)
            self.host.request_rejoin(index)
        return done

    async def _sole_writer(self, index: int, dirty: Sequence[_ActiveTask]) -> bool:
        """Whether ``index`` may write markers: it is still the member its tasks were
        assigned to (else every task of it is torn: a zombie commits nothing), and nobody
        else wrote the changelogs of ``dirty`` since it last read or wrote them (a task whose
        changelog was written elsewhere is torn and the consumer rejoins, so the task is
        restored or leaves). False also when the ends cannot be read (commit later)."""
        if self._lost(index):
            return False
        checked = [s for t in dirty for s in t.stores.values() if s.end is not None]
        if not checked or self._restorer is None:
            return True
        tps = [KafkaTopicPartition(*s.changelog) for s in checked]
        try:
            ends = await asyncio.wait_for(self._restorer.end_offsets(tps), _ENDS_TIMEOUT)
        except (KafkaError, TimeoutError) as exc:
            log.warning("consumer %d: changelog ends unknown (%r); committing later", index, exc)
            return False
        if self._lost(index):  # learnt while we waited
            return False
        foreign = False
        for task in dirty:
            stale = {
                s.name: (ends[KafkaTopicPartition(*s.changelog)], s.end)
                for s in task.stores.values()
                if s.end is not None and ends[KafkaTopicPartition(*s.changelog)] != s.end
            }
            if stale:
                log.warning(
                    "consumer %d: task %s: its changelog was written by another writer "
                    "(end, expected: %s); its uncommitted state is dropped, no marker written",
                    index,
                    task.task_id,
                    stale,
                )
                _tear(task)
                foreign = True
        if foreign:
            self.host.request_rejoin(index)
        return True

    def _lost(self, index: int) -> bool:
        """``index`` lost its membership since its last assignment: tear its tasks."""
        if not self.host.member_lost(index):
            return False
        self._tear_consumer(index, "left the group (evicted)")
        return True

    def _tear_consumer(self, index: int, why: str) -> None:
        mine = [t for t in self._actives.values() if t.consumer == index and not t.torn]
        for task in mine:
            _tear(task)
        if mine:
            log.warning(
                "consumer %d %s: the uncommitted state of %d task(s) is dropped and no "
                "marker written; they are restored before they run here again",
                index,
                why,
                len(mine),
            )

    async def _reassert(
        self, task: _ActiveTask, state: StoreState, first: int, marker: int
    ) -> int | None:
        """Another writer's records landed in ``state``'s changelog at ``[first, marker)``,
        between this owner's records and its marker, which closed them too. Write this
        owner's value of every key they wrote again, then a marker after them, so that the
        changelog ends at this owner's state; its offset, or None after three tries."""
        producer = self._producer
        assert producer is not None
        tp = state.changelog
        for _ in range(3):
            keys = await self._keys_written(tp, first, marker)
            log.warning(
                "task %s: %d record(s) of another writer in %s[%d] (offsets %d to %d) before "
                "this commit's marker; writing this owner's value of their %d key(s) again",
                task.task_id,
                marker - first,
                tp.topic,
                tp.partition,
                first,
                marker,
                len(keys),
            )
            state.end = marker + 1
            futures = []
            for key in keys:
                value = state.pending[key] if key in state.pending else state.store.get(key)
                state.pending[key] = value
                futures.append(
                    await producer.send(tp.topic, value, key=key, partition=tp.partition)
                )
                state.produced()
            expected = state.end
            futures.append(
                await producer.send(
                    tp.topic, state.marker(), key=COMMIT_KEY, partition=tp.partition
                )
            )
            acks = await asyncio.gather(*futures)
            first, marker = expected, acks[-1].offset
            if marker == expected:
                return marker
        log.error("task %s: %s[%d] keeps being written by another writer", task.task_id, *tp)
        return None

    async def _keys_written(self, tp: TopicPartition, first: int, end: int) -> list[bytes]:
        """Data keys of changelog partition ``tp`` at offsets ``[first, end)``."""
        reader = self._restorer
        assert reader is not None
        ktp = KafkaTopicPartition(*tp)
        keys: set[bytes] = set()
        async with self._restore_lock:
            reader.assign([ktp])
            reader.seek(ktp, first)
            while await reader.position(ktp) < end:
                for records in (await reader.getmany(ktp, timeout_ms=200)).values():
                    keys.update(
                        r.key
                        for r in records
                        if r.offset < end and r.key is not None and r.key != COMMIT_KEY
                    )
            reader.assign([])
        return sorted(keys)

    def _checkpoint(
        self, task: TaskId, states: Mapping[str, StoreState], *, durable: bool = True
    ) -> None:
        offsets = {s.changelog: s.position for s in states.values()}
        if offsets and self._checkpointed.get(task) != offsets:
            try:
                self.state.write_checkpoint(task, offsets, durable=durable)
                self._checkpointed[task] = offsets
            except OSError as exc:
                log.warning("cannot checkpoint task %s: %s", task, exc)

    # -- task changes (called by the host) -------------------------------------------------------

    def _open_states(self, task: TaskId) -> dict[str, StoreState]:
        stores = self.topology.subtopology(task.subtopology).stores
        states = {}
        for name in stores:
            changelog = TopicPartition(self.topology.changelog_topic(name), task.partition)
            path = self.state.task_dir(task) / f"{name}.rocksdb"
            states[name] = StoreState.open(name, changelog, open_store(self.store_kind, path))
        return states

    async def _take_states(self, task: TaskId) -> tuple[dict[str, StoreState], str]:
        """The task's stores: kept from a moment ago, a standby's, or opened from disk."""
        if task in self._parked:
            return self._parked.pop(task)
        async with self._standby_lock:
            if task in self._standbys:
                self._standby_dirty = True
                self._standby_owner.pop(task, None)
                return self._standbys.pop(task), "standby"
        closing = self._store_closes.get(task)
        if closing is not None:  # left a moment ago: its files are ours once closed
            await asyncio.wait([closing])
        return self._open_states(task), "open"

    def _close_states(self, task: TaskId, states: Mapping[str, StoreState]) -> asyncio.Future[None]:
        """Close a task's stores; a persistent store keeps its checkpoint (sticky restarts),
        an in-memory one loses it with its content. The stores close in a thread (closing a
        large RocksDB store takes seconds, which would stall heartbeats and every consumer);
        opening the task's stores again waits for it (``_take_states``)."""
        persistent = False
        for state in states.values():
            persistent = state.store.persistent
            state.drop_unclosed()
        try:
            if persistent:
                self._checkpoint(task, states)
            else:
                self.state.delete_checkpoint(task)
                self._checkpointed.pop(task, None)
        except Exception:  # the stores still close below
            log.exception("task %s: checkpoint on close failed", task)
        closing = asyncio.ensure_future(asyncio.to_thread(_close_stores, task, [*states.values()]))
        self._store_closes[task] = closing

        def forget(done: asyncio.Future[None]) -> None:
            if self._store_closes.get(task) is done:
                del self._store_closes[task]

        closing.add_done_callback(forget)
        return closing

    async def _assign(self, consumer: int, tasks: frozenset[TaskId]) -> None:
        new: list[tuple[TaskId, dict[str, StoreState], str]] = []
        for task_id in sorted(tasks):
            task = self._actives.get(task_id)
            if task is not None:
                log.info("task %s moved from consumer %d to %d", task_id, task.consumer, consumer)
                task.consumer = consumer
                if task.torn:  # its state was dropped: restore it like a crashed owner's
                    new.append((task_id, task.stores, "kept"))
                continue
            self._want_standby.pop(task_id, None)
            states, how = await self._take_states(task_id)
            new.append((task_id, states, _source_of(states, how)))
        await self._start_tasks(consumer, new)

    async def _start_tasks(
        self, consumer: int, new: Sequence[tuple[TaskId, dict[str, StoreState], str]]
    ) -> None:
        """Restore ``new`` tasks' stores to their changelog's end, undo orphan writes, run."""
        if any(source == "kept" for _, _, source in new) and self._producer is not None:
            await self._producer.flush()  # a torn task's writes in flight: in the changelog
        starts = {t: sum(s.position for s in states.values()) for t, states, _ in new}
        started = time.monotonic()
        counts = await self._restore([s for _, states, _ in new for s in states.values()])
        seconds = time.monotonic() - started
        for task_id, states, source in new:
            processor = self.processors[task_id.subtopology]()
            task = _ActiveTask(task_id, consumer, states, processor, repartition=self._repartition)
            compensated = 0
            for state in states.values():
                keys = state.compensate()
                compensated += len(keys)
                for key in keys:
                    cl = state.changelog
                    task.outbox.append((cl.topic, cl.partition, key, state.pending[key], None))
            await self._send_outbox(task)
            self._actives[task_id] = task
            records = sum(counts.get(id(s), 0) for s in states.values())
            if states:
                self.restore_events.append(
                    RestoreEvent(task_id, source, starts[task_id], records, seconds, compensated)
                )
                self._checkpoint(task_id, states)
            if not states:
                log.info("consumer %d: task %s assigned (stateless)", consumer, task_id)
                continue
            log.info(
                "consumer %d: task %s assigned (state: %s, %d changelog records restored%s)",
                consumer,
                task_id,
                source,
                records,
                f", {compensated} uncommitted writes of a crashed owner undone"
                if compensated
                else "",
            )

    async def _revoke(self, consumer: int, tasks: frozenset[TaskId]) -> None:
        for task_id in sorted(tasks):
            task = self._actives.get(task_id)
            if task is None or task.consumer != consumer:
                continue  # already moved to another consumer of this process
            del self._actives[task_id]
            if task_id in self._want_standby:
                owner = self._want_standby.pop(task_id)
                await self._add_standby_states(task_id, task.stores, owner)
                log.info(
                    "consumer %d: task %s revoked; its stores stay here as a standby",
                    consumer,
                    task_id,
                )
            else:
                self._parked[task_id] = (task.stores, "kept")
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
                self._want_standby[task_id] = consumer
                continue
            if task_id in self._standbys:  # moves from another consumer of this process
                self._standby_owner[task_id] = consumer
                continue
            states, how = await self._take_states(task_id)
            await self._add_standby_states(task_id, states, consumer)
            log.info(
                "consumer %d: standby %s added (state: %s, from changelog offset %s)",
                consumer,
                task_id,
                _source_of(states, how),
                ",".join(str(s.position) for s in states.values()),
            )

    async def _add_standby_states(
        self, task: TaskId, states: dict[str, StoreState], consumer: int
    ) -> None:
        async with self._standby_lock:
            self._standbys[task] = states
            self._standby_owner[task] = consumer
            self._standby_dirty = True

    async def _remove_standbys(self, consumer: int, tasks: frozenset[TaskId]) -> None:
        for task_id in sorted(tasks):
            if self._want_standby.get(task_id) == consumer:
                del self._want_standby[task_id]
            async with self._standby_lock:
                if self._standby_owner.get(task_id) != consumer:
                    continue  # not (or no longer) this consumer's: another one holds it now
                del self._standby_owner[task_id]
                states = self._standbys.pop(task_id, None)
                self._standby_dirty = True
            if states is not None:
                self._parked[task_id] = (states, "standby")
                log.info("consumer %d: standby %s removed", consumer, task_id)

    async def _membership_lost(self, consumer: int) -> None:
        async with self._locks[consumer]:
            self._epochs[consumer] += 1  # a batch fetched as a zombie is not processed
            self._tear_consumer(consumer, "was out of the group")

    async def _rebalance_started(self, consumer: int) -> None:
        self._rebalancing.add(consumer)
        async with self._locks[consumer]:
            self._epochs[consumer] += 1
            self._suspended[consumer] = frozenset(
                t for t, task in self._actives.items() if task.consumer == consumer
            )
            await self._commit_safely(consumer)
        if self.end_offsets is not None:  # the leader's lags: as of this rebalance's commits
            self.end_offsets.refresh_soon()
        if self._suspended[consumer]:
            log.info(
                "consumer %d: rebalance; committed and suspended %d task(s)",
                consumer,
                len(self._suspended[consumer]),
            )

    async def _rebalance_completed(self, consumer: int) -> None:
        mine = frozenset(t for t, task in self._actives.items() if task.consumer == consumer)
        kept = mine & self._suspended.pop(consumer, frozenset())
        # Before the consumer processes again (a write of its own would move an end).
        try:
            await self._check_ends(consumer, kept)
            torn = [
                (t, self._actives[t].stores, "kept") for t in sorted(mine) if self._actives[t].torn
            ]
            if torn:  # its state was dropped (or is stale) and it stayed here: restore it
                await self._start_tasks(consumer, torn)
        finally:
            self._rebalancing.discard(consumer)
        resumed = kept - {t for t, _, _ in torn}
        if resumed:
            log.info(
                "consumer %d: resumed %s (same consumer, same member, changelogs at their "
                "ends: no close, no restore)",
                consumer,
                ", ".join(map(str, sorted(resumed))),
            )
        if not self._rebalancing:  # every consumer has its new tasks: close what nobody took
            # Not awaited: this callback holds up the member's rejoin (no heartbeats).
            for task_id, (states, _) in sorted(self._parked.items()):
                self._close_states(task_id, states)
                log.info("task %s closed (no longer on this process)", task_id)
            self._parked.clear()

    async def _check_ends(self, consumer: int, tasks: frozenset[TaskId]) -> None:
        """Tear every task of ``tasks`` whose changelog another writer wrote while it was
        suspended here (its end is not where this owner's records end), so it is restored
        rather than resumed; all of them when the ends cannot be read."""
        states = [
            s
            for t in sorted(tasks)
            if not self._actives[t].torn
            for s in self._actives[t].stores.values()
        ]
        if not states or self._restorer is None:
            return
        tps = [KafkaTopicPartition(*s.changelog) for s in states]
        try:
            ends = await asyncio.wait_for(self._restorer.end_offsets(tps), _ENDS_TIMEOUT)
        except (KafkaError, TimeoutError) as exc:
            log.warning("consumer %d: changelog ends unknown (%r); restoring", consumer, exc)
            ends = {}
        for task_id in sorted(tasks):
            task = self._actives[task_id]
            stale = {
                s.name: (ends.get(KafkaTopicPartition(*s.changelog)), s.end)
                for s in task.stores.values()
                if ends.get(KafkaTopicPartition(*s.changelog))
                != (s.end if s.end is not None else s.position)
            }
            if stale and not task.torn:
                log.warning(
                    "consumer %d: task %s: changelog written elsewhere meanwhile (end, "
                    "expected: %s); restoring it instead of resuming",
                    consumer,
                    task_id,
                    stale,
                )
                _tear(task)

    # -- restores --------------------------------------------------------------------------------

    async def _restore(self, states: Sequence[StoreState]) -> dict[int, int]:
        """Bring ``states`` to their changelog's end; records read per state (by ``id``)."""
        reader = self._restorer
        if not states or reader is None:
            return {}
        before = {id(s): s.restored for s in states}
        by_tp = {KafkaTopicPartition(*s.changelog): s for s in states}
        async with self._restore_lock:
            reader.assign(list(by_tp))
            ends = await reader.end_offsets(list(by_tp))
            todo = set()
            for tp, state in by_tp.items():
                state.drop_unclosed()
                if state.position > ends[tp]:
                    log.warning(
                        "%s: local position %d is past the changelog end %d (topic recreated?); "
                        "restoring from the start",
                        tp,
                        state.position,
                        ends[tp],
                    )
                    state.store.write({k: None for k, _ in state.store.items()}, {})
                    state.position, state.applied = 0, {}
                reader.seek(tp, state.position)
                if state.position < ends[tp]:
                    todo.add(tp)
            while todo:
                batch = await reader.getmany(*todo, timeout_ms=200)
                for tp, records in batch.items():
                    state, end = by_tp[tp], ends[tp]
                    for r in records:
                        if r.offset < end:
                            state.restore(r.offset, r.key, r.value)
                for tp in list(todo):
                    if await reader.position(tp) >= ends[tp]:
                        todo.discard(tp)
            reader.assign([])
        for tp, state in by_tp.items():
            state.end = ends[tp]  # the active's records land from here on
        return {id(s): s.restored - before[id(s)] for s in states}

    async def _standby_loop(self) -> None:
        reader = self._standby_reader
        assert reader is not None
        next_checkpoint = time.monotonic() + self.commit_interval
        by_tp: dict[Any, StoreState] = {}
        while not self._stopped.is_set():
            if not by_tp and not self._standby_dirty:
                await asyncio.sleep(0.1)
                continue
            batch = await reader.getmany(timeout_ms=100) if by_tp else {}
            async with self._standby_lock:
                if self._standby_dirty:  # standbys changed: records in flight are dropped
                    self._standby_dirty = False
                    by_tp = {
                        KafkaTopicPartition(*s.changelog): s
                        for states in self._standbys.values()
                        for s in states.values()
                    }
                    reader.assign(list(by_tp))
                    for tp, state in by_tp.items():
                        state.drop_unclosed()
                        reader.seek(tp, state.position)
                    continue
                for tp, records in batch.items():
                    found = by_tp.get(tp)
                    if found is not None:
                        for r in records:
                            found.restore(r.offset, r.key, r.value)
                if time.monotonic() >= next_checkpoint:
                    for task, states in self._standbys.items():
                        self._checkpoint(task, states)
                    next_checkpoint = time.monotonic() + self.commit_interval


def _close_stores(task: TaskId, states: Sequence[StoreState]) -> None:
    for state in states:
        try:
            state.store.close()
        except Exception:  # one store failing to close must not leak the others
            log.exception("task %s: closing store %s failed", task, state.name)


def _write_committed(markers: Iterable[tuple[StoreState, int]]) -> None:
    for state, offset in markers:
        state.committed(offset)


def _undo(task: _ActiveTask) -> None:
    """Undo the writes of the record being processed (from the task's journal)."""
    for state, key, had, old in reversed(task.journal):
        if had:
            state.pending[key] = old
        else:
            state.pending.pop(key, None)
    task.journal.clear()
    task.outbox.clear()


def _tear(task: _ActiveTask) -> None:
    """Drop everything of ``task`` not committed, as if its process had crashed: writes
    already produced become an orphan tail that the next restore compensates, and the task
    commits nothing until it is restored (``torn``)."""
    task.torn = True
    task.outbox.clear()
    task.journal.clear()
    task.futures.clear()
    task.offsets = dict(task.committed)
    for state in task.stores.values():
        state.pending.clear()
        state.pending_applied.clear()
        state.drop_unclosed()
        state.end = None  # known again after its restore


def _timestamp(record: Record) -> int:
    return record.timestamp


class _Listener(TaskListener):
    """Task changes from the host; a failure stops the application (clearly, once) rather
    than leaving a consumer with partitions but no tasks."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def _guard(self, change: Coroutine[Any, Any, None], what: str) -> None:
        """Run one change unless the app is closing (its stores may be closed by then);
        ``stop()`` waits for the changes under way."""
        app = self.app
        if app._closing:
            change.close()
            log.info("%s skipped: the application is stopping", what)
            return
        app._changes += 1
        app._changes_done.clear()
        try:
            await app._fail_on_error(change, what)
        finally:
            app._changes -= 1
            if not app._changes:
                app._changes_done.set()

    async def on_active_assigned(self, consumer: int, tasks: frozenset[TaskId]) -> None:
        await self._guard(self.app._assign(consumer, tasks), "assigning tasks")

    async def on_active_revoked(self, consumer: int, tasks: frozenset[TaskId]) -> None:
        await self._guard(self.app._revoke(consumer, tasks), "revoking tasks")

    async def on_standby_added(self, consumer: int, tasks: frozenset[TaskId]) -> None:
        await self._guard(self.app._add_standbys(consumer, tasks), "adding standbys")

    async def on_standby_removed(self, consumer: int, tasks: frozenset[TaskId]) -> None:
        await self._guard(self.app._remove_standbys(consumer, tasks), "removing standbys")

    async def on_rebalance_started(self, consumer: int) -> None:
        await self._guard(self.app._rebalance_started(consumer), "starting a rebalance")

    async def on_rebalance_completed(self, consumer: int) -> None:
        await self._guard(self.app._rebalance_completed(consumer), "completing a rebalance")

    async def on_membership_lost(self, consumer: int) -> None:
        await self._guard(self.app._membership_lost(consumer), "dropping a zombie's state")

    async def on_error(self, consumer: int, code: ErrorCode) -> None:
        log.error("consumer %d: no tasks this round: the leader reported %s", consumer, code.name)

    async def on_shutdown_requested(self) -> None:
        log.info("the application's shutdown was requested; stopping")
        self.app._stopped.set()
