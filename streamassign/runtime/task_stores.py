"""Opening, handing over, checkpointing and closing the stores of tasks on one process.

A task's stores come from one of three places (``take``): kept from a moment ago (the task
left a role during the current rebalance: ``parked``), a standby of this process, or disk.
Opening and closing persistent stores run in threads: opening or closing a large RocksDB store
takes seconds (a flush, a WAL replay), which on the event loop would stall heartbeats and every
consumer. No rebalance callback waits for them either: ``take`` hands out the task's stores at
once, each a placeholder (``UnopenedStore``) until its thread has opened it (after the task's
earlier close, if one is under way). The task is restoring meanwhile, its input paused, and the
state updater starts reading its changelog once its stores are open (``check_open``); a
standby's stores are read once open (``Standbys.opened``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from .. import TaskId, TopicPartition
from ..localstate import StateDirectory
from ..topology import Topology
from .changelog import StoreState
from .standbys import Standbys, is_open
from .stores import KeyValueStore, StoreKind, UnopenedStore, open_store

log = logging.getLogger("streamassign.runtime")


class TaskStores:
    """The stores of every task on this process that is neither active nor standby now."""

    def __init__(
        self, topology: Topology, store_kind: StoreKind, state: StateDirectory, standbys: Standbys
    ) -> None:
        self.topology = topology
        self.store_kind = store_kind
        self.state = state
        self.standbys = standbys
        #: Opens one store (kind, path); tests put a slow one here.
        self.open_store: Callable[[StoreKind, Path], KeyValueStore] = open_store
        #: Whether stores open in a thread (all but in-memory ones, which are a dict).
        self.open_in_thread = store_kind != "memory"
        #: Stores of tasks that left an active or standby role during the current rebalance
        #: (with that role), so another consumer of this process can take them without restoring.
        self.parked: dict[TaskId, tuple[dict[str, StoreState], str]] = {}
        #: Stores closing in a thread, by task (opened again only once closed).
        self.closing: dict[TaskId, asyncio.Future[None]] = {}
        #: Stores opening in a thread, by task: the stores handed out, and the open.
        self.opening: dict[TaskId, tuple[dict[str, StoreState], asyncio.Task[None]]] = {}
        self._checkpointed: dict[TaskId, dict[TopicPartition, int]] = {}

    def open(self, task: TaskId) -> dict[str, StoreState]:
        """The task's stores, opened in the calling thread."""
        states = {}
        for name, changelog in self._changelogs(task).items():
            path = self.state.task_dir(task) / f"{name}.rocksdb"
            states[name] = StoreState.open(name, changelog, self.open_store(self.store_kind, path))
        return states

    def _changelogs(self, task: TaskId) -> dict[str, TopicPartition]:
        stores = self.topology.subtopology(task.subtopology).stores
        return {n: TopicPartition(self.topology.changelog_topic(n), task.partition) for n in stores}

    async def take(self, task: TaskId) -> tuple[dict[str, StoreState], str]:
        """The task's stores: kept from a moment ago, a standby's, or from disk (returned at
        once, opening in a thread: see the module docstring)."""
        if task in self.parked:
            return self.parked.pop(task)
        standby = await self.standbys.take(task)
        if standby is not None:
            return standby, "standby"
        if not self.open_in_thread:
            return self.open(task), "open"
        return self._open_later(task), "open"

    def _open_later(self, task: TaskId) -> dict[str, StoreState]:
        """Placeholders for ``task``'s stores, replaced by the real ones in a thread. Their
        positions are the checkpoint's until then (what the logs and ``source_of`` report)."""
        checkpoint = self.state.read_checkpoint(task)
        states = {
            name: StoreState(name, changelog, UnopenedStore(True), checkpoint.get(changelog, 0))
            for name, changelog in self._changelogs(task).items()
        }
        # The close under way now (not one requested later, which waits for this open).
        closing = self.closing.get(task)
        opening = asyncio.create_task(self._open_in_thread(task, states, closing))
        self.opening[task] = (states, opening)

        def forget(done: asyncio.Task[None]) -> None:
            if self.opening.get(task, (None, None))[1] is done:
                del self.opening[task]

        opening.add_done_callback(forget)
        return states

    async def _open_in_thread(
        self, task: TaskId, states: dict[str, StoreState], closing: asyncio.Future[None] | None
    ) -> None:
        if closing is not None:  # left a moment ago: its files are ours once closed
            await asyncio.wait([closing])
        opened: dict[str, StoreState] = {}
        failure: Exception | None = None
        try:
            opened = await asyncio.to_thread(self.open, task)
        except Exception as exc:  # raised where the stores are used (``check_open``)
            log.exception("task %s: opening its stores failed", task)
            failure = exc
        async with self.standbys.lock:  # the state updater reads positions under it
            for name, state in states.items():
                real = opened.get(name)
                if real is None:
                    assert isinstance(state.store, UnopenedStore)
                    state.store.error = failure
                else:
                    state.store, state.position, state.applied = (
                        real.store,
                        real.position,
                        real.applied,
                    )
            self.standbys.dirty = True  # a restore waiting for these stores plans again
        await self.standbys.opened(task, states)

    def checkpoint(
        self, task: TaskId, states: Mapping[str, StoreState], *, durable: bool = True
    ) -> None:
        if not is_open(states):  # still opening: the checkpoint on disk is still right
            return
        offsets = {s.changelog: s.position for s in states.values()}
        if offsets and self._checkpointed.get(task) != offsets:
            try:
                self.state.write_checkpoint(task, offsets, durable=durable)
                self._checkpointed[task] = offsets
            except OSError as exc:
                log.warning("cannot checkpoint task %s: %s", task, exc)

    def close(self, task: TaskId, states: Mapping[str, StoreState]) -> asyncio.Future[None]:
        """Close a task's stores; a persistent store keeps its checkpoint (sticky restarts),
        an in-memory one loses it with its content. The stores close in a thread, once their
        open (if under way) is done; opening the task's stores again waits for it."""
        opening = self.opening.get(task)
        opened = None
        if opening is not None and opening[0] is states and not opening[1].done():
            opened = opening[1]
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
        closing = asyncio.ensure_future(_close_stores(task, [*states.values()], opened))
        self.closing[task] = closing

        def forget(done: asyncio.Future[None]) -> None:
            if self.closing.get(task) is done:
                del self.closing[task]

        closing.add_done_callback(forget)
        return closing

    def close_parked(self) -> list[asyncio.Future[None]]:
        """Close what no consumer of this process took in the rebalance that just ended."""
        closes = []
        for task_id, (states, _) in sorted(self.parked.items()):
            closes.append(self.close(task_id, states))
            log.info("task %s closed (no longer on this process)", task_id)
        self.parked.clear()
        return closes


async def _close_stores(
    task: TaskId, states: Sequence[StoreState], opened: asyncio.Task[None] | None
) -> None:
    if opened is not None:  # close the real stores, not their placeholders
        await asyncio.wait([opened])
    await asyncio.to_thread(_close_in_thread, task, states)


def _close_in_thread(task: TaskId, states: Sequence[StoreState]) -> None:
    for state in states:
        try:
            state.store.close()
        except Exception:  # one store failing to close must not leak the others
            log.exception("task %s: closing store %s failed", task, state.name)
