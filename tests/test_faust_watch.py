"""``streamassign.faust._watch``: re-fetching metadata of topics a worker cannot size yet, and
taking the join errors aiokafka keeps for Faust."""

from __future__ import annotations

import asyncio
import itertools
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
from faust.types import TP

from streamassign.errors import ErrorCode
from streamassign.faust import PartitionAssignor
from streamassign.faust._watch import JoinErrors, MetadataWatch
from streamassign.protocol import AssignmentInfo

from .test_faust_assignor import CL, COUNTS, GLOBAL_CL, SRC, Cluster, make_app


class FakeClient:
    """What the watch uses of aiokafka's client: its cluster metadata and a forced refresh."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts
        self.cluster = Cluster(counts)
        self.tracked: set[str] = set()
        self.refreshes = 0

    def add_topic(self, topic: str) -> None:
        self.tracked.add(topic)

    def force_metadata_update(self) -> None:
        self.refreshes += 1


class FakeConsumer:
    """An aiokafka consumer as the assignor reaches it: its client and coordinator."""

    def __init__(self, client: FakeClient) -> None:
        self._client = client
        self._coordinator = SimpleNamespace(request_rejoin=lambda: None)


async def until(condition: object, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.005)


def test_a_missing_topic_is_fetched_again_until_it_exists() -> None:
    async def scenario() -> None:
        client = FakeClient({SRC: 6})
        watch = MetadataWatch(first=0.01, longest=0.02)
        watch.watch(FakeConsumer(client), {CL})
        assert client.tracked == {CL} and client.refreshes == 1  # at once
        await until(lambda: client.refreshes >= 4)  # and again while it is missing
        client.counts[CL] = 6
        await until(lambda: not watch.topics)
        done = client.refreshes
        await asyncio.sleep(0.05)
        assert client.refreshes == done  # stops once the client knows it

    asyncio.run(scenario())


def test_nothing_to_watch_and_no_client_are_no_error() -> None:
    async def scenario() -> None:
        watch = MetadataWatch(first=0.01)
        watch.watch(SimpleNamespace(), {CL})  # no client: nothing to do
        client = FakeClient({})
        watch.watch(FakeConsumer(client), set())
        await asyncio.sleep(0.03)
        assert client.refreshes == 0

    asyncio.run(scenario())


def test_the_leader_without_a_changelog_assigns_nothing_and_watches_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Leader side: no partitions for anyone until the changelog is sized, the leader re-fetches
    its metadata; member side: it says what it waits for and re-fetches its own."""

    async def scenario() -> None:
        workers = [make_app(tmp_path / f"w{i}", 7000 + i).assignor for i in range(2)]
        assert all(isinstance(a, PartitionAssignor) for a in workers)
        clients = [FakeClient({k: v for k, v in COUNTS.items() if k != CL}) for _ in workers]
        consumers = [FakeConsumer(client) for client in clients]
        for a, consumer in zip(workers, consumers, strict=True):
            a._consumer = lambda consumer=consumer: consumer  # type: ignore[method-assign]
        metadata = {f"m{i}": a.metadata(set(COUNTS)) for i, a in enumerate(workers)}
        out = workers[0].assign(clients[0].cluster, metadata)
        assert clients[0].refreshes == 1  # the leader asks for the changelog's metadata
        for i, a in enumerate(workers):
            got = ConsumerProtocolMemberAssignment.decode(out[f"m{i}"])
            info = AssignmentInfo.decode(got.user_data)
            assert info.error_code == ErrorCode.INCOMPLETE_SOURCE_TOPIC_METADATA
            assert got.assignment == []
            a.on_assignment(got)
            assert a.assigned_actives() == set()
            a.rejoiner.cancel()
        assert clients[1].refreshes == 1 and workers[1].metadata_watch.topics == {CL}
        for client in clients:
            client.counts[CL] = 6
        out = workers[0].assign(clients[0].cluster, metadata)
        for i, a in enumerate(workers):
            a.on_assignment(ConsumerProtocolMemberAssignment.decode(out[f"m{i}"]))
        assert sum(len(a.assigned_actives() & {TP(CL, p) for p in range(6)}) for a in workers) == 6

    with caplog.at_level(logging.WARNING, "streamassign.faust"):
        asyncio.run(scenario())
    assert f"waiting for topics ['{CL}'] to exist" in caplog.text


