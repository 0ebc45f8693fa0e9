"""The partition grouper: tasks, repartition resolution, co-partitioning and Faust-style mode."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamassign._ids import TaskId, TopicPartition
from streamassign.errors import CopartitioningError, MissingTopicsError, TopologyError
from streamassign.grouper import (
    InvalidPartitionCountsError,
    PartitionGrouper,
    RepartitionResolutionError,
    changelog_partitions,
    group_partitions,
    resolve_partition_counts,
    task_counts,
)
from streamassign.topology import Subtopology, Topology, load_topology_file

TOPOLOGY_DIR = Path(__file__).resolve().parent.parent / "topology"


def tp(topic: str, *partitions: int) -> set[TopicPartition]:
    return {TopicPartition(topic, p) for p in partitions}


def chain_topology(length: int, fixed: Mapping[str, int] | None = None) -> Topology:
    """in -> [0] -> r0 -> [1] -> r1 -> ... -> r{length-1} -> [length]."""
    subs = [Subtopology(0, ["in"], sink_topics=["r0"])]
    subs += [Subtopology(i, [f"r{i - 1}"], sink_topics=[f"r{i}"]) for i in range(1, length)]
    subs.append(Subtopology(length, [f"r{length - 1}"]))
    repartition: dict[str, int | None] = {f"r{i}": None for i in range(length)}
    repartition.update(fixed or {})
    return Topology(subs, repartition_topics=repartition)


# -- tasks -----------------------------------------------------------------------------------------


def test_exact_tasks_of_a_small_topology_with_uneven_counts() -> None:
    topology = Topology([Subtopology(0, ["a", "b", "c"]), Subtopology(1, ["d"])])
    tasks = PartitionGrouper().group(topology, {"a": 2, "b": 5, "c": 3, "d": 1, "unused": 9})
    assert list(tasks) == [TaskId(0, p) for p in range(5)] + [TaskId(1, 0)]
    assert tasks == {
        TaskId(0, 0): tp("a", 0) | tp("b", 0) | tp("c", 0),
        TaskId(0, 1): tp("a", 1) | tp("b", 1) | tp("c", 1),
        TaskId(0, 2): tp("b", 2) | tp("c", 2),
        TaskId(0, 3): tp("b", 3),
        TaskId(0, 4): tp("b", 4),
        TaskId(1, 0): tp("d", 0),
    }
    assert all(isinstance(v, frozenset) for v in tasks.values())
    assert task_counts(topology, {"a": 2, "b": 5, "c": 3, "d": 1}) == {0: 5, 1: 1}


def test_orders_join_groups_with_its_default_counts() -> None:
    topology, partitions = load_topology_file(TOPOLOGY_DIR / "orders-join.toml")
    tasks = group_partitions(topology, partitions)
    assert list(tasks) == [TaskId(0, p) for p in range(12)] + [TaskId(1, p) for p in range(4)]
    assert tasks[TaskId(0, 7)] == tp("orders", 7) | tp("customers", 7)
    assert tasks[TaskId(1, 3)] == tp("returns", 3)
    changelogs = changelog_partitions(topology, partitions)
    assert list(changelogs) == [TaskId(0, p) for p in range(12)]  # subtopology 1 is stateless
    assert changelogs[TaskId(0, 5)] == tp("orders-enricher-customers-table-changelog", 5)


def test_clickstream_chain_resolves_with_its_default_counts() -> None:
    topology, partitions = load_topology_file(TOPOLOGY_DIR / "clickstream-repartition.toml")
    assert resolve_partition_counts(topology, partitions) == {
        "clicks": 24,
        "clickstream-clicks-by-region-repartition": 6,
        "clickstream-clicks-by-user-repartition": 16,  # forced by user-profiles, not 24
        "clickstream-user-sessions-repartition": 16,  # the forced count flows down the chain
        "user-profiles": 16,
    }
    assert task_counts(topology, partitions) == {0: 24, 1: 16, 2: 6, 3: 16}
    tasks = group_partitions(topology, partitions)
    assert tasks[TaskId(1, 15)] == tp("clickstream-clicks-by-user-repartition", 15) | tp(
        "user-profiles", 15
    )
    changelogs = changelog_partitions(topology, partitions)
    assert changelogs[TaskId(1, 2)] == tp("clickstream-clicks-per-user-changelog", 2) | tp(
        "clickstream-user-profiles-table-changelog", 2
    )
    assert {t.subtopology for t in changelogs} == {1, 2, 3}


def test_changelog_partitions_need_a_named_topology() -> None:
    topology = Topology([Subtopology(0, ["a"], ["s"])])
    with pytest.raises(TopologyError, match="no name"):
        changelog_partitions(topology, {"a": 2})


def test_the_grouper_is_exported_at_the_top_level() -> None:
    import streamassign

    assert streamassign.PartitionGrouper is PartitionGrouper
    assert streamassign.Topology is Topology


def test_grouper_methods_agree_with_the_functions() -> None:
    topology, partitions = load_topology_file(TOPOLOGY_DIR / "clickstream-repartition.toml")
    grouper = PartitionGrouper()
    assert grouper.group(topology, partitions) == group_partitions(topology, partitions)
    assert grouper.resolve_partition_counts(topology, partitions) == resolve_partition_counts(
        topology, partitions
    )
    assert grouper.changelog_partitions(topology, partitions) == changelog_partitions(
        topology, partitions
    )


# -- input counts ----------------------------------------------------------------------------------


def test_missing_topics_are_all_named_sorted() -> None:
    topology = Topology(
        [Subtopology(0, ["zeta", "alpha"]), Subtopology(1, ["mid", "r"])],
        copartition_groups=[["zeta", "alpha"]],
        repartition_topics={"r": 3},
    )
    with pytest.raises(MissingTopicsError) as info:
        group_partitions(topology, {"alpha": 2})
    assert info.value.topics == ("mid", "zeta")
    assert "mid, zeta" in str(info.value)


@pytest.mark.parametrize("bad", [0, -2, True, "3", 2.0, None])
def test_non_positive_or_non_integer_counts_are_rejected(bad: Any) -> None:
    topology = Topology([Subtopology(0, ["a", "b"])])
    with pytest.raises(InvalidPartitionCountsError, match="integers >= 1") as info:
        group_partitions(topology, {"a": bad, "b": -1})
    assert info.value.counts == {"a": bad, "b": -1}
    assert isinstance(info.value, TopologyError)


def test_counts_given_for_repartition_topics_are_ignored() -> None:
    topology = chain_topology(2, fixed={"r1": 5})
    counts = resolve_partition_counts(topology, {"in": 3, "r0": 99, "r1": 99})
    assert counts == {"in": 3, "r0": 3, "r1": 5}


# -- repartition resolution ------------------------------------------------------------------------


def test_computed_counts_follow_a_chain_and_take_the_max_of_all_writer_sources() -> None:
    topology = Topology(
        [
            Subtopology(0, ["in"], sink_topics=["r1"]),
            Subtopology(1, ["r1", "side"], sink_topics=["r2", "out"]),
            Subtopology(2, ["other"], sink_topics=["r2"]),
            Subtopology(3, ["r2"], sink_topics=["r3"]),
            Subtopology(4, ["r3"]),
        ],
        repartition_topics={"r1": None, "r2": None, "r3": None},
    )
    counts = resolve_partition_counts(topology, {"in": 3, "side": 5, "other": 2})
    assert counts == {"in": 3, "side": 5, "other": 2, "r1": 3, "r2": 5, "r3": 5}
    assert list(counts) == sorted(counts)
    assert task_counts(topology, {"in": 3, "side": 5, "other": 2}) == {
        0: 3,
        1: 5,
        2: 2,
        3: 5,
        4: 5,
    }


def test_a_fixed_count_in_the_middle_of_a_chain_resets_it() -> None:
    topology = chain_topology(4, fixed={"r1": 7})
    assert resolve_partition_counts(topology, {"in": 3}) == {
        "in": 3,
        "r0": 3,
        "r1": 7,
        "r2": 7,
        "r3": 7,
    }


def test_a_fixed_repartition_topic_needs_no_writer() -> None:
    topology = Topology([Subtopology(0, ["r"])], repartition_topics={"r": 4})
    assert task_counts(topology, {}) == {0: 4}


def test_copartition_group_forces_external_count_onto_computed_topic_and_downstream() -> None:
    topology = Topology(
        [
            Subtopology(0, ["clicks"], sink_topics=["by-user"]),
            Subtopology(1, ["by-user", "profiles"], sink_topics=["next"]),
            Subtopology(2, ["next"]),
        ],
        copartition_groups=[["by-user", "profiles"]],
        repartition_topics={"by-user": None, "next": None},
    )
    counts = resolve_partition_counts(topology, {"clicks": 24, "profiles": 16})
    assert counts["by-user"] == 16
    assert counts["next"] == 16


def test_group_without_external_topics_takes_the_fixed_count() -> None:
    topology = Topology(
        [
            Subtopology(0, ["in"], sink_topics=["a", "b"]),
            Subtopology(1, ["a", "b", "c"]),
        ],
        copartition_groups=[["a", "b", "c"]],
        repartition_topics={"a": None, "b": 6, "c": 6},
    )
    assert resolve_partition_counts(topology, {"in": 2})["a"] == 6


def test_group_of_computed_topics_takes_the_max_of_their_counts() -> None:
    topology = Topology(
        [
            Subtopology(0, ["small"], sink_topics=["a"]),
            Subtopology(1, ["big"], sink_topics=["b"]),
            Subtopology(2, ["a", "b", "c"]),  # c has no writer: it takes the group's count
        ],
        copartition_groups=[["a", "b", "c"]],
        repartition_topics={"a": None, "b": None, "c": None},
    )
    counts = resolve_partition_counts(topology, {"small": 2, "big": 9})
    assert (counts["a"], counts["b"], counts["c"]) == (9, 9, 9)


# -- co-partitioning errors ------------------------------------------------------------------------


def test_external_topics_with_different_counts_name_every_topic_of_the_group() -> None:
    topology = Topology(
        [Subtopology(0, ["src"], sink_topics=["rep"]), Subtopology(1, ["a", "b", "c", "rep"])],
        copartition_groups=[["a", "b", "c", "rep"]],
        repartition_topics={"rep": None},
    )
    with pytest.raises(CopartitioningError) as info:
        group_partitions(topology, {"a": 4, "b": 4, "c": 6, "src": 5})
    error = info.value
    assert error.counts == {"a": 4, "b": 4, "c": 6, "rep": 5}  # rep: what it would have alone
    message = str(error)
    for fragment in ("a:4", "b:4", "c:6", "rep:5", "external topics have different"):
        assert fragment in message


def test_fixed_repartition_count_must_equal_the_external_count() -> None:
    topology = Topology(
        [Subtopology(0, ["orders", "by-customer"])],
        copartition_groups=[["orders", "by-customer"]],
        repartition_topics={"by-customer": 8},
    )
    with pytest.raises(CopartitioningError, match=r"external topics' count 6\): by-customer:8, "):
        group_partitions(topology, {"orders": 6})
    assert task_counts(topology, {"orders": 8}) == {0: 8}


def test_fixed_repartition_counts_must_agree_without_external_topics() -> None:
    topology = Topology(
        [Subtopology(0, ["x", "y", "z"])],
        copartition_groups=[["x", "y", "z"]],
        repartition_topics={"x": 2, "y": 3, "z": None},
    )
    with pytest.raises(CopartitioningError, match="fixed repartition topics have different") as e:
        group_partitions(topology, {})
    assert e.value.counts == {"x": 2, "y": 3}
    assert "computed count unknown for z" in str(e.value)


# -- cycles and writerless topics ------------------------------------------------------------------


def test_a_cycle_of_computed_topics_is_named_in_data_flow_order() -> None:
    topology = Topology(
        [
            Subtopology(0, ["a", "in"], sink_topics=["b"]),
            Subtopology(1, ["b"], sink_topics=["a"]),
        ],
        repartition_topics={"a": None, "b": None},
    )
    with pytest.raises(RepartitionResolutionError, match="form a cycle: a -> b -> a") as info:
        group_partitions(topology, {"in": 3})
    assert info.value.chain == ("a", "b", "a")
    assert info.value.cycle


def test_a_self_loop_is_a_cycle() -> None:
    topology = Topology(
        [Subtopology(0, ["loop", "in"], sink_topics=["loop"])], repartition_topics={"loop": None}
    )
    with pytest.raises(RepartitionResolutionError, match="loop -> loop"):
        group_partitions(topology, {"in": 1})


@pytest.mark.parametrize(
    ("repartition", "groups", "expected"),
    [
        ({"a": 4, "b": None}, [], {"a": 4, "b": 4}),  # a fixed count breaks the cycle
        ({"a": None, "b": None}, [["a", "side"]], {"a": 2, "b": 3}),  # so does a forced one
    ],
)
def test_a_cycle_through_a_known_count_resolves(
    repartition: dict[str, int | None], groups: list[list[str]], expected: dict[str, int]
) -> None:
    topology = Topology(
        [
            Subtopology(0, ["a", "in", "side"], sink_topics=["b"]),
            Subtopology(1, ["b"], sink_topics=["a"]),
        ],
        copartition_groups=groups,
        repartition_topics=repartition,
    )
    counts = resolve_partition_counts(topology, {"in": 3, "side": 2})
    assert {t: counts[t] for t in expected} == expected


def test_a_cycle_through_a_group_of_computed_topics_is_reported() -> None:
    topology = Topology(
        [Subtopology(0, ["r1", "r2"], sink_topics=["r1"])],
        copartition_groups=[["r1", "r2"]],
        repartition_topics={"r1": None, "r2": None},
    )
    with pytest.raises(RepartitionResolutionError, match=r"co-partition group \(r1, r2\) -> r1"):
        group_partitions(topology, {})


def test_a_computed_topic_without_writer_names_it_and_what_it_blocks() -> None:
    topology = Topology(
        [
            Subtopology(0, ["orphan"], sink_topics=["r1"]),
            Subtopology(1, ["r1"], sink_topics=["r2"]),
            Subtopology(2, ["r2"]),
        ],
        repartition_topics={"orphan": None, "r1": None, "r2": None},
    )
    with pytest.raises(RepartitionResolutionError) as info:
        group_partitions(topology, {})
    assert "repartition topic 'orphan' has no fixed partition count and no writer" in str(
        info.value
    )
    assert "it feeds orphan -> r1 -> r2" in str(info.value)
    assert info.value.chain == ("orphan", "r1", "r2")
    assert not info.value.cycle


def test_a_5000_long_chain_resolves_without_recursion() -> None:
    topology = chain_topology(5000)
    counts = resolve_partition_counts(topology, {"in": 7})
    assert counts["r4999"] == 7
    assert len(group_partitions(topology, {"in": 7})) == 5001 * 7


def test_a_5000_long_cycle_is_reported_without_recursion() -> None:
    n = 5000
    subs = [Subtopology(i, [f"r{i}"], sink_topics=[f"r{(i + 1) % n}"]) for i in range(n)]
    topology = Topology(subs, repartition_topics={f"r{i}": None for i in range(n)})
    with pytest.raises(RepartitionResolutionError) as info:
        resolve_partition_counts(topology, {})
    assert info.value.cycle
    assert len(info.value.chain) == n + 1
    assert info.value.chain[0] == info.value.chain[-1]


def test_grouping_100k_partitions() -> None:
    """100 topics of 1,000 partitions each: 100,000 tasks. Not timed: an absolute bound
    failed on a loaded machine (1.18 s against 1 s; 0.05-0.16 s idle), and a ratio of two
    sizes varied from 14x to 100x for 10x the partitions (the garbage collector at this
    size), too noisy to tell a blow-up. The speed is the benchmarks' to show."""
    subs = [Subtopology(s, [f"t{s}.{i}" for i in range(10)]) for s in range(10)]
    counts = {topic: 1000 for sub in subs for topic in sub.source_topics}
    tasks = group_partitions(Topology(subs), counts)
    assert sum(map(len, tasks.values())) == 100_000


