"""The folders the pipeline commands write: local or remote run folders, ``--out`` checks
(dangling links, files in the way), and publishing a staged run or report."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import click

from ..errors import PublishError
from ..text import listed
from .failures import _spark_failure

#: The file in a report's folder holding the id of the render that wrote it.
REPORT_ID: Final = "report-id.txt"


def _is_remote(path: str) -> bool:
    from ..pipeline.runs import is_remote

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


def _publish(
    files: Any, staging: str, final: str, run_id: str, what: str, marker: str = ""
) -> None:
    """``runs.publish``, a failure as one line saying where the earlier run or report is (the
    caller's "kept" would not be true when it was left aside), and a note as a note. A signal
    comes out as ``KeyboardInterrupt(signum, where)``: publish knows best where each one is,
    and :func:`_one_line_failures` says that instead of the caller's "kept"."""
    from ..pipeline.runs import publish

    try:
        left = publish(files, staging, final, run_id, what, marker)
    except PublishError as exc:
        cause = _spark_failure(exc.__cause__) if exc.__cause__ is not None else str(exc)
        raise click.ClickException(f"publishing the {what} failed: {cause}; {exc.where}") from exc
    if left is not None:
        click.echo(f"note: {left}", err=True)


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


#: Files a desktop leaves in a folder it showed (Finder, Explorer): nobody's work, never named
#: as the user's, so they neither block a report nor make a run's --overwrite say more.
DESKTOP_LITTER = frozenset({".DS_Store", "Thumbs.db", "desktop.ini"})


def users_files(run_dir: str) -> list[str]:
    """What the local run folder ``run_dir`` holds that neither ``simulate`` nor ``report``
    wrote there and Spark does not read as rows (notes beside the run's folders, in
    ``rebalances/`` beside the partition folders, in ``report/``), by its path under the run;
    a folder the run does not write by its path with a ``/``, once; one that cannot be
    listed likewise (what it holds is not known to be the run's), as is a folder of the rows
    that cannot be read (``rebalances/assignor=.../ (cannot be read)``: what Spark would read
    there is not known). ``--overwrite`` deletes them with the run. Files added among the rows
    are ``rows_added``'s."""
    from ..pipeline.runs import (
        MANIFEST,
        REBALANCES,
        LocalFiles,
        row_files,
        unreadable_folders,
    )

    if _is_remote(run_dir) or not os.path.isdir(run_dir):
        return []
    found: list[str] = []
    for name in sorted(os.listdir(run_dir)):
        if name in (MANIFEST, REBALANCES, "report") and os.path.isdir(f"{run_dir}/{name}"):
            continue
        if not name.startswith(".report."):  # an interrupted render's staging or replaced copy
            found.append(f"{name}/" if os.path.isdir(f"{run_dir}/{name}") else name)
    found += [s for s in _entries(run_dir, MANIFEST) if not written_by_a_run(s)]
    unreadable = unreadable_folders(run_dir)
    if unreadable:
        found += [  # a link loop in rebalances' place is named above, as a file
            shown
            for shown in _beside_unreadable_rows(run_dir, unreadable)
            if shown.removesuffix("/ (cannot be read)") not in found
        ]
    else:
        rows = {f"{REBALANCES}/{shown}" for shown in row_files(LocalFiles(), run_dir)}
        found += [
            s for s in _entries(run_dir, REBALANCES) if s not in rows and not written_by_a_run(s)
        ]
    try:
        found += [f"report/{name}" for name in report_extras(Path(run_dir) / "report")]
    except OSError:
        found.append("report/")
    return [shown for shown in found if not _desktop_litter(Path(run_dir) / shown)]


def _beside_unreadable_rows(run_dir: str, unreadable: Sequence[str]) -> list[str]:
    """``users_files`` in ``rebalances/`` when folders of the rows (``unreadable``, by their
    paths under the run with a ``/``) cannot be read: what is in the others that the run did
    not write and Spark does not read as rows, then each of those folders once, said so
    (``--overwrite`` deletes what they hold, not known), unless a folder named holds it."""
    from ..pipeline.runs import REBALANCES, readable_row_files

    rows = {f"{REBALANCES}/{shown}" for shown in readable_row_files(run_dir)}
    found = [
        shown
        for shown in _entries(run_dir, REBALANCES)
        if shown not in rows
        and not written_by_a_run(shown)
        and not any(shown.startswith(folder) for folder in unreadable)
    ]
    named = [shown for shown in found if shown.endswith("/")]
    return found + [
        f"{folder} (cannot be read)"
        for folder in unreadable
        if not any(folder.startswith(other) for other in named)
    ]


def _entries(run_dir: str, top: str) -> list[str]:
    """The files in the run's folder ``top`` by their path under ``run_dir``; a folder in it
    other than ``rebalances/``'s partition folders (``assignor=...``) by its path with a
    ``/``, once, as is one that cannot be listed."""
    from ..pipeline.runs import REBALANCES

    found: list[str] = []

    def shown(path: str) -> str:
        return os.path.relpath(path, run_dir).replace(os.sep, "/")

    def unlisted(exc: OSError) -> None:
        found.append(f"{shown(str(exc.filename))}/")

    if not os.path.isdir(f"{run_dir}/{top}"):
        return found
    for folder, folders, names in os.walk(f"{run_dir}/{top}", onerror=unlisted):
        here = shown(folder)
        partitions = [name for name in folders if here == REBALANCES and "=" in name]
        found += [f"{here}/{name}/" for name in sorted(set(folders) - set(partitions))]
        folders[:] = partitions
        found += [f"{here}/{name}" for name in sorted(names)]
    return found


def written_by_a_run(shown: str) -> bool:
    """Whether the file ``shown`` (its path under a run's folder, in ``manifest/`` or in
    ``rebalances/``, not among its rows) is one ``simulate`` writes: the manifest, Spark's
    markers and checksum files."""
    from ..pipeline.runs import MANIFEST, MANIFEST_FILE, MANIFEST_PATH, REBALANCES

    name = shown.rpartition("/")[2]
    if shown.startswith(f"{REBALANCES}/"):
        return name in ("_SUCCESS", "._SUCCESS.crc") or (
            name.startswith(".") and name.endswith(".crc") and shown.count("/") == 2
        )
    return shown in (MANIFEST_PATH, f"{MANIFEST}/.{MANIFEST_FILE}.crc")


def report_extras(folder: Path) -> list[str]:
    """What the report folder ``folder`` holds that a report does not write (its page, CSV
    files and id), by name; a folder with a ``/``. ``report`` replaces the folder whole.
    Raises ``OSError`` if ``folder`` cannot be listed."""
    from ..pipeline.report import CSV_FILES

    if not folder.is_dir():
        return []
    own = {"report.html", REPORT_ID, *CSV_FILES}
    return [
        f"{name}/" if (folder / name).is_dir() else name
        for name in sorted(os.listdir(folder))
        if name not in own and not _desktop_litter(folder / name)
    ]


def _desktop_litter(path: Path) -> bool:
    """Whether ``path`` is a file a desktop left (``DESKTOP_LITTER``); a folder of that name
    is someone's, and so is what cannot be looked at."""
    if path.name not in DESKTOP_LITTER:
        return False
    try:
        return not path.is_dir()
    except OSError:
        return False


def deleting(added: Sequence[str], others: Sequence[str], keep: bool = True) -> str:
    """What ``--overwrite`` deletes beside the run, said in a remedy's brackets: the files
    ``added`` among its rows (named before: "that file", "those files") and the user's
    ``others`` (``users_files``, named here); with ``keep``, how to keep them. "" if none."""
    if not added and not others:
        return ""
    named = ("that file" if len(added) == 1 else "those files") if added else ""
    if others:
        named = f"{named} and {listed(others)}" if named else listed(others)
    moved = "it" if len(added) + len(others) == 1 else "them"
    said = f"deleting {named} with the run"
    if not keep:
        return said
    return f"{said}: move {moved} out of the run's folder first to keep {moved}"


def also_deleted(run_dir: str) -> str:
    """The user's files in the run folder ``run_dir`` (``users_files``), as the end of a
    remedy that deletes them with the run (``--overwrite``): `` (deleting ...)``, or ""."""
    said = deleting([], users_files(run_dir))
    return f" ({said})" if said else ""
