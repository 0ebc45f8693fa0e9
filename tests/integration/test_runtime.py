"""The runtime on a real Kafka broker: runtime processes in separate OS processes.

The application (``runtime_worker.py``) sums values per key into a RocksDB-backed store with
one standby, so the exact final table is computable from what was produced. Checked here:
``kill -9`` while 100k records flow loses nothing and counts nothing twice, the standby takes
over restoring far fewer records than a cold restore (both measured), a rolling restart gives
every process its tasks back without full restores, a requested shutdown stops every
process, and the state of tasks a process no longer holds is deleted after the cleanup delay.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from streamassign import Subtopology, TopicPartition, Topology
from streamassign.errors import MissingTopicsError
from streamassign.runtime import InternalTopicError, MemoryStore, StoreState, ensure_internal_topics

from .conftest import GroupIdFactory, TopicFactory
from .procs import JsonLinesProcess

WORKER = Path(__file__).with_name("runtime_worker.py")
PARTITIONS = 6
TASKS = {f"0_{p}" for p in range(PARTITIONS)}
SETTLE = 2.0
TIMEOUT = 90.0


def key_of(i: int) -> str:
    return f"k{i % 997}"


def expected_table(total: int) -> dict[str, str]:
    counts: dict[str, list[int]] = {}
    for i in range(total):
        c = counts.setdefault(key_of(i), [0, 0])
        c[0] += 1
        c[1] += i % 100
    return {k: f"{n},{s}" for k, (n, s) in counts.items()}


class Feeder(threading.Thread):
    """Produces records ``first .. total-1`` in chunks (key ``key_of(i)``, value ``i % 100``)."""

    def __init__(
        self, bootstrap: str, topic: str, total: int, chunk: int, pause: float, first: int = 0
    ) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.total, self.chunk, self.pause, self.first = total, chunk, pause, first
        self.acked = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._produce())
        except BaseException as exc:
            self.error = exc

    async def _produce(self) -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, linger_ms=20, max_batch_size=256 * 1024
        )
        await producer.start()
        try:
            for start in range(self.first, self.total, self.chunk):
                futures = [
                    await producer.send(self.topic, str(i % 100).encode(), key=key_of(i).encode())
                    for i in range(start, min(start + self.chunk, self.total))
                ]
                await asyncio.gather(*futures)
                self.acked = min(start + self.chunk, self.total)
                await asyncio.sleep(self.pause)
        finally:
            await producer.stop()

    def finish(self) -> None:
        self.join(TIMEOUT)
        assert self.error is None, f"producing to {self.topic} failed: {self.error!r}"
        assert self.acked == self.total, (
            f"{self.acked} of {self.total} records acked within {TIMEOUT:g} s of finish()"
        )


class Runtime:
    """The processes of one runtime application."""

    def __init__(self, bootstrap: str, app: str, source: str, tmp: Path) -> None:
        self.bootstrap, self.app, self.source, self.tmp = bootstrap, app, source, tmp
        self.procs: dict[str, JsonLinesProcess] = {}
        #: More worker options, for every process started from now on.
        self.args: list[str] = []

    def start(self, name: str, state: str | None = None) -> None:
        self.procs[name] = JsonLinesProcess(
            WORKER,
            [
                "--bootstrap", self.bootstrap,
                "--app", self.app,
                "--source", self.source,
                "--state-dir", str(self.tmp / (state or name)),
                *self.args,
            ],
            log=self.tmp / f"{name}.log",
        )  # fmt: skip

    def start_two(self) -> dict[str, set[str]]:
        """Start ``p1`` and ``p2``; returns the tasks each runs once settled."""
        self.start("p1")
        self.start("p2")
        return self.settle()

    def events(self, name: str, kind: str) -> list[dict[str, Any]]:
        proc = self.procs[name]
        proc.drain()
        return [line for line in proc.lines if line["event"] == kind]

    def actives(self, name: str) -> set[str]:
        status = self.events(name, "status")
        return set(status[-1]["active"]) if status else set()

    def joined(self, name: str) -> bool:
        """Whether process ``name`` has had an assignment (its tasks are known)."""
        status = self.events(name, "status")
        return bool(status) and status[-1]["rebalances"] > 0

    def settle(self) -> dict[str, set[str]]:
        """Wait until the live processes, each after its first assignment, run every task
        exactly once, unchanged for SETTLE s."""
        deadline = time.monotonic() + TIMEOUT
        stable_since, last = time.monotonic(), None
        while time.monotonic() < deadline:
            time.sleep(0.25)
            state = {n: self.actives(n) for n in self.procs}
            ran = sorted(t for ts in state.values() for t in ts)
            joined = all(self.joined(n) for n in self.procs)
            if ran != sorted(TASKS) or state != last or not joined:
                stable_since, last = time.monotonic(), state
            elif time.monotonic() - stable_since >= SETTLE:
                return state
        raise AssertionError(f"no settled assignment within {TIMEOUT}s: {last}")

    def stop(self, name: str, sig: int = signal.SIGTERM) -> JsonLinesProcess:
        proc = self.procs.pop(name)
        proc.stop(sig)
        proc.drain()
        return proc

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.proc.poll() is None:  # a frozen one (SIGSTOP) is continued first
                proc.proc.send_signal(signal.SIGCONT)
            proc.stop(signal.SIGKILL)


def tables(proc: JsonLinesProcess) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in proc.lines:
        if line["event"] == "table":
            out.update(line["items"])
    return out


async def _group_lag(bootstrap: str, group: str, topic: str) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await admin.start()
    await consumer.start()
    try:
        committed = await admin.list_consumer_group_offsets(group)
        tps = [KafkaTopicPartition(topic, p) for p in range(PARTITIONS)]
        ends = await consumer.end_offsets(tps)
        return sum(ends[tp] - (committed[tp].offset if tp in committed else 0) for tp in tps)
    finally:
        await consumer.stop()
        await admin.close()


def wait_caught_up(bootstrap: str, group: str, topic: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    lag = -1
    while time.monotonic() < deadline:
        lag = asyncio.run(_group_lag(bootstrap, group, topic))
        if lag == 0:
            return
        time.sleep(0.5)
    raise AssertionError(f"the application did not catch up within {TIMEOUT}s (lag {lag})")


def busiest(tasks: dict[str, set[str]]) -> tuple[str, str]:
    """Of two processes, the one running the most tasks (a kill's victim), then the other."""
    victim = max(sorted(tasks), key=lambda n: len(tasks[n]))
    return victim, next(n for n in tasks if n != victim)


async def topic_ends(
    bootstrap: str, topic: str, isolation_level: str = "read_uncommitted"
) -> dict[int, int]:
    """Each partition's end offset as ``isolation_level`` sees it: the high watermark
    (``read_uncommitted``) or the last stable offset (``read_committed``: the first offset
    of the oldest open transaction, if any)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation_level)
    await consumer.start()
    try:
        tps = [KafkaTopicPartition(topic, p) for p in range(PARTITIONS)]
        return {tp.partition: end for tp, end in (await consumer.end_offsets(tps)).items()}
    finally:
        await consumer.stop()


class TopicEnds:
    """``topic_ends`` looked at again and again through one consumer (a wait loop would
    otherwise start a consumer for every poll); a context manager."""

    def __init__(self, bootstrap: str, topic: str, isolation_level: str = "read_uncommitted"):
        self._runner = asyncio.Runner()
        self._tps = [KafkaTopicPartition(topic, p) for p in range(PARTITIONS)]

        async def started() -> AIOKafkaConsumer:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=bootstrap, isolation_level=isolation_level
            )
            await consumer.start()
            return consumer

        self._consumer = self._runner.run(started())

    def look(self) -> dict[int, int]:
        ends = self._runner.run(self._consumer.end_offsets(self._tps))
        return {tp.partition: end for tp, end in ends.items()}

    def __enter__(self) -> TopicEnds:
        return self

    def __exit__(self, *_: object) -> None:
        try:
            self._runner.run(self._consumer.stop())
        finally:
            self._runner.close()


async def _read_records(
    bootstrap: str,
    topic: str,
    take: Callable[[KafkaTopicPartition, ConsumerRecord[bytes, bytes]], None],
    isolation_level: str = "read_uncommitted",
    partitions: int = PARTITIONS,
) -> dict[int, int]:
    """Hand every record of ``topic`` (its ``partitions``) up to its end, as
    ``isolation_level`` sees it, to ``take``, within ``TIMEOUT`` s; returns each
    partition's end offset."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", isolation_level=isolation_level
    )
    await consumer.start()
    try:
        tps = [KafkaTopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        todo = {tp for tp in tps if ends[tp] > 0}
        deadline = time.monotonic() + TIMEOUT
        while todo:
            assert time.monotonic() < deadline, f"{topic} not read to its end in {TIMEOUT:g} s"
            for tp, records in (await consumer.getmany(*todo, timeout_ms=500)).items():
                for r in records:
                    take(tp, r)
            todo = {tp for tp in todo if await consumer.position(tp) < ends[tp]}
        return {tp.partition: ends[tp] for tp in tps}
    finally:
        await consumer.stop()


async def _read_changelog(
    bootstrap: str, topic: str, isolation_level: str = "read_uncommitted"
) -> tuple[dict[str, str], dict[int, int]]:
    """The table a cold restore of every partition gives, and each partition's end offset."""
    states = {
        p: StoreState.open("totals", TopicPartition(topic, p), MemoryStore())
        for p in range(PARTITIONS)
    }

    def restore(tp: KafkaTopicPartition, r: ConsumerRecord[bytes, bytes]) -> None:
        states[tp.partition].restore(r.offset, r.key, r.value)

    ends = await _read_records(bootstrap, topic, restore, isolation_level)
    table = {k.decode(): v.decode() for s in states.values() for k, v in s.store.items()}
    return table, ends


async def _read_topic(
    bootstrap: str, topic: str, isolation_level: str, partitions: int = PARTITIONS
) -> list[bytes]:
    """Every value of ``topic`` (its ``partitions``) up to its end as ``isolation_level``
    sees it."""
    values: list[bytes] = []
    await _read_records(
        bootstrap, topic, lambda _, r: values.append(r.value), isolation_level, partitions
    )
    return values


def runtime_fixture(
    group: str, make: type[Runtime] = Runtime, prefix: str = "events", args: Sequence[str] = ()
) -> Any:
    """A ``runtime`` fixture for a test module: a ``make`` of a new group named after
    ``group``, on a new source topic (``prefix``), its workers started with ``args``."""

    @pytest.fixture
    def runtime(
        kafka_bootstrap: str,
        kafka_topic_factory: TopicFactory,
        kafka_group_id_factory: GroupIdFactory,
        tmp_path: Path,
    ) -> Iterator[Runtime]:
        source = kafka_topic_factory(PARTITIONS, prefix=prefix)
        rt = make(kafka_bootstrap, kafka_group_id_factory(group), source, tmp_path)
        rt.args = list(args)
        yield rt
        rt.close()

    return runtime


runtime = runtime_fixture("runtime")


def test_kill9_while_records_flow_loses_nothing_and_standby_restores_little(
    runtime: Runtime,
) -> None:
    total = 100_000
    runtime.args = ["--status-interval", "0.1"]
    before = runtime.start_two()
    victim, survivor = busiest(before)
    feeder = Feeder(runtime.bootstrap, runtime.source, total, chunk=5000, pause=0.2)
    feeder.start()
    deadline = time.monotonic() + TIMEOUT

    def victim_processed() -> int:
        statuses = runtime.events(victim, "status")
        return statuses[-1]["processed"] if statuses else 0

    # The victim has committed work behind it (on a loaded machine the flow can run far ahead
    # of the processing), so the standby has something to have kept up with.
    while (feeder.acked < 30_000 or victim_processed() < 10_000) and time.monotonic() < deadline:
        time.sleep(0.05)
    # A crash in the middle of the flow, with uncommitted work: the victim stops committing
    # (SIGUSR2 turns its commits off), processes a little more, then dies.
    runtime.procs[victim].proc.send_signal(signal.SIGUSR2)
    changelog = f"{runtime.app}-totals-changelog"
    victims = {int(t.split("_")[1]) for t in before[victim]}
    while not runtime.events(victim, "holding"):
        assert time.monotonic() < deadline, "the victim did not stop committing"
        time.sleep(0.02)
    # Its last commit (and marker) is behind us; the kill must wait until writes it will never
    # commit reached its changelogs, or the crash path has nothing to undo (seen under load).
    with TopicEnds(runtime.bootstrap, changelog) as changelog_ends:
        committed_ends = changelog_ends.look()
        while time.monotonic() < deadline:
            ends = changelog_ends.look()
            if any(ends[p] > committed_ends[p] for p in victims):
                break
            time.sleep(0.05)
    runtime.stop(victim, signal.SIGKILL)
    state = runtime.settle()
    assert state[survivor] == TASKS
    feeder.finish()
    wait_caught_up(runtime.bootstrap, runtime.app, runtime.source)

    # The survivor took the victim's tasks over from its standbys: only the missing tail.
    takeovers = [
        e
        for e in runtime.events(survivor, "restore")
        if e["task"] in before[victim] and e["source"] == "standby"
    ]
    assert {e["task"] for e in takeovers} == before[victim]
    standby_restored = sum(e["records"] for e in takeovers)
    # What a cold restore would have read at that moment: the changelog up to its end then.
    at_takeover = sum(e["start"] + e["records"] for e in takeovers)
    # The crash path ran: the victim's uncommitted writes were undone (compensated).
    compensated = sum(e["compensated"] for e in takeovers)
    skipped = runtime.events(survivor, "status")[-1]["skipped"]
    assert compensated > 0, "the kill left nothing to recover: the crash path did not run"

    done = runtime.stop(survivor)
    assert tables(done) == expected_table(total)  # nothing lost, nothing counted twice
    changelog, ends = asyncio.run(
        _read_changelog(runtime.bootstrap, f"{runtime.app}-totals-changelog")
    )
    assert changelog == expected_table(total)  # and so is what any restore would rebuild

    # A cold restore of the same tasks, measured: a new process with an empty state directory.
    runtime.start("cold")
    runtime.settle()
    cold = {e["task"]: e for e in runtime.events("cold", "restore")}
    assert {e["source"] for e in cold.values()} == {"cold"}
    cold_restored = sum(cold[t]["records"] for t in before[victim])
    assert cold_restored == sum(ends[int(t.split("_")[1])] for t in before[victim])
    print(
        f"\nstandby takeover read {standby_restored} changelog records; a cold restore would "
        f"have read {at_takeover} then ({cold_restored} at the end); {compensated} writes "
        f"compensated, {skipped} records skipped"
    )
    # Warm: the standby had kept up with what the victim committed (at least half of the
    # changelog as it stood when commits stopped), so it read a tail, not the history. (Not
    # "half of everything at the takeover": under load the victim can write more uncommitted
    # records between the hold and the kill than it had committed.)
    committed_then = sum(committed_ends[p] for p in victims)
    assert at_takeover - standby_restored >= committed_then // 2, (
        f"standbys were at {at_takeover - standby_restored} of {committed_then} committed"
    )
    done = runtime.stop("cold")
    assert tables(done) == expected_table(total)


