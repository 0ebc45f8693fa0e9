"""Standby placement: rack- and tag-aware (KIP-708 / KIP-925 style), spread over clients, and
rack-aware actives for cold tasks. Property-tested against the same inputs without the hints."""

from __future__ import annotations

import math
from collections import Counter

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from streamassign import (
    ClientAssignment,
    ClientState,
    HighAvailabilityTaskAssignor,
    StickyTaskAssignor,
    TaskId,
)
from streamassign.metrics import evaluate, violations

from .strategies import assignment_inputs, fresh_clients, task_sets
from .test_sticky import load_rule_breaches

Inputs = tuple[list[TaskId], list[ClientState], int, "list[TaskId] | None"]
RACKS = ["r0", "r1", "r2"]


def with_places(clients: list[ClientState], racks: list[str | None], zones: list[str]) -> list:
    return [
        ClientState(
            c.process_id,
            c.capacity,
            prev_active=c.prev_active,
            prev_standby=c.prev_standby,
            lags=c.lags,
            rack=racks[k % len(racks)],
            tags={"zone": zones[k % len(zones)]} if zones else {},
        )
        for k, c in enumerate(clients)
    ]


def conflicts(clients: list[ClientState], result: dict[str, ClientAssignment]) -> int:
    """Standbys sharing a rack or a zone with their active or with another copy."""
    by_pid = {c.process_id: c for c in clients}
    holders: dict[TaskId, list[ClientState]] = {}
    for pid, a in result.items():
        for t in a.active | a.standby:
            holders.setdefault(t, []).append(by_pid[pid])
    n = 0
    for group in holders.values():
        for key in (lambda c: c.rack, lambda c: c.tags.get("zone")):
            values = [key(c) for c in group if key(c) is not None]
            n += len(values) - len(set(values))
    return n


@given(assignment_inputs(), st.integers(1, 3), st.integers(0, 3))
def test_rack_and_tag_hints_keep_the_assignment_valid_and_balanced(
    inputs: Inputs, n_racks: int, n_zones: int
) -> None:
    tasks, clients, replicas, stateful = inputs
    placed = with_places(clients, [*RACKS[:n_racks]], [f"z{k}" for k in range(n_zones)])
    result = StickyTaskAssignor(replicas).assign(tasks, placed, stateful)
    plain = StickyTaskAssignor(replicas).assign(tasks, clients, stateful)
    assert violations(tasks, placed, result, replicas, stateful) == []
    got = evaluate(tasks, placed, result, replicas, stateful)
    assert got.active_balanced
    # Actives are placed as without hints: racks only steer where standbys go.
    assert {p: a.active for p, a in result.items()} == {p: a.active for p, a in plain.items()}


def without_places(clients: list[ClientState]) -> list[ClientState]:
    return [attrs.evolve(c, rack=None, tags={}) for c in clients]


def assert_placement_guarantees(
    inputs: Inputs, result: dict[str, ClientAssignment], blind: dict[str, ClientAssignment]
) -> None:
    """Guarantee 8 of docs/assignor.md on any history: racks and tags leave the assignment
    valid, balanced and load-balanced, with its actives where ``blind`` (the same input without
    racks and tags) has them. Not that it shares fewer racks and zones than ``blind``: greedy
    placement does not promise that (see the known exception below)."""
    tasks, clients, replicas, stateful = inputs
    assert violations(tasks, clients, result, replicas, stateful) == []
    assert evaluate(tasks, clients, result, replicas, stateful).active_balanced
    assert load_rule_breaches(inputs, result) == []
    assert {p: a.active for p, a in result.items()} == {p: a.active for p, a in blind.items()}


@given(assignment_inputs(placed=True))
def test_racks_and_tags_on_any_history_keep_the_guarantees(inputs: Inputs) -> None:
    """Fresh groups, the assignor's own history on other members, arbitrary claims and lags;
    clients with a rack or none, a zone or none (one known rack beside unknown ones too)."""
    tasks, clients, replicas, stateful = inputs
    result = StickyTaskAssignor(replicas).assign(tasks, clients, stateful)
    blind = StickyTaskAssignor(replicas).assign(tasks, without_places(clients), stateful)
    assert_placement_guarantees(inputs, result, blind)


