"""Members announcing one process id with different endpoints (a copied state directory: a
cloned disk, a data directory copied to warm a new worker) are different processes to the
streams leader (``assign_streams``, ``ProcessHost``'s leader): each endpoint is a client of its
own, whatever the member ids, and the clash is logged once per leader."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from hypothesis import given
from hypothesis import strategies as st

from streamassign import Subtopology, TaskId, Topology
from streamassign.aiokafka import ProcessHost
from streamassign.protocol import LATEST_OFFSET, AssignmentInfo, SubscriptionInfo
from streamassign.repeats import Repeats
from streamassign.streams import (
    MemberAssignment,
    MemberSubscription,
    assign_streams,
    client_states,
    process_keys,
)

TOPOLOGY = Topology([Subtopology(0, ["in"], stores=["s"])], name="app")
COUNTS = {"in": 12}
CLONED, OTHER = uuid.UUID(int=1), uuid.UUID(int=2)
#: (process id, endpoint) of each consumer: two copies of one state directory (two consumers
#: each), and a process of its own (two consumers).
CONSUMERS = [
    (CLONED, "w0:80"),
    (CLONED, "w0:80"),
    (CLONED, "w2:80"),
    (CLONED, "w2:80"),
    (OTHER, "w1:80"),
    (OTHER, "w1:80"),
]


def subscription(pid: uuid.UUID, endpoint: str | None, **kw: object) -> MemberSubscription:
    info = SubscriptionInfo(pid, endpoint=endpoint, **kw)  # type: ignore[arg-type]
    return MemberSubscription({"in"}, info)


def members_named(names: list[str]) -> dict[str, MemberSubscription]:
    return {name: subscription(pid, e) for name, (pid, e) in zip(names, CONSUMERS, strict=True)}


def by_endpoint(
    members: dict[str, MemberSubscription], result: dict[str, MemberAssignment]
) -> dict[str, tuple[frozenset[TaskId], frozenset[TaskId]]]:
    """Per endpoint, the actives and standbys of its members."""
    out: dict[str, tuple[frozenset[TaskId], frozenset[TaskId]]] = {}
    for m, a in result.items():
        info = members[m].info
        assert info is not None and info.endpoint is not None
        active, standby = out.get(info.endpoint, (frozenset(), frozenset()))
        out[info.endpoint] = (active | a.info.active, standby | a.info.standby)
    return out


def test_each_endpoint_of_a_shared_process_id_is_a_process_of_its_own() -> None:
    """Before: the leader made one process of w0 and w2 (capacity 4 of 6), mapped all its
    tasks to one endpoint (routed reads of w2's tasks went to w0) and could not place a
    standby of w0's tasks on w2."""
    members = members_named([f"m{k}" for k in range(6)])
    result = assign_streams(TOPOLOGY, COUNTS, members, num_standby_replicas=1)
    hosts = by_endpoint(members, result)
    some = next(iter(result.values())).info
    assert set(some.active_by_host) == {"w0:80", "w1:80", "w2:80"}
    for endpoint, (active, standby) in hosts.items():
        assert len(active) == 4  # balanced over three processes of two consumers
        assert some.active_by_host[endpoint] == active  # routing names the real owner
        assert some.standby_by_host[endpoint] == standby
        assert not active & standby
    assert all(len(s) == 4 for _, s in hosts.values())


@given(st.permutations([f"consumer-{k}" for k in range(6)]))
def test_the_assignment_per_endpoint_does_not_depend_on_member_ids(names: list[str]) -> None:
    members = members_named(names)
    result = assign_streams(TOPOLOGY, COUNTS, members, num_standby_replicas=1)
    reference = members_named([f"m{k}" for k in range(6)])
    expected = assign_streams(TOPOLOGY, COUNTS, reference, num_standby_replicas=1)
    assert by_endpoint(members, result) == by_endpoint(reference, expected)


def test_each_copy_keeps_what_it_ran() -> None:
    """Stickiness: each copy reports the tasks it runs (the merged process's previous
    assignment was split over its consumers), and keeps them as a process of its own."""
    t = [TaskId(0, p) for p in range(12)]
    ran = {"w0:80": t[0:6], "w2:80": t[6:9], "w1:80": t[9:12]}
    members = {
        f"{e}-{k}": subscription(
            CLONED if e != "w1:80" else OTHER,
            e,
            offset_sums=dict.fromkeys(tasks[k::2], LATEST_OFFSET),
        )
        for e, tasks in ran.items()
        for k in range(2)
    }
    clients, _, _ = client_states(members)
    assert {c.process_id: set(c.prev_active) for c in clients} == {
        f"{CLONED}#w0:80": set(ran["w0:80"]),
        f"{CLONED}#w2:80": set(ran["w2:80"]),
        str(OTHER): set(ran["w1:80"]),
    }
    result = assign_streams(TOPOLOGY, COUNTS, members)
    hosts = by_endpoint(members, result)
    assert hosts["w2:80"][0] >= set(ran["w2:80"]) and hosts["w1:80"][0] >= set(ran["w1:80"])
    assert hosts["w0:80"][0] <= set(ran["w0:80"])  # gives work away, takes none


def test_members_without_endpoints_cannot_be_told_apart() -> None:
    """No endpoint: nothing tells a copy from a second consumer; one process, as before."""
    keys, clashes = process_keys({"a": ("p", None), "b": ("p", None), "c": ("p", "")})
    assert keys == {"a": "p", "b": "p", "c": "p"} and clashes == []
    keys, clashes = process_keys({"a": ("p", "x:1"), "b": ("p", "y:1"), "c": ("p", None)})
    assert keys == {"a": "p#x:1", "b": "p#y:1", "c": "p"}
    (clash,) = clashes
    assert clash.endpoints == ("x:1", "y:1")
    assert clash.members == (("", "c"), ("x:1", "a"), ("y:1", "b"))


def test_a_clash_is_logged_once_per_leader_until_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logged = Repeats()
    members = members_named([f"m{k}" for k in range(6)])
    rejoined = members_named([f"n{k}" for k in range(6)])  # new member ids, same clash
    alone = {m: s for m, s in members.items() if s.info and s.info.endpoint != "w2:80"}
    with caplog.at_level(logging.DEBUG, "streamassign.streams"):
        for round_members in (members, rejoined, alone, members):
            assign_streams(TOPOLOGY, COUNTS, round_members, shared_ids=logged)
    lines = [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if "endpoint" in r.getMessage() and r.name == "streamassign.streams"
    ]
    assert [level for level, _ in lines] == [
        logging.WARNING,
        logging.DEBUG,
        logging.INFO,
        logging.WARNING,
    ]
    warning = lines[0][1]
    assert f"process id {CLONED} is announced with 2 endpoints" in warning
    assert "m0 at w0:80" in warning and "m2 at w2:80" in warning
    assert "delete process.id from its state directory (<state_dir>/process.id" in warning


def test_process_host_leader_keys_copies_per_endpoint_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``ProcessHost``'s leader (whichever of its consumers leads) over two cloned processes."""
    h = ProcessHost(TOPOLOGY, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, threads=2)
    metadata = {
        f"m{k}": ConsumerProtocolMemberMetadata(
            0, ["in"], SubscriptionInfo(pid, endpoint=e).encode()
        )
        for k, (pid, e) in enumerate(CONSUMERS)
    }
    members = members_named([f"m{k}" for k in range(6)])
    cluster = SimpleNamespace(partitions_for_topic=lambda t: set(range(COUNTS.get(t, 0))))
    with caplog.at_level(logging.DEBUG, "streamassign.streams"):
        for leader in (0, 1):
            out = h.assignors[leader].assign(cluster, metadata)
    warnings = [
        r for r in caplog.records if r.levelno == logging.WARNING and r.name.endswith(".streams")
    ]
    assert len(warnings) == 1 and "2 endpoints" in warnings[0].getMessage()
    infos = {
        m: AssignmentInfo.decode(ConsumerProtocolMemberAssignment.decode(a).user_data)
        for m, a in out.items()
    }
    for endpoint in ("w0:80", "w1:80", "w2:80"):
        own = {m for m, s in members.items() if s.info and s.info.endpoint == endpoint}
        active = frozenset().union(*(infos[m].active for m in own))
        assert len(active) == 4 and infos["m0"].active_by_host[endpoint] == active
    h.state.close()


def test_a_copy_is_handed_back_nothing_the_original_runs() -> None:
    """The copy brings the original's claims (previous actives, checkpoints) from the copied
    directory. Honoured, the caught-up rule handed the copy all six tasks the original runs
    (it must take four), then rebalanced the rest. Ignored: four moves, two from each."""
    t = [TaskId(0, p) for p in range(12)]
    original, other = frozenset(t[:6]), frozenset(t[6:])
    members = {
        "w0": subscription(CLONED, "w0:80", offset_sums=dict.fromkeys(original, LATEST_OFFSET)),
        "w1": subscription(OTHER, "w1:80", offset_sums=dict.fromkeys(other, LATEST_OFFSET)),
        "w2": subscription(
            CLONED, "w2:80", offset_sums=dict.fromkeys(original, 100), previous_active=original
        ),
    }
    result = assign_streams(TOPOLOGY, COUNTS, members, num_standby_replicas=1)
    assert len(result["w0"].info.active & original) == 4
    assert len(result["w1"].info.active & other) == 4
    assert len(result["w2"].info.active) == 4
