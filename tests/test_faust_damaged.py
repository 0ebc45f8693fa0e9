"""Damaged RocksDB table partition directories (faustlive2 H1): a restarted worker reported one
Faust crashes on (RocksDB ``Corruption``, or no offset under the offset key) at 0; with a short
changelog the leader handed exactly that partition back, and the worker crash-looped. The member
now moves such a directory aside before it reports, unless it may have it open. Real RocksDB
directories, no broker (the live check: docs/faust.md, "Damaged table directories")."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from faust.types import TP

from streamassign import TaskId
from streamassign.faust import PartitionAssignor
from streamassign.faust._damaged import is_damaged_status

from .test_faust_assignor import (
    CL,
    SRC,
    make_app,
    rebalance,
    reported,
    stopped_after_running_alone,
)

COUNTS = {SRC: 6, CL: 6}


def garble_current(path: Path) -> None:
    (path / "CURRENT").write_bytes(b"garbage")  # "CURRENT file does not end with newline"


def truncate_manifest(path: Path) -> None:
    for manifest in path.glob("MANIFEST-*"):
        os.truncate(manifest, 10)


def delete_current(path: Path) -> None:
    (path / "CURRENT").unlink()  # Faust: "wal_dir contains existing log file"


DAMAGE: dict[str, Callable[[Path], None]] = {
    "garbled CURRENT": garble_current,
    "truncated MANIFEST": truncate_manifest,
    "deleted CURRENT": delete_current,
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
    assert warning.startswith("3 table partition directories")
    assert "restores those partitions from their changelogs" in warning
    assert all(str(directory(tabledir, t)) in warning for t in hit)


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
    """faustlive2 M2: 61 WARNING lines over 4 starts with every directory damaged; one line
    per join now, counting them all and naming the first few; the next join finds none."""
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
    assert "holds that partition now" in warning


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
    """Only the files' fault moves a directory: never a database another process holds, a
    full disk or a permission (moving would not help, or would take a live database)."""
    (tmp_path / "000008.log").write_bytes(b"x")
    assert not is_damaged_status(Exception(status), tmp_path)
    assert is_damaged_status(Exception("Corruption: bad block"), tmp_path)
