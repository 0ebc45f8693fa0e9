"""The Kafka clients one runtime process shares between its parts (started by ``App.start``)."""

from __future__ import annotations

import attrs
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer


@attrs.define
class Clients:
    #: Every changelog, output and repartition record, and the commit markers.
    producer: AIOKafkaProducer | None = None
    #: Restores of actives, changelog end offsets and key lookups at commits (no group).
    restorer: AIOKafkaConsumer | None = None
    #: Reads the changelogs of standbys and warmups (no group).
    standby_reader: AIOKafkaConsumer | None = None
