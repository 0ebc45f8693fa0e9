"""The Kafka clients one runtime process shares between its parts (started by ``App.start``)."""

from __future__ import annotations

import attrs
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer


@attrs.define
class Clients:
    #: Every changelog, output and repartition record, and the commit markers.
    producer: AIOKafkaProducer | None = None
    #: Changelog end offsets and key lookups at commits and resumes (no group).
    restorer: AIOKafkaConsumer | None = None
    #: The state updater's: changelogs of restoring actives, standbys and warmups (no group).
    changelog_reader: AIOKafkaConsumer | None = None
