"""The changelog offsets a worker's tables may trust after it lost its group membership.

Faust's RocksDB store persists, per changelog partition, the offset of the last record it
applied, and its table recovery reads the changelog from there. It also persists the offset of
each record the worker itself wrote to the changelog (``Table._on_changelog_sent``), which is
right only while nobody else writes that partition. A worker stalled past its session timeout
(SIGSTOP, a long GC, a frozen VM) is a zombie when it resumes: its partitions belong to
another worker of a newer generation, which writes them, and the zombie still processes what
it holds until its heartbeat or commit learns that its member id is unknown. Its own writes
land after the other worker's in the changelog, so the offset it persists passes records it
never applied; the next generation hands the partition back, the recovery reads nothing, and
the table lacks the other worker's updates for good.

Kafka Streams closes such tasks dirty (``TaskMigratedException``) and restores them from its
last checkpoint, which it writes only after a commit. This does the same with Faust's store:
per changelog partition of the worker's active tables it keeps the persisted offset at the
last moment the membership was proven (``ProvenOffsets``), and after a membership loss it
rewinds each partition held during it to that offset before Faust's recovery reads them, so
the recovery replays the changelog from there in order (the other worker's records and the
zombie's own). Proven means:

- an assignment (a completed join): the offsets on disk then are what earlier proven
  memberships or the recovery's reads left (the flow is stopped from the revoke on, and the
  revoke flushed the producer before the join);
- a completed table recovery: read from the changelog, not written;
- a successful offset commit under the member id of the assignment (the broker refuses one
  from an unknown member or a stale generation), snapshotted after Faust's producer flush
  and before the commit was sent.

A membership loss is a new aiokafka member id at an assignment: aiokafka keeps its id across
rebalances and only forgets it when the broker answers UnknownMemberId or IllegalGeneration
(``reset_generation``), as ``streamassign.aiokafka.rejoin.membership`` reads it. A join under
the same id proves the previous generation's writes (with Faust's default
``stream_wait_empty=True``: its revoke waits for the events in flight; with it off an agent
may still write a revoked partition after the flush), so nothing is rewound then. An
assignment whose member id reads as "" (a heartbeat reset it between the join and the
listener) tells nothing: it is compared with nothing, and the next one is compared with the
last real id.

A loss before Faust's table recovery completed since the last assignment rewinds nothing: the
worker processed nothing in between (Faust pauses every assigned partition at the assignment,
``app/base.py:1885-1886`` in faust-streaming 0.15.3, and resumes the stream partitions only
after ``on_rebalance_complete``, ``tables/recovery.py:628`` then ``:649``, or ``:309`` then
``:316`` when there is no table to recover), so everything on disk since the assignment was
read from the changelog, and a restore a session loss interrupts goes on where it was instead
of starting again (on a CPU-starved host it might otherwise never finish).

Only stores that persist an offset are touched (RocksDB; Faust's memory store reports none,
and its recovery's ``active_offsets`` of a partition it keeps are the last offsets it read,
never its own writes, so it replays from there anyway).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
from faust.types import TP

__all__ = ["NOTHING_APPLIED", "ProvenOffsets", "Rewind", "changelog_stores"]

log = logging.getLogger("streamassign.faust")

#: The persisted offset of a partition restored from the start of its changelog: Faust's own
#: "nothing applied" (its recovery seeks -1 as 0; ``applied_offset_sum`` counts it as 0).
NOTHING_APPLIED = -1


@attrs.frozen
class Rewind:
    """A changelog partition whose persisted offset was moved back: ``was`` -> ``to``."""

    tp: TP
    was: int
    to: int

    def describe(self) -> str:
        start = "the start" if self.to == NOTHING_APPLIED else str(self.to)
        return f"{self.tp.topic}[{self.tp.partition}] {self.was} -> {start}"


def changelog_stores(app: Any) -> dict[str, Any]:
    """The store of each table of ``app`` by its changelog topic's name."""
    return {table.changelog_topic_name: table.data for table in app.tables.values()}


def _persisted(stores: Mapping[str, Any], tp: TP) -> int | None:
    """The offset ``tp``'s store persisted (None: none, a store that keeps none, or one it
    cannot read now; logged at DEBUG)."""
    store = stores.get(tp.topic)
    if store is None:
        return None
    try:
        offset = store.persisted_offset(tp)
    except Exception as exc:  # a lock or the disk: nothing known, nothing to prove
        log.debug("cannot read the persisted offset of %s: %r", tp, exc)
        return None
    return None if offset is None else int(offset)


