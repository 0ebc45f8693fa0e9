"""HighAvailabilityTaskAssignor: hold-back, warmups, probing rounds and their convergence."""

from __future__ import annotations

import random
from collections.abc import Mapping

import attrs
import pytest
from hypothesis import HealthCheck, Phase, event, given, seed, settings
from hypothesis import strategies as st

from streamassign import (
    ClientAssignment,
    ClientState,
    HighAvailabilityTaskAssignor,
    StickyTaskAssignor,
    TaskId,
)
from streamassign.errors import AssignmentTypeError
from streamassign.ha import HighAvailabilityPlan
from streamassign.metrics import evaluate, violations
from streamassign.shares import share_bounds
from streamassign.sticky import resolve_previous_owners

from .strategies import assignment_inputs, fresh_clients, task_sets
from .test_sticky import (
    assert_previous_standbys_stay,
    load_rule_breaches,
    orphans_passing_roomy_standby_holders,
    shuffled,
    standby_exchanges_left,
)

ACCEPTABLE = 100
Inputs = tuple[list[TaskId], list[ClientState], int, "list[TaskId] | None"]


def balanced_per_subtopology(
    data: st.DataObject, tasks: list[TaskId], clients: list[ClientState]
) -> list[ClientState]:
    """A history balanced per subtopology and in total: the sticky assignment of a random
    earlier history of the same clients (balanced whatever it came from)."""
    earlier = [
        ClientState(
            c.process_id, c.capacity, data.draw(st.lists(st.sampled_from(tasks), unique=True))
        )
        for c in clients
    ]
    got = StickyTaskAssignor().assign(tasks, earlier)
    return [ClientState(c.process_id, c.capacity, got[c.process_id].active) for c in clients]


def assignor(replicas: int, warmups: int = 2) -> HighAvailabilityTaskAssignor:
    return HighAvailabilityTaskAssignor(replicas, ACCEPTABLE, max_warmup_replicas=warmups)


def caught_up(c: ClientState, t: TaskId, owner: str | None) -> bool:
    """The oracle: runs it, or reports a lag within the acceptable recovery lag."""
    if owner == c.process_id:
        return True
    lag = c.lags.get(t, 0 if t in c.prev_active else None)
    return lag is not None and lag <= ACCEPTABLE


def check_round(
    tasks: list[TaskId],
    clients: list[ClientState],
    replicas: int,
    stateful: list[TaskId] | None,
    plan: HighAvailabilityPlan,
    warmups: int = 2,
) -> None:
    """Invariants of every plan: valid, warmups within budget and beside no copy, actives
    moved only onto caught-up state when some present client is caught up."""
    result = plan.assignment
    assert violations(tasks, clients, result, replicas, stateful) == []
    assert plan.warmups <= warmups
    stateful_set = set(tasks) if stateful is None else set(stateful)
    by_pid = {c.process_id: c for c in clients}
    owners = resolve_previous_owners(tasks, clients)
    now = {t: pid for pid, a in result.items() for t in a.active}
    for pid, a in result.items():
        assert a.warmup <= stateful_set
        assert not a.warmup & (a.active | a.standby)
        for t in a.warmup:  # a warmup sits where its task is held back from
            assert plan.held_back[t] == pid
    for t in sorted(stateful_set & set(tasks)):
        prev = owners.get(t)
        any_ready = any(caught_up(c, t, prev) for c in clients)
        if now[t] != prev and any_ready:
            assert caught_up(by_pid[now[t]], t, prev), (t, prev, now[t])
        elif now[t] != prev:  # nobody caught up: it runs where no copy is much closer
            lags = {c.process_id: c.lags.get(t, 0 if t in c.prev_active else None) for c in clients}
            known = [lag for lag in lags.values() if lag is not None]
            here = lags[now[t]]
            if known:
                assert here is not None and here - min(known) <= ACCEPTABLE, (t, now[t], lags)
    off_target = {t for pid, a in result.items() for t in a.active - plan.target[pid].active}
    assert plan.probing_rebalance_needed == bool(off_target) == bool(plan.held_back)


def next_round(
    clients: list[ClientState], result: Mapping[str, ClientAssignment]
) -> list[ClientState]:
    """The same clients one probing interval later: every replica has caught up."""
    return [
        ClientState(
            c.process_id,
            c.capacity,
            prev_active=result[c.process_id].active,
            prev_standby=result[c.process_id].standby | result[c.process_id].warmup,
            lags=dict.fromkeys(result[c.process_id].standby | result[c.process_id].warmup, 0),
        )
        for c in clients
    ]


def converge(
    tasks: list[TaskId],
    clients: list[ClientState],
    replicas: int,
    stateful: list[TaskId] | None,
    warmups: int = 2,
) -> tuple[int, list[ClientState], HighAvailabilityPlan]:
    """Rounds until no probing is needed: (probing rounds, last clients, last plan)."""
    n_stateful = len(tasks if stateful is None else set(stateful) & set(tasks))
    bound = 2 * n_stateful * (1 + min(replicas, len(clients) - 1))
    ha = assignor(replicas, warmups)
    rounds = 0
    while True:
        plan = ha.plan(tasks, clients, stateful)
        check_round(tasks, clients, replicas, stateful, plan, warmups)
        if not plan.probing_rebalance_needed:
            return rounds, clients, plan
        rounds += 1
        assert rounds <= bound, f"no convergence within {bound} probing rounds"
        clients = next_round(clients, plan.assignment)


def shake(
    data: st.DataObject, settled: list[ClientState], plan: HighAvailabilityPlan, name: str
) -> list[ClientState]:
    """Members of a settled group dropped and added at once: survivors' standbys lag a little
    (caught up) or a lot (not), newcomers (``name`` + a letter) have nothing."""
    keep = data.draw(st.lists(st.booleans(), min_size=len(settled), max_size=len(settled)))
    lag = st.sampled_from([0, ACCEPTABLE, ACCEPTABLE + 1, 50_000])
    survivors = [
        ClientState(
            c.process_id,
            c.capacity,
            prev_active=plan.assignment[c.process_id].active,
            prev_standby=plan.assignment[c.process_id].standby,
            lags={t: data.draw(lag) for t in sorted(plan.assignment[c.process_id].standby)},
        )
        for c, k in zip(settled, keep, strict=True)
        if k
    ]
    added = [
        ClientState(f"{name}{i}", data.draw(st.integers(1, 3)))
        for i in range(data.draw(st.integers(0 if survivors else 1, 3)))
    ]
    return survivors + added


@settings(max_examples=300)
@given(st.data(), task_sets(max_subtopologies=3, max_partitions=8), st.integers(0, 2))
def test_churn_converges_to_a_balanced_stable_assignment_within_the_bound(
    data: st.DataObject, tasks: list[TaskId], replicas: int
) -> None:
    """Two membership changes in a row, each followed by probing rounds in which every placed
    replica catches up; every round keeps the per-round invariants (``check_round``)."""
    stateful = data.draw(st.one_of(st.none(), st.lists(st.sampled_from(tasks), unique=True)))
    warmups = data.draw(st.integers(1, 3))
    clients = data.draw(fresh_clients(max_clients=6))
    for name in ("n", "m", "o"):
        rounds, last, plan = converge(tasks, clients, replicas, stateful, warmups)
        event(f"probing rounds: {min(rounds, 6)}{'+' if rounds > 6 else ''}")
        final = plan.assignment
        assert final == plan.target
        bounds = share_bounds(len(tasks), [c.capacity for c in last])
        for c, (lo, hi) in zip(last, bounds, strict=True):
            assert lo <= len(final[c.process_id].active) <= hi
        assert evaluate(tasks, last, final).subtopology_balanced
        fed = next_round(last, final)
        again = assignor(replicas, warmups).plan(tasks, fed, stateful)
        assert not again.probing_rebalance_needed
        assert again.assignment == final  # a fixed point, standbys included
        clients = shake(data, last, plan, name)


