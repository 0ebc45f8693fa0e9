"""Group leaders on damaged member metadata: every member gets an answer it can read, never
the leader's own failure (``ASSIGNMENT_ERROR``), only partitions of topics it subscribed to that
exist, none twice; within the per-example CPU-time bound and ``LEADER_PEAK`` bytes (tracemalloc),
at the real decode budgets. A damaged member costs what its bytes cost: claims are clipped to
what exists (docs/streams.md, docs/consumer.md)."""

from __future__ import annotations

import functools
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from hypothesis import event, given
from hypothesis import strategies as st

from streamassign import Subtopology, TaskId, TopicPartition, Topology
from streamassign.aiokafka import ASSIGNORS, GroupAssignor, ProcessHost
from streamassign.consumer import MemberData
from streamassign.consumer.userdata import AssignmentData
from streamassign.errors import ErrorCode
from streamassign.protocol import LATEST_OFFSET, MAX_TASK_IDS, AssignmentInfo, SubscriptionInfo
from streamassign.versions import subtopology_topic_indices

from ..consumer.strategies import cases
from .damage import FUZZ, LEADER_CPU_SECONDS, bounded, damaged, varint

#: What one leader round of these groups (at most 8 members, 48 tasks) may allocate.
LEADER_PEAK = 16 << 20

TOPOLOGY = Topology(
    [Subtopology(0, ["orders", "customers"], stores=["joined"]), Subtopology(1, ["clicks"])],
    copartition_groups=[["orders", "customers"]],
    name="fuzz",
)
SOURCES = sorted(TOPOLOGY.source_topics)


def _cluster(counts: Mapping[str, int]) -> Any:
    return SimpleNamespace(
        partitions_for_topic=lambda t: set(range(counts[t])) if counts.get(t) else None,
        leader_for_partition=lambda tp: None,
    )


@pytest.fixture(scope="module")
def streams_leader() -> Iterator[ProcessHost]:
    with tempfile.TemporaryDirectory() as state:
        host = ProcessHost(
            TOPOLOGY,
            bootstrap_servers="127.0.0.1:1",  # never started: only its assignor leads
            state_dir=state,
            num_standby_replicas=1,
        )
        yield host
        host.state.close()


#: Mostly a topology that assigns; sometimes missing topics or broken co-partitioning.
PARTITION_COUNTS = st.one_of(
    st.builds(
        lambda n, m: {"orders": n, "customers": n, "clicks": m},
        st.sampled_from([1, 4, 16]),
        st.sampled_from([1, 8]),
    ),
    st.fixed_dictionaries({t: st.sampled_from([0, 4, 8]) for t in SOURCES}),
)
#: Previous actives a greedy member claims (one run): up to the whole decode budget.
GREEDY = (1 << 10, 1 << 16, MAX_TASK_IDS)


def greedy(process: uuid.UUID, subtopology: int, claims: int) -> bytes:
    """A version-1 subscription claiming ``claims`` previous actives of ``subtopology`` in one
    run: a few bytes the writer would never produce (it builds what it writes)."""
    run = varint(1) + varint(subtopology) + varint(1) + varint(0) + varint(claims - 1)
    head = (1).to_bytes(4, "big") * 2 + process.bytes
    return head + varint(0) + varint(0) + run + varint(0) + varint(0)


#: Ids a hostile member announces (version 3, one topic each). The whole decode budget
#: (``MAX_TASK_IDS // 2 - 1`` ids) takes the leader about 17 s of CPU time under tracemalloc,
#: past this test's bound: tests/test_rolling_topics.py decodes that one.
ANNOUNCERS = (1 << 10, 1 << 15)


@functools.cache  # a pure function of its arguments; the biggest tail is 2.6 MB
def announcer(process: uuid.UUID, first_id: int, ids: int) -> bytes:
    """A version-3 subscription announcing ``ids`` subtopology ids from ``first_id`` on, each
    reading topic index 0: the most ids the decode budget lets a member announce."""
    head = (3).to_bytes(4, "big") * 2 + process.bytes
    tail = varint(ids) + b"".join(varint(i) + b"\x01\x00" for i in range(first_id, first_id + ids))
    # endpoint, offset sums, previous actives, nonce, error code, rack, tags
    return head + varint(0) * 7 + tail


task_claims = st.builds(TaskId, st.integers(0, 2), st.integers(0, 20))  # some do not exist


@st.composite
def streams_member(draw: st.DrawFn) -> tuple[list[str | None] | None, bytes]:
    """A member of up to 4 processes with plausible history, its bytes sometimes damaged,
    its topics sometimes not the whole topology's; from version 3 on it announces its
    subtopologies' topics: the leader's, or any indices (some past its subscription)."""
    version = draw(st.sampled_from([1, 2, 3]))
    topics = SOURCES if draw(st.integers(0, 9)) else SOURCES[1:]
    announced = draw(
        st.one_of(
            st.just(subtopology_topic_indices(TOPOLOGY, topics)),
            st.dictionaries(
                st.integers(0, 3), st.frozensets(st.integers(0, 4), min_size=1), max_size=3
            ),
        )
    )
    info = SubscriptionInfo(
        uuid.UUID(int=draw(st.integers(1, 4))),
        endpoint=draw(st.sampled_from([None, "h1:1", "h2:1"])),
        offset_sums=draw(
            st.dictionaries(task_claims, st.sampled_from([LATEST_OFFSET, 0, 5, 10_001]))
        ),
        previous_active=draw(st.frozensets(task_claims)),
        join_nonce=draw(st.integers(0, 9)),
        error_code=ErrorCode.SHUTDOWN_REQUESTED if draw(st.integers(0, 99)) == 57 else 0,
        rack=draw(st.sampled_from([None, "r1"])) if version == 2 else None,
        version=version,
        latest_supported_version=draw(st.sampled_from(sorted({version, 2, 3}))),
        subtopology_topic_indices=announced if version >= 3 else {},
    )
    data = info.encode()
    if draw(st.booleans()):
        data = draw(damaged(st.just(data)))
    elif draw(st.integers(0, 9)) == 7:  # the audit's hostile member, in a few bytes
        data = greedy(info.process_id, draw(st.integers(0, 3)), draw(st.sampled_from(GREEDY)))
        event("greedy")
    return draw(null_names(topics)), data


