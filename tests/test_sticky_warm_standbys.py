"""Standby copies kept on clients with state of their task: no copy is placed from scratch while
a chain of hand-overs of kept copies would make room for it on a holder (a rejoining host's
copies were rebuilt from scratch while others could be moved)."""

from __future__ import annotations

import pytest
from hypothesis import given

from streamassign import ClientState, StickyTaskAssignor, TaskId
from streamassign.sticky.run import _Run

from .strategies import assignment_inputs

Inputs = tuple[list[TaskId], list[ClientState], int, "list[TaskId] | None"]


def _kept(inputs: Inputs) -> tuple[_Run, list[int], list[int], list[int]]:
    """The run, its standby slots after local state is kept, the room left, and the slots
    still needing a copy."""
    tasks, clients, replicas, stateful = inputs
    run = _Run(tasks, sorted(clients, key=lambda c: c.process_id), stateful, replicas)
    run.warm = run._warm_holders(run.lost)
    run.assign_actives()
    room, valid = run._standby_targets()
    copies = [-1] * (len(run.tasks) * run.replicas)
    need = run._keep_local_state(copies, room, valid)
    return run, copies, room, need


def _chain_left(run: _Run, copies: list[int], room: list[int], slot: int) -> bool:
    """Whether some holder of ``slot``'s task reaches a client with room through hand-overs of
    kept copies, each to a holder of that copy's task ranking no worse (tier, then caught up
    or lag). A plain reachability search over clients: a reached client has a simple chain."""
    r = run.replicas

    def takers(task: int, holder: int) -> list[int]:
        held = copies[task * r : (task + 1) * r]
        found = [c for c in run.warm.get(task, ()) if c != run.owner[task] and c not in held]
        if holder < 0:
            return found
        return [c for c in found if run._rank(task, c)[:2] <= run._rank(task, holder)[:2]]

    seen = set(takers(slot // r, -1))
    todo = list(seen)
    while todo:
        client = todo.pop()
        if room[client] > 0:
            return True
        for moved, holder in enumerate(copies):
            if holder == client:
                for taker in takers(moved // r, client):
                    if taker not in seen:
                        seen.add(taker)
                        todo.append(taker)
    return False


@given(assignment_inputs())
def test_no_standby_from_scratch_while_a_chain_would_keep_it_warm(inputs: Inputs) -> None:
    """After local state is kept, no slot still needing a copy has a chain of hand-overs to
    holders ranking no worse that ends at a client with room: each client keeps its target,
    and such a chain would have kept one more copy warm."""
    run, copies, room, need = _kept(inputs)
    assert all(client < 0 or room[client] >= 0 for client in copies)
    assert [slot for slot in need if _chain_left(run, copies, room, slot)] == []


def _ids(text: str) -> frozenset[TaskId]:
    return frozenset(TaskId.parse(item) for item in text.split())


def _restarted(pid: str, active: str, stores: str) -> ClientState:
    """A client reporting ``active`` as run and every other store as a standby at lag 0."""
    standby = _ids(stores)
    return ClientState(
        pid, prev_active=_ids(active), prev_standby=standby, lags=dict.fromkeys(standby, 0)
    )


def test_rolling_restart_keeps_every_standby_warm() -> None:
    """The audit's rolling restart, small: 8 tasks over 5 processes with one standby, p3
    stopped and came back with its stores. Kept in task order, p2 filled up with 0_4 and p1
    with 0_3, and 0_6 and 0_7 went to p3 and p4 from scratch while p2 and p1 held them caught
    up; chains move 0_4 to p3 and 0_3 to p4 (both hold them caught up), no copy is cold."""
    tasks = [TaskId(0, p) for p in range(8)]
    clients = [
        _restarted("p0", "0_0 0_5", "0_1 0_2"),
        _restarted("p1", "0_1 0_6", "0_3 0_7"),
        _restarted("p2", "0_2 0_7", "0_4 0_6"),
        _restarted("p3", "0_3", "0_0 0_4"),
        _restarted("p4", "0_4", "0_0 0_3 0_5"),
    ]
    got = StickyTaskAssignor(num_standby_replicas=1).assign(tasks, clients)
    for client in clients:
        assert got[client.process_id].standby <= client.prev_standby
    assert {pid: len(a.active) + len(a.standby) for pid, a in got.items()} == {
        "p0": 4,
        "p1": 3,
        "p2": 3,
        "p3": 3,
        "p4": 3,
    }


def _bounce(n: int, procs: int, replicas: int, gone: int, subtopologies: int) -> int:
    """Fresh group, process ``gone`` stops, then comes back with its stores (every store
    reported as a standby at lag 0, what it ran as run); standby copies of the last round on a
    client without state of the task."""
    tasks = [TaskId(s, p) for s in range(subtopologies) for p in range(n)]
    assignor = StickyTaskAssignor(num_standby_replicas=replicas)
    pids = [f"p{i}" for i in range(procs)]
    first = assignor.assign(tasks, [ClientState(pid) for pid in pids])
    second = assignor.assign(
        tasks,
        [
            ClientState(pid, prev_active=first[pid].active, prev_standby=first[pid].standby)
            for pid in pids
            if pid != pids[gone]
        ],
    )
    clients = []
    for pid in pids:
        mine = first[pid].active | first[pid].standby
        if pid == pids[gone]:
            active = first[pid].active
        else:
            mine |= second[pid].active | second[pid].standby
            active = second[pid].active - first[pids[gone]].active
        clients.append(
            ClientState(
                pid,
                prev_active=active,
                prev_standby=mine - active,
                lags=dict.fromkeys(mine - active, 0),
            )
        )
    last = assignor.assign(tasks, clients)
    state = {c.process_id: c.prev_standby | c.prev_active for c in clients}
    return sum(len(a.standby - state[pid]) for pid, a in last.items())


@pytest.mark.parametrize(("n", "replicas", "subtopologies"), [(256, 1, 1), (64, 2, 3)])
def test_rolling_restart_of_each_process_builds_no_standby_from_scratch(
    n: int, replicas: int, subtopologies: int
) -> None:
    """The audit's model (5 processes, everything caught up): 6-32 cold copies per restart at
    256 tasks and one standby, 18-44 at 64 x 3 subtopologies with two, before; none now."""
    assert [_bounce(n, 5, replicas, gone, subtopologies) for gone in range(5)] == [0] * 5
