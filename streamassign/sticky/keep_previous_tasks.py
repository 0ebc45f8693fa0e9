"""Step 3 (keep): every client keeps up to its quota of the tasks it ran, then of its restart
claims; a client over quota releases first what another client holds warm."""

from __future__ import annotations

from .deal_tasks import level_order
from .rank_warm_holders import RankWarmHolders


class KeepPreviousTasks(RankWarmHolders):
    """The keep step."""

    def _previous_tasks(self) -> list[list[int]]:
        """Tasks each client ran before, after resolving duplicate claims."""
        prev: list[list[int]] = [[] for _ in self.clients]
        for i, ci in enumerate(self.prev_owner):
            if ci >= 0:
                prev[ci].append(i)
        return prev

    def _keep_previous(
        self, quotas: list[int], prev: list[list[int]], claims: list[list[int]]
    ) -> list[int]:
        """Each client keeps up to its quota of what it ran (``prev``), then of its claims;
        returns the room each has left."""
        owner = self.owner
        room = [q - min(q, len(mine)) for q, mine in zip(quotas, prev, strict=True)]
        # Room each client has beyond its claims: where a released task can still land warm.
        spare = [r - min(r, len(mine)) for r, mine in zip(room, claims, strict=True)]
        promised = [0] * len(self.clients)
        for ci, mine in enumerate(prev):
            extra = len(mine) - quotas[ci]
            if extra <= 0:
                for i in mine:
                    owner[i] = ci
                continue
            # First give back what a returning client ran before (a restarted process whose
            # claim lost to this interim owner), when it is caught up and has room for it.
            back: list[int] = []
            for i in mine:
                h = self._returning(i, ci, room, promised)
                if h >= 0 and len(back) < extra:
                    back.append(i)
                    promised[h] += 1
            self._keep([i for i in mine if i not in back], ci, quotas[ci], spare)
        # Then claims, like previous tasks, in the room left (a client's previous tasks first:
        # dropping one of those is a move).
        for ci, mine in enumerate(claims):
            if mine:
                room[ci] -= self._keep(mine, ci, room[ci] - promised[ci], spare)
        return room

    def _keep(self, mine: list[int], ci: int, quota: int, spare: list[int]) -> int:
        """Give client ``ci`` up to ``quota`` of the tasks ``mine`` (how many it got).

        When they do not all fit it keeps a subtopology-balanced subset and releases first the
        tasks another client with ``spare`` room holds warm state of, most caught-up holder
        first: those can be taken over warm.
        """
        owner, warm, tasks = self.owner, self.warm, self.tasks
        if len(mine) > quota:

            def best_elsewhere(i: int) -> tuple[int, ...] | None:
                ranks = [self._rank(i, h) for h in warm.get(i, ()) if h != ci and spare[h] > 0]
                return min(ranks) if ranks else None

            best = {i: best_elsewhere(i) for i in mine}
            ordered = [i for i in mine if best[i] is None] + sorted(
                (i for i in mine if best[i] is not None), key=lambda i: best[i] or (), reverse=True
            )
            mine = level_order(ordered, group=lambda i: tasks[i].subtopology)[:quota]
        for i in mine:
            owner[i] = ci
        return len(mine)
