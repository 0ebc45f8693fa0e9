"""Consumer assignor benchmarks: streamassign's consumer assignors side by side with aiokafka's
built-in ones, on the same inputs, in the same run.

1. **Versus aiokafka's sticky** — 100 topics x 100 partitions, 500 members, uniform
   subscriptions: fresh, then one member leaves and two join. Time ratio, balance, moves.
2. **1M partitions** — 500 topics x 2000 partitions, 2000 members, uniform: sticky fresh and
   churn, cooperative sticky churn (what it withholds); aiokafka tried under a small budget.
3. **1M partitions, general path** — the same, with the last member on one topic only.
4. **Split subscriptions** — 100 topics x 200 partitions, 500 members: every 4th member on the
   first half of the topics, the rest on the second half; versus aiokafka's sticky.
5. **Memory** — peak of one sticky assignment as partitions, then members, grow.
6. **Every assignor** at a mid size (100k partitions x 500 members): time and balance.

Run ``python benchmarks/consumer_assignors.py [--quick] [--markdown docs/consumer.md]``.
"""

from __future__ import annotations

import gc
import json
import math
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import TypeVar

from _common import (
    Report,
    Timed,
    arguments,
    chosen,
    console,
    fmt_bool,
    fmt_bytes,
    fmt_ratio,
    fmt_time,
    machine_info,
    member_ids,
    peak_memory,
    timed,
    write_reports,
)
from _consumer_peers import (
    AIOKAFKA,
    AiokafkaArgs,
    Members,
    adapter_members,
    adapter_round,
    aiokafka_assign,
    aiokafka_members,
    aiokafka_round,
    cluster,
    decode,
    encode,
)
from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

from streamassign.aiokafka import GroupAssignor
from streamassign.consumer import (
    ConsumerAssignor,
    CooperativeStickyAssignor,
    FailoverAssignor,
    RangeAssignor,
    RebalancePlan,
    RoundRobinAssignor,
    ShuffledAssignor,
    StickyAssignor,
    Subscription,
    WeightedAssignor,
)
from streamassign.consumer.userdata import MemberData
from streamassign.pipeline.peers import by_topic, fresh_class

SECTION = "consumer-benchmarks"
HEADING = "## Performance"

#: Member id -> its partitions, as (topic, partition) tuples (ours are ``TopicPartition``s).
Assignment = Mapping[str, Sequence[tuple[str, int]]]
T = TypeVar("T")

# -- configuration -------------------------------------------------------------------------------

Size = tuple[int, int, int]  # (topics, partitions per topic, members)


@dataclass(frozen=True)
class Config:
    """Sizes, repeats and budgets of one run; ``--quick`` swaps in small ones."""

    repeats: int  # runs of ours per measurement (median), small cases
    min_total: float  # keep repeating a small measurement until this many seconds are spent
    peer_repeats: int  # runs of aiokafka's sticky per measurement
    versus: Size  # case 1
    versus_budget: float
    scale: Size  # cases 2 and 3
    scale_budget: float  # aiokafka's sticky tried at that size
    split: Size  # case 4
    split_budget: float
    memory_partitions: tuple[int, Sequence[int], int]  # (topics, partitions per topic, members)
    memory_members: tuple[int, int, Sequence[int]]  # (topics, partitions per topic, members)
    mid: Size  # case 6
    judged: bool  # whether the sizes are the targets' (else targets read "not judged")


FULL = Config(
    repeats=5,
    min_total=0.2,
    peer_repeats=3,
    versus=(100, 100, 500),
    versus_budget=300.0,
    scale=(500, 2000, 2000),
    scale_budget=10.0,
    split=(100, 200, 500),
    split_budget=120.0,
    memory_partitions=(500, [250, 500, 1000, 2000], 2000),
    memory_members=(500, 200, [500, 1000, 2000, 4000]),
    mid=(1000, 100, 500),
    judged=True,
)

QUICK = Config(
    repeats=3,
    min_total=0.0,
    peer_repeats=1,
    versus=(10, 20, 20),
    versus_budget=10.0,
    scale=(50, 200, 100),
    scale_budget=1.0,
    split=(20, 50, 40),
    split_budget=5.0,
    memory_partitions=(50, [50, 100, 200], 100),
    memory_members=(50, 100, [50, 100, 200]),
    mid=(100, 100, 50),
    judged=False,
)

