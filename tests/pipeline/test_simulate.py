"""The pure simulation: metrics equal the core's, the restore model, peers, determinism."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamassign import (
    ClientAssignment,
    ClientState,
    StickyTaskAssignor,
    Subtopology,
    TaskId,
    TopicPartition,
    Topology,
)
from streamassign.metrics import (
    evaluate,
    evaluate_per_task,
    move_lower_bound,
    subtopology_move_lower_bound,
)
from streamassign.pipeline import (
    COLUMNS,
    RebalanceRow,
    ScenarioModel,
    SimulationJob,
    Workload,
    generate_trace,
    simulate_scenario,
)
from streamassign.pipeline.assignors import GROUPS
from streamassign.pipeline.scenarios import Layout, Member, Return, Step, Trace
from streamassign.pipeline.simulate import (
    _client_state,
    _ConsumerRunner,
    _Context,
    _TaskRunner,
    run_trace,
)

from .conftest import BUSY
from .test_scenarios import WORKLOADS, models

# faust replaces itself in sys.modules without a __spec__ (find_spec then raises): look there first.
HAS_FAUST = "faust" in sys.modules or importlib.util.find_spec("faust") is not None
HAS_AIOKAFKA = "aiokafka" in sys.modules or importlib.util.find_spec("aiokafka") is not None


def without_time(rows: list[RebalanceRow]) -> list[RebalanceRow]:
    return [attrs.evolve(r, assign_ms=0.0) for r in rows]


def test_row_fields_follow_the_schema() -> None:
    assert [a.name for a in attrs.fields(RebalanceRow)] == [c[0] for c in COLUMNS]


@given(
    models(),
    st.sampled_from(WORKLOADS),
    st.integers(0, 1000),
    st.integers(0, 2),
    st.sampled_from(["task:sticky", "faust:copartitioned"] if HAS_FAUST else ["task:sticky"]),
)
def test_fast_evaluate_equals_the_per_task_reference_on_every_simulated_rebalance(
    model: ScenarioModel, workload: Workload, scenario: int, standbys: int, assignor: str
) -> None:
    """The core's set-based ``evaluate`` equals the task-by-task reference on every rebalance
    the pipeline scores, for our assignor and Faust's."""
    job = SimulationJob(
        workload=workload, model=model, assignors=(assignor,), standby_replicas=standbys
    )
    trace = generate_trace(model, workload, scenario)
    seen: list[tuple[Any, ...]] = []
    ctx = _Context(job, trace)
    real = run_trace.__globals__["_make_runner"](assignor, ctx)

    def recording(step, layout, tasks, clients, stateful):  # type: ignore[no-untyped-def]
        result, seconds = real.assign(step, layout, tasks, clients, stateful)
        seen.append((tasks, clients, result, frozenset(stateful)))
        return result, seconds

    runner = _TaskRunner(ctx, assignor, recording)
    rows = [runner.step(s, lay) for s, lay in zip(trace.steps, ctx.layouts, strict=True)]
    assert len(rows) == len(seen) == len(trace.steps)
    for row, (tasks, clients, result, stateful) in zip(rows, seen, strict=True):
        expected = evaluate_per_task(tasks, clients, result, standbys, stateful)
        assert evaluate(tasks, clients, result, standbys, stateful) == expected
        assert (row.moves, row.move_lower_bound) == (expected.moves, expected.move_lower_bound)
        assert row.warm_takeovers == expected.warm_takeovers
        assert row.subtopology_balanced == expected.subtopology_balanced
        assert row.subtopology_imbalance == expected.subtopology_imbalance
        if assignor == "task:sticky":
            # DESIGN §3: valid, balanced, minimal moves, full standby coverage — every time.
            assert row.moves == row.move_lower_bound and row.active_balanced
            assert row.subtopology_balanced and row.subtopology_imbalance <= 1.0
            assert row.standby_coverage == 1.0 and row.unassigned == 0


