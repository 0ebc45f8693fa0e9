"""The runtime rewrites a task's checkpoint at every commit: it keeps the entries of changelogs
that are not the task's stores in this topology (another topology version's), whose store files
it leaves untouched in the task's directory, so a rollback to that version reports that state.

Review 21, finding 2: after a v1 -> v3 roll and back, a v1 host reported no sum for 0_1 and 0_3
although their ``ca.rocksdb`` was still there and warm: v3's first checkpoint of those tasks
had replaced the whole file with its ``cb`` entry."""

from __future__ import annotations

import asyncio
import errno
import shutil
from pathlib import Path

import pytest

from streamassign import TaskId, TopicPartition, Topology
from streamassign.aiokafka import ProcessHost
from streamassign.localstate import StateDirectory
from streamassign.runtime import COMMIT_KEY
from streamassign.runtime._topics import changelogs_with_state
from streamassign.runtime.changelog import StoreState, encode_marker
from streamassign.runtime.standbys import Standbys
from streamassign.runtime.stores import StoreKind
from streamassign.runtime.task_stores import TaskStores

from .test_localstate_versions import CA, CB, T01, T10, T11, V1, V3, v1_state


def run_v3_task(root: Path, store_kind: StoreKind, records: int) -> dict[TopicPartition, int]:
    """v3 runs 0_1 here (``records`` changelog records, one checkpoint per commit, then the
    close); returns the checkpoint as it was before the close."""
    state = StateDirectory(root)
    stores = TaskStores(V3, store_kind, state, Standbys())

    async def run() -> dict[TopicPartition, int]:
        states = stores.open(T01)
        cb: StoreState = states["cb"]
        for offset in range(records):
            cb.restore(offset, b"k", str(offset).encode())
            cb.restore(offset + 1, COMMIT_KEY, encode_marker({}))
            stores.checkpoint(T01, states, durable=False)  # what each commit writes
        written = state.read_checkpoint(T01)
        await stores.close(T01, states)
        stores.shutdown()
        return written

    try:
        return asyncio.run(run())
    finally:
        state.close()


def sums(root: Path, topology: Topology) -> dict[TaskId, int]:
    """What a host of ``topology`` reports of the state at ``root``."""
    host = ProcessHost(topology, bootstrap_servers="127.0.0.1:1", state_dir=root)
    try:
        return host.offset_sums()
    finally:
        host.state.close()


def test_a_rolled_back_version_reports_the_state_it_left_in_a_task_the_new_one_ran(
    tmp_path: Path,
) -> None:
    v1_state(tmp_path)  # 0_1: ``ca`` at 658, and its store's files
    written = run_v3_task(tmp_path, "rocksdb", records=3)
    own = TopicPartition(CB, 1)
    assert written == {TopicPartition(CA, 1): 658, own: 4}  # was {cb: 4}: ``ca``'s entry lost
    state = StateDirectory(tmp_path)
    assert state.read_checkpoint(T01) == written  # the durable one at close keeps it too
    assert (state.task_dir(T01) / "store.rocksdb").is_dir()  # v1's store, untouched
    # The raw view (the start's missing-changelog check) sees both; it refuses only a missing
    # changelog of the current topology, which ``ca``'s is not for v3.
    assert changelogs_with_state(state)[CA] == [TaskId(0, 0), T01]
    state.close()
    assert sums(tmp_path, V3) == {T01: 4}  # v3 counts only its ``cb``
    # Rolled back, v1 counts its ``ca`` in 0_1 again (was: no sum for 0_1).
    assert sums(tmp_path, V1) == {TaskId(0, 0): 656, T01: 658, T10: 300, T11: 301}


def test_an_in_memory_task_leaves_no_checkpoint_when_it_closes(tmp_path: Path) -> None:
    """In-memory stores keep nothing after a close, so their checkpoint goes, kept entries
    with it (an in-memory process also deletes every checkpoint at start: there are none)."""
    v1_state(tmp_path)
    written = run_v3_task(tmp_path, "memory", records=2)
    assert written[TopicPartition(CB, 1)] == 3  # while running, as a persistent store's
    state = StateDirectory(tmp_path)
    assert not (state.task_dir(T01) / "checkpoint").exists()
    state.close()
    assert sums(tmp_path, V3) == {}


def test_a_task_whose_directory_went_while_released_keeps_no_other_versions_entry(
    tmp_path: Path,
) -> None:
    """Review 26, finding 1: the other version's entries were cached across a close; once the
    released task's directory was deleted (by hand, a restore from backup), the task's next
    checkpoint on this process wrote v1's ``ca`` entry into the fresh directory, and a
    rolled-back v1 claimed warm state whose store files were gone."""
    v1_state(tmp_path)
    state = StateDirectory(tmp_path)
    stores = TaskStores(V3, "rocksdb", state, Standbys())

    async def hold(records: int) -> None:
        states = stores.open(T01)
        cb: StoreState = states["cb"]
        for offset in range(cb.position, cb.position + records):
            cb.restore(offset, b"k", b"v")
            cb.restore(offset + 1, COMMIT_KEY, encode_marker({}))
            stores.checkpoint(T01, states, durable=False)
        await stores.close(T01, states)

    async def run() -> None:
        await hold(3)
        assert TopicPartition(CA, 1) in state.read_checkpoint(T01)  # kept for a rollback
        shutil.rmtree(state.task_dir(T01))
        await hold(2)  # back on this process, cold
        stores.shutdown()

    try:
        asyncio.run(run())
        assert TopicPartition(CA, 1) not in state.read_checkpoint(T01)
    finally:
        state.close()
    assert T01 not in sums(tmp_path, V1)


