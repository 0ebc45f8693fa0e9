"""Task assignor benchmarks: streamassign's ``StickyTaskAssignor`` side by side with Faust's
``CopartitionedAssignor``, on the same inputs, in the same run.

1. **Faust's workload** — one co-partitioned group, equal workers, 1 and 2 standbys: a fresh
   assignment, then churn (a worker leaves, one or two join, all rejoin, all restart without and
   with state on disk) from one shared history. Time ratio, and ``streamassign.metrics.evaluate``
   of both results.
2. **Kafka Streams' scale** — its scale-test sizes plus two larger ones: fresh, rerun with the
   first result as history, and 10% of clients replaced. Ours and its thread distribution are
   timed apart; Faust runs on the same input (one group, threads ignored) under a time budget.
   **Kafka Streams' own assignor** (``--only kafka-streams``) — the same scale sizes and rounds
   through Kafka Streams' ``StickyTaskAssignor`` (KIP-924 public API, in a JVM: see
   ``_kafka_streams_peer``), on the same inputs, under a time budget.
   **Mid-roll** (``--only rolled``) — the scale sizes with every other client on another
   topology version (it may not run subtopology 1): the assignor, then the post-pass that moves
   those tasks to eligible clients and rebalances (``move_to_eligible_clients``), timed apart.
3. **Memory** — peak allocation of one assignment as tasks, then clients, grow: it must grow
   with tasks + clients, never with their product.

Run ``python benchmarks/task_assignor.py [--quick] [--markdown docs/benchmarks.md]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import attrs
from _common import (
    Quality,
    Report,
    Timed,
    chosen,
    console,
    fmt_bool,
    fmt_bytes,
    fmt_num,
    fmt_ratio,
    fmt_seconds,
    fmt_time,
    footprint,
    make_tasks,
    member_ids,
    peak_memory,
    quality,
    restarted_states,
    show_machine_info,
    states,
    timed,
    write_reports,
)
from _kafka_streams_peer import JavaRun, kafka_streams_assign, prepare

from streamassign import ClientAssignment, ClientState, StickyTaskAssignor, TaskId
from streamassign.eligibility import move_to_eligible_clients
from streamassign.pipeline.peers import FaustDriver
from streamassign.threads import distribute_to_threads

try:
    _FAUST = FaustDriver()
except ImportError as exc:  # pragma: no cover - a setup problem, said plainly
    raise SystemExit(f"{exc}: install the peers first: pip install -e '.[bench]'") from exc
#: Faust driven as Faust drives it: all tasks one co-partitioned group (the package's driver).
faust_input, faust_assign, to_ours = _FAUST.input_of, _FAUST.assign, FaustDriver.to_ours

Assignment = dict[str, ClientAssignment]
ThreadAssignment = dict[str, dict[str, ClientAssignment]]

SECTION = "task-assignor"
#: Subtopologies the Kafka Streams-scale and memory workloads split their tasks over.
SUBTOPOLOGIES = 4


@dataclass(frozen=True)
class Config:
    """Sizes and repeats of one run; ``--quick`` swaps in small ones."""

    repeats: int
    min_total: float  # keep repeating a measurement until this many seconds are spent
    faust_budget: float
    kafka_streams_budget: float
    java_heap: str  # the Kafka Streams JVM's -Xmx
    faust_sizes: Sequence[tuple[int, int]]  # (partitions, workers)
    faust_standbys: Sequence[int]
    footprint_partitions: int  # trace what runs (lines, built-ins) up to this many partitions
    scale_sizes: Sequence[tuple[int, int, int, int]]  # (tasks, clients, threads, standbys)
    #: (tasks, clients, threads, standbys, joining): a fully replicated group scaling out, where
    #: most standbys need a swap to be placed (every old client holds every task).
    scale_out_sizes: Sequence[tuple[int, int, int, int, int]]
    #: (tasks, clients, threads, standbys) with clients spread over three racks and more copies
    #: than racks: conflicts cannot all be avoided, rack-aware placement must not search in vain.
    rack_sizes: Sequence[tuple[int, int, int, int]]
    #: (tasks, clients, threads, standbys) rolled halfway: every other client may not run
    #: subtopology 1 (another topology version), so the post-pass moves its tasks.
    rolled_sizes: Sequence[tuple[int, int, int, int]]
    memory_tasks: tuple[Sequence[int], int]  # (task counts, fixed clients)
    memory_clients: tuple[int, Sequence[int]]  # (fixed tasks, client counts)


FULL = Config(
    repeats=5,
    min_total=0.2,
    faust_budget=60.0,
    kafka_streams_budget=60.0,
    java_heap="8g",
    faust_sizes=[(12, 3), (64, 8), (256, 16), (1024, 64), (4096, 256)],
    faust_standbys=[1, 2],
    footprint_partitions=64,
    scale_sizes=[
        (6000, 2, 1, 1),
        (1000, 1000, 1, 1),
        (1000, 100, 1, 50),
        (1000, 10, 1000, 1),
        (10000, 1000, 4, 2),
        (100000, 1000, 8, 1),
    ],
    scale_out_sizes=[(8000, 5, 1, 4, 3)],
    rack_sizes=[(5000, 60, 1, 3)],
    rolled_sizes=[
        (2400, 6, 1, 1),
        (6000, 10, 1, 1),
        (2000, 200, 1, 1),
        (1000, 100, 1, 50),
        (10000, 1000, 4, 2),
        (100000, 1000, 8, 1),
    ],
    memory_tasks=([10_000, 20_000, 40_000, 80_000], 100),
    memory_clients=(20_000, [250, 500, 1000, 2000]),
)

QUICK = Config(
    repeats=3,
    min_total=0.0,
    faust_budget=2.0,
    kafka_streams_budget=2.0,
    java_heap="2g",
    faust_sizes=[(12, 3), (64, 8)],
    faust_standbys=[1, 2],
    footprint_partitions=12,
    scale_sizes=[(600, 2, 1, 1), (100, 100, 1, 1), (100, 10, 1, 5), (100, 4, 100, 1)],
    scale_out_sizes=[(800, 5, 1, 4, 3)],
    rack_sizes=[(500, 12, 1, 3)],
    rolled_sizes=[(600, 6, 1, 1), (200, 20, 1, 1)],
    memory_tasks=([1000, 2000, 4000], 20),
    memory_clients=(2000, [25, 50, 100]),
)


# -- running both assignors ----------------------------------------------------------------------


def run_ours(
    cfg: Config,
    tasks: Sequence[TaskId],
    clients: Sequence[ClientState],
    replicas: int,
    cold: bool = True,
) -> Timed[Assignment]:
    """Time ``StickyTaskAssignor.assign`` (clients are immutable: one input serves every run)."""
    assignor = StickyTaskAssignor(replicas)
    return timed(
        partial(assignor.assign, tasks), lambda: clients, cfg.repeats, None, cfg.min_total, cold
    )


def run_faust(
    cfg: Config,
    tasks: Sequence[TaskId],
    clients: Sequence[ClientState],
    replicas: int,
    cold: bool = True,
) -> Timed[Assignment]:
    """Time Faust's assignor on the same input, under the budget; its result converted to ours."""
    got = timed(
        lambda inputs: faust_assign(inputs, len(tasks), replicas),
        lambda: faust_input(tasks, clients),
        cfg.repeats,
        cfg.faust_budget,
        cfg.min_total,
        cold,
    )
    if got.error:
        console.print(f"[yellow]Faust failed: {got.error}")
    converted = None if got.result is None else to_ours(tasks, got.result)
    return Timed(got.seconds, got.runs, converted, got.error, got.budget)


