"""The pipeline's commands on a real Spark standalone cluster, against local mode.

A master and one 2-core worker are started from the pyspark package (``scripts/spark_cluster.py``)
on free ports of 127.0.0.1. The executors' Python is a bare venv (``python -m venv
--without-pip``, no system site packages): neither streamassign nor attrs is installed there,
so the commands only work because they ship their code. That is all an executor needs: the
standard library of the driver's Python minor version; pyspark itself comes from the worker's
Spark (``$SPARK_HOME/python/lib/pyspark.zip``, put on the executors' ``PYTHONPATH`` by Spark).

``simulate``, ``report`` and ``plan-standbys`` run as a user runs them (one process each,
``--master spark://...``); their rows, summaries and candidates must equal those of the same
jobs on the tests' local Spark session, timings aside. Eight JVM starts make most of its time
(docs/testing.md has the measurements).
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
import pytest

from streamassign.pipeline import ScenarioModel, SimulationJob, Workload

from ..waiting import readable_within
from .conftest import ORDERS, ROOT

pytest.importorskip("pyspark")
pytest.importorskip("plotly")

CLUSTER_SCRIPT = ROOT / "scripts" / "spark_cluster.py"
ASSIGNORS = ("task:sticky", "task:ha", "consumer:range", "consumer:sticky")
SCENARIOS, STEPS = 3, 8
#: A command on the cluster: a JVM for the driver and one for the executor, on a loaded machine.
COMMAND_TIMEOUT_S = 300


def cluster_script() -> ModuleType:
    name = "_streamassign_spark_cluster_script"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, CLUSTER_SCRIPT)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


@attrs.frozen
class ClusterRuns:
    tmp: Path  # the commands' TMPDIR
    run: Path  # simulate's run directory
    report: Path
    plan: dict[str, Any]  # plan-standbys --json
    marker: Path  # one line per executor Python started: the PYTHONPATH Spark gave it


def bare_python(where: Path) -> Path:
    """A venv without pip or site packages, behind a wrapper that records each start."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where / "venv")], check=True)
    python = where / "venv" / "bin" / "python"
    probe = "import importlib.util as u; print(u.find_spec('attrs'), u.find_spec('streamassign'))"
    found = subprocess.run(
        [str(python), "-c", probe],
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        cwd=where,
        capture_output=True,
        text=True,
        check=True,
    )
    assert found.stdout.split() == ["None", "None"]
    wrapper = where / "executor-python"
    marker = where / "executor-starts.txt"
    wrapper.write_text(f'#!/bin/sh\necho "$PYTHONPATH" >> {marker}\nexec {python} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def run_cli(args: list[str], env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "streamassign", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    assert done.returncode == 0, f"{args[0]} failed:\n{done.stdout}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def cluster_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterRuns]:
    where = tmp_path_factory.mktemp("cluster")
    tmp = where / "tmp"
    tmp.mkdir()
    env = {
        **os.environ,
        "PYSPARK_PYTHON": str(bare_python(where)),
        "TMPDIR": str(tmp),  # where the code bundles go (and must be gone from afterwards)
        "SPARK_LOCAL_IP": "127.0.0.1",
        "COLUMNS": "80",
    }
    run, report = where / "run", where / "report"
    with cluster_script().cluster(workers=1, cores=2) as cluster:
        master = ["--master", cluster.master_url]
        simulate = ["simulate", str(ORDERS), "--scenarios", str(SCENARIOS), "--steps", str(STEPS)]
        simulate += ["--assignors", ",".join(ASSIGNORS), "--out", str(run), *master]
        plan = ["plan-standbys", str(ORDERS), "--scenarios", str(SCENARIOS), "--steps", str(STEPS)]
        plan += ["--standbys", "0,1", "--json", *master]
        commands = {
            "simulate": simulate,
            "report": ["report", str(run), "--out", str(report), *master],
            "plan-standbys": plan,
        }
        outputs = {name: run_cli(args, env, where) for name, args in commands.items()}
    marker = where / "executor-starts.txt"
    yield ClusterRuns(tmp, run, report, json.loads(outputs["plan-standbys"]), marker)


def test_executors_ran_the_bare_python_and_the_bundles_are_gone(cluster_runs: ClusterRuns) -> None:
    # Every command's executor started the bare venv's Python, with Spark's pyspark.zip as its
    # only addition: streamassign and attrs came in the shipped bundle.
    paths = cluster_runs.marker.read_text().split()
    assert paths and all("pyspark.zip" in p and "streamassign" not in p for p in paths)
    assert not list(cluster_runs.tmp.glob("streamassign-code-*"))


def test_simulate_rows_equal_local_mode(
    cluster_runs: ClusterRuns, spark: Any, orders: Workload, tmp_path: Path
) -> None:
    from streamassign.pipeline.simulate import COLUMNS
    from streamassign.pipeline.spark import run_simulation

    job = SimulationJob(
        workload=orders,
        model=ScenarioModel(steps=STEPS),
        assignors=ASSIGNORS,
        scenarios=SCENARIOS,
        standby_replicas=1,
    )
    run_simulation(spark, job, str(tmp_path / "local"), {})
    names = [c[0] for c in COLUMNS if c[0] != "assign_ms"]  # timings differ

    def rows(path: Path) -> list[tuple[Any, ...]]:
        frame = spark.read.parquet(str(path / "rebalances")).select("seed", *names)
        return sorted(tuple(r) for r in frame.collect())

    on_cluster = rows(cluster_runs.run)
    assert len(on_cluster) > SCENARIOS * len(ASSIGNORS) * STEPS // 2
    assert on_cluster == rows(tmp_path / "local")


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def same_value(a: str, b: str) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    except ValueError:
        return a == b


def test_report_summaries_equal_local_mode(
    cluster_runs: ClusterRuns, spark: Any, tmp_path: Path
) -> None:
    from streamassign.pipeline.report import render_report
    from streamassign.pipeline.spark import aggregate

    assert (cluster_runs.report / "report.html").stat().st_size > 0
    render_report(aggregate(spark, str(cluster_runs.run)), tmp_path / "local")
    tables = sorted(p.name for p in cluster_runs.report.glob("*.csv"))
    assert "summary_by_assignor.csv" in tables
    assert tables == sorted(p.name for p in (tmp_path / "local").glob("*.csv"))
    for name in tables:
        mine = read_csv(cluster_runs.report / name)
        local = read_csv(tmp_path / "local" / name)
        assert len(mine) == len(local) > 0, name
        for a, b in zip(mine, local, strict=True):
            assert a.keys() == b.keys()
            differing = [
                k for k in a if not k.startswith("assign_ms") and not same_value(a[k], b[k])
            ]
            assert not differing, (name, differing)


def test_plan_standbys_equals_local_mode(
    cluster_runs: ClusterRuns, spark: Any, orders: Workload
) -> None:
    from streamassign.pipeline.spark import run_plan
    from streamassign.pipeline.standbys import PlanJob, summarize

    job = PlanJob(
        workload=orders,
        model=ScenarioModel(steps=STEPS),
        scenarios=SCENARIOS,
        standby_candidates=(0, 1),
    )
    local = summarize(run_plan(spark, job), job.availability)
    on_cluster = cluster_runs.plan["candidates"]
    assert [(r["standbys"], r["warmups"]) for r in on_cluster] == [
        (r["standbys"], r["warmups"]) for r in local
    ]
    for a, b in zip(on_cluster, local, strict=True):
        for key, value in b.items():
            assert same_value(str(a[key]), str(value)), (key, a[key], value)


#: A stand-in for ``spark-class``: records its pid, serves the master's status (every worker
#: alive) on the master's web port, and otherwise sleeps; SIGTERM ends it (as a daemon).
FAKE_SPARK_CLASS = """\
import http.server, json, os, sys, time
open(os.path.join(os.environ["FAKE_SPARK_PIDS"], str(os.getpid())), "w").close()
if sys.argv[1].endswith("Master"):
    port = int(sys.argv[sys.argv.index("--webui-port") + 1])
    class Status(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"status": "ALIVE", "aliveworkers": 99}).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("127.0.0.1", port), Status).serve_forever()
time.sleep(600)
"""


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_the_cluster_script_stops_on_a_signal_even_started_in_the_background(
    tmp_path: Path, signame: str
) -> None:
    """An audit started scripts/spark_cluster.py in the background from a script: Ctrl-C did
    nothing (SIGINT comes in ignored there) and SIGTERM left its temporary folder behind.
    Spark's daemons are stood in for (no JVM): what counts is the script's own cleanup."""
    import signal
    import time

    home = tmp_path / "spark"
    (home / "bin").mkdir(parents=True)
    spark_class = home / "bin" / "spark-class"
    spark_class.write_text(f"#!{sys.executable}\n{FAKE_SPARK_CLASS}")
    spark_class.chmod(0o755)
    pids, temp = tmp_path / "pids", tmp_path / "tmp"
    pids.mkdir()
    temp.mkdir()
    run = (
        "import sys, pathlib, importlib.util as u\n"
        f"spec = u.spec_from_file_location('spark_cluster', {str(CLUSTER_SCRIPT)!r})\n"
        "script = sys.modules['spark_cluster'] = u.module_from_spec(spec)\n"
        "spec.loader.exec_module(script)\n"
        f"script.spark_home = lambda: pathlib.Path({str(home)!r})\n"
        "sys.argv[1:] = ['--workers', '2']\n"
        "script.main()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", run],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(temp), "FAKE_SPARK_PIDS": str(pids)},
        # As a shell starts a background job: SIGINT ignored, inherited by the script.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        assert child.stdout is not None
        assert readable_within(child.stdout, 60), "no master URL within 60 s"
        assert child.stdout.readline().startswith("spark://127.0.0.1:")
        assert len(list(temp.glob("streamassign-spark-cluster-*"))) == 1
        deadline = time.monotonic() + 30
        while len(daemons := [int(p.name) for p in pids.iterdir()]) < 3:  # master, 2 workers
            assert time.monotonic() < deadline, "the workers did not start within 30 s"
            time.sleep(0.05)
        signum = signal.Signals[signame]
        child.send_signal(signum)
        assert child.wait(timeout=30) == 128 + signum
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert list(temp.iterdir()) == []  # its folder removed
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in daemons):
        assert time.monotonic() < deadline, "a daemon outlived the script"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
