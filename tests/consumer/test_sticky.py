"""Sticky assignor (KIP-54 with the KIP-341 generation fix): the KIP's worked examples,
balance for any subscriptions, minimal moves for uniform subscriptions, history handling."""

from __future__ import annotations

import random

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from streamassign import TopicPartition
from streamassign.consumer import StickyAssignor, Subscription
from streamassign.consumer._common import prepare
from streamassign.consumer.sticky import _GreedyBalancer, resolve_owned

from .strategies import (
    Case,
    assignable,
    cases,
    check_contract,
    count_moves,
    improving_moves,
    move_lower_bound,
    needless_moves,
    owned_counts,
    owners,
    resolved_previous,
    with_history,
)
from .test_range_roundrobin import tps

STICKY = StickyAssignor()
SEEDS = st.integers(0, 2**32 - 1)
#: Two topics, members subscribed to a and t1, a only, and t1 only (twice): see
#: ``test_a_partition_goes_back_to_its_owner_when_that_costs_nothing``.
NEEDLESS_MOVE = Case(
    counts={"a": 4, "t1": 9},
    subs={
        "11": Subscription(
            {"a", "t1"}, [("a", 3), ("t1", 4), ("t1", 1), ("t1", 2), ("t1", 8)], generation=4
        ),
        "A": Subscription({"a"}, [("t1", 3), ("t1", 6), ("t1", 7), ("t1", 5), ("a", 1)], 4),
        "a": Subscription({"zz-deleted"}, [("t1", 0), ("a", 0), ("a", 2)], generation=4),
        "a-10": Subscription({"t1"}),
        "consumer-10-0b7e": Subscription({"t1"}),
    },
    weights=dict.fromkeys(("11", "A", "a", "a-10", "consumer-10-0b7e"), 1),
    priorities=dict.fromkeys(("11", "A", "a", "a-10", "consumer-10-0b7e"), 0),
    garbage=frozenset(),
)


def preserved(before: dict[str, list[TopicPartition]], after: dict) -> int:
    return sum(len(set(after[m]) & set(tps_)) for m, tps_ in before.items() if m in after)


# ------------------------------------------------------------------------ KIP-54's examples


def test_kip54_example_1() -> None:
    counts = {f"t{i}": 2 for i in range(4)}
    subs = {f"C{i}": Subscription(counts) for i in range(3)}
    first = STICKY.assign(counts, subs)
    assert first == {  # "with both sticky and round robin assignors"
        "C0": tps("t0p0", "t1p1", "t3p0"),
        "C1": tps("t0p1", "t2p0", "t3p1"),
        "C2": tps("t1p0", "t2p1"),
    }
    del subs["C1"]
    second = STICKY.assign(counts, with_history(subs, first, 1))
    assert preserved(first, second) == 5  # "preserving 5 of the previous assignments"
    assert set(first["C0"]) <= set(second["C0"])
    assert set(first["C2"]) <= set(second["C2"])
    assert [len(second[m]) for m in ("C0", "C2")] == [4, 4]


def test_kip54_example_2() -> None:
    counts = {"t0": 1, "t1": 2, "t2": 3}
    subs = {
        "C0": Subscription({"t0"}),
        "C1": Subscription({"t0", "t1"}),
        "C2": Subscription({"t0", "t1", "t2"}),
    }
    first = STICKY.assign(counts, subs)
    assert first == {
        "C0": tps("t0p0"),
        "C1": tps("t1p0", "t1p1"),
        "C2": tps("t2p0", "t2p1", "t2p2"),
    }
    del subs["C0"]
    second = STICKY.assign(counts, with_history(subs, first, 1))
    assert second == {
        "C1": tps("t0p0", "t1p0", "t1p1"),
        "C2": tps("t2p0", "t2p1", "t2p2"),
    }
    assert preserved(first, second) == 5


def test_kip54_example_3() -> None:
    counts = {"t0": 2, "t1": 2}
    subs = {"C0": Subscription(counts), "C1": Subscription(counts)}
    first = STICKY.assign(counts, subs)
    assert first == {"C0": tps("t0p0", "t1p0"), "C1": tps("t0p1", "t1p1")}
    subs = with_history(subs, first, 1)
    subs["C2"] = Subscription(counts)
    second = STICKY.assign(counts, subs)
    assert preserved(first, second) == 3  # "move one of the partitions to the new consumer"
    assert sorted(len(v) for v in second.values()) == [1, 1, 2]


