"""Step 11 (evening, ``balance="subtopology"``): exchanges of standbys placed in this run that
even out each client's standbys per subtopology, and hand on backups of one client's tasks
piled on one other (rule 7's spread)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from ..shares import share_bounds
from .pick_standby_clients import StandbyQueue
from .run_state import RunState

#: Exchange tries the per-subtopology standby evening takes at most (0.1 s or so).
_EVEN_BUDGET: Final = 1 << 16


class _StandbyEvener:
    """Exchanges of standbys placed in this run between two clients that bring every client's
    standbys of each subtopology nearer the floor or ceiling of its capacity share of that
    subtopology's copies (as even as the one-copy rule and the load rule allow).

    Client ``a`` hands a copy of subtopology ``s`` to ``b`` and ``b`` one of ``s2`` to ``a``:
    both keep their standby counts (the load rule), and the four counts' total distance from
    their floors and ceilings falls, so passes end (one count may step out of its bounds when
    two others come nearer: the way round when no pair of clients can even both cells, e.g.
    three clients each off in two subtopologies). Clients with a count outside its bounds are
    tried as partners first. Only copies on a client without state of their task move (kept
    and handed-back copies stay), and not those of a task some client held a standby of and
    lost (``_return_dropped_standbys`` has weighed where those go); never onto a client
    holding the task, and never to more rack or tag conflicts. A copy moves to a client only
    if it then backs up no more of the copy's active client's tasks than one above an even
    spread (``ceil(actives * standbys / (clients - 1)) + 1``) or than the client it leaves
    did (weighed with the exchange's other copy already moved), so one client's tasks stay
    spread over many others (rule 7). Where placement left a client backing up more than
    that of one client's tasks, exchanges within one subtopology hand them on (``_spread_pass``).
    ``_EVEN_BUDGET`` tries at most (large inputs may stop short).
    """

    def __init__(
        self, run: RunState, copies: list[int], placed: set[int], queue: StandbyQueue
    ) -> None:
        self.state, self.copies, self.queue = run, copies, queue
        per_column = self._count_copies()
        caps = [c.capacity for c in run.clients]
        columns = [share_bounds(k, caps) for k in per_column]
        #: Floor and ceiling of each client's standbys of each subtopology (transposed in C:
        #: one row per client).
        self.bounds = list(zip(*columns, strict=True))
        #: Clients with a count outside its bounds, per column (kept current by ``_move``).
        self.outside: list[set[int]] = []
        for col, column_bounds in enumerate(columns):
            self.outside.append(
                {
                    client
                    for client, ((lo, hi), counts) in enumerate(
                        zip(column_bounds, self.count, strict=True)
                    )
                    if not lo <= counts[col] <= hi
                }
            )
        #: Copies that may move, per (client, column), in slot order.
        self.movable: dict[tuple[int, int], list[int]] = {}
        for slot in sorted(placed):
            if copies[slot] >= 0 and self._may_move(slot):
                cell = (copies[slot], run.column[slot // run.replicas])
                self.movable.setdefault(cell, []).append(slot)
        #: Copies of each client's actives that each client holds, at ``active * clients +
        #: holder``, only the pairs with copies (a dict: a flat list over every pair is
        #: clients squared, a million entries to fill at 1,000 clients).
        n_clients, r, owner = len(run.clients), run.replicas, run.owner
        backed: dict[int, int] = {}
        for slot, client in enumerate(copies):
            if client >= 0:
                pair = owner[slot // r] * n_clients + client
                backed[pair] = backed.get(pair, 0) + 1
        self.backed = backed
        #: Per client, copies of its actives any one other client may hold: one more than an
        #: even spread (the bound rule 7 promises).
        others = max(1, len(run.clients) - 1)
        self.spread = [1 - (-len(mine) * run.replicas // others) for mine in run.active]
        self.budget = _EVEN_BUDGET

    def _count_copies(self) -> list[int]:
        """Set ``count`` (each client's copies per column); returns the copies per column."""
        run = self.state
        r, column = run.replicas, run.column
        n_col = len(run.column_sizes)
        #: Standby copies of each client per column (subtopology).
        count = self.count = [[0] * n_col for _ in run.clients]
        per_column = [0] * n_col
        for slot, client in enumerate(self.copies):
            if client >= 0:
                col = column[slot // r]
                per_column[col] += 1
                count[client][col] += 1
        return per_column

    def _may_move(self, slot: int) -> bool:
        """Whether the copy in ``slot`` (placed in this run) may move: its client has no state
        of the task, and no previous standby holder of the task lost it."""
        run, copies = self.state, self.copies
        r, task, client = run.replicas, slot // run.replicas, copies[slot]
        found = run.warm.get(task)  # every client with state of the task, other than its owner
        if not found:
            return True
        if client in found:
            return False  # warm state here
        held = copies[task * r : (task + 1) * r]
        task_id, clients = run.tasks[task], run.clients
        return not any(
            holder not in held
            and holder != run.owner[task]
            and task_id in clients[holder].prev_standby
            for holder in found
        )

    def run(self) -> None:
        """Evening passes until one moves nothing, then a spreading pass; again while that
        moves a copy (or until the budget is spent). Each exchange lowers the counts' total
        distance outside their bounds (evening) or keeps it and lowers the backups held above
        ``spread`` (spreading; evening never raises those), so the passes end. Where no client
        backs up more than ``spread`` of one client's tasks, this is the evening alone."""
        spread_moved = True
        while spread_moved and self.budget > 0:
            even_moved = True
            while even_moved and self.budget > 0:
                even_moved = self._even_pass()
            spread_moved = self.budget > 0 and self._spread_pass()

    def _even_pass(self) -> bool:
        """One exchange tried for every count outside its bounds; whether any was made."""
        count, bounds = self.count, self.bounds
        n_cli, n_col = len(count), len(count[0]) if count else 0
        moved = False
        for col in range(n_col):
            for client in range(n_cli):
                lo, hi = bounds[client][col]
                if count[client][col] > hi:
                    moved |= self._exchange_from(client, col)
                elif count[client][col] < lo:
                    moved |= self._exchange_to(client, col)
                if self.budget <= 0:
                    return moved
        return moved

    def _spread_pass(self) -> bool:
        """Rule 7 after placement: a client backing up more than ``spread`` of one active
        client's tasks hands such copies on in exchanges within one subtopology (counts
        unchanged); whether any was made.

        Placement goes one subtopology after another, each active client's copies together:
        the last subtopology's last copies go wherever room is left, often one client, which
        may already back up that active client (6, 1, 6 and 10 tasks over 5 equal clients,
        one standby: 4 of one client's 5 copies on one other, 3 at most is the bound).
        """
        n_clients, spread, backed = len(self.count), self.spread, self.backed
        if max(backed.values(), default=0) <= min(spread, default=0):
            return False  # nothing above the least bound (the usual case), checked in C
        # Only pairs with a copy that may move: kept copies above the spread cost a scan of
        # every client per pair and move nothing (5.2 s at 2,000 clients).
        r, owner = self.state.replicas, self.state.owner
        may_move = {
            owner[slot // r] * n_clients + holder
            for (holder, _), slots in self.movable.items()
            for slot in slots
        }
        over = sorted(
            pair
            for pair, held in backed.items()
            if held > spread[pair // n_clients] and pair in may_move
        )
        moved = False
        for pair in over:
            active, holder = divmod(pair, n_clients)
            while backed[pair] > spread[active] and self._hand_on(active, holder):
                moved = True
            if self.budget <= 0:
                break
        return moved

    def _hand_on(self, active: int, holder: int) -> bool:
        """Exchange a copy of a task active on ``active`` held by ``holder`` with a copy of the
        same subtopology on a client backing up fewer than ``spread`` of ``active``'s tasks;
        whether one was made."""
        state, backed, n_clients = self.state, self.backed, len(self.count)
        r, owner, row = state.replicas, state.owner, active * n_clients
        takers: list[int] | None = None  # made at the first column with a copy to hand on
        for col in range(len(self.count[holder])):
            mine = [s for s in self.movable.get((holder, col), ()) if owner[s // r] == active]
            if not mine:
                continue
            if takers is None:
                takers = [
                    taker
                    for taker in range(n_clients)
                    if taker not in (active, holder)
                    and backed.get(row + taker, 0) < self.spread[active]
                ]
            for taker in takers:
                self.budget -= 1
                if self._try(holder, taker, col, col, mine):
                    return True
                if self.budget <= 0:
                    return False
        return False

    def _exchange_from(self, client: int, col: int) -> bool:
        """``client`` is above its ceiling of ``col``: hand one to a client with room for it."""
        return self._exchange(client, col, giving=True)

    def _exchange_to(self, client: int, col: int) -> bool:
        """``client`` is below its floor of ``col``: take one from a client above its floor."""
        return self._exchange(client, col, giving=False)

    def _exchange(self, client: int, col: int, giving: bool) -> bool:
        """Try the other clients as the partner of ``client`` for one exchange of ``col``.

        Each (partner, ``col2``) is one try of the budget. The distance change is summed from
        each count's step (counts change only when an exchange is made, which ends the call),
        and tries that cannot succeed are charged without running the picks: a giver without
        movable copies of ``col`` fails every try at no further cost.
        """
        count, movable, step_of = self.count, self.movable, self._step
        n_col = len(count[0])
        tries = n_col - 1  # per partner: every column but ``col``
        step = 1 if giving else -1  # the step of the partner's count of ``col``
        if giving and not movable.get((client, col)):
            self.budget -= tries * (len(count) - 1)
            return False
        mine_col = step_of(client, col, -step)
        mine = [step_of(client, col2, step) for col2 in range(n_col)]
        others_cols = [col2 for col2 in range(n_col) if col2 != col]
        for other in self._partners(client):
            if not giving and not movable.get((other, col)):
                self.budget -= tries  # nothing to give: every try fails at the first pick
                if self.budget <= 0:
                    return False
                continue
            near = mine_col + step_of(other, col, step)
            giver, taker = (client, other) if giving else (other, client)
            for col2 in others_cols:
                self.budget -= 1
                if near + mine[col2] + step_of(other, col2, -step) < 0 and self._try(
                    giver, taker, col, col2
                ):
                    return True
                if self.budget <= 0:
                    return False
        return False

    def _partners(self, client: int) -> Iterator[int]:
        """The clients other than ``client``: first those with a count outside its bounds (an
        exchange with one can bring two counts nearer at once), then the rest in order."""
        first = sorted(set().union(*self.outside) - {client})
        yield from first
        skip = {client, *first}
        yield from (other for other in range(len(self.count)) if other not in skip)

    def _try(
        self, giver: int, taker: int, col: int, col2: int, given: list[int] | None = None
    ) -> bool:
        """Exchange a copy of ``col`` on ``giver`` (one of the ``given`` slots, ``None``: any
        movable) with one of ``col2`` on ``taker`` when two such copies exist (the caller has
        checked that the exchange lowers the distance or the spread)."""
        give = self._pick(giver, col, taker, given)
        if give < 0:
            return False
        # The copy going back is weighed with ``give`` already moved: when both back up the
        # same active client, the exchange leaves its spread as it was.
        row = self.state.owner[give // self.state.replicas] * len(self.count)
        self._back_up(row + giver, -1)
        self._back_up(row + taker, 1)
        back = self._pick(taker, col2, giver)
        self._back_up(row + giver, 1)
        self._back_up(row + taker, -1)
        if back < 0:
            return False
        self._move(give, giver, taker, col)
        self._move(back, taker, giver, col2)
        return True

    def _step(self, client: int, col: int, step: int) -> int:
        """How the distance of ``client``'s count of ``col`` outside its bounds changes when the
        count moves by ``step`` (1 or -1): -1 nearer, 0 within, 1 further out."""
        value = self.count[client][col]
        lo, hi = self.bounds[client][col]
        if step > 0:
            return 1 if value >= hi else -1 if value < lo else 0
        return -1 if value > hi else 1 if value <= lo else 0

    def _note_bounds(self, client: int, col: int) -> None:
        """Keep ``outside`` current for the count of ``client`` in ``col``."""
        lo, hi = self.bounds[client][col]
        if lo <= self.count[client][col] <= hi:
            self.outside[col].discard(client)
        else:
            self.outside[col].add(client)

    def _pick(self, src: int, col: int, dst: int, slots: list[int] | None = None) -> int:
        """The first movable copy of ``col`` on ``src`` (among ``slots``, ``None``: any) that
        ``dst`` may hold (-1: none)."""
        state, copies, queue = self.state, self.copies, self.queue
        r, owner, backed, n_clients = state.replicas, state.owner, self.backed, len(self.count)
        for slot in self.movable.get((src, col), ()) if slots is None else slots:
            self.budget -= 1
            task = slot // r
            held = copies[task * r : (task + 1) * r]
            if owner[task] == dst or dst in held:
                continue
            row = owner[task] * n_clients
            if backed.get(row + dst, 0) >= max(self.spread[owner[task]], backed.get(row + src, 0)):
                continue  # would pile this client's backups up on ``dst``
            if queue.aware:
                others = [owner[task], *(x for k, x in enumerate(held) if task * r + k != slot)]
                if queue.conflicts(dst, others) > queue.conflicts(src, others):
                    continue
            return slot
        return -1

    def _back_up(self, pair: int, change: int) -> None:
        """Change the copies held for ``pair`` (``active * clients + holder``) by ``change``."""
        self.backed[pair] = self.backed.get(pair, 0) + change

    def _move(self, slot: int, src: int, dst: int, col: int) -> None:
        row = self.state.owner[slot // self.state.replicas] * len(self.count)
        self._back_up(row + src, -1)
        self._back_up(row + dst, 1)
        self.copies[slot] = dst
        self.count[src][col] -= 1
        self.count[dst][col] += 1
        self._note_bounds(src, col)
        self._note_bounds(dst, col)
        self.movable[src, col].remove(slot)
        self.movable.setdefault((dst, col), []).append(slot)
