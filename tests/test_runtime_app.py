"""Runtime application setup that needs no broker: configuration errors and internal topics."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamassign import Subtopology, Topology
from streamassign.errors import CopartitioningError
from streamassign.runtime import App, RuntimeConfigError, internal_topics


class Nothing:
    async def process(self, ctx: object, record: object) -> None: ...


def topology() -> Topology:
    return Topology(
        [
            Subtopology(0, ["sentences"], sink_topics=["app-words"]),
            Subtopology(1, ["app-words"], stores=["counts"]),
            Subtopology(2, ["orders", "customers"], stores=["customers"]),
        ],
        copartition_groups=[["orders", "customers"]],
        repartition_topics={"app-words": None},
        name="app",
    )


def test_internal_topics_follow_the_topology() -> None:
    counts = internal_topics(topology(), {"sentences": 6, "orders": 3, "customers": 3})
    assert counts == {"app-words": 6, "app-counts-changelog": 6, "app-customers-changelog": 3}
    with pytest.raises(CopartitioningError):
        internal_topics(topology(), {"sentences": 6, "orders": 3, "customers": 4})


def test_every_subtopology_needs_a_processor(tmp_path: Path) -> None:
    with pytest.raises(RuntimeConfigError, match=r"\[0, 1, 2\]"):
        App(topology(), {0: Nothing, 1: Nothing}, bootstrap_servers="x:1", state_dir=tmp_path)


@pytest.mark.parametrize(
    "options",
    [{"store_kind": "lmdb"}, {"processing_errors": "ignore"}, {"commit_interval_ms": 0}],
)
def test_bad_options_are_refused(tmp_path: Path, options: dict[str, object]) -> None:
    processors = {0: Nothing, 1: Nothing, 2: Nothing}
    with pytest.raises(RuntimeConfigError):
        App(topology(), processors, bootstrap_servers="x:1", state_dir=tmp_path, **options)  # type: ignore[arg-type]


def test_topology_from_a_toml_file(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    app = App(
        root / "topology" / "orders-join.toml",
        {0: Nothing, 1: Nothing},
        bootstrap_servers="x:1",
        state_dir=tmp_path,
    )
    assert app.topology.name == "orders-enricher"
    assert app.host.application_id == "orders-enricher"
