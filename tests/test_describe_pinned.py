"""``describe`` against a leader pinned below protocol 3 (``ProcessHost(max_version=2)``, the
rolling-upgrade pin): it reads no topology announcement, only each process's subscription, so
a process of another version can be given tasks its guard refuses. Also the shared-id rule
over the members that may get tasks, and the styled lines built from parts."""

from __future__ import annotations

import uuid
from pathlib import Path

import attrs
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata as Metadata

from streamassign import Subtopology, TaskId, Topology
from streamassign.aiokafka.describe import (
    GroupQuality,
    GroupView,
    RawMember,
    describe_bytes,
    quality,
    to_json,
)
from streamassign.aiokafka.streams import PROTOCOL_NAME, ProcessHost
from streamassign.aiokafka.wire import encode_assignment, readable_subscriptions
from streamassign.protocol import SubscriptionInfo
from streamassign.streams import assign_streams, decode_subscriptions
from streamassign.versions import subtopology_topic_indices

from .test_describe import meta

#: The leader's version: id 2 reads b.
V2 = Topology([Subtopology(0, ["a"]), Subtopology(1, ["n"]), Subtopology(2, ["b"])])
#: The old version: id 1 reads b and n, no id 2; it subscribes to every source topic of V2.
V1B = Topology([Subtopology(0, ["a"]), Subtopology(1, ["b", "n"])])
#: An old version without n: a leader of V2 not reading announcements gives it ids 0 and 2
#: (it subscribes to a and b), and its guard refuses id 2 (a reused id).
V1 = Topology([Subtopology(0, ["a"]), Subtopology(1, ["b"])])
#: An application sharing the group id by mistake: none of V2's topics (blind).
ELSEWHERE = Topology([Subtopology(0, ["z"])])
COUNTS = {"a": 4, "b": 4, "n": 4}


def pid(k: int) -> uuid.UUID:
    return uuid.UUID(int=k)


def subscription(
    topology: Topology, k: int, version: int = 3, endpoint: str | None = None
) -> tuple[list[str], bytes]:
    topics = sorted(topology.source_topics)
    indices = subtopology_topic_indices(topology, topics) if version >= 3 else {}
    info = SubscriptionInfo(
        pid(k),
        endpoint=endpoint or f"p{k}:80",
        version=version,
        latest_supported_version=version,
        subtopology_topic_indices=indices,
    )
    return topics, info.encode()


def described(
    members: dict[str, tuple[list[str], bytes]], leader_version: int, leader: Topology = V2
) -> list[RawMember]:
    subscriptions = decode_subscriptions(leader, COUNTS, members, leader_version)
    assignments = assign_streams(leader, COUNTS, subscriptions, leader_version=leader_version)
    return [
        RawMember(
            m,
            "client",
            "/h",
            meta(topics, data),
            encode_assignment(assignments[m].partitions, assignments[m].info.encode()),
        )
        for m, (topics, data) in members.items()
    ]


def view_of(raw: list[RawMember], group: str = "g") -> GroupView:
    return describe_bytes(group, "Stable", "consumer", PROTOCOL_NAME, raw)


def printed(view: GroupView, score: GroupQuality | None = None) -> str:
    from streamassign.cli.console import _Stdout
    from streamassign.cli.describe_tables import _print_group

    console = _Stdout(width=400, record=True)
    _print_group(console, view, score or quality(view))
    return console.export_text()


def pinned_group() -> list[RawMember]:
    """A live rolling-upgrade group: the pinned leader (p1, V2 at protocol 2), p2 of V1B and p3 of
    V2 at protocol 3. The leader reads no announcement: p2 subscribes to every source topic,
    so it gets tasks of id 2, which its guard refuses."""
    members = {
        "m1": subscription(V2, 1, version=2),
        "m2": subscription(V1B, 2),
        "m3": subscription(V2, 3),
    }
    return described(members, leader_version=2)


