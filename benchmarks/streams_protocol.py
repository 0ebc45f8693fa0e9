"""Streams protocol benchmarks: what our subscription and assignment user data weigh on the wire,
and what a rebalance costs on a real broker, side by side with peers in the same run.

1. **Metadata bytes** — 6 co-partitioned topics x 128 partitions, one store, 1 standby, every
   process with an endpoint ``host-NN:8080``: our ``SubscriptionInfo`` and ``AssignmentInfo``
   bytes per member in the second rebalance of a fresh group (members report their running
   tasks as ``LATEST_OFFSET`` and their standbys' checkpointed offset sums), computed by running
   ``assign_streams`` twice; versus the bytes Faust's own ``PartitionAssignor`` puts in the same
   two places for the same assignment (``_streams_peers.faust_metadata``). 100 processes x 1
   consumer and 25 x 4, then a sweep over the group size, and the largest groups whose
   metadata fits the coordinator's 1 MiB record.
2. **Rebalance latency** on a Kafka broker — 2 ``ProcessHost``s x 4 consumers (one asyncio
   process) on a join topology (2 co-partitioned topics x 32 partitions, a store, 1 standby):
   (a) start until every task is assigned, (b) a third host with 2 consumers joins, (c) it
   leaves cleanly; with the leader's time inside ``assign``. Versus 8 + 2 consumers of
   aiokafka's ``RoundRobinPartitionAssignor`` doing the same (the protocol's floor).

Run ``python benchmarks/streams_protocol.py [--quick] [--markdown docs/benchmarks.md]
[--bootstrap HOST:PORT]``; without ``--bootstrap`` a broker is started through
``scripts/kafka.py`` and stopped afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import statistics
import sys
import tempfile
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import attrs
from _common import (
    Report,
    Timed,
    arguments,
    chosen,
    console,
    fmt_bytes,
    fmt_seconds,
    fmt_time,
    kafka_broker,
    machine_info,
    timed,
    write_reports,
)
from _streams_peers import WireSizes, Worker, faust_metadata, round_robin_consumer
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from streamassign import Subtopology, TaskId, Topology
from streamassign.aiokafka import ProcessHost, StreamsAssignor
from streamassign.pipeline.peers import by_topic
from streamassign.protocol import LATEST_OFFSET, AssignmentInfo, SubscriptionInfo
from streamassign.streams import MemberAssignment, MemberSubscription, assign_streams

SECTION = "streams-protocol"
HEADING = "## Streams protocol"

#: Consumer settings of both groups in the latency benchmark (a local broker: short timeouts).
CONSUMER_CONFIG = {
    "session_timeout_ms": 3000,  # also the rebalance timeout (aiokafka's default for it)
    "heartbeat_interval_ms": 100,  # members learn of a rebalance from a heartbeat
    "max_poll_interval_ms": 30_000,
    "retry_backoff_ms": 100,
}
#: Largest record the group coordinator writes by default (offsets topic's max.message.bytes),
#: and the group's metadata is one record.
RECORD_LIMIT = 1_048_588
PHASE_TIMEOUT = 60.0
QUIET = 0.5  # seconds without any assignment before the next phase starts


@dataclass(frozen=True)
class Config:
    """Sizes and repeats of one run; ``--quick`` swaps in small ones."""

    topics: int  # metadata benchmark: co-partitioned source topics
    partitions: int  # ... and their partitions
    standbys: int  # both benchmarks
    groups: Sequence[tuple[int, int]]  # metadata benchmark: (processes, consumers each)
    sweep: Sequence[int]  # ... and processes of one consumer each
    limits: bool  # metadata benchmark: find the largest groups that fit the record limit
    join_partitions: int  # latency benchmark: partitions of each of the 2 joined topics
    repeats: int  # ... and runs of each group

    @property
    def sources(self) -> list[str]:
        return [f"source-{k}" for k in range(self.topics)]


FULL = Config(6, 128, 1, [(100, 1), (25, 4)], [10, 50, 100, 200], True, 32, 15)
QUICK = Config(6, 128, 1, [(20, 1), (5, 4)], [10, 20], False, 32, 1)


def _ratio(peer: float, ours: float) -> str:
    ratio = peer / ours
    return f"{ratio:,.2f}x" if ratio < 10 else f"{ratio:,.0f}x"


# -- 1. metadata bytes -----------------------------------------------------------------------------


def _topology(name: str, topics: Sequence[str]) -> Topology:
    """One stateful subtopology joining ``topics`` (co-partitioned)."""
    return Topology(
        [Subtopology(0, topics, stores=["store"])], copartition_groups=[topics], name=name
    )


@dataclass(frozen=True)
class OursMetadata:
    """Our wire sizes in the second rebalance, one member's assignment (for its parts), and
    the same assignment as Faust workers (one per consumer, ``http://host-NN:808<thread>``)."""

    sizes: WireSizes
    sample: AssignmentInfo
    workers: dict[str, Worker]


def ours_metadata(processes: int, threads: int, cfg: Config) -> OursMetadata:
    """Run ``assign_streams`` on a fresh group, then again with every member reporting its
    process's running tasks (``LATEST_OFFSET``) and standbys' checkpoint sums."""
    sources = cfg.sources
    topology = _topology("bench", sources)
    counts = dict.fromkeys(sources, cfg.partitions)
    process = {f"host-{p:02d}/{t}": p for p in range(processes) for t in range(threads)}
    ids = [uuid.UUID(int=p + 1) for p in range(processes)]

    def subscription(member: str, **kwargs: Any) -> MemberSubscription:
        p = process[member]
        info = SubscriptionInfo(ids[p], f"host-{p:02d}:8080", **kwargs)
        return MemberSubscription(frozenset(sources), info)

    def assign(subs: Mapping[str, MemberSubscription]) -> dict[str, MemberAssignment]:
        return assign_streams(topology, counts, subs, num_standby_replicas=cfg.standbys)

    first = assign({m: subscription(m, join_nonce=1) for m in process})
    rng = random.Random(7)
    sums: dict[int, dict[TaskId, int]] = {p: {} for p in range(processes)}
    for m, p in process.items():
        got = first[m].info
        # Checkpointed changelog offsets of a busy store: tens of millions of records.
        sums[p].update({t: rng.randrange(10**7, 10**8) for t in got.standby})
        sums[p].update(dict.fromkeys(got.active, LATEST_OFFSET))
    subs = {
        m: subscription(m, offset_sums=sums[p], previous_active=first[m].info.active, join_nonce=2)
        for m, p in process.items()
    }
    second = assign(subs)
    moved = [m for m in process if second[m].info.active != first[m].info.active]
    assert not moved, f"a rerun with nothing changed moved the actives of {moved}"
    metadata = [
        ConsumerProtocolMemberMetadata(0, sorted(sources), _user_data(s)).encode()
        for s in subs.values()
    ]
    synced = [  # as StreamsAssignor sends them
        ConsumerProtocolMemberAssignment(0, by_topic(a.partitions), a.info.encode()).encode()
        for a in second.values()
    ]
    workers = {
        m: Worker(
            f"http://host-{p:02d}:{8080 + int(m.split('/')[1])}",
            frozenset(t.partition for t in second[m].info.active),
            frozenset(t.partition for t in second[m].info.standby),
        )
        for m, p in process.items()
    }
    return OursMetadata(WireSizes.of(metadata, synced), second[min(second)].info, workers)


def _user_data(subscription: MemberSubscription) -> bytes:
    assert subscription.info is not None
    return subscription.info.encode()


def host_section_size(encoded: bytes) -> int:
    """Bytes of the host section of an encoded assignment before zlib: the one zlib stream in
    it (level 9: it starts with 78 DA; a false start fails its checksum)."""
    start = encoded.find(b"\x78\xda")
    while start >= 0:
        stream = zlib.decompressobj()
        with contextlib.suppress(zlib.error):
            raw = stream.decompress(encoded[start:])
            if stream.eof:
                return len(raw)
        start = encoded.find(b"\x78\xda", start + 1)
    return 0


def assignment_parts(info: AssignmentInfo) -> list[tuple[str, int]]:
    """Bytes of each part of one encoded assignment, and the total."""
    full = len(info.encode())
    bare = len(attrs.evolve(info, active_by_host={}, standby_by_host={}, topics={}).encode())
    raw = host_section_size(info.encode()) if info.active_by_host or info.standby_by_host else 0
    return [
        ("header, codes, own active + standby tasks", bare),
        ("host section, zlib (topic and endpoint dictionaries, owner vectors)", full - bare),
        ("(host section before zlib)", raw),
        ("total", full),
    ]


@dataclass(frozen=True)
class Section:
    """Tables of one benchmark, and what they say (markdown bullets)."""

    reports: list[Report]
    reading: list[str]


def largest_fitting(total: Callable[[int], int], high: int) -> int:
    """The largest group size up to ``high`` whose metadata ``total(size)`` fits the
    coordinator's record limit (``total`` grows with the size)."""
    low = 0
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if total(mid) <= RECORD_LIMIT else (low, mid - 1)
    return low


def metadata_section(cfg: Config) -> Section:
    """Benchmark 1: the main groups, the parts of our assignment, the sweep, the limits."""
    main = Report(
        f"Metadata bytes: {cfg.topics} co-partitioned topics x {cfg.partitions} partitions, "
        f"{cfg.standbys} standby, second rebalance",
        ["processes x consumers", "what", "ours", "Faust", "Faust / ours"],
        notes=(
            "User data bytes are per member (mean over members); JoinGroup and SyncGroup are "
            "sums over the group of the encoded consumer-protocol metadata (version, topics, "
            "user data) and assignments (version, partitions, user data), member ids aside. "
            "Faust encodes the same assignment, one worker per consumer of ours (Faust runs one "
            "consumer per worker), worker t of host NN at `http://host-NN:808t`. Faust's "
            "assignment is zlib-compressed JSON; the last row of each group is its size "
            "before zlib."
        ),
    )
    cache: dict[tuple[int, int], tuple[OursMetadata, WireSizes]] = {}

    def both(processes: int, threads: int) -> tuple[OursMetadata, WireSizes]:
        """Ours, and Faust's bytes for the same assignment (memoised)."""
        if (processes, threads) not in cache:
            ours = ours_metadata(processes, threads, cfg)
            theirs = faust_metadata(ours.workers, cfg.sources, cfg.partitions, cfg.standbys)
            cache[processes, threads] = ours, theirs
        return cache[processes, threads]

    parts: list[list[tuple[str, int]]] = []
    compared: list[tuple[str, float, float, float]] = []  # group, ours, Faust, Faust's JSON
    totals: list[tuple[str, float, float]] = []  # group, ours, Faust: all user data a member

    squeezed: list[str] = []  # what zlib would make of ours
    for processes, threads in cfg.groups:
        ours, theirs = both(processes, threads)
        group = f"{processes} x {threads}"
        asg, sub = _mean(ours.sizes.assignment), _mean(ours.sizes.subscription)
        raw = _mean(theirs.assignment_json)
        for what, mine, other in [
            ("subscription user data", sub, _mean(theirs.subscription)),
            ("assignment user data", asg, _mean(theirs.assignment)),
            ("JoinGroup response", ours.sizes.join_group, theirs.join_group),
            ("SyncGroup request", ours.sizes.sync_group, theirs.sync_group),
            ("assignment, Faust before zlib", asg, raw),
            (
                "per member: subscription + assignment",
                sub + asg,
                _mean(theirs.subscription) + _mean(theirs.assignment),
            ),
        ]:
            main.add(group, what, fmt_bytes(mine), fmt_bytes(other), _ratio(other, mine))
        parts.append(assignment_parts(ours.sample))
        packed = len(zlib.compress(ours.sample.encode()))
        squeezed.append(
            f"{processes} x {threads}: {packed} B, Faust / ours "
            f"{_ratio(_mean(theirs.assignment), packed)}"
        )
        compared.append((f"{processes} x {threads}", asg, _mean(theirs.assignment), raw))
        totals.append((group, sub + asg, _mean(theirs.subscription) + _mean(theirs.assignment)))

    anatomy = Report(
        "What our assignment user data holds (first member of each group)",
        ["part", *(f"{p} x {t}" for p, t in cfg.groups)],
    )
    for i, (label, _) in enumerate(parts[0]):
        anatomy.add(label, *(f"{col[i][1]} B ({col[i][1] / col[-1][1]:.0%})" for col in parts))

    sweep = Report(
        f"Growth with the group: processes of 1 consumer, {cfg.topics} x {cfg.partitions}",
        [
            "members",
            "subscription: ours",
            "Faust",
            "assignment: ours",
            "Faust",
            "Faust / ours",
            "Join + Sync: ours",
            "Faust",
            "Faust / ours",
        ],
        notes="Per-member user data (mean) and the group's JoinGroup response + SyncGroup request.",
    )
    for n in cfg.sweep:
        ours, theirs = both(n, 1)
        ours_sizes = ours.sizes
        mine, other = _mean(ours_sizes.assignment), _mean(theirs.assignment)
        sweep.add(
            str(n),
            fmt_bytes(_mean(ours_sizes.subscription)),
            fmt_bytes(_mean(theirs.subscription)),
            fmt_bytes(mine),
            fmt_bytes(other),
            _ratio(other, mine),
            fmt_bytes(ours_sizes.total),
            fmt_bytes(theirs.total),
            _ratio(theirs.total, ours_sizes.total),
        )

    verdict = "met" if all(other >= 10 * mine for _, mine, other in totals) else "not met"
    first = parts[0]
    names, maps = first[1][1], first[2][1]  # compressed host section, and before zlib
    processes, threads = cfg.groups[0]
    reading = [
        f"**Target (metadata bytes per member at least 10x smaller than Faust's): {verdict}.** "
        "A member's user data, subscription plus assignment, ours against Faust's: "
        + "; ".join(
            f"{group}: {fmt_bytes(mine)} against {fmt_bytes(other)} ({_ratio(other, mine)})"
            for group, mine, other in totals
        )
        + ". Most of Faust's is its subscription, which echoes the host maps as JSON. The "
        "assignment alone, ours against Faust's: "
        + "; ".join(
            f"{group}: {fmt_bytes(mine)} against {fmt_bytes(other)} (Faust / ours "
            f"{_ratio(other, mine)}; against Faust's JSON before zlib {_ratio(raw, mine)})"
            for group, mine, other, raw in compared
        )
        + ". Both compress: Faust zlib-compresses its assignment JSON; ours zlib-compresses "
        "the host section (endpoint and topic dictionaries and owner vectors: one varint per "
        "task per map). zlib over all of ours would add little: " + "; ".join(squeezed) + ".",
        f"What dominates ours (at {processes} x {threads}): the host section every member "
        f"receives, {names} B compressed ({names / first[-1][1]:.0%}) from {maps} B raw. "
        "Host maps are owner vectors rather than per-host partition lists because the sticky "
        "assignor deals tasks over the processes in turn (process k gets k, k + n, ...), so "
        "per-host runs would all be single partitions. Every member gets the maps, so the "
        "SyncGroup request grows with members x processes, for us as for Faust.",
        "Subscriptions are where ours is far smaller: a Faust worker echoes its whole last "
        "assignment and both host maps, as uncompressed JSON, in every JoinGroup; ours sends "
        "its process id, endpoint and the offset sums of its process's tasks.",
    ]
    if cfg.limits:
        single = largest_fitting(lambda n: ours_metadata(n, 1, cfg).sizes.total, 1024)
        quad = largest_fitting(lambda n: ours_metadata(n, 4, cfg).sizes.total, 256)
        theirs_max = largest_fitting(lambda n: both(n, 1)[1].total, 256)
        reading.append(
            "Group size ceiling: the coordinator keeps every member's subscription and "
            f"assignment in one record of `__consumer_offsets`, at most {RECORD_LIMIT:,} B by "
            "default (checked by hand on the test broker, Kafka 4.3.1: a group whose "
            "assignments add up to more fails SyncGroup with UNKNOWN_SERVER_ERROR, and the "
            "broker logs RecordTooLargeException). JoinGroup + SyncGroup alone (member ids and "
            f"hosts add some 100 B a member) fit up to {single} processes of 1 consumer or "
            f"{quad} processes of 4 with ours, and up to {theirs_max} Faust workers, on this "
            "topology. Compressing the offsets topic (`offsets.topic.compression.codec`) or "
            "raising its `max.message.bytes` are the broker-side ways around it (not tried here)."
        )
    return Section([main, anatomy, sweep], reading)


def _mean(values: Iterable[int]) -> float:
    return statistics.fmean(values)


# -- 2. rebalance latency --------------------------------------------------------------------------


@dataclass
class _Slot:
    consumer: AIOKafkaConsumer
    generation: int
    owned: frozenset[Hashable]


class Tracker:
    """Which generation each consumer of a group last got an assignment of, and what it owns."""

    def __init__(self, universe: frozenset[Hashable]) -> None:
        self.universe = universe
        self.expected: set[str] = set()
        self.slots: dict[str, _Slot] = {}
        self.last = time.perf_counter()  # when a consumer last got an assignment
        self.changed = asyncio.Event()

    def expect(self, keys: Iterable[str]) -> None:
        self.expected.update(keys)

    def forget(self, keys: Iterable[str]) -> None:
        for key in keys:
            self.expected.discard(key)
            self.slots.pop(key, None)

    def assigned(self, key: str, consumer: AIOKafkaConsumer, owned: Iterable[Hashable]) -> None:
        """A consumer's rebalance callback ran: note its generation and share."""
        if key not in self.expected:
            return  # on its way out
        generation = consumer._coordinator.generation
        self.slots[key] = _Slot(consumer, generation, frozenset(owned))
        self.last = time.perf_counter()
        self.changed.set()

    def settled(self) -> int | None:
        """The generation of which every expected consumer holds its share, if the shares are
        complete and disjoint and no consumer has joined a newer one since."""
        if set(self.slots) != self.expected:
            return None
        generations = {s.generation for s in self.slots.values()}
        current = {s.consumer._coordinator.generation for s in self.slots.values()}
        owned = [s.owned for s in self.slots.values()]
        complete = frozenset[Hashable]().union(*owned) == self.universe
        if len(generations) != 1 or current != generations or not complete:
            return None
        return generations.pop() if sum(map(len, owned)) == len(self.universe) else None

    async def settle(self, after: int) -> tuple[float, int]:
        """When the group settled on a generation newer than ``after``, and that generation."""
        deadline = time.perf_counter() + PHASE_TIMEOUT
        while (generation := self.settled()) is None or generation <= after:
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), deadline - time.perf_counter())
            except TimeoutError:
                state = {k: (s.generation, len(s.owned)) for k, s in sorted(self.slots.items())}
                raise TimeoutError(f"no settled group after {PHASE_TIMEOUT:g} s: {state}") from None
        return self.last, generation

    async def quiet(self) -> None:
        """Wait until no consumer got an assignment for ``QUIET`` seconds."""
        while (idle := time.perf_counter() - self.last) < QUIET:
            await asyncio.sleep(QUIET - idle)


