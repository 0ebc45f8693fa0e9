"""Failover: every partition of a topic to its subscriber with the highest priority."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given

from streamassign import TopicPartition
from streamassign.consumer import FailoverAssignor, MemberData, Subscription

from .strategies import GARBAGE_USER_DATA, Case, captured_warnings, cases, check_contract

FAILOVER = FailoverAssignor()


def prio(p: int) -> bytes:
    return MemberData(priority=p).encode()


def reference_failover(case: Case) -> dict[str, list[TopicPartition]]:
    out: dict[str, list[TopicPartition]] = {m: [] for m in case.subs}
    for topic in sorted(case.counts):
        subscribers = [m for m, s in case.subs.items() if topic in s.topics]
        if subscribers:
            best = min(subscribers, key=lambda m: (-case.priorities[m], m))
            out[best].extend(TopicPartition(topic, p) for p in range(case.counts[topic]))
    return out


@given(cases())
def test_matches_reference(case: Case) -> None:
    with captured_warnings("streamassign.consumer") as records:
        result = FAILOVER.assign(case.counts, case.subs)
    check_contract(case.counts, case.subs, result)
    assert result == reference_failover(case)
    warned = " ".join(r.getMessage() for r in records)
    for m in case.garbage:
        assert m in warned  # the member whose data is unreadable is named


@given(cases(min_members=2))
def test_when_the_primary_leaves_the_next_takes_over(case: Case) -> None:
    result = FAILOVER.assign(case.counts, case.subs)
    for primary in [m for m, tps in result.items() if tps]:
        rest = {m: s for m, s in case.subs.items() if m != primary}
        after = FAILOVER.assign(case.counts, rest)
        for tp in result[primary]:
            subscribers = [m for m, s in rest.items() if tp.topic in s.topics]
            if subscribers:
                heir = min(subscribers, key=lambda m: (-case.priorities[m], m))
                assert tp in after[heir]
        for m, tps in result.items():  # nobody else loses anything
            if m != primary:
                assert set(tps) <= set(after[m])


def test_by_hand() -> None:
    counts = {"orders": 3, "audit": 1}
    subs = {
        "active": Subscription({"orders", "audit"}, user_data=prio(10)),
        "passive": Subscription({"orders", "audit"}, user_data=prio(5)),
        "audit-only": Subscription({"audit"}, user_data=prio(20)),
    }
    result = FAILOVER.assign(counts, subs)
    assert result == {
        "active": [TopicPartition("orders", p) for p in range(3)],
        "passive": [],
        "audit-only": [TopicPartition("audit", 0)],
    }
    del subs["active"]
    assert FAILOVER.assign(counts, subs)["passive"] == [
        TopicPartition("orders", p) for p in range(3)
    ]


def test_ties_go_to_the_smallest_member_id() -> None:
    subs = {m: Subscription({"t"}, user_data=prio(3)) for m in ("b", "a2", "c")}
    subs["a10"] = Subscription({"t"}, user_data=prio(2))
    assert FAILOVER.assign({"t": 2}, subs)["a2"] == [TopicPartition("t", 0), TopicPartition("t", 1)]


def test_negative_priority_loses_to_the_default() -> None:
    subs = {"a": Subscription({"t"}, user_data=prio(-1)), "b": Subscription({"t"})}
    assert FAILOVER.assign({"t": 1}, subs) == {"a": [], "b": [TopicPartition("t", 0)]}


@pytest.mark.parametrize("garbage", GARBAGE_USER_DATA)
def test_garbage_user_data_means_priority_zero(
    garbage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    subs = {
        "a-low": Subscription({"t"}, user_data=prio(-1)),
        "b-garbage": Subscription({"t"}, user_data=garbage),
        "c-zero": Subscription({"t"}, user_data=prio(0)),
    }
    with caplog.at_level(logging.WARNING, logger="streamassign.consumer"):
        result = FAILOVER.assign({"t": 2}, subs)
    assert result["b-garbage"] == [TopicPartition("t", 0), TopicPartition("t", 1)]  # 0, then id
    assert "b-garbage" in caplog.text
    subs["c-zero"] = Subscription({"t"}, user_data=prio(1))
    assert FAILOVER.assign({"t": 2}, subs)["b-garbage"] == []
