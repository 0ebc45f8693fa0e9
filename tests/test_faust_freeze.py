"""The freeze watch of the ``streamassign://`` consumer: an assigned stream partition that
receives nothing although records wait, the flow resumed and no rebalance under way, is told
once (and resumed if it was left paused in Faust's consumer); a partition the app paused, one
whose agent's queue is full, one at its highwater, a worker whose fetching stopped altogether,
and every partition while the flow is stopped, a rebalance or recovery is under way or the
worker stops are not."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

faust = pytest.importorskip("faust")

from faust.transport.drivers import aiokafka as faust_aiokafka  # noqa: E402
from faust.types import TP  # noqa: E402

from streamassign.faust._freeze import FreezeWatch, StreamLook  # noqa: E402

S0, S1 = TP("orders", 0), TP("orders", 1)
CHANGELOG = TP("orders-app-totals-changelog", 0)
FROZEN = "stream partitions receive nothing although records wait"


def moving(position: int) -> StreamLook:
    return StreamLook(position=position, highwater=position + 100)


def test_a_partition_still_while_the_worker_receives_is_frozen_once() -> None:
    watch = FreezeWatch(bound=10.0)
    still = StreamLook(position=5, highwater=9_000)
    assert watch.look(0.0, {S0: moving(0), S1: still}, received=0) == ([], [])
    assert watch.look(9.0, {S0: moving(50), S1: still}, received=50) == ([], [])
    frozen, _ = watch.look(10.0, {S0: moving(60), S1: still}, received=60)
    assert [(f.partition, f.lag, f.still_for, f.paused_by_faust) for f in frozen] == [
        (S1, 8_995, 10.0, False)
    ]
    assert watch.look(30.0, {S0: moving(90), S1: still}, received=90) == ([], [])  # once
    assert watch.look(31.0, {S0: moving(91), S1: moving(6)}, received=92) == ([], [S1])


@pytest.mark.parametrize(
    ("look", "received"),
    [
        (StreamLook(position=5, highwater=5), 60),  # at its highwater: nothing waits
        (StreamLook(position=5, highwater=900, buffer_full=True), 60),  # a slow agent
        (StreamLook(position=5, highwater=900, records_buffered=True), 60),  # a slow worker
        (StreamLook(position=5, highwater=900), 0),  # nothing of the worker moved
    ],
    ids=["caught up", "queue full", "fetched not taken yet", "worker still"],
)
def test_a_still_partition_with_a_reason_is_not_frozen(look: StreamLook, received: int) -> None:
    watch = FreezeWatch(bound=10.0)
    watch.look(0.0, {S1: look}, received=0)
    assert watch.look(100.0, {S1: look}, received=received) == ([], [])


def test_a_partition_paused_in_faust_s_consumer_is_frozen_even_with_the_worker_still() -> None:
    """Its records buffered in aiokafka too: Faust does not ask for them."""
    watch = FreezeWatch(bound=10.0)
    paused = StreamLook(position=5, highwater=None, paused_by_faust=True, records_buffered=True)
    watch.look(0.0, {S1: paused}, received=0)
    frozen, _ = watch.look(10.0, {S1: paused}, received=0)
    assert [f.partition for f in frozen] == [S1] and frozen[0].lag is None


def test_a_restart_forgets_the_clocks_and_the_freezes_told() -> None:
    watch = FreezeWatch(bound=10.0)
    still = StreamLook(position=5, highwater=900, paused_by_faust=True)
    watch.look(0.0, {S1: still}, received=0)
    watch.restart()  # a rebalance
    assert watch.look(9.0, {S1: still}, received=0) == ([], [])
    assert len(watch.look(19.0, {S1: still}, received=0)[0]) == 1


class FetchState:
    """What the watch reads of aiokafka's state of one partition."""

    def __init__(self, position: int, highwater: int) -> None:
        self._position, self.highwater, self.lso = position, highwater, None
        self.paused = self.awaiting_reset = False


