"""The state directory: damaged local state counts as none (set aside, logged once, never
deleted) and saves are atomic under concurrent writers and readers."""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamassign import Subtopology, TaskId, TopicPartition, Topology, localstate
from streamassign.aiokafka import ProcessHost
from streamassign.errors import StateDirectoryError
from streamassign.files import write_atomically
from streamassign.localstate import StateDirectory
from streamassign.protocol import SubscriptionInfo

TOPOLOGY = Topology([Subtopology(0, ["in"], stores=["s", "t"])], name="app")
#: The changelogs of TOPOLOGY's stores: a host reports the checkpoint entries of these only.
S, T = TOPOLOGY.changelog_topics(0)
GOOD, BAD = TaskId(0, 0), TaskId(0, 1)
DEEP = "[" * 100_000 + "]" * 100_000


def checkpoint(text: str) -> Callable[[Path], Path]:
    def make(root: Path) -> Path:
        directory = root / "tasks" / str(BAD)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "checkpoint").write_text(text)
        return directory / "checkpoint"

    return make


def task_dir_is_a_file(root: Path) -> Path:
    (root / "tasks").mkdir(parents=True, exist_ok=True)
    (root / "tasks" / str(BAD)).write_text('{"t": {"0": 5}}')
    return root / "tasks" / str(BAD)


def checkpoint_is_a_directory(root: Path) -> Path:
    (root / "tasks" / str(BAD) / "checkpoint").mkdir(parents=True)
    return root / "tasks" / str(BAD) / "checkpoint"


def task_id_out_of_range(root: Path) -> Path:
    directory = root / "tasks" / f"{1 << 31}_0"
    directory.mkdir(parents=True)
    (directory / "checkpoint").write_text('{"t": {"0": 5}}')
    return directory


DAMAGED_CHECKPOINTS = {
    "1e400": checkpoint('{"t": {"0": 1e400}}'),
    "sum past 2**63": checkpoint(f'{{"t": {{"0": {2**62}, "1": {2**62}}}}}'),
    "sum -2 (reads as running)": checkpoint('{"t": {"0": -2}}'),
    "negative offset": checkpoint('{"t": {"0": 3, "1": -1}}'),
    "NaN": checkpoint('{"t": {"0": NaN}}'),
    "float": checkpoint('{"t": {"0": 1.5}}'),
    "bool": checkpoint('{"t": {"0": true}}'),
    "huge partition": checkpoint('{"t": {"' + "9" * 5000 + '": 1}}'),
    "huge offset literal": checkpoint('{"t": {"0": ' + "9" * 5000 + "}}"),
    "nested 100k deep": checkpoint(DEEP),
    "not JSON": checkpoint("\x00garbage"),
    "empty (torn)": checkpoint(""),
    "a list": checkpoint("[1, 2]"),
    "file where the task directory belongs": task_dir_is_a_file,
    "directory where the checkpoint belongs": checkpoint_is_a_directory,
    "task id out of range": task_id_out_of_range,
}


def good_state(root: Path) -> None:
    with_good = StateDirectory(root)
    with_good.write_checkpoint(GOOD, {TopicPartition(S, 0): 7, TopicPartition(T, 0): 3})
    with_good.close()


def set_aside(damaged: Path) -> list[Path]:
    return sorted(damaged.parent.glob(f"{damaged.name}.damaged-*"))


@pytest.mark.parametrize("make", DAMAGED_CHECKPOINTS.values(), ids=DAMAGED_CHECKPOINTS.keys())
def test_a_damaged_checkpoint_counts_as_no_state_and_is_set_aside(
    tmp_path: Path, make: Callable[[Path], Path], caplog: pytest.LogCaptureFixture
) -> None:
    good_state(tmp_path)
    damaged = make(tmp_path)
    host = ProcessHost(TOPOLOGY, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path)
    with caplog.at_level(logging.WARNING, "streamassign.localstate"):
        metadata = host.assignors[0].metadata(["in"])  # raised for several kinds before
        assert SubscriptionInfo.decode(metadata.user_data).offset_sums == {GOOD: 10}
        assert host.assignors[0].metadata(["in"]).user_data  # again: still joins
    assert len(caplog.records) == 1, "logged once"
    assert "counts as no state" in caplog.records[0].getMessage()
    assert not damaged.exists() and len(set_aside(damaged)) == 1  # kept, not deleted
    host.state.write_checkpoint(BAD, {TopicPartition(S, 1): 4})  # the task works again
    assert host.offset_sums() == {GOOD: 10, BAD: 4}


