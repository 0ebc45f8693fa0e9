"""Time and memory of one call, for tests that guard against a blow-up coming back (the ratios
themselves are the benchmarks' job, in benchmarks/)."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable


def best_of(runs: int, *rounds: Callable[[], object]) -> list[float]:
    """Each round's best time over ``runs``, the rounds interleaved (a change in the machine's
    load hits them alike)."""
    best = [float("inf")] * len(rounds)
    for _ in range(runs):
        for i, round_ in enumerate(rounds):
            start = time.perf_counter()
            round_()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def peak_of(round_: Callable[[], object]) -> int:
    """tracemalloc's peak, in bytes, while ``round_`` runs."""
    tracemalloc.start()
    try:
        round_()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
