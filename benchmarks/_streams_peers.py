"""Peers of the streams protocol benchmarks: Faust's group metadata and aiokafka's round robin.

**Faust** (faust-streaming) — one ``faust.App`` per worker, each with the benchmark's topology
(one agent reading the co-partitioned source topics, one table with ``partitions`` partitions,
``table_standby_replicas`` standbys) and its own ``canonical_url``. Rebalances run through the
apps' own ``faust.assignor.PartitionAssignor``, exactly as aiokafka's coordinator drives it:
every worker's ``metadata(topics)`` is encoded for JoinGroup and decoded by the leader, the
leader's ``assign(cluster, members)`` result is encoded for SyncGroup, and every worker's
``on_assignment`` reads its share back (Faust asserts that its partitions match). Only the
placement is ours: Faust's ``CopartitionedAssignor`` is swapped for one handing out the
assignment ours made, so both encode the same assignment; Faust's own code builds everything
else (its per-topic assignments, ``changelog_distribution``, ``external_topic_distribution``,
``topic_groups``). The bytes measured are Faust's: ``ClientMetadata.dumps()`` (JSON) in the
subscription, and the same record, zlib-compressed, in each assignment. Like a Kafka Streams
consumer, a Faust worker subscribes to the source topics and its tables' changelog topics
(which Faust assigns with them, as one co-partitioned group).

**Round robin** — plain ``AIOKafkaConsumer``s with aiokafka's ``RoundRobinPartitionAssignor``:
the same group protocol with no user data, the floor of a rebalance's cost on a broker.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast
from unittest import mock

from _consumer_peers import cluster
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

try:
    import faust
    from faust.assignor import partition_assignor
    from faust.assignor.client_assignment import CopartitionedAssignment
except ImportError as exc:  # pragma: no cover - a setup problem, said plainly
    raise SystemExit(f"{exc}: install the peers first: pip install -e '.[bench]'") from exc


@dataclass(frozen=True)
class WireSizes:
    """Bytes of one rebalance, per member and summed over the group.

    ``join_group`` and ``sync_group`` sum the members' encoded consumer-protocol metadata
    (version, topics, user data) and assignments (version, partitions, user data): what a
    JoinGroup response and a SyncGroup request carry besides member ids.
    """

    subscription: Sequence[int]  # user data bytes, per member
    assignment: Sequence[int]  # user data bytes, per member
    join_group: int
    sync_group: int
    assignment_json: Sequence[int] = ()  # Faust: the assignment JSON before zlib

    @property
    def total(self) -> int:
        """JoinGroup response plus SyncGroup request."""
        return self.join_group + self.sync_group

    @staticmethod
    def of(
        metadata: Collection[bytes],
        assignments: Collection[bytes],
        assignment_json: Sequence[int] = (),
    ) -> WireSizes:
        """Sizes of encoded consumer-protocol metadata and assignments, as on the wire."""
        return WireSizes(
            [len(ConsumerProtocolMemberMetadata.decode(m).user_data) for m in metadata],
            [len(ConsumerProtocolMemberAssignment.decode(a).user_data) for a in assignments],
            sum(map(len, metadata)),
            sum(map(len, assignments)),
            assignment_json,
        )


# -- Faust -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Worker:
    """One Faust worker: its URL and what it is assigned (partitions of the group)."""

    url: str
    active: frozenset[int]
    standby: frozenset[int]


def _faust_app(
    url: str, app_id: str, topics: Sequence[str], partitions: int, replicas: int
) -> faust.App:
    """A Faust worker with an agent over the co-partitioned ``topics`` and one table."""
    app = faust.App(
        app_id,
        broker="kafka://localhost:9092",  # never contacted
        canonical_url=url,
        topic_partitions=partitions,
        table_standby_replicas=replicas,
    )
    app.Table("store", partitions=partitions)

    async def process(stream: faust.StreamT[Any]) -> None:
        async for _ in stream:
            pass

    app.agent(app.topic(*topics), name="process")(process)
    return app


def _planned(workers: Mapping[str, Worker]) -> type:
    """A stand-in for Faust's ``CopartitionedAssignor`` that hands out ``workers``' tasks."""

    class Planned:
        def __init__(self, topics: set[str], **_: object) -> None:
            self.topics = topics

        def get_assignment(self) -> dict[str, CopartitionedAssignment]:
            return {
                m: CopartitionedAssignment(set(w.active), set(w.standby), set(self.topics))
                for m, w in workers.items()
            }

    return Planned


def faust_metadata(
    workers: Mapping[str, Worker],
    topics: Sequence[str],
    partitions: int,
    replicas: int,
    app_id: str = "bench",
) -> WireSizes:
    """Faust's metadata bytes in the second rebalance of a fresh group of ``workers``.

    The first rebalance starts from nothing; in the second every worker reports what it got
    (its assignment and the host maps it was sent), as Faust does from then on.
    """
    apps = {
        m: cast(
            partition_assignor.PartitionAssignor,
            _faust_app(w.url, app_id, topics, partitions, replicas).assignor,
        )
        for m, w in workers.items()
    }
    leader = next(iter(apps.values()))
    subscribed = sorted({*topics, *leader.app.tables.changelog_topics})
    meta = cluster(dict.fromkeys(subscribed, partitions))
    with mock.patch.object(partition_assignor, "CopartitionedAssignor", _planned(workers)):
        for _ in range(2):
            sent = {m: a.metadata(set(subscribed)).encode() for m, a in apps.items()}
            members = {m: ConsumerProtocolMemberMetadata.decode(b) for m, b in sent.items()}
            result = leader.assign(meta, members)
            synced = {m: result[m].encode() for m in apps}
            for m, a in apps.items():
                a.on_assignment(ConsumerProtocolMemberAssignment.decode(synced[m]))
    raw = [len(zlib.decompress(result[m].user_data)) for m in apps]
    return WireSizes.of(sent.values(), synced.values(), raw)


# -- aiokafka's round robin ----------------------------------------------------------------------


class _OnAssigned(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, callback: Callable[[frozenset[tuple[str, int]]], None]) -> None:
        self.callback = callback

    async def on_partitions_revoked(self, revoked: object) -> None:
        """Eager rebalance: nothing to do before the new assignment."""

    async def on_partitions_assigned(self, assigned: Collection[tuple[str, int]]) -> None:
        self.callback(frozenset(assigned))


def round_robin_consumer(
    bootstrap: str,
    group: str,
    topics: Sequence[str],
    on_assigned: Callable[[frozenset[tuple[str, int]]], None],
    config: dict[str, int],
) -> AIOKafkaConsumer:
    """A subscribed (not yet started) round-robin consumer calling ``on_assigned`` after
    every rebalance with its partitions."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        partition_assignment_strategy=(RoundRobinPartitionAssignor,),
        enable_auto_commit=False,
        **config,
    )
    consumer.subscribe(list(topics), listener=_OnAssigned(on_assigned))
    return consumer
