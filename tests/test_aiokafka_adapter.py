"""The aiokafka adapter's contract, without a broker (the broker tests are in tests/integration).

The leader's ``assign`` receives aiokafka's structs and a cluster view; here the view is a small
stand-in exposing ``partitions_for_topic``, the one method the adapter calls on it.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import tracemalloc
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.consumer.subscription_state import SubscriptionState
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from aiokafka.structs import TopicPartition as KafkaTP

from streamassign import TopicPartition
from streamassign.aiokafka import GroupAssignor, validate
from streamassign.aiokafka.consumer import MAX_GENERATION
from streamassign.aiokafka.rejoin import fetch_states, request_rejoin
from streamassign.consumer import (
    Assignment,
    RangeAssignor,
    StickyAssignor,
    Subscription,
)
from streamassign.consumer.userdata import AssignmentData, MemberData
from streamassign.consumer.userdata import UserDataError as UDE
from streamassign.errors import ErrorCode


class Cluster:
    def __init__(self, counts: Mapping[str, int]) -> None:
        self.counts = counts

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        n = self.counts.get(topic)
        return None if n is None else set(range(n))


class Recorder:
    """Stands in for a consumer: only ``_coordinator.request_rejoin`` is touched."""

    def __init__(self) -> None:
        self.rejoins = 0
        self._coordinator = self

    def request_rejoin(self) -> None:
        self.rejoins += 1


def decode(raw: bytes) -> tuple[list[TopicPartition], AssignmentData]:
    a = ConsumerProtocolMemberAssignment.decode(raw)
    return [TopicPartition(*tp) for tp in a.partitions()], AssignmentData.decode(a.user_data)


def join(assignors: Mapping[str, GroupAssignor], topics: Mapping[str, list[str]]) -> dict[str, Any]:
    return {m: a.metadata(topics[m]) for m, a in assignors.items()}


def test_leader_assigns_every_member_only_subscribed_topics() -> None:
    members = {"a": GroupAssignor(StickyAssignor()), "b": GroupAssignor(StickyAssignor())}
    meta = join(members, {"a": ["t", "u"], "b": ["t"]})
    out = members["a"].assign(Cluster({"t": 4, "u": 2}), meta)
    assert set(out) == {"a", "b"}
    got = {m: decode(raw) for m, raw in out.items()}
    assert all(tp.topic == "t" for tp in got["b"][0])
    assert sorted(tp for tps, _ in got.values() for tp in tps) == sorted(
        [TopicPartition("t", p) for p in range(4)] + [TopicPartition("u", p) for p in range(2)]
    )
    assert {data.error_code for _, data in got.values()} == {ErrorCode.NONE}


class Exploding:
    name = "exploding"

    def assign(self, partitions_per_topic: Any, subscriptions: Any) -> Assignment:
        raise RuntimeError("boom")


class Sloppy:
    """Returns a result aiokafka would choke on (a member missing)."""

    name = "sloppy"

    def assign(self, partitions_per_topic: Any, subscriptions: Any) -> Assignment:
        return {}


@pytest.mark.parametrize("pure", [Exploding(), Sloppy()])
def test_any_failure_becomes_an_error_code_for_every_member(
    pure: Any, caplog: pytest.LogCaptureFixture
) -> None:
    leader = GroupAssignor(pure)
    meta = {"a": leader.metadata(["t"]), "b": leader.metadata(["t"])}
    with caplog.at_level(logging.ERROR):
        out = leader.assign(Cluster({"t": 3}), meta)
    assert set(out) == {"a", "b"}
    for raw in out.values():
        partitions, data = decode(raw)
        assert partitions == [] and data.error_code == ErrorCode.ASSIGNMENT_ERROR
    assert "assignment failed" in caplog.text
    assert leader.last_round is not None and leader.last_round.error


def test_validate_rejects_what_aiokafka_would_choke_on() -> None:
    subs = {"a": Subscription({"t"}), "b": Subscription({"t"})}
    counts = {"t": 2, "u": 1}
    t0, t1, u0 = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("u", 0)
    validate({"a": [t0], "b": [t1]}, subs, counts)
    for bad, message in [
        ({"a": [t0, t1]}, "members missing"),
        ({"a": [t0, u0], "b": []}, "unsubscribed topic"),
        ({"a": [t0], "b": [t0]}, "assigned to a and b"),
        ({"a": [TopicPartition("t", 5)], "b": []}, "nonexistent partition"),
        ({"a": [], "b": [], "c": []}, "unknown member"),
    ]:
        with pytest.raises(Exception, match=message):
            validate(bad, subs, counts)


def test_garbage_subscription_user_data_means_no_history(caplog: pytest.LogCaptureFixture) -> None:
    leader = GroupAssignor(RangeAssignor())
    meta = {
        "a": leader.metadata(["t"]),
        "b": ConsumerProtocolMemberMetadata(0, ["t"], b"\xff\x00garbage"),
        "c": ConsumerProtocolMemberMetadata(0, ["t"], None),
    }
    with caplog.at_level(logging.WARNING):
        out = leader.assign(Cluster({"t": 6}), meta)
    assert [len(decode(out[m])[0]) for m in "abc"] == [2, 2, 2]
    assert "member b" in caplog.text and "no history" in caplog.text


def test_a_consumer_whose_pattern_matches_no_topic_yet_is_no_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A plain consumer subscribed to a pattern that matches no topic yet joins with an empty
    topic list: it gets nothing, and that is no fault to warn of at every rebalance."""
    leader = GroupAssignor(RangeAssignor())
    meta = {"a": leader.metadata(["t"]), "b": ConsumerProtocolMemberMetadata(0, [], b"")}
    with caplog.at_level(logging.DEBUG, logger="streamassign"):
        out = leader.assign(Cluster({"t": 4}), meta)
    assert [len(decode(out[m])[0]) for m in "ab"] == [4, 0]
    empty = [r for r in caplog.records if "an empty topic list" in r.getMessage()]
    assert [r.levelno for r in empty] == [logging.DEBUG]


