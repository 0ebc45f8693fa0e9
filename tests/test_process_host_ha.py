"""ProcessHost with the high-availability assignor, without a broker: the leader's settings
reach ``assign_streams`` and the probing rebalance is scheduled once, replaced by newer times."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from streamassign import Subtopology, TaskId, Topology
from streamassign.aiokafka import ProcessHost
from streamassign.errors import ErrorCode
from streamassign.protocol import LATEST_OFFSET, NEVER, NOW, AssignmentInfo, SubscriptionInfo
from streamassign.streams import MemberAssignment, MemberSubscription

from . import test_streams_probing_memory as swap

TOPOLOGY = Topology([Subtopology(0, ["in"], stores=["s"])], name="app")
TASKS = [TaskId(0, p) for p in range(4)]


def ha_host(tmp_path: Path, topology: Topology = TOPOLOGY, **kw: Any) -> ProcessHost:
    return ProcessHost(
        topology,
        bootstrap_servers="127.0.0.1:1",
        state_dir=tmp_path,
        **{"high_availability": True, "probing_rebalance_interval_ms": 60_000, **kw},
    )


def test_the_leader_holds_actives_back_and_sets_the_probing_time(tmp_path: Path) -> None:
    host = ha_host(tmp_path, end_offsets=lambda: dict.fromkeys(TASKS, 1000))
    running = SubscriptionInfo(uuid.UUID(int=1), offset_sums=dict.fromkeys(TASKS, LATEST_OFFSET))
    members = {
        "old": ConsumerProtocolMemberMetadata(0, ["in"], running.encode()),
        "new": ConsumerProtocolMemberMetadata(
            0, ["in"], SubscriptionInfo(uuid.UUID(int=2)).encode()
        ),
    }
    cluster = SimpleNamespace(partitions_for_topic=lambda topic: set(range(4)))
    before = int(time.time() * 1000)
    out = host.assignors[0].assign(cluster, members)
    infos = {
        m: AssignmentInfo.decode(ConsumerProtocolMemberAssignment.decode(b).user_data)
        for m, b in out.items()
    }
    assert infos["old"].active == set(TASKS)
    assert len(infos["new"].warmup) == 2 and not infos["new"].active
    for info in infos.values():
        assert before + 60_000 <= info.next_rebalance_ms <= time.time() * 1000 + 60_000


def test_a_failing_end_offsets_lookup_leaves_lags_unknown_instead_of_failing_the_group(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> dict[TaskId, int]:
        raise ConnectionError("broker down")

    host = ha_host(tmp_path, end_offsets=broken)
    warm = dict.fromkeys(TASKS[:2], 10)  # a warmup 10 records in: lag unknown, not caught up
    members = {
        "old": ConsumerProtocolMemberMetadata(
            0,
            ["in"],
            SubscriptionInfo(
                uuid.UUID(int=1), offset_sums=dict.fromkeys(TASKS, LATEST_OFFSET)
            ).encode(),
        ),
        "new": ConsumerProtocolMemberMetadata(
            0, ["in"], SubscriptionInfo(uuid.UUID(int=2), offset_sums=warm).encode()
        ),
    }
    cluster = SimpleNamespace(partitions_for_topic=lambda topic: set(range(4)))
    out = host.assignors[0].assign(cluster, members)
    infos = {
        m: AssignmentInfo.decode(ConsumerProtocolMemberAssignment.decode(b).user_data)
        for m, b in out.items()
    }
    assert {i.error_code for i in infos.values()} == {0}
    assert infos["old"].active == set(TASKS) and not infos["new"].active
    assert set(warm) <= infos["new"].warmup
    assert "end_offsets failed" in caplog.text


def test_bad_settings_fail_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_warmup_replicas must be an int >= 1"):
        ha_host(tmp_path, max_warmup_replicas=0)


class Consumer:
    """What Rejoiner reaches: the coordinator's request_rejoin, recording when it was asked."""

    def __init__(self) -> None:
        self.rejoins: list[float] = []
        self._coordinator = SimpleNamespace(
            request_rejoin=lambda: self.rejoins.append(time.monotonic())
        )


def bound(tmp_path: Path, interval_ms: int = 1000) -> tuple[Any, Consumer, Any]:
    """(host, consumer, deliver): deliver(next_rebalance_ms, error) hands consumer 0 an
    assignment. A 1 s probing interval makes the minimum probe delay 0.1 s."""
    host = ha_host(tmp_path, probing_rebalance_interval_ms=interval_ms)
    consumer = Consumer()
    assignor = host.assignors[0]
    assignor.rejoiner.bind(consumer)

    def deliver(next_rebalance_ms: int, error: ErrorCode = ErrorCode.NONE) -> None:
        info = AssignmentInfo(next_rebalance_ms=next_rebalance_ms, error_code=error)
        assignor.on_assignment(ConsumerProtocolMemberAssignment(0, [], info.encode()))

    return host, consumer, deliver


