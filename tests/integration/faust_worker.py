"""A Faust worker for the broker tests and the benchmark: counts records per key in a table.

    python faust_worker.py --bootstrap HOST:PORT --app APP --topic TOPIC --partitions N
        --datadir DIR --port PORT [--standbys 1] [--assignor ours|faust] [--log FILE]
        [--stateless] [--scheme kafka|streamassign] [--store memory://|rocksdb://]
        [--extra-topic TOPIC] [--side-topic TOPIC] [--repartition] [--no-declare] [--switch]
        [--start-when FILE] [--eos]

Each record's value is the key's sequence number (a JSON int; JSON-encoded str key). The agent
appends it to ``counts[key]``, the list of sequence numbers the key's records carried, in a
table with a changelog (in memory, or in RocksDB with ``--store rocksdb://``). A record
processed twice (at-least-once: a crash between the table update and the offset commit) shows
as a repeated number, a lost one as a missing number, so the content is checked exactly: the
distinct numbers must be ``0 .. n-1`` after ``n`` records per key. With ``--repartition``
the records pass first through a ``group_by`` repartition topic (same key). ``--side-topic``
adds a stateless agent reading another topic (its own topic group when its partition count
differs from the source's). ``--no-declare`` leaves creating the app's topics to the other
workers (it subscribes to them at once, created or not: a cold start's race made certain).
``GET /count/<key>/`` (``{"seqs": distinct sorted numbers, "records": records counted}``)
answers from the worker that owns the key (Faust's router forwards the request), so reading
through any worker exercises the assignor's host maps; ``GET /owner/<key>/`` is routed by the
source topic (``@app.topic_route``) and says whether the answering worker runs the key's
partition. ``--stateless`` drops the table (Faust then uses round robin unless the transport
is ``streamassign://``). The worker prints JSON lines on stdout:

* ``{"event": "state", ...}`` whenever its assignment or rebalancing flag changes: actives and
  standbys as ``[topic, partition]`` pairs, ``rebalancing``, the records recovery applied so
  far to active changelog partitions (``recovered``) and the group protocol in use;
* ``{"event": "rebalance", "start": t0, "end": t1}`` (wall clock) after every rebalance, as
  Faust's sensors see it: from revocation until the streams resume after recovery.

Its log (``--log``) carries audit lines (``AUDIT ...``) to trace a lost record: every source
offset committed, every source record acked without reaching the agent, every source record
Faust's flow control dropped unprocessed when it resumed after a rebalance
(``DROPPED_ON_RESUME``, which the tests assert never happens on ``streamassign://``), and with
``FAUST_WORKER_LOG_RECORDS=1`` every record the counting agent processed (partition@offset
key=number). ``--eos`` runs it with ``processing_guarantee="exactly_once"`` (Faust's
transactions).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from typing import Any

import faust
from faust.sensors import Monitor, Sensor

log = logging.getLogger("faust_worker")
#: ``FAUST_WORKER_LOG_RECORDS=1``: log every record the counting agent processes (diagnosis).
LOG_RECORDS = bool(os.environ.get("FAUST_WORKER_LOG_RECORDS"))

ASSIGNORS = {
    "ours": "streamassign.faust:PartitionAssignor",
    "faust": "faust.assignor:PartitionAssignor",
}


def emit(**fields: Any) -> None:
    print(json.dumps(fields, sort_keys=True), flush=True)


class RebalanceClock(Sensor):  # type: ignore[misc]
    """Reports every rebalance's start and end (Faust calls these on its sensors)."""

    def on_rebalance_start(self, app: Any) -> dict[str, float]:
        return {"start": time.time()}

    def on_rebalance_end(self, app: Any, state: dict[str, float]) -> None:
        emit(event="rebalance", start=state.get("start", time.time()), end=time.time())


class AckAudit(Sensor):  # type: ignore[misc]
    """Logs every event a stream acked without handing it to the agent (Faust acks an event it
    skips: one taken from a queue while flow control is suspended, or one fetched in an older
    consumer generation), the evidence for records lost around rebalances."""

    def __init__(self, app: faust.App, topics: set[str]) -> None:
        super().__init__()
        self.app, self.topics = app, topics
        self.handed: set[tuple[Any, int, int]] = set()

    def on_stream_event_in(self, tp: Any, offset: int, stream: Any, event: Any) -> None:
        if tp.topic in self.topics:
            self.handed.add((tp, offset, id(stream)))

    def on_stream_event_out(
        self, tp: Any, offset: int, stream: Any, event: Any, state: Any = None
    ) -> None:
        if tp.topic in self.topics and (tp, offset, id(stream)) not in self.handed:
            message = event.message
            log.warning(
                "AUDIT acked unprocessed %s[%d]@%d: message generation %s, app generation %s,"
                " flow control active %s",
                tp.topic, tp.partition, offset, message.generation_id,
                self.app.consumer_generation_id, self.app.flow_control.is_active(),
            )  # fmt: skip
        self.handed.discard((tp, offset, id(stream)))