def test_rolling_restart_returns_tasks_without_full_restores(runtime: Runtime) -> None:
    total = 32_000
    for name in ("p1", "p2", "p3"):
        runtime.start(name)
    runtime.settle()
    # About 1,000 records/s, so the flow goes on through the restarts.
    feeder = Feeder(runtime.bootstrap, runtime.source, total, chunk=500, pause=0.5)
    feeder.start()
    deadline = time.monotonic() + TIMEOUT
    while feeder.acked < 3000 and time.monotonic() < deadline:
        time.sleep(0.05)  # every task has state before the first restart
    for name in ("p1", "p2", "p3"):
        held = runtime.settle()[name]
        runtime.stop(name)
        runtime.settle()
        runtime.start(name)  # a new process on the same state directory
        state = runtime.settle()
        assert state[name] == held, f"{name} did not get its tasks back after its restart"
        restores = runtime.events(name, "restore")
        assert {e["task"] for e in restores} >= held
        # From its local state: only what was written while it was away; or, after a second
        # rebalance in the new process (its session expired on a loaded machine), from the
        # state it held a moment before ("kept").
        for e in restores:
            not_full = e["source"] in ("local", "kept") and e["start"] > 0
            assert not_full, f"{name}: {e} is a full restore"
    feeder.finish()
    wait_caught_up(runtime.bootstrap, runtime.app, runtime.source)

    # A requested shutdown stops every process cleanly; the tables they hold are exact.
    runtime.procs["p1"].proc.send_signal(signal.SIGUSR1)
    merged: dict[str, str] = {}
    for name in ("p1", "p2", "p3"):
        proc = runtime.procs[name]
        assert proc.proc.wait(timeout=TIMEOUT) == 0
        proc.drain()
        assert proc.lines[-1] == {"event": "stopped", "failure": None}
        merged.update(tables(proc))
    runtime.procs.clear()
    assert merged == expected_table(total)


