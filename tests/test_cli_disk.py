"""The CLI on a full disk: stdout that cannot be written, Spark failing for space, and
``plan-standbys --out`` replacing its two files as a pair."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from streamassign import cli
from streamassign.cli import failures, plan_standbys
from tests.cli_runner import cli_runner

ROOT = Path(__file__).resolve().parent.parent
ORDERS = str(ROOT / "topology" / "orders-join.toml")
NO_SPACE = "Error: cannot write to standard output: No space left on device\n"

needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")


def to_dev_full(script: str) -> subprocess.CompletedProcess[str]:
    """``python -c script > /dev/full``: every write to stdout fails with ENOSPC, as on a
    full disk."""
    with open("/dev/full", "w") as full:
        return subprocess.run(
            [sys.executable, "-c", script],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
            cwd=ROOT,
        )


def saved_plans(tmp_path: Path) -> tuple[str, str]:
    """Two saved assignments (3 clients, then 4) for ``diff`` and ``explain``."""
    paths = []
    for count in ("3", "4"):
        result = cli_runner().invoke(cli.main, ["plan", ORDERS, "--num-clients", count, "--json"])
        assert result.exit_code == 0, result.output
        path = tmp_path / f"plan-{count}.json"
        path.write_text(result.stdout)
        paths.append(str(path))
    return paths[0], paths[1]


@needs_dev_full
@pytest.mark.parametrize("command", ["plan", "diff", "explain"])
@pytest.mark.parametrize("as_json", [False, True])
def test_stdout_on_a_full_disk_is_one_line_and_exit_1(
    command: str, as_json: bool, tmp_path: Path
) -> None:
    """``plan --json > file`` on a full disk is one line, not a trace of ``OSError: [Errno
    28]``; tables (through rich), diff and explain print the same way."""
    args = [ORDERS, "--num-clients", "3"] if command == "plan" else list(saved_plans(tmp_path))
    args += ["--json"] if as_json else []
    done = to_dev_full(f"from streamassign.cli import main\nmain([{command!r}, *{args!r}])\n")
    assert (done.returncode, done.stderr) == (1, NO_SPACE)


@needs_dev_full
def test_a_full_stdout_still_writes_the_plan_and_fails_the_missed_target(tmp_path: Path) -> None:
    """The stdout failure does not cut a command short (its --out files are what a Spark run
    paid for); a missed target's 3 ("printed and written anyway") becomes 1, since the printed
    plan is lost. The evaluation is stubbed (no Spark)."""
    row = {"standbys": 1, "warmups": 0, "availability": 0.9, "standby_load": 1.0,
           "warmup_load": 0.0, "convergence_s": 0.0, "outage_per_day_s": 1.0,
           "worst_outage_p99_s": 1.0, "bootstrap_per_hour": 1.0}  # fmt: skip
    plan = {"candidates": [row], "recommended": row, "why": "-", "knobs": [],
            "target_reached": False, "assignor": "task:sticky", "assignor_why": "-",
            "without_warmups": None}  # fmt: skip
    script = (
        "from streamassign import cli\n"
        "from streamassign.cli import plan_standbys\n"
        "plan_standbys._evaluate_standby_candidates = lambda *a: None\n"
        f"plan_standbys._standby_plan = lambda *a: ({plan!r}, {row!r})\n"
        f"cli.main(['plan-standbys', {ORDERS!r}, '--out', {str(tmp_path)!r}, '--target', '0.99'])\n"
    )
    done = to_dev_full(script)
    assert done.returncode == 1, done.stderr
    assert "note: no candidate reaches --target 0.99" in done.stderr
    assert done.stderr.endswith(NO_SPACE)
    assert json.loads((tmp_path / "plan.json").read_text())["target_reached"] is False
    assert (tmp_path / "plan.csv").read_text().startswith("standbys,warmups,availability")


@needs_dev_full
@pytest.mark.parametrize("args", [["--help"], ["--version"], ["plan", "--help"]])
def test_help_and_version_to_a_full_stdout_fail_in_one_line(args: list[str]) -> None:
    """Written before any command runs: lost silently with status 0 if only commands
    checked their stdout."""
    done = to_dev_full(f"from streamassign.cli import main\nmain({args!r})\n")
    assert (done.returncode, done.stderr) == (1, NO_SPACE)


@needs_dev_full
def test_an_errors_own_status_stands_beside_the_line() -> None:
    """A command that printed, then failed with an error of its own: its line first, its
    status kept."""
    script = (
        "import click\n"
        "from streamassign.cli import main\n"
        "@main.command()\n"
        "def printed_then_failed():\n"
        "    click.echo('half a table')\n"
        "    raise click.UsageError('a bad option')\n"
        "main(['printed-then-failed'])\n"
    )
    done = to_dev_full(script)
    assert done.returncode == 2, done.stderr
    assert done.stderr.endswith("Error: a bad option\n" + NO_SPACE)


def test_a_broken_pipe_is_still_quiet() -> None:
    """``| head -1`` is not a failure: what is left goes nowhere, no line, no status."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-c", f"from streamassign.cli import main\nmain(['plan', "
             f"{ORDERS!r}, '--num-clients', '3', '--json'])\n"],
            stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (0, "")