def test_a_pinned_leaders_group_withholds_nothing_and_names_the_tasks_that_run_nowhere() -> None:
    view = view_of(pinned_group())
    p2 = str(pid(2))
    held = view.processes()[p2].assignment.active
    refused = {t for t in held if t.subtopology == 2}
    assert refused, "the pinned leader gives the V1B process tasks of id 2"
    assert view.announcements_read() is False
    assert view.withheld() == {} and view.blind() == []
    assert view.stalled() == {p2: refused}
    score = quality(view)
    (line,) = [p for p in score.problems if "run nowhere" in p]
    assert line.startswith(f"{len(refused)} task")
    assert "reads no topology announcement" in line and f"{p2} (version " in line
    assert all(str(t) in line for t in refused)
    assert not any("run on the other processes" in p for p in score.problems)
    two = next(b for b in score.per_subtopology if b.subtopology == 2)
    assert two.withheld == 0 and two.tasks == 4  # every process counted, its tasks too
    assert "run nowhere" in " ".join(printed(view).split())


def test_a_pinned_process_host_says_2_in_its_own_subscription(tmp_path: Path) -> None:
    """A pinned leader is a member whose subscription says its ``max_version`` (2) as the
    latest it supports, so assignments below 3 always come with some member supporting 2;
    but that member may be one describe cannot read (a null topic name: see the next test),
    so every member it reads supporting 3 does not make the leader a reading one, nor a
    pinned one. With a pinned leader and a V1 process (announcing, not subscribing to n), the
    leader reads the V1 process by its subscription (a, b): ids 0 and 2, not 1. Id 2 is
    reused (V1 has none), so its guard refuses the 2_x it holds; describe tells the pinned
    leader from that task and names it."""
    host = ProcessHost(
        V2, bootstrap_servers="127.0.0.1:1", application_id="g", state_dir=tmp_path, max_version=2
    )
    try:
        meta_ = host.assignors[0].metadata(sorted(V2.source_topics))
    finally:
        host.state.close()
    own = SubscriptionInfo.decode(meta_.user_data)
    assert own.latest_supported_version == 2
    members = {
        "m1": (list(meta_.subscription), own.encode()),
        "m2": subscription(V1, 2),
        "m3": subscription(V2, 3),
    }
    view = view_of(described(members, leader_version=2))
    assert view.assignment_version() == 2
    held = view.processes()[str(pid(2))].assignment.active
    assert {t.subtopology for t in held} == {0, 2}
    assert view.announcements_read() is False
    assert view.stalled() == {str(pid(2)): frozenset(t for t in held if t.subtopology == 2)}
    assert any("run nowhere" in p for p in quality(view).problems)


def test_a_member_describe_cannot_read_may_be_the_one_supporting_2() -> None:
    """A protocol-3 leader assigns at 2 for a 2-only member (m2) whose topic list holds a
    null: the leader keeps m2's user data, and so its latest supported version, while
    describe cannot read m2. Every member describe reads then supports 3, and still the
    leader reads announcements: it withholds from p3 (V1: announcing, not subscribing to n)
    the ids whose topics V1 lacks; a leader reading none would have withheld only id 1 (p3
    does not subscribe to n), and p3 holds only id 0: describe reads it as a reading leader
    and says the reading is unknown."""
    topics = sorted(V2.source_topics)
    on_wire = {
        "m1": subscription(V2, 1),
        "m2": ([*topics, None], subscription(V2, 2, version=2)[1]),
        "m3": subscription(V1, 3),
    }
    read = readable_subscriptions({m: Metadata.decode(meta(*sub)) for m, sub in on_wire.items()})
    assert read["m2"][0] == ()  # the leader reads m2 as subscribing to nothing
    subscriptions = decode_subscriptions(V2, COUNTS, read, 3)
    assignments = assign_streams(V2, COUNTS, subscriptions, leader_version=3)
    p3 = {t.subtopology for t in assignments["m3"].info.active}
    assert p3 == {0}, "the leader reads p3's announcement: id 0 only"
    raw = [
        RawMember(
            m,
            "client",
            "/h",
            meta(*on_wire[m]),
            encode_assignment(assignments[m].partitions, assignments[m].info.encode()),
        )
        for m in on_wire
    ]
    view = view_of(raw)
    assert view.assignment_version() == 2
    unread = [m for m in view.members if m.undecodable is not None]
    assert [m.member_id for m in unread] == ["m2"]
    assert {m.supported_version for m in view.members if m.undecodable is None} == {3}
    assert view.announcements_read() is None
    assert view.withheld() == {str(pid(3)): frozenset({1, 2})}
    assert view.stalled() == {}
    # A leader reading none would read p3 by its subscription (a, b: ids 0 and 2) and may
    # have given it the same: what it gave does not tell. The doubt says what such a leader
    # would withhold, not that it withholds nothing.
    (doubt,) = [p for p in quality(view).problems if "topology announcements is unknown" in p]
    assert "reads none: it withholds only the ids reading a topic a process does not" in doubt
    assert "withholds no id" not in doubt


