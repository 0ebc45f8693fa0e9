"""Quality of a task assignment (DESIGN §3): validity, balance, moves against their lower bound,
standby coverage and warm takeovers.

Plain functions of (tasks, clients, assignment); used by the tests as oracles, by the benchmarks
and the CLI as reports, and by the simulation pipeline as per-rebalance rows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import attrs

from ._ids import TaskId, as_task
from .assignment import ClientAssignment, ClientState
from .shares import apportion, share_bounds
from .sticky import Balance, resolve_previous_owners
from .sticky.compute_quotas import fewest_moves


@attrs.frozen
class AssignmentMetrics:
    """One assignment's scores. Ratios are 1.0 / 0.0 when there is nothing to measure."""

    tasks: int
    clients: int
    #: Active tasks whose previous owner is still present but no longer runs them.
    moves: int
    #: The least number of moves any balanced assignment needs (DESIGN §3.3): balanced per
    #: subtopology and in total (``subtopology_move_lower_bound``), or with
    #: ``balance="total"`` in total only (``move_lower_bound``).
    move_lower_bound: int
    #: Every client's active count is the floor or ceiling of its capacity share.
    active_balanced: bool
    #: Spread of active tasks per thread: max minus min over clients.
    active_imbalance: float
    #: Spread of active+standby+warmup load per thread: max minus min over clients.
    load_imbalance: float
    standbys_required: int
    standbys_placed: int
    #: Previous standbys (of tasks still stateful and not now active there) kept / dropped.
    standbys_kept: int
    standbys_dropped: int
    #: Stateful tasks that changed client (or lost theirs) landing where state already was / not.
    warm_takeovers: int
    cold_takeovers: int
    #: Every client's actives of each subtopology are the floor or ceiling of its share of it.
    subtopology_balanced: bool
    #: The largest spread, over subtopologies, of one subtopology's active tasks per thread
    #: (max minus min over clients); with a single subtopology, equal to ``active_imbalance``.
    subtopology_imbalance: float = 0.0

    @property
    def standby_coverage(self) -> float:
        """Placed over required standbys."""
        return self.standbys_placed / self.standbys_required if self.standbys_required else 1.0

    @property
    def excess_moves(self) -> int:
        """Moves above the lower bound (0 is optimal)."""
        return self.moves - self.move_lower_bound


def share_balance(
    total: int, counts: Sequence[int], capacities: Sequence[int]
) -> tuple[bool, float]:
    """Whether each client's ``counts`` (units of ``total`` it holds) is the floor or ceiling of
    its capacity share of ``total``, and the spread of counts per capacity unit (max - min)."""
    balanced = True
    for (lo, hi), count in zip(share_bounds(total, capacities), counts, strict=True):
        if not lo <= count <= hi:
            balanced = False
            break
    if not counts:
        return balanced, 0.0
    per_unit = [count / cap for count, cap in zip(counts, capacities, strict=True)]
    return balanced, max(per_unit) - min(per_unit)


def quota_move_lower_bound(total: int, kept: Sequence[int], capacities: Sequence[int]) -> int:
    """The least moves of any assignment of ``total`` units balanced in total, when client
    ``c`` held ``kept[c]`` of them before: ``sum_c max(0, kept_c - q_c)`` with quotas whose
    ceilings go to the largest ``kept_c - floor_c``. What ``move_lower_bound`` computes once
    previous owners are resolved; the simulation pipeline also calls it for partitions."""
    floors = [lo for lo, _ in share_bounds(total, capacities)]
    quotas = apportion(total, capacities, priority=lambda i: (floors[i] - kept[i], i))
    return sum(max(0, k - q) for k, q in zip(kept, quotas, strict=True))


