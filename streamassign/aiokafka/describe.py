"""Describe a live group: every member's subscription and assignment, decoded (``streamassign
describe``).

DescribeGroups returns, for a stable group, each member's metadata and assignment bytes of the
protocol the coordinator chose (outside ``Stable`` the bytes are not read: Kafka 4.3 returns
members' previous bytes with protocol "" during a rebalance). Both are Kafka's ConsumerProtocol
(topics / partitions plus user data); the user data is what this module decodes, per protocol
family:

- **streams** — ``ProcessHost`` (``PROTOCOL_NAME``) and the Faust drop-in assignor
  (``"streamassign-faust"``): ``SubscriptionInfo`` / ``AssignmentInfo``, every version.
- **faust** — Faust's own assignor: JSON ``ClientMetadata`` (subscription) and zlib-compressed
  JSON ``ClientMetadata`` (assignment); read as JSON, so Faust is never imported.
- **consumer** — ``GroupAssignor`` (``"streamassign-<name>"``): ``MemberData`` /
  ``AssignmentData``; any other protocol (aiokafka's ``range``, ``roundrobin``...) is read as
  plain ConsumerProtocol, partitions only.

Bytes that cannot be read make a member ``undecodable`` with the reason, never an exception.
The decoding and the summaries are pure functions of bytes (``describe_bytes``); only
``fetch_group`` and ``follow`` talk to a broker.

Tasks: a streams task is ``subtopology_partition``; a Faust (own assignor) task is
``topicgroup_partition`` with Faust's topic group numbers; for consumer groups, ``t_p`` is
partition ``p`` of the ``t``-th subscribed topic in name order (``GroupView.tasks`` maps every
task to its partitions). Generations: DescribeGroups does not return the group's generation;
``MemberView.generation`` is the consumer assignors' own count from the assignment user data,
``None`` for the other protocols.
"""

from __future__ import annotations

import asyncio
import enum
import reprlib
import time
import zlib
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

import attrs
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    TopicAuthorizationFailedError,
    for_code,
)

from .. import TaskId, TopicPartition
from ..assignment import ClientAssignment, ClientState
from ..consumer.userdata import AssignmentData, MemberData
from ..eligibility import (
    GroupEligibility,
    MemberReading,
    group_eligibility,
    member_ineligible_subtopologies,
)
from ..errors import GroupDescribeError, ProtocolError, UserDataError
from ..explain import STABLE, ClientView, ProcessMembers, local_state
from ..files import loads_json
from ..metrics import AssignmentMetrics, evaluate, violations
from ..protocol import LATEST_OFFSET, AssignmentInfo, SubscriptionInfo
from ..streams import (
    FAUST_PROTOCOL_NAME,
    SHARED_ID_REMEDY,
    SharedProcessId,
    copied_claimants,
    process_id_of_key,
    process_keys,
)
from ..text import counted
from ..versions import (
    ROLLING_DEPLOY_DOC,
    announced_sources,
    sources_fingerprint,
    topology_version,
)
from .bootstrap import (
    CERTIFICATE,
    CLOSED,
    HOSTNAME,
    MECHANISM,
    NOT_SASL,
    REFUSED,
    RESET,
    TLS,
    ConnectFailure,
    ConnectFailures,
)
from .consumer import ASSIGNORS
from .metadata import LEADER_NOT_AVAILABLE, UNKNOWN_TOPIC, topic_metadata
from .streams import PROTOCOL_NAME
from .wire import assigned_partitions, subscribed_topics

#: ``streamassign.faust.leader.CAPACITY_TAG``, spelt out (as ``FAUST_PROTOCOL_NAME`` is in the
#: core): importing ``streamassign.faust`` imports Faust, which describing a group must not
#: need. A unit test pins them to the originals.
FAUST_CAPACITY_TAG = "streamassign.capacity"
#: ``streamassign.faust.leader.CHANGELOGS_TAG`` and ``GLOBAL_CHANGELOGS_TAG``, spelt out so.
FAUST_CHANGELOGS_TAG = "streamassign.changelogs"
FAUST_GLOBAL_CHANGELOGS_TAG = "streamassign.global-changelogs"
#: Faust's own assignor (``faust.assignor.PartitionAssignor.name``).
FAUST_OWN_PROTOCOL_NAME = "faust"


#: Faust's assignment JSON is zlib-compressed; inflating more than this is a bomb, not a group.
_MAX_INFLATED = 64 * 1024 * 1024


class Family(enum.StrEnum):
    """The protocol family a group's chosen assignor belongs to."""

    STREAMS = "streams"
    FAUST = "faust"
    CONSUMER = "consumer"


def family_of(protocol: str) -> Family:
    if protocol in (PROTOCOL_NAME, FAUST_PROTOCOL_NAME):
        return Family.STREAMS
    if protocol == FAUST_OWN_PROTOCOL_NAME:
        return Family.FAUST
    return Family.CONSUMER


def _has_member_data(protocol: str) -> bool:
    """Whether the consumer protocol's user data is ``MemberData`` (a ``GroupAssignor``)."""
    return protocol in {f"streamassign-{name}" for name in ASSIGNORS}


@attrs.frozen
class RawMember:
    """One member as DescribeGroups returns it."""

    member_id: str
    client_id: str = ""
    client_host: str = ""
    metadata: bytes = b""
    assignment: bytes = b""


@attrs.frozen
class MemberView:
    """One member, decoded. ``process`` groups members: a streams process id, a Faust worker's
    URL, else the member id. ``undecodable`` says why some bytes could not be read (what could
    be read before that is kept)."""

    member_id: str
    client_id: str
    client_host: str
    process: str
    topics: tuple[str, ...] = ()
    partitions: tuple[TopicPartition, ...] = ()
    active: frozenset[TaskId] = frozenset()
    standby: frozenset[TaskId] = frozenset()
    warmup: frozenset[TaskId] = frozenset()
    #: Streams protocol: per task, ``LATEST_OFFSET`` (running) or the checkpointed changelog sum.
    offset_sums: Mapping[TaskId, int] = attrs.field(factory=dict)
    #: Streams protocol: the actives the member says it ran before it joined, kept across a
    #: restart in its state directory (the leader hands a restarted process these back).
    previous_active: frozenset[TaskId] = frozenset()
    #: A weight the member declares (consumer ``weight``, Faust ``streamassign.capacity``).
    capacity: int | None = None
    endpoint: str | None = None
    rack: str | None = None
    #: ``"sub v2/2 asg v2/2"``: versions and latest supported / common versions of the user data.
    versions: str = ""
    #: Streams protocols: the latest version the subscription says the member supports, and
    #: the assignment's common version (``None``: not read).
    supported_version: int | None = None
    assignment_version: int | None = None
    error: str = "NONE"
    generation: int | None = None
    #: Streams protocol: per subtopology, its source topics and their partition counts.
    topic_dictionary: Mapping[int, Mapping[str, int]] = attrs.field(factory=dict)
    #: Faust's own assignor: topic -> topic group, from the assignment.
    topic_groups: Mapping[str, int] = attrs.field(factory=dict)
    #: Streams protocol 3: per subtopology id of the member's topology, the source topics it
    #: announces (empty: it announces none, protocol 1-2, or unreadably).
    announced: Mapping[int, frozenset[str]] = attrs.field(factory=dict)
    #: The short name of the announced topology, as the group leader's log names its own
    #: (``announced_version``); ``None`` when it announces none.
    topology_version: str | None = None
    #: Why the announcement cannot be read (the leader then reads it as announcing none,
    #: unless the garbage is on ids its topology lacks: ``leader_reading``).
    announcement_error: str | None = None
    #: The announcement as sent: per subtopology id, its topics' places in ``topics``.
    announced_indices: Mapping[int, frozenset[int]] = attrs.field(factory=dict)
    #: The Faust drop-in: the changelogs of the member's app's tables that are not global, as
    #: its client tags announce them (other members: none).
    changelogs: frozenset[str] = frozenset()
    #: The Faust drop-in: the changelogs of the member's app's global tables (read whole by
    #: every worker; Faust-style grouping may put one beside a table changelog of its count).
    global_changelogs: frozenset[str] = frozenset()
    undecodable: str | None = None
    #: ``undecodable`` is the subscription's user data only, and the assignment was read: the
    #: member is a process of its own (its member id) with that assignment, as the group
    #: leader takes a member whose subscription it cannot read (no history, tasks all the same).
    subscription_only: bool = False

    @property
    def assignment(self) -> ClientAssignment:
        return ClientAssignment(self.active, self.standby, self.warmup)

    @property
    def assigned(self) -> bool:
        """Whether the member's assignment is read (its bytes, or all but its subscription's
        user data: ``subscription_only``)."""
        return self.undecodable is None or self.subscription_only


