"""Spreading one client's tasks over its consumer threads.

Three categories are placed in turn — stateful actives, then standbys and warmups, then stateless
actives — each split as evenly as possible, with the load carried across: a category's extra
tasks go to the threads with the fewest tasks so far, so every thread's total and every
category's share differ by at most one between threads. A thread keeps the tasks it had when its
quota allows (state stays where it was opened, no needless revocation); the rest are dealt in
``(subtopology, partition)`` order so a subtopology is spread over threads.

Threads of one client that may not run the same subtopology ids (processes of two topology
versions sharing one process id, seen by the leader as one client) get no task of an id they
may not run where another thread may: each category then keeps every task on the thread that
had it where that one may run it, deals the others to the least loaded thread that may, and
levels the threads with tasks both may hold (:func:`_to_eligible`). The per-category bound
above does not hold there; an unchanged rebalance still moves nothing.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from itertools import groupby, pairwise

import attrs

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
    differ = _refusals_differ(refused, assignment)
    totals = [0] * len(names)
    placed: list[list[TaskId]] = [[] for _ in names]
    for items in categories:
        if differ:
            split = _to_eligible(items, refused, prev, totals)
        else:
            split = _split(items, names, prev, totals)
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


def _refusals_differ(refused: Sequence[frozenset[int]], assignment: ClientAssignment) -> bool:
    """Whether some threads refuse a task's id and others do not: only then is one thread
    better for a task than another (else the plain split)."""
    classes = set(refused)
    ids = {t.subtopology for t in assignment.active | assignment.standby | assignment.warmup}
    return len(classes) > 1 and any(len({s in r for r in classes}) > 1 for s in ids)


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
    items: list[TaskId],
    refused: Sequence[frozenset[int]],
    prev: Mapping[TaskId, int],
    totals: Sequence[int],
) -> list[list[TaskId]]:
    """One category over threads that refuse different ids: each task stays on the thread
    that had it where that one may run it; the others go, in ``(subtopology, partition)``
    order, to the least loaded thread that may (``totals`` carried from the earlier
    categories), then the first; a task every thread refuses goes to the one that had it,
    else the least loaded (the leader's safety net withholds it if its member does not
    subscribe to its topics). Then the threads are levelled (``_Levelling.level``). Fed its
    own output as ``prev``, nothing moves: every task stays, and the levelling found no move
    from there before."""
    loads = list(totals)
    levels = _Levelling.of(refused, prev, loads)
    rest = []
    for task in items:
        owner = prev.get(task)
        able = levels.able(task.subtopology)
        if owner is not None and (not able or levels.klass[owner] in able):
            levels.hold(task, owner)
        else:
            rest.append(task)
    for able, run in groupby(rest, key=lambda t: levels.able(t.subtopology)):
        levels.deal(list(run), able or tuple(range(len(levels.class_refuses))))
    levels.level()
    return levels.held_tasks()


#: A task's place on a thread: (on the thread that had it, the task, its stamp): a thread
#: gives the tasks it did not have first.
_Held = tuple[bool, TaskId, int]


@attrs.define
class _Levelling:
    """One category's tasks on the threads, arranged for levelling moves near-linear in the
    tasks: threads grouped by refusal class (those refusing the same ids are
    interchangeable), each thread's tasks in heaps per set of classes that may run them, the
    least loaded thread of each class in a heap. Entries are dropped lazily: a task's stamp
    changes at each move, a thread's load entry is stale once its load changed."""

    refused: Sequence[frozenset[int]]
    prev: Mapping[TaskId, int]
    #: Per thread, its total so far (earlier categories and this one).
    loads: list[int]
    #: Per thread, its refusal class; per class, the refused ids.
    klass: list[int]
    class_refuses: list[frozenset[int]]
    #: Per class, ``(load, thread)`` entries (lazy) of its threads.
    lightest: list[list[tuple[int, int]]]
    #: Per thread, per set of classes that may run a task: its tasks there, and how many.
    held: list[dict[tuple[int, ...], list[_Held]]]
    counts: list[Counter[tuple[int, ...]]]
    #: Per thread, per thread that had them before: tasks it holds (lazy), to hand back first.
    had: list[dict[int, list[tuple[TaskId, int]]]]
    #: Per task, its thread and stamp.
    where: dict[TaskId, tuple[int, int]] = attrs.field(factory=dict)
    able_classes: dict[int, tuple[int, ...]] = attrs.field(factory=dict)

    @classmethod
    def of(
        cls, refused: Sequence[frozenset[int]], prev: Mapping[TaskId, int], loads: list[int]
    ) -> _Levelling:
        class_refuses = list(dict.fromkeys(refused))
        threads = range(len(refused))
        return cls(
            refused,
            prev,
            loads,
            [class_refuses.index(r) for r in refused],
            class_refuses,
            [[] for _ in class_refuses],
            [{} for _ in threads],
            [Counter() for _ in threads],
            [{} for _ in threads],
        )

    def able(self, subtopology: int) -> tuple[int, ...]:
        """The classes that may run ``subtopology``'s tasks."""
        found = self.able_classes.get(subtopology)
        if found is None:
            refuses = enumerate(self.class_refuses)
            found = tuple(c for c, r in refuses if subtopology not in r)
            self.able_classes[subtopology] = found
        return found

    def least(self, c: int) -> tuple[int, int]:
        """The least loaded thread of class ``c`` (then the first), as ``(load, thread)``."""
        heap = self.lightest[c]
        if not heap:  # first use: every thread of the class
            heap += [(load, th) for th, load in enumerate(self.loads) if self.klass[th] == c]
            heapq.heapify(heap)
        while heap[0][0] != self.loads[heap[0][1]]:
            heapq.heappop(heap)
        return heap[0]

    def deal(self, tasks: list[TaskId], able: tuple[int, ...]) -> None:
        """Each of ``tasks`` in turn on the least loaded thread (then the first) of the
        classes ``able``: a heap of those classes' lightest threads, one entry per class,
        rather than a scan of them per task."""
        heap = [(*self.least(c), c) for c in able]
        heapq.heapify(heap)
        for task in tasks:
            _, th, c = heap[0]
            self.hold(task, th)
            heapq.heapreplace(heap, (*self.least(c), c))

    def touched(self, th: int) -> None:
        """Note ``th``'s load changed (its class heap gets an entry, if it has one yet)."""
        if self.lightest[self.klass[th]]:
            heapq.heappush(self.lightest[self.klass[th]], (self.loads[th], th))

    def hold(self, task: TaskId, th: int) -> None:
        """Put ``task`` on ``th``, counted in its load."""
        self.loads[th] += 1
        self.touched(th)
        stamp = self.where[task][1] + 1 if task in self.where else 0
        self.where[task] = (th, stamp)
        owner = self.prev.get(task)
        able = self.able(task.subtopology)
        heapq.heappush(self.held[th].setdefault(able, []), (owner == th, task, stamp))
        self.counts[th][able] += 1
        if owner is not None and owner != th:
            self.had[th].setdefault(owner, []).append((task, stamp))

    def level(self) -> None:
        """While a thread has two tasks more than another and one of them the other may hold,
        the busiest gives the least busy one such a task: one that thread had before first,
        then one the giver did not have, then the smallest. Each move narrows the spread, so
        this ends; a pass over the threads by load repeats until nothing moves (a thread that
        could give nothing may, once another gave)."""
        moved = True
        while moved:
            moved = False
            busiest = [(-load, th) for th, load in enumerate(self.loads)]
            heapq.heapify(busiest)
            while busiest:
                load, giver = heapq.heappop(busiest)
                if -load != self.loads[giver]:
                    continue  # stale
                taker = self._taker(giver)
                if taker is None:
                    continue  # nothing to give this pass
                self._move(giver, taker)
                moved = True
                heapq.heappush(busiest, (-self.loads[giver], giver))

    def _taker(self, giver: int) -> int | None:
        """The least loaded thread (by two or more) that may hold one of ``giver``'s tasks."""
        best: tuple[int, int] | None = None
        counts = self.counts[giver]
        for c in range(len(self.class_refuses)):
            load, th = self.least(c)
            if self.loads[giver] < load + 2 or (best is not None and (load, th) >= best):
                continue
            if any(n and c in able for able, n in counts.items()):
                best = (load, th)
        return None if best is None else best[1]

    def _move(self, giver: int, taker: int) -> None:
        """Move ``giver``'s best task for ``taker`` (see :meth:`level`) there."""
        task = self._returning(giver, taker)
        if task is None:
            c = self.klass[taker]
            heads = []
            for able, heap in self.held[giver].items():
                if self.counts[giver][able] and c in able:
                    while self.where[heap[0][1]] != (giver, heap[0][2]):
                        heapq.heappop(heap)
                    heads.append((heap[0], able))
            head, able = min(heads)
            heapq.heappop(self.held[giver][able])
            task = head[1]
        self.counts[giver][self.able(task.subtopology)] -= 1
        self.loads[giver] -= 1
        self.touched(giver)
        self.hold(task, taker)

    def _returning(self, giver: int, taker: int) -> TaskId | None:
        """A task ``giver`` holds that ``taker`` had before and may run, if any (its heap
        entry goes stale with the move)."""
        back = self.had[giver].get(taker, [])
        while back:
            task, stamp = back.pop()
            if self.where[task] == (giver, stamp) and task.subtopology not in self.refused[taker]:
                return task
        return None

    def held_tasks(self) -> list[list[TaskId]]:
        """Per thread, the tasks it holds."""
        out: list[list[TaskId]] = [[] for _ in self.held]
        for task, (th, _) in self.where.items():
            out[th].append(task)
        return out
