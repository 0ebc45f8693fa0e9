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
import errno
import functools
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import sys
import urllib.parse
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

import attrs

from ..errors import DamagedRunError, ExecutorCodeError, PublishError
from ..files import write_atomically
from ..text import listed
from .scenarios import PipelineError
from .signals import deferred_signals

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

__all__ = [
    "CODE_FINGERPRINT",
    "MANIFEST",
    "OTHER_CODE_LINE",
    "REBALANCES",
    "ROW_FILES",
    "ROW_SHA256",
    "SIMULATE_AGAIN",
    "Code",
    "Files",
    "HadoopFiles",
    "LocalFiles",
    "Unreadable",
    "added_text",
    "check_executor_code",
    "check_rows_read",
    "check_run",
    "checksum_damage",
    "code_fingerprint",
    "files_for",
    "is_remote",
    "is_run_id",
    "new_run_id",
    "publish",
    "read_manifest",
    "readable_row_files",
    "replaceable",
    "row_digests",
    "row_files",
    "rows_added",
    "rows_damage",
    "rows_unchecked",
    "rows_unreadable",
    "run_damage",
    "sources_sha256",
    "staging_path",
    "this_code",
    "unreadable_folders",
    "why_other_code",
    "write_manifest",
]

#: The manifest's record of the files under ``rebalances/`` as the run wrote them (every file
#: Spark reads there: its Parquet files): their paths under it and their sizes in bytes. A rerun
#: checks them before it keeps the run (a file deleted with its checksum file, or copied without
#: checksum files, or one added, shows there).
ROW_FILES: Final = "row_files"
#: The manifest's record of the same files' SHA-256 digests (hex): bytes changed show there
#: whether or not a checksum file is beside them.
ROW_SHA256: Final = "row_sha256"

#: Where the rows and the manifest go under a run directory.
REBALANCES: Final = "rebalances"
MANIFEST: Final = "manifest"
#: The manifest's file name inside ``manifest/`` (what ``spark.read.text`` reads back).
MANIFEST_FILE: Final = "part-00000.json"
#: A run's manifest under its folder: its text (which holds the run's id) tells runs apart.
MANIFEST_PATH: Final = f"{MANIFEST}/{MANIFEST_FILE}"

#: The remedy ending a refusal of a damaged run: what this code does about its own run (the
#: command line says another when other code wrote it: this code cannot write its report again).
SIMULATE_AGAIN: Final = "run streamassign simulate again with --overwrite"


#: The manifest's key for :func:`code_fingerprint` of the code that wrote the run.
CODE_FINGERPRINT: Final = "code_sha256"


@attrs.frozen
class Code:
    """The streamassign package a process runs: where it was imported from and its
    :func:`sources_sha256` (None: its files could not be read, e.g. a loader that is neither a
    folder nor a zip; such code is never taken for any other)."""

    where: str
    fingerprint: str | None


@functools.cache
def this_code() -> Code:
    """The :class:`Code` this process runs, read once per process (about 110 files:
    milliseconds). Read through the package's loader (``importlib.resources``): a package
    imported from a zip (``--ship-code``, ``--py-files``) has the same fingerprint as its
    folder."""
    import importlib.resources

    package = __name__.split(".")[0]
    try:
        root = importlib.resources.files(package)
    except (ModuleNotFoundError, TypeError, ValueError):
        return Code(package, None)
    return Code(str(root), sources_sha256(root))


def code_fingerprint() -> str | None:
    """``this_code().fingerprint``: a run's rows depend on the code as much as on its
    settings, and the distribution's version stays the same from one commit to the next: a
    rerun keeps a run only if this is the same too, and never when it is None."""
    return this_code().fingerprint


def sources_sha256(package: Traversable) -> str | None:
    """sha256 over the files the package ships under ``package`` (a folder, or a zip's
    folder): sources and the files that shape rows and reports (the report's template,
    Spark's logging setup), as ``_shipped`` tells them from editor leftovers. Each file's
    path under ``package``, in sorted order, then its bytes (lengths first: no two sets of
    files hash the same bytes). None if no ``.py`` file is found (a loader this cannot read:
    the hash of nothing would match every such package) or a file cannot be read."""
    digest, sources = hashlib.sha256(), 0
    try:
        for relative, entry in sorted(_shipped(package, "")):
            content = entry.read_bytes()
            digest.update(f"{len(relative)}:{relative}{len(content)}:".encode())
            digest.update(content)
            sources += relative.endswith(".py")
    except OSError:  # a file removed while read (an editor's save): no fingerprint
        return None
    return digest.hexdigest() if sources else None


def _shipped(folder: Traversable, prefix: str) -> Iterator[tuple[str, Traversable]]:
    """The regular files under ``folder`` whose names could be importable or shipped
    (``name.ext``, ``name`` an identifier), with their paths under it; subpackages by their
    identifier names, bytecode caches left out. Dot files (an editor's ``.#plan.py`` lock, a
    dangling link), backups (``plan.py~``, ``#plan.py#``) and bytecode are not the package."""
    for entry in folder.iterdir():
        name = entry.name
        if not name.split(".", 1)[0].isidentifier() or name.endswith(("~", ".pyc", ".pyo")):
            continue
        if entry.is_dir():
            if name != "__pycache__":
                yield from _shipped(entry, f"{prefix}{name}/")
        elif entry.is_file():  # False for a dangling link
            yield f"{prefix}{name}", entry


