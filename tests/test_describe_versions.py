"""``describe`` during a rolling deploy that changes the topology: each member's topology version
(protocol 3 announces each subtopology id's source topics), named as the group leader's log line
names its own, and one problem line when members read other topics for one id. Groups are the
bytes a real leader (``assign_streams``) hands out over subscriptions ``ProcessHost`` would send
(v1 ``0 (a)``, ``1 (b)``; v2 ``0 (a)``, ``1 (n)``, ``2 (b)``: id 1 reused)."""

from __future__ import annotations

import json
import logging
import re
import uuid

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamassign import Subtopology, TaskId, Topology
from streamassign.aiokafka.describe import (
    RawMember,
    announced_version,
    describe_bytes,
    leader_reading,
    quality,
    to_json,
)
from streamassign.aiokafka.streams import PROTOCOL_NAME
from streamassign.aiokafka.wire import encode_assignment
from streamassign.protocol import SubscriptionInfo
from streamassign.streams import assign_streams, decode_subscriptions
from streamassign.versions import (
    subtopology_fingerprints,
    subtopology_topic_indices,
    topology_version,
)

from .describe_polls import followed_views
from .tables import assert_whole_tables
from .test_describe import MEMBERS_COLUMNS, meta, printed

V1 = Topology([Subtopology(0, ["a"], stores=["ca"]), Subtopology(1, ["b"], stores=["cb"])])
V2 = Topology(
    [
        Subtopology(0, ["a"], stores=["ca"]),
        Subtopology(1, ["n"], stores=["cn"]),
        Subtopology(2, ["b"], stores=["cb"]),
    ]
)
#: The short names the leaders of each version log for their own topology.
V1_VERSION = topology_version(subtopology_fingerprints(V1))
V2_VERSION = topology_version(subtopology_fingerprints(V2))
COUNTS = {"a": 2, "b": 2, "n": 2}
#: Processes: p1 and p2 of v2 (p1 two consumers), p3 of v1, p4 of v1 on protocol 2.
PIDS = {k: uuid.UUID(f"{d * 8}-0000-0000-0000-00000000000{k}") for k, d in enumerate("abcd", 1)}


def subscription(topology: Topology, pid: int, version: int = 3) -> tuple[list[str], bytes]:
    """What a ``ProcessHost`` of ``topology`` sends: every source topic, and from protocol 3
    each subtopology's topics by their place among them."""
    topics = sorted(topology.source_topics)
    indices = subtopology_topic_indices(topology, topics) if version >= 3 else {}
    info = SubscriptionInfo(
        PIDS[pid],
        endpoint=f"p{pid}:80",
        version=version,
        latest_supported_version=version,
        subtopology_topic_indices=indices,
    )
    return topics, info.encode()


def led_by(leader: Topology, members: dict[str, tuple[list[str], bytes]]) -> list[RawMember]:
    """The group as DescribeGroups returns it once ``leader``'s topology's leader assigned it."""
    subscriptions = decode_subscriptions(leader, COUNTS, members)
    assignments = assign_streams(leader, COUNTS, subscriptions)
    return [
        RawMember(
            member,
            "client",
            "/10.0.0.1",
            meta(topics, data),
            encode_assignment(assignments[member].partitions, assignments[member].info.encode()),
        )
        for member, (topics, data) in members.items()
    ]


def mixed_members() -> dict[str, tuple[list[str], bytes]]:
    return {
        "m1": subscription(V2, 1),
        "m1b": subscription(V2, 1),
        "m2": subscription(V2, 2),
        "m3": subscription(V1, 3),
        "m4": subscription(V1, 4, version=2),
    }


def test_each_member_shows_the_version_the_leaders_log_line_names(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="streamassign.streams"):
        raw = led_by(V2, mixed_members())
    (logged,) = re.findall(r"this leader, version (\w+)", caplog.text)
    view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, raw)
    versions = {m.member_id: m.topology_version for m in view.members}
    assert versions["m1"] == versions["m1b"] == versions["m2"] == logged
    assert versions["m3"] is not None and versions["m3"] != logged
    assert versions["m4"] is None  # protocol 2: announces nothing, shows nothing new
    m3 = next(m for m in view.members if m.member_id == "m3")
    assert m3.announced == {0: {"a"}, 1: {"b"}} and m3.announcement_error is None
    text = printed(view)
    assert_whole_tables(text, MEMBERS_COLUMNS)
    assert f"topology {logged}" in text and f"topology {versions['m3']}" in text


