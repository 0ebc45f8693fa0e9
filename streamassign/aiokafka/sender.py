"""Gate aiokafka's produce requests at the moment they are made, for batches already drained.

aiokafka's sender drains its accumulator and, in the same step, creates a task that builds the
ProduceRequest and writes it (``Sender._send_produce_req``). That task runs on a later step of
the event loop: a process stopped between the drain and that step writes the request right
after it resumes, past the accumulator's gate (``streamassign.aiokafka.accumulator``), which
decided before the stop. So the task asks the same rule again when it starts:

- SEND: the request goes out as aiokafka makes it;
- HOLD: the gated partitions' batches go back to the front of the accumulator (aiokafka's own
  ``reenqueue``, the path of a batch retried after an error: closed, keeping its delivery
  future and its place ahead of later batches), where the accumulator's gate holds or drops
  them; the others go out;
- DROP: the gated partitions' batches are dropped as ``drop_gated`` drops them (their delivery
  futures get None, their records' futures never complete); the others go out.

Either way the sender's bookkeeping for the request (its node in flight, its partitions muted)
is undone as aiokafka's task undoes it, so the partitions drain again afterwards.

Not with an idempotent producer: a drained batch has its sequence numbers, and the broker
refuses every later batch of a partition whose batch was dropped (OutOfOrderSequenceNumber,
not retried). Faust enables idempotence only with ``exactly_once``, where nothing is held.

A request of gated partitions the rule lets go decides again once connected
(``client.ready(node_id)`` first, which returns without a step of the loop on a live
connection): a connection made at the end of a network cut, while a hold is on, carries no
changelog batch. Held or dropped, it is decided at once (no wait for a dead link).

A request already written when a worker is cut off from the broker sits in the client's
buffers (asyncio's transport, the kernel's send queue, retransmitted) and reaches the broker at
the heal, after the new owner's writes. ``abort_in_flight`` recalls it: it resets the
connections of the nodes with a request of gated partitions in flight (SO_LINGER 0, so the
kernel discards its unsent and unacknowledged bytes, then asyncio's ``abort``, which drops its
buffer), and aiokafka's ``close`` fails the request as a retriable connection error: aiokafka
puts its batches back into the accumulator, whose gate holds or drops them. aiokafka keeps no
record of which partitions a node's request carries, so the gated request keeps one on the
sender (``_CARRIED``, beside the gate it puts there): a node whose request carries only other
topics is not reset (its request would be sent again, a duplicate if the broker had written
it).

Checked against aiokafka 0.11.0 - 0.14.0 (``_send_produce_req(node_id, batches)``, the
``_in_flight`` and ``_muted_partitions`` sets, the accumulator's ``reenqueue(batch)``); another
shape leaves the sender alone with one WARNING. The abort also relies on ``client._conns``
keyed by ``(node_id, ConnectionGroup.DEFAULT)``, each connection's ``_writer`` and its
``close(reason)`` (checked in aiokafka 0.14.0); another shape is not aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import socket
import struct
from collections.abc import Callable
from typing import Any

from aiokafka.client import ConnectionGroup
from aiokafka.conn import CloseReason
from aiokafka.errors import NodeNotReadyError

from .accumulator import DROP, HOLD, SEND, accumulator_shape_known

__all__ = ["abort_in_flight", "gate_sends"]

log = logging.getLogger("streamassign.aiokafka")

_SEND_PARAMETERS = ("self", "node_id", "batches")
_REENQUEUE_PARAMETERS = ("self", "batch")
#: SO_LINGER on, 0 seconds: ``close`` resets the connection and discards what is unsent.
_LINGER_RESET = struct.pack("ii", 1, 0)
#: The attribute of a gated sender holding the partitions of the request each node has in
#: flight (written, or being written, by ``gate_sends``'s request until it is answered or
#: fails): on the sender itself, as the gate is, so it lives and goes with it.
_CARRIED = "_streamassign_carried"


def _parameters(function: Any) -> tuple[str, ...] | None:
    try:
        return tuple(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return None


def _shape_known(sender: Any) -> bool:
    send = getattr(type(sender), "_send_produce_req", None)
    if not inspect.iscoroutinefunction(send) or _parameters(send) != _SEND_PARAMETERS:
        return False
    marks = (getattr(sender, "_in_flight", None), getattr(sender, "_muted_partitions", None))
    if not all(isinstance(mark, set) for mark in marks):
        return False
    accumulator = getattr(sender, "_message_accumulator", None)
    if not accumulator_shape_known(accumulator):
        return False
    reenqueue = getattr(type(accumulator), "reenqueue", None)
    return reenqueue is not None and _parameters(reenqueue) == _REENQUEUE_PARAMETERS


def gate_sends(sender: Any, rule: Callable[[], str], gated: Callable[[Any], bool]) -> bool:
    """Make every produce request of aiokafka's ``sender`` first ask ``rule()`` (SEND, HOLD or
    DROP) what happens to the batches it carries of partitions ``gated(tp)`` selects. False
    (one WARNING): a sender of another shape, or an idempotent one, left alone."""
    if not _shape_known(sender) or not hasattr(sender, "_txn_manager"):
        log.warning(
            "aiokafka's producer sender has an unknown shape: records it drained just before a "
            "stall are not held (records still in its accumulator are)"
        )
        return False
    if sender._txn_manager is not None:
        log.warning(
            "aiokafka's producer is idempotent: records it drained just before a stall are not "
            "held (dropping a batch with sequence numbers would fail its partition's later ones)"
        )
        return False
    send = sender._send_produce_req
    carried: dict[Any, set[Any]] = {}
    setattr(sender, _CARRIED, carried)

    async def gated_send(node_id: Any, batches: dict[Any, Any]) -> None:
        decided = _decide(rule)
        if decided == SEND and any(gated(tp) for tp in batches):  # a cut may begin while it
            if not await _connected(sender, node_id):  # connects: decided again once connected
                await _unreachable(sender, node_id, batches)
                return
            decided = _decide(rule)
        held = {tp: batch for tp, batch in batches.items() if decided != SEND and gated(tp)}
        if held:
            _take_back(sender, node_id, batches, held, drop=decided == DROP)
            batches = {tp: batch for tp, batch in batches.items() if tp not in held}
            if not batches:
                return
        await _carrying(carried, node_id, batches, send(node_id, batches))

    sender._send_produce_req = gated_send
    return True


async def _carrying(
    carried: dict[Any, set[Any]], node_id: Any, batches: dict[Any, Any], request: Any
) -> None:
    """Await aiokafka's ``request`` of ``batches`` to ``node_id``, noting meanwhile in
    ``carried`` that the node's connection carries their partitions."""
    on_node = carried.setdefault(node_id, set())
    on_node.update(batches)
    try:
        await request
    finally:
        on_node.difference_update(batches)
        if not on_node and carried.get(node_id) is on_node:
            del carried[node_id]