@dataclass
class Party:
    """Consumers started and stopped together (a ``ProcessHost``, or round-robin consumers),
    polling while they run as an application would."""

    keys: list[str]
    start_consumers: Callable[[], Awaitable[object]]
    stop_consumers: Callable[[], Awaitable[object]]
    poll: Callable[[], Awaitable[object]]
    polling: asyncio.Task[None] | None = field(default=None, repr=False)

    async def start(self) -> None:
        await self.start_consumers()
        self.polling = asyncio.create_task(self._poll_forever())

    async def stop(self) -> None:
        if self.polling is not None:
            self.polling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.polling
        await self.stop_consumers()

    async def _poll_forever(self) -> None:
        while True:
            await self.poll()


@dataclass(frozen=True)
class Phase:
    """How long a phase took, through how many generations, and when (``perf_counter``)."""

    seconds: float
    rebalances: int
    begin: float
    end: float

    def sum_within(self, events: Iterable[tuple[float, float]]) -> float:
        """Sum of the values of ``(when, value)`` events that happened during the phase."""
        return sum(value for at, value in events if self.begin <= at <= self.end)


PHASES = {
    "first": "(a) 8 consumers start until every task is assigned",
    "join": "(b) +2 consumers join",
    "leave": "(c) the 2 leave cleanly",
}


