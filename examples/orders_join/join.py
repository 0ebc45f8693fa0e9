"""The orders/customers join of the example: its topology and its processor (imported by
``__main__`` and by ``benchmarks/runtime.py``)."""

from __future__ import annotations

import json

from streamassign import Subtopology, Topology
from streamassign.runtime import Record, TaskContext


def join_topology(app: str, orders: str, customers: str, output: str) -> Topology:
    """One subtopology reads both co-partitioned topics: task 0_p sees partition p of each."""
    return Topology(
        [Subtopology(0, [orders, customers], stores=["customers-table"], sink_topics=[output])],
        copartition_groups=[[orders, customers]],
        name=app,
    )


class EnrichOrders:
    """Customers fill the table; an order is joined with its customer (same key, same task)."""

    def __init__(self, customers_topic: str, output: str) -> None:
        self.customers_topic = customers_topic
        self.output = output

    async def process(self, ctx: TaskContext, record: Record) -> None:
        customers = ctx.store("customers-table")
        key = record.key or b""
        if record.topic == self.customers_topic:
            customers.put(key, record.value)
            return
        order = json.loads(record.value or b"{}")
        customer = customers.get(key)
        order["customer"] = json.loads(customer) if customer else None
        ctx.send(self.output, json.dumps(order).encode(), key=key)
