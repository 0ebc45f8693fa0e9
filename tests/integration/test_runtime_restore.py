"""Restores outside the rebalance (issue 21 §2) on a real broker: a cold restore much longer
than the session timeout evicts nobody.

One process (one consumer, a 3 s session timeout) starts on a changelog preloaded with
distinct keys (compaction cannot shrink it): three tasks have large changelogs, three small
ones. The state updater restores them in the processing loop with their input paused, so
heartbeats go on: the member is never evicted and the group never rebalances again (one
assignment in all), the tasks with small changelogs process their input while the large ones
restore, and the final tables are exact (the preloaded keys, checked in the process, and the
table computed from the input).

Size: ``STREAMASSIGN_RESTORE_RECORDS`` changelog records in all (default 1,500,000, so that the
restore outlasts the session timeout also on an idle machine, where restores run several times
faster than the 56-106k records/s measured at load 20; the long mode
``STREAMASSIGN_RESTORE_RECORDS=3000000`` is issue 21's size), see docs/testing.md.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

from aiokafka import AIOKafkaProducer

from streamassign import Subtopology, Topology
from streamassign.runtime import COMMIT_KEY, ensure_internal_topics
from streamassign.runtime.changelog import encode_marker

from .test_runtime import (
    PARTITIONS,
    TASKS,
    TIMEOUT,
    Feeder,
    Runtime,
    expected_table,
    runtime_fixture,
    tables,
    wait_caught_up,
)

RECORDS = int(os.environ.get("STREAMASSIGN_RESTORE_RECORDS", "1500000"))
LARGE = (0, 1, 2)  # partitions (tasks 0_p) with large changelogs
SMALL_RECORDS = 1_000  # records in each other changelog partition
PREFIX = "pre"
SESSION_MS = 3000


runtime = runtime_fixture("restore")


def changelog_sizes() -> dict[int, int]:
    small = SMALL_RECORDS * (PARTITIONS - len(LARGE))
    large = (RECORDS - small) // len(LARGE)
    return {p: large if p in LARGE else SMALL_RECORDS for p in range(PARTITIONS)}


async def preload(bootstrap: str, app: str, source: str, sizes: dict[int, int]) -> float:
    """Distinct keys ``pre<p>-<j>`` (value ``1,<j % 100>``) in full batches, each batch
    closed by a commit marker; returns the seconds it took."""
    started = time.monotonic()
    topology = Topology([Subtopology(0, [source], stores=["totals"])], name=app)
    await ensure_internal_topics(topology, bootstrap)
    changelog = topology.changelog_topic("totals")
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, max_batch_size=1 << 20, max_request_size=4 << 20
    )
    await producer.start()
    marker = encode_marker({})
    try:
        futures = []
        for p, n in sizes.items():
            j = 0
            while j < n:
                batch = producer.create_batch()
                while j < n:
                    key, value = f"{PREFIX}{p}-{j}".encode(), f"1,{j % 100}".encode()
                    if batch.append(key=key, value=value, timestamp=None) is None:
                        break
                    j += 1
                futures.append(await producer.send_batch(batch, changelog, partition=p))
                closing = producer.create_batch()
                closing.append(key=COMMIT_KEY, value=marker, timestamp=None)
                futures.append(await producer.send_batch(closing, changelog, partition=p))
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return time.monotonic() - started


def test_a_cold_restore_longer_than_the_session_timeout_evicts_nobody(runtime: Runtime) -> None:
    total = 20_000
    sizes = changelog_sizes()
    produced_in = asyncio.run(preload(runtime.bootstrap, runtime.app, runtime.source, sizes))
    feeder = Feeder(runtime.bootstrap, runtime.source, total, chunk=500, pause=0.2)
    feeder.start()
    runtime.args = [
        "--status-interval", "0.2",
        "--session-ms", str(SESSION_MS),
        "--standbys", "0",
        "--preloaded-prefix", PREFIX,
    ]  # fmt: skip
    runtime.start("p1")
    deadline = time.monotonic() + TIMEOUT + RECORDS / 20_000
    while len(runtime.events("p1", "restore")) < len(TASKS):
        assert time.monotonic() < deadline, "the restores did not finish"
        assert runtime.procs["p1"].proc.poll() is None, "the process died"
        time.sleep(0.2)
    restores = {e["task"]: e for e in runtime.events("p1", "restore")}
    feeder.finish()
    wait_caught_up(runtime.bootstrap, runtime.app, runtime.source)
    status = runtime.events("p1", "status")
    # Read before the stop: dumping millions of keys at SIGTERM blocks the loop for seconds.
    log = (runtime.tmp / "p1.log").read_text()
    done = runtime.procs.pop("p1")
    done.proc.send_signal(signal.SIGTERM)
    done.proc.wait(timeout=30 + RECORDS / 20_000)  # checks every preloaded key first
    done.drain()

    # Restored in the loop: longer than the session timeout (the point of the test), no eviction.
    large = [restores[f"0_{p}"] for p in LARGE]
    seconds = max(e["seconds"] for e in large)
    records = sum(e["records"] for e in restores.values())
    assert {e["source"] for e in restores.values()} == {"cold"}
    assert records >= RECORDS  # data and markers
    assert seconds * 1000 > SESSION_MS, f"the restore took only {seconds:.1f} s: size it up"
    for sign in ("left the group (evicted)", "was out of the group", "Heartbeat session expired"):
        assert sign not in log
    assert max(s["rebalances"] for s in status) == 1, "the group rebalanced again"
    # The tasks with small changelogs processed their input while the large ones restored.
    last_restored = max(e["t"] for e in large)
    assert any(s["processed"] > 0 and s["t"] < last_restored - 1 for s in status)

    # Exact tables: every preloaded key once, with its value, and the input's sums.
    preloaded = {line["task"]: line for line in done.lines if line["event"] == "preloaded"}
    assert set(preloaded) == TASKS
    assert {t: line["wrong"] for t, line in preloaded.items() if line["wrong"]} == {}
    assert sum(line["count"] for line in preloaded.values()) == sum(sizes.values())
    assert tables(done) == expected_table(total)
    rate = records / seconds
    print(
        f"\nproduced {sum(sizes.values()):,} changelog records in {produced_in:.1f} s; "
        f"restored {records:,} records (data and markers) in {seconds:.1f} s: "
        f"{rate:,.0f} records/s, session timeout {SESSION_MS / 1000:.0f} s, one assignment"
    )