def test_consumer_rows_score_each_subtopology_over_members(orders: Workload) -> None:
    """Consumer level: a subtopology's units are its tasks, each counted for the member holding
    its first topic's partition."""
    job = SimulationJob(workload=orders, assignors=("consumer:range",))
    trace = generate_trace(job.model, orders, 0)
    ctx = _Context(job, trace)

    def dealing(returns_to_one: bool) -> Any:
        def assign(per_topic, topics, owned):  # type: ignore[no-untyped-def]
            members = sorted(owned)
            out: dict[str, list[TopicPartition]] = {m: [] for m in members}
            dealt = 0  # orders and customers (subtopology 0) dealt as one sequence
            for topic in topics:
                for p in range(per_topic[topic]):
                    if topic == "returns":
                        m = members[0] if returns_to_one else members[p % len(members)]
                    else:
                        m, dealt = members[dealt % len(members)], dealt + 1
                    out[m].append(TopicPartition(topic, p))
            return out, 0.0

        return assign

    step, layout = trace.steps[0], ctx.layouts[0]
    assert step.threads > 1
    even = _ConsumerRunner(ctx, "even", dealing(False)).step(step, layout)
    assert even.subtopology_balanced and even.subtopology_imbalance <= 1.0
    # the 4 returns partitions all on one member: that subtopology's spread is 4 - 0
    lopsided = _ConsumerRunner(ctx, "lopsided", dealing(True)).step(step, layout)
    assert not lopsided.subtopology_balanced and lopsided.subtopology_imbalance == 4.0


JOIN = Topology(
    [Subtopology(0, ["left", "right"], stores=["joined"])],
    copartition_groups=[["left", "right"]],
    name="join",
)


@pytest.mark.parametrize(
    ("assignor", "partitions", "split"),
    [
        # range keeps each task's two partitions together: partitions 6,6,4,4,4 are tasks
        # 3,3,2,2,2 — balanced per subtopology though not in partitions
        ("consumer:range", [6, 6, 4, 4, 4], 0),
        # round robin balances partitions 5,5,5,5,4 by splitting every join; the anchors (its
        # left partitions) still fall 3,3,2,2,2
        ("consumer:roundrobin", [5, 5, 5, 5, 4], 12),
    ],
)
def test_consumer_subtopology_balance_counts_tasks_not_partitions(
    assignor: str, partitions: list[int], split: int
) -> None:
    """Two co-partitioned 12-partition topics over 5 members: the per-subtopology balance is
    over the 12 tasks, so the assignor keeping joins together is not penalised for the
    partitions its tasks bring along; splitting is the split_tasks column's to report."""
    workload = Workload.from_topology(JOIN, {"left": 12, "right": 12})
    members = tuple(Member(f"c{k}", 1, "rack-0") for k in range(5))
    names = tuple(m.pid for m in members)
    layout = workload.initial_layout()
    trace = Trace(0, 0, 0, (Step(0, 0.0, "initial", members, joined=names, layout=layout),))
    job = SimulationJob(workload=workload, assignors=(assignor,))
    counts: list[int] = []
    ctx = _Context(job, trace)
    real = run_trace.__globals__["_make_runner"](assignor, ctx)

    def recording(per_topic, topics, owned):  # type: ignore[no-untyped-def]
        result, seconds = real.assign(per_topic, topics, owned)
        counts.extend(sorted((len(got) for got in result.values()), reverse=True))
        return result, seconds

    row = _ConsumerRunner(ctx, assignor, recording).step(trace.steps[0], layout)
    assert counts == partitions
    assert row.active_balanced == (max(partitions) - min(partitions) <= 1)  # partitions
    assert row.subtopology_balanced
    assert row.subtopology_imbalance == 1.0  # 3 tasks on one member, 2 on another
    assert row.split_tasks == split


