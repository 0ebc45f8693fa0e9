"""A table store write that fails (a full disk) stops the ``streamassign://`` worker before any
commit can pass the record (``streamassign.faust._storefail``), and proofs whose save failed are
saved again at the stop (``_proven``). Real RocksDB stores of a Faust app: the disk filling is
the process's file size limit (``RLIMIT_FSIZE``), under which RocksDB's log append fails with
``IO error: ... File too large`` as it fails with ``No space left on device`` on a full disk;
Faust's commit is a stand-in that counts what reaches it (the live check: docs/faust.md, "When
the disk fills")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import signal
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import faust
import pytest
import rocksdict
from faust.exceptions import PartitionsMismatch
from faust.streams import _current_event
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from streamassign.faust._proven import PROOFS_FILE, ProofsFile, ProvenOffsets
from streamassign.faust._storefail import StoreFailureGuard, is_store_failure

from .test_faust_assignor import SRC
from .test_faust_proven import HELD, group, zombie_app

__all__ = ["group"]  # the fixture, used here by name


class Message:
    def __init__(self, partition: int, topic: str = SRC) -> None:
        self.partition, self.topic = partition, topic


class Event:
    """What Faust's RocksDB store and table read of the event being processed: its partition
    and topic."""

    def __init__(self, partition: int) -> None:
        self.message = Message(partition)


@contextlib.contextmanager
def full_disk() -> Iterator[None]:
    """Every file this process appends to is full while inside (EFBIG for the write,
    SIGXFSZ ignored, as a full disk fails it with ENOSPC)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)


def table_write(app: faust.App, key: str, value: int, partition: int = 0) -> None:
    """An agent's table update, as Faust makes it while processing an event of ``partition``."""
    event = Event(partition)
    token = _current_event.set(weakref.ref(event))  # type: ignore[arg-type]
    try:
        app.tables["totals"].data[key] = value
    finally:
        _current_event.reset(token)


@pytest.fixture
def commits(monkeypatch: pytest.MonkeyPatch) -> list[dict[TP, int]]:
    """The commits that reach Faust's own commit path (the broker would take them)."""
    reached: list[dict[TP, int]] = []

    async def commit_tps(consumer: Any, tps: Any, start_new_transaction: bool) -> bool:
        reached.append({tp: 1 for tp in tps})
        return True

    monkeypatch.setattr(faust_aiokafka.Consumer, "_commit_tps", commit_tps)
    return reached


def crashes_of(app: faust.App) -> list[BaseException]:
    """Stand-in for Faust's crash of the app (the worker's stop path): the reasons given."""
    reasons: list[BaseException] = []

    async def crash(reason: BaseException) -> None:
        reasons.append(reason)

    app.crash = crash  # type: ignore[method-assign]
    return reasons


def drop_failed_handles(app: faust.App) -> None:
    """Close the store's databases, whose close fails after the write did (``Writer has
    previous error``): the suite's closer expects a clean close."""
    store = app.tables["totals"].data
    for db in store._dbs.values():
        with contextlib.suppress(Exception):
            db.close()
    store._dbs.clear()


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_failed_table_write_refuses_every_commit_says_so_once_and_stops_the_worker(
    tmp_path: Path, group: Any, commits: list[dict[TP, int]], caplog: pytest.LogCaptureFixture
) -> None:
    """The audit's loss: the agent fails on the write, Faust acks the event anyway, and the
    next commit passed the record. From the failed write on nothing is committed (the timer's,
    the revoke's, the stop's), one ERROR line names the table, its directory, RocksDB's
    status and what to do, and the app is crashed once, so that a supervisor restarts it."""
    app = zombie_app(tmp_path)
    g = group(app)
    reasons = crashes_of(app)
    consumer = app.consumer

    async def run() -> None:
        await g.join("m-1", 1)
        table_write(app, "k0", 1)
        assert await consumer._commit_tps([TP(SRC, 0)], True)
        with full_disk(), pytest.raises(Exception, match="IO error") as raised:
            table_write(app, "k1", 1)  # the agent still sees its write fail
        with full_disk(), pytest.raises(Exception, match="IO error"):
            table_write(app, "k2", 1, partition=1)  # the restarted agent's next record
        assert not await consumer._commit_tps([TP(SRC, 0)], True)
        assert not await consumer._commit_tps([TP(SRC, 1)], False)
        await asyncio.wrap_future(consumer._store_crash)  # the crash ran
        assert reasons == [raised.value]

    with caplog.at_level(logging.DEBUG, logger="streamassign.faust"):
        try:
            asyncio.run(run())
        finally:
            drop_failed_handles(app)
    assert commits == [{TP(SRC, 0): 1}]
    (line,) = errors(caplog)
    assert line.startswith("table 'totals': a write to its RocksDB store in ")
    assert f"{tmp_path}" in line and "totals-<partition>.db" in line
    assert "IO error: While appending to file: " in line and "File too large" in line
    assert "commits no offset from now on" in line
    assert line.endswith("free space (or fix the disk), then restart the worker")


