"""The sticky task assignor's small-input path: the set path's result, with less code run.

A rebalance of a few dozen tasks finds the CPU caches cold (it runs once, after network I/O),
and then costs what the code it touches costs to fetch, not what it computes: each distinct C
function, type and code object is a fetch from memory (``docs/benchmarks.md`` measures this).
The set path (``_sticky_sets``) is built for large groups where few tasks move — frozenset
algebra, heaps, ``itertools`` and ``operator`` pipelines — which is many distinct C functions.
This path computes the same assignment on task indices with plain loops over lists and a
handful of module functions, so a small rebalance fetches little code.

It returns exactly what ``_sticky_sets.assign_sets`` returns (a property test compares the two),
and declines (``None``, the set path then runs) whenever the set path would decline or whenever
it would need the set path's rarer steps beyond a one-step standby swap, or when the input is
too large for per-task loops to pay.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from ._balance import deal, level_order, share_bounds, standby_targets
from ._ids import TaskId, as_task
from ._sticky_sets import _SWAPS
from ._takeover import augment_takeovers
from .assignment import ClientAssignment, ClientState

#: Most tasks this path takes. Beyond this, the set path's per-client set work is cheaper: on
#: Faust's churn chains this path is faster cold at 128 tasks and slower at 256
#: (``docs/benchmarks.md``).
SMALL = 128
#: ``StandbyQueue.SPREAD``: candidates by room examined for one not holding its fair share.
_SPREAD = 4


def assign_small(
    tasks: Iterable[TaskId],
    clients: Sequence[ClientState],
    stateful: Iterable[TaskId] | None,
    num_standby_replicas: int,
) -> dict[str, ClientAssignment] | None:
    """The set path's assignment of ``clients`` (sorted by process id), or ``None`` to decline."""
    m = len(clients)
    try:
        tl = sorted(tasks)
    except TypeError:
        for t in tasks:
            as_task(t)  # a TypeError naming what is not a task id
        raise
    n = len(tl)
    if not m or n > SMALL:
        return None
    for t in tl:
        if type(t) is not TaskId:
            as_task(t)  # likewise
            return None  # plain pairs: the set path converts them
    pos = dict(zip(tl, range(n), strict=True))
    if len(pos) != n:
        return None  # a task given twice
    r = min(num_standby_replicas, m - 1)
    sf = [stateful is None] * n
    n_sf = n
    if stateful is not None:
        n_sf = 0
        for t in stateful:
            i = pos.get(t)
            if i is not None and not sf[i]:
                sf[i] = True
                n_sf += 1
    # Previous owner and standby holders (in client order) of each task, and each client's
    # previous tasks and standbys (in set order); clean input only.
    prev = [-1] * n
    hold: list[list[int] | None] = [None] * n
    mine: list[list[int]] = []
    sbs: list[list[int]] = []
    caps = [0] * m
    ran = [0] * m
    pid = None
    for ci in range(m):
        c = clients[ci]
        if c.lags or c.tags or c.rack is not None or c.process_id == pid:
            return None  # lags, racks, tags, or a process id twice (adjacent: sorted)
        pid = c.process_id
        caps[ci] = c.capacity
        got = []
        for t in c.prev_active:
            i = pos.get(t)
            if i is None or prev[i] >= 0:
                return None  # stale or duplicate claims
            prev[i] = ci
            got.append(i)
        mine.append(got)
        ran[ci] = len(got)
        got = []
        for t in c.prev_standby:
            i = pos.get(t)
            if i is None:
                if r:
                    return None
            elif prev[i] == ci or (r and not sf[i]):
                return None
            else:
                got.append(i)
                h = hold[i]
                if h is None:
                    hold[i] = [ci]
                else:
                    h.append(ci)
        sbs.append(got)
    owner, gave_up, moved = _actives(tl, caps, ran, prev, hold, mine)
    # Which clients' actives changed (the others keep their reported set as it is).
    changed = [False] * m
    for i in moved:
        changed[owner[i]] = True
        if prev[i] >= 0:
            changed[prev[i]] = True
    act: list[list[int] | None] = [None] * m
    for ci in range(m):
        if changed[ci]:
            act[ci] = []
    for i in range(n):
        a = act[owner[i]]
        if a is not None:
            a.append(i)
    out: dict[str, ClientAssignment] = {}
    if r:
        n_active = ran[:]
        for ci in range(m):
            a = act[ci]
            if a is not None:
                n_active[ci] = len(a)
        standby = _standbys(tl, caps, n_active, owner, moved, hold, sbs, gave_up, sf, n_sf, r)
        if standby is None:
            return None
        for ci in range(m):
            c = clients[ci]
            a = act[ci]
            b = standby[ci]
            out[c.process_id] = ClientAssignment(
                c.prev_active if a is None else _tasks(tl, a),
                c.prev_standby if b is None else _tasks(tl, b),
            )
    else:
        for ci in range(m):
            c = clients[ci]
            a = act[ci]
            out[c.process_id] = ClientAssignment(c.prev_active if a is None else _tasks(tl, a))
    return out