async def run_phases(first: Sequence[Party], joiner: Party, tracker: Tracker) -> dict[str, Phase]:
    """Start ``first``, let ``joiner`` join, then leave; each until the group settles."""
    phases: dict[str, Phase] = {}
    running: list[Party] = []

    async def phase(name: str, action: Callable[[], Awaitable[object]], after: int) -> int:
        # Members learn of a rebalance from their next heartbeat: start at a random point of
        # the heartbeat cycle, so that neither group is systematically lucky.
        await asyncio.sleep(random.uniform(0, CONSUMER_CONFIG["heartbeat_interval_ms"] / 1000))
        begin = time.perf_counter()
        await action()
        end, generation = await tracker.settle(after)
        phases[name] = Phase(end - begin, generation - after, begin, end)
        await tracker.quiet()
        return generation

    try:
        tracker.expect(key for party in first for key in party.keys)
        running += first
        generation = await phase("first", lambda: asyncio.gather(*(p.start() for p in first)), 0)
        tracker.expect(joiner.keys)
        running.append(joiner)
        generation = await phase("join", joiner.start, generation)
        tracker.forget(joiner.keys)
        running.remove(joiner)
        await phase("leave", joiner.stop, generation)
    finally:
        await asyncio.gather(*(p.stop() for p in running), return_exceptions=True)
    return phases


