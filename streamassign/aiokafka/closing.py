"""Bounded stops of aiokafka clients.

aiokafka's stops wait on the broker: a producer for the acks of every batch it holds (for
ever while a partition's leader is unreachable), a group consumer for its coordination task
(a JoinGroup sent after a rebalance callback waits ``request_timeout_ms``, 40 s by default,
on a broker that does not answer) and its LeaveGroup. A process stopping must not wait for
them: ``stop_within`` gives a client's stop ``CLOSE_TIMEOUT`` and then abandons it, with one
line. ``ProcessHost`` bounds its consumers' stops with it, the runtime its other clients'.
What a cut stop left running (tasks, connections, a producer's unsent batches) is then
released locally: ``release_consumer``, ``release_producer``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from ..errors import WritesAbandonedError

log = logging.getLogger("streamassign.aiokafka")

#: Seconds stopping one client (a consumer, a producer, a task's producer with its abort) may
#: take before it is left to the broker.
CLOSE_TIMEOUT = 10.0

#: Seconds each step releasing what a cut stop left running may take (they are local:
#: cancelling tasks, closing sockets).
RELEASE_STEP_TIMEOUT = 2.0


class Stoppable(Protocol):
    async def stop(self) -> None: ...


#: ``release_consumer`` or ``release_producer``: (name, client, log).
Release = Callable[[str, Any, logging.Logger], Awaitable[None]]


async def stop_within(name: str, client: Stoppable, abandoned: str, log: logging.Logger) -> bool:
    """Stop ``client`` within ``CLOSE_TIMEOUT``; else cancel its stop and log one warning:
    ``<name> did not stop within <s> s (broker unreachable?): <abandoned>``. A stop that
    fails is a cut stop too, logged likewise: a ``CancelledError`` it raises while this stop
    is not cancelled, or another error. aiokafka's clients mark themselves closed before
    their stop's first step, so one failing step skips the others for good (a consumer's
    coordinator failing: its fetcher and connections are never closed), and a second
    ``stop()`` does nothing. Returns False for a cut stop: its caller then releases what
    the stop left running."""
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
    except asyncio.CancelledError:
        if cancelled_itself():
            raise
        log.warning("%s did not stop cleanly (its stop raised CancelledError): %s", name, abandoned)
        return False
    except Exception as exc:
        log.warning("%s did not stop cleanly (%r): %s", name, exc, abandoned)
        return False
    return True


async def release_consumer(name: str, consumer: Any, log: logging.Logger) -> None:
    """The local part of an ``AIOKafkaConsumer`` stop that ``stop_within`` cut (while it waited
    for the coordination task, which the cut cancels, or for its LeaveGroup): without it the
    heartbeat and fetch tasks run on and the connections stay open. Only aiokafka's own
    closing steps that need no answer from the broker (see ``_release``), the fetches first
    (``_end_fetches``: its fetcher's close may stop at the first)."""
    await _release(
        name,
        (
            ("stop its heartbeat", lambda: consumer._coordinator._stop_heartbeat_task()),
            (
                "stop its offsets refresh",
                lambda: consumer._coordinator._stop_commit_offsets_refresh_task(),
            ),
            ("end its fetches", lambda: _end_fetches(consumer._fetcher)),
            ("close its fetcher", lambda: consumer._fetcher.close()),
            ("close its connections", lambda: consumer._client.close()),
        ),
        log,
    )


async def _end_fetches(fetcher: Any) -> None:
    """End aiokafka's fetch routine, then cancel every fetch request it still runs (one per
    broker), wait for them, and drop those ended from its set. The routine goes first, as
    in aiokafka's own close: a stop cut while closing the coordinator leaves it alive, and
    it starts a new fetch for each one the cancel ends. The fetcher's close cancels and
    awaits the fetches one at a time, and one in its retry backoff (the broker away) raises
    the cancel back, which ends the close there, the fetches after it still running (and
    logging "Failed fetch messages"). Dropped, the close does not await them again (nor
    raise their cancel again). A routine that does not end in its wait (it caught the
    cancel) still has its fetches cancelled, then the wait's ``TimeoutError`` is raised.
    A fetcher without those attributes (another aiokafka version;
    ``tests/test_runtime_release.py`` checks the installed one has them) is left to its
    close."""
    routine = getattr(fetcher, "_fetch_task", None)
    pending = getattr(fetcher, "_pending_tasks", None)
    if not isinstance(routine, asyncio.Future) or not isinstance(pending, set):
        return
    routine.cancel()
    routine_late: TimeoutError | None = None
    try:
        await _cancelled_and_ended({routine}, "fetch routine")
    except TimeoutError as late:  # the fetches are still ended; the warning says it
        routine_late = late
    fetches = set(pending)
    for fetch in fetches:
        fetch.cancel()
    pending.difference_update(await _cancelled_and_ended(fetches, "fetch task(s)"))
    if routine_late is not None:
        raise routine_late


async def _cancelled_and_ended(tasks: set[asyncio.Future[Any]], what: str) -> set[Any]:
    """Wait for cancelled ``tasks`` to end (a quarter of ``RELEASE_STEP_TIMEOUT``); their
    failures retrieved, so asyncio does not log them: nobody wants them now. Returns those
    ended; raises ``TimeoutError`` if any did not."""
    if tasks:
        await asyncio.wait(tasks, timeout=RELEASE_STEP_TIMEOUT / 4)
    ended = {task for task in tasks if task.done()}
    for task in ended:
        retrieve_failure(task)
    if len(ended) < len(tasks):
        raise TimeoutError(f"{len(tasks) - len(ended)} {what} did not end")
    return ended


async def release_producer(name: str, producer: Any, log: logging.Logger) -> None:
    """The local part of an ``AIOKafkaProducer`` stop that ``stop_within`` cut (while it waited
    for the acks of the batches it holds): without it the sender runs on and delivers them
    whenever the broker is back, however late, for as long as the event loop lives (a
    supervisor restarting ``run()``), possibly after the next owner compensated them.

    The sender is cancelled first (only its routine turns queued batches into requests, so
    none is sent after this); the connections close (a request already on a socket may still
    land, when the broker reads it, but none is sent again: the failed ones are put back in
    the queue); the sender's routine, which waits for its requests in flight, is waited for,
    and every request task it left (see ``_end_sender_tasks``); then every batch still held
    fails with ``WritesAbandonedError`` (which ends the flush the cut stop had begun), and the
    producer is marked closed (a cut abort never reached its stop: aiokafka would log it
    "Unclosed" at garbage collection, and a later ``stop()`` would wait on it again)."""
    abandoned = WritesAbandonedError(f"{name} was released before these writes were acknowledged")
    await _release(
        name,
        (
            ("cancel its sender", lambda: producer._sender.sender_task.cancel()),
            ("close its connections", lambda: producer.client.close()),
            ("end its sender", lambda: _end_task(producer._sender.sender_task)),
            ("end its requests", lambda: _end_sender_tasks(producer._sender)),
            ("fail its writes", lambda: _fail_held(producer._message_accumulator, abandoned)),
            ("mark it closed", lambda: setattr(producer, "_closed", True)),
        ),
        log,
    )


def _fail_held(accumulator: Any, error: Exception) -> None:
    """Fail every batch aiokafka's accumulator holds, queued or in flight, with ``error``,
    and mark its futures retrieved (its writes' and the one a full batch's waiter awaits):
    their callers gave up on them (a cancelled commit), and asyncio would log each at
    garbage collection."""
    queued = [batch for queue in accumulator._batches.values() for batch in queue]
    held = [*queued, *accumulator._pending_batches]
    # A batch put back in the queue after its request failed (the connections closed) is
    # still to be dropped from the in-flight set when it ends; so it must be in it.
    accumulator._pending_batches.update(queued)
    accumulator.fail_all(error)
    _retrieve_all(_batch_futures(held))


def mark_failures_seen(producer: Any) -> None:
    """Mark seen the failures left in aiokafka's futures of a ``producer`` being dropped:
    its transaction's waiter and each held batch's drain waiter and writes. A sender that
    dies (a transactional id refused, fenced) fails them all, and nobody awaits them once the
    producer is closed (its failure reached the caller through the writes it awaited):
    asyncio would print each as "Future exception was never retrieved" with aiokafka's trace
    when collected, at the latest at exit. Never raises: parts of another shape (another
    aiokafka version) are skipped."""
    try:
        accumulator = getattr(producer, "_message_accumulator", None)
        queues = getattr(accumulator, "_batches", {}).values()
        held = [*(b for queue in queues for b in queue)]
        held += list(getattr(accumulator, "_pending_batches", ()))
        transaction = getattr(producer, "_txn_manager", None)
        waiter = getattr(transaction, "_transaction_waiter", None)
        _retrieve_all([waiter, *_batch_futures(held)])
    except Exception:  # a close must go on whatever aiokafka's internals look like
        log.debug("aiokafka's producer futures not marked seen", exc_info=True)


def _batch_futures(batches: Sequence[Any]) -> list[Any]:
    futures = []
    for batch in batches:
        futures.append(getattr(batch, "_drain_waiter", None))
        futures += [future for future, _ in getattr(batch, "_msg_futures", ())]
    return futures


def retrieve_failure(future: asyncio.Future[Any]) -> None:
    """Mark the failure ``future`` ended with seen: nobody awaits it any more (its caller gave
    up on it, or its failure already reached them another way), and asyncio would log each
    one as "Future exception was never retrieved" with its trace when it is collected. Made
    to be a done callback; a future not done, or cancelled, is left as it is."""
    if future.done() and not future.cancelled():
        future.exception()


def _retrieve_all(futures: Sequence[Any]) -> None:
    """``retrieve_failure`` for each of ``futures`` that is an asyncio future (aiokafka's
    parts read with ``getattr`` may be missing: None)."""
    for future in futures:
        if isinstance(future, asyncio.Future):
            retrieve_failure(future)


async def _end_task(task: asyncio.Task[Any]) -> None:
    """Wait for a cancelled ``task``, cancelling it again (with what it awaits) if it has not
    ended within a quarter of ``RELEASE_STEP_TIMEOUT``: aiokafka's sender routine waits for
    its requests in flight, and one retrying after its connection closed waits for a
    metadata update that no longer comes."""
    await asyncio.wait([task], timeout=RELEASE_STEP_TIMEOUT / 4)
    if not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=RELEASE_STEP_TIMEOUT / 4)
    if not task.done():
        raise TimeoutError(f"{task.get_name()} did not end")
    if not task.cancelled():
        task.exception()  # retrieved, so asyncio does not log it: its batches are failed next


