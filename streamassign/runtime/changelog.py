"""A store and its changelog partition: writes, commit markers, restores. Pure (no Kafka).

Every write of an active task is produced to the changelog at once and kept in ``pending`` (the
task reads its own writes). A commit appends one **commit marker** record per store (key
``COMMIT_KEY``, value: the highest input offset applied per source topic); once the changelog
has acknowledged it, the pending writes go to the local store in one atomic batch together with
the new position (marker offset + 1) and the applied offsets. Input offsets are committed only
after that, so:

- the local store is always a prefix of the changelog, ending at a marker;
- a restore applies data records only when the marker that closes their commit arrives: writes
  of a commit that never completed (the process died before its marker) are an **orphan tail**,
  never applied. The next active rewrites the committed value of every orphan key (a
  *compensation*) before it processes anything, so compaction, which keeps the latest record
  per key, can never resurrect an orphan;
- a replayed input record whose offset is at most the applied offset of every store of its
  task is skipped, so table state is exact under at-least-once delivery.

A restore takes each marker's applied offsets as they are (per topic the marker names), not
the highest seen: the last marker wins, as after compaction (which keeps only the last marker).
A zombie's late marker may carry offsets ahead of what the owner processed; the owner's next
marker replaces them. A lower applied offset makes the store apply input it already holds
again (counted twice) and a higher one skips input: an owner's own markers never go back (a
store's applied offset only grows, also while a replay re-reads input it holds), so only a
zombie's late marker, in the window docs/runtime.md lists, can do either.

Log compaction may drop old markers; the writes before them are then closed by a later marker,
which is just as correct (they were committed).

A marker this runtime did not write (a tool, a hand-made repair, a replayed copy of the topic
writing the reserved key) may hold anything. Only applied offsets an owner can have written are
read (``read_marker``): one huge offset would make ``seen`` true for every later input record,
which would then be skipped and committed, silently and for good (every later marker of the
owner repeats the value). Any other offset is refused, its key keeping the previous marker's
offset; the marker's other offsets are read (an older streamassign repeated a refused value in
each later marker, next to its real offsets of other keys). A marker that is not JSON or has
no ``applied`` object is unreadable as a whole. Either way it still closes its commit (not
closing would leave committed writes as an orphan tail, which a compensation rolls back), and
the restore logs a WARNING.

The reserved key is this runtime's alone. A tombstone on it (any record of it, once it is the
last) makes compaction remove every marker before it, and the tombstone itself after
``delete.retention.ms``: the committed data records are then left with no marker, and the
next restore takes them as an orphan tail (``compensate`` warns when it can tell).
"""

from __future__ import annotations

import json
import logging
import reprlib
from collections.abc import Iterator, Mapping

import attrs

from .. import TopicPartition
from ..errors import DamagedStateError, ReservedKeyError, StoreKeyTypeError
from ..files import loads_json
from .stores import KeyValueStore

log = logging.getLogger("streamassign.runtime")

#: Key of commit markers; user keys may not use it.
COMMIT_KEY = b"\x00streamassign.commit"
_POSITION = "position"
_APPLIED = "applied"
#: A repartition record is tracked by its position upstream: its upstream input offset times
#: this, plus its rank among the records that input record sent (``tasks.mark_of``).
RANK_LIMIT = 1 << 20
#: Above every applied offset and position an owner can write: Kafka offsets are below 2**63.
POSITION_LIMIT = (1 << 63) * RANK_LIMIT


def is_position(value: object) -> bool:
    """Whether ``value`` is an input offset or a repartition position (not a bool, a float or
    a string that ``int()`` would take)."""
    return type(value) is int and 0 <= value < POSITION_LIMIT


def encode_marker(applied: Mapping[str, int]) -> bytes:
    return json.dumps({"applied": dict(sorted(applied.items()))}).encode()


