"""A stop while the runtime waits for its first assignment ends the start, on a real broker.

Another member of the group holds the rebalance the App's consumer asks for: it joined first,
and its rebalance callback does not return, so the broker keeps the App's JoinGroup waiting
until that member's rebalance timeout (a minute). ``stop()`` (a SIGTERM handler's) must end
``start()`` and ``run()`` well before that, also when one of the App's consumers already had
its first assignment.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from streamassign import Subtopology, Topology
from streamassign.aiokafka import ProcessHost, TaskListener, closing
from streamassign.aiokafka.rejoin import current_assignment
from streamassign.aiokafka.streams import PROTOCOL_NAME
from streamassign.runtime import App

#: Seconds the other member may hold a rebalance (its rebalance timeout): far past the test.
HOLD_MS = 60_000
#: Seconds from ``stop()`` to ``run()``'s return allowed: the consumer's stop waits for the
#: held JoinGroup and is cut at ``CLOSE_TIMEOUT`` (lowered here), then the rest of the stop.
STOP_DEADLINE = 15.0


class Everything(AbstractPartitionAssignor):  # type: ignore[misc]
    """The holding member's assignor: the runtime's protocol name (a group needs one common
    protocol), every partition to the first member."""

    name = PROTOCOL_NAME
    version = 0

    @classmethod
    def assign(
        cls, cluster: Any, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        first, *others = sorted(members)
        topics = sorted({t for m in members.values() for t in m.subscription})
        every = [(t, sorted(cluster.partitions_for_topic(t) or ())) for t in topics]
        out = {first: ConsumerProtocolMemberAssignment(cls.version, every, b"")}
        out.update({m: ConsumerProtocolMemberAssignment(cls.version, [], b"") for m in others})
        return out

    @classmethod
    def metadata(cls, topics: Sequence[str]) -> ConsumerProtocolMemberMetadata:
        return ConsumerProtocolMemberMetadata(cls.version, sorted(topics), b"")

    @classmethod
    def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None: ...


class Holding(ConsumerRebalanceListener):  # type: ignore[misc]
    """Once assigned, returns from a revocation only once ``release`` is set: the group's
    next rebalance waits meanwhile (aiokafka calls it before the first join too)."""

    def __init__(self) -> None:
        self.assigned = asyncio.Event()
        self.release = asyncio.Event()

    async def on_partitions_revoked(self, revoked: object) -> None:
        if self.assigned.is_set():
            await self.release.wait()

    async def on_partitions_assigned(self, assigned: object) -> None:
        self.assigned.set()


class Nothing:
    async def process(self, ctx: object, record: object) -> None: ...


async def group_state(bootstrap: str, group: str) -> str:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        [response] = await admin.describe_consumer_groups([group])
        return str(response.groups[0][2])
    finally:
        await admin.close()


async def until_state(bootstrap: str, group: str, state: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while (now := await group_state(bootstrap, group)) != state:
        assert time.monotonic() < deadline, f"group {group} still {now}, not {state}"
        await asyncio.sleep(0.1)


async def until(condition: Callable[[], bool], seconds: float) -> None:
    async with asyncio.timeout(seconds):
        while not condition():
            await asyncio.sleep(0.01)


def test_stop_ends_a_start_whose_join_the_group_holds(
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    kafka_group_id_factory: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(closing, "CLOSE_TIMEOUT", 2.0)
    source = kafka_topic_factory(2)
    group = kafka_group_id_factory("startstop")
    app = App(
        Topology([Subtopology(0, [source])], name=group),
        {0: Nothing},
        bootstrap_servers=kafka_bootstrap,
        state_dir=tmp_path,
        store_kind="memory",
    )

    async def scenario() -> None:
        holder = AIOKafkaConsumer(
            bootstrap_servers=kafka_bootstrap,
            group_id=group,
            partition_assignment_strategy=(Everything,),
            max_poll_interval_ms=HOLD_MS,  # its rebalance timeout
            enable_auto_commit=False,
        )
        await holder.start()
        holding = Holding()
        holder.subscribe([source], listener=holding)
        try:
            await asyncio.wait_for(holding.assigned.wait(), 30)
            running = asyncio.ensure_future(app.run())
            # The App's JoinGroup is what starts the rebalance the holder holds.
            await until_state(kafka_bootstrap, group, "PreparingRebalance")
            await until(lambda: app.host._first_assignments is not None, 30)
            assert not running.done() and app.host.rebalances == 0
            handler = asyncio.ensure_future(app.stop())  # a SIGTERM handler's
            await asyncio.wait_for(running, STOP_DEADLINE)  # returns: no error raised
            await asyncio.wait_for(handler, 1)
            # Still held: the start ended by the stop, not by an assignment.
            assert await group_state(kafka_bootstrap, group) == "PreparingRebalance"
            assert app.host.rebalances == 0, "the App's consumer was never assigned"
            clients = app._clients
            assert app.host.consumers == [] and app.failure is None
            assert clients.producer is not None and clients.producer._closed
            for reader in (clients.restorer, clients.changelog_reader):
                assert reader is not None and reader._closed
        finally:
            holding.release.set()
            await holder.stop()

    asyncio.run(scenario())


class HoldingOnceArmed(TaskListener):
    """A process host's listener whose consumer, once ``armed``, returns from the start of a
    rebalance only once ``release`` is set: the group's rebalance waits meanwhile."""

    def __init__(self) -> None:
        self.armed = False
        self.release = asyncio.Event()

    async def on_rebalance_started(self, consumer: int) -> None:
        if self.armed:
            await self.release.wait()