def test_a_newer_assignment_replaces_the_scheduled_probe(tmp_path: Path) -> None:
    _, consumer, deliver = bound(tmp_path)
    rejoins = consumer.rejoins

    async def scenario() -> None:
        now = int(time.time() * 1000)
        deliver(now + 100)
        deliver(now + 250)  # a rebalance in between set a later probe: only that one fires
        await asyncio.sleep(0.5)
        deliver(now + 600)
        deliver(NEVER)  # balanced now: the pending probe is dropped
        await asyncio.sleep(0.3)

    started = time.monotonic()
    asyncio.run(scenario())
    assert len(rejoins) == 1
    assert rejoins[0] - started >= 0.2


def test_stopping_the_host_drops_a_pending_probe(tmp_path: Path) -> None:
    host = ha_host(tmp_path)
    assignor = host.assignors[0]

    async def scenario() -> bool:
        info = AssignmentInfo(next_rebalance_ms=int(time.time() * 1000) + 60_000)
        assignor.on_assignment(ConsumerProtocolMemberAssignment(0, [], info.encode()))
        probe = assignor._probe
        await host.stop()
        return probe is not None and probe.cancelled() and assignor._probe is None

    assert asyncio.run(scenario())


def test_a_probe_time_already_passed_by_this_clock_waits_a_tenth_of_the_interval(
    tmp_path: Path,
) -> None:
    """The leader's clock is behind this member's: the time it sends has passed here. The
    member still waits (no rebalance right after every assignment)."""
    _, consumer, deliver = bound(tmp_path, interval_ms=5_000)  # waits 0.5 s at least

    async def scenario() -> tuple[list[float], list[float]]:
        started = time.monotonic()
        deliver(int(time.time() * 1000) - 60_000)
        await asyncio.sleep(0.2)
        early = list(consumer.rejoins)
        await asyncio.sleep(1.0)
        return early, [t - started for t in consumer.rejoins]

    early, later = asyncio.run(scenario())
    assert early == [] and len(later) == 1 and later[0] >= 0.49


def test_an_error_drops_the_probe_and_stop_drops_the_retry(tmp_path: Path) -> None:
    host, consumer, deliver = bound(tmp_path)
    assignor = host.assignors[0]

    async def scenario() -> list[float]:
        deliver(int(time.time() * 1000) + 200)
        probe = assignor._probe
        deliver(NEVER, ErrorCode.ASSIGNMENT_ERROR)  # retry in 1 s instead of probing
        assert probe is not None and probe.cancelled() and assignor._probe is None
        retries = list(assignor.rejoiner._pending)
        await host.stop()
        assert len(retries) == 1 and retries[0].cancelled()
        await asyncio.sleep(0.4)
        return consumer.rejoins

    assert asyncio.run(scenario()) == []


def test_a_good_assignment_drops_the_retry_an_error_scheduled(tmp_path: Path) -> None:
    """An error schedules a rejoin with backoff; a good assignment arriving first (another
    member's rebalance) makes it moot, as in the Faust assignor."""
    host, consumer, deliver = bound(tmp_path)
    rejoiner = host.assignors[0].rejoiner

    async def scenario() -> None:
        deliver(NEVER, ErrorCode.ASSIGNMENT_ERROR)  # retry in 1 s
        retries = list(rejoiner._pending)
        deliver(NEVER)
        assert len(retries) == 1 and retries[0].cancelled()
        assert not rejoiner._pending

    asyncio.run(scenario())
    assert consumer.rejoins == []


def test_a_shutdown_requested_during_a_join_is_sent_with_the_next_one(tmp_path: Path) -> None:
    """aiokafka drops a rejoin request made between JoinGroup and SyncGroup: the subscription
    already sent did not carry the shutdown request, so the member rejoins once more (and only
    once: a leader that ignores the request starts no rebalance loop)."""
    host, consumer, deliver = bound(tmp_path)
    assignor = host.assignors[0]

    def sent() -> ErrorCode:
        return SubscriptionInfo.decode(assignor.metadata(["in"]).user_data).error_code

    assert sent() == ErrorCode.NONE  # the join under way
    asyncio.run(host.request_shutdown())
    consumer.rejoins.clear()  # what aiokafka discards at SyncGroup
    deliver(NEVER)  # the leader did not see the request
    assert len(consumer.rejoins) == 1
    assert sent() == ErrorCode.SHUTDOWN_REQUESTED  # the rejoin carries it
    deliver(NEVER)  # a leader that ignores it
    assert len(consumer.rejoins) == 1
    deliver(NEVER, ErrorCode.SHUTDOWN_REQUESTED)
    assert host.shutdown_requested and len(consumer.rejoins) == 1


