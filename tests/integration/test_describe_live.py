"""`streamassign describe` on live groups of each kind, checked against what the members observe.

A ProcessHost app, GroupAssignor consumers, and Faust apps with our assignor and with Faust's
own: once a group settles (the members' own reports agree), DescribeGroups decoded must show the
same processes, tasks and partitions, every task active exactly once. A scripted churn (a process
leaves, another joins) followed by ``describe --watch --json`` must explain exactly the moves
the members observed.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from streamassign import PartitionGrouper, TaskId, TopicPartition
from streamassign.aiokafka.describe import (
    Connection,
    Family,
    GroupView,
    _Admin,
    fetch_group,
    quality,
)
from streamassign.cli import main
from streamassign.versions import subtopology_fingerprints, topology_version

from .conftest import GroupIdFactory, TopicFactory, kafka_script
from .faust_cluster import FaustCluster
from .procs import ROOT
from .test_consumer_group import Group
from .test_streams import App, app_factory, join_app  # noqa: F401 - fixtures used by name

TIMEOUT = 30.0
WATCH = ("--watch", "--json", "--interval", "0.3")


def described(bootstrap: str, group: str, members: int) -> GroupView:
    """The group once DescribeGroups shows it stable with ``members`` assigned members."""
    deadline = time.monotonic() + TIMEOUT
    view = None
    while time.monotonic() < deadline:
        view = asyncio.run(fetch_group(Connection(bootstrap), group))
        if view.state == "Stable" and len(view.members) == members:
            return view
        time.sleep(0.25)
    raise AssertionError(f"{group} not stable with {members} members in {TIMEOUT}s: {view}")


def observed_processes(state: dict[str, dict[int, Any]]) -> dict[str, dict[str, set[str]]]:
    """Per process id, the active and standby tasks its consumers reported."""
    out: dict[str, dict[str, set[str]]] = {}
    for consumers in state.values():
        for line in consumers.values():
            entry = out.setdefault(line["process"], {"active": set(), "standby": set()})
            entry["active"] |= set(line["active"])
            entry["standby"] |= set(line["standby"])
    return out


def layout(view: GroupView) -> dict[str, dict[str, set[str]]]:
    return {
        pid: {
            "active": {str(t) for t in v.assignment.active},
            "standby": {str(t) for t in v.assignment.standby},
        }
        for pid, v in view.processes().items()
    }


def test_process_host_group_described(
    join_app: tuple[App, set[TaskId]],  # noqa: F811 - the imported fixture
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    app, tasks = join_app
    app.start("p1", 2)
    app.start("p2", 1)
    state = app.settle(tasks)
    view = described(kafka_bootstrap, app.topology.name, members=3)
    assert view.family == Family.STREAMS
    assert all(m.undecodable is None for m in view.members)
    assert layout(view) == observed_processes(state)
    assert {pid: v.capacity for pid, v in view.processes().items()} == {
        next(iter(state[n].values()))["process"]: app.threads[n] for n in state
    }
    # Each member's partitions are what one consumer of that process observed.
    assert Counter((m.process, tuple(m.partitions)) for m in view.members) == Counter(
        (line["process"], tuple(TopicPartition(*tp) for tp in line["partitions"]))
        for consumers in state.values()
        for line in consumers.values()
    )
    counts = {t: 12 for t in app.topology.source_topics}
    counts.update({t: 4 for t in app.topology.subtopologies[1].source_topics})
    assert view.tasks == PartitionGrouper().group(app.topology, counts)
    score = quality(view)
    assert score.problems == ()  # every task active once, its standby on the other process
    # The actives per subtopology and process it reports are the members' (whether they are
    # balanced is the assignor's business: see test_streams.py).
    observed = observed_processes(state).values()
    assert [(b.subtopology, b.fewest, b.most) for b in score.per_subtopology] == [
        (s, min(ns), max(ns))
        for s in (0, 1)
        for ns in [[sum(t.startswith(f"{s}_") for t in o["active"]) for o in observed]]
    ]
    assert all(m.versions == "sub v3/3 asg v3/3" and m.error == "NONE" for m in view.members)
    # One topology version, named as a leader's log line names it (test_describe_versions.py).
    version = topology_version(subtopology_fingerprints(app.topology))
    assert {m.topology_version for m in view.members} == {version}

    # The CLI: tables in 80 columns, and JSON that explain reads (nothing moved since).
    runner = CliRunner()
    tables = runner.invoke(main, ["describe", app.topology.name, "-b", kafka_bootstrap])
    assert tables.exit_code == 0, tables.output
    assert max(map(len, tables.output.splitlines())) <= 80
    saved = runner.invoke(main, ["describe", app.topology.name, "-b", kafka_bootstrap, "--json"])
    assert saved.exit_code == 0, saved.output
    (tmp_path / "now.json").write_text(saved.output)
    now = str(tmp_path / "now.json")
    moves = runner.invoke(main, ["explain", now, now, "--json"])
    assert json.loads(moves.output) == {"moves": [], "standby_moves": []}
    missing = runner.invoke(main, ["describe", "no-such-group", "-b", kafka_bootstrap])
    assert missing.exit_code == 1
    assert missing.output == "Error: group 'no-such-group' does not exist\n"
    for options in ((), ("--json",)):
        assert_watch_ends_with_its_reader(kafka_bootstrap, app.topology.name, options)


def assert_watch_ends_with_its_reader(bootstrap: str, group: str, options: tuple[str, ...]) -> None:
    """``describe --watch | grep -q Stable``: once the reader has what it wanted and is gone,
    the watch ends with status 0 although the group stays quiet (nothing more to print)."""
    watch_options = ("--watch", "--interval", "0.3", *options)
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamassign", "describe", group, "-b", bootstrap, *watch_options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    try:
        while "Stable" not in (line := proc.stdout.readline()):
            assert line, "the watch ended before it printed a stable group"
        proc.stdout.close()
        _, err = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
    assert (proc.returncode, err) == (0, "")


def watch(bootstrap: str, group: str) -> tuple[subprocess.Popen[str], queue.Queue[dict[str, Any]]]:
    """``streamassign describe GROUP --watch --json`` in a process; its lines in a queue."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamassign", "describe", group, "-b", bootstrap, *WATCH],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    lines: queue.Queue[dict[str, Any]] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            lines.put(json.loads(raw))

    threading.Thread(target=read, daemon=True).start()
    return proc, lines


