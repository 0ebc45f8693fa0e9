"""``streamassign report``: aggregate a simulation run with Spark into an HTML report."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import click

from ..errors import StreamAssignError
from ..files import write_atomically
from ..text import listed
from .extras import _require
from .failures import _one_line_failures
from .group import main
from .jobs import _preflight, _session
from .options import _REPORT_SPARK_TASKS, _master_option, _out_dir_option, _spark_tasks_option
from .run_folders import (
    _check_out_folder,
    _is_remote,
    _publish,
    _refuse_dangling_link,
    _resolved,
    _run_dir,
)


def _report_command(run_dir: str) -> str:
    """The command that writes the report of the run in ``run_dir``: with ``--out`` for a
    remote run, and for a local one whose ``report/`` holds other files but no report.html
    (``report`` does not replace such a folder)."""
    command = f"streamassign report {run_dir}"
    if _is_remote(run_dir):
        return f"{command} --out DIR"
    if _replaceable_report(Path(run_dir) / "report"):
        return command
    return f"{command} --out OTHER"


def _replaceable_report(folder: Path) -> bool:
    """Whether a report may be written over ``folder``: it is absent or empty, or an earlier
    report, by its page or by the id its render left (``REPORT_ID``, holding a run id: the
    page alone deleted leaves the report's own files, which are nobody else's to keep)."""
    from ..pipeline.runs import LocalFiles, is_run_id, replaceable

    if replaceable(LocalFiles(), str(folder), "report.html"):
        return True
    return is_run_id(LocalFiles().read_text(str(folder / REPORT_ID)) or "")


def _render(session: Any, run_dir: str, out: Path | None, spark_tasks: int | None = None) -> Path:
    """Aggregate on Spark and write the report into a hidden sibling of ``out`` (default
    ``run_dir/report``), moved into place when complete: a failure keeps the old report.
    ``spark_tasks``: partitions of the aggregation's shuffles (default: the session's)."""
    from ..pipeline import spark as sp
    from ..pipeline.progress import plain_step, run_tracked, stderr_console
    from ..pipeline.report import render_report
    from ..pipeline.runs import LocalFiles, files_for, new_run_id, read_manifest, staging_path

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
        manifest = read_manifest(files_for(run_dir, session), run_dir)
        raise click.ClickException(_with_rerun_remedy(run_dir, str(exc), manifest)) from exc
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

#: Why a folder is not taken for an earlier report (see ``_replaceable_report``), true whether
#: or not it holds a ``REPORT_ID`` of another's.
_NO_REPORT: Final = f"no report.html in it, and no {REPORT_ID} holding a report's id"


def _check_report_out(out: Path) -> None:
    """The report goes to a hidden sibling of ``out``, then replaces ``out``: refuse a folder
    that is not an earlier report, or a parent the sibling cannot be written in."""
    _refuse_dangling_link(out, f"--out {out}")
    given, out = out, _resolved(out, f"--out {out}")
    if not _replaceable_report(out):
        raise click.ClickException(
            f"{out} exists and is no report ({_NO_REPORT}): not replacing it; give an empty "
            "or new folder as --out"
        )
    _check_out_folder(out.parent, given=given)


def _changed_rows_refusal(
    run_dir: str, why: str | None, added: Sequence[str], remedy: str, refused: str = ""
) -> str | None:
    """The line refusing the local run in ``run_dir`` whose rows are not those it wrote, or
    None: ``why`` (its damage, or why its rows cannot be checked) and the files ``added``
    among them (``rows_added``), each named, with ``remedy`` (``--overwrite``, after
    ``refused`` when the run is damaged). An added file is the user's and Spark would read it
    as rows: moving it out keeps the run (alone) or the file (beside damage), and the remedy
    says that ``--overwrite`` deletes it, with the user's other files in the run's folder
    (``_users_files``)."""
    from ..pipeline.runs import added_text

    if why is None and not added:
        return None
    others = _users_files(run_dir)
    if why is None:
        it = "it" if len(added) == 1 else "them"
        return (
            f"{run_dir}: {added_text(added)}: Spark reads every file in rebalances/assignor=... "
            f"as the run's rows; move {it} out of the run's folder to keep the run, or {remedy} "
            f"({_deleting(added, others, keep=False)})"
        )
    deleting = _deleting(added, others)
    if not added:
        return f"{run_dir}: {why}; {refused}{remedy}" + (f" ({deleting})" if deleting else "")
    return f"{run_dir}: {why}, and {added_text(added)}; {refused}{remedy} ({deleting})"


def _users_files(run_dir: str) -> list[str]:
    """What the local run folder ``run_dir`` holds that neither ``simulate`` nor ``report``
    wrote there and Spark does not read as rows (notes beside the run's folders, in
    ``rebalances/`` beside the partition folders, in ``report/``), by its path under the run;
    an entry of the run's folder itself by its name (a folder's with a ``/``). ``--overwrite``
    deletes them with the run. Files added among the rows are ``rows_added``'s."""
    from ..pipeline.runs import MANIFEST, REBALANCES, LocalFiles, row_files

    if _is_remote(run_dir) or not os.path.isdir(run_dir):
        return []
    found: list[str] = []
    for name in sorted(os.listdir(run_dir)):
        if name in (MANIFEST, REBALANCES, "report") and os.path.isdir(f"{run_dir}/{name}"):
            continue
        if not name.startswith(".report."):  # an interrupted render's staging or replaced copy
            found.append(f"{name}/" if os.path.isdir(f"{run_dir}/{name}") else name)
    rows = {f"{REBALANCES}/{shown}" for shown in row_files(LocalFiles(), run_dir)}
    for top in (MANIFEST, REBALANCES, "report"):
        for folder, _, names in os.walk(f"{run_dir}/{top}"):
            shown = [os.path.relpath(f"{folder}/{n}", run_dir).replace(os.sep, "/") for n in names]
            found += [s for s in sorted(shown) if s not in rows and not _written_by_a_run(s)]
    return found