def commit_log(topic: str) -> type[Monitor]:
    """Faust's monitor, also logging every offset of ``topic`` the consumer asks to commit:
    Faust calls ``on_tp_commit`` whether or not the commit succeeded (a refused or failed one
    too), so the line says what Faust recorded, not what the broker took."""

    class CommitLog(Monitor):  # type: ignore[misc]
        def on_tp_commit(self, tp_offsets: Any) -> None:
            super().on_tp_commit(tp_offsets)
            mine = {f"{tp.partition}": off for tp, off in tp_offsets.items() if tp.topic == topic}
            if mine:
                log.info("AUDIT commit asked (taken or not) %s", mine)

    return CommitLog


#: The log line of a record thrown away unprocessed when flow control resumed (see below).
DROPPED_ON_RESUME = "AUDIT resuming flow control dropped unprocessed records"


def audit_flow_control_resume(app: faust.App, topic: str) -> None:
    """Logs the source records Faust's flow control throws out of the agents' queues when it
    resumes after a rebalance's recovery (``FlowControlEvent.resume`` empties every queue).
    Records there were fetched after Faust resumed the source partitions and before that
    resume: they are dropped unprocessed, and the next commit can pass them (docs/faust.md,
    "Exactness"). Test instrumentation: wraps the app's instance."""
    flow_control = app.flow_control
    resume = flow_control.resume

    def audited_resume() -> None:
        dropped = sorted(
            (item.message.partition, item.message.offset)
            for queue in list(flow_control._queues)
            for item in list(getattr(queue, "_queue", ()))
            if getattr(getattr(item, "message", None), "topic", None) == topic
        )
        if dropped:
            log.warning("%s (partition, offset): %s", DROPPED_ON_RESUME, dropped[:20])
        resume()

    flow_control.resume = audited_resume


def build(args: argparse.Namespace) -> faust.App:
    app = faust.App(
        args.app,
        broker=f"{args.scheme}://{args.bootstrap}",
        datadir=args.datadir,
        store=args.store,
        PartitionAssignor=ASSIGNORS[args.assignor],
        table_standby_replicas=args.standbys,
        topic_partitions=args.partitions,
        topic_replication_factor=1,
        web_host="127.0.0.1",
        web_bind="127.0.0.1",
        web_port=args.port,
        canonical_url=f"http://127.0.0.1:{args.port}",
        broker_session_timeout=6.0,
        broker_heartbeat_interval=1.0,
        broker_commit_interval=0.5,
        consumer_auto_offset_reset="earliest",
        table_cleanup_interval=3600.0,
        topic_allow_declare=not args.no_declare,
        Monitor=commit_log(args.topic),
        **({"processing_guarantee": "exactly_once"} if args.eos else {}),
    )
    topic = app.topic(
        args.topic,
        key_type=str,
        value_type=int,
        partitions=args.partitions,
        key_serializer="json",
        value_serializer="json",
    )
    recovered = [0]
    if args.extra_topic:  # a newer version of the app: one more topic, one more table
        seen = app.Table("seen", default=int, key_type=str, value_type=int)

        @app.agent(app.topic(args.extra_topic, partitions=args.partitions))
        async def extra(stream: Any) -> None:
            async for key, _value in stream.items():
                seen[str(key)] += 1

    if args.side_topic:  # a stateless side agent: its topic is a group of its own

        @app.agent(app.topic(args.side_topic))
        async def side(stream: Any) -> None:
            async for _event in stream:
                pass

    if args.stateless:

        @app.agent(topic)
        async def forward(stream: Any) -> None:
            async for _event in stream:
                pass

    else:
        _count_in_table(app, topic, recovered, args.port, args.repartition)
    last: list[Any] = [None]

    @app.timer(0.25)
    async def report() -> None:
        assignor = app.assignor
        state = {
            "actives": sorted(assignor.assigned_actives()),
            "standbys": sorted(assignor.assigned_standbys()),
            "rebalancing": bool(app.rebalancing),
            "recovered": recovered[0],
            "protocol": getattr(assignor, "protocol_in_use", "faust"),  # Faust's: always faust
        }
        if state != last[0]:
            last[0] = state
            emit(event="state", at=time.time(), **state)

    if not app.conf.debug:  # the /stats/ views (among them /stats/assignment/), as in debug
        app.web.blueprints.add("/stats/", "faust.web.apps.stats:blueprint")
    app.monitor  # noqa: B018 - create the monitor before adding our sensor next to it
    app.sensors.add(RebalanceClock())
    app.sensors.add(AckAudit(app, {args.topic}))
    audit_flow_control_resume(app, args.topic)
    return app


