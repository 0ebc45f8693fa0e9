"""Consumer-group assignors on a real Kafka broker, members in separate processes.

For every assignor: members join, leave (SIGTERM: LeaveGroup) and crash (SIGKILL: the broker
evicts them after the session timeout); after each change the group settles, every partition is
owned exactly once, and what each member observes equals what the pure assignor computes from
the leader's inputs. Sticky assignors hand a restarted member its partitions back; the
cooperative assignor completes its follow-up rebalance by itself; garbage user data from one
member does not stop the group.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamassign import TopicPartition
from streamassign.aiokafka import ASSIGNORS
from streamassign.consumer import CooperativeStickyAssignor, MemberData, Subscription

from .conftest import GroupIdFactory, TopicFactory
from .procs import JsonLinesProcess

MEMBER = Path(__file__).with_name("member.py")
SETTLE = 1.5  # seconds without new rebalance lines before a group counts as settled
TIMEOUT = 45.0


class Group:
    def __init__(self, bootstrap: str, group: str, topics: list[str], assignor: str) -> None:
        self.base = ["--bootstrap", bootstrap, "--group", group, "--topics", ",".join(topics)]
        self.assignor = assignor
        self.members: dict[str, JsonLinesProcess] = {}
        self.generation = -1  # of the last settled state

    def start(self, name: str, *extra: str) -> JsonLinesProcess:
        member = JsonLinesProcess(MEMBER, [*self.base, "--assignor", self.assignor, *extra])
        self.members[name] = member
        return member

    def remove(self, name: str, sig: int = signal.SIGTERM) -> None:
        self.members.pop(name).stop(sig)

    def settle(self, partitions: set[tuple[str, int]]) -> dict[str, dict[str, Any]]:
        """Wait until every live member reports the same final generation, newer than the last
        settled one, covering all partitions exactly once; return each member's last line."""
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            time.sleep(0.2)
            for m in self.members.values():
                m.drain()
            lines = [m.last for m in self.members.values()]
            if any(line is None for line in lines):
                continue
            done = [line for line in lines if line is not None]
            generations = {line["generation"] for line in done}
            owned = [tuple(tp) for line in done for tp in line["assigned"]]
            quiet = all(m.quiet_for() > SETTLE for m in self.members.values())
            if (
                len(generations) == 1
                and min(generations) > self.generation
                and quiet
                and not any(line["followup"] for line in done)
                and sorted(owned) == sorted(partitions)
            ):
                self.generation = generations.pop()
                return {name: m.last for name, m in self.members.items() if m.last}
        state = {n: m.last for n, m in self.members.items()}
        raise AssertionError(f"group did not settle within {TIMEOUT}s: {state}")

    def close(self) -> None:
        for m in self.members.values():
            m.stop(signal.SIGKILL)


@pytest.fixture
def group_factory(kafka_bootstrap: str) -> Iterator[Any]:
    groups: list[Group] = []

    def make(group: str, topics: list[str], assignor: str) -> Group:
        g = Group(kafka_bootstrap, group, topics, assignor)
        groups.append(g)
        return g

    yield make
    for g in groups:
        g.close()


def expected_from_leader(assignor: str, lines: dict[str, dict[str, Any]]) -> dict[str, list]:
    """Run the pure assignor on the inputs the leader printed for the final generation."""
    led = [line["led"] for line in lines.values() if line["led"]]
    assert len(led) == 1, "exactly one member led the final rebalance"
    r = led[0]
    subs = {
        m: Subscription(
            s["topics"],
            owned_partitions=[TopicPartition(t, p) for t, p in s["owned"]],
            generation=s["generation"],
            user_data=bytes.fromhex(s["user_data"]),
        )
        for m, s in r["subscriptions"].items()
    }
    pure = ASSIGNORS[assignor](seed=7) if assignor == "shuffled" else ASSIGNORS[assignor]()  # type: ignore[call-arg]
    if isinstance(pure, CooperativeStickyAssignor):
        result = pure.plan(r["counts"], subs).assignment
    else:
        result = pure.assign(r["counts"], subs)
    return {m: sorted([tp.topic, tp.partition] for tp in tps) for m, tps in result.items()}


def check(assignor: str, lines: dict[str, dict[str, Any]]) -> None:
    expected = expected_from_leader(assignor, lines)
    observed = {line["member"]: line["assigned"] for line in lines.values()}
    assert observed == expected
    assert all(line["error"] == "NONE" for line in lines.values())


