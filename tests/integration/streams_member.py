"""One streams process (a ProcessHost with N consumers) in its own OS process, for the tests.

Prints one JSON line per consumer per completed rebalance: the consumer's tasks, partitions,
aiokafka generation, error code and protocol version. Writes a checkpoint for every active task
it gets (as a runtime would after restoring), so a restarted process reports local state.
SIGTERM stops it cleanly; SIGKILL is a crash.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time

from streamassign import TaskId, TopicPartition, Topology
from streamassign.aiokafka import ProcessHost, TaskListener
from streamassign.errors import ErrorCode


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topology", required=True)
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--standbys", type=int, default=0)
    ap.add_argument("--endpoint", default=None)
    ap.add_argument("--max-version", type=int, default=None)
    ap.add_argument("--garbage-user-data", action="store_true")
    ap.add_argument("--hostile-user-data", action="store_true")
    # 1 s finds topic changes fast; aiokafka's default (5 min) shows what the member does alone.
    ap.add_argument("--metadata-max-age-ms", type=int, default=1000)
    args = ap.parse_args()
    topology = Topology.load(args.topology)

    def checkpoint(tasks: frozenset[TaskId]) -> None:
        """Stand-in for a runtime restoring and processing: the local state of every task
        moves forward with time (one offset per 10 ms), checkpointed to disk."""
        offset = int(time.time() * 100)
        for t in tasks:
            changelogs = topology.changelog_topics(t.subtopology)
            host.state.write_checkpoint(  # every poll, like the runtime's commits: no fsync
                t, {TopicPartition(c, t.partition): offset for c in changelogs}, durable=False
            )

    class Listener(TaskListener):
        async def on_active_assigned(self, consumer: int, tasks: frozenset[TaskId]) -> None:
            checkpoint(tasks)

        async def on_standby_added(self, consumer: int, tasks: frozenset[TaskId]) -> None:
            checkpoint(tasks)

    options = {} if args.max_version is None else {"max_version": args.max_version}
    host = ProcessHost(
        topology,
        bootstrap_servers=args.bootstrap,
        state_dir=args.state_dir,
        threads=args.threads,
        endpoint=args.endpoint,
        num_standby_replicas=args.standbys,
        listener=Listener(),
        consumer_config={
            "session_timeout_ms": 3000,
            "heartbeat_interval_ms": 500,
            "metadata_max_age_ms": args.metadata_max_age_ms,
        },
        **options,
    )
    if args.garbage_user_data:  # a buggy or foreign peer: unreadable subscription user data
        for assignor in host.assignors:
            real = assignor.metadata

            def garbage(topics: object, real: object = real) -> object:
                meta = real(topics)  # type: ignore[operator]
                meta.user_data = b"\xff\x00garbage"
                return meta

            assignor.metadata = garbage  # type: ignore[method-assign]

    if args.hostile_user_data:  # 37 bytes claiming 2**20 previous actives (issue 25)
        claims = b"\x01\x00\x01\x00\xff\xff\x3f"  # subtopology 0: one run of 2**20
        hostile = (2).to_bytes(4, "big") * 2 + host.process_id.bytes + b"\x00\x00" + claims
        for assignor in host.assignors:
            real = assignor.metadata

            def greedy(topics: object, real: object = real) -> object:
                meta = real(topics)  # type: ignore[operator]
                meta.user_data = hostile + b"\x00" * 4  # nonce, error, rack, tags
                return meta

            assignor.metadata = greedy  # type: ignore[method-assign]

    report = host._assigned

    async def assigned(index: int) -> None:
        await report(index)
        assignor = host.assignors[index]
        consumer = host.consumers[index]
        tasks = host.tasks(index)
        line = {
            "process": str(host.process_id),
            "consumer": index,
            "generation": consumer._coordinator.generation,
            "error": host.errors.get(index, ErrorCode.NONE).name,
            "version": assignor.version,
            "common": assignor.info.common_version,
            "active": sorted(str(t) for t in tasks.active),
            "standby": sorted(str(t) for t in tasks.standby),
            "partitions": sorted([tp.topic, tp.partition] for tp in consumer.assignment()),
            "hosts": {h: sorted(map(str, ts)) for h, ts in host.host_info.active_by_host.items()},
            "assign_ms": assignor.last_assign_ms,
        }
        print(json.dumps(line), flush=True)

    host._assigned = assigned  # type: ignore[method-assign]
    await host.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        while not stop.is_set():
            await host.poll(200)
            checkpoint(
                frozenset().union(
                    *(host.tasks(i).active | host.tasks(i).standby for i in range(args.threads))
                )
            )
    finally:
        await host.stop()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
