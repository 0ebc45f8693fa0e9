"""Two topology versions in one group whose subtopology ids mean different subtopologies (a
rolling deploy that reused an id: v1 ``0 [a]``, ``1 [b]``; v2 ``0 [a]``, ``1 [n]``, ``2 [b]``).
A member runs no task whose partitions differ from its own topology's task of that id, pauses
their partitions and says so once per episode (audit "upgrade", finding 1)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import hypothesis
import pytest
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
from hypothesis import strategies as st

from streamassign import Subtopology, TaskId, TopicPartition, Topology
from streamassign.aiokafka import ProcessHost
from streamassign.protocol import LATEST_VERSION, SubscriptionInfo
from streamassign.repeats import Repeats
from streamassign.streams import (
    MemberAssignment,
    MemberSubscription,
    assign_streams,
    decode_subscriptions,
)
from streamassign.versions import (
    mismatched_tasks,
    subtopology_fingerprints,
    subtopology_topic_indices,
)

V1 = Topology(
    [Subtopology(0, ["a"], stores=["ca"]), Subtopology(1, ["b"], stores=["cb"])], name="upg"
)
V2 = Topology(
    [
        Subtopology(0, ["a"], stores=["ca", "ca2"]),
        Subtopology(1, ["n"], stores=["cn"]),
        Subtopology(2, ["b"], stores=["cb"]),
    ],
    name="upg",
)
V3 = Topology([Subtopology(0, ["b"], stores=["cb"])], name="upg")
V4 = Topology(
    [
        Subtopology(0, ["a"], stores=["ca"]),
        Subtopology(1, ["b"], stores=["cb"]),
        Subtopology(7, ["n"], stores=["cn"]),
    ],
    name="upg",
)
COUNTS = {"a": 4, "b": 4, "n": 4}


def indices_of(topology: Topology) -> dict[int, frozenset[int]]:
    """What a process of ``topology`` announces (it subscribes to every source topic)."""
    return subtopology_topic_indices(topology, topology.source_topics)


def old_leader_assigns(leader: Topology, member: Topology) -> MemberAssignment:
    """What a ``leader``-version leader gives a ``member``-version process (as the leader of
    the audit did, announcing no topology): the member's assignment."""
    members = {
        "leader-0": MemberSubscription(
            frozenset(leader.source_topics), SubscriptionInfo(uuid.UUID(int=1))
        ),
        "member-0": MemberSubscription(
            frozenset(member.source_topics), SubscriptionInfo(uuid.UUID(int=2))
        ),
    }
    return assign_streams(leader, COUNTS, members, leader_version=2)["member-0"]


def test_tasks_of_a_reused_id_are_mismatched_either_way() -> None:
    """v1 leader, v2 member: 1_x is b there, n here. v3 leader, v1 member: 0_x is b there, a
    here (the audit's leader_mismatch.py). Stable ids (v4) and an added store match."""
    given = old_leader_assigns(V1, V2)
    mismatched = mismatched_tasks(V2, given.info.active, given.info.topics)
    assert {t.subtopology for t in mismatched} == {1}
    assert {t.subtopology for t in given.info.active - mismatched.keys()} <= {0}
    first = mismatched[min(mismatched)]
    assert first.leader_partitions == (TopicPartition("b", first.task.partition),)
    assert first.own_sources == ("n",)

    reverse = old_leader_assigns(V3, V1)
    assert reverse.info.active  # v1 subscribes to a superset of v3's topics: it gets tasks
    assert (
        mismatched_tasks(V1, reverse.info.active, reverse.info.topics).keys() == reverse.info.active
    )

    for leader, member in ((V1, V4), (V4, V4), (V4, V1)):
        given = old_leader_assigns(leader, member)
        assert mismatched_tasks(member, given.info.active, given.info.topics) == {}


def test_a_task_of_an_id_this_topology_lacks_is_mismatched_and_no_dictionary_means_unchecked() -> (
    None
):
    assert set(mismatched_tasks(V3, [TaskId(1, 0)], {1: {"b": 4}})) == {TaskId(1, 0)}
    assert mismatched_tasks(V3, [TaskId(0, 0)], {}) == {}


