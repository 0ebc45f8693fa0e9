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
    for client, state in enumerate(clients):
        for task_id in state.prev_active:
            task = index.get(task_id)
            if task is None:
                continue
            rival = owner[task]
            if rival < 0:
                owner[task] = client
            elif state.lags.get(task_id, 0) < clients[rival].lags.get(task_id, 0):
                owner[task] = client
                lost.append((task, rival))
            else:
                lost.append((task, client))
    return owner, lost


def resolve_previous_owners(
    tasks: Iterable[TaskId], clients: Iterable[ClientState]
) -> dict[TaskId, str]:
    """Previous active owner (process id) of each task that has one; duplicate claims resolved
    as the assignor resolves them: smallest lag, then smallest process id."""
    task_list = list(dict.fromkeys(tasks))
    client_list = sorted(clients, key=lambda state: state.process_id)
    owner, _ = _claims({task_id: task for task, task_id in enumerate(task_list)}, client_list)
    return {
        task_id: client_list[client].process_id
        for task_id, client in zip(task_list, owner, strict=True)
        if client >= 0
    }
