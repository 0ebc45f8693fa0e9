"""Table partition directories a worker cannot use: set aside before it reports them.

A RocksDB table partition directory that RocksDB reports as corrupt (a garbled ``CURRENT``, a
truncated ``MANIFEST``, a deleted SST or ``CURRENT``), or whose offset key holds no offset, is
one Faust crashes on when that partition is assigned, as an active (``RocksDB.assign_partitions``)
or as a standby (``Recovery`` reads its persisted offset). Reported as it is, a short changelog
made the leader count it caught up and hand exactly that partition back, and the restarted worker
crashed on it at every start. So, when the member reads its persisted offsets for its report,
such a directory is renamed to ``<dir>.damaged-<UTC time>`` (never deleted: the state is
evidence) and counts as wiped: Faust opens an empty database there and restores the partition
from its changelog, as Kafka Streams does with a corrupted task's state. At its first join the
worker checks the same way every other partition directory on disk of its tables (one held
long ago, a global table's: ``partition_dirs``), which it does not report. A directory this worker
may have open (a partition it holds now) is never moved, nor one whose rename fails: those keep
the old answer (reported at 0, not claimed). Nor is one another process holds (its RocksDB
``LOCK``): a read-only open takes no lock, so it reads a live database and can race its
compactions; that is no damage. A store written by a newer RocksDB than this one reads is no
damage either (a library rolled back): it is left for the operator, with one WARNING.
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Literal

import attrs

from ..localstate import DAMAGED_SUFFIX, NOT_DAMAGE_STATUSES, rename_aside

__all__ = [
    "DAMAGED_SUFFIX",
    "Aside",
    "DamagedTable",
    "DamagedTables",
    "NewerFormatTable",
    "is_damaged_status",
    "is_missing_file_status",
    "is_newer_format_status",
    "lock_holder",
    "partition_dirs",
]


#: What a RocksDB status (of the read-only open or the read) says of damaged files. rocksdict
#: raises a plain ``Exception`` with the status; python-rocksdb a ``Corruption`` class.
_CORRUPTION = "Corruption:"
#: A file RocksDB needs is gone: damage only where the directory holds data (a deleted
#: ``CURRENT`` next to a write-ahead log: Faust's read-write open then fails with "wal_dir
#: contains existing log file"); an empty directory Faust just creates a database in.
_MISSING_FILE = "No such file or directory"
#: The files that make a directory without ``CURRENT`` one Faust's open fails on: table
#: files, and any write-ahead log, even an empty one ("wal_dir contains existing log file").
#: An interrupted create (``IDENTITY``, ``MANIFEST-``, ``OPTIONS-``, ``*.dbtmp``, the lock and
#: the info ``LOG``) has none, and Faust opens it as a new database.
_DATA_SUFFIXES = (".sst", ".log", ".blob")
#: Statuses of a store written by a newer RocksDB than the one reading it (a format version it
#: does not know): RocksDB wraps some in ``Corruption``, but the files are intact and a newer
#: library reads them. Matched case-insensitively.
_NEWER_FORMAT = (
    "unsupported format_version",
    "unknown footer version",
    "newer version of rocksdb",
    "unknown tag",
)
#: A lock is only ever named by a read-write open; the member's read-only one takes none (see
#: ``lock_holder``): ``NOT_DAMAGE_STATUSES`` names locks and the disk, the operator's to fix.
#: A lock in ``/proc/locks``: ``<n>: [-> ]<type> <mode> <READ|WRITE> <pid> <maj>:<min>:<inode>``
#: (the pid is -1 for an open file description lock, 0 for a holder in another pid namespace).
_PROC_LOCK = re.compile(r"\s(-?\d+)\s+[0-9a-f]+:[0-9a-f]+:(\d+)\s")
_PROC_LOCKS = Path("/proc/locks")
#: The table format version a status names, and the highest one a RocksDB could have written
#: (RocksDB is at 6; room for a few more).
_FORMAT_VERSION = re.compile(r"format_version:?\s*(\d+)")
_MAX_PLAUSIBLE_FORMAT_VERSION = 16
#: How many directories the WARNING names (it counts them all).
_NAMED = 3


@attrs.frozen
class DamagedTable:
    """A table partition directory Faust cannot open or read the offset of, and why."""

    path: Path
    why: str


@attrs.frozen
class NewerFormatTable:
    """A table partition directory written by a newer RocksDB than this one reads: intact, and
    no damage, but this worker's Faust cannot open it."""

    path: Path
    why: str
    #: The binding that cannot read it, with its version (``rocksdict 0.3.0``).
    library: str


