"""Local state that cannot be read *now* (too many open files, no permission, an I/O error) is
not damaged: nothing is set aside, it is left out of that one read and logged once per cause.
Only something else in its place (ENOTDIR, EISDIR, ELOOP) or content that cannot be decoded
is damage. An audit found ``offset_sums`` renaming the whole ``tasks/`` directory, RocksDB
stores open in it, when a process at its open-file limit rebalanced, and an unreadable
``process.id`` replaced by a new one. The machine's tests run as root (file modes deny
nothing), so the errors are raised by patching ``pathlib``, as the audit did."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from streamassign import Subtopology, TaskId, TopicPartition, Topology
from streamassign.aiokafka import ProcessHost
from streamassign.errors import DamagedStateError, StateDirectoryError
from streamassign.localstate import StateDirectory, is_damage
from streamassign.protocol import SubscriptionInfo
from streamassign.runtime import RocksDBStore

from .test_runtime_close import TASK, process, until
from .test_runtime_damaged_store import fast, store_of

TOPOLOGY = Topology([Subtopology(0, ["in"], stores=["s"])], name="app")
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
        "this is fixed"
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
    assert len(moved) == 1 and "not checkpointing it there" in moved[0]
    app.state.close()
    assert StateDirectory(tmp_path).offset_sums() == {}  # no claim after a restart


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
