"""The contract every consumer assignor shares (DESIGN.md §2), checked for all seven."""

from __future__ import annotations

import logging
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamassign import TopicPartition
from streamassign.consumer import (
    ConsumerAssignor,
    CooperativeStickyAssignor,
    FailoverAssignor,
    RangeAssignor,
    RoundRobinAssignor,
    ShuffledAssignor,
    StickyAssignor,
    Subscription,
    WeightedAssignor,
)

from .strategies import (
    Case,
    captured_warnings,
    cases,
    check_contract,
    shuffled,
    time_limit,
)

ASSIGNORS = [
    RangeAssignor(),
    RoundRobinAssignor(),
    StickyAssignor(),
    CooperativeStickyAssignor(),
    FailoverAssignor(),
    WeightedAssignor(),
    ShuffledAssignor(seed=7),
]
IDS = [a.name for a in ASSIGNORS]


def may_be_withheld(case: Case) -> set[TopicPartition]:
    """Partitions the cooperative round may hold back: any a present member claims (whatever
    its generation or subscription: KIP-429's safety rule, conservatively)."""
    return {
        TopicPartition(t, p)
        for s in case.subs.values()
        for t, p in s.owned_partitions
        if t in case.counts and 0 <= p < case.counts[t]
    }


@given(case=cases(), seed=st.integers(0, 2**32 - 1))
def test_contract_and_determinism(case: Case, seed: int) -> None:
    """For every assignor: valid for any input; warns exactly when subscribed topics are
    missing from the metadata; the same result whatever order the input was built in.

    One example runs all seven assignors (generating inputs costs more than assigning them).
    """
    counts2, subs2 = shuffled(case.counts, case.subs, random.Random(seed))
    for assignor in ASSIGNORS:
        try:
            check_assignor(assignor, case, counts2, subs2)
        except (AssertionError, TimeoutError) as exc:
            exc.add_note(f"assignor: {assignor!r}")
            raise


def check_assignor(
    assignor: ConsumerAssignor,
    case: Case,
    counts2: dict[str, int],
    subs2: dict[str, Subscription],
) -> None:
    with captured_warnings("streamassign.consumer") as records, time_limit(5):
        result = assignor.assign(case.counts, case.subs)
    if isinstance(assignor, CooperativeStickyAssignor):
        check_contract(case.counts, case.subs, result, may_be_withheld(case))
    else:
        check_contract(case.counts, case.subs, result)
    missing = [r for r in records if "missing from the metadata" in r.getMessage()]
    if case.missing:
        assert len(missing) == 1
        assert all(t in missing[0].getMessage() for t in case.missing)
        assert missing[0].levelno == logging.WARNING
    else:
        assert not missing

    with time_limit(5):
        again = assignor.assign(counts2, subs2)
    assert again == result


@pytest.mark.parametrize("assignor", ASSIGNORS, ids=IDS)
def test_missing_topic_warns_and_is_ignored(assignor, caplog: pytest.LogCaptureFixture) -> None:
    subs = {
        "m1": Subscription({"present", "deleted"}),
        "m2": Subscription({"present"}),
        "m3": Subscription({"deleted"}),
    }
    with caplog.at_level(logging.WARNING, logger="streamassign.consumer"):
        result = assignor.assign({"present": 4, "unsubscribed": 3}, subs)
    assert "deleted" in caplog.text
    assert any(r.levelno == logging.WARNING for r in caplog.records)
    assert result["m3"] == []
    assert sorted(result["m1"] + result["m2"]) == [TopicPartition("present", p) for p in range(4)]


@pytest.mark.parametrize("assignor", ASSIGNORS, ids=IDS)
def test_only_missing_topics(assignor, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="streamassign.consumer"):
        result = assignor.assign({}, {"m": Subscription({"nope"}), "n": Subscription(())})
    assert result == {"m": [], "n": []}
    assert "nope" in caplog.text


@pytest.mark.parametrize("assignor", ASSIGNORS, ids=IDS)
def test_empty_group(assignor) -> None:
    assert assignor.assign({"t": 3}, {}) == {}


@pytest.mark.parametrize("assignor", ASSIGNORS, ids=IDS)
def test_no_warning_when_all_topics_exist(assignor, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="streamassign.consumer"):
        assignor.assign({"t": 3, "u": 0}, {"m": Subscription({"t", "u"})})
    assert not caplog.records


@pytest.mark.parametrize("assignor", ASSIGNORS, ids=IDS)
@pytest.mark.parametrize("count", [-1, 1.5, "3", True, None])
def test_bad_partition_count_is_rejected(assignor, count: object) -> None:
    with pytest.raises(ValueError):
        assignor.assign({"t": count}, {"m": Subscription({"t"})})


def test_topics_as_a_string_is_rejected() -> None:
    with pytest.raises(TypeError):
        Subscription("orders")
