"""Changelog end offsets of every stateful task, cached for the group leader's lag computation.

The high-availability assignor moves an active only onto a caught-up copy, and a copy's lag is
the task's changelog end offset minus the offset sum the copy reports (see ``docs/ha.md``).
Whichever process leads needs the end offsets of *every* stateful task, not only its own, and
needs them inside aiokafka's synchronous ``assign``, where no I/O can be awaited. So a non-group
consumer fetches them in the background (every few seconds, and as each rebalance starts
through ``refresh_soon``), and the cache, called, returns the last snapshot without any I/O.

Exactly once (``committed=True``), a changelog ends with a transaction marker (and may end with
aborted records), which no store position counts: a caught-up copy's position is one past the
last *committed* record. So the cache reports that instead of the log end: it reads each
partition's last few records ``read_committed`` up to the last stable offset (one fetch per
refresh); when the tail holds no committed record (a long aborted transaction at the end) it
reports the last stable offset, overstating the lag rather than understating it.

Safe fallback: a task whose end offsets are unknown (not fetched yet, fetch failing, older than
``max_age``) is left out of the snapshot, and the leader treats that task as it treats tasks
without end offsets: never with a lag of 0 it cannot know.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTopicPartition

from .. import TaskId, TopicPartition
from ..errors import RuntimeConfigError
from ..topology import Topology

log = logging.getLogger("streamassign.runtime")

#: Fetches the end offsets of changelog partitions (unknown ones may be left out).
Fetch = Callable[[Sequence[TopicPartition]], Awaitable[Mapping[TopicPartition, int]]]


def changelog_partitions(
    topology: Topology, counts: Mapping[str, int]
) -> dict[TaskId, tuple[TopicPartition, ...]]:
    """The changelog partitions of every stateful task: task ``s_p`` owns partition ``p`` of
    each changelog of subtopology ``s``. ``counts``: partition count by changelog topic (as
    ``ensure_internal_topics`` returns them)."""
    out: dict[TaskId, tuple[TopicPartition, ...]] = {}
    for sub in topology.subtopologies:
        topics = topology.changelog_topics(sub.id)
        if not topics:
            continue
        for p in range(min(counts[t] for t in topics)):
            out[TaskId(sub.id, p)] = tuple(TopicPartition(t, p) for t in topics)
    return out


class EndOffsetsCache:
    """Summed changelog end offsets per stateful task; call it for the last snapshot.

    ``fetch`` reads end offsets (``start`` makes one on a plain consumer when none is given);
    ``interval``: seconds between background refreshes; ``timeout``: the longest a refresh
    may take; ``max_age``: seconds after which a task's value is no longer reported;
    ``committed``: report where committed records end (exactly once, see the module doc).
    """

    def __init__(
        self,
        fetch: Fetch | None = None,
        *,
        interval: float = 5.0,
        timeout: float = 5.0,
        max_age: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        committed: bool = False,
    ) -> None:
        if interval <= 0 or timeout <= 0 or max_age <= 0:
            raise RuntimeConfigError("interval, timeout and max_age must be > 0")
        self.fetch = fetch
        self.interval = interval
        self.timeout = timeout
        self.max_age = max_age
        self.committed = committed
        self._clock = clock
        self._tasks: dict[TaskId, tuple[TopicPartition, ...]] = {}
        #: Last known end offset of each partition, and when it was fetched.
        self._known: dict[TopicPartition, tuple[int, float]] = {}
        self._snapshot: dict[TaskId, tuple[int, float]] = {}
        self._inflight: asyncio.Task[bool] | None = None
        self._loop: asyncio.Task[None] | None = None
        self._consumer: AIOKafkaConsumer | None = None

    def track(self, changelogs: Mapping[TaskId, Iterable[TopicPartition]]) -> None:
        """The tasks to report and their changelog partitions (see ``changelog_partitions``)."""
        self._tasks = {t: tuple(ps) for t, ps in changelogs.items() if ps}
        self._rebuild()

    def __call__(self) -> dict[TaskId, int]:
        """Each task's summed changelog end offsets, for tasks known and fresh (no I/O)."""
        oldest = self._clock() - self.max_age
        return {t: total for t, (total, at) in self._snapshot.items() if at >= oldest}

    async def refresh(self) -> bool:
        """Fetch every tracked partition's end offset now; False when the fetch failed or
        timed out (the previous values stay). Concurrent callers share one fetch."""
        return await asyncio.shield(self.refresh_soon())

    def refresh_soon(self) -> asyncio.Task[bool]:
        """Start a refresh (or join the one running) without waiting for it: at a rebalance,
        the leader's ``assign`` comes after every member rejoined, and a member that is slow to
        rejoin (past the rebalance timeout) is dropped from the group."""
        if self._inflight is None or self._inflight.done():
            self._inflight = asyncio.create_task(self._refresh())
        return self._inflight

    async def _refresh(self) -> bool:
        if self.fetch is None or not self._tasks:
            return False
        partitions = sorted({p for ps in self._tasks.values() for p in ps})
        try:
            ends = await asyncio.wait_for(self.fetch(partitions), self.timeout)
        except Exception as exc:  # the broker is away: keep the last values, retry later
            log.warning("changelog end offsets not refreshed (%r)", exc)
            return False
        now = self._clock()
        for p in partitions:
            if p in ends:
                self._known[p] = (int(ends[p]), now)
        self._rebuild()
        return True

    def _rebuild(self) -> None:
        snapshot = {}
        for task, partitions in self._tasks.items():
            found = [self._known[p] for p in partitions if p in self._known]
            if len(found) == len(partitions):  # a partial sum would understate the lag
                snapshot[task] = (sum(e for e, _ in found), min(at for _, at in found))
        self._snapshot = snapshot

    async def start(
        self, bootstrap_servers: str, connection: Mapping[str, Any] | None = None
    ) -> None:
        """Fetch once (so the first rebalance already has them), then every ``interval``;
        ``connection``: TLS/SASL settings of the consumer that fetches them."""
        if self.fetch is None:
            self._consumer = AIOKafkaConsumer(
                bootstrap_servers=bootstrap_servers,
                enable_auto_commit=False,
                isolation_level="read_committed" if self.committed else "read_uncommitted",
                **dict(connection or {}),
            )
            await self._consumer.start()
            fetch = committed_ends_fetch if self.committed else _consumer_fetch
            self.fetch = fetch(self._consumer)
        await self.refresh()
        self._loop = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.refresh()

    async def stop(self) -> None:
        for task in (self._loop, self._inflight):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._loop = self._inflight = None
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None


