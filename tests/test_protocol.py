"""Streams wire formats: round trips, version prefixes, and typed errors on any garbage."""

from __future__ import annotations

import contextlib
import tracemalloc
import uuid
import zlib
from unittest import mock

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamassign import Subtopology, TaskId, Topology, protocol
from streamassign.errors import ErrorCode
from streamassign.protocol import (
    MAX_TASK_IDS,
    NOW,
    AnnouncementMemo,
    AssignmentInfo,
    ProtocolError,
    SubscriptionInfo,
    _Reader,
    _Writer,
    read_header,
)
from streamassign.streams import MemberSubscription, assign_streams

from .strategies import assignment_infos as assignments
from .strategies import subscription_infos as subscriptions
from .strategies import varint

HEADER = b"\x00\x00\x00\x01\x00\x00\x00\x02"  # version 1, latest supported 2


@given(subscriptions())
def test_subscription_round_trip(info: SubscriptionInfo) -> None:
    data = info.encode()
    assert read_header(data) == (info.version, info.latest_supported_version)
    assert SubscriptionInfo.decode(data) == info


@settings(max_examples=max(10, settings.default.max_examples // 4))  # up to 1,200 tasks each
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


@settings(max_examples=max(10, settings.default.max_examples // 4))  # up to 1,200 tasks each
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


def _decoded_or_error(data: bytes, memo: AnnouncementMemo | None) -> object:
    try:
        return SubscriptionInfo.decode(data, announced_ids={0, 5}, announcements=memo)
    except ProtocolError as exc:
        return str(exc)


@given(st.lists(subscriptions(), min_size=1, max_size=6), st.data())
def test_a_leaders_memo_of_announcements_changes_no_decode(
    infos: list[SubscriptionInfo], data: st.DataObject
) -> None:
    """Members of one topology version send the same tail; a leader reads it once a round
    (``AnnouncementMemo``). Every member decodes, or fails, as it does without the memo:
    members sharing a tail, other tails, damaged bytes around them."""
    shared = {0: frozenset({1, 2}), 5: frozenset({0})}
    raws = []
    for info in infos:
        if info.version == 3 and data.draw(st.booleans()):
            info = attrs.evolve(info, subtopology_topic_indices=shared)
        raw = bytearray(info.encode())
        if data.draw(st.booleans()):  # damage: one byte anywhere, the tail included
            at = data.draw(st.integers(0, len(raw) - 1))
            raw[at] = data.draw(st.integers(0, 255))
        raws.append(bytes(raw))
    memo = AnnouncementMemo()
    for raw in raws + raws:  # each read twice: the second from the memo when it read cleanly
        assert _decoded_or_error(raw, memo) == _decoded_or_error(raw, None)


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
    w += varint(len(bomb)) + bomb
    with pytest.raises(ProtocolError, match="expands past"):
        AssignmentInfo.decode(bytes(w))


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


# -- limits: what one decode may cost, and nothing written that a reader refuses ---------------

V1 = b"\x00\x00\x00\x01\x00\x00\x00\x01"  # version 1, latest supported 1


def _subscription_with_runs(lengths: list[int]) -> bytes:
    """A version-1 subscription whose previous actives are adjacent runs of these lengths."""
    runs = b"".join(varint(0) + varint(n - 1) for n in lengths)
    previous = varint(1) + varint(0) + varint(len(lengths)) + runs  # one subtopology, 0
    no_endpoint_no_sums = varint(0) + varint(0)
    return V1 + uuid.UUID(int=1).bytes + no_endpoint_no_sums + previous + varint(0) + varint(0)


def _assignment_with_section(section: bytes) -> bytes:
    """A version-1 assignment without tasks, carrying ``section`` as its host section."""
    blob = zlib.compress(section)
    no_tasks = varint(0) + varint(0)
    return V1 + varint(0) + varint(1) + no_tasks + varint(len(blob)) + blob  # next: NEVER


def _section_of_empty_slots(count: int) -> bytes:
    """A host section whose dictionary says topic ``t`` has ``count`` tasks, none hosted."""
    names = varint(1) + varint(1) + b"t"
    dictionary = varint(1) + varint(0) + varint(1) + varint(0) + varint(count)
    return names + dictionary + varint(0) + bytes(2 * count)  # no hosts; slots, standby counts


def test_task_ids_past_the_budget_are_refused_before_they_are_made() -> None:
    """Runs each within the old per-run cap but together past ``MAX_TASK_IDS`` (the audit made
    8.4M ids, 1.2 GB, from 63 bytes): a ``ProtocolError`` naming the limit, before the ids
    exist."""
    small = SubscriptionInfo.decode(_subscription_with_runs([3, 4]))
    assert small.previous_active == {TaskId(0, p) for p in range(7)}
    data = _subscription_with_runs([1, MAX_TASK_IDS])
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError, match=f"MAX_TASK_IDS = {MAX_TASK_IDS}"):
            SubscriptionInfo.decode(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_empty_task_slots_past_the_budget_are_refused() -> None:
    """A small compressed section whose dictionary claims more tasks than ``MAX_TASK_IDS`` (the
    audit's 58 KB inflated to 30M one-byte slots, 13 s of CPU) is refused before the slots are
    read."""
    few = AssignmentInfo.decode(_assignment_with_section(_section_of_empty_slots(5)))
    assert (few.topics, few.active_by_host) == ({0: {"t": 5}}, {})
    with pytest.raises(ProtocolError, match=f"MAX_TASK_IDS = {MAX_TASK_IDS}"):
        AssignmentInfo.decode(_assignment_with_section(_section_of_empty_slots(MAX_TASK_IDS + 1)))


def test_the_inflate_cap_is_16_bytes_per_budget_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(protocol, "MAX_TASK_IDS", 1000)
    with pytest.raises(ProtocolError, match="expands past 16000 bytes"):
        AssignmentInfo.decode(_assignment_with_section(bytes(16001)))
    # 16000 zeros inflate and are read: empty dictionaries, then trailing bytes
    with pytest.raises(ProtocolError, match="trailing bytes in the host map section"):
        AssignmentInfo.decode(_assignment_with_section(bytes(16000)))


@settings(max_examples=25)
@given(subscriptions(), assignments(max_partitions=20), st.integers(0, 200))
def test_the_writer_refuses_exactly_what_the_budget_refuses(
    sub: SubscriptionInfo, asg: AssignmentInfo, limit: int
) -> None:
    """Under any budget, data the writer accepts decodes back, and data it refuses (a
    ``ValueError``) is what a reader with that budget refuses."""
    for info, decode in ((sub, SubscriptionInfo.decode), (asg, AssignmentInfo.decode)):
        raw = info.encode()
        with mock.patch.object(protocol, "MAX_TASK_IDS", limit):
            try:
                again = info.encode()
            except ValueError as exc:
                assert "MAX_TASK_IDS" in str(exc)
                with pytest.raises(ProtocolError, match=r"MAX_TASK_IDS|expands past"):
                    decode(raw)
            else:
                assert again == raw
                assert decode(raw) == info


@given(st.integers(0, 2**72))
def test_the_writer_writes_exactly_the_varints_the_reader_reads(n: int) -> None:
    w = _Writer()
    if n >= 2**64:
        with pytest.raises(ValueError, match="64-bit"):
            w.uint(n)
    else:
        w.uint(n)
        r = _Reader(w.finish(), start=0)
        assert r.uint() == n
        assert r.done()


@given(st.integers(-(2**66), 2**66))
def test_signed_varints_are_int64(n: int) -> None:
    w = _Writer()
    if not -(2**63) <= n < 2**63:
        with pytest.raises(ValueError, match="signed 64-bit"):
            w.sint(n)
    else:
        w.sint(n)
        assert _Reader(w.finish(), start=0).sint() == n


@pytest.mark.parametrize("last", [b"\x02", b"\x7f", b"\x80\x01"])
def test_varints_over_64_bits_are_refused(last: bytes) -> None:
    assert _Reader(b"\xff" * 9 + b"\x01", start=0).uint() == 2**64 - 1
    with pytest.raises(ProtocolError, match="over 64 bits"):
        _Reader(b"\xff" * 9 + last, start=0).uint()


@pytest.mark.parametrize(
    "info",
    [
        AssignmentInfo(active=frozenset({TaskId(2**70, 0)})),
        AssignmentInfo(standby=frozenset({TaskId(0, 2**70)})),
        AssignmentInfo(topics={2**70: {"t": 1}}),
        AssignmentInfo(topics={0: {"t": 2**70}}),
        AssignmentInfo(next_rebalance_ms=2**63),
    ],
)
def test_a_leader_refuses_to_write_what_members_cannot_read(info: AssignmentInfo) -> None:
    """Subtopology ids, partitions and counts past 64 bits: a ``ValueError`` at the leader (its
    log names the cause) instead of an assignment every member rejects forever."""
    with pytest.raises(ValueError, match=r"64-bit|MAX_TASK_IDS"):
        info.encode()


def test_the_largest_subtopology_id_and_partition_travel() -> None:
    """Kafka's int32 range, which ``Subtopology`` enforces, fits the wire with room to spare."""
    top = 2**31 - 1
    result = assign_streams(
        Topology([Subtopology(top, ["a"])]),
        {"a": 2},
        {"m": MemberSubscription(["a"], SubscriptionInfo(uuid.UUID(int=1), endpoint="h:1"))},
    )
    seen = AssignmentInfo.decode(result["m"].info.encode())
    assert seen.active == {TaskId(top, 0), TaskId(top, 1)}
    far = AssignmentInfo(active=frozenset({TaskId(top, top)}))
    assert AssignmentInfo.decode(far.encode()) == far


# -- the leader's bounds: claims clipped to tasks that exist, a lower limit per member ---------


@given(subscriptions(), st.data())
def test_a_clipped_decode_is_the_full_decode_filtered(
    info: SubscriptionInfo, data: st.DataObject
) -> None:
    """With ``task_counts`` a decode keeps exactly the claims on tasks that exist; everything
    else, and whether it raises, is unchanged."""
    subs = sorted({t.subtopology for t in (*info.offset_sums, *info.previous_active)} | {0})
    counts = data.draw(st.dictionaries(st.sampled_from(subs), st.integers(0, 5001)))
    full = SubscriptionInfo.decode(info.encode())
    clipped = SubscriptionInfo.decode(info.encode(), task_counts=counts)

    def exists(t: TaskId) -> bool:
        return t.partition < counts.get(t.subtopology, 0)

    assert clipped.offset_sums == {t: s for t, s in full.offset_sums.items() if exists(t)}
    assert clipped.previous_active == {t for t in full.previous_active if exists(t)}
    same = attrs.evolve(clipped, offset_sums=full.offset_sums, previous_active=full.previous_active)
    assert same == full


def test_clipped_claims_are_never_made() -> None:
    """``MAX_TASK_IDS`` previous actives of a 6-task subtopology: 6 task ids are made, in well
    under a megabyte (the full decode makes 2**20, about 134 MB)."""
    data = _subscription_with_runs([1, MAX_TASK_IDS - 1])
    tracemalloc.start()
    try:
        info = SubscriptionInfo.decode(data, task_counts={0: 6})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.previous_active == {TaskId(0, p) for p in range(6)}
    assert peak < 1 << 20


def test_a_leader_limit_refuses_a_member_declaring_more_previous_actives() -> None:
    """``max_previous_active`` counts what the runs declare, clipped or not, before any task is
    made; offset sums do not count."""
    data = _subscription_with_runs([600, 400])
    assert len(SubscriptionInfo.decode(data, max_previous_active=1000).previous_active) == 1000
    with pytest.raises(ProtocolError, match="more than the 999 previous active tasks"):
        SubscriptionInfo.decode(data, task_counts={0: 6}, max_previous_active=999)
    sums = SubscriptionInfo(uuid.UUID(int=1), offset_sums=dict.fromkeys(map(_t, range(50)), 7))
    assert len(SubscriptionInfo.decode(sums.encode(), max_previous_active=0).offset_sums) == 50
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError, match="previous active tasks the leader allows"):
            SubscriptionInfo.decode(_subscription_with_runs([MAX_TASK_IDS]), max_previous_active=64)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def _t(p: int) -> TaskId:
    return TaskId(0, p)