def _written_by_a_run(shown: str) -> bool:
    """Whether the file ``shown`` (its path under a run's folder, not among its rows) is one
    ``simulate`` or ``report`` writes: the manifest, Spark's markers and checksum files, the
    report's page, CSV files and id."""
    from ..pipeline.report import CSV_FILES
    from ..pipeline.runs import MANIFEST, MANIFEST_FILE, MANIFEST_PATH, REBALANCES

    name = shown.rpartition("/")[2]
    if shown.startswith(f"{REBALANCES}/"):
        return name in ("_SUCCESS", "._SUCCESS.crc") or (
            name.startswith(".") and name.endswith(".crc") and shown.count("/") == 2
        )
    return shown in (MANIFEST_PATH, f"{MANIFEST}/.{MANIFEST_FILE}.crc") or shown in {
        f"report/{name}" for name in ("report.html", REPORT_ID, *CSV_FILES)
    }


def _deleting(added: Sequence[str], others: Sequence[str], keep: bool = True) -> str:
    """What ``--overwrite`` deletes beside the run, said in a remedy's brackets: the files
    ``added`` among its rows (named before: "it", "them") and the user's ``others``
    (``_users_files``, named here); with ``keep``, how to keep them. "" if none."""
    if not added and not others:
        return ""
    named = ("it" if len(added) == 1 else "them") if added else ""
    if others:
        named = f"{named} and {listed(others)}" if named else listed(others)
    moved = "it" if len(added) + len(others) == 1 else "them"
    deleting = f"deleting {named} with the run"
    if not keep:
        return deleting
    return f"{deleting}: move {moved} out of the run's folder first to keep {moved}"


def _also_deleted(run_dir: str) -> str:
    """The user's files in the run folder ``run_dir`` (``_users_files``), as the end of a
    remedy that deletes them with the run (``--overwrite``): `` (deleting ...)``, or ""."""
    deleting = _deleting([], _users_files(run_dir))
    return f" ({deleting})" if deleting else ""