@attrs.frozen
class GroupView:
    """A described group: its members decoded, and every known task with its partitions."""

    group: str
    state: str
    protocol_type: str
    protocol: str
    family: Family
    members: tuple[MemberView, ...]
    tasks: Mapping[TaskId, frozenset[TopicPartition]]
    #: Streams protocols: process ids members announce with different endpoints (a copied
    #: state directory); each endpoint's members are a process of their own
    #: (``streams.process_key``), as the group leader treats them.
    shared_process_ids: tuple[SharedProcessId, ...] = ()
    #: Streams protocols: whether that split depends on whether the leader reads topology
    #: announcements, which is unknown (``announcements_read``): the members are split as a
    #: leader reading them splits them, and ``reading_unknown`` says so.
    split_by_unknown_reading: bool = False
    #: Per subscribed topic no member is assigned a partition of (``unassigned_topics``), its
    #: partition count in the cluster's metadata, which ``fetch_group`` looks up (such a topic
    #: left out does not exist; 0: it exists without a partition leader yet, its count not
    #: listed). None: not looked up (bytes alone, or the lookup failed).
    cluster_partitions: Mapping[str, int] | None = None
    #: Subscribed topics (of those looked up) the principal may not DESCRIBE: the lookup
    #: cannot say whether they exist.
    undescribable_topics: frozenset[str] = frozenset()
    #: ``describe --watch``: why the group could not be described (its state then
    #: :data:`UNAVAILABLE`); None otherwise.
    error: str | None = None
    #: With ``error``: when the group last answered a poll, on ``follow``'s ``clock``
    #: (``time.monotonic()`` unless given: for durations, not a date; None: never).
    answered_at: float | None = None

    @property
    def readable(self) -> bool:
        """Whether members' bytes are the group's assignment: only in state ``Stable``."""
        return self.state == STABLE

    def processes(self) -> dict[str, ClientView]:
        """The assignment per process (``explain``'s input), undecodable members left out.
        Capacity: the largest weight a member declares, else the process's member count."""
        out: dict[str, ClientView] = {}
        for pid, members in self.members_by_process().items():
            declared = [m.capacity for m in members if m.capacity is not None]
            a = [m.assignment for m in members]
            out[pid] = ClientView(
                max(declared) if declared else len(members),
                ClientAssignment(
                    frozenset().union(*(x.active for x in a)),
                    frozenset().union(*(x.standby for x in a)),
                    frozenset().union(*(x.warmup for x in a)),
                ),
            )
        return out

    def local_state(self) -> dict[str, dict[TaskId, int]]:
        """Per process, the tasks it reported state of when it joined (a checkpointed offset
        sum, or ``LATEST_OFFSET``: running then, which ``explain`` counts only when it dates
        from the last rebalance): ``explain``'s ``lags`` (warm or cold landings), as
        ``explain`` reads them from a saved snapshot (``streamassign.explain.local_state``)."""
        by_process = self.members_by_process()
        return local_state((pid, m.offset_sums) for pid, ms in by_process.items() for m in ms)

    def previous_active(self) -> dict[str, frozenset[TaskId]]:
        """Per process, the actives its members said at their last join they ran before (a
        restarted process's, from its state directory): ``explain``'s ``returning``, as
        ``explain`` reads them from a saved snapshot (``Snapshot.previous_active``)."""
        # The leaders ignore a shared id's claims (``streams.copied_claimants``).
        copied = copied_claimants(self.shared_process_ids)
        return {
            pid: frozenset().union(*(m.previous_active for m in ms if m.member_id not in copied))
            for pid, ms in self.members_by_process().items()
        }

    def endpoints(self) -> dict[str, str]:
        """Each process's endpoint where it has one other than its id (a Faust worker's URL
        is its process already)."""
        out = {}
        for pid, members in self.members_by_process().items():
            endpoint = next((m.endpoint for m in members if m.endpoint), None)
            if endpoint and endpoint != pid:
                out[pid] = endpoint
        return out

    def process_members(self) -> ProcessMembers:
        """Per process, its members' ids and endpoints: what ``explain.named_as_after`` matches
        to another view's (``describe --watch``), as ``explain`` reads them from a saved
        snapshot (``Snapshot.process_members``)."""
        return {
            pid: frozenset((m.member_id, m.endpoint or "") for m in ms)
            for pid, ms in self.members_by_process().items()
        }

    def leader_topics(self) -> dict[int, frozenset[str]] | None:
        """The leader's topology: per subtopology id, its source topics. Every streams
        assignment carries the whole of it (``AssignmentInfo.topics``); ``None`` without one
        (an error assignment, or a ``ProcessHost`` leader of a group without endpoints)."""
        if self.family != Family.STREAMS:
            return None
        for m in self.members:
            if m.assigned and m.topic_dictionary:
                return {sub: frozenset(ts) for sub, ts in m.topic_dictionary.items()}
        return None

    def leader_version(self) -> str | None:
        """The short name the leader's log gives its topology (``announced_version`` of
        ``leader_topics``), when members announce theirs (protocol 3), else ``None``."""
        own = self.leader_topics()
        if own is None or not any(m.announced_indices for m in self.members if m.assigned):
            return None
        return announced_version(own)

    def withheld(self) -> dict[str, frozenset[int]]:
        """Per process, the leader's subtopology ids it gets no task of, as the leader decides
        (empty when the leader's topology is unknown): every id when no member of it may get
        tasks (``blind``), else the ids none of its members that may get tasks may run
        (``eligibility.ineligible_subtopologies``: a member may not run an id whose leader's
        topics it announces not all of, announcements read as the leader reads them:
        ``leader_reading``; a leader below protocol 3 reads none: ``announcements_read``).
        When that is unknown, as a leader reading them (``_eligibility``)."""
        eligible = self._eligibility()
        return {} if eligible is None else dict(eligible.withheld)

    def blind(self) -> list[str]:
        """Processes the leader gives no task at all: none of their members subscribes to
        any source topic of the leader's or, when the leader reads announcements
        (``announcements_read``), announces a topology (the leader's
        ``eligibility.group_eligibility``: such a member cannot run every task). When that is
        unknown, as a leader reading them (``_eligibility``)."""
        eligible = self._eligibility()
        return [] if eligible is None else list(eligible.blind)

    def announcements_read(self) -> bool | None:
        """Whether the leader reads the members' topology announcements: a leader decodes
        subscriptions at its own ``max_version`` and reads none below 3 (a rolling-upgrade pin,
        ``ProcessHost(max_version=2)``). ``None``: unknown (``_leader_reading_known``)."""
        own = self.leader_topics()
        if own is None:
            return None
        return self._leader_reading_known(
            self._eligibility_if(own, True), self._eligibility_if(own, False)
        )

    def reading_unknown(self) -> bool:
        """Whether it is unknown whether the leader reads announcements, and that changes
        which ids it withholds from which processes, or how the members of a shared process
        id are split into processes (``split_by_unknown_reading``); ``withheld`` and the
        split then read as a leader reading them."""
        own = self.leader_topics()
        if own is None:
            return False
        read, unread = self._eligibility_if(own, True), self._eligibility_if(own, False)
        matters = self.split_by_unknown_reading or not _same_withheld(read, unread)
        return matters and self._leader_reading_known(read, unread) is None

    def only_split_unknown(self) -> bool:
        """Whether ``reading_unknown`` holds only through the split of a shared process id:
        both readings withhold the same ids from the same processes."""
        own = self.leader_topics()
        if own is None or not self.reading_unknown():
            return False
        return _same_withheld(self._eligibility_if(own, True), self._eligibility_if(own, False))

    def split_in_doubt(self) -> list[MemberView]:
        """The members a leader reading announcements may give tasks and one reading none may
        not, keyed to an endpoint of a shared process id (``split_by_unknown_reading``): a
        leader reading none keeps them under the bare process id."""
        if not self.split_by_unknown_reading:
            return []
        doubtful = self._may_get_tasks_if(True) - self._may_get_tasks_if(False)
        return [
            m
            for m in self.members
            if m.member_id in doubtful and m.process != process_id_of_key(m.process)
        ]

    def stalled(self) -> dict[str, frozenset[TaskId]]:
        """Per process, the actives it holds that its members' guards refuse: of a leader's
        id whose topics the member announces not all of (``leader_reading``; a leader not
        reading announcements gives them, ``announcements_read``). Those run nowhere."""
        own = self.leader_topics()
        if own is None:
            return {}
        out: dict[str, frozenset[TaskId]] = {}
        for pid, members in self.members_by_process().items():
            for m in members:
                reading = leader_reading(m, own.keys())
                refused = member_ineligible_subtopologies(own, reading)
                tasks = frozenset(t for t in m.active if t.subtopology in refused)
                if tasks:
                    out[pid] = out.get(pid, frozenset()) | tasks
        return out

    def may_get_tasks(self) -> frozenset[str]:
        """The members the leader may give tasks (``eligibility.group_eligibility``), by
        member id: those announcing a topology when it reads announcements
        (``announcements_read``; unknown: as one of protocol 3), or, announcing none,
        subscribing to one of its source topics. Every member when the leader's topology is
        unknown. Unknown, the members may differ from a pinned leader's, which shows only
        where ``reading_unknown`` says so (the processes' ids withheld, or how a shared
        process id is split)."""
        return self._may_get_tasks_if(self.announcements_read() is not False)

    def _may_get_tasks_if(self, announcements: bool) -> frozenset[str]:
        """``may_get_tasks`` for a leader that reads (or not) announcements."""
        own = self.leader_topics()
        if own is None:
            return frozenset(m.member_id for m in self.members)
        return group_eligibility(own, _readings(own, self.members, announcements)).may_get_tasks

    def assignment_version(self) -> int | None:
        """The protocol version the leader assigned at (every member's the same: the lowest
        of the leader's ``max_version`` and the members' latest supported ones)."""
        return (
            max((m.assignment_version or 0 for m in self.members if m.assigned), default=0) or None
        )

    def _leader_reading_known(
        self, read: GroupEligibility, unread: GroupEligibility
    ) -> bool | None:
        """Whether the leader reads announcements, when ``read`` and ``unread`` differ (so it
        matters). Assignments at version 3 or more: it does. Below 3, a member supporting only
        2 may lead (pinned, ``ProcessHost(max_version=2)``, or an older release), reading
        none, or a leader of 3 assigns at 2 for such a member, reading them: the bytes do not
        say which (a leader's own subscription says its ``max_version`` as the latest it
        supports, so a pinned leader is one of the members supporting 2), what it gave may:
        ``_leader_reading_shown``."""
        version = self.assignment_version()
        if version is None:
            return None
        if version >= 3:
            return True
        return self._leader_reading_shown(read)

    def _leader_reading_shown(self, read: GroupEligibility) -> bool | None:
        """Whether the leader reads announcements, from what it gave: an active of an id
        ``read`` withholds from its process (a leader reading them never gives one: it would
        stall, the member's guard refusing it) says it does not. Nothing given can say it
        does: a leader reading none refuses a member only the ids reading a topic it does not
        subscribe to, and a member's announced topics are among its subscribed ones, so one
        reading them refuses it those ids too (``eligibility.group_eligibility``). ``None``:
        no task stalls either way; only which processes may get which ids is unknown."""
        processes = self.processes()
        if any(
            {t.subtopology for t in processes[pid].assignment.active} & ids
            for pid, ids in read.withheld.items()
            if pid in processes
        ):
            return False
        return None

    def _eligibility(self) -> GroupEligibility | None:
        """``withheld`` and ``blind`` as the leader reads announcements; when that is unknown,
        as a leader reading them (as one of protocol 3 does: the usual upgrade runs the new
        leader with old members) decides. Either way then no process holds an active of an id
        its announced version lacks (``_leader_reading_shown``): no task stalls. None: the
        leader's topology is unknown."""
        own = self.leader_topics()
        if own is None:
            return None
        read, unread = self._eligibility_if(own, True), self._eligibility_if(own, False)
        if _same_withheld(read, unread):
            return read
        return unread if self._leader_reading_known(read, unread) is False else read

    def _eligibility_if(
        self, own: Mapping[int, frozenset[str]], announcements: bool
    ) -> GroupEligibility:
        """The leader's eligibility rule over the processes' members, for a leader that reads
        (or not) announcements."""
        members = [m for ms in self.members_by_process().values() for m in ms]
        return group_eligibility(own, _readings(own, members, announcements))

    def decoded_members(self) -> list[MemberView]:
        """The members whose assignment is read (``MemberView.assigned``)."""
        return [m for m in self.members if m.assigned]

    def unassigned_topics(self) -> frozenset[str]:
        """Subscribed topics no member is assigned a partition of; none while a member reports
        an error code (which empties assignments)."""
        decoded = self.decoded_members()
        if any(m.error not in ("", "NONE") for m in decoded):
            return frozenset()
        subscribed = {t for m in decoded for t in m.topics}
        return frozenset(subscribed - {tp.topic for m in decoded for tp in m.partitions})

    def members_by_process(self) -> dict[str, list[MemberView]]:
        """Decoded members with metadata, by process."""
        out: dict[str, list[MemberView]] = {}
        for m in sorted(self.members, key=lambda m: (m.process, m.member_id)):
            # Without metadata (the group is not stable) a member says nothing of its process.
            if m.assigned and m.topics:
                out.setdefault(m.process, []).append(m)
        return out


