"""Two topology versions in one group (a rolling deploy that changes the topology).

A task id means "partition ``p`` of subtopology ``s``" in the topology of whoever reads it. While
old and new processes share the group, the leader hands out ids in its own numbering: where the
new version gave an id to another subtopology (``1 [b]`` became ``1 [n]``, ``b`` moved to 2),
a member of the other version would open the task as its own subtopology of that id, own the
leader's partitions, and find none of their records belong to it (the audit saw them rewound in
a hot loop: no progress on those partitions while both versions ran).

The member side (:func:`mismatched_tasks`, used by ``ProcessHost``) therefore checks each
assigned task against its own topology: a task whose partitions, in the leader's topic
dictionary, are not the partitions this process's subtopology of that id reads is not run, and
its partitions are paused. The leader side compares per-subtopology fingerprints
(:func:`subtopology_fingerprints`) that members of protocol version 3 announce.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping

import attrs

from ._ids import TaskId, TopicPartition
from .errors import TopologyVersionMismatchError
from .topology import Topology

__all__ = [
    "ROLLING_DEPLOY_DOC",
    "TaskMismatch",
    "leader_topology_differences",
    "mismatch_error",
    "mismatched_tasks",
    "subtopology_fingerprints",
    "topology_version",
]

#: Where an operator reads about keeping subtopology ids stable across versions.
ROLLING_DEPLOY_DOC = "docs/streams.md#rolling-deploys-that-change-the-topology"

#: What to do about a reused id (every mismatch line ends with it).
REMEDY = (
    "Remedy: a new subtopology needs a fresh id (a removed one leaves a gap), and an id must never "
    "be reused for another subtopology while processes of both versions run; see "
    + ROLLING_DEPLOY_DOC
)


@attrs.frozen
class TaskMismatch:
    """An assigned task that means other partitions here than in the leader's topology."""

    task: TaskId
    #: The task's partitions by the leader's topic dictionary.
    leader_partitions: tuple[TopicPartition, ...]
    #: What this process's subtopology of that id reads (empty: it has none of that id).
    own_sources: tuple[str, ...]


def _partitions(
    topics: Iterable[str], partition: int, counts: Mapping[str, int]
) -> set[TopicPartition]:
    """Partition ``partition`` of each of ``topics`` that has it (a topic of unknown count is
    taken to have it: the task would read it)."""
    return {
        TopicPartition(t, partition) for t in topics if partition < counts.get(t, partition + 1)
    }


def mismatched_tasks(
    topology: Topology,
    tasks: Iterable[TaskId],
    leader_topics: Mapping[int, Mapping[str, int]],
    partition_counts: Mapping[str, int] | None = None,
) -> dict[TaskId, TaskMismatch]:
    """Those of ``tasks`` whose partitions by the leader's dictionary (``AssignmentInfo.topics``:
    subtopology -> source topics with counts) differ from the partitions ``topology``'s task
    of that id reads. Counts come from the leader's dictionary, else ``partition_counts`` (the
    member's metadata). A task whose subtopology the dictionary lacks cannot be checked and is
    not returned (treated as before)."""
    counts = dict(partition_counts or {})
    for entries in leader_topics.values():
        counts.update(entries)
    own = set(topology.subtopology_ids)
    out: dict[TaskId, TaskMismatch] = {}
    for task in sorted(tasks):
        leader = leader_topics.get(task.subtopology)
        if leader is None:
            continue
        theirs = _partitions(leader, task.partition, leader)
        sources = (
            topology.subtopology(task.subtopology).source_topics if task.subtopology in own else ()
        )
        if _partitions(sources, task.partition, counts) != theirs or not sources:
            out[task] = TaskMismatch(task, tuple(sorted(theirs)), tuple(sources))
    return out


def leader_topology_differences(
    topology: Topology, leader_topics: Mapping[int, Mapping[str, int]]
) -> frozenset[tuple[int, tuple[str, ...], tuple[str, ...]]]:
    """``(subtopology, leader's sources, this topology's sources)`` for every subtopology id of
    the leader's dictionary that this topology has too, reading other topics: an id reused
    across versions, the state of a mixed-version episode (the same for every consumer of a
    generation). An id only the leader has is a subtopology added with a fresh id, as it
    should be: not a difference (a task of it assigned here is a :func:`mismatched_tasks`)."""
    own = set(topology.subtopology_ids)
    out = set()
    for sub, entries in leader_topics.items():
        mine = topology.subtopology(sub).source_topics if sub in own else ()
        if mine and set(mine) != set(entries):
            out.add((sub, tuple(sorted(entries)), tuple(sorted(mine))))
    return frozenset(out)


def mismatch_error(
    differences: Iterable[tuple[int, tuple[str, ...], tuple[str, ...]]],
    mismatches: Mapping[TaskId, TaskMismatch],
    paused: Iterable[TopicPartition],
) -> TopologyVersionMismatchError:
    """The error a member logs once per episode: which subtopologies differ, an example task
    with the leader's partitions and what this process reads, and the remedy."""
    listed = "; ".join(
        f"the leader's subtopology {sub} reads {', '.join(theirs)}, this process's "
        + (f"reads {', '.join(mine)}" if mine else "does not exist")
        for sub, theirs, mine in sorted(differences)
    )
    example = ""
    if mismatches:
        first = mismatches[min(mismatches)]
        leader_parts = ", ".join(f"{tp.topic}-{tp.partition}" for tp in first.leader_partitions)
        here = f"subtopology {first.task.subtopology} reads " + (
            ", ".join(first.own_sources) if first.own_sources else "nothing (no such id)"
        )
        others = f" and {len(mismatches) - 1} more" if len(mismatches) > 1 else ""
        example = (
            f"; task {first.task}{others} assigned with the leader's partitions {leader_parts}, "
            f"where this process's {here}: not run here"
        )
    held = sorted(f"{tp.topic}-{tp.partition}" for tp in paused)
    pauses = f", partitions paused ({', '.join(held)})" if held else ""
    return TopologyVersionMismatchError(
        f"the group's leader runs another topology version: {listed}{example}{pauses}; "
        "committed offsets untouched; such tasks run once a leader of this version assigns "
        f"them. {REMEDY}"
    )


def subtopology_fingerprints(topology: Topology) -> dict[int, str]:
    """A short hash per subtopology id of what decides its tasks' partitions: its source
    topics and the co-partition groups they belong to. Stores are left out on purpose: a
    store added to a subtopology keeps the task's partitions (both versions run it, the new
    store starts empty), so it must not make either version idle."""
    out = {}
    for sub in topology.subtopology_ids:
        sources = sorted(topology.subtopology(sub).source_topics)
        groups = sorted(
            {tuple(sorted(g)) for t in sources if (g := topology.copartition_group_of(t))}
        )
        text = json.dumps([sources, groups], separators=(",", ":"))
        out[sub] = hashlib.sha256(text.encode()).hexdigest()[:12]
    return out


def topology_version(fingerprints: Mapping[int, str]) -> str:
    """A short name of a whole topology's fingerprints (for log lines: which processes run
    which version)."""
    text = json.dumps(sorted(fingerprints.items()), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:8]
