"""The changelog end-offsets cache the runtime gives the leader (no broker: a fetch function
stands in for the consumer's ``end_offsets``; the broker test exercises the real one)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiokafka import TopicPartition as KafkaTopicPartition
from hypothesis import given
from hypothesis import strategies as st

from streamassign import Subtopology, TaskId, TopicPartition, Topology
from streamassign.protocol import SubscriptionInfo
from streamassign.runtime import App
from streamassign.runtime.end_offsets import (
    COMMITTED_TAIL,
    EndOffsetsCache,
    changelog_partitions,
    committed_ends_fetch,
)
from streamassign.streams import MemberSubscription, client_states

TOPOLOGY = Topology(
    [
        Subtopology(0, ["orders"], stores=["totals", "counts"]),
        Subtopology(1, ["clicks"]),  # stateless: no end offsets
        Subtopology(2, ["users"], stores=["users"]),
    ],
    name="app",
)
COUNTS = {"app-totals-changelog": 3, "app-counts-changelog": 3, "app-users-changelog": 2}
CHANGELOGS = changelog_partitions(TOPOLOGY, COUNTS)
CHANGELOGS_PARTITIONS = sorted({p for ps in CHANGELOGS.values() for p in ps})


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Broker:
    """End offsets by partition; ``missing`` are not answered, ``fail`` raises."""

    def __init__(self, ends: Mapping[TopicPartition, int]) -> None:
        self.ends = dict(ends)
        self.missing: set[TopicPartition] = set()
        self.fail: Exception | None = None
        self.delay = 0.0
        self.calls = 0

    async def fetch(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        self.calls += 1
        await asyncio.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        return {p: self.ends[p] for p in partitions if p not in self.missing}


def ends(value: int) -> dict[TopicPartition, int]:
    return {p: value + p.partition for p in CHANGELOGS_PARTITIONS}


def test_every_stateful_task_owns_its_partition_of_each_changelog() -> None:
    totals, counts, users = "app-totals-changelog", "app-counts-changelog", "app-users-changelog"
    expected: dict[TaskId, tuple[TopicPartition, ...]] = {
        TaskId(0, p): (TopicPartition(counts, p), TopicPartition(totals, p)) for p in range(3)
    }
    expected.update({TaskId(2, p): (TopicPartition(users, p),) for p in range(2)})
    assert changelog_partitions(TOPOLOGY, COUNTS) == expected


def test_sums_per_task_and_a_failed_refresh_keeps_the_last_values() -> None:
    broker = Broker(ends(1000))
    cache = EndOffsetsCache(broker.fetch)
    cache.track(CHANGELOGS)
    assert cache() == {}  # nothing fetched yet: the leader falls back to reported copies
    assert asyncio.run(cache.refresh())
    assert cache() == {
        TaskId(0, 0): 2000,
        TaskId(0, 1): 2002,
        TaskId(0, 2): 2004,
        TaskId(2, 0): 1000,
        TaskId(2, 1): 1001,
    }
    broker.fail = ConnectionError("broker away")
    assert not asyncio.run(cache.refresh())
    assert cache()[TaskId(0, 0)] == 2000


def test_a_task_with_an_unknown_partition_is_left_out_not_understated() -> None:
    broker = Broker(ends(10))
    broker.missing = {TopicPartition("app-counts-changelog", 1)}
    cache = EndOffsetsCache(broker.fetch)
    cache.track(CHANGELOGS)
    asyncio.run(cache.refresh())
    assert TaskId(0, 1) not in cache()
    assert cache()[TaskId(0, 0)] == 20


def test_values_older_than_max_age_are_not_reported() -> None:
    clock, broker = Clock(), Broker(ends(5))
    cache = EndOffsetsCache(broker.fetch, max_age=30, clock=clock)
    cache.track(CHANGELOGS)
    asyncio.run(cache.refresh())
    clock.now += 30
    assert len(cache()) == 5
    clock.now += 1
    assert cache() == {}
    asyncio.run(cache.refresh())
    assert len(cache()) == 5


def test_a_slow_fetch_times_out_and_concurrent_refreshes_share_one_fetch() -> None:
    broker = Broker(ends(7))
    broker.delay = 0.05
    cache = EndOffsetsCache(broker.fetch, timeout=1)
    cache.track(CHANGELOGS)

    async def three() -> list[bool]:
        return list(await asyncio.gather(cache.refresh(), cache.refresh(), cache.refresh()))

    assert asyncio.run(three()) == [True, True, True]
    assert broker.calls == 1
    broker.delay = 0.5
    slow = EndOffsetsCache(broker.fetch, timeout=0.05)
    slow.track(CHANGELOGS)
    assert not asyncio.run(slow.refresh())
    assert slow() == {}


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="> 0"):
        EndOffsetsCache(interval=0)


@given(
    st.dictionaries(
        st.sampled_from(CHANGELOGS_PARTITIONS),
        st.integers(0, 10**12),
    )
)
def test_the_snapshot_is_the_sum_of_each_fully_known_task(
    known: dict[TopicPartition, int],
) -> None:
    broker = Broker(known)
    broker.missing = set(CHANGELOGS_PARTITIONS) - known.keys()
    cache = EndOffsetsCache(broker.fetch)
    cache.track(CHANGELOGS)
    asyncio.run(cache.refresh())
    expected = {
        t: sum(known[p] for p in ps) for t, ps in CHANGELOGS.items() if all(p in known for p in ps)
    }
    assert cache() == expected


def test_the_leader_measures_a_task_without_end_offsets_against_the_best_copy() -> None:
    t0, t1 = TaskId(0, 0), TaskId(0, 1)
    members = {
        "a": MemberSubscription(
            TOPOLOGY.source_topics,
            SubscriptionInfo(uuid.UUID(int=1), offset_sums={t0: 100, t1: 100}),
        ),
        "b": MemberSubscription(
            TOPOLOGY.source_topics, SubscriptionInfo(uuid.UUID(int=2), offset_sums={t1: 900})
        ),
    }
    clients, _, _ = client_states(members, end_offsets={t0: 5000}, acceptable_recovery_lag=10)
    lags = {c.process_id: dict(c.lags) for c in clients}
    assert lags["00000000-0000-0000-0000-000000000001"] == {t0: 4900, t1: 800}
    assert lags["00000000-0000-0000-0000-000000000002"] == {t1: 0}


class Nothing:
    async def process(self, ctx: object, record: object) -> None: ...


def app(state_dir: Path, **options: Any) -> App:
    processors = dict.fromkeys((0, 1, 2), Nothing)
    return App(TOPOLOGY, processors, bootstrap_servers="x:1", state_dir=state_dir, **options)


def test_the_app_leads_with_the_cache_only_when_high_availability_is_on(tmp_path: Path) -> None:
    on = app(
        tmp_path / "on",
        high_availability=True,
        acceptable_recovery_lag=500,
        probing_rebalance_interval_ms=3000,
    )
    assert isinstance(on.end_offsets, EndOffsetsCache)
    assert on.host.end_offsets is on.end_offsets
    assert (on.host.high_availability, on.host.acceptable_recovery_lag) == (True, 500)
    assert on.host.probing_rebalance_interval_ms == 3000
    assert not on.end_offsets.committed
    eos = app(tmp_path / "eos", high_availability=True, processing_guarantee="exactly_once")
    assert eos.end_offsets is not None and eos.end_offsets.committed
    off = app(tmp_path / "off")
    assert off.end_offsets is None and off.host.end_offsets is None
    with pytest.raises(ValueError, match="max_warmup_replicas"):
        app(tmp_path / "bad", high_availability=True, max_warmup_replicas=0)


def test_refresh_soon_returns_at_once_and_the_snapshot_follows() -> None:
    broker = Broker(ends(3))
    broker.delay = 0.05
    cache = EndOffsetsCache(broker.fetch)
    cache.track(CHANGELOGS)

    async def scenario() -> tuple[dict[TaskId, int], dict[TaskId, int]]:
        task = cache.refresh_soon()
        before = cache()  # the rebalance goes on meanwhile
        assert cache.refresh_soon() is task  # one fetch at a time
        await task
        return before, cache()

    before, after = asyncio.run(scenario())
    assert before == {} and len(after) == 5


class CommittedLog:
    """A ``read_committed`` consumer over changelogs given as their committed records'
    offsets and their last stable offsets (the gaps are transaction markers and aborted
    records, which a ``read_committed`` fetch skips). Hands out two records per fetch."""

    def __init__(self, logs: Mapping[TopicPartition, tuple[list[int], int]]) -> None:
        self.logs = {KafkaTopicPartition(*p): log for p, log in logs.items()}
        self.positions: dict[KafkaTopicPartition, int] = {}

    async def end_offsets(self, tps: list[KafkaTopicPartition]) -> dict[KafkaTopicPartition, int]:
        return {tp: self.logs[tp][1] for tp in tps}

    def assign(self, tps: list[KafkaTopicPartition]) -> None:
        self.positions = dict.fromkeys(tps, 0)

    def seek(self, tp: KafkaTopicPartition, offset: int) -> None:
        self.positions[tp] = offset

    async def position(self, tp: KafkaTopicPartition) -> int:
        return self.positions[tp]

    async def getmany(self, *tps: KafkaTopicPartition, timeout_ms: int) -> dict[Any, list[Any]]:
        out = {}
        for tp in tps:
            offsets, stable = self.logs[tp]
            ahead = [o for o in offsets if o >= self.positions[tp]][:2]
            # past the returned records, or past the markers up to the stable offset
            self.positions[tp] = ahead[-1] + 1 if ahead else stable
            out[tp] = [SimpleNamespace(offset=o) for o in ahead]
        return out


def test_exactly_once_a_caught_up_copy_has_lag_0_not_1_per_transaction_marker() -> None:
    """A copy's store position is one past the last committed record (its commit marker);
    the transaction marker after it and aborted records are nobody's lag."""
    totals, counts = TopicPartition("t", 0), TopicPartition("c", 0)
    aborted_tail, empty = TopicPartition("a", 0), TopicPartition("e", 0)
    long_abort = TopicPartition("l", 0)
    log = CommittedLog(
        {
            totals: ([0, 1, 2, 4, 5], 7),  # 3 and 6: transaction markers
            counts: ([0, 1], 3),
            aborted_tail: ([0, 1], 8),  # 2: marker; 3..6 aborted, 7 their abort marker
            empty: ([], 0),
            long_abort: ([0], COMMITTED_TAIL + 5),  # nothing committed in the tail read
        }
    )
    fetch = committed_ends_fetch(cast(Any, log))
    found = asyncio.run(fetch([totals, counts, aborted_tail, empty, long_abort]))
    assert found == {
        totals: 6,
        counts: 2,
        aborted_tail: 2,
        empty: 0,
        long_abort: COMMITTED_TAIL + 5,  # the safe side: the lag overstated, never understated
    }
    cache = EndOffsetsCache(fetch, committed=True)
    cache.track({TaskId(0, 0): (totals, counts)})
    asyncio.run(cache.refresh())
    # the position sum a caught-up copy reports (8), not the stable offsets' (10)
    assert cache() == {TaskId(0, 0): 8}
