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
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

import attrs

from ._ids import TaskId
from .assignment import ClientAssignment, ClientState

__all__ = ["ineligible_subtopologies", "move_to_eligible_clients"]


def ineligible_subtopologies(
    own: Mapping[int, frozenset[str]],
    announced: Mapping[str, Sequence[Mapping[int, frozenset[str]]]],
) -> dict[str, frozenset[int]]:
    """Per client, the leader's subtopology ids (``own``: id -> its source topics) that it must
    not get tasks of: ids for which one of its members announced source topics (``announced``:
    per client, each member's id -> topics) that do not include all of the leader's, or none.
    The member guard's subset rule (``versions.mismatched_tasks``): a client whose id reads
    more topics (a topic added there) runs the leader's task with the partitions it is given.
    A member announcing nothing (protocol 1-2, an older release) makes no id ineligible: the
    leader cannot tell, and its member guard still acts. Clients with none are left out."""
    out = {}
    for client, members_sources in announced.items():
        differing = {
            sub
            for theirs in members_sources
            if theirs
            for sub, topics in own.items()
            if not topics <= theirs.get(sub, frozenset())
        }
        if differing:
            out[client] = frozenset(differing)
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
    for task, source in sorted(moving):
        placement.move_active(task, None, _active_target(placement, task, caps) or source)
    actives_before = {c: len(a.active) for c, a in per_client.items()}
    _give_back(placement, actives_before, caps, cold_give_back)
    load_caps = _fair_shares(per_client, placement, sum(a.load for a in per_client.values()))
    touched = sorted(placement.touched & placement.stateful)
    _top_up_standbys(placement, touched, num_standbys, load_caps)
    return placement.frozen()


@attrs.define
class _Placement:
    """The post-pass's working copy of one assignment: each client's tasks as sets, the
    clients' states, the ids each is ineligible for, the tasks with state, and the tasks the
    pass moved or stripped a copy of (``touched``)."""

    active: dict[str, set[TaskId]]
    standby: dict[str, set[TaskId]]
    warmup: dict[str, set[TaskId]]
    states: dict[str, ClientState]
    ineligible: Mapping[str, frozenset[int]]
    stateful: frozenset[TaskId]
    touched: set[TaskId] = attrs.field(factory=set)

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
        return placement, moving

    def eligible(self, task: TaskId) -> list[str]:
        """The clients that may hold ``task`` (sorted: deterministic)."""
        return [
            c for c in sorted(self.active) if task.subtopology not in self.ineligible.get(c, ())
        ]

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

    def restores_on(self, client: str, task: TaskId) -> bool:
        """Whether ``task``'s active on ``client`` would restore its state from the changelog
        from scratch (a stateful task whose state ``client`` does not hold)."""
        return task in self.stateful and not self.holds_state(client, task)

    def ran(self, client: str, task: TaskId) -> bool:
        state = self.states.get(client)
        return state is not None and task in state.prev_active

    def has_copy(self, client: str, task: TaskId) -> bool:
        """Whether ``client`` holds ``task`` as active, standby or warmup (one copy each)."""
        return any(task in held[client] for held in (self.active, self.standby, self.warmup))

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


def _active_target(placement: _Placement, task: TaskId, caps: Mapping[str, int]) -> str | None:
    """The eligible client to take ``task``: one holding its state (no restore from the
    changelog) while under its cap, else the fewest actives per consumer (a state holder
    first among equals); ties to the smallest key, so every leader picks the same. None: no
    client is eligible."""
    eligible = placement.eligible(task)
    holders = [
        c for c in eligible if placement.holds_state(c, task) and len(placement.active[c]) < caps[c]
    ]
    if holders:
        return min(holders, key=lambda c: (placement.active_share(c), c))
    return min(
        eligible,
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
    move one there (:func:`_next_give_back`). Each move fills a taker's gap, so this ends;
    it moves no more actives than the pass took off."""
    while move := _next_give_back(placement, actives_before, caps, cold_give_back):
        task, giver, taker = move
        placement.move_active(task, giver, taker)


def _next_give_back(
    placement: _Placement,
    actives_before: Mapping[str, int],
    caps: Mapping[str, int],
    cold_give_back: bool,
) -> tuple[TaskId, str, str] | None:
    """The next (task, giver, taker) of :func:`_give_back`, or None: nothing to give back.
    The giver is the busiest; the task one of an id the taker may run (and, without
    ``cold_give_back``, one that restores nothing there). Of those moves: one that restores
    nothing first (a stateless task, or state the taker holds), then to the least busy
    taker, then of a task the giver did not run before."""
    active = placement.active
    givers = [c for c in active if len(active[c]) > max(caps[c], actives_before[c])]
    takers = [c for c in active if len(active[c]) < actives_before[c]]
    for giver in sorted(givers, key=lambda c: (-placement.active_share(c), c)):
        moves = [
            (
                placement.restores_on(taker, task),
                placement.active_share(taker),
                taker,
                placement.ran(giver, task),
                task,
            )
            for taker in takers
            if placement.active_share(giver) > placement.active_share(taker, extra=1)
            for task in active[giver]
            if taker in placement.eligible(task)
            and (cold_give_back or not placement.restores_on(taker, task))
        ]
        if moves:
            _, _, taker, _, task = min(moves)
            return task, giver, taker
    return None


def _top_up_standbys(
    placement: _Placement,
    tasks: Sequence[TaskId],
    num_standbys: int,
    load_caps: Mapping[str, int],
) -> None:
    """Each of ``tasks`` with standbys up to ``num_standbys`` on eligible clients that hold no
    copy of it: one holding the task's state first (caught up sooner; and a standby placed
    where no state is makes a new holder, which the next rounds' choices follow: churn),
    then one under its fair share of copies (``load_caps``), then the fewest copies per
    consumer, then the smallest key. Rack tags are not looked at (the assignor's rack-aware
    placement is kept where the pass touched nothing)."""
    for task in tasks:
        have = sum(task in held for held in placement.standby.values())
        candidates = [c for c in placement.eligible(task) if not placement.has_copy(c, task)]
        for _ in range(min(num_standbys - have, len(candidates))):
            chosen = min(
                candidates,
                key=lambda c: (
                    not placement.holds_state(c, task),
                    placement.load(c) >= load_caps[c],
                    placement.load_share(c),
                    c,
                ),
            )
            placement.standby[chosen].add(task)
            candidates.remove(chosen)
