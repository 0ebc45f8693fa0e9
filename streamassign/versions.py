"""Two topology versions in one group (a rolling deploy that changes the topology).

A task id means "partition ``p`` of subtopology ``s``" in the topology of whoever reads it. While
old and new processes share the group, the leader hands out ids in its own numbering: where the
new version gave an id to another subtopology (``1 [b]`` became ``1 [n]``, ``b`` moved to 2),
a member of the other version would open the task as its own subtopology of that id, own the
leader's partitions, and find none of their records belong to it (the audit saw them rewound in
a hot loop: no progress on those partitions while both versions ran).

The member side (:func:`mismatched_tasks`, used by ``ProcessHost``) therefore checks each
assigned task against its own topology: a task with a partition, in the leader's topic
dictionary, that this process's task of that id does not read is refused (not run, its
partitions paused): that partition's records would map to a task the process does not run.
A task whose leader partitions are a subset of its own task's runs as before (a topic added to
a subtopology, a co-partition group declared). The leader applies the same subset rule before
it assigns: members of protocol version 3 announce each subtopology id's source topics
(:func:`subtopology_topic_indices`, named again by :func:`announced_sources`), and a process
gets no task of an id whose leader topics are not all among those it announces for that id
(``streamassign.eligibility``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable, Mapping

import attrs

from ._ids import TaskId, TopicPartition
from .errors import ProtocolError, TopologyVersionMismatchError
from .topology import Topology

__all__ = [
    "ROLLING_DEPLOY_DOC",
    "SubtopologyDifference",
    "TaskMismatch",
    "announced_sources",
    "mismatch_error",
    "mismatched_tasks",
    "refused_subtopologies",
    "reused_subtopologies",
    "sources_fingerprint",
    "subtopology_fingerprints",
    "subtopology_topic_indices",
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

#: ``(subtopology id, the leader's source topics, this topology's)``: one id whose tasks mean
#: other partitions to the leader than here (this topology's empty: it has no such id).
SubtopologyDifference = tuple[int, tuple[str, ...], tuple[str, ...]]


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
    """Those of ``tasks`` with a partition by the leader's dictionary (``AssignmentInfo.topics``:
    subtopology -> source topics with counts) that ``topology``'s task of that id does not
    read: its records would map to a task this process does not run (the hot loop). A task
    whose leader partitions are a subset of its own task's runs (its records are its own).
    Counts come from the leader's dictionary, else ``partition_counts`` (the
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
        if not sources or not theirs <= _partitions(sources, task.partition, counts):
            out[task] = TaskMismatch(task, tuple(sorted(theirs)), tuple(sources))
    return out


def reused_subtopologies(
    topology: Topology, leader_topics: Mapping[int, Mapping[str, int]]
) -> frozenset[SubtopologyDifference]:
    """The subtopology ids of the leader's dictionary that this topology has too, reading a
    topic this topology's subtopology of that id does not (an id reused across versions; a
    leader whose subtopology reads fewer topics is no difference: its tasks run here): the
    state of a mixed-version episode (the same for every consumer of a generation). An id
    only the leader has is a subtopology added with a fresh id, as it should be: not a
    difference (a task of it assigned here is a :func:`mismatched_tasks`)."""
    own = set(topology.subtopology_ids)
    out = set()
    for sub, entries in leader_topics.items():
        mine = topology.subtopology(sub).source_topics if sub in own else ()
        if mine and not set(entries) <= set(mine):
            out.add((sub, tuple(sorted(entries)), tuple(sorted(mine))))
    return frozenset(out)


def refused_subtopologies(
    topology: Topology,
    leader_topics: Mapping[int, Mapping[str, int]],
    mismatches: Iterable[TaskMismatch],
) -> frozenset[SubtopologyDifference]:
    """The subtopology ids whose tasks this process refuses: the :func:`reused_subtopologies`,
    and the ids of refused tasks (``mismatches``) that this topology lacks."""
    return reused_subtopologies(topology, leader_topics) | {
        (m.task.subtopology, tuple(sorted({tp.topic for tp in m.leader_partitions})), ())
        for m in mismatches
        if not m.own_sources
    }


