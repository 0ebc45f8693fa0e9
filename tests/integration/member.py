"""One consumer-group member in its own process, for the integration tests.

Prints one JSON line per completed rebalance: its member id, the assignment it observes and the
assignor's generation; when it led the rebalance, also the leader's inputs, so the test can run
the pure assignor on them and compare. Stops cleanly (LeaveGroup) on SIGTERM; SIGKILL is a crash.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener

from streamassign.aiokafka import GroupAssignor


def _round(assignor: GroupAssignor) -> dict[str, object] | None:
    r = assignor.last_round
    if r is None:
        return None
    return {
        "counts": dict(r.partitions_per_topic),
        "subscriptions": {
            m: {
                "topics": sorted(s.topics),
                "owned": [list(tp) for tp in s.owned_partitions],
                "generation": s.generation,
                "user_data": s.user_data.hex(),
            }
            for m, s in r.subscriptions.items()
        },
        "generation": r.generation,
    }


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--topics", required=True)
    ap.add_argument("--assignor", required=True)
    ap.add_argument("--priority", type=int, default=0)
    ap.add_argument("--weight", type=int, default=1)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--state-file", default=None)
    ap.add_argument("--garbage-user-data", action="store_true")
    args = ap.parse_args()

    options: dict[str, object] = {"priority": args.priority, "weight": args.weight}
    if args.seed is not None:
        options["seed"] = args.seed
    assignor = GroupAssignor.create(args.assignor, state_file=args.state_file, **options)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        partition_assignment_strategy=(assignor,),
        session_timeout_ms=3000,
        heartbeat_interval_ms=500,
        metadata_max_age_ms=2000,
        enable_auto_commit=False,
    )
    assignor.bind(consumer)
    if args.garbage_user_data:  # a buggy or foreign peer: unreadable subscription user data
        real = assignor.metadata

        def garbage(topics: object) -> object:
            meta = real(topics)
            meta.user_data = b"\xff\x00garbage"
            return meta

        assignor.metadata = garbage  # type: ignore[method-assign]

    class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
        async def on_partitions_revoked(self, revoked: object) -> None:
            pass

        async def on_partitions_assigned(self, assigned: object) -> None:
            coordinator = consumer._coordinator
            led = assignor.last_round
            line = {
                "member": coordinator.member_id,
                "generation": assignor.last_assignment.generation,
                "error": assignor.last_assignment.error_code.name,
                "followup": assignor.last_assignment.followup,
                "assigned": sorted([tp.topic, tp.partition] for tp in consumer.assignment()),
                "led": _round(assignor)
                if led is not None and led.generation == assignor.last_assignment.generation
                else None,
            }
            print(json.dumps(line), flush=True)

    consumer.subscribe(args.topics.split(","), listener=Listener())
    await consumer.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    try:
        while not stop.is_set():
            await consumer.getmany(timeout_ms=200)
    finally:
        await consumer.stop()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
