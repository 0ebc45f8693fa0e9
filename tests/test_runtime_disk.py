"""The runtime on a full disk, without a broker: the disk's refusal is injected as the
``OSError`` the write call raises (a real full disk needs a mount, hence root; see
``docs/runtime.md``, "When the disk fills", for a live run)."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from streamassign import Subtopology, TaskId, TopicPartition, Topology
from streamassign import localstate as localstate_module
from streamassign.errors import StateDirectoryError, StoreIOError, StoreNotOpenError
from streamassign.localstate import PROBE_BYTES, StateDirectory
from streamassign.runtime import App
from streamassign.runtime.task_stores import start_of

NO_SPACE = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
FULL_STORE = StoreIOError(
    "store /state/tasks/0_2/totals.rocksdb: a write failed: IO error: No space left on device: "
    "While appending to file: /state/tasks/0_2/totals.rocksdb/000004.log: No space left on device"
)


class Nothing:
    async def process(self, ctx: object, record: object) -> None: ...


def one_store() -> Topology:
    return Topology([Subtopology(0, ["events"], stores=["totals"])], name="app")


def make_app(state_dir: Path, **options: Any) -> App:
    return App(one_store(), {0: Nothing}, bootstrap_servers="x:1", state_dir=state_dir, **options)


async def failing(exc: Exception) -> None:
    raise exc


def error_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR]


# -- one line per failure (M1) --------------------------------------------------------------------


def test_a_store_write_failing_on_a_full_disk_is_one_line_per_consumer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Both consumers meet the full disk: two lines, each naming the store and RocksDB's
    status, and no traceback (they were 23 lines each)."""
    app = make_app(tmp_path, threads=2)

    async def run() -> None:
        for i in range(2):
            await app._fail_on_error(failing(FULL_STORE), f"consumer {i}")

    with caplog.at_level(logging.INFO, logger="streamassign.runtime"):
        asyncio.run(run())
    lines = error_lines(caplog)
    assert [r.getMessage().split(";")[0] for r in lines] == [
        "consumer 0 failed",
        "consumer 1 failed too",
    ]
    assert all(r.exc_info is None for r in lines)
    assert all("No space left on device" in r.getMessage() for r in lines)
    assert "Traceback" not in caplog.text
    assert app.failure is FULL_STORE


def test_a_store_open_failing_on_a_full_disk_is_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A restart while the disk is full: the state updater finds the store's open failed
    (``StoreNotOpenError`` caused by the open's ``StoreIOError``): one line, not the 55-line
    chained traceback."""
    app = make_app(tmp_path)
    opened = StoreIOError("store /state/tasks/0_0/totals.rocksdb cannot be opened: IO error: No")
    unopened = StoreNotOpenError("store totals (app-totals-changelog[0]) cannot be opened")
    unopened.__cause__ = opened

    with caplog.at_level(logging.INFO, logger="streamassign.runtime"):
        asyncio.run(app._fail_on_error(failing(unopened), "the state updater"))
    (line,) = error_lines(caplog)
    assert line.exc_info is None
    assert line.getMessage().startswith("the state updater failed; stopping the application: ")
    assert "Traceback" not in caplog.text


def test_an_unexplained_failure_keeps_its_trace_also_after_the_first(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A store used before its open (no cause: a bug) keeps its trace; so does a bug of
    another type after it, which a one-line rule for every later failure would have hidden
    at the default level."""
    app = make_app(tmp_path, threads=2)
    first = StoreNotOpenError("the store is not open yet")

    async def run() -> None:
        await app._fail_on_error(failing(first), "consumer 0")
        await app._fail_on_error(failing(FULL_STORE), "consumer 1")
        await app._fail_on_error(failing(AttributeError("late")), "the state updater")

    with caplog.at_level(logging.INFO, logger="streamassign.runtime"):
        asyncio.run(run())
    lines = error_lines(caplog)
    assert [r.exc_info is not None for r in lines] == [True, False, True]
    assert lines[1].getMessage().startswith("consumer 1 failed too; stopping the application: ")
    assert lines[2].getMessage() == "the state updater failed too; stopping the application"
    assert app.failure is first


def test_a_later_failure_of_the_first_ones_type_is_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each consumer meeting the same trouble: the first with its trace, the others one line
    each, their traces at DEBUG."""
    app = make_app(tmp_path, threads=2)

    async def run() -> None:
        await app._fail_on_error(failing(KeyError("k")), "consumer 0")
        await app._fail_on_error(failing(KeyError("k")), "consumer 1")

    with caplog.at_level(logging.DEBUG, logger="streamassign.runtime"):
        asyncio.run(run())
    lines = error_lines(caplog)
    assert [r.exc_info is not None for r in lines] == [True, False]
    assert lines[1].getMessage() == (
        "consumer 1 failed too; stopping the application: KeyError: 'k'"
    )
    assert any(r.levelno == logging.DEBUG and r.exc_info for r in caplog.records)


# -- refused before joining (M2) ------------------------------------------------------------------


class FullDiskFile:
    """A file whose writes fail as on a full disk (ext4 refuses at ``write``, when it
    reserves the blocks)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self) -> FullDiskFile:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)

    def write(self, data: bytes) -> int:
        raise NO_SPACE

    def flush(self) -> None: ...

    def fileno(self) -> int:
        return self.fd


def full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(localstate_module.os, "fdopen", lambda fd, mode: FullDiskFile(fd))


