"""Step 0: who ran each task before, duplicate claims (zombies, a partitioned network) resolved."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from .._ids import TaskId
from ..assignment import ClientState


def _claims(
    index: Mapping[TaskId, int], clients: Sequence[ClientState]
) -> tuple[list[int], list[tuple[int, int]]]:
    """Previous owner (client index, or -1) of each task, and the claims that lost.

    A task claimed as active by several clients (a zombie, or a partitioned network) goes to the
    claimant with the smallest lag, then the smallest process id (``clients`` is sorted by it).
    """
    owner = [-1] * len(index)
    lost: list[tuple[int, int]] = []
    for ci, c in enumerate(clients):
        for t in c.prev_active:
            i = index.get(t)
            if i is None:
                continue
            j = owner[i]
            if j < 0:
                owner[i] = ci
            elif c.lags.get(t, 0) < clients[j].lags.get(t, 0):
                owner[i] = ci
                lost.append((i, j))
            else:
                lost.append((i, ci))
    return owner, lost


def resolve_previous_owners(
    tasks: Iterable[TaskId], clients: Iterable[ClientState]
) -> dict[TaskId, str]:
    """Previous active owner (process id) of each task that has one; duplicate claims resolved
    as the assignor resolves them: smallest lag, then smallest process id."""
    task_list = list(dict.fromkeys(tasks))
    client_list = sorted(clients, key=lambda c: c.process_id)
    owner, _ = _claims({t: i for i, t in enumerate(task_list)}, client_list)
    return {
        t: client_list[ci].process_id for t, ci in zip(task_list, owner, strict=True) if ci >= 0
    }
