"""Run directories: written aside, published whole, never destroyed by a failed run.

A run is a directory holding ``rebalances/`` (Parquet) and ``manifest/`` (one JSON line). A
simulation writes into a hidden sibling, ``.<name>.partial-<run id>``, with the manifest last,
and only then moves it to ``<name>``: a reader sees a complete run or none. An existing run is
replaced only when asked (``--overwrite``) and only once the new one is complete: it is first
renamed aside (``.<name>.replaced-<run id>``), then the new run is renamed into place, then the
old one is deleted, so a crash at any point leaves one complete run (at worst, under the
``.replaced`` name). The same steps serve the report's folder.

Local paths use ``os`` directly; other URIs (``hdfs://``, ``s3a://``) go through Hadoop's
``FileSystem`` in the Spark JVM (:class:`HadoopFiles`). Renames are atomic on local disks and
HDFS; object stores copy, so there a crash can leave a partial folder, never a half-replaced one.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any, Final, Protocol

from ..errors import DamagedRunError, PublishError
from ..files import write_atomically
from .scenarios import PipelineError
from .signals import deferred_signals

__all__ = [
    "MANIFEST",
    "REBALANCES",
    "Files",
    "HadoopFiles",
    "LocalFiles",
    "check_rows_read",
    "check_run",
    "files_for",
    "is_remote",
    "new_run_id",
    "publish",
    "read_manifest",
    "replaceable",
    "run_damage",
    "staging_path",
    "write_manifest",
]

#: Where the rows and the manifest go under a run directory.
REBALANCES: Final = "rebalances"
MANIFEST: Final = "manifest"
#: The manifest's file name inside ``manifest/`` (what ``spark.read.text`` reads back).
MANIFEST_FILE: Final = "part-00000.json"


def is_remote(path: str) -> bool:
    """A Hadoop URI other than ``file:`` (written through Spark, not ``os``)."""
    return "://" in path and not path.startswith("file:")


def new_run_id() -> str:
    """Sortable by start time, unique across concurrent runs: ``20261126T121843Z-3f9a1c``."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{secrets.token_hex(3)}"


def _split(path: str) -> tuple[str, str]:
    """(parent, name) of a local path or URI, trailing slashes ignored."""
    trimmed = path.rstrip("/")
    parent, _, name = trimmed.rpartition("/")
    return parent, name


def staging_path(final: str, run_id: str, kind: str = "partial") -> str:
    """The hidden sibling of ``final`` a run is written into (``kind``: partial, replaced)."""
    parent, name = _split(final)
    return f"{parent}/.{name}.{kind}-{run_id}"


class Files(Protocol):
    """The few file operations publishing needs, on a local disk or a Hadoop file system."""

    def exists(self, path: str) -> bool: ...

    def is_empty_dir(self, path: str) -> bool: ...

    def rename(self, source: str, target: str) -> None: ...

    def delete(self, path: str) -> None: ...

    def read_text(self, path: str) -> str | None: ...

    def has_files(self, path: str, suffix: str) -> bool: ...

    def write_text(self, path: str, text: str) -> None:
        """Write a new file whole or not at all (a reader never sees half of it)."""
        ...


