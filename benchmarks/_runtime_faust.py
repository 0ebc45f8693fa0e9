"""The orders/customers join as a faust-streaming app, for ``benchmarks/runtime.py``.

Run as a Faust worker process: ``python benchmarks/_runtime_faust.py worker -l warning``,
configured by environment variables (``BENCH_BOOTSTRAP``, ``BENCH_APP``, ``BENCH_ORDERS``,
``BENCH_CUSTOMERS``, ``BENCH_OUTPUT``, ``BENCH_PARTITIONS``, ``BENCH_DATADIR``,
``BENCH_GUARANTEE``: ``at_least_once``, the default, or ``exactly_once``). The same work per
record as our runtime's processor: the customer table in a Faust ``Table`` (memory store,
changelog-backed), each order joined with its customer and sent to the output topic.
"""

from __future__ import annotations

import json
import os

import faust

env = os.environ
app = faust.App(
    env["BENCH_APP"],
    broker=f"kafka://{env['BENCH_BOOTSTRAP']}",
    store="memory://",
    datadir=env.get("BENCH_DATADIR", "/tmp/faust-bench"),
    topic_partitions=int(env.get("BENCH_PARTITIONS", "4")),
    topic_replication_factor=1,
    web_enabled=False,
    consumer_auto_offset_reset="earliest",
    broker_session_timeout=6.0,
    broker_heartbeat_interval=1.0,
    # As our runtime: producer linger 5 ms, commit every second (Faust's defaults: 0 and 2.8 s).
    producer_linger=0.005,
    broker_commit_interval=1.0,
    processing_guarantee=env.get("BENCH_GUARANTEE", "at_least_once"),
)
orders = app.topic(env["BENCH_ORDERS"], key_type=bytes, value_type=bytes, value_serializer="raw")
customers = app.topic(
    env["BENCH_CUSTOMERS"], key_type=bytes, value_type=bytes, value_serializer="raw"
)
output = app.topic(env["BENCH_OUTPUT"], key_type=bytes, value_type=bytes, value_serializer="raw")
table = app.Table("customers-table", default=None, key_type=bytes, value_type=bytes)


@app.agent(customers)
async def on_customer(stream: faust.Stream) -> None:
    async for key, value in stream.items():
        table[key] = value


@app.agent(orders)
async def on_order(stream: faust.Stream) -> None:
    async for key, value in stream.items():
        order = json.loads(value)
        customer = table.get(key)
        order["customer"] = json.loads(customer) if customer else None
        # force: produce now, as our runtime does (Faust otherwise attaches the message to
        # the source offset and publishes it later, which would blur the output timestamps).
        await output.send(key=key, value=json.dumps(order).encode(), force=True)


if __name__ == "__main__":
    app.main()
