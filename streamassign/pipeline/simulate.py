"""Replay churn traces through assignors and score every rebalance (pure Python: no Spark).

:func:`simulate_scenario` generates one trace and runs each requested assignor over all of its
rebalances, producing one :class:`RebalanceRow` per (rebalance, assignor). The Spark job calls it
inside executors (one call per scenario); tests and the benchmark call it directly, and get the
same numbers (assignment time aside).

Per rebalance, a runner builds what each client reports (``ClientState``: what it ran, the
standbys it kept, the lag of state on disk after an outage), runs the assignor, scores the
result (``streamassign.metrics.evaluate``) and prices the takeovers with the restore-cost model:
a task that lands where its state is caught up restores nothing, on a standby the standby's lag,
on a client back from an outage what was written since, elsewhere its whole changelog. Runners
keep their state between rebalances so that the per-step work stays proportional to what
changed.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Protocol, TypedDict

import attrs

from .. import TaskId, TopicPartition
from ..assignment import ClientAssignment, ClientState
from ..ha import HighAvailabilityPlan, HighAvailabilityTaskAssignor
from ..metrics import AssignmentMetrics, evaluate, quota_move_lower_bound, share_balance
from ..sticky import StickyTaskAssignor
from ..streams import ProbingMemory
from .assignors import spec
from .scenarios import (
    MAX_REPLICAS,
    MAX_SCENARIOS,
    Layout,
    PipelineError,
    ScenarioModel,
    Step,
    Trace,
    Workload,
    generate_trace,
    int_at_least,
    seed_in_range,
)

__all__ = [
    "COLUMNS",
    "MIN_PROBING_INTERVAL_S",
    "PROBING_INTERVAL_S",
    "RESTORE_RATE",
    "WARMUPS",
    "RebalanceRow",
    "SimulationJob",
    "Takeover",
    "run_trace",
    "simulate_scenario",
]

_EMPTY: Final = ClientAssignment()
_NO_TASKS: Final[frozenset[TaskId]] = frozenset()


# -- the job and the row ---------------------------------------------------------------------------


_non_negative: Final = int_at_least(0)

#: Records per second one task restores its changelog at: how fast new replicas catch up here,
#: the report's task downtime (records / rate) and plan-standbys' restore outage. The one
#: default of ``simulate --restore-rate`` and ``plan-standbys --restore-rate`` (docs/ha.md's
#: examples use it too), recorded in each run's manifest as ``replica_restore_per_s``.
RESTORE_RATE: Final = 10_000.0

#: ``task:ha``'s warmup replicas at once and seconds between its probing rebalances: the
#: defaults of ``simulate --warmups`` and ``--probing-interval`` (``plan-standbys
#: --probing-interval`` too), and what runs that recorded neither were simulated with.
WARMUPS: Final = 2
PROBING_INTERVAL_S: Final = 600.0
#: The least ``--probing-interval`` the commands take: Kafka Streams refuses a
#: ``probing.rebalance.interval.ms`` below 60000 (``StreamsConfig``, ``atLeast(60 * 1000)``),
#: so a shorter one would model a group no deployment can run.
MIN_PROBING_INTERVAL_S: Final = 60.0


def require_rebalances(model: ScenarioModel, what: str) -> None:
    """Refuse ``steps = 0`` where ``what`` (a sentence's subject: what a command measures) is
    measured over the rebalances after the initial assignment, and there would be none. The
    commands call it; a job itself may hold initial assignments only (tests do)."""
    if model.steps == 0:
        raise PipelineError(
            f"steps = 0: {what} over the rebalances after the initial assignment, and there "
            "would be none; give --steps N (or --param steps=N) with N >= 1"
        )


def _names(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _known_assignors(
    instance: object, attribute: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]
) -> None:
    if not value:
        raise PipelineError("no assignor to simulate")
    for name in value:
        spec(name)  # raises PipelineError naming the known ones


@attrs.frozen(kw_only=True)
class SimulationJob:
    """Everything one simulation needs; a plain value shipped to every executor.

    ``assignors`` are registry names (``streamassign.pipeline.assignors``) already resolved
    (groups expanded, unavailable peers removed). Scenario ``i`` of ``range(scenarios)`` is
    generated from ``trace_seed(seed, i)``.
    """

    workload: Workload
    model: ScenarioModel = attrs.field(factory=ScenarioModel)
    assignors: tuple[str, ...] = attrs.field(converter=_names, validator=_known_assignors)
    scenarios: int = attrs.field(default=100, validator=int_at_least(1, high=MAX_SCENARIOS))
    seed: int = attrs.field(default=0, validator=seed_in_range)
    standby_replicas: int = attrs.field(default=1, validator=int_at_least(0, high=MAX_REPLICAS))
    acceptable_recovery_lag: int = attrs.field(default=10_000, validator=_non_negative)
    #: ``task:ha`` only: warmups at once, time between probing rebalances, and how fast a new
    #: replica (warmup or standby) restores its changelog, records per second.
    max_warmup_replicas: int = attrs.field(
        default=WARMUPS, validator=int_at_least(1, high=MAX_REPLICAS)
    )
    probing_interval_s: float = PROBING_INTERVAL_S
    replica_restore_per_s: float = RESTORE_RATE

    def __attrs_post_init__(self) -> None:
        # Not ``> 0`` alone: infinity passes it, then fails in the executors after Spark starts.
        for name in ("probing_interval_s", "replica_restore_per_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise PipelineError(f"{name} must be a finite number > 0, got {value!r}")

    @property
    def rebalances(self) -> int:
        """Upper bound of the rows the job writes (traces may end early)."""
        return self.scenarios * (self.model.steps + 1) * len(self.assignors)


#: The row schema: (column, type, nullable, meaning). Types are Spark SQL names; nullable
#: columns are null where the notion does not apply (standbys of consumer assignors) or after an
#: assignor error. Documented in docs/pipeline.md; spark.py builds the DataFrame schema from it.
COLUMNS: Final[tuple[tuple[str, str, bool, str], ...]] = (
    ("scenario", "long", False, "scenario number (trace seed: seed and this number)"),
    ("step", "int", False, "rebalance number in the trace; 0 is the initial assignment"),
    ("event", "string", False, "what caused the rebalance (see scenarios.EVENTS)"),
    ("time_s", "double", False, "simulated seconds since the start of the trace"),
    ("assignor", "string", False, "assignor registry name"),
    ("level", "string", False, "task (assigns tasks) or consumer (assigns partitions)"),
    ("clients", "int", False, "processes in the group"),
    ("threads", "int", False, "consumer threads in the group (consumer level: members)"),
    ("tasks", "int", False, "tasks of the topology at this step"),
    ("stateful_tasks", "int", False, "tasks with a store"),
    ("partitions", "int", False, "source partitions (what a consumer assignor assigns)"),
    ("standby_replicas", "int", True, "num_standby_replicas configured (task level)"),
    ("moves", "int", False, "units whose previous owner is still present but lost them"),
    (
        "move_lower_bound",
        "int",
        False,
        "least moves any balanced assignment needs; task level: balanced per subtopology and in"
        " total, consumer level: partitions balanced in total over members",
    ),
    ("active_balanced", "boolean", False, "every owner within floor/ceiling of its share"),
    ("active_imbalance", "double", False, "max - min active units per thread"),
    ("load_imbalance", "double", False, "max - min active+standby units per thread"),
    (
        "subtopology_balanced",
        "boolean",
        False,
        "every owner within floor/ceiling of its share of each subtopology's tasks (consumer"
        " level: a task counts for the member holding its first topic's partition)",
    ),
    (
        "subtopology_imbalance",
        "double",
        False,
        "largest max - min active tasks per thread of one subtopology (counted as above)",
    ),
    ("standbys_required", "int", True, "min(standbys, clients - 1) x stateful tasks"),
    ("standbys_placed", "int", True, "standbys of stateful tasks placed"),
    ("standby_coverage", "double", True, "placed / required (1.0 when none required)"),
    ("standbys_kept", "int", True, "previous standbys kept"),
    ("standbys_dropped", "int", True, "previous standbys dropped"),
    ("warm_takeovers", "int", False, "stateful tasks placed on a new owner with local state"),
    (
        "cold_takeovers",
        "int",
        False,
        "stateful tasks placed on a new owner without local state: moved from another owner, "
        "or new (every task of the initial assignment, a partition expansion's new tasks)",
    ),
    ("unassigned", "int", False, "units left without an active owner"),
    ("split_tasks", "int", False, "tasks whose partitions went to several consumers"),
    ("records_to_restore", "long", False, "changelog records new owners must restore"),
    ("restoring_tasks", "int", False, "stateful tasks with records to restore"),
    ("max_task_restore", "long", False, "largest single task restore, records"),
    ("standby_restore_records", "long", True, "records newly placed standbys must copy"),
    ("assign_ms", "double", False, "wall time of the assignor call, milliseconds"),
    ("error", "string", True, "the assignor's exception, if it failed (trace stops there)"),
    ("warmups", "int", True, "warmup replicas placed by this rebalance (task level)"),
    (
        "probing_rebalances",
        "int",
        True,
        "task:ha probing rebalances after it, before the next event",
    ),
    (
        "balanced_after_s",
        "double",
        True,
        "seconds until actives are balanced; null: not before the next event",
    ),
)


@attrs.frozen(slots=True)
class RebalanceRow:
    """One rebalance scored for one assignor; fields in :data:`COLUMNS` order."""

    scenario: int
    step: int
    event: str
    time_s: float
    assignor: str
    level: str
    clients: int
    threads: int
    tasks: int
    stateful_tasks: int
    partitions: int
    standby_replicas: int | None
    moves: int
    move_lower_bound: int
    active_balanced: bool
    active_imbalance: float
    load_imbalance: float
    subtopology_balanced: bool
    subtopology_imbalance: float
    standbys_required: int | None
    standbys_placed: int | None
    standby_coverage: float | None
    standbys_kept: int | None
    standbys_dropped: int | None
    warm_takeovers: int
    cold_takeovers: int
    unassigned: int = 0
    split_tasks: int = 0
    records_to_restore: int = 0
    restoring_tasks: int = 0
    max_task_restore: int = 0
    standby_restore_records: int | None = None
    assign_ms: float = 0.0
    error: str | None = None
    warmups: int | None = None
    probing_rebalances: int | None = None
    balanced_after_s: float | None = None

    def values(self) -> tuple[Any, ...]:
        """The row as a tuple in :data:`COLUMNS` order (what Spark receives)."""
        return attrs.astuple(self, recurse=False)


@attrs.frozen(slots=True)
class Takeover:
    """A task whose active copy changed hands (or lost its owner) in one rebalance.

    ``cause``: ``move`` (its previous owner is still running: a planned move), ``crash`` (the
    owner crashed or lost its rack in this rebalance), ``restart`` (the owner is rejoining after
    ``outage_s`` of downtime), ``leave`` (the owner left gracefully) or ``new`` (no previous owner:
    initial assignment, new partitions, owner gone earlier). ``records`` is what the new owner
    restores (0 for a stateless task); ``warm`` whether it held state of the task.
    """

    task: TaskId
    cause: str
    records: int
    outage_s: float
    stateful: bool


# -- shared per-trace context ----------------------------------------------------------------------


class _Context:
    """What every runner of one trace shares: tasks per layout and the changelog model."""

    def __init__(self, job: SimulationJob, trace: Trace) -> None:
        self.job = job
        self.trace = trace
        model = job.model
        self.standby_lag = model.standby_lag_records
        self.layouts = trace.layouts()
        rng = random.Random(trace.state_seed)
        sigma = model.size_skew
        mu = -sigma * sigma / 2  # log-normal with mean 1
        #: task -> (records at birth, records per second, birth time)
        self.changelog: dict[TaskId, tuple[float, float, float]] = {}
        self._tasks: dict[int, tuple[list[TaskId], list[TaskId], frozenset[TaskId]]] = {}
        for step, layout in zip(trace.steps, self.layouts, strict=True):
            if layout.version in self._tasks:
                continue
            tasks = layout.tasks()
            stateful = layout.stateful_tasks()
            self._tasks[layout.version] = (tasks, stateful, frozenset(stateful))
            base = model.changelog_records if step.index == 0 else 0
            for t in stateful:
                if t not in self.changelog:
                    w = rng.lognormvariate(mu, sigma) if sigma > 0 else 1.0
                    self.changelog[t] = (w * base, w * model.write_rate, step.time_s)

    def tasks(self, layout: Layout) -> tuple[list[TaskId], list[TaskId], frozenset[TaskId]]:
        """(all tasks sorted, stateful tasks sorted, stateful set) of a layout."""
        return self._tasks[layout.version]

    def end(self, task: TaskId, now: float) -> int:
        """Changelog end offset of a stateful task at ``now``: its size in records."""
        base, rate, born = self.changelog[task]
        return int(base + rate * (now - born))

    def row_base(
        self, step: Step, layout: Layout, assignor: str, level: str, clients: int, threads: int
    ) -> dict[str, Any]:
        """The columns of a row that describe the rebalance rather than the assignor's result."""
        tasks, stateful, _ = self.tasks(layout)
        return {
            "scenario": self.trace.scenario,
            "step": step.index,
            "event": step.event,
            "time_s": step.time_s,
            "assignor": assignor,
            "level": level,
            "clients": clients,
            "threads": threads,
            "tasks": len(tasks),
            "stateful_tasks": len(stateful),
            "partitions": layout.partitions,
        }


Positions = dict[TaskId, int]


def _client_state(
    pid: str,
    threads: int,
    active: frozenset[TaskId],
    standby: frozenset[TaskId],
    lags: dict[TaskId, int],
    rack: str,
) -> ClientState:
    """A ``ClientState`` from values this module built itself; the constructor keeps sets of
    ``TaskId`` and int lags as they are (its converters only check them: about 7 us for a
    client with 40 tasks, not the 120 us of rebuilding every id)."""
    return ClientState(pid, threads, active, standby, lags, rack)


class Runner(Protocol):
    """Replays one trace through one assignor, one step at a time."""

    def step(self, step: Step, layout: Layout) -> RebalanceRow: ...


# -- row columns shared by the runners -----------------------------------------------------------


class _RestoreColumns(TypedDict):
    records_to_restore: int
    restoring_tasks: int
    max_task_restore: int


@attrs.define
class _Restores:
    """What the new active owners of one rebalance restore: records, tasks, the largest one."""

    records: int = 0
    tasks: int = 0
    largest: int = 0

    def add(self, records: int) -> None:
        """Count one takeover that restores ``records`` (0: nothing to restore)."""
        if records:
            self.records += records
            self.tasks += 1
            self.largest = max(self.largest, records)

    def columns(self) -> _RestoreColumns:
        return {
            "records_to_restore": self.records,
            "restoring_tasks": self.tasks,
            "max_task_restore": self.largest,
        }


#: The scores of a rebalance whose assignor failed: nothing moved, nothing balanced.
_FAILED: Final = AssignmentMetrics(
    tasks=0,
    clients=0,
    moves=0,
    move_lower_bound=0,
    active_balanced=False,
    active_imbalance=0.0,
    load_imbalance=0.0,
    standbys_required=0,
    standbys_placed=0,
    standbys_kept=0,
    standbys_dropped=0,
    warm_takeovers=0,
    cold_takeovers=0,
    subtopology_balanced=False,
)


def _row(
    base: dict[str, Any],
    scores: AssignmentMetrics | None,
    standby_replicas: int | None,
    restores: _Restores,
    **rest: Any,
) -> RebalanceRow:
    """The one way a row is built: the rebalance (``base``), the assignor's scores
    (``streamassign.metrics``; None when it failed), its standby setting (None at consumer
    level: no standby columns), what its takeovers restore, and the remaining columns."""
    m = _FAILED if scores is None else scores
    standbys = standby_replicas is not None and scores is not None
    return RebalanceRow(
        **base,
        standby_replicas=standby_replicas,
        moves=m.moves,
        move_lower_bound=m.move_lower_bound,
        active_balanced=m.active_balanced,
        active_imbalance=m.active_imbalance,
        load_imbalance=m.load_imbalance,
        subtopology_balanced=m.subtopology_balanced,
        subtopology_imbalance=m.subtopology_imbalance,
        standbys_required=m.standbys_required if standbys else None,
        standbys_placed=m.standbys_placed if standbys else None,
        standby_coverage=m.standby_coverage if standbys else None,
        standbys_kept=m.standbys_kept if standbys else None,
        standbys_dropped=m.standbys_dropped if standbys else None,
        warm_takeovers=m.warm_takeovers,
        cold_takeovers=m.cold_takeovers,
        **restores.columns(),
        **rest,
    )


def _error_row(
    base: dict[str, Any], exc: BaseException, standby_replicas: int | None
) -> RebalanceRow:
    """A row saying the assignor failed at this step; the trace stops there for it."""
    return _row(
        base,
        None,
        standby_replicas,
        _Restores(),
        standby_restore_records=None if standby_replicas is None else 0,
        error=f"{type(exc).__name__}: {exc}"[:500],
    )


# -- task-level runners ----------------------------------------------------------------------------

#: ``(step, layout, tasks, clients, stateful) -> (result, seconds)``: one assignor call.
TaskAssign = Callable[
    [Step, Layout, list[TaskId], list[ClientState], list[TaskId]],
    tuple[dict[str, ClientAssignment], float],
]


class _TaskRunner:
    """A task assignor over one trace; history is the truth of what each client holds."""

    def __init__(self, ctx: _Context, name: str, assign: TaskAssign, collect: bool = False) -> None:
        self.ctx = ctx
        self.name = name
        self.assign = assign
        self.replicas = ctx.job.standby_replicas
        #: what each client present at the previous step holds
        self.assignment: dict[str, ClientAssignment] = {}
        #: ClientState of running clients, reused while their assignment is the same object
        self.states: dict[str, tuple[ClientAssignment, ClientState]] = {}
        #: state on disk of crashed clients: task -> changelog offset it holds
        self.disk: dict[str, Positions] = {}
        self.collect = collect
        #: per step, the takeovers (only when ``collect``; plan-standbys uses them)
        self.takeovers: list[list[Takeover]] = []
        #: time of the rebalance being priced, seconds
        self.now = 0.0
        #: process id -> task -> (time placed, lag then) of its replicas still restoring (no
        #: entry for a client with none); new replicas restore at ``replica_restore_per_s``
        #: for every task-level runner alike
        self.restoring: dict[str, dict[TaskId, tuple[float, int]]] = {}

    def _snapshot(
        self, held: ClientAssignment, at: float, stateful: frozenset[TaskId]
    ) -> Positions:
        """Offsets of the state a client holds at time ``at`` (actives caught up, standbys
        behind by the standby lag)."""
        end = self.ctx.end
        lag = self.ctx.standby_lag
        pos = {t: max(0, end(t, at) - lag) for t in held.standby | held.warmup if t in stateful}
        pos.update((t, end(t, at)) for t in held.active if t in stateful)
        return pos

    def _lag(self, placed: tuple[float, int]) -> int:
        """How far behind a replica placed at ``(time, lag then)`` is now: the standby lag once
        restored."""
        at, lag = placed
        rate = self.ctx.job.replica_restore_per_s
        return max(self.ctx.standby_lag, int(lag - rate * (self.now - at)))

    def _running_state(
        self, pid: str, threads: int, rack: str, held: ClientAssignment
    ) -> ClientState:
        cached = self.states.get(pid)
        restoring = self.restoring.get(pid)
        if cached is not None and cached[0] is held and not restoring:
            return cached[1]
        standby = held.standby | held.warmup
        lags = dict.fromkeys(standby, self.ctx.standby_lag)
        if restoring:  # lags change with time: no reuse
            lags.update((t, self._lag(placed)) for t, placed in restoring.items() if t in lags)
            self.states.pop(pid, None)
        state = _client_state(pid, threads, held.active, standby, lags, rack)
        if not restoring:
            self.states[pid] = (held, state)
        return state

    def _track(self, clients: list[ClientState], stateful: frozenset[TaskId]) -> None:
        """Start the restore clock of replicas placed where no caught-up state was, after
        ``self.assignment`` became the result for ``clients``."""
        now, lag = self.now, self.ctx.standby_lag
        restoring: dict[str, dict[TaskId, tuple[float, int]]] = {}
        for c in clients:
            a = self.assignment.get(c.process_id, _EMPTY)
            before = self.restoring.get(c.process_id, {})
            mine: dict[TaskId, tuple[float, int]] = {}
            for t in (a.standby | a.warmup) & stateful:
                placed = before.get(t)
                if placed is not None:
                    if self._lag(placed) > lag:
                        mine[t] = placed
                elif t in c.prev_active:
                    continue
                elif t in c.prev_standby:
                    if c.lags.get(t, lag) > lag:  # back from an outage, behind
                        mine[t] = (now, c.lags[t])
                else:
                    mine[t] = (now, self.ctx.end(t, now))
            if mine:
                restoring[c.process_id] = mine
        self.restoring = restoring

    def step(self, step: Step, layout: Layout) -> RebalanceRow:
        ctx = self.ctx
        self.now = step.time_s
        tasks, stateful_list, stateful = ctx.tasks(layout)
        before = self.assignment
        owner_before: dict[TaskId, str] = {}
        if self.collect:
            owner_before = {t: pid for pid, a in before.items() for t in a.active}
        causes, returning = self._remove_departed(step, before, stateful)
        clients = self._client_states(step, before, returning)
        base = ctx.row_base(step, layout, self.name, "task", len(clients), step.threads)
        try:
            result, seconds = self.assign(step, layout, tasks, clients, stateful_list)
        except Exception as exc:  # a peer's failure is a result to report, not a crash
            return _error_row(base, exc, self.replicas)
        metrics = evaluate(tasks, clients, result, self.replicas, stateful)
        restores = _Restores()
        standby_records = 0
        takeovers: list[Takeover] = []
        for c in clients:
            a = result.get(c.process_id, _EMPTY)
            pos = returning.get(c.process_id)
            self._add_restores_and_takeovers(
                c, a, pos, stateful, owner_before, causes, restores, takeovers
            )
            standby_records += self._standby_records(c, a, pos, before)
        if self.collect:
            self.takeovers.append(takeovers)

        # Keep the previous object when nothing changed, so its ClientState is reused.
        self.assignment = {
            pid: (old if (old := before.get(pid)) is not None and old == a else a)
            for pid, a in result.items()
        }
        self._track(clients, stateful)
        return _row(
            base,
            metrics,
            self.replicas,
            restores,
            unassigned=len(tasks) - len(frozenset().union(*(a.active for a in result.values()))),
            standby_restore_records=standby_records,
            assign_ms=seconds * 1e3,
            warmups=sum(len(a.warmup) for a in result.values()),
            probing_rebalances=0,
            balanced_after_s=0.0 if metrics.active_balanced else None,
        )

    def _remove_departed(
        self, step: Step, before: dict[str, ClientAssignment], stateful: frozenset[TaskId]
    ) -> tuple[dict[str, tuple[str, float]], dict[str, Positions]]:
        """Take crashed, leaving and returning processes out of ``before``: why each one's
        tasks move (cause, outage seconds), and the local state each returning one has."""
        now = self.now
        causes: dict[str, tuple[str, float]] = {}
        for pid in step.crashed:
            held = before.pop(pid, None)
            self.states.pop(pid, None)
            if held is not None:
                self.disk[pid] = self._snapshot(held, now, stateful)
            causes[pid] = ("crash", 0.0)
        for pid in step.left:
            before.pop(pid, None)
            self.states.pop(pid, None)
            self.disk.pop(pid, None)
            causes[pid] = ("leave", 0.0)
        returning: dict[str, Positions] = {}
        for back in step.returning:
            held = before.pop(back.pid, None)
            self.states.pop(back.pid, None)
            if held is not None:  # a restart in place: state as it was when it went down
                disk = self._snapshot(held, back.down_since_s, stateful)
                causes[back.pid] = ("restart", now - back.down_since_s)
            else:
                disk = self.disk.pop(back.pid, {})
            returning[back.pid] = disk if back.disk_kept else {}
        return causes, returning

    def _client_states(
        self,
        step: Step,
        before: Mapping[str, ClientAssignment],
        returning: Mapping[str, Positions],
    ) -> list[ClientState]:
        """Every member as the assignor sees it: returning with its local state, running with
        what it ran, or new."""
        ctx, now = self.ctx, self.now
        clients: list[ClientState] = []
        for m in step.members:
            pos = returning.get(m.pid)
            held = before.get(m.pid)
            if pos is not None:
                clients.append(
                    ClientState(
                        m.pid,
                        m.threads,
                        prev_standby=pos.keys(),
                        lags={t: max(0, ctx.end(t, now) - x) for t, x in pos.items()},
                        rack=m.rack,
                    )
                )
            elif held is not None:
                clients.append(self._running_state(m.pid, m.threads, m.rack, held))
            else:
                clients.append(ClientState(m.pid, m.threads, rack=m.rack))
        return clients

    def _add_restores_and_takeovers(
        self,
        c: ClientState,
        a: ClientAssignment,
        pos: Positions | None,
        stateful: frozenset[TaskId],
        owner_before: Mapping[TaskId, str],
        causes: Mapping[str, tuple[str, float]],
        restores: _Restores,
        takeovers: list[Takeover],
    ) -> None:
        """Add the records each new active of ``c`` restores (``pos``: its local state when it
        returns) to ``restores``, and, when collecting, its takeovers."""
        end, lag, now = self.ctx.end, self.ctx.standby_lag, self.now
        for t in a.active - c.prev_active:
            r = 0
            if t in stateful:
                size = end(t, now)
                if pos is not None:
                    x = pos.get(t)
                    r = size if x is None else max(0, size - x)
                elif t in c.prev_standby:  # a replica, perhaps still restoring
                    r = min(c.lags.get(t, lag), size)
                else:
                    r = size
                restores.add(r)
            if self.collect:
                prev = owner_before.get(t)
                cause, outage = ("new", 0.0) if prev is None else causes.get(prev, ("move", 0.0))
                takeovers.append(Takeover(t, cause, r, outage, t in stateful))

    def _standby_records(
        self,
        c: ClientState,
        a: ClientAssignment,
        pos: Positions | None,
        before: Mapping[str, ClientAssignment],
    ) -> int:
        """Records ``c``'s new standbys copy (all its standbys when it returns)."""
        end, now = self.ctx.end, self.now
        records = 0
        if pos is not None:
            for t in a.standby:
                x = pos.get(t)
                size = end(t, now)
                records += size if x is None else max(0, size - x)
        elif a is not before.get(c.process_id):
            for t in a.standby - c.prev_standby - c.prev_active:
                records += end(t, now)
        return records


class _HaRunner(_TaskRunner):
    """``task:ha``: each event's rebalance, then the probing rebalances that follow it every
    ``probing_interval_s`` until nothing is held back or the next event comes. The leader
    stays: its ``ProbingMemory`` offers each plan the last one (ha.md rule 8). New replicas
    (warmups, standbys) restore at ``replica_restore_per_s``; a held-back active moves once
    its target is caught up, restoring the small lag left. The event's row adds the probing
    rebalances' restores and says how many there were and when actives were balanced."""

    def __init__(self, ctx: _Context, name: str, collect: bool = False) -> None:
        job = ctx.job
        self.ha = HighAvailabilityTaskAssignor(
            job.standby_replicas,
            job.acceptable_recovery_lag,
            job.max_warmup_replicas,
            max(1, round(job.probing_interval_s * 1000)),
        )
        super().__init__(ctx, name, self._plan, collect)
        #: The simulated leader's memory of its last plan (it never changes leader).
        self.memory = ProbingMemory()
        self.last: HighAvailabilityPlan | None = None
        self.last_clients: list[ClientState] = []

    def _plan(
        self,
        step: Step,
        layout: Layout,
        tasks: list[TaskId],
        clients: list[ClientState],
        stateful: list[TaskId],
    ) -> tuple[dict[str, ClientAssignment], float]:
        start = time.perf_counter()
        self.last = self.memory.plan(self.ha, tasks, clients, stateful)
        seconds = time.perf_counter() - start
        self.last_clients = clients
        return dict(self.last.assignment), seconds

    def step(self, step: Step, layout: Layout) -> RebalanceRow:
        row = super().step(step, layout)
        if row.error is not None or self.last is None:
            return row
        tasks, stateful_list, stateful = self.ctx.tasks(layout)
        steps = self.ctx.trace.steps
        until = steps[step.index + 1].time_s if step.index + 1 < len(steps) else float("inf")
        interval = self.ctx.job.probing_interval_s
        bound = 2 * len(stateful_list) * (1 + self.replicas) + 1
        restores = _Restores(row.records_to_restore, row.restoring_tasks, row.max_task_restore)
        copies = row.standby_restore_records or 0
        for c in self.last_clients:  # the base runner prices new standbys, not warmups
            for t in self.assignment[c.process_id].warmup - c.prev_active:
                copies += c.lags.get(t, self.ctx.end(t, self.now))
        plan, rounds = self.last, 0
        balanced = row.balanced_after_s if not plan.probing_rebalance_needed else None
        while plan.probing_rebalance_needed and rounds < bound:
            if self.now + interval >= until:
                break
            self.now += interval
            rounds += 1
            members = [(m.pid, m.threads, m.rack) for m in step.members]
            clients = [self._running_state(*m, self.assignment[m[0]]) for m in members]
            plan = self.memory.plan(self.ha, tasks, clients, stateful_list)
            for c in clients:
                a = plan.assignment[c.process_id]
                for t in (a.active - c.prev_active) & stateful:
                    size = self.ctx.end(t, self.now)
                    restores.add(min(c.lags[t], size) if t in c.lags else size)
                for t in (a.standby | a.warmup) - c.prev_standby - c.prev_active:
                    copies += self.ctx.end(t, self.now) if t in stateful else 0
            self.last, self.last_clients, self.assignment = plan, clients, dict(plan.assignment)
            self._track(clients, stateful)
            if not plan.probing_rebalance_needed:
                balanced = self.now - step.time_s
        return attrs.evolve(
            row,
            **restores.columns(),
            standby_restore_records=copies,
            probing_rebalances=rounds,
            balanced_after_s=balanced,
        )


def _sticky_assign(job: SimulationJob) -> TaskAssign:
    assignor = StickyTaskAssignor(job.standby_replicas, job.acceptable_recovery_lag)

    def run(
        step: Step,
        layout: Layout,
        tasks: list[TaskId],
        clients: list[ClientState],
        stateful: list[TaskId],
    ) -> tuple[dict[str, ClientAssignment], float]:
        start = time.perf_counter()
        result = assignor.assign(tasks, clients, stateful)
        return result, time.perf_counter() - start

    return run


def _faust_assign(job: SimulationJob) -> TaskAssign:
    from .peers import FaustPeer

    peer = FaustPeer()

    def run(
        step: Step,
        layout: Layout,
        tasks: list[TaskId],
        clients: list[ClientState],
        stateful: list[TaskId],
    ) -> tuple[dict[str, ClientAssignment], float]:
        restarted = frozenset(r.pid for r in step.returning)
        return peer.assign(clients, restarted, layout, job.standby_replicas)

    return run


# -- consumer-level runners ------------------------------------------------------------------------

#: ``(partitions per topic, topics, member -> partitions it received last or None) ->
#: (member -> partitions, seconds)``: one consumer-group assignment.
ConsumerAssign = Callable[
    [Mapping[str, int], Sequence[str], Mapping[str, Sequence[TopicPartition] | None]],
    tuple[dict[str, list[TopicPartition]], float],
]


@attrs.frozen
class _ConsumerLayout:
    """A layout seen by a consumer group: topics, and which task each partition belongs to."""

    partitions_per_topic: dict[str, int]
    topics: tuple[str, ...]
    task_of: dict[TopicPartition, TaskId]
    #: subtopology -> its tasks
    tasks_of: dict[int, int]
    #: each task's anchor: its partition of the first topic (by name) that has one. The member
    #: holding it counts the task in the per-subtopology balance.
    first_of: dict[TopicPartition, TaskId]
    #: the anchors of stateful tasks: where a task's state lives
    anchor: dict[TopicPartition, TaskId]

    @classmethod
    def of(cls, layout: Layout) -> _ConsumerLayout:
        task_of: dict[TopicPartition, TaskId] = {}
        first_of: dict[TopicPartition, TaskId] = {}
        anchored: set[TaskId] = set()
        for topic, sub, n in layout.topics:  # sorted by topic
            for p in range(n):
                tp = TopicPartition(topic, p)
                t = TaskId(sub, p)
                task_of[tp] = t
                if t not in anchored:
                    first_of[tp] = t
                    anchored.add(t)
        stateful = layout.stateful_subtopologies
        anchor = {tp: t for tp, t in first_of.items() if t.subtopology in stateful}
        counts = {t: n for t, _, n in layout.topics}
        return cls(counts, tuple(counts), task_of, dict(layout.task_counts), first_of, anchor)


def _member_ids(pid: str, threads: int) -> list[str]:
    return [f"{pid}-t{k:02d}" for k in range(threads)]


class _ConsumerRunner:
    """A consumer-group assignor over one trace: every thread of a client is one member.

    Scored per partition (moves, their bound, balance in total over members), plus what a
    topology needs that a plain consumer group does not know: tasks whose co-partitioned
    partitions split over members; balance per subtopology in tasks, a task counting for the
    member holding its anchor (its first topic's partition), so that an assignor keeping joins
    together is not penalised for the partitions its tasks bring along (splits are their own
    column); and where each stateful task's state lives (with its anchor: its *host*), priced
    with the same restore model as the task assignors. No standbys at this level.
    """

    def __init__(self, ctx: _Context, name: str, assign: ConsumerAssign) -> None:
        self.ctx = ctx
        self.name = name
        self.assign = assign
        self.owned: dict[str, list[TopicPartition]] = {}
        #: stateful task -> process hosting its state, and the reverse
        self.host: dict[TaskId, str] = {}
        self.hosted: dict[str, set[TaskId]] = {}
        self.disk: dict[str, Positions] = {}
        self.layouts: dict[int, _ConsumerLayout] = {}

    def _snapshot(self, pid: str, at: float) -> Positions:
        return {t: self.ctx.end(t, at) for t in self.hosted.get(pid, ())}

    def _forget(self, pid: str) -> None:
        for t in self.hosted.pop(pid, ()):
            if self.host.get(t) == pid:
                del self.host[t]

    def step(self, step: Step, layout: Layout) -> RebalanceRow:
        ctx = self.ctx
        self.now = step.time_s
        cl = self.layouts.get(layout.version)
        if cl is None:
            cl = self.layouts[layout.version] = _ConsumerLayout.of(layout)
        returning = self._remove_departed(step)
        process_of: dict[str, str] = {}
        history: dict[str, Sequence[TopicPartition] | None] = {}
        for m in step.members:
            fresh = m.pid in returning
            for mid in _member_ids(m.pid, m.threads):
                process_of[mid] = m.pid
                history[mid] = None if fresh else self.owned.get(mid)
        base = ctx.row_base(step, layout, self.name, "consumer", len(step.members), len(process_of))
        try:
            result, seconds = self.assign(cl.partitions_per_topic, cl.topics, history)
        except Exception as exc:
            return _error_row(base, exc, None)
        members = sorted(process_of)
        spread = _PartitionSpread.of(members, result, history, cl)
        restores, warm, cold = self._move_state(cl, spread.assigned, process_of, returning)
        self.owned = {
            mid: (old if (old := self.owned.get(mid)) is not None and old == got else got)
            for mid, got in result.items()
        }
        total = layout.partitions
        scores = _consumer_scores(total, len(members), spread, cl.tasks_of, warm, cold)
        return _row(
            base,
            scores,
            None,
            restores,
            unassigned=total - len(spread.assigned),
            split_tasks=len(_split_tasks(spread.assigned, cl)),
            assign_ms=seconds * 1e3,
        )

    def _remove_departed(self, step: Step) -> dict[str, Positions]:
        """Forget the state crashed, leaving and returning processes hosted (kept on disk for
        crashes); the local state each returning one has."""
        gone: set[str] = set()
        for pid in step.crashed:
            self.disk[pid] = self._snapshot(pid, self.now)
            gone.add(pid)
        for pid in step.left:
            self.disk.pop(pid, None)
            gone.add(pid)
        returning: dict[str, Positions] = {}
        for back in step.returning:
            if back.pid in self.hosted:  # restart in place
                disk = self._snapshot(back.pid, back.down_since_s)
            else:
                disk = self.disk.pop(back.pid, {})
            returning[back.pid] = disk if back.disk_kept else {}
            gone.add(back.pid)
        for pid in gone:
            self._forget(pid)
        return returning

    def _move_state(
        self,
        cl: _ConsumerLayout,
        assigned: Mapping[TopicPartition, str],
        process_of: Mapping[str, str],
        returning: Mapping[str, Positions],
    ) -> tuple[_Restores, int, int]:
        """Move each stateful task's state host to the process of its anchor's member: the
        records restored, and the warm and cold takeovers."""
        end, now = self.ctx.end, self.now
        restores = _Restores()
        warm = cold = 0
        host: dict[TaskId, str] = {}
        for tp, t in cl.anchor.items():
            mid_now = assigned.get(tp)
            if mid_now is None:
                continue
            pid = process_of[mid_now]
            host[t] = pid
            if self.host.get(t) == pid:
                continue  # same process (its threads share the state directory)
            pos = returning.get(pid)
            x = None if pos is None else pos.get(t)
            size = end(t, now)
            if x is None:
                cold += 1
                restores.add(size)
            else:
                warm += 1
                restores.add(max(0, size - x))
        self.host = host
        self.hosted = {}
        for t, pid in host.items():
            self.hosted.setdefault(pid, set()).add(t)
        return restores, warm, cold


@attrs.frozen
class _PartitionSpread:
    """How a consumer assignment spreads partitions over members (sorted): each one's count
    before and now, its anchors per subtopology, the moves, and each partition's member."""

    #: partitions each member (in ``members`` order) held before, and holds now
    held_counts: list[int]
    now_counts: list[int]
    #: subtopology -> tasks of it whose anchor each member (in ``members`` order) got
    per_sub: dict[int, list[int]]
    moves: int
    assigned: dict[TopicPartition, str]

    @classmethod
    def of(
        cls,
        members: Sequence[str],
        result: Mapping[str, Sequence[TopicPartition]],
        history: Mapping[str, Sequence[TopicPartition] | None],
        cl: _ConsumerLayout,
    ) -> _PartitionSpread:
        held_counts: list[int] = []
        now_counts: list[int] = []
        per_sub = {sub: [0] * len(members) for sub in cl.tasks_of}
        moves = 0
        assigned: dict[TopicPartition, str] = {}
        for k, mid in enumerate(members):
            got = result.get(mid, [])
            held = history[mid] or ()
            held_counts.append(len(held))
            now_counts.append(len(got))
            if held:
                moves += len(held) - len(set(held).intersection(got))
            for tp in got:
                assigned.setdefault(tp, mid)
                t = cl.first_of.get(tp)
                if t is not None:
                    per_sub[t.subtopology][k] += 1
        return cls(held_counts, now_counts, per_sub, moves, assigned)


def _consumer_scores(
    total: int,
    n_members: int,
    spread: _PartitionSpread,
    tasks_of: Mapping[int, int],
    warm: int,
    cold: int,
) -> AssignmentMetrics:
    """A consumer assignment's scores: balance in partitions and per subtopology in anchors."""
    ones = [1] * n_members
    balanced, imbalance = share_balance(total, spread.now_counts, ones)
    sub_balanced, sub_spread = True, 0.0
    for sub, n in tasks_of.items():
        ok, gap = share_balance(n, spread.per_sub[sub], ones)
        sub_balanced, sub_spread = sub_balanced and ok, max(sub_spread, gap)
    return AssignmentMetrics(
        tasks=total,
        clients=n_members,
        moves=spread.moves,
        move_lower_bound=quota_move_lower_bound(total, spread.held_counts, ones),
        active_balanced=balanced,
        active_imbalance=imbalance,
        load_imbalance=imbalance,  # no standbys at this level
        standbys_required=0,
        standbys_placed=0,
        standbys_kept=0,
        standbys_dropped=0,
        warm_takeovers=warm,
        cold_takeovers=cold,
        subtopology_balanced=sub_balanced,
        subtopology_imbalance=sub_spread,
    )


def _split_tasks(assigned: Mapping[TopicPartition, str], cl: _ConsumerLayout) -> set[TaskId]:
    """Tasks whose partitions went to more than one member."""
    first_member: dict[TaskId, str] = {}
    split: set[TaskId] = set()
    for tp, mid in assigned.items():
        t = cl.task_of.get(tp)
        if t is None:
            continue
        seen = first_member.setdefault(t, mid)
        if seen != mid:
            split.add(t)
    return split


def _ours_consumer(kind: str) -> ConsumerAssign:
    from ..consumer import (
        CooperativeStickyAssignor,
        RangeAssignor,
        RoundRobinAssignor,
        ShuffledAssignor,
        StickyAssignor,
        Subscription,
    )

    assignor: Any = {
        "range": RangeAssignor,
        "roundrobin": RoundRobinAssignor,
        "sticky": StickyAssignor,
        "cooperative-sticky": CooperativeStickyAssignor,
        "shuffled": ShuffledAssignor,
    }[kind]()
    cooperative = kind == "cooperative-sticky"
    target_of = StickyAssignor()
    cache: dict[str, tuple[object, Subscription]] = {}

    def run(
        partitions_per_topic: Mapping[str, int],
        topics: Sequence[str],
        owned: Mapping[str, Sequence[TopicPartition] | None],
    ) -> tuple[dict[str, list[TopicPartition]], float]:
        subs = {}
        for mid, held in owned.items():
            hit = cache.get(mid)
            if hit is not None and hit[0] is held:
                subs[mid] = hit[1]
                continue
            sub = Subscription(topics, held or (), generation=1 if held else -1)
            cache[mid] = (held, sub)
            subs[mid] = sub
        for mid in [m for m in cache if m not in owned]:
            del cache[mid]
        start = time.perf_counter()
        if cooperative:
            # A cooperative round withholds the partitions their owners must revoke first; the
            # follow-up rebalance hands them over. Score the target it reaches: the sticky
            # assignment (same engine, same input), computed off the clock.
            assignor.plan(partitions_per_topic, subs)
            seconds = time.perf_counter() - start
            target: dict[str, list[TopicPartition]] = target_of.assign(partitions_per_topic, subs)
            return target, seconds
        result: dict[str, list[TopicPartition]] = assignor.assign(partitions_per_topic, subs)
        return result, time.perf_counter() - start

    return run


def _aiokafka_consumer(kind: str) -> ConsumerAssign:
    from .peers import AiokafkaPeer

    return AiokafkaPeer(kind).assign


def _make_runner(name: str, ctx: _Context, collect: bool = False) -> Runner:
    family, _, kind = name.partition(":")
    if name == "task:sticky":
        return _TaskRunner(ctx, name, _sticky_assign(ctx.job), collect)
    if name == "task:ha":
        return _HaRunner(ctx, name, collect)
    if name == "faust:copartitioned":
        return _TaskRunner(ctx, name, _faust_assign(ctx.job), collect)
    if family == "consumer":
        return _ConsumerRunner(ctx, name, _ours_consumer(kind))
    if family == "aiokafka":
        return _ConsumerRunner(ctx, name, _aiokafka_consumer(kind))
    raise PipelineError(f"no runner for assignor {name!r}")  # registry and runners disagree


# -- entry points ----------------------------------------------------------------------------------


def run_trace(
    job: SimulationJob,
    trace: Trace,
    assignor: str,
    collect: bool = False,
    context: _Context | None = None,
) -> tuple[list[RebalanceRow], list[list[Takeover]]]:
    """Rows of one assignor over one trace, and (``collect``, task level) each step's
    takeovers. An assignor that fails gets an error row and stops there. ``context`` shares
    the per-trace tables between the assignors of one trace."""
    ctx = _Context(job, trace) if context is None else context
    runner = _make_runner(assignor, ctx, collect)
    rows: list[RebalanceRow] = []
    for step, layout in zip(trace.steps, ctx.layouts, strict=True):
        row = runner.step(step, layout)
        rows.append(row)
        if row.error is not None:
            break
    takeovers = runner.takeovers if isinstance(runner, _TaskRunner) else []
    return rows, takeovers


def simulate_scenario(job: SimulationJob, scenario: int) -> list[RebalanceRow]:
    """Every row of one scenario: its trace replayed through each of the job's assignors."""
    trace = generate_trace(job.model, job.workload, scenario, job.seed)
    ctx = _Context(job, trace)
    rows: list[RebalanceRow] = []
    for name in job.assignors:
        rows.extend(run_trace(job, trace, name, context=ctx)[0])
    return rows
