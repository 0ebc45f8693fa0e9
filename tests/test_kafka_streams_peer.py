"""Smoke test of the benchmark's Kafka Streams peer (benchmarks/_kafka_streams_peer.py and the
Maven driver in benchmarks/java/): a small input goes through Kafka Streams' own
StickyTaskAssignor and comes back as a valid assignment of ours.

Cost: about 2 s with the driver built (one JVM start); the first run builds it with Maven
(about 10 s with kafka-streams in the local Maven repository, longer when it must be
downloaded). Skipped when Java 17+ or Maven is missing outside CI (the peer is optional, the
benchmark marks it unavailable there too); in CI, which has both for the test broker, it fails.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from streamassign import ClientState, TaskId
from streamassign.metrics import violations

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from _kafka_streams_peer import JavaPeer, kafka_streams_assign, prepare


@pytest.fixture(scope="module")
def peer() -> JavaPeer:
    built = prepare("256m", lambda line: None)
    if isinstance(built, str):
        if os.environ.get("CI"):  # CI runs every test: a missing peer is a broken set-up
            pytest.fail(f"Kafka Streams peer unavailable: {built}")
        pytest.skip(f"Kafka Streams peer unavailable: {built}")
    return built


def test_kafka_streams_assignment_comes_back_valid_and_sticky(peer: JavaPeer) -> None:
    tasks = [TaskId(s, p) for s in range(2) for p in range(6)]
    stateless = {TaskId(1, 5)}
    clients = [
        ClientState("a", 1, prev_active={TaskId(0, 0), TaskId(0, 1)}, prev_standby={TaskId(1, 0)}),
        ClientState("b", 2, prev_active={TaskId(1, 0)}, lags={TaskId(1, 0): 0}),
        ClientState("new", 1),
    ]
    stateful = frozenset(tasks) - stateless

    run = kafka_streams_assign(
        peer, tasks, clients, replicas=1, repeats=1, budget=30.0, min_total=0.0, stateful=stateful
    )

    assert run.timed.error is None and run.timed.budget is None, run.timed
    assert run.validation == "NONE"
    assert run.first_run is not None and run.timed.seconds is not None
    got = run.timed.result
    assert got is not None and set(got) == {"a", "b", "new"}
    assert violations(tasks, clients, got, 1, stateful) == []
    assert not any(t in a.standby for a in got.values() for t in stateless)
    # Kafka Streams keeps a task with its previous owner while the owner has room.
    assert TaskId(1, 0) in got["b"].active
    assert {TaskId(0, 0), TaskId(0, 1)} & got["a"].active
