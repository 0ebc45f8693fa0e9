"""What bounds a worker's stop besides the stall hold (``streamassign.faust._stallhold``,
``streamassign.faust.transport``), and where it stays Faust's own.

- A commit under way at the stop (a request aiokafka sent into a cut: retried until a
  coordinator answers, and Faust's stop waits for it) ends by the stop's deadline, shared with
  the flushes; commits are refused from then on.
- A producer stop cut short fails the writes it held: Faust's one ``_on_published error``
  WARNING per write is held back and counted in one line; other send errors are Faust's.
- Under exactly_once and with a threaded producer, the stop is Faust's: no bound.

Faust's real producer and consumer commit code on a fake clock; aiokafka's commit and
producer stop are stand-ins (the release of a real, unstarted aiokafka producer)."""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiokafka
import pytest
from aiokafka.errors import KafkaTimeoutError
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from streamassign.aiokafka import closing
from streamassign.errors import WritesAbandonedError
from streamassign.faust import _stallhold

from .test_faust_stallhold import CHANGELOG, SINK, Worker, run
from .test_faust_stopcut import S0, StoppingWorker, faust_lines


class CommitUnanswered:
    """aiokafka's commit as a cut leaves it: its request never answered (retried until a
    coordinator answers); records what was asked, and whether it was abandoned."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.asked: list[dict[TP, int]] = []
        self.abandoned = False
        commit = self

        async def unanswered(consumer: Any, offsets: Any) -> bool:
            commit.asked.append(dict(offsets))
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                commit.abandoned = True
                raise
            return True

        monkeypatch.setattr(faust_aiokafka.Consumer, "_commit", unanswered)


async def commit_in_flight_then_stop(worker: StoppingWorker) -> tuple[bool, bool, bool, float]:
    """Faust's timer commits two acknowledged events, its request unanswered; the worker is
    not stopping for longer than the stop's bound, then stops, and its stop commits (waiting
    for the commit under way). Whether the timer's commit was still waiting before the stop,
    the two commits' results, and the seconds from the stop to their end."""
    worker.start()
    assert await worker.heartbeat()
    worker.acknowledge(10, 11)
    timer_commit = asyncio.ensure_future(worker.consumer.commit())
    await asyncio.sleep(0.3)  # past the bound, not stopping: a slow coordinator
    waited = not timer_commit.done()
    worker.stop()
    stopped_at = time.monotonic()
    stop_commit = await asyncio.wait_for(worker.consumer.commit(), 2.0)
    timer_committed = await asyncio.wait_for(timer_commit, 1.0)
    return waited, timer_committed, stop_commit, time.monotonic() - stopped_at


def test_a_commit_under_way_at_the_stop_ends_by_the_stop_s_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A commit request sent as a cut began is retried by aiokafka until a coordinator
    answers, and Faust's stop waits for a commit under way before its own: a worker
    stopped then exited only after the heal (79.5 s after SIGTERM, measured). Once the stop
    is seen it gets ``closing.CLOSE_TIMEOUT``, then is abandoned; no commit goes out after
    it. The commit asked carried only the processed events' offsets."""
    monkeypatch.setattr(closing, "CLOSE_TIMEOUT", 0.2)
    worker = StoppingWorker(tmp_path, monkeypatch)
    commit = CommitUnanswered(monkeypatch)  # in place of the worker's answered one

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        waited, timer_committed, stop_committed, after_stop = run(
            commit_in_flight_then_stop(worker)
        )
    assert waited and commit.abandoned
    assert timer_committed is False and stop_committed is False
    assert 0.15 < after_stop < 1.5
    assert commit.asked == [{S0: 12}]  # the stop's own commit was refused, not sent
    hold = worker.producer.stall_hold
    assert hold.commits_refused and hold.losses == 1
    warnings = faust_lines(caplog, logging.WARNING)
    assert len(warnings) == 1
    assert re.fullmatch(
        r"this worker stops and its commit of 1 offset\(s\) got no answer (0\.[2-9]|1\.\d) s "
        r"into the stop \(coordinator unreachable\?\): abandoned, and no offset is committed "
        r"from now on, so the partitions' next owner processes the events since the last "
        r"commit again",
        warnings[0],
    )


