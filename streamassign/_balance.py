"""Small integer helpers shared by the task assignor, the thread distributor and the metrics.

They carry the two ideas every balanced-and-sticky assignment here rests on:
- *apportion*: split ``total`` items over bins in proportion to their weights, every bin getting
  the floor or the ceiling of its exact share, the ceilings going to the bins that most want them;
- *deal*: hand an ordered list of items to bins with free room so that any contiguous run of the
  list (e.g. one subtopology's tasks) is spread over the bins in proportion to their room.

They run inside every rebalance, usually on small inputs and with cold caches; on CPython 3.11
each comprehension and lambda is a code object of its own, so they are written as plain loops.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from itertools import repeat
from operator import add, itemgetter, sub
from typing import Any

_FLOOR = itemgetter(0)


def share_bounds(total: int, weights: Sequence[int]) -> list[tuple[int, int]]:
    """Floor and ceiling of each bin's exact share ``total * w / sum(weights)``."""
    n = len(weights)
    if n and weights.count(weights[0]) == n:  # equal weights (the common case): one share
        lo, rem = divmod(total, n)
        return [(lo, lo + 1 if rem else lo)] * n
    whole = sum(weights)
    out = []
    for w in weights:
        lo, rem = divmod(total * w, whole)
        out.append((lo, lo + 1 if rem else lo))
    return out


def apportion(
    total: int, weights: Sequence[int], priority: Callable[[int], Any] | None = None
) -> list[int]:
    """Quota of each bin: floor or ceiling of its share, summing to ``total``.

    The ``total - sum(floors)`` ceilings go to the bins with a fractional share, smallest
    ``priority(bin)`` first (default: largest remainder, then bin order) — callers pass their
    stickiness preference here. Deterministic for a deterministic ``priority``.
    """
    n = len(weights)
    if n and weights.count(weights[0]) == n:  # equal weights: every bin the same share
        lo, extras = divmod(total, n)
        quotas = [lo] * n
        fractional = list(range(n)) if extras else []
        remainders = [extras] * n
    else:
        whole = sum(weights)
        quotas = []
        fractional = []
        remainders = []
        for i, w in enumerate(weights):
            lo, rem = divmod(total * w, whole)
            quotas.append(lo)
            remainders.append(rem)
            if rem:
                fractional.append(i)
        extras = total - sum(quotas)
    if extras:
        key = priority if priority is not None else (lambda i: (-remainders[i], i))
        fractional.sort(key=key)
        for i in fractional[:extras]:
            quotas[i] += 1
    return quotas


def deal(rooms: Sequence[int]) -> list[int]:
    """An order of bins, bin ``b`` appearing ``rooms[b]`` times, evenly interleaved.

    Items handed out along this order in sequence give every contiguous run of items to the
    bins roughly in proportion to their room (each bin's ``k``-th slot sits at ``(k + 1/2) /
    room`` of the way through). Ties go to the lower bin index, so the order is deterministic.
    """
    slots = []
    for b, room in enumerate(rooms):
        for k in range(room):
            slots.append(((2 * k + 1) / (2 * room), b))
    slots.sort()
    order = []
    for _, b in slots:
        order.append(b)
    return order


def level_order(items: Sequence[Any], group: Callable[[Any], Any]) -> list[Any]:
    """Reorder ``items`` so that any prefix takes as evenly as possible from every group.

    The first pass takes each group's first item, the second pass each group's second, and so
    on; keeping a prefix of the result keeps a group-balanced subset (used to choose which of a
    client's previous tasks it keeps, so one subtopology is not piled on one client).
    """
    groups = list(map(group, items))
    if not groups or groups.count(groups[0]) == len(groups):
        return list(items)  # one group: already in order
    rank: dict[Any, int] = {}
    keyed = []
    for pos, item in enumerate(items):
        g = groups[pos]
        r = rank.get(g, 0)
        rank[g] = r + 1
        keyed.append((r, pos, item))
    keyed.sort(key=_first_two)
    out = []
    for _, _, item in keyed:
        out.append(item)
    return out


def _first_two(k: tuple[int, int, Any]) -> tuple[int, int]:
    return k[0], k[1]


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
