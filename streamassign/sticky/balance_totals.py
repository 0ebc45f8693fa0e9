"""Step 2, ``balance="total"``: one quota per client, the floor or ceiling of its total share;
the ceilings go where they keep the most previous tasks."""

from __future__ import annotations

from ..shares import apportion, share_bounds
from .place_orphans import PlaceOrphans


class BalanceTotals(PlaceOrphans):
    """Actives balanced by each client's total only."""

    def _actives_by_total(self) -> None:
        """Quotas per client from its total share (``balance="total"``), then keep, take over
        warm and deal."""
        caps = [c.capacity for c in self.clients]
        prev = self._previous_tasks()
        bounds = share_bounds(len(self.tasks), caps)
        floors = [lo for lo, _ in bounds]
        tasks, warm = self.tasks, self.warm
        # Ceilings go to the clients that ran most above their floor (the move bound), then to
        # the clients whose claims and the orphans a matching would give them (each orphan
        # counted for the warm holder with the fewest matches so far that still has room for it
        # below its ceiling) do not fit their floor, so that orphans can be taken over warm.
        matched = [0] * len(self.clients)
        orphans = sorted(
            (len(holder), task) for task, holder in warm.items() if self.prev_owner[task] < 0
        )
        for _, task in orphans:
            # ``warm[i]`` is in rank order: the first holder with the fewest matches is the
            # one with the least (matches, rank).
            roomy = [
                holder
                for holder in warm[task]
                if matched[holder] < bounds[holder][1] - len(prev[holder])
            ]
            if roomy:
                matched[min(roomy, key=matched.__getitem__)] += 1
        claims = self._restart_claims(orphans)

        # Claims count after previous tasks: they only order the clients whose previous tasks
        # fit their floor (the same order as without claims when there are none).
        def priority(client: int) -> tuple[int, bool, int, int, int]:
            below = floors[client] - len(prev[client])
            spare = below - len(claims[client])
            return min(0, below), spare >= matched[client], spare, -matched[client], client

        quotas = apportion(len(tasks), caps, priority=priority)
        room = self._keep_previous(quotas, prev, claims)
        self._place_orphans(range(len(tasks)), room, quotas, bounds)
