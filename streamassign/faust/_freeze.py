"""Whether an assigned stream partition is frozen: the logic of the ``streamassign://``
consumer's freeze watch (``streamassign.faust.transport``), apart from Faust and the event
loop, so that it can be tested on a fake clock.

A stream partition that receives nothing while the flow is resumed, the rebalance over, and
the partition has records waiting processes nothing and logs nothing: Faust's own livelock
check speaks after ``stream_processing_timeout`` (5 minutes) at the earliest, and the hold,
flow and recovery watches see only a rebalance under way. Such a partition may stay out of
Faust's active set after a rebalance, or Faust may ask for it while aiokafka's fetch of it
never returns; either lasts until the next rebalance, which may be hours away.

Not frozen: a partition the app paused itself (Faust's public ``pause_partitions``), one
Faust's flow control took out of the fetch because its agent's queue is full, one Faust asks
for whose fetched records aiokafka still holds (in both a slow or loaded worker sets the pace:
its clock restarts at every look), one at its highwater, and every partition while the flow
is stopped. A partition still while nothing else of the worker moves either is left alone
unless it is paused in Faust's consumer: a worker whose fetching stopped altogether (its
producer's buffer full, a broker away) has other lines saying so."""

from __future__ import annotations

from collections.abc import Mapping

import attrs
from faust.types import TP

__all__ = ["FreezeWatch", "Frozen", "StreamLook"]


@attrs.frozen
class StreamLook:
    """What the watch reads of one assigned stream partition at a look."""

    #: aiokafka's fetch position (the next offset it hands to Faust); None if unknown.
    position: int | None
    #: The partition's highwater as aiokafka last fetched it; None if unknown.
    highwater: int | None
    #: Out of Faust's active set without Faust's flow control or the app having taken it
    #: out: nothing of it can reach the agents until it is resumed.
    paused_by_faust: bool = False
    #: In Faust's buffer-full set: its agent's queue is full (Faust resumes it as it drains).
    buffer_full: bool = False
    #: aiokafka holds fetched records of it not handed to Faust yet: while Faust asks for it,
    #: the worker's own pace (a slow or loaded worker), not the fetch, keeps it still.
    records_buffered: bool = False

    @property
    def waits_for_the_worker(self) -> bool:
        return self.buffer_full or (self.records_buffered and not self.paused_by_faust)


@attrs.frozen
class Frozen:
    """A stream partition the watch found frozen."""

    partition: TP
    position: int | None
    highwater: int | None
    #: Seconds its position has not moved.
    still_for: float
    paused_by_faust: bool

    @property
    def lag(self) -> int | None:
        if self.position is None or self.highwater is None:
            return None
        return self.highwater - self.position


@attrs.define
class _Still:
    position: int | None
    since: float
    #: The worker's count of received records when the position last moved.
    received: int


@attrs.define
class FreezeWatch:
    """Follows the assigned stream partitions' positions from look to look.

    ``look`` returns the partitions that became frozen at this look (each once per freeze)
    and those that moved again after being reported; ``restart`` forgets every clock (the
    flow stopped or a rebalance began: nothing can move then)."""

    #: Seconds a partition with records waiting may not move before it counts as frozen.
    bound: float
    _still: dict[TP, _Still] = attrs.field(factory=dict)
    _told: set[TP] = attrs.field(factory=set)

    def restart(self) -> None:
        """Every clock restarts, and a freeze told ends (a rebalance reassigns and seeks)."""
        self._still.clear()
        self._told.clear()

    def look(
        self, now: float, streams: Mapping[TP, StreamLook], received: int
    ) -> tuple[list[Frozen], list[TP]]:
        """``streams``: every assigned stream partition not paused by the app; ``received``:
        the worker's count of records received so far (any partition), which tells a worker
        still fetching from one whose fetching stopped altogether."""
        for gone in self._still.keys() - streams.keys():
            del self._still[gone]
        self._told &= streams.keys()
        frozen: list[Frozen] = []
        moving: list[TP] = []
        for tp, look in streams.items():
            still = self._still.get(tp)
            if still is None or look.waits_for_the_worker or still.position != look.position:
                self._still[tp] = _Still(look.position, now, received)
                if tp in self._told and still is not None and still.position != look.position:
                    self._told.discard(tp)
                    moving.append(tp)
                continue
            if tp in self._told or now - still.since < self.bound or not _lags(look):
                continue
            if look.paused_by_faust or received != still.received:
                self._told.add(tp)
                frozen.append(
                    Frozen(
                        tp, look.position, look.highwater, now - still.since, look.paused_by_faust
                    )
                )
        return frozen, moving


def _lags(look: StreamLook) -> bool:
    """Records wait for it: its highwater is above its position (unknown for a partition never
    fetched in this assignment: only a partition paused in Faust's consumer counts then)."""
    if look.position is None or look.highwater is None:
        return look.paused_by_faust
    return look.highwater > look.position
