"""Sticky consumer assignors: sticky (KIP-54 with KIP-341), cooperative sticky (KIP-429) and
weighted sticky — one engine, two paths.

History: each member's ``owned_partitions`` with its ``generation``. A partition claimed by two
members goes to the higher generation (KIP-341: a member that missed a rebalance reports stale
ownership); within one generation, to the smaller member id. Claims on topics a member no longer
subscribes to, or on partitions that no longer exist, are dropped.

*Uniform subscriptions* (every member subscribes to the same topics; the common case) take an
exact path: quotas are the floor or ceiling of each member's weighted share, the ceilings going
to the members that own most above their floor; each member keeps ``min(owned, quota)``; the
rest are dealt round robin. Moves equal the lower bound ``sum(max(0, owned - quota))`` and the
run is linear in partitions + members.

*Other subscriptions* take a greedy path: keep every valid claim, give each unowned partition to
the eligible member with the lowest load, then make improving moves until none is left — a move
from member A to an eligible member B improves when ``(2 c_B + 1) / w_B < (2 c_A - 1) / w_A``,
which with unit weights is KIP-54's "A has two or more partitions more than B". Each move lowers
``sum(c^2 / w)``, so the loop ends; partitions A got this round move before ones it owned.
A last pass hands back partitions taken from members still in the group where that keeps
``sum(c^2 / w)`` no higher and opens no improving move.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from fractions import Fraction

import attrs

from .. import TopicPartition
from ..shares import apportion, share_bounds
from ._common import Assignment, Problem, Subscription, prepare
from .userdata import read_member_data


def resolve_owned(problem: Problem) -> tuple[list[int], dict[int, int]]:
    """Previous owner of every partition id (-1: none), conflicts resolved by generation.

    Also returns, for contested partitions, the best losing claimant (highest generation, then
    smallest member id): typically a member that restarted and reports what it held before
    the group moved on. The uniform path hands such partitions back to it when it has room.
    """
    owner = [-1] * problem.partitions
    generation = [0] * problem.partitions
    lost: dict[int, tuple[int, int]] = {}  # pid -> (-generation, member) of the best loser
    index = problem.topic_index()
    offsets, subscribed = problem.offsets, problem.subscribed
    for m, sub in enumerate(problem.subscriptions):
        g = sub.generation
        mine = subscribed[m]
        for topic, p in sub.owned_partitions:
            t = index.get(topic)
            if t is None or t not in mine or not 0 <= p < offsets[t + 1] - offsets[t]:
                continue
            pid = offsets[t] + p
            was = owner[pid]
            if was < 0 or g > generation[pid]:
                if was >= 0:
                    loser = (-generation[pid], was)
                    lost[pid] = min(lost.get(pid, loser), loser)
                owner[pid] = m
                generation[pid] = g
            elif was != m:
                lost[pid] = min(lost.get(pid, (-g, m)), (-g, m))
    return owner, {pid: m for pid, (_, m) in lost.items()}


def _uniform(
    problem: Problem, prev: Sequence[int], lost: Mapping[int, int], weights: Sequence[int]
) -> list[int]:
    """Exact quotas, keep ``min(owned, quota)``, hand back contested partitions to their
    earlier owners where they have room, deal the rest round robin."""
    members = len(problem.members)
    owned: list[list[int]] = [[] for _ in range(members)]
    for pid, m in enumerate(prev):
        if m >= 0:
            owned[m].append(pid)
    floors = [lo for lo, _ in share_bounds(problem.partitions, weights)]
    whole = sum(weights)
    remainder = [problem.partitions * w % whole for w in weights]
    # Ceilings: first to members owning most above their floor (the move bound), then by
    # largest remainder (the fairest rounding), then member order.
    quota = apportion(
        problem.partitions,
        weights,
        priority=lambda m: (-max(0, len(owned[m]) - floors[m]), -remainder[m], m),
    )
    room = [q - min(q, len(pids)) for q, pids in zip(quota, owned, strict=True)]
    owner = [-1] * problem.partitions
    for m, pids in enumerate(owned):
        if len(pids) > quota[m] and lost:
            # Release first what an earlier owner with room claims back.
            pids = sorted(pids, key=lambda pid: lost.get(pid, -1) >= 0 and room[lost[pid]] > 0)
        for pid in pids[: quota[m]]:
            owner[pid] = m
    free = []
    for pid, m in enumerate(owner):
        if m < 0:
            back = lost.get(pid, -1)
            if back >= 0 and room[back] > 0:
                owner[pid] = back
                room[back] -= 1
            else:
                free.append(pid)
    with_room = [m for m in range(members) if room[m] > 0]
    pos = 0
    while pos < len(free):
        for m in with_room:
            owner[free[pos]] = m
            pos += 1
            room[m] -= 1
        with_room = [m for m in with_room if room[m] > 0]
    return owner


#: An exact load key: an int with unit weights, else a Fraction (never mixed in one run).
Key = int | Fraction


def _general(problem: Problem, prev: Sequence[int], weights: Sequence[int]) -> list[int]:
    """Keep valid claims, fill by lowest load, then improving moves until balanced (KIP-54)."""
    balancer = _GreedyBalancer(problem, prev, weights)
    balancer.fill_unowned()
    balancer.make_improving_moves()
    balancer.hand_back_needless_moves()
    return balancer.owner


class _GreedyBalancer:
    """The general path's working state: owners, per-member counts and exact load keys.

    Members with identical subscriptions share a heap keyed by load; a topic's candidates are
    the heaps of the groups subscribed to it (few groups in practice, however many members).
    """

    def __init__(self, problem: Problem, prev: Sequence[int], weights: Sequence[int]) -> None:
        self.problem = problem
        self.prev = prev
        self.weights = weights
        self.unit = all(w == 1 for w in weights)
        self.owner = list(prev)
        self.count = [0] * len(problem.members)
        for m in self.owner:
            if m >= 0:
                self.count[m] += 1
        self.topic_of = problem.topic_of()
        self.group_of = [0] * len(problem.members)
        self.heaps: list[list[tuple[Key, int]]] = []
        self.groups_of_topic: list[list[int]] = [[] for _ in problem.topics]
        self._group_by_subscription()
        # Per member: topic -> partitions held, the ones held before first (popped last).
        self.held: list[dict[int, list[int]]] = [{} for _ in problem.members]
        self.holders: list[set[int]] = [set() for _ in problem.topics]  # per topic: members
        for pid, m in enumerate(self.owner):  # only previous owners yet: in pid order
            if m >= 0:
                self._hold(pid, self.topic_of[pid], m)

    def _group_by_subscription(self) -> None:
        """One load heap per distinct subscription, in order of its first member."""
        by_subscription: dict[frozenset[int], list[int]] = {}
        for m, subs in enumerate(self.problem.subscribed):
            by_subscription.setdefault(subs, []).append(m)
        groups = sorted(by_subscription.items(), key=lambda g: g[1][0])
        for gi, (subs, ms) in enumerate(groups):
            for m in ms:
                self.group_of[m] = gi
            self.heaps.append(sorted((self.key(m), m) for m in ms))
            for t in subs:
                self.groups_of_topic[t].append(gi)

    def key(self, m: int) -> Key:
        """Load key, exact: a move from a to b improves exactly when key(b) < threshold(a).

        ``2c + 1`` with unit weights, else the exact rational ``(2c + 1) / w``: with float keys
        a move and its reverse could both look like improvements (weights 3 and 3 already do
        it) and the loop would never end.
        """
        c = self.count[m]
        return 2 * c + 1 if self.unit else Fraction(2 * c + 1, self.weights[m])

    def threshold(self, m: int) -> Key:
        """A member whose key is below this could take a partition from ``m``."""
        c = self.count[m]
        return 2 * c - 1 if self.unit else Fraction(2 * c - 1, self.weights[m])

    def top(self, gi: int) -> tuple[Key, int] | None:
        """The group's lightest member, dropping stale heap entries."""
        heap = self.heaps[gi]
        while heap and heap[0][0] != self.key(heap[0][1]):
            heapq.heappop(heap)
        return heap[0] if heap else None

    def lightest(self, t: int) -> int:
        """Eligible member for topic ``t`` with the lowest load key (-1: none)."""
        best = min(filter(None, (self.top(gi) for gi in self.groups_of_topic[t])), default=None)
        return -1 if best is None else best[1]

    def add(self, m: int, delta: int) -> None:
        self.count[m] += delta
        heapq.heappush(self.heaps[self.group_of[m]], (self.key(m), m))

    def _hold(self, pid: int, t: int, m: int) -> None:
        """``m`` now holds ``pid`` (of topic ``t``): owner, held and holders (not counts)."""
        self.owner[pid] = m
        self.held[m].setdefault(t, []).append(pid)
        self.holders[t].add(m)

    def fill_unowned(self) -> None:
        """Give each unowned partition to its lightest eligible member.

        In pid order, so each member's partitions of a topic stay held-before first, then by
        pid: the order ``make_improving_moves`` gives them away in (the last first). A member's
        topics go back in topic order: the order moves try them in.
        """
        gained: set[int] = set()
        for pid, m in enumerate(self.owner):
            if m < 0:
                t = self.topic_of[pid]
                best = self.lightest(t)
                if best >= 0:
                    self._hold(pid, t, best)
                    self.add(best, 1)
                    gained.add(best)
        for m in gained:
            self.held[m] = dict(sorted(self.held[m].items()))

    def make_improving_moves(self) -> None:
        """Improving moves, most loaded members first, until a full pass makes none."""
        while self._improving_pass():
            pass

    def _improving_pass(self) -> bool:
        """One pass of moves; whether it made any.

        One move at a time, always from the currently heaviest member that can give (draining
        one member to the bottom first would make others refill it: needless moves). Members
        that cannot give are set aside until the next pass.
        """
        moved = False
        donors = [(-self.threshold(m), m) for m in range(len(self.problem.members))]
        heapq.heapify(donors)
        while donors:
            neg, a = heapq.heappop(donors)
            if neg != -self.threshold(a):
                continue  # stale entry
            floor = min(filter(None, (self.top(gi) for gi in range(len(self.heaps)))), default=None)
            if floor is None or floor[0] >= self.threshold(a):
                break  # nobody can take from a, nor from anyone lighter
            pick = self._pick_taker(a)
            if pick is None:
                continue
            t, b = pick
            self._hand_over(self.held[a][t].pop(), t, a, b)
            heapq.heappush(donors, (-self.threshold(a), a))
            heapq.heappush(donors, (-self.threshold(b), b))
            moved = True
        return moved

    def _pick_taker(self, a: int) -> tuple[int, int] | None:
        """The first (topic, member) where that member could improve by taking from ``a``."""
        threshold = self.threshold(a)
        return next(
            (
                (t, b)
                for t, pids in self.held[a].items()
                if pids and (b := self.lightest(t)) >= 0 and self.key(b) < threshold
            ),
            None,
        )

    def hand_back_needless_moves(self) -> None:
        """Undo needless moves: the greedy order can take a partition from a member still in
        the group that could have it back at no cost in balance (moving it back lowers or keeps
        sum(c^2 / w)). Hand each such partition back unless that opens an improving move: from
        its previous owner (now one heavier) or onto its taker (now one lighter).

        Passes until one hands nothing back: a hand-back changes loads, which can make an
        earlier candidate possible. Each one moves a partition home, so the passes end.
        """
        prev, owner = self.prev, self.owner
        taken = [pid for pid, a in enumerate(prev) if a >= 0 and owner[pid] not in (a, -1)]
        while taken:
            left = []
            for pid in taken:
                a, b = prev[pid], owner[pid]
                if self.key(a) > self.threshold(b):
                    left.append(pid)
                    continue
                self._move(pid, b, a)
                if self._opens_a_move(a, b):
                    self._move(pid, a, b)  # undo
                    left.append(pid)
            if len(left) == len(taken):
                break
            taken = left

    def _move(self, pid: int, src: int, dst: int) -> None:
        t = self.topic_of[pid]
        self.held[src][t].remove(pid)
        self._hand_over(pid, t, src, dst)

    def _hand_over(self, pid: int, t: int, src: int, dst: int) -> None:
        """Give ``pid`` (of topic ``t``, already out of ``held[src]``) from ``src`` to ``dst``."""
        self._hold(pid, t, dst)
        if not self.held[src][t]:
            self.holders[t].discard(src)
        self.add(src, -1)
        self.add(dst, 1)

    def _opens_a_move(self, a: int, b: int) -> bool:
        """Whether ``a`` could now give to someone, or someone could now give to ``b``."""
        if any(
            pids and self.key(self.lightest(t)) < self.threshold(a)
            for t, pids in self.held[a].items()
        ):
            return True
        return any(
            self.threshold(y) > self.key(b)
            for t in self.problem.subscribed[b]
            for y in self.holders[t]
            if y != b
        )


