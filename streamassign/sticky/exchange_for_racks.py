"""Step 10 (racks): two standbys placed in this run swap clients when that lowers their rack and
tag conflicts (loads unchanged; kept copies never move)."""

from __future__ import annotations

from typing import Final

from .pick_standby_clients import RACK_SCAN, StandbyQueue
from .return_dropped_standbys import ReturnDroppedStandbys

#: Standbys each rack-conflicting standby is weighed against for an exchange.
_EXCHANGE_SCAN: Final = 2048
#: Steps the exchange pass takes in all: one per partner looked at, ``_EXCHANGE_COST`` more per
#: partner weighed. Unbounded, 1,000 tasks with 4 standbys over 3 racks took 18 s.
_EXCHANGE_BUDGET: Final = 1 << 18
_EXCHANGE_COST: Final = 16


class ExchangeForRacks(ReturnDroppedStandbys):
    """The rack exchange step."""

    def _exchange_for_racks(
        self, placed: list[int], copies: list[int], queue: StandbyQueue
    ) -> None:
        """Undo what greedy placement could not foresee: two standbys placed in this run swap
        clients when that lowers their rack and tag conflicts (loads stay as they are). Copies
        kept from before are not moved: warm state outweighs placement.

        A copy is looked at only when some kind of client (equal rack and tags) would lower
        its own conflicts, and then only partners on such clients: so copies whose conflicts
        no client can avoid (more copies than racks) cost one check. Bounded work: at most
        ``_EXCHANGE_SCAN`` partners per copy and ``_EXCHANGE_BUDGET`` steps in all (large
        inputs may keep conflicts a longer search would remove).
        """
        r, owner = self.replicas, self.owner

        def group(slot: int) -> list[int]:
            i = slot // r
            return [
                owner[i],
                *(x for k, x in enumerate(copies[i * r : (i + 1) * r]) if i * r + k != slot),
            ]

        def holds(slot: int, ci: int) -> bool:
            i = slot // r
            return owner[i] == ci or ci in copies[i * r : (i + 1) * r]

        kind, examples = queue.kinds()
        few = len(examples) <= RACK_SCAN  # the queue remembers costs by kind
        budget = _EXCHANGE_BUDGET
        for a in placed:
            d = copies[a]
            if d < 0:
                continue
            mine = group(a)
            costs = queue.costs(mine) if few else None
            here = costs[kind[d]] if costs is not None else queue.conflicts(d, mine)
            if here == 0:
                continue
            if costs is None:
                costs = queue.costs(mine)
            budget -= len(costs)
            if min(costs) >= here:
                continue  # no client would do better for this copy
            for b in placed[:_EXCHANGE_SCAN]:
                budget -= 1
                if budget < 0:
                    return
                e = copies[b]
                if e < 0 or e == d or costs[kind[e]] >= here or b // r == a // r:
                    continue
                if holds(a, e) or holds(b, d):
                    continue
                budget -= _EXCHANGE_COST
                theirs = group(b)
                if few:
                    by_kind = queue.costs(theirs)
                    delta = by_kind[kind[d]] - by_kind[kind[e]]
                else:
                    delta = queue.conflicts(d, theirs) - queue.conflicts(e, theirs)
                if costs[kind[e]] + delta < here:
                    copies[a], copies[b] = e, d
                    break
