"""Faust app benchmark: one Faust app through one churn, with Faust's own assignor and with ours.

The app is ``tests/integration/faust_worker.py`` (an agent counting records per key into a
table with a changelog, RocksDB by default, ``table_standby_replicas=1``), each worker its own OS
process, on one Kafka broker. For each assignor, in turn, on a fresh topic and group, the same
steps:

1. **start 3** workers; then ``--records`` records over ``--keys`` keys are produced and
   processed (consumer-group lag 0), so every changelog partition has history to recover;
2. **kill -9** one worker (``w1``);
3. **restart** it (same data directory and port);
4. **scale to 5** (two more workers).

After each step the group must settle (every source partition active exactly once, every worker
done rebalancing and quiet for 3 s). Per step: source partitions per worker (balance) and the
idle workers; **moves** — partitions whose previous owner is still in the group but no longer runs
them; **recovery records** — changelog records the workers applied to *active* partitions (what
recovery had to read before processing resumed; Faust's table recovery, counted in the worker);
**longest stop** — the longest time one worker spent in rebalances during the step (Faust's
sensor ``on_rebalance_start`` to ``on_rebalance_end``: revocation to recovery done); **settled
after** — from the step's action until the group settled.

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
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from _common import Report, console, machine_info, write_section
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from streams_protocol import kafka_broker

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.integration.faust_cluster import FaustCluster, produce  # noqa: E402

SECTION = "faust_app"
ASSIGNORS = {"faust": "Faust's PartitionAssignor", "ours": "streamassign.faust"}


@attrs.frozen
class Step:
    """What one churn step did to the group."""

    name: str
    actives: dict[str, int]
    moves: int
    recovered: int
    longest_stop: float
    settled_after: float


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
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        ends = await consumer.end_offsets(parts)
        return sum(
            end - (committed[tp].offset if tp in committed else 0) for tp, end in ends.items()
        )
    finally:
        await consumer.stop()
        await admin.close()


def wait_processed(bootstrap: str, group: str, topic: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while (lag := asyncio.run(group_lag(bootstrap, group, topic))) > 0:
        if time.monotonic() > deadline:
            raise TimeoutError(f"lag still {lag} after {timeout} s")
        time.sleep(1.0)


def run_churn(bootstrap: str, assignor: str, tmp: Path, args: argparse.Namespace) -> list[Step]:
    """The four steps with one assignor (see the module docstring)."""
    suffix = uuid.uuid4().hex[:6]
    topic, app = f"bench-faust-src-{suffix}", f"bench-faust-{assignor}-{suffix}"
    asyncio.run(create_topic(bootstrap, topic, args.partitions))
    cluster = FaustCluster(
        bootstrap,
        app,
        topic,
        tmp / app,
        "--store",
        args.store,
        assignor=assignor,
        partitions=args.partitions,
    )
    steps: list[Step] = []
    state: dict[str, Any] = {}

    def measure(name: str, since: float) -> None:
        nonlocal state
        before = owners(state)
        state = cluster.settle(standbys=None)
        after = owners(state)
        settled = time.time() - since
        moves = sum(1 for p, w in before.items() if w in state and after.get(p) != w)
        steps.append(
            Step(
                name,
                {w: len(s["source"]) for w, s in sorted(state.items())},
                moves,
                sum(recovered(cluster, since).values()),
                longest_stop(cluster, since),
                settled,
            )
        )
        console.print(f"{ASSIGNORS[assignor]}: {steps[-1]}")

    try:
        since = time.time()
        for w in ("w0", "w1", "w2"):
            cluster.start(w)
        measure("start 3", since)
        keys = [f"key-{i:05d}" for i in range(args.keys)]
        asyncio.run(produce(bootstrap, topic, max(1, args.records // args.keys), keys))
        wait_processed(bootstrap, app, topic)
        time.sleep(2.0)  # standbys caught up, offsets committed
        cluster.settle(standbys=None)

        since = time.time()
        cluster.kill("w1")
        measure("kill -9 w1", since)
        since = time.time()
        cluster.start("w1")
        measure("restart w1", since)
        since = time.time()
        cluster.start("w3")
        cluster.start("w4")
        measure("scale to 5", since)
    finally:
        cluster.close()
    return steps


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def report(results: Mapping[str, Sequence[Sequence[Step]]], args: argparse.Namespace) -> Report:
    r = Report(
        "Faust app through churn: Faust's assignor vs streamassign.faust",
        [
            "step",
            "assignor",
            "source partitions per worker",
            "idle workers",
            "moves",
            "recovery records",
            "longest stop",
            "settled after",
        ],
        notes=(
            f"{args.partitions} source partitions, a `{args.store}` table with 1 standby, "
            f"{args.records:,} records over {args.keys:,} keys before the churn. "
            f"{args.repeats} run(s) per assignor, alternating, on the same broker: partitions "
            "per worker of the first run; idle workers, moves, recovery records and times are "
            "medians over the runs."
        ),
    )
    names = [s.name for s in next(iter(results.values()))[0]]
    for i, name in enumerate(names):
        for assignor, runs in results.items():
            steps = [run[i] for run in runs]
            r.add(
                name,
                ASSIGNORS[assignor],
                " ".join(f"{w}:{n}" for w, n in steps[0].actives.items()),
                f"{median([sum(n == 0 for n in s.actives.values()) for s in steps]):g}",
                f"{median([s.moves for s in steps]):g}",
                f"{median([s.recovered for s in steps]):,.0f}",
                f"{median([s.longest_stop for s in steps]):.2f} s",
                f"{median([s.settled_after for s in steps]):.1f} s",
            )
    return r


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", help="use this Kafka broker instead of starting one")
    parser.add_argument("--markdown", type=Path, help="write the results section into this file")
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--keys", type=int, default=600)
    parser.add_argument("--records", type=int, default=12_000)
    parser.add_argument("--store", default="rocksdb://", help="the table's store")
    parser.add_argument("--repeats", type=int, default=3, help="runs per assignor")
    args = parser.parse_args(argv)
    info = machine_info()
    for key, value in info.items():
        console.print(f"[bold]{key}[/]: {value}")
    results: dict[str, list[list[Step]]] = {a: [] for a in ASSIGNORS}
    with (
        kafka_broker(args.bootstrap) as (bootstrap, where),
        tempfile.TemporaryDirectory() as tmp,
    ):
        for run in range(args.repeats):
            order = list(ASSIGNORS) if run % 2 == 0 else list(reversed(ASSIGNORS))
            for assignor in order:
                results[assignor].append(run_churn(bootstrap, assignor, Path(tmp), args))
    table = report(results, args)
    table.show()
    if args.markdown:
        command = " ".join(["python benchmarks/faust_app.py", *_portable(argv or sys.argv[1:])])
        body = [
            f"Generated by `{command}` on {info['date']}. {where}.",
            "",
            *(f"- **{key}**: {value}" for key, value in info.items() if key != "date"),
            "",
            table.markdown(),
        ]
        write_section(args.markdown, SECTION, "\n".join(body))
        console.print(f"wrote section {SECTION!r} of {args.markdown}")
    return 0


def _portable(argv: Sequence[str]) -> list[str]:
    """``argv`` with paths inside the checkout made relative to it (a run from another worktree
    or a temporary directory must not leak that path into the docs)."""
    out = []
    for arg in argv:
        path = Path(arg)
        if path.is_absolute() and path.resolve().is_relative_to(ROOT):
            arg = str(path.resolve().relative_to(ROOT))
        out.append(arg)
    return out


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the workers on the way out
    sys.exit(main())
