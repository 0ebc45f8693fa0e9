"""The report tests' fixture ``report_data.json``: what ``spark.aggregate`` returns for a small
real run (every assignor on the orders join, the BUSY model, 3 scenarios, seed 3).

``test_spark.py`` simulates and aggregates the same run again and compares it with the stored
file (all but the assignors' timings), so the report tests render today's output. When the
simulation or the aggregation changes, regenerate it with ``python -m tests.pipeline.report_data``
(from the repository root; about a minute).
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

import attrs

from streamassign.pipeline import SimulationJob, Workload
from streamassign.pipeline.assignors import SPECS

from .conftest import BUSY, ORDERS, ROOT

DATA = Path(__file__).with_name("report_data.json")
#: Columns that measure the machine, not the assignments: never compared.
TIMINGS = ("assign_ms_",)
#: Manifest fields a run adds that differ between runs of the same job (its Parquet files' names
#: hold a random id, their sizes and digests vary with the timings in them).
RUN_FIELDS = ("manifest.run_id", "manifest.row_files", "manifest.row_sha256")


#: Every assignor, in the registry's order.
ALL = tuple(s.name for s in SPECS)


def job(orders: Workload, assignors: tuple[str, ...] = ALL) -> SimulationJob:
    """One standby, the BUSY model's churn on ``topology/orders-join.toml``, 3 scenarios."""
    return SimulationJob(
        workload=orders, model=BUSY, assignors=assignors, scenarios=3, seed=3, standby_replicas=1
    )


def manifest(simulated: SimulationJob) -> dict[str, Any]:
    """The manifest the CLI writes, less the fields naming the machine, versions and time."""
    return {
        "topology": simulated.workload.name,
        "topology_file": str(ORDERS.relative_to(ROOT)),
        "partitions": dict(simulated.workload.counts),
        "scenarios": simulated.scenarios,
        "seed": simulated.seed,
        "assignors": list(simulated.assignors),
        "notes": ["a note from the run"],
        "standby_replicas": simulated.standby_replicas,
        "acceptable_recovery_lag": simulated.acceptable_recovery_lag,
        "model": attrs.asdict(simulated.model),
    }


def aggregate_run(spark: Any, folder: Path) -> dict[str, Any]:
    """Simulate :func:`job` into ``folder/run`` and return its aggregate, rounded."""
    from streamassign.pipeline.spark import aggregate, run_simulation

    simulated = job(Workload.from_file(ORDERS))
    run = folder / "run"
    run_simulation(spark, simulated, str(run), manifest(simulated), run_id="report-data")
    return rounded(aggregate(spark, str(run)))


def rounded(value: Any) -> Any:
    """Floats to 5 significant digits, through lists and dicts."""
    if isinstance(value, float):
        return float(f"{value:.5g}") if math.isfinite(value) else value
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v) for v in value]
    return value


def differences(got: dict[str, Any], stored: dict[str, Any]) -> list[str]:
    """Where ``got`` differs from ``stored`` beyond timings and rounding (empty when alike)."""
    found: list[str] = []

    def walk(a: Any, b: Any, where: str) -> None:
        if where.rsplit(".", 1)[-1].startswith(TIMINGS) or where in RUN_FIELDS:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                if f"{where}.{key}" in RUN_FIELDS:
                    continue
                if key not in a or key not in b:
                    found.append(f"{where}.{key}: only in {'stored' if key in b else 'fresh'}")
                else:
                    walk(a[key], b[key], f"{where}.{key}" if where else key)
        elif isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                found.append(f"{where}: {len(a)} items, stored {len(b)}")
            for k, (x, y) in enumerate(zip(a, b, strict=False)):
                walk(x, y, f"{where}[{k}]")
        elif isinstance(a, float) and isinstance(b, float):
            if not math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-9):
                found.append(f"{where}: {a}, stored {b}")
        elif a != b:
            found.append(f"{where}: {a!r}, stored {b!r}")

    walk(got, {k: v for k, v in stored.items() if k != "_about"}, "")
    return found


ABOUT = (
    "spark.aggregate() of a small real run (tests/pipeline/report_data.py: the BUSY model, "
    "orders-join, every assignor, 3 scenarios, seed 3), floats rounded to 5 significant digits. "
    "test_spark.py aggregates the same run and compares (all but timings); regenerate with "
    "`python -m tests.pipeline.report_data`."
)


def main() -> None:
    from streamassign.pipeline.spark import start_session

    session = start_session("local[2]", "streamassign-report-data")
    try:
        with tempfile.TemporaryDirectory(prefix="streamassign-report-data-") as tmp:
            data = aggregate_run(session, Path(tmp))
    finally:
        session.stop()
    data["_about"] = ABOUT
    DATA.write_text(json.dumps(data, separators=(",", ":"), sort_keys=False) + "\n")
    print(f"wrote {DATA} ({data['manifest']['rows']} rows aggregated)")


if __name__ == "__main__":
    main()
