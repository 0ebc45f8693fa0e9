"""A real Faust app on a real broker with ``streamassign.faust:PartitionAssignor``.

Worker processes (``faust_worker.py``: a counting table, one standby) go through one scenario:
three workers; kill -9 one; its partitions move (warm where the balance allows) and the
table's content is intact and served (through Faust's router) by the survivors; restart it and it
gets its partitions back; scale to five and every worker gets work. After every change the group
must settle with each source partition active exactly once, each changelog partition's standby on
another worker, and every count correct when read through any worker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import GroupIdFactory, TopicFactory
from .faust_cluster import KEYS, PARTITIONS, FaustCluster, Pairs, produce


def partitions(pairs: Pairs) -> set[int]:
    return {p for _, p in pairs}


@pytest.fixture
def cluster(
    kafka_bootstrap: str,
    kafka_topic_factory: TopicFactory,
    kafka_group_id_factory: GroupIdFactory,
    tmp_path: Path,
) -> Iterator[FaustCluster]:
    topic = kafka_topic_factory(PARTITIONS, prefix="faust-src")
    app = kafka_group_id_factory("faust-app")
    c = FaustCluster(kafka_bootstrap, app, topic, tmp_path)
    yield c
    c.close()


def test_faust_app_kill_restart_scale(cluster: FaustCluster, kafka_bootstrap: str) -> None:
    for name in ("w0", "w1", "w2"):
        cluster.start(name)
    state = cluster.settle()
    assert all(len(s["source"]) == 2 for s in state.values()), state

    asyncio.run(produce(kafka_bootstrap, cluster.topic, rounds=5))
    cluster.wait_counts("w0", 5)
    time.sleep(2.0)  # offsets committed (every 0.5 s): nothing is processed twice after the kill

    state = cluster.settle()  # as it is now: standbys may have moved since the first settle
    before = state["w1"]
    holders = {p: name for name, s in state.items() for p in partitions(s["standby"])}
    cluster.kill("w1")
    state = cluster.settle()
    # Warm takeover: w1's partitions go to the workers holding their standbys as far as the
    # balance allows (both standbys may sit on one survivor that has room for only one).
    warm = [
        p for p in partitions(before["source"]) if (cluster.topic, p) in state[holders[p]]["source"]
    ]
    assert warm, (before, holders, state)
    for survivor in ("w0", "w2"):
        assert cluster.counts(survivor) == dict.fromkeys(KEYS, 5)

    cluster.start("w1")
    state = cluster.settle()
    assert state["w1"]["source"] == before["source"], "a restarted worker gets its partitions back"
    cluster.wait_counts("w1", 5)

    cluster.start("w3")
    cluster.start("w4")
    state = cluster.settle()
    assert all(s["source"] for s in state.values()), f"a worker got no active partition: {state}"
    # Faust's web views read the assignor: /stats/assignment/ and the router's table map.
    for name, s in state.items():
        shown = cluster.get(name, "/stats/assignment/")["actives"][cluster.topic]
        assert sorted(shown) == sorted(partitions(s["source"]))
    # Faust's leader election (@app.timer(on_leader=True)) rides on a one-partition topic.
    leader_topic = f"{cluster.app}-__assignor-__leader"
    leaders = [n for n, s in cluster.states().items() if [leader_topic, 0] in s["actives"]]
    assert len(leaders) == 1, leaders
    routes = cluster.get("w3", "/router/")
    assert sorted(p for r in routes.values() for p in r.get(cluster.changelog, [])) == list(
        range(PARTITIONS)
    )
    assert len(routes) == 5
    # @app.topic_route (external_key_store): each key answered by the worker running it.
    owners = [cluster.get("w3", f"/owner/{key}/") for key in KEYS]
    assert all(o["active"] for o in owners), owners
    served = {o["served_by"] for o in owners}
    assert len(served) > 1 and served <= {cluster.ports[n] for n in state}, owners
    asyncio.run(produce(kafka_bootstrap, cluster.topic, rounds=1))
    cluster.wait_counts("w4", 6)
    cluster.wait_counts("w0", 6)


def test_stateless_app_uses_our_assignor_through_the_transport(
    kafka_bootstrap: str,
    kafka_topic_factory: TopicFactory,
    kafka_group_id_factory: GroupIdFactory,
    tmp_path: Path,
) -> None:
    """Without tables and with ``table_standby_replicas=0`` Faust uses round robin
    (``app.assignor`` never runs and reports nothing; checked by hand with ``kafka://``); with
    ``streamassign://`` the workers' assignments come from our assignor."""
    topic = kafka_topic_factory(PARTITIONS, prefix="faust-plain")
    app = kafka_group_id_factory("faust-plain")
    c = FaustCluster(
        kafka_bootstrap,
        app,
        topic,
        tmp_path,
        *("--stateless", "--standbys", "0", "--scheme", "streamassign"),
    )
    try:
        c.start("a")
        c.start("b")
        state = c.settle(stateful=False)
        assert sorted(len(s["source"]) for s in state.values()) == [3, 3]
    finally:
        c.close()


def test_workers_of_two_app_versions_share_the_group(
    kafka_bootstrap: str,
    kafka_topic_factory: TopicFactory,
    kafka_group_id_factory: GroupIdFactory,
    tmp_path: Path,
) -> None:
    """A deploy in progress: the leader runs the old version; two workers of the new one read one
    more topic into one more table. With Faust's assignor the new workers' coordinators die on
    an assert (the leader does not know the new changelog, so it leaves out its standbys); with
    ours the new workers announce their changelogs, the leader gives each topic to its readers
    only, places the new table's standbys, and every worker keeps running."""
    topic = kafka_topic_factory(PARTITIONS, prefix="faust-v1")
    refunds = kafka_topic_factory(PARTITIONS, prefix="faust-v2")
    app = kafka_group_id_factory("faust-versions")
    seen = f"{app}-seen-changelog"
    c = FaustCluster(kafka_bootstrap, app, topic, tmp_path)
    try:
        c.start("old")
        c.settle()
        c.start("new1", "--extra-topic", refunds)
        c.start("new2", "--extra-topic", refunds)
        c.settle()
        states = c.states()
        assert all(proc.proc.poll() is None for proc in c.procs.values())
        assert not [tp for tp in states["old"]["actives"] if tp[0] in (refunds, seen)]
        new = [states[n] for n in ("new1", "new2")]
        assert sorted(p for s in new for t, p in s["actives"] if t == refunds) == list(
            range(PARTITIONS)
        )
        for s in new:  # the new table's standbys: on the other new worker
            active = {p for t, p in s["actives"] if t == seen}
            standby = {p for t, p in s["standbys"] if t == seen}
            assert active | standby == set(range(PARTITIONS)) and not active & standby
    finally:
        c.close()
