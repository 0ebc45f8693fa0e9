"""Per-subtopology eligibility of clients in a mixed-topology-version group (a rolling deploy).

The assignors know nothing of topology versions: they balance every task over every client.
A client whose process announced (protocol version 3) for subtopology ``s`` source topics that
lack one of the leader's, or none, would refuse the tasks of ``s`` (its member guard: some of
their partitions are not its own task's; it may not even subscribe to them), and they would
make no progress there. So after the assignor, a
post-pass moves those actives to eligible clients and drops standbys and warmups of them on
ineligible clients. The assignors stay untouched; with no differing fingerprint the post-pass
returns the assignor's output itself (a strict no-op).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ._ids import TaskId
from .assignment import ClientAssignment, ClientState

__all__ = ["ineligible_subtopologies", "move_to_eligible_clients"]


def ineligible_subtopologies(
    own: Mapping[int, frozenset[str]],
    announced: Mapping[str, Sequence[Mapping[int, frozenset[str]]]],
) -> dict[str, frozenset[int]]:
    """Per client, the leader's subtopology ids (``own``: id -> its source topics) that it must
    not get tasks of: ids for which one of its members announced source topics (``announced``:
    per client, each member's id -> topics) that do not include all of the leader's, or none.
    The member guard's subset rule (``versions.mismatched_tasks``): a client whose id reads
    more topics (a topic added there) runs the leader's task with the partitions it is given.
    A member announcing nothing (protocol 1-2, an older release) makes no id ineligible: the
    leader cannot tell, and its member guard still acts. Clients with none are left out."""
    out = {}
    for client, members_sources in announced.items():
        differing = {
            sub
            for theirs in members_sources
            if theirs
            for sub, topics in own.items()
            if not topics <= theirs.get(sub, frozenset())
        }
        if differing:
            out[client] = frozenset(differing)
    return out


def move_to_eligible_clients(
    per_client: dict[str, ClientAssignment],
    ineligible: Mapping[str, frozenset[int]],
    clients: Sequence[ClientState],
) -> dict[str, ClientAssignment]:
    """``per_client`` with every active a client is ineligible for moved to an eligible one
    (:func:`_target`), and its standbys and warmups of such tasks dropped. ``per_client``
    itself when nothing is ineligible. A task no client is eligible for stays where the
    assignor put it (its member refuses it, as without the post-pass)."""
    if not any(ineligible.get(c) for c in per_client):
        return per_client
    kept: dict[str, ClientAssignment] = {}
    moving: list[tuple[TaskId, str]] = []
    for client, given in sorted(per_client.items()):
        ineligible_ids = ineligible.get(client, frozenset())
        active = frozenset(t for t in given.active if t.subtopology not in ineligible_ids)
        moving += [(t, client) for t in sorted(given.active - active)]
        kept[client] = ClientAssignment(
            active,
            frozenset(t for t in given.standby if t.subtopology not in ineligible_ids),
            frozenset(t for t in given.warmup if t.subtopology not in ineligible_ids),
        )
    states = {c.process_id: c for c in clients}
    for task, source in sorted(moving):
        target = _target(task, kept, ineligible, states) or source
        before = kept[target]
        kept[target] = ClientAssignment(
            before.active | {task}, before.standby - {task}, before.warmup - {task}
        )
    return kept


def _target(
    task: TaskId,
    kept: Mapping[str, ClientAssignment],
    ineligible: Mapping[str, frozenset[int]],
    states: Mapping[str, ClientState],
) -> str | None:
    """The eligible client to take ``task``: one holding its state first (no restore from the
    changelog), then the fewest actives per consumer, then the smallest key (deterministic,
    so every leader picks the same). None: no client is eligible."""
    eligible = [c for c in kept if task.subtopology not in ineligible.get(c, frozenset())]
    if not eligible:
        return None

    def rank(client: str) -> tuple[bool, float, str]:
        state = states.get(client)
        capacity = state.capacity if state is not None else 1
        holds = state is not None and state.has_state(task)
        return (not holds, len(kept[client].active) / capacity, client)

    return min(eligible, key=rank)
