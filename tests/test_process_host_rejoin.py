"""A member that lost its membership while it restored, rejoining, without a broker: real
ProcessHosts, their real subscriptions through the leader's ``assign`` and the answers back
through ``on_assignment``, as aiokafka passes them.

Such a member reports the actives of its last assignment by their stores' positions, not as
running (``LATEST_OFFSET``): the interim owners run them, and two running claims were settled
by process id, so what came back to it depended on its id rather than on where state is."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping
from pathlib import Path
from types import SimpleNamespace

import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

from streamassign import TaskId, TopicPartition
from streamassign.aiokafka import ProcessHost, TaskListener
from streamassign.protocol import LATEST_OFFSET, AssignmentInfo, SubscriptionInfo

from .hosts import CHANGELOG, brokerless, ends_at, with_process_id

TASKS = 16
END = 100_000  # every changelog's end offset: ten times the acceptable recovery lag


class Stores(TaskListener):
    """What a runtime tells its host: its actives still restoring, its stores' positions."""

    def __init__(self) -> None:
        self.restoring: set[TaskId] = set()
        self.positions: dict[TaskId, int] = {}

    def restoring_actives(self) -> Collection[TaskId]:
        return self.restoring

    def store_offset_sums(self) -> Mapping[TaskId, int]:
        return self.positions


def process(root: Path, name: str, pid: int, listener: TaskListener | None = None) -> ProcessHost:
    path = with_process_id(root / name, pid)
    host = brokerless(path, ends_at(END, TASKS), num_standby_replicas=1, listener=listener)
    # A consumer whose member id the test sets as aiokafka would.
    host.consumers.append(
        SimpleNamespace(_coordinator=SimpleNamespace(member_id=name, generation=1))
    )  # type: ignore[arg-type]
    return host


def caught_up(*hosts: ProcessHost) -> None:
    """Every copy the hosts hold is at the end, checkpointed (as the runtime checkpoints)."""
    for host in hosts:
        held = host.tasks(0)
        for task in held.active | held.standby | held.warmup:
            host.state.write_checkpoint(task, {TopicPartition(CHANGELOG, task.partition): END})


async def rebalance(members: Mapping[str, ProcessHost]) -> dict[str, SubscriptionInfo]:
    """One rebalance of ``members`` (led by the first); what each subscribed with."""
    cluster = SimpleNamespace(
        partitions_for_topic=lambda topic: set(range(TASKS)),
        leader_for_partition=lambda partition: None,
    )
    subscriptions = {m: h.assignors[0].metadata(["in"]) for m, h in members.items()}
    answers = next(iter(members.values())).assignors[0].assign(cluster, subscriptions)
    for m, h in members.items():
        h.consumers[0]._coordinator.generation += 1  # type: ignore[attr-defined]
        h.assignors[0].on_assignment(ConsumerProtocolMemberAssignment.decode(answers[m]))
        await h._assigned(0)
    return {m: SubscriptionInfo.decode(s.user_data) for m, s in subscriptions.items()}


