"""``streamassign simulate``: churn traces through the assignors on Spark, written as a run
folder (and its report with ``--report``)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from ..errors import StreamAssignError
from ..text import counted
from .extras import _require
from .failures import _one_line_failures
from .group import main
from .jobs import _model, _preflight, _session, _workload
from .kept_runs import (
    _keep_run,
    _local_run_to_keep,
    _refuse_existing,
    _simulation_identity,
)
from .options import (
    _SPLIT_SPARK_TASKS,
    _acceptable_lag_option,
    _model_options,
    _pipeline_limit,
    _pipeline_number_option,
    _probing_interval_option,
    _restore_rate_option,
    _scenarios_option,
    _ship_code_option,
    _spark_tasks_option,
    _standbys_option,
    _topology_argument,
    _with_options,
)
from .provenance import dist_version, row_libraries
from .report import _render, _report_command
from .run_folders import (
    _check_out_folder,
    _given_run_dir,
    _is_remote,
    _local_path,
    _publish,
    _run_dir,
)


@main.command()
@_topology_argument
@_scenarios_option(200, "Churn traces to simulate.")
@click.option(
    "--assignors",
    "assignor_names",
    multiple=True,
    default=("default",),
    # The default is in the text: click's "[default: default]" broke across two lines at 80
    # columns.
    metavar="NAME[,NAME]",
    help="Assignors or groups: task:sticky, faust:copartitioned, consumer:range, "
    "aiokafka:sticky, ...; groups default (when not given), all, task, consumer, aiokafka, "
    "peers.",
)
@_standbys_option(1, "num_standby_replicas of the task assignors.")
@_acceptable_lag_option("acceptable_recovery_lag of the task assignor (records).")
@_restore_rate_option(
    "Records per second a restoring task reads: new replicas' catch-up, and the report's "
    "task downtime (recorded in the manifest)."
)
@_pipeline_number_option(
    "--warmups",
    kind=click.IntRange(min=1),
    default="WARMUPS",
    callback=_pipeline_limit("MAX_REPLICAS"),
    metavar="W",
    help="task:ha: warmup replicas at once (max_warmup_replicas; recorded in the manifest).",
)
@_probing_interval_option(
    "task:ha: seconds between probing rebalances that complete warmed-up moves (recorded in "
    "the manifest)."
)
@click.option(
    "--out",
    default=None,
    metavar="DIR",
    help="Run directory (local or a Hadoop URI); default streamassign-runs/<topology>.",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace the run already in DIR (only once the new run is complete).",
)
@click.option(
    "--report/--no-report",
    "with_report",
    default=False,
    help="Also write the HTML report (DIR/report) from the same Spark session.",
)
@_ship_code_option
@_spark_tasks_option(
    _SPLIT_SPARK_TASKS + " With --report, also the partitions of its aggregation's shuffles "
    "(default there: the session's)."
)
@_with_options(_model_options)
def simulate(
    topology_file: Path,
    scenarios: int,
    assignor_names: tuple[str, ...],
    standbys: int,
    acceptable_lag: int,
    restore_rate: float,
    warmups: int,
    probing_interval: float,
    out: str | None,
    overwrite: bool,
    with_report: bool,
    ship_code: bool | None,
    spark_tasks: int | None,
    model_file: Path | None,
    params: tuple[str, ...],
    steps: int | None,
    partitions: tuple[str, ...],
    seed: int,
    master: str | None,
) -> None:
    """Simulate churn traces of TOPOLOGY_FILE through assignors on Spark; write Parquet rows.

    The run is written next to DIR and moved into place only when complete; a run already in
    DIR is kept unless --overwrite is given (and then replaced only by a complete run).
    """
    _require("pyspark", "streamassign simulate")
    if with_report:
        # Before Spark starts: a missing one found after the run would cost the whole run.
        _require("plotly", "the report")
        _require("jinja2", "the report")
    job, chosen = _simulation_job(click.get_current_context().params)
    _run_simulation(
        job, chosen, topology_file, out, master, ship_code, overwrite, spark_tasks, with_report
    )


def _simulation_job(options: Mapping[str, Any]) -> tuple[Any, Any]:
    """The ``SimulationJob`` of simulate's parsed ``options`` (its context's params) and its
    resolved assignors; bad input is one line. plan-standbys builds its next command's job
    with it too, to tell whether a run already simulated it."""
    from ..pipeline.assignors import resolve
    from ..pipeline.simulate import SimulationJob, require_rebalances

    try:
        model = _model(options["model_file"], options["params"], options["steps"])
        require_rebalances(model, "simulate compares the assignors")
        chosen = resolve(options["assignor_names"])
        job = SimulationJob(
            workload=_workload(options["topology_file"], options["partitions"]),
            model=model,
            assignors=chosen.names,
            scenarios=options["scenarios"],
            seed=options["seed"],
            standby_replicas=options["standbys"],
            acceptable_recovery_lag=options["acceptable_lag"],
            replica_restore_per_s=options["restore_rate"],
            max_warmup_replicas=options["warmups"],
            probing_interval_s=options["probing_interval"],
        )
    except (StreamAssignError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    return job, chosen


def _run_simulation(
    job: Any,
    chosen: Any,
    topology_file: Path,
    out: str | None,
    master: str | None,
    ship_code: bool | None,
    overwrite: bool,
    spark_tasks: int | None,
    with_report: bool,
) -> None:
    """Check and announce ``job`` (``chosen``: its resolved assignors), run it on Spark into its
    run directory (from ``out``), write the report with ``with_report``, say what comes next."""
    from ..pipeline.runs import new_run_id

    notes = chosen.notes
    workload, model = job.workload, job.model
    run_dir = _run_dir(out, workload.name)
    if (same_run := _local_run_to_keep(run_dir, topology_file, job, overwrite)) is not None:
        _keep_run(run_dir, same_run, master, ship_code, spark_tasks, with_report)
        return
    _preflight(master, workload, model)
    if not _is_remote(run_dir):
        # The run is written beside it, then renamed into place: its folder must take it.
        # As given, not resolved: a dangling ``streamassign-runs`` link must show (its
        # resolved target is just a missing folder, which the write would create).
        given = _local_path(_given_run_dir(out, workload.name))
        shown = f"--out {given}" if out is not None else f"{given} (the default --out)"
        _check_out_folder(Path(run_dir).parent, given=given, shown=shown)
    for note in notes:
        click.echo(f"note: {note}", err=True)
    click.echo(
        f"simulating {counted(job.scenarios, 'scenario')} of {workload.name} x "
        f"{counted(len(job.assignors), 'assignor')} "
        f"({', '.join(job.assignors)}), up to {job.rebalances:,} rebalances"
    )

    run_id = new_run_id()
    kept = f"{run_dir} left as it was" if not overwrite else f"the run in {run_dir} kept"
    with (
        _one_line_failures("simulating", kept),
        _session(master, ship_code) as session,
    ):
        actual_master = session.sparkContext.master
        manifest = _manifest(topology_file, job, notes, actual_master)
        rows, elapsed = _write_run(session, job, run_dir, manifest, run_id, overwrite, spark_tasks)
        click.echo(
            f"{counted(rows, 'rebalance')} in {elapsed:.1f} s ({rows / elapsed:,.0f}/s, session "
            f"start-up excluded) on {actual_master}: run {run_id} in {run_dir}"
        )
        page = None
        if with_report:
            complete = f"run {run_id} is complete; next: {_report_command(run_dir)}"
            with _one_line_failures("writing the report", done=complete):
                page = _render(session, run_dir, None, spark_tasks)
    if page is not None:
        click.echo(f"report: {page}")
        click.echo(f"next: open {page.as_uri()} in a browser; runs and columns: docs/pipeline.md")
    else:
        click.echo(f"next: {_report_command(run_dir)}")


def _write_run(
    session: Any,
    job: Any,
    run_dir: str,
    manifest: dict[str, Any],
    run_id: str,
    overwrite: bool,
    spark_tasks: int | None = None,
) -> tuple[int, float]:
    """Simulate into a hidden sibling of ``run_dir``, then publish it there; on any failure
    (Ctrl-C included) the sibling is deleted and ``run_dir`` is untouched. A signal while
    publishing waits until the run is in place (a second one ends it at once); its
    ``KeyboardInterrupt`` then says where each run is (its second argument, which
    :func:`_one_line_failures` prints). Returns the rows written and the seconds
    taken (session start-up excluded)."""
    import time

    from ..pipeline import spark as sp
    from ..pipeline.progress import run_tracked, stderr_console
    from ..pipeline.runs import files_for, staging_path

    files = files_for(run_dir, session)
    if _is_remote(run_dir):  # never kept (read through Spark): refused, naming what differs
        _refuse_existing(files, run_dir, overwrite, manifest)
    staging = staging_path(run_dir, run_id)
    start = time.perf_counter()
    try:
        made = session.sparkContext.accumulator(0)
        rows = run_tracked(
            session,
            "simulating",
            stderr_console(),
            lambda: sp.run_simulation(session, job, staging, manifest, run_id, made, spark_tasks),
            # Spark hands accumulator updates over only as a task finishes: say so, or a
            # count at 0 for minutes reads as a hang.
            detail=lambda: f"{made.value:,} rebalances (counted as tasks finish)",
        )
    except BaseException:
        with contextlib.suppress(Exception):  # what stopped the run is what to report
            files.delete(staging)
        raise
    elapsed = max(time.perf_counter() - start, 1e-9)
    # Not deleted here after a failure: publish may have moved it into place (it deletes
    # it itself when it knows it did not).
    _publish(files, staging, run_dir, run_id, "run")
    return rows, elapsed


def _manifest(topology_file: Path, job: Any, notes: Sequence[str], master: str) -> dict[str, Any]:
    import datetime

    from ..pipeline.runs import CODE_FINGERPRINT, code_fingerprint

    return {
        **_simulation_identity(topology_file, job),
        "notes": list(notes),
        "master": master,
        "streamassign": dist_version("streamassign"),
        # The code that wrote the rows: a rerun keeps this run only if it is the same.
        CODE_FINGERPRINT: code_fingerprint(),
        "libraries": row_libraries(job.assignors),
        "pyspark": dist_version("pyspark"),
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