#: An application sharing the group id by mistake: it reads none of V1's or V2's topics.
ELSEWHERE = Topology([Subtopology(0, ["z"])])
ELSEWHERE_VERSION = topology_version(subtopology_fingerprints(ELSEWHERE))


def test_the_ids_the_leader_withholds_are_one_problem_named_against_the_leaders_version() -> None:
    """Led by v2: p3 (v1) announces id 1 reading b, not the leader's n, and no id 2; p4
    announces an application sharing the group id by mistake (none of the leader's ids; at
    protocol 3, so the assignments say the leader reads announcements). The leader's version
    comes from its topology, which every assignment carries."""
    members = {**mixed_members(), "m4": subscription(ELSEWHERE, 4)}
    view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, led_by(V2, members))
    new, old = V2_VERSION, V1_VERSION
    assert view.leader_version() == new
    assert view.withheld() == {str(PIDS[3]): {1, 2}, str(PIDS[4]): {0, 1, 2}}
    assert view.processes()[str(PIDS[3])].assignment.active <= {TaskId(0, 0), TaskId(0, 1)}
    (problem,) = [p for p in quality(view).problems if p.startswith("the leader (topology")]
    assert problem.startswith(
        f"the leader (topology version {new}) gives no task of subtopology ids 0 (a); 1 (n); "
        f"2 (b) to 2 processes that lack its topics of it: version {old} on 1 process "
        f"({PIDS[3]}) lacks ids 1, 2 | version {ELSEWHERE_VERSION} on 1 process ({PIDS[4]}) "
        "lacks ids 0, 1, 2; "
    )
    assert "docs/streams.md#rolling-deploys-that-change-the-topology" in problem
    text = " ".join(printed(view).split())
    assert f"leader's topology version {new}" in text
    assert "problem: the leader (topology version" in text
    data = json.loads(json.dumps(to_json(view, quality(view))))
    assert problem in data["quality"]["problems"]
    assert data["leader_topology_version"] == new
    assert data["quality"]["withheld_subtopologies"] == {
        str(PIDS[3]): [1, 2],
        str(PIDS[4]): [0, 1, 2],
    }
    members = {m["member_id"]: m for m in data["members"]}
    assert members["m3"]["topology_version"] == old
    assert members["m3"]["announced_sources"] == {"0": ["a"], "1": ["b"]}
    assert members["m4"]["topology_version"] == ELSEWHERE_VERSION


def test_an_old_member_lacking_a_topic_is_withheld_only_the_ids_reading_it() -> None:
    """p4 (v1 on protocol 2, announcing nothing) subscribes to a and b, not n: the leader
    (and describe, reading it back) gives it ids 0 and 2, none of id 1 (n). v2 reused id 1
    (b moved to 2), so p4's own guard refuses the 2_x it gets: the leader cannot tell (the
    same as for an old member subscribing to every topic; keep ids stable)."""
    view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, led_by(V2, mixed_members()))
    assert view.withheld()[str(PIDS[4])] == {1}
    assert {t.subtopology for t in view.processes()[str(PIDS[4])].assignment.active} <= {0, 2}


def test_balance_rows_leave_out_the_processes_the_leader_withholds_an_id_from() -> None:
    """Led by v1: id 1 (b) is withheld from p1 and p2 (v2 reads n there); its two tasks run on
    p3, which reads as balanced over the processes that may run them, and says so."""
    members = {"m1": subscription(V2, 1), "m2": subscription(V2, 2), "m3": subscription(V1, 3)}
    view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, led_by(V1, members))
    assert view.leader_version() == V1_VERSION
    one = next(b for b in quality(view).per_subtopology if b.subtopology == 1)
    assert (one.withheld, one.fewest, one.most, one.balanced) == (2, 2, 2, True)
    from streamassign.cli.console import _Stdout
    from streamassign.cli.describe_tables import _print_group

    console = _Stdout(width=160, record=True)
    _print_group(console, view, quality(view))
    text = console.export_text()
    assert "subtopology 1: actives per process (of 2; 2 processes withheld) │ 2-2 balanced" in text
    assert "UNBALANCED" not in text


