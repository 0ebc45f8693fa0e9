"""Test processes that print JSON lines: start, read, stop cleanly (SIGTERM) or crash (SIGKILL)."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .conftest import kafka_script

ROOT = Path(__file__).resolve().parents[2]


class JsonLinesProcess:
    """A Python script run in its own process; ``lines`` holds every JSON line it printed.
    On Linux the process gets SIGKILL when the test process dies (as the session broker
    does): a worker killed with pytest, or busy starting when pytest was killed, never runs
    on unattended."""

    def __init__(self, script: Path, args: list[str], log: Path | None = None) -> None:
        """``log``: a file for the script's stderr (its logs), else they are dropped."""
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self.lines: list[dict[str, Any]] = []
        self.stamp = time.monotonic()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as files:
            stderr = files.enter_context(log.open("a")) if log is not None else subprocess.DEVNULL
            self.proc = subprocess.Popen(
                [sys.executable, str(script), *args],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env=env,
                preexec_fn=kafka_script().die_with_parent_preexec(),
            )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            if raw.startswith("{"):
                self._queue.put(json.loads(raw))

    def drain(self) -> list[dict[str, Any]]:
        """Move newly printed lines into ``lines``; returns the new ones."""
        new = []
        while True:
            try:
                new.append(self._queue.get_nowait())
            except queue.Empty:
                break
        if new:
            self.lines.extend(new)
            self.stamp = time.monotonic()
        return new

    @property
    def last(self) -> dict[str, Any] | None:
        return self.lines[-1] if self.lines else None

    def quiet_for(self) -> float:
        return time.monotonic() - self.stamp

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)
