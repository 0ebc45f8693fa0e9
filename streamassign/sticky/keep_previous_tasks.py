"""Step 3 (keep): every client keeps up to its quota of the tasks it ran, then of its restart
claims; a client over quota releases first what another client holds warm."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress, repeat
from operator import sub

from .deal_tasks import level_order
from .rank_warm_holders import RankWarmHolders


class KeepPreviousTasks(RankWarmHolders):
    """The keep step."""

    def _previous_tasks(self) -> list[list[int]]:
        """Tasks each client ran before, after resolving duplicate claims."""
        prev: list[list[int]] = [[] for _ in self.clients]
        for task, client in enumerate(self.prev_owner):
            if client >= 0:
                prev[client].append(task)
        return prev

    def _keep_previous(
        self, quotas: list[int], prev: Sequence[Sequence[int]], claims: Sequence[Sequence[int]]
    ) -> list[int]:
        """Each client keeps up to its quota of what it ran (``prev``), then of its claims;
        returns the room each has left."""
        owner = self.owner
        # Per client, in C (this runs per client and subtopology, and most hold nothing):
        # room is the quota less what it ran, at least 0.
        room = list(map(max, repeat(0), map(sub, quotas, map(len, prev))))
        # Room each client has beyond its claims: where a released task can still land warm.
        spare = list(map(max, repeat(0), map(sub, room, map(len, claims))))
        promised = [0] * len(self.clients)
        for client in compress(range(len(prev)), prev):  # the clients that ran some
            mine = prev[client]
            extra = len(mine) - quotas[client]
            if extra <= 0:
                for task in mine:
                    owner[task] = client
                continue
            # First give back what a returning client ran before (a restarted process whose
            # claim lost to this interim owner), when it is caught up and has room for it.
            back: list[int] = []
            for task in mine:
                holder = self._returning(task, client, room, promised)
                if holder >= 0 and len(back) < extra:
                    back.append(task)
                    promised[holder] += 1
            self._keep([task for task in mine if task not in back], client, quotas[client], spare)
        # Then claims, like previous tasks, in the room left (a client's previous tasks first:
        # dropping one of those is a move).
        for client in compress(range(len(claims)), claims):
            room[client] -= self._keep(
                claims[client], client, room[client] - promised[client], spare
            )
        return room

    def _keep(self, mine: Sequence[int], client: int, quota: int, spare: list[int]) -> int:
        """Give client ``client`` up to ``quota`` of the tasks ``mine`` (how many it got).

        When they do not all fit it keeps a subtopology-balanced subset and releases first the
        tasks another client with ``spare`` room holds warm state of, most caught-up holder
        first: those can be taken over warm.
        """
        owner, warm, tasks = self.owner, self.warm, self.tasks
        if len(mine) > quota:

            def best_elsewhere(task: int) -> tuple[int, ...] | None:
                ranks = [
                    self._rank(task, holder)
                    for holder in warm.get(task, ())
                    if holder != client and spare[holder] > 0
                ]
                return min(ranks) if ranks else None

            best = {task: best_elsewhere(task) for task in mine}
            ordered = [task for task in mine if best[task] is None] + sorted(
                (task for task in mine if best[task] is not None),
                key=lambda task: best[task] or (),
                reverse=True,
            )
            mine = level_order(ordered, group=lambda task: tasks[task].subtopology)[:quota]
        for task in mine:
            owner[task] = client
        return len(mine)
