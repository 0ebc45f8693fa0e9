"""The Kafka clients one runtime process shares between its parts (started by ``App.start``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from .. import TaskId
from .transactions import TaskProducers

#: The shared producer's ``max_batch_size`` (aiokafka's default: 16 KiB), unless the
#: application's ``producer_config`` sets one. aiokafka keeps one open batch per partition
#: and, idempotent, one request in flight per broker: a full batch blocks ``send`` (the
#: per-record path) until the request before it is acknowledged. Every task of the process
#: writes through this producer, so with 16 KiB the join benchmark's worker stalled every
#: ~100 output records for a broker round trip (a third of its wall time under load); a
#: batch fills far less often now. A batch is at most this large (under the broker's
#: default 1 MiB ``message.max.bytes``) and grows only as records arrive.
SHARED_BATCH_BYTES = 256 * 1024

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

    def shared_producer(self, bootstrap_servers: str, config: Mapping[str, Any]) -> None:
        """At least once: create the process's one producer (``config`` wins over the
        defaults here; started by ``App.start``)."""
        self.producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap_servers,
            **{"max_batch_size": SHARED_BATCH_BYTES, **config},
        )

    async def producer_for(self, task: TaskId) -> AIOKafkaProducer:
        """The producer ``task`` writes with: the shared one, or (exactly once) its own, in
        a transaction (raises ``TransactionFailedError`` when that producer failed)."""
        if self.task_producers is not None:
            return await self.task_producers.sending(task)
        assert self.producer is not None
        return self.producer
