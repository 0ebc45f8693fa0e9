"""Damaged RocksDB table partition directories: one Faust crashes on (RocksDB ``Corruption``, or
no offset under the offset key) is moved aside before the member reports it, or a short
changelog would make the leader hand exactly that partition back and the worker crash-loop.
Never one this worker or another process may have open (a read-only open races a live
database), nor one a newer RocksDB wrote (intact). Real RocksDB directories and another real
process, no broker (the live check: docs/faust.md, "Damaged table directories")."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from faust.types import TP

from streamassign import TaskId
from streamassign.faust import PartitionAssignor, _damaged
from streamassign.faust import assignor as assignor_module
from streamassign.faust._damaged import is_damaged_status, is_newer_format_status

from .test_faust_assignor import (
    CL,
    SET_CL,
    SRC,
    make_app,
    rebalance,
    reported,
    stopped_after_running_alone,
)
from .waiting import readable_within

COUNTS = {SRC: 6, CL: 6}


def garble_current(path: Path) -> None:
    (path / "CURRENT").write_bytes(b"garbage")  # "CURRENT file does not end with newline"


def truncate_manifest(path: Path) -> None:
    for manifest in path.glob("MANIFEST-*"):
        os.truncate(manifest, 10)


def delete_current(path: Path) -> None:
    (path / "CURRENT").unlink()  # Faust: "wal_dir contains existing log file"


def delete_sst(path: Path) -> None:
    for sst in path.glob("*.sst"):  # missing at every read, so read twice and still damage
        sst.unlink()


DAMAGE: dict[str, Callable[[Path], None]] = {
    "garbled CURRENT": garble_current,
    "truncated MANIFEST": truncate_manifest,
    "deleted CURRENT": delete_current,
    "deleted SST": delete_sst,
}


def damaged_messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == level and "table partition director" in r.getMessage()
    ]


def restarted(tmp_path: Path) -> tuple[frozenset[TaskId], PartitionAssignor, Path]:
    """A RocksDB worker that ran every task alone, stopped and started again (not joined):
    the tasks it ran, its assignor and its tables' directory."""
    ran = stopped_after_running_alone(tmp_path / "w0", COUNTS)
    app = make_app(tmp_path / "w0", 7000, store="rocksdb://")
    assert isinstance(app.assignor, PartitionAssignor)
    return ran, app.assignor, Path(app.conf.tabledir)


def directory(tabledir: Path, task: TaskId) -> Path:
    return tabledir / f"totals-{task.partition}.db"


def test_each_kind_of_damage_is_moved_aside_and_reported_as_wiped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every damage Faust crashes on opening is moved to ``<dir>.damaged-<UTC time>``, files
    kept; the task is reported at 0 and claimed, as a wiped one; Faust then opens an empty
    database there (no crash), and one WARNING names them all."""
    ran, assignor, tabledir = restarted(tmp_path)
    tasks = sorted(ran)
    for task, damage in zip(tasks, DAMAGE.values(), strict=False):
        damage(directory(tabledir, task))
    hit = tasks[: len(DAMAGE)]
    kept_files = {t: sorted(p.name for p in directory(tabledir, t).iterdir()) for t in hit}
    with caplog.at_level(logging.DEBUG, logger="streamassign.faust"):
        info = reported(assignor)
    assert info.previous_active == ran
    assert info.offset_sums == {t: 0 if t in hit else 100 + t.partition for t in ran}
    for t in hit:
        (aside,) = tabledir.glob(f"totals-{t.partition}.db.damaged-*")
        assert sorted(p.name for p in aside.iterdir()) == kept_files[t]
        assert not directory(tabledir, t).exists()
    store = assignor.app.tables["totals"].data
    for t in hit:  # what crashed Faust before
        assert store._db_for_partition(t.partition).get(store.offset_key) is None
    (warning,) = damaged_messages(caplog, logging.WARNING)
    assert warning.startswith(f"{len(DAMAGE)} table partition directories")
    assert "restores those partitions from their changelogs" in warning
    assert all(str(directory(tabledir, t)) in warning for t in hit[:3])
    assert f"and {len(hit) - 3} more" in warning


def test_a_never_written_directory_is_not_damage(tmp_path: Path) -> None:
    """A directory RocksDB has written nothing to but its lock and log (Faust opens it as a
    new database) stays where it is, reported as wiped."""
    ran, assignor, tabledir = restarted(tmp_path)
    task = min(ran)
    for file in directory(tabledir, task).iterdir():
        if file.name not in ("LOCK", "LOG"):
            file.unlink()
    info = reported(assignor)
    assert info.offset_sums[task] == 0
    assert task in info.previous_active
    assert directory(tabledir, task).exists()
    assert not list(tabledir.glob("*.damaged-*"))


def test_one_warning_per_join_however_many_are_damaged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every directory damaged makes one line per join, not one per directory (a line each
    made 61 WARNING lines over 4 starts): it counts them all and names the first few; the
    next join finds none."""
    ran, assignor, tabledir = restarted(tmp_path)
    for t in ran:
        garble_current(directory(tabledir, t))
    with caplog.at_level(logging.DEBUG, logger="streamassign.faust"):
        reported(assignor)
        (warning,) = damaged_messages(caplog, logging.WARNING)
        caplog.clear()
        assert reported(assignor).offset_sums == dict.fromkeys(ran, 0)
    assert warning.startswith(f"{len(ran)} table partition directories")
    assert warning.count("damaged-") == 3
    assert f"and {len(ran) - 3} more" in warning
    assert damaged_messages(caplog, logging.WARNING) == []
    assert len(list(tabledir.glob("*.damaged-*"))) == len(ran)


