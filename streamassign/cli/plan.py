"""``streamassign plan``: group a topology into tasks, assign them to clients, print the tables
or JSON (with ``--before``: the moves from a saved assignment)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import click
from rich.table import Table

from .. import TaskId, TopicPartition
from ..assignment import ClientAssignment, ClientState
from ..compare import (
    TaskSource,
    TaskTable,
    other_partitions_warning,
    standby_doubt,
)
from ..errors import ClientsFileError, StreamAssignError
from ..explain import (
    ClaimConflicts,
    ClientView,
    Snapshot,
    claim_conflicts,
    explain,
    views_from_assignment,
    views_from_clients,
)
from ..grouper import PartitionGrouper
from ..metrics import AssignmentMetrics, evaluate
from ..sticky import StickyTaskAssignor
from ..text import counted, listed, partitions_by_topic
from ..threads import distribute_to_threads
from ..topology import Topology, load_topology_file
from .console import _say, _Stdout
from .group import main
from .inputs import _check_partition_topics, _check_task_count, load_clients, parse_partitions
from .labels import _is_uuid, _process_labels
from .options import (
    _EXISTING_FILE,
    _given,
    _json_option,
    _partitions_option,
    _shown,
    _standbys_option,
    _topology_argument,
)
from .snapshots import _MAX_SAVED_BYTES, _read_snapshot
from .views import (
    _ids,
    _moves_json,
    _print_moves,
    _tasks_cell,
    _too_few_for_standbys,
    _warn_conflicts,
)


def _metrics_rows(m: AssignmentMetrics) -> list[tuple[str, str]]:
    return [
        ("tasks / clients", f"{m.tasks} / {m.clients}"),
        ("actives balanced in total (floor/ceil of share)", "yes" if m.active_balanced else "NO"),
        ("actives balanced per subtopology", "yes" if m.subtopology_balanced else "NO"),
        ("active imbalance (tasks per thread, max - min)", f"{m.active_imbalance:.2f}"),
        ("load imbalance (active+standby per thread)", f"{m.load_imbalance:.2f}"),
        ("moves / lower bound", f"{m.moves} / {m.move_lower_bound}"),
        ("standbys placed / required", f"{m.standbys_placed} / {m.standbys_required}"),
        # A previous standby that became active is neither: the explain table counts it among
        # the copies dropped, and says how many became active.
        (
            "previous standbys kept / dropped (not counting any now active)",
            f"{m.standbys_kept} / {m.standbys_dropped}",
        ),
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


@main.command()
@_topology_argument
@_partitions_option("Partition counts of external topics (override the file's [partitions] table).")
@click.option(
    "--clients",
    "clients_file",
    type=_EXISTING_FILE,
    help="TOML file of [[client]] tables (process_id, capacity, prev_active, ...), or a "
    "saved assignment (describe --json of the live group: a what-if from what it runs now).",
)
@click.option("--num-clients", type=click.IntRange(min=1), help="Fresh clients (no history).")
@_shown(
    "--threads",
    kind=click.IntRange(min=1),
    default=1,
    help="Threads per fresh client (with --num-clients).",
)
@_standbys_option(
    None,
    "num_standby_replicas for stateful tasks [default: a saved assignment's (describe --json "
    "states it), else 0]",
)
@click.option(
    "--explain", "show_moves", is_flag=True, help="Also list every task that moved, and why."
)
@_json_option("tables")
def plan(
    topology_file: Path,
    partitions: tuple[str, ...],
    clients_file: Path | None,
    num_clients: int | None,
    threads: int,
    standbys: int | None,
    show_moves: bool,
    as_json: bool,
) -> None:
    """Group TOPOLOGY_FILE into tasks and assign them to clients."""
    if (clients_file is None) == (num_clients is None):
        raise click.UsageError("give exactly one of --clients FILE or --num-clients N")
    if clients_file is not None and _given("threads"):
        raise click.UsageError(
            "--threads is for --num-clients; with --clients each client's capacity in the file "
            "is its thread count"
        )
    overrides = parse_partitions(partitions)
    try:
        loaded = load_topology_file(topology_file)
    except (StreamAssignError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    _check_partition_topics(loaded.topology, overrides)
    from ..pipeline.preflight import MAX_CLIENTS

    if num_clients is not None and num_clients > MAX_CLIENTS:
        raise click.BadParameter(
            f"{num_clients:,} clients: the limit is {MAX_CLIENTS:,} (an assignment to 100,000 "
            "clients takes about 3 s)",
            param_hint="'--num-clients'",
        )
    from ..pipeline.scenarios import Workload

    try:
        counts = {**loaded.partitions, **overrides}
        # The pipeline's checks of a topology and its counts (no count for a topic, no task at
        # all), so that plan refuses what simulate refuses, in the same words.
        name = loaded.topology.name or topology_file.stem
        Workload.from_topology(loaded.topology, counts, name, str(topology_file))
        _check_task_count(loaded.topology, counts)
        tasks = PartitionGrouper().group(loaded.topology, counts)
        clients, saved = _plan_clients(clients_file, num_clients, threads, MAX_CLIENTS)
        stateful = {t for t in tasks if t.subtopology in loaded.topology.stateful_subtopologies}
        planned = _plan_standbys(standbys, saved, clients_file, stateful=bool(stateful))
        result = StickyTaskAssignor(planned.count).assign(tasks, clients, stateful)
    except (StreamAssignError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    if saved is not None:
        _say(_other_partitions_than_saved(saved, str(clients_file), loaded.topology, tasks))
    _warn_ignored_input(tasks, clients, planned.count, len(stateful))
    departed = saved.departed if saved is not None else {}
    outcome = _PlanResult(tasks, clients, result, planned, stateful, departed)
    _show_plan(loaded.topology.name, outcome, show_moves=show_moves, as_json=as_json)


def _other_partitions_than_saved(
    saved: Snapshot, where: str, topology: Topology, tasks: TaskTable
) -> str | None:
    """The warning line when the topology's ``tasks`` read other partitions than the saved
    assignment (``where``) says its tasks read (``compare.other_partitions_warning``)."""
    return other_partitions_warning(
        TaskSource(where, _sources_only(saved.tasks, topology), saved.group),
        TaskSource("the topology", tasks, topology.name or None),
    )


def _sources_only(tasks: TaskTable, topology: Topology) -> TaskTable:
    """A saved assignment's task table without the partitions of ``topology``'s store
    changelogs: the Faust drop-in assigns a table's changelog partition with its task (a
    snapshot of it lists them), while a topology lists source topics only, and compared as
    they are every stateful task read as a topology change that removed the changelog."""
    if not topology.name:
        return tasks
    changelogs = {topology.changelog_topic(store) for store in topology.stores}
    return {t: frozenset(tp for tp in ps if tp.topic not in changelogs) for t, ps in tasks.items()}


@attrs.frozen
class _PlannedStandbys:
    """``plan``'s standbys per stateful task, and whether ``describe`` inferred that count (a
    saved assignment's, not given to it with ``--standbys``)."""

    count: int
    inferred: bool = False
    #: The processes describe inferred ``count`` over (``Snapshot.inferring_processes``),
    #: which ``plan --json`` passes on so that a what-if of it keeps the cap note.
    inferred_from: int | None = None


