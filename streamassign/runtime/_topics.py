"""Internal topics (changelogs, repartition topics): counted from the topology, created once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import NodeNotReadyError

from .. import TaskId, TopicPartition
from ..aiokafka.metadata import LEADER_NOT_AVAILABLE, UNKNOWN_TOPIC, topic_metadata
from ..errors import InternalTopicError as InternalTopicError
from ..errors import (
    InternalTopicNotAuthorizedError,
    MissingChangelogError,
    MissingTopicsError,
    SourceTopicsNotAuthorizedError,
    TopicConfigError,
)
from ..grouper import resolve_partition_counts, task_counts
from ..localstate import StateDirectory
from ..topology import Topology
from ._clients import principal
from .end_offsets import partition_names

log = logging.getLogger("streamassign.runtime")

_TOPIC_ALREADY_EXISTS = 36
#: INVALID_REPLICATION_FACTOR and INVALID_REQUEST: how a broker that does not take -1 refuses it.
_REPLICATION_REFUSED = (38, 42)
#: The broker's answer for a topic the principal may not describe (or create), whether it
#: exists or not.
TOPIC_AUTHORIZATION_FAILED = 29
#: Seconds a start's topic check may wait: for a broker connection to be ready, for a new
#: topic's partitions to be listed and for their leaders.
_READY_TIMEOUT = 30.0
#: Seconds the check of whether changelog partitions exist may take (admin client included).
CHECK_TIMEOUT = 10.0
#: Seconds between two such checks at most once (a broker outage fails every end lookup).
CHECK_INTERVAL = 10.0
#: A replication factor of -1 asks the broker for its ``default.replication.factor``
#: (Kafka Streams' default since 3.0).
BROKER_DEFAULT_REPLICATION = -1

#: Makes the error for topics the principal may not describe (``_describe_by``).
_Refusal = Callable[[list[str]], Exception]

#: What to do about internal topics with other partition counts than the tasks need.
COUNT_REMEDY = (
    "stop every instance, then either add partitions to the internal topics named "
    "(kafka-topics.sh --bootstrap-server B --alter --topic T --partitions N; most keys then "
    "map to another partition, whose state lacks them: practically a state reset, keeping "
    "stale state), or reset the application (delete its internal topics, its state "
    "directories and its group's committed offsets) to reprocess its inputs; "
    "see docs/runtime.md, 'Changing source partition counts'"
)
#: What to do about a deleted changelog that local state (or running tasks) held data of.
MISSING_REMEDY = (
    "restore the topic with its records, or start that state over deliberately: stop every "
    "instance, delete those tasks' directories under the state directory on every machine "
    "(and reset the group's committed offsets to reprocess the inputs); "
    "see docs/runtime.md, 'Missing changelogs'"
)


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


async def _describe(admin: Any, topics: list[str]) -> tuple[dict[str, list[Any]], list[str]]:
    """Partitions of the topics that exist (unknown ones are left out; one that exists
    without leaders yet may have none listed), and the topics the principal may not
    describe (left out too: whether they exist is not known). The metadata request never
    creates a topic: aiokafka's ``describe_topics`` asks with ``allow_auto_topic_creation``
    on, and a broker with ``auto.create.topics.enable=true`` (Kafka's default) then creates
    every missing topic asked about with the broker's defaults (one partition, not
    compacted). A broker too old to take the flag (before Kafka 1.0) is refused, never asked
    without it."""
    found = {}
    denied = []
    for topic in await topic_metadata(admin, topics):
        if topic["error_code"] in (0, LEADER_NOT_AVAILABLE):
            found[topic["topic"]] = topic["partitions"]
        elif topic["error_code"] == TOPIC_AUTHORIZATION_FAILED:
            denied.append(topic["topic"])
    return found, sorted(denied)


async def _describe_by(
    admin: Any, topics: list[str], deadline: float, refuse: _Refusal
) -> dict[str, list[Any]]:
    """``_describe``, asked again until ``deadline`` (``time.monotonic``) while no broker
    connection is ready: aiokafka's admin sends to a node of its metadata without waiting for
    it to connect, and fails with ``NodeNotReadyError`` when it cannot yet, as just after a
    broker was unfenced or restarted. Raised as it is after the deadline. Topics the
    principal may not describe raise ``refuse(topics)``: never taken for absent ones."""
    while True:
        try:
            found, denied = await _describe(admin, topics)
            if denied:
                raise refuse(denied)
            return found
        except NodeNotReadyError as exc:
            if time.monotonic() >= deadline:
                raise
            log.debug("describing topics: %s; asking again", exc)
        await asyncio.sleep(0.1)


async def _describe_ready(admin: Any, topics: list[str], refuse: _Refusal) -> dict[str, list[Any]]:
    """``_describe_by``, waiting (up to ``_READY_TIMEOUT``) for a broker connection to be
    ready and while a topic exists without any partition listed yet (just created: its
    partition count is not known yet)."""
    deadline = time.monotonic() + _READY_TIMEOUT
    while True:
        found = await _describe_by(admin, topics, deadline, refuse)
        if all(found[t] for t in found) or time.monotonic() >= deadline:
            return found
        await asyncio.sleep(0.1)


async def ensure_internal_topics(
    topology: Topology,
    bootstrap_servers: str,
    *,
    replication_factor: int = BROKER_DEFAULT_REPLICATION,
    admin_config: Mapping[str, Any] | None = None,
    state: StateDirectory | None = None,
) -> dict[str, int]:
    """Create the missing internal topics (changelogs compacted) with ``replication_factor``
    replicas (-1: the broker's ``default.replication.factor``); returns their counts.

    Raises ``MissingTopicsError`` when external source topics are missing (its subclass
    ``SourceTopicsNotAuthorizedError`` when the principal may not read them;
    ``InternalTopicNotAuthorizedError`` for internal topics it may not describe or create),
    ``InternalTopicError`` when an internal topic exists with another partition count, and
    ``MissingChangelogError`` when a changelog is missing that a checkpoint in ``state``
    holds data of (it was deleted: creating it empty would lose that state at the restore).
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, **dict(admin_config or {}))
    await admin.start()
    who = principal(admin_config or {})
    try:
        externals = sorted(topology.external_source_topics)
        existing = await _describe_ready(admin, externals, lambda ts: _sources_denied(ts, who))
        missing = [t for t in externals if t not in existing]
        if missing:
            raise MissingTopicsError(missing)
        wanted = internal_topics(topology, {t: len(ps) for t, ps in existing.items()})
        changelogs = {
            c for sub in topology.subtopologies for c in topology.changelog_topics(sub.id)
        }
        present = await _describe_ready(
            admin, sorted(wanted), lambda ts: _internals_denied(ts, who)
        )
        wrong = {t: len(ps) for t, ps in present.items() if len(ps) != wanted[t]}
        if wrong:
            raise InternalTopicError(
                "internal topics exist with other partition counts than the topology needs: "
                + ", ".join(f"{t} has {n}, needs {wanted[t]}" for t, n in sorted(wrong.items()))
                + f" (source partitions added or removed?); {COUNT_REMEDY}"
            )
        if state is not None:
            _refuse_lost_changelogs(state, changelogs - set(present))
        new = [
            _new_topic(t, n, replication_factor, compacted=t in changelogs)
            for t, n in sorted(wanted.items())
            if t not in present
        ]
        if new:
            response = await admin.create_topics(new)
            _refuse_create_errors(response.topic_errors, new, who)
            log.info("created internal topics: %s", ", ".join(t.name for t in new))
            await _wait_for_leaders(admin, {t.name: t.num_partitions for t in new}, who)
        return wanted
    finally:
        await admin.close()


