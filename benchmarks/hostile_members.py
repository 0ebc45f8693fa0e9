"""What hostile subscriptions cost the streams leader: a clean round next to rounds in which some
members send a 37-byte subscription claiming ``2**20`` previous active tasks.

The group: a join topology (2 co-partitioned topics x 32 partitions, a store) and a stateless
subtopology (32 partitions), 96 tasks, 12 processes x 2 consumers, 1 standby. Each round is the
second rebalance of the group (members report their running tasks as ``LATEST_OFFSET``, their
standbys' offset sums and their previous actives), run through the leader's real entry point,
``StreamsAssignor.assign`` with aiokafka's structs. In the hostile rounds the first ``k`` members
(by id, each as a process of its own) send the hostile bytes instead of their own, so the group
is the same. Time: the best and the median of ``--repeats`` runs, the counts interleaved (the
machine's load changes hit them alike); memory: tracemalloc's peak over one more run
(tracemalloc slows a run, so it is not timed).

Run ``python benchmarks/hostile_members.py [--repeats N] [--hostile 0,1,4,8]
[--markdown docs/streams.md]``.
"""

from __future__ import annotations

import argparse
import gc
import logging
import statistics
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from _common import console, machine_info, write_section
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata
from rich.table import Table

from streamassign import Subtopology, TaskId, Topology
from streamassign.aiokafka import ProcessHost
from streamassign.protocol import LATEST_OFFSET, SubscriptionInfo
from streamassign.streams import MemberSubscription, assign_streams

TOPOLOGY = Topology(
    [
        Subtopology(0, ["orders", "customers"], stores=["joined"]),
        Subtopology(1, ["clicks"]),
    ],
    copartition_groups=[["orders", "customers"]],
    name="hostile-bench",
)
COUNTS = {"orders": 32, "customers": 32, "clicks": 32}
PROCESSES, THREADS, STANDBYS = 12, 2, 1


def hostile_subscription(pid: int) -> bytes:
    """37 bytes (version 2): no offset sums, one run of ``2**20`` previous actives of
    subtopology 0. Each decode charges them against ``MAX_TASK_IDS``, and before the rebalance
    budget the leader built them all: about 134 MB of task ids per member."""
    varint = bytes([0xFF, 0xFF, 0x3F])  # 2**20 - 1 (run length minus one)
    head = (2).to_bytes(4, "big") * 2 + uuid.UUID(int=pid).bytes
    body = b"\x00" + b"\x00" + b"\x01\x00\x01\x00" + varint + b"\x00\x00" + b"\x00\x00"
    return head + body


def clean_group() -> dict[str, ConsumerProtocolMemberMetadata]:
    """The group's second-round subscriptions: what its members report after a first round."""
    members = {
        f"p{p:02d}-c{c}": (p, SubscriptionInfo(uuid.UUID(int=p + 1), endpoint=f"host-{p:02d}:80"))
        for p in range(PROCESSES)
        for c in range(THREADS)
    }
    first = assign_streams(
        TOPOLOGY,
        COUNTS,
        {m: MemberSubscription(TOPOLOGY.source_topics, info) for m, (_, info) in members.items()},
        num_standby_replicas=STANDBYS,
    )
    by_process: dict[int, dict[TaskId, int]] = {}
    for m, (p, _) in members.items():
        sums = by_process.setdefault(p, {})
        sums.update(dict.fromkeys(first[m].info.standby, 1000))
        sums.update(dict.fromkeys(first[m].info.active, LATEST_OFFSET))
    out = {}
    for m, (p, info) in members.items():
        again = SubscriptionInfo(
            info.process_id,
            endpoint=info.endpoint,
            offset_sums=by_process[p],
            previous_active=first[m].info.active,
            join_nonce=2,
        )
        out[m] = ConsumerProtocolMemberMetadata(0, sorted(TOPOLOGY.source_topics), again.encode())
    return out


