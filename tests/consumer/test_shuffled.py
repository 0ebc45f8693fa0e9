"""Shuffled: range over a per-topic seeded member order, spreading the remainders."""

from __future__ import annotations

import os
import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from streamassign.consumer import RangeAssignor, ShuffledAssignor, Subscription

from .strategies import Case, cases, check_contract, owners


@given(cases(user_data=False), st.integers(-(2**31), 2**31))
def test_per_topic_counts_like_range_and_deterministic(case: Case, seed: int) -> None:
    result = ShuffledAssignor(seed).assign(case.counts, case.subs)
    check_contract(case.counts, case.subs, result)
    assert ShuffledAssignor(seed).assign(case.counts, case.subs) == result
    owner = owners(result)
    for topic, n in case.counts.items():
        subscribers = [m for m, s in case.subs.items() if topic in s.topics]
        if not subscribers:
            continue
        per_member = {m: 0 for m in subscribers}
        for p in range(n):
            per_member[owner[(topic, p)]] += 1
        lo, hi = n // len(subscribers), -(-n // len(subscribers))
        assert set(per_member.values()) <= {lo, hi}
        # Like range, the ranges are contiguous: each member's partitions of a topic are a run.
        for m in subscribers:
            mine = [p for p in range(n) if owner[(topic, p)] == m]
            assert not mine or mine == list(range(mine[0], mine[0] + len(mine)))


@given(cases(user_data=False, min_members=2))
def test_same_multiset_of_per_topic_counts_as_range(case: Case) -> None:
    """Shuffling only permutes who gets which range: per topic the sizes match range's."""
    ranged, mixed = (
        a.assign(case.counts, case.subs) for a in (RangeAssignor(), ShuffledAssignor(3))
    )
    for topic in case.counts:
        sizes = [sorted(sum(tp.topic == topic for tp in r[m]) for m in r) for r in (ranged, mixed)]
        assert sizes[0] == sizes[1]


def many_small_topics() -> tuple[dict[str, int], dict[str, Subscription]]:
    counts = {f"topic-{i:02d}": 3 for i in range(50)}
    return counts, {f"member-{i}": Subscription(counts) for i in range(4)}


def test_spreads_remainders_much_better_than_range() -> None:
    counts, subs = many_small_topics()
    ranged = {m: len(v) for m, v in RangeAssignor().assign(counts, subs).items()}
    assert ranged == {"member-0": 50, "member-1": 50, "member-2": 50, "member-3": 0}
    for seed in range(5):
        shuffled = {m: len(v) for m, v in ShuffledAssignor(seed).assign(counts, subs).items()}
        assert sum(shuffled.values()) == 150
        assert max(shuffled.values()) - min(shuffled.values()) <= 20
        assert shuffled["member-0"] < ranged["member-0"] - 5
        assert min(shuffled.values()) > 20


def test_seeds_differ() -> None:
    counts, subs = many_small_topics()
    results = [ShuffledAssignor(seed).assign(counts, subs) for seed in range(10)]
    assert len({repr(sorted(r.items())) for r in results}) == 10


def test_same_seed_same_result_across_instances_and_input_order() -> None:
    counts, subs = many_small_topics()
    again = dict(reversed(list(subs.items())))
    assert ShuffledAssignor(42).assign(counts, subs) == ShuffledAssignor(42).assign(
        dict(reversed(list(counts.items()))), again
    )


def test_same_result_in_another_process() -> None:
    """The seeded order must not depend on the process (str hash randomisation): a leader
    elected after a restart must compute the same assignment."""
    counts = {"x": 2, "y": 1}
    subs = {m: Subscription(counts) for m in ("a", "b", "c")}
    first = ShuffledAssignor(0).assign(counts, subs)
    code = (
        "from streamassign.consumer import ShuffledAssignor, Subscription\n"
        "c = {'x': 2, 'y': 1}\n"
        "print(repr(sorted(ShuffledAssignor(0).assign(c, {m: Subscription(c) for m in 'abc'})"
        ".items())))"
    )
    other = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    ).stdout.strip()
    assert other == repr(sorted(first.items()))
