"""Command line: ``streamassign plan`` shows the tasks, the assignment and its quality;
``simulate``, ``report`` and ``plan-standbys`` run the Spark pipeline (docs/pipeline.md).

A thin layer over the core: ``plan`` reads a topology file and a clients file, runs the grouper,
the sticky task assignor and the thread distribution, and prints tables (rich) or JSON. The
pipeline commands validate every input, then hand over to ``streamassign.pipeline.spark``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import re
import select
import shlex
import stat
import sys
import textwrap
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, TextIO, TypeVar

import attrs
import click
from rich.console import Console
from rich.measure import Measurement
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from . import TaskId, TopicPartition
from .assignment import ClientAssignment, ClientState
from .compare import (
    PartitionNames,
    SnapshotsCompared,
    TaskSource,
    compare_snapshots,
    landing_state,
    match_views,
    other_partitions_warning,
    standby_doubt,
)
from .errors import ClientsFileError, ExecutorCodeError, PublishError, StreamAssignError
from .explain import (
    ClaimConflicts,
    ClientView,
    Explanation,
    Reason,
    Snapshot,
    StandbyMove,
    claim_conflicts,
    explain,
    load_snapshot,
    named_as_after,
    views_from_assignment,
    views_from_clients,
)
from .files import load_toml, sync_directory, write_atomically
from .grouper import PartitionGrouper, resolve_partition_counts
from .metrics import AssignmentMetrics, evaluate
from .sticky import StickyTaskAssignor
from .streams import (
    ACCEPTABLE_RECOVERY_LAG,
    FAUST_PROTOCOL_NAME,
    handed_back,
    merge_offset_sums,
)
from .text import counted, exact_number, listed, partitions_by_topic
from .threads import distribute_to_threads
from .topology import Topology, load_topology_file

_PARTITIONS = "'--partitions'"

_CLIENT_KEYS = ("process_id", "capacity", "prev_active", "prev_standby", "lags", "rack", "tags")


def load_clients(path: str | Path) -> list[ClientState]:
    """Read ``[[client]]`` tables from a TOML file into ``ClientState``s.

    Keys: ``process_id`` (required), ``capacity``, ``prev_active``, ``prev_standby`` (task ids
    such as ``"0_3"``), ``lags`` (table: task id -> int), ``rack`` (string), ``tags`` (table:
    string -> string). Any problem raises ``ClientsFileError`` (a ``ValueError``) naming the file,
    the client and the key.
    """
    where = str(path)
    data = load_toml(path, ClientsFileError, "clients file")
    unknown = sorted(set(data) - {"client"})
    if unknown:
        raise ClientsFileError(
            f"{where}: unknown top-level keys {unknown} (expected [[client]] tables)"
        )
    tables = data.get("client", [])
    if not isinstance(tables, list) or not tables:
        raise ClientsFileError(f"{where}: no [[client]] tables")
    clients = [_client(table, f"{where}: client #{n}") for n, table in enumerate(tables, 1)]
    first: dict[str, int] = {}
    for n, client in enumerate(clients, 1):
        earlier = first.setdefault(client.process_id, n)
        if earlier != n:
            raise ClientsFileError(
                f"{where}: clients #{earlier} and #{n} have the same process_id "
                f"{client.process_id!r} (each process of a group has its own)"
            )
    return clients


def _client(table: object, label: str) -> ClientState:
    """One ``[[client]]`` table as a ``ClientState``; ``ClientsFileError`` starting with
    ``label`` (and the process id once known) otherwise."""
    if not isinstance(table, dict):
        raise ClientsFileError(f"{label}: expected a [[client]] table, got {table!r}")
    bad = sorted(set(table) - set(_CLIENT_KEYS))
    if bad:
        raise ClientsFileError(f"{label}: unknown keys {bad}; allowed: {list(_CLIENT_KEYS)}")
    if "process_id" not in table:
        raise ClientsFileError(f"{label}: process_id is required")
    if type(table["process_id"]) is int:  # `process_id = 1` in TOML: read as text
        table = {**table, "process_id": str(table["process_id"])}
    try:
        return ClientState(**table)
    except (TypeError, ValueError) as exc:
        pid = table["process_id"]
        reason = str(exc).removeprefix(f"client {pid!r}: ")  # named in the label already
        raise ClientsFileError(f"{label} ({pid!r}): {reason}") from exc


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
            if counts.get(topic, int(count)) != int(count):
                raise click.BadParameter(
                    f"{topic} given twice, as {counts[topic]} and {count}", param_hint=_PARTITIONS
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


def _tasks_cell(tasks: frozenset[TaskId]) -> str:
    """A table cell of tasks: ``3: 0_1, 0_4, 1_2``, or ``0`` for none."""
    return f"{len(tasks)}: {listed(sorted(tasks))}" if tasks else "0"


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


# -- options of several commands: one definition each, so that help text and checks agree ----------

_F = TypeVar("_F", bound=Callable[..., Any])

#: An input file that must exist (topology, clients, scenario model).
_EXISTING_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)

_topology_argument = click.argument("topology_file", type=_EXISTING_FILE)


def _shown(
    *decls: str, kind: Any, default: object, help: str, callback: Any = None
) -> Callable[[_F], _F]:
    """An option of type ``kind`` whose default ``--help`` shows."""
    return click.option(
        *decls, type=kind, default=default, show_default=True, help=help, callback=callback
    )


def _pipeline_limit(name: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A click callback: the value (or each of a list) within the pipeline's limit ``name``
    (``pipeline.scenarios.MAX_*``, or ``SEED_RANGE``), checked while parsing, so the error names
    the option and exits 2 like any bad option; the pipeline is imported only then."""

    def check(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        _check_limit(name, () if value is None else (value,))
        return value

    return check


#: What a limit's error adds: how to get past it (docs/pipeline.md, Limits, says why).
_LIMIT_HINTS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "MAX_SCENARIOS": " (a bound on one run's size: for more traces, run again with another "
        "--seed and --out; docs/pipeline.md, Limits)",
    }
)


def _check_limit(name: str, values: Iterable[int], option: str | None = None) -> None:
    """Each of ``values`` within the pipeline's limit ``name`` (see ``_pipeline_limit``);
    ``option`` names a list option (``--standbys 0,1,2``), whose error says "each"."""
    from .pipeline import scenarios

    limit = getattr(scenarios, name)
    low, high = limit if isinstance(limit, tuple) else (None, limit)
    for item in values:
        if item > high or (low is not None and item < low):
            span = f"at most {high:,}" if low is None else f"within {low:,} to {high:,}"
            each = " each" if option else ""
            hint = _LIMIT_HINTS.get(name, "")
            raise click.BadParameter(f"{span}{each}, got {item:,}{hint}", param_hint=option)


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


def _scenarios_option(default: int, help: str) -> Callable[[_F], _F]:
    """``--scenarios N``: the traces a pipeline command runs (at most the pipeline's limit)."""
    return _shown(
        "--scenarios",
        kind=click.IntRange(min=1),
        default=default,
        help=help,
        callback=_pipeline_limit("MAX_SCENARIOS"),
    )


def _standbys_option(default: int | None, help: str) -> Callable[[_F], _F]:
    """``--standbys N``: num_standby_replicas of the assignor a command runs."""
    return _shown(
        "--standbys",
        kind=click.IntRange(min=0),
        default=default,
        help=help,
        callback=_pipeline_limit("MAX_REPLICAS"),
    )


def _acceptable_lag_option(help: str) -> Callable[[_F], _F]:
    return _shown("--acceptable-lag", kind=click.IntRange(min=0), default=10_000, help=help)


def _pipeline_default(name: str) -> Callable[[], Any]:
    """A default that is a constant of ``pipeline.simulate`` (``RESTORE_RATE``, ``WARMUPS``,
    ...), read only when a command uses it: the CLI loads no pipeline module when it starts."""

    def default() -> Any:
        from .pipeline import simulate

        return getattr(simulate, name)

    return default


class _PipelineDefaultOption(click.Option):
    """An option whose default is a pipeline constant (a callable, called only when needed),
    shown in ``--help`` as its value rather than click's "(dynamic)"."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        # The finished line, not click 8.2's get_help_extra: click 8.1 (Faust 0.12 and 0.13
        # pin click < 8.2) has no such hook and writes "(dynamic)" itself.
        record = super().get_help_record(ctx)
        if record is None or not callable(self.default):
            return record
        names, text = record
        return names, text.replace("default: (dynamic)", f"default: {exact_number(self.default())}")


def _finite(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """A click callback refusing ``inf`` and ``nan``, which ``FloatRange`` lets through: inf
    fails only in Spark's executors, nan compares false with every bound."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value!r} is not a finite number")
    return value


def _pipeline_number_option(
    *decls: str, kind: Any, default: str, help: str, callback: Any = _finite, metavar: str
) -> Callable[[_F], _F]:
    """An option whose default is the pipeline constant ``default``, shown in ``--help``."""
    return click.option(
        *decls,
        type=kind,
        default=_pipeline_default(default),
        show_default=True,
        cls=_PipelineDefaultOption,
        callback=callback,
        metavar=metavar,
        help=help,
    )


def _restore_rate_option(help: str) -> Callable[[_F], _F]:
    """``--restore-rate R``: one default for simulate and plan-standbys, so that the report's
    downtime and the plan's restore outage are priced alike."""
    return _pipeline_number_option(
        "--restore-rate",
        kind=click.FloatRange(min=0, min_open=True),
        default="RESTORE_RATE",
        metavar="R",
        help=help,
    )


def _probing_interval_option(help: str) -> Callable[[_F], _F]:
    """``--probing-interval S``: task:ha's, one default for simulate and plan-standbys, and
    Kafka Streams' minimum for both (:func:`_kafkas_probing_interval`)."""
    return _pipeline_number_option(
        "--probing-interval",
        kind=float,
        default="PROBING_INTERVAL_S",
        callback=_kafkas_probing_interval,
        metavar="S",
        help=f"{help} At least 60, as Kafka Streams requires.",
    )


def _kafkas_probing_interval(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """A click callback: a finite interval Kafka Streams would take. Its ``StreamsConfig``
    refuses a ``probing.rebalance.interval.ms`` below 60000; accepted here, a shorter one
    modelled a group that cannot exist (and looked faster than any real one)."""
    from .pipeline.simulate import MIN_PROBING_INTERVAL_S as least

    _finite(ctx, param, value)
    if value < least:
        raise click.BadParameter(
            f"at least {exact_number(least)} s (Kafka Streams refuses a "
            f"probing.rebalance.interval.ms below {int(least * 1000)}), got {exact_number(value)}"
        )
    return value


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


def _spark_tasks_option(help_text: str) -> Callable[[_F], _F]:
    """``--spark-tasks N``, with what it means (and its default) for the command."""
    return click.option(
        "--spark-tasks", type=click.IntRange(min=1), default=None, metavar="N", help=help_text
    )


#: Its meaning for the commands that split work items over Spark tasks.
_SPLIT_SPARK_TASKS: Final = (
    "Spark tasks to split the work into (default: 4 x the default parallelism, or one per 100 "
    "work items if more; at most one per work item)."
)
#: For ``report``, which only aggregates: its default is not simulate's.
_REPORT_SPARK_TASKS: Final = (
    "Partitions of the aggregation's shuffles (default: the session's "
    "spark.sql.shuffle.partitions, the core count in local mode)."
)


def _quiet_stdout() -> None:
    """Send what is left for stdout to /dev/null: its reader is gone (``| head``), and the
    interpreter's last flush would otherwise fail again."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


class _ReaderGone(io.TextIOBase):
    """``sys.stdout`` while a command runs: once its reader is gone (``| head -1``, ``| grep
    -q``), what is left goes nowhere and the command goes on as if it had been read, so files
    it writes are written and its exit status is its own (a broken pipe used to end commands
    early: ``plan-standbys --out`` wrote nothing and a missed ``--target`` exited 0). Any other
    write failure (``> file`` on a full disk, ``> /dev/full``) is kept as ``failure``: the
    command goes on the same way, then ends with one line saying why (``_Commands.main``)
    rather than a trace of where the print was."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._gone = False
        #: Why writing failed, other than a broken pipe.
        self.failure: OSError | None = None

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                return self._stream.write(text)
            except OSError as exc:
                self._give_up(exc)
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except OSError as exc:
                self._give_up(exc)

    def _give_up(self, exc: OSError) -> None:
        """Write nothing more (the interpreter's last flush included)."""
        self._gone = True
        _quiet_stdout()
        if not isinstance(exc, BrokenPipeError):
            self.failure = exc

    def reader_gone(self) -> bool:
        """Whether stdout's reader is gone, asked without writing: a command that prints only
        now and then (``describe --watch``) must not poll for hours to learn it. A pipe or
        socket whose far end closed polls as an error or a hang-up; a file or a terminal
        never does (nor does a platform without ``poll``: then only a write can tell)."""
        if not self._gone:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                poller = select.poll()
                poller.register(self._stream.fileno(), 0)  # errors and hang-ups only
                if any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0)):
                    self._gone = True
                    _quiet_stdout()
        return self._gone

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._stream.encoding


