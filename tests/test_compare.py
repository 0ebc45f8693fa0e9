"""The core's comparison of two assignments (``streamassign.compare``), on its own: what the
CLI tests of ``explain``, ``diff``, ``plan --clients`` and ``describe --watch`` do not reach."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from streamassign import ClientAssignment, TaskId, TopicPartition
from streamassign.compare import (
    CONSUMER_FAMILY,
    PartitionNames,
    TaskSource,
    TaskTable,
    compare_snapshots,
    is_partition_table,
    match_views,
    other_partitions_warning,
    partition_names,
)
from streamassign.explain import ClientView, ProcessMembers, Snapshot, load_snapshot


def table(*entries: str) -> dict[TaskId, frozenset[TopicPartition]]:
    """A task table of ``t_p=topic-p`` entries (``t_p=a-0+b-0``: two partitions)."""
    out = {}
    for entry in entries:
        task, _, names = entry.partition("=")
        parts = [name.rpartition("-") for name in names.split("+")]
        out[TaskId.parse(task)] = frozenset(TopicPartition(t, int(p)) for t, _, p in parts)
    return out


def test_a_partition_table_is_one_partition_per_task_numbered_by_topic() -> None:
    """The form ``describe`` gives a consumer group's table: ``t_p`` is partition ``p`` of
    the topic numbered ``t``, one number per topic and one topic per number."""
    assert is_partition_table(table("0_0=a-0", "0_1=a-1", "1_0=b-0"))
    assert is_partition_table({})
    for broken in (
        table("0_0=a-0+b-0"),  # two partitions
        table("0_1=a-0"),  # another partition than the id's
        table("0_0=a-0", "1_1=a-1"),  # one topic, two numbers
        table("0_0=a-0", "0_1=b-1"),  # one number, two topics
    ):
        assert not is_partition_table(broken), broken


def test_partition_names_name_every_partition_and_give_ids_of_the_after_sides_topics() -> None:
    """``--json`` gives no id only to a gone topic's partition (numbered past
    AFTER's topics); a partition of a topic AFTER still numbers keeps its id though AFTER's
    table lacks it (its owner undecodable). An id neither table lists (a hand-edited file)
    has no partition, and its label says so (a bare id under ``partition`` read as one)."""
    old = table("1_0=orders-0", "1_2=orders-2", "2_0=gone-0")  # already numbered as AFTER's
    new = table("0_0=a-new-0", "1_0=orders-0")
    names = partition_names(old, new)
    assert names is not None
    assert [names.as_json(TaskId.parse(t)) for t in ("0_0", "1_2", "2_0", "5_0")] == [
        {"task": "0_0", "partition": ["a-new", 0]},
        {"task": "1_2", "partition": ["orders", 2]},
        {"task": None, "partition": ["gone", 0]},
        {"task": "5_0", "partition": None},
    ]
    assert [names.label(TaskId.parse(t)) for t in ("1_2", "2_0", "5_0")] == [
        "orders-2",
        "gone-0",
        "5_0 (no partition)",
    ]


def test_partition_names_are_none_for_tables_matched_by_id() -> None:
    """A table not of a consumer group's form, or two tables naming one id with other
    partitions (a hand-edited file), are matched by id: moves keep their ids."""
    orders = table("0_0=orders-0", "0_1=orders-1")
    assert partition_names(table("0_0=a-0+b-0"), orders) is None
    assert partition_names(orders, table("0_1=orders-0")) is None
    assert partition_names(orders, table("0_0=a-0", "1_0=orders-0")) is None
    assert partition_names(orders, orders) == PartitionNames(
        {t: next(iter(ps)) for t, ps in orders.items()}, {0: "orders"}
    )


def test_a_gone_topics_partition_gets_no_id_that_after_gives_another_topic() -> None:
    """Matched by id (a hand-edited BEFORE), a gone topic's partition may have an
    id AFTER gives a partition of another topic: ``--json`` must not give that id, or a script
    joining on ``task`` would link two partitions."""
    before = table("0_5=a-5", "1_0=orders-0")
    after = table("0_0=b-0", "1_0=orders-0")
    names = partition_names(before, after)
    assert names is not None
    assert names.as_json(TaskId(0, 5)) == {"task": None, "partition": ["a", 5]}
    assert names.as_json(TaskId(0, 0)) == {"task": "0_0", "partition": ["b", 0]}
    assert names.as_json(TaskId(1, 0)) == {"task": "1_0", "partition": ["orders", 0]}


def test_the_renumbering_note_counts_removed_topics() -> None:
    """Several gone topics read "removed topics numbered past ...", not "a removed topic";
    between files of the same topics the note keeps the files' wording (a subscribed topic
    without partitions, or an edited file: their subscriptions are not known)."""

    def consumer_group(*entries: str) -> Snapshot:
        return Snapshot({}, family=CONSUMER_FAMILY, tasks=table(*entries))

    old = consumer_group("0_0=a-0", "1_0=orders-0", "2_0=x-0")
    new = consumer_group("0_0=orders-0")
    (note,) = compare_snapshots(old, new, "before.json", "after.json").lines
    assert note.endswith(
        "renumbered by a change of topics (removed topics a, x); removed topics numbered past "
        "every id there: a as 1_p, x as 2_p"
    )
    renumbered = consumer_group("1_0=orders-0")
    (same,) = compare_snapshots(renumbered, new, "before.json", "after.json").lines
    assert same.endswith("a subscribed topic with no partition assigned (or an edited file)")


def test_other_partitions_warning_names_the_first_differing_tasks_partitions() -> None:
    """With the same topics on both sides, the first task that reads other partitions is
    named with both sides' partitions; a task empty on either side is no difference."""
    earlier = TaskSource("before.json", table("0_0=a-0", "0_1=a-1", "0_2=a-2"), "app")
    later = TaskSource("the topology", table("0_0=a-0", "0_1=a-2", "0_2=a-1"), "app")
    assert other_partitions_warning(earlier, later) == (
        "warning: 2 tasks read other partitions in the topology than in before.json: a "
        "topology change (0_1: a[1] in before.json; a[2] in the topology); tasks are matched "
        "by id"
    )
    empty = attrs.evolve(later, tasks={t: frozenset() for t in later.tasks})
    assert other_partitions_warning(earlier, empty) is None
    assert other_partitions_warning(earlier, earlier) is None


