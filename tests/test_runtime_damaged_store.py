"""Damaged RocksDB stores, without a broker (real RocksDB stores in ``tmp_path``, the changelog
an in-memory log): a store whose files are damaged is set aside (never deleted) and restored
from its changelog, exactly; one held by another live process is left alone (the application
stops, as before); a store's failures are typed (``StoreIOError``) and a failed close is one
line, no traceback (a full disk used to log one traceback per store)."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from streamassign.errors import DamagedStateError, StoreIOError, StoreNotOpenError
from streamassign.runtime import App, RocksDBStore
from streamassign.runtime.stores import is_damaged_store_status, open_store
from streamassign.runtime.task_stores import _close_in_thread

from .test_runtime_close import TASK, make, process, until
from .test_runtime_membership import CHANGELOG, Log


def delete_current(store: Path) -> None:
    (store / "CURRENT").unlink()


def truncate_manifest(store: Path) -> None:
    manifest = sorted(store.glob("MANIFEST-*"))[-1]
    content = manifest.read_bytes()
    manifest.write_bytes(content[: len(content) // 3])


def file_in_place(store: Path) -> None:
    store.rename(store.with_name("elsewhere"))
    store.write_bytes(b"not a store")


def store_of(app: App) -> Path:
    return app._stores.state.task_dir(TASK) / "totals.rocksdb"


def fast(tmp_path: Path) -> tuple[App, Log]:
    app, log = make(tmp_path)
    app._stores.open_store = open_store  # real RocksDB, without the test's 1 s delays
    return app, log


@pytest.mark.parametrize("damage", [delete_current, truncate_manifest, file_in_place])
def test_a_damaged_store_is_set_aside_and_restored_from_its_changelog(
    tmp_path: Path, damage: Callable[[Path], None], caplog: pytest.LogCaptureFixture
) -> None:
    app, log = fast(tmp_path)

    async def run() -> tuple[dict[bytes, bytes], int]:
        updater = asyncio.create_task(app._state_updater_loop())
        await app._assign(0, frozenset([TASK]))
        first = app._actives[TASK]
        await until(lambda: not first.restoring, "the first restore")
        await process(app, first, 0, 60)
        committed = len(log.records[CHANGELOG])
        await app._revoke(0, frozenset([TASK]))
        await asyncio.gather(*app._stores.close_parked())
        damage(store_of(app))
        with caplog.at_level(logging.ERROR, "streamassign.runtime"):
            await app._assign(0, frozenset([TASK]))
            second = app._actives[TASK]
            await until(lambda: not second.restoring, "the restore of the damaged store")
        await process(app, second, 60, 10)  # and it goes on
        table = dict(second.stores["totals"].items())
        app._stopped.set()
        await updater
        await asyncio.wait_for(app.stop(), 30)
        return table, committed

    table, committed = asyncio.run(run())
    assert app.failure is None
    expected = {b"k%d" % k: b"%d" % sum(1 for i in range(70) if i % 7 == k) for k in range(7)}
    assert {k: v for k, v in table.items() if not k.endswith(b"-copy")} == expected
    assert log.replay() == table
    _, second = app.restore_events
    assert (second.source, second.start) == ("cold", 0)
    assert second.records == committed  # all of it, from the changelog's start
    # Set aside, never deleted: the damaged files are all there, under a new name.
    [aside] = store_of(app).parent.glob("totals.rocksdb.damaged-*")
    assert aside.is_file() if damage is file_in_place else (aside / "LOCK").exists()
    [line] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    message = line.getMessage()
    assert f"task {TASK}: store totals is damaged" in message and aside.name in message
    assert ("Corruption" if damage is not file_in_place else "not a directory") in message


def _link_in_place(path: Path, *, loop: bool) -> None:
    """A link where ``path`` belongs: to itself (a loop) or to a directory on a volume that is
    not mounted (nothing there); what was there is moved away."""
    path.rename(path.with_name("elsewhere"))
    path.symlink_to(path if loop else path.with_name("not-mounted") / path.name)


LINKS = {
    "store-loop": lambda store: _link_in_place(store, loop=True),
    "store-to-nothing": lambda store: _link_in_place(store, loop=False),
    "task-loop": lambda store: _link_in_place(store.parent, loop=True),
    "task-to-nothing": lambda store: _link_in_place(store.parent, loop=False),
}


@pytest.mark.parametrize("damage", LINKS.values(), ids=LINKS.keys())
def test_a_link_to_no_directory_where_a_store_or_task_directory_belongs_is_set_aside(
    tmp_path: Path, damage: Callable[[Path], None], caplog: pytest.LogCaptureFixture
) -> None:
    """Such a link used to fail every open with ``FileExistsError`` naming no path: the
    application stopped at every start. It is damage: set aside (one line naming it), and the
    store restored from its changelog."""
    app, log = fast(tmp_path)

    async def run() -> dict[bytes, bytes]:
        updater = asyncio.create_task(app._state_updater_loop())
        await app._assign(0, frozenset([TASK]))
        await until(lambda: not app._actives[TASK].restoring, "the first restore")
        await process(app, app._actives[TASK], 0, 30)
        await app._revoke(0, frozenset([TASK]))
        await asyncio.gather(*app._stores.close_parked())
        damage(store_of(app))
        with caplog.at_level(logging.WARNING):
            app.state.offset_sums()  # a join before the task comes back: no claim, no error
            await app._assign(0, frozenset([TASK]))
            second = app._actives[TASK]
            await until(lambda: not second.restoring, "the restore")
        table = dict(second.stores["totals"].items())
        app._stopped.set()
        await updater
        await asyncio.wait_for(app.stop(), 30)
        return table

    table = asyncio.run(run())
    assert app.failure is None
    assert table == log.replay() and len(table) == 14  # 7 keys and their copies
    assert app.restore_events[-1].source == "cold"
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "a link to" in line and "which leads to no directory" in line
    [aside] = tmp_path.glob("tasks/**/*.damaged-*")
    assert aside.is_symlink() and str(aside.with_name(aside.name.split(".damaged-")[0])) in line


HOLD = """
import sys
from streamassign.runtime import RocksDBStore
store = RocksDBStore(sys.argv[1])
print("open", flush=True)
sys.stdin.read()
store.close()
"""


def test_a_store_held_by_another_live_process_is_not_set_aside(tmp_path: Path) -> None:
    app, _ = fast(tmp_path)
    store = store_of(app)
    before = RocksDBStore(store)
    before.write({b"k": b"v"}, {})
    before.close()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(store)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"open\n"
        with pytest.raises(StoreIOError, match="cannot be opened: IO error: While lock file"):
            app._stores.open(TASK)

        async def run() -> None:
            await app._assign(0, frozenset([TASK]))
            await asyncio.wait_for(app._state_updater_loop(), 30)

        with pytest.raises(StoreNotOpenError, match=r"totals.*While lock file"):
            asyncio.run(run())
    finally:
        holder.communicate(b"", timeout=30)
    assert holder.returncode == 0  # its store was left alone
    assert list(store.parent.glob("*.damaged-*")) == []
    after = RocksDBStore(store)
    assert after.get(b"k") == b"v"
    after.close()
    app._stores.shutdown()


@pytest.mark.parametrize(
    ("status", "damaged"),
    [
        ("Corruption: CURRENT file corrupted", True),
        ("Corruption: block checksum mismatch: stored = 1, computed = 2", True),
        ("IO error: No such file or directory: While opening a file: x/MANIFEST-000005", True),
        ("IO error: While lock file: x/LOCK: Resource temporarily unavailable", False),
        ("IO error: lock hold by current process: x/LOCK: No locks available", False),
        ("IO error: No space left on device: While appending to file: x/000004.log", False),
        ("Corruption: IO error: No space left on device", False),
        ("IO error: While open a file for random read: x/000009.sst: Permission denied", False),
        ("IO error: While open a file: x/CURRENT: Input/output error", False),
        ("IO error: While open a file: x/CURRENT: Read-only file system", False),
        ("Invalid argument: Column families not opened: other", False),
        # a path holding "LOCK" (a folder named BLOCKS) is no lock
        ("Corruption: IO error: No such file or directory: /BLOCKS/e.rocksdb/000009.sst", True),
    ],
)
def test_which_open_failures_count_as_damage(status: str, damaged: bool) -> None:
    assert is_damaged_store_status(status) is damaged


def test_an_unopenable_store_that_cannot_be_moved_aside_stops_with_both_causes(
    tmp_path: Path,
) -> None:
    app, _ = fast(tmp_path)
    store = store_of(app)
    kept = RocksDBStore(store)
    kept.write({b"k": b"v"}, {})
    kept.close()
    delete_current(store)

    def refuse(path: Path) -> Path:
        raise PermissionError(13, "Permission denied", str(path))

    app._stores.state.set_aside = refuse  # type: ignore[method-assign]
    with pytest.raises(DamagedStateError, match=r"Corruption.*cannot move it aside.*Permission"):
        app._stores.open(TASK)
    assert list(store.glob("*.sst")) and not list(store.parent.glob("*.damaged-*"))  # kept


class FullDisk:
    """A store whose close fails the way a full disk makes RocksDB's flush fail."""

    persistent = True

    def close(self) -> None:
        raise StoreIOError("store x/totals.rocksdb: the close failed: IO error: No space left")