# ------------------------------------------------------------------------------- balance


@given(cases(user_data=False))
def test_balanced_for_any_subscriptions_and_history(case: Case) -> None:
    """KIP-54: counts differ by at most one, or no partition can go from a member with 2+ more
    to one with fewer that subscribes to its topic (brute force over every move)."""
    result = STICKY.assign(case.counts, case.subs)
    check_contract(case.counts, case.subs, result)
    loads = [len(v) for v in result.values()]
    if max(loads) - min(loads) > 1:
        assert improving_moves(case.counts, case.subs, result) == []


@given(cases(user_data=False))
@example(NEEDLESS_MOVE)
def test_no_partition_could_go_back_at_no_cost_for_any_subscriptions(case: Case) -> None:
    """Sticky for any subscriptions (cooperative sticky plans toward this same result): no
    partition taken from a member still in the group could go back to it leaving the loads
    no less fair and the result balanced."""
    result = STICKY.assign(case.counts, case.subs)
    assert needless_moves(case.counts, case.subs, result) == []


@given(
    cases(user_data=False),
    st.permutations(["fill_unowned", "make_improving_moves", "hand_back_needless_moves"]),
)
def test_greedy_steps_run_in_any_order_on_state_built_up_front(
    case: Case, steps: list[str]
) -> None:
    """The general path's steps read only state its balancer builds at once (each member's
    partitions per topic, each topic's holders) and keep it in step with the owners."""
    problem = prepare(case.counts, case.subs)
    balancer = _GreedyBalancer(problem, resolve_owned(problem)[0], [1] * len(problem.members))
    for step in steps:
        getattr(balancer, step)()
    owner = balancer.owner
    held = {
        pid: m for m, by_topic in enumerate(balancer.held) for ps in by_topic.values() for pid in ps
    }
    assert held == {pid: m for pid, m in enumerate(owner) if m >= 0}
    assert balancer.count == [owner.count(m) for m in range(len(problem.members))]
    assert balancer.holders == [
        {m for m, by_topic in enumerate(balancer.held) if by_topic.get(t)}
        for t in range(len(problem.topics))
    ]


def test_a_partition_goes_back_to_its_owner_when_that_costs_nothing() -> None:
    """The hypothesis counterexample before the hand-back pass: "11" owned a-3 and four of
    t1's partitions; the greedy fill and moves took a-3 to "A" (a only), which then ran 4
    against 11's 3 though a-3 back on 11 is as balanced (4, 3, 3, 3) and moves one less."""
    result = STICKY.assign(NEEDLESS_MOVE.counts, NEEDLESS_MOVE.subs)
    assert TopicPartition("a", 3) in result["11"]
    assert sorted(len(v) for v in result.values()) == [0, 3, 3, 3, 4]  # "a": no topic left
    assert needless_moves(NEEDLESS_MOVE.counts, NEEDLESS_MOVE.subs, result) == []