@st.composite
def scored_rebalances(draw: st.DrawFn) -> tuple[list[TaskId], list[ClientState], dict[str, Any]]:
    """Tasks of 2-3 subtopologies, clients with disjoint previous actives (some of tasks that no
    longer exist), and an assignment: the sticky assignor's (balanced per subtopology or in total
    only), then changed a few times: tasks of one subtopology swapped between clients (counts
    kept, moves added), a task moved, dropped or copied to a second client (counts broken)."""
    sizes = draw(st.lists(st.integers(1, 7), min_size=2, max_size=3))
    tasks = [TaskId(s, p) for s, n in enumerate(sizes) for p in range(n)]
    caps = draw(st.lists(st.integers(1, 3), min_size=1, max_size=5))
    pids = [f"c{k}" for k in range(len(caps))]
    gone = [TaskId(len(sizes), p) for p in range(2)]  # a subtopology that no longer exists
    owners = draw(st.lists(st.integers(-1, len(caps) - 1), min_size=len(tasks) + 2))
    held: dict[str, set[TaskId]] = {pid: set() for pid in pids}
    for task, owner in zip(tasks + gone, owners, strict=False):
        if owner >= 0:
            held[pids[owner]].add(task)
    clients = [
        ClientState(pid, cap, prev_active=held[pid]) for pid, cap in zip(pids, caps, strict=True)
    ]
    balance = draw(st.sampled_from(["subtopology", "total"]))
    result = StickyTaskAssignor(balance=balance).assign(tasks, clients)
    actives = {pid: set(a.active) for pid, a in result.items()}
    for _ in range(draw(st.integers(0, 3))):
        a, b = draw(st.sampled_from(pids)), draw(st.sampled_from(pids))
        if not actives[a]:
            continue
        task = draw(st.sampled_from(sorted(actives[a])))
        change = draw(st.sampled_from(["swap", "move", "drop", "copy"]))
        if change == "swap":  # with one of b's tasks of the same subtopology
            same = sorted(t for t in actives[b] if t.subtopology == task.subtopology)
            if not same:
                continue
            other = draw(st.sampled_from(same))
            actives[b].remove(other)
            actives[a].add(other)
        if change != "copy":
            actives[a].remove(task)
        if change != "drop":
            actives[b].add(task)
    return tasks, clients, {pid: ClientAssignment(active=ts) for pid, ts in actives.items()}


@given(scored_rebalances())
def test_evaluate_skips_the_flow_only_where_the_assignment_proves_the_bound(
    rebalance: tuple[list[TaskId], list[ClientState], dict[str, Any]],
) -> None:
    """The fast ``evaluate`` takes the per-subtopology move bound from the assignment when that
    is balanced per subtopology, admissible and at the total-only bound; the reference always
    runs the min-cost flow. Both agree on assignments at, above and off the bound. (Only the
    balance and move columns: with a task run twice, the two count takeovers differently.)"""
    tasks, clients, result = rebalance
    fast = evaluate(tasks, clients, result)
    reference = evaluate_per_task(tasks, clients, result)
    moves = ("moves", "move_lower_bound", "subtopology_balanced", "subtopology_imbalance")
    assert [getattr(fast, f) for f in moves] == [getattr(reference, f) for f in moves]
    assert fast.move_lower_bound == subtopology_move_lower_bound(tasks, clients)
    if fast.subtopology_balanced and fast.active_balanced:
        assert fast.moves >= fast.move_lower_bound


