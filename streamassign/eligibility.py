"""Per-subtopology eligibility of clients in a mixed-topology-version group (a rolling deploy).

The assignors know nothing of topology versions: they balance every task over every client.
A client whose process announced (protocol version 3) for subtopology ``s`` source topics that
lack one of the leader's, or none, would refuse the tasks of ``s`` (its member guard: some of
their partitions are not its own task's; it may not even subscribe to them), and they would
make no progress there. So after the assignor, a post-pass moves those actives to eligible
clients and drops standbys and warmups of them on ineligible clients, then puts the group back
in shape: no load peak stacked by the moves (a cap per client), standbys of the touched tasks
topped up on eligible clients. The assignors stay untouched; with no process lacking a topic
there the post-pass returns the assignor's output itself (a strict no-op).

A client is eligible for an id when one of its members may run it: members of one client
differ only when processes of two topology versions share one process id without distinct
endpoints (a copied state directory); the thread split (``threads.distribute_to_threads``)
then gives the id's tasks to such members only.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import attrs

from ._ids import TaskId
from .assignment import ClientAssignment, ClientState

__all__ = [
    "GroupEligibility",
    "MemberReading",
    "group_eligibility",
    "ineligible_subtopologies",
    "member_ineligible_subtopologies",
    "move_to_eligible_clients",
    "subscribed_ineligible_subtopologies",
]


@attrs.frozen
class MemberReading:
    """One member as the group leader reads it for eligibility: the process its tasks go to
    (as the caller groups members), its subscribed topics, and its announcement as the leader
    reads it (per id of the leader's, its source topics; ``{}``: only ids the leader lacks;
    None: it announces none, or the leader reads no announcements, below protocol 3)."""

    process: str
    topics: frozenset[str]
    announced: Mapping[int, frozenset[str]] | None = None


@attrs.frozen
class GroupEligibility:
    """What :func:`group_eligibility` decides for one group."""

    #: The members the leader may give tasks, by member id.
    may_get_tasks: frozenset[str]
    #: Per member that may get tasks, the ids it must not run
    #: (:func:`member_ineligible_subtopologies`): the thread split's input.
    refused: Mapping[str, frozenset[int]]
    #: Per process, the ids it gets no task of: none of its members that may get tasks may
    #: run them (:func:`ineligible_subtopologies`); every id of a blind process. Processes
    #: with none are left out.
    withheld: Mapping[str, frozenset[int]]
    #: The processes none of whose members may get tasks, in the order members came.
    blind: tuple[str, ...]


def group_eligibility(
    own: Mapping[int, frozenset[str]], members: Mapping[str, MemberReading]
) -> GroupEligibility:
    """Which of ``members`` (member id -> its reading) a leader whose topology is ``own``
    (id -> its source topics) may give tasks, and which ids each process gets none of. A
    member announcing a topology may get tasks (the post-pass and the thread split keep every
    task off it whose topics it does not announce for that id, and so every topic it does not
    subscribe to: the announced topics are among its subscribed ones). A member announcing
    none (protocol 1-2, an older release) may get tasks when it subscribes to one of the
    leader's source topics: its subscription is its announcement, so it is refused the ids
    whose topics it does not all subscribe to (:func:`subscribed_ineligible_subtopologies`);
    one subscribing to none of them is blind. The one rule of the group leader
    (``streams.assign_streams``) and of ``describe``, which reads it back."""
    sources = frozenset().union(*own.values())
    refused: dict[str, frozenset[int]] = {}
    by_process: dict[str, list[frozenset[int]]] = {}
    # The leader resolves each announcement once a round, so members of one topology version
    # share one ``announced`` object: its ids are worked out once. The memo holds each object
    # it keys by ``id``, so no other takes that id during the call, even from a mapping that
    # makes its readings on demand and frees each after use. Members announcing none are
    # keyed by their subscription instead (a frozenset: held by the key itself).
    by_announcement: dict[object, tuple[object, frozenset[int]]] = {}
    for member, reading in members.items():
        ids = by_process.setdefault(reading.process, [])
        if reading.announced is None and sources and not sources & reading.topics:
            continue
        key: object = id(reading.announced) if reading.announced is not None else reading.topics
        if key not in by_announcement:
            ineligible = (
                member_ineligible_subtopologies(own, reading.announced)
                if reading.announced is not None
                else subscribed_ineligible_subtopologies(own, reading.topics)
            )
            by_announcement[key] = (reading.announced, ineligible)
        refused[member] = by_announcement[key][1]
        ids.append(refused[member])
    blind = tuple(p for p, ids in by_process.items() if not ids)
    withheld = ineligible_subtopologies({p: ids for p, ids in by_process.items() if ids})
    withheld.update(dict.fromkeys(blind, frozenset(own)))
    return GroupEligibility(frozenset(refused), refused, withheld, blind)


def subscribed_ineligible_subtopologies(
    own: Mapping[int, frozenset[str]], subscribed: frozenset[str]
) -> frozenset[int]:
    """The leader's ids (``own``: id -> its source topics) that a member announcing no
    topology (protocol 1-2, an older release) must not get tasks of: those reading a topic it
    does not subscribe to (``subscribed``). Its consumer could not take their partitions, and
    they are most likely a topic added in the leader's version. The ids whose topics it does
    subscribe to are trusted: the leader cannot tell an id reused for another subtopology
    there, and the member's guard refuses those tasks (``versions.mismatched_tasks``), as for
    an old member subscribing to every source topic."""
    return frozenset(sub for sub, topics in own.items() if not topics <= subscribed)


def member_ineligible_subtopologies(
    own: Mapping[int, frozenset[str]], announced: Mapping[int, frozenset[str]] | None
) -> frozenset[int]:
    """The leader's subtopology ids (``own``: id -> its source topics) that one member must
    not get tasks of: ids for which it announced (``announced``: its id -> topics, only the
    leader's ids) source topics that do not include all of the leader's, or none. The member
    guard's subset rule (``versions.mismatched_tasks``): a member whose id reads more topics
    (a topic added there) runs the leader's task with the partitions it is given. A member
    announcing nothing (None: protocol 1-2, an older release) makes no id ineligible here:
    :func:`group_eligibility` reads its subscription instead
    (:func:`subscribed_ineligible_subtopologies`). An empty ``announced`` is a member
    announcing only ids the leader does not have: every id is ineligible."""
    if announced is None:
        return frozenset()
    return frozenset(
        sub for sub, topics in own.items() if not topics <= announced.get(sub, frozenset())
    )


def ineligible_subtopologies(
    by_member: Mapping[str, Sequence[frozenset[int]]],
) -> dict[str, frozenset[int]]:
    """Per client, the ids none of its members may run (``by_member``: per client, each
    member's :func:`member_ineligible_subtopologies`): the ids the client must not get tasks
    of. A client whose members differ (one process id shared by processes of two topology
    versions, a copied state directory) may get an id some member runs; the thread split
    then gives its tasks to such members only. Clients with none are left out."""
    out = {}
    for client, members in by_member.items():
        common = frozenset.intersection(*members) if members else frozenset()
        if common:
            out[client] = common
    return out


def move_to_eligible_clients(
    per_client: dict[str, ClientAssignment],
    ineligible: Mapping[str, frozenset[int]],
    clients: Sequence[ClientState],
    num_standbys: int = 0,
    stateful: Collection[TaskId] = frozenset(),
    cold_give_back: bool = True,
) -> dict[str, ClientAssignment]:
    """``per_client`` with every active a client is ineligible for moved to an eligible one,
    its standbys and warmups of such tasks dropped, and the group put back in shape:

    1. each moved active goes to an eligible client holding its state while that one is under
       its fair share of actives (:func:`_fair_shares`), else to the least loaded eligible one;
    2. clients the moves left above their share give actives back to the clients that lost
       some, of ids those may hold (:func:`_give_back`): the moves stack no peak. Without
       ``cold_give_back`` (high availability: actives move only onto state), only stateless
       tasks and tasks whose state the taker holds are given back;
    3. every stateful task the pass touched gets standbys on eligible clients up to
       ``num_standbys``, or as many as such clients allow (:func:`_top_up_standbys`).

    ``per_client`` itself when nothing is ineligible (a strict no-op). A task no client is
    eligible for stays where the assignor put it (its member refuses it, as without the
    post-pass)."""
    if not any(ineligible.get(c) for c in per_client):
        return per_client
    placement, moving = _Placement.stripped(per_client, ineligible, clients, stateful)
    caps = _fair_shares(per_client, placement, sum(len(a.active) for a in per_client.values()))
    by_share = _ClientHeaps.of(placement, lambda c: (placement.active_share(c),))
    for task, source in sorted(moving):
        target = _active_target(placement, task, caps, by_share) or source
        placement.move_active(task, None, target)
        by_share.refresh(target, placement.ineligible.get(target, frozenset()))
    actives_before = {c: len(a.active) for c, a in per_client.items()}
    _give_back(placement, actives_before, caps, cold_give_back)
    load_caps = _fair_shares(per_client, placement, sum(a.load for a in per_client.values()))
    touched = sorted(placement.touched & placement.stateful)
    _top_up_standbys(placement, touched, num_standbys, load_caps)
    return placement.frozen()


@attrs.define
class _Placement:
    """The post-pass's working copy of one assignment: each client's tasks as sets, the
    clients' states, the ids each is ineligible for, the tasks with state, the tasks the
    pass moved or stripped a copy of (``touched``), and per task the clients holding its
    state (``holders``, sorted: every choice then sees them in one order)."""

    active: dict[str, set[TaskId]]
    standby: dict[str, set[TaskId]]
    warmup: dict[str, set[TaskId]]
    states: dict[str, ClientState]
    ineligible: Mapping[str, frozenset[int]]
    stateful: frozenset[TaskId]
    touched: set[TaskId] = attrs.field(factory=set)
    holders: dict[TaskId, list[str]] = attrs.field(factory=dict)

    @classmethod
    def stripped(
        cls,
        per_client: Mapping[str, ClientAssignment],
        ineligible: Mapping[str, frozenset[int]],
        clients: Sequence[ClientState],
        stateful: Collection[TaskId],
    ) -> tuple[_Placement, list[tuple[TaskId, str]]]:
        """The assignment without any task on a client ineligible for it, and the actives
        taken off (task, the client it was on)."""
        states = {c.process_id: c for c in clients}
        placement = cls({}, {}, {}, states, ineligible, frozenset(stateful))
        moving: list[tuple[TaskId, str]] = []
        for client, given in sorted(per_client.items()):
            ids = ineligible.get(client, frozenset())
            placement.active[client] = {t for t in given.active if t.subtopology not in ids}
            placement.standby[client] = {t for t in given.standby if t.subtopology not in ids}
            placement.warmup[client] = {t for t in given.warmup if t.subtopology not in ids}
            moving += [(t, client) for t in sorted(given.active - placement.active[client])]
            placement.touched |= {
                t for t in given.active | given.standby | given.warmup if t.subtopology in ids
            }
            state = states.get(client)
            held = () if state is None else {*state.prev_active, *state.prev_standby, *state.lags}
            for task in held:
                placement.holders.setdefault(task, []).append(client)
        return placement, moving

    def may_hold(self, client: str, task: TaskId) -> bool:
        """Whether ``client`` is eligible for ``task``."""
        return task.subtopology not in self.ineligible.get(client, ())

    def capacity(self, client: str) -> int:
        state = self.states.get(client)
        return state.capacity if state is not None else 1

    def active_share(self, client: str, extra: int = 0) -> float:
        """Actives per consumer on ``client`` (with ``extra`` more)."""
        return (len(self.active[client]) + extra) / self.capacity(client)

    def load(self, client: str) -> int:
        """Actives, standbys and warmups on ``client``."""
        return len(self.active[client]) + len(self.standby[client]) + len(self.warmup[client])

    def load_share(self, client: str) -> float:
        """Actives, standbys and warmups per consumer on ``client``."""
        return self.load(client) / self.capacity(client)

    def holds_state(self, client: str, task: TaskId) -> bool:
        state = self.states.get(client)
        return state is not None and state.has_state(task)

    def ran(self, client: str, task: TaskId) -> bool:
        state = self.states.get(client)
        return state is not None and task in state.prev_active

    def copies(self, tasks: Collection[TaskId]) -> dict[TaskId, set[str]]:
        """Per task of ``tasks``, the clients holding it as active, standby or warmup."""
        wanted = set(tasks)
        out: dict[TaskId, set[str]] = {t: set() for t in wanted}
        for held in (self.active, self.standby, self.warmup):
            for client, client_tasks in held.items():
                for task in client_tasks & wanted:
                    out[task].add(client)
        return out

    def move_active(self, task: TaskId, source: str | None, target: str) -> None:
        """``task``'s active from ``source`` (None: taken off already) to ``target``, where a
        standby or warmup of it becomes the active."""
        if source is not None:
            self.active[source].discard(task)
        self.standby[target].discard(task)
        self.warmup[target].discard(task)
        self.active[target].add(task)
        self.touched.add(task)

    def frozen(self) -> dict[str, ClientAssignment]:
        return {
            c: ClientAssignment(
                frozenset(self.active[c]), frozenset(self.standby[c]), frozenset(self.warmup[c])
            )
            for c in self.active
        }


def _fair_shares(
    per_client: Mapping[str, ClientAssignment], placement: _Placement, copies: int
) -> dict[str, int]:
    """Each client's fair share of ``copies`` (tasks, or actives, standbys and warmups) in
    proportion to its consumers, rounded up: the most a client takes for holding a task's
    state, and for actives the line above which it gives some back."""
    consumers = sum(placement.capacity(c) for c in per_client)
    return {c: math.ceil(copies * placement.capacity(c) / consumers) for c in per_client}


def _active_target(
    placement: _Placement, task: TaskId, caps: Mapping[str, int], by_share: _ClientHeaps
) -> str | None:
    """The eligible client to take ``task``: one holding its state (no restore from the
    changelog) while under its cap, else the fewest actives per consumer (a state holder
    first among equals); ties to the smallest key, so every leader picks the same. None: no
    client is eligible. ``by_share`` finds the least loaded non-holder without a scan."""
    holders = [c for c in placement.holders.get(task, ()) if placement.may_hold(c, task)]
    under_cap = [c for c in holders if len(placement.active[c]) < caps[c]]
    if under_cap:
        return min(under_cap, key=lambda c: (placement.active_share(c), c))
    return min(
        holders + by_share.least(task.subtopology),
        key=lambda c: (placement.active_share(c), not placement.holds_state(c, task), c),
        default=None,
    )


def _give_back(
    placement: _Placement,
    actives_before: Mapping[str, int],
    caps: Mapping[str, int],
    cold_give_back: bool,
) -> None:
    """While a client above its cap and above its actives before the pass has more actives
    per consumer than a client below its actives before the pass would have with one more,
    move one there: from the busiest such giver, the move :func:`_best_give_back` picks. Each
    move fills a taker's gap, so this ends; it moves no more actives than the pass took off.
    A giver with no move now never gets one (its tasks and the takers' gaps only shrink), so
    it leaves the queue: each move costs a few takers, not every (giver, taker, task)."""
    active = placement.active

    def gives(client: str) -> bool:
        return len(active[client]) > max(caps[client], actives_before[client])

    takers = _Takers(
        {c: placement.active_share(c) for c in active if len(active[c]) < actives_before[c]}
    )
    givers = [c for c in active if gives(c)]
    tasks = (
        {g: _GiverTasks.of(placement, g, takers.shares) for g in givers} if takers.shares else {}
    )
    queue = [(-placement.active_share(g), g) for g in tasks]
    heapq.heapify(queue)
    while queue:
        _, giver = heapq.heappop(queue)
        move = _best_give_back(placement, tasks[giver], giver, takers, cold_give_back)
        if move is None:
            continue
        task, taker = move
        placement.move_active(task, giver, taker)
        still = len(active[taker]) < actives_before[taker]
        takers.update(taker, placement.active_share(taker) if still else None)
        if gives(giver):
            heapq.heappush(queue, (-placement.active_share(giver), giver))


@attrs.define
class _Takers:
    """The clients below their actives before the pass, with their actives per consumer,
    also as a list sorted on (share, client): the order a giver prefers them in."""

    shares: dict[str, float]
    ordered: list[tuple[float, str]] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.ordered = sorted((share, c) for c, share in self.shares.items())

    def update(self, client: str, share: float | None) -> None:
        """``client``'s new share, or None: it takes no more."""
        del self.ordered[bisect.bisect_left(self.ordered, (self.shares.pop(client), client))]
        if share is not None:
            self.shares[client] = share
            bisect.insort(self.ordered, (share, client))


def _best_give_back(
    placement: _Placement,
    tasks: _GiverTasks,
    giver: str,
    takers: _Takers,
    cold_give_back: bool,
) -> tuple[TaskId, str] | None:
    """The (task, taker) ``giver`` gives back next, or None: it has no move. The taker must
    end with fewer actives per consumer than the giver has; the task one of an id the taker
    may run (and, without ``cold_give_back``, one that restores nothing there). Of those: one
    that restores nothing first (a stateless task, or state the taker holds), then to the
    least busy taker, then of a task the giver did not run before, then the smallest. So the
    first taker in (share, client) order with a fitting task wins: only the takers holding
    the giver's tasks' state are looked at for one that restores nothing, unless the giver
    has stateless tasks."""
    share = placement.active_share(giver)
    live = placement.active[giver]
    by_ids: dict[frozenset[int], tuple[bool, _Ranked] | None] = {}  # takers with no warm heap

    def fitting(taker: str) -> tuple[bool, _Ranked] | None:
        if share <= (len(placement.active[taker]) + 1) / placement.capacity(taker):
            return None
        ids = placement.ineligible.get(taker, frozenset())
        if taker in tasks.warm:
            return tasks.best(live, taker, ids)
        if ids not in by_ids:
            by_ids[ids] = tasks.best(live, taker, ids)
        return by_ids[ids]

    if tasks.has_stateless(live):
        warm = takers.ordered
    else:
        warm = sorted((takers.shares[t], t) for t in tasks.warm if t in takers.shares)
    for _, taker in warm:
        if (found := fitting(taker)) is not None and not found[0]:
            return found[1][1], taker
    for _, taker in takers.ordered if cold_give_back else ():
        if (found := fitting(taker)) is not None:
            return found[1][1], taker
    return None


_Ranked = tuple[bool, TaskId]  # (the giver ran it, the task): the order a giver gives in


@attrs.define
class _GiverTasks:
    """One giver's actives as heaps on :data:`_Ranked`, per subtopology: its stateless
    tasks, all its tasks, and per taker the stateful tasks whose state that taker holds. A
    giver only loses tasks in the give-back, so an entry no longer among its actives is
    stale for good and dropped when it surfaces."""

    stateless: dict[int, list[_Ranked]] = attrs.field(factory=dict)
    every: dict[int, list[_Ranked]] = attrs.field(factory=dict)
    warm: dict[str, list[_Ranked]] = attrs.field(factory=dict)

    @classmethod
    def of(cls, placement: _Placement, giver: str, takers: Collection[str]) -> _GiverTasks:
        tasks = cls()
        for task in placement.active[giver]:
            ranked = (placement.ran(giver, task), task)
            tasks.every.setdefault(task.subtopology, []).append(ranked)
            if task not in placement.stateful:
                tasks.stateless.setdefault(task.subtopology, []).append(ranked)
                continue
            for taker in placement.holders.get(task, ()):
                if taker in takers and placement.may_hold(taker, task):
                    tasks.warm.setdefault(taker, []).append(ranked)
        for heap in [*tasks.stateless.values(), *tasks.every.values(), *tasks.warm.values()]:
            heapq.heapify(heap)
        return tasks

    def has_stateless(self, live: Collection[TaskId]) -> bool:
        return any(_first_live(h, live) is not None for h in self.stateless.values())

    def best(
        self, live: Collection[TaskId], taker: str, ids: Collection[int]
    ) -> tuple[bool, _Ranked] | None:
        """The first task of ids not in ``ids`` to give ``taker``, and whether it restores
        there: one that restores nothing if any, else any (None: no task of those ids)."""
        heaps = [h for s, h in self.stateless.items() if s not in ids]
        warm = [_first_live(h, live) for h in [*heaps, self.warm.get(taker, [])]]
        if found := [r for r in warm if r is not None]:
            return False, min(found)
        cold = [_first_live(h, live) for s, h in self.every.items() if s not in ids]
        found = [r for r in cold if r is not None]
        return (True, min(found)) if found else None


def _first_live(heap: list[_Ranked], live: Collection[TaskId]) -> _Ranked | None:
    """The least entry of ``heap`` whose task is in ``live``; dead ones above it popped."""
    while heap and heap[0][1] not in live:
        heapq.heappop(heap)
    return heap[0] if heap else None


@attrs.define
class _ClientHeaps:
    """The clients grouped by the ids they are ineligible for, each group a min-heap on
    (``key``, client), for keys that only grow during the pass (copies are only added): the
    least eligible client in O(groups * log clients) rather than a scan. After a client's key
    grows, :meth:`refresh` it; outdated entries are dropped when they surface."""

    key: Callable[[str], tuple[Any, ...]]
    groups: dict[frozenset[int], list[tuple[tuple[Any, ...], str]]]

    @classmethod
    def of(cls, placement: _Placement, key: Callable[[str], tuple[Any, ...]]) -> _ClientHeaps:
        groups: dict[frozenset[int], list[tuple[tuple[Any, ...], str]]] = {}
        for client in placement.active:
            ids = placement.ineligible.get(client, frozenset())
            groups.setdefault(ids, []).append((key(client), client))
        for heap in groups.values():
            heapq.heapify(heap)
        return cls(key, groups)

    def refresh(self, client: str, ids: frozenset[int]) -> None:
        heapq.heappush(self.groups[ids], (self.key(client), client))

    def least(self, subtopology: int, count: int = 1, skip: Collection[str] = ()) -> list[str]:
        """The ``count`` eligible clients for ``subtopology`` with the least (key, client),
        none in ``skip``, least first (fewer if there are not as many)."""
        found: list[tuple[tuple[Any, ...], str]] = []
        for ids, heap in self.groups.items():
            if subtopology in ids:
                continue
            popped: list[tuple[tuple[Any, ...], str]] = []
            kept = 0
            while heap and kept < count:
                entry = heapq.heappop(heap)
                if entry[0] == self.key(entry[1]):  # else outdated: dropped for good
                    popped.append(entry)
                    kept += entry[1] not in skip
            found += [e for e in popped if e[1] not in skip]
            for entry in popped:
                heapq.heappush(heap, entry)
        return [client for _, client in sorted(found)[:count]]


def _top_up_standbys(
    placement: _Placement,
    tasks: Sequence[TaskId],
    num_standbys: int,
    load_caps: Mapping[str, int],
) -> None:
    """Each of ``tasks`` with standbys up to ``num_standbys`` on eligible clients that hold no
    copy of it (:func:`_standby_target`)."""

    def by_load(client: str) -> tuple[bool, bool, float]:
        load, cap = placement.load(client), load_caps[client]
        return load > cap, load >= cap, placement.load_share(client)

    heaps = _ClientHeaps.of(placement, by_load)
    standbys = Counter(t for held in placement.standby.values() for t in held)
    copies = placement.copies(tasks)
    for task in tasks:
        holding = copies[task]
        wanted = num_standbys - standbys[task]
        for chosen in _standby_targets(placement, task, wanted, heaps, holding, load_caps):
            placement.standby[chosen].add(task)
            heaps.refresh(chosen, placement.ineligible.get(chosen, frozenset()))


def _standby_targets(
    placement: _Placement,
    task: TaskId,
    wanted: int,
    heaps: _ClientHeaps,
    holding: Collection[str],
    load_caps: Mapping[str, int],
) -> list[str]:
    """The (at most ``wanted``) eligible clients without a copy of ``task`` (none in
    ``holding``) to get a standby of it: ones not over their fair share of copies
    (``load_caps``) first (a holder of every task's state would otherwise take them all),
    then ones holding the task's state (caught up sooner; and a standby placed where no
    state is makes a new holder, which the next rounds' choices follow: churn), then ones
    under their share, then the fewest copies per consumer, then the smallest key. Picked at
    once: a standby changes only its own client's rank, and that client is then out. Rack
    tags are not looked at (the assignor's rack-aware placement is kept where the pass
    touched nothing)."""
    if wanted <= 0:
        return []
    holders = [
        c
        for c in placement.holders.get(task, ())
        if placement.may_hold(c, task) and c not in holding
    ]

    def rank(client: str) -> tuple[bool, bool, bool, float, str]:
        load, cap = placement.load(client), load_caps[client]
        held = placement.holds_state(client, task)
        return load > cap, not held, load >= cap, placement.load_share(client), client

    candidates = set(holders + heaps.least(task.subtopology, wanted, holding))
    return sorted(candidates, key=rank)[:wanted]