def check_executor_code(driver: Code) -> None:
    """On an executor: :class:`ExecutorCodeError` if its Python workers import other
    streamassign code than ``driver`` (whose fingerprint the run's manifest records), so that
    no row of a run comes from code its manifest does not name. The line names both packages;
    the driver adds the cause (:func:`why_other_code`), as a worker running other code may be
    older code that words it otherwise. Free after the first call in a worker process
    (``this_code`` is read once)."""
    ours = this_code()
    if driver.fingerprint is None or ours.fingerprint == driver.fingerprint:
        return
    shown = ours.fingerprint[:12] + "…" if ours.fingerprint else "no fingerprint"
    raise ExecutorCodeError(
        f"Spark's Python workers import other streamassign code ({ours.where}, {shown}) than "
        f"this command ({driver.where}, {driver.fingerprint[:12]}…)"
    )


#: The part of a worker's :class:`ExecutorCodeError` line that names both packages, as every
#: version writes it (older ones add a cause of their own after it, which the driver replaces).
OTHER_CODE_LINE: Final = re.compile(
    r"(Spark's Python workers import other streamassign code \((?P<where>.+?), "
    r"(?:[0-9a-f]{12}…|no fingerprint)\) than this command \(.+?, [0-9a-f]{12}…\))"
)


#: How the zip of the driver's code shipped to the executors is named (``spark.ship_code``).
SHIPPED_CODE_PREFIX = "streamassign-pipeline-code-"


def why_other_code(worker_where: str, driver: Code, shipped: bool, local_master: bool) -> str:
    """On the driver: why a Python worker imports the package at ``worker_where`` and not the
    ``driver``'s, and the remedy, one cause: the very folder (or the zip shipped from it)
    changed since the command read it (a ``local_master``'s workers only: a cluster's share
    paths, not files, with the driver); a package in the command's working directory (Spark's
    local workers start there, and it comes first on their path); a ``PYSPARK_PYTHON`` of the
    user's (the driver sets it to its own interpreter unless one is set); else the executors'
    own install, which ``shipped`` code did not come before."""
    # A bare name: a worker that could not tell its folder; resolved here, it would read as
    # a folder of ours (and need our working directory): no cause from its path then.
    if os.path.isabs(worker_where):
        worker = os.path.realpath(worker_where)
        same_folder = local_master and worker == os.path.realpath(driver.where)
        if same_folder or SHIPPED_CODE_PREFIX in worker:
            return "its files changed since the command started (an edit, a checkout); run it again"
        working = _working_directory()
        if working and os.path.dirname(worker) == working:
            return (
                f"a streamassign package in the working directory ({working}) comes first on "
                "the workers' path; run from a folder without one"
            )
    chosen = os.environ.get("PYSPARK_PYTHON")
    if chosen and chosen != sys.executable:
        return f"PYSPARK_PYTHON ({chosen}) has a streamassign of its own; install this one there"
    if shipped:
        return "the executors' Python imports its own streamassign first; install this one there"
    return "the executors' Python has a streamassign of its own; pass --ship-code"


def _working_directory() -> str | None:
    """The command's working directory, None if it was deleted meanwhile."""
    try:
        return os.path.realpath(os.getcwd())
    except FileNotFoundError:
        return None


def is_local_master(master: str) -> bool:
    """Whether a Spark ``master`` runs its workers on this machine: ``local``, ``local[4]``,
    ``local[*]``, ``local-cluster[...]`` (not ``spark://localhost``: a cluster's workers)."""
    return master.startswith("local")


def is_remote(path: str) -> bool:
    """A Hadoop URI other than ``file:`` (written through Spark, not ``os``)."""
    return "://" in path and not path.startswith("file:")


def new_run_id() -> str:
    """Sortable by start time, unique across concurrent runs: ``20261126T121843Z-3f9a1c``."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{secrets.token_hex(3)}"


_RUN_ID: Final = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{6}")


def is_run_id(text: str) -> bool:
    """Whether ``text`` is an id :func:`new_run_id` makes (a line ending aside)."""
    return _RUN_ID.fullmatch(text.removesuffix("\n")) is not None


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

    def file_sizes(self, path: str, suffix: str) -> dict[str, int]:
        """The files under ``path`` (at any depth) named ``*suffix``, by their paths under it,
        with their sizes; those Spark leaves out when it reads the folder (``_spark_skips``)
        left out."""
        ...

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
            shutil.rmtree(path, onerror=_naming_the_whole_path)
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

    def file_sizes(self, path: str, suffix: str) -> dict[str, int]:
        root = Path(path)
        return {
            relative.as_posix(): found.stat().st_size
            for found in sorted(root.rglob(f"*{suffix}"))
            if found.is_file() and not _spark_skips((relative := found.relative_to(root)).parts)
        }

    def write_text(self, path: str, text: str) -> None:
        """Atomically and durably (``files.write_atomically``: a unique hidden temporary file in
        the same folder, which Spark skips, fsynced and renamed over ``path``)."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, text.encode("utf-8"))


def _spark_skips(parts: Sequence[str]) -> bool:
    """Whether Spark leaves a file out when it reads the folder above it (``parts``: its path
    under that folder): a hidden name on the way (``.name``, ``_name`` but a partition's
    ``_column=value``; Hadoop's ``_SUCCESS``, checksum files ``.NAME.crc``, ``_temporary/``)
    or a file still being copied (``NAME._COPYING_``), as its file index does."""
    return any(
        part.startswith(".") or (part.startswith("_") and "=" not in part) for part in parts
    ) or parts[-1].endswith("._COPYING_")


