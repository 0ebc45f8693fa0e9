"""After a lost group membership the ``streamassign://`` consumer forgets the offsets Faust
acknowledged and did not commit, at the end of the revoke and at the next assignment
(``_Consumer._forget_acks_if_lost``).

Faust's revoke forgets the revoked partitions' acknowledged offsets, then waits for its agents'
current events; their acknowledgements go back in, and Faust's last commit of the revoke (refused
without a membership) takes them only up to the first hole. The stall hold dropped their
changelog sends, so a commit of the same partitions after the rejoin must not pass them before
they are processed again. Faust's own revoke (its app callback, ``wait_empty`` and commits) runs
here; its assignment callback and the broker's commit are the stand-ins of
``tests/test_faust_proven.py``, and the seek of its recovery is set by hand."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import faust
import pytest
from faust.types import TP
from faust.types.tuples import Message

from .test_faust_assignor import SRC
from .test_faust_proven import HELD, group, zombie_app

__all__ = ["group"]  # the fixture, imported for pytest

S0 = TP(SRC, 0)
#: The broker's committed offset of S0 throughout: the last commit that succeeded.
COMMITTED = 10


def message(offset: int) -> Message:
    return Message(SRC, 0, offset, 0.0, 0, None, b"k", b"v", None)


def forgot_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.INFO and r.getMessage().startswith("forgot ")
    ]


class Worker:
    """A zombie_app's consumer whose stream partition S0 acknowledges events (``ack()`` as its
    agents do) and goes through Faust's own revoke."""

    def __init__(self, tmp_path: Path, group: Any) -> None:
        self.app: faust.App = zombie_app(tmp_path, store="memory://")
        self.group = group(self.app)
        self.consumer: Any = self.app.consumer
        self.app.topics._acking_topics.add(SRC)  # an agent subscribed to it, with acks
        self.consumer._thread._consumer.assignment = lambda: {S0, *HELD}

    async def join(self, member_id: str, generation: int) -> None:
        """A join, then the seek of Faust's recovery: the broker's committed offset."""
        # Faust's futures are made on the consumer's loop (its wait_empty's too).
        self.consumer.loop = asyncio.get_running_loop()
        await self.group.join(member_id, generation, frozenset({S0}))
        self.consumer._committed_offset[S0] = COMMITTED
        self.app.producer._stall_membership(0.0)  # the hold notes the member id

    def ack(self, *offsets: int) -> None:
        for offset in offsets:
            self.consumer.ack(message(offset))

    async def revoke(self, *, finished: list[int], running: list[int], lost: bool) -> None:
        """Faust's revoke with ``running`` events under way (``finished`` acknowledged before
        it), which finish while it waits for them. ``lost``: aiokafka reset the member id first,
        the hold saw it (its changelog sends dropped from then on), and commits fail."""
        events = {offset: message(offset) for offset in finished + running}
        for event in events.values():
            self.consumer.track_message(event)
        for offset in finished:
            self.consumer.ack(events[offset])
        if lost:
            self.group.expire()
            self.group.commits_succeed = False
            self.app.producer._stall_membership(1.0)

        async def finish() -> None:
            await asyncio.sleep(0.01)  # in wait_empty
            for offset in running:
                self.consumer.ack(events[offset])

        finishing = asyncio.ensure_future(finish())
        await self.consumer.on_partitions_revoked({S0, *HELD})
        await finishing
        self.group.commits_succeed = True

    def spy_on_forgetting(self) -> dict[TP, list[int]]:
        """What is acknowledged each time the consumer checks for a loss (first: at the end of
        Faust's revoke, what its revoke left)."""
        seen: dict[TP, list[int]] = {}
        forget = self.consumer._forget_acks_if_lost

        def spy() -> None:
            for tp, offsets in self.consumer._acked.items():
                seen.setdefault(tp, list(offsets))
            forget()

        self.consumer._forget_acks_if_lost = spy
        return seen

    def next_commit(self) -> dict[TP, int]:
        return dict(self.consumer._filter_committable_offsets({S0}))


# (events finished before the revoke, events running at it, the offsets of transaction
# markers, what the revoke leaves acknowledged, the offsets processed again before the next
# commit, and that commit: short of the offset left, whose changelog send was dropped)
CONCURRENT_AGENT = ([12, 13], [10, 11, 14], [], [14], [10, 11, 12, 13], 14)
TRANSACTION_MARKER = ([], [10, 11, 13], [12], [13], [10, 11], 12)


