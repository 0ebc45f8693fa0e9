"""The ``streamassign://`` Faust transport without a broker: which protocols its consumer offers,
and that it fetches no stream partition before Faust has emptied the agents' queues."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

faust = pytest.importorskip("faust")

from aiokafka.consumer.fetcher import Fetcher, FetchResult  # noqa: E402
from aiokafka.consumer.subscription_state import SubscriptionState  # noqa: E402
from faust.types import TP  # noqa: E402

from streamassign.errors import StateDirectoryLockedError  # noqa: E402
from streamassign.faust._flowstop import ASSIGNING, JOINING, RECOVERING, REVOKING  # noqa: E402
from streamassign.faust.transport import SWITCH_ENV, _Ticker  # noqa: E402
from streamassign.localstate import StateDirectory  # noqa: E402

from .faust_apps import close_app  # noqa: E402

SOURCE = TP("orders", 0)
CHANGELOG = TP("orders-app-totals-changelog", 0)


def table_app(tmp_path: Path, **settings: Any) -> faust.App:
    app = faust.App(
        "orders-app",
        broker="streamassign://localhost:1",
        datadir=str(tmp_path),
        PartitionAssignor="streamassign.faust:PartitionAssignor",
        **settings,
    )
    app.Table("totals", default=int)
    return app


def assigned(app: faust.App, tps: set[TP]) -> Any:
    """The consumer of ``app`` as after a rebalance that assigned ``tps``: all paused, the
    rebalance under way (Faust's revoke listener calls ``app.on_rebalance_start()``)."""
    consumer = app.consumer
    consumer.assignment = lambda: set(tps)  # the aiokafka consumer is not started
    app.on_rebalance_start()
    consumer.stop_flow()
    consumer.pause_partitions(tps)
    return consumer


def test_a_stream_partition_resumes_only_with_the_flow(tmp_path: Path) -> None:
    """Faust resumes the stream partitions, seeks them, empties the agents' queues and resumes
    the flow, in that order: records fetched before the queues are emptied would be dropped
    unprocessed (docs/faust.md, "Exactness"). Changelog partitions resume at once."""
    consumer = assigned(table_app(tmp_path), {CHANGELOG, SOURCE})
    assert consumer._get_active_partitions() == set()

    consumer.resume_partitions({CHANGELOG, SOURCE})
    assert consumer._get_active_partitions() == {CHANGELOG}  # the source is held

    consumer.resume_flow()  # Faust calls this right after emptying the queues
    assert consumer._get_active_partitions() == {CHANGELOG, SOURCE}


def test_a_pause_cancels_a_held_resume(tmp_path: Path) -> None:
    """A rebalance that revokes a held partition before the flow resumes: it stays paused."""
    consumer = assigned(table_app(tmp_path), {SOURCE})
    consumer.resume_partitions({SOURCE})
    consumer.pause_partitions({SOURCE})
    consumer.resume_flow()
    assert SOURCE not in consumer._get_active_partitions()


def test_the_flow_resumes_only_held_partitions_still_assigned(tmp_path: Path) -> None:
    """A partition held, then taken away by the next assignment: not resumed (not fetched)."""
    consumer = assigned(table_app(tmp_path), {SOURCE})
    gone = TP("orders", 1)
    consumer.resume_partitions({SOURCE, gone})
    consumer.resume_flow()
    assert consumer._get_active_partitions() == {SOURCE}


def test_outside_a_rebalance_a_resume_takes_effect_at_once(tmp_path: Path) -> None:
    """An app pausing and resuming a source partition itself (the public ``ConsumerT`` API)
    gets it back at once, not at the next rebalance's ``resume_flow()``."""
    app = table_app(tmp_path)
    consumer = assigned(app, {CHANGELOG, SOURCE})
    consumer.resume_partitions({CHANGELOG, SOURCE})
    consumer.resume_flow()
    app.on_rebalance_end()

    consumer.pause_partitions({SOURCE})
    assert consumer._get_active_partitions() == {CHANGELOG}
    consumer.resume_partitions({SOURCE})
    assert consumer._get_active_partitions() == {CHANGELOG, SOURCE}


def test_faust_s_recovery_seeks_before_the_source_is_fetched(tmp_path: Path) -> None:
    """Faust's own ``Recovery.on_recovery_completed`` (0.15), the broker calls stubbed: during
    its seek only changelog partitions are fetched, the source once the flow resumes. Without
    the hold the source is fetched during the seek, and what arrives then is dropped when flow
    control resumes (the broker tests catch that only when the timing hits it)."""
    fetched_during_seek: list[set[TP]] = []

    async def recover() -> faust.App:
        app = table_app(tmp_path)  # on this event loop, as Faust's services expect
        consumer = assigned(app, {CHANGELOG, SOURCE})
        app.consumer_generation_id = 5

        async def perform_seek() -> None:
            fetched_during_seek.append(set(consumer._get_active_partitions()))

        async def no_fetcher() -> None:
            pass

        consumer.perform_seek = perform_seek
        app._fetcher.maybe_start = no_fetcher
        # Recovery read the changelogs first, with the flow resumed (the window's cause).
        consumer.resume_partitions({CHANGELOG})
        consumer.resume_flow()
        await app.tables.recovery.on_recovery_completed(generation_id=5)
        return app

    app = asyncio.run(recover())
    assert fetched_during_seek == [{CHANGELOG}]
    assert app.consumer._get_active_partitions() == {CHANGELOG, SOURCE}
    assert not app.rebalancing


def test_partitions_held_too_long_are_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Faust's recovery can stop between its resume and ``resume_flow()`` (a post-recovery seek
    that times out ends its recovery task): the held partitions are then paused for good, so
    the worker says so after ``broker_request_timeout``, once per period, until they resume."""
    app = table_app(tmp_path, broker_request_timeout=0.05)
    consumer = assigned(app, {SOURCE})

    async def hold_without_flow() -> None:
        consumer.resume_partitions({SOURCE})
        deadline = time.monotonic() + 30
        while "still paused" not in caplog.text:
            assert time.monotonic() < deadline, "no warning about the held partitions"
            await asyncio.sleep(0.01)
        consumer.resume_flow()
        assert not consumer._hold_watch.running  # released: no more warnings

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        asyncio.run(hold_without_flow())
    assert "TP(topic='orders', partition=0)" in caplog.text
    assert consumer._get_active_partitions() == {SOURCE}


def test_a_released_hold_stops_its_watch(tmp_path: Path) -> None:
    consumer = assigned(table_app(tmp_path), {SOURCE})

    async def hold_and_release() -> None:
        consumer.resume_partitions({SOURCE})
        assert consumer._hold_watch.running
        consumer.pause_partitions({SOURCE})  # revoked before the flow resumed
        assert not consumer._hold_watch.running

    asyncio.run(hold_and_release())


class DrainingConsumer:
    """What Faust's ``_fetch_records`` uses of an aiokafka consumer, on aiokafka's own
    subscription state: ``fetched_records`` runs ``meanwhile`` (what Faust does while it
    waits), then hands out ``CHANGELOG``'s records 79..119 and advances its position to 120,
    after a rebalance (a new assignment) if ``new_assignment``, as aiokafka does for a call
    that waited across one."""

    def __init__(self, meanwhile: Callable[[], None], new_assignment: bool) -> None:
        self.meanwhile, self.new_assignment = meanwhile, new_assignment
        self._closed = False
        self._subscription = SubscriptionState()
        self._subscription.assign_from_user({CHANGELOG})
        self._subscriptions = self._subscription
        self._fetcher = self

    async def fetched_records(
        self, partitions: Any, timeout: float = 0, max_records: Any = None
    ) -> Any:
        self.meanwhile()
        if self.new_assignment:
            self._subscription.assign_from_user({CHANGELOG})  # a new assignment object
        self._subscription.seek(CHANGELOG, 79)  # where the new recovery starts reading
        self.position_of(CHANGELOG).consumed_to(120)
        return {CHANGELOG: [SimpleNamespace(offset=offset) for offset in range(79, 120)]}

    def position_of(self, tp: TP) -> Any:
        return self._subscription.subscription.assignment.state_value(tp)

    def assignment(self) -> set[TP]:
        return set(self._subscription.assigned_partitions())

    def seek(self, tp: TP, offset: int) -> None:
        self._subscription.seek(tp, offset)


@pytest.mark.parametrize(
    ("flow", "new_assignment", "put_back"),
    [
        # The revoke stopped the flow, and the new recovery resumed it before the call returned:
        # only the assignment tells.
        ("stopped and resumed", True, True),
        # Faust stopped the flow (a revoke whose assignment has not come yet, or the app stops).
        ("stopped", False, True),
        ("running", False, False),
    ],
)
def test_records_fetched_across_a_rebalance_are_put_back(
    tmp_path: Path, flow: str, new_assignment: bool, put_back: bool
) -> None:
    """A fetch that began before a rebalance and drained the new assignment's changelog
    records: Faust would drop them (its flow is stopped) and seek only stream partitions back,
    so the recovery would wait for ever for records already taken (seen as a worker stuck in
    recovery, docs/faust.md). They are put back instead; a fetch within one assignment is
    handed on unchanged."""
    app = table_app(tmp_path)
    thread = app.consumer._thread

    def meanwhile() -> None:
        if flow != "running":
            app.consumer.stop_flow()
        if flow == "stopped and resumed":
            app.consumer.resume_flow()

    async def fetch() -> tuple[Any, int]:
        consumer = DrainingConsumer(meanwhile, new_assignment)
        app.consumer.resume_flow()
        records = await thread._fetch_records(consumer, {CHANGELOG}, timeout=1.0)
        return records, consumer.position_of(CHANGELOG).position

    records, position = asyncio.run(fetch())
    if put_back:
        assert (records, position) == ({}, 79)
    else:
        assert [r.offset for r in records[CHANGELOG]] == list(range(79, 120))
        assert position == 120


class PrefetchingConsumer:
    """What Faust's ``_fetch_records`` uses of an aiokafka consumer, with aiokafka's own
    ``Fetcher.fetched_records`` and ``seek_to``, ``FetchResult`` and subscription state:
    ``SOURCE``'s records 0..2 prefetched (aiokafka keeps fetching a partition Faust pauses in
    its own set only), ``CHANGELOG`` read from 59; ``changelog_arrives()`` buffers its records
    59..61 and wakes a waiting fetch, as a fetch response does."""

    fetched_records = Fetcher.fetched_records
    seek_to = Fetcher.seek_to

    def __init__(self) -> None:
        self._closed = False
        self._subscriptions = self._subscription = SubscriptionState()
        self._subscription.assign_from_user({CHANGELOG, SOURCE})
        self._subscription.seek(CHANGELOG, 59)
        self._subscription.seek(SOURCE, 0)
        self._fetcher = self
        self._wait_consume_future = None
        self._waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._records = {SOURCE: self._fetch_result(SOURCE, [0, 1, 2])}

    def _fetch_result(self, tp: TP, offsets: list[int]) -> FetchResult:
        assignment = self._subscription.subscription.assignment
        return FetchResult(tp, assignment=assignment, partition_records=Batch(offsets), backoff=0)

    def changelog_arrives(self) -> None:
        self._records[CHANGELOG] = self._fetch_result(CHANGELOG, [59, 60, 61])
        self._waiter.set_result(None)

    def _create_fetch_waiter(self) -> asyncio.Future[None]:
        return self._waiter

    def _notify(self, future: Any) -> None:
        pass

    def position_of(self, tp: TP) -> Any:
        return self._subscription.subscription.assignment.state_value(tp).position

    def assignment(self) -> set[TP]:
        return set(self._subscription.assigned_partitions())

    def seek(self, tp: TP, offset: int) -> None:  # AIOKafkaConsumer.seek
        self.seek_to(tp, offset)


class Batch:
    """aiokafka's partition records as ``FetchResult`` reads them: records with offsets."""

    def __init__(self, offsets: list[int]) -> None:
        self._offsets, self.next_fetch_offset = iter(offsets), offsets[0]

    def __iter__(self) -> Batch:
        return self

    def __next__(self) -> Any:
        offset = next(self._offsets)
        self.next_fetch_offset = offset + 1
        return SimpleNamespace(offset=offset)