def _naming_the_whole_path(function: Any, path: str, excinfo: Any) -> None:
    """``rmtree``'s error, naming the file it could not delete by its whole path (its own
    names it relative to its folder: ``'keep'``, which tells a reader nothing)."""
    error = excinfo[1]
    if isinstance(error, OSError) and error.filename is not None:
        error.filename = path  # what str(error) names
    raise error


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

    def file_sizes(self, path: str, suffix: str) -> dict[str, int]:
        fs, jpath = self._fs(path)
        if not fs.exists(jpath):
            return {}
        # Paths compared without scheme and authority: ``hdfs://nn/x`` lists as ``hdfs://nn:8020/x``.
        root = str(fs.makeQualified(jpath).toUri().getPath()).rstrip("/") + "/"
        sizes, found = {}, fs.listFiles(jpath, True)
        while found.hasNext():
            status = found.next()
            relative = str(status.getPath().toUri().getPath()).removeprefix(root)
            if relative.endswith(suffix) and not _spark_skips(relative.split("/")):
                sizes[relative] = int(status.getLen())
        return dict(sorted(sizes.items()))

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
    if isinstance(damage, Unreadable):  # not known to be damaged, nor complete
        return f"{final} already holds a run ({label}; {damage.brief})"
    if damage is not None:
        return f"{final} holds a damaged run ({label}: {damage})"
    return f"{final} already holds a complete run ({label})"


#: What Spark escapes in a partition folder's value (``ExternalCatalogUtils.escapePathName``).
_ESCAPED_IN_PARTITIONS: Final = frozenset("\"#%'*/:=?\\{[]^\x7f") | {chr(c) for c in range(1, 32)}


def _partition_folder(column: str, value: str) -> str:
    """``assignor=task%3Asticky``: the folder Spark's ``partitionBy`` writes ``value`` to."""
    escaped = "".join(f"%{ord(c):02X}" if c in _ESCAPED_IN_PARTITIONS else c for c in value)
    return f"{column}={escaped}"


def row_files(files: Files, run_dir: str) -> dict[str, int]:
    """The files Spark reads as the run's rows, as the manifest records them (:data:`ROW_FILES`):
    those in ``rebalances/``'s partition folders (``assignor=...``; a file beside them, a note,
    is not read), hidden ones aside. The run writes only Parquet files there."""
    found = files.file_sizes(f"{run_dir.rstrip('/')}/{REBALANCES}", "")
    return {shown: size for shown, size in found.items() if "/" in shown}


def row_digests(run_dir: str) -> dict[str, str]:
    """The SHA-256 digests of the files :func:`row_files` lists of the local run in
    ``run_dir`` (:data:`ROW_SHA256`)."""
    rows = Path(run_dir) / REBALANCES
    return {shown: _sha256(rows / shown) for shown in row_files(LocalFiles(), run_dir)}


def _sha256(path: Path) -> str:
    with path.open("rb") as data:
        return hashlib.file_digest(data, "sha256").hexdigest()


def run_damage(files: Files, run_dir: str) -> str | None:
    """What is wrong with the run in ``run_dir``, as far as its files tell without Spark (a
    few rows deleted show only in ``report``'s count), or None. Said the way ``report`` says
    it when it refuses the run: ``no rows of task:sticky under rebalances/``. A local folder
    of its rows that cannot be read is said as such, an :class:`Unreadable` (not damage:
    listing it would see no files, and call them deleted)."""
    if isinstance(files, LocalFiles) and (unreadable := rows_unreadable(run_dir)) is not None:
        return unreadable
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


#: The first bytes of a Hadoop checksum file (``.NAME.crc``, beside each file Spark writes
#: to a local folder): then the bytes per checksum (int32, big-endian) and one CRC32 each.
_CRC_MAGIC: Final = b"crc\0"


def rows_damage(run_dir: str, manifest: Mapping[str, Any]) -> str | None:
    """What the files under a local run's ``rebalances/`` show against what the run wrote, or
    None: against the paths, sizes and digests its ``manifest`` lists (:data:`ROW_FILES`,
    :data:`ROW_SHA256`: a file deleted, with its checksum file or not, one of another size,
    bytes changed), else against the checksum file Spark's local writer leaves beside each
    one. A run whose manifest lists none (older code, or written to a remote folder) is
    checked by its checksum files alone. A file or folder that cannot be read is said as
    such, as an :class:`Unreadable` (not damage). Files
    added are :func:`rows_added`'s. ``run_damage`` sees none of these, and a rerun must not
    keep such a run (every byte is read once: README command 1's 1.5 MB in milliseconds)."""
    unreadable = rows_unreadable(run_dir)
    if unreadable is not None:
        return unreadable
    listed, digests = manifest.get(ROW_FILES), manifest.get(ROW_SHA256)
    if not isinstance(listed, dict):
        return checksum_damage(run_dir)
    rows = Path(run_dir) / REBALANCES
    damage = _listing_damage(row_files(LocalFiles(), run_dir), listed)
    if damage is not None or not isinstance(digests, dict):
        return damage or checksum_damage(run_dir)
    for shown in sorted(listed):
        try:
            found = _sha256(rows / shown)
        except OSError as exc:
            return _unreadable(shown, exc)
        if digests.get(shown) != found:
            return f"{REBALANCES}/{shown} has bytes changed since it was written"
    return None


class Unreadable(str):
    """What :func:`rows_damage` or :func:`rows_unreadable` says of a file or folder of a run's
    rows it could not read (a permission, a disk error): nothing is known of its bytes, so the
    run is not known to be damaged (the way out is usually ``chmod``, not simulating it
    again). The string names it and why (``rebalances/x/ cannot be read (Permission
    denied)``); ``why`` is how a refusal says it, ``fix`` what makes it readable."""

    #: ``its rows cannot be checked: ...``; for a folder the run did not write, what it is.
    why: str
    #: ``its rows cannot be checked``, or ``rebalances/x/ cannot be read``: said of the run.
    brief: str
    #: ``make it readable (chmod)``, ``(chmod, by its owner)`` when another user owns it; without
    #: chmod when no permission is missing (a disk error, a loop of symbolic links).
    fix: str