def task_dirs(runtime: Runtime, name: str) -> dict[str, int]:
    """The entries of process ``name``'s ``tasks/`` directory, with their inode numbers."""
    return {e.name: e.stat().st_ino for e in (runtime.tmp / name / "tasks").iterdir()}


def held(status: dict[str, Any]) -> set[str]:
    """Every task a process has stores of (active, restoring or standby), per its status."""
    return {*status["active"], *status["restoring"], *status["standby"]}


def test_state_of_tasks_that_moved_away_is_deleted_after_the_delay(runtime: Runtime) -> None:
    """A third process joins two that each hold every task (3 actives, 3 standbys): once the
    (short) cleanup delay has passed, each of the two has the directories of exactly the tasks
    it still holds (the others deleted, and gone from its offset sums; those it held
    throughout untouched),
    while records flow throughout and the tables stay exact."""
    total = 20_000
    runtime.args = ["--status-interval", "0.1", "--cleanup-ms", "1500"]
    runtime.start_two()
    feeder = Feeder(runtime.bootstrap, runtime.source, total, chunk=500, pause=0.2)
    feeder.start()
    deadline = time.monotonic() + TIMEOUT

    def status(name: str) -> dict[str, Any]:
        return runtime.events(name, "status")[-1]

    while any(held(status(n)) != TASKS for n in ("p1", "p2")):  # every standby open
        assert time.monotonic() < deadline, {n: status(n) for n in ("p1", "p2")}
        time.sleep(0.1)
    before = {n: task_dirs(runtime, n) for n in ("p1", "p2")}
    assert all(set(dirs) == TASKS for dirs in before.values())
    # Statuses (every 0.1 s) from the last one holding every task on.
    first = {n: len(runtime.events(n, "status")) - 1 for n in ("p1", "p2")}
    runtime.start("p3")
    runtime.settle()

    def cleaned(name: str) -> bool:
        """Its directories (none set aside) are those of the tasks it holds, fewer than all,
        and its offset sums report exactly those."""
        now, dirs = status(name), set(task_dirs(runtime, name))
        return dirs == held(now) == set(now["local"]) and dirs < TASKS

    for name in ("p1", "p2"):
        while not cleaned(name):
            assert time.monotonic() < deadline, (name, task_dirs(runtime, name), status(name))
            time.sleep(0.1)
        after = task_dirs(runtime, name)
        # Those it held at every status since: the very same directories (never renamed nor
        # recreated). Not every task it holds now: one dropped for over a delay and given
        # back (a standby moving, under load) rightly has a new directory.
        statuses = runtime.events(name, "status")[first[name] :]
        throughout = TASKS.intersection(*(held(s) for s in statuses))
        assert throughout <= set(after), (throughout, after)
        assert {t: after[t] for t in throughout} == {t: before[name][t] for t in throughout}
        assert all((runtime.tmp / name / "tasks" / t / "totals.rocksdb").is_dir() for t in after)
        logged = (runtime.tmp / f"{name}.log").read_text()
        for task in TASKS - set(after):
            assert f"task {task}: local state removed" in logged
    feeder.finish()
    wait_caught_up(runtime.bootstrap, runtime.app, runtime.source)
    merged: dict[str, str] = {}
    for name in ("p1", "p2", "p3"):
        merged.update(tables(runtime.stop(name)))
    assert merged == expected_table(total)  # nothing lost, nothing counted twice


