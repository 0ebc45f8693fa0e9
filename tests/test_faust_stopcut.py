"""What the stall hold (``streamassign.faust._stallhold``) does around a worker's stop, for a
worker without tables, and when it cannot watch the heartbeats.

- A worker that stops while a hold is on (cut off from its coordinator: a silence hold lasts
  until the coordinator answers) ends the hold as lost for itself: the held changelog sends
  are dropped, its stop goes on at once, and Faust's stop path commits nothing from then on
  (the next owner processes those events again).
- A worker without tables holds nothing: no flush waits, no lost membership is told.
- A heartbeat wrap that fails is told once, and no silence counts without it.

Faust's real producer (and its consumer's commit code) on a fake clock; aiokafka's
coordinator and commit are stand-ins."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path
from typing import Any

import aiokafka
import pytest
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP
from faust.types.tuples import Message

from .test_faust_stallhold import CHANGELOG, SINK, Worker, run
from .test_faust_stallpartition import _beating, _partitioned, _running

SRC = "orders"
S0 = TP(SRC, 0)


def faust_lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "streamassign.faust" and r.levelno == level
    ]


class StoppingWorker(Worker):
    """A worker whose app stops when told (``stop()``), whose Faust consumer acknowledges
    events of ``S0`` (``acknowledge``), and whose commits reach a stand-in."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **settings: Any) -> None:
        super().__init__(tmp_path, monkeypatch, **settings)
        _beating(self)
        self.stopping = False
        monkeypatch.setattr(type(self.app), "should_stop", property(lambda _: self.stopping))
        self.faust_commits: list[dict[TP, int]] = []

        async def commit(consumer: Any, offsets: Any) -> bool:
            self.faust_commits.append(dict(offsets))
            return True

        monkeypatch.setattr(faust_aiokafka.Consumer, "_commit", commit)
        self.consumer: Any = self.app.consumer
        self.app.topics._acking_topics.add(SRC)  # an agent subscribed to it, with acks
        self.consumer._thread._consumer.assignment = lambda: {S0}

    def acknowledge(self, *offsets: int) -> None:
        """Events of S0 processed (their changelog sends held) and acknowledged; the first
        time, committed up to 10."""
        self.consumer.loop = asyncio.get_running_loop()
        self.consumer._committed_offset.setdefault(S0, 10)
        for offset in offsets:
            event = Message(SRC, 0, offset, 0.0, 0, None, b"k", b"v", None)
            self.consumer.track_message(event)
            self.consumer.ack(event)

    def stop(self) -> None:
        self.stopping = True


async def acknowledge_stop_and_commit(worker: StoppingWorker) -> bool:
    """A member in good standing acknowledges two events, stops, and Faust's stop commits:
    whether the commit went out."""
    worker.start()
    assert await worker.heartbeat()
    worker.acknowledge(10, 11)
    worker.stop()
    worker.look()
    return bool(await asyncio.wait_for(worker.consumer.commit(), 1.0))


