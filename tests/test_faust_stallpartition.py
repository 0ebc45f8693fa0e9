"""A worker cut off from the broker by the network is a zombie as a stalled one is, with its
event loop running: no heartbeat accepted for longer than the hold's threshold starts the hold,
resolved as after a stall (``streamassign.faust._stallhold``); and a member id reset seen by a
send, with or without a hold, drops the changelog sends from then on. Faust's real producer on
a fake clock, aiokafka's coordinator a stand-in (the live measurement is in docs/faust.md)."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import faust
import pytest

from streamassign.faust._stallhold import TICK, StallHold

from .test_faust_stallhold import CHANGELOG, SINK, Worker, released, run


def _running() -> Any:
    """aiokafka's heartbeat task, as the tick reads it: running."""
    return SimpleNamespace(done=lambda: False)


def _partitioned(worker: Worker, seconds: float) -> None:
    """The loop ticks on for ``seconds``; every heartbeat fails (no answer through)."""
    worker.accepts = False
    for _ in range(round(seconds / TICK)):
        worker.stall(TICK)
        worker.look()


def _beating(worker: Worker) -> Worker:
    worker.coordinator._heartbeat_task = _running()
    return worker


def test_sends_made_during_a_partition_are_held_then_dropped_at_the_reset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Within the threshold the sends go out (the broker still holds the session); past it
    they are held, and aiokafka's reset after the heal drops them and every later one until
    the worker joins as a new member. Other topics pass throughout."""
    worker = _beating(Worker(tmp_path, monkeypatch))
    base = time.monotonic()
    worker.producer.clock = lambda: base + worker.skew  # only the partition moves it

    async def partition() -> list[Any]:
        worker.start()
        assert await worker.heartbeat()
        _partitioned(worker, 5.0)
        early = await worker.send(CHANGELOG, b"early")
        _partitioned(worker, 1.5)
        assert worker.producer.stall_hold.holding
        stale = [await worker.send(CHANGELOG, b"stale-1")]
        await worker.send(SINK, b"out")
        worker.coordinator.member_id = ""  # the heal: UnknownMemberId
        worker.coordinator._heartbeat_task = None
        stale.append(await worker.send(CHANGELOG, b"stale-2"))  # before any tick
        worker.look()
        worker.coordinator.member_id = "m-2"
        worker.look()
        await worker.send(CHANGELOG, b"new")
        await asyncio.sleep(0)
        return [early, *stale]

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        futures = run(partition())
    assert worker.sent == [(CHANGELOG, b"early"), (SINK, b"out"), (CHANGELOG, b"new")]
    assert futures[0].done() and not any(f.done() for f in futures[1:])
    assert "no heartbeat of this worker was accepted for 5.8 s (more than 5.8 s" in caplog.text
    assert "dropped 1 after" in caplog.text and "dropped 1 more" in caplog.text


def test_a_reset_without_a_hold_drops_the_next_send_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The zombie's write milliseconds after aiokafka reset the member id, no hold on and no
    tick in between: dropped, as every changelog send until a new member id."""
    worker = _beating(Worker(tmp_path, monkeypatch))

    async def reset() -> list[Any]:
        worker.start()
        first = await worker.send(CHANGELOG, b"owned")
        worker.coordinator.member_id = ""
        stale = await worker.send(CHANGELOG, b"stale")
        worker.look()
        again = await worker.send(CHANGELOG, b"stale-2")
        worker.coordinator.member_id = "m-2"
        new = await worker.send(CHANGELOG, b"new")
        await asyncio.sleep(0)
        return [first, stale, again, new]

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        first, stale, again, new = run(reset())
    assert worker.sent == [(CHANGELOG, b"owned"), (CHANGELOG, b"new")]
    assert first.done() and new.done() and not stale.done() and not again.done()
    assert "membership 'm-1' ended (aiokafka's member id is now '')" in caplog.text
    assert "dropped 2 more until this worker's membership was back (as 'm-2')" in caplog.text


