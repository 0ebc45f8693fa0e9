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
listener) or cannot be read proves no membership, so it counts as a loss (at worst a needless
rewind: the records since the last proof are replayed), and so does the next one, whatever its
id: the worker may have processed as a zombie of that void membership. Deferring the
comparison to the next real id instead let Faust's recovery of the void assignment read
offsets a zombie had moved, and process on them.

A restart is a loss too: the proofs are kept in ``<appdir>/streamassign/proven-offsets.json``
(``ProofsFile``), written at each proof, so a worker killed (kill -9, OOM) while it was a
zombie does not restart from the offsets its zombie writes left. At its first assignment the
partitions of that file are rewound to their proofs as after a lost membership (a worker
killed while healthy then replays only what it wrote since its last commit). No file (the
first start with this version, in-memory tables, exactly_once) changes nothing; a damaged one
is logged and every changelog partition of the first assignment is restored from its start.

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

import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
from faust.types import TP

from ..errors import DamagedStateError
from ..files import loads_json, write_atomically
from ._stores import disk_store, keeps_state_on_disk

__all__ = [
    "NOTHING_APPLIED",
    "PROOFS_FILE",
    "ProofsFile",
    "ProvenOffsets",
    "Rewind",
    "changelog_stores",
    "proofs_file",
]

log = logging.getLogger("streamassign.faust")

#: The persisted offset of a partition restored from the start of its changelog: Faust's own
#: "nothing applied" (its recovery seeks -1 as 0; ``applied_offset_sum`` counts it as 0).
NOTHING_APPLIED = -1
#: The proofs file's name in ``<appdir>/streamassign``.
PROOFS_FILE = "proven-offsets.json"
#: The version of its format this code writes and reads.
_PROOFS_VERSION = 1


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
    return {table.changelog_topic_name: disk_store(table) for table in app.tables.values()}


def _persisted(stores: Mapping[str, Any], tp: TP) -> tuple[bool, int | None]:
    """Whether ``tp``'s persisted offset could be read, and what it is (None: none, or a store
    that keeps none). A store that cannot be read now (a lock, the disk) is logged at DEBUG."""
    store = stores.get(tp.topic)
    if store is None:
        return True, None
    try:
        offset = store.persisted_offset(tp)
    except Exception as exc:  # a lock or the disk: nothing known, nothing to prove
        log.debug("cannot read the persisted offset of %s: %r", tp, exc)
        return False, None
    return True, None if offset is None else int(offset)


def _snapshot(stores: Mapping[str, Any], tps: Iterable[TP]) -> dict[TP, int | None]:
    """The persisted offsets of ``tps`` that can be read now."""
    read = {tp: _persisted(stores, tp) for tp in tps}
    return {tp: offset for tp, (readable, offset) in read.items() if readable}


def proofs_file(app: Any, stores: Mapping[str, Any]) -> ProofsFile | None:
    """Where ``app``'s worker keeps its proofs: in its open ``<appdir>/streamassign`` (the
    assignor's), if it has a table whose store keeps its state on disk (the others persist
    no offset, so they have nothing to prove)."""
    state_path = getattr(app.assignor, "state_path", None)
    path = state_path() if callable(state_path) else None
    if path is None or not any(keeps_state_on_disk(store) for store in stores.values()):
        return None
    return ProofsFile(path / PROOFS_FILE)


@attrs.frozen
class SavedProofs:
    """What a proofs file holds: the proven offsets of the partitions held at the last proof
    (None: none proven) and whether Faust's recovery had completed since the assignment."""

    proven: dict[TP, int | None]
    recovered: bool


