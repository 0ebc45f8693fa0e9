"""The streams leader's ``ProbingMemory``: a leader that stays offers its last plan to the next
probing round, whose target is carried over only then (the members run exactly what that plan
assigned)."""

from __future__ import annotations

import uuid

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamassign import (
    ClientAssignment,
    ClientState,
    HighAvailabilityTaskAssignor,
    Subtopology,
    TaskId,
    Topology,
)
from streamassign.errors import DuplicateProcessIdError
from streamassign.protocol import LATEST_OFFSET, NEVER, SubscriptionInfo
from streamassign.streams import (
    MemberAssignment,
    MemberSubscription,
    ProbingMemory,
    assign_streams,
)

# The shrunk counterexample of the tight bound in tests/test_ha.py
# (test_an_orphan_held_back_in_a_role_swap_meets_the_tight_bound_when_the_leader_stays), as
# streams members: one consumer per unit of capacity, every task stateful, every local copy
# restored up to its changelog end (lag 0). Process ids sort as the names there do.
TOPOLOGY = Topology([Subtopology(s, [f"t{s}"], stores=[f"s{s}"]) for s in range(3)], name="app")
COUNTS = {"t0": 7, "t1": 2, "t2": 5}
END = {TaskId(s, p): 1_000 for s, n in enumerate(COUNTS.values()) for p in range(n)}
PROCESSES = {  # name: (process id, capacity, runs, holds)
    "a": (1, 2, "0_2 1_0", "0_6 1_1"),
    "aa": (2, 4, "0_0 0_5 1_1 2_1", "0_1 0_2 2_0"),
    "b": (3, 3, "0_1 0_6 2_2", "1_0 2_4"),
    "c": (4, 3, "0_3 2_0", "0_4 0_5 2_2"),
    "d": (5, 2, "2_3", "0_0 2_1"),
}
NOW = 1_700_000_000_000


def tasks(text: str) -> frozenset[TaskId]:
    return frozenset(TaskId.parse(t) for t in text.split())


def subscription(
    pid: uuid.UUID, runs: frozenset[TaskId], holds: frozenset[TaskId]
) -> SubscriptionInfo:
    """What every consumer of process ``pid`` reports: its process's state."""
    sums = {**{t: END[t] for t in holds}, **dict.fromkeys(runs, LATEST_OFFSET)}
    return SubscriptionInfo(pid, offset_sums=sums)


def consumers(name: str, info: SubscriptionInfo, capacity: int) -> dict[str, MemberSubscription]:
    """The members of one process of ``capacity`` consumers."""
    return {
        f"{name}-{i}": MemberSubscription(TOPOLOGY.source_topics, info) for i in range(capacity)
    }


def first_members() -> dict[str, MemberSubscription]:
    members = {}
    for name, (pid, capacity, runs, holds) in PROCESSES.items():
        info = subscription(uuid.UUID(int=pid), tasks(runs), tasks(holds))
        members.update(consumers(name, info, capacity))
    return members


def next_members(
    result: dict[str, MemberAssignment], before: dict[str, MemberSubscription]
) -> dict[str, MemberSubscription]:
    """The members of ``before`` one probing interval after ``result``: every standby and
    warmup caught up, each consumer reporting its process's state and its own actives as
    previous actives."""
    processes: dict[str, list[str]] = {}
    for m in result:
        processes.setdefault(m.split("-")[0], []).append(m)
    members = {}
    for ms in processes.values():
        infos = [result[m].info for m in ms]
        runs = frozenset().union(*(i.active for i in infos))
        holds = frozenset().union(*(i.standby | i.warmup for i in infos))
        pid = before[ms[0]].info.process_id  # type: ignore[union-attr]
        state = subscription(pid, runs, holds)
        for m, info in zip(ms, infos, strict=True):
            own = SubscriptionInfo(
                state.process_id, offset_sums=state.offset_sums, previous_active=info.active
            )
            members[m] = MemberSubscription(TOPOLOGY.source_topics, own)
    return members


