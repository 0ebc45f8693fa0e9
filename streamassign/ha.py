"""The high-availability task assignor: actives move only onto caught-up state (KIP-441's idea).

A plain sticky rebalance hands a task to a new owner at once, and the task is down while that
owner restores its changelog. This assignor moves an active only where its state is already
there, and warms the state up first where it is not:

1. **Target.** The balanced, move-minimal ``StickyTaskAssignor`` assignment of the same input.
   It is computed from the reported history, so an assignment that is already balanced is its
   own target and nothing moves (Kafka Streams' assignor converges to a target of its own
   making and may reshuffle a balanced group; this one does not).
2. **Caught up.** A client is caught up on a stateful task when it runs it (its resolved previous
   owner) or reports a lag within ``acceptable_recovery_lag``. A standby reported without a lag
   is not caught up: the leader cannot tell.
3. **Swap.** A stateful task the target moves off its running owner onto state that is not
   caught up stays, when the owner has another task (kept by the target) that the receiving
   client is caught up on, or a stateless one: that task goes instead. Every client keeps its
   target active and standby counts, and the moves stay as many, so the target keeps the sticky
   balance and move guarantees; with stateless tasks to hand out, a scale-out needs no warmup.
   Then a caught-up copy the target still passes over (a warmup of the last round, when the
   sticky assignor, recomputing from the interim history, handed a spare ceiling or the choice
   of which task an owner releases elsewhere) gets its task through a chain of reassignments
   of tasks that move onto no state anyway: moves stay as many, counts within floor and ceiling.
   Balanced per subtopology (``balance="subtopology"``, the default), every task a chain hands
   on belongs to the subtopology of the task it makes way for, a swap partner too unless all
   four cells the swap changes stay within floor and ceiling, and floors and ceilings are
   counted per subtopology: the target stays balanced per subtopology.
   Then an orphan they left cold above its client's floors goes to a standby holder of it
   below its ceilings, as in the sticky assignment (``hand_orphans_over``, guarantee 5).
   When these moved any active, the sticky assignor places the target's standbys again, for
   its actives (``_standbys_for``): the target keeps every sticky standby guarantee.
4. **Hold back.** A stateful task whose target client is not caught up, while some present client
   is, stays on a caught-up one: its previous owner if present, else a caught-up client that
   holds a target standby of it (the two swap roles: the target client gets the standby, so it
   warms up with no extra copy), else the least loaded caught-up client. When nobody is caught
   up but some client's lag is more than ``acceptable_recovery_lag`` below the target client's
   (unknown or no state counts as behind every known lag), the task goes to the least lagging
   such client meanwhile (KAFKA-10086): it restores less than the target would.
5. **Warmups.** Where no role swap happened, the target client gets a warmup replica of the task,
   at most ``max_warmup_replicas`` in the whole group; the budget goes first to clients that
   already have some state of the task (a warmup in progress keeps its slot), then to the
   smallest lag, then by task id.
6. **Probing.** The plan says a probing rebalance is needed while any active is held back; at
   that rebalance caught-up warmups are warm holders, so the sticky target takes them over with
   (near) zero restore. Stateless tasks, and stateful ones no present client is caught up on
   or much closer to than the target, go straight to their target: nothing to wait for.
7. **Carry** (``plan(..., last_plan=...)``). A leader that stays across probing rounds may
   offer its last plan. From the interim history (held-back tasks now run on their keepers)
   that plan's target is no longer move-minimal, so step 1 can pick another one, which needs
   new warmups. So when the plan of steps 1 to 6 holds actives back, and the clients run
   exactly the actives the last plan assigned (the probing round right after it: a target
   from rounds ago could move far more than the least), the last target is this round's
   target instead, as it is and with nothing held back, if it needs no warmup and is a
   fixed point of the sticky assignor for this input (so valid and balanced;
   ``HighAvailabilityTaskAssignor._still_valid``). A plan that holds nothing back is kept:
   it moves the least, and a balanced group is never reshuffled.

While actives are held back the interim assignment can be unbalanced (a caught-up client runs
more than its share); the assignment the rounds converge to is the target, with all the sticky
balance and move guarantees.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any, Final

import attrs

from ._ids import TaskId, as_task
from .assignment import ClientAssignment, ClientState
from .errors import AssignmentInputError, AssignmentTypeError
from .shares import share_bounds
from .sticky import (
    Balance,
    StickyTaskAssignor,
    balance_option,
    resolve_previous_owners,
    tag_keys_option,
)

__all__ = ["HighAvailabilityPlan", "HighAvailabilityTaskAssignor"]

#: Sort key of a lag nobody reported: behind every known lag.
_UNKNOWN: Final = 1 << 62


def _at_least(low: int) -> Any:
    def check(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise AssignmentInputError(f"{attribute.name} must be an int >= {low}, got {value!r}")

    return check


@attrs.frozen
class HighAvailabilityPlan:
    """One rebalance of the high-availability assignor.

    ``assignment`` is what the clients run now (actives held back on caught-up clients, warmups
    on their targets); ``target`` is the balanced assignment the rounds converge to (sticky,
    with the swaps and chains of step 3);
    ``held_back`` maps each active kept off its target to that target's process id.
    """

    assignment: Mapping[str, ClientAssignment]
    target: Mapping[str, ClientAssignment]
    held_back: Mapping[TaskId, str]

    @property
    def probing_rebalance_needed(self) -> bool:
        """Whether a later rebalance must move held-back actives once their state caught up."""
        return bool(self.held_back)

    @property
    def warmups(self) -> int:
        """Warmup replicas placed in the whole group."""
        return sum(len(a.warmup) for a in self.assignment.values())


@attrs.frozen
class HighAvailabilityTaskAssignor:
    """Sticky assignment that moves actives only onto caught-up state (module docstring).

    Same ``assign`` contract as ``StickyTaskAssignor``; ``plan`` also says whether a probing
    rebalance is needed. ``probing_rebalance_interval_ms`` is how long the group waits before
    that rebalance (Kafka Streams' default: 10 minutes); the streams leader turns it into the
    members' next-rebalance time.
    """

    num_standby_replicas: int = attrs.field(default=0, validator=_at_least(0))
    #: Lags up to this count as caught up (Kafka Streams' ``acceptable.recovery.lag``).
    acceptable_recovery_lag: int = attrs.field(default=10_000, validator=_at_least(0))
    #: Warmup replicas allowed at once in the whole group (``max.warmup.replicas``).
    max_warmup_replicas: int = attrs.field(default=2, validator=_at_least(1))
    probing_rebalance_interval_ms: int = attrs.field(default=600_000, validator=_at_least(1))
    #: Client tag keys standby placement avoids sharing (``StickyTaskAssignor``'s; ``None``: all).
    rack_aware_tags: tuple[str, ...] | None = attrs.field(default=None, converter=tag_keys_option)
    #: The target's balance (``StickyTaskAssignor``'s option): ``"subtopology"`` (default)
    #: or ``"total"``. Swaps and chains then keep every client's count of each subtopology.
    balance: Balance = attrs.field(default="subtopology", validator=balance_option)

    def assign(
        self,
        tasks: Iterable[TaskId],
        clients: Iterable[ClientState],
        stateful: Iterable[TaskId] | None = None,
        task_racks: Mapping[TaskId, str] | None = None,
    ) -> dict[str, ClientAssignment]:
        """What every client runs now, keyed by process id (``plan(...).assignment``)."""
        return dict(self.plan(tasks, clients, stateful, task_racks).assignment)

    def plan(
        self,
        tasks: Iterable[TaskId],
        clients: Iterable[ClientState],
        stateful: Iterable[TaskId] | None = None,
        task_racks: Mapping[TaskId, str] | None = None,
        *,
        last_plan: HighAvailabilityPlan | None = None,
    ) -> HighAvailabilityPlan:
        """The interim assignment, its target, and the actives held back (module docstring).

        ``stateful=None`` treats every task as stateful. ``task_racks`` (each task's partition
        leaders' rack) and ``rack_aware_tags`` shape the sticky target as they shape
        ``StickyTaskAssignor.assign``. Raises the ``AssignmentInputError``s that does
        (duplicate process ids, tasks without clients).

        ``last_plan``: the last plan this leader made (step 7 of the module docstring). When
        the plan made without it holds actives back and the clients run exactly the actives
        it assigned, its target is this round's, as it is, if it is still one for this input
        and needs no warmup (``_still_valid``); otherwise it is ignored.
        """
        if last_plan is not None:
            _check_last_plan(last_plan)
        task_list = sorted({as_task(t) for t in tasks})
        client_list = sorted(clients, key=lambda c: c.process_id)
        stateful_list = task_list if stateful is None else [as_task(t) for t in stateful]
        fresh = self._plan_afresh(task_list, client_list, stateful_list, task_racks)
        if last_plan is None or not fresh.probing_rebalance_needed:
            return fresh
        carried = self._carry(last_plan, task_list, client_list, stateful_list, task_racks)
        return fresh if carried is None else carried

    def _plan_afresh(
        self,
        task_list: list[TaskId],
        client_list: list[ClientState],
        stateful_list: list[TaskId],
        task_racks: Mapping[TaskId, str] | None,
    ) -> HighAvailabilityPlan:
        """Steps 1 to 6 of the module docstring: the plan made from this input alone."""
        sticky = self._sticky()
        target = sticky.assign(task_list, client_list, stateful_list, task_racks=task_racks)
        holdback = _Holdback(self, task_list, client_list, set(stateful_list), target)
        holdback.swap()
        holdback.steer()
        if any(holdback.target[p].active != a.active for p, a in target.items()):
            holdback.hand_orphans_over()
            holdback.target = _standbys_for(holdback.target, sticky, holdback, task_racks)
        return holdback.plan()

    def _sticky(self) -> StickyTaskAssignor:
        """The sticky assignor of this one's options (step 1's target)."""
        return StickyTaskAssignor(
            self.num_standby_replicas,
            self.acceptable_recovery_lag,
            rack_aware_tags=self.rack_aware_tags,
            balance=self.balance,
        )

    def _carry(
        self,
        last_plan: HighAvailabilityPlan,
        tasks: list[TaskId],
        clients: list[ClientState],
        stateful: list[TaskId],
        task_racks: Mapping[TaskId, str] | None,
    ) -> HighAvailabilityPlan | None:
        """The plan whose target is ``last_plan``'s, when the (sorted) clients run exactly the
        actives ``last_plan`` assigned and that target is still valid for these inputs; None
        otherwise."""
        running = {c.process_id: frozenset(c.prev_active) for c in clients}
        assigned = {pid: frozenset(kept.active) for pid, kept in last_plan.assignment.items()}
        if running != assigned:
            return None  # not the round right after it: a member changed, a task moved
        carried = _Holdback(self, tasks, clients, set(stateful), {})
        carried.target = {p: last_plan.target[p] for p in carried.clients if p in last_plan.target}
        same_clients = len(carried.target) == len(last_plan.target) == len(clients)
        if not same_clients or not self._still_valid(carried, task_racks):
            return None
        return carried.plan()

    def _still_valid(self, carried: _Holdback, task_racks: Mapping[TaskId, str] | None) -> bool:
        """Whether ``carried.target`` (the last target, one per client) can be this round's as
        it is: no warmup in it, every stateful active caught up where it is (step 2), and a
        fixed point (``_keeps_itself``). The sticky assignor returns only valid assignments
        balanced per subtopology (unless ``balance="total"``) and in total by today's
        capacities, keeping the load rule, so a fixed point is all that: adopting it holds
        nothing back, places no warmup, and the next rebalance changes nothing."""
        if any(a.warmup for a in carried.target.values()):
            return False
        # The cheapest check first, and the usual reason to refuse: a target still warming up.
        if not all(carried.ready_on(t, pid) for t, pid in carried.moving()):
            return False
        return self._keeps_itself(carried, task_racks)

    def _keeps_itself(self, carried: _Holdback, task_racks: Mapping[TaskId, str] | None) -> bool:
        """Whether the sticky assignor, told that every client ran and holds what the target
        gives it, returns the target unchanged, standbys included. Checking the load rule's
        pairs alone let a target with a client below its load floor through (nobody above a
        ceiling), and the rebalance after it moved a standby; this is the rule itself. A
        clean, balanced history takes the sticky assignor's O(tasks) shortcut."""
        history = [
            attrs.evolve(
                client,
                prev_active=carried.target[pid].active,
                prev_standby=carried.target[pid].standby,
                lags={},
            )
            for pid, client in carried.clients.items()
        ]
        again = self._sticky().assign(
            carried.tasks, history, carried.stateful, task_racks=task_racks
        )
        return all(
            (again[pid].active, again[pid].standby) == (kept.active, kept.standby)
            for pid, kept in carried.target.items()
        )


def _check_last_plan(last_plan: object) -> None:
    """``last_plan`` is a plan (its assignment and target keep their types), else a typed
    error: a caller's bug, never a reason to plan differently."""
    if not (
        isinstance(last_plan, HighAvailabilityPlan)
        and isinstance(last_plan.assignment, Mapping)
        and isinstance(last_plan.target, Mapping)
        and all(
            isinstance(kept, ClientAssignment)
            for kept in (*last_plan.assignment.values(), *last_plan.target.values())
        )
    ):
        raise AssignmentTypeError(
            "last_plan is a HighAvailabilityPlan mapping process ids to ClientAssignment values"
        )


def _standbys_for(
    target: Mapping[str, ClientAssignment],
    sticky: StickyTaskAssignor,
    holdback: _Holdback,
    task_racks: Mapping[TaskId, str] | None,
) -> dict[str, ClientAssignment]:
    """``target``'s actives with standbys the sticky assignor places for them.

    Exchanges and chains (step 3) keep every client's counts, but the standbys the sticky
    assignor placed were placed for the actives before them: a client can then sit above its
    load ceiling holding a copy that one below its floor could now take (guarantee 3), or lose
    a previous standby to a cold client (guarantee 6), and the next rebalance moves the copy.
    So the sticky assignor runs once more on the same clients reporting the target's actives
    as what they ran, their previous standbys and lags as they are, and what they ran before
    and no longer run as local state at its lag (0 if none reported). That history is
    balanced, so it keeps every active (a move-minimal assignment of it moves nothing), and
    every standby guarantee holds for the actives the plan converges to.
    """
    history = []
    for client in holdback.clients.values():
        active = target[client.process_id].active
        state = dict.fromkeys(client.prev_active - active, 0) | dict(client.lags)
        history.append(
            attrs.evolve(
                client,
                prev_active=active,
                prev_standby=client.prev_standby - active,
                lags={t: lag for t, lag in state.items() if t not in active},
            )
        )
    return sticky.assign(holdback.tasks, history, holdback.stateful, task_racks=task_racks)


class _Holdback:
    """Steps 2 to 5 of the module docstring over one sticky target."""

    def __init__(
        self,
        assignor: HighAvailabilityTaskAssignor,
        tasks: list[TaskId],
        clients: list[ClientState],
        stateful: set[TaskId],
        target: dict[str, ClientAssignment],
    ) -> None:
        self.acceptable = assignor.acceptable_recovery_lag
        self.budget = assignor.max_warmup_replicas
        self.tasks = tasks
        self.clients = {c.process_id: c for c in clients}
        self.stateful = stateful
        self.target = target
        #: Whether swaps and chains keep every client's count of each subtopology.
        self.by_subtopology = assignor.balance == "subtopology"
        self.previous = resolve_previous_owners(tasks, clients)
        self.known: dict[TaskId, list[tuple[int, str]]] | None = None
        self.ready_by: dict[str, frozenset[TaskId]] | None = None

    def lag(self, task: TaskId, pid: str) -> int | None:
        """Lag of ``pid`` on ``task``: 0 for its running owner, None when unknown."""
        if self.previous.get(task) == pid:
            return 0
        c = self.clients[pid]
        if task in c.lags:
            return c.lags[task]
        return 0 if task in c.prev_active else None

    def holders(self, task: TaskId) -> list[tuple[int, str]]:
        """(lag, process id) of the clients whose lag on ``task`` is known, in process id
        order: its running owner (0), clients that ran it, clients that report a lag."""
        return self.known_lags().get(task, [])

    def known_lags(self) -> dict[TaskId, list[tuple[int, str]]]:
        """``holders`` of every task anyone reports."""
        if self.known is None:  # built once, and only when some target is not caught up
            known: dict[TaskId, list[tuple[int, str]]] = {}
            for pid, c in self.clients.items():
                for t in c.prev_active:
                    lag = 0 if self.previous.get(t) == pid else c.lags.get(t, 0)
                    known.setdefault(t, []).append((lag, pid))
                for t, lag in c.lags.items():
                    if t not in c.prev_active:
                        known.setdefault(t, []).append((lag, pid))
            self.known = known
        return self.known

    def caught_up(self, task: TaskId) -> list[tuple[int, str]]:
        """(lag, process id) of the clients caught up on ``task``, in process id order."""
        return [r for r in self.holders(task) if r[0] <= self.acceptable]

    def ready_on(self, task: TaskId, pid: str) -> bool:
        lag = self.lag(task, pid)
        return lag is not None and lag <= self.acceptable

    def cells(self) -> tuple[dict[tuple[str, int], tuple[int, int]], dict[tuple[str, int], int]]:
        """Balanced per subtopology: floor and ceiling of every (client, subtopology) cell and
        its count in the target; empty maps when balancing totals only."""
        bounds: dict[tuple[str, int], tuple[int, int]] = {}
        counts: dict[tuple[str, int], int] = {}
        if self.by_subtopology:
            caps = [c.capacity for c in self.clients.values()]
            sizes = collections.Counter(t.subtopology for t in self.tasks)
            for sub, size in sizes.items():
                for p, bound in zip(self.clients, share_bounds(size, caps), strict=True):
                    bounds[p, sub] = bound
                    counts[p, sub] = 0
            for p, a in self.target.items():
                for t in a.active:
                    counts[p, t.subtopology] += 1
        return bounds, counts

    def moving(self) -> list[tuple[TaskId, str]]:
        """Stateful actives the target gives to a client that did not run them, sorted."""
        previous, stateful = self.previous, self.stateful
        return sorted(
            (t, pid)
            for pid, a in self.target.items()
            for t in a.active
            if previous.get(t) != pid and t in stateful
        )

    def swap(self) -> None:
        """Step 3: a task the target moves onto state that is not caught up goes instead to a
        client that is caught up on it (its running owner first), which hands the target client
        in exchange a task that client is caught up on, a stateless one, or one nobody is
        caught up on. Every client keeps its target active count (per subtopology, every cell
        stays within floor and ceiling), and moves do not grow, so the target keeps its balance
        and move guarantees. Standbys are placed afterwards for the result (``_standbys_for``),
        so they do not constrain the partner."""
        previous = self.previous
        sets = _Copies(self.target)
        taken: set[TaskId] = set()
        pools = _Pools(self, taken)
        cells = _Cells(*self.cells())
        for t, dest in self.moving():
            if t in taken or self.ready_on(t, dest):
                continue
            owner = previous.get(t)
            homes = [owner] if owner is not None else []
            homes += [pid for _, pid in sorted(self.caught_up(t)) if pid not in (owner, dest)]
            for home in homes:
                u = self._partner(t, dest, home, pools, partial(cells.fit, t, home, dest))
                if u is None:
                    continue
                cells.exchange(t, home, dest, u)
                home_active, dest_active = sets.of(home)[0], sets.of(dest)[0]
                home_active.remove(u)
                home_active.add(t)
                dest_active.remove(t)
                dest_active.add(u)
                taken.update((t, u))
                break
        self.target = sets.result()

    def caught_up_on(self, pid: str) -> frozenset[TaskId]:
        """The tasks ``pid`` is caught up on (``ready_on``), built once per client."""
        if self.ready_by is None:
            ready_by: dict[str, set[TaskId]] = {}
            for t, owner in self.previous.items():
                ready_by.setdefault(owner, set()).add(t)
            for p, c in self.clients.items():
                mine = ready_by.setdefault(p, set())
                mine.update(t for t in c.prev_active | c.lags.keys() if self.ready_on(t, p))
            self.ready_by = {p: frozenset(ts) for p, ts in ready_by.items()}
        return self.ready_by.get(pid, frozenset())

    def _partner(
        self, t: TaskId, dest: str, home: str, pools: _Pools, fits: Callable[[TaskId], bool]
    ) -> TaskId | None:
        """A task the target gives ``home`` that can go to ``dest`` in exchange for ``t`` with
        no new wait and no extra move, and ``fits`` (per-subtopology cells); None: none.

        From ``t``'s running owner only a task it keeps qualifies (the move count stays); from
        another client only a task moving there too (it moves either way). In order: a
        stateless one (nothing to restore), one ``dest`` is caught up on, one nobody is caught
        up on (it restores wherever it goes; not from the owner); the smallest id in each. The
        candidates come from indexes, so a rebalance costs about linear time, not tasks x
        clients."""
        pool = pools.of(home, self.previous.get(t) == home)
        pool.fits = fits
        u = pool.first(pool.stateless)
        if u is not None:
            return u
        ready = pool.ready.get(dest)
        if ready is None:  # sorted once per (home, dest); ``first`` skips the taken ones
            mine, caught_up = pool.stateful, self.caught_up_on(dest)
            small, large = (mine, caught_up) if len(mine) <= len(caught_up) else (caught_up, mine)
            ready = pool.ready[dest] = sorted(u for u in small if u in large)
        best = pool.first(ready)
        if best is not None or pool.kept:
            return best
        return pool.first(pool.orphans)

    def steer(self) -> None:
        """Step 3, second part: put tasks on the caught-up copies the target passes over.

        Where shares are uneven, the sticky assignor gives the spare ceilings, and picks which
        of an over-quota owner's tasks it releases, by the counts clients ran, which every
        probing round changes. So a round's target, recomputed from the interim history, can
        pass over the copy the last round warmed up and send a cold client a task instead: the
        warmup is spent again (a scale-out took 5 rounds where 3 do). The last round's target
        is still balanced and move-minimal for the new history, so a target using every warm
        copy exists. For each passed-over caught-up copy (task ``u`` on client ``p``, not active
        there in the target; a target standby there is passed over too, since standbys are
        placed again for the result), in task order, this looks for the shortest chain that
        puts ``u`` on ``p``: ``p`` hands on an active it has no state of and does not own, the
        receiver another, and so on, until the chain hands one to the client ``u`` came from;
        once per chain the active may instead stay on a client with room below its ceilings,
        the chain going on from a client with one to spare above its floors. When ``u`` came
        from its running owner (one move more), one link must hand an active back to its
        running owner (one move less), even when the target gave it that task's standby (a
        previous owner keeps what it gives up as a standby; standbys are placed again for the
        result). Nothing is handed to its owner otherwise or to a client holding a target
        standby of it, so moves stay as many, every active count stays within
        its floor and ceiling (or does not change), and no task leaves state it is caught up
        on. Chains ignore ``task_racks``, as the swaps above do."""
        if all(self.ready_on(t, dest) for t, dest in self.moving()):
            return
        target, previous, tasks = self.target, self.previous, set(self.tasks)
        copies = sorted(
            (t, self.lag(t, p), p)
            for p in self.clients
            for t in self.caught_up_on(p)
            if previous.get(t) != p
            and t in self.stateful
            and t in tasks
            and t not in target[p].active
        )
        if not copies:
            return
        chains = _Chains(self)
        for t, _, p in copies:
            if chains.where[t] != p:  # an earlier chain may have put it there
                chains.place(t, p)
        self.target = chains.sets.result()

    def hand_orphans_over(self) -> None:
        """Guarantee 5 on the target swaps and chains made: an orphan (no present client ran
        it) on a client holding no standby of it and above its active floors goes to a standby
        holder of it below its ceilings, as the sticky assignor's last step does. Swaps and
        chains keep every count but not which client fills its spare ceiling with the orphan
        (a chain's slack end can leave a client at its ceiling holding one cold). Never off a
        client caught up on it onto one that is not (caught-up state first, step 2). An orphan
        moves wherever it goes and counts stay within floor and ceiling: moves and balance
        hold. Passes until none moves, as one hand-over can make room for another."""
        chains = _Chains(self)
        holders: dict[TaskId, list[str]] = {}
        for pid, client in self.clients.items():
            for t in client.prev_standby:
                holders.setdefault(t, []).append(pid)
        waiting = sorted(t for t in holders if t in chains.where and t not in self.previous)
        moved = True
        while moved:
            moved = False
            for t in waiting:
                pid = chains.where[t]
                if self.by_subtopology:
                    chains.subtopology = t.subtopology  # room and spare count its cells too
                if pid in holders[t] or not chains.spare(pid):
                    continue
                keeps = self.ready_on(t, pid)
                for h in holders[t]:
                    if chains.room(h) and (self.ready_on(t, h) or not keeps):
                        chains.move(t, pid, h)
                        moved = True
                        break
        self.target = chains.sets.result()

    def plan(self) -> HighAvailabilityPlan:
        """Steps 4 and 5 over the target step 3 made (``swap``, ``steer``, standbys)."""
        target, previous = self.target, self.previous
        sets = _Copies(target)
        held: dict[TaskId, str] = {}
        wants_warmup: list[tuple[int, int, TaskId, str]] = []
        for t, dest in self.moving():
            lag = self.lag(t, dest)
            if lag is not None and lag <= self.acceptable:
                continue
            ready = self.caught_up(t)
            if not ready:
                keeper = self._closest(t, dest, lag)
            elif (keeper := previous.get(t)) is None:
                keeper = min(ready, key=lambda r: self._keeper_rank(t, r, sets.active))[1]
            if keeper is None:
                continue  # nobody is much closer than the target: nothing to wait for
            dest_active, dest_standby = sets.of(dest)
            keeper_active, keeper_standby = sets.of(keeper)
            dest_active.discard(t)
            keeper_active.add(t)
            held[t] = dest
            if t in keeper_standby:  # swap roles: the target client keeps a standby meanwhile
                keeper_standby.discard(t)
                dest_standby.add(t)
            else:
                has = self.clients[dest].has_state(t)
                wants_warmup.append((0 if has else 1, _UNKNOWN if lag is None else lag, t, dest))

        warmup: dict[str, set[TaskId]] = {}
        for *_, t, dest in sorted(wants_warmup)[: self.budget]:
            warmup.setdefault(dest, set()).add(t)
        return HighAvailabilityPlan(sets.result(warmup), target, held)

    def _closest(self, task: TaskId, dest: str, dest_lag: int | None) -> str | None:
        """With nobody caught up on ``task`` (its owner is gone): the least lagging holder,
        when it is more than an acceptable lag closer than ``dest`` (KAFKA-10086: it restores
        less, and the target warms up meanwhile); None when there is no such holder."""
        lags = [r for r in self.holders(task) if r[1] != dest]
        if not lags:
            return None
        lag, pid = min(lags)
        if dest_lag is not None and dest_lag - lag <= self.acceptable:
            return None
        return pid

    def _keeper_rank(
        self, task: TaskId, ready: tuple[int, str], active: Mapping[str, set[TaskId]]
    ) -> tuple[bool, float, int, str]:
        """Order of caught-up clients to keep ``task``: target standby holders (a role swap),
        then the fewest actives per thread so far, the smallest lag, the process id."""
        lag, pid = ready
        a = self.target[pid]
        count = len(active[pid]) if pid in active else len(a.active)
        return (task not in a.standby, count / self.clients[pid].capacity, lag, pid)


#: A step of a chain: (client that must hand an active on, give-back owed, slack used).
_State = tuple[str, bool, bool]
#: How a chain search reached each state: (the state before, the active handed over; None:
#: slack), None for the start.
_Links = dict[_State, "tuple[_State, TaskId | None] | None"]


class _Chains:
    """The target's actives while ``_Holdback.steer`` moves them: where each task runs, every
    client's active and load counts, and the floors and ceilings those stay within."""

    def __init__(self, holdback: _Holdback) -> None:
        self.holdback = holdback
        target = holdback.target
        self.sets = _Copies(target)
        self.where = {t: pid for pid, a in target.items() for t in a.active}
        pids = list(holdback.clients)
        caps = [holdback.clients[p].capacity for p in pids]
        self.bounds = dict(zip(pids, share_bounds(len(holdback.tasks), caps), strict=True))
        self.count = {p: len(a.active) for p, a in target.items()}
        # Balanced per subtopology, a chain moves tasks of one subtopology only (the one being
        # placed), and room and spare count that subtopology's floors and ceilings too.
        self.subtopology: int | None = None
        self.cell_bounds, self.cell_count = holdback.cells()
        # Searches and movable tasks of the current target, dropped whenever a task moves.
        self.searches: dict[tuple[str, bool, int | None], tuple[_Links, dict[str, _State]]] = {}
        self.movables: dict[str, list[TaskId]] = {}
        self.spare_list: list[str] | None = None

    def room(self, pid: str) -> bool:
        """Whether ``pid`` can take one more active within its active ceilings (standbys are
        placed for the chains' result afterwards, so loads need no bound here)."""
        sub = self.subtopology
        if sub is not None and self.cell_count[pid, sub] >= self.cell_bounds[pid, sub][1]:
            return False
        return self.count[pid] < self.bounds[pid][1]

    def spare(self, pid: str) -> bool:
        """Whether ``pid`` can give one active away within its active floors."""
        sub = self.subtopology
        if sub is not None and self.cell_count[pid, sub] <= self.cell_bounds[pid, sub][0]:
            return False
        return self.count[pid] > self.bounds[pid][0]

    def spares(self) -> list[str]:
        """The clients with an active to spare, in process id order (cached until a move or
        another subtopology)."""
        if self.spare_list is None:
            self.spare_list = [p for p in self.holdback.clients if self.spare(p)]
        return self.spare_list

    def movable(self, pid: str) -> list[TaskId]:
        """The actives ``pid`` may pass on, sorted: moved there (not its running owner) onto
        no state of it, or stateless; of the subtopology being placed, if balanced per
        subtopology."""
        sub = self.subtopology
        everything = self._movable(pid)
        return everything if sub is None else [v for v in everything if v.subtopology == sub]

    def _movable(self, pid: str) -> list[TaskId]:
        if pid not in self.movables:
            h = self.holdback
            client = h.clients[pid]
            active = self.sets.active.get(pid, h.target[pid].active)
            self.movables[pid] = sorted(
                v
                for v in active
                if h.previous.get(v) != pid and (v not in h.stateful or not client.has_state(v))
            )
        return self.movables[pid]

    def place(self, task: TaskId, pid: str) -> bool:
        """Put ``task`` on ``pid`` through the shortest chain (``_Holdback.steer``); False when
        there is none. The chain closes when it hands an active to the client ``task`` came
        from; once per chain it may instead end at a client with room (which keeps the
        active) and go on from a client with one to spare (which hands one on without getting
        one)."""
        h = self.holdback
        if h.by_subtopology and self.subtopology != task.subtopology:
            self.subtopology = task.subtopology
            self.spare_list = None
        source = self.where[task]
        owing = source == h.previous.get(task)  # one move more: a give-back must follow
        if not owing and h.ready_on(task, source):
            return False
        links, ends = self.search(pid, owing)
        end = ends.get(source)
        if end is None:
            return False
        link = links[end]
        while link is not None:
            came_from, handed = link
            if handed is not None:
                self.move(handed, came_from[0], end[0])
            end, link = came_from, links[came_from]
        self.move(task, source, pid)
        return True

    def search(self, pid: str, owing: bool) -> tuple[_Links, dict[str, _State]]:
        """Every state a chain starting at ``pid`` reaches, breadth first over clients in
        process id order, and the first state owing nothing reached at each client: where the
        shortest chain to it ends (cached until a task moves). A client may appear more than
        once in a chain (owing and not, before and after the slack); each task moves at most
        once."""
        key = (pid, owing, self.subtopology)
        if key in self.searches:
            return self.searches[key]
        start: _State = (pid, owing, False)
        links: _Links = {start: None}
        unvisited: dict[tuple[bool, bool], list[str]] = {}
        fanned: set[bool] = set()
        queue = collections.deque([start])
        while queue:
            node = queue.popleft()
            at, owing, slack = node
            if not slack and owing not in fanned and self.room(at):
                fanned.add(owing)
                self._link_spares(node, links, queue)
            if not self.movable(at):
                continue
            used = self._moved_on_chain(node, links)
            movable = [v for v in self.movable(at) if v not in used]
            if not movable:
                continue
            if owing:
                self._link_back_to_owners(node, movable, links, queue)
            unreached = unvisited.get((owing, slack))
            candidates = self.holdback.clients if unreached is None else unreached
            unvisited[owing, slack] = self._link_takers(node, movable, candidates, links, queue)
        ends: dict[str, _State] = {}
        for state in links:
            if not state[1]:
                ends.setdefault(state[0], state)
        self.searches[key] = (links, ends)
        return links, ends

    def _link_spares(self, node: _State, links: _Links, queue: collections.deque[_State]) -> None:
        """The slack reaches every client with one to spare at once; owing, only those that
        can hand an active on (the others end nothing)."""
        at, owing, _ = node
        for spare in self.spares():
            if (
                spare != at
                and (spare, owing, True) not in links
                and not (owing and not self.movable(spare))
            ):
                links[spare, owing, True] = (node, None)
                queue.append((spare, owing, True))

    @staticmethod
    def _moved_on_chain(node: _State, links: _Links) -> set[TaskId | None]:
        """The tasks the chain ending at ``node`` moves already (each moves at most once)."""
        used: set[TaskId | None] = set()
        link = links[node]
        while link is not None:
            used.add(link[1])
            link = links[link[0]]
        return used

    def _link_back_to_owners(
        self,
        node: _State,
        movable: list[TaskId],
        links: _Links,
        queue: collections.deque[_State],
    ) -> None:
        """Owing, a chain may hand a task back to its running owner (then owing nothing),
        whether or not the target gave the owner that task's standby: requiring none made
        the chain that restores the last round's target impossible (the owner that gave a
        task up keeps it as a standby), and convergence took a round more."""
        h, slack = self.holdback, node[2]
        for task in movable:
            owner = h.previous.get(task)
            back: _State = (owner or "", False, slack)
            if owner is not None and back not in links:
                links[back] = (node, task)
                queue.append(back)

    def _link_takers(
        self,
        node: _State,
        movable: list[TaskId],
        candidates: Iterable[str],
        links: _Links,
        queue: collections.deque[_State],
    ) -> list[str]:
        """Link every client of ``candidates`` not reached yet in this state that can take one
        of ``movable`` (not its running owner, no standby of it there); returns those left
        unreached, the candidates of the next node in the same state."""
        h = self.holdback
        _, owing, slack = node
        left: list[str] = []
        for taker in candidates:
            if (taker, owing, slack) in links:
                continue
            given = next(
                (
                    task
                    for task in movable
                    if h.previous.get(task) != taker and task not in h.target[taker].standby
                ),
                None,
            )
            if given is None:
                left.append(taker)
            else:
                links[taker, owing, slack] = (node, given)
                queue.append((taker, owing, slack))
        return left

    def move(self, task: TaskId, src: str, dest: str) -> None:
        self.sets.of(src)[0].remove(task)
        self.sets.of(dest)[0].add(task)
        self.where[task] = dest
        self.count[src] -= 1
        self.count[dest] += 1
        if self.cell_count:
            self.cell_count[src, task.subtopology] -= 1
            self.cell_count[dest, task.subtopology] += 1
        self.searches.clear()
        self.spare_list = None
        self.movables.pop(src, None)
        self.movables.pop(dest, None)


@attrs.define
class _Cells:
    """Balanced per subtopology: each (client, subtopology) cell's floor and ceiling and its
    count, as swaps change them (empty when balancing totals only: every exchange fits)."""

    bounds: dict[tuple[str, int], tuple[int, int]]
    count: dict[tuple[str, int], int]

    def fit(self, task: TaskId, home: str, dest: str, partner: TaskId) -> bool:
        """Whether ``home`` taking ``task`` from ``dest`` for ``partner`` keeps all four cells
        it changes within floor and ceiling (always, for one subtopology)."""
        sub, other = task.subtopology, partner.subtopology
        if not self.count or sub == other:
            return True
        count, bounds = self.count, self.bounds
        return (
            count[home, sub] < bounds[home, sub][1]
            and count[home, other] > bounds[home, other][0]
            and count[dest, other] < bounds[dest, other][1]
            and count[dest, sub] > bounds[dest, sub][0]
        )

    def exchange(self, task: TaskId, home: str, dest: str, partner: TaskId) -> None:
        if self.count:
            for pid, gone, got in ((home, partner, task), (dest, task, partner)):
                self.count[pid, gone.subtopology] -= 1
                self.count[pid, got.subtopology] += 1


class _Pool:
    """The target actives of one client that may be handed away in a swap, split by kind;
    ``stateless`` and ``orphans`` (stateful, nobody caught up) sorted by id."""

    def __init__(self, kept: bool, stateless: list[TaskId], stateful: set[TaskId]) -> None:
        self.kept = kept
        self.stateless = stateless
        self.stateful = stateful
        self.orphans: list[TaskId] = []
        self.taken: set[TaskId] = set()
        #: Whether a task may be the partner sought (per-subtopology cells allow it).
        self.fits: Callable[[TaskId], bool] = lambda u: True
        self.start: dict[int, int] = {}
        #: Per client, the stateful tasks here it is caught up on, sorted.
        self.ready: dict[str, list[TaskId]] = {}

    def first(self, ordered: list[TaskId]) -> TaskId | None:
        """The smallest task of ``ordered`` not taken yet that ``fits``. Taken tasks at the
        front are dropped for good: repeated calls are cheap."""
        i = self.start.get(id(ordered), 0)
        while i < len(ordered) and ordered[i] in self.taken:
            i += 1
        self.start[id(ordered)] = i
        fits = self.fits
        for u in itertools.islice(ordered, i, None):
            if u not in self.taken and fits(u):
                return u
        return None


class _Pools:
    """Swap candidates by (client, whether it ran them), built on first use."""

    def __init__(self, holdback: _Holdback, taken: set[TaskId]) -> None:
        self.holdback = holdback
        self.taken = taken
        self.pools: dict[tuple[str, bool], _Pool] = {}

    def of(self, pid: str, kept: bool) -> _Pool:
        key = (pid, kept)
        if key not in self.pools:
            h = self.holdback
            mine = [u for u in h.target[pid].active if (h.previous.get(u) == pid) == kept]
            stateful = {u for u in mine if u in h.stateful}
            pool = _Pool(kept, sorted(u for u in mine if u not in h.stateful), stateful)
            if not kept:
                pool.orphans = sorted(u for u in stateful if not h.caught_up(u))
            pool.taken = self.taken
            self.pools[key] = pool
        return self.pools[key]


class _Copies:
    """Mutable copies of some clients' target sets, made on first change; the rest shared."""

    def __init__(self, target: dict[str, ClientAssignment]) -> None:
        self.target = target
        self.active: dict[str, set[TaskId]] = {}
        self.standby: dict[str, set[TaskId]] = {}

    def of(self, pid: str) -> tuple[set[TaskId], set[TaskId]]:
        if pid not in self.active:
            self.active[pid] = set(self.target[pid].active)
            self.standby[pid] = set(self.target[pid].standby)
        return self.active[pid], self.standby[pid]

    def result(
        self, warmup: Mapping[str, set[TaskId]] | None = None
    ) -> dict[str, ClientAssignment]:
        warmup = warmup or {}
        changed = self.active.keys() | warmup.keys()
        return {
            pid: a
            if pid not in changed
            else ClientAssignment(
                frozenset(self.active.get(pid, a.active)),
                frozenset(self.standby.get(pid, a.standby)),
                frozenset(warmup.get(pid, ())),
            )
            for pid, a in self.target.items()
        }