@pytest.mark.parametrize(
    ("case", "handed_on", "positions"),
    [
        # Faust's recovery ends (pause_partitions(active_tps)) while the fetch waits: the empty
        # set makes aiokafka drain every buffered partition, all of which Faust would drop.
        ("recovery done", {}, {CHANGELOG: 59, SOURCE: 0}),
        ("recovering", {CHANGELOG: [59, 60, 61]}, {CHANGELOG: 62, SOURCE: 0}),
        # Faust keeps the records of a partition in its buffer-full set too.
        ("source buffer full", {SOURCE: [0, 1, 2]}, {CHANGELOG: 59, SOURCE: 3}),
    ],
)
def test_records_outside_faust_s_active_set_are_put_back(
    tmp_path: Path, case: str, handed_on: dict[TP, list[int]], positions: dict[TP, int]
) -> None:
    """Faust's ``getmany`` drops, without a seek, the records of partitions outside the active
    set it fetched with; its seek to the committed offsets after a recovery leaves alone a
    stream partition with no commit yet, whose records would be lost. Such records are put
    back, the rest handed on."""
    app = table_app(tmp_path)
    faust_consumer = assigned(app, {CHANGELOG, SOURCE})
    faust_consumer.resume_flow()
    faust_consumer.resume_partitions({CHANGELOG})  # the recovery reads it; SOURCE stays held
    active = faust_consumer._get_active_partitions()  # the live set Faust fetches with
    assert active == {CHANGELOG}

    async def fetch() -> tuple[Any, dict[TP, int]]:
        consumer = PrefetchingConsumer()
        call = asyncio.ensure_future(app.consumer._thread._fetch_records(consumer, active, 1.0))
        await asyncio.sleep(0.01)  # the call waits for a fetch response
        if case != "recovering":
            faust_consumer.pause_partitions(
                {CHANGELOG}
            )  # recovery.py: pause_partitions(active_tps)
        if case == "source buffer full":
            faust_consumer._buffered_partitions.add(SOURCE)
        consumer.changelog_arrives()
        records = await call
        return records, {tp: consumer.position_of(tp) for tp in (CHANGELOG, SOURCE)}

    records, got_positions = asyncio.run(fetch())
    assert {tp: [r.offset for r in batch] for tp, batch in records.items()} == handed_on
    assert got_positions == positions


def recovering(app: faust.App, applied: int, highwater: int, stall_after: float = 0.2) -> Any:
    """Faust's recovery as it reads ``CHANGELOG`` (applied up to ``applied`` of
    ``highwater``), its changelog partition resumed: the recovery watch running."""
    recovery = app.tables.recovery
    recovery.in_recovery = True
    recovery.active_tps = {CHANGELOG}
    recovery.active_highwaters[CHANGELOG] = highwater
    recovery.active_offsets[CHANGELOG] = applied
    app.consumer.recovery_stall_after = stall_after
    app.consumer.resume_partitions({CHANGELOG})
    app.consumer.resume_flow()  # as Faust's recovery does to read the changelog
    return recovery


async def wait_for_log(caplog: pytest.LogCaptureFixture, text: str) -> None:
    deadline = time.monotonic() + 30
    while text not in caplog.text:
        assert time.monotonic() < deadline, f"never logged {text!r}"
        await asyncio.sleep(0.01)


