"""Stores close off the event loop (issue 21 §6): a slow close stalls nothing, and a task whose
stores are still closing is opened again only once they are closed."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from streamassign import Subtopology, TaskId, TopicPartition, Topology
from streamassign.runtime import App, MemoryStore, StoreState

TASK = TaskId(0, 0)


class SlowStore(MemoryStore):
    """Closing takes ``seconds`` (as flushing a large RocksDB store does), in whatever
    thread calls it."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.closed = threading.Event()

    def close(self) -> None:
        time.sleep(self.seconds)
        super().close()
        self.closed.set()


def test_a_slow_close_runs_off_the_loop_and_a_reopen_waits_for_it(tmp_path: Path) -> None:
    topology = Topology([Subtopology(0, ["events"], stores=["totals"])], name="app")
    app = App(topology, {0: object}, bootstrap_servers="unused:1", state_dir=tmp_path)  # type: ignore[dict-item]
    store = SlowStore(0.5)
    changelog = TopicPartition("app-totals-changelog", 0)
    states = {"totals": StoreState("totals", changelog, store)}
    opened_after_close: list[bool] = []
    app._stores.open = lambda task: opened_after_close.append(store.closed.is_set()) or {}  # type: ignore[method-assign,func-returns-value]

    async def run() -> int:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while not store.closed.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        closing = app._stores.close(TASK, states)
        await app._stores.take(TASK)  # the task comes back while its stores close
        await closing
        await ticker
        return ticks

    ticks = asyncio.run(run())
    assert ticks >= 10  # the loop ran on during the 0.5 s close
    assert opened_after_close == [True]
    assert app._stores.closing == {}
