"""High availability on a real broker: a process joins a stateful runtime application.

With the high-availability assignor the newcomer first gets warmups (never the actives) of
the tasks it will run, restores them like standbys, and takes them over at a probing
rebalance that comes by itself, restoring at most ``acceptable_recovery_lag`` records a task.
The same scenario with the plain sticky assignor hands it the actives at once and it restores
the whole changelog of each. Both runs must keep the tables exact (see ``ha_join.py``).
"""

from __future__ import annotations

from pathlib import Path

from .conftest import GroupIdFactory, TopicFactory
from .ha_join import run_join
from .test_runtime import PARTITIONS

PRELOAD = 36_000  # 6,000 changelog records a task before the join
RATE = 300  # records/s while the newcomer joins
LAG = 500


def test_a_joining_process_warms_up_then_takes_over_with_almost_nothing_to_restore(
    kafka_bootstrap: str,
    kafka_topic_factory: TopicFactory,
    kafka_group_id_factory: GroupIdFactory,
    tmp_path: Path,
) -> None:
    runs = {}
    for ha in (True, False):
        topic = kafka_topic_factory(PARTITIONS, prefix="events")
        app = kafka_group_id_factory("runtime-ha" if ha else "runtime-sticky")
        runs[ha] = run_join(
            kafka_bootstrap,
            topic,
            app,
            tmp_path / app,
            ha=ha,
            preload=PRELOAD,
            rate=RATE,
            flow_seconds=14,
            probing_ms=3000,
            acceptable_lag=LAG,
        )
    ha, sticky = runs[True], runs[False]
    print(f"\nHA: {ha}\nsticky: {sticky}")
    for run in (ha, sticky):
        assert run.exact  # no record lost or counted twice through the takeovers
        assert len(run.moved) == 2  # 6 tasks over 3 processes
        assert set(run.restores) == run.moved

    # HA: warmups of exactly the tasks it then took, before any active; then a probing
    # rebalance nobody asked for; each takeover restores the warmup's small tail only.
    assert ha.warmups_first == ha.moved
    # The leader's lags: every process caches every task's changelog end offsets.
    assert ha.end_offsets is not None and sticky.end_offsets is None
    assert set(ha.end_offsets) == {f"0_{p}" for p in range(PARTITIONS)}
    for task in ha.moved:
        assert ha.end_offsets[task] >= ha.changelog_at_join[task]
    assert ha.rebalances >= 2
    for task, (source, records) in ha.restores.items():
        assert source == "standby", (task, source)
        assert records <= LAG, (task, records)
        assert records * 10 < ha.changelog_at_join[task]

    # Sticky: the actives at once, each restored from the changelog's start (not compacted here).
    assert sticky.warmups_first == frozenset()
    for task, (source, records) in sticky.restores.items():
        assert source == "cold", (task, source)
        assert records >= sticky.changelog_at_join[task] >= 1000
    assert ha.restored * 10 < sticky.restored
