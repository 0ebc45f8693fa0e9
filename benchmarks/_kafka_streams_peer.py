"""Kafka Streams' own ``StickyTaskAssignor`` (KIP-924 public API) as a benchmark peer.

``org.apache.kafka.streams.processor.assignment.assignors.StickyTaskAssignor`` from kafka-streams
(the version in ``benchmarks/java/pom.xml``, Maven Central) runs in a JVM, driven by
``benchmarks/java/src/main/java/streamassign/bench/KafkaStreamsStickyDriver.java``: it reads one
input file written here (tasks, clients with thread counts, what each ran and replicated, lags),
builds KIP-924 ``ApplicationState`` / ``KafkaStreamsState`` / ``TaskInfo`` objects from it, times
``assign`` in the JVM (a first run apart, then the median of the runs after it; JVM start-up is
not timed) and writes back its last assignment and the times. The driver's docstring has the file
formats.

The driver is built once with Maven (``mvn compile`` plus the runtime classpath) and rebuilt when
its sources change. Without Java 17+ or Maven, or when Maven cannot resolve kafka-streams,
:func:`prepare` returns the reason as one line and the benchmark marks the column unavailable.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from _common import Timed

from streamassign import ClientAssignment, ClientState, TaskId

Assignment = dict[str, ClientAssignment]

MODULE = Path(__file__).resolve().with_name("java")
DRIVER = "streamassign.bench.KafkaStreamsStickyDriver"
CLASSPATH_FILE = MODULE / "target" / "classpath.txt"
MAVEN_TIMEOUT = 900.0
#: Seconds the JVM may take beyond its runs (start-up, reading the input, ``System.gc()``).
JVM_SLACK = 120.0
MIN_JAVA = 17


@dataclass(frozen=True)
class JavaPeer:
    """A built driver: how to start it, and what it runs (for the report header)."""

    java: str
    classpath: str
    description: str  # e.g. "kafka-streams 4.3.1 on OpenJDK 17.0.15"
    heap: str  # the JVM's -Xmx


@dataclass(frozen=True)
class JavaRun:
    """One input through the driver: the warm median as ``Timed``, plus what the JVM saw."""

    timed: Timed[Assignment]
    first_run: float | None  # the first run in a fresh JVM (class loading, JIT), seconds
    validation: str | None  # Kafka Streams' own check of the result (``NONE``: valid)


def _java_version(java: str) -> tuple[int, str] | str:
    """(major version, description) of ``java``, or why it cannot be used."""
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=60, check=False
        ).stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`{java} -version` failed: {exc}"
    found = re.search(r'version "((\d+)[^"]*)"', out)
    if not found:
        return f"cannot read the version of {java}"
    major = int(found.group(2))
    first_line = out.splitlines()[0] if out else "java"
    name = "OpenJDK" if "openjdk" in first_line.lower() else "Java"
    return major, f"{name} {found.group(1)}"


def _stale() -> bool:
    """Whether the driver must be (re)built: no classpath yet, or a source newer than it."""
    if not CLASSPATH_FILE.exists() or not (MODULE / "target" / "classes").is_dir():
        return True
    built = CLASSPATH_FILE.stat().st_mtime
    sources = [MODULE / "pom.xml", *MODULE.glob("src/**/*.java")]
    return any(p.stat().st_mtime > built for p in sources)


def _kafka_streams_version() -> str:
    found = re.search(r"<kafka.version>([^<]+)</kafka.version>", (MODULE / "pom.xml").read_text())
    return found.group(1) if found else "?"


def prepare(heap: str, log: Callable[[str], None]) -> JavaPeer | str:
    """Build the driver if needed; the peer, or one line saying why it is unavailable."""
    java = shutil.which("java")
    if java is None:
        return "Java not found on PATH (Java 17+ is needed)"
    version = _java_version(java)
    if isinstance(version, str):
        return version
    major, java_name = version
    if major < MIN_JAVA:
        return f"{java_name} is too old (Java {MIN_JAVA}+ is needed)"
    if _stale():
        mvn = shutil.which("mvn")
        if mvn is None:
            return "Maven (`mvn`) not found on PATH: it builds the Kafka Streams driver"
        log("building the Kafka Streams driver with Maven (first time: resolves kafka-streams)")
        command = [
            mvn,
            "--batch-mode",
            "--no-transfer-progress",
            "--quiet",
            "-f",
            str(MODULE / "pom.xml"),
            "compile",
            "dependency:build-classpath",
            "-Dmdep.includeScope=runtime",
            f"-Dmdep.outputFile={CLASSPATH_FILE}",
        ]
        try:
            proc = subprocess.run(
                command, capture_output=True, text=True, timeout=MAVEN_TIMEOUT, check=False
            )
        except subprocess.TimeoutExpired:
            return f"Maven did not build the Kafka Streams driver within {MAVEN_TIMEOUT:g} s"
        if proc.returncode != 0:
            lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "ERROR" in ln]
            return f"Maven failed to build the Kafka Streams driver: {(lines or ['?'])[0]}"
        # build-classpath leaves an unchanged file as it was: its time marks this build.
        CLASSPATH_FILE.touch()
    classpath = f"{MODULE / 'target' / 'classes'}:{CLASSPATH_FILE.read_text().strip()}"
    description = f"kafka-streams {_kafka_streams_version()} on {java_name}"
    return JavaPeer(java, classpath, description, heap)


def _task(task: TaskId) -> str:
    return f"{task.subtopology}_{task.partition}"


def write_input(
    path: Path,
    tasks: Sequence[TaskId],
    clients: Sequence[ClientState],
    replicas: int,
    stateful: frozenset[TaskId] | None,
    timing: Mapping[str, float],
) -> None:
    """The driver's input: settings, tasks (all stateful unless ``stateful`` says), clients."""
    lines = [f"standbys {replicas}", *(f"{key} {value:g}" for key, value in timing.items())]
    for task in tasks:
        kind = "stateful" if stateful is None or task in stateful else "stateless"
        lines.append(f"task {task.subtopology} {task.partition} {kind}")
    for client in clients:
        lines.append(f"client {client.process_id} {client.capacity}")
    for client in clients:
        pid = client.process_id
        if client.prev_active:
            lines.append(f"active {pid} " + " ".join(_task(t) for t in sorted(client.prev_active)))
        if client.prev_standby:
            lines.append(
                f"standby {pid} " + " ".join(_task(t) for t in sorted(client.prev_standby))
            )
        if client.lags:
            lines.append(
                f"lag {pid} "
                + " ".join(f"{_task(t)}={lag}" for t, lag in sorted(client.lags.items()))
            )
    path.write_text("\n".join(lines) + "\n")


