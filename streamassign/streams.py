"""The group leader's work in the streams protocol, as a pure function (no aiokafka).

``assign_streams`` does what Kafka Streams' StreamsPartitionAssignor does around its task
assignor: group the members by process id (capacity = its consumers), turn reported offset sums
into previous actives, local state and lags, run the partition grouper and the sticky task
assignor, spread each process's tasks over its consumers, map tasks back to partitions and fill
the host maps. It never assigns a member a topic it did not subscribe to, answers at the highest
protocol version every member supports, and turns topology trouble (missing topics, broken
co-partitioning) into an error code for every member instead of an exception.

With ``high_availability=True`` the high-availability assignor (``streamassign.ha``) replaces the
sticky one: actives move only onto caught-up state, warmups go to their targets, and while any
active is held back every member's ``next_rebalance_ms`` is set to now plus the probing interval,
so the group rebalances again once the warmups had time to catch up. A leader that keeps a
``ProbingMemory`` across its rebalances offers its last plan to the next one
(``HighAvailabilityTaskAssignor.plan(..., last_plan=...)``), whose target is carried over only
when the members report exactly the actives that plan gave them: a probing round right after
it.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence

import attrs

from ._ids import TaskId, TopicPartition
from .assignment import ClientAssignment, ClientState
from .eligibility import (
    MemberReading,
    group_eligibility,
    member_ineligible_subtopologies,
    move_to_eligible_clients,
    subscribed_ineligible_subtopologies,
)
from .errors import AssignmentInputError, ErrorCode, TopologyError
from .grouper import PartitionGrouper, resolve_partition_counts, task_counts
from .ha import HighAvailabilityPlan, HighAvailabilityTaskAssignor
from .protocol import (
    LATEST_OFFSET,
    LATEST_VERSION,
    MAX_TASK_IDS,
    MIN_VERSION,
    NEVER,
    AnnouncementMemo,
    AssignmentInfo,
    ProtocolError,
    SubscriptionInfo,
    running_tasks,
)
from .repeats import Repeats, log_error_once
from .sticky import StickyTaskAssignor
from .threads import distribute_to_threads
from .topology import Topology
from .versions import (
    ROLLING_DEPLOY_DOC,
    announced_sources,
    subtopology_fingerprints,
    topology_version,
)

log = logging.getLogger("streamassign.streams")

_INCOMPLETE = ErrorCode.INCOMPLETE_SOURCE_TOPIC_METADATA

#: Kafka Streams' ``acceptable.recovery.lag`` default: state this close counts as caught up.
ACCEPTABLE_RECOVERY_LAG = 10_000

#: The Faust drop-in assignor's protocol name (``streamassign.faust.PROTOCOL_NAME`` is this one:
#: defined here, as importing ``streamassign.faust`` imports Faust): its leader also hands back
#: stateless tasks (:func:`stateless_returns`).
FAUST_PROTOCOL_NAME = "streamassign-faust"

#: Previous actives on tasks that do not exist that a member may claim besides one per task
#: (below): room for what a topology change or a deleted topic left behind.
CLAIM_SLACK = 1024


def _topic_names(topics: Iterable[str]) -> frozenset[str]:
    return frozenset(topics)


@attrs.frozen
class MemberSubscription:
    """A member as the leader sees it: its topics, and its user data if it could be read."""

    topics: frozenset[str] = attrs.field(converter=_topic_names)
    info: SubscriptionInfo | None = None
    #: What it announces (protocol version 3) as the leader reads it, resolved once per round
    #: (``_resolved``: every use of it would otherwise pay for the member's whole tail again);
    #: None until then.
    announced: Announced | None = attrs.field(default=None, eq=False, repr=False)


@attrs.frozen
class Announced:
    """A member's announcement (protocol version 3) resolved against one leader's topology."""

    #: The leader's subtopology ids the resolution is for (another topology: resolve again).
    leader_ids: frozenset[int]
    #: Per id of the leader's that the member announces, its source topics by name (ids only
    #: the member has are dropped: the leader has no task of them). Shared by members that
    #: announce the same (``_Resolutions``): read only.
    sources: Mapping[int, frozenset[str]]
    #: Whether the member announces anything readable (even only ids the leader does not have:
    #: it is then not one announcing nothing, whose subscription is read instead).
    any: bool


@attrs.define
class ProbingMemory:
    """What a group leader keeps of its last high-availability plan, across its rebalances.
    Owned by the leader process (one per process, shared by its consumers) and passed to every
    ``assign_streams`` it runs.

    ``assign_streams`` offers that plan to the next one (``HighAvailabilityTaskAssignor.plan``
    carries its target over only in the probing round right after it: the members run exactly
    the actives it assigned), then remembers the new plan. An assignment made by the sticky
    assignor forgets it; a memory that cannot be used (changed by hand) is logged and the round
    planned afresh. A leader without one (or a new leader) plans afresh, which can take a
    probing round more (docs/ha.md)."""

    #: The last plan this leader made (None: nothing remembered).
    last: HighAvailabilityPlan | None = None

    def plan(
        self,
        ha: HighAvailabilityTaskAssignor,
        tasks: Iterable[TaskId],
        clients: Iterable[ClientState],
        stateful: Iterable[TaskId] | None = None,
        task_racks: Mapping[TaskId, str] | None = None,
    ) -> HighAvailabilityPlan:
        """``ha``'s plan of this input, offered the remembered plan, then remembered in its
        place. A remembered plan the assignor cannot use (changed by hand) is logged and the
        round planned afresh: not worth failing the group over."""
        clients = list(clients)
        plan = None
        if self.last is not None:
            try:
                plan = ha.plan(tasks, clients, stateful, task_racks, last_plan=self.last)
            except AssignmentInputError:
                raise  # this round's input: planning afresh would fail the same way
            except Exception:
                log.exception("the remembered plan could not be used; planning afresh")
        if plan is None:
            plan = ha.plan(tasks, clients, stateful, task_racks)
        self.last = plan
        return plan

    def forget(self) -> None:
        """Keep nothing: the next plan is made afresh."""
        self.last = None


@attrs.frozen
class MemberAssignment:
    """What the leader sends one member: its partitions and the user data."""

    partitions: tuple[TopicPartition, ...]
    info: AssignmentInfo


def common_version(members: Mapping[str, MemberSubscription], leader_version: int) -> int:
    """The highest version every readable member and the leader support."""
    versions = [m.info.latest_supported_version for m in members.values() if m.info is not None]
    return max(MIN_VERSION, min([leader_version, *versions]))


def _failed(
    members: Mapping[str, MemberSubscription], code: ErrorCode, version: int
) -> dict[str, MemberAssignment]:
    info = AssignmentInfo(error_code=code, version=version, common_version=version)
    return {m: MemberAssignment((), info) for m in members}


def member_claim_limit(task_count: int) -> int:
    """Previous actives one member's subscription may declare (counted as written, before
    clipping): one per task of the group plus ``CLAIM_SLACK``, at most ``MAX_TASK_IDS``. A
    consumer ran each task once at most, so a real member never declares more; past it the
    member is treated as having no history. Offset sums have no such limit: each costs at
    least two bytes received (no amplification), and stale local state of an old topology is
    reported forever, so it is only clipped."""
    return min(MAX_TASK_IDS, task_count + CLAIM_SLACK)


def rebalance_claim_limit(task_count: int) -> int:
    """Previous actives (after clipping to tasks that exist) all members of one rebalance may
    claim together: four per task plus ``CLAIM_SLACK``. Every task has one current owner and
    at most one before a restart, so a real group stays near two per task; offset sums need no
    such pool, each costs the leader at least two bytes received."""
    return 4 * task_count + CLAIM_SLACK


def decode_subscriptions(
    topology: Topology,
    partition_counts: Mapping[str, int],
    members: Mapping[str, tuple[Iterable[str], bytes]],
    max_version: int = LATEST_VERSION,
) -> dict[str, MemberSubscription]:
    """The leader's view of ``members`` (member -> (topics, user data)), within the bounds of
    ``bounded_claims`` from the start: each decoded with its claims clipped to the tasks of
    ``topology`` over ``partition_counts`` (no other task is made) and at most
    ``member_claim_limit`` previous actives declared, those kept charged to the rebalance's
    pool as they come. A member past a bound keeps its identity (process id, endpoint, versions,
    error code) without history; unreadable data gives a member without info. Either is
    logged once, with the reason."""
    try:
        counts = task_counts(topology, partition_counts)
    except TopologyError:
        counts = {}  # assign_streams reports the topology; no claim can matter then
    budget = _ClaimBudget(_TaskSpace(counts))
    leader_ids = frozenset(topology.subtopology_ids)
    # Members of one topology version announce the same topology: read and resolved once.
    tails, resolutions = AnnouncementMemo(), _Resolutions()
    decoded: dict[str, MemberSubscription] = {}
    for member in sorted(members):
        topics, data = members[member]
        try:
            info: SubscriptionInfo | None = SubscriptionInfo.decode(
                data,
                max_version,
                task_counts=counts,
                max_previous_active=budget.member_limit,
                announced_ids=leader_ids,
                announcements=tails,
            )
        except ProtocolError as exc:
            info = _identity_only(data, max_version, leader_ids)
            log.warning("member %s: %s; treating it as having no history", member, exc)
        sub = MemberSubscription(topics, info)
        # A member subscribing to no topic was logged by whoever read its metadata (an empty
        # or null topic list, a null name: ``wire.readable_subscriptions``); its
        # announcement's indices then point past nothing, which is no news: not logged again.
        decoded[member] = _resolved(topology, sub, member if sub.topics else None, resolutions)
    # Only members that can get tasks draw on the pool, in member order, as in assign_streams.
    eligible = _may_get_tasks(topology, decoded)
    return {m: budget.admit(m, sub) if m in eligible else sub for m, sub in decoded.items()}


#: One round's resolved announcements: (subscribed topics, announced indices) -> per leader
#: id its source topics by name.
_Resolutions = dict[
    tuple[frozenset[str], tuple[tuple[int, frozenset[int]], ...]], Mapping[int, frozenset[str]]
]


def _resolved(
    topology: Topology,
    sub: MemberSubscription,
    member: str | None = None,
    resolutions: _Resolutions | None = None,
) -> MemberSubscription:
    """``sub`` with its announcement resolved against ``topology`` (``sub`` itself when it
    already is; from ``resolutions`` when a member of this round announced the same). An
    index past its subscription is garbage: logged when ``member`` is named (where decoded),
    and the member is treated as announcing nothing (its indices dropped), whose guard still
    refuses what it cannot run."""
    leader_ids = frozenset(topology.subtopology_ids)
    if sub.announced is not None and sub.announced.leader_ids == leader_ids:
        return sub
    indices = {} if sub.info is None else sub.info.subtopology_topic_indices
    try:
        sources = _memoised_sources(sub.topics, indices, leader_ids, resolutions)
    except ProtocolError as exc:
        if member is not None:
            log.warning("member %s: %s; treating it as announcing no topology", member, exc)
        assert sub.info is not None  # indices come from it
        info = attrs.evolve(sub.info, subtopology_topic_indices={})
        return attrs.evolve(sub, info=info, announced=Announced(leader_ids, {}, False))
    return attrs.evolve(sub, announced=Announced(leader_ids, sources, bool(indices)))


def _memoised_sources(
    topics: frozenset[str],
    indices: Mapping[int, frozenset[int]],
    leader_ids: frozenset[int],
    resolutions: _Resolutions | None,
) -> Mapping[int, frozenset[str]]:
    """``versions.announced_sources``, read from and kept in ``resolutions`` when given (a
    failure is not kept: ``ProtocolError`` again for the next member announcing the same)."""
    if resolutions is None:
        return announced_sources(topics, indices, leader_ids)
    # The key costs a tuple of the member's whole announcement: only with a memo.
    key = (topics, tuple(indices.items()))
    known = resolutions.get(key)
    if known is None:
        known = resolutions[key] = announced_sources(topics, indices, leader_ids)
    return known


def _announcement(topology: Topology, sub: MemberSubscription) -> Announced:
    """What ``sub`` announces of its topology against ``topology``: per id of ``topology``'s
    the source topics (``sources``; empty: none of them, nothing, or garbage), and whether
    it announces a readable topology at all, whatever ids (``any``)."""
    announced = _resolved(topology, sub).announced
    assert announced is not None  # resolved
    return announced


def _may_get_tasks(topology: Topology, members: Mapping[str, MemberSubscription]) -> frozenset[str]:
    """The members the assignor may give tasks (``eligibility.group_eligibility``: those
    announcing their subtopologies' topics or, announcing none, subscribing to one of the
    leader's source topics)."""
    # Each member its own process: which members may get tasks does not depend on how they
    # group into processes (only ``withheld`` and ``blind`` do, and they are not read here).
    readings = {m: _reading(topology, sub, m) for m, sub in members.items()}
    return group_eligibility(_own_sources(topology), readings).may_get_tasks


def _reading(topology: Topology, sub: MemberSubscription, process: str) -> MemberReading:
    """``sub`` as ``eligibility.group_eligibility`` reads it, its tasks going to ``process``:
    its announcement resolved against ``topology`` (None: it announces none)."""
    said = _announcement(topology, sub)
    return MemberReading(process, sub.topics, said.sources if said.any else None)


def _identity_only(
    data: bytes, max_version: int, leader_ids: frozenset[int]
) -> SubscriptionInfo | None:
    """Everything but the history of a member whose claims are refused: nothing is made from
    them (no task exists for the decode), and within ``MAX_TASK_IDS`` only the bytes cost.
    Garbage in the version 3 tail (the topology announced) costs the announcement and the
    history: the identity before it (process id, endpoint) is read again without it."""
    for version in (max_version, min(max_version, 2)):
        try:
            return SubscriptionInfo.decode(data, version, task_counts={}, announced_ids=leader_ids)
        except ProtocolError:
            pass
    return None


def bounded_claims(
    members: Mapping[str, MemberSubscription], tasks: Collection[TaskId]
) -> dict[str, MemberSubscription]:
    """``members`` with their claims clipped to ``tasks`` and within the rebalance's bounds,
    checked in member order: a member claiming more than ``member_claim_limit`` previous
    actives, or whose previous actives (clipped) overflow what is left of
    ``rebalance_claim_limit``, is treated as having no history (logged once). Claims on tasks
    that do not exist are dropped silently: a topology change leaves them behind."""
    budget = _ClaimBudget(tasks)
    return {m: budget.admit(m, members[m]) for m in sorted(members)}


class _TaskSpace(Collection[TaskId]):
    """Tasks ``s_p`` with ``p < counts[s]``, without making them (the grouper's tasks, known
    before it runs)."""

    def __init__(self, counts: Mapping[int, int]) -> None:
        self.counts = counts
        self.size = sum(counts.values())

    def __contains__(self, task: object) -> bool:
        return isinstance(task, TaskId) and 0 <= task.partition < self.counts.get(
            task.subtopology, 0
        )

    def __iter__(self) -> Iterator[TaskId]:
        return (TaskId(s, p) for s, n in self.counts.items() for p in range(n))

    def __len__(self) -> int:
        return self.size


class _ClaimBudget:
    """The bounds of one rebalance: what one member may declare, what is left of the pool."""

    def __init__(self, tasks: Collection[TaskId]) -> None:
        self.tasks = tasks
        self.member_limit = member_claim_limit(len(tasks))
        self.pool = rebalance_claim_limit(len(tasks))

    def admit(self, member: str, sub: MemberSubscription) -> MemberSubscription:
        """``sub`` clipped, or without history past a bound (logged)."""
        info = sub.info
        if info is None or not (info.offset_sums or info.previous_active):
            return sub
        declared = len(info.previous_active)
        if declared > self.member_limit:
            why = (
                f"claims {declared} previous active tasks, more than the {self.member_limit} "
                f"the leader allows a member of a group of {len(self.tasks)} tasks"
            )
            return self._refuse(member, sub, info, why)
        previous = _existing(info.previous_active, self.tasks)
        if len(previous) > self.pool:
            why = (
                f"claims {len(previous)} previous actives, more than the {self.pool} left of "
                f"the rebalance's {rebalance_claim_limit(len(self.tasks))}"
            )
            return self._refuse(member, sub, info, why)
        self.pool -= len(previous)
        sums = {t: s for t, s in info.offset_sums.items() if t in self.tasks}
        if len(sums) == len(info.offset_sums) and len(previous) == len(info.previous_active):
            return sub
        return attrs.evolve(
            sub, info=attrs.evolve(info, offset_sums=sums, previous_active=previous)
        )

    @staticmethod
    def _refuse(
        member: str, sub: MemberSubscription, info: SubscriptionInfo, why: str
    ) -> MemberSubscription:
        log.warning("member %s: %s; treating it as having no history", member, why)
        bare = attrs.evolve(info, offset_sums={}, previous_active=frozenset())
        return attrs.evolve(sub, info=bare)


def _existing(claims: Collection[TaskId], tasks: Collection[TaskId]) -> frozenset[TaskId]:
    """``claims`` that are ``tasks``, iterating the smaller of the two."""
    if len(claims) <= len(tasks):
        return frozenset(t for t in claims if t in tasks)
    return frozenset(t for t in tasks if t in claims)


def client_states(
    members: Mapping[str, MemberSubscription],
    end_offsets: Mapping[TaskId, int] | None = None,
    acceptable_recovery_lag: int = ACCEPTABLE_RECOVERY_LAG,
    *,
    exact_lags: bool = False,
    shared_ids: Repeats | None = None,
) -> tuple[list[ClientState], dict[str, list[str]], dict[str, str | None]]:
    """Clients by process id, the members of each, and each process's endpoint.

    A process id announced with several endpoints (a copied state directory) is one process per
    endpoint (:func:`process_keys`), each built from its own members' reports, logged at WARNING
    (once per clash while ``shared_ids``, the clashes this leader logged last, remembers it).

    A task reported with ``LATEST_OFFSET`` was running (a previous active); other reported
    tasks are local state (previous standbys) whose lag is ``end_offsets[t] - sum`` when end
    offsets are known, else the distance to the best reported sum. With ``exact_lags`` (the
    high-availability assignor) a task without an end offset has no lag at all: its copies are
    local state of unknown lag, never caught up, since running actives report no offset sum and
    the best reported copy may be a warmup that has barely started. A restarted process also
    reports the actives it ran before it stopped: when its state of such a task is caught up
    (lag within ``acceptable_recovery_lag``), it is the task's previous owner again and the
    process that ran it meanwhile counts as a warm holder — so the assignor's move-minimal
    stickiness hands the task back. A member whose user data was unreadable is a process of
    its own with no history.
    """
    by_process, infos = _group_by_process(members, shared_ids)
    top = _lag_reference(members, end_offsets, exact_lags)
    running, state, home = _measure_local_state(
        members, by_process, infos, top, acceptable_recovery_lag
    )
    clients, endpoints = _build_clients(by_process, infos, running, state, home)
    return clients, by_process, endpoints


def _build_clients(
    by_process: Mapping[str, list[str]],
    infos: Mapping[str, SubscriptionInfo],
    running: Mapping[str, set[TaskId]],
    state: Mapping[str, dict[TaskId, int | None]],
    home: Mapping[TaskId, str],
) -> tuple[list[ClientState], dict[str, str | None]]:
    """One client state per process (a returning task is a previous active of the process it
    returns to), and each process's endpoint."""
    clients = []
    endpoints: dict[str, str | None] = {}
    for key, ms in by_process.items():
        info = infos.get(key)
        if info is None:
            clients.append(ClientState(key, capacity=len(ms)))
            endpoints[key] = None
            continue
        returning = {t for t, k in home.items() if k == key}
        clients.append(
            ClientState(
                key,
                capacity=len(ms),
                prev_active=running[key] | returning,
                prev_standby=state[key].keys() - returning,
                lags={
                    t: lag
                    for t, lag in state[key].items()
                    if lag is not None and t not in returning
                },
                rack=info.rack,
                tags=info.client_tags,
            )
        )
        endpoints[key] = info.endpoint
    return clients, endpoints


def _group_by_process(
    members: Mapping[str, MemberSubscription], shared_ids: Repeats | None
) -> tuple[dict[str, list[str]], dict[str, SubscriptionInfo]]:
    """Members by process key (:func:`process_keys`; clashes logged, see
    :func:`log_shared_process_ids`), and each process's subscription info (offset sums merged),
    in key order: whatever the member ids, the same processes come in the same order."""
    keys, clashes = process_keys(_announced(members))
    log_shared_process_ids(clashes, shared_ids)
    by_process: dict[str, list[str]] = {}
    infos: dict[str, SubscriptionInfo] = {}
    for member in sorted(members, key=lambda m: (keys.get(m, f"member:{m}"), m)):
        info = members[member].info
        key = keys[member] if info is not None else f"member:{member}"
        by_process.setdefault(key, []).append(member)
        if info is not None:
            infos.setdefault(key, info)
            # The process's consumers report the same process state; merge to be safe.
            if info is not infos[key]:
                merged = merge_offset_sums((infos[key].offset_sums, info.offset_sums))
                infos[key] = attrs.evolve(infos[key], offset_sums=merged)
    return by_process, infos


#: Where a process id lives: the remedy a shared-id warning names.
PROCESS_ID_FILES = (
    "<state_dir>/process.id (ProcessHost), <appdir>/streamassign/process.id (a Faust worker; "
    "appdir is <datadir>/v<version>)"
)


@attrs.frozen
class SharedProcessId:
    """Members announcing one process id with different endpoints: processes that cannot be
    one (a process's consumers share its endpoint), so a state directory was copied (a cloned
    disk, a data directory copied to warm a new worker). Each endpoint is a process of its own
    (:func:`process_key`)."""

    process_id: str
    #: ``(endpoint, member)`` pairs, sorted; a member without an endpoint has ``""``.
    members: tuple[tuple[str, str], ...]

    @property
    def endpoints(self) -> tuple[str, ...]:
        return tuple(sorted({e for e, _ in self.members if e}))

    @property
    def member_ids(self) -> tuple[str, ...]:
        return tuple(sorted(m for _, m in self.members))

    def describe(self) -> str:
        """The clash and its remedy, for the leader's log line."""
        listed = ", ".join(f"{m} at {e or 'no endpoint'}" for e, m in self.members)
        return (
            f"process id {self.process_id} is announced with {len(self.endpoints)} endpoints "
            f"({listed}): a copied state directory? Each endpoint is assigned as a process of "
            f"its own. {SHARED_ID_REMEDY}"
        )


#: What to do about a ``SharedProcessId`` (the leader's warning, ``describe``'s problem).
SHARED_ID_REMEDY = (
    "Remedy: stop the worker that got the copy, delete process.id from its state directory "
    f"({PROCESS_ID_FILES}) and start it: it creates a new id"
)


def process_key(process_id: str, endpoint: str) -> str:
    """The client id of one endpoint of a shared process id (``SharedProcessId``): the same
    whatever the members' ids or order, and never a plain process id (a UUID has no ``#``)."""
    return f"{process_id}#{endpoint}"


def process_id_of_key(key: str) -> str:
    """The process id a process key stands for: ``key`` itself, or the id of a
    :func:`process_key`."""
    return key.split("#", 1)[0]


def process_keys(
    announced: Mapping[str, tuple[str, str | None]],
) -> tuple[dict[str, str], list[SharedProcessId]]:
    """Each member's process key, from what it announces (member -> (process id, endpoint)),
    and the process ids shared by members with different endpoints. A process id announced
    with one endpoint (or none) is one process, its consumers (threads); announced with several,
    each endpoint's members are a process keyed ``process_key(id, endpoint)``. Members of
    such an id without an endpoint cannot be told apart: they stay one process under the id."""
    endpoints: dict[str, set[str]] = {}
    for pid, endpoint in announced.values():
        endpoints.setdefault(pid, set())
        if endpoint:
            endpoints[pid].add(endpoint)
    shared = {pid for pid, named in endpoints.items() if len(named) > 1}
    keys = {
        m: process_key(pid, endpoint) if pid in shared and endpoint else pid
        for m, (pid, endpoint) in announced.items()
    }
    clashes = [
        SharedProcessId(
            pid,
            tuple(sorted((e or "", m) for m, (p, e) in announced.items() if p == pid)),
        )
        for pid in sorted(shared)
    ]
    return keys, clashes


def _announced(members: Mapping[str, MemberSubscription]) -> dict[str, tuple[str, str | None]]:
    """What each readable member announces of its process: its id and endpoint."""
    return {m: (str(s.info.process_id), s.info.endpoint) for m, s in members.items() if s.info}


def copied_claimants(clashes: Iterable[SharedProcessId]) -> frozenset[str]:
    """The members whose declared previous actives the leaders ignore: every member of a shared
    process id (``clashes``, from :func:`process_keys`). Those claims come from the copied state
    directory, the original's history, so a copy would be handed back tasks the original still
    runs (a needless move, and the original kept as their warm holder); nothing tells which
    member they are really from. The one rule: the leaders (:func:`without_copied_claims`),
    ``describe`` and a saved ``describe --json`` snapshot (its ``shared_process_ids``) apply it.
    """
    return frozenset(m for clash in clashes for m in clash.member_ids)


def without_copied_claims(
    members: Mapping[str, MemberSubscription],
) -> dict[str, MemberSubscription]:
    """``members`` without the previous actives declared by :func:`copied_claimants`. What each
    member runs and its local state (offset sums, per member) still count."""
    _, clashes = process_keys(_announced(members))
    copied = copied_claimants(clashes)
    out = dict(members)
    for m in copied:
        sub = members[m]
        if sub.info is not None and sub.info.previous_active:
            out[m] = attrs.evolve(sub, info=attrs.evolve(sub.info, previous_active=frozenset()))
    return out


def log_shared_process_ids(clashes: Sequence[SharedProcessId], logged: Repeats | None) -> None:
    """One WARNING per clash (``SharedProcessId``) not in the set ``logged`` holds (the clashes
    this leader reported last, kept across its rebalances; None: every clash at WARNING), the
    others at DEBUG; one INFO line when no id is shared any more. A clash is its process id and
    endpoints: members rejoining with new member ids are the same clash."""
    state = frozenset((c.process_id, c.endpoints) for c in clashes)
    earlier = logged.reported if logged is not None else None
    known = earlier if isinstance(earlier, frozenset) else frozenset()
    if logged is not None:
        if not state:
            if logged.ended():
                log.info("no process id is announced with several endpoints any more")
            return
        logged.changed(state)
    for clash in clashes:
        news = (clash.process_id, clash.endpoints) not in known
        log.log(logging.WARNING if news else logging.DEBUG, "%s", clash.describe())


def _lag_reference(
    members: Mapping[str, MemberSubscription],
    end_offsets: Mapping[TaskId, int] | None,
    exact_lags: bool,
) -> dict[TaskId, int]:
    """The offset each task's lag is measured against."""
    # Each member's own report, not its process's merged sums: where another member of the
    # process runs the task, the merge keeps only the running mark, and the checkpoint this
    # member holds would no longer bound how far behind the other copies are.
    best = best_offset_sums(s.info.offset_sums for s in members.values() if s.info)
    # A task missing from end_offsets (not fetched yet) is measured against the best copy, as
    # without end offsets: a lag of 0 there would make any copy of it look caught up.
    ends = dict(end_offsets or {})
    return ends if exact_lags else {**best, **ends}


def best_offset_sums(reports: Iterable[Mapping[TaskId, int]]) -> dict[TaskId, int]:
    """Per task, the largest checkpointed offset sum in the members' ``reports`` (a running
    task's ``LATEST_OFFSET`` is no sum): what lags are measured against without end offsets."""
    best: dict[TaskId, int] = {}
    for sums in reports:
        for t, s in sums.items():
            if s >= 0:
                best[t] = max(best.get(t, 0), s)
    return best


def merge_offset_sums(reports: Iterable[Mapping[TaskId, int]]) -> dict[TaskId, int]:
    """One process's offset sums from its members' ``reports``: per task ``LATEST_OFFSET``
    where any member runs it (a checkpoint another member reports of it must not make the
    process read as not running it), else the largest sum reported. The one merge of the
    leaders (``client_states``, the Faust leader's hand-back) and of ``explain``/``describe``,
    so that they read a process alike whatever order its members come in."""
    merged: dict[TaskId, int] = {}
    for sums in reports:
        for t, s in sums.items():
            if s == LATEST_OFFSET or merged.get(t) == LATEST_OFFSET:
                merged[t] = LATEST_OFFSET
            else:
                merged[t] = max(merged.get(t, s), s)
    return merged


def local_state_lags(
    sums: Mapping[TaskId, int], top: Mapping[TaskId, int], running: Collection[TaskId]
) -> dict[TaskId, int | None]:
    """The lag of each checkpointed task in one process's offset ``sums`` that it does not run
    (``running``): its distance to ``top`` (:func:`best_offset_sums`, or end offsets), None
    where ``top`` has no offset of the task."""
    return {
        t: max(0, top[t] - s) if t in top else None
        for t, s in sums.items()
        if s >= 0 and t not in running
    }


def _measure_local_state(
    members: Mapping[str, MemberSubscription],
    by_process: Mapping[str, list[str]],
    infos: Mapping[str, SubscriptionInfo],
    top: Mapping[TaskId, int],
    acceptable_recovery_lag: int,
) -> tuple[dict[str, set[TaskId]], dict[str, dict[TaskId, int | None]], dict[TaskId, str]]:
    """Per process: the tasks it runs and the lag of its other local state (None: unknown);
    and the restarted process each caught-up task returns to."""
    running: dict[str, set[TaskId]] = {}
    state: dict[str, dict[TaskId, int | None]] = {}  # None: lag unknown
    for key, info in infos.items():
        running[key] = set(info.running)
        state[key] = local_state_lags(info.offset_sums, top, running[key])
    previous = previous_actives(members, by_process)
    home = caught_up_returns(state, previous, acceptable_recovery_lag)
    for key in running:
        for t in running[key] & home.keys():
            if home[t] != key:  # ran it meanwhile: a warm holder, caught up
                running[key].discard(t)
                state[key][t] = 0
    return running, state, home


def previous_actives(
    members: Mapping[str, MemberSubscription], by_process: Mapping[str, Sequence[str]]
) -> dict[str, frozenset[TaskId]]:
    """Per process, the actives its members declared they ran before they joined (a restarted
    process's, from its state directory)."""
    return {
        key: frozenset(t for m in ms if (i := members[m].info) for t in i.previous_active)
        for key, ms in by_process.items()
    }


def caught_up_returns(
    lags: Mapping[str, Mapping[TaskId, int | None]],
    previous_active: Mapping[str, Collection[TaskId]],
    acceptable_recovery_lag: int,
) -> dict[TaskId, str]:
    """The leader's hand-back rule for local state: per task, the restarted process it returns
    to, one that declared it among its ``previous_active`` and whose ``lags`` of it (its local
    state it does not run, :func:`local_state_lags`; None: unknown) is within
    ``acceptable_recovery_lag``. Of two such processes the least lagging one, then the smaller
    process key (:func:`process_keys`; in effect the process id, since a shared id's members
    make no claims, :func:`copied_claimants`): never ``lags``' order, so the leaders and
    ``explain`` name the same process whatever the member ids (new at every restart; the
    leaders' clients come in process key order too, ``_group_by_process``).
    """
    best: dict[TaskId, tuple[int, str]] = {}  # per task, its (lag, process) so far
    for key, state in lags.items():
        for t in previous_active.get(key, ()):
            lag = state.get(t)
            if lag is not None and lag <= acceptable_recovery_lag:
                best[t] = min(best.get(t, (lag, key)), (lag, key))
    return {t: key for t, (_, key) in sorted(best.items())}


def stateless_returns(
    offset_sums: Mapping[str, Mapping[TaskId, int]],
    previous_active: Mapping[str, Collection[TaskId]],
) -> dict[TaskId, str]:
    """The Faust leader's second hand-back rule (``streamassign.faust.leader``): per task, the
    restarted process it returns to whatever its lag, one that runs nothing (no
    ``LATEST_OFFSET`` among its ``offset_sums``, merged over its members) and declared the task
    among its ``previous_active`` without an offset sum of it (a stateless task, an in-memory
    table); the first such process in process key order (:func:`caught_up_returns`)."""
    home: dict[TaskId, str] = {}
    for key in sorted(offset_sums):
        sums = offset_sums[key]
        if LATEST_OFFSET in sums.values():
            continue
        for t in sorted(frozenset(previous_active.get(key, ())) - sums.keys()):
            home.setdefault(t, key)
    return home


def merged_reports(
    reports: Iterable[tuple[str, Mapping[TaskId, int]]],
) -> dict[str, dict[TaskId, int]]:
    """Per process, its members' ``(process, offset sums)`` ``reports`` merged as the leaders
    merge them (:func:`merge_offset_sums`), each process named getting an entry."""
    by_process: dict[str, list[Mapping[TaskId, int]]] = {}
    for pid, sums in reports:
        by_process.setdefault(pid, []).append(sums)
    return {pid: merge_offset_sums(sums) for pid, sums in by_process.items()}


def handed_back(
    reports: Collection[tuple[str, Mapping[TaskId, int]]],
    previous_active: Mapping[str, Collection[TaskId]],
    protocol: str | None,
    acceptable_recovery_lag: int = ACCEPTABLE_RECOVERY_LAG,
) -> dict[TaskId, str]:
    """Per task, the restarted process the leader returned it to, as far as the members' join
    reports tell (``reports``: each member's process and offset sums; ``previous_active`` per
    process) and ``protocol`` (the group's assignor) says: the leaders' own rules,
    :func:`caught_up_returns` with lags measured as without end offsets (against the best sum
    a member reported, as ``client_states`` measures: the Faust leader's lags, and
    a lower bound of the lags end offsets give ProcessHost's leader, so a task this puts beyond
    ``acceptable_recovery_lag`` was certainly not handed back), then for
    ``FAUST_PROTOCOL_NAME`` :func:`stateless_returns`, which wins as in the Faust leader."""
    offset_sums = merged_reports(reports)
    top = best_offset_sums(sums for _, sums in reports)
    lags = {
        key: local_state_lags(sums, top, running_tasks(sums)) for key, sums in offset_sums.items()
    }
    home = caught_up_returns(lags, previous_active, acceptable_recovery_lag)
    if protocol == FAUST_PROTOCOL_NAME:
        home |= stateless_returns(offset_sums, previous_active)
    return home


def assign_streams(
    topology: Topology,
    partition_counts: Mapping[str, int],
    members: Mapping[str, MemberSubscription],
    *,
    num_standby_replicas: int = 0,
    leader_version: int = LATEST_VERSION,
    end_offsets: Mapping[TaskId, int] | None = None,
    acceptable_recovery_lag: int = ACCEPTABLE_RECOVERY_LAG,
    high_availability: bool = False,
    max_warmup_replicas: int = 2,
    probing_rebalance_interval_ms: int = 600_000,
    now_ms: int | None = None,
    partition_racks: Mapping[TopicPartition, str] | None = None,
    rack_aware_tags: Sequence[str] | None = None,
    probing_memory: ProbingMemory | None = None,
    topology_errors: Repeats | None = None,
    shared_ids: Repeats | None = None,
    topology_versions: Repeats | None = None,
    withheld: Repeats | None = None,
) -> dict[str, MemberAssignment]:
    """Assignment of every member (see the module docstring). Never raises for bad topics or
    bad members: those become error codes or empty assignments, logged. An option out of range
    raises ``AssignmentInputError``, before any member's lag is compared with it.

    ``high_availability`` selects the high-availability assignor with ``max_warmup_replicas``
    and ``probing_rebalance_interval_ms``; ``now_ms`` (default: the wall clock) is the time the
    probing rebalance is counted from. Lags are exact only with ``end_offsets``; without them a
    copy's lag is its distance to the most advanced copy reported (running actives excluded),
    except with ``high_availability``: there a task without an end offset has copies of unknown
    lag, which never take over from a running active (the active stays, the warmup stays, the
    group probes again), so high availability needs ``end_offsets`` to move anything stateful.
    ``partition_racks`` (the rack of each partition's leader) lets tasks that need a new client
    prefer one in their partitions' rack; ``rack_aware_tags`` names the client tag keys standby
    placement avoids sharing (``None``: all). ``probing_memory``: see ``ProbingMemory``.
    ``topology_errors`` (the topology error), ``shared_ids`` (process ids shared by members with
    different endpoints, ``client_states``), ``topology_versions`` (topology versions sharing the
    group, :func:`_same_topology_ids`), ``withheld`` (:func:`_subscribed_only`): what this leader
    logged last, kept across its rebalances (``ProcessHost`` keeps each): each is logged once (an
    error at ERROR, then DEBUG: members retry every 1-30 s), its end at INFO; None: every time."""
    version = common_version(members, leader_version)
    if _shutdown_requested(members):
        return _failed(members, ErrorCode.SHUTDOWN_REQUESTED, version)
    compatible = _compatible_members(topology, members, topology_versions)
    grouped = _group_tasks(topology, partition_counts, topology_errors)
    if grouped is None:
        return _failed(members, _INCOMPLETE, version)
    if not compatible:
        return _unassigned(members, version, topology, grouped.partition_counts)
    compatible = without_copied_claims(bounded_claims(compatible, grouped.tasks))
    assignor = _task_assignor(
        high_availability,
        num_standby_replicas,
        acceptable_recovery_lag,
        max_warmup_replicas,
        probing_rebalance_interval_ms,
        rack_aware_tags,
    )
    given = _RoundInputs(end_offsets, partition_racks, now_ms, probing_memory, shared_ids, withheld)
    return _assign_compatible(topology, grouped, compatible, assignor, members, version, given)


def _shutdown_requested(members: Mapping[str, MemberSubscription]) -> bool:
    """Whether a member asks the whole application to shut down (logged)."""
    if any(m.info and m.info.error_code == ErrorCode.SHUTDOWN_REQUESTED for m in members.values()):
        log.warning("a member requested shutdown of the application; telling every member")
        return True
    return False


@attrs.frozen
class _GroupedTasks:
    """The tasks of a topology over the current topics."""

    tasks: dict[TaskId, frozenset[TopicPartition]]  # task -> its partitions
    partition_counts: dict[str, int]  # every topic's, repartition topics' resolved


def _group_tasks(
    topology: Topology, partition_counts: Mapping[str, int], logged: Repeats | None
) -> _GroupedTasks | None:
    """Tasks with their partitions, and every topic's partition count (None: the topics cannot
    be assigned yet, logged at ERROR; at DEBUG when it is the error ``logged`` last)."""
    try:
        tasks = PartitionGrouper().group(topology, partition_counts)
        counts = resolve_partition_counts(topology, partition_counts)
        _check_repartition_topics(topology, counts, partition_counts)
    except TopologyError as exc:
        log_error_once(
            log,
            logged,
            exc,
            "cannot assign tasks: %s; every member gets INCOMPLETE_SOURCE_TOPIC_METADATA",
        )
        return None
    if logged is not None and logged.ended():
        log.info("the topics are as the topology needs them now: assigning tasks again")
    return _GroupedTasks(tasks, counts)


@attrs.frozen
class _RoundInputs:
    """What the leader is given besides the members and the options (``assign_streams``)."""

    end_offsets: Mapping[TaskId, int] | None
    partition_racks: Mapping[TopicPartition, str] | None
    now_ms: int | None
    probing_memory: ProbingMemory | None
    shared_ids: Repeats | None
    withheld: Repeats | None = None


def _unassigned(
    members: Mapping[str, MemberSubscription],
    version: int,
    topology: Topology,
    counts: Mapping[str, int],
) -> dict[str, MemberAssignment]:
    """Every member with no tasks and no error, but the topic dictionary: a member of another
    topology version can tell why it got none."""
    topics = _topic_dictionary(topology, counts)
    info = AssignmentInfo(topics=topics, version=version, common_version=version)
    return {m: MemberAssignment((), info) for m in members}


def _topic_dictionary(topology: Topology, counts: Mapping[str, int]) -> dict[int, dict[str, int]]:
    """Each subtopology's source topics with their partition counts (``AssignmentInfo.topics``)."""
    return {
        s: {t: counts[t] for t in topology.subtopology(s).source_topics}
        for s in topology.subtopology_ids
    }


def _assign_compatible(
    topology: Topology,
    grouped: _GroupedTasks,
    compatible: Mapping[str, MemberSubscription],
    assignor: HighAvailabilityTaskAssignor | StickyTaskAssignor,
    members: Mapping[str, MemberSubscription],
    version: int,
    given: _RoundInputs,
) -> dict[str, MemberAssignment]:
    """Every member's assignment (a new dict): the tasks spread over the compatible members
    (claims bounded), the other members with none."""
    tasks = grouped.tasks
    high_availability = isinstance(assignor, HighAvailabilityTaskAssignor)
    clients, by_process, endpoints = client_states(
        compatible,
        given.end_offsets,
        assignor.acceptable_recovery_lag,
        exact_lags=high_availability,
        shared_ids=given.shared_ids,
    )
    stateful = [t for t in tasks if t.subtopology in topology.stateful_subtopologies]
    racks = task_racks(tasks, given.partition_racks) if given.partition_racks else None
    planned = _assign_clients(
        assignor, tasks, clients, stateful, racks, given.now_ms, given.probing_memory
    )
    ruling = group_eligibility(
        _own_sources(topology),
        {m: _reading(topology, compatible[m], key) for key, ms in by_process.items() for m in ms},
    )
    per_client = move_to_eligible_clients(
        planned.per_client,
        ruling.withheld,
        clients,
        assignor.num_standby_replicas,
        stateful,
        cold_give_back=not high_availability,
    )
    next_rebalance = _next_probe(planned, per_client, given.probing_memory)
    threads: dict[str, ClientAssignment] = {}
    for key, member_ids in by_process.items():
        threads.update(
            _split_to_threads(per_client[key], member_ids, compatible, stateful, ruling.refused)
        )
    withheld = _subscribed_only(threads, by_process, compatible, tasks, given.withheld)
    # Host maps without what is withheld: queries must not be routed to a process not
    # running it.
    running = {
        key: attrs.evolve(part, active=part.active - withheld.get(key, frozenset()))
        for key, part in per_client.items()
    }
    hosts = _HostMaps.of(running, endpoints, topology, grouped.partition_counts)
    result = _unassigned(members, version, topology, grouped.partition_counts)
    for m, part in threads.items():
        result[m] = _member_assignment(part, tasks, hosts, version)
    if next_rebalance == NEVER:
        return result
    return {  # every member, so whoever leads next still probes
        m: attrs.evolve(a, info=attrs.evolve(a.info, next_rebalance_ms=next_rebalance))
        for m, a in result.items()
    }


def _compatible_members(
    topology: Topology, members: Mapping[str, MemberSubscription], versions: Repeats | None
) -> dict[str, MemberSubscription]:
    """Members that may get tasks (:func:`_may_get_tasks`). Members announcing source topics
    that lack some of the leader's for some of its ids, and members announcing none that do
    not subscribe to every source topic (an older release), are logged once per episode
    (:func:`_log_topology_versions`); only the tasks of the ids they lack move off them, and a
    member subscribing to none of the leader's topics gets none."""
    resolved = {m: _resolved(topology, sub) for m, sub in members.items()}
    eligible = _may_get_tasks(topology, resolved)
    kept = {m: s for m, s in resolved.items() if m in eligible}
    for member in sorted(set(resolved) - set(kept)):
        if not resolved[member].topics:  # empty or unreadable: logged where read, once a round
            log.debug("member %s subscribes to no topic; it gets no tasks", member)
    _log_topology_versions(topology, kept, versions, _unsubscribing(topology, resolved))
    return kept


def _unsubscribing(
    topology: Topology, members: Mapping[str, MemberSubscription]
) -> dict[str, frozenset[str]]:
    """Per process (its id; a member's id without one) with a member announcing no topology
    (protocol 1-2: an older release) that subscribes to some of the leader's source topics
    but not all, or none, the topics that member lacks. Members subscribing to nothing
    readable are left out (logged where read)."""
    needed = topology.source_topics
    out: dict[str, frozenset[str]] = {}
    for member, sub in members.items():
        if _announcement(topology, sub).any or not sub.topics or needed <= sub.topics:
            continue
        name = member if sub.info is None else str(sub.info.process_id)
        out[name] = out.get(name, frozenset()) | (needed - sub.topics)
    return out


def _log_topology_versions(
    topology: Topology,
    members: Mapping[str, MemberSubscription],
    logged: Repeats | None,
    unsubscribing: Mapping[str, frozenset[str]] | None = None,
) -> None:
    """One WARNING line when processes announce, for some of this leader's subtopology ids,
    source topics that lack one of the leader's (another topology version: an id reused, a
    topic added in the leader's version), or announce none of its ids with all their topics
    (:func:`_running_none`), once per episode with ``logged``; one INFO line when none does
    any more. Ids only one side has (fresh ids: the process gets no task of the leader's), and
    ids where a member reads more topics (a topic added in its version: it runs the leader's
    task), are no difference. Members announcing nothing (protocol 1-2) cannot be checked. No
    process is excluded; the tasks of the differing ids are moved off it after the assignor
    (:func:`~streamassign.eligibility.move_to_eligible_clients`) and, inside a process, off
    its members that may not run them (:func:`~streamassign.threads.distribute_to_threads`)."""
    own = _own_sources(topology)
    differing = _differing_ids(topology, own, members)
    idle, idle_members = _running_none(topology, own, members)
    unsubscribing = unsubscribing or {}
    if not differing and not idle and not idle_members and not unsubscribing:
        if logged is not None and logged.ended():
            log.info("every process agrees with this leader's topology again")
        return
    episode = (
        frozenset(differing),
        frozenset(idle),
        frozenset(idle_members),
        frozenset(unsubscribing.items()),
    )
    if logged is not None and not logged.changed(episode):
        return
    _warn_unsubscribing(topology, own, unsubscribing)
    if not differing and not idle and not idle_members:
        return
    listed = [
        f"processes {', '.join(sorted(p))} announce "
        + "; ".join(f"id {s} reading [{t}]" for s, t in ids)
        for ids, p in sorted(differing.items())
    ]
    if idle:
        listed.append(
            f"processes {', '.join(idle)} announce none of this leader's ids with all "
            "its topics: they get no task at all"
        )
    listed += [
        f"members {', '.join(ms)} of process {name} announce none of this leader's ids with "
        "all its topics: the process's tasks go to its other members"
        for name, ms in idle_members.items()
    ]
    _warn_topology_versions(topology, own, listed)


def _warn_unsubscribing(
    topology: Topology,
    own: Mapping[int, frozenset[str]],
    unsubscribing: Mapping[str, frozenset[str]],
) -> None:
    """One WARNING line per process announcing no topology (an older release) that does not
    subscribe to every source topic (``unsubscribing``: process -> the topics it lacks): the
    ids it gets no task of, those reading a topic it lacks."""
    for process, missing in sorted(unsubscribing.items()):
        subscribed = frozenset(topology.source_topics - missing)
        lacking = sorted(subscribed_ineligible_subtopologies(own, subscribed))
        what = (
            "no task at all"
            if len(lacking) == len(own)
            else f"no task of subtopology id{'s' if len(lacking) > 1 else ''} "
            + ", ".join(str(s) for s in lacking)
        )
        log.warning(
            "process %s announces no topology (protocol 1-2: an older release?) and does not "
            "subscribe to %s; it gets %s (they run on the other processes) until it runs "
            "this leader's version (%s)",
            process,
            ", ".join(sorted(missing)),
            what,
            ROLLING_DEPLOY_DOC,
        )


def _differing_ids(
    topology: Topology,
    own: Mapping[int, frozenset[str]],
    members: Mapping[str, MemberSubscription],
) -> dict[tuple[tuple[int, str], ...], set[str]]:
    """The process ids announcing, for some of the leader's ids (``own``), source topics that
    lack one of the leader's, by those ids with the topics announced for them."""
    differing: dict[tuple[tuple[int, str], ...], set[str]] = {}
    for sub in members.values():
        theirs = _announcement(topology, sub).sources
        ids = tuple(
            (s, ", ".join(sorted(theirs[s])))
            for s, topics in sorted(own.items())
            if s in theirs and not topics <= theirs[s]
        )
        if sub.info is not None and ids:
            differing.setdefault(ids, set()).add(str(sub.info.process_id))
    return differing


def _running_none(
    topology: Topology,
    own: Mapping[int, frozenset[str]],
    members: Mapping[str, MemberSubscription],
) -> tuple[list[str], dict[str, list[str]]]:
    """The processes (clients, :func:`process_keys`: a process id announced with two endpoints
    is two) whose members all announce, but none of the leader's ids (``own``) with all its
    topics: they get no task at all; and, per other process, its members that announce so
    (processes of two topology versions sharing one process id without distinct endpoints):
    the thread split gives the process's tasks to its other members. Sorted names: a process
    id, or ``id at endpoint`` for one endpoint of a shared id."""
    keys, _ = process_keys(_announced(members))
    by_key: dict[str, dict[str, bool]] = {}
    for m, sub in members.items():
        said = _announcement(topology, sub)
        runs_none = said.any and member_ineligible_subtopologies(own, said.sources) == own.keys()
        if m in keys:
            by_key.setdefault(keys[m], {})[m] = runs_none
    idle = sorted(_process_name(k) for k, ms in by_key.items() if all(ms.values()))
    idle_members = {
        _process_name(k): sorted(m for m, none in ms.items() if none)
        for k, ms in sorted(by_key.items())
        if any(ms.values()) and not all(ms.values())
    }
    return idle, idle_members


def _process_name(key: str) -> str:
    """A process key (:func:`process_keys`) as a log line names it."""
    pid, _, endpoint = key.partition("#")
    return f"{pid} at {endpoint}" if endpoint else pid


def _warn_topology_versions(
    topology: Topology, own: Mapping[int, frozenset[str]], listed: Sequence[str]
) -> None:
    """The WARNING of :func:`_log_topology_versions`: what differs (``listed``), the leader's
    ids with their topics, and what the leader does about it."""
    mine = "; ".join(f"id {s}: [{', '.join(sorted(t))}]" for s, t in sorted(own.items()))
    log.warning(
        "processes of another topology version share the group: %s (this leader, version %s: "
        "%s). No member announcing an id so gets a task of it: its actives go to a process "
        "with a member announcing all of this leader's topics of it (one holding its state "
        "first, up to its share), and there to such a member, as do its standbys and warmups "
        "(those on a process without such a member are dropped, the standbys placed again); "
        "the other ids are assigned as usual. Where no process is eligible the task stays, "
        "and a process whose own task of that id does not read its partitions refuses it (its "
        "ERROR line names it). Keep subtopology ids stable across versions (%s)",
        " | ".join(listed),
        topology_version(subtopology_fingerprints(topology)),
        mine,
        ROLLING_DEPLOY_DOC,
    )


def _task_assignor(
    high_availability: bool,
    num_standby_replicas: int,
    acceptable_recovery_lag: int,
    max_warmup_replicas: int,
    probing_rebalance_interval_ms: int,
    rack_aware_tags: Sequence[str] | None,
) -> HighAvailabilityTaskAssignor | StickyTaskAssignor:
    """The task assignor the options select (their validation errors included)."""
    if high_availability:
        return HighAvailabilityTaskAssignor(
            num_standby_replicas,
            acceptable_recovery_lag,
            max_warmup_replicas,
            probing_rebalance_interval_ms,
            rack_aware_tags=rack_aware_tags,
        )
    return StickyTaskAssignor(
        num_standby_replicas, acceptable_recovery_lag, rack_aware_tags=rack_aware_tags
    )


@attrs.frozen
class _Planned:
    """The assignor's round: each client's tasks; the actives the high-availability assignor
    held back (task -> the process it waits for); when it asks the group to probe again
    (NEVER: no need), and its probing interval (for the log line)."""

    per_client: dict[str, ClientAssignment]
    held_back: Mapping[TaskId, str] = attrs.field(factory=dict)
    next_rebalance: int = NEVER
    probing_interval_ms: int = 0


def _assign_clients(
    assignor: HighAvailabilityTaskAssignor | StickyTaskAssignor,
    tasks: Mapping[TaskId, frozenset[TopicPartition]],
    clients: list[ClientState],
    stateful: list[TaskId],
    racks: Mapping[TaskId, str] | None,
    now_ms: int | None,
    probing_memory: ProbingMemory | None,
) -> _Planned:
    """Each client's tasks, and whether and when the group should probe again."""
    if isinstance(assignor, HighAvailabilityTaskAssignor):
        return _plan_high_availability(
            assignor, tasks, clients, stateful, racks, now_ms, probing_memory
        )
    if probing_memory is not None:  # this assignment, not the remembered one, is the last
        probing_memory.forget()
    return _Planned(assignor.assign(tasks, clients, stateful, task_racks=racks))


def _next_probe(
    planned: _Planned,
    per_client: Mapping[str, ClientAssignment],
    probing_memory: ProbingMemory | None,
) -> int:
    """When the group should probe again (NEVER: no need), said at INFO: the assignor's time,
    unless the rolling-deploy post-pass changed its assignment and no held-back active has a
    copy catching up (a warmup or a standby) on the process it waits for any more: their
    warmups were on processes that may not run them, and a probe would find the same plan."""
    if per_client is not planned.per_client:
        if probing_memory is not None:
            # Its plan is the assignor's, not what the members were sent. Where only
            # standbys changed they do run its actives, and carried over, its target would
            # move one in a later round that nothing asked to probe (tests/test_eligibility).
            probing_memory.forget()
        waiting = per_client.get
        if not any(
            (copies := waiting(target)) is not None and task in copies.standby | copies.warmup
            for task, target in planned.held_back.items()
        ):
            return NEVER
    if planned.next_rebalance != NEVER:
        log.info(
            "%d actives held back on caught-up processes, %d warmups placed; "
            "probing rebalance in %d ms",
            len(planned.held_back),
            sum(len(a.warmup) for a in per_client.values()),
            planned.probing_interval_ms,
        )
    return planned.next_rebalance


def _plan_high_availability(
    ha: HighAvailabilityTaskAssignor,
    tasks: Mapping[TaskId, frozenset[TopicPartition]],
    clients: list[ClientState],
    stateful: list[TaskId],
    racks: Mapping[TaskId, str] | None,
    now_ms: int | None,
    probing_memory: ProbingMemory | None,
) -> _Planned:
    """The high-availability assignment per client, and when to probe again (NEVER: no need)."""
    if probing_memory is None:
        plan = ha.plan(tasks, clients, stateful, task_racks=racks)
    else:
        plan = probing_memory.plan(ha, tasks, clients, stateful, racks)
    next_rebalance = NEVER
    if plan.probing_rebalance_needed:
        start = int(time.time() * 1000) if now_ms is None else now_ms
        next_rebalance = start + ha.probing_rebalance_interval_ms
    return _Planned(
        dict(plan.assignment),
        plan.held_back,
        next_rebalance,
        ha.probing_rebalance_interval_ms,
    )


@attrs.frozen
class _HostMaps:
    """What every member's assignment tells about the group: tasks by endpoint, and the source
    topic counts of each subtopology."""

    active_by_host: dict[str, frozenset[TaskId]]
    standby_by_host: dict[str, frozenset[TaskId]]
    topics: dict[int, dict[str, int]]

    @classmethod
    def of(
        cls,
        per_client: Mapping[str, ClientAssignment],
        endpoints: Mapping[str, str | None],
        topology: Topology,
        counts: Mapping[str, int],
    ) -> _HostMaps:
        active_by_host: dict[str, frozenset[TaskId]] = {}
        standby_by_host: dict[str, frozenset[TaskId]] = {}
        for key, assigned in per_client.items():
            endpoint = endpoints[key]
            if endpoint:
                active = active_by_host.get(endpoint, frozenset()) | assigned.active
                active_by_host[endpoint] = active
                standby_by_host[endpoint] = (
                    standby_by_host.get(endpoint, frozenset()) | assigned.standby | assigned.warmup
                )
        # The dictionary travels even without endpoints: it is what lets a reader of the
        # group (``describe``) map every task to its partitions; a few bytes per topic.
        return cls(active_by_host, standby_by_host, _topic_dictionary(topology, counts))


def _own_sources(topology: Topology) -> dict[int, frozenset[str]]:
    """Each subtopology id of ``topology`` with its source topics."""
    return {s: frozenset(topology.subtopology(s).source_topics) for s in topology.subtopology_ids}


def _split_to_threads(
    assigned: ClientAssignment,
    member_ids: list[str],
    compatible: Mapping[str, MemberSubscription],
    stateful: list[TaskId],
    ineligible: Mapping[str, frozenset[int]],
) -> dict[str, ClientAssignment]:
    """One client's tasks split over its members (threads), none on a member ineligible for
    its id where another member may run it (``ineligible``: per member)."""
    infos = {m: compatible[m].info for m in member_ids}
    previous = {m: info.previous_active for m, info in infos.items() if info is not None}
    refused = {m: ineligible[m] for m in member_ids}
    return distribute_to_threads(assigned, member_ids, previous, stateful, refused)


def _member_assignment(
    part: ClientAssignment,
    tasks: Mapping[TaskId, frozenset[TopicPartition]],
    hosts: _HostMaps,
    version: int,
) -> MemberAssignment:
    """A member's share of its client's tasks as its assignment."""
    partitions = tuple(sorted(tp for t in part.active for tp in tasks[t]))
    return MemberAssignment(
        partitions,
        AssignmentInfo(
            active=part.active,
            # Version 1 has no warmups: such a member runs them as standbys, which
            # reports their progress all the same.
            standby=part.standby if version >= 2 else part.standby | part.warmup,
            warmup=part.warmup if version >= 2 else frozenset(),
            active_by_host=hosts.active_by_host,
            standby_by_host=hosts.standby_by_host,
            topics=hosts.topics,
            version=version,
            common_version=version,
        ),
    )


def _subscribed_only(
    threads: dict[str, ClientAssignment],
    by_process: Mapping[str, list[str]],
    compatible: Mapping[str, MemberSubscription],
    tasks: Mapping[TaskId, frozenset[TopicPartition]],
    logged: Repeats | None,
) -> dict[str, frozenset[TaskId]]:
    """Drops from ``threads`` (in place) the actives reading a topic their member does not
    subscribe to (its consumer would fail on the assignment: aiokafka asserts every
    partition is subscribed); returns them per process key. The post-pass keeps such tasks
    off a process none of whose members may run their id, and the thread split off a member
    that may not where another member of its process may; one stays only where no member of
    any process may run its id (none announces all its topics: not in a real group, where the
    leader's own member runs every id of its topology, but ``assign_streams`` may be called
    without it), then it is not assigned this round: logged at ERROR once per episode with
    ``logged``."""
    withheld: dict[str, frozenset[TaskId]] = {}
    by_member: dict[str, frozenset[TaskId]] = {}
    for key, member_ids in by_process.items():
        for m in member_ids:
            part, subscribed = threads[m], compatible[m].topics
            unsubscribed = frozenset(
                t for t in part.active if any(tp.topic not in subscribed for tp in tasks[t])
            )
            if unsubscribed:
                threads[m] = attrs.evolve(part, active=part.active - unsubscribed)
                by_member[m] = unsubscribed
                withheld[key] = withheld.get(key, frozenset()) | unsubscribed
    _log_withheld(by_member, logged)
    return withheld


def _log_withheld(by_member: Mapping[str, frozenset[TaskId]], logged: Repeats | None) -> None:
    if not by_member:
        if logged is not None and logged.ended():
            log.info("every task is assigned again to a member subscribing to its topics")
        return
    news = logged is None or logged.changed(frozenset(by_member.items()))
    for member, unsubscribed in sorted(by_member.items()):
        log.log(
            logging.ERROR if news else logging.DEBUG,
            "no process that subscribes to their topics may run %s; not assigned to member %s "
            "this round",
            ", ".join(str(t) for t in sorted(unsubscribed)),
            member,
        )


def _check_repartition_topics(
    topology: Topology, resolved: Mapping[str, int], actual: Mapping[str, int]
) -> None:
    """Repartition topics must exist with the count the topology resolves to."""
    missing = sorted(t for t in topology.repartition_topics if t not in actual)
    if missing:
        raise TopologyError(f"repartition topics not created yet: {', '.join(missing)}")
    wrong = {
        t: (actual[t], resolved[t]) for t in topology.repartition_topics if actual[t] != resolved[t]
    }
    if wrong:
        listed = ", ".join(f"{t} has {a} partitions, needs {r}" for t, (a, r) in wrong.items())
        raise TopologyError(f"repartition topics with the wrong partition count: {listed}")


def task_racks(
    tasks: Mapping[TaskId, Iterable[TopicPartition]], partition_racks: Mapping[TopicPartition, str]
) -> dict[TaskId, str]:
    """The rack most of each task's partitions lead from (ties: the smallest name); tasks
    whose partitions have no known rack are left out."""
    out: dict[TaskId, str] = {}
    for task, partitions in tasks.items():
        counts = Counter(partition_racks[tp] for tp in partitions if tp in partition_racks)
        if counts:
            out[task] = min(counts, key=lambda rack: (-counts[rack], rack))
    return out
