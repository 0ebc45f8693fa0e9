"""Shortcut: a complete, clean and balanced previous assignment is returned as it is (O(tasks))."""

from __future__ import annotations

from ..assignment import ClientAssignment
from ..shares import share_bounds
from .compute_quotas import quota_bounds
from .place_standbys import PlaceStandbys


class KeepStableHistory(PlaceStandbys):
    """The stable-history shortcut."""

    def _history_if_stable(self) -> dict[str, ClientAssignment] | None:
        """The previous assignment itself when the algorithm would return it unchanged.

        That is when it is complete and clean (every task one claimant, no stale or duplicate
        entries, every stateful task exactly its standbys, none elsewhere) and balanced
        (actives and loads within floor and ceiling of the shares): then every client keeps
        all it had. A cheap check, so a rebalance that changes nothing costs O(tasks) and
        reuses the reported sets as they are.
        """
        clients, n_tasks, r = self.clients, len(self.tasks), self.replicas
        if any(client < 0 for client in self.prev_owner) or self.lost:
            return None
        caps = [state.capacity for state in clients]
        active_bounds = share_bounds(n_tasks, caps)
        n_stateful = sum(self.stateful)
        load_bounds = share_bounds(n_tasks + n_stateful * r, caps)
        copies = [0] * n_tasks
        index, stateful, owner = self.index, self.stateful, self.prev_owner
        for client, state in enumerate(clients):
            if state.lags or len(state.prev_active) > active_bounds[client][1]:
                return None
            if not active_bounds[client][0] <= len(state.prev_active):
                return None
            for t in state.prev_standby:
                task = index.get(t)
                if task is None or not stateful[task] or owner[task] == client or not r:
                    return None
                copies[task] += 1
            lo, hi = load_bounds[client]
            if not lo <= len(state.prev_active) + len(state.prev_standby) <= hi:
                return None
        if sum(len(state.prev_active) for state in clients) != n_tasks:
            return None  # stale claims
        if self.by_subtopology and not self._balanced_per_subtopology(caps):
            return None
        if any(copies[task] != (r if stateful[task] else 0) for task in range(n_tasks)):
            return None
        return {
            state.process_id: ClientAssignment(state.prev_active, state.prev_standby)
            for state in clients
        }

    def _balanced_per_subtopology(self, caps: list[int]) -> bool:
        """Whether every client's previous actives of each subtopology are within floor and
        ceiling of its share (a balanced history is then kept as it is)."""
        cells, _ = quota_bounds(self.column_sizes, caps)
        counts = [[0] * len(self.column_sizes) for _ in caps]
        column = self.column
        for task, client in enumerate(self.prev_owner):
            counts[client][column[task]] += 1
        return all(
            lo <= count <= hi
            for row, bounds in zip(counts, cells, strict=True)
            for count, (lo, hi) in zip(row, bounds, strict=True)
        )