def null_names(topics: list[str]) -> st.SearchStrategy[list[str | None] | None]:
    """``topics`` as a member sends them; sometimes with a null name or as a null list
    (aiokafka decodes a length -1 string or array to ``None``, the broker does not check)."""
    names: list[list[str | None] | None] = [*[list(topics)] * 13, [*topics, None], [None], None]
    return st.sampled_from(names).map(_null_event)  # 3 in 16 members: most groups stay valid


def _null_event(topics: list[str | None] | None) -> list[str | None] | None:
    if topics is None or None in topics:
        event("null topic name")
    return topics


#: At most one member announcing up to the budget's ids per group (each costs the leader's
#: decode its bytes: several would only add up), with the leader's ids or only others.
announcers = st.one_of(
    st.none(),
    st.builds(
        lambda pid, first_id, ids: (SOURCES, announcer(uuid.UUID(int=pid), first_id, ids)),
        st.integers(1, 5),
        st.sampled_from([0, 2]),
        st.sampled_from(ANNOUNCERS),
    ),
)


@FUZZ
@given(
    st.dictionaries(st.sampled_from([f"m{i}" for i in range(8)]), streams_member(), min_size=1),
    PARTITION_COUNTS,
    announcers,
)
def test_streams_leader(
    streams_leader: ProcessHost,
    members: Mapping[str, tuple[list[str | None] | None, bytes]],
    counts: Mapping[str, int],
    hostile: tuple[list[str | None] | None, bytes] | None,
) -> None:
    if hostile is not None:
        members = {**members, "announcer": hostile}
        event("announcer")
    metas = {m: ConsumerProtocolMemberMetadata(0, t, d) for m, (t, d) in members.items()}
    with bounded(LEADER_PEAK, LEADER_CPU_SECONDS):
        answers = streams_leader.assignors[0].assign(_cluster(counts), metas)
    assert set(answers) == set(members)
    taken: set[TopicPartition] = set()
    for member, raw in answers.items():
        got = ConsumerProtocolMemberAssignment.decode(raw)
        info = AssignmentInfo.decode(got.user_data)
        assert info.error_code != ErrorCode.ASSIGNMENT_ERROR  # the leader never failed
        event(info.error_code.name)
        _check_partitions(member, got, members[member][0], counts, taken)


@FUZZ
@given(cases(max_members=8), st.sampled_from(sorted(ASSIGNORS)), st.data())
def test_consumer_leader(case: Any, name: str, data: st.DataObject) -> None:
    metas = {}
    for member, sub in case.subs.items():
        seed = MemberData(
            priority=case.priorities[member],
            weight=case.weights[member],
            owned_partitions=[tp for tp in sub.owned_partitions if tp.partition >= 0],
            generation=sub.generation,
        ).encode()
        raw = data.draw(damaged(st.just(seed))) if data.draw(st.booleans()) else seed
        metas[member] = ConsumerProtocolMemberMetadata(
            0, data.draw(null_names(sorted(sub.topics))), raw
        )
    leader = GroupAssignor.create(name)
    with bounded(LEADER_PEAK, LEADER_CPU_SECONDS):
        answers = leader.assign(_cluster(case.counts), metas)
    assert set(answers) == set(metas)
    assert leader.last_round is not None and leader.last_round.error is None
    taken: set[TopicPartition] = set()
    for member, raw in answers.items():
        got = ConsumerProtocolMemberAssignment.decode(raw)
        assert AssignmentData.decode(got.user_data).error_code == ErrorCode.NONE
        _check_partitions(member, got, metas[member].subscription, case.counts, taken)


def _check_partitions(
    member: str,
    got: Any,
    topics: Sequence[str | None] | frozenset[str] | None,
    counts: Mapping[str, int],
    taken: set[TopicPartition],
) -> None:
    """``got`` holds partitions of existing topics ``member`` subscribes to, none twice; none
    when a topic name or the list is null (the leader cannot read what it subscribes to)."""
    if topics is None or None in topics:
        assert not got.partitions(), f"{member} subscribes to a null topic name but got some"
        return
    for tp in (TopicPartition(*tp) for tp in got.partitions()):
        assert tp.topic in topics, f"{member} got {tp} of a topic it did not subscribe to"
        assert 0 <= tp.partition < counts.get(tp.topic, 0), f"{member} got {tp}"
        assert tp not in taken, f"{tp} assigned twice"
        taken.add(tp)
