"""Standby (and warmup) stores of one process, kept up to date from their changelogs.

One plain consumer (no group) reads the changelogs of every standby from its position
(manual ``assign``) and applies committed writes; the stores are checkpointed every commit
interval so the host reports how far they are. A standby may move between consumers of the
process (``owner``), and may be wanted by a consumer while another one still runs it as an
active (``wanted``): their callbacks run in any order.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiokafka import TopicPartition as KafkaTopicPartition

from .._ids import TaskId
from ._clients import Clients
from .changelog import StoreState

Checkpoint = Callable[[TaskId, Mapping[str, StoreState]], None]


class Standbys:
    """The standby stores of this process, by task, and the loop that reads their changelogs."""

    def __init__(self, clients: Clients, checkpoint: Checkpoint) -> None:
        self.clients = clients
        self.checkpoint = checkpoint
        self.states: dict[TaskId, dict[str, StoreState]] = {}
        #: The consumer each standby belongs to.
        self.owner: dict[TaskId, int] = {}
        #: Standbys of tasks still active here until their consumer revokes them, by consumer.
        self.wanted: dict[TaskId, int] = {}
        self.lock = asyncio.Lock()
        #: The set of standbys changed: the reader reassigns (records in flight are dropped).
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

    async def run(self, stopped: asyncio.Event, interval: Callable[[], float]) -> None:
        """Read the standbys' changelogs until ``stopped``; checkpoint every ``interval()`` s."""
        reader = self.clients.standby_reader
        assert reader is not None
        next_checkpoint = time.monotonic() + interval()
        by_tp: dict[Any, StoreState] = {}
        while not stopped.is_set():
            if not by_tp and not self.dirty:
                await asyncio.sleep(0.1)
                continue
            batch = await reader.getmany(timeout_ms=100) if by_tp else {}
            async with self.lock:
                if self.dirty:  # standbys changed: records in flight are dropped
                    self.dirty = False
                    by_tp = {
                        KafkaTopicPartition(*s.changelog): s
                        for states in self.states.values()
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
                    for task, states in self.states.items():
                        self.checkpoint(task, states)
                    next_checkpoint = time.monotonic() + interval()