def assign_sticky(problem: Problem, weights: Sequence[int] | None = None) -> list[int]:
    """Owner of every partition id under the sticky rules (see the module docstring)."""
    prev, lost = resolve_owned(problem)
    w = list(weights) if weights is not None else [1] * len(problem.members)
    if not problem.members:
        return prev
    if len(set(problem.subscribed)) == 1:
        return _uniform(problem, prev, lost, w)
    return _general(problem, prev, w)


@attrs.frozen
class RebalancePlan:
    """A cooperative round: what members get now, what they must give up, what comes next.

    ``revoking`` maps a member to partitions it claims that belong to another member in the
    target; ``pending`` maps a member to the partitions it gets once those owners have
    revoked them (withheld from everyone this round). In the follow-up round each member
    reports ``assignment + pending`` as owned, which reproduces the target exactly.
    """

    assignment: Assignment
    revoking: Mapping[str, list[TopicPartition]]
    pending: Mapping[str, list[TopicPartition]]

    @property
    def followup_needed(self) -> bool:
        return any(self.pending.values())


@attrs.frozen
class StickyAssignor:
    """KIP-54 sticky assignor with the KIP-341 generation fix (eager)."""

    name: str = "sticky"

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> Assignment:
        problem = prepare(partitions_per_topic, subscriptions)
        return problem.output(assign_sticky(problem))