def test_a_close_failing_on_a_full_disk_logs_one_line_without_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, "streamassign.runtime"):
        _close_in_thread(TASK, [("totals", FullDisk()), ("other", FullDisk())])  # type: ignore[list-item]
    assert [r.getMessage() for r in caplog.records] == [
        f"task {TASK}: closing store {name} failed: store x/totals.rocksdb: the close failed: "
        "IO error: No space left"
        for name in ("totals", "other")
    ]
    assert all(r.exc_info is None for r in caplog.records)
    assert "Traceback" not in caplog.text


def test_a_failed_write_is_typed(tmp_path: Path) -> None:
    store = RocksDBStore(tmp_path / "s.rocksdb")
    store.close()
    with pytest.raises(StoreIOError, match=r"s\.rocksdb: a write failed") as failed:
        store.write({b"k": b"v"}, {})
    assert failed.value.__suppress_context__  # one traceback, not two: the status is in it


def test_a_store_directory_linked_to_another_volume_is_not_damage(tmp_path: Path) -> None:
    app, _ = fast(tmp_path / "state")
    elsewhere = tmp_path / "volume" / "totals.rocksdb"
    kept = RocksDBStore(elsewhere)
    kept.write({b"k": b"v"}, {})
    kept.close()
    store_of(app).parent.mkdir(parents=True)
    store_of(app).symlink_to(elsewhere, target_is_directory=True)
    states = app._stores.open(TASK)
    assert states["totals"].store.get(b"k") == b"v"
    states["totals"].store.close()
    assert store_of(app).is_symlink() and not list(store_of(app).parent.glob("*.damaged-*"))


