"""Keeping a run: what a run folder already holds (a complete run of the same simulation by the
same code, a damaged one, another run) and whether ``simulate`` keeps it, refuses or replaces it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs
import click

from .failures import _one_line_failures
from .jobs import _preflight, _session
from .provenance import other_code
from .report import (
    _NO_REPORT,
    _changed_rows_refusal,
    _refuse_report_extras,
    _render,
    _replaceable_report,
    _report_command,
)
from .run_folders import _is_remote, also_deleted, deleting, users_files


def _refuse_existing(
    files: Any, run_dir: str, overwrite: bool, identity: Mapping[str, Any]
) -> dict[str, Any] | None:
    """A run is replaced only with ``--overwrite`` (and then only once the new one is done),
    and kept only when it is what the command would write: the manifest of a local, undamaged
    run of the very simulation ``identity`` (``_simulation_identity``) written by this code,
    returned. None: ``run_dir`` is free, or ``--overwrite`` replaces its run. Anything else is
    refused in one line naming what differs."""
    from ..pipeline.runs import (
        MANIFEST,
        MANIFEST_FILE,
        Unreadable,
        added_text,
        describe_existing,
        read_manifest,
        replaceable,
        rows_added,
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
    manifest = read_manifest(files, run_dir) or {}
    damage = run_damage(files, run_dir)
    if damage is None or isinstance(damage, Unreadable):  # kept once made readable, maybe
        differs = _why_not_kept(manifest, identity)
        if differs is None and not _is_remote(run_dir):
            _refuse_damaged(run_dir, manifest)
            return manifest
        why, note = f" {differs}" if differs else "", _report_note(run_dir)
    added = [] if _is_remote(run_dir) else rows_added(run_dir, manifest)
    said = deleting(added, users_files(run_dir))
    raise click.ClickException(
        f"{what}{why}{note}{f', and {added_text(added)}' if added else ''}; pass --overwrite "
        f"to replace it once the new run is complete{f' ({said})' if said else ''}, "
        "or --out for another folder"
    )


def _refuse_damaged(run_dir: str, manifest: Mapping[str, Any]) -> None:
    """Refuse to keep the local run in ``run_dir`` (``manifest``: its manifest) if its Parquet
    files are not those it wrote (a file deleted or added, its size or bytes changed): its
    report, if any, shows rows it no longer holds, and a rerun without ``--overwrite`` would
    keep it again. Likewise if nothing can check them, or one cannot be read, said as such
    (not as damage: making it readable may keep the run). A file added among them is named
    either way: Spark would read it with the run's rows, moving it away keeps the run if
    nothing else is wrong, and ``--overwrite`` would delete it."""
    from ..pipeline.runs import Unreadable, rows_added, rows_damage, rows_unchecked

    added = rows_added(run_dir, manifest)
    damage = rows_damage(run_dir, manifest)
    remedy, refused = "pass --overwrite to simulate it again", "it cannot be kept: "
    if isinstance(damage, Unreadable):
        why: str | None = damage.why
        remedy, refused = f"{damage.fix} to keep the run, or {remedy}", ""
    elif damage is not None:
        why = f"damaged run: {damage}"
    else:
        unchecked = rows_unchecked(run_dir, manifest)
        why = None if unchecked is None else f"its rows cannot be checked: {unchecked}"
    refusal = _changed_rows_refusal(run_dir, why, added, remedy, refused)
    if refusal is not None:
        raise click.ClickException(refusal)


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
    code = other_code(manifest)
    reasons = [f"of another simulation (other {', '.join(differing)})"] if differing else []
    if code is not None:
        reasons.append(code)  # it says why settings are missing: older code did not record them
    elif not reasons and any(key not in manifest for key in settings):
        unrecorded = ", ".join(_SETTING_NAMES[key] for key in settings if key not in manifest)
        reasons.append(f"that does not record its {unrecorded}")
    return ", ".join(reasons) or None


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
        _refuse_foreign_report_folder(run_dir)
        # Kept only once its rows are read whole: said after the report, not before.
        click.echo(f"{held}, without its report: writing it")
        _preflight(master)
        with (
            _one_line_failures("writing the report", f"run {label} left as it was"),
            _session(master, ship_code) as session,
        ):
            page = _render_kept(session, run_dir, spark_tasks)
    said = deleting([], users_files(run_dir), keep=False)
    click.echo(
        f"{held}: kept, nothing simulated (--overwrite simulates it again"
        f"{f', {said}' if said else ''})"
    )
    if page.is_file():
        click.echo(f"report: {page}")
        click.echo(f"next: open {page.as_uri()} in a browser; runs and columns: docs/pipeline.md")
    else:
        click.echo(f"next: {_report_command(run_dir)}")


def _refuse_foreign_report_folder(run_dir: str) -> None:
    """Before Spark starts: refuse to write a kept run's report over ``DIR/report`` holding
    other files than a report (no report, or the user's files beside one: the report replaces
    the folder whole), with the remedies that keep the run (simulate's ``--out`` is the run's
    folder: another one would simulate it all again)."""
    folder = Path(run_dir) / "report"
    elsewhere = f"or write the report elsewhere: {_report_command(run_dir)}"
    if not _replaceable_report(folder):
        raise click.ClickException(
            f"{folder} exists and is no report ({_NO_REPORT}): not replacing it with the kept "
            f"run's report; move its files away, {elsewhere}"
        )
    _refuse_report_extras(folder, elsewhere)


def _render_kept(session: Any, run_dir: str, spark_tasks: int | None) -> Path:
    """``_render`` of a kept run; damage only its rows show (a file deleted from an assignor's,
    changed bytes) ends in one line whose remedy is ``--overwrite``: simulating again without
    it would keep the damaged run."""
    from ..errors import DamagedRunError

    try:
        return _render(session, run_dir, None, spark_tasks)
    except click.ClickException as exc:
        if not isinstance(exc.__cause__, DamagedRunError):
            raise
        damage = str(exc.__cause__).rsplit("; ", 1)[0]
        raise click.ClickException(
            f"{damage}; it cannot be kept: pass --overwrite to simulate it again"
            f"{also_deleted(run_dir)}"
        ) from exc


def _report_note(run_dir: str) -> str:
    """Whether the run in ``run_dir`` (refused: it exists) has its report, and so what the user
    can do without simulating again: open it, or write it (an interrupted ``--report``)."""
    if _is_remote(run_dir):
        return ""  # its report is wherever report --out put it
    page = Path(run_dir) / "report" / "report.html"
    if page.is_file():
        return f" and its report, {page}"
    return f" without a report ({_report_command(run_dir)} writes it)"


def _local_run_to_keep(
    run_dir: str, topology_file: Path, job: Any, overwrite: bool
) -> dict[str, Any] | None:
    """``_refuse_existing`` of a local ``run_dir`` before Spark starts (a remote one is read
    through Spark, in ``_write_run``): the manifest of the run to keep, else None."""
    from ..pipeline.runs import LocalFiles

    if _is_remote(run_dir):
        return None
    return _refuse_existing(
        LocalFiles(), run_dir, overwrite, _simulation_identity(topology_file, job)
    )


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