def test_a_failed_rename_keeps_the_old_answer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory that cannot be renamed (here: across devices) is no crash: reported at 0
    and not claimed, one WARNING saying why; the same set at the next join at DEBUG."""
    ran, assignor, tabledir = restarted(tmp_path)
    task = min(ran)
    garble_current(directory(tabledir, task))

    def refuse(self: Path, target: Path) -> Path:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(Path, "rename", refuse)
    with caplog.at_level(logging.DEBUG, logger="streamassign.faust"):
        info = reported(assignor)
        again = reported(assignor)
    assert info == again
    assert info.offset_sums[task] == 0
    assert info.previous_active == ran - {task}
    assert directory(tabledir, task).exists()
    (warning,) = damaged_messages(caplog, logging.WARNING)
    assert "1 damaged table partition directory not moved" in warning
    assert "Invalid cross-device link" in warning
    assert len(damaged_messages(caplog, logging.DEBUG)) == 1


def test_a_failed_rename_of_a_standby_of_the_last_assignment_is_not_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A standby of the last assignment with a damaged directory that stays is
    state the worker cannot measure: not reported at all (only an active of the last
    assignment is reported at 0), and the WARNING says so."""
    ran, assignor, tabledir = restarted(tmp_path)
    task = min(ran)
    saved = Path(assignor.app.conf.appdir) / "streamassign" / assignor_module._STATE_FILE
    data = json.loads(saved.read_text())
    data["active"].remove(str(task))
    data["standby"].append(str(task))
    saved.write_text(json.dumps(data))
    garble_current(directory(tabledir, task))

    def refuse(self: Path, target: Path) -> Path:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(Path, "rename", refuse)
    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        info = reported(assignor)
    assert info.previous_active == ran - {task}
    assert info.offset_sums == {t: 100 + t.partition for t in ran - {task}}
    (warning,) = damaged_messages(caplog, logging.WARNING)
    assert "(reported at offset 0 if an active of the last assignment)" in warning


