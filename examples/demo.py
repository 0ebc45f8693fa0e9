"""What the runtime examples share: creating their topics, and an entry point that ends a run
which cannot go on with one line on stderr (not a trace)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, NoReturn

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, KafkaError

from streamassign.errors import StreamAssignError


async def create_topics(bootstrap: str, partitions: Mapping[str, int]) -> None:
    """Create each topic with its partition count (replication 1); the admin client is closed
    whatever happens, a failed start included."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        await admin.start()
        await admin.create_topics([NewTopic(t, n, 1) for t, n in partitions.items()])
    finally:
        await admin.close()


def count(least: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``least`` (a count of customers of 0 would
    divide by zero; a negative count of orders would quietly produce none)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value} is below {least}")
        return value

    return parse


def run(main: Callable[[], Coroutine[Any, Any, int]]) -> NoReturn:
    """Run ``main`` and exit with its status; a configuration problem or a broker that cannot
    be reached ends the demo with one ``error:`` line and status 1."""
    try:
        sys.exit(asyncio.run(main()))
    except StreamAssignError as exc:  # a configuration problem
        sys.exit(f"error: {exc}")
    except KafkaConnectionError as exc:
        sys.exit(f"error: cannot reach Kafka ({exc}): is a broker running at --bootstrap?")
    except KafkaError as exc:
        sys.exit(f"error: Kafka refused or failed a request: {exc}")