@attrs.frozen
class Member:
    """A described member as ``match_views`` reads it (``aiokafka.describe.MemberView``)."""

    topics: tuple[str, ...]
    assigned: bool = True


@attrs.frozen
class View:
    """One view of a described group as ``match_views`` reads it (``GroupView``): its
    processes' actives by id."""

    family: str
    members: tuple[Member, ...]
    tasks: TaskTable
    actives: Mapping[str, str]
    protocol: str = "range"

    def processes(self) -> dict[str, ClientView]:
        return {
            pid: ClientView(1, ClientAssignment({TaskId.parse(t) for t in ids.split()}))
            for pid, ids in self.actives.items()
        }

    def process_members(self) -> ProcessMembers:
        return {pid: frozenset([(pid, "")]) for pid in self.actives}


def test_match_views_matches_only_consumer_groups_by_partition() -> None:
    """The first view has nothing before it; a streams group, or a consumer group whose
    processes name a task its table lacks, is matched by id (no partition names, no note);
    a consumer group whose topics shift is renumbered and noted."""
    orders = table("0_0=orders-0", "0_1=orders-1")
    grown = table("0_0=a-0", "1_0=orders-0", "1_1=orders-1")
    last = View(CONSUMER_FAMILY, (Member(("orders",)),), orders, {"p": "0_0 0_1"})
    now = View(CONSUMER_FAMILY, (Member(("a", "orders")),), grown, {"p": "0_0 1_0 1_1"})
    first = match_views(None, now)
    assert (first.before, first.names, first.note) == (None, None, None)
    for by_id in (
        attrs.evolve(last, family="streams"),
        attrs.evolve(last, actives={"p": "0_0 0_1 3_0"}),
    ):
        matched = match_views(by_id, now)
        assert (matched.before, matched.names, matched.note) == (by_id.processes(), None, None)
    matched = match_views(last, now)
    assert matched.before == {"p": ClientView(1, ClientAssignment({TaskId(1, 0), TaskId(1, 1)}))}
    assert matched.names is not None and matched.names.label(TaskId(1, 1)) == "orders-1"
    assert matched.note is not None and matched.note.endswith("(added topic a)")
    assert match_views(now, now).note is None  # nothing renumbered: nothing to say


