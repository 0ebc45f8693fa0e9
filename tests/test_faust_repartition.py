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

from streamassign import TaskId
from streamassign.faust import PartitionAssignor
from streamassign.faust.leader import DISK_TABLES_TAG, assign_faust
from streamassign.faust.topology import FAUST_HASHED_ID_BASE, faust_style_topology
from streamassign.protocol import LATEST_OFFSET, SubscriptionInfo
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


class Coordinator:
    """aiokafka's group coordinator as far as Faust's driver reads it: the partition counts
    it noted at the last assignment its worker made as leader (``{}`` until then)."""

    def __init__(self) -> None:
        self._metadata_snapshot: dict[str, int] = {}


class AiokafkaConsumer:
    def __init__(self) -> None:
        self._coordinator = Coordinator()


class ConsumerThread:
    def __init__(self) -> None:
        self._consumer = AiokafkaConsumer()
        #: Not None: the tests' teardown then takes it for a started mode thread, which
        #: closes its own loop (this stand-in has none).
        self._thread = object()


class FaustConsumer:
    """``app.consumer``: Faust's driver answers ``topic_partitions`` from the coordinator's
    snapshot, as here."""

    def __init__(self) -> None:
        self._thread = ConsumerThread()

    def topic_partitions(self, topic: str) -> int | None:
        return self._thread._consumer._coordinator._metadata_snapshot.get(topic)


def snapshot(app: faust.App) -> dict[str, int]:
    consumer: FaustConsumer = app.consumer  # type: ignore[assignment]
    return consumer._thread._consumer._coordinator._metadata_snapshot


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


def worker_app(datadir: Path, port: int, monkeypatch: pytest.MonkeyPatch) -> faust.App:
    app = make_app(datadir, port)
    app.consumer = FaustConsumer()  # type: ignore[assignment]
    sent: list[int] = []

    def send_changelog(partition: int, key: Any, value: Any, *args: Any) -> Sent:
        sent.append(partition)
        return Sent(partition)

    monkeypatch.setattr(app.tables["totals"], "send_changelog", send_changelog)
    monkeypatch.setattr(app, "sent", sent, raising=False)
    return app


def sent_to(app: faust.App) -> list[int]:
    """The changelog partitions ``app``'s table writes were sent to."""
    sent: list[int] = app.sent  # type: ignore[attr-defined]
    return sent


def group_round(apps: Mapping[str, faust.App], counts: Mapping[str, int]) -> None:
    """A rebalance: the first app leads; aiokafka notes the counts in the leader's snapshot."""
    rebalance({m: assignor_of(app) for m, app in apps.items()}, counts)
    leader = next(iter(apps.values()))
    snapshot(leader).update(counts)


def assignor_of(app: faust.App) -> PartitionAssignor:
    assignor = app.assignor
    assert isinstance(assignor, PartitionAssignor)
    return assignor


@pytest.fixture
def group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, faust.App]:
    """Two workers of a Faust app with a table fed by ``SRC``: m0 leads, m1 follows."""
    return {f"m{i}": worker_app(tmp_path / f"w{i}", 7000 + i, monkeypatch) for i in range(2)}


@pytest.mark.parametrize("member", ["m0", "m1"])
def test_after_partitions_are_added_an_assignment_makes_the_next_write_fail(
    group: dict[str, faust.App], member: str
) -> None:
    """Without the check again, a running worker writes on: Faust checked once, at the first
    write, and a follower's snapshot (what the check reads) is empty. After the next
    assignment the write raises on leader and follower alike, naming both counts, and
    neither the changelog nor the table gets it."""
    app = group[member]
    group_round(group, COUNTS)
    partition = next(tp.partition for tp in assignor_of(app).assigned_actives() if tp.topic == SRC)
    table_write(app, "k", 1, partition)
    table_write(app, "k", 2, partition)
    assert sent_to(app) == [partition, partition]

    group_round(group, {**COUNTS, SRC: 8})  # the rejoin the leader's metadata refresh starts
    with pytest.raises(PartitionsMismatch, match=rf"(?s)'{SRC}'.*has 8 partitions.*'{CL}' has 6"):
        table_write(app, "k", 3, partition)
    assert sent_to(app) == [partition, partition]
    assert app.tables["totals"].data["k"] == 2