# -- properties ------------------------------------------------------------------------------------


@st.composite
def grouping_inputs(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, int]]:
    """A resolvable topology (repartition DAG, satisfiable groups) and external counts."""
    counts: dict[str, int] = {}
    repartition: dict[str, int | None] = {}
    n_subs = draw(st.integers(1, 5))
    sinks: list[list[str]] = [[f"out{s}"] for s in range(n_subs)]
    sources: list[list[str]] = []
    groups: list[list[str]] = []
    for s in range(n_subs):
        mine: list[str] = []
        for i in range(draw(st.integers(0 if s else 1, 3))):
            counts[f"e{s}.{i}"] = draw(st.integers(1, 8))
            mine.append(f"e{s}.{i}")
        for i in range(draw(st.integers(0 if (mine or not s) else 1, 2 if s else 0))):
            topic = f"r{s}.{i}"
            fixed = draw(st.none() | st.integers(1, 8))
            writers = draw(st.sets(st.integers(0, s - 1), min_size=0 if fixed else 1))
            for w in writers:
                sinks[w].append(topic)
            repartition[topic] = fixed
            mine.append(topic)
        if len(mine) >= 2 and draw(st.booleans()):
            group = draw(st.lists(st.sampled_from(mine), min_size=2, unique=True))
            n = draw(st.integers(1, 8))
            for topic in group:
                if topic not in repartition:
                    counts[topic] = n
                elif repartition[topic] is not None:
                    repartition[topic] = n
            groups.append(group)
        sources.append(mine)
    spec = {"sources": sources, "sinks": sinks, "groups": groups, "repartition": repartition}
    return spec, counts


