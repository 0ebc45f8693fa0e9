"""``plan-standbys``: how many standbys and warmups buy how much availability, at what load.

Pure Python (no Spark): :func:`evaluate_candidates` replays one trace with
``StickyTaskAssignor(num_standby_replicas=R)`` and prices each takeover with the availability
model below, for every warmup candidate ``W``; the Spark job (``spark.run_plan``) runs it for every
(scenario, R) and sums per candidate; :func:`summarize` and :func:`recommend` turn the sums into the
table and the advice.

The availability model (``docs/pipeline.md`` has the long form), per task that changes hands:

- its new owner restores ``records`` (the restore-cost model of ``simulate.py``) at
  ``restore_rate`` records per second; the task is down for ``records / restore_rate``;
- if its owner *crashed* (or lost its rack), it was down ``detection_s`` before the rebalance
  (the session timeout); if its owner *restarted*, for the restart's downtime;
- a *planned* move (the previous owner is still running) stops the task on its old owner: it is
  down while the new owner restores — unless warmups are on (``W >= 1``) and the new owner is not
  caught up (lag above ``acceptable_recovery_lag``). Then, as Kafka Streams' high-availability
  assignor does, the task keeps running on its old owner while a warmup replica catches up, and
  moves at a later probing rebalance: no outage, but the move is *deferred*: ``W`` warmups at a
  time, one batch per ``max(probing_interval_s, restore time)``.

Note: ``StickyTaskAssignor`` computes the target assignment only; it places no warmups itself
(``streamassign.ha.HighAvailabilityTaskAssignor`` does, simulated as ``task:ha`` in the what-if
scenarios). The warmup columns are what reaching the same target through warmups costs and buys
under this model.

Load: standbys replicate continuously (``standby_load``: standby replicas per task, averaged over
time) and copy their changelog when placed (``bootstrap``); warmups replicate while they catch up
(``warmup_load``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from ..text import exact_number
from .scenarios import (
    MAX_REPLICAS,
    MAX_SCENARIOS,
    PipelineError,
    ScenarioModel,
    Workload,
    generate_trace,
    int_at_least,
    seed_in_range,
)
from .simulate import PROBING_INTERVAL_S, RESTORE_RATE, SimulationJob, Takeover, run_trace

__all__ = [
    "PLAN_COLUMNS",
    "TOLERANCE",
    "AvailabilityModel",
    "PlanJob",
    "assignor_advice",
    "evaluate_candidates",
    "knobs",
    "recommend",
    "required_availability",
    "summarize",
]

#: Without a target, a candidate is good enough when its outage is at most this share above the
#: least outage of all candidates: more replicas would buy less than that. 25 %: on the shipped
#: topologies under the default model (with warmups, restores at 10,000 records/s) the step from
#: 2 to 3 standbys buys 11-17 % of the outage for another 0.4-0.7 standby replicas per task,
#: from 1 to 2 about 28-33 %.
TOLERANCE: Final = 0.25

#: The outage's parts: (summed column, share in the summary, the knob that scales it).
_PARTS: Final = (
    ("restore_outage_s", "restore_share", "restores"),
    ("detection_outage_s", "detection_share", "crash detection"),
    ("restart_outage_s", "restart_share", "restart downtime"),
)


def _positive_number(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:
        raise PipelineError(f"{attribute.name} must be a finite number > 0, got {value!r}")


def _non_negative_number(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < 0:
        raise PipelineError(f"{attribute.name} must be a finite number >= 0, got {value!r}")


def _availability(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not 0 < value < 1:
        raise PipelineError(f"{attribute.name} must be in (0, 1), e.g. 0.9999, got {value!r}")


@attrs.frozen(kw_only=True)
class AvailabilityModel:
    """How fast state restores and how long failures take to notice (see the module docstring)."""

    #: Records per second one restoring task reads from its changelog (``simulate``'s too:
    #: the report prices its downtime at the same default).
    restore_rate: float = attrs.field(default=RESTORE_RATE, validator=_positive_number)
    #: Seconds before a crashed client's tasks are reassigned (the session timeout).
    detection_s: float = attrs.field(default=45.0, validator=_non_negative_number)
    #: Seconds between probing rebalances that move warmed-up tasks.
    probing_interval_s: float = attrs.field(default=PROBING_INTERVAL_S, validator=_positive_number)
    #: The availability a recommendation must reach (share of task-time up); ``None``: the
    #: cheapest candidate within ``tolerance`` of the least outage (see :func:`recommend`).
    target: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(_availability)
    )
    #: Without a target: how much more outage than the best candidate's is good enough.
    tolerance: float = attrs.field(default=TOLERANCE, validator=_non_negative_number)


def _candidates(value: Sequence[int]) -> tuple[int, ...]:
    return tuple(sorted(set(value)))


def _check_candidates(
    instance: object, attribute: attrs.Attribute[tuple[int, ...]], value: tuple[int, ...]
) -> None:
    if not value or any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in value):
        raise PipelineError(
            f"{attribute.name} must be a non-empty list of integers >= 0, got {list(value)!r}"
        )
    if value[-1] > MAX_REPLICAS:  # sorted by the converter
        raise PipelineError(
            f"{attribute.name}: at most {MAX_REPLICAS:,} replicas (clients and tasks are at "
            f"most 100,000 each, so more could never be placed), got {value[-1]:,}"
        )


@attrs.frozen(kw_only=True)
class PlanJob:
    """The candidates to compare and the models to compare them under."""

    workload: Workload
    model: ScenarioModel = attrs.field(factory=ScenarioModel)
    availability: AvailabilityModel = attrs.field(factory=AvailabilityModel)
    scenarios: int = attrs.field(default=50, validator=int_at_least(1, high=MAX_SCENARIOS))
    seed: int = attrs.field(default=0, validator=seed_in_range)
    standby_candidates: tuple[int, ...] = attrs.field(
        default=(0, 1, 2, 3), converter=_candidates, validator=_check_candidates
    )
    warmup_candidates: tuple[int, ...] = attrs.field(
        default=(0, 2), converter=_candidates, validator=_check_candidates
    )
    acceptable_recovery_lag: int = 10_000

    def simulation(self, standbys: int) -> SimulationJob:
        return SimulationJob(
            workload=self.workload,
            model=self.model,
            assignors=("task:sticky",),
            scenarios=self.scenarios,
            seed=self.seed,
            standby_replicas=standbys,
            acceptable_recovery_lag=self.acceptable_recovery_lag,
            # New standbys catch up at the rate the outage is priced at: one restore rate.
            replica_restore_per_s=self.availability.restore_rate,
        )


#: One row per (scenario, standbys, warmups): sums over the trace's rebalances (not the initial).
PLAN_COLUMNS: Final[tuple[tuple[str, str, bool, str], ...]] = (
    ("scenario", "long", False, "scenario number"),
    ("standbys", "int", False, "num_standby_replicas candidate"),
    ("warmups", "int", False, "warmup replicas candidate (0: no warmups)"),
    ("horizon_s", "double", False, "simulated seconds from the first to the last rebalance"),
    ("task_seconds", "double", False, "sum over time of the number of tasks (the denominator)"),
    ("unavailable_task_seconds", "double", False, "sum of every task's outage"),
    ("restore_outage_s", "double", False, "the part of the outage spent restoring state"),
    ("detection_outage_s", "double", False, "the part spent before crashes were noticed"),
    ("restart_outage_s", "double", False, "the part spent while restarting owners were down"),
    ("worst_outage_s", "double", False, "longest single task outage in the trace"),
    ("restore_records", "long", False, "records restored by new active owners"),
    ("standby_task_seconds", "double", False, "sum over time of placed standbys"),
    ("standby_bootstrap_records", "long", False, "records copied by newly placed standbys"),
    ("warmup_task_seconds", "double", False, "sum of warmup catch-up times"),
    ("deferred_moves", "long", False, "planned moves that waited for a warmup"),
    ("convergence_s", "double", False, "sum of the delays until deferred moves completed"),
    ("planned_rebalances", "long", False, "rebalances with at least one deferred move"),
)


def evaluate_candidates(job: PlanJob, scenario: int, standbys: int) -> list[tuple[Any, ...]]:
    """Rows (:data:`PLAN_COLUMNS` order) of one scenario under ``standbys``, one per warmup
    candidate. The trace is the same for every candidate (common random numbers)."""
    sim = job.simulation(standbys)
    trace = generate_trace(job.model, job.workload, scenario, job.seed)
    rows, takeovers = run_trace(sim, trace, "task:sticky", collect=True)
    times = [r.time_s for r in rows]
    spans = [b - a for a, b in itertools.pairwise(times)] + [0.0]
    horizon = times[-1] - times[0]
    task_seconds = sum(r.tasks * dt for r, dt in zip(rows, spans, strict=True))
    standby_seconds = sum((r.standbys_placed or 0) * dt for r, dt in zip(rows, spans, strict=True))
    restore = sum(r.records_to_restore for r in rows[1:])
    bootstrap = sum(r.standby_restore_records or 0 for r in rows[1:])
    out: list[tuple[Any, ...]] = []
    for warmups in job.warmup_candidates:
        outage = _CandidateOutage.of(takeovers[1:], warmups, job)
        out.append(
            (
                scenario,
                standbys,
                warmups,
                horizon,
                task_seconds,
                outage.restoring + outage.detecting + outage.restarting,
                outage.restoring,
                outage.detecting,
                outage.restarting,
                outage.worst,
                restore,
                standby_seconds,
                bootstrap,
                outage.warmup_seconds,
                outage.deferred,
                outage.convergence,
                outage.planned,
            )
        )
    return out


@attrs.define
class _CandidateOutage:
    """One warmup candidate's outage over a trace's rebalances: seconds restoring, before
    crashes were noticed and while owners restarted, the worst single outage, and the moves a
    warmup deferred (with their catch-up and convergence times)."""

    restoring: float = 0.0
    detecting: float = 0.0
    restarting: float = 0.0
    worst: float = 0.0
    warmup_seconds: float = 0.0
    convergence: float = 0.0
    deferred: int = 0
    planned: int = 0

    @classmethod
    def of(
        cls, steps: Sequence[Sequence[Takeover]], warmups: int, job: PlanJob
    ) -> _CandidateOutage:
        outage = cls()
        for step_takeovers in steps:
            outage._add_step(step_takeovers, warmups, job)
        return outage

    def _add_step(self, step_takeovers: Sequence[Takeover], warmups: int, job: PlanJob) -> None:
        avail = job.availability
        waiting: list[float] = []
        for t in step_takeovers:
            restore_s = t.records / avail.restore_rate
            if t.cause == "move" and warmups and t.records > job.acceptable_recovery_lag:
                waiting.append(restore_s)
                continue
            waited = 0.0
            if t.cause == "crash":
                waited = avail.detection_s
                self.detecting += waited
            elif t.cause == "restart":
                waited = t.outage_s
                self.restarting += waited
            self.restoring += restore_s
            self.worst = max(self.worst, restore_s + waited)
        if waiting:
            self.planned += 1
            self.deferred += len(waiting)
            self.warmup_seconds += sum(waiting)
            batches = math.ceil(len(waiting) / warmups)
            self.convergence += batches * max(avail.probing_interval_s, max(waiting))


def summarize(
    totals: Sequence[Mapping[str, Any]], availability: AvailabilityModel
) -> list[dict[str, Any]]:
    """Per candidate, from the summed columns: the numbers the table shows.

    ``availability`` = 1 - unavailable / task time; ``outage_per_day_s`` = task-seconds of outage
    per simulated day; ``restore_share``, ``detection_share``, ``restart_share`` = the parts of
    the outage spent restoring, before crashes were noticed and while restarting owners were
    down; ``standby_load`` = standby replicas per task over time; ``warmup_load`` = warmup
    replicas per task over time; ``bootstrap_per_hour`` = records new standbys copy per hour;
    ``convergence_s`` = mean delay of a rebalance's deferred moves; ``meets_target``: whether
    the candidate is good enough under :func:`recommend`'s rule.
    """
    out = []
    for t in totals:
        task_s = float(t["task_seconds"]) or 1.0
        horizon = float(t["horizon_s"]) or 1.0
        planned = int(t["planned_rebalances"])
        down = float(t["unavailable_task_seconds"])
        out.append(
            {
                "standbys": int(t["standbys"]),
                "warmups": int(t["warmups"]),
                "traces": int(t["traces"]),
                "availability": 1.0 - down / task_s,
                "outage_per_day_s": down / horizon * 86_400,
                **{share: float(t[part]) / down if down else 0.0 for part, share, _ in _PARTS},
                "worst_outage_p50_s": float(t["worst_outage_p50_s"]),
                "worst_outage_p99_s": float(t["worst_outage_p99_s"]),
                "worst_outage_max_s": float(t["worst_outage_max_s"]),
                "restore_per_hour": float(t["restore_records"]) / horizon * 3600,
                "standby_load": float(t["standby_task_seconds"]) / task_s,
                "bootstrap_per_hour": float(t["standby_bootstrap_records"]) / horizon * 3600,
                "warmup_load": float(t["warmup_task_seconds"]) / task_s,
                "deferred_moves": int(t["deferred_moves"]),
                "convergence_s": float(t["convergence_s"]) / planned if planned else 0.0,
            }
        )
    bar = required_availability(out, availability.target, availability.tolerance)
    for row in out:
        row["meets_target"] = row["availability"] >= bar
    return out


def required_availability(
    rows: Sequence[Mapping[str, Any]], target: float | None, tolerance: float = TOLERANCE
) -> float:
    """``target``, or without one the least outage of ``rows`` plus ``tolerance`` of it."""
    if target is not None:
        return target
    least = min((1.0 - r["availability"] for r in rows), default=0.0)
    return 1.0 - least * (1.0 + tolerance)


def recommend(
    rows: Sequence[Mapping[str, Any]], target: float | None = None, tolerance: float = TOLERANCE
) -> tuple[Mapping[str, Any], str, bool]:
    """The cheapest candidate meeting ``target`` (without one: within ``tolerance`` of the
    least outage of all candidates): least standby + warmup load, then the shortest convergence,
    then fewest replicas. If none meets an explicit target, the most available one. Returns it
    with a sentence saying why, and whether it meets the bar (False only for a missed target)."""
    if not rows:
        raise PipelineError("no candidate was evaluated")
    bar = required_availability(rows, target, tolerance)
    meeting = [r for r in rows if r["availability"] >= bar]
    if not meeting:
        best = max(rows, key=lambda r: (r["availability"], -r["standby_load"]))
        why = (
            f"no candidate reaches the target {target}; the most available is "
            f"{_name(best)} at {best['availability']:.5f}"
        )
        return best, why, False
    best = min(
        meeting,
        key=lambda r: (
            round(r["standby_load"] + r["warmup_load"], 6),
            r["convergence_s"],
            r["standbys"],
            r["warmups"],
        ),
    )
    load = f"the least extra load ({best['standby_load']:.2f} standby replicas per task)"
    if target is not None:
        return (
            best,
            f"{_name(best)}: {load} that reaches {best['availability']:.5f} >= {target}",
            True,
        )
    top = max(rows, key=lambda r: (r["availability"], -r["standby_load"]))
    if top is best:
        return best, f"{_name(best)}: the least outage of the candidates ({_outage(best)})", True
    why = (
        f"{_name(best)}: {load} within {tolerance:.0%} of the least outage of the candidates "
        f"({_outage(best)}; the best, {_name(top)}, {_outage(top)} at "
        f"{top['standby_load']:.2f} standby replicas per task)"
    )
    return best, why, True


#: The assignor a plan needs, by whether it has warmups: only the high-availability assignor
#: places them (StickyTaskAssignor computes the target assignment only).
HA_ASSIGNOR: Final = "the high-availability assignor (streamassign.ha; task:ha in simulate)"
STICKY_ASSIGNOR: Final = "StickyTaskAssignor (task:sticky)"


def assignor_advice(
    rows: Sequence[Mapping[str, Any]],
    best: Mapping[str, Any],
    target: float | None = None,
    tolerance: float = TOLERANCE,
) -> dict[str, Any]:
    """Which assignor ``best`` assumes, and, when that is the high-availability one (``best``
    has warmups), the plan for StickyTaskAssignor: :func:`recommend`'s pick among the
    candidates without warmups (``None`` if there are none). A user of the sticky assignor who
    took ``best``'s standbys would get the warmup-free row's availability, not ``best``'s."""
    if not best["warmups"]:
        return {
            "assignor": "task:sticky",
            "without_warmups": None,
            "why": f"no warmups: {STICKY_ASSIGNOR} or {HA_ASSIGNOR} alike",
        }
    head = f"warmups need {HA_ASSIGNOR}; {STICKY_ASSIGNOR} places none"
    plain = [r for r in rows if not r["warmups"]]
    if not plain:
        return {
            "assignor": "task:ha",
            "without_warmups": None,
            "why": f"{head}: add 0 to --warmups for its plan",
        }
    sticky, _, reached = recommend(plain, target, tolerance)
    missed = "" if reached else f"; none without warmups reaches {target}"
    return {
        "assignor": "task:ha",
        "without_warmups": dict(sticky),
        "why": (
            f"{head}: with it, {_name(sticky)} ({_outage(sticky)}, against "
            f"{best['availability']:.5f} with warmups{missed})"
        ),
    }


