"""High-availability assignor benchmark: ``HighAvailabilityTaskAssignor`` side by side with
``StickyTaskAssignor`` on the same scenarios, in the same run.

1. **Takeovers** — a settled group of stateful tasks meets one event (scale out, a client lost,
   clients replaced), with 0 and 1 standbys. Both assignors replay it through the same state
   model: an active restores its lag at takeover (its whole changelog where it has no state; a
   running standby trails by ``STANDBY_LAG``), new replicas restore at ``RESTORE_RATE``
   records/s, and the HA assignor's probing rebalances come every ``PROBING_S`` until nothing is
   held back. Reported: records restored by new actives (the downtime cost), the longest single
   restore (how long the slowest task is down), rebalances and time until the assignment is
   balanced, and the records replicas copied in the background.
2. **Speed** — one plan at Kafka Streams' scale sizes after every 10th client is replaced, HA
   against sticky on the same input (HA runs the sticky assignor for its target, plus its own
   pass), and scale outs onto empty clients (the worst case of HA's swap step).

Run ``python benchmarks/ha.py [--quick] [--markdown docs/ha.md]``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from _common import (
    Report,
    arguments,
    fmt_num,
    fmt_ratio,
    fmt_time,
    make_tasks,
    member_ids,
    publish,
    show_machine_info,
    states,
    timed,
)

from streamassign import (
    ClientAssignment,
    ClientState,
    HighAvailabilityTaskAssignor,
    StickyTaskAssignor,
    TaskId,
)
from streamassign.metrics import evaluate, violations

SECTION = "ha-benchmark"
CHANGELOG = 1_000_000  # records per task's changelog
STANDBY_LAG = 1_000  # how far a running standby trails, records
RESTORE_RATE = 10_000.0  # records per second a restoring copy reads
PROBING_S = 600.0  # Kafka Streams' probing.rebalance.interval.ms default
ACCEPTABLE = 10_000  # acceptable.recovery.lag default
WARMUPS = 2  # max.warmup.replicas default

Assignment = Mapping[str, ClientAssignment]
Plan = Callable[[list[TaskId], list[ClientState]], tuple[Assignment, bool]]


@dataclass
class Outcome:
    """One assignor through one scenario, from the event until balanced and held back no more."""

    restored: int = 0  # records new actives restored at takeover
    longest: int = 0  # largest single restore, records
    copied: int = 0  # records new replicas copied (background, no downtime)
    rebalances: int = 0
    balanced_after_s: float = 0.0
    max_warmups: int = 0
    valid: bool = True


class Group:
    """What every client holds and how far behind each of its replicas is, over time."""

    def __init__(self, history: Assignment, capacity: Mapping[str, int]) -> None:
        self.held = dict(history)
        self.capacity = dict(capacity)
        #: (process id, task) -> (time placed, lag then) of replicas still restoring
        self.restoring: dict[tuple[str, TaskId], tuple[float, int]] = {}
        self.now = 0.0

    def lag(self, pid: str, task: TaskId) -> int:
        placed = self.restoring.get((pid, task))
        if placed is None:
            return STANDBY_LAG
        at, lag = placed
        return max(STANDBY_LAG, int(lag - RESTORE_RATE * (self.now - at)))

    def clients(self) -> list[ClientState]:
        out = []
        for pid in sorted(self.capacity):
            got = self.held.get(pid, ClientAssignment())
            replicas = got.standby | got.warmup
            lags = {t: self.lag(pid, t) for t in replicas}
            out.append(ClientState(pid, self.capacity[pid], got.active, replicas, lags))
        return out

    def apply(self, clients: Sequence[ClientState], result: Assignment, out: Outcome) -> None:
        """Price the takeovers and new replicas of ``result`` and make it the history."""
        restoring = {}
        for c in clients:
            a = result[c.process_id]
            for t in a.active - c.prev_active:
                r = c.lags.get(t, CHANGELOG)
                out.restored += r
                out.longest = max(out.longest, r)
            for t in a.standby | a.warmup:
                key = (c.process_id, t)
                if t in c.prev_active:
                    continue
                if key in self.restoring and self.lag(*key) > STANDBY_LAG:
                    restoring[key] = self.restoring[key]
                elif t not in c.prev_standby:
                    restoring[key] = (self.now, CHANGELOG)
                    out.copied += CHANGELOG
        self.restoring = restoring
        self.held = dict(result)


def settle(tasks: list[TaskId], pids: list[str], replicas: int) -> dict[str, ClientAssignment]:
    """A balanced group whose replicas are all caught up."""
    return StickyTaskAssignor(replicas).assign(tasks, states(pids))


def run(
    plan: Plan, tasks: list[TaskId], group: Group, replicas: int, max_rounds: int = 200
) -> Outcome:
    out = Outcome()
    while True:
        clients = group.clients()
        result, pending = plan(tasks, clients)
        out.rebalances += 1
        out.valid = out.valid and not violations(tasks, clients, result, replicas)
        out.max_warmups = max(out.max_warmups, sum(len(a.warmup) for a in result.values()))
        group.apply(clients, result, out)
        if not pending or out.rebalances >= max_rounds:
            balanced = evaluate(tasks, clients, result, replicas).active_balanced
            out.balanced_after_s = group.now if balanced else float("nan")
            return out
        group.now += PROBING_S


def sticky_plan(replicas: int) -> Plan:
    sticky = StickyTaskAssignor(replicas, ACCEPTABLE)
    return lambda tasks, clients: (sticky.assign(tasks, clients), False)


def ha_plan(replicas: int) -> Plan:
    ha = HighAvailabilityTaskAssignor(replicas, ACCEPTABLE, WARMUPS, int(PROBING_S * 1000))

    def plan(tasks: list[TaskId], clients: list[ClientState]) -> tuple[Assignment, bool]:
        p = ha.plan(tasks, clients)
        return p.assignment, p.probing_rebalance_needed

    return plan


@dataclass(frozen=True)
class Scenario:
    name: str
    before: int  # clients before the event
    after: Callable[[list[str]], list[str]]  # the clients after it


SCENARIOS = (
    Scenario("scale out 6 -> 8", 6, lambda pids: [*pids, "n0", "n1"]),
    Scenario("scale out 4 -> 8", 4, lambda pids: [*pids, "n0", "n1", "n2", "n3"]),
    Scenario("1 of 6 lost", 6, lambda pids: pids[1:]),
    Scenario("2 of 6 replaced", 6, lambda pids: [*pids[1:3], *pids[4:], "n0", "n1"]),
)


def takeovers(tasks_count: int) -> list[Report]:
    tasks = make_tasks(tasks_count, 2)
    reports = []
    for replicas in (0, 1):
        report = Report(
            f"{tasks_count} stateful tasks, {replicas} standby",
            [
                "event",
                "assignor",
                "records restored",
                "longest restore",
                "rebalances",
                "balanced after",
                "records copied by replicas",
                "max warmups",
                "valid",
            ],
            notes=(
                f"Changelog {CHANGELOG:,} records a task, restored at {RESTORE_RATE:,.0f} "
                f"records/s; a running standby trails by {STANDBY_LAG:,}; probing every "
                f"{PROBING_S:g} s, {WARMUPS} warmups, acceptable lag {ACCEPTABLE:,}. "
                "*Longest restore* is the longest any one task is down (records / rate)."
            ),
        )
        for scenario in SCENARIOS:
            pids = member_ids(scenario.before, "p")
            history = settle(tasks, pids, replicas)
            after = scenario.after(pids)
            capacity = dict.fromkeys(after, 1)
            kept = {p: a for p, a in history.items() if p in capacity}
            for name, make in (("sticky", sticky_plan), ("ha", ha_plan)):
                out = run(make(replicas), tasks, Group(kept, capacity), replicas)
                report.add(
                    scenario.name,
                    name,
                    fmt_num(out.restored),
                    f"{out.longest / RESTORE_RATE:.1f} s",
                    str(out.rebalances),
                    f"{out.balanced_after_s:g} s",
                    fmt_num(out.copied),
                    str(out.max_warmups),
                    "✓" if out.valid else "✗",
                )
        reports.append(report)
    return reports


def speed(sizes: Sequence[tuple[int, int]], repeats: int) -> Report:
    report = Report(
        "Speed: one plan after every 10th client is replaced, 1 standby",
        ["tasks x clients", "sticky", "ha (plan)", "ha / sticky"],
        notes="Same input for both; HA includes the sticky target it starts from.",
    )
    for n_tasks, n_clients in sizes:
        tasks = make_tasks(n_tasks, 4)
        pids = member_ids(n_clients, "p")
        history = settle(tasks, pids, 1)
        after = [p for i, p in enumerate(pids) if i % 10] + member_ids(n_clients // 10, "n")
        group = Group({p: a for p, a in history.items() if p in after}, dict.fromkeys(after, 1))
        clients = group.clients()
        sticky = StickyTaskAssignor(1, ACCEPTABLE)
        ha = HighAvailabilityTaskAssignor(1, ACCEPTABLE, WARMUPS)
        same = partial(list, clients)
        ours = timed(partial(sticky.assign, tasks), same, repeats, min_total=0.2)
        hat = timed(partial(ha.plan, tasks), same, repeats, min_total=0.2)
        report.add(f"{n_tasks} x {n_clients}", fmt_time(ours), fmt_time(hat), fmt_ratio(hat, ours))
    return report


#: (name, tasks, clients running them all before, new clients), each old client owning an
#: equal share; ``None`` old clients: one client runs everything, with capacity for a quarter.
SCALE_OUTS = (
    ("10k tasks, 2 -> 4 clients", 10_000, 2, 2),
    ("10k tasks, 5 -> 10 clients", 10_000, 5, 5),
    ("4k tasks, 1 big owner + 1000 new", 4_000, None, 1_000),
)


def scale_out(cases: Sequence[tuple[str, int, int | None, int]], repeats: int) -> Report:
    """A scale out where nobody new has any state: the worst case of HA's swap step (every
    stateful target move is onto cold state and looks for a partner to trade)."""
    report = Report(
        "Speed: scale out onto empty clients, all tasks stateful, no standbys",
        ["event", "sticky", "ha (plan)", "ha / sticky", "held back"],
        notes="Same input for both; HA includes the sticky target it starts from.",
    )
    for name, n_tasks, n_old, n_new in cases:
        tasks = make_tasks(n_tasks, 4)
        if n_old is None:
            old = [ClientState("big", capacity=max(1, n_tasks // 4), prev_active=tasks)]
        else:
            share = -(-n_tasks // n_old)
            old = [
                ClientState(pid, prev_active=tasks[i * share : (i + 1) * share])
                for i, pid in enumerate(member_ids(n_old, "p"))
            ]
        clients = old + states(member_ids(n_new, "n"))
        same = partial(list, clients)
        sticky = StickyTaskAssignor(0, ACCEPTABLE)
        ha = HighAvailabilityTaskAssignor(0, ACCEPTABLE, WARMUPS)
        ours = timed(partial(sticky.assign, tasks), same, repeats, min_total=0.2)
        hat = timed(partial(ha.plan, tasks), same, repeats, min_total=0.2)
        held = len(ha.plan(tasks, clients).held_back)
        report.add(name, fmt_time(ours), fmt_time(hat), fmt_ratio(hat, ours), fmt_num(held))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__, SECTION, quick="small sizes, few repeats", broker=False)
    args = parser.parse_args(argv)
    info = show_machine_info()
    sizes = [(120, 12), (1000, 100)] if args.quick else [(120, 12), (1000, 100), (6000, 600)]
    reports = takeovers(24 if args.quick else 48)
    reports.append(speed(sizes, 3 if args.quick else 5))
    reports.append(scale_out(SCALE_OUTS[-1:] if args.quick else SCALE_OUTS, 3))
    publish(reports, args, info, "benchmarks/ha.py", argv, "## Measured: HA vs sticky")
    return 0


if __name__ == "__main__":
    sys.exit(main())