def test_fingerprints_cover_sources_only() -> None:
    f1, f2, f4 = (subtopology_fingerprints(t) for t in (V1, V2, V4))
    assert f1[0] == f2[0]  # a store added: same partitions, both versions run the task
    assert f1[1] != f2[1] and f1[1] == f2[2] and f1 == {s: f4[s] for s in f1}
    joined = Topology([Subtopology(0, ["c", "d"])], copartition_groups=[["c", "d"]])
    apart = Topology([Subtopology(0, ["c", "d"])])
    assert subtopology_fingerprints(joined) == subtopology_fingerprints(apart)


class PausingConsumer:
    """A consumer stub: cluster metadata of ``COUNTS`` and the partitions paused."""

    def __init__(self) -> None:
        self._client = SimpleNamespace(
            cluster=SimpleNamespace(partitions_for_topic=lambda t: set(range(COUNTS.get(t, 0))))
        )
        self._coordinator = SimpleNamespace(request_rejoin=lambda: None)
        self.paused: set[Any] = set()

    def pause(self, *tps: Any) -> None:
        self.paused.update(tps)

    async def stop(self) -> None: ...


def deliver(host: ProcessHost, given: MemberAssignment, index: int = 0) -> None:
    """aiokafka's part of a new assignment: fresh partitions (unpaused), then the assignor."""
    consumer = host.consumers[index]
    consumer.paused = set()  # type: ignore[attr-defined]
    by_topic: dict[str, list[int]] = {}
    for tp in given.partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    host.assignors[index].on_assignment(
        ConsumerProtocolMemberAssignment(0, sorted(by_topic.items()), given.info.encode())
    )