# -- Spark failing for space: the cause is said ----------------------------------------------

TASK_WRITE_FAILED = (
    "org.apache.spark.SparkException: [TASK_WRITE_FAILED] Task failed while writing rows to "
    "file:/data/.run.partial-1/rebalances. SQLSTATE: 58030"
)
JAVA_TRACE = (
    f"{TASK_WRITE_FAILED}\n"
    "\tat org.apache.spark.sql.errors.QueryExecutionErrors$.taskFailedWhileWritingRowsError(Q"
    "ueryExecutionErrors.scala:774)\n"
    "\tat org.apache.spark.sql.execution.datasources.FileFormatWriter$.executeTask(FileFormatW"
    "riter.scala:420)\n"
    "\tSuppressed: java.lang.IllegalStateException: writer closed\n"
    "\t\tat org.apache.parquet.hadoop.ParquetFileWriter.end(ParquetFileWriter.java:1200)\n"
    "\t\tCaused by: java.lang.RuntimeException: a suppressed one's cause\n"
    "Caused by: org.apache.hadoop.fs.FSError: java.io.IOException: No space left on device\n"
    "\tat org.apache.hadoop.fs.RawLocalFileSystem$LocalFSFileOutputStream.write(RawLocalFileSy"
    "stem.java:324)\n"
    "Caused by: java.io.IOException: No space left on device\n"
    "\tat java.base/java.io.FileOutputStream.writeBytes(Native Method)\n"
    "\t... 30 more\n"
)
SAID = (
    "SparkException: [TASK_WRITE_FAILED] Task failed while writing rows to file:/data/.run."
    "partial-1/rebalances. SQLSTATE: 58030 (cause: java.io.IOException: No space left on device)"
)


class Py4JStyle(Exception):
    """What py4j raises for a Java exception: its text is the Java trace."""

    __module__ = "py4j.protocol"


class Captured(Exception):
    """What pyspark raises for a Java exception: its text is the description only (the JVM
    trace being off by default), the trace and the converted Java cause kept aside."""

    __module__ = "pyspark.errors.exceptions.captured"

    def __init__(self, desc: str, trace: str, cause: Captured | None = None) -> None:
        super().__init__(desc)
        self._stackTrace = trace
        self._cause = cause


def test_the_innermost_java_cause_is_appended_from_py4j_text() -> None:
    text = f"An error occurred while calling o123.parquet.\n: {JAVA_TRACE}"
    assert failures._spark_failure(Py4JStyle(text)) == SAID


