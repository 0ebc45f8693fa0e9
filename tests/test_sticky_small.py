"""The sticky assignor's small-input path against its set path, on the same inputs.

The small path (``streamassign._sticky_small``) exists only to run less code on small inputs;
whenever it answers, its assignment must be exactly the set path's, and it must answer whenever
the set path does (up to its size limit), or it would only cost time. The set path is checked
against the general path in ``test_sticky_sets.py``, so these two properties carry every
invariant of the assignor over to this path.
"""

from __future__ import annotations

from random import Random

from hypothesis import given
from hypothesis import strategies as st

from streamassign import ClientAssignment, ClientState, StickyTaskAssignor, TaskId
from streamassign._sticky_sets import assign_sets
from streamassign._sticky_small import SMALL, assign_small

from .strategies import assignment_inputs, fresh_clients, task_sets
from .test_sticky import fed_back
from .test_sticky_sets import SET_PATH_REGRESSIONS, Inputs, _client, _ids

Assignment = dict[str, ClientAssignment]


def assert_same_as_the_set_path(inputs: Inputs) -> Assignment | None:
    """Both paths on ``inputs``; the small path's answer (``None`` when both decline)."""
    tasks, clients, replicas, stateful = inputs
    ordered = sorted(clients, key=lambda c: c.process_id)
    small = assign_small(tasks, ordered, stateful, replicas)
    sets = assign_sets(tasks, ordered, stateful, replicas)
    if small is not None:
        assert sets is not None, "the small path answered where the set path declines"
        assert small == sets
    elif sets is not None:
        assert len(set(tasks)) > SMALL, "the small path declined a clean small input"
    return small


@given(assignment_inputs(), st.randoms(use_true_random=False))
def test_small_path_is_the_set_path(inputs: Inputs, rnd: Random) -> None:
    got = assert_same_as_the_set_path(inputs)
    tasks, clients, replicas, stateful = inputs
    shuffled = list(tasks)
    rnd.shuffle(shuffled)
    ordered = sorted(clients, key=lambda c: c.process_id)
    assert assign_small(shuffled, ordered, stateful, replicas) == got  # any task order


@st.composite
def chains(draw: st.DrawFn) -> list[Inputs]:
    """Rebalances in a row, each from the last one's result with clients gone and joined."""
    tasks = draw(task_sets(max_partitions=24))
    replicas = draw(st.integers(0, 3))
    stateful = draw(st.one_of(st.none(), st.lists(st.sampled_from(tasks), unique=True)))
    clients = draw(fresh_clients())
    steps: list[Inputs] = []
    result: Assignment = {}
    for step in range(draw(st.integers(1, 4))):
        if step:
            keep = draw(st.lists(st.sampled_from(range(len(clients))), unique=True, min_size=1))
            stay = [clients[k] for k in sorted(keep)]
            joined = [
                ClientState(f"new{step}{k}", capacity=draw(st.integers(1, 4)))
                for k in range(draw(st.integers(0, 3)))
            ]
            clients = fed_back(stay, result) + joined
        steps.append((tasks, clients, replicas, stateful))
        result = StickyTaskAssignor(replicas).assign(tasks, clients, stateful)
    return steps


@given(chains())
def test_small_path_is_the_set_path_along_chains_of_rebalances(steps: list[Inputs]) -> None:
    for inputs in steps:
        assert_same_as_the_set_path(inputs)


@given(st.integers(1, SMALL), st.integers(1, 12), st.integers(1, 2), st.data())
def test_small_path_answers_faust_style_churn(
    partitions: int, workers: int, replicas: int, data: st.DataObject
) -> None:
    """Faust's shape (one subtopology, equal workers): fresh, then one leaves and two join."""
    tasks = [TaskId(0, p) for p in range(partitions)]
    clients = [ClientState(f"w{k:02d}") for k in range(workers)]
    first = assign_small(tasks, clients, None, replicas)
    assert first is not None
    gone = data.draw(st.sampled_from(clients))
    after = [
        ClientState(
            c.process_id,
            prev_active=first[c.process_id].active,
            prev_standby=first[c.process_id].standby,
        )
        for c in clients
        if c is not gone
    ] + [ClientState("x1"), ClientState("x2")]
    assert assert_same_as_the_set_path((tasks, after, replicas, None)) is not None


def test_small_path_regressions_of_the_set_path() -> None:
    for inputs in SET_PATH_REGRESSIONS:
        assert_same_as_the_set_path(inputs)


def test_small_path_swaps_like_the_set_path() -> None:
    """Twelve tasks over five fresh workers with one standby: the queue runs out of clients
    without a copy and a standby is handed over (the set path's ``_swap``)."""
    tasks = [TaskId(0, p) for p in range(12)]
    clients = [ClientState(f"w{k}") for k in range(5)]
    got = assert_same_as_the_set_path((tasks, clients, 1, None))
    assert got is not None
    assert all(a.active.isdisjoint(a.standby) for a in got.values())


def test_declines_what_the_set_path_declines_or_it_does_not_take() -> None:
    tasks = _ids("0_0 0_1 0_2 0_3")
    two = [ClientState("a"), ClientState("b")]
    declined = [
        (tasks, [_client("a", 1, "0_0 0_1"), _client("b", 1, "0_1")]),  # duplicate claim
        (tasks, [_client("a", 1, "9_9"), ClientState("b")]),  # stale claim
        (tasks, [ClientState("a", lags={tasks[0]: 3}), ClientState("b")]),  # lags
        (tasks, [ClientState("a", rack="r1"), ClientState("b")]),  # racks
        ([(0, p) for p in range(4)], two),  # plain tuples: the set path converts them
        (tasks + tasks[:1], two),  # a task given twice
        ([TaskId(0, p) for p in range(SMALL + 1)], two),  # too large to pay
    ]
    for given_tasks, clients in declined:
        assert assign_small(given_tasks, clients, None, 1) is None  # type: ignore[arg-type]
    assert assign_small(tasks, two, None, 1) is not None