@attrs.frozen
class Marker:
    """What ``read_marker`` read of a commit marker."""

    #: Applied offsets an owner can have written, by source topic or ``topic[p]`` upstream.
    applied: dict[str, int]
    #: Why each other offset was refused, one line per key (empty: all read).
    refused: tuple[str, ...] = ()

    def refusal(self) -> str:
        """The refused offsets in one line (the first three, and how many more)."""
        shown = "; ".join(self.refused[:3])
        more = len(self.refused) - 3
        return f"{shown}; and {more} more" if more > 0 else shown


def read_marker(value: bytes | None) -> Marker:
    """The applied offsets of a marker that an owner can have written, and the others
    refused (see the module docstring); ``DamagedStateError`` saying why when the marker is
    not JSON or has no ``applied`` object."""
    if value is None:
        raise DamagedStateError("commit marker has no value")
    data = loads_json(value, DamagedStateError, "commit marker")
    applied = data.get("applied") if isinstance(data, dict) else None
    if not isinstance(applied, dict):
        raise DamagedStateError("commit marker has no 'applied' object")
    good = {topic: offset for topic, offset in applied.items() if is_position(offset)}
    refused = tuple(
        f"applied offset of {reprlib.repr(topic)} is {reprlib.repr(offset)}, "
        "not an int in [0, 2**83)"
        for topic, offset in applied.items()
        if topic not in good
    )
    return Marker(good, refused)


