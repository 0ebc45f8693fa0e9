"""The streams leader with the high-availability assignor: warmups on the wire and the probing
rebalance time every member is told."""

from __future__ import annotations

import time
import uuid

from streamassign import PartitionGrouper, Subtopology, TaskId, Topology
from streamassign.protocol import LATEST_OFFSET, NEVER, SubscriptionInfo
from streamassign.streams import (
    MemberAssignment,
    MemberSubscription,
    assign_streams,
    client_states,
)

TOPOLOGY = Topology(
    [Subtopology(0, ["orders"], stores=["totals"]), Subtopology(1, ["clicks"])],
    name="app",
)
COUNTS = {"orders": 6, "clicks": 3}
TASKS = sorted(PartitionGrouper().group(TOPOLOGY, COUNTS))
STATEFUL = [t for t in TASKS if t.subtopology == 0]
END = dict.fromkeys(STATEFUL, 5_000_000)  # changelog end offsets (summed per task)
NOW = 1_700_000_000_000
INTERVAL = 60_000


def member(pid: int, version: int = 2, **kw: object) -> MemberSubscription:
    info = SubscriptionInfo(
        uuid.UUID(int=pid), version=version, latest_supported_version=version, **kw
    )  # type: ignore[arg-type]
    return MemberSubscription(TOPOLOGY.source_topics, info)


def lead(members: dict[str, MemberSubscription]) -> dict[str, MemberAssignment]:
    return assign_streams(
        TOPOLOGY,
        COUNTS,
        members,
        end_offsets=END,
        high_availability=True,
        max_warmup_replicas=2,
        probing_rebalance_interval_ms=INTERVAL,
        now_ms=NOW,
    )


def report(result: dict[str, MemberAssignment], m: str, version: int = 2) -> MemberSubscription:
    """What member ``m`` reports at the next rebalance: its actives running, its standbys and
    warmups restored up to the changelog end (a probing interval was enough)."""
    info = result[m].info
    sums = dict.fromkeys(info.active, LATEST_OFFSET)
    sums.update((t, END[t]) for t in info.standby | info.warmup)
    return member(int(m[1:]), version, offset_sums=sums, previous_active=info.active)


def test_a_new_process_warms_up_and_takes_over_through_probing_rebalances() -> None:
    old = {"p1": member(1, offset_sums=dict.fromkeys(TASKS, LATEST_OFFSET))}
    result = lead({**old, "p2": member(2)})
    p1, p2 = result["p1"].info, result["p2"].info
    assert set(STATEFUL) <= p1.active  # no stateful active moves onto empty state
    # Balanced per subtopology, p2's target is 3 of the 6 stateful tasks and 1 of the 3
    # stateless ones: it runs the stateless one at once (nothing to restore) and warms up
    # two stateful ones (the warmup budget), which p1 runs meanwhile.
    assert len(p2.active) == 1 and p2.active <= {t for t in TASKS if t.subtopology == 1}
    assert len(p2.warmup) == 2 and p2.warmup <= set(STATEFUL)
    assert {a.info.next_rebalance_ms for a in result.values()} == {NOW + INTERVAL}
    assert result["p1"].info.standby_by_host == {}  # no endpoints, no host maps

    rounds = 0
    while result["p1"].info.next_rebalance_ms != NEVER:
        rounds += 1
        warmed = result["p2"].info.warmup
        result = lead({m: report(result, m) for m in ("p1", "p2")})
        assert warmed <= result["p2"].info.active  # caught-up warmups became actives
        assert rounds <= 2 * len(STATEFUL)
    assert {len(result[m].info.active) for m in ("p1", "p2")} == {4, 5}
    assert {a.info.next_rebalance_ms for a in result.values()} == {NEVER}
    assert not any(a.info.warmup for a in result.values())


def test_version_1_members_get_warmups_as_standbys() -> None:
    old = {"p1": member(1, version=1, offset_sums=dict.fromkeys(TASKS, LATEST_OFFSET))}
    result = lead({**old, "p2": member(2, version=1)})
    p2 = result["p2"].info
    assert p2.common_version == 1 and not p2.warmup
    assert len(p2.standby) == 2 and p2.standby <= set(STATEFUL)  # the two warmups
    assert p2.next_rebalance_ms == NOW + INTERVAL


def test_balanced_group_needs_no_probing_and_sticky_mode_never_probes() -> None:
    first = lead({"p1": member(1), "p2": member(2)})
    assert {a.info.next_rebalance_ms for a in first.values()} == {NEVER}
    again = lead({m: report(first, m) for m in ("p1", "p2")})
    assert {m: a.info.active for m, a in again.items()} == {
        m: a.info.active for m, a in first.items()
    }
    old = {"p1": member(1, offset_sums=dict.fromkeys(TASKS, LATEST_OFFSET))}
    sticky = assign_streams(TOPOLOGY, COUNTS, {**old, "p2": member(2)}, end_offsets=END)
    assert {a.info.next_rebalance_ms for a in sticky.values()} == {NEVER}
    assert len(sticky["p2"].info.active & set(STATEFUL)) > 0  # sticky moves onto empty state


