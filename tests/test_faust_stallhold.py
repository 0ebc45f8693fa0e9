"""A stalled worker's changelog sends are held until its group membership is resolved
(``streamassign.faust._stallhold``): released in order after a heartbeat the broker accepted,
dropped when aiokafka resets the member id (a zombie, whose writes come from stale table
state) or when no heartbeat gets through for a session. Faust's real producer class on a fake
clock; aiokafka's send and group coordinator are stand-ins (no broker: the live check is in
docs/faust.md, "A worker that resumes after its session expired")."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from aiokafka.errors import KafkaConnectionError, UnknownMemberIdError
from faust.transport.drivers import aiokafka as faust_aiokafka

from streamassign.aiokafka.rejoin import refuse_commits_without_membership, watch_heartbeats
from streamassign.faust._stallhold import DROPPED, RELEASED, TICK, StallHold, StallHoldProducer

CHANGELOG = "stall-app-totals-changelog"
SINK = "orders-out"


class GroupCoordinatorStandIn:
    """The consumer's client as the stall hold's heartbeat proof uses it: DescribeGroups sent
    to the group's coordinator, answered with ``members`` (or ``error``), counted."""

    def __init__(self, members: list[str], error: int = 0) -> None:
        self.members, self.error = members, error
        self.asked = 0
        self.api_version = (4, 0)

    async def send(self, node: int, request: Any, **_: Any) -> Any:
        self.asked += 1
        entry = {
            "error_code": self.error,
            "group": "stall-app",
            "state": "Stable" if self.members else "Empty",
            "members": [{"member_id": m} for m in self.members],
        }
        return SimpleNamespace(to_object=lambda: {"groups": [entry]})


class Worker:
    """A worker's producer, the clock it sees (real time plus the stalls), aiokafka's
    coordinator as its consumer thread holds it, and what reached aiokafka's send."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **settings: Any) -> None:
        self.app = faust.App(
            "stall-app",
            broker="streamassign://localhost:1",
            datadir=str(tmp_path),
            **{"broker_session_timeout": 6.0, "broker_heartbeat_interval": 1.0, **settings},
        )
        self.app.Table("totals", default=int)
        self.producer: StallHoldProducer = self.app.producer
        self.skew = 0.0
        self.producer.clock = lambda: time.monotonic() + self.skew
        self.accepts = True

        async def heartbeat() -> bool:
            return self.accepts

        self.committed: list[Any] = []

        async def commit(assignment: Any, offsets: Any) -> None:
            self.committed.append(offsets)

        self.group = GroupCoordinatorStandIn(["m-1"])
        self.coordinator = SimpleNamespace(
            member_id="m-1",
            generation=3,
            group_id="stall-app",
            coordinator_id=1,
            _client=self.group,
            _do_heartbeat=heartbeat,
            _do_commit_offsets=commit,
            _subscription=SimpleNamespace(partitions_auto_assigned=lambda: True),
        )
        self.app.consumer._thread._consumer = SimpleNamespace(_coordinator=self.coordinator)
        self.sent: list[tuple[str, bytes | None]] = []
        monkeypatch.setattr(faust_aiokafka.Producer, "send", self._aiokafka_send)

    async def _aiokafka_send(self, topic: str, key: Any, value: Any, *a: Any, **k: Any) -> Any:
        self.sent.append((topic, value))
        done = asyncio.get_running_loop().create_future()
        done.set_result(SimpleNamespace(topic=topic, offset=len(self.sent) - 1))
        return done

    def start(self) -> None:
        """As the producer's start does, without aiokafka's producer: the tick is on (driven
        by ``look`` here), stamped once."""
        self.producer._stall_timer = asyncio.get_running_loop().call_later(3600, lambda: None)
        self.look()

    def look(self) -> None:
        self.producer._stall_look(self.producer.clock())

    def stall(self, seconds: float) -> None:
        self.skew += seconds

    async def send(self, topic: str, value: bytes) -> Any:
        return await self.producer.send(topic, b"k", value, 0, None, None)

    async def heartbeat(self) -> bool:
        """aiokafka's heartbeat routine's call, as wrapped by the tick."""
        accepted: bool = await self.coordinator._do_heartbeat()
        return accepted


async def released(producer: StallHoldProducer) -> None:
    while producer.stall_hold.holding:
        await asyncio.sleep(0)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_zombie_s_changelog_sends_are_dropped_when_its_member_id_is_reset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The zombie's case: stopped past the session timeout, it sends from stale state before
    its heartbeat fails, and on until Faust's revoke stops its flow. Held, then dropped at the
    reset, and dropped at once after it until it joined again: never sent, their futures never
    done (so Faust's ``_on_changelog_sent`` never records their offsets); other topics pass."""
    worker = Worker(tmp_path, monkeypatch)
    base = time.monotonic()
    worker.producer.clock = lambda: base + worker.skew  # only the stall moves it

    async def zombie() -> tuple[list[Any], list[Any]]:
        worker.start()
        worker.stall(9.0)
        stale = [await worker.send(CHANGELOG, b"stale-1")]
        passed = [await worker.send(SINK, b"out")]
        worker.look()
        stale.append(await worker.send(CHANGELOG, b"stale-2"))
        worker.coordinator.member_id = ""  # aiokafka: UnknownMemberId on the consumer thread
        worker.look()
        stale.append(await worker.send(CHANGELOG, b"stale-3"))  # before the revoke
        worker.look()
        worker.coordinator.member_id = "m-2"  # the revoke, then the join as a new member
        worker.look()
        passed.append(await worker.send(CHANGELOG, b"new"))
        await asyncio.sleep(0)
        return stale, passed

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        stale, passed = run(zombie())
    assert worker.sent == [(SINK, b"out"), (CHANGELOG, b"new")]
    assert not any(f.done() for f in stale)
    assert all(f.done() for f in passed)
    assert not worker.producer.stall_hold.holding
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3
    assert "did not run for 9.0 s" in warnings[0]
    assert "1 changelog send(s) held so far" in warnings[0]
    assert "dropped 2 after" in warnings[1] and "member id is now ''" in warnings[1]
    assert "dropped 1 more" in warnings[2] and "'m-2'" in warnings[2]