@dataclass(frozen=True)
class AssignCall:
    """One leader ``assign`` of ours: when it returned, its ``last_assign_ms``, its input."""

    end: float
    ms: float
    assignor: StreamsAssignor
    members: dict[str, ConsumerProtocolMemberMetadata]
    counts: dict[str, int]


@dataclass
class OursRun:
    """One run of ours: its phases, the leader's ``assign`` calls, and the time each
    ``ProcessHost`` spent in its post-rebalance callback, as ``(when, ms)``, and in writing
    its assignment file."""

    phases: dict[str, Phase] = field(default_factory=dict)
    calls: list[AssignCall] = field(default_factory=list)
    callbacks: list[tuple[float, float]] = field(default_factory=list)
    writes: list[tuple[float, float]] = field(default_factory=list)


def _record_assign(assignor: StreamsAssignor, calls: list[AssignCall]) -> None:
    """Keep every leader ``assign`` of ``assignor`` (its input is decoded later, off the clock)."""
    inner = assignor.assign
    topics = sorted(assignor.host.topology.source_topics)

    def assign(
        cluster: Any, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, bytes]:
        out = inner(cluster, members)
        counts = {t: len(cluster.partitions_for_topic(t) or ()) for t in topics}
        ms = assignor.last_assign_ms or 0.0
        calls.append(AssignCall(time.perf_counter(), ms, assignor, dict(members), counts))
        return out

    assignor.assign = assign  # type: ignore[method-assign]