# -- workloads -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """One consumer group: partitions per topic and each member's subscribed topics."""

    partitions: dict[str, int]
    topics: dict[str, frozenset[str]]

    @property
    def size(self) -> int:
        return sum(self.partitions.values())

    def subscriptions(
        self, history: Assignment | None = None, user_data: Mapping[str, bytes] | None = None
    ) -> dict[str, Subscription]:
        """Our input: members holding their ``history`` partitions from generation 1."""
        history = history or {}
        return {
            m: Subscription(
                ts,
                owned_partitions=history.get(m, ()),
                generation=1 if m in history else -1,
                user_data=(user_data or {}).get(m, b""),
            )
            for m, ts in self.topics.items()
        }

    def churn(self, newcomers: Sequence[frozenset[str]]) -> Group:
        """The middle member (in id order) leaves; ``len(newcomers)`` members join."""
        members = sorted(self.topics)
        leaving = members[len(members) // 2]
        topics = {m: ts for m, ts in self.topics.items() if m != leaving}
        topics |= dict(zip(member_ids(len(newcomers), "new"), newcomers, strict=True))
        return Group(self.partitions, topics)


def topic_names(count: int) -> list[str]:
    return [f"topic{i:04d}" for i in range(count)]


def uniform(size: Size) -> Group:
    """Every member subscribed to every topic."""
    n_topics, per_topic, n_members = size
    names = topic_names(n_topics)
    everything = frozenset(names)
    return Group(
        dict.fromkeys(names, per_topic), dict.fromkeys(member_ids(n_members, "m"), everything)
    )


def last_on_one_topic(size: Size) -> Group:
    """Uniform, except the last member, subscribed to the first topic only."""
    group = uniform(size)
    last = max(group.topics)
    return Group(group.partitions, group.topics | {last: frozenset([min(group.partitions)])})


def split_halves(size: Size) -> Group:
    """Every 4th member on the first half of the topics, the others on the second half."""
    n_topics, per_topic, n_members = size
    names = topic_names(n_topics)
    first, second = frozenset(names[: n_topics // 2]), frozenset(names[n_topics // 2 :])
    members = member_ids(n_members, "m")
    return Group(
        dict.fromkeys(names, per_topic),
        {m: first if i % 4 == 0 else second for i, m in enumerate(members)},
    )


def const(value: T) -> Callable[[], T]:
    """An input maker returning ``value`` (immutable inputs serve every run)."""
    return lambda: value


def leader_input(
    make: Callable[[], T], meta: ClusterMetadata, members: Members
) -> Callable[[], tuple[T, ClusterMetadata, Members]]:
    """An input maker giving each run a fresh leader (a new class or instance)."""
    return lambda: (make(), meta, members)


# -- quality -------------------------------------------------------------------------------------


def counts(group: Group, assignment: Assignment) -> dict[str, int]:
    return {m: len(assignment.get(m, ())) for m in group.topics}


def spread(group: Group, assignment: Assignment) -> int:
    """Max minus min partitions per member."""
    c = counts(group, assignment).values()
    return max(c) - min(c)


def kip54_gap(group: Group, assignment: Assignment) -> int:
    """Largest (owner's count - count of another member subscribed to the partition's topic)
    over all partitions: KIP-54 balanced when at most 1 (no move would make it more even).

    Linear: per distinct subscription the lightest member, per topic its heaviest owner.
    """
    count = counts(group, assignment)
    lightest: dict[frozenset[str], int] = {}
    for m, ts in group.topics.items():
        lightest[ts] = min(lightest.get(ts, count[m]), count[m])
    low = {t: math.inf for t in group.partitions}
    for ts, c in lightest.items():
        for t in ts:
            low[t] = min(low[t], c)
    high: dict[str, int] = {}
    for m, tps in assignment.items():
        for t in {t for t, _ in tps}:
            high[t] = max(high.get(t, 0), count[m])
    return int(max((high[t] - low[t] for t in high), default=0))


def moved(history: Assignment | None, assignment: Assignment) -> int:
    """Partitions taken from a member still in the group (a departed member's must move)."""
    if not history:
        return 0
    owner = {tp: m for m, tps in history.items() for tp in tps}
    return sum(
        1
        for m, tps in assignment.items()
        for tp in tps
        if (was := owner.get(tp, m)) != m and was in assignment
    )


def move_bound(group: Group, history: Assignment | None) -> int:
    """Fewest moves of any assignment whose counts differ by at most one: the ceilings go to
    the members holding most (valid) partitions, each keeps up to its quota."""
    if not history:
        return 0
    held = sorted(
        (
            sum(1 for t, p in history.get(m, ()) if t in ts and 0 <= p < group.partitions[t])
            for m, ts in group.topics.items()
        ),
        reverse=True,
    )
    base, extra = divmod(group.size, len(held))
    return sum(max(0, h - base - (k < extra)) for k, h in enumerate(held))


def _bound_cell(group: Group, history: Assignment | None, result: Assignment) -> str:
    """`` (bound)`` when the result's counts differ by at most one (the bound's premise)."""
    if not history or spread(group, result) > 1:
        return ""
    return f" ({move_bound(group, history):,})"


def problems(group: Group, assignment: Assignment, complete: bool = True) -> str:
    """Why ``assignment`` is invalid for ``group`` ("" when valid)."""
    if set(assignment) != set(group.topics):
        return "members missing or unknown"
    total = 0
    for m, tps in assignment.items():
        total += len(tps)
        for t, p in tps:
            if t not in group.topics[m] or not 0 <= p < group.partitions.get(t, 0):
                return f"{m} got {t}/{p}"
    if len({tp for tps in assignment.values() for tp in tps}) != total:
        return "a partition assigned twice"
    if complete and total != group.size:
        return f"{group.size - total} partitions unassigned"
    return ""


@dataclass(frozen=True)
class Quality:
    """Formatted quality cells of one result; ``gap`` as in ``kip54_gap``."""

    spread: str
    balanced: str
    moved: str
    gap: int | None


def balance_cells(group: Group, history: Assignment | None, result: Assignment | None) -> Quality:
    """Spread, KIP-54 balance and moves of a result (``None``: the run had none)."""
    if result is None:
        return Quality("—", "—", "—", None)
    bad = problems(group, result)
    if bad:
        return Quality(f"invalid ({bad})", "—", "—", None)
    gap = kip54_gap(group, result)
    moves = str(moved(history, result)) if history else "—"
    return Quality(str(spread(group, result)), fmt_bool(gap <= 1), moves, gap)


def pair(ours: str, peer: str) -> str:
    return f"{ours} / {peer}"


# -- findings ------------------------------------------------------------------------------------


@dataclass
class Findings:
    """Targets checked and facts noticed, for the summary and the reading."""

    judged: bool
    targets: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def target(self, case: str, goal: str, measured: str, met: bool | None) -> None:
        """Record a target; ``met=None`` for a figure that is only reported."""
        verdict = ("met" if met else "**not met**") if self.judged else "not judged (--quick)"
        if met is None:
            verdict = "reported"
        self.targets.append([case, goal, measured, verdict])

    def note(self, text: str) -> None:
        self.notes.append(text)
        console.print(f"[cyan]note:[/] {text}")


# -- 1 and 4: versus aiokafka's sticky ---------------------------------------------------------


def versus(
    cfg: Config,
    out: Findings,
    case: str,
    title: str,
    group: Group,
    newcomers: Sequence[frozenset[str]],
    budget: float,
    ratio_target: float | None,
    time_target: float | None,
) -> list[Report]:
    """Fresh, then churn, for ours (pure and as a leader round) and aiokafka's sticky; then
    aiokafka's round robin and range on the same inputs as reference points.

    The churn round's history is aiokafka's sticky fresh result (ours when it has none), the
    same for every assignor.
    """
    report = Report(
        f"{case}. {title}: ours vs aiokafka's sticky",
        [
            "round",
            "ours",
            "ours, leader round",
            "aiokafka sticky",
            "aiokafka / ours, leader rounds",
            "aiokafka / ours pure",
            "max-min (ours / aiokafka)",
            "KIP-54 balanced",
            "moved (bound)",
        ],
        notes=(
            "*ours* is `StickyAssignor.assign`; *leader round* is the same through our aiokafka "
            "adapter, called as aiokafka's leader calls its sticky: `assign(cluster, members)` "
            "on decoded JoinGroup metadata, including reading user data, validating and "
            "encoding the SyncGroup bytes; aiokafka's time likewise includes encoding its "
            f"result. aiokafka runs are cut at {budget:g} s. Churn: the middle member leaves, "
            "two join; every assignor starts from aiokafka's fresh result (ours if it has "
            "none). *moved*: partitions taken from a member still present; in parentheses, when "
            "ours differs by at most one between members, the fewest moves of any such "
            "assignment."
        ),
    )
    refs = Report(
        f"{case}. {title}: aiokafka's round robin and range on the same inputs",
        ["round", "assignor", "leader round", "max-min", "KIP-54 balanced", "moved"],
    )
    history: Assignment | None = None
    current = group
    rounds: list[tuple[str, Quality, Quality, Timed[object]]] = []
    for label in ("fresh", "1 leaves, 2 join"):
        if history is not None:
            current = group.churn(newcomers)
        meta = cluster(current.partitions)
        ours = timed(
            partial(StickyAssignor().assign, current.partitions),
            const(current.subscriptions(history)),
            cfg.repeats,
            None,
            cfg.min_total,
        )
        assert ours.result is not None, ours.error
        lead = timed(
            adapter_round,
            leader_input(
                partial(GroupAssignor, StickyAssignor()),
                meta,
                adapter_members(StickyAssignor, current.topics, history),
            ),
            cfg.repeats,
            None,
            cfg.min_total,
        )
        assert lead.result is not None, lead.error
        if _as_sets(decode(lead.result)) != _as_sets(ours.result):
            out.note(f"Case {case}, {label}: the adapter's result differs from the pure one's.")
        peer = timed(
            aiokafka_split_round,
            leader_input(
                partial(fresh_class, AIOKAFKA["sticky"]),
                meta,
                aiokafka_members(AIOKAFKA["sticky"], current.topics, history),
            ),
            cfg.peer_repeats,
            budget,
        )
        peer_result = None if peer.result is None else decode(peer.result[0])
        q_ours = balance_cells(current, history, ours.result)
        q_peer = balance_cells(current, history, peer_result)
        bound = _bound_cell(current, history, ours.result)
        report.add(
            label,
            fmt_time(ours),
            fmt_time(lead),
            fmt_time(peer),
            fmt_ratio(peer, lead),
            fmt_ratio(peer, ours),
            pair(q_ours.spread, q_peer.spread),
            pair(q_ours.balanced, q_peer.balanced),
            "—" if history is None else f"{pair(q_ours.moved, q_peer.moved)}{bound}",
        )
        console.print(f"  case {case} {label}: ours {fmt_time(ours)}, aiokafka {fmt_time(peer)}")
        _judge_versus(out, case, label, ours, lead, peer, ratio_target, time_target)
        rounds.append((label, q_ours, q_peer, peer))
        if peer.result is not None and peer.seconds and peer.result[1] > 0.05 * peer.seconds:
            out.note(
                f"Case {case}, {label}: encoding is {peer.result[1] / peer.seconds:.0%} of "
                "aiokafka's leader round."
            )
        for name in ("roundrobin", "range"):
            got = timed(
                aiokafka_round,
                leader_input(
                    partial(fresh_class, AIOKAFKA[name]),
                    meta,
                    aiokafka_members(AIOKAFKA[name], current.topics, history),
                ),
                cfg.repeats,
                budget,
                cfg.min_total,
            )
            q = balance_cells(current, history, None if got.result is None else decode(got.result))
            refs.add(label, name, fmt_time(got), q.spread, q.balanced, q.moved)
        history = peer_result if peer_result is not None else ours.result
    _versus_note(out, case, rounds)
    report.show()
    refs.show()
    return [report, refs]


def _versus_note(
    out: Findings, case: str, rounds: Sequence[tuple[str, Quality, Quality, Timed[object]]]
) -> None:
    """One sentence on how aiokafka's sticky results compare with ours."""
    missing = [label for label, _, peer, _ in rounds if peer.gap is None]
    if missing:
        runs = "; ".join(f"{label}: {fmt_time(run)}" for label, _, _, run in rounds)
        out.note(
            f"Case {case}: aiokafka's sticky gave no result in {', '.join(missing)} ({runs}); "
            "its ratios are lower bounds."
        )
        return
    worse = [
        label
        for label, ours, peer, _ in rounds
        if peer.gap is not None and ours.gap is not None and peer.gap > 1 >= ours.gap
    ]
    balance = (
        f"is not KIP-54 balanced ({', '.join(worse)}) where ours is"
        if worse
        else "is KIP-54 balanced like ours"
    )
    spreads = ", ".join(f"{label} {o.spread} / {p.spread}" for label, o, p, _ in rounds)
    moves = "; ".join(
        f"moved {o.moved} (ours) / {p.moved} on {label}" for label, o, p, _ in rounds[1:]
    )
    out.note(f"Case {case}: aiokafka's sticky {balance} (max-min {spreads}); {moves}.")


def aiokafka_split_round(args: AiokafkaArgs) -> tuple[dict[str, bytes], float]:
    """``aiokafka_round``, also returning the seconds spent encoding (the rest is ``assign``)."""
    result = aiokafka_assign(args)
    start = time.perf_counter()
    raw = encode(result)
    return raw, time.perf_counter() - start


def _as_sets(assignment: Assignment) -> dict[str, set[tuple[str, int]]]:
    return {m: {tuple(tp) for tp in tps} for m, tps in assignment.items()}  # type: ignore[misc]


def _judge_versus(
    out: Findings,
    case: str,
    label: str,
    ours: Timed[object],
    lead: Timed[object],
    peer: Timed[object],
    ratio_target: float | None,
    time_target: float | None,
) -> None:
    assert ours.seconds is not None and lead.seconds is not None
    if ratio_target is not None:
        if peer.seconds is None and peer.budget is None:
            out.target(
                case, f"{label}: ≥ {ratio_target:g}x faster", f"aiokafka: {peer.error}", False
            )
        else:
            slow = peer.seconds if peer.seconds is not None else float(peer.budget or 0)
            met = slow / lead.seconds >= ratio_target
            out.target(
                case,
                f"{label}: ≥ {ratio_target:g}x faster than aiokafka's sticky",
                f"{fmt_ratio(peer, lead)} (leader rounds), {fmt_ratio(peer, ours)} (pure assign)",
                met,
            )
    if time_target is not None:
        out.target(
            case,
            f"{label}: under {time_target:g} s",
            f"{fmt_time(ours)} (leader round {fmt_time(lead)}); aiokafka {fmt_time(peer)}",
            ours.seconds < time_target,
        )


def versus_workload(cfg: Config, out: Findings) -> list[Report]:
    """Case 1: uniform subscriptions, the size of aiokafka's own sticky use."""
    group = uniform(cfg.versus)
    everything = frozenset(group.partitions)
    return versus(
        cfg,
        out,
        "1",
        f"{_size(cfg.versus)}, uniform",
        group,
        [everything, everything],
        cfg.versus_budget,
        ratio_target=50.0,
        time_target=None,
    )


def split_workload(cfg: Config, out: Findings) -> list[Report]:
    """Case 4: two disjoint subscriptions, 1 : 3 members (the general path)."""
    group = split_halves(cfg.split)
    names = sorted(group.partitions)
    half = len(names) // 2
    return versus(
        cfg,
        out,
        "4",
        f"{_size(cfg.split)}, split subscriptions",
        group,
        [frozenset(names[:half]), frozenset(names[half:])],
        cfg.split_budget,
        ratio_target=None,
        time_target=5.0,
    )


def _size(size: Size) -> str:
    n_topics, per_topic, n_members = size
    return f"{n_topics} topics x {per_topic} partitions, {n_members} members"


# -- 2 and 3: a million partitions ---------------------------------------------------------------


def scale_workload(cfg: Config, out: Findings) -> list[Report]:
    """Cases 2 and 3: fresh and churn at 1M partitions; aiokafka's sticky under a small budget."""
    n_topics, per_topic, n_members = cfg.scale
    report = Report(
        f"2 and 3. {n_topics * per_topic:,} partitions ({n_topics} topics), {n_members:,} members",
        [
            "case",
            "round",
            "ours",
            "ours, leader round",
            "max-min",
            "KIP-54 balanced",
            "moved (bound)",
            "withheld",
        ],
        notes=(
            "Single runs. Case 2: uniform subscriptions (the exact path); case 3: the last "
            "member subscribes to one topic only (the general path). Churn: the middle member "
            "leaves, two join, history is our fresh result. *withheld*: partitions the "
            "cooperative assignor keeps from everyone until their owner revokes them (a "
            "follow-up rebalance assigns them). *leader round* and *moved* as in case 1."
        ),
    )
    cases = [
        ("2", "uniform", uniform(cfg.scale), 5.0),
        ("3", "last member on one topic", last_on_one_topic(cfg.scale), 30.0),
    ]
    cooperative: list[tuple[str, int, int, Timed[object], Timed[Assignment]]] = []
    for case, name, group, target in cases:
        everything = frozenset(group.partitions)
        history: Assignment | None = None
        current = group
        times: list[tuple[Timed[Assignment], Timed[object]]] = []
        for label in ("fresh", "1 leaves, 2 join"):
            if history is not None:
                current = group.churn([everything, everything])
            subs = current.subscriptions(history)
            ours = timed(partial(StickyAssignor().assign, current.partitions), const(subs), 1)
            assert ours.result is not None and ours.seconds is not None, ours.error
            lead: Timed[object] = timed(
                adapter_round,
                leader_input(
                    partial(GroupAssignor, StickyAssignor()),
                    cluster(current.partitions),
                    adapter_members(StickyAssignor, current.topics, history),
                ),
                1,
            )
            times.append((ours, lead))
            q = balance_cells(current, history, ours.result)
            bound = _bound_cell(current, history, ours.result)
            report.add(
                f"{case}. {name}",
                label,
                fmt_time(ours),
                fmt_time(lead),
                q.spread,
                q.balanced,
                "—" if history is None else f"{q.moved}{bound}",
                "—",
            )
            console.print(f"  case {case} {label}: ours {fmt_time(ours)}, leader {fmt_time(lead)}")
            out.target(
                case,
                f"{label}: under {target:g} s, balanced",
                f"{fmt_time(ours)} (leader round {fmt_time(lead)}), KIP-54 balanced: {q.balanced}",
                ours.seconds < target and q.gap is not None and q.gap <= 1,
            )
            if history is None:
                history = ours.result
                continue
            least = move_bound(current, history)
            if bound and int(q.moved) > least:
                out.note(
                    f"Case {case}, churn: ours moved {int(q.moved):,} partitions where {least:,} "
                    "suffice for the same counts: the general path is balanced but not as sticky "
                    "as it could be."
                )
            withheld, took = _cooperative(report, case, name, current, history, subs)
            cooperative.append((case, withheld, int(q.moved), took, ours))
        if case == "2":
            _leader_note(out, case, target, times)
            _aiokafka_at_scale(cfg, out, report, group)
        del history
    same = all(withheld == moves for _, withheld, moves, _, _ in cooperative)
    out.note(
        "The cooperative churn round withholds "
        + ("exactly the partitions the sticky target moves: " if same else "")
        + "; ".join(
            f"{withheld:,} in case {case}"
            + ("" if same else f" (sticky moves {moves:,})")
            + f", in {fmt_time(took)} against {fmt_time(sticky)} for sticky"
            for case, withheld, moves, took, sticky in cooperative
        )
        + "."
    )
    report.show()
    return [report]


def _cooperative(
    report: Report,
    case: str,
    name: str,
    group: Group,
    history: Assignment,
    subs: Mapping[str, Subscription],
) -> tuple[int, Timed[object]]:
    """The cooperative plan of a churn round: a row, and what it withholds in what time."""
    got: Timed[RebalancePlan] = timed(
        partial(CooperativeStickyAssignor().plan, group.partitions), const(subs), 1
    )
    assert got.result is not None, got.error
    plan = got.result
    withheld = sum(len(v) for v in plan.revoking.values())
    bad = problems(group, plan.assignment, complete=False)
    follow = "" if plan.followup_needed == (withheld > 0) else " (follow-up flag wrong)"
    report.add(
        f"{case}. {name}",
        "1 leaves, 2 join: cooperative",
        fmt_time(got),
        "—",
        "—",
        "—",
        str(moved(history, plan.assignment)),
        f"{withheld:,}" + (f" (invalid: {bad})" if bad else "") + follow,
    )
    return withheld, got


def _leader_note(
    out: Findings,
    case: str,
    target: float,
    times: Sequence[tuple[Timed[Assignment], Timed[object]]],
) -> None:
    """How the leader round compares with the assignment, and how much is protocol encoding."""
    (ours, lead), (churn, churn_lead) = times
    assert ours.result is not None
    objects = {
        m: ConsumerProtocolMemberAssignment(0, by_topic(tps), b"") for m, tps in ours.result.items()
    }
    took = timed(encode, const(objects), 1)
    within = all(t.seconds is not None and t.seconds < target for _, t in times)
    out.note(
        f"Case {case}: the assignment takes {fmt_time(ours)} fresh and {fmt_time(churn)} churn; "
        f"a whole leader round through the aiokafka adapter takes {fmt_time(lead)} and "
        f"{fmt_time(churn_lead)} ({'within' if within else 'over'} the {target:g} s target), "
        f"{fmt_time(took)} of the fresh one being aiokafka's own protocol encoding of the "
        "SyncGroup assignments (`ConsumerProtocolMemberAssignment.encode`, paid by any aiokafka "
        "leader at this size); churn rounds also decode every member's owned partitions."
    )


def _aiokafka_at_scale(cfg: Config, out: Findings, report: Report, group: Group) -> None:
    """aiokafka's sticky on case 2's fresh round, cut at a small budget.

    Its first step lists every potential consumer of every partition (partitions x members
    entries: 2e9 at 1M x 2000, some 16 GB), so it is cut long before it could finish.
    """
    peer = timed(
        aiokafka_round,
        leader_input(
            partial(fresh_class, AIOKAFKA["sticky"]),
            cluster(group.partitions),
            aiokafka_members(AIOKAFKA["sticky"], group.topics),
        ),
        1,
        cfg.scale_budget,
    )
    report.add("2. uniform", "fresh: aiokafka sticky", fmt_time(peer), "—", "—", "—", "—", "—")
    console.print(f"  aiokafka sticky at scale: {fmt_time(peer)}")
    out.note(
        f"Case 2: aiokafka's sticky, given {cfg.scale_budget:g} s for the fresh round, took "
        f"{fmt_time(peer)}; its first step alone lists every potential consumer of every "
        f"partition ({group.size * len(group.topics):,} list entries)."
    )


# -- 5. memory -----------------------------------------------------------------------------------

RSS_CHILD = """
import json, sys
sys.path.insert(0, {here!r})
import consumer_assignors as b
print(json.dumps(b.rss_child({size!r}, {churn!r})))
"""


def _status(key: str) -> int:
    """A ``/proc/self/status`` value in bytes (Linux)."""
    found = re.search(rf"^{key}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    assert found, key
    return int(found.group(1)) * 1024


def rss_child(size: Size, churn: bool) -> dict[str, int]:
    """In a fresh process: the resident-set peak of one sticky assignment above its inputs.

    The kernel's high-water mark is reset after the inputs are built (``clear_refs``), so
    building the churn round's history does not count.
    """
    group = uniform(size)
    subs = group.subscriptions()
    if churn:
        # History dealt round robin (what a fresh uniform assignment is) and streamed into the
        # subscriptions: garbage left from building it would be reused and hide the peak.
        names = sorted(group.partitions)
        per_topic, total = group.partitions[names[0]], group.size
        members = sorted(group.topics)

        def dealt(k: int) -> Iterator[tuple[str, int]]:
            return ((names[i // per_topic], i % per_topic) for i in range(k, total, len(members)))

        group = group.churn([frozenset(names)] * 2)
        subs = {
            m: Subscription(group.topics[m], owned_partitions=dealt(k), generation=1)
            for k, m in enumerate(members)
            if m in group.topics
        }
        subs |= {m: Subscription(ts) for m, ts in group.topics.items() if m not in subs}
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    before = _status("VmRSS")
    StickyAssignor().assign(group.partitions, subs)
    return {"before": before, "peak": _status("VmHWM")}


def rss_peak(size: Size, churn: bool) -> int | None:
    """``rss_child`` in a subprocess; None where it cannot run (not Linux, no permission)."""
    code = RSS_CHILD.format(here=str(Path(__file__).resolve().parent), size=size, churn=churn)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        console.print(f"[yellow]RSS measurement failed: {done.stderr.strip()[-300:]}")
        return None
    got = json.loads(done.stdout.strip().splitlines()[-1])
    return int(got["peak"] - got["before"])


def memory_workload(cfg: Config, out: Findings) -> list[Report]:
    """Case 5: peak memory of one sticky assignment as partitions grow (members fixed), then
    members (partitions fixed); linear memory shows as a flat marginal cost."""
    report = Report(
        "5. Peak memory of one sticky assignment (uniform subscriptions)",
        [
            "grows",
            "partitions",
            "members",
            "fresh: peak",
            "fresh: B / (P + M)",
            "churn: peak",
            "churn: B / (P + M)",
            "fresh: marginal cost",
        ],
        notes=(
            "`tracemalloc` peak of Python allocations above the inputs (its own bookkeeping "
            "is not counted); *churn* has the fresh result as history (1 leaves, 2 join). "
            "*marginal cost*: extra bytes per added partition (or member) since the row "
            "above: flat means linear. The last rows measure the same at the largest size as "
            "the resident-set peak of a fresh process (allocator overhead included)."
        ),
    )
    topics, per_topic_list, fixed_members = cfg.memory_partitions
    m_topics, m_per_topic, member_list = cfg.memory_members
    sizes: list[tuple[str, Size]] = [
        ("partitions", (topics, n, fixed_members)) for n in per_topic_list
    ]
    sizes += [("members", (m_topics, m_per_topic, n)) for n in member_list]
    marginals: dict[str, list[float]] = {"partitions": [], "members": []}
    previous: tuple[str, int, int, int] | None = None
    largest: tuple[Size, int] | None = None
    for grows, size in sizes:
        group = uniform(size)
        n_part, n_mem = group.size, len(group.topics)
        fresh_subs = group.subscriptions()
        first = StickyAssignor().assign(group.partitions, fresh_subs)
        churned = group.churn([frozenset(group.partitions)] * 2)
        churn_subs = churned.subscriptions(first)
        del first
        p_fresh = peak_memory(partial(StickyAssignor().assign, group.partitions), fresh_subs)
        p_churn = peak_memory(partial(StickyAssignor().assign, churned.partitions), churn_subs)
        del fresh_subs, churn_subs
        marginal = "—"
        if previous is not None and previous[0] == grows:
            added = (n_part - previous[2]) if grows == "partitions" else (n_mem - previous[3])
            cost = (p_fresh - previous[1]) / added
            marginals[grows].append(cost)
            marginal = f"{cost:,.0f} B / {grows[:-1]}"
        previous = (grows, p_fresh, n_part, n_mem)
        report.add(
            grows,
            f"{n_part:,}",
            f"{n_mem:,}",
            fmt_bytes(p_fresh),
            f"{p_fresh / (n_part + n_mem):,.0f}",
            fmt_bytes(p_churn),
            f"{p_churn / (n_part + n_mem + 1):,.0f}",
            marginal,
        )
        console.print(f"  memory {n_part:,} x {n_mem:,}: {fmt_bytes(p_fresh)}")
        if largest is None or n_part * n_mem > largest[1]:
            largest = (size, n_part * n_mem)
        if grows == "partitions" and size == (topics, max(per_topic_list), fixed_members):
            peak_at_largest = (p_fresh, p_churn)
    assert largest is not None
    size = largest[0]
    n_part, n_mem = size[0] * size[1], size[2]
    rss = [rss_peak(size, churn) for churn in (False, True)]
    report.add(
        "RSS, own process",
        f"{n_part:,}",
        f"{n_mem:,}",
        *(
            cell
            for peak in rss
            for cell in (
                "—" if peak is None else fmt_bytes(peak),
                "—" if peak is None else f"{peak / (n_part + n_mem):,.0f}",
            )
        ),
        "—",
    )
    flat = all(max(v) <= 1.5 * min(v) for v in marginals.values() if v)
    per_member = marginals["members"]
    out.target(
        "5",
        "grows with partitions + members, never their product",
        "marginal cost per partition "
        + ", ".join(f"{c:,.0f}" for c in marginals["partitions"])
        + " B; per member "
        + ", ".join(f"{c:,.0f}" for c in per_member)
        + " B",
        flat,
    )
    fresh_peak, churn_peak = peak_at_largest
    out.target(
        "5",
        f"peak at {n_part:,} x {n_mem:,} (report)",
        f"{fmt_bytes(fresh_peak)} fresh, {fmt_bytes(churn_peak)} churn (tracemalloc); "
        + " / ".join("—" if r is None else fmt_bytes(r) for r in rss)
        + " (RSS)",
        None,
    )
    if per_member:
        out.note(
            f"Memory per member is large: about {sum(per_member) / len(per_member):,.0f} B "
            f"per added member at {m_topics} topics "
            f"({sum(per_member) / len(per_member) / m_topics:,.0f} B per subscribed topic), "
            "against a few hundred bytes per partition: every member's subscription is "
            "rebuilt as its own frozenset of topic indices, even when all are identical."
        )
    report.show()
    return [report]


# -- 6. every assignor -------------------------------------------------------------------------


def mid_workload(cfg: Config, out: Findings) -> list[Report]:
    """Case 6: every assignor on one mid-size fresh group; aiokafka's where it has one."""
    group = uniform(cfg.mid)
    members = sorted(group.topics)
    weight = {m: 1 + i % 3 for i, m in enumerate(members)}
    data = {m: MemberData(weight=w).encode() for m, w in weight.items()}
    subs = group.subscriptions(user_data=data)
    meta = cluster(group.partitions)
    report = Report(
        f"6. Every assignor, {_size(cfg.mid)} (fresh)",
        ["assignor", "ours", "aiokafka's", "aiokafka / ours", "max-min (ours / aiokafka)", "note"],
        notes=(
            "Pure `assign` on both sides (no encoding). Members carry `MemberData(weight=1, "
            "2 or 3)` (only the weighted assignor reads it) and equal failover priority. "
            "Many small topics (fewer partitions per topic than members) are where range "
            "piles partitions on the first members."
        ),
    )
    assignors: list[tuple[ConsumerAssignor, str | None]] = [
        (RangeAssignor(), "range"),
        (RoundRobinAssignor(), "roundrobin"),
        (StickyAssignor(), None),
        (CooperativeStickyAssignor(), None),
        (FailoverAssignor(), None),
        (WeightedAssignor(), None),
        (ShuffledAssignor(), None),
    ]
    for assignor, peer_name in assignors:
        ours = timed(
            partial(assignor.assign, group.partitions),
            const(subs),
            cfg.repeats,
            None,
            cfg.min_total,
        )
        assert ours.result is not None, ours.error
        bad = problems(group, ours.result)
        ours_spread = f"invalid ({bad})" if bad else str(spread(group, ours.result))
        peer_time, ratio, peer_spread = "—", "—", "—"
        if peer_name is not None:
            peer = timed(
                aiokafka_assign,
                leader_input(
                    partial(fresh_class, AIOKAFKA[peer_name]),
                    meta,
                    aiokafka_members(AIOKAFKA[peer_name], group.topics),
                ),
                cfg.repeats,
                cfg.versus_budget,
                cfg.min_total,
            )
            peer_time, ratio = fmt_time(peer), fmt_ratio(peer, ours)
            if peer.result is not None:
                peer_spread = balance_cells(group, None, decode(peer.result)).spread
        note = ""
        if assignor.name == "weighted":
            per_unit = [len(ours.result[m]) / weight[m] for m in members]
            note = f"per unit of weight: max-min {max(per_unit) - min(per_unit):.2f}"
        elif assignor.name == "failover":
            note = "by design: every topic to the top-priority member"
        elif assignor.name == "sticky":
            note = "aiokafka's: see cases 1 and 4"
        report.add(
            assignor.name, fmt_time(ours), peer_time, ratio, pair(ours_spread, peer_spread), note
        )
        console.print(f"  {assignor.name}: {fmt_time(ours)}")
    report.show()
    return [report]


# -- entry point ---------------------------------------------------------------------------------

WORKLOADS: dict[str, Callable[[Config, Findings], list[Report]]] = {
    "versus": versus_workload,
    "scale": scale_workload,
    "split": split_workload,
    "memory": memory_workload,
    "mid": mid_workload,
}

HOW_TO_RUN = """\
### How to run

```sh
pip install -e '.[aiokafka,bench]'
python benchmarks/consumer_assignors.py --quick                      # smoke check, seconds
python benchmarks/consumer_assignors.py --markdown docs/consumer.md  # full run, ~10 min
```

`--only versus|scale|split|memory|mid` (repeatable) runs a subset, `--repeats N` sets the runs
per small measurement. aiokafka's assignors are driven as its group leader drives them: members'
JoinGroup metadata built by each member's own assignor (a fresh subclass of aiokafka's sticky per
member and per run, since it keeps state on the class), encoded and decoded, then
`assign(cluster, members)` on a real `ClusterMetadata`. Times are wall-clock medians
(`time.perf_counter`, `gc.collect()` before each run, inputs built off the clock); compare them
only within one run, the machine is shared.
"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments(
        __doc__,
        SECTION,
        quick="small sizes: a smoke check",
        repeats="runs per small measurement (median)",
        broker=False,
    )
    parser.add_argument(
        "--only", choices=sorted(WORKLOADS), action="append", help="run only these benchmarks"
    )
    args = parser.parse_args(argv)

    cfg = chosen(args, QUICK, FULL)
    info = machine_info()
    info["peers"] = f"aiokafka {metadata.version('aiokafka')}"
    for key, value in info.items():
        console.print(f"[bold]{key}[/]: {value}")

    out = Findings(cfg.judged)
    reports = [r for name in (args.only or WORKLOADS) for r in WORKLOADS[name](cfg, out)]
    targets = Report("Targets", ["case", "target", "measured", "verdict"], rows=out.targets)
    targets.show()
    if cfg.judged and out.targets:
        missed = [f"{c}: {goal}" for c, goal, _, verdict in out.targets if "not met" in verdict]
        judged = sum(1 for *_, verdict in out.targets if verdict != "reported")
        out.notes.insert(
            0,
            f"Targets: {judged - len(missed)} of {judged} met"
            + (f"; not met: {'; '.join(missed)}." if missed else "."),
        )

    if args.markdown:
        extra = [
            f"- **timing**: median of {cfg.repeats}+ runs of ours, {cfg.peer_repeats} of "
            "aiokafka's sticky; single runs at the largest sizes",
            "",
            HOW_TO_RUN,
            targets.markdown(),
            "### Reading",
            "",
            *(f"- {n}" for n in out.notes),
        ]
        script = "benchmarks/consumer_assignors.py"
        write_reports(
            args.markdown, args.section, "", reports, info, script, argv, extra, under=HEADING
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