def test_a_worker_stopping_during_a_cut_drops_its_held_sends_and_stops_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Cut off from the coordinator, the hold would wait for it however long: Faust's stop
    flushes the producer (its commit too), and that flush waited until the network healed.
    Stopping, the hold ends as lost at once: held sends dropped, told in one WARNING."""
    worker = StoppingWorker(tmp_path, monkeypatch)
    base = time.monotonic()
    worker.producer.clock = lambda: base + worker.skew  # only the cut moves it

    async def cut_then_stop() -> tuple[bool, Any]:
        worker.start()
        assert await worker.heartbeat()
        _partitioned(worker, 6.5)
        assert worker.producer.stall_hold.holding
        held = await worker.send(CHANGELOG, b"held")
        flush = asyncio.ensure_future(worker.producer.flush())  # Faust's commit timer's
        await asyncio.sleep(0.05)
        waited = not flush.done()
        worker.stop()  # SIGTERM: Faust's app stops
        await asyncio.wait_for(flush, 1.0)
        later = await worker.send(CHANGELOG, b"after the stop")
        _partitioned(worker, 20.0)  # the cut goes on: no hold starts again
        await asyncio.wait_for(worker.producer.flush(), 1.0)  # App.on_stop's own
        return waited, (held, later)

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        waited, futures = run(cut_then_stop())
    assert waited
    assert worker.sent == []
    assert not any(f.done() for f in futures)
    hold = worker.producer.stall_hold
    assert not hold.holding and hold.commits_refused and hold.dropped_since_lost == 1
    warnings = faust_lines(caplog, logging.WARNING)
    assert len(warnings) == 2, warnings  # the hold's start, then the stop's drop, once
    assert warnings[1].startswith(
        "this worker stops while its changelog sends are held (no heartbeat accepted for "
    )
    assert "for 6.5 s, the membership 'm-1' unresolved" in warnings[1], warnings[1]
    assert "dropped 1 held send(s) and 0 batch(es) aiokafka held, reset 0" in warnings[1]
    assert "no offset is committed from now on" in warnings[1]


def test_faust_s_stop_path_commits_nothing_after_the_held_sends_are_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Faust's commit flushes the producer, then commits: the flush now returns at the stop,
    so the commit that follows (its timer's, waiting in the flush, then its stop's
    ``wait_empty``) must not pass the events whose changelog sends were just dropped, even
    once the network heals and the membership is proven during the stop."""
    worker = StoppingWorker(tmp_path, monkeypatch)

    async def commits() -> tuple[bool, bool, bool]:
        worker.start()
        assert await worker.heartbeat()
        _partitioned(worker, 6.5)
        worker.acknowledge(10, 11)
        await worker.send(CHANGELOG, b"held")
        timer_commit = asyncio.ensure_future(worker.consumer.commit())
        await asyncio.sleep(0.05)
        assert not timer_commit.done()  # waiting in the producer's flush
        worker.stop()
        committed = await asyncio.wait_for(timer_commit, 1.0)
        worker.accepts = True  # the network heals: the membership is proven
        worker.stall(1.0)
        assert await worker.heartbeat()
        worker.look()
        back = worker.producer.stall_hold.lost_as is None
        worker.acknowledge(12)  # an event its agent finished during the stop
        again = await asyncio.wait_for(worker.consumer.commit(), 1.0)
        return committed, back, again

    with caplog.at_level(logging.DEBUG, logger="streamassign.faust"):
        committed, back, again = run(commits())
    assert back  # sends would go out again; commits still may not
    assert committed is False and again is False
    assert worker.faust_commits == []
    told = [m for m in faust_lines(caplog, logging.INFO) if m.startswith("a commit of ")]
    assert told == [
        "a commit of 1 offset(s) refused: this worker stops, and writes of its events were "
        "dropped (held during a cut) or not acknowledged in time; the partitions' next owner "
        "processes these events again"
    ]
    assert len([m for m in faust_lines(caplog, logging.DEBUG) if "refused" in m]) == 1


def test_a_hold_beginning_while_the_worker_stops_ends_at_its_first_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A stop that began before the silence passed the threshold: aiokafka's flush may wait
    for changelog batches the new hold keeps back, so the tick that starts it ends it, and
    recalls the changelog request in flight as a silence hold's start does (the kernel would
    send it on after the process exits)."""
    worker = StoppingWorker(tmp_path, monkeypatch)
    base = time.monotonic()
    worker.producer.clock = lambda: base + worker.skew  # only the silence moves it
    resets: list[int] = []
    monkeypatch.setattr(worker.producer, "_stall_abort", lambda: resets.append(1) or 1)

    async def stop_then_silence() -> None:
        worker.start()
        assert await worker.heartbeat()
        worker.stop()
        _partitioned(worker, 6.5)

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        run(stop_then_silence())
    hold = worker.producer.stall_hold
    assert not hold.holding and hold.commits_refused and hold.lost_as == "m-1"
    warnings = faust_lines(caplog, logging.WARNING)
    assert len(warnings) == 1, warnings
    assert "no heartbeat accepted for 5.8 s" in warnings[0]
    assert "dropped 0 held send(s) and 0 batch(es) aiokafka held, reset 1" in warnings[0]
    assert resets == [1]


def test_a_clean_stop_refuses_no_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No hold at the stop: Faust's last commit goes out as ever, and nothing is told."""
    worker = StoppingWorker(tmp_path, monkeypatch)

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        assert run(acknowledge_stop_and_commit(worker))
    assert worker.faust_commits == [{S0: 12}]
    assert not worker.producer.stall_hold.commits_refused
    assert faust_lines(caplog, logging.WARNING) == []


