"""The group leader's work for a Faust app, as a pure function (no Faust, no aiokafka).

``assign_faust`` replaces what ``faust.assignor.PartitionAssignor`` does on the leader:

* **Tasks.** Topics are grouped Faust-style (equal partition count and the same subscribers form
  one co-partitioned group, ``streamassign.faust.topology.faust_style_topology``) unless the app
  declares its co-partition groups; then only the declared groups are co-partitioned and every
  other topic is a group of its own — unless a table's changelog is left out of the declared
  groups (or sits in one without a source topic): then the declaration would part the table from
  its source, so Faust's rule is used instead, logged. Group ``g``'s task ``g_p`` owns partition
  ``p`` of each of its topics. A group holding a changelog topic of a (non-global) table is
  stateful.
* **Changelogs.** Each member announces its app's changelog and global-changelog topics (client
  tags ``CHANGELOGS_TAG``, ``GLOBAL_CHANGELOGS_TAG``); the leader's own app decides for the
  topics it reads, and for the others it takes what every reader announces alike
  (``trusted_tables``), so a table only a newer app version has is still stateful and its
  global tables still whole, but no single member can turn a source topic into a table.
* **Assignment.** The sticky task assignor with real capacities (each worker's consumer count,
  or the weight it reports, 1 to ``MAX_CAPACITY``; other claims are ignored, logged) and
  ``table_standby_replicas`` standbys, one run per set of members
  that subscribe to the same groups (a member never gets a topic it does not subscribe to).
* **History.** Each member's versioned ``SubscriptionInfo`` says what it runs, what table state
  it has on disk (offset sums) and what it ran before a restart (from its state file), so a
  restarted worker gets its partitions back; unreadable user data (garbage, a format this
  version cannot read) is a member with no history, never an error (``decode_member``).
* **Host maps.** Keyed per process, so two workers announcing the same URL lose nothing.
* **Copied state directories.** Workers announcing one process id with different URLs (a
  cloned disk, a data directory copied to warm a new worker) are different workers: each URL is
  a process of its own (``streams.process_keys``), logged at WARNING with the remedy.

A member's partitions are the source and changelog partitions of its active tasks, the changelog
partitions of its standby (and warmup) tasks, and every partition of the global tables'
changelogs it subscribes to (Faust keeps a full copy of a global table on every worker).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import attrs

from .. import TaskId, TopicPartition
from ..assignment import ClientAssignment, ClientState
from ..errors import ErrorCode, TopologyError, TopologyTypeError
from ..grouper import PartitionGrouper
from ..protocol import (
    LATEST_VERSION,
    AssignmentInfo,
    ProtocolError,
    SubscriptionInfo,
)
from ..repeats import Repeats, log_error_once
from ..sticky import StickyTaskAssignor
from ..streams import (
    MemberAssignment,
    MemberSubscription,
    bounded_claims,
    client_states,
    common_version,
    decode_subscriptions,
    merge_offset_sums,
    previous_actives,
    stateless_returns,
    without_copied_claims,
)
from ..threads import distribute_to_threads
from ..topology import Subtopology, Topology
from .topology import _hashed_id, _next_hashed_id, faust_style_topology

__all__ = [
    "CAPACITY_TAG",
    "CHANGELOGS_TAG",
    "DISK_TABLES_TAG",
    "GLOBAL_CHANGELOGS_TAG",
    "MAX_CAPACITY",
    "RECOVERED_TAG",
    "assign_faust",
    "check_copartition_groups",
    "decode_member",
    "decode_members",
    "faust_topology",
    "host_key",
    "parse_capacity",
    "trusted_tables",
]

log = logging.getLogger("streamassign.faust")

#: Client tag carrying a worker's configured capacity (weight); stripped before assignment.
CAPACITY_TAG = "streamassign.capacity"
#: Client tags carrying a worker's changelog / global-changelog topics (comma-separated: Kafka
#: topic names have no commas); stripped before assignment.
CHANGELOGS_TAG = "streamassign.changelogs"
GLOBAL_CHANGELOGS_TAG = "streamassign.global-changelogs"
#: Client tag: ``1`` once the worker's Faust recovery has completed (its actives restored)
#: since it started, ``0`` before: whether its running claims are its first restore
#: (``_duplicate_claims_caught_up``); stripped before assignment.
RECOVERED_TAG = "streamassign.recovered"
#: Client tag: ``1`` when the worker's (non-global) tables keep state on disk (RocksDB), ``0``
#: when they keep none across a restart: whether a claim it makes without an offset sum on a
#: task that is stateful now is a stateless claim it made when the task was stateless
#: (``_return_restarted``); stripped before assignment.
DISK_TABLES_TAG = "streamassign.disk-tables"
_OWN_TAGS = (CAPACITY_TAG, CHANGELOGS_TAG, GLOBAL_CHANGELOGS_TAG, RECOVERED_TAG, DISK_TABLES_TAG)

#: The largest capacity (weight) a worker may report: a Faust worker is one event loop, so a
#: weight past this is no real machine; the leader ignores larger claims (logged).
MAX_CAPACITY = 16


def decode_member(member: str, topics: Any, user_data: bytes | None) -> MemberSubscription:
    """A member as the leader sees it; user data it cannot read (garbage, a format this version
    cannot read) makes a member without history (logged), never an error."""
    try:
        info: SubscriptionInfo | None = SubscriptionInfo.decode(user_data or b"")
    except ProtocolError as exc:
        log.warning("member %s: %s; treating it as having no history", member, exc)
        info = None
    return MemberSubscription(topics, info)  # topics: aiokafka's list of names


def decode_members(
    metadata: Mapping[str, tuple[Iterable[str], bytes | None]],
    partition_counts: Mapping[str, int],
    *,
    changelog_topics: Iterable[str] = (),
    global_changelog_topics: Iterable[str] = (),
    copartition_groups: Sequence[Sequence[str]] = (),
    own_topics: Iterable[str] | None = None,
) -> dict[str, MemberSubscription]:
    """Every member (member -> (topics, user data)) as the leader sees it, with nothing built
    from claims on tasks that do not exist: first each member's identity and tags (its claims
    are read but none is made), which say what is a table and so how topics group into tasks;
    then its claims, clipped to those tasks, and a member declaring more than
    ``member_claim_limit`` of them has no history (``streams.decode_subscriptions``, logged).
    So a 37-byte subscription claiming ``2**20`` tasks costs its bytes, not the tasks."""
    identities = {}
    for member, (topics, data) in metadata.items():
        try:
            info: SubscriptionInfo | None = SubscriptionInfo.decode(data or b"", task_counts={})
        except ProtocolError:
            info = None  # decode_subscriptions says why
        identities[member] = MemberSubscription(topics, info)
    changelogs, _ = trusted_tables(
        identities, changelog_topics, global_changelog_topics, own_topics, report=False
    )
    subscriptions = {m: s.topics for m, s in identities.items()}
    try:
        topology = faust_topology(subscriptions, partition_counts, copartition_groups, changelogs)
    except TopologyError:
        return identities  # assign_faust reports it; no claim can matter then
    return decode_subscriptions(
        topology, partition_counts, {m: (t, d or b"") for m, (t, d) in metadata.items()}
    )


def check_copartition_groups(groups: object) -> tuple[tuple[str, ...], ...]:
    """``groups`` as tuples; ``TopologyTypeError`` (a ``TypeError``) unless it is a list of
    lists of topic names (a flat list of names would otherwise be read as groups of single
    characters)."""
    if isinstance(groups, (str, bytes)) or not isinstance(groups, Iterable):
        raise TopologyTypeError(
            f"copartition_groups must be a list of lists of topics, not {groups!r}"
        )
    out = []
    for group in groups:
        if isinstance(group, (str, bytes)) or not isinstance(group, Iterable):
            raise TopologyTypeError(
                f"copartition_groups entry {group!r} is not a list of topics "
                '(write [["a", "b"]], not ["a", "b"])'
            )
        topics = tuple(group)
        if not all(isinstance(t, str) for t in topics):
            raise TopologyTypeError(f"copartition_groups entry {group!r} holds a non-str topic")
        out.append(topics)
    return tuple(out)


def faust_topology(
    subscriptions: Mapping[str, Iterable[str]],
    partition_counts: Mapping[str, int],
    copartition_groups: Sequence[Sequence[str]] = (),
    changelog_topics: Iterable[str] = (),
) -> Topology:
    """The app's groups as a topology (one subtopology per co-partitioned group).

    Without declared groups: Faust's rule (equal count and subscribers). With them: each declared
    group is one subtopology and every other subscribed topic one of its own; ids are stable
    hashes of (count, topics). Faust's rule is used instead, logged, rather than stopping the
    group, when declared groups' counts differ or when a subscribed ``changelog_topics`` topic
    (pass only non-global tables' changelogs) is in no declared group with a non-changelog topic:
    such a table's partitions would drift apart from its source's. ``TypeError`` for groups that
    are not lists of topic names.
    """
    declared_groups = check_copartition_groups(copartition_groups)
    if not declared_groups:
        return faust_style_topology(subscriptions, partition_counts)
    subscribed = {t for topics in subscriptions.values() for t in topics if t in partition_counts}
    changelogs = frozenset(changelog_topics)
    groups: list[tuple[str, ...]] = []
    seen: set[str] = set()
    for declared in declared_groups:
        group = tuple(sorted(set(declared) & subscribed - seen))
        if group:
            groups.append(group)
            seen.update(group)
    anchored = {t for g in groups if set(g) - changelogs for t in g}
    if stray := sorted(changelogs & subscribed - anchored):
        log.error(
            "changelogs %s are in no declared co-partition group with a source topic; "
            "grouping Faust-style instead",
            stray,
        )
        return faust_style_topology(subscriptions, partition_counts)
    groups.extend((t,) for t in sorted(subscribed - seen))
    subtopologies = _hashed_subtopologies(groups, partition_counts)
    if subtopologies is None:
        return faust_style_topology(subscriptions, partition_counts)
    return Topology(subtopologies, [g for g in groups if len(g) > 1])


def _hashed_subtopologies(
    groups: Sequence[tuple[str, ...]], partition_counts: Mapping[str, int]
) -> list[Subtopology] | None:
    """One subtopology per group, with a stable hashed id; None (logged) when a group's
    partition counts differ."""
    ids: set[int] = set()
    subtopologies = []
    for group in groups:
        counts = {partition_counts[t] for t in group}
        if len(counts) > 1:
            log.error(
                "declared co-partition group %s has unequal partition counts %s; "
                "grouping Faust-style instead",
                group,
                sorted(counts),
            )
            return None
        sid = _hashed_id(counts.pop(), group)
        while sid in ids:
            sid = _next_hashed_id(sid)
        ids.add(sid)
        subtopologies.append(Subtopology(sid, group))
    return subtopologies


def host_key(endpoint: str, process: str, duplicated: bool) -> str:
    """Host map key of a process: its endpoint, or ``endpoint#process`` when another process
    announces the same endpoint (Faust's URL-keyed maps would overwrite one of them)."""
    return f"{endpoint}#{process}" if duplicated else endpoint


def assign_faust(
    members: Mapping[str, MemberSubscription],
    partition_counts: Mapping[str, int],
    *,
    num_standby_replicas: int = 0,
    changelog_topics: Iterable[str] = (),
    global_changelog_topics: Iterable[str] = (),
    partitioner_changelog_topics: Iterable[str] = (),
    copartition_groups: Sequence[Sequence[str]] = (),
    leader_version: int = LATEST_VERSION,
    own_topics: Iterable[str] | None = None,
    required_topics: Iterable[str] = (),
    missing_topics_level: int = logging.WARNING,
    topology_errors: Repeats | None = None,
    shared_ids: Repeats | None = None,
    lone_changelogs: Repeats | None = None,
) -> dict[str, MemberAssignment]:
    """Assignment of every member (see the module docstring). Never raises for bad members or
    topics: unreadable members have no history. A subscribed table changelog or
    ``required_topics`` topic (the app's own: repartition, leader topics) without metadata makes
    ``INCOMPLETE_SOURCE_TOPIC_METADATA`` for every member, nothing assigned: its group cannot be
    built without it. Other topics without metadata are left out. Topics without metadata are
    logged at ``missing_topics_level`` (the assignor passes DEBUG for a set it logged before).
    ``topology_errors``: the error this leader logged last when the topics cannot be grouped
    (the assignor keeps one): the same again is logged at DEBUG, not ERROR (members retry every
    1 to 30 s), and one INFO line says when they group again; None: every one at ERROR.
    ``shared_ids``, ``lone_changelogs``: what this leader logged last at WARNING, each logged
    once (None: at every rebalance): process ids announced with several URLs (a copied state
    directory; each URL is then a worker of its own, ``streams.process_keys``), and table
    changelogs no topic of their partition count is read beside (``_warn_lone_changelogs``),
    but ``partitioner_changelog_topics`` (the app's ``use_partitioner`` tables)."""
    if not members:
        return {}
    version = common_version(members, leader_version)
    changelogs, globals_ = trusted_tables(
        members, changelog_topics, global_changelog_topics, own_topics
    )
    subscriptions = {m: s.topics for m, s in members.items()}
    empty = AssignmentInfo(version=version, common_version=version)
    incomplete = _incomplete(members, empty)
    required = changelogs | globals_ | frozenset(required_topics)
    if _waiting_for_metadata(subscriptions, partition_counts, required, missing_topics_level):
        return incomplete
    grouped = _group_topics(
        subscriptions, partition_counts, copartition_groups, changelogs, topology_errors
    )
    if grouped is None:
        return incomplete
    topology, tasks = grouped
    unchecked = globals_ | frozenset(partitioner_changelog_topics)
    _warn_lone_changelogs(subscriptions, partition_counts, changelogs, unchecked, lone_changelogs)
    result = {m: MemberAssignment((), empty) for m in members}
    # The rebalance's budget (logged per member); no hand-back from a copied state directory.
    members = without_copied_claims(bounded_claims(members, tasks))
    plan = _FaustRuns.plan(
        topology, tasks, members, changelogs, globals_, partition_counts, shared_ids
    )
    per_member, per_process = plan.assign(StickyTaskAssignor(num_standby_replicas))
    result.update(plan.member_assignments(per_member, per_process, version))
    return result


def _incomplete(members: Iterable[str], empty: AssignmentInfo) -> dict[str, MemberAssignment]:
    """Every member's answer while a topic its group needs has no metadata: nothing assigned,
    ``INCOMPLETE_SOURCE_TOPIC_METADATA``."""
    failed = attrs.evolve(empty, error_code=ErrorCode.INCOMPLETE_SOURCE_TOPIC_METADATA)
    return {m: MemberAssignment((), failed) for m in members}


def _group_topics(
    subscriptions: Mapping[str, frozenset[str]],
    partition_counts: Mapping[str, int],
    copartition_groups: Sequence[Sequence[str]],
    changelogs: frozenset[str],
    logged: Repeats | None,
) -> tuple[Topology, dict[TaskId, frozenset[TopicPartition]]] | None:
    """The app's topology and tasks; None when the topics cannot be grouped (logged at ERROR,
    at DEBUG when it is the error ``logged`` last; one INFO line when they group again)."""
    try:
        topology = faust_topology(subscriptions, partition_counts, copartition_groups, changelogs)
        tasks = PartitionGrouper().group(topology, partition_counts)
    except TopologyError as exc:
        log_error_once(
            log, logged, exc, "cannot group the subscribed topics: %s; assigning nothing"
        )
        return None
    if logged is not None and logged.ended():
        log.info("the subscribed topics group now: assigning tasks again")
    return topology, tasks


def _warn_lone_changelogs(
    subscriptions: Mapping[str, frozenset[str]],
    partition_counts: Mapping[str, int],
    changelogs: frozenset[str],
    unchecked: frozenset[str],
    logged: Repeats | None,
) -> None:
    """One WARNING per table changelog whose partition count no other topic its subscribers
    read has: partitions added to the table's source topic, most likely. Faust grouping by
    count then parts the table from its source, and Faust's tables raise
    ``PartitionsMismatch`` on every write (``PartitionAssignor`` makes them check again at
    each assignment). The same situation again at DEBUG; one INFO line once none is left.
    None for ``unchecked``, whose count is their own by design: global tables (every worker
    holds them whole) and ``use_partitioner`` tables (the producer's partitioner places their
    keys, and Faust never checks their count).

    Only said, never refused: a table fed by no topic of its count (written from a timer, a
    table never written yet) is legal, and the leader cannot tell a table's source topic
    from the others (Faust records it only when the table is first written)."""
    lone = _lone_changelogs(subscriptions, partition_counts, changelogs, unchecked)
    previous = logged.reported if logged is not None else None
    if not lone:
        if logged is not None and logged.ended():
            log.info("every table changelog has a topic of its partition count to read again")
        return
    seen = previous if isinstance(previous, frozenset) else frozenset()
    if logged is not None:
        logged.changed(lone)
    for changelog, count, others in sorted(lone):
        log.log(
            logging.DEBUG if (changelog, count, others) in seen else logging.WARNING,
            "table changelog %s has %d partitions, but no topic the workers reading it consume "
            "has %d (%s): were partitions added to the table's source topic? Its writes fail "
            "with Faust's PartitionsMismatch until the counts match: stop the app, then grow "
            "the changelog (and any repartition topic) to the source's count, or reset the "
            'app (docs/faust.md, "Adding partitions to a topic on a live fleet"); repeats '
            "logged at DEBUG",
            changelog,
            count,
            count,
            ", ".join(f"{t} {n}" for t, n in others),
        )


#: How the name of Faust's leader topic ends (``<app>-__assignor-__leader``, one partition):
#: every worker reads it and no table is fed from it.
_FAUST_LEADER_TOPIC = "-__assignor-__leader"


def _lone_changelogs(
    subscriptions: Mapping[str, frozenset[str]],
    partition_counts: Mapping[str, int],
    changelogs: frozenset[str],
    unchecked: frozenset[str],
) -> frozenset[tuple[str, int, tuple[tuple[str, int], ...]]]:
    """``(changelog, its count, (topic, count) of the other topics its readers consume)`` for
    each table changelog (not in ``unchecked``) whose count none of those topics has."""
    lone = set()
    for changelog in changelogs - unchecked:
        count = partition_counts.get(changelog)
        readers = [topics for topics in subscriptions.values() if changelog in topics]
        sources = {
            t: partition_counts[t]
            for topics in readers
            for t in topics
            if t in partition_counts
            and t not in changelogs | unchecked
            and not t.endswith(_FAUST_LEADER_TOPIC)
        }
        if count is not None and sources and count not in sources.values():
            lone.add((changelog, count, tuple(sorted(sources.items()))))
    return frozenset(lone)


def _waiting_for_metadata(
    subscriptions: Mapping[str, frozenset[str]],
    partition_counts: Mapping[str, int],
    required: frozenset[str],
    level: int,
) -> bool:
    """Whether a ``required`` subscribed topic has no metadata yet (logged at ``level``, as are
    other subscribed topics without metadata, which are left out)."""
    unsized = {t for topics in subscriptions.values() for t in topics} - partition_counts.keys()
    if waiting := sorted(unsized & required):
        log.log(
            level,
            "no metadata for %s (not created yet, or not authorized to read?): assigning "
            "nothing until they exist",
            waiting,
        )
        return True
    if unsized:
        log.log(
            level,
            "no metadata for subscribed topics %s (not created yet, or not authorized to read?)",
            sorted(unsized),
        )
    return False


@attrs.frozen
class _FaustRuns:
    """The sticky runs of one assignment: one per set of members eligible for the same groups
    (subtopologies), over clients by process."""

    tasks: Mapping[TaskId, frozenset[TopicPartition]]
    members: Mapping[str, MemberSubscription]
    sub_topics: dict[int, tuple[str, ...]]
    stateful_subs: set[int]
    changelogs: frozenset[str]
    globals_: frozenset[str]
    partition_counts: Mapping[str, int]
    clients: list[ClientState]
    by_process: dict[str, list[str]]
    endpoints: dict[str, str | None]
    runs: dict[frozenset[str], list[int]]

    @classmethod
    def plan(
        cls,
        topology: Topology,
        tasks: Mapping[TaskId, frozenset[TopicPartition]],
        members: Mapping[str, MemberSubscription],
        changelogs: frozenset[str],
        globals_: frozenset[str],
        partition_counts: Mapping[str, int],
        shared_ids: Repeats | None = None,
    ) -> _FaustRuns:
        sub_topics = {s: topology.subtopology(s).source_topics for s in topology.subtopology_ids}
        # Groups made only of global changelogs are no work to share: every subscriber gets them
        # all.
        assignable = {s for s, topics in sub_topics.items() if not set(topics) <= globals_}
        stateful_subs = {s for s, topics in sub_topics.items() if changelogs & set(topics)}
        clients, by_process, endpoints = client_states(members, shared_ids=shared_ids)
        sums = _offset_sums(members, by_process)  # a merge per process: once a round
        clients = _with_capacities(
            _duplicate_claims_caught_up(
                _return_restarted(
                    clients,
                    members,
                    by_process,
                    sums,
                    stateful_subs,
                    _disk_tables(members, by_process),
                ),
                sums,
                _recovered(members, by_process),
            )
        )
        runs = _group_runs(members, sub_topics, assignable)
        return cls(
            tasks,
            members,
            sub_topics,
            stateful_subs,
            changelogs,
            globals_,
            partition_counts,
            clients,
            by_process,
            endpoints,
            runs,
        )

    def member_assignments(
        self,
        per_member: Mapping[str, ClientAssignment],
        per_process: Mapping[str, ClientAssignment],
        version: int,
    ) -> dict[str, MemberAssignment]:
        """Each member's assignment: its partitions, tasks, the host maps and the dictionary."""
        active_by_host, standby_by_host = _faust_host_maps(per_process, self.endpoints)
        counts = self.partition_counts
        dictionary = {s: {t: counts[t] for t in topics} for s, topics in self.sub_topics.items()}
        result = {}
        for m, got in per_member.items():
            subscribed_globals = self.globals_ & self.members[m].topics
            partitions = _member_partitions(
                got, self.tasks, self.changelogs, subscribed_globals, counts
            )
            result[m] = MemberAssignment(
                tuple(sorted(partitions)),
                AssignmentInfo(
                    active=got.active,
                    standby=got.standby,
                    warmup=got.warmup if version >= 2 else frozenset(),
                    active_by_host=active_by_host,
                    standby_by_host=standby_by_host,
                    topics=dictionary,
                    version=version,
                    common_version=version,
                ),
            )
        return result

    def assign(
        self, assignor: StickyTaskAssignor
    ) -> tuple[dict[str, ClientAssignment], dict[str, ClientAssignment]]:
        """Each member's and each process's tasks, over all runs."""
        per_member: dict[str, ClientAssignment] = {m: ClientAssignment() for m in self.members}
        per_process: dict[str, ClientAssignment] = {}
        for eligible, subs in sorted(self.runs.items(), key=lambda kv: sorted(kv[1])):
            self._assign_run(assignor, eligible, subs, per_member, per_process)
        return per_member, per_process

    def _assign_run(
        self,
        assignor: StickyTaskAssignor,
        eligible: frozenset[str],
        subs: list[int],
        per_member: dict[str, ClientAssignment],
        per_process: dict[str, ClientAssignment],
    ) -> None:
        """One sticky run over the groups ``subs``, added to ``per_member`` and ``per_process``."""
        wanted = set(subs)
        run_tasks = [t for t in self.tasks if t.subtopology in wanted]
        task_set = frozenset(run_tasks)
        run_clients = [
            _restrict(c, task_set)
            for c in self.clients
            if any(m in eligible for m in self.by_process[c.process_id])
        ]
        stateful = [t for t in run_tasks if t.subtopology in self.stateful_subs]
        log.debug("sticky run over groups %s: %s", sorted(subs), run_clients)
        for key, got in assignor.assign(run_tasks, run_clients, stateful).items():
            per_process[key] = _union(per_process.get(key, ClientAssignment()), got)
            threads = [m for m in self.by_process[key] if m in eligible]
            previous = {
                m: sub.previous_active & task_set
                for m in threads
                if (sub := self.members[m].info) is not None
            }
            for m, part in distribute_to_threads(got, threads, previous, stateful).items():
                per_member[m] = _union(per_member[m], part)


def _group_runs(
    members: Mapping[str, MemberSubscription],
    sub_topics: Mapping[int, tuple[str, ...]],
    assignable: set[int],
) -> dict[frozenset[str], list[int]]:
    """Assignable groups by the set of members eligible for them (one sticky run each); logs
    members eligible for none."""
    runs: dict[frozenset[str], list[int]] = {}
    for s in sorted(assignable):
        eligible = frozenset(m for m, sub in members.items() if set(sub_topics[s]) <= sub.topics)
        if not eligible:
            continue  # partition_counts name a topic nobody reads any more
        runs.setdefault(eligible, []).append(s)
    mismatched = sorted(m for m in members if not any(m in e for e in runs)) if runs else []
    for m in mismatched:
        log.warning("member %s subscribes to no assignable group (another app version?)", m)
    return runs


def _faust_host_maps(
    per_process: Mapping[str, ClientAssignment], endpoints: Mapping[str, str | None]
) -> tuple[dict[str, frozenset[TaskId]], dict[str, frozenset[TaskId]]]:
    """Active and standby tasks by host key (``host_key``), for processes with an endpoint."""
    active_by_host: dict[str, frozenset[TaskId]] = {}
    standby_by_host: dict[str, frozenset[TaskId]] = {}
    named = Counter(e for e in endpoints.values() if e)
    for key, got in sorted(per_process.items()):
        endpoint = endpoints[key]
        if endpoint:
            hk = host_key(endpoint, key, named[endpoint] > 1)
            active_by_host[hk] = got.active
            standby_by_host[hk] = got.standby | got.warmup
    return active_by_host, standby_by_host


def _member_partitions(
    got: ClientAssignment,
    tasks: Mapping[TaskId, frozenset[TopicPartition]],
    changelogs: frozenset[str],
    subscribed_globals: frozenset[str],
    partition_counts: Mapping[str, int],
) -> set[TopicPartition]:
    """A member's partitions: its actives' sources, its standbys' and warmups' changelogs, and
    every partition of the global changelogs it subscribes to."""
    partitions = {tp for t in got.active for tp in tasks[t]}
    partitions.update(
        tp for t in got.standby | got.warmup for tp in tasks[t] if tp.topic in changelogs
    )
    for topic in sorted(subscribed_globals):
        if topic in partition_counts:
            partitions.update(TopicPartition(topic, p) for p in range(partition_counts[topic]))
    return partitions


def _union(a: ClientAssignment, b: ClientAssignment) -> ClientAssignment:
    return ClientAssignment(a.active | b.active, a.standby | b.standby, a.warmup | b.warmup)


def _restrict(client: ClientState, tasks: frozenset[TaskId]) -> ClientState:
    """``client`` as one sticky run sees it: only that run's tasks."""
    return attrs.evolve(
        client,
        prev_active=client.prev_active & tasks,
        prev_standby=client.prev_standby & tasks,
        lags={t: lag for t, lag in client.lags.items() if t in tasks},
    )


def _return_restarted(
    clients: list[ClientState],
    members: Mapping[str, MemberSubscription],
    by_process: Mapping[str, Sequence[str]],
    sums: Mapping[str, Mapping[TaskId, int]],
    stateful_subs: Collection[int] = (),
    disk_tables: Collection[str] = (),
) -> list[ClientState]:
    """A restarted worker (it runs nothing yet) is the previous owner again of the tasks it ran
    before it stopped and has no local state of (stateless tasks, in-memory tables); the worker
    that took them over meanwhile becomes a warm holder. Tasks it reports on-disk state for
    follow ``client_states``' rule instead (they return when that state is caught up); so do
    RocksDB tables it has nothing readable of on disk, which the member reports at offset 0
    (``PartitionAssignor._held_offset_sum``), not as stateless. ``sums``: each
    process's offset sums (``_offset_sums``).

    Nor does a task of a group that is stateful now (``stateful_subs``) claimed by a process
    with on-disk tables (a member of it announces ``DISK_TABLES_TAG`` 1, in
    ``disk_tables``): such a member reports a stateful task at least at 0, so a claim without
    a sum is one it made when the task was stateless (its saved assignment named the group
    without the table: a source grown past its changelog, then the changelog grown to
    match). Handed back, the task was restored from scratch while warm standbys existed.
    """
    home = stateless_returns(sums, previous_actives(members, by_process))
    home = {
        t: key
        for t, key in home.items()
        if t.subtopology not in stateful_subs or key not in disk_tables
    }
    if not home:
        return clients
    out = []
    for c in clients:
        mine = {t for t, k in home.items() if k == c.process_id}
        taken = {t for t in c.prev_active if t in home and home[t] != c.process_id}
        out.append(
            attrs.evolve(
                c,
                prev_active=(c.prev_active - taken) | mine,
                prev_standby=(c.prev_standby | taken) - mine,
                lags={
                    **{t: lag for t, lag in c.lags.items() if t not in mine},
                    **dict.fromkeys(taken, 0),
                },
            )
        )
    return out


def _duplicate_claims_caught_up(
    clients: list[ClientState],
    sums: Mapping[str, Mapping[TaskId, int]],
    recovered: Mapping[str, bool],
) -> list[ClientState]:
    """A process in its first recovery that reports running a task another process reports
    running too gets a lag of 0 for it. That is a worker whose session expired while it
    restored its first assignment (a scale-out on a loaded group): the group rebalanced
    without it, and it rejoins still reporting that assignment's actives, which interim
    owners now run. With the lag, an interim owner over its quota hands those tasks back to
    it first (the keep step's return of caught-up previous actives) instead of making it
    restore another set (twice the records).

    Only in its first recovery: Faust reports every assigned active as running
    (``LATEST_OFFSET``), restored or not, and restores actives before standbys, so a process
    whose standbys report no progress (every offset sum it reports is 0 or the running mark
    ``LATEST_OFFSET``) is one whose claims are its first restore. A worker with standby
    progress keeps the tie-break's answer: it may have expired while restoring a cold
    takeover, and handing that back to it would make a task some caught-up owner runs cold.
    A worker with no standbys (none configured, or none placed on it) always passes the
    test. That is harmless: it then holds no state the leader could prefer over its claims
    (measured: the same assignments with and without the test there).

    A process that says whether its recovery has completed since it started
    (``RECOVERED_TAG``, in ``recovered``) is judged by that instead: the offset test misread
    a fresh standby of a changelog whose log starts above 0 (retention, a windowed table's
    ``compact,delete``), which Faust tracks at that start - 1, as progress, and the
    rejoined worker would lose its hand-back."""
    claimants = Counter(t for c in clients for t in c.prev_active)
    shared = {t for t, n in claimants.items() if n > 1}
    if not shared:
        return clients
    out = []
    for client in clients:
        claimed = client.prev_active & shared
        if client.process_id in recovered:
            first_recovery = not recovered[client.process_id]
        else:  # an older member: no tag
            first_recovery = not any(s > 0 for s in sums.get(client.process_id, {}).values())
        if claimed and first_recovery:
            client = attrs.evolve(client, lags={**dict.fromkeys(claimed, 0), **client.lags})
        out.append(client)
    return out


def _disk_tables(
    members: Mapping[str, MemberSubscription], by_process: Mapping[str, Sequence[str]]
) -> frozenset[str]:
    """The processes with a member announcing ``DISK_TABLES_TAG`` 1."""
    return frozenset(
        key
        for key, ms in by_process.items()
        if any(
            (info := members[m].info) is not None and info.client_tags.get(DISK_TABLES_TAG) == "1"
            for m in ms
        )
    )


def _recovered(
    members: Mapping[str, MemberSubscription], by_process: Mapping[str, Sequence[str]]
) -> dict[str, bool]:
    """Per process whose members announce ``RECOVERED_TAG``, whether one says its recovery
    has completed since it started."""
    out: dict[str, bool] = {}
    for key, ms in by_process.items():
        said = [
            info.client_tags[RECOVERED_TAG]
            for m in ms
            if (info := members[m].info) is not None and RECOVERED_TAG in info.client_tags
        ]
        if said:
            out[key] = "1" in said
    return out


def _offset_sums(
    members: Mapping[str, MemberSubscription], by_process: Mapping[str, Sequence[str]]
) -> dict[str, dict[TaskId, int]]:
    """Per process with a readable subscription, the offset sums of its members, merged."""
    out: dict[str, dict[TaskId, int]] = {}
    for key, ms in by_process.items():
        reports = [info.offset_sums for m in ms if (info := members[m].info) is not None]
        if reports:
            out[key] = merge_offset_sums(reports)
    return out


def _announced(member: MemberSubscription, tag: str) -> frozenset[str]:
    """The topics ``member`` announces under ``tag``."""
    if member.info is None:
        return frozenset()
    return frozenset(t for t in member.info.client_tags.get(tag, "").split(",") if t)


def trusted_tables(
    members: Mapping[str, MemberSubscription],
    changelog_topics: Iterable[str] = (),
    global_changelog_topics: Iterable[str] = (),
    own_topics: Iterable[str] | None = None,
    *,
    report: bool = True,
) -> tuple[frozenset[str], frozenset[str]]:
    """``(changelogs, global changelogs)`` the leader acts on: its own app's, plus what members
    announce where the leader can check it. An announced topic counts only when the leader's
    app does not read it (``own_topics``; ``None``: unknown) and every member subscribing to it
    announces it the same way (so it is a table of another version of the app, and no single
    member can make everyone read a source topic whole, or place standbys of it); anything
    else is ignored (logged unless ``report`` is false). ``changelog_topics`` may include the
    global ones."""
    own_globals = frozenset(global_changelog_topics)
    own_changelogs = frozenset(changelog_topics) - own_globals
    own = frozenset(own_topics) if own_topics is not None else frozenset()
    kinds = {
        m: {
            **dict.fromkeys(_announced(sub, CHANGELOGS_TAG), CHANGELOGS_TAG),
            **dict.fromkeys(_announced(sub, GLOBAL_CHANGELOGS_TAG), GLOBAL_CHANGELOGS_TAG),
        }
        for m, sub in members.items()
    }
    accepted: dict[str, set[str]] = {CHANGELOGS_TAG: set(), GLOBAL_CHANGELOGS_TAG: set()}
    refused: dict[str, list[str]] = {}
    for topic in sorted({t for announced in kinds.values() for t in announced}):
        if topic in own_changelogs or topic in own_globals:
            continue  # the leader's own app decides
        said = {kinds[m].get(topic) for m, sub in members.items() if topic in sub.topics}
        if not said:
            continue  # nobody reads it: nothing to decide
        kind = said.pop() if len(said) == 1 else None
        if topic in own:
            refused.setdefault("the leader's app reads them as plain topics", []).append(topic)
        elif kind is None:
            refused.setdefault("not every member reading them announces them so", []).append(topic)
        else:
            accepted[kind].add(topic)
    for reason, topics in sorted(refused.items()) if report else ():
        log.warning("ignoring announced changelog topics %s: %s", topics, reason)
    globals_ = own_globals | accepted[GLOBAL_CHANGELOGS_TAG]
    return own_changelogs | accepted[CHANGELOGS_TAG], globals_


def parse_capacity(raw: str) -> int | None:
    """A reported capacity: a whole number from 1 to ``MAX_CAPACITY``, else ``None``."""
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if 1 <= value <= MAX_CAPACITY else None


def _with_capacities(clients: list[ClientState]) -> list[ClientState]:
    """Capacity = the weight a process reports (``CAPACITY_TAG``, 1 to ``MAX_CAPACITY``), else
    its consumer count (anything else is logged and ignored: the leader cannot check a weight,
    so one member must not claim nearly all the work); the adapter's own tags are removed
    (they are no placement tags)."""
    out = []
    for c in clients:
        tags = {k: v for k, v in c.tags.items() if k not in _OWN_TAGS}
        raw = c.tags.get(CAPACITY_TAG)
        capacity = c.capacity
        if raw is not None:
            reported = parse_capacity(raw)
            if reported is None:
                log.warning(
                    "process %s reports capacity %r (not a whole number from 1 to %d); using %d",
                    c.process_id,
                    raw[:40],
                    MAX_CAPACITY,
                    c.capacity,
                )
            else:
                capacity = reported
        out.append(attrs.evolve(c, capacity=capacity, tags=tags))
    return out
