"""``streamassign simulate | report | plan-standbys``: end to end, and bad input failing before
any Spark session starts."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import pytest
from click.testing import CliRunner

from streamassign.cli import main

from ..cli_runner import cli_runner, replace_in_cli
from .conftest import ORDERS, ROOT, hadoop_checksums

SUBMIT = ROOT / "streamassign" / "pipeline" / "submit.py"


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_simulate_with_report_then_report_again(spark: Any, tmp_path: Path) -> None:
    pytest.importorskip("plotly")
    run = tmp_path / "run"
    code, out = invoke(
        "simulate",
        str(ORDERS),
        "--scenarios",
        "3",
        "--steps",
        "6",
        "--seed",
        "9",
        "--assignors",
        "task:sticky,consumer:range",
        "--out",
        str(run),
        "--report",
        "--spark-tasks",
        "2",
        "--restore-rate",
        "40000",
        "--warmups",
        "3",
        "--probing-interval",
        "90.5",
    )
    assert code == 0, out
    # --spark-tasks: 2 tasks share the 3 scenarios, each writing one file per assignor.
    for folder in (run / "rebalances").iterdir():
        if folder.is_dir():
            assert len(list(folder.glob("part-*.parquet"))) == 2, folder
    assert "simulating 3 scenarios of orders-enricher x 2 assignors" in out
    assert f"report: {run / 'report' / 'report.html'}" in out
    assert f"next: open {(run / 'report' / 'report.html').as_uri()}" in out
    manifest = json.loads((run / "manifest" / "part-00000.json").read_text())
    assert manifest["assignors"] == ["task:sticky", "consumer:range"] and manifest["seed"] == 9
    # The restore rate is the run's, recorded and priced by the report (one default with
    # plan-standbys otherwise).
    assert manifest["replica_restore_per_s"] == 40_000.0
    # task:ha's settings too (simulate had no options for them: always 2 and 600 s).
    assert (manifest["max_warmup_replicas"], manifest["probing_interval_s"]) == (3, 90.5)
    assert "at 40,000 records/s per task" in (run / "report" / "report.html").read_text()
    assert f"run {manifest['run_id']} in {run}" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no staging folder left
    code, out = invoke("report", str(run), "--out", str(tmp_path / "again"), "--spark-tasks", "3")
    assert code == 0, out
    assert (tmp_path / "again" / "report.html").is_file()
    assert spark.sparkContext._jsc is not None  # the CLI left the shared session running


def test_plan_standbys_prints_a_recommendation(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")  # an 80-column log: nothing cut
    code, out = invoke(
        "plan-standbys",
        str(ORDERS),
        "--scenarios",
        "3",
        "--steps",
        "8",
        "--standbys",
        "0,1",
        "--warmups",
        "0,1",
        "--out",
        str(tmp_path),
        "--param",
        "crash_per_client_hour=0.5",
        "--ship-code",  # as on a cluster: the code bundle is added to the job
        "--spark-tasks",
        "3",
    )
    assert code == 0, out
    assert "recommended: " in out and "…" not in out
    table = out[out.index("Standby plans") : out.index("recommended: ")]
    assert max(len(line) for line in table.splitlines()) <= 80
    assert "outage of num_standby_replicas=" in out  # what the outage is made of
    assert "\nassignor: " in out  # warmups need task:ha; without them, the sticky plan
    assert "fleet modelled: 3-6 processes at the start, 2-10 as they scale" in out
    assert "evaluating standby candidates" in out and "Spark tasks" in out
    assert f"next: streamassign simulate {ORDERS} --standbys " in out
    # ... with the model it planned for (the next command's own test is below).
    assert "--scenarios 3 --param crash_per_client_hour=0.5 --steps 8 --out" in out
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert len(plan["candidates"]) == 4
    assert "num_standby_replicas=" in plan["why"]
    assert plan["knobs"][0].startswith("outage of ")
    assert plan["assignor"] == ("task:ha" if plan["recommended"]["warmups"] else "task:sticky")
    assert sum(
        plan["recommended"][k] for k in ("restore_share", "detection_share", "restart_share")
    ) == pytest.approx(1.0)
    assert (tmp_path / "plan.csv").read_text().startswith("standbys,warmups,traces,availability")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["simulate", str(ORDERS), "--assignors", "task:sticky,nope"], "unknown assignor 'nope'"),
        (["simulate", str(ORDERS), "-p", "orders=8"], "fails grouping: topics not co-partitioned"),
        (
            ["simulate", str(ORDERS), "--param", "max_initial_clients=0"],
            "max_initial_clients must be an integer >= 1",
        ),
        (
            ["simulate", str(ORDERS), "--param", "crash_per_client_hour=-0.5"],
            "crash_per_client_hour must be a finite number >= 0",
        ),
        (["simulate", str(ORDERS), "--param", "crashes=1"], "unknown parameter 'crashes'"),
        (["simulate", str(ORDERS), "--param", "steps"], "expected NAME=VALUE"),
        (["simulate", str(ORDERS), "--scenarios", "0"], "0 is not in the range x>=1"),
        (["simulate", str(ORDERS), "--standbys", "-1"], "-1 is not in the range x>=0"),
        (
            ["simulate", str(ORDERS), "--param", "steps=0"],
            "steps = 0: simulate compares the assignors over the rebalances after the initial",
        ),
        (
            ["plan-standbys", str(ORDERS), "--param", "steps=0"],
            "steps = 0: plan-standbys measures the outage over the rebalances after the initial",
        ),
        (["plan-standbys", str(ORDERS), "--standbys", "0,x"], "expected integers such as 0,1,2"),
        (["plan-standbys", str(ORDERS), "--target", "1.5"], "1.5 is not in the range 0<x<1"),
        (
            ["plan-standbys", str(ORDERS), "--target", "0.99", "--tolerance", "0.1"],
            "give --target or --tolerance, not both",
        ),
        (
            ["plan-standbys", str(ORDERS), "--probing-interval", "0"],
            "'--probing-interval': at least 60 s (Kafka Streams refuses a "
            "probing.rebalance.interval.ms below 60000), got 0",
        ),
        (["simulate", str(ORDERS), "-p", "orders=6,orders=8"], "orders given twice, as 6 and 8"),
        # FloatRange lets inf and nan through: inf failed in the executors after Spark started
        # (OverflowError), nan was refused naming SimulationJob's fields.
        (
            ["plan-standbys", str(ORDERS), "--restore-rate", "inf"],
            "Invalid value for '--restore-rate': inf is not a finite number",
        ),
        (
            ["simulate", str(ORDERS), "--restore-rate", "1e400"],
            "Invalid value for '--restore-rate': inf is not a finite number",
        ),
        (
            ["simulate", str(ORDERS), "--restore-rate", "nan"],
            "Invalid value for '--restore-rate': nan is not a finite number",
        ),
        (
            ["simulate", str(ORDERS), "--probing-interval", "nan"],
            "Invalid value for '--probing-interval': nan is not a finite number",
        ),
        # Kafka Streams' StreamsConfig refuses a probing.rebalance.interval.ms below 60000:
        # simulate modelled 30 s probing rounds no group could run.
        (
            ["simulate", str(ORDERS), "--probing-interval", "59.5"],
            "Invalid value for '--probing-interval': at least 60 s (Kafka Streams refuses a "
            "probing.rebalance.interval.ms below 60000), got 59.5",
        ),
        (
            ["simulate", str(ORDERS), "--probing-interval", "0"],
            "'--probing-interval': at least 60 s (Kafka Streams refuses a "
            "probing.rebalance.interval.ms below 60000), got 0",
        ),
        (["simulate", str(ORDERS), "--warmups", "0"], "'--warmups': 0 is not in the range x>=1"),
        (
            ["simulate", str(ORDERS), "--warmups", "4294967298"],
            "'--warmups': at most 100,000, got 4,294,967,298",
        ),
        (
            ["plan-standbys", str(ORDERS), "--detection", "inf"],
            "detection_s must be a finite number >= 0, got inf",
        ),
        # Past 32 bits a count would wrap in its Spark int column; past the limits a run
        # cannot finish (or, for scenarios, overflows Python's range in parallelize).
        (
            ["plan-standbys", str(ORDERS), "--standbys", "1,99999999999"],
            "Invalid value for --standbys: at most 100,000 each, got 99,999,999,999",
        ),
        (
            ["plan-standbys", str(ORDERS), "--warmups", "4294967298"],
            "Invalid value for --warmups: at most 100,000 each, got 4,294,967,298",
        ),
        (
            ["simulate", str(ORDERS), "--standbys", "4294967297"],
            "'--standbys': at most 100,000, got 4,294,967,297",
        ),
        (
            ["simulate", str(ORDERS), "--scenarios", "99999999999999999999"],
            "'--scenarios': at most 1,000,000",
        ),
        (
            ["plan-standbys", str(ORDERS), "--scenarios", "1000001"],
            "'--scenarios': at most 1,000,000, got 1,000,001 (a bound on one run's size: for "
            "more traces, run again with another --seed and --out; docs/pipeline.md, Limits)",
        ),
        (["simulate", str(ORDERS), "--steps", "99999999999"], "'--steps': at most 100,000"),
        (
            ["plan-standbys", str(ORDERS), "--param", "steps=100001"],
            "steps must be at most 100,000",
        ),
        (
            ["simulate", str(ORDERS), "--seed", "99999999999999999999"],
            "'--seed': within -9,223,372,036,854,775,808 to 9,223,372,036,854,775,807",
        ),
        (
            ["plan-standbys", str(ORDERS), "--seed", "-9223372036854775809"],
            "'--seed': within -9,223,372,036,854,775,808 to",
        ),
        (
            ["plan-standbys", str(ORDERS), "--restore-rate", "0"],
            "'--restore-rate': 0.0 is not in the range x>0",
        ),
        (
            ["plan-standbys", str(ORDERS), "--param", "disk_loss_probability=2"],
            "disk_loss_probability must be a probability",
        ),
    ],
)
def test_bad_input_fails_before_spark_starts(
    monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    pytest.importorskip("pyspark")
    from streamassign.pipeline import spark as sp

    started: list[str] = []

    def no_spark(*a: Any, **k: Any) -> Any:
        started.append("session")
        raise AssertionError("a SparkSession was requested")

    monkeypatch.setattr(sp, "spark_session", no_spark)
    monkeypatch.setattr(sp, "start_session", no_spark)
    code, out = invoke(*args)
    assert code != 0
    assert message in out, out
    assert "Traceback" not in out
    assert started == []


@pytest.mark.parametrize(("target", "status"), [("0.99", 0), ("0.999", 3), (None, 0)])
def test_plan_standbys_exits_3_when_no_candidate_reaches_the_target(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, target: str | None, status: int
) -> None:
    """The plan is printed and written either way; the status tells a script the outcome."""
    pytest.importorskip("pyspark")
    from streamassign.cli import plan_standbys
    from streamassign.pipeline import progress
    from streamassign.pipeline.standbys import recommend

    rows = [
        {"standbys": s, "warmups": 0, "availability": a, "standby_load": s, "warmup_load": 0.0}
        | {"convergence_s": 0.0}
        for s, a in ((0, 0.98), (1, 0.995))
    ]

    def plan_of(totals: Any, job: Any, goal: float | None, tolerance: float) -> Any:
        best, why, reached = recommend(rows, goal, tolerance)
        plan = {"candidates": rows, "recommended": dict(best), "why": why, "knobs": []}
        return plan | {"target_reached": reached}, best

    monkeypatch.setattr(plan_standbys, "_evaluate_standby_candidates", lambda *a: None)
    monkeypatch.setattr(plan_standbys, "_standby_plan", plan_of)
    # As in a terminal or a log apart from stdout (pytest -s 2>&1 | tee would merge them).
    monkeypatch.setattr(progress, "stderr_joins_stdout", lambda: False)
    args = ["plan-standbys", str(ORDERS), "--json", *(["--target", target] if target else [])]
    result = cli_runner().invoke(main, args)
    assert result.exit_code == status, result.output
    assert json.loads(result.stdout)["recommended"]["standbys"] == 1
    if status:
        assert result.stderr == "note: no candidate reaches --target 0.999: exit status 3\n"
    else:
        assert result.stderr == ""


def _fake_plan(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Stand-ins for the Spark evaluation and the plan: returns the list the evaluation
    appends to when it runs."""
    from streamassign.cli import plan_standbys

    ran: list[str] = []
    rows = [{"standbys": 1, "warmups": 0, "availability": 0.999, "standby_load": 1.0}]
    rows[0] |= {"warmup_load": 0.0, "convergence_s": 0.0, "outage_per_day_s": 1.0}
    rows[0] |= {"worst_outage_p99_s": 1.0, "bootstrap_per_hour": 1.0}
    plan = {"candidates": rows, "recommended": rows[0], "why": "cheapest", "knobs": []}
    plan |= {"assignor": "task:sticky", "assignor_why": "no warmups", "without_warmups": None}
    monkeypatch.setattr(
        plan_standbys, "_evaluate_standby_candidates", lambda *a: ran.append("spark")
    )
    monkeypatch.setattr(
        plan_standbys, "_standby_plan", lambda *a: (plan | {"target_reached": True}, rows[0])
    )
    return ran


