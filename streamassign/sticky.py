"""The sticky task assignor: active and standby tasks over clients, balanced and minimal-move.

The algorithm (DESIGN §3), in order of precedence:

1. **Quotas.** Balanced per subtopology (``balance="subtopology"``, the default): a quota per
   (client, subtopology), the floor or ceiling of its capacity-proportional share, with row
   totals within floor and ceiling of the client's total share; ``_quotas.best_quotas`` picks
   the matrix that keeps the most previous tasks (an exact min-cost flow), and each
   subtopology then goes through steps 2-4 on its own. With ``balance="total"``: each client's
   total quota is the floor or ceiling of its share; the ceilings go to the clients that ran
   the most tasks above their floor. Either choice makes the moves minimal for its balance.
2. **Stickiness.** Every client keeps ``min(K_c, q_c)`` of the tasks it ran, so moves equal the
   lower bound exactly. A client over quota releases tasks of its most crowded subtopologies
   first, and among those the ones another client holds warm state for.
3. **Warm takeovers.** A task without a keeper goes to a client with room that holds a standby
   of it, else to the one with the smallest lag; when all its holders are full, a chain of
   this rebalance's takeovers shifts along holders to one with room (``_takeover``).
4. **Spread.** The rest are dealt in ``(subtopology, partition)`` order over the clients' free
   room, evenly interleaved, so a subtopology is spread over clients.
5. **Standbys.** Every stateful task gets ``min(num_standby_replicas, clients - 1)`` standbys on
   clients without a copy of it. Targets bring each client's active+standby load to the floor or
   ceiling of its share (as far as one copy per client allows); previous standbys (then other
   local state, lowest lag first) are kept, those of tasks active on clients that take new
   standbys first; the rest go to the clients with most room left, those tasks first again,
   with a one-step swap when the only clients with room already hold the task. Balanced per
   subtopology, exchanges of new standbys then even out each client's standbys per subtopology.

All decisions iterate in sorted order of task and process ids, so the same input gives the same
output whatever the order of the input collections.
"""

from __future__ import annotations

import collections
import heapq
from collections.abc import Collection, Iterable, Mapping, Sequence
from functools import partial
from itertools import pairwise
from typing import Final, Literal

import attrs

from ._balance import apportion, deal, level_order, share_bounds, standby_targets
from ._ids import TaskId, as_task
from ._quotas import best_quotas, quota_bounds
from ._standby_queue import RACK_SCAN, StandbyQueue
from ._takeover import augment_takeovers
from .assignment import ClientAssignment, ClientState
from .errors import AssignmentInputError, DuplicateProcessIdError, NoClientsError

#: Standbys each rack-conflicting standby is weighed against for an exchange.
_EXCHANGE_SCAN: Final = 2048
#: Steps the exchange pass takes in all: one per partner looked at, ``_EXCHANGE_COST`` more per
#: partner weighed. Unbounded, 1,000 tasks with 4 standbys over 3 racks took 18 s.
_EXCHANGE_BUDGET: Final = 1 << 18
_EXCHANGE_COST: Final = 16
#: Exchange tries the per-subtopology standby evening takes at most (0.1 s or so).
_EVEN_BUDGET: Final = 1 << 16
#: Lag used for a standby whose lag the client did not report: behind every known lag.
_UNKNOWN_LAG: Final = 1 << 62


