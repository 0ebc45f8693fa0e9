"""Command line: ``streamassign plan`` shows the tasks, the assignment and its quality;
``simulate``, ``report`` and ``plan-standbys`` run the Spark pipeline (docs/pipeline.md).

A thin layer over the core: ``plan`` reads a topology file and a clients file, runs the grouper,
the sticky task assignor and the thread distribution, and prints tables (rich) or JSON. The
pipeline commands validate every input, then hand over to ``streamassign.pipeline.spark``.
"""

from __future__ import annotations

import contextlib
import json
import os
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs
import click
from rich.console import Console
from rich.table import Table

from ._ids import TaskId, TopicPartition
from .assignment import ClientAssignment, ClientState
from .errors import StreamAssignError
from .grouper import PartitionGrouper, resolve_partition_counts
from .metrics import AssignmentMetrics, evaluate
from .sticky import StickyTaskAssignor
from .threads import distribute_to_threads
from .topology import Topology, load_topology_file

_PARTITIONS = "'--partitions'"

_CLIENT_KEYS = ("process_id", "capacity", "prev_active", "prev_standby", "lags", "rack", "tags")


def load_clients(path: str | Path) -> list[ClientState]:
    """Read ``[[client]]`` tables from a TOML file into ``ClientState``s.

    Keys: ``process_id`` (required), ``capacity``, ``prev_active``, ``prev_standby`` (task ids
    such as ``"0_3"``), ``lags`` (task id -> int), ``rack``, ``tags`` (table). Errors name the
    file and the client.
    """
    where = str(path)
    try:
        with Path(path).open("rb") as fh:
            data = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{where}: cannot read clients file: {exc}") from exc
    unknown = sorted(set(data) - {"client"})
    if unknown:
        raise ValueError(f"{where}: unknown top-level keys {unknown} (expected [[client]] tables)")
    tables = data.get("client", [])
    if not isinstance(tables, list) or not tables:
        raise ValueError(f"{where}: no [[client]] tables")
    clients = []
    for n, table in enumerate(tables, 1):
        label = f"{where}: client #{n}"
        if not isinstance(table, dict):
            raise ValueError(f"{label}: expected a [[client]] table, got {table!r}")
        bad = sorted(set(table) - set(_CLIENT_KEYS))
        if bad:
            raise ValueError(f"{label}: unknown keys {bad}; allowed: {list(_CLIENT_KEYS)}")
        if "process_id" not in table:
            raise ValueError(f"{label}: process_id is required")
        if type(table["process_id"]) is int:  # `process_id = 1` in TOML: read as text
            table = {**table, "process_id": str(table["process_id"])}
        try:
            clients.append(ClientState(**table))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{label} ({table['process_id']!r}): {exc}") from exc
    return clients


def parse_partitions(values: Sequence[str]) -> dict[str, int]:
    """``["orders=12", "customers=12"]`` -> counts; a clear error for any other form, or for a
    count past Kafka's (``preflight.MAX_PARTITIONS``)."""
    from .pipeline.preflight import MAX_PARTITIONS

    counts: dict[str, int] = {}
    for value in values:
        for item in filter(None, (v.strip() for v in value.split(","))):
            topic, sep, count = item.rpartition("=")
            if not sep or not topic or not count.isdigit() or int(count) < 1:
                raise click.BadParameter(
                    f"expected TOPIC=COUNT with COUNT >= 1, got {item!r}", param_hint=_PARTITIONS
                )
            if int(count) > MAX_PARTITIONS:
                raise click.BadParameter(
                    f"{item!r}: at most {MAX_PARTITIONS:,} partitions (2**31 - 1: Kafka's "
                    "partition numbers are 32-bit)",
                    param_hint=_PARTITIONS,
                )
            counts[topic] = int(count)
    return counts


