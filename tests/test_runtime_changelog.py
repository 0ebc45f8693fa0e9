"""The runtime's pure state layer: stores, commit markers, restores, crash tails.

The property: whatever prefix of the changelog a crash leaves (commits interrupted anywhere,
also inside a commit), restoring from any marker position and replaying the uncommitted input
gives exactly the state of processing every input record once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamassign import TopicPartition
from streamassign.errors import DamagedStateError, StoreIOError
from streamassign.runtime import COMMIT_KEY, MemoryStore, ReservedKeyError, StoreState, open_store
from streamassign.runtime.changelog import Marker, encode_marker, read_marker

CHANGELOG = TopicPartition("app-totals-changelog", 0)
SOURCE = "events"

Log = list[tuple[int, bytes | None, bytes | None]]  # (offset, key, value)


class Owner:
    """An active task's owner, in miniature: processes input, produces to ``log``, commits."""

    def __init__(self, log: Log, state: StoreState) -> None:
        self.log = log
        self.state = state

    def produce(self, key: bytes | None, value: bytes | None) -> int:
        self.log.append((len(self.log), key, value))
        return len(self.log) - 1

    def restore(self) -> None:
        for offset, key, value in self.log[self.state.position :]:
            self.state.restore(offset, key, value)
        for key in self.state.compensate():
            self.produce(key, self.state.pending[key])

    def process(self, offset: int, key: bytes) -> None:
        if self.state.seen(SOURCE, offset):
            return
        old = self.state.get(key)
        new = str(int(old or b"0") + 1).encode()
        self.state.put(key, new)
        self.produce(key, new)
        self.state.mark_processed(SOURCE, offset)

    def commit(self) -> None:
        if self.state.dirty:
            self.state.committed(self.produce(COMMIT_KEY, self.state.marker()))


def expected(keys: list[bytes]) -> dict[bytes, bytes]:
    counts: dict[bytes, int] = {}
    for k in keys:
        counts[k] = counts.get(k, 0) + 1
    return {k: str(n).encode() for k, n in sorted(counts.items())}


@settings(max_examples=300, deadline=None)
@given(
    keys=st.lists(st.sampled_from([b"a", b"b", b"c", b"d"]), min_size=1, max_size=40),
    commits=st.lists(st.booleans(), min_size=1, max_size=9),
    crashes=st.lists(st.tuples(st.integers(1, 12), st.booleans()), max_size=4),
    reuse_local=st.booleans(),
)
def test_crashes_anywhere_leave_exact_state(
    keys: list[bytes],
    commits: list[bool],
    crashes: list[tuple[int, bool]],
    reuse_local: bool,
) -> None:
    """Owners crash after any number of produced records (``crashes``: records produced
    since the previous crash, and whether the input offset commit right before was lost);
    each next owner restores (from the last owner's local store or cold) and replays from the
    last committed input offset. The final restored state is exact."""
    log: Log = []
    local = MemoryStore()
    committed_input = 0  # the input offset the group has committed
    crash_points = list(crashes)
    since_crash = 0
    owner = Owner(log, StoreState.open("totals", CHANGELOG, local))
    owner.restore()
    offset = committed_input
    step = 0
    while offset < len(keys):
        owner.process(offset, keys[offset])
        offset += 1
        step += 1  # commits are timed, not aligned with offsets: an heir commits elsewhere
        if commits[step % len(commits)] or offset == len(keys):
            owner.commit()
            # The input commit sometimes gets lost (crash right after the changelog ack).
            if not (crash_points and crash_points[0][1]):
                committed_input = offset
        if crash_points and len(log) - since_crash >= crash_points[0][0]:
            crash_points.pop(0)
            since_crash = len(log)
            # Crash: uncommitted pending writes are gone; a new owner takes over.
            store = local if reuse_local else MemoryStore()
            owner = Owner(log, StoreState.open("totals", CHANGELOG, store))
            owner.restore()
            offset = committed_input
    owner.commit()
    fresh = StoreState.open("totals", CHANGELOG, MemoryStore())
    for o, k, v in log:
        fresh.restore(o, k, v)
    assert dict(fresh.store.items()) == expected(keys)
    assert dict(owner.state.items()) == expected(keys)