def scale_out(
    tasks: list[TaskId], old: list[ClientState], new: list[ClientState], warmups: int
) -> tuple[int, int]:
    """``old`` settle all of ``tasks`` (all stateful, no standbys), then ``new`` join with
    nothing: (probing rounds until nothing is held back, tasks the last round has moved)."""
    settled = assignor(0, warmups).assign(tasks, old)
    history = [ClientState(c.process_id, c.capacity, settled[c.process_id].active) for c in old]
    rounds, _, plan = converge(tasks, history + new, 0, None, warmups)
    return rounds, evaluate(tasks, history + new, plan.assignment, 0).moves


# A twentieth of the profile's examples: 100 in CI, 2,500 in the deep profile.
@settings(max_examples=max(10, settings.default.max_examples // 20))
@given(st.data(), task_sets(max_subtopologies=2, max_partitions=12), st.integers(1, 3))
def test_a_scale_out_without_standbys_takes_one_round_per_warmup_budget(
    data: st.DataObject, tasks: list[TaskId], warmups: int
) -> None:
    """All stateful, no standbys, new clients with nothing: each probing round moves at most
    ``warmups`` tasks, and at most one round more than ``ceil(moves / warmups)`` is needed."""
    old = data.draw(fresh_clients(max_clients=3))
    new = [
        ClientState(f"new{i}", data.draw(st.integers(1, 3)))
        for i in range(data.draw(st.integers(1, 3)))
    ]
    rounds, moves = scale_out(tasks, old, new, warmups)
    need = -(-moves // warmups)
    event(f"rounds - ceil(moves / warmups): {rounds - need}")
    assert need <= rounds <= need + 1


@pytest.mark.parametrize(
    ("partitions", "old", "new", "warmups"),
    [
        # The random search's shrunk counterexample: 5 rounds where 3 do. The spare ceilings of
        # the uneven shares went to whichever joiner the interim counts favoured, so the copy
        # a round had warmed up was passed over for a cold joiner, round after round.
        pytest.param([2, 12], [("a", 1), ("b", 3), ("aa", 4)], [2, 3, 2], 2, id="hypothesis"),
        # The smallest such input: 4 rounds where 2 do.
        pytest.param([3, 2], [("a", 1)], [3, 2, 1], 2, id="smallest"),
        # Two old owners at equal counts took turns keeping their extra task: the one whose
        # task had just been warmed up kept it (5 rounds where 3 do); needs a give-back.
        pytest.param(
            [8, 6, 6], [("g", 1), ("e", 2), ("h", 2), ("ab", 3)], [3, 4], 3, id="give-back"
        ),
        # The warm joiner had room but the cold one sat at its floor: another joiner with one
        # to spare hands the cold one a task instead (6 rounds where 5 do).
        pytest.param([2, 14], [("h", 2), ("f", 2)], [4, 2, 1, 1], 2, id="slack"),
    ],
)
def test_a_scale_out_spends_no_warmup_twice(
    partitions: list[int], old: list[tuple[str, int]], new: list[int], warmups: int
) -> None:
    """Regression: inputs where each round's target, recomputed from the interim history, sent
    a task the last round had warmed up elsewhere; now every round moves a full warmup budget."""
    tasks = [TaskId(s, p) for s, n in enumerate(partitions) for p in range(n)]
    rounds, moves = scale_out(
        tasks,
        [ClientState(pid, capacity) for pid, capacity in old],
        [ClientState(f"new{i}", capacity) for i, capacity in enumerate(new)],
        warmups,
    )
    assert rounds == -(-moves // warmups)


@settings(max_examples=100)
@given(st.data(), task_sets(), fresh_clients(), st.integers(0, 2))
def test_an_arbitrary_balanced_history_is_not_reshuffled(
    data: st.DataObject, tasks: list[TaskId], clients: list[ClientState], replicas: int
) -> None:
    """Any balanced assignment of the actives (not only one this assignor made) is its own
    target: no active moves, nothing is held back. Balanced in total for ``balance="total"``;
    for the default, per subtopology too (a history drawn balanced in total is rejected
    unless it happens to be)."""
    bounds = share_bounds(len(tasks), [c.capacity for c in clients])
    counts = [lo for lo, _ in bounds]
    extra = [i for i, (lo, hi) in enumerate(bounds) if hi > lo]
    for i in data.draw(st.permutations(extra))[: len(tasks) - sum(counts)]:
        counts[i] += 1
    order = data.draw(st.permutations(tasks))
    history, start = [], 0
    for c, n in zip(clients, counts, strict=True):
        history.append(ClientState(c.process_id, c.capacity, order[start : start + n]))
        start += n
    balance = data.draw(st.sampled_from(["subtopology", "total"]))
    if balance == "subtopology":
        by_history = {c.process_id: ClientAssignment(c.prev_active) for c in history}
        if not evaluate(tasks, history, by_history).subtopology_balanced:
            history = balanced_per_subtopology(data, tasks, clients)
    plan = attrs.evolve(assignor(replicas), balance=balance).plan(tasks, history)
    assert not plan.probing_rebalance_needed
    assert {p: a.active for p, a in plan.assignment.items()} == {
        c.process_id: c.prev_active for c in history
    }


@given(assignment_inputs(), st.integers(1, 3))
def test_every_plan_is_valid_within_budget_and_moves_only_onto_caught_up_state(
    inputs: Inputs, warmups: int
) -> None:
    tasks, clients, replicas, stateful = inputs
    plan = assignor(replicas, warmups).plan(tasks, clients, stateful)
    check_round(tasks, clients, replicas, stateful, plan, warmups)


@given(assignment_inputs())
def test_target_keeps_the_sticky_counts_moves_and_loads(inputs: Inputs) -> None:
    """The target is the sticky assignment up to exchanges and shifts that keep every client's
    active count within its floor and ceiling (where the sticky assignment's is) and the number
    of moves, with standbys placed for its actives (the sticky ones where no active moved;
    the load rule is ``assert_target_guarantees``'); everything else in the plan follows it."""
    tasks, clients, replicas, stateful = inputs
    plan = assignor(replicas).plan(tasks, clients, stateful)
    sticky = StickyTaskAssignor(replicas, ACCEPTABLE).assign(tasks, clients, stateful)
    assert violations(tasks, clients, plan.target, replicas, stateful) == []
    caps = [c.capacity for c in clients]
    active_bounds = share_bounds(len(tasks), caps)
    for c, (lo, hi) in zip(clients, active_bounds, strict=True):
        ours, theirs = plan.target[c.process_id], sticky[c.process_id]
        assert not ours.warmup
        if len(ours.active) != len(theirs.active):
            assert lo <= len(ours.active) <= hi
    if all(plan.target[p].active == a.active for p, a in sticky.items()):
        assert plan.target == sticky
    ours = evaluate(tasks, clients, plan.target, replicas, stateful)
    theirs = evaluate(tasks, clients, sticky, replicas, stateful)
    assert ours.moves == theirs.moves and ours.active_balanced == theirs.active_balanced
    assert ours.subtopology_balanced == theirs.subtopology_balanced
    for pid, a in plan.assignment.items():
        moved_in = a.active - plan.target[pid].active
        assert all(t in plan.held_back for t in moved_in)
        assert all(plan.held_back[t] != pid for t in moved_in)


def assert_target_guarantees(
    inputs: Inputs,
    plan: HighAvailabilityPlan,
    balance: str = "subtopology",
    computed_from: list[ClientState] | None = None,
) -> None:
    """The sticky guarantees docs/assignor.md gives the HA target (1-6, and 7's per-subtopology
    standby evening), and the plan's assignment is the target when nothing is held back.

    ``computed_from``: the history of the round that computed a target the leader carried
    over (``last_plan``); its moves are the least from that history, not necessarily
    from this one (rule 8 of docs/ha.md). Every other guarantee holds from this one."""
    tasks, clients, replicas, stateful = inputs
    target = plan.target
    assert violations(tasks, clients, target, replicas, stateful) == []  # 1
    m = evaluate(tasks, clients, target, replicas, stateful, balance=balance)  # type: ignore[arg-type]
    assert m.active_balanced  # 2
    assert m.subtopology_balanced or balance == "total"
    assert load_rule_breaches(inputs, target) == []  # 3
    if computed_from is not None:
        m = evaluate(tasks, computed_from, target, replicas, stateful, balance=balance)  # type: ignore[arg-type]
    assert m.moves == m.move_lower_bound  # 4
    # 5, with caught-up state first: an orphan may go to a client caught up on it rather
    # than to a standby holder that is not (rule 3 of docs/ha.md)
    owners = resolve_previous_owners(tasks, clients)
    by_pid = {c.process_id: c for c in clients}
    passed = [
        (t, p, h)
        for t, p, h in orphans_passing_roomy_standby_holders(tasks, clients, target)
        if not caught_up(by_pid[p], t, owners.get(t)) or caught_up(by_pid[h], t, owners.get(t))
    ]
    assert passed == []
    assert_previous_standbys_stay(inputs, target)  # 6
    if balance == "subtopology":
        assert standby_exchanges_left(tasks, clients, target) == []  # 7
    if not plan.probing_rebalance_needed:
        assert plan.assignment == target


# A quarter of the profile's examples: 50 in dev, 500 in CI.
@settings(max_examples=max(10, settings.default.max_examples // 4))
@given(assignment_inputs(), st.integers(1, 3), st.sampled_from(["subtopology", "total"]))
def test_every_target_keeps_the_sticky_guarantees(
    inputs: Inputs, warmups: int, balance: str
) -> None:
    """Arbitrary histories (fresh, the assignor's own on other members, duplicate and stale
    claims, random standbys and lags): the target, and a plan holding nothing back, meet
    guarantees 1-7 of docs/assignor.md as the sticky assignor does."""
    tasks, clients, replicas, stateful = inputs
    ha = attrs.evolve(assignor(replicas, warmups), balance=balance)
    assert_target_guarantees(inputs, ha.plan(tasks, clients, stateful), balance)


def test_a_chain_leaves_no_orphan_cold_below_a_roomy_standby_holder() -> None:
    """Regression (guarantee 5, shrunk from a random history): a chain puts 1_1 on c7, which
    ran it too and is caught up (c1 won the claim), taking a give-back's spare task from c3.
    That left c0 at its ceiling holding the orphan 0_3 with no state while c3, a standby
    holder of it, had room again; the target now hands 0_3 to c3."""
    ts = lambda names: [TaskId.parse(n) for n in names.split()]  # noqa: E731
    tasks = ts("0_3 1_0 1_1 1_3 1_4 1_5 1_6 1_8 1_9 1_10 1_11")
    stateful = ts("0_3 1_0 1_1 1_3")
    clients = [
        ClientState("c0", 1),
        ClientState("c1", 2, prev_active=ts("1_1 1_5 1_10"), prev_standby=ts("0_3")),
        ClientState("c3", 4, prev_standby=ts("0_3")),
        ClientState("c4", 1, prev_standby=ts("1_3 1_5")),
        ClientState("c7", 4, ts("1_1 1_6"), (), {TaskId(1, 8): 5000, TaskId(1, 11): 3992}),
    ]
    plan = assignor(2).plan(tasks, clients, stateful)
    assert TaskId.parse("1_1") in plan.target["c7"].active  # the chain still serves the copy
    assert TaskId.parse("0_3") in plan.target["c3"].active
    assert_target_guarantees((tasks, clients, 2, stateful), plan)


def test_an_exchange_leaves_no_orphan_cold_below_a_roomy_standby_holder() -> None:
    """Regression (guarantee 5, shrunk from a random history, balancing totals): to keep 3_1
    on its running owner c5, the exchange handed c3 the orphan 0_0 in return, which c5 holds
    a standby of and c3 has no state of, though c5 still had room below its ceiling."""
    ts = lambda names: [TaskId.parse(n) for n in names.split()]  # noqa: E731
    tasks = ts("0_0 0_4 0_5 0_6 0_7 1_1 1_2 1_3 2_0 3_0 3_1 3_2 3_3 3_4 3_5 3_6")
    clients = [
        ClientState("c2", 2),
        ClientState("c3", 1, prev_standby=ts("3_1 3_2")),
        ClientState("c4", 1, prev_active=ts("0_7 1_2 3_1 3_3")),
        ClientState("c5", 2, prev_active=ts("3_1"), prev_standby=ts("0_0")),
    ]
    ha = HighAvailabilityTaskAssignor(3, ACCEPTABLE, max_warmup_replicas=3, balance="total")
    plan = ha.plan(tasks, clients)
    assert {TaskId.parse("0_0"), TaskId.parse("3_1")} <= plan.target["c5"].active
    assert_target_guarantees((tasks, clients, 3, None), plan, "total")


def test_an_exchange_keeps_the_load_rule() -> None:
    """Issue 22's shrunk counterexample (balancing totals): the exchange hands p006 the
    stateless 4_8 for 6_23, which p001 runs. Standbys placed for the actives before the
    exchange left p005 at load 3 (ceiling 2) holding 6_23 while p006 sat at 5 (floor 7) with
    no copy of it, and the next rebalance moved that standby: not a fixed point."""
    ids = TaskId.parse
    tasks = [ids(t) for t in ("6_3", "6_4", "6_5", "6_22", "6_23", "4_8")]
    stateful = [t for t in tasks if t.subtopology == 6]
    clients = [
        ClientState("p001", 1, prev_active=[ids("4_8"), ids("6_23")]),
        ClientState(
            "p005",
            1,
            prev_standby=[ids("6_22"), ids("6_23")],
            lags={ids("6_22"): 639, ids("6_23"): 983},
        ),
        ClientState("p006", 4),
    ]
    ha = HighAvailabilityTaskAssignor(1, 1000, max_warmup_replicas=1, balance="total")
    plan = ha.plan(tasks, clients, stateful)
    assert not plan.probing_rebalance_needed
    assert ids("6_23") in plan.assignment["p001"].active  # the exchange: no warmup needed
    assert_target_guarantees((tasks, clients, 1, stateful), plan, "total")
    fed = next_round(clients, plan.assignment)
    assert ha.plan(tasks, fed, stateful).assignment == plan.assignment


def warmups_wanted(plan: HighAvailabilityPlan) -> int:
    """Held-back tasks that need a warmup: those whose target holds no standby of them (a role
    swap warms the target up as a standby, without the budget)."""
    return sum(1 for t, dest in plan.held_back.items() if t not in plan.assignment[dest].standby)


@st.composite
def cluster_events(draw: st.DrawFn, clients: list[ClientState], tasks: list[TaskId]) -> str:
    """One of Kafka Streams' TaskAssignorConvergenceTest perturbations, as a name."""
    kinds = ["add client", "add tasks", "lag change"]
    if len(clients) > 1:
        kinds += ["drop client", "replace client"]
    if len(tasks) > 1:
        kinds.append("drop tasks")
    return draw(st.sampled_from(kinds))


def perturb(
    data: st.DataObject,
    event_name: str,
    tasks: list[TaskId],
    stateful: list[TaskId],
    clients: list[ClientState],
    fresh_name: str,
) -> tuple[list[TaskId], list[TaskId], list[ClientState]]:
    """(tasks, stateful, clients) after ``event_name`` on a settled group."""
    if event_name in ("drop client", "replace client"):
        gone = data.draw(st.sampled_from(clients))
        clients = [c for c in clients if c is not gone]
    if event_name in ("add client", "replace client"):
        clients = [*clients, ClientState(fresh_name, data.draw(st.integers(1, 4)))]
    if event_name == "add tasks":
        sub = data.draw(st.integers(0, 1 + max(t.subtopology for t in tasks)))
        start = 1 + max((t.partition for t in tasks if t.subtopology == sub), default=-1)
        new = [TaskId(sub, p) for p in range(start, start + data.draw(st.integers(1, 4)))]
        same_kind = [t for t in tasks if t.subtopology == sub]
        if (same_kind[0] in stateful) if same_kind else data.draw(st.booleans()):
            stateful = stateful + new
        tasks = sorted(tasks + new)
    if event_name == "drop tasks":
        dropped = set(
            data.draw(st.lists(st.sampled_from(tasks), min_size=1, max_size=len(tasks) - 1))
        )
        tasks = [t for t in tasks if t not in dropped]
        stateful = [t for t in stateful if t not in dropped]
    if event_name == "lag change":
        who = data.draw(st.sampled_from(clients))
        lag = st.sampled_from([0, ACCEPTABLE, ACCEPTABLE + 1, 50_000])
        lags = {t: data.draw(lag) for t in sorted(who.prev_standby)}
        clients = [attrs.evolve(c, lags=lags) if c is who else c for c in clients]
    return tasks, stateful, clients


#: A convergence of ``perturbed_cluster_rounds`` past the tight bound: what its first round
#: planned from (tasks, clients, stateful, standby replicas, warmup budget).
OverBound = tuple[list[TaskId], list[ClientState], list[TaskId], int, int]


def perturbed_cluster_rounds(
    data: st.DataObject, tasks: list[TaskId], replicas: int, carry: bool = True
) -> list[OverBound]:
    """Kafka Streams' TaskAssignorConvergenceTest, in hypothesis: a random cluster, then a
    chain of perturbations (clients added, dropped or replaced, tasks added or dropped, a
    client's standbys falling behind), each followed by probing rounds in which every replica
    catches up (``converge_perturbed``); the converged assignment fed back changes nothing,
    standbys included, whether the leader stays (it carries its last target over) or not.
    Returns the convergences that took more rounds than the tight bound,
    ``ceil(tasks needing warmups / warmups) + 1``. ``carry``: whether the probing rounds of
    ``converge_perturbed`` pass the last target on (a leader that stays)."""
    stateful = [t for t in tasks if data.draw(st.booleans(), label=f"stateful {t.subtopology}")]
    stateful = [t for t in tasks if any(u.subtopology == t.subtopology for u in stateful)]
    warmups = data.draw(st.integers(1, 3))
    ha = assignor(replicas, warmups)
    clients = data.draw(fresh_clients(max_clients=5))
    events = data.draw(st.integers(1, 4))
    over: list[OverBound] = []
    for step in range(events + 1):
        start: OverBound = (tasks, clients, stateful, replicas, warmups)
        rounds, bound, clients, plan = converge_perturbed(
            ha, tasks, clients, replicas, stateful, carry
        )
        event(f"probing rounds: {rounds} of at most {bound}")
        if rounds > bound:
            over.append(start)
        settled = next_round(clients, plan.assignment)
        for last_plan in (None, plan):  # a new leader, the same leader
            again = ha.plan(tasks, settled, stateful, last_plan=last_plan)
            assert again.assignment == plan.assignment and not again.probing_rebalance_needed
        if step == events:
            break
        name = data.draw(cluster_events(settled, tasks))
        event(name)
        tasks, stateful, clients = perturb(data, name, tasks, stateful, settled, f"n{step}")
    return over


def converge_perturbed(
    ha: HighAvailabilityTaskAssignor,
    tasks: list[TaskId],
    clients: list[ClientState],
    replicas: int,
    stateful: list[TaskId],
    carry: bool = True,
) -> tuple[int, int, list[ClientState], HighAvailabilityPlan]:
    """Probing rounds until nothing is held back, every round keeping the per-round invariants
    and every target the sticky guarantees, within the loose bound of ``converge``:
    (rounds, the tight bound of the first round, last clients, last plan). ``carry``: the
    leader stays and passes each plan to the next (``last_plan``)."""
    loose = 2 * len(stateful) * (1 + min(replicas, len(clients) - 1))
    warmups = ha.max_warmup_replicas
    plan = ha.plan(tasks, clients, stateful)
    tight = -(-warmups_wanted(plan) // warmups) + 1
    rounds = 0
    computed_from = None  # the history of a carried target
    while True:
        check_round(tasks, clients, replicas, stateful, plan, warmups)
        inputs = (tasks, clients, replicas, stateful)
        assert_target_guarantees(inputs, plan, computed_from=computed_from)
        if not plan.probing_rebalance_needed:
            return rounds, tight, clients, plan
        rounds += 1
        assert rounds <= loose, f"no convergence within {loose} probing rounds"
        last_clients, last_plan = clients, plan if carry else None
        clients = next_round(clients, plan.assignment)
        plan = ha.plan(tasks, clients, stateful, last_plan=last_plan)
        carried = last_plan is not None and plan.target == last_plan.target
        computed_from = (computed_from or last_clients) if carried else None


# A tenth of the profile's examples: 20 in dev, 200 in CI, 5,000 in the deep profile.
@settings(max_examples=max(10, settings.default.max_examples // 10))
@given(st.data(), task_sets(max_subtopologies=3, max_partitions=8), st.integers(0, 2))
def test_random_cluster_perturbations_converge(
    data: st.DataObject, tasks: list[TaskId], replicas: int
) -> None:
    """Perturbed clusters converge (``perturbed_cluster_rounds``), every round and target
    keeping its guarantees, to a fixed point, within the tight bound when the leader stays."""
    assert perturbed_cluster_rounds(data, tasks, replicas) == []


#: The fixed set: OVER_BOUND_EXAMPLES examples drawn from OVER_BOUND_SEED, whatever the profile.
OVER_BOUND_EXAMPLES = 1000
OVER_BOUND_SEED = 22
#: Convergences of that set past the tight bound when every round's leader plans afresh, as
#: measured (2026-11-26; 3 before the per-subtopology standby placement and the hand-backs to
#: owners holding a target standby). A leader that stays meets the bound in every one.
OVER_BOUND_NEW_LEADERS = 0


@pytest.mark.parametrize("carry", [True, False], ids=["leader-stays", "new-leaders"])
def test_perturbed_clusters_within_the_warmup_bound(carry: bool) -> None:
    """The tight bound of ``perturbed_cluster_rounds`` on a fixed seeded set of perturbed
    clusters: met in every one when the leader stays and carries its last target; when
    every round's leader plans afresh it is not met in rare cases (docs/ha.md), and no more
    than measured (fewer is progress: lower ``OVER_BOUND_NEW_LEADERS``)."""
    over: list[OverBound] = []

    @seed(OVER_BOUND_SEED)
    @settings(
        max_examples=OVER_BOUND_EXAMPLES,
        database=None,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.data(), task_sets(max_subtopologies=3, max_partitions=8), st.integers(0, 2))
    def fixed_set(data: st.DataObject, tasks: list[TaskId], replicas: int) -> None:
        over.extend(perturbed_cluster_rounds(data, tasks, replicas, carry))

    fixed_set()
    assert len(over) <= (0 if carry else OVER_BOUND_NEW_LEADERS), over


def test_a_former_convergence_past_the_warmup_bound_now_meets_it() -> None:
    """Regression, a counterexample of the tight bound from the seeded search: n0 joins; the
    first round holds back only role swaps (bound: 1 probing round), yet convergence took 2.
    The second round's target moved 0_5 from dgf to n0 cold instead of keeping the first
    round's target: the chain restoring it hands 0_5 back to dgf, which the target gave
    0_5's standby, and hand-backs to such an owner were refused."""
    tasks = [TaskId(0, p) for p in range(7)]
    clients = [
        caught_up_client("c", 4, "0_0 0_3 0_6", "0_1 0_2 0_4 0_5"),
        caught_up_client("dgf", 2, "0_2 0_5", "0_6"),
        ClientState("n0", 3),
    ]
    rounds, bound, _, _ = converge_perturbed(assignor(1, 1), tasks, clients, 1, tasks)
    assert rounds <= bound


def test_an_orphan_held_back_in_a_role_swap_meets_the_tight_bound_when_the_leader_stays() -> None:
    """Shrunk counterexample of the tight bound (seed 11 search), a strict expected failure
    before leaders carried their last target: the orphans 0_4 and 2_4 go cold to d and c, so
    round 0 holds them back on their standby holders c and b in role swaps (no warmup: bound
    1). c and b then run them: from round 1's history the round-0 target moves 2 tasks where
    a balanced assignment moving 1 exists (0_6 from b to d, onto no state), so every
    move-minimal target needs a warmup. The leader that stays passes the round-0 target on,
    still valid and needing no warmup: 1 round. A new leader recomputes: 2 rounds, the one
    round more documented for a leader change."""
    tasks, clients = orphans_held_back_in_role_swaps()
    rounds, bound, _, last = converge_perturbed(assignor(1, 1), tasks, clients, 1, tasks)
    assert (rounds, bound) == (1, 1)
    assert last.target == assignor(1, 1).plan(tasks, clients).target  # round 0's, carried
    new_leader = converge_perturbed(assignor(1, 1), tasks, clients, 1, tasks, carry=False)
    assert new_leader[:2] == (2, 1)


def orphans_held_back_in_role_swaps() -> tuple[list[TaskId], list[ClientState]]:
    """Tasks and clients of the shrunk counterexample of the tight bound (seed 11 search)."""
    ts = "0_0 0_1 0_2 0_3 0_4 0_5 0_6 1_0 1_1 2_0 2_1 2_2 2_3 2_4"
    clients = [
        caught_up_client("a", 2, "0_2 1_0", "0_6 1_1"),
        caught_up_client("aa", 4, "0_0 0_5 1_1 2_1", "0_1 0_2 2_0"),
        caught_up_client("b", 3, "0_1 0_6 2_2", "1_0 2_4"),
        caught_up_client("c", 3, "0_3 2_0", "0_4 0_5 2_2"),
        caught_up_client("d", 2, "2_3", "0_0 2_1"),
    ]
    return [TaskId.parse(t) for t in ts.split()], clients


def caught_up_client(pid: str, capacity: int, runs: str, holds: str) -> ClientState:
    """A client one probing round later: it runs ``runs`` and holds ``holds`` at lag 0."""
    held = [TaskId.parse(t) for t in holds.split()]
    return ClientState(
        pid, capacity, [TaskId.parse(t) for t in runs.split()], held, dict.fromkeys(held, 0)
    )


@pytest.mark.parametrize(
    ("partitions", "clients", "kept"),
    [
        # aa, which ran 0_1 and 0_5, left; c, holding both warm but full, ran them meanwhile
        # while a and b warmed up as standbys (role swaps). The new target had c keep 0_5 and
        # send 0_7 to b cold: a target standby of 0_5 on b hid b's caught-up copy from chains.
        pytest.param(
            [8],
            [
                caught_up_client("a", 3, "0_0 0_4", "0_1 0_2 0_6 0_7"),
                caught_up_client("b", 3, "0_2 0_6", "0_0 0_3 0_4 0_5"),
                caught_up_client("c", 2, "0_1 0_3 0_5 0_7", ""),
            ],
            {},
            id="copy-under-a-target-standby",
        ),
        # n0 replaced a process that ran 0_2 and 1_2, and warmed 0_2 up; the new target had b
        # keep 0_2 and send 1_3 to n0 cold: only an exchange across subtopologies keeps n0's
        # warm 0_2 and both cells of both processes within floor and ceiling.
        pytest.param(
            [7, 5],
            [
                caught_up_client("b", 3, "0_0 0_2 0_5 1_0 1_3", "0_1 1_1 1_4"),
                caught_up_client("c", 1, "0_3", "0_6 1_2"),
                caught_up_client("d", 1, "0_4", "1_3"),
                caught_up_client("e", 4, "0_1 0_6 1_1 1_2 1_4", "0_0 0_3 0_4 1_0"),
                caught_up_client("n0", 1, "", "0_2 0_5"),
            ],
            {"n0": "0_2", "c": "1_2"},
            id="exchange-across-subtopologies",
        ),
    ],
)
def test_a_still_valid_target_is_kept(
    partitions: list[int], clients: list[ClientState], kept: dict[str, str]
) -> None:
    """Regression (the convergence property, issue 22): the round before placed role swaps
    only; its target is still balanced and move-minimal and needs no warmup, so this round
    converges to it instead of starting a new warmup (one probing round more)."""
    tasks = [TaskId(s, p) for s, n in enumerate(partitions) for p in range(n)]
    plan = assignor(1, warmups=1).plan(tasks, clients)
    check_round(tasks, clients, 1, None, plan, warmups=1)  # every move onto caught-up state
    assert not plan.probing_rebalance_needed
    for pid, task in kept.items():
        assert TaskId.parse(task) in plan.assignment[pid].active
    assert_target_guarantees((tasks, clients, 1, None), plan)


def test_a_stateless_task_goes_instead_of_a_stateful_one_on_cold_state() -> None:
    """b joins; the sticky target hands it stateful tasks of a. Balancing totals only, a keeps
    those and gives b its stateless tasks instead: balanced at once, no warmup, no probing
    rebalance. Balanced per subtopology (the default) b must run two of each subtopology: it
    gets two stateless tasks now and warms up two stateful ones, which a runs meanwhile."""
    stateful = [TaskId(0, p) for p in range(4)]
    stateless = [TaskId(1, p) for p in range(4)]
    a = ClientState("a", prev_active=stateful + stateless)
    clients = [a, ClientState("b")]
    total_only = attrs.evolve(assignor(0), balance="total")
    plan = total_only.plan(stateful + stateless, clients, stateful)
    sticky = StickyTaskAssignor(0, balance="total").assign(stateful + stateless, clients, stateful)
    assert sticky["b"].active & set(stateful)  # what the plain sticky assignor would move
    assert plan.assignment["b"].active == set(stateless)
    assert plan.assignment == plan.target and not plan.probing_rebalance_needed

    plan = assignor(0).plan(stateful + stateless, clients, stateful)
    got = plan.assignment["b"]
    assert len(got.active) == 2 and got.active <= set(stateless)
    assert len(got.warmup) == 2 and got.warmup <= set(stateful)
    assert plan.target["b"].active == got.active | got.warmup
    assert plan.probing_rebalance_needed


@given(task_sets(), fresh_clients(), st.integers(0, 2), st.integers(0, 2 * ACCEPTABLE))
def test_a_balanced_caught_up_assignment_is_not_reshuffled(
    tasks: list[TaskId], clients: list[ClientState], replicas: int, lag: int
) -> None:
    """Fed back as history (standbys at any lag), a balanced assignment stays exactly as it is."""
    first = assignor(replicas).assign(tasks, clients)
    history = [
        ClientState(
            c.process_id,
            c.capacity,
            prev_active=first[c.process_id].active,
            prev_standby=first[c.process_id].standby,
            lags=dict.fromkeys(first[c.process_id].standby, lag),
        )
        for c in clients
    ]
    plan = assignor(replicas).plan(tasks, history)
    assert not plan.probing_rebalance_needed
    assert plan.assignment == first


@given(assignment_inputs(), st.randoms(use_true_random=False))
def test_deterministic_whatever_the_input_order(inputs: Inputs, rnd: random.Random) -> None:
    tasks, clients, replicas, stateful = inputs
    plan = assignor(replicas, 1).plan(tasks, clients, stateful)
    shuffled_stateful = None if stateful is None else rnd.sample(stateful, len(stateful))
    again = assignor(replicas, 1).plan(
        rnd.sample(tasks, len(tasks)), shuffled(clients, rnd), shuffled_stateful
    )
    assert again == plan


# -- worked examples ---------------------------------------------------------------------------

T = [TaskId(0, p) for p in range(6)]


def test_new_client_warms_up_then_takes_over_with_no_restore() -> None:
    """a and b run three tasks each; c joins empty. The sticky target gives c two tasks; they
    stay where they run, c warms both up; one probing round later c takes them over warm."""
    a = ClientState("a", prev_active=T[:3])
    b = ClientState("b", prev_active=T[3:])
    c = ClientState("c")
    ha = assignor(0)
    plan = ha.plan(T, [a, b, c])
    assert plan.assignment["c"].active == frozenset()
    assert len(plan.assignment["c"].warmup) == 2
    assert plan.assignment["a"].active == frozenset(T[:3])
    assert plan.assignment["b"].active == frozenset(T[3:])
    assert plan.held_back.keys() == plan.assignment["c"].warmup
    assert plan.probing_rebalance_needed
    probe = ha.plan(T, next_round([a, b, c], plan.assignment))
    assert not probe.probing_rebalance_needed
    assert probe.assignment["c"].active == plan.assignment["c"].warmup


def test_warmup_budget_spreads_a_big_takeover_over_probing_rounds() -> None:
    tasks = [TaskId(0, p) for p in range(12)]
    clients = [ClientState("a", prev_active=tasks), ClientState("b"), ClientState("c")]
    rounds, _, plan = converge(tasks, clients, 0, None, warmups=2)
    assert rounds == 4  # 8 tasks to move, 2 warmups at a time
    assert [len(plan.assignment[p].active) for p in "abc"] == [4, 4, 4]


def test_caught_up_standby_takes_over_directly_and_a_lagging_one_warms_up_in_place() -> None:
    """a crashed. b holds a caught-up standby of 0_0, c a far-behind standby of 0_1; 0_1 has no
    caught-up client at all, so it goes to its target at once (nothing to wait for)."""
    b = ClientState("b", prev_active=[T[2]], prev_standby=[T[0]], lags={T[0]: 5})
    c = ClientState("c", prev_active=[T[3]], prev_standby=[T[1]], lags={T[1]: 90_000})
    plan = assignor(0).plan(T[:4], [b, c])
    assert T[0] in plan.assignment["b"].active
    assert T[1] in plan.assignment["c"].active
    assert not plan.probing_rebalance_needed


def test_held_back_active_swaps_roles_with_a_target_standby() -> None:
    """The target moves 0_0 to b (lagging) and keeps a standby on a, its caught-up owner:
    interim, a keeps running it and b holds the standby, with no warmup spent."""
    tasks = [TaskId(0, 0), TaskId(0, 1)]
    a = ClientState("a", prev_active=tasks)
    b = ClientState("b", prev_standby=tasks, lags=dict.fromkeys(tasks, 5_000))
    plan = assignor(1).plan(tasks, [a, b])
    moved = plan.held_back.keys()
    assert len(moved) == 1
    assert plan.assignment["a"].active == frozenset(tasks)
    assert plan.assignment["b"].standby == frozenset(tasks)
    assert plan.warmups == 0 and plan.probing_rebalance_needed


def test_warmup_budget_goes_first_to_clients_already_restoring() -> None:
    tasks = [TaskId(0, p) for p in range(4)]
    a = ClientState("a", prev_active=tasks)
    b = ClientState("b", prev_standby=[TaskId(0, 3)], lags={TaskId(0, 3): 7_000})
    plan = assignor(0, warmups=1).plan(tasks, [a, b])
    assert len(plan.held_back) == 2 and TaskId(0, 3) in plan.held_back
    assert plan.assignment["b"].warmup == {TaskId(0, 3)}


def test_stateless_tasks_move_at_once() -> None:
    tasks = [TaskId(0, p) for p in range(4)]
    plan = assignor(0).plan(tasks, [ClientState("a", prev_active=tasks), ClientState("b")], [])
    assert len(plan.assignment["b"].active) == 2 and not plan.probing_rebalance_needed


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_warmup_replicas": 0}, "max_warmup_replicas must be an int >= 1"),
        ({"num_standby_replicas": -1}, "num_standby_replicas must be an int >= 0"),
        ({"acceptable_recovery_lag": True}, "acceptable_recovery_lag must be an int >= 0"),
        ({"probing_rebalance_interval_ms": 0}, "probing_rebalance_interval_ms must be an int >= 1"),
    ],
)
def test_bad_settings_are_typed_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HighAvailabilityTaskAssignor(**kwargs)  # type: ignore[arg-type]


def test_bad_input_is_the_sticky_assignors_error() -> None:
    with pytest.raises(ValueError, match="duplicate process id"):
        assignor(0).plan(T, [ClientState("a"), ClientState("a")])
    with pytest.raises(ValueError, match="no clients"):
        assignor(0).plan(T, [])
    assert assignor(0).plan([], []).assignment == {}


@pytest.mark.parametrize("key", ["zone", "host"])
def test_rack_aware_tags_and_task_racks_shape_the_target(key: str) -> None:
    """The keys named in ``rack_aware_tags`` are the ones a standby avoids sharing with its
    active; ``task_racks`` pull tasks to a client in their rack, as in the sticky assignor."""
    tasks = [TaskId(0, p) for p in range(8)]
    where = [("a", "z1", "x", "r1"), ("b", "z1", "y", "r1"), ("c", "z2", "x", "r2")]
    clients = [
        ClientState(p, rack=r, tags={"zone": z, "host": h})
        for p, z, h, r in [*where, ("d", "z2", "y", "r2")]
    ]
    racks = {t: "r2" if t.partition < 4 else "r1" for t in tasks}
    ha = HighAvailabilityTaskAssignor(1, ACCEPTABLE, rack_aware_tags=[key])
    plan = ha.plan(tasks, clients, task_racks=racks)
    assert plan.assignment == plan.target == ha.assign(tasks, clients, task_racks=racks)
    tag = {c.process_id: c.tags[key] for c in clients}
    rack = {c.process_id: c.rack for c in clients}
    active = {t: pid for pid, a in plan.assignment.items() for t in a.active}
    for pid, a in plan.assignment.items():
        assert all(tag[active[t]] != tag[pid] for t in a.standby), (pid, a)
    assert all(rack[pid] == racks[t] for t, pid in active.items())


def test_with_nobody_caught_up_the_least_lagging_holder_keeps_the_task_meanwhile() -> None:
    """KAFKA-10086: a lost client's tasks go to the holder of a copy 20,000 behind rather than
    to a client with nothing (which restores all); the target warms up and takes over later."""
    tasks = [TaskId(0, p) for p in range(6)]
    lost = tasks[:3]  # ran on a client that is gone; b holds standbys of them, 20,000 behind
    b = ClientState("b", prev_active=tasks[3:], prev_standby=lost, lags=dict.fromkeys(lost, 20_000))
    c = ClientState("c")
    plan = HighAvailabilityTaskAssignor(1, 10_000).plan(tasks, [b, c])
    assert plan.assignment["b"].active == set(tasks)
    assert plan.held_back == dict.fromkeys(lost, "c")
    assert set(lost) <= plan.assignment["c"].standby | plan.assignment["c"].warmup
    # A copy only 5,000 closer than the target's is not worth the wait: straight to target.
    near = ClientState("c", prev_standby=lost, lags=dict.fromkeys(lost, 25_000))
    plan = HighAvailabilityTaskAssignor(1, 10_000).plan(tasks, [b, near])
    assert not plan.held_back and plan.assignment == plan.target


# -- the leader's last plan (last_plan) ---------------------------------------------------------


def role_swap_rounds() -> tuple[list[TaskId], list[ClientState], HighAvailabilityPlan]:
    """The tasks, round 1's history and round 0's plan of the orphans held back in role swaps
    (``test_an_orphan_held_back_in_a_role_swap_meets_the_tight_bound_when_the_leader_stays``):
    made afresh, round 1 holds 0_6 back for a warmup; round 0's target needs none."""
    tasks, clients = orphans_held_back_in_role_swaps()
    first = assignor(1, 1).plan(tasks, clients)
    return tasks, next_round(clients, first.assignment), first


def changed(
    target: Mapping[str, ClientAssignment], pid: str, **sets: set[TaskId]
) -> dict[str, ClientAssignment]:
    """``target`` with ``pid``'s sets replaced as given."""
    fields = {name: frozenset(tasks) for name, tasks in sets.items()}
    return {**target, pid: attrs.evolve(target[pid], **fields)}


def moved(
    target: Mapping[str, ClientAssignment], kind: str, task: str, src: str, dest: str
) -> dict[str, ClientAssignment]:
    """``target`` with the ``kind`` ("active" or "standby") of ``task`` moved from ``src`` to
    ``dest``."""
    t = TaskId.parse(task)
    left = changed(target, src, **{kind: set(getattr(target[src], kind)) - {t}})
    return changed(left, dest, **{kind: set(getattr(target[dest], kind)) | {t}})


def planned(
    clients: list[ClientState], target: Mapping[str, ClientAssignment]
) -> HighAvailabilityPlan:
    """A last plan of ``target`` that assigned the ``clients`` exactly the actives they now
    run (the round right after it), so only ``target`` itself decides whether it is carried."""
    running = {c.process_id: ClientAssignment(c.prev_active) for c in clients}
    return HighAvailabilityPlan(running, target, {})


def assert_ignored(
    ha: HighAvailabilityTaskAssignor,
    tasks: list[TaskId],
    clients: list[ClientState],
    previous: Mapping[str, ClientAssignment] | HighAvailabilityPlan,
) -> None:
    """The plan made without ``previous`` holds actives back (so ``previous`` could count),
    and the plan given ``previous`` (a last plan, or a target: see ``planned``) is that
    plan."""
    fresh = ha.plan(tasks, clients)
    assert fresh.probing_rebalance_needed
    if not isinstance(previous, HighAvailabilityPlan):
        previous = planned(clients, previous)
    assert ha.plan(tasks, clients, last_plan=previous) == fresh


def test_the_last_target_still_valid_is_kept_when_a_plan_afresh_would_hold_back() -> None:
    tasks, history, first = role_swap_rounds()
    assert assignor(1, 1).plan(tasks, history).held_back == {TaskId(0, 6): "d"}
    plan = assignor(1, 1).plan(tasks, history, last_plan=first)
    assert plan.target == plan.assignment == first.target
    assert not plan.probing_rebalance_needed and not plan.warmups
    # A plan built by hand with other collections of the same actives counts the same.
    listed = {p: attrs.evolve(a, active=sorted(a.active)) for p, a in first.assignment.items()}
    by_hand = attrs.evolve(first, assignment=listed)
    assert assignor(1, 1).plan(tasks, history, last_plan=by_hand) == plan


def test_a_plan_afresh_holding_nothing_back_is_kept() -> None:
    """A balanced group is never reshuffled, even by a valid last target that needs no warmup
    (a stale one: this leader led some rounds ago)."""
    tasks, history, first = role_swap_rounds()
    settled = next_round(history, first.target)  # converged to round 0's target
    # aa and d swap 2_1 and 2_3, each holding the other's as a standby
    stale = moved(moved(first.target, "active", "2_1", "aa", "d"), "active", "2_3", "d", "aa")
    stale = moved(moved(stale, "standby", "2_1", "d", "aa"), "standby", "2_3", "aa", "d")
    assert still_valid((tasks, settled, 1, None), stale)
    plan = assignor(1, 1).plan(tasks, settled, last_plan=planned(settled, stale))
    assert plan.assignment == first.target


def test_the_last_target_is_ignored_out_of_the_round_right_after_its_plan() -> None:
    """A review found a still-valid target from rounds ago adopted with 8 moves of 9 tasks
    where 1 was the bound: the plan carries a target over only when the clients run exactly
    the actives its plan assigned."""
    tasks, history, first = role_swap_rounds()
    assert first.assignment != first.target  # so a plan that assigned the target is another
    assert_ignored(assignor(1, 1), tasks, history, attrs.evolve(first, assignment=first.target))
    idle = {**first.assignment, "a": ClientAssignment()}  # a ran something since
    assert_ignored(assignor(1, 1), tasks, history, attrs.evolve(first, assignment=idle))


def test_the_last_target_is_ignored_when_the_processes_changed() -> None:
    tasks, history, first = role_swap_rounds()
    assert_ignored(assignor(1, 1), tasks, [*history, ClientState("e")], first.target)
    assert_ignored(assignor(1, 1), tasks, history[1:], first.target)


def test_the_last_target_is_ignored_when_the_tasks_changed() -> None:
    tasks, history, first = role_swap_rounds()
    assert_ignored(assignor(1, 1), [t for t in tasks if t != TaskId(1, 0)], history, first.target)


def test_the_last_target_is_ignored_when_it_needs_a_warmup() -> None:
    """Offered in the round that made it (the warmups or role swaps not caught up yet)."""
    tasks, clients = orphans_held_back_in_role_swaps()
    first = assignor(1, 1).plan(tasks, clients)
    assert_ignored(assignor(1, 1), tasks, clients, first.target)


def test_the_last_target_is_ignored_when_unbalanced() -> None:
    """a takes 0_6 over from b (a role swap: a holds it caught up), every task keeps one
    standby, loads stay within their shares, but a runs three actives, above its ceiling."""
    tasks, history, first = role_swap_rounds()
    previous = moved(moved(first.target, "active", "0_6", "b", "a"), "standby", "0_6", "a", "b")
    assert violations(tasks, history, previous, 1) == []
    assert load_rule_breaches((tasks, history, 1, None), previous) == []
    assert not evaluate(tasks, history, previous, 1).active_balanced
    assert_ignored(assignor(1, 1), tasks, history, previous)


def test_the_last_target_is_ignored_with_wrong_standbys() -> None:
    tasks, history, first = role_swap_rounds()
    target = first.target
    missing = changed(target, "a", standby=set(target["a"].standby) - {TaskId(0, 6)})
    beside = moved(target, "standby", "0_6", "a", "b")  # b runs 0_6
    twice = changed(target, "d", standby=set(target["d"].standby) | {TaskId(0, 6)})
    for previous in (missing, beside, twice):
        assert_ignored(assignor(1, 1), tasks, history, previous)
    assert_ignored(assignor(0, 1), tasks, history, target)  # standbys where none are wanted


def test_the_last_target_is_ignored_when_it_breaks_the_load_rule() -> None:
    """d's standby of 0_0 moved to c: every task still has one, actives are balanced, but c
    sits above its load ceiling with a copy of 0_5 that d (below its ceiling) could take."""
    tasks, history, first = role_swap_rounds()
    previous = moved(first.target, "standby", "0_0", "d", "c")
    assert violations(tasks, history, previous, 1) == []
    assert load_rule_breaches((tasks, history, 1, None), previous) == [("c", "d")]
    assert_ignored(assignor(1, 1), tasks, history, previous)


def test_the_last_target_is_ignored_with_a_client_below_its_load_floor() -> None:
    """Review finding: e holds nothing (load floor 1) while a, b and c sit at their ceilings
    of 2, so no pair breaks the load rule's above-ceiling form, yet the next rebalance hands
    e a standby: not a fixed point, so not carried."""
    t = TaskId.parse
    tasks = [t("0_0"), t("0_1"), t("0_2")]
    history = [
        ClientState("a", prev_active=[t("0_0"), t("0_1")]),
        ClientState("b", prev_active=[t("0_2")], prev_standby=[t("0_1")], lags={t("0_1"): 0}),
        ClientState("c", prev_standby=[t("0_2")], lags={t("0_2"): 0}),
        ClientState("e"),
    ]
    previous = {
        "a": ClientAssignment({t("0_0")}, {t("0_2")}),
        "b": ClientAssignment({t("0_1")}, {t("0_0")}),
        "c": ClientAssignment({t("0_2")}, {t("0_1")}),
        "e": ClientAssignment(),
    }
    assert load_rule_breaches((tasks, history, 1, None), previous) == []
    assert not planned_again_unchanged((tasks, history, 1, None), previous)
    assert_ignored(assignor(1, 1), tasks, history, previous)


def test_the_last_target_is_ignored_when_it_holds_warmups() -> None:
    """A plan's assignment, warmups and all, is not a target."""
    tasks, history, first = role_swap_rounds()
    previous = changed(first.target, "d", warmup={TaskId(0, 6)})
    assert_ignored(assignor(1, 1), tasks, history, previous)


def test_the_last_target_keeps_the_balance_option() -> None:
    """a ran subtopology 0, b subtopology 1: balanced in total, not per subtopology, so the
    default balance holds tasks back for warmups and ignores that assignment as the last
    target."""
    tasks = [TaskId(s, p) for s in (0, 1) for p in (0, 1)]
    clients = [ClientState("a", prev_active=tasks[:2]), ClientState("b", prev_active=tasks[2:])]
    previous = {c.process_id: ClientAssignment(c.prev_active) for c in clients}
    assert_ignored(assignor(0), tasks, clients, previous)


def test_the_last_target_does_not_hide_bad_input() -> None:
    tasks, history, first = role_swap_rounds()
    with pytest.raises(ValueError, match="duplicate process id"):
        assignor(1).plan(tasks, [*history, history[0]], last_plan=first)
    with pytest.raises(ValueError, match="no clients"):
        assignor(1).plan(tasks, [], last_plan=HighAvailabilityPlan({}, {}, {}))
    not_a_target = {pid: None for pid in first.target}
    not_plans = (
        first.target,
        attrs.evolve(first, target=not_a_target),
        HighAvailabilityPlan(None, None, None),  # type: ignore[arg-type]
        attrs.evolve(first, assignment=list(first.assignment.values())),
    )
    for not_a_plan in not_plans:
        with pytest.raises(AssignmentTypeError, match="last_plan is a HighAvailabilityPlan"):
            assignor(1, 1).plan(tasks, history, last_plan=not_a_plan)  # type: ignore[arg-type]


def still_valid(
    inputs: Inputs, previous: Mapping[str, ClientAssignment], balance: str = "subtopology"
) -> bool:
    """The oracle of a last target a plan adopts: for the same processes, valid with no
    warmup, balanced in total and (unless ``balance="total"``) per subtopology, a fixed point
    (``planned_again_unchanged``), every stateful active caught up where it is."""
    tasks, clients, replicas, stateful = inputs
    if sorted(previous) != sorted(c.process_id for c in clients):
        return False
    if any(a.warmup for a in previous.values()):
        return False
    if violations(tasks, clients, previous, replicas, stateful):
        return False
    m = evaluate(tasks, clients, previous, replicas, stateful)
    if not m.active_balanced or not (m.subtopology_balanced or balance == "total"):
        return False
    if not planned_again_unchanged(inputs, previous, balance):
        return False
    owners = resolve_previous_owners(tasks, clients)
    by_pid = {c.process_id: c for c in clients}
    stateful_set = set(tasks if stateful is None else stateful)
    return all(
        caught_up(by_pid[pid], t, owners.get(t))
        for pid, a in previous.items()
        for t in a.active & stateful_set
    )


def planned_again_unchanged(
    inputs: Inputs, assignment: Mapping[str, ClientAssignment], balance: str = "subtopology"
) -> bool:
    """Whether ``assignment``, run and fed back with every copy caught up, is planned again
    unchanged, standbys included, with nothing held back: what the convergence properties
    ask of a converged assignment."""
    tasks, clients, replicas, stateful = inputs
    ha = attrs.evolve(assignor(replicas, 1), balance=balance)
    again = ha.plan(tasks, next_round(clients, assignment), stateful)
    return again.assignment == assignment and not again.probing_rebalance_needed


@st.composite
def altered(draw: st.DrawFn, target: Mapping[str, ClientAssignment]) -> dict[str, ClientAssignment]:
    """``target`` as it is, without one client, or with one active or standby moved."""
    kind = draw(st.sampled_from(["as it is", "client dropped", "active", "standby"]))
    pids = sorted(target)
    if kind == "client dropped":
        gone = draw(st.sampled_from(pids))
        return {p: a for p, a in target.items() if p != gone}
    src, dest = draw(st.sampled_from(pids)), draw(st.sampled_from(pids))
    there = sorted(getattr(target[src], kind)) if kind != "as it is" else []
    if not there or src == dest:
        return dict(target)
    t = draw(st.sampled_from(there))
    left = changed(target, src, **{kind: set(getattr(target[src], kind)) - {t}})
    return changed(left, dest, **{kind: set(getattr(target[dest], kind)) | {t}})


# A quarter of the profile's examples: 50 in dev, 500 in CI.
@settings(max_examples=max(10, settings.default.max_examples // 4))
@given(assignment_inputs(), st.integers(1, 3), st.data())
def test_a_last_target_never_breaks_a_per_round_rule(
    inputs: Inputs, warmups: int, data: st.DataObject
) -> None:
    """Any last plan (a plan on arbitrary inputs, its target as it is or altered), offered
    in the same round or one probing round later: the plan keeps every per-round rule, and
    it is the plan made without it unless that plan holds actives back, the clients run
    exactly the actives the last plan assigned and its target is still valid
    (``still_valid``): then it is that target, nothing held back."""
    tasks, clients, replicas, stateful = inputs
    ha = assignor(replicas, warmups)
    first = ha.plan(tasks, clients, stateful)
    later = data.draw(st.booleans(), label="one probing round later")
    history = next_round(clients, first.assignment) if later else clients
    previous = data.draw(altered(first.target))
    plan = ha.plan(tasks, history, stateful, last_plan=attrs.evolve(first, target=previous))
    check_round(tasks, history, replicas, stateful, plan, warmups)
    fresh = ha.plan(tasks, history, stateful)
    running = {c.process_id: ClientAssignment(c.prev_active) for c in history}
    right_after = running == {p: ClientAssignment(a.active) for p, a in first.assignment.items()}
    if (
        fresh.probing_rebalance_needed
        and right_after
        and still_valid((tasks, history, replicas, stateful), previous)
    ):
        assert plan.assignment == plan.target == previous
        assert not plan.probing_rebalance_needed
    else:
        assert plan == fresh


# A quarter of the profile's examples: 50 in dev, 500 in CI.
@settings(max_examples=max(10, settings.default.max_examples // 4))
@given(assignment_inputs(), st.data(), st.sampled_from(["subtopology", "total"]))
def test_a_last_target_is_carried_exactly_when_still_valid(
    inputs: Inputs, data: st.DataObject, balance: str
) -> None:
    """The step ``plan`` takes when its own plan holds actives back (``_carry``; driven
    directly, as random inputs rarely reach it through ``plan``): the last target becomes
    the plan, whole, nothing held back, when ``still_valid`` says so, else nothing. Carried
    one probing round on, it keeps the target guarantees, its moves the least from the
    history of the round that made it."""
    tasks, clients, replicas, stateful = inputs
    ha = attrs.evolve(assignor(replicas, 1), balance=balance)
    first = ha.plan(tasks, clients, stateful)
    later = data.draw(st.booleans(), label="one probing round later")
    history = next_round(clients, first.assignment) if later else clients
    previous = data.draw(altered(first.target))
    task_list, stateful_list = sorted(set(tasks)), tasks if stateful is None else stateful
    by_pid = sorted(history, key=lambda c: c.process_id)
    last = planned(history, previous)  # the round right after it, whatever it assigned
    carried = ha._carry(last, task_list, by_pid, stateful_list, None)
    now = (tasks, history, replicas, stateful)
    valid = still_valid(now, previous, balance)
    event("carried" if valid else "ignored")
    if not valid:
        assert carried is None
        return
    assert carried is not None
    assert carried.assignment == carried.target == previous
    check_round(tasks, history, replicas, stateful, carried, 1)
    if later and previous == first.target:
        assert_target_guarantees(now, carried, balance, computed_from=clients)