def test_sends_held_after_a_gap_go_out_in_order_once_a_heartbeat_is_accepted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A stall past the threshold but within the session (or a loop blocked while the
    consumer thread heartbeated): a heartbeat accepted after the hold began proves the
    membership; one sent before it does not. The held sends go out in order, before any
    made after, and Faust's futures get aiokafka's results."""
    worker = Worker(tmp_path, monkeypatch)

    async def survivor() -> list[Any]:
        worker.start()
        assert await worker.heartbeat()  # wraps nothing yet: the tick wraps it
        worker.stall(5.5)
        held = [await worker.send(CHANGELOG, b"a"), await worker.send(CHANGELOG, b"b")]
        worker.look()
        assert worker.producer.stall_hold.holding
        assert worker.sent == []
        worker.stall(0.5)
        assert await worker.heartbeat()  # sent now: after the hold began
        worker.look()
        held.append(await worker.send(CHANGELOG, b"c"))  # during the release: still in order
        await asyncio.wait_for(released(worker.producer), 2.0)
        held.append(await worker.send(CHANGELOG, b"d"))
        await asyncio.sleep(0)
        return held

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        held = run(survivor())
    assert worker.sent == [(CHANGELOG, v) for v in (b"a", b"b", b"c", b"d")]
    assert [f.result().offset for f in held] == [0, 1, 2, 3]
    assert "released 3 held changelog send(s)" in caplog.text


def test_a_heartbeat_from_before_the_hold_proves_nothing() -> None:
    hold = StallHold(threshold=4.9, silence_threshold=4.9, deadline=7.0)
    hold.tick(100.0, "m-1")
    hold.heartbeat_accepted(104.0)  # the consumer thread, while the loop was blocked
    assert hold.check(106.0)
    assert hold.verdict(106.1, "m-1") is None
    hold.heartbeat_accepted(106.2)
    assert hold.verdict(106.3, "m-1") == RELEASED


def test_a_hold_without_any_answer_goes_on_past_its_deadline() -> None:
    """No heartbeat through and the member id unchanged (a coordinator away): the membership
    may have survived (a failover), so nothing is dropped on a timer; the broker's answer
    decides, however late."""
    hold = StallHold(threshold=4.9, silence_threshold=4.9, deadline=7.0)
    hold.tick(100.0, "m-1")
    assert hold.check(109.0)
    assert hold.verdict(200.0, "m-1") is None
    assert hold.verdict(200.0, None) is None  # the member id unreadable: wait
    assert hold.verdict(201.0, "") == DROPPED


def test_a_gap_within_the_threshold_holds_nothing_and_a_new_member_id_drops() -> None:
    hold = StallHold(threshold=4.9, silence_threshold=4.9, deadline=7.0)
    hold.tick(100.0, "m-1")
    hold.tick(104.5, "m-1")
    assert not hold.check(109.3)
    assert hold.check(109.5) and hold.held_as == "m-1"
    assert hold.verdict(110.0, "m-2") == DROPPED  # rejoined as another member
    hold.end(110.0)
    assert not hold.check(110.1) and hold.verdict(110.1, "m-2") is None


def test_a_stall_without_a_membership_drops() -> None:
    """Stalled while it held no member id (reset already): nothing can prove the writes."""
    hold = StallHold(threshold=4.9, silence_threshold=4.9, deadline=7.0)
    hold.tick(100.0, "")
    assert hold.check(106.0)
    assert hold.verdict(106.0, "m-2") == DROPPED


def test_a_flush_waits_for_the_hold_and_ends_at_the_reset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Faust flushes before it commits and in its revoke: the flush waits for the hold (so no
    offset is committed past a held write) and ends when the reset drops it (the revoke
    comes before the rejoin: waiting for the next assignment would never end)."""
    worker = Worker(tmp_path, monkeypatch)

    async def revoke() -> bool:
        worker.start()
        worker.stall(9.0)
        await worker.send(CHANGELOG, b"stale")
        flush = asyncio.ensure_future(worker.producer.flush())
        await asyncio.sleep(3 * TICK)
        waited = not flush.done()
        worker.coordinator.member_id = ""
        worker.look()
        await asyncio.wait_for(flush, 2.0)
        return waited

    assert run(revoke())
    assert worker.sent == []