class _Stdout(Console):
    """rich's console on stdout (``_ReaderGone`` makes a closed stdout quiet; rich's own
    handling would exit 1). Markup is off: table cells and titles hold client ids, endpoints,
    topic and file names, which rich would read as tags (``etl[/]`` raised MarkupError, an
    IPv6 ``[fd00::1]:8080`` lost its host); a styled line asks for it (``markup=True``) and
    escapes what it quotes. Emoji codes are off too (a client id ``etl:fire:x`` printed a
    flame)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**{"markup": False, "emoji": False, **kwargs})

    def on_broken_pipe(self) -> None:
        self.quiet = True
        _quiet_stdout()


#: An option's help extra click appends (``  [default: 1.0; x>=0.1]``): its last bracket.
_HELP_EXTRA: Final = re.compile(r"(?:^|(?<=  ))\[[^\[\]]*\]$")
#: A default's label and the word after it, in any bracket (one in an option's own text).
_DEFAULT_LABEL: Final = re.compile(r"\[default: \S+")
#: Joins an extra's words while click wraps it; a space again once wrapped.
_NO_BREAK: Final = "\u00a0"


class _HelpFormatter(click.HelpFormatter):
    """click's help, with each option's ``[default: ...; x>=0]`` whole on one line: wrapped
    as words, it broke as ``[default:`` at a line's end and ``1.0; x>=0.1]`` under it at 80
    columns, in every command. Kept whole, it moves to the next line when
    it does not fit. One wider than the text column wraps between its words (kept whole, click
    would cut it inside one; it still cuts a single word wider than the column), with
    ``[default:`` beside the word after it unless the two alone are wider than the column
    (``[default: PLAINTEXT`` at click's least width, 50: a 16-column text). An option's
    name and value wider than the help (``--security-protocol [PLAINTEXT|...|SASL_SSL]``,
    61 columns) go on lines of their own, broken between words, as wide options' text goes
    under them: click writes them whole, past the help's width."""

    def write_dl(
        self, rows: Sequence[tuple[str, str]], col_max: int = 30, col_spacing: int = 2
    ) -> None:
        term_width = self.width - self.current_indent
        rows = [row for term, text in rows for row in _fitting_term(term, text, term_width)]
        # click's own column arithmetic (HelpFormatter.write_dl), to know what fits.
        terms = max((len(click.unstyle(term)) for term, _ in rows), default=0)
        text_width = max(self.width - min(terms, col_max) - col_spacing - 2, 10)
        start = len(self.buffer)
        super().write_dl(
            [(term, _unbroken_extra(text, text_width)) for term, text in rows],
            col_max,
            col_spacing,
        )
        self.buffer[start:] = [text.replace(_NO_BREAK, " ") for text in self.buffer[start:]]


def _fitting_term(term: str, text: str, width: int) -> list[tuple[str, str]]:
    """A help row whose ``term`` (an option's names and value) is wider than ``width`` as
    rows of its lines (broken between words, each after the first indented by two), its
    ``text`` with the last; the row itself when it fits or has no space to break at."""
    if len(click.unstyle(term)) <= width:
        return [(term, text)]
    *lines, last = textwrap.wrap(
        term, width, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
    )
    return [*((line, "") for line in lines), (last, text)]


def _unbroken_extra(help_text: str, width: int) -> str:
    """``help_text`` with its trailing extra's spaces made unbreakable, and else each
    ``[default:`` joined to the word after it, where that fits ``width``."""

    def unbroken(match: re.Match[str]) -> str:
        text = match.group()
        return text if len(text) > width else text.replace(" ", _NO_BREAK)

    return _DEFAULT_LABEL.sub(unbroken, _HELP_EXTRA.sub(unbroken, help_text))


class _HelpContext(click.Context):
    """A command's context, formatting its help with :class:`_HelpFormatter`."""

    formatter_class = _HelpFormatter


class _Command(click.Command):
    """Every subcommand: its help formatted with :class:`_HelpFormatter`."""

    context_class = _HelpContext


class _Commands(click.Group):
    """The command group: a closed stdout does not end a command (``_ReaderGone``); its
    commands' help keeps each option's extra on one line (:class:`_HelpFormatter`)."""

    context_class = _HelpContext
    command_class = _Command

    def main(self, *args: Any, **kwargs: Any) -> Any:
        """Run the command line; if stdout could not be written (``--help`` and ``--version``
        included), say why in one line after whatever else the command said. A status that
        claims the output is there (0; ``TARGET_MISSED_EXIT``, "printed and written anyway")
        becomes 1; an error's own status stands."""
        stdout = sys.stdout
        sys.stdout = reader = _ReaderGone(stdout)
        try:
            return super().main(*args, **kwargs)
        except SystemExit as ended:
            reader.flush()  # what the command left buffered
            if reader.failure is None:
                raise
            reason = reader.failure.strerror or reader.failure
            click.echo(f"Error: cannot write to standard output: {reason}", err=True)
            status = 1 if ended.code in (None, 0, TARGET_MISSED_EXIT) else ended.code
            raise SystemExit(status) from reader.failure
        finally:
            sys.stdout = stdout


@click.group(cls=_Commands)
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
    from .pipeline.preflight import MAX_CLIENTS

    if num_clients is not None and num_clients > MAX_CLIENTS:
        raise click.BadParameter(
            f"{num_clients:,} clients: the limit is {MAX_CLIENTS:,} (an assignment to 100,000 "
            "clients takes about 3 s)",
            param_hint="'--num-clients'",
        )
    from .pipeline.scenarios import Workload

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
        _say(
            other_partitions_warning(
                TaskSource(str(clients_file), saved.tasks, saved.group),
                TaskSource("the topology", tasks, loaded.topology.name or None),
            )
        )
    _warn_ignored_input(tasks, clients, planned.count, len(stateful))
    departed = saved.departed if saved is not None else {}
    outcome = _PlanResult(tasks, clients, result, planned, stateful, departed)
    _show_plan(loaded.topology.name, outcome, show_moves=show_moves, as_json=as_json)


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
        _print_tables(name, outcome.tasks, clients, result, per_thread, metrics)
        if show_moves:
            # Labelled as describe labels them: rich cut full UUIDs at 80 columns (…).
            labels = _process_labels([*(c.process_id for c in clients), *outcome.departed])
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


def _too_few_for_standbys(
    standbys: int, clients: int, stateful_count: int, noun: tuple[str, str] = ("client", "clients")
) -> str | None:
    """What ``standbys`` replicas per stateful task cannot be with ``clients`` clients (or
    processes, ``noun``: singular and plural): a copy never sits beside its active, so each task
    gets at most clients - 1 (the metrics count against that cap); None when they fit."""
    if not stateful_count or standbys <= clients - 1:
        return None
    return (
        f"--standbys {standbys} needs {counted(standbys + 1, *noun)}; with {clients} each "
        f"stateful task gets {counted(max(0, clients - 1), 'standby')}"
    )


def _warn_conflicts(conflicts: ClaimConflicts, where: str) -> None:
    """One warning line (on stderr) per kind of claim no assignment can hold, naming the tasks
    and clients and saying how they are read; ``where`` (a file) starts each line."""
    prefix = f"warning: {where}: " if where else "warning: "
    duplicates = conflicts.duplicate_actives
    if duplicates:
        claims = listed(
            [f"{task} on {', '.join(pids)} ({kept} kept)" for task, pids, kept in duplicates],
            separator="; ",
        )
        click.echo(
            f"{prefix}{counted(len(duplicates), 'task')} active on several clients: "
            f"{claims}; each is taken as run by the claimant the sticky assignor keeps "
            "(smallest lag, then process id), the others as holding its state",
            err=True,
        )
    both = conflicts.active_and_standby
    if both:
        claims = listed([f"{task} on {pid}" for task, pid in both])
        click.echo(
            f"{prefix}{counted(len(both), 'task')} both active and standby on one client: "
            f"{claims}; counted as active there",
            err=True,
        )


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


def _ids(tasks: frozenset[TaskId]) -> list[str]:
    return [str(t) for t in sorted(tasks)]


def _moves_json(moves: Explanation, names: PartitionNames | None = None) -> dict[str, Any]:
    """``--json``'s moves; with ``names`` (a consumer group) each says its partition."""

    def task(t: TaskId) -> dict[str, Any]:
        return {"task": str(t)} if names is None else names.as_json(t)

    return {
        "moves": [
            task(m.task)
            | {
                "from": m.source,
                "to": m.destination,
                "reason": str(m.reason),
                "landing": None if m.landing is None else str(m.landing),
            }
            for m in moves.actives
        ],
        "standby_moves": [
            task(c.task) | {"from": c.source, "to": c.destination, "reason": str(c.reason)}
            for c in moves.standbys
        ],
    }


#: Below a moves table with a hand-back: what one snapshot cannot confirm of it.
_HANDED_BACK_NOTE = (
    "handed back: the new owner ran the task before it restarted and reported a checkpoint of "
    "it; the leader hands a task back only when that checkpoint is caught up (within "
    "acceptable_recovery_lag), which a snapshot cannot confirm (it holds no end offsets): if "
    "not, it was a balance move"
)


def _print_moves(
    console: Console,
    moves: Explanation,
    standbys: bool = True,
    labels: Mapping[str, str] | None = None,
    *,
    uncertain_hand_backs: bool = True,
    names: PartitionNames | None = None,
) -> None:
    """A table of the actives that moved and one of the standbys; one line for either kind
    when none moved (an empty bordered table reads as missing data). Without ``standbys``
    (``explain --last``: previous standbys are not known) a line says why they are missing.
    ``labels``: how the tables name processes (``_process_labels``; None: by their ids).
    ``uncertain_hand_backs``: a line says what a snapshot cannot confirm of a hand-back (false
    for the Faust leader, which measures lags as a snapshot does, without end offsets).
    ``names``: a consumer group's tasks shown by partition."""
    name = _labeller(labels)
    task = str if names is None else names.label
    first = "task" if names is None else "partition"
    if moves.actives:
        table = Table(title=f"Active tasks that moved ({len(moves.actives)})")
        for col in (first, "from", "to", "why", "state there"):
            table.add_column(col)
        for m in moves.actives:
            table.add_row(
                task(m.task), name(m.source), name(m.destination), m.reason, m.landing or "-"
            )
        console.print(table)
        # The rest had no owner in the group to move from: its owner left, or the task is new.
        console.print(
            f"{moves.moves} of {len(moves.actives)} taken off a process still in the group "
            "(the moves plan counts)"
        )
        if uncertain_hand_backs and any(m.reason == Reason.HANDED_BACK for m in moves.actives):
            console.print(_HANDED_BACK_NOTE)
    else:
        console.print("no active task moved")
    if not standbys:
        console.print(
            "standbys not shown: at a join a previous standby reports its state like any other "
            "local state (save BEFORE with describe --json to compare standbys)"
        )
    elif moves.standbys:
        _print_standby_moves(console, moves, _standby_rows(moves.standbys, name, task), first)
    else:
        console.print("no standby moved")


def _print_standby_moves(
    console: Console, moves: Explanation, rows: Sequence[Sequence[str]], first: str
) -> None:
    """The table of standby copies dropped and placed (``rows``, ``_standby_rows``; ``first``:
    what its first column names), and how many of the drops became active there."""
    # Counted per change, not per row: a row of a copy that moved is one drop and one place.
    dropped = sum(1 for c in moves.standbys if c.source is not None)
    placed = len(moves.standbys) - dropped
    table = Table(title=f"Standby copies: {dropped} dropped, {placed} placed")
    for col in (first, "dropped by", "placed on", "why"):
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    # The plan's Quality table counts only the drops of copies not now active there.
    promoted = sum(1 for c in moves.standbys if c.reason == Reason.BECAME_ACTIVE)
    if promoted:
        console.print(
            f"{promoted} of the {dropped} dropped became active where they were (not counted "
            "as previous standbys dropped)"
        )


def _labeller(labels: Mapping[str, str] | None) -> Callable[[str | None], str]:
    """A moves table's name of a process (or ``-`` for none): its label, else its id."""

    def name(pid: str | None) -> str:
        return "-" if pid is None else (labels or {}).get(pid, pid)

    return name


def _standby_rows(
    copies: Sequence[StandbyMove],
    name: Callable[[str | None], str],
    task_name: Callable[[TaskId], str] = str,
) -> list[tuple[str, str, str, str]]:
    """Table rows of the standby changes: a task whose one dropped copy and one placed copy
    have the same reason is one row (the copy moved); anything else, one row per change.
    ``name``: a process as the table shows it (``_labeller``); ``task_name``: a task."""
    by_task: dict[TaskId, list[StandbyMove]] = {}
    for copy in copies:
        by_task.setdefault(copy.task, []).append(copy)
    rows = []
    for task, changes in by_task.items():
        if len(changes) == 2:
            drop, place = sorted(changes, key=lambda c: c.source is None)
            if drop.source and place.destination and drop.reason == place.reason:
                rows.append(
                    (task_name(task), name(drop.source), name(place.destination), str(drop.reason))
                )
                continue
        for c in changes:
            rows.append((task_name(task), name(c.source), name(c.destination), str(c.reason)))
    return rows


def _print_tables(
    name: str,
    tasks: Mapping[TaskId, frozenset[TopicPartition]],
    clients: Sequence[ClientState],
    result: Mapping[str, ClientAssignment],
    per_thread: Mapping[str, Mapping[str, ClientAssignment]],
    metrics: AssignmentMetrics,
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
            c.process_id,
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


# -- saved assignments: explain and diff -----------------------------------------------------------

#: A saved assignment larger than this is refused before parsing: 100k tasks over 1,000 clients
#: take about 2 MB, so this is far past any real group and still cheap to read.
_MAX_SAVED_BYTES = 64 * 1024 * 1024


def _read_snapshot(path: Path, *, members: bool = True) -> Snapshot:
    """A saved assignment file, or one ``ClickException`` line saying what is wrong with it
    (``members`` False: its members' rows are not read, see ``load_snapshot``)."""
    try:
        if path.stat().st_size > _MAX_SAVED_BYTES:
            raise click.ClickException(f"{path}: larger than {_MAX_SAVED_BYTES} bytes")
        return load_snapshot(json.loads(path.read_bytes()), str(path), members=members)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise click.ClickException(f"{path}: cannot read a saved assignment: {reason}") from exc
    except StreamAssignError as exc:
        raise click.ClickException(str(exc)) from exc


def _read_saved(path: Path, *, members: bool = True) -> Snapshot:
    """:func:`_read_snapshot`, and a warning line per kind of claim in it that no assignment
    can hold."""
    snapshot = _read_snapshot(path, members=members)
    _warn_conflicts(claim_conflicts(snapshot.views), str(path))
    return snapshot


_saved_arguments = [
    click.argument("before", type=_EXISTING_FILE),
    click.argument("after", type=_EXISTING_FILE),
]


@main.command(name="explain")
@click.argument("files", nargs=-1, type=_EXISTING_FILE, metavar="BEFORE AFTER | --last NOW")
@click.option(
    "--last",
    is_flag=True,
    help="Explain the last rebalance from one describe --json snapshot NOW: its members' offset "
    "sums give each process's actives before it (active moves only).",
)
@_acceptable_lag_option(
    "acceptable_recovery_lag of the group's leader (ProcessHost's; the Faust assignor's is the "
    "default): a restarted process further behind is not handed a task back."
)
@_json_option("tables")
def explain_command(
    files: tuple[Path, ...], last: bool, acceptable_lag: int, as_json: bool
) -> None:
    """Every task that moved from BEFORE to AFTER, and the rule that moved it.

    Both are saved assignments ('plan --json' or 'describe --json' output). The offset sums
    in AFTER (describe --json) tell a landing on local state from a cold one. The tables name
    processes by unique prefixes, as describe's do; --json has the full ids.
    """
    if len(files) != (1 if last else 2):
        raise click.UsageError(
            "give one snapshot with --last" if last else "give BEFORE and AFTER, or --last NOW"
        )
    if last:
        now = _read_last(files[0])
        before = now.before_last_join()
        # Two processes reporting one task running: a zombie beside its task's new owner.
        _warn_conflicts(claim_conflicts(before), f"{files[0]} (before its last rebalance)")
        moves = explain(
            before,
            now.views,
            now.local_state(),
            from_last_join=True,
            returned=now.handed_back(acceptable_lag),
        )
        processes = [*before, *now.views]
        names = None  # --last refuses consumer groups: no reports
    else:
        new = _read_saved(files[1])
        compared = _compared_with(_read_saved(files[0]), new, files[0], files[1])
        old = compared.before
        # BEFORE's processes as AFTER names them: a clash of a shared process id that starts
        # or ends between the two renames the original (P <-> P#endpoint), which moved nothing.
        before_views = named_as_after(old.views, old.process_members, new.process_members)
        # AFTER's previous_active date from its last join: a hand-back made at that rebalance.
        moves = explain(
            before_views,
            new.views,
            landing_state(old, new),
            returned=new.handed_back(acceptable_lag),
        )
        processes = [*before_views, *new.views]
        names = compared.names
    if as_json:
        data = _moves_json(moves, names)
        click.echo(json.dumps({"moves": data["moves"]} if last else data, indent=2))
    else:
        # Labelled as describe labels them, unique among every process of the files.
        _print_moves(
            _Stdout(),
            moves,
            standbys=not last,
            labels=_process_labels(processes),
            uncertain_hand_backs=(now if last else new).protocol != FAUST_PROTOCOL_NAME,
            names=names,
        )


def _read_last(path: Path) -> Snapshot:
    """``explain --last``'s snapshot; refused unless its members report offset sums."""
    now = _read_saved(path)
    if not now.reports or now.family not in (None, "streams"):
        family = f" (protocol family {now.family})" if now.family else ""
        raise click.ClickException(
            f"{path}: no member reports offset sums{family}: --last needs a describe "
            "--json snapshot of a streams-protocol group (ProcessHost, the Faust drop-in "
            "assignor)"
        )
    return now


def _compared_with(old: Snapshot, new: Snapshot, before: Path, after: Path) -> SnapshotsCompared:
    """BEFORE (``old``) as ``explain``/``diff`` compare it with AFTER (``new``)
    (``compare.compare_snapshots``: a consumer group's tasks matched by partition), its note
    of a renumbering and its warnings that the files may not be one group's said on stderr."""
    compared = compare_snapshots(old, new, str(before), str(after))
    for line in compared.lines:
        click.echo(line, err=True)
    return compared


def _say(line: str | None) -> None:
    """``line`` (a warning or a note) on stderr, when there is one."""
    if line is not None:
        click.echo(line, err=True)


@main.command()
@_saved_arguments[0]
@_saved_arguments[1]
@_json_option("a table")
def diff(before: Path, after: Path, as_json: bool) -> None:
    """Per client: tasks gained (+) and lost (-) from BEFORE to AFTER (saved assignments)."""
    new_file = _read_saved(after, members=False)
    old_file = _compared_with(_read_saved(before, members=False), new_file, before, after).before
    old, new = old_file.views, new_file.views
    rows = {}
    for pid in sorted(old.keys() | new.keys()):
        was = old[pid].assignment if pid in old else ClientAssignment()
        now = new[pid].assignment if pid in new else ClientAssignment()
        changes = {
            f"{sign}{kind}": _ids(frozenset(getattr(a, kind)) - getattr(b, kind))
            for kind in ("active", "standby", "warmup")
            for sign, a, b in (("+", now, was), ("-", was, now))
        }
        if any(changes.values()) or (pid in old) != (pid in new):
            status = "joined" if pid not in old else "left" if pid not in new else "changed"
            rows[pid] = {"status": status, **changes}
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(f"{before.name} -> {after.name}: no client changed")
        return
    # Named as describe and explain name them (unique among every client of both, as there):
    # rich cut the ids' heads at 80 columns.
    labels = _process_labels(old.keys() | new.keys())
    table = Table(title=f"{before.name} -> {after.name}: {len(rows)} client(s) changed")
    for col in ("client", "status", "active", "standby", "warmup"):
        table.add_column(col)
    for pid, row in rows.items():
        cells = [
            " ".join([*(f"+{t}" for t in row[f"+{k}"]), *(f"-{t}" for t in row[f"-{k}"])]) or "="
            for k in ("active", "standby", "warmup")
        ]
        table.add_row(labels[pid], str(row["status"]), *cells)
    _Stdout().print(table)


# -- a live group: describe (and --watch) -----------------------------------------------------
#
# The Kafka-facing part is streamassign.aiokafka.describe (imported inside the command: aiokafka
# is an extra); this block only parses options and renders.


def _connection(bootstrap: str, timeout: float, security: Mapping[str, Any]) -> Any:
    import importlib.util

    if importlib.util.find_spec("aiokafka") is None:
        raise click.ClickException(
            "describe needs aiokafka, from the aiokafka extra: pip install 'streamassign[aiokafka]'"
        )
    from .aiokafka.describe import Connection

    _check_bootstrap(bootstrap)
    return Connection(bootstrap, timeout_s=timeout, **security)


def _check_bootstrap(bootstrap: str) -> None:
    """Each address of ``--bootstrap`` as aiokafka parses it (``HOST[:PORT]``, ``[IPv6]:PORT``),
    or a usage error naming the bad one: aiokafka's own says only ``invalid literal for
    int()``, after a "cannot reach"."""
    from aiokafka.conn import get_ip_port_afi

    addresses = bootstrap.strip().split(",")
    for n, address in enumerate(addresses):
        if not address.strip() and len(addresses) > 1:  # "'' is not HOST:PORT" hides the comma
            where = "before" if n == 0 else "after"
            raise click.BadParameter(
                f"{bootstrap.strip()!r} has an empty address {where} a comma (several: "
                "HOST:PORT,HOST:PORT)",
                param_hint="'--bootstrap'",
            )
        try:
            host, port, _ = get_ip_port_afi(address)
        except ValueError:
            host, port = "", 0
        if not host or not 0 < port < 65536:
            raise click.BadParameter(
                f"{address.strip()!r} is not HOST:PORT (e.g. localhost:9092; several: "
                "HOST:PORT,HOST:PORT)",
                param_hint="'--bootstrap'",
            )


#: The environment variables ``describe`` reads the SASL credentials from (click's envvar).
_SASL_ENV = {
    "sasl_username": "STREAMASSIGN_SASL_USERNAME",
    "sasl_password": "STREAMASSIGN_SASL_PASSWORD",
}


def _given(param: str) -> bool:
    """Whether the current command's ``param`` was given on the command line (not a default
    or an environment variable)."""
    source = click.get_current_context().get_parameter_source(param)
    # click.core: the top-level re-export exists only from click 8.3.3, and Faust 0.12-0.13
    # pin click<8.2.
    return source is click.core.ParameterSource.COMMANDLINE


def _option_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def _check_security(security: Mapping[str, Any]) -> None:
    """Refuse security options that cannot work together, before any client is built: SASL
    without its credentials, ``--ssl-*`` or ``--sasl-*`` options the protocol would ignore
    (a user who passes a CA file expects TLS; restating a default is no conflict), certificate
    files that are not PEM."""
    protocol = security["security_protocol"]
    sasl, tls = protocol.startswith("SASL_"), protocol.endswith("SSL")
    # Restating a default (--sasl-mechanism PLAIN) changes nothing: only other values are refused.
    defaults = {p.name: p.default for p in click.get_current_context().command.params}
    given = [
        field
        for field, value in security.items()
        if value is not None and _given(field) and value != defaults.get(field)
    ]
    ignored = [f for f in given if (f.startswith("ssl_") and not tls)]
    ignored += [f for f in given if f.startswith("sasl_") and not sasl]
    if ignored:
        ssl_option = ignored[0].startswith("ssl_")
        wanted = "SSL or SASL_SSL" if ssl_option else "SASL_PLAINTEXT or SASL_SSL"
        raise click.UsageError(
            f"{_option_name(ignored[0])} needs --security-protocol {wanted} (it is {protocol}: "
            "the option would be ignored)"
        )
    for field, env in _SASL_ENV.items():
        if sasl and security[field] is None:
            raise click.UsageError(
                f"--security-protocol {protocol} needs {_option_name(field)} (or ${env})"
            )
    if tls:
        _check_pem_files(security["ssl_cafile"], security["ssl_certfile"], security["ssl_keyfile"])


def _check_pem_files(cafile: str | None, certfile: str | None, keyfile: str | None) -> None:
    """Load the TLS files as the client will (``ssl`` and OpenSSL): one line naming the option
    and the file that cannot be used, instead of OpenSSL's ``PEM lib``."""
    import ssl

    def no_password() -> bytes:  # an encrypted key: refuse, never prompt on the terminal
        raise click.BadParameter(
            f"{keyfile or certfile}: the private key is encrypted; give an unencrypted key",
            param_hint="'--ssl-keyfile'" if keyfile else "'--ssl-certfile'",
        )

    if keyfile is not None and certfile is None:
        raise click.UsageError("--ssl-keyfile needs --ssl-certfile (the client certificate)")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    for option, path in (("--ssl-cafile", cafile), ("--ssl-certfile", certfile)):
        if path is None:
            continue
        try:
            context.load_verify_locations(cafile=path)
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise click.BadParameter(
                f"{path}: not a PEM certificate file{_ssl_reason(exc)}", param_hint=f"'{option}'"
            ) from None
    if certfile is None:
        return
    try:
        context.load_cert_chain(certfile, keyfile, password=no_password)
    except (ssl.SSLError, OSError) as exc:
        if keyfile is None:
            raise click.BadParameter(
                f"{certfile}: holds no private key matching its certificate{_ssl_reason(exc)}; "
                "give the key with --ssl-keyfile",
                param_hint="'--ssl-certfile'",
            ) from None
        raise click.BadParameter(
            f"{keyfile}: not the PEM private key of the certificate in {certfile}"
            f"{_ssl_reason(exc)}",
            param_hint="'--ssl-keyfile'",
        ) from None


def _ssl_reason(exc: Exception) -> str:
    """OpenSSL's short reason (``NO_CERTIFICATE_OR_CRL_FOUND``) in parentheses, if it gave
    one (``PEM lib`` errors give none)."""
    import ssl

    reason = exc.reason if isinstance(exc, ssl.SSLError) else str(exc)
    return f" ({reason})" if reason else ""


def _short_member(member_id: str) -> str:
    """A member id fits a narrow column by its tail (aiokafka ids end in a UUID)."""
    return member_id if len(member_id) <= 12 else "…" + member_id[-8:]


def _url_labels(urls: Iterable[str]) -> dict[str, str]:
    """Faust workers' URLs as the tables show them: each host by its shortest unique prefix
    among them, cut at the end of a DNS name label (``orders-0…`` for
    ``orders-0.orders.default.svc.cluster.local``: Kubernetes hosts share long tails), then
    its port (and path); a URL whose label another shares (the same host and port under
    another scheme) whole, scheme and all."""
    parts = {url: _host_and_rest(url) for url in set(urls)}
    prefixes = _unique_prefixes((host for host, _ in parts.values()), 1)
    labels = {}
    for url, (host, rest) in parts.items():
        # A prefix of whole labels, as a host is read: never "orders-1" for "orders-10"; an
        # IPv4 address whole (its first byte names nothing).
        ipv4 = host.replace(".", "").isdigit()
        cut = -1 if ipv4 else host.find(".", len(prefixes[host]) - 1)
        labels[url] = (host if cut < 0 else host[:cut] + "…") + rest
    shared = Counter(labels.values())
    return {url: url.rstrip("/") if shared[label] > 1 else label for url, label in labels.items()}


def _host_and_rest(url: str) -> tuple[str, str]:
    """A URL's host, and what follows it (``:port``, a path), scheme and trailing ``/`` off."""
    netloc, slash, path = url.split("://", 1)[1].rstrip("/").partition("/")
    host, colon, port = netloc.rpartition(":")
    if not colon or not port.isdigit() or host.endswith(":"):  # no port (or a bare IPv6)
        host, colon, port = netloc, "", ""
    return host, colon + port + slash + path


def _is_uuid(text: str) -> bool:
    return len(text) == 36 and text.count("-") == 4


def _unique_prefixes(ids: Iterable[str], least: int) -> dict[str, str]:
    """Each id by its shortest prefix of at least ``least`` characters that no other of
    ``ids`` starts with, as git names a commit (in sorted order only neighbours can share
    a longer prefix)."""
    ordered = sorted(set(ids))
    labels = {}
    for i, name in enumerate(ordered):
        length = least
        for other in ordered[max(i - 1, 0) : i] + ordered[i + 1 : i + 2]:
            pairs = enumerate(zip(name, other, strict=False))
            shared = next((k for k, (x, y) in pairs if x != y), min(len(name), len(other)))
            length = max(length, shared + 1)
        labels[name] = name[:length]
    return labels


def _member_labels(member_ids: Iterable[str]) -> dict[str, str]:
    """Member ids as the tables show them: each by its shortest unique tail of at least 8
    characters (a member id is its client id, which all members may share, and a UUID)."""
    ids = set(member_ids)
    tails = _unique_prefixes((m[::-1] for m in ids), 8)
    return {m: m if len(m) <= 12 else "…" + tails[m[::-1]][::-1] for m in ids}


def _process_labels(pids: Iterable[str]) -> dict[str, str]:
    """Process ids as the tables show them, none folded at 80 columns, none ambiguous: a UUID
    by its shortest unique prefix of at least 8 digits, a member id (consumer groups) by its
    unique tail, a Faust URL by its host's unique prefix and its port (``_url_labels``); any
    that reads as another's label whole. ``describe --json`` has the full ids."""
    pids = set(pids)
    labels = _unique_prefixes((p for p in pids if _is_uuid(p)), 8)
    labels |= _member_labels(p for p in pids if not _is_uuid(p) and "://" not in p)
    labels |= _url_labels(p for p in pids if "://" in p)
    # Each kind's labels are unique among that kind only: a plan's plain id "3f2a9c1e" and a
    # UUID starting with it read alike. Whole until none does (whole ids differ: it ends).
    while clashing := _clashing_labels(labels):
        labels |= {pid: _whole_id(pid) for pid in clashing}
    return labels


def _whole_id(pid: str) -> str:
    return pid.rstrip("/") if "://" in pid else pid


def _clashing_labels(labels: Mapping[str, str]) -> set[str]:
    """The ids, not yet shown whole, whose label another id's reads alike."""
    shared = Counter(labels.values())
    return {pid for pid, label in labels.items() if shared[label] > 1 and label != _whole_id(pid)}


def _client_at_host(member: Any) -> str:
    return f"{member.client_id}@{_host(member)}"


def _host(member: Any) -> str:
    """A member's host as Kafka gives it, without the leading slash (``/127.0.0.1``)."""
    return str(member.client_host.lstrip("/"))


def _state_note(state: str) -> str:
    if state in ("PreparingRebalance", "CompletingRebalance"):
        return f"{state} (rebalancing: the assignment is not readable until it is Stable)"
    if state == "Empty":
        return "Empty (no members)"
    return state


def _view_labels(view: Any, others: Iterable[str] = ()) -> dict[str, str]:
    """How ``view``'s tables name its processes (and ``others``, named in the same output),
    each unique among them all (``_process_labels``)."""
    return _process_labels([*view.processes(), *(m.process for m in view.members), *others])


def _print_group(
    console: Console, view: Any, score: Any, labels: Mapping[str, str] | None = None
) -> None:
    """``describe``'s tables of ``view``; ``labels`` name its processes (default:
    ``_view_labels``)."""
    members = len(view.members)
    processes = view.processes()
    member_labels = _member_labels(m.member_id for m in view.members)
    if not view.readable:
        console.print(f"{view.group}: {_state_note(view.state)}, {members} member(s)", markup=False)
        for m in sorted(view.members, key=lambda m: m.member_id):
            console.print(f"  {member_labels[m.member_id]}  {_client_at_host(m)}", markup=False)
        return
    # The group and protocol names are the members' choice: styled parts, never markup
    # (``escape`` gets a trailing backslash wrong).
    heading = (
        f": {view.state}, protocol {view.protocol or '-'} ({view.family}), {members} member(s) "
        f"in {len(processes)} process(es)"
    )
    leader_version = view.leader_version()
    if leader_version is not None:  # protocol 3: members announce theirs, named in the table
        heading += f", leader's topology version {leader_version}"
    console.print(Text.assemble((view.group, "bold"), heading))
    labels = dict(labels or _view_labels(view))
    _print_processes(console, processes, view.endpoints(), labels)
    _print_members(console, view.members, labels | member_labels)
    _print_tasks(console, view.tasks, processes, labels)
    _print_offset_sums(console, view.members_by_process(), labels)
    # Consumer groups have no standbys: their standby row would only say 0 / 0.
    _print_quality(console, score, has_standbys=str(view.family) != "consumer")


def _print_processes(
    console: Console,
    processes: Mapping[str, Any],
    endpoints: Mapping[str, str],
    labels: Mapping[str, str],
) -> None:
    """Each process (by its label, and its endpoint where it has one), its capacity and
    tasks."""
    table = Table(title="Processes")
    for col in ("process (endpoint)", "cap", "active", "standby", "warmup"):
        table.add_column(col, overflow="fold")
    for pid, client in processes.items():
        a = client.assignment
        table.add_row(
            labels[pid] + (f"\n({endpoints[pid]})" if pid in endpoints else ""),
            str(client.capacity),
            _tasks_cell(a.active),
            _tasks_cell(a.standby) if a.standby else "-",
            _tasks_cell(a.warmup) if a.warmup else "-",
        )
    console.print(table)


def _print_members(console: Console, members: Sequence[Any], labels: Mapping[str, str]) -> None:
    """Each member (consumer): its client, process, task counts, versions, generation; below
    the table, error codes and undecodable bytes, one line each (long text in a column
    squeezed the others to one character per line). ``labels``: of member and process ids."""
    ordered = sorted(members, key=lambda m: (m.process, m.member_id))
    # A table wider than the console folds client@host at the column's edge, mid-address
    # (127.0.0 / .1): then the host goes on a line of its own, whole, below its client id;
    # where even that column cannot be as wide as the longest host beside the others (an
    # IPv6 address is up to 40 characters with its @), the hosts go below the table, one
    # member a line, and the column holds the client id alone.
    unbounded = console.options.update_width(sys.maxsize)  # its natural width, not cut
    for layout in ("one line", "host below", "hosts after"):
        table = _members_table(ordered, labels, layout)
        if layout == "hosts after":  # the last resort, whatever its width
            break
        if layout == "one line":
            width = Measurement.get(console, unbounded, table).maximum
        else:
            width = _rendered_width(console, table)
        if width <= console.width:
            break
    console.print(table)
    for m in ordered if layout == "hosts after" else ():
        # A space before the @: a line too long for the console breaks there, not mid-host.
        console.print(f"member {labels[m.member_id]}: {m.client_id} @{_host(m)}", markup=False)
    for m in ordered:
        if m.undecodable is not None:
            # Read all the same: the leader assigns such a member, as a process of its own.
            kept = "; its assignment is read (a process of its own)" if m.assigned else ""
            console.print(f"member {m.member_id}: undecodable: {m.undecodable}{kept}")
        elif m.error not in ("", "NONE"):
            console.print(
                f"member {labels[m.member_id]} (process {labels[m.process]}): error {m.error}",
                markup=False,
            )


def _rendered_width(console: Console, table: Table) -> int:
    """The widest line of ``table`` rendered at the console's width. Not its measured minimum:
    rich widens a column squeezed below its ``min_width`` back to it after the squeeze, so a
    table whose minimum fits can still render wider than the console, which crops it."""
    lines = Segment.split_lines(console.render(table, console.options))
    return max((Segment.get_line_length(line) for line in lines), default=0)


def _members_table(ordered: Sequence[Any], labels: Mapping[str, str], layout: str) -> Table:
    """The Members table with client@host as ``layout`` says: on ``"one line"``, the host
    ``"host below"`` the client id (the column as wide as the longest host or client id: both
    whole), or the client id alone (``"hosts after"``: the caller prints the hosts below the
    table, each with its client id whole)."""
    longest = max((max(len(_host(m)) + 1, len(m.client_id)) for m in ordered), default=0)
    table = Table(title="Members")
    for col in ("member", "client@host", "process", "a+s+w", "versions", "gen"):
        # The process folds too: a URL no shorter label names (a scheme apart) is long.
        wraps = col in ("client@host", "process", "versions")
        least = 12 if col in ("client@host", "versions") else None
        if col == "client@host" and layout == "host below":
            least = max(12, longest)
        table.add_column(col, overflow="fold", no_wrap=not wraps, min_width=least)
    for m in ordered:
        client_at_host = {
            "one line": _client_at_host(m),
            "host below": f"{m.client_id}\n@{_host(m)}",
            "hosts after": m.client_id,
        }[layout]
        table.add_row(
            labels[m.member_id],
            client_at_host,
            labels[m.process] if m.assigned else "?",
            f"{len(m.active)}+{len(m.standby)}+{len(m.warmup)}" if m.assigned else "undecodable",
            (m.versions or "-")
            + (f"\ntopology {m.topology_version}" if m.topology_version else ""),
            "-" if m.generation is None else str(m.generation),
        )
    return table


def _print_tasks(
    console: Console,
    view_tasks: Mapping[TaskId, Any],
    processes: Mapping[str, Any],
    labels: Mapping[str, str],
) -> None:
    """Each task's active and standby processes, and its partitions."""
    owners: dict[TaskId, tuple[list[str], list[str]]] = {}
    for pid, client in processes.items():
        a, name = client.assignment, labels[pid]
        for kind, tasks, label in (
            (0, a.active, name),
            (1, a.standby, name),
            (1, a.warmup, f"{name} (warmup)"),
        ):
            for t in tasks:
                owners.setdefault(t, ([], []))[kind].append(label)
    table = Table(title=f"Tasks ({len(view_tasks)})")
    for col in ("task", "active on", "standbys on", "partitions"):
        table.add_column(col, overflow="fold")
    for t, parts in view_tasks.items():
        active, standby = owners.get(t, ([], []))
        table.add_row(
            str(t),
            ", ".join(active) or "NONE",
            ", ".join(standby) or "-",
            partitions_by_topic(parts),
        )
    console.print(table)


def _print_offset_sums(
    console: Console, by_process: Mapping[str, Sequence[Any]], labels: Mapping[str, str]
) -> None:
    """The offset sums each process reported at the last join (when any did)."""
    sums = {pid: merge_offset_sums(m.offset_sums for m in ms) for pid, ms in by_process.items()}
    if any(sums.values()):
        table = Table(title="Offset sums reported at the last join (running: active then)")
        table.add_column("process", overflow="fold")
        table.add_column("task=offset sum", overflow="fold")
        for pid, by_task in sums.items():
            text = ", ".join(
                f"{t}={'running' if v == -2 else v}" for t, v in sorted(by_task.items())
            )
            table.add_row(labels[pid], text or "none reported")
        console.print(table)


def _print_quality(console: Console, score: Any, has_standbys: bool = True) -> None:
    m = score.metrics
    table = Table(title="Quality of the current assignment")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("tasks / processes", f"{m.tasks} / {m.clients}")
    for b in score.per_subtopology:
        # Withheld processes (another topology version) are left out: no task of it is theirs.
        withheld = f"; {counted(b.withheld, 'process', 'processes')} withheld" if b.withheld else ""
        table.add_row(
            f"subtopology {b.subtopology}: actives per process (of {b.tasks}{withheld})",
            f"{b.fewest}-{b.most} {'balanced' if b.balanced else 'UNBALANCED'}",
        )
    table.add_row("actives balanced in total", "yes" if m.active_balanced else "NO")
    table.add_row("load imbalance (per thread, max - min)", f"{m.load_imbalance:.2f}")
    inferred = ", inferred" if score.standbys_inferred else ""
    # Required counts at most processes - 1 per task (``evaluate``): say so beside a larger R,
    # or "2 per stateful task ... 4 / 4" reads as two copies each. Short: the row fits 80
    # columns (describe piped, a narrow terminal); stderr's warning says why.
    cap = max(0, m.clients - 1)
    fit = f"{cap} fits" if cap == 1 else f"{cap} fit"
    capped = f"; {fit}" if score.num_standby_replicas > cap else ""
    if has_standbys or not score.standbys_inferred:
        table.add_row(
            f"standbys placed / required ({score.num_standby_replicas} per stateful task"
            f"{inferred}{capped})",
            f"{m.standbys_placed} / {m.standbys_required}",
        )
    if score.standbys_on_active_rack is not None:
        table.add_row("standbys on their active's rack", str(score.standbys_on_active_rack))
    console.print(table)
    if score.standbys_inferred and has_standbys:
        console.print(
            "inferred: the most standbys any task has (a lost one can hide); --standbys R "
            "checks against the app's num_standby_replicas",
            markup=False,
        )
    if score.warmups:
        console.print(
            f"{counted(score.warmups, 'warmup')} in flight: the HA assignor keeps actives on "
            "caught-up processes until the warmups catch up, so imbalance until the next "
            "probing rebalance is expected.",
            markup=False,
        )
    for problem in score.problems[:20]:
        # Styled parts, not markup: a problem names topics and ids ([b], a trailing \\).
        console.print(Text.assemble(("problem:", "red"), " ", problem))
    if len(score.problems) > 20:
        console.print(f"[red]... and {len(score.problems) - 20} more problems[/]", markup=True)
    for note in score.notes:  # a doubt that affects no task: not red, not a problem
        console.print(Text.assemble("note:", " ", note))


#: How often ``describe --watch`` asks whether stdout's reader is gone (one ``poll`` call).
_READER_CHECK_S = 0.25


async def _watch(
    connection: Any,
    group: str,
    interval: float,
    standbys: int | None,
    as_json: bool,
    acceptable_lag: int = ACCEPTABLE_RECOVERY_LAG,
) -> None:
    """Print each new view until interrupted or until stdout's reader is gone (``| grep -q
    Stable``, ``| head``): a one-shot command goes on as if read (``_ReaderGone``), but an
    endless poll that nobody reads would run headless for ever."""
    import asyncio

    stdout = sys.stdout
    printing = asyncio.ensure_future(
        _print_views(connection, group, interval, standbys, as_json, acceptable_lag)
    )
    try:
        while not printing.done():
            if isinstance(stdout, _ReaderGone) and stdout.reader_gone():
                return
            await asyncio.wait([printing], timeout=_READER_CHECK_S)
        printing.result()  # its error, if it ended with one
    finally:
        printing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await printing


async def _print_views(
    connection: Any,
    group: str,
    interval: float,
    standbys: int | None,
    as_json: bool,
    acceptable_lag: int = ACCEPTABLE_RECOVERY_LAG,
) -> None:
    from .aiokafka.describe import follow, quality, to_json

    console = _Stdout()
    last = None  # the last readable view
    last_warning: str | None = None
    async for view in follow(connection, group, interval):
        if not view.readable:
            if as_json:
                click.echo(json.dumps({"group": group, "state": view.state}))
            else:
                console.print(f"{_now()} {group}: {_state_note(view.state)}", markup=False)
            continue
        score = quality(view, standbys)
        warning = _standby_cap_warning(score)
        if warning != last_warning and warning is not None:
            click.echo(warning, err=True)  # once, not at every change of the group
        last_warning = warning
        matched = match_views(last, view)
        _say(matched.note)  # each renumbering (views between that renumber nothing have none)
        moves = _moves_since(matched.before, view, acceptable_lag)
        # One naming for both views' processes: a moves row names the ones that left too.
        labels = _view_labels(view, matched.before or ())
        last, names = view, matched.names
        if as_json:
            data = to_json(view, score) | ({} if moves is None else _moves_json(moves, names))
            click.echo(json.dumps(data))
            continue
        console.rule(f"{group} at {_now()}")
        _print_group(console, view, score, labels)
        if moves is not None:
            faust = view.protocol == FAUST_PROTOCOL_NAME
            _print_moves(console, moves, labels=labels, uncertain_hand_backs=not faust, names=names)


def _moves_since(
    before: Mapping[str, ClientView] | None, view: Any, acceptable_lag: int
) -> Explanation | None:
    """What moved from ``before`` (the last view's processes as ``view``, a ``GroupView``,
    names them: ``compare.match_views``; None: ``view`` is the first) to ``view``."""
    if before is None:
        return None
    returned = _returned(view, acceptable_lag)
    return explain(before, view.processes(), view.local_state(), returned=returned)


def _returned(view: Any, acceptable_lag: int) -> dict[TaskId, str]:
    """``explain``'s ``returned`` for a described group (a ``GroupView``): the tasks its leader
    handed back to a restarted process at the last rebalance, by the leader's own rule."""
    reports = [(pid, m.offset_sums) for pid, ms in view.members_by_process().items() for m in ms]
    return handed_back(reports, view.previous_active(), view.protocol, acceptable_lag)


def _now() -> str:
    import datetime

    return datetime.datetime.now(datetime.UTC).strftime("%H:%M:%S UTC")


@main.command()
@click.argument("group")
@click.option("--bootstrap", "-b", required=True, metavar="HOST:PORT[,...]", help="Kafka brokers.")
@click.option(
    "--security-protocol",
    type=click.Choice(["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]),
    default="PLAINTEXT",
    show_default=True,
)
@click.option(
    "--sasl-mechanism",
    type=click.Choice(["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]),
    default="PLAIN",
    show_default=True,
)
@click.option(
    "--sasl-username", envvar="STREAMASSIGN_SASL_USERNAME", help="Or $STREAMASSIGN_SASL_USERNAME."
)
@click.option(
    "--sasl-password", envvar="STREAMASSIGN_SASL_PASSWORD", help="Or $STREAMASSIGN_SASL_PASSWORD."
)
@click.option("--ssl-cafile", type=_EXISTING_FILE, help="CA certificates (PEM).")
@click.option("--ssl-certfile", type=_EXISTING_FILE, help="Client certificate (PEM).")
@click.option("--ssl-keyfile", type=_EXISTING_FILE, help="Client private key (PEM).")
@click.option(
    "--standbys",
    type=click.IntRange(min=0),
    default=None,
    help="num_standby_replicas to score against (default: the most any task has).",
)
@_shown("--timeout", kind=click.FloatRange(min=0.1), default=10.0, help="Seconds per broker call.")
@click.option(
    "--watch", is_flag=True, help="Follow rebalances: print each new assignment and what moved."
)
@_shown(
    "--interval",
    kind=click.FloatRange(min=0.1),
    default=1.0,
    help="Seconds between polls (--watch).",
)
@_acceptable_lag_option(
    "--watch: acceptable_recovery_lag of the group's leader (ProcessHost's; the Faust "
    "assignor's is the default), to tell a hand-back to a restarted process from a move."
)
@_json_option("tables (with --watch: one JSON object per line)")
def describe(
    group: str,
    bootstrap: str,
    standbys: int | None,
    timeout: float,
    watch: bool,
    interval: float,
    acceptable_lag: int,
    as_json: bool,
    **security: Any,
) -> None:
    """Who runs what in live GROUP: processes, members, tasks, offset sums and quality.

    Decodes the streams protocol (ProcessHost, the Faust assignor), Faust's own assignor and
    the consumer assignors. The tables name processes and members by unique prefixes (a
    member by its tail), as git names commits; --json has the full ids, and its "assignment"
    table is a saved assignment for `streamassign explain` / `diff`.
    """
    import asyncio

    _require("aiokafka", "streamassign describe", "aiokafka")
    from .aiokafka.describe import fetch_group, quality, to_json
    from .errors import GroupDescribeError

    # aiokafka logs connection failures through logging's last-resort handler; the one-line
    # error below says it all.
    aiokafka_log = logging.getLogger("aiokafka")
    if not aiokafka_log.handlers:
        aiokafka_log.addHandler(logging.NullHandler())
    options = {k: v if not isinstance(v, Path) else str(v) for k, v in security.items()}
    _check_security(options)
    connection = _connection(bootstrap, timeout, options)
    try:
        if watch:
            asyncio.run(_watch(connection, group, interval, standbys, as_json, acceptable_lag))
            return
        view = asyncio.run(fetch_group(connection, group))
    except GroupDescribeError as exc:
        raise click.ClickException(str(exc)) from exc
    except KeyboardInterrupt:
        return
    score = quality(view, standbys)
    warning = _standby_cap_warning(score)
    if warning is not None:
        click.echo(warning, err=True)
    if as_json:
        click.echo(json.dumps(to_json(view, score), indent=2))
    else:
        _print_group(_Stdout(), view, score)


def _standby_cap_warning(score: Any) -> str | None:
    """``plan``'s warning line (``_too_few_for_standbys``) for a described group (a
    ``GroupQuality``) too small for its ``--standbys``; None when it fits, or when the count
    was inferred (no --standbys to name)."""
    if score.standbys_inferred:
        return None
    too_few = _too_few_for_standbys(
        score.num_standby_replicas,
        score.metrics.clients,
        len(score.stateful),
        ("process", "processes"),
    )
    return None if too_few is None else f"warning: {too_few}"


# -- the simulation pipeline (Spark) ---------------------------------------------------------------
#
# Every input is checked before a SparkSession starts: a bad topology, model parameter or assignor
# name costs milliseconds, not a JVM start. Spark itself is imported only by
# streamassign.pipeline.spark, inside the commands.


def _require(module: str, what: str, extra: str = "spark") -> None:
    """One line naming the extra to install when ``module`` is missing, not an ImportError's
    trace from deep inside the command."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise click.ClickException(
            f"{what} needs {module}, from the {extra} extra: pip install 'streamassign[{extra}]'"
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


def _given_run_dir(out: str | None, name: str) -> str:
    """The run directory as the user gave it, or the default ``streamassign-runs/NAME``."""
    return out if out is not None else str(Path("streamassign-runs") / (name or "topology"))


def _run_dir(out: str | None, name: str, option: str = "--out") -> str:
    """The run directory: a Hadoop URI as given, a local path (or ``file:`` URI) absolute.
    ``option``: how the user gave ``out``, for messages (``""``: an argument)."""
    shown = f"{option} {out}" if out is not None and option else _given_run_dir(out, name)
    out = _given_run_dir(out, name)
    if _is_remote(out):
        return out.rstrip("/")
    return str(_resolved(_local_path(out), shown))


def _resolved(path: Path, shown: str) -> Path:
    """``path`` made absolute through its links, or one line (``shown`` first) naming the link
    loop on the way: ``Path.resolve`` raises ``RuntimeError`` for one (Python 3.11, 3.12)."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as exc:
        raise click.ClickException(f"{shown}: {_link_problem(path) or exc}") from exc


def _local_path(out: str) -> Path:
    """A local ``--out`` as given (a ``file:`` URI's path), not yet resolved."""
    return Path(out.removeprefix("file://").removeprefix("file:"))


def _refuse_existing(
    files: Any, run_dir: str, overwrite: bool, identity: Mapping[str, Any]
) -> dict[str, Any] | None:
    """A run is replaced only with ``--overwrite`` (and then only once the new one is done),
    and kept only when it is what the command would write: the manifest of a local, undamaged
    run of the very simulation ``identity`` (``_simulation_identity``) written by this code,
    returned. None: ``run_dir`` is free, or ``--overwrite`` replaces its run. Anything else is
    refused in one line naming what differs."""
    from .pipeline.runs import (
        MANIFEST,
        MANIFEST_FILE,
        describe_existing,
        read_manifest,
        replaceable,
        run_damage,
    )

    what = describe_existing(files, run_dir)
    if what is None:
        return None
    if not replaceable(files, run_dir, f"{MANIFEST}/{MANIFEST_FILE}"):
        raise click.ClickException(
            f"{what} (no manifest): not replacing it, even with --overwrite; remove it yourself "
            "or give another --out"
        )
    if overwrite:
        return None
    # A damaged run (``what`` says so) is never kept, nor is its report (of the run before the
    # damage) a reason to keep it.
    why, note = "", ""
    if run_damage(files, run_dir) is None:
        manifest = read_manifest(files, run_dir) or {}
        differs = _why_not_kept(manifest, identity)
        if differs is None and not _is_remote(run_dir):
            _refuse_damaged(run_dir)
            return manifest
        why, note = f" {differs}" if differs else "", _report_note(run_dir)
    raise click.ClickException(
        f"{what}{why}{note}; pass --overwrite to replace it once the new run is "
        "complete, or --out for another folder"
    )


def _refuse_damaged(run_dir: str) -> None:
    """Refuse to keep the local run in ``run_dir`` if its Parquet files do not match their
    checksums (a file deleted, bytes changed): its report, if any, shows rows it no longer
    holds, and a rerun without ``--overwrite`` would keep it again."""
    from .pipeline.runs import checksum_damage

    damage = checksum_damage(run_dir)
    if damage is not None:
        raise click.ClickException(
            f"{run_dir}: damaged run: {damage}; it cannot be kept: pass --overwrite to "
            "simulate it again"
        )


#: How a refusal names a setting of ``_simulation_identity`` that differs from the run's: the
#: option that sets it, else what it is. Not the topology file's path: the same file named
#: from another folder is the same simulation (its content, ``topology_sha256``, is compared).
_SETTING_NAMES: Final = {
    "topology": "topology",
    "topology_sha256": "topology file content",
    "partitions": "partition counts",
    "scenarios": "--scenarios",
    "seed": "--seed",
    "assignors": "--assignors",
    "standby_replicas": "--standbys",
    "acceptable_recovery_lag": "--acceptable-lag",
    "replica_restore_per_s": "--restore-rate",
    "max_warmup_replicas": "--warmups",
    "probing_interval_s": "--probing-interval",
    "model": "churn model (--model, --param, --steps)",
}


def _why_not_kept(manifest: Mapping[str, Any], identity: Mapping[str, Any]) -> str | None:
    """Why the run of ``manifest`` is not what a run of ``identity`` (``_simulation_identity``,
    or a new run's manifest: only its settings are compared) by this code would write, said
    after "holds a complete run (ID)"; None if it is."""
    settings = [key for key in _SETTING_NAMES if key in identity]
    differing = [
        _SETTING_NAMES[k] for k in settings if k in manifest and manifest[k] != identity[k]
    ]
    code = _other_code(manifest)
    reasons = [f"of another simulation (other {', '.join(differing)})"] if differing else []
    if code is not None:
        reasons.append(code)  # it says why settings are missing: older code did not record them
    elif not reasons and any(key not in manifest for key in settings):
        unrecorded = ", ".join(_SETTING_NAMES[key] for key in settings if key not in manifest)
        reasons.append(f"that does not record its {unrecorded}")
    return ", ".join(reasons) or None


def _other_code(manifest: Mapping[str, Any]) -> str | None:
    """How the code that wrote the run of ``manifest`` is not this code, or None if it is:
    its rows may differ, settings alike. Compared: the package's ``code_fingerprint`` (never
    equal when this code has none), its version and the versions of the libraries whose
    code writes the run's rows (``_libraries``: pyspark, the peers' assignors). A run written
    before manifests recorded these counts as other code; only what differs is named."""
    from .pipeline.runs import CODE_FINGERPRINT, this_code

    code = this_code()
    if code.fingerprint is None:
        return (
            f"not known to be by this code (the streamassign package at {code.where} cannot "
            "be read to fingerprint it)"
        )
    recorded = manifest.get(CODE_FINGERPRINT)
    if not isinstance(recorded, str):  # older code, or code that could not read its files
        return "written by other code (no fingerprint recorded)"
    differences = []
    if recorded != code.fingerprint:
        differences.append(f"fingerprint {recorded[:12]}…, this code's {code.fingerprint[:12]}…")
    release, ours = manifest.get("streamassign"), _dist_version("streamassign")
    if release != ours:
        differences.append(f"streamassign {release or 'unrecorded'}, this is {ours}")
    libraries = manifest.get("libraries")
    recorded_libraries = libraries if isinstance(libraries, dict) else {}
    for name, installed in _libraries(manifest.get("assignors")).items():
        if recorded_libraries.get(name) != installed:
            differences.append(
                f"{name} {recorded_libraries.get(name, 'unrecorded')}, installed {installed}"
            )
    return f"written by other code ({'; '.join(differences)})" if differences else None


def _libraries(assignors: object) -> dict[str, str]:
    """The installed versions of the libraries, besides streamassign, whose code writes the
    rows of a run of ``assignors``: pyspark, and the peers whose assignors it compares
    (faust-streaming, aiokafka). Recorded in the manifest as ``libraries``."""
    from .pipeline.assignors import peer_distributions

    names = assignors if isinstance(assignors, list | tuple) else []
    return {dist: _dist_version(dist) for dist in ("pyspark", *peer_distributions(names))}


def _keep_run(
    run_dir: str,
    manifest: Mapping[str, Any],
    master: str | None,
    ship_code: bool | None,
    spark_tasks: int | None,
    with_report: bool,
) -> None:
    """Say that ``run_dir`` keeps its run (``manifest``: this simulation by this code; a rerun
    would write the same rows) and what comes next; with ``with_report``, write its report if
    it has none (with the command's Spark options, as after a simulation)."""
    label = manifest.get("run_id") or "an earlier run"
    held = (
        f"{run_dir} already holds this simulation, run {label} of {_created_on(manifest)} (same "
        "settings, same code)"
    )
    page = Path(run_dir) / "report" / "report.html"
    if with_report and not page.is_file():
        # Kept only once its rows are read whole: said after the report, not before.
        click.echo(f"{held}, without its report: writing it")
        _preflight(master)
        with (
            _one_line_failures("writing the report", f"run {label} left as it was"),
            _session(master, ship_code) as session,
        ):
            page = _render_kept(session, run_dir, spark_tasks)
    click.echo(f"{held}: kept, nothing simulated (--overwrite simulates it again)")
    if page.is_file():
        click.echo(f"report: {page}")
        click.echo(f"next: open {page.as_uri()} in a browser; runs and columns: docs/pipeline.md")
    else:
        click.echo(f"next: {_report_command(run_dir)}")


def _render_kept(session: Any, run_dir: str, spark_tasks: int | None) -> Path:
    """``_render`` of a kept run; damage only its rows show (a file deleted from an assignor's,
    changed bytes) ends in one line whose remedy is ``--overwrite``: simulating again without
    it would keep the damaged run."""
    from .errors import DamagedRunError

    try:
        return _render(session, run_dir, None, spark_tasks)
    except click.ClickException as exc:
        if not isinstance(exc.__cause__, DamagedRunError):
            raise
        damage = str(exc.__cause__).rsplit("; ", 1)[0]
        raise click.ClickException(
            f"{damage}; it cannot be kept: pass --overwrite to simulate it again"
        ) from exc


def _report_note(run_dir: str) -> str:
    """Whether the run in ``run_dir`` (refused: it exists) has its report, and so what the user
    can do without simulating again: open it, or write it (an interrupted ``--report``)."""
    if _is_remote(run_dir):
        return ""  # its report is wherever report --out put it
    page = Path(run_dir) / "report" / "report.html"
    if page.is_file():
        return f" and its report, {page}"
    return f" without a report (streamassign report {run_dir} writes it)"


@contextlib.contextmanager
def _session(master: str | None, ship: bool | None = False, quiet: bool = False) -> Iterator[Any]:
    """The command's Spark session (``spark.spark_session``), with a spinner while it starts
    (none when ``quiet``): a JVM start takes 10 s or more."""
    from .pipeline import spark as sp
    from .pipeline.progress import plain_step, stderr_console

    with contextlib.ExitStack() as stack:
        label = master or ("spark-submit's master" if _under_spark_submit() else "local[*]")
        with plain_step(f"starting Spark ({label})", stderr_console(quiet)):
            session = stack.enter_context(sp.spark_session(master, ship=ship))
        yield session


def _under_spark_submit() -> bool:
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _json_only(as_json: bool) -> bool:
    """Whether to write nothing on stderr but errors: ``--json`` and stderr landing in stdout
    (``spark-submit`` merges them), where progress or a note would break the JSON."""
    from .pipeline.progress import stderr_joins_stdout

    return as_json and stderr_joins_stdout()


def _spark_failure(exc: BaseException) -> str:
    """One line out of a Spark/Py4J failure: the innermost Python exception line, or the
    outermost Java exception with its innermost cause (Spark's ``TASK_WRITE_FAILED`` says what
    was written; its cause, ``java.io.IOException: No space left on device``, says why)."""
    import re

    text = str(exc)
    python = re.findall(r"^(\w*(?:Error|Exception)\b.*)$", text, re.MULTILINE)
    if python:  # the innermost Python error of a task (Python traces end with it)
        return str(python[-1]).strip()[:300]
    java = re.search(r"(?:\w+\.)+(\w*(?:Exception|Error)): (.*)", text)
    if java:  # the outermost Java exception: its class and message
        outer = f"{java.group(1)}: {java.group(2).strip()}"[:300]
    else:
        outer = (text.strip().splitlines()[0] if text.strip() else type(exc).__name__)[:300]
    cause = _innermost_cause(exc)
    return f"{outer} (cause: {cause})" if cause and cause not in outer else outer


def _innermost_cause(exc: BaseException) -> str | None:
    """The deepest cause under ``exc`` as one line of at most 200 characters: a chained Python
    exception (``raise ... from``), else the last ``Caused by:`` of a Java trace (its innermost:
    a suppressed exception's are indented), else the first line of a chained Java exception
    (pyspark keeps a Java cause as ``_cause``, its trace as ``_stackTrace``); None if none."""
    import re

    chain = _exception_chain(exc)
    innermost = chain[-1]
    if innermost is not exc and not type(innermost).__module__.startswith(("py4j", "pyspark")):
        return f"{type(innermost).__name__}: {innermost}".splitlines()[0][:200]
    for link in reversed(chain):
        trace = getattr(link, "_stackTrace", None)
        text = trace if isinstance(trace, str) else str(link)
        causes = re.findall(r"^Caused by: (.+)$", text, re.MULTILINE)
        if causes:
            return str(causes[-1]).strip()[:200]
        if link is not exc and text.strip():
            return text.strip().splitlines()[0][:200]
    return None


def _exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it came from, outermost first: ``raise ... from``'s ``__cause__`` or
    pyspark's ``_cause`` (at most 20, each once). Not ``__context__``: an exception being
    handled when this one was raised need not be why."""
    chain = [exc]
    while len(chain) < 20:
        link = chain[-1]
        below = link.__cause__ or getattr(link, "_cause", None)
        if not isinstance(below, BaseException) or any(below is seen for seen in chain):
            break
        chain.append(below)
    return chain


@contextlib.contextmanager
def _one_line_failures(
    doing: str, kept: str | None = None, done: str | None = None
) -> Iterator[None]:
    """Spark failures and Ctrl-C, SIGTERM or SIGHUP as one line (what failed, what was kept,
    what was done before), not a trace; after a signal the exit status is 128 + its number
    (130 after Ctrl-C). A ``KeyboardInterrupt(signum, left)`` says ``left`` instead of
    ``kept``; ``done`` (a run complete before its report failed) is said whatever happened,
    and with it any failure is one line (its type and message), not only Spark's."""
    import signal

    from .pipeline.signals import interrupt_on_signals, quiet_py4j

    after = f"; {done}" if done else ""
    tail = (f"; {kept}" if kept else "") + after
    try:
        # py4j's traces of talking to a JVM the signal stopped too (the whole process group
        # got it) would bury the one line; undone when the command ends.
        with quiet_py4j(), interrupt_on_signals():
            yield
    except KeyboardInterrupt as exc:
        signum = exc.args[0] if exc.args and isinstance(exc.args[0], int) else signal.SIGINT
        by = "" if signum == signal.SIGINT else f" by {signal.Signals(signum).name}"
        if len(exc.args) > 1:  # what the interrupted step left, where it knows better
            tail = f"; {exc.args[1]}{after}"
        click.echo(f"interrupted{by} while {doing}{tail}", err=True)
        raise SystemExit(128 + signum) from None
    except ExecutorCodeError as exc:  # the driver's one line of a task's failure
        raise click.ClickException(f"{doing} failed: {exc}{tail}") from exc
    except (click.ClickException, StreamAssignError, SystemExit):
        raise
    except Exception as exc:
        if _from_spark(exc):
            reason = _spark_failure(exc)
        elif done is not None:
            # A complete run behind it: its one line (and the command that writes the report,
            # with the trace if it fails again) matters more than this failure's trace.
            reason = f"{type(exc).__name__}: {exc}"[:300]
        else:
            raise
        raise click.ClickException(f"{doing} failed: {reason}{tail}") from exc


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
        type=click.IntRange(min=1),
        callback=_pipeline_limit("MAX_STEPS"),
        help="Rebalances per trace after the initial assignment (model; at least 1).",
    ),
    _partitions_option("Initial partition counts of external topics (override the file's table)."),
    _shown(
        "--seed",
        kind=int,
        default=0,
        help="Base seed of the traces.",
        callback=_pipeline_limit("SEED_RANGE"),
    ),
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
    from .pipeline.assignors import resolve
    from .pipeline.simulate import SimulationJob, require_rebalances

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
    from .pipeline.runs import new_run_id

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


def _local_run_to_keep(
    run_dir: str, topology_file: Path, job: Any, overwrite: bool
) -> dict[str, Any] | None:
    """``_refuse_existing`` of a local ``run_dir`` before Spark starts (a remote one is read
    through Spark, in ``_write_run``): the manifest of the run to keep, else None."""
    from .pipeline.runs import LocalFiles

    if _is_remote(run_dir):
        return None
    return _refuse_existing(
        LocalFiles(), run_dir, overwrite, _simulation_identity(topology_file, job)
    )


def _report_command(run_dir: str) -> str:
    """The command that writes the report of the run in ``run_dir``."""
    return f"streamassign report {run_dir}" + (" --out DIR" if _is_remote(run_dir) else "")


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

    from .pipeline import spark as sp
    from .pipeline.progress import run_tracked, stderr_console
    from .pipeline.runs import files_for, staging_path

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


def _publish(
    files: Any, staging: str, final: str, run_id: str, what: str, marker: str = ""
) -> None:
    """``runs.publish``, a failure as one line saying where the earlier run or report is (the
    caller's "kept" would not be true when it was left aside), and a note as a note. A signal
    comes out as ``KeyboardInterrupt(signum, where)``: publish knows best where each one is,
    and :func:`_one_line_failures` says that instead of the caller's "kept"."""
    from .pipeline.runs import publish

    try:
        left = publish(files, staging, final, run_id, what, marker)
    except PublishError as exc:
        cause = _spark_failure(exc.__cause__) if exc.__cause__ is not None else str(exc)
        raise click.ClickException(f"publishing the {what} failed: {cause}; {exc.where}") from exc
    if left is not None:
        click.echo(f"note: {left}", err=True)


def _dist_version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _manifest(topology_file: Path, job: Any, notes: Sequence[str], master: str) -> dict[str, Any]:
    import datetime

    from .pipeline.runs import CODE_FINGERPRINT, code_fingerprint

    return {
        **_simulation_identity(topology_file, job),
        "notes": list(notes),
        "master": master,
        "streamassign": _dist_version("streamassign"),
        # The code that wrote the rows: a rerun keeps this run only if it is the same.
        CODE_FINGERPRINT: code_fingerprint(),
        "libraries": _libraries(job.assignors),
        "pyspark": _dist_version("pyspark"),
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def _simulation_identity(topology_file: Path, job: Any) -> dict[str, Any]:
    """What a run's manifest records of the simulation itself: runs with the same are the
    same simulation (the same rows, assignment times aside). As JSON reads it back (lists).
    A model file needs no hash: the model's every value (the file's, --param's) is here."""
    identity = {
        "topology": job.workload.name,
        "topology_file": str(topology_file),
        # Its content too: an edited file of the same name and partition counts (a store
        # added) is another simulation, whose run must not replace the earlier one. The bytes
        # parsed, not the file now: simulate records this after Spark starts, seconds later.
        "topology_sha256": job.workload.file_sha256,
        "partitions": dict(job.workload.counts),
        "scenarios": job.scenarios,
        "seed": job.seed,
        "assignors": list(job.assignors),
        "standby_replicas": job.standby_replicas,
        "acceptable_recovery_lag": job.acceptable_recovery_lag,
        "replica_restore_per_s": job.replica_restore_per_s,
        "max_warmup_replicas": job.max_warmup_replicas,
        "probing_interval_s": job.probing_interval_s,
        "model": attrs.asdict(job.model),
    }
    loaded: dict[str, Any] = json.loads(json.dumps(identity))
    return loaded


def _same_simulation(manifest: Mapping[str, Any], identity: Mapping[str, Any]) -> bool:
    """Whether the run of ``manifest`` simulated ``identity`` (``_simulation_identity``). A
    run that did not record its topology's content (``topology_sha256``) is never the same:
    the file may have changed since. Such runs (all written before the restore rate, warmups
    and probing interval were recorded among them) are passed by, whatever their settings.
    The topology file's path is not compared (``_SETTING_NAMES``), its content is."""
    return all(
        k in manifest and manifest[k] == v for k, v in identity.items() if k in _SETTING_NAMES
    )


def _render(session: Any, run_dir: str, out: Path | None, spark_tasks: int | None = None) -> Path:
    """Aggregate on Spark and write the report into a hidden sibling of ``out`` (default
    ``run_dir/report``), moved into place when complete: a failure keeps the old report.
    ``spark_tasks``: partitions of the aggregation's shuffles (default: the session's)."""
    from .pipeline import spark as sp
    from .pipeline.progress import plain_step, run_tracked, stderr_console
    from .pipeline.report import render_report
    from .pipeline.runs import LocalFiles, new_run_id, staging_path

    if out is None:
        if _is_remote(run_dir):
            raise click.ClickException(
                f"{run_dir} is not a local directory: give --out for the report"
            )
        out = Path(run_dir) / "report"
    out = out.resolve()
    _check_report_out(out)
    console = stderr_console()
    if spark_tasks is not None:
        session.conf.set("spark.sql.shuffle.partitions", str(spark_tasks))
    try:
        data = run_tracked(session, "aggregating", console, lambda: sp.aggregate(session, run_dir))
    except StreamAssignError as exc:  # a damaged run: one line, the earlier report kept
        raise click.ClickException(str(exc)) from exc
    files, report_id = LocalFiles(), new_run_id()
    staging = staging_path(str(out), report_id)
    try:
        with plain_step("rendering the report", console):
            render_report(data, staging)
    except BaseException:
        with contextlib.suppress(Exception):  # what stopped the rendering is what to report
            files.delete(staging)
        raise
    # Two renders of one run are byte-identical: publish tells the new report from the one it
    # replaces by this id (were it report.html, a failed move would call the old one gone).
    # Readable as the rest of the report is: report.html's mode, which follows the umask
    # (write_atomically would make a private 0600 file, or a fixed mode whatever the umask).
    html_mode = stat.S_IMODE(os.stat(f"{staging}/report.html").st_mode)
    write_atomically(f"{staging}/{REPORT_ID}", f"{report_id}\n".encode(), mode=html_mode)
    _publish(files, staging, str(out), report_id, "report", REPORT_ID)
    return out / "report.html"


#: The file in a report's folder holding the id of the render that wrote it.
REPORT_ID: Final = "report-id.txt"


def _check_report_out(out: Path) -> None:
    """The report goes to a hidden sibling of ``out``, then replaces ``out``: refuse a folder
    that is not an earlier report, or a parent the sibling cannot be written in."""
    from .pipeline.runs import LocalFiles, replaceable

    _refuse_dangling_link(out, f"--out {out}")
    given, out = out, _resolved(out, f"--out {out}")
    if not replaceable(LocalFiles(), str(out), "report.html"):
        raise click.ClickException(
            f"{out} exists and holds no report.html: not replacing it; give an empty or new "
            "folder as --out"
        )
    _check_out_folder(out.parent, given=given)


@main.command()
@click.argument("run_dir", metavar="DIR")
@_out_dir_option("Where to write the report (default DIR/report).")
@_master_option
@_spark_tasks_option(_REPORT_SPARK_TASKS)
def report(run_dir: str, out: Path | None, master: str | None, spark_tasks: int | None) -> None:
    """Aggregate a simulation run in DIR with Spark; write an HTML report and CSV summaries."""
    from .pipeline.runs import LocalFiles, check_run, files_for

    _require("pyspark", "streamassign report")
    _require("plotly", "streamassign report")
    _require("jinja2", "streamassign report")
    run_dir = _run_dir(run_dir, "", option="")
    if out is None and _is_remote(run_dir):
        raise click.ClickException(f"{run_dir} is not a local directory: give --out")
    if not _is_remote(run_dir):
        try:
            check_run(LocalFiles(), run_dir)
        except StreamAssignError as exc:
            raise click.ClickException(str(exc)) from exc
    _check_report_out(out or Path(run_dir) / "report")
    _preflight(master)

    with _one_line_failures("writing the report"), _session(master) as session:
        if _is_remote(run_dir):
            try:
                check_run(files_for(run_dir, session), run_dir)
            except StreamAssignError as exc:
                raise click.ClickException(str(exc)) from exc
        page = _render(session, run_dir, out, spark_tasks)
    click.echo(f"report: {page}")
    click.echo(f"next: open {page.as_uri()} in a browser")


#: plan-standbys' exit status when no candidate reaches an explicit --target (the plan is
#: printed and written all the same); 1 and 2 are click's errors and usage errors.
TARGET_MISSED_EXIT = 3

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
    from .pipeline.simulate import require_rebalances
    from .pipeline.standbys import AvailabilityModel, PlanJob

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
    from .pipeline.standbys import assignor_advice, knobs, recommend, summarize

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
    from .pipeline import spark as sp
    from .pipeline.progress import run_tracked, stderr_console

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
    from .pipeline.report import csv_text

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


def _check_out_folder(
    out: Path, names: Sequence[str] = (), given: Path | None = None, shown: str | None = None
) -> None:
    """Refuse, before Spark starts, an ``--out`` the results could not be written to: not a
    folder, one of ``names`` there a folder, a dangling symbolic link on the way, or no
    writable folder to create it in. The check
    writes (and removes) a temporary file: permission bits say nothing for root or read-only
    mounts. ``given``: the ``--out`` the user gave, when ``out`` is where it is written from
    (its parent), so the message names what the user typed (``shown``: how to name it, if not
    as ``--out``)."""
    import tempfile

    shown = shown or f"--out {given or out}"
    _refuse_dangling_link(given or out, shown)
    out = _resolved(out, shown)
    if out.exists() and not out.is_dir():
        raise click.ClickException(f"{shown}: {out} exists and is not a folder")
    for name in names:
        if (out / name).is_dir():
            raise click.ClickException(
                f"{shown}: {out / name} is a folder, where a file goes; remove it or give "
                "another --out"
            )
    existing = out
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise click.ClickException(f"{shown}: {existing} is not a folder")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise click.ClickException(
            f"{shown}: cannot write in {existing}: {exc.strerror or exc}"
        ) from exc


def _refuse_dangling_link(path: Path, shown: str) -> None:
    """Refuse a symbolic link on the way to ``path`` (itself or a folder above it) whose target
    does not exist: following it would create the target (say, under the empty mount point of
    a volume not mounted) or fail only after the Spark work; likewise a link loop, or a link
    or folder that cannot be looked up. A link to an existing folder is followed like any
    folder."""
    problem = _link_problem(path)
    if problem:
        raise click.ClickException(f"{shown}: {problem}")


def _link_problem(path: Path) -> str | None:
    """What stops ``path`` from being followed, at the nearest part of it (itself or a folder
    above it) that exists: a dangling symbolic link, a link loop, a lookup refused (``EACCES``:
    ``Path.exists`` raises it); None when that part can be followed (or none exists)."""
    import errno

    for part in (path, *path.parents):
        try:
            os.lstat(part)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                continue  # created by the write, or a folder above it tells what is wrong
            return f"cannot look up {part}: {exc.strerror or exc}"
        try:
            os.stat(part)
        except OSError as exc:
            target = os.readlink(part) if os.path.islink(part) else None
            if exc.errno == errno.ENOENT and target is not None:
                return (
                    f"{part} is a symbolic link to {target}, which does not exist (deleted, or "
                    "on a volume not mounted?); create it or give another --out"
                )
            if exc.errno == errno.ELOOP:
                return (
                    f"{part} is a symbolic link to {target} that leads back to itself (a loop "
                    "of links); fix the links or give another path"
                )
            return f"cannot follow {part}: {exc.strerror or exc}"
        return None
    return None


#: plan-standbys' options that mean the same to simulate: its next command repeats those the
#: user gave, so that it simulates the fleet, model, restore rate and probing the plan was made
#: for (the warmups are the plan's, not the list of candidates).
_CARRIED_TO_SIMULATE: Final = (
    "scenarios",
    "seed",
    "model_file",
    "params",
    "steps",
    "partitions",
    "acceptable_lag",
    "restore_rate",
    "probing_interval",
    "master",
)


@attrs.frozen
class _NextSimulation:
    """plan-standbys' next ``simulate`` command: its words, its run folder (``--out``),
    whether it replaces the run there (``--overwrite``: a damaged run; a run of other code
    gets the next free folder instead) and the manifest of the run it keeps there (this very
    simulation by this code: the command only writes its report if it has none)."""

    words: list[str]
    out: str
    overwrite: bool
    kept: dict[str, Any] | None = None


def _next_simulation(
    topology_file: Path, standbys: int, name: str, warmups: int
) -> _NextSimulation:
    """The ``simulate`` command of the rebalances under a plan of ``standbys`` and
    ``warmups``: the user's own model options, the plan's assignor (with warmups ``task:ha``,
    beside ``task:sticky``; without, ``task:sticky`` alone), and a run folder of its own, so
    that it runs beside the run of ``simulate TOPOLOGY`` rather than being refused by it."""
    ctx = click.get_current_context()
    words = ["streamassign", "simulate", str(topology_file), "--standbys", str(standbys)]
    if warmups:
        words += ["--assignors", "task:sticky,task:ha", "--warmups", str(warmups)]
    else:  # task:ha would run at simulate's 2 warmups: a plan the user was not given
        words += ["--assignors", "task:sticky"]
    for param in ctx.command.params:
        if param.name not in _CARRIED_TO_SIMULATE or not _given(param.name):
            continue
        flag = max(param.opts, key=len)  # the long form, as simulate spells it
        value = ctx.params[param.name]
        for item in value if param.multiple else (value,):
            words += [flag, exact_number(item) if isinstance(item, float) else str(item)]
    plan_out = ctx.params.get("out")
    out, overwrite, kept = _standby_run_dir(name, standbys, _identity_of(words), plan_out)
    words += ["--out", out, *(["--overwrite"] if overwrite else []), "--report"]
    return _NextSimulation(words, out, overwrite, kept)


def _identity_of(words: Sequence[str]) -> dict[str, Any] | None:
    """What the run of the simulate command ``words`` would record of its simulation (see
    ``_simulation_identity``); None if simulate refuses the command (then no run is replaced
    for it)."""
    try:
        with simulate.make_context("simulate", list(words[2:])) as ctx:
            job, _ = _simulation_job(ctx.params)
        return _simulation_identity(ctx.params["topology_file"], job)
    except (click.ClickException, StreamAssignError, OSError):
        return None


def _standby_run_dir(
    name: str, standbys: int, identity: Mapping[str, Any] | None, plan_out: Path | None = None
) -> tuple[str, bool, dict[str, Any] | None]:
    """``streamassign-runs/NAME-standbysR``, whether ``--overwrite`` is needed there and the
    manifest of the run simulate keeps there. A run of the same simulation (``identity``) by
    this code, undamaged, is kept (no ``--overwrite``: simulate writes its report if missing);
    a damaged one is replaced if it is alone (the command redoes it). Past folders holding
    anything else (a run of the same settings by other code: the "before" of a code change,
    which ``--overwrite`` would delete unsaid; a run of another model, rate, fleet, topology;
    what is no run) or the plan's own files (``plan_out``, written after this line: the run
    would be refused there, or its --overwrite would delete them), the first of ``-2``,
    ``-3``, ... that is free or holds the same simulation."""
    import itertools

    from .pipeline.runs import (
        LocalFiles,
        checksum_damage,
        describe_existing,
        read_manifest,
        run_damage,
    )

    files, base = LocalFiles(), f"{_given_run_dir(None, name)}-standbys{standbys}"
    for n in itertools.count(1):
        out = base if n == 1 else f"{base}-{n}"
        where = os.path.abspath(out)
        if plan_out is not None and _inside(plan_out, Path(where)):
            continue
        if describe_existing(files, where) is None:
            return out, False, None
        manifest = read_manifest(files, where)
        if identity is None or manifest is None or not _same_simulation(manifest, identity):
            continue
        damaged = run_damage(files, where) is not None or checksum_damage(where) is not None
        if damaged and _holds_only_run_entries(where):
            return out, True, None  # nothing in it worth keeping
        if not damaged and _other_code(manifest) is None:
            return out, False, manifest
    raise AssertionError("unreachable: itertools.count never ends")


def _holds_only_run_entries(folder: str) -> bool:
    """Whether ``folder`` holds nothing but what simulate and report write there: --overwrite
    deletes the whole folder, with whatever else it holds (an earlier plan's ``--out``, the
    user's notes)."""
    from .pipeline.runs import MANIFEST, REBALANCES

    try:
        names = os.listdir(folder)
    except OSError:
        return False
    # Beside the report: its hidden staging and replaced copies, left by an interrupted render.
    return all(n in (MANIFEST, REBALANCES, "report") or n.startswith(".report.") for n in names)


def _inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or in it, links followed (a loop of links: not known to
    be, as neither can be written through)."""
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except (RuntimeError, OSError):
        return False


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


def _created_on(manifest: Mapping[str, Any]) -> str:
    """When the run of ``manifest`` was made (``2026-11-27 15:04 UTC``), as recorded."""
    import datetime

    created = manifest.get("created")
    try:
        when = datetime.datetime.fromisoformat(str(created))
    except ValueError:
        return "an unrecorded date" if created is None else str(created)
    if when.tzinfo is not None:
        when = when.astimezone(datetime.UTC)
    return when.strftime("%Y-%m-%d %H:%M") + (" UTC" if when.tzinfo is not None else "")


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
