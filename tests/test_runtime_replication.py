"""The runtime through a broker restart, without a broker: internal topics are created with
the broker's default replication factor unless one is given (with one replica, measured on a
3-broker cluster, one broker's restart left the changelogs without leaders and stopped every
process), and a commit that fails on a passing broker error (no leader, a write expired)
tears the consumer's tasks and retries after a backoff and a rejoin instead of stopping the
application. Measured on a 3-broker cluster: docs/runtime.md, "Replication"."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import (
    KafkaTimeoutError,
    LeaderNotAvailableError,
    MessageSizeTooLargeError,
    NotEnoughReplicasError,
    UnknownError,
)

from streamassign import Subtopology, Topology
from streamassign.errors import InternalTopicError, OutputWriteError, RuntimeConfigError
from streamassign.runtime import App, _topics
from streamassign.runtime import commits as commits_module
from streamassign.runtime._topics import ensure_internal_topics
from streamassign.runtime.tasks import ActiveTask

from .test_runtime_membership import TASK, Log, make, start
from .test_runtime_processing import Adder, Committer, Rec

TOPOLOGY = Topology([Subtopology(0, ["r6"], stores=["totals"])], name="rt")
CHANGELOG = "rt-totals-changelog"


class CreatingAdmin:
    """An admin client that knows the source topic ``r6`` (4 partitions) and records the
    CreateTopics entries it is sent (as aiokafka encodes them), answering ``create_code``."""

    def __init__(self, create_code: int = 0) -> None:
        self.topics = {"r6": 4}
        self.create_code = create_code
        self.sent: list[tuple[Any, ...]] = []

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def _send_request(self, request: Any) -> Any:
        described = [
            {"topic": t, "error_code": 0, "partitions": partitions(self.topics[t])}
            if t in self.topics
            else {"topic": t, "error_code": 3, "partitions": []}
            for t in request.request._topics
        ]
        return SimpleNamespace(to_object=lambda: {"topics": described})

    async def create_topics(self, new: list[Any]) -> Any:
        self.sent += [AIOKafkaAdminClient._convert_new_topic_request(t) for t in new]
        if not self.create_code:
            self.topics.update({t.name: t.num_partitions for t in new})
        errors = [(t.name, self.create_code, "refused") for t in new]
        return SimpleNamespace(topic_errors=errors)


def partitions(count: int) -> list[dict[str, int]]:
    return [{"partition": p, "leader": 1} for p in range(count)]


def use_admin(monkeypatch: pytest.MonkeyPatch, admin: CreatingAdmin) -> CreatingAdmin:
    monkeypatch.setattr(_topics, "AIOKafkaAdminClient", lambda **kw: admin)
    monkeypatch.setattr(_topics, "_READY_TIMEOUT", 0.5)
    return admin


def test_internal_topics_take_the_broker_s_default_replication_unless_given(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The App's default is -1, sent as such with no replica assignment (before: 1, a
    single replica whatever the cluster); an explicit factor is sent as it is."""
    app = App(TOPOLOGY, {0: Adder}, bootstrap_servers="x:1", state_dir=tmp_path)
    assert app.replication_factor == -1
    admin = use_admin(monkeypatch, CreatingAdmin())
    asyncio.run(ensure_internal_topics(TOPOLOGY, "x:1", replication_factor=app.replication_factor))
    assert admin.sent == [(CHANGELOG, 4, -1, [], [("cleanup.policy", "compact")])]
    admin = use_admin(monkeypatch, CreatingAdmin())
    asyncio.run(ensure_internal_topics(TOPOLOGY, "x:1", replication_factor=3))
    assert admin.sent == [(CHANGELOG, 4, 3, [], [("cleanup.policy", "compact")])]


@pytest.mark.parametrize("factor", [0, -2, "3", 2.0, True])
def test_a_replication_factor_that_means_nothing_is_refused(tmp_path: Path, factor: object) -> None:
    with pytest.raises(RuntimeConfigError, match="expected 1 or more, or -1"):
        App(
            TOPOLOGY,
            {0: Adder},
            bootstrap_servers="x:1",
            state_dir=tmp_path,
            **{"replication_factor": factor},
        )