def test_a_wait_for_topics_is_logged_once_per_missing_set_and_once_when_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Retries come every 1 to 30 s while a topic is missing: the leader and each member log
    a set of missing topics once (repeats at DEBUG), again when the set changes, and one INFO
    line when the topics are there."""

    async def scenario() -> None:
        workers = [make_app(tmp_path / f"w{i}", 7100 + i).assignor for i in range(2)]
        assert all(isinstance(a, PartitionAssignor) for a in workers)
        counts = {SRC: 6}  # both changelogs missing, then one, then none
        client = FakeClient(counts)
        for a in workers:
            a._consumer = lambda: FakeConsumer(client)  # type: ignore[method-assign]
        metadata = {f"m{i}": a.metadata(set(COUNTS)) for i, a in enumerate(workers)}

        def rebalance() -> None:
            out = workers[0].assign(client.cluster, metadata)
            for i, a in enumerate(workers):
                a.on_assignment(ConsumerProtocolMemberAssignment.decode(out[f"m{i}"]))
                a.rejoiner.cancel()

        for _ in range(3):
            rebalance()
        counts[GLOBAL_CL] = 2
        for _ in range(3):
            rebalance()
        counts[CL] = 6
        for _ in range(2):
            rebalance()
        assert workers[1].assigned_actives()
        for a in workers:
            a.metadata_watch.cancel()

    with caplog.at_level(logging.DEBUG, "streamassign.faust"):
        asyncio.run(scenario())
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    leader = [(level, m) for level, m in lines if m.startswith("no metadata for")]
    assert [level for level, _ in leader] == [logging.WARNING] + [logging.DEBUG] * 2 + [
        logging.WARNING
    ] + [logging.DEBUG] * 2
    assert str(sorted([CL, GLOBAL_CL])) in leader[0][1] and str([CL]) in leader[3][1]
    members = [(level, m) for level, m in lines if m.startswith("waiting for topics")]
    assert [level for level, _ in members] == (
        [logging.WARNING] * 2 + [logging.DEBUG] * 4 + [logging.WARNING] * 2 + [logging.DEBUG] * 4
    )
    infos = [m for level, m in lines if level == logging.INFO]
    assert infos.count("every subscribed topic has metadata now") == 1
    assert infos.count("the topics waited for exist: partitions assigned again") == 2


def test_a_leader_logs_a_wait_as_news_after_rounds_another_worker_led(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The leader's logged-once state outlived a leadership change: w0 warned of a missing
    changelog, w1 led the next rounds (the topics came), and when the changelog went missing
    again with w0 leading, w0 logged it at DEBUG only. A round another worker led resets it."""

    async def scenario() -> None:
        workers = [make_app(tmp_path / f"w{i}", 7200 + i).assignor for i in range(2)]
        counts = {SRC: 6, **{k: v for k, v in COUNTS.items() if k != CL}}
        client = FakeClient(counts)
        for a in workers:
            a._consumer = lambda: FakeConsumer(client)  # type: ignore[method-assign]
        metadata = {f"m{i}": a.metadata(set(COUNTS)) for i, a in enumerate(workers)}

        def rebalance(leader: int) -> None:
            out = workers[leader].assign(client.cluster, metadata)
            for i, a in enumerate(workers):
                a.on_assignment(ConsumerProtocolMemberAssignment.decode(out[f"m{i}"]))
                a.rejoiner.cancel()

        rebalance(0)  # w0 leads, CL missing: WARNING
        counts[CL] = 6
        rebalance(1)  # w0 fell out and rejoined: w1 leads now, all there
        del counts[CL]  # a second incident, later
        rebalance(0)  # w0 leads again: news again
        for a in workers:
            a.metadata_watch.cancel()

    with caplog.at_level(logging.DEBUG, "streamassign.faust"):
        asyncio.run(scenario())
    leader = [r.levelno for r in caplog.records if r.getMessage().startswith("no metadata for")]
    assert leader == [logging.WARNING, logging.WARNING]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert "every subscribed topic has metadata now" not in infos  # w1 saw none missing


