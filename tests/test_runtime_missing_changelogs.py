"""Missing changelogs without a broker: which changelogs local checkpoints hold data of (a
start refuses to recreate those), the running check's refusals and its explanations, and a
restore that finds a store past its changelog's end: tests/test_runtime_restore.py. On the broker:
tests/integration/test_runtime_topics.py."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError, NodeNotReadyError

from streamassign import Subtopology, TaskId, TopicPartition, Topology
from streamassign.errors import (
    InternalTopicError,
    MissingChangelogError,
)
from streamassign.localstate import StateDirectory
from streamassign.runtime import _topics, commits, processing
from streamassign.runtime._topics import (
    ChangelogCheck,
    _describe,
    _refuse_lost_changelogs,
    changelogs_with_state,
    ensure_internal_topics,
)
from streamassign.runtime.restore import explain_failure
from tests.test_runtime_producer_failures import noticing, unretrieved_failures

CHANGELOG = "app-totals-changelog"
TOPOLOGY = Topology([Subtopology(0, ["events"], stores=["totals"])], name="app")


def partitions(count: int, leader: int = 1) -> list[dict[str, int]]:
    return [{"partition": p, "leader": leader} for p in range(count)]


def test_only_checkpoints_past_offset_0_count_as_state(tmp_path: Path) -> None:
    state = StateDirectory(tmp_path)
    try:
        state.write_checkpoint(TaskId(0, 1), {TopicPartition(CHANGELOG, 1): 5})
        state.write_checkpoint(TaskId(0, 2), {TopicPartition(CHANGELOG, 2): 0})
        state.write_checkpoint(TaskId(1, 0), {TopicPartition("app-other-changelog", 0): 0})
        assert changelogs_with_state(state) == {CHANGELOG: [TaskId(0, 1)]}

        _refuse_lost_changelogs(state, {"app-other-changelog"})  # nothing held: created
        _refuse_lost_changelogs(state, set())
        with pytest.raises(MissingChangelogError) as refused:
            _refuse_lost_changelogs(state, {CHANGELOG, "app-other-changelog"})
        message = str(refused.value)
        assert f"{CHANGELOG}: tasks 0_1" in message and "other" not in message
        assert str(tmp_path) in message and "restore the topic" in message
        assert isinstance(refused.value, InternalTopicError)
    finally:
        state.close()


class FakeCheck(ChangelogCheck):
    """Describes from ``found`` (or raises ``failure``) instead of asking a broker."""

    def __init__(self, found: dict[str, list[Any]], failure: Exception | None = None) -> None:
        super().__init__(TOPOLOGY, "unused:1")
        self.found, self.failure, self.asked = found, failure, 0

    async def _describe(self, topics: list[str]) -> dict[str, list[Any]]:
        self.asked += 1
        if self.failure is not None:
            raise self.failure
        return {t: ps for t, ps in self.found.items() if t in topics}


def test_partitions_added_to_the_source_are_refused_with_both_counts() -> None:
    check = FakeCheck({"events": partitions(8), CHANGELOG: partitions(6)})
    tps = [TopicPartition(CHANGELOG, 6), TopicPartition(CHANGELOG, 7)]
    with pytest.raises(MissingChangelogError) as refused:
        asyncio.run(check.explain(tps))
    message = str(refused.value)
    assert f"{CHANGELOG}[6], {CHANGELOG}[7] do not exist" in message
    assert f"{CHANGELOG} has 6 partitions, its tasks need 8" in message
    assert (
        "events 8 partitions" in message
        and "kafka-topics.sh --bootstrap-server B --alter" in message
    )
    assert "practically a state reset" in message


def test_a_deleted_changelog_is_refused() -> None:
    check = FakeCheck({"events": partitions(6)})
    with pytest.raises(MissingChangelogError, match=f"{CHANGELOG} deleted while the app"):
        asyncio.run(check.refuse_missing([TopicPartition(CHANGELOG, 0)]))


def test_explanations_when_the_partitions_exist_or_the_cluster_does_not_answer() -> None:
    tp = TopicPartition(CHANGELOG, 3)
    check = FakeCheck({"events": partitions(6), CHANGELOG: partitions(6)})
    assert "exist and have leaders" in asyncio.run(check.explain([tp]))
    assert asyncio.run(check.explain([tp])) == ""  # asked again within CHECK_INTERVAL: not
    assert check.asked == 1
    leaderless = FakeCheck({"events": partitions(6), CHANGELOG: partitions(6, leader=-1)})
    assert asyncio.run(leaderless.explain([tp])) == f"no leader for {CHANGELOG}[3]"
    away = FakeCheck({}, OSError("connection refused"))
    assert "brokers unreachable" in asyncio.run(away.explain([tp]))

    line = asyncio.run(explain_failure(None, [tp, tp], TimeoutError()))
    assert line == f"changelog ends of {CHANGELOG}[3] unknown (not listed within 5 s)"
    line = asyncio.run(explain_failure(FakeCheck({}, OSError("x")), [tp], TimeoutError()))
    assert line.startswith(f"changelog ends of {CHANGELOG}[3] unknown (not listed within 5 s; ")


def test_a_commit_waiting_on_writes_asks_whether_its_changelogs_exist(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(commits, "ACKS_CHECK_AFTER", 0.01)
    task = SimpleNamespace(
        stores={"totals": SimpleNamespace(changelog=TopicPartition(CHANGELOG, 2))}
    )

    async def commit(check: FakeCheck, acked: bool) -> int:
        owner = SimpleNamespace(lookups=SimpleNamespace(check=check))
        acks: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if acked:
            asyncio.get_running_loop().call_later(0.05, acks.set_result, 7)
        return await commits.Commits.checked(owner, acks, [task])  # type: ignore[arg-type]

    present = FakeCheck({"events": partitions(6), CHANGELOG: partitions(6)})
    assert asyncio.run(commit(present, acked=True)) == 7  # slow, but the changelog exists
    assert present.asked == 1
    away = FakeCheck({}, OSError("connection refused"))
    assert asyncio.run(commit(away, acked=True)) == 7  # not known: the commit waits on
    deleted = FakeCheck({"events": partitions(6)})
    with pytest.raises(MissingChangelogError, match=f"{CHANGELOG} deleted"):
        asyncio.run(commit(deleted, acked=False))


def test_describing_topics_never_asks_the_broker_to_create_them() -> None:
    """A broker with auto.create.topics.enable=true (Kafka's default) creates a missing topic
    a metadata request asks about unless the request says not to; a topic without a leader
    yet (error 5) exists."""
    sent: list[Any] = []
    topics = [
        {"topic": "ready", "error_code": 0, "partitions": partitions(2)},
        {"topic": "electing", "error_code": 5, "partitions": partitions(2, leader=-1)},
        {"topic": "gone", "error_code": 3, "partitions": []},
    ]

    async def send(request: Any) -> Any:
        sent.append(request)
        return SimpleNamespace(to_object=lambda: {"topics": topics})

    found, denied = asyncio.run(_describe(SimpleNamespace(_send_request=send), ["ready", "gone"]))
    assert found == {"ready": partitions(2), "electing": partitions(2, leader=-1)}
    assert denied == []
    (request,) = sent  # the no-create wrapper of streamassign.aiokafka.metadata
    asked = request.request
    assert asked._allow_auto_topic_creation is False and asked._topics == ["ready", "gone"]


class JustUnfencedAdmin:
    """An admin client on a broker just unfenced: its metadata lists the broker, but the first
    request finds no connection ready (aiokafka's admin sends without waiting for one)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.asked = 0

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def _send_request(self, request: Any) -> Any:
        self.asked += 1
        if self.asked == 1:
            raise NodeNotReadyError("Attempt to send a request to node which is not ready")
        described = [
            {"topic": t, "error_code": 0, "partitions": partitions(6)}
            for t in request.request._topics
        ]
        return SimpleNamespace(to_object=lambda: {"topics": described})


def test_the_start_topic_check_waits_for_a_broker_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``App.start()`` just after a broker was unfenced failed with ``NodeNotReadyError``
    (the topic check's first metadata request found no connection ready). It is asked
    again within the check's deadline (``_READY_TIMEOUT``), and the start goes on."""
    monkeypatch.setattr(_topics, "AIOKafkaAdminClient", JustUnfencedAdmin)
    counts = asyncio.run(ensure_internal_topics(TOPOLOGY, "x:1"))
    assert counts == {CHANGELOG: 6}


def test_the_start_topic_check_gives_up_on_no_broker_connection_at_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Never a connection ready: the error is raised as it is once the deadline passed."""

    class NeverReady(JustUnfencedAdmin):
        async def _send_request(self, request: Any) -> Any:
            raise NodeNotReadyError("Attempt to send a request to node which is not ready")

    monkeypatch.setattr(_topics, "AIOKafkaAdminClient", NeverReady)
    monkeypatch.setattr(_topics, "_READY_TIMEOUT", 0.3)
    with pytest.raises(NodeNotReadyError):
        asyncio.run(asyncio.wait_for(ensure_internal_topics(TOPOLOGY, "x:1"), 10))


class SlowCheck(FakeCheck):
    """A describe that takes ``delay`` s (a slow or unreachable cluster)."""

    def __init__(self, delay: float) -> None:
        super().__init__({"events": partitions(6)})  # the changelog deleted
        self.delay = delay

    async def _describe(self, topics: list[str]) -> dict[str, list[Any]]:
        await asyncio.sleep(self.delay)
        return await super()._describe(topics)


def test_acks_arriving_while_the_check_runs_end_the_wait_and_a_cancel_cancels_the_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before, the commit waited for the check to end (acks at 5.2 s, commit at 13.0 s), and
    a cancelled caller left the step running (a commit going on after its stop)."""
    monkeypatch.setattr(commits, "ACKS_CHECK_AFTER", 0.01)
    task = SimpleNamespace(
        stores={"totals": SimpleNamespace(changelog=TopicPartition(CHANGELOG, 2))}
    )
    owner = SimpleNamespace(lookups=SimpleNamespace(check=SlowCheck(delay=30.0)))

    async def acked() -> float:
        loop = asyncio.get_running_loop()
        acks: asyncio.Future[int] = loop.create_future()
        loop.call_later(0.1, acks.set_result, 7)
        started = loop.time()
        assert await commits.Commits.checked(owner, acks, [task]) == 7  # type: ignore[arg-type]
        return loop.time() - started

    assert asyncio.run(acked()) < 5.0

    async def cancelled() -> bool:
        loop = asyncio.get_running_loop()
        acks: asyncio.Future[int] = loop.create_future()
        owner.lookups.check = SlowCheck(delay=30.0)
        caller = asyncio.ensure_future(commits.Commits.checked(owner, acks, [task]))  # type: ignore[arg-type]
        await asyncio.sleep(0.1)
        caller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await caller
        return acks.cancelled()

    assert asyncio.run(cancelled())


def test_the_send_path_check_is_throttled_and_knows_partitions_in_constant_time() -> None:
    """Before, every send to a changelog the metadata lacked asked again (up to 10 + 10 s
    and a new admin client each, in an outage), and the per-record lookup built a set."""
    leaders = {TopicPartition(CHANGELOG, 0): 1, TopicPartition(CHANGELOG, 1): -1}
    refreshes: list[str] = []

    async def add_topic(topic: str) -> None:
        refreshes.append(topic)

    async def force_metadata_update() -> None:
        refreshes.append("all")

    cluster = SimpleNamespace(leader_for_partition=lambda tp: leaders.get(TopicPartition(*tp)))
    client = SimpleNamespace(
        cluster=cluster, add_topic=add_topic, force_metadata_update=force_metadata_update
    )
    producer = SimpleNamespace(client=client)
    assert processing._known(producer, TopicPartition(CHANGELOG, 1))  # type: ignore[arg-type]
    assert not processing._known(producer, TopicPartition(CHANGELOG, 2))  # type: ignore[arg-type]

    away = FakeCheck({}, OSError("connection refused"))

    async def sends() -> None:
        for _ in range(3):
            await processing.Processing._check_changelog(
                None,  # type: ignore[arg-type]
                producer,  # type: ignore[arg-type]
                away,
                TopicPartition(CHANGELOG, 2),
            )

    asyncio.run(sends())
    assert away.asked == 1 and refreshes == [CHANGELOG, "all"]


def test_the_writes_a_missing_changelog_leaves_unawaited_are_not_printed_when_they_fail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``MissingChangelogError`` leaves the commit's wait for acks to end by itself: the
    writes to the deleted changelog then fail (after ``request_timeout_ms``), awaited by
    nobody; asyncio would print "Future exception was never retrieved" with its trace."""
    monkeypatch.setattr(commits, "ACKS_CHECK_AFTER", 0.01)
    task = SimpleNamespace(
        stores={"totals": SimpleNamespace(changelog=TopicPartition(CHANGELOG, 2))}
    )
    printed: list[str] = []

    async def run() -> None:
        noticing(printed)
        owner = SimpleNamespace(lookups=SimpleNamespace(check=FakeCheck({"events": partitions(6)})))
        acks: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        with pytest.raises(MissingChangelogError):
            await commits.Commits.checked(owner, acks, [task])  # type: ignore[arg-type]
        acks.set_exception(KafkaTimeoutError())
        await asyncio.sleep(0)  # its callbacks run
        del acks
        gc.collect()

    asyncio.run(run())
    gc.collect()
    assert unretrieved_failures() == []
    assert printed == []


@pytest.mark.parametrize("how", ["with-the-acks", "as-it-is-cancelled"])
def test_a_changelog_check_dropped_by_the_acks_race_is_not_printed_when_it_fails(
    how: str,
) -> None:
    """The acks arrive first: nobody awaits the check any more, which may still fail (its
    answer came in the same loop turn as the acks, or its client turned the cancel into
    its own error)."""
    printed: list[str] = []

    async def run() -> None:
        noticing(printed)
        loop = asyncio.get_running_loop()
        acks: asyncio.Future[int] = loop.create_future()
        answer: asyncio.Future[None] = loop.create_future()

        async def ask(reply: asyncio.Future[None]) -> None:
            try:
                await reply
            except asyncio.CancelledError:
                raise KafkaConnectionError("closed while waiting") from None

        racing = asyncio.ensure_future(commits._race(acks, ask(answer)))
        await asyncio.sleep(0)  # both wait
        acks.set_result(7)
        if how == "with-the-acks":
            answer.set_exception(NodeNotReadyError("the describe found no connection"))
        await racing  # the acks won: nothing raised
        for _ in range(3):
            await asyncio.sleep(0)  # the check ends
        del racing, answer
        gc.collect()

    asyncio.run(run())
    gc.collect()
    assert unretrieved_failures() == []
    assert printed == []