# -- decoding one member ---------------------------------------------------------------------


@attrs.frozen
class _Outer:
    """A member's ConsumerProtocol structs read: the topics and partitions they name, and the
    user data inside (empty where the bytes are: a member not yet assigned)."""

    topics: tuple[str, ...] = ()
    partitions: tuple[TopicPartition, ...] = ()
    subscription_data: bytes = b""
    assignment_data: bytes = b""


def _consumer_protocol(raw: RawMember) -> _Outer:
    """The outer ConsumerProtocol structs, read. aiokafka's struct decoder raises assorted
    exceptions on garbage, and reads a null topic name or list as ``None``
    (``wire.subscribed_topics``)."""
    outer = _Outer()
    try:
        meta = ConsumerProtocolMemberMetadata.decode(raw.metadata) if raw.metadata else None
    except Exception as exc:  # untrusted bytes into a third-party decoder: any failure
        raise GroupDescribeError(f"subscription: not ConsumerProtocol metadata ({exc!r})") from exc
    try:
        asg = ConsumerProtocolMemberAssignment.decode(raw.assignment) if raw.assignment else None
    except Exception as exc:
        raise GroupDescribeError(f"assignment: not ConsumerProtocol ({exc!r})") from exc
    try:
        if meta is not None:
            topics = tuple(sorted(subscribed_topics(meta)))
            outer = attrs.evolve(outer, topics=topics, subscription_data=meta.user_data or b"")
    except ProtocolError as exc:
        raise GroupDescribeError(f"subscription: {exc}") from exc
    try:
        if asg is not None:
            partitions = tuple(sorted(assigned_partitions(asg)))
            outer = attrs.evolve(outer, partitions=partitions, assignment_data=asg.user_data or b"")
    except ProtocolError as exc:
        raise GroupDescribeError(f"assignment: {exc}") from exc
    return outer


def decode_member(protocol: str, raw: RawMember) -> MemberView:
    """``raw`` decoded as ``protocol`` speaks; never raises (see ``MemberView.undecodable``).
    Unreadable subscription user data does not stop the assignment's: the leader assigns such
    a member tasks all the same (a process of its own, its member id), and so its assignment
    is the group's (``MemberView.subscription_only``)."""
    view = MemberView(raw.member_id, raw.client_id, raw.client_host, raw.member_id)
    try:
        outer = _consumer_protocol(raw)
    except GroupDescribeError as exc:
        return attrs.evolve(view, undecodable=str(exc))
    view = attrs.evolve(view, topics=outer.topics, partitions=outer.partitions)
    family = family_of(protocol)
    unreadable: str | None = None
    if outer.subscription_data or family != Family.CONSUMER:  # a consumer may send none
        try:
            view = _subscription(family, protocol, view, outer.subscription_data)
        except _UNREADABLE as exc:
            unreadable = f"subscription: {_why(exc)}"
    if outer.assignment_data:  # else not assigned yet
        try:
            view = _assignment(family, protocol, view, outer.assignment_data)
        except _UNREADABLE as exc:
            return attrs.evolve(view, undecodable=unreadable or f"assignment: {_why(exc)}")
    if unreadable is None:
        return view
    return attrs.evolve(view, undecodable=unreadable, subscription_only=bool(outer.assignment_data))


#: What decoding members' user data raises on garbage (``KeyError``: a JSON key missing).
_UNREADABLE = (KeyError, ProtocolError, UserDataError, ValueError, TypeError, zlib.error)


def _why(exc: Exception) -> str:
    return f"no {exc} in the JSON" if isinstance(exc, KeyError) else str(exc)


def _subscription(family: Family, protocol: str, view: MemberView, data: bytes) -> MemberView:
    if family == Family.STREAMS:
        info, unreadable = _streams_subscription(data)
        capacity = info.client_tags.get(FAUST_CAPACITY_TAG)
        tagged = {
            tag: frozenset(t for t in info.client_tags.get(tag, "").split(",") if t)
            for tag in (FAUST_CHANGELOGS_TAG, FAUST_GLOBAL_CHANGELOGS_TAG)
        }
        view = attrs.evolve(
            view,
            process=str(info.process_id),
            offset_sums=dict(info.offset_sums),
            previous_active=info.previous_active,
            capacity=int(capacity) if capacity and capacity.isdigit() else None,
            changelogs=tagged[FAUST_CHANGELOGS_TAG] - tagged[FAUST_GLOBAL_CHANGELOGS_TAG],
            global_changelogs=tagged[FAUST_GLOBAL_CHANGELOGS_TAG],
            endpoint=info.endpoint,
            rack=info.rack,
            versions=f"sub v{info.version}/{info.latest_supported_version}",
            supported_version=info.latest_supported_version,
            error=info.error_code.name,
        )
        return _announcement(view, info.subtopology_topic_indices, unreadable)
    if family == Family.FAUST:
        url = _json_object(loads_json(data, ProtocolError, "JSON"), "metadata")["url"]
        if not isinstance(url, str):
            raise ProtocolError(f"url is {type(url).__name__}, not a string")
        return attrs.evolve(view, process=url, endpoint=url)
    if not _has_member_data(protocol):
        return view
    member = MemberData.decode(data, partitions_per_topic={})
    return attrs.evolve(
        view,
        capacity=member.weight,
        versions=f"sub v{member.version}/{member.latest_supported_version}",
    )


def _assignment(family: Family, protocol: str, view: MemberView, data: bytes) -> MemberView:
    prefix = f"{view.versions} " if view.versions else ""
    if family == Family.STREAMS:
        info = AssignmentInfo.decode(data)
        error = info.error_code.name if view.error == "NONE" else view.error
        return attrs.evolve(
            view,
            active=info.active,
            standby=info.standby,
            warmup=info.warmup,
            topic_dictionary=info.topics,
            versions=f"{prefix}asg v{info.version}/{info.common_version}",
            assignment_version=info.common_version,
            error=error,
        )
    if family == Family.FAUST:
        meta = _json_object(loads_json(_inflate(data), ProtocolError, "JSON"), "assignment")
        groups = _json_object(meta.get("topic_groups") or {}, "topic_groups")
        assignment = _json_object(meta["assignment"], "assignment")
        topic_groups = {str(t): _json_id(g, f"group of {t!r}") for t, g in groups.items()}
        active, standby = (
            frozenset(
                TaskId(topic_groups[t], _json_id(p, f"partition of {t!r}"))
                for t, ps in _json_object(assignment[kind], kind).items()
                if t in topic_groups
                for p in ps
            )
            for kind in ("actives", "standbys")
        )
        return attrs.evolve(view, active=active, standby=standby - active, topic_groups=groups)
    if not _has_member_data(protocol):
        return view
    data_ = AssignmentData.decode(data)
    return attrs.evolve(view, error=data_.error_code.name, generation=data_.generation)


def _streams_subscription(data: bytes) -> tuple[SubscriptionInfo, str | None]:
    """The subscription, and why its version 3 tail (the topology announced) cannot be read.
    As the group leader reads such a member (``streams.decode_subscriptions``): its identity
    again without the tail, and without its history (offset sums, previous actives), which the
    leader does not use. Garbage before the tail is ``ProtocolError`` (undecodable)."""
    try:
        return SubscriptionInfo.decode(data), None
    except ProtocolError as exc:
        identity = _before_the_tail(data)
        if identity is None:
            raise
        return identity, str(exc)


def _before_the_tail(data: bytes) -> SubscriptionInfo | None:
    """A version 3+ subscription read without its tail, history dropped (None: not version 3+,
    or garbage before the tail)."""
    try:
        info = SubscriptionInfo.decode(data, max_version=2)
    except ProtocolError:
        return None
    if info.version < 3:
        return None
    return attrs.evolve(info, offset_sums={}, previous_active=frozenset())


def _announcement(
    view: MemberView, indices: Mapping[int, frozenset[int]], unreadable: str | None
) -> MemberView:
    """``view`` with the topology its member announces (``indices`` into its subscribed
    topics, which the ConsumerProtocol metadata carries by name: ``view.topics``), named as
    the group leader names it; an index past the subscription is garbage the leader reads as
    announcing nothing, and so does this."""
    view = attrs.evolve(view, announced_indices=dict(indices))
    try:
        announced = announced_sources(view.topics, indices)
    except ProtocolError as exc:
        return attrs.evolve(view, announcement_error=str(exc))
    if not announced:
        return attrs.evolve(view, announcement_error=unreadable)
    return attrs.evolve(view, announced=announced, topology_version=announced_version(announced))


def _same_withheld(read: GroupEligibility, unread: GroupEligibility) -> bool:
    """Whether two readings withhold the same ids from the same processes: which reading the
    leader makes then changes nothing ``describe`` shows."""
    return (read.withheld, read.blind) == (unread.withheld, unread.blind)


def _readings(
    own: Mapping[int, frozenset[str]], members: Iterable[MemberView], announcements: bool
) -> dict[str, MemberReading]:
    """``members`` as the group leader reads them for ``eligibility.group_eligibility``: their
    topics and, when it reads announcements (``announcements``), their ``leader_reading``."""
    return {
        m.member_id: MemberReading(
            m.process,
            frozenset(m.topics),
            leader_reading(m, own.keys()) if announcements else None,
        )
        for m in members
    }


def leader_reading(
    member: MemberView, leader_ids: Collection[int]
) -> dict[int, frozenset[str]] | None:
    """What a leader whose topology has ``leader_ids`` reads ``member`` to announce: per id of
    its, the source topics (``{}``: only ids it lacks), or ``None`` (announcing none: protocol
    1-2, garbage in the tail, or an index past the subscription). As the leader decodes
    (``protocol._read_topic_indices``): ids it lacks, but the first, are dropped before the
    indices are checked (``versions.announced_sources``)."""
    kept: dict[int, frozenset[int]] = {}
    foreign = False
    for sub, indices in sorted(member.announced_indices.items()):
        if sub in leader_ids or not foreign:
            foreign = foreign or sub not in leader_ids
            kept[sub] = indices
    if not kept:
        return None
    try:
        return announced_sources(member.topics, kept, leader_ids)
    except ProtocolError:
        return None


def announced_version(announced: Mapping[int, Iterable[str]]) -> str:
    """The short name of a topology from its source topics per subtopology id: the name the
    group leader's log line gives its own topology (``versions.topology_version`` of
    ``versions.subtopology_fingerprints``, from the announced topics instead of a
    ``Topology``, which a member's bytes are not; a unit test pins the two together). The
    same name when the member announces every subtopology: a ``ProcessHost`` subscribes to
    every source topic, so it does."""
    fingerprints = {sub: sources_fingerprint(topics) for sub, topics in announced.items()}
    return topology_version(fingerprints)


