"""The sticky assignor's incremental set path against its general path, on the same inputs.

The set path (``streamassign._sticky_sets``) answers rebalances from a clean history; whenever it
answers, it must be as good as the general path: the same moves (the lower bound), at least as
many warm takeovers and kept standbys, and a valid assignment. It must also answer the common
cases, or it would only cost time.
"""

from __future__ import annotations

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
    first = StickyTaskAssignor(replicas).assign(tasks, clients)
    keep = data.draw(st.lists(st.sampled_from(range(len(clients))), min_size=1, unique=True))
    stay = [clients[i] for i in sorted(keep)]
    joined = [ClientState(f"new{i}", capacity=2) for i in range(data.draw(st.integers(0, 3)))]
    history = fed_back(stay, first) + joined
    ordered = sorted(history, key=lambda c: c.process_id)
    quick = assign_sets(tasks, ordered, None, replicas)
    general = _Run(tasks, ordered, None, replicas).result(fast_path=False)
    if quick is None:
        # Declining is allowed only where one copy per client forces a load off its bounds.
        assert not loads_within_bounds(tasks, ordered, general, replicas)
        return
    assert (
        evaluate(tasks, history, quick, replicas).moves
        == evaluate(tasks, history, general, replicas).moves
    )


def test_declines_what_it_does_not_handle() -> None:
    tasks = [TaskId(0, p) for p in range(4)]
    lagging = [ClientState("a", prev_active=tasks[:2], lags={tasks[2]: 5}), ClientState("b")]
    duplicate = [ClientState("a", prev_active=tasks[:2]), ClientState("b", prev_active=tasks[1:])]
    stale = [ClientState("a", prev_active=[TaskId(9, 9)]), ClientState("b")]
    racked = [ClientState("a", rack="r1"), ClientState("b")]
    for clients in (lagging, duplicate, stale, racked):
        assert assign_sets(tasks, clients, None, 1) is None
    assert assign_sets(tasks, [ClientState("a"), ClientState("b")], None, 1) is not None