async def _connected(sender: Any, node_id: Any) -> bool:
    """Connect to ``node_id`` before the rule decides; the request's send uses the connection
    made here, and on a live one this returns without a step of the loop. True also when it
    cannot be asked (the send connects then, as without this gate)."""
    ready = getattr(getattr(sender, "client", None), "ready", None)
    if ready is None:
        return True
    try:
        return bool(await ready(node_id))
    except Exception:
        log.debug("connecting to node %s before a produce request failed", node_id, exc_info=True)
        return False


async def _unreachable(sender: Any, node_id: Any, batches: dict[Any, Any]) -> None:
    """What aiokafka's request does when its node cannot be reached (a retriable error), without
    its send connecting a second time (a second wait, minutes on a dead leader): each batch
    failed once expired, else handed back to the accumulator after the retry backoff."""
    error = NodeNotReadyError(f"node {node_id} could not be reached")
    expired = {tp for tp, batch in batches.items() if batch.expired()}  # never idempotent here
    for tp in expired:
        batches[tp].failure(exception=error)
    await asyncio.sleep(sender._retry_backoff)
    retried = {tp: batch for tp, batch in batches.items() if tp not in expired}
    _take_back(sender, node_id, batches, retried, drop=False)
    sender._in_flight.discard(node_id)
    for tp in expired:
        sender._muted_partitions.discard(tp)


