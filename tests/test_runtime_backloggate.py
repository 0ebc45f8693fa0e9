"""The processing gate of a consumer probably out of its group without knowing it (at least
once): cut off from the broker past its session timeout, it would otherwise process its whole
fetched backlog at the heal before a refused request told it so. No broker: a fake clock and
stand-ins for aiokafka's group coordinator (``_do_heartbeat``, ``_heartbeat_task``).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition as KafkaTopicPartition

from streamassign import Subtopology, Topology
from streamassign.aiokafka.rejoin import HeartbeatSilence, watch_heartbeats
from streamassign.runtime import App
from streamassign.runtime.processing import GATE_INTERVAL_SLACK, GATE_MARGIN, CutOffGate
from tests.test_runtime_ownership import INPUT, Count, batch, batch_of, make, outputs, stalling_at

SESSION = 6.0
INTERVAL = 2.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Routine:
    """Stands in for aiokafka's heartbeat routine task while it runs."""

    def done(self) -> bool:
        return False


class Coordinator:
    """aiokafka's group coordinator as the gate reads it: ``_do_heartbeat`` answers
    ``accepting`` (the broker accepted the heartbeat, or not)."""

    def __init__(self) -> None:
        self.accepting = True
        self._heartbeat_task: Any = Routine()
        self.member_id, self.generation = "m-1", 1

    async def _do_heartbeat(self) -> bool:
        return self.accepting


def beat(consumer: Any) -> bool:
    """One heartbeat through the (wrapped) routine's call."""
    accepted: bool = asyncio.run(consumer._coordinator._do_heartbeat())
    return accepted


def watched(clock: Clock) -> tuple[HeartbeatSilence, Any]:
    consumer = SimpleNamespace(_coordinator=Coordinator())
    return HeartbeatSilence(clock), consumer


def test_the_silence_counts_from_the_last_accepted_heartbeats_send_while_a_routine_runs() -> None:
    clock = Clock()
    silence, consumer = watched(clock)
    assert silence.seconds(consumer) == 0.0  # the routine seen now: counted from here
    clock.now += 3.0
    assert silence.seconds(consumer) == 3.0
    assert beat(consumer)  # sent (and accepted) at +3
    clock.now += 2.0
    assert silence.seconds(consumer) == 2.0
    consumer._coordinator.accepting = False
    assert not beat(consumer)  # refused: no news
    clock.now += 4.0
    assert silence.seconds(consumer) == 6.0
    consumer._coordinator._heartbeat_task = None  # a join, or a member id reset
    assert silence.seconds(consumer) == 0.0
    consumer._coordinator._heartbeat_task = Routine()  # the next membership's routine
    clock.now += 1.0
    assert silence.seconds(consumer) == 0.0
    clock.now += 1.5
    assert silence.seconds(consumer) == 1.5


def test_the_silence_reads_none_it_cannot_measure() -> None:
    clock = Clock()
    silence, consumer = HeartbeatSilence(clock), SimpleNamespace()
    assert silence.seconds(consumer) == 0.0  # no coordinator yet
    consumer._coordinator = Coordinator()
    assert silence.seconds(consumer) == 0.0
    clock.now += 5.0
    assert silence.seconds(consumer) == 5.0  # watched once it came

    other = SimpleNamespace(_coordinator=Coordinator())
    assert watch_heartbeats(other, lambda sent: None, lambda: False)  # another watcher's wrap
    late = HeartbeatSilence(clock)
    assert late.seconds(other) == 0.0
    clock.now += 60.0
    assert late.seconds(other) == 0.0  # it would never see an accepted heartbeat


def gate_of(clock: Clock) -> tuple[CutOffGate, Any, list[bool]]:
    lost = [False]
    return (
        CutOffGate.of(1, SESSION, INTERVAL, clock),
        SimpleNamespace(_coordinator=Coordinator()),
        lost,
    )


