"""The topology model: normalisation, validation, helpers and the TOML file format."""

from __future__ import annotations

import pickle
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamassign._ids import TaskId, TopicPartition
from streamassign.errors import TopologyError
from streamassign.topology import (
    Subtopology,
    Topology,
    TopologyFile,
    changelog_topic_name,
    load_topology_file,
)

TOPOLOGY_DIR = Path(__file__).resolve().parent.parent / "topology"
SHIPPED = sorted(TOPOLOGY_DIR.glob("*.toml"))


def clickstream() -> Topology:
    return Topology(
        [
            Subtopology(0, ["clicks"], sink_topics=["by-user"]),
            Subtopology(1, ["by-user", "profiles"], ["per-user"], ["by-region", "out"]),
            Subtopology(2, ["by-region"], ["per-region"]),
        ],
        copartition_groups=[["by-user", "profiles"]],
        repartition_topics={"by-user": None, "by-region": 6},
        name="app",
    )


# -- the model -------------------------------------------------------------------------------------


def test_subtopology_normalises_names_to_sorted_unique_tuples() -> None:
    sub = Subtopology(3, ["b", "a", "b"], stores=["s2", "s1"], sink_topics=["z", "y"])
    assert sub.source_topics == ("a", "b")
    assert sub.stores == ("s1", "s2")
    assert sub.sink_topics == ("y", "z")
    assert sub.stateful
    assert not Subtopology(0, ["a"]).stateful


def test_topology_is_hashable_and_independent_of_input_order() -> None:
    a = clickstream()
    b = Topology(
        [
            Subtopology(2, ["by-region"], ["per-region"]),
            Subtopology(1, ["profiles", "by-user"], ["per-user"], ["out", "by-region"]),
            Subtopology(0, ("clicks",), sink_topics={"by-user"}),
        ],
        copartition_groups=({"profiles", "by-user"},),
        repartition_topics={"by-region": 6, "by-user": None},
        name="app",
    )
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1
    assert a != Topology(a.subtopologies, a.copartition_groups, {"by-user": 4, "by-region": 6})


def test_overlapping_copartition_groups_are_merged_and_singletons_dropped() -> None:
    topology = Topology(
        [Subtopology(0, ["a", "b", "c", "d"])],
        copartition_groups=[["b", "a"], ["c", "b"], ["d"]],
    )
    assert topology.copartition_groups == (("a", "b", "c"),)
    assert topology.copartition_group_of("c") == ("a", "b", "c")
    assert topology.copartition_group_of("d") is None
    assert topology == Topology([Subtopology(0, ["a", "b", "c", "d"])], [["a", "b", "c"]])


def test_derived_topic_sets_and_lookups() -> None:
    topology = clickstream()
    assert topology.subtopology_ids == (0, 1, 2)
    assert topology.source_topics == {"clicks", "by-user", "profiles", "by-region"}
    assert topology.external_source_topics == {"clicks", "profiles"}
    assert topology.stateful_subtopologies == {1, 2}
    assert topology.stores == {"per-user", "per-region"}
    assert topology.subtopology(1).stores == ("per-user",)
    assert topology.subtopology_of("profiles") == 1
    assert topology.subtopology_of_store("per-region") == 2
    assert topology.task_of(TopicPartition("by-region", 4)) == TaskId(2, 4)
    assert topology.writers("by-user") == (0,)
    assert topology.writers("by-region") == (1,)
    with pytest.raises(KeyError, match="'out' is not a repartition topic"):
        topology.writers("out")
    with pytest.raises(KeyError, match=r"no subtopology 7 \(known: \[0, 1, 2\]\)"):
        topology.subtopology(7)
    with pytest.raises(KeyError, match="'nope' is not a source topic"):
        topology.task_of(TopicPartition("nope", 0))