def test_orphan_tail_is_not_applied_and_gets_compensated() -> None:
    log: Log = []
    owner = Owner(log, StoreState.open("totals", CHANGELOG, MemoryStore()))
    owner.process(0, b"a")
    owner.commit()
    owner.process(1, b"a")  # produced, never committed: an orphan
    standby = StoreState.open("totals", CHANGELOG, MemoryStore())
    for o, k, v in log:
        standby.restore(o, k, v)
    assert standby.store.get(b"a") == b"1"  # the orphan waits for a marker that never comes
    assert standby.position == 2

    heir = Owner(log, StoreState.open("totals", CHANGELOG, MemoryStore()))
    heir.restore()
    assert heir.state.pending == {b"a": b"1"}  # the committed value, written again
    heir.process(1, b"a")
    heir.commit()
    assert heir.state.store.get(b"a") == b"2"
    # Compaction keeps only the latest record per key: the orphan can never win.
    latest = {k: (o, v) for o, k, v in log}
    compacted = sorted((o, k, v) for k, (o, v) in latest.items())
    replay = StoreState.open("totals", CHANGELOG, MemoryStore())
    for o, k, v in compacted:
        replay.restore(o, k, v)
    assert replay.store.get(b"a") == b"2"


def test_heir_commit_then_second_crash_does_not_double_count() -> None:
    """The case compensation exists for: the heir commits before it has re-processed every
    orphaned record, so its marker closes orphan writes too; a second heir must not find
    them (it would apply those records twice)."""
    log: Log = []
    first = Owner(log, StoreState.open("totals", CHANGELOG, MemoryStore()))
    first.process(0, b"a")
    first.commit()
    first.process(1, b"a")
    first.process(2, b"b")  # orphans a=2, b=1; the input is committed up to offset 1
    heir = Owner(log, StoreState.open("totals", CHANGELOG, MemoryStore()))
    heir.restore()
    heir.process(1, b"a")
    heir.commit()  # crash before offset 2
    second = Owner(log, StoreState.open("totals", CHANGELOG, MemoryStore()))
    second.restore()
    second.process(2, b"b")
    second.commit()
    assert dict(second.state.items()) == {b"a": b"2", b"b": b"1"}


def test_a_failed_commit_kept_in_memory_and_restored_loses_nothing() -> None:
    """A commit fails after the write went out (no marker); the same process keeps the
    store and restores it: the uncommitted record is processed again, not taken as seen."""
    log: Log = []
    owner = Owner(log, StoreState.open("totals", CHANGELOG, MemoryStore()))
    owner.process(0, b"a")
    owner.commit()
    owner.process(1, b"a")  # a=2 in the changelog, its marker failed
    owner.restore()  # the same StoreState object, restored from its position
    assert owner.state.pending_applied == {}
    owner.process(1, b"a")  # the input offset was not committed: read again
    owner.commit()
    assert dict(owner.state.items()) == {b"a": b"2"}
    assert owner.state.applied == {SOURCE: 1}


def test_replayed_record_is_seen_only_after_processing() -> None:
    state = StoreState.open("totals", CHANGELOG, MemoryStore())
    assert not state.seen(SOURCE, 0)
    state.mark_processed(SOURCE, 5)
    assert state.seen(SOURCE, 5) and state.seen(SOURCE, 3) and not state.seen(SOURCE, 6)
    assert not state.seen("other", 0)


def test_reserved_key_is_refused() -> None:
    state = StoreState.open("totals", CHANGELOG, MemoryStore())
    with pytest.raises(ReservedKeyError):
        state.put(COMMIT_KEY, b"x")


FORTY_DIGITS = b"9" * 40


@pytest.mark.parametrize(
    "value",
    [
        b"garbage",
        b"[1]",
        None,
        b"[" * 100_000 + b"]" * 100_000,
        b"\xff\xfe",
        b"{}",
        b'{"applied": [5]}',
        b'{"applied": 5}',
        # not JSON, or not a finite number (``loads_json``): refused as a whole
        b'{"applied": {"t": Infinity, "u": 5}}',
        b'{"applied": {"t": NaN, "u": 5}}',
        b'{"applied": {"t": 1e999, "u": 5}}',
        b'{"applied": {"t": -1e999, "u": 5}}',
    ],
)
def test_a_marker_without_an_applied_object_is_unreadable(value: bytes | None) -> None:
    with pytest.raises(DamagedStateError, match=r"^commit marker"):
        read_marker(value)