def test_a_checkpoint_unreadable_at_the_first_write_loses_no_other_versions_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mend21: one failed read of the checkpoint at a task's first write (too many open files)
    was kept as "no other version's entries" until the task closed, so every later write
    dropped v1's ``ca`` entry and a rollback found 0_1 cold. That write is skipped now (logged
    as a failed checkpoint) and the next one reads the checkpoint again."""
    v1_state(tmp_path)
    state = StateDirectory(tmp_path)
    stores = TaskStores(V3, "rocksdb", state, Standbys())
    read = state.read_checkpoint_or_raise
    failures = [OSError(errno.EMFILE, "Too many open files")]

    def fails_once(task: TaskId) -> dict[TopicPartition, int]:
        if failures:
            raise failures.pop()
        return read(task)

    async def run() -> dict[TopicPartition, int]:
        states = stores.open(T01)  # opened in this thread: the first write reads the file
        monkeypatch.setattr(state, "read_checkpoint_or_raise", fails_once)
        cb: StoreState = states["cb"]
        for offset in range(cb.position, cb.position + 2):
            cb.restore(offset, b"k", b"v")
            cb.restore(offset + 1, COMMIT_KEY, encode_marker({}))
            stores.checkpoint(T01, states, durable=False)
        written = read(T01)
        await stores.close(T01, states)
        stores.shutdown()
        return written

    try:
        written = asyncio.run(run())
    finally:
        state.close()
    assert failures == [] and written[TopicPartition(CA, 1)] == 658
    assert sums(tmp_path, V1)[T01] == 658


async def hold_threaded(stores: TaskStores, records: int, *, after_last_commit: bool) -> None:
    """Run 0_1 as the App does (its stores opened in a thread by ``take``): ``records``
    commits, each checkpointed, and applied writes after the last one when
    ``after_last_commit`` (so the close writes a checkpoint of its own); then close it."""
    states, _ = await stores.take(T01)
    opening = stores.opening.get(T01)
    if opening is not None and opening.task is not None:
        await opening.task
    cb: StoreState = states["cb"]
    for offset in range(cb.position, cb.position + records):
        cb.restore(offset, b"k", b"v")
        cb.restore(offset + 1, COMMIT_KEY, encode_marker({}))
        stores.checkpoint(T01, states, durable=False)
    if after_last_commit:
        cb.restore(cb.position, b"k", b"v")
        cb.restore(cb.position + 1, COMMIT_KEY, encode_marker({}))
    await stores.close(T01, states)


def test_a_close_that_checkpoints_keeps_no_other_versions_entry_for_the_next_take(
    tmp_path: Path,
) -> None:
    """Review 31, R1: ``close`` forgot the other version's entries and then its own
    checkpoint write read them again and kept them; the released task's directory deleted
    (by hand), its next checkpoint here wrote v1's ``ca`` into the fresh directory."""
    v1_state(tmp_path)
    state = StateDirectory(tmp_path)
    stores = TaskStores(V3, "rocksdb", state, Standbys())

    async def run() -> None:
        await hold_threaded(stores, 3, after_last_commit=True)
        assert TopicPartition(CA, 1) in state.read_checkpoint(T01)  # kept for a rollback
        shutil.rmtree(state.task_dir(T01))
        await hold_threaded(stores, 2, after_last_commit=False)  # back here, cold
        stores.shutdown()

    try:
        asyncio.run(run())
        assert TopicPartition(CA, 1) not in state.read_checkpoint(T01)
    finally:
        state.close()
    assert T01 not in sums(tmp_path, V1)


@pytest.mark.parametrize("failing_read", [0, 1])  # 0: the take's read; 1: the first write's
def test_a_threaded_take_keeps_other_versions_entries_whichever_read_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing_read: int
) -> None:
    """The App's path (stores opened in a thread): the take reads the checkpoint and the
    first write takes the other version's entries from that read; a failed read at either
    point loses none of them (review 31, R4)."""
    v1_state(tmp_path)
    state = StateDirectory(tmp_path)
    stores = TaskStores(V3, "rocksdb", state, Standbys())
    read = state.read_checkpoint_or_raise
    reads: list[TaskId] = []

    def fails_once(task: TaskId) -> dict[TopicPartition, int]:
        reads.append(task)
        if len(reads) - 1 == failing_read:
            raise OSError(errno.EMFILE, "Too many open files")
        return read(task)

    monkeypatch.setattr(state, "read_checkpoint_or_raise", fails_once)
    try:
        asyncio.run(hold_threaded(stores, 2, after_last_commit=False))
        stores.shutdown()
        assert read(T01)[TopicPartition(CA, 1)] == 658
    finally:
        state.close()
    assert sums(tmp_path, V1)[T01] == 658