def _unreadable(shown: str, exc: OSError, what: str = "") -> Unreadable:
    """A run's file ``shown`` (its path under ``rebalances/``; ``what``: what it is, if not
    one of its rows) that ``exc`` kept from being read (a permission, a disk error), said in
    a line: its bytes cannot be checked."""
    return _cannot_read(f"{what}{REBALANCES}/{shown}", exc, exc.filename, rows=True)


def _cannot_read(shown: str, exc: OSError, path: object, rows: bool) -> Unreadable:
    """An :class:`Unreadable` for ``shown`` (at ``path``) that ``exc`` kept from being read;
    ``rows``: it is the run's (its rows, or a folder of them), else a folder of someone's
    among them."""
    said = Unreadable(f"{shown} cannot be read ({exc.strerror or exc})")
    if rows:
        said.why, said.brief = f"its rows cannot be checked: {said}", "its rows cannot be checked"
    else:
        said.why = f"{said}, a folder the run did not write (Spark would read its files as rows)"
        said.brief = f"{shown} cannot be read"
    said.fix = _fix_for(exc, path)
    return said


def _fix_for(exc: OSError, path: object) -> str:
    """What makes ``path`` readable again after ``exc``: chmod for a permission (by its owner,
    if that is another user); fixing the links for a loop of them; else only that it must be."""
    if exc.errno == errno.ELOOP:
        return "fix the loop of symbolic links"
    if exc.errno not in (errno.EACCES, errno.EPERM):
        return "make it readable"
    try:  # the folder chmod would change: a link's target, else the link itself
        owner = _owner(str(path))
    except (OSError, TypeError, ValueError):
        return "make it readable (chmod)"
    return (
        "make it readable (chmod)"
        if owner == os.geteuid()
        else "make it readable (chmod, by its owner)"
    )


def _owner(path: str) -> int:
    try:
        return os.stat(path).st_uid
    except OSError:
        return os.stat(path, follow_symlinks=False).st_uid


def rows_unreadable(run_dir: str) -> Unreadable | None:
    """The first folder of a local run's rows (``rebalances/`` or a folder in it that Spark
    reads) that cannot be listed, or whose entries cannot be looked at (a permission), said
    as an :class:`Unreadable`; None if there is none (or no ``rebalances/``). Listing skips
    such a folder without a word (``Path.rglob``): its files would read as deleted."""
    unreadable = _read_rows(run_dir)[1]
    return unreadable[0] if unreadable else None


def readable_row_files(run_dir: str) -> dict[str, int]:
    """:func:`row_files` of a local run, in the folders of its rows that can be read (the
    others' files are not known: ``unreadable_folders``)."""
    return _read_rows(run_dir)[0]


def unreadable_folders(run_dir: str) -> list[str]:
    """Every folder of a local run's rows that cannot be read (``rows_unreadable``), by its
    path under the run with a ``/``: what it holds is not known."""
    return _read_rows(run_dir)[2]


def _read_rows(run_dir: str) -> tuple[dict[str, int], list[Unreadable], list[str]]:
    """What can be read of a local run's rows: the files Spark reads as rows (``row_files``)
    in the folders that can be read; each folder that cannot be (listed, or its entries looked
    at), as an :class:`Unreadable` and by its path under the run (with a ``/``).
    Folders Spark skips (hidden) are not looked into."""
    rows = Path(run_dir) / REBALANCES
    found: dict[str, int] = {}
    unreadable: list[Unreadable] = []
    folders: list[str] = []
    pending = [(rows, "")]  # each folder with its path under rows/ ("" for rows/ itself)
    while pending:
        folder, under = pending.pop()
        try:
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda entry: entry.name, reverse=True)
            for entry in entries:
                entry.stat(follow_symlinks=False)  # raises in a folder listed, not searched
        except (FileNotFoundError, NotADirectoryError):
            continue  # no rows there: what else tells it says so (missing, deleted)
        except OSError as exc:
            shown = folder.relative_to(rows.parent).as_posix()
            ours = shown == REBALANCES or (shown.count("/") == 1 and "=" in folder.name)
            unreadable.append(_cannot_read(f"{shown}/", exc, folder, rows=ours))
            folders.append(f"{shown}/")
            continue
        # Names only: a run holds thousands of row files, and hidden folders are never
        # walked into, so an entry's own name is all Spark's skip rule needs.
        for entry in entries:
            if under and not _spark_skips([entry.name]):  # rows are files in folders
                with contextlib.suppress(OSError):  # a link to what cannot be read: not known
                    if entry.is_file():
                        found[f"{under}{entry.name}"] = entry.stat().st_size
        pending += [
            (Path(entry.path), f"{under}{entry.name}/")
            for entry in entries
            if entry.is_dir(follow_symlinks=False) and not _spark_skips([entry.name])
        ]
    return dict(sorted(found.items())), unreadable, folders


