"""``streamassign plan-standbys``: evaluate standby and warmup candidates on Spark and
recommend one; the plan's table, files and exit status."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from ..errors import StreamAssignError
from ..files import sync_directory
from ..text import counted
from .console import _Stdout
from .extras import _require
from .failures import _one_line_failures
from .group import TARGET_MISSED_EXIT, main
from .jobs import _json_only, _model, _preflight, _session, _workload
from .kept_runs import _created_on
from .options import (
    _SPLIT_SPARK_TASKS,
    _acceptable_lag_option,
    _check_limit,
    _given,
    _json_option,
    _model_options,
    _out_dir_option,
    _probing_interval_option,
    _restore_rate_option,
    _scenarios_option,
    _ship_code_option,
    _shown,
    _spark_tasks_option,
    _topology_argument,
    _with_options,
)
from .run_folders import _check_out_folder
from .standby_runs import _next_simulation

#: plan-standbys' table: (header, row key, format). Short headers, two lines at most, so that
#: the table fits an 80-column log; docs/pipeline.md defines each column.
_PLAN_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("stand-\nbys", "standbys", "{}"),
    ("warm-\nups", "warmups", "{}"),
    ("avail-\nability", "availability", "{:.5f}"),
    ("outage\ntask-s/d", "outage_per_day_s", "{:,.0f}"),
    ("worst\np99 (s)", "worst_outage_p99_s", "{:,.0f}"),
    ("standby\nload", "standby_load", "{:.2f}"),
    ("boot-\nstrap/h", "bootstrap_per_hour", "records"),
    ("warmup\nload", "warmup_load", "{:.4f}"),
    ("move\ndelay s", "convergence_s", "{:,.0f}"),
)


def _short_count(value: float) -> str:
    """12,345,678 -> '12.3M': record counts in a narrow column."""
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= limit:
            return f"{value / limit:.1f}{suffix}"
    return f"{value:.0f}"


def _plan_table(rows: Sequence[Mapping[str, Any]], best: Mapping[str, Any], title: str) -> Table:
    """The candidates, the recommended one marked with ``*``; fits 80 columns unabridged."""
    from rich import box

    # Columns apart by their divider and one space, no outer edge: 77 characters in all.
    table = Table(
        title=f"Standby plans: {title}",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 0, 0, 1),
    )
    cells = [
        [
            _short_count(r[key]) if fmt == "records" else fmt.format(r[key])
            for _, key, fmt in _PLAN_COLUMNS
        ]
        for r in rows
    ]
    for line, r in zip(cells, rows, strict=True):
        if r is best:
            line[0] += " *"
    for n, (header, _, _) in enumerate(_PLAN_COLUMNS):
        # Explicit widths: rich would otherwise share the width out and cut the numbers.
        width = max(*(len(h) for h in header.split("\n")), *(len(line[n]) for line in cells))
        table.add_column(header, justify="right", no_wrap=True, width=width)
    for line in cells:
        table.add_row(*line)
    return table


def _int_list(value: str, option: str) -> tuple[int, ...]:
    try:
        items = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(
            f"expected integers such as 0,1,2, got {value!r}", param_hint=option
        ) from None
    if not items or min(items) < 0:
        raise click.BadParameter(f"expected integers >= 0, got {value!r}", param_hint=option)
    _check_limit("MAX_REPLICAS", items, option)
    return items


@main.command("plan-standbys")
@_topology_argument
@_scenarios_option(100, "Failure traces per candidate.")
@_shown(
    "--standbys",
    "standby_list",
    kind=str,
    default="0,1,2,3",
    help="num_standby_replicas candidates.",
)
@_shown(
    "--warmups", "warmup_list", kind=str, default="0,2", help="Warmup-replica candidates (0: none)."
)
@_restore_rate_option("Records per second a restoring task reads (simulate's default too).")
@_shown(
    "--detection",
    kind=click.FloatRange(min=0),
    default=45.0,
    help="Seconds before a crashed client's tasks move (session timeout).",
)
@_probing_interval_option("Seconds between probing rebalances that complete warmed-up moves.")
@click.option(
    "--target",
    type=click.FloatRange(min=0, max=1, min_open=True, max_open=True),
    default=None,
    help="Availability to reach (share of task-time up), e.g. 0.999; exit status 3 (the plan "
    "still printed) when no candidate reaches it. Default: the cheapest candidate within "
    "--tolerance of the least outage of all candidates.",
)
@_shown(
    "--tolerance",
    kind=click.FloatRange(min=0),
    default=0.25,
    help="Without --target: how much more outage than the best candidate's is good enough.",
)
@_acceptable_lag_option("Lag (records) at which a client counts as caught up.")
@_out_dir_option("Also write plan.csv and plan.json here.")
@_json_option("a table")
@_with_options(_model_options)
@_ship_code_option
@_spark_tasks_option(_SPLIT_SPARK_TASKS)
def plan_standbys(
    topology_file: Path,
    scenarios: int,
    standby_list: str,
    warmup_list: str,
    restore_rate: float,
    detection: float,
    probing_interval: float,
    target: float | None,
    tolerance: float,
    acceptable_lag: int,
    out: Path | None,
    as_json: bool,
    model_file: Path | None,
    params: tuple[str, ...],
    steps: int | None,
    partitions: tuple[str, ...],
    seed: int,
    master: str | None,
    ship_code: bool | None,
    spark_tasks: int | None,
) -> None:
    """Recommend num_standby_replicas and warmups for TOPOLOGY_FILE under a failure model."""
    from ..pipeline.simulate import require_rebalances
    from ..pipeline.standbys import AvailabilityModel, PlanJob

    _refuse_target_with_tolerance(target)
    _require("pyspark", "streamassign plan-standbys")
    try:
        model = _model(model_file, params, steps)
        require_rebalances(model, "plan-standbys measures the outage")
        job = PlanJob(
            workload=_workload(topology_file, partitions),
            model=model,
            availability=AvailabilityModel(
                restore_rate=restore_rate,
                detection_s=detection,
                probing_interval_s=probing_interval,
                target=target,
                tolerance=tolerance,
            ),
            scenarios=scenarios,
            seed=seed,
            standby_candidates=_int_list(standby_list, "--standbys"),
            warmup_candidates=_int_list(warmup_list, "--warmups"),
            acceptable_recovery_lag=acceptable_lag,
        )
    except (StreamAssignError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    if out is not None:
        _check_out_folder(out, _PLAN_FILES)
    quiet = _json_only(as_json)
    totals = _evaluate_standby_candidates(master, ship_code, job, spark_tasks, quiet)
    plan, best = _standby_plan(totals, job, target, tolerance)
    _print_plan(plan, best, job, out, topology_file, as_json)
    if out is not None:  # after printing: a failed write loses nothing the run found
        _write_plan(out, plan["candidates"], plan)
    _exit_if_missed(target, plan, quiet)


def _refuse_target_with_tolerance(target: float | None) -> None:
    """--tolerance only ranks candidates when no --target is given: both together is a mistake."""
    if target is not None and _given("tolerance"):
        raise click.UsageError(
            "give --target or --tolerance, not both: --tolerance applies without a target only"
        )


def _fleet_line(model: Any) -> str:
    """The fleet the traces model: the recommendation holds for that fleet, and the default
    (3-6 processes) is rarely the operator's own."""
    start = f"{model.min_initial_clients}-{model.max_initial_clients}"
    if model.min_initial_clients == model.max_initial_clients:
        start = str(model.min_initial_clients)
    return (
        f"fleet modelled: {start} processes at the start, {model.min_clients}-"
        f"{model.max_clients} as they scale (yours: --param min_initial_clients=N --param "
        "max_initial_clients=N, N from streamassign describe; min_clients, max_clients)"
    )