def _json_id(value: object, what: str) -> int:
    """A group or partition number of Faust's JSON: an int32 >= 0, not a bool, a float or a
    string that ``int()`` would take (``2.5``, ``true``, ``"7"``, ``-3`` are no task's)."""
    if type(value) is not int or not 0 <= value < 2**31:
        raise ProtocolError(f"{what} is {reprlib.repr(value)}, not an int in [0, 2**31)")
    return value


def _json_object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} is {type(value).__name__}, not a JSON object")
    return value


def _inflate(blob: bytes) -> bytes:
    inflater = zlib.decompressobj()
    out = inflater.decompress(blob, _MAX_INFLATED)
    if inflater.unconsumed_tail or not inflater.eof:
        raise ProtocolError(f"compressed JSON truncated or larger than {_MAX_INFLATED} bytes")
    return out


# -- the group ---------------------------------------------------------------------------------


def describe_bytes(
    group: str,
    state: str,
    protocol_type: str,
    protocol: str,
    members: Iterable[RawMember],
    cache: dict[tuple[str, RawMember], MemberView] | None = None,
) -> GroupView:
    """The group as DescribeGroups returned it, every member decoded (pure, never raises);
    outside ``Stable`` only the members' ids and clients (``GroupView.readable``).

    ``cache`` keeps decoded members between calls (``follow``): between rebalances nothing
    changes, and a streams assignment's host section costs about 2 ms per member to read
    (600 tasks), so polling a 400-member group would decode for a second every second."""
    family = family_of(protocol)
    if state != STABLE:
        # Outside Stable the bytes are not the group's assignment: Kafka 4.3 answers a group
        # in PreparingRebalance with each member's previous bytes and protocol "", which read
        # as a consumer group with streams bytes for partitions. Members are named, no more.
        unread = (MemberView(m.member_id, m.client_id, m.client_host, m.member_id) for m in members)
        return GroupView(group, state, protocol_type, protocol, family, tuple(unread), {})
    decoded = []
    fresh: dict[tuple[str, RawMember], MemberView] = {}
    for raw in members:
        key = (protocol, raw)
        view = cache.get(key) if cache is not None else None
        fresh[key] = view if view is not None else decode_member(protocol, raw)
        decoded.append(fresh[key])
    if cache is not None:  # only this round's members: the cache never outgrows the group
        cache.clear()
        cache.update(fresh)
    shared: list[SharedProcessId] = []
    split_in_doubt = False
    if family == Family.CONSUMER:
        decoded, tasks = _consumer_tasks(decoded)
    else:
        if family == Family.STREAMS:
            unsplit = GroupView(group, state, protocol_type, protocol, family, tuple(decoded), {})
            decoded, shared, split_in_doubt = _split_as_the_leader(decoded, unsplit)
        tasks = _task_partitions(decoded, infer_sources=protocol == PROTOCOL_NAME)
    return GroupView(
        group,
        state,
        protocol_type,
        protocol,
        family,
        tuple(decoded),
        tasks,
        shared_process_ids=tuple(shared),
        split_by_unknown_reading=split_in_doubt,
    )


def _split_as_the_leader(
    members: list[MemberView], unsplit: GroupView
) -> tuple[list[MemberView], list[SharedProcessId], bool]:
    """``_split_shared_ids`` over the members the leader may give tasks (``may_get_tasks`` of
    ``unsplit``), and whether a leader reading none of the announcements would split them
    otherwise while it is unknown whether the leader reads them (``announcements_read``): a
    member announcing a topology but subscribing to none of the leader's source topics is
    keyed by its endpoint only by a leader reading them (one reading none leaves it under the
    bare id)."""
    split, shared = _split_shared_ids(members, unsplit.may_get_tasks())
    if unsplit.announcements_read() is not None:
        return split, shared, False
    unread, _ = _split_shared_ids(members, unsplit._may_get_tasks_if(False))
    return split, shared, [m.process for m in unread] != [m.process for m in split]


def _split_shared_ids(
    members: list[MemberView], may_get_tasks: Collection[str]
) -> tuple[list[MemberView], list[SharedProcessId]]:
    """``members`` with the process of each member of a shared process id (announced with
    several endpoints) keyed per endpoint as the leader keys it, and those ids. As the
    leader, over the members that may get tasks only (``may_get_tasks``, member ids): a
    blind member's endpoint makes no clash (``streams.client_states`` of the compatible)."""
    announced = {
        m.member_id: (m.process, m.endpoint)
        for m in members
        if m.undecodable is None and m.topics and m.member_id in may_get_tasks
    }
    keys, shared = process_keys(announced)
    if not shared:
        return members, []
    split = [attrs.evolve(m, process=keys.get(m.member_id, m.process)) for m in members]
    return split, shared


def _consumer_tasks(
    members: list[MemberView],
) -> tuple[list[MemberView], dict[TaskId, frozenset[TopicPartition]]]:
    """Consumer groups have partitions, not tasks: ``t_p`` is partition ``p`` of the ``t``-th
    topic (name order) of all subscriptions and assignments."""
    names = sorted(
        {t for m in members for t in m.topics} | {tp.topic for m in members for tp in m.partitions}
    )
    index = {name: i for i, name in enumerate(names)}
    out = []
    tasks: dict[TaskId, frozenset[TopicPartition]] = {}
    for m in members:
        active = frozenset(TaskId(index[tp.topic], tp.partition) for tp in m.partitions)
        for tp in m.partitions:
            tasks[TaskId(index[tp.topic], tp.partition)] = frozenset((tp,))
        out.append(attrs.evolve(m, active=active) if m.assigned else m)
    return out, dict(sorted(tasks.items()))


def _task_partitions(
    members: Sequence[MemberView], infer_sources: bool = False
) -> dict[TaskId, frozenset[TopicPartition]]:
    """Every task the members' dictionaries (or assignments) name, with its source partitions:
    the streams topic dictionary, or Faust's topic groups over the partitions assigned. A
    ``ProcessHost`` leader sends the dictionary only when some process has an endpoint; with
    ``infer_sources`` the partitions then come from the members' assignments
    (``_source_subtopologies``)."""
    parts: dict[TaskId, set[TopicPartition]] = {}
    if infer_sources and not any(m.topic_dictionary for m in members):
        sources = _source_subtopologies(members)
        for m in members:
            for tp in m.partitions:
                if tp.topic in sources:
                    parts.setdefault(TaskId(sources[tp.topic], tp.partition), set()).add(tp)
    counts = {
        (sub, topic, n)
        for m in members
        for sub, ts in m.topic_dictionary.items()
        for topic, n in ts.items()
    }
    for sub, topic, count in sorted(counts):  # every member has the same dictionary: once each
        for p in range(count):
            parts.setdefault(TaskId(sub, p), set()).add(TopicPartition(topic, p))
    for m in members:
        for tp in m.partitions:
            if tp.topic in m.topic_groups:
                task = TaskId(m.topic_groups[tp.topic], tp.partition)
                parts.setdefault(task, set()).add(tp)
        for t in m.active | m.standby | m.warmup:
            parts.setdefault(t, set())
    return {t: frozenset(parts[t]) for t in sorted(parts)}


def _source_subtopologies(members: Iterable[MemberView]) -> dict[str, int]:
    """Each source topic's subtopology, from assignments alone: a ProcessHost member's
    partitions are exactly its actives' source partitions, so topic ``t`` can belong to
    subtopology ``s`` only if every member holding ``t``-``p`` runs active ``s_p``, and only
    if ``t``'s partitions are ``s``'s task partitions (co-partitioning). Topics left
    ambiguous are left out."""
    candidates: dict[str, set[int]] = {}
    topic_partitions: dict[str, set[int]] = {}
    task_partitions: dict[int, set[int]] = {}
    for m in members:
        running: dict[int, set[int]] = {}
        for t in m.active:
            running.setdefault(t.partition, set()).add(t.subtopology)
            task_partitions.setdefault(t.subtopology, set()).add(t.partition)
        for tp in m.partitions:
            here = running.get(tp.partition, set())
            candidates[tp.topic] = candidates.get(tp.topic, here) & here
            topic_partitions.setdefault(tp.topic, set()).add(tp.partition)
    out = {}
    for topic, subs in candidates.items():
        fits = [s for s in subs if task_partitions[s] == topic_partitions[topic]]
        if len(fits) == 1:
            out[topic] = fits[0]
    return out


# -- quality -----------------------------------------------------------------------------------


@attrs.frozen
class SubtopologyBalance:
    """Actives of one subtopology (consumer groups: one topic) per process."""

    subtopology: int
    tasks: int
    fewest: int
    most: int
    balanced: bool
    #: Processes left out: the leader withholds this id from them (``GroupView.withheld``).
    withheld: int = 0


@attrs.frozen
class GroupQuality:
    """The current assignment scored as ``plan`` scores one (``streamassign.metrics``). Without
    history, moves and takeovers are not measured; ``problems`` lists validity violations."""

    metrics: AssignmentMetrics
    per_subtopology: tuple[SubtopologyBalance, ...]
    num_standby_replicas: int
    stateful: frozenset[TaskId]
    problems: tuple[str, ...]
    #: Standbys on the rack of their task's active (``None``: no process reports a rack).
    standbys_on_active_rack: int | None = None
    #: ``num_standby_replicas`` was not given but inferred (the most standbys any task has):
    #: the configured count is in no member's bytes, so lost standbys can hide.
    standbys_inferred: bool = False
    #: Warmup tasks in flight (HA assignor): actives stay on caught-up processes until the
    #: next probing rebalance, so imbalance until then is by design.
    warmups: int = 0
    #: Doubts that affect no task (printed as ``note:``, not as problems): how the members of
    #: a shared process id are split when whether the leader reads announcements is unknown.
    notes: tuple[str, ...] = ()


