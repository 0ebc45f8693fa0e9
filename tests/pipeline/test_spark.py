"""The Spark jobs in local mode: the same numbers as the pure core, and the report's files."""

from __future__ import annotations

import csv
import hashlib
import json
import math
import statistics
from pathlib import Path
from typing import Any

import attrs
import pytest

from streamassign.pipeline import RebalanceRow, SimulationJob, Workload, simulate_scenario
from streamassign.pipeline.assignors import SPECS
from streamassign.pipeline.standbys import (
    PLAN_COLUMNS,
    PlanJob,
    evaluate_candidates,
    recommend,
    summarize,
)

from . import report_data
from .conftest import BUSY, ROOT

pytest.importorskip("pyspark")
pytest.importorskip("plotly")

#: Every assignor whose package is installed; with all of them, the run of report_data.json.
ASSIGNORS = tuple(s.name for s in SPECS if s.missing() is None)


@attrs.frozen
class Run:
    path: Path
    job: SimulationJob
    rows: list[RebalanceRow]  # the pure core's rows for the same seeds


@pytest.fixture(scope="module")
def run(spark: Any, orders: Workload, tmp_path_factory: pytest.TempPathFactory) -> Run:
    from streamassign.pipeline.spark import run_simulation

    job = report_data.job(orders, ASSIGNORS)
    path = tmp_path_factory.mktemp("sim") / "run"
    written = run_simulation(spark, job, str(path), report_data.manifest(job), run_id="r1")
    rows = [r for s in range(job.scenarios) for r in simulate_scenario(job, s)]
    assert written == len(rows)
    return Run(path, job, rows)


@pytest.fixture(scope="module")
def aggregated(spark: Any, run: Run) -> dict[str, Any]:
    from streamassign.pipeline.spark import aggregate

    return aggregate(spark, str(run.path))


def key(values: tuple[Any, ...]) -> tuple[Any, ...]:
    return (values[0], values[4], values[1])  # scenario, assignor, step


def test_parquet_rows_equal_the_pure_core_on_the_same_seeds(spark: Any, run: Run) -> None:
    from streamassign.pipeline.simulate import COLUMNS
    from streamassign.pipeline.spark import row_schema

    stored = spark.read.parquet(str(run.path / "rebalances"))
    # run_id and seed first; the partition column (assignor) comes back last.
    names = [f.name for f in stored.schema]
    assert names[:2] == ["run_id", "seed"] and names[-1] == "assignor"
    assert {r[0] for r in stored.select("run_id", "seed").distinct().collect()} == {"r1"}
    assert {r[1] for r in stored.select("run_id", "seed").distinct().collect()} == {3}
    partitions = {p.name for p in (run.path / "rebalances").iterdir() if p.is_dir()}
    assert len(partitions) == len(ASSIGNORS) and "assignor=task%3Asticky" in partitions
    frame = stored.select(*(c[0] for c in COLUMNS))
    assert [(f.name, f.dataType) for f in frame.schema] == [
        (f.name, f.dataType) for f in row_schema()
    ]
    manifest = json.loads((run.path / "manifest" / "part-00000.json").read_text())
    assert manifest["run_id"] == "r1" and manifest["rows"] == len(run.rows)
    written = sorted((run.path / "rebalances").glob("*/*.parquet"))  # listed for a rerun's check
    assert manifest["row_files"] == {
        f"{path.parent.name}/{path.name}": path.stat().st_size for path in written
    }
    assert manifest["row_sha256"] == {
        f"{path.parent.name}/{path.name}": hashlib.sha256(path.read_bytes()).hexdigest()
        for path in written
    }
    timing = [c[0] for c in COLUMNS].index("assign_ms")

    def strip(values: tuple[Any, ...]) -> tuple[Any, ...]:
        return values[:timing] + values[timing + 1 :]

    got = sorted((tuple(r) for r in frame.collect()), key=key)
    expected = sorted((r.values() for r in run.rows), key=key)
    assert [strip(v) for v in got] == [strip(v) for v in expected]
    assert all(v[timing] >= 0 for v in got)


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), list(reader)


