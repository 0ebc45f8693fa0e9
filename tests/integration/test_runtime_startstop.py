"""A stop while the runtime waits for its first assignment ends the start, on a real broker.

Another member of the group holds the rebalance the App's consumer asks for: it joined first,
and its rebalance callback does not return, so the broker keeps the App's JoinGroup waiting
until that member's rebalance timeout (a minute). ``stop()`` (a SIGTERM handler's) must end
``start()`` and ``run()`` well before that.
"""

from __future__ import annotations

import asyncio
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
from streamassign.aiokafka import closing
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