def test_internal_topics_created_or_refused_with_a_typed_error(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory, kafka_group_id_factory: GroupIdFactory
) -> None:
    sentences = kafka_topic_factory(3, prefix="sentences")
    app = kafka_group_id_factory("internal")
    words = f"{app}-words"
    topology = Topology(
        [
            Subtopology(0, [sentences], sink_topics=[words]),
            Subtopology(1, [words], stores=["counts"]),
        ],
        repartition_topics={words: None},
        name=app,
    )
    counts = asyncio.run(ensure_internal_topics(topology, kafka_bootstrap))
    assert counts == {words: 3, f"{app}-counts-changelog": 3}

    async def partitions() -> dict[str, int]:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            return {
                t["topic"]: len(t["partitions"]) for t in await admin.describe_topics(list(counts))
            }
        finally:
            await admin.close()

    assert asyncio.run(partitions()) == counts
    assert asyncio.run(ensure_internal_topics(topology, kafka_bootstrap)) == counts  # idempotent

    grown = kafka_topic_factory(5, prefix="sentences")  # the same app reading a wider topic
    wider = Topology(
        [
            Subtopology(0, [grown], sink_topics=[words]),
            Subtopology(1, [words], stores=["counts"]),
        ],
        repartition_topics={words: None},
        name=app,
    )
    with pytest.raises(InternalTopicError, match="has 3, needs 5"):
        asyncio.run(ensure_internal_topics(wider, kafka_bootstrap))
    missing = Topology([Subtopology(0, [f"{app}-absent"])], name=app)
    with pytest.raises(MissingTopicsError):
        asyncio.run(ensure_internal_topics(missing, kafka_bootstrap))
