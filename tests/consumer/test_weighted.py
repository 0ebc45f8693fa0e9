"""Weighted sticky: shares proportional to MemberData.weight, sticky across rebalances."""

from __future__ import annotations

from hypothesis import assume, example, given

from streamassign import TopicPartition
from streamassign.consumer import MemberData, Subscription, WeightedAssignor

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
    resolved_previous,
    time_limit,
    with_history,
)

WEIGHTED = WeightedAssignor()


def weight(w: int) -> bytes:
    return MemberData(weight=w).encode()


def test_900_90_10_over_100_partitions() -> None:
    subs = {
        "big": Subscription({"t"}, user_data=weight(900)),
        "small": Subscription({"t"}, user_data=weight(90)),
        "canary": Subscription({"t"}, user_data=weight(10)),
    }
    result = WEIGHTED.assign({"t": 100}, subs)
    assert {m: len(v) for m, v in result.items()} == {"big": 90, "small": 9, "canary": 1}


def test_weights_spread_over_topics() -> None:
    subs = {"a": Subscription({"x", "y"}, user_data=weight(3)), "b": Subscription({"x", "y"})}
    result = WEIGHTED.assign({"x": 5, "y": 3}, subs)
    assert {m: len(v) for m, v in result.items()} == {"a": 6, "b": 2}


@given(cases(uniform=True, weight_values=range(1, 10)))
def test_uniform_subscriptions_floor_or_ceil_and_minimal_moves(case: Case) -> None:
    result = WEIGHTED.assign(case.counts, case.subs)
    check_contract(case.counts, case.subs, result)
    total = len(assignable(case.counts, case.subs))
    whole = sum(case.weights.values())
    for m, tps in result.items():
        share = total * case.weights[m]
        assert share // whole <= len(tps) <= -(-share // whole), (m, len(tps), share / whole)
    previous = resolved_previous(case.counts, case.subs)
    bound = move_lower_bound(total, case.weights, owned_counts(previous))
    assert count_moves(previous, result) == bound


@given(cases())
def test_result_fed_back_is_a_fixed_point(case: Case) -> None:
    with time_limit(5):
        first = WEIGHTED.assign(case.counts, case.subs)
        gen = max(s.generation for s in case.subs.values()) + 1
        assert WEIGHTED.assign(case.counts, with_history(case.subs, first, gen)) == first


def nonuniform(case: Case) -> bool:
    return len({frozenset(s.topics & case.counts.keys()) for s in case.subs.values()}) > 1


def _weights_case(
    counts: dict[str, int], subs: dict[str, tuple[set[str], list[tuple[str, int]], int]]
) -> Case:
    return Case(
        counts,
        {m: Subscription(t, o, 1, user_data=weight(w)) for m, (t, o, w) in subs.items()},
        {m: w for m, (_, _, w) in subs.items()},
        dict.fromkeys(subs, 0),
        frozenset(),
    )


# "b" (weight 4) kept 3 of B; "x" (weight 1) could take one: (2*0+1)/1 < (2*3-1)/4. The
# improving-move loop visits members by c/w (a: 1, b: 0.75) and stops at "a", whose move
# threshold (2c-1)/w = 1 is lower than b's 1.25, so b is never examined.
SKIPPED_MOVE = _weights_case(
    {"A": 1, "B": 3},
    {
        "a": ({"A"}, [], 1),
        "b": ({"B"}, [("B", 0), ("B", 1), ("B", 2)], 4),
        "x": ({"B"}, [], 1),
    },
)


# Fresh: "111" (weight 2) ends with 2 partitions, "11" with 1, "b" with 0; "111" -> "b" improves
# but the loop visits "11" first (c/w 1 vs 1; id order) and stops there.
SKIPPED_MOVE_FRESH = _weights_case(
    {"b": 1, "b0": 2},
    {"b": ({"b"}, [], 1), "11": ({"b", "b0"}, [], 1), "111": ({"b", "b0"}, [], 2)},
)


@given(cases(uniform=False))
@example(SKIPPED_MOVE)
@example(SKIPPED_MOVE_FRESH)
def test_nonuniform_is_locally_balanced(case: Case) -> None:
    """No partition can move from A to an eligible B with (2c_B+1)/w_B < (2c_A-1)/w_A."""
    assume(nonuniform(case))
    with time_limit(5):
        result = WEIGHTED.assign(case.counts, case.subs)
    check_contract(case.counts, case.subs, result)
    assert improving_moves(case.counts, case.subs, result, case.weights) == []


@given(cases(uniform=False))
def test_no_partition_could_go_back_at_no_cost(case: Case) -> None:
    """Sticky with weights, for differing subscriptions (uniform ones have exact quotas and the
    move bound, above): no partition taken from a member still in the group could go back
    leaving sum(c^2 / w) no higher and the result balanced."""
    assume(nonuniform(case))
    with time_limit(5):
        result = WEIGHTED.assign(case.counts, case.subs)
    assert needless_moves(case.counts, case.subs, result, case.weights) == []


def test_skipped_move_by_hand() -> None:
    """Without history the same group is assigned b 2, x 1 (the balanced result)."""
    fresh = {m: Subscription(s.topics, user_data=s.user_data) for m, s in SKIPPED_MOVE.subs.items()}
    result = WEIGHTED.assign(SKIPPED_MOVE.counts, fresh)
    assert {m: len(v) for m, v in result.items()} == {"a": 1, "b": 2, "x": 1}
    assert result["a"] == [TopicPartition("A", 0)]


def test_ceilings_without_history_go_to_the_largest_remainder() -> None:
    """Shares 90.9 / 9.09 / 1.01 of 101: floors 90 / 9 / 1 and one ceiling, which "big"
    (remainder 0.9) wants most; "a-canary" (remainder 0.01) sorts first."""
    subs = {
        "a-canary": Subscription({"t"}, user_data=weight(10)),
        "big": Subscription({"t"}, user_data=weight(900)),
        "small": Subscription({"t"}, user_data=weight(90)),
    }
    result = WEIGHTED.assign({"t": 101}, subs)
    assert {m: len(v) for m, v in result.items()} == {"a-canary": 1, "big": 91, "small": 9}


# Two members of weight 3, one partition, subscriptions that differ: the float keys make
# 1/3 < 1 - 2/3 true both ways, so the partition moves from "a" to "b" and back forever.
PING_PONG = _weights_case({"A": 1, "B": 0}, {"a": ({"A"}, [], 3), "b": ({"A", "B"}, [], 3)})


@given(cases(uniform=False, weight_values=range(1, 10)))
@example(PING_PONG)
def test_any_weights_terminate(case: Case) -> None:
    with time_limit(2):
        WEIGHTED.assign(case.counts, case.subs)


def test_weights_are_read_without_building_owned_partitions() -> None:
    """History comes from ``owned_partitions``: runs in the user data are checked (a claim on
    2**20 partitions is valid) but never built, where they used to take over 100 MB."""
    import struct
    import tracemalloc

    from streamassign.consumer.userdata import MAX_PARTITIONS

    runs = struct.pack(">ih", 1, 1) + b"t" + struct.pack(">iii", 1, 0, MAX_PARTITIONS)
    subs = {"a": Subscription({"t"}, user_data=weight(3)[:-4] + runs), "b": Subscription({"t"})}
    tracemalloc.start()
    try:
        result = WEIGHTED.assign({"t": 4}, subs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2_000_000
    assert {m: len(v) for m, v in result.items()} == {"a": 3, "b": 1}
