"""Spreading a client's tasks over its threads: balance per category and in total, stickiness."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamassign import ClientAssignment, TaskId
from streamassign.threads import distribute_to_threads

from .strategies import task_sets

thread_ids = st.text("xyz", min_size=1, max_size=3)


@st.composite
def client_work(draw: st.DrawFn) -> tuple[ClientAssignment, list[str], set[TaskId]]:
    tasks = draw(task_sets())
    kinds = draw(st.lists(st.sampled_from("asw-"), min_size=len(tasks), max_size=len(tasks)))
    pick = lambda k: frozenset(t for t, kind in zip(tasks, kinds, strict=True) if kind == k)  # noqa: E731
    threads = draw(st.lists(thread_ids, min_size=1, max_size=6, unique=True))
    stateful = set(draw(st.lists(st.sampled_from(tasks), unique=True)))
    return ClientAssignment(pick("a"), pick("s"), pick("w")), threads, stateful


Rebalance = tuple[ClientAssignment, list[str], set[TaskId], dict[str, frozenset[TaskId]]]


@st.composite
def rebalances(draw: st.DrawFn) -> Rebalance:
    """Client work plus what its threads (some gone since, some new) had after an earlier run."""
    old_assignment, _, _ = draw(client_work())
    assignment, threads, stateful = draw(client_work())
    old_threads = draw(st.lists(st.sampled_from(threads) | thread_ids, min_size=1, unique=True))
    previous = distribute_to_threads(old_assignment, old_threads, stateful=stateful)
    prev = {th: a.active | a.standby | a.warmup for th, a in previous.items()}
    return assignment, threads, stateful, prev


def categories(a: ClientAssignment, stateful: set[TaskId]) -> list[frozenset[TaskId]]:
    """Stateful actives, standbys and warmups, stateless actives: the order they are placed in."""
    return [a.active & stateful, a.standby | a.warmup, a.active - stateful]


def check_balanced(
    work: ClientAssignment, stateful: set[TaskId], out: dict[str, ClientAssignment]
) -> None:
    totals = [a.load for a in out.values()]
    assert max(totals) - min(totals) <= 1
    for k in range(3):
        counts = [len(categories(a, stateful)[k]) for a in out.values()]
        assert max(counts) - min(counts) <= 1, k


def per_category(
    assignment: ClientAssignment, stateful: set[TaskId], out: dict[str, ClientAssignment]
) -> list[tuple[frozenset[TaskId], dict[str, frozenset[TaskId]], dict[str, int]]]:
    """For each category in placement order: its tasks, each thread's share, its load before."""
    so_far = dict.fromkeys(out, 0)
    rows = []
    for k, cat in enumerate(categories(assignment, stateful)):
        got = {th: categories(a, stateful)[k] for th, a in out.items()}
        rows.append((cat, got, dict(so_far)))
        for th in out:
            so_far[th] += len(got[th])
    return rows


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


@given(rebalances())
def test_load_carried_across_categories(work: Rebalance) -> None:
    """A category's larger shares go to threads with no more tasks so far than the others."""
    assignment, threads, stateful, prev = work
    out = distribute_to_threads(assignment, threads, prev, stateful)
    check_balanced(assignment, stateful, out)
    for k, (_, got, so_far) in enumerate(per_category(assignment, stateful, out)):
        for th in threads:
            for other in threads:
                if len(got[other]) > len(got[th]):
                    assert so_far[other] <= so_far[th], (k, other, th)


def test_load_carried_in_placement_order() -> None:
    """Stateful active to t1, standby to t2, so the stateless active goes to t1."""
    a = ClientAssignment(
        active=frozenset({TaskId(0, 0), TaskId(2, 0)}), standby=frozenset({TaskId(1, 0)})
    )
    out = distribute_to_threads(a, ["t1", "t2"], stateful=[TaskId(0, 0)])
    assert out["t1"] == ClientAssignment(active=frozenset({TaskId(0, 0), TaskId(2, 0)}))
    assert out["t2"] == ClientAssignment(standby=frozenset({TaskId(1, 0)}))


