"""Runtime benchmarks: the orders/customers join on our runtime and on faust-streaming, side by
side on the same broker in the same run, each worker in its own OS process.

1. **Throughput** — 4 co-partitioned partitions, C customers then N orders produced up front;
   one worker process joins them (table lookup, JSON in and out, one output record per order).
   Rate = output records / (last - first output timestamp), so start-up and the first
   rebalance are not counted; per-record cost = 1 / rate. Runners: a bare aiokafka loop doing
   the same join with a dict (no changelog, no commit protocol: the floor), our runtime with
   the in-memory store and with RocksDB, each at least once (the default) and exactly once
   (``processing_guarantee="exactly_once"``: a transaction per task and commit), and Faust
   with its memory store (changelog-backed table). Overhead = per-record cost minus the bare
   loop's. Outputs are read ``read_committed`` (the same as uncommitted for runners without
   transactions).
2. **Downtime per rebalance** — orders flow at a steady rate into one worker; a second worker
   process joins, later leaves (SIGTERM). Downtime = the longest interval without any output
   record (across the group) around each change; the steady-state longest interval is shown
   for reference.

Run ``python benchmarks/runtime.py [--quick] [--markdown docs/runtime.md] [--bootstrap H:P]
[--only KIND ...] [--section NAME]``; without ``--bootstrap`` a broker is started through
``scripts/kafka.py``. The at-least-once vs exactly-once table of docs/runtime.md is
``--only memory --only memory-eos --only rocksdb --only rocksdb-eos --section runtime-eos``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from _common import Report, arguments, chosen, console, machine_info, on_broker, publish
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SECTION = "runtime"
PARTITIONS = 4


@dataclasses.dataclass(frozen=True)
class Config:
    customers: int
    orders: int
    rate: int  # orders per second in the downtime runs
    warmup: float  # seconds of steady flow before the second worker starts
    phase: float  # seconds the second worker stays, and seconds after it leaves
    repeats: int


FULL = Config(customers=1000, orders=50_000, rate=1000, warmup=8, phase=15, repeats=2)
QUICK = Config(customers=200, orders=10_000, rate=500, warmup=5, phase=10, repeats=1)

try:
    FAUST = f"faust-streaming {version('faust-streaming')}"
except PackageNotFoundError:  # the runner then fails clearly when it starts
    FAUST = "faust-streaming (not installed)"

RUNNERS = {
    "bare aiokafka loop (dict; no changelog, no state)": "bare",
    "streamassign runtime, memory store": "memory",
    "streamassign runtime, RocksDB store": "rocksdb",
    "streamassign runtime, memory store, exactly once": "memory-eos",
    "streamassign runtime, RocksDB store, exactly once": "rocksdb-eos",
    f"{FAUST}, memory store": "faust",
    f"{FAUST}, memory store, exactly once": "faust-eos",
}


@dataclasses.dataclass
class Names:
    app: str
    orders: str
    customers: str
    output: str

    @classmethod
    def fresh(cls, kind: str) -> Names:
        run = f"{kind}-{uuid.uuid4().hex[:6]}"
        return cls(f"rtbench-{run}", f"orders-{run}", f"customers-{run}", f"enriched-{run}")


class Worker:
    """One worker process of a runner; its output goes to a log file in ``work``."""

    def __init__(self, kind: str, names: Names, bootstrap: str, work: Path, tag: str) -> None:
        self.log_path = work / f"{names.app}-{tag}.log"
        log = self.log_path.open("w")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        if kind.startswith("faust"):
            faust = [str(HERE / "_runtime_faust.py"), "worker", "--without-web", "-l", "warn"]
            argv = [sys.executable, *faust]
            env |= {
                "BENCH_BOOTSTRAP": bootstrap,
                "BENCH_APP": names.app,
                "BENCH_ORDERS": names.orders,
                "BENCH_CUSTOMERS": names.customers,
                "BENCH_OUTPUT": names.output,
                "BENCH_PARTITIONS": str(PARTITIONS),
                "BENCH_DATADIR": str(work / f"faust-{tag}"),
                "BENCH_GUARANTEE": "exactly_once" if kind.endswith("-eos") else "at_least_once",
            }
        else:
            argv = [
                sys.executable, str(HERE / "_runtime_ours.py"),
                "--kind", "bare" if kind == "bare" else "runtime",
                "--store", "rocksdb" if kind.startswith("rocksdb") else "memory",
                "--guarantee", "exactly_once" if kind.endswith("-eos") else "at_least_once",
                "--bootstrap", bootstrap, "--app", names.app,
                "--orders", names.orders, "--customers", names.customers,
                "--output", names.output, "--state-dir", str(work / f"state-{tag}"),
            ]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)

    def tail(self) -> str:
        """The end of the worker's output (for errors)."""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-15:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def create_topics(bootstrap: str, names: Names) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        topics = [names.orders, names.customers, names.output]
        await admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in topics])
    finally:
        await admin.close()