class Aside(enum.Enum):
    """What ``DamagedTables.move_aside`` did with a directory read as damaged."""

    #: Renamed aside: it counts as wiped.
    MOVED = enum.auto()
    #: Left in place: Faust may crash on it, so the task is not claimed.
    KEPT = enum.auto()
    #: Another process has the database open: the read raced a live database, no damage.
    LIVE = enum.auto()


def is_newer_format_status(exc: BaseException) -> bool:
    """Whether the error says the store was written by a newer RocksDB than this one. A format
    version far above any RocksDB's (a flipped byte in a table file's footer reads as, say,
    249) is damage, not a newer library."""
    status = str(exc).lower()
    if not any(marker in status for marker in _NEWER_FORMAT):
        return False
    version = _FORMAT_VERSION.search(status)
    return version is None or int(version.group(1)) <= _MAX_PLAUSIBLE_FORMAT_VERSION


def is_missing_file_status(exc: BaseException) -> bool:
    """Whether the error says a file RocksDB looked for is gone (also what a read racing a
    live database's compaction sees: worth a second read)."""
    return _MISSING_FILE in str(exc)


def is_damaged_status(exc: BaseException, path: Path) -> bool:
    """Whether the error of a read-only open (or read) of the database at ``path`` says its
    files are damaged, not that the disk is full or failing or that a newer RocksDB wrote
    them (whether another process has it open is ``lock_holder``'s to say)."""
    status = str(exc)
    if any(cause in status for cause in NOT_DAMAGE_STATUSES) or is_newer_format_status(exc):
        return False
    if _CORRUPTION in status or type(exc).__name__ == "Corruption":
        return True
    return is_missing_file_status(exc) and _holds_data(path)


def _holds_data(path: Path) -> bool:
    try:
        return any(entry.name.endswith(_DATA_SUFFIXES) for entry in path.iterdir())
    except OSError:
        return False


class Unlisted(enum.Enum):
    """``lock_holder``'s answer where ``/proc/locks`` cannot be read (not Linux)."""

    VALUE = enum.auto()


def lock_holder(path: Path) -> str | Literal[Unlisted.VALUE] | None:
    """Which process holds the RocksDB ``LOCK`` of the database at ``path`` (Faust's read-write
    open takes it; a read-only open does not), ``None`` if none does, ``Unlisted.VALUE`` when
    ``/proc/locks`` cannot be read: then it cannot tell, and nothing is moved. Raises
    ``OSError`` if ``LOCK`` cannot be looked at.

    Only ``/proc/locks``, which needs no file descriptor on ``LOCK``. A lock probe of our own
    would need one, and closing it drops every POSIX lock this process holds on the file
    (Faust's own, were the database open here), while holding it would make another process's
    open fail for that moment. A holder in another pid namespace is listed too (as pid 0)."""
    lock = path / "LOCK"
    try:
        inode = lock.stat().st_ino
    except FileNotFoundError:
        return None  # an open creates it: no process has this database open
    pids = _listed_lock_pids(inode)
    if pids is None:
        return Unlisted.VALUE
    if not pids:
        return None
    mine = str(os.getpid())
    return ", ".join(sorted({"this worker" if p == mine else f"process {p}" for p in pids}))


def _listed_lock_pids(inode: int) -> list[str] | None:
    """The pids ``/proc/locks`` lists with a lock on ``inode``; None if it cannot be read.
    Matched by inode alone: on stacked file systems (overlayfs) the device ``stat`` gives can
    differ from the one listed; a file of the same inode on another device only keeps a
    directory in place, the safe side."""
    try:
        text = _PROC_LOCKS.read_text()
    except OSError:
        return None
    return [pid for pid, ino in _PROC_LOCK.findall(text) if int(ino) == inode]


def partition_dirs(partition_path: Callable[[int], object]) -> list[tuple[int, Path]]:
    """The partition directories on disk of a table whose partition ``n`` lives at
    ``partition_path(n)`` (Faust's ``<tabledir>/<table>-<n>.db``), by partition. Each is one
    ``partition_path`` names (``<table>-007.db`` is none, nor ``<dir>.damaged-*``). Empty where
    the names follow no ``<prefix><n><suffix>`` pattern or the directory cannot be listed (a
    first start has no tabledir): nothing to check, and no reason to fail a join."""
    first, second = Path(str(partition_path(0))), Path(str(partition_path(1)))
    prefix, _, suffix = first.name.rpartition("0")
    if first.parent != second.parent or second.name != f"{prefix}1{suffix}":
        return []
    pattern = re.compile(re.escape(prefix) + r"(\d+)" + re.escape(suffix))
    found = []
    try:
        with os.scandir(first.parent) as entries:
            for entry in entries:
                if (match := pattern.fullmatch(entry.name)) is None:
                    continue
                path = Path(entry.path)
                partition = int(match.group(1))
                if Path(str(partition_path(partition))) == path and entry.is_dir():
                    found.append((partition, path))
    except OSError:
        return []
    return sorted(found)