def test_every_member_hears_the_probing_time_even_one_without_tasks() -> None:
    old = {"p1": member(1, offset_sums=dict.fromkeys(TASKS, LATEST_OFFSET))}
    stranger = MemberSubscription({"orders"}, SubscriptionInfo(uuid.UUID(int=9)))
    result = lead({**old, "p2": member(2), "x": stranger})
    assert result["x"].partitions == ()
    assert result["x"].info.next_rebalance_ms == NOW + INTERVAL


def test_the_default_probing_time_is_the_wall_clock_plus_the_interval() -> None:
    old = {"p1": member(1, offset_sums=dict.fromkeys(TASKS, LATEST_OFFSET))}
    before = int(time.time() * 1000)
    result = assign_streams(
        TOPOLOGY, COUNTS, {**old, "p2": member(2)}, end_offsets=END, high_availability=True
    )
    after = int(time.time() * 1000)
    assert before + 600_000 <= result["p2"].info.next_rebalance_ms <= after + 600_000
    assert TaskId(0, 0) in result["p1"].info.active


def test_without_end_offsets_a_fresh_warmup_never_takes_over() -> None:
    """Running actives report no offset sum, so a lone warmup is the most advanced copy: with
    no (or a stale, partial) end offset its lag is unknown, not 0. The active stays, the warmup
    stays, and the group probes again; once the end offset is known and reached, it moves."""
    old = {"p1": member(1, offset_sums=dict.fromkeys(TASKS, LATEST_OFFSET))}
    first = lead({**old, "p2": member(2)})
    warm = first["p2"].info.warmup
    assert warm
    p1 = first["p1"].info
    barely = member(2, offset_sums=dict.fromkeys(warm, 10))  # 10 of 5,000,000 restored
    again = member(
        1, offset_sums=dict.fromkeys(p1.active, LATEST_OFFSET), previous_active=p1.active
    )
    other = next(t for t in STATEFUL if t not in warm)
    for ends in (None, {}, {other: END[other]}):
        result = assign_streams(
            TOPOLOGY,
            COUNTS,
            {"p1": again, "p2": barely},
            end_offsets=ends,
            high_availability=True,
            probing_rebalance_interval_ms=INTERVAL,
            now_ms=NOW,
        )
        assert not result["p2"].info.active & set(STATEFUL), ends
        assert warm <= result["p1"].info.active
        assert warm <= result["p2"].info.warmup  # keeps warming up
        assert result["p2"].info.next_rebalance_ms == NOW + INTERVAL
    done = member(2, offset_sums={t: END[t] for t in warm})
    result = lead({"p1": again, "p2": done})
    assert warm <= result["p2"].info.active


def test_sticky_mode_still_measures_lags_against_the_best_copy() -> None:
    copy = dict.fromkeys(STATEFUL[:1], 10)
    members = {"p1": member(1, offset_sums=copy), "p2": member(2, offset_sums={STATEFUL[0]: 50})}
    sticky, _, _ = client_states(members)
    assert {c.process_id: dict(c.lags) for c in sticky} == {
        str(uuid.UUID(int=1)): {STATEFUL[0]: 40},
        str(uuid.UUID(int=2)): {STATEFUL[0]: 0},
    }
    exact, _, _ = client_states(members, exact_lags=True)
    assert all(not c.lags and c.prev_standby == {STATEFUL[0]} for c in exact)


def test_partition_racks_and_rack_aware_tags_reach_the_high_availability_assignor() -> None:
    """A fresh group has nothing to hold back: HA gives what sticky gives with the same rack
    hints, and the hints change the assignment (they are not dropped on the HA path)."""
    zones = [("east", "z1", "h1"), ("west", "z2", "h1"), ("east", "z1", "h2"), ("west", "z2", "h2")]
    members = {
        f"p{i}": member(i + 1, rack=rack, client_tags={"zone": z, "host": h})
        for i, (rack, z, h) in enumerate(zones)
    }
    tasks = PartitionGrouper().group(TOPOLOGY, COUNTS)
    leaders = {tp: "west" if tp.partition % 2 == 0 else "east" for t in tasks for tp in tasks[t]}

    def tasks_of(high_availability: bool, **hints: object) -> dict[str, object]:
        result = assign_streams(
            TOPOLOGY,
            COUNTS,
            members,
            num_standby_replicas=1,
            end_offsets=END,
            high_availability=high_availability,
            **hints,  # type: ignore[arg-type]
        )
        return {m: (a.info.active, a.info.standby) for m, a in result.items()}

    plain = tasks_of(True)
    for hints in ({"partition_racks": leaders}, {"rack_aware_tags": ["zone"]}):
        assert tasks_of(True, **hints) == tasks_of(False, **hints) != plain, hints