def _host_party(host: ProcessHost, name: str, tracker: Tracker, run: OursRun) -> Party:
    keys = [f"{name}/{i}" for i in range(host.threads)]
    report = host._assigned

    async def assigned(index: int) -> None:
        began = time.perf_counter()
        await report(index)
        ended = time.perf_counter()
        run.callbacks.append((ended, (ended - began) * 1000))
        tracker.assigned(keys[index], host.consumers[index], host.tasks(index).active)

    host._assigned = assigned  # type: ignore[method-assign]  # the integration tests' hook too
    write = host.state.write_assignment

    def timed_write(actives: Mapping[int, frozenset[TaskId]]) -> None:
        began = time.perf_counter()
        write(actives)
        ended = time.perf_counter()
        run.writes.append((ended, (ended - began) * 1000))

    host.state.write_assignment = timed_write  # type: ignore[method-assign]
    return Party(keys, host.start, host.stop, host.poll)


async def ours_once(bootstrap: str, topics: Sequence[str], cfg: Config, work: Path) -> OursRun:
    """One run of the phases with ProcessHosts a, b (4 consumers each) and c (2)."""
    group = f"bench-streams-{uuid.uuid4().hex[:8]}"
    topology = _topology(group, topics)
    tracker = Tracker(frozenset(TaskId(0, p) for p in range(cfg.join_partitions)))
    run = OursRun()

    def party(name: str, threads: int) -> Party:
        host = ProcessHost(
            topology,
            bootstrap_servers=bootstrap,
            state_dir=work / group / name,
            threads=threads,
            endpoint=f"{name}:8080",
            num_standby_replicas=cfg.standbys,
            consumer_config=CONSUMER_CONFIG,
        )
        for assignor in host.assignors:
            _record_assign(assignor, run.calls)
        return _host_party(host, name, tracker, run)

    run.phases = await run_phases([party("a", 4), party("b", 4)], party("c", 2), tracker)
    return run


