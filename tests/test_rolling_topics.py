"""Rolling deploys that add a source topic (docs/streams.md, "Rolling deploys that change the
topology"): members announce each subtopology id's source topics (protocol version 3), and the
leader applies the member guard's subset rule to them. (A) A topic added to an existing
subtopology: processes of the new version run the old leader's tasks of that id (its partitions
are inputs of theirs). (B) A new leader whose topology reads a topic old processes do not
subscribe to keeps them (it gave them nothing before): they run the ids they share, never a
partition of a topic they do not subscribe to."""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import attrs
import hypothesis
import pytest
from hypothesis import strategies as st

from streamassign import Subtopology, TaskId, Topology, protocol, streams
from streamassign.aiokafka import ProcessHost
from streamassign.errors import EncodeError
from streamassign.protocol import (
    LATEST_OFFSET,
    MAX_TASK_IDS,
    AssignmentInfo,
    ProtocolError,
    SubscriptionInfo,
)
from streamassign.repeats import Repeats
from streamassign.streams import (
    MemberAssignment,
    MemberSubscription,
    assign_streams,
    decode_subscriptions,
)
from streamassign.versions import announced_sources, mismatched_tasks, subtopology_topic_indices

from .strategies import varint

#: v1: ``0 [t1]``, ``1 [b]``; v2 adds t2 to subtopology 0 (A); REUSED gives id 1 to n; FRESH
#: adds n with the fresh id 7; NARROW renumbers b to 0.
V1 = Topology(
    [Subtopology(0, ["t1"], stores=["s0"]), Subtopology(1, ["b"], stores=["s1"])], name="r"
)
V2 = Topology(
    [Subtopology(0, ["t1", "t2"], stores=["s0"]), Subtopology(1, ["b"], stores=["s1"])],
    name="r",
)
REUSED = Topology([Subtopology(0, ["t1"]), Subtopology(1, ["n"], stores=["s1"])], name="r")
FRESH = Topology([Subtopology(0, ["t1"]), Subtopology(1, ["b"]), Subtopology(7, ["n"])], name="r")
NARROW = Topology([Subtopology(0, ["b"], stores=["s1"])], name="r")
VERSIONS = {"v1": V1, "v2": V2, "reused": REUSED, "fresh": FRESH, "narrow": NARROW}
COUNTS = {"t1": 6, "t2": 6, "b": 6, "n": 6}


def member(
    pid: int, topology: Topology, announces: bool = True, **fields: object
) -> MemberSubscription:
    """A consumer of a ``topology`` process as the leader reads it: subscribed to every source
    topic, announcing them per id at protocol 3 (else speaking protocol 2)."""
    version = 3 if announces else 2
    info = SubscriptionInfo(
        uuid.UUID(int=pid),
        endpoint=f"h{pid}:1",
        version=version,
        latest_supported_version=version,
        subtopology_topic_indices=subtopology_topic_indices(topology, topology.source_topics)
        if announces
        else {},
        **fields,  # type: ignore[arg-type]
    )
    decoded = SubscriptionInfo.decode(info.encode())
    return MemberSubscription(topology.source_topics, decoded)


def actives(result: dict[str, MemberAssignment], prefix: str) -> list[int]:
    return [len(a.info.active) for m, a in sorted(result.items()) if m.startswith(prefix)]


def roll(
    rolled: int, old: Topology, new: Topology, leader: Topology
) -> dict[str, MemberSubscription]:
    """Six processes, the first ``rolled`` of ``new``, the rest of ``old``; each ran a share of
    the tasks before (offset sums)."""
    members = {}
    for pid in range(6):
        topology = new if pid < rolled else old
        sums = {
            TaskId(s, p): 100
            for s in leader.subtopology_ids
            for p in range(6)
            if (p + s) % 6 == pid
        }
        members[f"p{pid}"] = member(pid + 1, topology, offset_sums=sums)
    return members


# -- (A) a topic added to an existing subtopology, the old version leading ------------------


def test_an_old_leader_gives_processes_that_added_a_topic_their_share_of_that_id() -> None:
    """Five of six processes on v2 (t2 added to 0), the v1 leader last: before, every 0_x
    moved to the one v1 process (its hash differed: 7 of 12 there, where 2 would do). Now the
    v2 processes run their 0_x (t1-p is an input of their own 0_p), and none is refused."""
    result = assign_streams(V1, COUNTS, roll(5, V1, V2, V1), num_standby_replicas=1)
    assert max(actives(result, "p")) == 2
    for pid in range(5):
        given = result[f"p{pid}"].info
        assert mismatched_tasks(V2, given.active, given.topics) == {}
        assert {tp.topic for tp in result[f"p{pid}"].partitions} <= {"t1", "b"}


