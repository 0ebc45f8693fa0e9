"""The sticky task assignor's incremental path: the same rules, worked on task sets.

Most rebalances start from a clean history — the assignor's own previous result with some
clients gone or new — and move a few tasks. The general path (``sticky._Run``) still touches
every task several times. This path works per client on the reported frozensets, so a client
that keeps all it had costs a few set operations, and per-task Python work is spent only on the
tasks that move: orphans of departed clients, tasks released by clients over quota, and standby
copies that went missing.

It applies the general path's rules in the same order with the same ties (quotas, which tasks a
client over quota releases, warm takeovers and their augmenting paths, dealing cold tasks,
standby targets), and declines — returning ``None`` so the general path runs — whenever its
input is not clean (lags, racks or tags, duplicate or stale claims, a task with more standbys
than wanted) or its result would leave a client below its load floor or need a standby swap.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from itertools import chain, compress, repeat
from operator import add, attrgetter, ge, gt, is_not, itemgetter, lt, mul, neg, not_, sub

import attrs

from ._balance import _FLOOR, apportion, deal, level_order, share_bounds, standby_targets
from ._ids import TaskId, as_task
from ._standby_queue import StandbyQueue
from ._takeover import augment_takeovers
from .assignment import ClientAssignment, ClientState

#: Above this many tasks, an input where most tasks have no owner (a fresh group, a restart)
#: goes to the general path: per-client set work only pays when few tasks move (4096 fresh
#: tasks: 15 ms general, 50 ms here).
_BULK = 512


_CAPACITY = attrgetter("capacity")
_PREV_ACTIVE = attrgetter("prev_active")
_PREV_STANDBY = attrgetter("prev_standby")
_PROCESS_ID = attrgetter("process_id")
_LAGS = attrgetter("lags")
_TAGS = attrgetter("tags")
_RACK = attrgetter("rack")
_DISJOINT = frozenset.isdisjoint
#: ``_copy_counts`` counts by set levels up to this many clients, or from this many copies per
#: client on average; else with one C-level count.
_FEW_CLIENTS = 64
_LEVELS_FROM = 8
#: Most standby swaps this path makes before it declines: each rescans every client's sets
#: (8,000 tasks, 9 clients, 4 standbys: 2,737 swaps took 3 s here, 0.2 s on the general path).
_SWAPS = 32
#: A task's subtopology (``TaskId`` is a tuple: a C-level getter, not a Python call).
_SUBTOPOLOGY = itemgetter(0)


def _first(tasks: frozenset[TaskId], k: int) -> frozenset[TaskId]:
    """The ``k`` first of ``tasks`` in task order (usually all but one or two)."""
    if len(tasks) - k <= 2:
        rest = set(tasks)
        for _ in range(len(tasks) - k):
            rest.remove(max(rest))
        return frozenset(rest)
    return frozenset(sorted(tasks)[:k])


def assign_sets(
    tasks: Iterable[TaskId],
    clients: Sequence[ClientState],
    stateful: Iterable[TaskId] | None,
    num_standby_replicas: int,
) -> dict[str, ClientAssignment] | None:
    """The assignment of ``clients`` (sorted by process id), or ``None`` to decline (the
    general path then resolves, or rejects, what this path does not take)."""
    all_tasks = tasks if type(tasks) is frozenset else frozenset(tasks)
    if not clients or len(set(map(_PROCESS_ID, clients))) != len(clients):
        return None  # no clients, or duplicate process ids: the general path raises
    if stateful is None:
        stateful_set = all_tasks
    else:
        wanted = frozenset(stateful)
        stateful_set = frozenset(filter(wanted.__contains__, all_tasks))
    m = len(clients)
    r = min(num_standby_replicas, m - 1)
    # Clean input only (C-level passes over the clients): no lags, racks or tags; actives of
    # known tasks; no task both active and standby on one client; standbys of stateful tasks.
    if any(map(_LAGS, clients)) or any(map(_TAGS, clients)):
        return None
    if any(map(is_not, map(_RACK, clients), repeat(None))):
        return None
    ran = list(map(_PREV_ACTIVE, clients))
    standbys = list(map(_PREV_STANDBY, clients))
    if not all(map(all_tasks.issuperset, ran)) or not all(map(_DISJOINT, ran, standbys)):
        return None
    if r and not all(map(stateful_set.issuperset, standbys)):
        return None
    owned = sum(map(len, ran))
    owners = frozenset().union(*ran)
    if len(owners) != owned:
        return None  # duplicate claims: the general path resolves them
    if len(all_tasks) > _BULK and 2 * owned < len(all_tasks):
        return None  # most tasks move: the general path's flat passes are faster

    caps = list(map(_CAPACITY, clients))
    active, gave_up = _actives(all_tasks, caps, ran, standbys, owners)
    if r == 0:
        return dict(zip(map(_PROCESS_ID, clients), map(ClientAssignment, active), strict=True))
    standby = _standbys(all_tasks, stateful_set, caps, standbys, active, gave_up, r)
    if standby is None:
        return None
    return dict(zip(map(_PROCESS_ID, clients), map(ClientAssignment, active, standby), strict=True))


def _actives(
    all_tasks: frozenset[TaskId],
    caps: list[int],
    prev_active: list[frozenset[TaskId]],
    standbys: list[frozenset[TaskId]],
    owners: frozenset[TaskId],
) -> tuple[list[frozenset[TaskId]], dict[TaskId, int]]:
    """Active tasks per client (given each client's capacity, previous actives and previous
    standbys), and the previous owner of each task that moved between two present clients (it
    still holds the state: a good standby)."""
    m = len(caps)
    kept = list(prev_active)  # trimmed in place below, where over quota
    ran = list(map(len, kept))
    bounds = share_bounds(len(all_tasks), caps)
    orphans = all_tasks - owners

    # Ceilings: the move bound first, then the standby holders orphans would be matched to
    # (each orphan counted for the holder with the fewest so far that still has room for it
    # below its ceiling, the first in client order) that lack the room for them at their floor.
    matched = [0] * m
    if orphans:
        holders = _holders(standbys, orphans, range(m))
        by_choice = []
        for t, hs in holders.items():
            by_choice.append((len(hs), t))
        by_choice.sort()
        for _, t in by_choice:
            pick = -1
            for h in holders[t]:
                fits = matched[h] < bounds[h][1] - ran[h]
                if fits and (pick < 0 or matched[h] < matched[pick]):
                    pick = h
            if pick >= 0:
                matched[pick] += 1
    floors = list(map(_FLOOR, bounds))
    if sum(floors) == len(all_tasks):
        quotas = floors  # every share is whole: no ceilings to hand out
    else:
        below = list(map(sub, floors, ran))
        keys = list(
            zip(
                map(min, below, repeat(0)),
                map(ge, below, matched),
                below,
                map(neg, matched),
                range(m),
                strict=True,
            )
        )
        quotas = apportion(len(all_tasks), caps, priority=keys.__getitem__)
    if max(ran) <= min(quotas):
        room = list(map(sub, quotas, ran))  # nobody over quota
    else:
        room = list(map(sub, quotas, map(min, quotas, ran)))
    over = list(compress(range(m), map(gt, ran, quotas)))
    released: list[TaskId] = []
    gave_up: dict[TaskId, int] = {}
    if over:
        # Release first the tasks a standby holder with room could take over warm, the last
        # such holder in client order first (the general path's rank order, reversed).
        candidates = frozenset().union(*[kept[ci] for ci in over])
        best: dict[TaskId, int] = {}
        for h in range(m):
            if room[h] > 0:
                for t in standbys[h] & candidates:
                    best.setdefault(t, h)
        for ci in over:
            ordered = sorted(kept[ci])
            if not best.keys().isdisjoint(kept[ci]):
                cold_first: list[TaskId] = []
                warm_first: list[TaskId] = []
                for t in ordered:
                    (warm_first if t in best else cold_first).append(t)
                warm_first.sort(key=best.__getitem__, reverse=True)
                ordered = cold_first + warm_first
            ordered = level_order(ordered, group=_SUBTOPOLOGY)
            q = quotas[ci]
            kept[ci] = frozenset(ordered[:q])
            for t in ordered[q:]:
                released.append(t)
                gave_up[t] = ci

    pool = sorted(map(as_task, orphans.union(released)))
    took: dict[int, list[TaskId]] = {}
    owner: dict[TaskId, int] = {}
    with_room = list(compress(range(m), room))
    for t, hs in sorted(_holders(standbys, frozenset(pool), with_room).items()):
        for h in hs:
            if room[h] > 0:
                owner[t] = h
                room[h] -= 1
                took.setdefault(h, []).append(t)
                break
    if len(owner) < len(pool):
        cold: list[TaskId] = []
        for t in pool:
            if t not in owner:
                cold.append(t)
        warm = _holders(standbys, frozenset(cold), range(m))
        if warm:
            taken = frozenset(chain.from_iterable(took.values()))
            warm.update(_holders(standbys, taken, range(m)))
            cold = augment_takeovers(
                cold, lambda t: warm.get(t, ()), owner, took, room, quotas, bounds
            )
        for t, ci in zip(cold, deal(room), strict=True):
            owner[t] = ci
    added: dict[int, list[TaskId]] = {}
    for t, ci in owner.items():
        added.setdefault(ci, []).append(t)
    for ci, ts in added.items():
        kept[ci] = kept[ci].union(ts)
    return kept, gave_up


def _holders(
    sets: Sequence[frozenset[TaskId]], tasks: frozenset[TaskId], among: Iterable[int]
) -> dict[TaskId, list[int]]:
    """Clients (of ``among``, in client order) whose set holds each of ``tasks``."""
    out: dict[TaskId, list[int]] = {}
    if tasks:
        for ci in among:
            for t in sets[ci] & tasks:
                out.setdefault(t, []).append(ci)
    return out


def _standbys(
    all_tasks: frozenset[TaskId],
    stateful_set: frozenset[TaskId],
    caps: list[int],
    prev_standby: list[frozenset[TaskId]],
    active: list[frozenset[TaskId]],
    gave_up: dict[TaskId, int],
    r: int,
) -> list[frozenset[TaskId]] | None:
    """Standby tasks per client (given each client's capacity and previous standbys), or
    ``None`` where the general path's swap would be needed or a client would end below its
    load floor."""
    m = len(caps)
    n_active = list(map(len, active))
    if stateful_set is all_tasks:
        n_stateful_active = n_active
    else:
        n_stateful_active = list(map(len, map(stateful_set.intersection, active)))
    # Previous standbys minus new actives (new sets only where a client took over a standby).
    valid = list(prev_standby)
    for ci in compress(range(m), map(not_, map(_DISJOINT, prev_standby, active))):
        valid[ci] = prev_standby[ci] - active[ci]
    n_valid = list(map(len, valid))
    targets = standby_targets(caps, n_active, n_stateful_active, n_valid, len(stateful_set), r)
    # Placement fills every client exactly to its target, so loads are known now: decline
    # before placing when one would end below its floor (the general path repairs that).
    load_floors = share_bounds(len(all_tasks) + len(stateful_set) * r, caps)
    if any(map(lt, map(add, n_active, targets), map(_FLOOR, load_floors))):
        return None
    # A client over its target keeps first the standbys of tasks active on the clients that
    # will take new ones (those cannot go to their own active client), then in task order.
    receivers_run: set[TaskId] = set()
    for ci in compress(range(m), map(gt, targets, n_valid)):
        receivers_run |= active[ci]
    standby = valid  # trimmed in place below, where over target
    room = list(map(sub, targets, n_valid))
    for ci in compress(range(m), map(lt, room, repeat(0))):
        v, target = valid[ci], targets[ci]
        first = v & receivers_run
        if len(first) >= target:
            v = _first(first, target)
        else:
            v = first | _first(v - first, target - len(first))
        standby[ci] = v
        room[ci] = 0
    kept_copies = _copy_counts(standby, r)
    if kept_copies is None:
        return None  # a task with more standbys than wanted
    short_set = stateful_set - kept_copies.full
    if short_set:
        owner: dict[TaskId, int] = {}
        for ci in range(m):
            for t in active[ci] & short_set:
                owner[t] = ci
        held = _holders(standby, short_set, range(m))
        added: dict[int, list[TaskId]] = {}
        need: dict[TaskId, int] = {}
        returned: dict[int, set[TaskId]] = {}  # copies given back to a previous owner
        for t in short_set:
            need[t] = r - kept_copies.of(t)
        # A previous owner that gave its task up holds its state: it takes a copy first, before
        # the queue hands its room to other tasks (the general path's keep pass, same order).
        shut_out = False  # a previous owner left without room for its task's copy
        if gave_up:
            returning: list[tuple[bool, TaskId]] = []
            for t in short_set.intersection(gave_up):
                returning.append((t not in receivers_run, as_task(t)))
            returning.sort()
            for _, t in returning:
                w = gave_up[t]
                has = held.setdefault(t, [])
                if room[w] > 0 and w not in has:
                    room[w] -= 1
                    has.append(w)
                    added.setdefault(w, []).append(t)
                    returned.setdefault(w, set()).add(t)
                    need[t] -= 1
                elif w not in has:
                    shut_out = True
        # The rest through the standby queue, most room left first; grouped by active client
        # (spread), the tasks of clients with standby room first: they cannot use that room,
        # so they go while other clients still have theirs.
        queue = StandbyQueue(room, backups=list(map(mul, n_stateful_active, repeat(r))))
        order: list[tuple[bool, int, TaskId]] = []
        for t in short_set:
            ci = owner[t]
            order.append((room[ci] == 0, ci, as_task(t)))
        order.sort()
        swaps = 0
        for _, ci_owner, t in order:
            has = held.setdefault(t, [])
            for _ in range(need[t]):
                ci = queue.pick(ci_owner, has)
                if ci < 0:
                    swaps += 1
                    if swaps > _SWAPS:
                        return None  # many swaps: the general path indexes them
                    ci = _swap(t, active, standby, held, added, returned, room, shut_out)
                    if ci < 0:
                        return None  # forced beyond a ceiling, or a kept copy would move
                has.append(ci)
                added.setdefault(ci, []).append(t)
        for ci, ts in added.items():
            standby[ci] = standby[ci].union(ts)
        _return_dropped(prev_standby, active, standby, load_floors, added, gave_up)
    return standby


def _return_dropped(
    prev_standby: Sequence[frozenset[TaskId]],
    active: Sequence[frozenset[TaskId]],
    standby: list[frozenset[TaskId]],
    bounds: Sequence[tuple[int, int]],
    added: dict[int, list[TaskId]],
    gave_up: dict[TaskId, int],
) -> None:
    """``_Run._return_dropped_standbys`` (no client is below its floor here): a client below
    its load ceiling takes back a previous standby it dropped from a client that got a copy
    without state of it and is above its load floor (the first such in client order), in
    client order, then task order, until it reaches its ceiling; passes until one moves
    nothing."""
    load = list(map(add, map(len, active), map(len, standby)))
    fresh: dict[TaskId, list[int]] = {}  # task -> clients holding a copy without its state
    above = False
    for d in sorted(added):
        for t in added[d]:
            if t not in prev_standby[d] and gave_up.get(t) != d:
                fresh.setdefault(t, []).append(d)
                above = above or load[d] > bounds[d][0]
    if not above:
        return  # the first copy back needs a holder above its floor
    # What each client held before and dropped, of those tasks (fixed while copies go back).
    lost: dict[int, list[TaskId]] = {}
    for t, hs in _holders(prev_standby, frozenset(fresh), range(len(standby))).items():
        for ci in hs:
            if t not in standby[ci] and t not in active[ci]:
                lost.setdefault(ci, []).append(t)
    if not lost:
        return
    back = []
    for ci in sorted(lost):
        back.append((ci, sorted(lost[ci])))
    again = True
    while again:
        again = False
        for ci, ts in back:
            ceiling = bounds[ci][1]
            if load[ci] >= ceiling:
                continue
            for t in ts:
                if t in standby[ci]:
                    continue  # taken back in an earlier pass
                holders = fresh[t]
                for d in holders:
                    if load[d] > bounds[d][0]:
                        holders.remove(d)
                        standby[d] = standby[d] - {t}
                        standby[ci] = standby[ci] | {t}
                        load[d] -= 1
                        load[ci] += 1
                        again = True
                        break
                if load[ci] >= ceiling:
                    break


@attrs.frozen
class _Copies:
    """How many standbys of each task are kept: ``full`` holds the tasks with all ``r``."""

    full: AbstractSet[TaskId]
    of: Callable[[TaskId], int]


def _copy_counts(standby: Sequence[frozenset[TaskId]], r: int) -> _Copies | None:
    """Standby copies per task across ``standby`` (None: a task has more than ``r``).

    For a few replicas over a few clients, or clients holding many copies each, set levels
    (``levels[k]``: tasks with more than ``k`` copies), grown in place per client: C set work,
    no per-task Python. For many replicas, or many clients holding a few copies each (a Python
    step per client would cost more than one per copy), one C-level count.
    """
    m = len(standby)
    if r > 3 or (m > _FEW_CLIENTS and sum(map(len, standby)) < _LEVELS_FROM * m):
        counts = Counter(chain.from_iterable(standby))
        if counts and max(counts.values()) > r:
            return None
        full = set(compress(counts, map(r.__eq__, counts.values())))
        return _Copies(full, counts.__getitem__)  # a Counter gives 0 for a missing task
    levels: list[set[TaskId]] = []
    for _ in range(r + 1):
        levels.append(set())
    for v in standby:
        if v:
            for k in range(r, 0, -1):
                levels[k] |= levels[k - 1] & v  # in place: linear in v, not in the levels
            levels[0] |= v
    if levels[r]:
        return None

    def of(t: TaskId) -> int:
        n = 0  # levels are nested: count the leading ones that hold t
        while n < r - 1 and t in levels[n]:
            n += 1
        return n

    return _Copies(levels[r - 1], of)


def _swap(
    t: TaskId,
    active: Sequence[frozenset[TaskId]],
    standby: list[frozenset[TaskId]],
    held: dict[TaskId, list[int]],
    added: dict[int, list[TaskId]],
    returned: dict[int, set[TaskId]],
    room: list[int],
    spare_kept: bool,
) -> int:
    """Make room for a copy of ``t`` when every client with room holds it: a client ``d``
    without a copy hands one of its standbys ``u`` to a client ``c`` with room and no copy of
    ``u``; ``t`` then goes to ``d`` (returned; -1 when no such pair). Loads stay on target.
    Copies placed in this run are handed over before warm ones (kept from before, or given
    back to a previous owner); with ``spare_kept`` (a previous owner was left without room for
    its task's copy), never one kept from before: the general path can keep more in place
    there, so the caller declines instead. Rare, so it may scan."""
    m = len(room)
    rooms = [c for c in range(m) if room[c] > 0]
    # What each client with room could take: neither active there nor a copy there already.
    blocked = [active[c] | standby[c] | frozenset(added.get(c, ())) for c in rooms]
    # Hand over a copy placed in this run first: moving a warm one throws its state away.
    for fresh in (True, False):
        for d in range(m):
            if t in active[d] or d in held[t]:
                continue
            warm = returned.get(d, set())
            if fresh:
                mine = frozenset(added.get(d, ())).difference(warm)
            elif spare_kept:
                mine = frozenset(warm)
            else:
                mine = standby[d] | warm
            # The first of these (in task order) some client with room can take, and the first
            # such client.
            best: tuple[TaskId, int] | None = None
            for k, c in enumerate(rooms):
                free = mine - blocked[k]
                if free:
                    u = min(free)
                    if best is None or u < best[0]:
                        best = (u, c)
            if best is not None:
                warm.discard(best[0])
                return _hand_over(best[0], d, best[1], standby, held, added, room)
    return -1


def _hand_over(
    u: TaskId,
    d: int,
    c: int,
    standby: list[frozenset[TaskId]],
    held: dict[TaskId, list[int]],
    added: dict[int, list[TaskId]],
    room: list[int],
) -> int:
    """Move the standby of ``u`` from client ``d`` to client ``c`` (which has room); ``d``."""
    m = len(room)
    u_has = held.get(u)
    if u_has is None:
        u_has = held[u] = [x for x in range(m) if u in standby[x]]
    if u in standby[d]:
        standby[d] = standby[d] - {u}
    else:
        added[d].remove(u)
    added.setdefault(c, []).append(u)
    u_has[u_has.index(d)] = c
    room[c] -= 1
    return d
