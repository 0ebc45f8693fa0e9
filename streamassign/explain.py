"""What changed between two assignments, and why: ``streamassign explain``, ``diff`` and
``plan --explain``.

An operator's question after a rebalance is "which tasks moved, from where to where, and what
rule moved them". The assignors do not log their reasons per task (that would cost time in every
rebalance); the rules are simple enough to read back from the two assignments and the clients'
capacities, which is what this module does. It is pure: the CLI feeds it saved JSON files or a
``plan`` run.
"""

from __future__ import annotations

import enum
import json
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import attrs

from ._ids import TaskId, TopicPartition
from .assignment import ClientAssignment, ClientState
from .errors import AssignmentFileError
from .protocol import LATEST_OFFSET, running_tasks
from .sticky import resolve_previous_owners
from .streams import (
    ACCEPTABLE_RECOVERY_LAG,
    FAUST_PROTOCOL_NAME,
    best_offset_sums,
    handed_back,
    local_state_lags,
    merged_reports,
    process_id_of_key,
)


class Reason(enum.StrEnum):
    """Why a task (or a standby) left the client that had it, or why it has a new place."""

    #: No present client ran it before (first assignment, new partitions, or, in ``plan``, its
    #: owner is not in the clients file).
    NO_PREVIOUS_OWNER = "no previous owner"
    #: ``explain --last``: no process of the snapshot reported running it when it joined the
    #: last rebalance; its owner left at that rebalance, or it is new (one snapshot cannot
    #: tell which).
    NOT_REPORTED = "no owner reported"
    #: The task is no longer in the topology (fewer partitions, or a stale claim).
    TASK_REMOVED = "task removed"
    #: Its previous owner (or standby holder) left the group.
    CLIENT_GONE = "client gone"
    #: The new owner held a warmup of it: a probing rebalance found the warmup caught up.
    WARMUP_DONE = "warmup done (probing)"
    #: The previous owner's capacity fell, so its quota did.
    CAPACITY_CHANGE = "capacity change"
    #: Snapshots only (``explain`` of ``describe --json`` files, ``--last``, ``describe
    #: --watch``): the new owner is a restarted process that ran the task before it stopped and
    #: came back, as its members said at their last join, and the leader's rule hands the task
    #: back to it (``streamassign.streams.handed_back``): a checkpoint of it within
    #: ``acceptable_recovery_lag`` of the best one reported, or, under the Faust assignor, no
    #: state of it while the process runs nothing; the process that ran it meanwhile counts as
    #: a warm holder in that rebalance only.
    HANDED_BACK = "handed back to previous owner"
    #: The previous owner was over its quota (a client joined, or tasks were added).
    BALANCE_QUOTA = "balance quota"
    #: A standby holder now runs the task as its active (a copy cannot sit beside its active).
    BECAME_ACTIVE = "became active"
    #: The previous active stays on as a standby of the task it gave up.
    WAS_ACTIVE_HERE = "was active here"
    #: The task had fewer standbys than required before (too few clients, or new).
    MISSING_COPY = "missing copy"
    #: A standby moved to even out standby load (or the standby count changed).
    STANDBY_BALANCE = "standby balance"


class Landing(enum.StrEnum):
    """What the new owner of a moved active already had of its state."""

    STANDBY = "standby"
    #: A task without state: nothing to restore wherever it runs.
    STATELESS = "no state needed"
    WARMUP = "warmup"
    LOCAL = "local state"
    COLD = "cold"
    #: The new owner reported the task running when it joined the last rebalance, alone: it
    #: took the task in an earlier rebalance (one neither side shows), with whatever state it
    #: had then, which no report says.
    EARLIER = "earlier rebalance: state unknown"


@attrs.frozen
class ClientView:
    """One client as a saved assignment shows it: its capacity (threads) and its tasks."""

    capacity: int | None
    assignment: ClientAssignment


@attrs.frozen
class ActiveMove:
    """An active task that changed client (``source`` None: it had no previous owner;
    ``destination`` None: it was removed, and ``landing`` is None, as it lands nowhere)."""

    task: TaskId
    source: str | None
    destination: str | None
    reason: Reason
    landing: Landing | None


@attrs.frozen
class StandbyMove:
    """A standby copy dropped by ``source`` or placed on ``destination`` (one side may be None)."""

    task: TaskId
    source: str | None
    destination: str | None
    reason: Reason


@attrs.frozen
class Explanation:
    """Every active and standby that moved from ``before`` to ``after``, in task order."""

    actives: tuple[ActiveMove, ...]
    standbys: tuple[StandbyMove, ...]

    @property
    def moves(self) -> int:
        """Actives whose previous owner is still present but no longer runs them (DESIGN §3.3)."""
        not_moves = (
            Reason.NO_PREVIOUS_OWNER,
            Reason.NOT_REPORTED,
            Reason.CLIENT_GONE,
            Reason.TASK_REMOVED,
            Reason.HANDED_BACK,  # the leader's previous owner is the one it went back to
        )
        return sum(1 for m in self.actives if m.reason not in not_moves)