def quality(view: GroupView, num_standby_replicas: int | None = None) -> GroupQuality:
    """Balance per subtopology and in total, standby coverage and validity of the current
    assignment. Stateful tasks are the subtopologies with a standby, a warmup or a checkpoint
    anywhere; ``num_standby_replicas`` defaults to the most standbys any task has."""
    processes = view.processes()
    clients = [ClientState(pid, v.capacity or 1) for pid, v in processes.items()]
    assignment = {pid: v.assignment for pid, v in processes.items()}
    tasks = set(view.tasks).union(*(a.active | a.standby | a.warmup for a in assignment.values()))
    copies: dict[TaskId, int] = {}
    for a in assignment.values():
        for t in a.standby:
            copies[t] = copies.get(t, 0) + 1
    held = {t for m in view.members for t, s in m.offset_sums.items() if s != LATEST_OFFSET}
    held |= {t for a in assignment.values() for t in a.standby | a.warmup}
    stateful_subs = {t.subtopology for t in held}
    stateful = frozenset(t for t in tasks if t.subtopology in stateful_subs)
    replicas = (
        max(copies.values(), default=0) if num_standby_replicas is None else num_standby_replicas
    )
    metrics = evaluate(tasks, clients, assignment, replicas, stateful)
    withheld = view.withheld()
    balance = []
    for sub in sorted({t.subtopology for t in tasks}):
        # Over the processes the leader may give this id's tasks (a rolling deploy withholds
        # it from processes of other topology versions): their imbalance is by design.
        eligible = [c for c in clients if sub not in withheld.get(c.process_id, ())]
        own = {t for t in tasks if t.subtopology == sub}
        counts = [len(assignment[c.process_id].active & own) for c in eligible] or [0]
        only = {
            c.process_id: ClientAssignment(assignment[c.process_id].active & own) for c in eligible
        }
        balanced = evaluate(own, eligible, only).active_balanced if eligible else not own
        balance.append(
            SubtopologyBalance(
                sub, len(own), min(counts), max(counts), balanced, len(clients) - len(eligible)
            )
        )
    problems = [
        *_shared_ids(view),
        *_member_errors(view),
        *_topology_versions(view),
        *_unreadable_announcements(view),
        *_unassigned_topics(view),
        *_undescribable_topics(view),
        *_lone_changelogs(view),
        *violations(tasks, clients, assignment, replicas, stateful),
    ]
    return GroupQuality(
        metrics,
        tuple(balance),
        replicas,
        stateful,
        tuple(problems),
        _same_rack(view),
        standbys_inferred=num_standby_replicas is None,
        warmups=sum(len(a.warmup) for a in assignment.values()),
        notes=(_split_doubt(view),) if view.only_split_unknown() else (),
    )


#: What a member's error code means for the operator (``streamassign.errors.ErrorCode``).
_ERROR_MEANING = {
    "INCOMPLETE_SOURCE_TOPIC_METADATA": (
        "source or repartition topics missing or not co-partitioned; the group leader's log "
        "names the topics and counts"
    ),
    "ASSIGNMENT_ERROR": "the leader could not assign; its log says why",
    "SHUTDOWN_REQUESTED": "a member asked the group to shut down",
}


def _lone_changelogs(view: GroupView) -> list[str]:
    """One problem per table changelog (as the Faust drop-in's members announce them: every
    member reading it must, as the leader trusts them) whose task group holds no source
    topic. Faust writes a table's changelog partition p from its source partition p, so the
    two share a task: alone, the changelog's updates come from partitions another process
    may run. The line says what the view shows of why: a topic of the changelog's partition
    count in another group means members subscribe differently (a rolling deploy adding or
    dropping the table); none means a source topic grew (seen live), or a table written by
    key (``use_partitioner``) or outside a stream, which is legal."""
    readers = [m for m in view.members if m.assigned]
    announced = frozenset().union(*(m.changelogs for m in readers))
    changelogs = frozenset(
        topic
        for topic in announced
        if all(topic in m.changelogs for m in readers if topic in m.topics)
    )
    # A global table's changelog of the same count may share the group: no source either.
    globals_ = frozenset().union(*(m.global_changelogs for m in readers))
    groups: dict[int, set[str]] = {}
    partitions_of: dict[str, set[int]] = {}
    for task, partitions in view.tasks.items():
        for tp in partitions:
            groups.setdefault(task.subtopology, set()).add(tp.topic)
            partitions_of.setdefault(tp.topic, set()).add(tp.partition)
    counts = {topic: len(ps) for topic, ps in partitions_of.items()}
    return [
        f"table changelog {topic} is in a task group with no source topic (subtopology {sub}; "
        f"{_why_alone(topic, counts, changelogs | globals_)})"
        for sub, topics in sorted(groups.items())
        if topics & changelogs and topics - globals_ <= changelogs
        for topic in sorted(topics & changelogs)
    ]


def _why_alone(changelog: str, counts: Mapping[str, int], changelogs: frozenset[str]) -> str:
    """What the view shows of why a changelog has no source topic beside it (``changelogs``:
    every changelog, global ones included, which are no source)."""
    count = counts.get(changelog)
    if any(n == count and t not in changelogs for t, n in counts.items()):
        return (
            f"a topic of its {count} partitions is in another group: members subscribe "
            "differently, a rolling deploy adding or dropping the table?"
        )
    return (
        f"no source topic has its {count} partitions: a source topic grew, or the table is "
        "written by key (use_partitioner) or outside a stream?"
    )


def _shared_ids(view: GroupView) -> list[str]:
    """One problem per process id announced with several endpoints: two live processes with
    one copied state directory. A leader before this check merged them into one process
    (routing metadata mapping both processes' tasks to one endpoint)."""
    return [
        f"process id {c.process_id} is announced with {len(c.endpoints)} endpoints "
        f"({', '.join(c.endpoints)}): a copied state directory? {SHARED_ID_REMEDY}"
        for c in view.shared_process_ids
    ]


def _member_errors(view: GroupView) -> list[str]:
    """One problem per error code members report: their assignment is empty for a reason
    (balance and coverage over no tasks would otherwise read as healthy)."""
    by_error: dict[str, set[str]] = {}
    for m in view.members:
        if m.undecodable is None and m.error not in ("", "NONE"):
            by_error.setdefault(m.error, set()).add(m.process)
    return [
        f"{error} reported by {counted(len(pids), 'process', 'processes')} "
        f"({', '.join(sorted(pids)[:3])}{', ...' if len(pids) > 3 else ''})"
        + (f": {_ERROR_MEANING[error]}" if error in _ERROR_MEANING else "")
        for error, pids in sorted(by_error.items())
    ]


def _some(names: Iterable[str]) -> str:
    """Up to three of ``names``, sorted, and ``...`` for more."""
    listed = sorted(set(names))
    return ", ".join(listed[:3]) + (", ..." if len(listed) > 3 else "")


#: How many subtopology ids a problem line lists (a renumbering can differ in hundreds).
_MAX_IDS = 5


def _ids_text(ids: Iterable[int]) -> str:
    """Up to ``_MAX_IDS`` of ``ids``, ascending, and how many more."""
    listed = sorted(set(ids))
    more = len(listed) - _MAX_IDS
    return ", ".join(map(str, listed[:_MAX_IDS])) + (f", ... ({more} more)" if more > 0 else "")


def _topology_versions(view: GroupView) -> list[str]:
    """Problems of a group whose processes run other topology versions than the leader (a
    rolling deploy that reused an id or changed its topics): tasks that run nowhere
    (``_stalled``), and the subtopology ids the leader withholds from processes
    (``_withheld``). Ids that differ without effect (a topic added in a version, an id the
    leader lacks) are no problem. Without the leader's topology (``GroupView.leader_topics``),
    or when whether it reads announcements is unknown and matters: members' differing ids
    (``_differing``), else what a reading leader withholds (``_withheld``), each line with the
    doubt, or the doubt alone. A doubt only on how a shared process id is split is a note
    (``_split_doubt``), not one of these problems."""
    own = view.leader_topics()
    if own is None:
        return _differing(view)
    reads = view.announcements_read()
    stalled = _stalled(view, own, reads)
    if view.only_split_unknown():
        # Which ids are withheld is the same under both readings: those lines stand (the
        # doubt on the split is a note of ``quality``'s).
        return [*stalled, *_withheld(view, own, reads)]
    if view.reading_unknown():
        doubt = (
            f"whether the leader reads topology announcements is unknown (assignments at "
            f"protocol version {view.assignment_version()}, and some member supports only "
            "that: a leader pinned below version 3 reads none: it withholds only the ids "
            "reading a topic a process does not subscribe to)"
        )
        # A member's guard refusing a task is a stall whatever the leader read: said apart.
        doubt += "" if stalled else "; no process holds a task of an id its version lacks"
        # Without members announcing differing ids: what a reading leader withholds, with the
        # doubt; the doubt alone when that is nothing (never left unsaid).
        lines = _differing(view) or _withheld(view, own, reads)
        return [*stalled, *(f"{line}; {doubt}" for line in lines)] if lines else [*stalled, doubt]
    return [*stalled, *_withheld(view, own, reads)]


def _split_doubt(view: GroupView) -> str:
    """The one note when only how a shared process id is split depends on whether the leader
    reads announcements (a doubt, not a problem): the members in doubt, where each reading
    counts them, and whether they hold a task (the split then changes only the processes'
    member counts)."""
    doubtful = view.split_in_doubt()
    if not doubtful:  # not expected: the split differs only through such members
        return (
            "how the members of a shared process id are split into processes depends on "
            "whether the leader reads topology announcements, which is unknown; it settles "
            "once every member supports protocol 3"
        )
    by_key: dict[str, list[str]] = {}
    for m in doubtful:
        by_key.setdefault(m.process, []).append(m.member_id)
    listed = " | ".join(
        f"{', '.join(ms)} of process id {process_id_of_key(key)} at {key.split('#', 1)[1]}"
        for key, ms in sorted(by_key.items())
    )
    holding = any(m.active | m.standby | m.warmup for m in doubtful)
    they, them = ("they", "them") if len(doubtful) > 1 else ("it", "it")
    shown = "; ".join(
        f"a leader reading announcements counts {them} in {key} (shown), one pinned below "
        f"protocol 3 under {process_id_of_key(key)}"
        for key in sorted(by_key)
    )
    return (
        f"{'members' if len(doubtful) > 1 else 'member'} {listed} "
        f"{'announce' if len(doubtful) > 1 else 'announces'} a topology without subscribing "
        f"to any of the leader's source topics: {shown}; which this leader is is unknown "
        f"(assignments at protocol version {view.assignment_version()}, some member supports "
        "only that); "
        + (f"{they} {'hold' if len(doubtful) > 1 else 'holds'} ")
        + ("tasks" if holding else "no task, so no task is affected")
        + "; it settles once every member supports protocol 3"
    )


def _stalled(view: GroupView, own: Mapping[int, frozenset[str]], reads: bool | None) -> list[str]:
    """One problem when processes hold actives of ids their topology version lacks the
    leader's topics of: their guards refuse them, so they run nowhere (a leader that reads no
    announcement gives them: ``GroupView.announcements_read``)."""
    stalled = view.stalled()
    if not stalled:
        return []
    tasks = sorted(set().union(*stalled.values()))
    members = view.members_by_process()
    listed = []
    for pid, held in sorted(stalled.items()):
        version = next((m.topology_version for m in members[pid] if m.topology_version), None)
        listed.append(f"{pid} (version {version or 'unnamed'}): {', '.join(_ids(held))}")
    why = (
        f"the leader (topology version {announced_version(own)}, assigning at protocol version "
        f"{view.assignment_version()}) "
        + ("reads no topology announcement: it " if reads is False else "")
    )
    return [
        f"{counted(len(tasks), 'task')} run nowhere: {why}gives them to processes whose "
        "topology version lacks their topics, and those processes' guards refuse them: "
        + " | ".join(listed[:_MAX_IDS])
        + (f" | ... ({len(listed) - _MAX_IDS} more)" if len(listed) > _MAX_IDS else "")
        + f"; finish the deploy, or run the leader at protocol version 3, see {ROLLING_DEPLOY_DOC}"
    ]


