"""Fair shares of a total over weighted bins: the integer arithmetic behind every balanced
assignment here, public for the layers that balance anything of their own (the consumer-group
assignors, the simulation pipeline) so they use the same rule as the task assignor.

- ``share_bounds(total, weights)``: floor and ceiling of each bin's exact share
  ``total * weight / sum(weights)``; an assignment is balanced when every bin lies within them.
- ``apportion(total, weights, priority=None)``: one quota per bin, each the floor or the ceiling
  of its share, summing to ``total``; ``priority`` says which bins get the ceilings.

They run inside every rebalance, usually on small inputs and with cold caches; on CPython 3.11
each comprehension and lambda is a code object of its own, so they are written as plain loops.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

_FLOOR = itemgetter(0)


def share_bounds(total: int, weights: Sequence[int]) -> list[tuple[int, int]]:
    """Floor and ceiling of each bin's exact share ``total * w / sum(weights)``."""
    n = len(weights)
    if n and weights.count(weights[0]) == n:  # equal weights (the common case): one share
        lo, rem = divmod(total, n)
        return [(lo, lo + 1 if rem else lo)] * n
    whole = sum(weights)
    # Bins of equal weight share one pair: computed once per distinct weight (a few thread
    # counts), then looked up for every bin in C.
    by_weight = {}
    for w in set(weights):
        lo, rem = divmod(total * w, whole)
        by_weight[w] = (lo, lo + 1 if rem else lo)
    return list(map(by_weight.__getitem__, weights))


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


__all__ = ["apportion", "share_bounds"]
