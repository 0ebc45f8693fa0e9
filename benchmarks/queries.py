"""Interactive query latency of the runtime on a real broker: local vs routed vs standby.

Two runtime processes (``tests/integration/runtime_worker.py``: per key count and sum in
RocksDB, 6 tasks, one standby each), each serving queries on its endpoint (``QueryServer``);
``keys`` keys loaded first, no input during the measure. This process (a third OS process, one
keep-alive HTTP connection per process) reads random keys, each asked three ways in turn:

- **local active**: the process that runs the key's task (one HTTP request, one store read);
- **routed**: the other process, which forwards to the active's process (two HTTP hops);
- **local standby**: the other process with ``local=true&max_lag=...``: its standby answers
  (one HTTP request, one ``ListOffsets`` to the broker for the lag, one store read).

Latency is measured at the client, per request, sequentially (one request in flight).

Run ``python benchmarks/queries.py [--quick] [--markdown docs/runtime.md] [--bootstrap H:P]``;
without ``--bootstrap`` a broker is started through ``scripts/kafka.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import signal
import socket
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from _common import Report, arguments, chosen, console, machine_info, on_broker, publish

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
from aiokafka import AIOKafkaProducer  # noqa: E402
from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # noqa: E402

from streamassign.runtime import QueryClient, key_partition  # noqa: E402
from tests.integration.procs import JsonLinesProcess  # noqa: E402

SECTION = "queries"
WORKER = ROOT / "tests" / "integration" / "runtime_worker.py"
PARTITIONS = 6
MODES = ("local active", "routed", "local standby")


@dataclasses.dataclass(frozen=True)
class Config:
    keys: int
    requests: int  # per mode
    repeats: int


FULL = Config(keys=10_000, requests=3000, repeats=2)
QUICK = Config(keys=2000, requests=500, repeats=1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def load(bootstrap: str, topic: str, keys: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    await producer.start()
    try:
        futures = [await producer.send(topic, b"1", key=b"key%d" % i) for i in range(keys)]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def wait_ready(endpoints: list[str], keys: int, timeout: float = 180) -> dict[str, set[int]]:
    """Until every process answers every key (each processed once); the partitions each runs."""
    deadline = time.monotonic() + timeout
    sample = [b"key%d" % i for i in range(0, keys, max(1, keys // 200))]
    async with QueryClient(endpoints[0]) as client:
        while True:
            try:
                values = [await client.get("totals", k) for k in sample]
                owners: dict[str, set[int]] = {e: set() for e in endpoints}
                for v in values:
                    owners[v.served_by].add(v.partition)
                if all(v.value == b"1,1" for v in values) and all(owners.values()):
                    return owners
            except Exception as exc:  # not ready: no owner yet, restoring...
                console.print(f"waiting: {exc!r}"[:120])
            if time.monotonic() > deadline:
                raise TimeoutError("the processes did not get ready")
            await asyncio.sleep(1)


async def measure_once(endpoints: list[str], keys: int, requests: int) -> dict[str, list[float]]:
    owners = await wait_ready(endpoints, keys)
    out: dict[str, list[float]] = {m: [] for m in MODES}
    rng = random.Random(7)
    clients = {e: QueryClient(e) for e in endpoints}
    try:
        for _ in range(requests):
            key = b"key%d" % rng.randrange(keys)
            p = key_partition(key, PARTITIONS)
            active = next(e for e, ps in owners.items() if p in ps)
            other = next(e for e in endpoints if e != active)
            for mode, endpoint, options in (
                ("local active", active, {}),
                ("routed", other, {}),
                ("local standby", other, {"local": True, "max_lag": 10**9}),
            ):
                started = time.perf_counter()
                result = await clients[endpoint].get("totals", key, **options)  # type: ignore[arg-type]
                out[mode].append(time.perf_counter() - started)
                expected_role = "standby" if mode == "local standby" else "active"
                assert result.value == b"1,1" and result.role == expected_role, (mode, result)
                assert result.served_by == (other if mode == "local standby" else active)
    finally:
        for client in clients.values():
            await client.close()
    return out


def start_worker(bootstrap: str, app: str, state: Path, endpoint: str) -> JsonLinesProcess:
    args = ["--bootstrap", bootstrap, "--app", app, "--source", f"{app}-in"]
    args += ["--state-dir", str(state), "--standbys", "1", "--status-interval", "5"]
    return JsonLinesProcess(WORKER, [*args, "--endpoint", endpoint], log=state.with_suffix(".log"))


def run(cfg: Config, bootstrap: str, tmp: Path) -> dict[str, list[float]]:
    merged: dict[str, list[float]] = {m: [] for m in MODES}
    for i in range(cfg.repeats):
        name = f"queries-bench-{i}-{uuid.uuid4().hex[:8]}"
        asyncio.run(load(bootstrap, f"{name}-in", cfg.keys))
        endpoints = [f"127.0.0.1:{free_port()}" for _ in range(2)]
        procs = [
            start_worker(bootstrap, name, tmp / name / f"p{j}", e) for j, e in enumerate(endpoints)
        ]
        try:
            out = asyncio.run(measure_once(endpoints, cfg.keys, cfg.requests))
        finally:
            for proc in procs:
                proc.stop(signal.SIGTERM)
        for mode, samples in out.items():
            merged[mode] += samples
        console.print(f"run {i + 1}/{cfg.repeats}: " + summary(out))
    return merged


def pct(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(out: dict[str, list[float]]) -> str:
    return ", ".join(f"{m} p50 {pct(s, 0.5) * 1000:.2f} ms" for m, s in out.items())


def report(cfg: Config, out: dict[str, list[float]]) -> Report:
    table = Report(
        f"Query latency: {cfg.keys:,} keys, 6 tasks on 2 processes, one standby each",
        ["read", "requests", "p50", "p99", "mean", "vs local active (p50)"],
        notes=(
            f"{cfg.repeats} run(s), {cfg.requests:,} requests per read kind per run, "
            "interleaved, one at a time, from a client in its own process over HTTP "
            "keep-alive to 127.0.0.1 (aiohttp on both sides). Routed: asked the process "
            "without the task, which forwards to the active's. Local standby: "
            "`local=true&max_lag=...`, which reads the changelog end offset from the broker "
            "for the lag."
        ),
    )
    base = pct(out["local active"], 0.5)
    for mode in MODES:
        samples = out[mode]
        table.add(
            mode,
            f"{len(samples):,}",
            f"{pct(samples, 0.5) * 1000:.2f} ms",
            f"{pct(samples, 0.99) * 1000:.2f} ms",
            f"{statistics.fmean(samples) * 1000:.2f} ms",
            f"{pct(samples, 0.5) / base:.2f}x",
        )
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments(
        __doc__, SECTION, quick="small sizes, one run", repeats="runs (each with new processes)"
    )
    args = parser.parse_args(argv)
    cfg = chosen(args, QUICK, FULL)
    info = machine_info()
    with on_broker(args.bootstrap, info) as (bootstrap, tmp):
        out = run(cfg, bootstrap, tmp)
    publish([report(cfg, out)], args, info, "benchmarks/queries.py", argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
