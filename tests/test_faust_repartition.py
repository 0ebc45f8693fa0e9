"""Partitions added to a table's source topic under a running Faust worker: every assignment
makes Faust check the source's partition count against the changelog's again, so the first
table write after it raises Faust's own ``PartitionsMismatch`` instead of writing a value built
from a table partition the worker may not hold. Real Faust app objects, no broker: the
consumer's metadata (what Faust's check reads) is a stand-in."""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import faust
import pytest
from faust.exceptions import PartitionsMismatch
from faust.streams import _current_event

from streamassign.faust import PartitionAssignor

from .test_faust_assignor import CL, COUNTS, SRC, make_app, rebalance


class Message:
    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition


class Event:
    """What Faust's table reads of the event an agent processes: its topic and partition."""

    def __init__(self, topic: str, partition: int) -> None:
        self.message = Message(topic, partition)


class MetadataStandIn:
    """``app.consumer`` as Faust's check reads it: the partition counts aiokafka last saw."""

    def __init__(self, counts: Mapping[str, int]) -> None:
        self.counts = dict(counts)

    def topic_partitions(self, topic: str) -> int | None:
        return self.counts.get(topic)


class Sent:
    """The changelog record ``send_changelog`` returns (what ``on_key_set`` reads of it)."""

    def __init__(self, partition: int) -> None:
        self.message = Message(CL, partition)


def table_write(app: faust.App, key: str, value: int, partition: int) -> None:
    """An agent's ``table[key] = value`` while it processes a record of ``SRC``'s
    ``partition``: Faust's whole write path down to the changelog send."""
    event = Event(SRC, partition)
    token = _current_event.set(weakref.ref(event))  # type: ignore[arg-type]
    try:
        app.tables["totals"][key] = value
    finally:
        _current_event.reset(token)


@pytest.fixture
def worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[faust.App, list[int]]:
    """One worker of a Faust app with a table fed by ``SRC``; the changelog partitions its
    writes were sent to."""
    app = make_app(tmp_path / "w0", 7000)
    app.consumer = MetadataStandIn(COUNTS)  # type: ignore[assignment]
    sent: list[int] = []

    def send_changelog(partition: int, key: Any, value: Any, *args: Any) -> Sent:
        sent.append(partition)
        return Sent(partition)

    monkeypatch.setattr(app.tables["totals"], "send_changelog", send_changelog)
    return app, sent


def test_after_partitions_are_added_an_assignment_makes_the_next_write_fail(
    worker: tuple[faust.App, list[int]],
) -> None:
    """Without the check again, the running worker writes on: Faust checked once, at the
    first write. After the next assignment the write raises, naming both counts, and neither
    the changelog nor the table gets it."""
    app, sent = worker
    assignor = app.assignor
    assert isinstance(assignor, PartitionAssignor)
    rebalance({"m0": assignor})
    table_write(app, "k", 1, partition=3)
    assert sent == [3]

    grown = {**COUNTS, SRC: 8}
    app.consumer.counts = grown  # type: ignore[attr-defined]  # aiokafka's refresh saw 8
    table_write(app, "k", 2, partition=3)  # no assignment yet: Faust's cached answer
    assert sent == [3, 3]

    rebalance({"m0": assignor}, grown)  # the rejoin the refresh starts
    with pytest.raises(
        PartitionsMismatch, match=rf"(?s)'{SRC}'.*has 8 partitions.*'{CL}' has 6 partitions"
    ):
        table_write(app, "k", 3, partition=3)
    assert sent == [3, 3]
    assert app.tables["totals"].data["k"] == 2


def test_a_group_on_fausts_own_protocol_checks_again_too(
    worker: tuple[faust.App, list[int]],
) -> None:
    app, sent = worker
    assignor = app.assignor
    assert isinstance(assignor, PartitionAssignor)
    table_write(app, "k", 1, partition=0)
    app.consumer.counts = {**COUNTS, SRC: 8}  # type: ignore[attr-defined]
    assignor._on_fausts_assignment()  # what FaustsOwnAssignor.on_assignment calls
    with pytest.raises(PartitionsMismatch):
        table_write(app, "k", 2, partition=0)
    assert sent == [0]


def test_equal_counts_still_write_after_an_assignment(
    worker: tuple[faust.App, list[int]],
) -> None:
    app, sent = worker
    assignor = app.assignor
    assert isinstance(assignor, PartitionAssignor)
    for value in range(3):
        rebalance({"m0": assignor})
        table_write(app, "k", value, partition=1)
    assert sent == [1, 1, 1]
    assert app.tables["totals"].data["k"] == 2


def test_a_faust_without_the_cache_is_left_alone(worker: tuple[faust.App, list[int]]) -> None:
    """Another Faust version may check on every write, or not at all: no attribute to clear is
    no error at the assignment."""
    app, _sent = worker
    del app.tables["totals"]._verified_source_topics_for_partitions
    assignor = app.assignor
    assert isinstance(assignor, PartitionAssignor)
    rebalance({"m0": assignor})
    assert assignor.assigned_actives()
