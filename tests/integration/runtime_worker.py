"""One runtime process (``streamassign.runtime.App``) in its own OS process, for the tests.

The application sums integer values per key: source topic ``--source``, store ``totals``
(value ``b"<count>,<sum>"``), so the expected final table is computable from what was
produced. Prints JSON lines: ``restore`` for every restore of an active task, ``status`` twice a
second (running actives as ``active``, actives still ``restoring``, processed and skipped
counts, wall time ``t``), and on SIGTERM ``table`` per running active task (its store
content) before a clean stop. SIGUSR1 requests the shutdown of the whole
application (every process then dumps its tables and stops). SIGUSR2 stops every commit and
prints ``holding`` once none is under way (what the process writes from then on is never
committed: a kill -9 then leaves a tail, or open transactions). SIGHUP arms a freeze: the next
commit with writes, once its changelog end check has passed, prints ``freezing`` and stops the
process (SIGSTOP to itself) before it sends its markers; SIGCONT goes on from there (see
``freeze_before_markers``). SIGKILL is a crash. With
``--preloaded-prefix`` the keys of a preloaded changelog (``preloaded_value``) are checked in
the process and only counted (``preloaded``: count and wrong values) in place of their
items. ``--ha`` turns the high-availability assignor on (``--probing-ms``, ``--lag``,
``--warmups``); status lines also list the warmups (``warmup``, a subset of ``standby``), the
rebalances seen and the changelog end offsets the process would lead with (``ends``, HA only).
``--session-ms`` sets the consumer session timeout; ``--restore-delay-us`` makes every cold
restore of active tasks (from offset 0) last that much longer per changelog record read,
blocking the event loop as a restore inside the rebalance callback did (see ``slow_restores``),
long enough for a short session timeout to evict the member mid-restore, while restores of a
tail stay as fast as they are. ``--endpoint host:port`` serves interactive queries there
(``QueryServer``). ``--guarantee exactly_once`` runs the app with transactions; ``--output``
makes every input record send one output record (its key; value
``<partition>:<offset>:<count>,<sum>``, the input record and the total it made).
``--join CUSTOMERS`` runs the orders/customers join of ``examples/orders_join`` instead
(orders from ``--source``, enriched orders to ``--output``, tables of store
``customers-table``). ``--stall P:O:S`` makes the processor await on input record P@O (the
first time) until its task moved to another consumer, at most S seconds (``stall`` and
``stalled`` lines); ``--max-poll-ms`` sets the consumers' ``max_poll_interval_ms`` (a consumer
that calls no ``getmany`` for that long leaves the group). ``--cleanup-ms`` sets
``state_cleanup_delay_ms``; status lines then also list the tasks the process reports local
state of (``local``: its offset sums).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from examples.orders_join.join import EnrichOrders, join_topology
from streamassign import Subtopology, TaskId, TopicPartition, Topology
from streamassign.errors import StartStoppedError
from streamassign.runtime import App, QueryServer, Record, TaskContext


class Totals:
    #: Topic to send one record per input record to (None: no output).
    output: str | None = None
    #: ``--stall``: (partition, offset, longest wait): the first time that input record is
    #: processed, its processor awaits (a slow lookup, say) until its task moved to another
    #: consumer (``moved``) and the consumer it moved to has finished a batch since with the
    #: record's partition in it or paused (``sibling_batches``), at most the longest wait.
    stall: tuple[int, int, float] | None = None
    moved: Callable[[TaskId, int], bool] | None = None
    owner: Callable[[TaskId], int | None] | None = None
    #: (consumer, partition) being stalled on, and the batches of its siblings since the move.
    stalled_on: tuple[int, int] | None = None
    sibling_batches = 0

    async def process(self, ctx: TaskContext, record: Record) -> None:
        stall = Totals.stall
        if stall is not None and (record.partition, record.offset) == stall[:2]:
            Totals.stall = None
            await self._stall(ctx.task_id, record.partition, stall[2])
        table = ctx.store("totals")
        key = record.key or b""
        old = table.get(key)
        count, total = map(int, old.split(b",")) if old else (0, 0)
        new = b"%d,%d" % (count + 1, total + int(record.value or b"0"))
        table.put(key, new)
        if self.output is not None:
            ctx.send(self.output, b"%d:%d:%s" % (record.partition, record.offset, new), key=key)

    async def _stall(self, task: TaskId, partition: int, longest: float) -> None:
        assert Totals.moved is not None and Totals.owner is not None
        consumer = Totals.owner(task)
        assert consumer is not None
        emit(event="stall", task=str(task), consumer=consumer, t=time.time())
        assert Totals.stall is None
        Totals.stalled_on = (consumer, partition)
        deadline = time.monotonic() + longest
        while time.monotonic() < deadline and not (
            Totals.moved(task, consumer) and Totals.sibling_batches > 0
        ):
            await asyncio.sleep(0.05)
        Totals.stalled_on = None
        emit(
            event="stalled",
            task=str(task),
            moved=Totals.moved(task, consumer),
            sibling_batches=Totals.sibling_batches,
            t=time.time(),
        )


def watch_siblings(app: App, task: TaskId) -> None:
    """Count in ``Totals.sibling_batches`` the batches a consumer finishes, once ``task`` moved
    to it from the stalled consumer, with the stalled partition in them or paused: the
    chances the sibling had to process the stalled record while it was stalled."""
    process_batch = app._processing.process_batch

    async def counting(index: int, consumer: Any, batch: Any, *args: Any) -> None:
        on = Totals.stalled_on
        assert Totals.moved is not None
        chance = (
            on is not None
            and index != on[0]
            and Totals.moved(task, on[0])
            and any(tp.partition == on[1] for tp in [*batch, *consumer.paused()])
        )
        await process_batch(index, consumer, batch, *args)
        if chance:
            Totals.sibling_batches += 1

    app._processing.process_batch = counting  # type: ignore[method-assign]


def slow_restores(app: App, seconds_per_record: float) -> None:
    """Every cold restore of ``app``'s actives blocks the event loop (no heartbeats, nothing
    processed) ``seconds_per_record`` per changelog record applied, step by step: as a restore
    inside the rebalance callback did before issue 21 §2, so a short session timeout evicts
    the member mid-restore and it goes on as a zombie until it notices."""
    updater = app._updater
    apply = updater._apply

    def slow(batch: Any) -> None:
        cold = 0
        for tp, records in batch.items():
            _, restore = updater._by_tp.get(TopicPartition(*tp), (None, None))
            if restore is not None and restore.start == 0:
                cold += len(records)
        apply(batch)
        time.sleep(cold * seconds_per_record)

    updater._apply = slow  # type: ignore[method-assign]


def freeze_before_markers(app: App) -> Callable[[], None]:
    """A freeze at the worst moment for a zombie's markers: the returned function arms it;
    the next commit with writes stops the process (SIGSTOP to itself) after its changelog end
    check passed and before its markers are sent, so woken (SIGCONT) it sends them at once."""
    commits = app._commits
    write_markers = commits.write_markers
    armed = False

    async def freezing(index: int, tasks: Any, *rest: Any) -> Any:
        nonlocal armed
        if armed and any(s.dirty for t in tasks for s in t.stores.values()):
            armed = False
            emit(event="freezing", consumer=index, t=time.time())
            os.kill(os.getpid(), signal.SIGSTOP)
        return await write_markers(index, tasks, *rest)

    def arm() -> None:
        nonlocal armed
        armed = True

    commits.write_markers = freezing  # type: ignore[method-assign]
    return arm


def preloaded_value(key: str) -> str:
    """The value a preloaded changelog record of ``key`` (``<prefix><p>-<j>``) holds."""
    return f"1,{int(key.rsplit('-', 1)[1]) % 100}"


async def start_unless_stopped(app: App, stop: asyncio.Event) -> bool:
    """``app.start()``, raced against SIGTERM (``stop``): a SIGTERM while starting (its broker
    gone, say, the start waiting for a first assignment) stops the app, which ends the
    start; False then (stopped). A failed start is stopped too (what it started is closed,
    as ``run()`` does), then raises."""
    starting = asyncio.ensure_future(app.start())
    signalled = asyncio.ensure_future(stop.wait())
    await asyncio.wait([starting, signalled], return_when=asyncio.FIRST_COMPLETED)
    signalled.cancel()
    if starting.done():
        if starting.exception() is not None:
            await app.stop()
        starting.result()
        return True
    emit(event="stopping", during="start", t=time.time())
    await app.stop()
    with contextlib.suppress(StartStoppedError):
        await starting  # (it may have ended just before the stop asked: then stopped above)
    return False


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
    ap.add_argument("--endpoint", default=None)
    ap.add_argument("--preloaded-prefix", default="")
    ap.add_argument("--guarantee", default="at_least_once")
    ap.add_argument("--output", default=None)
    ap.add_argument("--join", default=None)
    ap.add_argument("--stall", default=None, help="PARTITION:OFFSET:SECONDS (see Totals)")
    ap.add_argument("--max-poll-ms", type=int, default=None)
    ap.add_argument("--cleanup-ms", type=int, default=None)
    args = ap.parse_args()
    Totals.output = args.output
    if args.stall:
        partition, offset, seconds = args.stall.split(":")
        Totals.stall = (int(partition), int(offset), float(seconds))
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    topology = Topology([Subtopology(0, [args.source], stores=["totals"])], name=args.app)
    store, factory = "totals", Totals
    if args.join:
        topology = join_topology(args.app, args.source, args.join, args.output)
        store = "customers-table"

        def factory() -> EnrichOrders:
            return EnrichOrders(args.join, args.output)

    app = App(
        topology,
        {0: factory},
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
        endpoint=args.endpoint,
        processing_guarantee=args.guarantee,
        **({"state_cleanup_delay_ms": args.cleanup_ms} if args.cleanup_ms else {}),
        consumer_config={
            "session_timeout_ms": args.session_ms,
            "heartbeat_interval_ms": min(500, args.session_ms // 3),
            "metadata_max_age_ms": 1000,
            **({"max_poll_interval_ms": args.max_poll_ms} if args.max_poll_ms else {}),
        },
    )

    def owner(task: TaskId) -> int | None:
        active = app._actives.get(task)
        return None if active is None else active.consumer

    Totals.owner = owner
    Totals.moved = lambda task, consumer: owner(task) != consumer
    if Totals.stall is not None:  # the only subtopology: task 0_P reads partition P
        watch_siblings(app, TaskId(0, Totals.stall[0]))
    if args.restore_delay_us:
        slow_restores(app, args.restore_delay_us / 1e6)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    pending = set()  # SIGUSR1: request the shutdown of the whole application

    def request() -> None:
        pending.add(asyncio.ensure_future(app.request_shutdown()))

    loop.add_signal_handler(signal.SIGUSR1, request)

    async def no_commit(index: int) -> None:
        pass

    async def held() -> None:  # every consumer's lock taken once: no commit under way
        for lock in app._locks:
            async with lock:
                pass
        emit(event="holding", processed=app.processed, t=time.time())

    def hold() -> None:  # SIGUSR2: process on, commit no more (a kill -9 then has a tail)
        app._commits.commit = no_commit  # type: ignore[method-assign]
        pending.add(asyncio.ensure_future(held()))

    loop.add_signal_handler(signal.SIGUSR2, hold)
    loop.add_signal_handler(signal.SIGHUP, freeze_before_markers(app))
    queries = QueryServer(app) if args.endpoint else None
    if queries is not None:  # up before the group's host maps name this process
        await queries.start()
    if not await start_unless_stopped(app, stop):
        if queries is not None:
            await queries.stop()
        emit(event="stopped", failure=repr(app.failure) if app.failure else None)
        return
    reported = 0
    try:
        while not stop.is_set() and not app._stopped.is_set():
            # Far fewer restores than the App keeps here, so the count indexes them.
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
                active=sorted(map(str, app.active_tasks - app.restoring_tasks)),
                restoring=sorted(map(str, app.restoring_tasks)),
                standby=sorted(map(str, app.standby_tasks)),
                processed=app.processed,
                skipped=app.skipped,
                warmup=sorted(
                    str(t) for i in range(args.threads) for t in app.host.tasks(i).warmup
                ),
                rebalances=app.host.rebalances,
                ends={str(t): e for t, e in app.end_offsets().items()} if app.end_offsets else None,
                local=sorted(map(str, app.host.offset_sums())) if args.cleanup_ms else None,
                t=time.time(),
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), args.status_interval)
        for task in sorted(app.active_tasks - app.restoring_tasks):  # what it has restored
            items = {k.decode(): v.decode() for k, v in app.table(task, store).items()}
            if args.preloaded_prefix:  # checked here: millions of entries stay out of the pipe
                preloaded = {k: v for k, v in items.items() if k.startswith(args.preloaded_prefix)}
                wrong = [(k, v) for k, v in preloaded.items() if v != preloaded_value(k)]
                items = {k: v for k, v in items.items() if k not in preloaded}
                emit(event="preloaded", task=str(task), count=len(preloaded), wrong=wrong[:10])
            emit(event="table", task=str(task), items=items)
    finally:
        if queries is not None:
            await queries.stop()
        await app.stop()
    emit(event="stopped", failure=repr(app.failure) if app.failure else None)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