def test_a_new_leader_gives_old_processes_no_task_of_the_id_that_reads_the_new_topic() -> None:
    """The reverse of (A): a v2 leader, v1 processes announcing ``0 [t1]``: the leader's 0_p
    reads t2-p too, which a v1 process neither subscribes to nor runs. Its 1_x it keeps."""
    result = assign_streams(V2, COUNTS, roll(2, V1, V2, V2))
    for pid in range(2, 6):
        given = result[f"p{pid}"]
        assert given.info.active and {t.subtopology for t in given.info.active} == {1}
        assert {tp.topic for tp in given.partitions} == {"b"}
    assert sorted(t for a in result.values() for t in a.info.active) == sorted(
        TaskId(s, p) for s in (0, 1) for p in range(6)
    )


# -- (B) a new leader reading a topic the old processes do not subscribe to -----------------


def test_a_new_leader_keeps_old_processes_that_announce_their_topics(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A fresh id with a new topic (the documented deploy), a v2 canary leading: the old
    processes announce their topics, so they share ids 0 and 1 (before: nothing, the canary
    ran the application alone). Old processes that announce nothing (protocol 2) are read by
    their subscription: they share the ids whose topics they subscribe to (before: nothing),
    and the leader says why they get none of id 7."""
    members = {"new": member(1, FRESH), "old-a": member(2, V1), "old-b": member(3, V1)}
    result = assign_streams(FRESH, COUNTS, members)
    assert all(result[m].info.active for m in members)
    # All 6 of 7_x stay on the canary; how the moved ones balance is the post-pass's own.
    assert len(result["new"].info.active) < 18
    for m in ("old-a", "old-b"):
        assert {t.subtopology for t in result[m].info.active} <= {0, 1}
    quiet = {"new": member(1, FRESH), "old": member(2, V1, announces=False)}
    with caplog.at_level(logging.WARNING, "streamassign.streams"):
        result = assign_streams(FRESH, COUNTS, quiet)
    old_ids = {t.subtopology for t in result["old"].info.active}
    assert old_ids and old_ids <= {0, 1}
    assert {tp.topic for tp in result["old"].partitions} <= {"t1", "b"}
    assert any("does not subscribe to n" in r.getMessage() for r in caplog.records)


def test_with_no_process_allowed_an_id_its_tasks_reach_no_member_that_does_not_subscribe(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Only old processes (a pure call: a real leader is a member of its own version): none
    may run id 7, whose topic n they do not subscribe to. The post-pass leaves such a task
    where the assignor put it; it is then not assigned (one ERROR), never handed over with
    partitions the consumer would refuse (aiokafka asserts they are subscribed)."""
    members = {"a": member(1, V1), "b": member(2, V1)}
    with caplog.at_level(logging.ERROR, "streamassign.streams"):
        result = assign_streams(FRESH, COUNTS, members)
    for m, given in result.items():
        assert {tp.topic for tp in given.partitions} <= {"t1", "b"}, m
        assert all(t.subtopology != 7 for t in given.info.active)
    assert any("may run 7_" in r.getMessage() for r in caplog.records)


# -- the wire: bounds and garbage ------------------------------------------------------------


def test_announced_topics_are_indices_into_the_sorted_subscription() -> None:
    indices = subtopology_topic_indices(V2, ["t2", "b", "t1", "b"])
    assert indices == {0: frozenset({1, 2}), 1: frozenset({0})}
    assert announced_sources(["t2", "t1", "b"], indices) == {0: {"t1", "t2"}, 1: {"b"}}
    # A subtopology reading a topic outside the subscription is not announced: the leader
    # gives no task of it.
    assert subtopology_topic_indices(V2, ["b", "t1"]) == {1: frozenset({0})}
    with pytest.raises(ProtocolError, match="topic index 3 of a subscription of 3 topics"):
        announced_sources(["t2", "t1", "b"], {0: frozenset({3})})


def _v3_subscription(tail: bytes) -> bytes:
    """A version-3 subscription with nothing but ``tail`` as its announced topics."""
    head = (3).to_bytes(4, "big") * 2 + uuid.UUID(int=1).bytes
    # endpoint, offset sums, previous actives, nonce, error code, rack, tags
    return head + varint(0) * 7 + tail


def test_the_decoder_bounds_announced_topics() -> None:
    assert SubscriptionInfo.decode(
        _v3_subscription(varint(1) + varint(4) + varint(2) + varint(0) + varint(9))
    ).subtopology_topic_indices == {4: frozenset({0, 9})}
    with pytest.raises(ProtocolError, match="exceeds the"):  # a count past the bytes left
        SubscriptionInfo.decode(_v3_subscription(varint(1) + varint(0) + varint(2**40)))
    one_topic = varint(1) + varint(0)  # an id's entry: one topic, index 0
    for garbage, match in [
        (varint(2) + (varint(4) + one_topic) * 2, "after 4"),  # an id twice
        (varint(2) + varint(5) + one_topic + varint(4) + one_topic, "after 5"),  # ids unsorted
        (varint(1) + varint(4) + varint(0), "no topic"),  # an id with no topic
        (varint(1) + varint(4) + varint(2) + varint(3) + varint(1), "do not ascend"),
        (varint(1) + varint(4) + varint(2) + varint(3) + varint(3), "do not ascend"),
    ]:
        with pytest.raises(ProtocolError, match=match):
            SubscriptionInfo.decode(_v3_subscription(garbage))
    many = varint(1) + varint(0) + varint(600) + varint(1) * 600
    with mock.patch("streamassign.protocol.MAX_TASK_IDS", 500):
        with pytest.raises(ProtocolError, match="MAX_TASK_IDS"):
            SubscriptionInfo.decode(_v3_subscription(many))
        with pytest.raises(EncodeError, match="MAX_TASK_IDS"):  # the writer refuses it too
            SubscriptionInfo(
                uuid.UUID(int=1), subtopology_topic_indices={0: frozenset(range(600))}
            ).encode()


def test_an_index_past_the_subscription_is_garbage_the_leader_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The member is then one announcing nothing, read by its subscription: it gets tasks
    of the ids whose topics it subscribes to (its guard refuses what it cannot run), none of
    the others."""
    bad = SubscriptionInfo(uuid.UUID(int=2), subtopology_topic_indices={0: frozenset({7})})
    good = SubscriptionInfo(
        uuid.UUID(int=1), subtopology_topic_indices=subtopology_topic_indices(V1, V1.source_topics)
    )
    data = {
        "good": (sorted(V1.source_topics), good.encode()),
        "bad": (["t1"], bad.encode()),
        "bad-all": (sorted(V1.source_topics), bad.encode()),
    }
    with caplog.at_level(logging.WARNING, "streamassign.streams"):
        decoded = decode_subscriptions(V1, COUNTS, data)
    warned = [r.getMessage() for r in caplog.records]
    assert any("member bad: subtopology 0 announces topic index 7" in m for m in warned), warned
    assert decoded["bad"].info is not None and decoded["bad"].info.subtopology_topic_indices == {}
    result = assign_streams(V1, COUNTS, decoded)
    assert {t.subtopology for t in result["bad"].info.active} <= {0}
    assert {tp.topic for tp in result["bad"].partitions} <= {"t1"}
    assert result["bad-all"].info.active


def test_a_process_announces_its_topics_by_its_subscription(tmp_path: Path) -> None:
    host = ProcessHost(V2, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path)
    try:
        meta = host.assignors[0].metadata(["t2", "b", "t1"])
        sent = SubscriptionInfo.decode(meta.user_data)
        assert announced_sources(meta.subscription, sent.subtopology_topic_indices) == {
            0: {"t1", "t2"},
            1: {"b"},
        }
    finally:
        host.state.close()


# -- properties ------------------------------------------------------------------------------


@st.composite
def mixed_groups(
    draw: st.DrawFn, shared_ids: bool = False
) -> tuple[Topology, dict[str, MemberSubscription]]:
    """A leader's topology and a group of 1-5 processes of any version (the leader's own
    process among them, as in a real group), 1-2 consumers each, announcing or not, with
    some history. ``shared_ids``: up to 6 processes with ids drawn from 1-3, so processes of
    different versions often share one id and endpoint (the leader sees them as one client)."""
    leader_version = draw(st.sampled_from(sorted(VERSIONS)))
    others = st.lists(st.sampled_from(sorted(VERSIONS)), max_size=5 if shared_ids else 4)
    processes = [leader_version, *draw(others)]
    members = {}
    for k, version in enumerate(processes):
        pid = draw(st.integers(1, 3)) if shared_ids else k + 1
        announces = k == 0 or draw(st.booleans())
        for thread in range(draw(st.integers(1, 2))):
            running = draw(
                st.frozensets(st.builds(TaskId, st.sampled_from([0, 1, 7]), st.integers(0, 5)))
            )
            sums = {t: LATEST_OFFSET for t in running}
            members[f"m{k}-{thread}"] = member(pid, VERSIONS[version], announces, offset_sums=sums)
    return VERSIONS[leader_version], members


def _topology_of(sub: MemberSubscription) -> Topology:
    return next(t for t in VERSIONS.values() if t.source_topics == sub.topics)


def _every_copy(info: AssignmentInfo) -> frozenset[TaskId]:
    return info.active | info.standby | info.warmup


def check_mixed_group(
    group: tuple[Topology, dict[str, MemberSubscription]],
    standbys: int,
    high_availability: bool,
    order: random.Random,
    guarded: Callable[[AssignmentInfo], frozenset[TaskId]],
) -> None:
    """The leader's assignment of ``group`` does not depend on the order its members come in;
    no member gets a partition of a topic it does not subscribe to, nor an announcing member
    a task of ``guarded`` (of its assignment) its own guard would refuse; and every task is
    active exactly once."""
    leader, members = group
    options = {
        "num_standby_replicas": standbys,
        "high_availability": high_availability,
        "end_offsets": {TaskId(s, p): 100 for s in (0, 1, 7) for p in range(6)},
        "now_ms": 0,
    }
    result = assign_streams(leader, COUNTS, members, **options)  # type: ignore[arg-type]
    shuffled = list(members.items())
    order.shuffle(shuffled)
    assert assign_streams(leader, COUNTS, dict(shuffled), **options) == result  # type: ignore[arg-type]
    ran: list[TaskId] = []
    for m, given in result.items():
        assert {tp.topic for tp in given.partitions} <= members[m].topics, m
        info = members[m].info
        if info is not None and info.subtopology_topic_indices:
            own = _topology_of(members[m])
            assert mismatched_tasks(own, guarded(given.info), given.info.topics) == {}, m
        ran += given.info.active
    assert sorted(ran) == [TaskId(s, p) for s in leader.subtopology_ids for p in range(6)]


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(
    group=mixed_groups(),
    standbys=st.integers(0, 1),
    high_availability=st.booleans(),
    order=st.randoms(use_true_random=False),
)
def test_mixed_groups_never_hand_out_an_unsubscribed_or_refused_task(
    group: tuple[Topology, dict[str, MemberSubscription]],
    standbys: int,
    high_availability: bool,
    order: random.Random,
) -> None:
    """Whatever versions share the group: no member gets a partition of a topic it does not
    subscribe to; no announcing member gets an active its own guard would refuse; every task
    is active exactly once (the leader's own process may run every one); and the result does
    not depend on the order the members come in."""
    check_mixed_group(group, standbys, high_availability, order, lambda info: info.active)


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(
    versions=st.lists(st.sampled_from(["v1", "v2", "fresh"]), min_size=1, max_size=5),
    announce=st.lists(st.booleans(), min_size=5, max_size=5),
    standbys=st.integers(0, 2),
    high_availability=st.booleans(),
    history=st.integers(0, 2**12),
)
def test_processes_reading_at_least_the_leaders_topics_leave_the_post_pass_a_no_op(
    versions: list[str],
    announce: list[bool],
    standbys: int,
    high_availability: bool,
    history: int,
) -> None:
    """A v1 leader and processes whose every v1 id reads the same topics or more (v1, v2 with
    t2 added, a fresh id): the assignment is the assignor's, member by member (the post-pass
    patched out gives the same)."""
    members = {}
    for pid, version in enumerate(versions):
        previous = frozenset(
            TaskId(s, p) for s in (0, 1) for p in range(6) if history >> (pid + 2 * p + s) & 1
        )
        members[f"m{pid}"] = member(
            pid + 1, VERSIONS[version], announce[pid], previous_active=previous
        )
    options = {
        "num_standby_replicas": standbys,
        "high_availability": high_availability,
        "now_ms": 0,
    }
    result = assign_streams(V1, COUNTS, members, **options)  # type: ignore[arg-type]
    with mock.patch("streamassign.streams.move_to_eligible_clients", lambda p, *a, **k: p):
        assert assign_streams(V1, COUNTS, members, **options) == result  # type: ignore[arg-type]


def test_a_budget_sized_announcement_keeps_only_the_leaders_ids() -> None:
    """A member announcing as many ids as the decode budget allows (2.6 MB) costs the leader
    its bytes: only the leader's ids are kept, and one other (it still announces)."""
    ids = MAX_TASK_IDS // 2 - 1
    tail = varint(ids) + b"".join(varint(i) + varint(1) + varint(0) for i in range(ids))
    members = {
        "good": (sorted(V2.source_topics), member(2, V2).info.encode()),  # type: ignore[union-attr]
        "odd": (["b"], _v3_subscription(tail)),
    }
    decoded = decode_subscriptions(V2, {"t1": 2, "t2": 2, "b": 2}, members)
    odd = decoded["odd"]
    assert odd.info is not None
    assert odd.info.subtopology_topic_indices == {0: {0}, 1: {0}, 2: {0}}
    assert odd.announced is not None and odd.announced.any
    # It announces id 0 reading b only: it gets the tasks of id 1 (b) and none of id 0.
    result = assign_streams(V2, {"t1": 2, "t2": 2, "b": 2}, decoded)
    assert {t.subtopology for t in result["odd"].info.active} <= {1}