def _exit_if_missed(target: float | None, plan: Mapping[str, Any], quiet: bool = False) -> None:
    """Exit with :data:`TARGET_MISSED_EXIT` (and a note, unless ``quiet``: the JSON's
    ``target_reached`` says it) when the plan's recommendation misses ``target``."""
    if not plan["target_reached"]:
        if not quiet:
            click.echo(
                f"note: no candidate reaches --target {target:g}: exit status {TARGET_MISSED_EXIT}",
                err=True,
            )
        raise SystemExit(TARGET_MISSED_EXIT)


def _standby_plan(
    totals: Any, job: Any, target: float | None, tolerance: float
) -> tuple[dict[str, Any], Mapping[str, Any]]:
    """The plan (the candidates' summaries, the recommended one, why, the knobs that move it,
    and the assignor it needs, with the plan for the sticky one when that differs) and the
    recommended row itself (one of the candidates)."""
    from ..pipeline.standbys import assignor_advice, knobs, recommend, summarize

    rows = summarize(totals, job.availability)
    best, why, reached = recommend(rows, target, tolerance)
    advice = assignor_advice(rows, best, target, tolerance)
    plan = {
        "candidates": rows,
        "recommended": dict(best),
        "why": why,
        "target_reached": reached,
        "knobs": knobs(best, job, target),
        "assignor": advice["assignor"],
        "assignor_why": advice["why"],
        "without_warmups": advice["without_warmups"],
    }
    return plan, best