def test_the_create_hint_says_the_broker_s_default_for_minus_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The topic to create beforehand when CREATE is refused: never "replication factor -1"."""
    use_admin(monkeypatch, CreatingAdmin(create_code=29))
    with pytest.raises(InternalTopicError) as refused:
        asyncio.run(ensure_internal_topics(TOPOLOGY, "x:1"))
    assert str(refused.value).endswith(
        "create it beforehand: 4 partition(s), the broker's default replication factor, "
        "cleanup.policy=compact"
    )


def test_a_broker_refusing_minus_one_is_told_to_set_the_factor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broker before Kafka 2.4 answers INVALID_REPLICATION_FACTOR (38) to -1."""
    use_admin(monkeypatch, CreatingAdmin(create_code=38))
    with pytest.raises(InternalTopicError, match=r"needs Kafka 2\.4 or later: set the App's"):
        asyncio.run(ensure_internal_topics(TOPOLOGY, "x:1"))
    use_admin(monkeypatch, CreatingAdmin(create_code=38))
    with pytest.raises(InternalTopicError) as refused:
        asyncio.run(ensure_internal_topics(TOPOLOGY, "x:1", replication_factor=5))
    assert "Kafka 2.4" not in str(refused.value)


def failed_write(error: Exception) -> asyncio.Future[Any]:
    failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    failed.set_exception(error)
    return failed


async def process_and_fail(app: App, task: ActiveTask, offset: int, error: Exception) -> None:
    await app._processing.process(task, Rec(offset, b"k", b"5"))
    task.futures.append(failed_write(error))


@pytest.mark.parametrize("error", [LeaderNotAvailableError, KafkaTimeoutError])
def test_a_commit_failing_on_a_leader_away_tears_rejoins_and_goes_on(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    error: type[Exception],
) -> None:
    """A write expired without a leader (LeaderNotAvailableError from aiokafka's
    accumulator, as with one replica and its broker away): nothing is committed, the task is
    torn (restored after the rejoin), and the loop goes on: one WARNING for failures in a
    row, an INFO when a commit succeeds again."""
    monkeypatch.setattr(commits_module, "RETRY_BACKOFF", 0.001)
    app, log, committer, rejoins = make(tmp_path)
    caplog.set_level(logging.INFO, "streamassign.runtime")

    async def run() -> ActiveTask:
        task = await start(app)
        await process_and_fail(app, task, 0, error())
        await app._commits.commit_or_retry(0)
        assert task.torn and rejoins == [0]
        await start(app)  # the rejoin restores it
        task = app._actives[TASK]
        await process_and_fail(app, task, 0, error())
        await app._commits.commit_or_retry(0)
        task = await start(app)
        await app._processing.process(task, Rec(0, b"k", b"5"))
        await app._commits.commit_or_retry(0)
        return task

    task = asyncio.run(run())
    assert rejoins == [0, 0] and not task.torn
    assert committer.commits == [{KafkaTopicPartition("events", 0): 1}]
    # Adder's sums, as if the failed attempts never ran (their writes are undone).
    assert log.replay() == {b"k": b"5", b"k-copy": b"5"}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage()[:36] for r in warnings] == [
        "consumer 0: commit failed (" + error.__name__[:9]
    ]
    assert "restored and their input re-read after a rejoin" in warnings[0].getMessage()
    assert any(
        "committing again, after 2 failed commit(s)" in r.getMessage() for r in caplog.records
    )


@pytest.mark.parametrize(
    ("error", "raised"),
    [(MessageSizeTooLargeError, OutputWriteError), (UnknownError, UnknownError)],
)
def test_a_commit_failing_otherwise_still_stops(
    tmp_path: Path, error: type[Exception], raised: type[Exception]
) -> None:
    """A refusal a retry meets again stops the application as before (``OutputWriteError``),
    as does an error not known to pass."""
    app, log, committer, rejoins = make(tmp_path)

    async def run() -> None:
        task = await start(app)
        await process_and_fail(app, task, 0, error())
        await app._commits.commit_or_retry(0)

    with pytest.raises(raised):
        asyncio.run(run())
    assert rejoins == [] and committer.commits == [] and log.markers() == 0


