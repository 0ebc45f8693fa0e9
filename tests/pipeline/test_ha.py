"""``task:ha`` in the pipeline: probing rebalances between events, priced with the same restore
model as ``task:sticky`` on the same traces."""

from __future__ import annotations

import math

import attrs
import pytest

from streamassign.pipeline import SimulationJob, Workload, generate_trace, simulate_scenario
from streamassign.pipeline.scenarios import Member, PipelineError, Step, Trace
from streamassign.pipeline.simulate import run_trace

from .conftest import BUSY, ORDERS
from .test_simulate import FLAT, ONE

A, B = Member("a", 1, "rack-0"), Member("b", 1, "rack-1")


def scale_out_trace(workload: Workload, next_event_s: float) -> Trace:
    """a runs 4 tasks; b joins at 100 s; b leaves at ``next_event_s``."""
    return Trace(
        0,
        0,
        0,
        (
            Step(0, 0.0, "initial", (A,), joined=("a",), layout=workload.initial_layout()),
            Step(1, 100.0, "scale_out", (A, B), joined=("b",)),
            Step(2, next_event_s, "scale_in", (A,), left=("b",)),
        ),
    )


def job(workload: Workload, warmups: int = 2) -> SimulationJob:
    # Changelogs of ~1100 records restore in 11 s; a probe every 30 s finds them caught up.
    return SimulationJob(
        workload=workload,
        model=FLAT,
        assignors=("task:ha", "task:sticky"),
        standby_replicas=0,
        acceptable_recovery_lag=10,
        max_warmup_replicas=warmups,
        probing_interval_s=30.0,
        replica_restore_per_s=100.0,
    )


@pytest.mark.parametrize(("warmups", "probes"), [(2, 1), (1, 2)])
def test_a_joining_client_warms_up_and_takes_over_restoring_only_the_lag(
    warmups: int, probes: int
) -> None:
    workload = Workload.from_topology(ONE, {"in": 4})
    trace = scale_out_trace(workload, 5000.0)
    ha, _ = run_trace(job(workload, warmups), trace, "task:ha")
    sticky, _ = run_trace(job(workload, warmups), trace, "task:sticky")
    out_ha, out_sticky = ha[1], sticky[1]
    assert out_sticky.records_to_restore == 2 * 1100 and out_sticky.balanced_after_s == 0.0
    assert out_ha.warmups == warmups and not out_ha.active_balanced
    assert out_ha.probing_rebalances == probes and out_ha.balanced_after_s == 30.0 * probes
    assert out_ha.records_to_restore == 2 * 10  # the standby lag left at the takeover
    assert out_ha.standby_restore_records >= 2 * 1100  # the warmups copied the state instead
    # b leaves: a holds no state of b's tasks under either assignor, so both restore it all.
    assert ha[2].records_to_restore == sticky[2].records_to_restore > 0
    assert ha[2].probing_rebalances == 0 and ha[2].balanced_after_s == 0.0


def test_an_event_before_the_probe_cuts_the_probing_short() -> None:
    workload = Workload.from_topology(ONE, {"in": 4})
    rows, _ = run_trace(job(workload), scale_out_trace(workload, 120.0), "task:ha")
    assert rows[1].warmups == 2 and rows[1].probing_rebalances == 0
    assert rows[1].balanced_after_s is None and rows[1].records_to_restore == 0


def test_on_busy_traces_every_rebalance_is_valid_and_within_the_warmup_budget() -> None:
    orders = Workload.from_file(ORDERS)
    sim = SimulationJob(
        workload=orders, model=BUSY, assignors=("task:ha", "task:sticky"), standby_replicas=1
    )
    restored = {"task:ha": 0, "task:sticky": 0}
    for scenario in range(3):
        for row in simulate_scenario(sim, scenario):
            assert row.error is None
            restored[row.assignor] += row.records_to_restore
            assert row.standby_coverage == 1.0 and row.unassigned == 0
            if row.assignor == "task:ha":
                assert row.warmups is not None and row.warmups <= sim.max_warmup_replicas
                assert row.probing_rebalances is not None
    assert restored["task:ha"] < restored["task:sticky"]
    assert generate_trace(BUSY, orders, 0).steps  # same traces for both assignors


@pytest.mark.parametrize("assignor", ["task:sticky", "task:ha"])
def test_a_takeover_by_a_replica_still_restoring_costs_what_it_has_left(assignor: str) -> None:
    """Both runners share one restore model: b's new replicas of a's tasks restore at 100
    records/s from 100 s; a crashes at 104 s, so each of a's tasks (2 under sticky, which gave
    b the other 2 at once; all 4 under HA, which held them back) costs its ~700 records left
    on b, not the 10 of a caught-up standby, nor the ~1100 of no state at all."""
    workload = Workload.from_topology(ONE, {"in": 4})
    trace = Trace(
        0,
        0,
        0,
        (
            Step(0, 0.0, "initial", (A,), joined=("a",), layout=workload.initial_layout()),
            Step(1, 100.0, "scale_out", (A, B), joined=("b",)),
            Step(2, 104.0, "crash", (B,), crashed=("a",)),
        ),
    )
    sim = attrs.evolve(job(workload), standby_replicas=1, assignors=(assignor,))
    rows, _ = run_trace(sim, trace, assignor)
    crash = rows[2]
    n = {"task:sticky": 2, "task:ha": 4}[assignor]
    assert crash.restoring_tasks == n
    end = 1000 + 104  # changelog records at 104 s (1,000 + 1 a second)
    left = end - 100 * 4  # 4 s of restoring at 100 records/s (from the size at 100 s)
    assert n * (left - 10) <= crash.records_to_restore <= n * (left + 10)


def test_bad_probing_settings_are_pipeline_errors() -> None:
    workload = Workload.from_topology(ONE, {"in": 4})
    with pytest.raises(PipelineError, match="probing_interval_s must be a finite number > 0"):
        SimulationJob(workload=workload, assignors=("task:ha",), probing_interval_s=0.0)
    # Infinity passed "> 0", then failed in Spark's executors (OverflowError).
    with pytest.raises(PipelineError, match="replica_restore_per_s must be a finite number > 0"):
        SimulationJob(workload=workload, assignors=("task:ha",), replica_restore_per_s=math.inf)
    with pytest.raises(PipelineError, match="max_warmup_replicas must be an integer >= 1"):
        SimulationJob(workload=workload, assignors=("task:ha",), max_warmup_replicas=0)