@attrs.frozen
class ClaimConflicts:
    """Claims no assignment can hold, in clients' reports or a saved assignment.

    ``duplicate_actives``: ``(task, claimants, kept)`` for each task active on several clients;
    ``kept`` is the claimant taken as its owner by the sticky assignor's rule
    (``streamassign.sticky.resolve_previous_owners``: smallest lag, then smallest process id),
    the others count as holding its state. ``active_and_standby``: ``(task, client)`` for each
    task both active and standby on one client, counted as active there. Both in task order.
    """

    duplicate_actives: tuple[tuple[TaskId, tuple[str, ...], str], ...] = ()
    active_and_standby: tuple[tuple[TaskId, str], ...] = ()
    #: The claimants taken as zombies (:func:`likely_zombies`), never kept where another
    #: claimant is.
    zombies: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.duplicate_actives or self.active_and_standby)


def claim_conflicts(
    view: Mapping[str, ClientView],
    lags: Mapping[str, Mapping[TaskId, int]] | None = None,
    *,
    zombies: Collection[str] = (),
) -> ClaimConflicts:
    """The claims of ``view`` no assignment can hold, and how they are read (``lags``: the
    clients' ``ClientState.lags`` when known; they decide which duplicate claim is kept;
    ``zombies``: claimants never kept where another claims the task)."""
    owners = _resolved_owners(view, lags or {}, zombies)
    duplicates = [
        (task, claimants, kept)
        for task, (claimants, kept) in sorted(owners.items())
        if len(claimants) > 1
    ]
    both = sorted(
        (task, pid)
        for pid, client in view.items()
        for task in client.assignment.active & client.assignment.standby
    )
    return ClaimConflicts(tuple(duplicates), tuple(both), tuple(sorted(zombies)))


def likely_zombies(view: Mapping[str, ClientView], protocol: str | None) -> frozenset[str]:
    """The processes of ``view`` (what members said they ran at their last join) whose every
    active claim another process claims too, where each such task has a claimant not in that
    case: a process paused past its session (a zombie) comes back still running what the
    group gave away meanwhile, so it claims nothing alone, while the tasks' new owners claim
    theirs. Taken by the process id order the assignor's tie-break uses, its claims would
    credit it with tasks their real owners ran.

    Only under the Faust drop-in (``protocol``), whose members report every active running
    whether restored or not, so every task given away contests the zombie's claim. The
    runtime reports an active it still restores as local state: the zombie then keeps a claim
    of its own and a healthy process whose tasks it claims reads as the zombie."""
    if protocol != FAUST_PROTOCOL_NAME:
        return frozenset()
    claims = _owners(view, "active")
    contested = {task: pids for task, pids in claims.items() if len(pids) > 1}
    suspects = {
        pid
        for pid, client in view.items()
        if client.assignment.active and client.assignment.active <= contested.keys()
    }
    if any(set(pids) <= suspects for pids in contested.values()):
        return frozenset()  # two processes claiming only each other's tasks: which is unknown
    return frozenset(suspects)


def _resolved_owners(
    view: Mapping[str, ClientView],
    lags: Mapping[str, Mapping[TaskId, int]],
    zombies: Collection[str] = (),
) -> dict[TaskId, tuple[tuple[str, ...], str]]:
    """Per task active in ``view``: its claimants (process id order) and the one kept, by the
    sticky assignor's own rule when there are several, ``zombies`` left out of a task's
    claimants where another remains."""
    claims = _owners(view, "active")
    contested = {
        task: [p for p in pids if p not in zombies] or pids
        for task, pids in claims.items()
        if len(pids) > 1
    }
    kept: dict[TaskId, str] = {}
    if contested:
        claimants = sorted({pid for pids in contested.values() for pid in pids})
        states = [
            ClientState(
                pid,
                prev_active=frozenset(t for t, pids in contested.items() if pid in pids),
                lags={t: n for t, n in lags.get(pid, {}).items() if t in contested},
            )
            for pid in claimants
        ]
        kept = resolve_previous_owners(contested, states)
    return {task: (tuple(pids), kept.get(task, pids[0])) for task, pids in claims.items()}


def _owners(view: Mapping[str, ClientView], kind: str) -> dict[TaskId, list[str]]:
    out: dict[TaskId, list[str]] = {}
    for pid in sorted(view):
        assignment = view[pid].assignment
        for task in getattr(assignment, kind):
            # A standby beside its own active on one client counts as the active only.
            if kind == "active" or task not in assignment.active:
                out.setdefault(task, []).append(pid)
    return out


def _share_fell(
    pid: str, before: Mapping[str, ClientView], after: Mapping[str, ClientView]
) -> bool:
    """Whether ``pid``'s own capacity went down (its share of the tasks fell with it)."""
    old, new = before[pid].capacity, after[pid].capacity
    return old is not None and new is not None and new < old