def _consumer_fetch(consumer: AIOKafkaConsumer) -> Fetch:
    async def fetch(partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        ends = await consumer.end_offsets([KafkaTopicPartition(*p) for p in partitions])
        return {TopicPartition(tp.topic, tp.partition): int(o) for tp, o in ends.items()}

    return fetch


#: How many offsets before the last stable offset ``committed_ends_fetch`` reads: a commit's
#: tail is its store markers, then one transaction marker.
COMMITTED_TAIL = 16


def committed_ends_fetch(consumer: AIOKafkaConsumer) -> Fetch:
    """Exactly once: one past the last committed record of each partition (what a caught-up
    copy's store position is), read on ``consumer`` (``read_committed``, no group)."""

    async def fetch(partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        tps = [KafkaTopicPartition(*p) for p in partitions]
        stable = {tp: int(o) for tp, o in (await consumer.end_offsets(tps)).items()}
        ends = dict(stable)  # the fallback: a tail without committed records
        todo = {tp for tp, end in stable.items() if end > 0}
        consumer.assign(sorted(todo))
        for tp in todo:
            consumer.seek(tp, max(0, stable[tp] - COMMITTED_TAIL))
        while todo:
            for tp, records in (await consumer.getmany(*todo, timeout_ms=200)).items():
                offsets = [r.offset for r in records if r.offset < stable[tp]]
                if offsets:
                    ends[tp] = max(offsets) + 1
            todo = {tp for tp in todo if await consumer.position(tp) < stable[tp]}
        return {TopicPartition(tp.topic, tp.partition): end for tp, end in ends.items()}

    return fetch
