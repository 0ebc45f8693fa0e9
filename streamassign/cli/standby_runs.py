"""The simulate command a standby plan suggests next, and the run folder it would write (or
keep) so that the suggestion does not overwrite another simulation's run."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import click

from ..errors import StreamAssignError
from ..text import exact_number
from .kept_runs import _same_simulation, _simulation_identity
from .options import _given
from .provenance import other_code
from .run_folders import _given_run_dir, report_extras, users_files
from .simulate import _simulation_job, simulate

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
    manifest of the run simulate keeps there. A run of the same simulation (``identity``) by this
    code, undamaged, is kept (no ``--overwrite``: simulate writes its report if missing); a damaged
    one (or one of this code nothing can check: simulate would not keep it) is replaced if it is
    alone, with no file of the user's in it (the command redoes it). Past folders holding anything
    else (a run with a file added among its rows, which ``--overwrite`` would delete; one with a
    file or folder of its rows that cannot be read: not known to be damaged; a run of the same
    settings by other code: the "before" of a code change, which ``--overwrite`` would delete
    unsaid; a kept run without its report whose ``report/`` holds the user's files, which
    ``--report`` refuses to replace; a run of another model, rate, fleet, topology; what is no run)
    or the plan's own files (``plan_out``, written after this line: the run would be refused there,
    or its --overwrite would delete them), the first of ``-2``, ``-3``, ... that is free or holds
    the same simulation."""
    import itertools

    from ..pipeline.runs import (
        LocalFiles,
        Unreadable,
        describe_existing,
        read_manifest,
        rows_added,
        rows_damage,
        rows_unchecked,
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
        if other_code(manifest) is not None:
            continue  # the "before" of a code change, damaged or not: never printed for deletion
        if rows_added(where, manifest):
            continue  # a file of someone's among its rows: simulate keeps it only once moved
        rows = rows_damage(where, manifest)
        if isinstance(rows, Unreadable):
            continue  # not known to be damaged: made readable, it may be kept
        damaged = (
            run_damage(files, where) is not None
            or rows is not None
            or rows_unchecked(where, manifest) is not None  # simulate would not keep it
        )
        if damaged and _holds_only_run_entries(where):
            return out, True, None  # nothing in it worth keeping
        if not damaged and not _report_refused(where):
            return out, False, manifest
    raise AssertionError("unreachable: itertools.count never ends")


def _report_refused(folder: str) -> bool:
    """Whether ``simulate --report`` would refuse to write the missing report of the run it
    keeps in ``folder``: its ``report/`` holds files a report does not write (a report
    replaces the folder whole), or cannot be listed."""
    report = Path(folder) / "report"
    try:
        return not (report / "report.html").is_file() and bool(report_extras(report))
    except OSError:
        return True


def _holds_only_run_entries(folder: str) -> bool:
    """Whether ``folder`` holds nothing but what simulate and report write there, in it and in
    the run's own folders: --overwrite deletes the whole folder, with whatever else it holds
    (an earlier plan's ``--out``, the user's notes in ``report/``)."""
    try:
        return not users_files(folder)
    except OSError:
        return False


def _inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or in it, links followed (a loop of links: not known to
    be, as neither can be written through)."""
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except (RuntimeError, OSError):
        return False
