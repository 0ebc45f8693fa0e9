"""The runtime's pure state layer: stores, commit markers, restores, crash tails.

The property: whatever prefix of the changelog a crash leaves (commits interrupted anywhere,
also inside a commit), restoring from any marker position and replaying the uncommitted input
gives exactly the state of processing every input record once.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamassign import TopicPartition
from streamassign.errors import DamagedStateError
from streamassign.runtime import COMMIT_KEY, MemoryStore, ReservedKeyError, StoreState, open_store
from streamassign.runtime.changelog import decode_marker, encode_marker, read_marker

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
        b'{"applied": {"t": "x"}}',
        None,
        b'{"applied": {"t": Infinity}}',
        b'{"applied": {"t": 1e999}}',
        b'{"applied": {"t": -1e999}}',
        b'{"applied": {"t": NaN}}',
        b"[" * 100_000 + b"]" * 100_000,
        b"\xff\xfe",
        # int() takes these (and made the huge ones skip every later input record):
        b'{"applied": {"t": 2.5}}',
        b'{"applied": {"t": true}}',
        b'{"applied": {"t": "12"}}',
        b'{"applied": {"t": "1_000"}}',
        b'{"applied": {"t": -7}}',
        b'{"applied": {"t": 1e300}}',
        b'{"applied": {"t": ' + FORTY_DIGITS + b"}}",
        b'{"applied": {"t": %d}}' % 2**83,
        b'{"applied": {"t": 5, "u": 2.5}}',  # one bad offset: the whole marker
        b"{}",
        b'{"applied": [5]}',
    ],
)
def test_an_unreadable_marker_decodes_to_none(value: bytes | None) -> None:
    assert decode_marker(value) is None
    with pytest.raises(DamagedStateError, match=r"^commit marker"):
        read_marker(value)


@pytest.mark.parametrize(
    "applied", [{}, {"t": 0}, {"t": 3}, {"t": 2**63 - 1, "t[0]": 2**83 - 1, "u[1]": 7 << 20}]
)
def test_every_marker_an_owner_writes_reads_back(applied: dict[str, int]) -> None:
    """Repartition positions (input offset * 2**20 + rank) reach 2**83."""
    assert decode_marker(encode_marker(applied)) == applied


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
    assert decode_marker(state.marker()) == {SOURCE: 11}
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith(
        "store totals: the commit marker at app-totals-changelog[0]@3 cannot be read (commit "
        "marker: applied offset of 'events' is 9999"
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
        "@0 cannot be read (commit marker: applied offset of 'in' is True" in w for w in warnings
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
        "store totals (app-totals-changelog[0]): the applied input offsets it keeps cannot be read"
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
    assert decode_marker(a.marker()) == {"in": 100} and decode_marker(b.marker()) == {"in": 70}
    assert not a.dirty
    b.committed(1)
    assert a.seen("in", 100) and not b.seen("in", 71)
