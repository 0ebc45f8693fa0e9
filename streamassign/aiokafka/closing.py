"""Bounded stops of aiokafka clients.

aiokafka's stops wait on the broker: a producer for the acks of every batch it holds (for
ever while a partition's leader is unreachable), a group consumer for its coordination task
(a JoinGroup sent after a rebalance callback waits ``request_timeout_ms``, 40 s by default,
on a broker that does not answer) and its LeaveGroup. A process stopping must not wait for
them: ``stop_within`` gives a client's stop ``CLOSE_TIMEOUT`` and then abandons it, with one
line. ``ProcessHost`` bounds its consumers' stops with it, the runtime its other clients'.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

#: Seconds stopping one client (a consumer, a producer, a task's producer with its abort) may
#: take before it is left to the broker.
CLOSE_TIMEOUT = 10.0


class Stoppable(Protocol):
    async def stop(self) -> None: ...


async def stop_within(name: str, client: Stoppable, abandoned: str, log: logging.Logger) -> bool:
    """Stop ``client`` within ``CLOSE_TIMEOUT``; else cancel its stop and log one warning:
    ``<name> did not stop within <s> s (broker unreachable?): <abandoned>``. Another error
    is logged too (stopping anyway: nothing else to do with it). Returns whether the stop
    ended in time."""
    try:
        async with asyncio.timeout(CLOSE_TIMEOUT):
            await client.stop()
    except TimeoutError:
        log.warning(
            "%s did not stop within %g s (broker unreachable?): %s",
            name,
            CLOSE_TIMEOUT,
            abandoned,
        )
        return False
    except Exception as exc:
        log.warning("%s did not stop cleanly (%r)", name, exc)
    return True


async def release_consumer(consumer: object) -> None:
    """The local part of an ``AIOKafkaConsumer`` stop that ``stop_within`` cut (while it waited
    for the coordination task, which the cut cancels, or for its LeaveGroup): without it the
    heartbeat and fetch tasks run on and the connections stay open. Only aiokafka's own
    closing steps that need no answer from the broker; best effort (a client that is not
    aiokafka's, or an aiokafka that differs, is left as it is)."""
    coordinator = getattr(consumer, "_coordinator", None)
    fetcher = getattr(consumer, "_fetcher", None)
    client = getattr(consumer, "_client", None)
    with contextlib.suppress(Exception):
        if coordinator is not None:
            await coordinator._stop_heartbeat_task()
            await coordinator._stop_commit_offsets_refresh_task()
        if fetcher is not None:
            await fetcher.close()
        if client is not None:
            await client.close()
