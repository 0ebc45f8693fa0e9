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

    ``holders(task)``: the clients holding state of ``task``, best first. ``took[client]``: the
    tasks ``client`` took over warm in this rebalance (the only ones a chain may move).
    ``room[client]``: free slots under ``quotas[client]``, a floor or ceiling of
    ``bounds[client]``. ``movable(task, giver, taker)``: whether ``task`` may go from ``giver``
    to ``taker`` (default: to any holder). Updates ``owner``, ``took``, ``room`` and ``quotas``
    in place. Deterministic: clients and tasks are tried in order.
    """
    donors = _donors(room, quotas, bounds)
    if not took and not donors:
        return list(left)  # no chain to shift, and the holders are full: nothing can change
    # links[giver][taker]: tasks ``giver`` took over that ``taker`` holds too (and may take).
    links: dict[int, dict[int, dict[K, None]]] = {}

    def link(passed: K, giver: int) -> None:
        for taker in holders(passed):
            if taker != giver and (movable is None or movable(passed, giver, taker)):
                links.setdefault(giver, {}).setdefault(taker, {})[passed] = None

    def unlink(passed: K, giver: int) -> None:
        out = links.get(giver, {})
        for taker in holders(passed):
            found = out.get(taker)
            if found is not None and passed in found:
                del found[passed]
                if not found:
                    del out[taker]

    for giver in sorted(took):
        for passed in took[giver]:
            link(passed, giver)
    dead: set[int] = set()
    cold: list[K] = []
    for task in left:
        # Breadth first from the task's holders, best first. parent[taker] = (giver, (passed,)):
        # ``passed`` goes from giver to taker; parent[taker] = (giver, ()): taker, holding a
        # ceiling it fills, hands it to giver and then has to pass one of its own takeovers on.
        parent: dict[int, tuple[int, tuple[K, ...]] | None] = {}
        queue: list[int] = []
        for holder in holders(task):
            if holder not in dead and holder not in parent:
                parent[holder] = None
                queue.append(holder)
        end = -1
        ceilings = False  # whether the full ceiling holders are queued already
        for giver in queue:  # grows while iterated
            below = quotas[giver] < bounds[giver][1]
            if room[giver] > 0 or (below and any(donor != giver for donor in donors)):
                end = giver
                break
            out = links.get(giver)
            if out:
                for taker in sorted(out):
                    if taker not in parent and taker not in dead:
                        parent[taker] = (giver, (min(out[taker]),))
                        queue.append(taker)
            if below and not ceilings:
                ceilings = True
                for taker, (lo, _) in enumerate(bounds):
                    if (
                        quotas[taker] > lo
                        and took.get(taker)
                        and taker not in parent
                        and taker not in dead
                    ):
                        parent[taker] = (giver, ())
                        queue.append(taker)
        if end < 0:
            dead.update(queue)
            cold.append(task)
            continue
        dead.clear()
        if room[end] == 0:
            # The ceiling of the donor with the most room left moves to ``end``.
            donor = min(
                (donor for donor in donors if donor != end), key=lambda donor: (-room[donor], donor)
            )
            quotas[donor] -= 1
            room[donor] -= 1
            quotas[end] += 1
            room[end] += 1
        room[end] -= 1
        taker = end
        step = parent[taker]
        while step is not None:
            giver, moved = step
            if moved:
                (passed,) = moved
                owner[passed] = taker
                took[giver].remove(passed)
                took.setdefault(taker, []).append(passed)
                unlink(passed, giver)
                link(passed, taker)
            else:  # taker's ceiling goes to giver: both stay in bounds
                quotas[taker] -= 1
                quotas[giver] += 1
            taker = giver
            step = parent[taker]
        owner[task] = taker
        took.setdefault(taker, []).append(task)
        link(task, taker)
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