def order(i: int, customers: int) -> tuple[bytes, bytes]:
    return b"c%d" % (i % customers), json.dumps({"order": i, "amount": 10 + i % 90}).encode()


async def produce(bootstrap: str, names: Names, cfg: Config, orders: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 18)
    await producer.start()
    try:
        for c in range(cfg.customers):
            value = json.dumps({"id": c, "name": f"customer {c}", "tier": "gold"}).encode()
            await producer.send(names.customers, value, key=b"c%d" % c)
        for i in range(orders):
            key, value = order(i, cfg.customers)
            await producer.send(names.orders, value, key=key)
        await producer.flush()
    finally:
        await producer.stop()


async def feed(bootstrap: str, names: Names, cfg: Config, seconds: float) -> int:
    """Orders at ``cfg.rate`` per second for ``seconds``; returns how many were produced."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    sent = 0
    try:
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < seconds:
            due = int(elapsed * cfg.rate)
            for i in range(sent, due):
                key, value = order(i, cfg.customers)
                await producer.send(names.orders, value, key=key)
            sent = max(sent, due)
            await asyncio.sleep(0.01)
        await producer.flush()
    finally:
        await producer.stop()
    return sent


@dataclasses.dataclass
class Output:
    """What a runner produced: output timestamps (ms, set when the worker produced them,
    sorted), distinct orders seen, and how many of those carry their customer (joined)."""

    stamps: list[int]
    orders: int
    joined: int


async def read_output(
    bootstrap: str, topic: str, count: int, timeout: float, worker: Worker
) -> Output:
    """Outputs until ``count`` distinct orders are out (duplicates of an at-least-once
    runner included), the timeout passes, or ``worker`` exits."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        isolation_level="read_committed",  # what an exactly-once runner's readers see
    )
    await consumer.start()
    stamps: list[int] = []
    joined: dict[int, bool] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(joined) < count and time.monotonic() < deadline:
            if worker.proc.poll() is not None:
                break
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for r in records:
                    stamps.append(r.timestamp)
                    value = json.loads(r.value)
                    order_id = value["order"]
                    joined[order_id] = joined.get(order_id, False) or bool(value.get("customer"))
    finally:
        await consumer.stop()
    return Output(sorted(stamps), len(joined), sum(joined.values()))


async def throughput(kind: str, bootstrap: str, cfg: Config, work: Path) -> tuple[float, int]:
    """Output records per second of one worker over pre-produced input, and how many orders
    came out joined with their customer (all of them, when the runner is correct: every
    customer is produced before any order)."""
    names = Names.fresh(kind)
    await create_topics(bootstrap, names)
    await produce(bootstrap, names, cfg, cfg.orders)
    worker = Worker(kind, names, bootstrap, work, "t")
    try:
        out = await read_output(bootstrap, names.output, cfg.orders, 300, worker)
    finally:
        worker.stop()
    stamps = out.stamps
    if len(stamps) < 2:
        raise RuntimeError(f"{kind}: {out.orders} of {cfg.orders} orders out:\n{worker.tail()}")
    if out.orders < cfg.orders:  # shows in the `joined` column
        console.print(f"[red]{kind}: {cfg.orders - out.orders} orders never came out[/red]")
    rate = (len(stamps) - 1) / max((stamps[-1] - stamps[0]) / 1000, 1e-9)
    return rate, out.joined


def longest_gap(stamps: Sequence[int], start_ms: float, end_ms: float) -> float:
    """Longest interval (s) between consecutive outputs inside [start, end]."""
    inside = [s for s in stamps if start_ms <= s <= end_ms]
    edges = [start_ms, *inside, end_ms]
    return max(b - a for a, b in itertools.pairwise(edges)) / 1000


async def downtime(kind: str, bootstrap: str, cfg: Config, work: Path) -> tuple[float, ...]:
    """(steady, join, leave, missing): longest output gaps in seconds, orders never out."""
    names = Names.fresh(kind)
    await create_topics(bootstrap, names)
    await produce(bootstrap, names, cfg, 0)
    first = Worker(kind, names, bootstrap, work, "a")
    second: Worker | None = None
    total = cfg.warmup + 2 * cfg.phase
    try:
        flow = asyncio.create_task(feed(bootstrap, names, cfg, total))
        await asyncio.sleep(cfg.warmup)
        joined = time.time() * 1000
        second = Worker(kind, names, bootstrap, work, "b")
        await asyncio.sleep(cfg.phase)
        left = time.time() * 1000
        second.stop()
        sent = await flow
        ended = time.time() * 1000
        out = await read_output(bootstrap, names.output, sent, 120, first)
    finally:
        first.stop()
        if second is not None:
            second.stop()
    stamps = out.stamps
    if out.orders < sent:  # reported (the `missing` column), not hidden
        console.print(f"[red]{kind}: {sent - out.orders} of {sent} orders never came out[/red]")
    steady_from = joined - cfg.warmup * 500  # the second half of the warm-up
    return (
        longest_gap(stamps, steady_from, joined),
        longest_gap(stamps, joined, left),
        longest_gap(stamps, left, ended),
        sent - out.orders,
    )