async def round_robin_once(bootstrap: str, topics: Sequence[str], cfg: Config) -> dict[str, Phase]:
    """One run of the phases with 8 round-robin consumers, then 2 more."""
    group = f"bench-roundrobin-{uuid.uuid4().hex[:8]}"
    universe = frozenset((t, p) for t in topics for p in range(cfg.join_partitions))
    tracker = Tracker(frozenset[Hashable](universe))

    def party(name: str, count: int) -> Party:
        keys = [f"{name}/{i}" for i in range(count)]
        consumers: list[AIOKafkaConsumer] = []

        def on_assigned(i: int) -> Callable[[frozenset[tuple[str, int]]], None]:
            return lambda owned: tracker.assigned(keys[i], consumers[i], owned)

        async def start() -> None:  # created on start, as a ProcessHost creates its consumers
            consumers.extend(
                round_robin_consumer(bootstrap, group, topics, on_assigned(i), CONSUMER_CONFIG)
                for i in range(count)
            )
            await asyncio.gather(*(c.start() for c in consumers))

        return Party(
            keys,
            start,
            lambda: asyncio.gather(*(c.stop() for c in consumers)),
            lambda: asyncio.gather(*(c.getmany(timeout_ms=100) for c in consumers)),
        )

    return await run_phases([party("a", 8)], party("c", 2), tracker)