def rows_added(run_dir: str, manifest: Mapping[str, Any]) -> list[str]:
    """The files under a local run's ``rebalances/`` that the run did not write and Spark would
    read with its rows (not in its manifest's :data:`ROW_FILES`; without a list, a Parquet file
    without the checksum file the others have), by their paths under the run (``rebalances/...``);
    none if there is none, or nothing to tell by (``rows_unchecked``). Only folders that can be
    read are looked into (``rows_unreadable``: what one that cannot holds is not known, and its
    files only go missing from what is found, never show as added). :func:`added_text` says
    them."""
    rows = Path(run_dir) / REBALANCES
    found, unreadable, _ = _read_rows(run_dir)
    if not unreadable:
        found = row_files(LocalFiles(), run_dir)  # as the manifest recorded them
    listed = manifest.get(ROW_FILES)
    if isinstance(listed, dict):
        added = sorted(set(found) - set(listed))
    elif any(rows.rglob(".*.parquet.crc")):
        added = [shown for shown in found if not (rows / _checksum_name(shown)).is_file()]
    else:
        added = []
    return [f"{REBALANCES}/{shown}" for shown in added]


def added_text(added: Sequence[str]) -> str:
    """What :func:`rows_added` found (``added``: one file or more), named in one sentence,
    listed as the user's other files are (``listed``: commas, the first dozen)."""
    if len(added) == 1:
        return f"{added[0]} is not a file the run wrote (added from elsewhere?)"
    return f"{listed(added)} are not files the run wrote (added from elsewhere?)"


def _checksum_name(shown: str) -> str:
    """``a/.b.crc``: where Hadoop's local writer puts the checksum file of ``a/b``."""
    folder, _, name = shown.rpartition("/")
    return f"{folder}/.{name}.crc" if folder else f".{name}.crc"


def rows_unchecked(run_dir: str, manifest: Mapping[str, Any]) -> str | None:
    """Why nothing can check every byte of the files of the local run in ``run_dir``, or None:
    its manifest lists none with their digests (:data:`ROW_FILES`, :data:`ROW_SHA256`) and no
    checksum file is beside them."""
    if isinstance(manifest.get(ROW_FILES), dict) and isinstance(manifest.get(ROW_SHA256), dict):
        return None
    if any((Path(run_dir) / REBALANCES).rglob(".*.parquet.crc")):
        return None
    return (
        "its manifest lists no files with their digests (a run written to a remote folder, or "
        f"by older code) and no checksum file (.*.parquet.crc) is under {REBALANCES}/ (copied "
        "without its dot files, or written through a file system that writes none)"
    )


def _listing_damage(found: Mapping[str, int], listed: Mapping[str, Any]) -> str | None:
    """How the run's files ``found`` differ from ``listed`` (both path under ``rebalances/``:
    bytes): one missing or of another size (one added is :func:`rows_added`'s)."""
    for shown, size in sorted(listed.items()):
        if shown not in found:
            return f"{REBALANCES}/{shown} is missing (the manifest lists it)"
        if found[shown] != size:
            return (
                f"{REBALANCES}/{shown} changed size since it was written ({size:,} bytes "
                f"then, {found[shown]:,} now)"
            )
    return None


def checksum_damage(run_dir: str) -> str | None:
    """What the Parquet files under a local run's ``rebalances/`` show against the checksum
    file Spark's local writer leaves beside each one: a file deleted (its checksum remains),
    bytes changed, one of them unreadable. None if every checksum file matches its file, or
    there is none (``rows_unchecked`` says so when nothing else checks the run; a file without
    one is ``rows_added``'s)."""
    rows = Path(run_dir) / REBALANCES
    for sidecar in sorted(rows.rglob(".*.parquet.crc")):
        data = sidecar.with_name(sidecar.name[1:].removesuffix(".crc"))
        shown = data.relative_to(rows).as_posix()
        if not data.is_file():
            return f"{REBALANCES}/{shown} is missing (its checksum file remains)"
        try:
            sums = sidecar.read_bytes()
        except OSError as exc:  # named, not its Parquet file: that one may read well
            return _unreadable(sidecar.relative_to(rows).as_posix(), exc, "the checksum file ")
        try:
            why = _checksum_mismatch(data, sums)
        except OSError as exc:
            return _unreadable(shown, exc)
        if why is not None:
            return f"{REBALANCES}/{shown} {why}"
    return None