def mismatch_error(
    differences: Iterable[SubtopologyDifference],
    mismatches: Mapping[TaskId, TaskMismatch],
    paused: Iterable[TopicPartition],
) -> TopologyVersionMismatchError:
    """The error a process logs once per episode: which subtopologies differ, every task it
    refuses (over all its consumers) with the leader's partitions, and the remedy."""
    listed = "; ".join(
        f"the leader's subtopology {sub} reads {', '.join(theirs)}, this process's "
        + (f"reads {', '.join(mine)}" if mine else "does not exist")
        for sub, theirs, mine in sorted(differences)
    )
    refused = "; ".join(_refused(m) for _, m in sorted(mismatches.items()))
    example = f"; tasks not run here: {refused}" if refused else ""
    held = sorted(f"{tp.topic}-{tp.partition}" for tp in paused)
    pauses = f", partitions paused ({', '.join(held)})" if held else ""
    return TopologyVersionMismatchError(
        f"the group's leader runs another topology version: {listed}{example}{pauses}; "
        "committed offsets untouched; such tasks run once a leader of this version assigns "
        f"them. {REMEDY}"
    )


def _refused(mismatch: TaskMismatch) -> str:
    """One refused task: the leader's partitions and what this process's task of that id reads."""
    parts = ", ".join(f"{tp.topic}-{tp.partition}" for tp in mismatch.leader_partitions)
    here = ", ".join(mismatch.own_sources) or "nothing (no such id)"
    return f"{mismatch.task} (leader's partitions {parts}; here it reads {here})"


def subtopology_topic_indices(
    topology: Topology, subscribed: Iterable[str]
) -> dict[int, frozenset[int]]:
    """What a member announces (protocol version 3): per subtopology id, its source topics
    (what its tasks' partitions are) as indices into its sorted ``subscribed`` topics, whose
    names the JoinGroup metadata carries (``ProcessHost`` subscribes to every source topic).
    Stores and co-partition groups are left out: neither changes a task's partitions. A
    subtopology reading a topic outside ``subscribed`` is left out too: the leader then
    gives this process no task of it, which it could not be given the partitions of."""
    position = {topic: i for i, topic in enumerate(sorted(set(subscribed)))}
    out = {}
    for sub in topology.subtopology_ids:
        sources = topology.subtopology(sub).source_topics
        if all(t in position for t in sources):
            out[sub] = frozenset(position[t] for t in sources)
    return out


def announced_sources(
    subscribed: Iterable[str],
    indices: Mapping[int, Collection[int]],
    only: Collection[int] | None = None,
) -> dict[int, frozenset[str]]:
    """The leader's reading of what a member announces (:func:`subtopology_topic_indices`):
    per subtopology id (of ``only``'s, when given: the leader's), its source topics by name.
    ``ProtocolError`` for an index past the member's ``subscribed`` topics (garbage: the names
    travel beside the user data), checked for every id."""
    if not indices:
        return {}
    topics = sorted(set(subscribed))
    for sub, positions in indices.items():
        if max(positions, default=-1) >= len(topics):
            past = min(i for i in positions if i >= len(topics))
            raise ProtocolError(
                f"subtopology {sub} announces topic index {past} of a subscription of "
                f"{len(topics)} topics"
            )
    wanted = indices.keys() if only is None else [s for s in only if s in indices]
    return {sub: frozenset(map(topics.__getitem__, indices[sub])) for sub in wanted}


def subtopology_fingerprints(topology: Topology) -> dict[int, str]:
    """A short hash per subtopology id of its sorted source topics (what its tasks'
    partitions are), for log lines only (:func:`topology_version`): the wire carries the
    topics themselves (:func:`subtopology_topic_indices`)."""
    return {
        sub: sources_fingerprint(topology.subtopology(sub).source_topics)
        for sub in topology.subtopology_ids
    }


def sources_fingerprint(topics: Iterable[str]) -> str:
    """The short hash of one subtopology's source topics (:func:`subtopology_fingerprints`),
    also for topics a member announces (``describe`` names a member's version with it)."""
    text = json.dumps(sorted(topics), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def topology_version(fingerprints: Mapping[int, str]) -> str:
    """A short name of a whole topology's fingerprints (for log lines: which processes run
    which version)."""
    text = json.dumps(sorted(fingerprints.items()), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:8]
