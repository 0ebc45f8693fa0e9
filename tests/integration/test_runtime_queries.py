"""Interactive queries on a real broker: runtime processes (``runtime_worker.py``, per key
count and sum in RocksDB, one standby) each serving queries on an endpoint (``QueryServer``).

Checked: every key is readable from every process, with the exact value, before, during and
after a rebalance (a third process joins, then the first leaves), retrying only on the
retryable 503; reads through a standby while records flow carry their lag and are flagged
stale exactly when it is not zero, and never exceed ``max_lag``; once the flow stops the
standbys answer exactly, not stale.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path

from aiokafka import AIOKafkaProducer

from streamassign.errors import QueryUnavailableError
from streamassign.runtime import QueryClient, QueryResult, key_partition

from .test_runtime import PARTITIONS, Runtime, runtime_fixture

KEYS = 120
TABLE = "totals"
DEADLINE = 30.0  # the longest one key may stay unreadable (a rebalance, a restore)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def expected(total: int) -> dict[bytes, bytes]:
    counts: dict[bytes, list[int]] = {}
    for i in range(total):
        c = counts.setdefault(b"q%d" % (i % KEYS), [0, 0])
        c[0] += 1
        c[1] += i % 100
    return {k: b"%d,%d" % (n, s) for k, (n, s) in counts.items()}


async def produce(
    bootstrap: str,
    topic: str,
    first: int,
    last: int,
    rate: float = 0,
    stop: asyncio.Event | None = None,
) -> int:
    """Records ``first .. last-1`` (key ``q<i % KEYS>``, value ``i % 100``), fewer if ``stop``
    is set meanwhile; ``rate``: records per second (0: at once). Returns the end produced."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    end = first
    try:
        chunk = max(1, int(rate / 20)) if rate else last - first
        for start in range(first, last, chunk):
            if stop is not None and stop.is_set():
                break
            end = min(start + chunk, last)
            futures = [
                await producer.send(topic, b"%d" % (i % 100), key=b"q%d" % (i % KEYS))
                for i in range(start, end)
            ]
            await asyncio.gather(*futures)
            if rate:
                await asyncio.sleep(chunk / rate)
    finally:
        await producer.stop()
    return end


class Readers:
    """Reads every key from every listed process, over and over, in a background thread,
    each read retried on retryable errors for at most DEADLINE s; checks each value."""

    def __init__(self, endpoints: list[str], want: dict[bytes, bytes]) -> None:
        self.endpoints = endpoints  # replaced as processes come and go
        self.want = want
        self.reads = self.retries = self.rounds = 0
        self.served: dict[tuple[str, str], int] = {}  # (asked, served_by) -> reads
        self.retry_codes: dict[str, int] = {}
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def __enter__(self) -> Readers:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(DEADLINE * 2)
        assert not self._thread.is_alive(), "readers did not finish"

    def wait_rounds(self, rounds: int) -> None:
        """Until ``rounds`` more complete rounds (every key from every process) are done."""
        target = self.rounds + rounds
        deadline = time.monotonic() + DEADLINE * 3
        while self.rounds < target and self.error is None:
            assert time.monotonic() < deadline, "reads stalled"
            time.sleep(0.1)
        assert self.error is None, self.error

    async def _run(self) -> None:
        try:
            while not self._stop.is_set():
                await asyncio.gather(*(self._round(e) for e in list(self.endpoints)))
                self.rounds += 1
        except BaseException as exc:
            self.error = exc

    async def _round(self, endpoint: str) -> None:
        async with QueryClient(endpoint, timeout=5.0) as client:
            for key, value in sorted(self.want.items()):
                result = await self._read(client, endpoint, key)
                assert result.value == value, (endpoint, key, result)
                assert result.role == "active" and not result.stale, result

    async def _read(self, client: QueryClient, endpoint: str, key: bytes) -> QueryResult:
        deadline = time.monotonic() + DEADLINE
        while True:
            try:
                result = await client.get(TABLE, key)
            except QueryUnavailableError as exc:
                self.retries += 1
                self.retry_codes[exc.code] = self.retry_codes.get(exc.code, 0) + 1
                assert time.monotonic() < deadline, f"{key!r} unreadable from {endpoint}: {exc}"
                await asyncio.sleep(exc.retry_after or 0.25)
                continue
            self.reads += 1
            pair = (endpoint, result.served_by)
            self.served[pair] = self.served.get(pair, 0) + 1
            return result


