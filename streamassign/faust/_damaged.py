"""Table partition directories a worker cannot use: set aside before it reports them.

A RocksDB table partition directory that RocksDB reports as corrupt (a garbled ``CURRENT``, a
truncated ``MANIFEST``, a deleted SST or ``CURRENT``), or whose offset key holds no offset, is
one Faust crashes on when that partition is assigned, as an active (``RocksDB.assign_partitions``)
or as a standby (``Recovery`` reads its persisted offset). Reported as it is, a short changelog
made the leader count it caught up and hand exactly that partition back, and the restarted worker
crashed on it at every start. So, when the member reads its persisted offsets for its report,
such a directory is renamed to ``<dir>.damaged-<UTC time>`` (never deleted: the state is
evidence) and counts as wiped: Faust opens an empty database there and restores the partition
from its changelog, as Kafka Streams does with a corrupted task's state. A directory this worker
may have open (a partition it holds now) is never moved, nor one whose rename fails: those keep
the old answer (reported at 0, not claimed).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import attrs

__all__ = ["DamagedTable", "DamagedTables", "is_damaged_status"]

#: Marks a directory set aside (``<name>.damaged-<UTC time>``), as the core's local state does.
DAMAGED_SUFFIX = ".damaged-"

#: What a RocksDB status (of the read-only open or the read) says of damaged files. rocksdict
#: raises a plain ``Exception`` with the status; python-rocksdb a ``Corruption`` class.
_CORRUPTION = "Corruption:"
#: A file RocksDB needs is gone: damage only where the directory holds data (a deleted
#: ``CURRENT`` next to a write-ahead log: Faust's read-write open then fails with "wal_dir
#: contains existing log file"); an empty directory Faust just creates a database in.
_MISSING_FILE = "No such file or directory"
#: Files RocksDB (and rocksdict) write before a database holds anything.
_NO_DATA_FILES = ("LOCK", "LOG", "rocksdict-config.json")
#: Causes that are never the files' fault, even inside such a status: another process holds
#: the database, or the disk or its permissions are the operator's to fix (moving would not
#: help, or would take a live database's files).
_NOT_DAMAGE = (
    "While lock file",
    "lock hold",
    "No locks available",
    "Resource temporarily unavailable",
    "No space left",
    "Disk quota exceeded",
    "Permission denied",
    "Operation not permitted",
)
#: How many directories the WARNING names (it counts them all).
_NAMED = 3


@attrs.frozen
class DamagedTable:
    """A table partition directory Faust cannot open or read the offset of, and why."""

    path: Path
    why: str


def is_damaged_status(exc: BaseException, path: Path) -> bool:
    """Whether the error of a read-only open (or read) of the database at ``path`` says its
    files are damaged, not that it is in use or that the disk is full or failing."""
    status = str(exc)
    if any(cause in status for cause in _NOT_DAMAGE):
        return False
    if _CORRUPTION in status or type(exc).__name__ == "Corruption":
        return True
    return _MISSING_FILE in status and _holds_data(path)


def _holds_data(path: Path) -> bool:
    try:
        return any(not entry.name.startswith(_NO_DATA_FILES) for entry in path.iterdir())
    except OSError:
        return False


def set_aside(path: Path) -> Path:
    """Rename ``path`` to a ``<name>.damaged-<UTC time>`` sibling (same directory, so never
    across devices); the new path. Raises ``OSError`` if it cannot be renamed."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = path.with_name(f"{path.name}{DAMAGED_SUFFIX}{stamp}")
    n = 1
    while aside.exists() or aside.is_symlink():  # a rename would replace an earlier one
        n += 1
        aside = path.with_name(f"{path.name}{DAMAGED_SUFFIX}{stamp}-{n}")
    path.rename(aside)
    return aside


@attrs.define
class DamagedTables:
    """What one join found damaged: the directories it moved aside and those it kept (with
    why not moved), for one summary line."""

    moved: list[tuple[DamagedTable, Path]] = attrs.field(factory=list)
    kept: list[tuple[DamagedTable, str]] = attrs.field(factory=list)

    def set_aside(self, found: DamagedTable, in_use: bool) -> bool:
        """Move ``found`` aside unless this worker may have it open (``in_use``); whether it
        was moved (then it counts as wiped)."""
        if in_use:
            self.kept.append((found, "this worker holds that partition now"))
            return False
        try:
            aside = set_aside(found.path)
        except OSError as exc:
            self.kept.append((found, f"cannot rename it: {exc}"))
            return False
        self.moved.append((found, aside))
        return True

    def kept_paths(self) -> frozenset[Path]:
        return frozenset(found.path for found, _ in self.kept)

    def summary(self) -> str | None:
        """One line saying what was found and what happens to it; None if nothing was."""
        parts = []
        if self.moved:
            parts.append(
                f"{len(self.moved)} table partition director{_ies(self.moved)} Faust cannot "
                "open (RocksDB reports their files damaged, or the offset key holds no offset) "
                "moved aside and counted as wiped: Faust restores those partitions from their "
                "changelogs; the moved directories are kept for inspection, delete them when "
                "done ("
                + _names(f"{f.path} ({f.why}) -> {aside.name}" for f, aside in self.moved)
                + ")"
            )
        if self.kept:
            parts.append(
                f"{len(self.kept)} damaged table partition director{_ies(self.kept)} not "
                "moved, reported at offset 0 and not claimed; Faust crashes when assigned "
                "one: stop the worker and move it away ("
                + _names(f"{f.path} ({f.why}; {why_kept})" for f, why_kept in self.kept)
                + ")"
            )
        if not parts:
            return None
        return "; ".join(parts) + ' (docs/faust.md, "Damaged table directories")'


def _ies(items: Sequence[object]) -> str:
    return "y" if len(items) == 1 else "ies"


def _names(lines: Iterable[str]) -> str:
    named = list(lines)
    more = f", and {len(named) - _NAMED} more" if len(named) > _NAMED else ""
    return ", ".join(named[:_NAMED]) + more