def member_args(assignor: str, k: int) -> list[str]:
    if assignor == "failover":
        return ["--priority", str(10 - k)]  # m0 is the primary, m1 the first fallback, ...
    if assignor == "weighted":
        return ["--weight", "3" if k == 0 else "1"]
    if assignor == "shuffled":
        return ["--seed", "7"]
    return []


@pytest.mark.parametrize("assignor", sorted(ASSIGNORS))
def test_members_join_leave_and_crash(
    assignor: str,
    group_factory: Any,
    kafka_topic_factory: TopicFactory,
    kafka_group_id_factory: GroupIdFactory,
) -> None:
    topics = [kafka_topic_factory(6), kafka_topic_factory(4)]
    partitions = {(t, p) for t, n in zip(topics, (6, 4), strict=True) for p in range(n)}
    group = group_factory(kafka_group_id_factory(assignor), topics, assignor)
    for k in range(3):
        group.start(f"m{k}", *member_args(assignor, k))
    lines = group.settle(partitions)
    check(assignor, lines)
    if assignor == "failover":
        assert len(lines["m0"]["assigned"]) == 10
    if assignor == "weighted":
        assert len(lines["m0"]["assigned"]) == 6  # 10 partitions at weights 3:1:1

    group.start("m3", *member_args(assignor, 3))  # join
    check(assignor, group.settle(partitions))

    group.remove("m0")  # leave
    lines = group.settle(partitions)
    check(assignor, lines)
    if assignor == "failover":
        assert len(lines["m1"]["assigned"]) == 10  # the next in line took everything

    group.remove("m2", signal.SIGKILL)  # crash: evicted after the session timeout
    check(assignor, group.settle(partitions))


@pytest.mark.parametrize("assignor", ["sticky", "cooperative-sticky", "weighted"])
def test_restarted_member_gets_its_partitions_back(
    assignor: str,
    group_factory: Any,
    kafka_topic_factory: TopicFactory,
    kafka_group_id_factory: GroupIdFactory,
    tmp_path: Path,
) -> None:
    topic = kafka_topic_factory(9)
    partitions = {(topic, p) for p in range(9)}
    group = group_factory(kafka_group_id_factory(assignor), [topic], assignor)
    for k in range(3):
        group.start(f"m{k}", "--state-file", str(tmp_path / f"m{k}.state"))
    before = group.settle(partitions)
    check(assignor, before)

    group.remove("m1")
    check(assignor, group.settle(partitions))
    group.start("m1", "--state-file", str(tmp_path / "m1.state"))
    after = group.settle(partitions)
    check(assignor, after)
    assert after["m1"]["assigned"] == before["m1"]["assigned"]
    for name in ("m0", "m2"):
        assert after[name]["assigned"] == before[name]["assigned"]


def test_cooperative_withholds_then_completes_by_itself(
    group_factory: Any, kafka_topic_factory: TopicFactory, kafka_group_id_factory: GroupIdFactory
) -> None:
    topic = kafka_topic_factory(8)
    partitions = {(topic, p) for p in range(8)}
    group = group_factory(kafka_group_id_factory("coop"), [topic], "cooperative-sticky")
    group.start("m0")
    first = group.settle(partitions)
    joiner = group.start("m1")
    final = group.settle(partitions)
    check("cooperative-sticky", final)
    assert len(final["m1"]["assigned"]) == 4
    # The join took two rounds: one that withheld m0's partitions, then the follow-up.
    seen = [joiner.last]
    assert final["m0"]["generation"] >= first["m0"]["generation"] + 2, seen


def test_garbage_user_data_from_one_member_does_not_stop_the_group(
    group_factory: Any,
    kafka_topic_factory: TopicFactory,
    kafka_group_id_factory: GroupIdFactory,
    tmp_path: Path,
) -> None:
    topic = kafka_topic_factory(6)
    partitions = {(topic, p) for p in range(6)}
    garbage = tmp_path / "garbage.state"
    garbage.write_bytes(b"\x00\x00\x00\x07not user data at all")
    group = group_factory(kafka_group_id_factory("garbage"), [topic], "sticky")
    group.start("m0", "--garbage-user-data")  # unreadable on the wire: no history, defaults
    group.start("m1", "--state-file", str(garbage))  # unreadable on disk: starts with no history
    lines = group.settle(partitions)
    check("sticky", lines)
    assert sorted(len(line["assigned"]) for line in lines.values()) == [3, 3]
    assert MemberData.decode(garbage.read_bytes()).owned_partitions  # rewritten, readable now
