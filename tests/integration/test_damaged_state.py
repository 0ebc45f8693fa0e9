"""Damaged local state on a real broker: processes whose state directories hold every kind of
damage issue 25 found join their group, get tasks and keep working (before: ``start()`` failed
with ``KafkaError: Unexpected error during coordination``, again on every restart)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamassign import PartitionGrouper, TaskId

from .conftest import GroupIdFactory, TopicFactory
from .test_streams import App, actives, check, write_topology

DEEP = "[" * 100_000 + "]" * 100_000


def damage(root: Path, kind: str, task: str) -> Path:
    """Damage ``task``'s state in ``root`` one way; returns the damaged path."""
    directory = root / "tasks" / task
    if kind == "file where the task directory belongs":
        directory.parent.mkdir(parents=True, exist_ok=True)
        directory.write_text('{"t": {"0": 5}}')
        return directory
    if kind == "loop of links where the task directory belongs":
        directory.parent.mkdir(parents=True, exist_ok=True)
        directory.symlink_to(directory)
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    checkpoint = directory / "checkpoint"
    if kind == "directory where the checkpoint belongs":
        checkpoint.mkdir()
    else:
        checkpoint.write_text(json.dumps(CHECKPOINTS[kind]).replace('"@"', "1e400"))
    return checkpoint


CHECKPOINTS: dict[str, Any] = {
    "1e400": {"t": {"0": "@"}},
    "sum past 2**63": {"t": {"0": 2**62, "1": 2**62}},
    "sum -2": {"t": {"0": -2}},
}
KINDS = [
    *CHECKPOINTS,
    "file where the task directory belongs",
    "directory where the checkpoint belongs",
    "loop of links where the task directory belongs",
]


@pytest.fixture
def app(
    kafka_bootstrap: str,
    kafka_topic_factory: TopicFactory,
    kafka_group_id_factory: GroupIdFactory,
    tmp_path: Path,
) -> Iterator[tuple[App, set[TaskId]]]:
    orders, customers, returns = (
        kafka_topic_factory(6, prefix="orders"),
        kafka_topic_factory(6, prefix="customers"),
        kafka_topic_factory(2, prefix="returns"),
    )
    name = kafka_group_id_factory("damaged")
    topology = write_topology(tmp_path / "t.toml", name, orders, customers, returns)
    app = App(kafka_bootstrap, topology, tmp_path, standbys=0)
    tasks = set(PartitionGrouper().group(app.topology, {orders: 6, customers: 6, returns: 2}))
    yield app, tasks
    app.close()


def test_processes_with_damaged_state_join_and_get_tasks(app: tuple[App, set[TaskId]]) -> None:
    group, tasks = app
    root_a, root_b = group.tmp / "a", group.tmp / "b"
    damaged = [damage(root_a, kind, f"0_{i}") for i, kind in enumerate(KINDS)]
    (root_a / "assignment.json").write_text(DEEP)  # nested too deep for json
    damaged.append(root_a / "assignment.json")
    (root_b / "assignment.json").mkdir(parents=True)  # a directory where the file belongs
    (root_b / "process.id").mkdir()
    fifo = root_b / "tasks" / "0_0" / "checkpoint"  # opened, it blocked the join forever
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    damaged += [root_b / "assignment.json", root_b / "process.id", fifo]

    group.start("a", 2)
    group.start("b", 1)
    state = group.settle(tasks)
    check(group, state)
    assert actives(state, "a") and actives(state, "b")
    for path in damaged:  # set aside for inspection, not deleted
        assert len(list(path.parent.glob(f"{path.name}.damaged-*"))) == 1, path
    reused = actives(state, "a") & {f"0_{i}" for i in range(len(KINDS))}
    assert reused  # "a" runs 4 of the 6 tasks of subtopology 0, all damaged (0_0..0_5)
    for task in reused:
        # a task whose state was damaged works again: its new checkpoint is plain offsets
        offsets = json.loads((root_a / "tasks" / task / "checkpoint").read_text())
        assert all(v >= 0 for parts in offsets.values() for v in parts.values())