class QueryRuntime(Runtime):
    """Runtime processes, each serving queries on its own endpoint."""

    def __init__(self, bootstrap: str, app: str, source: str, tmp: Path) -> None:
        super().__init__(bootstrap, app, source, tmp)
        self.endpoints: dict[str, str] = {}

    def start(self, name: str, state: str | None = None) -> None:
        self.endpoints[name] = f"127.0.0.1:{free_port()}"
        base = self.args
        self.args = [*base, "--endpoint", self.endpoints[name]]
        try:
            super().start(name, state)
        finally:
            self.args = base

    def standbys(self, name: str) -> set[str]:
        status = self.events(name, "status")
        return set(status[-1]["standby"]) if status else set()


runtime = runtime_fixture(
    "queries", QueryRuntime, prefix="queries", args=["--status-interval", "0.2"]
)


def read_all(endpoint: str, keys: list[bytes], **options: object) -> list[QueryResult]:
    async def go() -> list[QueryResult]:
        async with QueryClient(endpoint) as client:
            return [await client.get(TABLE, k, retry_for=DEADLINE, **options) for k in keys]  # type: ignore[arg-type]

    return asyncio.run(go())


def wait_exact(endpoint: str, want: dict[bytes, bytes]) -> None:
    """Until ``endpoint`` answers every key with its expected value (processing done)."""
    deadline = time.monotonic() + 60
    while True:
        got = {r.key: r.value for r in read_all(endpoint, sorted(want))}
        if got == want:
            return
        assert time.monotonic() < deadline, "the application did not process every record"
        time.sleep(0.5)


def test_every_key_readable_from_every_process_during_and_after_rebalances(
    runtime: QueryRuntime,
) -> None:
    started = time.monotonic()
    total = 6000
    asyncio.run(produce(runtime.bootstrap, runtime.source, 0, total))
    want = expected(total)
    runtime.start_two()
    wait_exact(runtime.endpoints["p1"], want)
    ends = runtime.endpoints
    with Readers([ends["p1"], ends["p2"]], want) as readers:
        readers.wait_rounds(1)
        print(f"first round after {time.monotonic() - started:.1f} s")
        # Both processes answered keys of their own tasks and keys routed to the other one.
        assert {pair for pair in readers.served} == {
            (a, b) for a in (ends["p1"], ends["p2"]) for b in (ends["p1"], ends["p2"])
        }
        runtime.start("p3")  # a join: every task may move; reads go on from p1 and p2
        readers.endpoints = [ends["p1"], ends["p2"], ends["p3"]]
        state = runtime.settle()
        assert all(state.values()), state  # p3 got tasks
        readers.wait_rounds(2)
        readers.endpoints = [ends["p2"], ends["p3"]]
        readers.wait_rounds(1)  # no round asks p1 any more
        runtime.stop("p1")  # a leave: p1's tasks move to p2 and p3 (host maps lag behind)
        runtime.settle()
        readers.wait_rounds(2)
    print(
        f"reads {readers.reads}, retried {readers.retries} {readers.retry_codes}, "
        f"rounds {readers.rounds}, {time.monotonic() - started:.1f} s"
    )
    # After the rebalances: p2 and p3 each answer every key exactly, directly or routed.
    served = {
        r.served_by
        for e in (ends["p2"], ends["p3"])
        for r in read_all(e, sorted(want))
        if r.value == want[r.key]
    }
    assert served == {ends["p2"], ends["p3"]}