@pytest.mark.parametrize(
    "offset",
    [
        b'"x"',
        # int() takes these (and made the huge ones skip every later input record):
        b"2.5",
        b"true",
        b'"12"',
        b'"1_000"',
        b"-7",
        b"1e300",
        FORTY_DIGITS,
        b"%d" % 2**83,
        b"null",
        b"[5]",
    ],
)
def test_an_offset_an_owner_cannot_write_is_refused_and_the_others_read(offset: bytes) -> None:
    """One bad entry made the whole marker unreadable: the marker's good offsets of other
    topics were lost with it."""
    marker = read_marker(b'{"applied": {"t": %s, "u": 5, "u[0]": %d}}' % (offset, 7 << 20))
    assert marker.applied == {"u": 5, "u[0]": 7 << 20}
    (refused,) = marker.refused
    assert refused.startswith("applied offset of 't' is ") and refused.endswith(
        ", not an int in [0, 2**83)"
    )
    assert read_marker(b'{"applied": {"t": %s}}' % offset).applied == {}


def test_many_refused_offsets_are_one_line() -> None:
    marker = read_marker(b'{"applied": {%s}}' % b", ".join(b'"t%d": -1' % i for i in range(5)))
    assert marker.applied == {} and len(marker.refused) == 5
    assert marker.refusal().endswith("; and 2 more") and marker.refusal().count("'t") == 3


@pytest.mark.parametrize(
    "applied", [{}, {"t": 0}, {"t": 3}, {"t": 2**63 - 1, "t[0]": 2**83 - 1, "u[1]": 7 << 20}]
)
def test_every_marker_an_owner_writes_reads_back(applied: dict[str, int]) -> None:
    """Repartition positions (input offset * 2**20 + rank) reach 2**83."""
    assert read_marker(encode_marker(applied)) == Marker(applied)


