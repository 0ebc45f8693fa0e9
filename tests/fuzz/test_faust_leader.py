"""The Faust leader (``streamassign.faust:PartitionAssignor.assign`` of a real Faust app, no
broker) on hostile members: our subscription user data (lying tags: changelogs, capacities),
Faust's own JSON metadata, both damaged, empty, greedy claims, partial and unknown
subscriptions, missing topics. Every member gets an answer it can read, never the leader's own
failure (``ASSIGNMENT_ERROR``: the assignor turns any exception into it), only existing
partitions of topics it subscribed to, no task and no source partition active twice; within
the per-example CPU-time bound and ``LEADER_PEAK`` bytes (tracemalloc)."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from hypothesis import event, given
from hypothesis import strategies as st

from streamassign import TaskId, TopicPartition
from streamassign.errors import ErrorCode
from streamassign.faust import PartitionAssignor
from streamassign.faust.leader import CAPACITY_TAG, CHANGELOGS_TAG, GLOBAL_CHANGELOGS_TAG
from streamassign.protocol import LATEST_OFFSET, AssignmentInfo, SubscriptionInfo

from ..test_faust_assignor import CL, GLOBAL_CL, SRC, Cluster, make_app
from .damage import FUZZ, LEADER_CPU_SECONDS, bounded, damaged
from .test_leaders import GREEDY, LEADER_PEAK, greedy

#: The app's topics, and topics of other apps (or versions) a member may also subscribe to.
TOPICS = (SRC, CL, GLOBAL_CL)
OTHERS = ("payments", "shop-other-changelog")

#: Faust's own assignor metadata (``ClientMetadata.dumps()``), as a worker on protocol
#: ``faust`` sends it: our leader must treat it as a member without history.
FAUST_JSON = (
    b'{"assignment":{"actives":{"orders":[0,1]},"standbys":{"shop-totals-changelog":[2]}},'
    b'"url":"http://w9:6066","changelog_distribution":{},"external_topic_distribution":{},'
    b'"topic_groups":{"orders":0,"shop-totals-changelog":0}}'
)

#: Mostly every topic sized (6 partitions, 2 for the global table's changelog); sometimes one
#: missing, a table's changelog partitioned unlike its source, or unknown topics sized.
PARTITION_COUNTS = st.one_of(
    st.just({SRC: 6, CL: 6, GLOBAL_CL: 2}),
    st.fixed_dictionaries(
        {SRC: st.sampled_from([1, 6, 8]), CL: st.sampled_from([1, 6]), GLOBAL_CL: st.just(2)}
    ),
    st.dictionaries(st.sampled_from(TOPICS + OTHERS), st.sampled_from([1, 2, 6])),
)

tasks = st.builds(TaskId, st.integers(0, 3), st.integers(0, 9))  # some do not exist
#: Tag values a member may send: true ones, lies (a source topic as a changelog), junk.
TAG_VALUES = st.sampled_from(
    [CL, GLOBAL_CL, SRC, f"{CL},{SRC}", "", ",", "payments", "0", "1", "16", "17", "-1", "x"]
)


@st.composite
def honest(draw: st.DrawFn) -> bytes:
    """Our assignor's subscription, as a worker of this or another app version writes it."""
    tags = draw(
        st.dictionaries(
            st.sampled_from([CHANGELOGS_TAG, GLOBAL_CHANGELOGS_TAG, CAPACITY_TAG, "zone"]),
            TAG_VALUES,
        )
    )
    version = draw(st.sampled_from([1, 2]))
    return SubscriptionInfo(
        uuid.UUID(int=draw(st.integers(1, 4))),  # members share processes sometimes
        endpoint=draw(st.sampled_from(["http://w1:6066", "http://w2:6066", None])),
        offset_sums=draw(st.dictionaries(tasks, st.sampled_from([LATEST_OFFSET, 0, 7, 2**40]))),
        previous_active=draw(st.frozensets(tasks)),
        join_nonce=draw(st.integers(0, 3)),
        client_tags=tags if version == 2 else {},
        version=version,
    ).encode()


@st.composite
def faust_member(draw: st.DrawFn) -> tuple[list[str], bytes]:
    kind = draw(st.sampled_from(["ours", "ours damaged", "faust", "faust damaged", "empty"]))
    if kind == "ours" and draw(st.integers(0, 9)) == 7:
        kind = "greedy"
    event(kind)
    if kind == "ours":
        data = draw(honest())
    elif kind == "ours damaged":
        data = draw(damaged(honest()))
    elif kind == "faust":
        data = FAUST_JSON
    elif kind == "faust damaged":
        data = draw(damaged(st.just(FAUST_JSON)))
    elif kind == "greedy":
        data = greedy(uuid.UUID(int=9), draw(st.integers(0, 2)), draw(st.sampled_from(GREEDY)))
    else:
        data = b""
    topics = (
        list(TOPICS)
        if draw(st.booleans())
        else draw(st.sets(st.sampled_from(TOPICS + OTHERS), min_size=1))
    )
    return sorted(topics), data


@pytest.fixture(scope="module")
def faust_leader() -> Iterator[PartitionAssignor]:
    with tempfile.TemporaryDirectory() as datadir:
        assignor = make_app(Path(datadir), 7000).assignor
        assert isinstance(assignor, PartitionAssignor)
        # As aiokafka does before a leader assigns: its own subscription (the topics its app
        # reads), which the leader checks members' table announcements against.
        assignor.metadata(list(TOPICS))
        yield assignor


@FUZZ
@given(
    st.dictionaries(st.sampled_from([f"m{i}" for i in range(8)]), faust_member(), min_size=1),
    PARTITION_COUNTS,
)
def test_faust_leader(
    faust_leader: PartitionAssignor,
    members: Mapping[str, tuple[list[str], bytes]],
    counts: Mapping[str, int],
) -> None:
    metas = {m: ConsumerProtocolMemberMetadata(0, t, d) for m, (t, d) in members.items()}
    with bounded(LEADER_PEAK, LEADER_CPU_SECONDS):
        answers = faust_leader.assign(Cluster(counts), metas)
    assert set(answers) == set(members)
    active_tasks: set[TaskId] = set()
    active_partitions: set[TopicPartition] = set()
    for member, raw in answers.items():
        got = ConsumerProtocolMemberAssignment.decode(raw)
        info = AssignmentInfo.decode(got.user_data)
        assert info.error_code != ErrorCode.ASSIGNMENT_ERROR  # the leader never failed
        event(info.error_code.name)
        partitions = {TopicPartition(*tp) for tp in got.partitions()}
        for tp in partitions:
            assert tp.topic in members[member][0], f"{member} got {tp}, not subscribed"
            assert 0 <= tp.partition < counts.get(tp.topic, 0), f"{member} got {tp}"
        assert not active_tasks & info.active, f"{active_tasks & info.active} active twice"
        active_tasks |= info.active
        for task in info.active:
            for topic, n in info.topics.get(task.subtopology, {}).items():
                tp = TopicPartition(topic, task.partition)
                if task.partition < n:
                    assert tp in partitions, f"{member} runs {task} without {tp}"
                    assert tp not in active_partitions, f"{tp} active twice"
                    active_partitions.add(tp)
        # A source partition reaches a member only with its active task.
        assert {tp for tp in partitions if tp.topic == SRC} <= active_partitions