def _name(row: Mapping[str, Any]) -> str:
    return f"num_standby_replicas={row['standbys']}, warmups={row['warmups']}"


def _outage(row: Mapping[str, Any]) -> str:
    return f"availability {row['availability']:.5f}"


#: How far ``knobs`` may turn one knob: restores at most this many times faster, detection and
#: restart downtime down to this fraction of their value. Past it a value is no plan (a restart
#: in 16 ms, a restore rate no disk gives): the knob counts as unable to reach the target.
KNOB_RANGE: Final = 10.0
#: The shortest crash detection ``knobs`` suggests: brokers' default
#: ``group.min.session.timeout.ms``, the least session timeout they accept.
MIN_DETECTION_S: Final = 6.0


def knobs(row: Mapping[str, Any], job: PlanJob, target: float | None = None) -> list[str]:
    """What moves ``row``'s availability, as sentences: the outage's parts and, for each
    model knob, the value that alone would reach ``target`` (default: the next nine above the
    row, e.g. 0.999 from 0.9969) within the knob's limit (:data:`KNOB_RANGE`,
    :data:`MIN_DETECTION_S`), or, where it would not, the availability at that limit. Each
    part scales with its knob (restores with 1 / restore rate, the rest linearly), the other
    parts held fixed: an estimate, not a new simulation."""
    down = 1.0 - row["availability"]
    if down <= 0:
        return ["no outage under this model"]
    avail = job.availability
    knob_of = {
        "restores": ("--restore-rate", avail.restore_rate, "records/s"),
        "crash detection": ("--detection", avail.detection_s, "s"),
        "restart downtime": ("--param restart_downtime_s", job.model.restart_downtime_s, "s"),
    }
    parts = {name: down * row[share] for _, share, name in _PARTS}
    split = ", ".join(
        f"{parts[name] / down:.0%} {name} ({knob_of[name][0]} {exact_number(knob_of[name][1])})"
        for name in sorted(parts, key=lambda n: -parts[n])
        if parts[name] > 0
    )
    lines = [f"outage of {_name(row)}: {split}"]
    goal = target if target is not None else 1.0 - 10 ** (math.ceil(math.log10(down)) - 1)
    if row["availability"] >= goal:
        return lines
    moves, cannot = _knob_moves(parts, knob_of, down, 1.0 - goal)
    if moves:
        each = " (each alone)" if len(moves) > 1 else ""
        lines.append(f"to reach {goal:g}: " + ", or ".join(moves) + each)
    if cannot:
        which = "the other knobs" if moves else "any one knob"
        lines.append(
            f"{goal:g} is out of reach of {which} alone; at their limits: " + ", ".join(cannot)
        )
    return lines


