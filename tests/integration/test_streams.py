"""Streams task assignment on a real Kafka broker: ProcessHosts in separate OS processes.

A join topology (orders x customers, co-partitioned, with a store) plus a stateless
subtopology. Checks after every change, once the group settles: every task has exactly one
active; a task's co-partitioned partitions sit on the same consumer; actives are balanced in
proportion to thread counts; stateful tasks have their standby on another process.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions

from streamassign import PartitionGrouper, TaskId, TopicPartition, Topology
from streamassign.protocol import LATEST_VERSION
from streamassign.shares import share_bounds

from .conftest import GroupIdFactory, TopicFactory
from .procs import JsonLinesProcess

MEMBER = Path(__file__).with_name("streams_member.py")
SETTLE = 2.0
TIMEOUT = 60.0


class App:
    """The processes of one streams application."""

    def __init__(self, bootstrap: str, topology_file: Path, tmp: Path, standbys: int) -> None:
        self.bootstrap = bootstrap
        self.topology_file = topology_file
        self.topology = Topology.load(topology_file)
        self.tmp = tmp
        self.standbys = standbys
        self.procs: dict[str, JsonLinesProcess] = {}
        self.threads: dict[str, int] = {}
        self.generation = -1

    def start(self, name: str, threads: int = 2, *extra: str) -> JsonLinesProcess:
        proc = JsonLinesProcess(
            MEMBER,
            [
                "--bootstrap", self.bootstrap,
                "--topology", str(self.topology_file),
                "--state-dir", str(self.tmp / name),
                "--threads", str(threads),
                "--standbys", str(self.standbys),
                "--endpoint", f"{name}:8080",
                *extra,
            ],
            log=self.tmp / f"{name}.err",  # its logs, for tests that read them
        )  # fmt: skip
        self.procs[name], self.threads[name] = proc, threads
        return proc

    def stop(self, name: str, sig: int = signal.SIGTERM) -> None:
        self.procs.pop(name).stop(sig)
        del self.threads[name]

    def latest(self) -> dict[str, dict[int, dict[str, Any]]]:
        """Per process, per consumer, the last line printed."""
        out: dict[str, dict[int, dict[str, Any]]] = {}
        for name, proc in self.procs.items():
            proc.drain()
            for line in proc.lines:
                out.setdefault(name, {})[line["consumer"]] = line
        return out

    def settle(self, tasks: set[TaskId], error: str = "NONE") -> dict[str, dict[int, Any]]:
        """Wait for one new generation seen by every consumer of every process, quiet, and
        (without an expected error) with every task active exactly once."""
        deadline = time.monotonic() + TIMEOUT
        state: dict[str, dict[int, Any]] = {}
        while time.monotonic() < deadline:
            time.sleep(0.25)
            state = self.latest()
            lines = [line for cs in state.values() for line in cs.values()]
            if len(lines) != sum(self.threads.values()) or any(
                len(state.get(n, {})) != t for n, t in self.threads.items()
            ):
                continue
            generations = {line["generation"] for line in lines}
            errors = {line["error"] for line in lines}
            actives = sorted(t for line in lines for t in line["active"])
            quiet = all(p.quiet_for() > SETTLE for p in self.procs.values())
            complete = error != "NONE" or actives == sorted(map(str, tasks))
            newer = len(generations) == 1 and min(generations) > self.generation
            if newer and quiet and errors == {error} and complete:
                self.generation = generations.pop()
                return state
        raise AssertionError(f"no settled generation within {TIMEOUT}s: {state}")

    def close(self) -> None:
        for proc in self.procs.values():
            proc.stop(signal.SIGKILL)


def write_topology(path: Path, app: str, orders: str, customers: str, returns: str) -> Path:
    path.write_text(
        f"""
name = "{app}"
copartition_groups = [["{orders}", "{customers}"]]

[[subtopology]]
id = 0
source_topics = ["{orders}", "{customers}"]
stores = ["customers-table"]