def test_a_stalled_table_recovery_is_reported_once_with_its_positions(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A recovery whose fetcher stopped reading (seen once on a group leader, docs/faust.md)
    logs only Faust's ``No event received for active tp`` every 5 s, without offsets: the
    worker warns once per stall, naming the partitions behind with their positions, says when
    it moves again, and stops watching when the recovery ends."""
    app = table_app(tmp_path)
    assigned(app, {CHANGELOG, SOURCE})
    stalled = "table recovery has applied nothing"

    async def stall_then_move() -> None:
        recovery = recovering(app, applied=33, highwater=59)
        await wait_for_log(caplog, stalled)
        await asyncio.sleep(0.5)  # more looks at the same stall: no more warnings
        recovery.active_offsets[CHANGELOG] = 40
        await wait_for_log(caplog, "moving again")
        recovery.in_recovery = False
        deadline = time.monotonic() + 30
        while app.consumer._recovery_watch.running:
            assert time.monotonic() < deadline, "the watch outlived the recovery"
            await asyncio.sleep(0.01)

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        asyncio.run(stall_then_move())
    assert caplog.text.count(stalled) == 1
    assert "orders-app-totals-changelog[0] 33/59" in caplog.text


def test_a_moving_table_recovery_is_not_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = table_app(tmp_path)
    assigned(app, {CHANGELOG})

    async def move() -> None:
        recovery = recovering(app, applied=0, highwater=10_000, stall_after=0.5)
        deadline = time.monotonic() + 1.2  # more than two stall bounds
        while time.monotonic() < deadline:
            recovery.active_offsets[CHANGELOG] += 1
            await asyncio.sleep(0.02)
        recovery.in_recovery = False

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        asyncio.run(move())
    assert "table recovery" not in caplog.text


async def apply_records(recovery: Any, records: int) -> None:
    """The recovery applying ``records`` records, one every 20 ms."""
    for _ in range(records):
        recovery.active_offsets[CHANGELOG] += 1
        await asyncio.sleep(0.02)


def test_a_moving_recovery_interrupted_by_a_rebalance_is_not_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A recovery applying records, then a rebalance that lasts more than the stall bound."""
    app = table_app(tmp_path)
    assigned(app, {CHANGELOG, SOURCE})

    async def interrupted() -> None:
        recovery = recovering(app, applied=33, highwater=59, stall_after=0.2)
        await apply_records(recovery, 10)
        app.on_rebalance_start()  # the revoke: the flow stops, in_recovery stays
        app.consumer.stop_flow()
        await asyncio.sleep(0.6)  # more than two stall bounds (30 s in production)
        recovery.in_recovery = False

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        asyncio.run(interrupted())
    assert "table recovery" not in caplog.text


def test_a_recovery_interrupted_by_a_rebalance_is_not_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A rebalance that interrupts a table recovery (a join waiting for a slow or dead member:
    up to 60 s by default) stops the flow while Faust's ``in_recovery`` stays set: nothing is
    applied, but nothing is stuck, and restarting the worker would only rebalance again. No
    warning then; after it, a new stall (``moving again`` only for a stall told)."""
    app = table_app(tmp_path)
    assigned(app, {CHANGELOG, SOURCE})
    stalled = "table recovery has applied nothing"

    async def stall_rebalance_stall() -> None:
        recovery = recovering(app, applied=33, highwater=59, stall_after=0.2)
        await wait_for_log(caplog, stalled)
        app.on_rebalance_start()  # the revoke: the flow stops, in_recovery stays
        app.consumer.stop_flow()
        await asyncio.sleep(0.6)  # more than two stall bounds (30 s in production)
        recovery.active_offsets[CHANGELOG] = 40  # Faust's on_rebalance rewrites them
        await asyncio.sleep(0.1)
        app.consumer.resume_flow()  # the new recovery reads the changelog
        await apply_records(recovery, 10)
        assert caplog.text.count(stalled) == 1, caplog.text
        await wait_for_log(caplog, "50/59")  # stalled again (a new stall, told anew)
        recovery.in_recovery = False

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        asyncio.run(stall_rebalance_stall())
    assert caplog.text.count(stalled) == 2
    assert "moving again" not in caplog.text


def test_a_recovery_caught_up_is_not_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stall with every changelog partition at its highwater is Faust finishing the
    recovery, not a stuck fetcher."""
    app = table_app(tmp_path)
    assigned(app, {CHANGELOG})

    async def caught_up() -> None:
        recovering(app, applied=59, highwater=59, stall_after=0.2)
        await asyncio.sleep(0.6)  # more than two stall bounds
        app.tables.recovery.in_recovery = False

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        asyncio.run(caught_up())
    assert "table recovery" not in caplog.text


async def watch_until_done(check: Callable[[], bool], looks: list[int]) -> None:
    """Tick ``check`` every 10 ms until it asks to stop (30 s at most)."""
    ticker = _Ticker(check)
    ticker.start(0.01)
    deadline = time.monotonic() + 30
    while ticker.running or not looks:
        assert time.monotonic() < deadline, f"the watch stopped after {len(looks)} looks"
        await asyncio.sleep(0.01)


def test_a_watchdog_that_fails_is_logged_and_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    """An error in a watch check must not end the watch in silence: the next stall would go
    unreported."""
    looks: list[int] = []

    def check() -> bool:
        looks.append(len(looks))
        if len(looks) == 1:
            raise RuntimeError("boom")
        return len(looks) < 3

    with caplog.at_level(logging.ERROR, logger="streamassign.faust"):
        asyncio.run(watch_until_done(check, looks))
    assert looks == [0, 1, 2]
    assert "failed; it goes on" in caplog.text and "boom" in caplog.text


def test_a_watchdog_failing_at_every_tick_logs_its_traceback_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A check that fails at every tick logs one ERROR with its traceback, repeats at DEBUG,
    and one INFO line once it works again (not a traceback every few seconds for ever)."""
    looks: list[int] = []

    def check() -> bool:
        looks.append(len(looks))
        if len(looks) <= 4:
            raise RuntimeError("boom")
        return len(looks) < 6

    with caplog.at_level(logging.DEBUG, logger="streamassign.faust"):
        asyncio.run(watch_until_done(check, looks))
    levels = [r.levelno for r in caplog.records if "watchdog" in r.getMessage()]
    assert levels == [logging.ERROR, *[logging.DEBUG] * 3, logging.INFO]


def test_the_stall_report_leaves_faust_s_active_set_alone(tmp_path: Path) -> None:
    """Faust's ``_get_active_partitions`` sets its active set to the whole assignment when it
    has none: a diagnosis must not do that."""
    consumer = table_app(tmp_path).consumer
    consumer.assignment = lambda: {CHANGELOG}
    consumer._active_partitions = None  # what _get_active_partitions fills with the assignment
    described = consumer._describe_behind([CHANGELOG], {CHANGELOG: 33}, {CHANGELOG: 59})
    assert "33/59 (Faust: inactive" in described
    assert consumer._active_partitions is None


@pytest.mark.parametrize(("switch", "offered"), [(None, ["streamassign-faust"]), ("1", None)])
def test_faust_s_protocol_is_offered_only_while_switching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, switch: str | None, offered: list[str] | None
) -> None:
    """aiokafka (<= 0.14) sends one JoinGroup per offered protocol, which can keep a group
    rebalancing: the second protocol only with STREAMASSIGN_FAUST_SWITCH=1."""
    if switch is None:
        monkeypatch.delenv(SWITCH_ENV, raising=False)
    else:
        monkeypatch.setenv(SWITCH_ENV, switch)
    app = table_app(tmp_path)

    async def strategy() -> list[str]:
        consumer = app.consumer._thread._create_worker_consumer(app.transport)
        try:
            return [a.name for a in consumer._partition_assignment_strategy]
        finally:
            await consumer.stop()

    assert asyncio.run(strategy()) == (offered or ["streamassign-faust", "faust"])


STUCK = "worker stuck in a rebalance"


@pytest.fixture
def faust_revoke(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Faust's revoke and assignment chains as far as the flow goes (the revoke stops it, as
    ``App._on_partitions_revoked`` does); returns what the flow watch waited for during each."""
    steps: list[str] = []

    async def revoked(consumer: Any, revoked: set[TP]) -> None:
        if consumer.assignment():  # App._on_partitions_revoked: only a flow that has work
            consumer.stop_flow()
        steps.append(consumer._flow_stop.step.waits_for)

    async def assigned(consumer: Any, assigned: set[TP], generation_id: int = 0) -> None:
        steps.append(consumer._flow_stop.step.waits_for)

    base = faust.transport.drivers.aiokafka.Consumer
    monkeypatch.setattr(base, "on_partitions_revoked", revoked)
    monkeypatch.setattr(base, "on_partitions_assigned", assigned)
    return steps


async def rebalancing(
    tmp_path: Path, stall_after: float = 0.2, had: frozenset[TP] = frozenset({CHANGELOG, SOURCE})
) -> Any:
    """A worker whose revoke stopped Faust's flow (if it ``had`` partitions) and returned (the
    join under way), on the running loop: the flow watch running, with bounds of 0.3 s for the
    revoke (the rebalance timeout), 0.3 s plus ``stall_after`` (at least the session timeout,
    0.2 s) for the join, and ``stall_after`` for a later step."""
    app = table_app(tmp_path, broker_rebalance_timeout=0.3, broker_session_timeout=0.2)
    consumer = app.consumer
    consumer.recovery_stall_after = stall_after
    consumer.assignment = lambda: set(had)
    app.on_rebalance_start()  # Faust's revoke listener, before the revoke callbacks
    await consumer.on_partitions_revoked(set())
    return consumer


def test_a_rebalance_that_keeps_the_flow_stopped_is_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, faust_revoke: list[str]
) -> None:
    """A join that never completes (a rebalance that never ends): Faust never resumes the flow
    and logs nothing. One WARNING for the episode, naming the step; one INFO when it ends."""

    async def stuck_then_resumed() -> None:
        consumer = await rebalancing(tmp_path)
        await wait_for_log(caplog, STUCK)
        await asyncio.sleep(1.0)  # more than two bounds: no more warnings
        await consumer.on_partitions_assigned({CHANGELOG, SOURCE}, 5)  # the join completes
        consumer.resume_flow()
        assert not consumer._flow_watch.running

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        asyncio.run(stuck_then_resumed())
    assert caplog.text.count(STUCK) == 1
    assert "s for the group's new assignment (JoinGroup/SyncGroup)" in caplog.text
    assert "Faust's flow resumed after" in caplog.text


