"""Re-fetching metadata of topics a worker subscribes to but has no metadata for.

aiokafka fetches metadata of its subscribed topics when the subscription changes and then only
every ``metadata_max_age_ms`` (Faust: 5 minutes): a topic that did not exist yet at the
subscription (Faust creates changelog, repartition and leader topics while the workers join)
stays unknown that long, and a rejoin does not refresh it either (the topics did not change).
So a worker that misses topics asks its client for fresh metadata with growing pauses until it
has them all. On the group leader that is all a repair needs: aiokafka's leader rejoins by
itself when a refresh changes the partition count of a subscribed topic (0 -> n).

The client is reached through ``consumer._client`` (aiokafka 0.11-0.14, like
``streamassign.aiokafka._rejoin``), and only with ``getattr`` guards.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("streamassign.faust")


def unsized(consumer: Any, topics: Iterable[str]) -> frozenset[str]:
    """Those of ``topics`` the consumer's client has no partitions of (all when unknown)."""
    cluster = getattr(getattr(consumer, "_client", None), "cluster", None)
    if cluster is None:
        return frozenset(topics)
    return frozenset(t for t in topics if not cluster.partitions_for_topic(t))


class MetadataWatch:
    """Re-fetches metadata after ``first``, then doubling pauses up to ``longest`` seconds,
    until the client knows every watched topic; ``watch`` replaces what is watched."""

    def __init__(self, first: float = 0.5, longest: float = 10.0) -> None:
        self._first, self._longest = first, longest
        self._timer: asyncio.TimerHandle | None = None
        self.topics: frozenset[str] = frozenset()

    def watch(self, consumer: Any, topics: Iterable[str]) -> None:
        """Watch ``topics`` (nothing: stop) on ``consumer``'s client; refreshes right away."""
        self.cancel()
        self.topics = frozenset(topics)
        if self.topics:
            self._refresh(consumer, self._first)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _refresh(self, consumer: Any, pause: float) -> None:
        client: Any = getattr(consumer, "_client", None)
        if getattr(client, "force_metadata_update", None) is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop to wait on (unit tests call the assignor directly)
            return
        for topic in sorted(self.topics):
            client.add_topic(topic)  # tracked (a member may not subscribe to it yet)
        client.force_metadata_update()
        self._timer = loop.call_later(pause, self._check, consumer, pause)

    def _check(self, consumer: Any, pause: float) -> None:
        self._timer = None
        missing = unsized(consumer, self.topics)
        if not missing:
            log.info("metadata of %s arrived", sorted(self.topics))
            self.topics = frozenset()
            return
        self.topics = missing
        log.debug("still no metadata for %s; asking again", sorted(missing))
        self._refresh(consumer, min(pause * 2, self._longest))
