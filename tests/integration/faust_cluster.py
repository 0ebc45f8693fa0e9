"""Faust worker processes of one app (``faust_worker.py``) for the broker tests and the
benchmark: start, kill -9, wait for a settled assignment, read the table through the router,
check each topic group's balance and the table's content exactly (at-least-once: duplicates are
told apart from records, see ``faust_worker.py``)."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from .faust_worker import DROPPED_ON_RESUME
from .procs import JsonLinesProcess

WORKER = Path(__file__).with_name("faust_worker.py")
PARTITIONS = 6
KEYS = [f"k{i:02d}" for i in range(24)]
SETTLE = 3.0
#: What aiokafka logs when a worker leaves its group (graceful stop).
LEFT_GROUP = "LeaveGroup request succeeded"
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
        side_topic: str | None = None,
        keys: Sequence[str] = tuple(KEYS),
    ) -> None:
        """``side_topic``: also read by a stateless agent (``settle`` then reports each
        worker's actives of it as ``side``)."""
        self.bootstrap, self.app, self.topic, self.tmp = bootstrap, app, topic, tmp
        self.assignor, self.extra, self.partitions = assignor, list(extra), partitions
        self.side_topic, self.keys = side_topic, list(keys)
        if side_topic:
            self.extra += ["--side-topic", side_topic]
        tmp.mkdir(parents=True, exist_ok=True)
        self.changelog = f"{app}-counts-changelog"
        self.procs: dict[str, JsonLinesProcess] = {}
        self.ports: dict[str, int] = {}
        self.started: set[str] = set()
        #: Processes stopped by ``restart`` (killed by ``close`` if still exiting).
        self.retired: list[JsonLinesProcess] = []
        self.restarts = 0
        #: Next processes spawned by ``prepare``, each with the file that starts it.
        self.prepared: dict[str, tuple[JsonLinesProcess, Path]] = {}

    def start(self, name: str, *extra: str) -> None:
        self.procs[name] = self._spawn(name, *extra)

    def _spawn(self, name: str, *extra: str) -> JsonLinesProcess:
        port = self.ports.setdefault(name, free_port())
        self.started.add(name)
        return JsonLinesProcess(
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

    def prepare(self, name: str, *extra: str) -> None:
        """Spawn ``name``'s next process with ``extra`` (it imports and builds its app, then
        waits): ``restart`` starts it, so the import runs while the test waits on the group."""
        self.restarts += 1
        go = self.tmp / f"{name}.start{self.restarts}"
        self.prepared[name] = (self._spawn(name, *extra, "--start-when", str(go)), go)

    def restart(self, name: str, *extra: str) -> None:
        """Stop ``name`` gracefully (SIGTERM) and start its next process (``prepare``d, else
        spawned now with ``extra``) once the old one has left the group (its log says so: by
        then it has committed, flushed its producer and released its state directory) and the
        others have finished the rebalance that started, without waiting for the old one's
        exit (~1 s more)."""
        if name not in self.prepared:
            self.prepare(name, *extra)
        new, go = self.prepared.pop(name)
        old = self.procs.pop(name)
        log = self.tmp / f"{name}.log"
        left = log.read_text(errors="replace").count(LEFT_GROUP) if log.exists() else 0
        seen = {n: len(self._rebalances(p)) for n, p in self.procs.items()}
        old.proc.send_signal(signal.SIGTERM)
        self.retired.append(old)
        deadline = time.monotonic() + TIMEOUT
        while log.read_text(errors="replace").count(LEFT_GROUP) == left:
            if old.proc.poll() is not None:
                break  # gone without saying so (it had not joined): nothing to wait for
            assert time.monotonic() < deadline, f"{name} never left the group\n{self.report()}"
            time.sleep(0.05)
        # The others finish the rebalance its leaving started before the new one joins: a
        # join during their recovery interrupts it, where Faust 0.15.3 can crash or stall.
        while any(len(self._rebalances(p)) == seen[n] for n, p in self.procs.items()):
            assert time.monotonic() < deadline, f"no rebalance after {name} left\n{self.report()}"
            time.sleep(0.05)
        go.touch()
        self.procs[name] = new

    def _fail_if_exited(self) -> None:
        """A worker that exited cannot settle: say so now, not after ``TIMEOUT``."""
        exited = {name: p.proc.poll() for name, p in self.procs.items()}
        exited = {name: code for name, code in exited.items() if code is not None}
        if exited:
            raise AssertionError(f"worker(s) exited while settling: {exited}\n{self.report()}")

    @staticmethod
    def _rebalances(proc: JsonLinesProcess) -> list[dict[str, Any]]:
        """The rebalances ``proc`` finished (its streams resumed after recovery)."""
        proc.drain()
        return [line for line in proc.lines if line["event"] == "rebalance"]

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
        (``standbys=None``: whatever standbys there are); per worker, its source, changelog
        and side-topic actives and its changelog standbys."""
        deadline = time.monotonic() + TIMEOUT
        last: Any = None
        waiting = "nothing checked yet"
        while time.monotonic() < deadline:
            time.sleep(0.25)
            self._fail_if_exited()
            states = self.states()
            silent = sorted(set(self.procs) - set(states))
            rebalancing = sorted(name for name, s in states.items() if s["rebalancing"])
            if silent or rebalancing:
                waiting = f"no state from {silent}, rebalancing: {rebalancing}"
                continue
            if any(p.quiet_for() < SETTLE for p in self.procs.values()):
                waiting = "a worker's state still changing"
                continue
            waiting = "assignment incomplete"
            last = {
                name: {
                    kind: frozenset((t, p) for t, p in s[key] if t == topic)
                    for kind, key, topic in (
                        ("source", "actives", self.topic),
                        ("changelog", "actives", self.changelog),
                        ("standby", "standbys", self.changelog),
                        ("side", "actives", self.side_topic),
                    )
                }
                for name, s in states.items()
            }
            changelog = self.changelog if stateful else None
            wanted = None if standbys is None else min(standbys, len(states) - 1)
            if complete(last, self.topic, self.partitions, changelog, wanted):
                return last
        raise AssertionError(
            f"no settled assignment within {TIMEOUT}s ({waiting}): {last}\n{self.report()}"
        )

    def get(self, via: str, path: str) -> Any:
        """GET ``path`` of worker ``via``'s web server, as JSON."""
        url = f"http://127.0.0.1:{self.ports[via]}{path}"
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())

    def seen(self, via: str) -> dict[str, dict[str, Any]]:
        """Every key's entry, asked of worker ``via`` (Faust routes to the owner): the distinct
        sequence numbers counted (``seqs``) and the records counted (``records``)."""
        return {key: self.get(via, f"/count/{key}/") for key in self.keys}

    def counts(self, via: str) -> dict[str, int]:
        """Every key's count of distinct records (duplicates of at-least-once excluded)."""
        return {key: len(entry["seqs"]) for key, entry in self.seen(via).items()}

    def wait_counts(self, via: str, expected: int) -> int:
        """Until every key has counted exactly the records ``0 .. expected-1`` (each at least
        once, nothing else); returns the duplicates counted (records processed twice)."""
        deadline = time.monotonic() + TIMEOUT
        got: Any = {}
        while time.monotonic() < deadline:
            try:
                got, duplicates = tally(self.seen(via), expected)
            except OSError as exc:  # 503 while the owner is recovering, or a reset connection
                got = repr(exc)
            if got == {}:
                return duplicates
            time.sleep(0.5)
        raise AssertionError(
            f"the table via {via} never held exactly 0..{expected - 1}; "
            f"numbers missing or unexpected per key: {got}"
        )

    def final_table(self, via: str, expected: int) -> tuple[dict[str, list[int]], int]:
        """The table once it is exact, or once every key has counted its last record
        (``expected - 1``) and nothing changed for ``SETTLE`` seconds (what is missing then
        is lost): per key the numbers missing or unexpected, and the records counted twice."""
        deadline = time.monotonic() + TIMEOUT
        last: Any = None
        changed = time.monotonic()
        while time.monotonic() < deadline:
            try:
                seen = self.seen(via)
            except OSError:  # 503 while the owner is recovering, or a reset connection
                time.sleep(0.5)
                continue
            if seen != last:
                last, changed = seen, time.monotonic()
            off, duplicates = tally(seen, expected)
            if not off:
                return off, duplicates
            caught_up = all(expected - 1 in e["seqs"] for e in seen.values())
            if caught_up and time.monotonic() - changed >= SETTLE:
                return off, duplicates
            time.sleep(0.5)
        raise AssertionError(f"the table via {via} never counted record {expected - 1}: {last}")

    def wait_counts_at_least(self, via: str, expected: int) -> dict[str, int]:
        """Every key's distinct count once all hold at least ``0 .. expected-1``."""
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

    def dropped_on_resume(self) -> list[str]:
        """The log lines of records Faust's flow control dropped unprocessed when it resumed
        after a rebalance (``faust_worker.audit_flow_control_resume``), from every worker."""
        return self.log_lines(re.compile(re.escape(DROPPED_ON_RESUME)))

    def log_lines(self, pattern: re.Pattern[str]) -> list[str]:
        """Every worker's log lines that ``pattern`` matches, each after its log's name."""
        return [
            f"{log.stem}: {line}"
            for log in sorted(self.tmp.glob("*.log"))
            for line in log.read_text(errors="replace").splitlines()
            if pattern.search(line)
        ]

    def report(self, lines: int = 60) -> str:
        """For a failure message: each worker started (running or not), its exit code, last
        state, and the end of its log file (which the test's ``tmp_path`` keeps)."""
        out = []
        for name in sorted(self.started):
            proc = self.procs.get(name)
            code = "stopped by the test" if proc is None else proc.proc.poll()
            code = "running" if code is None else code
            state = proc.lines[-1] if proc is not None and proc.lines else None
            log = self.tmp / f"{name}.log"
            tail = log.read_text(errors="replace").splitlines()[-lines:] if log.exists() else []
            out.append(f"--- {name}: exit code {code}, last line {state}, log {log}:")
            out.extend(tail)
        return "\n".join(out)

    def close(self) -> None:
        prepared = [proc for proc, _ in self.prepared.values()]
        for proc in [*self.procs.values(), *self.retired, *prepared]:
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


def tally(seen: dict[str, dict[str, Any]], expected: int) -> tuple[dict[str, list[int]], int]:
    """Of a table read with ``FaustCluster.seen`` after ``expected`` records per key (numbers
    ``0 .. expected-1``): per key the numbers missing (lost, or not processed yet) and any
    other numbers counted; and the records counted twice (at-least-once)."""
    want = set(range(expected))
    off, duplicates = {}, 0
    for key, entry in seen.items():
        numbers = set(entry["seqs"])
        duplicates += entry["records"] - len(numbers)
        if numbers != want:
            off[key] = sorted(want ^ numbers)
    return off, duplicates


def share_bounds(items: int, workers: int) -> tuple[int, int]:
    """Floor and ceiling of an equal share of ``items`` over ``workers``."""
    return items // workers, -(-items // workers)


def unbalanced(state: dict[str, dict[str, Pairs]], kind: str, items: int) -> dict[str, int]:
    """Workers whose count of ``kind`` (``source``, ``side``) is outside the floor/ceiling of
    their equal share of ``items`` (every worker has capacity 1); empty when balanced."""
    low, high = share_bounds(items, len(state))
    counts = {name: len(s[kind]) for name, s in state.items()}
    return {name: n for name, n in counts.items() if not low <= n <= high}


class Feed:
    """Rounds of one record per key (sequence number = round) sent while the test runs."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        pause: float = 0.2,
        keys: Sequence[str] = tuple(KEYS),
        first: int = 0,
    ) -> None:
        """``first``: the first round's sequence number (rounds sent before the feed)."""
        self.bootstrap, self.topic, self.pause, self.keys = bootstrap, topic, pause, keys
        self.sent = first
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            asyncio.run(produce(self.bootstrap, self.topic, 1, self.keys, start=self.sent))
            self.sent += 1
            self._stop.wait(self.pause)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> int:
        """Stops after the round in flight; returns the rounds sent (``first`` included)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=TIMEOUT)
        return self.sent


async def produce(
    bootstrap: str,
    topic: str,
    rounds: int,
    keys: Sequence[str] = tuple(KEYS),
    start: int = 0,
) -> None:
    """``rounds`` records per key, valued with the key's sequence numbers ``start``,
    ``start + 1``, ... (JSON keys, as Faust's table routing expects)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        for seq in range(start, start + rounds):
            for key in keys:
                await producer.send(
                    topic, value=json.dumps(seq).encode(), key=json.dumps(key).encode()
                )
        await producer.flush()
    finally:
        await producer.stop()