def _decide(rule: Callable[[], str]) -> str:
    try:
        decided = rule()
    except Exception:  # in aiokafka's sender task: a raise there fails every batch
        log.exception("deciding what may leave aiokafka's sender failed; sending")
        return SEND
    return decided if decided in (HOLD, DROP) else SEND


def _take_back(
    sender: Any, node_id: Any, batches: dict[Any, Any], held: dict[Any, Any], *, drop: bool
) -> None:
    """Hand ``held`` (drained, unsent) back to the accumulator or drop them, and undo the
    sender's marks for them: their partitions unmuted, the node no longer in flight when
    nothing else of ``batches`` goes out (else aiokafka's task clears it after sending)."""
    accumulator = sender._message_accumulator
    for tp, batch in held.items():
        sender._muted_partitions.discard(tp)
        if drop:
            if not batch.future.done():  # its drain's callback leaves the pending set
                batch.future.set_result(None)
        else:
            batch.get_data_buffer()  # closed as aiokafka's request closes it: no appends
            accumulator.reenqueue(batch)
    if len(held) == len(batches):
        sender._in_flight.discard(node_id)
    if drop:
        log.warning(
            "dropped %d changelog batch(es) aiokafka had drained before a stall into a request "
            "not yet made (the membership was lost)",
            len(held),
        )


def abort_in_flight(producer: Any, gated: Callable[[Any], bool]) -> int:
    """Reset the connections of aiokafka's ``producer`` to each node whose produce request in
    flight carries a partition ``gated(tp)`` selects; how many were reset. Their unsent bytes
    are discarded and their requests fail as retriable, so aiokafka puts the batches back
    into its accumulator. A sender ``gate_sends`` did not gate tells no node's partitions:
    then every node in flight is reset, if a gated partition is among the muted ones. Never
    raises; 0 for a sender of another shape, an idempotent one (a batch dropped later would
    fail its partition's later ones) or one with acks=0 (its records already count as
    written: a request reset would lose them)."""
    sender: Any = getattr(producer, "_sender", None)
    try:
        if not _abortable(sender):
            return 0
        nodes = sorted(_carrying_gated(sender, gated), key=repr)
    except Exception:  # the hold's tick calls this: it must go on
        log.exception("looking for aiokafka's produce requests in flight failed")
        return 0
    return sum(_reset(sender.client, node_id) for node_id in nodes)


def _carrying_gated(sender: Any, gated: Callable[[Any], bool]) -> set[Any]:
    """The nodes whose request in flight carries a partition ``gated(tp)`` selects, as the
    gated requests noted them (a gated request writes nothing before its note: one not yet
    noted decides by the rule first). A sender ``gate_sends`` did not gate tells no node's
    partitions: every node in flight, if a gated partition is muted."""
    carried = getattr(sender, _CARRIED, None)
    if carried is None:
        gated_muted = any(gated(tp) for tp in sender._muted_partitions)
        return set(sender._in_flight) if gated_muted else set()
    return {node_id for node_id, tps in carried.items() if any(gated(tp) for tp in tps)}


def _abortable(sender: Any) -> bool:
    if not _shape_known(sender) or getattr(sender, "_txn_manager", True) is not None:
        return False
    if getattr(sender, "_acks", 0) == 0:
        return False
    return isinstance(getattr(getattr(sender, "client", None), "_conns", None), dict)


def _reset(client: Any, node_id: Any) -> bool:
    """Reset the producer's connection to ``node_id``, if it is open."""
    conn = client._conns.get((node_id, ConnectionGroup.DEFAULT))
    writer = getattr(conn, "_writer", None)
    if writer is None:  # still connecting (its request decides once connected), or closed
        return False
    try:
        transport = writer.transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):  # the socket is gone already: nothing to send
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        transport.abort()  # drops asyncio's buffer; the socket closes on the loop's next step
        conn.close(reason=CloseReason.CONNECTION_BROKEN)  # fails the requests: retried
    except Exception:
        log.exception("resetting aiokafka's connection to node %s failed", node_id)
        return False
    return True