def test_ids_that_differ_without_effect_are_no_problem() -> None:
    """A version whose id reads more topics than the leader's (a topic added) runs the
    leader's tasks: the leader withholds nothing and logs nothing, and describe says nothing."""
    v1b = Topology([Subtopology(0, ["a"], stores=["ca"]), Subtopology(1, ["b", "n"])])
    members = {"m1": subscription(V1, 1), "m2": subscription(v1b, 2)}
    view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, led_by(V1, members))
    assert view.withheld() == {} and view.leader_version() == V1_VERSION
    assert not [p for p in quality(view).problems if "subtopology id" in p], quality(view)


def test_the_problem_line_lists_at_most_five_ids() -> None:
    wide = Topology([Subtopology(i, [f"t{i}"]) for i in range(12)])
    renumbered = Topology([Subtopology(i, [f"t{(i + 1) % 12}"]) for i in range(12)])
    counts = {f"t{i}": 1 for i in range(12)}
    members = {"m1": subscription(wide, 1), "m2": subscription(renumbered, 2)}
    subscriptions = decode_subscriptions(wide, counts, members)
    assignments = assign_streams(wide, counts, subscriptions)
    raw = [
        RawMember(
            m,
            metadata=meta(topics, data),
            assignment=encode_assignment(assignments[m].partitions, assignments[m].info.encode()),
        )
        for m, (topics, data) in members.items()
    ]
    view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, raw)
    (problem,) = [p for p in quality(view).problems if "topology version" in p]
    assert "subtopology ids 0 (t0); 1 (t1); 2 (t2); 3 (t3); 4 (t4); ... (7 more) to" in problem
    assert "lacks ids 0, 1, 2, 3, 4, ... (7 more)" in problem


def test_without_the_leaders_topology_differing_ids_are_named_as_before() -> None:
    """An error assignment carries no topology: the ids members read differently, and the
    leader's log names its version."""
    members = mixed_members()
    raw = [
        RawMember(m, metadata=meta(topics, data), assignment=encode_assignment([], b""))
        for m, (topics, data) in members.items()
    ]
    view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, raw)
    assert view.leader_topics() is None and view.leader_version() is None
    (problem,) = [p for p in quality(view).problems if p.startswith("subtopology id")]
    assert problem.startswith(
        f"subtopology id 1 reads other topics in other topology versions: version {V2_VERSION} "
        f"on 2 processes ({PIDS[1]}, {PIDS[2]}) reads id 1 (n) | version {V1_VERSION} on 1 "
        f"process ({PIDS[3]}) reads id 1 (b); "
    )
    assert "(the leader's log names its version)" in problem


def test_a_topic_only_the_other_version_reads_is_not_called_missing_from_the_cluster() -> None:
    """Led by v1, no one is assigned ``n`` (only v2 reads it): not "missing from the cluster"
    but a topic the leader's topology does not read. The leader's side (p3 of protocol 3, p4
    of 2) supports what the v2 processes do: no older release is claimed."""
    view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, led_by(V1, mixed_members()))
    problems = [p for p in quality(view).problems if "subscribed topic" in p]
    assert problems == [
        f"1 subscribed topic the leader's topology (version {V1_VERSION}) does not read, so no "
        f"member is assigned a partition of it: n; subscribed by 2 processes ({PIDS[1]}, "
        f"{PIDS[2]}) whose id 1 reads it: the leader runs another topology version (a rolling "
        "deploy?): the tasks reading it wait until a process subscribing to it leads (none "
        "will if the leader's is the new version, which dropped it), see "
        "docs/streams.md#rolling-deploys-that-change-the-topology"
    ]


#: A new version of the topology: V1 and a fresh id 7 reading a new topic (ids kept stable).
FRESH = Topology([*V1.subtopologies, Subtopology(7, ["x"], stores=["cx"])])


