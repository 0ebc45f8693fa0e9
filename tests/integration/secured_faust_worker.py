"""A Faust worker on a secured broker, for test_secured.py: SASL_SSL with SCRAM-SHA-512 through
``broker_credentials``, the ``streamassign://`` transport and our assignor.

    python secured_faust_worker.py --bootstrap HOST:PORT --cafile CA.pem --user U
        --password P --app APP --topic TOPIC --datadir DIR --log FILE

A stateless agent reads TOPIC and prints one JSON line per record on stdout
(``{"event": "record", "partition": p, "offset": o}``); the worker's log goes to FILE. It
serves no web port: none is needed, and a port chosen free beforehand may be taken by another
process before the worker binds it (Faust's ``web_port`` cannot be 0).
"""

from __future__ import annotations

import argparse
import json
import logging
import ssl
from typing import Any

import faust


def build(args: argparse.Namespace) -> faust.App:
    app = faust.App(
        args.app,
        broker=f"streamassign://{args.bootstrap}",
        broker_credentials=faust.SASLCredentials(
            username=args.user,
            password=args.password,
            mechanism="SCRAM-SHA-512",
            ssl_context=ssl.create_default_context(cafile=args.cafile),
        ),
        PartitionAssignor="streamassign.faust:PartitionAssignor",
        datadir=args.datadir,
        topic_partitions=1,
        topic_replication_factor=1,
        web_enabled=False,
        broker_session_timeout=6.0,
        broker_heartbeat_interval=1.0,
        consumer_auto_offset_reset="earliest",
    )
    topic = app.topic(args.topic, key_type=bytes, value_type=bytes, partitions=1)

    @app.agent(topic)
    async def read(stream: Any) -> None:
        async for event in stream.events():
            line = {"event": "record", "partition": event.message.partition}
            print(json.dumps({**line, "offset": event.message.offset}), flush=True)

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    for option in ("bootstrap", "cafile", "user", "password", "app", "topic", "datadir", "log"):
        parser.add_argument(f"--{option}", required=True)
    args = parser.parse_args()
    worker = faust.Worker(
        build(args), loglevel=logging.INFO, logfile=args.log, redirect_stdouts=False, quiet=True
    )
    worker.execute_from_commandline()


if __name__ == "__main__":
    main()
