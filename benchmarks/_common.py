"""Helpers shared by the benchmark scripts: workloads, timing under a budget, peak memory,
machine info, and rendering results as rich console tables and markdown sections.

Benchmarks are scripts, not tests: they run our assignor and its peers on the same inputs in the
same process, and their tables are published in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import importlib.util
import math
import os
import platform
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import FrameType, ModuleType
from typing import Generic, TypeVar

from rich.console import Console
from rich.table import Table

from streamassign import ClientAssignment, ClientState, TaskId
from streamassign.metrics import AssignmentMetrics, evaluate, violations

In = TypeVar("In")
Out = TypeVar("Out")
Out_co = TypeVar("Out_co", covariant=True)
Cfg = TypeVar("Cfg")

ROOT = Path(__file__).resolve().parents[1]
KAFKA_SCRIPT = ROOT / "scripts" / "kafka.py"

#: Wide enough for the result tables when the output is not a terminal (a log file, CI).
console = Console(width=None if sys.stdout.isatty() else 200)

# -- workloads ---------------------------------------------------------------------------------


def make_tasks(count: int, subtopologies: int = 1) -> list[TaskId]:
    """``count`` tasks split as evenly as possible over ``subtopologies``."""
    base, extra = divmod(count, subtopologies)
    return [TaskId(s, p) for s in range(subtopologies) for p in range(base + (s < extra))]


def member_ids(count: int, prefix: str) -> list[str]:
    """``count`` process ids ``prefix0000``, ... (zero-padded so they sort numerically)."""
    return [f"{prefix}{i:04d}" for i in range(count)]


def states(
    members: Iterable[str],
    capacity: int = 1,
    previous: Mapping[str, ClientAssignment] | None = None,
) -> list[ClientState]:
    """Clients reporting what they ran and replicated in ``previous`` (newcomers: nothing)."""
    empty = ClientAssignment()
    out = []
    for pid in members:
        got = (previous or {}).get(pid, empty)
        out.append(ClientState(pid, capacity, prev_active=got.active, prev_standby=got.standby))
    return out


def restarted_states(
    members: Iterable[str],
    previous: Mapping[str, ClientAssignment],
    capacity: int = 1,
    standby_lag: int = 100,
) -> list[ClientState]:
    """Clients just restarted: nothing running, their state stores still on disk.

    As in Kafka Streams, every store on disk is reported as a standby with its lag: what the
    client ran is caught up (lag 0), what it replicated trails by ``standby_lag``.
    """
    out = []
    for pid in members:
        got = previous.get(pid, ClientAssignment())
        lags = {t: standby_lag for t in got.standby} | {t: 0 for t in got.active}
        out.append(ClientState(pid, capacity, prev_standby=lags, lags=lags))
    return out


# -- quality -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Quality:
    """``evaluate`` scores of one assignment, plus its validity problems (empty when valid)."""

    metrics: AssignmentMetrics
    problems: list[str]


def quality(
    tasks: Sequence[TaskId],
    clients: Sequence[ClientState],
    assignment: Mapping[str, ClientAssignment],
    replicas: int,
) -> Quality:
    """Score ``assignment`` against ``clients`` (whose history is the true previous round)."""
    return Quality(
        evaluate(tasks, clients, assignment, replicas),
        violations(tasks, clients, assignment, replicas),
    )


# -- timing and memory ---------------------------------------------------------------------------


class BudgetExceeded(Exception):
    """A run took longer than its time budget and was interrupted."""


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Interrupt the block with ``BudgetExceeded`` after ``seconds`` (SIGALRM: main thread, Unix).

    Pure-Python peers (Faust) are interrupted between bytecodes, so a runaway run is cut short.
    """
    if seconds is None:
        yield
        return

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        raise BudgetExceeded(f"over {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass(frozen=True)
class Timed(Generic[Out_co]):
    """Median wall time of the completed runs and the last result; or why there is none."""

    seconds: float | None
    runs: int
    result: Out_co | None
    error: str | None = None
    budget: float | None = None  # set when a run was cut at this budget

    @property
    def ok(self) -> bool:
        return self.seconds is not None and self.error is None and self.budget is None


def timed(
    run: Callable[[In], Out],
    make_input: Callable[[], In],
    repeats: int,
    budget: float | None = None,
    min_total: float = 0.0,
    cold: bool = True,
) -> Timed[Out]:
    """Time ``run(make_input())`` ``repeats`` times, or more until ``min_total`` seconds are
    spent (at most 100 runs: sub-millisecond runs need many); report the median.

    Inputs are built off the clock (peers mutate theirs). ``cold``: ``gc.collect()`` before
    each run, which also flushes the CPU caches, as a rebalance finds them (it runs once, after
    network I/O). Warm (``cold=False``): timeit's method, one untimed run first, then runs back
    to back with the collector paused. A run still going at ``budget`` is interrupted, and
    repeats stop once the runs so far used half of it: a peer that is too slow or fails is a
    result to report, not a crash.
    """
    times: list[float] = []
    result: Out | None = None
    skip = 0 if cold else 1  # the warm-up run
    paused = not cold and gc.isenabled()
    if paused:
        gc.disable()
    try:
        while len(times) < repeats + skip or (sum(times) < min_total and len(times) < 100):
            arg = make_input()
            if cold:
                gc.collect()
            try:
                with time_limit(budget):
                    start = time.perf_counter()
                    result = run(arg)
                    times.append(time.perf_counter() - start)
            except BudgetExceeded:
                return Timed(None, len(times), None, budget=budget)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}".strip(": ")
                return Timed(None, len(times), None, error=error)
            if budget is not None and 2 * sum(times) > budget:
                break
    finally:
        if paused:
            gc.enable()
    kept = times[skip:] or times
    return Timed(statistics.median(kept), len(kept), result)