class LocalFiles:
    """:class:`Files` on the local disk."""

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def is_empty_dir(self, path: str) -> bool:
        return os.path.isdir(path) and not os.listdir(path)

    def rename(self, source: str, target: str) -> None:
        os.replace(source, target)

    def delete(self, path: str) -> None:
        """Raises when something is left (a caller says so or suppresses it knowingly)."""
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)

    def read_text(self, path: str) -> str | None:
        try:
            return Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    def has_files(self, path: str, suffix: str) -> bool:
        root = Path(path)
        return root.is_dir() and any(p.name.endswith(suffix) for p in root.rglob("*"))

    def write_text(self, path: str, text: str) -> None:
        """Atomically and durably (``files.write_atomically``: a unique hidden temporary file in
        the same folder, which Spark skips, fsynced and renamed over ``path``)."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, text.encode("utf-8"))


class HadoopFiles:
    """:class:`Files` through Hadoop's ``FileSystem`` in a Spark session's JVM."""

    def __init__(self, spark: Any) -> None:
        self._jvm = spark.sparkContext._jvm
        self._conf = spark.sparkContext._jsc.hadoopConfiguration()

    def _fs(self, path: str) -> tuple[Any, Any]:
        jpath = self._jvm.org.apache.hadoop.fs.Path(path)
        return jpath.getFileSystem(self._conf), jpath

    def exists(self, path: str) -> bool:
        fs, jpath = self._fs(path)
        return bool(fs.exists(jpath))

    def is_empty_dir(self, path: str) -> bool:
        fs, jpath = self._fs(path)
        return bool(fs.getFileStatus(jpath).isDirectory()) and len(fs.listStatus(jpath)) == 0

    def rename(self, source: str, target: str) -> None:
        fs, jsource = self._fs(source)
        if not fs.rename(jsource, self._fs(target)[1]):
            raise PipelineError(f"cannot rename {source} to {target}")

    def delete(self, path: str) -> None:
        """Raises when something is left: Hadoop's ``delete`` may say so by returning false."""
        fs, jpath = self._fs(path)
        if not fs.delete(jpath, True) and fs.exists(jpath):
            raise PipelineError(f"cannot delete {path}")

    def read_text(self, path: str) -> str | None:
        fs, jpath = self._fs(path)
        if not fs.exists(jpath):
            return None
        stream = fs.open(jpath)
        try:
            reader = self._jvm.java.io.BufferedReader(
                self._jvm.java.io.InputStreamReader(stream, "UTF-8")
            )
            line = reader.readLine()
            return None if line is None else str(line)
        finally:
            stream.close()

    def has_files(self, path: str, suffix: str) -> bool:
        fs, jpath = self._fs(path)
        if not fs.exists(jpath):
            return False
        found = fs.listFiles(jpath, True)
        while found.hasNext():
            if str(found.next().getPath().getName()).endswith(suffix):
                return True
        return False

    def write_text(self, path: str, text: str) -> None:
        parent, name = _split(path)
        temporary = f"{parent}/.tmp-{secrets.token_hex(4)}-{name}"
        fs, jtemp = self._fs(temporary)
        stream = fs.create(jtemp, False)
        try:
            stream.write(bytearray(text.encode("utf-8")))
            stream.hsync()
        finally:
            stream.close()
        self.rename(temporary, path)


def files_for(path: str, spark: Any = None) -> Files:
    """Local files for local paths; Hadoop's (which needs ``spark``) for other URIs."""
    if not is_remote(path):
        return LocalFiles()
    if spark is None:
        raise PipelineError(f"{path}: a remote path needs a Spark session")
    return HadoopFiles(spark)


def write_manifest(files: Files, run_dir: str, manifest: dict[str, Any]) -> None:
    """``run_dir/manifest/part-00000.json``: one JSON line, written whole or not at all."""
    files.write_text(_manifest_path(run_dir), json.dumps(manifest, sort_keys=True) + "\n")


def describe_existing(files: Files, final: str) -> str | None:
    """Why ``final`` cannot simply be written (it holds something), or None if it is free."""
    if not files.exists(final) or files.is_empty_dir(final):
        return None
    manifest = read_manifest(files, final)
    if manifest is None:
        return f"{final} exists and is not a complete run"
    label = manifest.get("run_id") or manifest.get("created") or "an earlier run"
    damage = run_damage(files, final)
    if damage is not None:
        return f"{final} holds a damaged run ({label}: {damage})"
    return f"{final} already holds a complete run ({label})"


#: What Spark escapes in a partition folder's value (``ExternalCatalogUtils.escapePathName``).
_ESCAPED_IN_PARTITIONS: Final = frozenset("\"#%'*/:=?\\{[]^\x7f") | {chr(c) for c in range(1, 32)}


def _partition_folder(column: str, value: str) -> str:
    """``assignor=task%3Asticky``: the folder Spark's ``partitionBy`` writes ``value`` to."""
    escaped = "".join(f"%{ord(c):02X}" if c in _ESCAPED_IN_PARTITIONS else c for c in value)
    return f"{column}={escaped}"


def run_damage(files: Files, run_dir: str) -> str | None:
    """What is wrong with the run in ``run_dir``, as far as its files tell without Spark (a
    few rows deleted show only in ``report``'s count), or None. Said the way ``report`` says
    it when it refuses the run: ``no rows of task:sticky under rebalances/``."""
    try:
        manifest = check_run(files, run_dir)
    except PipelineError as exc:  # "DIR: what is wrong; what to do"
        return str(exc).removeprefix(f"{run_dir}: ").removeprefix("damaged run: ").split("; ")[0]
    assignors = manifest.get("assignors")
    rows_dir = f"{run_dir.rstrip('/')}/{REBALANCES}"
    missing = [
        str(name)
        for name in (assignors if isinstance(assignors, list) else [])
        if not files.has_files(f"{rows_dir}/{_partition_folder('assignor', str(name))}", ".parquet")
    ]
    if missing:
        return f"no rows of {', '.join(missing)} under {REBALANCES}/"
    return None