def test_instances_keep_their_own_state() -> None:
    """Unlike aiokafka's sticky assignor (class attributes), two consumers never share state."""
    a, b = GroupAssignor(StickyAssignor()), GroupAssignor(StickyAssignor())
    out = a.assign(Cluster({"t": 4}), {"a": a.metadata(["t"]), "b": b.metadata(["t"])})
    a.on_assignment(ConsumerProtocolMemberAssignment.decode(out["a"]))
    owned_a = MemberData.decode(a.metadata(["t"]).user_data).owned_partitions
    owned_b = MemberData.decode(b.metadata(["t"]).user_data).owned_partitions
    assert len(owned_a) == 2 and owned_b == ()


def test_join_epoch_changes_on_every_join() -> None:
    a = GroupAssignor(StickyAssignor())
    epochs = [MemberData.decode(a.metadata(["t"]).user_data).join_epoch for _ in range(3)]
    assert len(set(epochs)) == 3


def test_followup_asks_the_bound_consumer_to_rejoin_with_a_cap() -> None:
    consumer = Recorder()
    a = GroupAssignor(StickyAssignor(), max_followups=2).bind(consumer)
    followup = ConsumerProtocolMemberAssignment(0, [], AssignmentData(3, followup=True).encode())
    for _ in range(4):
        a.on_assignment(followup)
    assert consumer.rejoins == 2  # capped: no rebalance storm
    a.on_assignment(ConsumerProtocolMemberAssignment(0, [], AssignmentData(4).encode()))
    a.on_assignment(followup)
    assert consumer.rejoins == 3  # the cap resets after a final assignment


def test_error_assignment_retries_with_growing_backoff() -> None:
    consumer = Recorder()
    a = GroupAssignor(StickyAssignor()).bind(consumer)
    failed = ConsumerProtocolMemberAssignment(
        0, [], AssignmentData(error_code=ErrorCode.ASSIGNMENT_ERROR).encode()
    )

    async def scenario() -> list[float]:
        loop = asyncio.get_running_loop()
        delays: list[float] = []
        real = loop.call_later

        def spy(delay: float, *args: Any) -> Any:
            delays.append(delay)
            return real(0, *args)

        loop.call_later = spy  # type: ignore[method-assign]
        for _ in range(3):
            a.on_assignment(failed)
        asked = list(delays)
        loop.call_later = real  # type: ignore[method-assign]
        await asyncio.sleep(0.01)  # let the scheduled rejoins run
        return asked

    assert asyncio.run(scenario()) == [1.0, 2.0, 4.0]
    assert consumer.rejoins == 1  # each failure's retry replaces the one still pending


def test_unreadable_assignment_data_is_an_error_not_a_crash() -> None:
    a = GroupAssignor(StickyAssignor())
    a.on_assignment(ConsumerProtocolMemberAssignment(0, [], b"\x01"))
    assert a.last_assignment.error_code == ErrorCode.ASSIGNMENT_ERROR
    with pytest.raises(UDE):
        AssignmentData.decode(b"\x01")


def test_state_file_survives_a_restart_and_garbage_is_ignored(tmp_path: Path) -> None:
    state = tmp_path / "member.state"
    a = GroupAssignor(StickyAssignor(), state_file=state)
    out = a.assign(Cluster({"t": 4}), {"a": a.metadata(["t"])})
    a.on_assignment(ConsumerProtocolMemberAssignment.decode(out["a"]))
    restarted = GroupAssignor(StickyAssignor(), state_file=state)
    data = MemberData.decode(restarted.metadata(["t"]).user_data)
    assert len(data.owned_partitions) == 4 and data.generation == 0
    state.write_bytes(b"garbage")
    fresh = GroupAssignor(StickyAssignor(), state_file=state)
    assert MemberData.decode(fresh.metadata(["t"]).user_data).owned_partitions == ()