def test_stop_ends_a_start_with_one_consumer_assigned_and_the_other_held(
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    kafka_group_id_factory: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An App with 2 consumers: the first joins and has its first assignment, then the
    second's join is held by another process of the group (its rebalance callback does not
    return; the first consumer's rejoin waits with it). ``stop()`` ends the start, and
    ``run()`` returns without error, every consumer closed."""
    monkeypatch.setattr(closing, "CLOSE_TIMEOUT", 2.0)
    source = kafka_topic_factory(2)
    group = kafka_group_id_factory("startstop-partial")
    topology = Topology([Subtopology(0, [source])], name=group)
    app = App(
        topology,
        {0: Nothing},
        bootstrap_servers=kafka_bootstrap,
        state_dir=tmp_path / "app",
        store_kind="memory",
        threads=2,
    )
    holding = HoldingOnceArmed()
    other = ProcessHost(
        topology,
        bootstrap_servers=kafka_bootstrap,
        state_dir=tmp_path / "other",
        listener=holding,
        consumer_config={"max_poll_interval_ms": HOLD_MS},  # its rebalance timeout
    )
    second_may_join = asyncio.Event()
    joins: list[asyncio.Future[None]] = []
    subscribe = AIOKafkaConsumer.subscribe

    def second_joins_later(consumer: AIOKafkaConsumer, *args: Any, **kwargs: Any) -> None:
        if consumer not in app.host.consumers[1:]:
            subscribe(consumer, *args, **kwargs)
            return

        async def later() -> None:
            await second_may_join.wait()
            subscribe(consumer, *args, **kwargs)

        joins.append(asyncio.ensure_future(later()))

    monkeypatch.setattr(AIOKafkaConsumer, "subscribe", second_joins_later)

    async def scenario() -> None:
        await asyncio.wait_for(other.start(), 30)
        try:
            running = asyncio.ensure_future(app.run())
            await until(lambda: len(app.host.consumers) == 2, 30)
            first, second = app.host.consumers
            await until(lambda: current_assignment(first) is not None, 30)
            holding.armed = True
            second_may_join.set()  # its JoinGroup starts the rebalance the other holds
            await until_state(kafka_bootstrap, group, "PreparingRebalance")
            assert current_assignment(second) is None and not running.done()
            handler = asyncio.ensure_future(app.stop())  # a SIGTERM handler's
            await asyncio.wait_for(running, STOP_DEADLINE)  # returns: no error raised
            await asyncio.wait_for(handler, 1)
            assert await group_state(kafka_bootstrap, group) == "PreparingRebalance"
            assert app.failure is None and app.host.consumers == []
            assert first._closed and second._closed
        finally:
            holding.release.set()
            await other.stop()

    with caplog.at_level(logging.INFO, logger="streamassign.runtime"):
        asyncio.run(scenario())
    assert "the start was stopped (stop() was called while starting)" in caplog.text