def _checksum_mismatch(data: Path, sidecar: bytes) -> str | None:
    """How file ``data`` differs from what its Hadoop checksum file ``sidecar`` says, or None.
    Read a checksum chunk at a time: a run written by few tasks has files of hundreds of MB."""
    chunk = int.from_bytes(sidecar[4:8], "big") if sidecar[:4] == _CRC_MAGIC else 0
    sums = memoryview(sidecar)[8:]
    if chunk <= 0 or len(sums) % 4:
        return "has an unreadable checksum file (damaged)"
    if len(sums) // 4 != -(-data.stat().st_size // chunk):
        return "changed size since it was written"
    with data.open("rb") as rows:
        for index in range(len(sums) // 4):
            expected = int.from_bytes(sums[4 * index : 4 * index + 4], "big")
            if zlib.crc32(rows.read(chunk)) != expected:
                return "has bytes changed since it was written"
    return None


def replaceable(files: Files, final: str, marker: str) -> bool:
    """Whether ``--overwrite`` may replace ``final``: it is free, or it holds ``marker`` (a
    run's manifest, a report's page). Anything else (a home directory given as ``--out`` by
    mistake, a folder without a manifest) is never moved aside and deleted."""
    if not files.exists(final) or files.is_empty_dir(final):
        return True
    return files.read_text(f"{final.rstrip('/')}/{marker}") is not None


def publish(
    files: Files, staging: str, final: str, run_id: str, what: str = "run", marker: str = ""
) -> str | None:
    """Move the complete ``staging`` folder to ``final``, replacing what is there only after
    moving it aside, and deleting it only once the new one is in place. ``what`` (run, report)
    names them in messages; ``marker`` is the file, under a folder, whose text tells the new
    one from the old one (default: a run's manifest, which holds its ``run_id``).

    Ctrl-C, SIGTERM and SIGHUP wait until the new run is in place
    (:func:`.signals.deferred_signals`), then raise ``KeyboardInterrupt(signum, where)``:
    stopped halfway, the old run would be left aside and the new one deleted by the caller's
    cleanup. A second signal ends at once, with its ``where`` too. A failure puts the old run
    back only where nothing took its place (on an object store a rename copies in pages),
    deletes ``staging`` and raises :class:`PublishError`. Every ``where`` says where each run
    is as the markers in the folders show afterwards (:func:`_settle`): the steps that returned
    only tell whose part a folder without the marker holds, or stand in, said so, when the file
    system no longer answers (a signal to the process group stops Spark's JVM too). A rename
    that took effect but raised (an HDFS client's retry answered false) is no failure. The old
    run's deletion is not deferred (a slow remote delete must not hold a signal). Returns None,
    or a note: the new run is in place, but the old one was left aside (its deletion failed),
    or a move said it failed."""
    job = _Publishing(final, staging, run_id, what, marker or MANIFEST_PATH)
    done = _Done()
    try:
        with deferred_signals():
            _move_in(files, job, done)
        return _delete_replaced(files, job, done) if done.replacing else None
    except KeyboardInterrupt as exc:  # a deferred signal, a second one, or one while deleting
        raise _interrupted(files, job, done, exc) from exc
    except Exception as exc:
        return _failed(files, job, done, exc)


def _failed(files: Files, job: _Publishing, done: _Done, exc: Exception) -> str | None:
    """A :class:`PublishError` saying where each one is, ``staging`` deleted; or, when the new
    one is in place all the same (a rename that took effect but raised), a note saying so."""
    try:
        outcome = _settle(files, job, done, tidy=True)
    except KeyboardInterrupt as again:  # a signal while tidying: no more of it
        done.ended_early = True
        raise _interrupted(files, job, done, again) from exc
    if not outcome.in_place:
        message = f"could not move the new {job.what} into {job.final}"
        raise PublishError(message, outcome.where) from exc
    note = f"moving it into {job.final} said it failed ({_first_line(exc)}), but it is there"
    return f"{note}; {outcome.left}" if outcome.left else note


@attrs.frozen
class _Publishing:
    """One publish: its folders, and how messages name what it moves."""

    final: str
    staging: str
    run_id: str
    what: str
    marker: str

    @property
    def aside(self) -> str:
        """Where the old one is moved aside to, beside ``final``."""
        return staging_path(self.final, self.run_id, "replaced")

    def marked(self, folder: str) -> str:
        return f"{folder.rstrip('/')}/{self.marker}"

    @property
    def new_one(self) -> str:  # a report's id is nobody's to know
        return f"{self.what} {self.run_id}" if self.what == "run" else f"the {self.what}"


@attrs.define
class _Step:
    """One rename or deletion of publish: whether its call was made, and whether it returned.
    One called that did not return raised or was stopped by a signal: it may have taken effect
    all the same, or in part (an object store copies file by file): only the folders tell."""

    called: bool = False
    returned: bool = False

    def run(self, action: Callable[[], None]) -> None:
        self.called = True
        action()
        self.returned = True


@attrs.define
class _Done:
    """What publish read before moving (the markers' texts) and its steps, in order."""

    new_text: str | None = None
    old_text: str | None = None
    replacing: bool | None = None  # whether something was in ``final``; None: the look failed
    aside: _Step = attrs.Factory(_Step)  # final -> aside
    move_in: _Step = attrs.Factory(_Step)  # staging -> final
    put_back: _Step = attrs.Factory(_Step)  # aside -> final, only while final is absent
    put_back_error: str | None = None
    delete_old: _Step = attrs.Factory(_Step)  # aside, once the new one is in place
    delete_staging: _Step = attrs.Factory(_Step)  # when the file system no longer answered
    ended_early: bool = False  # a second signal (in the moves, the put-back, the tidying)

    @property
    def old_owns_final(self) -> bool:
        """Whether what ``final`` holds is the old one's: until the new one's rename is called
        (before it, only the old one was ever there), and again once the put-back is (it runs
        only when ``final`` is absent, so all it holds then came from ``aside``)."""
        return not self.move_in.called or self.put_back.called


#: What a folder holds, by its marker's text: the new one, the old one, or part of one.
_Held = Literal["new", "old", "part"]


@attrs.frozen
class _Seen:
    """What the folders hold afterwards: ``final`` the new one, the old one (by the marker's
    text), part of one (no such marker) or nothing (None); whether the others exist."""

    final: _Held | None
    aside: bool
    staging: bool


@attrs.frozen
class _Outcome:
    in_place: bool
    where: str
    left: str | None = None  # where the old one was left beside the new one in place


def _move_in(files: Files, job: _Publishing, done: _Done) -> None:
    """The moves, each step noted as called and as returned; after a failure, the old one put
    back."""
    try:
        done.new_text = files.read_text(job.marked(job.staging))
        done.replacing = files.exists(job.final)
        if done.replacing:
            done.old_text = files.read_text(job.marked(job.final))
            done.aside.run(lambda: files.rename(job.final, job.aside))
        done.move_in.run(lambda: files.rename(job.staging, job.final))
    except BaseException as exc:
        done.ended_early = isinstance(exc, KeyboardInterrupt)  # the first signal is deferred
        _put_back(files, job, done)
        raise


def _put_back(files: Files, job: _Publishing, done: _Done) -> None:
    """The old one moved back where nothing took its place (so whatever ``final`` holds once
    it was called is the old one's). Its failure is noted, not raised: the move's is the cause
    to report (a message says where the old one is by looking). A signal here is a second one:
    it ends publish at once, looking only."""
    if not done.replacing:
        return
    try:
        if files.exists(job.aside) and not files.exists(job.final):
            done.put_back.run(lambda: files.rename(job.aside, job.final))
    except KeyboardInterrupt:
        done.ended_early = True
        raise
    except Exception as exc:
        done.put_back_error = _first_line(exc)


def _interrupted(
    files: Files, job: _Publishing, done: _Done, exc: KeyboardInterrupt
) -> KeyboardInterrupt:
    """``KeyboardInterrupt(signum, where)``. Tidies (staging or the old one deleted) only
    after the first signal: a second one, or one during the old one's deletion, ends it."""
    signum = exc.args[0] if exc.args and isinstance(exc.args[0], int) else signal.SIGINT
    tidy = not done.ended_early and not done.delete_old.called
    try:
        outcome = _settle(files, job, done, tidy=tidy)
    except KeyboardInterrupt:  # yet another signal: no more looking
        return KeyboardInterrupt(signum, _where_by_steps(job, done, "interrupted again"))
    where = f"{outcome.where}; {outcome.left}" if outcome.left else outcome.where
    return KeyboardInterrupt(signum, where)


def _settle(files: Files, job: _Publishing, done: _Done, tidy: bool) -> _Outcome:
    """Where each one is, by looking: the new one in place (then, if ``tidy``, the old one
    deleted) or not (then, if ``tidy``, ``staging`` deleted). When the file system no longer
    answers, what the steps that returned tell, said so."""
    try:
        seen = _look(files, job, done)
    except Exception as exc:
        if tidy and not done.move_in.returned:
            with contextlib.suppress(Exception):  # said: the new one may be left there
                done.delete_staging.run(lambda: files.delete(job.staging))
        return _Outcome(done.move_in.returned, _where_by_steps(job, done, _first_line(exc)))
    if seen.final == "new" and not seen.staging:
        left = _delete_replaced(files, job, done) if tidy and seen.aside else None
        if seen.aside and left is None and not done.delete_old.returned:
            left = f"the {job.what} it replaced is left in {job.aside}: delete it by hand"
        return _Outcome(True, f"{job.new_one} is in {job.final}", left)
    if tidy and seen.staging:
        with contextlib.suppress(Exception):  # said below: the new one is left there
            files.delete(job.staging)
            seen = attrs.evolve(seen, staging=False)
    return _Outcome(False, _where_not_in_place(seen, job, done))


def _look(files: Files, job: _Publishing, done: _Done) -> _Seen:
    def holds(folder: str) -> _Held | None:
        if not files.exists(folder):
            return None
        text = files.read_text(job.marked(folder))
        if text is None:
            return "part"
        if done.new_text == done.old_text:  # two alike (no id in the marker): the steps tell
            return "old" if done.old_owns_final else "new"
        if text == done.new_text:
            return "new"
        return "old" if text == done.old_text else "part"

    return _Seen(holds(job.final), files.exists(job.aside), files.exists(job.staging))


def _where_not_in_place(seen: _Seen, job: _Publishing, done: _Done) -> str:
    """Where the old one is, and the new one if left, as the folders show them."""
    what, final = job.what, job.final
    if done.replacing is None:  # the first look failed: nothing was moved
        said = [f"{final} left as it was"]
    elif not done.replacing:
        said = [f"no earlier {what} was there"]
        if seen.final is not None:
            said.append(f"{final} holds part of the new {what}: delete it")
    else:
        said = [_old_one_as_seen(job, done, seen)]
    if seen.staging:
        said.append(f"the new {what} is left in {job.staging}: delete it")
    return "; ".join(said)


def _old_one_as_seen(job: _Publishing, done: _Done, seen: _Seen) -> str:
    """Where the old one is while the new one is not in place, as the folders show it.
    What ``final`` holds is the old one's unless the new one's rename was called and the
    put-back was not (``_Done.old_owns_final``)."""
    what, final, aside = job.what, job.final, job.aside
    old_in_final = seen.final == "old" or (seen.final == "part" and done.old_owns_final)
    if old_in_final and not seen.aside:
        return f"the earlier {what} in {final} kept"
    if old_in_final:  # an object store's move that failed partway: some files in each
        return _split_between(job, done, "a move failed partway")
    if seen.aside and seen.final is None:
        return f"the earlier {what} is in {aside}{_put_back_failure(done)}: move it to {final}"
    if seen.aside:
        return (
            f"the earlier {what} is in {aside}{_put_back_failure(done)}: delete {final} (part "
            f"of the new {what}), then move {aside} to {final}"
        )
    return f"the earlier {what} is in neither {final} nor {aside} (moved or deleted meanwhile?)"


def _old_one_by_steps(job: _Publishing, done: _Done) -> str:
    """Where the old one is while the new one is not in place, as the steps that returned
    tell (the file system did not answer)."""
    what, final, aside = job.what, job.final, job.aside
    if not done.aside.called:
        return f"{final} left as it was"
    if done.put_back.returned:
        return f"the earlier {what} was moved back to {final}"
    if done.put_back.called:  # on an object store, a copy stopped partway (or its answer lost)
        return _split_between(job, done, "putting it back stopped partway")
    if done.aside.returned:
        return (
            f"the earlier {what} is in {aside}: delete {final} if it is there (part of the "
            f"new {what}), then move {aside} to {final}"
        )
    return (
        f"the earlier {what} is in {final} or {aside}, or split between them (moving it "
        "aside failed): look at both before deleting either"
    )


def _split_between(job: _Publishing, done: _Done, why: str) -> str:
    """The old one perhaps in both folders. The advice is safe to follow: ``aside`` only
    ever receives what was in ``final``, so it holds only the old one's files."""
    what, final, aside = job.what, job.final, job.aside
    return (
        f"the earlier {what} is in {final} and {aside}{_put_back_failure(done)}, perhaps split "
        f"between them ({why}): copy the files of {aside} into {final}, then delete {aside}"
    )


def _put_back_failure(done: _Done) -> str:
    """What a put-back that raised raised, to follow where the old one is (else nothing)."""
    return f" (putting it back failed: {done.put_back_error})" if done.put_back_error else ""


def _where_by_steps(job: _Publishing, done: _Done, why: str) -> str:
    """Where each one is as the steps that returned tell (the file system did not answer)."""
    what, final = job.what, job.final
    if done.replacing is None:  # nothing was moved
        said = [f"{final} left as it was"]
    elif done.move_in.returned:
        said = [f"{job.new_one} is in {final}"]
        if done.replacing and not done.delete_old.returned:
            said.append(f"the {what} it replaced may be left in {job.aside}: delete it by hand")
    elif not done.replacing:
        said = [f"no earlier {what} was there; delete {final} if it is there (part of the new one)"]
    else:
        said = [_old_one_by_steps(job, done)]
    if not done.move_in.returned and not done.delete_staging.returned:
        said.append(f"the new {what} may be left in {job.staging}: delete it")
    if done.replacing is None and done.delete_staging.returned:
        return said[0]  # no move to tell of
    return f"could not look ({why}); by the moves that ended: " + "; ".join(said)


def _delete_replaced(files: Files, job: _Publishing, done: _Done) -> str | None:
    """Delete the old one once the new one is in place; a note if that failed (it is then
    left aside, which a message must not call kept: it no longer is where it was)."""
    try:
        done.delete_old.run(lambda: files.delete(job.aside))
    except Exception as exc:
        return (
            f"the {job.what} it replaced is left in {job.aside} (deleting it failed: "
            f"{_first_line(exc)}); delete it by hand"
        )
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def _manifest_path(run_dir: str) -> str:
    return f"{run_dir.rstrip('/')}/{MANIFEST_PATH}"


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
            f"object: damaged or edited); {SIMULATE_AGAIN}"
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
            f"the rows written (damaged or edited); {SIMULATE_AGAIN}"
        )
    if rows == 0:
        raise PipelineError(
            f"{run_dir}: the run is empty (0 rebalances written); check its manifest "
            f"({MANIFEST}/{MANIFEST_FILE}) and run streamassign simulate with more scenarios"
        )
    if not has_rows:
        raise DamagedRunError(
            f"{run_dir}: damaged run: {REBALANCES}/ {_why_no_rows(files, rows_dir)}, but the "
            f"manifest says {rows:,} rows were written (deleted or moved?); {SIMULATE_AGAIN}"
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
            f"{REBALANCES}/ ({counts} read; files deleted or moved?); {SIMULATE_AGAIN}"
        )
    if type(written) is int and rows_read != written:
        why = "files deleted or moved?" if rows_read < written else "files added from elsewhere?"
        raise DamagedRunError(
            f"{run_dir}: damaged run: {rows_read:,} rows read under {REBALANCES}/, but the "
            f"manifest says {written:,} were written ({why}); {SIMULATE_AGAIN}"
        )


