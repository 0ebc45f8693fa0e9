"""Local state left by another topology version (an upgrade that removed a store, or removed or
renumbered a subtopology): the offset sums a process reports count only the changelogs of the
stores its tasks have now, and saved claims on tasks its topology lacks are dropped at start.

The audit's case (``/work/scratch/upgrade``, finding 2): after a v1 -> v3 roll, where v1 was
``0 [a] {ca}, 1 [b] {cb}`` and v3 ``0 [b] {cb}``, a process reported sums 656 and 658 for tasks
0_0/0_1, offsets of ``ca``'s changelog: a warm holder of v3's 0_0/0_1 it had nothing of."""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Collection, Mapping
from pathlib import Path
from types import SimpleNamespace

import pytest
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from streamassign import Subtopology, TaskId, TopicPartition, Topology
from streamassign.aiokafka import ProcessHost
from streamassign.errors import ConfigError
from streamassign.localstate import StateDirectory
from streamassign.protocol import LATEST_OFFSET, AssignmentInfo, SubscriptionInfo
from streamassign.topology import changelog_topic_name

V1 = Topology(
    [Subtopology(0, ["a"], stores=["ca"]), Subtopology(1, ["b"], stores=["cb"])], name="upg"
)
V3 = Topology([Subtopology(0, ["b"], stores=["cb"])], name="upg")
CA, CB = V1.changelog_topic("ca"), V1.changelog_topic("cb")
V1_CHANGELOGS = {0: frozenset({CA}), 1: frozenset({CB})}
T00, T01, T10, T11 = TaskId(0, 0), TaskId(0, 1), TaskId(1, 0), TaskId(1, 1)
#: What a v1 process left: ``ca`` checkpoints in 0_x, ``cb`` ones in 1_x, and its claims.
V1_CHECKPOINTS = {
    T00: {TopicPartition(CA, 0): 656},
    T01: {TopicPartition(CA, 1): 658},
    T10: {TopicPartition(CB, 0): 300},
    T11: {TopicPartition(CB, 1): 301},
}
V1_CLAIMS = {0: frozenset({T00, T10}), 1: frozenset({T01, T11})}


def v1_state(root: Path) -> dict[Path, bytes]:
    """The state directory a v1 process left at ``root``; returns every file's content."""
    state = StateDirectory(root)
    for task, offsets in V1_CHECKPOINTS.items():
        state.write_checkpoint(task, offsets)
        (state.task_dir(task) / "store.rocksdb").mkdir()  # as the store's files would be
    state.write_assignment(V1_CLAIMS)
    state.close()
    return files(root)


def files(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".lock"}