def _plan_standbys(
    given: int | None, saved: Snapshot | None, clients_file: Path | None, *, stateful: bool
) -> _PlannedStandbys:
    """``plan``'s standbys: ``--standbys``, else a saved assignment's (a what-if from a group
    running with standbys would otherwise drop them all), said on stderr; else 0. A count
    that may be below the app's (``compare.standby_doubt``) is said too. Nothing is said for a
    topology without ``stateful`` tasks: it places no standby, whatever the count."""
    if given is not None or saved is None:
        return _PlannedStandbys(given or 0)
    count = saved.num_standby_replicas
    inferred_from = saved.inferring_processes() if saved.standbys_inferred else None
    if not stateful:
        return _PlannedStandbys(count or 0, saved.standbys_inferred, inferred_from)
    if count is None:  # a hand-written file (or plan --json's before it said its count)
        most = saved.most_standbys()
        if most:
            click.echo(
                f"warning: {clients_file} states no num_standby_replicas and --standbys is not "
                f"given: planned with 0, which drops its standbys (up to {most} per task); "
                "give --standbys",
                err=True,
            )
        return _PlannedStandbys(0)
    doubt = standby_doubt(saved, count, f"{clients_file}")
    if doubt:
        click.echo(doubt, err=True)
    elif count:  # 0 is the default without a file too: nothing to say
        how = ", which describe inferred: the most any task had" if saved.standbys_inferred else ""
        click.echo(
            f"note: --standbys {count} from {clients_file} (its num_standby_replicas{how}); "
            "give --standbys for the app's",
            err=True,
        )
    return _PlannedStandbys(count, saved.standbys_inferred, inferred_from)