def lead(
    members: dict[str, MemberSubscription],
    memory: ProbingMemory | None,
    *,
    high_availability: bool = True,
    replicas: int = 1,
    warmups: int = 1,
) -> dict[str, MemberAssignment]:
    return assign_streams(
        TOPOLOGY,
        COUNTS,
        members,
        num_standby_replicas=replicas,
        end_offsets=END,
        high_availability=high_availability,
        max_warmup_replicas=warmups,
        now_ms=NOW,
        probing_memory=memory,
    )


def probing(result: dict[str, MemberAssignment]) -> bool:
    return any(a.info.next_rebalance_ms != NEVER for a in result.values())


def probing_rounds(memory: ProbingMemory | None) -> int:
    """Probing rounds until nothing is held back, each led with ``memory``."""
    members = first_members()
    result, rounds = lead(members, memory), 0
    while probing(result):
        rounds += 1
        assert rounds <= 10
        members = next_members(result, members)
        result = lead(members, memory)
    return rounds


def test_a_leader_that_stays_meets_the_tight_bound_afresh_takes_a_round_more() -> None:
    """Round 0 holds the orphans 0_4 and 2_4 back in role swaps (no warmup: the tight bound is
    1 round). Afresh, round 1 finds a target moving less from the interim history, which needs
    a warmup: 2 rounds. The leader that remembers round 0's target adopts it: 1 round."""
    assert probing_rounds(ProbingMemory()) == 1
    assert probing_rounds(None) == 2


def test_the_memory_keeps_the_last_plan() -> None:
    memory = ProbingMemory()
    result = lead(first_members(), memory)
    assert memory.last is not None
    active = {
        str(uuid.UUID(int=pid)): frozenset().union(
            *(a.info.active for m, a in result.items() if m.startswith(f"{name}-"))
        )
        for name, (pid, *_) in PROCESSES.items()
    }
    assert {p: a.active for p, a in memory.last.assignment.items()} == active
    assert set(memory.last.target) == set(active)
    assert {p: a.active for p, a in memory.last.target.items()} != active  # actives held back


def round_zero() -> tuple[dict[str, MemberSubscription], ProbingMemory]:
    """The members of round 1, and the memory of round 0's plan (which matches them)."""
    memory = ProbingMemory()
    members = first_members()
    return next_members(lead(members, memory), members), memory


def test_the_memory_is_offered_when_the_members_run_what_it_assigned() -> None:
    members, memory = round_zero()
    carried = lead(members, memory)
    assert not probing(carried) and probing(lead(members, None))


def test_a_stale_memory_is_not_offered() -> None:
    """A memory of a plan whose actives the members do not run exactly (a process that led
    long ago, a plan another leader changed since, a process gone or new) plans afresh: the
    result is the one without memory, and the new plan is remembered in its place."""
    members, memory = round_zero()
    assert memory.last is not None
    afresh = lead(members, None)
    assigned = dict(memory.last.assignment)
    pid, kept = next(iter(assigned.items()))
    stale_assignments = [
        {**assigned, pid: attrs.evolve(kept, active=kept.active - {min(kept.active)})},
        {**assigned, pid: attrs.evolve(kept, active=kept.active | {TaskId(2, 4)})},
        {p: a for p, a in assigned.items() if p != pid},
        {**assigned, str(uuid.UUID(int=99)): ClientAssignment()},
    ]
    for remembered in stale_assignments:
        stale = ProbingMemory(attrs.evolve(memory.last, assignment=remembered))
        assert lead(members, stale) == afresh
        assert stale.last is not None and stale.last.assignment != remembered


def test_a_restarted_process_gets_no_carried_target() -> None:
    members, memory = round_zero()
    restarted = dict(members)
    for m, sub in members.items():
        if m.startswith("b-"):  # b lost its state and runs nothing
            assert sub.info is not None
            restarted[m] = MemberSubscription(sub.topics, SubscriptionInfo(sub.info.process_id))
    assert lead(restarted, memory) == lead(restarted, None)


