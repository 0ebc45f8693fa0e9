"""The changelog end-offsets cache the runtime gives the leader (no broker: a fetch function
stands in for the consumer's ``end_offsets``; the broker test exercises the real one)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiokafka import TopicPartition as KafkaTopicPartition
from hypothesis import given
from hypothesis import strategies as st

import streamassign.runtime.end_offsets as end_offsets_module
from streamassign import Subtopology, TaskId, TopicPartition, Topology
from streamassign.errors import EndOffsetsTimeoutError
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

    async def fetch(
        self, partitions: Sequence[TopicPartition], found: MutableMapping[TopicPartition, int]
    ) -> None:
        self.calls += 1
        await asyncio.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        found.update({p: self.ends[p] for p in partitions if p not in self.missing})


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


def test_a_refresh_cut_by_its_deadline_keeps_what_it_found_and_the_rest_stays() -> None:
    """Per partition: what the fetch recorded before the deadline is used; a partition it
    did not reach keeps its previous value (a slow partition no longer costs every lag)."""
    slow = TopicPartition("app-users-changelog", 1)
    state = {"ends": ends(100), "hang": False}

    async def fetch(
        partitions: Sequence[TopicPartition], found: MutableMapping[TopicPartition, int]
    ) -> None:
        for p in partitions:
            if p == slow and state["hang"]:
                await asyncio.sleep(10)
            found[p] = cast(dict[TopicPartition, int], state["ends"])[p]

    cache = EndOffsetsCache(fetch, timeout=0.05)
    cache.track(CHANGELOGS)
    assert asyncio.run(cache.refresh())
    assert cache()[TaskId(2, 1)] == 101
    state.update(ends=ends(500), hang=True)
    assert not asyncio.run(cache.refresh())
    assert cache()[TaskId(0, 0)] == 1000  # refreshed
    assert cache()[TaskId(2, 0)] == 500  # refreshed
    assert cache()[TaskId(2, 1)] == 101  # not reached: its previous value


COMMIT = b"\x00streamassign.commit"


class CommittedLog:
    """A ``read_committed`` consumer (no group) over changelogs given as their committed
    records (offset: key; the gaps are transaction markers and aborted records, which a
    ``read_committed`` fetch skips) and their last stable offsets. Hands out ``per_fetch``
    records a fetch and counts what it read; records only what ``assign``, ``pause`` and
    ``seek`` leave readable."""

    def __init__(self, logs: Mapping[TopicPartition, tuple[Mapping[int, bytes], int]]) -> None:
        self.logs = {KafkaTopicPartition(*p): (dict(r), s) for p, (r, s) in logs.items()}
        self.positions: dict[KafkaTopicPartition, int] = {}
        self.paused: set[KafkaTopicPartition] = set()
        self.per_fetch = 2
        self.delay = 0.0
        self.fetched = 0

    def set(self, tp: TopicPartition, records: Mapping[int, bytes], stable: int) -> None:
        self.logs[KafkaTopicPartition(*tp)] = (dict(records), stable)

    async def end_offsets(self, tps: list[KafkaTopicPartition]) -> dict[KafkaTopicPartition, int]:
        return {tp: self.logs[tp][1] for tp in tps}

    def assign(self, tps: list[KafkaTopicPartition]) -> None:
        self.positions = dict.fromkeys(tps, 0)
        self.paused = set()

    def pause(self, tp: KafkaTopicPartition) -> None:
        assert tp in self.positions
        self.paused.add(tp)

    def seek(self, tp: KafkaTopicPartition, offset: int) -> None:
        assert tp in self.positions
        self.positions[tp] = offset

    async def position(self, tp: KafkaTopicPartition) -> int:
        return self.positions[tp]

    async def getmany(self, *tps: KafkaTopicPartition, timeout_ms: int) -> dict[Any, list[Any]]:
        await asyncio.sleep(self.delay)
        out = {}
        for tp in tps:
            assert tp in self.positions and tp not in self.paused
            records, stable = self.logs[tp]
            ahead = sorted(o for o in records if self.positions[tp] <= o < stable)
            ahead = ahead[: self.per_fetch]
            self.fetched += len(ahead)
            # past the returned records, or past the markers up to the stable offset
            self.positions[tp] = ahead[-1] + 1 if ahead else stable
            out[tp] = [SimpleNamespace(offset=o, key=records[o]) for o in ahead]
        return out


def committed(markers: Sequence[int], data: Sequence[int] = ()) -> dict[int, bytes]:
    return {**dict.fromkeys(data, b"k"), **dict.fromkeys(markers, COMMIT)}


def test_exactly_once_a_caught_up_copy_has_lag_0_not_1_per_transaction_marker() -> None:
    """A copy's store position is one past the last committed commit marker; the
    transaction marker after it, aborted records and orphan data records (at least once
    crashed between its writes and their marker) are nobody's lag."""
    totals, counts = TopicPartition("t", 0), TopicPartition("c", 0)
    aborted_tail, empty = TopicPartition("a", 0), TopicPartition("e", 0)
    long_abort, all_aborted = TopicPartition("l", 0), TopicPartition("x", 0)
    orphans = TopicPartition("o", 0)
    log = CommittedLog(
        {
            totals: (committed([2, 5], data=[0, 1, 4]), 7),  # 3 and 6: transaction markers
            counts: (committed([1], data=[0]), 3),
            aborted_tail: (committed([1], data=[0]), 8),  # 2: marker; 3..6 aborted, 7 abort
            empty: ({}, 0),
            long_abort: (committed([3], data=[0, 1, 2]), 5 + 40 * COMMITTED_TAIL),
            all_aborted: ({}, 3 * COMMITTED_TAIL),  # a copy never applied anything
            orphans: (committed([1], data=[0, 2, 3]), 4),
        }
    )
    fetch = committed_ends_fetch(cast(Any, log))
    found: dict[TopicPartition, int] = {}
    asyncio.run(
        fetch([totals, counts, aborted_tail, empty, long_abort, all_aborted, orphans], found)
    )
    assert found == {
        totals: 6,
        counts: 2,
        aborted_tail: 2,
        empty: 0,
        long_abort: 4,  # found by reading backwards in growing windows
        all_aborted: 0,
        orphans: 2,
    }
    assert log.positions == {}  # unassigned: no fetch goes on in the background
    cache = EndOffsetsCache(fetch, committed=True)
    cache.track({TaskId(0, 0): (totals, counts)})
    asyncio.run(cache.refresh())
    # the position sum a caught-up copy reports (8), not the stable offsets' (10)
    assert cache() == {TaskId(0, 0): 8}


