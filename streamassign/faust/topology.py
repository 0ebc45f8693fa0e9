"""Faust-style topologies: tasks for an app that declares no topology, from what its members
subscribe to (``docs/topology.md``, "Faust-style mode"). Pure: no Faust, no aiokafka.

Faust co-partitions every topic of one partition count; here topics with equal partition counts
and the same set of subscribing members form one subtopology, with a stable id.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Mapping

from ..errors import TopologyError, TopologyTypeError
from ..grouper import checked_partition_counts
from ..topology import Subtopology, Topology, changelog_topic_name

__all__ = ["FAUST_HASHED_ID_BASE", "faust_style_topology"]

logger = logging.getLogger(__name__)

#: Faust-style subtopology ids below this are partition counts; disambiguated ids (several
#: subscriber groups sharing one count) are hashed into ``[FAUST_HASHED_ID_BASE, 2**31)``.
FAUST_HASHED_ID_BASE = 1 << 20
_HASHED_ID_SPAN = (1 << 31) - FAUST_HASHED_ID_BASE


def _hashed_id(count: int, topics: tuple[str, ...]) -> int:
    digest = hashlib.blake2b(f"{count}:{','.join(topics)}".encode(), digest_size=8).digest()
    return FAUST_HASHED_ID_BASE + int.from_bytes(digest, "big") % _HASHED_ID_SPAN


def _next_hashed_id(sid: int) -> int:
    """The id probed after ``sid`` on a collision: the next one, wrapping within the hashed
    range so it stays below 2**31 (a subtopology id is an int32 on the wire)."""
    return FAUST_HASHED_ID_BASE + (sid - FAUST_HASHED_ID_BASE + 1) % _HASHED_ID_SPAN


def faust_style_topology(
    subscriptions: Mapping[str, Iterable[str]],
    partition_counts: Mapping[str, int],
    *,
    name: str = "",
    stores: Mapping[str, str] | None = None,
) -> Topology:
    """A topology for an application that declares none, from what its members subscribe to.

    Topics with equal partition counts and the same set of subscribing members form one
    subtopology, and are co-partitioned. Subtopology ids are stable (see ``docs/topology.md``):

    * a group that is alone with its partition count ``n`` gets id ``n``;
    * when several groups share ``n``, the one whose subscribers include every other group's
      keeps ``n`` (if none does: the one with the most topics, ties: the smallest first topic
      name), the others get
      ``FAUST_HASHED_ID_BASE + blake2b(n, topics) mod (2**31 - FAUST_HASHED_ID_BASE)``,
      probing upward on the (rare) collision.

    So ids never depend on member ids, adding a topic with a new count renumbers nothing, and a
    member joining with an existing member's subscription changes nothing. Topics absent from
    ``partition_counts`` are left out with a warning. ``stores`` maps a store (Faust table) name to
    a source topic that feeds it; the store joins that topic's subtopology, and its changelog
    ``<name>-<store>-changelog`` is removed from the sources (Faust members subscribe to it).
    """
    stores = dict(stores or {})
    if stores and not name:
        raise TopologyError("faust_style_topology: stores need the application name (name=...)")
    changelogs = {changelog_topic_name(name, store) for store in stores}
    subscribers = _subscribers_by_topic(subscriptions, changelogs)
    counts = _sized_counts(subscribers, partition_counts)
    ids = _subtopology_ids(counts, subscribers)
    group_stores = _stores_by_group(stores, ids, subscribers)
    subtopologies = [
        Subtopology(sid, group, group_stores.get(group, ())) for group, sid in ids.items()
    ]
    return Topology(subtopologies, [g for g in ids if len(g) > 1], name=name)


def _subscribers_by_topic(
    subscriptions: Mapping[str, Iterable[str]], changelogs: set[str]
) -> dict[str, set[str]]:
    """The members subscribing to each topic, store changelogs left out."""
    subscribers: dict[str, set[str]] = {}
    for member, topics in subscriptions.items():
        if isinstance(topics, (str, bytes)):
            raise TopologyTypeError(
                f"subscription of {member!r} must be a list of topics, not {topics!r}"
            )
        for topic in topics:
            if topic not in changelogs:
                subscribers.setdefault(topic, set()).add(member)
    return subscribers


def _sized_counts(
    subscribers: Mapping[str, set[str]], partition_counts: Mapping[str, int]
) -> dict[str, int]:
    """Partition counts of the subscribed topics that have one (the others logged)."""
    missing = sorted(t for t in subscribers if t not in partition_counts)
    if missing:
        logger.warning(
            "faust-style topology: leaving out subscribed topics with no partition count "
            "(not created yet, or not authorized to read?): %s",
            ", ".join(missing),
        )
    counts = checked_partition_counts(
        [t for t in subscribers if t in partition_counts], partition_counts
    )
    too_large = sorted(f"{t}:{n}" for t, n in counts.items() if n >= FAUST_HASHED_ID_BASE)
    if too_large:
        raise TopologyError(
            f"faust_style_topology: partition counts of {FAUST_HASHED_ID_BASE} or more would "
            f"collide with hashed subtopology ids: {', '.join(too_large)}"
        )
    return counts


def _subtopology_ids(
    counts: Mapping[str, int], subscribers: Mapping[str, set[str]]
) -> dict[tuple[str, ...], int]:
    """Groups (topics of one count and one set of subscribers) with their stable ids."""
    by_key: dict[tuple[int, frozenset[str]], list[str]] = {}
    for topic, n in counts.items():
        by_key.setdefault((n, frozenset(subscribers[topic])), []).append(topic)
    by_count: dict[int, list[tuple[frozenset[str], tuple[str, ...]]]] = {}
    for (n, members), topics in by_key.items():
        by_count.setdefault(n, []).append((members, tuple(sorted(topics))))
    ids: dict[tuple[str, ...], int] = {}
    hashed: list[tuple[int, tuple[str, ...]]] = []
    for n, groups in by_count.items():
        plain = _plain_group(groups)
        ids[plain] = n
        hashed.extend((n, g) for _members, g in groups if g != plain)
    taken: set[int] = set()
    for n, group in sorted(hashed):
        sid = _hashed_id(n, group)
        while sid in taken:
            sid = _next_hashed_id(sid)
        taken.add(sid)
        ids[group] = sid
    return ids


def _plain_group(groups: list[tuple[frozenset[str], tuple[str, ...]]]) -> tuple[str, ...]:
    """The topics of the group (subscribers, topics) that keeps its count as its id: the one
    whose subscribers include every other group's, if there is one, else the one with the most
    topics (ties: the smallest first topic).

    A rolling deploy that adds topics of a running group's count leaves the running group read
    by every worker and the new one by the upgraded workers only (a roll-back, the reverse),
    so the running group keeps its id and its tasks their names, where the topic count gave
    the id to a new group of as many topics (the running table group was renamed twice).
    Inclusion, not the number of subscribers: a member joining with another's subscription
    joins exactly that member's groups, which keeps every inclusion as it was, so ids still
    never change when one joins (a count could tip over)."""
    for members, topics in groups:
        if all(other <= members for other, _topics in groups):
            return topics
    return min((topics for _members, topics in groups), key=lambda g: (-len(g), g[0]))


def _stores_by_group(
    stores: Mapping[str, str],
    ids: Mapping[tuple[str, ...], int],
    subscribers: Mapping[str, set[str]],
) -> dict[tuple[str, ...], list[str]]:
    """The stores of each group: those fed by one of its topics."""
    owner = {topic: group for group in ids for topic in group}
    group_stores: dict[tuple[str, ...], list[str]] = {}
    for store, topic in sorted(stores.items()):
        if topic in owner:
            group_stores.setdefault(owner[topic], []).append(store)
        elif topic in subscribers:
            logger.warning(
                "faust-style topology: leaving out store %r: its topic %r has no partition count",
                store,
                topic,
            )
        else:
            raise TopologyError(
                f"faust_style_topology: store {store!r} is fed by {topic!r}, which no member "
                "subscribes to"
            )
    return group_stores