def fresh_subscription(pid: int, version: int) -> tuple[list[str], bytes]:
    """A process of the new release (protocol 3) subscribing at ``version``: 3 announces its
    topology; under a leader of protocol 2 it follows it down to 2 (``sub v2/3``, no
    announcement)."""
    topics = sorted(FRESH.source_topics)
    info = SubscriptionInfo(
        PIDS[pid],
        endpoint=f"p{pid}:80",
        version=version,
        latest_supported_version=3,
        subtopology_topic_indices=(
            subtopology_topic_indices(FRESH, topics) if version >= 3 else {}
        ),
    )
    return topics, info.encode()


def test_under_an_older_release_leader_a_new_versions_topic_waits_for_its_upgrade() -> None:
    """An old leader (protocol 2, V1) does not know the new version's id 7, so no one is
    assigned ``x``, which exists: describe said "missing from the cluster?". The members not
    subscribing ``x`` (the leader among them) support protocol 2 only, those subscribing to it
    3, announcing (``sub v3/3``) or not (``sub v2/3``): the tasks wait for a subscriber to lead.
    Only the lower version is claimed, not an older release: a process of this release started
    with ``max_version=2`` (the documented rolling-upgrade pin) sends these very bytes, and its
    remedy is lifting the cap, not an upgrade."""
    members = {
        "m1": subscription(V1, 1, version=2),
        "m2": fresh_subscription(2, 3),
        "m3": fresh_subscription(3, 2),
    }
    view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, led_by(V1, members))
    assert [m.supported_version for m in view.members] == [2, 3, 3]
    (line,) = [p for p in quality(view).problems if "subscribed topic" in p]
    assert line == (
        f"1 subscribed topic the leader's topology (version {V1_VERSION}) does not read, so no "
        f"member is assigned a partition of it: x; subscribed by 2 processes ({PIDS[2]}, "
        f"{PIDS[3]}) whose id 7 reads it: the leader supports protocol version at most 2, the "
        "processes subscribing to it 3 (an older release leads, or one capped with "
        "max_version): the tasks reading it wait until a process subscribing to it leads "
        "(upgrade the leader, or lift its cap; none will if the leader's is the new version, "
        "which dropped it), see docs/streams.md#rolling-deploys-that-change-the-topology"
    )
    assert "older release (" not in line and "is upgraded" not in line
    assert "missing from the cluster" not in printed(view)
    # Led by the new version, x is assigned: no line.
    view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, led_by(FRESH, members))
    assert not [p for p in quality(view).problems if "subscribed topic" in p]


def test_the_clusters_metadata_says_whether_such_a_topic_exists() -> None:
    """describe looks up the unassigned topics' metadata (``cluster_partitions``): the line
    then says ``x`` exists, or that it is missing too; the JSON has the counts."""
    members = {"m1": subscription(V1, 1, version=2), "m2": fresh_subscription(2, 3)}
    view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, led_by(V1, members))
    assert view.unassigned_topics() == {"x"} and view.cluster_partitions is None
    for counts, said in (
        ({"x": 6}, "x (in the cluster: 6 partitions); subscribed by"),
        ({}, "x (missing from the cluster); subscribed by"),
        ({"x": 0}, "x (in the cluster: no partition leader yet); subscribed by"),
    ):
        looked_up = attrs.evolve(view, cluster_partitions=counts)
        (line,) = [p for p in quality(looked_up).problems if "subscribed topic" in p]
        assert f"no member is assigned a partition of it: {said} 1 process" in line, line
        assert "the leader supports protocol version at most 2" in line
        assert to_json(looked_up, quality(looked_up))["cluster_partitions"] == counts