def _active_reason(
    task: TaskId,
    source: str,
    destination: str | None,
    before: Mapping[str, ClientView],
    after: Mapping[str, ClientView],
) -> Reason:
    if source not in after:
        return Reason.CLIENT_GONE
    if destination is not None and task in before.get(destination, _EMPTY).assignment.warmup:
        return Reason.WARMUP_DONE
    if _share_fell(source, before, after):
        return Reason.CAPACITY_CHANGE
    return Reason.BALANCE_QUOTA


def _landing(
    task: TaskId,
    destination: str,
    before: Mapping[str, ClientView],
    lags: Mapping[str, Mapping[TaskId, int]],
    shared_running: Collection[TaskId],
) -> Landing:
    had = before.get(destination, _EMPTY).assignment
    if task in had.active:
        # A claimant the assignor did not keep (a duplicate claim) holds the task's state.
        return Landing.LOCAL
    if task in had.standby:
        return Landing.STANDBY
    if task in had.warmup:
        return Landing.WARMUP
    offset = lags.get(destination, {}).get(task)
    if offset is None:
        return Landing.COLD
    if offset != LATEST_OFFSET or task in shared_running:
        return Landing.LOCAL
    return Landing.EARLIER


def _shared_running(
    before: Mapping[str, ClientView], lags: Mapping[str, Mapping[TaskId, int]]
) -> frozenset[TaskId]:
    """The tasks whose ``LATEST_OFFSET`` (running) reports in ``lags`` say the new owner had
    their state at the last rebalance: several processes reported one running at that join
    (a zombie kept running it beside its owner), and ``before`` is the assignment right before
    that rebalance (every process of ``before`` that reported ran exactly its actives there).
    Otherwise a rebalance neither side shows came between, and a running report dates from
    it: the task moved then, with a state no report tells."""
    running = {pid: running_tasks(sums) for pid, sums in lags.items()}
    if any(running[pid] != before[pid].assignment.active for pid in before.keys() & running):
        return frozenset()
    seen: set[TaskId] = set()
    shared: set[TaskId] = set()
    for tasks in running.values():
        shared |= seen & tasks
        seen |= tasks
    return frozenset(shared)


_EMPTY = ClientView(None, ClientAssignment())


def explain(
    before: Mapping[str, ClientView],
    after: Mapping[str, ClientView],
    lags: Mapping[str, Mapping[TaskId, int]] | None = None,
    stateful: Collection[TaskId] | None = None,
    *,
    claim_lags: Mapping[str, Mapping[TaskId, int]] | None = None,
    from_last_join: bool = False,
    returned: Mapping[TaskId, str] | None = None,
    zombies: Collection[str] = (),
) -> Explanation:
    """Every task whose active or standby placement differs between ``before`` and ``after``.

    ``lags`` (per client: tasks it has local state of) tells a warm landing from a cold one when
    the state is not a standby of ``before`` (e.g. a restarted process's checkpoints); a
    ``LATEST_OFFSET`` among them (the client ran the task when it joined) counts as local state
    only in the one case it dates from the last rebalance (see :func:`_shared_running`), else
    the landing is ``Landing.EARLIER``;
    ``stateful`` (None: every task) tells which tasks have state to land on at all.
    ``claim_lags`` (the clients' ``ClientState.lags``, when known) decide which of several
    active claims in ``before`` is the previous owner, as in the assignor; without them, the
    smallest process id (see :func:`claim_conflicts`). ``from_last_join``: ``before`` is
    :meth:`Snapshot.before_last_join` (a task without an owner there is ``NOT_REPORTED``).
    ``returned``: per task, the restarted process the leader's rule hands it back to
    (:meth:`Snapshot.handed_back`); a task moved there from a process still present is
    ``HANDED_BACK``. ``zombies`` (:func:`likely_zombies` of ``before``) are never taken as
    the previous owner of a task another process claims too.
    """
    known_lags = lags or {}
    shared_running = _shared_running(before, known_lags)
    old_owners = _resolved_owners(before, claim_lags or {}, zombies)
    new_owners = _resolved_owners(after, {})
    old_active = {t: kept for t, (_, kept) in old_owners.items()}
    new_active = {t: kept for t, (_, kept) in new_owners.items()}
    actives = []
    for task in sorted(old_active.keys() | new_active.keys()):
        source, destination = old_active.get(task), new_active.get(task)
        # A task claimed by several clients counts as run by the kept claimant, as in the
        # metrics: moving it to another claimant is a (warm) move, not a stay.
        if source == destination:
            continue
        if source is None:
            reason = Reason.NOT_REPORTED if from_last_join else Reason.NO_PREVIOUS_OWNER
        elif destination is None:
            reason = Reason.TASK_REMOVED
        elif source in after and (returned or {}).get(task) == destination:
            reason = Reason.HANDED_BACK
        else:
            reason = _active_reason(task, source, destination, before, after)
        landing: Landing | None
        if destination is None:
            landing = None
        elif stateful is not None and task not in stateful:
            landing = Landing.STATELESS
        else:
            landing = _landing(task, destination, before, known_lags, shared_running)
        actives.append(ActiveMove(task, source, destination, reason, landing))
    return Explanation(tuple(actives), _standby_moves(before, after, old_active, new_active))


