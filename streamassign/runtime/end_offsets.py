"""Changelog end offsets of every stateful task, cached for the group leader's lag computation.

The high-availability assignor moves an active only onto a caught-up copy, and a copy's lag is
the task's changelog end offset minus the offset sum the copy reports (see ``docs/ha.md``).
Whichever process leads needs the end offsets of *every* stateful task, not only its own, and
needs them inside aiokafka's synchronous ``assign``, where no I/O can be awaited. So a non-group
consumer fetches them in the background (every few seconds, and as each rebalance starts
through ``refresh_soon``), and the cache, called, returns the last snapshot without any I/O.

A refresh is bounded (``timeout``) and per partition: the fetch records each partition's end as
soon as it knows it, and at the deadline (or on an error) the cache keeps what was recorded;
every other partition keeps its previous value (until ``max_age``). The end offsets come from
one ``ListOffsets`` call, or, when a partition without a leader holds it, one call a partition
(``list_offsets``).

Exactly once (``committed=True``), a changelog ends with a transaction marker (and may end with
aborted records), which no store position counts: a caught-up copy's position is one past the
last *committed* commit marker (``changelog.COMMIT_KEY``). So the cache reports that instead of
the log end (``committed_ends_fetch``): it reads each partition ``read_committed`` backwards
from the last stable offset in growing windows (16 offsets, then 32, 64, ...) until a window
holds a committed marker, or down to where the previous refresh found one, or to offset 0. A
partition whose last stable offset has not moved since is not read at all, and a search cut by
the deadline goes on from where it stopped at the next refresh.

Safe fallback: a task whose end offsets are unknown (not fetched yet, fetch failing, older than
``max_age``) is left out of the snapshot, and the leader treats that task as it treats tasks
without end offsets: never with a lag of 0 it cannot know.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping, Sequence
from typing import Any

import attrs
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.errors import KafkaError, LeaderNotAvailableError, for_code
from aiokafka.protocol.offset import OffsetRequest

from .. import TaskId, TopicPartition
from ..errors import EndOffsetsTimeoutError, RuntimeConfigError
from ..topology import Topology
from .changelog import COMMIT_KEY

log = logging.getLogger("streamassign.runtime")

#: Fetches the end offsets of changelog partitions, recording each in the mapping it is given
#: as soon as it is known (unknown ones may be left out); cancelled at the cache's deadline.
Fetch = Callable[[Sequence[TopicPartition], MutableMapping[TopicPartition, int]], Awaitable[None]]


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
        """Fetch every tracked partition's end offset now; False when some partition got
        none (the fetch failed, timed out or left it out): the partitions it recorded are
        updated, the others keep their previous values. Concurrent callers share one fetch."""
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
        found: dict[TopicPartition, int] = {}
        complete = True
        try:
            await asyncio.wait_for(self.fetch(partitions, found), self.timeout)
        except Exception as exc:  # the broker is away or slow: keep the last values, retry later
            log.warning(
                "changelog end offsets of %d of %d partition(s) not refreshed (%r)",
                len(set(partitions) - found.keys()),
                len(partitions),
                exc,
            )
            complete = False
        now = self._clock()
        for p in partitions:
            if p in found:
                self._known[p] = (int(found[p]), now)
        self._rebuild()
        return complete and found.keys() >= set(partitions)

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
                auto_offset_reset="earliest",  # a window below a compacted log start reads on
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


#: Seconds the one ``ListOffsets`` call for every partition may take before each partition is
#: asked on its own (one without a leader holds the whole call: aiokafka retries it), and then
#: the most those single calls may take.
LIST_TIMEOUT = 2.0


async def list_offsets(
    consumer: AIOKafkaConsumer, tps: Sequence[KafkaTopicPartition]
) -> dict[KafkaTopicPartition, int]:
    """End offsets (last stable offsets ``read_committed``) of ``tps``: one call for all, or,
    when that does not answer within ``LIST_TIMEOUT``, one call each, keeping those that
    answered within ``LIST_TIMEOUT`` more (none: the first error is raised)."""
    try:
        ends = await asyncio.wait_for(consumer.end_offsets(list(tps)), LIST_TIMEOUT)
        return {tp: int(o) for tp, o in ends.items()}
    except (KafkaError, TimeoutError) as exc:
        if len(tps) <= 1:
            raise
        log.info("end offsets of %d partitions not listed at once (%r); one by one", len(tps), exc)
    calls = [asyncio.ensure_future(consumer.end_offsets([tp])) for tp in tps]
    try:
        done, _ = await asyncio.wait(calls, timeout=LIST_TIMEOUT)
    finally:  # also when the refresh's deadline cancels us: nothing left running
        for call in calls:
            call.cancel()
    found = {
        tp: int(o) for call in done if call.exception() is None for tp, o in call.result().items()
    }
    if not found:
        errors = [call.exception() for call in done if call.exception() is not None]
        raise (
            errors[0]
            if errors
            else EndOffsetsTimeoutError(
                f"no end offset of {len(tps)} partitions listed within {LIST_TIMEOUT:g} s "
                f"({partition_names(tps, most=8)})"
            )
        )
    return found


#: ``ListOffsets``: the latest offset; isolation level read_uncommitted.
_LATEST = -1
_READ_UNCOMMITTED = 0


async def high_watermarks(
    consumer: AIOKafkaConsumer, tps: Sequence[KafkaTopicPartition]
) -> dict[KafkaTopicPartition, int]:
    """High watermarks (the ends read_uncommitted) of ``tps``, whatever ``consumer``'s own
    isolation level: read_committed, ``end_offsets`` gives the last stable offset, which
    lags a just-committed transaction until its markers are written. Asked of each
    partition's leader as the consumer's metadata knows it (aiokafka has no public way to
    ask with another isolation level); raises ``KafkaError`` (a leader unknown, or an error
    in the answer)."""
    client: Any = consumer._client
    by_node: dict[int, dict[str, list[tuple[int, int]]]] = {}
    for tp in tps:
        node = client.cluster.leader_for_partition(tp)
        if node is None or node < 0:
            raise LeaderNotAvailableError(f"no leader known for {tp.topic}[{tp.partition}]")
        by_node.setdefault(node, {}).setdefault(tp.topic, []).append((tp.partition, _LATEST))
    requests = [
        client.send(node, OffsetRequest(-1, _READ_UNCOMMITTED, list(topics.items())))
        for node, topics in by_node.items()
    ]
    found = {}
    for response in await asyncio.gather(*requests):
        for topic, partitions in response.topics:
            for partition, code, *info in partitions:
                if code != 0:
                    raise for_code(code)(f"high watermark of {topic}[{partition}]")
                offset = info[-1] if response.API_VERSION > 0 else info[0][0]
                found[KafkaTopicPartition(topic, partition)] = int(offset)
    return found


def partition_names(tps: Iterable[Any], most: int | None = None) -> str:
    """``tps`` (topic partitions of either kind) as ``topic[p]``, sorted, without repeats;
    the first ``most`` of them (the rest counted)."""
    names = sorted({(tp.topic, tp.partition) for tp in tps})
    shown = ", ".join(f"{t}[{p}]" for t, p in names[:most])
    return shown + (
        f" and {len(names) - most} more" if most is not None and len(names) > most else ""
    )


def _consumer_fetch(consumer: AIOKafkaConsumer) -> Fetch:
    async def fetch(
        partitions: Sequence[TopicPartition], found: MutableMapping[TopicPartition, int]
    ) -> None:
        ends = await list_offsets(consumer, [KafkaTopicPartition(*p) for p in partitions])
        found.update({TopicPartition(tp.topic, tp.partition): o for tp, o in ends.items()})

    return fetch


#: How many offsets below the last stable offset ``committed_ends_fetch`` reads first (a
#: commit's tail is its store markers, then one transaction marker); each next window below
#: is twice as long as the one before.
COMMITTED_TAIL = 16


@attrs.define
class _Scan:
    """The backward search for one partition's last committed marker below ``stable``."""

    #: The partition's last stable offset when the search started.
    stable: int
    #: No committed marker needs to be looked for below ``floor``; the end is ``below`` when
    #: none is found in ``[floor, stable)`` (what an earlier search found, or 0).
    floor: int
    below: int
    #: The window being read, ``[lo, hi)``; every offset in ``[hi, stable)`` holds no
    #: committed marker.
    lo: int = 0
    hi: int = 0
    #: Offset of the highest committed marker read in the window.
    last: int | None = None

    def __attrs_post_init__(self) -> None:
        self.hi = self.stable
        self.lo = max(self.floor, self.stable - COMMITTED_TAIL)

    def widen(self) -> bool:
        """Move to the next window below, twice as long; False at the floor."""
        if self.lo <= self.floor:
            return False
        size = 2 * (self.hi - self.lo)
        self.hi, self.lo = self.lo, max(self.floor, self.lo - size)
        return True

    @property
    def end(self) -> int:
        return self.last + 1 if self.last is not None else self.below


