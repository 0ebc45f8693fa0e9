"""Dealing: hand an ordered list of tasks to clients with room so any run of it (one
subtopology) spreads in proportion to their room; and choosing a subtopology-balanced subset."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import compress
from typing import Any


def deal(rooms: Sequence[int]) -> list[int]:
    """An order of bins, bin ``b`` appearing ``rooms[b]`` times, evenly interleaved.

    Items handed out along this order in sequence give every contiguous run of items to the
    bins roughly in proportion to their room (each bin's ``k``-th slot sits at ``(k + 1/2) /
    room`` of the way through). Ties go to the lower bin index, so the order is deterministic.
    """
    slots = []
    for b in compress(range(len(rooms)), rooms):  # the bins with room (often few)
        room = rooms[b]
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
