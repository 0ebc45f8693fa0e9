"""The sticky assignor's incremental set path against its general path, on the same inputs.

The set path (``streamassign._sticky_sets``) answers rebalances from a clean history; whenever it
answers, it must be as good as the general path: the same moves (the lower bound), at least as
many warm takeovers and kept standbys, and a valid assignment. It must also answer the common
cases, or it would only cost time.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamassign import ClientAssignment, ClientState, StickyTaskAssignor, TaskId
from streamassign._balance import share_bounds
from streamassign._sticky_sets import assign_sets
from streamassign.metrics import evaluate, violations
from streamassign.sticky import _Run

from .strategies import assignment_inputs, fresh_clients, task_sets
from .test_sticky import fed_back

Inputs = tuple[list[TaskId], list[ClientState], int, "list[TaskId] | None"]


@given(assignment_inputs())
def test_set_path_is_as_good_as_the_general_path(inputs: Inputs) -> None:
    assert_as_good_as_the_general_path(inputs)


def _ids(text: str) -> list[TaskId]:
    return [TaskId.parse(t) for t in text.split()]


def _client(pid: str, cap: int, active: str = "", standby: str = "") -> ClientState:
    return ClientState(pid, cap, prev_active=_ids(active), prev_standby=_ids(standby))


#: Found by a random search over chained rebalances (1 in ~3,400 inputs then): the set path kept
#: fewer previous standbys than the general path. The first: the queue spent a previous owner's
#: room before giving it back its task, and a swap then moved a kept copy. The second: a
#: client over its target kept copies that a swap later had to move.
SET_PATH_REGRESSIONS: list[Inputs] = [
    (
        _ids("0_0 0_1 1_0"),
        [
            _client("p0", 4, "", "0_1"),
            _client("p1", 1, "0_1"),
            _client("p2", 2, "1_0"),
            _client("p3", 4),
        ],
        1,
        None,
    ),
    (
        _ids("0_0 0_1 0_2 0_3 0_4 0_5"),
        [
            _client("p0", 2, "0_2 0_4", "0_3"),
            _client("p1", 4, "0_5"),
            _client("p2", 1, "0_1", "0_3"),
            _client("p3", 4),
            _client("p4", 1, "", "0_0 0_2 0_5"),
            _client("p5", 2, "0_0", "0_1 0_3 0_4"),
            _client("p6", 1, "", "0_2"),
        ],
        3,
        None,
    ),
]


@pytest.mark.parametrize("inputs", SET_PATH_REGRESSIONS)
def test_set_path_regressions(inputs: Inputs) -> None:
    assert_as_good_as_the_general_path(inputs)


def test_set_path_declines_rather_than_move_a_kept_copy() -> None:
    """Found by a random search (about 1 in 10,000 chained inputs): p2 gives 3_0 up but has no
    room to take its copy back, and the last copy to place can only go where a swap moves a
    kept standby. The general path gives p2 its copy and drops one of p2's kept copies instead,
    keeping one standby more in place; both fast paths decline and leave the input to it."""
    tasks = [TaskId(s, p) for s, n in [(0, 3), (1, 3), (2, 4), (3, 7)] for p in range(n)]
    clients = [
        _client("p0", 1, "3_3", "3_2"),
        _client("p1", 1, "", "3_1 3_5"),
        _client("p2", 2, "0_0 1_0 2_0 3_0", "2_3 3_1 3_6"),
        _client("p3", 4, "0_2 1_2 2_3 3_1 3_2 3_5", "0_1 2_1 2_2 3_0 3_3 3_6"),
        _client("p4", 4),
    ]
    stateful = _ids("0_1 2_1 2_2 2_3 3_0 3_1 3_2 3_3 3_5 3_6")
    assert assign_sets(tasks, clients, stateful, 2) is None
    got = StickyTaskAssignor(2).assign(tasks, clients, stateful)
    general = _Run(tasks, clients, stateful, 2).result(fast_path=False)
    assert got == general
    assert evaluate(tasks, clients, got, 2, stateful).standbys_kept == 11


def assert_as_good_as_the_general_path(inputs: Inputs) -> None:
    tasks, clients, replicas, stateful = inputs
    ordered = sorted(clients, key=lambda c: c.process_id)
    quick = assign_sets(tasks, ordered, stateful, replicas)
    if quick is None:
        return
    general = _Run(tasks, ordered, stateful, replicas).result(fast_path=False)
    assert violations(tasks, clients, quick, replicas, stateful) == []
    q = evaluate(tasks, clients, quick, replicas, stateful)
    g = evaluate(tasks, clients, general, replicas, stateful)
    assert q.moves == g.moves == q.move_lower_bound
    assert q.warm_takeovers >= g.warm_takeovers
    assert q.standbys_kept >= g.standbys_kept
    assert q.active_balanced
    assert loads_within_bounds(tasks, clients, quick, replicas, stateful, floor_only=True)


def loads_within_bounds(
    tasks: list[TaskId],
    clients: list[ClientState],
    result: dict[str, ClientAssignment],
    replicas: int,
    stateful: list[TaskId] | None = None,
    floor_only: bool = False,
) -> bool:
    """Every client's active+standby load is the floor or ceiling of its capacity share (with
    ``floor_only``, at least the floor: one copy per client may force some above the ceiling)."""
    n_stateful = len(set(tasks) if stateful is None else set(stateful) & set(tasks))
    total = len(tasks) + n_stateful * min(replicas, len(clients) - 1)
    bounds = share_bounds(total, [c.capacity for c in clients])
    loads = [result[c.process_id].load for c in clients]
    return all(
        lo <= load and (floor_only or load <= hi)
        for load, (lo, hi) in zip(loads, bounds, strict=True)
    )


@given(task_sets(), fresh_clients(), st.integers(0, 2), st.data())
def test_set_path_answers_scale_out_and_in(
    tasks: list[TaskId], clients: list[ClientState], replicas: int, data: st.DataObject
) -> None:
    """A previous result with clients gone and new ones added is what it is for."""
    keep = data.draw(st.lists(st.sampled_from(range(len(clients))), min_size=1, unique=True))
    joined = data.draw(st.integers(0, 3))
    history = _scaled(tasks, clients, replicas, sorted(keep), joined)
    quick = assign_sets(tasks, history, None, replicas)
    if quick is None:
        return  # how often: test_set_path_answers_nearly_every_scale_out_and_in
    general = _Run(tasks, history, None, replicas).result(fast_path=False)
    assert (
        evaluate(tasks, history, quick, replicas).moves
        == evaluate(tasks, history, general, replicas).moves
    )


def test_set_path_answers_nearly_every_scale_out_and_in() -> None:
    """It declines where one copy per client forces a load off its bounds (the general path's
    forced placements), and otherwise only in the rare case it leaves to the general path to
    keep a standby more in place (``test_set_path_declines_rather_than_move_a_kept_copy``):
    2 of 3,000 seeded scale-outs and scale-ins when this was written."""
    rng = random.Random(2)
    unforced = 0
    for _ in range(3000):
        tasks = [TaskId(s, p) for s in range(rng.randint(1, 3)) for p in range(rng.randint(1, 8))]
        clients = [ClientState(f"c{i}", rng.randint(1, 4)) for i in range(rng.randint(1, 6))]
        replicas = rng.randint(0, 2)
        keep = sorted(rng.sample(range(len(clients)), rng.randint(1, len(clients))))
        history = _scaled(tasks, clients, replicas, keep, rng.randint(0, 3))
        if assign_sets(tasks, history, None, replicas) is None:
            general = _Run(tasks, history, None, replicas).result(fast_path=False)
            unforced += loads_within_bounds(tasks, history, general, replicas)
    assert unforced <= 2  # exactly what was measured: a new decline shows here


def _scaled(
    tasks: list[TaskId], clients: list[ClientState], replicas: int, keep: list[int], joined: int
) -> list[ClientState]:
    """Clients ``keep`` reporting their first assignment, and ``joined`` new ones (sorted)."""
    first = StickyTaskAssignor(replicas).assign(tasks, clients)
    stay = [clients[i] for i in keep]
    new = [ClientState(f"new{i}", capacity=2) for i in range(joined)]
    return sorted(fed_back(stay, first) + new, key=lambda c: c.process_id)


def test_declines_what_it_does_not_handle() -> None:
    tasks = [TaskId(0, p) for p in range(4)]
    lagging = [ClientState("a", prev_active=tasks[:2], lags={tasks[2]: 5}), ClientState("b")]
    duplicate = [ClientState("a", prev_active=tasks[:2]), ClientState("b", prev_active=tasks[1:])]
    stale = [ClientState("a", prev_active=[TaskId(9, 9)]), ClientState("b")]
    racked = [ClientState("a", rack="r1"), ClientState("b")]
    for clients in (lagging, duplicate, stale, racked):
        assert assign_sets(tasks, clients, None, 1) is None
    assert assign_sets(tasks, [ClientState("a"), ClientState("b")], None, 1) is not None
