"""aiokafka's consumer-protocol assignment bytes, built once for both assignor families."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

from .. import TopicPartition
from ..errors import ProtocolError

log = logging.getLogger("streamassign.aiokafka")


def encode_assignment(partitions: Iterable[TopicPartition], user_data: bytes) -> bytes:
    """A member's assignment as the bytes SyncGroup carries (pre-encoded: aiokafka sends
    ``bytes`` as they are, and an encoding error can then never happen inside aiokafka)."""
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    topics = [(t, sorted(ps)) for t, ps in sorted(by_topic.items())]
    encoded: bytes = ConsumerProtocolMemberAssignment(0, topics, user_data).encode()
    return encoded


def subscribed_topics(meta: Any) -> tuple[str, ...]:
    """The topics of a member's ConsumerProtocol metadata (``ConsumerProtocolMemberMetadata``).
    ``ProtocolError`` when a name or the list is null: aiokafka decodes a length -1 string or
    array to ``None``, and the broker passes members' metadata on unread, so a buggy or hostile
    member's ``None`` reaches the leader and ``describe``, where sorting it raised TypeError."""
    names = meta.subscription
    if names is None:
        raise ProtocolError("a null topic list")
    if not all(isinstance(t, str) for t in names):
        raise ProtocolError("a null topic name")
    return tuple(names)


def assigned_partitions(assignment: Any) -> tuple[TopicPartition, ...]:
    """The partitions of a ConsumerProtocol assignment (``ConsumerProtocolMemberAssignment``);
    ``ProtocolError`` for a null topic name or list, read as ``subscribed_topics`` reads them."""
    entries = assignment.assignment
    if entries is None:
        raise ProtocolError("a null topic list")
    out: list[TopicPartition] = []
    for topic, partitions in entries:
        if not isinstance(topic, str) or partitions is None:
            raise ProtocolError("a null topic name or partition list")
        out.extend(TopicPartition(topic, p) for p in partitions)
    return tuple(out)


def readable_subscriptions(
    members: Mapping[str, Any], warn_empty: bool = True
) -> dict[str, tuple[tuple[str, ...], bytes]]:
    """Per member (id -> ``ConsumerProtocolMemberMetadata``), its topics and user data as a
    leader reads them. A member whose topic names cannot be read (``subscribed_topics``)
    subscribes to nothing, logged with the reason: it gets no partition, and the rest of the
    group its assignment (sorting a ``None`` among the names failed the whole round, every
    round while it stayed: a stuck group). Its user data is kept (its identity). An empty
    topic list gets nothing either and is logged the same way: one WARNING a rebalance for
    each member its subscription leaves without a partition, where its metadata is read.
    ``warn_empty=False`` logs an empty list at DEBUG: a plain consumer subscribed to a pattern
    that matches no topic yet joins with one, which is no fault."""
    out = {}
    empty_level = logging.WARNING if warn_empty else logging.DEBUG
    for member, meta in members.items():
        try:
            topics = subscribed_topics(meta)
        except ProtocolError as exc:
            topics = ()
            log.warning("member %s: %s in its subscription; assigning it nothing", member, exc)
        else:
            if not topics:
                log.log(
                    empty_level,
                    "member %s: an empty topic list in its subscription; assigning it nothing",
                    member,
                )
        out[member] = (topics, meta.user_data or b"")
    return out
