"""Step 8 (placement): previous standbys and other local state kept first (chains of kept copies
make room for a task whose holders are full), the rest through the standby queue (rack/tag
spread, most room), with a one-step swap when only holders have room; then steps 9-11."""

from __future__ import annotations

import heapq
from bisect import insort
from collections.abc import Iterable
from operator import itemgetter
from typing import Final

from ..shares import share_bounds
from .even_standbys import _StandbyEvener
from .exchange_for_racks import ExchangeForRacks
from .pick_standby_clients import StandbyQueue


class PlaceStandbys(ExchangeForRacks):
    """Every stateful task's standbys."""

    def assign_standbys(self) -> None:
        """Standbys of every stateful task: local state kept, the rest placed, then repaired
        (racks, dropped previous standbys, per-subtopology evening)."""
        if not self.replicas:
            return
        r = self.replicas
        room, valid = self._standby_targets()
        # copies[i * r : (i + 1) * r] are the clients holding a standby of task i (-1: none yet).
        # One flat list: a set per task cost a third of the run in allocation and GC at 100k.
        copies = [-1] * (len(self.tasks) * r)
        need = self._keep_local_state(copies, room, valid)
        queue, placed = self._place_through_queue(need, copies, room)
        if queue.aware:
            self._exchange_for_racks(need, copies, queue)
        self._return_dropped_standbys(copies, placed)
        if self.by_subtopology:
            _StandbyEvener(self, copies, placed, queue).run()
        for slot, client in enumerate(copies):
            if client >= 0:
                self.standby[client].append(slot // r)

    def _keep_local_state(self, copies: list[int], room: list[int], valid: list[int]) -> list[int]:
        """Standby slots filled with clients that hold local state of the task, best holder
        first, within each client's ``room``; returns the slots still empty."""
        r, owner = self.replicas, self.owner
        need: list[int] = []
        # Local state is kept first for the tasks active on clients that will take new
        # standbys (those cannot go to their own active client), then in task order: a client
        # over its target then drops copies that can go where the room is.
        receiver = [target > keepable for target, keepable in zip(room, valid, strict=True)]
        first = [task for task, client in enumerate(owner) if receiver[client]]
        if first and len(first) < len(owner):
            rest = [task for task, client in enumerate(owner) if not receiver[client]]
            order: Iterable[int] = first + rest
        else:
            order = range(len(owner))
        if self.by_subtopology and any(map(int.__lt__, room, valid)):
            # A client keeps what its room allows in this order: interleaved over the
            # subtopologies, what it drops (and others take) is spread over them too.
            order = self._interleaved(receiver)
        warm, stateful = self.warm, self.stateful
        for task in order:
            if not stateful[task]:
                continue
            first_slot = k = task * r
            end = first_slot + r
            for client in warm.get(task, ()):
                if k == end:
                    break
                if (
                    room[client] > 0
                    and client != owner[task]
                    and client not in copies[first_slot:k]
                ):
                    copies[k] = client
                    k += 1
                    room[client] -= 1
            if k < end:
                need.extend(range(k, end))
        if need and self.warm:
            need = _KeptChains(self, copies, room).fill(need)
        return need

    def _interleaved(self, receiver: list[bool]) -> list[int]:
        """Every task, those active on a ``receiver`` first, each subtopology's tasks spread
        evenly through each part (by position in the subtopology relative to its size; ties
        in subtopology order, as the sort is stable)."""
        position: list[float] = []
        for size in self.column_sizes:
            position.extend((2 * index + 1) / (2 * size) for index in range(size))
        owner = self.owner
        first = [task for task in range(len(owner)) if receiver[owner[task]]]
        rest = [task for task in range(len(owner)) if not receiver[owner[task]]]
        first.sort(key=position.__getitem__)
        rest.sort(key=position.__getitem__)
        return first + rest

    def _place_through_queue(
        self, need: list[int], copies: list[int], room: list[int]
    ) -> tuple[StandbyQueue, set[int]]:
        """Fill the ``need`` slots (sorted in place) through the standby queue, by swap when
        only holders of the task have room; returns the queue and the slots filled."""
        r, owner = self.replicas, self.owner
        # The rest through the queue: rack and tag conflicts, spread, most room left.
        queue = self._queue(room)
        # Grouped by active client (spread), those of clients with standby room first: they
        # cannot use that room, so they go while other clients still have theirs.
        if self.by_subtopology:
            # One subtopology after another, so clients taken in turn by room get an even
            # share of each (grouped by active client only, every active client's copies come
            # in task order, and a client could get all its copies of one subtopology).
            # Each subtopology starts at another active client (a quarter of the way round
            # with four): taken in turn, clients would otherwise meet each active client's
            # copies of every subtopology at the same point of the round and hold its fair
            # share of them after the first (crowded, a longer search).
            queue.balance_columns(*self._standbys_per_column(copies))
            column, n_clients = self.column, len(self.clients)
            step = -(-n_clients // len(self.column_sizes))
            need.sort(
                key=lambda slot: (
                    room[owner[slot // r]] == 0,
                    column[slot // r],
                    (owner[slot // r] - step * column[slot // r]) % n_clients,
                )
            )
        else:
            need.sort(key=lambda slot: (room[owner[slot // r]] == 0, owner[slot // r]))
        placed: set[int] = set()  # slots filled in this run (no warm state behind them)
        swaps: _SwapIndex | None = None  # built at the first swap
        for slot in need:
            task = slot // r
            client = queue.pick(owner[task], copies[task * r : slot], self.column[task])
            if client >= 0:
                copies[slot] = client
                if swaps is not None:
                    swaps.add(slot, client)
            else:
                if swaps is None:
                    swaps = _SwapIndex(copies, placed, len(self.clients))
                self._place_by_swap(slot, copies, room, placed, swaps)
            placed.add(slot)
        return queue, placed

    def _place_by_swap(
        self, slot: int, copies: list[int], room: list[int], placed: set[int], swaps: _SwapIndex
    ) -> None:
        """Fill ``slot`` (a standby of ``needed``) when every client with room holds ``needed``.

        Finds a ``donor`` without a copy of ``needed`` and a standby ``moved_task`` on it that
        a ``receiver`` with room can take: ``moved_task`` moves donor -> receiver and
        ``needed`` goes to the donor, keeping every load on target. A copy placed in this run
        (in ``placed``) moves before one kept from before: moving that throws its warm state
        away. Without such a pair (forced by one copy per client), ``needed`` goes to the
        client without a copy that is least loaded per thread. The first such donor, then
        ``moved_task``, then receiver, in order; ``swaps`` finds them without rescanning what
        failed before.
        """
        if not self._swap_into_slot(slot, copies, room, placed, swaps):
            self._place_on_least_loaded(slot, copies, swaps)

    def _runs_or_holds(self, copies: list[int], task: int, client: int) -> bool:
        """Whether ``client`` runs ``task`` or holds a standby of it."""
        r = self.replicas
        return self.owner[task] == client or client in copies[task * r : (task + 1) * r]

    def _swap_into_slot(
        self, slot: int, copies: list[int], room: list[int], placed: set[int], swaps: _SwapIndex
    ) -> bool:
        """The swap of ``_place_by_swap``, fresh copies first; whether one was found."""
        needed, holds = slot // self.replicas, self._runs_or_holds
        rooms = [receiver for receiver in range(len(room)) if room[receiver] > 0]
        for fresh in (True, False):
            for donor in range(len(self.clients)):
                if holds(copies, needed, donor):
                    continue
                heap = swaps.heaps[donor][fresh]
                while heap:
                    # Taken off for good whatever happens: moved away (or placed again: then
                    # on the other heap), handed over now, or held by every client with room
                    # (rooms only fill and copies only arrive there, ``donor`` has none: that
                    # stays true).
                    moved_slot = heapq.heappop(heap)
                    if copies[moved_slot] != donor or (moved_slot in placed) != fresh:
                        continue
                    moved_task = moved_slot // self.replicas
                    receiver = next(
                        (taker for taker in rooms if not holds(copies, moved_task, taker)), -1
                    )
                    if receiver >= 0:
                        copies[moved_slot], copies[slot] = receiver, donor
                        room[receiver] -= 1
                        placed.add(moved_slot)
                        swaps.add(moved_slot, receiver, donor)
                        swaps.add(slot, donor)
                        return True
        return False

    def _place_on_least_loaded(self, slot: int, copies: list[int], swaps: _SwapIndex) -> None:
        """No swap exists (one copy per client forces it): ``slot`` goes to the client without
        a copy of its task that is least loaded per thread."""
        needed = slot // self.replicas
        active, count, clients = self.active, swaps.count, self.clients
        holds = self._runs_or_holds
        free = [donor for donor in range(len(clients)) if not holds(copies, needed, donor)]
        copies[slot] = min(
            free,
            key=lambda donor: (
                (len(active[donor]) + count[donor] + 1) / clients[donor].capacity,
                donor,
            ),
        )
        swaps.add(slot, copies[slot])

    def _standbys_per_column(
        self, copies: list[int]
    ) -> tuple[list[list[int]], list[tuple[int, ...]]]:
        """Standbys each client holds of each column (subtopology) so far, and the ceiling of
        its capacity share of that column's standbys (``even_standbys``' bounds)."""
        r, column, n_col = self.replicas, self.column, len(self.column_sizes)
        counts = [[0] * n_col for _ in self.clients]
        for slot, client in enumerate(copies):
            if client >= 0:
                counts[client][column[slot // r]] += 1
        per_column = [0] * n_col
        for task, stateful in enumerate(self.stateful):
            if stateful:
                per_column[column[task]] += r
        caps = [c.capacity for c in self.clients]
        shares = [share_bounds(copies_of_column, caps) for copies_of_column in per_column]
        # One row per client, transposed in C (a Python step per cell adds up at 1,000
        # clients with one task each).
        ceilings = list(zip(*(list(map(itemgetter(1), share)) for share in shares), strict=True))
        return counts, ceilings

    def _queue(self, room: list[int]) -> StandbyQueue:
        clients = self.clients
        aware = any(c.rack is not None or c.tags for c in clients)
        backups = [0] * len(clients)
        for task, client in enumerate(self.owner):
            if self.stateful[task]:
                backups[client] += self.replicas
        return StandbyQueue(
            room,
            [c.rack for c in clients] if aware else None,
            [c.tags for c in clients] if aware else None,
            self.rack_aware_tags,
            backups,
        )


class _SwapIndex:
    """Standby slots by client, kept ones and ones placed in this run apart, as min-heaps of
    slot numbers (task order): where ``_Run._place_by_swap`` looks for a copy to hand over.
    Entries go stale when a copy moves; readers drop those."""

    def __init__(self, copies: list[int], placed: set[int], clients: int) -> None:
        #: ``heaps[d][fresh]``: slots on client ``d``, placed in this run or not.
        self.heaps: list[tuple[list[int], list[int]]] = [([], []) for _ in range(clients)]
        #: Standby copies on each client, kept current by ``add``: the fallback's loads.
        self.count = [0] * clients
        for slot, client in enumerate(copies):
            if client >= 0:
                self.heaps[client][slot in placed].append(slot)
                self.count[client] += 1
        for kept, fresh in self.heaps:
            heapq.heapify(kept)
            heapq.heapify(fresh)

    def add(self, slot: int, client: int, was: int = -1) -> None:
        """Copy ``slot``, placed in this run, is now on client ``client`` (moved from ``was``)."""
        heapq.heappush(self.heaps[client][True], slot)
        self.count[client] += 1
        if was >= 0:
            self.count[was] -= 1


#: Steps (clients reached, hand-ons listed) all chain searches of one rebalance may take:
#: adversarial histories (half the clients full of caught-up state, room on clients with
#: little) take 20 s unbounded at 100,000 tasks x 1,000 clients; past it, the
#: slots left get copies from scratch as before the chains.
_CHAIN_BUDGET: Final = 1 << 20


class _KeptChains:
    """Augmenting chains over the copies ``_keep_local_state`` kept: a standby slot whose task's
    holders are all full goes to one of them, which hands one of its kept copies to another
    holder of that copy's task, and so on until a client with room takes one. Kept in task
    order, a holder filled up with early tasks' copies while a later task's only holders were
    full, and that task got a copy from scratch (a rolling restart of 5 processes, 256 tasks,
    one standby: 6-32 such copies, each with a caught-up holder left without one).

    A copy is handed on only to a holder ranking no worse on it (``_rank``'s tier, then caught
    up or its lag: lags within the acceptable recovery lag count as equal), so no previous
    standby goes to a mere store and no copy goes further behind; the first client of a chain
    may be any holder of the needed task (any state beats none). Every client keeps its
    target (the one at the end takes room it had), so the load rule holds as before.
    Breadth-first (shortest chain; a client with room ends the search when it is reached),
    deterministic (clients and copies in index order, a client's copies of the subtopology
    it takes one of first).
    Clients a failed search reached cannot reach room until a chain changes the copies, so
    they are skipped until then; passes over the slots still needing a copy end when one
    fills none.
    """

    def __init__(self, run: PlaceStandbys, copies: list[int], room: list[int]) -> None:
        self.run, self.copies, self.room = run, copies, room
        #: Kept copies (slots) on each client, in slot order.
        self.kept: list[list[int]] = [[] for _ in run.clients]
        for slot, client in enumerate(copies):
            if client >= 0:
                self.kept[client].append(slot)
        #: Clients a failed search reached since the last chain (none of them reaches room).
        self.dead: set[int] = set()
        #: ``_takers`` of each task looked at, with their ranks (tier, caught up or lag),
        #: dropped when a chain moves a copy of the task.
        self.open: dict[int, list[tuple[tuple[int, int], int]]] = {}
        #: ``_hand_ons`` of each client looked at.
        self.adj: dict[int, dict[int, list[int]]] = {}
        #: Steps left (``_CHAIN_BUDGET``).
        self.budget = _CHAIN_BUDGET

    def fill(self, need: list[int]) -> list[int]:
        """Fill what chains can of the ``need`` slots; returns those left, in order."""
        run = self.run
        lost = {client for _, client in run.lost}
        if not any(
            left > 0 and (state.prev_standby or state.lags or client in lost)
            for client, (left, state) in enumerate(zip(self.room, run.clients, strict=True))
        ):
            return need  # a chain ends at a holder with room: none has any (newcomers)
        changed = True
        while changed and self.budget > 0:
            changed = False
            left: list[int] = []
            for slot in need:
                if self.budget > 0 and self._chain(slot):
                    changed = True
                    self.dead.clear()
                else:
                    left.append(slot)
            need = left
        return need

    def _takers(self, task: int, holder: int) -> list[int]:
        """Clients that may hold a copy of ``task`` now: they hold state of it ranking no worse
        than ``holder``'s (any, when ``holder`` < 0), neither run it nor hold a copy."""
        found = self.open.get(task)
        if found is None:
            run, r = self.run, self.run.replicas
            held = set(self.copies[task * r : (task + 1) * r])
            held.add(run.owner[task])
            rank = run._rank
            found = self.open[task] = [
                (rank(task, c)[:2], c) for c in run.warm.get(task, ()) if c not in held
            ]
        if holder < 0:
            return [c for _, c in found]
        bar = self.run._rank(task, holder)[:2]
        return [c for key, c in found if key <= bar]

    def _hand_ons(self, client: int) -> dict[int, list[int]]:
        """Per client that may take one of ``client``'s kept copies, those copies (slot
        order); built at first use, dropped when a chain changes them."""
        got = self.adj.get(client)
        if got is None:
            r = self.run.replicas
            got = self.adj[client] = {}
            for moved in self.kept[client]:
                takers = self._takers(moved // r, client)
                self.budget -= len(takers) + 1
                for taker in takers:
                    got.setdefault(taker, []).append(moved)
        return got

    def _chain(self, slot: int) -> bool:
        """A chain ending in room for ``slot``'s task, breadth first; applied if found."""
        r, column, room, dead = self.run.replicas, self.run.column, self.room, self.dead
        #: How each reached client was reached: (client before it, the slot it takes over).
        came: dict[int, tuple[int, int]] = {}
        frontier = [c for c in self._takers(slot // r, -1) if c not in dead]
        for client in frontier:
            came[client] = (-1, slot)
            if room[client] > 0:
                self._apply(client, came)
                return True
        while frontier and self.budget > 0:
            nxt: list[int] = []
            for client in frontier:
                incoming = column[came[client][1] // r]
                hand_ons = self._hand_ons(client)
                self.budget -= len(hand_ons)
                for taker, slots in hand_ons.items():
                    if taker in came or taker in dead:
                        continue
                    # A copy of the incoming copy's subtopology first: handing that on keeps
                    # this client's count of each subtopology.
                    moved = next((s for s in slots if column[s // r] == incoming), slots[0])
                    came[taker] = (client, moved)
                    if room[taker] > 0:
                        self._apply(taker, came)
                        return True
                    nxt.append(taker)
            frontier = nxt
        if frontier:  # the budget ran out mid-search: what it reached is not known dead
            return False
        dead.update(came)
        return False

    def _apply(self, end: int, came: dict[int, tuple[int, int]]) -> None:
        """Move every copy along the chain ending at ``end`` one client on."""
        r = self.run.replicas
        self.room[end] -= 1
        client = end
        while client >= 0:
            before, slot = came[client]
            if before >= 0:
                self.kept[before].remove(slot)
            self.copies[slot] = client
            insort(self.kept[client], slot)
            task = slot // r
            self.open.pop(task, None)
            # Who may take this task's copies changed, and so did what these clients hold.
            for holder in (before, *self.copies[task * r : (task + 1) * r]):
                self.adj.pop(holder, None)
            client = before