def _plan_clients(
    clients_file: Path | None, num_clients: int | None, threads: int, max_clients: int
) -> tuple[list[ClientState], Snapshot | None]:
    """The clients of ``plan``: read from ``clients_file`` (at most ``max_clients``), or
    ``num_clients`` fresh ones with ``threads`` each; and the saved assignment they were read
    from (None: TOML tables, or fresh clients)."""
    if clients_file is not None:
        clients, saved = _load_plan_clients(clients_file)
        if len(clients) > max_clients:
            raise click.ClickException(
                f"{clients_file}: {len(clients):,} clients, the limit is {max_clients:,}"
            )
        return clients, saved
    assert num_clients is not None
    return [ClientState(f"client-{k}", capacity=threads) for k in range(num_clients)], None


def _load_plan_clients(path: Path) -> tuple[list[ClientState], Snapshot | None]:
    """``plan``'s clients file: TOML ``[[client]]`` tables, or a saved assignment (a JSON
    object: ``describe --json`` of the live group, or ``plan --json``) read as the clients
    that run it now (``Snapshot.clients``), with the snapshot itself."""
    if not _is_json(path):
        return load_clients(path), None
    snapshot = _read_snapshot(path)
    if snapshot.family not in (None, "streams"):
        raise ClientsFileError(
            f"{path}: a snapshot of a group of protocol family {snapshot.family}, whose task "
            "ids do not name the topology's subtopologies: --clients takes a streams-protocol "
            "group's describe --json (ProcessHost, the Faust drop-in assignor), plan --json "
            "output or TOML [[client]] tables"
        )
    try:
        clients = snapshot.clients()
    except ValueError as exc:  # a process id or a capacity ClientState refuses
        raise ClientsFileError(f"{path}: {exc}") from exc
    if not clients:
        raise ClientsFileError(f"{path}: no process in its 'assignment' table")
    return clients, snapshot


def _is_json(path: Path) -> bool:
    """Whether a clients file is JSON, by the first character of its text past a byte order
    mark and whitespace: ``{`` always (TOML never starts with a brace); ``[`` or ``"`` when the
    whole text parses as JSON (TOML's ``[[client]]`` and quoted keys start so too), so that a
    JSON array or string gets a JSON file's error, not "invalid TOML"."""
    try:
        with path.open("rb") as fh:
            text = fh.read(_MAX_SAVED_BYTES + 1)
    except OSError as exc:
        raise ClientsFileError(f"{path}: cannot read the clients file: {exc}") from exc
    first = text.removeprefix(b"\xef\xbb\xbf").lstrip()[:1]
    if first == b"{":
        return True
    if first not in (b"[", b'"'):
        return False
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


@attrs.frozen
class _PlanResult:
    """What ``plan`` shows: the topology's ``tasks``, the ``clients`` and their ``result``,
    the ``standbys`` planned, the ``stateful`` tasks, and ``departed``: processes a what-if
    removed from a saved assignment, with what they ran (their tasks moved off a client that
    left)."""

    tasks: Mapping[TaskId, frozenset[TopicPartition]]
    clients: Sequence[ClientState]
    result: Mapping[str, ClientAssignment]
    standbys: _PlannedStandbys
    stateful: set[TaskId]
    departed: Mapping[str, ClientView]


