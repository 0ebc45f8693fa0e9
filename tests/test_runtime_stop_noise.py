"""A stop with its broker gone says what it left, once, and nothing else: no asyncio
"exception was never retrieved" for a wait it cut, no fetch task left running by a
release."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from types import SimpleNamespace

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.consumer.fetcher import Fetcher
from aiokafka.consumer.subscription_state import SubscriptionState
from aiokafka.errors import KafkaConnectionError
from aiokafka.structs import TopicPartition as KafkaPartition

from streamassign import TopicPartition
from streamassign.aiokafka import closing
from streamassign.runtime import commits
from tests.test_runtime_producer_failures import noticing, unretrieved_failures

LOG = logging.getLogger("t")


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


class BrokerGone:
    """aiokafka's client with its broker gone: every request fails at once."""

    _loop: asyncio.AbstractEventLoop
    _metadata_max_age_ms = 300_000

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.closed = False

    async def send(self, node_id: int, request: object) -> None:
        raise KafkaConnectionError(f"connection to node {node_id} refused")

    async def close(self) -> None:
        self.closed = True


async def fetcher_in_backoff(brokers: int) -> tuple[Fetcher, list[asyncio.Task[bool]]]:
    """aiokafka's fetcher with one fetch request per broker, each failed and in its retry
    backoff (60 s here), as its fetch routine starts them. The routine itself is ended, as
    the consumer's stop does first (it would cancel fetches of no assignment)."""
    fetcher = Fetcher(BrokerGone(), SubscriptionState(), retry_backoff_ms=60_000)
    fetcher._fetch_task.cancel()
    await asyncio.wait([fetcher._fetch_task])
    request = SimpleNamespace(topics=[])
    fetches = [
        asyncio.ensure_future(fetcher._proc_fetch_request(None, node, request))
        for node in range(brokers)
    ]
    fetcher._pending_tasks.update(fetches)
    for _ in range(3):
        await asyncio.sleep(0)  # each one's request fails: in backoff
    assert not any(fetch.done() for fetch in fetches)
    return fetcher, fetches


class Stopped:
    """aiokafka's group coordinator, its tasks already stopped."""

    async def _stop_heartbeat_task(self) -> None:
        pass

    async def _stop_commit_offsets_refresh_task(self) -> None:
        pass


class ThreeBrokers:
    """aiokafka's client while the broker goes away: the first three fetch requests (one per
    broker) hang, every later one is refused at once."""

    _metadata_max_age_ms = 300_000

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.cluster = SimpleNamespace(
            leader_for_partition=lambda partition: partition.partition,  # partition p on node p
            broker_metadata=lambda node: object(),
        )
        self.requests = 0
        self.closed = False

    async def send(self, node_id: int, request: object) -> None:
        self.requests += 1
        if self.requests <= 3:
            await asyncio.Event().wait()
        raise KafkaConnectionError(f"connection to node {node_id} refused")

    def force_metadata_update(self) -> asyncio.Future[None]:
        return self._loop.create_future()

    async def close(self) -> None:
        self.closed = True