def _count_in_table(
    app: faust.App, topic: Any, recovered: list[int], port: int, repartition: bool
) -> None:
    """The counting agent, its table and the ``/count/<key>/`` view."""
    counts = app.Table("counts", default=list, key_type=str, value_type=None)  # JSON lists

    apply_batch = counts.apply_changelog_batch

    def counted(batch: Any) -> None:
        events = list(batch)
        recovered[0] += sum(1 for e in events if app.assignor.is_active(e.message.tp))
        apply_batch(events)

    counts.apply_changelog_batch = counted  # type: ignore[method-assign]

    @app.agent(topic)
    async def count(stream: Any) -> None:
        source = stream
        if repartition:  # through a repartition topic Faust creates (same key, same partition)
            stream = source.group_by(lambda _value: source.current_event.key, name="rekey")
        async for key, value in stream.items():
            counts[key] = [*counts[key], value]  # a new value: the table writes its changelog
            if LOG_RECORDS:
                # Through the repartition the event is the rekeyed stream's (the source's
                # own is None there).
                m = (stream.current_event or source.current_event).message
                log.info("AUDIT processed %d@%d %s=%s", m.partition, m.offset, key, value)

    @app.page("/count/{key}/")
    @app.table_route(table=counts, match_info="key")
    async def get_count(web: Any, request: Any, key: str) -> Any:
        seen = counts[key]
        return web.json(
            {"key": key, "seqs": sorted(set(seen)), "records": len(seen), "served_by": port}
        )

    @app.page("/owner/{key}/")
    @app.topic_route(topic=topic, match_info="key")
    async def get_owner(web: Any, request: Any, key: str) -> Any:
        """Routed by the source topic (``external_key_store``): says whether the worker that
        answers runs the key's partition."""
        tp = app.producer.key_partition(topic.get_topic_name(), topic.prepare_key(key, None)[0])
        return web.json({"key": key, "served_by": port, "active": app.assignor.is_active(tp)})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--app", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--datadir", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--standbys", type=int, default=1)
    parser.add_argument("--assignor", choices=sorted(ASSIGNORS), default="ours")
    parser.add_argument("--log", default=None)
    parser.add_argument("--stateless", action="store_true", help="no table: a plain agent")
    parser.add_argument("--scheme", default="kafka", help="broker URL scheme (transport)")
    parser.add_argument("--store", default="memory://", help="table store: memory:// or rocksdb://")
    parser.add_argument("--extra-topic", help="also read this topic into a table (a newer version)")
    parser.add_argument("--side-topic", help="also read this topic in a stateless agent")
    parser.add_argument(
        "--repartition", action="store_true", help="count through a group_by repartition topic"
    )
    parser.add_argument(
        "--no-declare", action="store_true", help="create no topics (other workers do)"
    )
    parser.add_argument(
        "--switch", action="store_true", help="STREAMASSIGN_FAUST_SWITCH=1: offer Faust's second"
    )
    parser.add_argument(
        "--start-when", metavar="FILE", help="import and build, then start once FILE exists"
    )
    parser.add_argument("--eos", action="store_true", help='processing_guarantee="exactly_once"')
    args = parser.parse_args()
    if args.switch:
        os.environ["STREAMASSIGN_FAUST_SWITCH"] = "1"
    app = build(args)
    worker = faust.Worker(
        app, loglevel=logging.INFO, logfile=args.log, redirect_stdouts=False, quiet=True
    )
    if args.start_when:  # a restart prepared while the old process still runs
        deadline = time.monotonic() + 120
        while not os.path.exists(args.start_when):
            if time.monotonic() > deadline:
                raise SystemExit(f"{args.start_when} never appeared")
            time.sleep(0.05)
    worker.execute_from_commandline()


if __name__ == "__main__":
    main()