def test_a_commit_answered_during_the_stop_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit under way that is answered before the stop's deadline is Faust's as ever."""
    monkeypatch.setattr(closing, "CLOSE_TIMEOUT", 5.0)
    answered: list[dict[TP, int]] = []

    async def slow(consumer: Any, offsets: Any) -> bool:
        await asyncio.sleep(0.2)
        answered.append(dict(offsets))
        return True

    worker = StoppingWorker(tmp_path, monkeypatch)
    monkeypatch.setattr(faust_aiokafka.Consumer, "_commit", slow)

    async def commit_then_stop() -> bool:
        worker.start()
        assert await worker.heartbeat()
        worker.acknowledge(10, 11)
        timer_commit = asyncio.ensure_future(worker.consumer.commit())
        await asyncio.sleep(0.05)
        worker.stop()
        return bool(await asyncio.wait_for(timer_commit, 1.0))

    assert run(commit_then_stop())
    assert answered == [{S0: 12}]
    assert not worker.producer.stall_hold.commits_refused


class AcksUnanswered:
    """aiokafka's producer, not started, its stop waiting for acks that never come."""

    def __init__(self) -> None:
        self.aiokafka = aiokafka.AIOKafkaProducer(bootstrap_servers="localhost:1")
        self.aiokafka._sender._sender_task = asyncio.ensure_future(asyncio.sleep(3600))

    async def stop(self) -> None:
        await asyncio.Event().wait()

    async def write(self, worker: Worker, topic: str) -> asyncio.Future[Any]:
        """A write held in aiokafka's accumulator, Faust told of its end; Faust's message."""
        accumulator = self.aiokafka._message_accumulator
        tp = aiokafka.TopicPartition(topic, 0)
        return told_to_faust(worker, topic, await accumulator.add_message(tp, b"k", b"v", 1.0))


def told_to_faust(worker: Worker, topic: str, written: asyncio.Future[Any]) -> asyncio.Future[Any]:
    """Faust's ``Topic`` told of the end of a write (its ``_on_published``, as its
    ``publish_message`` does): the ``FutureMessage`` it ends."""
    channel = worker.app.topic(topic)
    message = channel.as_future_message(key=b"k", value=b"v")
    written.add_done_callback(
        functools.partial(
            channel._on_published, message=message, producer=worker.producer, state=None
        )
    )
    return message


def test_writes_a_cut_producer_stop_fails_are_counted_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Faust logs each failed write (``_on_published error ...``, and a "never retrieved"
    trace once collected): two lines per write a stop abandoned. They are counted by topic
    in one line; a write failing for another reason afterwards keeps Faust's own line."""
    monkeypatch.setattr(closing, "CLOSE_TIMEOUT", 0.05)
    worker = Worker(tmp_path, monkeypatch)

    async def stop_then_fail_another() -> tuple[list[asyncio.Future[Any]], asyncio.Future[Any]]:
        held = AcksUnanswered()
        messages = [await held.write(worker, topic) for topic in (SINK, SINK, CHANGELOG)]
        await _stallhold._stop_producer_within(held.aiokafka, held.stop, lambda: None)
        written = asyncio.get_running_loop().create_future()
        later = told_to_faust(worker, SINK, written)
        written.set_exception(KafkaTimeoutError())
        await asyncio.sleep(0)
        return messages, later

    with caplog.at_level(logging.WARNING):
        messages, later = run(stop_then_fail_another())
    assert all(isinstance(m.exception(), WritesAbandonedError) for m in messages)
    # nobody awaits them at a stop: asyncio would log each with a trace when collected
    assert not any(m._log_traceback for m in messages)  # type: ignore[attr-defined]
    assert later._log_traceback  # type: ignore[attr-defined]
    assert isinstance(later.exception(), KafkaTimeoutError)
    faust_said = [r.getMessage() for r in caplog.records if r.name == "faust.topics"]
    assert len(faust_said) == 1 and "KafkaTimeoutError" in faust_said[0]
    assert faust_said[0].startswith(f"_on_published error for message topic {SINK} error")
    counted = [m for m in faust_lines(caplog, logging.WARNING) if "was released with" in m]
    assert counted == [
        "the worker's producer was released with 3 write(s) not acknowledged (some may have "
        f'landed): {SINK}: 2, {CHANGELOG}: 1; Faust\'s "_on_published error" WARNING for '
        "each is not logged"
    ]
    assert logging.getLogger("faust.topics").filters == []


