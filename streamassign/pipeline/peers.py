"""Peer assignors driven as their own frameworks drive them: faust-streaming and aiokafka.

Each adapter imports its framework when constructed (on an executor), keeps the per-member state
the framework would keep between rebalances, and returns our value types so that the simulation
scores every assignor the same way. The benchmarks drive Faust through :class:`FaustDriver`
and aiokafka through the helpers here too: one driver per peer.

Faust (``faust.assignor.PartitionAssignor._perform_assignment``): topics with equal partition
counts and the same subscribers form one co-partitioned group, assigned by one
``CopartitionedAssignor`` with the worker's last assignment as history; every worker weighs the
same (no threads); a restarted worker reports an empty assignment (Faust does not report state on
disk); standbys are placed for every partition of every group (we count those of stateful tasks).
Here each subtopology stands for its topics, so subtopologies with equal task counts share one
group, and a worker's history for a group is its assignment of the group's first subtopology
that has one — what ``ClientAssignment.copartitioned_assignment`` does with topics.

aiokafka (0.11-0.14): the leader calls ``assign(cluster, members)`` on the decoded JoinGroup
metadata of every member; a member's metadata comes from its own assignor after
``on_assignment`` of what it received last. aiokafka's sticky assignor keeps that state in class
attributes, so every member, every round, gets a fresh subclass: no state leaks between members,
rounds or traces.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .. import TaskId, TopicPartition
from ..assignment import ClientAssignment, ClientState
from .scenarios import Layout

__all__ = [
    "SOURCE_TOPIC",
    "AiokafkaPeer",
    "FaustDriver",
    "FaustPeer",
    "aiokafka_cluster",
    "aiokafka_member",
    "by_topic",
    "faust_groups",
    "fresh_class",
    "wire",
]


def faust_groups(layout: Layout) -> list[tuple[int, tuple[int, ...]]]:
    """Faust's co-partitioned groups: ``(partitions, subtopology ids)`` by equal task count."""
    groups: dict[int, list[int]] = {}
    for sub, n in layout.task_counts:
        if n:
            groups.setdefault(n, []).append(sub)
    return [(n, tuple(subs)) for n, subs in sorted(groups.items())]


#: The one topic of the single group that :meth:`FaustDriver.input_of` builds.
SOURCE_TOPIC = "source"


class FaustDriver:
    """faust-streaming's ``CopartitionedAssignor``, run on one co-partitioned group as Faust's
    ``PartitionAssignor._perform_assignment`` runs it; the benchmarks and :class:`FaustPeer`
    both drive Faust through it. Faust is imported on construction."""

    def __init__(self) -> None:
        from faust.assignor.client_assignment import ClientAssignment as FaustClientAssignment
        from faust.assignor.copartitioned_assignor import CopartitionedAssignor

        self._client_assignment: Any = FaustClientAssignment
        self._assignor_type: Any = CopartitionedAssignor

    def decoded(self, actives: Iterable[int], standbys: Iterable[int], topic: str) -> Any:
        """A worker's previous assignment of one group (partitions of ``topic``), as Faust
        decodes it from the worker's metadata (``copartitioned_assignment``)."""
        return self._client_assignment(
            actives={topic: sorted(actives)}, standbys={topic: sorted(standbys)}
        ).copartitioned_assignment({topic})

    def assign(
        self,
        inputs: dict[str, Any],
        num_partitions: int,
        replicas: int,
        topic: str = SOURCE_TOPIC,
    ) -> Mapping[str, Any]:
        """One run of Faust's assignor over one group (mutates and returns ``inputs``)."""
        result: Mapping[str, Any] = self._assignor_type(
            topics={topic}, cluster_asgn=inputs, num_partitions=num_partitions, replicas=replicas
        ).get_assignment()
        return result

    def input_of(self, tasks: Sequence[TaskId], clients: Sequence[ClientState]) -> dict[str, Any]:
        """Every worker's history when all ``tasks`` (sorted: task ``tasks[p]`` is partition
        ``p``) form one group and each worker ran what its ``ClientState`` says."""
        partition = {t: p for p, t in enumerate(tasks)}

        def partitions(held: frozenset[TaskId]) -> list[int]:
            return [partition[t] for t in held if t in partition]

        return {
            c.process_id: self.decoded(
                partitions(c.prev_active), partitions(c.prev_standby), SOURCE_TOPIC
            )
            for c in clients
        }

    @staticmethod
    def to_ours(tasks: Sequence[TaskId], result: Mapping[str, Any]) -> dict[str, ClientAssignment]:
        """A one-group result of :meth:`input_of`'s tasks as our ``ClientAssignment``s."""
        return {
            pid: ClientAssignment(
                active=frozenset(tasks[p] for p in got.actives),
                standby=frozenset(tasks[p] for p in got.standbys),
            )
            for pid, got in result.items()
        }