@pytest.mark.parametrize(
    ("sizes", "caps", "before", "after", "bound"),
    [
        # 1_2 runs twice: subtopology 1 counts 4 of its 3 tasks (not an admissible matrix).
        (
            [4, 3, 3],
            [1, 3, 2],
            ["1_2 2_1", "1_1 2_0", "2_2"],
            ["1_2 2_1", "0_0 0_2 1_0 1_1 2_0", "0_1 0_3 1_2 2_2"],
            1,
        ),
        # Every cell within its floor and ceiling, but c0 runs 3 tasks and c2 one where 2 each
        # are the total shares.
        ([1, 2, 3], [3, 3, 3], ["0_0 1_0 1_1", "", "2_1"], ["0_0 1_0 2_2", "1_1 2_2", "2_1"], 2),
    ],
)
def test_evaluate_runs_the_flow_when_the_counts_are_not_admissible(
    sizes: list[int], caps: list[int], before: list[str], after: list[str], bound: int
) -> None:
    """Balanced per subtopology and at the total-only bound of moves is not enough to skip the
    flow: each subtopology must be counted exactly once and each client's total be its share
    (found by a random search; the property test above rarely draws them)."""
    tasks = [TaskId(s, p) for s, n in enumerate(sizes) for p in range(n)]
    clients = [
        ClientState(f"c{k}", cap, prev_active=held.split())
        for k, (cap, held) in enumerate(zip(caps, before, strict=True))
    ]
    result = {
        f"c{k}": ClientAssignment(active=frozenset(map(TaskId.parse, ts.split())))
        for k, ts in enumerate(after)
    }
    fast = evaluate(tasks, clients, result)
    assert fast.subtopology_balanced and fast.moves == move_lower_bound(tasks, clients)
    assert fast.move_lower_bound == subtopology_move_lower_bound(tasks, clients) == bound


def test_evaluate_falls_back_to_the_reference_on_duplicate_claims() -> None:
    tasks = [TaskId(0, p) for p in range(4)]
    clients = [
        ClientState("a", prev_active=["0_0", "0_1"]),
        ClientState("b", prev_active=["0_1", "0_2"], lags={"0_1": 5}),
    ]
    result = StickyTaskAssignor(1).assign(tasks, clients)
    stateful = frozenset(tasks)
    assert evaluate(tasks, clients, result, 1, stateful) == evaluate_per_task(
        tasks, clients, result, 1, stateful
    )


def test_client_state_keeps_converted_values_and_still_checks_them() -> None:
    """The core's converters keep TaskId sets as they are (the pipeline's hot path) and still
    validate: a negative lag in an otherwise converted dict is refused."""
    active = frozenset({TaskId(0, 1), TaskId(1, 0)})
    lags = {TaskId(0, 2): 1000}
    state = _client_state("p7", 3, active, frozenset({TaskId(0, 2)}), lags, "rack-1")
    assert state.prev_active is active and state.lags == lags and state.lags is not lags
    with pytest.raises(ValueError, match="lag of task 0_2 must be an int >= 0"):
        ClientState("p7", 3, active, lags={TaskId(0, 2): -1})


def test_scenarios_are_deterministic_and_every_assignor_runs(orders: Workload) -> None:
    names = tuple(
        n
        for n in GROUPS["all"]
        if (HAS_FAUST or not n.startswith("faust")) and (HAS_AIOKAFKA or "aiokafka" not in n)
    )
    job = SimulationJob(workload=orders, model=BUSY, assignors=names, standby_replicas=1)
    for scenario in range(3):
        rows = simulate_scenario(job, scenario)
        assert without_time(rows) == without_time(simulate_scenario(job, scenario))
        assert {r.assignor for r in rows} == set(names)
        assert all(r.error is None for r in rows), [r.error for r in rows if r.error]
        steps = len(generate_trace(BUSY, orders, scenario).steps)
        assert len(rows) == steps * len(names)
        for r in rows:
            assert r.unassigned == 0, r
            if r.level == "consumer":
                assert r.standbys_required is None and r.standby_replicas is None
            if r.assignor in ("consumer:range", "aiokafka:range"):
                assert r.split_tasks == 0  # range keeps co-partitioned partitions together


def test_round_robin_splits_joined_partitions(orders: Workload) -> None:
    job = SimulationJob(workload=orders, model=BUSY, assignors=("consumer:roundrobin",))
    rows = simulate_scenario(job, 0)
    assert max(r.split_tasks for r in rows) > 0


