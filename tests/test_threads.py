"""Spreading a client's tasks over its threads: balance per category and in total, stickiness."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamassign import ClientAssignment, TaskId
from streamassign.threads import distribute_to_threads

from .strategies import task_sets


@st.composite
def client_work(draw: st.DrawFn) -> tuple[ClientAssignment, list[str], set[TaskId]]:
    tasks = draw(task_sets())
    kinds = draw(st.lists(st.sampled_from("asw-"), min_size=len(tasks), max_size=len(tasks)))
    pick = lambda k: frozenset(t for t, kind in zip(tasks, kinds, strict=True) if kind == k)  # noqa: E731
    threads = draw(
        st.lists(st.text("xyz", min_size=1, max_size=3), min_size=1, max_size=6, unique=True)
    )
    stateful = set(draw(st.lists(st.sampled_from(tasks), unique=True)))
    return ClientAssignment(pick("a"), pick("s"), pick("w")), threads, stateful


def categories(a: ClientAssignment, stateful: set[TaskId]) -> list[frozenset[TaskId]]:
    return [a.active & stateful, a.standby | a.warmup, a.active - stateful]


def check_balanced(
    work: ClientAssignment, stateful: set[TaskId], out: dict[str, ClientAssignment]
) -> None:
    totals = [a.load for a in out.values()]
    assert max(totals) - min(totals) <= 1
    for k in range(3):
        counts = [len(categories(a, stateful)[k]) for a in out.values()]
        assert max(counts) - min(counts) <= 1, k


@given(client_work())
def test_every_task_on_one_thread_in_its_own_role(
    work: tuple[ClientAssignment, list[str], set[TaskId]],
) -> None:
    assignment, threads, stateful = work
    out = distribute_to_threads(assignment, threads, stateful=stateful)
    assert sorted(out) == sorted(threads)
    for field in ("active", "standby", "warmup"):
        parts = [getattr(a, field) for a in out.values()]
        assert sum(len(p) for p in parts) == len(getattr(assignment, field))
        assert frozenset().union(*parts) == getattr(assignment, field)


@given(client_work())
def test_totals_and_categories_differ_by_at_most_one(
    work: tuple[ClientAssignment, list[str], set[TaskId]],
) -> None:
    assignment, threads, stateful = work
    check_balanced(
        assignment, stateful, distribute_to_threads(assignment, threads, stateful=stateful)
    )


@given(client_work(), client_work(), st.data())
def test_sticky_when_balance_allows(
    before: tuple[ClientAssignment, list[str], set[TaskId]],
    now: tuple[ClientAssignment, list[str], set[TaskId]],
    data: st.DataObject,
) -> None:
    """A thread that lost a task the client still has in the same role is at its quota."""
    old_assignment, _, _ = before
    assignment, threads, stateful = now
    old_threads = data.draw(st.lists(st.sampled_from(threads), min_size=1, unique=True))
    previous = distribute_to_threads(old_assignment, old_threads, stateful=stateful)
    prev = {th: a.active | a.standby | a.warmup for th, a in previous.items()}
    out = distribute_to_threads(assignment, threads, prev, stateful)
    check_balanced(assignment, stateful, out)
    base = [len(c) // len(threads) for c in categories(assignment, stateful)]
    for th, had in prev.items():
        mine = categories(out[th], stateful)
        for k, cat in enumerate(categories(assignment, stateful)):
            lost = (had & cat) - mine[k]
            if lost:
                assert len(mine[k]) >= base[k], (th, k, lost)
    # Feeding the result back is a fixed point.
    again = {th: a.active | a.standby | a.warmup for th, a in out.items()}
    assert distribute_to_threads(assignment, threads, again, stateful) == out


@given(task_sets(), st.integers(1, 6))
def test_fresh_spreads_each_subtopology_over_threads(tasks: list[TaskId], k: int) -> None:
    out = distribute_to_threads(
        ClientAssignment(active=frozenset(tasks)), [f"t{i}" for i in range(k)]
    )
    for s in {t.subtopology for t in tasks}:
        counts = [sum(t.subtopology == s for t in a.active) for a in out.values()]
        assert max(counts) - min(counts) <= 1


def test_load_carried_across_categories() -> None:
    a = ClientAssignment(active=frozenset({TaskId(0, 0)}), standby=frozenset({TaskId(1, 0)}))
    out = distribute_to_threads(a, ["t1", "t2"])
    assert out["t1"].active == {TaskId(0, 0)} and out["t2"].standby == {TaskId(1, 0)}


def test_bad_thread_lists() -> None:
    with pytest.raises(ValueError, match="at least one thread"):
        distribute_to_threads(ClientAssignment(), [])
    with pytest.raises(ValueError, match="duplicate thread id: 'a'"):
        distribute_to_threads(ClientAssignment(), ["a", "b", "a"])
