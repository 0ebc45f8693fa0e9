"""What every consumer assignor shares: the subscription type and the input/output plumbing.

Inputs are normalised once into a ``Problem`` — partitions numbered ``0..P-1`` in (topic,
partition) order, members sorted by id — so that each algorithm is a plain function over integer
lists, and the guarantees common to all of them live in one place: every member appears in the
result, a member never gets a topic it did not subscribe to, topics missing from the metadata are
ignored with a warning, and the output does not depend on input order.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import attrs

from .. import TopicPartition
from ..errors import AssignmentInputError, AssignmentTypeError

log = logging.getLogger("streamassign.consumer")

Assignment = dict[str, list[TopicPartition]]


def _topics(value: Iterable[str]) -> frozenset[str]:
    if isinstance(value, str):
        raise AssignmentTypeError(f"topics must be a collection of names, not the string {value!r}")
    return frozenset(value)


def _owned(value: Iterable[tuple[str, int]]) -> tuple[TopicPartition, ...]:
    # Kept as is when already converted (what MemberData decodes): no second rebuild of a
    # member's partitions on the leader's hot path.
    if type(value) is tuple and all(type(tp) is TopicPartition for tp in value):
        return value
    return tuple(TopicPartition(*tp) for tp in value)


@attrs.frozen
class Subscription:
    """One member's JoinGroup metadata as the leader sees it.

    ``owned_partitions`` and ``generation`` are what the member held in the generation it
    reports (sticky history, KIP-341); ``user_data`` carries member parameters such as a
    failover priority or a weight (see ``streamassign.consumer.userdata``).
    """

    topics: frozenset[str] = attrs.field(converter=_topics)
    owned_partitions: tuple[TopicPartition, ...] = attrs.field(default=(), converter=_owned)
    generation: int = -1
    rack: str | None = None
    user_data: bytes = b""


class ConsumerAssignor(Protocol):
    """The shape every consumer assignor here has (and the aiokafka adapters rely on)."""

    @property
    def name(self) -> str: ...

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> Assignment: ...


@attrs.frozen
class Problem:
    """Normalised input: partitions as integers, members sorted, subscriptions as topic ids."""

    topics: tuple[str, ...]  # sorted topics that exist and someone subscribes to
    offsets: tuple[int, ...]  # first partition id of each topic; offsets[-1] == partitions
    members: tuple[str, ...]  # sorted member ids
    subscribed: tuple[frozenset[int], ...]  # per member, topic indices it subscribes to
    subscriptions: tuple[Subscription, ...]  # per member, as given

    @property
    def partitions(self) -> int:
        return self.offsets[-1]

    def count(self, topic: int) -> int:
        return self.offsets[topic + 1] - self.offsets[topic]

    def subscribers(self) -> list[list[int]]:
        """Per topic, the members subscribed to it, in member order."""
        out: list[list[int]] = [[] for _ in self.topics]
        for m, subs in enumerate(self.subscribed):
            for t in sorted(subs):
                out[t].append(m)
        return out

    def partition_id(self, tp: TopicPartition, index: Mapping[str, int]) -> int:
        """Integer id of ``tp``, or -1 when its topic or partition does not exist."""
        t = index.get(tp.topic)
        if t is None or not 0 <= tp.partition < self.count(t):
            return -1
        return self.offsets[t] + tp.partition

    def topic_index(self) -> dict[str, int]:
        return {name: t for t, name in enumerate(self.topics)}

    def all_partitions(self) -> list[TopicPartition]:
        """Every partition, indexed by its integer id (built once; outputs share the tuples)."""
        make = TopicPartition._make
        return [make((name, p)) for t, name in enumerate(self.topics) for p in range(self.count(t))]

    def topic_of(self) -> list[int]:
        """Topic index of every partition id."""
        return [t for t in range(len(self.topics)) for _ in range(self.count(t))]

    def output(
        self, owner: Sequence[int], tps: Sequence[TopicPartition] | None = None
    ) -> Assignment:
        """Member -> its partitions in (topic, partition) order; every member present.

        ``tps``: ``all_partitions()`` if the caller has built it already."""
        tps = self.all_partitions() if tps is None else tps
        lists: list[list[TopicPartition]] = [[] for _ in self.members]
        for pid, m in enumerate(owner):
            if m >= 0:
                lists[m].append(tps[pid])
        return dict(zip(self.members, lists, strict=True))


def prepare(
    partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
) -> Problem:
    """Validate and normalise; warn once about subscribed topics missing from the metadata."""
    for topic, count in partitions_per_topic.items():
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise AssignmentInputError(
                f"partition count of topic {topic!r} must be an int >= 0: {count!r}"
            )
    members = tuple(sorted(subscriptions))
    wanted = set().union(*(s.topics for s in subscriptions.values())) if subscriptions else set()
    missing = sorted(wanted - set(partitions_per_topic))
    if missing:
        log.warning("ignoring subscribed topics missing from the metadata: %s", ", ".join(missing))
    topics = tuple(sorted(t for t in wanted if t in partitions_per_topic))
    offsets = [0]
    for t in topics:
        offsets.append(offsets[-1] + partitions_per_topic[t])
    index = {name: i for i, name in enumerate(topics)}
    subs = tuple(subscriptions[m] for m in members)
    subscribed = tuple(frozenset(index[t] for t in s.topics if t in index) for s in subs)
    return Problem(topics, tuple(offsets), members, subscribed, subs)
