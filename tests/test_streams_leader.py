"""The leader's streams assignment as a pure function: members -> partitions and user data."""

from __future__ import annotations

import logging
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamassign import PartitionGrouper, Subtopology, TaskId, TopicPartition, Topology
from streamassign.errors import AssignmentInputError, ErrorCode
from streamassign.protocol import LATEST_OFFSET, LATEST_VERSION, SubscriptionInfo
from streamassign.repeats import Repeats
from streamassign.shares import share_bounds
from streamassign.streams import (
    MemberSubscription,
    assign_streams,
    client_states,
    merge_offset_sums,
)

from .strategies import rejoining_members

TOPOLOGY = Topology(
    [
        Subtopology(0, ["orders", "customers"], stores=["table"]),
        Subtopology(1, ["returns"]),
    ],
    copartition_groups=[["orders", "customers"]],
    name="app",
)
COUNTS = {"orders": 6, "customers": 6, "returns": 3}
TOPICS = TOPOLOGY.source_topics


def member(pid: int, **kw: object) -> MemberSubscription:
    return MemberSubscription(TOPICS, SubscriptionInfo(uuid.UUID(int=pid), **kw))  # type: ignore[arg-type]


@given(st.lists(st.integers(1, 4), min_size=1, max_size=5), st.integers(0, 2))
def test_every_task_once_copartitioned_and_thread_proportional(
    threads: list[int], standbys: int
) -> None:
    members = {
        f"p{p}-c{c}": member(p + 1, endpoint=f"p{p}:1")
        for p, n in enumerate(threads)
        for c in range(n)
    }
    result = assign_streams(TOPOLOGY, COUNTS, members, num_standby_replicas=standbys)
    tasks = PartitionGrouper().group(TOPOLOGY, COUNTS)
    assert set(result) == set(members)
    actives = [t for a in result.values() for t in a.info.active]
    assert sorted(actives) == sorted(tasks)
    for a in result.values():  # co-partitioned partitions of a task on the same consumer
        assert set(a.partitions) == {tp for t in a.info.active for tp in tasks[t]}
    per_process = [
        sum(len(result[f"p{p}-c{c}"].info.active) for c in range(n)) for p, n in enumerate(threads)
    ]
    for got, (lo, hi) in zip(per_process, share_bounds(len(tasks), threads), strict=True):
        assert lo <= got <= hi
    hosts = next(iter(result.values())).info.active_by_host
    assert sorted(t for ts in hosts.values() for t in ts) == sorted(tasks)


def test_every_assignment_carries_the_topic_dictionary_even_without_endpoints() -> None:
    """A reader of the group (``describe``) maps tasks to partitions with it."""
    members = {f"p{p}": member(p + 1) for p in range(2)}  # no endpoint anywhere
    result = assign_streams(TOPOLOGY, COUNTS, members)
    for assigned in result.values():
        assert assigned.info.active_by_host == {}
        assert assigned.info.topics == {0: {"orders": 6, "customers": 6}, 1: {"returns": 3}}


def test_offset_sums_become_previous_actives_state_and_lags() -> None:
    t = TaskId(0, 1)
    clients, _, _ = client_states(
        {
            "a": member(1, offset_sums={t: LATEST_OFFSET}),
            "b": member(2, offset_sums={t: 900}),
            "c": member(3, offset_sums={t: 1000, TaskId(0, 2): 5}),
        }
    )
    a, b, c = clients
    assert a.prev_active == {t} and not a.prev_standby
    assert b.prev_standby == {t} and b.lags[t] == 100  # behind the best reported sum
    assert c.lags == {t: 0, TaskId(0, 2): 0}


def test_a_restarted_process_reports_what_it_ran_and_gets_it_back() -> None:
    """p2 restarted: its previous actives (from its state directory) are claims backed by
    local state; p1, the interim owner, hands them back when balance allows."""
    tasks = PartitionGrouper().group(TOPOLOGY, COUNTS)
    mine = {TaskId(0, 1), TaskId(0, 4)}
    members = {
        "p1": member(1, offset_sums=dict.fromkeys(tasks, LATEST_OFFSET)),
        "p2": member(2, offset_sums=dict.fromkeys(mine, 500), previous_active=mine),
    }
    result = assign_streams(TOPOLOGY, COUNTS, members)
    assert result["p2"].info.active >= mine


