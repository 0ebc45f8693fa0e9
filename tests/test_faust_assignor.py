"""``streamassign.faust:PartitionAssignor`` inside real Faust app objects (no broker): the aiokafka
assignor round trip, and everything Faust's tables, router and web views ask of ``app.assignor``.
The broker test with worker processes is tests/integration/test_faust_app.py."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import faust
import pytest
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from faust.types import TP

from streamassign.faust import CAPACITY_ENV, PartitionAssignor
from streamassign.faust.leader import CAPACITY_TAG
from streamassign.protocol import SubscriptionInfo

APP = "shop"
SRC = "orders"
CL = f"{APP}-totals-changelog"
GLOBAL_CL = f"{APP}-rates-changelog"
COUNTS = {SRC: 6, CL: 6, GLOBAL_CL: 2}


class Cluster:
    """The one thing ``assign`` reads of aiokafka's ClusterMetadata."""

    def __init__(self, counts: Mapping[str, int]) -> None:
        self.counts = counts

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        n = self.counts.get(topic)
        return set(range(n)) if n else None


def make_app(datadir: Path, port: int) -> faust.App:
    app = faust.App(
        APP,
        broker="kafka://localhost:1",
        datadir=str(datadir),
        canonical_url=f"http://127.0.0.1:{port}",
        PartitionAssignor="streamassign.faust:PartitionAssignor",
        table_standby_replicas=1,
        topic_partitions=6,
    )
    app.Table("totals", default=int)
    app.GlobalTable("rates", default=int, partitions=2)
    return app


def rebalance(
    assignors: Mapping[str, PartitionAssignor],
    counts: Mapping[str, int] = COUNTS,
    garbage: Mapping[str, bytes] | None = None,
) -> dict[str, ConsumerProtocolMemberAssignment]:
    """One join/sync round: every member's metadata, the first member leads, all apply."""
    metadata = {m: a.metadata(set(counts)) for m, a in assignors.items()}
    for m, data in (garbage or {}).items():
        metadata[m] = ConsumerProtocolMemberMetadata(0, sorted(counts), data)
    leader = next(iter(assignors.values()))
    encoded = leader.assign(Cluster(counts), metadata)
    out = {m: ConsumerProtocolMemberAssignment.decode(raw) for m, raw in encoded.items()}
    for m, a in assignors.items():
        a.on_assignment(out[m])
    return out


@pytest.fixture
def workers(tmp_path: Path) -> dict[str, PartitionAssignor]:
    out = {}
    for i in range(3):
        assignor = make_app(tmp_path / f"w{i}", 7000 + i).assignor
        assert isinstance(assignor, PartitionAssignor)
        out[f"m{i}"] = assignor
    return out


def tps(pairs: Any, topic: str) -> set[int]:
    return {tp.partition for tp in pairs if tp.topic == topic}


def test_the_setting_picks_our_assignor(workers: dict[str, PartitionAssignor]) -> None:
    assignor = workers["m0"]
    assert assignor.replicas == 1
    assert assignor.name == "streamassign-faust"


def test_round_trip_serves_tables_router_and_views(workers: dict[str, PartitionAssignor]) -> None:
    result = rebalance(workers)
    actives = [tps(a.assigned_actives(), SRC) for a in workers.values()]
    assert sorted(p for ps in actives for p in ps) == list(range(6))
    assert all(len(ps) == 2 for ps in actives)
    for m, a in workers.items():
        kafka = {TP(t, p) for t, ps in result[m].assignment for p in ps}
        assert a.assigned_actives() | a.assigned_standbys() == kafka
        # Changelog partitions follow their source partitions; standbys only of changelogs.
        assert tps(a.assigned_actives(), CL) == tps(a.assigned_actives(), SRC)
        assert {tp.topic for tp in a.assigned_standbys()} <= {CL, GLOBAL_CL}
        assert not tps(a.assigned_standbys(), CL) & tps(a.assigned_actives(), CL)
        # A global table is kept whole on every worker.
        assert tps(a.assigned_actives(), GLOBAL_CL) == {0, 1}
        for tp in a.assigned_actives():
            assert a.is_active(tp) and not (a.is_standby(tp) and tp.topic == SRC)
        assert a.group_for_topic(SRC) == a.group_for_topic(CL)
    # Every changelog partition has exactly one standby, elsewhere.
    standbys = sorted(p for a in workers.values() for p in tps(a.assigned_standbys(), CL))
    assert standbys == list(range(6))

    a = workers["m1"]
    tables = a.tables_metadata()
    assert set(tables) == {f"http://127.0.0.1:{7000 + i}" for i in range(3)}
    for i, w in enumerate(workers.values()):
        assert set(tables[f"http://127.0.0.1:{7000 + i}"][CL]) == tps(w.assigned_actives(), CL)
    assert all(set(v) == {CL} for v in a.table_metadata(CL).values())
    external = a.external_topics_metadata()
    assert sorted(p for v in external.values() for p in v.get(SRC, [])) == list(range(6))
    assert a._tps_url[TP(CL, 0)] in tables  # what key_store answers for a key of partition 0