def test_the_gate_closes_near_the_session_and_opens_at_an_accepted_heartbeat(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    gate, consumer, lost = gate_of(clock)
    assert not gate.closed(0, consumer, lambda i: lost[i])
    consumer._coordinator.accepting = False
    clock.now += SESSION - GATE_MARGIN - 0.01
    assert not gate.closed(0, consumer, lambda i: lost[i])
    clock.now += 0.02
    with caplog.at_level(logging.INFO, "streamassign.runtime"):
        assert gate.closed(0, consumer, lambda i: lost[i])
        clock.now += 10.0
        assert gate.closed(0, consumer, lambda i: lost[i])
        consumer._coordinator.accepting = True
        assert beat(consumer)
        assert not gate.closed(0, consumer, lambda i: lost[i])
        assert not gate.closed(0, consumer, lambda i: lost[i])
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in lines] == ["WARNING", "INFO"]
    assert "no heartbeat accepted for 5.8 s (session timeout 6.0 s)" in lines[0][1]
    assert "processing again after 10.0 s (a heartbeat was accepted)" in lines[1][1]


def test_a_lost_membership_closes_the_gate_until_it_is_assigned_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    gate, consumer, lost = gate_of(clock)
    assert not gate.closed(0, consumer, lambda i: lost[i])
    # The broker answered UnknownMemberId: aiokafka reset the member id and its heartbeat
    # routine ended (the silence reads 0), before the revoke callback.
    consumer._coordinator._heartbeat_task, lost[0] = None, True
    with caplog.at_level(logging.INFO, "streamassign.runtime"):
        assert gate.closed(0, consumer, lambda i: lost[i])
        clock.now += 1.0
        consumer._coordinator._heartbeat_task, lost[0] = Routine(), False  # assigned again
        assert not gate.closed(0, consumer, lambda i: lost[i])
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "its member id was reset" in messages[0]
    assert [r.levelname for r in caplog.records] == ["INFO", "INFO"]  # aiokafka's WARNING says it
    assert "processing again after 1.0 s (assigned again after a rejoin)" in messages[1]


def test_a_heartbeat_interval_near_the_session_does_not_close_the_gate_at_each_heartbeat() -> None:
    """aiokafka accepts an interval just under the session: one interval's silence is no sign."""
    assert CutOffGate.of(1, 10.0, 3.0).threshold == pytest.approx(10.0 - GATE_MARGIN)
    assert CutOffGate.of(1, 10.0, 9.7).threshold == pytest.approx(9.7 + GATE_INTERVAL_SLACK)


def test_the_gate_gives_its_answer_again_only_within_reuse() -> None:
    clock = Clock()
    gate, consumer, lost = gate_of(clock)
    assert not gate.closed(0, consumer, lambda i: lost[i], reuse=0.05)
    lost[0] = True
    clock.now += 0.04
    assert not gate.closed(0, consumer, lambda i: lost[i], reuse=0.05)
    assert gate.closed(0, consumer, lambda i: lost[i])  # no reuse: looked afresh
    clock.now += 0.06
    lost[0] = False
    assert not gate.closed(0, consumer, lambda i: lost[i], reuse=0.05)


async def never_wakes(seconds: float) -> None:
    """The gate watcher's sleep in tests of the loop's own checks: it looks once, at the
    loop's start, and never again."""
    await asyncio.get_running_loop().create_future()


def sleeper_on(clock: Clock) -> Any:
    """``asyncio.sleep`` on the fake clock: the sleeper wakes once the test moved the clock
    past its end."""

    async def sleep(seconds: float) -> None:
        end = clock.now + seconds
        while clock.now < end:
            await asyncio.sleep(0)

    return sleep


