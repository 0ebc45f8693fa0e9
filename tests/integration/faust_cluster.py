"""Faust worker processes of one app (``faust_worker.py``) for the broker tests and the
benchmark: start, kill -9, wait for a settled assignment, read the table through the router."""

from __future__ import annotations

import json
import signal
import socket
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from .procs import JsonLinesProcess

WORKER = Path(__file__).with_name("faust_worker.py")
PARTITIONS = 6
KEYS = [f"k{i:02d}" for i in range(24)]
SETTLE = 3.0
TIMEOUT = 90.0

Pairs = frozenset[tuple[str, int]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class FaustCluster:
    """The worker processes of one Faust app."""

    def __init__(
        self,
        bootstrap: str,
        app: str,
        topic: str,
        tmp: Path,
        *extra: str,
        assignor: str = "ours",
        partitions: int = PARTITIONS,
    ) -> None:
        self.bootstrap, self.app, self.topic, self.tmp = bootstrap, app, topic, tmp
        self.assignor, self.extra, self.partitions = assignor, list(extra), partitions
        tmp.mkdir(parents=True, exist_ok=True)
        self.changelog = f"{app}-counts-changelog"
        self.procs: dict[str, JsonLinesProcess] = {}
        self.ports: dict[str, int] = {}

    def start(self, name: str, *extra: str) -> None:
        port = self.ports.setdefault(name, free_port())
        self.procs[name] = JsonLinesProcess(
            WORKER,
            [
                "--bootstrap", self.bootstrap, "--app", self.app, "--topic", self.topic,
                "--partitions", str(self.partitions), "--datadir", str(self.tmp / name),
                "--port", str(port), "--assignor", self.assignor,
                "--log", str(self.tmp / f"{name}.log"), *self.extra, *extra,
            ],
        )  # fmt: skip

    def kill(self, name: str) -> None:
        self.procs.pop(name).stop(signal.SIGKILL)

    def states(self) -> dict[str, dict[str, Any]]:
        """Each live worker's last reported state."""
        out = {}
        for name, proc in self.procs.items():
            proc.drain()
            lines = [line for line in proc.lines if line["event"] == "state"]
            if lines:
                out[name] = lines[-1]
        return out

    def settle(
        self, standbys: int | None = 1, stateful: bool = True
    ) -> dict[str, dict[str, Pairs]]:
        """Wait until every worker is done rebalancing, quiet, and the assignment is complete
        (``standbys=None``: whatever standbys there are); per worker, its source and changelog
        actives and its changelog standbys."""
        deadline = time.monotonic() + TIMEOUT
        last: Any = None
        while time.monotonic() < deadline:
            time.sleep(0.25)
            states = self.states()
            if len(states) != len(self.procs) or any(s["rebalancing"] for s in states.values()):
                continue
            if any(p.quiet_for() < SETTLE for p in self.procs.values()):
                continue
            last = {
                name: {
                    kind: frozenset((t, p) for t, p in s[key] if t == topic)
                    for kind, key, topic in (
                        ("source", "actives", self.topic),
                        ("changelog", "actives", self.changelog),
                        ("standby", "standbys", self.changelog),
                    )
                }
                for name, s in states.items()
            }
            changelog = self.changelog if stateful else None
            wanted = None if standbys is None else min(standbys, len(states) - 1)
            if complete(last, self.topic, self.partitions, changelog, wanted):
                return last
        raise AssertionError(f"no settled assignment within {TIMEOUT}s: {last}")

    def get(self, via: str, path: str) -> Any:
        """GET ``path`` of worker ``via``'s web server, as JSON."""
        url = f"http://127.0.0.1:{self.ports[via]}{path}"
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())

    def counts(self, via: str) -> dict[str, int]:
        """Every key's count, asked of worker ``via`` (Faust routes to the owner)."""
        return {key: self.get(via, f"/count/{key}/")["count"] for key in KEYS}

    def wait_counts(self, via: str, expected: int) -> None:
        deadline = time.monotonic() + TIMEOUT
        got: dict[str, int] | str = {}
        while time.monotonic() < deadline:
            try:
                got = self.counts(via)
            except OSError as exc:  # 503 while the owner is recovering, or a reset connection
                got = repr(exc)
            if got == dict.fromkeys(KEYS, expected):
                return
            time.sleep(0.5)
        raise AssertionError(f"counts via {via} never reached {expected}: {got}")

    def wait_counts_at_least(self, via: str, expected: int) -> dict[str, int]:
        """Every key's count once all are at least ``expected`` (at-least-once processing)."""
        deadline = time.monotonic() + TIMEOUT
        got: dict[str, int] | str = {}
        while time.monotonic() < deadline:
            try:
                got = self.counts(via)
            except OSError as exc:  # 503 while the owner is recovering, or a reset connection
                got = repr(exc)
            if isinstance(got, dict) and min(got.values()) >= expected:
                return got
            time.sleep(0.5)
        raise AssertionError(f"counts via {via} never reached {expected}: {got}")

    def close(self) -> None:
        for proc in self.procs.values():
            proc.stop(signal.SIGKILL)


def complete(
    state: dict[str, dict[str, Pairs]],
    topic: str,
    partitions: int,
    changelog: str | None,
    standbys: int | None,
) -> bool:
    """Each partition active exactly once (source and changelog together), and each changelog
    partition has ``standbys`` standbys (``None``: any number), none on its active's worker."""
    expected = sorted((topic, p) for p in range(partitions))
    if sorted(tp for s in state.values() for tp in s["source"]) != expected:
        return False
    if changelog is None:
        return True
    for s in state.values():
        if {p for _, p in s["source"]} != {p for _, p in s["changelog"]}:
            return False
        if {p for _, p in s["standby"]} & {p for _, p in s["source"]}:
            return False
    held = sorted(p for s in state.values() for _, p in s["standby"])
    return standbys is None or held == sorted(p for p in range(partitions) for _ in range(standbys))


async def produce(
    bootstrap: str, topic: str, rounds: int, keys: Sequence[str] = tuple(KEYS)
) -> None:
    """``rounds`` records of value 1 per key (JSON keys, as Faust's table routing expects)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        for _ in range(rounds):
            for key in keys:
                await producer.send(topic, value=b"1", key=json.dumps(key).encode())
        await producer.flush()
    finally:
        await producer.stop()
