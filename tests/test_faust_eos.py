"""The ``streamassign://`` Faust transport under ``processing_guarantee="exactly_once"``,
without a broker: where a table recovery's highwaters come from, and the WARNING that says
what Faust's exactly_once does not keep."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

faust = pytest.importorskip("faust")

from aiokafka.errors import KafkaTimeoutError  # noqa: E402
from faust.types import TP  # noqa: E402

from .faust_apps import close_app  # noqa: E402
from .test_faust_transport import table_app  # noqa: E402

CHANGELOG = TP("orders-app-totals-changelog", 0)
FETCHED = TP("orders-app-totals-changelog", 1)


class NotFetchedYet:
    """aiokafka's consumer before a fetch of CHANGELOG came back in this assignment: no cached
    last stable offset for it; the broker's answer (``end_offsets``) is 42, or an error."""

    def __init__(self, failure: Exception | None = None) -> None:
        self.failure = failure
        self.asked: list[list[TP]] = []

    def last_stable_offset(self, tp: TP) -> int | None:
        return 40 if tp == FETCHED else None

    async def end_offsets(self, partitions: list[TP]) -> dict[TP, int]:
        self.asked.append(list(partitions))
        if self.failure is not None:
            raise self.failure
        return {tp: 42 for tp in partitions}


def consumer_thread(tmp_path: Path, aiokafka_consumer: Any, **settings: Any) -> Any:
    app = table_app(tmp_path, **settings)
    app.in_worker = True  # Faust's transactions run only in a worker
    thread = app.consumer._thread
    assert thread.consumer.in_transaction == (settings["processing_guarantee"] == "exactly_once")
    thread._consumer = aiokafka_consumer  # as when Faust's consumer thread has started
    return thread


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_highwaters_come_from_the_broker_before_any_fetch(tmp_path: Path, guarantee: str) -> None:
    """Faust's exactly_once read aiokafka's cached last stable offset, None before the first
    fetch, which its recovery took for -1 and then raised ``ConsistencyError`` for any
    persisted offset: workers crash-looped after a restart or a standby's promotion. Both
    guarantees ask the broker (read_committed under exactly_once: the last stable offset)."""
    aiokafka_consumer = NotFetchedYet()
    thread = consumer_thread(tmp_path, aiokafka_consumer, processing_guarantee=guarantee)
    try:
        highwaters = asyncio.run(thread._highwaters([CHANGELOG, FETCHED]))
    finally:
        close_app(thread.app)
    assert highwaters == {CHANGELOG: 42, FETCHED: 42}
    assert aiokafka_consumer.asked == [[CHANGELOG, FETCHED]]


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_a_highwater_the_broker_does_not_give_fails_as_under_at_least_once(
    tmp_path: Path, guarantee: str
) -> None:
    """No made-up highwater when the broker does not answer: aiokafka's error reaches Faust's
    recovery as it does under at-least-once, never a -1 that fails its consistency check."""
    aiokafka_consumer = NotFetchedYet(KafkaTimeoutError("no answer"))
    thread = consumer_thread(tmp_path, aiokafka_consumer, processing_guarantee=guarantee)
    try:
        with pytest.raises(KafkaTimeoutError):
            asyncio.run(thread._highwaters([CHANGELOG]))
    finally:
        close_app(thread.app)


def warnings_said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "Faust's exactly_once" in r.getMessage()]


@pytest.mark.parametrize(
    ("guarantee", "broker", "assignor", "at_creation", "at_start"),
    [
        ("exactly_once", "streamassign://localhost:1", "streamassign.faust", 0, 1),
        ("exactly_once", "kafka://localhost:1", "streamassign.faust", 1, 0),
        ("exactly_once", "streamassign://localhost:1", "faust.assignor", 0, 1),
        ("exactly_once", "kafka://localhost:1", "faust.assignor", 0, 0),  # none of ours
        ("at_least_once", "streamassign://localhost:1", "streamassign.faust", 0, 0),
    ],
)
def test_exactly_once_is_told_once_what_it_does_not_keep(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    guarantee: str,
    broker: str,
    assignor: str,
    at_creation: int,
    at_start: int,
) -> None:
    """Faust's exactly_once loses table updates of aborted transactions and sends to sinks
    outside transactions, whichever assignor: one WARNING per worker using our assignor or
    transport. On ``streamassign://`` it comes at the consumer's start, in the worker (its
    logging set up), not where the app is made (every process importing it: ``faust send``,
    scripts); on Faust's own transport with our assignor, beside the assignor's warning about
    that transport."""
    from faust.transport.consumer import ConsumerThread
    from faust.transport.drivers import aiokafka as faust_aiokafka

    async def nothing(self: Any) -> None:  # no aiokafka consumer is started or stopped here
        return None

    monkeypatch.setattr(faust_aiokafka.AIOKafkaConsumerThread, "on_start", nothing)
    monkeypatch.setattr(ConsumerThread, "on_thread_stop", nothing)
    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        app = faust.App(
            "orders-app",
            broker=broker,
            datadir=str(tmp_path),
            PartitionAssignor=f"{assignor}:PartitionAssignor",
            processing_guarantee=guarantee,
        )
        app.Table("totals", default=int)
        try:
            app.assignor  # noqa: B018 (made on first use)
            thread = app.consumer._thread
            made = warnings_said(caplog)

            async def start_and_stop() -> None:  # the stop detaches what the start attached
                try:
                    await thread.on_start()
                finally:
                    await thread.on_thread_stop()

            asyncio.run(start_and_stop())
        finally:
            close_app(app)
    said = warnings_said(caplog)
    assert (len(made), len(said) - len(made)) == (at_creation, at_start), said
    if said:
        assert "faust-streaming 0." in said[0] and '"Exactly once"' in said[0], said
