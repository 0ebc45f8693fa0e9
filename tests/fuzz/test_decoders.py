"""Every wire decoder on damaged bytes: it returns its type or raises its typed error
(``ProtocolError``, ``UserDataError``: both ``StreamAssignError``), nothing else, within the
per-example CPU-time bound and a memory bound proportional to its budget.

Budgets are lowered to ``BUDGET`` entries for these examples (``MAX_TASK_IDS`` of the streams
formats, ``MAX_PARTITIONS`` of the consumer's), so an input that reaches a budget is as cheap
as any other and the bound is tight: ``PER_ENTRY`` bytes per budget entry plus ``PER_BYTE`` per
input byte plus ``BASE``.
"""

from __future__ import annotations

from unittest import mock

from hypothesis import event, given
from hypothesis import strategies as st

from streamassign import protocol
from streamassign.consumer import MemberData, UserDataError, read_member_data, userdata
from streamassign.consumer.userdata import AssignmentData
from streamassign.errors import StreamAssignError
from streamassign.protocol import AssignmentInfo, ProtocolError, SubscriptionInfo, read_header
from streamassign.versions import announced_sources

from ..consumer.strategies import member_data
from ..strategies import assignment_infos, subscription_infos
from .damage import FUZZ, bounded, damaged

BUDGET = 1 << 12
PER_ENTRY, PER_BYTE, BASE = 400, 64, 256 << 10

assignment_data = st.builds(
    AssignmentData,
    generation=st.integers(-1, 2**31 - 1),
    followup=st.booleans(),
    pending=st.lists(st.tuples(st.sampled_from(["a", "t", "ü"]), st.integers(0, 40)), max_size=8),
)
#: Valid encodings of every format: each decoder also meets the others' bytes.
SEEDS = st.one_of(
    subscription_infos().map(SubscriptionInfo.encode),
    assignment_infos(max_partitions=40).map(AssignmentInfo.encode),
    member_data().map(MemberData.encode),
    assignment_data.map(AssignmentData.encode),
)
task_counts = st.one_of(st.none(), st.dictionaries(st.integers(0, 3), st.integers(0, 64)))
partition_counts = st.one_of(
    st.none(), st.dictionaries(st.sampled_from(["a", "t", "ü"]), st.integers(0, 50))
)


def _limit(data: bytes) -> int:
    return PER_ENTRY * BUDGET + PER_BYTE * len(data) + BASE


def _typed(error: type[StreamAssignError]) -> None:
    assert issubclass(error, StreamAssignError) and issubclass(error, ValueError)


@FUZZ
@given(damaged(SEEDS), st.sampled_from([1, 2, 3]), task_counts, st.sampled_from([None, 100]))
def test_streams_subscription(
    data: bytes, max_version: int, counts: dict[int, int] | None, max_ids: int | None
) -> None:
    _typed(ProtocolError)
    with mock.patch.object(protocol, "MAX_TASK_IDS", BUDGET), bounded(_limit(data)):
        try:
            info = SubscriptionInfo.decode(
                data, max_version, task_counts=counts, max_previous_active=max_ids
            )
        except ProtocolError:
            event("ProtocolError")
            return
    event("decoded")
    assert isinstance(info, SubscriptionInfo)
    if counts is not None:
        claims = {*info.offset_sums, *info.previous_active}
        assert all(t.partition < counts.get(t.subtopology, 0) for t in claims)
    assert read_header(data) == (info.version, info.latest_supported_version)
    # The leader names announced topics by the member's subscription: an index past it is
    # its typed error too, never an IndexError.
    with bounded(_limit(data)):
        try:
            announced_sources(["a", "t", "ü"], info.subtopology_topic_indices)
        except ProtocolError:
            event("index past the subscription")


@FUZZ
@given(damaged(SEEDS), st.sampled_from([1, 2]))
def test_streams_assignment(data: bytes, max_version: int) -> None:
    with mock.patch.object(protocol, "MAX_TASK_IDS", BUDGET), bounded(_limit(data)):
        try:
            info = AssignmentInfo.decode(data, max_version)
        except ProtocolError:
            event("ProtocolError")
            return
        info.partitions_by_host()  # what a member does with the host maps
    event("decoded")
    assert isinstance(info, AssignmentInfo)


@FUZZ
@given(
    damaged(SEEDS),
    st.one_of(st.none(), st.dictionaries(st.sampled_from("atü"), st.integers(0, 50))),
)
def test_consumer_member_data(data: bytes, partitions: dict[str, int] | None) -> None:
    _typed(UserDataError)
    with mock.patch.object(userdata, "MAX_PARTITIONS", BUDGET), bounded(_limit(data)):
        try:
            member = MemberData.decode(data, partitions_per_topic=partitions)
        except UserDataError:
            member = None
        event("UserDataError" if member is None else "decoded")
        fallback = read_member_data("m", data, partitions_per_topic=partitions)  # never raises
    assert fallback == (member if member is not None else MemberData())
    if member is not None and partitions is not None:
        assert all(tp.partition < partitions.get(tp.topic, 0) for tp in member.owned_partitions)


@FUZZ
@given(damaged(SEEDS))
def test_consumer_assignment_data(data: bytes) -> None:
    with mock.patch.object(userdata, "MAX_PARTITIONS", BUDGET), bounded(_limit(data)):
        try:
            got = AssignmentData.decode(data)
        except UserDataError:
            event("UserDataError")
            return
    event("decoded")
    assert isinstance(got, AssignmentData)