def test_changelog_topics_follow_kafka_streams_naming() -> None:
    topology = clickstream()
    assert changelog_topic_name("app", "per-user") == "app-per-user-changelog"
    assert topology.changelog_topic("per-user") == "app-per-user-changelog"
    assert topology.changelog_topics(1) == ("app-per-user-changelog",)
    assert topology.changelog_topics(0) == ()
    with pytest.raises(KeyError, match="'nope' is not a store"):
        topology.changelog_topic("nope")
    nameless = Topology(topology.subtopologies, repartition_topics=topology.repartition_topics)
    with pytest.raises(TopologyError, match=r"no name.*'per-user'"):
        nameless.changelog_topic("per-user")


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: Topology([Subtopology(1, ["a"]), Subtopology(1, ["b"])]),
            "duplicate subtopology ids: 1",
        ),
        (
            lambda: Topology([Subtopology(0, ["a", "x"]), Subtopology(1, ["x", "b"])]),
            r"source of only one subtopology.*'x' in subtopologies 0, 1",
        ),
        (
            lambda: Topology([Subtopology(0, ["a"], ["s"]), Subtopology(1, ["b"], ["s"])]),
            r"a store may belong to only one subtopology: 's' in subtopologies 0, 1",
        ),
        (lambda: Subtopology(0, []), "subtopology 0: source_topics must not be empty"),
        (lambda: Subtopology(-1, ["a"]), "subtopology id must be an int >= 0, got -1"),
        (
            lambda: Subtopology(2**70, ["a"]),
            r"subtopology id must be < 2\*\*31 \(Kafka's int32 range\), got 1180591620717411303424",
        ),
        (lambda: Subtopology(0, ["has space"]), "illegal topic 'has space'"),
        (lambda: Subtopology(0, ["a"], [".."]), "illegal store '..'"),
        (
            lambda: Topology([Subtopology(0, ["a"])], repartition_topics={"a": 0}),
            r"repartition topic 'a': partition count must be an int >= 1 or None.*got 0",
        ),
        (
            lambda: Topology([Subtopology(0, ["a"])], repartition_topics={"a": -3}),
            "got -3",
        ),
        (
            lambda: Topology([Subtopology(0, ["a"])], repartition_topics={"a": True}),
            "got True",
        ),
        (
            lambda: Topology(
                [Subtopology(0, ["a"], sink_topics=["r"])], repartition_topics={"r": 2}
            ),
            r"repartition topics not read by any subtopology.*'r'",
        ),
        (
            lambda: Topology([Subtopology(0, ["a", "b"])], copartition_groups=[["a", "typo"]]),
            r"co-partition group \['a', 'typo'\] names topics that are not source.*'typo'",
        ),
        (
            lambda: Topology(
                [Subtopology(0, ["a"]), Subtopology(1, ["b"])], copartition_groups=[["a", "b"]]
            ),
            r"read by one subtopology.*'a' \(subtopology 0\), 'b' \(subtopology 1\)",
        ),
        (lambda: Topology([Subtopology(0, ["a"])], name="my app"), "illegal topology name"),
        (
            lambda: Topology([Subtopology(0, ["a"], ["s" * 240])], name="app"),
            "would be 254 characters long",
        ),
    ],
)
def test_invalid_topologies_are_rejected_with_a_clear_message(build: Any, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        build()


@given(st.integers(0, 2**31 - 1), st.integers(2**31, 2**100))
def test_ids_and_partition_counts_stay_in_kafkas_int32_range(fits: int, too_big: int) -> None:
    """Larger ids would pass the leader and fail every member's assignment decode."""
    assert Subtopology(fits, ["a"]).id == fits
    topology = Topology([Subtopology(0, ["a"])], repartition_topics={"a": max(fits, 1)})
    assert topology.repartition_topics == {"a": max(fits, 1)}
    with pytest.raises(TopologyError, match=r"subtopology id must be < 2\*\*31"):
        Subtopology(too_big, ["a"])
    with pytest.raises(TopologyError, match=r"'a': partition count must be < 2\*\*31"):
        Topology([Subtopology(0, ["a"])], repartition_topics={"a": too_big})


def test_type_errors_name_the_mistake() -> None:
    with pytest.raises(TypeError, match=r"not a single str 'orders' \(write \['orders'\]\)"):
        Subtopology(0, "orders")
    with pytest.raises(TypeError, match="topic must be a str, got int 3"):
        Subtopology(0, ["a", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="must be Subtopology instances"):
        Topology([("a",)])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="repartition_topics must be a mapping"):
        Topology([Subtopology(0, ["a"])], repartition_topics=["a"])  # type: ignore[arg-type]


def test_topology_survives_pickling_with_its_indexes() -> None:
    topology = clickstream()
    copy = pickle.loads(pickle.dumps(topology))
    assert copy == topology
    assert hash(copy) == hash(topology)
    assert copy.writers("by-user") == (0,)
    assert copy.subtopology_of("profiles") == 1


def test_a_topology_may_be_empty_but_has_no_tasks_to_run() -> None:
    """Empty is a valid value (a document being built); what would run or plan it asks
    ``check_has_tasks``, which names the file and the topology."""
    assert Topology([]).source_topics == frozenset()
    with pytest.raises(TopologyError, match=r"^topology has no tasks \(no subtopology\)$"):
        Topology([]).check_has_tasks()
    with pytest.raises(TopologyError, match=r"^x\.toml: topology app has no tasks"):
        Topology([], name="app").check_has_tasks("x.toml")
    with pytest.raises(TopologyError, match=r"^x\.toml: topology x has no tasks"):
        Topology([]).check_has_tasks("x.toml", name="x")
    clickstream().check_has_tasks("x.toml")


# -- hypothesis: normalisation ---------------------------------------------------------------------

names = st.sampled_from([f"t{i}" for i in range(12)])


@st.composite
def topology_inputs(draw: st.DrawFn) -> dict[str, Any]:
    """Valid constructor arguments with repartition topics, groups and stores."""
    topics = draw(st.lists(names, min_size=1, max_size=12, unique=True))
    n_subs = draw(st.integers(1, len(topics)))
    subs: list[list[str]] = [[] for _ in range(n_subs)]
    for i, topic in enumerate(topics):
        subs[i if i < n_subs else draw(st.integers(0, n_subs - 1))].append(topic)
    repartition = {
        t: draw(st.none() | st.integers(1, 9))
        for t in topics
        if draw(st.booleans()) and t != topics[0]
    }
    subtopologies = [
        {
            "id": s * 3,
            "source_topics": sources,
            "stores": [f"store{s}"] if draw(st.booleans()) else [],
            "sink_topics": [r for r in repartition if draw(st.booleans())],
        }
        for s, sources in enumerate(subs)
    ]
    groups = [
        draw(st.lists(st.sampled_from(sources), max_size=3, unique=True))
        for sources in subs
        if draw(st.booleans())
    ]
    return {"subtopologies": subtopologies, "groups": groups, "repartition": repartition}


def build(inputs: dict[str, Any], rng: random.Random | None = None) -> Topology:
    def shuffled(items: list[Any]) -> list[Any]:
        items = list(items)
        if rng is not None:
            rng.shuffle(items)
        return items

    subs = [
        Subtopology(
            s["id"],
            shuffled(s["source_topics"]),
            shuffled(s["stores"]),
            shuffled(s["sink_topics"]),
        )
        for s in inputs["subtopologies"]
    ]
    return Topology(
        shuffled(subs),
        shuffled([shuffled(g) for g in inputs["groups"]]),
        dict(shuffled(list(inputs["repartition"].items()))),
        name="app",
    )


@given(topology_inputs(), st.randoms(use_true_random=False))
def test_equality_and_hash_do_not_depend_on_input_order(
    inputs: dict[str, Any], rng: random.Random
) -> None:
    a, b = build(inputs), build(inputs, rng)
    assert a == b
    assert hash(a) == hash(b)
    assert repr(a) == repr(b)


@given(topology_inputs())
def test_to_dict_round_trips(inputs: dict[str, Any]) -> None:
    topology = build(inputs)
    assert Topology.from_dict(topology.to_dict()) == topology


# -- shipped files ---------------------------------------------------------------------------------


def test_the_three_shipped_topologies_exist() -> None:
    assert {p.name for p in SHIPPED} >= {
        "orders-join.toml",
        "clickstream-repartition.toml",
        "faust-tables.toml",
    }


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_files_load_with_complete_default_partitions(path: Path) -> None:
    topology, partitions = load_topology_file(path)
    assert topology.name
    assert set(partitions) == topology.external_source_topics
    assert Topology.load(path) == topology
    assert Topology.from_dict(topology.to_dict()) == topology


def test_orders_join_file_content() -> None:
    topology, partitions = load_topology_file(TOPOLOGY_DIR / "orders-join.toml")
    assert topology.name == "orders-enricher"
    assert topology.copartition_groups == (("customers", "orders"),)
    assert topology.changelog_topics(0) == ("orders-enricher-customers-table-changelog",)
    assert partitions == {"orders": 12, "customers": 12, "returns": 4}


def test_clickstream_file_declares_computed_and_fixed_repartition_topics() -> None:
    topology = Topology.load(TOPOLOGY_DIR / "clickstream-repartition.toml")
    assert dict(topology.repartition_topics) == {
        "clickstream-clicks-by-user-repartition": None,
        "clickstream-clicks-by-region-repartition": 6,
        "clickstream-user-sessions-repartition": None,
    }
    assert ("clickstream-clicks-by-user-repartition", "user-profiles") in (
        topology.copartition_groups
    )


# -- the TOML format -------------------------------------------------------------------------------

MINIMAL = """
name = "app"
copartition_groups = [["a", "b"]]

[[subtopology]]
id = 0
source_topics = ["a", "b"]
stores = ["s"]
sink_topics = ["r"]

[[subtopology]]
id = 1
source_topics = ["r"]

[[repartition_topic]]
name = "r"

[partitions]
a = 3
b = 3
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "t.toml"
    path.write_text(text)
    return path


def test_minimal_file(tmp_path: Path) -> None:
    loaded = load_topology_file(write(tmp_path, MINIMAL))
    assert loaded == TopologyFile(
        Topology(
            [Subtopology(0, ["a", "b"], ["s"], ["r"]), Subtopology(1, ["r"])],
            [["a", "b"]],
            {"r": None},
            "app",
        ),
        {"a": 3, "b": 3},
    )


def test_partitions_table_is_optional_and_name_defaults_to_empty(tmp_path: Path) -> None:
    loaded = load_topology_file(write(tmp_path, '[[subtopology]]\nid = 0\nsource_topics = ["a"]\n'))
    assert loaded.topology == Topology([Subtopology(0, ["a"])])
    assert loaded.partitions == {}


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('name = "app"', 'name = "app"\nversion = 2', r"top level: unknown key 'version'"),
        ("stores = [", "store = [", r"\[\[subtopology\]\] #1: unknown key 'store'.*allowed: id"),
        ('name = "r"', 'name = "r"\npartition = 4', r"\[\[repartition_topic\]\] #1: unknown key"),
        ("id = 1\n", "", r"\[\[subtopology\]\] #2: missing required key 'id'"),
        ('source_topics = ["r"]', "", "#2: missing required key 'source_topics'"),
        ('source_topics = ["r"]', 'source_topics = "r"', r"subtopology 1: 'source_topics' must be"),
        ('stores = ["s"]', 'stores = "s"', r"subtopology 0: 'stores' must be a list of strings"),
        ("id = 1", 'id = "1"', r"'id' must be an integer >= 0, got '1'"),
        ('name = "r"', 'name = "r"\npartitions = 0', r"\('r'\): 'partitions' must be an integer"),
        ('name = "r"', 'name = "r"\npartitions = "auto"', r"'partitions' must be an integer >= 1"),
        ("b = 3", "b = 0", r"\[partitions\] 'b' must be an integer >= 1, got 0"),
        ("b = 3", "b = 2147483648", r"\[partitions\] 'b' must be < 2\*\*31"),
        ('name = "r"', 'name = "r"\npartitions = 2147483648', r"'partitions' must be < 2\*\*31"),
        ("id = 1", "id = 123456789012345678901234567890", r"#2: 'id' must be < 2\*\*31"),
        ("b = 3", "b = 3\nr = 3", r"\[partitions\] 'r' is a repartition topic"),
        ("b = 3", "b = 3\nzz = 3", r"\[partitions\] 'zz' is not a source topic"),
        ('[["a", "b"]]', '["a", "b"]', r"copartition_groups\[0\] must be a list of strings"),
        ('[["a", "b"]]', '[["a", "c"]]', r"not source topics of any subtopology: 'c'"),
        ('name = "app"', "name = 3", "'name' must be a string"),
        ("[[repartition_topic]]", "[repartition_topic]", r"written \[\[repartition_topic\]\]"),
        ('sink_topics = ["r"]', 'sink_topics = ["r"]\nid = 2', "invalid TOML"),
        ('source_topics = ["r"]', 'source_topics = ["a"]', "source of only one subtopology"),
        ('source_topics = ["r"]', 'source_topics = ["é"]', r"subtopology 1: illegal topic 'é'"),
        ('source_topics = ["r"]', "source_topics = []", "subtopology 1: source_topics must not"),
    ],
)
def test_bad_files_are_rejected_naming_the_file_and_the_key(
    tmp_path: Path, old: str, new: str, message: str
) -> None:
    assert old in MINIMAL
    path = write(tmp_path, MINIMAL.replace(old, new, 1))
    with pytest.raises(TopologyError, match=message) as info:
        load_topology_file(path)
    assert str(info.value).startswith(str(path))
    assert str(info.value).count(str(path)) == 1, "the file is named once"
    assert str(info.value).count("subtopology ") <= 1, "the subtopology is named once"


def test_a_file_that_is_not_utf8_is_a_topology_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(MINIMAL.replace('name = "app"', 'name = "caf\xe9"').encode("latin-1"))
    with pytest.raises(TopologyError, match="not UTF-8") as info:
        load_topology_file(path)
    assert str(info.value).startswith(str(path))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("x = " + "[" * 100_000 + "]" * 100_000 + "\n", "nested too deep"),
        ("x = " + "{a = " * 100_000 + "1" + "}" * 100_000 + "\n", "nested too deep"),
        (None, "cannot read topology file"),  # a directory where the file should be
    ],
)
def test_unparsable_files_are_topology_errors(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "topology.toml"
    if content is None:
        path.mkdir()
    else:
        path.write_text(content)
    with pytest.raises(TopologyError, match=message) as info:
        Topology.load(path)
    assert str(info.value).startswith(str(path))


def test_an_oversized_file_is_refused_before_parsing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("streamassign.files.MAX_TOML_BYTES", len(MINIMAL) - 1)
    with pytest.raises(TopologyError, match="larger than"):
        load_topology_file(write(tmp_path, MINIMAL))


def test_duplicate_repartition_topic_is_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + '\n[[repartition_topic]]\nname = "r"\npartitions = 2\n')
    with pytest.raises(TopologyError, match="repartition topic 'r' is declared twice"):
        load_topology_file(path)


def test_from_dict_names_its_source_and_checks_partitions() -> None:
    doc = {"subtopology": [{"id": 0, "source_topics": ["a"]}], "partitions": {"a": -1}}
    with pytest.raises(TopologyError, match=r"^orders\.yaml: \[partitions\] 'a' must be"):
        Topology.from_dict(doc, source="orders.yaml")
    doc["partitions"] = {"a": 2}
    assert TopologyFile.from_dict(doc).partitions == {"a": 2}
    with pytest.raises(TopologyError, match=r"<dict>: top level: unknown keys 'x', 'y'"):
        Topology.from_dict({**doc, "x": 1, "y": 2})
