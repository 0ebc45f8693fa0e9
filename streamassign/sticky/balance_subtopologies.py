"""Step 2, ``balance="subtopology"`` (default): the quota matrix per (client, subtopology)
keeping the most previous tasks (``compute_quotas``), then keep, take over and deal each
subtopology on its own; orphans then move to standby holders where the matrix allows."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import compress
from operator import itemgetter

from ..shares import share_bounds
from .balance_totals import BalanceTotals
from .compute_quotas import best_quotas, quota_bounds


class BalanceSubtopologies(BalanceTotals):
    """Actives balanced per subtopology and in total."""

    def _actives_per_subtopology(self) -> None:
        """Quotas per (client, subtopology) (``balance="subtopology"``): the admissible quota
        matrix keeping the most previous tasks, then claims and warm takeovers (``compute_quotas``);
        then each subtopology is kept, taken over warm and dealt on its own."""
        caps = [c.capacity for c in self.clients]
        sizes, column, n_clients = self.column_sizes, self.column, len(caps)
        bounds = quota_bounds(sizes, caps)
        column_bounds = [share_bounds(size, caps) for size in sizes]
        # Per subtopology, per client (what each subtopology's steps read): what it ran.
        prev = _by_column(enumerate(self.prev_owner), column, len(sizes), n_clients)
        warm = self.warm
        # As in ``_actives_by_total``: each orphan counted for the warm holder with the fewest
        # matches so far that has room for it below the ceiling of its cell.
        matched = [[0] * n_clients for _ in sizes]
        orphans = sorted(
            (len(holder), task) for task, holder in warm.items() if self.prev_owner[task] < 0
        )
        for _, task in orphans:
            col = column[task]
            matched_col, prev_col, bounds_col = matched[col], prev[col], column_bounds[col]
            roomy = [
                holder
                for holder in warm[task]
                if matched_col[holder] < bounds_col[holder][1] - len(prev_col[holder])
            ]
            if roomy:
                matched_col[min(roomy, key=matched_col.__getitem__)] += 1
        claimed = (
            (task, client)
            for client, mine in enumerate(self._restart_claims(orphans))
            for task in mine
        )
        claims = _by_column(claimed, column, len(sizes), n_clients)
        gains = self._cell_gains(column_bounds, prev, claims, matched)
        quotas = best_quotas(sizes, caps, gains, bounds)
        start = 0
        for col, size in enumerate(sizes):
            scope = range(start, start + size)
            start += size
            self._keep_and_place(scope, list(map(itemgetter(col), quotas)), prev[col], claims[col])
        self._hand_orphans_to_standby_holders(bounds[0], caps)

    def _hand_orphans_to_standby_holders(
        self, cells: list[list[tuple[int, int]]], caps: list[int]
    ) -> None:
        """An orphan placed on a client without a standby of it moves to a standby holder of
        it when the quota matrix allows: the placing client above its floors (cell and total),
        the holder below its ceilings. The cell ceiling moves with it, so every count stays
        admissible, and no kept task moves. The gains that chose the matrix only estimate
        where orphans can go warm; this makes sure no such hand-over is left."""
        # Orphans with a standby holder other than their client; each hand-over takes one
        # off for good, and one may free room for an earlier one: passes until none moves.
        waiting = self._orphans_beside_standby_holders()
        if not waiting:
            return  # the common case: no counts needed
        rows = share_bounds(len(self.tasks), caps)
        counts, totals = self._active_counts(len(caps))
        moved = True
        while moved:
            moved = False
            for task in waiting:
                moved = self._hand_over_orphan(task, counts, totals, cells, rows) or moved
            owner = self.owner
            waiting = [task for task in waiting if owner[task] not in self._standby_holders(task)]

    def _active_counts(self, n_clients: int) -> tuple[list[list[int]], list[int]]:
        """Actives of each client per subtopology, and in total."""
        counts = [[0] * len(self.column_sizes) for _ in range(n_clients)]
        totals = [0] * n_clients
        column = self.column
        for task, client in enumerate(self.owner):
            counts[client][column[task]] += 1
            totals[client] += 1
        return counts, totals

    def _orphans_beside_standby_holders(self) -> list[int]:
        """Orphans placed on a client that holds no standby of them while some client does."""
        prev_owner, warm = self.prev_owner, self.warm
        # ``task in warm`` first: most orphans have no holder at all (a fresh group), and the
        # holder list is then known to be empty without building it.
        return [
            task
            for task, client in enumerate(self.owner)
            if prev_owner[task] < 0
            and task in warm
            and (found := self._standby_holders(task))
            and client not in found
        ]

    def _hand_over_orphan(
        self,
        task: int,
        counts: list[list[int]],
        totals: list[int],
        cells: list[list[tuple[int, int]]],
        rows: list[tuple[int, int]],
    ) -> bool:
        """Move orphan ``task`` to its first standby holder below its cell and total ceilings,
        when its client is above both floors; whether it moved (``counts`` kept current)."""
        client, col = self.owner[task], self.column[task]
        if counts[client][col] <= cells[client][col][0] or totals[client] <= rows[client][0]:
            return False
        for holder in self._standby_holders(task):
            if counts[holder][col] < cells[holder][col][1] and totals[holder] < rows[holder][1]:
                self.owner[task] = holder
                counts[client][col] -= 1
                totals[client] -= 1
                counts[holder][col] += 1
                totals[holder] += 1
                return True
        return False

    @staticmethod
    def _cell_gains(
        column_bounds: list[list[tuple[int, int]]],
        prev: list[list[Sequence[int]]],
        claims: list[list[Sequence[int]]],
        matched: list[list[int]],
    ) -> list[list[int]]:
        """What a cell's ceiling is worth, in strict priority: a previous task kept (the move
        bound), then a restart claim kept, then a matched orphan taken over warm. Read per
        subtopology, returned per client (``gains[client][subtopology]``). A cell whose
        client ran, claimed and matched nothing there is worth 0 (floors are never
        negative), so only the other cells are visited: with one task per client, most are
        empty."""
        n_clients = len(column_bounds[0]) if column_bounds else 0
        tier = n_clients * len(column_bounds) + 1
        gains = [[0] * len(column_bounds) for _ in range(n_clients)]
        everyone = range(n_clients)
        for col, (bounds, ran_col, claims_col, matched_col) in enumerate(
            zip(column_bounds, prev, claims, matched, strict=True)
        ):
            holding = {
                *compress(everyone, ran_col),
                *compress(everyone, claims_col),
                *compress(everyone, matched_col),
            }
            for client in holding:
                lo = bounds[client][0]
                ran = len(ran_col[client])
                claimed = ran + len(claims_col[client])
                gains[client][col] = (
                    (ran > lo) * tier * tier
                    + (claimed > lo) * tier
                    + (claimed + matched_col[client] > lo)
                )
        return gains

    def _keep_and_place(
        self,
        scope: range,
        quotas: list[int],
        prev: Sequence[Sequence[int]],
        claims: Sequence[Sequence[int]],
    ) -> None:
        """One subtopology's tasks (``scope``), with its column of the quota matrix: each client
        keeps up to its quota of what it ran, then of its claims; the rest are placed."""
        room = self._keep_previous(quotas, prev, claims)
        # Quotas of a column are fixed by the matrix: a chain may not move a ceiling.
        self._place_orphans(scope, room, list(quotas), list(zip(quotas, quotas, strict=True)))


#: The tasks of a cell without any (shared: cells are only read).
_NO_TASKS: tuple[int, ...] = ()


def _by_column(
    owned: Iterable[tuple[int, int]], column: list[int], n_columns: int, n_clients: int
) -> list[list[Sequence[int]]]:
    """Per column, per client, the tasks of the ``(task, client)`` pairs (client -1: none), in
    the order given. Empty cells share one empty tuple: with one task per client nearly every
    cell is empty, and a list per cell meant thousands of small lists per run."""
    found: list[dict[int, list[int]]] = [{} for _ in range(n_columns)]
    for task, client in owned:
        if client >= 0:
            found[column[task]].setdefault(client, []).append(task)
    by_column: list[list[Sequence[int]]] = []
    for cells in found:
        row: list[Sequence[int]] = [_NO_TASKS] * n_clients
        for client, tasks in cells.items():
            row[client] = tasks
        by_column.append(row)
    return by_column