def _evaluate_standby_candidates(
    master: str | None,
    ship_code: bool | None,
    job: Any,
    spark_tasks: int | None,
    quiet: bool = False,
) -> Any:
    """The summed outage columns of every candidate, evaluated on Spark (no progress shown
    when ``quiet``)."""
    _preflight(master, job.workload, job.model)
    from ..pipeline import spark as sp
    from ..pipeline.progress import run_tracked, stderr_console

    with (
        _one_line_failures("planning standbys"),
        _session(master, ship_code, quiet) as session,
    ):
        return run_tracked(
            session,
            "evaluating standby candidates",
            stderr_console(quiet),
            lambda: sp.run_plan(session, job, spark_tasks),
        )


#: What ``plan-standbys --out`` writes.
_PLAN_FILES = ("plan.csv", "plan.json")


def _write_plan(out: Path, rows: list[dict[str, Any]], plan: Mapping[str, Any]) -> None:
    """plan.csv (the candidates) and plan.json (everything) in ``out``, replaced as a pair:
    both are written in full to temporary files first and renamed over the old ones only
    then, so a failure (a full disk) leaves the old pair, not a new csv beside an old json. A
    failure is one line (the plan was printed before)."""
    from ..pipeline.report import csv_text

    contents = {
        "plan.csv": csv_text(rows, list(rows[0])).encode(),
        "plan.json": json.dumps(plan, indent=2).encode(),
    }
    staged: dict[str, str] = {}
    replaced: list[str] = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, data in contents.items():
            staged[name] = _stage_file(out / name, data)
        for name, temporary in staged.items():
            os.replace(temporary, out / name)
            replaced.append(name)
        sync_directory(out)
    except OSError as exc:
        done = ", ".join(replaced) + " replaced" if replaced else "its files left as they were"
        raise click.ClickException(
            f"cannot write the plan to {out}: {exc.strerror or exc} ({done}); the plan is "
            "printed above"
        ) from exc
    finally:
        for name, temporary in staged.items():
            if name not in replaced:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)


def _stage_file(target: Path, data: bytes) -> str:
    """A temporary file beside ``target`` holding ``data``, on disk and readable by all (a
    result to share), for the caller to rename over ``target``; nothing is left on failure."""
    import tempfile

    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), 0o644)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return temporary


def _print_plan(
    plan: Mapping[str, Any],
    best: Mapping[str, Any],
    job: Any,
    out: Path | None,
    topology_file: Path,
    as_json: bool,
) -> None:
    """The plan as JSON, or the candidates' table (``best`` marked), the recommendation with
    its knobs, and what to run next."""
    if as_json:
        click.echo(json.dumps(plan, indent=2))
        return
    title = f"{job.workload.name}, {job.scenarios} failure traces"
    console = _Stdout()
    console.print(_plan_table(plan["candidates"], best, title))
    console.print(f"recommended: {plan['why']}")
    for line in plan["knobs"]:
        console.print(f"  {line}")
    console.print(f"assignor: {plan['assignor_why']}")
    click.echo(_fleet_line(job.model))
    # Plain lines (not rich's, which wrap at the log's width): paths and commands to copy.
    if out is not None:
        click.echo(f"written: {out / 'plan.csv'}, {out / 'plan.json'}")
    standbys, warmups = best["standbys"], best["warmups"]
    command = _next_simulation(topology_file, standbys, job.workload.name, warmups)
    compares = _next_compares(plan, best)
    page = Path(command.out) / "report" / "report.html"
    if command.kept is None or not page.is_file():
        click.echo(f"next: {shlex.join(command.words)}  ({compares})")
        return
    # This simulation already run by this code and reported: the command would only say so.
    click.echo(
        f"next: open {page.resolve().as_uri()} in a browser  (already simulated on "
        f"{_created_on(command.kept)} by this code: {compares})"
    )


def _next_compares(plan: Mapping[str, Any], best: Mapping[str, Any]) -> str:
    """What the next command's report compares: with warmups, task:ha at the plan and
    task:sticky beside it at the same standbys, which may not be its own plan's; without,
    task:sticky alone."""
    standbys = best["standbys"]
    if not best["warmups"]:
        return (
            f"the rebalances under this plan: task:sticky at "
            f"{counted(standbys, 'standby', 'standbys')}, no warmups"
        )
    compares = (
        f"the rebalances under this plan: task:ha with {counted(best['warmups'], 'warmup')}, "
        f"beside task:sticky at the same {counted(standbys, 'standby', 'standbys')}"
    )
    sticky = plan["without_warmups"]
    if sticky is not None and sticky["standbys"] != standbys:
        compares += f", not at its own plan's {sticky['standbys']}"
    return compares
