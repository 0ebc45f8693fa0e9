"""What a stop that ``closing.stop_within`` cut leaves running is released, step by step;
the private parts of aiokafka the releases reach, checked on the installed version."""

from __future__ import annotations

import asyncio
import inspect
import logging

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.client import AIOKafkaClient
from aiokafka.consumer.fetcher import Fetcher
from aiokafka.consumer.group_coordinator import GroupCoordinator

from streamassign.aiokafka import closing


class Closes:
    def __init__(self, closed: list[str], name: str) -> None:
        self.closed, self.name = closed, name

    async def close(self) -> None:
        self.closed.append(self.name)


def test_a_failed_release_step_does_not_skip_the_next_ones(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """review5 #2: one ``suppress`` around every step meant that the first step failing (an
    aiokafka that renamed ``_stop_heartbeat_task``) silently skipped closing the fetcher and
    the connections. Each step now runs on its own, and a failed one is logged."""
    closed: list[str] = []

    class Renamed:  # a consumer whose coordinator lacks the methods the release calls
        _coordinator = object()
        _fetcher = Closes(closed, "fetcher")
        _client = Closes(closed, "client")

    with caplog.at_level(logging.WARNING, "streamassign"):
        asyncio.run(closing.release_consumer("consumer 0", Renamed(), logging.getLogger("t")))
    assert closed == ["fetcher", "client"]
    assert "consumer 0: could not stop its heartbeat after its stop was cut" in caplog.text


def test_the_aiokafka_parts_the_releases_reach_exist() -> None:
    """The releases reach aiokafka's private attributes; an upgrade that renames one must
    fail here rather than leave a cut client running with only a warning."""
    for cls, methods in (
        (GroupCoordinator, ["_stop_heartbeat_task", "_stop_commit_offsets_refresh_task"]),
        (Fetcher, ["close"]),
        (AIOKafkaClient, ["close"]),
    ):
        missing = [m for m in methods if not hasattr(cls, m)]
        assert not missing, f"{cls.__name__} lacks {missing}"
    # A consumer's parts exist once it started (no broker here): its start sets them.
    start = inspect.getsource(AIOKafkaConsumer.start) + inspect.getsource(AIOKafkaConsumer)
    for attribute in ("self._coordinator =", "self._fetcher =", "self._client ="):
        assert attribute in start, f"AIOKafkaConsumer no longer sets {attribute}"