def move_lower_bound(tasks: Iterable[TaskId], clients: Iterable[ClientState]) -> int:
    """``sum_c max(0, K_c - q_c)`` with quotas whose ceilings go to the largest ``K_c - floor``.

    ``K_c`` counts the existing tasks client ``c`` ran before (duplicate claims resolved as the
    assignor does). No balanced assignment moves fewer tasks.
    """
    task_list = list(dict.fromkeys(tasks))
    client_list = sorted(clients, key=lambda c: c.process_id)
    owners = resolve_previous_owners(task_list, client_list)
    kept = {c.process_id: 0 for c in client_list}
    for pid in owners.values():
        kept[pid] += 1
    counts = [kept[c.process_id] for c in client_list]
    return quota_move_lower_bound(len(task_list), counts, [c.capacity for c in client_list])


def subtopology_move_lower_bound(tasks: Iterable[TaskId], clients: Iterable[ClientState]) -> int:
    """The least moves of any assignment balanced per subtopology *and* in total (the default
    target of the sticky assignor, docs/assignor.md).

    With ``K[c][s]`` the tasks of subtopology ``s`` client ``c`` ran before (duplicate claims
    resolved as the assignor does): ``sum K - max sum min(K[c][s], q[c][s])`` over the quota
    matrices ``q`` whose entries are the floor or ceiling of ``tasks(s) * capacity(c) /
    total_capacity``, whose columns sum to ``tasks(s)`` and whose rows to the floor or ceiling
    of the client's total share. Computed exactly (a min-cost flow over clients x
    subtopologies). At least ``move_lower_bound``, which balances totals only.
    """
    task_list = list(dict.fromkeys(map(as_task, tasks)))
    client_list = sorted(clients, key=lambda c: c.process_id)
    totals = Counter(t.subtopology for t in task_list)
    row = {c.process_id: k for k, c in enumerate(client_list)}
    owned: list[list[TaskId]] = [[] for _ in client_list]
    for t, pid in resolve_previous_owners(task_list, client_list).items():
        owned[row[pid]].append(t)
    return _fewest_moves(totals, client_list, owned)


def _fewest_moves(
    totals: Mapping[int, int], clients: Sequence[ClientState], owned: Sequence[Iterable[TaskId]]
) -> int:
    """``subtopology_move_lower_bound`` once previous owners are resolved: ``owned[c]`` are the
    existing tasks client ``c`` ran before, ``totals`` the existing tasks per subtopology."""
    subtopologies = sorted(totals)
    column = {s: k for k, s in enumerate(subtopologies)}
    kept = [[0] * len(column) for _ in clients]
    for row, mine in zip(kept, owned, strict=True):
        for t in mine:
            row[column[t.subtopology]] += 1
    counts = [totals[s] for s in subtopologies]
    return fewest_moves(counts, [c.capacity for c in clients], kept)


def violations(
    tasks: Iterable[TaskId],
    clients: Iterable[ClientState],
    assignment: Mapping[str, ClientAssignment],
    num_standby_replicas: int = 0,
    stateful: Iterable[TaskId] | None = None,
) -> list[str]:
    """Every way ``assignment`` breaks validity (DESIGN §3.1); empty when it is valid."""
    task_set = set(tasks)
    client_list = list(clients)
    stateful_set = task_set if stateful is None else set(stateful) & task_set
    wanted = min(num_standby_replicas, max(0, len(client_list) - 1))
    problems = []
    missing_clients = {c.process_id for c in client_list} - set(assignment)
    if missing_clients:
        problems.append(f"clients missing from the assignment: {sorted(missing_clients)}")
    actives: dict[TaskId, list[str]] = {}
    standbys: dict[TaskId, int] = {}
    for pid, a in sorted(assignment.items()):
        for t in a.active:
            actives.setdefault(t, []).append(pid)
        for t in a.standby | a.warmup:
            if t in a.active:
                problems.append(f"{pid} holds two copies of {t}")
        for t in a.standby:
            standbys[t] = standbys.get(t, 0) + 1
            if t not in stateful_set:
                problems.append(f"{pid} has a standby of stateless or unknown task {t}")
        if a.standby & a.warmup:
            problems.append(f"{pid} holds a standby and a warmup of {sorted(a.standby & a.warmup)}")
    for t in sorted(task_set):
        owners = actives.get(t, [])
        if len(owners) != 1:
            problems.append(f"task {t} has {len(owners)} actives: {owners}")
        if t in stateful_set and standbys.get(t, 0) != wanted:
            problems.append(f"task {t} has {standbys.get(t, 0)} standbys, wants {wanted}")
    unknown = set(actives) - task_set
    if unknown:
        problems.append(f"unknown tasks assigned: {sorted(unknown)}")
    return problems


