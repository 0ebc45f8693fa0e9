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
        for ci, c in enumerate(self.clients):
            for t in c.prev_standby:
                i = index.get(t)
                if i is not None:
                    holders.setdefault(i, []).append(ci)
            for t in c.lags:
                if t not in c.prev_standby and t not in c.prev_active:
                    i = index.get(t)
                    if i is not None:
                        holders.setdefault(i, []).append(ci)
        for i, ci in lost:
            if ci not in holders.get(i, ()):
                holders.setdefault(i, []).append(ci)
        # Holders were appended in client order; without lags, lost claims or a task both
        # active and standby on one client, that already is rank order (see ``_rank``).
        self._ranked = bool(lost) or any(
            c.lags or c.prev_active & c.prev_standby for c in self.clients
        )
        if self._ranked:
            rank = self._rank
            for i, found in holders.items():
                if len(found) > 1:
                    keyed = [rank(i, ci) for ci in found]
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
        for i in sorted(i for _, i in orphans):
            found = warm[i]
            best = rank(i, found[0])
            if best[3] == 0 and (len(found) == 1 or rank(i, found[1])[:4] != best[:4]):
                claims[found[0]].append(i)
        return claims

    def _rank(self, i: int, ci: int) -> tuple[int, int, int, int, int]:
        """Order of clients holding state of task ``i``, best first: standby holders, then
        caught-up ones (lag within the acceptable recovery lag count as equal), then one that
        ran the task (a restarted process whose claim lost to the interim owner), then by lag.
        """
        key = i * len(self.clients) + ci
        got = self._ranks.get(key)
        if got is None:
            c, t = self.clients[ci], self.tasks[i]
            ran = 0 if t in c.prev_active else 1
            tier = 0 if t in c.prev_standby else 1
            lag = c.lags.get(t, _UNKNOWN_LAG if tier == 0 else 0)
            got = self._ranks[key] = (tier, 0 if lag <= self.acceptable_lag else lag, ran, lag, ci)
        return got

    def _returning(self, i: int, ci: int, room: list[int], promised: list[int]) -> int:
        """A client other than ``ci`` that ran task ``i`` before, is caught up on it and has
        room not yet promised (-1: none)."""
        t = self.tasks[i]
        for h in self.warm.get(i, ()):
            c = self.clients[h]
            if (
                h != ci
                and t in c.prev_active
                and c.lags.get(t, _UNKNOWN_LAG) <= self.acceptable_lag
                and room[h] - promised[h] > 0
            ):
                return h
        return -1

    def _holders(self, i: int) -> list[int]:
        """Clients holding state of task ``i``, best first."""
        return self.warm.get(i, [])

    def _standby_holders(self, i: int) -> list[int]:
        """Clients holding a standby of task ``i``, best first (the first tier of ``_rank``)."""
        return [h for h in self.warm.get(i, ()) if self._rank(i, h)[0] == 0]

    def _no_worse(self, u: int, a: int, x: int) -> bool:
        """Whether task ``u``, taken over by ``a``, may go to holder ``x`` instead: ``x`` ranks
        at least as high (``_rank`` without the client index: standby holder, caught up, ran
        it before, lag), so a chain never takes a task from a restarted process that ran it or
        from a fresher copy."""
        return self._rank(u, x)[:4] <= self._rank(u, a)[:4]
