"""What one cold assignment costs, counted instead of timed: ours and Faust's under Cachegrind.

A cold run of a few hundred microseconds is paid mostly in last-level cache misses (code and
data fetched from memory), and its wall-clock time swings by 20% or more with whatever else the
caches still hold. Valgrind's cache simulator counts instead, within about 1% between runs:
for one run of each assignor, after ``gc.collect()`` over a ~60 MB heap (as in
``task_assignor.py``), the instructions executed and the misses of a simulated 32 MiB, 16-way
last-level cache (this machine's L3): instruction fetches, data reads and data writes. Inputs
are the rows of ``task_assignor.py``'s Faust workload (the same churn chain, Faust's results as
the history).

Run ``python benchmarks/cachegrind.py [--sizes 12x3 64x8] [--standbys 1 2] [--steps ...]
[--markdown docs/benchmarks.md]``; it needs ``valgrind`` (``apt install valgrind``) and takes
about a minute per run, two runs at a time.
"""

from __future__ import annotations

import argparse
import functools
import gc
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from _common import (
    Report,
    make_tasks,
    member_ids,
    show_machine_info,
    states,
    write_reports,
)
from task_assignor import CHAIN, Assignment, faust_assign, faust_input, members_after, to_ours

from streamassign import StickyTaskAssignor

SECTION = "cachegrind"
#: Cache geometry simulated: this machine's L1 caches and its L3 as the last level.
CACHES = ["--I1=32768,8,64", "--D1=32768,8,64", "--LL=33554432,16,64"]
#: Events counted (Cachegrind's names): instructions, then last-level misses.
EVENTS = ("Ir", "ILmr", "DLmr", "DLmw")


@dataclass(frozen=True)
class Counts:
    """One run's instructions and last-level cache misses."""

    instructions: int
    code_misses: int
    read_misses: int
    write_misses: int

    @property
    def misses(self) -> int:
        return self.code_misses + self.read_misses + self.write_misses

    def breakdown(self) -> str:
        """``total (code + read + write)``, as the table shows misses."""
        parts = (self.code_misses, self.read_misses, self.write_misses)
        return f"{self.misses:,} ({' + '.join(f'{x:,}' for x in parts)})"


def child(side: str, partitions: int, workers: int, replicas: int, step_name: str) -> None:
    """Inside Valgrind: replay the chain up to ``step_name``, then run ``side`` once, cold.

    Only the call made through ``functools.reduce`` is counted (``--toggle-collect``), so
    imports, input building and warm-up are not.
    """
    tasks = make_tasks(partitions)
    members = member_ids(workers, "w")
    newcomers = iter(member_ids(sum(s.join for s in CHAIN), "new"))
    history: Assignment = {}
    for step in CHAIN:
        members = members_after(step, members, newcomers)
        told = states(members) if step.restart else states(members, 1, history)
        if step.name == step_name:
            break
        history = to_ours(tasks, faust_assign(faust_input(tasks, told), len(tasks), replicas))
    else:
        raise SystemExit(f"no step {step_name!r} in the chain")
    assignor = StickyTaskAssignor(replicas)
    for _ in range(20):  # warm up: specialised bytecode, caches of the runtime
        assignor.assign(tasks, told)
        faust_assign(faust_input(tasks, told), len(tasks), replicas)
    heap = [[i, str(i)] for i in range(400_000)]  # what gc.collect() walks, evicting caches
    arg = faust_input(tasks, told)

    def run(_: int, __: int) -> int:
        if side == "ours":
            assignor.assign(tasks, told)
        else:
            faust_assign(arg, len(tasks), replicas)
        return 0

    gc.collect()
    functools.reduce(run, [0, 1])
    del heap


def count(side: str, partitions: int, workers: int, replicas: int, step: str) -> Counts:
    """Run :func:`child` under Cachegrind (callgrind) and read its totals."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        command = [
            "valgrind",
            "--tool=callgrind",
            "--cache-sim=yes",
            *CACHES,
            "--collect-atstart=no",
            "--toggle-collect=functools_reduce",
            f"--callgrind-out-file={out}",
            sys.executable,
            __file__,
            "--child",
            side,
            str(partitions),
            str(workers),
            str(replicas),
            step,
        ]
        subprocess.run(command, check=True, capture_output=True)
        lines = out.read_text().splitlines()
    names = next(line.split()[1:] for line in lines if line.startswith("events:"))
    values = next(line.split()[1:] for line in lines if line.startswith("totals:"))
    got = dict(zip(names, map(int, values), strict=True))
    return Counts(*(got.get(e, 0) for e in EVENTS))


def ratio(peer: int, ours: int) -> str:
    return f"{peer / ours:.2f}x" if ours else "—"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["12x3", "64x8"], help="P x M, as 64x8")
    parser.add_argument("--standbys", nargs="+", type=int, default=[1, 2])
    parser.add_argument(
        "--steps",
        nargs="+",
        default=["2 join", "all rejoin"],
        help="chain steps (task_assignor.CHAIN), quoted",
    )
    parser.add_argument("--markdown", type=Path, help="write the results section into this file")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        side, p, m, r, step = args.child
        child(side, int(p), int(m), int(r), step)
        return 0
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt install valgrind)")

    info = show_machine_info()
    sizes = [tuple(map(int, size.split("x"))) for size in args.sizes]
    rows = [(p, m, r, step) for r in args.standbys for p, m in sizes for step in args.steps]
    jobs = [(side, *row) for row in rows for side in ("ours", "faust")]
    with ThreadPoolExecutor(max_workers=2) as pool:
        counted = dict(zip(jobs, pool.map(lambda job: count(*job), jobs), strict=True))
    report = Report(
        "One cold run, counted: instructions and last-level cache misses",
        [
            "P x M",
            "standbys",
            "step",
            "instructions: ours / Faust",
            "Faust / ours",
            "LL misses (code + read + write): ours / Faust",
            "Faust / ours",
        ],
        notes=(
            "Valgrind's callgrind with a simulated 32 MiB, 16-way last-level cache; one run "
            "each after `gc.collect()` over a ~60 MB heap, counting only the assignment. "
            "Ratios above 1 mean ours executes or misses less."
        ),
    )
    for p, m, r, step in rows:
        ours, peer = counted[("ours", p, m, r, step)], counted[("faust", p, m, r, step)]
        report.add(
            f"{p} x {m}",
            str(r),
            step,
            f"{ours.instructions:,} / {peer.instructions:,}",
            ratio(peer.instructions, ours.instructions),
            f"{ours.breakdown()} / {peer.breakdown()}",
            ratio(peer.misses, ours.misses),
        )
    report.show()
    if args.markdown:
        version = subprocess.run(["valgrind", "--version"], capture_output=True, text=True)
        write_reports(
            args.markdown,
            SECTION,
            "## Results: cold runs counted (Cachegrind)",
            [report],
            info,
            "benchmarks/cachegrind.py",
            argv,
            [f"- **simulator**: {version.stdout.strip()}, callgrind `{' '.join(CACHES)}`"],
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