def _new_topic(name: str, partitions: int, replication_factor: int, compacted: bool) -> NewTopic:
    """The CreateTopics entry of an internal topic. aiokafka's ``NewTopic`` takes -1 only with
    a replica assignment; an empty one is sent as none, and the broker (Kafka 4.3.1 measured,
    CreateTopics v3 as aiokafka 0.14 sends it) then applies its ``default.replication.factor``."""
    return NewTopic(
        name,
        partitions,
        replication_factor,
        replica_assignments={} if replication_factor == BROKER_DEFAULT_REPLICATION else None,
        topic_configs={"cleanup.policy": "compact"} if compacted else {},
    )


def replication_words(replication_factor: int) -> str:
    """``replication_factor`` as a topic to create by hand should have it."""
    if replication_factor == BROKER_DEFAULT_REPLICATION:
        return "the broker's default replication factor"
    return f"replication factor {replication_factor}"


def _sources_denied(topics: list[str], who: str) -> SourceTopicsNotAuthorizedError:
    return SourceTopicsNotAuthorizedError(
        topics,
        f"source topics not authorized for {who}: {', '.join(topics)}: grant READ on each "
        "(it implies the DESCRIBE the metadata request needs; the broker answers so whether "
        "a topic exists or not)",
    )


def _internals_denied(topics: list[str], who: str) -> InternalTopicNotAuthorizedError:
    return InternalTopicNotAuthorizedError(
        f"internal topics not authorized for {who}: {', '.join(topics)}: grant READ and "
        "WRITE on them (a PREFIXED ACL on '<application id>-' covers every internal topic; "
        "READ implies the DESCRIBE the metadata request needs); not taken for deleted "
        "changelogs, nothing created"
    )