# Measured, not guaranteed (greedy placement): a fixed set of examples, so the suite cannot
# fail at random on an input no one has seen; docs/assignor.md rule 8 gives the measurement.
# The fixed set moves with hypothesis' version: under 6.170.17 it met the exception below.
@settings(derandomize=True)
@given(assignment_inputs(placed=True))
def test_racks_and_tags_without_previous_standbys_add_no_conflicts(inputs: Inputs) -> None:
    """Any history of actives, but no previous standbys to keep: at most one more shared rack
    or zone than the same input without racks and tags, and none more on 10,000 random inputs
    measured (the one exception found is the test after this one; with previous standbys
    kept, see the exception below it)."""
    tasks, clients, replicas, stateful = inputs
    clients = [attrs.evolve(c, prev_standby=frozenset()) for c in clients]
    result = StickyTaskAssignor(replicas).assign(tasks, clients, stateful)
    blind = StickyTaskAssignor(replicas).assign(tasks, without_places(clients), stateful)
    assert_placement_guarantees((tasks, clients, replicas, stateful), result, blind)
    assert conflicts(clients, result) <= conflicts(clients, blind) + 1


def test_racks_and_tags_without_previous_standbys_known_exception() -> None:
    """Documented non-strict behaviour (docs/assignor.md rule 8), found by CI's fixed examples
    under hypothesis 6.170.17 (none in 10,000 random inputs): no previous standbys, 27 tasks
    over 5 clients with 2 standbys each; greedy rack-aware placement shares 13 racks and zones
    where the same input without racks and tags shares 12. Asserts the guarantees plus
    today's numbers, so a change in either shows up here."""
    tasks = [TaskId(s, p) for s, count in ((0, 11), (1, 6), (2, 10)) for p in range(count)]
    clients = [
        ClientState("d", 1),
        ClientState("a", 1, lags={TaskId(2, 3): 1}, rack="r0", tags={"zone": "z0"}),
        ClientState(
            "c",
            1,
            prev_active=frozenset({TaskId(0, 1), TaskId(0, 2), TaskId(1, 3)}),
            lags={TaskId(0, 0): 0, TaskId(2, 3): 0, TaskId(0, 1): 0, TaskId(0, 4): 0},
            rack="r0",
        ),
        ClientState("b", 2),
        ClientState("aa", 4, lags={TaskId(0, 0): 0}, tags={"zone": "z0"}),
    ]
    result = StickyTaskAssignor(2).assign(tasks, clients)
    blind = StickyTaskAssignor(2).assign(tasks, without_places(clients))
    assert_placement_guarantees((tasks, clients, 2, None), result, blind)
    assert (conflicts(clients, result), conflicts(clients, blind)) == (13, 12)


def test_kept_standbys_can_leave_more_conflicts_than_no_racks_known_exception() -> None:
    """Documented non-strict behaviour (docs/assignor.md rule 8), shrunk from a random search:
    with previous standbys kept where they are, greedy rack-aware placement of the rest shares
    5 racks and zones where the same input without racks and tags shares 4. Asserts the
    guarantees plus today's numbers, so a change in either shows up here."""

    def client(
        pid: str,
        capacity: int = 1,
        rack: str | None = None,
        zone: str | None = None,
        active: tuple[int, ...] = (),
        standby: tuple[int, ...] = (),
    ) -> ClientState:
        return ClientState(
            pid,
            capacity,
            prev_active=frozenset(TaskId(0, p) for p in active),
            prev_standby=frozenset(TaskId(0, p) for p in standby),
            rack=rack,
            tags={"zone": zone} if zone else {},
        )

    tasks = [TaskId(0, p) for p in range(7)]
    clients = [
        client("n113", rack="r0", standby=(1, 6)),
        client("n278", standby=(0, 4)),
        client("n813", standby=(1,)),
        client("n835", 2, zone="z1"),
        client("p02", active=(0,), standby=(3,)),
        client("p04", active=(1,), standby=(3,)),
        client("p21", zone="z1", active=(4,), standby=(5,)),
        client("p25", rack="r0", zone="z1", active=(5,), standby=(0, 3)),
        client("p29", rack="r0", standby=(6,)),
        client("p41", standby=(2, 4)),
        client("p53", standby=(1, 5)),
    ]
    inputs: Inputs = (tasks, clients, 3, tasks)
    result = StickyTaskAssignor(3).assign(tasks, clients, tasks)
    blind = StickyTaskAssignor(3).assign(tasks, without_places(clients), tasks)
    assert_placement_guarantees(inputs, result, blind)
    assert (conflicts(clients, result), conflicts(clients, blind)) == (5, 4)