def _check_partition_topics(topology: Topology, counts: Mapping[str, int]) -> None:
    """Reject ``--partitions`` entries the topology takes no count for.

    The grouper ignores counts of other topics (a live cluster reports every topic it has), but
    here the topology is declared, so such an entry is a typo or the wrong file: the same rule
    as the file's ``[partitions]`` table and ``simulate``'s ``--partitions``.
    """
    externals = topology.external_source_topics
    unknown = sorted(set(counts) - externals)
    if not unknown:
        return
    repartition = [t for t in unknown if t in topology.repartition_topics]
    others = [t for t in unknown if t not in topology.repartition_topics]
    name = topology.name or "the topology"
    parts = []
    if others:
        parts.append(f"unknown topic(s) {', '.join(others)}")
    if repartition:
        parts.append(
            f"repartition topic(s) {', '.join(repartition)} (their counts are fixed in the file "
            "or computed)"
        )
    raise click.BadParameter(
        f"{'; '.join(parts)}: {name} takes counts for its external source topics only: "
        f"{', '.join(sorted(externals))}",
        param_hint="'--partitions'",
    )


def _check_task_count(topology: Topology, counts: Mapping[str, int]) -> None:
    """Refuse more than ``preflight.MAX_TASKS`` tasks before the grouper builds them one by
    one (``plan -p orders=2147483647`` would build 2**31 of them)."""
    from .pipeline.preflight import MAX_TASKS

    resolved = resolve_partition_counts(topology, counts)
    tasks = sum(
        max((resolved.get(t, 0) for t in sub.source_topics), default=0)
        for sub in topology.subtopologies
    )
    if tasks > MAX_TASKS:
        raise click.ClickException(
            f"{topology.name or 'the topology'} has {tasks:,} tasks with these partition counts: "
            f"the limit is {MAX_TASKS:,} (one assignment of 50,000 tasks takes about 3 s)"
        )


def _task_list(tasks: Sequence[TaskId], limit: int = 12) -> str:
    shown = ", ".join(str(t) for t in tasks[:limit])
    return shown + (f", … (+{len(tasks) - limit})" if len(tasks) > limit else "")


def _partition_list(parts: frozenset[TopicPartition]) -> str:
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(parts):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return ", ".join(f"{topic}[{','.join(map(str, ps))}]" for topic, ps in by_topic.items())


def _metrics_rows(m: AssignmentMetrics) -> list[tuple[str, str]]:
    return [
        ("tasks / clients", f"{m.tasks} / {m.clients}"),
        ("actives balanced (floor/ceil of capacity share)", "yes" if m.active_balanced else "NO"),
        ("active imbalance (tasks per thread, max - min)", f"{m.active_imbalance:.2f}"),
        ("load imbalance (active+standby per thread)", f"{m.load_imbalance:.2f}"),
        ("moves / lower bound", f"{m.moves} / {m.move_lower_bound}"),
        ("standbys placed / required", f"{m.standbys_placed} / {m.standbys_required}"),
        ("previous standbys kept / dropped", f"{m.standbys_kept} / {m.standbys_dropped}"),
        ("takeovers warm / cold", f"{m.warm_takeovers} / {m.cold_takeovers}"),
    ]


def _threads_of(
    client: ClientState, assignment: ClientAssignment, stateful: set[TaskId]
) -> dict[str, ClientAssignment]:
    # Threads past the client's task count stay idle: only that many are named, so a huge
    # capacity (a typo in a clients file) costs nothing.
    count = max(1, min(client.capacity, assignment.load))
    names = [f"{client.process_id}-{k}" for k in range(count)]
    return distribute_to_threads(assignment, names, stateful=stateful)


# -- options of several commands: one definition each, so that help text and checks agree ----------

_F = TypeVar("_F", bound=Callable[..., Any])

#: An input file that must exist (topology, clients, scenario model).
_EXISTING_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)

_topology_argument = click.argument("topology_file", type=_EXISTING_FILE)


def _shown(*decls: str, kind: Any, default: object, help: str) -> Callable[[_F], _F]:
    """An option of type ``kind`` whose default ``--help`` shows."""
    return click.option(*decls, type=kind, default=default, show_default=True, help=help)


def _partitions_option(help: str) -> Callable[[_F], _F]:
    return click.option("--partitions", "-p", multiple=True, metavar="TOPIC=N[,TOPIC=N]", help=help)


