"""``streamassign.faust._flowstop``: when a rebalance that stopped Faust's flow counts as stuck,
on a fake clock (the watch looks every 7.5 s with the default 30 s bound)."""

from __future__ import annotations

from collections.abc import Iterable

from streamassign.faust._flowstop import ASSIGNING, JOINING, RECOVERING, REVOKING, FlowStop

#: The bounds the consumer derives from Faust's defaults: a join may wait 60 s
#: (broker_rebalance_timeout), a later step 30 s (recovery_stall_after), the flow 90 s in all.
JOIN_BOUND, STEP_BOUND = 60.0, 30.0
LOOK = 7.5


def stopped_at(now: float = 0.0) -> FlowStop:
    stop = FlowStop(now, 1_700_000_000.0, JOIN_BOUND + STEP_BOUND, progress=(1, 4, False))
    stop.enter(JOINING, now, JOIN_BOUND)
    return stop


def looks(stop: FlowStop, times: Iterable[float], progress: object = (1, 4, False)) -> list[str]:
    """The lines the watch logs at each of ``times`` (None left out)."""
    return [line for t in times if (line := stop.look(t, progress)) is not None]


def ticks(start: float, end: float) -> list[float]:
    return [start + LOOK * i for i in range(int((end - start) / LOOK) + 1)]


def test_a_normal_rebalance_is_not_reported() -> None:
    """A join of a few seconds, then Faust's callbacks and recovery set-up: nothing told."""
    stop = stopped_at()
    assert looks(stop, [0.0, 2.0]) == []
    stop.enter(ASSIGNING, 3.0, STEP_BOUND)
    stop.enter(RECOVERING, 3.1, STEP_BOUND)
    assert looks(stop, [7.5], progress=(1, 5, True)) == []


def test_a_join_held_for_a_slow_member_is_not_reported() -> None:
    """The broker holds a JoinGroup up to the rebalance timeout for a member slow to rejoin:
    55 s with nothing moving is still a normal rebalance."""
    stop = stopped_at()
    assert looks(stop, ticks(0.0, 55.0)) == []
    stop.enter(ASSIGNING, 55.0, STEP_BOUND)
    stop.enter(RECOVERING, 55.2, STEP_BOUND)
    assert looks(stop, [57.0, 60.0], progress=(1, 5, True)) == []


def test_a_join_that_never_ends_is_reported_once() -> None:
    stop = stopped_at()
    told = looks(stop, ticks(0.0, 600.0))
    assert len(told) == 1
    assert "has waited 60.0 s for the group's new assignment (JoinGroup/SyncGroup)" in told[0]
    assert "kafka-consumer-groups.sh --describe --state" in told[0]


def test_a_recovery_set_up_that_never_resumes_the_flow_is_reported_after_the_step_bound() -> None:
    stop = stopped_at()
    stop.enter(ASSIGNING, 2.0, STEP_BOUND)
    stop.enter(RECOVERING, 2.1, STEP_BOUND)
    told = {t: line for t in ticks(7.5, 300.0) if (line := stop.look(t, (1, 5, True)))}
    # The first look saw the new generation and the recovery started: 30 s from there.
    assert list(told) == [37.5]
    assert "has waited 30.0 s for Faust's table recovery to resume the flow" in told[37.5]
    assert "broker_request_timeout" in told[37.5]


def test_a_callback_that_never_returns_names_it() -> None:
    stop = stopped_at()
    stop.enter(ASSIGNING, 2.0, STEP_BOUND)
    (line,) = looks(stop, ticks(0.0, 120.0))
    assert "Faust's on_partitions_assigned (agents, topics, tables) to return" in line


def test_a_revoke_that_never_returns_names_the_agents() -> None:
    """Faust's revoke waits for the agents to finish the events they hold (the flow already
    stopped): one blocked for good holds the rebalance, here and in the whole group."""
    stop = FlowStop(0.0, 1_700_000_000.0, JOIN_BOUND + STEP_BOUND, progress=(1, 4, False))
    stop.enter(REVOKING, 0.0, JOIN_BOUND)
    (line,) = looks(stop, ticks(0.0, 120.0))
    assert "has waited 60.0 s for Faust's on_partitions_revoked to return" in line
    assert "this worker's agents" in line


def test_progress_seen_by_a_look_restarts_the_step_s_clock() -> None:
    """Faust's recovery starting (``in_recovery``) moves the set-up on: a new 30 s."""
    stop = stopped_at()
    stop.enter(RECOVERING, 0.0, STEP_BOUND)
    assert looks(stop, ticks(0.0, 22.5), progress=(1, 5, False)) == []
    assert looks(stop, ticks(30.0, 45.0), progress=(1, 5, True)) == []
    assert len(looks(stop, [60.0], progress=(1, 5, True))) == 1


def test_a_group_rebalancing_without_end_is_reported_once() -> None:
    """A new generation every 5 s, every step moving, the flow never resumed: told once the
    flow has been stopped for 90 s, with the count of rebalances."""
    stop = stopped_at()
    told: list[tuple[float, str]] = []
    for round_ in range(60):  # 300 s
        start = 5.0 * round_
        if round_:
            stop.enter(REVOKING, start, JOIN_BOUND, new_rebalance=True)
            stop.enter(JOINING, start + 0.1, JOIN_BOUND)
        stop.enter(ASSIGNING, start + 1, STEP_BOUND)
        stop.enter(RECOVERING, start + 1.1, STEP_BOUND)
        line = stop.look(start + 2, (round_ + 1, round_ + 5, False))
        if line is not None:
            told.append((start + 2, line))
    assert [t for t, _ in told] == [92.0]
    assert "19 rebalances and the flow never resumed" in told[0][1]
    assert "rebalancing without end" in told[0][1]


def test_one_slow_rebalance_is_bounded_by_its_steps_alone() -> None:
    """A revoke of 40 s (agents finishing their events), then a join of 55 s (a slow member):
    each step within its bound, the flow stopped past the episode bound (90 s here). One
    rebalance is not a group rebalancing without end: nothing told. Its last step stuck is
    told by that step's bound."""
    stop = FlowStop(0.0, 1_700_000_000.0, JOIN_BOUND + STEP_BOUND, progress=(1, 4, False))
    stop.enter(REVOKING, 0.0, JOIN_BOUND)
    told: list[tuple[float, str]] = []
    for t in ticks(0.0, 300.0):
        if t >= 40.0 and stop.step is REVOKING:
            stop.enter(JOINING, 40.0, JOIN_BOUND)
        if t >= 95.0 and stop.step is JOINING:
            stop.enter(ASSIGNING, 95.0, STEP_BOUND)
        if (line := stop.look(t, (1, 4, False))) is not None:
            told.append((t, line))
    assert [t for t, _ in told] == [127.5]  # the callback: 30 s from 95 s, at the next look
    assert "has waited 32.5 s for Faust's on_partitions_assigned" in told[0][1]
    assert "rebalancing without end" not in told[0][1]