@given(rebalances())
def test_sticky_when_balance_allows(work: Rebalance) -> None:
    """A thread that lost a previous task of a category got no new one there; any thread as
    loaded so far that took a larger share of it had at least as many previous tasks in it."""
    assignment, threads, stateful, prev = work
    out = distribute_to_threads(assignment, threads, prev, stateful)
    for k, (cat, got, so_far) in enumerate(per_category(assignment, stateful, out)):
        had = {th: prev.get(th, frozenset()) & cat for th in threads}
        for th in threads:
            if had[th] <= got[th]:
                continue
            assert got[th] <= had[th], (k, th, got[th] - had[th])
            for other in threads:
                if len(got[other]) > len(got[th]) and so_far[other] == so_far[th]:
                    assert len(had[other]) >= len(had[th]), (k, other, th)
    # Feeding the result back is a fixed point.
    again = {th: a.active | a.standby | a.warmup for th, a in out.items()}
    assert distribute_to_threads(assignment, threads, again, stateful) == out


@given(rebalances())
def test_kept_tasks_spread_over_subtopologies(work: Rebalance) -> None:
    """A thread that dropped previous tasks of a subtopology (in a category) kept at most one
    more of any other subtopology there than of that one."""
    assignment, threads, stateful, prev = work
    out = distribute_to_threads(assignment, threads, prev, stateful)
    for k, (cat, got, _) in enumerate(per_category(assignment, stateful, out)):
        for th in threads:
            had = Counter(t.subtopology for t in prev.get(th, frozenset()) & cat)
            kept = Counter(t.subtopology for t in got[th] & prev.get(th, frozenset()))
            for s in had:
                if kept[s] < had[s]:
                    assert max(kept.values(), default=0) <= kept[s] + 1, (k, th, s)


@given(client_work())
def test_fresh_spreads_each_subtopology_over_threads(
    work: tuple[ClientAssignment, list[str], set[TaskId]],
) -> None:
    """Without history, each category's tasks of a subtopology differ by at most one per thread."""
    assignment, threads, stateful = work
    out = distribute_to_threads(assignment, threads, stateful=stateful)
    for k, (cat, got, _) in enumerate(per_category(assignment, stateful, out)):
        for s in {t.subtopology for t in cat}:
            counts = [sum(t.subtopology == s for t in g) for g in got.values()]
            assert max(counts) - min(counts) <= 1, (k, s)


def test_bad_thread_lists() -> None:
    with pytest.raises(ValueError, match="at least one thread"):
        distribute_to_threads(ClientAssignment(), [])
    with pytest.raises(ValueError, match="duplicate thread id: 'a'"):
        distribute_to_threads(ClientAssignment(), ["a", "b", "a"])


@given(rebalances(), st.data())
def test_no_task_on_a_thread_that_refuses_its_id_while_another_may_run_it(
    work: Rebalance, data: st.DataObject
) -> None:
    """Members of one client that may run different ids (processes of two topology versions
    sharing one process id): every task lands once, in its role, on a thread that may run
    it where one may; with every thread refusing the same ids, the plain split."""
    assignment, threads, stateful, prev = work
    ids = st.frozensets(st.integers(0, 3), max_size=3)
    refused = {th: data.draw(ids) for th in threads}
    out = distribute_to_threads(assignment, threads, prev, stateful, refused)
    for field in ("active", "standby", "warmup"):
        parts = [getattr(a, field) for a in out.values()]
        assert sum(len(p) for p in parts) == len(getattr(assignment, field))
        assert frozenset().union(*parts) == getattr(assignment, field)
    for th, got in out.items():
        for task in got.active | got.standby | got.warmup:
            if task.subtopology in refused[th]:
                assert all(task.subtopology in r for r in refused.values()), (th, task)
    same = dict.fromkeys(threads, refused[threads[0]])
    plain = distribute_to_threads(assignment, threads, prev, stateful)
    assert distribute_to_threads(assignment, threads, prev, stateful, same) == plain


def test_threads_that_refuse_an_id_take_the_other_ids_instead() -> None:
    """A client of a shared process id with a v1 and a v2 member: the v1 member may not run id
    0; it gets id 1's tasks, the v2 member id 0's, 6 each, rather than 3 of id 0 it would
    refuse."""
    assignment = ClientAssignment(frozenset(TaskId(s, p) for s in (0, 1) for p in range(6)))
    out = distribute_to_threads(assignment, ["new", "old"], ineligible={"old": {0}})
    assert out["new"].active == {TaskId(0, p) for p in range(6)}
    assert out["old"].active == {TaskId(1, p) for p in range(6)}