def test_sums_count_only_the_changelogs_of_the_stores_a_task_has_now(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    before = v1_state(tmp_path)
    state = StateDirectory(tmp_path)
    v3_changelogs = {0: frozenset({CB})}
    with caplog.at_level(logging.INFO, "streamassign.localstate"):
        assert state.offset_sums(v3_changelogs) == {}  # was {0_0: 656, 0_1: 658, 1_x: ...}
        assert state.offset_sums(v3_changelogs) == {}  # every join reads them: logged once
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    line = caplog.records[0].getMessage()
    assert f"subtopology 0 (tasks 0_0, 0_1): found {CA}, expected {CB}" in line
    assert "subtopology 1 (tasks 1_0, 1_1): not in this topology" in line
    assert "another topology version's" in line and "changelog_topics" in line
    assert files(tmp_path) == before  # left on disk as it was: a rollback finds it whole
    # The raw view (which changelogs the directory holds data of) still sees every entry.
    assert state.offset_sums() == {T00: 656, T01: 658, T10: 300, T11: 301}
    assert state.offset_sums(V1_CHANGELOGS) == {T00: 656, T01: 658, T10: 300, T11: 301}


def test_a_task_sums_the_stores_it_kept_and_only_its_own_partition(tmp_path: Path) -> None:
    """v2 adds ``ca2`` to subtopology 0 and drops ``cx``: 0_0 counts ``ca`` (it still has that
    state); ``ca2`` has no entry yet, ``cx`` is gone, and another partition is not 0_0's. A
    stateless subtopology (no changelogs) has no state, whatever a checkpoint holds."""
    state = StateDirectory(tmp_path)
    cx, ca2 = changelog_topic_name("upg", "cx"), changelog_topic_name("upg", "ca2")
    state.write_checkpoint(
        T00, {TopicPartition(CA, 0): 656, TopicPartition(cx, 0): 40, TopicPartition(CA, 1): 9}
    )
    state.write_checkpoint(TaskId(2, 0), {TopicPartition(CB, 0): 5})
    changelogs = {0: frozenset({CA, ca2}), 2: frozenset()}
    assert state.offset_sums(changelogs) == {T00: 656}
    # Once the task runs, the runtime's next checkpoint holds its own stores only.
    state.write_checkpoint(T00, {TopicPartition(CA, 0): 700, TopicPartition(ca2, 0): 12})
    assert state.offset_sums(changelogs) == {T00: 712}


def test_a_host_reports_no_state_and_no_claims_another_version_left(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The audit's reproducer through the host: its subscription, as the leader decodes it."""
    before = v1_state(tmp_path)
    with caplog.at_level(logging.INFO, "streamassign.localstate"):
        host = ProcessHost(V3, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, threads=2)
    assert any("1_0, 1_1 in" in r.getMessage() for r in caplog.records)  # dropped, logged
    joins = [SubscriptionInfo.decode(host.assignors[i].metadata(["b"]).user_data) for i in (0, 1)]
    assert [j.offset_sums for j in joins] == [{}, {}]  # was {0_0: 656, 0_1: 658, 1_0: ...}
    # 1_x are no tasks of V3: not claimed. 0_x are (V3's own 0_x, of other stores): their
    # claims stay, and without a sum no leader counts them as state to hand back.
    assert [j.previous_active for j in joins] == [{T00}, {T01}]
    assert files(tmp_path) == before  # nothing rewritten at start


def test_a_high_availability_leader_moves_no_active_onto_another_versions_state(
    tmp_path: Path,
) -> None:
    """Before, the restarted v3 process read as caught up on 0_0/0_1 (656 and 658 against
    ends of 660): the leader moved those actives onto it, to restore them from scratch."""
    v1_state(tmp_path / "upgraded")
    upgraded = ProcessHost(V3, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path / "upgraded")
    tasks = [TaskId(0, p) for p in range(4)]
    leader = ProcessHost(
        V3,
        bootstrap_servers="127.0.0.1:1",
        state_dir=tmp_path / "leader",
        high_availability=True,
        end_offsets=lambda: dict.fromkeys(tasks, 660),
    )
    running = SubscriptionInfo(uuid.UUID(int=1), offset_sums=dict.fromkeys(tasks, LATEST_OFFSET))
    members = {
        "running": ConsumerProtocolMemberMetadata(0, ["b"], running.encode()),
        "upgraded": upgraded.assignors[0].metadata(["b"]),
    }
    cluster = SimpleNamespace(
        partitions_for_topic=lambda topic: set(range(4)), leader_for_partition=lambda tp: None
    )
    out = leader.assignors[0].assign(cluster, members)
    got = AssignmentInfo.decode(ConsumerProtocolMemberAssignment.decode(out["upgraded"]).user_data)
    assert not got.active  # was {0_0, 0_1}: "caught up" on state it did not have
    assert len(got.warmup) == 2  # it warms up first, as any process without the state


def test_claims_are_kept_for_a_topology_that_has_their_tasks(tmp_path: Path) -> None:
    """Nothing changes for the version that saved them (and for a rollback to it)."""
    v1_state(tmp_path)
    host = ProcessHost(V1, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, threads=2)
    assert [host.restored_active(i) for i in (0, 1)] == [V1_CLAIMS[0], V1_CLAIMS[1]]
    assert host.offset_sums() == {T00: 656, T01: 658, T10: 300, T11: 301}
    assert json.loads((tmp_path / "assignment.json").read_text()) == {
        "0": ["0_0", "1_0"],
        "1": ["0_1", "1_1"],
    }


def test_a_host_with_its_own_application_id_counts_changelogs_named_either_way(
    tmp_path: Path,
) -> None:
    """A host may run a topology under another ``application_id`` (or an unnamed one): the
    changelogs of its stores under either prefix are its own."""
    state = StateDirectory(tmp_path)
    state.write_checkpoint(T00, {TopicPartition(changelog_topic_name("ops", "cb"), 0): 5})
    state.write_checkpoint(T01, {TopicPartition(CB, 1): 7})  # under V3's name, "upg"
    state.close()
    named = ProcessHost(
        V3, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, application_id="ops"
    )
    assert named.offset_sums() == {T00: 5, T01: 7}
    named.state.close()
    unnamed = Topology([Subtopology(0, ["b"], stores=["cb"])])
    host = ProcessHost(
        unnamed, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, application_id="ops"
    )
    assert host.offset_sums() == {T00: 5}


#: A standalone host's topology (review 21, finding 1): its own stores, its own names.
SHOP = Topology(
    [Subtopology(0, ["orders"], stores=["totals"]), Subtopology(1, ["clicks"])], name="shop"
)
OWN_NAMES = {
    T00: {TopicPartition("shop-totals-log", 0): 500},  # a name of its own
    T01: {TopicPartition("shop-totals-changelog", 1): 500},  # the default name
    T10: {TopicPartition("clicks-cache-log", 0): 70},  # a subtopology declared without stores
}


def shop_host(
    root: Path, changelog_topics: Mapping[int, Collection[str]] | None = None
) -> ProcessHost:
    """A host of ``SHOP`` on the state a standalone host left at ``root``."""
    state = StateDirectory(root)
    for task, offsets in OWN_NAMES.items():
        state.write_checkpoint(task, offsets)
    state.close()
    return ProcessHost(
        SHOP, bootstrap_servers="127.0.0.1:1", state_dir=root, changelog_topics=changelog_topics
    )


def test_a_host_checkpointing_under_names_of_its_own_declares_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before ``changelog_topics``, such a host reported only 0_1 (500), with no way to
    declare its names, and a log line blaming another topology version."""
    with caplog.at_level(logging.INFO, "streamassign.localstate"):
        assert shop_host(tmp_path / "default").offset_sums() == {T01: 500}
    (line,) = [r for r in caplog.records if "left out of the offset sums" in r.getMessage()]
    assert line.levelno == logging.WARNING  # no name of any version's changelog: not news to skip
    assert (
        "subtopology 0 (tasks 0_0): found shop-totals-log, expected shop-totals-changelog; "
        "subtopology 1 (tasks 1_0): found clicks-cache-log, expected none (it declares no stores)"
    ) in line.getMessage()
    declared = {0: ["shop-totals-log", "shop-totals-changelog"], 1: {"clicks-cache-log"}}
    host = shop_host(tmp_path / "declared", declared)
    assert host.offset_sums() == {T00: 500, T01: 500, T10: 70}
    only_1 = shop_host(tmp_path / "only_1", {1: ["clicks-cache-log"]})
    assert only_1.offset_sums() == {T01: 500, T10: 70}  # 0 keeps its default


@pytest.mark.parametrize(
    ("declared", "says"),
    [
        ({2: ["x"]}, re.escape("subtopologies [2]")),
        ({0: "shop-totals-log"}, "collection of topic names"),
        ({0: None}, "collection of topic names"),
        ({"0": ["x"]}, "subtopology id '0' is not an int"),
        ({0: [b"shop-totals-log"]}, "topic names must be strs"),
    ],
)
def test_changelog_topics_of_no_subtopology_or_a_bare_name_are_refused(
    tmp_path: Path, declared: Mapping[int, Collection[str]], says: str
) -> None:
    """A typo would silently report no state; a bare string would be its characters."""
    with pytest.raises(ConfigError, match=says):
        ProcessHost(
            SHOP, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, changelog_topics=declared
        )