class _CommittedEnds:
    """``committed_ends_fetch``'s state: what earlier fetches found, per partition."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self.consumer = consumer
        #: Per partition: (last stable offset, one past the last committed marker below it).
        self.known: dict[KafkaTopicPartition, tuple[int, int]] = {}
        #: Searches a deadline cut, to go on with while the stable offset stays.
        self.unfinished: dict[KafkaTopicPartition, _Scan] = {}

    async def __call__(
        self, partitions: Sequence[TopicPartition], found: MutableMapping[TopicPartition, int]
    ) -> None:
        tps = [KafkaTopicPartition(*p) for p in partitions]
        stable = await list_offsets(self.consumer, tps)
        scans = {}
        for tp, offset in stable.items():
            scan = self._scan_for(tp, offset)
            if scan.lo < scan.hi:
                scans[tp] = scan
            else:  # nothing to read: the last stable offset did not move
                self._found(tp, scan, found)
        if scans:
            await self._read(scans, found)

    def _scan_for(self, tp: KafkaTopicPartition, stable: int) -> _Scan:
        cut = self.unfinished.pop(tp, None)
        if cut is not None and cut.stable == stable:
            return cut
        before, end = self.known.get(tp, (0, 0))
        if before > stable:  # the partition was recreated or truncated: search it all
            before, end = 0, 0
        return _Scan(stable, before, end)

    def _found(
        self, tp: KafkaTopicPartition, scan: _Scan, found: MutableMapping[TopicPartition, int]
    ) -> None:
        self.known[tp] = (scan.stable, scan.end)
        found[TopicPartition(tp.topic, tp.partition)] = scan.end

    async def _read(
        self, scans: dict[KafkaTopicPartition, _Scan], found: MutableMapping[TopicPartition, int]
    ) -> None:
        """Read every window of ``scans`` at once; a partition done is paused, and at the end
        (or when cancelled) the consumer is unassigned, so nothing is fetched in between."""
        consumer = self.consumer
        reading = set(scans)
        consumer.assign(sorted(reading))
        try:
            for tp, scan in scans.items():
                consumer.seek(tp, scan.lo)
            while reading:
                batch = await consumer.getmany(*reading, timeout_ms=200)
                for tp, records in batch.items():
                    scan = scans[tp]
                    for r in records:
                        if scan.lo <= r.offset < scan.hi and r.key == COMMIT_KEY:
                            scan.last = r.offset
                for tp in sorted(reading):
                    scan = scans[tp]
                    if await consumer.position(tp) < scan.hi:
                        continue
                    if scan.last is None and scan.widen():
                        consumer.seek(tp, scan.lo)
                        continue
                    reading.discard(tp)
                    consumer.pause(tp)
                    self._found(tp, scan, found)
        finally:
            for tp in reading:  # cut by the deadline: go on from here next time
                if scans[tp].last is None:
                    self.unfinished[tp] = scans[tp]
            consumer.assign([])


def committed_ends_fetch(consumer: AIOKafkaConsumer) -> Fetch:
    """Exactly once: one past the last committed commit marker of each partition (what a
    caught-up copy's store position is), read on ``consumer`` (``read_committed``, no group,
    ``auto_offset_reset="earliest"``; see the module doc)."""
    return _CommittedEnds(consumer)
