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

from .scenarios import PipelineError, ScenarioModel, Workload, generate_trace, int_at_least
from .simulate import SimulationJob, run_trace

__all__ = [
    "PLAN_COLUMNS",
    "AvailabilityModel",
    "PlanJob",
    "evaluate_candidates",
    "recommend",
    "summarize",
]


def _positive_number(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:
        raise PipelineError(f"{attribute.name} must be a number > 0, got {value!r}")


def _non_negative_number(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < 0:
        raise PipelineError(f"{attribute.name} must be a number >= 0, got {value!r}")


def _availability(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not 0 < value < 1:
        raise PipelineError(f"{attribute.name} must be in (0, 1), e.g. 0.9999, got {value!r}")


@attrs.frozen(kw_only=True)
class AvailabilityModel:
    """How fast state restores and how long failures take to notice (see the module docstring)."""

    #: Records per second one restoring task reads from its changelog.
    restore_rate: float = attrs.field(default=20_000.0, validator=_positive_number)
    #: Seconds before a crashed client's tasks are reassigned (the session timeout).
    detection_s: float = attrs.field(default=45.0, validator=_non_negative_number)
    #: Seconds between probing rebalances that move warmed-up tasks.
    probing_interval_s: float = attrs.field(default=600.0, validator=_non_negative_number)
    #: The availability a recommendation must reach (share of task-time up).
    target: float = attrs.field(default=0.9999, validator=_availability)


def _candidates(value: Sequence[int]) -> tuple[int, ...]:
    return tuple(sorted(set(value)))


def _check_candidates(
    instance: object, attribute: attrs.Attribute[tuple[int, ...]], value: tuple[int, ...]
) -> None:
    if not value or any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in value):
        raise PipelineError(
            f"{attribute.name} must be a non-empty list of integers >= 0, got {list(value)!r}"
        )


_at_least_one: Final = int_at_least(1)


@attrs.frozen(kw_only=True)
class PlanJob:
    """The candidates to compare and the models to compare them under."""

    workload: Workload
    model: ScenarioModel = attrs.field(factory=ScenarioModel)
    availability: AvailabilityModel = attrs.field(factory=AvailabilityModel)
    scenarios: int = attrs.field(default=50, validator=_at_least_one)
    seed: int = 0
    standby_candidates: tuple[int, ...] = attrs.field(
        default=(0, 1, 2), converter=_candidates, validator=_check_candidates
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
        )


#: One row per (scenario, standbys, warmups): sums over the trace's rebalances (not the initial).
PLAN_COLUMNS: Final[tuple[tuple[str, str, bool, str], ...]] = (
    ("scenario", "long", False, "scenario number"),
    ("standbys", "int", False, "num_standby_replicas candidate"),
    ("warmups", "int", False, "warmup replicas candidate (0: no warmups)"),
    ("horizon_s", "double", False, "simulated seconds from the first to the last rebalance"),
    ("task_seconds", "double", False, "sum over time of the number of tasks (the denominator)"),
    ("unavailable_task_seconds", "double", False, "sum of every task's outage"),
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
    avail = job.availability
    rate = avail.restore_rate
    times = [r.time_s for r in rows]
    spans = [b - a for a, b in itertools.pairwise(times)] + [0.0]
    horizon = times[-1] - times[0]
    task_seconds = sum(r.tasks * dt for r, dt in zip(rows, spans, strict=True))
    standby_seconds = sum((r.standbys_placed or 0) * dt for r, dt in zip(rows, spans, strict=True))
    restore = sum(r.records_to_restore for r in rows[1:])
    bootstrap = sum(r.standby_restore_records or 0 for r in rows[1:])
    out: list[tuple[Any, ...]] = []
    for warmups in job.warmup_candidates:
        unavailable = worst = warmup_seconds = convergence = 0.0
        deferred = planned = 0
        for step_takeovers in takeovers[1:]:
            waiting: list[float] = []
            for t in step_takeovers:
                restore_s = t.records / rate
                if t.cause == "move" and warmups and t.records > job.acceptable_recovery_lag:
                    waiting.append(restore_s)
                    continue
                outage = restore_s
                if t.cause == "crash":
                    outage += avail.detection_s
                elif t.cause == "restart":
                    outage += t.outage_s
                unavailable += outage
                worst = max(worst, outage)
            if waiting:
                planned += 1
                deferred += len(waiting)
                warmup_seconds += sum(waiting)
                batches = math.ceil(len(waiting) / warmups)
                convergence += batches * max(avail.probing_interval_s, max(waiting))
        out.append(
            (
                scenario,
                standbys,
                warmups,
                horizon,
                task_seconds,
                unavailable,
                worst,
                restore,
                standby_seconds,
                bootstrap,
                warmup_seconds,
                deferred,
                convergence,
                planned,
            )
        )
    return out


def summarize(
    totals: Sequence[Mapping[str, Any]], availability: AvailabilityModel
) -> list[dict[str, Any]]:
    """Per candidate, from the summed columns: the numbers the table shows.

    ``availability`` = 1 - unavailable / task time; ``outage_per_day_s`` = task-seconds of outage
    per simulated day; ``standby_load`` = standby replicas per task over time;
    ``warmup_load`` = warmup replicas per task over time; ``bootstrap_per_hour`` = records new
    standbys copy per hour; ``convergence_s`` = mean delay of a rebalance's deferred moves.
    """
    out = []
    for t in totals:
        task_s = float(t["task_seconds"]) or 1.0
        horizon = float(t["horizon_s"]) or 1.0
        planned = int(t["planned_rebalances"])
        out.append(
            {
                "standbys": int(t["standbys"]),
                "warmups": int(t["warmups"]),
                "traces": int(t["traces"]),
                "availability": 1.0 - float(t["unavailable_task_seconds"]) / task_s,
                "outage_per_day_s": float(t["unavailable_task_seconds"]) / horizon * 86_400,
                "worst_outage_p50_s": float(t["worst_outage_p50_s"]),
                "worst_outage_p99_s": float(t["worst_outage_p99_s"]),
                "worst_outage_max_s": float(t["worst_outage_max_s"]),
                "restore_per_hour": float(t["restore_records"]) / horizon * 3600,
                "standby_load": float(t["standby_task_seconds"]) / task_s,
                "bootstrap_per_hour": float(t["standby_bootstrap_records"]) / horizon * 3600,
                "warmup_load": float(t["warmup_task_seconds"]) / task_s,
                "deferred_moves": int(t["deferred_moves"]),
                "convergence_s": float(t["convergence_s"]) / planned if planned else 0.0,
                "meets_target": 1.0 - float(t["unavailable_task_seconds"]) / task_s
                >= availability.target,
            }
        )
    return out


def recommend(rows: Sequence[Mapping[str, Any]], target: float) -> tuple[Mapping[str, Any], str]:
    """The cheapest candidate meeting ``target``: least standby + warmup load, then the
    shortest convergence, then fewest replicas. If none meets it, the most available one.
    Returns it with a sentence saying why."""
    if not rows:
        raise PipelineError("no candidate was evaluated")
    meeting = [r for r in rows if r["availability"] >= target]
    if meeting:
        best = min(
            meeting,
            key=lambda r: (
                round(r["standby_load"] + r["warmup_load"], 6),
                r["convergence_s"],
                r["standbys"],
                r["warmups"],
            ),
        )
        return best, (
            f"num_standby_replicas={best['standbys']}, warmups={best['warmups']}: the least extra "
            f"load ({best['standby_load']:.2f} standby replicas per task) that reaches "
            f"{best['availability']:.6f} >= the target {target}"
        )
    best = max(rows, key=lambda r: (r["availability"], -r["standby_load"]))
    return best, (
        f"no candidate reaches the target {target}; the most available is "
        f"num_standby_replicas={best['standbys']}, warmups={best['warmups']} at "
        f"{best['availability']:.6f} (try more standbys, a faster restore, or faster detection)"
    )
