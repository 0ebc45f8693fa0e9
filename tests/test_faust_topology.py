"""Faust-style topologies (``streamassign.faust.topology``): groups by partition count and
subscribers, stable ids, stores, and the deprecated path in ``streamassign.grouper``."""

from __future__ import annotations

import hashlib
import logging
import random
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamassign import TaskId, TopicPartition
from streamassign.errors import TopologyError
from streamassign.faust.topology import FAUST_HASHED_ID_BASE, faust_style_topology
from streamassign.grouper import InvalidPartitionCountsError, changelog_partitions, group_partitions
from streamassign.topology import Subtopology, Topology, load_topology_file

TOPOLOGY_DIR = Path(__file__).resolve().parent.parent / "topology"


def tp(topic: str, *partitions: int) -> set[TopicPartition]:
    return {TopicPartition(topic, p) for p in partitions}


def test_faust_tables_file_groups_and_equals_the_faust_style_derivation() -> None:
    topology, partitions = load_topology_file(TOPOLOGY_DIR / "faust-tables.toml")
    tasks = group_partitions(topology, partitions)
    assert list(tasks) == [TaskId(1, 0)] + [TaskId(4, p) for p in range(4)] + [
        TaskId(8, p) for p in range(8)
    ]
    assert tasks[TaskId(8, 3)] == tp("transactions", 3) | tp("account-events", 3)
    changelog_names = [f"fraud-detector-{t}-changelog" for t in ("account-balances", "card-usage")]
    everything = [*partitions, *changelog_names, "fraud-detector-merchant-risk-changelog"]
    derived = faust_style_topology(
        {"worker-1": everything, "worker-2": list(reversed(everything))},
        partitions,
        name="fraud-detector",
        stores={
            "account-balances": "transactions",
            "card-usage": "account-events",
            "merchant-risk": "merchant-reports",
        },
    )
    # Same tasks, stores and groups; only the declared output sink (not derivable) differs.
    assert group_partitions(derived, partitions) == tasks
    assert changelog_partitions(derived, partitions) == changelog_partitions(topology, partitions)
    assert derived.copartition_groups == topology.copartition_groups
    assert [(s.id, s.stores) for s in derived.subtopologies] == [
        (s.id, s.stores) for s in topology.subtopologies
    ]


def test_faust_style_groups_by_count_and_subscribers() -> None:
    topology = faust_style_topology(
        {"w1": ["a", "b", "c", "d"], "w2": ["a", "b", "c", "d"]},
        {"a": 8, "b": 8, "c": 4, "d": 1},
    )
    assert topology == Topology(
        [Subtopology(8, ["a", "b"]), Subtopology(4, ["c"]), Subtopology(1, ["d"])],
        copartition_groups=[["a", "b"]],
    )


def test_faust_style_same_count_different_subscribers_are_separate_subtopologies() -> None:
    topology = faust_style_topology(
        {"old": ["a", "b"], "new": ["a", "b", "x"]},
        {"a": 8, "b": 8, "x": 8},
    )
    ids = {t: topology.subtopology_of(t) for t in ("a", "b", "x")}
    assert ids["a"] == ids["b"] == 8  # the larger group keeps the plain id
    assert ids["x"] >= FAUST_HASHED_ID_BASE
    assert topology.copartition_groups == (("a", "b"),)
    # The hashed id depends on the count and the group's topics only.
    other = faust_style_topology({"m1": ["x"], "m2": ["q"], "m3": ["q"]}, {"x": 8, "q": 8, "z": 3})
    assert other.subtopology_of("x") == ids["x"]


def test_faust_style_tie_between_groups_goes_to_the_smallest_topic() -> None:
    topology = faust_style_topology({"m1": ["b"], "m2": ["a"]}, {"a": 2, "b": 2})
    assert topology.subtopology_of("a") == 2
    assert topology.subtopology_of("b") >= FAUST_HASHED_ID_BASE


def hashed_id(count: int, topics: list[str]) -> int:
    """The documented rule, restated: ids must not change between library versions."""
    text = f"{count}:{','.join(sorted(topics))}".encode()
    digest = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")
    return FAUST_HASHED_ID_BASE + digest % (2**31 - FAUST_HASHED_ID_BASE)


def test_faust_style_hashed_ids_follow_the_documented_formula() -> None:
    topology = faust_style_topology(
        {"m1": ["big1", "big2", "big3"], "m2": ["y", "x"], "m3": ["z"]},
        {"big1": 5, "big2": 5, "big3": 5, "x": 5, "y": 5, "z": 5},
    )
    assert topology.subtopology_of("big1") == 5
    assert topology.subtopology_of("x") == hashed_id(5, ["x", "y"]) == 1_263_661_295
    assert topology.subtopology_of("z") == hashed_id(5, ["z"])


def test_faust_style_leaves_out_topics_without_count_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="streamassign.faust.topology"):
        topology = faust_style_topology(
            {"w": ["a", "ghost", "phantom"]}, {"a": 3}, name="app", stores={"t": "phantom"}
        )
    assert topology.source_topics == {"a"}
    assert topology.stores == frozenset()
    messages = [r.getMessage() for r in caplog.records if r.name == "streamassign.faust.topology"]
    assert any("ghost, phantom" in m for m in messages)
    assert any("store 't'" in m for m in messages)