def _refuse_create_errors(errors: Any, new: list[NewTopic], who: str) -> None:
    """Raise ``InternalTopicError`` for a topic CreateTopics refused (an authorization
    refusal: ``InternalTopicNotAuthorizedError`` with the ACL, or how to create it)."""
    for error in errors:
        name, code = error[0], error[1]
        if code == TOPIC_AUTHORIZATION_FAILED:
            topic = next(t for t in new if t.name == name)
            raise InternalTopicNotAuthorizedError(
                f"creating internal topic {name!r} not authorized for {who}: grant CREATE "
                f"on it (a PREFIXED ACL on '<application id>-' covers every internal topic), "
                f"or create it beforehand: {topic.num_partitions} partition(s), "
                f"{replication_words(topic.replication_factor)}"
                + (", cleanup.policy=compact" if topic.topic_configs else "")
            )
        if code not in (0, _TOPIC_ALREADY_EXISTS):
            asked = next(t.replication_factor for t in new if t.name == name)
            hint = (
                " (asked with replication factor -1, the broker's default, which needs "
                "Kafka 2.4 or later: set the App's replication_factor)"
                if asked == BROKER_DEFAULT_REPLICATION and code in _REPLICATION_REFUSED
                else ""
            )
            raise InternalTopicError(f"creating internal topic {name!r}: {error}{hint}")


def changelogs_with_state(state: StateDirectory) -> dict[str, list[TaskId]]:
    """The changelog topics local checkpoints in ``state`` hold data of (an offset past 0),
    each with the tasks that hold it (what can be read now)."""
    return _changelogs_held(state.read_checkpoints()[0])


def _changelogs_held(
    checkpoints: Mapping[TaskId, Mapping[TopicPartition, int]],
) -> dict[str, list[TaskId]]:
    held: dict[str, list[TaskId]] = {}
    for task, offsets in sorted(checkpoints.items()):
        for tp, offset in offsets.items():
            if offset > 0 and task not in held.setdefault(tp.topic, []):
                held[tp.topic].append(task)
    return {t: tasks for t, tasks in held.items() if tasks}


def _refuse_lost_changelogs(state: StateDirectory, missing: Collection[str]) -> None:
    """Raise ``MissingChangelogError`` when local state holds data of a ``missing`` changelog,
    or when that cannot be told: a checkpoint (or ``tasks/``) cannot be read now. Taken for
    "no data", the changelog would be created empty and the state it holds be lost."""
    if not missing:
        return
    checkpoints, unreadable = state.read_checkpoints()
    if unreadable:
        path, exc = min(unreadable.items())
        raise MissingChangelogError(
            f"changelog topic(s) {', '.join(sorted(missing))} missing, and the local state in "
            f"{state.path} cannot be read to tell whether it holds data of them ({path}: "
            f"{exc.strerror or exc}); not created: the state may be fine, fix the read error "
            "(permission, disk, open files) and start again"
        )
    held = {t: ts for t, ts in _changelogs_held(checkpoints).items() if t in missing}
    if held:
        raise MissingChangelogError(
            "changelog topic(s) missing although the local state in "
            f"{state.path} holds data of them ("
            + "; ".join(f"{t}: tasks {', '.join(map(str, ts))}" for t, ts in sorted(held.items()))
            + "): created empty, they would lose that state (deleted?); not created; "
            + MISSING_REMEDY
        )


async def _wait_for_leaders(admin: Any, counts: Mapping[str, int], who: str) -> None:
    deadline = time.monotonic() + _READY_TIMEOUT
    while True:
        found = await _describe_by(
            admin, sorted(counts), deadline, lambda ts: _internals_denied(ts, who)
        )
        ready = all(
            len(found.get(t, ())) == n and min(p["leader"] for p in found[t]) >= 0
            for t, n in counts.items()
        )
        if ready:
            return
        if time.monotonic() >= deadline:
            raise InternalTopicError(f"internal topics have no leaders after creation: {counts}")
        await asyncio.sleep(0.05)