def test_a_table_whose_source_outgrew_its_changelog_stops_the_worker_before_any_commit(
    tmp_path: Path,
    group: Any,
    commits: list[dict[TP, int]],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Partitions added to a table's source topic: Faust's check raises PartitionsMismatch
    in the agent, the stream acks the event, and Faust's restarts of the agent committed past
    every record failing it (thousands in a live run). The check latches the guard: nothing
    is committed from then on, one ERROR names the table and both counts, and the app is
    crashed once, so the records wait until the counts match."""
    app = zombie_app(tmp_path)
    g = group(app)
    reasons = crashes_of(app)
    consumer = app.consumer
    partition_counts = {SRC: 8}  # the changelog keeps 4
    monkeypatch.setattr(consumer, "topic_partitions", lambda t: partition_counts.get(t, 4))

    def table_update(key: str) -> None:
        event = Event(0)
        token = _current_event.set(weakref.ref(event))  # type: ignore[arg-type]
        try:
            app.tables["totals"][key] = 1
        finally:
            _current_event.reset(token)

    async def run() -> None:
        await g.join("m-1", 1)
        assert await consumer._commit_tps([TP(SRC, 0)], True)
        with pytest.raises(PartitionsMismatch) as raised:
            table_update("k1")
        with pytest.raises(PartitionsMismatch):
            table_update("k2")  # the restarted agent's next record
        assert not await consumer._commit_tps([TP(SRC, 0)], True)
        await asyncio.wrap_future(consumer._store_crash)  # the crash ran
        assert reasons == [raised.value]

    with caplog.at_level(logging.DEBUG, logger="streamassign.faust"):
        asyncio.run(run())
    assert commits == [{TP(SRC, 0): 1}]
    assert "k1" not in app.tables["totals"].data  # checked before the store is written
    (line,) = errors(caplog)
    assert line.startswith("table 'totals': ") and "\n" not in line
    assert "has 8 partitions" in line and "has 4 partitions" in line
    assert "by configuring Kafka correctly; this worker commits" in line
    assert "commits no offset from now on" in line
    assert line.endswith("'Adding partitions to a topic on a live fleet'")


def test_the_store_keeps_failing_after_space_is_freed(tmp_path: Path) -> None:
    """Why only a restart heals: RocksDB keeps the failed write's error for the open
    database, so every later write fails too, with room again (what the audit saw)."""
    db = rocksdict.Rdict(str(tmp_path / "db"), options=rocksdict.Options(raw_mode=True))
    try:
        db.put(b"a", b"1")
        with full_disk(), pytest.raises(Exception, match="IO error") as raised:
            db.put(b"b", b"2")
        assert is_store_failure(raised.value)
        with pytest.raises(Exception, match="IO error"):
            db.put(b"c", b"3")
    finally:
        with contextlib.suppress(Exception):  # fails as well: "Writer has previous error"
            db.close()


def test_writes_outside_the_database_do_not_count(tmp_path: Path) -> None:
    """A table write outside an event (Faust's ``AssertionError``) or of a value the store
    cannot take is the app's error, not the disk's: the worker carries on as Faust does."""
    assert not is_store_failure(AssertionError())
    assert not is_store_failure(TypeError("argument 'value': 'int' object cannot be converted"))
    assert not is_store_failure(KeyError("k"))
    assert is_store_failure(OSError(30, "Read-only file system"))
    assert is_store_failure(Exception("Corruption: bad block"))
    failures: list[Any] = []
    guard = StoreFailureGuard(lambda failure, exc: failures.append(failure))
    app = zombie_app(tmp_path)
    store = app.tables["totals"].data
    guard.watch([store])
    with pytest.raises(AssertionError):
        store["k"] = 1  # no current event
    assert not guard.failed and failures == []


def test_memory_tables_are_not_watched(tmp_path: Path) -> None:
    app = zombie_app(tmp_path, store="memory://")
    store = app.tables["totals"].data
    StoreFailureGuard(lambda failure, exc: None).watch([store])
    assert "_set" not in vars(store)  # Faust's method, not wrapped


def test_proofs_whose_save_failed_are_saved_at_the_stop(
    tmp_path: Path, group: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proofs file stayed stale after a full disk: its save failed, the disk was freed,
    and a clean stop with no offset moved wrote nothing; the next start rewound the tables to
    the stale proofs and replayed their changelogs since. The stop saves them again."""
    app = zombie_app(tmp_path)
    consumer = app.consumer
    file = ProofsFile(tmp_path / "state" / PROOFS_FILE)  # no directory: the save fails
    consumer.proven_offsets = ProvenOffsets(held=frozenset(HELD[:1]), held_as="m-1", file=file)

    async def stop_as_faust(self: Any) -> None:
        pass

    monkeypatch.setattr(faust_aiokafka.Consumer, "on_stop", stop_as_faust)
    consumer.proven_offsets.prove({HELD[0]: 7})
    assert file.last_write_failed
    (tmp_path / "state").mkdir()  # space freed
    asyncio.run(consumer.on_stop())
    saved = ProofsFile(tmp_path / "state" / PROOFS_FILE).read()
    assert saved is not None and saved.proven == {HELD[0]: 7}
    assert not file.last_write_failed


def test_a_stop_after_good_saves_writes_nothing(tmp_path: Path) -> None:
    file = ProofsFile(tmp_path / PROOFS_FILE)
    proofs = ProvenOffsets(held=frozenset(HELD[:1]), held_as="m-1", file=file)
    proofs.prove({HELD[0]: 7})
    (tmp_path / PROOFS_FILE).unlink()
    proofs.save_if_failed()
    assert not (tmp_path / PROOFS_FILE).exists()


def test_the_guard_wraps_each_write_once(tmp_path: Path) -> None:
    app = zombie_app(tmp_path)
    store = app.tables["totals"].data
    guard = StoreFailureGuard(lambda failure, exc: None)
    guard.watch([store])
    first = store._set
    guard.watch([store])
    assert store._set is first


class Sent:
    """The changelog record ``send_changelog`` returns (what ``on_key_set`` reads of it)."""

    def __init__(self, partition: int) -> None:
        self.message = Message(partition)


def test_equal_counts_and_a_table_placed_by_the_partitioner_leave_commits_flowing(
    tmp_path: Path,
    group: Any,
    commits: list[dict[TP, int]],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The guard's other side: a table whose source has its changelog's count writes, and so
    does a ``use_partitioner`` table whose changelog has another count (Faust never checks
    it, though the guard watches its check); nothing latches, and every commit passes."""
    app = zombie_app(tmp_path)
    by_user = app.Table("by_user", default=int, partitions=12, use_partitioner=True)
    g = group(app)
    consumer = app.consumer
    monkeypatch.setattr(
        consumer, "topic_partitions", lambda t: 12 if t == by_user.changelog_topic_name else 4
    )
    sent: list[tuple[str, int | None]] = []
    for table in app.tables.values():

        def send_changelog(partition: int | None, *args: Any, name: str = table.name) -> Sent:
            sent.append((name, partition))
            return Sent(11 if partition is None else partition)  # the partitioner's choice

        monkeypatch.setattr(table, "send_changelog", send_changelog)

    def table_update(name: str, key: str, value: int) -> None:
        event = Event(0)
        token = _current_event.set(weakref.ref(event))  # type: ignore[arg-type]
        try:
            app.tables[name][key] = value
        finally:
            _current_event.reset(token)

    async def run() -> None:
        await g.join("m-1", 1)
        assert getattr(by_user._verify_source_topic_partitions, "_streamassign_guarded", False)
        for value in (1, 2):
            table_update("totals", "k", value)
            table_update("by_user", "u", value)
            assert await consumer._commit_tps([TP(SRC, 0)], True)

    with caplog.at_level(logging.DEBUG, logger="streamassign.faust"):
        asyncio.run(run())
    assert sent == [("totals", 0), ("by_user", None)] * 2
    assert commits == [{TP(SRC, 0): 1}] * 2
    assert not consumer.store_guard.failed and consumer._store_crash is None
    assert app.tables["totals"]["k"] == 2 and by_user["u"] == 2
    assert not errors(caplog)