def probe_files(state_dir: Path) -> list[str]:
    return [p.name for p in (state_dir / "tasks").iterdir() if p.name.startswith(".write-probe")]


def test_the_probe_refuses_a_full_disk_in_one_line_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = StateDirectory(tmp_path)
    state.probe_writes()  # writable: no error, no file left
    assert probe_files(tmp_path) == []
    full_disk(monkeypatch)
    with pytest.raises(StateDirectoryError) as refused:
        state.probe_writes()
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        f"state directory {tmp_path} cannot be used: a test write of {PROBE_BYTES >> 10} KiB to "
        f"{tmp_path / 'tasks'} failed: No space left on device"
    )
    assert probe_files(tmp_path) == []
    state.close()


@pytest.mark.parametrize("err", [errno.EROFS, errno.EACCES, errno.EDQUOT, errno.EIO])
def test_the_probe_refuses_what_the_disk_refuses_at_create_or_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    """A read-only mount or no permission refuses the file's creation; an I/O error or a
    quota (NFS) can come only at the fsync."""
    state = StateDirectory(tmp_path)
    refusal = OSError(err, os.strerror(err))

    def refuse(*args: object, **kwargs: object) -> None:
        raise refusal

    target = "mkstemp" if err in (errno.EROFS, errno.EACCES) else "fsync"
    module = localstate_module.tempfile if target == "mkstemp" else localstate_module.os
    monkeypatch.setattr(module, target, refuse)
    with pytest.raises(StateDirectoryError, match=os.strerror(err)):
        state.probe_writes()
    assert probe_files(tmp_path) == []
    state.close()


def test_a_probe_file_left_by_a_crash_is_removed_at_the_next_open(tmp_path: Path) -> None:
    StateDirectory(tmp_path).close()
    (tmp_path / "tasks" / ".write-probe.abc123.tmp").write_bytes(bytes(PROBE_BYTES))
    StateDirectory(tmp_path).close()
    assert probe_files(tmp_path) == []


def test_a_process_on_a_full_disk_refuses_to_start_before_joining(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its stores on disk (a checkpoint claims them) could not be opened: it refuses before
    any broker call, so it never joins and claims its tasks back."""
    app = make_app(tmp_path)
    app.state.write_checkpoint(TaskId(0, 0), {TopicPartition("app-totals-changelog", 0): 10})
    called: list[str] = []

    async def no_broker(*args: object, **kwargs: object) -> dict[str, int]:
        called.append("broker")
        raise AssertionError("the broker was asked")

    monkeypatch.setattr("streamassign.runtime.app.ensure_internal_topics", no_broker)
    monkeypatch.setattr(app.host, "start", no_broker)
    full_disk(monkeypatch)
    with pytest.raises(StateDirectoryError, match="No space left on device"):
        asyncio.run(app.start())
    assert called == []
    app.state.close()


@pytest.mark.parametrize("nothing_on_disk", ["no stores", "in-memory stores"])
def test_an_app_keeping_nothing_on_disk_needs_no_writable_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nothing_on_disk: str
) -> None:
    """No store to open on disk (a topology without stores, or in-memory stores): a full
    disk does not stop the start (its only write there, the saved assignment, warns)."""
    if nothing_on_disk == "no stores":
        stateless = Topology([Subtopology(0, ["events"])], name="app")
        app = App(stateless, {0: Nothing}, bootstrap_servers="x:1", state_dir=tmp_path)
    else:
        app = make_app(tmp_path, store_kind="memory")
    started: list[str] = []

    async def topics(*args: object, **kwargs: object) -> dict[str, int]:
        started.append("topics")
        raise ConnectionError("stop here")

    monkeypatch.setattr("streamassign.runtime.app.ensure_internal_topics", topics)
    full_disk(monkeypatch)
    with pytest.raises(ConnectionError):
        asyncio.run(app.start())
    assert started == ["topics"]
    app.state.close()


# -- what the assigned line says (L5) -------------------------------------------------------------


def assigned_start(app: App, task: TaskId) -> str:
    """``start_of`` as the assignment line gives it (stores still opening), then closes."""

    async def run() -> str:
        states, _ = await app._stores.take(task)
        said = start_of(states)
        await app._stores.opening[task].task
        await app._stores.close(task, states)
        app._stores.shutdown()
        return said

    return asyncio.run(run())


def test_a_checkpointed_task_starts_per_its_checkpoint(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    task = TaskId(0, 0)
    app.state.write_checkpoint(task, {TopicPartition("app-totals-changelog", 0): 42})
    assert assigned_start(app, task) == "42 per its checkpoint; its stores opening"


def test_a_task_whose_checkpoint_cannot_be_read_does_not_start_per_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The ERROR line says the task counts as without a checkpoint; the line after it said
    "from changelog offset 0 per its checkpoint"."""
    app = make_app(tmp_path)
    task = TaskId(0, 0)
    app.state.write_checkpoint(task, {TopicPartition("app-totals-changelog", 0): 42})

    def denied(self: StateDirectory, task: TaskId) -> dict[TopicPartition, int]:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(StateDirectory, "read_checkpoint_or_raise", denied)
    with caplog.at_level(logging.ERROR, logger="streamassign.localstate"):
        said = assigned_start(app, task)
    assert "task 0_0 counts as without a checkpoint this time" in caplog.text
    assert said == "0 without a checkpoint; its stores opening"
