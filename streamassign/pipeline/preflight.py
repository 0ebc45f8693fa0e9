"""Checks before a JVM starts: Java, the master URL, and sizes a run can finish.

Starting Spark costs 10 s or more, and its failures are pages of Java: no Java on the machine
ends in ``JAVA_GATEWAY_EXITED``; an unreachable ``spark://`` master retries for two minutes; a
misspelt scheme fails inside the JVM. Sizes past what an assignment can handle hang executors.
Each check here costs milliseconds (the master check at most :data:`CONNECT_TIMEOUT_S` per
address) and raises a :class:`PipelineError` whose message is one actionable line.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from typing import Final

from .scenarios import PipelineError, ScenarioModel, Workload

__all__ = [
    "CONNECT_TIMEOUT_S",
    "MAX_CLIENTS",
    "MAX_PARTITIONS",
    "MAX_TASKS",
    "check_java",
    "check_master",
    "check_size",
    "jvm_will_start",
]

#: Kafka partition numbers are int32: a count is at most this.
MAX_PARTITIONS: Final = 2**31 - 1
#: Tasks of one layout (after expansions): one assignment of 50,000 tasks to 50 clients takes
#: 2.7 s and a simulation makes thousands, so past this a run cannot finish in hours.
MAX_TASKS: Final = 100_000
#: Clients of one group (``max_clients`` of the model, ``plan --num-clients``): 100,000 clients
#: take 3 s per assignment even for 16 tasks.
MAX_CLIENTS: Final = 100_000
#: How long the ``spark://`` master check waits for each address.
CONNECT_TIMEOUT_S: Final = 3.0
#: The Java release Spark 4 needs.
JAVA_MIN: Final = 17

_LOCAL = re.compile(r"local(\[(\*|\d+)(,\d+)?\])?|local-cluster\[\d+,\d+,\d+\]")
_MASTER_FORMS = "local[N], local[*], spark://HOST:PORT, yarn or k8s://https://HOST:PORT"


def jvm_will_start() -> bool:
    """Whether this command would launch a JVM: not under ``spark-submit`` (which started
    one), and no session already running in this process (tests, notebooks)."""
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        return False
    sql = sys.modules.get("pyspark.sql")
    if sql is None:  # pyspark not imported yet: no session can be running
        return True
    return sql.SparkSession.getActiveSession() is None


#: How long ``java -version`` may take: a JVM answers in well under a second, even cold.
JAVA_VERSION_TIMEOUT_S = 20.0


def check_java(environ: Mapping[str, str] | None = None) -> str:
    """The ``java`` Spark would run (``$JAVA_HOME/bin/java``, else ``java`` on the PATH), if
    it is there and at least Java :data:`JAVA_MIN`; returns its path."""
    env = os.environ if environ is None else environ
    home = env.get("JAVA_HOME")
    if home:
        java = os.path.join(home, "bin", "java")
        if not os.access(java, os.X_OK):
            raise PipelineError(
                f"JAVA_HOME={home} has no bin/java: Spark needs Java {JAVA_MIN}+ (fix or unset "
                "JAVA_HOME)"
            )
    else:
        found = shutil.which("java", path=env.get("PATH"))
        if found is None:
            raise PipelineError(
                f"no Java found (no java on the PATH, JAVA_HOME unset): Spark needs Java "
                f"{JAVA_MIN}+, e.g. apt-get install openjdk-{JAVA_MIN}-jre-headless"
            )
        java = found
    version = _java_release(java)
    if version is not None and version < JAVA_MIN:
        raise PipelineError(
            f"{java} is Java {version}: Spark needs Java {JAVA_MIN}+ (install it, or point "
            "JAVA_HOME at it)"
        )
    return java


def _java_release(java: str) -> int | None:
    """The feature release of ``java`` (8, 11, 17, ...), or None if its answer does not say;
    a ``java`` that cannot run, fails or hangs is an error here, as Spark could not start it
    either (it would fail later with a launcher error, or hang)."""
    try:
        done = subprocess.run(
            [java, "-version"],
            capture_output=True,
            text=True,
            timeout=JAVA_VERSION_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise PipelineError(
            f"{java} -version did not answer within {JAVA_VERSION_TIMEOUT_S:g} s: Spark could not "
            "start it (fix the Java installation, or point JAVA_HOME at a working one)"
        ) from None
    except OSError as exc:
        raise PipelineError(f"{java} cannot run ({exc.strerror or exc}): Spark needs it") from None
    if done.returncode != 0:
        raise PipelineError(
            f"{java} -version exited {done.returncode}: Spark could not start it (fix the Java "
            "installation, or point JAVA_HOME at a working one)"
        )
    match = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major  # "1.8.0" is Java 8


def check_master(master: str | None, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """A master URL Spark accepts; for ``spark://`` (and ``k8s://``), one reachable address."""
    if master is None:
        return
    if _LOCAL.fullmatch(master) or master == "yarn":
        if master == "yarn" and not (
            os.environ.get("HADOOP_CONF_DIR") or os.environ.get("YARN_CONF_DIR")
        ):
            raise PipelineError(
                "--master yarn needs HADOOP_CONF_DIR or YARN_CONF_DIR (the cluster's "
                "configuration folder)"
            )
        return
    scheme, sep, rest = master.partition("://")
    if not sep or scheme not in ("spark", "k8s") or not rest:
        raise PipelineError(f"--master {master!r} is not a Spark master URL: use {_MASTER_FORMS}")
    if scheme == "spark":
        addresses = [_host_port(master, item, None) for item in rest.split(",")]
    else:
        inner = rest if "://" in rest else f"https://{rest}"
        host_port = inner.split("://", 1)[1].split("/", 1)[0]
        default = 443 if inner.startswith("https") else 80
        addresses = [_host_port(master, host_port, default)]
    errors = []
    for host, port in addresses:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            return
        except OSError as exc:
            errors.append(f"{host}:{port}: {exc.strerror or exc}")
    raise PipelineError(
        f"cannot reach the Spark master {master} ({'; '.join(errors)}): is it running, and is "
        "the host and port right?"
    )


def _host_port(master: str, text: str, default: int | None) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep:
        host, port = text.strip(), ""
    host = host.strip("[]")  # [::1]:7077
    if not port and default is not None:
        return host, default
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise PipelineError(f"--master {master!r}: expected HOST:PORT, got {text!r}")
    return host, int(port)


def check_size(workload: Workload, model: ScenarioModel) -> None:
    """Refuse layouts past :data:`MAX_TASKS` (at the largest expansion the model allows) and
    fleets past :data:`MAX_CLIENTS`, saying which limit and why."""
    tasks = sum(n for _, n in workload.initial_layout().task_counts)
    grows = model.expansion_per_hour > 0 and model.expansion_limit > 1
    largest = tasks * model.expansion_limit if grows else tasks
    if largest > MAX_TASKS:
        how = (
            f"{tasks:,} tasks, up to {largest:,} after expansions (expansion_limit="
            f"{model.expansion_limit})"
            if grows and largest != tasks
            else f"{tasks:,} tasks"
        )
        raise PipelineError(
            f"{workload.name or 'the topology'} has {how}: the limit is {MAX_TASKS:,} tasks "
            "(one assignment of 50,000 tasks takes about 3 s; a run makes thousands); lower "
            "--partitions or expansion_limit"
        )
    if model.max_clients > MAX_CLIENTS:
        raise PipelineError(
            f"max_clients={model.max_clients:,}: the limit is {MAX_CLIENTS:,} clients (an "
            "assignment to 100,000 clients takes about 3 s; a run makes thousands)"
        )
