"""The orders/customers join for ``benchmarks/runtime.py``: our runtime, or a bare aiokafka loop.

``--kind runtime`` runs ``streamassign.runtime.App`` with the example's processor
(``examples/orders_join/join.py``); ``--kind bare`` does the same join in a plain aiokafka
consumer-group loop with a dict (no changelog, no standbys, no restore: the floor the runtime's
overhead is measured against; like the others it reads the customers of its assignment up to
their end before any order). Runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition

from examples.orders_join.join import EnrichOrders, join_topology
from streamassign.runtime import App

CONSUMER = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}


async def runtime(args: argparse.Namespace, stop: asyncio.Event) -> None:
    app = App(
        join_topology(args.app, args.orders, args.customers, args.output),
        {0: lambda: EnrichOrders(args.customers, args.output)},
        bootstrap_servers=args.bootstrap,
        state_dir=args.state_dir,
        store_kind=args.store,
        num_standby_replicas=args.standbys,
        processing_guarantee=args.guarantee,
        consumer_config=CONSUMER,
    )
    await app.start()
    try:
        await asyncio.wait(
            [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(app.wait())],
            return_when=asyncio.FIRST_COMPLETED,
        )
    finally:
        await app.stop()


class CustomersFirst(ConsumerRebalanceListener):
    """Holds the assigned orders back until the assigned customers are read up to the end
    offsets they had when the assignment came: a join must see a customer before the orders
    that need it (every customer is produced before any order), and one ``getmany`` over both
    topics would often fetch an order first."""

    def __init__(self, consumer: AIOKafkaConsumer, customers: str) -> None:
        self.consumer = consumer
        self.customers = customers
        self.ends: dict[TopicPartition, int] = {}  # customers partitions not read up to here

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        pass

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        assigned = list(assigned)
        self.consumer.pause(*(tp for tp in assigned if tp.topic != self.customers))
        customers = [tp for tp in assigned if tp.topic == self.customers]
        self.ends = dict(await self.consumer.end_offsets(customers))

    async def release(self) -> None:
        """Resume the orders once every customers partition reached its end offset."""
        for tp, end in list(self.ends.items()):
            if await self.consumer.position(tp) >= end:
                del self.ends[tp]
        if not self.ends:  # (nothing is paused after that: a no-op)
            self.consumer.resume(*self.consumer.paused())


async def bare(args: argparse.Namespace, stop: asyncio.Event) -> None:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=args.bootstrap,
        group_id=args.app,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **CONSUMER,
    )
    customers_first = CustomersFirst(consumer, args.customers)
    consumer.subscribe([args.orders, args.customers], listener=customers_first)
    producer = AIOKafkaProducer(bootstrap_servers=args.bootstrap, acks="all", linger_ms=5)
    await producer.start()
    await consumer.start()
    table: dict[bytes, bytes] = {}
    loop = asyncio.get_running_loop()
    next_commit = loop.time() + 1
    futures = []
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=100)
            for records in batch.values():
                for r in records:
                    if r.topic == args.customers:
                        table[r.key] = r.value
                        continue
                    order = json.loads(r.value)
                    customer = table.get(r.key)
                    order["customer"] = json.loads(customer) if customer else None
                    futures.append(
                        await producer.send(args.output, json.dumps(order).encode(), key=r.key)
                    )
            await customers_first.release()
            if loop.time() >= next_commit:
                await asyncio.gather(*futures)
                futures.clear()
                await consumer.commit()
                next_commit = loop.time() + 1
    finally:
        await consumer.stop()
        await producer.stop()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=["runtime", "bare"], required=True)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--app", required=True)
    ap.add_argument("--orders", required=True)
    ap.add_argument("--customers", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--store", default="memory")
    ap.add_argument("--standbys", type=int, default=0)
    ap.add_argument("--guarantee", default="at_least_once")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await (runtime if args.kind == "runtime" else bare)(args, stop)


if __name__ == "__main__":
    asyncio.run(main())
