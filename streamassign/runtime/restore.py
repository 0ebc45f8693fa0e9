"""Reading changelogs: the state updater (restores of actives, standbys and warmups) and the
lookups commits need (end offsets, the keys a range holds).

**The state updater** (as Kafka Streams' of that name) is one loop with one plain consumer (no
group) that reads the changelogs of every standby and warmup (continuously, from their
positions) and of every active task being restored (from its position to the changelog's end
as found when its restore starts). It reads in bounded steps (``max_records`` a fetch) and
yields to the event loop between them, so a long restore never stalls heartbeats or the
processing of tasks that are already running: their consumers go on while the restoring task's
input partitions are paused. When a restoring task reaches its end it is handed to
``on_restored`` (the app compensates orphan writes and resumes its input there).
``StoreState`` applies only what a commit marker closed, so a store is a committed prefix of
its changelog at every step.

**Lookups** (``ChangelogLookups``) use a second plain consumer, one at a time (``lock``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.errors import KafkaError

from .. import TaskId, TopicPartition
from ..errors import ChangelogReadTimeoutError, EndOffsetsTimeoutError
from ._clients import Clients
from ._topics import ChangelogCheck
from .changelog import COMMIT_KEY, StoreState
from .end_offsets import high_watermarks, partition_names
from .standbys import Standbys, check_open
from .tasks import ActiveTask, source_of

log = logging.getLogger("streamassign.runtime")

#: Seconds a changelog end offset lookup may take (at commits and resumes).
ENDS_TIMEOUT = 5.0
#: Seconds ``ChangelogLookups.keys_written`` may take, waiting for the reader included.
KEYS_TIMEOUT = 10.0


@attrs.define(eq=False)
class Restoring:
    """One active task whose stores the state updater brings to their changelogs' ends."""

    task: ActiveTask
    #: Where its state came from (``standby``, ``kept``, ``local``, ``cold``).
    source: str
    #: Changelog positions summed over its stores when the restore started.
    start: int
    started: float = attrs.field(factory=time.monotonic)
    #: Records each store (by ``id``) had read before this restore.
    before: dict[int, int] = attrs.field(factory=dict)
    #: The changelog end offsets it restores to (read when its partitions are first fetched).
    ends: dict[TopicPartition, int] | None = None

    def __attrs_post_init__(self) -> None:
        self.before = {id(s): s.restored for s in self.task.stores.values()}

    @property
    def records(self) -> int:
        """Changelog records read by this restore so far (data and markers)."""
        return sum(s.restored - self.before.get(id(s), 0) for s in self.task.stores.values())


@attrs.frozen
class _Plan:
    """What the state updater's reader is to read (taken under ``standbys.lock``)."""

    #: Each changelog partition to read: its store, and its restore (None: a standby's).
    by_tp: dict[TopicPartition, tuple[StoreState, Restoring | None]]
    #: The restores whose changelog ends are still to be looked up.
    new: list[Restoring]


