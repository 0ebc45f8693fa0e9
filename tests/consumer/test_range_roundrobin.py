"""Range and round robin against naive references of Kafka's algorithms, and the KIP-54
examples where the KIP states their results."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streamassign import TopicPartition
from streamassign.consumer import RangeAssignor, RoundRobinAssignor, Subscription

from .strategies import Case, cases, owners, reference_range, reference_roundrobin


def tps(*names: str) -> list[TopicPartition]:
    """``tps("t0p1", "t2p0")`` -> the partitions, written as in KIP-54."""
    out = []
    for name in names:
        topic, _, p = name.rpartition("p")
        out.append(TopicPartition(topic, int(p)))
    return out


@given(cases(user_data=False))
def test_range_matches_reference(case: Case) -> None:
    assert RangeAssignor().assign(case.counts, case.subs) == reference_range(case.counts, case.subs)


@st.composite
def copartitioned(draw: st.DrawFn) -> Case:
    """A group of 2-4 topics of one partition count that the same members subscribe to (a
    co-partitioned join's inputs), beside topics of other counts some members add."""
    count = draw(st.integers(1, 8))
    group = [f"join{i}" for i in range(draw(st.integers(2, 4)))]
    others = {f"other{i}": n for i, n in enumerate(draw(st.lists(st.integers(0, 8), max_size=3)))}
    members = [f"m{k}" for k in range(draw(st.integers(1, 6)))]
    subs = {}
    for m in members:
        extra = draw(st.lists(st.sampled_from(sorted(others)), unique=True)) if others else []
        subs[m] = Subscription({*group, *extra})
    ones = dict.fromkeys(members, 1)
    counts = {**dict.fromkeys(group, count), **others}
    return Case(counts, subs, ones, dict.fromkeys(members, 0), frozenset())


@given(st.one_of(cases(user_data=False), copartitioned()))
def test_range_copartitions_equal_topics(case: Case) -> None:
    """Partition p of equally sized topics with the same subscribers lands on one member."""
    owner = owners(RangeAssignor().assign(case.counts, case.subs))
    subscribers = {
        t: frozenset(m for m, s in case.subs.items() if t in s.topics) for t in case.counts
    }
    pairs = [
        (t, u)
        for t in case.counts
        for u in case.counts
        if t < u
        and case.counts[t] == case.counts[u] > 0
        and subscribers[t] == subscribers[u] != set()
    ]
    for t, u in pairs:
        for p in range(case.counts[t]):
            assert owner.get(TopicPartition(t, p)) == owner.get(TopicPartition(u, p))


@given(cases(user_data=False))
def test_roundrobin_matches_reference(case: Case) -> None:
    result = RoundRobinAssignor().assign(case.counts, case.subs)
    assert result == reference_roundrobin(case.counts, case.subs)


def test_range_by_hand() -> None:
    subs = {"c10": Subscription({"x", "y"}), "c2": Subscription({"x"}), "c1": Subscription({"x"})}
    assert RangeAssignor().assign({"x": 7, "y": 2}, subs) == {
        "c1": tps("xp0", "xp1", "xp2"),  # sorted ids: c1 < c10 < c2; 7 = 3 + 2 + 2
        "c10": tps("xp3", "xp4", "yp0", "yp1"),
        "c2": tps("xp5", "xp6"),
    }


def test_range_more_members_than_partitions() -> None:
    subs = {m: Subscription({"t"}) for m in ("a", "b", "c", "d")}
    assert RangeAssignor().assign({"t": 2}, subs) == {
        "a": tps("tp0"),
        "b": tps("tp1"),
        "c": [],
        "d": [],
    }


def test_roundrobin_kip54_example_1() -> None:
    counts = {f"t{i}": 2 for i in range(4)}
    subs = {f"C{i}": Subscription(counts) for i in range(3)}
    assert RoundRobinAssignor().assign(counts, subs) == {
        "C0": tps("t0p0", "t1p1", "t3p0"),
        "C1": tps("t0p1", "t2p0", "t3p1"),
        "C2": tps("t1p0", "t2p1"),
    }
    del subs["C1"]
    assert RoundRobinAssignor().assign(counts, subs) == {
        "C0": tps("t0p0", "t1p0", "t2p0", "t3p0"),
        "C2": tps("t0p1", "t1p1", "t2p1", "t3p1"),
    }


def test_roundrobin_kip54_example_2() -> None:
    counts = {"t0": 1, "t1": 2, "t2": 3}
    subs = {
        "C0": Subscription({"t0"}),
        "C1": Subscription({"t0", "t1"}),
        "C2": Subscription({"t0", "t1", "t2"}),
    }
    assert RoundRobinAssignor().assign(counts, subs) == {
        "C0": tps("t0p0"),
        "C1": tps("t1p0"),
        "C2": tps("t1p1", "t2p0", "t2p1", "t2p2"),
    }
    del subs["C0"]
    assert RoundRobinAssignor().assign(counts, subs) == {
        "C1": tps("t0p0", "t1p1"),
        "C2": tps("t1p0", "t2p0", "t2p1", "t2p2"),
    }


def test_kip54_example_3_range_and_roundrobin() -> None:
    counts = {"t0": 2, "t1": 2}
    two = {"C0": Subscription(counts), "C1": Subscription(counts)}
    expected = {"C0": tps("t0p0", "t1p0"), "C1": tps("t0p1", "t1p1")}
    assert RangeAssignor().assign(counts, two) == expected
    assert RoundRobinAssignor().assign(counts, two) == expected
    three = {**two, "C2": Subscription(counts)}
    assert RangeAssignor().assign(counts, three) == {**expected, "C2": []}
    assert RoundRobinAssignor().assign(counts, three) == {
        "C0": tps("t0p0", "t1p1"),
        "C1": tps("t0p1"),
        "C2": tps("t1p0"),
    }