def test_without_an_event_loop_a_probe_that_cannot_be_scheduled_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    deliver = bound(tmp_path)[2]
    deliver(int(time.time() * 1000) + 60_000)
    assert "probing rebalance cannot be scheduled" in caplog.text


def test_the_join_nonce_changes_only_when_this_consumer_wants_a_rebalance(tmp_path: Path) -> None:
    """A follower rejoining with unchanged metadata gets its generation back without a
    rebalance; aiokafka rejoins so on its own (e.g. after a commit answered
    RebalanceInProgress), and a nonce changed on every join turned each of those into a
    rebalance of the whole group. It changes when this consumer asks for one: a probe, a
    leader's NOW, a failed assignment, a version upgrade, ``request_rejoin``, shutdown."""
    host, consumer, deliver = bound(tmp_path)
    assignor = host.assignors[0]

    def nonce() -> int:
        return SubscriptionInfo.decode(assignor.metadata(["in"]).user_data).join_nonce

    async def scenario() -> list[int]:
        seen = [nonce(), nonce()]  # aiokafka's own rejoins: nothing changes
        deliver(int(time.time() * 1000) + 150)  # a probe ...
        seen.append(nonce())  # ... scheduled, not due: still unchanged
        await asyncio.sleep(0.4)
        seen.append(nonce())  # due: changed when it fired
        deliver(NOW)
        seen.append(nonce())
        deliver(NEVER, ErrorCode.ASSIGNMENT_ERROR)
        seen.append(nonce())
        host.request_rejoin(0)
        seen.append(nonce())
        await host.request_shutdown()
        seen.append(nonce())
        await host.stop()
        return seen

    seen = asyncio.run(scenario())
    assert seen[0] == seen[1] == seen[2]
    assert all(later > earlier for earlier, later in itertools.pairwise(seen[2:]))
    assert len(consumer.rejoins) >= 4  # probe, NOW, request_rejoin, shutdown


def leads(
    host: ProcessHost, consumer: int, members: dict[str, MemberSubscription]
) -> dict[str, MemberAssignment]:
    """``host``'s consumer ``consumer`` leads a rebalance of ``members`` (the role-swap
    counterexample's topology): what each member is sent."""
    metadata = {
        m: ConsumerProtocolMemberMetadata(0, sorted(s.topics), s.info.encode())
        for m, s in members.items()
        if s.info is not None
    }
    cluster = SimpleNamespace(partitions_for_topic=lambda topic: set(range(swap.COUNTS[topic])))
    out = host.assignors[consumer].assign(cluster, metadata)
    return {
        m: MemberAssignment(
            (), AssignmentInfo.decode(ConsumerProtocolMemberAssignment.decode(b).user_data)
        )
        for m, b in out.items()
    }


def swap_host(path: Path) -> ProcessHost:
    """A high-availability host of two consumers for the role-swap counterexample."""
    return ha_host(
        path,
        swap.TOPOLOGY,
        threads=2,
        num_standby_replicas=1,
        max_warmup_replicas=1,
        end_offsets=lambda: swap.END,
    )


def test_the_probing_memory_is_the_processs_whichever_consumer_leads(tmp_path: Path) -> None:
    """Consumer 0 leads round 0 of the role-swap counterexample, consumer 1 leads the probing
    round: the host's memory offers round 0's target and the group converges in 1 round. A
    leader of another process (no memory of round 0) plans afresh and probes once more."""
    leader = swap_host(tmp_path / "leader")
    first = leads(leader, 0, swap.first_members())
    assert swap.probing(first) and leader.probing_memory.last is not None
    members = swap.next_members(first, swap.first_members())
    assert not swap.probing(leads(leader, 1, members))
    other = swap_host(tmp_path / "other")
    assert swap.probing(leads(other, 0, members))


def test_an_assignment_another_process_led_makes_the_memory_forget(tmp_path: Path) -> None:
    """Review finding: another leader's round that moves no active (only standbys) left the
    memory looking current to the members' actives, so a stale target could be offered when
    this process led again. An assignment of a generation this process did not lead now
    empties it; one of the generation it led (to any of its consumers) keeps it."""
    host = swap_host(tmp_path)
    coordinators = [
        SimpleNamespace(member_id=f"m{i}", generation=5, request_rejoin=lambda: None)
        for i in range(2)
    ]
    host.consumers = [SimpleNamespace(_coordinator=c) for c in coordinators]  # type: ignore[misc]
    leads(host, 0, swap.first_members())
    assert host.led_generation == 5 and host.probing_memory.last is not None
    nothing = ConsumerProtocolMemberAssignment(0, [], AssignmentInfo().encode())
    host.assignors[1].on_assignment(nothing)  # generation 5, led by consumer 0
    assert host.probing_memory.last is not None
    for coordinator in coordinators:
        coordinator.generation = 6  # another process led generation 6
    host.assignors[1].on_assignment(nothing)
    assert host.probing_memory.last is None
