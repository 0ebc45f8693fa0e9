"""A third process joins a stateful runtime application on a real broker, with the
high-availability assignor or the plain sticky one: what the newcomer restored when it took
its tasks over, how long the group took to balance, how long the moved tasks stopped.

Shared by ``test_runtime_ha.py`` (assertions) and ``benchmarks/runtime_ha.py`` (the table).
The application is ``runtime_worker.py`` (sums per key in RocksDB, no standbys, 6 tasks):
two processes form the group, process ``preload`` records, then records flow at ``rate`` per
second while the third joins; at the end every process is stopped cleanly and its tables are checked
against what was produced, so a takeover that lost or doubled anything fails the run.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import attrs
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streamassign.runtime import COMMIT_KEY

from .test_runtime import (
    PARTITIONS,
    TASKS,
    Feeder,
    Runtime,
    expected_table,
    tables,
    topic_ends,
    wait_caught_up,
)

#: How long the flow goes on before the newcomer starts (the steady reference).
BEFORE_JOIN = 2.0


@attrs.frozen
class JoinOutcome:
    """What one run measured; times in seconds, ``t`` values are wall-clock."""

    ha: bool
    #: The newcomer's actives once balanced (the tasks it took over).
    moved: frozenset[str]
    #: The newcomer's warmups while it had no active yet (empty without HA).
    warmups_first: frozenset[str]
    #: Rebalances the newcomer went through until balanced (the probing ones included).
    rebalances: int
    #: The newcomer's restore of each moved task: its source and records read.
    restores: dict[str, tuple[str, int]]
    #: Each moved task's changelog end offset when the newcomer started (a full restore reads
    #: at least that many records).
    changelog_at_join: dict[str, int]
    #: From the newcomer's start until every process had its final tasks and no warmups.
    balanced_after: float
    #: Longest gap between changelog writes of a moved task from the join to the balance
    #: (its processing downtime), and the same for the flow before the join.
    downtime: float
    steady_gap: float
    #: The changelog end offsets (summed per task) the newcomer last had cached (HA only).
    end_offsets: dict[str, int] | None
    #: Tables dumped by the processes at the end equal the expected ones.
    exact: bool

    @property
    def restored(self) -> int:
        return sum(records for _, records in self.restores.values())


def run_join(
    bootstrap: str,
    topic: str,
    app: str,
    tmp: Path,
    *,
    ha: bool,
    preload: int,
    rate: int,
    flow_seconds: float,
    probing_ms: int = 3000,
    acceptable_lag: int = 1000,
    warmups: int = 2,
) -> JoinOutcome:
    """Run the scenario once on ``topic`` (``PARTITIONS`` partitions, empty) as ``app``."""
    runtime = Runtime(bootstrap, app, topic, tmp)
    runtime.args = ["--standbys", "0", "--status-interval", "0.1"]
    if ha:
        runtime.args += ["--ha", "--probing-ms", str(probing_ms), "--lag", str(acceptable_lag)]
        runtime.args += ["--warmups", str(warmups)]
    total = preload + int(rate * flow_seconds)
    changelog = f"{app}-totals-changelog"
    # Created here without compaction (the app accepts an existing changelog with the right
    # partition count): compaction would drop superseded writes, whose timestamps measure the
    # downtime, and make a full restore read fewer records than the end offsets say.
    asyncio.run(create_topic(bootstrap, changelog, {"cleanup.policy": "delete"}))
    try:
        # The group forms before the backlog arrives: a process busy with a large batch when a
        # rebalance starts can miss the rebalance timeout, be dropped and run on as a zombie
        # (docs/runtime.md), which is not what this scenario measures.
        runtime.start_two()
        load = Feeder(bootstrap, topic, preload, chunk=10_000, pause=0)
        load.run()
        wait_caught_up(bootstrap, app, topic)
        chunk = max(1, rate // 20)
        flow = Feeder(bootstrap, topic, total, chunk=chunk, pause=0.05, first=preload)
        flow.start()
        time.sleep(BEFORE_JOIN)
        at_join = asyncio.run(topic_ends(bootstrap, changelog))
        joined = time.time()
        runtime.start("p3")
        balanced_at = _wait_balanced(runtime)
        flow.finish()
        wait_caught_up(bootstrap, app, topic)
        statuses = {n: runtime.events(n, "status") for n in runtime.procs}
        newcomer = statuses["p3"]
        moved = frozenset(newcomer[-1]["active"])
        restores = {
            e["task"]: (e["source"], e["records"])
            for e in runtime.events("p3", "restore")
            if e["task"] in moved
        }
        dumped: dict[str, str] = {}
        for name in sorted(runtime.procs):
            dumped.update(tables(runtime.stop(name)))
        times = asyncio.run(_write_times(bootstrap, changelog, [_partition(t) for t in moved]))
    finally:
        runtime.close()
    before = [s for s in newcomer if not s["active"]]
    return JoinOutcome(
        ha=ha,
        moved=moved,
        warmups_first=frozenset(t for s in before for t in s["warmup"]),
        rebalances=max(s["rebalances"] for s in newcomer if s["t"] <= balanced_at),
        restores=restores,
        changelog_at_join={t: at_join[_partition(t)] for t in moved},
        balanced_after=balanced_at - joined,
        downtime=_longest_gap(times, joined, balanced_at + 1.0),
        steady_gap=_longest_gap(times, joined - BEFORE_JOIN + 0.5, joined),
        end_offsets=newcomer[-1]["ends"],
        exact=dumped == expected_table(total),
    )


def _partition(task: str) -> int:
    return int(task.split("_")[1])


def _wait_balanced(runtime: Runtime, timeout: float = 90.0, stable: float = 2.0) -> float:
    """Wait until every task runs once, each process has its share and no process has
    warmups, unchanged for ``stable`` s; returns when that state began (status time)."""
    share = len(TASKS) // len(runtime.procs)
    deadline = time.monotonic() + timeout
    now: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        time.sleep(0.25)
        history = {n: runtime.events(n, "status") for n in sorted(runtime.procs)}
        now = [h[-1] for h in history.values() if h]
        if len(now) < len(history):
            continue
        if sorted(t for s in now for t in s["active"]) != sorted(TASKS):
            continue
        if any(len(s["active"]) != share or s["warmup"] for s in now):
            continue
        since = max(_since(h) for h in history.values())
        if min(s["t"] for s in now) - since >= stable:
            return since
    raise AssertionError(f"no balanced assignment within {timeout}s: {now}")


def _since(statuses: list[dict[str, Any]]) -> float:
    """Time of the first status line of the current, unchanged run of (active, warmup)."""
    final = (statuses[-1]["active"], statuses[-1]["warmup"])
    since = statuses[-1]["t"]
    for s in reversed(statuses):
        if (s["active"], s["warmup"]) != final:
            break
        since = s["t"]
    return float(since)


def _longest_gap(times: dict[int, list[float]], start: float, end: float) -> float:
    """Longest interval within [start, end] without a write, over the given partitions."""
    gap = 0.0
    for ts in times.values():
        inside = [start, *(t for t in ts if start < t < end), end]
        gap = max(gap, *(b - a for a, b in itertools.pairwise(inside)))
    return gap


async def create_topic(bootstrap: str, topic: str, config: dict[str, str] | None = None) -> None:
    """A topic of ``PARTITIONS`` partitions (replication 1) with ``config``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, PARTITIONS, 1, topic_configs=config or {})])
    finally:
        await admin.close()


async def _write_times(bootstrap: str, topic: str, partitions: list[int]) -> dict[int, list[float]]:
    """Timestamps (s) of every data record (not commit markers) of some changelog partitions."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        tps = [KafkaTopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        out: dict[int, list[float]] = {p: [] for p in partitions}
        todo = {tp for tp in tps if ends[tp] > 0}
        while todo:
            for tp, records in (await consumer.getmany(*todo, timeout_ms=500)).items():
                out[tp.partition] += [r.timestamp / 1000 for r in records if r.key != COMMIT_KEY]
                if await consumer.position(tp) >= ends[tp]:
                    todo.discard(tp)
        return out
    finally:
        await consumer.stop()
