"""Step 7 (standby targets): how many standbys each client takes, bringing its active+standby
load to the floor or ceiling of its share as far as one copy per client allows."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from itertools import repeat
from operator import add, itemgetter, sub

from ..shares import share_bounds
from .assign_actives import AssignActives

_FLOOR = itemgetter(0)


def standby_targets(
    caps: Sequence[int],
    actives: Sequence[int],
    stateful_active: Sequence[int],
    valid_prev: Sequence[int],
    n_stateful: int,
    replicas: int,
) -> list[int]:
    """Standbys per client, bringing each client's active+standby load to the floor or ceiling
    of its capacity share as far as one copy per client allows (at most ``n_stateful -
    stateful_active[c]`` standbys on client ``c``).

    ``valid_prev[c]`` counts the previous standbys client ``c`` could keep; where the targets
    need a tie broken, they favour keeping those, so a balanced layout is a fixed point.
    """
    n = len(caps)
    total = sum(actives) + n_stateful * replicas
    bounds = share_bounds(total, caps)
    # C-level passes over the clients (map/zip): this runs in every rebalance. ``most`` is
    # the most a client can hold: a copy of every stateful task it does not run.
    most = list(map(sub, map(add, actives, repeat(n_stateful)), stateful_active))
    floors = list(map(_FLOOR, bounds))
    if n and max(actives) <= min(floors) and max(floors) <= min(most):
        target = floors  # every floor already at or above the actives and reachable
    else:
        target = list(map(min, map(max, floors, actives), most))
    missing = total - sum(target)
    if missing > 0:
        # Spare ceilings go to the clients furthest above their floor now (the load they could
        # keep); raise to the ceiling first, then beyond it only where one copy per client
        # forces it (lowest load per thread first).
        order = []
        for ci in range(n):
            if target[ci] < min(bounds[ci][1], most[ci]):
                order.append((bounds[ci][0] - actives[ci] - valid_prev[ci], ci))
        order.sort()
        for _, ci in order[:missing]:
            target[ci] += 1
        missing -= min(missing, len(order))
        if missing > 0:
            heap = []
            for ci in range(n):
                if target[ci] < most[ci]:
                    heap.append((target[ci] / caps[ci], ci))
            heapq.heapify(heap)
            while missing > 0:
                _, ci = heapq.heappop(heap)
                target[ci] += 1
                missing -= 1
                if target[ci] < most[ci]:
                    heapq.heappush(heap, (target[ci] / caps[ci], ci))
    elif missing < 0:
        # Actives at their ceiling pushed some clients above the floor: take standbys first from
        # clients still above their floor after giving one, then from those whose target exceeds
        # the previous standbys they could keep (so none has to drop one it holds), then from the
        # most loaded per thread.
        givers = []
        for ci in range(n):
            if target[ci] > actives[ci]:
                givers.append(_giver(ci, target, actives, bounds, valid_prev, caps))
        heapq.heapify(givers)
        while missing < 0:
            *_, ci = heapq.heappop(givers)
            target[ci] -= 1
            missing += 1
            if target[ci] > actives[ci]:
                heapq.heappush(givers, _giver(ci, target, actives, bounds, valid_prev, caps))
    return list(map(sub, target, actives))


def _giver(
    ci: int,
    target: Sequence[int],
    actives: Sequence[int],
    bounds: Sequence[tuple[int, int]],
    valid_prev: Sequence[int],
    caps: Sequence[int],
) -> tuple[bool, bool, float, int]:
    """Heap entry of a client that may give up a standby (see ``standby_targets``)."""
    return (
        target[ci] <= bounds[ci][0],
        valid_prev[ci] >= target[ci] - actives[ci],
        -target[ci] / caps[ci],
        ci,
    )


class SetStandbyTargets(AssignActives):
    """Standby targets per client."""

    def _standby_targets(self) -> tuple[list[int], list[int]]:
        """Standbys per client (total load near its share, within what one copy allows), and
        how many previous standbys each could keep."""
        stateful_active = [0] * len(self.clients)
        for i, ci in enumerate(self.owner):
            if self.stateful[i]:
                stateful_active[ci] += 1
        valid = [self._valid_prev_standbys(ci) for ci in range(len(self.clients))]
        targets = standby_targets(
            [c.capacity for c in self.clients],
            [len(a) for a in self.active],
            stateful_active,
            valid,
            sum(self.stateful),
            self.replicas,
        )
        return targets, valid

    def _valid_prev_standbys(self, ci: int) -> int:
        """Previous standbys of client ``ci`` it could keep: stateful, not active there."""
        index, owner, stateful = self.index, self.owner, self.stateful
        n = 0
        for t in self.clients[ci].prev_standby:
            i = index.get(t)
            if i is not None and stateful[i] and owner[i] != ci:
                n += 1
        return n
