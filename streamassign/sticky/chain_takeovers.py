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
from typing import Generic, Protocol, TypeVar

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
    if not took and not _donors(room, quotas, bounds):
        return list(left)  # no chain to shift, and the holders are full: nothing can change
    chains = _Chains(holders, owner, took, room, quotas, bounds, movable)
    cold: list[K] = []
    for task in left:
        end, parent = chains.search(task)
        if end < 0:
            cold.append(task)
        else:
            chains.apply(task, end, parent)
    return cold


#: How a client was reached in a chain search: ``(giver, (passed,))``: ``passed`` goes from
#: giver to this client; ``(giver, ())``: this client, holding a ceiling it fills, hands the
#: ceiling to giver and then has to pass one of its own takeovers on; ``None``: a start.
_Parent = tuple[int, tuple[K, ...]] | None


class _Chains(Generic[K]):
    """The state ``augment_takeovers`` keeps across tasks: which takeovers could pass where
    (``links``), clients known not to lead to room (``dead``) and the current donors."""

    def __init__(
        self,
        holders: Callable[[K], Sequence[int]],
        owner: _Owners[K],
        took: dict[int, list[K]],
        room: MutableSequence[int],
        quotas: MutableSequence[int],
        bounds: Sequence[tuple[int, int]],
        movable: Callable[[K, int, int], bool] | None,
    ) -> None:
        self.holders: Callable[[K], Sequence[int]] = holders
        self.owner: _Owners[K] = owner
        self.took: dict[int, list[K]] = took
        self.room = room
        self.quotas = quotas
        self.bounds = bounds
        self.movable: Callable[[K, int, int], bool] | None = movable
        self.donors = _donors(room, quotas, bounds)
        #: links[giver][taker]: tasks ``giver`` took over that ``taker`` holds too (and may take).
        self.links: dict[int, dict[int, dict[K, None]]] = {}
        #: Clients a failed search reached: none leads to room until the next chain is applied.
        self.dead: set[int] = set()
        for giver in sorted(took):
            for passed in took[giver]:
                self.link(passed, giver)

    def link(self, passed: K, giver: int) -> None:
        movable = self.movable
        for taker in self.holders(passed):
            if taker != giver and (movable is None or movable(passed, giver, taker)):
                self.links.setdefault(giver, {}).setdefault(taker, {})[passed] = None

    def unlink(self, passed: K, giver: int) -> None:
        out = self.links.get(giver, {})
        for taker in self.holders(passed):
            found = out.get(taker)
            if found is not None and passed in found:
                del found[passed]
                if not found:
                    del out[taker]

    def search(self, task: K) -> tuple[int, dict[int, _Parent[K]]]:
        """Breadth first from the task's holders, best first: the first client reached with
        room (or a ceiling it can get from a donor), and how each client was reached; -1 when
        none (every client reached is then marked dead)."""
        quotas, bounds, room, dead, took = self.quotas, self.bounds, self.room, self.dead, self.took
        parent: dict[int, _Parent[K]] = {}
        queue: list[int] = []
        for holder in self.holders(task):
            if holder not in dead and holder not in parent:
                parent[holder] = None
                queue.append(holder)
        ceilings = False  # whether the full ceiling holders are queued already
        for giver in queue:  # grows while iterated
            below = quotas[giver] < bounds[giver][1]
            if room[giver] > 0 or (below and any(donor != giver for donor in self.donors)):
                return giver, parent
            out = self.links.get(giver)
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
        dead.update(queue)
        return -1, parent

    def apply(self, task: K, end: int, parent: dict[int, _Parent[K]]) -> None:
        """Shift the chain found for ``task`` ending at ``end`` (which gets a donor's ceiling
        first when it has no room) and give ``task`` to the chain's first client."""
        quotas, room, took = self.quotas, self.room, self.took
        self.dead.clear()
        if room[end] == 0:
            # The ceiling of the donor with the most room left moves to ``end``.
            donor = min(
                (donor for donor in self.donors if donor != end),
                key=lambda donor: (-room[donor], donor),
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
                self.owner[passed] = taker
                took[giver].remove(passed)
                took.setdefault(taker, []).append(passed)
                self.unlink(passed, giver)
                self.link(passed, taker)
            else:  # taker's ceiling goes to giver: both stay in bounds
                quotas[taker] -= 1
                quotas[giver] += 1
            taker = giver
            step = parent[taker]
        self.owner[task] = taker
        took.setdefault(taker, []).append(task)
        self.link(task, taker)
        self.donors = _donors(room, quotas, self.bounds)


def _donors(
    room: Sequence[int], quotas: Sequence[int], bounds: Sequence[tuple[int, int]]
) -> list[int]:
    """Clients holding a ceiling they fill only in part (free to move elsewhere)."""
    out = []
    for c, (lo, _) in enumerate(bounds):
        if quotas[c] > lo and room[c] > 0:
            out.append(c)
    return out