# A quarter of the profile's examples: each runs an HA plan (two probing rounds at most).
@settings(max_examples=max(10, settings.default.max_examples // 4))
@given(assignment_inputs(placed=True), st.integers(1, 3))
def test_ha_targets_with_racks_and_tags_keep_their_guarantees(inputs: Inputs, warmups: int) -> None:
    """The high-availability target with racks and zones on any history: valid, balanced,
    load-balanced, and the plan when nothing is held back. Not compared with the same input
    without racks: the target's chains weigh its standbys, which racks move, so its actives
    may differ; and even with the same actives its standbys, placed by the sticky assignor
    on the target's history, shared one rack or zone more than without racks in an input a
    random search of a few thousand found (greedy placement; the sticky assignor's own
    placement can too, see the known exception above)."""
    tasks, clients, replicas, stateful = inputs
    ha = HighAvailabilityTaskAssignor(replicas, 100, max_warmup_replicas=warmups)
    plan = ha.plan(tasks, clients, stateful)
    assert violations(tasks, clients, plan.target, replicas, stateful) == []
    assert evaluate(tasks, clients, plan.target, replicas, stateful).active_balanced
    assert load_rule_breaches(inputs, plan.target) == []
    if not plan.probing_rebalance_needed:
        assert plan.assignment == plan.target


@given(task_sets(), st.integers(2, 6), st.integers(1, 2), st.booleans())
def test_ha_fresh_standbys_avoid_the_active_rack_when_racks_are_even(
    tasks: list[TaskId], per_rack: int, replicas: int, zones: bool
) -> None:
    """As for the sticky assignor: equal clients evenly over 3 racks (or zones), fewer copies
    than racks: the HA plan of a fresh group shares no rack or zone."""
    clients = [ClientState(f"c{k:02d}") for k in range(per_rack * 3)]
    placed = with_places(clients, [None] if zones else RACKS, RACKS if zones else [])
    plan = HighAvailabilityTaskAssignor(replicas).plan(tasks, placed)
    assert conflicts(placed, plan.assignment) == 0


def test_one_known_rack_beside_unknown_ones_is_avoided() -> None:
    """Regression: racks were ignored unless clients reported two different ones, so with
    one known rack (the rest unreported) a standby could share it with its active."""
    tasks = [TaskId(0, p) for p in range(4)]
    clients = [
        ClientState("a", rack="r1"),
        ClientState("b", rack="r1"),
        ClientState("c"),
        ClientState("d"),
    ]
    result = StickyTaskAssignor(1).assign(tasks, clients)
    assert conflicts(clients, result) == 0


@given(task_sets(), st.integers(2, 8), st.integers(1, 2), st.integers(2, 3), st.booleans())
def test_fresh_standbys_avoid_the_active_rack_when_racks_are_even(
    tasks: list[TaskId], per_rack: int, replicas: int, n_racks: int, zones: bool
) -> None:
    """Equal clients spread evenly over more racks than copies: no standby shares a rack."""
    clients = [ClientState(f"c{k:02d}") for k in range(per_rack * n_racks)]
    racks: list[str | None] = [None] if zones else RACKS[:n_racks]
    zone_names = RACKS[:n_racks] if zones else []
    placed = with_places(clients, racks, zone_names)
    replicas = min(replicas, n_racks - 1)
    result = StickyTaskAssignor(replicas).assign(tasks, placed)
    assert conflicts(placed, result) == 0


@given(task_sets(), st.integers(2, 6), st.integers(2, 3), st.integers(0, 1))
def test_copies_cover_every_rack_when_they_outnumber_the_racks(
    tasks: list[TaskId], per_rack: int, n_racks: int, beyond: int
) -> None:
    """More copies than racks (conflicts unavoidable): each task's copies still span every
    rack, so losing a rack never loses a task's state."""
    replicas = n_racks + beyond
    clients = [ClientState(f"c{k:02d}") for k in range(per_rack * n_racks)]
    placed = with_places(clients, RACKS[:n_racks], [])
    rack = {c.process_id: c.rack for c in placed}
    result = StickyTaskAssignor(replicas).assign(tasks, placed)
    spans: dict[TaskId, set[str | None]] = {t: set() for t in tasks}
    for pid, a in result.items():
        for t in a.active | a.standby:
            spans[t].add(rack[pid])
    assert all(len(racks) == n_racks for racks in spans.values())


# Measured, not guaranteed (greedy placement; docs/assignor.md rule 8): fixed examples.
@settings(derandomize=True)
@given(task_sets(), fresh_clients(), st.integers(1, 3), st.data())
def test_rack_awareness_never_adds_conflicts(
    tasks: list[TaskId], clients: list[ClientState], replicas: int, data: st.DataObject
) -> None:
    """Degrading gracefully: uneven racks and capacities never give more shared racks than
    a placement that ignores racks."""
    racks = data.draw(
        st.lists(st.sampled_from(RACKS), min_size=len(clients), max_size=len(clients))
    )
    placed = [
        ClientState(c.process_id, c.capacity, rack=rack)
        for c, rack in zip(clients, racks, strict=True)
    ]
    aware = StickyTaskAssignor(replicas).assign(tasks, placed)
    blind = StickyTaskAssignor(replicas).assign(tasks, clients)
    assert conflicts(placed, aware) <= conflicts(placed, blind)


@given(task_sets(), st.integers(3, 8))
def test_fresh_standbys_of_one_client_spread_over_the_others(tasks: list[TaskId], n: int) -> None:
    """When a client is lost, its tasks have warm copies on many survivors, not on one: no
    client backs up more than one of its tasks above an even spread (docs/assignor.md, rule
    7). Every input this draws was checked once (all 135,720 of them)."""
    clients = [ClientState(f"c{k}") for k in range(n)]
    result = StickyTaskAssignor(1).assign(tasks, clients)
    owner = {t: p for p, a in result.items() for t in a.active}
    for pid, a in result.items():
        backed = Counter(p for p, b in result.items() for t in b.standby if owner[t] == pid)
        assert max(backed.values(), default=0) <= math.ceil(len(a.active) / (n - 1)) + 1, backed


def test_last_standbys_placed_spread_over_the_others_regression() -> None:
    """Regression for the property above: 6, 1, 6 and 10 tasks over 5 equal clients, one
    standby. Placement goes one subtopology after another; c0's two copies of the last come
    last, when only c4 has room left, and c4 already backed up two of c0's five tasks: 4 of
    them on c4 (3 at most is the bound). The evening's spreading exchanges hand them on."""
    tasks = [TaskId(s, p) for s, n in enumerate([6, 1, 6, 10]) for p in range(n)]
    clients = [ClientState(f"c{k}") for k in range(5)]
    result = StickyTaskAssignor(1).assign(tasks, clients)
    owner = {t: p for p, a in result.items() for t in a.active}
    for pid, a in result.items():
        backed = Counter(p for p, b in result.items() for t in b.standby if owner[t] == pid)
        assert max(backed.values(), default=0) <= math.ceil(len(a.active) / 4) + 1, (pid, backed)


@given(task_sets(), st.integers(2, 8), st.integers(0, 1), st.data())
def test_task_racks_steer_cold_tasks_without_changing_counts(
    tasks: list[TaskId], n: int, replicas: int, data: st.DataObject
) -> None:
    clients = [ClientState(f"c{k}", capacity=1 + k % 2, rack=RACKS[k % 3]) for k in range(n)]
    task_racks = {t: data.draw(st.sampled_from(RACKS)) for t in tasks}
    steered = StickyTaskAssignor(replicas).assign(tasks, clients, task_racks=task_racks)
    plain = StickyTaskAssignor(replicas).assign(tasks, clients)
    rack = {c.process_id: c.rack for c in clients}

    def cross(result: dict[str, ClientAssignment]) -> int:
        return sum(task_racks[t] != rack[p] for p, a in result.items() for t in a.active)

    assert {p: len(a.active) for p, a in steered.items()} == {
        p: len(a.active) for p, a in plain.items()
    }
    assert cross(steered) <= cross(plain)
    assert violations(tasks, clients, steered, replicas) == []


def test_task_racks_put_each_task_in_its_rack_when_room_allows() -> None:
    tasks = [TaskId(0, p) for p in range(6)]
    clients = [ClientState("a", rack="east"), ClientState("b", rack="west")]
    racks = {t: "east" if t.partition < 3 else "west" for t in tasks}
    result = StickyTaskAssignor().assign(tasks, clients, task_racks=racks)
    assert result["a"].active == frozenset(tasks[:3])
    assert result["b"].active == frozenset(tasks[3:])


def test_configured_tag_keys_limit_what_placement_avoids() -> None:
    tasks = [TaskId(0, p) for p in range(8)]
    clients = [
        ClientState(pid, tags={"zone": zone, "cluster": cluster})
        for pid, zone, cluster in (
            ("a", "z1", "k1"),
            ("b", "z1", "k2"),
            ("c", "z2", "k1"),
            ("d", "z2", "k2"),
        )
    ]
    tags = {c.process_id: c.tags for c in clients}

    def shared(keys: tuple[str, ...] | None, key: str) -> int:
        result = StickyTaskAssignor(1, rack_aware_tags=keys).assign(tasks, clients)
        owner = {t: p for p, a in result.items() for t in a.active}
        return sum(
            tags[owner[t]][key] == tags[p][key] for p, a in result.items() for t in a.standby
        )

    assert shared(("zone",), "zone") == 0
    assert shared(("cluster",), "cluster") == 0
    assert shared(None, "zone") == shared(None, "cluster") == 0  # both: a <-> d, b <-> c
    assert shared((), "zone") + shared((), "cluster") > 0  # no keys: tags ignored