def test_report_files(aggregated: dict[str, Any], run: Run, tmp_path: Path) -> None:
    from streamassign.pipeline.report import render_report

    data = aggregated
    assert data["manifest"]["topology"] == "orders-enricher"
    page = render_report(data, tmp_path / "report")
    text = page.read_text()
    assert text.count("Plotly.newPlot(") >= 5
    assert "a note from the run" in text  # the manifest's notes are shown
    ha = {r["assignor"]: r for r in data["outcomes"]}
    churn_rows = [r for r in run.rows if r.event != "initial" and r.assignor == "task:sticky"]
    assert ha["task:sticky"]["warmups_total"] == sum(r.warmups or 0 for r in churn_rows)
    assert ha["task:sticky"]["split_share"] == 0.0

    churn = [r for r in run.rows if r.event != "initial"]
    header, rows = read_csv(tmp_path / "report" / "summary_by_assignor.csv")
    assert header == data["columns"]["by_assignor"]
    for column in (
        "level",
        "assignor",
        "rebalances",
        "moves_mean",
        "moves_p99",
        "records_to_restore_p50",
        "standby_coverage_mean",
        "assign_ms_p99",
    ):
        assert column in header
    assert sorted(r["assignor"] for r in rows) == sorted(ASSIGNORS)
    for row in rows:
        mine = [r for r in churn if r.assignor == row["assignor"]]
        assert int(row["rebalances"]) == len(mine)
        assert int(row["moves_total"]) == sum(r.moves for r in mine)
        assert math.isclose(
            float(row["records_to_restore_p50"]),
            statistics.median(r.records_to_restore for r in mine),
        )
        coverage = row["standby_coverage_mean"]
        assert (coverage == "") == (row["level"] == "consumer")

    header, rows = read_csv(tmp_path / "report" / "summary_by_event.csv")
    assert header[:3] == ["level", "assignor", "event"]
    assert len(rows) == len({(r.level, r.assignor, r.event) for r in run.rows})
    header, rows = read_csv(tmp_path / "report" / "by_step.csv")
    assert header[:3] == ["level", "assignor", "step"]
    assert len(rows) == len({(r.assignor, r.step) for r in run.rows})


@pytest.mark.skipif(
    ASSIGNORS != report_data.ALL, reason="the stored run has every assignor (faust, aiokafka)"
)
def test_the_report_tests_render_what_aggregate_returns_today(
    aggregated: dict[str, Any],
) -> None:
    """The report tests render the stored ``report_data.json``: the same run aggregated now
    gives the same numbers (all but the assignors' timings), so they test today's output."""
    stored = json.loads(report_data.DATA.read_text())
    found = report_data.differences(report_data.rounded(aggregated), stored)
    assert not found, (
        f"{len(found)} differences from {report_data.DATA.name} (regenerate: python -m "
        "tests.pipeline.report_data), first: " + "; ".join(found[:5])
    )


def test_plan_standbys_job_matches_the_pure_evaluation(spark: Any, orders: Workload) -> None:
    from streamassign.pipeline.spark import run_plan

    model = attrs.evolve(BUSY, crash_per_client_hour=1.0, steps=10, changelog_records=5_000_000)
    job = PlanJob(
        workload=orders,
        model=model,
        scenarios=4,
        standby_candidates=(1, 0),
        warmup_candidates=(0, 2),
    )
    totals = run_plan(spark, job)
    assert [(t["standbys"], t["warmups"]) for t in totals] == [(0, 0), (0, 2), (1, 0), (1, 2)]
    names = [c[0] for c in PLAN_COLUMNS]
    pure = [
        dict(zip(names, row, strict=True))
        for s in range(4)
        for r in (0, 1)
        for row in evaluate_candidates(job, s, r)
    ]
    for t in totals:
        mine = [p for p in pure if (p["standbys"], p["warmups"]) == (t["standbys"], t["warmups"])]
        assert t["traces"] == 4
        for column in ("unavailable_task_seconds", "task_seconds", "restore_outage_s"):
            assert math.isclose(t[column], sum(p[column] for p in mine)), column
        parts = ("restore_outage_s", "detection_outage_s", "restart_outage_s")
        assert math.isclose(t["unavailable_task_seconds"], sum(t[c] for c in parts))
        assert t["worst_outage_max_s"] == max(p["worst_outage_s"] for p in mine)
    table = summarize(totals, job.availability)
    by = {(r["standbys"], r["warmups"]): r for r in table}
    # Standbys turn crash restores of whole changelogs into standby catch-ups.
    assert by[1, 0]["availability"] > by[0, 0]["availability"]
    assert by[1, 0]["standby_load"] > 0 == by[0, 0]["standby_load"]
    # Warmups never make things worse under the model; they only defer planned moves.
    assert by[0, 2]["availability"] >= by[0, 0]["availability"]
    best, why, _ = recommend(table, 0.5)
    assert (best["standbys"], best["warmups"]) == (0, 0) and "least extra load" in why
    # A target above every candidate's availability: the most available one, said so.
    top = max(r["availability"] for r in table)
    best, why, _ = recommend(table, top + 1e-9)
    assert "no candidate reaches" in why
    assert best["availability"] == top