@attrs.define
class ProofsFile:
    """``<appdir>/streamassign/proven-offsets.json``: the proofs of the last run, written at
    each proof (atomically: a kill leaves the old file or the new one)."""

    path: Path
    #: The bytes last written: a proof that changed nothing is not written again.
    written: bytes | None = None
    #: Whether a failed write was logged (a WARNING once, then DEBUG: commits are frequent).
    write_failure_told: bool = False

    def read(self) -> SavedProofs | None:
        """The saved proofs; None when there is no file. ``DamagedStateError`` when it cannot
        be read or parsed, or is of a version this code does not know."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise DamagedStateError(f"{self.path}: unreadable: {exc}") from exc
        data = loads_json(raw, DamagedStateError, str(self.path))
        try:
            if data["version"] != _PROOFS_VERSION:
                raise DamagedStateError(f"{self.path}: unknown version {data['version']!r}")
            proven = {
                TP(str(topic), int(partition)): None if offset is None else int(offset)
                for topic, partitions in data["proven"].items()
                for partition, offset in partitions.items()
            }
            return SavedProofs(proven, bool(data["recovered"]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DamagedStateError(f"{self.path}: not a proofs file: {exc!r}") from exc

    def write(self, proven: Mapping[TP, int | None], recovered: bool) -> None:
        """Save ``proven``; a failure is logged (the proofs stay in memory: only a restart
        loses them, as before there was a file)."""
        by_topic: dict[str, dict[str, int | None]] = {}
        for tp, offset in sorted(proven.items()):
            by_topic.setdefault(tp.topic, {})[str(tp.partition)] = offset
        data = {"version": _PROOFS_VERSION, "recovered": recovered, "proven": by_topic}
        raw = json.dumps(data, sort_keys=True).encode()
        if raw == self.written:
            return
        try:
            # Not fsynced: the file covers a process that dies (its page cache survives); a
            # host crash also loses Faust's unsynced RocksDB writes, and an older or torn
            # file then costs a replay or the damaged-file rule, never a record.
            write_atomically(self.path, raw, durable=False)
        except OSError as exc:
            level = logging.DEBUG if self.write_failure_told else logging.WARNING
            self.write_failure_told = True
            log.log(level, "cannot save the proven changelog offsets to %s: %s", self.path, exc)
            return
        self.written = raw


@attrs.define
class ProvenOffsets:
    """Per changelog partition of this worker's active tables, the offset its store persisted
    at the last moment the worker's group membership was proven (see the module docstring).
    Used on Faust's main thread only (the consumer's callbacks and commits)."""

    #: The changelog partitions of the active tables of the current membership.
    held: frozenset[TP] = frozenset()
    #: The member id they were assigned under: None before the first assignment (nothing to
    #: rewind then), "" when none could be read or they come from the last run's file (no
    #: assignment's id is ever the same).
    held_as: str | None = None
    #: The proven persisted offset of each held partition (None: proven to have none; absent:
    #: unreadable at every proof since it was assigned, so rewound to the start if needed).
    proven: dict[TP, int | None] = attrs.field(factory=dict)
    #: Whether Faust's table recovery completed since the last assignment (until then the
    #: worker processed nothing: the module docstring). Cleared before Faust takes the
    #: assignment, so a completion inside its callback still counts.
    recovered_since_assignment: bool = False
    #: Where the proofs are saved (None: in memory only).
    file: ProofsFile | None = None
    #: Whether the held partitions are the last run's (the WARNING's wording).
    held_by_last_run: bool = False
    #: Whether ``open`` ran (at the first assignment of this run).
    opened: bool = False

    def open(self, file: ProofsFile | None, assigned: Iterable[TP]) -> None:
        """At the first assignment of this run, before ``rewind_if_lost``: take the last run's
        proofs from ``file`` as those of a lost membership, and save the next ones there. No
        file: nothing to take. A damaged one: one WARNING, and every partition of ``assigned``
        counts as held with nothing proven (restored from the start of its changelog): the
        partitions the last run wrote are unknown, and trusting the disk may lose records."""
        self.file, self.opened = file, True
        if file is None:
            return
        try:
            saved = file.read()
        except DamagedStateError as exc:
            log.warning(
                "cannot use the proven changelog offsets of the last run (%s): every table "
                "changelog partition assigned now is restored from the start of its "
                "changelog, as the last run's writes to them cannot be told from others",
                exc,
            )
            saved = SavedProofs({}, recovered=True)
            self.held = frozenset(assigned)
        if saved is None:
            return
        self.held = self.held | frozenset(saved.proven)
        self.held_as, self.held_by_last_run = "", True
        self.proven = dict(saved.proven)
        self.recovered_since_assignment = saved.recovered

    def snapshot(self, stores: Mapping[str, Any]) -> dict[TP, int | None]:
        """The persisted offsets of the held partitions now (to prove by a commit); those that
        cannot be read now are left out (they keep their last proof)."""
        return _snapshot(stores, self.held)

    def prove(self, snapshot: Mapping[TP, int | None]) -> None:
        """A commit taken after ``snapshot`` succeeded under the member id of ``held``."""
        self.proven.update({tp: o for tp, o in snapshot.items() if tp in self.held})
        self._save()

    def rewind_if_lost(self, member_id: str | None, stores: Mapping[str, Any]) -> list[Rewind]:
        """Before Faust reads the persisted offsets of an assignment made under
        ``member_id``: if it is not the one the held partitions were assigned under (or
        either is not a real id), rewind each held partition whose store persisted past its
        proven offset (to the start of its changelog when none is proven), unless Faust's
        recovery has not completed since the last assignment (then nothing is its own
        write). One WARNING names them."""
        recovered, self.recovered_since_assignment = self.recovered_since_assignment, False
        if self.held_as is None or not recovered:
            return []
        if member_id and member_id == self.held_as:
            return []
        rewound = [r for tp in sorted(self.held) if (r := self._rewind(tp, stores)) is not None]
        if rewound:
            log.warning(
                "%s while it held %d table changelog partitions; what it wrote to them since "
                "the membership was last proven may have passed another worker's writes (a "
                "zombie after a stall past the session timeout), so %d persisted offsets are "
                "rewound to the last proven ones and their recovery replays the changelog "
                "from there: %s",
                self._loss(member_id),
                len(self.held),
                len(rewound),
                ", ".join(r.describe() for r in rewound[:10])
                + (f" and {len(rewound) - 10} more" if len(rewound) > 10 else ""),
            )
        return rewound

    def _loss(self, member_id: str | None) -> str:
        if self.held_by_last_run:
            return "this worker restarted (its last run may have ended as a zombie)"
        return (
            f"this worker lost its group membership (member id {self.held_as or 'unknown'}, "
            f"now {member_id or 'unknown'})"
        )

    def assigned(
        self, member_id: str | None, held: Iterable[TP], stores: Mapping[str, Any]
    ) -> None:
        """Faust has taken an assignment made under ``member_id`` with ``held`` its active
        changelog partitions: their persisted offsets are proven (see the module docstring;
        those unreadable now keep an earlier proof)."""
        self.held, self.held_as, self.held_by_last_run = frozenset(held), member_id or "", False
        earlier = {tp: o for tp, o in self.proven.items() if tp in self.held}
        self.proven = earlier | self.snapshot(stores)
        self._save()

    def recovered(self, stores: Mapping[str, Any]) -> None:
        """Faust's table recovery completed: the held partitions' offsets are what it read
        (from proven ones: a loss before its assignment was rewound)."""
        self.proven.update(self.snapshot(stores))
        self.recovered_since_assignment = True
        self._save()

    def _save(self) -> None:
        if self.file is not None:
            proven = {tp: self.proven.get(tp) for tp in self.held}
            self.file.write(proven, self.recovered_since_assignment)

    def _rewind(self, tp: TP, stores: Mapping[str, Any]) -> Rewind | None:
        _, was = _persisted(stores, tp)
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
