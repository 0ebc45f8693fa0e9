"""The Kafka clients one runtime process shares between its parts (started by ``App.start``)."""

from __future__ import annotations

import attrs
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from .. import TaskId
from .transactions import TaskProducers


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

    async def producer_for(self, task: TaskId) -> AIOKafkaProducer:
        """The producer ``task`` writes with: the shared one, or (exactly once) its own, in
        a transaction (raises ``TransactionFailedError`` when that producer failed)."""
        if self.task_producers is not None:
            return await self.task_producers.sending(task)
        assert self.producer is not None
        return self.producer
