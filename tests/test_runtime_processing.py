"""The runtime's per-record path without a broker: skipping replays, undoing a failed record's
writes, the two error policies, and what reaches the changelog and the outputs.

The producer is replaced by a recorder (a unit test of the task logic; the broker tests in
``tests/integration/test_runtime.py`` run the real thing).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from streamassign import Subtopology, TaskId, TopicPartition, Topology
from streamassign.runtime import App, MemoryStore, ProcessingError, StoreState, TaskContext
from streamassign.runtime.app import _ActiveTask

TOPIC = "events"
CHANGELOG = TopicPartition("app-totals-changelog", 0)


class Recorder:
    """Stands in for AIOKafkaProducer.send: records what would be produced."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None]] = []

    async def send(
        self, topic: str, value: bytes | None, key: bytes | None = None, partition: Any = None
    ) -> asyncio.Future[None]:
        self.sent.append((topic, key, value))
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future


class Rec:
    def __init__(self, offset: int, key: bytes, value: bytes) -> None:
        self.topic, self.partition, self.offset, self.timestamp = TOPIC, 0, offset, offset
        self.key, self.value = key, value


class Adder:
    """Adds the value to two keys, then fails on value ``b"boom"`` (after writing once)."""

    async def process(self, ctx: TaskContext, record: Any) -> None:
        table = ctx.store("totals")
        for suffix in (b"", b"-copy"):
            key = record.key + suffix
            if record.value == b"boom" and suffix:
                raise ValueError("bad record")
            table.put(key, str(int(table.get(key) or b"0") + int(record.value)).encode())
        ctx.send("out", table.get(record.key), key=record.key)


def make(tmp_path: Path, policy: str) -> tuple[App, _ActiveTask, Recorder]:
    topology = Topology([Subtopology(0, [TOPIC], stores=["totals"])], name="app")
    app = App(
        topology,
        {0: Adder},
        bootstrap_servers="unused:1",
        state_dir=tmp_path,
        processing_errors=policy,  # type: ignore[arg-type]
    )
    recorder = Recorder()
    app._producer = recorder  # type: ignore[assignment]
    state = StoreState.open("totals", CHANGELOG, MemoryStore())
    task = _ActiveTask(TaskId(0, 0), 0, {"totals": state}, Adder())
    return app, task, recorder


def test_replayed_records_are_skipped_and_counted_once(tmp_path: Path) -> None:
    app, task, recorder = make(tmp_path, "stop")

    async def run() -> None:
        for offset, value in enumerate([b"1", b"2", b"3"]):
            await app._process(task, Rec(offset, b"k", value))
        task.stores["totals"].committed(marker_offset=99)
        for offset, value in enumerate([b"1", b"2", b"3"]):  # the input read again
            await app._process(task, Rec(offset, b"k", value))
        await app._process(task, Rec(3, b"k", b"4"))

    asyncio.run(run())
    assert task.context.store("totals").get(b"k") == b"10"
    assert task.skipped == 3 and task.processed == 4
    assert task.offsets == {TopicPartition(TOPIC, 0): 4}
    changelog = [(k, v) for t, k, v in recorder.sent if t == CHANGELOG.topic]
    assert changelog[-2:] == [(b"k", b"10"), (b"k-copy", b"10")]
    assert [v for t, _, v in recorder.sent if t == "out"] == [b"1", b"3", b"6", b"10"]


def test_skip_policy_undoes_the_failed_records_writes(tmp_path: Path) -> None:
    app, task, recorder = make(tmp_path, "skip")

    async def run() -> None:
        await app._process(task, Rec(0, b"k", b"5"))
        await app._process(task, Rec(1, b"k", b"boom"))  # wrote k once, then raised
        await app._process(task, Rec(2, b"k", b"1"))

    asyncio.run(run())
    table = task.context.store("totals")
    assert (table.get(b"k"), table.get(b"k-copy")) == (b"6", b"6")
    assert all(v != b"boom" for _, _, v in recorder.sent)
    assert task.offsets == {TopicPartition(TOPIC, 0): 3}  # the bad record is passed over


def test_stop_policy_raises_and_does_not_move_the_offset(tmp_path: Path) -> None:
    app, task, _ = make(tmp_path, "stop")

    async def run() -> None:
        await app._process(task, Rec(0, b"k", b"5"))
        await app._process(task, Rec(1, b"k", b"boom"))

    with pytest.raises(ProcessingError, match="events-0@1"):
        asyncio.run(run())
    assert task.context.store("totals").get(b"k") == b"5"  # the partial write was undone
    assert task.offsets == {TopicPartition(TOPIC, 0): 1}