#: Spark's failure to read one file of a run (``FAILED_READ_FILE``): the file, as a URI whose
#: folder names are escaped once more (``assignor=task%253Asticky``) when a page cannot be
#: read, as its path (``assignor=task%3Asticky``) when its footer cannot, whatever the file
#: system. Only the two kinds a file's bytes cause: the others (a missing or unreadable file,
#: a type mismatch, a file system) are not damage to the bytes.
_FAILED_READ: Final = re.compile(
    r"\[FAILED_READ_FILE\.(?P<kind>NO_HINT|CANNOT_READ_FILE_FOOTER)\] Encountered error while "
    r"reading file (?P<uri>\S+?)\.?\s"
)

#: What a failure's causes say when the bytes are damaged (Hadoop's checksum, Parquet's own
#: decoding); any other cause (a permission, a time-out of a remote store) is passed on as is.
_DAMAGED_BYTES: Final = (
    "ChecksumException",
    "ParquetDecodingException",
    "is not a Parquet file",
    "TProtocolException",
)


def unreadable_file(run_dir: str, failure: str) -> DamagedRunError | None:
    """The damaged-run error for a Spark failure (``failure``: its message and Java traces) to
    read a file of the run in ``run_dir``: a Parquet file whose bytes changed after it was
    written (its checksum no longer matches, or it is no longer valid Parquet). Said as a
    deleted file is, naming the file under the run; None for any other failure."""
    found = _FAILED_READ.search(failure)
    if found is None or not any(cause in failure for cause in _DAMAGED_BYTES):
        return None
    path = urllib.parse.urlsplit(found["uri"]).path
    if found["kind"] != "CANNOT_READ_FILE_FOOTER":  # a footer's names the file unescaped
        path = urllib.parse.unquote(path)
    marker = f"/{REBALANCES}/"
    shown = REBALANCES + "/" + path.split(marker, 1)[1] if marker in path else path
    why = (
        "its checksum does not match: its bytes changed since it was written"
        if "ChecksumException" in failure
        else "it is not valid Parquet: its bytes changed since it was written"
    )
    return DamagedRunError(
        f"{run_dir}: damaged run: {shown} cannot be read ({why}); {SIMULATE_AGAIN}"
    )