def with_hostile(
    group: Mapping[str, ConsumerProtocolMemberMetadata], k: int
) -> dict[str, ConsumerProtocolMemberMetadata]:
    out = dict(group)
    for n, m in enumerate(sorted(group)[:k]):  # each a process of its own
        out[m] = ConsumerProtocolMemberMetadata(
            0, group[m].subscription, hostile_subscription(1000 + n)
        )
    return out


def leader_round(host: ProcessHost, metas: Mapping[str, ConsumerProtocolMemberMetadata]) -> Any:
    cluster = SimpleNamespace(
        partitions_for_topic=lambda t: set(range(COUNTS[t])), leader_for_partition=lambda tp: None
    )
    out = host.assignors[0].assign(cluster, metas)
    assert set(out) == set(metas)
    return out


def timed(host: ProcessHost, metas: Mapping[str, ConsumerProtocolMemberMetadata]) -> float:
    gc.collect()
    start = time.perf_counter()
    leader_round(host, metas)
    return time.perf_counter() - start


def peak(host: ProcessHost, metas: Mapping[str, ConsumerProtocolMemberMetadata]) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        leader_round(host, metas)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def run(hostile: Sequence[int], repeats: int) -> list[tuple[int, float, float, int]]:
    """Per count of hostile members: (best, median seconds, tracemalloc peak bytes). The
    rounds are interleaved, so a change in the machine's load hits every count alike."""
    group = clean_group()
    rounds = {k: with_hostile(group, k) for k in hostile}
    times: dict[int, list[float]] = {k: [] for k in hostile}
    with tempfile.TemporaryDirectory() as state:
        host = ProcessHost(
            TOPOLOGY,
            bootstrap_servers="127.0.0.1:1",  # never started: only its assignor is used
            state_dir=state,
            num_standby_replicas=STANDBYS,
        )
        for _ in range(repeats):
            for k in hostile:
                times[k].append(timed(host, rounds[k]))
        peaks = {k: peak(host, rounds[k]) for k in hostile}
        host.state.close()
    return [(k, min(times[k]), statistics.median(times[k]), peaks[k]) for k in hostile]


def markdown(rows: Sequence[tuple[int, float, float, int]], info: Mapping[str, str]) -> str:
    clean = rows[0] if rows and rows[0][0] == 0 else None
    lines = [
        f"Measured by `python benchmarks/hostile_members.py` on {info.get('date', '?')} "
        f"({info.get('machine', '?')}, load average {info.get('load average at start', '?')}, "
        f"{info.get('streamassign', '?')}); {PROCESSES} processes x {THREADS} consumers, "
        f"96 tasks, {STANDBYS} standby.",
        "",
        "| hostile members (of 24) | leader `assign`, best | median | best vs clean "
        "| tracemalloc peak |",
        "| --- | --- | --- | --- | --- |",
    ]
    for k, best, median, peak_bytes in rows:
        ratio = f"{best / clean[1]:.2f}x" if clean else "-"
        lines.append(
            f"| {k} | {best * 1000:.1f} ms | {median * 1000:.1f} ms | {ratio} "
            f"| {peak_bytes / 1e6:.2f} MB |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--hostile", default="0,1,4,8", help="comma-separated counts")
    parser.add_argument("--markdown", type=Path, help="write the table into this file")
    args = parser.parse_args()
    logging.getLogger("streamassign").setLevel(logging.ERROR)  # one warning per hostile member
    counts = [int(k) for k in args.hostile.split(",")]
    rows = run(counts, args.repeats)
    table = Table("hostile members", "best", "median", "best vs clean", "tracemalloc peak")
    for k, best, median, peak_bytes in rows:
        ratio = f"{best / rows[0][1]:.2f}x" if rows[0][0] == 0 else "-"
        table.add_row(
            str(k),
            f"{best * 1000:.1f} ms",
            f"{median * 1000:.1f} ms",
            ratio,
            f"{peak_bytes / 1e6:.2f} MB",
        )
    console.print(table)
    if args.markdown:
        write_section(args.markdown, "hostile-members", markdown(rows, machine_info()))


if __name__ == "__main__":
    main()