def test_a_stop_whose_flush_gets_no_acknowledgement_commits_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No hold, but a write of another topic (a sink, a repartition) unacknowledged at the
    stop (its leader cut off): aiokafka's flush would wait until the heal. It gets
    ``closing.CLOSE_TIMEOUT``; then Faust's commit after it is refused (it would pass events
    whose writes may never land), and the acknowledged offsets are forgotten (``losses``)."""
    from streamassign.aiokafka import closing

    monkeypatch.setattr(closing, "CLOSE_TIMEOUT", 0.05)

    async def acks_unanswered(self: Any) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(faust_aiokafka.Producer, "flush", acks_unanswered)
    worker = StoppingWorker(tmp_path, monkeypatch)

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        assert not run(acknowledge_stop_and_commit(worker))
    hold = worker.producer.stall_hold
    assert worker.faust_commits == []
    assert hold.commits_refused and hold.losses == 1
    warnings = faust_lines(caplog, logging.WARNING)
    assert len(warnings) == 1
    assert re.match(
        r"this worker stops and its producer's flush got no acknowledgement 0\.\d s into the "
        r"stop \(broker unreachable\?\)",
        warnings[0],
    )


def test_a_flush_begun_before_the_stop_ends_its_bound_after_the_stop_and_only_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A timer commit's flush begun as a cut began waits in aiokafka for a batch of any
    topic; the stop's commit waits for that commit. Not stopping, a flush waits as long as
    aiokafka does (a slow broker refuses no commit); once the stop is seen it gets
    ``closing.CLOSE_TIMEOUT``, then commits are refused."""
    from streamassign.aiokafka import closing

    monkeypatch.setattr(closing, "CLOSE_TIMEOUT", 0.2)
    acked = asyncio.Event()

    async def acks_when_answered(self: Any) -> None:
        await acked.wait()

    monkeypatch.setattr(faust_aiokafka.Producer, "flush", acks_when_answered)
    worker = StoppingWorker(tmp_path, monkeypatch)

    async def slow_then_cut() -> tuple[bool, bool, float]:
        worker.start()
        assert await worker.heartbeat()
        slow = asyncio.ensure_future(worker.producer.flush())
        await asyncio.sleep(0.5)  # past CLOSE_TIMEOUT, not stopping: still waiting
        waited = not slow.done()
        acked.set()
        await asyncio.wait_for(slow, 1.0)
        acked.clear()
        timer_commit = asyncio.ensure_future(worker.producer.flush())
        await asyncio.sleep(0.3)
        worker.stop()
        stopped_at = time.monotonic()
        await asyncio.wait_for(timer_commit, 2.0)
        return waited, worker.producer.stall_hold.commits_refused, time.monotonic() - stopped_at

    waited, refused, after_stop = run(slow_then_cut())
    assert waited and refused
    assert 0.15 < after_stop < 1.0
    assert worker.producer.stall_hold.losses == 1