def test_a_topic_of_the_leaders_topology_no_one_is_assigned_is_still_missing() -> None:
    """The leader's own topic without partitions (every member subscribes to it) stays
    "missing from the cluster?", beside a topic the leader does not read."""
    members = {"m1": subscription(V1, 1, version=2), "m2": fresh_subscription(2, 3)}
    raw = led_by(V1, members)
    view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, raw)
    # As a leader that found no partitions of b assigns: none of its partitions to anyone.
    stripped = attrs.evolve(
        view,
        members=tuple(
            attrs.evolve(m, partitions=tuple(tp for tp in m.partitions if tp.topic != "b"))
            for m in view.members
        ),
    )
    problems = [p for p in quality(stripped).problems if "subscribed topic" in p]
    assert problems[0] == (
        "1 subscribed topic without a partition assigned to any member (missing from the "
        "cluster?): b"
    )
    assert problems[1].startswith("1 subscribed topic the leader's topology")


def test_a_group_of_one_version_shows_it_and_no_problem() -> None:
    """p4 on protocol 2 announces nothing (shows none) and subscribes to every source topic."""
    members = {"m1": subscription(V2, 1), "m2": subscription(V2, 2), "m4": subscription(V2, 4, 2)}
    view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, led_by(V2, members))
    assert {m.topology_version for m in view.members} == {V2_VERSION, None}
    assert not [p for p in quality(view).problems if "topology" in p]
    text = " ".join(printed(view).split())
    assert f"process(es), leader's topology version {V2_VERSION}" in text
    assert "problem" not in text


def test_a_group_before_protocol_3_prints_as_before() -> None:
    members = {"m1": subscription(V1, 1, 2), "m2": subscription(V1, 2, 2)}
    view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, led_by(V1, members))
    assert all(m.topology_version is None and not m.announced for m in view.members)
    assert not re.search(r"\btopology\b", printed(view))  # "subtopology" is as before


def test_garbage_in_the_tail_keeps_the_member_and_is_one_problem_line() -> None:
    """As the leader reads it: the identity before the tail again, without history (offset
    sums, previous actives) or announcement; the member keeps its tasks in the view."""
    topics, good = subscription(V2, 2)
    members = {"m1": subscription(V2, 1), "m2": (topics, good)}
    raw = led_by(V2, members)
    tails = {
        "ids not ascending": good[:-3] + bytes([1, 1, 1]),  # id 2's entry as id 1 again
        "cut short": good[:-1],
        "an index past the subscription": good[:-1] + bytes([7]),  # of 3 topics
    }
    for what, data in tails.items():
        damaged = RawMember("m2", "client", "/10.0.0.1", meta(topics, data), raw[1].assignment)
        view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, [raw[0], damaged])
        m2 = next(m for m in view.members if m.member_id == "m2")
        assert m2.undecodable is None and m2.process == str(PIDS[2]), what
        assert m2.active and m2.topology_version is None and m2.announcement_error, what
        (problem,) = [p for p in quality(view).problems if "topology" in p]
        assert problem == (
            f"topology announcement unreadable from 1 process ({PIDS[2]}): "
            f"{m2.announcement_error}; the leader reads it as announcing none"
        ), what
        assert "problem: topology announcement unreadable" in printed(view), what
        assert to_json(view, quality(view))["members"][1]["announcement_error"], what


def test_garbage_before_the_tail_is_still_undecodable() -> None:
    topics, good = subscription(V2, 1)
    raw = RawMember("m1", metadata=meta(topics, good[:30]))
    (m,) = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, [raw]).members
    assert m.undecodable and m.undecodable.startswith("subscription:")
    assert not m.subscription_only  # no assignment to read


def test_a_member_whose_subscription_is_garbage_keeps_the_tasks_the_leader_gave_it() -> None:
    """The leader takes such a member as a process of its own (its member id), without
    history, and assigns it tasks: describe reads its assignment and shows them, and never
    says those tasks have no active."""
    topics, good = subscription(V2, 2)
    raw = led_by(V2, {"m1": subscription(V2, 1), "m2": (topics, good[:30])})
    view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, raw)
    m2 = next(m for m in view.members if m.member_id == "m2")
    assert m2.undecodable and m2.undecodable.startswith("subscription:")
    assert m2.subscription_only and m2.active and m2.process == "m2"
    assert view.processes()["m2"].assignment.active == m2.active
    score = quality(view)
    assert not [p for p in score.problems if "actives" in p], score.problems
    assert score.metrics.clients == 2
    text = " ".join(printed(view).split())
    assert "member m2: undecodable: subscription:" in text
    assert "its assignment is read (a process of its own)" in text
    data = to_json(view, score)
    assert data["assignment"]["m2"]["active"] == sorted(str(t) for t in m2.active)


