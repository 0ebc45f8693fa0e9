"""Run ``streamassign`` in a child process with a stand-in for Spark: no JVM, so the tests of
what a process shows and leaves behind (its output streams, signals) take a second, not a JVM
start. Run as ``python fake_spark.py MODE ARGS...``; the CLI's own progress, publishing and
interrupt handling run for real. MODE:

- ``quick``: every Spark job returns at once (``plan-standbys`` gets a fixed plan);
- ``hang-job``: ``simulate``'s job writes a few rows into its partial folder, then runs until
  its job group is cancelled (as Spark's tasks do);
- ``hang-start``: the session's start never ends (a JVM start, interruptible); it touches the
  file ``$FAKE_SPARK_STARTED`` first;
- ``signal-aside``, ``signal-delete``, ``signal-twice``: ``simulate``'s job writes a tiny
  complete run, and the process sends itself SIGTERM while publishing it: just after the old
  run is moved aside, or as the old run is deleted; or twice just after the old run is moved
  aside.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: The plan ``quick`` mode's plan-standbys prints: one candidate, short of 0.999.
ROWS = [
    {"standbys": 1, "warmups": 0, "availability": 0.995, "standby_load": 1.0}
    | {"warmup_load": 0.0, "convergence_s": 0.0, "outage_per_day_s": 1.0}
    | {"worst_outage_p99_s": 1.0, "bootstrap_per_hour": 1.0}
]


class _Accumulator:
    value = 0


class _Tracker:
    def getJobIdsForGroup(self, group: str) -> list[int]:
        return []


class _Context:
    """The few ``SparkContext`` calls the CLI makes; ``cancelJobGroup`` ends a hung job."""

    master = "local[1]"

    def __init__(self) -> None:
        self.cancelled = threading.Event()

    def setJobGroup(self, *args: Any, **kwargs: Any) -> None:
        pass

    def setLogLevel(self, level: str) -> None:
        pass

    def statusTracker(self) -> _Tracker:
        return _Tracker()

    def cancelJobGroup(self, group: str) -> None:
        self.cancelled.set()

    def accumulator(self, value: int) -> _Accumulator:
        return _Accumulator()


class _Session:
    def __init__(self) -> None:
        self.sparkContext = _Context()


def _install(mode: str) -> None:
    from streamassign.cli import plan_standbys
    from streamassign.pipeline import preflight
    from streamassign.pipeline import spark as sp

    preflight.jvm_will_start = lambda: False

    @contextlib.contextmanager
    def spark_session(*args: Any, **kwargs: Any) -> Iterator[_Session]:
        if mode == "hang-start":
            Path(os.environ["FAKE_SPARK_STARTED"]).touch()
            threading.Event().wait()  # a signal's handler raises out of it
        yield _Session()

    def run_simulation(session: _Session, job: Any, staging: str, *args: Any) -> int:
        rows = Path(staging) / "rebalances" / "assignor=task%3Asticky"
        rows.mkdir(parents=True)
        (rows / "part-00000.parquet").write_bytes(b"rows")
        if not session.sparkContext.cancelled.wait(60):
            raise AssertionError("never cancelled")
        raise RuntimeError("job group cancelled")

    def standby_plan(*args: Any) -> Any:
        plan = {"candidates": ROWS, "recommended": ROWS[0], "why": "cheapest", "knobs": []}
        return plan | {"target_reached": "0.999" not in sys.argv}, ROWS[0]

    sp.spark_session = spark_session
    sp.run_simulation = run_simulation  # type: ignore[assignment]
    if mode.startswith("signal-"):
        _signal_while_publishing(mode.removeprefix("signal-"))
    sp.run_plan = lambda *args: []
    plan_standbys._standby_plan = standby_plan  # type: ignore[assignment]


def _signal_while_publishing(when: str) -> None:
    import signal

    from streamassign.pipeline import runs
    from streamassign.pipeline import spark as sp

    def run_simulation(
        session: _Session, job: Any, staging: str, manifest: Any, run_id: str, *args: Any
    ) -> int:
        rows = Path(staging) / "rebalances" / "assignor=task%3Asticky"
        rows.mkdir(parents=True)
        (rows / "part-00000.parquet").write_bytes(b"rows")
        runs.write_manifest(runs.LocalFiles(), staging, {**manifest, "run_id": run_id, "rows": 1})
        return 1

    rename, delete = runs.LocalFiles.rename, runs.LocalFiles.delete

    def rename_then_signal(self: runs.LocalFiles, source: str, target: str) -> None:
        rename(self, source, target)
        if when in ("aside", "twice") and ".replaced-" in target:
            for _ in range(2 if when == "twice" else 1):
                os.kill(os.getpid(), signal.SIGTERM)

    def signal_then_delete(self: runs.LocalFiles, path: str) -> None:
        if when == "delete" and ".replaced-" in path:
            os.kill(os.getpid(), signal.SIGTERM)
        delete(self, path)

    sp.run_simulation = run_simulation  # type: ignore[assignment]
    runs.LocalFiles.rename = rename_then_signal  # type: ignore[method-assign]
    runs.LocalFiles.delete = signal_then_delete  # type: ignore[method-assign]


def main() -> None:
    _install(sys.argv[1])
    from streamassign.cli import main as cli

    cli.main(args=sys.argv[2:], prog_name="streamassign")


if __name__ == "__main__":
    main()
