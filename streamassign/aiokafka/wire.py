"""aiokafka's consumer-protocol assignment bytes, built once for both assignor families."""

from __future__ import annotations

from collections.abc import Iterable

from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

from .. import TopicPartition


def encode_assignment(partitions: Iterable[TopicPartition], user_data: bytes) -> bytes:
    """A member's assignment as the bytes SyncGroup carries (pre-encoded: aiokafka sends
    ``bytes`` as they are, and an encoding error can then never happen inside aiokafka)."""
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    topics = [(t, sorted(ps)) for t, ps in sorted(by_topic.items())]
    encoded: bytes = ConsumerProtocolMemberAssignment(0, topics, user_data).encode()
    return encoded