class ChangelogCheck:
    """Whether changelog partitions exist, asked when their end offsets cannot be read: a
    changelog deleted while running, or without the partitions its tasks need (source
    partitions added while running), raises ``MissingChangelogError`` (the application
    stops) rather than leaving tasks uncommitted or restoring forever. Asked at most every
    ``CHECK_INTERVAL`` s (a broker outage fails every lookup), each time with a new admin
    client (a failure is rare)."""

    def __init__(
        self,
        topology: Topology,
        bootstrap_servers: str,
        admin_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.topology = topology
        self.bootstrap_servers = bootstrap_servers
        self.admin_config = dict(admin_config or {})
        self._next = 0.0

    async def explain(self, tps: Collection[TopicPartition]) -> str:
        """Why the end offsets of ``tps`` could not be read, as far as the topics' metadata
        tells (empty when not asked again yet); raises ``MissingChangelogError`` when some
        of ``tps`` do not exist."""
        if not self.due():
            return ""
        try:
            found = await self.refuse_missing(tps)
        except MissingChangelogError:
            raise
        except Exception as exc:  # any failure: the cause stays unknown
            return f"the topics' metadata not read either ({exc!r}): brokers unreachable?"
        leaderless = [
            tp
            for tp in sorted(tps)
            if any(p["partition"] == tp.partition and p["leader"] < 0 for p in found[tp.topic])
        ]
        if leaderless:
            return "no leader for " + partition_names(leaderless)
        # A leader listed may be a broker just killed: the metadata names it until the
        # controller moves its partitions.
        return (
            "the partitions exist and have leaders: the leaders' brokers slow to answer, or "
            "down and not yet replaced?"
        )

    def due(self) -> bool:
        """Whether ``CHECK_INTERVAL`` s passed since the last check."""
        return time.monotonic() >= self._next

    async def refuse_missing(self, tps: Collection[TopicPartition]) -> dict[str, list[Any]]:
        """Raise ``MissingChangelogError`` when some of ``tps`` do not exist (any other
        failure to tell raises as it is, within ``CHECK_TIMEOUT``); else the partitions
        of their topics (and of the source topics), as described."""
        self._next = time.monotonic() + CHECK_INTERVAL
        topics = sorted({tp.topic for tp in tps})
        async with asyncio.timeout(CHECK_TIMEOUT):
            found = await self._describe(topics + sorted(self.topology.external_source_topics))
        self._refuse_missing(tps, found)
        return found

    async def _describe(self, topics: list[str]) -> dict[str, list[Any]]:
        """The partitions of ``topics``; changelogs the principal may not describe raise
        ``InternalTopicNotAuthorizedError`` (not taken for deleted ones), source topics it
        may not are left out."""
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap_servers, **self.admin_config)
        try:
            await admin.start()
            found, denied = await _describe(admin, topics)
            denied = [t for t in denied if t not in self.topology.external_source_topics]
            if denied:
                raise _internals_denied(denied, principal(self.admin_config))
            return found
        finally:
            with contextlib.suppress(Exception):  # not started, or the connection is gone
                await admin.close()

    def _refuse_missing(
        self, tps: Collection[TopicPartition], found: Mapping[str, list[Any]]
    ) -> None:
        deleted = sorted({tp.topic for tp in tps if tp.topic not in found})
        absent = sorted(
            tp
            for tp in tps  # no partition listed: the topic exists, not ready yet
            if found.get(tp.topic) and tp.partition >= len(found[tp.topic])
        )
        problems = []
        if deleted:
            problems.append(
                f"changelog topic(s) {', '.join(deleted)} deleted while the application ran: "
                "its tasks' state can be neither committed nor restored (the local stores are "
                f"kept); {MISSING_REMEDY}"
            )
        if absent:
            sources = {t: len(found[t]) for t in self.topology.external_source_topics if t in found}
            wanted = internal_topics(self.topology, sources)
            problems.append(
                f"changelog partitions {partition_names(absent)} do not exist: "
                + ", ".join(
                    f"{t} has {len(found[t])} partitions, its tasks need {wanted.get(t, '?')}"
                    for t in sorted({tp.topic for tp in absent})
                )
                + " (source topics now: "
                + ", ".join(f"{t} {n}" for t, n in sorted(sources.items()))
                + f" partitions; added while the application ran?); {COUNT_REMEDY}"
            )
        if problems:
            raise MissingChangelogError("; ".join(problems))


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
            if code == UNKNOWN_TOPIC:
                missing.append(name)
            elif code != 0:  # the others' limits are still worth having
                log.warning(
                    "max.message.bytes of topic %r not known (%s): batches not capped for it",
                    name,
                    _config_error(code, name),
                )
                continue
            for entry in resource["config_entries"]:
                if entry["config_names"] == "max.message.bytes":
                    limits[name] = int(entry["config_value"])
    return limits, missing


def _config_error(code: int, topic: str) -> str:
    """Why DescribeConfigs gave no configuration of ``topic`` (error ``code``), in words."""
    if code == TOPIC_AUTHORIZATION_FAILED:
        return f"not authorized: grant DESCRIBE_CONFIGS on topic {topic!r}"
    return f"describe error {code}"


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