def test_a_hold_the_buffer_s_flush_starts_is_awaited_before_the_flush_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a resume Faust's commit may flush before any tick ran: its buffer's sends are
    then the first to see the stall, and the flush must not return (Faust would commit the
    events' offsets) until those held writes are out, here after an accepted heartbeat."""
    worker = Worker(tmp_path, monkeypatch)

    async def commit_after_resume() -> tuple[bool, list[Any]]:
        worker.start()
        buffered: list[Any] = []

        async def buffer_flush() -> None:  # Faust's buffer sends what send_soon queued
            buffered.append(await worker.send(CHANGELOG, b"buffered"))

        monkeypatch.setattr(worker.producer.buffer, "flush", buffer_flush)
        worker.stall(5.5)  # past the threshold, within the session: the membership survives
        flush = asyncio.ensure_future(worker.producer.flush())
        await asyncio.sleep(3 * TICK)
        waited = not flush.done() and worker.sent == []
        await worker.heartbeat()
        worker.look()
        await asyncio.wait_for(flush, 2.0)
        return waited, buffered

    waited, buffered = run(commit_after_resume())
    assert waited
    assert worker.sent == [(CHANGELOG, b"buffered")]
    assert buffered[0].done()


def test_a_flush_releases_a_hold_past_its_deadline_once_the_tick_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The tick fails (logged once), so nothing would resolve the hold: past its deadline the
    flush releases it instead of waiting forever (the group would be stuck); a stale write
    is possible then, never a loss."""
    worker = Worker(tmp_path, monkeypatch)

    async def flush_with_a_failing_tick() -> Any:
        worker.start()
        worker.stall(9.0)
        held = await worker.send(CHANGELOG, b"written")
        monkeypatch.setattr(worker.producer, "_aiokafka_consumer", _failing)
        worker.producer._stall_tick()
        hold = worker.producer.stall_hold
        worker.stall(hold.deadline + TICK)
        await asyncio.wait_for(worker.producer.flush(), 2.0)
        return held

    with caplog.at_level(logging.ERROR, logger="streamassign.faust"):
        held = run(flush_with_a_failing_tick())
    assert "the stall hold's tick failed" in caplog.text
    assert held.done() and worker.sent == [(CHANGELOG, b"written")]
    assert not worker.producer.stall_hold.holding


def _failing() -> Any:
    raise RuntimeError("a bug in the tick")


def test_a_stopping_producer_drops_what_it_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = Worker(tmp_path, monkeypatch)

    async def stop() -> Any:
        worker.start()
        worker.stall(9.0)
        held = await worker.send(CHANGELOG, b"stale")
        monkeypatch.setattr(faust_aiokafka.Producer, "on_stop", _nothing)
        await worker.producer.on_stop()
        await asyncio.wait_for(worker.producer.flush(), 2.0)  # no tick: returns at once
        return held

    held = run(stop())
    assert not held.done() and worker.sent == []
    assert not worker.producer.stall_hold.holding


async def _nothing(_producer: Any) -> None:
    return None


def test_nothing_is_held_without_a_stall(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    worker = Worker(tmp_path, monkeypatch)

    async def steady() -> None:
        worker.start()
        for value in (b"a", b"b", b"c"):
            worker.stall(TICK)
            worker.look()
            await worker.send(CHANGELOG, value)

    run(steady())
    assert worker.sent == [(CHANGELOG, v) for v in (b"a", b"b", b"c")]


def test_exactly_once_and_a_threaded_producer_hold_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Transactions fence a zombie; a threaded producer sends from another loop."""
    assert Worker(tmp_path / "a", monkeypatch).producer._holds_stalls()
    eos = Worker(tmp_path / "b", monkeypatch, processing_guarantee="exactly_once")
    assert not eos.producer._holds_stalls()
    threaded = Worker(tmp_path / "c", monkeypatch, producer_threaded=True)
    assert not threaded.producer._holds_stalls()


def test_the_threshold_leaves_a_heartbeat_interval_of_the_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hold = Worker(tmp_path, monkeypatch).producer.stall_hold
    assert hold.threshold == pytest.approx(6.0 - 1.0 - TICK)
    assert hold.deadline == pytest.approx(7.0)


def test_heartbeats_are_watched_once_and_only_accepted_ones_count() -> None:
    answers = [True, False, True]

    async def heartbeat() -> bool:
        return answers.pop(0)

    group = GroupCoordinatorStandIn(["m-1"])
    coordinator = SimpleNamespace(
        _do_heartbeat=heartbeat, member_id="m-1", group_id="stall-app", coordinator_id=1
    )
    coordinator._client = group
    consumer = SimpleNamespace(_coordinator=coordinator)
    seen: list[float] = []
    assert watch_heartbeats(consumer, seen.append, lambda: True)
    assert watch_heartbeats(consumer, seen.append, lambda: True)  # not wrapped twice

    async def beat() -> list[bool]:
        return [await coordinator._do_heartbeat() for _ in range(3)]

    assert run(beat()) == [True, False, True]
    assert len(seen) == 2 and seen[0] <= seen[1]
    assert group.asked == 2  # once per accepted heartbeat, none for the refused one
    assert not watch_heartbeats(SimpleNamespace(), seen.append, lambda: True)


def test_a_heartbeat_accepted_while_the_coordinator_loads_the_group_releases_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker-restart case: Kafka answers a heartbeat with NONE, blindly, while it loads
    the group, whose loaded state then no longer has the member (expired meanwhile). Neither
    the heartbeat during the load (DescribeGroups says COORDINATOR_LOAD_IN_PROGRESS) nor one
    accepted while the loaded group does not list the member proves it; the reset drops."""
    worker = Worker(tmp_path, monkeypatch)

    async def restarted_broker() -> Any:
        worker.start()
        worker.stall(9.0)
        stale = await worker.send(CHANGELOG, b"stale")
        worker.look()
        worker.stall(0.5)
        worker.group.error = 14  # COORDINATOR_LOAD_IN_PROGRESS
        assert await worker.heartbeat() is True  # answered blindly, passed on unchanged
        worker.look()
        held_during_load = worker.producer.stall_hold.holding
        worker.group.error, worker.group.members = 0, ["m-2", "m-3"]  # loaded, m-1 expired
        assert await worker.heartbeat() is True
        worker.look()
        held_when_unlisted = worker.producer.stall_hold.holding
        worker.coordinator.member_id = ""  # the next request: UnknownMemberId
        worker.look()
        await asyncio.sleep(0)
        return stale, held_during_load, held_when_unlisted

    with caplog.at_level(logging.INFO):
        stale, held_during_load, held_when_unlisted = run(restarted_broker())
    assert held_during_load and held_when_unlisted
    assert worker.sent == [] and not stale.done()
    assert worker.group.asked == 2
    assert "GroupLoadInProgressError; the next heartbeat asks again" in caplog.text
    assert "not listed (group Stable, 2 member(s))" in caplog.text
    assert "dropped 1 after" in caplog.text and "membership survived" not in caplog.text


def test_a_failing_listing_leaves_the_heartbeat_alone_and_proves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listing cannot be had for now (the connection breaks): the heartbeat routine gets
    the heartbeat's own answer, and the hold goes on until a listing comes."""
    worker = Worker(tmp_path, monkeypatch)

    async def broken(*_: Any, **__: Any) -> Any:
        raise KafkaConnectionError("connection lost")

    async def flaky() -> tuple[bool, bool]:
        worker.start()
        worker.stall(5.5)
        await worker.send(CHANGELOG, b"a")
        worker.look()
        worker.stall(0.5)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(worker.group, "send", broken)
            answered = await worker.heartbeat()
            worker.look()
            held = worker.producer.stall_hold.holding
        assert await worker.heartbeat()  # the listing works again: it proves the membership
        worker.look()
        await asyncio.wait_for(released(worker.producer), 2.0)
        return answered, held

    assert run(flaky()) == (True, True)
    assert worker.sent == [(CHANGELOG, b"a")]


def test_an_answer_the_listing_cannot_read_lets_the_heartbeat_count_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An error asking again will not mend (an answer of another shape, a refusal): holding
    on would hold the worker's writes, and Faust's commits after them, forever; the heartbeat
    counts alone, as before listing, and one WARNING says so."""
    worker = Worker(tmp_path, monkeypatch)

    async def odd(*_: Any, **__: Any) -> Any:
        return SimpleNamespace(to_object=lambda: {"unexpected": []})

    async def unreadable() -> bool:
        worker.start()
        worker.stall(5.5)
        await worker.send(CHANGELOG, b"a")
        worker.look()
        worker.stall(0.5)
        monkeypatch.setattr(worker.group, "send", odd)
        answered: bool = await worker.heartbeat()
        worker.look()
        await asyncio.wait_for(released(worker.producer), 2.0)
        return answered

    with caplog.at_level(logging.WARNING, logger="streamassign.aiokafka"):
        assert run(unreadable()) is True
    assert worker.sent == [(CHANGELOG, b"a")]
    assert "the heartbeat counts alone" in caplog.text and "KeyError" in caplog.text


def test_no_listing_is_asked_while_no_proof_is_wanted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Normal heartbeats cost nothing extra: DescribeGroups only during a hold (or the
    lost membership's drops)."""
    worker = Worker(tmp_path, monkeypatch)

    async def steady() -> None:
        worker.start()
        for _ in range(3):
            worker.stall(TICK)
            worker.look()
            assert await worker.heartbeat()

    run(steady())
    assert worker.group.asked == 0


def test_the_lost_membership_lasts_until_a_new_member_id() -> None:
    """After a drop the zombie's sends are dropped while the member id is reset or the lost
    one; a new id (the revoke, then the join) ends it."""
    hold = StallHold(threshold=4.9, silence_threshold=4.9, deadline=7.0)
    hold.tick(100.0, "m-1")
    assert hold.check(109.0)
    assert hold.verdict(109.2, "") == DROPPED
    hold.lose(109.2)
    assert hold.still_lost("m-1") and hold.still_lost("") and hold.still_lost(None)
    assert not hold.still_lost("m-2")


def test_a_commit_without_a_member_id_fails_as_the_broker_fails_a_lost_member_s() -> None:
    """After the reset aiokafka commits with generation -1, which Kafka accepts when the
    group is Empty (every member expired in a broker restart): Faust would commit the events
    whose changelog writes the hold dropped (a live run lost 3 records so). Refused as an
    UnknownMemberId answer is (aiokafka turns it into Faust's "already rebalanced"
    CommitFailedError), and so is one under a new member id with no generation yet (after a
    MEMBER_ID_REQUIRED answer); a manual assignment's commits and a member's pass."""
    sent: list[Any] = []

    async def commit(assignment: Any, offsets: Any) -> None:
        sent.append(offsets)

    auto = [True]
    subscription = SimpleNamespace(partitions_auto_assigned=lambda: auto[0])
    coordinator = SimpleNamespace(
        member_id="",
        generation=-1,
        group_id="g",
        _subscription=subscription,
        _do_commit_offsets=commit,
    )
    consumer = SimpleNamespace(_coordinator=coordinator)
    assert refuse_commits_without_membership(consumer)
    assert refuse_commits_without_membership(consumer)  # not wrapped twice

    async def commits() -> None:
        with pytest.raises(UnknownMemberIdError):
            await coordinator._do_commit_offsets(None, {"tp": 5})
        await coordinator._do_commit_offsets(None, {})  # nothing to commit
        coordinator.member_id = "m-2"  # a new id, not yet in a generation
        with pytest.raises(UnknownMemberIdError):
            await coordinator._do_commit_offsets(None, {"tp": 5})
        coordinator.generation = 3
        await coordinator._do_commit_offsets(None, {"tp": 6})
        coordinator.member_id, coordinator.generation = "", -1
        auto[0] = False  # assign(): no group membership at all
        await coordinator._do_commit_offsets(None, {"tp": 7})

    run(commits())
    assert sent == [{}, {"tp": 6}, {"tp": 7}]
    assert not refuse_commits_without_membership(SimpleNamespace())


def test_the_tick_refuses_the_worker_s_commits_while_it_holds_no_membership(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stall tick installs the commit refusal on the worker's own consumer: without it,
    a commit after the reset reaches a broker that takes it for an Empty group."""
    worker = Worker(tmp_path, monkeypatch)

    async def commits() -> None:
        worker.start()
        await worker.coordinator._do_commit_offsets(None, {"tp": 1})
        worker.coordinator.member_id, worker.coordinator.generation = "", -1
        with pytest.raises(UnknownMemberIdError):
            await worker.coordinator._do_commit_offsets(None, {"tp": 2})

    run(commits())
    assert worker.committed == [{"tp": 1}]


def test_a_later_proof_tells_why_it_waits_even_for_the_last_proof_s_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Back-to-back broker restarts: two holds whose first unconfirmed heartbeat has the same
    reason (the group loading) each log it; repeats within one proof are not logged."""
    wanted = [True]
    coordinator = SimpleNamespace(
        member_id="m-1", group_id="stall-app", coordinator_id=1, _client=None
    )
    coordinator._client = GroupCoordinatorStandIn(["m-1"], error=14)

    async def accepted() -> bool:
        return True

    coordinator._do_heartbeat = accepted
    assert watch_heartbeats(
        SimpleNamespace(_coordinator=coordinator), lambda sent: None, lambda: wanted[0]
    )

    async def two_holds() -> None:
        for _ in range(2):
            wanted[0] = True
            await coordinator._do_heartbeat()
            await coordinator._do_heartbeat()  # the same reason again: not logged
            wanted[0] = False
            await coordinator._do_heartbeat()  # no proof wanted: nothing asked

    with caplog.at_level(logging.INFO, logger="streamassign.aiokafka"):
        run(two_holds())
    assert caplog.text.count("GroupLoadInProgressError; the next heartbeat asks again") == 2
    assert coordinator._client.asked == 4
