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
    clients = len(caps)
    total = sum(actives) + n_stateful * replicas
    bounds = share_bounds(total, caps)
    # C-level passes over the clients (map/zip): this runs in every rebalance. ``most`` is
    # the most a client can hold: a copy of every stateful task it does not run.
    most = list(map(sub, map(add, actives, repeat(n_stateful)), stateful_active))
    floors = list(map(_FLOOR, bounds))
    if clients and max(actives) <= min(floors) and max(floors) <= min(most):
        target = floors  # every floor already at or above the actives and reachable
    else:
        target = list(map(min, map(max, floors, actives), most))
    missing = total - sum(target)
    if missing > 0:
        _raise_targets(target, missing, bounds, most, actives, valid_prev, caps)
    elif missing < 0:
        _lower_targets(target, -missing, bounds, actives, valid_prev, caps)
    return list(map(sub, target, actives))


def _raise_targets(
    target: list[int],
    missing: int,
    bounds: Sequence[tuple[int, int]],
    most: Sequence[int],
    actives: Sequence[int],
    valid_prev: Sequence[int],
    caps: Sequence[int],
) -> None:
    """Add ``missing`` to the load targets (in place). Spare ceilings go to the clients
    furthest above their floor now (the load they could keep); raise to the ceiling first,
    then beyond it only where one copy per client forces it (lowest load per thread first)."""
    order = []
    for client in range(len(caps)):
        if target[client] < min(bounds[client][1], most[client]):
            order.append((bounds[client][0] - actives[client] - valid_prev[client], client))
    order.sort()
    for _, client in order[:missing]:
        target[client] += 1
    missing -= min(missing, len(order))
    if missing > 0:
        heap = []
        for client in range(len(caps)):
            if target[client] < most[client]:
                heap.append((target[client] / caps[client], client))
        heapq.heapify(heap)
        while missing > 0:
            _, client = heapq.heappop(heap)
            target[client] += 1
            missing -= 1
            if target[client] < most[client]:
                heapq.heappush(heap, (target[client] / caps[client], client))


def _lower_targets(
    target: list[int],
    surplus: int,
    bounds: Sequence[tuple[int, int]],
    actives: Sequence[int],
    valid_prev: Sequence[int],
    caps: Sequence[int],
) -> None:
    """Take ``surplus`` off the load targets (in place). Actives at their ceiling pushed some
    clients above the floor: take standbys first from clients still above their floor after
    giving one, then from those whose target exceeds the previous standbys they could keep
    (so none has to drop one it holds), then from the most loaded per thread."""
    givers = []
    for client in range(len(caps)):
        if target[client] > actives[client]:
            givers.append(_giver(client, target, actives, bounds, valid_prev, caps))
    heapq.heapify(givers)
    while surplus > 0:
        *_, client = heapq.heappop(givers)
        target[client] -= 1
        surplus -= 1
        if target[client] > actives[client]:
            heapq.heappush(givers, _giver(client, target, actives, bounds, valid_prev, caps))


def _giver(
    client: int,
    target: Sequence[int],
    actives: Sequence[int],
    bounds: Sequence[tuple[int, int]],
    valid_prev: Sequence[int],
    caps: Sequence[int],
) -> tuple[bool, bool, float, int]:
    """Heap entry of a client that may give up a standby (see ``standby_targets``)."""
    return (
        target[client] <= bounds[client][0],
        valid_prev[client] >= target[client] - actives[client],
        -target[client] / caps[client],
        client,
    )


class SetStandbyTargets(AssignActives):
    """Standby targets per client."""

    def _standby_targets(self) -> tuple[list[int], list[int]]:
        """Standbys per client (total load near its share, within what one copy allows), and
        how many previous standbys each could keep."""
        stateful_active = [0] * len(self.clients)
        for task, client in enumerate(self.owner):
            if self.stateful[task]:
                stateful_active[client] += 1
        valid = self._keepable_prev_standbys()
        targets = standby_targets(
            [c.capacity for c in self.clients],
            [len(a) for a in self.active],
            stateful_active,
            valid,
            sum(self.stateful),
            self.replicas,
        )
        return targets, valid

    def _keepable_prev_standbys(self) -> list[int]:
        """Previous standbys each client could keep: of a stateful task it does not run, and
        among the task's ``replicas`` best-ranked standby holders. A process reports every
        store it has on disk, also ones left from older assignments; counted too, they moved
        the targets' tie-breaks, so a converged assignment fed back moved standbys, some onto
        stale stores (29 of 1,000 random chains with stores left on disk)."""
        keepable = [0] * len(self.clients)
        owner, stateful, clients, tasks = self.owner, self.stateful, self.clients, self.tasks
        for task, holders in self.warm.items():
            if not stateful[task]:
                continue
            left, task_id = self.replicas, tasks[task]
            for client in holders:  # best first
                if left == 0:
                    break
                if client != owner[task] and task_id in clients[client].prev_standby:
                    keepable[client] += 1
                    left -= 1
        return keepable