def test_the_innermost_java_cause_is_appended_from_pyspark_causes() -> None:
    io_error = "java.io.IOException: No space left on device"
    innermost = Captured(io_error, f"{io_error}\n\tat java.base/java.io.FileOutputStream.x\n")
    fs_error = "org.apache.hadoop.fs.FSError: java.io.IOException: No space left on device"
    middle = Captured(fs_error, f"{fs_error}\n\tat x\nCaused by: {io_error}\n", innermost)
    assert failures._spark_failure(Captured(TASK_WRITE_FAILED, JAVA_TRACE, middle)) == SAID
    # Without converted causes, the trace kept aside still has them.
    assert failures._spark_failure(Captured(TASK_WRITE_FAILED, JAVA_TRACE)) == SAID


def test_a_chained_python_cause_is_appended() -> None:
    """A real chain: the py4j call failing because a local write failed for space."""
    from py4j.protocol import Py4JError

    with pytest.raises(Py4JError) as raised:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/data/part-0")
        except OSError as exc:
            raise Py4JError("An error occurred while calling o7.save") from exc
    assert failures._spark_failure(raised.value) == (
        "An error occurred while calling o7.save (cause: OSError: [Errno 28] No space left on "
        "device: '/data/part-0')"
    )


def test_the_line_stays_one_bounded_line() -> None:
    long_cause = "java.io.IOException: " + "x" * 5000 + "\nsecond line"
    text = f"{TASK_WRITE_FAILED}\n\tat a.b(C.java:1)\nCaused by: {long_cause}\n"
    line = failures._spark_failure(Py4JStyle(text))
    assert "\n" not in line and len(line) <= 520
    assert line.startswith("SparkException: [TASK_WRITE_FAILED]")
    assert "(cause: java.io.IOException: xxx" in line


def test_no_cause_adds_nothing() -> None:
    java = "An error occurred while calling o1.x.\n: java.lang.OutOfMemoryError: Java heap space"
    assert failures._spark_failure(Py4JStyle(java)) == "OutOfMemoryError: Java heap space"


def test_simulate_failing_for_space_says_so_and_what_was_kept(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with (
        pytest.raises(click.ClickException) as raised,
        failures._one_line_failures("simulating", f"the run in {run} kept"),
    ):
        raise Py4JStyle(f"An error occurred while calling o9.parquet.\n: {JAVA_TRACE}")
    assert raised.value.message == f"simulating failed: {SAID}; the run in {run} kept"


# -- plan-standbys --out: both files new or both old -------------------------------------------

ROWS = [{"standbys": 1, "warmups": 0, "availability": 0.99}]


def test_a_failing_second_write_leaves_the_old_pair(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk filling between the two files leaves the old pair, not a new csv beside an
    old json."""
    (tmp_path / "plan.csv").write_text("old csv\n")
    (tmp_path / "plan.json").write_text('{"old": true}\n')
    real_stage = plan_standbys._stage_file

    def full_disk(target: Path, data: bytes) -> str:
        if target.name == "plan.json":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_stage(target, data)

    monkeypatch.setattr(plan_standbys, "_stage_file", full_disk)
    with pytest.raises(click.ClickException) as raised:
        plan_standbys._write_plan(tmp_path, ROWS, {"new": True})
    assert raised.value.message == (
        f"cannot write the plan to {tmp_path}: No space left on device (its files left as they "
        "were); the plan is printed above"
    )
    assert (tmp_path / "plan.csv").read_text() == "old csv\n"
    assert (tmp_path / "plan.json").read_text() == '{"old": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.csv", "plan.json"]  # no temp

    monkeypatch.setattr(plan_standbys, "_stage_file", real_stage)
    plan_standbys._write_plan(tmp_path, ROWS, {"new": True})
    assert (tmp_path / "plan.csv").read_text().startswith("standbys,warmups,availability")
    assert json.loads((tmp_path / "plan.json").read_text()) == {"new": True}
    for name in ("plan.csv", "plan.json"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o644  # a result to share
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.csv", "plan.json"]