def test_a_short_blip_or_a_broker_restart_that_kept_the_member_releases_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No heartbeat through for longer than the threshold, then one accepted under the same
    member id, which the (possibly new) coordinator lists: the held sends go out in order,
    ahead of later ones."""
    worker = _beating(Worker(tmp_path, monkeypatch))

    async def blip() -> None:
        worker.start()
        _partitioned(worker, 6.0)
        assert worker.producer.stall_hold.holding
        for value in (b"a", b"b"):
            await worker.send(CHANGELOG, value)
        worker.accepts = True
        worker.stall(0.5)
        assert await worker.heartbeat()
        worker.look()
        await worker.send(CHANGELOG, b"c")
        await asyncio.wait_for(released(worker.producer), 2.0)
        await worker.send(CHANGELOG, b"d")
        await asyncio.sleep(0)

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        run(blip())
    assert worker.sent == [(CHANGELOG, v) for v in (b"a", b"b", b"c", b"d")]
    assert "released 3 held changelog send(s)" in caplog.text
    assert not worker.producer.stall_hold.holding


def test_a_rebalance_or_a_first_join_holds_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No heartbeat routine runs during a join (aiokafka stops it for the JoinGroup and starts
    it after SyncGroup, first beating a heartbeat interval later), and heartbeats answered
    REBALANCE_IN_PROGRESS are answers of a known member: no silence, however long the join."""
    worker = Worker(tmp_path, monkeypatch)
    worker.coordinator._heartbeat_task = None

    async def rebalance() -> None:
        worker.start()
        for _ in range(100):  # 10 s of joining
            worker.stall(TICK)
            worker.look()
        worker.coordinator._heartbeat_task = _running()
        for second in range(20):  # beating, each heartbeat answered (or rebalancing: True)
            for _ in range(10):
                worker.stall(TICK)
                worker.look()
            assert await worker.heartbeat(), second
            await worker.send(CHANGELOG, b"%d" % second)

    run(rebalance())
    assert len(worker.sent) == 20
    assert not worker.producer.stall_hold.holding and worker.producer.stall_hold.lost_as is None


def test_accepted_heartbeats_are_recorded_without_a_proof_wanted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = _beating(Worker(tmp_path, monkeypatch))

    async def steady() -> tuple[float, float]:
        worker.start()
        worker.stall(2.0)
        before = worker.producer.clock()
        assert await worker.heartbeat()
        return before, worker.producer.clock()

    before, after = run(steady())
    assert before <= worker.producer.stall_hold.heartbeats.answered <= after
    assert worker.group.asked == 0  # no listing asked for it


def test_a_worker_without_tables_holds_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = _beating(Worker(tmp_path, monkeypatch))
    app: faust.App = worker.app
    monkeypatch.setattr(type(app.tables), "changelog_topics", property(lambda _: set()))

    async def partition() -> None:
        worker.start()
        _partitioned(worker, 6.0)
        await worker.send(CHANGELOG, b"not a changelog here")
        worker.coordinator.member_id = ""
        await worker.send(SINK, b"out")

    run(partition())
    assert worker.sent == [(CHANGELOG, b"not a changelog here"), (SINK, b"out")]


def test_the_silence_counts_from_the_heartbeat_routine_s_start() -> None:
    hold = StallHold(threshold=4.9, silence_threshold=4.9, deadline=7.0)
    task = _running()
    hold.tick(100.0, "m-1")
    hold.heartbeats.answered_at(90.0)
    hold.heartbeats.routine_seen(100.0, task)
    assert not hold.check(104.8)
    hold.heartbeats.routine_seen(104.8, task)  # the same routine: its start stays
    assert hold.check(105.0) and hold.held_as == "m-1" and hold.gap == pytest.approx(5.0)
    hold.end(105.5)
    assert not hold.check(105.6)  # a release on the deadline counts the silence afresh
    hold.heartbeats.routine_seen(106.0, None)
    assert hold.heartbeats.silence(200.0) == 0.0


def test_a_stopping_worker_s_leave_is_told_at_info(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """aiokafka resets the member id when a stopping worker leaves its group: not a zombie."""
    worker = _beating(Worker(tmp_path, monkeypatch))

    async def stop() -> None:
        worker.start()
        monkeypatch.setattr(type(worker.app), "should_stop", property(lambda _: True))
        worker.coordinator.member_id = ""
        await worker.send(CHANGELOG, b"late")

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        run(stop())
    ended = [r for r in caplog.records if "membership 'm-1' ended" in r.getMessage()]
    assert [r.levelno for r in ended] == [logging.INFO]
    assert worker.sent == []


def test_a_healthy_worker_with_a_heartbeat_interval_of_half_its_session_holds_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka allows an interval up to the session: a healthy worker's silence then reaches the
    interval plus a round trip before each answer, which passes the stall's threshold
    (session - interval) but not the silence's (session, less two ticks)."""
    worker = _beating(Worker(tmp_path, monkeypatch, broker_heartbeat_interval=3.0))
    assert worker.app.conf.broker_session_timeout == 6.0

    async def healthy() -> None:
        worker.start()
        for value in (b"a", b"b", b"c"):
            _partitioned(worker, 3.0)  # the interval, then the answer comes
            worker.accepts = True
            assert await worker.heartbeat()
            worker.look()
            assert not worker.producer.stall_hold.holding
            await worker.send(CHANGELOG, value)

    run(healthy())
    assert worker.sent == [(CHANGELOG, v) for v in (b"a", b"b", b"c")]