def _rerun_remedy(manifest: Mapping[str, Any] | None) -> str:
    """The remedy for a damaged run of ``manifest``: this code's own run is simulated again
    with ``--overwrite``; other code's is not (this code cannot write its run or report
    again, which ``--overwrite`` would delete for good)."""
    from ..pipeline.runs import SIMULATE_AGAIN
    from .kept_runs import _other_code

    if manifest is None or _other_code(manifest) is None:
        return SIMULATE_AGAIN
    return (
        "simulate it again with the code that wrote it (other code), or with this code and "
        "another --out (this code's --overwrite would delete that code's run and report)"
    )


def _with_rerun_remedy(run_dir: str, refusal: str, manifest: Mapping[str, Any] | None) -> str:
    """``refusal`` (of the damaged run in ``run_dir``, from ``runs``), its remedy
    ``_rerun_remedy``'s, naming the user's files that ``--overwrite`` would delete with it."""
    from ..pipeline.runs import SIMULATE_AGAIN

    if not refusal.endswith(SIMULATE_AGAIN):
        return refusal
    remedy = _rerun_remedy(manifest)
    deleting = _also_deleted(run_dir) if remedy == SIMULATE_AGAIN else ""
    return refusal.removesuffix(SIMULATE_AGAIN) + remedy + deleting


def _refuse_changed_rows(run_dir: str, manifest: dict[str, Any]) -> None:
    """Before Spark starts: refuse a local run whose files are not those its manifest lists
    with their digests (a byte changed, a file added: Spark would read them without a word
    where no checksum file is beside them). A manifest without digests (older code) leaves it
    to Spark's checksums and the rows' count. A file that cannot be read is said as such, not
    as damage."""
    from ..pipeline.runs import ROW_SHA256, Unreadable, rows_added, rows_damage

    if not isinstance(manifest.get(ROW_SHA256), dict):
        return
    added = rows_added(run_dir, manifest)
    damage = rows_damage(run_dir, manifest)
    if isinstance(damage, Unreadable):
        raise click.ClickException(
            f"{run_dir}: its rows cannot be checked: {damage}; make it readable (chmod) and "
            "run streamassign report again"
        )
    refusal = _changed_rows_refusal(
        run_dir,
        None if damage is None else f"damaged run: {damage}",
        added,
        _rerun_remedy(manifest),
    )
    if refusal is not None:
        raise click.ClickException(refusal)


@main.command()
@click.argument("run_dir", metavar="DIR")
@_out_dir_option("Where to write the report (default DIR/report).")
@_master_option
@_spark_tasks_option(_REPORT_SPARK_TASKS)
def report(run_dir: str, out: Path | None, master: str | None, spark_tasks: int | None) -> None:
    """Aggregate a simulation run in DIR with Spark; write an HTML report and CSV summaries."""
    from ..pipeline.runs import LocalFiles, check_run, files_for, read_manifest

    _require("pyspark", "streamassign report")
    _require("plotly", "streamassign report")
    _require("jinja2", "streamassign report")
    run_dir = _run_dir(run_dir, "", option="")
    if out is None and _is_remote(run_dir):
        raise click.ClickException(f"{run_dir} is not a local directory: give --out")
    if not _is_remote(run_dir):
        try:
            _refuse_changed_rows(run_dir, check_run(LocalFiles(), run_dir))
        except StreamAssignError as exc:
            manifest = read_manifest(LocalFiles(), run_dir)
            raise click.ClickException(_with_rerun_remedy(run_dir, str(exc), manifest)) from exc
    _check_report_out(out or Path(run_dir) / "report")
    _preflight(master)

    with _one_line_failures("writing the report"), _session(master) as session:
        if _is_remote(run_dir):
            try:
                check_run(files_for(run_dir, session), run_dir)
            except StreamAssignError as exc:
                manifest = read_manifest(files_for(run_dir, session), run_dir)
                raise click.ClickException(_with_rerun_remedy(run_dir, str(exc), manifest)) from exc
        page = _render(session, run_dir, out, spark_tasks)
    click.echo(f"report: {page}")
    click.echo(f"next: open {page.as_uri()} in a browser")