def _knob_limit(name: str, now: float) -> float:
    """The furthest ``knobs`` turns a knob now at ``now`` (never back past ``now``)."""
    if name == "restores":
        return now * KNOB_RANGE
    floor = MIN_DETECTION_S if name == "crash detection" else 0.0
    return min(now, max(now / KNOB_RANGE, floor))


def _knob_moves(
    parts: Mapping[str, float],
    knob_of: Mapping[str, tuple[str, float, str]],
    down: float,
    allowed: float,
) -> tuple[list[str], list[str]]:
    """For each outage part, largest first: the knob value within its limit that alone brings
    the outage ``down`` within ``allowed`` (a move), or the availability at the limit."""
    moves, cannot = [], []
    for name, value in sorted(parts.items(), key=lambda kv: -kv[1]):
        option, now, unit = knob_of[name]
        if value <= 0:
            continue
        rest, limit = down - value, _knob_limit(name, now)
        restores = name == "restores"
        at_limit = rest + (value * now / limit if restores else value * limit / now)
        if at_limit > allowed:
            cannot.append(f"{option} {_knob_value(limit)} {unit} gives {1.0 - at_limit:.5f}")
            continue
        needed = now * value / (allowed - rest) if restores else now * (allowed - rest) / value
        verb = "raise" if restores else "lower"
        moves.append(f"{verb} {option} from {exact_number(now)} to {_knob_value(needed)} {unit}")
    return moves, cannot


def _knob_value(value: float) -> str:
    """A value ``knobs`` suggests, as an option takes it (no thousands separators, like the
    current value beside it): rounded, as it is an estimate."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"
