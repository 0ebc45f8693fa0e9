#!/usr/bin/env python3
"""A throwaway Spark standalone cluster on 127.0.0.1, started from the pyspark package.

    python scripts/spark_cluster.py --workers 2 --cores 1   # prints the master URL, Ctrl-C stops

Ctrl-C, SIGTERM or SIGHUP stop it (also when started in the background, where SIGINT comes in
ignored), exit status 128 + the signal's number.

One master and N workers (``spark-class org.apache.spark.deploy.master.Master`` /
``...worker.Worker`` from the pip-installed pyspark, which ships Spark's jars and scripts), on
free ports, each worker with its own work directory under one temporary folder. :func:`cluster`
waits (with a deadline) until the master reports every worker alive, and on exit stops every
process it started (their process groups, so the executors the workers launched go too) and
removes the folder. On Linux the JVMs also get SIGKILL if this process dies.

The workers run without ``PYTHONPATH``: executors see only what their Python interpreter
(``PYSPARK_PYTHON`` of the driver) and Spark itself give them. Used by
``tests/pipeline/test_cluster.py`` and ``benchmarks/pipeline.py``; see docs/pipeline.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: How long the master and workers get to start and register (a loaded 2-core machine).
START_TIMEOUT_S = 90.0


class ClusterError(RuntimeError):
    """The cluster did not come up; the message names the log to read."""


@dataclass(frozen=True)
class Cluster:
    master_url: str  # spark://127.0.0.1:PORT
    web_url: str  # the master's web UI (JSON status under /json/)
    home: Path  # the temporary folder: logs and the workers' work directories
    workers: int


def spark_home() -> Path:
    """The pip-installed pyspark's directory: it is a SPARK_HOME (bin/, jars/, python/lib/)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_ports(count: int) -> list[int]:
    """Ports the kernel considers free right now (held open together, so distinct)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when the parent dies (Linux), so nothing leaks."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _environment(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON")}
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOG_DIR=str(home / "logs"),
        SPARK_WORKER_DIR=str(home / "work"),
        # Small heaps: the daemons only schedule; executors get their own JVMs.
        SPARK_DAEMON_MEMORY="256m",
    )
    return env


def _start(home: Path, name: str, args: list[str]) -> subprocess.Popen[bytes]:
    log = (home / f"{name}.log").open("wb")
    try:
        return subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_environment(home),
            cwd=home,
            start_new_session=True,  # its own process group: stopping it stops its executors
            preexec_fn=_die_with_parent,
        )
    finally:
        log.close()


def _alive_workers(web_url: str) -> int:
    try:
        with urllib.request.urlopen(web_url + "/json/", timeout=2) as response:
            status = json.load(response)
    except (OSError, ValueError):
        return -1
    return int(status.get("aliveworkers", 0)) if status.get("status") == "ALIVE" else -1


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each process group (workers first), then SIGKILL what is left after 10 s."""
    for process in reversed(processes):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for process in reversed(processes):
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # executors still in the group
        process.wait()


@contextlib.contextmanager
def cluster(
    workers: int = 1,
    cores: int = 1,
    memory: str = "1536m",
    timeout_s: float = START_TIMEOUT_S,
) -> Iterator[Cluster]:
    """A master and ``workers`` workers of ``cores`` cores each, stopped and removed on exit."""
    home = Path(tempfile.mkdtemp(prefix="streamassign-spark-cluster-"))
    (home / "work").mkdir()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        port, web_port, *worker_ports = free_ports(2 + 2 * workers)
        master_url = f"spark://127.0.0.1:{port}"
        web_url = f"http://127.0.0.1:{web_port}"
        master = ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"]
        processes.append(
            _start(home, "master", [*master, "--port", str(port), "--webui-port", str(web_port)])
        )
        for n in range(workers):
            rpc, web = worker_ports[2 * n : 2 * n + 2]
            worker = ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1"]
            options = ["--port", str(rpc), "--webui-port", str(web), "--cores", str(cores)]
            work_dir = str(home / "work" / f"worker-{n}")
            options += ["--memory", memory, "--work-dir", work_dir, master_url]
            processes.append(_start(home, f"worker-{n}", [*worker, *options]))
        deadline = time.monotonic() + timeout_s
        while _alive_workers(web_url) < workers:
            for process in processes:
                if process.poll() is not None:
                    raise ClusterError(f"a Spark daemon exited early; see the logs in {home}")
            if time.monotonic() > deadline:
                raise ClusterError(f"{workers} worker(s) not alive after {timeout_s:.0f} s")
            time.sleep(0.2)
        yield Cluster(master_url, web_url, home, workers)
    finally:
        _stop(processes)
        shutil.rmtree(home, ignore_errors=True)


#: What stops the script (its cluster stopped, its folder removed): Ctrl-C, ``kill`` (SIGTERM),
#: its terminal closed (SIGHUP).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _stop_on_signal(signum: int, frame: object) -> None:
    """Leave :func:`cluster` through its cleanup; later signals are ignored, so that the
    cleanup (10 s at most, then SIGKILL) is not cut short and leaves no JVM or folder."""
    for other in STOP_SIGNALS:
        signal.signal(other, signal.SIG_IGN)
    raise KeyboardInterrupt(signum)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--cores", type=int, default=1, help="cores per worker")
    args = parser.parse_args()
    # Set explicitly: started in the background by a script, SIGINT comes in ignored (Ctrl-C
    # did nothing), and SIGTERM's default ends the process without the cleanup (the JVMs die
    # with it, but the temporary folder stayed).
    for signum in STOP_SIGNALS:
        # SIGHUP found ignored (nohup) stays so: a closed terminal must not stop the cluster.
        if signum != signal.SIGHUP or signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _stop_on_signal)
    try:
        with cluster(args.workers, args.cores) as running:
            print(running.master_url, flush=True)
            while True:
                signal.pause()
    except KeyboardInterrupt as stopped:
        signum = stopped.args[0] if stopped.args else signal.SIGINT
        raise SystemExit(128 + signum) from None


if __name__ == "__main__":
    main()
