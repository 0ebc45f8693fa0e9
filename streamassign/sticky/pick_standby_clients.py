"""Where the next standby copy goes: the clients with standby room left, best placement first.

Both paths of the sticky assignor place the standbys they could not keep warm through this
queue. For one copy of a task it takes the client with the most standby room left (then the
lowest index) among those that share no rack and no tag value (KIP-708 / KIP-925 style: ``zone``,
``cluster``, ...) with the clients already holding the task — its active and its other standbys.
When none avoids them all, the fewest conflicts wins among the first ``RACK_SCAN`` clients by
room: placement degrades, the assignment stays valid.

Spread: callers hand it copies grouped by active client, so with room taken in turn consecutive
copies of one client's tasks land on different clients; and a client already holding its fair
share of one active client's standbys yields to the next few by room. When a client is lost,
its tasks then have warm copies on many survivors rather than all on one neighbour.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

#: Candidates (by most room) examined for one not yet holding its fair share of the owner's.
SPREAD = 4
#: Candidates examined at most while looking for one without rack or tag conflicts.
RACK_SCAN = 64
#: Groups whose ``costs`` are remembered at once (a bound on memory; the memo then restarts).
_MEMO = 1 << 14


class StandbyQueue:
    """Clients with standby room; ``room`` is shared with the caller, who may lower it too
    (entries are re-checked lazily)."""

    def __init__(
        self,
        room: list[int],
        racks: Sequence[str | None] | None = None,
        tags: Sequence[Mapping[str, str]] | None = None,
        tag_keys: Sequence[str] | None = None,
        backups: Sequence[int] | None = None,
    ) -> None:
        self.room = room
        # Spread: a client already holding its fair share of one active client's standbys
        # (``backups[owner]`` copies over the other clients) yields to the next one by room.
        others = max(1, len(room) - 1)
        self._fair: list[int] | None = None
        if backups is not None:
            self._fair = []
            for b in backups:
                self._fair.append(-(-b // others))
        self._pairs: dict[tuple[int, int], int] = {}
        self._heap = []
        for ci, left in enumerate(room):
            if left > 0:
                self._heap.append((-left, ci))
        heapq.heapify(self._heap)
        self._racks = None
        self._tags = None
        self._keys: list[str] = []
        # Racks matter unless every client is in the same one (or none reports one). One known
        # rack beside clients without one still counts: two clients in it share a rack.
        if racks is not None and len(set(racks)) > 1:
            self._racks = racks
        if tags is not None:
            keys = set(tag_keys) if tag_keys is not None else {k for t in tags for k in t}
            if keys:
                self._tags = tags
                self._keys = sorted(keys)
        #: ``kinds()``, built at its first call (the first rack-aware pick or exchange).
        self._kinds: tuple[list[int], list[int]] | None = None
        #: ``costs`` by the kinds in a group (only while there are at most ``RACK_SCAN`` kinds).
        self._costs: dict[tuple[int, ...], list[int]] = {}
        #: Whether racks or tags take part in placement.
        self.aware = self._racks is not None or self._tags is not None
        #: Per client and column (subtopology), copies it holds and the most it should hold;
        #: empty unless ``balance_columns`` was called.
        self._column_counts: list[list[int]] = []
        self._column_ceilings: Sequence[Sequence[int]] = []

    def balance_columns(self, counts: list[list[int]], ceilings: Sequence[Sequence[int]]) -> None:
        """Spread each client's copies over the columns: a client already holding
        ``ceilings[client][column]`` copies of a column yields to the next ones by room, as a
        crowded one does. Without this, clients taken in turn by room meet the copies of each
        active client in the same order, and a client can get all its copies from one column.
        ``counts`` (copies held now) is kept current by ``pick`` (not by swaps outside it:
        this steers placement only, ``even_standbys`` then evens out what is left)."""
        self._column_counts, self._column_ceilings = counts, ceilings

    def _column_full(self, client: int, column: int) -> bool:
        counts = self._column_counts
        return bool(counts) and counts[client][column] >= self._column_ceilings[client][column]

    def conflicts(self, client: int, group: Sequence[int]) -> int:
        """Rack and tag values client ``client`` shares with the clients in ``group``."""
        count = 0
        racks, tags = self._racks, self._tags
        if (
            racks is not None
            and racks[client] is not None
            and any(racks[client] == racks[g] for g in group)
        ):
            count += 1
        if tags is not None:
            mine = tags[client]
            for key in self._keys:
                value = mine.get(key)
                if value is not None and any(tags[g].get(key) == value for g in group):
                    count += 1
        return count

    def costs(self, group: Sequence[int]) -> list[int]:
        """``conflicts`` with ``group`` of each kind of client, by ``kinds()`` id. They depend only
        on which kinds the group holds, and groups repeat: with at most ``RACK_SCAN`` kinds
        they are remembered per such set."""
        kind, examples = self.kinds()
        if len(examples) > RACK_SCAN:
            return [self.conflicts(ci, group) for ci in examples]
        key = tuple(sorted({kind[g] for g in group}))
        got = self._costs.get(key)
        if got is None:
            if len(self._costs) >= _MEMO:
                self._costs.clear()
            got = self._costs[key] = [self.conflicts(ci, group) for ci in examples]
        return got

    def kinds(self) -> tuple[list[int], list[int]]:
        """Per client, an id shared by the clients with equal rack and tag values (on the keys
        placement weighs: they have the same ``conflicts`` with any group), numbered in client
        order; and the first client of each kind. Computed once."""
        if self._kinds is None:
            ids: dict[tuple[str | None, tuple[str | None, ...]], int] = {}
            kind: list[int] = []
            examples: list[int] = []
            racks, tags, keys = self._racks, self._tags, self._keys
            for client in range(len(self.room)):
                rack = racks[client] if racks is not None else None
                values = tuple(tags[client].get(k) for k in keys) if tags is not None else ()
                k = ids.setdefault((rack, values), len(ids))
                if k == len(examples):
                    examples.append(client)
                kind.append(k)
            self._kinds = (kind, examples)
        return self._kinds

    def pick(self, owner: int, held: Sequence[int], column: int = 0) -> int:
        """The client for one more copy, of ``column``, of a task active on ``owner`` and held
        by ``held`` (-1: every client with room is ``owner`` or in ``held``); its room drops by
        one."""
        fair = self._fair[owner] if self._fair is not None else 0
        if not self.aware:
            client = self._most_room_if_free(owner, held, fair, column)
            if client >= 0:
                return self._take(client, owner, column)
        client = self._fewest_conflicts_then_most_room(owner, held, fair, column)
        return -1 if client < 0 else self._take(client, owner, column)

    def _most_room_if_free(self, owner: int, held: Sequence[int], fair: int, column: int) -> int:
        """The common case, short: the client with most room, taken off the heap, when it is
        free to take the copy (-1: not that simple, the full search decides)."""
        room, heap, pairs = self.room, self._heap, self._pairs
        while heap:
            neg, client = heap[0]
            if -neg == room[client]:
                if (
                    client == owner
                    or client in held
                    or pairs.get((owner, client), 0) >= fair
                    or self._column_full(client, column)
                ):
                    return -1
                heapq.heappop(heap)
                return client
            heapq.heappop(heap)  # stale entry
            if room[client] > 0:
                heapq.heappush(heap, (-room[client], client))
        return -1

    def _fewest_conflicts_then_most_room(
        self, owner: int, held: Sequence[int], fair: int, column: int
    ) -> int:
        """Among clients by most room: fewest rack and tag conflicts, then not yet holding its
        fair share of ``owner``'s copies nor its most of ``column``, then most room (-1: none
        may take the copy). The client found is off the heap; the others looked at go back."""
        room, heap, pairs = self.room, self._heap, self._pairs
        group = [owner, *held] if self.aware else []
        costs, least, kind = self._conflict_costs(group)
        seen: list[tuple[int, int]] = []
        looked = 0  # clients looked at that may take the copy
        best: tuple[int, bool, bool, int, int] | None = None
        # Clients come off the heap by (most room, lowest index), so once the best is neither
        # crowded nor full, a later one with as many conflicts cannot beat it: skip its checks
        # (the same result; with one rack beside unknown ones, most clients looked at are so).
        settled = False
        while heap:
            neg, client = heapq.heappop(heap)
            if -neg != room[client]:
                if room[client] > 0:
                    heapq.heappush(heap, (-room[client], client))
                continue
            seen.append((neg, client))
            if client == owner or client in held:
                continue
            looked += 1
            if costs is not None:
                conflicts = costs[kind[client]]
            else:
                conflicts = self.conflicts(client, group) if self.aware else 0
            if best is None or conflicts < best[0] or (conflicts == best[0] and not settled):
                crowded = pairs.get((owner, client), 0) >= fair
                full = self._column_full(client, column)
                if best is None or (conflicts, crowded, full, neg, client) < best:
                    best = (conflicts, crowded, full, neg, client)
                    settled = not (crowded or full)
            if best[0] == least and (settled or looked >= SPREAD):
                break  # most room, fewest conflicts, not crowded nor full (or looked enough)
            if len(seen) >= RACK_SCAN:
                break  # the fewest conflicts found
        for entry in seen:
            if best is None or entry[1] != best[4]:
                heapq.heappush(heap, entry)
        return -1 if best is None else best[4]

    def _conflict_costs(self, group: list[int]) -> tuple[list[int] | None, int, list[int]]:
        """Conflicts with ``group`` by kind of client, the fewest any kind could have, and each
        client's kind (``None``, 0, ``[]`` when not weighed by kind). Once a client with the
        fewest is found, the most room wins as with none (the scan would not find fewer; more
        copies than racks land here). With more kinds than one scan looks at, only a
        conflict-free client stops the scan early."""
        if not self.aware:
            return None, 0, []
        kind, examples = self.kinds()
        if len(examples) > RACK_SCAN:
            return None, 0, kind
        costs = self.costs(group)
        return costs, min(costs), kind

    def _take(self, client: int, owner: int, column: int) -> int:
        """Client ``client`` (off the heap) takes a copy of ``column`` of a task active on
        ``owner``."""
        room = self.room
        room[client] -= 1
        if self._column_counts:
            self._column_counts[client][column] += 1
        if room[client] > 0:
            heapq.heappush(self._heap, (-room[client], client))
        if self._fair is not None:
            self._pairs[(owner, client)] = self._pairs.get((owner, client), 0) + 1
        return client