async def run(
    cfg: Config, bootstrap: str, work: Path, only: Sequence[str] | None = None
) -> dict[str, dict[str, list[float]]]:
    results: dict[str, dict[str, list[float]]] = {}
    # Repeats outermost: each round runs every runner once, so load that drifts on a shared
    # machine spreads over all runners rather than favouring the ones that ran last; every
    # other round runs them in reverse, so no runner always goes first (a colder broker).
    rounds = [list(RUNNERS.items())[:: -1 if i % 2 else 1] for i in range(cfg.repeats)]
    for label, kind in itertools.chain.from_iterable(rounds):
        if only and kind not in only:
            continue
        got = results.setdefault(
            label,
            {"rate": [], "joined": [], "steady": [], "join": [], "leave": [], "missing": []},
        )
        console.print(f"[dim]{label}: throughput[/dim]")
        rate, joined = await throughput(kind, bootstrap, cfg, work)
        got["rate"].append(rate)
        got["joined"].append(joined)
        if kind == "bare":
            continue  # a plain group: no state, nothing to compare for rebalances
        console.print(f"[dim]{label}: downtime[/dim]")
        steady, join, leave, missing = await downtime(kind, bootstrap, cfg, work)
        got["missing"].append(missing)
        got["steady"].append(steady)
        got["join"].append(join)
        got["leave"].append(leave)
    return results


def report(results: dict[str, dict[str, list[float]]], cfg: Config) -> list[Report]:
    labels = {kind: label for label, kind in RUNNERS.items()}
    bare_run = results.get(labels["bare"])
    bare = statistics.median(bare_run["rate"]) if bare_run else None
    faust = results.get(labels["faust"])
    faust_rate = statistics.median(faust["rate"]) if faust else None
    speed = Report(
        f"Throughput: {cfg.orders:,} orders joined with {cfg.customers:,} customers, one worker",
        ["runner", "records/s", "µs per record", "overhead vs bare loop", "vs Faust", "joined"],
        notes=(
            "Median of "
            f"{cfg.repeats} run(s); rate over output timestamps (start-up excluded). "
            "`vs Faust`: our records/s divided by Faust's (> 1: faster). `joined`: orders "
            "that came out with their customer, fewest over the runs (every customer is "
            "produced before any order, so a correct join gets all)."
        ),
    )
    for label, got in results.items():
        rate = statistics.median(got["rate"])
        overhead = (
            "-" if bare is None or label == labels["bare"] else f"{1e6 / rate - 1e6 / bare:+.1f} µs"
        )
        speed.add(
            label,
            f"{rate:,.0f}",
            f"{1e6 / rate:.1f}",
            overhead,
            "-" if faust_rate is None else f"{rate / faust_rate:.2f}x",
            f"{int(min(got['joined'])):,} of {cfg.orders:,}",
        )
    pause = Report(
        f"Downtime per rebalance: {cfg.rate:,} orders/s; a second worker joins, then leaves",
        [
            "runner",
            "steady longest gap",
            "join: longest gap",
            "leave: longest gap",
            "vs Faust",
            "orders never out",
        ],
        notes=(
            "Longest interval with no output record anywhere in the group, median of "
            f"{cfg.repeats} run(s). `vs Faust`: Faust's join+leave downtime divided by ours "
            "(> 1: we pause less). `orders never out`: per run, orders produced that never "
            "reached the output (a correct at-least-once runner has none)."
        ),
    )
    faust_total = (
        statistics.median(faust["join"]) + statistics.median(faust["leave"]) if faust else None
    )
    for label, got in results.items():
        if not got["join"]:
            continue
        join, leave = statistics.median(got["join"]), statistics.median(got["leave"])
        pause.add(
            label,
            f"{statistics.median(got['steady']):.2f} s",
            f"{join:.2f} s",
            f"{leave:.2f} s",
            "-" if faust_total is None else f"{faust_total / (join + leave):.2f}x",
            ", ".join(str(int(m)) for m in got["missing"]),
        )
    return [speed, pause]


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments(
        __doc__, SECTION, quick="small sizes, one run each", repeats="runs of each measurement"
    )
    parser.add_argument(
        "--only", choices=sorted(RUNNERS.values()), action="append", help="run only these"
    )
    args = parser.parse_args(argv)
    cfg = chosen(args, QUICK, FULL)
    info = machine_info()
    with on_broker(args.bootstrap, info) as (bootstrap, tmp):
        results = asyncio.run(run(cfg, bootstrap, tmp, args.only))
    publish(report(results, cfg), args, info, "benchmarks/runtime.py", argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
