"""plan-standbys' advice: the recommendation rule, what moves it, and a table for 80 columns."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from streamassign.cli.plan_standbys import _plan_table
from streamassign.pipeline import SimulationJob, Workload
from streamassign.pipeline.simulate import RESTORE_RATE
from streamassign.pipeline.standbys import (
    AvailabilityModel,
    PlanJob,
    assignor_advice,
    knobs,
    recommend,
)


def candidate(standbys: int, warmups: int, availability: float, **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "standbys": standbys,
        "warmups": warmups,
        "availability": availability,
        "outage_per_day_s": 14_025.4,
        "worst_outage_p99_s": 2_087.3,
        "standby_load": 0.75 * standbys,
        "bootstrap_per_hour": 13_620_512.0 * standbys,
        "warmup_load": 0.0004 * warmups,
        "convergence_s": 1_093.0 if warmups else 0.0,
        "restore_share": 0.6,
        "detection_share": 0.1,
        "restart_share": 0.3,
    }
    return row | extra


#: Outage 0.0030, 0.0028, 0.0022, 0.0021: the third is within 25 % of the least, the second not.
ROWS = [candidate(0, 0, 0.9970), candidate(1, 0, 0.9972), candidate(2, 2, 0.9978)]
ROWS.append(candidate(3, 0, 0.9979))


def test_without_a_target_the_cheapest_candidate_within_the_tolerance_wins() -> None:
    best, why, reached = recommend(ROWS)
    assert (best["standbys"], best["warmups"]) == (2, 2) and reached
    assert "within 25% of the least outage" in why and "num_standby_replicas=3" in why
    # The most available candidate, alone within reach: said so.
    best, why, _ = recommend(ROWS[:1])
    assert best is ROWS[0] and "the least outage of the candidates" in why


def test_an_explicit_target_is_met_cheaply_or_the_best_is_named() -> None:
    best, why, reached = recommend(ROWS, 0.9971)
    assert best["standbys"] == 1 and ">= 0.9971" in why and reached
    best, why, reached = recommend(ROWS, 0.9999)
    assert best["standbys"] == 3 and why.startswith("no candidate reaches the target 0.9999")
    assert not reached  # plan-standbys exits with status 3 on this


def test_knobs_split_the_outage_and_say_what_reaches_the_next_nine(orders: Workload) -> None:
    # Restore rate 20,000/s, detection 45 s, restarts 60 s.
    job = PlanJob(workload=orders, availability=AvailabilityModel(restore_rate=20_000.0))
    row = candidate(2, 2, 0.998)  # outage 0.002: restores 0.0012, detection 0.0002, restarts 0.0006
    split, reach, cannot = knobs(row, job)
    assert split == (
        "outage of num_standby_replicas=2, warmups=2: 60% restores (--restore-rate 20000), "
        "30% restart downtime (--param restart_downtime_s 60), 10% crash detection "
        "(--detection 45)"
    )
    # 0.999 allows 0.001: restores must shrink from 0.0012 to 0.0002, six times faster. One
    # knob: no "(each alone)".
    assert reach == "to reach 0.999: raise --restore-rate from 20000 to 120000 records/s"
    # The values as the options take them, as the next line writes them: ``:,g`` showed
    # --restore-rate 1234567 as 1.23457e+06.
    exact = PlanJob(workload=orders, availability=AvailabilityModel(restore_rate=1_234_567.0))
    split, reach, *_ = knobs(row, exact)
    assert "(--restore-rate 1234567)" in split
    assert reach.startswith("to reach 0.999: raise --restore-rate from 1234567 to 7407402 ")
    # The others at their limits: a tenth of the restart downtime, detection at the brokers'
    # least session timeout (6 s, not 4.5 s).
    assert cannot == (
        "0.999 is out of reach of the other knobs alone; at their limits: --param "
        "restart_downtime_s 6 s gives 0.99854, --detection 6 s gives 0.99817"
    )
    # An explicit target: the detection that reaches it, the rest held.
    lines = knobs(row, job, target=0.9983)
    assert lines[1] == (
        "to reach 0.9983: raise --restore-rate from 20000 to 26667 records/s, or lower "
        "--param restart_downtime_s from 60 to 30 s (each alone)"
    )
    assert lines[2] == (
        "0.9983 is out of reach of the other knobs alone; at their limits: --detection 6 s "
        "gives 0.99817"
    )
    # A tolerance of 2 %: only the least outage itself.
    assert recommend(ROWS, tolerance=0.02)[0]["standbys"] == 3
    assert knobs(candidate(0, 0, 1.0), job) == ["no outage under this model"]


def test_knob_values_past_their_limits_are_never_suggested(orders: Workload) -> None:
    """Under the default model the restarts dominate: reaching 0.999 would take a restart in
    17 ms. No line suggests it; both lines agree that no knob alone gets there."""
    job = PlanJob(workload=orders, availability=AvailabilityModel(restore_rate=20_000.0))
    row = candidate(2, 2, 0.9969, restore_share=0.3, detection_share=0.18, restart_share=0.52)
    lines = knobs(row, job)
    assert len(lines) == 2 and not any(line.startswith("to reach") for line in lines)
    assert lines[1] == (
        "0.999 is out of reach of any one knob alone; at their limits: --param "
        "restart_downtime_s 6 s gives 0.99835, --restore-rate 200000 records/s gives 0.99774, "
        "--detection 6 s gives 0.99738"
    )
    # A knob already at its limit stays there: detection 6 s is not lowered further.
    fast = PlanJob(workload=orders, availability=AvailabilityModel(detection_s=6.0))
    assert "--detection 6 s gives" in knobs(row, fast)[1]


@pytest.mark.parametrize("width", [80, 120])
def test_the_table_fits_the_log_unabridged(width: int) -> None:
    screen = io.StringIO()
    Console(file=screen, width=width).print(
        _plan_table(ROWS, ROWS[2], "orders-enricher, 100 traces")
    )
    lines = screen.getvalue().splitlines()
    assert max(len(line) for line in lines) <= width
    text = screen.getvalue()
    assert "…" not in text
    for value in (
        "0.99700",
        "0.99720",
        "0.99790",
        "14,025",
        "2,087",
        "2.25",
        "40.9M",
        "1,093",
        "2 *",
    ):
        assert value in text, value


def test_plan_standbys_and_simulate_share_one_restore_rate(orders: Workload) -> None:
    """The report prices downtime at simulate's rate, the plan its restores at its own: one
    default (they were 10,000 and 20,000), and the plan's simulation catches new standbys up at
    the rate it prices restores at."""
    assert (
        AvailabilityModel().restore_rate
        == SimulationJob(workload=orders, assignors=("task:sticky",)).replica_restore_per_s
        == RESTORE_RATE
    )
    job = PlanJob(workload=orders, availability=AvailabilityModel(restore_rate=50_000.0))
    assert job.simulation(1).replica_restore_per_s == 50_000.0


def test_a_plan_with_warmups_names_its_assignor_and_the_sticky_plan() -> None:
    """Only the high-availability assignor places warmups: a plan with them says so and gives
    the plan for StickyTaskAssignor, the candidates without warmups (the report of simulate's
    default group says "Use task:sticky"; with the HA plan's standbys it gets less)."""
    rows = [candidate(1, 0, 0.9940), candidate(2, 0, 0.9941), candidate(2, 2, 0.9969)]
    best, _, _ = recommend(rows)
    assert (best["standbys"], best["warmups"]) == (2, 2)
    advice = assignor_advice(rows, best)
    assert advice["assignor"] == "task:ha" and advice["without_warmups"] == rows[0]
    assert advice["why"] == (
        "warmups need the high-availability assignor (streamassign.ha; task:ha in simulate); "
        "StickyTaskAssignor (task:sticky) places none: with it, num_standby_replicas=1, "
        "warmups=0 (availability 0.99400, against 0.99690 with warmups)"
    )
    missed = assignor_advice(rows, best, target=0.995)["why"]
    assert missed.endswith(
        "num_standby_replicas=2, warmups=0 (availability 0.99410, against "
        "0.99690 with warmups; none without warmups reaches 0.995)"
    )
    assert "add 0 to --warmups" in assignor_advice(rows[2:], best)["why"]
    plain = assignor_advice(rows[:2], rows[0])
    assert plain["assignor"] == "task:sticky" and plain["without_warmups"] is None
    assert plain["why"].startswith("no warmups: ")
