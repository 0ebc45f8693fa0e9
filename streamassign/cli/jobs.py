"""What the pipeline commands (Spark) share: the scenario model, the workload, the preflight
checks and the Spark session.

Every input is checked before a SparkSession starts: a bad topology, model parameter or assignor
name costs milliseconds, not a JVM start. Spark itself is imported only by
streamassign.pipeline.spark, inside the commands."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import click

from ..errors import StreamAssignError
from .inputs import parse_partitions


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
    from ..pipeline.scenarios import ScenarioModel

    given: dict[str, object] = dict(_params(params))
    if steps is not None:
        given["steps"] = steps
    if model_file is not None:
        return ScenarioModel.load(model_file, given)
    return ScenarioModel().evolve(given)


@contextlib.contextmanager
def _session(master: str | None, ship: bool | None = False, quiet: bool = False) -> Iterator[Any]:
    """The command's Spark session (``spark.spark_session``), with a spinner while it starts
    (none when ``quiet``): a JVM start takes 10 s or more."""
    from ..pipeline import spark as sp
    from ..pipeline.progress import plain_step, stderr_console

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
    from ..pipeline.progress import stderr_joins_stdout

    return as_json and stderr_joins_stdout()


def _preflight(master: str | None, workload: Any = None, model: Any = None) -> None:
    """What would otherwise fail inside or after the JVM start, as one line, before it:
    sizes past the limits, a bad or unreachable master, no usable Java."""
    from ..pipeline import preflight

    try:
        if workload is not None:
            preflight.check_size(workload, model)
        preflight.check_master(master)
        if preflight.jvm_will_start():
            preflight.check_java()
    except StreamAssignError as exc:
        raise click.ClickException(str(exc)) from exc


def _workload(topology_file: Path, partitions: Sequence[str]) -> Any:
    from ..pipeline.scenarios import Workload

    return Workload.from_file(topology_file, parse_partitions(partitions))
