"""Opening, handing over, checkpointing and closing the stores of tasks on one process.

A task's stores come from one of three places (``take``): kept from a moment ago (the task
left a role during the current rebalance: ``parked``), a standby of this process, or disk.
Opening and closing persistent stores run in threads of their own (``STORE_THREADS``):
opening or closing a large RocksDB store takes seconds (a flush, a WAL replay), which on the
event loop would stall heartbeats and every consumer, and in asyncio's default executor would
hold up the commits' local writes. No rebalance callback waits for them either: ``take``
hands out the task's stores at once, each a placeholder (``UnopenedStore``) until its thread
has opened it (after the task's earlier close, if one is under way). The task is restoring
meanwhile, its input paused, and the state updater starts reading its changelog once its
stores are open (``check_open``); a standby's stores are read once open (``Standbys.opened``).

A store whose files are damaged (corrupt, truncated, missing:
``stores.is_damaged_store_status``) is set aside as ``<store>.rocksdb.damaged-<UTC time>``
and opened empty, so it restores from its changelog. Any other failed open of an active's
stops the application (``check_open`` raises). A standby's is tried again with a bounded
backoff (``retry_delays``): nothing else would (the host announces a standby once), and a
standby never opened never catches up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs

from .. import TaskId, TopicPartition
from ..aiokafka.closing import CLOSE_TIMEOUT
from ..errors import DamagedStateError, StoreIOError, StoreNotOpenError, StreamAssignError
from ..localstate import StateDirectory
from ..repeats import Repeats
from ..topology import Topology
from .changelog import StoreState
from .standbys import Standbys, is_open, open_failed
from .stores import (
    KeyValueStore,
    RocksDBMemory,
    StoreKind,
    UnopenedStore,
    moved_away,
    open_store,
)

log = logging.getLogger("streamassign.runtime")

#: Threads opening and closing stores, per process (more would only contend for the disk).
STORE_THREADS = 4

#: Seconds ``stop()`` waits for every store's close together (``TaskStores.close_all``).
STORES_CLOSE_TIMEOUT = CLOSE_TIMEOUT


@attrs.define(eq=False)
class Opening:
    """The open under way of one task's stores (``TaskStores.opening``)."""

    #: The stores handed out (placeholders until open).
    states: dict[str, StoreState]
    #: Whether a failed open is tried again: while the stores are a standby's (or parked).
    retry: bool
    task: asyncio.Task[None] | None = None
    #: Waiting between two attempts (nothing is open then).
    waiting: bool = False
    #: Why the last attempt failed (None: none failed yet, or the stores are open).
    error: BaseException | None = None
    #: Cuts a wait between attempts short (an active took the stores: it tries at once).
    wake: asyncio.Event = attrs.field(factory=asyncio.Event)


