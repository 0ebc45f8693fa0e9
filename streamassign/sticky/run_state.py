"""The state one assignment works on: tasks, clients and subtopology columns by index in sorted
order, previous owners, and the owner, actives and standbys being built."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from itertools import groupby, pairwise
from operator import itemgetter
from typing import Final

from .._ids import TaskId, as_task
from ..assignment import ClientState
from ..errors import DuplicateProcessIdError, NoClientsError
from .resolve_claims import _claims

#: Lag used for a standby whose lag the client did not report: behind every known lag.
_UNKNOWN_LAG: Final = 1 << 62


class RunState:
    """State of one assignment; tasks and clients are referred to by index in sorted order."""

    def __init__(
        self,
        tasks: Iterable[TaskId],
        clients: Iterable[ClientState],
        stateful: Iterable[TaskId] | None,
        num_standby_replicas: int,
        acceptable_recovery_lag: int = 10_000,
        rack_aware_tags: Sequence[str] | None = None,
        task_racks: Mapping[TaskId, str] | None = None,
        by_subtopology: bool = True,
    ) -> None:
        self.acceptable_lag = acceptable_recovery_lag
        self.rack_aware_tags = rack_aware_tags
        self.task_racks = task_racks or {}
        self.tasks: list[TaskId] = sorted(_task_ids(tasks))
        self.clients: list[ClientState] = sorted(clients, key=lambda c: c.process_id)
        for first, second in pairwise(self.clients):
            if first.process_id == second.process_id:
                raise DuplicateProcessIdError(first.process_id)
        if self.tasks and not self.clients:
            raise NoClientsError(len(self.tasks))
        self.index: dict[TaskId, int] = dict(zip(self.tasks, range(len(self.tasks)), strict=True))
        n_tasks = len(self.tasks)
        #: Column (subtopology number in sorted order) of each task, and tasks per column.
        self.column, self.column_sizes = _columns(self.tasks)
        # With one subtopology, balancing it is balancing the total.
        self.by_subtopology = by_subtopology and len(self.column_sizes) > 1
        self.stateful = self._stateful_flags(stateful)
        self.replicas = min(num_standby_replicas, max(0, len(self.clients) - 1))
        self.owner = [-1] * n_tasks  # active client index of each task
        self.active: list[list[int]] = [[] for _ in self.clients]
        self.standby: list[list[int]] = [[] for _ in self.clients]
        self.prev_owner, self.lost = _claims(self.index, self.clients)
        self.warm: dict[int, list[int]] = {}
        #: ``_rank`` of (task, client) pairs, by ``task * clients + client``: fixed for a run.
        self._ranks: dict[int, tuple[int, int, int, int, int]] = {}
        #: Whether ``warm`` lists were sorted by ``_rank`` (else every holder ranks the same).
        self._ranked = False

    def _stateful_flags(self, stateful: Iterable[TaskId] | None) -> list[bool]:
        """Whether each task is stateful (``None``: every task is)."""
        if stateful is None:
            return [True] * len(self.tasks)
        flags = [False] * len(self.tasks)
        for task in map(self.index.get, _task_ids(stateful)):
            if task is not None:
                flags[task] = True
        return flags


def _task_ids(items: Iterable[TaskId]) -> Collection[TaskId]:
    """The distinct ``as_task`` of ``items``, in their first order (sorting ids given sorted
    then takes one pass); the types are checked in C first, so ids that already are
    ``TaskId``s (what the callers pass) are taken as they are."""
    given = items if isinstance(items, Collection) else list(items)
    if set(map(type, given)) <= {TaskId}:
        return dict.fromkeys(given).keys()
    return dict.fromkeys(map(as_task, given)).keys()


def _columns(tasks: list[TaskId]) -> tuple[list[int], list[int]]:
    """Column (subtopology number in sorted order) of each of the sorted ``tasks``, and the
    number of tasks in each column."""
    sizes = [len(list(run)) for _, run in groupby(map(itemgetter(0), tasks))]
    column: list[int] = []
    for col, size in enumerate(sizes):
        column += [col] * size
    return column, sizes
