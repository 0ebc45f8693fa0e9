"""Spreading one client's tasks over its consumer threads.

Three categories are placed in turn — stateful actives, then standbys and warmups, then stateless
actives — each split as evenly as possible, with the load carried across: a category's extra
tasks go to the threads with the fewest tasks so far, so every thread's total and every
category's share differ by at most one between threads. A thread keeps the tasks it had when its
quota allows (state stays where it was opened, no needless revocation); the rest are dealt in
``(subtopology, partition)`` order so a subtopology is spread over threads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise

from ._ids import TaskId, as_task
from .assignment import ClientAssignment
from .errors import ThreadListError
from .sticky.deal_tasks import deal, level_order


def distribute_to_threads(
    assignment: ClientAssignment,
    threads: Sequence[str],
    previous: Mapping[str, Iterable[TaskId]] | None = None,
    stateful: Iterable[TaskId] | None = None,
) -> dict[str, ClientAssignment]:
    """Split ``assignment`` over ``threads`` (consumer member ids of one client).

    ``previous`` maps a thread to the tasks (of any kind) it had; ``stateful=None`` treats every
    active as stateful. Returns an assignment for every thread, in sorted thread order. Raises
    ``ThreadListError`` (a ``ValueError``) for an empty or duplicated thread list.
    """
    names = sorted(threads)
    if not names:
        raise ThreadListError("a client needs at least one thread to run its tasks")
    if len(set(names)) != len(names):
        dup = next(a for a, b in pairwise(names) if a == b)
        raise ThreadListError(f"duplicate thread id: {dup!r}")
    stateful_set = None if stateful is None else set(stateful)
    # Where each task was before; a task claimed by two threads stays with the first in order.
    prev: dict[TaskId, int] = {}
    for th, name in reversed(list(enumerate(names))):
        for t in (previous or {}).get(name, ()):
            prev[as_task(t)] = th

    def is_stateful(t: TaskId) -> bool:
        return stateful_set is None or t in stateful_set

    categories = [
        sorted(t for t in assignment.active if is_stateful(t)),
        sorted(assignment.standby | assignment.warmup),
        sorted(t for t in assignment.active if not is_stateful(t)),
    ]
    totals = [0] * len(names)
    placed: list[list[TaskId]] = [[] for _ in names]
    for items in categories:
        for th, got in enumerate(_split(items, names, prev, totals)):
            placed[th].extend(got)
            totals[th] += len(got)
    return {
        name: ClientAssignment(
            active=frozenset(t for t in got if t in assignment.active),
            standby=frozenset(t for t in got if t in assignment.standby),
            warmup=frozenset(t for t in got if t in assignment.warmup),
        )
        for name, got in zip(names, placed, strict=True)
    }


def _split(
    items: list[TaskId], names: list[str], prev: Mapping[TaskId, int], totals: list[int]
) -> list[list[TaskId]]:
    """One category over the threads: quotas carried across categories, sticky, then dealt."""
    k = len(names)
    base, extra = divmod(len(items), k)
    mine: list[list[TaskId]] = [[] for _ in names]
    for t in items:
        if t in prev:
            mine[prev[t]].append(t)
    order = sorted(range(k), key=lambda th: (totals[th], -len(mine[th]), th))
    quota = [base] * k
    for th in order[:extra]:
        quota[th] += 1
    out = [level_order(mine[th], group=lambda t: t.subtopology)[: quota[th]] for th in range(k)]
    taken = {t for got in out for t in got}
    rest = [t for t in items if t not in taken]
    for t, th in zip(
        rest, deal([q - len(o) for q, o in zip(quota, out, strict=True)]), strict=True
    ):
        out[th].append(t)
    return out