def test_a_member_runs_no_task_of_another_version_and_says_so_once_per_episode(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A v2 process assigned by a v1 leader: tasks 1_x (b there, n here) are not run, their
    partitions paused; one ERROR line for three rebalances; one INFO line once a leader of
    its own version assigns, whose tasks then run."""
    host = ProcessHost(V2, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path)
    consumer = PausingConsumer()
    host.consumers.append(consumer)  # type: ignore[arg-type]
    given = old_leader_assigns(V1, V2)
    foreign = {
        KafkaTopicPartition("b", t.partition) for t in given.info.active if t.subtopology == 1
    }
    assert foreign

    async def scenario() -> None:
        with caplog.at_level(logging.DEBUG, "streamassign.aiokafka"):
            for _ in range(3):
                deliver(host, given)
                assert host.assignors[0].info.active == {
                    t for t in given.info.active if t.subtopology == 0
                }
                assert consumer.paused == foreign
            assert host.host_info.active_by_host == given.info.active_by_host  # leader's maps
            await host._assigned(0)
            assert host.tasks(0).active == host.assignors[0].info.active
            own = old_leader_assigns(V2, V2)
            deliver(host, own)
            assert host.assignors[0].info.active == own.info.active and consumer.paused == set()
        await host.stop()

    asyncio.run(scenario())
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    first = min(t for t in given.info.active if t.subtopology == 1)
    assert f"{first} (leader's partitions b-{first.partition}; here it reads n)" in errors[0]
    assert "the leader's subtopology 1 reads b, this process's reads n" in errors[0]
    assert f"b-{first.partition}" in errors[0] and "fresh id" in errors[0]
    assert "docs/streams.md#rolling-deploys" in errors[0]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("same topics per subtopology id" in m for m in infos)


def test_a_matching_assignment_logs_nothing_and_pauses_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Stable ids (a v4 process under a v1 leader): every task runs, no line."""
    host = ProcessHost(V4, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path)
    consumer = PausingConsumer()
    host.consumers.append(consumer)  # type: ignore[arg-type]
    given = old_leader_assigns(V1, V4)
    with caplog.at_level(logging.INFO, "streamassign.aiokafka"):
        deliver(host, given)
    assert host.assignors[0].info.active == given.info.active and consumer.paused == set()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    asyncio.run(host.stop())


def test_records_of_a_task_the_consumer_does_not_run_are_paused_not_spun(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Consumer 1 owns partitions whose task it does not run (the audit: 19,003 rewinds and
    as many WARNING lines in 24 s): its loop pauses them before the next fetch, and the
    rewinds that still happen warn once, until the task runs there."""
    from tests.test_runtime_ownership import INPUT, batch, batch_of, make

    app, task, _, consumers = make(tmp_path)

    async def run() -> None:
        with caplog.at_level(logging.DEBUG, "streamassign.runtime"):
            for _ in range(5):
                await batch_of(app, 1, batch(0, 10))
            app._pause_restoring(1)  # as consumer 1's loop does before every fetch
            assert consumers[1].paused_tps == {INPUT}
            assert consumers[1].seeks == [(INPUT, 0)] * 5  # rewound, never skipped
            await app._commits.commit(1)
            assert consumers[1].commits == []  # committed offsets untouched
            app._pause_restoring(0)
            assert consumers[0].paused_tps == set()  # the consumer running it fetches it

    asyncio.run(run())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "task 0_0 it does not run" in warnings[0], warnings
    assert task.processed == 0


# -- leader side: each subtopology's topics in the subscription (protocol version 3) ----------


def announcing(pid: int, topology: Topology, version: int = LATEST_VERSION) -> MemberSubscription:
    """A member of ``topology``'s version, announcing its subtopologies' topics from version 3
    on, as it reaches a leader (encoded, then decoded at the leader's version)."""
    info = SubscriptionInfo(
        uuid.UUID(int=pid),
        version=version,
        latest_supported_version=version,
        subtopology_topic_indices=indices_of(topology),
    )
    decoded = SubscriptionInfo.decode(info.encode(), LATEST_VERSION)
    return MemberSubscription(frozenset(topology.source_topics), decoded)


def test_source_topics_travel_in_version_3_and_older_readers_skip_them() -> None:
    indices = {0: frozenset({0, 2}), 5: frozenset({1})}
    info = SubscriptionInfo(uuid.UUID(int=7), rack="r", subtopology_topic_indices=indices)
    assert SubscriptionInfo.decode(info.encode()) == info
    old_leader = SubscriptionInfo.decode(info.encode(), max_version=2)  # reads the v2 prefix
    assert old_leader.rack == "r" and old_leader.subtopology_topic_indices == {}
    old_member = attrs.evolve(info, version=2, latest_supported_version=2)
    assert SubscriptionInfo.decode(old_member.encode()).subtopology_topic_indices == {}


def test_a_leader_excludes_no_process_and_warns_about_those_whose_ids_differ(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A v1 leader, a v1 and a v2 process (b renumbered), a v4 process (fresh id for n) and
    a process announcing nothing (protocol 2): every one gets tasks; the v2 process gets no
    1_x (moved to eligible processes), only 0_x. One WARNING per episode naming the v2
    process only, with the ids it differs on; one INFO line at its end."""
    members = {
        "v1": announcing(1, V1),
        "v2": announcing(2, V2),
        "v4": announcing(4, V4),
        "old": announcing(5, V2, version=2),
    }
    versions = Repeats()
    with caplog.at_level(logging.INFO, "streamassign.streams"):
        for _ in range(2):
            result = assign_streams(V1, COUNTS, members, topology_versions=versions)
            assert all(result[m].info.active for m in members)
            assert {t.subtopology for t in result["v2"].info.active} == {0}
            assert len({t for a in result.values() for t in a.info.active}) == 8
        assign_streams(V1, COUNTS, {"v1": members["v1"]}, topology_versions=versions)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert f"processes {uuid.UUID(int=2)} announce id 1 reading [n] (" in warnings[0]
    assert "id 0" not in warnings[0].split("(this leader")[0]  # id 0 is the same
    for pid in (1, 4, 5):  # the leader's own version, a fresh id, announced nothing
        assert str(uuid.UUID(int=pid)) not in warnings[0]
    assert "No member announcing an id so gets a task of it" in warnings[0]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("agrees with this leader's topology again" in m for m in infos)


def test_processes_eligible_for_none_of_the_leaders_ids_are_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A leader whose every id is fresh (10 [a], 11 [b]) keeps the processes of
    the old ids (0 [a], 1 [b]): they announce. They get no task at all, which the
    topology-version WARNING says, once per episode; the leader's own ids are bracketed."""
    old = Topology([Subtopology(0, ["a"]), Subtopology(1, ["b"])], name="r")
    new = Topology([Subtopology(10, ["a"]), Subtopology(11, ["b"])], name="r")
    members = {"p1": announcing(1, new), "p2": announcing(2, old), "p3": announcing(3, old)}
    versions = Repeats()
    with caplog.at_level(logging.WARNING, "streamassign.streams"):
        for _ in range(3):
            result = assign_streams(new, {"a": 4, "b": 4}, members, topology_versions=versions)
            assert not result["p2"].info.active and not result["p3"].info.active
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    idle = f"processes {uuid.UUID(int=2)}, {uuid.UUID(int=3)} announce none of this leader's ids"
    assert idle in warnings[0] and "they get no task at all" in warnings[0]
    assert "id 10: [a]; id 11: [b])" in warnings[0]
    assert str(uuid.UUID(int=1)) not in warnings[0]


def test_fresh_ids_only_are_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    """The documented deploy (n added with the fresh id 7), either version leading: no
    topology-version line. Under the v4 leader the v1 process, which announces its topics
    but does not subscribe to n, is kept (it was given nothing before): it runs tasks of the
    ids both versions share and none of 7 (whose partitions it could not be given)."""
    with caplog.at_level(logging.INFO, "streamassign.streams"):
        for leader in (V1, V4):
            members = {"v1": announcing(1, V1), "v4": announcing(4, V4)}
            result = assign_streams(leader, COUNTS, members, topology_versions=Repeats())
            assert result["v1"].info.active, leader
            assert {t.subtopology for t in result["v1"].info.active} <= {0, 1}
            assert all(tp.topic in V1.source_topics for tp in result["v1"].partitions)
    lines = [r.getMessage() for r in caplog.records]
    assert not [m for m in lines if "topology version" in m or "does not subscribe" in m], lines


def test_a_new_leader_gives_an_old_member_no_task_of_a_reused_id_and_an_old_leader_works() -> None:
    """The audit's reverse case (v3 leader ``0 [b]``, v1 member announcing its topics): v3's
    only id means a there, so the v1 process gets no task of it (all four on v3). Without
    announcement (protocol 2) it gets its share, which its guard refuses. An old leader
    (protocol 2) reads new members' subscriptions as before and answers at version 2."""
    new_leader = assign_streams(V3, COUNTS, {"v3": announcing(3, V3), "v1": announcing(1, V1)})
    assert not new_leader["v1"].info.active and len(new_leader["v3"].info.active) == 4
    quiet = assign_streams(
        V3, COUNTS, {"v3": announcing(3, V3, version=2), "v1": announcing(1, V1, version=2)}
    )
    given = quiet["v1"].info
    assert len(given.active) == 2
    assert mismatched_tasks(V1, given.active, given.topics).keys() == given.active
    data = {
        m: (
            sorted(t.source_topics),
            SubscriptionInfo(uuid.UUID(int=i), subtopology_topic_indices=indices_of(t)).encode(),
        )
        for m, i, t in (("v1", 1, V1), ("v2", 2, V2))
    }
    old = decode_subscriptions(V1, COUNTS, data, max_version=2)
    result = assign_streams(V1, COUNTS, old, leader_version=2)
    assert {a.info.common_version for a in result.values()} == {2}
    assert all(a.info.active for a in result.values())  # as before: only the member guards


def test_a_process_announces_its_topics_unless_it_speaks_an_older_version(
    tmp_path: Path,
) -> None:
    new = ProcessHost(V2, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path / "new")
    old = ProcessHost(
        V2, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path / "old", max_version=2
    )
    sent = [
        SubscriptionInfo.decode(h.assignors[0].metadata(sorted(V2.source_topics)).user_data)
        for h in (new, old)
    ]
    assert sent[0].subtopology_topic_indices == indices_of(V2)
    assert sent[1].version == 2 and sent[1].subtopology_topic_indices == {}
    for h in (new, old):
        asyncio.run(h.stop())


def test_an_id_only_the_leader_has_is_no_mismatch_unless_its_tasks_come_here(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A v1 process under a v4 leader (n added with the fresh id 7): its share of ids 0 and 1,
    which it runs, none of 7 (it lacks n), no line, ids are stable. A v5 process (``1 [b]``)
    under a v3 leader (``0 [b]``: b renumbered) is assigned 0_x, an id it lacks: not run, one
    ERROR line."""
    v5 = Topology([Subtopology(1, ["b"], stores=["cb"])], name="upg")
    hosts = []
    for topology, leader, name, runs in ((V1, V4, "v1", {0, 1}), (v5, V3, "v5", set())):
        host = ProcessHost(topology, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path / name)
        host.consumers.append(PausingConsumer())  # type: ignore[arg-type]
        with caplog.at_level(logging.INFO, "streamassign.aiokafka"):
            deliver(host, old_leader_assigns(leader, topology))
        assert {t.subtopology for t in host.assignors[0].info.active} == runs
        hosts.append(host)
    errors = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name == "streamassign.aiokafka"
    ]
    assert len(errors) == 1, errors
    assert "the leader's subtopology 0 reads b, this process's does not exist" in errors[0]
    assert hosts[1].consumers[0].paused  # type: ignore[attr-defined]
    for host in hosts:
        asyncio.run(host.stop())


def test_a_task_whose_leader_partitions_are_inputs_of_its_own_task_runs() -> None:
    """The guard refuses a task only when a partition the leader gives for it is not an input
    of this process's task of that id. A topic added to subtopology 1 (``1 [b, x]``): a
    process of either version runs a task the other version's leader gave with fewer topics
    (b-p is its own task's input), and refuses one the leader gave with a topic it does not
    read (x-p would map to no task here). A co-partition group declared: both run."""
    wider = Topology([Subtopology(0, ["a"]), Subtopology(1, ["b", "x"])], name="upg")
    task = TaskId(1, 2)
    assert mismatched_tasks(wider, [task], {1: {"b": 4}}, {"x": 4}) == {}
    refused = mismatched_tasks(V1, [task], {1: {"b": 4, "x": 4}})
    assert refused[task].leader_partitions == (TopicPartition("b", 2), TopicPartition("x", 2))
    joined = Topology([Subtopology(0, ["c", "d"])], copartition_groups=[["c", "d"]])
    apart = Topology([Subtopology(0, ["c", "d"])])
    for member in (joined, apart):
        assert mismatched_tasks(member, [TaskId(0, 1)], {0: {"c": 4, "d": 4}}) == {}


def test_the_error_names_every_refused_task_of_the_process_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A v2 process with two consumers under a v1 leader: each consumer refuses its 1_x. One
    ERROR line, written once both consumers' parts are in, names the refused tasks and
    paused partitions of both; the same assignment again only at DEBUG."""
    members = {
        "leader-0": MemberSubscription(
            frozenset(V1.source_topics), SubscriptionInfo(uuid.UUID(int=1))
        ),
        **{
            f"member-{i}": MemberSubscription(
                frozenset(V2.source_topics), SubscriptionInfo(uuid.UUID(int=2))
            )
            for i in range(2)
        },
    }
    result = assign_streams(V1, COUNTS, members, leader_version=2)
    host = ProcessHost(V2, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, threads=2)
    for _ in range(2):
        host.consumers.append(PausingConsumer())  # type: ignore[arg-type]
    refused = {t for i in range(2) for t in result[f"member-{i}"].info.active if t.subtopology == 1}
    assert {t for t in refused if t in result["member-0"].info.active}
    assert {t for t in refused if t in result["member-1"].info.active}
    with caplog.at_level(logging.DEBUG, "streamassign.aiokafka"):
        for _ in range(2):
            for i in range(2):
                deliver(host, result[f"member-{i}"], i)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    for task in refused:
        assert f"{task} (leader's partitions b-{task.partition};" in errors[0]
        assert f"b-{task.partition}" in errors[0].split("partitions paused (")[1]
    asyncio.run(host.stop())


# -- leader side: per-subtopology eligibility after the assignor -------------------------------


def roll_members(
    rolled: int, standbys_of: dict[int, frozenset[TaskId]] | None = None
) -> dict[str, MemberSubscription]:
    """Six processes, the first ``rolled`` on V2 (b renumbered), the rest on V1, each having
    run its share of V1's tasks before (its offset sums say so)."""
    members = {}
    for pid in range(1, 7):
        topology = V2 if pid <= rolled else V1
        sums = {TaskId(s, p): 100 for s in (0, 1) for p in range(4) if (2 * s + p) % 6 == pid - 1}
        info = SubscriptionInfo(
            uuid.UUID(int=pid),
            endpoint=f"h{pid}:1",
            offset_sums=sums,
            subtopology_topic_indices=indices_of(topology),
        )
        members[f"m{pid}"] = MemberSubscription(frozenset(topology.source_topics), info)
    return members


@pytest.mark.parametrize("high_availability", [False, True])
def test_tasks_of_a_differing_id_move_to_eligible_processes_and_the_rest_stay_spread(
    high_availability: bool,
) -> None:
    """Five of six processes rolled to V2 under a V1 leader: before, the whole-process
    exclusion put all 8 tasks (and no standby) on the one V1 process. Now the V2 processes
    run the 0_x (same topics), every 1_x goes to the V1 process, and no V2 process keeps a
    standby or warmup of a 1_x."""
    result = assign_streams(
        V1,
        COUNTS,
        roll_members(5),
        num_standby_replicas=1,
        high_availability=high_availability,
        end_offsets={TaskId(s, p): 100 for s in (0, 1) for p in range(4)},
    )
    by_pid = {m: a.info for m, a in result.items()}
    assert {t for t in by_pid["m6"].active if t.subtopology == 1} == {
        TaskId(1, p) for p in range(4)
    }
    for m in ("m1", "m2", "m3", "m4", "m5"):
        info = by_pid[m]
        assert all(t.subtopology == 0 for t in info.active | info.standby | info.warmup), info
    zeros = [t for m in ("m1", "m2", "m3", "m4", "m5") for t in by_pid[m].active]
    assert len(zeros) >= 3  # id 0's tasks stay spread over the rolled processes
    assert len({t for a in by_pid.values() for t in a.active}) == 8


def test_a_moved_task_goes_to_its_state_holder_while_under_its_share_then_the_least_loaded() -> (
    None
):
    from streamassign.assignment import ClientAssignment, ClientState
    from streamassign.eligibility import move_to_eligible_clients

    task, other = TaskId(1, 0), TaskId(0, 0)
    clients = [ClientState("a"), ClientState("b"), ClientState("c", prev_standby={task})]
    per_client = {  # 2 actives over 3 clients: a share of 1 each
        "a": ClientAssignment(frozenset({task, other})),
        "b": ClientAssignment(frozenset()),
        "c": ClientAssignment(frozenset(), standby=frozenset({task})),
    }
    moved = move_to_eligible_clients(per_client, {"a": frozenset({1})}, clients)
    assert moved["c"] == ClientAssignment(frozenset({task}))
    assert moved["a"].active == {other}
    per_client["c"] = ClientAssignment(frozenset({TaskId(0, 1)}), standby=frozenset({task}))
    moved = move_to_eligible_clients(per_client, {"a": frozenset({1})}, clients)
    assert moved["b"].active == {task}  # the holder is at its share (1 of 3): no pile-up
    nobody = move_to_eligible_clients(per_client, dict.fromkeys("abc", frozenset({1})), clients)
    assert nobody["a"].active == {task, other}  # nowhere eligible: stays (its guard refuses)


def test_a_client_the_moves_pushed_above_its_share_gives_actives_back() -> None:
    """Every 1_x moves off the two rolled clients onto the one eligible; it gives its 0_x to
    the clients that lost tasks (a peak of 2, not 4), holders of their state first."""
    from streamassign.assignment import ClientAssignment, ClientState
    from streamassign.eligibility import move_to_eligible_clients

    zero, one = [TaskId(0, p) for p in range(3)], [TaskId(1, p) for p in range(3)]
    per_client = {c: ClientAssignment(frozenset({zero[i], one[i]})) for i, c in enumerate("abc")}
    clients = [ClientState("a"), ClientState("b", prev_standby={zero[2]}), ClientState("c")]
    ineligible = dict.fromkeys("ab", frozenset({1}))
    moved = move_to_eligible_clients(per_client, ineligible, clients, stateful=zero + one)
    assert moved["c"].active == set(one)
    assert moved["b"].active == {zero[1], zero[2]}  # b held 0_2's state
    assert moved["a"].active == {zero[0]}
    # High availability: an active is given back only where it restores nothing.
    stateless = [ClientState(c) for c in "abc"]
    warm = move_to_eligible_clients(
        per_client, ineligible, stateless, stateful=zero + one, cold_give_back=False
    )
    assert warm["c"].active == {zero[2], *one}
    assert move_to_eligible_clients(per_client, ineligible, stateless)["c"].active == set(one)


@pytest.mark.parametrize("high_availability", [False, True])
def test_moved_tasks_keep_their_standbys_on_eligible_processes(high_availability: bool) -> None:
    """Three of six processes rolled (before the fix, 0 of the reused id's standbys were left):
    every task keeps one standby, on a V1 process other than its active's, and no process runs
    more than 2 of the 8 tasks."""
    result = assign_streams(
        V1,
        COUNTS,
        roll_members(3),
        num_standby_replicas=1,
        high_availability=high_availability,
        end_offsets={TaskId(s, p): 100 for s in (0, 1) for p in range(4)},
        now_ms=0,
    )
    infos = {m: a.info for m, a in result.items()}
    for task in (TaskId(1, p) for p in range(4)):
        standbys = [m for m, i in infos.items() if task in i.standby]
        assert len(standbys) == 1 and standbys[0] in ("m4", "m5", "m6"), (task, standbys)
        assert task not in infos[standbys[0]].active
    assert max(len(i.active) for i in infos.values()) == 2


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(
    processes=st.integers(1, 5),
    threads=st.integers(1, 3),
    partitions=st.integers(1, 6),
    history=st.integers(0, 2**16),
    standbys=st.integers(0, 2),
    high_availability=st.booleans(),
)
def test_with_every_process_announcing_the_leaders_topics_the_post_pass_changes_nothing(
    processes: int,
    threads: int,
    partitions: int,
    history: int,
    standbys: int,
    high_availability: bool,
) -> None:
    """The same group, each member announcing the leader's topics or none: the same
    assignment, member by member (the post-pass is a strict no-op)."""
    counts = {t: partitions for t in ("a", "b", "n")}
    tasks = [TaskId(s, p) for s in (0, 1) for p in range(partitions)]
    outputs = []
    for announced in (indices_of(V1), {}):
        members = {}
        for pid in range(processes):
            for thread in range(threads):
                seed = history >> ((pid * threads + thread) % 16)
                previous = frozenset(t for i, t in enumerate(tasks) if (seed >> i) & 1)
                info = SubscriptionInfo(
                    uuid.UUID(int=pid + 1),
                    previous_active=previous,
                    subtopology_topic_indices=announced,
                )
                members[f"m{pid}-{thread}"] = MemberSubscription(frozenset("ab"), info)
        outputs.append(
            assign_streams(
                V1,
                counts,
                members,
                num_standby_replicas=standbys,
                high_availability=high_availability,
                now_ms=0,
            )
        )
    assert outputs[0] == outputs[1]


def test_a_process_given_no_task_of_a_differing_id_logs_info_not_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A v2 process under a v1 leader that moved every 1_x elsewhere: it runs all it is
    given, pauses nothing, and says once at INFO that the leader's ids differ."""
    members = {"v1": announcing(1, V1), "v2": announcing(2, V2)}
    given = assign_streams(V1, COUNTS, members)["v2"]
    assert given.info.active and all(t.subtopology == 0 for t in given.info.active)
    host = ProcessHost(V2, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path)
    host.consumers.append(PausingConsumer())  # type: ignore[arg-type]
    with caplog.at_level(logging.DEBUG, "streamassign.aiokafka"):
        for _ in range(2):
            deliver(host, given)
    assert host.assignors[0].info.active == given.info.active
    assert not host.consumers[0].paused  # type: ignore[attr-defined]
    lines = [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.name == "streamassign.aiokafka" and "topology version" in r.getMessage()
    ]
    assert [level for level, _ in lines] == [logging.INFO, logging.DEBUG], lines
    assert "ids 1 read other topics" in lines[0][1]
    asyncio.run(host.stop())