def _json_option(instead_of: str) -> Callable[[_F], _F]:
    return click.option(
        "--json", "as_json", is_flag=True, help=f"Print JSON instead of {instead_of}."
    )


def _out_dir_option(help: str) -> Callable[[_F], _F]:
    """``--out DIRECTORY`` (a local path) of the commands that write files there."""
    return click.option(
        "--out", type=click.Path(file_okay=False, path_type=Path), default=None, help=help
    )


def _standbys_option(default: int, help: str) -> Callable[[_F], _F]:
    """``--standbys N``: num_standby_replicas of the assignor a command runs."""
    return _shown("--standbys", kind=click.IntRange(min=0), default=default, help=help)


def _acceptable_lag_option(help: str) -> Callable[[_F], _F]:
    return _shown("--acceptable-lag", kind=click.IntRange(min=0), default=10_000, help=help)


_ship_code_option = click.option(
    "--ship-code/--no-ship-code",
    default=None,
    help="Zip streamassign+attrs onto the executors (default: on for non-local masters).",
)

_master_option = click.option(
    "--master",
    default=None,
    metavar="URL",
    help="Spark master (default: spark-submit's, else local[*]).",
)


@click.group()
@click.version_option(package_name="streamassign")
def main() -> None:
    """Task and partition assignment for Python stream processors."""