def test_withheld_tasks_are_logged_once_and_left_out_of_the_host_maps(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Where no member may run an id (a pure call: only v1 processes under a
    FRESH leader, none subscribing to n), a task of it is withheld from the member the
    assignor put it on. One ERROR per member per episode, not per round, and the host maps do not
    route queries of it to that member's endpoint."""
    members = {"a": member(1, V1), "b": member(2, V1)}
    withheld = Repeats()
    with caplog.at_level(logging.DEBUG, "streamassign.streams"):
        for _ in range(3):
            result = assign_streams(FRESH, COUNTS, members, withheld=withheld)
            running = {t for a in result.values() for t in a.info.active}
            hosts = result["a"].info.active_by_host
            assert set().union(*hosts.values()) == running
            assert all(t.subtopology != 7 for t in running)
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 2, errors  # one per member, in the first round only
        assert all("not assigned to member" in e for e in errors), errors
        assign_streams(FRESH, COUNTS, {"a": member(1, FRESH)}, withheld=withheld)
    assert "every task is assigned again" in caplog.records[-1].getMessage()


def _sharing_one_id(sums: dict[str, dict[TaskId, int]]) -> dict[str, MemberSubscription]:
    """A v2 and a v1 process sharing process id 1 with no endpoint (a copied state
    directory): one client to the leader; each reports ``sums`` (what it ran)."""
    out = {}
    for name, topology in (("a-new", V2), ("b-old", V1)):
        sub = member(1, topology, offset_sums=sums.get(name, {}))
        assert sub.info is not None
        out[name] = attrs.evolve(sub, info=attrs.evolve(sub.info, endpoint=None))
    return out


def test_a_process_id_shared_across_versions_runs_every_task_on_a_member_that_can(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The client of a shared process id is eligible for id 0 because its v2
    member may run it; the thread split gives every task of id 0 to that member (before:
    0_1, 0_3, 0_5 landed on the v1 member, which does not subscribe to t2, and were withheld
    every round). Rounds 2-4: each member reports what it ran, as ``ProcessHost`` does."""
    sums: dict[str, dict[TaskId, int]] = {}
    every = {TaskId(s, p) for s in (0, 1) for p in range(6)}
    with caplog.at_level(logging.ERROR, "streamassign.streams"):
        for _ in range(4):
            result = assign_streams(V2, COUNTS, _sharing_one_id(sums))
            old = result["b-old"]
            assert all(t.subtopology == 1 for t in old.info.active | old.info.standby), old
            assert {tp.topic for tp in old.partitions} <= {"t1", "b"}
            actives = [t for a in result.values() for t in a.info.active]
            assert sorted(actives) == sorted(every)
            sums = {m: {t: LATEST_OFFSET for t in a.info.active} for m, a in result.items()}
    assert not caplog.records, [r.getMessage() for r in caplog.records]


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(
    group=mixed_groups(shared_ids=True),
    standbys=st.integers(0, 1),
    high_availability=st.booleans(),
    order=st.randoms(use_true_random=False),
)
def test_shared_ids_across_versions_run_every_task_on_a_member_that_can(
    group: tuple[Topology, dict[str, MemberSubscription]],
    standbys: int,
    high_availability: bool,
    order: random.Random,
) -> None:
    """Whatever versions share a process id: every task is active exactly once (the leader's
    own member may run every id, so its client is eligible for each), on a member subscribing
    to its topics; no announcing member gets an active, standby or warmup its own guard
    would refuse; and the result does not depend on the order the members come in."""
    check_mixed_group(group, standbys, high_availability, order, _every_copy)


def test_a_process_id_shared_with_a_member_that_runs_tasks_is_not_called_idle(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A NARROW process may run none of a v2 leader's ids: logged as getting no task at all,
    unless its process id is shared with a v2 member (one client, which runs tasks)."""
    for pid, idle in ((2, True), (1, False)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, "streamassign.streams"):
            assign_streams(V2, COUNTS, {"a": member(1, V2), "b": member(pid, NARROW)})
        warnings = [r.getMessage() for r in caplog.records]
        assert len(warnings) == 1 and "announce id 0 reading [b]" in warnings[0], warnings
        assert ("they get no task at all" in warnings[0]) == idle, warnings


#: A leader whose every id is fresh: a V1 process may run none of them.
FRESH_ONLY = Topology([Subtopology(10, ["t1"]), Subtopology(11, ["b"])], name="r")


@pytest.mark.parametrize("endpoints", [("h2:1", "h3:1"), ("h2:1", "h2:1")])
def test_a_copy_that_may_run_none_of_a_fresh_leaders_ids_is_logged_once(
    caplog: pytest.LogCaptureFixture, endpoints: tuple[str, str]
) -> None:
    """A V1 process sharing its process id with a process of the leader's
    version gets no task in a fresh-id roll. At two endpoints (two processes) it is logged as
    a process getting no task at all; at one (one process) as a member whose process's tasks
    go to its other members. Once per episode either way."""
    old, copy = (
        attrs.evolve(sub, info=attrs.evolve(sub.info, endpoint=e))
        for sub, e in zip((member(2, V1), member(2, FRESH_ONLY)), endpoints, strict=True)
    )
    members = {"p1": member(1, FRESH_ONLY), "p2": old, "p2copy": copy}
    versions = Repeats()
    with caplog.at_level(logging.WARNING, "streamassign.streams"):
        for _ in range(3):
            result = assign_streams(FRESH_ONLY, COUNTS, members, topology_versions=versions)
            assert not result["p2"].info.active and not result["p2"].info.standby
            assert result["p2copy"].info.active and result["p1"].info.active
    warnings = [r.getMessage() for r in caplog.records if "another topology" in r.getMessage()]
    assert len(warnings) == 1, warnings
    pid = uuid.UUID(int=2)
    if endpoints[0] != endpoints[1]:
        assert f"processes {pid} at h2:1 announce none of this leader's ids" in warnings[0]
        assert "they get no task at all" in warnings[0]
    else:
        assert f"members p2 of process {pid} announce none of this leader's ids" in warnings[0]
        assert "the process's tasks go to its other members" in warnings[0]
    assert "p2copy" not in warnings[0].split("(this leader")[0]


def test_the_leader_reads_and_resolves_each_announced_topology_once_a_round() -> None:
    """Members of one topology version send the same tail: a wide app's leader read it once
    per member (300 members x 1,000 topics: 560 ms of decode on its event loop; 35 now).
    Six members of two versions: two tails read, two resolutions, every member as before."""
    members = {
        f"m{pid}": (sorted(t.source_topics), member(pid, t).info.encode())  # type: ignore[union-attr]
        for pid, t in enumerate([V1, V1, V1, V2, V2, V2])
    }
    reads = mock.Mock(wraps=protocol._read_topic_indices)
    resolutions = mock.Mock(wraps=streams.announced_sources)
    with (
        mock.patch.object(protocol, "_read_topic_indices", reads),
        mock.patch.object(streams, "announced_sources", resolutions),
    ):
        decoded = decode_subscriptions(V2, COUNTS, members)
    assert reads.call_count == 2 and resolutions.call_count == 2
    for name, sub in decoded.items():
        alone = decode_subscriptions(V2, COUNTS, {name: members[name]})[name]
        assert (sub.info, streams._announcement(V2, sub)) == (
            alone.info,
            streams._announcement(V2, alone),
        )
