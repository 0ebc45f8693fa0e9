"""Streams wire formats: round trips, version prefixes, and typed errors on any garbage."""

from __future__ import annotations

import contextlib
import uuid
import zlib

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamassign import TaskId
from streamassign.errors import ErrorCode
from streamassign.protocol import (
    LATEST_OFFSET,
    NOW,
    AssignmentInfo,
    ProtocolError,
    SubscriptionInfo,
    read_header,
)

task_ids = st.builds(TaskId, st.integers(0, 2000), st.integers(0, 5000))
task_sets = st.frozensets(task_ids, max_size=40)
names = st.text(min_size=1, max_size=12)
codes = st.sampled_from(list(ErrorCode))
HEADER = b"\x00\x00\x00\x01\x00\x00\x00\x02"  # version 1, latest supported 2


@st.composite
def subscriptions(draw: st.DrawFn) -> SubscriptionInfo:
    version = draw(st.sampled_from([1, 2]))
    return SubscriptionInfo(
        uuid.UUID(int=draw(st.integers(0, 2**128 - 1))),
        endpoint=draw(st.one_of(st.none(), names)),
        offset_sums=draw(
            st.dictionaries(task_ids, st.one_of(st.just(LATEST_OFFSET), st.integers(0, 2**62)))
        ),
        previous_active=draw(task_sets),
        join_nonce=draw(st.integers(0, 2**31)),
        error_code=draw(codes),
        rack=draw(st.one_of(st.none(), names)) if version >= 2 else None,
        client_tags=draw(st.dictionaries(names, names, max_size=3)) if version >= 2 else {},
        version=version,
        latest_supported_version=draw(st.integers(version, 5)),
    )


@st.composite
def assignments(draw: st.DrawFn) -> AssignmentInfo:
    """Assignment data with host maps consistent with its topic dictionary, as the leader
    builds them: each task active on at most one host, standbys on others."""
    version = draw(st.sampled_from([1, 2]))
    topics = draw(
        st.dictionaries(
            st.integers(0, 50),
            st.dictionaries(names, st.integers(1, 300), min_size=1, max_size=3),
            max_size=4,
        )
    )
    tasks = [TaskId(s, p) for s, ts in topics.items() for p in range(max(ts.values()))]
    hosts = draw(st.lists(names, max_size=6, unique=True)) if tasks else []
    active: dict[str, set[TaskId]] = {}
    standby: dict[str, set[TaskId]] = {}
    for t in tasks:
        if hosts and draw(st.booleans()):
            owner = draw(st.sampled_from(hosts))
            active.setdefault(owner, set()).add(t)
            for h in draw(st.lists(st.sampled_from(hosts), max_size=2, unique=True)):
                if h != owner:
                    standby.setdefault(h, set()).add(t)
    return AssignmentInfo(
        active=draw(task_sets),
        standby=draw(task_sets),
        warmup=draw(task_sets) if version >= 2 else frozenset(),
        active_by_host={h: frozenset(ts) for h, ts in active.items()},
        standby_by_host={h: frozenset(ts) for h, ts in standby.items()},
        topics=topics,
        error_code=draw(codes),
        next_rebalance_ms=draw(st.integers(-1, 2**50)),
        version=version,
        common_version=version,
    )


@given(subscriptions())
def test_subscription_round_trip(info: SubscriptionInfo) -> None:
    data = info.encode()
    assert read_header(data) == (info.version, info.latest_supported_version)
    assert SubscriptionInfo.decode(data) == info


@given(assignments())
def test_assignment_round_trip(info: AssignmentInfo) -> None:
    assert AssignmentInfo.decode(info.encode()) == info


@given(subscriptions())
def test_a_leader_one_version_behind_reads_the_prefix(info: SubscriptionInfo) -> None:
    newer = attrs.evolve(info, version=2, latest_supported_version=2)
    old_view = SubscriptionInfo.decode(newer.encode(), max_version=1)
    assert old_view.offset_sums == newer.offset_sums
    assert old_view.process_id == newer.process_id
    assert (old_view.rack, old_view.client_tags) == (None, {})