@attrs.frozen
class WeightedAssignor:
    """Sticky, with each member's share proportional to its weight (``MemberData.weight``).

    Weights 900/90/10 over 100 partitions give 90/9/1: a big host, a small one and a canary in
    one group.
    """

    name: str = "weighted"

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> Assignment:
        problem = prepare(partitions_per_topic, subscriptions)
        # Parameters only: history is in owned_partitions, so runs are checked, never built.
        weights = [
            read_member_data(m, s.user_data, partitions_per_topic={}).weight
            for m, s in zip(problem.members, problem.subscriptions, strict=True)
        ]
        return problem.output(assign_sticky(problem, weights))


@attrs.frozen
class CooperativeStickyAssignor:
    """KIP-429: the sticky target, minus partitions another present member still owns.

    Those are revoked by their owners first, and a follow-up rebalance assigns them; no
    partition is ever owned by two members at once.
    """

    name: str = "cooperative-sticky"

    def plan(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> RebalancePlan:
        problem = prepare(partitions_per_topic, subscriptions)
        target = assign_sticky(problem)
        # Every claim counts here, whatever its generation or topic: a partition is granted
        # only when no other member may still hold it (KIP-429's safety rule).
        index = problem.topic_index()
        claims: dict[int, set[int]] = {}
        for m, sub in enumerate(problem.subscriptions):
            for tp in sub.owned_partitions:
                pid = problem.partition_id(tp, index)
                if pid >= 0:
                    claims.setdefault(pid, set()).add(m)
        now = list(target)
        revoking: list[list[int]] = [[] for _ in problem.members]
        pending: list[list[int]] = [[] for _ in problem.members]
        for pid in sorted(claims):
            others = sorted(claims[pid] - {target[pid]})
            for m in others:
                revoking[m].append(pid)
            if others and target[pid] >= 0:
                pending[target[pid]].append(pid)
                now[pid] = -1
        tps = problem.all_partitions()

        def named(lists: list[list[int]]) -> dict[str, list[TopicPartition]]:
            return {m: [tps[p] for p in ps] for m, ps in zip(problem.members, lists, strict=True)}

        return RebalancePlan(problem.output(now, tps), named(revoking), named(pending))

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> Assignment:
        return self.plan(partitions_per_topic, subscriptions).assignment