@pytest.mark.parametrize("rank", ["best", "worst"])
@pytest.mark.parametrize("standbys_at", [END, 0], ids=["standbys-caught-up", "standbys-cold"])
def test_a_member_evicted_mid_restore_gets_the_cheapest_tasks_whatever_its_id(
    tmp_path: Path, rank: str, standbys_at: int
) -> None:
    """C joins four processes and gets three actives: it restores one to the end and the
    others to half when its session expires; the others take them back from their parked
    state meanwhile. C rejoins: it reports them by their store positions (not running), still
    as its previous actives. The leader gives back the restored one (within the acceptable
    lag), and for C's other share takes its cheapest state: its caught-up standbys over the
    half-restored actives, which stay with their interim owners; with cold standbys, the
    half-restored actives. The same at either end of the process id order.

    Before, C reported all three running beside the interim owners, and the leader settled
    the two running claims by process id: at the best rank C got all three back (100,000
    records to restore, with caught-up standbys it could run at once), at the worst rank
    none (300,000 records to restore, with cold standbys)."""
    stores = Stores()
    old = {f"o{i}": process(tmp_path, f"o{i}", i + 1) for i in range(4)}
    c = process(tmp_path, "c", 0 if rank == "best" else (1 << 128) - 1, stores)

    async def run() -> tuple[SubscriptionInfo, list[TaskId]]:
        await rebalance(old)
        caught_up(*old.values())
        await rebalance(old | {"c": c})
        caught_up(*old.values())  # their revoked actives' stores: parked at the end
        first = sorted(c.tasks(0).active)
        stores.restoring = set(first[1:])
        stores.positions = {t: END if t == first[0] else END // 2 for t in first}
        stores.positions |= dict.fromkeys(c.tasks(0).standby, standbys_at)
        c.consumers[0]._coordinator.member_id = ""  # type: ignore[attr-defined]  # evicted
        await rebalance(old)
        caught_up(*old.values())
        return (await rebalance(old | {"c": c}))["c"], first

    sent, first = asyncio.run(run())
    assert len(first) == 3
    assert LATEST_OFFSET not in sent.offset_sums.values()
    assert {t: sent.offset_sums[t] for t in first} == {t: stores.positions[t] for t in first}
    assert sent.previous_active == frozenset(first)
    restored, halfway = first[0], frozenset(first[1:])
    assert restored in c.running and len(c.running) == 3
    if standbys_at == END:
        assert not c.running & halfway  # run at once from its standbys instead
        assert halfway <= frozenset().union(*(h.running for h in old.values()))
    else:
        assert c.running == frozenset(first)  # half restored beats cold
    assert sum(END - stores.positions.get(t, 0) for t in c.running) == (
        0 if standbys_at == END else END
    )


def test_only_restored_actives_of_members_still_in_the_group_are_reported_running(
    tmp_path: Path,
) -> None:
    """A restoring active is local state (its store's position, else its checkpoint); a
    member id reset by aiokafka makes every active of that consumer local state, also while
    it rejoins under a new member id; a failing listener leaves the report as the host
    knows it."""
    stores = Stores()
    host = process(tmp_path, "p", 1, stores)
    t0, t1, t2 = (TaskId(0, p) for p in range(3))
    host.assignors[0].info = AssignmentInfo(active=frozenset({t0, t1}), standby=frozenset({t2}))
    asyncio.run(host._assigned(0))
    host.state.write_checkpoint(t1, {TopicPartition(CHANGELOG, 1): 40})
    host.state.write_checkpoint(t2, {TopicPartition(CHANGELOG, 2): 70})
    assert host.offset_sums() == {t0: LATEST_OFFSET, t1: LATEST_OFFSET, t2: 70}
    stores.restoring = {t1}
    stores.positions = {t2: 90}  # ahead of its checkpoint
    assert host.offset_sums() == {t0: LATEST_OFFSET, t1: 40, t2: 90}
    coordinator = host.consumers[0]._coordinator  # type: ignore[attr-defined]
    coordinator.generation += 1  # a rebalance it takes part in: still running
    assert host.offset_sums()[t0] == LATEST_OFFSET
    coordinator.member_id, coordinator.generation = "", -1  # evicted
    assert host.offset_sums() == {t1: 40, t2: 90}
    coordinator.member_id = "p-2"  # rejoining under a new member id
    assert host.offset_sums() == {t1: 40, t2: 90}

    def broken() -> Collection[TaskId]:
        raise RuntimeError("listener bug")

    stores.restoring_actives = broken  # type: ignore[method-assign]
    asyncio.run(host._assigned(0))  # assigned again: in the group under its new member id
    assert host.offset_sums() == {t0: LATEST_OFFSET, t1: LATEST_OFFSET, t2: 90}


@pytest.mark.parametrize(
    ("positions", "wrong_shape"),
    [
        (None, True),
        ({TaskId(0, 0): None}, True),
        ({"0_0": 5}, True),
        ({TaskId(0, 0): -2}, False),
        ({TaskId(0, 0): 1 << 63}, False),  # past the wire's int64: failed the encoding
    ],
)
def test_a_listener_answer_of_the_wrong_shape_still_sends_a_subscription(
    tmp_path: Path, positions: object, wrong_shape: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A listener's store positions of the wrong shape (None, a non-int sum, a key that is no
    task id) raised in ``metadata()``, which ended aiokafka's coordination task: that consumer
    never rejoined. Now they are left out, logged; a negative sum (a sentinel
    such as ``LATEST_OFFSET``) is dropped silently."""
    listener = Stores()
    host = process(tmp_path, "p", 1, listener)
    host.state.write_checkpoint(TaskId(0, 0), {TopicPartition(CHANGELOG, 0): 500})
    listener.positions = positions  # type: ignore[assignment]
    info = SubscriptionInfo.decode(host.assignors[0].metadata(["in"]).user_data)
    assert info.offset_sums == {TaskId(0, 0): 500}  # the checkpoint's
    assert ("could not be used" in caplog.text) == wrong_shape
