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
   Balanced per subtopology (``balance="subtopology"``, the default), a swap partner and every
   task a chain hands on belong to the subtopology of the task they make way for, and floors
   and ceilings are counted per subtopology too: the target stays balanced per subtopology.
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

While actives are held back the interim assignment can be unbalanced (a caught-up client runs
more than its share); the assignment the rounds converge to is the target, with all the sticky
balance and move guarantees.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from ._ids import TaskId, as_task
from .assignment import ClientAssignment, ClientState
from .errors import AssignmentInputError
from .shares import share_bounds
from .sticky import Balance, StickyTaskAssignor, _balance_mode, _tag_keys, resolve_previous_owners

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
    rack_aware_tags: tuple[str, ...] | None = attrs.field(default=None, converter=_tag_keys)
    #: The target's balance (``StickyTaskAssignor``'s option): ``"subtopology"`` (default)
    #: or ``"total"``. Swaps and chains then keep every client's count of each subtopology.
    balance: Balance = attrs.field(default="subtopology", validator=_balance_mode)

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
    ) -> HighAvailabilityPlan:
        """The interim assignment, its target, and the actives held back (module docstring).

        ``stateful=None`` treats every task as stateful. ``task_racks`` (each task's partition
        leaders' rack) and ``rack_aware_tags`` shape the sticky target as they shape
        ``StickyTaskAssignor.assign``. Raises the ``AssignmentInputError``s that does
        (duplicate process ids, tasks without clients).
        """
        task_list = sorted({as_task(t) for t in tasks})
        client_list = sorted(clients, key=lambda c: c.process_id)
        stateful_list = task_list if stateful is None else [as_task(t) for t in stateful]
        sticky = StickyTaskAssignor(
            self.num_standby_replicas,
            self.acceptable_recovery_lag,
            rack_aware_tags=self.rack_aware_tags,
            balance=self.balance,
        )
        target = sticky.assign(task_list, client_list, stateful_list, task_racks=task_racks)
        return _Holdback(self, task_list, client_list, set(stateful_list), target).plan()


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
        caught up on. Every client keeps its target active and standby counts, and moves do not
        grow, so the target keeps its balance and move guarantees."""
        previous = self.previous
        sets = _Copies(self.target)
        taken: set[TaskId] = set()
        pools = _Pools(self, taken)
        for t, dest in self.moving():
            if t in taken or self.ready_on(t, dest):
                continue
            owner = previous.get(t)
            homes = [owner] if owner is not None else []
            homes += [pid for _, pid in sorted(self.caught_up(t)) if pid not in (owner, dest)]
            for home in homes:
                u = self._partner(t, dest, home, sets, pools)
                if u is None:
                    continue
                home_active, home_standby = sets.of(home)
                dest_active, dest_standby = sets.of(dest)
                home_active.remove(u)
                home_active.add(t)
                dest_active.remove(t)
                dest_active.add(u)
                if t in home_standby:  # then dest held a standby of u: they trade standbys
                    home_standby.remove(t)
                    home_standby.add(u)
                    dest_standby.remove(u)
                    dest_standby.add(t)
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
        self, t: TaskId, dest: str, home: str, sets: _Copies, pools: _Pools
    ) -> TaskId | None:
        """A task the target gives ``home`` that can go to ``dest`` in exchange for ``t``: no
        new wait, no extra move, and the standbys can trade places (None: there is none).

        From ``t``'s running owner only a task it keeps qualifies (the move count stays); from
        another client only a task moving there too (it moves either way). In order: a
        stateless one (nothing to restore), one ``dest`` is caught up on, one nobody is caught
        up on (it restores wherever it goes; not from the owner); the smallest id in each. The
        candidates come from indexes, so a rebalance costs about linear time, not tasks x
        clients."""
        dest_standby = sets.of(dest)[1]
        paired = t in sets.of(home)[1]  # dest must then hold a standby of the partner
        pool = pools.of(home, self.previous.get(t) == home)
        pool.subtopology = t.subtopology if self.by_subtopology else None
        if not paired:
            u = pool.first(pool.stateless, dest_standby, False)
            if u is not None:
                return u
        split = pool.ready.get(dest)
        if split is None:
            # Sorted once per (home, dest): a task changes sets only in a swap that takes it,
            # so whether ``dest`` holds a standby of it stays true for every untaken one. ``t``
            # is never among them: it is ``dest``'s in the target, not ``home``'s.
            mine, ready = pool.stateful, self.caught_up_on(dest)
            small, large = (mine, ready) if len(mine) <= len(ready) else (ready, mine)
            both = sorted(u for u in small if u in large)
            split = (
                [u for u in both if u not in dest_standby],
                [u for u in both if u in dest_standby],
            )
            pool.ready[dest] = split
        best = pool.first(split[paired], dest_standby, paired)
        if best is not None or pool.kept:
            return best
        return pool.first(pool.orphans, dest_standby, paired)

    def steer(self) -> None:
        """Step 3, second part: put tasks on the caught-up copies the target passes over.

        Where shares are uneven, the sticky assignor gives the spare ceilings, and picks which
        of an over-quota owner's tasks it releases, by the counts clients ran, which every
        probing round changes. So a round's target, recomputed from the interim history, can
        pass over the copy the last round warmed up and send a cold client a task instead: the
        warmup is spent again (a scale-out took 5 rounds where 3 do). The last round's target
        is still balanced and move-minimal for the new history, so a target using every warm
        copy exists. For each passed-over caught-up copy (task ``u`` on client ``p``, holding
        no copy of it in the target), in task order, this looks for the shortest chain that
        puts ``u`` on ``p``: ``p`` hands on an active it has no state of and does not own, the
        receiver another, and so on, until the chain hands one to the client ``u`` came from;
        once per chain the active may instead stay on a client with room below its ceilings,
        the chain going on from a client with one to spare above its floors. When ``u`` came
        from its running owner (one move more), one link must hand an active back to its
        running owner (one move less). Nothing is handed to its owner otherwise or to a client
        holding a standby of it, so moves stay as many, standbys stay put, every active and
        load count stays within its floor and ceiling (or does not change), and no task leaves
        state it is caught up on. Chains ignore ``task_racks``, as the swaps above do."""
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
            and t not in target[p].standby
        )
        if not copies:
            return
        chains = _Chains(self)
        for t, _, p in copies:
            if chains.where[t] != p:  # an earlier chain may have put it there
                chains.place(t, p)
        self.target = chains.sets.result()

    def plan(self) -> HighAvailabilityPlan:
        self.swap()
        self.steer()
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
        copies = len(holdback.tasks) + sum(len(a.standby) for a in target.values())
        self.bounds = dict(zip(pids, share_bounds(len(holdback.tasks), caps), strict=True))
        self.load_bounds = dict(zip(pids, share_bounds(copies, caps), strict=True))
        self.count = {p: len(a.active) for p, a in target.items()}
        self.load = {p: len(a.active) + len(a.standby) for p, a in target.items()}
        # Balanced per subtopology, a chain moves tasks of one subtopology only (the one being
        # placed), and room and spare count that subtopology's floors and ceilings too.
        self.subtopology: int | None = None
        self.cell_bounds: dict[tuple[str, int], tuple[int, int]] = {}
        self.cell_count: dict[tuple[str, int], int] = {}
        if holdback.by_subtopology:
            sizes = collections.Counter(t.subtopology for t in holdback.tasks)
            for sub, size in sizes.items():
                for p, bound in zip(pids, share_bounds(size, caps), strict=True):
                    self.cell_bounds[p, sub] = bound
                    self.cell_count[p, sub] = 0
            for p, a in target.items():
                for t in a.active:
                    self.cell_count[p, t.subtopology] += 1
        # Searches and movable tasks of the current target, dropped whenever a task moves.
        self.searches: dict[tuple[str, bool, int | None], tuple[_Links, dict[str, _State]]] = {}
        self.movables: dict[str, list[TaskId]] = {}
        self.spare_list: list[str] | None = None

    def room(self, pid: str) -> bool:
        """Whether ``pid`` can take one more active within its active and load ceilings."""
        sub = self.subtopology
        if sub is not None and self.cell_count[pid, sub] >= self.cell_bounds[pid, sub][1]:
            return False
        return self.count[pid] < self.bounds[pid][1] and self.load[pid] < self.load_bounds[pid][1]

    def spare(self, pid: str) -> bool:
        """Whether ``pid`` can give one active away within its active and load floors."""
        sub = self.subtopology
        if sub is not None and self.cell_count[pid, sub] <= self.cell_bounds[pid, sub][0]:
            return False
        return self.count[pid] > self.bounds[pid][0] and self.load[pid] > self.load_bounds[pid][0]

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
        h = self.holdback
        start: _State = (pid, owing, False)
        links: _Links = {start: None}
        unvisited: dict[tuple[bool, bool], list[str]] = {}
        fanned: set[bool] = set()
        queue = collections.deque([start])
        while queue:
            node = queue.popleft()
            at, owing, slack = node
            if not slack and owing not in fanned and self.room(at):
                # the slack reaches every client with one to spare at once; owing, only those
                # that can hand an active on (the others end nothing)
                fanned.add(owing)
                for b in self.spares():
                    if (
                        b != at
                        and (b, owing, True) not in links
                        and not (owing and not self.movable(b))
                    ):
                        links[b, owing, True] = (node, None)
                        queue.append((b, owing, True))
            if not self.movable(at):
                continue
            used: set[TaskId | None] = set()
            link = links[node]
            while link is not None:
                used.add(link[1])
                link = links[link[0]]
            movable = [v for v in self.movable(at) if v not in used]
            if not movable:
                continue
            if owing:
                for v in movable:
                    owner = h.previous.get(v)
                    back: _State = (owner or "", False, slack)
                    if owner is not None and back not in links and v not in h.target[owner].standby:
                        links[back] = (node, v)
                        queue.append(back)
            left: list[str] = []
            for b in unvisited.get((owing, slack), h.clients):
                if (b, owing, slack) in links:
                    continue
                given = next(
                    (v for v in movable if h.previous.get(v) != b and v not in h.target[b].standby),
                    None,
                )
                if given is None:
                    left.append(b)
                else:
                    links[b, owing, slack] = (node, given)
                    queue.append((b, owing, slack))
            unvisited[owing, slack] = left
        ends: dict[str, _State] = {}
        for state in links:
            if not state[1]:
                ends.setdefault(state[0], state)
        self.searches[key] = (links, ends)
        return links, ends

    def move(self, task: TaskId, src: str, dest: str) -> None:
        self.sets.of(src)[0].remove(task)
        self.sets.of(dest)[0].add(task)
        self.where[task] = dest
        self.count[src] -= 1
        self.load[src] -= 1
        self.count[dest] += 1
        self.load[dest] += 1
        if self.cell_count:
            self.cell_count[src, task.subtopology] -= 1
            self.cell_count[dest, task.subtopology] += 1
        self.searches.clear()
        self.spare_list = None
        self.movables.pop(src, None)
        self.movables.pop(dest, None)


class _Pool:
    """The target actives of one client that may be handed away in a swap, split by kind;
    ``stateless`` and ``orphans`` (stateful, nobody caught up) sorted by id."""

    def __init__(self, kept: bool, stateless: list[TaskId], stateful: set[TaskId]) -> None:
        self.kept = kept
        self.stateless = stateless
        self.stateful = stateful
        self.orphans: list[TaskId] = []
        self.taken: set[TaskId] = set()
        #: The subtopology partners must be of (balanced per subtopology), else None.
        self.subtopology: int | None = None
        self.start: dict[int, int] = {}
        #: Per client, the stateful tasks here it is caught up on: (no standby there, standby).
        self.ready: dict[str, tuple[list[TaskId], list[TaskId]]] = {}

    def first(self, ordered: list[TaskId], standby: set[TaskId], paired: bool) -> TaskId | None:
        """The smallest task of ``ordered`` not taken yet that is in ``standby`` exactly when
        ``paired``. Taken tasks at the front are dropped for good: repeated calls are cheap."""
        i = self.start.get(id(ordered), 0)
        while i < len(ordered) and ordered[i] in self.taken:
            i += 1
        self.start[id(ordered)] = i
        wanted = self.subtopology
        for u in itertools.islice(ordered, i, None):
            if (
                u not in self.taken
                and (u in standby) == paired
                and (wanted is None or u.subtopology == wanted)
            ):
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