def test_faust_style_stores_join_their_topic_and_changelogs_are_not_sources() -> None:
    topology = faust_style_topology(
        {"w": ["orders", "app-totals-changelog"]},
        {"orders": 6, "app-totals-changelog": 6},
        name="app",
        stores={"totals": "orders"},
    )
    assert topology.subtopologies == (Subtopology(6, ["orders"], ["totals"]),)
    assert changelog_partitions(topology, {"orders": 6})[TaskId(6, 2)] == tp(
        "app-totals-changelog", 2
    )


def test_faust_style_rejects_bad_input() -> None:
    with pytest.raises(TopologyError, match="no member subscribes"):
        faust_style_topology({"w": ["a"]}, {"a": 1}, name="app", stores={"s": "nope"})
    with pytest.raises(TopologyError, match="need the application name"):
        faust_style_topology({"w": ["a"]}, {"a": 1}, stores={"s": "a"})
    with pytest.raises(InvalidPartitionCountsError, match="a:0"):
        faust_style_topology({"w": ["a"]}, {"a": 0})
    with pytest.raises(TopologyError, match=f"collide with hashed subtopology ids: a:{2**20}"):
        faust_style_topology({"w": ["a"]}, {"a": FAUST_HASHED_ID_BASE})
    with pytest.raises(TypeError, match="must be a list of topics"):
        faust_style_topology({"w": "a"}, {"a": 1})


TOPICS = [f"t{i}" for i in range(10)]


@st.composite
def faust_inputs(draw: st.DrawFn) -> tuple[dict[str, list[str]], dict[str, int]]:
    counts = {t: draw(st.integers(1, 4)) for t in TOPICS}
    members = draw(st.integers(1, 5))
    subscriptions = {
        f"m{i}": draw(st.lists(st.sampled_from(TOPICS), min_size=1, unique=True))
        for i in range(members)
    }
    return subscriptions, counts


def topic_ids(topology: Topology) -> dict[str, int]:
    return {t: topology.subtopology_of(t) for t in topology.source_topics}


@given(faust_inputs())
def test_faust_style_subtopologies_are_count_and_subscriber_classes(
    inputs: tuple[dict[str, list[str]], dict[str, int]],
) -> None:
    subscriptions, counts = inputs
    topology = faust_style_topology(subscriptions, counts)
    subscribed = {t for topics in subscriptions.values() for t in topics}
    assert topology.source_topics == subscribed

    def key(t: str) -> tuple[int, frozenset[str]]:
        return counts[t], frozenset(m for m, topics in subscriptions.items() if t in topics)

    ids = topic_ids(topology)
    for a in subscribed:
        for b in subscribed:
            assert (ids[a] == ids[b]) == (key(a) == key(b))
    plain = Counter(sid for sid in set(ids.values()) if sid < FAUST_HASHED_ID_BASE)
    assert all(counts[t] == ids[t] for t in subscribed if ids[t] < FAUST_HASHED_ID_BASE)
    assert set(plain.values()) <= {1}
    assert set(plain) == {counts[t] for t in subscribed}  # every count keeps one plain group
    tasks = group_partitions(topology, counts)
    assert set(tasks) == {TaskId(ids[t], p) for t in subscribed for p in range(counts[t])}


@given(faust_inputs(), st.integers(5, 9), st.data())
def test_faust_style_ids_are_stable_when_a_new_partition_count_appears(
    inputs: tuple[dict[str, list[str]], dict[str, int]], new_count: int, data: st.DataObject
) -> None:
    subscriptions, counts = inputs
    before = topic_ids(faust_style_topology(subscriptions, counts))
    readers = data.draw(st.sets(st.sampled_from(sorted(subscriptions)), min_size=1))
    grown = {m: [*topics, "new"] if m in readers else topics for m, topics in subscriptions.items()}
    after = topic_ids(faust_style_topology(grown, {**counts, "new": new_count}))
    assert after.pop("new") == new_count
    assert after == before


@given(faust_inputs(), st.data())
def test_faust_style_ids_ignore_a_member_with_an_existing_subscription(
    inputs: tuple[dict[str, list[str]], dict[str, int]], data: st.DataObject
) -> None:
    subscriptions, counts = inputs
    copied = data.draw(st.sampled_from(sorted(subscriptions)))
    joined = {**subscriptions, "zz-newcomer": list(reversed(subscriptions[copied]))}
    assert faust_style_topology(joined, counts) == faust_style_topology(subscriptions, counts)


@given(faust_inputs(), st.randoms(use_true_random=False))
def test_faust_style_does_not_depend_on_input_order(
    inputs: tuple[dict[str, list[str]], dict[str, int]], rng: random.Random
) -> None:
    subscriptions, counts = inputs
    shuffled = {
        m: rng.sample(topics, len(topics))
        for m, topics in rng.sample(sorted(subscriptions.items()), len(subscriptions))
    }
    shuffled_counts = dict(rng.sample(sorted(counts.items()), len(counts)))
    assert faust_style_topology(shuffled, shuffled_counts) == faust_style_topology(
        subscriptions, counts
    )


def test_old_grouper_path_still_works_with_a_deprecation_warning() -> None:
    import streamassign.grouper as grouper

    with pytest.warns(DeprecationWarning, match="streamassign.faust.topology"):
        assert grouper.faust_style_topology is faust_style_topology
    with pytest.warns(DeprecationWarning):
        assert grouper.FAUST_HASHED_ID_BASE == FAUST_HASHED_ID_BASE
    with pytest.raises(AttributeError):
        grouper.no_such_name  # noqa: B018
