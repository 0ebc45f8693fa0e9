"""One runtime process (``streamassign.runtime.App``) in its own OS process, for the tests.

The application sums integer values per key: source topic ``--source``, store ``totals``
(value ``b"<count>,<sum>"``), so the expected final table is computable from what was
produced. Prints JSON lines: ``restore`` for every restore of an active task, ``status`` twice a
second (tasks, processed and skipped counts, wall time ``t``), and on SIGTERM ``table`` per
active task (its store content) before a clean stop. SIGUSR1 requests the shutdown of the whole
application (every process then dumps its tables and stops). SIGKILL is a crash. ``--ha`` turns
the high-availability assignor on (``--probing-ms``, ``--lag``, ``--warmups``); status lines
also list the warmups (``warmup``, a subset of ``standby``), the rebalances seen and the
changelog end offsets the process would lead with (``ends``, HA only). ``--session-ms`` sets the
consumer session timeout; ``--restore-delay-us`` makes every cold restore of active tasks (from
offset 0) last that much longer per changelog record read (an awaited sleep after it): a small
changelog restores cold as slowly as a large one would, long enough for a short session timeout
to evict the member mid-restore, while restores of a tail stay as fast as they are.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
import time
from typing import Any

from streamassign import Subtopology, Topology
from streamassign.runtime import App, Record, TaskContext


class Totals:
    async def process(self, ctx: TaskContext, record: Record) -> None:
        table = ctx.store("totals")
        key = record.key or b""
        old = table.get(key)
        count, total = map(int, old.split(b",")) if old else (0, 0)
        table.put(key, b"%d,%d" % (count + 1, total + int(record.value or b"0")))


def slow_restores(app: App, seconds_per_record: float) -> None:
    """Every cold restore of ``app``'s actives takes ``seconds_per_record`` longer per record."""
    restore = app._restorer.restore

    async def slow(states: Any) -> dict[int, int]:
        cold = {id(s) for s in states if s.position == 0}
        counts = await restore(states)
        await asyncio.sleep(sum(n for s, n in counts.items() if s in cold) * seconds_per_record)
        return counts

    app._restorer.restore = slow  # type: ignore[method-assign]


def emit(**line: object) -> None:
    print(json.dumps(line), flush=True)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--app", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--standbys", type=int, default=1)
    ap.add_argument("--store", default="rocksdb")
    ap.add_argument("--ha", action="store_true")
    ap.add_argument("--probing-ms", type=int, default=600_000)
    ap.add_argument("--lag", type=int, default=10_000)
    ap.add_argument("--warmups", type=int, default=2)
    ap.add_argument("--status-interval", type=float, default=0.5)
    ap.add_argument("--session-ms", type=int, default=3000)
    ap.add_argument("--restore-delay-us", type=int, default=0)
    args = ap.parse_args()
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    topology = Topology([Subtopology(0, [args.source], stores=["totals"])], name=args.app)
    app = App(
        topology,
        {0: Totals},
        bootstrap_servers=args.bootstrap,
        state_dir=args.state_dir,
        threads=args.threads,
        num_standby_replicas=args.standbys,
        store_kind=args.store,
        commit_interval_ms=200,
        high_availability=args.ha,
        acceptable_recovery_lag=args.lag,
        max_warmup_replicas=args.warmups,
        probing_rebalance_interval_ms=args.probing_ms,
        consumer_config={
            "session_timeout_ms": args.session_ms,
            "heartbeat_interval_ms": min(500, args.session_ms // 3),
            "metadata_max_age_ms": 1000,
        },
    )
    if args.restore_delay_us:
        slow_restores(app, args.restore_delay_us / 1e6)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    pending = set()  # SIGUSR1: request the shutdown of the whole application

    def request() -> None:
        pending.add(asyncio.ensure_future(app.request_shutdown()))

    loop.add_signal_handler(signal.SIGUSR1, request)

    def hold() -> None:  # SIGUSR2: process on, commit no more (a kill -9 then has a tail)
        app.commit_interval = 3600.0
        emit(event="holding", processed=app.processed, t=time.time())

    loop.add_signal_handler(signal.SIGUSR2, hold)
    await app.start()
    reported = 0
    try:
        while not stop.is_set() and not app._stopped.is_set():
            for event in app.restore_events[reported:]:
                emit(
                    event="restore",
                    task=str(event.task),
                    source=event.source,
                    start=event.start,
                    records=event.records,
                    compensated=event.compensated,
                    seconds=event.seconds,
                    t=time.time(),
                )
            reported = len(app.restore_events)
            emit(
                event="status",
                process=str(app.host.process_id),
                active=sorted(map(str, app.active_tasks)),
                standby=sorted(map(str, app.standby_tasks)),
                processed=app.processed,
                skipped=app.skipped,
                warmup=sorted(
                    str(t) for i in range(args.threads) for t in app.host.tasks(i).warmup
                ),
                rebalances=app.host.rebalances,
                ends={str(t): e for t, e in app.end_offsets().items()} if app.end_offsets else None,
                t=time.time(),
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), args.status_interval)
        for task in sorted(app.active_tasks):
            items = {k.decode(): v.decode() for k, v in app.table(task, "totals").items()}
            emit(event="table", task=str(task), items=items)
    finally:
        await app.stop()
    emit(event="stopped", failure=repr(app.failure) if app.failure else None)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