def _standby_moves(
    before: Mapping[str, ClientView],
    after: Mapping[str, ClientView],
    old_active: Mapping[TaskId, str],
    new_active: Mapping[TaskId, str],
) -> tuple[StandbyMove, ...]:
    old_copies, new_copies = _owners(before, "standby"), _owners(after, "standby")
    moves = []
    for task in sorted(old_copies.keys() | new_copies.keys()):
        was, now = set(old_copies.get(task, ())), set(new_copies.get(task, ()))
        for pid in sorted(was - now):
            if pid not in after:
                reason = Reason.CLIENT_GONE
            elif task not in new_active:
                reason = Reason.TASK_REMOVED
            elif new_active.get(task) == pid:
                reason = Reason.BECAME_ACTIVE
            else:
                reason = Reason.STANDBY_BALANCE
            moves.append(StandbyMove(task, pid, None, reason))
        for pid in sorted(now - was):
            if task not in old_copies and task not in old_active:
                reason = Reason.NO_PREVIOUS_OWNER
            elif old_active.get(task) == pid:
                reason = Reason.WAS_ACTIVE_HERE
            elif any(p not in after for p in was):
                reason = Reason.CLIENT_GONE
            elif len(was) < len(now):
                reason = Reason.MISSING_COPY
            else:
                reason = Reason.STANDBY_BALANCE
            moves.append(StandbyMove(task, None, pid, reason))
    return tuple(moves)


#: Per process, named as one generation names it (``describe``'s process key), its members'
#: ``(member id, endpoint)`` pairs (``""``: no endpoint): what tells which process of one
#: generation a process of the next is when its key changed (:func:`named_as_after`).
ProcessMembers = Mapping[str, frozenset[tuple[str, str]]]


def named_as_after(
    before: Mapping[str, ClientView], members_before: ProcessMembers, members_after: ProcessMembers
) -> dict[str, ClientView]:
    """``before``'s processes (:func:`explain`'s ``before``), each named as the AFTER side
    names it (``members_*``: each side's :data:`ProcessMembers`). Where a clash of a shared
    process id starts or ends between the two (``streamassign.streams.process_keys``), the
    original's key changes from ``P`` to ``P#endpoint`` (or back) with the same tasks, which
    compared by key would read as moved off a process that left, and landing cold. The one
    rule for ``explain BEFORE AFTER`` and ``describe --watch``."""
    renamed = _renamed_processes(members_before, members_after)
    # Never onto a key BEFORE already names (a file whose member rows miss a process): the
    # dict below would drop one of the two views.
    kept = {key: new for key, new in renamed.items() if new not in before}
    return {kept.get(key, key): view for key, view in before.items()}


def _renamed_processes(before: ProcessMembers, after: ProcessMembers) -> dict[str, str]:
    """Old key -> new key for each process of ``before`` missing from ``after`` whose process
    id has exactly one new key in ``after`` (``P`` for ``P#endpoint``, or the reverse) holding
    one of its members, or else (the process restarted under a new member id meanwhile) its
    endpoint. A new key two old ones lead to is left out: one process cannot be both, and
    guessing would hide a real move."""
    gone, fresh = before.keys() - after.keys(), after.keys() - before.keys()
    renamed: dict[str, str] = {}
    for key in sorted(gone):
        pid = process_id_of_key(key)
        rekeyed = [n for n in sorted(fresh) if process_id_of_key(n) == pid]
        matches = [n for n in rekeyed if _member_ids(before[key]) & _member_ids(after[n])] or [
            n for n in rekeyed if _endpoints(before[key]) & _endpoints(after[n])
        ]
        if len(matches) == 1:
            renamed[key] = matches[0]
    targets = Counter(renamed.values())
    return {key: new for key, new in renamed.items() if targets[new] == 1}


def _member_ids(members: Iterable[tuple[str, str]]) -> set[str]:
    return {member for member, _ in members}


def _endpoints(members: Iterable[tuple[str, str]]) -> set[str]:
    return {endpoint for _, endpoint in members if endpoint}


def views_from_assignment(
    assignment: Mapping[str, ClientAssignment], capacities: Mapping[str, int]
) -> dict[str, ClientView]:
    """Views of a freshly computed assignment (``plan``): capacities from the clients."""
    return {pid: ClientView(capacities.get(pid), a) for pid, a in assignment.items()}