def test_a_first_join_that_never_ends_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, faust_revoke: list[str]
) -> None:
    """A worker starting (nothing assigned: Faust's revoke leaves the flow as it is) whose join
    never completes processes nothing either: the same warning."""

    async def stuck() -> None:
        consumer = await rebalancing(tmp_path, had=frozenset())
        assert consumer.flow_active
        await wait_for_log(caplog, STUCK)
        await consumer.on_partitions_assigned(set(), 5)
        consumer.resume_flow()  # "Resuming streams with empty assignment"

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        asyncio.run(stuck())
    assert caplog.text.count(STUCK) == 1


def test_a_healthy_worker_is_not_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, faust_revoke: list[str]
) -> None:
    """A rebalance that resumes the flow within its bounds, the steady state after it, and a
    stopping app (Faust stops the flow outside a rebalance): no watch, no line."""

    async def healthy() -> None:
        consumer = await rebalancing(tmp_path, stall_after=1.0)  # bounds: join 1.3 s
        assert consumer._flow_watch.running
        await asyncio.sleep(0.1)
        await consumer.on_partitions_assigned({CHANGELOG, SOURCE}, 5)
        consumer.resume_flow()
        consumer.app.on_rebalance_end()
        assert not consumer._flow_watch.running
        await asyncio.sleep(2.5)  # more than any bound
        consumer.stop_flow()  # App._stop_consumer
        assert not consumer._flow_watch.running

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        asyncio.run(healthy())
    assert STUCK not in caplog.text and "flow resumed" not in caplog.text


def test_streams_held_at_the_last_step_are_left_to_the_hold_watch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, faust_revoke: list[str]
) -> None:
    """Faust's recovery resumed the stream partitions and seeks them (up to
    broker_request_timeout) before it resumes the flow: the hold watch reports that step."""

    async def seeking() -> None:
        consumer = await rebalancing(tmp_path)
        await consumer.on_partitions_assigned({CHANGELOG, SOURCE}, 5)
        consumer.resume_partitions({SOURCE})  # held until resume_flow()
        await asyncio.sleep(0.7)  # more than the join's bound (0.5 s)
        assert consumer._flow_watch.running
        consumer.resume_flow()

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        asyncio.run(seeking())
    assert STUCK not in caplog.text


def test_the_flow_watch_follows_the_rebalance_s_steps(
    tmp_path: Path, faust_revoke: list[str]
) -> None:
    """Faust's revoke callbacks, the join, Faust's ``on_partitions_assigned`` (its callbacks),
    its recovery setting up; a revoke before the flow resumed is another rebalance."""

    async def rebalance_twice() -> Any:
        consumer = await rebalancing(tmp_path, stall_after=30.0)
        faust_revoke.append(consumer._flow_stop.step.waits_for)
        await consumer.on_partitions_assigned({CHANGELOG, SOURCE}, 5)
        faust_revoke.append(consumer._flow_stop.step.waits_for)
        await consumer.on_partitions_revoked({CHANGELOG, SOURCE})
        faust_revoke.append(consumer._flow_stop.step.waits_for)
        return consumer._flow_stop

    stop = asyncio.run(rebalance_twice())
    assert faust_revoke == [
        step.waits_for for step in (REVOKING, JOINING, ASSIGNING, RECOVERING, REVOKING, JOINING)
    ]
    assert stop.rebalances == 2


def test_the_flow_watch_s_bounds_with_faust_s_defaults(tmp_path: Path) -> None:
    """The revoke: the rebalance timeout (60 s; longer and the group goes on without this
    member). The join: the rebalance timeout plus a session timeout (the member whose own
    JoinGroup starts the rebalance waits all of the former, then the SyncGroup). Faust's
    assignment callback: not before Faust's own flight recorder (57 s) nor a RocksDB partition
    locked for Faust's 30 retries. The recovery setting up: ``recovery_stall_after``, but
    not before ``broker_request_timeout`` (90 s), the bound of each of Faust's requests there:
    a slow broker (a leader failover) made it tell a worker still within Faust's own
    timeouts to restart."""
    bounds = table_app(tmp_path).consumer._flow_step_bounds()
    assert bounds == {REVOKING: 60.0, JOINING: 120.0, ASSIGNING: 60.0, RECOVERING: 90.0}
    delayed = table_app(tmp_path, stream_recovery_delay=60.0).consumer._flow_step_bounds()
    assert delayed[RECOVERING] == 60.0 + 90.0  # the delay comes before the first request


def test_the_member_whose_join_the_broker_holds_for_the_rebalance_timeout_is_not_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, faust_revoke: list[str]
) -> None:
    """A worker starting (or rejoining) while a slow member holds the join: its own JoinGroup
    starts the broker's rebalance timeout (0.3 s here), so its join lasts that plus the
    SyncGroup. A normal rebalance: nothing told (the join's bound used to be the timeout)."""

    async def held_join() -> None:
        consumer = await rebalancing(tmp_path, had=frozenset())
        await asyncio.sleep(0.3 + 0.08)  # the rebalance timeout, the request and the SyncGroup
        await consumer.on_partitions_assigned({CHANGELOG, SOURCE}, 5)
        consumer.resume_flow()
        assert not consumer._flow_watch.running

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        asyncio.run(held_join())
    assert STUCK not in caplog.text