def test_match_views_counts_the_undecodable_members_of_each_side() -> None:
    """A topic only the other side shows may be read by undecodable members,
    whose topics are unknown: not called added or removed outright."""
    both = table("0_0=a-x-0", "1_0=orders-0")
    orders = table("0_0=orders-0")
    readable = (Member(("a-x", "orders")),)
    unreadable = (Member(("orders",)), Member((), assigned=False), Member((), assigned=False))
    last = View(CONSUMER_FAMILY, readable, both, {"p": "0_0 1_0"})
    now = View(CONSUMER_FAMILY, unreadable, orders, {"p": "0_0"})
    assert str(match_views(last, now).note).endswith(
        "(topic a-x removed or hidden by 2 undecodable members); a removed or hidden topic "
        "numbered past every id there: a-x as 1_p"
    )
    assert str(match_views(now, last).note).endswith(
        "(topic a-x added or no longer hidden by 2 undecodable members)"
    )


def test_match_views_hedges_on_no_undecodable_member_whose_topics_are_known() -> None:
    """A member whose assignment's user data alone is unreadable (a streamassign
    assignor's) still shows its topics: it hides none, so a topic gone is removed."""
    both = table("0_0=a-x-0", "1_0=orders-0")
    orders = table("0_0=orders-0", "0_2=orders-2")
    known = (Member(("orders",)), Member(("orders",), assigned=False))
    last = View(CONSUMER_FAMILY, (Member(("a-x", "orders")),), both, {"p": "0_0 1_0"})
    now = View(CONSUMER_FAMILY, known, orders, {"p": "0_0"})
    assert str(match_views(last, now).note).endswith(
        "(removed topic a-x); a removed topic numbered past every id there: a-x as 1_p"
    )


def test_match_views_names_the_subscribed_topics_without_partitions_that_shift_numbers() -> None:
    """A topic subscribed with no partition in one view only renumbers the topics
    after it, also beside a change of the tables' topics; one subscribed so in both views
    (a lasting typo), or sorting after every topic of both tables, renumbers nothing."""
    orders = table("0_0=orders-0")
    last = View(CONSUMER_FAMILY, (Member(("0-a", "orders")),), table("1_0=orders-0"), {})
    typo = View(
        CONSUMER_FAMILY, (Member(("0-a", "0-b", "orders", "z")),), table("2_0=orders-0"), {}
    )
    assert str(match_views(last, typo).note).endswith(
        "renumbered by a subscribed topic with no partition assigned (0-b)"
    )
    first = View(CONSUMER_FAMILY, (Member(("orders",)),), orders, {"p": "0_0"})
    mixed = View(
        CONSUMER_FAMILY,
        (Member(("0-missing", "orders", "z-missing", "z-new")),),
        table("1_0=orders-0", "3_0=z-new-0"),
        {"p": "1_0 3_0"},
    )
    assert str(match_views(first, mixed).note).endswith(
        "renumbered by a change of topics (added topic z-new) and a subscribed topic with no "
        "partition assigned (0-missing)"
    )
    # Created since, 0-new is numbered in both views: an added topic, not also
    # one subscribed with no partition.
    pending = View(
        CONSUMER_FAMILY,
        (Member(("0-new", "b-old", "orders")),),
        table("1_0=b-old-0", "2_0=orders-0"),
        {"p": "1_0 2_0"},
    )
    created = View(
        CONSUMER_FAMILY,
        (Member(("0-new", "orders")),),
        table("0_0=0-new-0", "1_0=orders-0"),
        {"p": "0_0 1_0"},
    )
    assert str(match_views(pending, created).note).endswith(
        "renumbered by a change of topics (added topic 0-new; removed topic b-old); a removed "
        "topic numbered past every id there: b-old as 2_p"
    )


