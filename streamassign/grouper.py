"""The partition grouper: from a topology and partition counts to tasks and their partitions.

Task ``s_p`` owns partition ``p`` of every source topic of subtopology ``s`` that has more than
``p`` partitions, so subtopology ``s`` has as many tasks as its largest source topic has
partitions. Before grouping, the counts of repartition topics are resolved (computed counts follow
chains of repartition topics) and co-partition groups are enforced, as Kafka Streams'
``RepartitionTopics`` and ``CopartitionedTopicsEnforcer`` do. ``docs/topology.md`` states the rules.

Everything here is a plain function of its input: no I/O, no cluster client, no global state.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Mapping
from itertools import repeat

import attrs

from ._ids import TaskId, TopicPartition
from .errors import (
    CopartitioningError,
    InvalidPartitionCountsError,
    MissingTopicsError,
    RepartitionResolutionError,
    TopologyError,
)
from .topology import Subtopology, Topology, changelog_topic_name

__all__ = [
    "FAUST_HASHED_ID_BASE",
    "InvalidPartitionCountsError",
    "PartitionGrouper",
    "RepartitionResolutionError",
    "changelog_partitions",
    "faust_style_topology",
    "group_partitions",
    "resolve_partition_counts",
    "task_counts",
]

logger = logging.getLogger(__name__)


def _group_node(group: tuple[str, ...]) -> str:
    # Cannot collide with a topic: topic names never contain spaces or parentheses.
    return f"co-partition group ({', '.join(group)})"


def _check_counts(topics: Iterable[str], partition_counts: Mapping[str, int]) -> dict[str, int]:
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
    counts: dict[str, int] = _check_counts(externals, partition_counts)
    for topic, fixed in repartition.items():
        if fixed is not None:
            counts[topic] = fixed

    # Every computed repartition topic, and every all-computed co-partition group, is a node whose
    # value is the max over its dependencies (topics whose counts feed it).
    def writer_sources(topic: str) -> set[str]:
        return {
            src
            for sub_id in topology.writers(topic)
            for src in topology.subtopology(sub_id).source_topics
        }

    deps: dict[str, tuple[str, ...]] = {}
    failed_groups: list[tuple[tuple[str, ...], str]] = []
    grouped: set[str] = set()
    for group in topology.copartition_groups:
        ext = [t for t in group if t not in repartition]
        fixed_members = [t for t in group if t in repartition and repartition[t] is not None]
        computed = [t for t in group if t in repartition and repartition[t] is None]
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
        if reason:
            failed_groups.append((group, reason))
            continue  # its computed members are resolved on their own, for the error message
        grouped.update(computed)
        forced = ext_counts or fixed_counts
        if forced:
            n = next(iter(forced))
            for topic in computed:
                counts[topic] = n
        elif computed:
            node = _group_node(group)
            deps[node] = tuple(sorted(set().union(*(writer_sources(t) for t in computed))))
            for topic in computed:
                deps[topic] = (node,)
    for topic, fixed in repartition.items():
        if fixed is None and topic not in grouped:
            deps[topic] = tuple(sorted(writer_sources(topic)))

    unresolved = _resolve_nodes(deps, counts)

    for group, reason in failed_groups:
        computed = [t for t in group if t in repartition and repartition[t] is None]
        known = [t for t in computed if t in counts]
        unknown = [t for t in computed if t not in counts]
        if known:
            reason += f"; {', '.join(known)} computed, shown with the count it would have alone"
        if unknown:
            reason += f"; computed count unknown for {', '.join(unknown)}"
        raise CopartitioningError({t: counts[t] for t in group if t in counts}, reason)
    if unresolved:
        raise _resolution_error(deps, unresolved)
    return {t: counts[t] for t in sorted(topology.source_topics)}


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


# -- Faust-style topologies ------------------------------------------------------------------------

#: Faust-style subtopology ids below this are partition counts; disambiguated ids (several
#: subscriber groups sharing one count) are hashed into ``[FAUST_HASHED_ID_BASE, 2**31)``.
FAUST_HASHED_ID_BASE = 1 << 20
_HASHED_ID_SPAN = (1 << 31) - FAUST_HASHED_ID_BASE


def _hashed_id(count: int, topics: tuple[str, ...]) -> int:
    digest = hashlib.blake2b(f"{count}:{','.join(topics)}".encode(), digest_size=8).digest()
    return FAUST_HASHED_ID_BASE + int.from_bytes(digest, "big") % _HASHED_ID_SPAN


def _next_hashed_id(sid: int) -> int:
    """The id probed after ``sid`` on a collision: the next one, wrapping within the hashed
    range so it stays below 2**31 (a subtopology id is an int32 on the wire)."""
    return FAUST_HASHED_ID_BASE + (sid - FAUST_HASHED_ID_BASE + 1) % _HASHED_ID_SPAN


def faust_style_topology(
    subscriptions: Mapping[str, Iterable[str]],
    partition_counts: Mapping[str, int],
    *,
    name: str = "",
    stores: Mapping[str, str] | None = None,
) -> Topology:
    """A topology for an application that declares none, from what its members subscribe to.

    Topics with equal partition counts and the same set of subscribing members form one
    subtopology, and are co-partitioned. Subtopology ids are stable (see ``docs/topology.md``):

    * a group that is alone with its partition count ``n`` gets id ``n``;
    * when several groups share ``n``, the one with the most topics (ties: the smallest first
      topic name) keeps ``n``, the others get ``FAUST_HASHED_ID_BASE + blake2b(n, topics) mod
      (2**31 - FAUST_HASHED_ID_BASE)``, probing upward on the (rare) collision.

    So ids never depend on member ids, adding a topic with a new count renumbers nothing, and a
    member joining with an existing member's subscription changes nothing. Topics absent from
    ``partition_counts`` are left out with a warning. ``stores`` maps a store (Faust table) name to
    a source topic that feeds it; the store joins that topic's subtopology, and its changelog
    ``<name>-<store>-changelog`` is removed from the sources (Faust members subscribe to it).
    """
    stores = dict(stores or {})
    if stores and not name:
        raise TopologyError("faust_style_topology: stores need the application name (name=...)")
    changelogs = {changelog_topic_name(name, store) for store in stores}

    subscribers: dict[str, set[str]] = {}
    for member, topics in subscriptions.items():
        if isinstance(topics, (str, bytes)):
            raise TypeError(f"subscription of {member!r} must be a list of topics, not {topics!r}")
        for topic in topics:
            if topic not in changelogs:
                subscribers.setdefault(topic, set()).add(member)

    missing = sorted(t for t in subscribers if t not in partition_counts)
    if missing:
        logger.warning(
            "faust-style topology: leaving out subscribed topics with no partition count "
            "(not created yet?): %s",
            ", ".join(missing),
        )
    counts = _check_counts([t for t in subscribers if t in partition_counts], partition_counts)
    too_large = sorted(f"{t}:{n}" for t, n in counts.items() if n >= FAUST_HASHED_ID_BASE)
    if too_large:
        raise TopologyError(
            f"faust_style_topology: partition counts of {FAUST_HASHED_ID_BASE} or more would "
            f"collide with hashed subtopology ids: {', '.join(too_large)}"
        )

    by_key: dict[tuple[int, frozenset[str]], list[str]] = {}
    for topic, n in counts.items():
        by_key.setdefault((n, frozenset(subscribers[topic])), []).append(topic)
    by_count: dict[int, list[tuple[str, ...]]] = {}
    for (n, _members), topics in by_key.items():
        by_count.setdefault(n, []).append(tuple(sorted(topics)))

    ids: dict[tuple[str, ...], int] = {}
    hashed: list[tuple[int, tuple[str, ...]]] = []
    for n, groups in by_count.items():
        groups.sort(key=lambda g: (-len(g), g[0]))
        ids[groups[0]] = n
        hashed.extend((n, g) for g in groups[1:])
    taken: set[int] = set()
    for n, group in sorted(hashed):
        sid = _hashed_id(n, group)
        while sid in taken:
            sid = _next_hashed_id(sid)
        taken.add(sid)
        ids[group] = sid

    owner = {topic: group for group in ids for topic in group}
    group_stores: dict[tuple[str, ...], list[str]] = {}
    for store, topic in sorted(stores.items()):
        if topic in owner:
            group_stores.setdefault(owner[topic], []).append(store)
        elif topic in subscribers:
            logger.warning(
                "faust-style topology: leaving out store %r: its topic %r has no partition count",
                store,
                topic,
            )
        else:
            raise TopologyError(
                f"faust_style_topology: store {store!r} is fed by {topic!r}, which no member "
                "subscribes to"
            )
    subtopologies = [
        Subtopology(sid, group, group_stores.get(group, ())) for group, sid in ids.items()
    ]
    return Topology(subtopologies, [g for g in ids if len(g) > 1], name=name)
