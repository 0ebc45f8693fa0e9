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
        clients, n, r = self.clients, len(self.tasks), self.replicas
        if any(ci < 0 for ci in self.prev_owner) or self.lost:
            return None
        caps = [c.capacity for c in clients]
        active_bounds = share_bounds(n, caps)
        n_stateful = sum(self.stateful)
        load_bounds = share_bounds(n + n_stateful * r, caps)
        copies = [0] * n
        index, stateful, owner = self.index, self.stateful, self.prev_owner
        for ci, c in enumerate(clients):
            if c.lags or len(c.prev_active) > active_bounds[ci][1]:
                return None
            if not active_bounds[ci][0] <= len(c.prev_active):
                return None
            for t in c.prev_standby:
                i = index.get(t)
                if i is None or not stateful[i] or owner[i] == ci or not r:
                    return None
                copies[i] += 1
            lo, hi = load_bounds[ci]
            if not lo <= len(c.prev_active) + len(c.prev_standby) <= hi:
                return None
        if sum(len(c.prev_active) for c in clients) != n:
            return None  # stale claims
        if self.by_subtopology and not self._balanced_per_subtopology(caps):
            return None
        if any(copies[i] != (r if stateful[i] else 0) for i in range(n)):
            return None
        return {c.process_id: ClientAssignment(c.prev_active, c.prev_standby) for c in clients}

    def _balanced_per_subtopology(self, caps: list[int]) -> bool:
        """Whether every client's previous actives of each subtopology are within floor and
        ceiling of its share (a balanced history is then kept as it is)."""
        cells, _ = quota_bounds(self.column_sizes, caps)
        counts = [[0] * len(self.column_sizes) for _ in caps]
        column = self.column
        for i, ci in enumerate(self.prev_owner):
            counts[ci][column[i]] += 1
        return all(
            lo <= count <= hi
            for row, bounds in zip(counts, cells, strict=True)
            for count, (lo, hi) in zip(row, bounds, strict=True)
        )