def test_a_follower_has_the_new_counts_before_its_tables_check_again(
    group: dict[str, faust.App], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent's write between the two would check the old counts and keep that answer
    until the next assignment."""
    follower = assignor_of(group["m1"])
    read: list[int | None] = []
    monkeypatch.setattr(
        follower, "_reverify_table_sources", lambda: read.append(snapshot(group["m1"]).get(SRC))
    )
    group_round(group, COUNTS)
    group_round(group, {**COUNTS, SRC: 8})
    assert read == [6, 8]


def test_a_group_on_fausts_own_protocol_checks_again_too(group: dict[str, faust.App]) -> None:
    app = group["m0"]
    snapshot(app).update(COUNTS)
    table_write(app, "k", 1, partition=0)
    snapshot(app).update({SRC: 8})
    assignor_of(app)._on_fausts_assignment()  # what FaustsOwnAssignor.on_assignment calls
    with pytest.raises(PartitionsMismatch):
        table_write(app, "k", 2, partition=0)
    assert sent_to(app) == [0]


def test_equal_counts_still_write_after_an_assignment(group: dict[str, faust.App]) -> None:
    app = group["m1"]
    for value in range(3):
        group_round(group, COUNTS)
        partition = next(
            tp.partition for tp in assignor_of(app).assigned_actives() if tp.topic == SRC
        )
        table_write(app, "k", value, partition)
    assert len(sent_to(app)) == 3
    assert app.tables["totals"].data["k"] == 2


def test_a_faust_or_aiokafka_without_what_it_reads_is_left_alone(
    group: dict[str, faust.App],
) -> None:
    """Another Faust version may check on every write, or not at all; another aiokafka may
    keep no snapshot: nothing to clear or fill is no error at the assignment."""
    for app in group.values():
        del app.tables["totals"]._verified_source_topics_for_partitions
    consumer: FaustConsumer = group["m1"].consumer  # type: ignore[assignment]
    del consumer._thread._consumer._coordinator._metadata_snapshot
    group_round(group, COUNTS)
    assert all(assignor_of(app).assigned_actives() for app in group.values())


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
    leader_topic = "shop-__assignor-__leader"  # Faust's: read by every worker, no source
    members = {f"m{i}": leader_member(i, LEADER_TOPICS | {leader_topic}) for i in range(3)}
    grown = {SRC: 8, CL: 6, leader_topic: 1}
    with caplog.at_level(logging.DEBUG, "streamassign.faust"):
        for counts in ({**grown, SRC: 6}, grown, grown, {**grown, CL: 8}):
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


@pytest.mark.parametrize("use_partitioner", [True, False])
def test_a_table_placed_by_the_partitioner_has_its_own_count_unsaid(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, use_partitioner: bool
) -> None:
    """A ``use_partitioner`` table's keys go where the producer's partitioner puts them, so
    its changelog's count is its own (Faust never checks it): the leader's app says so, and
    no WARNING tells the operator to grow that changelog, which would re-hash its keys. The
    same table without it is said."""
    app = make_app(tmp_path, 7000)
    app.Table("by_user", default=int, partitions=12, use_partitioner=use_partitioner)
    by_user_changelog = app.tables["by_user"].changelog_topic.get_topic_name()
    with caplog.at_level(logging.DEBUG, "streamassign.faust"):
        rebalance({"m0": assignor_of(app)}, {**COUNTS, by_user_changelog: 12})
    said = [line for line in lone_lines(caplog) if by_user_changelog in line[1]]
    assert [level for level, _ in said] == ([] if use_partitioner else [logging.WARNING])
    assert not [line for line in lone_lines(caplog) if by_user_changelog not in line[1]]


# -- the leader: a claim made while a task was stateless, after its group became stateful -----


def restarted_with_stale_claims(
    tag: str | None, changelogs: frozenset[str] = frozenset({CL})
) -> frozenset[TaskId]:
    """After the remedy (the changelog grown to the source's 8 partitions, workers restarted):
    X restarted claiming t0 and t1 without offset sums, as it ran them while the group was the
    source alone; W runs all four tasks, V holds caught-up standbys of all four (20,000
    records each, past the acceptable recovery lag). ``tag``: what X announces under
    ``DISK_TABLES_TAG`` (None: nothing, an older member). Returns what X gets of t0, t1."""
    counts = {SRC: 4, CL: 4}
    t = sorted(
        assign_faust({"x": leader_member(9)}, counts, changelog_topics=changelogs)["x"].info.active
    )
    tags = {DISK_TABLES_TAG: tag} if tag is not None else {}

    def at(
        i: int, sums: Mapping[TaskId, int], previous: frozenset[TaskId] = frozenset()
    ) -> MemberSubscription:
        info = SubscriptionInfo(
            uuid.UUID(int=i + 1),
            offset_sums=dict(sums),
            previous_active=previous,
            client_tags=tags if i == 0 else {},
        )
        return MemberSubscription(LEADER_TOPICS, info)

    members = {
        "X": at(0, {}, frozenset(t[:2])),
        "W": at(1, dict.fromkeys(t, LATEST_OFFSET), frozenset(t)),
        "V": at(2, dict.fromkeys(t, 20_000)),
    }
    result = assign_faust(members, counts, num_standby_replicas=1, changelog_topics=changelogs)
    return result["X"].info.active & frozenset(t[:2])


def test_a_claim_from_when_the_task_was_stateless_is_not_handed_back_cold() -> None:
    """The audit's remedy run: restarted workers claimed ``8_p`` from the split window, when it
    was the source alone, and the leader handed them back as stateless tasks, restored from
    scratch while other workers held warm standbys. A worker with on-disk tables reports a
    stateful task at 0 at least, so its claim without a sum is such a stale one: not handed
    back. In-memory tables (tag 0) and older members (no tag) keep the hand-back, and so does
    a task that is stateless now."""
    assert not restarted_with_stale_claims("1")
    assert len(restarted_with_stale_claims("0")) == 2
    assert len(restarted_with_stale_claims(None)) == 2
    assert len(restarted_with_stale_claims("1", changelogs=frozenset())) == 2


@pytest.mark.parametrize(("store", "said"), [("rocksdb://", "1"), ("memory://", "0")])
def test_a_worker_says_whether_its_tables_keep_state_on_disk(
    tmp_path: Path, store: str, said: str
) -> None:
    app = make_app(tmp_path / "w0", 7000, store=store)
    data = assignor_of(app).metadata(set(COUNTS)).user_data
    assert SubscriptionInfo.decode(data).client_tags[DISK_TABLES_TAG] == said


# -- subtopology ids: a deploy adding topics of a running group's count ---------------------


V1 = ["src", "rp-counts-changelog"]
V2 = [*V1, "extra", "rp-seen-changelog"]
ALL_SIX = dict.fromkeys(V2, 6)


@pytest.mark.parametrize("order", ["deploy", "roll-back"])
def test_a_rolling_deploy_never_renames_the_running_group(order: str) -> None:
    """The audit's deploy: v2 adds an agent on ``extra`` and a table ``seen``, both of 6
    partitions like the running group. The new group has as many topics and sorts first, so
    it took id 6 in the mixed window and the running table's tasks were renamed twice (3 of 6
    table partitions moved at the first restart). Now the group every worker reads keeps 6 at
    every step, rolling forward and back; the new topics' group is hashed until it merges."""
    steps = [
        {"w1": V1, "w2": V1, "w3": V1},
        {"w1": V1, "w2": V1, "w3": V2},
        {"w1": V2, "w2": V1, "w3": V2},
        {"w1": V2, "w2": V2, "w3": V2},
    ]
    for subscriptions in steps if order == "deploy" else reversed(steps):
        topology = faust_style_topology(subscriptions, ALL_SIX)
        assert topology.subtopology_of("src") == 6
        assert topology.subtopology_of("rp-counts-changelog") == 6
        if "extra" in topology.source_topics:
            mixed = len({tuple(s) for s in subscriptions.values()}) > 1
            assert (topology.subtopology_of("extra") >= FAUST_HASHED_ID_BASE) == mixed


def test_without_a_group_read_by_every_worker_the_most_topics_keep_the_id() -> None:
    """Two kinds of workers reading different topics of one count: no group's readers include
    the other's, so the rule before applies (the most topics, then the first name), and a
    worker joining with another's subscription changes no id."""
    counts = {"a": 4, "b": 4, "c": 4}
    before = faust_style_topology({"m1": ["a"], "m2": ["b", "c"]}, counts)
    assert before.subtopology_of("b") == 4
    assert before.subtopology_of("a") >= FAUST_HASHED_ID_BASE
    grown = faust_style_topology({"m1": ["a"], "m2": ["b", "c"], "m3": ["a"], "m4": ["a"]}, counts)
    assert grown == before
