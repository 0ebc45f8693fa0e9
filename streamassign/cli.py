"""Command line: ``streamassign plan`` shows the tasks, the assignment and its quality.

A thin layer over the core: it reads a topology file and a clients file, runs the grouper, the
sticky task assignor and the thread distribution, and prints tables (rich) or JSON.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import click
from rich.console import Console
from rich.table import Table

from ._ids import TaskId, TopicPartition
from .assignment import ClientAssignment, ClientState
from .errors import StreamAssignError
from .grouper import PartitionGrouper
from .metrics import AssignmentMetrics, evaluate
from .sticky import StickyTaskAssignor
from .threads import distribute_to_threads
from .topology import load_topology_file

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
        bad = sorted(set(table) - set(_CLIENT_KEYS))
        if bad:
            raise ValueError(f"{label}: unknown keys {bad}; allowed: {list(_CLIENT_KEYS)}")
        if "process_id" not in table:
            raise ValueError(f"{label}: process_id is required")
        try:
            clients.append(ClientState(**table))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{label} ({table['process_id']!r}): {exc}") from exc
    return clients


def parse_partitions(values: Sequence[str]) -> dict[str, int]:
    """``["orders=12", "customers=12"]`` -> counts; a clear error for any other form."""
    counts: dict[str, int] = {}
    for value in values:
        for item in filter(None, (v.strip() for v in value.split(","))):
            topic, sep, count = item.rpartition("=")
            if not sep or not topic or not count.isdigit() or int(count) < 1:
                raise click.BadParameter(f"expected TOPIC=COUNT with COUNT >= 1, got {item!r}")
            counts[topic] = int(count)
    return counts


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
    names = [f"{client.process_id}-{k}" for k in range(client.capacity)]
    return distribute_to_threads(assignment, names, stateful=stateful)


@click.group()
@click.version_option(package_name="streamassign")
def main() -> None:
    """Task and partition assignment for Python stream processors."""


@main.command()
@click.argument("topology_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--partitions",
    "-p",
    multiple=True,
    metavar="TOPIC=N[,TOPIC=N]",
    help="Partition counts of external topics (override the file's [partitions] table).",
)
@click.option(
    "--clients",
    "clients_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="TOML file of [[client]] tables (process_id, capacity, prev_active, ...).",
)
@click.option("--num-clients", type=click.IntRange(min=1), help="Fresh clients (no history).")
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Threads per fresh client (with --num-clients).",
)
@click.option(
    "--standbys",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="num_standby_replicas for stateful tasks.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
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
    try:
        loaded = load_topology_file(topology_file)
        counts = {**loaded.partitions, **parse_partitions(partitions)}
        tasks = PartitionGrouper().group(loaded.topology, counts)
        if clients_file is not None:
            clients = load_clients(clients_file)
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
