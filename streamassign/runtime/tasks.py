"""What a processor sees of a task, and the task itself: its stores, its outbox, its offsets.

``Table`` and ``TaskContext`` are the processor's view; ``ActiveTask`` is the runtime's record of
one active task (its processor, stores, pending sends and input offsets). ``undo`` drops the
writes of one record, ``tear`` everything not committed. No Kafka I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, TypeGuard

import attrs

from .. import TaskId, TopicPartition
from ..aiokafka.closing import retrieve_failure
from ..errors import FanOutLimitError, TaskMovedError, UnknownStoreError
from .changelog import POSITION_LIMIT, RANK_LIMIT, StoreState, is_position


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

    def __init__(self, task: ActiveTask, state: StoreState) -> None:
        self._task = task
        self._state = state

    def get(self, key: bytes) -> bytes | None:
        return self._state.get(key)

    def items(self) -> Iterable[tuple[bytes, bytes]]:
        return self._state.items()

    def put(self, key: bytes, value: bytes | None) -> None:
        """Write (``None`` deletes); goes to the changelog, committed with the task."""
        state = self._state
        refuse_if_moved(self._task)
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

    def __init__(self, task: ActiveTask) -> None:
        self._task = task
        self.task_id = task.task_id
        self._tables = {name: Table(task, state) for name, state in task.stores.items()}

    def store(self, name: str) -> Table:
        try:
            return self._tables[name]
        except KeyError:
            raise UnknownStoreError(
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
#: (input offset * RANK_LIMIT + rank among the records that input record sent).
UPSTREAM_HEADER = "streamassign.upstream"
POSITION_HEADER = "streamassign.position"
#: Digits of the longest position (below ``POSITION_LIMIT``, 2**83).
_POSITION_DIGITS = len(str(POSITION_LIMIT))


def _upstream_headers(record: Record, rank: int) -> list[tuple[str, bytes]]:
    if rank >= RANK_LIMIT:
        raise FanOutLimitError(f"one input record sent more than {RANK_LIMIT} repartition records")
    upstream = f"{record.topic}[{record.partition}]".encode()
    position = str(record.offset * RANK_LIMIT + rank).encode()
    return [(UPSTREAM_HEADER, upstream), (POSITION_HEADER, position)]


def mark_of(record: Record) -> tuple[str, int]:
    """The name and position under which the stores track ``record`` as applied: for a
    repartition record, its upstream input partition and position (stable across upstream
    replays, which give the same record a new offset); else its own topic and offset."""
    headers = dict(getattr(record, "headers", None) or ())
    upstream, position = headers.get(UPSTREAM_HEADER), headers.get(POSITION_HEADER)
    if isinstance(upstream, bytes) and _is_position_header(position):
        try:
            return upstream.decode(), int(position)
        except UnicodeDecodeError:  # not ours: track it by its own offset
            pass
    return record.topic, record.offset


def _is_position_header(value: object) -> TypeGuard[bytes]:
    """Whether ``value`` is a position header as ``_upstream_headers`` writes it: ASCII digits
    of a position. A foreign producer's ``b" 12 "``, ``b"1_000"`` or a huge number (which
    ``int()`` takes) would make the stores skip that upstream's every later record."""
    return (
        isinstance(value, bytes)
        and 0 < len(value) <= _POSITION_DIGITS
        and value.isdigit()  # bytes: ASCII digits only
        and is_position(int(value))
    )


@attrs.define(eq=False)
class ActiveTask:
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
    #: What identifies the current record in the stores' applied offsets (see ``mark_of``).
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
    #: Its stores are being restored (by the state updater, ``restore.py``): its input is
    #: paused, it processes and commits nothing until they are at their changelog's end.
    restoring: bool = False
    #: The consumer whose loop is inside one of its records (its processor may await) or
    #: its commit right now. A sibling consumer it moved to neither processes nor commits it
    #: meanwhile (its input is paused there).
    running: int | None = None
    #: No longer this process's active (revoked, or replaced by a restored copy): its
    #: stores may be another task's or a standby's now.
    released: bool = False
    #: Its stores by changelog partition (to count what each one's owner produced).
    by_changelog: dict[TopicPartition, StoreState] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.context = TaskContext(self)
        self.by_changelog = {s.changelog: s for s in self.stores.values()}


def refuse_if_moved(task: ActiveTask) -> None:
    """Raise ``TaskMovedError`` when the consumer running ``task``'s current record no longer
    owns the task (it moved to a sibling consumer or was revoked while the processor
    awaited): a write now would land in stores another owner has."""
    if task.running is not None and (task.released or task.running != task.consumer):
        raise TaskMovedError(
            f"task {task.task_id} moved away from consumer {task.running} while its record "
            "ran: the write is refused, the record undone (the task's new owner runs it)"
        )


def source_of(states: Mapping[str, StoreState], how: str) -> str:
    if how == "open":
        return "local" if any(s.position for s in states.values()) else "cold"
    return how


def undo(task: ActiveTask) -> None:
    """Undo the writes of the record being processed (from the task's journal)."""
    for state, key, had, old in reversed(task.journal):
        if had:
            state.pending[key] = old
        else:
            state.pending.pop(key, None)
    task.journal.clear()
    task.outbox.clear()


def tear(task: ActiveTask) -> None:
    """Drop everything of ``task`` not committed, as if its process had crashed: writes
    already produced become an orphan tail that the next restore compensates, and the task
    commits nothing until it is restored (``torn``)."""
    task.torn = True
    task.restoring = False  # a restore under way is dropped; it starts over when it runs again
    task.outbox.clear()
    task.journal.clear()
    drop_writes(task)
    task.offsets = dict(task.committed)
    for state in task.stores.values():
        state.pending.clear()
        state.pending_applied.clear()
        state.drop_unclosed()
        state.end = None  # known again after its restore
        state.overwritten = None


def drop_writes(task: ActiveTask) -> None:
    """Stop waiting for ``task``'s writes (torn, or the application stops on a failure): no
    one awaits them now, and a failure of theirs is already known (it is the cause): each is
    marked seen when it ends (hundreds of traces at exit otherwise when a changelog is deleted)."""
    for sent in task.futures:
        sent.add_done_callback(retrieve_failure)
    task.futures.clear()


def timestamp_of(record: Record) -> int:
    return record.timestamp