@pytest.mark.skipif(not HAS_AIOKAFKA, reason="aiokafka not installed")
def test_aiokafka_sticky_state_does_not_leak_between_runs(clickstream: Workload) -> None:
    job = SimulationJob(workload=clickstream, model=BUSY, assignors=("aiokafka:sticky",))
    first = without_time(simulate_scenario(job, 1))
    simulate_scenario(job, 2)  # another trace in between, in the same process
    assert without_time(simulate_scenario(job, 1)) == first


@pytest.mark.skipif(not HAS_FAUST, reason="faust-streaming not installed (bench extra)")
def test_faust_restarted_workers_report_no_history(orders: Workload) -> None:
    from streamassign.pipeline.peers import FaustPeer

    layout = orders.initial_layout()
    clients = [ClientState(f"w{k}") for k in range(3)]
    peer = FaustPeer()
    fresh, _ = peer.assign(clients, frozenset(), layout, 1)
    # The interim owners' history: everything moved around by one worker.
    shifted = {f"w{k}": fresh[f"w{(k + 1) % 3}"] for k in range(3)}
    peer.history = {
        pid: {
            s: (
                frozenset(t.partition for t in got.active if t.subtopology == s),
                frozenset(t.partition for t in got.standby if t.subtopology == s),
            )
            for s, _ in layout.task_counts
        }
        for pid, got in shifted.items()
    }
    again, _ = FaustPeer().assign(clients, frozenset(), layout, 1)
    restarted, _ = peer.assign(clients, frozenset(p.process_id for p in clients), layout, 1)
    assert restarted == again == fresh  # all restarted: Faust starts from nothing


# -- the restore-cost model, on a hand-made trace --------------------------------------------------

ONE = Topology([Subtopology(0, ["in"], stores=["s"])], name="one")
FLAT = ScenarioModel(changelog_records=1000, write_rate=1.0, size_skew=0.0, standby_lag_records=10)


def hand_trace(layout: Layout) -> Trace:
    a, b = Member("a", 1, "rack-0"), Member("b", 1, "rack-1")
    return Trace(
        0,
        0,
        0,
        (
            Step(0, 0.0, "initial", (a, b), joined=("a", "b"), layout=layout),
            Step(1, 100.0, "crash", (a,), crashed=("b",)),
            Step(2, 200.0, "recover", (a, b), returning=(Return("b", 100.0, True),)),
            Step(3, 300.0, "rolling_restart", (a, b), returning=(Return("a", 240.0, True),)),
            Step(4, 400.0, "scale_in", (a,), left=("b",)),
        ),
    )


def test_restore_records_follow_the_state_model() -> None:
    workload = Workload.from_topology(ONE, {"in": 4})
    job = SimulationJob(workload=workload, model=FLAT, assignors=("task:sticky",))
    trace = hand_trace(workload.initial_layout())
    rows, takeovers = run_trace(job, trace, "task:sticky", collect=True)
    initial, crash, recover, _restart, leave = rows

    # Fresh deploy: every task restores its whole changelog (1000 records each).
    assert initial.records_to_restore == 4000 and initial.cold_takeovers == 4
    assert {t.cause for t in takeovers[0]} == {"new"}
    # b crashes: a holds standbys of b's two tasks, 10 records behind.
    assert (crash.records_to_restore, crash.restoring_tasks, crash.warm_takeovers) == (20, 2, 2)
    assert [t.cause for t in takeovers[1]] == ["crash", "crash"]
    # b comes back with its disk: two tasks move back to it (the bound), restoring what was
    # written while it was away (100 s at 1 record/s), plus the standby lag for former standbys.
    assert recover.moves == recover.move_lower_bound == 2
    assert recover.warm_takeovers == 2 and 200 <= recover.records_to_restore <= 220
    assert {t.cause for t in takeovers[2]} == {"move"}
    # a restarts (down 60 s): its tasks are restored where state is freshest: a's own disk is
    # 60 records behind, b's standbys 10.
    assert {t.cause for t in takeovers[3]} == {"restart"}
    assert all(t.outage_s == 60.0 and 10 <= t.records <= 60 for t in takeovers[3])
    # b leaves gracefully: a has standbys of b's tasks.
    assert {t.cause for t in takeovers[4]} == {"leave"}
    assert leave.records_to_restore == 20 and leave.cold_takeovers == 0
    assert [r.standby_coverage for r in rows] == [1.0, 1.0, 1.0, 1.0, 1.0]