def test_after_a_stop_s_drop_a_proven_membership_holds_again_and_a_restart_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drop at a stop refuses commits and starts no hold while the membership stays lost;
    once a heartbeat proves it (the cut healed during a long stop), a second cut starts a
    hold again, dropped at once since the worker stops: its changelog send never goes out
    (a stale write could land after the new owner's). A restart in the same process lifts
    the refusal: the acknowledged offsets of before are forgotten at its next assignment."""
    worker = StoppingWorker(tmp_path, monkeypatch)

    async def cut_stop_heal_cut() -> bool:
        worker.start()
        assert await worker.heartbeat()
        _partitioned(worker, 6.5)
        worker.stop()
        await asyncio.wait_for(worker.producer.flush(), 1.0)  # the stop's drop
        _partitioned(worker, 7.0)
        held_while_lost = worker.producer.stall_hold.holding
        worker.accepts = True
        assert await worker.heartbeat()  # proven: the membership stood
        worker.look()
        _partitioned(worker, 6.5)
        await worker.send(CHANGELOG, b"stale after the second cut")
        return held_while_lost

    assert not run(cut_stop_heal_cut())
    assert worker.sent == []
    hold = worker.producer.stall_hold
    assert hold.commits_refused and hold.losses == 2

    async def aiokafka_started(self: Any) -> None:
        pass

    monkeypatch.setattr(faust_aiokafka.Producer, "on_start", aiokafka_started)

    async def restart() -> None:
        await worker.producer.on_start()
        worker.producer._stall_timer.cancel()

    run(restart())
    assert not hold.commits_refused


def test_a_worker_without_tables_gets_no_hold_flush_wait_or_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No changelog: a cut past the threshold and the member id's reset change nothing (no
    flush waiting, no commit refused for it, no "changelog sends are dropped" WARNING)."""
    worker = _beating(Worker(tmp_path, monkeypatch))
    monkeypatch.setattr(type(worker.app.tables), "changelog_topics", property(lambda _: set()))

    async def cut() -> None:
        worker.start()
        assert await worker.heartbeat()
        _partitioned(worker, 8.0)
        await asyncio.wait_for(worker.producer.flush(), 0.5)
        worker.stall(30.0)  # a gap too
        await asyncio.wait_for(worker.producer.flush(), 0.5)
        worker.coordinator.member_id = ""
        worker.look()
        await worker.send(SINK, b"out")

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        run(cut())
    hold = worker.producer.stall_hold
    assert not hold.holding and hold.lost_as is None and hold.losses == 0
    assert worker.sent == [(SINK, b"out")]
    assert [r for r in caplog.records if r.name == "streamassign.faust"] == []


@pytest.mark.parametrize("heartbeat", ["missing", "wrapped by another"])
def test_heartbeats_that_cannot_be_watched_count_no_silence_and_are_told_once(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    heartbeat: str,
) -> None:
    """Unwatched, no accepted heartbeat would end a silence: every worker would hold after the
    threshold, its flush and commits waiting for good. One WARNING names aiokafka's version;
    a stall of the loop still holds."""
    worker = Worker(tmp_path, monkeypatch)
    worker.coordinator._heartbeat_task = _running()
    if heartbeat == "missing":
        del worker.coordinator._do_heartbeat
    else:

        async def theirs() -> bool:
            return True

        theirs._streamassign_wrapped = True  # type: ignore[attr-defined]
        worker.coordinator._do_heartbeat = theirs

    async def cut_then_stall() -> tuple[bool, bool]:
        worker.start()
        _partitioned(worker, 20.0)
        silence_held = worker.producer.stall_hold.holding
        await asyncio.wait_for(worker.producer.flush(), 0.5)
        worker.stall(9.0)
        await worker.send(CHANGELOG, b"after a stall")
        return silence_held, worker.producer.stall_hold.holding

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        silence_held, gap_held = run(cut_then_stall())
    assert not silence_held and gap_held
    assert worker.sent == []
    told = [m for m in faust_lines(caplog, logging.WARNING) if "heartbeats" in m]
    assert told == [
        f"cannot watch this worker's heartbeats (aiokafka {aiokafka.__version__}: its group "
        "coordinator has no _do_heartbeat, or another part wrapped it): silence holds are "
        "off, a network cut from the coordinator holds no changelog send (a stall of the "
        "event loop still does, and a member id reset still drops them)"
    ]


def test_the_hold_s_own_wrap_is_recognised_at_every_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before Faust's consumer thread made aiokafka's consumer there is nothing to wrap and no
    heartbeat routine (nothing told); wrapped at the first tick after, its wrap (marked as
    any of the library's) is its own from then on: the silence counts, nothing is told."""
    worker = _beating(Worker(tmp_path, monkeypatch))
    thread = worker.app.consumer._thread
    aiokafka_consumer, thread._consumer = thread._consumer, None

    async def start_then_cut() -> bool:
        worker.start()
        _partitioned(worker, 6.5)  # no consumer yet: no silence
        assert not worker.producer.stall_hold.holding
        thread._consumer = aiokafka_consumer
        worker.look()
        worker.accepts = True
        assert await worker.heartbeat()
        _partitioned(worker, 6.5)
        return worker.producer.stall_hold.holding

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        assert run(start_then_cut())
    assert not any("cannot watch" in m for m in faust_lines(caplog, logging.WARNING))


def test_the_worker_s_consumer_stop_is_bounded_and_what_it_left_running_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Cut off from its coordinator, aiokafka's consumer stop waits for its LeaveGroup's
    answer up to Faust's ``broker_request_timeout`` (90 s): a worker stopped during a cut
    took that long to exit. The transport's consumer thread gives that stop
    ``closing.CLOSE_TIMEOUT``, as the runtime does, then releases what it left running."""
    from faust.transport.consumer import ConsumerThread

    from streamassign.aiokafka import closing

    from .test_faust_transport import table_app

    async def nothing(self: Any) -> None:
        pass

    monkeypatch.setattr(ConsumerThread, "on_thread_stop", nothing)
    monkeypatch.setattr(closing, "CLOSE_TIMEOUT", 0.05)
    released: list[str] = []

    async def step(name: str) -> None:
        released.append(name)

    class LeaveGroupUnanswered:
        _coordinator = type(
            "Coordinator",
            (),
            {
                "_stop_heartbeat_task": lambda _: step("heartbeat"),
                "_stop_commit_offsets_refresh_task": lambda _: step("offsets refresh"),
            },
        )()
        _fetcher = type("Fetcher", (), {"close": lambda _: step("fetcher")})()
        _client = type("Client", (), {"close": lambda _: step("connections")})()

        async def stop(self) -> None:
            await asyncio.Event().wait()  # no answer while the cut lasts

    thread = table_app(tmp_path).consumer._thread
    thread._consumer = LeaveGroupUnanswered()
    with caplog.at_level(logging.WARNING):
        asyncio.run(asyncio.wait_for(thread.on_thread_stop(), timeout=5))
    assert released == ["heartbeat", "offsets refresh", "fetcher", "connections"]
    assert any(
        "the worker's consumer did not stop within 0.05 s" in r.getMessage()
        and "LeaveGroup is abandoned" in r.getMessage()
        for r in caplog.records
    )


def test_the_worker_s_producer_stop_is_bounded_and_its_held_writes_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """aiokafka's producer stop waits for every batch it holds to be acknowledged: during a
    cut, until the heal (57 s after the consumer's bounded stop, measured). It gets
    ``closing.CLOSE_TIMEOUT`` as the runtime's producers do; cut, its held writes are
    released (failed, never sent later): they came after Faust's last commit."""
    from streamassign.aiokafka import closing
    from streamassign.faust import _stallhold

    monkeypatch.setattr(closing, "CLOSE_TIMEOUT", 0.05)
    released: list[Any] = []

    async def release(name: str, producer: Any, log: logging.Logger) -> None:
        released.append(producer)

    monkeypatch.setattr(_stallhold, "release_producer", release)

    class AcksUnanswered:
        async def stop(self) -> None:
            await asyncio.Event().wait()  # the held batches' acks never come

    worker = Worker(tmp_path, monkeypatch)
    held = AcksUnanswered()
    worker.producer._producer = held

    with caplog.at_level(logging.WARNING):
        asyncio.run(asyncio.wait_for(worker.producer.on_stop(), timeout=5))
    assert released == [held]
    assert any(
        "the worker's producer did not stop within 0.05 s" in r.getMessage() for r in caplog.records
    )
    # a commit still waiting on a flush would pass the writes the release fails
    assert worker.producer.stall_hold.commits_refused and worker.producer.stall_hold.losses == 1
