"""Partitions added to a table's source topic under a running Faust worker: every assignment
makes Faust check the source's partition count against the changelog's again, so the first
table write after it raises Faust's own ``PartitionsMismatch`` instead of writing a value built
from a table partition the worker may not hold. Real Faust app objects, no broker: the
consumer's metadata (what Faust's check reads) is a stand-in."""

from __future__ import annotations

import logging
import uuid
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import faust
import pytest
from faust.exceptions import PartitionsMismatch
from faust.streams import _current_event

from streamassign.faust import PartitionAssignor
from streamassign.faust.leader import assign_faust
from streamassign.protocol import SubscriptionInfo
from streamassign.repeats import Repeats
from streamassign.streams import MemberSubscription

from .test_faust_assignor import CL, COUNTS, SRC, make_app, rebalance

LEADER_COUNTS = {SRC: 6, CL: 6}
LEADER_TOPICS = frozenset(LEADER_COUNTS)
LEADER_GLOBAL = "shop-rates-changelog"


def leader_member(i: int, topics: frozenset[str] = LEADER_TOPICS) -> MemberSubscription:
    return MemberSubscription(topics, SubscriptionInfo(uuid.UUID(int=i + 1)))


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


# -- the leader: a table changelog left without a topic of its partition count ---------------


def lone_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.getMessage().startswith("table changelog ")
    ]


def test_a_source_grown_past_its_changelog_is_said_once_and_still_assigned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The audit's fleet: ``orders`` 6 -> 8 left the changelog alone with 6, and the leader
    said nothing. Now one WARNING names both counts and the remedy, repeats at DEBUG, one
    INFO line once they match again; every round still assigns every partition."""
    logged = Repeats()
    members = {f"m{i}": leader_member(i) for i in range(3)}
    grown = {SRC: 8, CL: 6}
    with caplog.at_level(logging.DEBUG, "streamassign.faust"):
        for counts in (LEADER_COUNTS, grown, grown, {SRC: 8, CL: 8}):
            result = assign_faust(
                members,
                counts,
                num_standby_replicas=1,
                changelog_topics={CL},
                lone_changelogs=logged,
            )
            assigned = {tp for got in result.values() for tp in got.partitions}
            assert {(tp.topic, tp.partition) for tp in assigned} >= {
                (t, p) for t, n in counts.items() for p in range(n)
            }
    lines = lone_lines(caplog)
    assert [level for level, _ in lines] == [logging.WARNING, logging.DEBUG]
    assert lines[0][1].startswith(
        f"table changelog {CL} has 6 partitions, but no topic the workers reading it consume "
        f"has 6 ({SRC} 8): were partitions added to the table's source topic?"
    )
    assert "PartitionsMismatch" in lines[0][1]
    assert "Adding partitions to a topic on a live fleet" in lines[0][1]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert infos == ["every table changelog has a topic of its partition count to read again"]


def test_a_new_situation_is_news_and_a_global_table_is_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another count is another situation (WARNING again); a global table's changelog has its
    own count by design; without a ``Repeats`` every round says it."""
    logged = Repeats()
    members = {"m0": leader_member(0, LEADER_TOPICS | {LEADER_GLOBAL})}
    with caplog.at_level(logging.DEBUG, "streamassign.faust"):
        for n in (8, 8, 12):
            counts = {SRC: n, CL: 6, LEADER_GLOBAL: 2}
            assign_faust(
                members,
                counts,
                changelog_topics={CL, LEADER_GLOBAL},
                global_changelog_topics={LEADER_GLOBAL},
                lone_changelogs=logged,
            )
        assign_faust(members, {SRC: 8, CL: 6}, changelog_topics={CL})
    levels = [level for level, _ in lone_lines(caplog)]
    assert levels == [logging.WARNING, logging.DEBUG, logging.WARNING, logging.WARNING]
    assert not any(LEADER_GLOBAL in message for _, message in lone_lines(caplog))