def _withheld(view: GroupView, own: Mapping[int, frozenset[str]], reads: bool | None) -> list[str]:
    """One problem when the leader withholds subtopology ids from processes: the leader's
    version (named from its topology, which every assignment carries), the ids with the
    leader's topics, and per version the processes it withholds which ids from."""
    withheld = view.withheld()
    if not withheld:
        return []
    ids = sorted(set().union(*withheld.values()))
    blind = set(view.blind())
    by_version: dict[str, dict[str, frozenset[int]]] = {}
    members = view.members_by_process()
    none_read = " (the leader reads no announcement)" if reads is False else ""
    for pid, lacking in withheld.items():
        key = "" if pid in blind else _version_key(members[pid], own, none_read)
        by_version.setdefault(key, {})[pid] = lacking
    listed = []
    for key, pids in sorted(by_version.items()):
        lacks = set().union(*pids.values())
        on = f"{counted(len(pids), 'process', 'processes')} ({_some(pids)})"
        listed.append(
            f"{key} on {on} lacks {'ids' if len(lacks) > 1 else 'id'} {_ids_text(lacks)}"
            if key
            else f"{on} announcing none{none_read} and subscribing to none of its source topics "
            + ("gets" if len(pids) == 1 else "get")
            + " no task"
        )
    processes = view.processes()
    # A process holding a task of an id said withheld from it shows the rule misread: then
    # where the tasks run is not claimed.
    held = any(
        {t.subtopology for t in processes[pid].assignment.active} & lacking
        for pid, lacking in withheld.items()
        if pid in processes
    )
    shown = "; ".join(f"{sub} ({', '.join(sorted(own[sub]))})" for sub in ids[:_MAX_IDS])
    more = f"; ... ({len(ids) - _MAX_IDS} more)" if len(ids) > _MAX_IDS else ""
    return [
        f"the leader (topology version {announced_version(own)}) gives no task of subtopology "
        f"{'ids' if len(ids) > 1 else 'id'} {shown}{more} to "
        f"{counted(len(withheld), 'process', 'processes')} that "
        f"{'lacks' if len(withheld) == 1 else 'lack'} its topics of it: "
        + " | ".join(listed)
        + ("" if held else "; those tasks run on the other processes")
        + f", see {ROLLING_DEPLOY_DOC}"
    ]


def _version_key(
    members: Sequence[MemberView], own: Mapping[int, frozenset[str]], none_read: str
) -> str:
    """How ``_withheld`` groups a process that gets some ids: its topology version; read by
    its subscription (announcing none, an older release, or a leader reading no
    announcement, ``none_read``), with the leader's source topics its members do not
    subscribe to, which make the ids it gets none of."""
    version = next((m.topology_version for m in members if m.topology_version), None)
    if version and not none_read:
        return f"version {version}"
    missing = frozenset().union(*own.values()) - frozenset().union(*(m.topics for m in members))
    not_subscribing = f", not subscribing to {', '.join(sorted(missing))}" if missing else ""
    named = f"version {version}{none_read}" if version else "announcing none (an older release?)"
    return named + not_subscribing


def _differing(view: GroupView) -> list[str]:
    """One problem when members announce other source topics for one subtopology id and the
    leader's topology is unknown: the ids, and per topology version its processes and what it
    announces for them. Ids only some versions have (a fresh id) are no difference."""
    announcing = [m for m in view.members if m.undecodable is None and m.topology_version]
    readings: dict[int, set[frozenset[str]]] = {}
    for m in announcing:
        for sub, topics in m.announced.items():
            readings.setdefault(sub, set()).add(topics)
    differing = sorted(sub for sub, topic_sets in readings.items() if len(topic_sets) > 1)
    if not differing:
        return []
    by_version: dict[str, list[MemberView]] = {}
    for m in announcing:
        by_version.setdefault(str(m.topology_version), []).append(m)
    listed = []
    for version, members in sorted(by_version.items()):
        reads = "; ".join(
            f"id {sub} ({', '.join(sorted(members[0].announced[sub]))})"
            for sub in differing[:_MAX_IDS]
            if sub in members[0].announced
        )
        pids = {m.process for m in members}
        listed.append(
            f"version {version} on {counted(len(pids), 'process', 'processes')} "
            f"({_some(pids)}) reads {reads or 'none of them'}"
        )
    plural = len(differing) > 1
    return [
        f"subtopology {'ids' if plural else 'id'} {_ids_text(differing)} "
        f"{'read' if plural else 'reads'} other topics in other topology versions: "
        + " | ".join(listed)
        + "; the leader gives a process no task of such an id unless it announces all the "
        f"leader's topics of it (the leader's log names its version), see {ROLLING_DEPLOY_DOC}"
    ]


def _unreadable_announcements(view: GroupView) -> list[str]:
    """One problem per reason members' announced topologies cannot be read, and how the
    leader reads them: as announcing none (garbage in a version 3 tail costs their history
    too), or, when the garbage is on ids its topology lacks, the rest (``leader_reading``)."""
    own = view.leader_topics()
    by_reason: dict[tuple[str, str], set[str]] = {}
    for m in view.members:
        if m.undecodable is None and m.announcement_error is not None:
            if own is None:
                reading = "a leader reads it as announcing none"
            elif leader_reading(m, own.keys()) is None:
                reading = "the leader reads it as announcing none"
            else:
                reading = "on ids the leader's topology lacks: the leader reads its other ids"
            by_reason.setdefault((m.announcement_error, reading), set()).add(m.process)
    return [
        f"topology announcement unreadable from {counted(len(pids), 'process', 'processes')} "
        f"({_some(pids)}): {reason}; {reading}"
        for (reason, reading), pids in sorted(by_reason.items())
    ]


def _unassigned_topics(view: GroupView) -> list[str]:
    """Subscribed topics no member is assigned a partition of: missing from the cluster (an
    assignor that does not check, such as Faust's own, leaves them out silently) or without
    partitions; or, during a rolling deploy, topics only some members subscribe to that the
    leader's topology does not read (``_unread_by_the_leader``; the leader's topology unknown:
    that some topology versions read only, ``_version_topics``). Whether a topic exists is
    said when the cluster's metadata was read (``GroupView.cluster_partitions``)."""
    unassigned = view.unassigned_topics()  # none under an error code: _member_errors says why
    if not unassigned:
        return []
    decoded = view.decoded_members()
    counts = view.cluster_partitions
    own = view.leader_topics()
    if own is not None:
        # A topic every member subscribes to (the leader too) is one its topology reads.
        by_all = set.intersection(*[set(m.topics) for m in decoded if m.topics] or [set()])
        unread = unassigned - by_all - frozenset().union(*own.values())
        out = _missing_lines(sorted(unassigned - unread), counts)
        return out + (
            [_unread_by_the_leader(decoded, sorted(unread), own, counts)] if unread else []
        )
    of_some_versions = _version_topics(decoded)
    out = _missing_lines(sorted(unassigned - of_some_versions), counts)
    version_only = sorted(unassigned & of_some_versions)
    if version_only:
        asked = "; or missing from the cluster?" if counts is None else ""
        out.append(
            f"{counted(len(version_only), 'subscribed topic')} without a partition assigned to any "
            "member, subscribed by some topology versions only (a leader of another version "
            f"assigns none of them{asked}): {', '.join(version_only)}"
            + _in_the_cluster(version_only, counts)
        )
    return out


def _undescribable_topics(view: GroupView) -> list[str]:
    """The line for subscribed topics without a partition assigned the metadata lookup was
    not authorized to describe, which leaves whether they exist unknown."""
    topics = sorted(view.undescribable_topics)
    if not topics:
        return []
    return [
        f"not authorized to describe {counted(len(topics), 'subscribed topic')} "
        f"({', '.join(topics)}): whether {'it exists' if len(topics) == 1 else 'they exist'} "
        "is not known (the principal needs DESCRIBE on "
        f"{'it' if len(topics) == 1 else 'them'})"
    ]


def _not_authorized(group: str) -> str:
    """The line for a group the principal may not DESCRIBE (Kafka answers the same for a
    group that does not exist, the ACL being on the name)."""
    return (
        f"cannot describe group {group!r}: not authorized (GroupAuthorizationFailedError): the "
        f"principal needs the DESCRIBE ACL on group {group!r}"
    )


def _missing_lines(topics: Sequence[str], counts: Mapping[str, int] | None) -> list[str]:
    """The lines for unassigned topics the leader reads (or any, its topology unknown):
    missing from the cluster, asked when its metadata was not read, else said; and those the
    cluster has (created since the last rebalance?)."""
    if not topics:
        return []
    if counts is None:
        return [
            f"{counted(len(topics), 'subscribed topic')} without a partition assigned to any "
            f"member (missing from the cluster?): {', '.join(topics)}"
        ]
    present, absent = _present_and_absent(topics, counts)
    out = []
    if absent:
        out.append(
            f"{counted(len(absent), 'subscribed topic')} missing from the cluster (no member is "
            f"assigned a partition of {'it' if len(absent) == 1 else 'them'}): {', '.join(absent)}"
        )
    if present:
        out.append(
            f"{counted(len(present), 'subscribed topic')} without a partition assigned to any "
            f"member though the cluster has {'it' if len(present) == 1 else 'them'} (created "
            "since the last rebalance?): "
            + ", ".join(f"{t} ({_partitions_listed(counts[t])})" for t in present)
        )
    return out


def _partitions_listed(count: int) -> str:
    """A topic's partitions as the metadata listed them: none listed is a topic that exists
    without a partition leader yet (LEADER_NOT_AVAILABLE: being created, or its brokers
    down), whose partition count is not known, not a topic of 0 partitions."""
    return counted(count, "partition") if count else "no partition leader yet"


def _present_and_absent(
    topics: Sequence[str], counts: Mapping[str, int]
) -> tuple[list[str], list[str]]:
    """``topics``, in their order, split into those the cluster's metadata (``counts``) has
    and those it lacks."""
    present: list[str] = []
    absent: list[str] = []
    for topic in topics:
        (present if topic in counts else absent).append(topic)
    return present, absent


def _in_the_cluster(topics: Sequence[str], counts: Mapping[str, int] | None) -> str:
    """What the cluster's metadata says of ``topics`` (``GroupView.cluster_partitions``):
    `` (in the cluster: 6 partitions)`` for one, `` (in the cluster: x 6 partitions;
    missing from the cluster: y)`` for more; "" when it was not read."""
    if counts is None:
        return ""
    if len(topics) == 1:
        (topic,) = topics
        if topic in counts:
            return f" (in the cluster: {_partitions_listed(counts[topic])})"
        return " (missing from the cluster)"
    present, lacks = _present_and_absent(topics, counts)
    has = [f"{t} {_partitions_listed(counts[t])}" for t in present]
    parts = [f"in the cluster: {', '.join(has)}"] if has else []
    parts += [f"missing from the cluster: {', '.join(lacks)}"] if lacks else []
    return f" ({'; '.join(parts)})"


