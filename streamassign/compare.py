"""Two assignments of one group side by side: how their tasks are matched, what a reader of
the comparison must be told about it, and what a saved assignment's standby count may hide.
The work behind ``streamassign explain``, ``diff``, ``plan --clients`` and ``describe
--watch``; the CLI prints what this module words. Pure, as the rest of the core.

- A plain consumer group has no tasks: ``describe`` numbers its partitions ``t_p``, partition
  ``p`` of its ``t``-th topic in name order, so a topic added or removed renumbers every topic
  after it. Two assignments of one consumer group are matched by partition
  (:func:`compare_snapshots`, :func:`match_views`), their moves named by partition
  (:class:`PartitionNames`), and the renumbering said in a note.
- Other groups' tasks are matched by id; where one id reads other partitions on the two
  sides, :func:`other_partitions_warning` says whether that is a topology change or two
  applications' files mixed up.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Protocol
from urllib.parse import urlsplit

import attrs

from ._ids import TaskId, TopicPartition
from .assignment import ClientAssignment
from .explain import ClientView, ProcessMembers, Snapshot, named_as_after
from .text import counted, listed, partitions_by_topic

#: A task table: per task, its source partitions (a consumer group's: one partition each).
TaskTable = Mapping[TaskId, frozenset[TopicPartition]]

# -- a consumer group's ids, matched by partition -----------------------------------------------

#: A consumer group's protocol family as a snapshot's ``family`` says it: the value of
#: ``streamassign.aiokafka.describe.Family.CONSUMER`` (a test pins the two together), which
#: the core may not import (it sits below aiokafka) and a comparison of files must not
#: (aiokafka is an extra).
CONSUMER_FAMILY: Final = "consumer"


@attrs.frozen
class _Renumbering:
    """A consumer group's old table numbered as a new one numbers its topics, worked out once
    per comparison: ``numbers``, per topic number ``t`` of the old table, the number the new
    one gives that topic; ``changed``, the topics of both tables whose number differs between
    them (what a renumbering note weighs)."""

    numbers: dict[int, int]
    changed: frozenset[str]


def _renumbering(
    old_tasks: TaskTable, new_tasks: TaskTable, new_ids: Iterable[TaskId] = ()
) -> _Renumbering | None:
    """The renumbering of a consumer group's ``old_tasks`` table as ``new_tasks`` numbers its
    topics. There ``t_p`` is partition ``p`` of the ``t``-th topic in name order
    (``describe``'s ``_consumer_tasks``), so a topic added or removed renumbers the topics
    after it. A topic ``new_tasks`` lacks is numbered past every number ``new_tasks`` and
    ``new_ids`` (every id the new side names) use, so that its ids name nothing there. None
    when either table is not one partition per task of that form."""
    old_numbers, new_numbers = _topic_numbers(old_tasks), _topic_numbers(new_tasks)
    if old_numbers is None or new_numbers is None:
        return None
    used = [*new_numbers.values(), *(t.subtopology for t in new_ids)]
    fresh = max(used, default=-1) + 1
    renumbering = {}
    for topic, number in sorted(old_numbers.items()):
        if topic in new_numbers:
            renumbering[number] = new_numbers[topic]
        else:
            renumbering[number], fresh = fresh, fresh + 1
    return _Renumbering(renumbering, _changed_topics(old_numbers, new_numbers))


def _snapshots_renumbering(before: Snapshot, after: Snapshot) -> _Renumbering | None:
    """``before``'s table numbered as ``after``'s when both are consumer groups' tables."""
    if before.family != CONSUMER_FAMILY or after.family != CONSUMER_FAMILY:
        return None
    return _renumbering(before.tasks, after.tasks, _task_ids_named(after))


def _numbered_by(before: Snapshot, renumbering: _Renumbering | None) -> Snapshot:
    """``before`` with its task ids renumbered as ``renumbering`` says (the one of its table
    as an AFTER snapshot's numbers its topics, :func:`_snapshots_renumbering`): matched by id,
    a renumbered topic's tasks would read as moves that never were. ``before`` as it is when
    there is none (not both consumer groups, a table not of that form), when no id changes,
    or when ``before`` names a task of a topic its table lacks (a hand-edited file): then
    tasks are matched by id."""
    if renumbering is None:
        return before
    numbers, named = renumbering.numbers, _task_ids_named(before)
    if any(t.subtopology not in numbers for t in named) or all(
        numbers[t.subtopology] == t.subtopology for t in named
    ):
        return before
    return _renumbered(before, numbers)


def _topic_numbers(tasks: TaskTable) -> dict[str, int] | None:
    """Per topic, its number ``t`` in a consumer group's ``tasks`` table (``t_p``: partition
    ``p`` of topic ``t``); None when the table is not of that form."""
    numbers: dict[str, int] = {}
    for task, parts in tasks.items():
        if len(parts) != 1:
            return None
        (tp,) = parts
        if tp.partition != task.partition:
            return None
        if numbers.setdefault(tp.topic, task.subtopology) != task.subtopology:
            return None
    return numbers if len(set(numbers.values())) == len(numbers) else None


def is_partition_table(tasks: TaskTable) -> bool:
    """Whether ``tasks`` is a consumer group's table: one partition per task, ``t_p`` being
    partition ``p`` of the topic numbered ``t``, one number per topic."""
    return _topic_numbers(tasks) is not None


def _task_ids_named(snapshot: Snapshot) -> set[TaskId]:
    """Every task id a snapshot names: its tables, reports, previous actives and departed."""
    named = set(snapshot.tasks)
    for view in [*snapshot.views.values(), *snapshot.departed.values()]:
        a = view.assignment
        named |= a.active | a.standby | a.warmup
    for _, sums in snapshot.reports:
        named |= sums.keys()
    return named.union(*snapshot.previous_active.values())


def _renumbered(snapshot: Snapshot, renumber: Mapping[int, int]) -> Snapshot:
    """``snapshot`` with each task ``t_p`` named ``renumber[t]_p`` wherever it names one."""
    return _renamed(snapshot, lambda t: TaskId(renumber[t.subtopology], t.partition), {})


def _renamed(
    snapshot: Snapshot, task: Callable[[TaskId], TaskId], processes: Mapping[str, str]
) -> Snapshot:
    """``snapshot`` with each task ``t`` named ``task(t)`` and each process key in
    ``processes`` named as it says, wherever it names one."""

    def tasks(ids: frozenset[TaskId]) -> frozenset[TaskId]:
        return frozenset(map(task, ids))

    def view(v: ClientView) -> ClientView:
        return _view_renamed(v, task)

    def key(pid: str) -> str:
        return processes.get(pid, pid)

    return attrs.evolve(
        snapshot,
        views={key(pid): view(v) for pid, v in snapshot.views.items()},
        reports=tuple(
            (key(pid), {task(t): s for t, s in sums.items()}) for pid, sums in snapshot.reports
        ),
        previous_active={key(pid): tasks(ids) for pid, ids in snapshot.previous_active.items()},
        departed={key(pid): view(v) for pid, v in snapshot.departed.items()},
        process_members={key(pid): ms for pid, ms in snapshot.process_members.items()},
        tasks=dict(sorted(((task(t), p) for t, p in snapshot.tasks.items()), key=lambda i: i[0])),
    )


def renumbered_view(view: ClientView, renumbering: Mapping[int, int]) -> ClientView:
    """``view`` with each task ``t_p`` named ``renumbering[t]_p`` (every ``t`` it names must
    be a key: :func:`_renumbering`)."""
    return _view_renamed(view, lambda t: TaskId(renumbering[t.subtopology], t.partition))


def _view_renamed(view: ClientView, task: Callable[[TaskId], TaskId]) -> ClientView:
    """``view`` with each task ``t`` named ``task(t)``."""
    a = view.assignment

    def tasks(ids: frozenset[TaskId]) -> frozenset[TaskId]:
        return frozenset(map(task, ids))

    return ClientView(
        view.capacity, ClientAssignment(tasks(a.active), tasks(a.standby), tasks(a.warmup))
    )


def _assigned_ids(a: ClientAssignment) -> frozenset[TaskId]:
    """Every task ``a`` names: actives, standbys and warmups."""
    return a.active | a.standby | a.warmup


# -- a switch of assignor: tasks matched by partition, processes by member ----------------------


@attrs.frozen
class _ProtocolSwitch:
    """How the earlier side of a comparison is named as the later one names things when the
    group's assignor changed between them (a rolling switch from Faust's own assignor to the
    drop-in): the two number tasks and key processes each their own way (Faust's topic-group
    numbers and worker URLs; partition counts and process UUIDs), so matched by id every task
    would read as removed and every process as gone. ``tasks``: every earlier id to its later
    name (the later task of the same partitions, else a number past every later id, naming
    nothing there); ``processes``: earlier key to later key, where one later process holds
    one of its members or endpoints; ``note``: the line that says so."""

    tasks: Mapping[TaskId, TaskId]
    processes: Mapping[str, str]
    note: str

    def task(self, task: TaskId) -> TaskId:
        return self.tasks.get(task, task)

    def views(self, views: Mapping[str, ClientView]) -> dict[str, ClientView]:
        """``views`` (earlier processes) as the later side names them."""
        return {self.processes.get(k, k): _view_renamed(v, self.task) for k, v in views.items()}


@attrs.frozen
class _Side:
    """One side of a comparison as :func:`_protocol_switch` reads it."""

    protocol: str | None
    family: str | None
    tasks: TaskTable
    named: frozenset[TaskId]
    members: ProcessMembers


def _protocol_switch(earlier: _Side, later: _Side) -> _ProtocolSwitch | None:
    """The :class:`_ProtocolSwitch` from ``earlier`` to ``later``; None when both sides say
    one protocol (or either says none), or both are consumer groups (numbered alike, by
    topic: :func:`_renumbering` matches them)."""
    if earlier.protocol is None or later.protocol is None or earlier.protocol == later.protocol:
        return None
    if earlier.family == CONSUMER_FAMILY == later.family:
        return None
    tasks = _tasks_by_partition(earlier.tasks, later.tasks)
    task_count = len(earlier.named | earlier.tasks.keys())
    tasks_said = f"{len(tasks)} of {counted(task_count, 'task')} matched by partition"
    used = [t.subtopology for t in (*later.tasks, *later.named)]
    # An earlier task no later one reads the same partitions of is numbered past every later
    # id: matched by id, it would read as moved to whatever the later side calls so.
    unmatched = earlier.named - tasks.keys()
    numbers = sorted({t.subtopology for t in unmatched})
    fresh = {s: n for n, s in enumerate(numbers, max(used, default=-1) + 1)}
    for t in unmatched:
        tasks[t] = TaskId(fresh[t.subtopology], t.partition)
    processes = _processes_by_member(earlier.members, later.members)
    shared = sum(map(_several_behind_one, earlier.members.values()))
    note = (
        f"note: the assignor protocol changed from {earlier.protocol} to {later.protocol}, "
        f"which name tasks and processes differently: {tasks_said}, {len(processes)} of "
        f"{counted(len(earlier.members), 'process', 'processes')} by member id or endpoint"
    )
    if shared:
        several = counted(shared, "process", "processes")
        note += f"; {several} of several workers on one endpoint left unmatched"
    return _ProtocolSwitch(tasks, processes, note)


def _tasks_by_partition(earlier: TaskTable, later: TaskTable) -> dict[TaskId, TaskId]:
    """Earlier id -> later id of the one later task reading exactly the same partitions."""
    by_partitions: dict[frozenset[TopicPartition], list[TaskId]] = {}
    for task, parts in later.items():
        by_partitions.setdefault(parts, []).append(task)
    return {
        task: same[0]
        for task, parts in earlier.items()
        if parts and len(same := by_partitions.get(parts, [])) == 1
    }


def _processes_by_member(earlier: ProcessMembers, later: ProcessMembers) -> dict[str, str]:
    """Earlier key -> later key of the one later process holding one of its member ids or
    endpoints (a Faust worker's URL is its endpoint under both assignors), one to one: a
    later process two earlier ones lead to is left out rather than guessed, and so is a
    process on either side whose members share an endpoint (:func:`_several_behind_one`)."""
    later_ids = {k: {m for m, _ in ms} for k, ms in later.items()}
    later_hosts = {k: {e for _, e in ms if _names_one_host(e)} for k, ms in later.items()}
    matched: dict[str, str] = {}
    for key, members in earlier.items():
        if _several_behind_one(members):
            continue
        ids = {m for m, _ in members}
        endpoints = {e for _, e in members if _names_one_host(e)}
        same = [k for k in later if ids & later_ids[k] or endpoints & later_hosts[k]]
        if len(same) == 1 and not _several_behind_one(later[same[0]]):
            matched[key] = same[0]
    targets = Counter(matched.values())
    return {key: new for key, new in matched.items() if targets[new] == 1}


def _names_one_host(endpoint: str) -> bool:
    """Whether ``endpoint`` can tell one worker: not empty, and not a wildcard address
    (``web_host="0.0.0.0"`` gives every Faust worker ``http://0.0.0.0:6066``, so one worker
    alone on it before a switch and another alone after would be taken for one)."""
    try:  # a member advertises any string: one it cannot parse tells no worker
        host = urlsplit(endpoint if "//" in endpoint else f"//{endpoint}").hostname
    except ValueError:
        return False
    if not host:
        return False
    try:
        return not ipaddress.ip_address(host).is_unspecified
    except ValueError:  # a host name
        return True


def _several_behind_one(members: frozenset[tuple[str, str]]) -> bool:
    """Whether two of ``members`` give one endpoint: Faust workers all on one URL (a
    ``web_host`` of 0.0.0.0), which a group keyed by URL reads as one process. Matched to a
    process of the other side, every task of the worker that stopped would read as kept."""
    endpoints = [e for _, e in members if e]
    return len(endpoints) != len(set(endpoints))


def _snapshot_side(snapshot: Snapshot) -> _Side:
    return _Side(
        snapshot.protocol,
        snapshot.family,
        snapshot.tasks,
        frozenset(_task_ids_named(snapshot)),
        snapshot.process_members,
    )


# -- a consumer group's moves, named by partition ---------------------------------------------


@attrs.frozen
class PartitionNames:
    """How a consumer group's moves name their tasks: by partition (``partitions``: both
    sides' tables, BEFORE's numbered as AFTER numbers its topics), as a removed topic's ids
    (numbered past AFTER's) name other partitions, or nothing, on either side.
    ``after_topics``: per topic number of AFTER's table, its topic; ``--json`` gives the id of
    a partition of the topic AFTER numbers so (AFTER's id, even where no partition of that id
    is assigned there, as when its owner became undecodable) and none for a gone topic's,
    even where AFTER gives its number to another topic (tasks matched by id: a hand-edited
    file): there the id names another partition."""

    partitions: Mapping[TaskId, TopicPartition]
    after_topics: Mapping[int, str]

    def label(self, task: TaskId) -> str:
        """``orders-3``; an id neither table lists (a hand-edited file) as ``1_0 (no
        partition)``: under a ``partition`` column a bare id reads as a partition's name."""
        tp = self.partitions.get(task)
        return f"{task} (no partition)" if tp is None else f"{tp.topic}-{tp.partition}"

    def as_json(self, task: TaskId) -> dict[str, Any]:
        """A move's ``task`` (None for a gone topic's partition) and ``partition`` (None for
        an id neither table lists)."""
        tp = self.partitions.get(task)
        kept = tp is None or self.after_topics.get(task.subtopology) == tp.topic
        return {
            "task": str(task) if kept else None,
            "partition": None if tp is None else [tp.topic, tp.partition],
        }


def partition_names(old: TaskTable, new: TaskTable) -> PartitionNames | None:
    """The partition naming of a consumer group's moves from ``old`` (numbered as ``new``
    numbers its topics: :func:`compare_snapshots`) to ``new``; None when a table is not a consumer
    group's (:func:`is_partition_table`) or the two disagree on an id (matched by id: a
    hand-edited file)."""
    if not (is_partition_table(old) and is_partition_table(new)):
        return None
    return _agreeing_names(old, new)


def _agreeing_names(old: TaskTable, new: TaskTable) -> PartitionNames | None:
    """:func:`partition_names` of two tables known to be consumer groups'."""
    if any(old[t] != new[t] for t in old.keys() & new.keys()):
        return None
    return _named_by_partition(old, new)


def _named_by_partition(old: TaskTable, new: TaskTable) -> PartitionNames:
    """:class:`PartitionNames` of two tables known to be consumer groups' that agree on
    every id they share."""
    partitions = {t: tp for table in (old, new) for t, (tp,) in table.items()}
    return PartitionNames(partitions, {t.subtopology: tp.topic for t, (tp,) in new.items()})


# -- the note of a renumbering ------------------------------------------------------------------


def _renumbering_said(
    old: TaskTable,
    new: TaskTable,
    named: str,
    *,
    changed: frozenset[str],
    unassigned_topics: Iterable[str] | None,
    undecodable_counts: tuple[int, int],
) -> str:
    """The note that a consumer group's tasks were renumbered to match by partition (``old``:
    already renumbered; ``named``: as which side names them): what renumbered them, and the
    ids a gone topic's partitions got (past ``new``'s, naming nothing on either side).
    ``changed``: the topics of both tables whose number changed (the comparison worked them
    out with the renumbering). ``unassigned_topics``: the topics subscribed with no partition
    assigned on one side only (None: not known, as a saved snapshot is read without its
    members' subscriptions); only those numbered on that side alone that sort before a topic
    of ``changed`` are named (:func:`_shifting_topics`); ``undecodable_counts``: how many
    members of each side (BEFORE's, AFTER's) are undecodable with their topics unknown."""
    said = (
        f"note: tasks matched by partition, {named}: a consumer group's task t_p is partition "
        "p of its t-th topic in name order, renumbered by "
    )
    old_topics, new_topics = topics_of(old), topics_of(new)
    shifting = _shifting_topics(unassigned_topics, old_topics | new_topics, changed)
    if old_topics == new_topics:
        # The tables agree on topics: a subscribed topic numbered without partitions assigned
        # to it (not created yet, a typo), or an edited file.
        return said + _unassigned_cause(shifting)
    changes = _topic_changes(old_topics, new_topics, undecodable_counts)
    cause = f"a change of topics ({changes})"
    if shifting:  # a topic of both tables may have moved by these alone
        cause += f" and {_unassigned_cause(shifting)}"
    gone = sorted(old_topics - new_topics)
    if gone:
        numbers = {tp.topic: t.subtopology for t, ps in old.items() for tp in ps}
        numbered = ", ".join(f"{topic} as {numbers[topic]}_p" for topic in gone)
        how = "removed or hidden" if undecodable_counts[1] else "removed"
        which = f"a {how} topic" if len(gone) == 1 else f"{how} topics"
        cause += f"; {which} numbered past every id there: {numbered}"
    return said + cause


def _shifting_topics(
    unassigned_topics: Iterable[str] | None, table_topics: set[str], renumbered: frozenset[str]
) -> list[str] | None:
    """Of ``unassigned_topics`` (None: not known), in name order, those that renumbered a topic
    a reader compares: numbered on one side alone (a topic of either table, ``table_topics``,
    is numbered on both) and sorting before a topic of both tables whose number
    changed (``renumbered``). One sorting after every such topic moved none, and when none
    changed (a gone topic's slot taken by the new one) it renumbered nothing."""
    if unassigned_topics is None:
        return None
    last_renumbered = max(renumbered, default="")
    return sorted(t for t in set(unassigned_topics) - table_topics if t < last_renumbered)


def _changed_topics(
    old_numbers: Mapping[str, int], new_numbers: Mapping[str, int]
) -> frozenset[str]:
    """The topics of both consumer groups' tables (their :func:`_topic_numbers`) whose number
    ``t`` differs between them."""
    return frozenset(t for t, number in old_numbers.items() if new_numbers.get(t, number) != number)


def _unassigned_cause(unassigned_topics: Iterable[str] | None) -> str:
    """A renumbering between tables of the same topics: by a subscribed topic without
    partitions, named when known (``unassigned_topics``; None: files, which may be edited)."""
    if unassigned_topics is None:
        return "a subscribed topic with no partition assigned (or an edited file)"
    topics = sorted(set(unassigned_topics))
    if not topics:
        return "a subscribed topic with no partition assigned"
    noun = "a subscribed topic" if len(topics) == 1 else "subscribed topics"
    return f"{noun} with no partition assigned ({listed(topics, 4)})"


def _topic_changes(
    old_topics: set[str], new_topics: set[str], undecodable_counts: tuple[int, int] = (0, 0)
) -> str:
    """``added topic a; removed topics b, c`` (either part only when it has topics). Where a
    side has undecodable members whose topics are unknown (``undecodable_counts``: BEFORE's,
    AFTER's), a topic only the other side shows may be theirs: ``added or no longer hidden by
    1 undecodable member``, ``removed or hidden by 2 undecodable members``."""
    changes = []
    for topics, how, hidden_by in (
        (new_topics - old_topics, "added", undecodable_counts[0]),
        (old_topics - new_topics, "removed", undecodable_counts[1]),
    ):
        if not topics:
            continue
        if hidden_by:
            hidden = "no longer hidden" if how == "added" else "hidden"
            members = counted(hidden_by, "undecodable member")
            changes.append(f"{_topic_names(topics)} {how} or {hidden} by {members}")
        else:
            changes.append(f"{how} {_topic_names(topics)}")
    return "; ".join(changes)


def topics_of(tasks: TaskTable) -> set[str]:
    """The topics of a task table's partitions."""
    return {tp.topic for parts in tasks.values() for tp in parts}


def _topic_names(topics: set[str]) -> str:
    """``topic a`` or ``topics a, b``."""
    noun = "topic" if len(topics) == 1 else "topics"
    return f"{noun} {listed(sorted(topics), 4)}"


# -- two saved assignments: explain and diff ----------------------------------------------------


@attrs.frozen
class SnapshotsCompared:
    """BEFORE as ``explain`` and ``diff`` compare it with AFTER: ``before``, numbered as AFTER
    numbers a consumer group's topics (:func:`_numbered_by`); ``names``: how the moves name
    tasks (None: by id); ``lines``: the note of a renumbering and the warnings that the two
    may not be one group's, one line each; ``switch_note``: the note of a change of assignor
    protocol (a long one, to wrap: :class:`_ProtocolSwitch`)."""

    before: Snapshot
    names: PartitionNames | None
    lines: tuple[str, ...]
    switch_note: str | None = None


def compare_snapshots(
    old: Snapshot, new: Snapshot, before_name: str, after_name: str
) -> SnapshotsCompared:
    """BEFORE (``old``, saved as ``before_name``) as compared with AFTER (``new``, saved as
    ``after_name``): see :class:`SnapshotsCompared`."""
    switch = _protocol_switch(_snapshot_side(old), _snapshot_side(new))
    if switch is not None:
        switched = _renamed(old, switch.task, switch.processes)
        lines = _unrelated_warnings(switched, new, before_name, after_name)
        return SnapshotsCompared(switched, None, tuple(lines), switch.note)
    renumbering = _snapshots_renumbering(old, new)
    matched = _numbered_by(old, renumbering)
    lines = []
    if renumbering is not None and matched is not old:
        note = _renumbering_said(
            matched.tasks,
            new.tasks,
            f"named as in {after_name}",
            changed=renumbering.changed,
            unassigned_topics=_unassigned_in_files(old, new),
            undecodable_counts=(old.unknown_subscriptions, new.unknown_subscriptions),
        )
        lines.append(note)
    lines += _unrelated_warnings(matched, new, before_name, after_name)
    # Both consumer groups' tables of the form (there is a renumbering), BEFORE's renumbered
    # one too (a topic takes one number).
    names = None if renumbering is None else _agreeing_names(matched.tasks, new.tasks)
    return SnapshotsCompared(matched, names, tuple(lines))


def _unassigned_in_files(old: Snapshot, new: Snapshot) -> set[str] | None:
    """:func:`_unassigned_on_one_side` of two files, when both files' member rows say their
    subscriptions; else None."""
    if old.subscribed_topics is None or new.subscribed_topics is None:
        return None
    return _unassigned_on_one_side(
        (old.subscribed_topics, old.tasks), (new.subscribed_topics, new.tasks)
    )


def _unassigned_on_one_side(
    old: tuple[Iterable[str], TaskTable], new: tuple[Iterable[str], TaskTable]
) -> set[str]:
    """The topics subscribed with no partition assigned on one side only, numbered on that
    side alone; each side as its subscribed topics and its table."""
    (old_subscribed, old_tasks), (new_subscribed, new_tasks) = old, new
    return (set(old_subscribed) - topics_of(old_tasks)) ^ (
        set(new_subscribed) - topics_of(new_tasks)
    )


def _unrelated_warnings(old: Snapshot, new: Snapshot, before: str, after: str) -> list[str]:
    """A warning line when BEFORE and AFTER cannot be one group's: saved from groups of other
    names, or naming one task id with other partitions (another application's files, mixed
    up): compared all the same, they would tell a plausible story of moves that never were."""
    lines = []
    if old.group is not None and new.group is not None and old.group != new.group:
        lines.append(
            f"warning: {before} is of group {old.group!r}, {after} of group {new.group!r}: "
            "compared as one group's"
        )
    other = other_partitions_warning(
        TaskSource(before, old.tasks, old.group),
        TaskSource(after, new.tasks, new.group),
        groups_said=True,  # the line above, when they differ
    )
    return lines if other is None else [*lines, other]


def landing_state(old: Snapshot, new: Snapshot) -> dict[str, dict[TaskId, int]]:
    """``explain``'s ``lags`` for BEFORE -> AFTER: what AFTER's members reported at their last
    join; when AFTER has no reports (a ``plan --json`` what-if of BEFORE), the checkpointed
    state BEFORE's members reported, as ``plan --clients BEFORE`` reads it, so that ``explain
    BEFORE PLAN.json`` lands where ``plan --explain`` does."""
    if new.reports:
        return new.local_state()
    try:
        return {c.process_id: dict(c.lags) for c in old.clients()}
    except ValueError:  # a process id ClientState refuses: no local state to tell
        return {}


# -- one task id, other partitions: matched by id ------------------------------------------------


@attrs.frozen
class TaskSource:
    """One side of a comparison of task partitions: its name in messages (a file, or "the
    topology"), per task its source partitions, and the group (application id) it belongs to
    (None: it does not say)."""

    name: str
    tasks: TaskTable
    group: str | None


def other_partitions_warning(
    earlier: TaskSource, later: TaskSource, *, groups_said: bool = False
) -> str | None:
    """The warning line when tasks of one id read other partitions in ``later`` than in
    ``earlier`` (None when none do): tasks are matched by id alone. Worded as a topology
    change (topics added to a subtopology mid-roll) when both are one application's
    (:func:`one_application`), else as a mix-up of two applications' files, naming what tells
    them apart: their names (``groups_said``: a line above named two groups that differ) and
    their topics."""
    differ = sorted(
        t
        for t in earlier.tasks.keys() & later.tasks.keys()
        if earlier.tasks[t] and later.tasks[t] and earlier.tasks[t] != later.tasks[t]
    )
    if not differ:
        return None
    same_application = one_application(
        earlier, later, topics_of(earlier.tasks) & topics_of(later.tasks)
    )
    detail = _what_differs(earlier, later, differ[0], one_application=same_application)
    differing = (
        f"warning: {counted(len(differ), 'task')} read other partitions in {later.name} "
        f"than in {earlier.name}"
    )
    if same_application:
        return f"{differing}: a topology change ({detail}); tasks are matched by id"
    detail = _names_apart(earlier, later, groups_said) + detail
    return f"{differing} ({detail}); tasks are matched by id alone: is it the same application?"


def _what_differs(
    earlier: TaskSource, later: TaskSource, first: TaskId, *, one_application: bool
) -> str:
    """The detail of :func:`other_partitions_warning`: with the same topics, the partitions
    of ``first`` (the first task that differs) on each side; else the topics added and
    removed (one application) or each side's topics."""
    old_topics, new_topics = topics_of(earlier.tasks), topics_of(later.tasks)
    if old_topics == new_topics:
        return (
            f"{first}: {partitions_by_topic(earlier.tasks[first])} in {earlier.name}; "
            f"{partitions_by_topic(later.tasks[first])} in {later.name}"
        )
    if one_application:
        return _topic_changes(old_topics, new_topics)
    return (
        f"topics of {earlier.name}: {listed(sorted(old_topics), 4)}; "
        f"of {later.name}: {listed(sorted(new_topics), 4)}"
    )


def one_application(earlier: TaskSource, later: TaskSource, shared_topics: set[str]) -> bool:
    """Whether two sides of other task partitions are one application's, changed: they share
    a source topic, and their group names do not differ when both say one (a topology's name
    is its application id, the group's name). One name with no topic shared may be another
    environment's application (application ids are often kept across them, topics not)."""
    renamed = bool(earlier.group and later.group and earlier.group != later.group)
    return bool(shared_topics) and not renamed


def _names_apart(earlier: TaskSource, later: TaskSource, groups_said: bool) -> str:
    """The start of the detail of a warning that two sides may be two applications': their
    names when both say one (unless ``groups_said``: a line above named two that differ),
    with "no topic shared" when the names are one (what tells them apart); else nothing."""
    if not (earlier.group and later.group):
        return ""
    if earlier.group == later.group:
        return f"both named {earlier.group!r}, no topic shared; "
    if groups_said:
        return ""
    return f"{earlier.name} is of group {earlier.group!r}, {later.name} of {later.group!r}; "


# -- a live group: describe --watch --------------------------------------------------------------


class DescribedMember(Protocol):
    """What :func:`match_views` reads of a described group's member
    (``streamassign.aiokafka.describe.MemberView``, which the core may not import)."""

    @property
    def topics(self) -> Sequence[str]: ...

    @property
    def assigned(self) -> bool: ...


class DescribedGroup(Protocol):
    """What :func:`match_views` reads of one view of a described group
    (``streamassign.aiokafka.describe.GroupView``)."""

    @property
    def family(self) -> str: ...

    @property
    def protocol(self) -> str: ...

    @property
    def members(self) -> Sequence[DescribedMember]: ...

    @property
    def tasks(self) -> TaskTable: ...

    def processes(self) -> Mapping[str, ClientView]: ...

    def process_members(self) -> ProcessMembers: ...


@attrs.frozen
class ViewsMatched:
    """``describe --watch``'s last view as the new one names it: ``before``, its processes
    (:func:`explain`'s ``before``; None before the first view); ``names``: how their moves
    name tasks (None: by id); ``note``: a renumbering to say (None: no id changed);
    ``switched``: whether it is a change of assignor protocol's (a long note, to wrap)."""

    before: Mapping[str, ClientView] | None
    names: PartitionNames | None = None
    note: str | None = None
    switched: bool = False


def match_views(last: DescribedGroup | None, view: DescribedGroup) -> ViewsMatched:
    """The ``last`` view of a group (None before the first) as ``view`` names it: a process
    whose key changed as a clash of a shared process id started or ended (``P`` <->
    ``P#endpoint``) keeps its name (:func:`named_as_after`), and a consumer group's tasks are
    matched by partition, as ``explain`` matches two saved snapshots of the group."""
    if last is None:
        return ViewsMatched(None)
    switch = _protocol_switch(_view_side(last), _view_side(view))
    if switch is not None:
        return ViewsMatched(switch.views(last.processes()), note=switch.note, switched=True)
    before = named_as_after(last.processes(), last.process_members(), view.process_members())
    if last.family == CONSUMER_FAMILY == view.family:
        matched = _matched_by_partition(before, last, view)
        if matched is not None:
            return matched
    return ViewsMatched(before)


def _view_side(view: DescribedGroup) -> _Side:
    named = {t for v in view.processes().values() for t in _assigned_ids(v.assignment)}
    members = view.process_members()
    return _Side(
        view.protocol, view.family, view.tasks, frozenset(named | view.tasks.keys()), members
    )


def _matched_by_partition(
    before: Mapping[str, ClientView], last: DescribedGroup, view: DescribedGroup
) -> ViewsMatched | None:
    """``before`` (``last``'s processes) numbered as ``view`` numbers its topics
    (:func:`_renumbering`), with the moves' naming by partition and the note to
    print when any id changed. None when a table is not a consumer group's or ``before``
    names a task its table lacks: then tasks are matched by id."""
    renumbering = _renumbering(last.tasks, view.tasks)
    named = {t for v in before.values() for t in _assigned_ids(v.assignment)}
    if renumbering is None or any(t.subtopology not in renumbering.numbers for t in named):
        return None
    numbers = renumbering.numbers
    old = {TaskId(numbers[t.subtopology], t.partition): ps for t, ps in last.tasks.items()}
    views = {pid: renumbered_view(v, numbers) for pid, v in before.items()}
    # Both tables are of the form (there is a renumbering), and a topic takes one number.
    names = _named_by_partition(old, view.tasks)
    if all(number == was for was, number in numbers.items()):
        return ViewsMatched(views, names)
    note = _renumbering_said(
        old,
        view.tasks,
        "as the new view names them",
        changed=renumbering.changed,
        unassigned_topics=_unassigned_on_one_side(_topics_and_table(last), _topics_and_table(view)),
        undecodable_counts=(_unknown_topics_members(last), _unknown_topics_members(view)),
    )
    return ViewsMatched(views, names, note)


def _topics_and_table(view: DescribedGroup) -> tuple[list[str], TaskTable]:
    """``view`` as :func:`_unassigned_on_one_side` takes a side: its members' topics and its
    table."""
    return [t for m in view.members for t in m.topics], view.tasks


def _unknown_topics_members(view: DescribedGroup) -> int:
    """How many of ``view``'s members are undecodable with their topics unknown (no
    assignment, no subscription read): a member whose user data alone (its subscription's or
    its assignment's) is unreadable still shows its topics, so it hides none."""
    return sum(1 for m in view.members if not m.assigned and not m.topics)


# -- a saved assignment's standbys per task ------------------------------------------------------


def standby_doubt(saved: Snapshot, count: int, where: str) -> str | None:
    """The line to print when a saved assignment's stated standbys per task (``count``) may
    be fewer than the app runs: fewer than some task holds in the file (a warning), or
    inferred at the cap its processes set (each holds at most processes - 1 copies of a task,
    so a group of one process shows 0 whatever the app's count; a note). None otherwise."""
    most = saved.most_standbys()
    if count < most:
        return (
            f"warning: {where} states num_standby_replicas {count} but holds up to {most} per "
            f"task: planned with {count}, which drops standbys; give --standbys for the app's"
        )
    processes = saved.inferring_processes()
    if saved.standbys_inferred and count >= processes - 1:
        return (
            f"note: --standbys {count} from {where}, which describe inferred from "
            f"{counted(processes, 'process', 'processes')} ({_standbys_fit(processes)}): the app "
            "may run more; give --standbys N for the app's"
        )
    return None


def _standbys_fit(processes: int) -> str:
    """How many standbys per task ``processes`` processes hold at most (a copy never sits
    beside its active)."""
    return "none fit" if processes <= 1 else f"at most {processes - 1} per task fit"