def test_a_protocol_3_leader_is_read_as_before() -> None:
    members = {"m1": subscription(V2, 1), "m2": subscription(V1B, 2), "m3": subscription(V2, 3)}
    view = view_of(described(members, leader_version=3))
    assert view.announcements_read() is True
    assert view.withheld() == {str(pid(2)): frozenset({2})}
    assert view.stalled() == {}
    problems = quality(view).problems
    assert any("run on the other processes" in p for p in problems)
    assert not any("run nowhere" in p for p in problems)


def test_when_it_is_unknown_whether_the_leader_reads_announcements_the_line_says_so() -> None:
    """A protocol-2 member (p4, V1: blind either way) brings the assignments to version 2, so
    the leader may be it or a protocol-3 one; p2 (V1B) holds no id-2 task, which either
    leader would do. Which ids p2 is withheld is then unknown: the members' differing ids."""
    members = {
        "m1": subscription(V2, 1),
        "m2": subscription(V1B, 2),
        "m3": subscription(V2, 3),
        "m4": subscription(V1, 4, version=2),
    }
    view = view_of(described(members, leader_version=3))
    assert view.assignment_version() == 2
    assert not {t for t in view.processes()[str(pid(2))].assignment.active if t.subtopology == 2}
    assert view.announcements_read() is None
    assert view.stalled() == {}
    problems = quality(view).problems
    (line,) = [p for p in problems if "topology announcements is unknown" in p]
    assert line.startswith("subtopology id 1 reads other topics in other topology versions")
    assert "no process holds a task of an id its version lacks" in line
    assert not any("run on the other processes" in p for p in problems)


def test_a_blind_member_sharing_a_process_id_makes_no_clash() -> None:
    """A process id shared by a blind member: pid 1 on p:80 (V2, protocol 3) and on q:80
    (protocol 2, subscribing to none of V2's topics: it may get no task). The leader keys and
    checks only the members that may get tasks, and so does describe; two such members still
    clash."""
    members = {
        "m0": subscription(V2, 1, endpoint="p:80"),
        "m1": subscription(ELSEWHERE, 1, version=2, endpoint="q:80"),
        "m2": subscription(V2, 2),
    }
    view = view_of(described(members, leader_version=3))
    assert view.shared_process_ids == ()
    assert not any("copied state directory" in p for p in quality(view).problems)
    members["m1"] = subscription(V2, 1, endpoint="q:80")
    view = view_of(described(members, leader_version=3))
    ((shared, _),) = [(c.process_id, c.endpoints) for c in view.shared_process_ids]
    assert str(shared) == str(pid(1))


def test_a_split_that_depends_on_the_unknown_reading_says_it_is_unknown() -> None:
    """Pid 3 on p3:80 and q3:80 (V2 at protocol 2: a copied state directory), and m4 on p3:80
    announcing a topology reading none of the leader's topics (ELSEWHERE), under a pinned
    leader assigning at 2. A leader reading announcements keys m4 to p3:80 with m2; this one,
    reading none, finds m4 blind (its subscription has none of the leader's topics) and keys
    only m2 there. The bytes do not tell which: describe splits as a reading leader and,
    though no member announces ids that differ, says in one line which member is in doubt,
    that it holds no task, and what settles it."""
    members = {
        "m1": subscription(V2, 1, version=2),
        "m2": subscription(V2, 3, version=2, endpoint="p3:80"),
        "m3": subscription(V2, 3, version=2, endpoint="q3:80"),
        "m4": subscription(ELSEWHERE, 3, endpoint="p3:80"),
    }
    view = view_of(described(members, leader_version=2))
    assert view.announcements_read() is None
    assert view.split_by_unknown_reading and view.reading_unknown()
    assert {m.member_id: m.process for m in view.members}["m4"] == f"{pid(3)}#p3:80"
    # A doubt affecting no task is a note (lead's decision), in the JSON's quality.notes.
    score = quality(view)
    assert not [p for p in score.problems if "announces a topology" in p]
    (line,) = score.notes
    assert to_json(view, score)["quality"]["notes"] == [line]
    assert line.startswith(f"member m4 of process id {pid(3)} at p3:80 announces a topology")
    assert f"counts it in {pid(3)}#p3:80 (shown), one pinned below protocol 3 under" in line
    assert "it holds no task, so no task is affected" in line
    assert line.endswith("it settles once every member supports protocol 3")
    members["m4"] = subscription(V2, 3, endpoint="p3:80")  # subscribes to n: either reading
    view = view_of(described(members, leader_version=2))
    assert not view.split_by_unknown_reading and not view.reading_unknown()
    assert quality(view).notes == ()