def _unread_by_the_leader(
    members: Sequence[MemberView],
    unread: Sequence[str],
    own: Mapping[int, frozenset[str]],
    counts: Mapping[str, int] | None,
) -> str:
    """The line for topics some members subscribe to that the leader's topology does not
    read (in a rolling upgrade, an old leader, not knowing the new version's fresh id, assigns none
    of its topic, which exists): who subscribes, their ids reading them, and whether the
    leader's protocol version is lower (the members not subscribing, the leader among them,
    support a lower protocol version than every subscriber: an older release, or a process
    of this one capped with ``max_version``, which sends the same bytes), so the tasks wait
    for its upgrade or its cap lifted; else another topology version leads (a deploy that
    added, or dropped, them). ``members``: the decoded ones (``GroupView.decoded_members``);
    ``counts``: ``GroupView.cluster_partitions``."""
    topics = frozenset(unread)
    readers = [m for m in members if topics & set(m.topics)]
    others = [m for m in members if m.topics and not topics & set(m.topics)]
    ids = sorted({sub for m in readers for sub, ts in m.announced.items() if ts & topics})
    pids = {m.process for m in readers}
    them = "it" if len(topics) == 1 else "them"
    noun, verb = ("ids", "read") if len(ids) > 1 else ("id", "reads")
    whose = f" whose {noun} {_ids_text(ids)} {verb} {them}" if ids else ""
    head = (
        f"{counted(len(topics), 'subscribed topic')} the leader's topology (version "
        f"{announced_version(own)}) does not read, so no member is assigned a partition of "
        f"{them}: {', '.join(unread)}{_in_the_cluster(unread, counts)}; "
        f"subscribed by {counted(len(pids), 'process', 'processes')} ({_some(pids)}){whose}: "
    )
    theirs = [m.supported_version for m in readers if m.supported_version is not None]
    leader_side = [m.supported_version for m in others if m.supported_version is not None]
    every_known = len(theirs) == len(readers) and len(leader_side) == len(others)
    dropped = f"none will if the leader's is the new version, which dropped {them}"
    if others and every_known and max(leader_side) < min(theirs):
        return head + (
            f"the leader supports protocol version at most {max(leader_side)}, the processes "
            f"subscribing to {them} {min(theirs)} (an older release leads, or one capped with "
            f"max_version): the tasks reading {them} wait until a process subscribing to "
            f"{them} leads (upgrade the leader, or lift its cap; {dropped}), see "
            f"{ROLLING_DEPLOY_DOC}"
        )
    return head + (
        f"the leader runs another topology version (a rolling deploy?): the tasks reading "
        f"{them} wait until a process subscribing to {them} leads ({dropped}), see "
        f"{ROLLING_DEPLOY_DOC}"
    )


def _version_topics(members: Sequence[MemberView]) -> set[str]:
    """The topics that members of some topology versions subscribe to and members of another
    do not (empty unless members announce two or more versions)."""
    by_version: dict[str, set[str]] = {}
    for m in members:
        if m.topology_version is not None:
            by_version.setdefault(m.topology_version, set()).update(m.topics)
    if len(by_version) < 2:
        return set()
    first, *others = by_version.values()
    return first.union(*others) - first.intersection(*others)


def _same_rack(view: GroupView) -> int | None:
    """Standbys sharing their active's rack (a rack loss takes both): the spread rule's score."""
    racks = {
        pid: rack
        for pid, members in view.members_by_process().items()
        for rack in [next((m.rack for m in members if m.rack), None)]
        if rack is not None
    }
    if not racks:
        return None
    processes = view.processes()
    active_rack = {t: racks.get(pid) for pid, v in processes.items() for t in v.assignment.active}
    return sum(
        1
        for pid, v in processes.items()
        for t in v.assignment.standby
        if racks.get(pid) is not None and racks.get(pid) == active_rack.get(t)
    )


# -- JSON --------------------------------------------------------------------------------------


def _ids(tasks: Iterable[TaskId]) -> list[str]:
    return [str(t) for t in sorted(tasks)]


#: Metrics that compare with a previous assignment, which one description does not have.
_HISTORY = frozenset(
    {
        "moves",
        "move_lower_bound",
        "standbys_kept",
        "standbys_dropped",
        "warm_takeovers",
        "cold_takeovers",
    }
)


def to_json(view: GroupView, score: GroupQuality) -> dict[str, Any]:
    """The group for scripts; its ``assignment`` table is what ``explain``/``diff`` read.
    Outside ``Stable``: the group, its state and members (ids, clients), no assignment."""
    if not view.readable:
        return {
            "group": view.group,
            "state": view.state,
            "protocol_type": view.protocol_type,
            "members": [
                {"member_id": m.member_id, "client_id": m.client_id, "client_host": m.client_host}
                for m in view.members
            ],
        }
    processes = view.processes()
    by_process = view.members_by_process()
    return {
        "group": view.group,
        "state": view.state,
        "protocol_type": view.protocol_type,
        "protocol": view.protocol,
        "family": str(view.family),
        "tasks": {
            str(t): sorted([tp.topic, tp.partition] for tp in p) for t, p in view.tasks.items()
        },
        "assignment": {
            pid: {
                "capacity": v.capacity,
                "active": _ids(v.assignment.active),
                "standby": _ids(v.assignment.standby),
                "warmup": _ids(v.assignment.warmup),
                "members": [m.member_id for m in by_process[pid]],
            }
            for pid, v in processes.items()
        },
        # The leader's topology (protocol 3 groups; else null) and what it withholds.
        "leader_topology_version": view.leader_version(),
        # Subscribed topics no member is assigned a partition of, as the cluster has them.
        "cluster_partitions": view.cluster_partitions,
        "members": [_member_json(m) for m in view.members],
        # What explain needs to ignore copied claims as the leaders do (``copied_claimants``).
        "shared_process_ids": [
            {
                "process_id": c.process_id,
                "endpoints": list(c.endpoints),
                "members": list(c.member_ids),
            }
            for c in view.shared_process_ids
        ],
        "quality": _quality_json(view, score),
    }


def _quality_json(view: GroupView, score: GroupQuality) -> dict[str, Any]:
    """The ``quality`` part of :func:`to_json`."""
    return {
        **{k: v for k, v in attrs.asdict(score.metrics).items() if k not in _HISTORY},
        "standby_coverage": score.metrics.standby_coverage,
        "num_standby_replicas": score.num_standby_replicas,
        "num_standby_replicas_inferred": score.standbys_inferred,
        "warmups": score.warmups,
        "standbys_on_active_rack": score.standbys_on_active_rack,
        "balanced_per_subtopology": {str(b.subtopology): b.balanced for b in score.per_subtopology},
        "withheld_subtopologies": {
            pid: sorted(ids) for pid, ids in sorted(view.withheld().items())
        },
        "problems": list(score.problems),
        "notes": list(score.notes),
    }


def _member_json(m: MemberView) -> dict[str, Any]:
    return {
        "member_id": m.member_id,
        "client_id": m.client_id,
        "client_host": m.client_host,
        "process": m.process if m.assigned else None,
        "topics": list(m.topics),
        "partitions": [[tp.topic, tp.partition] for tp in m.partitions],
        "active": _ids(m.active),
        "standby": _ids(m.standby),
        "warmup": _ids(m.warmup),
        "offset_sums": {str(t): s for t, s in sorted(m.offset_sums.items())},
        "previous_active": _ids(m.previous_active),
        "capacity": m.capacity,
        "endpoint": m.endpoint,
        "rack": m.rack,
        "versions": m.versions,
        "error": m.error,
        "generation": m.generation,
        "topology_version": m.topology_version,
        "announced_sources": {str(s): sorted(t) for s, t in sorted(m.announced.items())},
        "announcement_error": m.announcement_error,
        "undecodable": m.undecodable,
    }


# -- the broker --------------------------------------------------------------------------------