def evaluate(
    tasks: Iterable[TaskId],
    clients: Iterable[ClientState],
    assignment: Mapping[str, ClientAssignment],
    num_standby_replicas: int = 0,
    stateful: Iterable[TaskId] | None = None,
    balance: Balance = "subtopology",
) -> AssignmentMetrics:
    """Score ``assignment`` of ``tasks`` to ``clients`` (whose history is the previous round).

    ``balance`` says which move bound applies: the sticky assignor's option of that name.

    Computed with set operations per client, which the simulation pipeline needs at every
    rebalance; the task-by-task ``evaluate_per_task`` (the same numbers, property-tested) is the
    reference, and the fallback when two clients claim one previous task or the assignment
    names a client that is not in ``clients``.
    """
    task_list = list(dict.fromkeys(tasks))
    client_list = sorted(clients, key=lambda c: c.process_id)
    known = frozenset(task_list)
    stateful_set = known if stateful is None else frozenset(stateful) & known
    fast = _evaluate_sets(
        task_list, client_list, assignment, num_standby_replicas, stateful_set, known
    )
    if fast is None:
        return evaluate_per_task(
            task_list, client_list, assignment, num_standby_replicas, stateful, balance
        )
    metrics, owned = fast
    return _with_subtopologies(metrics, task_list, client_list, assignment, balance, owned)


def _with_subtopologies(
    metrics: AssignmentMetrics,
    tasks: list[TaskId],
    clients: list[ClientState],
    assignment: Mapping[str, ClientAssignment],
    balance: Balance,
    owned: Sequence[frozenset[TaskId]] | None = None,
) -> AssignmentMetrics:
    """``metrics`` with the per-subtopology balance and spread and, for that balance, its move
    bound. ``owned[c]``: the existing tasks client ``c`` ran before, when claims did not overlap
    (the fast path); then the bound's min-cost flow is skipped when the assignment itself
    proves the bound (``_meets_total_bound``)."""
    totals = Counter(t.subtopology for t in tasks)
    held = {s: [0] * len(clients) for s in totals}
    known = frozenset(tasks)
    for ci, c in enumerate(clients):
        active = assignment.get(c.process_id, _EMPTY).active
        for t in active if active <= known else active & known:
            held[t.subtopology][ci] += 1
    caps = [c.capacity for c in clients]
    balanced, spread = True, 0.0
    for s, total in totals.items():
        ok, gap = share_balance(total, held[s], caps)
        balanced = balanced and ok
        spread = max(spread, gap)
    bound = metrics.move_lower_bound
    if balance == "subtopology" and len(totals) > 1:
        if owned is None:
            bound = subtopology_move_lower_bound(tasks, clients)
        elif not (balanced and _meets_total_bound(metrics, totals, held, caps)):
            bound = _fewest_moves(totals, clients, owned)
    return attrs.evolve(
        metrics,
        move_lower_bound=bound,
        subtopology_balanced=balanced,
        subtopology_imbalance=spread,
    )