def _tasks(tl: list[TaskId], got: list[int]) -> frozenset[TaskId]:
    """The tasks at indices ``got``."""
    out = []
    for i in got:
        out.append(tl[i])
    return frozenset(out)


def _actives(
    tl: list[TaskId],
    caps: list[int],
    ran: list[int],
    prev: list[int],
    hold: list[list[int] | None],
    mine: list[list[int]],
) -> tuple[list[int], dict[int, int], list[int]]:
    """Owner of each task, the previous owner of each task released by a client over its
    quota, and the tasks whose owner changed, in task order (``_sticky_sets._actives``, step
    for step)."""
    n, m = len(tl), len(caps)
    # Tasks without an owner: first the orphans no client ran (none when every task was
    # running); the tasks released by clients over their quota are added below.
    free = []
    if sum(ran) < n:
        for i in range(n):
            if prev[i] < 0:
                free.append(i)
    whole = sum(caps)
    quotas = []
    for w in caps:
        quotas.append(n * w // whole)
    # Ceilings: after the move bound, to the standby holders orphans would be matched to (as
    # many as fit below their ceiling) that lack the room for them at their floor.
    matched = [0] * m
    by_choice = []
    for i in free:
        hs = hold[i]
        if hs:
            by_choice.append((len(hs), i))
    by_choice.sort()
    for _, i in by_choice:
        pick = -1
        for h in hold[i] or ():
            fits = matched[h] < quotas[h] - ran[h] + (n * caps[h] % whole > 0)
            if fits and (pick < 0 or matched[h] < matched[pick]):
                pick = h
        if pick >= 0:
            matched[pick] += 1
    extras = n - sum(quotas)
    if extras:
        fractional = []
        for ci in range(m):
            if n * caps[ci] % whole:
                below = quotas[ci] - ran[ci]
                fractional.append(
                    (below if below < 0 else 0, below >= matched[ci], below, -matched[ci], ci)
                )
        fractional.sort()
        for k in range(extras):
            quotas[fractional[k][4]] += 1
    room = [0] * m
    over = []
    for ci in range(m):
        if ran[ci] > quotas[ci]:
            over.append(ci)
        else:
            room[ci] = quotas[ci] - ran[ci]
    owner = prev[:]
    gave_up: dict[int, int] = {}
    for ci in over:
        # Release first the tasks a standby holder with room could take over warm (the last
        # such holder first), each subtopology's in turn so the kept ones stay spread.
        ordered = []
        warm_first = []
        for i in sorted(mine[ci]):
            b = -1
            for h in hold[i] or ():
                if room[h] > 0:
                    b = h
                    break
            if b < 0:
                ordered.append(i)
            else:
                warm_first.append((-b, i))
        warm_first.sort()
        for _, i in warm_first:
            ordered.append(i)
        # One subtopology (Faust's case) is already in order; the loop spares a cold run the
        # ``map`` and key function ``level_order`` would touch to find that out.
        first = tl[ordered[0]][0]
        for i in ordered:
            if tl[i][0] != first:
                ordered = level_order(ordered, lambda i: tl[i][0])
                break
        for i in ordered[quotas[ci] :]:
            owner[i] = -1
            gave_up[i] = ci
            free.append(i)
    # Warm takeovers in task order, then augmenting paths, then dealt cold.
    if gave_up:
        free.sort()
    took: dict[int, list[int]] = {}
    left = []
    for i in free:
        for h in hold[i] or ():
            if room[h] > 0:
                owner[i] = h
                room[h] -= 1
                if h in took:
                    took[h].append(i)
                else:
                    took[h] = [i]
                break
        else:
            left.append(i)
    if left:
        cold = left
        if took or extras:  # else no chain can exist (``augment_takeovers``' own shortcut)
            for i in left:
                if hold[i]:
                    bounds = share_bounds(n, caps)
                    cold = augment_takeovers(
                        left, _holders(hold), owner, took, room, quotas, bounds
                    )
                    break
        for i, ci in zip(cold, deal(room), strict=True):
            owner[i] = ci
    return owner, gave_up, free


def _holders(hold: list[list[int] | None]) -> Callable[[int], Sequence[int]]:
    """``hold`` as ``augment_takeovers`` reads it: every task's holders, none as empty."""

    def of(i: int) -> Sequence[int]:
        return hold[i] or ()

    return of


def _standbys(
    tl: list[TaskId],
    caps: list[int],
    n_active: list[int],
    owner: list[int],
    moved: list[int],
    hold: list[list[int] | None],
    sbs: list[list[int]],
    gave_up: dict[int, int],
    sf: list[bool],
    n_sf: int,
    r: int,
) -> list[list[int] | None] | None:
    """Standby task indices per client, ``None`` for a client that keeps what it reported
    (``_sticky_sets._standbys``, step for step); ``None`` overall where the set path would
    decline or need more than a one-step swap."""
    n, m = len(tl), len(caps)
    if n_sf == n:
        n_sf_active = n_active
    else:
        n_sf_active = [0] * m
        for i in range(n):
            if sf[i]:
                n_sf_active[owner[i]] += 1
    # Previous standbys minus new actives: copies per task, and per client.
    count = [0] * n
    for i in range(n):
        h = hold[i]
        if h is not None:
            count[i] = len(h)
    n_valid = []
    for v in sbs:
        n_valid.append(len(v))
    took = [False] * m  # took over a task it held a standby of
    for i in moved:
        o = owner[i]
        h = hold[i]
        if h is not None and o in h:
            count[i] -= 1
            n_valid[o] -= 1
            took[o] = True
    targets = _targets(caps, n_active, n_sf_active, n_valid, n_sf, r)
    whole = sum(caps)
    total = n + n_sf * r
    recv = [False] * m  # clients that take new standbys
    trim = False
    for ci in range(m):
        if n_active[ci] + targets[ci] < total * caps[ci] // whole:
            return None  # below its load floor: the general path repairs that
        if targets[ci] > n_valid[ci]:
            recv[ci] = True
        elif targets[ci] < n_valid[ci]:
            trim = True
    kept: list[list[int] | None] = [None] * m
    if trim or True in took:
        for ci in range(m):
            if took[ci] or targets[ci] < n_valid[ci]:
                v = []
                for i in sbs[ci]:
                    if owner[i] != ci:
                        v.append(i)
                v.sort()
                kept[ci] = v
    room = [0] * m
    dropped = set()
    for ci in range(m):
        target = targets[ci]
        if n_valid[ci] <= target:
            room[ci] = target - n_valid[ci]
            continue
        # Over target: keep first the copies of tasks active on receivers, then task order.
        first = []
        rest = []
        for i in kept[ci] or ():
            if recv[owner[i]]:
                first.append(i)
            else:
                rest.append(i)
        if len(first) < target:
            keep = first + rest[: target - len(first)]
            keep.sort()
            drop = rest[target - len(first) :]
        else:
            keep = first[:target]
            drop = first[target:] + rest
        kept[ci] = keep
        for i in drop:
            count[i] -= 1
            dropped.add(i * m + ci)
    short = []
    for i in range(n):
        if count[i] > r:
            return None  # more copies than wanted
        if count[i] < r and sf[i]:
            short.append(i)
    if not short:
        return kept
    added: list[list[int]] = []
    returned: list[list[int]] = []
    for _ in range(m):
        added.append([])
        returned.append([])
    held: dict[int, list[int]] = {}
    need: dict[int, int] = {}
    for i in short:
        has = []
        for ci in hold[i] or ():
            if ci != owner[i] and i * m + ci not in dropped:
                has.append(ci)
        held[i] = has
        need[i] = r - count[i]
    # A previous owner that gave its task up holds its state: it takes a copy first.
    shut_out = False  # a previous owner left without room for its task's copy
    if gave_up:
        returning = []
        for i in short:
            if i in gave_up:
                returning.append((not recv[owner[i]], i))
        returning.sort()
        for _, i in returning:
            w = gave_up[i]
            if room[w] > 0 and w not in held[i]:
                room[w] -= 1
                held[i].append(w)
                added[w].append(i)
                returned[w].append(i)
                need[i] -= 1
            elif w not in held[i]:
                shut_out = True
    # The rest through the standby queue (``StandbyQueue``, no racks or tags): the client with
    # most room left, unless it already holds its fair share of this active client's copies.
    fair = []
    for k in n_sf_active:
        fair.append(-(-k * r // max(1, m - 1)))
    pairs: dict[int, int] = {}
    order = []
    for i in short:
        o = owner[i]
        order.append((room[o] == 0, o, i))
    order.sort()
    by_room = []  # clients with room, most room first, then client order
    for ci in range(m):
        if room[ci] > 0:
            by_room.append((-room[ci], ci))
    by_room.sort()
    queue = []
    for _, ci in by_room:
        queue.append(ci)
    swaps = 0
    for _, o, i in order:
        has = held[i]
        for _ in range(need[i]):
            best = -1
            seen = 0
            for ci in queue:
                seen += 1
                if ci == o or ci in has:
                    continue
                if pairs.get(o * m + ci, 0) < fair[o]:
                    best = ci
                    break
                if best < 0:
                    best = ci
                if seen >= _SPREAD:
                    break
            if best >= 0:
                pairs[o * m + best] = pairs.get(o * m + best, 0) + 1
                _lower(queue, room, best)
            else:
                swaps += 1
                if swaps > _SWAPS:
                    return None  # the set path declines too
                best = _swap(i, owner, kept, sbs, added, returned, held, room, queue, shut_out)
                if best < 0:
                    return None  # forced beyond a ceiling, or a kept copy would move
            has.append(best)
            added[best].append(i)
    for ci in range(m):
        if added[ci]:
            kept[ci] = _kept(kept, sbs, ci) + added[ci]
    _return_dropped(kept, sbs, added, hold, gave_up, owner, n_active, caps, total)
    return kept


def _return_dropped(
    kept: list[list[int] | None],
    sbs: list[list[int]],
    added: list[list[int]],
    hold: list[list[int] | None],
    gave_up: dict[int, int],
    owner: list[int],
    n_active: list[int],
    caps: list[int],
    total: int,
) -> None:
    """``_sticky_sets._return_dropped`` on indices: a client below its load ceiling takes back
    a previous standby it dropped from a client that got a copy without state of it, above its
    floor; in passes until one moves nothing."""
    m, whole = len(caps), sum(caps)
    load = []
    for ci in range(m):
        kc = kept[ci]
        load.append(n_active[ci] + len(sbs[ci] if kc is None else kc))
    fresh: dict[int, list[int]] = {}  # task -> clients holding a copy without its state
    above = False
    for d in range(m):
        for i in added[d]:
            if d not in (hold[i] or ()) and gave_up.get(i) != d:
                h = fresh.get(i)
                if h is None:
                    fresh[i] = [d]
                else:
                    h.append(d)
                if not above:
                    above = load[d] > total * caps[d] // whole
    if not above:
        return  # the first copy back needs a holder above its floor
    # What each client held before and dropped, of those tasks (fixed while copies go back).
    lost: dict[int, list[int]] = {}
    for i in fresh:
        for ci in hold[i] or ():
            mine = kept[ci]
            if mine is not None and owner[i] != ci and i not in mine:
                ts = lost.get(ci)
                if ts is None:
                    lost[ci] = [i]
                else:
                    ts.append(i)
    back = sorted(lost)
    for ci in back:
        lost[ci].sort()
    again = True
    while again:
        again = False
        for ci in back:
            if load[ci] * whole >= total * caps[ci]:
                continue  # at its ceiling
            mine = _kept(kept, sbs, ci)
            for i in lost[ci]:
                if i in mine:
                    continue  # taken back in an earlier pass
                holders = fresh[i]
                for d in holders:
                    if load[d] > total * caps[d] // whole:
                        holders.remove(d)
                        _kept(kept, sbs, d).remove(i)
                        mine.append(i)
                        load[d] -= 1
                        load[ci] += 1
                        again = True
                        break
                if load[ci] * whole >= total * caps[ci]:
                    break


def _kept(kept: list[list[int] | None], sbs: list[list[int]], ci: int) -> list[int]:
    """The standbys client ``ci`` keeps, as a list (``None`` in ``kept``: all it reported)."""
    v = kept[ci]
    if v is None:
        v = kept[ci] = sorted(sbs[ci])
    return v


def _targets(
    caps: list[int],
    n_active: list[int],
    n_sf_active: list[int],
    n_valid: list[int],
    n_sf: int,
    r: int,
) -> list[int]:
    """``_balance.standby_targets``; its common case inline (no heap, no ``operator`` maps)."""
    m = len(caps)
    whole = sum(caps)
    total = n_sf * r
    for a in n_active:
        total += a
    target = []
    order = []
    for ci in range(m):
        lo, rem = divmod(total * caps[ci], whole)
        hi = lo + 1 if rem else lo
        most = n_active[ci] + n_sf - n_sf_active[ci]
        t = n_active[ci] if n_active[ci] > lo else lo
        if t > most:
            t = most
        target.append(t)
        if t < hi and t < most:
            order.append((lo - n_active[ci] - n_valid[ci], ci))
    missing = total - sum(target)
    if missing < 0 or missing > len(order):
        return standby_targets(caps, n_active, n_sf_active, n_valid, n_sf, r)
    if missing:
        order.sort()
        for k in range(missing):
            target[order[k][1]] += 1
    for ci in range(m):
        target[ci] -= n_active[ci]
    return target


def _lower(queue: list[int], room: list[int], ci: int) -> None:
    """One less room for ``ci``; ``queue`` stays in order (most room, then client order)."""
    room[ci] -= 1
    k = queue.index(ci)
    if not room[ci]:
        del queue[k]
        return
    while k + 1 < len(queue):
        nxt = queue[k + 1]
        if room[nxt] < room[ci] or (room[nxt] == room[ci] and nxt > ci):
            break
        queue[k] = nxt
        k += 1
    queue[k] = ci


def _swap(
    t: int,
    owner: list[int],
    kept: list[list[int] | None],
    sbs: list[list[int]],
    added: list[list[int]],
    returned: list[list[int]],
    held: dict[int, list[int]],
    room: list[int],
    queue: list[int],
    spare_kept: bool,
) -> int:
    """``_sticky_sets._swap`` on indices: a client ``d`` without a copy of ``t`` hands one of
    its standbys ``u`` to a client with room and no copy of ``u`` (copies placed in this run
    first; with ``spare_kept``, never one kept from before), and takes ``t``; ``d``, or -1 when
    no such pair exists. Rare, so it may scan."""
    m = len(room)
    rooms = []
    for c in range(m):
        if room[c] > 0:
            rooms.append(c)
    for fresh in (True, False):
        for d in range(m):
            if owner[t] == d or d in held[t]:
                continue
            if fresh:
                copies = []
                for u in added[d]:
                    if u not in returned[d]:
                        copies.append(u)
            elif spare_kept:
                copies = returned[d][:]
            else:
                copies = _kept(kept, sbs, d) + returned[d]
            copies.sort()
            for u in copies:
                for c in rooms:
                    if owner[u] != c and u not in added[c] and u not in _kept(kept, sbs, c):
                        if u in returned[d]:
                            returned[d].remove(u)
                        u_has = held.get(u)
                        if u_has is None:
                            u_has = []
                            for x in range(m):
                                if u in _kept(kept, sbs, x):
                                    u_has.append(x)
                            held[u] = u_has
                        if u in added[d]:
                            added[d].remove(u)
                        else:
                            _kept(kept, sbs, d).remove(u)
                        added[c].append(u)
                        u_has[u_has.index(d)] = c
                        _lower(queue, room, c)
                        return d
    return -1
