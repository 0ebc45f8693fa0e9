"""What the stall hold (``streamassign.faust._stallhold``) does for a worker without tables,
and when it cannot watch the heartbeats.

- A worker without tables holds nothing: no flush waits, no lost membership is told.
- A heartbeat wrap that fails is told once, and no silence counts without it.

Faust's real producer on a fake clock; aiokafka's coordinator is a stand-in."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import aiokafka
import pytest
from faust.types import TP

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
    """Wrapped at the first tick, its wrap (marked as any of the library's) is its own after:
    the silence counts, nothing is told."""
    worker = _beating(Worker(tmp_path, monkeypatch))

    async def cut() -> bool:
        worker.start()
        assert await worker.heartbeat()
        _partitioned(worker, 6.5)
        return worker.producer.stall_hold.holding

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        assert run(cut())
    assert not any("cannot watch" in m for m in faust_lines(caplog, logging.WARNING))
