"""The Kafka clients one runtime process shares between its parts (started by ``App.start``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Mapping
from typing import Any

import attrs
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.structs import RecordMetadata

from .. import TaskId
from ..aiokafka.floods import back_off_metadata_updates
from ..errors import OutputWriteError
from .transactions import TaskProducers

log = logging.getLogger("streamassign.runtime")

#: The shared producer's ``max_batch_size`` (aiokafka's default: 16 KiB), unless the
#: application's ``producer_config`` sets one. aiokafka keeps one open batch per partition
#: and, idempotent, one request in flight per broker: a full batch blocks ``send`` (the
#: per-record path) until the request before it is acknowledged. Every task of the process
#: writes through this producer, so with 16 KiB the join benchmark's worker stalled every
#: ~100 output records for a broker round trip (a third of its wall time under load); a
#: batch fills far less often now. A batch is at most this large and grows only as records
#: arrive; ``capped_batches`` keeps it below the ``max.message.bytes`` of the topics written.
SHARED_BATCH_BYTES = 256 * 1024

#: aiokafka's ``max_batch_size`` (the exactly-once task producers keep it unless capped).
AIOKAFKA_BATCH_BYTES = 16 * 1024

#: Bytes a batch stays below the smallest ``max.message.bytes`` of the topics written. A
#: batch's size counts its header, so the limit itself would do for an uncompressed batch;
#: the headroom is for compression, which can grow an incompressible batch a little.
BATCH_HEADROOM = 1024

#: The settings of ``consumer_config`` that say how to reach the cluster (TLS, SASL). The
#: process's own clients (admin, restore and changelog readers, end-offset and query
#: consumers) need them as much as the group's consumers do; nothing else of the group's
#: configuration applies to them.
CONNECTION_KEYS = (
    "security_protocol",
    "ssl_context",
    "sasl_mechanism",
    "sasl_plain_username",
    "sasl_plain_password",
    "sasl_kerberos_service_name",
    "sasl_kerberos_domain_name",
    "sasl_oauth_token_provider",
)


def connection_settings(consumer_config: Mapping[str, Any]) -> dict[str, Any]:
    """The connection settings of ``consumer_config`` (see ``CONNECTION_KEYS``)."""
    return {k: v for k, v in consumer_config.items() if k in CONNECTION_KEYS}


def with_connection(config: Mapping[str, Any], connection: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` (``producer_config``) with the ``connection`` settings (``consumer_config``'s)
    when it sets none of ``CONNECTION_KEYS`` itself: a secured cluster's producers need them
    as much as every other client, and left out they fail to bootstrap without saying why.
    One that sets any of them is taken as complete (the producers' own principal, say)."""
    if any(k in config for k in CONNECTION_KEYS):
        return dict(config)
    return {**connection, **config}


def principal(config: Mapping[str, Any]) -> str:
    """The principal a broker's ACLs name the clients by, as far as ``config`` (a client's
    connection settings) tells: ``User:NAME`` with a SASL user name, else a description."""
    name = config.get("sasl_plain_username")
    return f"User:{name}" if name else "the application's principal"