class TaskStores:
    """The stores of every task on this process that is neither active nor standby now."""

    def __init__(
        self,
        topology: Topology,
        store_kind: StoreKind,
        state: StateDirectory,
        standbys: Standbys,
        rocksdb_memory: RocksDBMemory | None = None,
    ) -> None:
        self.topology = topology
        self.store_kind = store_kind
        self.state = state
        self.standbys = standbys
        #: The bound every RocksDB store of the process shares (the App's; None: each store
        #: has only its own bounded memtables).
        self.rocksdb_memory = rocksdb_memory
        #: Opens one store (kind, path); tests put a slow one here.
        self.open_store: Callable[[StoreKind, Path], KeyValueStore] = self._open_store
        #: Whether stores open in a thread (all but in-memory ones, which are a dict).
        self.open_in_thread = store_kind != "memory"
        #: Seconds between two attempts to open a standby's stores: the first, the longest.
        self.retry_delays = (1.0, 30.0)
        #: Stores of tasks that left an active or standby role during the current rebalance
        #: (with that role), so another consumer of this process can take them without restoring.
        self.parked: dict[TaskId, tuple[dict[str, StoreState], str]] = {}
        #: Stores closing in a thread, by task (opened again only once closed).
        self.closing: dict[TaskId, asyncio.Future[None]] = {}
        #: Stores opening in a thread, by task.
        self.opening: dict[TaskId, Opening] = {}
        #: When each task's stores last finished closing (``time.monotonic()``): the task's
        #: local state is unused since then, unless it was opened again.
        self.closed_at: dict[TaskId, float] = {}
        self._checkpointed: dict[TaskId, dict[TopicPartition, int]] = {}
        #: The cause each task's checkpoint writes fail with (until one is written again).
        self._failed_writes: dict[TaskId, Repeats] = {}
        #: Entries of each task's checkpoint this topology's stores do not write (another
        #: topology version's), read at its first write: every write keeps them.
        self._others: dict[TaskId, dict[TopicPartition, int]] = {}
        #: Tasks whose stores were found moved away from their directory (logged once each).
        self._moved: set[TaskId] = set()
        self._executor: ThreadPoolExecutor | None = None
        #: Seconds ``close_all`` waits (tests make it short).
        self.close_timeout = STORES_CLOSE_TIMEOUT
        #: Set when ``close_all`` gave up waiting: a store not yet closing is then left open.
        self._cut = threading.Event()
        #: Stores left open by the cut, held (never closed, never freed) to the process's exit.
        self._left_open: list[tuple[TaskId, str, KeyValueStore]] = []

    def _open_store(self, kind: StoreKind, path: Path) -> KeyValueStore:
        return open_store(kind, path, self.rocksdb_memory)

    @property
    def failing(self) -> dict[TaskId, BaseException]:
        """Tasks whose stores failed to open and are tried again (standbys), with why."""
        return {t: o.error for t, o in self.opening.items() if o.error is not None}

    def _in_thread(self, work: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run ``work`` in a store thread (started on first use, ended by ``shutdown``)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(STORE_THREADS, "streamassign-stores")
        return asyncio.get_running_loop().run_in_executor(self._executor, work, *args)

    def shutdown(self) -> None:
        """End the store threads once idle (``App.stop``, after every close). After a cut
        (``close_all``) the closes still queued are not cancelled: each runs, at once, and
        leaves its stores open (a cancelled one would drop them, and freeing an open
        RocksDB store closes it, holding the interpreter's lock: a second each on a full
        disk)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=not self._cut.is_set())
            self._executor = None

    async def close_all(self, closes: Iterable[Awaitable[None]]) -> None:
        """Wait for ``closes`` and every close under way, together at most ``close_timeout``
        (``stop()``): on a full disk each RocksDB close takes about 1 s (RocksDB's error
        recovery; the closes of a process run one after the other inside RocksDB, whatever
        the threads), so 100 stores took 100 s. Past it, the stores whose close has not begun
        are left open to the process's exit, as a crash leaves them, with one warning naming
        their tasks: their checkpoints claim no more than they hold (written before the
        close, from what their writes stored), and RocksDB replays its log at the next open.
        The (at most ``STORE_THREADS``) closes already running end before the process exits
        (the store threads are joined at exit). An exception a close raised is raised."""
        waited = [*map(asyncio.ensure_future, closes), *self.closing.values()]
        if not waited:
            return
        done, pending = await asyncio.wait(waited, timeout=self.close_timeout)
        if pending:
            self._cut.set()
            left = sorted(t for t, closing in self.closing.items() if closing in pending)
            threading.Thread(
                target=_hold, args=(self._left_open,), name="streamassign-unclosed", daemon=True
            ).start()
            log.warning(
                "closing the stores of %d task(s) (%s) did not end within %g s (a full or failing"
                " disk?): those not closing yet are left open to the process's exit, unclosed as"
                " after a crash (their checkpoints hold; RocksDB replays its log at restart)",
                len(left) or len(pending),
                ", ".join(map(str, left)) or "-",
                self.close_timeout,
            )
        for closed in done:
            error = None if closed.cancelled() else closed.exception()
            if error is not None:
                raise error

    def open(self, task: TaskId) -> dict[str, StoreState]:
        """The task's stores, opened in the calling thread. If one fails, those already open
        are closed before the error is raised (a RocksDB store holds its directory's lock
        until closed: the next open would fail on it)."""
        states: dict[str, StoreState] = {}
        stores: list[tuple[str, KeyValueStore]] = []
        changelogs = self._changelogs(task)
        if changelogs and self.store_kind != "memory":
            self._task_directory(task)
        try:
            for name, changelog in changelogs.items():
                path = self.state.task_dir(task) / f"{name}.rocksdb"
                stores.append((name, self._open_or_set_aside(task, name, path)))
                try:
                    states[name] = StoreState.open(name, changelog, stores[-1][1])
                except StoreIOError:  # reading its position found a damaged block (marked):
                    _close_in_thread(task, [stores.pop()])  # opened again, so set aside
                    stores.append((name, self._open_or_set_aside(task, name, path)))
                    states[name] = StoreState.open(name, changelog, stores[-1][1])
        except BaseException:
            _close_in_thread(task, stores)
            raise
        return states

    def _task_directory(self, task: TaskId) -> None:
        """Make ``task``'s directory for its stores; something else in its place (a file, a
        link to nothing, a loop of links) is set aside (``StateDirectory.task_directory``).
        ``StoreIOError`` naming it if it cannot be made (no permission, an I/O error)."""
        try:
            self.state.task_directory(task)
        except OSError as exc:
            raise StoreIOError(
                f"task {task}: its directory {self.state.task_dir(task)} cannot be made: "
                f"{exc.strerror or exc}"
            ) from exc

    def _open_or_set_aside(self, task: TaskId, name: str, path: Path) -> KeyValueStore:
        """Open one store; if its files are damaged, set them aside (never deleted) and open
        an empty store instead: its position is 0, so the state updater restores it from its
        changelog (every store has one), as on a process that never held the task."""
        try:
            return self.open_store(self.store_kind, path)
        except DamagedStateError as damage:
            try:
                aside = self.state.set_aside(path)
            except OSError as exc:
                raise DamagedStateError(f"{damage}; cannot move it aside: {exc}") from damage
            log.error(
                "task %s: store %s is damaged (%s); moved to %s, restoring it from its changelog",
                task,
                name,
                damage.__cause__ or damage,
                aside,
            )
        return self.open_store(self.store_kind, path)

    async def start_over(self, task: TaskId, state: StoreState) -> Path | None:
        """Set ``state``'s store aside (never deleted; None when it has no files: in memory)
        and put an empty one in its place, so a restore reads its changelog from the start:
        the store is past its changelog's end (the topic truncated or recreated).

        The swap runs on the event loop, not in a store thread: with no await between taking
        the old store and putting the new one in place, a rebalance can neither close the
        old store meanwhile (closing it twice) nor miss the new one (left open, its lock
        held, so the task's next open here fails). A rare recovery: a short stall is fine."""
        path = self.state.task_dir(task) / f"{state.name}.rocksdb"
        _close_in_thread(task, [(state.name, state.store)])  # (here: this thread) errors logged
        try:
            aside = self.state.set_aside(path) if path.exists() else None
            store = self.open_store(self.store_kind, path)
        except (OSError, StreamAssignError) as exc:
            raise StoreIOError(
                f"task {task}: store {state.name} is past its changelog's end and cannot be "
                f"set aside and started over: {exc}"
            ) from exc
        state.drop_unclosed()
        state.store, state.position, state.applied = store, 0, {}
        state.end = state.overwritten = None
        return aside

    def _changelogs(self, task: TaskId) -> dict[str, TopicPartition]:
        stores = self.topology.subtopology(task.subtopology).stores
        return {n: TopicPartition(self.topology.changelog_topic(n), task.partition) for n in stores}

    async def take(
        self, task: TaskId, *, standby: bool = False
    ) -> tuple[dict[str, StoreState], str]:
        """The task's stores, for an active (or a ``standby``): kept from a moment ago, a
        standby's, or from disk (returned at once, opening in a thread: see the module
        docstring). A stateless task's are returned at once."""
        if task in self.parked:
            states, how = self.parked.pop(task)
            if not open_failed(states):
                return self._for_role(task, states, standby), how
            self.close(task, states)  # an active's failed open: opened again below
        else:
            found = await self.standbys.take(task)
            if found is not None:
                return self._for_role(task, found, standby), "standby"
        if not self.open_in_thread or not self._changelogs(task):
            return self.open(task), "open"
        return self._open_later(task, standby), "open"

    def _for_role(
        self, task: TaskId, states: dict[str, StoreState], standby: bool
    ) -> dict[str, StoreState]:
        """``states`` go to a new role: a failed open of a standby's is tried again, an
        active's stops the application (and it tries again at once, not after a wait)."""
        opening = self.opening.get(task)
        if opening is not None and opening.states is states:
            opening.retry = standby
            if not standby:
                opening.wake.set()
        return states

    def _open_later(self, task: TaskId, standby: bool) -> dict[str, StoreState]:
        """Placeholders for ``task``'s stores, replaced by the real ones in a thread. Their
        positions are the checkpoint's until then (what ``source_of`` reports until the
        state updater knows better)."""
        checkpoint = self.state.read_checkpoint(task)
        # Kept for the first write (``_other_versions``), which need not read it again. Not
        # when empty: that may be a read that failed now, which the first write tries again.
        if checkpoint:
            self._others[task] = self._not_own(task, checkpoint)
        else:
            self._others.pop(task, None)
        states = {
            name: StoreState(
                name,
                changelog,
                UnopenedStore(True, checkpointed=changelog in checkpoint),
                checkpoint.get(changelog, 0),
            )
            for name, changelog in self._changelogs(task).items()
        }
        opening = Opening(states, retry=standby)
        # The close under way now (not one requested later, which waits for this open).
        closing = self.closing.get(task)
        opening.task = asyncio.create_task(self._open_in_thread(task, opening, closing))
        self.opening[task] = opening

        def forget(done: asyncio.Task[None]) -> None:
            if task in self.opening and self.opening[task].task is done:
                del self.opening[task]

        opening.task.add_done_callback(forget)
        return states

    async def _open_in_thread(
        self, task: TaskId, opening: Opening, closing: asyncio.Future[None] | None
    ) -> None:
        opened: dict[str, StoreState] = {}
        try:
            if closing is not None:  # left a moment ago: its files are ours once closed
                await asyncio.wait([closing])
            try:
                opened = await self._open_retrying(task, opening)
            except Exception as exc:  # raised (and logged) where the stores are used
                log.debug("task %s: opening its stores failed (%r)", task, exc)
                _mark_failed(opening.states, exc)
            async with self.standbys.lock:  # the state updater reads positions under it
                for name, real in opened.items():
                    state = opening.states[name]
                    state.store, state.position, state.applied = (
                        real.store,
                        real.position,
                        real.applied,
                    )
                opened = {}  # handed over: whoever holds the task's stores closes them
                self.standbys.dirty = True  # a restore waiting for these stores plans again
        except asyncio.CancelledError:
            _mark_failed(opening.states, StoreNotOpenError("the open was cancelled"))
            if opened:  # opened, not handed over yet
                self._in_thread(self._close_unless_cut, task, _stores_of(opened))
            raise
        await self.standbys.opened(task, opening.states)

    async def _open_retrying(self, task: TaskId, opening: Opening) -> dict[str, StoreState]:
        """Open ``task``'s stores; while they are a standby's, again after each failure."""
        attempt = 0
        while True:
            attempt += 1
            try:
                opened = await self._attempt(task)
            except Exception as exc:
                # The failed attempt's frames keep its stores (closed by now) and locals.
                traceback.clear_frames(exc.__traceback__)
                retried = opening.retry or self.standbys.opening.get(task) is opening.states
                if self._cut.is_set() or not retried:  # (cut: the application stops)
                    raise
                opening.error = exc
                await self._wait_to_retry(task, opening, attempt)
                continue
            if attempt > 1:
                log.info("task %s: its stores opened at attempt %d", task, attempt)
            opening.error = None
            return opened

    async def _wait_to_retry(self, task: TaskId, opening: Opening, attempt: int) -> None:
        first, longest = self.retry_delays
        delay = min(first * 2 ** (attempt - 1), longest)
        if attempt == 1:  # logged once: the next attempts go on quietly (``failing``)
            log.error(
                "standby %s: opening its stores failed; trying again (every %g s at most)",
                task,
                longest,
                exc_info=opening.error,
            )
        else:
            log.debug("standby %s: attempt %d to open its stores failed", task, attempt)
        opening.wake.clear()
        opening.waiting = True
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(opening.wake.wait(), delay)
        finally:
            opening.waiting = False

    async def _attempt(self, task: TaskId) -> dict[str, StoreState]:
        """One open of ``task``'s stores in a store thread. Cancelled while the thread opens,
        the thread closes what it opened (nobody would; past the cut it holds them)."""
        handover = _Handover(self._close_unless_cut)
        try:
            opened: dict[str, StoreState] = await self._in_thread(
                handover.run, self._open_unless_cut, task
            )
        except asyncio.CancelledError:
            delivered = handover.abandon()
            if delivered:  # the thread returned them just before the cancel
                self._in_thread(self._close_unless_cut, task, _stores_of(delivered))
            raise
        return opened

    def checkpoint(
        self, task: TaskId, states: Mapping[str, StoreState], *, durable: bool = True
    ) -> None:
        if not is_open(states):  # still opening: the checkpoint on disk is still right
            return
        offsets = {s.changelog: s.position for s in states.values()}
        if offsets and self._checkpointed.get(task) != offsets:
            try:
                if self._moved_away(task, states):
                    return
                others = self._other_versions(task)
                self.state.write_checkpoint(task, {**others, **offsets}, durable=durable)
            except OSError as exc:
                self._cannot_checkpoint(task, exc)
                return
            self._checkpointed[task] = offsets
            if self._failed_writes.pop(task, None) is not None:
                log.info("task %s: its checkpoint is written again", task)

    def _cannot_checkpoint(self, task: TaskId, exc: OSError) -> None:
        """Log a failed checkpoint write (too many open files, a full disk) at WARNING once
        per task and cause, the same cause again at DEBUG: it is tried at every commit (1 s)."""
        cause = exc.strerror or type(exc).__name__  # not the message: it names a temporary
        news = self._failed_writes.setdefault(task, Repeats()).changed(cause)
        log.log(
            logging.WARNING if news else logging.DEBUG,
            "cannot checkpoint task %s: %s (tried again at each commit; the same cause again "
            "logged at DEBUG, and one line once it is written again)",
            task,
            exc,
        )

    def _other_versions(self, task: TaskId) -> dict[TopicPartition, int]:
        """The entries of ``task``'s checkpoint on disk for changelogs that are not its stores'
        in this topology: another topology version's (an upgrade removed the store, or
        renumbered its subtopology), whose store files stay in the task's directory untouched
        while this version runs the task. Kept, they stay true, so a rollback to that version
        reports that state (the host of this version leaves them out of its sums). Read once
        per take (or taken from the read of ``_open_later``): nothing else writes the
        checkpoint while this process holds the directory. ``OSError`` when it cannot be
        read now (too many open files): this write is skipped, not written without them."""
        others = self._others.get(task)
        if others is None:
            others = self._not_own(task, self.state.read_checkpoint_or_raise(task))
            self._others[task] = others
        return others

    def _not_own(
        self, task: TaskId, checkpoint: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """The entries of ``checkpoint`` for changelogs that are not ``task``'s stores'."""
        own = {tp.topic for tp in self._changelogs(task).values()}
        return {tp: offset for tp, offset in checkpoint.items() if tp.topic not in own}

    def _moved_away(self, task: TaskId, states: Mapping[str, StoreState]) -> bool:
        """Whether a store of ``task`` no longer lives at its path (its directory, or
        ``tasks/``, was renamed or deleted under the open store). Its checkpoint is then not
        written: the task's directory there (made again by the write) would hold a
        checkpoint and none of the state, and after a restart the process would report itself
        caught up on a task it restores from scratch. The checkpoint written there before
        (when only the store's own directory went) is deleted for the same reason. Once per
        task, with one log line."""
        moved = sorted(name for name, state in states.items() if moved_away(state.store))
        if not moved:
            self._moved.discard(task)
        elif task not in self._moved:
            self.state.delete_checkpoint(task)  # raises: tried again at the next checkpoint
            self._checkpointed.pop(task, None)
            self._others.pop(task, None)  # deleted with it: read again (none) at the next
            self._moved.add(task)
            log.error(
                "task %s: store(s) %s no longer in %s (moved or deleted under the open store); "
                "its checkpoint there deleted, and none written, where none of its state is",
                task,
                ", ".join(moved),
                self.state.task_dir(task),
            )
        return bool(moved)

    def close(self, task: TaskId, states: Mapping[str, StoreState]) -> asyncio.Future[None]:
        """Close a task's stores; a persistent store keeps its checkpoint (sticky restarts),
        an in-memory one loses it with its content. The stores close in a thread, once their
        open (if under way) is done; opening the task's stores again waits for it."""
        opening = self.opening.get(task)
        opened = None
        if opening is not None and opening.states is states and opening.task is not None:
            opened = None if opening.task.done() else opening.task
        if opened is not None and opening is not None:
            opening.retry = False
            if opening.waiting:  # between two attempts: nothing to wait for
                opened.cancel()
        persistent = False
        for state in states.values():
            persistent = state.store.persistent
            state.drop_unclosed()
        try:
            if not persistent:
                self.state.delete_checkpoint(task)
                self._checkpointed.pop(task, None)
            elif opened is None:  # else nothing was applied: the checkpoint is still right
                self.checkpoint(task, states)
        except Exception:  # the stores still close below
            log.exception("task %s: checkpoint on close failed", task)
        # Another version's entries are read again at the next take: the task's directory
        # may be deleted (from outside, or by the cleanup) before it comes back here. After
        # the close's own write, which reads them (and keeps them) when not cached.
        self._others.pop(task, None)
        closing = asyncio.ensure_future(self._close_stores(task, [*states.values()], opened))
        self.closing[task] = closing

        def forget(done: asyncio.Future[None]) -> None:
            self.closed_at[task] = time.monotonic()
            if self.closing.get(task) is done:
                del self.closing[task]

        closing.add_done_callback(forget)
        return closing

    def forget_removed(self, task: TaskId) -> None:
        """``task``'s local state was deleted: what this remembers of it is void (a checkpoint
        equal to the last one written must be written again, into the new directory)."""
        self._checkpointed.pop(task, None)
        self._failed_writes.pop(task, None)
        self._others.pop(task, None)
        self.closed_at.pop(task, None)

    def close_parked(self) -> list[asyncio.Future[None]]:
        """Close what no consumer of this process took in the rebalance that just ended."""
        closes = []
        for task_id, (states, _) in sorted(self.parked.items()):
            closes.append(self.close(task_id, states))
            log.info("task %s closed (no longer on this process)", task_id)
        self.parked.clear()
        return closes

    async def _close_stores(
        self, task: TaskId, states: Iterable[StoreState], opened: asyncio.Task[None] | None
    ) -> None:
        if opened is not None:  # close the real stores, not their placeholders
            await asyncio.wait([opened])
        # Shielded: cancelled (``asyncio.run`` cancels what is left when ``run()`` returns),
        # a close still queued would never run, and its stores would be freed (closing them
        # on the freeing thread, holding the interpreter's lock).
        await asyncio.shield(self._in_thread(self._close_unless_cut, task, _stores_of(states)))

    def _open_unless_cut(self, task: TaskId) -> dict[str, StoreState]:
        """In a store thread: ``open``, unless ``close_all`` gave up waiting (the application
        stops). The store threads' queue is kept at that cut (``shutdown``), opens queued
        in it too: nobody would use their stores, and each would be closed again, by a
        thread the process's exit waits for (a second per store on a full disk)."""
        if self._cut.is_set():
            raise StoreNotOpenError(f"task {task}: not opened, the application is stopping")
        return self.open(task)

    def _close_unless_cut(self, task: TaskId, stores: list[tuple[str, KeyValueStore]]) -> None:
        """In a store thread: close ``stores`` one by one, or, once ``close_all`` gave up
        waiting, hold those left (``_left_open``) instead of closing them."""
        for index, (name, store) in enumerate(stores):
            if self._cut.is_set():
                self._left_open.extend((task, n, s) for n, s in stores[index:])
                return
            _close_in_thread(task, [(name, store)])


def _hold(stores: list[tuple[TaskId, str, KeyValueStore]]) -> None:
    """Keep ``stores`` referenced until the process exits (a daemon thread: it does not keep
    the process alive). Freed, an open RocksDB store would close, holding the interpreter's
    lock for the close's second; closed in a daemon thread, its close could still run while
    the process exits, which aborted the process in a test (RocksDB's teardown under it)."""
    threading.Event().wait()


class _Handover:
    """Hands the stores a thread opened to the event loop, or, if the loop gave up waiting
    for them (cancelled), has the thread close them (hold them, past ``stop()``'s cut)."""

    def __init__(self, close: Callable[[TaskId, list[tuple[str, KeyValueStore]]], None]) -> None:
        self._close = close  # in the thread: closes abandoned stores, or holds them past a cut
        self._lock = threading.Lock()
        self._abandoned = False
        self._delivered: dict[str, StoreState] | None = None

    def run(
        self, open_stores: Callable[[TaskId], dict[str, StoreState]], task: TaskId
    ) -> dict[str, StoreState]:
        states = open_stores(task)
        with self._lock:
            if not self._abandoned:
                self._delivered = states
                return states
        self._close(task, _stores_of(states))
        return {}

    def abandon(self) -> dict[str, StoreState] | None:
        """Nobody takes the stores any more: those delivered already (for the caller to
        close); the thread closes any it opens from now on."""
        with self._lock:
            self._abandoned = True
            return self._delivered


def start_of(states: Mapping[str, StoreState]) -> str:
    """The changelog offsets ``states`` start from, for logs (a checkpoint's, while opening:
    the state updater logs the real ones once open)."""
    offsets = ",".join(str(s.position) for s in states.values())
    if is_open(states):
        return offsets
    # No checkpoint read (none, damaged, or unreadable now: logged just before): a position
    # of 0 is then no checkpoint's.
    read = any(isinstance(s.store, UnopenedStore) and s.store.checkpointed for s in states.values())
    source = "per its checkpoint" if read else "without a checkpoint"
    return f"{offsets} {source}; its stores opening"


def _mark_failed(states: Mapping[str, StoreState], error: BaseException) -> None:
    for state in states.values():
        if isinstance(state.store, UnopenedStore):
            state.store.error = error


def _stores_of(
    states: Iterable[StoreState] | Mapping[str, StoreState],
) -> list[tuple[str, KeyValueStore]]:
    items = states.values() if isinstance(states, Mapping) else states
    return [(s.name, s.store) for s in items]


def _close_in_thread(task: TaskId, stores: Iterable[tuple[str, KeyValueStore]]) -> None:
    for name, store in stores:
        try:
            store.close()
        except StoreIOError as exc:  # the disk's fault (full, failing): one line, no traceback
            log.error("task %s: closing store %s failed: %s", task, name, exc)
        except Exception:  # one store failing to close must not leak the others
            log.exception("task %s: closing store %s failed", task, name)