class AiokafkaConsumer:
    """aiokafka's consumer as the watch reads it: the assignment and each partition's state."""

    def __init__(self, states: dict[TP, FetchState]) -> None:
        self.states = states
        self._fetcher = SimpleNamespace(_records={})  # fetched, not handed to Faust yet
        assignment = SimpleNamespace(state_value=states.get)
        self._subscription = SimpleNamespace(subscription=SimpleNamespace(assignment=assignment))

    def assignment(self) -> set[TP]:
        return set(self.states)


def worker(tmp_path: Path, states: dict[TP, FetchState]) -> Any:
    """A worker after a rebalance that assigned ``states`` (and a changelog): recovered, its
    stream partitions released, the flow resumed; the freeze watch with a 0.1 s bound."""
    app = faust.App(
        "orders-app",
        broker="streamassign://localhost:1",
        datadir=str(tmp_path),
        PartitionAssignor="streamassign.faust:PartitionAssignor",
    )
    app.Table("totals", default=int)
    consumer = app.consumer
    consumer.stream_freeze_after = 0.1
    consumer._thread._consumer = AiokafkaConsumer(states)
    tps = {*states, CHANGELOG}
    consumer.assignment = lambda: set(tps)
    rebalance(consumer)
    return consumer


def rebalance(consumer: Any) -> None:
    """A whole rebalance keeping the assignment, as Faust's calls on the consumer make it."""
    consumer.app.on_rebalance_start()
    consumer.stop_flow()
    consumer.pause_partitions(consumer.assignment())
    consumer.resume_partitions({tp for tp in consumer.assignment() if tp != CHANGELOG})  # held
    consumer.resume_flow()
    consumer.app.on_rebalance_end()


async def run_for(consumer: Any, seconds: float, states: dict[TP, FetchState]) -> None:
    """``seconds`` of the worker processing S0 (its position and received count moving)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await processing(consumer, states)


async def run_until(consumer: Any, states: dict[TP, FetchState], done: Any) -> None:
    """The worker processing S0 until ``done()``, within 10 s."""
    deadline = time.monotonic() + 10
    while not done():
        assert time.monotonic() < deadline, "the watch did not act within 10 s"
        await processing(consumer, states)


async def processing(consumer: Any, states: dict[TP, FetchState]) -> None:
    received(consumer, states)
    await asyncio.sleep(0.01)


def received(consumer: Any, states: dict[TP, FetchState]) -> None:
    """The worker received a record of S0."""
    states[S0]._position += 1
    consumer.app.monitor.messages_received_total += 1


def test_a_partition_left_paused_in_faust_s_consumer_is_told_and_resumed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The audit's freeze: after a rebalance one stream partition stays out of Faust's active
    set (whatever put it there) while its sibling flows. One WARNING with its position and lag;
    it is resumed, and its records arriving again are told."""
    states = {S0: FetchState(100, 9_000), S1: FetchState(2_132, 11_344)}

    async def freeze() -> Any:
        consumer = worker(tmp_path, states)
        faust_aiokafka.Consumer.pause_partitions(consumer, {S1})  # none of ours saw it
        await run_until(consumer, states, lambda: S1 in consumer._get_active_partitions())
        states[S1]._position += 5
        await run_until(consumer, states, lambda: "receive records again" in caplog.text)
        return consumer

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        consumer = asyncio.run(freeze())
        consumer._freeze_watch.stop()
    warnings = [r.getMessage() for r in caplog.records if FROZEN in r.getMessage()]
    assert len(warnings) == 1
    assert "orders[1] at 2132 of 11344 (lag 9212;" in warnings[0]
    assert "Faust: paused" in warnings[0] and "resumed them now" in warnings[0]
    assert "orders[0]" not in warnings[0]
    assert "stream partitions orders[1] receive records again" in caplog.text