def test_match_views_names_no_subscribed_topic_when_no_number_it_precedes_changed() -> None:
    """A subscribed topic with no partition that takes a gone topic's slot
    leaves every topic of both views its number; the note is for the gone topic's ids alone.
    One sorting only before topics whose number its shift and another's cancelled is not
    named either, though one before a renumbered topic is."""
    gone = View(
        CONSUMER_FAMILY,
        (Member(("a-new", "orders")),),
        table("0_0=a-new-0", "1_0=orders-0"),
        {"p": "0_0 1_0"},
    )
    pending = View(
        CONSUMER_FAMILY, (Member(("a-pending", "orders")),), table("1_0=orders-0"), {"p": "1_0"}
    )
    assert str(match_views(gone, pending).note).endswith(
        "renumbered by a change of topics (removed topic a-new); a removed topic numbered past "
        "every id there: a-new as 2_p"
    )
    # a (0) gone: b 1 -> 0; c subscribed with no partition: z stays 2 and c shifted nothing.
    last = View(
        CONSUMER_FAMILY,
        (Member(("a", "b", "z")),),
        table("0_0=a-0", "1_0=b-0", "2_0=z-0"),
        {"p": "0_0 1_0 2_0"},
    )
    now = View(CONSUMER_FAMILY, (Member(("b", "c", "z")),), table("0_0=b-0", "2_0=z-0"), {})
    assert str(match_views(last, now).note).endswith(
        "(removed topic a); a removed topic numbered past every id there: a as 3_p"
    )
    # With d as well, z 2 -> 3: both c and d moved it.
    later = View(CONSUMER_FAMILY, (Member(("b", "c", "d", "z")),), table("0_0=b-0", "3_0=z-0"), {})
    assert str(match_views(last, later).note).endswith(
        "(removed topic a) and subscribed topics with no partition assigned (c, d); a removed "
        "topic numbered past every id there: a as 4_p"
    )


def _described(topics: list[str], owned: dict[str, list[str]], *rows: dict[str, Any]) -> Snapshot:
    """A ``describe --json`` file of a consumer group as :func:`load_snapshot` reads it:
    ``owned`` per member (its process) the partitions ``topic-p`` it reads, numbered as
    ``describe`` numbers them over ``topics``; ``rows``: further member rows (undecodable)."""
    number = {topic: t for t, topic in enumerate(sorted(topics))}
    task = {
        name: f"{number[name.rpartition('-')[0]]}_{name.rpartition('-')[2]}"
        for ps in owned.values()
        for name in ps
    }
    members = [
        {"member_id": m, "process": m, "topics": sorted({p.rpartition("-")[0] for p in ps})}
        for m, ps in owned.items()
    ]
    return load_snapshot(
        {
            "state": "Stable",
            "family": CONSUMER_FAMILY,
            "tasks": {task[n]: [[n.rpartition("-")[0], int(n.rpartition("-")[2])]] for n in task},
            "assignment": {
                m: {"capacity": 1, "active": [task[n] for n in ps]} for m, ps in owned.items()
            },
            "members": [*members, *rows],
        },
        "file",
    )


def test_files_say_the_subscription_their_member_rows_show() -> None:
    """What ``describe --watch`` already said, for files: ``explain`` of two ``describe
    --json`` files read no member subscriptions, so a topic whose only reader became
    undecodable read "removed topic", and a subscribed topic with no partition went unnamed.
    The files' member rows say both; files without them keep the files' wording."""
    both = _described(["a-x", "orders"], {"m1": ["orders-0"], "m2": ["a-x-0"]})
    garbage = {"member_id": "m2", "process": None, "topics": [], "undecodable": "bad bytes"}
    hidden = _described(["orders"], {"m1": ["orders-0"]}, garbage)
    note = compare_snapshots(both, hidden, "b.json", "a.json").lines[0]
    assert note.endswith(
        "(topic a-x removed or hidden by 1 undecodable member); a removed or hidden topic "
        "numbered past every id there: a-x as 1_p"
    )
    plain = _described(["orders"], {"m1": ["orders-0"]})
    typo_row = {"member_id": "m3", "process": "m3", "topics": ["0-typo", "orders"]}
    typo = _described(["0-typo", "orders"], {"m1": ["orders-0"]}, typo_row)
    note = compare_snapshots(plain, typo, "b.json", "a.json").lines[0]
    assert note.endswith("renumbered by a subscribed topic with no partition assigned (0-typo)")
    # A row whose user data alone is unreadable still says its topics: it hides
    # none, so a-x is removed; a typo in both files' rows renumbers nothing and is not named.
    read = {"member_id": "m2", "process": None, "topics": ["orders"], "undecodable": "bad"}
    known = _described(["orders"], {"m1": ["orders-0"]}, read)
    note = compare_snapshots(both, known, "b.json", "a.json").lines[0]
    assert note.endswith(
        "(removed topic a-x); a removed topic numbered past every id there: a-x as 1_p"
    )
    lasting = {"member_id": "m3", "process": "m3", "topics": ["0-a", "orders"]}
    lasting_typo = _described(["0-a", "orders"], {"m1": ["orders-0"]}, lasting)
    both_typos = {"member_id": "m3", "process": "m3", "topics": ["0-a", "0-typo", "orders"]}
    typos = _described(["0-a", "0-typo", "orders"], {"m1": ["orders-0"]}, both_typos)
    note = compare_snapshots(lasting_typo, typos, "b.json", "a.json").lines[0]
    assert note.endswith("renumbered by a subscribed topic with no partition assigned (0-typo)")
    unknown = attrs.evolve(plain, subscribed_topics=None)  # a file without member rows
    note = compare_snapshots(unknown, typo, "b.json", "a.json").lines[0]
    assert note.endswith("a subscribed topic with no partition assigned (or an edited file)")


