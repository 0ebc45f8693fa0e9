"""Steps 4-5 (warm takeovers, dealing): tasks nobody keeps go to a client holding their state
(greedy, then chains of takeovers), the rest are dealt evenly over the free room."""

from __future__ import annotations

from collections.abc import Sequence

from .chain_takeovers import augment_takeovers
from .deal_tasks import deal
from .match_racks import MatchRacks


class PlaceOrphans(MatchRacks):
    """Warm takeovers, then dealing."""

    def _place_orphans(
        self,
        scope: range,
        room: list[int],
        quotas: list[int],
        bounds: Sequence[tuple[int, int]],
    ) -> None:
        """Give the tasks of ``scope`` nobody keeps to clients with ``room``: warm takeovers
        first, then dealt in task order over the free room (``room`` is used up)."""
        owner, warm = self.owner, self.warm
        # Warm takeovers: over all (task, holder) pairs, standby holders first, then the
        # smallest lag, so a contested client's room goes to what it is most caught up on.
        rank = self._rank
        pairs = []
        for task in scope:
            if owner[task] < 0:
                for holder in warm.get(task, ()):
                    k = rank(task, holder)
                    pairs.append((k[0], k[1], k[2], k[3], task, holder))
        pairs.sort()
        took: dict[int, list[int]] = {}  # client -> tasks it took over warm
        later = len(pairs)
        if self._ranked:
            # Standby holders first, chains and moved ceilings included, before a holder with
            # other local state takes anything: such a holder would fill a ceiling a standby
            # holder of the same orphan could have had.
            later = next((k for k, p in enumerate(pairs) if p[0]), later)
        _take_warm(pairs[:later], owner, room, took)
        if later < len(pairs):
            waiting = sorted({p[4] for p in pairs[:later] if owner[p[4]] < 0})
            if waiting:
                augment_takeovers(waiting, self._standby_holders, owner, took, room, quotas, bounds)
            _take_warm(pairs[later:], owner, room, took)
        cold = [task for task in scope if owner[task] < 0]
        if not warm.keys().isdisjoint(cold):
            cold = augment_takeovers(
                cold, self._holders, owner, took, room, quotas, bounds, self._no_worse
            )

        # Spread the rest in (subtopology, partition) order over the free room.
        for task, client in zip(cold, deal(room), strict=True):
            owner[task] = client
        if self.task_racks:
            self._match_racks(cold)


def _take_warm(
    pairs: list[tuple[int, int, int, int, int, int]],
    owner: list[int],
    room: list[int],
    took: dict[int, list[int]],
) -> None:
    """Greedy warm pass: each (rank..., task, holder) pair in order gives the task to the holder
    while the task has no owner and the holder has room; ``took`` records the takeovers."""
    for *_, task, holder in pairs:
        if owner[task] < 0 and room[holder] > 0:
            owner[task] = holder
            room[holder] -= 1
            took.setdefault(holder, []).append(task)