def views_from_clients(clients: Iterable[ClientState]) -> dict[str, ClientView]:
    """What clients report they ran and replicated, as the ``before`` side of a rebalance.

    A report carries a client's capacity now, not the one it ran with, so ``before`` has no
    capacity and a capacity change reads as a quota change.
    """
    return {
        c.process_id: ClientView(None, ClientAssignment(c.prev_active, c.prev_standby))
        for c in clients
    }


def load_saved(data: object, where: str) -> dict[str, ClientView]:
    """Client views from a saved assignment (``plan --json``'s or ``describe --json``'s shape).

    ``{"assignment": {process_id: {"active": [...], "standby": [...], "warmup": [...],
    "capacity": N}}}``; ``warmup`` and ``capacity`` are optional. Anything else (or a
    ``describe --json`` snapshot not taken in state Stable) is an ``AssignmentFileError``
    naming the file and the key; :func:`load_snapshot` gives the rest of the file too.
    """
    return dict(load_snapshot(data, where, members=False).views)


#: The only group state in which DescribeGroups returns the group's assignment (members' bytes
#: are the current subscriptions and assignment), so a ``describe --json`` snapshot holds one.
STABLE = "Stable"


@attrs.frozen
class Snapshot:
    """A saved assignment file: ``plan --json``, ``describe --json`` or hand-written.

    ``views``: per process, its capacity and tasks. ``state``: the group's state when saved
    (None: the file has none, as ``plan --json`` output). ``reports``: per member of a
    ``describe --json`` snapshot, its process and the offset sums it sent at its last join
    (empty for other files). ``family``: ``describe``'s protocol family (``"streams"``...),
    None when the file has none. ``previous_active``: per process, the actives its members
    said at their last join they ran before (a restarted process's, from its state directory).
    ``protocol``: the group's assignor (``describe``'s), None when the file has none.
    ``process_members``: per process, its members' ids and endpoints (:data:`ProcessMembers`;
    empty for other files), which :func:`named_as_after` matches to another snapshot's.
    ``group``: the group's name (``describe``'s; None when the file has none). ``tasks``: per
    task, its source partitions, as the file's ``tasks`` table says them (empty without one):
    what tells whether two files, or a file and a topology, name the same tasks.
    ``num_standby_replicas``: the standbys per task the file states (``describe``'s quality,
    ``plan --json``'s metrics; None when it states none). ``departed``: processes whose member
    rows remain but which the ``assignment`` table no longer has (a what-if removed them), with
    the tasks those rows say they ran: a removed process's tasks had an owner that left.
    """

    views: Mapping[str, ClientView]
    state: str | None = None
    reports: tuple[tuple[str, Mapping[TaskId, int]], ...] = ()
    family: str | None = None
    previous_active: Mapping[str, frozenset[TaskId]] = attrs.field(factory=dict)
    protocol: str | None = None
    process_members: ProcessMembers = attrs.field(factory=dict)
    group: str | None = None
    tasks: Mapping[TaskId, frozenset[TopicPartition]] = attrs.field(factory=dict)
    num_standby_replicas: int | None = None
    #: ``describe`` inferred ``num_standby_replicas`` (the most standbys any task had) rather
    #: than being told it with ``--standbys``.
    standbys_inferred: bool = False
    departed: Mapping[str, ClientView] = attrs.field(factory=dict)
    #: The processes ``describe`` counted when it inferred ``num_standby_replicas`` (its
    #: ``quality.clients``; ``plan --json`` passes it on as ``metrics.
    #: num_standby_replicas_processes``). None: the file does not say.
    standbys_inferred_from: int | None = None
    #: Every topic the member rows subscribe to (``describe --json``'s ``members``' ``topics``),
    #: which tells a topic subscribed with no partition assigned; None: the file has no such
    #: rows (``plan --json``) or rows without readable ``topics``.
    subscribed_topics: frozenset[str] | None = None
    #: How many member rows are undecodable with their topics unknown (no subscription read):
    #: a topic only the other file shows may be theirs.
    unknown_subscriptions: int = 0

    def most_standbys(self) -> int:
        """The most standby copies any task has in the file (what ``describe`` infers as the
        group's standbys per task when not told)."""
        copies = Counter(t for v in self.views.values() for t in v.assignment.standby)
        return max(copies.values(), default=0)

    def inferring_processes(self) -> int:
        """How many processes ``describe`` inferred ``num_standby_replicas`` over (it holds at
        most one fewer copies of a task): the count the file states, which a what-if editing
        the member rows or the assignment table leaves as describe saw it; else the processes
        of the member rows, else of the assignment table."""
        if self.standbys_inferred_from is not None:
            return self.standbys_inferred_from
        return len({pid for pid, _ in self.reports}) or len(self.views)

    def local_state(self) -> dict[str, dict[TaskId, int]]:
        """Per process, the tasks it reported state of at its last join (:func:`local_state`)."""
        return local_state(self.reports)

    def handed_back(
        self, acceptable_recovery_lag: int = ACCEPTABLE_RECOVERY_LAG
    ) -> dict[TaskId, str]:
        """Per task, the restarted process the group's leader handed it back to at the last
        rebalance, by the leader's own rule (``streamassign.streams.handed_back``): what
        :func:`explain` takes as ``returned``."""
        return handed_back(
            self.reports, self.previous_active, self.protocol, acceptable_recovery_lag
        )

    def running(self) -> dict[str, frozenset[TaskId]]:
        """Per process, its actives before the last rebalance as its members' last join tells
        them: the tasks it reported running (``LATEST_OFFSET``), and the ``previous_active``
        no process reported running (a restarted process's, as the leader hands them back;
        one another process ran meanwhile counts as that one's)."""
        out = {pid: running_tasks(sums) for pid, sums in local_state(self.reports).items()}
        ran = frozenset().union(*out.values())
        for pid, previous in self.previous_active.items():
            out[pid] = out.get(pid, frozenset()) | (previous - ran)
        return out

    def before_last_join(self) -> dict[str, ClientView]:
        """The assignment before the last rebalance, as far as the members' last join tells
        it: each reporting process with its actives then (:meth:`running`), no capacity and
        no standbys (a previous standby reports its state like any other local state). A
        process that has left since is missing: its tasks had no previous owner."""
        return {
            pid: ClientView(None, ClientAssignment(active=running))
            for pid, running in self.running().items()
        }

    def clients(self) -> list[ClientState]:
        """The processes as the clients of a what-if (``plan --clients``), as they would join
        the next rebalance: each runs its actives now (``prev_active``) and keeps its standbys
        and warmups (``prev_standby``: a warmup reports its state as a standby does); ``lags``
        of the local state it reported at its last join are measured as the leader measures
        them without end offsets, against the task's best reported offset sum (0 for a task it
        reported running and runs no more: it was the task's active then, ahead of any copy).
        A process without a capacity counts as one thread."""
        held = self.local_state()
        # Each member's own report, as the leaders measure (a checkpoint a member holds of a
        # task another member of its process runs still bounds the other copies' lags).
        best = best_offset_sums(sums for _, sums in self.reports)
        clients = []
        for pid, view in sorted(self.views.items()):
            a = view.assignment
            # Against the best reported sum every checkpointed task has a lag (never None).
            measured = local_state_lags(held.get(pid, {}), best, a.active)
            lags = {t: lag for t, lag in measured.items() if lag is not None}
            # A task it ran at its last join and gave up: it reports the checkpoint it closed
            # the task with next time, at least as far as any copy's sum reported at that join.
            lags |= dict.fromkeys(running_tasks(held.get(pid, {})) - a.active, 0)
            clients.append(
                ClientState(pid, view.capacity or 1, a.active, a.standby | a.warmup, lags)
            )
        return clients


