"""Opening, handing over, checkpointing and closing the stores of tasks on one process.

A task's stores come from one of three places (``take``): kept from a moment ago (the task
left a role during the current rebalance: ``parked``), a standby of this process, or disk.
Closing runs in a thread (closing a large RocksDB store flushes it: seconds, which on the event
loop would stall heartbeats and every consumer); opening a task again waits for its close.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

from .. import TaskId, TopicPartition
from ..localstate import StateDirectory
from ..topology import Topology
from .changelog import StoreState
from .standbys import Standbys
from .stores import StoreKind, open_store

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
        #: Stores of tasks that left an active or standby role during the current rebalance
        #: (with that role), so another consumer of this process can take them without restoring.
        self.parked: dict[TaskId, tuple[dict[str, StoreState], str]] = {}
        #: Stores closing in a thread, by task (opened again only once closed).
        self.closing: dict[TaskId, asyncio.Future[None]] = {}
        self._checkpointed: dict[TaskId, dict[TopicPartition, int]] = {}

    def open(self, task: TaskId) -> dict[str, StoreState]:
        stores = self.topology.subtopology(task.subtopology).stores
        states = {}
        for name in stores:
            changelog = TopicPartition(self.topology.changelog_topic(name), task.partition)
            path = self.state.task_dir(task) / f"{name}.rocksdb"
            states[name] = StoreState.open(name, changelog, open_store(self.store_kind, path))
        return states

    async def take(self, task: TaskId) -> tuple[dict[str, StoreState], str]:
        """The task's stores: kept from a moment ago, a standby's, or opened from disk."""
        if task in self.parked:
            return self.parked.pop(task)
        standby = await self.standbys.take(task)
        if standby is not None:
            return standby, "standby"
        closing = self.closing.get(task)
        if closing is not None:  # left a moment ago: its files are ours once closed
            await asyncio.wait([closing])
        return self.open(task), "open"

    def checkpoint(
        self, task: TaskId, states: Mapping[str, StoreState], *, durable: bool = True
    ) -> None:
        offsets = {s.changelog: s.position for s in states.values()}
        if offsets and self._checkpointed.get(task) != offsets:
            try:
                self.state.write_checkpoint(task, offsets, durable=durable)
                self._checkpointed[task] = offsets
            except OSError as exc:
                log.warning("cannot checkpoint task %s: %s", task, exc)

    def close(self, task: TaskId, states: Mapping[str, StoreState]) -> asyncio.Future[None]:
        """Close a task's stores; a persistent store keeps its checkpoint (sticky restarts),
        an in-memory one loses it with its content. The stores close in a thread; opening
        the task's stores again waits for it (``take``)."""
        persistent = False
        for state in states.values():
            persistent = state.store.persistent
            state.drop_unclosed()
        try:
            if persistent:
                self.checkpoint(task, states)
            else:
                self.state.delete_checkpoint(task)
                self._checkpointed.pop(task, None)
        except Exception:  # the stores still close below
            log.exception("task %s: checkpoint on close failed", task)
        closing = asyncio.ensure_future(asyncio.to_thread(_close_stores, task, [*states.values()]))
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


def _close_stores(task: TaskId, states: Sequence[StoreState]) -> None:
    for state in states:
        try:
            state.store.close()
        except Exception:  # one store failing to close must not leak the others
            log.exception("task %s: closing store %s failed", task, state.name)
