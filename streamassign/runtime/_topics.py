"""Internal topics (changelogs, repartition topics): counted from the topology, created once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from ..errors import InternalTopicError as InternalTopicError
from ..errors import MissingTopicsError, TopicConfigError
from ..grouper import resolve_partition_counts, task_counts
from ..topology import Topology

log = logging.getLogger("streamassign.runtime")

_TOPIC_ALREADY_EXISTS = 36
_UNKNOWN_TOPIC = 3
_READY_TIMEOUT = 30.0


def internal_topics(topology: Topology, external_counts: Mapping[str, int]) -> dict[str, int]:
    """Partition count of every changelog and repartition topic of ``topology``.

    A changelog has one partition per task of its subtopology; repartition counts are
    resolved as the partition grouper does (``resolve_partition_counts``).
    """
    resolved = resolve_partition_counts(topology, external_counts)
    wanted = {t: resolved[t] for t in topology.repartition_topics}
    tasks = task_counts(topology, external_counts)
    for sub in topology.subtopologies:
        for changelog in topology.changelog_topics(sub.id):
            wanted[changelog] = tasks[sub.id]
    return wanted


async def _describe(admin: Any, topics: list[str]) -> dict[str, list[Any]]:
    """Partitions of the topics that exist (unknown ones are left out)."""
    found = {}
    for topic in await admin.describe_topics(topics):
        if topic["error_code"] == 0:
            found[topic["topic"]] = topic["partitions"]
    return found


async def ensure_internal_topics(
    topology: Topology,
    bootstrap_servers: str,
    *,
    replication_factor: int = 1,
    admin_config: Mapping[str, Any] | None = None,
) -> dict[str, int]:
    """Create the missing internal topics (changelogs compacted); returns their counts.

    Raises ``MissingTopicsError`` when external source topics are missing and
    ``InternalTopicError`` when an internal topic exists with another partition count.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, **dict(admin_config or {}))
    await admin.start()
    try:
        externals = sorted(topology.external_source_topics)
        existing = await _describe(admin, externals)
        missing = [t for t in externals if t not in existing]
        if missing:
            raise MissingTopicsError(missing)
        wanted = internal_topics(topology, {t: len(ps) for t, ps in existing.items()})
        changelogs = {
            c for sub in topology.subtopologies for c in topology.changelog_topics(sub.id)
        }
        present = await _describe(admin, sorted(wanted))
        wrong = {t: len(ps) for t, ps in present.items() if len(ps) != wanted[t]}
        if wrong:
            raise InternalTopicError(
                "internal topics exist with other partition counts than the topology needs: "
                + ", ".join(f"{t} has {n}, needs {wanted[t]}" for t, n in sorted(wrong.items()))
            )
        new = [
            NewTopic(
                t,
                n,
                replication_factor,
                topic_configs={"cleanup.policy": "compact"} if t in changelogs else {},
            )
            for t, n in sorted(wanted.items())
            if t not in present
        ]
        if new:
            response = await admin.create_topics(new)
            for error in response.topic_errors:
                if error[1] not in (0, _TOPIC_ALREADY_EXISTS):
                    raise InternalTopicError(f"creating internal topic {error[0]!r}: {error}")
            log.info("created internal topics: %s", ", ".join(t.name for t in new))
            await _wait_for_leaders(admin, {t.name: t.num_partitions for t in new})
        return wanted
    finally:
        await admin.close()


async def _wait_for_leaders(admin: Any, counts: Mapping[str, int]) -> None:
    deadline = time.monotonic() + _READY_TIMEOUT
    while True:
        found = await _describe(admin, sorted(counts))
        ready = all(
            len(found.get(t, ())) == n and min(p["leader"] for p in found[t]) >= 0
            for t, n in counts.items()
        )
        if ready:
            return
        if time.monotonic() >= deadline:
            raise InternalTopicError(f"internal topics have no leaders after creation: {counts}")
        await asyncio.sleep(0.05)


def written_topics(topology: Topology) -> list[str]:
    """The topics the application writes that the topology names: changelogs, repartition
    topics and the declared sink topics (a processor may send to others too)."""
    topics = set(topology.repartition_topics)
    for sub in topology.subtopologies:
        topics.update(topology.changelog_topics(sub.id))
        topics.update(sub.sink_topics)
    return sorted(topics)


async def max_message_bytes(
    bootstrap_servers: str,
    topics: list[str],
    *,
    admin_config: Mapping[str, Any] | None = None,
) -> dict[str, int]:
    """Each topic's ``max.message.bytes`` (the largest record batch it takes), the broker's
    default (``message.max.bytes`` of the first broker described: brokers of a cluster
    normally share it) for a topic not created yet. A topic whose limit cannot be read is
    left out (logged), the others kept. Empty (logged) when the lookup fails as a whole,
    e.g. without the right to describe configs: the producers then keep their batch sizes,
    as before these limits were read."""
    if not topics:
        return {}
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, **dict(admin_config or {}))
    try:
        await admin.start()
        limits, missing = await _topic_limits(admin, topics)
        if missing:
            try:
                default = await _broker_limit(admin)
            except Exception as exc:
                log.warning(
                    "the broker's message.max.bytes not known (%r): batches not capped for "
                    "topics not created yet (%s)",
                    exc,
                    ", ".join(missing),
                )
            else:
                limits.update(dict.fromkeys(missing, default))
        return limits
    except Exception as exc:
        log.warning(
            "max.message.bytes of the topics written not known (%r): producer batch sizes "
            "not capped",
            exc,
        )
        return {}
    finally:
        with contextlib.suppress(Exception):  # not started, or the connection is gone
            await admin.close()


async def _topic_limits(admin: Any, topics: list[str]) -> tuple[dict[str, int], list[str]]:
    """``max.message.bytes`` of the existing ``topics``, and the topics that do not exist."""
    wanted = {"max.message.bytes": None}
    resources = [ConfigResource(ConfigResourceType.TOPIC, t, wanted) for t in topics]
    limits: dict[str, int] = {}
    missing: list[str] = []
    for response in await admin.describe_configs(resources):
        for resource in response.to_object()["resources"]:
            name, code = resource["resource_name"], resource["error_code"]
            if code == _UNKNOWN_TOPIC:
                missing.append(name)
            elif code != 0:  # the others' limits are still worth having
                log.warning(
                    "max.message.bytes of topic %r not known (describe error %d): batches "
                    "not capped for it",
                    name,
                    code,
                )
                continue
            for entry in resource["config_entries"]:
                if entry["config_names"] == "max.message.bytes":
                    limits[name] = int(entry["config_value"])
    return limits, missing


async def _broker_limit(admin: Any) -> int:
    """The broker's ``message.max.bytes``: what a topic created without a setting takes."""
    cluster = await admin.describe_cluster()
    broker = str(cluster["brokers"][0]["node_id"])
    wanted = {"message.max.bytes": None}
    resource = ConfigResource(ConfigResourceType.BROKER, broker, wanted)
    for response in await admin.describe_configs([resource]):
        for found in response.to_object()["resources"]:
            for entry in found["config_entries"]:
                if entry["config_names"] == "message.max.bytes":
                    return int(entry["config_value"])
    raise TopicConfigError(f"broker {broker} reports no message.max.bytes")