def test_restart_returns_every_task_even_when_the_interim_owner_has_little_surplus() -> None:
    """p2 ran all three of restarted p1's tasks but is only 2 over its quota; as p1 is caught
    up, its claims are the history and p2 is a warm holder: p1 gets its tasks back, as many
    as its share of subtopology 0 allows (two: each process runs two of its six tasks and one
    of subtopology 1's three; balancing totals only, it got all three)."""
    mine = {TaskId(0, 0), TaskId(0, 1), TaskId(0, 2)}
    interim = mine | {TaskId(0, 3), TaskId(1, 0)}
    rest = {TaskId(0, 4), TaskId(0, 5), TaskId(1, 1), TaskId(1, 2)}
    members = {
        "p1": member(1, offset_sums=dict.fromkeys(mine, 900), previous_active=mine),
        "p2": member(2, offset_sums=dict.fromkeys(interim, LATEST_OFFSET)),
        "p3": member(3, offset_sums=dict.fromkeys(rest, LATEST_OFFSET)),
    }
    result = assign_streams(TOPOLOGY, COUNTS, members)
    got = result["p1"].info.active
    assert len(got & mine) == 2 and len(got) == 3
    assert result["p2"].info.active >= mine - got  # the third stays where it is caught up
    clients, _, _ = client_states(members)
    assert clients[1].prev_active == {TaskId(0, 3), TaskId(1, 0)}  # p2: a warm holder now
    assert mine <= clients[1].prev_standby


def test_a_restarted_process_far_behind_does_not_take_its_tasks_back() -> None:
    mine = {TaskId(0, 0)}
    members = {
        "p1": member(1, offset_sums={TaskId(0, 0): 0}, previous_active=mine),
        "p2": member(2, offset_sums={TaskId(0, 0): LATEST_OFFSET}),
        "p3": member(3, offset_sums={TaskId(0, 0): 50_000}),  # a standby far ahead of p1
    }
    clients, _, _ = client_states(members)
    assert clients[1].prev_active == mine and clients[0].prev_active == frozenset()


def test_a_process_whose_member_runs_a_task_runs_it_whatever_its_other_members_report() -> None:
    """Two members under one process id (a state directory copied to another host): one runs
    0_0, the other reports a checkpoint of it. Merging them let the last member's checkpoint
    overwrite the running mark, so the process read as not running 0_0 (a standby of it,
    lagging) in one member order and as running it in the other."""
    t = TaskId(0, 0)
    for running_member, checkpoint_member in (("a", "b"), ("b", "a")):
        members = {
            running_member: member(1, offset_sums={t: LATEST_OFFSET}),
            checkpoint_member: member(1, offset_sums={t: 500, TaskId(0, 1): 700}),
            "z": member(2, offset_sums={TaskId(0, 1): 900}),
        }
        clients, _, _ = client_states(members)
        assert clients[0].prev_active == {t}, running_member
        assert clients[0].lags == {TaskId(0, 1): 200}


def test_two_caught_up_restarted_processes_the_least_lagging_gets_the_task_back() -> None:
    """Both restarted processes ran 0_0 (one after the other, while the third ran it in
    between) and are caught up on it: the one with the least lag gets it back, and between
    equal lags the smaller process id, whichever member ids they came back with."""
    t = TaskId(0, 0)
    p1, p2, interim = (str(uuid.UUID(int=i)) for i in (1, 2, 3))
    for p1_sum, home, other in ((600, p1, p2), (500, p1, p2), (400, p2, p1)):
        for first, second in (("a", "z"), ("z", "a")):
            members = {
                first: member(1, offset_sums={t: p1_sum}, previous_active=frozenset({t})),
                second: member(2, offset_sums={t: 500}, previous_active=frozenset({t})),
                "m": member(3, offset_sums={t: LATEST_OFFSET}),
            }
            clients = {c.process_id: c for c in client_states(members)[0]}
            assert t in clients[home].prev_active, (p1_sum, first)
            assert t not in clients[other].prev_active and t in clients[other].lags
            assert clients[interim].lags[t] == 0  # a warm holder


