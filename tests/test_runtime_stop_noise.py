"""A stop with its broker gone says what it left, once, and nothing else: no asyncio
"exception was never retrieved" for a wait it cut, no fetch task left running by a
release."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from types import SimpleNamespace

import pytest

from streamassign import TopicPartition
from streamassign.runtime import commits
from tests.test_runtime_producer_failures import noticing, unretrieved_failures


class NeverAnswers:
    """A changelog check that is due and never answers (the broker gone)."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()

    def due(self) -> bool:
        return True

    async def refuse_missing(self, changelogs: object) -> None:
        self.asked.set()
        await asyncio.Event().wait()


def test_a_commit_cut_while_it_waits_for_acks_leaves_no_unretrieved_gather(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Exactly once, a loop cut at the stop's grace cancels each task's wait for the acks of
    its writes, a ``gather`` of them: a cancelled gather ends with CancelledError as its
    failure, which nobody awaited any more. asyncio printed one "_GatheringFuture exception
    was never retrieved" per task (6 lines for 6 tasks) at the cut."""
    monkeypatch.setattr(commits, "ACKS_CHECK_AFTER", 0.01)
    task = SimpleNamespace(stores={"totals": SimpleNamespace(changelog=TopicPartition("c", 2))})
    printed: list[str] = []

    async def cut() -> None:
        noticing(printed)
        check = NeverAnswers()
        owner = SimpleNamespace(lookups=SimpleNamespace(check=check))
        loop = asyncio.get_running_loop()
        writes: list[asyncio.Future[int]] = [loop.create_future() for _ in range(3)]
        waiting = asyncio.ensure_future(
            commits.Commits.checked(owner, asyncio.gather(*writes), [task])  # type: ignore[arg-type]
        )
        await check.asked.wait()  # past ACKS_CHECK_AFTER: the acks race the check
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        assert all(w.cancelled() for w in writes)  # the cut cancels the writes' wait
        for _ in range(3):
            await asyncio.sleep(0)  # the gather's callbacks run
        del waiting
        gc.collect()

    asyncio.run(cut())
    gc.collect()
    assert unretrieved_failures() == []
    assert printed == []