def replaceable(files: Files, final: str, marker: str) -> bool:
    """Whether ``--overwrite`` may replace ``final``: it is free, or it holds ``marker`` (a
    run's manifest, a report's page). Anything else (a home directory given as ``--out`` by
    mistake, a folder without a manifest) is never moved aside and deleted."""
    if not files.exists(final) or files.is_empty_dir(final):
        return True
    return files.read_text(f"{final.rstrip('/')}/{marker}") is not None


def publish(files: Files, staging: str, final: str, run_id: str, what: str = "run") -> str | None:
    """Move the complete ``staging`` folder to ``final``, replacing what is there only after
    moving it aside, and deleting it only once the new one is in place. ``what`` (run, report)
    names them in messages.

    Ctrl-C, SIGTERM and SIGHUP wait until the new run is in place
    (:func:`.signals.deferred_signals`), then raise ``KeyboardInterrupt(signum)``: stopped
    halfway, the old run would be left aside and the new one deleted by the caller's cleanup.
    A second signal ends at once. A failure puts the old run back only where nothing took its
    place (on an object store a rename copies in pages), deletes ``staging`` and raises
    :class:`PublishError` saying where the old run is. The old run's deletion is not deferred
    (a slow remote delete must not hold a signal): stopped, it leaves at worst a ``.replaced-``
    folder beside the new run. Returns None, or, when that deletion failed, a note saying
    where the old run was left (the new one is in place: not a failure)."""
    aside = staging_path(final, run_id, "replaced")
    replacing: bool | None = None  # whether a run was there; None: looking failed
    moved = False
    try:
        with deferred_signals():
            try:
                replacing = files.exists(final)
                if replacing:
                    files.rename(final, aside)
                files.rename(staging, final)
                moved = True
            except BaseException:
                if replacing and files.exists(aside) and not files.exists(final):
                    files.rename(aside, final)  # put the old run back
                raise
    except Exception as exc:  # not a signal: those end without a slow cleanup
        raise _not_published(files, staging, final, aside, replacing, what) from exc
    finally:  # after a deferred signal too
        left = _delete_replaced(files, aside, what) if moved and replacing else None
    return left


def _not_published(
    files: Files, staging: str, final: str, aside: str, replacing: bool | None, what: str
) -> PublishError:
    """The error of a failed publish, its staging folder deleted (a new run that is not in
    place is of no use: the command is run again). Says where the old run is by looking, not
    by the step that failed: a put-back may have failed too."""
    with contextlib.suppress(Exception):  # the move's failure is what to report
        files.delete(staging)
    message = f"could not move the new {what} into {final}"
    if replacing is None:  # failed at the first look: nothing was moved
        return PublishError(message, f"{final} left as it was")
    if not replacing:
        return PublishError(message, f"no earlier {what} was there")
    try:
        old_aside = files.exists(aside)
        final_taken = old_aside and files.exists(final)
    except Exception:  # the file system is gone too: say both places
        return PublishError(message, f"the earlier {what} is in {final} or {aside}")
    if not old_aside:
        return PublishError(message, f"the earlier {what} in {final} kept")
    clear = f"delete {final} (part of the new {what}), then " if final_taken else ""
    return PublishError(message, f"the earlier {what} is in {aside}: {clear}move it to {final}")


def _delete_replaced(files: Files, aside: str, what: str) -> str | None:
    """Delete the old run once the new one is in place; a note if that failed (it is then
    left aside, which a message must not call kept: it no longer is where it was)."""
    try:
        files.delete(aside)
    except Exception as exc:
        cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"the {what} it replaced is left in {aside} (deleting it failed: {cause[:300]})"
    return None


def _manifest_path(run_dir: str) -> str:
    return f"{run_dir.rstrip('/')}/{MANIFEST}/{MANIFEST_FILE}"


def _parse_manifest(text: str | None) -> dict[str, Any] | None:
    """A manifest's JSON object, or None when there is no text or it is not one JSON object."""
    if text is None:
        return None
    try:
        loaded = json.loads(text)
    except ValueError:
        return None
    return loaded if isinstance(loaded, dict) else None