def test_the_sticky_assignor_ignores_and_forgets_the_memory() -> None:
    members, memory = round_zero()
    assert lead(members, memory, high_availability=False) == lead(
        members, None, high_availability=False
    )
    assert memory == ProbingMemory()


def test_a_memory_that_cannot_be_used_never_fails_the_group(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A memory changed by hand, matching the members but holding no usable target: refused
    (an unknown task) or logged (not an assignment at all), planned afresh, and replaced by
    the new plan."""
    members, memory = round_zero()
    assert memory.last is not None
    afresh = lead(members, None)
    pids = memory.last.assignment
    unknown = {p: ClientAssignment(active=frozenset({TaskId(9, 9)})) for p in pids}
    for target in (unknown, dict.fromkeys(pids, "not an assignment")):
        broken = ProbingMemory(attrs.evolve(memory.last, target=target))
        assert lead(members, broken) == afresh
        assert broken.last is not None and broken.last.target != target
    assert "the remembered plan could not be used; planning afresh" in caplog.text


def test_bad_input_with_a_memory_is_the_inputs_error_not_the_memorys(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An error of this round's input is raised as it is, not logged first as a memory that
    could not be used (planning afresh would fail the same way)."""
    _, memory = round_zero()
    twice = [ClientState("p"), ClientState("p")]
    with pytest.raises(DuplicateProcessIdError):
        memory.plan(HighAvailabilityTaskAssignor(1), [TaskId(0, 0)], twice)
    assert "could not be used" not in caplog.text


def rounds_until_settled(
    members: dict[str, MemberSubscription],
    memory: ProbingMemory | None,
    replicas: int,
    warmups: int,
) -> tuple[int, dict[str, MemberAssignment]]:
    """Probing rounds from ``members`` until nothing is held back, and the last result."""
    result, rounds = lead(members, memory, replicas=replicas, warmups=warmups), 0
    while probing(result):
        rounds += 1
        assert rounds <= 2 * len(END) * 2, "no convergence"
        members = next_members(result, members)
        result = lead(members, memory, replicas=replicas, warmups=warmups)
    return rounds, result


# A tenth of the profile's examples: 20 in dev, 200 in CI.
@settings(max_examples=max(10, settings().max_examples // 10))
@given(
    st.lists(st.integers(1, 3), min_size=1, max_size=3),
    st.lists(st.integers(1, 3), min_size=1, max_size=2),
    st.integers(0, 1),
    st.integers(1, 2),
)
def test_a_memory_never_costs_a_probing_round(
    old: list[int], new: list[int], replicas: int, warmups: int
) -> None:
    """Processes of the given capacities settle, then others join: led with a memory, the
    probing rounds are never more than led afresh. An empty memory changes no plan, and rounds
    led with one differ from afresh only once a target is carried, which holds nothing back.
    (On 1,000 examples of this strategy, 1 took a round less with the memory, 2026-11-27.)"""
    founders: dict[str, MemberSubscription] = {}
    for i, capacity in enumerate(old):
        founders.update(consumers(f"o{i}", SubscriptionInfo(uuid.UUID(int=i + 1)), capacity))
    _, settled = rounds_until_settled(founders, None, replicas, warmups)
    joined = next_members(settled, founders)
    for i, capacity in enumerate(new):
        joined.update(consumers(f"n{i}", SubscriptionInfo(uuid.UUID(int=100 + i)), capacity))
    first = lead(joined, ProbingMemory(), replicas=replicas, warmups=warmups)
    assert first == lead(joined, None, replicas=replicas, warmups=warmups)
    with_memory, _ = rounds_until_settled(joined, ProbingMemory(), replicas, warmups)
    afresh, _ = rounds_until_settled(joined, None, replicas, warmups)
    assert with_memory <= afresh