@pytest.fixture
def faust_stops_flow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Faust's revoke as far as the flow goes (``App._on_partitions_revoked`` stops it); its
    assignment does nothing (it would start the app's producer)."""

    async def revoked(consumer: Any, revoked: set[TP]) -> None:
        if consumer.assignment():
            consumer.stop_flow()

    async def assigned(consumer: Any, assigned: set[TP], generation_id: int = 0) -> None:
        pass

    base = faust.transport.drivers.aiokafka.Consumer
    monkeypatch.setattr(base, "on_partitions_revoked", revoked)
    monkeypatch.setattr(base, "on_partitions_assigned", assigned)


def flow_worker(tmp_path: Path) -> Any:
    """A worker with partitions, not started; bounds: join 0.5 s, a later step 0.2 s."""
    app = table_app(tmp_path, broker_rebalance_timeout=0.3, broker_session_timeout=0.2)
    consumer = app.consumer
    consumer.recovery_stall_after = 0.2
    consumer.assignment = lambda: {CHANGELOG, SOURCE}
    return consumer


async def previous_rebalance_ends_late(consumer: Any, order: str) -> None:
    """Rebalance N+1 begins (its revoke, the flow stopped) while rebalance N's recovery is
    still finishing: it calls ``resume_flow()``, awaits the fetcher, then
    ``app.on_rebalance_end()`` (which clears ``app.rebalancing`` for N+1 too), each before or
    after N+1's revoke as ``order`` says. N+1's join then never completes."""
    app = consumer.app
    app.on_rebalance_start()  # N
    if order == "N ends, then N+1 revokes":
        app.on_rebalance_start()  # N+1's listener, on the consumer thread
        consumer.resume_flow()
        app.on_rebalance_end()
        await consumer.on_partitions_revoked({CHANGELOG, SOURCE})
    elif order == "N resumes, N+1 revokes, N ends":
        consumer.resume_flow()
        app.on_rebalance_start()
        await consumer.on_partitions_revoked({CHANGELOG, SOURCE})
        app.on_rebalance_end()
    else:  # "N+1 revokes, N resumes and ends" (run-sw4: w0, w2 at rebalance #10)
        app.on_rebalance_start()
        await consumer.on_partitions_revoked({CHANGELOG, SOURCE})
        consumer.resume_flow()
        app.on_rebalance_end()
    consumer.stop_flow()  # as N+1's revoke left it (N's resume_flow() may have come after)


@pytest.mark.parametrize(
    "order",
    [
        "N ends, then N+1 revokes",
        "N resumes, N+1 revokes, N ends",
        "N+1 revokes, N resumes and ends",
    ],
)
def test_a_rebalance_the_previous_one_ends_during_is_still_watched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, faust_stops_flow: None, order: str
) -> None:
    """Faust's rebalancing flag and the previous recovery's late ``resume_flow()`` do not
    begin, drop or end an episode: a join that then never completes is told once; this
    rebalance's own recovery resuming the flow ends it."""

    async def race() -> Any:
        consumer = flow_worker(tmp_path)
        await previous_rebalance_ends_late(consumer, order)
        await wait_for_log(caplog, STUCK)
        await consumer.on_partitions_assigned({CHANGELOG, SOURCE}, 6)
        consumer.resume_flow()
        return consumer

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        consumer = asyncio.run(race())
    assert consumer._flow_stop is None and not consumer._flow_watch.running
    assert caplog.text.count(STUCK) == 1
    assert "s for the group's new assignment (JoinGroup/SyncGroup)" in caplog.text
    assert "Faust's flow resumed after" in caplog.text


def test_a_failing_flow_watch_leaves_faust_s_callbacks_whole(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    faust_stops_flow: None,
) -> None:
    """The watch's hooks run inside Faust's callbacks: one failing must not skip Faust's revoke
    (its flow stop and producer flush) nor leave held stream partitions paused. Logged once."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise TypeError("a setting of an unexpected type")

    def _flow_resumed() -> None:  # the hook itself, failing
        raise RuntimeError("flow watch failed")

    async def rebalance_twice() -> Any:
        consumer = flow_worker(tmp_path)
        monkeypatch.setattr(consumer, "_flow_step_bounds", broken)
        monkeypatch.setattr(consumer, "_flow_resumed", _flow_resumed)
        for generation in (5, 6):
            consumer.app.on_rebalance_start()
            await consumer.on_partitions_revoked({CHANGELOG, SOURCE})
            assert not consumer.flow_active  # Faust's revoke ran
            await consumer.on_partitions_assigned({CHANGELOG, SOURCE}, generation)
            consumer.resume_partitions({SOURCE})  # held until resume_flow()
            consumer.resume_flow()
            assert not consumer._held_streams
            consumer.app.on_rebalance_end()
        return consumer

    with caplog.at_level(logging.DEBUG, logger="streamassign.faust"):
        asyncio.run(rebalance_twice())
    failures = [r for r in caplog.records if r.getMessage().startswith("the flow watch failed")]
    tracebacks = [r for r in failures if r.levelno > logging.DEBUG]
    assert [(r.levelno, r.args) for r in tracebacks] == [
        (logging.ERROR, ("_flow_revoked",)),
        (logging.ERROR, ("_flow_resumed",)),
    ]


def test_a_worker_stopping_during_a_rebalance_is_not_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, faust_revoke: list[str]
) -> None:
    """Faust's app stops its agents and tables (which may take longer than the bounds) before
    its consumer: a rebalance under way then is not a stuck worker."""

    async def stopping() -> Any:
        consumer = await rebalancing(tmp_path)
        consumer.app._stopped.set()  # App.stop(): set first, then on_stop()
        await asyncio.sleep(1.0)  # more than the join's bound
        return consumer

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        consumer = asyncio.run(stopping())
    assert STUCK not in caplog.text and not consumer._flow_watch.running


def test_streams_are_held_in_a_rebalance_the_previous_one_ended_during(
    tmp_path: Path, faust_stops_flow: None
) -> None:
    """The previous rebalance's recovery cleared ``app.rebalancing`` during this one's join:
    this rebalance's recovery resuming the stream partitions before its seek is still held
    until its ``resume_flow()`` (else what is fetched meanwhile is dropped and committed past)."""

    async def race() -> Any:
        consumer = flow_worker(tmp_path)
        await previous_rebalance_ends_late(consumer, "N+1 revokes, N resumes and ends")
        assert not consumer.app.rebalancing
        await consumer.on_partitions_assigned({CHANGELOG, SOURCE}, 6)
        consumer.pause_partitions({CHANGELOG, SOURCE})  # Faust pauses all after an assignment
        consumer.resume_partitions({SOURCE})  # _resume_streams, before the seek
        held = set(consumer._held_streams)
        consumer.resume_flow()
        return held, consumer._held_streams

    held, after = asyncio.run(race())
    assert held == {SOURCE} and after == set()


def stub_seek(consumer: Any, fetched_during_seek: list[set[TP]]) -> None:
    """Faust's seek and fetcher start, recording what the consumer would fetch during the seek."""

    async def perform_seek() -> None:
        fetched_during_seek.append(set(consumer._get_active_partitions()))

    async def no_fetcher() -> None:
        pass

    consumer.perform_seek = perform_seek
    consumer.app._fetcher.maybe_start = no_fetcher


async def recover_with_changelog_to_read(consumer: Any, generation: int) -> None:
    """Faust 0.15's recovery when a table has changelog records to read: the changelog resumed,
    the flow resumed to read it ("Restoring state..."), the changelog paused once read, then
    Faust's own ``on_recovery_completed`` (stream partitions resumed, seek, ``resume_flow()``)."""
    app = consumer.app
    consumer.pause_partitions({CHANGELOG, SOURCE})  # App._on_partitions_assigned
    app.tables.recovery._set_recovery_started()
    consumer.resume_partitions({CHANGELOG})
    app.flow_control.resume()
    consumer.resume_flow()  # "Resuming flow..." to read the changelog
    await asyncio.sleep(0)
    consumer.pause_partitions({CHANGELOG})  # "Done reading from changelog topics"
    await app.tables.recovery.on_recovery_completed(generation_id=generation)


def resumes_at_once(consumer: Any) -> bool:
    """Does the app's own pause and resume of a stream partition take effect at once?"""
    consumer.pause_partitions({SOURCE})
    consumer.resume_partitions({SOURCE})
    return SOURCE in consumer._get_active_partitions()


def test_a_table_recovery_reading_its_changelog_holds_the_source_through_its_seek(
    tmp_path: Path, faust_stops_flow: None
) -> None:
    """The previous rebalance's recovery cleared ``app.rebalancing`` during this one's join,
    and this one's recovery reads a changelog first: its first ``resume_flow()`` comes before
    the stream partitions are resumed and sought, which must still be held."""
    fetched_during_seek: list[set[TP]] = []

    async def race() -> Any:
        consumer = flow_worker(tmp_path)
        stub_seek(consumer, fetched_during_seek)
        await previous_rebalance_ends_late(consumer, "N+1 revokes, N resumes and ends")
        assert not consumer.app.rebalancing
        consumer.app.consumer_generation_id = 6
        await consumer.on_partitions_assigned({CHANGELOG, SOURCE}, 6)
        await recover_with_changelog_to_read(consumer, 6)
        return consumer

    consumer = asyncio.run(race())
    assert fetched_during_seek == [set()]
    assert SOURCE in consumer._get_active_partitions() and not consumer._held_streams
    assert resumes_at_once(consumer)