[[subtopology]]
id = 1
source_topics = ["{returns}"]
"""
    )
    return path


@pytest.fixture
def app_factory(kafka_bootstrap: str, tmp_path: Path) -> Iterator[Any]:
    apps: list[App] = []

    def make(topology_file: Path, standbys: int = 1) -> App:
        app = App(kafka_bootstrap, topology_file, tmp_path, standbys)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close()


@pytest.fixture
def join_app(
    app_factory: Any,
    kafka_topic_factory: TopicFactory,
    kafka_group_id_factory: GroupIdFactory,
    tmp_path: Path,
) -> tuple[App, set[TaskId]]:
    orders, customers, returns = (
        kafka_topic_factory(12, prefix="orders"),
        kafka_topic_factory(12, prefix="customers"),
        kafka_topic_factory(4, prefix="returns"),
    )
    name = kafka_group_id_factory("join")
    app = app_factory(write_topology(tmp_path / "t.toml", name, orders, customers, returns))
    tasks = set(PartitionGrouper().group(app.topology, {orders: 12, customers: 12, returns: 4}))
    return app, tasks


def check(app: App, state: dict[str, dict[int, Any]]) -> None:
    """Co-partitioning per consumer, thread-proportional balance, standbys elsewhere."""
    topology = app.topology
    tasks = PartitionGrouper().group(
        topology, {t: n for t, n in _counts(state).items() if t in topology.source_topics}
    )
    active_of: dict[str, str] = {}
    for name, consumers in state.items():
        for line in consumers.values():
            expected = sorted(
                [tp.topic, tp.partition] for t in line["active"] for tp in tasks[TaskId.parse(t)]
            )
            assert line["partitions"] == expected, "a task's partitions sit on its consumer"
            for t in line["active"]:
                active_of[t] = name
    names = sorted(state)
    counts = {n: sum(len(line["active"]) for line in state[n].values()) for n in names}
    bounds = share_bounds(len(tasks), [app.threads[n] for n in names])
    for n, (lo, hi) in zip(names, bounds, strict=True):
        assert lo <= counts[n] <= hi, (n, counts, bounds)
    if app.standbys and len(names) > 1:
        for name, consumers in state.items():
            for line in consumers.values():
                for t in line["standby"]:
                    assert active_of[t] != name, f"standby of {t} beside its active"
        stateful = {str(t) for t in tasks if t.subtopology in topology.stateful_subtopologies}
        standbys = sorted(
            t for cs in state.values() for line in cs.values() for t in line["standby"]
        )
        assert standbys == sorted(stateful)


def _counts(state: dict[str, dict[int, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for consumers in state.values():
        for line in consumers.values():
            for topic, p in line["partitions"]:
                counts[topic] = max(counts.get(topic, 0), p + 1)
    return counts


def actives(state: dict[str, dict[int, Any]], name: str) -> set[str]:
    return {t for line in state[name].values() for t in line["active"]}


def standbys(state: dict[str, dict[int, Any]], name: str) -> set[str]:
    return {t for line in state[name].values() for t in line["standby"]}


def stateful(tasks: set[str]) -> set[str]:
    """Tasks with a store (subtopology 0): local state makes them sticky across restarts."""
    return {t for t in tasks if t.startswith("0_")}


def test_three_processes_two_consumers_each(join_app: tuple[App, set[TaskId]]) -> None:
    app, tasks = join_app
    for name in ("p1", "p2", "p3"):
        app.start(name, 2)
    state = app.settle(tasks)
    check(app, state)
    # Host maps: every process knows who runs what (interactive queries).
    hosts = next(iter(state["p1"].values()))["hosts"]
    assert {h: set(ts) for h, ts in hosts.items()} == {
        f"{n}:8080": actives(state, n) for n in ("p1", "p2", "p3")
    }


def test_capacity_proportional_to_threads(join_app: tuple[App, set[TaskId]]) -> None:
    app, tasks = join_app
    for name, threads in (("p1", 1), ("p2", 2), ("p3", 3)):
        app.start(name, threads)
    state = app.settle(tasks)
    check(app, state)  # 16 tasks over 1+2+3 threads: floors 2, 5, 8 and one ceiling
    assert [len(actives(state, n)) for n in ("p1", "p2", "p3")] in ([3, 5, 8], [2, 6, 8])


def test_scale_out_scale_in_crash_and_rolling_restart(join_app: tuple[App, set[TaskId]]) -> None:
    app, tasks = join_app
    app.start("p1", 2)
    app.start("p2", 2)
    before = app.settle(tasks)
    check(app, before)

    app.start("p3", 2)  # scale out: only what balance needs moves
    state = app.settle(tasks)
    check(app, state)
    for n in ("p1", "p2"):
        assert actives(state, n) <= actives(before, n)

    app.start("p4", 2)
    check(app, app.settle(tasks))
    app.stop("p4")  # scale in
    check(app, app.settle(tasks))
    app.stop("p3", signal.SIGKILL)  # crash
    state = app.settle(tasks)
    check(app, state)

    app.start("p3", 2)  # back, with its state directory: it reports local state
    state = app.settle(tasks)
    check(app, state)
    for name in ("p1", "p2", "p3"):  # rolling restart: each comes back warm
        held = stateful(actives(state, name))
        warm = held | standbys(state, name)  # state it keeps on disk across the restart
        app.stop(name)
        check(app, app.settle(tasks))
        app.start(name, 2)
        state = app.settle(tasks)
        check(app, state)
        # As many stateful tasks as it ran, each on state it had: its own tasks back, or, where
        # one of them was written meanwhile (its checkpoint lags the runner's, which then keeps
        # the claim), one it kept a standby of (standby holders rank first, docs/assignor.md).
        back = stateful(actives(state, name))
        assert len(back) == len(held), f"{name} ran {sorted(held)}, now {sorted(back)}"
        assert back <= warm, f"{name} restores {sorted(back - warm)} cold (it kept {sorted(warm)})"


def test_garbage_member_and_two_protocol_versions(join_app: tuple[App, set[TaskId]]) -> None:
    app, tasks = join_app
    app.start("old", 2, "--max-version", "1")
    app.start("new", 2)
    state = app.settle(tasks)
    check(app, state)
    assert {line["common"] for cs in state.values() for line in cs.values()} == {1}
    assert {line["version"] for line in state["new"].values()} == {1}  # followed the leader down

    app.start("garbage", 1, "--garbage-user-data")  # unreadable: a process with no history
    state = app.settle(tasks)
    check(app, state)

    app.stop("garbage")
    app.stop("old")  # the rolling upgrade: the old process comes back on the new version
    app.settle(tasks)
    app.start("old", 2)
    state = app.settle(tasks)
    for _ in range(3):  # the upgrade takes one more rebalance, asked for by the members
        if {line["common"] for cs in state.values() for line in cs.values()} == {LATEST_VERSION}:
            break
        state = app.settle(tasks)
    check(app, state)
    assert {line["common"] for cs in state.values() for line in cs.values()} == {LATEST_VERSION}


def test_hostile_members_cost_the_leader_nothing(join_app: tuple[App, set[TaskId]]) -> None:
    """4 consumers whose 37-byte subscriptions claim 2**20 previous actives each: before the
    leader's claim bounds its assign ran for tens of seconds, past every session timeout, and
    the group never settled (issue 25). Now they are one process without history."""
    app, tasks = join_app
    app.start("a", 2)
    app.start("b", 2)
    clean = app.settle(tasks)
    check(app, clean)
    app.start("hostile", 4, "--hostile-user-data")
    state = app.settle(tasks)
    check(app, state)
    assert actives(state, "hostile")  # a member of the group, with its share
    led = [line["assign_ms"] for cs in state.values() for line in cs.values()]
    assert max(ms for ms in led if ms is not None) < TIMEOUT * 1000 / 10


def test_copartition_mismatch_reported_then_recovered(
    app_factory: Any,
    kafka_bootstrap: str,
    kafka_topic_factory: TopicFactory,
    kafka_group_id_factory: GroupIdFactory,
    tmp_path: Path,
) -> None:
    orders = kafka_topic_factory(8, prefix="orders")  # should be 12, like customers
    customers = kafka_topic_factory(12, prefix="customers")
    returns = kafka_topic_factory(4, prefix="returns")
    name = kafka_group_id_factory("mismatch")
    app = app_factory(write_topology(tmp_path / "t.toml", name, orders, customers, returns))
    app.start("p1", 2)
    app.start("p2", 1)
    app.settle(set(), error="INCOMPLETE_SOURCE_TOPIC_METADATA")  # every member told, none died

    async def fix() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            await admin.create_partitions({orders: NewPartitions(total_count=12)})
        finally:
            await admin.close()

    asyncio.run(fix())
    tasks = set(PartitionGrouper().group(app.topology, {orders: 12, customers: 12, returns: 4}))
    state = app.settle(tasks)
    check(app, state)
    assert TopicPartition(orders, 11) in {
        TopicPartition(t, p) for cs in state.values() for line in cs.values()
        for t, p in line["partitions"]
    }  # fmt: skip


def test_missing_source_topic_reported_then_recovered(
    app_factory: Any,
    kafka_topic_factory: TopicFactory,
    kafka_group_id_factory: GroupIdFactory,
    tmp_path: Path,
) -> None:
    """A source topic that does not exist yet: the group forms, every member is told
    INCOMPLETE_SOURCE_TOPIC_METADATA, the leader names the topic, each consumer says so once,
    and aiokafka's 'not found' lines stay few (its start() used to re-fetch every 100 ms, ~10
    lines/s per consumer, and never join). Once the topic exists the group gets every task
    without a restart. Metadata age is aiokafka's default (5 min): recovery is the members'
    doing, not a periodic metadata refresh."""
    clicks = kafka_topic_factory(4, prefix="clicks")
    missing = kafka_group_id_factory("missing")  # a unique topic name, created later
    topology = tmp_path / "t.toml"
    topology.write_text(
        f"""
