"""Changelog key lookups under a deadline (``ChangelogLookups.keys_written``) and what a
commit does when they time out, without a broker (the in-memory log of
``test_runtime_membership`` stands in for the producer and the restore consumer)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError

from streamassign import TaskId, TopicPartition
from streamassign.errors import (
    ChangelogReadTimeoutError,
    OutputWriteError,
    ReassertionFailedError,
    StreamAssignError,
)
from streamassign.runtime import App
from streamassign.runtime import commits as commits_module
from streamassign.runtime.tasks import ActiveTask

from .test_runtime_membership import CHANGELOG, Log, make, start
from .test_runtime_processing import Rec


class WaitingLog(Log):
    """A fetch waits for records as aiokafka's does (up to ``timeout_ms``; shortened)."""

    async def getmany(self, *tps: Any, timeout_ms: int = 0, max_records: int | None = None) -> Any:
        await asyncio.sleep(0.01)
        return await super().getmany(*tps, timeout_ms=timeout_ms, max_records=max_records)


def test_keys_are_read_within_the_deadline_or_a_typed_error_says_which(
    tmp_path: Path,
) -> None:
    app, _, _, _ = make(tmp_path)
    log = WaitingLog()
    app._clients.restorer = log  # type: ignore[assignment]
    lookups = app._commits.lookups
    tp = TopicPartition(*CHANGELOG)
    log.records[CHANGELOG].extend([(b"a", b"1"), (b"b", b"2"), (b"a", b"3")])

    async def run() -> None:
        assert sorted(await lookups.keys_written(tp, 1, 3, timeout=5)) == [b"a", b"b"]
        assert log.assigned == []  # nothing is fetched in between
        with pytest.raises(ChangelogReadTimeoutError, match=r"\[0\]: offsets 1 to 9 not read"):
            await lookups.keys_written(tp, 1, 9, timeout=0.05)  # the log never gets there
        assert log.assigned == [] and not lookups.lock.locked()
        assert sorted(await lookups.keys_written(tp, 0, 2, timeout=5)) == [b"a", b"b"]

    asyncio.run(run())
    assert issubclass(ChangelogReadTimeoutError, StreamAssignError)
    assert issubclass(ChangelogReadTimeoutError, TimeoutError)


class SlowReads:
    """Wraps ``keys_written``: the first ``failures`` calls time out (after ``delay`` s)."""

    def __init__(self, real: Any, failures: int, delay: float = 0.0) -> None:
        self.real, self.failures, self.calls, self.delay = real, failures, 0, delay
        self.partitions: list[int] = []  # of each call

    async def __call__(self, tp: TopicPartition, first: int, end: int) -> list[bytes]:
        self.calls += 1
        self.partitions.append(tp.partition)
        await asyncio.sleep(self.delay)
        if self.calls <= self.failures:
            raise ChangelogReadTimeoutError(f"{tp.topic}[{tp.partition}]: slow")
        result: list[bytes] = await self.real(tp, first, end)
        return result


def strike_after_the_check(log: Log) -> None:
    def strike() -> None:  # another writer, between the owner's check and its marker
        log.records[CHANGELOG].append((b"k", b"99"))
        log.after_ends = None

    log.after_ends = strike


def read_slowly(app: App, failures: int, delay: float = 0.0) -> SlowReads:
    """The app's changelog key lookups, the first ``failures`` timing out."""
    slow = SlowReads(app._commits.lookups.keys_written, failures, delay)
    app._commits.lookups.keys_written = slow  # type: ignore[method-assign]
    return slow


async def struck(app: App, log: Log) -> ActiveTask:
    """Task 0_0 started with a pending value of ``k``, which another writer will strike
    between the owner's check and its marker."""
    task = await start(app)
    await app._processing.process(task, Rec(0, b"k", b"5"))
    strike_after_the_check(log)
    return task


async def struck_and_committed(app: App, log: Log) -> ActiveTask:
    task = await struck(app, log)
    await app._commits.commit(0)
    return task


def test_a_slow_changelog_is_read_again_and_the_owners_values_still_follow(
    tmp_path: Path,
) -> None:
    """Giving up at the first timeout would tear the task and restore the other writer's
    value of ``k`` (closed by the owner's marker): an update lost. It reads again instead."""
    app, log, _, rejoins = make(tmp_path)
    slow = read_slowly(app, failures=2)

    task = asyncio.run(struck_and_committed(app, log))
    assert slow.calls == 3 and not task.torn and rejoins == []
    assert log.replay() == {b"k": b"5", b"k-copy": b"5"}
    assert dict(task.stores["totals"].store.items()) == log.replay()