def test_plan_standbys_refuses_an_unwritable_out_before_spark(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ran = _fake_plan(monkeypatch)
    (tmp_path / "plan.json").mkdir()
    code, out = invoke("plan-standbys", str(ORDERS), "--out", str(tmp_path))
    assert code == 1 and ran == []
    assert out == (
        f"Error: --out {tmp_path}: {tmp_path / 'plan.json'} is a folder, where a file goes; "
        "remove it or give another --out\n"
    )
    assert not (tmp_path / "plan.csv").exists()
    (tmp_path / "file").write_text("")
    code, out = invoke("plan-standbys", str(ORDERS), "--out", str(tmp_path / "file" / "sub"))
    assert code == 1 and ran == [] and f"{tmp_path / 'file'} is not a folder" in out


def test_simulate_refuses_an_out_it_cannot_write_before_spark(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A review found ``simulate --out FILE/x`` failing only after Spark started (a Hadoop
    ParentNotDirectoryException 18 s in)."""
    pytest.importorskip("pyspark")
    from streamassign.pipeline import spark as sp

    def no_spark(*a: Any, **k: Any) -> Any:
        raise AssertionError("a SparkSession was requested")

    monkeypatch.setattr(sp, "spark_session", no_spark)
    monkeypatch.setattr(sp, "start_session", no_spark)
    (tmp_path / "file").write_text("")
    under_a_file = tmp_path / "file" / "x"
    code, out = invoke("simulate", str(ORDERS), "--scenarios", "1", "--out", str(under_a_file))
    assert (code, out) == (
        1,
        f"Error: --out {under_a_file}: {tmp_path / 'file'} exists and is not a folder\n",
    )


def _valid_run(run: Path) -> None:
    """A run ``report`` accepts before Spark starts (a manifest and a Parquet file)."""
    (run / "manifest").mkdir(parents=True)
    (run / "manifest" / "part-00000.json").write_text('{"rows": 31}')
    (run / "rebalances" / "assignor=x").mkdir(parents=True)
    (run / "rebalances" / "assignor=x" / "part-0.parquet").write_bytes(b"")


@pytest.mark.parametrize("command", ["plan-standbys", "simulate", "report"])
@pytest.mark.parametrize("below", ["", "sub"])
def test_a_dangling_symlink_in_out_is_refused_before_spark(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, command: str, below: str
) -> None:
    """A review found ``--out LINK`` (its target deleted, or on a volume not mounted) passing
    the early check: plan-standbys then failed after the Spark work, simulate and report
    created the link's target. Following it could write under an empty mount point."""
    pytest.importorskip("pyspark")
    pytest.importorskip("plotly")
    from streamassign.pipeline import spark as sp

    ran = _fake_plan(monkeypatch)

    def no_spark(*a: Any, **k: Any) -> Any:
        raise AssertionError("a SparkSession was requested")

    monkeypatch.setattr(sp, "spark_session", no_spark)
    monkeypatch.setattr(sp, "start_session", no_spark)
    replace_in_cli(monkeypatch, "_session", no_spark)
    target = tmp_path / "unmounted" / "runs"
    link = tmp_path / "link"
    link.symlink_to(target)
    out_dir = link / below if below else link
    if command == "report":
        _valid_run(tmp_path / "run")
        args = ["report", str(tmp_path / "run"), "--out", str(out_dir)]
    else:
        args = [command, str(ORDERS), "--scenarios", "1", "--out", str(out_dir)]
    code, out = invoke(*args)
    assert (code, out) == (
        1,
        f"Error: --out {out_dir}: {link} is a symbolic link to {target}, which does not exist "
        "(deleted, or on a volume not mounted?); create it or give another --out\n",
    )
    assert ran == [] and not (tmp_path / "unmounted").exists()


@pytest.mark.parametrize(
    "args",
    [
        ("simulate", str(ORDERS), "--out", "loop1"),
        ("simulate", str(ORDERS), "--out", "loop1/x"),
        ("simulate", str(ORDERS), "--out", "file:{tmp}/loop1"),
        ("report", "run", "--out", "loop1"),
        ("report", "run", "--out", "loop1/x"),
        ("report", "loop1"),
        ("plan-standbys", str(ORDERS), "--out", "loop1"),
    ],
)
def test_a_symlink_loop_as_out_or_run_dir_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args: tuple[str, ...]
) -> None:
    """A review found ``--out LOOP`` (two links to each other) and ``report LOOP`` ending in
    a RuntimeError traceback from ``Path.resolve``."""
    pytest.importorskip("pyspark")
    pytest.importorskip("plotly")
    ran = _fake_plan(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "loop1").symlink_to("loop2")
    (tmp_path / "loop2").symlink_to("loop1")
    _valid_run(tmp_path / "run")
    args = tuple(a.format(tmp=tmp_path) for a in args)
    code, out = invoke(*args)
    link = tmp_path / "loop1" if args[-1].startswith("file:") else Path("loop1")
    given = args[-1] if args[0] == "report" and len(args) == 2 else f"--out {args[-1]}"
    assert (code, out) == (
        1,
        f"Error: {given}: {link} is a symbolic link to loop2 that leads back to itself (a loop "
        "of links); fix the links or give another path\n",
    )
    assert ran == []


def test_simulate_refuses_a_dangling_default_run_folder_link(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without --out the run goes to ./streamassign-runs/NAME: a link there to an unmounted
    volume was resolved first and then passed as a missing folder."""
    pytest.importorskip("pyspark")
    from streamassign.pipeline import spark as sp

    def no_spark(*a: Any, **k: Any) -> Any:
        raise AssertionError("a SparkSession was requested")

    monkeypatch.setattr(sp, "spark_session", no_spark)
    monkeypatch.setattr(sp, "start_session", no_spark)
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "unmounted" / "mnt"
    Path("streamassign-runs").symlink_to(target)
    code, out = invoke("simulate", str(ORDERS), "--scenarios", "1")
    assert (code, out) == (
        1,
        "Error: streamassign-runs/orders-enricher (the default --out): streamassign-runs is a "
        f"symbolic link to {target}, which does not exist (deleted, or on a volume not "
        "mounted?); "
        "create it or give another --out\n",
    )
    assert not (tmp_path / "unmounted").exists()


def test_a_link_that_cannot_be_followed_for_permission_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``Path.exists`` re-raises EACCES (a link into a folder the user cannot search); the
    check said nothing useful then, a traceback. Root ignores permission bits, so the refusal
    is simulated."""
    import errno
    import os

    import click

    from streamassign.cli import run_folders

    link = tmp_path / "link"
    link.symlink_to(tmp_path / "locked" / "runs")
    real_stat = os.stat

    def stat(path: Any, *a: Any, **k: Any) -> Any:
        if Path(path) == link and k.get("follow_symlinks", True):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_stat(path, *a, **k)

    monkeypatch.setattr(os, "stat", stat)
    with pytest.raises(click.ClickException) as caught:
        run_folders._refuse_dangling_link(link / "x", "--out x")
    assert caught.value.message == f"--out x: cannot follow {link}: Permission denied"


def test_a_symlink_in_out_to_an_existing_folder_is_followed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _fake_plan(monkeypatch)
    (tmp_path / "shared").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "shared")
    code, out = invoke("plan-standbys", str(ORDERS), "--out", str(tmp_path / "link" / "plans"))
    assert code == 0, out
    assert (tmp_path / "shared" / "plans" / "plan.json").is_file()


def test_plan_standbys_prints_the_plan_before_writing_it_atomically(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from streamassign.cli import plan_standbys

    _fake_plan(monkeypatch)
    out_dir = tmp_path / "new" / "plans"
    code, out = invoke("plan-standbys", str(ORDERS), "--out", str(out_dir))
    assert code == 0, out
    assert f"written: {out_dir / 'plan.csv'}" in out
    assert json.loads((out_dir / "plan.json").read_text())["why"] == "cheapest"
    csv_before = (out_dir / "plan.csv").read_text()
    assert csv_before.startswith("standbys,warmups,availability")

    json_before = (out_dir / "plan.json").read_text()
    real_stage = plan_standbys._stage_file

    def full_disk(target: Path, data: bytes) -> str:
        if target.name == "plan.json":
            raise OSError(28, "No space left on device")
        return real_stage(target, data)

    monkeypatch.setattr(plan_standbys, "_stage_file", full_disk)
    result = cli_runner().invoke(main, ["plan-standbys", str(ORDERS), "--out", str(out_dir)])
    assert result.exit_code == 1
    assert "recommended: cheapest" in result.stdout  # printed first: nothing the run found lost
    assert result.stderr == (
        f"Error: cannot write the plan to {out_dir}: No space left on device (its files left "
        "as they were); the plan is printed above\n"
    )
    assert sorted(p.name for p in out_dir.iterdir()) == ["plan.csv", "plan.json"]  # no temp
    # Both old: never a new csv beside an old json.
    assert (out_dir / "plan.csv").read_text() == csv_before
    assert (out_dir / "plan.json").read_text() == json_before


TINY = ("--scenarios", "1", "--steps", "2", "--assignors", "task:sticky")


def test_a_failed_or_refused_run_keeps_the_old_one(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamassign.pipeline import spark as sp

    run = tmp_path / "run"
    code, out = invoke("simulate", str(ORDERS), *TINY, "--out", str(run))
    assert code == 0, out
    assert f"next: streamassign report {run}" in out
    manifest = (run / "manifest" / "part-00000.json").read_text()
    old_id = json.loads(manifest)["run_id"]

    # The same simulation by the same code: kept, nothing simulated, no error (a set-up rerun).
    code, out = invoke("simulate", str(ORDERS), *TINY, "--out", str(run))
    assert code == 0, out
    assert f"{run} already holds this simulation, run {old_id} of 20" in out
    assert f"next: streamassign report {run}" in out
    # Another seed: refused, naming it.
    code, out = invoke("simulate", str(ORDERS), *TINY, "--seed", "7", "--out", str(run))
    assert code == 1
    assert (
        f"already holds a complete run ({old_id}) of another simulation (other --seed) without "
        f"a report (streamassign report {run} writes it); pass --overwrite"
    ) in out
    assert (run / "manifest" / "part-00000.json").read_text() == manifest

    def missing_module(*args: Any) -> Any:  # a task failing on the executors, as without faust
        raise ModuleNotFoundError("No module named 'faust'")

    monkeypatch.setattr(sp, "_simulate_partition", missing_module)
    code, out = invoke("simulate", str(ORDERS), *TINY, "--out", str(run), "--overwrite")
    assert code != 0
    assert (
        f"Error: simulating failed: ModuleNotFoundError: No module named 'faust'; the run in "
        f"{run} kept"
    ) in out
    assert "Traceback" not in out
    assert (run / "manifest" / "part-00000.json").read_text() == manifest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    monkeypatch.undo()

    code, out = invoke("simulate", str(ORDERS), *TINY, "--out", str(run), "--overwrite")
    assert code == 0, out
    assert json.loads((run / "manifest" / "part-00000.json").read_text())["run_id"] != old_id
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_ctrl_c_exits_130_in_one_line(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamassign.cli import simulate

    def interrupted(*args: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(simulate, "_write_run", interrupted)
    result = CliRunner().invoke(main, ["simulate", str(ORDERS), *TINY, "--out", str(tmp_path)])
    assert result.exit_code == 130
    assert (
        result.output.splitlines()[-1] == f"interrupted while simulating; {tmp_path} left as it was"
    )


def test_overwrite_never_replaces_a_folder_that_is_not_a_run(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("precious")
    code, out = invoke("simulate", str(ORDERS), *TINY, "--out", str(tmp_path), "--overwrite")
    assert code != 0 and "not replacing it, even with --overwrite" in out
    assert (tmp_path / "mine.txt").read_text() == "precious"


def test_report_refuses_an_out_folder_that_is_not_a_report_before_spark(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("pyspark")
    pytest.importorskip("plotly")

    run = tmp_path / "run"
    _valid_run(run)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("precious")

    def no_spark(*a: Any) -> Any:
        raise AssertionError("Spark was started")

    replace_in_cli(monkeypatch, "_session", no_spark)
    code, out = invoke("report", str(run), "--out", str(tmp_path / "mine"))
    assert code == 1
    assert out == (
        f"Error: {tmp_path / 'mine'} exists and is no report (no report.html in it, and no "
        "report-id.txt holding a report's id): not replacing it; give an empty or new folder as "
        "--out\n"
    )


def test_report_on_an_incomplete_or_missing_run_says_so_in_one_line(tmp_path: Path) -> None:
    code, out = invoke("report", str(tmp_path / "nowhere"))
    assert code != 0 and "no such run directory" in out
    (tmp_path / "rebalances").mkdir()
    (tmp_path / "rebalances" / "part-0.parquet").write_bytes(b"")
    code, out = invoke("report", str(tmp_path))
    assert code != 0 and "not a complete run (has rows but no manifest" in out
    assert len(out.strip().splitlines()) == 1


def test_report_refuses_a_damaged_run_and_keeps_the_earlier_report(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A review found a run whose Parquet files were deleted reported as "empty"."""
    pytest.importorskip("pyspark")
    pytest.importorskip("plotly")

    def no_spark(*a: Any) -> Any:
        raise AssertionError("Spark was started")

    replace_in_cli(monkeypatch, "_session", no_spark)
    run = tmp_path / "run"
    _valid_run(run)
    (run / "report").mkdir()
    (run / "report" / "report.html").write_text("earlier")
    (run / "rebalances" / "assignor=x" / "part-0.parquet").unlink()
    code, out = invoke("report", str(run))
    # Its manifest records no code fingerprint: older code's run, whose report this code's
    # --overwrite would delete for good.
    assert (code, out) == (
        1,
        f"Error: {run}: damaged run: rebalances/ holds no Parquet files, but the manifest says "
        "31 rows were written (deleted or moved?); simulate it again with the code that wrote "
        "it (other code), or with this code and another --out (this code's --overwrite would "
        "delete that code's run and report)\n",
    )
    assert (run / "report" / "report.html").read_text() == "earlier"


def test_bad_input_never_imports_spark(tmp_path: Path) -> None:
    """In a fresh interpreter: the error comes out and pyspark was never even imported."""
    script = (
        "import sys\n"
        "from streamassign.cli import main\n"
        "try:\n"
        f"    main(['simulate', {str(ORDERS)!r}, '--param', 'scale_in_per_hour=-1'])\n"
        "except SystemExit as exit:\n"
        "    print('exit', exit.code)\n"
        "print('pyspark' in sys.modules, 'plotly' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert "scale_in_per_hour must be a finite number >= 0" in done.stderr
    assert done.stdout.splitlines() == ["exit 1", "False False"]


def test_submit_entry_point_runs_the_cli_as_a_script() -> None:
    path = subprocess.run(
        [sys.executable, str(SUBMIT), "--path"], capture_output=True, text=True, check=True
    )
    assert Path(path.stdout.strip()) == SUBMIT
    bad = subprocess.run(
        [sys.executable, str(SUBMIT), "simulate", str(ORDERS), "--assignors", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 1 and "unknown assignor 'nope'" in bad.stderr


def test_importing_the_pipeline_imports_neither_spark_nor_plotly() -> None:
    script = (
        "import sys, streamassign.pipeline, streamassign.pipeline.spark, "
        "streamassign.pipeline.report, streamassign.pipeline.standbys\n"
        "print('pyspark' in sys.modules, 'plotly' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "False False"


def test_spark_failures_are_summed_up_in_one_line() -> None:
    from streamassign.cli.failures import _spark_failure

    python = (
        "An error occurred while calling o76.parquet.\n: org.apache.spark.SparkException: Job "
        "aborted\nTraceback (most recent call last):\n  File x\nModuleNotFoundError: No module "
        "named 'attrs'\n\tat org.apache.spark.api.python.BasePythonRunner"
    )
    assert _spark_failure(RuntimeError(python)) == "ModuleNotFoundError: No module named 'attrs'"
    java = (
        "An error occurred while calling o1.x.\n: java.lang.OutOfMemoryError: Java heap space\n"
        "\tat org.apache.spark.Foo"
    )
    assert _spark_failure(RuntimeError(java)) == "OutOfMemoryError: Java heap space"
    assert _spark_failure(RuntimeError("plain")) == "plain"


def _a_complete_run(folder: Path) -> None:
    (folder / "manifest").mkdir(parents=True)
    (folder / "manifest" / "part-00000.json").write_text('{"run_id": "earlier", "rows": 1}')


def _printed_next(
    monkeypatch: pytest.MonkeyPatch,
    args: Sequence[str],
    best: tuple[int, int] = (2, 0),
    sticky: int | None = None,
    printed: list[str] | None = None,
) -> tuple[list[str], str]:
    """The ``next:`` line plan-standbys prints for ``args`` under a stand-in plan recommending
    ``best`` (standbys, warmups; ``sticky``: the standbys of the plan without warmups), parsed
    back as a shell would (shlex), and what it says it compares; its whole output appended to
    ``printed``."""
    printed = [] if printed is None else printed
    from streamassign.cli import plan_standbys

    pytest.importorskip("pyspark")
    row = {"standbys": best[0], "warmups": best[1], "availability": 0.999, "standby_load": 1.0}
    row |= {"warmup_load": 0.0, "convergence_s": 0.0, "outage_per_day_s": 1.0}
    row |= {"worst_outage_p99_s": 1.0, "bootstrap_per_hour": 1.0}
    plain = None if sticky is None else row | {"standbys": sticky, "warmups": 0}
    plan = {"candidates": [row], "recommended": row, "why": "cheapest", "knobs": []}
    plan |= {"assignor": "task:ha", "assignor_why": "-", "without_warmups": plain}
    monkeypatch.setattr(plan_standbys, "_evaluate_standby_candidates", lambda *a: None)
    monkeypatch.setattr(
        plan_standbys, "_standby_plan", lambda *a: (plan | {"target_reached": True}, row)
    )
    code, out = invoke("plan-standbys", str(ORDERS), *args)
    assert code == 0, out
    printed.append(out)
    line = next(line for line in out.splitlines() if line.startswith("next: "))
    command, compares = line.removeprefix("next: ").rsplit("  (", 1)
    return shlex.split(command), compares.removesuffix(")")


def _stop_where_spark_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """simulate runs up to where its Spark session would start, and stops there."""

    @contextlib.contextmanager
    def no_spark(master: str | None, ship: bool | None = False) -> Iterator[Any]:
        raise click.ClickException("stopped where Spark starts")
        yield

    replace_in_cli(monkeypatch, "_session", no_spark)


def _a_run_of(words: Sequence[str], folder: Path, **changed: Any) -> None:
    """A complete run in ``folder`` whose manifest is what simulate ``words`` records, with
    ``changed`` keys (of the manifest, or of its model) set; None: left out, as by a run written
    before simulate recorded it."""
    from streamassign.cli.simulate import _manifest, _simulation_job, simulate

    with simulate.make_context("simulate", list(words[2:])) as ctx:
        job, _ = _simulation_job(ctx.params)
        manifest = _manifest(ctx.params["topology_file"], job, [], "local[*]")
    for key, value in changed.items():
        where = manifest["model"] if key in manifest["model"] else manifest
        if value is None:
            del where[key]
        else:
            where[key] = value
    (folder / "manifest").mkdir(parents=True)
    (folder / "manifest" / "part-00000.json").write_text(json.dumps(manifest | {"rows": 1}))
    for name in manifest["assignors"]:  # a file in each assignor's folder: not damaged
        rows = folder / "rebalances" / f"assignor={name.replace(':', '%3A')}"
        rows.mkdir(parents=True)
        (rows / "part-00000.parquet").write_bytes(b"PAR1")
        (rows / ".part-00000.parquet.crc").write_bytes(hadoop_checksums(b"PAR1"))


def _damage(folder: Path) -> None:
    """Change the bytes of a Parquet file of ``_a_run_of``'s run (its checksum tells)."""
    next((folder / "rebalances").glob("*/part-00000.parquet")).write_bytes(b"PAR2")


def test_plan_standbys_next_command_runs_as_printed_with_the_users_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``next:`` line of plan-standbys, as printed, simulates the plan's fleet (the user's
    --param, --model, -p, --restore-rate...) and task:ha with the plan's warmups and probing
    interval, in a folder of its own: it named only the topology and the standbys, so after
    README command 1 (a run in streamassign-runs/NAME) it was refused; it simulated the default
    fleet; it dropped the warmups and probing interval (simulate had no such options); it
    wrote --restore-rate 1234567 as 1.23457e+06, another rate."""
    from streamassign.cli.simulate import simulate

    monkeypatch.chdir(tmp_path)
    _a_complete_run(tmp_path / "streamassign-runs" / "orders-enricher")  # README command 1's
    model = tmp_path / "my models" / "it's.toml"
    model.parent.mkdir()
    model.write_text("crash_per_client_hour = 0.5\n")
    given = ["--param", "min_initial_clients=8", "--param", "max_initial_clients=8"]
    given += ["--model", str(model), "--restore-rate", "1234567", "-p", "returns=4", "--seed", "4"]
    given += ["--scenarios", "3", "--steps", "5", "--detection", "30"]
    given += ["--probing-interval", "60.25", "--warmups", "0,4"]

    words, compares = _printed_next(monkeypatch, given, best=(2, 4))
    assert words[:2] == ["streamassign", "simulate"]
    params = simulate.make_context("simulate", words[2:]).params
    assert params["params"] == ("min_initial_clients=8", "max_initial_clients=8")
    assert params["model_file"] == model and params["restore_rate"] == 1_234_567.0
    assert params["partitions"] == ("returns=4",) and params["seed"] == 4
    assert (params["scenarios"], params["steps"], params["standbys"]) == (3, 5, 2)
    assert (params["warmups"], params["probing_interval"]) == (4, 60.25)
    assert params["assignor_names"] == ("task:sticky,task:ha",) and params["with_report"]
    assert params["out"] == "streamassign-runs/orders-enricher-standbys2"
    assert not params["overwrite"]
    assert compares == (
        "the rebalances under this plan: task:ha with 4 warmups, beside task:sticky at the same "
        "2 standbys"
    )

    # The command itself, as printed, up to where Spark would start: not refused.
    _stop_where_spark_starts(monkeypatch)
    code, out = invoke(*words[1:])
    assert code == 1 and "simulating 3 scenarios of orders-enricher" in out, out
    assert "Error: stopped where Spark starts" in out


def test_plan_standbys_next_command_replaces_only_a_run_of_the_same_simulation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its --overwrite replaced whatever run was in NAME-standbysR: a review lost a run of
    another failure model (crash_per_client_hour 0.2) to the next line of a plan at 1. Only a
    damaged run of the same settings is replaced; one of this simulation by this code is kept
    (simulate writes its report); past any other (one by other code too: the "before" of a
    code change), the next free -2, -3."""
    from streamassign.pipeline.runs import CODE_FINGERPRINT

    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "streamassign-runs"
    folder = runs / "orders-enricher-standbys2"
    given = ["--scenarios", "3", "--steps", "5", "--param", "crash_per_client_hour=1"]
    words, _ = _printed_next(monkeypatch, given)
    assert words[-2:] == ["streamassign-runs/orders-enricher-standbys2", "--report"]
    redo = [*words[:-1], "--overwrite", "--report"]
    # This simulation by this code: kept, no --overwrite (which would redo minutes of Spark
    # for the same rows); the command as printed writes its missing report.
    _a_run_of(words, folder)
    assert _printed_next(monkeypatch, given)[0] == words
    _stop_where_spark_starts(monkeypatch)
    code, out = invoke(*words[1:])
    assert code == 1 and "Error: stopped where Spark starts" in out, out
    assert f"{folder.resolve()} already holds this simulation, run " in out
    # The same file named from elsewhere: its content is the same, so is the simulation.
    shutil.rmtree(folder)
    _a_run_of(words, folder, topology_file="elsewhere/orders-join.toml")
    assert _printed_next(monkeypatch, given)[0] == words
    # The same settings by other code (another fingerprint; none recorded: older code; another
    # aiokafka): its rows may differ, so it is never kept, nor deleted unsaid by a printed
    # --overwrite (it is what a before-and-after comparison needs): simulated beside it.
    beside = [*words[:-2], "streamassign-runs/orders-enricher-standbys2-2", "--report"]
    for other_code in (
        {CODE_FINGERPRINT: "0" * 64},
        {CODE_FINGERPRINT: None},
        {"libraries": {"pyspark": "3.0.0"}},
    ):
        shutil.rmtree(folder)
        _a_run_of(words, folder, **other_code)
        assert _printed_next(monkeypatch, given)[0] == beside, other_code
    # A damaged run of this simulation by this code (bytes changed) is redone where it is.
    shutil.rmtree(folder)
    _a_run_of(words, folder)
    _damage(folder)
    assert _printed_next(monkeypatch, given)[0] == redo
    code, out = invoke(*redo[1:])
    assert code == 1 and "Error: stopped where Spark starts" in out, out

    # Another model, rate, seed; another topology file of the same name; the same file as it
    # was before an edit (a store added, same name and partition counts), or a run that did
    # not record its content: passed by.
    for changed in (
        {"crash_per_client_hour": 0.2},
        {"replica_restore_per_s": 30_000.0},
        {"seed": 7},
        {"probing_interval_s": 60.0},
        {"topology_sha256": hashlib.sha256(b"an earlier orders-join.toml").hexdigest()},
        {"topology_sha256": None},
    ):
        shutil.rmtree(folder)
        _a_run_of(words, folder, **changed)
        words_now, _ = _printed_next(monkeypatch, given)
        assert words_now[-2:] == ["streamassign-runs/orders-enricher-standbys2-2", "--report"]

    # A run written before simulate recorded the rate, warmups and probing interval recorded
    # no topology content either: passed by, whatever it was simulated at.
    for unrecorded in ("replica_restore_per_s", "max_warmup_replicas", "probing_interval_s"):
        shutil.rmtree(folder)
        _a_run_of(words, folder, **{unrecorded: None})
        words_now, _ = _printed_next(monkeypatch, given)
        assert words_now[-2:] == ["streamassign-runs/orders-enricher-standbys2-2", "--report"]

    shutil.rmtree(folder)
    _a_run_of(words, folder)
    # This simulation by this code with its report: nothing to simulate, the page to open.
    (folder / "report").mkdir()
    (folder / "report" / "report.html").write_text("<html>")
    printed: list[str] = []
    opened, compares = _printed_next(monkeypatch, given, printed=printed)
    page = folder / "report" / "report.html"
    assert opened == ["open", page.resolve().as_uri(), "in", "a", "browser"]
    assert compares.startswith("already simulated on 20")
    assert compares.endswith(
        " UTC by this code: the rebalances under this plan: task:sticky at 2 standbys, no warmups"
    )
    assert "to simulate again" not in printed[0]
    # The line's folder is the command's own, not found by searching its words (an option's
    # value spelled --out was taken for it: here no page, so no open line).
    odd, _ = _printed_next(monkeypatch, [*given, "--master", "--out"])
    assert odd[:2] == ["open", page.resolve().as_uri()]
    # The same page from a run of other code: its numbers may be stale; simulated beside it.
    manifest = json.loads((folder / "manifest" / "part-00000.json").read_text())
    fake = manifest | {CODE_FINGERPRINT: "0" * 64}
    (folder / "manifest" / "part-00000.json").write_text(json.dumps(fake))
    assert _printed_next(monkeypatch, given) == (beside, compares.split(": ", 1)[1])
    (folder / "manifest" / "part-00000.json").write_text(json.dumps(manifest))

    # A damaged run beside its page (bytes changed; its rows deleted: report refuses it):
    # simulate again.
    _damage(folder)
    assert _printed_next(monkeypatch, given) == (redo, compares.split(": ", 1)[1])
    shutil.rmtree(folder / "rebalances")
    assert _printed_next(monkeypatch, given) == (redo, compares.split(": ", 1)[1])

    # A damaged run beside something else (an earlier plan's --out, notes): its --overwrite
    # would delete them with the run; passed by. A kept run stays as it is.
    for foreign in ("plans/plan.csv", "notes.txt"):
        shutil.rmtree(folder)
        _a_run_of(words, folder)
        (folder / foreign).parent.mkdir(exist_ok=True)
        (folder / foreign).write_text("yesterday's")
        assert _printed_next(monkeypatch, given)[0] == words
        _damage(folder)
        words_now, _ = _printed_next(monkeypatch, given)
        assert words_now[-2:] == ["streamassign-runs/orders-enricher-standbys2-2", "--report"]
    # A file added among its rows (simulate keeps it once moved out; --overwrite would delete
    # it): passed by, damaged or not.
    shutil.rmtree(folder)
    _a_run_of(words, folder)
    added = next((folder / "rebalances").glob("*/part-00000.parquet")).with_suffix(".orig")
    added.write_text("mine")
    words_now, _ = _printed_next(monkeypatch, given)
    assert words_now[-2:] == ["streamassign-runs/orders-enricher-standbys2-2", "--report"]
    _damage(folder)
    assert _printed_next(monkeypatch, given)[0] == words_now
    # A report's leftovers of an interrupted render are the run's own.
    shutil.rmtree(folder)
    _a_run_of(words, folder)
    _damage(folder)
    (folder / ".report.partial-abc").mkdir()
    assert _printed_next(monkeypatch, given)[0] == redo

    # A folder that is no run (simulate never replaces one) is passed by.
    shutil.rmtree(folder)
    folder.mkdir()
    (folder / "notes.txt").write_text("x")
    words_now, _ = _printed_next(monkeypatch, given)
    assert words_now[-2:] == ["streamassign-runs/orders-enricher-standbys2-2", "--report"]


def test_plan_standbys_passes_by_a_run_of_other_code_copied_without_its_checksum_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of the plan's settings by older code lists its files' sizes but no digests;
    copied without its dot files (no .crc), it was taken for one nothing can check, thus
    damaged, and the line was its --overwrite: the "before" of a code change, deleted. It is
    passed by, as an intact run of other code is, and so is one listing no files at all."""
    from streamassign.pipeline.runs import CODE_FINGERPRINT, ROW_FILES, LocalFiles, row_files

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "streamassign-runs" / "orders-enricher-standbys2"
    given = ["--scenarios", "3", "--steps", "5", "--param", "crash_per_client_hour=1"]
    words, _ = _printed_next(monkeypatch, given)
    _a_run_of(words, folder, **{CODE_FINGERPRINT: "0" * 64})
    path = folder / "manifest" / "part-00000.json"
    manifest = json.loads(path.read_text())
    for sidecar in (folder / "rebalances").rglob(".*.crc"):
        sidecar.unlink()
    for older in (manifest | {ROW_FILES: row_files(LocalFiles(), str(folder))}, manifest):
        path.write_text(json.dumps(older))
        words_now, _ = _printed_next(monkeypatch, given)
        assert "--overwrite" not in words_now
        assert words_now[-2:] == ["streamassign-runs/orders-enricher-standbys2-2", "--report"]


@pytest.mark.parametrize("with_report", [False, True])
def test_plan_standbys_passes_by_a_damaged_run_of_other_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_report: bool
) -> None:
    """A damaged run of the plan's settings by other code, alone in its folder: its
    --overwrite would delete that code's run and report, which this code cannot write
    again. It is passed by, as simulate does not call it damaged either."""
    from streamassign.pipeline.runs import CODE_FINGERPRINT

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "streamassign-runs" / "orders-enricher-standbys2"
    given = ["--scenarios", "3", "--steps", "5", "--param", "crash_per_client_hour=1"]
    words, _ = _printed_next(monkeypatch, given)
    _a_run_of(words, folder, **{CODE_FINGERPRINT: "0" * 64})
    _damage(folder)
    if with_report:
        (folder / "report").mkdir()
        (folder / "report" / "report.html").write_text("<html>older code's report</html>")
    words_now, _ = _printed_next(monkeypatch, given)
    assert "--overwrite" not in words_now
    assert words_now[-2:] == ["streamassign-runs/orders-enricher-standbys2-2", "--report"]


def test_plan_standbys_next_command_never_runs_in_the_plans_own_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``--out streamassign-runs/NAME-standbysR`` the line named that folder (printed
    before plan.csv is written there): simulate then refused it, or, over a run of the same
    simulation, its --overwrite deleted the plan just written. The next folder is taken."""
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "streamassign-runs"
    given = ["--scenarios", "3", "--steps", "5"]
    words, _ = _printed_next(monkeypatch, [*given, "--out", "streamassign-runs/x"])
    # A damaged run of the same settings: one the command would replace (--overwrite).
    _a_run_of(words, runs / "orders-enricher-standbys2")
    _damage(runs / "orders-enricher-standbys2")
    for plan_out in ("orders-enricher-standbys2", "orders-enricher-standbys2/plans"):
        words, _ = _printed_next(monkeypatch, [*given, "--out", f"streamassign-runs/{plan_out}"])
        assert words[-2:] == ["streamassign-runs/orders-enricher-standbys2-2", "--report"]
        assert (runs / plan_out / "plan.csv").is_file()
    # Those plans, left in the run's folder, are passed by too (--overwrite deletes them);
    # the run alone is redone where it is.
    words, _ = _printed_next(monkeypatch, [*given, "--out", "streamassign-runs"])
    assert words[-2:] == ["streamassign-runs/orders-enricher-standbys2-2", "--report"]
    shutil.rmtree(runs / "orders-enricher-standbys2" / "plans")
    for name in ("plan.csv", "plan.json"):
        (runs / "orders-enricher-standbys2" / name).unlink()
    words, _ = _printed_next(monkeypatch, [*given, "--out", "streamassign-runs"])
    assert words[-3:-1] == ["streamassign-runs/orders-enricher-standbys2", "--overwrite"]


def test_plan_standbys_next_line_says_what_task_sticky_is_simulated_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With warmups, the next command simulates task:sticky at the warmup plan's standbys,
    beside task:ha: the line said "the rebalances under this plan" when the sticky plan (the
    ``assignor:`` line) had fewer."""
    monkeypatch.chdir(tmp_path)
    words, compares = _printed_next(monkeypatch, [], best=(2, 2), sticky=1)
    assert words[words.index("--standbys") + 1] == "2"
    assert compares == (
        "the rebalances under this plan: task:ha with 2 warmups, beside task:sticky at the same "
        "2 standbys, not at its own plan's 1"
    )
    # Without warmups the plan assumes task:sticky: task:ha ran beside it at simulate's 2
    # warmups under a label saying "under this plan", and its report advised the warmups.
    words, compares = _printed_next(monkeypatch, [], best=(1, 0))
    assert "--warmups" not in words
    assert words[words.index("--assignors") + 1] == "task:sticky"
    assert compares == "the rebalances under this plan: task:sticky at 1 standby, no warmups"


FAKE_SPARK = Path(__file__).with_name("fake_spark.py")


def _fake_spark_run(
    mode: str, *args: str, stderr: int = subprocess.PIPE, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``streamassign ARGS`` in a child process, Spark stood in for (``fake_spark.py``)."""
    import os

    return subprocess.run(
        [sys.executable, str(FAKE_SPARK), mode, *args],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


@pytest.mark.parametrize("target", [[], ["--target", "0.999"]])
def test_json_stdout_is_only_json_when_stderr_lands_in_it(target: list[str]) -> None:
    """An audit found ``spark-submit ... plan-standbys --json > out`` unparseable: Spark's
    PythonRunner merges the driver's stderr into its stdout, and progress came first. Simulated
    with ``2>&1`` into one pipe (what the PythonRunner gives the driver)."""
    pytest.importorskip("pyspark")
    args = ("plan-standbys", str(ORDERS), "--json", *target)
    merged = _fake_spark_run("quick", *args, stderr=subprocess.STDOUT)
    assert merged.returncode == (3 if target else 0), merged.stdout
    assert json.loads(merged.stdout)["recommended"]["standbys"] == 1
    # Apart, progress and the note still go to stderr: the stand-in runs the progress code.
    apart = _fake_spark_run("quick", *args)
    assert json.loads(apart.stdout)["recommended"]["standbys"] == 1
    assert "starting Spark" in apart.stderr and "evaluating standby candidates" in apart.stderr
    assert ("note: no candidate reaches --target 0.999" in apart.stderr) == bool(target)
    # Launched by spark-submit (its gateway's port set): quiet even when the test keeps them apart.
    submitted = _fake_spark_run("quick", *args, env={"PYSPARK_GATEWAY_PORT": "1"})
    assert json.loads(submitted.stdout)["recommended"]["standbys"] == 1
    assert submitted.stderr == ""


def test_report_refuses_a_run_missing_some_files_and_keeps_the_earlier_report(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An audit deleted one assignor's Parquet files: the report then said "Use
    faust:copartitioned" without a word on task:sticky, its run details still claiming every
    row. Also the run's manifest counts the rows in its files. (Some rows missing, not all of
    an assignor's: test_runs.py.) A new user's audit: a file with bytes overwritten ended in a
    cut-off Spark line with no remedy."""
    run = tmp_path / "run"
    two = ("--scenarios", "2", "--steps", "2", "--assignors", "task:sticky,consumer:range")
    code, out = invoke("simulate", str(ORDERS), *two, "--spark-tasks", "2", "--out", str(run))
    assert code == 0, out
    rows = json.loads((run / "manifest" / "part-00000.json").read_text())["rows"]
    assert rows == spark.read.parquet(str(run / "rebalances")).count() == 2 * 2 * 3
    (run / "report").mkdir()
    (run / "report" / "report.html").write_text("earlier")
    sticky = run / "rebalances" / "assignor=task%3Asticky"
    sticky.rename(tmp_path / "sticky")
    # The manifest lists the run's files: the first one missing is named before Spark starts.
    code, out = invoke("report", str(run))
    assert code == 1 and out.startswith(
        f"Error: {run}: damaged run: rebalances/assignor=task%3Asticky/part-"
    )
    assert out.endswith(
        " is missing (the manifest lists it); run streamassign simulate again with --overwrite\n"
    )
    _list_rows(run, recorded=False)  # as a remote run's (or older code's): the rows tell
    from streamassign.pipeline import spark as sp

    def by_step(*a: Any) -> Any:  # a review: refused only after aggregating all of it
        raise AssertionError("a damaged run aggregated past its row count")

    monkeypatch.setattr(sp, "_by_step", by_step)
    code, out = invoke("report", str(run))
    assert (code, out.splitlines()[-1]) == (
        1,
        f"Error: {run}: damaged run: no rows of task:sticky under rebalances/ (6 of its 12 rows "
        "read; files deleted or moved?); run streamassign simulate again with --overwrite",
    )
    assert (run / "report" / "report.html").read_text() == "earlier"
    assert sorted(p.name for p in run.iterdir()) == ["manifest", "rebalances", "report"]
    # A file whose bytes changed (200 overwritten, as by a failing disk): the same kind of
    # line, naming the file, not a Spark ChecksumException cut off mid-line.
    (tmp_path / "sticky").rename(sticky)
    part = sorted(sticky.glob("*.parquet"))[0]
    damaged = bytearray(part.read_bytes())
    damaged[100:300] = bytes(200)
    part.write_bytes(bytes(damaged))
    code, out = invoke("report", str(run))
    assert (code, out.splitlines()[-1]) == (
        1,
        f"Error: {run}: damaged run: rebalances/assignor=task%3Asticky/{part.name} cannot be "
        "read (its checksum does not match: its bytes changed since it was written); run "
        "streamassign simulate again with --overwrite",
    )
    assert (run / "report" / "report.html").read_text() == "earlier"


def _start_fake_spark(
    mode: str, *args: str, env: dict[str, str], ignore_sighup: bool = False
) -> subprocess.Popen[str]:
    import os
    import signal

    def nohup() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    return subprocess.Popen(
        [sys.executable, str(FAKE_SPARK), mode, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        preexec_fn=nohup if ignore_sighup else None,
    )


def _wait_for(condition: Any, what: str, timeout_s: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.05)


@pytest.mark.parametrize("mode", ["hang-start", "hang-job"])
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_sigterm_or_sighup_mid_run_ends_like_ctrl_c(
    tmp_path: Path, signame: str, mode: str
) -> None:
    """An audit's ``timeout -s TERM 30 streamassign simulate ...`` printed nothing and left a
    hidden ``.run.partial-<run id>`` folder for good: only Ctrl-C was handled. Sent while Spark
    starts and while the job writes rows."""
    pytest.importorskip("pyspark")
    import signal

    signum = signal.Signals[signame]
    run = tmp_path / "run"
    (run / "manifest").mkdir(parents=True)
    (run / "manifest" / "part-00000.json").write_text('{"rows": 31, "run_id": "earlier"}\n')
    args = ("simulate", str(ORDERS), *TINY, "--out", str(run), "--overwrite")
    child = _start_fake_spark(mode, *args, env={"FAKE_SPARK_STARTED": str(tmp_path / "started")})
    if mode == "hang-start":
        _wait_for(lambda: (tmp_path / "started").exists(), "session start")
    else:
        _wait_for(
            lambda: any(p.name.startswith(".run.partial-") for p in tmp_path.iterdir()), "rows"
        )
    child.send_signal(signum)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 128 + signum, err
    assert (
        err.splitlines()[-1] == f"interrupted by {signame} while simulating; the run in {run} kept"
    )
    assert "Traceback" not in err
    started = ["started"] if mode == "hang-start" else []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", *started]  # no partial left
    assert json.loads((run / "manifest" / "part-00000.json").read_text())["run_id"] == "earlier"


@pytest.mark.parametrize("when", ["aside", "delete"])
def test_sigterm_while_an_overwrite_is_published_says_the_new_run_is_in_place(
    tmp_path: Path, when: str
) -> None:
    """A review's SIGTERM just after the old run was moved aside said "the run in DIR kept":
    DIR was gone, the new run deleted, the old one left aside. One while the old run was
    deleted said the same of the new run in place, with half the old one left behind."""
    pytest.importorskip("pyspark")
    import signal

    run = tmp_path / "run"
    (run / "manifest").mkdir(parents=True)
    (run / "manifest" / "part-00000.json").write_text('{"rows": 31, "run_id": "earlier"}\n')
    args = ("simulate", str(ORDERS), *TINY, "--out", str(run), "--overwrite")
    done = _fake_spark_run(f"signal-{when}", *args)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    new_id = json.loads((run / "manifest" / "part-00000.json").read_text())["run_id"]
    assert new_id != "earlier"
    left = [] if when == "aside" else [f".run.replaced-{new_id}"]  # its deletion interrupted
    note = f"; the run it replaced is left in {tmp_path}/.run.replaced-{new_id}: delete it by hand"
    assert done.stderr.splitlines()[-1] == (
        f"interrupted by SIGTERM while simulating; run {new_id} is in {run}" + note * bool(left)
    )
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [*left, "run"]


def test_a_second_sigterm_while_publishing_ends_it_and_says_what_is_in_dir(
    tmp_path: Path,
) -> None:
    """A review: every signal after the first was dropped until publishing ended. A second
    one now ends it at once: the old run is put back, and the line says so, not that the new
    run is in DIR."""
    pytest.importorskip("pyspark")
    import signal

    run = tmp_path / "run"
    (run / "manifest").mkdir(parents=True)
    (run / "manifest" / "part-00000.json").write_text('{"rows": 31, "run_id": "earlier"}\n')
    args = ("simulate", str(ORDERS), *TINY, "--out", str(run), "--overwrite")
    done = _fake_spark_run("signal-twice", *args)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    (staging,) = tmp_path.glob(".run.partial-*")
    assert done.stderr.splitlines()[-1] == (
        f"interrupted by SIGTERM while simulating; the earlier run in {run} kept; the new run "
        f"is left in {staging}: delete it"
    )
    assert json.loads((run / "manifest" / "part-00000.json").read_text())["run_id"] == "earlier"


@pytest.mark.parametrize("after", ["aside", "move"])
def test_a_group_signal_while_publishing_remotely_says_where_each_run_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], after: str
) -> None:
    """A review: a SIGTERM to the process group while a remote run was published stopped
    Spark's JVM too, and the line said "the run in DIR kept" (the caller's tail): DIR was
    empty, the old run aside (``aside``), or DIR held the new run (``move``). The line now
    says what publish knows. (A stand-in for Hadoop's file system: no JVM.)"""
    import os
    import signal

    from streamassign.cli import failures, run_folders
    from streamassign.pipeline import runs

    run, staging = tmp_path / "run", tmp_path / ".run.partial-new"
    aside = tmp_path / ".run.replaced-new"
    for folder, run_id in ((run, "old"), (staging, "new")):
        runs.write_manifest(runs.LocalFiles(), str(folder), {"run_id": run_id, "rows": 1})

    class StoppedBySignal(runs.LocalFiles):
        stopped = False

        def exists(self, path: str) -> bool:
            if self.stopped:
                raise ConnectionRefusedError(111, "Connection refused")
            return super().exists(path)

        def rename(self, source: str, target: str) -> None:
            if self.stopped:
                raise ConnectionRefusedError(111, "Connection refused")
            super().rename(source, target)
            if target == str(aside if after == "aside" else run):
                os.kill(os.getpid(), signal.SIGTERM)
                self.stopped = True

    with (
        pytest.raises(SystemExit) as exited,
        failures._one_line_failures("simulating", f"the run in {run} kept"),
    ):
        run_folders._publish(StoppedBySignal(), str(staging), str(run), "new", "run")
    assert exited.value.code == 128 + signal.SIGTERM
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith(
        "interrupted by SIGTERM while simulating; could not look ([Errno 111] Connection "
        "refused); by the moves that ended: "
    )
    assert "kept" not in last
    if after == "aside":
        assert f"the earlier run is in {aside}: " in last and not run.exists()
    else:
        assert f"run new is in {run}; the run it replaced may be left in {aside}" in last


def test_a_group_sigterm_while_the_jvm_starts_reads_as_the_signal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A review's SIGTERM to the whole process group while the JVM started stopped the JVM
    too: pyspark's ``JAVA_GATEWAY_EXITED`` came out of the deferred start and the command said
    ``simulating failed: ...``, exit status 1, not ``interrupted by SIGTERM``, 143. (A stand-in
    for the start: no JVM.)"""
    pytest.importorskip("pyspark")
    import os
    import signal

    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql import SparkSession

    from streamassign.cli import failures, jobs
    from streamassign.pipeline import spark as sp

    def start_session(*args: Any) -> Any:
        os.kill(os.getpid(), signal.SIGTERM)  # the group's SIGTERM reaches Python, and the JVM
        raise PySparkRuntimeError(errorClass="JAVA_GATEWAY_EXITED", messageParameters={})

    monkeypatch.setattr(SparkSession, "getActiveSession", staticmethod(lambda: None))
    monkeypatch.setattr(sp, "start_session", start_session)
    with (
        pytest.raises(SystemExit) as exited,
        failures._one_line_failures("simulating", "DIR left as it was"),
        jobs._session(None),
    ):
        pytest.fail("the session started")
    assert exited.value.code == 128 + signal.SIGTERM
    last = capsys.readouterr().err.splitlines()[-1]
    assert last == "interrupted by SIGTERM while simulating; DIR left as it was"


def test_a_signal_while_the_report_is_moved_into_place_says_it_is_there(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A review's SIGTERM while ``report`` moved the new report into place waited until it
    was there, then said only ``interrupted by SIGTERM while writing the report``."""
    import os
    import signal

    from streamassign.cli import failures
    from streamassign.cli import report as report_cli
    from streamassign.pipeline import progress, report, runs
    from streamassign.pipeline import spark as sp

    def render_report(data: Any, staging: str) -> None:
        Path(staging).mkdir()
        (Path(staging) / "report.html").write_text("new")

    rename = runs.LocalFiles.rename

    def rename_then_signal(self: runs.LocalFiles, source: str, target: str) -> None:
        rename(self, source, target)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(progress, "run_tracked", lambda session, what, console, run: run())
    monkeypatch.setattr(sp, "aggregate", lambda *a: None)
    monkeypatch.setattr(report, "render_report", render_report)
    monkeypatch.setattr(runs.LocalFiles, "rename", rename_then_signal)
    out = tmp_path / "report"
    with pytest.raises(SystemExit) as exited, failures._one_line_failures("writing the report"):
        report_cli._render(SimpleNamespace(), str(tmp_path), out)
    assert exited.value.code == 128 + signal.SIGTERM
    assert (out / "report.html").read_text() == "new"
    last = capsys.readouterr().err.splitlines()[-1]
    assert last == f"interrupted by SIGTERM while writing the report; the report is in {out}"


def test_a_report_that_cannot_be_moved_into_place_is_one_line_and_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A failed rename (not a signal) while ``report`` replaced an earlier report left the new
    one's hidden folder behind and ended in a trace; now one line says where the earlier one is."""
    from streamassign.cli import report as report_cli
    from streamassign.pipeline import progress, report, runs
    from streamassign.pipeline import spark as sp

    def render_report(data: Any, staging: str) -> None:
        Path(staging).mkdir()
        (Path(staging) / "report.html").write_text("new")

    def refused(self: runs.LocalFiles, source: str, target: str) -> None:
        raise PermissionError(13, "Permission denied", source)

    out = tmp_path / "report"
    out.mkdir()
    (out / "report.html").write_text("earlier")
    monkeypatch.setattr(progress, "run_tracked", lambda session, what, console, run: run())
    monkeypatch.setattr(sp, "aggregate", lambda *a: None)
    monkeypatch.setattr(report, "render_report", render_report)
    monkeypatch.setattr(runs.LocalFiles, "rename", refused)
    with pytest.raises(click.ClickException) as raised:
        report_cli._render(SimpleNamespace(), str(tmp_path), out)
    assert raised.value.message == (
        f"publishing the report failed: [Errno 13] Permission denied: '{tmp_path}/report'; "
        f"the earlier report in {out} kept"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["report"]
    assert (out / "report.html").read_text() == "earlier"


@pytest.mark.parametrize("how", ["refused", "two signals"])
def test_a_report_of_the_same_run_is_told_from_the_earlier_one(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    how: str,
) -> None:
    """A review: two renders of one run are byte-identical, so ``report.html`` could not tell
    the earlier report from the new one: moving the earlier one aside refused, or two SIGTERMs
    right after it, said it was "in neither OUT nor ASIDE" while it was in OUT. Each render now
    writes its id (``report-id.txt``). And ``simulate --report`` still says the run is complete
    after the second signal (the line had dropped it)."""
    import os
    import re
    import signal

    from streamassign import cli
    from streamassign.cli import failures
    from streamassign.cli import report as report_cli
    from streamassign.pipeline import progress, report, runs
    from streamassign.pipeline import spark as sp

    def render_report(data: Any, staging: str) -> None:
        Path(staging).mkdir()
        (Path(staging) / "report.html").write_text("the same page")

    monkeypatch.setattr(progress, "run_tracked", lambda session, what, console, run: run())
    monkeypatch.setattr(sp, "aggregate", lambda *a: None)
    monkeypatch.setattr(report, "render_report", render_report)
    out = tmp_path / "report"
    report_cli._render(SimpleNamespace(), str(tmp_path), out)  # the earlier report
    earlier = (out / cli.REPORT_ID).read_text()
    rename = runs.LocalFiles.rename

    def aside_then_fault(self: runs.LocalFiles, source: str, target: str) -> None:
        if ".replaced-" in target and how == "refused":
            raise PermissionError(13, "Permission denied", target)
        rename(self, source, target)
        if ".replaced-" in target:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(runs.LocalFiles, "rename", aside_then_fault)
    complete = "run R is complete; next: streamassign report DIR"
    with (
        pytest.raises((SystemExit, click.ClickException)) as raised,
        failures._one_line_failures("writing the report", done=complete),
    ):
        report_cli._render(SimpleNamespace(), str(tmp_path), out)
    assert (out / cli.REPORT_ID).read_text() == earlier  # the earlier report, where it was
    if how == "refused":
        assert isinstance(raised.value, click.ClickException)
        assert raised.value.message.endswith(f"; the earlier report in {out} kept")
        assert [p.name for p in tmp_path.iterdir()] == ["report"]
        return
    staging = next(p for p in tmp_path.iterdir() if p.name.startswith(".report.partial-"))
    last = capsys.readouterr().err.splitlines()[-1]
    assert last == (
        f"interrupted by SIGTERM while writing the report; the earlier report in {out} kept; "
        f"the new report is left in {staging}: delete it; {complete}"
    )
    assert re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{6}\n", earlier)


def test_a_run_whose_old_run_cannot_be_deleted_says_where_it_is_left(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An audit: deleting the replaced run failing (a remote delete refused) ended simulate
    with "simulating failed: ...; the run in DIR kept", with the new run in DIR and the old one
    aside. Now the run is published, and a note says where the old one was left."""
    from streamassign.cli import failures, simulate
    from streamassign.pipeline import progress, runs
    from streamassign.pipeline import spark as sp

    def run_simulation(
        session: Any, job: Any, staging: str, manifest: Any, run_id: str, *a: Any
    ) -> int:
        runs.write_manifest(runs.LocalFiles(), staging, {"run_id": run_id, "rows": 5})
        return 5

    def refused(self: runs.LocalFiles, path: str) -> None:
        raise PermissionError(13, "Permission denied", path)

    run_dir = tmp_path / "run"
    _a_complete_run(run_dir)
    session = SimpleNamespace(
        sparkContext=SimpleNamespace(accumulator=lambda zero: SimpleNamespace(value=zero))
    )
    monkeypatch.setattr(progress, "run_tracked", lambda session, what, console, run, detail: run())
    monkeypatch.setattr(sp, "run_simulation", run_simulation)
    monkeypatch.setattr(runs.LocalFiles, "delete", refused)
    with failures._one_line_failures("simulating", f"the run in {run_dir} kept"):
        rows, _ = simulate._write_run(session, None, str(run_dir), {}, "new", overwrite=True)
    assert rows == 5
    assert (runs.read_manifest(runs.LocalFiles(), str(run_dir)) or {})["run_id"] == "new"
    aside = tmp_path / ".run.replaced-new"
    assert (runs.read_manifest(runs.LocalFiles(), str(aside)) or {})["run_id"] == "earlier"
    err = capsys.readouterr().err
    assert err == (
        f"note: the run it replaced is left in {aside} (deleting it failed: [Errno 13] "
        f"Permission denied: '{aside}'); delete it by hand\n"
    )


def _version(distribution: str = "streamassign") -> str:
    from importlib import metadata

    return metadata.version(distribution)


def test_a_rerun_is_refused_in_one_line_naming_the_report_or_how_to_write_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """README's command 1, run a second time over a run it would not keep: the refusal says
    why, where the report is (or how to write it, after a --report interrupted) and what to
    add to simulate again."""
    pytest.importorskip("pyspark")
    pytest.importorskip("plotly")

    def no_spark(*a: Any, **k: Any) -> Any:
        raise AssertionError("Spark was started")

    replace_in_cli(monkeypatch, "_session", no_spark)
    run = tmp_path / "run"
    (run / "manifest").mkdir(parents=True)
    (run / "manifest" / "part-00000.json").write_text('{"rows": 31, "run_id": "first"}\n')
    rows = run / "rebalances" / "assignor=task%3Asticky"
    rows.mkdir(parents=True)
    (rows / "part-00000.parquet").write_bytes(b"PAR1")
    args = ("simulate", str(ORDERS), "--report", "--out", str(run))
    code, out = invoke(*args)
    # A manifest of code that recorded neither its settings nor a fingerprint: other code.
    other = "written by other code (no fingerprint recorded)"
    assert (code, out) == (
        1,
        f"Error: {run} already holds a complete run (first) {other} without a report "
        f"(streamassign report {run} writes it); pass --overwrite to replace it once the new run "
        "is complete, or --out for another folder\n",
    )
    (run / "report").mkdir()
    (run / "report" / "report.html").write_text("the first run's")
    code, out = invoke(*args)
    assert code == 1 and out.startswith(
        f"Error: {run} already holds a complete run (first) {other} and its report, "
        f"{run / 'report' / 'report.html'}; pass --overwrite"
    )
    # Damaged, it is not "a complete run and its report" (report refuses it): a review.
    shutil.rmtree(run / "rebalances")
    code, out = invoke(*args)
    assert (code, out) == (
        1,
        f"Error: {run} holds a damaged run (first: rebalances/ is missing, but the manifest says "
        "31 rows were written (deleted or moved?)); pass --overwrite to replace it once the new "
        "run is complete, or --out for another folder\n",
    )


def _a_kept_run(monkeypatch: pytest.MonkeyPatch, run: Path, **changed: Any) -> list[str]:
    """A run in ``run`` of README's command 1 by this code (``changed``: as ``_a_run_of``), and
    the command (from ``simulate``); Spark never starts."""
    pytest.importorskip("pyspark")
    pytest.importorskip("plotly")

    def no_spark(*a: Any, **k: Any) -> Any:
        raise AssertionError("Spark was started")

    replace_in_cli(monkeypatch, "_session", no_spark)
    words = ["streamassign", "simulate", str(ORDERS), "--report", "--out", str(run)]
    _a_run_of(words, run, run_id="first", created="2026-11-29T04:51:02+00:00", **changed)
    return words[1:]


def test_a_rerun_of_the_same_simulation_by_the_same_code_keeps_its_run_and_exits_0(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """README's command 1 run a second time printed "Error: ... already holds a complete run"
    and exited 1, failing a set-up script that reruns it. A run of the very same simulation
    by the very same code (the same rows) is kept, said in one line with its date and report,
    exit status 0, Spark never started; another seed is still refused, naming it."""
    from streamassign.cli import kept_runs, standby_runs

    run = tmp_path / "run"
    command = _a_kept_run(monkeypatch, run)
    manifest = (run / "manifest" / "part-00000.json").read_text()
    # Every setting of the identity is compared, and named when it differs.
    # Every setting of the identity is compared, and named when it differs; the topology file
    # by its content, not its path as typed.
    recorded = json.loads(manifest)
    assert {k for k in kept_runs._SETTING_NAMES if k in recorded} == set(kept_runs._SETTING_NAMES)
    identity = set(standby_runs._identity_of(["streamassign", *command]) or {})
    assert set(kept_runs._SETTING_NAMES) == identity - {"topology_file"}
    page = run / "report" / "report.html"
    page.parent.mkdir()
    page.write_text("the first run's")
    code, out = invoke(*command)
    assert (code, out) == (
        0,
        f"{run} already holds this simulation, run first of 2026-11-29 04:51 UTC (same "
        "settings, same code): kept, nothing simulated (--overwrite simulates it again)\n"
        f"report: {page}\n"
        f"next: open {page.as_uri()} in a browser; runs and columns: docs/pipeline.md\n",
    )
    code, out = invoke(*command, "--seed", "7", "--param", "crash_per_client_hour=1")
    assert (code, out) == (
        1,
        f"Error: {run} already holds a complete run (first) of another simulation (other "
        f"--seed, churn model (--model, --param, --steps)) and its report, {page}; pass "
        "--overwrite to replace it once the new run is complete, or --out for another folder\n",
    )
    assert (run / "manifest" / "part-00000.json").read_text() == manifest
    assert page.read_text() == "the first run's"
    # The same topology file named from its own folder: the same simulation, kept.
    monkeypatch.chdir(ORDERS.parent)
    code, out = invoke(*[ORDERS.name if word == str(ORDERS) else word for word in command])
    assert code == 0 and ": kept, nothing simulated" in out, out


def test_a_damaged_run_is_never_kept_even_beside_its_report(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A run of the same simulation by the same code with one Parquet file changed or deleted
    was kept (exit 0) whenever its report existed: that page shows rows the run no longer
    holds. Its checksums tell (milliseconds, before Spark): refused in one line whose remedy
    is --overwrite, exit status 1, everything left as it was."""
    run = tmp_path / "run"
    command = _a_kept_run(monkeypatch, run)
    page = run / "report" / "report.html"
    page.parent.mkdir()
    page.write_text("the first run's")
    damaged = next((run / "rebalances").glob("*/part-00000.parquet"))
    shown = f"rebalances/{damaged.parent.name}/part-00000.parquet"
    damaged.write_bytes(b"PAR2")  # one byte flipped
    for words in (command, [*command[:2], *command[3:]]):  # with and without --report
        code, out = invoke(*words)
        assert (code, out) == (
            1,
            f"Error: {run}: damaged run: {shown} has bytes changed since it was written; it "
            "cannot be kept: pass --overwrite to simulate it again\n",
        ), words
    damaged.write_bytes(b"PAR1")
    (damaged.parent / "part-00001.parquet").write_bytes(b"PAR1")  # one of several: deleted
    (damaged.parent / ".part-00001.parquet.crc").write_bytes(hadoop_checksums(b"PAR1"))
    assert invoke(*command)[0] == 0
    (damaged.parent / "part-00001.parquet").unlink()
    code, out = invoke(*command)
    assert (code, out) == (
        1,
        f"Error: {run}: damaged run: {shown.replace('00000', '00001')} is missing (its checksum "
        "file remains); it cannot be kept: pass --overwrite to simulate it again\n",
    )
    assert page.read_text() == "the first run's"


def _list_rows(run: Path, recorded: bool = True) -> None:
    """Record in the manifest of ``run`` its Parquet files and sizes, as simulate writes them
    (``recorded`` False: leave them out, as older code did)."""
    from streamassign.pipeline.runs import ROW_FILES, ROW_SHA256, LocalFiles, row_digests, row_files

    path = run / "manifest" / "part-00000.json"
    manifest = json.loads(path.read_text())
    manifest.pop(ROW_FILES, None)
    manifest.pop(ROW_SHA256, None)
    listed = {ROW_FILES: row_files(LocalFiles(), str(run)), ROW_SHA256: row_digests(str(run))}
    path.write_text(json.dumps(manifest | (listed if recorded else {})))


def test_a_kept_run_is_checked_against_the_files_its_manifest_lists(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A Parquet file deleted together with its checksum file was kept beside the run's report;
    a local run without checksum files (a file system writing none) was refused as damaged.
    The names and sizes the manifest lists tell both apart; a run that lists none and has no
    checksum file is refused as one that cannot be checked, not as damaged."""
    run = tmp_path / "run"
    command = _a_kept_run(monkeypatch, run)
    (run / "report").mkdir()
    (run / "report" / "report.html").write_text("the first run's")
    folder = next((run / "rebalances").glob("*/part-00000.parquet")).parent
    (folder / "part-00001.parquet").write_bytes(b"PAR1")
    (folder / ".part-00001.parquet.crc").write_bytes(hadoop_checksums(b"PAR1"))
    _list_rows(run)
    assert invoke(*command)[0] == 0
    shown = f"rebalances/{folder.name}/part-00001.parquet"
    (folder / "part-00001.parquet").unlink()  # with its checksum file
    (folder / ".part-00001.parquet.crc").unlink()
    code, out = invoke(*command)
    assert (code, out) == (
        1,
        f"Error: {run}: damaged run: {shown} is missing (the manifest lists it); it cannot be "
        "kept: pass --overwrite to simulate it again\n",
    )
    (folder / "part-00001.parquet").write_bytes(b"PAR1")
    for sidecar in (run / "rebalances").rglob(".*.crc"):  # copied without its dot files
        sidecar.unlink()
    assert invoke(*command)[0] == 0
    _list_rows(run, recorded=False)
    code, out = invoke(*command)
    assert (code, out) == (
        1,
        f"Error: {run}: its rows cannot be checked: its manifest lists no files with their "
        "digests (a run written to a remote folder, or by older code) and no checksum file "
        "(.*.parquet.crc) is under rebalances/ (copied without its dot files, or written "
        "through a file system that writes none); it cannot be kept: pass --overwrite to "
        "simulate it again\n",
    )
    assert (run / "report" / "report.html").read_text() == "the first run's"


def test_a_kept_run_with_a_byte_changed_or_a_file_added_among_its_rows_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A run copied without its checksum files was kept with a byte changed (same size); one
    with a copy of a Parquet file added beside it (``.orig``) was kept, and report then refused
    it (31,775 rows read, 31,000 written). The manifest's digests tell the first; the second
    says to move the file out, which keeps the run (--overwrite would delete it with the run).
    A note beside the partition folders is not read by Spark: the run is kept."""
    run = tmp_path / "run"
    command = _a_kept_run(monkeypatch, run)
    folder = next((run / "rebalances").glob("*/part-00000.parquet")).parent
    page = run / "report" / "report.html"
    page.parent.mkdir()
    page.write_text("the first run's")
    _list_rows(run)
    for sidecar in (run / "rebalances").rglob(".*.crc"):  # copied without its dot files
        sidecar.unlink()
    rows = folder / "part-00000.parquet"
    data = rows.read_bytes()
    rows.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    code, out = invoke(*command)
    assert (code, out) == (
        1,
        f"Error: {run}: damaged run: rebalances/{folder.name}/part-00000.parquet has bytes "
        "changed since it was written; it cannot be kept: pass --overwrite to simulate it "
        "again\n",
    )
    rows.write_bytes(data)
    (run / "rebalances" / "notes.txt").write_text("mine")
    assert invoke(*command)[0] == 0
    (folder / "part-00000.parquet.orig").write_bytes(data)
    shown = f"rebalances/{folder.name}/part-00000.parquet"
    code, out = invoke(*command)
    assert (code, out) == (
        1,
        f"Error: {run}: {shown}.orig is not a file the run wrote (added from elsewhere?): Spark "
        "reads every file in rebalances/assignor=... as the run's rows; move that file out of "
        "the run's folder to keep the run, or pass --overwrite to simulate it again (deleting "
        "that file and rebalances/notes.txt with the run)\n",
    )
    # Every file added is named in the one refusal, and so is damage beside them: the user
    # hears of both before --overwrite deletes what was added (and the note beside them).
    (folder / "copy.parquet").write_bytes(data)
    rows.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    code, out = invoke(*command)
    assert (code, out) == (
        1,
        f"Error: {run}: damaged run: {shown} has bytes changed since it was written, and "
        f"rebalances/{folder.name}/copy.parquet, {shown}.orig are not files the run wrote "
        "(added from elsewhere?); it cannot be kept: pass --overwrite to simulate it again "
        "(deleting those files and rebalances/notes.txt with the run: move them out of the run's "
        "folder first to keep them)\n",
    )
    rows.write_bytes(data)
    code, out = invoke(*command)
    assert code == 1 and "; move those files out of the run's folder to keep the run, or" in out
    (folder / "part-00000.parquet.orig").rename(tmp_path / "moved.parquet")
    (folder / "copy.parquet").rename(tmp_path / "copy.parquet")
    assert invoke(*command)[0] == 0
    assert page.read_text() == "the first run's"


def test_report_refuses_a_run_whose_rows_are_not_those_its_manifest_lists_before_spark(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """report read a run copied without its checksum files, a byte changed, without a word
    (README command 1's run: the same report). Its manifest's digests tell, before Spark
    starts; so does a file added among its rows (report then refused it only after reading
    them, on their count)."""
    run = tmp_path / "run"
    _a_kept_run(monkeypatch, run)  # Spark never starts
    _list_rows(run)
    for sidecar in (run / "rebalances").rglob(".*.crc"):
        sidecar.unlink()
    rows = next((run / "rebalances").glob("*/part-00000.parquet"))
    data = rows.read_bytes()
    rows.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    shown = f"rebalances/{rows.parent.name}/part-00000.parquet"
    assert invoke("report", str(run)) == (
        1,
        f"Error: {run}: damaged run: {shown} has bytes changed since it was written; run "
        "streamassign simulate again with --overwrite\n",
    )
    (rows.parent / "copy.parquet").write_bytes(data)
    added = f"rebalances/{rows.parent.name}/copy.parquet is not a file the run wrote (added from "
    assert invoke("report", str(run)) == (
        1,
        f"Error: {run}: damaged run: {shown} has bytes changed since it was written, and {added}"
        "elsewhere?); run streamassign simulate again with --overwrite (deleting that file with "
        "the run: move it out of the run's folder first to keep it)\n",
    )
    rows.write_bytes(data)
    assert invoke("report", str(run)) == (
        1,
        f"Error: {run}: {added}elsewhere?): Spark reads every file in rebalances/assignor=... as "
        "the run's rows; move that file out of the run's folder to keep the run, or run "
        "streamassign simulate again with --overwrite (deleting that file with the run)\n",
    )


def test_a_kept_runs_report_folder_without_its_page_is_refused_before_spark_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--report over a kept run whose report/ holds other files but no report.html started
    Spark, then said to give another --out: simulate's --out is the run's folder, so that
    simulated it all again elsewhere. Refused before Spark, naming the remedies that keep it.
    Kept without --report, its next step is a report command that does not refuse the folder."""
    run = tmp_path / "run"
    command = _a_kept_run(monkeypatch, run)  # Spark never starts
    (run / "report").mkdir()
    (run / "report" / "by_event.csv").write_text("mine")
    code, out = invoke(*[arg for arg in command if arg != "--report"])
    assert code == 0, out
    assert out.endswith(f"\nnext: streamassign report {run} --out OTHER\n")
    code, out = invoke(*command)
    assert (code, out) == (
        1,
        f"Error: {run / 'report'} exists and is no report (no report.html in it, and no "
        "report-id.txt holding a report's id): not replacing it with the kept run's report; "
        f"move its files away, or write the report elsewhere: streamassign report {run} --out "
        "OTHER\n",
    )
    assert (run / "report" / "by_event.csv").read_text() == "mine"
    (run / "report" / "report-id.txt").write_text("build-42\n")  # another tool's: still mine
    assert invoke(*command) == (code, out)  # said true with the file there too


def test_a_report_folder_that_lost_only_its_page_is_rewritten_by_report_and_a_kept_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A kept run's report/ holding the report's own files and the id its render left, only
    report.html deleted, was refused ("move its files away") though nothing in it is anyone
    else's; so was it as report --out. The id tells an earlier report: it is written anew,
    the old files replaced, with --report and by report alike (Spark's part faked)."""
    from streamassign.pipeline import progress, report, spark

    run = tmp_path / "run"
    command = _a_kept_run(monkeypatch, run)
    folder = run / "report"
    folder.mkdir()
    (folder / "summary_by_event.csv").write_text("the earlier render's")
    (folder / "report-id.txt").write_text("20261129T045102Z-3f9a1c\n")

    @contextlib.contextmanager
    def session(*a: Any) -> Iterator[Any]:
        yield SimpleNamespace(conf=SimpleNamespace(set=lambda *a: None))

    def render(data: Any, out_dir: str | Path) -> Path:
        Path(out_dir).mkdir()
        (Path(out_dir) / "report.html").write_text(f"rendered from {data}")
        return Path(out_dir) / "report.html"

    replace_in_cli(monkeypatch, "_session", session)
    monkeypatch.setattr(spark, "aggregate", lambda session, run_dir: "the kept run")
    monkeypatch.setattr(progress, "run_tracked", lambda s, d, c, action: action())
    monkeypatch.setattr(report, "render_report", render)
    code, out = invoke(*command)
    assert code == 0, out
    assert sorted(p.name for p in folder.iterdir()) == ["report-id.txt", "report.html"]
    assert (folder / "report.html").read_text() == "rendered from the kept run"
    (folder / "report.html").unlink()
    code, out = invoke(*[arg for arg in command if arg != "--report"])
    assert (code, out.splitlines()[-1]) == (0, f"next: streamassign report {run}")
    monkeypatch.setattr("streamassign.cli.report._preflight", lambda master: None)
    code, out = invoke("report", str(run))
    assert code == 0, out
    assert (folder / "report.html").read_text() == "rendered from the kept run"


def test_a_rerun_over_a_run_of_other_code_is_refused_naming_its_fingerprint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A run whose manifest records the same settings was kept after a code change: its
    numbers, of the older code, were shown as the new code's. Another fingerprint is other
    code; so is none (a run written before manifests recorded one), another version of a
    library whose code wrote rows (aiokafka's assignors), or of streamassign; only what differs
    is named."""
    from streamassign.pipeline.runs import code_fingerprint

    ours, version = (code_fingerprint() or "")[:12], _version()
    libraries = {"pyspark": _version("pyspark"), "faust-streaming": _version("faust-streaming")}
    cases: list[tuple[dict[str, Any], str]] = [
        (
            {"code_sha256": "abc123" * 10 + "abcd"},
            f"(fingerprint abc123abc123…, this code's {ours}…)",
        ),
        ({"code_sha256": None}, "(no fingerprint recorded)"),
        ({"streamassign": "0.0.9"}, f"(streamassign 0.0.9, this is {version})"),
        (
            {"libraries": libraries | {"aiokafka": "0.11.0"}},
            f"(aiokafka 0.11.0, installed {_version('aiokafka')})",
        ),
        ({"libraries": libraries}, f"(aiokafka unrecorded, installed {_version('aiokafka')})"),
    ]
    for n, (changed, theirs) in enumerate(cases):
        run = tmp_path / f"run{n}"
        command = _a_kept_run(monkeypatch, run, **changed)
        manifest = (run / "manifest" / "part-00000.json").read_text()
        code, out = invoke(*command)
        assert (code, out) == (
            1,
            f"Error: {run} already holds a complete run (first) written by other code {theirs} "
            f"without a report (streamassign report {run} writes it); pass --overwrite to "
            "replace it once the new run is complete, or --out for another folder\n",
        ), changed
        assert (run / "manifest" / "part-00000.json").read_text() == manifest


def test_code_without_a_fingerprint_never_keeps_a_run_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Imported from where its files cannot be read (a loader that is neither a folder nor a
    zip), the code has no fingerprint: the hash of nothing matched every such version."""
    from streamassign.cli import provenance
    from streamassign.pipeline import runs

    monkeypatch.setattr(runs, "this_code", lambda: runs.Code("/app.pex/streamassign", None))
    assert provenance.other_code({"code_sha256": None, "assignors": ["task:sticky"]}) == (
        "not known to be by this code (the streamassign package at /app.pex/streamassign "
        "cannot be read to fingerprint it)"
    )


def test_a_remote_run_is_never_kept_and_its_refusal_names_what_differs(tmp_path: Path) -> None:
    """A remote DIR is read through Spark, once it has started: its run is never kept (the
    refusal stays, exit status 1), and the refusal compares the new run's settings, not its
    date or master, with the run's."""
    from streamassign.cli import kept_runs, simulate

    run = tmp_path / "run"
    words = ["streamassign", "simulate", str(ORDERS), "--out", "hdfs://nn/runs/x"]
    _a_run_of(words, run, run_id="first")
    local = str(run)

    class Remote:  # the local run, as if at hdfs://nn/runs/x
        def _at(self, path: str) -> str:
            return path.replace("hdfs://nn/runs/x", local)

        def exists(self, path: str) -> bool:
            return Path(self._at(path)).exists()

        def is_empty_dir(self, path: str) -> bool:
            return not any(Path(self._at(path)).iterdir())

        def read_text(self, path: str) -> str | None:
            at = Path(self._at(path))
            return at.read_text() if at.is_file() else None

        def has_files(self, path: str, suffix: str) -> bool:
            return any(Path(self._at(path)).rglob(f"*{suffix}"))

    with simulate.simulate.make_context("simulate", words[2:]) as ctx:
        job, _ = simulate._simulation_job(ctx.params)
        new_run = simulate._manifest(ctx.params["topology_file"], job, [], "yarn")
    end = (
        "; pass --overwrite to replace it once the new run is complete, or --out for another folder"
    )
    with pytest.raises(click.ClickException) as refused:
        kept_runs._refuse_existing(Remote(), "hdfs://nn/runs/x", False, new_run)
    assert refused.value.message == f"hdfs://nn/runs/x already holds a complete run (first){end}"
    with pytest.raises(click.ClickException) as refused:
        kept_runs._refuse_existing(Remote(), "hdfs://nn/runs/x", False, new_run | {"seed": 7})
    assert refused.value.message == (
        f"hdfs://nn/runs/x already holds a complete run (first) of another simulation (other "
        f"--seed){end}"
    )
    assert kept_runs._refuse_existing(Remote(), "hdfs://nn/runs/x", True, new_run) is None


def test_a_kept_run_without_its_report_gets_it_with_the_commands_spark_options(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With --report, a kept run without a report gets it written, on a session started with
    the command's --ship-code and aggregated at its --spark-tasks (they were dropped); damage
    only the rows show (report's count) is one line whose remedy is --overwrite: simulate
    again without it would keep the damaged run once more."""
    from streamassign.errors import DamagedRunError

    run = tmp_path / "run"
    command = _a_kept_run(monkeypatch, run)
    started: list[Any] = []

    @contextlib.contextmanager
    def session(master: str | None, ship: bool | None = False) -> Iterator[Any]:
        started.append((master, ship))
        yield "session"

    def render(session: Any, run_dir: str, out: Path | None, tasks: int | None = None) -> Path:
        started.append((session, run_dir, out, tasks))
        (Path(run_dir) / "report").mkdir()
        (Path(run_dir) / "report" / "report.html").write_text("rendered")
        return Path(run_dir) / "report" / "report.html"

    replace_in_cli(monkeypatch, "_session", session)
    replace_in_cli(monkeypatch, "_render", render)
    code, out = invoke(*command, "--spark-tasks", "3", "--ship-code")
    assert code == 0, out
    assert started == [(None, True), ("session", str(run), None, 3)]
    held = f"{run} already holds this simulation, run first of 2026-11-29 04:51 UTC (same "
    assert out.splitlines()[:2] == [
        f"{held}settings, same code), without its report: writing it",
        f"{held}settings, same code): kept, nothing simulated (--overwrite simulates it again)",
    ]
    assert out.splitlines()[2:] == [
        f"report: {run / 'report' / 'report.html'}",
        f"next: open {(run / 'report' / 'report.html').as_uri()} in a browser; runs and "
        "columns: docs/pipeline.md",
    ]

    def damaged(*a: Any) -> Path:
        cause = DamagedRunError(
            f"{run}: damaged run: 9 rows read under rebalances/, but the manifest says 12 were "
            "written (files deleted or moved?); run streamassign simulate again with --overwrite"
        )
        raise click.ClickException(str(cause)) from cause

    shutil.rmtree(run / "report")
    replace_in_cli(monkeypatch, "_render", damaged)
    code, out = invoke(*command)
    assert code == 1
    assert ": kept, nothing simulated" not in out  # it is not kept: said once, not both
    assert out.splitlines()[-1] == (
        f"Error: {run}: damaged run: 9 rows read under rebalances/, but the manifest says 12 "
        "were written (files deleted or moved?); it cannot be kept: pass --overwrite to "
        "simulate it again"
    )


def test_ctrl_c_while_the_report_is_written_says_how_to_write_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An audit's Ctrl-C during --report --overwrite left the new run without a report and no
    word on ``streamassign report DIR``."""
    pytest.importorskip("pyspark")
    pytest.importorskip("plotly")
    from types import SimpleNamespace

    from streamassign.cli import simulate

    @contextlib.contextmanager
    def session(*a: Any) -> Iterator[Any]:
        yield SimpleNamespace(sparkContext=SimpleNamespace(master="local[1]"))

    def interrupted(*a: Any) -> Any:
        raise KeyboardInterrupt

    replace_in_cli(monkeypatch, "_session", session)
    monkeypatch.setattr(simulate, "_write_run", lambda *a: (12, 1.0))
    replace_in_cli(monkeypatch, "_render", interrupted)
    run = tmp_path / "run"
    result = cli_runner().invoke(
        main, ["simulate", str(ORDERS), *TINY, "--out", str(run), "--report"]
    )
    assert result.exit_code == 130
    last = result.stderr.splitlines()[-1]
    assert last.startswith("interrupted while writing the report; run ")
    assert last.endswith(f" is complete; next: streamassign report {run}")


def test_a_run_under_nohup_keeps_going_after_sighup(tmp_path: Path) -> None:
    """SIGHUP stops a run as Ctrl-C does, unless it came in ignored (``nohup``): then a closed
    terminal must not stop it."""
    pytest.importorskip("pyspark")
    import signal

    run = tmp_path / "run"
    args = ("simulate", str(ORDERS), *TINY, "--out", str(run))
    child = _start_fake_spark("hang-job", *args, env={}, ignore_sighup=True)
    _wait_for(lambda: any(p.name.startswith(".run.partial-") for p in tmp_path.iterdir()), "rows")
    child.send_signal(signal.SIGHUP)
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=1)
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 128 + signal.SIGTERM, err
    assert err.splitlines()[-1] == f"interrupted by SIGTERM while simulating; {run} left as it was"


def test_simulate_records_the_hash_of_the_topology_it_parsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The manifest's topology_sha256 was read again after Spark started, seconds after the
    file was parsed: an edit saved in between recorded the new content beside rows of the old
    (a later plan then found it "already simulated"); a file deleted in between raised a
    FileNotFoundError traceback. It is the hash of the bytes parsed."""
    pytest.importorskip("pyspark")
    topology = tmp_path / "orders-join.toml"
    parsed = ORDERS.read_bytes()
    topology.write_bytes(parsed)
    recorded: list[dict[str, Any]] = []

    @contextlib.contextmanager
    def edited_while_spark_starts(master: str | None, ship: bool | None = False) -> Iterator[Any]:
        topology.write_bytes(parsed + b"\n# a store added\n")
        yield SimpleNamespace(sparkContext=SimpleNamespace(master="local[1]"))

    def stop_at_write(
        session: Any, job: Any, run_dir: str, manifest: dict[str, Any], *a: Any
    ) -> Any:
        recorded.append(manifest)
        raise click.ClickException("stopped before writing")

    replace_in_cli(monkeypatch, "_session", edited_while_spark_starts)
    monkeypatch.setattr("streamassign.cli.simulate._write_run", stop_at_write)
    code, out = invoke("simulate", str(topology), *TINY, "--out", str(tmp_path / "run"))
    assert code == 1 and "stopped before writing" in out, out
    assert recorded[0]["topology_sha256"] == hashlib.sha256(parsed).hexdigest()

    # Deleted in between: no traceback, the bytes parsed are hashed all the same.
    topology.write_bytes(parsed)
    replace_in_cli(monkeypatch, "_session", _deleting_session(topology))
    code, out = invoke("simulate", str(topology), *TINY, "--out", str(tmp_path / "run"))
    assert code == 1 and "stopped before writing" in out, out
    assert recorded[1]["topology_sha256"] == hashlib.sha256(parsed).hexdigest()


def _deleting_session(path: Path) -> Callable[..., Any]:
    @contextlib.contextmanager
    def session(master: str | None, ship: bool | None = False) -> Iterator[Any]:
        path.unlink()
        yield SimpleNamespace(sparkContext=SimpleNamespace(master="local[1]"))

    return session


def test_a_report_failing_after_a_complete_run_is_one_line_naming_the_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A new user's audit: `simulate --report` whose report failed outside Spark (jinja2
    missing) ended in a trace, with nothing saying the run was kept. After a complete run
    any failure of its report is one line: what failed, that the run is complete, and the
    command that writes the report (which shows the trace if it fails again)."""
    from streamassign.cli import failures
    from streamassign.cli import report as report_cli
    from streamassign.pipeline import progress, report
    from streamassign.pipeline import spark as sp

    def render_report(data: Any, staging: str) -> None:
        raise ModuleNotFoundError("No module named 'jinja2'")

    monkeypatch.setattr(progress, "run_tracked", lambda session, what, console, run: run())
    monkeypatch.setattr(sp, "aggregate", lambda *a: None)
    monkeypatch.setattr(report, "render_report", render_report)
    complete = "run R is complete; next: streamassign report DIR"
    with (
        pytest.raises(click.ClickException) as raised,
        failures._one_line_failures("writing the report", done=complete),
    ):
        report_cli._render(SimpleNamespace(), str(tmp_path), tmp_path / "report")
    assert raised.value.message == (
        f"writing the report failed: ModuleNotFoundError: No module named 'jinja2'; {complete}"
    )
    assert list(tmp_path.iterdir()) == []
    # Without a complete run behind it (the report command): the trace, as for any bug.
    with pytest.raises(ModuleNotFoundError), failures._one_line_failures("writing the report"):
        report_cli._render(SimpleNamespace(), str(tmp_path), tmp_path / "report")


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_the_report_id_is_as_readable_as_the_report(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, umask: int
) -> None:
    """A new user's audit: report-id.txt was 0600 (a private temporary file's mode) beside a
    0644 report: a served or shared report folder had one unreadable file. A review: then it
    was 0644 whatever the umask, beside a 0600 report. It has the report's mode."""
    from streamassign import cli
    from streamassign.cli import report as report_cli
    from streamassign.pipeline import progress, report
    from streamassign.pipeline import spark as sp

    def render_report(data: Any, staging: str) -> None:
        Path(staging).mkdir()
        (Path(staging) / "report.html").write_text("page")

    monkeypatch.setattr(progress, "run_tracked", lambda session, what, console, run: run())
    monkeypatch.setattr(sp, "aggregate", lambda *a: None)
    monkeypatch.setattr(report, "render_report", render_report)
    out = tmp_path / "report"
    previous = os.umask(umask)
    try:
        report_cli._render(SimpleNamespace(), str(tmp_path), out)
    finally:
        os.umask(previous)
    modes = {(out / name).stat().st_mode & 0o777 for name in ("report.html", cli.REPORT_ID)}
    assert modes == {0o666 & ~umask}