def test_ship_code_zips_what_executors_need(spark: Any, orders: Workload, tmp_path: Path) -> None:
    import zipfile

    from streamassign.pipeline.spark import run_simulation, ship_code

    path = ship_code(spark, tmp_path)
    names = set(zipfile.ZipFile(path).namelist())
    assert {"streamassign/pipeline/simulate.py", "attr/__init__.py", "attrs/__init__.py"} <= names
    assert not any("__pycache__" in n for n in names)
    job = SimulationJob(workload=orders, model=BUSY, assignors=("task:sticky",), scenarios=2)
    assert run_simulation(spark, job, str(tmp_path / "run"), {}) == sum(
        len(simulate_scenario(job, s)) for s in range(2)
    )


def test_rows_of_other_code_than_the_drivers_fail_the_run_in_one_line(
    spark: Any, orders: Workload, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The executors check that they run the driver's code (its fingerprint is the manifest's):
    here the driver's is made another, and the job fails with the workers' one line."""

    from streamassign.errors import ExecutorCodeError
    from streamassign.pipeline import spark as sp
    from streamassign.pipeline.runs import Code

    other = Code("/elsewhere/streamassign", "e" * 64)
    monkeypatch.setattr(sp, "this_code", lambda: other)
    job = SimulationJob(workload=orders, model=BUSY, assignors=("task:sticky",), scenarios=2)
    with pytest.raises(ExecutorCodeError) as failed:
        sp.run_simulation(spark, job, str(tmp_path / "run"), {})
    assert str(failed.value).startswith("Spark's Python workers import other streamassign code (")
    assert "than this command (/elsewhere/streamassign, eeeeeeeeeeee…)" in str(failed.value)
    assert "\n" not in str(failed.value)
    plan = PlanJob(workload=orders, model=BUSY, scenarios=2, standby_candidates=(0,))
    with pytest.raises(ExecutorCodeError, match=r"^Spark's Python workers import other"):
        sp.run_plan(spark, plan)


def test_the_driver_words_the_cause_of_a_line_older_worker_code_wrote(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Workers running other code are often older code, whose line blamed the working
    directory whatever the cause: the driver keeps the part naming both packages and names
    the cause itself (here a PYSPARK_PYTHON with its own install), in one line."""
    from streamassign.pipeline import spark as sp
    from streamassign.pipeline.runs import Code

    monkeypatch.setattr(sp, "this_code", lambda: Code("/clone/streamassign", "9" * 64))
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3")
    monkeypatch.chdir(tmp_path)
    head = (
        "Spark's Python workers import other streamassign code (/opt/py/streamassign, "
        "7ef542c44998…) than this command (/clone/streamassign, 999999999999…)"
    )
    old_line = (
        f"{head}: a streamassign package in the working directory comes first on the workers' "
        "path; run from a folder without one (or ship the same code to a cluster's executors)"
    )
    trace = f"Job aborted.\n  File x\nstreamassign.errors.ExecutorCodeError: {old_line}"
    said = sp._executor_code_error(Exception(trace), shipped=False, local_master=True)
    assert said is not None and str(said) == (
        f"{head}: PYSPARK_PYTHON (/usr/bin/python3) has a streamassign of its own; install "
        "this one there"
    )
    unreadable = Exception("ExecutorCodeError: some other wording")  # kept as the worker said
    assert (
        str(sp._executor_code_error(unreadable, shipped=False, local_master=True))
        == "some other wording"
    )
    assert (
        sp._executor_code_error(Exception("another failure"), shipped=False, local_master=True)
        is None
    )