async def _end_sender_tasks(sender: Any) -> None:
    """Cancel and wait for every task still running a method of aiokafka's ``sender`` (its
    produce requests, its transaction request): its routine, cancelled, waits for them one
    at a time, so ``_end_task``'s second cancel ends only the one it awaited. Left, one waits
    for ever (for a metadata update: the client closed), or, its writes failed next, goes on
    and reconnects: a cut abort's end-transaction task sends its EndTxn after the release.
    They are found by the ``self`` of their coroutine (aiokafka keeps no set of them)."""
    tasks = [task for task in asyncio.all_tasks() if _runs_a_method_of(task, sender)]
    while tasks:
        for task in tasks:
            task.cancel()  # again if it caught the last one (bounded by the step's timeout)
        _, pending = await asyncio.wait(tasks, timeout=RELEASE_STEP_TIMEOUT / 4)
        for task in set(tasks) - pending:
            if not task.cancelled():
                task.exception()  # retrieved, so asyncio does not log it
        tasks = list(pending)


def _runs_a_method_of(task: asyncio.Task[Any], owner: object) -> bool:
    """Whether ``task`` is not done and its coroutine is a method of ``owner``."""
    coroutine = task.get_coro()
    if task.done() or not inspect.iscoroutine(coroutine):
        return False
    return inspect.getcoroutinelocals(coroutine).get("self") is owner