@pytest.mark.parametrize(
    ("finished", "running", "markers", "left", "again", "committed"),
    [CONCURRENT_AGENT, TRANSACTION_MARKER],
    ids=["concurrent-agent", "transaction-marker"],
)
def test_offsets_acknowledged_in_a_lost_membership_s_revoke_are_not_committed_after_it(
    tmp_path: Path,
    group: Any,
    caplog: pytest.LogCaptureFixture,
    finished: list[int],
    running: list[int],
    markers: list[int],
    left: list[int],
    again: list[int],
    committed: int,
) -> None:
    """The revoke's own commit (refused) takes the acknowledgements up to the hole (an event of
    a concurrent agent done before the revoke, or a transaction marker); the rest stays. After
    the rejoin the same partition's commit must stop before the first of them until it is
    processed again: its changelog send was dropped."""
    worker = Worker(tmp_path, group)

    left_by_revoke = worker.spy_on_forgetting()

    async def run() -> dict[TP, int]:
        await worker.join("m-1", 1)
        await worker.revoke(finished=finished, running=running, lost=True)
        assert left_by_revoke[S0] == left  # what Faust's revoke leaves
        assert worker.next_commit() == {}  # a timer's commit during the rejoin passes nothing
        await worker.join("m-2", 2)
        worker.ack(*again)
        for marker in markers:  # the fetch sees the marker's offset missing again
            await worker.consumer._add_gap(S0, marker, marker + 1)
        return worker.next_commit()

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        commit = asyncio.run(run())
    assert worker.app.producer.stall_hold.losses == 1
    assert commit == {S0: committed}  # Faust's own, without the fix: left[0] + 1
    assert forgot_lines(caplog) == [
        f"forgot {len(left)} acknowledged offset(s) of 1 partition(s), not committed: this "
        "worker's group membership was lost since the last assignment, and their events' "
        "changelog sends may have been dropped; they are processed again from the committed "
        "offsets before any commit passes them"
    ]


def test_without_a_loss_the_revoke_s_acknowledgements_are_kept(
    tmp_path: Path, group: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """An ordinary rebalance: the revoke flushed the events' changelog sends, so the next
    commit may pass them (forgetting them would hold that commit back at every rebalance)."""
    worker = Worker(tmp_path, group)
    finished, running, _, left, _, _ = CONCURRENT_AGENT

    async def run() -> dict[TP, int]:
        await worker.join("m-1", 1)
        await worker.revoke(finished=finished, running=running, lost=False)
        await worker.join("m-1", 2)
        assert worker.consumer._acked[S0] == left
        worker.ack(10, 11, 12, 13)
        return worker.next_commit()

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        commit = asyncio.run(run())
    assert worker.app.producer.stall_hold.losses == 0
    assert commit == {S0: 15}
    assert forgot_lines(caplog) == []


def test_an_assignment_after_the_one_that_forgot_forgets_nothing_without_another_loss(
    tmp_path: Path, group: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The count of losses is noted at each assignment: one loss forgets once."""
    worker = Worker(tmp_path, group)
    finished, running, *_ = CONCURRENT_AGENT

    async def run() -> None:
        await worker.join("m-1", 1)
        await worker.revoke(finished=finished, running=running, lost=True)
        await worker.join("m-2", 2)
        worker.ack(20, 22)  # what an ordinary revoke may leave (a hole at 21)
        await worker.join("m-2", 3)

    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        asyncio.run(run())
    assert worker.consumer._acked[S0] == [20, 22]
    assert worker.consumer._acked_index[S0] == {20, 22}
    assert len(forgot_lines(caplog)) == 1


def test_a_loss_forgets_every_partition_s_acknowledgements_and_gaps(
    tmp_path: Path, group: Any
) -> None:
    """Not only the partitions assigned again: one assigned elsewhere would keep its offsets
    until it came back. A gap left over would count an event as done before it ran again."""
    worker = Worker(tmp_path, group)
    elsewhere = TP(SRC, 1)
    finished, running, *_ = CONCURRENT_AGENT

    async def run() -> None:
        await worker.join("m-1", 1)
        await worker.revoke(finished=finished, running=running, lost=True)
        worker.consumer._acked[elsewhere].append(7)
        worker.consumer._acked_index[elsewhere].add(7)
        await worker.consumer._add_gap(S0, 30, 31)
        worker.app.producer.stall_hold.lose(2.0)  # lost again, after the revoke
        await worker.join("m-3", 3)

    asyncio.run(run())
    assert not any(worker.consumer._acked.values())
    assert not any(worker.consumer._acked_index.values())
    assert not worker.consumer._gap
