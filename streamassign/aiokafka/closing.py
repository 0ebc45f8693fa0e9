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
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

#: Seconds stopping one client (a consumer, a producer, a task's producer with its abort) may
#: take before it is left to the broker.
CLOSE_TIMEOUT = 10.0

#: Seconds each step releasing what a cut stop left running may take (they are local:
#: cancelling tasks, closing sockets).
RELEASE_STEP_TIMEOUT = 2.0


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


async def release_consumer(name: str, consumer: Any, log: logging.Logger) -> None:
    """The local part of an ``AIOKafkaConsumer`` stop that ``stop_within`` cut (while it waited
    for the coordination task, which the cut cancels, or for its LeaveGroup): without it the
    heartbeat and fetch tasks run on and the connections stay open. Only aiokafka's own
    closing steps that need no answer from the broker (see ``_release``)."""
    await _release(
        name,
        (
            ("stop its heartbeat", lambda: consumer._coordinator._stop_heartbeat_task()),
            (
                "stop its offsets refresh",
                lambda: consumer._coordinator._stop_commit_offsets_refresh_task(),
            ),
            ("close its fetcher", lambda: consumer._fetcher.close()),
            ("close its connections", lambda: consumer._client.close()),
        ),
        log,
    )


async def _release(
    name: str, steps: Sequence[tuple[str, Callable[[], object]]], log: logging.Logger
) -> None:
    """Run the steps releasing what a cut stop left running, each on its own and within
    ``RELEASE_STEP_TIMEOUT`` (closing a connection waits for its transport, which waits to
    flush): a step that fails (an aiokafka that renamed what it reaches:
    ``tests/test_runtime_release.py`` checks the installed one has them) or outlasts it is logged,
    and the next still runs."""
    for what, step in steps:
        try:
            async with asyncio.timeout(RELEASE_STEP_TIMEOUT):
                result = step()
                if inspect.isawaitable(result):
                    await result
        except Exception as exc:
            log.warning("%s: could not %s after its stop was cut (%r)", name, what, exc)
