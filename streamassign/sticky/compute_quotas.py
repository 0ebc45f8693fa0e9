"""Per-subtopology quotas: how many tasks of each subtopology each client runs.

A *quota matrix* ``q[c][s]`` is admissible when every entry is the floor or ceiling of
``tasks(s) * capacity(c) / total_capacity``, every column sums to ``tasks(s)`` and every row to
the floor or ceiling of the client's share of all tasks. One always exists (rounding a
two-dimensional table so that its entries, row sums and column sums stay within floor and
ceiling of the exact ones is always possible).

With ``kept[c][s]`` the tasks of ``s`` client ``c`` ran before, a client keeps ``min(kept, q)``
of them, so the fewest moves are ``sum kept - max over admissible q of sum min(kept, q)``.
Writing ``q = floor + extra`` with ``extra`` 0 or 1, ``min(kept, q) = min(kept, floor) + extra``
exactly when ``kept > floor``: choosing the extras is a transportation problem (each
subtopology hands out its ``tasks(s) - sum floors`` ceilings to clients, one per cell, each
client takes between its row's lower and upper count), solved here exactly as a min-cost flow.
Clients the flow cannot tell apart (same fractional cells, gains and row counts) share one node,
so a fleet of equal workers costs a network of a few nodes, not one per worker.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from operator import itemgetter

from attrs import frozen

from ..shares import share_bounds

#: The floor of a ``(floor, ceiling)`` pair.
_FLOOR = itemgetter(0)


def quota_bounds(
    counts: Sequence[int], caps: Sequence[int]
) -> tuple[list[list[tuple[int, int]]], list[tuple[int, int]]]:
    """Floor and ceiling of every cell ``[client][subtopology]`` and of every row total."""
    columns = [share_bounds(count, caps) for count in counts]
    # Transposed in C: a nested comprehension calls a function per client, which adds up
    # with many small clients.
    cells = list(map(list, zip(*columns, strict=True))) if counts else [[] for _ in caps]
    return cells, share_bounds(sum(counts), caps)


def best_quotas(
    counts: Sequence[int],
    caps: Sequence[int],
    gains: Sequence[Sequence[int]],
    bounds: tuple[list[list[tuple[int, int]]], list[tuple[int, int]]] | None = None,
) -> list[list[int]]:
    """The admissible quota matrix maximising the total gain of the ceilings it hands out.

    ``counts[s]``: tasks of subtopology ``s``; ``caps[c]``: capacity of client ``c``;
    ``gains[c][s] >= 0``: what giving cell ``(c, s)`` its ceiling (when that differs from its
    floor) is worth; ``bounds``: ``quota_bounds(counts, caps)`` when the caller has it already.
    Exact (a min-cost flow); ties go the same way for the same input.
    """
    cells, rows = quota_bounds(counts, caps) if bounds is None else bounds
    quotas = [list(map(_FLOOR, row)) for row in cells]
    if not caps or not counts:
        return quotas
    groups = _alike_clients(cells, rows, quotas, gains)
    extras = [count - sum(row[s] for row in quotas) for s, count in enumerate(counts)]
    flow, group_arcs = _ceiling_network(extras, groups)
    if flow.run(_SOURCE, len(flow.out) - 1) != sum(extras):
        raise AssertionError("no admissible quota matrix: matrix rounding guarantees one")
    for group, arcs in zip(groups, group_arcs, strict=True):
        handed = [(s, len(group.members) - flow.capacity[arc]) for s, arc in arcs]
        _deal_ceilings(quotas, group.members, handed)
    return quotas


@frozen
class _ClientGroup:
    """Clients the flow cannot tell apart: the same fractional cells with the same gains
    (``gain_cells``: subtopology, gain), and the same ``need`` and ``optional`` ceilings."""

    gain_cells: tuple[tuple[int, int], ...]
    need: int
    optional: int
    members: tuple[int, ...]


def _alike_clients(
    cells: list[list[tuple[int, int]]],
    rows: list[tuple[int, int]],
    floors: list[list[int]],
    gains: Sequence[Sequence[int]],
) -> list[_ClientGroup]:
    """Clients grouped by what the flow sees of them, in order of their first member.

    Equal clients are the common case (a fleet of equal workers, most of them with nothing
    to keep): the network gets a node per group, not per client, and one arc per group and
    subtopology. That loses nothing: however many ceilings of each subtopology a group takes
    (at most one per member each), ``_deal_ceilings`` splits them so that each member takes
    at most one per cell and the group's average rounded down or up in all, within the row
    bounds the members share, and every member's ceiling is worth the same.
    """
    grouped: dict[tuple[tuple[tuple[int, int], ...], int, int], list[int]] = {}
    for client, row in enumerate(cells):
        gain_row = gains[client]
        key = tuple((s, gain_row[s]) for s, (lo, hi) in enumerate(row) if hi > lo)
        need = rows[client][0] - sum(floors[client])
        grouped.setdefault((key, need, rows[client][1] - rows[client][0]), []).append(client)
    return [_ClientGroup(*key, tuple(members)) for key, members in grouped.items()]


def _deal_ceilings(
    quotas: list[list[int]], members: tuple[int, ...], handed: list[tuple[int, int]]
) -> None:
    """A group's ceilings (``handed``: subtopology, how many) dealt to its members in turn,
    continuing where the last subtopology stopped: no member takes two of one subtopology
    (none hands a group more than it has members), and counts differ by one at most."""
    turn = 0
    for s, how_many in handed:
        for _ in range(how_many):
            quotas[members[turn % len(members)]][s] += 1
            turn += 1


#: Node of the flow network the ceilings start from (the sink is its last node).
_SOURCE = 0


def _ceiling_network(
    extras: list[int], groups: list[_ClientGroup]
) -> tuple[_MinCostFlow, list[list[tuple[int, int]]]]:
    """The flow network handing out the ceilings (``extras[s]``: how many subtopology ``s``
    hands out), and each group's cell arcs ``(subtopology, arc)``.

    Source -> subtopology -> group (one ceiling per member and fractional cell) -> sink. Each
    member must take at least ``need`` ceilings (its row floor minus its cell floors): those
    run straight to the sink; up to ``optional`` more go through a shared node whose capacity
    is what is left. Every unit crosses exactly one cell arc, so cell cost ``top - gain``
    makes the cheapest full flow the most gainful (``top``: the largest gain of a fractional
    cell; only fractional cells have arcs, and a shift common to all of them changes nothing).
    """
    n_sub = len(extras)
    optional_node, sink = 1 + n_sub + len(groups), 2 + n_sub + len(groups)
    flow = _MinCostFlow(3 + n_sub + len(groups))
    top = max((gain for group in groups for _, gain in group.gain_cells), default=0)
    for s, handed_out in enumerate(extras):
        if handed_out:
            flow.add(_SOURCE, 1 + s, handed_out, 0)
    group_arcs: list[list[tuple[int, int]]] = []
    need_total = 0
    for index, group in enumerate(groups):
        node, size = 1 + n_sub + index, len(group.members)
        group_arcs.append(
            [(s, flow.add(1 + s, node, size, top - gain)) for s, gain in group.gain_cells]
        )
        need_total += group.need * size
        if group.need:
            flow.add(node, sink, group.need * size, 0)
        if group.optional:
            flow.add(node, optional_node, group.optional * size, 0)
    if (beyond_need := sum(extras) - need_total) > 0:
        flow.add(optional_node, sink, beyond_need, 0)
    return flow, group_arcs


def keep_gains(
    counts: Sequence[int], caps: Sequence[int], kept: Sequence[Sequence[int]]
) -> list[list[int]]:
    """1 for the cells whose ceiling lets the client keep one more of its previous tasks."""
    cells, _ = quota_bounds(counts, caps)
    return [
        [1 if k > lo else 0 for k, (lo, _) in zip(row, cell_row, strict=True)]
        for row, cell_row in zip(kept, cells, strict=True)
    ]


def fewest_moves(counts: Sequence[int], caps: Sequence[int], kept: Sequence[Sequence[int]]) -> int:
    """``sum kept - max over admissible q of sum min(kept, q)``: the moves any assignment
    balanced per subtopology and in total needs (``kept[c][s] <= counts[s]`` summed over c)."""
    gains = keep_gains(counts, caps, kept)
    if not any(map(any, gains)):
        # Every client kept at most its floor of every subtopology (a crash, a scale-in): any
        # admissible matrix lets all of them stay, no flow needed.
        return 0
    quotas = best_quotas(counts, caps, gains)
    return sum(
        max(0, k - q)
        for row, quota_row in zip(kept, quotas, strict=True)
        for k, q in zip(row, quota_row, strict=True)
    )


class _MinCostFlow:
    """Min-cost max-flow with non-negative arc costs (primal-dual: Dijkstra for potentials,
    then blocking flows over the arcs of reduced cost 0). Arcs are stored in pairs: arc ``a``
    and its residual ``a ^ 1``."""

    def __init__(self, nodes: int) -> None:
        self.out: list[list[int]] = [[] for _ in range(nodes)]
        self.head: list[int] = []
        self.capacity: list[int] = []
        self.cost: list[int] = []

    def add(self, tail: int, head: int, capacity: int, cost: int) -> int:
        arc = len(self.head)
        self.out[tail].append(arc)
        self.out[head].append(arc + 1)
        self.head += [head, tail]
        self.capacity += [capacity, 0]
        self.cost += [cost, -cost]
        return arc

    def run(self, source: int, sink: int) -> int:
        """Push as much flow as possible from ``source`` to ``sink`` at least cost; the flow."""
        potential = [0] * len(self.out)
        pushed = 0
        while True:
            dist = self._distances(source, potential)
            reach = dist[sink]
            if reach is None:
                return pushed
            # Nodes beyond the sink's distance (or unreached) move by that distance: reduced
            # costs stay non-negative and those on shortest paths become 0.
            for node, d in enumerate(dist):
                potential[node] += reach if d is None or d > reach else d
            pushed += self._blocking_flows(source, sink, potential)

    def _distances(self, source: int, potential: list[int]) -> list[int | None]:
        # Reduced cost of an arc: cost + potential[tail] - potential[head] (written out in
        # the loops of this class with the lists held locally: they run every rebalance).
        out, capacity, heads, cost = self.out, self.capacity, self.head, self.cost
        dist: list[int | None] = [None] * len(out)
        dist[source] = 0
        heap = [(0, source)]
        while heap:
            d, node = heapq.heappop(heap)
            if d != dist[node]:
                continue
            base = d + potential[node]
            for arc in out[node]:
                if capacity[arc] > 0:
                    head = heads[arc]
                    nd = base + cost[arc] - potential[head]
                    known = dist[head]
                    if known is None or nd < known:
                        dist[head] = nd
                        heapq.heappush(heap, (nd, head))
        return dist

    def _blocking_flows(self, source: int, sink: int, potential: list[int]) -> int:
        """Max flow over the residual arcs of reduced cost 0 (Dinic's levels and pointers)."""
        pushed = 0
        while True:
            level = self._levels(source, potential)
            if level[sink] < 0:
                return pushed
            pushed += self._augment(source, sink, level, potential)

    def _levels(self, source: int, potential: list[int]) -> list[int]:
        out, capacity, heads, cost = self.out, self.capacity, self.head, self.cost
        level = [-1] * len(out)
        level[source] = 0
        frontier = [source]
        while frontier:
            following = []
            for node in frontier:
                next_level, base = level[node] + 1, potential[node]
                for arc in out[node]:
                    if capacity[arc] > 0:
                        head = heads[arc]
                        if level[head] < 0 and cost[arc] + base == potential[head]:
                            level[head] = next_level
                            following.append(head)
            frontier = following
        return level

    def _augment(self, source: int, sink: int, level: list[int], potential: list[int]) -> int:
        """Augmenting paths along increasing levels (iterative DFS with Dinic's pointers) until
        none is left; the flow pushed. After a path, the search resumes at the tail of its
        first saturated arc: the arcs before it still have room and their nodes their levels,
        so a search from the source would walk the same arcs back there (one loop, no call
        and no re-walk per path: a rebalance of 1,000 one-task clients pushes 1,000 paths)."""
        out, capacity, heads, cost = self.out, self.capacity, self.head, self.cost
        pointer = [0] * len(out)
        pushed = 0
        path: list[int] = []  # arcs from the source
        node = source
        while True:
            if node == sink:
                bottleneck = min(map(capacity.__getitem__, path))
                for arc in path:
                    capacity[arc] -= bottleneck
                    capacity[arc ^ 1] += bottleneck
                pushed += bottleneck
                del path[_first_empty(capacity, path) :]
                node = heads[path[-1]] if path else source
                continue
            arcs = out[node]
            next_level, base = level[node] + 1, potential[node]
            at = pointer[node]
            while at < len(arcs):
                arc = arcs[at]
                if capacity[arc] > 0:
                    head = heads[arc]
                    if level[head] == next_level and cost[arc] + base == potential[head]:
                        break
                at += 1
            pointer[node] = at
            if at == len(arcs):
                if node == source:
                    return pushed
                level[node] = -1  # dead end: never entered again in this phase
                arc = path.pop()
                node = heads[arc ^ 1]
                pointer[node] += 1
                continue
            path.append(arc)
            node = head


def _first_empty(capacity: list[int], path: list[int]) -> int:
    """Position in ``path`` of its first arc without capacity left."""
    for position, arc in enumerate(path):
        if capacity[arc] == 0:
            return position
    return len(path)