def cut_app(tmp_path: Path, watched: bool = False) -> tuple[App, Any, Any, Clock]:
    """``make``'s app (task 0_0 on consumer 0), its gate on a fake clock (its watcher
    sleeping on it if ``watched``, else never waking) and consumer 0 with a stand-in
    coordinator."""
    app, _, recorder, consumers = make(tmp_path)
    clock = Clock()
    sleep = sleeper_on(clock) if watched else never_wakes
    app._gate = CutOffGate.of(2, SESSION, INTERVAL, clock, sleep)
    consumers[0]._coordinator = Coordinator()  # type: ignore[attr-defined]
    app.commit_interval = 3600.0  # no commit in these tests
    assert not app._cut_off(0)  # the heartbeat routine seen: the silence counts from now
    return app, recorder, consumers[0], clock


def test_a_batch_under_way_stops_at_its_next_record_when_the_gate_closes(tmp_path: Path) -> None:
    app, recorder, consumer, clock = cut_app(tmp_path)

    async def run() -> None:
        with stalling_at(3):
            Count.gate = asyncio.Event()
            running = asyncio.ensure_future(batch_of(app, 0, batch(0, 10)))
            while not Count.stalled:
                await asyncio.sleep(0)
            consumer._coordinator.accepting = False
            clock.now += SESSION  # no heartbeat accepted meanwhile
            Count.gate.set()
            await running

    asyncio.run(run())
    assert outputs(recorder) == [0, 1, 2, 3]  # the record under way finishes normally
    assert consumer.seeks[-1] == (INPUT, 4)  # the rest is read again


class Polled:
    """Consumer 0's polls: ``getmany()`` hands out ``fetched`` (then nothing), running
    ``during`` first; a poll restricted to a partition (``_poll_nothing``) hands out none."""

    def __init__(self, app: App, fetched: dict[Any, list[Any]], during: Any = None) -> None:
        self.app, self.fetched, self.during = app, fetched, during
        self.calls: list[tuple[Any, ...]] = []

    async def getmany(self, *partitions: Any, timeout_ms: int = 0) -> dict[Any, list[Any]]:
        self.calls.append(partitions)
        await asyncio.sleep(0)
        if partitions:
            return {}
        if self.during is not None:
            self.during()
        fetched, self.fetched = self.fetched, {}
        if not fetched:  # one batch only: the loop then ends
            self.app._stopped.set()
        return fetched


def consume(app: App, polled: Polled, consumer: Any, polls: int) -> None:
    """Consumer 0's loop, stopped after ``polls`` polls if nothing stopped it before."""
    consumer.getmany = polled.getmany

    async def run() -> None:
        loop = asyncio.ensure_future(app._consume(0))
        while not loop.done() and len(polled.calls) < polls:
            await asyncio.sleep(0)
        app._stopped.set()
        await loop

    asyncio.run(run())


def test_a_cut_off_consumer_polls_without_taking_records_until_a_heartbeat_is_accepted(
    tmp_path: Path,
) -> None:
    app, recorder, consumer, clock = cut_app(tmp_path)
    consumer._coordinator.accepting = False
    clock.now += SESSION
    polled = Polled(app, batch(0, 5))
    consume(app, polled, consumer, polls=20)
    assert len(polled.calls) >= 20
    assert all(partitions == (KafkaTopicPartition("", -1),) for partitions in polled.calls)
    assert outputs(recorder) == []

    app._stopped.clear()
    consumer._coordinator.accepting = True
    assert beat(consumer)  # heard from the broker again: it processes
    polled = Polled(app, batch(0, 5))
    consume(app, polled, consumer, polls=100)
    assert outputs(recorder) == [0, 1, 2, 3, 4]


def test_a_batch_fetched_as_the_gate_closes_is_rewound_not_processed(tmp_path: Path) -> None:
    app, recorder, consumer, clock = cut_app(tmp_path)
    consumer._coordinator.accepting = False

    def silent_past_the_session() -> None:
        clock.now += SESSION

    polled = Polled(app, batch(0, 5), during=silent_past_the_session)
    consume(app, polled, consumer, polls=1)
    assert outputs(recorder) == []
    assert consumer.seeks == [(INPUT, 0)]


