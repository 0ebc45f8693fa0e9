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
(``ProofsFile``), written atomically at each proof, so a worker killed (kill -9, OOM) while it was
a zombie does not restart from the offsets its zombie writes left. At its first assignment the
partitions of that file this assignment gives the worker (actives and standbys, whose databases
Faust opens anyway) are rewound to their proofs as after a lost membership (a worker killed
while healthy then replays what was written since its last commit); the others, and after a
loss within a run the held partitions assigned elsewhere now, are carried (``carried``, in
memory and in the file) and rewound when first assigned here again: reading or rewinding them
now would open, in Faust's store, databases it never closes, whose stale keys Faust's reads
outside an event would then answer from. No file (the first start with this version; a run
that does not maintain it, exactly_once or no table on disk, removes a leftover one, which a
later run would otherwise apply to a disk that moved past it) changes nothing, nor does one of
an unknown version (a newer release's, after a rollback); a garbled one is logged and every
changelog partition of the first assignment is restored from its start.

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


def proofs_file(
    app: Any, stores: Mapping[str, Any], *, maintained: bool = True
) -> ProofsFile | None:
    """Where ``app``'s worker keeps its proofs: in its open ``<appdir>/streamassign`` (the
    assignor's), if it has a table whose store keeps its state on disk (the others persist
    no offset, so they have nothing to prove) and the run ``maintained`` them (not under
    exactly_once). A run that keeps none removes a leftover file: a later run would apply its
    proofs to a disk this one moved past (a replay of everything since). Without an open
    directory nothing is touched (it may be another live worker's)."""
    state_path = getattr(app.assignor, "state_path", None)
    path = state_path() if callable(state_path) else None
    if path is None:
        return None
    file = ProofsFile(path / PROOFS_FILE)
    if maintained and any(keeps_state_on_disk(store) for store in stores.values()):
        return file
    file.discard()
    return None


@attrs.frozen
class SavedProofs:
    """What a proofs file holds: the proven offsets of the partitions held at the last proof
    (None: none proven), whether Faust's recovery had completed since the assignment, and the
    proofs carried for partitions to rewind when next assigned (``ProvenOffsets.carried``)."""

    proven: dict[TP, int | None]
    recovered: bool
    carried: dict[TP, int | None] = attrs.field(factory=dict)


def _offsets(by_topic: Any) -> dict[TP, int | None]:
    return {
        TP(str(topic), int(partition)): None if offset is None else int(offset)
        for topic, partitions in by_topic.items()
        for partition, offset in partitions.items()
    }


def _by_topic(offsets: Mapping[TP, int | None]) -> dict[str, dict[str, int | None]]:
    by_topic: dict[str, dict[str, int | None]] = {}
    for tp, offset in sorted(offsets.items()):
        by_topic.setdefault(tp.topic, {})[str(tp.partition)] = offset
    return by_topic


@attrs.define
class ProofsFile:
    """``<appdir>/streamassign/proven-offsets.json``: the proofs of the last run, written at
    each proof (atomically: a kill leaves the old file or the new one; an assignment's and
    a recovery's also durably, see ``ProvenOffsets._save``)."""

    path: Path
    #: The bytes last written: a proof that changed nothing is not written again.
    written: bytes | None = None
    #: Whether a failed write was logged since the last good one (a WARNING once per
    #: episode, then DEBUG: commits are frequent).
    write_failure_told: bool = False

    def read(self) -> SavedProofs | None:
        """The saved proofs; None when there is no file, or one of a version this code does
        not know (a newer release's, after a rollback: logged at INFO). ``DamagedStateError``
        when it cannot be read or parsed."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise DamagedStateError(f"{self.path}: unreadable: {exc}") from exc
        data = loads_json(raw, DamagedStateError, str(self.path))
        try:
            if data["version"] != _PROOFS_VERSION:
                log.info(
                    "not using the proven changelog offsets in %s: version %r, this release "
                    "reads %d (a newer release's file, after a rollback): the disk is trusted",
                    self.path,
                    data["version"],
                    _PROOFS_VERSION,
                )
                return None
            carried = _offsets(data.get("carried", {}))  # absent in the first release's files
            return SavedProofs(_offsets(data["proven"]), bool(data["recovered"]), carried)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DamagedStateError(f"{self.path}: not a proofs file: {exc!r}") from exc

    def write(
        self,
        proven: Mapping[TP, int | None],
        recovered: bool,
        carried: Mapping[TP, int | None] | None = None,
        *,
        durable: bool = True,
    ) -> None:
        """Save ``proven`` and ``carried``, fsynced if ``durable``; a failure is logged (the
        proofs stay in memory: only a restart loses them, as before there was a file)."""
        data = {
            "version": _PROOFS_VERSION,
            "recovered": recovered,
            "proven": _by_topic(proven),
            "carried": _by_topic(carried or {}),
        }
        raw = json.dumps(data, sort_keys=True).encode()
        if raw == self.written:
            return
        try:
            # Without the fsyncs a host crash can leave an empty file (XFS, ext4 with
            # noauto_da_alloc), which the garbled-file rule restores in full; with them a busy
            # disk (compaction) costs tens of ms on the event loop: see ProvenOffsets._save.
            write_atomically(self.path, raw, durable=durable)
        except OSError as exc:
            level = logging.DEBUG if self.write_failure_told else logging.WARNING
            self.write_failure_told = True
            log.log(level, "cannot save the proven changelog offsets to %s: %s", self.path, exc)
            return
        if self.write_failure_told:
            log.info("saved the proven changelog offsets to %s again", self.path)
        self.written, self.write_failure_told = raw, False

    @property
    def last_write_failed(self) -> bool:
        return self.write_failure_told

    def discard(self) -> None:
        """Remove the file (a run that does not maintain it); logged at INFO if there was one."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("cannot remove the stale proven changelog offsets %s: %s", self.path, exc)
            return
        log.info(
            "removed the proven changelog offsets of an earlier run (%s): this run keeps none "
            "(exactly_once, or no table on disk), and its tables' offsets move past them",
            self.path,
        )


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
    #: Partitions to rewind to these proofs at their next assignment to this worker, whatever
    #: its member id: held at a loss (or by the last run) but not assigned then, so not
    #: opened then, or assigned but not readable or rewindable then.
    carried: dict[TP, int | None] = attrs.field(factory=dict)
    #: Whether Faust's table recovery completed since the last assignment (until then the
    #: worker processed nothing: the module docstring). Cleared before Faust takes the
    #: assignment, so a completion inside its callback still counts.
    recovered_since_assignment: bool = False
    #: Where the proofs are saved (None: in memory only).
    file: ProofsFile | None = None
    #: Whether the held partitions are the last run's (the log line's level and wording).
    held_by_last_run: bool = False
    #: Whether ``open`` ran (at the first assignment of this run).
    opened: bool = False

    def open(self, file: ProofsFile | None, assigned: Iterable[TP]) -> None:
        """At the first assignment of this run, before ``rewind_if_lost``: take the last run's
        proofs from ``file`` as those of a lost membership, and save the next ones there. No
        file: nothing to take. A garbled one: one WARNING, and every partition of ``assigned``
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
        self.carried = dict(saved.carried)
        self.recovered_since_assignment = saved.recovered

    def snapshot(self, stores: Mapping[str, Any]) -> dict[TP, int | None]:
        """The persisted offsets of the held partitions now (to prove by a commit); those that
        cannot be read now are left out (they keep their last proof)."""
        return _snapshot(stores, self.held)

    def prove(self, snapshot: Mapping[TP, int | None]) -> None:
        """A commit taken after ``snapshot`` succeeded under the member id of ``held``."""
        self.proven.update({tp: o for tp, o in snapshot.items() if tp in self.held})
        self._save(durable=False)

    def rewind_if_lost(
        self, member_id: str | None, stores: Mapping[str, Any], assigned: Iterable[TP]
    ) -> list[Rewind]:
        """Before Faust reads the persisted offsets of an assignment made under
        ``member_id`` that gives this worker the changelog partitions ``assigned`` (actives
        and standbys): if it is not the one the held partitions were assigned under (or
        either is not a real id), the held partitions are due to be rewound to their proven
        offsets (to the start of their changelog when none is proven), unless Faust's
        recovery has not completed since the last assignment (then nothing is its own
        write); so are the carried ones, always. Of those due, each of ``assigned`` whose
        store persisted past its proof is rewound; the others are carried (never opened:
        Faust would not close them). One log line names what moved."""
        recovered, self.recovered_since_assignment = self.recovered_since_assignment, False
        lost = self.held_as is not None and recovered
        lost = lost and not (member_id and member_id == self.held_as)
        due = ({tp: self.proven.get(tp) for tp in self.held} if lost else {}) | self.carried
        now = frozenset(assigned)
        # A carried partition of a table this app no longer has, or of one without state on
        # disk (nothing to rewind), would be carried for ever.
        self.carried = {
            tp: o
            for tp, o in due.items()
            if tp not in now and tp.topic in stores and keeps_state_on_disk(stores[tp.topic])
        }
        newly_carried = sum(tp in self.held for tp in self.carried) if lost else 0
        rewound = []
        for tp in sorted(due.keys() & now):
            done, rewind = self._rewind(tp, due[tp], stores)
            if not done:  # unreadable or not rewound: keep its proof for the next assignment
                self.carried[tp] = due[tp]
            elif rewind is not None:
                rewound.append(rewind)
        self._tell(member_id, lost and not self.held_by_last_run, rewound, newly_carried)
        return rewound

    def _tell(
        self, member_id: str | None, lost_in_run: bool, rewound: list[Rewind], carried: int
    ) -> None:
        """The in-run loss's WARNING, or the INFO line of a restart (or of partitions carried
        since it, or since a loss): a restart without a clean stop replays what was written
        since the last proof, an ordinary cost (a kill -9, the OOM killer)."""
        moved = ", ".join(r.describe() for r in rewound[:10]) + (
            f" and {len(rewound) - 10} more" if len(rewound) > 10 else ""
        )
        if lost_in_run and (rewound or carried):
            log.warning(
                "this worker lost its group membership (member id %s, now %s) while it held "
                "%d table changelog partitions; what it wrote to them since the membership "
                "was last proven may have passed another worker's writes (had it run on as a "
                "zombie: a stall past the session timeout; a broker restart that expired the "
                "group's sessions ends memberships the same way), so %d persisted offsets are "
                "rewound to the last proven ones and their recovery replays the changelog "
                "from there: %s%s",
                self.held_as or "unknown",
                member_id or "unknown",
                len(self.held),
                len(rewound),
                moved or "none now",
                f"; {carried} assigned elsewhere now are rewound when next assigned here"
                if carried
                else "",
            )
        elif rewound:
            log.info(
                "%s%d table changelog partitions had persisted offsets past their last proven "
                "ones%s: moved back to them, so their recovery replays the changelog records "
                "written since (a restart without a clean stop, or table writes outside "
                "stream commits): %s",
                "this worker restarted: " if self.held_by_last_run else "",
                len(rewound),
                f" ({len(self.carried)} more kept until assigned here)" if self.carried else "",
                moved,
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

    def save_if_failed(self) -> None:
        """At the worker's stop: save again if the last save failed (a full disk since
        freed). Without it the file kept its stale proofs whenever no offset moved after the
        failure (nothing to commit, nothing saved), and the next start rewound the tables to
        them and replayed every changelog record written since."""
        if self.file is not None and self.file.last_write_failed:
            self._save()

    def _save(self, *, durable: bool = True) -> None:
        """Write the proofs. A commit's (every ~2.8 s) is not fsynced: on a disk busy with
        compaction an fsync took 28 ms median (131 ms at worst) of the event loop, and a
        process that dies keeps the page cache; a host crash then leaves the file as the last
        assignment or recovery wrote it durably (a longer replay), or on some file systems
        empty (the garbled-file rule)."""
        if self.file is not None:
            proven = {tp: self.proven.get(tp) for tp in self.held}
            self.file.write(proven, self.recovered_since_assignment, self.carried, durable=durable)

    def _rewind(
        self, tp: TP, proven: int | None, stores: Mapping[str, Any]
    ) -> tuple[bool, Rewind | None]:
        """Rewind ``tp`` to ``proven`` if its store persisted past it: whether that is done
        (False: its offset could not be read or set, logged), and the move if any."""
        readable, was = _persisted(stores, tp)
        if not readable:
            log.warning(
                "cannot read the persisted offset of %s to compare it with its last proven "
                "one (%s): its proof is kept, and it is checked again at its next assignment",
                tp,
                proven,
            )
            return False, None
        if was is None:
            return True, None  # a store that persists nothing, or nothing to trust anyway
        to = NOTHING_APPLIED if proven is None else proven
        if was <= to:
            return True, None
        try:
            stores[tp.topic].set_persisted_offset(tp, to)
        except Exception:  # the partition keeps its offset: say so, it may miss records
            log.exception("cannot rewind the persisted offset of %s from %d to %d", tp, was, to)
            return False, None
        return True, Rewind(tp, was, to)