def test_progress_shows_tasks_and_ctrl_c_cancels_the_jobs(spark: Any) -> None:
    import io
    import os
    import signal
    import threading
    import time

    from rich.console import Console

    from streamassign.pipeline.progress import run_tracked

    screen = io.StringIO()
    console = Console(file=screen, width=120)
    sc = spark.sparkContext
    assert run_tracked(spark, "counting", console, lambda: sc.parallelize(range(10), 5).sum()) == 45
    assert "counting" in screen.getvalue() and "5/5 Spark tasks (1 stage)" in screen.getvalue()

    def slow(x: int) -> int:
        time.sleep(20)
        return x

    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT))
    started = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        run_tracked(spark, "sleeping", console, lambda: sc.parallelize(range(2), 2).map(slow).sum())
    timer.cancel()
    # The running tasks were interrupted: the executors are free for the next job at once.
    assert sc.parallelize(range(4), 2).sum() == 6
    assert time.monotonic() - started < 18


def test_local_mode_workers_run_this_interpreter(spark: Any) -> None:
    """Not the first python3 on the PATH: a venv's packages are there without activating it."""
    import sys

    def executable(_: int) -> str:
        import sys

        return sys.executable

    assert spark.sparkContext.parallelize([0], 1).map(executable).collect() == [sys.executable]


def test_hadoop_files_publish_and_check_runs_like_local_ones(spark: Any, tmp_path: Path) -> None:
    """The remote path (hdfs://, s3a://) through Hadoop's FileSystem, here on file:// URIs."""
    from streamassign.pipeline import PipelineError
    from streamassign.pipeline.runs import (
        HadoopFiles,
        check_run,
        describe_existing,
        publish,
        row_files,
        write_manifest,
    )

    files = HadoopFiles(spark)
    final = tmp_path.as_uri() + "/run"
    for run_id in ("old", "new"):
        staging = f"{tmp_path.as_uri()}/.run.partial-{run_id}"
        part = tmp_path / f".run.partial-{run_id}" / "rebalances" / "assignor=x"
        part.mkdir(parents=True)
        (part / "part-0.parquet").write_bytes(b"PAR1")
        with pytest.raises(PipelineError, match="has rows but no manifest"):
            check_run(files, staging)
        write_manifest(files, staging, {"run_id": run_id, "rows": 1})
        publish(files, staging, final, run_id)
        assert check_run(files, final)["run_id"] == run_id
    assert describe_existing(files, final) == f"{final} already holds a complete run (new)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    # What the manifest lists of a run written there (runs.ROW_FILES): a path under the URI.
    assert row_files(files, final) == {"assignor=x/part-0.parquet": 4}
    assert row_files(files, f"{tmp_path.as_uri()}/nowhere") == {}
    manifest = tmp_path / "run" / "manifest"
    assert [p.name for p in manifest.iterdir() if not p.name.endswith(".crc")] == [
        "part-00000.json"
    ]


def test_spark_tasks_default_to_four_per_core_and_never_exceed_the_items() -> None:
    from types import SimpleNamespace

    from streamassign.pipeline.spark import _slices

    fake = SimpleNamespace(sparkContext=SimpleNamespace(defaultParallelism=2))
    assert _slices(fake, 100) == 8
    assert _slices(fake, 100, 30) == 30
    assert _slices(fake, 5, 30) == 5 and _slices(fake, 5) == 5
    assert _slices(fake, 0) == 1
    # Large runs: at most 100 traces per task, so progress moves more often.
    assert _slices(fake, 3000) == 30 and _slices(fake, 3000, 4) == 4


