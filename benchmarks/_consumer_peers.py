"""Group leaders for the consumer benchmarks: aiokafka's built-in assignors, and our assignors
through their aiokafka adapter, each driven exactly as aiokafka's group coordinator drives it.

A rebalance, as aiokafka 0.14 runs it:

1. every member calls ``assignor.metadata(topics)`` and sends it encoded in JoinGroup; its
   state is what ``on_assignment`` recorded after the previous round (aiokafka's sticky keeps
   it in *class* attributes, ``member_assignment`` and ``generation``; the coordinator never
   calls ``on_generation_assignment``, so the generation a member reports stays -1);
2. the leader decodes each member's bytes (``ConsumerProtocol.METADATA.decode``) and calls
   ``assignor.assign(cluster, members)`` with its ``ClusterMetadata``;
3. the leader encodes each member's assignment for SyncGroup.

Steps 1 and 2's decoding happen off the clock; a *leader round* times ``assign`` plus the
encoding of step 3 (our adapter returns bytes already; aiokafka's assignors return objects the
coordinator then encodes). Every run gets a fresh subclass of aiokafka's assignor, so class
state never leaks from one run, or one member, to another.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocol,
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from streamassign.aiokafka import GroupAssignor
from streamassign.consumer import ConsumerAssignor
from streamassign.consumer.userdata import AssignmentData
from streamassign.pipeline.peers import aiokafka_cluster, aiokafka_member, by_topic, wire

#: Who holds what: member id -> its partitions as (topic, partition) tuples.
Owned = Mapping[str, Sequence[tuple[str, int]]]
#: JoinGroup metadata of every member, as the leader decodes it.
Members = dict[str, ConsumerProtocolMemberMetadata]

AIOKAFKA: dict[str, type[AbstractPartitionAssignor]] = {
    "sticky": StickyPartitionAssignor,
    "roundrobin": RoundRobinPartitionAssignor,
    "range": RangePartitionAssignor,
}


#: aiokafka's ``ClusterMetadata`` of these topics (the package's driver).
cluster = aiokafka_cluster


def aiokafka_members(
    base: type[AbstractPartitionAssignor],
    topics: Mapping[str, Collection[str]],
    history: Owned | None = None,
) -> Members:
    """Each member's JoinGroup metadata for aiokafka's ``base``, after it received its
    ``history`` partitions in the previous round (none: a new member); the package's
    ``aiokafka_member`` for each, as the simulation pipeline drives aiokafka."""
    return {
        member: aiokafka_member(base, subscribed, None if history is None else history.get(member))
        for member, subscribed in topics.items()
    }


AiokafkaArgs = tuple[type[AbstractPartitionAssignor], ClusterMetadata, Members]


def aiokafka_assign(args: AiokafkaArgs) -> dict[str, ConsumerProtocolMemberAssignment]:
    """aiokafka's ``assign(cluster, members)`` alone."""
    assignor, meta, members = args
    result: dict[str, ConsumerProtocolMemberAssignment] = assignor.assign(meta, members)
    return result


def encode(result: Mapping[str, ConsumerProtocolMemberAssignment | bytes]) -> dict[str, bytes]:
    """Each member's assignment as the coordinator sends it in SyncGroup."""
    return {m: a if isinstance(a, bytes) else a.encode() for m, a in result.items()}


def aiokafka_round(args: AiokafkaArgs) -> dict[str, bytes]:
    """One leader round of aiokafka's assignor: ``assign``, then encode for SyncGroup."""
    return encode(aiokafka_assign(args))


def adapter_members(
    make: Callable[[], ConsumerAssignor],
    topics: Mapping[str, Collection[str]],
    history: Owned | None = None,
    generation: int = 1,
) -> Members:
    """Each member's JoinGroup metadata from its own ``GroupAssignor(make())``, after it
    received its ``history`` partitions from our leader in ``generation``."""
    out = {}
    assigned = AssignmentData(generation).encode()
    for member, subscribed in topics.items():
        assignor = GroupAssignor(make())
        if history is not None and member in history:
            got = ConsumerProtocolMemberAssignment(0, by_topic(history[member]), assigned)
            assignor.on_assignment(got)
        out[member] = wire(assignor.metadata(set(subscribed)))
    return out


def adapter_round(args: tuple[GroupAssignor, ClusterMetadata, Members]) -> dict[str, bytes]:
    """One leader round of our adapter (it returns bytes); an error assignment raises."""
    leader, meta, members = args
    result = leader.assign(meta, members)
    if leader.last_round is not None and leader.last_round.error:
        raise RuntimeError(leader.last_round.error)
    return result


def decode(
    result: Mapping[str, ConsumerProtocolMemberAssignment | bytes],
) -> dict[str, list[tuple[str, int]]]:
    """A leader's result (encoded or not) as member -> partitions."""
    out = {}
    for member, got in result.items():
        if isinstance(got, bytes):
            got = ConsumerProtocol.ASSIGNMENT.decode(got)
        out[member] = [(t, p) for t, ps in got.assignment for p in ps]
    return out