@dataclass(frozen=True)
class Footprint:
    """What one run executes. A cold run pays a cache miss for each distinct line of code and
    built-in function it touches, so these, not the bytecode count, set its cost."""

    lines: int  # distinct source lines executed
    builtins: int  # distinct built-in (C) functions and methods called
    bytecodes: int  # bytecodes executed


def footprint(run: Callable[[In], object], arg: In) -> Footprint:
    """Trace one ``run(arg)`` (``sys.settrace`` / ``sys.setprofile``; far slower than a run)."""
    lines: set[tuple[object, int]] = set()
    builtins: set[str] = set()
    bytecodes = 0

    def trace(frame: FrameType, event: str, _: object) -> object:
        nonlocal bytecodes
        frame.f_trace_opcodes = True
        if event == "opcode":
            bytecodes += 1
        elif event == "line":
            lines.add((frame.f_code, frame.f_lineno))
        return trace

    def profile(frame: FrameType, event: str, func: object) -> None:
        if event == "c_call":
            builtins.add(getattr(func, "__qualname__", repr(func)))

    sys.setprofile(profile)
    sys.settrace(trace)
    try:
        run(arg)
    finally:
        sys.settrace(None)
        sys.setprofile(None)
    return Footprint(len(lines), len(builtins), bytecodes)


def peak_memory(run: Callable[[In], object], arg: In) -> int:
    """Bytes allocated at the peak of ``run(arg)`` above what existed before it."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        run(arg)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak - base


# -- formatting ----------------------------------------------------------------------------------


def fmt_seconds(seconds: float) -> str:
    """``47 µs``, ``4.20 ms``, ``12.3 ms``, ``1.25 s``."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 0.01:
        return f"{seconds * 1e3:.2f} ms"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def fmt_time(t: Timed[object]) -> str:
    """The median, ``> budget`` when cut short, or the error's type when the run failed."""
    if t.budget is not None:
        return f"> {t.budget:g} s"
    if t.error is not None:
        return f"error ({t.error.split(':')[0]})"
    assert t.seconds is not None
    return fmt_seconds(t.seconds)