def test_without_standbys_a_crash_restores_whole_changelogs() -> None:
    workload = Workload.from_topology(ONE, {"in": 4})
    job = SimulationJob(
        workload=workload, model=FLAT, assignors=("task:sticky",), standby_replicas=0
    )
    rows, _ = run_trace(job, hand_trace(workload.initial_layout()), "task:sticky")
    assert rows[1].records_to_restore == 2 * 1100 and rows[1].cold_takeovers == 2


def test_a_failing_assignor_gets_an_error_row_and_stops(orders: Workload) -> None:
    job = SimulationJob(workload=orders, model=BUSY, assignors=("task:sticky",))
    trace = generate_trace(BUSY, orders, 0)
    ctx = _Context(job, trace)
    calls = []

    def flaky(step, layout, tasks, clients, stateful):  # type: ignore[no-untyped-def]
        calls.append(step.index)
        if step.index == 2:
            raise AssertionError("Not enough max_capacity")
        return {c.process_id: ClientAssignment() for c in clients}, 0.0

    runner = _TaskRunner(ctx, "peer", flaky)
    row = None
    for step, layout in zip(trace.steps, ctx.layouts, strict=True):
        row = runner.step(step, layout)
        if row.error:
            break
    assert row is not None and row.error == "AssertionError: Not enough max_capacity"
    assert calls == [0, 1, 2] and row.standbys_placed is None


def test_clickstream_expansion_changes_tasks_and_restores_nothing_for_new_ones(
    clickstream: Workload,
) -> None:
    model = attrs.evolve(BUSY, expansion_per_hour=100.0, steps=4)
    job = SimulationJob(workload=clickstream, model=model, assignors=("task:sticky",))
    trace = generate_trace(model, clickstream, 0)
    rows, takeovers = run_trace(job, trace, "task:sticky", collect=True)
    expansions = [i for i, s in enumerate(trace.steps) if s.event == "partition_expansion"]
    assert expansions
    i = expansions[0]
    assert rows[i].tasks > rows[i - 1].tasks
    new = [t for t in takeovers[i] if t.cause == "new"]
    assert new and all(t.records == 0 for t in new)  # new partitions start empty


@pytest.mark.skipif(not HAS_FAUST, reason="faust-streaming not installed (bench extra)")
def test_the_benchmarks_faust_driver_keeps_what_each_worker_ran() -> None:
    """``FaustDriver`` (the benchmarks' one-group mode): a valid assignment, and a worker's
    history as its ``ClientState`` says it is what Faust keeps when nothing changed."""
    from streamassign.metrics import violations
    from streamassign.pipeline.peers import FaustDriver

    faust = FaustDriver()
    tasks = sorted(TaskId(s, p) for s in range(2) for p in range(6))
    clients = [ClientState(f"w{k}") for k in range(3)]
    first = faust.to_ours(tasks, faust.assign(faust.input_of(tasks, clients), len(tasks), 1))
    assert violations(tasks, clients, first, 1) == []
    again = [
        ClientState(
            c.process_id,
            prev_active=first[c.process_id].active,
            prev_standby=first[c.process_id].standby,
        )
        for c in clients
    ]
    second = faust.to_ours(tasks, faust.assign(faust.input_of(tasks, again), len(tasks), 1))
    assert {p: a.active for p, a in second.items()} == {p: a.active for p, a in first.items()}