@attrs.frozen
class Connection:
    """How to reach the cluster: aiokafka's admin client settings."""

    bootstrap: str
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str = "PLAIN"
    sasl_username: str | None = None
    sasl_password: str | None = attrs.field(default=None, repr=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    timeout_s: float = 10.0

    def admin_client(self) -> Any:
        from aiokafka.admin import AIOKafkaAdminClient
        from aiokafka.helpers import create_ssl_context

        ssl_context = None
        if "SSL" in self.security_protocol:
            ssl_context = create_ssl_context(
                cafile=self.ssl_cafile, certfile=self.ssl_certfile, keyfile=self.ssl_keyfile
            )
        return AIOKafkaAdminClient(
            bootstrap_servers=self.bootstrap,
            request_timeout_ms=int(self.timeout_s * 1000),
            security_protocol=self.security_protocol,
            ssl_context=ssl_context,
            sasl_mechanism=self.sasl_mechanism,
            sasl_plain_username=self.sasl_username,
            sasl_plain_password=self.sasl_password,
        )


#: DescribeGroups error codes that mean "no such group" (Kafka answers an unknown group with
#: state Dead and no error, or GROUP_ID_NOT_FOUND from v6).
_GROUP_ID_NOT_FOUND = 69


class _Admin:
    """An admin client started within the connection's timeout; errors are one line."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.client: Any = None

    async def __aenter__(self) -> _Admin:
        try:
            # Inside the try: aiokafka checks the security settings here (SASL without
            # credentials, a CA file that holds no certificate), plain ValueError / SSLError.
            self.client = self.connection.admin_client()
        except Exception as exc:
            raise GroupDescribeError(
                f"cannot set up a client for {self.connection.bootstrap}: {_reason(exc)}"
            ) from exc
        connection = self.connection
        try:
            with ConnectFailures(connection.sasl_mechanism) as failures:
                await asyncio.wait_for(self.client.start(), connection.timeout_s)
        except Exception as exc:
            await self.client.close()
            why = _unreachable(exc, failures.reason(), connection)
            raise GroupDescribeError(f"cannot reach {connection.bootstrap}: {why}") from exc
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()

    async def describe(
        self, group: str, cache: dict[tuple[str, RawMember], MemberView] | None = None
    ) -> GroupView:
        entry = await self._group_entry(group)
        if entry["error_code"] == _GROUP_ID_NOT_FOUND or entry["state"] == "Dead":
            raise GroupDescribeError(missing_group(group, await self._listed_types(group)))
        if entry["error_code"] == GroupAuthorizationFailedError.errno:
            raise GroupDescribeError(_not_authorized(group))
        if entry["error_code"]:
            name = for_code(entry["error_code"]).__name__
            raise GroupDescribeError(_not_described(group, name))
        members = [
            RawMember(
                m["member_id"],
                m["client_id"],
                m["client_host"],
                bytes(m["member_metadata"] or b""),
                bytes(m["member_assignment"] or b""),
            )
            for m in entry["members"]
        ]
        view = describe_bytes(
            group, entry["state"], entry["protocol_type"], entry["protocol"], members, cache
        )
        unassigned = view.unassigned_topics()
        if not unassigned:
            return view
        counts, undescribable = await self._partition_counts(unassigned)
        return attrs.evolve(view, cluster_partitions=counts, undescribable_topics=undescribable)

    async def _partition_counts(
        self, topics: Iterable[str]
    ) -> tuple[dict[str, int] | None, frozenset[str]]:
        """Per topic of ``topics`` the cluster has, its partition count (one without a
        leader yet exists all the same); None when the metadata cannot be read (best effort:
        the problem lines then ask). And the topics the principal may not DESCRIBE (which
        leave the counts unknown too). Asked without creating a topic (``metadata``): aiokafka's
        ``describe_topics`` asks with auto-creation on, and a broker with
        ``auto.create.topics.enable=true`` (Kafka's default) would create the missing topic
        describe is about to call missing; a broker that cannot take the flag is not asked."""
        try:
            # Built inside the try too: it raises when the broker cannot take a request that
            # carries the flag (a lower version would create the topics).
            listed = await asyncio.wait_for(
                topic_metadata(self.client, sorted(topics)), self.connection.timeout_s
            )
        except Exception:  # only to word the problem lines better
            return None, frozenset()
        denied = frozenset(
            t["topic"] for t in listed if t["error_code"] == TopicAuthorizationFailedError.errno
        )
        # Another error (not authorized to describe it...) says nothing of whether it exists.
        if any(t["error_code"] not in (0, LEADER_NOT_AVAILABLE, UNKNOWN_TOPIC) for t in listed):
            return None, denied
        return {
            t["topic"]: len(t["partitions"]) for t in listed if t["error_code"] != UNKNOWN_TOPIC
        }, denied

    async def _group_entry(self, group: str) -> dict[str, Any]:
        """The group's DescribeGroups entry. An error that asking again may mend (the group's
        coordinator restarting or moving: its broker not ready, not the coordinator any more,
        loading the group) is asked again until the connection's timeout: after a kill -9
        of the coordinator's broker of a 3-broker cluster Kafka moved the group in about 9 s."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + self.connection.timeout_s
        pause, last, asks = _ASK_AGAIN_FIRST, "", 0
        while True:
            asks += 1
            try:
                async with asyncio.timeout_at(deadline):
                    (response,) = await self.client.describe_consumer_groups([group])
            except GroupAuthorizationFailedError as exc:  # from FindCoordinator
                raise GroupDescribeError(_not_authorized(group)) from exc
            except TimeoutError as exc:
                why = _asked_again(last, asks, loop.time() - start) if last else "timed out"
                raise GroupDescribeError(_not_described(group, why)) from exc
            except Exception as exc:
                if not getattr(exc, "retriable", False):
                    raise GroupDescribeError(_not_described(group, _reason(exc))) from exc
                last = _reason(exc)  # aiokafka's errors name their type
            else:
                (entry,) = response.to_object()["groups"]
                code = entry["error_code"]
                if not code or not for_code(code).retriable:
                    return dict(entry)
                last = for_code(code).__name__
            if loop.time() >= deadline:
                why = _asked_again(last, asks, loop.time() - start)
                raise GroupDescribeError(_not_described(group, why))
            await asyncio.sleep(min(pause, deadline - loop.time()))
            pause = min(pause * 2, _ASK_AGAIN_LONGEST)

    async def _listed_types(self, group: str) -> set[str]:
        """The protocol types ListGroups lists ``group`` with (none: it does not exist, or
        the listing failed, which then says no more than DescribeGroups did)."""
        try:
            listed = await asyncio.wait_for(
                self.client.list_consumer_groups(), self.connection.timeout_s
            )
        except Exception:  # best effort: only to word the error better
            return set()
        return {str(protocol_type) for name, protocol_type in listed if name == group}


#: What a group ListGroups lists but DescribeGroups calls Dead is, by its protocol type, and
#: Kafka's tool that reads it.
_NOT_CLASSIC = {
    "consumer": ("uses the new consumer protocol (KIP-848)", "kafka-consumer-groups.sh"),
    "streams": ("uses the streams rebalance protocol (KIP-1071)", "kafka-streams-groups.sh"),
    "share": ("is a share group (KIP-932)", "kafka-share-groups.sh"),
}


def missing_group(group: str, listed_types: Iterable[str]) -> str:
    """Why DescribeGroups found no ``group`` (state Dead), given the protocol types ListGroups
    lists it with: Kafka 4 answers Dead for a group that is not a classic group, which exists
    all the same (DescribeGroups reads classic groups only)."""
    types = sorted(set(listed_types))
    if not types:
        return f"group {group!r} does not exist"
    what, tool = _NOT_CLASSIC.get(
        types[0], (f"is listed with protocol type {types[0]!r}", "kafka-consumer-groups.sh")
    )
    return (
        f"group {group!r} {what}, not the classic protocol: describe reads classic groups only "
        f"({tool} --describe reads this one)"
    )


#: Per kind of failed connection, what to check, in describe's option names.
_CONNECT_HINTS = {
    MECHANISM: " (--sasl-mechanism)",
    CERTIFICATE: " (is --ssl-cafile the broker's CA?)",
    HOSTNAME: " (the broker's certificate does not name the --bootstrap host)",
    TLS: " (a PLAINTEXT port asked with TLS? --security-protocol)",
    REFUSED: " (no broker listening there?)",
}


def _unreachable(exc: BaseException, failure: ConnectFailure | None, connection: Connection) -> str:
    """Why the client could not start: the last failed connection aiokafka logged, with
    what to check (aiokafka's own error says only "Unable to bootstrap"), else ``exc``."""
    if failure is None:
        return _reason(exc)
    protocol = connection.security_protocol
    if failure.kind == CERTIFICATE and connection.ssl_cafile is None:
        return f"{failure.text} (no --ssl-cafile: the system's CAs do not trust it)"
    if failure.kind == CLOSED:
        asked = (
            "a TLS or SASL port asked with PLAINTEXT?"
            if protocol == "PLAINTEXT"
            else (f"is the port's listener {protocol}? --security-protocol")
        )
        return f"{failure.text} ({asked})"
    if failure.kind == NOT_SASL:
        listener = protocol.removeprefix("SASL_")
        return f"{failure.text} (is the port's listener {listener}? --security-protocol)"
    if failure.kind == RESET and "SSL" in protocol:
        # Not proof of a port without TLS: a broker over max.connections.per.ip, a
        # middlebox or a broker going down resets a TLS hello too.
        return (
            f"{failure.text} (a port without TLS asked with {protocol}? --security-protocol; "
            "or the broker refusing more connections from this address)"
        )
    return failure.text + _CONNECT_HINTS.get(failure.kind, "")


#: Pauses between DescribeGroups asked again (``_Admin._group_entry``), doubling, seconds.
_ASK_AGAIN_FIRST = 0.2
_ASK_AGAIN_LONGEST = 1.0


def _not_described(group: str, why: str) -> str:
    return f"cannot describe group {group!r}: {why}"


def _asked_again(last: str, asks: int, seconds: float) -> str:
    """Why a group asked again until the timeout was not described: the last error."""
    return (
        f"{last} (asked {asks} times over {seconds:.1f} s: the group's coordinator restarting "
        "or moving, or its address unreachable?)"
    )


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__


async def fetch_group(connection: Connection, group: str) -> GroupView:
    """Describe ``group`` once; ``GroupDescribeError`` (one line) if it cannot be."""
    async with _Admin(connection) as admin:
        return await admin.describe(group)


@attrs.frozen
class _Shown:
    """What ``follow`` compares of successive views: a change in any is a view to yield."""

    state: str
    processes: Mapping[str, ClientView]
    #: Each member's process and topology version: a process restarted on another version
    #: can keep its tasks.
    versions: frozenset[tuple[str, str | None]]
    #: The looked-up partition counts (``GroupView.cluster_partitions``); None: not looked up.
    cluster: frozenset[tuple[str, int]] | None

    @classmethod
    def of(cls, view: GroupView, last: _Shown | None) -> _Shown:
        """What is shown of ``view``, ``last`` the view yielded before: a failed metadata
        lookup keeps ``last``'s counts while a topic is still unassigned (a transient failure
        is not a change)."""
        counts = view.cluster_partitions
        cluster: frozenset[tuple[str, int]] | None
        if counts is not None:
            cluster = frozenset(counts.items())
        else:
            cluster = last.cluster if last is not None and view.unassigned_topics() else None
        versions = frozenset((m.process, m.topology_version) for m in view.members)
        return cls(view.state, view.processes(), versions, cluster)


#: ``describe --watch``'s state of a group it could not describe (``GroupView.error`` says why).
UNAVAILABLE = "unavailable"


async def _plain_reason(connection: Connection, failed: GroupDescribeError) -> str:
    """Why a group that was described no longer is, as a one-shot ``describe`` says it: a
    client started afresh names the failed connection ("connection refused") where the
    long-lived one's requests fail with aiokafka's ``NodeNotReadyError``. ``failed``'s own
    text when a fresh client reaches the cluster (the coordinator moving, the group gone)."""
    try:
        async with _Admin(connection):
            pass
    except GroupDescribeError as exc:
        return str(exc)
    return str(failed)


async def follow(
    connection: Connection,
    group: str,
    interval_s: float = 1.0,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[GroupView]:
    """Poll ``group`` every ``interval_s`` and yield each view whose state, assignment,
    processes' topology versions or looked-up topic metadata differ from the last one yielded
    (the first view too: a process restarted on another version can keep its tasks; a topic
    created while still unassigned changes only the metadata, and the view said it missing).
    A failed metadata lookup keeps the last one (a transient failure is not a change).
    Members' bytes are only read for a stable group, so a rebalance shows as a state change,
    then the new assignment. A failure after the first view is a view without members in
    state :data:`UNAVAILABLE` whose ``error`` says why (``answered_at``: when the group last
    answered a poll, read on ``clock``), yielded once until the group answers again."""
    last: _Shown | None = None
    cache: dict[tuple[str, RawMember], MemberView] = {}
    answered_at: float | None = None
    async with _Admin(connection) as admin:
        while True:
            try:
                view = await admin.describe(group, cache)
                answered_at = clock()
            except GroupDescribeError as exc:
                if last is None:
                    raise  # a wrong name or an unreachable group: say so at once
                # The group went away (every member left) or its coordinator was away past
                # --timeout: a state to show once (the reason's text changes at each poll, as
                # it counts the asks), then keep following.
                why = (
                    str(exc) if last.state == UNAVAILABLE else await _plain_reason(connection, exc)
                )
                view = GroupView(
                    group,
                    UNAVAILABLE,
                    "",
                    "",
                    Family.CONSUMER,
                    (),
                    {},
                    error=why,
                    answered_at=answered_at,
                )
            shown = _Shown.of(view, last)
            if shown != last:
                last = shown
                yield view
            await asyncio.sleep(interval_s)