async def _admin(
    bootstrap: str, create: Sequence[str] = (), delete: Sequence[str] = (), partitions: int = 1
) -> None:
    """Create topics (and wait until every partition has a leader), or delete them."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    await admin.start()
    try:
        if delete:
            await admin.delete_topics(list(delete))
        if not create:
            return
        await admin.create_topics([NewTopic(t, partitions, 1) for t in create])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            described = await admin.describe_topics(list(create))
            leaders = [p["leader"] for t in described for p in t["partitions"]]
            if len(leaders) == partitions * len(create) and min(leaders) >= 0:
                return
            await asyncio.sleep(0.05)
        raise TimeoutError(f"topics {list(create)} have no leaders after 30 s")
    finally:
        await admin.close()


@dataclass
class LatencyRuns:
    """Every repetition of ours and of the peer."""

    ours: list[OursRun] = field(default_factory=list)
    peer: list[dict[str, Phase]] = field(default_factory=list)


async def measure_latency(cfg: Config, bootstrap: str) -> LatencyRuns:
    """Both groups ``cfg.repeats`` times on the same two fresh topics, alternating who goes
    first."""
    suffix = uuid.uuid4().hex[:8]
    topics = [f"bench-left-{suffix}", f"bench-right-{suffix}"]
    await _admin(bootstrap, create=topics, partitions=cfg.join_partitions)
    runs = LatencyRuns()
    try:
        with tempfile.TemporaryDirectory(prefix="streams-protocol-") as work:
            # Untimed: the broker creates __consumer_offsets for the first group, and both
            # sides' code paths get warm.
            aiokafka_log = logging.getLogger("aiokafka")
            level = aiokafka_log.level
            aiokafka_log.setLevel(logging.CRITICAL)
            await ours_once(bootstrap, topics, cfg, Path(work))
            await round_robin_once(bootstrap, topics, cfg)
            aiokafka_log.setLevel(level)
            console.print("latency warm-up done")
            for rep in range(cfg.repeats):
                for which in ("ours", "peer") if rep % 2 == 0 else ("peer", "ours"):
                    if which == "ours":
                        runs.ours.append(await ours_once(bootstrap, topics, cfg, Path(work)))
                    else:
                        runs.peer.append(await round_robin_once(bootstrap, topics, cfg))
                console.print(f"latency run {rep + 1}/{cfg.repeats} done")
    finally:
        await _admin(bootstrap, delete=topics)
    return runs


def _spread(values: Sequence[float]) -> str:
    """Median and range: ``412 ms (380 ms to 530 ms)``."""
    if len(values) == 1:
        return fmt_seconds(values[0])
    low, high = fmt_seconds(min(values)), fmt_seconds(max(values))
    return f"{fmt_seconds(statistics.median(values))} ({low} to {high})"


def _direct(call: AssignCall) -> Timed[object]:
    """``assign_streams`` alone on the input of ``call``."""
    host = call.assignor.host
    subs = {
        m: MemberSubscription(meta.subscription, SubscriptionInfo.decode(meta.user_data))
        for m, meta in call.members.items()
    }

    def run(members: dict[str, MemberSubscription]) -> object:
        return assign_streams(
            host.topology, call.counts, members, num_standby_replicas=host.num_standby_replicas
        )

    return timed(run, lambda: subs, repeats=5, min_total=0.2)


def latency_section(cfg: Config, runs: LatencyRuns, where: str) -> Section:
    """Benchmark 2: one table, and its reading."""
    report = Report(
        f"Rebalance latency: 2 topics x {cfg.join_partitions} partitions, "
        f"{cfg.standbys} standby, 8 consumers",
        [
            "phase",
            "ours",
            "rebalances",
            "leader assign (share)",
            "assign_streams alone",
            "ProcessHost callbacks",
            "round robin",
            "rebalances",
            "ours / round robin",
        ],
        notes=(
            f"{where}. Ours: ProcessHosts a and b (4 consumers each), then c (2 consumers), "
            "all in one asyncio process; round robin: 8 aiokafka consumers, then 2 more, in "
            f"one asyncio process. Median (min to max) of {len(runs.ours)} runs, each on a "
            "fresh group, alternating which group goes first; a phase starts at a random point "
            "of the heartbeat cycle and ends when every consumer holds its share of one "
            "generation and the shares cover every task (partition) once. Rebalances: "
            "generations the group went through (median). Leader assign: the sum of "
            "`StreamsAssignor.last_assign_ms` over the phase (median) and its share of the "
            "phase; assign_streams alone: the input of the phase's last rebalance, timed "
            "without the event loop or the wire codec. ProcessHost callbacks: time spent in "
            "`ProcessHost._assigned` over all consumers during the phase (median)."
        ),
    )
    shares: list[float] = []
    ratios: list[str] = []
    callbacks_ms: list[float] = []
    direct: list[float] = []
    for name, label in PHASES.items():
        ours = [r.phases[name] for r in runs.ours]
        peer = [r[name] for r in runs.peer]
        spent = [r.phases[name].sum_within((c.end, c.ms) for c in r.calls) for r in runs.ours]
        callbacks = statistics.median(r.phases[name].sum_within(r.callbacks) for r in runs.ours)
        share = statistics.median(ms / 1000 / p.seconds for ms, p in zip(spent, ours, strict=True))
        last = [c for c in runs.ours[-1].calls if c.end <= ours[-1].end][-1]
        ratio = _ratio(
            statistics.median(p.seconds for p in ours), statistics.median(p.seconds for p in peer)
        )
        shares.append(share)
        ratios.append(f"{label.split(')')[0]}) {ratio}")
        callbacks_ms.append(callbacks)
        alone = _direct(last)
        direct.append(alone.seconds or 0.0)
        report.add(
            label,
            _spread([p.seconds for p in ours]),
            f"{statistics.median(p.rebalances for p in ours):g}",
            f"{statistics.median(spent):.1f} ms ({share:.1%})",
            fmt_time(alone),
            f"{callbacks:.1f} ms",
            _spread([p.seconds for p in peer]),
            f"{statistics.median(p.rebalances for p in peer):g}",
            ratio,
        )
    heartbeat = CONSUMER_CONFIG["heartbeat_interval_ms"]
    writes = [ms for r in runs.ours for _, ms in r.writes]
    in_writes = sum(p.sum_within(r.writes) for r in runs.ours for p in r.phases.values())
    in_callbacks = sum(p.sum_within(r.callbacks) for r in runs.ours for p in r.phases.values())
    reading = [
        f"The leader's `assign` is {min(shares):.1%} to {max(shares):.1%} of a rebalance here; "
        f"`assign_streams` alone on the same input takes {fmt_seconds(min(direct))} to "
        f"{fmt_seconds(max(direct))} in a timing loop; the rest of `assign` is decoding and "
        "encoding the user data, and running cold once per rebalance. The time goes to the "
        "group protocol: noticing the rebalance (a member learns of it from its next "
        f"heartbeat, every {heartbeat} ms), JoinGroup and SyncGroup round trips, and in phase "
        "(a) aiokafka's retry_backoff_ms after a SyncGroup that lost the race with members "
        "still joining (group.initial.rebalance.delay.ms=0 lets the first member form a "
        "generation on its own).",
        "Against round robin, ours / round robin is " + ", ".join(ratios) + ". Beyond the "
        f"protocol, ours spends {min(callbacks_ms):.0f} to {max(callbacks_ms):.0f} ms a phase "
        f"in `ProcessHost._assigned` (task-change callbacks and bookkeeping), "
        f"{in_writes / in_callbacks:.0%} of it saving the process's last assignment, which "
        "happens in a thread and only when a consumer's actives changed: "
        f"{statistics.median(writes):.1f} ms median, {max(writes):.1f} ms at worst on this "
        "disk.",
        f"Phases (b) and (c) wait for the slowest member's heartbeat, so they spread over "
        f"about one heartbeat interval ({heartbeat} ms) from run to run: compare medians. The "
        "machine has 2 cores shared with the broker (and with other jobs: see the load "
        "average), so absolute times are only good for this run.",
    ]
    return Section([report], reading)


# -- main ------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments(
        __doc__, SECTION, quick="small sizes, one latency run", repeats="latency runs of each group"
    )
    parser.add_argument(
        "--only", choices=["metadata", "latency"], action="append", help="run only these"
    )
    args = parser.parse_args(argv)
    cfg = chosen(args, QUICK, FULL)
    only = args.only or ["metadata", "latency"]
    logging.getLogger("aiokafka").setLevel(logging.ERROR)  # rebalance chatter

    info = machine_info()
    for key, value in info.items():
        console.print(f"[bold]{key}[/]: {value}")
    sections: list[Section] = []
    if "metadata" in only:
        sections.append(metadata_section(cfg))
    if "latency" in only:
        with kafka_broker(args.bootstrap) as (bootstrap, where):
            runs = asyncio.run(measure_latency(cfg, bootstrap))
        sections.append(latency_section(cfg, runs, where))
    for section in sections:
        for report in section.reports:
            report.show()
        for line in section.reading:
            console.print(f"- {line}")
    if args.markdown:
        write_markdown(args.markdown, args.section, argv, info, sections)
    return 0


def write_markdown(
    path: Path,
    name: str,
    argv: Sequence[str] | None,
    info: Mapping[str, str],
    sections: Sequence[Section],
) -> None:
    """Write the results into section ``name`` of ``path`` (adding its heading if absent)."""
    settings = ", ".join(f"{k}={v}" for k, v in CONSUMER_CONFIG.items())
    how = (
        "Run `python benchmarks/streams_protocol.py [--quick] [--markdown docs/benchmarks.md] "
        "[--bootstrap HOST:PORT] [--only metadata|latency] [--repeats N]`. Without "
        "`--bootstrap` it starts a Kafka broker through `scripts/kafka.py` (Java 17+ and "
        "Maven, see docs/testing.md) and stops it afterwards; `--quick` is a smoke run with "
        "small groups and one latency run. What is measured is described in the docstring of "
        "`benchmarks/streams_protocol.py`."
    )
    parts: list[Report | str] = []
    for section in sections:
        parts += section.reports
        parts.append("\n".join(["**Reading.**", "", *(f"- {line}" for line in section.reading)]))
    extra = [f"- **consumer settings (latency)**: {settings}, enable_auto_commit=False"]
    script = "benchmarks/streams_protocol.py"
    write_reports(path, name, how, parts, info, script, argv, extra, under=HEADING)


if __name__ == "__main__":
    sys.exit(main())