def test_files_name_a_subscribed_topic_with_no_partition_only_where_it_renumbered() -> None:
    """The cases of the ``match_views`` tests above (a topic added, a topic taking a gone one's
    slot), for files: a topic created since BEFORE saved it with no partition is
    numbered in both files (an added topic, not also one with no partition); one taking a
    gone topic's slot leaves every topic of both files its number, so is not named."""
    pending_row = {"member_id": "m3", "process": "m3", "topics": ["0-new", "b-old", "orders"]}
    pending = _described(["0-new", "b-old", "orders"], {"m1": ["b-old-0", "orders-0"]}, pending_row)
    created = _described(["0-new", "orders"], {"m1": ["0-new-0", "orders-0"]})
    note = compare_snapshots(pending, created, "b.json", "a.json").lines[0]
    assert note.endswith(
        "renumbered by a change of topics (added topic 0-new; removed topic b-old); a removed "
        "topic numbered past every id there: b-old as 2_p"
    )
    gone = _described(["a-new", "orders"], {"m1": ["orders-0"], "m2": ["a-new-0"]})
    slot_row = {"member_id": "m3", "process": "m3", "topics": ["a-pending", "orders"]}
    slot_taken = _described(["a-pending", "orders"], {"m1": ["orders-0"]}, slot_row)
    note = compare_snapshots(gone, slot_taken, "b.json", "a.json").lines[0]
    assert note.endswith(
        "renumbered by a change of topics (removed topic a-new); a removed topic numbered past "
        "every id there: a-new as 2_p"
    )


@attrs.frozen
class SavedView:
    """A saved ``describe --json`` file as ``match_views`` reads a live view of the group."""

    saved: Snapshot

    @property
    def family(self) -> str:
        return str(self.saved.family)

    @property
    def protocol(self) -> str:
        return str(self.saved.protocol)

    @property
    def members(self) -> tuple[Member, ...]:
        return ()

    @property
    def tasks(self) -> TaskTable:
        return self.saved.tasks

    def processes(self) -> Mapping[str, ClientView]:
        return self.saved.views

    def process_members(self) -> ProcessMembers:
        return self.saved.process_members


def test_match_views_across_an_assignor_switch_matches_by_partition_and_endpoint() -> None:
    """``describe --watch`` across the rolling switch from Faust's own assignor to the
    drop-in: each worker's tasks under their new ids and its new key, and a note."""
    data = Path(__file__).parent / "data"
    mixed, after = (
        SavedView(load_snapshot(json.loads((data / f"faust_switch_{n}.json").read_text()), n))
        for n in ("mixed", "after")
    )
    matched = match_views(mixed, after)
    assert matched.note is not None and matched.note.startswith(
        "note: the assignor protocol changed from faust to streamassign-faust"
    )
    leader = TaskId(1, 0)  # the leader topic's partition: the one task that moved
    assert matched.before is not None and matched.before.keys() == after.processes().keys()
    for pid, view in after.processes().items():
        was = matched.before[pid].assignment
        assert was.active - {leader} == view.assignment.active - {leader}, pid
        assert was.standby - {leader} == view.assignment.standby, pid