async def _release(
    name: str, steps: Sequence[tuple[str, Callable[[], object]]], log: logging.Logger
) -> None:
    """Run the steps releasing what a cut stop left running, each on its own and within
    ``RELEASE_STEP_TIMEOUT`` (closing a connection waits for its transport, which waits to
    flush): a step that fails (an aiokafka that renamed what it reaches:
    ``tests/test_runtime_release.py`` checks the installed one has them) or outlasts it is
    logged, and the next still runs."""
    for what, step in steps:
        try:
            async with asyncio.timeout(RELEASE_STEP_TIMEOUT):
                result = step()
                if inspect.isawaitable(result):
                    await result
        except asyncio.CancelledError:
            if cancelled_itself():
                raise
            log.warning("%s: could not %s after its stop was cut (CancelledError)", name, what)
        except Exception as exc:
            log.warning("%s: could not %s after its stop was cut (%r)", name, what, exc)


def cancelled_itself() -> bool:
    """Whether the running task is being cancelled, rather than a ``CancelledError`` coming
    out of what it awaited: aiokafka's fetcher re-raises its fetch tasks' cancellation from
    its close (the broker away), a producer's stop a request task's that its sender awaited,
    which must not end a stop and skip what follows it (releasing the client, the stop's
    next steps)."""
    running = asyncio.current_task()
    return running is not None and running.cancelling() > 0