def test_restart_reports_what_the_worker_ran(
    workers: dict[str, PartitionAssignor], tmp_path: Path
) -> None:
    rebalance(workers)
    ran = workers["m2"].info.active
    # Same datadir as m2 after m2's process died (its lock is gone with it).
    assert workers["m2"]._state is not None
    workers["m2"]._state.close()
    restarted = make_app(tmp_path / "w2", 7002).assignor
    meta = restarted.metadata(set(COUNTS))
    info = SubscriptionInfo.decode(meta.user_data)
    assert info.previous_active == ran
    assert info.process_id == workers["m2"]._process_id
    survivors = {m: workers[m] for m in ("m0", "m1")}
    rebalance(survivors)
    rebalance({**survivors, "m2": restarted})
    assert restarted.info.active == ran


def test_a_locked_state_directory_is_no_crash(tmp_path: Path) -> None:
    first = make_app(tmp_path / "same", 7000).assignor
    second = make_app(tmp_path / "same", 7001).assignor
    first.metadata({SRC})
    meta = second.metadata({SRC})  # logs a warning, runs without restart stickiness
    assert SubscriptionInfo.decode(meta.user_data).process_id != first._process_id


def test_garbage_member_and_garbage_assignment(workers: dict[str, PartitionAssignor]) -> None:
    faust_json = b'{"assignment": {"actives": {}, "standbys": {}}, "url": "http://x"}'
    result = rebalance(workers, garbage={"old-faust": faust_json})
    assert set(result) == {*workers, "old-faust"}
    assert result["old-faust"].assignment  # a member without history still gets work

    a = workers["m0"]
    bad = ConsumerProtocolMemberAssignment(0, [(SRC, [0, 1])], b"not ours")
    a.on_assignment(bad)
    assert a.assigned_actives() == {TP(SRC, 0), TP(SRC, 1)}
    assert a.assigned_standbys() == set()


def test_capacity_from_the_environment(
    workers: dict[str, PartitionAssignor], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CAPACITY_ENV, "2")
    info = SubscriptionInfo.decode(workers["m0"].metadata({SRC}).user_data)
    assert info.client_tags == {CAPACITY_TAG: "2"}
    monkeypatch.setenv(CAPACITY_ENV, "0")
    assert not SubscriptionInfo.decode(workers["m0"].metadata({SRC}).user_data).client_tags


def test_capacity_weights_the_share(workers: dict[str, PartitionAssignor]) -> None:
    class Heavy(PartitionAssignor):
        capacity = 2

    heavy = Heavy(workers["m0"].app, replicas=1)
    rebalance({**workers, "m0": heavy}, counts={SRC: 8})
    assert len(heavy.assigned_actives()) == 4
    assert [len(workers[m].assigned_actives()) for m in ("m1", "m2")] == [2, 2]


def test_a_stateless_app(tmp_path: Path) -> None:
    apps = [
        faust.App(
            "plain",
            broker="kafka://localhost:1",
            datadir=str(tmp_path / f"p{i}"),
            PartitionAssignor=PartitionAssignor,
        )
        for i in range(2)
    ]
    assignors = {f"m{i}": app.assignor for i, app in enumerate(apps)}
    rebalance(assignors, counts={"clicks": 5})
    assert sorted(len(a.assigned_actives()) for a in assignors.values()) == [2, 3]
    assert all(not a.assigned_standbys() for a in assignors.values())