def _parse_task(text: str) -> TaskId:
    subtopology, partition = text.split("_")
    return TaskId(int(subtopology), int(partition))


def read_output(path: Path) -> tuple[dict[str, str], Assignment]:
    """The driver's key/value lines, and its assignment in our terms."""
    fields: dict[str, str] = {}
    actives: dict[str, frozenset[TaskId]] = {}
    standbys: dict[str, frozenset[TaskId]] = {}
    for line in path.read_text().splitlines():
        key, _, rest = line.partition(" ")
        if key in ("active", "standby"):
            pid, *tasks = rest.split(" ") if rest else [""]
            into = actives if key == "active" else standbys
            into[pid] = frozenset(_parse_task(t) for t in tasks if t)
        else:
            fields[key] = rest
    assignment = {
        pid: ClientAssignment(
            active=actives.get(pid, frozenset()), standby=standbys.get(pid, frozenset())
        )
        for pid in actives.keys() | standbys.keys()
    }
    return fields, assignment


def kafka_streams_assign(
    peer: JavaPeer,
    tasks: Sequence[TaskId],
    clients: Sequence[ClientState],
    replicas: int,
    repeats: int,
    budget: float,
    min_total: float,
    stateful: frozenset[TaskId] | None = None,
) -> JavaRun:
    """Run Kafka Streams' StickyTaskAssignor on this input in a fresh JVM (see the module doc)."""
    timing = {"repeats": repeats, "budget_s": budget, "min_total_s": min_total}
    with tempfile.TemporaryDirectory(prefix="ks-peer-") as scratch:
        given, result = Path(scratch) / "input.txt", Path(scratch) / "output.txt"
        write_input(given, tasks, clients, replicas, stateful, timing)
        command = [
            peer.java,
            f"-Xmx{peer.heap}",
            "-cp",
            peer.classpath,
            DRIVER,
            str(given),
            str(result),
        ]
        try:
            proc = subprocess.run(
                command, capture_output=True, text=True, timeout=2 * budget + JVM_SLACK, check=False
            )
        except subprocess.TimeoutExpired:
            return JavaRun(Timed(None, 0, None, budget=budget), None, None)
        if proc.returncode != 0 or not result.exists():
            tail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            return JavaRun(Timed(None, 0, None, error=f"JVM: {tail}"), None, None)
        fields, assignment = read_output(result)
    first = float(fields["first_run_s"]) if "first_run_s" in fields else None
    status = fields.get("status")
    if status == "budget":
        return JavaRun(Timed(None, int(fields.get("runs", 0)), None, budget=budget), first, None)
    if status != "ok":
        return JavaRun(Timed(None, 0, None, error=fields.get("message", "?")), first, None)
    timed = Timed(float(fields["median_s"]), int(fields["runs"]), assignment)
    return JavaRun(timed, first, fields.get("validation"))