def next_layout(lines: queue.Queue[dict[str, Any]], want: dict[str, Any]) -> dict[str, Any]:
    """The next stable line from ``--watch`` whose layout is ``want``; earlier lines must be
    rebalance states only (no other layout was observed in between)."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        if line["state"] != "Stable":
            continue
        got = {
            pid: {"active": set(a["active"]), "standby": set(a["standby"])}
            for pid, a in line["assignment"].items()
        }
        assert got == want, "watch saw a layout the members never settled on"
        return line
    raise AssertionError(f"watch printed no layout {want} within {TIMEOUT}s")


def owners(layout_: dict[str, dict[str, set[str]]]) -> dict[str, str]:
    return {t: pid for pid, a in layout_.items() for t in a["active"]}


def test_churn_explained_as_members_observed(
    join_app: tuple[App, set[TaskId]],  # noqa: F811 - the imported fixture
    kafka_bootstrap: str,
) -> None:
    app, tasks = join_app
    app.start("p1", 1)
    app.start("p2", 1)
    before = observed_processes(app.settle(tasks))
    proc, lines = watch(kafka_bootstrap, app.topology.name)
    try:
        next_layout(lines, before)
        gone = next(iter(app.latest()["p2"].values()))["process"]
        app.stop("p2")
        after = observed_processes(app.settle(tasks))
        line = next_layout(lines, after)
        old, new = owners(before), owners(after)
        expected = {(t, old[t], new[t]) for t in old if old[t] != new[t]}
        assert {(m["task"], m["from"], m["to"]) for m in line["moves"]} == expected
        assert {m["from"] for m in line["moves"]} == {gone}
        assert {m["reason"] for m in line["moves"]} == {"client gone"}

        app.start("p3", 1)
        joined = observed_processes(app.settle(tasks))
        line = next_layout(lines, joined)
        old, new = new, owners(joined)
        expected = {(t, old[t], new[t]) for t in old if old[t] != new[t]}
        assert expected, "the new process took over tasks"
        assert {(m["task"], m["from"], m["to"]) for m in line["moves"]} == expected
        assert {m["reason"] for m in line["moves"]} == {"balance quota"}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


def test_group_assignor_consumers_described(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory, kafka_group_id_factory: GroupIdFactory
) -> None:
    topics = [kafka_topic_factory(6), kafka_topic_factory(4)]
    name = kafka_group_id_factory("describe-sticky")
    group = Group(kafka_bootstrap, name, topics, "sticky")
    try:
        for k in range(3):
            group.start(f"m{k}")
        lines = group.settle(
            {(t, p) for t, n in zip(topics, (6, 4), strict=True) for p in range(n)}
        )
        view = described(kafka_bootstrap, name, members=3)
        assert view.family == Family.CONSUMER
        assert {m.member_id: [list(tp) for tp in m.partitions] for m in view.members} == {
            line["member"]: line["assigned"] for line in lines.values()
        }
        assert {m.generation for m in view.members} == {group.generation}
        by_task = {tp: t for t, tps in view.tasks.items() for tp in tps}
        assert len(by_task) == 10
        for m in view.members:  # each member's tasks are exactly its partitions
            assert {by_task[tp] for tp in m.partitions} == m.active
        score = quality(view)
        assert score.problems == () and score.metrics.active_balanced  # 4/3/3 of 10
    finally:
        group.close()


def test_unassigned_topics_are_looked_up_in_the_clusters_metadata(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory
) -> None:
    """describe looks up the topics no member is assigned a partition of (asked without
    creating any): one the cluster has, with its partition count, and a missing one left
    out, so that the problem line says missing rather than asks. (An aiokafka consumer
    subscribing to a topic that does not exist never settles, so no group is used.)"""
    topic = kafka_topic_factory(3)
    missing = f"{topic}-never-created"

    async def looked_up() -> tuple[dict[str, int] | None, frozenset[str]]:
        async with _Admin(Connection(kafka_bootstrap)) as admin:
            return await admin._partition_counts([topic, missing])

    # Both described (no ACLs here): none left undescribable.
    assert asyncio.run(looked_up()) == ({topic: 3}, frozenset())


@pytest.mark.parametrize(
    ("protocol", "line"),
    [
        (
            "SASL_PLAINTEXT",
            "the broker answered, but not as a SASL listener (is the port's listener PLAINTEXT? "
            "--security-protocol)",
        ),
        (
            "SSL",
            "the broker reset the connection (a port without TLS asked with SSL? "
            "--security-protocol; or the broker refusing more connections from this address)",
        ),
    ],
)
def test_another_protocol_than_the_listeners_is_named(
    kafka_bootstrap: str, protocol: str, line: str
) -> None:
    """The session broker's listener is PLAINTEXT: asked with SASL or TLS it answers, so the
    line points at --security-protocol, as docs/operations.md shows, not at the network."""
    credentials = ["--sasl-username", "u", "--sasl-password", "p"] if "SASL" in protocol else []
    args = ["describe", "g", "-b", kafka_bootstrap, "--security-protocol", protocol, *credentials]
    result = CliRunner().invoke(main, [*args, "--timeout", "10"], catch_exceptions=False)
    assert (result.exit_code, result.output) == (
        1,
        f"Error: cannot reach {kafka_bootstrap}: {line}\n",
    )


@pytest.mark.parametrize("assignor", ["ours", "faust"])
def test_faust_app_described(
    assignor: str,
    kafka_bootstrap: str,
    kafka_topic_factory: TopicFactory,
    kafka_group_id_factory: GroupIdFactory,
    tmp_path: Path,
) -> None:
    topic = kafka_topic_factory(4, prefix="faust-src")
    app = kafka_group_id_factory(f"faust-{assignor}")
    cluster = FaustCluster(kafka_bootstrap, app, topic, tmp_path, assignor=assignor, partitions=4)
    try:
        for name in ("w0", "w1"):
            cluster.start(name)
        cluster.settle(standbys=None)
        states = cluster.states()
        view = described(kafka_bootstrap, app, members=2)
        assert view.family == (Family.STREAMS if assignor == "ours" else Family.FAUST)
        assert all(m.undecodable is None for m in view.members)
        # A member reads its actives' partitions and its standbys' changelog partitions (Faust's
        # own assignor also lists standbys of source topics, which nobody reads).
        observed = Counter(
            frozenset(
                TopicPartition(t, p)
                for t, p in s["actives"] + s["standbys"]
                if [t, p] in s["actives"] or t == cluster.changelog
            )
            for s in states.values()
        )
        assert Counter(frozenset(m.partitions) for m in view.members) == observed
        sources = Counter(
            frozenset(tp for t in v.assignment.active for tp in view.tasks[t] if tp.topic == topic)
            for v in view.processes().values()
        )
        assert sources == Counter(
            frozenset(TopicPartition(t, p) for t, p in s["actives"] if t == topic)
            for s in states.values()
        )
        if assignor == "faust":  # Faust's worker URL is its process
            urls = {f"http://127.0.0.1:{port}" for port in cluster.ports.values()}
            assert set(view.processes()) == urls
        problems = quality(view).problems
        assert not [p for p in problems if "actives" in p or "subscribed topic" in p]
    finally:
        cluster.close()


def test_member_with_garbage_user_data_is_shown_undecodable(
    join_app: tuple[App, set[TaskId]],  # noqa: F811 - the imported fixture
    kafka_bootstrap: str,
) -> None:
    app, tasks = join_app
    app.start("p1", 1)
    app.start("bad", 1, "--garbage-user-data")
    state = app.settle(tasks)
    view = described(kafka_bootstrap, app.topology.name, members=2)
    bad = next(iter(state["bad"].values()))
    (broken,) = [m for m in view.members if m.undecodable is not None]
    assert broken.undecodable is not None and broken.undecodable.startswith("subscription: ")
    good = observed_processes({"p1": state["p1"]})
    shown = layout(view)
    # The leader reads such a member as a process of its own, keyed by its member id, and
    # gives it tasks: describe shows them there, as the member reports them.
    assert shown.pop(broken.member_id) == observed_processes({"bad": state["bad"]})[bad["process"]]
    assert shown == good  # the readable process as it reports itself
    assert bad["process"] not in view.processes()
    result = CliRunner().invoke(main, ["describe", app.topology.name, "-b", kafka_bootstrap])
    assert result.exit_code == 0
    assert "undecodable: subscription: " in " ".join(result.output.split())  # lines wrap


def test_group_on_the_new_consumer_protocol_is_named_not_missing(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory, kafka_group_id_factory: GroupIdFactory
) -> None:
    """Kafka 4 answers DescribeGroups for a KIP-848 group with state Dead, as for no group at
    all; describe must say what it is (ListGroups lists it), not that it does not exist."""
    script = kafka_script()
    try:
        java, classpath = script.find_java(), script.install(log=lambda _: None).classpath
    except script.KafkaScriptError as exc:  # an external broker on a machine without Kafka
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no Java consumer: {exc}")
    topic, group = kafka_topic_factory(2), kafka_group_id_factory("new-protocol")
    source = Path(__file__).parent / "NewProtocolConsumer.java"
    proc = subprocess.Popen(
        [java, "-cp", classpath, str(source), kafka_bootstrap, group, topic],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    try:
        # Blocking reads are bounded: the consumer prints after every 300 ms poll.
        while "-0" not in (line := proc.stdout.readline()):  # a partition is assigned
            assert line, "the Java consumer ended"
        result = CliRunner().invoke(main, ["describe", group, "-b", kafka_bootstrap])
    finally:
        proc.kill()
        proc.wait()
    assert result.exit_code == 1
    assert result.output == (
        f"Error: group {group!r} uses the new consumer protocol (KIP-848), not the classic "
        "protocol: describe reads classic groups only (kafka-consumer-groups.sh --describe "
        "reads this one)\n"
    )