def test_exactly_once_has_no_gate(tmp_path: Path) -> None:
    topology = Topology([Subtopology(0, ["in"], stores=["counts"])], name="app")
    app = App(
        topology,
        {0: Count},
        bootstrap_servers="unused:1",
        state_dir=tmp_path,
        processing_guarantee="exactly_once",
    )
    assert app._gate is None
    assert not app._cut_off(0)


def test_a_batch_fetched_just_as_the_gate_closes_is_rewound(tmp_path: Path) -> None:
    """The loop looked just before the threshold; the poll crosses it by less than the reuse
    of the per-record check, so only the check after the fetch stops this batch."""
    app, recorder, consumer, clock = cut_app(tmp_path)
    consumer._coordinator.accepting = False
    clock.now += SESSION - GATE_MARGIN - 0.01  # open at the loop's top

    def crossing() -> None:
        clock.now += 0.02  # past the threshold, within GATE_REUSE of the loop's look

    polled = Polled(app, batch(0, 5), during=crossing)
    consume(app, polled, consumer, polls=1)
    assert outputs(recorder) == []
    assert consumer.seeks == [(INPUT, 0)]


THRESHOLD = SESSION - GATE_MARGIN


async def step_until(clock: Clock, condition: Any, steps: int, step: float = 0.001) -> None:
    """Move the fake clock ``step`` s at a time, letting every task run between, until
    ``condition()`` holds (at most ``steps`` steps)."""
    for _ in range(steps):
        if condition():
            return
        clock.now = round(clock.now + step, 6)
        for _ in range(5):
            await asyncio.sleep(0)


def test_the_gate_closes_and_warns_on_time_while_the_loop_waits_in_a_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A commit under way at a cut waits for its own bounds (15 s in one measured run): the
    gate closes and says so as the silence passes the threshold, not when the commit
    returns; what the loop fetches after it is not processed."""
    app, recorder, consumer, clock = cut_app(tmp_path, watched=True)
    app.commit_interval = 0.0  # a commit after the first batch
    committing, returned = asyncio.Event(), asyncio.Event()

    async def commit_waiting_for_the_broker(index: int) -> None:
        committing.set()
        await returned.wait()

    monkeypatch.setattr(app._commits, "commit_or_retry", commit_waiting_for_the_broker)
    polled = Polled(app, batch(0, 2))
    consumer.getmany = polled.getmany
    closes = app._gate.closed_since  # type: ignore[union-attr]
    crossing = clock.now + THRESHOLD

    async def run() -> None:
        loop = asyncio.ensure_future(app._consume(0))
        await asyncio.wait_for(committing.wait(), 5)
        polled.fetched = batch(2, 5)  # fetched as the cut began, waiting in the buffer
        clock.now = crossing - 0.01
        await step_until(clock, lambda: closes[0] is not None, steps=20)
        assert not returned.is_set()
        assert closes[0] is not None and crossing < closes[0] <= crossing + 0.002
        assert [r.levelname for r in caplog.records] == ["WARNING"]
        clock.now += 9.0  # the commit returns at its bounds
        returned.set()
        await step_until(clock, lambda: len(polled.calls) > 5, steps=100)
        app._stopped.set()
        await loop

    with caplog.at_level(logging.INFO, "streamassign.runtime"):
        asyncio.run(run())
    assert "no heartbeat accepted for 5.8 s (session timeout 6.0 s)" in caplog.records[0].message
    assert outputs(recorder) == [0, 1]
    assert all(partitions == (KafkaTopicPartition("", -1),) for partitions in polled.calls[1:])


def test_a_batch_under_way_stops_at_the_record_after_the_threshold_not_50_ms_later(
    tmp_path: Path,
) -> None:
    """The check before each record reuses an answer up to ``GATE_REUSE`` old; the watcher's
    look as the silence passes the threshold is the answer it reuses, so the batch stops at
    the next record, not once the loop's own answer is too old."""
    app, recorder, consumer, clock = cut_app(tmp_path, watched=True)
    clock.now += THRESHOLD - 0.01  # open at the loop's top and after the fetch
    polled = Polled(app, batch(0, 10))
    consumer.getmany = polled.getmany

    async def run() -> None:
        with stalling_at(3):
            Count.gate = asyncio.Event()
            loop = asyncio.ensure_future(app._consume(0))
            while not Count.stalled:
                await asyncio.sleep(0)
            clock.now += 0.02  # past the threshold, within GATE_REUSE of the loop's look
            for _ in range(5):
                await asyncio.sleep(0)
            Count.gate.set()
            while len(polled.calls) < 3:
                await asyncio.sleep(0)
            app._stopped.set()
            await loop

    asyncio.run(run())
    assert outputs(recorder) == [0, 1, 2, 3]  # the record under way finishes normally
    assert consumer.seeks[-1] == (INPUT, 4)  # the rest is read again


