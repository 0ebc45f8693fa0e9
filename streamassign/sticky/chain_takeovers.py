"""Augmenting paths for warm takeovers: the step every path of the task assignor shares.

After the greedy warm pass some tasks nobody keeps are still unplaced although a client holding
their state could take them: each holder is full, but a chain of takeovers can shift by one
(holder ``a0`` hands a task it took over to another holder ``a1`` of that task, ``a1`` hands one
on to ``a2``, ...) to a client with room; or the chain ends at a holder whose share is
fractional but got no ceiling while another client holds a ceiling it only fills cold. Moving
that ceiling is free: both stay within floor and ceiling, and the donor kept everything it ran.
A ceiling its holder fills with takeovers can move too: the chain then goes on from that holder,
which passes one of its takeovers on as above.

Only takeovers made in this rebalance move along a chain, never a task a client ran before, so
the move count does not change. A breadth-first search over clients finds the shortest chain;
a failed search marks every client it reached as unable to lead to room until the next chain
is applied, so a pass costs about one search per applied chain plus one per dead end.
"""

from __future__ import annotations

from collections.abc import Callable, MutableSequence, Sequence
from typing import Protocol, TypeVar

from .._ids import TaskId

#: Tasks as the paths key them: indices in task order, or the task ids themselves.
K = TypeVar("K", int, TaskId)
K_contra = TypeVar("K_contra", int, TaskId, contravariant=True)


class _Owners(Protocol[K_contra]):
    """Where each task's owner is written: a list by task index, or a dict by task id."""

    def __setitem__(self, key: K_contra, value: int, /) -> None: ...


def augment_takeovers(
    left: Sequence[K],
    holders: Callable[[K], Sequence[int]],
    owner: _Owners[K],
    took: dict[int, list[K]],
    room: MutableSequence[int],
    quotas: MutableSequence[int],
    bounds: Sequence[tuple[int, int]],
    movable: Callable[[K, int, int], bool] | None = None,
) -> list[K]:
    """Place what chains of takeovers can of the tasks ``left`` (in order), which the greedy
    pass could not give to a holder (all full); return the rest, in order, to be dealt cold.

    ``holders(t)``: the clients holding state of ``t``, best first. ``took[c]``: the tasks client
    ``c`` took over warm in this rebalance (the only ones a chain may move). ``room[c]``: free
    slots under ``quotas[c]``, a floor or ceiling of ``bounds[c]``. ``movable(u, a, x)``: whether
    ``u`` may go from ``a`` to ``x`` (default: to any holder). Updates ``owner``, ``took``,
    ``room`` and ``quotas`` in place. Deterministic: clients and tasks are tried in order.
    """
    donors = _donors(room, quotas, bounds)
    if not took and not donors:
        return list(left)  # no chain to shift, and the holders are full: nothing can change
    # links[a][x]: tasks ``a`` took over that ``x`` holds too (and may take from ``a``).
    links: dict[int, dict[int, dict[K, None]]] = {}

    def link(u: K, a: int) -> None:
        for x in holders(u):
            if x != a and (movable is None or movable(u, a, x)):
                links.setdefault(a, {}).setdefault(x, {})[u] = None

    def unlink(u: K, a: int) -> None:
        out = links.get(a, {})
        for x in holders(u):
            found = out.get(x)
            if found is not None and u in found:
                del found[u]
                if not found:
                    del out[x]

    for a in sorted(took):
        for u in took[a]:
            link(u, a)
    dead: set[int] = set()
    cold: list[K] = []
    for t in left:
        # Breadth first from t's holders, best first. parent[x] = (a, (u,)): u goes from a to
        # x; parent[x] = (a, ()): x, holding a ceiling it fills, hands it to a and then has to
        # pass one of its own takeovers on.
        parent: dict[int, tuple[int, tuple[K, ...]] | None] = {}
        queue: list[int] = []
        for h in holders(t):
            if h not in dead and h not in parent:
                parent[h] = None
                queue.append(h)
        end = -1
        ceilings = False  # whether the full ceiling holders are queued already
        for a in queue:  # grows while iterated
            below = quotas[a] < bounds[a][1]
            if room[a] > 0 or (below and any(d != a for d in donors)):
                end = a
                break
            out = links.get(a)
            if out:
                for x in sorted(out):
                    if x not in parent and x not in dead:
                        parent[x] = (a, (min(out[x]),))
                        queue.append(x)
            if below and not ceilings:
                ceilings = True
                for x, (lo, _) in enumerate(bounds):
                    if quotas[x] > lo and took.get(x) and x not in parent and x not in dead:
                        parent[x] = (a, ())
                        queue.append(x)
        if end < 0:
            dead.update(queue)
            cold.append(t)
            continue
        dead.clear()
        if room[end] == 0:
            # The ceiling of the donor with the most room left moves to ``end``.
            d = min((d for d in donors if d != end), key=lambda d: (-room[d], d))
            quotas[d] -= 1
            room[d] -= 1
            quotas[end] += 1
            room[end] += 1
        room[end] -= 1
        x = end
        step = parent[x]
        while step is not None:
            a, moved = step
            if moved:
                (u,) = moved
                owner[u] = x
                took[a].remove(u)
                took.setdefault(x, []).append(u)
                unlink(u, a)
                link(u, x)
            else:  # x's ceiling goes to a: both stay within floor and ceiling
                quotas[x] -= 1
                quotas[a] += 1
            x = a
            step = parent[x]
        owner[t] = x
        took.setdefault(x, []).append(t)
        link(t, x)
        donors = _donors(room, quotas, bounds)
    return cold


def _donors(
    room: Sequence[int], quotas: Sequence[int], bounds: Sequence[tuple[int, int]]
) -> list[int]:
    """Clients holding a ceiling they fill only in part (free to move elsewhere)."""
    out = []
    for c, (lo, _) in enumerate(bounds):
        if quotas[c] > lo and room[c] > 0:
            out.append(c)
    return out