def local_state(
    reports: Iterable[tuple[str, Mapping[TaskId, int]]],
) -> dict[str, dict[TaskId, int]]:
    """Per process, the tasks whose state it reported having when it joined: every task of its
    members' ``(process, offset sums)`` reports, a checkpointed sum or ``LATEST_OFFSET`` (it
    ran the task then: :func:`explain` dates that state before counting it), each process
    named getting an entry, its members' reports merged as the leaders merge them
    (``streamassign.streams.merge_offset_sums``: running wins). :func:`explain`'s ``lags``
    (a warm landing or a cold one) for a live group (``describe --watch``) and a saved
    snapshot (``explain``) alike."""
    return merged_reports(reports)


def load_snapshot(data: object, where: str, *, members: bool = True) -> Snapshot:
    """A saved assignment file's contents (see :func:`load_saved` for the ``assignment``
    table). A ``state`` other than Stable is refused: DescribeGroups taken during a rebalance
    or of an empty group returns no assignment (or the previous one's bytes under another
    protocol), so every task would read as removed. ``members`` (``describe --json``'s) give
    the offset sums; members without a process or topics (undecodable, no metadata) are left
    out, as ``describe`` leaves them out of the processes. With ``members`` False they are
    not read at all (no ``reports``): a caller that needs only the assignment (``diff``) does
    not refuse a file for rows it never uses."""
    state = data.get("state") if isinstance(data, dict) else None
    if isinstance(data, dict) and "state" in data and state != STABLE:
        raise AssignmentFileError(
            f"{where}: saved in group state {state!r}, not {STABLE!r} (during a rebalance, or "
            "with no members): it holds no assignment; save one while the group is Stable"
        )
    table = data.get("assignment") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(table, dict):
        raise AssignmentFileError(
            f"{where}: no 'assignment' table (expected plan --json or describe --json output)"
        )
    views = {
        str(pid): _client_view(entry, f"{where}: client {pid!r}") for pid, entry in table.items()
    }
    family, protocol = data.get("family"), data.get("protocol")
    copied = _copied_claimants(data.get("shared_process_ids", []), where) if members else set()
    rows = data.get("members", []) if members else []
    reports, previous, process_members = _reports(rows, copied, where)
    group = data.get("group")
    subscribed, unknown = _subscriptions(data.get("members"))
    return Snapshot(
        views,
        state,
        reports,
        family if isinstance(family, str) else None,
        previous,
        protocol if isinstance(protocol, str) else None,
        process_members,
        group if isinstance(group, str) else None,
        _task_partitions(data.get("tasks", {}), where),
        *_stated_standbys(data),
        _departed(rows, views.keys(), where) if members else {},
        standbys_inferred_from=_inferring_processes(data, where),
        subscribed_topics=subscribed,
        unknown_subscriptions=unknown,
    )


