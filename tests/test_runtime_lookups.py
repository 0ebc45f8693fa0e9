"""Changelog key lookups under a deadline (``ChangelogLookups.keys_written``) and what a
commit does when they time out, without a broker (the in-memory log of
``test_runtime_membership`` stands in for the producer and the restore consumer)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from streamassign import TopicPartition
from streamassign.errors import ChangelogReadTimeoutError, StreamAssignError
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
        assert await lookups.keys_written(tp, 1, 3, timeout=5) == [b"a", b"b"]
        assert log.assigned == []  # nothing is fetched in between
        with pytest.raises(ChangelogReadTimeoutError, match=r"\[0\]: offsets 1 to 9 not read"):
            await lookups.keys_written(tp, 1, 9, timeout=0.05)  # the log never gets there
        assert log.assigned == [] and not lookups.lock.locked()
        assert await lookups.keys_written(tp, 0, 2, timeout=5) == [b"a", b"b"]

    asyncio.run(run())
    assert issubclass(ChangelogReadTimeoutError, StreamAssignError)
    assert issubclass(ChangelogReadTimeoutError, TimeoutError)


class SlowReads:
    """Wraps ``keys_written``: the first ``failures`` calls time out."""

    def __init__(self, real: Any, failures: int) -> None:
        self.real, self.failures, self.calls = real, failures, 0

    async def __call__(self, tp: TopicPartition, first: int, end: int) -> list[bytes]:
        self.calls += 1
        if self.calls <= self.failures:
            raise ChangelogReadTimeoutError(f"{tp.topic}[{tp.partition}]: slow")
        result: list[bytes] = await self.real(tp, first, end)
        return result


def strike_after_the_check(log: Log) -> None:
    def strike() -> None:  # another writer, between the owner's check and its marker
        log.records[CHANGELOG].append((b"k", b"99"))
        log.after_ends = None

    log.after_ends = strike


def test_a_slow_changelog_is_read_again_and_the_owners_values_still_follow(
    tmp_path: Path,
) -> None:
    """Giving up at the first timeout would tear the task and restore the other writer's
    value of ``k`` (closed by the owner's marker): an update lost. It reads again instead."""
    app, log, _, rejoins = make(tmp_path)
    slow = SlowReads(app._commits.lookups.keys_written, failures=2)
    app._commits.lookups.keys_written = slow  # type: ignore[method-assign]

    async def run() -> ActiveTask:
        task = await start(app)
        await app._processing.process(task, Rec(0, b"k", b"5"))
        strike_after_the_check(log)
        await app._commits.commit(0)
        return task

    task = asyncio.run(run())
    assert slow.calls == 3 and not task.torn and rejoins == []
    assert log.replay() == {b"k": b"5", b"k-copy": b"5"}
    assert dict(task.stores["totals"].store.items()) == log.replay()


def test_a_changelog_unreadable_past_the_patience_tears_the_task_and_rejoins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commits_module, "REASSERT_PATIENCE", 0.0)
    app, log, committer, rejoins = make(tmp_path)
    slow = SlowReads(app._commits.lookups.keys_written, failures=10**6)
    app._commits.lookups.keys_written = slow  # type: ignore[method-assign]

    async def run() -> ActiveTask:
        task = await start(app)
        await app._processing.process(task, Rec(0, b"k", b"5"))
        strike_after_the_check(log)
        await app._commits.commit(0)
        return task

    task = asyncio.run(run())
    assert slow.calls == 1  # bounded: no endless loop
    assert task.torn and rejoins == [0]
    assert committer.commits == []  # its input is read again after the restore