def fmt_ratio(peer: Timed[object], ours: Timed[object]) -> str:
    """``peer / ours`` time ratio; a lower bound when the peer was cut at its budget."""
    if ours.seconds is None or peer.error is not None:
        return "—"
    if peer.budget is not None:
        return f"> {peer.budget / ours.seconds:,.0f}x"
    assert peer.seconds is not None
    ratio = peer.seconds / ours.seconds
    if ratio < 1:  # the peer was faster: two decimals, rounded down, so it never reads 1.0x
        return f"{math.floor(ratio * 100) / 100:.2f}x"
    return f"{ratio:,.1f}x" if ratio < 100 else f"{ratio:,.0f}x"


def fmt_num(x: float) -> str:
    """An integer without decimals, anything else with two."""
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.2f}"


def fmt_bool(ok: bool) -> str:
    return "✓" if ok else "✗"


def fmt_bytes(n: float) -> str:
    """``812 B``, ``3.4 KiB``, ``12.5 MiB``."""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024 or unit == "MiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


# -- reports -----------------------------------------------------------------------------------


@dataclass
class Report:
    """One result table, shown on the console and written as markdown."""

    title: str
    columns: Sequence[str]
    notes: str = ""
    rows: list[list[str]] = field(default_factory=list)

    def add(self, *cells: str) -> None:
        assert len(cells) == len(self.columns), (cells, self.columns)
        self.rows.append(list(cells))

    def show(self) -> None:
        table = Table(*self.columns, title=self.title, title_justify="left")
        for row in self.rows:
            table.add_row(*row)
        console.print(table)

    def markdown(self) -> str:
        def line(cells: Iterable[str]) -> str:
            return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

        out = [f"### {self.title}", ""]
        if self.notes:
            out += [self.notes, ""]
        out += [line(self.columns), line("---" for _ in self.columns)]
        out += [line(row) for row in self.rows]
        return "\n".join(out) + "\n"


def machine_info() -> dict[str, str]:
    """Date, CPU, core count, Python and package versions, and the git commit measured."""
    cpu = platform.processor() or platform.machine()
    with suppress(OSError):
        found = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        if found:
            cpu = found.group(1).strip()
    commit = "unknown"
    with suppress(OSError, subprocess.CalledProcessError):
        here = Path(__file__).resolve().parent
        commit = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=here,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    versions = []
    for dist in ("faust-streaming", "rich"):
        with suppress(metadata.PackageNotFoundError):
            versions.append(f"{dist} {metadata.version(dist)}")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}",
        "load average at start": load,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "streamassign": f"git {commit}",
        "peers": ", ".join(versions) or "none installed",
    }


def write_section(path: Path, name: str, body: str, under: str = "") -> None:
    """Put ``body`` between ``<!-- name:begin -->`` and ``<!-- name:end -->`` in ``path``.

    Replaces the section when the markers exist, else appends it (after the heading ``under``,
    if given), so the file can hold other hand-written or generated sections.
    """
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    section = f"{begin}\n{body.rstrip()}\n{end}"
    text = path.read_text() if path.exists() else ""
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text, count=1)
    else:
        for part in (under, section):
            if part:
                text = (text.rstrip() + "\n\n" if text.strip() else "") + part + "\n"
    path.write_text(text)


def show_machine_info() -> dict[str, str]:
    """Print :func:`machine_info` on the console and return it, for :func:`write_reports`."""
    info = machine_info()
    for key, value in info.items():
        console.print(f"[bold]{key}[/]: {value}")
    return info


def write_reports(
    path: Path,
    section: str,
    heading: str,
    reports: Iterable[Report | str],
    info: Mapping[str, str],
    script: str,
    argv: Sequence[str] | None,
    extra: Sequence[str] = (),
    under: str = "",
) -> None:
    """Write ``reports`` (markdown text between them as strings) as section ``section`` of
    ``path`` (a new one after the heading ``under``), under ``heading`` (none when empty)
    and a header saying how they were made: the command (``python script`` and ``argv``,
    else the process's arguments), the date and machine from ``info``
    (:func:`show_machine_info`), then the ``extra`` markdown lines."""
    command = shlex.join(["python", script, *_portable(argv or sys.argv[1:])])
    header = [
        *([heading, ""] if heading else []),
        f"Generated by `{command}` on {info['date']}.",
        "",
        *(f"- **{key}**: {value}" for key, value in info.items() if key != "date"),
        *extra,
        "",
    ]
    parts = (r if isinstance(r, str) else r.markdown() for r in reports)
    body = "\n".join(header) + "\n" + "\n".join(parts)
    write_section(path, section, body, under)
    console.print(f"wrote section {section!r} of {path}")