def test_an_idle_partition_is_not_read_again_and_a_new_tail_only_down_to_the_last_one() -> None:
    tp = TopicPartition("t", 0)
    log = CommittedLog({tp: (committed([9], data=range(9)), 10 + 100)})  # 100 aborted
    fetch = committed_ends_fetch(cast(Any, log))
    found: dict[TopicPartition, int] = {}
    asyncio.run(fetch([tp], found))
    assert found == {tp: 10}
    read = log.fetched
    asyncio.run(fetch([tp], found))  # idle: the same stable offset
    assert found == {tp: 10} and log.fetched == read
    # 200 more aborted offsets: read down to 110 only, nothing committed: still 10
    log.set(tp, committed([9], data=range(9)), 310)
    asyncio.run(fetch([tp], found))
    assert found == {tp: 10} and log.fetched == read
    # a new commit; the end moves
    log.set(tp, committed([9, 400], data=[*range(9), 399]), 402)
    asyncio.run(fetch([tp], found))
    assert found == {tp: 401}
    # the topic recreated (shorter): searched from scratch
    log.set(tp, committed([0]), 2)
    asyncio.run(fetch([tp], found))
    assert found == {tp: 1}


def test_a_search_cut_by_the_deadline_goes_on_at_the_next_refresh() -> None:
    """A long aborted tail on a slow broker: each refresh reads on from where the last one
    stopped, so the end is found even if no single refresh could read that far."""
    tp, quick = TopicPartition("t", 0), TopicPartition("q", 0)
    aborted = 100_000  # 13 windows, one fetch each
    log = CommittedLog({tp: (committed([0]), 1 + aborted), quick: (committed([0]), 2)})
    log.delay = 0.03
    cache = EndOffsetsCache(committed_ends_fetch(cast(Any, log)), timeout=0.2, committed=True)
    cache.track({TaskId(0, 0): (tp,), TaskId(0, 1): (quick,)})
    refreshes = 1
    assert not asyncio.run(cache.refresh())
    assert cache() == {TaskId(0, 1): 1}  # the quick partition is used at once
    assert log.positions == {}  # cancelled: unassigned all the same
    while TaskId(0, 0) not in cache():
        asyncio.run(cache.refresh())
        refreshes += 1
        assert refreshes < 200
    assert cache()[TaskId(0, 0)] == 1
    assert refreshes > 1