@attrs.define
class DamagedTables:
    """What one join found: the damaged directories it moved aside, those it kept (Faust runs
    that partition in this worker now, or the rename failed), those another process has open
    (no damage), and those a newer RocksDB wrote, for one line each; and how many table
    directories it read (the cost of a slow join)."""

    moved: list[tuple[DamagedTable, Path]] = attrs.field(factory=list)
    open_here: list[DamagedTable] = attrs.field(factory=list)
    kept: list[tuple[DamagedTable, str]] = attrs.field(factory=list)
    live: list[tuple[DamagedTable, str]] = attrs.field(factory=list)
    newer: list[NewerFormatTable] = attrs.field(factory=list)
    #: Table partition directories of on-disk stores looked up (each a read-only open if there).
    directories_read: int = 0

    def move_aside(
        self, found: DamagedTable, in_use: bool, still_damaged: Callable[[], bool]
    ) -> Aside:
        """Move ``found`` aside unless this worker may have it open (``in_use``) or another
        process does (then it is no damage: a read-only open raced a live database). With no
        holder it is read again (``still_damaged``) first: a process that closed it between
        the read and the lock check left it whole, and with no holder a read is stable."""
        if in_use:
            self.open_here.append(found)
            return Aside.KEPT
        try:
            holder = lock_holder(found.path)
        except OSError as exc:
            self.kept.append((found, f"cannot tell whether another process has it open: {exc}"))
            return Aside.KEPT
        if holder is Unlisted.VALUE:
            why = f"cannot tell whether another process has it open: no {_PROC_LOCKS}"
            self.kept.append((found, why))
            return Aside.KEPT
        if holder is None and not still_damaged():
            holder = "none now: a process closed it while it was read"
        if holder is not None:
            self.live.append((found, holder))
            return Aside.LIVE
        try:
            aside = rename_aside(found.path)
        except OSError as exc:
            self.kept.append((found, f"cannot rename it: {exc}"))
            return Aside.KEPT
        self.moved.append((found, aside))
        return Aside.MOVED

    def kept_paths(self) -> frozenset[Path]:
        return frozenset([f.path for f in self.open_here] + [f.path for f, _ in self.kept])

    def newer_paths(self) -> frozenset[Path]:
        return frozenset(found.path for found in self.newer)

    def summary(self) -> str | None:
        """One line saying what damage was found and what happens to it; None if none was."""
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
        if self.open_here:
            them = "it" if len(self.open_here) == 1 else "them"
            parts.append(
                f"{len(self.open_here)} table partition director{_ies(self.open_here)} read "
                f"as damaged but not moved: Faust runs {_those(self.open_here)} in this "
                f"worker now and may have {them} open (the read may have raced its own "
                "writes); reported at offset 0 and not claimed. Nothing has failed; leave "
                f"{them}: if the damage is real, the next start moves {them} aside before "
                f"Faust opens {them} ("
                + _names(f"{f.path} ({f.why})" for f in self.open_here)
                + ")"
            )
        if self.kept:
            parts.append(
                f"{len(self.kept)} damaged table partition director{_ies(self.kept)} not "
                "moved nor claimed (reported at offset 0 if an active of the last "
                "assignment); Faust crashes when assigned one: stop the worker and move it "
                "away ("
                + _names(f"{f.path} ({f.why}; {why_kept})" for f, why_kept in self.kept)
                + ")"
            )
        if not parts:
            return None
        return "; ".join(parts) + ' (docs/faust.md, "Damaged table directories")'

    def newer_summary(self) -> str | None:
        """One line naming the directories a newer RocksDB wrote; None if there are none."""
        if not self.newer:
            return None
        libraries = ", ".join(sorted({found.library for found in self.newer}))
        them = "it" if len(self.newer) == 1 else "them"
        return (
            f"{len(self.newer)} table partition director{_ies(self.newer)} written by a newer "
            f"RocksDB than this worker's {libraries} reads, left in place (not damaged): "
            f"Faust cannot open {them}; upgrade the library to the version that wrote {them}, "
            f"or delete {them} to restore {_those(self.newer)} from the changelog ("
            + _names(f"{f.path} ({f.why})" for f in self.newer)
            + ') (docs/faust.md, "Damaged table directories")'
        )


def _ies(items: Sequence[object]) -> str:
    return "y" if len(items) == 1 else "ies"


def _those(items: Sequence[object]) -> str:
    return "that partition" if len(items) == 1 else "those partitions"


def _names(lines: Iterable[str]) -> str:
    named = list(lines)
    more = f", and {len(named) - _NAMED} more" if len(named) > _NAMED else ""
    return ", ".join(named[:_NAMED]) + more