def test_a_partition_faust_asks_for_in_vain_is_told_not_resumed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    states = {S0: FetchState(100, 9_000), S1: FetchState(2_132, 11_344)}

    async def freeze() -> None:
        consumer = worker(tmp_path, states)
        await run_until(consumer, states, lambda: FROZEN in caplog.text)
        await run_for(consumer, 0.3, states)  # three bounds more: told once
        consumer._freeze_watch.stop()

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        asyncio.run(freeze())
    assert caplog.text.count(FROZEN) == 1
    assert "Faust: active" in caplog.text and "ends if the worker restarts" in caplog.text
    assert "resumed them" not in caplog.text


@pytest.mark.parametrize(
    "case",
    [
        "paused by the app",
        "agent's queue full",
        "fetched, not taken yet",
        "rebalancing",
        "flow stopped",
        "table recovery",
        "open transaction",
    ],
)
def test_a_partition_still_for_a_reason_is_not_told(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    states = {S0: FetchState(100, 9_000), S1: FetchState(2_132, 11_344)}

    async def still() -> Any:
        consumer = worker(tmp_path, states)
        if case == "paused by the app":
            consumer.pause_partitions({S1})  # Faust's public API, outside a rebalance
        elif case == "agent's queue full":
            consumer.on_buffer_full(S1)  # Faust's flow control (the conductor's callback)
        elif case == "fetched, not taken yet":  # a loaded worker: Faust takes them later
            consumer._thread._consumer._fetcher._records[S1] = object()
        elif case == "rebalancing":
            consumer.app.on_rebalance_start()
        elif case == "flow stopped":  # as Faust's stop and revoke stop it first
            consumer.stop_flow()
        elif case == "table recovery":
            consumer.app.tables.recovery.in_recovery = True
        else:  # read_committed: nothing past the last stable offset is handed out
            consumer.in_transaction = True
            states[S1].lso = states[S1]._position
        await run_for(consumer, 0.3, states)
        consumer._freeze_watch.stop()
        return consumer

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        consumer = asyncio.run(still())
    assert FROZEN not in caplog.text
    if case == "paused by the app":
        assert S1 not in consumer._get_active_partitions()  # still paused: the app's


@pytest.mark.parametrize(
    ("read_committed", "lso"),
    [(False, 2_132), (True, -1)],
    ids=["read_uncommitted", "no last stable offset known"],
)
def test_a_last_stable_offset_counts_only_under_read_committed_and_when_known(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, read_committed: bool, lso: int
) -> None:
    """Under read_uncommitted the position may pass the last stable offset (records of open
    transactions are handed out); -1 is Kafka's "none known": the highwater is the end then."""
    states = {S0: FetchState(100, 9_000), S1: FetchState(2_132, 11_344)}
    states[S1].lso = lso

    async def freeze() -> None:
        consumer = worker(tmp_path, states)
        consumer.in_transaction = read_committed
        await run_until(consumer, states, lambda: FROZEN in caplog.text)
        consumer._freeze_watch.stop()

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        asyncio.run(freeze())
    assert "orders[1] at 2132 of 11344 (lag 9212;" in caplog.text


def test_past_ten_partitions_the_line_says_how_many_more(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    states = {S0: FetchState(100, 9_000)}
    states |= {TP("orders", p): FetchState(10, 500) for p in range(1, 13)}

    async def freeze() -> None:
        consumer = worker(tmp_path, states)
        await run_until(consumer, states, lambda: FROZEN in caplog.text)
        consumer._freeze_watch.stop()

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        asyncio.run(freeze())
    assert caplog.text.count("(lag 490;") == 10 and " and 2 more; " in caplog.text


@pytest.mark.parametrize("stopping", ["consumer", "app"])
def test_the_watch_ends_when_the_worker_stops(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, stopping: str
) -> None:
    states = {S0: FetchState(100, 9_000), S1: FetchState(2_132, 11_344)}

    async def stop() -> Any:
        consumer = worker(tmp_path, states)
        (consumer if stopping == "consumer" else consumer.app)._stopped.set()
        await run_for(consumer, 0.3, states)
        return consumer

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        consumer = asyncio.run(stop())
    assert not consumer._freeze_watch.running
    assert FROZEN not in caplog.text


def test_the_previous_recovery_ending_during_the_next_rebalance_leaves_it_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The next rebalance's revoke stopped the flow and paused everything; then the previous
    recovery resumes the flow and ends its rebalance (``app.rebalancing`` false) while the next
    one's join is under way: nothing is told, nothing resumed."""
    states = {S0: FetchState(100, 9_000), S1: FetchState(2_132, 11_344)}

    async def late() -> Any:
        consumer = worker(tmp_path, states)
        consumer.app.on_rebalance_start()
        await consumer.on_partitions_revoked(set())  # Faust's: the flow stopped, all paused
        consumer.resume_flow()  # the previous recovery, late
        consumer.app.on_rebalance_end()
        await asyncio.sleep(0.3)  # three bounds; nothing of this worker moves
        consumer._freeze_watch.stop()
        return consumer

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        consumer = asyncio.run(late())
    assert FROZEN not in caplog.text
    assert not {S0, S1} & consumer._get_active_partitions()


def test_an_app_pause_while_faust_seeks_stays_the_app_s(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Faust's recovery resumed the flow ("Resuming flow..."), then the stream partitions, and
    seeks them; the app pauses S1 meanwhile. The hold keeps S1 paused past the release, and the
    watch leaves it so: the app's pause, not one left over by Faust."""
    states = {S0: FetchState(100, 9_000), S1: FetchState(2_132, 11_344)}

    async def pause_in_seek() -> Any:
        consumer = worker(tmp_path, states)
        consumer._on_partitions_assigned = faust_assigned(consumer)
        consumer.app.on_rebalance_start()
        await consumer.on_partitions_revoked(set())
        await consumer.on_partitions_assigned(consumer.assignment(), 2)
        consumer.resume_flow()  # the recovery's first
        consumer.resume_partitions({S0, S1})  # held
        consumer.pause_partitions({S1})  # the app, while Faust seeks
        consumer.resume_flow()  # the release
        consumer.app.on_rebalance_end()
        await run_for(consumer, 0.3, states)
        consumer._freeze_watch.stop()
        return consumer

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        consumer = asyncio.run(pause_in_seek())
    assert FROZEN not in caplog.text
    active = consumer._get_active_partitions()
    assert S0 in active and S1 not in active


def faust_assigned(consumer: Any) -> Any:
    """``App._on_partitions_assigned`` reduced to its call on the consumer: it pauses every
    assigned partition (with the flow still resumed at a worker's first assignment)."""

    async def assigned(assigned: set[TP], generation_id: int = 0) -> None:
        consumer.pause_partitions(assigned)

    return assigned


def test_a_partition_still_before_a_rebalance_is_not_told_right_after_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A rebalance seeks and releases every stream partition: its stillness before counts
    for nothing, whether a look saw the rebalance or it began and ended between two looks.
    Looks by hand on a fake clock (bound 0.1 s)."""
    states = {S0: FetchState(100, 9_000), S1: FetchState(2_132, 11_344)}
    told_at = []

    async def looks() -> None:
        consumer = worker(tmp_path, states)
        consumer._freeze_watch.stop()
        loop = asyncio.get_running_loop()

        def look(at: float) -> None:
            received(consumer, states)
            loop.time = lambda: at  # type: ignore[method-assign]
            try:
                consumer._on_freeze_watch()
            finally:
                del loop.time
            if FROZEN in caplog.text and not told_at:
                told_at.append(at)

        look(0.0)
        look(0.05)
        consumer.app.on_rebalance_start()
        look(0.5)  # a look sees the rebalance
        rebalance(consumer)
        look(0.55)
        look(0.6)
        rebalance(consumer)  # no look sees this one
        for at in (0.7, 0.75, 0.8, 0.9, 1.0):
            look(at)

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        asyncio.run(looks())
    assert told_at == [0.9]
