"""Local state that cannot be read *now* (too many open files, no permission, an I/O error) is
not damaged: nothing is set aside, it is left out of that one read and logged once per cause.
Only something else in its place (ENOTDIR, EISDIR, ELOOP) or content that cannot be decoded
is damage. An audit found ``offset_sums`` renaming the whole ``tasks/`` directory, RocksDB
stores open in it, when a process at its open-file limit rebalanced, and an unreadable
``process.id`` replaced by a new one. The machine's tests run as root (file modes deny
nothing), so the errors are raised by patching ``pathlib``, as the audit did."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from streamassign import Subtopology, TaskId, TopicPartition, Topology
from streamassign.aiokafka import ProcessHost
from streamassign.errors import DamagedStateError, MissingChangelogError, StateDirectoryError
from streamassign.localstate import StateDirectory, is_damage
from streamassign.protocol import SubscriptionInfo
from streamassign.runtime import App, RocksDBStore
from streamassign.runtime._topics import _refuse_lost_changelogs

from .test_runtime_app import Nothing
from .test_runtime_close import TASK, process, until
from .test_runtime_damaged_store import fast, store_of

TOPOLOGY = Topology([Subtopology(0, ["in"], stores=["s"])], name="app")
CHANGELOG = TOPOLOGY.changelog_topic("s")
ONE, TWO = TaskId(0, 1), TaskId(0, 2)
PID = "11111111-1111-1111-1111-111111111111"
#: Errors that say nothing about the state itself: the environment's, the operator's to fix.
NOT_DAMAGE = {
    "EMFILE": errno.EMFILE,
    "ENFILE": errno.ENFILE,
    "EACCES": errno.EACCES,
    "EPERM": errno.EPERM,
    "EIO": errno.EIO,
    "ENOMEM": errno.ENOMEM,
}


def os_error(code: int, path: Path) -> OSError:
    """What the system raises (``OSError`` picks the subclass: PermissionError for EACCES)."""
    return OSError(code, os.strerror(code), str(path))


class Refusals:
    """Makes ``Path.iterdir`` / ``Path.open`` / ``Path.read_text`` fail for chosen paths."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.failing: dict[Path, int] = {}
        for name in ("iterdir", "open", "read_text"):
            monkeypatch.setattr(Path, name, self._refusing(getattr(Path, name)))

    def _refusing(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def method(path: Path, *args: Any, **kwargs: Any) -> Any:
            if path in self.failing:
                raise os_error(self.failing[path], path)
            return real(path, *args, **kwargs)

        return method


@pytest.fixture
def refusals(monkeypatch: pytest.MonkeyPatch) -> Iterator[Refusals]:
    yield Refusals(monkeypatch)


def two_tasks(root: Path) -> StateDirectory:
    (root / "process.id").write_text(PID)
    (root / "assignment.json").write_text('{"0": ["0_1"]}')
    state = StateDirectory(root)
    for task in (ONE, TWO):
        changelog = TopicPartition(TOPOLOGY.changelog_topic("s"), task.partition)
        state.write_checkpoint(task, {changelog: 100 * task.partition})
        (state.task_dir(task) / "s.rocksdb").mkdir()  # as an open store's files would be
    return state


def entries(root: Path) -> list[str]:
    """Every path under ``root`` (nothing renamed, nothing added)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.name.startswith("."))


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("code", NOT_DAMAGE.values(), ids=NOT_DAMAGE.keys())
def test_a_tasks_directory_that_cannot_be_listed_now_is_left_in_place(
    tmp_path: Path, refusals: Refusals, caplog: pytest.LogCaptureFixture, code: int
) -> None:
    state = two_tasks(tmp_path)
    before = entries(tmp_path)
    refusals.failing[tmp_path / "tasks"] = code
    with caplog.at_level(logging.DEBUG, "streamassign.localstate"):
        assert state.offset_sums() == {} and state.offset_sums() == {}  # two joins
        [line] = errors(caplog)  # one line, not one per join; the repeat at DEBUG
        reason = os.strerror(code)
        assert line.startswith(f"cannot read local state {tmp_path / 'tasks'} ({reason})")
        assert "left in place (not damaged" in line
        assert entries(tmp_path) == before  # nothing moved aside (was: tasks.damaged-<time>)
        del refusals.failing[tmp_path / "tasks"]
        assert state.offset_sums() == {ONE: 100, TWO: 200}  # the next join has them again
    assert "can be read again" in caplog.records[-1].getMessage()


@pytest.mark.parametrize("code", NOT_DAMAGE.values(), ids=NOT_DAMAGE.keys())
def test_a_checkpoint_that_cannot_be_read_now_is_left_out_of_that_report_only(
    tmp_path: Path, refusals: Refusals, caplog: pytest.LogCaptureFixture, code: int
) -> None:
    state = two_tasks(tmp_path)
    before = entries(tmp_path)
    refusals.failing[state.task_dir(ONE) / "checkpoint"] = code
    with caplog.at_level(logging.WARNING, "streamassign.localstate"):
        assert state.offset_sums() == {TWO: 200} and state.offset_sums() == {TWO: 200}
        assert state.read_checkpoint(ONE) == {}
    assert len(errors(caplog)) == 2  # once for the offset sums, once for the reader
    assert entries(tmp_path) == before  # the checkpoint kept (was: checkpoint.damaged-<time>)
    del refusals.failing[state.task_dir(ONE) / "checkpoint"]
    assert state.offset_sums() == {ONE: 100, TWO: 200}


def test_one_unreadable_checkpoint_among_readable_ones_is_logged_once(
    tmp_path: Path, refusals: Refusals, caplog: pytest.LogCaptureFixture
) -> None:
    """The reads of every task shared one record of the last cause: each readable task's
    read "ended" the unreadable one's, so every round (a rebalance opening both) logged the
    ERROR again and a false "can be read again"."""
    state = two_tasks(tmp_path)
    refusals.failing[state.task_dir(ONE) / "checkpoint"] = errno.EACCES
    with caplog.at_level(logging.INFO, "streamassign.localstate"):
        for _ in range(5):
            assert state.read_checkpoint(ONE) == {} and state.read_checkpoint(TWO) == {
                TopicPartition(CHANGELOG, 2): 200
            }
        del refusals.failing[state.task_dir(ONE) / "checkpoint"]
        assert state.read_checkpoint(ONE) == {TopicPartition(CHANGELOG, 1): 100}
        state.read_checkpoint(ONE)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in lines] == ["ERROR", "INFO"]
    assert str(state.task_dir(ONE)) in lines[0][1] and "task 0_1" in lines[1][1]


def test_a_join_at_the_open_file_limit_reports_the_running_tasks_and_moves_nothing(
    tmp_path: Path, refusals: Refusals
) -> None:
    """The audit's case (``emfile_tasks.py``) through the host, as ``metadata`` runs it."""
    two_tasks(tmp_path).close()
    host = ProcessHost(TOPOLOGY, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path)
    refusals.failing[tmp_path / "tasks"] = errno.EMFILE
    info = SubscriptionInfo.decode(host.assignors[0].metadata(["in"]).user_data)
    assert info.offset_sums == {} and info.process_id.hex == PID.replace("-", "")
    del refusals.failing[tmp_path / "tasks"]
    assert not list(tmp_path.glob("*.damaged-*"))
    info = SubscriptionInfo.decode(host.assignors[0].metadata(["in"]).user_data)
    assert info.offset_sums == {ONE: 100, TWO: 200}


@pytest.mark.parametrize("code", [errno.EACCES, errno.EIO, errno.EMFILE])
def test_a_process_id_that_cannot_be_read_is_kept_and_stops_the_open_in_one_line(
    tmp_path: Path, refusals: Refusals, code: int
) -> None:
    file = tmp_path / "process.id"
    file.write_text(PID)
    refusals.failing[file] = code
    with pytest.raises(StateDirectoryError) as caught:
        StateDirectory(tmp_path)
    assert str(caught.value) == (
        f"state directory {tmp_path} cannot be used: cannot read its process id ({file}: "
        f"{os.strerror(code)}); not replaced, so the process keeps its identity and tasks once "
        "this is fixed (its permission, the disk); or delete it to start with a new id (its "
        "tasks then restore elsewhere or warm up here again)"
    )
    del refusals.failing[file]
    assert file.read_text() == PID and not list(tmp_path.glob("*.damaged-*"))  # was: a new id
    assert str(StateDirectory(tmp_path).process_id) == PID  # and the lock was released


def test_an_assignment_file_that_cannot_be_read_is_kept(
    tmp_path: Path, refusals: Refusals, caplog: pytest.LogCaptureFixture
) -> None:
    two_tasks(tmp_path).close()
    refusals.failing[tmp_path / "assignment.json"] = errno.EACCES
    with caplog.at_level(logging.WARNING, "streamassign.localstate"):
        host = ProcessHost(TOPOLOGY, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path)
    assert host.restored_active(0) == frozenset()
    [line] = errors(caplog)
    assert "Permission denied" in line and "not claimed" in line
    del refusals.failing[tmp_path / "assignment.json"]
    assert host.state.read_assignment() == {0: frozenset({ONE})}  # kept, not set aside


def test_content_that_cannot_be_decoded_is_still_damage(tmp_path: Path) -> None:
    """Not UTF-8 (a ValueError, not an OSError): set aside, a new id, as before."""
    (tmp_path / "process.id").write_bytes(b"\xff\xfe garbage")
    state = StateDirectory(tmp_path)
    assert str(state.process_id) != PID and len(list(tmp_path.glob("process.id.damaged-*"))) == 1


def test_a_loop_of_links_where_tasks_belongs_is_damage(tmp_path: Path) -> None:
    state = StateDirectory(tmp_path)
    (tmp_path / "tasks").rmdir()
    (tmp_path / "tasks").symlink_to(tmp_path / "tasks")
    assert state.offset_sums() == {}
    assert (tmp_path / "tasks").is_dir() and len(list(tmp_path.glob("tasks.damaged-*"))) == 1


def test_a_loop_of_links_where_a_task_directory_belongs_is_set_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The checkpoint path inside the loop cannot be renamed (it was tried, and logged as
    stuck); the loop itself is set aside, once, naming where it leads."""
    state = two_tasks(tmp_path)
    directory = state.task_dir(ONE)
    directory.rename(tmp_path / "elsewhere")
    directory.symlink_to(directory)
    with caplog.at_level(logging.WARNING, "streamassign.localstate"):
        assert state.offset_sums() == {TWO: 200}
        assert state.offset_sums() == {TWO: 200}
    [line] = errors(caplog)
    assert f"{directory} (a link to {directory}, which leads to no directory)" in line
    [aside] = tmp_path.glob("tasks/0_1.damaged-*")
    assert aside.is_symlink() and not directory.is_symlink()


@pytest.mark.parametrize(
    ("error", "damaged"),
    [
        (NotADirectoryError(errno.ENOTDIR, "Not a directory"), True),
        (IsADirectoryError(errno.EISDIR, "Is a directory"), True),
        (OSError(errno.ELOOP, "Too many levels of symbolic links"), True),
        (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), True),
        (ValueError("badly formed hexadecimal UUID string"), True),
        (DamagedStateError("not valid JSON"), True),
        (RecursionError(), True),
        (FileNotFoundError(errno.ENOENT, "No such file or directory"), False),
        (OSError(errno.ENOSPC, "No space left on device"), False),
        *[(OSError(code, os.strerror(code)), False) for code in NOT_DAMAGE.values()],
    ],
)
def test_what_counts_as_damage(error: BaseException, damaged: bool) -> None:
    assert is_damage(error) is damaged


def test_a_store_knows_when_its_directory_moved(tmp_path: Path) -> None:
    path = tmp_path / "tasks" / "0_0" / "s.rocksdb"
    store = RocksDBStore(path)
    try:
        assert not store.moved()
        (tmp_path / "tasks").rename(tmp_path / "elsewhere")
        assert store.moved()  # gone from its path
        path.mkdir(parents=True)
        assert store.moved()  # another, empty, directory in its place
    finally:
        store.close()


def test_no_checkpoint_is_written_where_the_open_store_no_longer_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``tasks/`` renamed under an open store (by anyone: the old ``offset_sums`` did): the
    checkpoint would land in a new, empty ``tasks/0_0/`` and the process would report itself
    caught up on a task it has no state of after a restart."""
    app, _ = fast(tmp_path)

    async def run() -> None:
        updater = asyncio.create_task(app._state_updater_loop())
        await app._assign(0, frozenset([TASK]))
        active = app._actives[TASK]
        await until(lambda: not active.restoring, "the restore")
        await process(app, active, 0, 20)
        (tmp_path / "tasks").rename(tmp_path / "tasks.elsewhere")
        (tmp_path / "tasks").mkdir()
        with caplog.at_level(logging.ERROR, "streamassign.runtime"):
            await process(app, active, 20, 5)  # commits, each trying a checkpoint
            await process(app, active, 25, 5)
            await app._revoke(0, frozenset([TASK]))
            await asyncio.gather(*app._stores.close_parked())
        app._stopped.set()
        await updater
        await asyncio.wait_for(app.stop(), 30)

    asyncio.run(run())
    assert not store_of(app).parent.exists()  # no tasks/0_0/checkpoint without its store
    moved = [r.getMessage() for r in caplog.records if "no longer in" in r.getMessage()]
    assert len(moved) == 1 and "its checkpoint there deleted, and none written" in moved[0]
    app.state.close()
    assert StateDirectory(tmp_path).offset_sums() == {}  # no claim after a restart


def test_the_checkpoint_beside_a_store_directory_deleted_under_the_open_store_goes_too(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Only the store's own directory deleted (an operator "resetting" it): the checkpoint
    written before stayed beside no store, and after a restart the process claimed the last
    position (``{0_0: 41}``) for a task it restores from scratch."""
    app, _ = fast(tmp_path)

    async def run() -> None:
        updater = asyncio.create_task(app._state_updater_loop())
        await app._assign(0, frozenset([TASK]))
        active = app._actives[TASK]
        await until(lambda: not active.restoring, "the restore")
        await process(app, active, 0, 20)
        assert app.state.offset_sums()[TASK] > 0
        shutil.rmtree(store_of(app))
        with caplog.at_level(logging.ERROR, "streamassign.runtime"):
            await process(app, active, 20, 5)
            assert app.state.offset_sums() == {}  # at the next join already
            await process(app, active, 25, 5)
            await app._revoke(0, frozenset([TASK]))
            await asyncio.gather(*app._stores.close_parked())
        app._stopped.set()
        await updater
        await asyncio.wait_for(app.stop(), 30)

    asyncio.run(run())
    moved = [r.getMessage() for r in caplog.records if "no longer in" in r.getMessage()]
    assert len(moved) == 1 and "its checkpoint there deleted" in moved[0]
    app.state.close()
    assert StateDirectory(tmp_path).offset_sums() == {}  # no claim after a restart


def test_a_checkpoint_write_failing_at_every_commit_is_logged_once_per_cause(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the open-file limit every commit's (1 s) checkpoint write fails: one WARNING per
    task per commit was logged. Once per cause now, and one INFO when it works again."""
    app, _ = fast(tmp_path)
    causes = iter([errno.EMFILE] * 5 + [errno.ENOSPC] * 5)

    def refuse(*args: object, **kwargs: object) -> None:
        code = next(causes)
        raise OSError(code, os.strerror(code), str(tmp_path / "tasks" / "0_0" / "tmp-123"))

    async def run() -> None:
        updater = asyncio.create_task(app._state_updater_loop())
        await app._assign(0, frozenset([TASK]))
        active = app._actives[TASK]
        await until(lambda: not active.restoring, "the restore")
        with caplog.at_level(logging.INFO, "streamassign.runtime"):
            with monkeypatch.context() as patched:
                patched.setattr(app.state, "write_checkpoint", refuse)
                for round in range(10):
                    await process(app, active, round * 3, 3)
            await process(app, active, 30, 3)
            await process(app, active, 33, 3)
        app._stopped.set()
        await updater
        await asyncio.wait_for(app.stop(), 30)

    asyncio.run(run())
    lines = [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if "checkpoint" in r.getMessage() and r.levelno >= logging.INFO
    ]
    assert [level for level, _ in lines] == ["WARNING", "WARNING", "INFO"]  # was 10 WARNINGs
    assert "Too many open files" in lines[0][1] and "No space left" in lines[1][1]
    assert lines[2][1] == "task 0_0: its checkpoint is written again"


def test_checkpoints_follow_an_open_store_that_stays_put(tmp_path: Path) -> None:
    """The guard costs nothing in the usual case: the checkpoint is written beside the store."""
    app, _ = fast(tmp_path)

    async def run() -> int:
        updater = asyncio.create_task(app._state_updater_loop())
        await app._assign(0, frozenset([TASK]))
        active = app._actives[TASK]
        await until(lambda: not active.restoring, "the restore")
        await process(app, active, 0, 20)
        position = active.stores["totals"].position
        app._stopped.set()
        await updater
        await asyncio.wait_for(app.stop(), 30)
        return position

    position = asyncio.run(run())
    assert position > 0
    assert StateDirectory(tmp_path).offset_sums() == {TASK: position}


class _Started(Exception):
    """Raised where App.start would go on to the broker."""


def _start_in_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``App.start`` with in-memory stores, up to where it would reach the broker."""
    import streamassign.runtime.app as app_module

    async def no_topics(*args: object, **kwargs: object) -> dict[str, int]:
        return {}

    async def broker(*args: object) -> None:
        raise _Started

    monkeypatch.setattr(app_module, "ensure_internal_topics", no_topics)
    monkeypatch.setattr(app_module.App, "_make_producers", broker)
    app = App(
        TOPOLOGY, {0: Nothing}, bootstrap_servers="x:1", state_dir=tmp_path, store_kind="memory"
    )
    try:
        with pytest.raises(_Started):
            asyncio.run(app.start())
    finally:
        app.state.close()


def test_in_memory_stores_delete_a_previous_runs_checkpoint_that_cannot_be_read_now(
    tmp_path: Path, refusals: Refusals, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delete step went through ``offset_sums``, which leaves out what it cannot read:
    that checkpoint survived, and once readable was reported as state the process does not
    have (an in-memory store's). Deleting needs no read."""
    two_tasks(tmp_path).close()
    refusals.failing[tmp_path / "tasks" / str(ONE) / "checkpoint"] = errno.EACCES
    _start_in_memory(tmp_path, monkeypatch)
    refusals.failing.clear()
    assert StateDirectory(tmp_path).offset_sums() == {}  # was {0_1: 100}


def test_in_memory_stores_refuse_the_start_when_old_checkpoints_cannot_be_listed(
    tmp_path: Path, refusals: Refusals, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tasks/`` cannot be listed at the start: every checkpoint in it would survive and be
    claimed later; the start is refused in one line naming it, nothing is moved."""
    two_tasks(tmp_path).close()
    before = entries(tmp_path)
    refusals.failing[tmp_path / "tasks"] = errno.EMFILE
    with pytest.raises(StateDirectoryError) as refused:
        _start_in_memory(tmp_path, monkeypatch)
    assert str(refused.value) == (
        f"state directory {tmp_path} cannot be used: cannot delete the checkpoints of a "
        f"previous run ({tmp_path / 'tasks'}: Too many open files); with in-memory stores they "
        "describe state that is gone, and would be reported as held once readable"
    )
    assert entries(tmp_path) == before


@pytest.mark.parametrize("unreadable", ["tasks", "checkpoint"])
def test_a_missing_changelog_is_not_created_while_the_checkpoints_cannot_be_read(
    tmp_path: Path, refusals: Refusals, unreadable: str
) -> None:
    """The check read "cannot read" as "no data" and let the deleted changelog be created
    empty: the task's local state then was past its end and started over. It refuses in one
    line now, moving nothing (the state may well be fine)."""
    state = two_tasks(tmp_path)
    before = entries(tmp_path)
    path = tmp_path / "tasks" if unreadable == "tasks" else state.task_dir(ONE) / "checkpoint"
    refusals.failing[path] = errno.EACCES
    with pytest.raises(MissingChangelogError) as refused:
        _refuse_lost_changelogs(state, {CHANGELOG})
    assert str(refused.value) == (
        f"changelog topic(s) {CHANGELOG} missing, and the local state in {tmp_path} cannot be "
        f"read to tell whether it holds data of them ({path}: Permission denied); not created: the "
        "state may be fine, fix the read error (permission, disk, open files) and start again"
    )
    _refuse_lost_changelogs(state, set())  # nothing missing: nothing to tell, no refusal
    refusals.failing.clear()
    assert entries(tmp_path) == before
    with pytest.raises(MissingChangelogError, match=f"{CHANGELOG}: tasks 0_1, 0_2"):
        _refuse_lost_changelogs(state, {CHANGELOG})


def _unblock(fifo: Path) -> None:
    """Open ``fifo``'s other end, so a reader or writer blocked on it (the old code) ends."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))


@pytest.mark.parametrize("name", ["tasks/0_1/checkpoint", "assignment.json", "process.id", ".lock"])
def test_a_fifo_where_a_state_file_belongs_is_damage_and_blocks_nothing(
    tmp_path: Path, name: str
) -> None:
    """Opening a FIFO blocks until its other end is opened: a join (``offset_sums``) or a
    start stayed blocked, the event loop with it. It is set aside like any damage."""
    two_tasks(tmp_path).close()
    fifo = tmp_path / name
    fifo.unlink()
    os.mkfifo(fifo)
    results: list[object] = []

    def open_and_read() -> None:
        state = StateDirectory(tmp_path)
        results.append((state.offset_sums(), state.read_assignment(), str(state.process_id)))
        state.close()

    reader = threading.Thread(target=open_and_read, daemon=True)
    reader.start()
    reader.join(10)
    blocked = reader.is_alive()
    while reader.is_alive():
        _unblock(fifo)
        reader.join(0.1)
    assert not blocked
    [(sums, assignment, pid)] = results
    assert sums == ({TWO: 200} if "checkpoint" in name else {ONE: 100, TWO: 200})
    assert assignment == ({} if name == "assignment.json" else {0: frozenset({ONE})})
    assert (pid == PID) is (name != "process.id")
    [aside] = fifo.parent.glob(f"{fifo.name}.damaged-*")
    assert aside.is_fifo()