@given(assignments())
def test_a_member_one_version_behind_reads_a_newer_assignment(info: AssignmentInfo) -> None:
    newer = attrs.evolve(info, version=2, common_version=2)
    seen = AssignmentInfo.decode(newer.encode(), max_version=1)
    assert (seen.active, seen.standby, seen.active_by_host) == (
        newer.active,
        newer.standby,
        newer.active_by_host,
    )
    assert seen.warmup == frozenset()


@given(st.one_of(st.binary(max_size=200), st.binary(max_size=200).map(HEADER.__add__)))
def test_garbage_is_a_protocol_error_and_nothing_else(data: bytes) -> None:
    """Random bytes, also behind a valid version header, either decode or raise ProtocolError."""
    for decode in (SubscriptionInfo.decode, AssignmentInfo.decode):
        with contextlib.suppress(ProtocolError):
            decode(data)


@given(subscriptions(), st.data())
def test_truncated_subscription_is_a_protocol_error(
    info: SubscriptionInfo, data: st.DataObject
) -> None:
    raw = info.encode()
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(ProtocolError):
        SubscriptionInfo.decode(raw[:cut])


def test_compact_host_maps_and_partitions_by_host() -> None:
    """Host maps travel as task runs over a topic dictionary; members expand them."""
    tasks = frozenset(TaskId(0, p) for p in range(64))
    info = AssignmentInfo(
        active_by_host={"host-1:8080": tasks},
        topics={0: {"orders": 64, "customers": 64, "short": 10}},
    )
    data = info.encode()
    assert len(data) < 80
    assert AssignmentInfo.decode(data) == info
    parts = info.partitions_by_host()["host-1:8080"]
    assert len(parts) == 64 + 64 + 10


def test_host_maps_must_fit_the_dictionary_and_name_one_active_per_task() -> None:
    topics = {0: {"t": 4}}
    with pytest.raises(ValueError, match="outside the topic dictionary"):
        AssignmentInfo(active_by_host={"h": frozenset({TaskId(0, 9)})}, topics=topics).encode()
    two = {"a": frozenset({TaskId(0, 1)}), "b": frozenset({TaskId(0, 1)})}
    with pytest.raises(ValueError, match="active on two hosts"):
        AssignmentInfo(active_by_host=two, topics=topics).encode()


def test_a_decompression_bomb_is_refused() -> None:
    bomb = zlib.compress(b"\x00" * (80 << 20))
    data = AssignmentInfo(version=1, common_version=1).encode()[:-1]  # minus host length 0
    w = bytearray(data)
    w += _varint(len(bomb)) + bomb
    with pytest.raises(ProtocolError, match="expands past"):
        AssignmentInfo.decode(bytes(w))


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def test_unknown_error_code_from_a_newer_peer_is_still_an_error() -> None:
    raw = bytearray(AssignmentInfo(error_code=ErrorCode.NONE, next_rebalance_ms=NOW).encode())
    raw[8] = 99  # the error code varint follows the 8-byte header
    assert AssignmentInfo.decode(bytes(raw)).error_code == ErrorCode.ASSIGNMENT_ERROR


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "no version header"),
        (b"\x00\x00\x00\x00\x00\x00\x00\x01", "bad version header"),
        (b"\x00\x00\x00\x03\x00\x00\x00\x02", "bad version header"),
        (b"\x00\x00\x00\x01\x00\x00\x00\x01" + b"\x00" * 4, "truncated process id"),
    ],
)
def test_typed_errors_say_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        SubscriptionInfo.decode(data)


def test_the_topic_dictionary_travels_without_host_maps() -> None:
    """Members without endpoints get no host maps, but still need the dictionary to turn their
    own tasks into partitions."""
    info = AssignmentInfo(
        active=frozenset({TaskId(3, 1)}), topics={3: {"orders": 4, "app-t-changelog": 4}}
    )
    seen = AssignmentInfo.decode(info.encode())
    assert seen.topics == info.topics
    assert (seen.active_by_host, seen.standby_by_host) == ({}, {})
    assert AssignmentInfo.decode(info.encode(), max_version=1).topics == info.topics