def test_a_resume_during_the_assignment_callback_ends_the_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, faust_stops_flow: None
) -> None:
    """With no ``stream_recovery_delay`` this rebalance's own recovery may resume the streams
    and the flow while Faust's assignment callback still runs: ignoring that resume would hold
    the app's own resumes and keep the watch on for good."""

    async def faust_assigned(consumer: Any, tps: set[TP], generation_id: int = 0) -> None:
        consumer.resume_partitions({SOURCE})  # _resume_streams
        consumer.resume_flow()
        consumer.app.on_rebalance_end()

    async def rebalance() -> Any:
        consumer = flow_worker(tmp_path)
        consumer.app.on_rebalance_start()
        await consumer.on_partitions_revoked({CHANGELOG, SOURCE})
        base = faust.transport.drivers.aiokafka.Consumer
        monkeypatch.setattr(base, "on_partitions_assigned", faust_assigned)
        await consumer.on_partitions_assigned({CHANGELOG, SOURCE}, 6)
        return consumer

    consumer = asyncio.run(rebalance())
    assert not consumer._held_streams and not consumer._flow_watch.running
    assert resumes_at_once(consumer)


def test_a_stale_resume_during_the_assignment_callback_does_not_end_the_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, faust_stops_flow: None
) -> None:
    """Rebalance N's recovery (past its generation check) resumes the flow and ends the
    rebalance while N+1's assignment callback runs: N+1's stream resume before its seek is
    still held."""

    async def faust_assigned(consumer: Any, tps: set[TP], generation_id: int = 0) -> None:
        consumer.resume_flow()  # N's recovery, late
        consumer.app.on_rebalance_end()

    async def race() -> set[TP]:
        consumer = flow_worker(tmp_path)
        consumer.app.on_rebalance_start()  # N
        consumer.app.on_rebalance_start()  # N+1
        await consumer.on_partitions_revoked({CHANGELOG, SOURCE})
        base = faust.transport.drivers.aiokafka.Consumer
        monkeypatch.setattr(base, "on_partitions_assigned", faust_assigned)
        await consumer.on_partitions_assigned({CHANGELOG, SOURCE}, 6)
        consumer.pause_partitions({CHANGELOG, SOURCE})
        consumer.resume_partitions({SOURCE})  # N+1's _resume_streams, before its seek
        return set(consumer._get_active_partitions())

    assert SOURCE not in asyncio.run(race())


def test_a_flow_watch_hook_failing_mid_rebalance_leaves_no_stall(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    faust_stops_flow: None,
) -> None:
    """A hook that fails after the revoke (the watch then cannot know the rebalance's steps):
    once Faust's recovery resumed the flow, no stuck worker is reported and the app's own
    resumes take effect at once."""

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("hook broken after the revoke")

    async def rebalance() -> Any:
        consumer = flow_worker(tmp_path)
        consumer.recovery_stall_after = 0.05
        consumer.app.on_rebalance_start()
        await consumer.on_partitions_revoked({CHANGELOG, SOURCE})
        monkeypatch.setattr(consumer, "_enter_flow_step", broken)
        await consumer.on_partitions_assigned({CHANGELOG, SOURCE}, 6)
        consumer.pause_partitions({CHANGELOG, SOURCE})
        consumer.resume_partitions({SOURCE})  # _resume_streams
        consumer.resume_flow()
        consumer.app.on_rebalance_end()
        await asyncio.sleep(0.5)  # more than every bound: a stall would have been told
        return consumer

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        consumer = asyncio.run(rebalance())
    assert STUCK not in caplog.text and not consumer._flow_watch.running
    assert resumes_at_once(consumer)


def test_back_to_back_rebalances_each_release_their_streams(
    tmp_path: Path, faust_stops_flow: None
) -> None:
    """Ten rebalances in a row, each recovery reading a changelog: the previous recovery ending
    late in each order, normal ones and an empty assignment. Nothing is fetched during a seek,
    and after each recovery nothing stays held."""
    fetched_during_seek: list[set[TP]] = []
    orders = [
        "N ends, then N+1 revokes",
        "N resumes, N+1 revokes, N ends",
        "N+1 revokes, N resumes and ends",
    ]

    async def rebalances() -> list[bool]:
        consumer = flow_worker(tmp_path)
        consumer.recovery_stall_after = 30.0
        stub_seek(consumer, fetched_during_seek)
        released = []
        for i in range(10):
            if i % 2:
                await previous_rebalance_ends_late(consumer, orders[i % 3])
            else:
                consumer.app.on_rebalance_start()
                await consumer.on_partitions_revoked({CHANGELOG, SOURCE})
            consumer.app.consumer_generation_id = 10 + i
            tps = set() if i == 4 else {CHANGELOG, SOURCE}
            await consumer.on_partitions_assigned(tps, 10 + i)
            await recover_with_changelog_to_read(consumer, 10 + i)
            released.append(not consumer._held_streams and resumes_at_once(consumer))
        return released

    assert asyncio.run(rebalances()) == [True] * 10
    assert all(fetched == set() for fetched in fetched_during_seek)


def test_the_consumer_thread_holds_back_aiokafka_s_broker_away_lines_while_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A Faust worker logged about 70 aiokafka lines a second while a broker was away
    (floodfix: 1,495 in 20 s); our transport's consumer thread holds them back as the
    runtime's ``App`` does, from its start to its stop, and says at stop what it held."""
    from faust.transport.consumer import ConsumerThread
    from faust.transport.drivers import aiokafka as faust_aiokafka

    from streamassign.aiokafka.floods import BrokerAwayLines

    async def nothing(self: Any) -> None:
        pass

    monkeypatch.setattr(faust_aiokafka.AIOKafkaConsumerThread, "on_start", nothing)
    # Faust's thread step below its consumer stop (ours bounds that stop: no consumer here)
    monkeypatch.setattr(ConsumerThread, "on_thread_stop", nothing)
    fetcher = logging.getLogger("aiokafka.consumer.fetcher")
    thread = table_app(tmp_path).consumer._thread

    def attached() -> list[logging.Filter]:
        return [f for f in fetcher.filters if isinstance(f, BrokerAwayLines)]  # type: ignore[misc]

    async def run() -> None:
        await thread.on_start()
        assert len(attached()) == 1
        for _ in range(50):
            fetcher.error("Failed fetch messages from %s: %s", 1, "NodeNotReadyError")
        await thread.on_thread_stop()

    with caplog.at_level(logging.INFO):
        asyncio.run(run())
    assert [f.active for f in attached()] == [False]  # switched off, left first
    assert fetcher.filters[0] is attached()[0]
    fetched = [r for r in caplog.records if r.name == "aiokafka.consumer.fetcher"]
    assert len(fetched) == 1
    assert any("49 similar lines suppressed" in r.getMessage() for r in caplog.records)


