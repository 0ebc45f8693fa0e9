"""The stream partitions' hold through two overlapping rebalances, in every order Faust and
aiokafka allow: each assigned stream partition ends resumed once the last recovery resumed
the flow, and none is fetchable while a recovery seeks.

A model without a broker: Faust's own consumer bookkeeping (``Consumer.on_partitions_revoked``
and ``on_partitions_assigned``: the active and paused sets) and ours run as they are; the
app's callbacks and Faust's recovery are reduced to the calls they make on the consumer, in
their order (faust-streaming 0.15: ``App._on_partitions_revoked``,
``App._on_partitions_assigned``, ``Recovery._restart_recovery`` and
``Recovery.on_recovery_completed``).

What may interleave: rebalance N's recovery runs its steps one after the other (a task) while
rebalance N+1's revoke (which waits for the agents and the producer), join (the group's
SyncGroup, after which aiokafka's assignment and Faust's generation are the new ones) and
assignment come; each of the recovery's awaits ends it once N+1's assignment signalled the
next recovery (``RebalanceAgain``), and its stream resume is skipped once the generation is
N+1's. Then N+1's recovery runs whole.

Each of rebalance N's recovery steps may come in each phase of N+1 (before its revoke, during
it, after it before the join ends, after the join) or not at all: every placement that makes
distinct calls on the consumer is run (27 per case), all of a case's orders on one event loop.
The one merge: the recovery's changelog pause
("Done reading from changelog topics") comes right after its changelog read, in the same
phase: it touches changelog partitions only (never held, never the app's), so where N+1's
steps fall between the two changes nothing of the stream partitions this test follows.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

faust = pytest.importorskip("faust")

from faust.types import TP  # noqa: E402

APP = "orders-app"
CHANGELOG_TOPIC = f"{APP}-totals-changelog"


def source(partition: int) -> TP:
    return TP("orders", partition)


def changelog(partition: int) -> TP:
    return TP(CHANGELOG_TOPIC, partition)


def tasks(*partitions: int) -> frozenset[TP]:
    return frozenset(tp for p in partitions for tp in (source(p), changelog(p)))


#: Rebalance N's assignment, then N+1's: the same; one task kept, one taken away and one
#: added at once.
ASSIGNMENTS = {
    "kept": (tasks(0, 1), tasks(0, 1)),
    "one kept, one moved away, one added": (tasks(0, 1), tasks(0, 2)),
}

#: Rebalance N+1's steps that rebalance N's recovery may interleave with, in their order.
NEXT_REBALANCE = ("revoke starts", "revoke ends", "join ends")


class Worker:
    """One worker's consumer driven through Faust's calls."""

    def __init__(self, app: faust.App) -> None:
        self.app = app
        self.consumer = app._new_consumer()
        self.consumer.recovery_stall_after = 30.0
        self.aiokafka_assignment: set[TP] = set()  # until the first join ends
        self.consumer.assignment = lambda: set(self.aiokafka_assignment)
        self.consumer._on_partitions_revoked = self._app_revoked
        self.consumer._on_partitions_assigned = self._app_assigned
        self.revoke_waits = asyncio.Event()
        self.revoking: asyncio.Task[None] | None = None
        self.signalled = 0  # the generation whose recovery Faust's assignment signalled
        #: Stream partitions fetchable while a recovery sought its stream partitions.
        self.fetchable_in_seek: list[set[TP]] = []
        app.rebalancing, app.consumer_generation_id = False, 0
        app.flow_control.resume()

    def close(self) -> None:
        self.consumer._hold_watch.stop()
        self.consumer._flow_watch.stop()
        self.consumer._recovery_watch.stop()
        self.consumer._freeze_watch.stop()
        thread_loop = self.consumer._thread.thread_loop
        if not thread_loop.is_closed():
            thread_loop.close()

    async def _app_revoked(self, revoked: set[TP]) -> None:
        """``App._on_partitions_revoked``: with something assigned, the flow stops, every
        partition is paused, the queues are emptied; then it waits for the agents' current
        events and the producer (what else runs meanwhile is the interleaving)."""
        consumer = self.consumer
        assignment = consumer.assignment()
        if assignment:
            consumer.stop_flow()
            self.app.flow_control.suspend()
            consumer.pause_partitions(assignment)
            self.app.flow_control.clear()
            await self.revoke_waits.wait()

    async def _app_assigned(self, assigned: set[TP], generation_id: int = 0) -> None:
        """``App._on_partitions_assigned``: every partition paused, then the tables signal the
        recovery of this generation (which ends the previous one at its next await)."""
        self.consumer.pause_partitions(assigned)
        self.signalled = generation_id

    async def rebalance_starts(self) -> None:
        """aiokafka's revoke before the join: Faust's listener, then the consumer's revoke,
        which runs until the app's revoke waits for its agents."""
        self.app.on_rebalance_start()
        self.revoke_waits.clear()
        self.revoking = asyncio.ensure_future(self.consumer.on_partitions_revoked(set()))
        await asyncio.sleep(0)  # it runs up to the app's wait

    async def revoke_ends(self) -> None:
        self.revoke_waits.set()
        assert self.revoking is not None
        await self.revoking

    def join_ends(self, assignment: frozenset[TP], generation: int) -> None:
        """The SyncGroup on the consumer thread: aiokafka's assignment is the new one, and
        Faust's listener sets the generation before the assignment reaches the loop."""
        self.aiokafka_assignment = set(assignment)
        self.app.consumer_generation_id = generation

    async def assigned(self, assignment: frozenset[TP], generation: int) -> None:
        await self.consumer.on_partitions_assigned(set(assignment), generation)

    def recovery(self, generation: int, changelog_to_read: bool) -> list[Callable[[], None]]:
        """Faust's recovery of ``generation``, step by step (each step runs between two of its
        awaits); a step after the next generation's signal does not run (``RebalanceAgain``)."""
        consumer, app = self.consumer, self.app

        def assigned_changelogs() -> set[TP]:
            return {tp for tp in consumer.assignment() if tp.topic == CHANGELOG_TOPIC}

        def read_changelogs() -> None:
            # "Restoring state from changelog topics...", then "Done reading from changelog
            # topics" (merged: see the module docstring).
            consumer.resume_partitions(assigned_changelogs())
            app.flow_control.resume()
            consumer.resume_flow()
            consumer.pause_partitions(assigned_changelogs())

        def nothing_to_read() -> None:  # need_recovery() false: "Resuming flow..."
            app.flow_control.resume()
            consumer.resume_flow()

        seeking = {"sought": False}

        def resume_streams() -> None:  # on_recovery_completed, up to its seek
            if app.consumer_generation_id != generation:
                return  # "Recovery rebalancing again"
            consumer.resume_partitions(
                {tp for tp in consumer.assignment() if tp.topic != CHANGELOG_TOPIC}
            )
            seeking["sought"] = True
            self.fetchable_in_seek.append(
                {tp for tp in consumer._get_active_partitions() if tp.topic != CHANGELOG_TOPIC}
            )

        def resume_flow() -> None:  # after the seek: "Worker ready"
            if not seeking["sought"]:
                return
            app.flow_control.resume()
            consumer.resume_flow()
            app.on_rebalance_end()

        first = read_changelogs if changelog_to_read else nothing_to_read
        return [first, resume_streams, resume_flow]

    def run_if_current(self, generation: int, step: Callable[[], None]) -> None:
        if self.signalled == generation:
            step()