def test_create_by_name() -> None:
    assert GroupAssignor.create("shuffled", seed=3).assignor.seed == 3  # type: ignore[attr-defined]
    assert GroupAssignor.create("sticky").name == "streamassign-sticky"
    with pytest.raises(ValueError, match="unknown assignor 'nope'"):
        GroupAssignor.create("nope")


def test_rejoin_touch_point_on_a_real_consumer() -> None:
    """The private attribute exists on aiokafka's consumer; before start there is nothing to
    ask (the started case is exercised by the cooperative broker test)."""

    async def scenario() -> bool:
        consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1", group_id="g")
        assert hasattr(consumer, "_coordinator")
        return request_rejoin(consumer)

    assert asyncio.run(scenario()) is False
    assert request_rejoin(object()) is False


def test_generation_at_the_int32_limit_stays_there() -> None:
    """Reproducer of the audit: a claim at 2**31 - 1 made ``assign`` raise (generation + 1
    does not fit the wire). The leader's generation now stops at the limit, still >= every
    claim; a leader already there stays there too."""
    claim = MemberData(owned_partitions=[("t", 0)], generation=MAX_GENERATION).encode()
    leader = GroupAssignor.create("sticky")
    meta = {"m1": ConsumerProtocolMemberMetadata(0, ["t"], claim), "m2": leader.metadata(["t"])}
    for _ in range(2):
        out = leader.assign(Cluster({"t": 3}), meta)
        got = {m: decode(raw) for m, raw in out.items()}
        assert {data.error_code for _, data in got.values()} == {ErrorCode.NONE}
        assert {data.generation for _, data in got.values()} == {MAX_GENERATION}
        assert TopicPartition("t", 0) in got["m1"][0]
        assert sorted(tp for tps, _ in got.values() for tp in tps) == [
            TopicPartition("t", p) for p in range(3)
        ]
        leader.on_assignment(ConsumerProtocolMemberAssignment.decode(out["m2"]))
        meta["m2"] = leader.metadata(["t"])


def test_failure_next_to_a_maximal_generation_still_sends_error_codes() -> None:
    leader = GroupAssignor(Exploding())
    claim = MemberData(generation=MAX_GENERATION).encode()
    out = leader.assign(Cluster({"t": 3}), {"a": ConsumerProtocolMemberMetadata(0, ["t"], claim)})
    assert decode(out["a"]) == ([], AssignmentData(error_code=ErrorCode.ASSIGNMENT_ERROR))


@pytest.mark.parametrize(
    ("name", "share"), [("sticky", 3), ("cooperative-sticky", 3), ("weighted", 4), ("failover", 6)]
)
def test_claims_beyond_the_cluster_cost_the_leader_nothing(name: str, share: int) -> None:
    """43 bytes claim a million partitions of a 6-partition topic: the leader builds only the
    6 that exist, once (the pure assignors read weight and priority without building any)."""
    runs = struct.pack(">ih", 1, 1) + b"t" + struct.pack(">iii", 1, 0, 1_000_000)
    data = MemberData(priority=1, weight=2).encode()[:-4] + runs
    leader = GroupAssignor.create(name)
    meta = {"a": ConsumerProtocolMemberMetadata(0, ["t"], data), "b": leader.metadata(["t"])}
    tracemalloc.start()
    try:
        out = leader.assign(Cluster({"t": 6}), meta)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2_000_000  # building the claim took over 100 MB
    assert leader.last_round is not None
    assert leader.last_round.subscriptions["a"].owned_partitions == tuple(
        TopicPartition("t", p) for p in range(6)
    )
    assert len(decode(out["a"])[0]) == share  # weight 2 and priority 1 were read


def test_fetch_states_say_where_a_partition_s_fetching_stands() -> None:
    """The recovery watchdog's diagnosis (``fetch_states``) read off aiokafka's own
    subscription state: position, pause, reset, records buffered, the leader's node busy."""
    fetched, paused, fresh, gone = (KafkaTP("cl", p) for p in range(4))

    async def states() -> dict[Any, str]:
        subscription = SubscriptionState()
        subscription.assign_from_user({fetched, paused, fresh})
        subscription.seek(fetched, 33)
        subscription.seek(paused, 7)
        subscription.pause(paused)
        consumer = SimpleNamespace(
            _subscription=subscription,
            _fetcher=SimpleNamespace(_records={fetched: object()}, _in_flight={1}),
            _client=SimpleNamespace(
                cluster=SimpleNamespace(leader_for_partition=lambda tp: 1 if tp == fetched else 2)
            ),
        )
        return fetch_states(consumer, [fetched, paused, fresh, gone])

    assert asyncio.run(states()) == {
        fetched: "at 33 buffered node 1 busy",
        paused: "at 7 paused",
        fresh: "at None",
        gone: "unassigned",
    }
    assert fetch_states(object(), [fetched]) == {}