def test_a_changelog_unreadable_past_the_patience_tears_the_task_and_rejoins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commits_module, "REASSERT_PATIENCE", 0.0)
    app, log, committer, rejoins = make(tmp_path)
    slow = read_slowly(app, failures=10**6)

    task = asyncio.run(struck_and_committed(app, log))
    assert slow.calls == 1  # bounded: no endless loop
    assert task.torn and rejoins == [0]
    assert committer.commits == []  # its input is read again after the restore
    # Its pending value was written again after the other writer's, so the restore
    # applies the owner's update, not the one its first marker closed.
    assert log.replay() == {b"k": b"5", b"k-copy": b"5"}


def test_a_failed_rewrite_after_giving_up_stops_the_application(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tearing the task then would let the restore apply the other writer's value of ``k``
    (closed by the owner's marker): a typed error stops the application instead."""
    monkeypatch.setattr(commits_module, "REASSERT_PATIENCE", 0.0)
    app, log, _, _ = make(tmp_path)
    read_slowly(app, failures=10**6)
    real_send = log.send

    async def refusing_after_the_marker(*args: Any, **kwargs: Any) -> Any:
        if log.markers() >= 1:  # the commit's marker is written: the broker goes away
            raise KafkaConnectionError("gone")
        return await real_send(*args, **kwargs)

    async def run() -> None:
        await struck(app, log)
        log.send = refusing_after_the_marker  # type: ignore[method-assign]
        await app._commits.commit_safely(0)

    with pytest.raises(ReassertionFailedError, match=r"pending value\(s\) could not be written"):
        asyncio.run(run())
    assert issubclass(ReassertionFailedError, OutputWriteError)


def test_one_patience_per_commit_shared_by_every_reassertion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two tasks whose changelogs another writer struck, reads timing out: the first
    reassertion uses up the commit's patience, the second tries once (before, each had its
    own, so the commit, holding the consumer's lock, took twice as long)."""
    monkeypatch.setattr(commits_module, "REASSERT_PATIENCE", 0.3)
    app, log, _, _ = make(tmp_path)
    slow = read_slowly(app, failures=10**6, delay=0.1)
    tasks = [TaskId(0, 0), TaskId(0, 1)]

    async def run() -> None:
        await app._start_tasks(0, [(t, app._stores.open(t), "cold") for t in tasks])
        await app._updater.settle()
        for task_id in tasks:
            await app._processing.process(app._actives[task_id], Rec(task_id.partition, b"k", b"5"))

        def strike() -> None:
            for task_id in tasks:
                log.records[("app-totals-changelog", task_id.partition)].append((b"k", b"99"))
            log.after_ends = None

        log.after_ends = strike
        await app._commits.commit(0)

    asyncio.run(run())
    assert slow.partitions.count(0) >= 1 and slow.partitions.count(1) == 1
    assert all(app._actives[t].torn for t in tasks)


def test_a_rebalancing_consumer_reads_the_keys_once(tmp_path: Path) -> None:
    """Inside ``on_rebalance_started`` the whole group waits for this commit: one try."""
    app, log, _, rejoins = make(tmp_path)
    slow = read_slowly(app, failures=10**6)

    async def run() -> ActiveTask:
        task = await struck(app, log)
        await app._rebalance_started(0)
        assert rejoins == [0]
        return task

    task = asyncio.run(run())
    assert slow.calls == 1 and task.torn
    assert log.replay() == {b"k": b"5", b"k-copy": b"5"}


def test_a_member_that_lost_its_membership_writes_nothing_again(tmp_path: Path) -> None:
    """Out of the group while the keys could not be read: the other writer is the task's new
    owner, so the zombie's pending values are not written after its records."""
    app, log, _, _ = make(tmp_path)
    slow = read_slowly(app, failures=10**6)
    app.host.member_lost = lambda index: slow.calls > 0  # type: ignore[method-assign]

    task = asyncio.run(struck_and_committed(app, log))
    assert slow.calls == 1 and task.torn
    assert log.replay()[b"k"] == b"99"  # the new owner's value, nothing written after it
    assert log.markers() == 1  # the commit's own, no second one