def test_the_watcher_does_not_look_while_its_consumer_rebalances(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Between the JoinGroup and the new assignment the membership reads lost: a look then
    would close the gate at every rebalance, with a line about a reset member id."""
    clock = Clock()
    gate, consumer, lost = gate_of(clock)
    gate.sleep = sleeper_on(clock)
    rebalancing, lost[0] = [True], True

    async def run() -> None:
        watching = asyncio.ensure_future(
            gate.watch(0, consumer, lambda i: lost[i], lambda: rebalancing[0])
        )
        await step_until(clock, lambda: False, steps=250, step=0.01)
        assert gate.closed_since[0] is None
        rebalancing[0], lost[0] = False, False  # assigned again
        await step_until(clock, lambda: False, steps=110, step=0.01)
        assert gate.closed_since[0] is None
        watching.cancel()

    with caplog.at_level(logging.INFO, "streamassign.runtime"):
        asyncio.run(run())
    assert caplog.records == []


def test_a_failed_gate_watcher_stops_the_application_and_none_outlives_the_loop(
    tmp_path: Path,
) -> None:
    """The watcher is one of the loops: its failure stops the application as theirs does
    (the gate would otherwise fall back to the loop's own looks, unsaid), and no watcher
    runs on after its consumer's loop."""
    app, _, consumer, _ = cut_app(tmp_path, watched=True)
    sleeps = [0]

    async def failing_sleep(seconds: float) -> None:  # only the watcher sleeps on it
        sleeps[0] += 1
        if sleeps[0] == 3:
            raise RuntimeError("a bug in the gate's watcher")
        await asyncio.sleep(0)

    app._gate.sleep = failing_sleep  # type: ignore[union-attr]

    async def nothing_fetched(*partitions: Any, timeout_ms: int = 0) -> dict[Any, list[Any]]:
        await asyncio.sleep(0)
        return {}

    consumer.getmany = nothing_fetched

    async def run() -> list[asyncio.Task[Any]]:
        loop = asyncio.ensure_future(app._consume(0))
        await asyncio.wait_for(app._stopped.wait(), 5)
        await loop
        return [t for t in asyncio.all_tasks() if "gate watcher" in t.get_name()]

    assert asyncio.run(run()) == []
    assert isinstance(app.failure, RuntimeError)
    assert sleeps[0] == 3


def test_no_gate_watcher_outlives_its_consumer_s_loop(tmp_path: Path) -> None:
    app, _, consumer, _ = cut_app(tmp_path, watched=True)
    consumer.getmany = Polled(app, {}).getmany  # nothing fetched: the loop ends

    async def run() -> list[asyncio.Task[Any]]:
        await app._consume(0)
        return [t for t in asyncio.all_tasks() if "gate watcher" in t.get_name()]

    assert asyncio.run(run()) == []
