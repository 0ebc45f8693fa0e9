"""Small integer helpers shared by the task assignor, the thread distributor and the metrics.

They carry the two ideas every balanced-and-sticky assignment here rests on:
- *apportion*: split ``total`` items over bins in proportion to their weights, every bin getting
  the floor or the ceiling of its exact share, the ceilings going to the bins that most want them;
- *deal*: hand an ordered list of items to bins with free room so that any contiguous run of the
  list (e.g. one subtopology's tasks) is spread over the bins in proportion to their room.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def share_bounds(total: int, weights: Sequence[int]) -> list[tuple[int, int]]:
    """Floor and ceiling of each bin's exact share ``total * w / sum(weights)``."""
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
    whole = sum(weights)
    quotas: list[int] = []
    fractional: list[int] = []
    remainders: list[int] = []
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
    slots = [((2 * k + 1) / (2 * room), b) for b, room in enumerate(rooms) for k in range(room)]
    slots.sort()
    return [b for _, b in slots]


def level_order(items: Sequence[Any], group: Callable[[Any], Any]) -> list[Any]:
    """Reorder ``items`` so that any prefix takes as evenly as possible from every group.

    The first pass takes each group's first item, the second pass each group's second, and so
    on; keeping a prefix of the result keeps a group-balanced subset (used to choose which of a
    client's previous tasks it keeps, so one subtopology is not piled on one client).
    """
    rank: dict[Any, int] = {}
    keyed = []
    for pos, item in enumerate(items):
        g = group(item)
        r = rank.get(g, 0)
        rank[g] = r + 1
        keyed.append((r, pos, item))
    keyed.sort(key=lambda k: (k[0], k[1]))
    return [item for _, _, item in keyed]