def _meets_total_bound(
    metrics: AssignmentMetrics,
    totals: Mapping[int, int],
    held: Mapping[int, Sequence[int]],
    caps: Sequence[int],
) -> bool:
    """Whether the assignment, balanced per subtopology, makes exactly the total-only bound of
    moves and its counts ``held[s][c]`` form an admissible quota matrix (each subtopology fully
    counted, each client's sum the floor or ceiling of its share of all tasks).

    Then the per-subtopology bound equals the moves, with no flow to run: it is at least the
    total-only bound (it balances more), and at most the moves of any assignment whose counts
    are admissible (a client keeps at most ``min(kept, held)`` of each subtopology).
    """
    if metrics.moves != metrics.move_lower_bound:
        return False
    if any(sum(held[s]) != total for s, total in totals.items()):
        return False
    rows = [sum(counts) for counts in zip(*held.values(), strict=True)]
    return all(
        lo <= count <= hi
        for (lo, hi), count in zip(share_bounds(metrics.tasks, caps), rows, strict=True)
    )


def evaluate_per_task(
    tasks: Iterable[TaskId],
    clients: Iterable[ClientState],
    assignment: Mapping[str, ClientAssignment],
    num_standby_replicas: int = 0,
    stateful: Iterable[TaskId] | None = None,
    balance: Balance = "subtopology",
) -> AssignmentMetrics:
    """``evaluate`` the direct way, task by task: the reference the fast path is tested on."""
    task_list = list(dict.fromkeys(tasks))
    client_list = sorted(clients, key=lambda c: c.process_id)
    stateful_set = set(task_list) if stateful is None else set(stateful) & set(task_list)
    empty = ClientAssignment()
    previous = resolve_previous_owners(task_list, client_list)
    moves = sum(1 for t, pid in previous.items() if t not in assignment.get(pid, empty).active)
    warm, cold = _count_takeovers(stateful_set, client_list, assignment, previous)

    caps = [c.capacity for c in client_list]
    got = [assignment.get(c.process_id, empty) for c in client_list]
    bounds = share_bounds(len(task_list), caps)
    balanced = all(lo <= len(a.active) <= hi for (lo, hi), a in zip(bounds, got, strict=True))
    per_thread = [len(a.active) / cap for a, cap in zip(got, caps, strict=True)]
    load = [a.load / cap for a, cap in zip(got, caps, strict=True)]
    kept, dropped = _count_standbys_kept(client_list, got, stateful_set)
    wanted = min(num_standby_replicas, max(0, len(client_list) - 1))
    metrics = AssignmentMetrics(
        tasks=len(task_list),
        clients=len(client_list),
        moves=moves,
        move_lower_bound=move_lower_bound(task_list, client_list),
        active_balanced=balanced,
        active_imbalance=(max(per_thread) - min(per_thread)) if per_thread else 0.0,
        load_imbalance=(max(load) - min(load)) if load else 0.0,
        standbys_required=wanted * len(stateful_set),
        standbys_placed=sum(len(a.standby & stateful_set) for a in got),
        standbys_kept=kept,
        standbys_dropped=dropped,
        warm_takeovers=warm,
        cold_takeovers=cold,
        subtopology_balanced=True,
    )
    return _with_subtopologies(metrics, task_list, client_list, assignment, balance)


def _count_takeovers(
    stateful: set[TaskId],
    clients: Sequence[ClientState],
    assignment: Mapping[str, ClientAssignment],
    previous: Mapping[TaskId, str],
) -> tuple[int, int]:
    """Stateful tasks that changed owner onto a client with local state of them (warm), and
    onto one without (cold)."""
    by_pid = {c.process_id: c for c in clients}
    owner_now = {t: pid for pid, a in assignment.items() for t in a.active}
    warm = cold = 0
    for t in stateful:
        now = owner_now.get(t)
        if now is None or previous.get(t) == now:
            continue
        if now in by_pid and by_pid[now].has_state(t):
            warm += 1
        else:
            cold += 1
    return warm, cold


def _count_standbys_kept(
    clients: Sequence[ClientState], got: Sequence[ClientAssignment], stateful: set[TaskId]
) -> tuple[int, int]:
    """Previous standbys of stateful tasks (not now active there) kept as standbys, and dropped."""
    kept = dropped = 0
    for c, a in zip(clients, got, strict=True):
        for t in c.prev_standby:
            if t in stateful and t not in a.active:
                if t in a.standby:
                    kept += 1
                else:
                    dropped += 1
    return kept, dropped