def read_manifest(files: Files, run_dir: str) -> dict[str, Any] | None:
    """The manifest of the run in ``run_dir``; None when it has none or it is no JSON object."""
    return _parse_manifest(files.read_text(_manifest_path(run_dir)))


def check_run(files: Files, run_dir: str) -> dict[str, Any]:
    """The manifest of a complete run with rows; else a :class:`PipelineError` saying, in one
    line, what is wrong and what to do: no run, an incomplete one, a damaged one (rows the
    manifest counts are gone), or an empty one (it wrote no rows)."""
    if not files.exists(run_dir):
        raise PipelineError(f"{run_dir}: no such run directory (run streamassign simulate first)")
    text = files.read_text(_manifest_path(run_dir))  # read once: it could change in between
    manifest = _parse_manifest(text)
    rows_dir = f"{run_dir.rstrip('/')}/{REBALANCES}"
    has_rows = files.has_files(rows_dir, ".parquet")
    if manifest is None and text is not None:
        raise PipelineError(
            f"{run_dir}: the manifest {MANIFEST}/{MANIFEST_FILE} is unreadable (not one JSON "
            "object: damaged or edited); run streamassign simulate again"
        )
    if manifest is None:
        what = "has rows but no manifest" if has_rows else "has no manifest and no rows"
        raise PipelineError(
            f"{run_dir}: not a complete run ({what}: the simulation that wrote it was "
            "interrupted or failed, or this is not a run directory); run streamassign simulate "
            "again"
        )
    rows = manifest.get("rows")
    if type(rows) is not int or rows < 0:  # simulate always writes the count; bool is no count
        got = "no 'rows'" if "rows" not in manifest else f"'rows' {json.dumps(rows)}"
        raise PipelineError(
            f"{run_dir}: damaged manifest {MANIFEST}/{MANIFEST_FILE}: {got}, not a count of "
            "the rows written (damaged or edited); run streamassign simulate again"
        )
    if rows == 0:
        raise PipelineError(
            f"{run_dir}: the run is empty (0 rebalances written); check its manifest "
            f"({MANIFEST}/{MANIFEST_FILE}) and run streamassign simulate with more scenarios"
        )
    if not has_rows:
        raise DamagedRunError(
            f"{run_dir}: damaged run: {REBALANCES}/ {_why_no_rows(files, rows_dir)}, but the "
            f"manifest says {rows:,} rows were written (deleted or moved?); run streamassign "
            "simulate again"
        )
    return manifest


def _why_no_rows(files: Files, rows_dir: str) -> str:
    """Why a run's rows folder holds no Parquet files, as the end of a sentence."""
    if not files.exists(rows_dir):
        return "is missing"
    if isinstance(files, LocalFiles) and os.path.islink(rows_dir) and not os.path.exists(rows_dir):
        return f"is a symbolic link to {os.readlink(rows_dir)}, which does not exist"
    return "holds no Parquet files"


def check_rows_read(
    run_dir: str, manifest: dict[str, Any], rows_read: int, assignors_read: set[str]
) -> None:
    """Refuse, with a :class:`DamagedRunError` in one line, rows read back that are not the
    rows the manifest says the run wrote: an assignor of the manifest with no row (its folder
    deleted, or lost with an object-store prefix) or another count of rows (some of its files
    deleted, or files added). Reporting on what is left would compare fewer assignors, or some
    on fewer traces, with nothing on the page saying so. Manifests without ``rows`` or
    ``assignors`` (not written by ``simulate``) are not checked against them."""
    written = manifest.get("rows")
    expected = manifest.get("assignors")
    missing = [a for a in expected if a not in assignors_read] if isinstance(expected, list) else []
    if missing:
        counts = f"{rows_read:,} of its {written:,} rows" if type(written) is int else "its rows"
        raise DamagedRunError(
            f"{run_dir}: damaged run: no rows of {', '.join(map(str, missing))} under "
            f"{REBALANCES}/ ({counts} read; files deleted or moved?); run streamassign simulate "
            "again"
        )
    if type(written) is int and rows_read != written:
        why = "files deleted or moved?" if rows_read < written else "files added from elsewhere?"
        raise DamagedRunError(
            f"{run_dir}: damaged run: {rows_read:,} rows read under {REBALANCES}/, but the "
            f"manifest says {written:,} were written ({why}); run streamassign simulate again"
        )
