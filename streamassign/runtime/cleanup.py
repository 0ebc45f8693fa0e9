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
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .. import TaskId
from ..localstate import StateDirectory
from .task_stores import TaskStores

log = logging.getLogger("streamassign.runtime")

#: Seconds between two checks at least, however short the delay: a check lists the task
#: directories and hops to a thread, not worth doing in a busy loop.
MIN_CHECK_INTERVAL = 0.1


class StateCleanup:
    """Removes the state of tasks not held for ``delay_ms``, checking every half of it, but
    not more often than every ``MIN_CHECK_INTERVAL``: a task's state goes at least one delay
    after the process last held it, usually within 1.5 (later when checks are skipped during
    rebalances or a long delete holds them up)."""

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
        #: Whether the last delete left something it could not delete (or failed): the next
        #: check deletes again, even if it retires nothing.
        self._delete_again = False
        #: What failed at least once (logged with its traceback then, in one line later).
        self._failures: set[str] = set()

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
            retired = None if idle < self.delay else self.state.retire_task(task)
            if retired is None:
                continue
            removed.append(task)
            self.stores.forget_removed(task)
            self._seen_held.pop(task, None)
            log.info(
                "task %s: local state removed%s (not held here for %.1f s; "
                "state_cleanup_delay_ms=%d)",
                task,
                _link_note(retired),
                idle,
                self.delay_ms,
            )
        return removed

    async def run(self, stopped: asyncio.Event) -> None:
        """Check every half delay until ``stopped``. Never fails: a check that fails is
        logged and the next one tries again (the state stays on disk meanwhile)."""
        self.started = time.monotonic()
        try:
            await self._loop(stopped)
        except Exception:  # a bug: logged here, as nobody awaits the loop's result
            log.exception("the state cleanup stopped; local state of tasks no longer held is kept")

    async def _loop(self, stopped: asyncio.Event) -> None:
        await self._delete()  # what a crash left retired, mid-delete
        while not stopped.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopped.wait(), max(self.delay / 2, MIN_CHECK_INTERVAL))
            if stopped.is_set():
                return
            # Delete only after a check that retired something, or to try again what an
            # earlier delete could not delete: else a delete is a thread hop and a listing.
            if self._check() or self._delete_again:
                await self._delete()

    def _check(self) -> bool:
        """One check; whether it retired any task's directory (False: none, not now, or it
        failed)."""
        try:
            return bool(self.retire(time.monotonic()))
        except Exception as exc:  # a bug here must not stop processing
            self._failed("checking for local state to remove", exc)
            return False

    async def _delete(self) -> None:
        """Delete what is retired, in a daemon thread: neither ``stop`` nor the process's exit
        waits for a large store's delete (it was renamed first, so the next start deletes what
        is left)."""
        try:
            await _in_daemon_thread(self.state.delete_retired)
            self._delete_again = self.state.retired_left
        except Exception as exc:  # (``delete_retired`` logs what it cannot delete)
            self._delete_again = True
            self._failed("deleting removed local state", exc)

    def _failed(self, what: str, exc: Exception) -> None:
        """Log a failed check or delete: with its traceback the first time, then one line (a
        bug failing every check would fill the log with the same traceback)."""
        if what not in self._failures:
            self._failures.add(what)
            log.exception("%s failed; trying again later", what)
        else:
            log.warning("%s failed again (%r); trying again later", what, exc)


def _link_note(retired: Path) -> str:
    """What the log says of a task directory that was a link (state placed on another volume):
    only the link is deleted, never what it points to."""
    if not retired.is_symlink():
        return ""
    try:
        target = os.readlink(retired)
    except OSError:
        target = "?"
    return f" (a link to {target}: link removed, its target kept)"


async def _in_daemon_thread(work: Callable[[], object]) -> None:
    """Run ``work`` in a daemon thread of its own and wait for it; once the waiter is
    cancelled or the loop closes, the thread finishes (or dies with the process) unwatched."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if done.cancelled():
            return
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)

    def run() -> None:
        error: BaseException | None = None
        try:
            work()
        except BaseException as exc:  # handed to the waiter
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
            loop.call_soon_threadsafe(settle, error)

    threading.Thread(target=run, name="streamassign-state-cleanup", daemon=True).start()
    await done