def _portable(argv: Sequence[str]) -> list[str]:
    """``argv`` with paths inside the checkout made relative to it (a run from another worktree
    or a temporary directory must not leak that path into the docs)."""
    out = []
    for arg in argv:
        path = Path(arg)
        if path.is_absolute() and path.resolve().is_relative_to(ROOT):
            arg = str(path.resolve().relative_to(ROOT))
        out.append(arg)
    return out


# -- command line and broker -------------------------------------------------------------------


def arguments(
    doc: str | None,
    section: str,
    quick: str | None = None,
    repeats: str | None = None,
    broker: bool = True,
) -> argparse.ArgumentParser:
    """A parser with the options the benchmarks share: ``--quick`` (when ``quick`` says what it
    runs), ``--markdown``, ``--section`` (default ``section``), ``--bootstrap`` (with
    ``broker``) and ``--repeats`` (when ``repeats`` says what a run is); the description is
    the first paragraph of ``doc``."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    if quick is not None:
        parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--markdown", type=Path, help="write the results section into this file")
    parser.add_argument(
        "--section", default=section, help=f"section of --markdown to write (default {section})"
    )
    if broker:
        parser.add_argument("--bootstrap", help="use this Kafka broker instead of starting one")
    if repeats is not None:
        parser.add_argument("--repeats", type=int, help=repeats)
    return parser


def chosen(args: argparse.Namespace, quick: Cfg, full: Cfg) -> Cfg:
    """The configuration (a dataclass with ``repeats``) that ``--quick`` picks, with the
    ``--repeats`` given."""
    cfg = quick if args.quick else full
    if getattr(args, "repeats", None):
        cfg = dataclasses.replace(cfg, repeats=args.repeats)  # type: ignore[type-var]
    return cfg


def _kafka_script() -> ModuleType:
    """scripts/kafka.py (not a package), imported under a private name."""
    name = "_streamassign_kafka_script"
    spec = importlib.util.spec_from_file_location(name, KAFKA_SCRIPT)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {KAFKA_SCRIPT}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@contextmanager
def kafka_broker(bootstrap: str | None) -> Iterator[tuple[str, str]]:
    """``(bootstrap, description)``: the given broker, or one started for this run."""
    if bootstrap:
        yield bootstrap, f"Broker at `{bootstrap}` (given with --bootstrap)"
        return
    kafka = _kafka_script()
    broker = kafka.start_broker(die_with_parent=True)
    try:
        yield (
            broker.bootstrap,
            (
                f"Kafka {kafka.default_version()} single-node KRaft broker started by "
                "`scripts/kafka.py` (group.initial.rebalance.delay.ms=0)"
            ),
        )
    finally:
        broker.stop()


@contextmanager
def on_broker(bootstrap: str | None, info: dict[str, str]) -> Iterator[tuple[str, Path]]:
    """A broker (:func:`kafka_broker`) and a temporary directory for one run; afterwards
    ``info`` says which broker it was and the load average at the end."""
    with kafka_broker(bootstrap) as (servers, broker), tempfile.TemporaryDirectory() as tmp:
        yield servers, Path(tmp)
    info["broker"] = broker
    info["load average at end"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())


def publish(
    reports: Sequence[Report],
    args: argparse.Namespace,
    info: Mapping[str, str],
    script: str,
    argv: Sequence[str] | None,
    heading: str = "",
) -> None:
    """Show ``reports``; with ``--markdown``, write them into its ``--section``
    (:func:`write_reports`)."""
    for report in reports:
        report.show()
    if args.markdown:
        write_reports(args.markdown, args.section, heading, reports, info, script, argv)