@pytest.mark.parametrize("with_direct_write", [False, True], ids=["alone", "with_a_write"])
def test_a_held_send_released_then_failed_by_the_cut_stop_is_counted_too(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    with_direct_write: bool,
) -> None:
    """A held changelog send the hold released to aiokafka reaches Faust through
    ``_settle``, one loop turn later than a write handed to aiokafka directly: failed by the
    release, alone or with such a write, it is counted in the same line and Faust's lines
    of it are held back too."""
    monkeypatch.setattr(closing, "CLOSE_TIMEOUT", 0.05)
    worker = Worker(tmp_path, monkeypatch)

    async def release_then_stop() -> list[asyncio.Future[Any]]:
        held = AcksUnanswered()
        direct = [await held.write(worker, SINK)] if with_direct_write else []
        accumulator = held.aiokafka._message_accumulator
        tp = aiokafka.TopicPartition(CHANGELOG, 0)
        sent = await accumulator.add_message(tp, b"k", b"v", 1.0)
        released = asyncio.get_running_loop().create_future()  # the held send's result
        sent.add_done_callback(functools.partial(_stallhold._settle, outer=released))
        settled = told_to_faust(worker, CHANGELOG, released)
        await _stallhold._stop_producer_within(held.aiokafka, held.stop, lambda: None)
        return [*direct, settled]

    with caplog.at_level(logging.WARNING):
        messages = run(release_then_stop())
    assert all(isinstance(m.exception(), WritesAbandonedError) for m in messages)
    assert not any(m._log_traceback for m in messages)  # type: ignore[attr-defined]
    assert [r for r in caplog.records if r.name == "faust.topics"] == []
    counted = [m for m in faust_lines(caplog, logging.WARNING) if "was released with" in m]
    by_topic = f"{SINK}: 1, {CHANGELOG}: 1" if with_direct_write else f"{CHANGELOG}: 1"
    assert len(counted) == 1
    assert (
        f"{len(messages)} write(s) not acknowledged (some may have landed): {by_topic};"
        in (counted[0])
    )


@pytest.mark.parametrize("held_count", [1, 3])
def test_held_sends_a_release_still_hands_out_at_the_cut_stop_are_counted_too(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    held_count: int,
) -> None:
    """A hold's release under way at a cut stop, waiting in aiokafka for room in a full
    changelog batch (its leader cut off): the producer's release fails that batch, then the
    release task fails its sends one after another. Faust's lines of all of them are held
    back and counted, not only those failed inside aiokafka."""
    monkeypatch.setattr(closing, "CLOSE_TIMEOUT", 0.05)
    worker = Worker(tmp_path, monkeypatch)
    full = b"v" * 15000  # one fills a batch (aiokafka's 16 KiB)

    async def release_waiting_then_stop() -> list[asyncio.Future[Any]]:
        held = AcksUnanswered()
        accumulator = held.aiokafka._message_accumulator
        tp = aiokafka.TopicPartition(CHANGELOG, 0)
        messages = [
            told_to_faust(worker, CHANGELOG, await accumulator.add_message(tp, b"k", full, 5.0))
        ]
        hold = worker.producer.stall_hold
        for _ in range(held_count):
            result = asyncio.get_running_loop().create_future()
            messages.append(told_to_faust(worker, CHANGELOG, result))
            send = functools.partial(accumulator.add_message, tp, b"k", full, 5.0)
            hold.held.append(_stallhold.HeldSend(send, result, 0.0, hold.number()))
        releasing = asyncio.ensure_future(worker.producer._stall_release(0.0))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not releasing.done()  # its first send waits for the full batch to drain
        await _stallhold._stop_producer_within(held.aiokafka, held.stop, lambda: None, releasing)
        assert releasing.done()
        return messages

    with caplog.at_level(logging.WARNING):
        messages = run(release_waiting_then_stop())
    assert all(isinstance(m.exception(), WritesAbandonedError) for m in messages)
    assert not any(m._log_traceback for m in messages)  # type: ignore[attr-defined]
    assert [r.getMessage() for r in caplog.records if r.name == "faust.topics"] == []
    counted = [m for m in faust_lines(caplog, logging.WARNING) if "was released with" in m]
    assert len(counted) == 1
    assert f"with {held_count + 1} write(s) not acknowledged" in counted[0]