@pytest.mark.parametrize(
    "content",
    [DEEP, '{"0": "0_1"}', '{"x": ["0_1"]}', '{"0": ["0_1", 3]}', '{"0": ["1_x"]}', "[]", None],
    ids=["nested", "not a list", "bad index", "not a str", "bad id", "a list", "a directory"],
)
def test_a_damaged_assignment_file_counts_as_no_history(
    tmp_path: Path, content: str | None
) -> None:
    file = tmp_path / "assignment.json"
    if content is None:
        file.mkdir()
    else:
        file.write_text(content)
    host = ProcessHost(TOPOLOGY, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path)
    assert host.restored_active(0) == frozenset()
    assert not file.exists() and len(set_aside(file)) == 1
    host.state.write_assignment({0: frozenset({GOOD})})
    assert host.state.read_assignment() == {0: frozenset({GOOD})}


@pytest.mark.parametrize("content", ["not a uuid", None], ids=["garbage", "a directory"])
def test_a_damaged_process_id_is_replaced_and_kept_aside(
    tmp_path: Path, content: str | None
) -> None:
    file = tmp_path / "process.id"
    if content is None:
        file.mkdir()
    else:
        file.write_text(content)
    state = StateDirectory(tmp_path)
    assert len(set_aside(file)) == 1
    state.close()
    assert StateDirectory(tmp_path).process_id == state.process_id


def test_a_file_where_the_tasks_directory_belongs_is_set_aside(tmp_path: Path) -> None:
    (tmp_path / "tasks").write_text("x")
    state = StateDirectory(tmp_path)
    assert state.offset_sums() == {} and len(set_aside(tmp_path / "tasks")) == 1
    state.write_checkpoint(GOOD, {TopicPartition("t", 0): 1})
    assert state.offset_sums() == {GOOD: 1}


@pytest.mark.parametrize("kind", ["directory", "looping link"])
def test_a_lock_file_that_cannot_be_opened_is_set_aside(tmp_path: Path, kind: str) -> None:
    lock = tmp_path / ".lock"
    if kind == "directory":
        (lock / "kept").mkdir(parents=True)
    else:
        lock.symlink_to(lock)
    StateDirectory(tmp_path).close()
    assert lock.is_file() and len(set_aside(lock)) == 1


def test_state_that_cannot_be_moved_aside_is_skipped_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = StateDirectory(tmp_path)
    checkpoint('{"t": {"0": -2}}')(tmp_path)

    def refuse(self: Path, target: Path) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "rename", refuse)
    with caplog.at_level(logging.WARNING, "streamassign.localstate"):
        assert state.offset_sums() == {} and state.offset_sums() == {}
    assert len(caplog.records) == 1 and "cannot move it aside" in caplog.text


def test_leftover_temporary_files_are_removed_on_open(tmp_path: Path) -> None:
    (tmp_path / ".assignment.json.abc123.tmp").write_text('{"0": [')
    (tmp_path / "notes.tmp").write_text("a user's file")
    StateDirectory(tmp_path).close()
    assert sorted(p.name for p in tmp_path.iterdir() if "tmp" in p.name) == ["notes.tmp"]


def test_concurrent_saves_never_fail_and_readers_never_see_a_torn_file(tmp_path: Path) -> None:
    """Before: every thread wrote ``assignment.json.tmp``; 4 x 200 saves gave
    FileNotFoundError and torn reads."""
    state = StateDirectory(tmp_path)
    writers, saves = 4, 100
    state.write_assignment({0: frozenset()})
    errors: list[BaseException] = []
    seen: list[dict[int, frozenset[TaskId]]] = []
    done = threading.Event()

    def write(w: int) -> None:
        try:
            for k in range(saves):
                tasks = frozenset(TaskId(s, p) for s in range(3) for p in range(w + k % 7))
                state.write_assignment({w: tasks, 9: frozenset({TaskId(w, k)})})
        except BaseException as exc:
            errors.append(exc)

    def read() -> None:
        file = tmp_path / "assignment.json"
        while not done.is_set():
            try:
                json.loads(file.read_bytes())  # raw: a torn file fails here
                seen.append(state.read_assignment())
            except BaseException as exc:
                errors.append(exc)
                return

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    reader = threading.Thread(target=read)
    reader.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    reader.join()
    assert errors == []
    assert seen and all(9 in s or s == {0: frozenset()} for s in seen)
    assert not list(tmp_path.glob("*damaged*")) and not list(tmp_path.glob("*.tmp"))
    assert state.read_assignment()[9] in {frozenset({TaskId(w, saves - 1)}) for w in range(4)}