class StateUpdater:
    """Reads the changelogs of standbys (``standbys``) and of restoring actives."""

    def __init__(
        self,
        clients: Clients,
        standbys: Standbys,
        checkpoint: Callable[[TaskId, Mapping[str, StoreState]], None],
        on_restored: Callable[[Restoring], Awaitable[bool]],
        start_over: Callable[[TaskId, StoreState], Awaitable[Path | None]],
        max_records: int = 10_000,
        check: ChangelogCheck | None = None,
    ) -> None:
        self.clients = clients
        #: Sets a store aside and puts an empty one in its place (``TaskStores.start_over``).
        self.start_over = start_over
        #: Reads high watermarks (tests replace it).
        self.high_watermarks: Callable[[Any, Sequence[Any]], Awaitable[Mapping[Any, int]]] = (
            high_watermarks
        )
        #: Asked why end offsets cannot be read (raises when the changelog partitions do
        #: not exist: the application stops rather than restore forever).
        self.check = check
        self.standbys = standbys
        self.checkpoint = checkpoint
        #: Called with a restore that reached its ends; False: not now, ask again next step.
        self.on_restored = on_restored
        #: Records applied per step at most (the loop yields between steps).
        self.max_records = max_records
        self.restoring: dict[TaskId, Restoring] = {}
        #: What each assigned changelog partition feeds: a store, and its restore (None: a
        #: standby's store).
        self._by_tp: dict[TopicPartition, tuple[StoreState, Restoring | None]] = {}
        #: Next offset to apply per assigned partition (a reassignment goes on from there
        #: for a partition that still feeds the same store, without reading anything again).
        self._next: dict[TopicPartition, int] = {}
        #: Stores that read a record below their position (``_apply``), with its offset.
        self._behind: dict[TopicPartition, tuple[StoreState, int]] = {}
        self._next_checkpoint = 0.0

    def add(self, task: ActiveTask, source: str) -> Restoring:
        """Restore ``task``'s stores (replacing a restore of the same task under way)."""
        entry = Restoring(task, source, sum(s.position for s in task.stores.values()))
        for state in task.stores.values():
            state.restore_started()
        self.restoring[task.task_id] = entry
        task.restoring = True
        self.standbys.dirty = True
        return entry

    def cancel(self, task: TaskId) -> None:
        """Stop restoring ``task`` (it left this consumer); its stores keep what they hold."""
        entry = self.restoring.pop(task, None)
        if entry is not None:
            entry.task.restoring = False
            self.standbys.dirty = True

    async def run(self, stopped: asyncio.Event, interval: Callable[[], float]) -> None:
        """Step until ``stopped``; checkpoint every ``interval()`` s."""
        while not stopped.is_set():
            if not self._by_tp and not self.standbys.dirty:
                await asyncio.sleep(0.1)
                continue
            await self.step(interval())
            await asyncio.sleep(0)  # whatever else is ready runs between two steps

    async def settle(self) -> None:
        """Step until no restore is under way (tests; the loop does this by itself)."""
        while self.restoring or self.standbys.dirty:
            await self.step(3600.0, timeout_ms=0)

    async def step(self, interval: float, timeout_ms: int = 100) -> None:
        """One fetch, applied; hand over the restores that reached their ends.

        Broker requests (end offsets, positions) run outside ``standbys.lock``: consumers'
        rebalance callbacks wait on that lock, and they send no heartbeats meanwhile."""
        reader = self.clients.changelog_reader
        assert reader is not None
        batch: dict[Any, list[Any]] = {}
        if self._by_tp:
            batch = await reader.getmany(timeout_ms=timeout_ms, max_records=self.max_records)
        plan: _Plan | None = None
        async with self.standbys.lock:
            if self.standbys.dirty:  # standbys or restores changed: records in flight dropped
                self.standbys.dirty = False
                plan = self._plan()
            else:
                self._apply(batch)
        if self._behind:
            await self._start_over_behind()
        ready = plan is None or await self._fetch_ends(reader, plan.new)
        async with self.standbys.lock:
            if plan is not None and ready and not self.standbys.dirty:
                self._reassign(reader, plan.by_tp)  # else changed meanwhile: planned again
            if time.monotonic() >= self._next_checkpoint:
                for task, states in self.standbys.states.items():
                    self.checkpoint(task, states)
                for entry in self.restoring.values():
                    self.checkpoint(entry.task.task_id, entry.task.stores)
                self._next_checkpoint = time.monotonic() + interval
        # a snapshot: restores may be added or cancelled while a position is awaited
        done = [e for e in list(self.restoring.values()) if await self._reached(reader, e)]
        for entry in done:
            if self.restoring.get(entry.task.task_id) is not entry:
                continue  # cancelled or replaced meanwhile
            if await self.on_restored(entry):
                if self.restoring.get(entry.task.task_id) is entry:
                    del self.restoring[entry.task.task_id]
                self.standbys.dirty = True

    def _plan(self) -> _Plan:
        """What the reader should read now: every standby's and restore's changelogs, and the
        restores whose ends are still to be looked up."""
        by_tp: dict[TopicPartition, tuple[StoreState, Restoring | None]] = {}
        for states in self.standbys.states.values():
            for state in states.values():
                by_tp[state.changelog] = (state, None)
        for restoring in self.restoring.values():
            if not restoring.task.restoring:
                continue  # torn meanwhile: its restore starts over when it runs again
            if not check_open(restoring.task.stores):
                continue  # opening in a thread (``TaskStores.take``): planned once open
            for state in restoring.task.stores.values():
                by_tp[state.changelog] = (state, restoring)
        new = [e for e in self.restoring.values() if e.ends is None and check_open(e.task.stores)]
        return _Plan(by_tp, new)

    async def _fetch_ends(self, reader: Any, new: list[Restoring]) -> bool:
        """Look up the changelog ends of the restores in ``new``; False if that failed (the
        reader is left as it was, and the next step plans again). Raises
        ``MissingChangelogError`` when their changelog partitions do not exist (deleted, or
        source partitions added while running): they would never restore."""
        if not new:
            return True
        tps = [KafkaTopicPartition(*s.changelog) for e in new for s in e.task.stores.values()]
        try:
            ends = await asyncio.wait_for(reader.end_offsets(tps), ENDS_TIMEOUT)
        except (KafkaError, TimeoutError) as exc:
            why = await explain_failure(self.check, [TopicPartition(*tp) for tp in tps], exc)
            log.warning("%s; restores start at the next step", why)
            self.standbys.dirty = True
            return False
        past = {
            s.changelog: (e, s)
            for e in new
            for s in e.task.stores.values()
            if s.position > ends[s.changelog]
        }
        if past and not await self._past_ends(reader, past):
            self.standbys.dirty = True
            return False
        for restore in new:
            restore.ends = {s.changelog: ends[s.changelog] for s in restore.task.stores.values()}
            restore.start = sum(s.position for s in restore.task.stores.values())  # now open
            if restore.source in ("local", "cold"):  # the checkpoint's guess until open
                restore.source = source_of(restore.task.stores, "open")
        return True

    async def _past_ends(
        self, reader: Any, past: Mapping[TopicPartition, tuple[Restoring, StoreState]]
    ) -> bool:
        """Stores past the end read: that end is the last stable offset, which lags a
        just-committed transaction until its markers are written, so only a store past the
        high watermark is past the changelog's end (the topic truncated, e.g. an unclean
        leader election, or recreated). Such a store is set aside (never deleted) and
        restored from the changelog as it is: stopping instead would stop every restart
        again. False: some store is only past the last stable offset (look again at the
        next step), or the high watermarks could not be read."""
        tps = [KafkaTopicPartition(*tp) for tp in past]
        try:
            marks = await asyncio.wait_for(self.high_watermarks(reader, tps), ENDS_TIMEOUT)
        except (KafkaError, TimeoutError) as exc:
            log.warning(
                "changelog high watermarks unknown (%r); restores start at the next step", exc
            )
            return False
        waiting = False
        for tp, (entry, state) in past.items():
            end = marks[KafkaTopicPartition(*tp)]
            if state.position <= end:
                waiting = True  # a commit's markers not written yet
                continue
            if self.restoring.get(entry.task.task_id) is not entry or not entry.task.restoring:
                continue  # cancelled or torn meanwhile: looked at again if it comes back
            await self._start_over(
                tp,
                entry.task.task_id,
                state,
                f"is past the changelog's end {end} (the topic truncated or recreated?)",
            )
        return not waiting

    async def _start_over_behind(self) -> None:
        """Stores that read a record below their position: their changelog was truncated or
        recreated below it (a reader seeked past the end restarts at the log's start), so
        what follows is not their history. Set aside and restored from the start, as a store
        past the high watermark (applying on would mix the two logs)."""
        behind, self._behind = self._behind, {}
        for tp, (state, offset) in behind.items():
            task = self._task_of(state)
            if task is None:
                continue  # gone meanwhile
            self._next.pop(tp, None)
            await self._start_over(
                tp,
                task,
                state,
                f"read offset {offset} (the topic truncated or recreated below it?)",
            )
            entry = self.restoring.get(task)
            if entry is not None and any(s is state for s in entry.task.stores.values()):
                entry.ends = None  # the old log's ends: looked up again in the new one
        self.standbys.dirty = True  # read again from the new positions

    def _task_of(self, state: StoreState) -> TaskId | None:
        for task, states in self.standbys.states.items():
            if any(s is state for s in states.values()):
                return task
        for entry in self.restoring.values():
            if any(s is state for s in entry.task.stores.values()):
                return entry.task.task_id
        return None

    async def _start_over(
        self, tp: TopicPartition, task: TaskId, state: StoreState, found: str
    ) -> None:
        """Set ``state``'s store aside and restore it from the changelog as it is, with one
        error line: its position, then what was ``found`` there."""
        position = state.position
        aside = await self.start_over(task, state)
        log.error(
            "%s[%d]: task %s's local store %r at changelog offset %d %s; moved to %s, "
            "restoring it from the changelog",
            tp.topic,
            tp.partition,
            task,
            state.name,
            position,
            found,
            aside if aside is not None else "nowhere (in memory: emptied)",
        )

    def _reassign(
        self, reader: Any, by_tp: dict[TopicPartition, tuple[StoreState, Restoring | None]]
    ) -> None:
        """Read the changelogs of ``by_tp``: a partition that feeds the same store as before
        from where it was, any other from its store's position (records read after its last
        marker are read again). Every restore in it knows its ends."""
        reader.assign([KafkaTopicPartition(*tp) for tp in by_tp])
        for tp, (state, owner) in by_tp.items():
            if self._by_tp.get(tp) == (state, owner) and tp in self._next:
                reader.seek(KafkaTopicPartition(*tp), self._next[tp])  # goes on where it was
                continue
            self._next.pop(tp, None)
            state.drop_unclosed()
            reader.seek(KafkaTopicPartition(*tp), state.position)
        self._by_tp = by_tp
        self._next = {tp: offset for tp, offset in self._next.items() if tp in by_tp}

    def _apply(self, batch: Mapping[Any, list[Any]]) -> None:
        for tp, records in batch.items():
            found = self._by_tp.get(TopicPartition(*tp))
            if found is None:
                continue
            state, entry = found
            if entry is not None and not entry.task.restoring:
                continue  # torn meanwhile (its unclosed records dropped): apply nothing more
            end = entry.ends[state.changelog] if entry is not None and entry.ends else None
            for r in records:
                if end is not None and r.offset >= end:
                    break  # past what this restore reads (its owner's records land there)
                if r.offset < state.position:  # the reader reset to the log's start
                    self._behind[state.changelog] = (state, r.offset)
                    break
                state.restore(r.offset, r.key, r.value)
                self._next[state.changelog] = r.offset + 1

    async def _reached(self, reader: Any, entry: Restoring) -> bool:
        """Whether ``entry`` read its changelogs to their ends; True also for a restore made
        void (its task torn: ``on_restored`` drops it)."""
        if not entry.task.restoring:
            return True
        if entry.ends is None:
            return False
        for state in entry.task.stores.values():
            end = entry.ends[state.changelog]
            if state.position >= end:
                continue
            if self._by_tp.get(state.changelog, (None, None))[1] is not entry:
                return False  # not read yet (reassigned at the next step)
            if await reader.position(KafkaTopicPartition(*state.changelog)) < end:
                return False
        return True