@attrs.define(eq=False)
class StoreState:
    """One store of one task: committed state, uncommitted writes, restore progress."""

    name: str
    changelog: TopicPartition
    store: KeyValueStore
    #: Changelog offset after the last marker applied to ``store`` (where a restore resumes).
    position: int = 0
    #: Highest input offset applied per source topic (committed).
    applied: dict[str, int] = attrs.field(factory=dict)
    #: Active side: writes since the last commit, and the input offsets they cover.
    pending: dict[bytes, bytes | None] = attrs.field(factory=dict)
    pending_applied: dict[str, int] = attrs.field(factory=dict)
    #: Active side: the changelog offset where this owner's next record lands if nobody else
    #: writes the partition (None: unknown, nothing is checked). A restore sets it to the end
    #: it read to; every record the owner produces moves it on by one.
    end: int | None = None
    #: Active side: another writer's records follow this owner's own since its last marker,
    #: up to this end offset, and the broker confirmed this owner still holds the task
    #: (``Commits.sole_writer``): the next commit writes this owner's value of every key
    #: written there again after them (whose last value is not its own), then a marker.
    overwritten: int | None = None
    #: Restore side: data records read after the last marker, in changelog order.
    unclosed: list[tuple[bytes, bytes | None]] = attrs.field(factory=list)
    #: Changelog records read by restores (data and markers), over this object's life.
    restored: int = 0
    #: Restore side: this restore logged an unreadable marker (it logs one per store; a new
    #: restore of the store, ``restore_started``, resets it).
    warned_unreadable: bool = False
    #: Restore side: records of the reserved key this restore read (``restore_started``
    #: resets it), and records of any key read from ``position`` on (the tail's offsets
    #: that hold a record: ``compensate`` tells a compacted tail by them).
    markers_restored: int = 0
    tail_read: int = 0
    #: Offsets of the first and last record of the tail read from ``position`` on (None: none).
    tail_first: int | None = None
    tail_last: int | None = None

    @classmethod
    def open(cls, name: str, changelog: TopicPartition, store: KeyValueStore) -> StoreState:
        """Wrap ``store``, reading the position and applied offsets it keeps. Offsets that
        cannot be read (a store a version without ``read_marker``'s checks committed a foreign
        marker's offsets to) are logged and taken as none, the others are read: the
        changelog's markers from the store's position on, and the input offsets committed,
        say what it holds."""
        position = int(store.meta(_POSITION) or b"0")
        kept = store.meta(_APPLIED)
        applied: dict[str, int] = {}
        refused = ""
        try:
            if kept is not None:
                marker = read_marker(kept)
                applied, refused = marker.applied, marker.refusal()
        except DamagedStateError as exc:
            refused = str(exc)
        if refused:
            log.warning(
                "store %s (%s[%d]): applied input offsets it keeps cannot be read (%s); those "
                "are taken as none, so input it holds may be applied again",
                name,
                changelog.topic,
                changelog.partition,
                refused,
            )
        return cls(name, changelog, store, position, applied)

    # -- the active side ---------------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        if key in self.pending:
            return self.pending[key]
        return self.store.get(key)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Committed state overlaid with pending writes, in key order."""
        merged = dict(self.store.items())
        for key, value in self.pending.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        return iter(sorted(merged.items()))

    def put(self, key: bytes, value: bytes | None) -> None:
        if not isinstance(key, bytes):
            raise StoreKeyTypeError(
                f"store keys are bytes, got {type(key).__name__} (a record without key?)"
            )
        if key == COMMIT_KEY:
            raise ReservedKeyError(f"key {key!r} is reserved for commit markers")
        self.pending[key] = value

    def seen(self, topic: str, offset: int) -> bool:
        """Whether the input record at ``offset`` of ``topic`` is already in this store."""
        return offset <= max(self.pending_applied.get(topic, -1), self.applied.get(topic, -1))

    def mark_processed(self, topic: str, offset: int) -> None:
        # A replay after a commit that reached only some of a task's stores re-reads input
        # this store already holds: its applied offset must not go back (its next marker
        # would then make it, and a restore of it, apply that input again).
        if offset > self.applied.get(topic, -1):
            self.pending_applied[topic] = max(offset, self.pending_applied.get(topic, -1))

    @property
    def dirty(self) -> bool:
        return bool(self.pending or self.pending_applied or self.overwritten is not None)

    def produced(self) -> None:
        """One more record of this owner went to the changelog."""
        if self.end is not None:
            self.end += 1

    def marker(self) -> bytes:
        """Value of the commit marker closing the pending writes."""
        return encode_marker({**self.applied, **self.pending_applied})

    def committed(self, marker_offset: int) -> None:
        """The marker at ``marker_offset`` is acknowledged: write the pending state locally.
        The position moves only once the store took the write: a failed one (a full disk)
        leaves it where the store is, so no checkpoint (written from it) claims more."""
        applied = {**self.applied, **self.pending_applied}
        self.store.write(self.pending, _meta(marker_offset + 1, applied))
        self.applied.update(self.pending_applied)
        self.position = self.end = marker_offset + 1
        self.overwritten = None
        self.pending.clear()
        self.pending_applied.clear()

    # -- the restore side ----------------------------------------------------------------------

    def restore_started(self) -> None:
        """A new restore of this store begins (``StateUpdater.add``): it says once if it meets
        a bad marker, and counts its own markers."""
        self.warned_unreadable = False
        self.markers_restored = 0

    def restore(self, offset: int, key: bytes | None, value: bytes | None) -> None:
        """Apply one changelog record read at ``offset`` (records arrive in offset order)."""
        self.restored += 1
        if key != COMMIT_KEY:
            if self.tail_first is None:
                self.tail_first = offset
            self.tail_last = offset
            self.tail_read += 1
            if key is not None:
                self.unclosed.append((key, value))
            return
        self.markers_restored += 1
        writes: dict[bytes, bytes | None] = dict(self.unclosed)
        applied = dict(self.applied)
        # The last marker's offsets replace the earlier ones (not the max): a zombie's late
        # marker may run ahead of the owner's, and the owner's later marker must win.
        try:
            marker = read_marker(value)
        except DamagedStateError as exc:
            why = f"{exc}; written by another producer"
            self._unreadable_marker(offset, "cannot be read", why, len(writes))
        else:
            applied.update(marker.applied)
            if marker.refused:
                # An older streamassign that read such a value wrote it again in each marker.
                why = (
                    f"{marker.refusal()}; written by another producer, or by an older "
                    "streamassign repeating such a value"
                )
                self._unreadable_marker(
                    offset, "has applied offsets that cannot be read", why, len(writes)
                )
        # The store first: a write it refuses (a full disk) moves no position, which a
        # checkpoint written from it would claim.
        self.store.write(writes, _meta(offset + 1, applied))
        self.applied.update(applied)
        self.position = offset + 1
        self.unclosed.clear()
        self._forget_tail()

    def _unreadable_marker(self, offset: int, what: str, why: str, closes: int) -> None:
        """Closed all the same (see the module docstring); said once per store and restore,
        as a foreign writer's every record of the reserved key may be one. Input may be
        applied twice only if the marker closes writes (the commit it ends would otherwise
        have been an orphan tail); usually it follows the owner's own marker."""
        if self.warned_unreadable:
            return
        self.warned_unreadable = True
        effect = (
            f"it closes {closes} write(s), applied; the refused applied offsets stay the "
            "previous marker's, so input of that commit may be applied again after a crash"
            if closes
            else "it closes no write, so no input is applied twice; the refused applied "
            "offsets stay the previous marker's"
        )
        log.warning(
            "store %s: the commit marker at %s[%d]@%d %s (%s); %s. Further unreadable markers "
            "of this restore are not logged",
            self.name,
            self.changelog.topic,
            self.changelog.partition,
            offset,
            what,
            why,
            effect,
        )

    def _forget_tail(self) -> None:
        self.tail_read = 0
        self.tail_first = self.tail_last = None

    def drop_unclosed(self) -> None:
        """Forget records read after the last marker (they are re-read from ``position``)."""
        self.unclosed.clear()
        self._forget_tail()

    def compensate(self, end: int | None = None) -> list[bytes]:
        """End of an active restore, which read to ``end``: rewrite the committed value of
        every orphan key as a pending write (see the module docstring); the caller produces
        them. Returns the keys."""
        orphans = sorted({key for key, _ in self.unclosed})
        if orphans and end is not None:
            self._check_tail(end, len(orphans))
        self.unclosed.clear()
        self._forget_tail()
        self.pending.clear()  # nothing uncommitted survives a restore: offsets re-read
        self.pending_applied.clear()
        for key in orphans:
            self.pending[key] = self.store.get(key)
        return orphans

    def _check_tail(self, end: int, keys: int) -> None:
        """WARNING when the orphan tail is not what an owner's unfinished commit leaves: this
        restore read no marker, and offsets from its position to ``end`` hold no record, so
        records were removed there. Compaction removes a marker only for a later record of
        the reserved key, which this restore would have read, unless it was a tombstone
        removed in turn (``delete.retention.ms``): the markers that closed these records may
        be gone. An owner's own tail has no hole unless the cleaner compacted it (a segment
        rolled in it); under exactly once, offsets held by transaction markers are holes too,
        but a committed transaction's writes always come with their marker.

        Only holes among the records read count (from offset 0 on for a fresh restore):
        before the first and after the last there may be transaction control records and
        aborted transactions of an exactly-once run before or after a switch of
        ``processing_guarantee``, not removed markers (counted, they would make every store
        warn after such a switch and a crash)."""
        if self.markers_restored or self.tail_first is None or self.tail_last is None:
            return
        start = self.tail_first if self.position else 0
        missing = self.tail_last + 1 - start - self.tail_read
        if missing <= 0:
            return
        log.warning(
            "store %s: %s[%d]: this restore read no commit marker, and %d of the offsets "
            "from %d to the end %d hold no record (compacted or deleted); the %d record(s) "
            "left there are taken as uncommitted and their %d key(s) written back to the "
            "store's committed values. If a tombstone (or another record) on the reserved "
            "key %r made compaction remove the markers that closed them, that rolls the "
            "store back: the key must not be written by anyone but streamassign "
            "(docs/runtime.md)",
            self.name,
            self.changelog.topic,
            self.changelog.partition,
            missing,
            self.position,
            end,
            len(self.unclosed),
            keys,
            COMMIT_KEY,
        )


def _meta(position: int, applied: Mapping[str, int]) -> dict[str, bytes]:
    """A store's metadata: the changelog position it reached and the input offsets applied."""
    return {_POSITION: str(position).encode(), _APPLIED: encode_marker(applied)}