def test_a_failed_save_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "f.json"
    write_atomically(target, b"old")

    def fail(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="No space"):
        write_atomically(target, b"new")
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["f.json"]


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**64), max_value=2**64)
    | st.floats()
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=12,
)
CHECKPOINT_LIKE = st.dictionaries(
    st.sampled_from(["t", "u", ""]),
    st.dictionaries(
        st.sampled_from(["0", "1", "-1", "01", "x", "2147483648"]),
        st.integers(min_value=-3, max_value=2**63) | st.floats() | st.booleans(),
        max_size=3,
    ),
    max_size=2,
)


DOCUMENTS = st.one_of(
    JSON.map(json.dumps),
    CHECKPOINT_LIKE.map(json.dumps),
    st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
)


def test_any_checkpoint_content_gives_a_plausible_sum_or_none(tmp_path: Path) -> None:
    state = StateDirectory(tmp_path)  # one for all examples: opening one fsyncs a process id
    file = tmp_path / "tasks" / str(BAD) / "checkpoint"

    @given(document=DOCUMENTS)
    def check(document: str) -> None:
        shutil.rmtree(tmp_path / "tasks")
        checkpoint(document)(tmp_path)
        sums = state.offset_sums()  # never raises
        assert set(sums) <= {BAD} and all(0 <= s < 2**63 for s in sums.values())
        assert file.exists() != bool(set_aside(file)), "kept if plausible, else set aside"
        SubscriptionInfo(state.process_id, offset_sums=sums).encode()  # always encodable

    check()


# -- deleting the state of tasks no longer held -----------------------------------------------


def store_files(state: StateDirectory, task: TaskId, offset: int) -> None:
    """A task's state as the runtime leaves it: a store directory with files, a checkpoint."""
    store = state.task_dir(task) / "totals.rocksdb"
    store.mkdir(parents=True)
    (store / "000001.sst").write_bytes(b"x" * 1000)
    state.write_checkpoint(task, {TopicPartition("t", task.partition): offset})


def test_a_retired_task_is_no_state_at_once_and_deleted_later(tmp_path: Path) -> None:
    state = StateDirectory(tmp_path)
    held, gone = TaskId(0, 0), TaskId(0, 1)
    store_files(state, held, 5)
    store_files(state, gone, 7)
    assert state.local_tasks() == {held, gone}
    aside = state.retire_task(gone)
    assert aside is not None and aside.name.startswith("0_1.removed-")
    # Reported nowhere from the rename on, before the (slow) delete runs.
    assert state.offset_sums() == {held: 5} and state.local_tasks() == {held}
    assert state.read_checkpoint(gone) == {}
    store_files(state, gone, 9)  # the task opens again meanwhile: a new directory of its own
    assert state.delete_retired() == 1
    assert not aside.exists()
    assert state.offset_sums() == {held: 5, gone: 9}
    assert (state.task_dir(held) / "totals.rocksdb" / "000001.sst").is_file()  # untouched
    assert state.retire_task(TaskId(3, 3)) is None  # no directory: nothing to do
    assert state.delete_retired() == 0