def test_a_stop_draining_past_its_deadline_keeps_the_commits_a_broker_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Faust's stop commits about once a second until its agents are done with the events
    under way (``wait_empty``), which may take longer than the stop's deadline: a flush
    and a commit begun past it still get ``STOP_GRACE``, so one answered at once counts;
    nothing is refused and no WARNING blames the broker."""
    monkeypatch.setattr(closing, "CLOSE_TIMEOUT", 0.2)
    worker = StoppingWorker(tmp_path, monkeypatch)

    async def stop_drain_commit() -> tuple[bool, bool]:
        worker.start()
        assert await worker.heartbeat()
        worker.acknowledge(10, 11)
        worker.stop()
        first = await asyncio.wait_for(worker.consumer.commit(), 1.0)  # wait_empty's first
        await asyncio.sleep(0.3)  # agents still at work: past the deadline
        worker.acknowledge(12, 13)
        last = await asyncio.wait_for(worker.consumer.commit(), 1.0)  # the stop's last
        return first, last

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        first, last = run(stop_drain_commit())
    assert first and last
    assert worker.faust_commits == [{S0: 12}, {S0: 14}]
    assert not worker.producer.stall_hold.commits_refused
    assert faust_lines(caplog, logging.WARNING) == []


def test_a_commit_begun_past_the_deadline_is_cut_after_the_grace_and_the_next_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Past the stop's deadline a commit that gets no answer is cut ``STOP_GRACE`` after it
    began, not sooner; commits are refused from then on, so the next returns at once and
    a cut stop outlasts its deadline by at most the grace."""
    # A grace well above a loop turn under load, so "at once" and "after the grace" differ
    # (the grace is capped at the whole bound).
    monkeypatch.setattr(closing, "CLOSE_TIMEOUT", 0.4)
    monkeypatch.setattr(_stallhold, "STOP_GRACE", 0.4)
    worker = StoppingWorker(tmp_path, monkeypatch)
    commit = CommitUnanswered(monkeypatch)

    async def stop_then_commit_twice() -> tuple[bool, float, bool, float]:
        worker.start()
        assert await worker.heartbeat()
        worker.acknowledge(10, 11)
        worker.stop()
        await asyncio.wait_for(worker.producer.flush(), 1.0)  # the stop is seen: deadline
        await asyncio.sleep(0.5)
        began = time.monotonic()
        cut = await asyncio.wait_for(worker.consumer.commit(), 3.0)
        cut_after = time.monotonic() - began
        worker.acknowledge(12)
        began = time.monotonic()
        refused = await asyncio.wait_for(worker.consumer.commit(), 3.0)
        return cut, cut_after, refused, time.monotonic() - began

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        cut, cut_after, refused, refused_after = run(stop_then_commit_twice())
    assert cut is False and refused is False and commit.abandoned
    assert 0.35 < cut_after < 2.5
    assert refused_after < 0.2
    assert commit.asked == [{S0: 12}]
    assert worker.producer.stall_hold.commits_refused
    (warning,) = faust_lines(caplog, logging.WARNING)
    said = (
        r"this worker stops and its commit of 1 offset\(s\) got no answer \d+\.\d s into the stop"
    )
    assert re.match(said, warning)