@given(rebalances(), st.data())
def test_with_differing_refusals_the_split_is_a_fixed_point(
    work: Rebalance, data: st.DataObject
) -> None:
    """Fed its own output as the previous split (the same assignment, an
    unchanged rebalance), no task moves between threads, whatever the threads refuse."""
    assignment, threads, stateful, prev = work
    refused = {th: data.draw(st.frozensets(st.integers(0, 3), max_size=3)) for th in threads}
    out = distribute_to_threads(assignment, threads, prev, stateful, refused)
    again = {th: a.active | a.standby | a.warmup for th, a in out.items()}
    assert distribute_to_threads(assignment, threads, again, stateful, refused) == out


def test_an_unchanged_rebalance_moves_nothing() -> None:
    """One recorded case of the property above: fed its own output, the split used to move 1_5
    from t2 to t1, 2_7 from t4 to t2 and 0_1 from t3 to t4; now nothing moves."""
    task = lambda s: TaskId(*map(int, s.split("_")))  # noqa: E731
    tasks = lambda *names: frozenset(map(task, names))  # noqa: E731
    assignment = ClientAssignment(
        tasks("0_6", "1_3", "1_4", "1_5"), tasks("0_3", "2_7"), tasks("0_0", "0_1", "0_4")
    )
    refused = {"t0": {0, 1, 2}, "t1": {0}, "t2": {0}, "t3": {1}, "t4": {1}}
    prev = {
        "t0": tasks("0_4", "1_3", "1_4", "1_5", "2_7"),
        "t1": tasks("1_4", "2_7"),
        "t2": tasks("1_4"),
        "t3": tasks("0_4", "1_3"),
        "t4": tasks("0_4", "1_4", "1_5"),
    }
    stateful = tasks("0_4", "1_3", "1_4")
    out = distribute_to_threads(assignment, list(refused), prev, stateful, refused)
    again = {th: a.active | a.standby | a.warmup for th, a in out.items()}
    assert distribute_to_threads(assignment, list(refused), again, stateful, refused) == out


@given(rebalances(), st.data())
def test_refusals_of_ids_no_task_has_leave_the_plain_split(
    work: Rebalance, data: st.DataObject
) -> None:
    """Threads refusing different ids, but only ids of no task here (or ids every thread
    refuses): no thread is better for any task, so the plain split."""
    assignment, threads, stateful, prev = work
    tasks = assignment.active | assignment.standby | assignment.warmup
    absent = st.frozensets(st.integers(10, 13), max_size=3)
    shared = data.draw(
        st.frozensets(st.sampled_from(sorted({t.subtopology for t in tasks}) or [0]))
    )
    refused = {th: data.draw(absent) | shared for th in threads}
    plain = distribute_to_threads(
        assignment, threads, prev, stateful, dict.fromkeys(threads, shared)
    )
    assert distribute_to_threads(assignment, threads, prev, stateful, refused) == plain


def test_a_thread_keeps_what_it_had_where_the_levelling_allows() -> None:
    """With differing refusals a thread keeps the tasks it had and may run; the levelling
    hands over tasks the giver did not have first."""
    assignment = ClientAssignment(frozenset(TaskId(s, p) for s in (0, 1) for p in range(4)))
    prev = {"new": {TaskId(0, 0), TaskId(1, 0)}, "old": {TaskId(0, 1), TaskId(1, 1)}}
    out = distribute_to_threads(assignment, ["new", "old"], prev, ineligible={"old": {0}})
    assert out["new"].active == {TaskId(0, p) for p in range(4)}
    assert out["old"].active == {TaskId(1, p) for p in range(4)}
    # new had 1_0 and 1_1, and with id 0's four tasks has room for one of id 1: one it had.
    prev = {"new": {TaskId(0, 0), TaskId(1, 0), TaskId(1, 1)}, "old": set()}
    bigger = ClientAssignment(assignment.active | {TaskId(1, p) for p in (4, 5)})
    out = distribute_to_threads(bigger, ["new", "old"], prev, ineligible={"old": {0}})
    assert out["new"].load == out["old"].load == 5
    kept = {t for t in out["new"].active if t.subtopology == 1}
    assert len(kept) == 1 and kept <= prev["new"], out