def test_deleting_leaves_damaged_and_foreign_entries_alone(tmp_path: Path) -> None:
    state = StateDirectory(tmp_path)
    tasks = tmp_path / "tasks"
    kept = {
        "0_1.damaged-20260101T000000Z": "state set aside for inspection",
        "0_1.removed-abc.damaged-20260101T000000Z": "a damaged entry of a removed one",
        "x.removed-abc": "not named after a task",
        "0_1.removed-": "no token",
        "notes.txt": "a user's file",
    }
    for name, text in kept.items():
        (tasks / name).write_text(text)
    (tasks / "0_2").write_text("a file where a task directory belongs")
    (tasks / f"{1 << 31}_0").mkdir()  # a task id out of range: damaged, not a task
    assert state.local_tasks() == set()
    # Left by a crash mid-delete: a file, a partly deleted directory, a link.
    (tasks / "0_3.removed-0123456789ab").write_text("x")
    (tasks / "0_4.removed-0123456789ab" / "s.rocksdb").mkdir(parents=True)
    damaged_inside = tasks / "0_4.removed-0123456789ab" / "checkpoint.damaged-20260101T000000Z"
    damaged_inside.write_text("{")  # set aside by ``read_checkpoint``: kept, moved out
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "data").write_text("not ours")
    (tasks / "0_5").symlink_to(outside)
    assert state.local_tasks() == {TaskId(0, 5)}  # a task directory, wherever it lives
    assert state.retire_task(TaskId(0, 5)) is not None
    assert state.delete_retired() == 3
    moved = "0_4.checkpoint.damaged-20260101T000000Z"
    assert sorted(p.name for p in tasks.iterdir()) == sorted([*kept, "0_2", f"{1 << 31}_0", moved])
    assert (tasks / moved).read_text() == "{"
    assert (outside / "data").read_text() == "not ours"  # a link is removed, never followed


def test_state_that_cannot_be_removed_or_deleted_stays_and_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = StateDirectory(tmp_path)
    task = TaskId(0, 1)
    store_files(state, task, 7)

    def refuse(*args: object, **kw: object) -> None:
        raise PermissionError(13, "Permission denied")

    with caplog.at_level(logging.WARNING, "streamassign.localstate"):
        with monkeypatch.context() as patched:
            patched.setattr(Path, "rename", refuse)
            assert state.retire_task(task) is None
            assert state.retire_task(task) is None  # tried again, logged once
        assert state.offset_sums() == {task: 7}  # still the task's state
        assert state.retire_task(task) is not None
        with monkeypatch.context() as patched:
            patched.setattr(shutil, "rmtree", refuse)
            assert state.delete_retired() == 0
            assert state.delete_retired() == 0 and state.retired_left
        assert state.offset_sums() == {}
    aside = next((tmp_path / "tasks").iterdir())
    assert [r.getMessage() for r in caplog.records] == [
        f"cannot remove the local state of task 0_1 ({state.task_dir(task)}): "
        "[Errno 13] Permission denied; trying again at each cleanup",
        f"cannot delete the state of a task no longer held ({aside}): "
        "[Errno 13] Permission denied; trying again at each cleanup",
    ]
    assert state.delete_retired() == 1  # the next call deletes it
    assert list((tmp_path / "tasks").iterdir()) == [] and not state.retired_left


def test_the_renames_reach_the_disk_before_any_delete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A power loss mid-delete must not keep the unlinks and lose the rename (a half-deleted
    store under the task's own name, opened and reported as the task's state)."""
    state = StateDirectory(tmp_path)
    store_files(state, TaskId(0, 1), 7)
    store_files(state, TaskId(0, 2), 7)
    steps: list[str] = []
    real_rmtree = shutil.rmtree

    def sync(directory: Path) -> None:
        steps.append(f"sync {Path(directory).name}")

    def rmtree(path: Path) -> None:
        steps.append(f"delete {Path(path).name.partition('.')[0]}")
        real_rmtree(path)

    monkeypatch.setattr(localstate, "sync_directory", sync)
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    assert state.delete_retired() == 0 and steps == []  # nothing retired: no sync
    assert state.retire_task(TaskId(0, 1)) and state.retire_task(TaskId(0, 2))
    assert state.delete_retired() == 2
    assert steps[0] == "sync tasks" and sorted(steps[1:]) == ["delete 0_1", "delete 0_2"]


@pytest.mark.parametrize(
    ("where", "reason"),
    [
        ("file", "it exists and is not a directory"),
        ("file/below", "Not a directory"),
    ],
)
def test_a_state_directory_that_cannot_be_used_is_one_typed_line(
    tmp_path: Path, where: str, reason: str
) -> None:
    """A file where the directory belongs, or below a file: the operator's to fix, named in
    one line (an audit got a raw FileExistsError trace from the examples' --state-dir)."""
    (tmp_path / "file").write_text("not a state directory")
    with pytest.raises(StateDirectoryError) as caught:
        StateDirectory(tmp_path / where)
    assert str(caught.value) == f"state directory {tmp_path / where} cannot be used: {reason}"
    assert (tmp_path / "file").read_text() == "not a state directory"  # nothing set aside
