"""Hand-backs to restarted ProcessHosts whose consumers join in different rebalances, without a
broker: each round, the members' real subscriptions go through the leader's ``assign`` and the
answers back through ``on_assignment``, as aiokafka passes them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import SimpleNamespace

import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

from streamassign import TaskId, TopicPartition
from streamassign.aiokafka import ProcessHost
from streamassign.protocol import AssignmentInfo

from .hosts import CHANGELOG, brokerless, ends_at, with_process_id

END = 10_000  # every changelog's end offset


def tasks(*partitions: int) -> frozenset[TaskId]:
    return frozenset(TaskId(0, p) for p in partitions)


def restarted(
    path: Path,
    pid: int,
    ran: Mapping[int, frozenset[TaskId]],
    checkpoints: Mapping[TaskId, int],
    task_count: int,
) -> ProcessHost:
    """A two-consumer process restarting from ``path``: process id ``pid``, consumer i ran
    ``ran[i]`` before it stopped, and its local state reached ``checkpoints``."""
    ends = ends_at(END, task_count)
    host = brokerless(with_process_id(path, pid), ends, threads=2)
    host.state.write_assignment({i: ran.get(i, frozenset()) for i in range(2)})
    for task, offset in checkpoints.items():
        host.state.write_checkpoint(task, {TopicPartition(CHANGELOG, task.partition): offset})
    host.state.close()
    return brokerless(path, ends, threads=2)


async def rebalance(members: Mapping[str, tuple[ProcessHost, int]], task_count: int) -> None:
    """One rebalance of ``members`` (member id -> host and consumer), led by the first."""
    cluster = SimpleNamespace(  # no partition leaders: no racks
        partitions_for_topic=lambda topic: set(range(task_count)),
        leader_for_partition=lambda partition: None,
    )
    leader_host, leader_index = next(iter(members.values()))
    answers = leader_host.assignors[leader_index].assign(
        cluster, {m: h.assignors[i].metadata(["in"]) for m, (h, i) in members.items()}
    )
    for m, (h, i) in members.items():
        h.assignors[i].on_assignment(ConsumerProtocolMemberAssignment.decode(answers[m]))
        await h._assigned(i)


def run_rounds(
    hosts: Mapping[str, ProcessHost],
    joins: Iterable[tuple[str, int, int]],
    member_ids: Mapping[tuple[str, int], str],
    task_count: int,
) -> list[dict[str, frozenset[TaskId]]]:
    """What each process runs after each round; ``joins``: process, consumer, and the round
    from which it is in the group."""
    joins = list(joins)

    async def run() -> list[dict[str, frozenset[TaskId]]]:
        seen = []
        for now in range(max(at for _, _, at in joins) + 1):
            members = {member_ids[(p, c)]: (hosts[p], c) for p, c, at in joins if at <= now}
            await rebalance(dict(sorted(members.items())), task_count)
            seen.append({name: h.running for name, h in hosts.items()})
        return seen

    return asyncio.run(run())


@pytest.mark.parametrize("loser_first", [True, False], ids=["loser-ids-first", "winner-first"])
def test_a_task_two_restarted_processes_claim_moves_once_at_most(
    tmp_path: Path, loser_first: bool
) -> None:
    """W and L both ran 0_0 before they restarted, and R ran it meanwhile. W is less behind,
    so 0_0 returns to W; L's second consumer joins one rebalance late and W's two late, so
    both claim 0_0 again. The claim W won is settled: once 0_0 went to L (the leader cannot
    tell W won it back from W having run it meanwhile), W does not take it back. Before,
    it went W -> L -> W."""
    t0 = TaskId(0, 0)
    runner = brokerless(tmp_path / "R", threads=2)
    runner.assignors[0].info = AssignmentInfo(active=tasks(0, 1, 2))
    runner.assignors[1].info = AssignmentInfo(active=tasks(3, 4, 5))
    for i in range(2):
        asyncio.run(runner._assigned(i))
    hosts = {
        "R": runner,
        "W": restarted(tmp_path / "W", 2, {0: tasks(0, 2)}, {t0: 9_500, TaskId(0, 2): END}, 6),
        "L": restarted(tmp_path / "L", 1, {0: tasks(0, 1)}, {t0: 9_000, TaskId(0, 1): END}, 6),
    }
    first, second = ("a", "z") if loser_first else ("z", "a")
    ids = {("L", c): f"{first}{c}" for c in range(2)} | {("W", c): f"{second}{c}" for c in range(2)}
    ids |= {("R", c): f"r{c}" for c in range(2)}
    joins = [("R", 0, 0), ("R", 1, 0), ("W", 0, 0), ("L", 0, 0), ("L", 1, 1), ("W", 1, 2)]
    owners = [
        [p for p, run in held.items() if t0 in run] for held in run_rounds(hosts, joins, ids, 6)
    ]
    # The one move left (W -> L) needs the leader to tell a claim W won from a task W ran
    # meanwhile: see docs/streams.md.
    assert owners == [["W"], ["L"], ["L"]]


def test_a_claim_that_did_not_fit_comes_back_when_the_last_consumer_joins(
    tmp_path: Path,
) -> None:
    """A process restarting alone: its first consumer claims 4 tasks, but with R's 3
    consumers a one-consumer share is 3 of 12, so one claim waits. When the second consumer
    joins, the waiting claim is handed back too: settling the claims that came back keeps
    the others (dropping every claim a round did not honour would leave 0_3 with R)."""
    runner = brokerless(tmp_path / "R", threads=3)
    for i in range(3):
        runner.assignors[i].info = AssignmentInfo(active=tasks(*range(i, 12, 3)))
        asyncio.run(runner._assigned(i))
    claims = {0: tasks(0, 1, 2, 3), 1: tasks(4, 5)}
    hosts = {
        "R": runner,
        "P": restarted(tmp_path / "P", 1, claims, dict.fromkeys(claims[0] | claims[1], END), 12),
    }

    ids = {("R", c): f"r{c}" for c in range(3)} | {("P", c): f"p{c}" for c in range(2)}
    joins = [("R", 0, 0), ("R", 1, 0), ("R", 2, 0), ("P", 0, 0), ("P", 1, 1)]
    first, second = (held["P"] for held in run_rounds(hosts, joins, ids, 12))
    assert len(first) == 3 and first < claims[0]  # a one-consumer share, all claimed
    assert claims[0] <= second <= claims[0] | claims[1]  # 0_3 came back, nothing unclaimed