@main.command()
@_topology_argument
@_partitions_option("Partition counts of external topics (override the file's [partitions] table).")
@click.option(
    "--clients",
    "clients_file",
    type=_EXISTING_FILE,
    help="TOML file of [[client]] tables (process_id, capacity, prev_active, ...).",
)
@click.option("--num-clients", type=click.IntRange(min=1), help="Fresh clients (no history).")
@_shown(
    "--threads",
    kind=click.IntRange(min=1),
    default=1,
    help="Threads per fresh client (with --num-clients).",
)
@_standbys_option(0, "num_standby_replicas for stateful tasks.")
@_json_option("tables")
def plan(
    topology_file: Path,
    partitions: tuple[str, ...],
    clients_file: Path | None,
    num_clients: int | None,
    threads: int,
    standbys: int,
    as_json: bool,
) -> None:
    """Group TOPOLOGY_FILE into tasks and assign them to clients."""
    if (clients_file is None) == (num_clients is None):
        raise click.UsageError("give exactly one of --clients FILE or --num-clients N")
    overrides = parse_partitions(partitions)
    try:
        loaded = load_topology_file(topology_file)
    except (StreamAssignError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    _check_partition_topics(loaded.topology, overrides)
    from .pipeline.preflight import MAX_CLIENTS

    if num_clients is not None and num_clients > MAX_CLIENTS:
        raise click.BadParameter(
            f"{num_clients:,} clients: the limit is {MAX_CLIENTS:,} (an assignment to 100,000 "
            "clients takes about 3 s)",
            param_hint="'--num-clients'",
        )
    try:
        counts = {**loaded.partitions, **overrides}
        _check_task_count(loaded.topology, counts)
        tasks = PartitionGrouper().group(loaded.topology, counts)
        if clients_file is not None:
            clients = load_clients(clients_file)
            if len(clients) > MAX_CLIENTS:
                raise click.ClickException(
                    f"{clients_file}: {len(clients):,} clients, the limit is {MAX_CLIENTS:,}"
                )
        else:
            assert num_clients is not None
            clients = [ClientState(f"client-{k}", capacity=threads) for k in range(num_clients)]
        stateful = {t for t in tasks if t.subtopology in loaded.topology.stateful_subtopologies}
        result = StickyTaskAssignor(standbys).assign(tasks, clients, stateful)
    except (StreamAssignError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    metrics = evaluate(tasks, clients, result, standbys, stateful)
    per_thread = {c.process_id: _threads_of(c, result[c.process_id], stateful) for c in clients}
    if as_json:
        click.echo(json.dumps(_as_json(tasks, result, per_thread, metrics), indent=2))
    else:
        _print_tables(loaded.topology.name, tasks, clients, result, per_thread, metrics)


def _as_json(
    tasks: Mapping[TaskId, frozenset[TopicPartition]],
    result: Mapping[str, ClientAssignment],
    per_thread: Mapping[str, Mapping[str, ClientAssignment]],
    metrics: AssignmentMetrics,
) -> dict[str, Any]:
    def ids(ts: frozenset[TaskId]) -> list[str]:
        return [str(t) for t in sorted(ts)]

    return {
        "tasks": {str(t): sorted([tp.topic, tp.partition] for tp in p) for t, p in tasks.items()},
        "assignment": {
            pid: {
                "active": ids(a.active),
                "standby": ids(a.standby),
                "threads": {
                    th: {"active": ids(x.active), "standby": ids(x.standby)}
                    for th, x in per_thread[pid].items()
                },
            }
            for pid, a in result.items()
        },
        "metrics": attrs.asdict(metrics) | {"standby_coverage": metrics.standby_coverage},
    }


def _print_tables(
    name: str,
    tasks: Mapping[TaskId, frozenset[TopicPartition]],
    clients: Sequence[ClientState],
    result: Mapping[str, ClientAssignment],
    per_thread: Mapping[str, Mapping[str, ClientAssignment]],
    metrics: AssignmentMetrics,
) -> None:
    console = Console()
    table = Table(title=f"Tasks of {name or 'the topology'} ({len(tasks)})")
    table.add_column("task")
    table.add_column("source partitions")
    for t, parts in tasks.items():
        table.add_row(str(t), _partition_list(parts))
    console.print(table)

    table = Table(title="Assignment")
    for col in ("client", "threads", "active", "standby", "per thread (active+standby)"):
        table.add_column(col)
    for c in sorted(clients, key=lambda c: c.process_id):
        a = result[c.process_id]
        split = "/".join(str(x.load) for x in per_thread[c.process_id].values())
        table.add_row(
            c.process_id,
            str(c.capacity),
            f"{len(a.active)}: {_task_list(sorted(a.active))}",
            f"{len(a.standby)}: {_task_list(sorted(a.standby))}",
            split,
        )
    console.print(table)

    table = Table(title="Quality")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for row in _metrics_rows(metrics):
        table.add_row(*row)
    console.print(table)


# -- the simulation pipeline (Spark) ---------------------------------------------------------------
#
# Every input is checked before a SparkSession starts: a bad topology, model parameter or assignor
# name costs milliseconds, not a JVM start. Spark itself is imported only by
# streamassign.pipeline.spark, inside the commands.


def _require(module: str, what: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise click.ClickException(
            f"{what} needs {module}, from the spark extra: pip install -e '.[spark]'"
        )


def _params(values: Sequence[str]) -> dict[str, str]:
    """``["steps=50", "threads=1,2"]`` -> parameters; a clear error for any other form."""
    out: dict[str, str] = {}
    for value in values:
        name, sep, raw = value.partition("=")
        if not sep or not name.strip():
            raise click.BadParameter(f"expected NAME=VALUE, got {value!r}", param_hint="--param")
        out[name.strip()] = raw
    return out


def _model(model_file: Path | None, params: Sequence[str], steps: int | None) -> Any:
    from .pipeline.scenarios import ScenarioModel

    given: dict[str, object] = dict(_params(params))
    if steps is not None:
        given["steps"] = steps
    if model_file is not None:
        return ScenarioModel.load(model_file, given)
    return ScenarioModel().evolve(given)


def _is_remote(path: str) -> bool:
    from .pipeline.runs import is_remote

    return is_remote(path)


def _run_dir(out: str | None, name: str) -> str:
    """The run directory: a Hadoop URI as given, a local path (or ``file:`` URI) absolute."""
    if out is None:
        out = str(Path("streamassign-runs") / (name or "topology"))
    if _is_remote(out):
        return out.rstrip("/")
    return str(Path(out.removeprefix("file://").removeprefix("file:")).resolve())


def _refuse_existing(files: Any, run_dir: str, overwrite: bool) -> None:
    """A run is replaced only with ``--overwrite`` (and then only once the new one is done)."""
    from .pipeline.runs import MANIFEST, MANIFEST_FILE, describe_existing, replaceable

    what = describe_existing(files, run_dir)
    if what is None:
        return
    if not replaceable(files, run_dir, f"{MANIFEST}/{MANIFEST_FILE}"):
        raise click.ClickException(
            f"{what} (no manifest): not replacing it, even with --overwrite; remove it yourself "
            "or give another --out"
        )
    if not overwrite:
        raise click.ClickException(
            f"{what}; pass --overwrite to replace it once the new run is complete, or --out "
            "for another folder"
        )


@contextlib.contextmanager
def _session(master: str | None, ship: bool | None = False) -> Iterator[Any]:
    """The command's Spark session (``spark.spark_session``), with a spinner while it starts:
    a JVM start takes 10 s or more."""
    from .pipeline import spark as sp
    from .pipeline.progress import plain_step, stderr_console

    with contextlib.ExitStack() as stack:
        label = master or ("spark-submit's master" if _under_spark_submit() else "local[*]")
        with plain_step(f"starting Spark ({label})", stderr_console()):
            session = stack.enter_context(sp.spark_session(master, ship=ship))
        yield session


def _under_spark_submit() -> bool:
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _spark_failure(exc: BaseException) -> str:
    """One line out of a Spark/Py4J failure: the innermost Python or Java exception line."""
    import re

    text = str(exc)
    python = re.findall(r"^(\w*(?:Error|Exception)\b.*)$", text, re.MULTILINE)
    if python:  # the innermost Python error of a task (Python traces end with it)
        return str(python[-1]).strip()[:300]
    java = re.search(r"(?:\w+\.)+(\w*(?:Exception|Error)): (.*)", text)
    if java:  # the outermost Java exception: its class and message
        return f"{java.group(1)}: {java.group(2).strip()}"[:300]
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return first[:300]


@contextlib.contextmanager
def _one_line_failures(doing: str, kept: str | None = None) -> Iterator[None]:
    """Spark failures and Ctrl-C as one line (what failed, what was kept), not a trace."""
    tail = f"; {kept}" if kept else ""
    try:
        yield
    except KeyboardInterrupt:
        click.echo(f"interrupted while {doing}{tail}", err=True)
        raise SystemExit(130) from None
    except (click.ClickException, StreamAssignError, SystemExit):
        raise
    except Exception as exc:
        if not _from_spark(exc):
            raise
        raise click.ClickException(f"{doing} failed: {_spark_failure(exc)}{tail}") from exc


def _from_spark(exc: BaseException) -> bool:
    module = type(exc).__module__
    return module.startswith(("py4j", "pyspark")) or isinstance(exc, ConnectionError)


_model_options = [
    click.option(
        "--model",
        "model_file",
        type=_EXISTING_FILE,
        help="TOML file of scenario-model parameters (docs/pipeline.md).",
    ),
    click.option(
        "--param",
        "params",
        multiple=True,
        metavar="NAME=VALUE",
        help="Set one scenario-model parameter (repeatable), e.g. crash_per_client_hour=0.1.",
    ),
    click.option(
        "--steps",
        type=click.IntRange(min=0),
        help="Rebalances per trace (model).",
    ),
    _partitions_option("Initial partition counts of external topics (override the file's table)."),
    _shown("--seed", kind=int, default=0, help="Base seed of the traces."),
    _master_option,
]


def _with_options(options: Sequence[Callable[[Any], Any]]) -> Callable[[_F], _F]:
    """Apply shared click options (in order) to a command function."""

    def wrap(func: _F) -> _F:
        for option in reversed(options):
            func = option(func)
        return func

    return wrap


def _preflight(master: str | None, workload: Any = None, model: Any = None) -> None:
    """What would otherwise fail inside or after the JVM start, as one line, before it:
    sizes past the limits, a bad or unreachable master, no usable Java."""
    from .pipeline import preflight

    try:
        if workload is not None:
            preflight.check_size(workload, model)
        preflight.check_master(master)
        if preflight.jvm_will_start():
            preflight.check_java()
    except StreamAssignError as exc:
        raise click.ClickException(str(exc)) from exc


def _workload(topology_file: Path, partitions: Sequence[str]) -> Any:
    from .pipeline.scenarios import Workload

    return Workload.from_file(topology_file, parse_partitions(partitions))


@main.command()
@_topology_argument
@_shown("--scenarios", kind=click.IntRange(min=1), default=200, help="Churn traces to simulate.")
@click.option(
    "--assignors",
    "assignor_names",
    multiple=True,
    default=("default",),
    show_default=True,
    metavar="NAME[,NAME]",
    help="Assignors or groups: task:sticky, faust:copartitioned, consumer:range, "
    "aiokafka:sticky, ...; groups default, all, task, consumer, aiokafka, peers.",
)
@_standbys_option(1, "num_standby_replicas of the task assignors.")
@_acceptable_lag_option("acceptable_recovery_lag of the task assignor (records).")
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
@_with_options(_model_options)
def simulate(
    topology_file: Path,
    scenarios: int,
    assignor_names: tuple[str, ...],
    standbys: int,
    acceptable_lag: int,
    out: str | None,
    overwrite: bool,
    with_report: bool,
    ship_code: bool | None,
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
    from .pipeline.assignors import resolve
    from .pipeline.runs import LocalFiles, new_run_id
    from .pipeline.simulate import SimulationJob

    _require("pyspark", "streamassign simulate")
    if with_report:
        _require("matplotlib", "the report")
    try:
        workload = _workload(topology_file, partitions)
        model = _model(model_file, params, steps)
        chosen = resolve(assignor_names)
        job = SimulationJob(
            workload=workload,
            model=model,
            assignors=chosen.names,
            scenarios=scenarios,
            seed=seed,
            standby_replicas=standbys,
            acceptable_recovery_lag=acceptable_lag,
        )
    except (StreamAssignError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    run_dir = _run_dir(out, workload.name)
    _preflight(master, workload, model)
    if not _is_remote(run_dir):
        _refuse_existing(LocalFiles(), run_dir, overwrite)
    for note in chosen.notes:
        click.echo(f"note: {note}", err=True)
    click.echo(
        f"simulating {scenarios} scenarios of {workload.name} x {len(job.assignors)} assignors "
        f"({', '.join(job.assignors)}), up to {job.rebalances:,} rebalances"
    )

    run_id = new_run_id()
    kept = f"{run_dir} left as it was" if not overwrite else f"the run in {run_dir} kept"
    with (
        _one_line_failures("simulating", kept),
        _session(master, ship_code) as session,
    ):
        actual_master = session.sparkContext.master
        manifest = _manifest(topology_file, job, chosen.notes, actual_master)
        rows, elapsed = _write_run(session, job, run_dir, manifest, run_id, overwrite)
        click.echo(
            f"{rows:,} rebalances in {elapsed:.1f} s ({rows / elapsed:,.0f}/s, session start-up "
            f"excluded) on {actual_master}: run {run_id} in {run_dir}"
        )
        page = None
        if with_report:
            with _one_line_failures("writing the report", f"run {run_id} is complete"):
                page = _render(session, run_dir, None)
    if page is not None:
        click.echo(f"report: {page}")
        click.echo(f"next: open {page.as_uri()} in a browser; runs and columns: docs/pipeline.md")
    else:
        click.echo(f"next: streamassign report {run_dir}")


def _write_run(
    session: Any,
    job: Any,
    run_dir: str,
    manifest: dict[str, Any],
    run_id: str,
    overwrite: bool,
) -> tuple[int, float]:
    """Simulate into a hidden sibling of ``run_dir``, then publish it there; on any failure
    (Ctrl-C included) the sibling is deleted and ``run_dir`` is untouched. Returns the rows
    written and the seconds taken (session start-up excluded)."""
    import time

    from .pipeline import spark as sp
    from .pipeline.progress import run_tracked, stderr_console
    from .pipeline.runs import files_for, publish, staging_path

    files = files_for(run_dir, session)
    if _is_remote(run_dir):
        _refuse_existing(files, run_dir, overwrite)
    staging = staging_path(run_dir, run_id)
    start = time.perf_counter()
    try:
        made = session.sparkContext.accumulator(0)
        rows = run_tracked(
            session,
            "simulating",
            stderr_console(),
            lambda: sp.run_simulation(session, job, staging, manifest, run_id, made),
            detail=lambda: f"{made.value:,} rebalances",
        )
        publish(files, staging, run_dir, run_id)
    except BaseException:
        files.delete(staging)
        raise
    return rows, max(time.perf_counter() - start, 1e-9)


def _manifest(topology_file: Path, job: Any, notes: Sequence[str], master: str) -> dict[str, Any]:
    import datetime
    from importlib import metadata

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    return {
        "topology": job.workload.name,
        "topology_file": str(topology_file),
        "partitions": dict(job.workload.counts),
        "scenarios": job.scenarios,
        "seed": job.seed,
        "assignors": list(job.assignors),
        "notes": list(notes),
        "standby_replicas": job.standby_replicas,
        "acceptable_recovery_lag": job.acceptable_recovery_lag,
        "model": attrs.asdict(job.model),
        "master": master,
        "streamassign": version("streamassign"),
        "pyspark": version("pyspark"),
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def _render(session: Any, run_dir: str, out: Path | None) -> Path:
    """Aggregate on Spark and write the report into a hidden sibling of ``out`` (default
    ``run_dir/report``), moved into place when complete: a failure keeps the old report."""
    from .pipeline import spark as sp
    from .pipeline.progress import plain_step, run_tracked, stderr_console
    from .pipeline.report import render_report
    from .pipeline.runs import LocalFiles, new_run_id, publish, replaceable, staging_path

    if out is None:
        if _is_remote(run_dir):
            raise click.ClickException(
                f"{run_dir} is not a local directory: give --out for the report"
            )
        out = Path(run_dir) / "report"
    out = out.resolve()
    if not replaceable(LocalFiles(), str(out), "report.html"):
        raise click.ClickException(
            f"{out} exists and holds no report.html: not replacing it; give an empty or new "
            "folder as --out"
        )
    console = stderr_console()
    data = run_tracked(session, "aggregating", console, lambda: sp.aggregate(session, run_dir))
    files, report_id = LocalFiles(), new_run_id()
    staging = staging_path(str(out), report_id)
    try:
        with plain_step("rendering the report", console):
            render_report(data, staging)
        publish(files, staging, str(out), report_id)
    except BaseException:
        files.delete(staging)
        raise
    return out / "report.html"


@main.command()
@click.argument("run_dir", metavar="DIR")
@_out_dir_option("Where to write the report (default DIR/report).")
@_master_option
def report(run_dir: str, out: Path | None, master: str | None) -> None:
    """Aggregate a simulation run in DIR with Spark; write an HTML report and CSV summaries."""
    from .pipeline.runs import LocalFiles, check_run, files_for

    _require("pyspark", "streamassign report")
    _require("matplotlib", "streamassign report")
    run_dir = _run_dir(run_dir, "")
    if out is None and _is_remote(run_dir):
        raise click.ClickException(f"{run_dir} is not a local directory: give --out")
    if not _is_remote(run_dir):
        try:
            check_run(LocalFiles(), run_dir)
        except StreamAssignError as exc:
            raise click.ClickException(str(exc)) from exc
    _preflight(master)

    with _one_line_failures("writing the report"), _session(master) as session:
        if _is_remote(run_dir):
            try:
                check_run(files_for(run_dir, session), run_dir)
            except StreamAssignError as exc:
                raise click.ClickException(str(exc)) from exc
        page = _render(session, run_dir, out)
    click.echo(f"report: {page}")
    click.echo(f"next: open {page.as_uri()} in a browser")


def _int_list(value: str, option: str) -> tuple[int, ...]:
    try:
        items = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(
            f"expected integers such as 0,1,2, got {value!r}", param_hint=option
        ) from None
    if not items or min(items) < 0:
        raise click.BadParameter(f"expected integers >= 0, got {value!r}", param_hint=option)
    return items


@main.command("plan-standbys")
@_topology_argument
@_shown(
    "--scenarios", kind=click.IntRange(min=1), default=100, help="Failure traces per candidate."
)
@_shown(
    "--standbys", "standby_list", kind=str, default="0,1,2", help="num_standby_replicas candidates."
)
@_shown(
    "--warmups", "warmup_list", kind=str, default="0,2", help="Warmup-replica candidates (0: none)."
)
@_shown(
    "--restore-rate",
    kind=float,
    default=20_000.0,
    help="Records per second a restoring task reads.",
)
@_shown(
    "--detection",
    kind=float,
    default=45.0,
    help="Seconds before a crashed client's tasks move (session timeout).",
)
@_shown(
    "--probing-interval",
    kind=float,
    default=600.0,
    help="Seconds between probing rebalances that complete warmed-up moves.",
)
@_shown(
    "--target", kind=float, default=0.9999, help="Availability to reach (share of task-time up)."
)
@_acceptable_lag_option("Lag (records) at which a client counts as caught up.")
@_out_dir_option("Also write plan.csv and plan.json here.")
@_json_option("a table")
@_with_options(_model_options)
@_ship_code_option
def plan_standbys(
    topology_file: Path,
    scenarios: int,
    standby_list: str,
    warmup_list: str,
    restore_rate: float,
    detection: float,
    probing_interval: float,
    target: float,
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
) -> None:
    """Recommend num_standby_replicas and warmups for TOPOLOGY_FILE under a failure model."""
    from .pipeline.standbys import AvailabilityModel, PlanJob, recommend, summarize

    _require("pyspark", "streamassign plan-standbys")
    try:
        job = PlanJob(
            workload=_workload(topology_file, partitions),
            model=_model(model_file, params, steps),
            availability=AvailabilityModel(
                restore_rate=restore_rate,
                detection_s=detection,
                probing_interval_s=probing_interval,
                target=target,
            ),
            scenarios=scenarios,
            seed=seed,
            standby_candidates=_int_list(standby_list, "--standbys"),
            warmup_candidates=_int_list(warmup_list, "--warmups"),
            acceptable_recovery_lag=acceptable_lag,
        )
    except (StreamAssignError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    _preflight(master, job.workload, job.model)
    from .pipeline import spark as sp
    from .pipeline.progress import run_tracked, stderr_console

    with (
        _one_line_failures("planning standbys"),
        _session(master, ship_code) as session,
    ):
        totals = run_tracked(
            session,
            "evaluating standby candidates",
            stderr_console(),
            lambda: sp.run_plan(session, job),
        )
    rows = summarize(totals, job.availability)
    best, why = recommend(rows, target)
    if out is not None:
        from .pipeline.report import write_csv

        out.mkdir(parents=True, exist_ok=True)
        write_csv(out / "plan.csv", rows, list(rows[0]))
        (out / "plan.json").write_text(
            json.dumps({"candidates": rows, "recommended": dict(best), "why": why}, indent=2)
        )
    if as_json:
        click.echo(
            json.dumps({"candidates": rows, "recommended": dict(best), "why": why}, indent=2)
        )
        return
    table = Table(title=f"Standby plans for {job.workload.name} ({scenarios} failure traces)")
    for col in (
        "standbys",
        "warmups",
        "availability",
        "outage/day (task-s)",
        "worst outage p99 (s)",
        "standby load",
        "bootstrap/h (records)",
        "warmup load",
        "move delay (s)",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        mark = " *" if r is best else ""
        table.add_row(
            f"{r['standbys']}{mark}",
            str(r["warmups"]),
            f"{r['availability']:.6f}",
            f"{r['outage_per_day_s']:,.1f}",
            f"{r['worst_outage_p99_s']:,.1f}",
            f"{r['standby_load']:.2f}",
            f"{r['bootstrap_per_hour']:,.0f}",
            f"{r['warmup_load']:.4f}",
            f"{r['convergence_s']:,.0f}",
        )
    console = Console()
    console.print(table)
    console.print(f"recommended: {why}")
    # Plain lines (not rich's, which wrap at the log's width): paths and commands to copy.
    if out is not None:
        click.echo(f"written: {out / 'plan.csv'}, {out / 'plan.json'}")
    click.echo(
        f"next: streamassign simulate {topology_file} --standbys {best['standbys']} "
        "--assignors task:sticky,task:ha --report  (the rebalances under this plan)"
    )