@attrs.define
class ProvenOffsets:
    """Per changelog partition of this worker's active tables, the offset its store persisted
    at the last moment the worker's group membership was proven (see the module docstring).
    Used on Faust's main thread only (the consumer's callbacks and commits)."""

    #: The changelog partitions of the active tables of the current membership.
    held: frozenset[TP] = frozenset()
    #: The last real member id they were assigned under; None before the first assignment
    #: with one (then nothing is rewound: there is no loss to tell).
    held_as: str | None = None
    #: The proven persisted offset of each held partition (None: proven to have none).
    proven: dict[TP, int | None] = attrs.field(factory=dict)
    #: Whether Faust's table recovery completed since the last assignment with a real member
    #: id (until then the worker processed nothing: the module docstring). Cleared before
    #: Faust takes the assignment, so a completion inside its callback still counts.
    recovered_since_assignment: bool = False
    #: Whether the held partitions were taken in an assignment without a real member id
    #: since the last one with it: a recovery's reads then started from unproven offsets
    #: (maybe a zombie's), so its completion proves nothing.
    held_unproven: bool = False

    def snapshot(self, stores: Mapping[str, Any]) -> dict[TP, int | None]:
        """The persisted offsets of the held partitions now (to prove by a commit)."""
        return {tp: _persisted(stores, tp) for tp in self.held}

    def prove(self, snapshot: Mapping[TP, int | None]) -> None:
        """A commit taken after ``snapshot`` succeeded under the member id of ``held``."""
        self.proven.update({tp: o for tp, o in snapshot.items() if tp in self.held})

    def rewind_if_lost(self, member_id: str | None, stores: Mapping[str, Any]) -> list[Rewind]:
        """Before Faust reads the persisted offsets of an assignment made under
        ``member_id``: if it differs from the one the held partitions were assigned under,
        rewind each held partition whose store persisted past its proven offset (to the start
        of its changelog when none is proven), unless Faust's recovery has not completed
        since the last assignment (then nothing is its own write). One WARNING names them.
        Without a real ``member_id`` ("" or None) nothing is compared or reset."""
        if not member_id:
            return []  # tells nothing: compared with the last real id at the next one
        recovered, self.recovered_since_assignment = self.recovered_since_assignment, False
        if self.held_as is None or member_id == self.held_as or not recovered:
            return []
        rewound = [r for tp in sorted(self.held) if (r := self._rewind(tp, stores)) is not None]
        if rewound:
            log.warning(
                "this worker lost its group membership (member id %s, now %s) while it held "
                "%d table changelog partitions; what it wrote to them since the membership "
                "was last proven may have passed another worker's writes (a zombie after a "
                "stall past the session timeout), so %d persisted offsets are rewound to the "
                "last proven ones and their recovery replays the changelog from there: %s",
                self.held_as,
                member_id,
                len(self.held),
                len(rewound),
                ", ".join(r.describe() for r in rewound[:10])
                + (f" and {len(rewound) - 10} more" if len(rewound) > 10 else ""),
            )
        return rewound

    def assigned(
        self, member_id: str | None, held: Iterable[TP], stores: Mapping[str, Any]
    ) -> None:
        """Faust has taken an assignment made under ``member_id`` with ``held`` its active
        changelog partitions: their persisted offsets are proven (see the module docstring).
        Without a real ``member_id`` it proves nothing: the held partitions and their proofs
        stay, and those it adds are proven as they are (not held since the last proof, so not
        written by this worker since)."""
        if not member_id:
            added = frozenset(held) - self.held
            self.held |= added
            self.proven.update({tp: _persisted(stores, tp) for tp in added})
            self.held_unproven = True
            return
        self.held, self.held_as, self.held_unproven = frozenset(held), member_id, False
        self.proven = self.snapshot(stores)

    def recovered(self, stores: Mapping[str, Any]) -> None:
        """Faust's table recovery completed: the held partitions' offsets are what it read
        (from proven ones unless the assignment had no real member id)."""
        if not self.held_unproven:
            self.proven = self.snapshot(stores)
        self.recovered_since_assignment = True

    def _rewind(self, tp: TP, stores: Mapping[str, Any]) -> Rewind | None:
        was = _persisted(stores, tp)
        if was is None:
            return None  # a store that persists nothing, or nothing to trust anyway
        proven = self.proven.get(tp)
        to = NOTHING_APPLIED if proven is None else proven
        if was <= to:
            return None
        try:
            stores[tp.topic].set_persisted_offset(tp, to)
        except Exception:  # the partition keeps its offset: say so, it may miss records
            log.exception("cannot rewind the persisted offset of %s from %d to %d", tp, was, to)
            return None
        return Rewind(tp, was, to)