def test_a_seek_to_no_offset_reads_from_the_start_instead_of_ending_the_worker(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Faust's recovery seeks a partition a rebalance added during its set-up with offset
    None (its ``_add`` before ``_build_offsets``): aiokafka's ``seek`` raised ``Offset must
    be a positive integer`` and ended the recovery and the worker (the scale audit, 256
    partitions, both assignors). Such an offset reads from the start, as Faust's -1 does."""
    thread = table_app(tmp_path).consumer._thread
    seeks: list[tuple[TP, int]] = []

    class Seeking:
        def seek(self, tp: TP, offset: int) -> None:
            if not isinstance(offset, int) or offset < 0:
                raise ValueError("Offset must be a positive integer")  # aiokafka's check
            seeks.append((tp, offset))

        async def position(self, tp: TP) -> int:
            return dict(seeks)[tp]

    asked = {CHANGELOG: None, SOURCE: 7, TP("orders-app-totals-changelog", 1): -2}
    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        asyncio.run(thread._seek_wait(Seeking(), asked))
    assert dict(seeks) == {CHANGELOG: 0, SOURCE: 7, TP("orders-app-totals-changelog", 1): 0}
    said = [r.getMessage() for r in caplog.records if "no offset" in r.getMessage()]
    assert len(said) == 1 and "2 partition(s)" in said[0], said


@pytest.mark.parametrize(
    ("urls", "warned"),
    [
        ({"broker": "kafka://localhost:1"}, True),
        ({"broker": "localhost:1"}, True),  # Faust's default scheme: kafka://
        ({"broker": "streamassign://localhost:1"}, False),
        ({"broker": "streamassign://localhost:1;localhost:2"}, False),
        # Faust's consumer runs broker_consumer's transport (broker is the default): set
        # alone (or through BROKER_CONSUMER_URL), it decides.
        ({"broker": "streamassign://localhost:1", "broker_consumer": "kafka://localhost:1"}, True),
        ({"broker": "kafka://localhost:1", "broker_consumer": "streamassign://localhost:1"}, False),
    ],
)
@pytest.mark.parametrize("transport_made", [False, True])
def test_the_assignor_on_faust_s_own_transport_warns_once_that_records_may_drop(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    urls: dict[str, str],
    warned: bool,
    transport_made: bool,
) -> None:
    """Faust's ``kafka://`` drops records around rebalances (a soak run lost 12 of them):
    said once, when the app makes its assignor, if the consumer's transport is not ours,
    whether Faust has made the transport by then (a worker: the consumer makes the assignor)
    or not; not refused (a rolling switch uses it)."""
    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        app = faust.App(
            "orders-app",
            datadir=str(tmp_path),
            PartitionAssignor="streamassign.faust:PartitionAssignor",
            **urls,
        )
        if transport_made:
            app.transport  # noqa: B018 (made on first use)
        app.assignor  # noqa: B018 (made on first use)
    said = [r.getMessage() for r in caplog.records if "can drop records" in r.getMessage()]
    assert len(said) == (1 if warned else 0), said


def test_the_assignor_follows_a_transport_set_on_the_app(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A transport object set on the app is the one its consumer uses, whatever the URLs say."""
    from faust.transport.drivers import aiokafka as faust_aiokafka

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        app = faust.App(
            "orders-app",
            broker="streamassign://localhost:1",
            datadir=str(tmp_path),
            PartitionAssignor="streamassign.faust:PartitionAssignor",
        )

        async def transport_of_a_worker() -> Any:
            # Made in a running loop, as in a worker: Faust before 0.15 takes the loop then.
            return faust_aiokafka.Transport(app.conf.broker_consumer, app)

        app.transport = asyncio.run(transport_of_a_worker())
        app.assignor  # noqa: B018 (made on first use)
    said = [r.getMessage() for r in caplog.records if "can drop records" in r.getMessage()]
    assert len(said) == 1 and "faust.transport.drivers.aiokafka.Transport" in said[0], said


def test_a_partition_just_assigned_is_not_reported_as_a_stream_that_never_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, faust_revoke: list[str]
) -> None:
    """Faust counts "Stream has not started processing" from the worker's start: a worker
    older than ``stream_processing_timeout`` logged it as an ERROR at rebalances for the
    partitions it had just been given (the soak audit, with either assignor). Checked from
    the assignment now; a partition that has had events, or was assigned long ago, as before.
    A changelog partition (a table's, a standby's) has no stream: Faust's fetch-path checks
    at once."""
    from faust.transport.drivers import aiokafka as faust_aiokafka

    checked: list[TP] = []
    monkeypatch.setattr(
        faust_aiokafka.Consumer, "verify_event_path", lambda self, now, tp: checked.append(tp)
    )

    async def assigned_then_checked() -> None:
        consumer = await rebalancing(tmp_path)
        await consumer.on_partitions_assigned({CHANGELOG, SOURCE}, 5)
        timeout = float(consumer.app.conf.stream_processing_timeout)
        now = time.monotonic()
        consumer.verify_event_path(now, SOURCE)  # just assigned, no event yet: not checked
        consumer.verify_event_path(now, CHANGELOG)  # no stream: checked
        consumer.app.monitor.stream_inbound_time[SOURCE] = now
        consumer.verify_event_path(now, SOURCE)  # has had an event: checked
        consumer.app.monitor.stream_inbound_time.clear()
        consumer.verify_event_path(now + timeout, SOURCE)  # assigned a timeout ago: checked
        consumer.resume_flow()

    asyncio.run(assigned_then_checked())
    assert checked == [CHANGELOG, SOURCE, SOURCE]


class MonotonicClock:
    """``time.monotonic`` for the transport, moved by hand (Faust's livelock clock). It starts
    at a whole number, not at the real clock: ``start + timeout - start`` may round below
    ``timeout`` for some real starts, which made a check at exactly a timeout
    after a start land on either side of the bound from one run to the next."""

    def __init__(self) -> None:
        self.now = 100_000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def livelock_checks(monkeypatch: pytest.MonkeyPatch) -> tuple[MonotonicClock, list[float]]:
    """The transport's clock, moved by hand, and when Faust's own livelock check (what our
    ``verify_event_path`` calls or skips) was reached for ``SOURCE``."""
    from faust.transport.drivers import aiokafka as faust_aiokafka

    from streamassign.faust import transport

    clock = MonotonicClock()
    monkeypatch.setattr(
        transport, "time", SimpleNamespace(monotonic=clock.monotonic, time=time.time)
    )
    reached: list[float] = []

    def faust_s_check(consumer: Any, now: float, tp: TP) -> None:
        if tp == SOURCE:
            reached.append(now)

    monkeypatch.setattr(faust_aiokafka.Consumer, "verify_event_path", faust_s_check)
    return clock, reached


async def faust_rebalance(
    consumer: Any, clock: MonotonicClock, generation: int, recovery_seconds: float = 10.0
) -> None:
    """One rebalance as Faust 0.15 runs it, keeping CHANGELOG and SOURCE: the revoke listener
    (ours, then Faust's ``app.on_rebalance_start()``, whose monitor forgets every stream's last
    event), the revoke (flow stopped, all paused), the assignment, a table recovery reading
    its changelog for ``recovery_seconds``, then its end (stream partitions resumed,
    ``resume_flow()``, ``app.on_rebalance_end()``, which forgets them again)."""
    app = consumer.app
    app.sensors.add(app.monitor)  # as a started app has it (App.on_init_dependencies)
    # Faust's thread would run the revoke below on the loop's thread.
    consumer._thread._rebalance_listener.on_partitions_revoked(set()).close()
    await consumer.on_partitions_revoked({CHANGELOG, SOURCE})
    consumer.pause_partitions({CHANGELOG, SOURCE})  # App._on_partitions_revoked
    app.consumer_generation_id = generation
    await consumer.on_partitions_assigned({CHANGELOG, SOURCE}, generation)
    consumer.pause_partitions({CHANGELOG, SOURCE})  # App._on_partitions_assigned
    app.tables.recovery._set_recovery_started()
    consumer.resume_partitions({CHANGELOG})
    consumer.resume_flow()  # "Resuming flow..." to read the changelog
    clock.now += recovery_seconds
    consumer.pause_partitions({CHANGELOG})  # "Done reading from changelog topics"
    await app.tables.recovery.on_recovery_completed(generation_id=generation)
    assert not app.rebalancing and SOURCE in consumer._get_active_partitions()


#: Seconds between Faust's livelock checks with its defaults (2.5 x ``broker_commit_interval``).
CHECK_INTERVAL = 2.5 * 2.8


def between_rebalances(
    consumer: Any, clock: MonotonicClock, seconds: float, events: bool
) -> list[float]:
    """Faust's livelock checks of SOURCE for ``seconds``, each ``CHECK_INTERVAL`` after the
    last, the stream getting an event before each if ``events``; returns their times."""
    checks = []
    start = clock.now
    while clock.now + CHECK_INTERVAL - start < seconds:
        clock.now += CHECK_INTERVAL
        if events:
            consumer.app.monitor.stream_inbound_time[SOURCE] = clock.now  # on_stream_event_in
        consumer.verify_event_path(clock.now, SOURCE)
        checks.append(clock.now)
    return checks


@pytest.mark.parametrize("live_periods", [0, 3])
def test_a_stream_stuck_across_rebalances_is_reported_a_timeout_after_its_last_event(
    tmp_path: Path,
    faust_stops_flow: None,
    livelock_checks: tuple[MonotonicClock, list[float]],
    live_periods: int,
) -> None:
    """Rebalances 200 s apart, less than ``stream_processing_timeout`` (300 s), all keeping
    SOURCE, whose stream gets events for ``live_periods`` periods between them, then none (an
    agent stuck). Renewed at every ``resume_flow()``, the exemption never let Faust's check
    reach SOURCE (0 of 290 checks over 10 rebalances). Now it reaches it from a
    timeout after the end of the first rebalance since the stream's last event (or since its
    assignment), at most one check later, and at every check after."""
    clock, reached = livelock_checks
    stuck_checks: list[float] = []
    ends: list[float] = []

    async def rebalances() -> float:
        consumer = flow_worker(tmp_path)
        stub_seek(consumer, [])
        for generation in range(1, 12):
            await faust_rebalance(consumer, clock, generation)
            ends.append(clock.now)
            live = generation <= live_periods
            checks = between_rebalances(consumer, clock, 200, events=live)
            if not live:
                stuck_checks.extend(checks)
        return float(consumer.app.conf.stream_processing_timeout)

    timeout = asyncio.run(rebalances())
    started = ends[live_periods]  # the end of the first rebalance after the last event
    reported = [t for t in reached if t in stuck_checks]
    assert reported, "a stream stuck through 10 rebalances was never checked"
    assert started + timeout <= reported[0] <= started + timeout + CHECK_INTERVAL
    assert reported == [t for t in stuck_checks if t >= reported[0]]


@pytest.mark.parametrize("case", ["new", "kept_with_events", "kept_event_just_before"])
def test_a_partition_is_not_reported_as_never_started_until_a_timeout_after_the_flow_resumed(
    tmp_path: Path,
    faust_stops_flow: None,
    livelock_checks: tuple[MonotonicClock, list[float]],
    case: str,
) -> None:
    """Faust stops the flow for a rebalance's table recovery and forgets every stream's last
    event at the rebalance's start and end, also of the partitions it kept: counted from the
    assignment alone, a recovery longer than ``stream_processing_timeout`` (here 6 min) or a
    kept partition got the false "Stream has not started processing" ERROR at the first check
    after the resume. A partition new to this worker, or kept with events since
    the last rebalance (one 1 s before it too: Faust's revoke listener forgets it before any
    callback of ours runs), counts from the resume; a timeout later, still without an event,
    it is checked."""
    clock, reached = livelock_checks

    async def resumed_then_checked() -> tuple[float, float]:
        consumer = flow_worker(tmp_path)
        stub_seek(consumer, [])
        timeout = float(consumer.app.conf.stream_processing_timeout)
        if case != "new":  # SOURCE assigned 10 min ago, with events since
            await faust_rebalance(consumer, clock, 1)
            between_rebalances(consumer, clock, 600, events=case == "kept_with_events")
            clock.now += 1
            consumer.app.monitor.stream_inbound_time[SOURCE] = clock.now
        await faust_rebalance(consumer, clock, 2, recovery_seconds=timeout + 60)
        resumed = clock.now
        reached.clear()
        consumer.verify_event_path(resumed + 5, SOURCE)  # no event yet: not checked
        consumer.verify_event_path(resumed + timeout, SOURCE)  # still none: checked
        return resumed, timeout

    resumed, timeout = asyncio.run(resumed_then_checked())
    assert reached == [resumed + timeout]


def test_a_changelog_partition_is_checked_by_faust_as_it_is(
    tmp_path: Path, faust_stops_flow: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table's changelog partition, active or standby, never has a stream event: Faust's
    check of it is its fetch path's (no fetch request sent, none in the last n s), with no
    "Stream has not started processing" to exempt it from. Skipped for a timeout after every
    resume, a standby whose fetching stopped went unreported."""
    from faust.transport.drivers import aiokafka as faust_aiokafka

    reached: list[TP] = []
    monkeypatch.setattr(
        faust_aiokafka.Consumer, "verify_event_path", lambda self, now, tp: reached.append(tp)
    )

    async def resumed_then_checked() -> None:
        consumer = flow_worker(tmp_path)
        stub_seek(consumer, [])
        await faust_rebalance(consumer, MonotonicClock(), 1)
        consumer.verify_event_path(time.monotonic() + 100, CHANGELOG)
        consumer.verify_event_path(time.monotonic() + 100, SOURCE)

    asyncio.run(resumed_then_checked())
    assert reached == [CHANGELOG]


def test_a_stopped_app_with_our_assignor_and_transport_is_garbage_collected(
    tmp_path: Path, built_faust_apps: list[faust.App]
) -> None:
    """Faust keeps an app's signal receivers in the class-level signal (``AppT``'s, shared by
    every app): the assignor's and the consumer's strong receivers kept each app, its tables
    and its state directory's objects alive for as long as the process. Weak ones do not."""
    app = table_app(tmp_path)
    app.assignor.metadata({SOURCE.topic})  # opens the state directory
    consumer = app.consumer  # our transport's consumer connects its receiver
    close_app(app)  # the app stops: ``on_before_shutdown``
    built_faust_apps.remove(app)
    gone = [weakref.ref(held) for held in (app, app.assignor, consumer)]
    del app, consumer
    gc.collect()
    assert [ref() for ref in gone] == [None, None, None]


def test_the_signal_receivers_fire_while_the_app_lives(tmp_path: Path) -> None:
    """Held weakly, the receivers still fire for an app only the test holds: the recovery
    completes for the assignor (its recovered tag) and for the consumer (the offsets it read
    are proven), and the app's stop releases the state directory."""
    app = table_app(tmp_path)
    app.assignor.metadata({SOURCE.topic})
    app.consumer  # noqa: B018 (made on first use)
    gc.collect()  # nothing but the app holds its assignor and consumer
    state = Path(app.conf.appdir) / "streamassign"
    with pytest.raises(StateDirectoryLockedError):
        StateDirectory(state)

    asyncio.run(app.on_rebalance_complete.send())
    assert app.assignor.recovery_scope.settled  # no consumer's membership to scope it
    assert app.consumer.proven_offsets.recovered_since_assignment
    asyncio.run(app.on_before_shutdown.send())
    StateDirectory(state).close()  # not locked any more


def test_the_join_error_watch_starts_when_the_consumer_subscribes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A principal without READ on the group fails at aiokafka's coordinator lookup, before
    any join starts the assignor's watch; aiokafka keeps the error for a poll Faust never
    makes. The subscription starts the watch, so the error is logged and taken (and aiokafka
    looks the coordinator up again) instead of the worker waiting silently for good."""
    from aiokafka.errors import GroupAuthorizationFailedError
    from faust.transport.drivers import aiokafka as faust_aiokafka

    from streamassign.faust._watch import JoinErrors

    subscribed: list[set[str]] = []

    async def faust_subscribe(self: Any, topics: Any) -> None:
        subscribed.append(set(topics))

    async def on_this_loop(fun: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await fun(*args, **kwargs)  # the thread is not started: run it here

    monkeypatch.setattr(faust_aiokafka.AIOKafkaConsumerThread, "subscribe", faust_subscribe)
    app = table_app(tmp_path)
    app.assignor.join_errors = JoinErrors(first=0.01)  # type: ignore[attr-defined]
    thread = app.consumer._thread
    monkeypatch.setattr(thread, "call_thread", on_this_loop)
    kept: list[Exception] = [GroupAuthorizationFailedError("orders-app")]

    def check_errors() -> None:
        if kept:
            raise kept.pop()

    thread._consumer = SimpleNamespace(
        _coordinator=SimpleNamespace(group_id="orders-app", check_errors=check_errors)
    )

    async def run() -> None:
        await thread.subscribe(["orders"])
        deadline = time.monotonic() + 5
        while kept:
            assert time.monotonic() < deadline, "the kept error was never taken"
            await asyncio.sleep(0.005)
        app.assignor.join_errors.cancel()  # type: ignore[attr-defined]

    with caplog.at_level(logging.ERROR, "streamassign.faust"):
        asyncio.run(run())
    assert subscribed == [{"orders"}]
    assert "not authorized to the group 'orders-app'" in caplog.text


def test_any_assignment_ends_the_join_error_watch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also one of aiokafka's round robin (an app without tables during a rolling switch),
    which never reaches the assignor: the watch would look on for good, taking errors meant
    for the running worker and logging them as join errors."""
    from faust.transport.drivers import aiokafka as faust_aiokafka

    async def faust_s(listener: Any, assigned: Any) -> None:
        pass

    monkeypatch.setattr(faust_aiokafka.ConsumerRebalanceListener, "on_partitions_assigned", faust_s)
    app = table_app(tmp_path)
    ended: list[str] = []
    monkeypatch.setattr(app.assignor.join_errors, "joined", lambda: ended.append("joined"))
    thread = app.consumer._thread
    thread._consumer = SimpleNamespace(_coordinator=SimpleNamespace(member_id="m-1", generation=1))
    asyncio.run(app.consumer.RebalanceListener(thread).on_partitions_assigned([]))
    assert ended == ["joined"]
