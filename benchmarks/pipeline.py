"""Pipeline benchmark: rebalances simulated per second, in a plain Python loop and on Spark.

1. **Overhead and scaling** — the same traces (1k tasks over 4 stateful subtopologies, fleets of
   about 50 clients, ``StickyTaskAssignor`` with one standby) simulated by
   ``simulate_scenario`` in a plain Python loop, then by the Spark job on ``local[1]`` and
   ``local[2]``: rebalances per second, Spark's overhead against the loop, and the scaling from
   one to two executor threads. Job times exclude the session start (reported apart).
2. **Target** — 100k rebalances of that workload on ``local[2]`` (target: under 5 minutes on the
   2-core development machine).
3. **README command** — ``streamassign simulate topology/orders-join.toml --report`` as a user
   runs it (a fresh process: session start, simulation, aggregation, plots), target under 2 min.
4. **Large report** — ``streamassign report`` on a run of 10M synthetic rows (the row schema,
   values drawn by Spark; 1.5M with ``--quick``), in a fresh process with the default driver
   memory: wall time and the peak memory of the command's process tree (Python and the JVM).
   Past ``spark.EXACT_PERCENTILE_ROWS`` the report uses approximate percentiles.

Run ``python benchmarks/pipeline.py [--quick] [--markdown docs/pipeline.md]``; only part 2:
``--target-only``; only part 4: ``--large-report-only``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import attrs
from _common import Report, console, fmt_seconds, machine_info, write_reports

from streamassign import Subtopology, Topology
from streamassign.pipeline import ScenarioModel, SimulationJob, Workload, simulate_scenario
from streamassign.pipeline import spark as sp

SECTION = "pipeline-benchmark"
SCRIPT = "benchmarks/pipeline.py"
TARGET_SECTION = "pipeline-target"
LARGE_SECTION = "pipeline-large-report"
LARGE_ROWS = 10_000_000
LARGE_ROWS_QUICK = 1_500_000
ROOT = Path(__file__).resolve().parent.parent
STANDALONE = "standalone 2x1"
_CLI = "import sys; from streamassign.cli import main; sys.exit(main())"


@dataclass(frozen=True)
class Config:
    """Sizes of one run; ``--quick`` swaps in small ones."""

    subset: int  # scenarios of part 1 (loop, local[1], local[2])
    repeats: int  # part 1 runs, interleaved; the best of each is kept (the machine is shared)
    full: int  # scenarios of part 2
    steps: int  # rebalances per trace after the initial one
    readme: bool  # run part 3


FULL = Config(subset=50, repeats=2, full=1000, steps=99, readme=True)
QUICK = Config(subset=10, repeats=1, full=40, steps=49, readme=True)


def workload() -> Workload:
    """1k tasks: 4 stateful subtopologies of 250 partitions."""
    topology = Topology(
        [Subtopology(s, [f"input-{s}"], stores=[f"store-{s}"]) for s in range(4)], name="bench"
    )
    return Workload.from_topology(topology, {f"input-{s}": 250 for s in range(4)})


def model(cfg: Config) -> ScenarioModel:
    """Fleets of about 50 clients (45-55), default event rates, no partition expansion (the
    task count stays at 1k)."""
    return ScenarioModel(
        steps=cfg.steps,
        min_initial_clients=50,
        max_initial_clients=50,
        min_clients=45,
        max_clients=55,
        expansion_per_hour=0.0,
    )


def job(cfg: Config, scenarios: int) -> SimulationJob:
    return SimulationJob(
        workload=workload(),
        model=model(cfg),
        assignors=("task:sticky",),
        scenarios=scenarios,
        seed=0,
        standby_replicas=1,
    )


def python_loop(j: SimulationJob) -> tuple[int, float]:
    """Rows and seconds of the plain loop over the job's scenarios."""
    start = time.perf_counter()
    rows = sum(len(simulate_scenario(j, s)) for s in range(j.scenarios))
    return rows, time.perf_counter() - start


def on_spark(
    master: str, jobs: list[SimulationJob], out: Path
) -> tuple[float, float, list[tuple[int, float]]]:
    """Session start seconds, the first (warm-up) job's seconds, then (rows, seconds) of each
    job, on a fresh session. Non-local masters get the code shipped, as the CLI does."""
    out = Path(tempfile.mkdtemp(prefix="session-", dir=out))  # a run folder is written once
    start = time.perf_counter()
    session = sp.start_session(master, "streamassign-benchmark")
    started = time.perf_counter() - start
    results = []
    try:
        if not master.startswith("local"):
            sp.ship_code(session, out)
        # Warm-up (timed apart): the first job of a session pays for starting executors and
        # Python workers and compiling the Parquet writer, a few seconds that would blur the
        # rates of small runs. With the session start it is the fixed start-up cost.
        warm = attrs.evolve(jobs[0], scenarios=2, model=attrs.evolve(jobs[0].model, steps=5))
        start = time.perf_counter()
        sp.run_simulation(session, warm, str(out / "warmup"), {})
        warmed = time.perf_counter() - start
        for k, j in enumerate(jobs):
            start = time.perf_counter()
            rows = sp.run_simulation(session, j, str(out / f"job-{k}"), {"benchmark": True})
            results.append((rows, time.perf_counter() - start))
    finally:
        session.stop()
    return started, warmed, results