def build(spec: dict[str, Any], rng: random.Random | None = None) -> Topology:
    def shuffled(items: Any) -> list[Any]:
        out: list[Any] = list(items)
        if rng is not None:
            rng.shuffle(out)
        return out

    subs = [
        Subtopology(s, shuffled(src), (), shuffled(sink))
        for s, (src, sink) in enumerate(zip(spec["sources"], spec["sinks"], strict=True))
    ]
    return Topology(
        shuffled(subs),
        shuffled(shuffled(g) for g in spec["groups"]),
        dict(shuffled(spec["repartition"].items())),
    )


def reference_counts(topology: Topology, external: Mapping[str, int]) -> dict[str, int]:
    """Recursive restatement of the resolution rules (fine for small acyclic topologies)."""
    rep = topology.repartition_topics

    def natural(topic: str) -> int | None:
        found = [
            count(src)
            for w in topology.writers(topic)
            for src in topology.subtopology(w).source_topics
        ]
        return max(found) if found else None

    def count(topic: str) -> int:
        if topic not in rep:
            return external[topic]
        if rep[topic] is not None:
            return rep[topic]  # type: ignore[return-value]
        group = topology.copartition_group_of(topic)
        if group is None:
            n = natural(topic)
            assert n is not None
            return n
        known = [external[t] for t in group if t not in rep]
        known += [rep[t] for t in group if t in rep and rep[t] is not None]  # type: ignore[misc]
        if known:
            return known[0]
        return max(n for t in group if (n := natural(t)) is not None)

    return {t: count(t) for t in topology.source_topics}