@given(
    st.lists(st.sampled_from(["marker", "data", "aborted"]), max_size=300),
    st.lists(st.integers(0, 300), max_size=4),
)
def test_the_end_is_one_past_the_last_committed_marker_as_the_log_grows(
    kinds: list[str], cuts: list[int]
) -> None:
    """Whatever the tail and however the log grew between refreshes, the end is what a
    caught-up copy's position is."""
    tp = TopicPartition("t", 0)
    log = CommittedLog({tp: ({}, 0)})
    fetch = committed_ends_fetch(cast(Any, log))
    found: dict[TopicPartition, int] = {}
    for stable in [*sorted(c for c in cuts if c <= len(kinds)), len(kinds)]:
        records = {
            o: COMMIT if k == "marker" else b"k"
            for o, k in enumerate(kinds[:stable])
            if k != "aborted"
        }
        log.set(tp, records, stable)
        asyncio.run(fetch([tp], found))
        markers = [o for o, key in records.items() if key == COMMIT]
        assert found == {tp: max(markers) + 1 if markers else 0}


class LeaderlessLog(CommittedLog):
    """A partition without a leader: a ``ListOffsets`` call that includes it never answers
    (aiokafka retries it until its request timeout)."""

    def __init__(self, logs: Mapping[TopicPartition, Any], stuck: TopicPartition) -> None:
        super().__init__(logs)
        self.stuck = KafkaTopicPartition(*stuck)

    async def end_offsets(self, tps: list[KafkaTopicPartition]) -> dict[KafkaTopicPartition, int]:
        if self.stuck in tps:
            await asyncio.sleep(3600)
        return await super().end_offsets(tps)


def test_a_partition_without_a_leader_costs_only_its_own_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(end_offsets_module, "LIST_TIMEOUT", 0.05)
    good, stuck = TopicPartition("g", 0), TopicPartition("s", 0)
    log = LeaderlessLog({good: (committed([3]), 5), stuck: (committed([0]), 2)}, stuck)
    cache = EndOffsetsCache(committed_ends_fetch(cast(Any, log)), timeout=1, committed=True)
    cache.track({TaskId(0, 0): (good,), TaskId(0, 1): (stuck,)})

    async def scenario() -> set[asyncio.Task[Any]]:
        assert not await cache.refresh()  # the stuck partition's single call never answered
        return asyncio.all_tasks() - {asyncio.current_task()}  # type: ignore[operator]

    left = asyncio.run(scenario())
    assert cache() == {TaskId(0, 0): 4}
    assert not left  # the single calls are cancelled, not left running


def test_no_end_offset_listed_in_time_is_a_typed_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every call hangs (no leader anywhere): a ``StreamAssignError`` that callers catching
    ``TimeoutError`` still catch."""
    monkeypatch.setattr(end_offsets_module, "LIST_TIMEOUT", 0.02)

    class Hanging:
        async def end_offsets(self, tps: object) -> dict[object, int]:
            await asyncio.Event().wait()
            return {}

    tps = [KafkaTopicPartition("cl", p) for p in range(2)]
    with pytest.raises(EndOffsetsTimeoutError, match="no end offset of 2 partitions") as raised:
        asyncio.run(end_offsets_module.list_offsets(Hanging(), tps))  # type: ignore[arg-type]
    assert isinstance(raised.value, TimeoutError)
    assert "(cl[0], cl[1])" in str(raised.value)  # which partitions
