"""Gate where a batch leaves aiokafka's accumulator: its ``drain_by_nodes``.

A record handed to aiokafka sits in its accumulator until the sender task drains it. A
worker stopped past its session keeps such records; at the resume the sender may drain them
before anything else runs, so a hold that only sees later sends comes too late. Gating the
drain itself decides synchronously, per drain, what may leave:

- SEND: everything drains as aiokafka would;
- HOLD: the gated partitions are treated as muted for this drain (aiokafka mutes partitions
  with a request in flight the same way): their batches stay in the accumulator, in order,
  with no re-enqueue, until a later drain sends or drops them;
- DROP: the gated partitions' batches are removed without being sent (``drop_gated``).

A batch drained just before a stall, into a request made on the loop's next step, is the
sender's gate's to hold or drop (``streamassign.aiokafka.sender``).

Checked against aiokafka 0.11.0 - 0.14.0 (``drain_by_nodes(ignore_nodes, muted_partitions)``,
``_batches`` a dict of deques, each batch's delivery ``future``); another shape leaves the
drain alone with one WARNING.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

__all__ = [
    "DROP",
    "HOLD",
    "SEND",
    "accumulator_shape_known",
    "drop_gated",
    "gate_drains",
    "wake_sender",
]

log = logging.getLogger("streamassign.aiokafka")

SEND = "send"
HOLD = "hold"
DROP = "drop"

_DRAIN_PARAMETERS = ("self", "ignore_nodes", "muted_partitions")


def accumulator_shape_known(accumulator: Any) -> bool:
    """Whether ``accumulator`` has the shape this module relies on (aiokafka 0.11.0 - 0.14.0)."""
    drain = getattr(type(accumulator), "drain_by_nodes", None)
    if drain is None or not isinstance(getattr(accumulator, "_batches", None), dict):
        return False
    if not isinstance(getattr(accumulator, "_pending_batches", None), set):
        return False
    if _waiter(accumulator) is None:
        return False
    try:
        names = tuple(inspect.signature(drain).parameters)
    except (TypeError, ValueError):
        return False
    return names == _DRAIN_PARAMETERS


def _waiter(accumulator: Any) -> Callable[[], Any] | None:
    """The future the sender waits on for new data: ``waiter`` (0.14), ``data_waiter`` (older)."""
    found = getattr(accumulator, "waiter", None) or getattr(accumulator, "data_waiter", None)
    return found if callable(found) else None


def gate_drains(accumulator: Any, rule: Callable[[], str], gated: Callable[[Any], bool]) -> bool:
    """Make every drain of ``accumulator`` first ask ``rule()`` (SEND, HOLD or DROP) what
    happens to the batches of partitions ``gated(tp)`` selects. False (one WARNING): this
    aiokafka's accumulator has another shape, and its drains are left alone."""
    if not accumulator_shape_known(accumulator):
        log.warning(
            "aiokafka's producer accumulator has an unknown shape: records it held before a "
            "stall are not held (changelog sends made after the stall still are)"
        )
        return False
    drain = accumulator.drain_by_nodes

    def gated_drain(ignore_nodes: Any, muted_partitions: Any = frozenset()) -> Any:
        try:
            decided = rule()
        except Exception:  # in aiokafka's sender task: a raise there fails every batch
            log.exception("deciding what may leave aiokafka's accumulator failed; sending")
            decided = SEND
        if decided == DROP:
            drop_gated(accumulator, gated)
        elif decided == HOLD:
            held = {tp for tp in accumulator._batches if gated(tp)}
            muted_partitions = frozenset(muted_partitions) | held
        return drain(ignore_nodes=ignore_nodes, muted_partitions=muted_partitions)

    accumulator.drain_by_nodes = gated_drain
    return True


def drop_gated(accumulator: Any, gated: Callable[[Any], bool]) -> int:
    """Remove the batches of gated partitions unsent; how many. Each batch's delivery future
    gets None, so a flush waiting on it returns, but its records' futures never complete:
    nothing reports them written. A send waiting for room in a dropped batch is let go (its
    record goes to a new batch, dropped in turn while the membership stays lost): left
    waiting it would block Faust's producer buffer until aiokafka's timeout (20 min)."""
    dropped = 0
    for tp in [tp for tp in accumulator._batches if gated(tp)]:
        for batch in accumulator._batches.pop(tp):
            dropped += 1
            if not batch.future.done():
                if batch.retry_count:  # re-enqueued (an error, a request gate): its first drain's
                    accumulator._pending_batches.add(batch)  # callback removes it again
                batch.future.set_result(None)
            if not batch._drain_waiter.done():  # a send waiting for room appends anew (and
                batch._drain_waiter.set_result(None)  # is dropped at the next drain)
    return dropped


def wake_sender(accumulator: Any) -> None:
    """Let the sender drain again now (held batches released or dropped), rather than at the
    next record appended."""
    waiter = _waiter(accumulator)
    future = waiter() if waiter is not None else None
    if future is not None and not future.done():
        future.set_result(None)
