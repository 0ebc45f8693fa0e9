"""Cooperative sticky (KIP-429): a round gives the sticky target minus what another member
still claims; those members revoke first, the others learn what is pending for them, and the
follow-up round (members reporting assignment + pending as owned) completes the target."""

from __future__ import annotations

from hypothesis import example, given

from streamassign import TopicPartition
from streamassign.consumer import (
    CooperativeStickyAssignor,
    RebalancePlan,
    StickyAssignor,
    Subscription,
)

from .strategies import Case, assignable, cases, check_contract, owners, with_history
from .test_range_roundrobin import tps

COOP = CooperativeStickyAssignor()


def next_generation(case: Case) -> int:
    return max(s.generation for s in case.subs.values()) + 1


def claims(case: Case) -> dict[TopicPartition, set[str]]:
    """Every assignable partition any member reports as owned, and who does."""
    out: dict[TopicPartition, set[str]] = {}
    assignable_now = assignable(case.counts, case.subs)
    for m, s in case.subs.items():
        for tp in s.owned_partitions:
            if tp in assignable_now:
                out.setdefault(TopicPartition(*tp), set()).add(m)
    return out


def round_two(case: Case, plan: RebalancePlan) -> dict[str, Subscription]:
    """Every member revoked what it was told to and reports assignment + pending as owned."""
    reported = {m: [*plan.assignment[m], *plan.pending[m]] for m in case.subs}
    return with_history(case.subs, reported, next_generation(case))


# The smallest cases found (by the earlier property tests) where recomputing round 2 from a
# partial history gave another target than round 1 announced, or needed a third round.
ROUND_TWO_DIVERGES = Case(
    counts={"t": 8},
    subs={
        "A": Subscription({"t"}, [], -1),
        "B": Subscription({"t"}, [("t", 7)], 1),
        "C": Subscription({"t"}, [("t", p) for p in (0, 1, 2, 4, 6)], 1),
    },
    weights={"A": 1, "B": 1, "C": 1},
    priorities={"A": 0, "B": 0, "C": 0},
    garbage=frozenset(),
)
THIRD_ROUND = Case(
    counts={"a": 2, "c": 2},
    subs={
        "m0": Subscription({"a", "c"}, [("a", 0), ("a", 1), ("c", 0), ("c", 1)], 1),
        "m1": Subscription({"c"}, [], -1),
        "m2": Subscription({"c"}, [], -1),
        "m3": Subscription({"a"}, [], -1),
    },
    weights={m: 1 for m in ("m0", "m1", "m2", "m3")},
    priorities={m: 0 for m in ("m0", "m1", "m2", "m3")},
    garbage=frozenset(),
)


@given(cases(user_data=False))
@example(ROUND_TWO_DIVERGES)
@example(THIRD_ROUND)
def test_round_one_is_the_target_minus_what_others_still_claim(case: Case) -> None:
    plan = COOP.plan(case.counts, case.subs)
    target = StickyAssignor().assign(case.counts, case.subs)
    claimed = claims(case)
    check_contract(case.counts, case.subs, plan.assignment, set(claimed))
    assert COOP.assign(case.counts, case.subs) == plan.assignment
    for m, want in target.items():
        contested = {tp for tp in want if claimed.get(tp, set()) - {m}}
        assert plan.assignment[m] == [tp for tp in want if tp not in contested]
        assert plan.pending[m] == sorted(contested)
    for tp, who in owners(plan.assignment).items():  # never granted while another claims it
        assert claimed.get(tp, set()) <= {who}
    for m, revoked in plan.revoking.items():
        assert set(revoked) == {tp for tp, who in claimed.items() if m in who} - set(target[m])
    assert plan.followup_needed == any(plan.pending.values())


@given(cases(user_data=False))
@example(ROUND_TWO_DIVERGES)
@example(THIRD_ROUND)
def test_round_two_completes_exactly_the_target(case: Case) -> None:
    plan = COOP.plan(case.counts, case.subs)
    target = StickyAssignor().assign(case.counts, case.subs)
    plan2 = COOP.plan(case.counts, round_two(case, plan))
    assert plan2.assignment == target
    assert not plan2.followup_needed
    assert all(not r for r in plan2.revoking.values())


@given(cases(user_data=False))
def test_fresh_group_needs_no_followup(case: Case) -> None:
    fresh = with_history(case.subs, {}, -1)
    plan = COOP.plan(case.counts, fresh)
    assert not plan.followup_needed
    assert all(not r for r in plan.revoking.values())
    assert plan.assignment == StickyAssignor().assign(case.counts, fresh)
    assert set(owners(plan.assignment)) == assignable(case.counts, fresh)


def test_member_joining_by_hand() -> None:
    counts = {"t": 4}
    subs = {"A": Subscription({"t"}, [("t", p) for p in range(4)], 3), "B": Subscription({"t"})}
    plan = COOP.plan(counts, subs)
    assert plan.followup_needed
    assert plan.assignment["B"] == [] and len(plan.assignment["A"]) == 2
    assert plan.revoking["A"] == plan.pending["B"] and len(plan.pending["B"]) == 2
    reported = {"A": plan.assignment["A"], "B": plan.pending["B"]}
    plan2 = COOP.plan(counts, with_history(subs, reported, 4))
    assert plan2.assignment == {"A": plan.assignment["A"], "B": plan.revoking["A"]}
    assert not plan2.followup_needed


def test_a_stale_claim_on_an_unsubscribed_topic_is_withheld_until_revoked() -> None:
    """m0 no longer subscribes to "a" but still reports a0: m1 gets it only after m0 revokes."""
    counts = {"a": 1}
    subs = {"m0": Subscription(set(), [("a", 0)], 2), "m1": Subscription({"a"})}
    plan = COOP.plan(counts, subs)
    assert plan.assignment == {"m0": [], "m1": []}
    assert plan.revoking["m0"] == tps("ap0") and plan.pending["m1"] == tps("ap0")