def test_a_checkpoint_beside_a_member_running_the_task_still_bounds_the_lags() -> None:
    """Process 1's one member runs 0_0 and its other holds a checkpoint of 30,000 (a copied
    state directory without endpoints, say); restarted process 2 comes back with 15,000. The
    merge keeps only process 1's running mark, but its member's checkpoint still tells that
    process 2 is at least 15,000 behind: not caught up, so 0_0 stays where it runs."""
    t = TaskId(0, 0)
    p1, p2 = (str(uuid.UUID(int=i)) for i in (1, 2))
    reports = [
        member(1, offset_sums={t: LATEST_OFFSET}),
        member(1, offset_sums={t: 30_000}),
        member(2, offset_sums={t: 15_000}, previous_active=frozenset({t})),
    ]
    for ids in (("a", "b", "c"), ("c", "b", "a")):
        clients = {c.process_id: c for c in client_states(dict(zip(ids, reports, strict=True)))[0]}
        assert clients[p1].prev_active == {t}, ids
        assert t not in clients[p2].prev_active and clients[p2].lags == {t: 15_000}


@settings(max_examples=max(10, settings.default.max_examples // 4))
@given(st.data())
def test_the_leaders_client_states_do_not_depend_on_member_ids(data: st.DataObject) -> None:
    """Member ids are new at every restart, and sort unlike process ids: the same processes
    reporting the same state must get the same history (hand-backs above all) whichever
    member ids they came back with (the same input, the same assignment)."""
    infos = data.draw(rejoining_members())
    renamed = data.draw(st.permutations(list(infos)))
    clients = []
    for ids in (list(infos), renamed):
        reports = zip(ids, infos.values(), strict=True)
        members = {m: MemberSubscription(TOPICS, i) for m, i in reports}
        clients.append(sorted(client_states(members)[0], key=lambda c: c.process_id))
    assert clients[0] == clients[1]


def test_merged_offset_sums_keep_the_running_mark_else_the_largest_sum() -> None:
    t, u = TaskId(0, 0), TaskId(0, 1)
    reports = [{t: LATEST_OFFSET, u: 5}, {t: 500, u: 300}, {u: 40}]
    for order in (reports, reports[::-1]):
        assert merge_offset_sums(order) == {t: LATEST_OFFSET, u: 300}
    assert merge_offset_sums([]) == {}


@pytest.mark.parametrize("high_availability", [False, True])
@pytest.mark.parametrize("lag", ["10", None, 1.5, -1])
def test_a_bad_recovery_lag_is_a_typed_error_before_lags_are_compared(
    lag: object, high_availability: bool
) -> None:
    """A member with local state makes the lags be compared with the option: the option is
    checked first, so a string is one clear error, not a TypeError from a comparison."""
    t = TaskId(0, 0)
    topology = Topology([Subtopology(0, ["a"], stores=["s"])], name="app")
    members = {
        "c1": MemberSubscription(
            {"a"},
            SubscriptionInfo(uuid.UUID(int=1), offset_sums={t: 5}, previous_active=frozenset({t})),
        )
    }
    with pytest.raises(AssignmentInputError, match="acceptable_recovery_lag must be an int >= 0"):
        assign_streams(
            topology,
            {"a": 1},
            members,
            acceptable_recovery_lag=lag,  # type: ignore[arg-type]
            high_availability=high_availability,
        )


def test_consumers_keep_their_tasks_within_a_process() -> None:
    members = {f"c{i}": member(1) for i in range(3)}
    first = assign_streams(TOPOLOGY, COUNTS, members)
    again = {
        m: member(
            1,
            offset_sums=dict.fromkeys(TOPOLOGY_TASKS, LATEST_OFFSET),
            previous_active=a.info.active,
        )
        for m, a in first.items()
    }
    second = assign_streams(TOPOLOGY, COUNTS, again)
    assert {m: a.info.active for m, a in second.items()} == {
        m: a.info.active for m, a in first.items()
    }


TOPOLOGY_TASKS = list(PartitionGrouper().group(TOPOLOGY, COUNTS))


@pytest.mark.parametrize(
    "counts",
    [
        {"orders": 6, "customers": 4, "returns": 3},  # co-partitioning broken
        {"orders": 6, "returns": 3},  # a source topic missing
    ],
)
def test_topic_trouble_is_an_error_code_for_every_member(
    counts: dict[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    members = {"a": member(1), "b": member(2)}
    with caplog.at_level(logging.ERROR):
        result = assign_streams(TOPOLOGY, counts, members)
    assert {a.info.error_code for a in result.values()} == {
        ErrorCode.INCOMPLETE_SOURCE_TOPIC_METADATA
    }
    assert all(a.partitions == () for a in result.values())
    assert "cannot assign tasks" in caplog.text


def test_a_leader_logs_a_topology_error_once_until_it_changes_or_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Members retry every 1 to 30 s while a source topic is missing, and the leader logged
    the same ERROR at every one of those rebalances. With the error it logged last (``Repeats``,
    kept by ``ProcessHost``) it logs an error once, again when it changes, its repeats at DEBUG,
    and one INFO line when tasks can be assigned again; without, each at ERROR as before."""
    members = {"a": member(1), "b": member(2)}
    logged = Repeats()
    rounds = [{"orders": 6, "customers": 6}] * 3 + [{"orders": 6, "returns": 3}, COUNTS, COUNTS]
    with caplog.at_level(logging.DEBUG, "streamassign.streams"):
        for counts in rounds:
            assign_streams(TOPOLOGY, counts, members, topology_errors=logged)
    lines = [
        (r.levelno, r.getMessage()) for r in caplog.records if r.name == "streamassign.streams"
    ]
    levels = [level for level, text in lines if "cannot assign tasks" in text]
    assert levels == [logging.ERROR, logging.DEBUG, logging.DEBUG, logging.ERROR]
    assert "returns" in lines[0][1] and "customers" in lines[3][1]  # the topics missing then
    assert "(the same error again logged at DEBUG)" in lines[0][1]
    again = [text for level, text in lines if level == logging.INFO]
    assert again == ["the topics are as the topology needs them now: assigning tasks again"]
    assert logged.reported is None
    caplog.clear()
    with caplog.at_level(logging.ERROR, "streamassign.streams"):
        for _ in range(2):
            assign_streams(TOPOLOGY, {"orders": 6}, members)
    assert [r.levelno for r in caplog.records] == [logging.ERROR] * 2


def test_repartition_topics_must_exist_with_their_resolved_count() -> None:
    topology = Topology(
        [
            Subtopology(0, ["in"], sink_topics=["rekeyed"]),
            Subtopology(1, ["rekeyed"], stores=["s"]),
        ],
        repartition_topics={"rekeyed": None},
        name="app",
    )
    members = {"a": MemberSubscription(topology.source_topics, SubscriptionInfo(uuid.UUID(int=1)))}
    missing = assign_streams(topology, {"in": 4}, members)
    wrong = assign_streams(topology, {"in": 4, "rekeyed": 3}, members)
    right = assign_streams(topology, {"in": 4, "rekeyed": 4}, members)
    assert missing["a"].info.error_code == wrong["a"].info.error_code != ErrorCode.NONE
    assert right["a"].info.error_code == ErrorCode.NONE
    assert TopicPartition("rekeyed", 3) in right["a"].partitions


def test_old_member_lacking_a_topic_gets_the_ids_it_subscribes_to(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A member announcing no topology (protocol 2, an older release) that lacks a topic of
    the leader's (added in its version) runs its share of the other ids, none of the id
    reading that topic; one WARNING per episode names its process, not the member."""
    members = {
        "old": MemberSubscription({"orders", "customers"}, SubscriptionInfo(uuid.UUID(int=1))),
        "new": member(2),
    }
    logged = Repeats()
    with caplog.at_level(logging.WARNING):
        result = assign_streams(TOPOLOGY, COUNTS, members, topology_versions=logged)
        again = assign_streams(TOPOLOGY, COUNTS, members, topology_versions=logged)
    assert result["old"].info.error_code == ErrorCode.NONE
    old_tasks = set(result["old"].info.active)
    assert old_tasks and {t.subtopology for t in old_tasks} == {0}
    assert {tp.topic for tp in result["old"].partitions} <= {"orders", "customers"}
    assert set(TOPOLOGY_TASKS) == old_tasks | set(result["new"].info.active)
    assert set(again["old"].info.active) == old_tasks
    lines = [r.getMessage() for r in caplog.records if "does not subscribe to" in r.message]
    assert len(lines) == 1
    assert "process 00000000-0000-0000-0000-000000000001" in lines[0]
    assert "returns" in lines[0] and "subtopology id 1" in lines[0]


def test_old_member_subscribing_to_none_of_the_leader_topics_gets_nothing() -> None:
    members = {
        "old": MemberSubscription({"elsewhere"}, SubscriptionInfo(uuid.UUID(int=1))),
        "new": member(2),
    }
    result = assign_streams(TOPOLOGY, COUNTS, members)
    assert result["old"].partitions == () and result["old"].info.error_code == ErrorCode.NONE
    assert len(result["new"].info.active) == 9


@pytest.mark.parametrize("high_availability", [False, True])
def test_old_member_lacking_a_topic_keeps_standbys_of_the_ids_it_subscribes_to(
    high_availability: bool,
) -> None:
    members = {
        "old": MemberSubscription({"orders", "customers"}, SubscriptionInfo(uuid.UUID(int=1))),
        "new": member(2),
    }
    result = assign_streams(
        TOPOLOGY, COUNTS, members, num_standby_replicas=1, high_availability=high_availability
    )
    stateful = {t for t in TOPOLOGY_TASKS if t.subtopology == 0}
    standbys = set(result["old"].info.standby) | set(result["new"].info.standby)
    assert standbys == stateful
    assert {t.subtopology for t in result["old"].info.active} == {0}


def test_unreadable_member_is_a_process_of_its_own_without_history() -> None:
    members = {"a": member(1), "b": MemberSubscription(TOPICS, None)}
    result = assign_streams(TOPOLOGY, COUNTS, members)
    assert len(result["b"].info.active) in (4, 5)


def test_answers_at_the_highest_version_everyone_supports() -> None:
    members = {"a": member(1), "b": member(2, version=1, latest_supported_version=1)}
    result = assign_streams(TOPOLOGY, COUNTS, members)
    assert {a.info.common_version for a in result.values()} == {1}
    assert all(not a.info.warmup for a in result.values())
    upgraded = assign_streams(TOPOLOGY, COUNTS, {"a": member(1), "b": member(2)})
    assert {a.info.common_version for a in upgraded.values()} == {LATEST_VERSION}


def test_shutdown_request_reaches_every_member() -> None:
    members = {"a": member(1), "b": member(2, error_code=ErrorCode.SHUTDOWN_REQUESTED)}
    result = assign_streams(TOPOLOGY, COUNTS, members)
    assert {a.info.error_code for a in result.values()} == {ErrorCode.SHUTDOWN_REQUESTED}


def test_partition_leader_racks_steer_new_tasks_and_tags_steer_standbys() -> None:
    """Tasks go to a process in their partitions' leader rack; a standby avoids its active's
    zone (KIP-925 / KIP-708 style hints carried in the subscription and the cluster)."""
    members = {
        f"p{p}": member(p + 1, rack=rack, client_tags={"zone": zone})
        for p, (rack, zone) in enumerate([("east", "z1"), ("west", "z2")])
    }
    tasks = PartitionGrouper().group(TOPOLOGY, COUNTS)
    # Without hints p0 would get the even partitions (dealt in turn): lead them from the west.
    leaders = {tp: "west" if tp.partition % 2 == 0 else "east" for t in tasks for tp in tasks[t]}
    result = assign_streams(
        TOPOLOGY, COUNTS, members, num_standby_replicas=1, partition_racks=leaders
    )
    east, west = result["p0"].info.active, result["p1"].info.active
    # p0 has room for 5 of the 9 tasks and 4 are led from the east: one must cross.
    off_rack = [t for t in east if t.partition % 2 == 0] + [t for t in west if t.partition % 2]
    assert len(off_rack) == 1
    # Two zones, one standby: every standby sits in the other zone than its active.
    assert result["p0"].info.standby <= west and result["p1"].info.standby <= east


def test_task_racks_take_the_rack_most_partitions_lead_from() -> None:
    from streamassign.streams import task_racks

    t = TaskId(0, 0)
    a, b, c = (TopicPartition(x, 0) for x in "abc")
    assert task_racks({t: [a, b, c]}, {a: "r2", b: "r1", c: "r2"}) == {t: "r2"}
    assert task_racks({t: [a, b]}, {a: "r2", b: "r1"}) == {t: "r1"}  # tie: smallest name
    assert task_racks({t: [a]}, {}) == {}