@given(grouping_inputs())
def test_resolution_matches_the_rules(inputs: tuple[dict[str, Any], dict[str, int]]) -> None:
    spec, counts = inputs
    topology = build(spec)
    assert resolve_partition_counts(topology, counts) == reference_counts(topology, counts)


@given(grouping_inputs())
def test_every_source_partition_belongs_to_exactly_one_task(
    inputs: tuple[dict[str, Any], dict[str, int]],
) -> None:
    spec, counts = inputs
    topology = build(spec)
    resolved = resolve_partition_counts(topology, counts)
    tasks = group_partitions(topology, counts)
    owners = Counter(part for parts in tasks.values() for part in parts)
    expected = {TopicPartition(t, p) for t, n in resolved.items() for p in range(n)}
    assert set(owners) == expected
    assert set(owners.values()) == {1}
    for task, parts in tasks.items():
        assert all(topology.task_of(part) == task for part in parts)


@given(grouping_inputs())
def test_task_count_is_the_max_source_count_of_each_subtopology(
    inputs: tuple[dict[str, Any], dict[str, int]],
) -> None:
    spec, counts = inputs
    topology = build(spec)
    resolved = resolve_partition_counts(topology, counts)
    tasks = group_partitions(topology, counts)
    for sub in topology.subtopologies:
        n = max(resolved[t] for t in sub.source_topics)
        assert sorted(t for t in tasks if t.subtopology == sub.id) == [
            TaskId(sub.id, p) for p in range(n)
        ]
    assert list(tasks) == sorted(tasks)