def _show_plan(name: str, outcome: _PlanResult, *, show_moves: bool, as_json: bool) -> None:
    """Print ``plan``'s result: tables (and the moves with ``show_moves``), or JSON."""
    clients, result = outcome.clients, outcome.result
    capacities = {c.process_id: c.capacity for c in clients}
    metrics = evaluate(outcome.tasks, clients, result, outcome.standbys.count, outcome.stateful)
    per_thread = {
        c.process_id: _threads_of(c, result[c.process_id], outcome.stateful) for c in clients
    }
    lags = {c.process_id: c.lags for c in clients}
    moves = explain(
        _before_views(clients, outcome.departed),
        views_from_assignment(result, capacities),
        lags,
        outcome.stateful,
        claim_lags=lags,  # real lags: duplicate claims resolved as the assignor resolved them
    )
    if as_json:
        data = _as_json(outcome.tasks, result, per_thread, metrics, capacities)
        data |= _moves_json(moves)
        # What a what-if from this file (plan --clients) takes as its default --standbys.
        data["metrics"]["num_standby_replicas"] = outcome.standbys.count
        data["metrics"]["num_standby_replicas_inferred"] = outcome.standbys.inferred
        data["metrics"]["num_standby_replicas_processes"] = outcome.standbys.inferred_from
        click.echo(json.dumps(data, indent=2))
    else:
        # Labelled as describe labels them: rich cut full UUIDs at 80 columns (…), and the
        # moves named them otherwise than the Assignment table, which keeps the names a
        # clients file gives whole.
        labels = _process_labels([*(c.process_id for c in clients), *outcome.departed])
        named = {pid: label if _is_uuid(pid) else pid for pid, label in labels.items()}
        _print_tables(name, outcome.tasks, clients, result, per_thread, metrics, named)
        if show_moves:
            _print_moves(_Stdout(), moves, labels=labels)


def _before_views(
    clients: Sequence[ClientState], departed: Mapping[str, ClientView]
) -> dict[str, ClientView]:
    """The assignment a plan moves tasks from: the clients' own, and the ``departed``
    processes' for the tasks no present client claims (a departed row never outranks a
    present owner)."""
    claimed = {t for c in clients for t in c.prev_active}
    gone = {
        pid: ClientView(None, ClientAssignment(v.assignment.active - claimed, v.assignment.standby))
        for pid, v in departed.items()
    }
    return gone | views_from_clients(clients)


def _warn_ignored_input(
    tasks: Mapping[TaskId, object],
    clients: Sequence[ClientState],
    standbys: int,
    stateful_count: int,
) -> None:
    """One warning line for each kind of input ``plan`` takes but cannot use."""
    for c in clients:
        unknown = sorted((c.prev_active | c.prev_standby | c.lags.keys()) - tasks.keys())
        if unknown:
            click.echo(
                f"warning: client {c.process_id!r} reports {counted(len(unknown), 'task')} the "
                f"topology does not have (ignored): {listed(unknown)}",
                err=True,
            )
    conflicts = claim_conflicts(
        views_from_clients(clients), {c.process_id: c.lags for c in clients}
    )
    # Claims of tasks outside the topology are ignored (the warning above): no conflict.
    _warn_conflicts(
        ClaimConflicts(
            tuple(d for d in conflicts.duplicate_actives if d[0] in tasks),
            tuple(b for b in conflicts.active_and_standby if b[0] in tasks),
        ),
        "",
    )
    too_few = _too_few_for_standbys(standbys, len(clients), stateful_count)
    if too_few:
        click.echo(f"warning: {too_few}", err=True)


def _as_json(
    tasks: Mapping[TaskId, frozenset[TopicPartition]],
    result: Mapping[str, ClientAssignment],
    per_thread: Mapping[str, Mapping[str, ClientAssignment]],
    metrics: AssignmentMetrics,
    capacities: Mapping[str, int],
) -> dict[str, Any]:
    return {
        "tasks": {str(t): sorted([tp.topic, tp.partition] for tp in p) for t, p in tasks.items()},
        "assignment": {
            pid: {
                "capacity": capacities[pid],
                "active": _ids(a.active),
                "standby": _ids(a.standby),
                "warmup": _ids(a.warmup),
                "threads": {
                    th: {"active": _ids(x.active), "standby": _ids(x.standby)}
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
    labels: Mapping[str, str],
) -> None:
    console = _Stdout()
    table = Table(title=f"Tasks of {name or 'the topology'} ({len(tasks)})")
    table.add_column("task")
    table.add_column("source partitions")
    for t, parts in tasks.items():
        table.add_row(str(t), partitions_by_topic(parts))
    console.print(table)

    table = Table(title="Assignment")
    for col in ("client", "threads", "active", "standby", "per thread (active+standby)"):
        table.add_column(col)
    for c in sorted(clients, key=lambda c: c.process_id):
        a = result[c.process_id]
        split = "/".join(str(x.load) for x in per_thread[c.process_id].values())
        table.add_row(
            labels[c.process_id],
            str(c.capacity),
            _tasks_cell(a.active),
            _tasks_cell(a.standby),
            split,
        )
    console.print(table)

    table = Table(title="Quality")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for row in _metrics_rows(metrics):
        table.add_row(*row)
    console.print(table)