_EMPTY = ClientAssignment()


def _evaluate_sets(
    tasks: Sequence[TaskId],
    clients: Sequence[ClientState],
    result: Mapping[str, ClientAssignment],
    num_standby_replicas: int,
    stateful: frozenset[TaskId],
    known: frozenset[TaskId],
) -> tuple[AssignmentMetrics, list[frozenset[TaskId]]] | None:
    """``evaluate`` with set operations per client (previous owners resolved once, sets compared
    in C), and the existing tasks each client ran before; ``None`` when ``evaluate_per_task``
    must decide: duplicate previous claims (a zombie) or a result naming a client not in
    ``clients`` (sorted by process id)."""
    n = len(tasks)
    if not result.keys() <= {c.process_id for c in clients}:
        return None
    counts: list[int] = []
    owned: list[frozenset[TaskId]] = []
    for c in clients:
        mine = c.prev_active if c.prev_active <= known else c.prev_active & known
        owned.append(mine)
        counts.append(len(mine))
    claimed = sum(counts)
    if claimed and len(frozenset().union(*owned)) < claimed:
        return None
    caps = [c.capacity for c in clients]
    tally = _Tally(stateful, all_stateful=len(stateful) == n)
    for c, mine, bounds in zip(clients, owned, share_bounds(n, caps), strict=True):
        tally.add(c, mine, bounds, result.get(c.process_id, _EMPTY))
    wanted = min(num_standby_replicas, max(0, len(clients) - 1))
    per_thread, load = tally.per_thread, tally.load
    metrics = AssignmentMetrics(
        tasks=n,
        clients=len(clients),
        moves=tally.moves,
        move_lower_bound=quota_move_lower_bound(n, counts, caps),
        active_balanced=tally.balanced,
        active_imbalance=(max(per_thread) - min(per_thread)) if per_thread else 0.0,
        load_imbalance=(max(load) - min(load)) if load else 0.0,
        standbys_required=wanted * len(stateful),
        standbys_placed=tally.placed,
        standbys_kept=tally.kept,
        standbys_dropped=tally.dropped,
        warm_takeovers=tally.warm,
        cold_takeovers=tally.cold,
        subtopology_balanced=True,  # set by ``_with_subtopologies``
    )
    return metrics, owned


@attrs.define
class _Tally:
    """``_evaluate_sets``'s running sums over the clients, one ``add`` per client."""

    stateful: frozenset[TaskId]
    all_stateful: bool
    moves: int = 0
    warm: int = 0
    cold: int = 0
    kept: int = 0
    dropped: int = 0
    placed: int = 0
    balanced: bool = True
    per_thread: list[float] = attrs.Factory(list)
    load: list[float] = attrs.Factory(list)

    def add(
        self, c: ClientState, mine: frozenset[TaskId], bounds: tuple[int, int], a: ClientAssignment
    ) -> None:
        """Count client ``c``, which ran ``mine`` before and gets ``a`` now (``bounds``: the
        floor and ceiling of its active count)."""
        stateful, all_stateful = self.stateful, self.all_stateful
        active = a.active
        self.moves += len(mine) - len(mine & active)
        gained = active - mine
        if not all_stateful:
            gained &= stateful
        for t in gained:
            if t in c.prev_active or t in c.prev_standby or t in c.lags:
                self.warm += 1
            else:
                self.cold += 1
        if c.prev_standby:
            ps = c.prev_standby - active
            if not all_stateful:
                ps &= stateful
            k = len(ps & a.standby)
            self.kept += k
            self.dropped += len(ps) - k
        self.placed += len(a.standby) if all_stateful else len(a.standby & stateful)
        count = len(active)
        lo, hi = bounds
        self.balanced = self.balanced and lo <= count <= hi
        self.per_thread.append(count / c.capacity)
        self.load.append(a.load / c.capacity)