def batch_ceiling(limit: int) -> int:
    """The largest batch a producer may build for a topic of ``max.message.bytes`` ``limit``."""
    return max(limit - BATCH_HEADROOM, limit // 2)


def capped_batches(
    config: Mapping[str, Any], limits: Mapping[str, int], default: int
) -> dict[str, Any]:
    """``config`` (a producer's) with ``max_batch_size`` (``default`` unless ``config`` sets
    one) capped below the smallest of ``limits`` (``max.message.bytes`` by topic): a full
    batch after a backlog would otherwise be refused by that topic, the application would
    stop, and stop again after every restart. A configured size above it: one warning."""
    capped = {**config, "max_batch_size": int(config.get("max_batch_size", default))}
    if not limits:
        return capped
    topic = min(limits, key=lambda t: (limits[t], t))
    ceiling = batch_ceiling(limits[topic])
    if capped["max_batch_size"] > ceiling:
        if "max_batch_size" in config:
            log.warning(
                "producer_config max_batch_size=%d is more than topic %r takes "
                "(max.message.bytes=%d): batches are capped at %d bytes",
                capped["max_batch_size"],
                topic,
                limits[topic],
                ceiling,
            )
        capped["max_batch_size"] = ceiling
    return capped


@attrs.frozen
class CheckedProducer:
    """``producer`` for ``task``'s sends: a record its topic cannot take (larger than its
    ``max.message.bytes`` in ``limits``, even in a batch of its own) is refused before it is
    sent, with an ``OutputWriteError`` naming topic, size and limit (the application stops:
    the record would be refused again after every restart). A topic not in ``limits`` (not
    named by the topology) gets one warning, added to ``unnamed``. ``compressed`` (the
    producer compresses): no size check, the broker applies the limit to the compressed
    batch (its refusal stops the application at the commit, with one line too)."""

    producer: AIOKafkaProducer
    task: TaskId
    limits: Mapping[str, int]
    unnamed: set[str]
    compressed: bool = False

    def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> Awaitable[asyncio.Future[RecordMetadata]]:
        """The producer's ``send`` (await it), or ``OutputWriteError`` at once. Not a
        coroutine itself: one frame less on the per-record path."""
        limit = self.limits.get(topic)
        if limit is None:
            if self.limits and topic not in self.unnamed:  # (no limits: the lookup failed)
                self.unnamed.add(topic)
                log.warning(
                    "task %s sends to topic %r, which the topology does not list in "
                    "sink_topics: its max.message.bytes is not known, so batches are not "
                    "capped below it and a backlog can fill one it refuses",
                    self.task,
                    topic,
                )
        elif not self.compressed and _payload(key, value) > limit - BATCH_HEADROOM:  # else it fits
            # An upper bound of the batch holding this record alone, as aiokafka estimates
            # it against max_request_size (header, record overhead, key, value, headers:
            # the runtime's own, two short ones on repartition records).
            size = DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers or [])
            if size > limit:
                raise OutputWriteError(
                    f"task {self.task}: a record of {size} bytes to topic {topic!r} is larger "
                    f"than its max.message.bytes ({limit}): not sent, stopping (it would be "
                    "refused again)"
                )
        sending: Awaitable[asyncio.Future[RecordMetadata]] = self.producer.send(
            topic, value, key=key, partition=partition, headers=headers
        )
        return sending


def _payload(key: bytes | None, value: bytes | None) -> int:
    return (len(value) if value else 0) + (len(key) if key else 0)


@attrs.define
class Clients:
    #: Every changelog, output and repartition record, and the commit markers (at least
    #: once; with exactly once each task writes with its own, ``task_producers``).
    producer: AIOKafkaProducer | None = None
    #: Changelog end offsets and key lookups at commits and resumes (no group).
    restorer: AIOKafkaConsumer | None = None
    #: The state updater's: changelogs of restoring actives, standbys and warmups (no group).
    changelog_reader: AIOKafkaConsumer | None = None
    #: Exactly once: each active task's transactional producer (None: at least once).
    task_producers: TaskProducers | None = None
    #: ``max.message.bytes`` of the topics the topology names as written (``App.start``).
    limits: Mapping[str, int] = attrs.field(factory=dict)
    #: The producers compress (``compression_type``): records are not size-checked.
    compressed: bool = False
    #: Who the producers write as (``principal``), for the line a refused write logs.
    principal: str = "the application's principal"
    #: Each task's ``CheckedProducer``, made again when its producer changes.
    _checked: dict[TaskId, CheckedProducer] = attrs.field(factory=dict, init=False)
    #: Topics sent to that are not in ``limits`` (warned about once).
    _unnamed: set[str] = attrs.field(factory=set, init=False)

    def shared_producer(self, bootstrap_servers: str, config: Mapping[str, Any]) -> None:
        """At least once: create the process's one producer (started by ``App.start``);
        ``config`` comes from ``capped_batches``, which sets its ``max_batch_size``."""
        self.producer = AIOKafkaProducer(bootstrap_servers=bootstrap_servers, **config)
        back_off_metadata_updates(self.producer)

    async def producer_for(self, task: TaskId) -> CheckedProducer:
        """The producer ``task`` writes with: the shared one, or (exactly once) its own, in
        a transaction (raises ``TransactionFailedError`` when that producer failed)."""
        if self.task_producers is not None:
            producer = await self.task_producers.sending(task)
        else:
            assert self.producer is not None
            producer = self.producer
        checked = self._checked.get(task)
        if checked is None or checked.producer is not producer or checked.limits is not self.limits:
            checked = CheckedProducer(producer, task, self.limits, self._unnamed, self.compressed)
            self._checked[task] = checked
        return checked