class FaustPeer:
    """faust-streaming's ``CopartitionedAssignor`` with Faust's per-worker history."""

    def __init__(self) -> None:
        self.faust = FaustDriver()
        #: worker -> subtopology -> (active partitions, standby partitions) it last received
        self.history: dict[str, dict[int, tuple[frozenset[int], frozenset[int]]]] = {}

    def assign(
        self,
        clients: Sequence[ClientState],
        restarted: frozenset[str],
        layout: Layout,
        replicas: int,
    ) -> tuple[dict[str, ClientAssignment], float]:
        """Assign every group; return our ``ClientAssignment``s and the seconds Faust spent.

        ``restarted`` workers report no history. Standbys of stateless subtopologies are
        dropped from the result (Faust places them; they replicate nothing).
        """
        pids = [c.process_id for c in clients]
        history = {pid: ({} if pid in restarted else self.history.get(pid, {})) for pid in pids}
        actives: dict[str, set[TaskId]] = {pid: set() for pid in pids}
        standbys: dict[str, set[TaskId]] = {pid: set() for pid in pids}
        new_history: dict[str, dict[int, tuple[frozenset[int], frozenset[int]]]] = {
            pid: {} for pid in pids
        }
        stateful = layout.stateful_subtopologies
        elapsed = 0.0
        for n, subs in faust_groups(layout):
            topic = f"subtopologies-{'-'.join(map(str, subs))}"
            inputs = {}
            for pid in pids:
                held = history[pid]
                act = next((held[s][0] for s in subs if s in held and held[s][0]), ())
                stb = next((held[s][1] for s in subs if s in held and held[s][1]), ())
                inputs[pid] = self.faust.decoded(act, stb, topic)
            start = time.perf_counter()
            got = self.faust.assign(inputs, n, replicas, topic)
            elapsed += time.perf_counter() - start
            for pid, one in got.items():
                act_p = frozenset(one.actives)
                stb_p = frozenset(one.standbys)
                for s in subs:
                    new_history[pid][s] = (act_p, stb_p)
                    actives[pid].update(TaskId(s, p) for p in act_p)
                    if s in stateful:
                        standbys[pid].update(TaskId(s, p) for p in stb_p)
        self.history = new_history
        result = {
            pid: ClientAssignment(frozenset(actives[pid]), frozenset(standbys[pid])) for pid in pids
        }
        return result, elapsed


def by_topic(partitions: Iterable[tuple[str, int]]) -> list[tuple[str, list[int]]]:
    """``[(topic, [partition, ...])]`` sorted: the shape of an encoded member assignment, which
    is how an aiokafka member's history reaches its assignor (``on_assignment``)."""
    grouped: dict[str, list[int]] = {}
    for topic, p in partitions:
        grouped.setdefault(topic, []).append(p)
    return [(t, sorted(ps)) for t, ps in sorted(grouped.items())]


def fresh_class(base: type[Any]) -> type[Any]:
    """A subclass of an aiokafka assignor with its own (default) class state: aiokafka's sticky
    keeps a member's history in class attributes, so each member and round needs one."""
    return type(f"Fresh{base.__name__}", (base,), {})


def aiokafka_cluster(partitions_per_topic: Mapping[str, int]) -> Any:
    """aiokafka's own ``ClusterMetadata`` knowing these topics (as after a metadata update).

    The assignors only read partition ids (``partitions_for_topic``, ``topics()``), so the
    per-partition metadata (leader, replicas) is left out.
    """
    from aiokafka.cluster import ClusterMetadata

    meta = ClusterMetadata()
    meta._partitions = {t: dict.fromkeys(range(n)) for t, n in partitions_per_topic.items()}
    return meta


def wire(meta: Any) -> Any:
    """What a group leader reads of a member's JoinGroup metadata: encoded, then decoded."""
    from aiokafka.coordinator.protocol import ConsumerProtocol

    return ConsumerProtocol.METADATA.decode(meta.encode())


def aiokafka_member(
    base: type[Any], topics: Iterable[str], held: Sequence[tuple[str, int]] | None
) -> Any:
    """One member's JoinGroup metadata, as the leader decodes it, from a fresh subclass of
    aiokafka's ``base`` assignor after it received ``held`` last round (None: a new or
    restarted member, no history). Topics are subscribed sorted: identical subscriptions are
    then identical lists, which aiokafka's sticky needs to recognise them."""
    from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

    assignor = fresh_class(base)
    if held is not None:
        assignor.on_assignment(ConsumerProtocolMemberAssignment(0, by_topic(held), b""))
    return wire(assignor.metadata(sorted(topics)))


class AiokafkaPeer:
    """One of aiokafka's built-in assignors, as aiokafka's group coordinator drives it."""

    def __init__(self, kind: str) -> None:
        from aiokafka.coordinator.assignors.range import RangePartitionAssignor
        from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
        from aiokafka.coordinator.assignors.sticky.sticky_assignor import (
            StickyPartitionAssignor,
        )

        bases: dict[str, Any] = {
            "range": RangePartitionAssignor,
            "roundrobin": RoundRobinPartitionAssignor,
            "sticky": StickyPartitionAssignor,
        }
        self._base: Any = bases[kind]
        self._cluster: Any = None
        self._cluster_key: tuple[tuple[str, int], ...] = ()

    def cluster(self, partitions_per_topic: Mapping[str, int]) -> Any:
        """:func:`aiokafka_cluster` of these topics, cached while they are the same."""
        key = tuple(sorted(partitions_per_topic.items()))
        if key != self._cluster_key:
            self._cluster, self._cluster_key = aiokafka_cluster(dict(key)), key
        return self._cluster

    def assign(
        self,
        partitions_per_topic: Mapping[str, int],
        topics: Sequence[str],
        owned: Mapping[str, Sequence[TopicPartition] | None],
    ) -> tuple[dict[str, list[TopicPartition]], float]:
        """Every member's partitions and the seconds ``assign`` took.

        ``owned`` maps each member to what it received last round (None: a new or restarted
        consumer, which has no history). Metadata goes through aiokafka's wire encoding, as the
        leader reads it.
        """
        cluster = self.cluster(partitions_per_topic)
        members = {
            member: aiokafka_member(self._base, topics, held) for member, held in owned.items()
        }
        leader = fresh_class(self._base)
        start = time.perf_counter()
        result = leader.assign(cluster, members)
        elapsed = time.perf_counter() - start
        out: dict[str, list[TopicPartition]] = {}
        for member, got in result.items():
            out[member] = [TopicPartition(t, p) for t, ps in got.assignment for p in ps]
        return out, elapsed
