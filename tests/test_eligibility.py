"""Properties of the per-subtopology eligibility post-pass (``streamassign.eligibility``) as
``assign_streams`` runs it: a strict no-op while no process announces topics lacking one of
the leader's, and, when it acts, a valid assignment whatever the member order, with the moved tasks'
standbys kept where eligible processes allow (docs/streams.md, rolling deploys)."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any
from unittest import mock

import hypothesis
from hypothesis import strategies as st

import streamassign.streams as streams_module
from streamassign import ClientState, StickyTaskAssignor, Subtopology, TaskId, Topology
from streamassign.eligibility import (
    GroupEligibility,
    MemberReading,
    group_eligibility,
    move_to_eligible_clients,
)
from streamassign.protocol import LATEST_OFFSET, NEVER, SubscriptionInfo
from streamassign.streams import MemberAssignment, MemberSubscription, ProbingMemory
from streamassign.versions import subtopology_topic_indices

V1 = Topology(
    [Subtopology(0, ["a"], stores=["ca"]), Subtopology(1, ["b"], stores=["cb"])], name="upg"
)
V2 = Topology(  # id 1 reused for a new topic: V1's 1_x are not V2's
    [
        Subtopology(0, ["a"], stores=["ca", "ca2"]),
        Subtopology(1, ["n"], stores=["cn"]),
        Subtopology(2, ["b"], stores=["cb"]),
    ],
    name="upg",
)
V4 = Topology(  # a fresh id only: no difference
    [
        Subtopology(0, ["a"], stores=["ca"]),
        Subtopology(1, ["b"], stores=["cb"]),
        Subtopology(7, ["n"], stores=["cn"]),
    ],
    name="upg",
)
#: Process kinds: "same" announces V1's topics per id, "fresh" V4's, "reused" V2's; "old"
#: speaks version 2 only, "max2" speaks 3 but the group is at 2 (neither announces);
#: "garbage" has a subscription nobody could read.
MATCHING_KINDS = ("same", "fresh", "old", "max2")


@st.composite
def groups(draw: Any, kinds: tuple[str, ...]) -> dict[str, Any]:
    """A group of 1 to 6 processes of ``kinds``, 1 to 3 consumers each, with random history."""
    partitions = draw(st.integers(1, 6))
    tasks = [TaskId(s, p) for s in (0, 1) for p in range(partitions)]
    processes = draw(st.lists(st.sampled_from(kinds), min_size=1, max_size=6))
    members = {}
    for pid, kind in enumerate(processes):
        for thread in range(draw(st.integers(1, 3))):
            ran = draw(st.sets(st.sampled_from(tasks), max_size=3))
            copies = draw(st.dictionaries(st.sampled_from(tasks), st.sampled_from([0, 50, 100])))
            members[f"m{pid}-{thread}"] = _member(pid, kind, frozenset(ran), copies)
    return {
        "members": members,
        "kinds": processes,
        "partitions": partitions,
        "standbys": draw(st.integers(0, 2)),
        "high_availability": draw(st.booleans()),
    }


def _member(
    pid: int, kind: str, ran: frozenset[TaskId], copies: dict[TaskId, int]
) -> MemberSubscription:
    if kind == "garbage":
        return MemberSubscription(frozenset("abn"), None)
    history: dict[str, Any] = {
        "previous_active": ran,
        "offset_sums": copies,
        "endpoint": f"h{pid}:1",
    }
    if kind in ("old", "max2"):
        info = SubscriptionInfo(
            uuid.UUID(int=pid + 1),
            version=2,
            latest_supported_version=2 if kind == "old" else 3,
            **history,
        )
        return MemberSubscription(frozenset(V1.source_topics), info)
    topology = {"same": V1, "fresh": V4, "reused": V2}[kind]
    announced = subtopology_topic_indices(topology, topology.source_topics)
    info = SubscriptionInfo(uuid.UUID(int=pid + 1), subtopology_topic_indices=announced, **history)
    return MemberSubscription(frozenset(topology.source_topics), info)


def _assign(
    group: dict[str, Any],
    members: dict[str, MemberSubscription],
    memory: ProbingMemory | None = None,
) -> dict[str, MemberAssignment]:
    tasks = [TaskId(s, p) for s in (0, 1) for p in range(group["partitions"])]
    return streams_module.assign_streams(
        V1,
        dict.fromkeys("abn", group["partitions"]),
        members,
        num_standby_replicas=group["standbys"],
        high_availability=group["high_availability"],
        end_offsets=dict.fromkeys(tasks, 100),
        now_ms=0,
        probing_memory=memory,
    )


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(group=groups(MATCHING_KINDS), garbage=st.booleans())
def test_with_no_differing_fingerprint_the_post_pass_changes_nothing(
    group: dict[str, Any], garbage: bool
) -> None:
    """Members announcing the leader's topics per id, old releases, members of a group held at
    version 2, members with a fresh id, a garbage subscription: two rounds (probing memory
    on, the second fed the first's result, so a remembered plan carries over) give exactly
    what they give with the post-pass taken out."""
    members = dict(group["members"])
    if garbage:
        members["zz-garbage"] = _member(99, "garbage", frozenset(), {})
    with_pass, without_pass = ProbingMemory(), ProbingMemory()
    for _ in range(2):
        expected_from_pass = _assign(group, members, with_pass)
        with mock.patch.object(
            streams_module, "move_to_eligible_clients", lambda assigned, *_, **__: assigned
        ):
            expected = _assign(group, members, without_pass)
        assert expected_from_pass == expected
        members = _reporting(group, members, expected)  # the remembered plan can carry over


def _reporting(
    group: dict[str, Any],
    members: dict[str, MemberSubscription],
    result: dict[str, MemberAssignment],
) -> dict[str, MemberSubscription]:
    """``members`` reporting ``result``: what they ran, and caught-up state of each copy."""
    out = dict(members)
    for member in members:
        if member.startswith("zz"):
            continue  # the garbage subscription
        pid, info = int(member[1:].split("-")[0]), result[member].info
        copies = dict.fromkeys(info.active | info.standby | info.warmup, 100)
        out[member] = _member(pid, group["kinds"][pid], info.active, copies)
    return out


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(group=groups(("same", "reused", "old", "fresh")), order_seed=st.randoms())
def test_when_the_post_pass_acts_the_assignment_is_valid_and_keeps_standbys(
    group: dict[str, Any], order_seed: Any
) -> None:
    """Every task active exactly once; no process with two copies of a task; no task of the
    reused id on a process that reuses it while another may run it; each of its tasks with
    replicas (standbys, or warmups) up to the configured number of standbys where eligible
    processes allow; and the same
    assignment whatever the member order."""
    members = group["members"]
    result = _assign(group, members)
    shuffled = list(members)
    order_seed.shuffle(shuffled)
    assert _assign(group, {m: members[m] for m in shuffled}) == result
    per_process: dict[str, list[set[TaskId]]] = {}
    for member, given in result.items():
        held = per_process.setdefault(member.split("-")[0], [set(), set(), set()])
        for copies, tasks in zip(
            held, (given.info.active, given.info.standby, given.info.warmup), strict=True
        ):
            copies |= tasks
    actives = sorted(t for held in per_process.values() for t in held[0])
    assert actives == [TaskId(s, p) for s in (0, 1) for p in range(group["partitions"])]
    eligible = {f"m{pid}" for pid, kind in enumerate(group["kinds"]) if kind != "reused"}
    for process, (active, standby, warmup) in per_process.items():
        assert not (active & standby or active & warmup or standby & warmup), process
        if eligible and process not in eligible:
            assert all(t.subtopology != 1 for t in active | standby | warmup), process
    if not eligible:
        return
    wanted = min(group["standbys"], len(eligible) - 1)
    for task in (TaskId(1, p) for p in range(group["partitions"])):
        # A warmup (high availability) is a replica too, and takes its process's one copy.
        kept = sum(task in held[1] | held[2] for held in per_process.values())
        assert kept >= wanted, (task, kept, wanted)


V2_SAME_0 = Topology(  # id 1 reused for a new topic, id 0 unchanged: V1's 1_x run as V2's 2_x
    [
        Subtopology(0, ["a"], stores=["ca"]),
        Subtopology(1, ["n"], stores=["cn"]),
        Subtopology(2, ["b"], stores=["cb"]),
    ],
    name="upg",
)


def _fed_back(
    result: dict[str, MemberAssignment] | None, rolled: int, processes: int = 6
) -> dict[str, MemberSubscription]:
    """One member per process reporting, as the runtime does, what it ran and the state it
    holds from ``result`` (the last round): the first ``rolled`` processes run V2_SAME_0, and
    of the leader's tasks they report only id 0 (their own numbering renumbers b; the
    other version's state of the reused id is left out: localstate.offset_sums)."""
    members = {}
    for pid in range(processes):
        topology = V2_SAME_0 if pid < rolled else V1
        info = result[f"m{pid}-0"].info if result else None
        ran = info.active if info else frozenset()
        held = ran | info.standby | info.warmup if info else frozenset()
        if pid < rolled:
            ran, held = (frozenset(t for t in ts if t.subtopology == 0) for ts in (ran, held))
        sums = {t: (LATEST_OFFSET if t in ran else 100) for t in held}
        subscription = SubscriptionInfo(
            uuid.UUID(int=pid + 1),
            endpoint=f"h{pid}:1",
            previous_active=ran,
            offset_sums=sums,
            subtopology_topic_indices=subtopology_topic_indices(topology, topology.source_topics),
        )
        members[f"m{pid}-0"] = MemberSubscription(frozenset(topology.source_topics), subscription)
    return members


def _roll_rounds(
    rolled: int, high_availability: bool, standbys: int = 1, rounds: int = 4
) -> list[dict[str, MemberAssignment]]:
    """A settled V1 group of 6 processes (6 partitions per id), then ``rolled`` of them
    restarted as V2_SAME_0 and ``rounds`` rebalances, each fed the last one's result."""
    group = {"partitions": 6, "standbys": standbys, "high_availability": high_availability}
    memory = ProbingMemory()
    result = None
    for _ in range(2):
        result = _assign(group, _fed_back(result, 0), memory)
    results = []
    for _ in range(rounds):
        result = _assign(group, _fed_back(result, rolled), memory)
        results.append(result)
    return results


def test_high_availability_mid_roll_asks_for_no_probe_while_nothing_catches_up() -> None:
    """High availability aims a reused id's task at a rolled process (it knows nothing of
    eligibility), holds the active back and puts a warmup there, which the post-pass strips:
    with no warmup left, a probing rebalance would find the same plan again, every interval
    for as long as the group is mixed. No round asks for one."""
    for rolled in (1, 3):
        for result in _roll_rounds(rolled, high_availability=True):
            assert all(not a.info.warmup for a in result.values())
            assert all(a.info.next_rebalance_ms == NEVER for a in result.values()), rolled


def test_mid_roll_the_group_settles_after_one_round() -> None:
    """3 of 6 processes rolled: after the first round of the roll no active moves and no
    standby moves (the standby top-up puts a moved task's standby where its state is first:
    placed elsewhere, it makes a new state holder the next round's choices follow, a churn
    of rounds)."""
    for high_availability in (False, True):
        results = _roll_rounds(3, high_availability)
        settled = [{m: (a.info.active, a.info.standby) for m, a in r.items()} for r in results[1:]]
        assert all(copies == settled[0] for copies in settled), high_availability


def test_standbys_of_moved_tasks_do_not_pile_up_on_a_process_holding_every_state() -> None:
    """3 of 6 processes may not run id 1; one process that may holds state of all 12 tasks
    (it once ran them all). The moved tasks' standbys go first to processes not over their
    fair share of copies, then to state holders: no process is left more than one copy over
    its share while another is under it (the hoarder used to take 6 standbys beside its 2
    actives, against a share of 4)."""
    tasks = [TaskId(s, p) for s in (0, 1) for p in range(6)]
    names = [f"p{i}" for i in range(1, 7)]
    first = StickyTaskAssignor(1).assign(tasks, [ClientState(n) for n in names], tasks)
    clients = [
        ClientState(
            n,
            prev_active=first[n].active,
            prev_standby=set(tasks) - first[n].active if n == "p3" else first[n].standby,
        )
        for n in names
    ]
    assigned = StickyTaskAssignor(1).assign(tasks, clients, tasks)
    ineligible = {n: frozenset({1}) for n in names[3:]}
    result = move_to_eligible_clients(assigned, ineligible, clients, 1, tasks)
    share = math.ceil(sum(a.load for a in result.values()) / len(names))
    loads = {n: result[n].load for n in names}
    assert max(loads.values()) <= share + 1 or min(loads.values()) >= share, loads


def test_after_the_post_pass_changed_only_standbys_the_next_round_plans_afresh() -> None:
    """High availability: the post-pass changed only standbys (the members then run exactly
    the plan's actives). The held-back active's target keeps a standby of it, which catches
    up: one probe (warmups alone do not tell: none is left to look at). The probing
    memory forgets the assignor's plan (it is not what the members were sent), so the later
    rebalances plan afresh, move nothing and settle; carried over, the old plan's target
    would move an active then (found by a search over fed-back rounds)."""
    members = {
        "m0-0": _member(0, "same", frozenset(), {TaskId(1, 0): 100, TaskId(0, 0): 100}),
        "m1-0": _member(1, "old", frozenset(), {TaskId(1, 0): 50, TaskId(0, 0): 100}),
        "m2-0": _member(2, "reused", frozenset(), {}),
        "m2-1": _member(2, "reused", frozenset(), {}),
    }
    group = {
        "kinds": ["same", "old", "reused"],
        "partitions": 1,
        "standbys": 2,
        "high_availability": True,
    }
    memory = ProbingMemory()
    first = _assign(group, members, memory)
    assert all(a.info.next_rebalance_ms != NEVER for a in first.values())
    members = _reporting(group, members, first)
    for _ in range(2):
        result = _assign(group, members, memory)
        assert {m: a.info.active for m, a in result.items()} == {
            m: a.info.active for m, a in first.items()
        }
        assert all(a.info.next_rebalance_ms == NEVER for a in result.values())
        members = _reporting(group, members, result)


def test_a_role_swap_for_an_unchanged_id_still_probes_while_the_group_is_mixed() -> None:
    """High availability holds 0_0 back on p0 for p1 (which ran it and restarted far behind)
    and swaps roles: p1 keeps a standby that catches up, no warmup. Id 0 is unchanged by the
    roll; a rolled p2 makes the post-pass act. The probe that hands 0_0 back is still asked
    for, though no warmup is left (looking at warmups alone would send NEVER all roll)."""
    end = 1_000_000
    t00, t01, t02, t10, t11 = (TaskId(0, 0), TaskId(0, 1), TaskId(0, 2), TaskId(1, 0), TaskId(1, 1))
    members = {
        "m0": _member(0, "same", frozenset({t01, t10}), {t01: end, t10: end, t00: end}),
        "m1": _member(1, "same", frozenset({t00, t11}), {t00: 100_000, t11: end}),
        "m2": _member(2, "reused", frozenset({t02}), {t02: end}),
    }
    tasks = [TaskId(s, p) for s in (0, 1) for p in range(3)]
    out = streams_module.assign_streams(
        V1,
        dict.fromkeys("abn", 3),
        members,
        num_standby_replicas=1,
        high_availability=True,
        end_offsets=dict.fromkeys(tasks, end),
        now_ms=0,
        probing_memory=ProbingMemory(),
    )
    assert t00 in out["m0"].info.active and t00 in out["m1"].info.standby
    assert all(a.info.next_rebalance_ms == 600_000 for a in out.values())


#: Per member, what it announces for the leader's ids 0 (reads a) and 1 (reads b).
ON_DEMAND_ANNOUNCED = {
    "x": {0: frozenset({"a"}), 1: frozenset({"b"})},
    "y": {0: frozenset({"z"}), 1: frozenset({"b"})},
    "w": {0: frozenset({"a"}), 1: frozenset({"z"})},
    "v": {},
    "u": {0: frozenset({"a"})},
}


class _ReadingsOnDemand(Mapping[str, MemberReading]):
    """Member id -> its reading, made when asked and freed after use (a caller decoding
    members lazily): each announcement is a fresh object, often at a freed one's address."""

    def __getitem__(self, member: str) -> MemberReading:
        announced = MappingProxyType(ON_DEMAND_ANNOUNCED[member])
        return MemberReading("p", frozenset({"a", "b", "z"}), announced)

    def __iter__(self) -> Iterator[str]:
        return iter(ON_DEMAND_ANNOUNCED)

    def __len__(self) -> int:
        return len(ON_DEMAND_ANNOUNCED)


def test_readings_made_on_demand_get_their_own_refused_ids() -> None:
    own = {0: frozenset({"a"}), 1: frozenset({"b"})}
    lazy = group_eligibility(own, _ReadingsOnDemand())
    eager = group_eligibility(own, dict(_ReadingsOnDemand().items()))
    assert lazy == eager
    assert dict(lazy.refused) == {
        "x": frozenset(),
        "y": frozenset({0}),
        "w": frozenset({1}),
        "v": frozenset({0, 1}),
        "u": frozenset({1}),
    }


# -- members announcing no topology (protocol 1-2): read by their subscription ---------------

OWN = {0: frozenset({"a"}), 1: frozenset({"b"}), 7: frozenset({"n"})}  # V4 with a fresh id


def test_an_old_member_lacking_a_topic_is_refused_only_the_ids_reading_it() -> None:
    """An old process (protocol 2, V1) under a V4 leader lacks n; it gets
    ids 0 and 1 (before: nothing, and the fleet ran on the other processes)."""
    members = {
        "new": MemberReading("p1", frozenset({"a", "b", "n"}), {0: OWN[0], 1: OWN[1], 7: OWN[7]}),
        "old": MemberReading("p2", frozenset({"a", "b"})),
        "all": MemberReading("p3", frozenset({"a", "b", "n"})),
        "elsewhere": MemberReading("p4", frozenset({"z"})),
        "nothing": MemberReading("p5", frozenset()),
    }
    got = group_eligibility(OWN, members)
    assert got == GroupEligibility(
        frozenset({"new", "old", "all"}),
        {"new": frozenset(), "old": frozenset({7}), "all": frozenset()},
        {"p2": frozenset({7}), "p4": frozenset(OWN), "p5": frozenset(OWN)},
        ("p4", "p5"),
    )


@hypothesis.given(
    st.lists(st.frozensets(st.sampled_from("abnz"), max_size=4), min_size=1, max_size=6)
)
def test_a_member_announcing_nothing_is_refused_exactly_the_ids_it_cannot_subscribe_to(
    subscriptions: list[frozenset[str]],
) -> None:
    """Model: a non-announcing member may get tasks iff it subscribes to one of the leader's
    topics, and is then refused exactly the ids reading a topic it does not subscribe to; so
    no member is ever eligible for a partition of a topic it does not subscribe to."""
    members = {f"m{i}": MemberReading(f"p{i}", t) for i, t in enumerate(subscriptions)}
    got = group_eligibility(OWN, members)
    sources = frozenset().union(*OWN.values())
    for m, reading in members.items():
        assert (m in got.may_get_tasks) == bool(sources & reading.topics)
        if m in got.may_get_tasks:
            assert got.refused[m] == {s for s, t in OWN.items() if not t <= reading.topics}
            assert got.withheld.get(reading.process, frozenset()) == got.refused[m]
        else:
            assert reading.process in got.blind and got.withheld[reading.process] == set(OWN)