def orders(steps: int) -> Iterator[tuple[str, ...]]:
    """Every order of the first ``k`` of rebalance N's recovery steps (each k) among the next
    rebalance's steps before its assignment, but those whose stream resume (step 1) comes after
    N+1's join: it is skipped then (the generation is N+1's) and its last ``resume_flow()``
    does nothing (nothing sought), the same calls as the order that stops before step 1."""
    for k in range(steps + 1):
        names = [f"N's step {i}" for i in range(k)]
        slots = len(names) + len(NEXT_REBALANCE)
        for positions in itertools.combinations(range(slots), len(NEXT_REBALANCE)):
            order: list[str] = []
            mine, theirs = iter(names), iter(NEXT_REBALANCE)
            for slot in range(slots):
                order.append(next(theirs) if slot in positions else next(mine))
            if "N's step 1" not in order[order.index("join ends") :]:
                yield tuple(order)


async def overlapping_rebalances(
    app: faust.App, first: frozenset[TP], second: frozenset[TP], changelog: bool, order: Any
) -> Worker:
    worker = Worker(app)
    consumer = worker.consumer
    # Rebalance N: revoke (nothing assigned yet), join, assignment; its recovery then runs
    # in ``order`` among rebalance N+1's steps.
    app.on_rebalance_start()
    await consumer.on_partitions_revoked(set())
    worker.join_ends(first, 1)
    await worker.assigned(first, 1)
    steps = worker.recovery(1, changelog)
    for step in order:
        if step == "revoke starts":
            await worker.rebalance_starts()
        elif step == "revoke ends":
            await worker.revoke_ends()
        elif step == "join ends":
            worker.join_ends(second, 2)
        else:
            worker.run_if_current(1, steps[int(step.rsplit(" ", 1)[1])])
    await worker.assigned(second, 2)
    for step in worker.recovery(2, changelog):
        worker.run_if_current(2, step)
    return worker


@pytest.mark.parametrize("changelog_to_read", [True, False])
@pytest.mark.parametrize("assignments", list(ASSIGNMENTS))
def test_every_stream_partition_flows_after_two_overlapping_rebalances(
    tmp_path: Path, assignments: str, changelog_to_read: bool
) -> None:
    first, second = ASSIGNMENTS[assignments]
    app = faust.App(
        APP,
        broker="streamassign://localhost:1",
        datadir=str(tmp_path),
        PartitionAssignor="streamassign.faust:PartitionAssignor",
    )
    app.Table("totals", default=int)
    streams = {tp for tp in second if tp.topic != CHANGELOG_TOPIC}

    async def every_order() -> list[tuple[Any, dict[str, Any]]]:
        failures = []
        for order in orders(3):
            worker = await overlapping_rebalances(app, first, second, changelog_to_read, order)
            consumer = worker.consumer
            try:
                active = consumer._get_active_partitions()
                state = {
                    "not flowing": sorted(streams - active),
                    "still paused": sorted(streams & consumer._paused_partitions),
                    "still held": sorted(consumer._held_streams),
                    "flow stopped": not consumer.flow_active,
                    "fetched in a seek": [sorted(s) for s in worker.fetchable_in_seek if s],
                }
                if any(state.values()):
                    failures.append((order, state))
            finally:
                worker.close()
        return failures

    assert asyncio.run(every_order()) == []