def _task_partitions(table: object, where: str) -> dict[TaskId, frozenset[TopicPartition]]:
    """A file's ``tasks`` table: task id -> ``[[topic, partition], ...]``."""
    problem = f'{where}: tasks must map task ids like "0_3" to lists of [topic, partition]'
    if not isinstance(table, dict):
        raise AssignmentFileError(problem)
    out = {}
    for task, parts in table.items():
        if not isinstance(parts, list) or not all(
            isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and type(p[1]) is int
            for p in parts
        ):
            raise AssignmentFileError(f"{problem}: {task!r}")
        try:
            out[TaskId.parse(str(task))] = frozenset(TopicPartition(t, n) for t, n in parts)
        except ValueError as exc:
            raise AssignmentFileError(f"{problem}: {exc}") from exc
    return out


def _stated_standbys(data: Mapping[str, object]) -> tuple[int | None, bool]:
    """``num_standby_replicas`` as ``describe --json`` (its ``quality``) or ``plan --json``
    (its ``metrics``) states it (None when neither does: a hand-written file), and whether
    ``describe`` inferred it. Read leniently: a file is not refused for a score it only
    reports."""
    for key in ("quality", "metrics"):
        table = data.get(key)
        count = table.get("num_standby_replicas") if isinstance(table, dict) else None
        if type(count) is int and count >= 0:
            assert isinstance(table, dict)
            return count, table.get("num_standby_replicas_inferred") is True
    return None, False


#: Kafka's ``group.max.size`` is an int, so a group holds at most this many members, and a
#: process has at least one: a larger count is not one describe made.
_MOST_PROCESSES = 2**31 - 1


def _inferring_processes(data: Mapping[str, object], where: str) -> int | None:
    """The processes ``describe`` counted (``describe --json``'s ``quality.clients``, which
    ``plan --json`` passes on as ``metrics.num_standby_replicas_processes``: its own
    ``metrics.clients`` are the plan's). Absent, null or 0 (none counted): the file does not
    say, as a file saved before the key. Any other value that is not a count of processes
    raises ``AssignmentFileError``: taken as given, or ignored, it would decide silently
    whether the what-if's standby cap note is shown."""
    for key, name in (("quality", "clients"), ("metrics", "num_standby_replicas_processes")):
        table = data.get(key)
        count = table.get(name) if isinstance(table, dict) else None
        if count is None or (type(count) is int and count == 0):
            continue
        if type(count) is not int or not 0 < count <= _MOST_PROCESSES:
            shown = json.dumps(count)  # as the file spells it (true, not True)
            shown = shown if len(shown) <= 40 else f"{shown[:37]}..."
            raise AssignmentFileError(
                f"{where}: {key}.{name} is {shown}, not a count of processes (a whole "
                f"number from 0 to {_MOST_PROCESSES:,}, or null)"
            )
        return count
    return None


def _subscription_rows(members: object) -> list[dict[str, Any]] | None:
    """A file's ``members`` rows when each has a list of topic names (``describe --json``'s),
    else None, as when there are none (a Stable group has members: a hand-written file).
    Read leniently, as :func:`_stated_standbys`: only a note's wording depends on them, so
    ``diff`` reads them too and a damaged row refuses no file."""
    if (
        not isinstance(members, list)
        or not members
        or not all(
            isinstance(row, dict)
            and isinstance(row.get("topics"), list)
            and all(isinstance(topic, str) for topic in row["topics"])
            for row in members
        )
    ):
        return None
    return members


def _subscriptions(members: object) -> tuple[frozenset[str] | None, int]:
    """:attr:`Snapshot.subscribed_topics` and :attr:`Snapshot.unknown_subscriptions` of a
    file's ``members``, its rows read once."""
    rows = _subscription_rows(members)
    if rows is None:
        return None, 0
    unknown = sum(1 for row in rows if row.get("undecodable") and not row["topics"])
    return frozenset(t for row in rows for t in row["topics"]), unknown