def assess(
    tasks: Sequence[TaskId],
    truth: Sequence[ClientState],
    run: Timed[Assignment],
    replicas: int,
) -> Quality | None:
    """Quality of a run's result against the true history, or None when it has no result."""
    return None if run.result is None else quality(tasks, truth, run.result, replicas)


def both(ours: Quality | None, peer: Quality | None, cell: Callable[[Quality], str]) -> str:
    """``"ours / Faust"`` for one metric; ``—`` for a side without a result."""
    return " / ".join("—" if q is None else cell(q) for q in (ours, peer))


def balanced_cell(q: Quality) -> str:
    """✓ / ✗ for active balance, or how many validity problems the assignment has."""
    return f"invalid ({len(q.problems)})" if q.problems else fmt_bool(q.metrics.active_balanced)


# -- 1. Faust's workload -----------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One rebalance of the churn chain: how membership changes, and whether all restarted."""

    name: str
    leave: int = 0
    join: int = 0
    restart: bool = False
    #: A restart where ours is also told the state stores left on disk. Faust cannot be told
    #: that, so the two inputs differ: it reruns the previous (restart) step's input, and
    #: the time ratio is not reported.
    disk: bool = False


def members_after(step: Step, members: list[str], newcomers: Iterator[str]) -> list[str]:
    """The group after ``step``: the middle member leaves, newcomers join at the end."""
    for _ in range(step.leave):
        members = members[: len(members) // 2] + members[len(members) // 2 + 1 :]
    return members + [next(newcomers) for _ in range(step.join)]


#: Each step starts from the previous step's result (see ``faust_workload``).
CHAIN = [
    Step("fresh"),
    Step("1 leaves", leave=1),
    Step("1 joins", join=1),
    Step("2 join", join=2),
    Step("all rejoin"),
    Step("all restart", restart=True),
    Step("all restart, stores on disk", restart=True, disk=True),
]


def faust_workload(cfg: Config) -> list[Report]:
    """Faust's own workload: one co-partitioned group of P partitions over M equal workers.

    The steps of ``CHAIN`` run in order; each starts from one shared history, the previous
    step's Faust result (its own steady state; ours when Faust failed), so both assignors see
    the same input. On "all restart" every worker reports an empty assignment to both; on
    "all restart, stores on disk" (the same restart) ours is also told the state stores still
    on disk, which Faust's metadata cannot carry, so no time ratio is given for it. Every step
    is scored against what ran before. Each run is timed cold and warm; up to
    ``footprint_partitions`` partitions, what each run executes is traced too.
    """
    reports = []
    traced = Report(
        "Code one assignment executes (Faust's workload)",
        [
            "P x M",
            "standbys",
            "step",
            "distinct lines: ours / Faust",
            "distinct built-ins: ours / Faust",
            "bytecodes: ours / Faust",
        ],
        notes=(
            "Traced with `sys.settrace`/`sys.setprofile` (one run each, same input as the "
            "timed rows). A cold run pays a cache miss for each distinct line of code and "
            "built-in function it touches; a warm run pays per bytecode."
        ),
    )
    for replicas in cfg.faust_standbys:
        report = Report(
            f"Faust's workload, {replicas} standby{'s' * (replicas > 1)} per partition",
            [
                "P x M",
                "step",
                "ours",
                "Faust",
                "Faust / ours",
                "warm: ours / Faust (Faust / ours)",
                "balanced",
                "load spread",
                "moves (bound)",
                "standby coverage",
                "warm : cold takeovers",
            ],
            notes=(
                "Quality cells read *ours / Faust*. *ours*, *Faust*: cold runs (caches "
                "flushed, as at a rebalance); *warm*: back-to-back runs."
            ),
        )
        for partitions, workers in cfg.faust_sizes:
            tasks = make_tasks(partitions)
            members = member_ids(workers, "w")
            newcomers = iter(member_ids(sum(s.join for s in CHAIN), "new"))
            history: Assignment = {}
            before: Assignment = {}
            for step in CHAIN:
                members = members_after(step, members, newcomers)
                if step.disk:
                    history = before  # the same restart, ours now told what is on disk
                before = history
                truth = states(members, 1, history)
                told_faust = states(members) if step.restart else truth
                told_ours = restarted_states(members, history) if step.disk else told_faust
                ours = run_ours(cfg, tasks, told_ours, replicas)
                peer = run_faust(cfg, tasks, told_faust, replicas)
                warm_ours = run_ours(cfg, tasks, told_ours, replicas, cold=False)
                warm_peer = run_faust(cfg, tasks, told_faust, replicas, cold=False)
                q_ours = assess(tasks, truth, ours, replicas)
                q_peer = assess(tasks, truth, peer, replicas)
                assert ours.result is not None and q_ours is not None, ours.error
                history = peer.result or ours.result
                report.add(
                    f"{partitions} x {workers}",
                    step.name,
                    fmt_time(ours),
                    fmt_time(peer),
                    "not the same input" if step.disk else fmt_ratio(peer, ours),
                    f"{fmt_time(warm_ours)} / {fmt_time(warm_peer)} "
                    f"({'—' if step.disk else fmt_ratio(warm_peer, warm_ours)})",
                    both(q_ours, q_peer, balanced_cell),
                    both(q_ours, q_peer, lambda q: fmt_num(q.metrics.load_imbalance)),
                    both(q_ours, q_peer, lambda q: str(q.metrics.moves))
                    + f" (≥ {q_ours.metrics.move_lower_bound})",
                    both(q_ours, q_peer, lambda q: f"{q.metrics.standby_coverage:.0%}"),
                    both(
                        q_ours,
                        q_peer,
                        lambda q: f"{q.metrics.warm_takeovers}:{q.metrics.cold_takeovers}",
                    ),
                )
                if partitions <= cfg.footprint_partitions and not step.disk:
                    mine = footprint(partial(StickyTaskAssignor(replicas).assign, tasks), told_ours)
                    theirs = footprint(
                        partial(faust_assign, num_partitions=len(tasks), replicas=replicas),
                        faust_input(tasks, told_faust),
                    )
                    traced.add(
                        f"{partitions} x {workers}",
                        str(replicas),
                        step.name,
                        f"{mine.lines} / {theirs.lines}",
                        f"{mine.builtins} / {theirs.builtins}",
                        f"{mine.bytecodes:,} / {theirs.bytecodes:,}",
                    )
        report.show()
        reports.append(report)
    traced.show()
    return [*reports, traced]


# -- 2. Kafka Streams' scale --------------------------------------------------------------------


#: What one client's thread split starts from: its tasks, its thread ids, what each thread had.
ThreadInput = tuple[ClientAssignment, list[str], dict[str, frozenset[TaskId]]]


def thread_inputs(
    assignment: Mapping[str, ClientAssignment], threads: int, previous: ThreadAssignment
) -> dict[str, ThreadInput]:
    """Per client, the arguments of ``distribute_to_threads`` (built off the clock)."""
    out = {}
    for pid, got in assignment.items():
        names = [f"{pid}-t{j:04d}" for j in range(threads)]
        before = previous.get(pid, {})
        out[pid] = (got, names, {th: a.active | a.standby | a.warmup for th, a in before.items()})
    return out


def split_threads(inputs: Mapping[str, ThreadInput]) -> ThreadAssignment:
    """``distribute_to_threads`` for every client, each thread keeping what it had if it can."""
    return {pid: distribute_to_threads(*args) for pid, args in inputs.items()}


def thread_spread(split: ThreadAssignment) -> int:
    """Largest spread of load (max minus min) between the threads of one client."""
    return max(
        (max(a.load for a in per.values()) - min(a.load for a in per.values()))
        for per in split.values()
    )


def _in_racks(clients: list[ClientState]) -> list[ClientState]:
    """``clients`` spread over three racks, in turn by member id (stable across rounds)."""
    return [attrs.evolve(c, rack=f"rack{int(c.process_id[-4:]) % 3}") for c in clients]


def _as_is(clients: list[ClientState]) -> list[ClientState]:
    return clients


def scale_rounds(
    members: list[str],
    threads: int,
    first: Assignment,
    place: Callable[[list[ClientState]], list[ClientState]] = _as_is,
) -> list[tuple[str, list[ClientState], Assignment]]:
    """The rounds of one scale size, each as (name, clients, history they report): fresh, rerun
    with ``first`` (the fresh result) as history, and 10% of the clients (at least one) replaced
    by newcomers."""
    replaced = members[::10][: max(1, len(members) // 10)]
    kept = [m for m in members if m not in set(replaced)]
    newcomers = member_ids(len(replaced), "new")
    return [
        ("fresh", place(states(members, threads)), {}),
        ("rerun", place(states(members, threads, first)), first),
        ("10% replaced", place(states(kept + newcomers, threads, first)), first),
    ]


def scale_workload(cfg: Config) -> list[Report]:
    """Kafka Streams' scale sizes: fresh, rerun on the first result, 10% of clients replaced;
    then the scale-out sizes: fresh, and clients joining."""
    report = Report(
        "Kafka Streams scale",
        [
            "tasks / clients / threads / standbys",
            "round",
            "ours",
            "thread split",
            "thread spread",
            "moves (bound)",
            "balanced",
            "load spread",
            "Faust",
            "Faust / ours",
            "Faust: balanced, moves",
        ],
        notes=(
            f"Tasks over {SUBTOPOLOGIES} subtopologies, all stateful. *ours* is one "
            "`StickyTaskAssignor.assign`; *thread split* is `distribute_to_threads` for every "
            "client (the rerun and churn rounds keep each thread's previous tasks). Faust sees "
            f"one group of as many partitions and ignores threads; runs are cut at "
            f"{cfg.faust_budget:g} s. Rows with a *joined* round: a group where every client "
            "holds every task (standbys = clients - 1) scales out, so most new standbys can "
            "only be placed by swapping another copy out of the way. Rows marked *3 racks*: "
            "clients spread over three racks, more copies per task than racks; Faust ignores "
            "racks, so no ratio."
        ),
    )
    slowest_ours = [0.0]
    sizes = [(*size, 0, False) for size in cfg.scale_sizes]
    sizes += [(*size, False) for size in cfg.scale_out_sizes]
    sizes += [(*size, 0, True) for size in cfg.rack_sizes]
    for n_tasks, n_clients, threads, replicas, joining, racks in sizes:
        tasks = make_tasks(n_tasks, SUBTOPOLOGIES)
        members = member_ids(n_clients, "c")
        place = _in_racks if racks else _as_is
        fresh = place(states(members, threads))
        first = run_ours(cfg, tasks, fresh, replicas)
        assert first.result is not None, first.error
        first_split = split_threads(thread_inputs(first.result, threads, {}))
        rounds = [
            (name, clients, first_split if history else {})
            for name, clients, history in scale_rounds(members, threads, first.result, place)
        ]
        if joining:
            rounds[1:] = [
                (
                    f"{joining} joined",
                    states(members + member_ids(joining, "new"), threads, first.result),
                    first_split,
                )
            ]
        for name, clients, previous_split in rounds:
            ours = first if name == "fresh" else run_ours(cfg, tasks, clients, replicas)
            assert ours.result is not None, ours.error
            result = ours.result
            slowest_ours.append(ours.seconds or 0.0)
            split = timed(
                split_threads,
                partial(thread_inputs, result, threads, previous_split),
                cfg.repeats,
                None,
                cfg.min_total,
            )
            peer = run_faust(cfg, tasks, clients, replicas)
            q_ours = quality(tasks, clients, result, replicas)
            q_peer = assess(tasks, clients, peer, replicas)
            m = q_ours.metrics
            assert split.result is not None, split.error
            report.add(
                f"{n_tasks} / {n_clients} / {threads} / {replicas}"
                + (", 3 racks" if racks else ""),
                name,
                fmt_time(ours),
                fmt_time(split),
                str(thread_spread(split.result)),
                f"{m.moves} (≥ {m.move_lower_bound})",
                balanced_cell(q_ours),
                fmt_num(m.load_imbalance),
                fmt_time(peer),
                "not the same input" if racks else fmt_ratio(peer, ours),
                "—" if q_peer is None else f"{balanced_cell(q_peer)}, {q_peer.metrics.moves}",
            )
            console.print(
                f"  {n_tasks}/{n_clients}/{threads}/{replicas} {name}: ours "
                f"{fmt_time(ours)}, Faust {fmt_time(peer)}"
            )
    slowest = max(slowest_ours)
    report.notes += (
        f" Slowest assignment of ours: {fmt_seconds(slowest)} "
        f"(target under 1 s: {'met' if slowest < 1 else 'MISSED'})."
    )
    report.show()
    return [report]


# -- 2b. Kafka Streams' own StickyTaskAssignor ------------------------------------------------


def _both_cells(ours: Quality, theirs: Quality | None, cell: Callable[[Quality], str]) -> str:
    """``"ours / Kafka Streams"`` for one metric; ``—`` on the Kafka Streams side without result."""
    return f"{cell(ours)} / {'—' if theirs is None else cell(theirs)}"


def _kafka_streams_times(theirs: JavaRun, ours: Timed[Assignment]) -> list[str]:
    """Kafka Streams' median, its ratio to ours, and its first run in a fresh JVM."""
    first_run = "—" if theirs.first_run is None else fmt_seconds(theirs.first_run)
    return [fmt_time(theirs.timed), fmt_ratio(theirs.timed, ours), first_run]


def _kafka_streams_check(theirs: JavaRun | None) -> str:
    """Kafka Streams' own verdict on its result, when it is not "valid" (``NONE``)."""
    if theirs is None or theirs.validation in (None, "NONE"):
        return ""
    return f" (Kafka Streams' own check: {theirs.validation})"


def kafka_streams_workload(cfg: Config) -> list[Report]:
    """The Kafka Streams scale sizes through ours and Kafka Streams' own ``StickyTaskAssignor``
    (KIP-924 public API, run in a JVM by ``_kafka_streams_peer``) on the same inputs: fresh,
    rerun on our fresh result, 10% of clients replaced. Both results are checked for validity
    and scored by ``streamassign.metrics.evaluate``."""
    peer = prepare(cfg.java_heap, lambda line: console.print(f"  {line}"))
    if isinstance(peer, str):
        console.print(f"[yellow]Kafka Streams peer unavailable: {peer}")
    report = Report(
        "Kafka Streams scale sizes: ours and Kafka Streams' StickyTaskAssignor",
        [
            "tasks / clients / threads / standbys",
            "round",
            "ours",
            "Kafka Streams",
            "Kafka Streams / ours",
            "Kafka Streams, first run",
            "balanced",
            "balanced per subtopology",
            "moves (bound)",
            "load spread",
            "standby coverage",
        ],
        notes=(
            f"Tasks over {SUBTOPOLOGIES} subtopologies, all stateful; cells with two values read "
            "*ours / Kafka Streams*. *ours*: median `StickyTaskAssignor.assign`, as in the scale "
            "table. *Kafka Streams*: `org.apache.kafka.streams.processor.assignment.assignors."
            "StickyTaskAssignor.assign` (KIP-924), timed inside one JVM per row: the median of "
            "the runs after the first, `System.gc()` before each, JVM start-up not timed; *first "
            "run* is that JVM's first call (class loading, interpreted code, JIT), what a "
            "freshly started group leader pays. Runs are cut at "
            f"{cfg.kafka_streams_budget:g} s (`> budget`; the ratio is then a lower bound). "
            "The rerun and 10%-replaced rounds report our fresh result as history to both. "
            "Neither side's time includes splitting a client's tasks over its threads (Kafka "
            "Streams does that after the task assignor)."
            + (
                f" Kafka Streams peer unavailable: {peer}."
                if isinstance(peer, str)
                else f" Kafka Streams peer: {peer.description}, `-Xmx{peer.heap}`."
            )
        ),
    )
    slowest_ours = [0.0]
    for n_tasks, n_clients, threads, replicas in cfg.scale_sizes:
        tasks = make_tasks(n_tasks, SUBTOPOLOGIES)
        members = member_ids(n_clients, "c")
        first = run_ours(cfg, tasks, states(members, threads), replicas)
        assert first.result is not None, first.error
        for name, clients, _ in scale_rounds(members, threads, first.result):
            ours = first if name == "fresh" else run_ours(cfg, tasks, clients, replicas)
            assert ours.result is not None, ours.error
            slowest_ours.append(ours.seconds or 0.0)
            q_ours = quality(tasks, clients, ours.result, replicas)
            theirs: JavaRun | None = None
            if not isinstance(peer, str):
                theirs = kafka_streams_assign(
                    peer,
                    tasks,
                    clients,
                    replicas,
                    cfg.repeats,
                    cfg.kafka_streams_budget,
                    cfg.min_total,
                )
            q_theirs = None if theirs is None else assess(tasks, clients, theirs.timed, replicas)
            timing_cells = (
                ["unavailable"] * 3 if theirs is None else _kafka_streams_times(theirs, ours)
            )
            report.add(
                f"{n_tasks} / {n_clients} / {threads} / {replicas}",
                name,
                fmt_time(ours),
                *timing_cells,
                _both_cells(q_ours, q_theirs, balanced_cell) + _kafka_streams_check(theirs),
                _both_cells(q_ours, q_theirs, lambda q: fmt_bool(q.metrics.subtopology_balanced)),
                _both_cells(q_ours, q_theirs, lambda q: str(q.metrics.moves))
                + f" (≥ {q_ours.metrics.move_lower_bound})",
                _both_cells(q_ours, q_theirs, lambda q: fmt_num(q.metrics.load_imbalance)),
                _both_cells(q_ours, q_theirs, lambda q: f"{q.metrics.standby_coverage:.0%}"),
            )
            console.print(
                f"  {n_tasks}/{n_clients}/{threads}/{replicas} {name}: ours {fmt_time(ours)}, "
                f"Kafka Streams {timing_cells[0]}"
            )
    slowest = max(slowest_ours)
    report.notes += (
        f" Slowest assignment of ours: {fmt_seconds(slowest)} "
        f"(target under 1 s: {'met' if slowest < 1 else 'MISSED'})."
    )
    report.show()
    return [report]


# -- 2c. mid-roll: the eligibility post-pass ---------------------------------------------------


def rolled_workload(cfg: Config) -> list[Report]:
    """The rolled sizes: a rerun (clients report the fresh result) with every other client
    ineligible for subtopology 1; the assignor and the post-pass timed apart."""
    report = Report(
        "Mid-roll: the eligibility post-pass",
        [
            "tasks / clients / threads / standbys",
            "assignor",
            "post-pass",
            "actives moved",
            "busiest (share)",
        ],
        notes=(
            f"Tasks over {SUBTOPOLOGIES} subtopologies, all stateful; clients report the "
            "fresh result (a rerun), and every other one announces another fingerprint for "
            "subtopology 1, as mid-way through a rolling deploy that changed it. *assignor*: "
            "`StickyTaskAssignor.assign`; *post-pass*: `move_to_eligible_clients` on its "
            "result (moves those tasks to eligible clients, gives back, tops standbys up). "
            "*busiest*: the most actives per consumer after it, against the fair share."
        ),
    )
    slowest = 0.0
    for n_tasks, n_clients, threads, replicas in cfg.rolled_sizes:
        tasks = make_tasks(n_tasks, SUBTOPOLOGIES)
        members = member_ids(n_clients, "c")
        first = StickyTaskAssignor(replicas).assign(tasks, states(members, threads), tasks)
        clients = states(members, threads, first)
        ours = run_ours(cfg, tasks, clients, replicas)
        assert ours.result is not None, ours.error
        assigned = ours.result
        ineligible = {m: frozenset({1}) for m in members[::2]}
        post = timed(
            partial(
                move_to_eligible_clients,
                ineligible=ineligible,
                clients=clients,
                num_standbys=replicas,
                stateful=tasks,
            ),
            partial(dict, assigned),
            cfg.repeats,
            None,
            cfg.min_total,
        )
        assert post.result is not None, post.error
        moved = sum(len(assigned[m].active - post.result[m].active) for m in members)
        busiest = max(len(a.active) for a in post.result.values()) / threads
        slowest = max(slowest, post.seconds or 0.0)
        report.add(
            f"{n_tasks} / {n_clients} / {threads} / {replicas}",
            fmt_time(ours),
            fmt_time(post),
            str(moved),
            f"{busiest:g} ({n_tasks / (n_clients * threads):.3g})",
        )
        console.print(f"  rolled {n_tasks}/{n_clients}: post-pass {fmt_time(post)}")
    report.notes += (
        f" Slowest post-pass: {fmt_seconds(slowest)} (target under 0.1 s: "
        f"{'met' if slowest < 0.1 else 'MISSED'})."
    )
    report.show()
    return [report]


# -- 3. Memory ---------------------------------------------------------------------------------


def memory_workload(cfg: Config, replicas: int = 1) -> list[Report]:
    """Peak memory of one assignment as tasks grow (clients fixed), then clients (tasks fixed)."""
    report = Report(
        "Peak memory of one assignment",
        [
            "grows",
            "tasks",
            "clients",
            "fresh: peak",
            "fresh: B / (task + client)",
            "rerun: peak",
            "rerun: B / (task + client)",
        ],
        notes=(
            f"`tracemalloc` peak above the inputs, {replicas} standby, {SUBTOPOLOGIES} "
            "subtopologies, one thread per client. *rerun* has the fresh result as history. "
            "Linear memory shows as a flat bytes-per-(task + client) column."
        ),
    )
    task_counts, fixed_clients = cfg.memory_tasks
    fixed_tasks, client_counts = cfg.memory_clients
    cases = [("tasks", n, fixed_clients) for n in task_counts]
    cases += [("clients", fixed_tasks, n) for n in client_counts]
    assignor = StickyTaskAssignor(replicas)
    for grows, n_tasks, n_clients in cases:
        tasks = make_tasks(n_tasks, SUBTOPOLOGIES)
        members = member_ids(n_clients, "c")
        fresh = states(members)
        rerun = states(members, 1, assignor.assign(tasks, fresh))
        row = [grows, f"{n_tasks:,}", f"{n_clients:,}"]
        for clients in (fresh, rerun):
            peak = peak_memory(partial(assignor.assign, tasks), clients)
            row += [fmt_bytes(peak), f"{peak / (n_tasks + n_clients):,.0f}"]
        report.add(*row)
    report.show()
    return [report]


# -- entry point -------------------------------------------------------------------------------

WORKLOADS: dict[str, Callable[[Config], list[Report]]] = {
    "faust": faust_workload,
    "scale": scale_workload,
    "kafka-streams": kafka_streams_workload,
    "rolled": rolled_workload,
    "memory": memory_workload,
}

#: The markdown section (marker name, heading) each workload's tables go to.
KAFKA_STREAMS_SECTION = (
    "task-assignor-kafka-streams",
    "## Kafka Streams' StickyTaskAssignor, same inputs",
)
SECTIONS = {"kafka-streams": KAFKA_STREAMS_SECTION}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke check")
    parser.add_argument("--markdown", type=Path, help="write the results section into this file")
    parser.add_argument(
        "--only", choices=sorted(WORKLOADS), action="append", help="run only these benchmarks"
    )
    parser.add_argument("--repeats", type=int, help="runs per measurement (median reported)")
    parser.add_argument("--faust-budget", type=float, help="seconds before a Faust run is cut")
    parser.add_argument(
        "--kafka-streams-budget", type=float, help="seconds before a Kafka Streams run is cut"
    )
    parser.add_argument("--java-heap", help="-Xmx of the Kafka Streams JVM, e.g. 8g")
    args = parser.parse_args(argv)

    cfg = chosen(args, QUICK, FULL)
    if args.faust_budget:
        cfg = dataclasses.replace(cfg, faust_budget=args.faust_budget)
    if args.kafka_streams_budget:
        cfg = dataclasses.replace(cfg, kafka_streams_budget=args.kafka_streams_budget)
    if args.java_heap:
        cfg = dataclasses.replace(cfg, java_heap=args.java_heap)
    info = show_machine_info()

    by_section: dict[tuple[str, str], list[Report]] = {}
    for name in args.only or WORKLOADS:
        section = SECTIONS.get(name, (SECTION, "## Results: task assignor"))
        by_section.setdefault(section, []).extend(WORKLOADS[name](cfg))

    if args.markdown:
        timing = (
            f"- **timing**: median (`time.perf_counter`) of at least {cfg.repeats} runs"
            + (f", more until {cfg.min_total:g} s is spent (at most 100)" if cfg.min_total else "")
            + "; inputs built off the clock; "
        )
        for (section, heading), reports in by_section.items():
            if section == KAFKA_STREAMS_SECTION[0]:
                cut = f"Kafka Streams runs cut at {cfg.kafka_streams_budget:g} s"
            else:
                cut = f"Faust runs cut at {cfg.faust_budget:g} s"
            write_reports(
                args.markdown,
                section,
                heading,
                reports,
                info,
                "benchmarks/task_assignor.py",
                argv,
                [timing + cut],
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