async def explain_failure(
    check: ChangelogCheck | None, tps: Sequence[TopicPartition], exc: BaseException
) -> str:
    """One line on why the end offsets of ``tps`` could not be read (``exc``), the cause as
    far as ``check`` finds it; raises ``MissingChangelogError`` when some do not exist."""
    names = partition_names(tps)
    failure = (
        f"not listed within {ENDS_TIMEOUT:g} s"
        if isinstance(exc, TimeoutError) and not str(exc)
        else repr(exc)
    )
    cause = await check.explain(tps) if check is not None else ""
    return f"changelog ends of {names} unknown ({failure}{'; ' + cause if cause else ''})"


class ChangelogLookups:
    """End offsets and key lookups through ``clients.restorer``, one at a time."""

    def __init__(self, clients: Clients, check: ChangelogCheck | None = None) -> None:
        self.clients = clients
        self.lock = asyncio.Lock()
        #: Asked why end offsets cannot be read (see ``explain_failure``).
        self.check = check

    async def ends(self, states: Sequence[StoreState]) -> dict[TopicPartition, int]:
        """Changelog end offsets of ``states`` (bounded by ``ENDS_TIMEOUT``; raises
        ``KafkaError``, ``EndOffsetsTimeoutError`` naming the partitions and the cause found,
        or ``MissingChangelogError`` when some do not exist)."""
        reader = self.clients.restorer
        assert reader is not None
        tps = [KafkaTopicPartition(*s.changelog) for s in states]
        try:
            ends = await asyncio.wait_for(reader.end_offsets(tps), ENDS_TIMEOUT)
        except (KafkaError, TimeoutError) as exc:
            # raises MissingChangelogError when some partitions do not exist
            why = await explain_failure(self.check, [s.changelog for s in states], exc)
            if isinstance(exc, KafkaError):
                raise  # its kind says what happened (the callers log it)
            raise EndOffsetsTimeoutError(why) from exc
        return {TopicPartition(*tp): end for tp, end in ends.items()}

    async def keys_written(
        self, tp: TopicPartition, first: int, end: int, timeout: float = KEYS_TIMEOUT
    ) -> dict[bytes, bytes | None]:
        """Data keys of changelog partition ``tp`` at offsets ``[first, end)``, each with the
        last value written there (what a restore gives it); raises
        ``ChangelogReadTimeoutError`` when they are not read within ``timeout`` seconds
        (the reader is left unassigned either way)."""
        reader = self.clients.restorer
        assert reader is not None
        ktp = KafkaTopicPartition(*tp)
        keys: dict[bytes, bytes | None] = {}
        try:
            async with asyncio.timeout(timeout), self.lock:
                reader.assign([ktp])
                try:
                    reader.seek(ktp, first)
                    while await reader.position(ktp) < end:
                        for records in (await reader.getmany(ktp, timeout_ms=200)).values():
                            keys.update(
                                (r.key, r.value)
                                for r in records
                                if r.offset < end and r.key is not None and r.key != COMMIT_KEY
                            )
                finally:
                    reader.assign([])
        except TimeoutError as exc:
            raise ChangelogReadTimeoutError(
                f"{tp.topic}[{tp.partition}]: offsets {first} to {end} not read within "
                f"{timeout:g} s"
            ) from exc
        return keys