def test_a_withheld_line_true_under_both_readings_stands_beside_the_split_doubt() -> None:
    """The split of pid 3 depends on the unknown reading (m4, as above), and p5, an older
    release announcing none and not subscribing to n, is withheld id 1 under either reading.
    Its line stands as it is, named by what the leader reads it by (its subscription), with
    no doubt attached; the doubt is one line of its own naming the member in doubt."""
    members = {
        "m1": subscription(V2, 1, version=2),
        "m2": subscription(V2, 3, version=2, endpoint="p3:80"),
        "m3": subscription(V2, 3, version=2, endpoint="q3:80"),
        "m4": subscription(ELSEWHERE, 3, endpoint="p3:80"),
        "m5": subscription(V1, 5, version=2),
    }
    view = view_of(described(members, leader_version=2))
    assert view.reading_unknown() and view.only_split_unknown()
    assert view.withheld() == {str(pid(5)): frozenset({1})}
    problems = quality(view).problems
    (withheld,) = [p for p in problems if "gives no task of" in p]
    assert (
        f"announcing none (an older release?), not subscribing to n on 1 process ({pid(5)}) "
        "lacks id 1; those tasks run on the other processes" in withheld
    )
    assert "unknown" not in withheld and "version unnamed" not in withheld
    assert "to 1 process that lacks its topics of it" in withheld
    assert not [p for p in problems if "unknown" in p]
    (doubt,) = quality(view).notes
    text = " ".join(printed(view).split())
    assert f"note: {' '.join(doubt.split())}" in text
    assert "problem: member m4" not in text
    assert doubt.startswith(f"member m4 of process id {pid(3)} at p3:80 announces a topology")


def test_a_process_subscribing_to_none_of_the_leader_topics_gets_no_task() -> None:
    """An older release (protocol 2) of another application sharing the group id subscribes
    to none of V2's topics: either leader gives it nothing, and the line says that, not that
    it misses some topic."""
    members = {"m1": subscription(V2, 1), "m2": subscription(ELSEWHERE, 2, version=2)}
    view = view_of(described(members, leader_version=3))
    assert view.blind() == [str(pid(2))]
    (line,) = [p for p in quality(view).problems if "gives no task of" in p]
    assert (
        f"1 process ({pid(2)}) announcing none and subscribing to none of its source topics "
        "gets no task" in line
    )


def test_the_styled_lines_print_a_trailing_backslash_as_it_is() -> None:
    members = {"m1": subscription(V2, 1), "m3": subscription(V2, 3)}
    view = view_of(described(members, leader_version=3), group="x\\\\")
    score = attrs.evolve(quality(view), problems=("topic a\\", "[b]x[/b] \\[red]"))
    lines = printed(view, score).splitlines()
    assert lines[0].startswith("x\\\\: Stable, protocol ")
    assert "problem: topic a\\" in lines
    assert "problem: [b]x[/b] \\[red]" in lines


def test_every_task_of_the_pinned_group_is_somewhere() -> None:
    """Sanity: the tasks the problem line names are in the Processes table (a stall is
    visible, not hidden by a withheld column)."""
    view = view_of(pinned_group())
    assert TaskId(2, 0) in view.tasks
    assert set(view.tasks) == set().union(*(v.assignment.active for v in view.processes().values()))