def test_a_release_ends_the_fetch_routine_before_it_starts_new_fetches(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stop cut while it closed the coordinator leaves aiokafka's fetch routine alive:
    cancelling only the fetches it had started, the release let it start a new one per
    broker (refused, in backoff: still running after the release, and a warning)."""

    async def release() -> tuple[int, int]:
        subscriptions = SubscriptionState()
        subscriptions.subscribe({"t"})
        partitions = {KafkaPartition("t", p) for p in range(3)}
        subscriptions.assign_from_subscribed(partitions)
        for partition in partitions:
            subscriptions.seek(partition, 0)
        client = ThreeBrokers()
        fetcher = Fetcher(client, subscriptions, retry_backoff_ms=60_000)
        while client.requests < 3:  # (bounded by the wait_for below)
            await asyncio.sleep(0)
        consumer = SimpleNamespace(_coordinator=Stopped(), _fetcher=fetcher, _client=client)
        await closing.release_consumer("consumer 0", consumer, LOG)
        running = [
            task
            for task in asyncio.all_tasks()
            if "_proc_fetch_request" in repr(task.get_coro()) and not task.done()
        ]
        return client.requests, len(running)

    with caplog.at_level(logging.WARNING, "t"):
        assert asyncio.run(asyncio.wait_for(release(), 10.0)) == (3, 0)
    assert "could not" not in caplog.text


def test_a_release_after_a_cut_stop_ends_every_fetch_with_several_brokers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """aiokafka's fetcher close cancels and awaits its fetches one at a time; the first in
    its retry backoff raises the cancel back, so the close stopped there, and the release
    that closes the fetcher again stopped at the same one: with 3 brokers, 2 fetches ran on
    after the release (each retrying, one "Failed fetch messages" line each)."""

    async def release() -> list[bool]:
        fetcher, fetches = await fetcher_in_backoff(3)
        consumer = SimpleNamespace(_coordinator=Stopped(), _fetcher=fetcher, _client=BrokerGone())
        with contextlib.suppress(asyncio.CancelledError):
            await fetcher.close()  # the consumer's own stop, the broker gone
        await closing.release_consumer("consumer 0", consumer, LOG)
        assert consumer._client.closed
        return [fetch.done() for fetch in fetches]  # (asyncio.run would cancel them after)

    with caplog.at_level(logging.WARNING, "t"):
        assert asyncio.run(asyncio.wait_for(release(), 10.0)) == [True, True, True]
    assert "could not close its fetcher" not in caplog.text
    assert "could not end its fetches" not in caplog.text


class Fails:
    """A part of aiokafka's consumer whose close fails (its coordination task ended with an
    error, say)."""

    async def close(self) -> None:
        raise RuntimeError("the coordination task failed")

    async def _stop_heartbeat_task(self) -> None:
        pass

    async def _stop_commit_offsets_refresh_task(self) -> None:
        pass


class Closes:
    def __init__(self, closed: list[str], name: str) -> None:
        self.closed, self.name = closed, name

    async def close(self) -> None:
        self.closed.append(self.name)


def test_a_client_stop_that_fails_is_released_as_a_cut_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """aiokafka's consumer marks itself closed, then closes its coordinator, its fetcher and
    its connections: the coordinator failing skipped the other two, and a second stop does
    nothing. ``stop_within`` counted such a stop as done (True), so nobody closed them: the
    fetches and connections ran on. Now it is a cut stop, and the release closes them."""
    closed: list[str] = []

    async def stop() -> bool:
        consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1")
        consumer._coordinator = Fails()
        consumer._fetcher = Closes(closed, "fetcher")
        consumer._client = Closes(closed, "client")
        stopped = await closing.stop_within("consumer 0", consumer, "left", LOG)
        assert closed == []  # aiokafka's own stop ended at its coordinator
        if not stopped:
            await closing.release_consumer("consumer 0", consumer, LOG)
        return stopped

    with caplog.at_level(logging.WARNING, "t"):
        assert asyncio.run(stop()) is False
    assert closed == ["fetcher", "client"]
    assert (
        "consumer 0 did not stop cleanly (RuntimeError('the coordination task failed')): left"
        in caplog.text
    )


class LateRoutine:
    """aiokafka's fetcher whose fetch routine swallows its cancel and runs on until
    ``let_go`` (the assignment-lost branch awaits before it looks again), with 3 fetches
    pending; ``close`` is recorded."""

    def __init__(self, closed: list[str]) -> None:
        self.let_go = asyncio.Event()
        self.closed = closed
        self._fetch_task = asyncio.ensure_future(self._routine())
        self.fetches = [asyncio.ensure_future(asyncio.Event().wait()) for _ in range(3)]
        self._pending_tasks = set(self.fetches)

    async def _routine(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await self.let_go.wait()

    async def close(self) -> None:
        self.closed.append("fetcher")


def test_a_fetch_routine_outliving_its_wait_still_has_every_fetch_cancelled(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fetch routine does not end within its wait: every pending fetch is still
    cancelled and dropped (else each ran on after the release, retrying), the step's error
    names the routine, and the release warns of it once and goes on with its next steps."""
    monkeypatch.setattr(closing, "RELEASE_STEP_TIMEOUT", 0.04)  # each wait: 10 ms
    closed: list[str] = []

    async def release() -> None:
        fetcher = LateRoutine(closed)
        await asyncio.sleep(0)  # the routine and fetches are waiting
        with pytest.raises(TimeoutError, match=r"^1 fetch routine did not end$"):
            await closing._end_fetches(fetcher)
        assert all(fetch.cancelled() for fetch in fetcher.fetches)
        assert fetcher._pending_tasks == set()
        late = LateRoutine(closed)
        await asyncio.sleep(0)
        consumer = SimpleNamespace(
            _coordinator=Stopped(), _fetcher=late, _client=Closes(closed, "client")
        )
        await closing.release_consumer("consumer 0", consumer, LOG)
        assert all(fetch.cancelled() for fetch in late.fetches)
        assert late._pending_tasks == set()
        for ended in (fetcher, late):
            ended.let_go.set()
            await asyncio.wait([ended._fetch_task])

    with caplog.at_level(logging.WARNING, "t"):
        asyncio.run(asyncio.wait_for(release(), 5.0))
    assert closed == ["fetcher", "client"]
    assert [r.getMessage() for r in caplog.records if r.name == "t"] == [
        "consumer 0: could not end its fetches after its stop was cut "
        "(TimeoutError('1 fetch routine did not end'))"
    ]
