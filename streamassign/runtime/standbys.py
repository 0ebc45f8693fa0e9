"""Standby (and warmup) stores of one process, kept up to date from their changelogs.

The state updater (``restore.py``) reads the changelogs of every standby from its position
and applies committed writes; the stores are checkpointed every commit interval so the host
reports how far they are. A standby may move between consumers of the
process (``owner``), and may be wanted by a consumer while another one still runs it as an
active (``wanted``): their callbacks run in any order. A standby whose stores are still
opening in a thread (``TaskStores.take``) waits in ``opening`` (also while its open is tried
again after a failure): the state updater and queries see it in ``states`` once it is open.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from .. import TaskId
from ..errors import StoreNotOpenError
from .changelog import StoreState
from .stores import UnopenedStore

log = logging.getLogger("streamassign.runtime")


def is_open(states: Mapping[str, StoreState]) -> bool:
    """Whether every store of a task is open (False while one opens in a thread, or when its
    open failed)."""
    return not any(isinstance(s.store, UnopenedStore) for s in states.values())


def check_open(states: Mapping[str, StoreState]) -> bool:
    """``is_open``, raising ``StoreNotOpenError`` if a store's open failed."""
    for state in states.values():
        if isinstance(state.store, UnopenedStore) and state.store.error is not None:
            raise StoreNotOpenError(
                f"store {state.name} ({state.changelog.topic}[{state.changelog.partition}]) "
                f"cannot be opened: {state.store.error!r}"
            ) from state.store.error
    return is_open(states)


def open_failed(states: Mapping[str, StoreState]) -> bool:
    return any(
        isinstance(s.store, UnopenedStore) and s.store.error is not None for s in states.values()
    )


class Standbys:
    """The standby stores of this process, by task."""

    def __init__(self) -> None:
        self.states: dict[TaskId, dict[str, StoreState]] = {}
        #: Standbys whose stores are still opening in a thread (moved to ``states`` once open).
        self.opening: dict[TaskId, dict[str, StoreState]] = {}
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
            if open_failed(states):  # an active's open failed (that stops the application)
                log.warning("standby %s not kept: its stores failed to open", task)
                return
            if is_open(states):
                self.states[task] = states
                self.dirty = True
            else:
                self.opening[task] = states
            self.owner[task] = consumer

    async def opened(self, task: TaskId, states: dict[str, StoreState]) -> None:
        """``task``'s stores finished opening: a standby waiting for them is read from now
        on. (A standby's failed open is tried again, by ``TaskStores``, until it opens.)"""
        async with self.lock:
            if self.opening.get(task) is not states or not is_open(states):
                return  # not a standby (an active's), or taken or removed meanwhile
            del self.opening[task]
            self.states[task] = states
            self.dirty = True

    async def take(self, task: TaskId) -> dict[str, StoreState] | None:
        """Remove ``task``'s standby and return its stores (to run it as an active here);
        they may still be opening."""
        async with self.lock:
            if task in self.opening:
                self.owner.pop(task, None)
                return self.opening.pop(task)
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
            if task in self.opening:
                return self.opening.pop(task)
            states = self.states.pop(task, None)
            self.dirty = True
        return states

    def clear(self) -> list[tuple[TaskId, dict[str, StoreState]]]:
        """Forget every standby (shutdown); returns them to close."""
        out = [*self.states.items(), *self.opening.items()]
        self.states.clear()
        self.opening.clear()
        self.owner.clear()
        return out