@given(cases(uniform=True, user_data=False))
def test_uniform_subscriptions_are_balanced_and_move_the_minimum(case: Case) -> None:
    previous = resolved_previous(case.counts, case.subs)
    result = STICKY.assign(case.counts, case.subs)
    check_contract(case.counts, case.subs, result)
    total = len(assignable(case.counts, case.subs))
    members = len(case.subs)
    assert {len(v) for v in result.values()} <= {total // members, -(-total // members)}
    bound = move_lower_bound(total, dict.fromkeys(case.subs, 1), owned_counts(previous))
    assert count_moves(previous, result) == bound


@given(cases(uniform=True, user_data=False, history=("previous", "dealt", "arbitrary")), SEEDS)
def test_move_bound_is_a_true_lower_bound(case: Case, seed: int) -> None:
    """No balanced assignment moves fewer than the bound: fully random balanced assignments,
    and the stickiest one for a random choice of which members take the ceilings."""
    previous = resolved_previous(case.counts, case.subs)
    members = sorted(case.subs)
    partitions = sorted(assignable(case.counts, case.subs))
    bound = move_lower_bound(len(partitions), dict.fromkeys(members, 1), owned_counts(previous))
    rnd = random.Random(seed)
    floor, extra = divmod(len(partitions), len(members))
    for _ in range(5):
        ceilings = set(rnd.sample(members, extra))
        quota = {m: floor + (m in ceilings) for m in members}
        # Fully random, balanced.
        order = rnd.sample(partitions, len(partitions))
        anywhere: dict[str, list[TopicPartition]] = {}
        for m in members:
            anywhere[m], order = order[: quota[m]], order[quota[m] :]
        assert count_moves(previous, anywhere) >= bound
        # Keep what each member owned up to its quota, deal the rest.
        kept: dict[str, list[TopicPartition]] = {m: [] for m in members}
        rest = []
        for tp in rnd.sample(partitions, len(partitions)):
            m = previous.get(tp)
            if m is not None and len(kept[m]) < quota[m]:
                kept[m].append(tp)
            else:
                rest.append(tp)
        for m in members:
            room = quota[m] - len(kept[m])
            kept[m], rest = kept[m] + rest[:room], rest[room:]
        assert not rest
        assert count_moves(previous, kept) >= bound


def test_move_bound_by_hand() -> None:
    """Three members owning 5, 3 and 0 of 8 partitions: quotas 3, 3, 2; two must move."""
    counts = {"t": 8}
    subs = {
        "a": Subscription({"t"}, [("t", p) for p in range(5)], 1),
        "b": Subscription({"t"}, [("t", p) for p in range(5, 8)], 1),
        "c": Subscription({"t"}),
    }
    result = STICKY.assign(counts, subs)
    assert set(result["a"]) < {TopicPartition("t", p) for p in range(5)}
    assert len(result["a"]) == 3
    assert result["b"] == tps("tp5", "tp6", "tp7")
    assert len(result["c"]) == 2


# ------------------------------------------------------------------------------- history


@given(cases(user_data=False, history=("previous", "dealt")), SEEDS)
def test_kip341_stale_claims_lose(case: Case, seed: int) -> None:
    """Members that own nothing now start reporting claims from an older generation on
    partitions others own at the current one (they missed a rebalance). The current owners stay
    the previous owners: the result moves exactly as many partitions away from them as without
    the stale claims (the minimum, for uniform subscriptions), and a current owner within its
    floor keeps everything it owned."""
    previous = resolved_previous(case.counts, case.subs)
    assume(previous)  # someone owns something now, at generation >= 0
    current = max(s.generation for s in case.subs.values())
    zombies = [m for m, s in case.subs.items() if not s.owned_partitions]
    rnd = random.Random(seed)
    subs = dict(case.subs)
    claims = 0
    for m in zombies:
        s = subs[m]
        mine = sorted(tp for tp in previous if tp.topic in s.topics)
        stale = rnd.sample(mine, rnd.randint(min(1, len(mine)), len(mine)))
        claims += len(stale)
        subs[m] = Subscription(s.topics, stale, rnd.randint(-1, current - 1), s.rack)
    assume(claims)  # at least one stale claim, or there is nothing to check
    assert resolved_previous(case.counts, subs) == previous  # the oracle agrees: stale loses
    baseline = STICKY.assign(case.counts, case.subs)
    result = STICKY.assign(case.counts, subs)
    check_contract(case.counts, subs, result)
    assert count_moves(previous, result) == count_moves(previous, baseline)
    subscribed = {frozenset(t for t in s.topics if t in case.counts) for s in subs.values()}
    if len(subscribed) == 1:
        total = len(assignable(case.counts, subs))
        bound = move_lower_bound(total, dict.fromkeys(subs, 1), owned_counts(previous))
        assert count_moves(previous, result) == bound
        floor = total // len(subs)
        for m, k in owned_counts(previous).items():
            if k <= floor:
                assert {tp for tp, o in previous.items() if o == m} <= set(result[m])


@pytest.mark.parametrize(("gen_a", "gen_b", "keeper"), [(1, 2, "b"), (3, 2, "a"), (2, 2, "a")])
def test_kip341_higher_generation_keeps_a_contested_partition(
    gen_a: int, gen_b: int, keeper: str
) -> None:
    """Member "a" sorts first, so a smaller-id rule alone would always keep "a"; a generation rule
    keeps the higher generation's claim (same generation: the smaller id)."""
    counts = {"t": 4}
    subs = {
        "a": Subscription({"t"}, [("t", 0), ("t", 1)], gen_a),
        "b": Subscription({"t"}, [("t", 0), ("t", 1)], gen_b),
    }
    result = STICKY.assign(counts, subs)
    assert result[keeper] == tps("tp0", "tp1")


def test_contested_partition_the_winner_must_release_goes_back_to_the_stale_claimant() -> None:
    """Member "b" (generation 2) owns t0-t3 with quota 2; "a" (generation 1) claims t3: of the
    two "b" gives up, t3 goes back to "a" (which may still hold its state)."""
    counts = {"t": 6}
    subs = {
        "a": Subscription({"t"}, [("t", 3)], 1),
        "b": Subscription({"t"}, [("t", p) for p in range(4)], 2),
        "c": Subscription({"t"}),
    }
    result = STICKY.assign(counts, subs)
    assert TopicPartition("t", 3) in result["a"]
    assert len(result["b"]) == 2
    assert set(result["b"]) < {TopicPartition("t", p) for p in range(3)}


@given(cases(user_data=False), SEEDS)
def test_invalid_claims_are_dropped(case: Case, seed: int) -> None:
    """Adding claims on topics a member does not subscribe to, topics that do not exist and
    partitions out of range (in any order) changes nothing."""
    rnd = random.Random(seed)
    subs = {}
    for m, s in case.subs.items():
        bogus = []
        for t in ("ghost", "no-such-topic", *case.counts):
            if t in case.counts and t in s.topics:
                bogus += [(t, case.counts[t]), (t, case.counts[t] + 3), (t, -1)]
            else:
                bogus += [(t, p) for p in range(rnd.randint(0, 3))]
        owned = list(s.owned_partitions) + bogus
        rnd.shuffle(owned)
        subs[m] = Subscription(s.topics, owned, s.generation, s.rack)
    assert resolved_previous(case.counts, subs) == resolved_previous(case.counts, case.subs)
    assert STICKY.assign(case.counts, subs) == STICKY.assign(case.counts, case.subs)


def test_claims_on_unsubscribed_and_deleted_partitions_by_hand() -> None:
    """Counted as owned, "a"'s claims on partitions that no longer exist or on a topic it left
    would win it the one ceiling (quotas 2, 1, 1) and force "b" to give one up."""
    counts = {"t": 4, "u": 2}
    subs = {
        "a": Subscription({"t"}, [("t", 0), ("t", 5), ("t", 6), ("u", 0), ("gone", 0)], 9),
        "b": Subscription({"t"}, [("t", 1), ("t", 2)], 3),
        "c": Subscription({"t"}, [("t", 3)], 3),
    }
    assert STICKY.assign(counts, subs) == {
        "a": tps("tp0"),
        "b": tps("tp1", "tp2"),
        "c": tps("tp3"),
    }


@given(cases(user_data=False))
def test_result_fed_back_is_a_fixed_point(case: Case) -> None:
    first = STICKY.assign(case.counts, case.subs)
    gen = max(s.generation for s in case.subs.values()) + 1
    again = STICKY.assign(case.counts, with_history(case.subs, first, gen))
    assert again == first


def test_fixed_point_keeps_every_partition_with_its_owner_by_hand() -> None:
    counts = {"t": 7, "u": 3}
    rnd = random.Random(1)
    subs = {m: Subscription(rnd.sample(["t", "u"], rnd.randint(1, 2))) for m in "abcde"}
    first = STICKY.assign(counts, subs)
    assert owners(STICKY.assign(counts, with_history(subs, first, 1))) == owners(first)


def test_general_path_does_not_drain_one_member_for_another_to_refill() -> None:
    """Found by the benchmark: with a second subscription in the group (forcing the general
    path), two joiners must take one partition each from the two owners; draining m0 first
    made m1 refill it with a partition that had no reason to move."""
    subs = {
        "m0": Subscription({"t"}, [("t", 0), ("t", 2), ("t", 4)], generation=1),
        "m1": Subscription({"t"}, [("t", 1), ("t", 3), ("t", 5)], generation=1),
        "n0": Subscription({"t"}),
        "n1": Subscription({"t"}),
        "z": Subscription({"u"}),
    }
    result = StickyAssignor().assign({"t": 6, "u": 1}, subs)
    kept = {m: {p for _, p in result[m]} for m in ("m0", "m1")}
    assert kept["m0"] <= {0, 2, 4} and kept["m1"] <= {1, 3, 5}
    assert len(kept["m0"]) == len(kept["m1"]) == 2