@given(st.binary(max_size=12), st.integers(min_value=0, max_value=40))
def test_any_tail_decodes_or_says_why(tail: bytes, cut: int) -> None:
    """A protocol 3 subscription with any bytes for its tail (and its end cut anywhere):
    describe, quality, the JSON and the tables never raise."""
    topics, good = subscription(V2, 1)
    data = good[: max(len(good) - cut, 0)] + tail
    view = describe_bytes(
        "g", "Stable", "consumer", PROTOCOL_NAME, [RawMember("m", metadata=meta(topics, data))]
    )
    json.dumps(to_json(view, quality(view)))
    printed(view)


def test_the_short_name_is_the_leaders_for_every_topology() -> None:
    """``announced_version`` spells out ``versions.subtopology_fingerprints`` over topics a
    member announces: pinned to it over the topologies here."""
    for topology in (V1, V2, Topology([Subtopology(4, ["x", "y"]), Subtopology(9, ["z"])])):
        announced = {s: topology.subtopology(s).source_topics for s in topology.subtopology_ids}
        leader = topology_version(subtopology_fingerprints(topology))
        assert announced_version(announced) == leader


def test_watch_shows_a_process_restarted_on_another_version_that_kept_its_tasks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``follow`` yields a view whose processes' topology versions changed, though no task
    moved (the new version reads the same topics for the ids it runs)."""
    v1_again = Topology([Subtopology(0, ["a"]), Subtopology(1, ["b"]), Subtopology(5, ["n"])])
    before = {"m1": subscription(V1, 1), "m2": subscription(V1, 2)}
    after = {"m1": subscription(V1, 1), "m2": subscription(v1_again, 2)}
    views = [
        describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, led_by(V1, members))
        for members in (before, before, after, after)
    ]
    assert views[0].processes() == views[2].processes()  # no task moved

    shown = followed_views(monkeypatch, views)
    assert shown == [views[0], views[2]]
    assert {m.topology_version for m in shown[1].members} == {
        V1_VERSION,
        announced_version({0: {"a"}, 1: {"b"}, 5: {"n"}}),
    }


def test_garbage_on_an_id_the_leader_lacks_is_not_called_announcing_none() -> None:
    """The leader drops ids its topology lacks (but the first) before it checks indices: a bad
    index on id 6 leaves it reading ids 0 and 1; an index past the subscription on a leader's
    id is read as announcing none, as the line says."""
    topics = ["a", "b"]
    indices = {0: frozenset([0]), 1: frozenset([1]), 5: frozenset([0])}
    lines = {}
    for bad_id in (6, 1):
        sent = {**indices, bad_id: frozenset([9])}
        info = SubscriptionInfo(PIDS[2], endpoint="p2:80", subtopology_topic_indices=sent)
        members = {"m1": subscription(V1, 1), "m2": (topics, info.encode())}
        leader = decode_subscriptions(V1, COUNTS, members)["m2"].announced
        view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, led_by(V1, members))
        (lines[bad_id],) = [p for p in quality(view).problems if "unreadable" in p]
        m2 = next(m for m in view.members if m.member_id == "m2")
        assert leader is not None
        assert (leader_reading(m2, V1.subtopology_ids) or {}) == leader.sources, bad_id
    assert lines[6].endswith(
        "subtopology 6 announces topic index 9 of a subscription of 2 topics; on ids the "
        "leader's topology lacks: the leader reads its other ids"
    )
    assert lines[1].endswith("; the leader reads it as announcing none")


def test_a_process_whose_members_run_two_versions_is_withheld_only_what_none_of_them_runs() -> None:
    """One process id on a member of each version (the leader's rule per member: a process
    gets an id one of its members may run, its threads split accordingly)."""
    members = {"m1": subscription(V1, 1), "m1v2": subscription(V2, 1), "m2": subscription(V2, 2)}
    view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, led_by(V1, members))
    assert view.withheld() == {str(PIDS[2]): {1}}
