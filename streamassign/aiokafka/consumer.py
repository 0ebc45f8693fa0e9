"""aiokafka adapters for the consumer assignors of ``streamassign.consumer``.

``GroupAssignor(StickyAssignor())`` is an instance usable in
``AIOKafkaConsumer(partition_assignment_strategy=(assignor,))``; give every consumer its own
(state lives on the instance, never on the class: several consumers in one process stay apart).

- Member parameters (priority, weight) and sticky history (owned partitions, generation) travel
  in versioned subscription user data (``MemberData``); a member whose bytes cannot be read is
  treated as having no history, with a warning, never a failed group.
- On the leader, ``assign`` never raises: any error becomes an empty assignment with an error
  code for every member, logged with its cause; members then retry with growing backoff.
- The result is checked before it leaves: every member present, only subscribed topics, only
  existing partitions, no partition twice (aiokafka would stop a member's coordinator on any).
- Cooperative rounds: after an assignment that withheld partitions, every member asks for the
  follow-up rebalance itself (``bind(consumer)`` first), at most ``max_followups`` in a row.
- ``state_file`` keeps the member's last assignment on disk, so a restarted member reports what
  it held and sticky assignors hand it back.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from .. import TopicPartition
from ..consumer import (
    Assignment,
    ConsumerAssignor,
    CooperativeStickyAssignor,
    FailoverAssignor,
    RangeAssignor,
    RoundRobinAssignor,
    ShuffledAssignor,
    StickyAssignor,
    Subscription,
    WeightedAssignor,
)
from ..consumer.userdata import AssignmentData, MemberData, read_member_data
from ..errors import AssignmentValidationError as AssignmentValidationError  # old home
from ..errors import ConfigError, ErrorCode, UserDataError
from ..files import write_atomically
from .rejoin import Rejoiner
from .wire import encode_assignment, readable_subscriptions

log = logging.getLogger("streamassign.aiokafka")

ASSIGNORS: dict[str, type[ConsumerAssignor]] = {
    "range": RangeAssignor,
    "roundrobin": RoundRobinAssignor,
    "sticky": StickyAssignor,
    "cooperative-sticky": CooperativeStickyAssignor,
    "failover": FailoverAssignor,
    "weighted": WeightedAssignor,
    "shuffled": ShuffledAssignor,
}


#: Generations are int32 on the wire. The leader's stops at the maximum rather than wrapping:
#: it must compare >= every claim (KIP-341); from there on, claims tie and member ids decide.
MAX_GENERATION = 2**31 - 1

#: What every member gets when the leader fails: built once, so sending it cannot fail.
_FAILED = encode_assignment((), AssignmentData(error_code=ErrorCode.ASSIGNMENT_ERROR).encode())


def _next_generation(generation: int) -> int:
    return min(generation + 1, MAX_GENERATION)


@attrs.frozen
class LeaderRound:
    """What the leader saw and decided in its last rebalance (for logs, tests and metrics)."""

    partitions_per_topic: Mapping[str, int]
    subscriptions: Mapping[str, Subscription]
    assignment: Assignment
    generation: int
    followup: bool
    error: str | None = None


def validate(
    assignment: Mapping[str, Iterable[TopicPartition]],
    subscriptions: Mapping[str, Subscription],
    partitions_per_topic: Mapping[str, int],
) -> None:
    """Raise ``AssignmentValidationError`` unless ``assignment`` is safe to send."""
    missing = sorted(set(subscriptions) - set(assignment))
    if missing:
        raise AssignmentValidationError(f"members missing from the assignment: {missing}")
    seen: dict[TopicPartition, str] = {}
    for member, tps in assignment.items():
        if member not in subscriptions:
            raise AssignmentValidationError(f"assignment for unknown member {member!r}")
        topics = subscriptions[member].topics
        for tp in tps:
            if tp.topic not in topics:
                raise AssignmentValidationError(f"{member} got {tp} of an unsubscribed topic")
            if not 0 <= tp.partition < partitions_per_topic.get(tp.topic, 0):
                raise AssignmentValidationError(f"{member} got nonexistent partition {tp}")
            if tp in seen:
                raise AssignmentValidationError(f"{tp} assigned to {seen[tp]} and {member}")
            seen[tp] = member


class GroupAssignor(AbstractPartitionAssignor):  # type: ignore[misc]
    """An aiokafka partition assignor driving one pure consumer assignor."""

    def __init__(
        self,
        assignor: ConsumerAssignor,
        *,
        priority: int = 0,
        weight: int = 1,
        state_file: str | os.PathLike[str] | None = None,
        max_followups: int = 3,
    ) -> None:
        self.assignor = assignor
        self._name = f"streamassign-{assignor.name}"
        self._params = MemberData(priority=priority, weight=weight)
        self._owned: tuple[TopicPartition, ...] = ()
        self._pending: tuple[TopicPartition, ...] = ()
        self._generation = -1
        self._epoch = 0
        self._rejoiner = Rejoiner()
        self._state_file = Path(state_file) if state_file is not None else None
        self._state_unsaved = False  # the last save failed (said once, until one works)
        self._max_followups = max_followups
        self._followups = 0
        #: The last assignment this member received: its error code and follow-up flag.
        self.last_assignment = AssignmentData()
        #: What this member decided the last time it led a rebalance.
        self.last_round: LeaderRound | None = None
        self._load_state()

    @classmethod
    def create(cls, name: str, **options: Any) -> GroupAssignor:
        """``GroupAssignor.create("sticky")``; ``seed=`` goes to the shuffled assignor."""
        if name not in ASSIGNORS:
            raise ConfigError(f"unknown assignor {name!r}; choose from {sorted(ASSIGNORS)}")
        seed = options.pop("seed", None)
        pure = ASSIGNORS[name](seed=seed) if seed is not None else ASSIGNORS[name]()  # type: ignore[call-arg]
        return cls(pure, **options)

    @property
    def name(self) -> str:
        return self._name

    def bind(self, consumer: Any) -> GroupAssignor:
        """Remember ``consumer`` (weakly) so this member can ask for follow-up rebalances."""
        self._rejoiner.bind(consumer)
        return self

    # -- member side ----------------------------------------------------------------------------

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        self._epoch += 1
        data = attrs.evolve(
            self._params,
            owned_partitions=self._owned + self._pending,
            generation=self._generation,
            join_epoch=self._epoch,
        )
        return ConsumerProtocolMemberMetadata(0, sorted(topics), data.encode())

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        try:
            data = AssignmentData.decode(assignment.user_data or b"")
        except UserDataError as exc:
            log.warning("unreadable assignment data (%s); treating it as an error", exc)
            data = AssignmentData(error_code=ErrorCode.ASSIGNMENT_ERROR)
        self.last_assignment = data
        if data.error_code != ErrorCode.NONE:
            delay = self._rejoiner.failed()
            log.error(
                "the group leader sent error %s instead of partitions; rejoining in %.0f s",
                data.error_code.name,
                delay,
            )
            return
        self._rejoiner.succeeded()
        self._owned = tuple(TopicPartition(*tp) for tp in assignment.partitions())
        self._pending = data.pending
        self._generation = data.generation
        self._save_state()
        if data.followup:
            self._followups += 1
            if self._followups > self._max_followups:
                log.warning(
                    "%d follow-up rebalances in a row; not asking for more", self._followups
                )
            else:
                self._rejoiner.after(0)
        else:
            self._followups = 0

    def on_generation_assignment(self, generation: int) -> None:
        """Kept for aiokafka versions that may call it; generations come from user data."""

    # -- leader side ----------------------------------------------------------------------------

    def assign(
        self, cluster: Any, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, bytes]:
        """Run the pure assignor; never raises (errors become an error code for everyone)."""
        generation = _next_generation(self._generation)
        counts: dict[str, int] = {}
        subscriptions: dict[str, Subscription] = {}
        try:
            for member, (names, user_data) in readable_subscriptions(
                members, warn_empty=False
            ).items():
                subscriptions[member] = Subscription(names, user_data=user_data)
            for topic in sorted({t for s in subscriptions.values() for t in s.topics}):
                partitions = cluster.partitions_for_topic(topic)
                if partitions is not None:
                    counts[topic] = len(partitions)
            for member, sub in subscriptions.items():
                # Only claims on partitions that exist are built: the assignors drop the rest,
                # and a member's runs cannot make the leader build more than the cluster has.
                data = read_member_data(member, sub.user_data, partitions_per_topic=counts)
                subscriptions[member] = attrs.evolve(
                    sub, owned_partitions=data.owned_partitions, generation=data.generation
                )
                generation = max(generation, _next_generation(data.generation))
            plan = getattr(self.assignor, "plan", None)
            pending: Mapping[str, list[TopicPartition]] = {}
            if plan is not None:
                planned = plan(counts, subscriptions)
                result, followup = planned.assignment, planned.followup_needed
                pending = planned.pending
            else:
                result, followup = self.assignor.assign(counts, subscriptions), False
            validate(result, subscriptions, counts)
            out = {
                m: encode_assignment(
                    result[m],
                    AssignmentData(
                        generation, ErrorCode.NONE, followup, pending.get(m, ())
                    ).encode(),
                )
                for m in members
            }
            self.last_round = LeaderRound(counts, subscriptions, result, generation, followup)
            return out
        except Exception as exc:
            log.exception("assignment failed; sending ASSIGNMENT_ERROR to every member")
            self.last_round = LeaderRound(counts, subscriptions, {}, generation, False, repr(exc))
            return dict.fromkeys(members, _FAILED)

    # -- state file -----------------------------------------------------------------------------

    def _load_state(self) -> None:
        if self._state_file is None or not self._state_file.exists():
            return
        try:
            data = MemberData.decode(self._state_file.read_bytes())
        except (OSError, UserDataError) as exc:
            log.warning("ignoring assignor state %s: %s", self._state_file, exc)
            return
        self._owned, self._generation = data.owned_partitions, data.generation

    def _save_state(self) -> None:
        if self._state_file is None:
            return
        data = MemberData(owned_partitions=self._owned, generation=self._generation).encode()
        try:
            write_atomically(self._state_file, data)
        except OSError as exc:
            # Once per episode (a full disk fails every rebalance's save), naming the state
            # file, not the temporary file beside it whose creation failed.
            if not self._state_unsaved:
                log.warning(
                    "cannot save assignor state to %s: %s (said once until a save works)",
                    self._state_file,
                    exc.strerror or exc,
                )
            self._state_unsaved = True
            return
        if self._state_unsaved:
            log.info("assignor state saved to %s again", self._state_file)
            self._state_unsaved = False
