"""Deleting the local state of tasks this process no longer holds (Kafka Streams'
``state.cleanup.delay.ms``).

Without it every task a process ever held keeps its directory (stores and checkpoint) for
good: over rebalances and rolling restarts the disk fills with most tasks' stores, and each
leftover is reported in the subscription as local state (of ever-growing lag). A leftover is
also warm state for a task that comes back soon, so it is kept until the process has not held
the task for ``delay`` seconds.

The application says what it holds (``held_tasks``; None while it cannot tell, with task changes
under way). A check runs in one step of the event loop: it reads what is held and renames
(``StateDirectory.retire_task``) the directory of every other task released long enough,
so no task can open in between; the renamed directories are then deleted in a thread (a large
RocksDB store takes seconds) while processing goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from .. import TaskId
from ..localstate import StateDirectory
from .task_stores import TaskStores

log = logging.getLogger("streamassign.runtime")

#: Seconds between two checks at least, however short the delay: a check lists the task
#: directories and hops to a thread, not worth doing in a busy loop.
MIN_CHECK_INTERVAL = 0.1


class StateCleanup:
    """Removes the state of tasks not held for ``delay_ms``, checking every half of it (so a
    task's state goes between 1 and 1.5 delays after the process last held it; not more often
    than every ``MIN_CHECK_INTERVAL``)."""

    def __init__(
        self,
        state: StateDirectory,
        delay_ms: int,
        held_tasks: Callable[[], frozenset[TaskId] | None],
        stores: TaskStores,
    ) -> None:
        self.state = state
        self.delay_ms = delay_ms
        self.held_tasks = held_tasks
        self.stores = stores
        # Tasks found on disk count as released at start, not (as in Kafka Streams) at their
        # directory's mtime: a process back after a long downtime keeps, for one more delay,
        # the state its first rebalances may hand back to it; and a monotonic clock is immune
        # to wall-clock steps and to directories copied or restored with old times.
        self.started = time.monotonic()
        #: When a check last saw each task held: a task assigned but never opened has no
        #: close, so it counts as let go then (up to half a delay early; its directory was
        #: not used meanwhile).
        self._seen_held: dict[TaskId, float] = {}

    @property
    def delay(self) -> float:
        return self.delay_ms / 1000

    def released_at(self, task: TaskId) -> float:
        """Since when this process has not held ``task`` (as far as it knows)."""
        return max(
            self.started,
            self._seen_held.get(task, self.started),
            self.stores.closed_at.get(task, self.started),
        )

    def retire(self, now: float) -> list[TaskId] | None:
        """Rename the directory of every task not held and released at least ``delay`` before
        ``now``: synchronous, so what is held cannot change meanwhile. Returns those tasks;
        None when the application cannot tell what it holds now."""
        held = self.held_tasks()
        if held is None:
            return None
        for task in held:
            self._seen_held[task] = now
        removed = []
        for task in sorted(self.state.local_tasks() - held):
            idle = now - self.released_at(task)
            if idle < self.delay or self.state.retire_task(task) is None:
                continue
            removed.append(task)
            self.stores.forget_removed(task)
            self._seen_held.pop(task, None)
            log.info(
                "task %s: local state removed (not held here for %.1f s; "
                "state_cleanup_delay_ms=%d)",
                task,
                idle,
                self.delay_ms,
            )
        return removed

    async def run(self, stopped: asyncio.Event) -> None:
        """Check every half delay until ``stopped``. Never fails: a check that fails is
        logged and the next one tries again (the state stays on disk meanwhile)."""
        self.started = time.monotonic()
        await self._delete()  # what a crash left retired, mid-delete
        while not stopped.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopped.wait(), max(self.delay / 2, MIN_CHECK_INTERVAL))
            if stopped.is_set():
                return
            if self._check():  # (also what an earlier delete could not delete)
                await self._delete()

    def _check(self) -> bool:
        """One check; whether it ran (False: not now, or it failed)."""
        try:
            return self.retire(time.monotonic()) is not None
        except Exception:  # a bug here must not stop processing
            log.exception("checking for local state to remove failed; trying again later")
            return False

    async def _delete(self) -> None:
        try:
            await asyncio.to_thread(self.state.delete_retired)
        except Exception:  # (``delete_retired`` logs what it cannot delete)
            log.exception("deleting removed local state failed; trying again later")