name = "{kafka_group_id_factory("missing-topic")}"
[[subtopology]]
id = 0
source_topics = ["{clicks}"]
stores = ["s"]
[[subtopology]]
id = 1
source_topics = ["{missing}"]
"""
    )
    app = app_factory(topology)
    started = time.monotonic()
    for name, threads in (("p1", 2), ("p2", 1)):
        app.start(name, threads, "--metadata-max-age-ms", "300000")
    app.settle(set(), error="INCOMPLETE_SOURCE_TOPIC_METADATA")
    waited = time.monotonic() - started
    logs = "".join((tmp_path / f"{name}.err").read_text() for name in ("p1", "p2"))
    assert f"missing source topics (no partition count known): {missing}; every member" in logs
    told = [line for line in logs.splitlines() if "leader sent INCOMPLETE_SOURCE" in line]
    assert len(told) == 3, told  # once per consumer, not once per retry
    assert all(f"source topics missing here too: {missing}" in line for line in told), told
    misses = logs.count(f"Topic {missing} not found in cluster metadata")
    # Per consumer: a re-fetch at the subscription and at each retry's join (backoff 1, 2, 4 ...
    # 30 s), and the watch's (pauses 0.5, 1, 2 ... 10 s): a dozen early, then ~0.13/s.
    assert misses <= 3 * (12 + waited / 4), (misses, waited)  # 3 consumers

    kafka_topic_factory(3, name=missing)
    created = time.monotonic()
    tasks = set(PartitionGrouper().group(app.topology, {clicks: 4, missing: 3}))
    state = app.settle(tasks)
    recovered = time.monotonic() - created - SETTLE  # settle waits SETTLE s of quiet
    check(app, state)
    assert recovered < 40, recovered  # a metadata watch pause (<= 10 s) and a rebalance
    print(f"error state after {waited:.1f} s, {misses} misses; recovered in {recovered:.1f} s")


def test_a_process_of_another_topology_version_runs_the_ids_it_shares_with_the_leader(
    app_factory: Any,
    kafka_topic_factory: TopicFactory,
    kafka_group_id_factory: GroupIdFactory,
    tmp_path: Path,
) -> None:
    """A rolling deploy that reused subtopology id 1 (v1 ``0 [a]``, ``1 [b]``; v2 ``0 [a]``,
    ``1 [n]``, ``2 [b]``): the v1 leader gives the v2 process tasks of id 0 only (the same
    topics in both versions), every 1_x stays on the v1 process, one WARNING naming the v2
    process; the v2 process refuses nothing, so it logs no ERROR. Before, the v2 process ran
    the leader's 1_x as its own ``1 [n]`` and rewound every record of b in a loop (the audit:
    19,003 warnings in 24 s); then it got no task at all, 0_x included."""
    a, b, n = (kafka_topic_factory(2, prefix=p) for p in ("a", "b", "n"))
    name = kafka_group_id_factory("versions")
    v1, v2 = tmp_path / "v1.toml", tmp_path / "v2.toml"
    subs = {"v1": [(0, a), (1, b)], "v2": [(0, a), (1, n), (2, b)]}
    for path, version in ((v1, "v1"), (v2, "v2")):
        path.write_text(
            f'name = "{name}"\n'
            + "".join(
                f'[[subtopology]]\nid = {s}\nsource_topics = ["{t}"]\nstores = ["s{s}"]\n'
                for s, t in subs[version]
            )
        )
    app = app_factory(v1, standbys=0)
    tasks = set(PartitionGrouper().group(app.topology, {a: 2, b: 2}))
    app.start("old", 1)
    app.settle(tasks)
    app.start("new", 1, "--topology", str(v2))  # the last --topology counts
    state = app.settle(tasks)  # every v1 task once
    new = state["new"][0]
    assert new["active"] and all(t.startswith("0_") for t in new["active"]), new
    assert {tp[0] for tp in new["partitions"]} == {a}, new
    new_log, old_log = ((tmp_path / f"{p}.err").read_text() for p in ("new", "old"))
    assert "runs another topology version" not in new_log, new_log
    warned = [line for line in old_log.splitlines() if "another topology version" in line]
    assert len(warned) == 1, old_log