def _departed(members: object, present: Collection[str], where: str) -> dict[str, ClientView]:
    """Per process named by member rows (``describe --json``'s ``members``) but missing from the
    ``assignment`` table, the actives and standbys its rows say it ran."""
    out: dict[str, ClientAssignment] = {}
    for n, member in enumerate(members if isinstance(members, list) else [], 1):
        pid = member.get("process") if isinstance(member, dict) else None
        if not isinstance(pid, str) or pid in present or member.get("undecodable"):
            continue
        label = f"{where}: member #{n}"
        ran = ClientAssignment(
            _task_ids(member.get("active", []), f"{label}: active"),
            _task_ids(member.get("standby", []), f"{label}: standby"),
        )
        had = out.get(pid, ClientAssignment())
        out[pid] = ClientAssignment(had.active | ran.active, had.standby | ran.standby)
    return {pid: ClientView(None, a) for pid, a in out.items()}


def _copied_claimants(clashes: object, where: str) -> set[str]:
    """The members of a ``describe --json`` file's ``shared_process_ids`` (optional: files
    saved before it lack it): ``streamassign.streams.copied_claimants`` as ``describe`` found
    them, the members whose ``previous_active`` the leaders ignore."""
    problem = (
        f"{where}: shared_process_ids must be a list of tables with a list of member ids "
        '("members")'
    )
    if not isinstance(clashes, list):
        raise AssignmentFileError(problem)
    copied: set[str] = set()
    for clash in clashes:
        ids = clash.get("members") if isinstance(clash, dict) else None
        if not isinstance(ids, list) or not all(isinstance(m, str) for m in ids):
            raise AssignmentFileError(problem)
        copied.update(ids)
    return copied


def _reports(
    members: object, copied: Collection[str], where: str
) -> tuple[
    tuple[tuple[str, Mapping[TaskId, int]], ...],
    dict[str, frozenset[TaskId]],
    dict[str, frozenset[tuple[str, str]]],
]:
    """``(process, offset sums)`` of each described member of a ``describe --json`` file; per
    process the ``previous_active`` its members declared (optional: older files lack it), but
    for the ``copied`` members' (their claims are a copied state directory's, which the
    leaders ignore: ``streamassign.streams.copied_claimants``); and per process its members'
    ids and endpoints (:data:`ProcessMembers`; a row without a member id tells none)."""
    if not isinstance(members, list):
        raise AssignmentFileError(f"{where}: members must be a list")
    reports = []
    previous: dict[str, frozenset[TaskId]] = {}
    process_members: dict[str, frozenset[tuple[str, str]]] = {}
    for n, member in enumerate(members, 1):
        if not isinstance(member, dict):
            raise AssignmentFileError(f"{where}: member #{n}: expected a table")
        pid = member.get("process")
        if not isinstance(pid, str) or not member.get("topics") or member.get("undecodable"):
            continue
        label = f"{where}: member #{n}"
        reports.append((pid, _offset_sums(member.get("offset_sums", {}), label)))
        ran = _task_ids(member.get("previous_active", []), f"{label}: previous_active")
        if member.get("member_id") in copied:
            ran = frozenset()
        previous[pid] = previous.get(pid, frozenset()) | ran
        member_id, endpoint = member.get("member_id"), member.get("endpoint")
        if not isinstance(member_id, str | None) or not isinstance(endpoint, str | None):
            # A wrong type is a damaged file (describe writes strings): say so, not guess.
            raise AssignmentFileError(f"{label}: member_id and endpoint must be strings")
        if member_id is not None:  # hand-written rows may leave it out: they tell nothing
            named = (member_id, endpoint or "")
            process_members[pid] = process_members.get(pid, frozenset()) | {named}
    return tuple(reports), previous, process_members


def _offset_sums(sums: object, label: str) -> dict[TaskId, int]:
    problem = f'{label}: offset_sums must map task ids like "0_3" to ints'
    if not isinstance(sums, dict) or not all(type(s) is int for s in sums.values()):
        raise AssignmentFileError(problem)
    try:
        return {TaskId.parse(str(t)): s for t, s in sums.items()}
    except ValueError as exc:
        raise AssignmentFileError(f"{problem}: {exc}") from exc


def _client_view(entry: object, label: str) -> ClientView:
    if not isinstance(entry, dict):
        raise AssignmentFileError(f"{label}: expected a table, got {type(entry).__name__}")
    capacity = entry.get("capacity")
    if capacity is not None and (type(capacity) is not int or capacity < 1):
        raise AssignmentFileError(f"{label}: capacity must be an int >= 1, got {capacity!r}")
    sets = [
        _task_ids(entry.get(kind, []), f"{label}: {kind}")
        for kind in ("active", "standby", "warmup")
    ]
    return ClientView(capacity, ClientAssignment(*sets))


def _task_ids(ids: object, label: str) -> frozenset[TaskId]:
    if not isinstance(ids, list) or not all(isinstance(t, str) for t in ids):
        raise AssignmentFileError(f'{label} must be a list of task ids like "0_3"')
    try:
        return frozenset(TaskId.parse(t) for t in ids)
    except ValueError as exc:
        raise AssignmentFileError(f"{label}: {exc}") from exc