@given(grouping_inputs())
def test_copartitioned_topics_have_equal_counts_and_share_tasks(
    inputs: tuple[dict[str, Any], dict[str, int]],
) -> None:
    spec, counts = inputs
    topology = build(spec)
    resolved = resolve_partition_counts(topology, counts)
    tasks = group_partitions(topology, counts)
    for group in topology.copartition_groups:
        assert len({resolved[t] for t in group}) == 1
        for p in range(resolved[group[0]]):
            owning = [task for task, parts in tasks.items() if TopicPartition(group[0], p) in parts]
            assert len(owning) == 1
            assert tp(group[0], p).union(*(tp(t, p) for t in group)) <= tasks[owning[0]]


@given(grouping_inputs(), st.randoms(use_true_random=False))
def test_result_does_not_depend_on_input_order(
    inputs: tuple[dict[str, Any], dict[str, int]], rng: random.Random
) -> None:
    spec, counts = inputs
    shuffled_counts = dict(rng.sample(sorted(counts.items()), len(counts)))
    shuffled_counts["unrelated"] = 3
    a = group_partitions(build(spec), counts)
    b = group_partitions(build(spec, rng), shuffled_counts)
    assert list(a.items()) == list(b.items())
    assert list(resolve_partition_counts(build(spec, rng), shuffled_counts).items()) == list(
        resolve_partition_counts(build(spec), counts).items()
    )