def test_a_corrupt_block_a_scan_finds_fails_it_and_sets_the_store_aside_at_its_next_open(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``Rdict.items()`` ends quietly at a corrupt block; a store's ``items()`` must not (a
    restore clearing the store, or a processor's scan, would go on with part of the keys).
    The open reads no data block, so the damage is marked for the next open: restarts do
    not stop on it again and again."""
    app, _ = fast(tmp_path)
    path = store_of(app)
    store = RocksDBStore(path)
    store.write({b"%08d" % i: b"v" * 40 for i in range(100_000)}, {})
    store.close()  # flushed to one table file
    [table] = path.glob("*.sst")
    content = bytearray(table.read_bytes())
    middle = len(content) // 3
    content[middle : middle + 4096] = bytes(4096)  # data blocks only: the store still opens
    table.write_bytes(bytes(content))
    states = app._stores.open(TASK)
    read: list[bytes] = []
    with pytest.raises(StoreIOError, match="a read failed: Corruption"):
        read.extend(key for key, _ in states["totals"].store.items())
    assert 0 < len(read) < 100_000
    states["totals"].store.close()
    with caplog.at_level(logging.ERROR, "streamassign.runtime"):
        states = app._stores.open(TASK)  # set aside, opened empty: restored from the changelog
    assert list(states["totals"].store.items()) == [] and states["totals"].position == 0
    states["totals"].store.close()
    [aside] = path.parent.glob("totals.rocksdb.damaged-*")
    assert (aside / table.name).read_bytes() == bytes(content)  # kept as it was
    [line] = caplog.records
    assert "a read found it damaged: Corruption" in line.getMessage()


def test_a_damaged_block_under_the_stores_position_is_set_aside_at_the_first_open(
    tmp_path: Path,
) -> None:
    """Review: a small store whose only data block is corrupt failed its first open (the
    position read found the damage: an active's failure stopped the application); only the
    next start set it aside."""
    app, _ = fast(tmp_path)
    path = store_of(app)
    store = RocksDBStore(path)
    store.write({b"k%d" % i: b"1" for i in range(7)}, {"position": b"5"})
    store.close()
    [table] = path.glob("*.sst")
    damaged = bytearray(table.read_bytes())
    damaged[3:23] = bytes(20)
    table.write_bytes(bytes(damaged))
    states = app._stores.open(TASK)
    assert states["totals"].position == 0  # restored from its changelog
    states["totals"].store.close()
    assert list(path.parent.glob("totals.rocksdb.damaged-*"))
    app._stores.shutdown()
