"""Options of several commands: one definition each, so that help text and checks agree."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, TypeVar

import click

from ..text import exact_number

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
    from ..pipeline import scenarios

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
        from ..pipeline import simulate

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
    from ..pipeline.simulate import MIN_PROBING_INTERVAL_S as least

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


def _given(param: str) -> bool:
    """Whether the current command's ``param`` was given on the command line (not a default
    or an environment variable)."""
    source = click.get_current_context().get_parameter_source(param)
    # click.core: the top-level re-export exists only from click 8.3.3, and Faust 0.12-0.13
    # pin click<8.2.
    return source is click.core.ParameterSource.COMMANDLINE


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
