"""Topology and clients TOML files, damaged as bytes and as structure: each loader returns its
type or raises its one typed error (``TopologyError`` for topology files, ``ClientsFileError``
for clients files, each naming the file), nothing else, within the per-example CPU-time bound and
``FILE_PEAK`` bytes. A clients file that loads is assigned by ``StickyTaskAssignor`` (as
``streamassign plan`` does) with nothing but a ``StreamAssignError`` escaping."""

from __future__ import annotations

import json
import math
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from streamassign import PartitionGrouper, StickyTaskAssignor
from streamassign.cli import load_clients
from streamassign.errors import ClientsFileError, StreamAssignError, TopologyError
from streamassign.topology import Topology, TopologyFile, load_topology_file

from .damage import FUZZ, bounded, damaged

#: What loading (and assigning) one of these small files may allocate: the parser's
#: structures for a few KiB of text, or for a file nested as deep as the parser goes.
FILE_PEAK = 16 << 20

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY_FILES = {p.name: p.read_bytes() for p in sorted((ROOT / "topology").glob("*.toml"))}
CLIENTS_FILE = (ROOT / "examples" / "clients.toml").read_bytes()
#: The clients are assigned the tasks of the topology ``plan`` runs them with in the docs.
PLAN_TOPOLOGY = load_topology_file(ROOT / "topology" / "orders-join.toml")
PLAN_TASKS = PartitionGrouper().group(PLAN_TOPOLOGY.topology, PLAN_TOPOLOGY.partitions)
PLAN_STATEFUL = {
    t for t in PLAN_TASKS if t.subtopology in PLAN_TOPOLOGY.topology.stateful_subtopologies
}

#: Values a structural damage writes in place of a valid one: wrong types, edges of ints,
#: non-finite floats, empty and odd text, task-id look-alikes, nested containers.
HOSTILE = st.one_of(
    st.sampled_from(
        [0, -1, 1, 2**31 - 1, 2**31, 2**63 - 1, -(2**63), math.inf, -math.inf, math.nan, 0.5]
    ),
    st.sampled_from([True, False, "", " ", "0_0", "-1_0", "2147483648_0", "0_x", "é", "\x00"]),
    st.text(max_size=12),
    st.lists(st.one_of(st.integers(-2, 40), st.sampled_from(["0_1", "1_0", ""])), max_size=5),
    st.dictionaries(st.sampled_from(["0_0", "1_1", "x", "0_99"]), st.integers(-5, 2**63 - 1)),
    st.recursive(st.integers(0, 3), lambda inner: st.lists(inner, max_size=2), max_leaves=6),
)


def toml_value(value: Any) -> str:
    """``value`` as an inline TOML value (enough of a writer for these documents)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    assert isinstance(value, dict), value
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_document(doc: dict[str, Any]) -> bytes:
    return "".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in doc.items()).encode()


def _paths(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every key path into a parsed document (tables and arrays), the root excluded."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, child in items:
        yield (*at, key)
        if isinstance(child, dict | list):
            yield from _paths(child, (*at, key))


@st.composite
def restructured(draw: st.DrawFn, seed: bytes) -> bytes:
    """Valid TOML from ``seed``'s document with values replaced by hostile ones, keys added or
    removed, or a value nested thousands deep."""
    doc = tomllib.loads(seed.decode())
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(doc))
        path = draw(st.sampled_from(paths))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        how = draw(st.sampled_from(["replace", "replace", "delete", "add", "deep"]))
        if how == "delete":
            del parent[path[-1]]
        elif how == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["id", "extra", "process_id", "partitions", "tags"]))] = (
                draw(HOSTILE)
            )
        elif how == "deep":
            depth = draw(st.sampled_from([10, 100, 1000, 5000]))
            event(f"nested {depth}")
            text = (
                toml_document(doc)
                .decode()
                .replace(toml_value(parent[path[-1]]), "[" * depth + "]" * depth, 1)
            )
            return text.encode()
        else:
            parent[path[-1]] = draw(HOSTILE)
        if not doc:
            break
    return toml_document(doc)


def hostile_files(seeds: list[bytes]) -> st.SearchStrategy[bytes]:
    return st.one_of(
        damaged(st.sampled_from(seeds), max_random=600),
        st.sampled_from(seeds).flatmap(restructured),
    )


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as directory:
        yield Path(directory)


@FUZZ
@given(hostile_files(list(TOPOLOGY_FILES.values())))
def test_topology_files(workdir: Path, content: bytes) -> None:
    file = workdir / "topology.toml"
    file.write_bytes(content)
    with bounded(FILE_PEAK):
        try:
            loaded: TopologyFile | None = load_topology_file(file)
        except TopologyError as exc:
            assert str(file) in str(exc), f"the error names the file: {exc}"
            loaded = None
    event("loads" if loaded else "TopologyError")
    if loaded is not None:
        assert Topology.load(file) == loaded.topology
        assert Topology.from_dict(loaded.topology.to_dict()) == loaded.topology
        assert all(type(n) is int and 1 <= n < 2**31 for n in loaded.partitions.values())


@FUZZ
@given(hostile_files([CLIENTS_FILE]), st.integers(0, 2))
def test_clients_files(workdir: Path, content: bytes, standbys: int) -> None:
    file = workdir / "clients.toml"
    file.write_bytes(content)
    with bounded(FILE_PEAK):
        try:
            clients = load_clients(file)
        except ClientsFileError as exc:
            assert str(file) in str(exc), f"the error names the file: {exc}"
            event("ClientsFileError")
            return
        try:
            result = StickyTaskAssignor(standbys).assign(PLAN_TASKS, clients, PLAN_STATEFUL)
        except StreamAssignError as exc:  # e.g. a process id twice: plan prints one line
            event(f"loads, assign: {type(exc).__name__}")
            return
    event("loads and assigns")
    assert set(result) == {c.process_id for c in clients}
    actives = [t for a in result.values() for t in a.active]
    assert sorted(actives) == sorted(PLAN_TASKS), "every task active exactly once"
