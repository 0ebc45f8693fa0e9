"""Orders joined with customers on the streamassign runtime (see README.md).

    python -m examples.orders_join --bootstrap 127.0.0.1:9092

Two application processes (two ``App``s, each with its own state directory and so its own
process id, run in this one Python process for a one-command demo) share the join; the
customer table has one standby.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from streamassign.errors import ExtraVersionError

try:  # without the runtime extra: one line naming what is missing, not a trace
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    from streamassign.runtime import App

    from ..demo import count, create_topics, run
    from .join import EnrichOrders, join_topology
except ExtraVersionError as exc:  # installed, but too old: its line says which, and the fix
    sys.exit(f"error: {exc}")
except ModuleNotFoundError as exc:
    sys.exit(f"error: {exc.name} is not installed: pip install 'streamassign[runtime]'")

PARTITIONS = 4


async def produce(
    bootstrap: str, orders: str, customers: str, n_orders: int, n_customers: int
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=10)
    await producer.start()
    try:
        for c in range(n_customers):
            value = {"id": c, "name": f"customer {c}", "tier": ["gold", "silver"][c % 2]}
            await producer.send(customers, json.dumps(value).encode(), key=b"c%d" % c)
        await producer.flush()  # customers first, so the orders find them
        for o in range(n_orders):
            value = {"order": o, "amount": 10 + o % 90}
            await producer.send(orders, json.dumps(value).encode(), key=b"c%d" % (o % n_customers))
        await producer.flush()
    finally:
        await producer.stop()


async def read_back(bootstrap: str, topic: str, count: int, timeout: float) -> list[Any]:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        isolation_level="read_committed",  # with exactly_once: committed transactions only
    )
    await consumer.start()
    out: list[Any] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        while len(out) < count and loop.time() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                out.extend(json.loads(r.value) for r in records)
    finally:
        await consumer.stop()
    return out


async def main() -> int:
    """Run the demo; the exit status is 1 if fewer orders came out than went in."""
    ap = argparse.ArgumentParser(
        prog="python -m examples.orders_join",  # not __main__.py: how the README runs it
        description="Orders joined with customers (streamassign runtime)",
    )
    ap.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers (host:port)")
    ap.add_argument("--orders", type=count(1), default=2000)
    ap.add_argument("--customers", type=count(1), default=100)
    ap.add_argument("--state-dir", default=None, help="default: a new temporary directory")
    ap.add_argument(
        "--guarantee", choices=["at_least_once", "exactly_once"], default="at_least_once"
    )
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

    run = uuid.uuid4().hex[:6]  # fresh names per run: the demo can be repeated on one broker
    orders, customers, output = f"orders-{run}", f"customers-{run}", f"orders-enriched-{run}"
    topology = join_topology(f"orders-join-{run}", orders, customers, output)
    state_root = Path(args.state_dir or tempfile.mkdtemp(prefix="orders-join-"))
    apps = [
        App(
            topology,
            {0: lambda: EnrichOrders(customers, output)},
            bootstrap_servers=args.bootstrap,
            state_dir=state_root / f"process-{i}",
            num_standby_replicas=1,
            processing_guarantee=args.guarantee,
            consumer_config={"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000},
        )
        for i in range(2)
    ]  # before any topic exists: a missing extra fails here, naming it
    try:
        await create_topics(args.bootstrap, dict.fromkeys([orders, customers, output], PARTITIONS))
    except BaseException:
        for app in apps:  # never started: this releases their state directories
            await app.stop()
        raise
    for app in apps:
        await app.start()
    try:
        await produce(args.bootstrap, orders, customers, args.orders, args.customers)
        enriched = await read_back(args.bootstrap, output, args.orders, timeout=60)
        for i, app in enumerate(apps):
            print(
                f"process {i}: active {sorted(map(str, app.active_tasks))}, "
                f"standby {sorted(map(str, app.standby_tasks))}"
            )
    finally:
        for app in apps:
            await app.stop()  # raises nothing: a failed step is kept in app.failure
    for i, app in enumerate(apps):
        if app.failure is not None:
            print(f"error: process {i} failed: {app.failure!r}", file=sys.stderr)
            return 1
    joined = sum(1 for e in enriched if e["customer"] is not None)
    print(f"{len(enriched)} enriched orders in {output} ({joined} found their customer), e.g.:")
    for e in enriched[:3]:
        print("   ", json.dumps(e))
    if len(enriched) < args.orders:
        print(f"error: only {len(enriched)} of {args.orders} orders came out", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    run(main)
