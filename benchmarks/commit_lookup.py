"""What the at-least-once commit's changelog end lookup costs: commit latency with and without it.

Before writing its markers, a commit with writes checks that nobody else wrote the task's
changelogs since (``Commits.sole_writer``): one ``ListOffsets`` request per commit and consumer
(``docs/runtime.md``, "Members that drop out of the group"). This runs one runtime ``App`` in
this process (one consumer, ``partitions`` tasks, a count per key in ``--store`` stores,
``commit_interval_ms=100``) while a producer feeds its input at a steady rate, and alternates
phases with the lookup (the product's path) and without it (``sole_writer`` reduced to its
membership check), ABAB, so drift of the machine's load hits both alike. Timed per commit that
wrote markers: the whole ``Commits.commit`` (record acks, the lookup, markers and their acks,
the local store writes, checkpoints, the input offset commit), and each lookup alone.

Run ``python benchmarks/commit_lookup.py [--quick] [--markdown docs/runtime.md]
[--bootstrap H:P]``; without ``--bootstrap`` a broker is started through ``scripts/kafka.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import Report, arguments, machine_info, on_broker, publish

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from aiokafka import AIOKafkaProducer  # noqa: E402
from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # noqa: E402

from streamassign import Subtopology, Topology  # noqa: E402
from streamassign.runtime import App, TaskContext  # noqa: E402

SECTION = "commit-lookup"
MODES = ("with lookup", "without lookup")


@dataclasses.dataclass(frozen=True)
class Config:
    partitions: int
    rate: int  # input records per second
    phase_seconds: float
    phases: int  # per mode


FULL = Config(partitions=4, rate=2000, phase_seconds=15.0, phases=3)
QUICK = Config(partitions=4, rate=1000, phase_seconds=5.0, phases=1)


class Count:
    async def process(self, ctx: TaskContext, record: Any) -> None:
        table = ctx.store("counts")
        table.put(record.key, b"%d" % (int(table.get(record.key) or b"0") + 1))


async def feed(bootstrap: str, topic: str, rate: int, stop: asyncio.Event) -> int:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    sent, started = 0, time.monotonic()
    try:
        while not stop.is_set():
            due = int((time.monotonic() - started) * rate)
            for _ in range(due - sent):
                await producer.send(topic, b"1", key=b"k%d" % (sent % 1000))
                sent += 1
            await asyncio.sleep(0.01)
        await producer.flush()
    finally:
        await producer.stop()
    return sent


async def measure(cfg: Config, bootstrap: str, state_dir: Path, store: str) -> dict[str, Any]:
    name = f"commitbench-{uuid.uuid4().hex[:8]}"
    topic = f"{name}-in"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, cfg.partitions, 1)])
    finally:
        await admin.close()
    topology = Topology([Subtopology(0, [topic], stores=["counts"])], name=name)
    app = App(
        topology,
        {0: Count},
        bootstrap_servers=bootstrap,
        state_dir=state_dir,
        store_kind=store,  # type: ignore[arg-type]
        commit_interval_ms=100,
    )
    commits = app._commits
    mode = {"now": MODES[0]}
    samples: dict[str, list[float]] = {m: [] for m in MODES}
    lookups: list[float] = []
    product_sole_writer = commits.sole_writer
    product_ends = commits.lookups.ends
    product_commit = commits.commit

    async def membership_only(index: int, dirty: Sequence[Any]) -> bool:
        return not commits.lost(index)

    async def timed_ends(states: Any) -> Any:
        started = time.perf_counter()
        ends = await product_ends(states)
        lookups.append(time.perf_counter() - started)
        return ends

    async def timed_commit(index: int) -> None:
        dirty = any(
            s.dirty
            for t in app._actives.values()
            if t.consumer == index and not t.restoring and not t.torn
            for s in t.stores.values()
        )
        started = time.perf_counter()
        await product_commit(index)
        if dirty:
            samples[mode["now"]].append(time.perf_counter() - started)

    commits.lookups.ends = timed_ends  # type: ignore[method-assign]
    commits.commit = timed_commit  # type: ignore[method-assign]
    stop = asyncio.Event()
    await app.start()
    feeder = asyncio.create_task(feed(bootstrap, topic, cfg.rate, stop))
    try:
        deadline = time.monotonic() + 120
        while not app._actives or any(t.restoring for t in app._actives.values()):
            assert time.monotonic() < deadline, "the tasks never ran"
            await asyncio.sleep(0.1)
        await asyncio.sleep(2)  # warm up
        for _ in range(cfg.phases):
            for now in MODES:
                mode["now"] = now
                commits.sole_writer = (  # type: ignore[method-assign]
                    product_sole_writer if now == MODES[0] else membership_only
                )
                await asyncio.sleep(cfg.phase_seconds)
    finally:
        stop.set()
        sent = await feeder
        await app.stop()
    return {"samples": samples, "lookups": lookups, "sent": sent, "processed": app.processed}


def pct(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(cfg: Config, store: str, out: dict[str, Any]) -> Report:
    table = Report(
        f"Commit latency with and without the changelog end lookup ({store} stores)",
        ["commit", "commits", "p50", "p99", "mean"],
        notes=(
            f"One App, one consumer, {cfg.partitions} tasks (count per key, {store} stores), "
            f"commit_interval_ms=100, input at {cfg.rate:,} records/s; {cfg.phases} phase(s) of "
            f"{cfg.phase_seconds:g} s per mode, alternating; only commits that wrote markers. "
            f"{out['sent']:,} records sent, {out['processed']:,} processed."
        ),
    )
    rows = {**out["samples"], "the lookup alone (ListOffsets)": out["lookups"]}
    for name, samples in rows.items():
        if not samples:
            table.add(name, "0", "-", "-", "-")
            continue
        table.add(
            name,
            f"{len(samples):,}",
            f"{pct(samples, 0.5) * 1000:.2f} ms",
            f"{pct(samples, 0.99) * 1000:.2f} ms",
            f"{statistics.fmean(samples) * 1000:.2f} ms",
        )
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments(__doc__, SECTION, quick="short phases, one of each")
    parser.add_argument("--store", choices=["rocksdb", "memory"], default="rocksdb")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    info = machine_info()
    with on_broker(args.bootstrap, info) as (bootstrap, tmp):
        out = asyncio.run(measure(cfg, bootstrap, tmp, args.store))
    publish([report(cfg, args.store, out)], args, info, "benchmarks/commit_lookup.py", argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