def _non_negative(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise AssignmentInputError(f"{attribute.name} must be an int >= 0, got {value!r}")


_ID_TYPES = (TaskId, tuple)  # task ids the fast paths take as they are


def _task_collection(items: Iterable[TaskId]) -> Collection[TaskId]:
    """``items`` as is when it is a collection of TaskIds or tuples (judged by one element),
    else a list of ``as_task`` of each: other iterables, "s_p" text, lists of pairs."""
    if isinstance(items, (frozenset, set, list, tuple)) and (
        not items or type(next(iter(items))) in _ID_TYPES
    ):
        return items
    return list(map(as_task, items))


def _tag_keys(value: Iterable[str] | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(value)


#: What ``StickyTaskAssignor`` balances: every subtopology and the total (default), or the
#: total only.
Balance = Literal["subtopology", "total"]
BALANCE_MODES: Final = ("subtopology", "total")


def _balance_mode(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if value not in BALANCE_MODES:
        raise AssignmentInputError(
            f"{attribute.name} must be one of {', '.join(BALANCE_MODES)}, got {value!r}"
        )


def _claims(
    index: Mapping[TaskId, int], clients: Sequence[ClientState]
) -> tuple[list[int], list[tuple[int, int]]]:
    """Previous owner (client index, or -1) of each task, and the claims that lost.

    A task claimed as active by several clients (a zombie, or a partitioned network) goes to the
    claimant with the smallest lag, then the smallest process id (``clients`` is sorted by it).
    """
    owner = [-1] * len(index)
    lost: list[tuple[int, int]] = []
    for ci, c in enumerate(clients):
        for t in c.prev_active:
            i = index.get(t)
            if i is None:
                continue
            j = owner[i]
            if j < 0:
                owner[i] = ci
            elif c.lags.get(t, 0) < clients[j].lags.get(t, 0):
                owner[i] = ci
                lost.append((i, j))
            else:
                lost.append((i, ci))
    return owner, lost


def resolve_previous_owners(
    tasks: Iterable[TaskId], clients: Iterable[ClientState]
) -> dict[TaskId, str]:
    """Previous active owner (process id) of each task that has one; duplicate claims resolved
    as the assignor resolves them: smallest lag, then smallest process id."""
    task_list = list(dict.fromkeys(tasks))
    client_list = sorted(clients, key=lambda c: c.process_id)
    owner, _ = _claims({t: i for i, t in enumerate(task_list)}, client_list)
    return {
        t: client_list[ci].process_id for t, ci in zip(task_list, owner, strict=True) if ci >= 0
    }


@attrs.frozen
class StickyTaskAssignor:
    """Assigns active and standby tasks to clients; see the module docstring for the rules.

    ``num_standby_replicas`` is the number of standbys wanted for each stateful task (capped at
    ``clients - 1``, since one client never holds two copies of a task).
    """

    num_standby_replicas: int = attrs.field(default=0, validator=_non_negative)
    #: Lags up to this count as caught up: such holders rank equal (Kafka Streams' default).
    acceptable_recovery_lag: int = attrs.field(default=10_000, validator=_non_negative)
    #: Client tag keys a standby's placement avoids sharing values of with the task's other
    #: copies (KIP-708's ``rack.aware.assignment.tags``); ``None``: every key clients report.
    rack_aware_tags: tuple[str, ...] | None = attrs.field(default=None, converter=_tag_keys)
    #: ``"subtopology"``: every client's actives of each subtopology, and its total, within
    #: floor and ceiling of its capacity share, with the fewest moves that allows.
    #: ``"total"``: only the total (fewer moves when a group's history is uneven per
    #: subtopology, e.g. each client ran a whole subtopology; docs/assignor.md).
    balance: Balance = attrs.field(default="subtopology", validator=_balance_mode)

    def assign(
        self,
        tasks: Iterable[TaskId],
        clients: Iterable[ClientState],
        stateful: Iterable[TaskId] | None = None,
        task_racks: Mapping[TaskId, str] | None = None,
    ) -> dict[str, ClientAssignment]:
        """Assignment per process id, for every client given.

        ``stateful=None`` treats every task as stateful. ``task_racks``, the rack of the
        leaders of each task's partitions, makes tasks that need a new client prefer one in
        that rack (cross-rack traffic, KIP-925) without changing how many any client gets.
        Tasks may also be given as ``"s_p"`` text or ``(subtopology, partition)`` pairs.
        Raises ``DuplicateProcessIdError`` or ``NoClientsError`` (both ``ValueError``s).
        """
        tasks = _task_collection(tasks)
        if stateful is not None:
            stateful = _task_collection(stateful)
        return _Run(
            tasks,
            clients,
            stateful,
            self.num_standby_replicas,
            self.acceptable_recovery_lag,
            rack_aware_tags=self.rack_aware_tags,
            task_racks=task_racks,
            by_subtopology=self.balance == "subtopology",
        ).result()


class _Run:
    """State of one assignment; tasks and clients are referred to by index in sorted order."""

    def __init__(
        self,
        tasks: Iterable[TaskId],
        clients: Iterable[ClientState],
        stateful: Iterable[TaskId] | None,
        num_standby_replicas: int,
        acceptable_recovery_lag: int = 10_000,
        rack_aware_tags: Sequence[str] | None = None,
        task_racks: Mapping[TaskId, str] | None = None,
        by_subtopology: bool = True,
    ) -> None:
        self.acceptable_lag = acceptable_recovery_lag
        self.rack_aware_tags = rack_aware_tags
        self.task_racks = task_racks or {}
        self.tasks: list[TaskId] = sorted({as_task(t) for t in tasks})
        self.clients: list[ClientState] = sorted(clients, key=lambda c: c.process_id)
        for a, b in pairwise(self.clients):
            if a.process_id == b.process_id:
                raise DuplicateProcessIdError(a.process_id)
        if self.tasks and not self.clients:
            raise NoClientsError(len(self.tasks))
        self.index: dict[TaskId, int] = {t: i for i, t in enumerate(self.tasks)}
        n = len(self.tasks)
        #: Column (subtopology number in sorted order) of each task, and tasks per column.
        self.column: list[int] = []
        self.column_sizes: list[int] = []
        last = None
        for t in self.tasks:
            if t.subtopology != last:
                last = t.subtopology
                self.column_sizes.append(0)
            self.column_sizes[-1] += 1
            self.column.append(len(self.column_sizes) - 1)
        # With one subtopology, balancing it is balancing the total.
        self.by_subtopology = by_subtopology and len(self.column_sizes) > 1
        if stateful is None:
            self.stateful = [True] * n
        else:
            self.stateful = [False] * n
            for t in stateful:
                i = self.index.get(as_task(t))
                if i is not None:
                    self.stateful[i] = True
        self.replicas = min(num_standby_replicas, max(0, len(self.clients) - 1))
        self.owner = [-1] * n  # active client index of each task
        self.active: list[list[int]] = [[] for _ in self.clients]
        self.standby: list[list[int]] = [[] for _ in self.clients]
        self.prev_owner, self.lost = _claims(self.index, self.clients)
        self.warm: dict[int, list[int]] = {}
        #: ``_rank`` of (task, client) pairs, by ``task * clients + client``: fixed for a run.
        self._ranks: dict[int, tuple[int, int, int, int, int]] = {}
        #: Whether ``warm`` lists were sorted by ``_rank`` (else every holder ranks the same).
        self._ranked = False

    # -- local state ---------------------------------------------------------------------------

    def _warm_holders(self, lost: list[tuple[int, int]]) -> dict[int, list[int]]:
        """Per task, the clients other than its previous owner with local state, best first.

        Best: a standby holder, then the smallest lag (see ``_rank``). Only lists with several
        holders are sorted; most tasks have one or none.
        """
        holders: dict[int, list[int]] = {}
        index = self.index
        for ci, c in enumerate(self.clients):
            for t in c.prev_standby:
                i = index.get(t)
                if i is not None:
                    holders.setdefault(i, []).append(ci)
            for t in c.lags:
                if t not in c.prev_standby and t not in c.prev_active:
                    i = index.get(t)
                    if i is not None:
                        holders.setdefault(i, []).append(ci)
        for i, ci in lost:
            if ci not in holders.get(i, ()):
                holders.setdefault(i, []).append(ci)
        # Holders were appended in client order; without lags, lost claims or a task both
        # active and standby on one client, that already is rank order (see ``_rank``).
        self._ranked = bool(lost) or any(
            c.lags or c.prev_active & c.prev_standby for c in self.clients
        )
        if self._ranked:
            rank = self._rank
            for i, found in holders.items():
                if len(found) > 1:
                    keyed = [rank(i, ci) for ci in found]
                    keyed.sort()  # ranks end with the client index: no ties
                    found[:] = [k[-1] for k in keyed]
        return holders

    def _restart_claims(self, orphans: list[tuple[int, int]]) -> list[list[int]]:
        """Per client, in task order, the orphans it alone ranks best on and has at lag 0 —
        only when no client reports anything as run (the whole group restarted).

        After a restart with stores on disk (every store reported with its lag), those are
        the tasks the client ran: it keeps them like previous tasks. While some client reports
        what it ran, a client reporting nothing may just have run nothing (a survivor of a
        crash with caught-up standbys): claims there would block the warm takeovers of other
        orphans, so its standbys stay ordinary warm holders.
        """
        claims: list[list[int]] = [[] for _ in self.clients]
        if not self._ranked or any(c.prev_active for c in self.clients):
            return claims  # no lags (nobody has a task at lag 0), or not a whole-group restart
        rank, warm = self._rank, self.warm
        for i in sorted(i for _, i in orphans):
            found = warm[i]
            best = rank(i, found[0])
            if best[3] == 0 and (len(found) == 1 or rank(i, found[1])[:4] != best[:4]):
                claims[found[0]].append(i)
        return claims

    def _rank(self, i: int, ci: int) -> tuple[int, int, int, int, int]:
        """Order of clients holding state of task ``i``, best first: standby holders, then
        caught-up ones (lag within the acceptable recovery lag count as equal), then one that
        ran the task (a restarted process whose claim lost to the interim owner), then by lag.
        """
        key = i * len(self.clients) + ci
        got = self._ranks.get(key)
        if got is None:
            c, t = self.clients[ci], self.tasks[i]
            ran = 0 if t in c.prev_active else 1
            tier = 0 if t in c.prev_standby else 1
            lag = c.lags.get(t, _UNKNOWN_LAG if tier == 0 else 0)
            got = self._ranks[key] = (tier, 0 if lag <= self.acceptable_lag else lag, ran, lag, ci)
        return got

    # -- actives -------------------------------------------------------------------------------

    def _previous_tasks(self) -> list[list[int]]:
        """Tasks each client ran before, after resolving duplicate claims."""
        prev: list[list[int]] = [[] for _ in self.clients]
        for i, ci in enumerate(self.prev_owner):
            if ci >= 0:
                prev[ci].append(i)
        return prev

    def assign_actives(self) -> None:
        if self.by_subtopology:
            self._actives_per_subtopology()
        else:
            self._actives_by_total()
        owner, warm = self.owner, self.warm
        for i, ci in enumerate(owner):
            self.active[ci].append(i)
        # A previous owner that gave its task up still holds its state: a fine standby.
        for i, (was, now) in enumerate(zip(self.prev_owner, owner, strict=True)):
            if was >= 0 and was != now and was not in warm.get(i, ()):
                found = warm.setdefault(i, [])
                found.append(was)
                found.sort(key=partial(self._rank, i))

    def _actives_by_total(self) -> None:
        """Quotas per client from its total share (``balance="total"``), then keep, take over
        warm and deal."""
        caps = [c.capacity for c in self.clients]
        prev = self._previous_tasks()
        bounds = share_bounds(len(self.tasks), caps)
        floors = [lo for lo, _ in bounds]
        tasks, warm = self.tasks, self.warm
        # Ceilings go to the clients that ran most above their floor (the move bound), then to
        # the clients whose claims and the orphans a matching would give them (each orphan
        # counted for the warm holder with the fewest matches so far that still has room for it
        # below its ceiling) do not fit their floor, so that orphans can be taken over warm.
        matched = [0] * len(self.clients)
        orphans = sorted((len(h), i) for i, h in warm.items() if self.prev_owner[i] < 0)
        for _, i in orphans:
            # ``warm[i]`` is in rank order: the first holder with the fewest matches is the
            # one with the least (matches, rank).
            roomy = [h for h in warm[i] if matched[h] < bounds[h][1] - len(prev[h])]
            if roomy:
                matched[min(roomy, key=matched.__getitem__)] += 1
        claims = self._restart_claims(orphans)

        # Claims count after previous tasks: they only order the clients whose previous tasks
        # fit their floor (the same order as without claims when there are none).
        def priority(ci: int) -> tuple[int, bool, int, int, int]:
            below = floors[ci] - len(prev[ci])
            spare = below - len(claims[ci])
            return min(0, below), spare >= matched[ci], spare, -matched[ci], ci

        quotas = apportion(len(tasks), caps, priority=priority)
        room = self._keep_previous(quotas, prev, claims)
        self._place_orphans(range(len(tasks)), room, quotas, bounds)

    def _keep_previous(
        self, quotas: list[int], prev: list[list[int]], claims: list[list[int]]
    ) -> list[int]:
        """Each client keeps up to its quota of what it ran (``prev``), then of its claims;
        returns the room each has left."""
        owner = self.owner
        room = [q - min(q, len(mine)) for q, mine in zip(quotas, prev, strict=True)]
        # Room each client has beyond its claims: where a released task can still land warm.
        spare = [r - min(r, len(mine)) for r, mine in zip(room, claims, strict=True)]
        promised = [0] * len(self.clients)
        for ci, mine in enumerate(prev):
            extra = len(mine) - quotas[ci]
            if extra <= 0:
                for i in mine:
                    owner[i] = ci
                continue
            # First give back what a returning client ran before (a restarted process whose
            # claim lost to this interim owner), when it is caught up and has room for it.
            back: list[int] = []
            for i in mine:
                h = self._returning(i, ci, room, promised)
                if h >= 0 and len(back) < extra:
                    back.append(i)
                    promised[h] += 1
            self._keep([i for i in mine if i not in back], ci, quotas[ci], spare)
        # Then claims, like previous tasks, in the room left (a client's previous tasks first:
        # dropping one of those is a move).
        for ci, mine in enumerate(claims):
            if mine:
                room[ci] -= self._keep(mine, ci, room[ci] - promised[ci], spare)
        return room

    def _place_orphans(
        self,
        scope: range,
        room: list[int],
        quotas: list[int],
        bounds: Sequence[tuple[int, int]],
    ) -> None:
        """Give the tasks of ``scope`` nobody keeps to clients with ``room``: warm takeovers
        first, then dealt in task order over the free room (``room`` is used up)."""
        owner, warm = self.owner, self.warm
        # Warm takeovers: over all (task, holder) pairs, standby holders first, then the
        # smallest lag, so a contested client's room goes to what it is most caught up on.
        rank = self._rank
        pairs = []
        for i in scope:
            if owner[i] < 0:
                for h in warm.get(i, ()):
                    k = rank(i, h)
                    pairs.append((k[0], k[1], k[2], k[3], i, h))
        pairs.sort()
        took: dict[int, list[int]] = {}  # client -> tasks it took over warm
        later = len(pairs)
        if self._ranked:
            # Standby holders first, chains and moved ceilings included, before a holder with
            # other local state takes anything: such a holder would fill a ceiling a standby
            # holder of the same orphan could have had.
            later = next((k for k, p in enumerate(pairs) if p[0]), later)
        _take_warm(pairs[:later], owner, room, took)
        if later < len(pairs):
            waiting = sorted({p[4] for p in pairs[:later] if owner[p[4]] < 0})
            if waiting:
                augment_takeovers(waiting, self._standby_holders, owner, took, room, quotas, bounds)
            _take_warm(pairs[later:], owner, room, took)
        cold = [i for i in scope if owner[i] < 0]
        if not warm.keys().isdisjoint(cold):
            cold = augment_takeovers(
                cold, self._holders, owner, took, room, quotas, bounds, self._no_worse
            )

        # Spread the rest in (subtopology, partition) order over the free room.
        for i, ci in zip(cold, deal(room), strict=True):
            owner[i] = ci
        if self.task_racks:
            self._match_racks(cold)

    def _actives_per_subtopology(self) -> None:
        """Quotas per (client, subtopology) (``balance="subtopology"``): the admissible quota
        matrix keeping the most previous tasks, then claims and warm takeovers (``_quotas``);
        then each subtopology is kept, taken over warm and dealt on its own."""
        caps = [c.capacity for c in self.clients]
        sizes, column = self.column_sizes, self.column
        cells, _ = quota_bounds(sizes, caps)
        prev: list[list[list[int]]] = [[[] for _ in sizes] for _ in self.clients]  # per cell
        for ci, mine in enumerate(self._previous_tasks()):
            for i in mine:
                prev[ci][column[i]].append(i)
        warm = self.warm
        # As in ``_actives_by_total``: each orphan counted for the warm holder with the fewest
        # matches so far that has room for it below the ceiling of its cell.
        matched = [[0] * len(sizes) for _ in self.clients]
        orphans = sorted((len(h), i) for i, h in warm.items() if self.prev_owner[i] < 0)
        for _, i in orphans:
            col = column[i]
            roomy = [h for h in warm[i] if matched[h][col] < cells[h][col][1] - len(prev[h][col])]
            if roomy:
                matched[min(roomy, key=lambda h: matched[h][col])][col] += 1
        claims: list[list[list[int]]] = [[[] for _ in sizes] for _ in self.clients]
        for ci, mine in enumerate(self._restart_claims(orphans)):
            for i in mine:
                claims[ci][column[i]].append(i)
        quotas = best_quotas(sizes, caps, self._cell_gains(cells, prev, claims, matched))
        start = 0
        for col, size in enumerate(sizes):
            scope = range(start, start + size)
            start += size
            self._keep_and_place(
                scope,
                [row[col] for row in quotas],
                [row[col] for row in prev],
                [row[col] for row in claims],
            )
        self._hand_orphans_to_standby_holders(cells, caps)

    def _hand_orphans_to_standby_holders(
        self, cells: list[list[tuple[int, int]]], caps: list[int]
    ) -> None:
        """An orphan placed on a client without a standby of it moves to a standby holder of
        it when the quota matrix allows: the placing client above its floors (cell and total),
        the holder below its ceilings. The cell ceiling moves with it, so every count stays
        admissible, and no kept task moves. The gains that chose the matrix only estimate
        where orphans can go warm; this makes sure no such hand-over is left."""
        owner, column, prev_owner = self.owner, self.column, self.prev_owner
        rows = share_bounds(len(self.tasks), caps)
        counts = [[0] * len(self.column_sizes) for _ in caps]
        totals = [0] * len(caps)
        for i, ci in enumerate(owner):
            counts[ci][column[i]] += 1
            totals[ci] += 1
        # Orphans with a standby holder other than their client; each hand-over takes one
        # off for good, and one may free room for an earlier one: passes until none moves.
        waiting = [
            i
            for i, ci in enumerate(owner)
            if prev_owner[i] < 0 and (found := self._standby_holders(i)) and ci not in found
        ]
        moved = True
        while moved:
            moved = False
            for i in waiting:
                ci, col = owner[i], column[i]
                if counts[ci][col] <= cells[ci][col][0] or totals[ci] <= rows[ci][0]:
                    continue
                for h in self._standby_holders(i):
                    if counts[h][col] < cells[h][col][1] and totals[h] < rows[h][1]:
                        owner[i] = h
                        counts[ci][col] -= 1
                        totals[ci] -= 1
                        counts[h][col] += 1
                        totals[h] += 1
                        moved = True
                        break
            waiting = [i for i in waiting if owner[i] not in self._standby_holders(i)]

    @staticmethod
    def _cell_gains(
        cells: list[list[tuple[int, int]]],
        prev: list[list[list[int]]],
        claims: list[list[list[int]]],
        matched: list[list[int]],
    ) -> list[list[int]]:
        """What a cell's ceiling is worth, in strict priority: a previous task kept (the move
        bound), then a restart claim kept, then a matched orphan taken over warm."""
        tier = len(cells) * len(cells[0]) + 1 if cells else 1
        gains = []
        for ci, row in enumerate(cells):
            out = []
            for col, (lo, _) in enumerate(row):
                ran = len(prev[ci][col])
                claimed = ran + len(claims[ci][col])
                out.append(
                    (ran > lo) * tier * tier
                    + (claimed > lo) * tier
                    + (claimed + matched[ci][col] > lo)
                )
            gains.append(out)
        return gains

    def _keep_and_place(
        self, scope: range, quotas: list[int], prev: list[list[int]], claims: list[list[int]]
    ) -> None:
        """One subtopology's tasks (``scope``), with its column of the quota matrix: each client
        keeps up to its quota of what it ran, then of its claims; the rest are placed."""
        room = self._keep_previous(quotas, prev, claims)
        # Quotas of a column are fixed by the matrix: a chain may not move a ceiling.
        self._place_orphans(scope, room, list(quotas), [(q, q) for q in quotas])

    def _match_racks(self, cold: list[int]) -> None:
        """Swap clients between cold tasks so more of them run in the rack of their partitions'
        leaders. Swaps keep every client's count; a swap happens only between a task off its
        rack and one whose client is in that rack while the task itself is not."""
        owner, clients, tasks = self.owner, self.clients, self.tasks
        wants = [self.task_racks.get(tasks[i]) for i in cold]
        # Per rack R: cold tasks of rack R running elsewhere, and cold tasks of another rack
        # running on a client in R (their slot is what a task of R wants).
        off: dict[str, list[int]] = {}
        slots: dict[str, list[int]] = {}
        for k, (i, want) in enumerate(zip(cold, wants, strict=True)):
            here = clients[owner[i]].rack
            if want is not None and want != here:
                off.setdefault(want, []).append(k)
            if here is not None and want != here:
                slots.setdefault(here, []).append(k)
        taken: set[int] = set()
        for rack in sorted(off):
            free = [k for k in slots.get(rack, ()) if k not in taken]
            for a in off[rack]:
                if a in taken:
                    continue
                while free and free[0] in taken:
                    free.pop(0)
                if not free:
                    break
                b = free.pop(0)
                i, j = cold[a], cold[b]
                owner[i], owner[j] = owner[j], owner[i]
                taken.update((a, b))

    def _keep(self, mine: list[int], ci: int, quota: int, spare: list[int]) -> int:
        """Give client ``ci`` up to ``quota`` of the tasks ``mine`` (how many it got).

        When they do not all fit it keeps a subtopology-balanced subset and releases first the
        tasks another client with ``spare`` room holds warm state of, most caught-up holder
        first: those can be taken over warm.
        """
        owner, warm, tasks = self.owner, self.warm, self.tasks
        if len(mine) > quota:

            def best_elsewhere(i: int) -> tuple[int, ...] | None:
                ranks = [self._rank(i, h) for h in warm.get(i, ()) if h != ci and spare[h] > 0]
                return min(ranks) if ranks else None

            best = {i: best_elsewhere(i) for i in mine}
            ordered = [i for i in mine if best[i] is None] + sorted(
                (i for i in mine if best[i] is not None), key=lambda i: best[i] or (), reverse=True
            )
            mine = level_order(ordered, group=lambda i: tasks[i].subtopology)[:quota]
        for i in mine:
            owner[i] = ci
        return len(mine)

    def _returning(self, i: int, ci: int, room: list[int], promised: list[int]) -> int:
        """A client other than ``ci`` that ran task ``i`` before, is caught up on it and has
        room not yet promised (-1: none)."""
        t = self.tasks[i]
        for h in self.warm.get(i, ()):
            c = self.clients[h]
            if (
                h != ci
                and t in c.prev_active
                and c.lags.get(t, _UNKNOWN_LAG) <= self.acceptable_lag
                and room[h] - promised[h] > 0
            ):
                return h
        return -1

    def _holders(self, i: int) -> list[int]:
        """Clients holding state of task ``i``, best first."""
        return self.warm.get(i, [])

    def _standby_holders(self, i: int) -> list[int]:
        """Clients holding a standby of task ``i``, best first (the first tier of ``_rank``)."""
        return [h for h in self.warm.get(i, ()) if self._rank(i, h)[0] == 0]

    def _no_worse(self, u: int, a: int, x: int) -> bool:
        """Whether task ``u``, taken over by ``a``, may go to holder ``x`` instead: ``x`` ranks
        at least as high (``_rank`` without the client index: standby holder, caught up, ran
        it before, lag), so a chain never takes a task from a restarted process that ran it or
        from a fresher copy."""
        return self._rank(u, x)[:4] <= self._rank(u, a)[:4]

    # -- standbys ------------------------------------------------------------------------------

    def _standby_targets(self) -> tuple[list[int], list[int]]:
        """Standbys per client (total load near its share, within what one copy allows), and
        how many previous standbys each could keep."""
        stateful_active = [0] * len(self.clients)
        for i, ci in enumerate(self.owner):
            if self.stateful[i]:
                stateful_active[ci] += 1
        valid = [self._valid_prev_standbys(ci) for ci in range(len(self.clients))]
        targets = standby_targets(
            [c.capacity for c in self.clients],
            [len(a) for a in self.active],
            stateful_active,
            valid,
            sum(self.stateful),
            self.replicas,
        )
        return targets, valid

    def assign_standbys(self) -> None:
        if not self.replicas:
            return
        r, owner = self.replicas, self.owner
        room, valid = self._standby_targets()
        # copies[i * r : (i + 1) * r] are the clients holding a standby of task i (-1: none yet).
        # One flat list: a set per task cost a third of the run in allocation and GC at 100k.
        copies = [-1] * (len(self.tasks) * r)
        need: list[int] = []
        # Local state is kept first for the tasks active on clients that will take new
        # standbys (those cannot go to their own active client), then in task order: a client
        # over its target then drops copies that can go where the room is.
        receiver = [t > v for t, v in zip(room, valid, strict=True)]
        first = [i for i, ci in enumerate(owner) if receiver[ci]]
        if first and len(first) < len(owner):
            rest = [i for i, ci in enumerate(owner) if not receiver[ci]]
            order: Iterable[int] = first + rest
        else:
            order = range(len(owner))
        for i in order:
            if not self.stateful[i]:
                continue
            k = i * r
            for ci in self.warm.get(i, ()):
                if k == (i + 1) * r:
                    break
                if room[ci] > 0 and ci != owner[i] and ci not in copies[i * r : k]:
                    copies[k] = ci
                    k += 1
                    room[ci] -= 1
            need.extend(range(k, (i + 1) * r))

        # The rest through the queue: rack and tag conflicts, spread, most room left.
        queue = self._queue(room)
        # Grouped by active client (spread), those of clients with standby room first: they
        # cannot use that room, so they go while other clients still have theirs.
        need.sort(key=lambda slot: (room[owner[slot // r]] == 0, owner[slot // r]))
        placed: set[int] = set()  # slots filled in this run (no warm state behind them)
        swaps: _SwapIndex | None = None  # built at the first swap
        for slot in need:
            i = slot // r
            ci = queue.pick(owner[i], copies[i * r : slot])
            if ci >= 0:
                copies[slot] = ci
                if swaps is not None:
                    swaps.add(slot, ci)
            else:
                if swaps is None:
                    swaps = _SwapIndex(copies, placed, len(self.clients))
                self._place_by_swap(slot, copies, room, placed, swaps)
            placed.add(slot)
        if queue.aware:
            self._exchange_for_racks(need, copies, queue)
        self._return_dropped_standbys(copies, placed)
        if self.by_subtopology:
            _StandbyEvener(self, copies, placed, queue).run()
        for slot, ci in enumerate(copies):
            if ci >= 0:
                self.standby[ci].append(slot // r)

    def _return_dropped_standbys(self, copies: list[int], placed: set[int]) -> None:
        """Give a client a previous standby it lost to a client with no state of that task,
        where balance allows: the holder stays at or above its load floor and the first client
        below its ceiling, or (when floors cannot all be met) the holder ends no further below
        its floor than the first was. Targets are set per client from counts, so a tie or the
        one-copy rule can give the ceiling to the wrong client; this repairs that after
        placement, and no standby state is thrown away for it. Passes in client order until
        one moves nothing (each move keeps one more copy of state, so that ends). Only copies
        placed in this run (``placed``) can lack state, so only their tasks are looked at."""
        r, clients, tasks, owner = self.replicas, self.clients, self.tasks, self.owner
        # Per client, the tasks it held a standby of, lost, and now see on a client without
        # state of them (in task order).
        warm = self.warm
        if not warm:
            return  # no client has state of any task (a fresh group)
        lost: dict[int, list[int]] = {}
        for i in sorted({slot // r for slot in placed} & warm.keys()):
            t = tasks[i]
            held = copies[i * r : (i + 1) * r]
            if all(d < 0 or clients[d].has_state(t) for d in held):
                continue
            for ci in warm[i]:
                if ci != owner[i] and ci not in held and t in clients[ci].prev_standby:
                    lost.setdefault(ci, []).append(i)
        if not lost:
            return
        caps = [c.capacity for c in clients]
        load = [len(a) for a in self.active]
        for ci in copies:
            if ci >= 0:
                load[ci] += 1
        bounds = share_bounds(sum(load), caps)
        again = True  # a holder that gave a copy back may now take one back itself
        while again:
            again = False
            for ci in sorted(lost):
                floor, ceiling = bounds[ci]
                if load[ci] >= ceiling:
                    continue
                for i in lost[ci]:
                    t = tasks[i]
                    held = copies[i * r : (i + 1) * r]
                    if ci in held:
                        continue  # taken back in an earlier pass
                    for d, k in sorted(zip(held, range(r), strict=True)):  # client order
                        if d < 0 or clients[d].has_state(t):
                            continue
                        if load[d] > bounds[d][0] or (
                            load[ci] < floor and bounds[d][0] - (load[d] - 1) <= floor - load[ci]
                        ):
                            copies[i * r + k] = ci
                            load[ci] += 1
                            load[d] -= 1
                            again = True
                            break
                    if load[ci] >= ceiling:
                        break

    def _place_by_swap(
        self, slot: int, copies: list[int], room: list[int], placed: set[int], swaps: _SwapIndex
    ) -> None:
        """Fill ``slot`` (a standby of task ``i``) when every client with room holds ``i``.

        Finds a client ``d`` without a copy of ``i`` and a standby ``u`` on ``d`` that a client
        ``c`` with room can take: ``u`` moves ``d -> c`` and ``i`` goes to ``d``, keeping every
        load on target. A copy placed in this run (in ``placed``) moves before one kept from
        before: moving that throws its warm state away. Without such a pair (forced by one copy
        per client), ``i`` goes to the client without a copy that is least loaded per thread.
        The first such ``d``, then ``u``, then ``c``, in order; ``swaps`` finds them without
        rescanning what failed before.
        """
        r, owner = self.replicas, self.owner
        i = slot // r

        def holds(task: int, ci: int) -> bool:
            return owner[task] == ci or ci in copies[task * r : (task + 1) * r]

        rooms = [c for c in range(len(room)) if room[c] > 0]
        for fresh in (True, False):
            for d in range(len(self.clients)):
                if holds(i, d):
                    continue
                heap = swaps.heaps[d][fresh]
                while heap:
                    # Taken off for good whatever happens: moved away (or placed again: then
                    # on the other heap), handed over now, or held by every client with room
                    # (rooms only fill and copies only arrive there, ``d`` has none: that
                    # stays true).
                    u_slot = heapq.heappop(heap)
                    if copies[u_slot] != d or (u_slot in placed) != fresh:
                        continue
                    u = u_slot // r
                    c = next((c for c in rooms if not holds(u, c)), -1)
                    if c >= 0:
                        copies[u_slot], copies[slot] = c, d
                        room[c] -= 1
                        placed.add(u_slot)
                        swaps.add(u_slot, c, d)
                        swaps.add(slot, d)
                        return
        active, count, clients = self.active, swaps.count, self.clients
        free = [d for d in range(len(clients)) if not holds(i, d)]
        copies[slot] = min(
            free, key=lambda d: ((len(active[d]) + count[d] + 1) / clients[d].capacity, d)
        )
        swaps.add(slot, copies[slot])

    def _exchange_for_racks(
        self, placed: list[int], copies: list[int], queue: StandbyQueue
    ) -> None:
        """Undo what greedy placement could not foresee: two standbys placed in this run swap
        clients when that lowers their rack and tag conflicts (loads stay as they are). Copies
        kept from before are not moved: warm state outweighs placement.

        A copy is looked at only when some kind of client (equal rack and tags) would lower
        its own conflicts, and then only partners on such clients: so copies whose conflicts
        no client can avoid (more copies than racks) cost one check. Bounded work: at most
        ``_EXCHANGE_SCAN`` partners per copy and ``_EXCHANGE_BUDGET`` steps in all (large
        inputs may keep conflicts a longer search would remove).
        """
        r, owner = self.replicas, self.owner

        def group(slot: int) -> list[int]:
            i = slot // r
            return [
                owner[i],
                *(x for k, x in enumerate(copies[i * r : (i + 1) * r]) if i * r + k != slot),
            ]

        def holds(slot: int, ci: int) -> bool:
            i = slot // r
            return owner[i] == ci or ci in copies[i * r : (i + 1) * r]

        kind, examples = queue.kinds()
        few = len(examples) <= RACK_SCAN  # the queue remembers costs by kind
        budget = _EXCHANGE_BUDGET
        for a in placed:
            d = copies[a]
            if d < 0:
                continue
            mine = group(a)
            costs = queue.costs(mine) if few else None
            here = costs[kind[d]] if costs is not None else queue.conflicts(d, mine)
            if here == 0:
                continue
            if costs is None:
                costs = queue.costs(mine)
            budget -= len(costs)
            if min(costs) >= here:
                continue  # no client would do better for this copy
            for b in placed[:_EXCHANGE_SCAN]:
                budget -= 1
                if budget < 0:
                    return
                e = copies[b]
                if e < 0 or e == d or costs[kind[e]] >= here or b // r == a // r:
                    continue
                if holds(a, e) or holds(b, d):
                    continue
                budget -= _EXCHANGE_COST
                theirs = group(b)
                if few:
                    by_kind = queue.costs(theirs)
                    delta = by_kind[kind[d]] - by_kind[kind[e]]
                else:
                    delta = queue.conflicts(d, theirs) - queue.conflicts(e, theirs)
                if costs[kind[e]] + delta < here:
                    copies[a], copies[b] = e, d
                    break

    def _queue(self, room: list[int]) -> StandbyQueue:
        clients = self.clients
        aware = any(c.rack is not None or c.tags for c in clients)
        backups = [0] * len(clients)
        for i, ci in enumerate(self.owner):
            if self.stateful[i]:
                backups[ci] += self.replicas
        return StandbyQueue(
            room,
            [c.rack for c in clients] if aware else None,
            [c.tags for c in clients] if aware else None,
            self.rack_aware_tags,
            backups,
        )

    def _valid_prev_standbys(self, ci: int) -> int:
        """Previous standbys of client ``ci`` it could keep: stateful, not active there."""
        index, owner, stateful = self.index, self.owner, self.stateful
        n = 0
        for t in self.clients[ci].prev_standby:
            i = index.get(t)
            if i is not None and stateful[i] and owner[i] != ci:
                n += 1
        return n

    def _history_if_stable(self) -> dict[str, ClientAssignment] | None:
        """The previous assignment itself when the algorithm would return it unchanged.

        That is when it is complete and clean (every task one claimant, no stale or duplicate
        entries, every stateful task exactly its standbys, none elsewhere) and balanced
        (actives and loads within floor and ceiling of the shares): then every client keeps
        all it had. A cheap check, so a rebalance that changes nothing costs O(tasks) and
        reuses the reported sets as they are.
        """
        clients, n, r = self.clients, len(self.tasks), self.replicas
        if any(ci < 0 for ci in self.prev_owner) or self.lost:
            return None
        caps = [c.capacity for c in clients]
        active_bounds = share_bounds(n, caps)
        n_stateful = sum(self.stateful)
        load_bounds = share_bounds(n + n_stateful * r, caps)
        copies = [0] * n
        index, stateful, owner = self.index, self.stateful, self.prev_owner
        for ci, c in enumerate(clients):
            if c.lags or len(c.prev_active) > active_bounds[ci][1]:
                return None
            if not active_bounds[ci][0] <= len(c.prev_active):
                return None
            for t in c.prev_standby:
                i = index.get(t)
                if i is None or not stateful[i] or owner[i] == ci or not r:
                    return None
                copies[i] += 1
            lo, hi = load_bounds[ci]
            if not lo <= len(c.prev_active) + len(c.prev_standby) <= hi:
                return None
        if sum(len(c.prev_active) for c in clients) != n:
            return None  # stale claims
        if self.by_subtopology and not self._balanced_per_subtopology(caps):
            return None
        if any(copies[i] != (r if stateful[i] else 0) for i in range(n)):
            return None
        return {c.process_id: ClientAssignment(c.prev_active, c.prev_standby) for c in clients}

    def _balanced_per_subtopology(self, caps: list[int]) -> bool:
        """Whether every client's previous actives of each subtopology are within floor and
        ceiling of its share (a balanced history is then kept as it is)."""
        cells, _ = quota_bounds(self.column_sizes, caps)
        counts = [[0] * len(self.column_sizes) for _ in caps]
        column = self.column
        for i, ci in enumerate(self.prev_owner):
            counts[ci][column[i]] += 1
        return all(
            lo <= count <= hi
            for row, bounds in zip(counts, cells, strict=True)
            for count, (lo, hi) in zip(row, bounds, strict=True)
        )

    def result(self, fast_path: bool = True) -> dict[str, ClientAssignment]:
        if fast_path:
            stable = self._history_if_stable()
            if stable is not None:
                return stable
        self.warm = self._warm_holders(self.lost)
        self.assign_actives()
        self.assign_standbys()
        tasks = self.tasks
        return {
            c.process_id: ClientAssignment(
                active=frozenset([tasks[i] for i in self.active[ci]]),
                standby=frozenset([tasks[i] for i in self.standby[ci]]),
            )
            for ci, c in enumerate(self.clients)
        }


class _StandbyEvener:
    """Exchanges of standbys placed in this run between two clients that bring every client's
    standbys of each subtopology nearer the floor or ceiling of its capacity share of that
    subtopology's copies (as even as the one-copy rule and the load rule allow).

    Client ``a`` hands a copy of subtopology ``s`` to ``b`` and ``b`` one of ``s2`` to ``a``:
    both keep their standby counts (the load rule), no cell leaves its floor and ceiling and at
    least one outside them comes nearer, so the total distance from the bounds falls with each
    exchange and passes end. Only copies on a client without state of their task move (kept
    and handed-back copies stay), and not those of a task some client held a standby of and
    lost (``_return_dropped_standbys`` has weighed where those go); never onto a client
    holding the task, and never to more rack or tag conflicts. A copy moves to a client only
    if it then backs up no more of the copy's active client's tasks than one above an even
    spread (``ceil(actives * standbys / (clients - 1)) + 1``) or than the client it leaves
    did, so one client's tasks stay spread over many others (rule 7). ``_EVEN_BUDGET`` tries
    at most (large inputs may stop short).
    """

    def __init__(self, run: _Run, copies: list[int], placed: set[int], queue: StandbyQueue) -> None:
        self.state, self.copies, self.queue = run, copies, queue
        r, column, clients, tasks = run.replicas, run.column, run.clients, run.tasks
        n_col = len(run.column_sizes)
        self.count = [[0] * n_col for _ in clients]
        per_column = [0] * n_col
        for slot, ci in enumerate(copies):
            if ci >= 0:
                per_column[column[slot // r]] += 1
                self.count[ci][column[slot // r]] += 1
        caps = [c.capacity for c in clients]
        columns = [share_bounds(k, caps) for k in per_column]
        #: Floor and ceiling of each client's standbys of each subtopology.
        self.bounds = [[column_bounds[ci] for column_bounds in columns] for ci in range(len(caps))]
        #: Copies that may move, per (client, column), in slot order.
        self.movable: dict[tuple[int, int], list[int]] = {}
        warm = run.warm  # every client with state of a task, other than its owner
        for slot in sorted(placed):
            ci, i = copies[slot], slot // r
            if ci < 0:
                continue
            found = warm.get(i)
            if found:
                if ci in found:
                    continue  # warm state here
                held = copies[i * r : (i + 1) * r]
                lost = (
                    h
                    for h in found
                    if h not in held and h != run.owner[i] and tasks[i] in clients[h].prev_standby
                )
                if any(lost):
                    continue  # a previous standby holder lost this task
            self.movable.setdefault((ci, column[i]), []).append(slot)
        #: Copies of each client's actives that each client holds: ``(active, holder)``.
        self.backed: collections.Counter[tuple[int, int]] = collections.Counter()
        for slot, ci in enumerate(copies):
            if ci >= 0:
                self.backed[run.owner[slot // r], ci] += 1
        #: Per client, copies of its actives any one other client may hold: one more than an
        #: even spread (the bound rule 7 promises).
        others = max(1, len(clients) - 1)
        self.spread = [1 - (-len(mine) * r // others) for mine in run.active]
        self.budget = _EVEN_BUDGET

    def run(self) -> None:
        count, bounds = self.count, self.bounds
        n_cli, n_col = len(count), len(count[0]) if count else 0
        moved = True
        while moved and self.budget > 0:
            moved = False
            for col in range(n_col):
                for a in range(n_cli):
                    lo, hi = bounds[a][col]
                    if count[a][col] > hi:
                        moved |= self._exchange_from(a, col)
                    elif count[a][col] < lo:
                        moved |= self._exchange_to(a, col)
                    if self.budget <= 0:
                        return

    def _exchange_from(self, a: int, col: int) -> bool:
        """``a`` is above its ceiling of ``col``: hand one to a client with room for it."""
        return self._exchange(a, col, giving=True)

    def _exchange_to(self, b: int, col: int) -> bool:
        """``b`` is below its floor of ``col``: take one from a client above its floor."""
        return self._exchange(b, col, giving=False)

    def _exchange(self, client: int, col: int, giving: bool) -> bool:
        """Try every other client as the partner of ``client`` for one exchange of ``col``."""
        for other in range(len(self.count)):
            if other == client:
                continue
            giver, taker = (client, other) if giving else (other, client)
            for col2 in range(len(self.count[0])):
                if col2 != col and self._try(giver, taker, col, col2):
                    return True
                if self.budget <= 0:
                    return False
        return False

    def _try(self, a: int, b: int, col: int, col2: int) -> bool:
        """Exchange a copy of ``col`` on ``a`` with one of ``col2`` on ``b`` when counts allow
        (each cell stays within or comes nearer its bounds) and two such copies exist."""
        self.budget -= 1
        count, bounds = self.count, self.bounds
        if not (
            count[a][col] > bounds[a][col][0]
            and count[b][col] < bounds[b][col][1]
            and count[b][col2] > bounds[b][col2][0]
            and count[a][col2] < bounds[a][col2][1]
        ):
            return False
        give = self._pick(a, col, b)
        if give < 0:
            return False
        back = self._pick(b, col2, a)
        if back < 0:
            return False
        self._move(give, a, b, col)
        self._move(back, b, a, col2)
        return True

    def _pick(self, src: int, col: int, dst: int) -> int:
        """The first movable copy of ``col`` on ``src`` that ``dst`` may hold (-1: none)."""
        state, copies, queue = self.state, self.copies, self.queue
        r, owner = state.replicas, state.owner
        for slot in self.movable.get((src, col), ()):
            self.budget -= 1
            i = slot // r
            held = copies[i * r : (i + 1) * r]
            if owner[i] == dst or dst in held:
                continue
            if self.backed[owner[i], dst] >= max(self.spread[owner[i]], self.backed[owner[i], src]):
                continue  # would pile this client's backups up on ``dst``
            if queue.aware:
                others = [owner[i], *(x for k, x in enumerate(held) if i * r + k != slot)]
                if queue.conflicts(dst, others) > queue.conflicts(src, others):
                    continue
            return slot
        return -1

    def _move(self, slot: int, src: int, dst: int, col: int) -> None:
        active = self.state.owner[slot // self.state.replicas]
        self.backed[active, src] -= 1
        self.backed[active, dst] += 1
        self.copies[slot] = dst
        self.count[src][col] -= 1
        self.count[dst][col] += 1
        self.movable[src, col].remove(slot)
        self.movable.setdefault((dst, col), []).append(slot)


class _SwapIndex:
    """Standby slots by client, kept ones and ones placed in this run apart, as min-heaps of
    slot numbers (task order): where ``_Run._place_by_swap`` looks for a copy to hand over.
    Entries go stale when a copy moves; readers drop those."""

    def __init__(self, copies: list[int], placed: set[int], clients: int) -> None:
        #: ``heaps[d][fresh]``: slots on client ``d``, placed in this run or not.
        self.heaps: list[tuple[list[int], list[int]]] = [([], []) for _ in range(clients)]
        #: Standby copies on each client, kept current by ``add``: the fallback's loads.
        self.count = [0] * clients
        for slot, ci in enumerate(copies):
            if ci >= 0:
                self.heaps[ci][slot in placed].append(slot)
                self.count[ci] += 1
        for kept, fresh in self.heaps:
            heapq.heapify(kept)
            heapq.heapify(fresh)

    def add(self, slot: int, ci: int, was: int = -1) -> None:
        """Copy ``slot``, placed in this run, is now on client ``ci`` (moved from ``was``)."""
        heapq.heappush(self.heaps[ci][True], slot)
        self.count[ci] += 1
        if was >= 0:
            self.count[was] -= 1


def _take_warm(
    pairs: list[tuple[int, int, int, int, int, int]],
    owner: list[int],
    room: list[int],
    took: dict[int, list[int]],
) -> None:
    """Greedy warm pass: each (rank..., task, holder) pair in order gives the task to the holder
    while the task has no owner and the holder has room; ``took`` records the takeovers."""
    for *_, i, h in pairs:
        if owner[i] < 0 and room[h] > 0:
            owner[i] = h
            room[h] -= 1
            took.setdefault(h, []).append(i)