def test_a_leader_logs_a_wait_as_news_after_a_led_round_whose_sync_failed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """w0 led a round and warned of a missing changelog, but its SyncGroup failed (another
    rebalance began: no assignment arrives, so that round never ended for it); w1 led the next
    round. That round must still reset w0's leader state: when w0 leads into a later incident,
    it warns again (it logged it at DEBUG). Each round starts with a JoinGroup, as in aiokafka:
    every worker's ``metadata``."""

    async def scenario() -> None:
        workers = [make_app(tmp_path / f"w{i}", 7300 + i).assignor for i in range(2)]
        counts = {SRC: 6, **{k: v for k, v in COUNTS.items() if k != CL}}
        client = FakeClient(counts)
        for a in workers:
            a._consumer = lambda: FakeConsumer(client)  # type: ignore[method-assign]

        def rebalance(leader: int, synced: bool = True) -> None:
            metadata = {f"m{i}": a.metadata(set(COUNTS)) for i, a in enumerate(workers)}
            out = workers[leader].assign(client.cluster, metadata)
            if not synced:  # SyncGroup failed (REBALANCE_IN_PROGRESS): no assignment arrives
                return
            for i, a in enumerate(workers):
                a.on_assignment(ConsumerProtocolMemberAssignment.decode(out[f"m{i}"]))
                a.rejoiner.cancel()

        rebalance(0, synced=False)  # w0 leads, CL missing: WARNING; its sync fails
        counts[CL] = 6
        rebalance(1)  # w1 leads the next round, all there
        del counts[CL]  # a second incident, later
        rebalance(0)  # w0 leads again: news again
        for a in workers:
            a.metadata_watch.cancel()

    with caplog.at_level(logging.DEBUG, "streamassign.faust"):
        asyncio.run(scenario())
    leader = [r.levelno for r in caplog.records if r.getMessage().startswith("no metadata for")]
    assert leader == [logging.WARNING, logging.WARNING]


class Coordinator:
    """aiokafka's coordinator as ``JoinErrors`` sees it: an error it keeps for its user."""

    def __init__(self) -> None:
        self.group_id = "orders-app"
        self.kept: Exception | None = None
        self.looked = 0
        self.looked_at: list[float] = []

    def check_errors(self) -> None:
        self.looked += 1
        self.looked_at.append(asyncio.get_running_loop().time())
        kept, self.kept = self.kept, None
        if kept is not None:
            raise kept


def test_a_kept_join_error_is_logged_and_taken_so_the_worker_joins_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from aiokafka.errors import InconsistentGroupProtocolError

    async def scenario() -> None:
        coordinator = Coordinator()
        consumer = SimpleNamespace(_coordinator=coordinator)
        errors = JoinErrors(first=0.01, longest=0.02)
        errors.joining(consumer)
        await until(lambda: coordinator.looked >= 2)  # nothing kept: it looks again
        coordinator.kept = InconsistentGroupProtocolError()
        await until(lambda: coordinator.kept is None)  # taken: aiokafka may join again
        errors.joining(consumer)  # it does: the next attempt
        errors.joined()
        looked = coordinator.looked
        await asyncio.sleep(0.05)
        assert coordinator.looked == looked  # joined: nothing more to look at

    with caplog.at_level(logging.ERROR, "streamassign.faust"):
        asyncio.run(scenario())
    assert "cannot join the group: InconsistentGroupProtocolError" in caplog.text
    assert "streamassign://" in caplog.text


def test_a_group_authorization_failure_before_any_join_is_logged_and_retried_until_joined(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without READ on its group a worker fails at aiokafka's coordinator lookup, before any
    join (so no ``metadata()`` call starts a look again): aiokafka keeps the error and retries
    the lookup only once it is taken. The watch takes it again and again, with doubling pauses
    and one line each naming the group and the ACL, until an assignment arrives."""
    from aiokafka.errors import GroupAuthorizationFailedError

    async def scenario() -> None:
        coordinator = Coordinator()
        errors = JoinErrors(first=0.01, longest=0.04)
        coordinator.kept = GroupAuthorizationFailedError("orders-app")
        errors.joining(SimpleNamespace(_coordinator=coordinator))  # the subscription
        for _ in range(4):  # each failed lookup is kept again; only the watch takes it
            await until(lambda: coordinator.kept is None)
            coordinator.kept = GroupAuthorizationFailedError("orders-app")
        await until(lambda: coordinator.kept is None)
        pauses = [b - a for a, b in itertools.pairwise(coordinator.looked_at)]
        assert pauses[0] > 0.019 and pauses[-1] > 0.039  # doubled, up to the longest
        errors.joined()  # the ACL granted: the lookup and the join succeed
        looked = coordinator.looked
        await asyncio.sleep(0.1)
        assert coordinator.looked == looked

    with caplog.at_level(logging.ERROR, "streamassign.faust"):
        asyncio.run(scenario())
    lines = [r.getMessage() for r in caplog.records if r.name == "streamassign.faust"]
    assert len(lines) == 5
    assert lines[0] == (
        "not authorized to the group 'orders-app' (GroupAuthorizationFailedError): grant the "
        "app's principal READ on the group; trying again"
    )
