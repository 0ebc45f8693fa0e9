"""Step 1: which clients hold local state of each task (standbys, other stores, lost claims),
best first; restart claims after a whole-group restart."""

from __future__ import annotations

from .run_state import _UNKNOWN_LAG, RunState


class RankWarmHolders(RunState):
    """Local state per task, and the order of its holders (``_rank``)."""

    def _warm_holders(self, lost: list[tuple[int, int]]) -> dict[int, list[int]]:
        """Per task, the clients other than its previous owner with local state, best first.

        Best: a standby holder, then the smallest lag (see ``_rank``). Only lists with several
        holders are sorted; most tasks have one or none.
        """
        holders: dict[int, list[int]] = {}
        index = self.index
        for client, state in enumerate(self.clients):
            for task_id in state.prev_standby:
                task = index.get(task_id)
                if task is not None:
                    holders.setdefault(task, []).append(client)
            for task_id in state.lags:
                if task_id not in state.prev_standby and task_id not in state.prev_active:
                    task = index.get(task_id)
                    if task is not None:
                        holders.setdefault(task, []).append(client)
        for task, client in lost:
            if client not in holders.get(task, ()):
                holders.setdefault(task, []).append(client)
        # Holders were appended in client order; without lags, lost claims or a task both
        # active and standby on one client, that already is rank order (see ``_rank``).
        self._ranked = bool(lost) or any(
            state.lags or state.prev_active & state.prev_standby for state in self.clients
        )
        if self._ranked:
            rank = self._rank
            for task, found in holders.items():
                if len(found) > 1:
                    keyed = [rank(task, client) for client in found]
                    keyed.sort()  # ranks end with the client index: no ties
                    found[:] = [k[-1] for k in keyed]
        return holders

    def _restart_claims(self, orphans: list[tuple[int, int]]) -> list[list[int]]:
        """Per client, in task order, the orphans it alone ranks best on and has at lag 0 —
        only when no client reports anything as run (the whole group restarted).

        After a restart with stores on disk (every store reported with its lag), those are
        the tasks the client ran: it keeps them like previous tasks. While some client reports
        what it ran, a client reporting nothing may just have run nothing (a survivor of a
        crash with caught-up standbys): claims there would block the warm takeovers of other
        orphans, so its standbys stay ordinary warm holders.
        """
        claims: list[list[int]] = [[] for _ in self.clients]
        if not self._ranked or any(c.prev_active for c in self.clients):
            return claims  # no lags (nobody has a task at lag 0), or not a whole-group restart
        rank, warm = self._rank, self.warm
        for task in sorted(task for _, task in orphans):
            holders = warm[task]
            best = rank(task, holders[0])
            if best[3] == 0 and (len(holders) == 1 or rank(task, holders[1])[:4] != best[:4]):
                claims[holders[0]].append(task)
        return claims

    def _rank(self, task: int, client: int) -> tuple[int, int, int, int, int]:
        """Order of clients holding state of ``task``, best first: standby holders, then
        caught-up ones (lag within the acceptable recovery lag count as equal), then one that
        ran the task (a restarted process whose claim lost to the interim owner), then by lag.
        """
        key = task * len(self.clients) + client
        got = self._ranks.get(key)
        if got is None:
            state, task_id = self.clients[client], self.tasks[task]
            ran = 0 if task_id in state.prev_active else 1
            tier = 0 if task_id in state.prev_standby else 1
            lag = state.lags.get(task_id, _UNKNOWN_LAG if tier == 0 else 0)
            got = self._ranks[key] = (
                tier,
                0 if lag <= self.acceptable_lag else lag,
                ran,
                lag,
                client,
            )
        return got

    def _returning(self, task: int, owner: int, room: list[int], promised: list[int]) -> int:
        """A client other than ``owner`` that ran ``task`` before, is caught up on it and has
        room not yet promised (-1: none)."""
        task_id = self.tasks[task]
        for holder in self.warm.get(task, ()):
            state = self.clients[holder]
            if (
                holder != owner
                and task_id in state.prev_active
                and state.lags.get(task_id, _UNKNOWN_LAG) <= self.acceptable_lag
                and room[holder] - promised[holder] > 0
            ):
                return holder
        return -1

    def _holders(self, task: int) -> list[int]:
        """Clients holding state of ``task``, best first."""
        return self.warm.get(task, [])

    def _standby_holders(self, task: int) -> list[int]:
        """Clients holding a standby of ``task``, best first (the first tier of ``_rank``)."""
        return [holder for holder in self.warm.get(task, ()) if self._rank(task, holder)[0] == 0]

    def _no_worse(self, task: int, taker: int, holder: int) -> bool:
        """Whether ``task``, taken over by ``taker``, may go to ``holder`` instead: ``holder``
        ranks at least as high (``_rank`` without the client index: standby holder, caught up, ran
        it before, lag), so a chain never takes a task from a restarted process that ran it or
        from a fresher copy."""
        return self._rank(task, holder)[:4] <= self._rank(task, taker)[:4]