def test_standby_reads_carry_their_lag_and_are_flagged_stale(runtime: QueryRuntime) -> None:
    state = runtime.start_two()
    ends = runtime.endpoints
    # A key of every task, read through the process that holds its standby.
    keys = [b"q%d" % i for i in range(KEYS)]
    with_standby = {"p1": runtime.standbys("p1"), "p2": runtime.standbys("p2")}
    assert with_standby["p1"] == state["p2"] and with_standby["p2"] == state["p1"]

    async def flow_and_read() -> tuple[list[tuple[QueryResult, QueryResult]], int, int, int]:
        # Records flow (2,000/s) until the reads below have seen what they look for (on a
        # loaded machine a pass over the keys takes longer), at most 20 s.
        enough = asyncio.Event()
        flowing = asyncio.create_task(
            produce(runtime.bootstrap, runtime.source, 0, 40_000, 2000, enough)
        )
        pairs, refused, fresh = [], 0, 0
        async with QueryClient(ends["p1"]) as p1, QueryClient(ends["p2"]) as p2:
            while not flowing.done():
                for key in keys[:30]:
                    for client in (p1, p2):
                        try:
                            bounded = await client.get(TABLE, key, local=True, max_lag=0)
                            assert not bounded.stale, bounded  # an active's lag: uncommitted
                            if bounded.role == "standby":
                                fresh += 1
                                assert bounded.lag == 0, bounded
                        except QueryUnavailableError as exc:  # only a standby here, behind
                            assert exc.code in ("too_stale", "not_here"), exc
                            refused += exc.code == "too_stale"
                        try:
                            standby = await client.get(TABLE, key, local=True, max_lag=10**9)
                        except QueryUnavailableError:
                            continue  # the active is here, or the copy is moving
                        active = await client.get(TABLE, key, retry_for=DEADLINE)
                        pairs.append((standby, active))
                stale = sum(s.stale for s, _ in pairs)
                if stale >= 10 and refused >= 3:
                    enough.set()
            produced = await flowing
        return pairs, refused, fresh, produced

    pairs, refused, fresh, produced = asyncio.run(flow_and_read())
    standby_reads = [s for s, _ in pairs if s.role == "standby"]
    stale = [s for s in standby_reads if s.stale]
    print(
        f"{len(pairs)} local reads, {len(standby_reads)} by standbys, {len(stale)} stale "
        f"(lag up to {max((s.lag for s in stale), default=0)}); standbys under max_lag=0: "
        f"{refused} refused, {fresh} answered; {produced:,} records"
    )
    assert standby_reads and stale, "no stale standby read observed while records flowed"
    final = expected(produced)
    ahead = 0
    for standby, active in pairs:
        assert standby.stale == (standby.role == "standby" and standby.lag > 0), standby
        seen = int((standby.value or b"0,0").split(b",")[0])
        assert seen <= int(final[standby.key].split(b",")[0]), standby
        # No order holds between two copies: the active's local store takes a commit just
        # after its marker is acknowledged (in a thread), so a standby may read the marker
        # first and, for that moment, answer one commit ahead of the active.
        ahead = max(ahead, seen - int((active.value or b"0,0").split(b",")[0]))
    print(f"a standby answered at most {ahead} updates ahead of the active read after it")
    assert refused > 0  # a standby behind is refused under max_lag=0

    # Once the flow stops and is processed, every standby answers exactly and is not stale.
    want = final
    wait_exact(ends["p1"], want)
    deadline = time.monotonic() + DEADLINE
    for name, other in (("p1", "p2"), ("p2", "p1")):
        own = {k for k in keys if f"0_{key_partition(k, PARTITIONS)}" in state[other]}
        while True:
            results = read_all(ends[name], sorted(own), local=True, max_lag=10**9)
            if all(r.lag == 0 for r in results) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        for r in results:
            assert (r.role, r.served_by, r.lag, r.stale) == ("standby", ends[name], 0, False), r
            assert r.value == want[r.key]
