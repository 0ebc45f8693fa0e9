"""Internal topics with the broker's default replication factor, on the suite's broker
(``default.replication.factor`` 1): CreateTopics with -1 as aiokafka 0.14 sends it (v3) is
accepted and takes the broker's default; an explicit factor still works. The 3-broker run
(the default giving 3 replicas, an application riding out a rolling restart) is in
docs/runtime.md, "Broker restarts"."""

from __future__ import annotations

import asyncio

from aiokafka.admin import AIOKafkaAdminClient

from streamassign import Subtopology, Topology
from streamassign.runtime import ensure_internal_topics

from .conftest import GroupIdFactory, TopicFactory


async def _replicas(bootstrap: str, topic: str) -> list[int]:
    """Replica count of each partition of ``topic``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (found,) = await admin.describe_topics([topic])
        assert found["error_code"] == 0, found
        return [
            len(p["replicas"]) for p in sorted(found["partitions"], key=lambda p: p["partition"])
        ]
    finally:
        await admin.close()


def test_internal_topics_are_created_with_the_broker_s_default_or_the_factor_given(
    kafka_bootstrap: str,
    kafka_topic_factory: TopicFactory,
    kafka_group_id_factory: GroupIdFactory,
) -> None:
    source = kafka_topic_factory(3, prefix="events")
    for given in ({}, {"replication_factor": 1}):
        app = kafka_group_id_factory("replication")
        topology = Topology([Subtopology(0, [source], stores=["totals"])], name=app)
        changelog = f"{app}-totals-changelog"
        created = asyncio.run(ensure_internal_topics(topology, kafka_bootstrap, **given))
        assert created == {changelog: 3}
        assert asyncio.run(_replicas(kafka_bootstrap, changelog)) == [1, 1, 1]
