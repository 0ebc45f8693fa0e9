"""The stateless consumer assignors: range, round robin, failover and shuffled.

Each is a plain function of the normalised ``Problem`` wrapped in a small frozen class that
carries its name and options, like Kafka's built-ins and the custom assignors of the literature.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

import attrs

from ._common import Assignment, Problem, Subscription, prepare
from .userdata import read_member_data


def _split_range(problem: Problem, order_of: list[list[int]], owner: list[int]) -> None:
    """Per topic, contiguous partition ranges over its members in the given order.

    The first ``P % M`` members get one extra partition, as in Kafka's RangeAssignor.
    """
    for t, members in enumerate(order_of):
        if not members:
            continue
        base, extra = divmod(problem.count(t), len(members))
        pid = problem.offsets[t]
        for k, m in enumerate(members):
            n = base + (1 if k < extra else 0)
            owner[pid : pid + n] = [m] * n
            pid += n


@attrs.frozen
class RangeAssignor:
    """Kafka's range assignor: per topic, members sorted by id take contiguous ranges.

    Equal partition numbers of equally sized topics land on the same member, which is what a
    join of co-partitioned topics needs (and why it clusters remainders on the first members).
    """

    name: str = "range"

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> Assignment:
        problem = prepare(partitions_per_topic, subscriptions)
        owner = [-1] * problem.partitions
        _split_range(problem, problem.subscribers(), owner)
        return problem.output(owner)


@attrs.frozen
class RoundRobinAssignor:
    """Kafka's round robin: all partitions in (topic, partition) order dealt to members in
    sorted order, skipping members not subscribed to the partition's topic."""

    name: str = "roundrobin"

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> Assignment:
        problem = prepare(partitions_per_topic, subscriptions)
        owner = [-1] * problem.partitions
        n = len(problem.members)
        cursor = 0
        for t in range(len(problem.topics)):
            if not any(t in s for s in problem.subscribed):
                continue
            for pid in range(problem.offsets[t], problem.offsets[t + 1]):
                while t not in problem.subscribed[cursor % n]:
                    cursor += 1
                owner[pid] = cursor % n
                cursor += 1
        return problem.output(owner)


@attrs.frozen
class FailoverAssignor:
    """Every partition of a topic to its subscriber with the highest priority.

    Priority comes from each member's user data (``MemberData.priority``); ties go to the
    smallest member id. When the primary leaves, everything moves to the next in line: an
    active/passive deployment on one consumer group.
    """

    name: str = "failover"

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> Assignment:
        problem = prepare(partitions_per_topic, subscriptions)
        # Parameters only: history is in owned_partitions, so runs are checked, never built.
        priority = [
            read_member_data(m, s.user_data, partitions_per_topic={}).priority
            for m, s in zip(problem.members, problem.subscriptions, strict=True)
        ]
        owner = [-1] * problem.partitions
        for t, members in enumerate(problem.subscribers()):
            if members:
                best = min(members, key=lambda m: (-priority[m], m))
                owner[problem.offsets[t] : problem.offsets[t + 1]] = [best] * problem.count(t)
        return problem.output(owner)


@attrs.frozen
class ShuffledAssignor:
    """Range assignment over a per-topic shuffled member order.

    Lexicographic order gives every topic's remainder to the same first members (they end up
    with many more partitions when topics are many and small); shuffling the order per topic
    with a seeded generator spreads the remainders while staying deterministic for a seed.
    """

    seed: int = 0
    name: str = "shuffled"

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> Assignment:
        problem = prepare(partitions_per_topic, subscriptions)
        order = problem.subscribers()
        for t, members in enumerate(order):
            # A str seed is hashed with SHA-512: the same order on every run and platform.
            random.Random(f"{self.seed}:{problem.topics[t]}").shuffle(members)
        owner = [-1] * problem.partitions
        _split_range(problem, order, owner)
        return problem.output(owner)