def test_large_runs_get_approximate_percentiles(
    spark: Any, run: Run, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from streamassign.pipeline import spark as sp
    from streamassign.pipeline.report import render_report

    exact = sp.aggregate(spark, str(run.path))
    assert exact["exact_percentiles"] is True
    monkeypatch.setattr(sp, "EXACT_PERCENTILE_ROWS", 10)
    approx = sp.aggregate(spark, str(run.path))
    assert approx["exact_percentiles"] is False
    assert approx["columns"] == exact["columns"]
    for mine, theirs in zip(approx["by_assignor"], exact["by_assignor"], strict=True):
        assert mine["moves_mean"] == theirs["moves_mean"]  # only percentiles differ
        # percentile_approx returns a value of the column; the exact one interpolates
        assert mine["moves_p50"] is not None and mine["moves_p50"] >= 0
        assert abs(mine["moves_p50"] - theirs["moves_p50"]) <= max(1.0, theirs["moves_p50"])
    page = render_report(approx, tmp_path / "report").read_text()
    assert "Percentiles (p50, p90, p99) are approximate" in page


def test_a_signal_while_spark_starts_stops_the_session_once_it_exists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A review's SIGTERM to the Python process while the JVM started raised inside pyspark's
    start-up: its JVM stayed running for good, orphaned. Now the signal waits for the session,
    then stops it. (A stand-in for the start: no JVM.)"""
    import os
    import signal
    from types import SimpleNamespace

    from pyspark.sql import SparkSession

    from streamassign.pipeline import spark as sp
    from streamassign.pipeline.signals import interrupt_on_signals

    events: list[str] = []

    def start_session(*args: Any) -> Any:
        os.kill(os.getpid(), signal.SIGTERM)  # mid-way through the JVM's start
        events.append("started")
        return SimpleNamespace(
            sparkContext=SimpleNamespace(setLogLevel=lambda level: None),
            stop=lambda: events.append("stopped"),
        )

    monkeypatch.setattr(SparkSession, "getActiveSession", staticmethod(lambda: None))
    monkeypatch.setattr(sp, "start_session", start_session)
    with (
        pytest.raises(KeyboardInterrupt) as raised,
        interrupt_on_signals(),
        sp.spark_session("local[1]"),
    ):
        events.append("used")
    assert raised.value.args == (signal.SIGTERM,)
    assert events == ["started", "stopped"]


def test_the_accumulator_server_prints_no_trace_when_the_jvm_goes_away(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A SIGHUP to the whole process group (the JVM stopped mid-update) printed socketserver's
    25-line EOFError trace from pyspark's accumulator server before the one line. Other errors
    still show. (A stand-in session and server: no JVM.)"""
    import sys
    from types import SimpleNamespace

    from pyspark.sql import SparkSession

    from streamassign.pipeline import spark as sp

    printed: list[str] = []

    def handle_error(request: Any, client_address: Any) -> None:
        printed.append(type(sys.exc_info()[1]).__name__)

    server = SimpleNamespace(handle_error=handle_error)
    session = SimpleNamespace(
        sparkContext=SimpleNamespace(_accumulatorServer=server), stop=lambda: None
    )
    monkeypatch.setattr(SparkSession, "getActiveSession", staticmethod(lambda: None))
    monkeypatch.setattr(sp, "start_session", lambda *a: session)
    with sp.spark_session("local[1]"):
        for error in (EOFError(), ValueError("bad token")):
            try:
                raise error
            except Exception:
                server.handle_error(None, ("127.0.0.1", 1))
    assert printed == ["ValueError"]


def test_the_modules_executors_import_need_no_rich() -> None:
    """Executors import ``streamassign.pipeline.spark`` (what the job's functions pickle
    refers to) on a Python that may have only pyspark and the shipped code: nothing it imports
    may need the CLI's rich (tests/pipeline/test_cluster.py runs such executors; a top-level
    ``progress`` import in runs.py once failed every cluster job with "No module named
    'rich'"). ``signals`` is what runs.py and spark.py import for their deferred steps; that
    ``progress`` fails shows the blocker works."""
    import os
    import subprocess
    import sys

    blocker = (
        "import sys, importlib.abc\n"
        "class NoRich(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'rich' or name.startswith('rich.'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}')\n"
        "        return None\n"
        "sys.meta_path.insert(0, NoRich())\n"
        "import streamassign.pipeline.signals\n"
        "import streamassign.pipeline.runs\n"
        "import streamassign.pipeline.spark\n"
        "try:\n"
        "    import streamassign.pipeline.progress\n"
        "except ModuleNotFoundError:\n"
        "    pass\n"
        "else:\n"
        "    sys.exit('rich was not blocked')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", blocker],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},  # this checkout's code, not an install's
    )
    assert done.returncode == 0, done.stderr
