"""Faust app benchmark: one Faust app through one churn, with Faust's own assignor and with ours.

The app is ``tests/integration/faust_worker.py`` (an agent keeping, per key, the sequence numbers
of its records in a table with a changelog, RocksDB by default, ``table_standby_replicas=1``,
plus a stateless agent on a side topic with another partition count: a second topic group),
each worker its own OS process, on one Kafka broker. For each assignor, in turn, on a fresh
topic and group, the same steps (issue 23's churn):

1. **cold start 2**: two workers started together on the new app (Faust creates the changelog
   and leader topics while they join); then ``--records`` records over ``--keys`` keys are
   processed (consumer-group lag 0), so every changelog partition has history to recover;
2. **scale out to 3** (``w2``); from here on a round of one record per key is sent every
   1 s (after the round is sent) until the end;
3. **kill -9** ``w1`` while records flow;
4. **restart** it (same data directory and port);
5. **stop** ``w2`` gracefully (SIGTERM).

After each step the group must settle (every source partition active exactly once, every worker
done rebalancing and quiet for 3 s; a cold start that does not within 90 s is an **orphaned**
run and ends there). Per step: table-group and side-group partitions per worker, and whether
each group is **balanced** (every worker within the floor/ceiling of its equal share);
**moves** — partitions whose previous owner is still in the group but no longer runs them;
**recovery records** — changelog records the workers applied to *active* partitions (what
recovery had to read before processing resumed; Faust's table recovery, counted in the
worker); **all active after** — from the step's action until the last worker reported its
final assignment, done rebalancing; **longest stop** — the longest time one worker spent in
rebalances (Faust's sensor ``on_rebalance_start`` to ``on_rebalance_end``). At the end the
table is read through the router: **exact** when every key holds exactly the sequence numbers
sent (each at least once, none missing), **duplicates** the records counted twice
(at-least-once after the kill).

Run ``python benchmarks/faust_app.py [--bootstrap HOST:PORT] [--markdown docs/faust.md]
[--store rocksdb://|memory://] [--repeats N]``; without ``--bootstrap`` a broker is started
through ``scripts/kafka.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from _common import Report, arguments, console, on_broker, publish, show_machine_info
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.integration.faust_cluster import (  # noqa: E402
    FaustCluster,
    Feed,
    produce,
    tally,
    unbalanced,
)

SECTION = "faust_app"
ASSIGNORS = {"faust": "Faust's PartitionAssignor", "ours": "streamassign.faust"}


@attrs.frozen
class Step:
    """What one churn step did to the group."""

    name: str
    actives: dict[str, int]
    side: dict[str, int]
    balanced: bool
    moves: int
    recovered: int
    longest_stop: float
    all_active_after: float


@attrs.frozen
class Run:
    """One churn with one assignor: its steps, and how it ended."""

    steps: list[Step]
    orphaned: bool = False
    lost: int = 0
    duplicates: int = 0
    lag_left: int = 0


def owners(state: Mapping[str, Mapping[str, Any]]) -> dict[int, str]:
    return {p: w for w, s in state.items() for _, p in s["source"]}


def recovered(cluster: FaustCluster, since: float) -> dict[str, int]:
    """Per live worker, the records recovery applied to active partitions after ``since``."""
    out = {}
    for name, proc in cluster.procs.items():
        proc.drain()
        lines = [x for x in proc.lines if x["event"] == "state"]
        before = [x["recovered"] for x in lines if x["at"] < since]
        out[name] = lines[-1]["recovered"] - (before[-1] if before else 0) if lines else 0
    return out


def longest_stop(cluster: FaustCluster, since: float) -> float:
    """The longest total time one live worker spent rebalancing after ``since``."""
    per_worker = [
        sum(
            x["end"] - max(x["start"], since)
            for x in proc.lines
            if x["event"] == "rebalance" and x["end"] >= since
        )
        for proc in cluster.procs.values()
    ]
    return max(per_worker, default=0.0)


async def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()
    await asyncio.sleep(1.0)  # leaders elected


async def group_lag(bootstrap: str, group: str, topic: str) -> int:
    """Records of ``topic`` the group has not committed yet."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await admin.start()
    await consumer.start()
    try:
        committed = await admin.list_consumer_group_offsets(group)
        # From the topic's own metadata: a consumer that subscribes to nothing knows no topic
        # (partitions_for_topic() is None), which made every lag 0.
        (described,) = await admin.describe_topics([topic])
        parts = [TopicPartition(topic, p["partition"]) for p in described["partitions"]]
        if not parts:
            raise RuntimeError(f"topic {topic} has no partitions in its metadata")
        ends = await consumer.end_offsets(parts)
        return sum(
            end - (committed[tp].offset if tp in committed else 0) for tp, end in ends.items()
        )
    finally:
        await consumer.stop()
        await admin.close()