def on_standalone(workers: int, jobs: list[SimulationJob], out: Path) -> Any:
    """:func:`on_spark` on a fresh standalone cluster of ``workers`` 1-core workers on this
    machine (``scripts/spark_cluster.py``); executors run this interpreter."""
    name = "_streamassign_spark_cluster_script"
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "spark_cluster.py")
    assert spec is not None and spec.loader is not None
    script = sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(script)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    with script.cluster(workers=workers, cores=1) as cluster:
        return on_spark(cluster.master_url, jobs, out)


def readme_command(out: Path) -> tuple[float, str]:
    """Wall time and last output line of the README's main command, in a fresh process."""
    installed = shutil.which("streamassign")
    command = [installed] if installed else [sys.executable, "-c", _CLI]
    start = time.perf_counter()
    done = subprocess.run(
        [
            *command,
            "simulate",
            str(ROOT / "topology" / "orders-join.toml"),
            "--out",
            str(out / "readme"),
            "--report",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return time.perf_counter() - start, done.stdout.strip().splitlines()[-1]


def synthetic_run(out: Path, rows: int) -> None:
    """A complete run folder of ``rows`` synthetic rows in the row schema (11 assignors, 100
    steps per scenario, values drawn by Spark), with its manifest; written by Spark itself."""
    from pyspark.sql import functions as F

    from streamassign.pipeline.assignors import SPECS
    from streamassign.pipeline.runs import LocalFiles, write_manifest
    from streamassign.pipeline.scenarios import EVENTS
    from streamassign.pipeline.simulate import COLUMNS

    names = [s.name for s in SPECS]
    session = sp.start_session("local[2]", "streamassign-benchmark-synthetic")
    try:
        ids = session.range(rows)
        assignor = F.element_at(
            F.array(*map(F.lit, names)), (F.col("id") % len(names) + 1).cast("int")
        )
        rebalance = F.floor(F.col("id") / len(names))
        made = {
            "scenario": F.floor(rebalance / 100),
            "step": rebalance % 100,
            "event": F.when(rebalance % 100 == 0, F.lit("initial")).otherwise(
                F.element_at(
                    F.array(*map(F.lit, EVENTS[1:])),
                    (rebalance % (len(EVENTS) - 1) + 1).cast("int"),
                )
            ),
            "time_s": (rebalance % 100) * 60.0,
            "assignor": assignor,
            "level": F.when(
                assignor.startswith("task") | assignor.startswith("faust"), "task"
            ).otherwise("consumer"),
            "error": F.lit(None),
        }
        columns = []
        for k, (name, kind, _, _) in enumerate(COLUMNS):
            value = made.get(name)
            if value is None:
                draw = F.rand(seed=k)
                value = {
                    "boolean": draw < 0.8,
                    "double": draw * 100.0,
                }.get(kind, F.floor(draw * F.lit(10 ** (1 + k % 7))))
            columns.append(value.cast({"long": "bigint"}.get(kind, kind)).alias(name))
        frame = ids.select(
            F.lit("synthetic").alias("run_id"), F.lit(0).cast("bigint").alias("seed"), *columns
        )
        frame.write.partitionBy("assignor").parquet(str(out / "rebalances"))
        manifest = {
            "topology": "synthetic",
            "rows": rows,
            "assignors": names,
            "scenarios": rows // 1100,
        }
        write_manifest(LocalFiles(), str(out), {**manifest, "run_id": "synthetic"})
    finally:
        session.stop()


def _tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and all its descendants now (Linux /proc)."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        pid = int(entry.name)
        parents[pid] = int(fields.get("PPid", "0").strip() or 0)
        rss[pid] = int(fields.get("VmRSS", "0 kB").split()[0]) * 1024
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    return sum(rss.get(pid, 0) for pid in tree)


def large_report(out: Path, rows: int) -> tuple[float, int, str]:
    """Seconds, peak memory (bytes, process tree) and last output line of ``streamassign
    report`` on a ``rows``-row synthetic run, in a fresh process with default settings."""
    run = out / "large"
    synthetic_run(run, rows)
    installed = shutil.which("streamassign")
    command = [installed] if installed else [sys.executable, "-c", _CLI]
    start = time.perf_counter()
    proc = subprocess.Popen(
        [*command, "report", str(run)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _tree_rss(proc.pid))
        time.sleep(0.25)
    seconds = time.perf_counter() - start
    output = proc.stdout.read() if proc.stdout else ""
    if proc.returncode != 0:
        raise SystemExit(f"streamassign report failed ({proc.returncode}): {output}")
    return seconds, peak, output.strip().splitlines()[0]


def large_report_section(cfg_quick: bool, out: Path) -> Report:
    rows = LARGE_ROWS_QUICK if cfg_quick else LARGE_ROWS
    seconds, peak, first = large_report(out, rows)
    console.print(
        f"large report: {rows:,} rows in {seconds:.1f} s, peak {peak / 2**30:.2f} GiB: {first}"
    )
    report = Report(
        "Large report",
        ["rows", "percentiles", "time", "peak memory (process tree)"],
        notes=(
            "`streamassign report DIR` in a fresh process (session start included) on a "
            "synthetic run: the row schema with values drawn by Spark, 11 assignors, 100 steps "
            "per scenario; default driver memory (`local[*]`, no Spark settings). Peak memory is "
            "the largest resident size of the command's process tree (Python and the JVM), "
            f"sampled every 0.25 s. Past {sp.EXACT_PERCENTILE_ROWS:,} rows the percentiles are "
            "approximate (`percentile_approx`)."
        ),
    )
    exact = rows <= sp.EXACT_PERCENTILE_ROWS
    report.add(
        f"{rows:,}",
        "exact" if exact else "approximate",
        fmt_seconds(seconds),
        f"{peak / 2**30:.2f} GiB",
    )
    return report


def rate(rows: int, seconds: float) -> str:
    return f"{rows / seconds:,.0f}/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, a smoke check")
    parser.add_argument("--markdown", type=Path, help="write the results section into this file")
    parser.add_argument("--no-readme", action="store_true", help="skip part 3")
    parser.add_argument("--target-only", action="store_true", help="run part 2 alone")
    parser.add_argument("--large-report-only", action="store_true", help="run part 4 alone")
    parser.add_argument("--no-targets", action="store_true", help="skip parts 2, 3 and 4")
    parser.add_argument("--traces", type=int, help="traces of part 1 (default: 50, quick: 10)")
    args = parser.parse_args()
    if args.large_report_only:
        info = machine_info()
        with tempfile.TemporaryDirectory(prefix="streamassign-bench-") as tmp:
            large = large_report_section(args.quick, Path(tmp))
        large.show()
        if args.markdown:
            write_large(args, info, large)
        return
    cfg = QUICK if args.quick else FULL
    if args.target_only:
        target_only(args, cfg)
        return
    if args.no_readme:
        cfg = dataclasses.replace(cfg, readme=False)
    if args.traces:
        cfg = dataclasses.replace(cfg, subset=args.traces)
    info = machine_info()
    console.print(info)

    subset = job(cfg, cfg.subset)
    full = job(cfg, cfg.full)
    with tempfile.TemporaryDirectory(prefix="streamassign-bench-") as tmp:
        out = Path(tmp)
        loop_s = float("inf")
        runners = ("local[1]", "local[2]", STANDALONE)
        best = dict.fromkeys(runners, float("inf"))
        startup: dict[str, tuple[float, float]] = {}
        counts = {}
        for _ in range(cfg.repeats):
            loop_rows, secs = python_loop(subset)
            loop_s = min(loop_s, secs)
            console.print(f"python loop: {loop_rows:,} rebalances in {secs:.1f} s")
            for runner in runners:
                if runner == STANDALONE:
                    started, warmed, ((rows, secs),) = on_standalone(2, [subset], out)
                else:
                    started, warmed, ((rows, secs),) = on_spark(runner, [subset], out)
                startup.setdefault(runner, (started, warmed))  # the first: a cold JVM
                best[runner] = min(best[runner], secs)
                counts[runner] = rows
                console.print(
                    f"{runner}: {rows:,} in {secs:.1f} s (session start {started:.1f} s, "
                    f"first job {warmed:.1f} s)"
                )
            assert set(counts.values()) == {loop_rows}, (loop_rows, counts)
        if not args.no_targets:
            _, _, ((rows_full, s_full),) = on_spark("local[2]", [full], out)
            console.print(f"local[2]: {rows_full:,} in {s_full:.1f} s")
        readme = readme_command(out) if cfg.readme and not args.no_targets else None

    scaling = Report(
        "Overhead and scaling",
        ["runner", "rebalances", "time", "rebalances/s", "vs Python loop", "start-up"],
        notes=(
            f"{cfg.subset} traces of {cfg.steps + 1} rebalances (best of {cfg.repeats} "
            "interleaved runs): 1k tasks (4 stateful "
            "subtopologies x 250), 45-55 clients of 1, 2 or 4 threads, `StickyTaskAssignor` "
            "with one standby, every rebalance scored and priced (`simulate_scenario`). The "
            "Spark times are the whole job (simulate, DataFrame, Parquet write) after a "
            "warm-up job of 12 rebalances. *start-up* is the fixed cost paid before that "
            "(first run of each runner: session start + the warm-up job, which starts the "
            "executors and their Python workers). The standalone cluster is a master and 2 "
            "workers of 1 core each on this machine (`scripts/spark_cluster.py`), code shipped "
            "as by the CLI. *vs Python loop* is the throughput ratio: below 1 on local[1] is "
            "Spark's overhead; local[2] / local[1] is the scaling over 2 cores."
        ),
    )
    scaling.add(
        "Python loop", f"{loop_rows:,}", fmt_seconds(loop_s), rate(loop_rows, loop_s), "1.00x", "0"
    )
    for runner in runners:
        rows, secs = counts[runner], best[runner]
        ratio = (rows / secs) / (loop_rows / loop_s)
        started, warmed = startup[runner]
        scaling.add(
            f"Spark {runner}",
            f"{rows:,}",
            fmt_seconds(secs),
            rate(rows, secs),
            f"{ratio:.2f}x",
            f"{fmt_seconds(started)} + {fmt_seconds(warmed)}",
        )
    rates = {r: counts[r] / best[r] for r in runners}
    scaling.notes += (
        f" Scaling local[2] / local[1]: {rates['local[2]'] / rates['local[1]']:.2f}x;"
        f" standalone (2 x 1 core) / local[2]: {rates[STANDALONE] / rates['local[2]']:.2f}x."
    )

    targets = Report("Targets", ["workload", "time", "rebalances/s", "target", "met"])
    reports = [scaling] if args.no_targets else [scaling, targets]
    if not args.no_targets:
        targets.add(
            f"{rows_full:,} rebalances, 1k tasks, ~50 clients, local[2]",
            fmt_seconds(s_full),
            rate(rows_full, s_full),
            "< 5 min",
            "✓" if s_full < 300 else "✗",
        )
    if readme is not None:
        seconds, last = readme
        targets.add(
            "README main command (fresh process: start, 31k rebalances, report)",
            fmt_seconds(seconds),
            "—",
            "< 2 min",
            "✓" if seconds < 120 else "✗",
        )
        console.print(f"README command: {last}")
    large = None
    if not args.no_targets:
        with tempfile.TemporaryDirectory(prefix="streamassign-bench-") as tmp:
            large = large_report_section(args.quick, Path(tmp))
    for report in (*reports, *([large] if large else [])):
        report.show()

    if args.markdown:
        heading = "## Measured: pipeline benchmark"
        write_reports(args.markdown, SECTION, heading, reports, no_peers(info), SCRIPT, None)
        if large:
            write_large(args, info, large)


def target_only(args: argparse.Namespace, cfg: Config) -> None:
    """Part 2 alone (its own section): the full workload on ``local[2]`` after a warm-up job,
    with the load average at the start and the end (the machine is shared)."""
    info = machine_info()
    console.print(info)
    full = job(cfg, cfg.full)
    with tempfile.TemporaryDirectory(prefix="streamassign-bench-") as tmp:
        started, warmed, ((rows, secs),) = on_spark("local[2]", [full], Path(tmp))
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    console.print(f"local[2]: {rows:,} in {secs:.1f} s ({rows / secs:,.0f}/s); load at end {load}")
    target = Report(
        "Target",
        ["workload", "time", "rebalances/s", "target", "met"],
        notes=(
            f"{cfg.full} traces of {cfg.steps + 1} rebalances, the workload of the table above, "
            f"on Spark `local[2]` after a warm-up job (session start {fmt_seconds(started)} + "
            f"warm-up {fmt_seconds(warmed)}, not counted). Load average at the end: {load}."
        ),
    )
    target.add(
        f"{rows:,} rebalances, 1k tasks, ~50 clients, local[2]",
        fmt_seconds(secs),
        rate(rows, secs),
        "< 5 min",
        "✓" if secs < 300 else "✗",
    )
    target.show()
    if args.markdown:
        heading = "## Measured: 100k-rebalance target"
        write_reports(
            args.markdown, TARGET_SECTION, heading, [target], no_peers(info), SCRIPT, None
        )


def write_large(args: argparse.Namespace, info: dict[str, str], large: Report) -> None:
    """Part 4's section, apart from the others' so that either can be measured alone."""
    heading = "## Measured: large report"
    write_reports(args.markdown, LARGE_SECTION, heading, [large], no_peers(info), SCRIPT, None)


def no_peers(info: Mapping[str, str]) -> dict[str, str]:
    """``info`` without the peers' versions (the pipeline runs none)."""
    return {key: value for key, value in info.items() if key != "peers"}


if __name__ == "__main__":
    main()
