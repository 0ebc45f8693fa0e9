"""The partition grouper: from a topology and partition counts to tasks and their partitions.

Task ``s_p`` owns partition ``p`` of every source topic of subtopology ``s`` that has more than
``p`` partitions, so subtopology ``s`` has as many tasks as its largest source topic has
partitions. Before grouping, the counts of repartition topics are resolved (computed counts follow
chains of repartition topics) and co-partition groups are enforced, as Kafka Streams'
``RepartitionTopics`` and ``CopartitionedTopicsEnforcer`` do. ``docs/topology.md`` states the rules.

Everything here is a plain function of its input: no I/O, no cluster client, no global state.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from itertools import repeat
from typing import Any

import attrs

from ._ids import TaskId, TopicPartition
from .errors import (
    CopartitioningError,
    InvalidPartitionCountsError,
    MissingTopicsError,
    RepartitionResolutionError,
)
from .topology import Subtopology, Topology

__all__ = [
    "InvalidPartitionCountsError",
    "PartitionGrouper",
    "RepartitionResolutionError",
    "changelog_partitions",
    "checked_partition_counts",
    "group_partitions",
    "resolve_partition_counts",
    "task_counts",
]


def _group_node(group: tuple[str, ...]) -> str:
    # Cannot collide with a topic: topic names never contain spaces or parentheses.
    return f"co-partition group ({', '.join(group)})"


def checked_partition_counts(
    topics: Iterable[str], partition_counts: Mapping[str, int]
) -> dict[str, int]:
    """Count of each of ``topics`` from ``partition_counts``: ``MissingTopicsError`` naming the
    topics without a count, ``InvalidPartitionCountsError`` naming counts that are not ints >= 1."""
    missing: list[str] = []
    invalid: dict[str, object] = {}
    counts: dict[str, int] = {}
    for topic in topics:
        if topic not in partition_counts:
            missing.append(topic)
            continue
        n = partition_counts[topic]
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            invalid[topic] = n
        else:
            counts[topic] = n
    if missing:
        raise MissingTopicsError(missing)
    if invalid:
        raise InvalidPartitionCountsError(invalid)
    return counts


def resolve_partition_counts(
    topology: Topology, partition_counts: Mapping[str, int]
) -> dict[str, int]:
    """Partition count of every source topic of ``topology`` (external and repartition), by name.

    External topics take their count from ``partition_counts`` (other entries, including counts of
    repartition topics, are ignored). A computed repartition topic takes the largest count among the
    source topics of the subtopologies that write it, recursively; co-partition groups then force
    their count onto computed members, and that forced count flows further down the chain.

    Raises ``MissingTopicsError`` (external topics without a count), ``InvalidPartitionCountsError``
    (counts < 1), ``CopartitioningError`` (a group that cannot be made equal; ``counts`` names
    every topic of the group with the count it has or would have) and
    ``RepartitionResolutionError`` (a cycle of computed counts, or a computed topic nobody writes).
    """
    repartition = topology.repartition_topics
    externals = sorted(topology.external_source_topics)
    counts: dict[str, int] = checked_partition_counts(externals, partition_counts)
    for topic, fixed in repartition.items():
        if fixed is not None:
            counts[topic] = fixed
    deps, failed_groups = _count_dependencies(topology, counts)
    unresolved = _resolve_nodes(deps, counts)
    for group, reason in failed_groups:
        raise _copartitioning_error(repartition, group, reason, counts)
    if unresolved:
        raise _resolution_error(deps, unresolved)
    return {t: counts[t] for t in sorted(topology.source_topics)}


def _count_dependencies(
    topology: Topology, counts: dict[str, int]
) -> tuple[dict[str, tuple[str, ...]], list[tuple[tuple[str, ...], str]]]:
    """The dependency graph of computed counts, and the co-partition groups that cannot be made
    equal (with why); sets in ``counts`` the counts co-partition groups force.

    Every computed repartition topic, and every all-computed co-partition group, is a node whose
    value is the max over its dependencies (topics whose counts feed it).
    """
    repartition = topology.repartition_topics
    deps: dict[str, tuple[str, ...]] = {}
    failed_groups: list[tuple[tuple[str, ...], str]] = []
    grouped: set[str] = set()
    for group in topology.copartition_groups:
        computed = [t for t in group if t in repartition and repartition[t] is None]
        forced, reason = _forced_group_count(repartition, group, counts)
        if reason:
            failed_groups.append((group, reason))
            continue  # its computed members are resolved on their own, for the error message
        grouped.update(computed)
        if forced:
            n = next(iter(forced))
            for topic in computed:
                counts[topic] = n
        elif computed:
            node = _group_node(group)
            sources = (_writer_sources(topology, t) for t in computed)
            deps[node] = tuple(sorted(set().union(*sources)))
            for topic in computed:
                deps[topic] = (node,)
    for topic, fixed in repartition.items():
        if fixed is None and topic not in grouped:
            deps[topic] = tuple(sorted(_writer_sources(topology, topic)))
    return deps, failed_groups


def _writer_sources(topology: Topology, topic: str) -> set[str]:
    """Source topics of the subtopologies that write ``topic``."""
    return {
        src
        for sub_id in topology.writers(topic)
        for src in topology.subtopology(sub_id).source_topics
    }


def _forced_group_count(
    repartition: Mapping[str, int | None], group: tuple[str, ...], counts: Mapping[str, int]
) -> tuple[set[int], str]:
    """The count a co-partition group's external or fixed members force (empty: none), and why
    the group cannot be made equal ("": it can)."""
    ext = [t for t in group if t not in repartition]
    fixed_members = [t for t in group if t in repartition and repartition[t] is not None]
    ext_counts = {counts[t] for t in ext}
    fixed_counts = {counts[t] for t in fixed_members}
    reason = ""
    if len(ext_counts) > 1:
        reason = "external topics have different partition counts"
    elif ext_counts and fixed_counts - ext_counts:
        reason = (
            "fixed repartition topic counts must equal the external topics' count "
            f"{next(iter(ext_counts))}"
        )
    elif len(fixed_counts) > 1:
        reason = "fixed repartition topics have different partition counts"
    return ext_counts or fixed_counts, reason


def _copartitioning_error(
    repartition: Mapping[str, int | None],
    group: tuple[str, ...],
    reason: str,
    counts: Mapping[str, int],
) -> CopartitioningError:
    """The error for a group that cannot be made equal, naming what its computed members have."""
    computed = [t for t in group if t in repartition and repartition[t] is None]
    known = [t for t in computed if t in counts]
    unknown = [t for t in computed if t not in counts]
    if known:
        reason += f"; {', '.join(known)} computed, shown with the count it would have alone"
    if unknown:
        reason += f"; computed count unknown for {', '.join(unknown)}"
    return CopartitioningError({t: counts[t] for t in group if t in counts}, reason)


def _resolve_nodes(deps: Mapping[str, tuple[str, ...]], values: dict[str, int]) -> set[str]:
    """Kahn's algorithm: set ``values[node] = max(values[d] for d in deps[node])``.

    Iterative, so chains of any length resolve without recursion. Returns the nodes left
    unresolved (on or downstream of a cycle, or without dependencies).
    """
    pending: dict[str, int] = {}
    dependents: dict[str, list[str]] = {}
    ready: list[str] = []
    for node, node_deps in deps.items():
        waiting = 0
        for dep in node_deps:
            if dep not in values:
                waiting += 1
                dependents.setdefault(dep, []).append(node)
        pending[node] = waiting
        if waiting == 0 and node_deps:
            ready.append(node)
    while ready:
        node = ready.pop()
        values[node] = max(values[dep] for dep in deps[node])
        for dependent in dependents.get(node, ()):
            pending[dependent] -= 1
            if pending[dependent] == 0:
                ready.append(dependent)
    return {node for node in deps if node not in values}


def _resolution_error(
    deps: Mapping[str, tuple[str, ...]], unresolved: set[str]
) -> RepartitionResolutionError:
    """Describe why ``unresolved`` nodes have no count: walk upstream to a cycle or a dead end."""
    dead_ends = sorted(n for n in unresolved if not deps[n])
    start = dead_ends[0] if dead_ends else min(unresolved)
    if dead_ends:
        # Report the first topic nobody writes, and what it blocks (a path downstream of it).
        downstream: dict[str, list[str]] = {}
        for node in sorted(unresolved):
            for dep in deps[node]:
                downstream.setdefault(dep, []).append(node)
        chain = [start]
        seen = {start}
        while nxt := [n for n in downstream.get(chain[-1], ()) if n not in seen]:
            chain.append(nxt[0])
            seen.add(nxt[0])
        if start.startswith("co-partition group"):
            what = f"{start} has only computed repartition topics and none has a writer"
            fix = "give one of them a fixed 'partitions' count or list it in the sink_topics"
        else:
            what = f"repartition topic {start!r} has no fixed partition count and no writer"
            fix = "give it a fixed 'partitions' count or list it in the sink_topics"
        feeds = f"; it feeds {' -> '.join(chain)}" if len(chain) > 1 else ""
        return RepartitionResolutionError(
            f"cannot compute partition counts: {what} ({fix} of the subtopology that writes "
            f"it){feeds}",
            chain,
            cycle=False,
        )
    path: list[str] = []
    position: dict[str, int] = {}
    node = start
    while node not in position:
        position[node] = len(path)
        path.append(node)
        node = min(d for d in deps[node] if d in unresolved)
    cycle = [*path[position[node] :], node]
    cycle.reverse()  # path follows dependencies upstream; report in data-flow order
    return RepartitionResolutionError(
        "cannot compute partition counts: repartition topics form a cycle: "
        f"{' -> '.join(cycle)} (give one of them a fixed 'partitions' count or co-partition it "
        "with an external topic)",
        cycle,
        cycle=True,
    )


def task_counts(topology: Topology, partition_counts: Mapping[str, int]) -> dict[int, int]:
    """Number of tasks of each subtopology (its largest source count), by subtopology id.

    This is also the partition count Kafka Streams gives the subtopology's changelog topics.
    """
    counts = resolve_partition_counts(topology, partition_counts)
    return {sub.id: max(counts[t] for t in sub.source_topics) for sub in topology.subtopologies}


def _task_ids(subtopology: int, count: int) -> list[TaskId]:
    # ``tuple.__new__`` called through ``map`` builds the NamedTuples without a Python frame per
    # item: grouping 100k partitions is about twice as fast as calling ``TaskId(s, p)``.
    return list(map(tuple.__new__, repeat(TaskId), zip(repeat(subtopology), range(count))))


def _partitions(topic: str, count: int) -> list[TopicPartition]:
    return list(map(tuple.__new__, repeat(TopicPartition), zip(repeat(topic), range(count))))


def _group_resolved(
    subtopologies: Iterable[Subtopology], counts: Mapping[str, int]
) -> dict[TaskId, frozenset[TopicPartition]]:
    tasks: dict[TaskId, frozenset[TopicPartition]] = {}
    for sub in subtopologies:  # ascending id, then ascending partition: sorted by TaskId
        # Topics by descending count: those with more than p partitions are a prefix, of width w
        # for p in [count of topics[w], count of topics[w - 1]).
        topics = sorted(sub.source_topics, key=lambda t: (-counts[t], t))
        sizes = [counts[t] for t in topics]
        task_ids = _task_ids(sub.id, sizes[0])
        columns = [_partitions(t, n) for t, n in zip(topics, sizes, strict=True)]
        for width in range(len(topics), 0, -1):
            lo = sizes[width] if width < len(topics) else 0
            hi = sizes[width - 1]
            if lo < hi:
                rows = zip(*(column[lo:hi] for column in columns[:width]), strict=True)
                tasks.update(zip(task_ids[lo:hi], map(frozenset, rows), strict=True))
    return tasks


def group_partitions(
    topology: Topology, partition_counts: Mapping[str, int]
) -> dict[TaskId, frozenset[TopicPartition]]:
    """Tasks of ``topology`` and the source partitions each owns, sorted by ``TaskId``.

    Task ``s_p`` owns partition ``p`` of every source topic of subtopology ``s`` with more than
    ``p`` partitions. Raises like :func:`resolve_partition_counts`.
    """
    counts = resolve_partition_counts(topology, partition_counts)
    return _group_resolved(topology.subtopologies, counts)


def changelog_partitions(
    topology: Topology, partition_counts: Mapping[str, int]
) -> dict[TaskId, frozenset[TopicPartition]]:
    """Changelog partitions of every stateful task, sorted by ``TaskId``.

    Task ``s_p`` owns partition ``p`` of the changelog topic of each store of ``s``; stateless tasks
    are absent. Needs ``topology.name`` when the topology has stores.
    """
    counts = resolve_partition_counts(topology, partition_counts)
    out: dict[TaskId, frozenset[TopicPartition]] = {}
    for sub in topology.subtopologies:
        if not sub.stores:
            continue
        n = max(counts[t] for t in sub.source_topics)
        columns = [_partitions(c, n) for c in topology.changelog_topics(sub.id)]
        out.update(
            zip(_task_ids(sub.id, n), map(frozenset, zip(*columns, strict=True)), strict=True)
        )
    return out


@attrs.frozen
class PartitionGrouper:
    """Groups source partitions into tasks (Kafka Streams' ``PartitionGrouper``).

    Stateless: every method is a function of its arguments; one instance can serve every
    rebalance and every topology.
    """

    def group(
        self, topology: Topology, partition_counts: Mapping[str, int]
    ) -> dict[TaskId, frozenset[TopicPartition]]:
        """Task -> source partitions it owns, sorted by task; see :func:`group_partitions`."""
        return group_partitions(topology, partition_counts)

    def resolve_partition_counts(
        self, topology: Topology, partition_counts: Mapping[str, int]
    ) -> dict[str, int]:
        """Count of every source topic; see :func:`resolve_partition_counts`."""
        return resolve_partition_counts(topology, partition_counts)

    def changelog_partitions(
        self, topology: Topology, partition_counts: Mapping[str, int]
    ) -> dict[TaskId, frozenset[TopicPartition]]:
        """Stateful task -> changelog partitions it owns; see :func:`changelog_partitions`."""
        return changelog_partitions(topology, partition_counts)


#: Names that moved to the Faust layer (``streamassign.faust.topology``), with their old path
#: documented before: still importable from here, with a ``DeprecationWarning``.
_MOVED_TO_FAUST = frozenset({"FAUST_HASHED_ID_BASE", "faust_style_topology"})


def __getattr__(name: str) -> Any:
    if name not in _MOVED_TO_FAUST:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"streamassign.grouper.{name} moved to streamassign.faust.topology.{name}",
        DeprecationWarning,
        stacklevel=2,
    )
    # The one import of a higher layer in the core: a deprecated alias, loaded only on use.
    from .faust import topology as faust_topology

    return getattr(faust_topology, name)
