"""A rejoining Faust worker's duplicate running claims (the Faust leader's
``_duplicate_claims_caught_up``): handed back only to a worker in its first recovery, never
to a veteran that expired while restoring a cold takeover; and a standby that has
applied nothing is never a running claim (Faust's -1 per changelog partition summed as is was
``LATEST_OFFSET``)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping

import pytest
from faust.types import TP

from streamassign import TaskId
from streamassign.faust.assignor import standby_offset_sum
from streamassign.faust.leader import RECOVERED_TAG, assign_faust
from streamassign.protocol import LATEST_OFFSET, AssignmentInfo, SubscriptionInfo
from streamassign.streams import MemberAssignment, MemberSubscription

SRC, CL = "orders", "app-totals-changelog"
COUNTS = {SRC: 6, CL: 6}
TOPICS = frozenset(COUNTS)
E = 1000  # every changelog partition's end offset (model)


def member(
    i: int,
    sums: Mapping[TaskId, int],
    previous: frozenset[TaskId],
    tags: Mapping[str, str] | None = None,
) -> MemberSubscription:
    info = SubscriptionInfo(
        uuid.UUID(int=i + 1),
        endpoint=f"http://w{i}:6066",
        offset_sums=dict(sums),
        previous_active=previous,
        client_tags=dict(tags or {}),
    )
    return MemberSubscription(TOPICS, info)


def run(members: Mapping[str, MemberSubscription]) -> dict[str, MemberAssignment]:
    return assign_faust(members, COUNTS, num_standby_replicas=1, changelog_topics={CL})


def table_sub() -> int:
    got = run({"x": member(0, {}, frozenset())})["x"].info
    return next(iter(got.active)).subtopology


def worker(i: int, active: list[TaskId], standby: list[TaskId]) -> MemberSubscription:
    sums = {**dict.fromkeys(standby, E), **dict.fromkeys(active, LATEST_OFFSET)}
    return member(i, sums, frozenset(active))


def test_a_veteran_that_expired_restoring_a_cold_takeover_is_handed_it_back_cold() -> None:
    """R (w2) ran t3 for a long time (caught up), then took over t0 cold when a worker died
    (true position 0 of E) and holds caught-up standbys of t1 and t4. Its session expired while
    it restored t0: a round without it gave t0 to w0 and t3 to w1 (their standby holders,
    caught up). R rejoins reporting t0 and t3 as running (LATEST_OFFSET: Faust reports every
    assigned active so, restored or not) and its standbys at E.

    Before the fix w0 and w1 each release the task R holds a caught-up standby of (t1, t4):
    R restores nothing. With the fix they release R's duplicate claims (t0, t3): t0 goes from
    w0, caught up, to R, which has none of it: a warm task made cold, E records to restore."""
    t = [TaskId(table_sub(), p) for p in range(6)]
    members = {
        "w0": worker(0, [t[0], t[1], t[2]], [t[3], t[5]]),
        "w1": worker(1, [t[3], t[4], t[5]], [t[0], t[2]]),
        "w2": worker(2, [t[0], t[3]], [t[1], t[4]]),
    }
    true_position = {
        "w0": dict.fromkeys(t, E) | {t[4]: 0},
        "w1": dict.fromkeys(t, E) | {t[1]: 0},
        "w2": {t[0]: 0, t[3]: E, t[1]: E, t[4]: E},
    }
    result = run(members)
    to_restore = sum(
        E - true_position[m].get(task, 0) for m in result for task in result[m].info.active
    )
    r_got = result["w2"].info.active
    assert t[0] not in r_got, ("R handed back a task it has no state of", sorted(r_got))
    assert to_restore == 0


@pytest.mark.parametrize(
    ("recovered", "handed_back"),
    [("1", False), ("0", True), (None, True)],
)
def test_a_member_that_says_whether_it_recovered_is_judged_by_that(
    recovered: str | None, handed_back: bool
) -> None:
    """The veteran R above, its standbys of t1 and t4 not yet read (fresh, 0: no
    progress the offset test could see). Saying its recovery completed once since it started
    (``RECOVERED_TAG`` 1), it is no worker in its first recovery: the tie-break's answer
    stands and it is not handed t0 back. Saying it has not (0), it is, and gets its claims
    back; without the tag (an older member) the offset test decides, which reads no
    progress as a first recovery."""
    t = [TaskId(table_sub(), p) for p in range(6)]
    r_sums = {t[0]: LATEST_OFFSET, t[3]: LATEST_OFFSET, t[1]: 0, t[4]: 0}
    tags = {RECOVERED_TAG: recovered} if recovered is not None else None
    members = {
        "w0": worker(0, [t[0], t[1], t[2]], [t[3], t[5]]),
        "w1": worker(1, [t[3], t[4], t[5]], [t[0], t[2]]),
        "w2": member(2, r_sums, frozenset({t[0], t[3]}), tags),
    }
    r_got = run(members)["w2"].info.active
    assert (t[0] in r_got) == handed_back, sorted(r_got)


SEEN_CL = "app-seen-changelog"
TWO_TABLES = {SRC: 8, CL: 8, SEEN_CL: 8}


def reports(i: int, got: AssignmentInfo, applied: Mapping[int, int]) -> MemberSubscription:
    """What Faust member ``i`` sends after running ``got`` a while, built as the member builds
    it: per changelog partition of its standbys, Faust's recovery tracks the last offset
    applied (``applied``: partition -> offset, -1 where there was nothing to apply, an empty
    changelog partition), summed by ``standby_offset_sum``; its actives run."""
    sums: dict[TaskId, int] = dict.fromkeys(got.active, LATEST_OFFSET)
    for t in got.standby:
        tracked = {TP(c, t.partition): applied[t.partition] for c in (CL, SEEN_CL)}
        if (offset := standby_offset_sum(tracked, t.partition, TWO_TABLES)) is not None:
            sums[t] = offset
    info = SubscriptionInfo(
        uuid.UUID(int=i + 1),
        endpoint=f"http://w{i}:6066",
        offset_sums=sums,
        previous_active=got.active,
    )
    return MemberSubscription(frozenset(TWO_TABLES), info)


def test_a_lost_worker_moves_no_task_between_survivors_when_changelogs_are_empty() -> None:
    """At steady state some partitions of both tables are empty (no key hashed there yet), so
    Faust's recovery tracks -1 for their changelog partitions on every standby, forever. Summed
    as is (-2 = ``LATEST_OFFSET``) each such standby read as a running claim, and at the next
    rebalance (here: w0 killed) the claim's tie-break moved the task from its caught-up owner to
    the standby holder with the smaller process id (live at 256 partitions: 11-17 per table).
    Now the survivors keep every task they ran."""
    changelogs = frozenset({CL, SEEN_CL})
    names = [f"w{i}" for i in range(4)]
    blank = {m: reports(i, AssignmentInfo(), {}) for i, m in enumerate(names)}
    settled = assign_faust(blank, TWO_TABLES, num_standby_replicas=1, changelog_topics=changelogs)
    applied = {p: (-1 if p % 2 else E) for p in range(8)}  # odd partitions: empty changelogs
    survivors = {m: reports(i, settled[m].info, applied) for i, m in enumerate(names) if i}
    result = assign_faust(
        survivors, TWO_TABLES, num_standby_replicas=1, changelog_topics=changelogs
    )
    moved = {m: sorted(settled[m].info.active - result[m].info.active) for m in survivors}
    assert moved == {m: [] for m in survivors}