@pytest.mark.parametrize(
    "settings",
    [{"processing_guarantee": "exactly_once"}, {"producer_threaded": True}],
    ids=["exactly_once", "producer_threaded"],
)
def test_exactly_once_and_threaded_producer_stops_are_faust_s_own(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    settings: dict[str, Any],
) -> None:
    """Transactions fence a zombie, and a threaded producer sends from its own loop: their
    stops are Faust's. A flush, a commit under way and aiokafka's producer stop each wait
    past the bound, and nothing is wrapped, refused or told."""
    monkeypatch.setattr(closing, "CLOSE_TIMEOUT", 0.05)
    flushed = asyncio.Event()

    async def acks_later(self: Any) -> None:
        await flushed.wait()

    monkeypatch.setattr(faust_aiokafka.Producer, "flush", acks_later)
    worker = StoppingWorker(tmp_path, monkeypatch, **settings)
    commit = CommitUnanswered(monkeypatch)
    assert not worker.producer.bounds_stops()

    class StopsLater:
        stopped = False

        async def stop(self) -> None:
            await asyncio.sleep(0.2)
            self.stopped = True

    held = StopsLater()
    own_stop = held.stop

    async def stop_waiting() -> tuple[bool, bool]:
        worker.consumer.loop = asyncio.get_running_loop()
        worker.stop()
        flushing = asyncio.ensure_future(worker.producer.flush())
        committing = asyncio.ensure_future(worker.consumer._commit({S0: 12}))
        await asyncio.sleep(0.2)  # four times the bound
        waiting = not flushing.done() and not committing.done()
        flushed.set()
        await asyncio.wait_for(flushing, 1.0)
        committing.cancel()
        worker.producer._producer = held
        await asyncio.wait_for(worker.producer.on_stop(), 1.0)
        return waiting, held.stop == own_stop

    with caplog.at_level(logging.DEBUG, logger="streamassign.faust"):
        waiting, own = run(stop_waiting())
    assert waiting and own and held.stopped
    assert commit.asked == [{S0: 12}]
    assert not worker.producer.stall_hold.commits_refused
    told = [r.getMessage() for r in caplog.records if r.name == "streamassign.faust"]
    assert [m for m in told if "Faust's exactly_once" not in m] == []  # the app's one warning


def test_a_commit_request_left_at_the_consumer_thread_s_stop_fails_unlogged() -> None:
    """The method queue's stop cancels a commit abandoned at the stop, but aiokafka shields
    its request, which fails when the consumer's connections close: asyncio logged it as
    "Task exception was never retrieved" with aiokafka's trace. Its failure is marked seen;
    any other task's is not."""
    from aiokafka.errors import KafkaConnectionError

    from streamassign.faust.transport import _abandon_commit_requests

    closed = asyncio.Event()

    async def do_commit_offsets(assignment: Any, offsets: Any) -> None:
        await closed.wait()
        raise KafkaConnectionError("Connection closed")

    async def other() -> None:
        await closed.wait()
        raise KafkaConnectionError("another task's")

    consumer = SimpleNamespace(_coordinator=SimpleNamespace(_do_commit_offsets=do_commit_offsets))

    async def stop_while_requested() -> tuple[asyncio.Task[None], asyncio.Task[None]]:
        commit = asyncio.shield(do_commit_offsets({}, {}))  # aiokafka's commit_offsets
        (request,) = (t for t in asyncio.all_tasks() if t is not asyncio.current_task())
        unrelated = asyncio.ensure_future(other())
        _abandon_commit_requests(consumer)
        commit.cancel()  # the method queue's stop
        closed.set()  # the consumer's connections close
        await asyncio.wait([request, unrelated])
        return request, unrelated

    request, unrelated = run(stop_while_requested())
    assert not request._log_traceback  # type: ignore[attr-defined]
    assert unrelated._log_traceback  # type: ignore[attr-defined]
    unrelated.exception()
