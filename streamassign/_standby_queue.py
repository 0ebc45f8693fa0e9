"""Where the next standby copy goes: the clients with standby room left, best placement first.

Both paths of the sticky assignor place the standbys they could not keep warm through this
queue. For one copy of a task it takes the client with the most standby room left (then the
lowest index) among those that share no rack and no tag value (KIP-708 / KIP-925 style: ``zone``,
``cluster``, ...) with the clients already holding the task — its active and its other standbys.
When none avoids them all, the fewest conflicts wins among the first ``RACK_SCAN`` clients by
room: placement degrades, the assignment stays valid.

Callers hand it copies grouped by active client: with room taken in turn, consecutive copies
of one client's tasks then land on different clients, so when a client is lost its tasks have
warm copies on many survivors rather than all on one neighbour.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

#: Candidates examined at most while looking for one without rack or tag conflicts.
RACK_SCAN = 64


class StandbyQueue:
    """Clients with standby room; ``room`` is shared with the caller, who may lower it too
    (entries are re-checked lazily)."""

    def __init__(
        self,
        room: list[int],
        racks: Sequence[str | None] | None = None,
        tags: Sequence[Mapping[str, str]] | None = None,
        tag_keys: Sequence[str] | None = None,
    ) -> None:
        self.room = room
        self._heap = [(-left, ci) for ci, left in enumerate(room) if left > 0]
        heapq.heapify(self._heap)
        self._racks = racks if racks is not None and len(set(racks) - {None}) > 1 else None
        keys = sorted({k for t in tags or () for k in t} if tag_keys is None else set(tag_keys))
        self._tags = tags if tags is not None and keys else None
        self._keys = keys

    @property
    def aware(self) -> bool:
        """Whether racks or tags take part in placement."""
        return self._racks is not None or self._tags is not None

    def conflicts(self, ci: int, group: Sequence[int]) -> int:
        """Rack and tag values client ``ci`` shares with the clients in ``group``."""
        n = 0
        racks, tags = self._racks, self._tags
        if (
            racks is not None
            and racks[ci] is not None
            and any(racks[ci] == racks[g] for g in group)
        ):
            n += 1
        if tags is not None:
            mine = tags[ci]
            for k in self._keys:
                v = mine.get(k)
                if v is not None and any(tags[g].get(k) == v for g in group):
                    n += 1
        return n

    def pick(self, owner: int, held: Sequence[int]) -> int:
        """The client for one more copy of a task active on ``owner`` and held by ``held``
        (-1: every client with room is ``owner`` or in ``held``); its room drops by one."""
        room, heap = self.room, self._heap
        aware = self.aware
        group = [owner, *held] if aware else []
        seen: list[tuple[int, int]] = []
        best: tuple[int, int, int] | None = None
        while heap:
            neg, ci = heapq.heappop(heap)
            if -neg != room[ci]:
                if room[ci] > 0:
                    heapq.heappush(heap, (-room[ci], ci))
                continue
            seen.append((neg, ci))
            if ci == owner or ci in held:
                continue
            conflicts = self.conflicts(ci, group) if aware else 0
            if best is None or (conflicts, neg, ci) < best:
                best = (conflicts, neg, ci)
            if best[0] == 0 or len(seen) >= RACK_SCAN:
                break  # the most room among those without conflicts, or the fewest found
        for entry in seen:
            if best is None or entry[1] != best[2]:
                heapq.heappush(heap, entry)
        if best is None:
            return -1
        ci = best[2]
        room[ci] -= 1
        if room[ci] > 0:
            heapq.heappush(heap, (-room[ci], ci))
        return ci
