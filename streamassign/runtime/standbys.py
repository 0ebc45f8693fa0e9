"""Standby (and warmup) stores of one process, kept up to date from their changelogs.

The state updater (``restore.py``) reads the changelogs of every standby from its position
and applies committed writes; the stores are checkpointed every commit interval so the host
reports how far they are. A standby may move between consumers of the
process (``owner``), and may be wanted by a consumer while another one still runs it as an
active (``wanted``): their callbacks run in any order.
"""

from __future__ import annotations

import asyncio

from .. import TaskId
from .changelog import StoreState


class Standbys:
    """The standby stores of this process, by task."""

    def __init__(self) -> None:
        self.states: dict[TaskId, dict[str, StoreState]] = {}
        #: The consumer each standby belongs to.
        self.owner: dict[TaskId, int] = {}
        #: Standbys of tasks still active here until their consumer revokes them, by consumer.
        self.wanted: dict[TaskId, int] = {}
        self.lock = asyncio.Lock()
        #: What the state updater reads changed (standbys or restores): it reassigns its
        #: reader (records in flight are dropped). Guarded by ``lock``, as ``states``.
        self.dirty = False

    async def add(self, task: TaskId, states: dict[str, StoreState], consumer: int) -> None:
        async with self.lock:
            self.states[task] = states
            self.owner[task] = consumer
            self.dirty = True

    async def take(self, task: TaskId) -> dict[str, StoreState] | None:
        """Remove ``task``'s standby and return its stores (to run it as an active here)."""
        async with self.lock:
            if task not in self.states:
                return None
            self.dirty = True
            self.owner.pop(task, None)
            return self.states.pop(task)

    async def remove(self, consumer: int, task: TaskId) -> dict[str, StoreState] | None:
        """``consumer`` drops its standby of ``task``: its stores, unless another consumer of
        this process holds the standby by now (then nothing changes)."""
        if self.wanted.get(task) == consumer:
            del self.wanted[task]
        async with self.lock:
            if self.owner.get(task) != consumer:
                return None
            del self.owner[task]
            states = self.states.pop(task, None)
            self.dirty = True
        return states

    def clear(self) -> list[tuple[TaskId, dict[str, StoreState]]]:
        """Forget every standby (shutdown); returns them to close."""
        out = list(self.states.items())
        self.states.clear()
        self.owner.clear()
        return out
