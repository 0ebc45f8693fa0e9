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
owner repeats the value). Any other marker is unreadable: it still closes its commit (not
closing would leave committed writes as an orphan tail, which a compensation rolls back) and
changes no applied offset, and the restore logs a WARNING.
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


def read_marker(value: bytes | None) -> dict[str, int]:
    """Applied offsets of a marker; ``DamagedStateError`` saying why when it is not one this
    runtime writes (see the module docstring)."""
    if value is None:
        raise DamagedStateError("commit marker has no value")
    data = loads_json(value, DamagedStateError, "commit marker")
    applied = data.get("applied") if isinstance(data, dict) else None
    if not isinstance(applied, dict):
        raise DamagedStateError("commit marker has no 'applied' object")
    for topic, offset in applied.items():
        if not is_position(offset):
            raise DamagedStateError(
                f"commit marker: applied offset of {reprlib.repr(topic)} is "
                f"{reprlib.repr(offset)}, not an int in [0, 2**83)"
            )
    return dict(applied)


def decode_marker(value: bytes | None) -> dict[str, int] | None:
    """Applied offsets of a marker; None when it is unreadable (``read_marker`` says why)."""
    try:
        return read_marker(value)
    except DamagedStateError:
        return None


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
    #: restore of the store, ``StateUpdater.add``, resets it).
    warned_unreadable: bool = False

    @classmethod
    def open(cls, name: str, changelog: TopicPartition, store: KeyValueStore) -> StoreState:
        """Wrap ``store``, reading the position and applied offsets it keeps. Offsets that
        cannot be read (a store a version without ``read_marker``'s checks committed a foreign
        marker's offsets to) are logged and taken as none: the changelog's markers from the
        store's position on, and the input offsets committed, say what it holds."""
        position = int(store.meta(_POSITION) or b"0")
        kept = store.meta(_APPLIED)
        try:
            applied = {} if kept is None else read_marker(kept)
        except DamagedStateError as exc:
            applied = {}
            log.warning(
                "store %s (%s[%d]): the applied input offsets it keeps cannot be read (%s); "
                "taken as none, so input it holds may be applied again",
                name,
                changelog.topic,
                changelog.partition,
                exc,
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
        """The marker at ``marker_offset`` is acknowledged: write the pending state locally."""
        self.applied.update(self.pending_applied)
        self.position = self.end = marker_offset + 1
        self.overwritten = None
        self.store.write(self.pending, self._meta())
        self.pending.clear()
        self.pending_applied.clear()

    def _meta(self) -> dict[str, bytes]:
        return {_POSITION: str(self.position).encode(), _APPLIED: encode_marker(self.applied)}

    # -- the restore side ----------------------------------------------------------------------

    def restore(self, offset: int, key: bytes | None, value: bytes | None) -> None:
        """Apply one changelog record read at ``offset`` (records arrive in offset order)."""
        self.restored += 1
        if key == COMMIT_KEY:
            writes: dict[bytes, bytes | None] = dict(self.unclosed)
            # The last marker's offsets replace the earlier ones (not the max): a zombie's late
            # marker may run ahead of the owner's, and the owner's later marker must win.
            try:
                self.applied.update(read_marker(value))
            except DamagedStateError as exc:
                self._unreadable_marker(offset, exc)
            self.position = offset + 1
            self.store.write(writes, self._meta())
            self.unclosed.clear()
        elif key is not None:
            self.unclosed.append((key, value))

    def _unreadable_marker(self, offset: int, why: DamagedStateError) -> None:
        """Closed all the same (see the module docstring); said once per store and restore,
        as a foreign writer's every record of the reserved key may be one."""
        if self.warned_unreadable:
            return
        self.warned_unreadable = True
        log.warning(
            "store %s: the commit marker at %s[%d]@%d cannot be read (%s; not written by "
            "streamassign?); the writes it closes are applied, the applied input offsets stay "
            "the previous marker's, so input of that commit may be applied again after a "
            "crash. Further unreadable markers of this restore are not logged",
            self.name,
            self.changelog.topic,
            self.changelog.partition,
            offset,
            why,
        )

    def drop_unclosed(self) -> None:
        """Forget records read after the last marker (they are re-read from ``position``)."""
        self.unclosed.clear()

    def compensate(self) -> list[bytes]:
        """End of an active restore: rewrite the committed value of every orphan key as a
        pending write (see the module docstring); the caller produces them. Returns the keys."""
        orphans = sorted({key for key, _ in self.unclosed})
        self.unclosed.clear()
        self.pending.clear()  # nothing uncommitted survives a restore: offsets re-read
        self.pending_applied.clear()
        for key in orphans:
            self.pending[key] = self.store.get(key)
        return orphans