def wait_processed(bootstrap: str, group: str, topic: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while (lag := asyncio.run(group_lag(bootstrap, group, topic))) > 0:
        if time.monotonic() > deadline:
            raise TimeoutError(f"lag still {lag} after {timeout} s")
        time.sleep(1.0)


def all_active_after(cluster: FaustCluster, since: float) -> float:
    """Seconds from ``since`` until the last live worker reported its settled state."""
    last = [
        proc.lines[-1]["at"]
        for proc in cluster.procs.values()
        if proc.lines and proc.lines[-1]["event"] == "state"
    ]
    states = [x["at"] for p in cluster.procs.values() for x in p.lines if x["event"] == "state"]
    return max(last or states or [since]) - since


def table_check(cluster: FaustCluster, sent: int) -> tuple[int, int]:
    """Records lost and records counted twice, read through ``w0`` once the table is exact, or
    once every key counted its last record and nothing changed for a few seconds."""
    try:
        off, duplicates = cluster.final_table("w0", sent)
    except AssertionError:  # some key never counted its last record: count what is missing
        off, duplicates = tally(cluster.seen("w0"), sent)
    return sum(len(numbers) for numbers in off.values()), duplicates


def run_churn(bootstrap: str, assignor: str, tmp: Path, args: argparse.Namespace) -> Run:
    """The five steps with one assignor (see the module docstring)."""
    suffix = uuid.uuid4().hex[:6]
    topic, app = f"bench-faust-src-{suffix}", f"bench-faust-{assignor}-{suffix}"
    side = f"bench-faust-side-{suffix}"
    asyncio.run(create_topic(bootstrap, topic, args.partitions))
    asyncio.run(create_topic(bootstrap, side, args.side_partitions))
    keys = [f"key-{i:05d}" for i in range(args.keys)]
    cluster = FaustCluster(
        bootstrap,
        app,
        topic,
        tmp / app,
        "--store",
        args.store,
        assignor=assignor,
        partitions=args.partitions,
        side_topic=side,
        keys=keys,
    )
    steps: list[Step] = []
    state: dict[str, Any] = {}

    def measure(name: str, since: float) -> None:
        nonlocal state
        before = owners(state)
        state = cluster.settle(standbys=None)
        for proc in cluster.procs.values():
            proc.drain()
        after = owners(state)
        moves = sum(1 for p, w in before.items() if w in state and after.get(p) != w)
        steps.append(
            Step(
                name,
                {w: len(s["source"]) for w, s in sorted(state.items())},
                {w: len(s["side"]) for w, s in sorted(state.items())},
                not unbalanced(state, "source", args.partitions)
                and not unbalanced(state, "side", args.side_partitions),
                moves,
                sum(recovered(cluster, since).values()),
                longest_stop(cluster, since),
                all_active_after(cluster, since),
            )
        )
        console.print(f"{ASSIGNORS[assignor]}: {steps[-1]}")

    rounds = max(1, args.records // args.keys)
    feed = Feed(bootstrap, topic, pause=1.0, keys=keys, first=rounds)
    try:
        since = time.time()
        for w in ("w0", "w1"):
            cluster.start(w)
        try:
            measure("cold start 2", since)
        except AssertionError as exc:
            console.print(f"{ASSIGNORS[assignor]}: cold start orphaned: {exc}")
            return Run(steps, orphaned=True)
        asyncio.run(produce(bootstrap, topic, rounds, keys))
        wait_processed(bootstrap, app, topic)
        cluster.settle(standbys=None)

        since = time.time()
        cluster.start("w2")
        measure("scale out to 3", since)
        feed.start()
        while feed.sent < rounds + 2:  # records in flight when the worker dies
            time.sleep(0.1)
        since = time.time()
        cluster.kill("w1")
        measure("kill -9 w1 (records flowing)", since)
        since = time.time()
        cluster.start("w1")
        measure("restart w1", since)
        since = time.time()
        cluster.procs.pop("w2").stop()
        measure("stop w2 (SIGTERM)", since)
        sent = feed.stop()
        try:
            wait_processed(bootstrap, app, topic, timeout=120.0)
            stuck = 0
        except TimeoutError:  # the group stopped committing some partition (seen with both)
            stuck = asyncio.run(group_lag(bootstrap, app, topic))
        lost, duplicates = table_check(cluster, sent)
        console.print(
            f"{ASSIGNORS[assignor]}: {sent} rounds: {lost} lost, {duplicates} duplicates, "
            f"lag left {stuck}"
        )
        return Run(steps, lost=lost, duplicates=duplicates, lag_left=stuck)
    finally:
        feed.stop()
        cluster.close()


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def per_worker(counts: Mapping[str, int]) -> str:
    return " ".join(f"{w}:{n}" for w, n in counts.items())


def report(results: Mapping[str, Sequence[Run]], args: argparse.Namespace) -> list[Report]:
    repeats = len(next(iter(results.values())))
    churn = Report(
        "Faust app through churn: Faust's assignor vs streamassign.faust",
        [
            "step",
            "assignor",
            "table partitions per worker",
            "side partitions per worker",
            "runs balanced per group",
            "moves",
            "recovery records",
            "all active after",
            "longest stop",
        ],
        notes=(
            f"{args.partitions} source partitions counted into a `{args.store}` table with 1 "
            f"standby, a stateless side topic of {args.side_partitions} partitions, "
            f"{args.records:,} records over {args.keys:,} keys before the churn, then a round "
            f"per key every 1 s. {repeats} run(s) per assignor, alternating, on the same "
            "broker. Partitions per worker: every run's, separated by `;` when they differ; "
            "moves, recovery records and times: median (all runs in brackets)."
        ),
    )
    names: list[str] = []
    for runs in results.values():
        for run in runs:
            names += [s.name for s in run.steps if s.name not in names]
    for name in names:
        for assignor, runs in results.items():
            steps = [s for run in runs for s in run.steps if s.name == name]
            if not steps:
                continue
            churn.add(
                name,
                ASSIGNORS[assignor],
                "; ".join(dict.fromkeys(per_worker(s.actives) for s in steps)),
                "; ".join(dict.fromkeys(per_worker(s.side) for s in steps)),
                f"{sum(s.balanced for s in steps)} of {len(steps)}",
                _spread([s.moves for s in steps], "{:g}"),
                _spread([s.recovered for s in steps], "{:,.0f}"),
                _spread([s.all_active_after for s in steps], "{:.1f}", " s"),
                _spread([s.longest_stop for s in steps], "{:.1f}", " s"),
            )
    ends = Report(
        "How the runs ended",
        [
            "assignor",
            "cold starts orphaned",
            "tables exact",
            "records lost",
            "records counted twice",
            "lag left",
        ],
        notes=(
            "Orphaned: the cold start did not settle (every partition active once) within "
            "90 s. Exact: every key held every sequence number sent, once every key had "
            "counted its last record. Lost, counted twice, and lag left (records the group "
            "had not committed 120 s after the last was sent): per run."
        ),
    )
    for assignor, runs in results.items():
        done = [r for r in runs if not r.orphaned]
        ends.add(
            ASSIGNORS[assignor],
            f"{sum(r.orphaned for r in runs)} of {len(runs)}",
            f"{sum(r.lost == 0 for r in done)} of {len(done)}",
            ", ".join(f"{r.lost:,}" for r in done) or "-",
            ", ".join(f"{r.duplicates:,}" for r in done) or "-",
            ", ".join(f"{r.lag_left:,}" for r in done) or "-",
        )
    return [churn, ends]


def _spread(values: Sequence[float], fmt: str, unit: str = "") -> str:
    """The median, and every run's value in brackets."""
    each = ", ".join(fmt.format(v) for v in values)
    return (
        f"{fmt.format(median(values))}{unit} ({each})"
        if len(values) > 1
        else fmt.format(values[0]) + unit
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments(__doc__, SECTION, repeats="runs per assignor (default 3)")
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--keys", type=int, default=120)
    parser.add_argument("--records", type=int, default=2_400)
    parser.add_argument("--side-partitions", type=int, default=4)
    parser.add_argument("--store", default="rocksdb://", help="the table's store")
    parser.set_defaults(repeats=3)
    args = parser.parse_args(argv)
    info = show_machine_info()
    results: dict[str, list[Run]] = {a: [] for a in ASSIGNORS}
    with on_broker(args.bootstrap, info) as (bootstrap, tmp):
        for run in range(args.repeats):
            order = list(ASSIGNORS) if run % 2 == 0 else list(reversed(ASSIGNORS))
            for assignor in order:
                results[assignor].append(run_churn(bootstrap, assignor, tmp, args))
    publish(report(results, args), args, info, "benchmarks/faust_app.py", argv)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the workers on the way out
    sys.exit(main())