def test_a_foreign_marker_with_a_huge_offset_skips_no_input(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One record of the reserved key with a 40-digit applied offset (a tool, a repair, a
    mirrored topic) was read as is: ``seen`` held for every later input record, each skipped
    and committed, silently and for good (the owner's every later marker repeated it)."""
    state = StoreState.open("totals", CHANGELOG, MemoryStore())
    with caplog.at_level(logging.WARNING, logger="streamassign.runtime"):
        state.restore(0, b"a", b"1")
        state.restore(1, COMMIT_KEY, encode_marker({SOURCE: 10}))
        state.restore(2, b"a", b"2")
        state.restore(3, COMMIT_KEY, b'{"applied": {"%s": %s}}' % (SOURCE.encode(), FORTY_DIGITS))
    assert state.applied == {SOURCE: 10} and state.position == 4
    assert dict(state.store.items()) == {b"a": b"2"}  # still closes its commit
    assert not state.seen(SOURCE, 11)
    state.mark_processed(SOURCE, 11)
    assert read_marker(state.marker()).applied == {SOURCE: 11}
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith(
        "store totals: the commit marker at app-totals-changelog[0]@3 has applied offsets that "
        "cannot be read (applied offset of 'events' is 9999"
    )


def test_unreadable_markers_are_one_warning_per_store_not_one_per_marker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    a = StoreState.open("a", TopicPartition("cl-a", 0), MemoryStore())
    b = StoreState.open("b", TopicPartition("cl-b", 0), MemoryStore())
    with caplog.at_level(logging.WARNING, logger="streamassign.runtime"):
        for offset, value in enumerate([b'{"applied": {"in": true}}', b"{}", None]):
            a.restore(offset, COMMIT_KEY, value)
            b.restore(offset, COMMIT_KEY, value)
    warnings = [r.getMessage() for r in caplog.records]
    assert [w.split(":")[0] for w in warnings] == ["store a", "store b"]
    assert all(
        "@0 has applied offsets that cannot be read (applied offset of 'in' is True" in w
        for w in warnings
    )


def test_applied_offsets_a_store_keeps_that_cannot_be_read_are_none_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A store that committed a foreign marker's huge offset (before markers were checked)
    kept it in its metadata: taken as none, the changelog and the committed input offsets say
    what the store holds."""
    store = MemoryStore()
    store.write(
        {b"a": b"1"}, {"position": b"3", "applied": b'{"applied": {"in": %s}}' % FORTY_DIGITS}
    )
    with caplog.at_level(logging.WARNING, logger="streamassign.runtime"):
        state = StoreState.open("totals", CHANGELOG, store)
    assert state.applied == {} and state.position == 3 and not state.seen("in", 11)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith(
        "store totals (app-totals-changelog[0]): applied input offsets it keeps cannot be read"
    )
    assert StoreState.open("fresh", CHANGELOG, MemoryStore()).applied == {}
    assert len(caplog.records) == 1  # a store without metadata is not damaged


def test_a_marker_with_a_non_finite_offset_still_closes_its_commit() -> None:
    """A marker a foreign writer of the reserved key left with ``Infinity`` (or ``1e999``)
    used to raise OverflowError from every restore of the task: a crash loop."""
    state = StoreState.open("totals", CHANGELOG, MemoryStore())
    state.restore(0, b"a", b"1")
    state.restore(1, COMMIT_KEY, b'{"applied": {"in": 1e999}}')
    assert dict(state.store.items()) == {b"a": b"1"} and state.position == 2
    assert state.applied == {}


def test_rocksdb_store_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "totals.rocksdb"
    state = StoreState.open("totals", CHANGELOG, open_store("rocksdb", path))
    state.put(b"k", b"1")
    state.put(b"gone", b"x")
    state.put(b"gone", None)
    state.mark_processed(SOURCE, 9)
    state.committed(41)
    state.store.close()
    again = StoreState.open("totals", CHANGELOG, open_store("rocksdb", path))
    assert again.position == 42
    assert again.applied == {SOURCE: 9}
    assert dict(again.store.items()) == {b"k": b"1"}
    assert again.store.persistent and not MemoryStore.persistent
    again.store.close()


def test_unknown_store_kind() -> None:
    with pytest.raises(ValueError, match="unknown store kind"):
        open_store("lmdb", Path("x"))  # type: ignore[arg-type]


def test_a_key_that_is_not_bytes_is_refused() -> None:
    state = StoreState.open("totals", CHANGELOG, MemoryStore())
    with pytest.raises(TypeError, match="without key"):
        state.put(None, b"1")  # type: ignore[arg-type]
    assert state.pending == {}


def test_a_restore_takes_the_last_marker_s_applied_offsets_not_the_highest() -> None:
    """A zombie's late marker may run ahead of the owner's; the owner's later marker must
    win (a higher applied offset skips input, a lower one only repeats it). An unreadable
    marker closes its writes and changes no applied offset; topics a marker omits keep theirs."""
    state = StoreState.open("s", TopicPartition("c", 0), MemoryStore())
    records = [
        (b"k", b"1"),
        (COMMIT_KEY, encode_marker({"a": 5, "b": 2})),
        (COMMIT_KEY, encode_marker({"a": 1})),
        (b"j", b"2"),
        (COMMIT_KEY, b"not json"),
    ]
    for offset, (key, value) in enumerate(records):
        state.restore(offset, key, value)
    assert state.applied == {"a": 1, "b": 2}
    assert dict(state.store.items()) == {b"k": b"1", b"j": b"2"} and state.position == 5


def test_a_replay_after_a_commit_that_reached_one_store_applies_its_input_once() -> None:
    """A task's commit reached store ``a`` (its marker says input 100 applied) and not store
    ``b`` (50): the replay of 51..100 re-reads input ``a`` holds. ``a``'s applied offset must
    not go back with it, or its next marker (and a restore of it) would apply 71..100 again."""
    a = StoreState("a", TopicPartition("cl-a", 0), MemoryStore())
    b = StoreState("b", TopicPartition("cl-b", 0), MemoryStore())
    a.restore(0, b"k", b"1")
    a.restore(1, COMMIT_KEY, encode_marker({"in": 100}))
    b.restore(0, COMMIT_KEY, encode_marker({"in": 50}))
    for offset in range(51, 71):  # as Processing does: skip only what every store holds
        if not all(s.seen("in", offset) for s in (a, b)):
            for state in (a, b):
                state.mark_processed("in", offset)
    assert read_marker(a.marker()).applied == {"in": 100}
    assert read_marker(b.marker()).applied == {"in": 70}
    assert not a.dirty
    b.committed(1)
    assert a.seen("in", 100) and not b.seen("in", 71)


HUGE = b"9" * 40
UP = "up[0]"


def test_a_marker_with_one_refused_offset_still_sets_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An older streamassign that read a foreign huge offset repeated it in every later
    marker, next to its real offsets of other topics and upstreams. Those markers were
    refused as a whole: the other offsets stayed at the last marker before the poison while
    the store held the writes made after it, so re-read input was applied twice."""
    state = StoreState.open("totals", CHANGELOG, MemoryStore())
    poisoned = b'{"applied": {"in": %s, "other": 60, "up[0]": %d}}' % (HUGE, 50 << 20)
    with caplog.at_level(logging.WARNING, logger="streamassign.runtime"):
        state.restore(0, b"a", b"1")
        state.restore(1, COMMIT_KEY, encode_marker({"in": 4, "other": 10, UP: 5 << 20}))
        state.restore(2, COMMIT_KEY, b'{"applied": {"in": %s}}' % HUGE)  # the foreign one
        state.restore(3, b"a", b"2")
        state.restore(4, COMMIT_KEY, poisoned)
    assert state.applied == {"in": 4, "other": 60, UP: 50 << 20}
    assert state.seen("other", 60) and not state.seen("other", 61)
    assert state.seen(UP, 50 << 20) and not state.seen("in", 5)
    assert dict(state.store.items()) == {b"a": b"2"} and state.position == 5
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "@2 has applied offsets that cannot be read (applied offset of 'in' is 9" in warning


def test_applied_offsets_a_store_keeps_are_read_but_for_the_refused_ones(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An older streamassign committed the poisoned value to the store's metadata too, with
    the store's real offsets of other topics: those were all taken as none."""
    store = MemoryStore()
    kept = b'{"applied": {"in": %s, "other": 70, "up[0]": %d}}' % (HUGE, (123 << 20) + 4)
    store.write({b"a": b"1"}, {"position": b"3", "applied": kept})
    with caplog.at_level(logging.WARNING, logger="streamassign.runtime"):
        state = StoreState.open("totals", CHANGELOG, store)
    assert state.applied == {"other": 70, UP: (123 << 20) + 4}
    assert state.seen("other", 70) and state.seen(UP, (123 << 20) + 4) and not state.seen("in", 0)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "(applied offset of 'in' is 9999" in warning and "'other'" not in warning


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_an_unreadable_marker_after_the_owners_own_says_it_closes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The usual case (a record of the reserved key appended after the owner's marker)
    closes no write: nothing can be applied twice, and the WARNING said it might."""
    state = StoreState.open("totals", CHANGELOG, MemoryStore())
    with caplog.at_level(logging.WARNING, logger="streamassign.runtime"):
        state.restore(0, b"a", b"1")
        state.restore(1, COMMIT_KEY, encode_marker({"in": 4}))
        state.restore(2, COMMIT_KEY, b'{"applied": {"in": %s}}' % HUGE)
    (warning,) = _warnings(caplog)
    assert "@2 has applied offsets that cannot be read (applied offset of 'in'" in warning
    assert "; written by another producer, or by an older streamassign repeating such a value)" in (
        warning
    )
    assert "it closes no write, so no input is applied twice" in warning
    assert "applied again" not in warning
    again = StoreState.open("totals", CHANGELOG, MemoryStore())
    with caplog.at_level(logging.WARNING, logger="streamassign.runtime"):
        again.restore(0, COMMIT_KEY, b"garbage")
    assert "; written by another producer); it closes no write" in _warnings(caplog)[-1]


def test_an_unreadable_marker_that_closes_writes_says_how_many(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state = StoreState.open("totals", CHANGELOG, MemoryStore())
    with caplog.at_level(logging.WARNING, logger="streamassign.runtime"):
        state.restore(0, b"a", b"1")
        state.restore(1, b"b", b"1")
        state.restore(2, COMMIT_KEY, b'{"applied": {"in": -1}}')
    (warning,) = _warnings(caplog)
    assert "it closes 2 write(s), applied" in warning
    assert "input of that commit may be applied again after a crash" in warning
    assert dict(state.store.items()) == {b"a": b"1", b"b": b"1"}


def _compact(log: Log) -> Log:
    """What the log cleaner leaves once ``delete.retention.ms`` passed: the last record of
    each key, tombstones dropped."""
    last = {key: offset for offset, key, _ in log}
    return [(o, k, v) for o, k, v in log if last[k] == o and v is not None]


def test_a_tombstone_on_the_reserved_key_compacted_away_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A foreign tombstone on the reserved key makes compaction remove every marker, then
    itself: a fresh restore reads committed records with no marker and writes them away.
    That was logged at INFO only (as "N uncommitted writes ... undone")."""
    log: Log = []
    owner = Owner(log, StoreState.open("totals", CHANGELOG, MemoryStore()))
    for offset, word in enumerate([b"k", b"k", b"j"]):
        owner.process(offset, word)
        owner.commit()
    log.append((len(log), COMMIT_KEY, None))  # the foreign tombstone
    log.append((len(log), b"zz-roll", b"x"))  # appends that let the segment roll
    end = len(log)
    heir = StoreState.open("totals", CHANGELOG, MemoryStore())
    with caplog.at_level(logging.WARNING, logger="streamassign.runtime"):
        for offset, key, value in _compact(log):
            heir.restore(offset, key, value)
        keys = heir.compensate(end)
    assert keys == [b"j", b"k", b"zz-roll"] and heir.pending == dict.fromkeys(keys)
    (warning,) = _warnings(caplog)
    assert warning.startswith(
        "store totals: app-totals-changelog[0]: this restore read no commit marker, and 5 of "
        "the offsets from 0 to the end 8 hold no record (compacted or deleted); the 3 "
        "record(s) left there are taken as uncommitted and their 3 key(s) written back"
    )
    assert "b'\\x00streamassign.commit'" in warning


@pytest.mark.parametrize("committed_first", [False, True])
def test_an_owners_own_unfinished_commit_is_not_warned_about(
    caplog: pytest.LogCaptureFixture, committed_first: bool
) -> None:
    """An owner's crash tail has no hole (a fresh one, or after its marker), and holes
    after a marker the restore read are compaction of what that marker closed."""
    log: Log = []
    owner = Owner(log, StoreState.open("totals", CHANGELOG, MemoryStore()))
    if committed_first:
        owner.process(0, b"k")
        owner.commit()
    owner.process(1, b"k")
    owner.process(2, b"j")  # crashes before its marker
    heir = StoreState.open("totals", CHANGELOG, MemoryStore())
    with caplog.at_level(logging.WARNING, logger="streamassign.runtime"):
        for offset, key, value in log:
            heir.restore(offset, key, value)
        assert heir.compensate(len(log)) == [b"j", b"k"]
    assert _warnings(caplog) == []
    compacted = StoreState.open("totals", CHANGELOG, MemoryStore())
    log.append((len(log), COMMIT_KEY, encode_marker({SOURCE: 2})))
    log.append((len(log), b"k", b"3"))
    with caplog.at_level(logging.WARNING, logger="streamassign.runtime"):
        for offset, key, value in _compact(log):
            compacted.restore(offset, key, value)
        assert compacted.compensate(len(log)) == [b"k"]
    assert _warnings(caplog) == []


def test_transaction_offsets_around_a_crash_tail_are_not_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Review27: after a switch of ``processing_guarantee`` and a crash, a warm restore's tail
    sits between offsets no read_committed reader sees: the last exactly-once commit's
    control record before it, an aborted transaction after it. Those are no removed markers:
    every store warned of a tombstone."""
    state = StoreState.open("totals", CHANGELOG, MemoryStore())
    state.restore(0, b"k", b"1")
    state.restore(1, COMMIT_KEY, encode_marker({SOURCE: 0}))
    state.restore_started()  # a warm restore from position 2 on
    with caplog.at_level(logging.WARNING, logger="streamassign.runtime"):
        # offset 2: the transaction's control record; 3-4 an at-least-once tail that never
        # committed; 5-7 an exactly-once heir's aborted transaction and its control record
        state.restore(3, b"k", b"2")
        state.restore(4, b"j", b"1")
        assert state.compensate(8) == [b"j", b"k"]
    assert _warnings(caplog) == []


class FullDisk(MemoryStore):
    """A store whose writes fail, as RocksDB's on a full disk."""

    persistent = True
    failing = False

    def write(self, writes: Mapping[bytes, bytes | None], meta: Mapping[str, bytes]) -> None:
        if self.failing:
            raise StoreIOError("store x: a write failed: IO error: No space left on device")
        super().write(writes, meta)


def test_a_failed_store_write_moves_no_position_so_no_checkpoint_claims_it() -> None:
    """The position (what a checkpoint reports) moves only with the store: it moved first,
    so a checkpoint written at stop after a write failed on a full disk claimed the commit's
    state, which the store never held."""
    log: Log = []
    store = FullDisk()
    owner = Owner(log, StoreState("totals", CHANGELOG, store, 0))
    owner.process(0, b"a")
    owner.commit()
    held = owner.state.position
    owner.process(1, b"a")
    store.failing = True
    with pytest.raises(StoreIOError):
        owner.commit()
    assert owner.state.position == held == int(store.meta("position") or b"0")
    assert owner.state.applied == {SOURCE: 0}
    restoring = StoreState("totals", CHANGELOG, store, held)
    with pytest.raises(StoreIOError):  # the restore side too
        for offset, key, value in log[held:]:
            restoring.restore(offset, key, value)
    assert restoring.position == held