class LoopConsumer(Committer):
    """The consumer loop's consumer: one record of ``events``, then nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.batches = [{KafkaTopicPartition("events", 0): [Rec(0, b"k", b"5")]}]

    async def getmany(self, *partitions: object, timeout_ms: int = 0) -> dict[Any, Any]:
        await asyncio.sleep(0.001)
        return self.batches.pop(0) if self.batches else {}

    def assignment(self) -> set[KafkaTopicPartition]:
        return {KafkaTopicPartition("events", 0)}

    def paused(self) -> set[KafkaTopicPartition]:
        return set()

    def pause(self, *tps: KafkaTopicPartition) -> None: ...

    def resume(self, *tps: KafkaTopicPartition) -> None: ...


class LeaderAway(Log):
    """A producer whose changelog partition has no leader: every write expires."""

    async def send(self, *args: Any, **kw: Any) -> asyncio.Future[Any]:
        return failed_write(LeaderNotAvailableError())


def test_the_consumer_loop_survives_a_commit_failing_on_a_leader_away(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop goes on, rather than end and stop the application ("consumer 0 failed;
    stopping the application" with ``LeaderNotAvailableError`` from ``_acks``)."""
    monkeypatch.setattr(commits_module, "RETRY_BACKOFF", 0.001, raising=False)
    app, _, _, rejoins = make(tmp_path)
    consumer = LoopConsumer()
    app.host.consumers[0] = consumer  # type: ignore[call-overload]
    app.commit_interval = 0.0

    async def run() -> None:
        await start(app)
        app._clients.producer = LeaderAway()  # type: ignore[assignment]
        loop = asyncio.create_task(app._fail_on_error(app._consume(0), "consumer 0"))
        async with asyncio.timeout(5):
            while not rejoins:
                await asyncio.sleep(0.01)
        assert not loop.done()
        app._stopped.set()
        await asyncio.wait_for(loop, 5)

    asyncio.run(run())
    assert app.failure is None and app._actives[TASK].torn and consumer.commits == []


def test_a_commit_while_the_torn_task_restores_is_no_success(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """It commits nothing of the torn task: no "committing again" INFO, and the failures
    in a row go on counting (their backoff doubling) until the task is back and commits."""
    monkeypatch.setattr(commits_module, "RETRY_BACKOFF", 0.001)
    app, _, _, _ = make(tmp_path)
    caplog.set_level(logging.INFO, "streamassign.runtime")

    async def run() -> None:
        task = await start(app)
        await process_and_fail(app, task, 0, LeaderNotAvailableError())
        await app._commits.commit_or_retry(0)
        assert task.torn
        await app._commits.commit_or_retry(0)  # nothing to commit: the task is torn

    asyncio.run(run())
    assert "committing again" not in caplog.text
    assert app._commits.failing[0][0] == 1


def test_commits_failing_past_the_limit_stop_the_application(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error that does not pass (too few in-sync replicas for good) would have the loop
    tear, rejoin and replay its input without end: past ``RETRY_LIMIT`` it stops."""
    from streamassign.errors import CommitRetriesExhaustedError

    monkeypatch.setattr(commits_module, "RETRY_BACKOFF", 0.001)
    monkeypatch.setattr(commits_module, "RETRY_LIMIT", 0.0)
    app, _, _, _ = make(tmp_path)

    async def run() -> None:
        task = await start(app)
        await process_and_fail(app, task, 0, NotEnoughReplicasError())
        await app._commits.commit_or_retry(0)  # the first failure starts the count
        task = await start(app)
        await process_and_fail(app, task, 0, NotEnoughReplicasError())
        await app._commits.commit_or_retry(0)

    with pytest.raises(CommitRetriesExhaustedError, match=r"commits failed for .* in a row"):
        asyncio.run(run())