def test_a_directory_faust_has_open_is_never_moved(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A partition Faust's store holds a handle to (this process opened it) stays in place,
    even when a read-only open reports it corrupt: moved, Faust would write into the moved
    directory. Reported at 0, not claimed, and the WARNING says why it stayed."""
    ran, assignor, tabledir = restarted(tmp_path)
    task = min(ran)
    store = assignor.app.tables["totals"].data
    store._db_for_partition(task.partition)
    garble_current(directory(tabledir, task))
    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        info = reported(assignor)
    assert info.offset_sums[task] == 0
    assert task not in info.previous_active
    assert not list(tabledir.glob("*.damaged-*"))
    (warning,) = damaged_messages(caplog, logging.WARNING)
    assert "Faust runs that partition in this worker now" in warning
    assert "Nothing has failed; leave it" in warning
    assert "stop the worker" not in warning


def test_a_standby_of_a_running_worker_is_never_moved(tmp_path: Path) -> None:
    """On a rejoin without a restart, a standby this worker runs (Faust's recovery may hold
    its database) is read from disk while it has applied nothing yet; damaged, it stays."""
    apps = [make_app(tmp_path / f"w{i}", 7000 + i, store="rocksdb://") for i in range(2)]
    assignors = {f"m{i}": app.assignor for i, app in enumerate(apps)}
    rebalance(assignors, counts=COUNTS)
    follower = assignors["m1"]
    task = min(follower.info.standby)
    store = apps[1].tables["totals"].data
    store.set_persisted_offset(TP(CL, task.partition), 5)  # Faust created the directory
    garble_current(store.partition_path(task.partition))
    info = reported(follower)
    assert info.offset_sums[task] == 0
    assert not list(Path(apps[1].conf.tabledir).glob("*.damaged-*"))


@pytest.mark.parametrize(
    "status",
    [
        "IO error: While lock file: /d/LOCK: Resource temporarily unavailable",
        "IO error: No space left on device",
        "IO error: Permission denied",
        "Invalid argument: /d/CURRENT: does not exist (create_if_missing is false)",
    ],
)
def test_a_lock_or_a_disk_error_is_no_damage(tmp_path: Path, status: str) -> None:
    """Only the files' fault moves a directory: never a lock (a read-write open's status), a
    full disk or a permission (moving would not help, or would take a live database)."""
    (tmp_path / "000008.log").write_bytes(b"x")
    assert not is_damaged_status(Exception(status), tmp_path)
    assert is_damaged_status(Exception("Corruption: bad block"), tmp_path)


@pytest.mark.parametrize(
    "status",
    [
        "Corruption: Corrupt or unsupported format_version: 6 in file /d/MANIFEST-000005",
        "Corruption: Unknown Footer version. Maybe this file was created with newer version "
        "of RocksDB?",
        "Corruption: VersionEdit: unknown tag",
    ],
)
def test_a_format_a_newer_rocksdb_wrote_is_no_damage(tmp_path: Path, status: str) -> None:
    """An older library reading a newer store reports ``Corruption`` (rocksdict 0.3.0 on
    0.3.29's files: the first status), though the files are intact."""
    (tmp_path / "000009.sst").write_bytes(b"x")
    assert is_newer_format_status(Exception(status))
    assert not is_damaged_status(Exception(status), tmp_path)


class OtherProcess:
    """Another process holding a table partition's database open as Faust does (read-write,
    so RocksDB's ``LOCK`` is locked), until closed."""

    def __init__(self, path: Path) -> None:
        script = (
            "import sys\n"
            "from faust.stores.rocksdb import RocksDBOptions\n"
            "db = RocksDBOptions().open(sys.argv[1])\n"
            "print('open', flush=True)\n"
            "sys.stdin.read()\n"
            "db.close()\n"
        )
        self.process = subprocess.Popen(
            [sys.executable, "-c", script, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        assert readable_within(self.process.stdout, 60), (
            "the other process did not open the database within 60 s"
        )
        assert self.process.stdout.readline() == "open\n"  # EOF (its death) fails at once

    def close(self) -> None:
        try:
            self.process.communicate("", timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise


@pytest.fixture
def other_process() -> Iterator[Callable[[Path], OtherProcess]]:
    started: list[OtherProcess] = []

    def start(path: Path) -> OtherProcess:
        started.append(OtherProcess(path))
        return started[-1]

    yield start
    for other in started:
        if other.process.poll() is None:
            other.close()


def test_a_database_another_process_has_open_is_never_moved(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    other_process: Callable[[Path], OtherProcess],
) -> None:
    """A read-only open takes no lock, so it reads a database another process has open (a
    predecessor still closing its stores, a shared tabledir) and can race its compaction into
    a ``Corruption`` status. Such a directory is no damage: renamed, both processes would
    write into a mixture of the two. Found by ``/proc/locks``; reported as unreadable (0,
    claimed), logged at DEBUG only."""
    ran, assignor, tabledir = restarted(tmp_path)
    task = min(ran)
    other = other_process(directory(tabledir, task))
    garble_current(directory(tabledir, task))  # what a raced read reports, every time
    with caplog.at_level(logging.DEBUG, logger="streamassign.faust"):
        info = reported(assignor)
    assert not list(tabledir.glob("*.damaged-*"))
    assert info.offset_sums[task] == 0
    assert info.previous_active == ran
    assert damaged_messages(caplog, logging.WARNING) == []
    (line,) = [r.getMessage() for r in caplog.records if "is open in" in r.getMessage()]
    assert line.endswith(f"is open in process {other.process.pid}: not moved")
    other.close()
    info = reported(assignor)  # the holder gone, the damage (here real) is moved
    assert len(list(tabledir.glob("*.damaged-*"))) == 1


def test_without_a_lock_list_nothing_is_moved(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where ``/proc/locks`` cannot be read (not Linux) the worker cannot tell whether another
    process has the database open, and a lock probe of its own could drop Faust's lock or fail
    another process's open: the directory stays, unclaimed, with a WARNING saying so."""
    ran, assignor, tabledir = restarted(tmp_path)
    task = min(ran)
    garble_current(directory(tabledir, task))
    monkeypatch.setattr(_damaged, "_PROC_LOCKS", tmp_path / "no-proc-locks")
    with caplog.at_level(logging.DEBUG, logger="streamassign.faust"):
        info = reported(assignor)
    assert not list(tabledir.glob("*.damaged-*"))
    assert info.offset_sums[task] == 0
    assert task not in info.previous_active
    (warning,) = damaged_messages(caplog, logging.WARNING)
    assert "cannot tell whether another process has it open" in warning


def test_a_database_closed_between_the_read_and_the_lock_check_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A holder that closes the database after the damaged read and before the lock check
    leaves no lock to see; the directory is read once more, whole now, and stays."""
    ran, assignor, tabledir = restarted(tmp_path)
    task = min(ran)
    real_read = assignor_module._read_raw_offset
    raced: list[Path] = []

    def read(store: Any, path: Path) -> bytes | None:
        if path == directory(tabledir, task) and not raced:
            raced.append(path)
            raise Exception("Corruption: block checksum mismatch")
        return real_read(store, path)

    monkeypatch.setattr(assignor_module, "_read_raw_offset", read)
    reported(assignor)
    assert raced
    assert not list(tabledir.glob("*.damaged-*"))


def test_a_file_gone_at_the_first_read_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read racing a live database's compaction finds an SST its MANIFEST lists deleted;
    read again, it finds the new MANIFEST: the offset, nothing moved."""
    ran, assignor, tabledir = restarted(tmp_path)
    task = min(ran)
    real_read = assignor_module._read_raw_offset
    raced: list[Path] = []

    def read(store: Any, path: Path) -> bytes | None:
        if path == directory(tabledir, task) and not raced:
            raced.append(path)
            raise Exception(
                f"Corruption: Can't access /000021.sst: IO error: No such file or directory: "
                f"while stat a file for size: {path}/000021.sst: No such file or directory"
            )
        return real_read(store, path)

    monkeypatch.setattr(assignor_module, "_read_raw_offset", read)
    info = reported(assignor)
    assert raced
    assert info.offset_sums == {t: 100 + t.partition for t in ran}
    assert not list(tabledir.glob("*.damaged-*"))


def test_a_store_a_newer_rocksdb_wrote_stays_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a library roll-back every directory reads as ``Corruption: ... unsupported
    format_version``: none is moved (they are intact, and a full restore of every table would
    double the disk), one WARNING names the library and says to upgrade it; its repeat at the
    next join is DEBUG."""
    ran, assignor, tabledir = restarted(tmp_path)

    def read(store: Any, path: Path) -> bytes | None:
        raise Exception(
            f"Corruption: Corrupt or unsupported format_version: 6 in file {path}/MANIFEST-000005"
        )

    monkeypatch.setattr(assignor_module, "_read_raw_offset", read)
    with caplog.at_level(logging.DEBUG, logger="streamassign.faust"):
        info = reported(assignor)
        (warning,) = damaged_messages(caplog, logging.WARNING)
        caplog.clear()
        assert reported(assignor) == info
    assert not list(tabledir.glob("*.damaged-*"))
    assert info.offset_sums == dict.fromkeys(ran, 0)
    assert warning.startswith(f"{len(ran)} table partition directories written by a newer")
    assert "this worker's rocksdict " in warning
    assert "upgrade the library" in warning
    assert "moved aside" not in warning
    assert damaged_messages(caplog, logging.WARNING) == []
    assert len(damaged_messages(caplog, logging.DEBUG)) == 1


def test_an_interrupted_create_is_not_damage(tmp_path: Path) -> None:
    """A create interrupted before ``CURRENT`` leaves ``IDENTITY``, a ``MANIFEST``, ``OPTIONS``
    and a ``*.dbtmp``, no table file nor write-ahead log: Faust opens it as a new database,
    so it stays (reported as wiped)."""
    ran, assignor, tabledir = restarted(tmp_path)
    task = min(ran)
    path = directory(tabledir, task)
    for file in path.iterdir():
        if file.name == "CURRENT" or file.suffix in (".sst", ".log"):
            file.unlink()
    (path / "000001.dbtmp").write_bytes(b"MANIFEST-000005\n")
    info = reported(assignor)
    assert info.offset_sums[task] == 0
    assert task in info.previous_active
    assert not list(tabledir.glob("*.damaged-*"))
    store = assignor.app.tables["totals"].data
    assert store._db_for_partition(task.partition).get(store.offset_key) is None


def test_a_table_directory_it_may_not_read_is_unreadable_and_earlier_moves_are_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No permission to a table directory (``Path.exists`` raises) is an unreadable table,
    not a failed join: the join keeps its history, and the directory moved aside before it is
    named in the WARNING (it was named nowhere when the error escaped)."""
    ran, assignor, tabledir = restarted(tmp_path)
    first, second, *_ = sorted(ran)
    garble_current(directory(tabledir, first))
    blocked = directory(tabledir, second)
    real_exists = Path.exists

    def exists(self: Path) -> bool:
        if self == blocked:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_exists(self)

    monkeypatch.setattr(Path, "exists", exists)
    with caplog.at_level(logging.DEBUG, logger="streamassign.faust"):
        info = reported(assignor)
    assert info.previous_active == ran
    assert info.offset_sums[first] == info.offset_sums[second] == 0
    (warning,) = damaged_messages(caplog, logging.WARNING)
    assert str(directory(tabledir, first)) in warning


def test_a_move_is_logged_when_a_later_task_fails(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever error ends the reading of the offsets (the join then falls back to one
    without history), the directories moved before it are named."""
    ran, assignor, tabledir = restarted(tmp_path)
    first, second, *_ = sorted(ran)
    garble_current(directory(tabledir, first))
    real_sum = PartitionAssignor._disk_offset_sum

    def disk_offset_sum(self: PartitionAssignor, task: TaskId, *args: Any, **kw: Any) -> Any:
        if task == second:
            raise RuntimeError("a later task fails")
        return real_sum(self, task, *args, **kw)

    monkeypatch.setattr(PartitionAssignor, "_disk_offset_sum", disk_offset_sum)
    with caplog.at_level(logging.DEBUG, logger="streamassign.faust"):
        info = reported(assignor)
    assert info.previous_active == frozenset()  # metadata()'s fallback
    assert len(list(tabledir.glob("*.damaged-*"))) == 1
    (warning,) = damaged_messages(caplog, logging.WARNING)
    assert str(directory(tabledir, first)) in warning


def test_a_format_version_no_rocksdb_wrote_is_damage(tmp_path: Path) -> None:
    """A flipped byte in a table file's footer can read as a format version far above any
    RocksDB's: damage, not a newer library (else the worker would crash on it every start)."""
    (tmp_path / "000009.sst").write_bytes(b"x")
    status = Exception("Corruption: Corrupt or unsupported format_version: 249 in /d/000009.sst")
    assert not is_newer_format_status(status)
    assert is_damaged_status(status, tmp_path)


# -- Directories the report does not read: partitions held long ago, global tables ---------------


def held_long_ago(appdir: Path, tasks: frozenset[TaskId]) -> None:
    """Drop ``tasks`` from the worker's saved assignment, as if it had held them before its
    last one: their directories stay on disk, and its report no longer reads them."""
    saved = appdir / "streamassign" / assignor_module._STATE_FILE
    data = json.loads(saved.read_text())
    data["active"] = [t for t in data["active"] if TaskId.parse(t) not in tasks]
    saved.write_text(json.dumps(data))


def recorded_reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The table partition directories the member reads from now on, in order."""
    read_paths: list[Path] = []
    persisted_offset = assignor_module._persisted_offset

    def recording(store: Any, partition: int) -> object:
        read_paths.append(Path(store.partition_path(partition)))
        return persisted_offset(store, partition)

    monkeypatch.setattr(assignor_module, "_persisted_offset", recording)
    return read_paths


def restarted_holding_long_ago(
    tmp_path: Path,
) -> tuple[frozenset[TaskId], TaskId, PartitionAssignor, Path]:
    """``restarted``, with one task dropped from the last assignment before the start: the
    tasks it held last, that one, its assignor and its tables' directory."""
    ran = stopped_after_running_alone(tmp_path / "w0", COUNTS)
    old = sorted(ran)[2]
    app = make_app(tmp_path / "w0", 7000, store="rocksdb://")  # not joined: nothing read yet
    held_long_ago(Path(app.conf.appdir), frozenset({old}))
    assert isinstance(app.assignor, PartitionAssignor)
    return ran - {old}, old, app.assignor, Path(app.conf.tabledir)


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_a_damaged_directory_of_a_partition_held_long_ago_is_moved_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[Path], None]
) -> None:
    """A partition not in the last assignment is not reported, but Faust crashes on its
    damaged directory when it is assigned again: the first join moves it aside as it does a
    held one (wiped: not reported, no claim), in the same WARNING, and Faust opens an
    empty database there."""
    held, old, assignor, tabledir = restarted_holding_long_ago(tmp_path)
    damage(directory(tabledir, old))
    with caplog.at_level(logging.DEBUG, logger="streamassign.faust"):
        info = reported(assignor)
    assert info.previous_active == held
    assert info.offset_sums == {t: 100 + t.partition for t in held}
    assert not directory(tabledir, old).exists()
    assert len(list(tabledir.glob(f"totals-{old.partition}.db.damaged-*"))) == 1
    (warning,) = damaged_messages(caplog, logging.WARNING)
    assert warning.startswith("1 table partition directory Faust cannot open")
    assert str(directory(tabledir, old)) in warning
    store = assignor.app.tables["totals"].data
    assert store._db_for_partition(old.partition).get(store.offset_key) is None


def test_a_healthy_directory_of_a_partition_held_long_ago_is_left_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Read and left as it is: not moved, not reported (the leader gets no claim on a
    partition the worker did not run last), nothing logged."""
    held, old, assignor, tabledir = restarted_holding_long_ago(tmp_path)
    files = sorted(p.name for p in directory(tabledir, old).iterdir())
    with caplog.at_level(logging.DEBUG, logger="streamassign.faust"):
        info = reported(assignor)
    assert info.offset_sums == {t: 100 + t.partition for t in held}
    assert sorted(p.name for p in directory(tabledir, old).iterdir()) == files
    assert not list(tabledir.glob("*.damaged-*"))
    assert damaged_messages(caplog, logging.DEBUG) == []


def test_a_held_directory_of_a_partition_held_long_ago_is_never_moved(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    other_process: Callable[[Path], OtherProcess],
) -> None:
    """Another process holding its ``LOCK`` (a shared tabledir, a predecessor still
    closing) makes it no damage, as for a held one: it stays, logged at DEBUG. The next
    start, the holder gone, moves it."""
    _, old, assignor, tabledir = restarted_holding_long_ago(tmp_path)
    other = other_process(directory(tabledir, old))
    garble_current(directory(tabledir, old))
    with caplog.at_level(logging.DEBUG, logger="streamassign.faust"):
        reported(assignor)
    assert directory(tabledir, old).exists()
    assert not list(tabledir.glob("*.damaged-*"))
    assert damaged_messages(caplog, logging.WARNING) == []
    (line,) = [r.getMessage() for r in caplog.records if "is open in" in r.getMessage()]
    assert line.endswith(f"is open in process {other.process.pid}: not moved")
    other.close()
    asyncio.run(assignor.app.on_before_shutdown.send())
    reported(make_app(tmp_path / "w0", 7000, store="rocksdb://").assignor)
    assert len(list(tabledir.glob(f"totals-{old.partition}.db.damaged-*"))) == 1


def test_a_directory_faust_has_open_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One this process's Faust store holds a handle to is skipped, damaged or not: never
    read (its own ``LOCK`` alone would keep it in place, but a read-only open of a database
    being written races its writes), while the others are."""
    held, old, assignor, tabledir = restarted_holding_long_ago(tmp_path)
    assignor.app.tables["totals"].data._db_for_partition(old.partition)
    garble_current(directory(tabledir, old))
    read_paths = recorded_reads(monkeypatch)
    reported(assignor)
    assert directory(tabledir, old) not in read_paths
    assert sorted(read_paths) == sorted(directory(tabledir, t) for t in held)
    assert directory(tabledir, old).exists()
    assert not list(tabledir.glob("*.damaged-*"))


def test_directories_are_checked_at_the_first_join_only(tmp_path: Path) -> None:
    """Later joins read only what they report: a directory damaged after the first join is
    found by the next start (Faust may run it meanwhile; the check would be on every join).
    (Passes without the check too: it means something with the moved-aside tests above.)"""
    _, old, assignor, tabledir = restarted_holding_long_ago(tmp_path)
    reported(assignor)
    garble_current(directory(tabledir, old))
    reported(assignor)
    assert not list(tabledir.glob("*.damaged-*"))


def test_reads_that_held_the_join_up_are_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a kill -9 each read replays the directory's unflushed write-ahead
    log (60 MB: 180 ms), so a start can wait minutes before it joins: over 1 s, one INFO
    line says how many directories it read and how long that took; under it, nothing."""
    held, _, assignor, _ = restarted_holding_long_ago(tmp_path)

    def slow_lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if "for this join took" in r.getMessage()]

    monkeypatch.setattr(assignor_module, "_SLOW_DIRECTORY_READS_S", -1.0)
    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        reported(assignor)  # the first join: the held directories and the one held long ago
        reported(assignor)  # a later one: the held ones only
        first, later = slow_lines()
        monkeypatch.setattr(assignor_module, "_SLOW_DIRECTORY_READS_S", 1.0)
        caplog.clear()
        reported(assignor)
        assert slow_lines() == []
    assert first.startswith(f"reading {len(held) + 1} table partition directories for this")
    assert later.startswith(f"reading {len(held)} table partition directories for this")
    assert "the join waited for it" in later


def test_a_damaged_global_table_directory_is_moved_aside(tmp_path: Path) -> None:
    """A global table's partitions are in no task, so no report reads them, and every worker
    is assigned all of them: damaged, Faust would crash at every start."""
    held, assignor, tabledir = restarted(tmp_path)
    rates = assignor.app.tables["rates"]
    store = rates.data
    store.set_persisted_offset(TP(rates.changelog_topic.get_topic_name(), 1), 5)
    store._dbs.pop(1).close()
    garble_current(store.partition_path(1))
    info = reported(assignor)
    assert info.offset_sums == {t: 100 + t.partition for t in held}
    assert len(list(tabledir.glob("rates-1.db.damaged-*"))) == 1


def persist_and_close(store: Any, topic: str, offsets: dict[int, int]) -> None:
    """Write ``offsets`` (partition -> offset) as Faust persists them, then close those
    databases as Faust does when a worker stops."""
    for partition, offset in offsets.items():
        store.set_persisted_offset(TP(topic, partition), offset)
        store._dbs.pop(partition).close()


def test_a_damaged_set_table_directory_is_moved_aside(tmp_path: Path) -> None:
    """A set table keeps its RocksDB store at ``table.data.storage``, which the
    report did not look at: a damaged directory of one was never moved, and Faust crashed on
    it at every start (live: 2 of 2). Moved aside, the task is claimed, summed without it."""
    ran = stopped_after_running_alone(tmp_path / "w0", {**COUNTS, SET_CL: 6})
    app = make_app(tmp_path / "w0", 7000, store="rocksdb://")
    members = app.SetTable("members", value_type=int, start_manager=False)
    store = members.data.storage
    persist_and_close(store, SET_CL, {t.partition: 1000 for t in ran})
    task = min(ran)
    garble_current(Path(store.partition_path(task.partition)))
    info = reported(app.assignor)
    assert info.previous_active == ran
    assert info.offset_sums == {t: 100 + t.partition + (0 if t == task else 1000) for t in ran}
    tabledir = Path(app.conf.tabledir)
    assert len(list(tabledir.glob(f"members-{task.partition}.db.damaged-*"))) == 1


@pytest.mark.parametrize(
    "is_global", [False, True], ids=["as app.SetGlobalTable makes it", "is_global"]
)
def test_a_damaged_set_global_table_directory_is_moved_aside(
    tmp_path: Path, is_global: bool
) -> None:
    """The same, as a live run found it: a ``SetGlobalTable``'s directory in no report
    (Faust 0.15.3's ``app.SetGlobalTable`` does not pass ``is_global``, so unless the app
    does, it is partitioned like a ``SetTable``; here its changelog is in no task either
    way) is found by the first join's check and moved aside."""
    held, assignor, tabledir = restarted(tmp_path)
    extra = {"is_global": True} if is_global else {}
    tags = assignor.app.SetGlobalTable(
        "tags", value_type=int, partitions=2, start_manager=False, **extra
    )
    assert tags.is_global is is_global
    store = tags.data.storage
    persist_and_close(store, tags.changelog_topic.get_topic_name(), {0: 5, 1: 5})
    garble_current(Path(store.partition_path(1)))
    info = reported(assignor)
    assert info.offset_sums == {t: 100 + t.partition for t in held}
    assert len(list(tabledir.glob("tags-1.db.damaged-*"))) == 1
    assert (tabledir / "tags-0.db").is_dir()


def test_a_set_table_directory_faust_has_open_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A set table's handles are its storage's (``table.data.storage._dbs``): one Faust has
    open there is skipped as a plain table's is, the others are read."""
    _, assignor, tabledir = restarted(tmp_path)
    members = assignor.app.SetTable("members", value_type=int, start_manager=False)
    store = members.data.storage
    persist_and_close(store, SET_CL, {0: 5, 1: 5})
    store._db_for_partition(1)
    garble_current(tabledir / "members-1.db")
    read_paths = recorded_reads(monkeypatch)
    reported(assignor)
    assert tabledir / "members-0.db" in read_paths
    assert tabledir / "members-1.db" not in read_paths
    assert not list(tabledir.glob("*.damaged-*"))


def test_a_failed_rename_of_a_directory_held_long_ago_is_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It stays, is not claimed (it never was), and the WARNING says to move it away."""
    held, old, assignor, tabledir = restarted_holding_long_ago(tmp_path)
    garble_current(directory(tabledir, old))

    def refuse(self: Path, target: Path) -> Path:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(Path, "rename", refuse)
    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        info = reported(assignor)
    assert info.previous_active == held
    assert directory(tabledir, old).exists()
    (warning,) = damaged_messages(caplog, logging.WARNING)
    assert "1 damaged table partition directory not moved nor claimed" in warning
    assert "stop the worker and move it away" in warning


def test_partition_dirs_are_those_faust_names(tmp_path: Path) -> None:
    """Only directories Faust opens as a partition: not a moved one, a file, another
    table's (one whose name extends this one's: ``totals-1-3.db`` is table ``totals-1``'s),
    nor a number Faust never writes (``007``); none where the table dir is gone."""

    def partition_path(partition: int, table: str = "totals") -> Path:
        return tmp_path / f"{table}-{partition}.db"

    for name in (
        "totals-0.db",
        "totals-12.db",
        "totals-007.db",
        "totals-3.db.damaged-x",
        "other-1.db",
        "totals-1-3.db",
    ):
        (tmp_path / name).mkdir()
    for name in ("totals-4.db", "totals-x.db"):
        (tmp_path / name).write_bytes(b"")
    assert _damaged.partition_dirs(partition_path) == [
        (0, partition_path(0)),
        (12, partition_path(12)),
    ]
    assert _damaged.partition_dirs(lambda p: partition_path(p, "totals-1")) == [
        (3, partition_path(3, "totals-1"))
    ]
    assert _damaged.partition_dirs(lambda p: tmp_path / "gone" / f"t-{p}.db") == []


def test_a_failed_check_of_directories_held_long_ago_keeps_the_join(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check is an extra: whatever it raises, the join still claims what the worker ran
    last (metadata()'s fallback would join without history), with an ERROR naming each table."""
    held, _, assignor, _ = restarted_holding_long_ago(tmp_path)

    def fail(partition_path: Any) -> list[tuple[int, Path]]:
        raise RuntimeError("unexpected")

    monkeypatch.setattr(assignor_module, "partition_dirs", fail)
    with caplog.at_level(logging.ERROR, logger="streamassign.faust"):
        info = reported(assignor)
    assert info.previous_active == held
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert [e.split(" for damage")[0].rsplit(" ", 1)[1] for e in errors] == ["totals", "rates"]
