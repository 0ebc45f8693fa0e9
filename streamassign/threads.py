"""Spreading one client's tasks over its consumer threads.

Three categories are placed in turn — stateful actives, then standbys and warmups, then stateless
actives — each split as evenly as possible, with the load carried across: a category's extra
tasks go to the threads with the fewest tasks so far, so every thread's total and every
category's share differ by at most one between threads. A thread keeps the tasks it had when its
quota allows (state stays where it was opened, no needless revocation); the rest are dealt in
``(subtopology, partition)`` order so a subtopology is spread over threads.

Threads of one client that may not run the same subtopology ids (processes of two topology
versions sharing one process id, seen by the leader as one client) get no task of an id they
may not run where another thread may: such tasks move to a thread that may, and the threads
are then levelled again with tasks both may hold (:func:`_to_eligible`).
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Mapping, Sequence
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
    ineligible: Mapping[str, Collection[int]] | None = None,
) -> dict[str, ClientAssignment]:
    """Split ``assignment`` over ``threads`` (consumer member ids of one client).

    ``previous`` maps a thread to the tasks (of any kind) it had; ``stateful=None`` treats every
    active as stateful. ``ineligible`` maps a thread to the subtopology ids it may not run
    (its member guard would refuse their tasks): when threads differ there, no task goes to a
    thread ineligible for it while another thread may run it. Returns an assignment for every
    thread, in sorted thread order. Raises ``ThreadListError`` (a ``ValueError``) for an empty
    or duplicated thread list.
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
    refused = [frozenset((ineligible or {}).get(name, ())) for name in names]
    differ = len(set(refused)) > 1  # else no thread is better for any task: the plain split
    totals = [0] * len(names)
    placed: list[list[TaskId]] = [[] for _ in names]
    for items in categories:
        split = _split(items, names, prev, totals)
        if differ:
            _to_eligible(split, refused, prev, totals)
        for th, got in enumerate(split):
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


def _to_eligible(
    split: list[list[TaskId]],
    refused: Sequence[frozenset[int]],
    prev: Mapping[TaskId, int],
    totals: Sequence[int],
) -> None:
    """One category's ``split`` (in place) with every task on a thread that refuses its id
    moved to one that does not (the one that had it, else the least loaded, then the first);
    a task every thread refuses stays (the leader's safety net withholds it if its member
    does not subscribe to its topics). Then, while a thread has two tasks more than another
    (``totals`` carried from the earlier categories) and one of them the other may hold, the
    busiest gives the least busy one such a task, one it did not have before first, then the
    smallest: each move narrows the spread, so this ends. Heaps per thread and id keep each
    move at O(ids) rather than a scan of the thread's tasks."""
    threads = range(len(split))
    loads = [total + len(got) for total, got in zip(totals, split, strict=True)]
    heaps: list[dict[int, list[tuple[bool, TaskId]]]] = [{} for _ in threads]
    for th in threads:
        for task in split[th]:
            target = th
            if task.subtopology in refused[th]:
                able = [o for o in threads if task.subtopology not in refused[o]]
                if prev.get(task) in able:
                    target = prev[task]
                elif able:
                    target = min(able, key=lambda o: (loads[o], o))
            loads[th] -= 1
            loads[target] += 1
            heaps[target].setdefault(task.subtopology, []).append((prev.get(task) == target, task))
    for by_id in heaps:
        for heap in by_id.values():
            heapq.heapify(heap)
    while (found := _levelling_move(heaps, refused, loads)) is not None:
        task, giver, taker = found
        heapq.heappop(heaps[giver][task.subtopology])
        heapq.heappush(
            heaps[taker].setdefault(task.subtopology, []), (prev.get(task) == taker, task)
        )
        loads[giver] -= 1
        loads[taker] += 1
    split[:] = [[t for heap in by_id.values() for _, t in heap] for by_id in heaps]


def _levelling_move(
    heaps: Sequence[Mapping[int, list[tuple[bool, TaskId]]]],
    refused: Sequence[frozenset[int]],
    loads: Sequence[int],
) -> tuple[TaskId, int, int] | None:
    """The next (task, giver, taker) that narrows the spread of ``loads``, or None: the
    busiest giver with a task a less busy taker (by two or more) may hold, to the least
    busy such taker."""
    by_load = sorted(range(len(heaps)), key=lambda th: (loads[th], th))
    for giver in reversed(by_load):
        for taker in by_load:
            if loads[giver] <= loads[taker] + 1:
                break
            heads = [h[0] for s, h in heaps[giver].items() if h and s not in refused[taker]]
            if heads:
                return min(heads)[1], giver, taker
    return None
