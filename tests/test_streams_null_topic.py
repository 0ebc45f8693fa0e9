"""A member whose subscription names a null topic, or no topic at all: the streams leader
logs it once per rebalance, the reason only, where it reads the metadata; not again as an
unreadable announcement (its indices point into a list read as empty) or as a member of
another topology version (it subscribes to those topics, and a null besides)."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment as Assignment
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata as Metadata

from streamassign import Subtopology, Topology
from streamassign.aiokafka.streams import ProcessHost
from streamassign.protocol import AssignmentInfo, SubscriptionInfo
from streamassign.versions import subtopology_topic_indices

TOPOLOGY = Topology([Subtopology(0, ["orders"]), Subtopology(1, ["clicks", "customers"])])
SOURCES = sorted(TOPOLOGY.source_topics)
COUNTS = {"orders": 4, "customers": 4, "clicks": 4}


def wire(topics: list[str | None], k: int, endpoint: str) -> Any:
    """A member's metadata as the leader gets it from the broker (encoded, then decoded: a
    null name reads back as ``None``), announcing the whole topology (protocol 3)."""
    info = SubscriptionInfo(
        uuid.UUID(int=k),
        endpoint=endpoint,
        version=3,
        latest_supported_version=3,
        subtopology_topic_indices=subtopology_topic_indices(TOPOLOGY, SOURCES),
    )
    return Metadata.decode(Metadata(0, topics, info.encode()).encode())


def cluster() -> Any:
    return SimpleNamespace(
        partitions_for_topic=lambda t: set(range(COUNTS[t])) if COUNTS.get(t) else None,
        leader_for_partition=lambda tp: None,
    )


@pytest.mark.parametrize(
    ("topics", "reason"),
    [([*SOURCES, None], "a null topic name"), ([], "an empty topic list")],
)
def test_a_member_subscribing_to_nothing_is_logged_once_per_rebalance(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, topics: list[str | None], reason: str
) -> None:
    host = ProcessHost(
        TOPOLOGY, bootstrap_servers="127.0.0.1:1", application_id="g", state_dir=tmp_path
    )
    members = {
        "m1": wire(list(SOURCES), 1, "p:1"),
        "m2": wire(topics, 1, "p:1"),  # a thread of m1's process
        "m3": wire(list(SOURCES), 3, "q:1"),
    }
    caplog.set_level(logging.INFO, logger="streamassign")
    try:
        for _ in range(3):
            out = host.assignors[0].assign(cluster(), members)
    finally:
        host.state.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [f"member m2: {reason} in its subscription; assigning it nothing"] * 3
    got = {m: Assignment.decode(raw) for m, raw in out.items()}
    assert not got["m2"].partitions()
    assert AssignmentInfo.decode(got["m2"].user_data).active == frozenset()
    assert all(got[m].partitions() for m in ("m1", "m3"))
