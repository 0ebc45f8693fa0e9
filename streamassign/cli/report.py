"""``streamassign report``: aggregate a simulation run with Spark into an HTML report."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import click

from ..errors import StreamAssignError
from ..files import write_atomically
from ..text import listed
from .extras import _require
from .failures import _one_line_failures
from .group import main
from .jobs import _preflight, _session
from .options import _REPORT_SPARK_TASKS, _master_option, _out_dir_option, _spark_tasks_option
from .provenance import other_code
from .run_folders import (
    REPORT_ID,
    _check_out_folder,
    _is_remote,
    _publish,
    _refuse_dangling_link,
    _resolved,
    _run_dir,
    also_deleted,
    deleting,
    report_extras,
    users_files,
)

if TYPE_CHECKING:
    from ..pipeline.runs import Unreadable


def _report_command(run_dir: str) -> str:
    """The command that writes the report of the run in ``run_dir``: with ``--out`` for a
    remote run, and for a local one whose ``report/`` holds other files (``report`` does not
    replace such a folder)."""
    command = f"streamassign report {run_dir}"
    if _is_remote(run_dir):
        return f"{command} --out DIR"
    folder = Path(run_dir) / "report"
    with contextlib.suppress(OSError):
        if _replaceable_report(folder) and not report_extras(folder):
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
    from ..pipeline.runs import LocalFiles, files_for, new_run_id, staging_path

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
        raise _damaged_run_refusal(files_for(run_dir, session), run_dir, exc) from exc
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


#: Why a folder is not taken for an earlier report (see ``_replaceable_report``), true whether
#: or not it holds a ``REPORT_ID`` of another's.
_NO_REPORT: Final = f"no report.html in it, and no {REPORT_ID} holding a report's id"


def _check_report_out(out: Path) -> None:
    """The report goes to a hidden sibling of ``out``, then replaces ``out``: refuse a folder
    that is not an earlier report, or one holding files a report does not write (they would
    go with it), or a parent the sibling cannot be written in."""
    _refuse_dangling_link(out, f"--out {out}")
    given, out = out, _resolved(out, f"--out {out}")
    if not _replaceable_report(out):
        raise click.ClickException(
            f"{out} exists and is no report ({_NO_REPORT}): not replacing it; give an empty "
            "or new folder as --out"
        )
    _refuse_report_extras(out, "or give another --out")
    _check_out_folder(out.parent, given=given)


def _refuse_report_extras(folder: Path, elsewhere: str) -> None:
    """Refuse to write a report over the earlier one in ``folder`` while it holds files a
    report does not write (``report_extras``: the user's notes), naming them: the new report
    replaces the folder whole. ``elsewhere``: the remedy that writes the report elsewhere."""
    extras = report_extras(folder)
    opened = {name: office_file for name in extras if (office_file := _office_lock_of(name))}
    others = [name for name in extras if name not in opened]
    if others:
        them = "it" if len(others) == 1 else "them"
        moved = listed(others) if opened else them  # "it" would read as the open file
        close = f"close {listed(list(opened.values()))} in LibreOffice and " if opened else ""
        raise click.ClickException(
            f"{folder} holds {listed(others)}, which a report does not write: not replacing "
            f"the folder (a report replaces it whole); {close}move {moved} out of {folder} "
            f"first to keep {them}, {elsewhere}"
        )
    if opened:
        files, locks = listed(list(opened.values())), listed(list(opened))
        is_, its = ("is", "its lock file") if len(opened) == 1 else ("are", "their lock files")
        raise click.ClickException(
            f"{folder}: {files} {is_} open in LibreOffice ({its} {locks} {is_} there): not "
            f"replacing the folder (a report replaces it whole); close {files} in LibreOffice "
            f"first (if LibreOffice is not running, delete {its}), {elsewhere}"
        )


def _office_lock_of(name: str) -> str | None:
    """The file whose LibreOffice lock file ``name`` is (``.~lock.NAME#``, there while NAME is
    open in LibreOffice, or after it crashed), or None: such a file blocks a report as the
    user's files do, but the remedy is closing NAME, not moving the lock away."""
    if name.startswith(".~lock.") and name.endswith("#") and len(name) > len(".~lock.#"):
        return name.removeprefix(".~lock.").removesuffix("#")
    return None


def _changed_rows_refusal(
    run_dir: str,
    why: str | None,
    added: Sequence[str],
    remedy: str,
    refused: str = "",
    deletes: bool = True,
) -> str | None:
    """The line refusing the local run in ``run_dir`` whose rows are not those it wrote, or
    None: ``why`` (its damage, or why its rows cannot be checked) and the files ``added``
    among them (``rows_added``), each named, with ``remedy`` (after ``refused`` when the run
    is damaged). An added file is the user's and Spark would read it as rows: moving it out
    keeps the run (alone) or the file (beside damage). ``deletes``: the remedy is this code's
    ``--overwrite``, said to delete the added files and the user's other files in the run's
    folder (``users_files``); else it deletes nothing, and an intact run needs only the
    added files moved out."""
    from ..pipeline.runs import added_text

    if why is None and not added:
        return None
    others = users_files(run_dir) if deletes else []
    if why is None:
        it = "that file" if len(added) == 1 else "those files"
        keep = (
            f"{run_dir}: {added_text(added)}: Spark reads every file in rebalances/assignor=... "
            f"as the run's rows; move {it} out of the run's folder to keep the run"
        )
        return f"{keep}, or {remedy} ({deleting(added, others, keep=False)})" if deletes else keep
    said = deleting(added, others) if deletes else ""
    tail = f" ({said})" if said else ""
    if not added:
        return f"{run_dir}: {why}; {refused}{remedy}{tail}"
    return f"{run_dir}: {why}, and {added_text(added)}; {refused}{remedy}{tail}"


def _rerun_remedy(run_dir: str, manifest: Mapping[str, Any] | None) -> str:
    """The remedy for the damaged run in ``run_dir`` (``manifest``: its manifest): this code's
    own run is simulated again with ``--overwrite``; other code's is not (this code cannot
    write its run or report again, which ``--overwrite`` would delete for good)."""
    from ..pipeline.runs import SIMULATE_AGAIN

    if manifest is None or other_code(manifest) is None:
        return SIMULATE_AGAIN
    reported = not _is_remote(run_dir) and (Path(run_dir) / "report" / "report.html").is_file()
    return (
        "simulate it again with the code that wrote it (other code), or with this code and "
        "another --out (this code's --overwrite would delete that code's run"
        f"{' and report' if reported else ''})"
    )


def _damaged_run_refusal(files: Any, run_dir: str, exc: StreamAssignError) -> click.ClickException:
    """The one line refusing the damaged run in ``run_dir`` (``exc``, from ``runs``; ``files``:
    how to read its manifest), its remedy ``_rerun_remedy``'s, naming the user's files that
    this code's ``--overwrite`` would delete with it."""
    from ..pipeline.runs import SIMULATE_AGAIN, read_manifest

    refusal = str(exc)
    if not refusal.endswith(SIMULATE_AGAIN):
        return click.ClickException(refusal)
    remedy = _rerun_remedy(run_dir, read_manifest(files, run_dir))
    tail = also_deleted(run_dir) if remedy == SIMULATE_AGAIN else ""
    return click.ClickException(refusal.removesuffix(SIMULATE_AGAIN) + remedy + tail)


def _refuse_changed_rows(run_dir: str, manifest: dict[str, Any]) -> None:
    """Before Spark starts: refuse a local run whose files are not those its manifest lists
    with their digests (a byte changed, a file added: Spark would read them without a word
    where no checksum file is beside them). A manifest without digests (older code) leaves it
    to Spark's checksums and the rows' count. A file that cannot be read is said as such, not
    as damage."""
    from ..pipeline.runs import ROW_SHA256, SIMULATE_AGAIN, Unreadable, rows_added, rows_damage

    if not isinstance(manifest.get(ROW_SHA256), dict):
        return
    added = rows_added(run_dir, manifest)
    damage = rows_damage(run_dir, manifest)
    if isinstance(damage, Unreadable):
        _refuse_unreadable_rows(run_dir, damage)
    remedy = _rerun_remedy(run_dir, manifest)
    refusal = _changed_rows_refusal(
        run_dir,
        None if damage is None else f"damaged run: {damage}",
        added,
        remedy,
        deletes=remedy == SIMULATE_AGAIN,
    )
    if refusal is not None:
        raise click.ClickException(refusal)


def _refuse_unreadable_rows(run_dir: str, unreadable: Unreadable | None) -> None:
    """Refuse a local run whose rows cannot be read (``unreadable``: ``rows_unreadable``'s or
    ``rows_damage``'s) as what it is: not known to be damaged, usually a chmod away from its
    report (Spark would fail on it, or skip a folder it cannot list)."""
    if unreadable is not None:
        raise click.ClickException(
            f"{run_dir}: {unreadable.why}; {unreadable.fix} and run streamassign report again"
        )


@main.command()
@click.argument("run_dir", metavar="DIR")
@_out_dir_option("Where to write the report (default DIR/report).")
@_master_option
@_spark_tasks_option(_REPORT_SPARK_TASKS)
def report(run_dir: str, out: Path | None, master: str | None, spark_tasks: int | None) -> None:
    """Aggregate a simulation run in DIR with Spark; write an HTML report and CSV summaries."""
    from ..pipeline.runs import LocalFiles, check_run, files_for, rows_unreadable

    _require("pyspark", "streamassign report")
    _require("plotly", "streamassign report")
    _require("jinja2", "streamassign report")
    run_dir = _run_dir(run_dir, "", option="")
    if out is None and _is_remote(run_dir):
        raise click.ClickException(f"{run_dir} is not a local directory: give --out")
    if not _is_remote(run_dir):
        _refuse_unreadable_rows(run_dir, rows_unreadable(run_dir))  # else read as deleted
        try:
            _refuse_changed_rows(run_dir, check_run(LocalFiles(), run_dir))
        except StreamAssignError as exc:
            raise _damaged_run_refusal(LocalFiles(), run_dir, exc) from exc
    _check_report_out(out or Path(run_dir) / "report")
    _preflight(master)

    with _one_line_failures("writing the report"), _session(master) as session:
        if _is_remote(run_dir):
            try:
                check_run(files_for(run_dir, session), run_dir)
            except StreamAssignError as exc:
                raise _damaged_run_refusal(files_for(run_dir, session), run_dir, exc) from exc
        page = _render(session, run_dir, out, spark_tasks)
    click.echo(f"report: {page}")
    click.echo(f"next: open {page.as_uri()} in a browser")
