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
        kind, examples = queue.kinds()
        few = len(examples) <= RACK_SCAN  # the queue remembers costs by kind
        budget = _EXCHANGE_BUDGET
        for copy_slot in placed:
            client_here = copies[copy_slot]
            if client_here < 0:
                continue
            mine = self._other_holders(copies, copy_slot)
            costs = queue.costs(mine) if few else None
            here = (
                costs[kind[client_here]]
                if costs is not None
                else queue.conflicts(client_here, mine)
            )
            if here == 0:
                continue
            if costs is None:
                costs = queue.costs(mine)
            budget -= len(costs)
            if min(costs) >= here:
                continue  # no client would do better for this copy
            budget = self._exchange_copy(copy_slot, here, costs, placed, copies, queue, budget)
            if budget < 0:
                return

    def _exchange_copy(
        self,
        copy_slot: int,
        here: int,
        costs: list[int],
        placed: list[int],
        copies: list[int],
        queue: StandbyQueue,
        budget: int,
    ) -> int:
        """Swap the copy in ``copy_slot`` (``here`` conflicts where it is; ``costs`` by kind of
        client) with the first partner that lowers the conflicts; returns the budget left
        (below 0: the pass stops)."""
        r = self.replicas
        kind, examples = queue.kinds()
        few = len(examples) <= RACK_SCAN
        client_here = copies[copy_slot]
        for partner_slot in placed[:_EXCHANGE_SCAN]:
            budget -= 1
            if budget < 0:
                return budget
            client_there = copies[partner_slot]
            if (
                client_there < 0
                or client_there == client_here
                or costs[kind[client_there]] >= here
                or partner_slot // r == copy_slot // r
            ):
                continue
            if self._holds(copies, copy_slot, client_there) or self._holds(
                copies, partner_slot, client_here
            ):
                continue
            budget -= _EXCHANGE_COST
            theirs = self._other_holders(copies, partner_slot)
            if few:
                by_kind = queue.costs(theirs)
                delta = by_kind[kind[client_here]] - by_kind[kind[client_there]]
            else:
                delta = queue.conflicts(client_here, theirs) - queue.conflicts(client_there, theirs)
            if costs[kind[client_there]] + delta < here:
                copies[copy_slot], copies[partner_slot] = client_there, client_here
                break
        return budget

    def _other_holders(self, copies: list[int], slot: int) -> list[int]:
        """The active client and the other standby holders of the task of ``slot``."""
        r = self.replicas
        task = slot // r
        return [
            self.owner[task],
            *(
                holder
                for k, holder in enumerate(copies[task * r : (task + 1) * r])
                if task * r + k != slot
            ),
        ]

    def _holds(self, copies: list[int], slot: int, client: int) -> bool:
        """Whether ``client`` runs or holds a copy of the task of ``slot``."""
        r = self.replicas
        task = slot // r
        return self.owner[task] == client or client in copies[task * r : (task + 1) * r]
