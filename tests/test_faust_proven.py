"""A zombie's own changelog writes never move its table's applied offset past another worker's
(``streamassign.faust._proven``): after a lost group membership the ``streamassign://``
consumer rewinds the persisted offsets of the partitions it held to the last proven ones before
Faust's recovery reads them. Real RocksDB stores and Faust's consumer, no broker: Faust's own
assignment callback and commit are stand-ins that read what the recovery would read and answer
as the broker would (the live check: docs/faust.md, "A worker that resumes after its session
expired")."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from streamassign.faust._proven import (
    NOTHING_APPLIED,
    PROOFS_FILE,
    ProofsFile,
    ProvenOffsets,
    changelog_stores,
)

from .test_faust_assignor import APP, CL, SRC, rebalance

COUNTS = {SRC: 4, CL: 4}
HELD = [TP(CL, p) for p in range(4)]


def zombie_app(tmp_path: Path, store: str = "rocksdb://") -> faust.App:
    app = faust.App(
        APP,
        broker="streamassign://localhost:1",
        datadir=str(tmp_path),
        store=store,
        PartitionAssignor="streamassign.faust:PartitionAssignor",
        topic_partitions=4,
    )
    app.Table("totals", default=int)
    rebalance({"m0": app.assignor}, counts=COUNTS)  # every task active here
    return app


class AiokafkaConsumer(SimpleNamespace):
    """aiokafka's consumer as the transport reads it (weakly referable, as the assignor's
    rejoiner binds it at an assignment)."""


class Group:
    """What the broker says of this worker: its aiokafka member id (read by the consumer as
    aiokafka's coordinator holds it), and whether a commit now succeeds."""

    def __init__(self, consumer: Any) -> None:
        self.coordinator = SimpleNamespace(member_id="m-1", generation=1)
        consumer._thread._consumer = AiokafkaConsumer(_coordinator=self.coordinator)
        self.consumer = consumer
        self.commits_succeed = True
        #: What Faust's recovery read at each assignment: partition -> persisted offset.
        self.recovery_read: list[dict[TP, int | None]] = []
        #: What else Faust's assignment callback does (its recovery completing in it).
        self.on_assigned: Callable[[], Awaitable[None]] | None = None

    async def join(
        self, member_id: str, generation: int, streams: frozenset[TP] = frozenset()
    ) -> None:
        """A completed join under ``member_id``, handed to the consumer as aiokafka does: the
        changelog partitions and ``streams``."""
        self.coordinator.member_id, self.coordinator.generation = member_id, generation
        self.consumer.note_membership((member_id, generation))
        await self.consumer.on_partitions_assigned({*HELD, *streams}, generation)

    async def recovered(self) -> None:
        """Faust's table recovery completed (``on_rebalance_complete``): streams process."""
        await self.consumer.app.on_rebalance_complete.send()

    def expire(self) -> None:
        """The session expired: aiokafka's ``reset_generation`` on UnknownMemberId."""
        self.coordinator.member_id, self.coordinator.generation = "", -1

    async def commit(self) -> bool:
        return bool(await self.consumer._commit({TP(SRC, 0): 1}))


@pytest.fixture
def group(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Stand-ins for Faust's assignment callback (what its table recovery reads: each
    partition's persisted offset, as ``Recovery.add_active``) and its aiokafka commit."""
    groups: list[Group] = []

    async def assigned(consumer: Any, assigned: set[TP], generation_id: int = 0) -> None:
        g = next(g for g in groups if g.consumer is consumer)
        table = consumer.app.tables["totals"]
        g.recovery_read.append({tp: table.persisted_offset(tp) for tp in HELD})
        if g.on_assigned is not None:
            await g.on_assigned()

    async def commit(consumer: Any, offsets: Any) -> bool:
        return next(g for g in groups if g.consumer is consumer).commits_succeed

    monkeypatch.setattr(faust_aiokafka.Consumer, "on_partitions_assigned", assigned)
    monkeypatch.setattr(faust_aiokafka.Consumer, "_commit", commit)

    def make(app: faust.App) -> Group:
        groups.append(Group(app.consumer))
        return groups[-1]

    return make


def write(app: faust.App, offsets: dict[int, int]) -> None:
    """Changelog records acknowledged (Faust's ``_on_changelog_sent``) or applied by a
    recovery: the store persists each partition's offset."""
    store = app.tables["totals"].data
    for partition, offset in offsets.items():
        store.set_persisted_offset(TP(CL, partition), offset)


def persisted(app: faust.App) -> dict[int, int | None]:
    table = app.tables["totals"]
    return {tp.partition: table.persisted_offset(tp) for tp in HELD}


def rewind_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "rewound to the last proven ones" in r.getMessage()
    ]


def restart_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The INFO line of partitions moved back at a restart (or when carried ones come back)."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.INFO and "moved back to them" in r.getMessage()
    ]


def test_a_zombie_s_own_writes_are_rewound_to_the_last_commit_that_succeeded(
    tmp_path: Path, group: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """faustm1's loss: the zombie's writes after its last successful commit moved its offsets
    past records another worker wrote meanwhile. After the rejoin under a new member id the
    recovery reads from the offsets of that commit: it replays the changelog from there."""
    app = zombie_app(tmp_path)
    g = group(app)

    async def run() -> None:
        write(app, {0: 100, 1: 110, 2: 120, 3: 130})  # what the last recovery read
        await g.join("m-1", 1)
        await g.recovered()
        write(app, {0: 150, 1: 160})  # processing
        assert await g.commit()  # proves 150, 160 (and 120, 130 unchanged)
        write(app, {0: 170})
        g.expire()  # the stall: the broker gave its partitions to another worker
        g.commits_succeed = False
        write(app, {0: 180, 2: 125})  # the zombie's writes, after the other worker's
        assert not await g.commit()  # UnknownMemberId: proves nothing
        await g.join("m-2", 3)

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        asyncio.run(run())
    assert g.recovery_read[-1] == {HELD[0]: 150, HELD[1]: 160, HELD[2]: 120, HELD[3]: 130}
    (warning,) = rewind_warnings(caplog)
    assert "member id m-1, now m-2" in warning
    assert f"{CL}[0] 180 -> 150, {CL}[2] 125 -> 120" in warning
    assert f"{CL}[1]" not in warning  # nothing past its proof: not named


def test_a_join_under_the_same_member_id_rewinds_nothing(
    tmp_path: Path, group: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A rebalance the member stayed in (same member id) proves what it wrote before it: the
    revoke flushed its producer before the join, and nobody else held its partitions."""
    app = zombie_app(tmp_path)
    g = group(app)

    async def run() -> None:
        write(app, {0: 100})
        await g.join("m-1", 1)
        write(app, {0: 140, 3: 20})
        g.commits_succeed = False  # a commit that failed (a rebalance under way)
        assert not await g.commit()
        await g.join("m-1", 2)

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        asyncio.run(run())
    assert g.recovery_read[-1] == {HELD[0]: 140, HELD[1]: None, HELD[2]: None, HELD[3]: 20}
    assert persisted(app) == {0: 140, 1: None, 2: None, 3: 20}
    assert rewind_warnings(caplog) == []


def test_a_partition_with_no_proven_offset_is_restored_from_the_start(
    tmp_path: Path, group: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A partition that had no persisted offset when assigned and no successful commit since:
    nothing of what the zombie wrote to it is trusted; it is rewound to Faust's 'nothing
    applied' (-1), so the recovery reads its changelog from the start."""
    app = zombie_app(tmp_path)
    g = group(app)

    async def run() -> None:
        await g.join("m-1", 1)
        await g.recovered()
        g.expire()
        g.commits_succeed = False
        write(app, {1: 42})
        assert not await g.commit()
        await g.join("m-2", 3)

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        asyncio.run(run())
    assert g.recovery_read[-1][HELD[1]] == NOTHING_APPLIED
    assert persisted(app)[1] == NOTHING_APPLIED
    (warning,) = rewind_warnings(caplog)
    assert f"{CL}[1] 42 -> the start" in warning


def test_an_interrupted_restore_s_announced_completion_proves_nothing(
    tmp_path: Path, group: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker with no standby partitions losing its membership again and again during one
    restore: Faust announces the completion of each restore a join interrupted (its restart
    signal set). Taken as a recovery, every later loss rewound the restore to that join's
    offsets, and it never got further; ignored, the restore goes on where it was."""
    app = zombie_app(tmp_path)
    g = group(app)
    restart = app.tables.recovery.signal_recovery_start

    async def run() -> None:
        await g.join("m-1", 1)
        write(app, {0: 399})  # the restore reads on
        g.expire()
        await g.join("m-2", 3)  # the session expired mid-restore; the join interrupts it
        restart.set()  # Faust's recovery is told to start over, and announces first
        await g.recovered()
        restart.clear()
        write(app, {0: 799})  # the restore reads on again
        g.expire()
        await g.join("m-3", 5)

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        asyncio.run(run())
    assert [read[HELD[0]] for read in g.recovery_read] == [None, 399, 799]
    assert rewind_warnings(caplog) == []


def test_a_completed_recovery_proves_what_it_read(tmp_path: Path, group: Any) -> None:
    """Faust's ``on_rebalance_complete`` (its recovery read the changelog up to its end): a
    membership lost before the first commit after it rewinds to what the recovery read, not
    to the offsets the assignment found (less to replay)."""
    app = zombie_app(tmp_path)
    g = group(app)

    async def run() -> None:
        write(app, {0: 100})
        await g.join("m-1", 1)
        write(app, {0: 130})  # the recovery reads records 101..130
        await app.on_rebalance_complete.send()
        g.expire()
        write(app, {0: 131})  # the zombie's write
        await g.join("m-2", 3)

    asyncio.run(run())
    assert g.recovery_read[-1][HELD[0]] == 130


def test_a_commit_under_another_member_id_proves_nothing(tmp_path: Path, group: Any) -> None:
    """A commit that succeeds once the member has joined again under a new id, before Faust
    took that assignment (the group was empty: the broker takes a commit without member id),
    proves nothing of what was written under the old one."""
    app = zombie_app(tmp_path)
    g = group(app)

    async def run() -> None:
        write(app, {0: 100})
        await g.join("m-1", 1)
        await g.recovered()
        g.expire()
        write(app, {0: 180})
        assert await g.commit()  # succeeds, with no member id: no proof
        await g.join("m-2", 3)

    asyncio.run(run())
    assert g.recovery_read[-1][HELD[0]] == 100


def test_a_memory_table_replays_from_what_it_read_anyway(tmp_path: Path, group: Any) -> None:
    """Faust's memory store persists no offset, and its recovery keeps, for a partition it
    keeps across a rebalance, the last offset it read (never its own writes): nothing to
    rewind, and nothing is touched."""
    app = zombie_app(tmp_path, store="memory://")
    g = group(app)
    recovery = app.tables.recovery

    async def run() -> None:
        await g.join("m-1", 1)
        app.consumer_generation_id = 1
        await recovery.on_rebalance(set(HELD), set(), set(HELD), 1)
        recovery.active_offsets[HELD[0]] = 100  # what it read
        write(app, {0: 180})  # the zombie's write: the memory store keeps no offset
        g.expire()
        await g.join("m-2", 3)
        app.consumer_generation_id = 3
        await recovery.on_rebalance(set(HELD), set(), set(), 3)

    asyncio.run(run())
    assert recovery.active_offsets[HELD[0]] == 100
    assert g.recovery_read[-1] == dict.fromkeys(HELD)


def test_the_rebalance_listener_notes_the_member_id_of_each_assignment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read on the consumer thread right after the join, as Faust reads the generation there,
    before the assignment is handed to Faust's main thread."""
    app = zombie_app(tmp_path)
    consumer = app.consumer
    handed: list[str | None] = []

    async def faust_s(listener: Any, assigned: Any) -> None:
        handed.append(consumer._assigned_as)

    monkeypatch.setattr(faust_aiokafka.ConsumerRebalanceListener, "on_partitions_assigned", faust_s)
    thread = consumer._thread
    thread._consumer = SimpleNamespace(_coordinator=SimpleNamespace(member_id="m-9", generation=4))
    asyncio.run(consumer.RebalanceListener(thread).on_partitions_assigned([]))
    assert handed == ["m-9"]


def test_a_store_that_cannot_be_read_is_left_as_it_is() -> None:
    """A store whose offset cannot be read now (a lock, the disk) is neither proven nor
    rewound, and the others still are."""

    class Store:
        def __init__(self, offset: int | None, fails: bool = False) -> None:
            self.offset, self.fails = offset, fails

        def persisted_offset(self, tp: TP) -> int | None:
            if self.fails:
                raise OSError("IO error: lock")
            return self.offset

        def set_persisted_offset(self, tp: TP, offset: int) -> None:
            self.offset = offset

    good, bad = Store(10), Store(10, fails=True)
    stores = {"good": good, "bad": bad}
    proven = ProvenOffsets()
    proven.assigned("m-1", [TP("good", 0), TP("bad", 0)], stores)
    proven.recovered(stores)
    assert proven.proven == {TP("good", 0): 10}  # none known of "bad": not "proven none"
    good.offset = 20
    rewound = proven.rewind_if_lost("m-2", stores, [TP("good", 0), TP("bad", 0)])
    assert [r.describe() for r in rewound] == ["good[0] 20 -> 10"]
    assert good.offset == 10


def test_changelog_stores_maps_each_table_s_changelog_to_its_store(tmp_path: Path) -> None:
    app = zombie_app(tmp_path)
    assert changelog_stores(app) == {CL: app.tables["totals"].data}


def test_a_loss_during_a_restore_keeps_what_it_restored(
    tmp_path: Path, group: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A membership lost before Faust's recovery completed since the assignment
    (the worker processed nothing: every offset on disk since was read from the changelog)
    rewinds nothing; the restore goes on from where it was, for a new partition (None at the
    assignment) and a kept one (100 at the assignment)."""
    app = zombie_app(tmp_path)
    g = group(app)

    async def run() -> None:
        write(app, {1: 100})
        await g.join("m-1", 1)
        write(app, {0: 900, 1: 5000})  # the recovery's reads, no own writes
        g.expire()
        await g.join("m-2", 3)
        write(app, {0: 950})  # the recovery goes on, completes, then streams process
        await g.recovered()
        write(app, {0: 990})
        g.expire()
        await g.join("m-3", 5)

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        asyncio.run(run())
    assert g.recovery_read[1] == {HELD[0]: 900, HELD[1]: 5000, HELD[2]: None, HELD[3]: None}
    assert g.recovery_read[2][HELD[0]] == 950  # processed after the recovery: rewound
    (warning,) = rewind_warnings(caplog)
    assert "member id m-2, now m-3" in warning


def test_a_recovery_completed_inside_faust_s_callback_counts(tmp_path: Path, group: Any) -> None:
    """With no recovery to do Faust may complete it inside its assignment callback: that
    completion is of this assignment, so a later loss rewinds the writes processed after it."""
    app = zombie_app(tmp_path)
    g = group(app)

    async def run() -> None:
        write(app, {0: 100})
        await g.join("m-1", 1)
        g.on_assigned = g.recovered  # the completion inside the next callback
        await g.join("m-1", 2)
        g.on_assigned = None
        write(app, {0: 180})
        g.expire()
        await g.join("m-2", 3)

    asyncio.run(run())
    assert g.recovery_read[-1][HELD[0]] == 100


def test_an_assignment_without_a_member_id_counts_as_a_loss(
    tmp_path: Path, group: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The listener read "" (a heartbeat's reset between the
    join and the listener), right after a zombie's writes. That assignment proves no
    membership: it is a loss, rewound before its recovery reads (not deferred to the next real
    id, which let the recovery read the zombie's offsets); and so is the next one, twice in a
    row without an id included (the worker may have processed as a zombie of either)."""
    app = zombie_app(tmp_path)
    g = group(app)

    async def run() -> None:
        write(app, {0: 100})
        await g.join("m-1", 1)
        await g.recovered()
        write(app, {0: 150})
        assert await g.commit()  # proves 150
        g.expire()
        write(app, {0: 160})  # the zombie's write
        await g.join("", 2)
        assert g.recovery_read[-1][HELD[0]] == 150  # rewound before the recovery read
        await g.recovered()
        write(app, {0: 300})  # processed under a void membership
        assert await g.commit()  # under "": proves nothing
        await g.join("", 3)
        assert g.recovery_read[-1][HELD[0]] == 150
        await g.recovered()
        write(app, {0: 400})
        await g.join("m-4", 4)

    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        asyncio.run(run())
    assert g.recovery_read[-1][HELD[0]] == 150
    warnings = rewind_warnings(caplog)
    assert len(warnings) == 3
    assert "member id m-1, now unknown" in warnings[0]
    assert "member id unknown, now m-4" in warnings[2]


def test_an_offset_unreadable_at_the_assignment_is_proven_when_readable_later() -> None:
    """A store that fails at the assignment (a lock) and reads fine at the
    recovery is proven there; a loss then rewinds to that proof, not to the start (a needless
    full restore)."""

    class Store:
        def __init__(self, offset: int, failures: int) -> None:
            self.offset, self.failures = offset, failures

        def persisted_offset(self, tp: TP) -> int | None:
            if self.failures:
                self.failures -= 1
                raise OSError("IO error: lock")
            return self.offset

        def set_persisted_offset(self, tp: TP, offset: int) -> None:
            self.offset = offset

    store = Store(10, failures=1)
    proven = ProvenOffsets()
    proven.assigned("m-1", [TP("t", 0)], {"t": store})  # fails
    assert proven.proven == {}
    proven.recovered({"t": store})  # reads 10
    assert proven.proven == {TP("t", 0): 10}
    assert proven.rewind_if_lost("m-2", {"t": store}, [TP("t", 0)]) == []
    assert store.offset == 10


def test_the_proofs_file_round_trip(tmp_path: Path) -> None:
    """What is saved at a proof reads back the same: offsets, "none proven" and the recovery
    flag; an unchanged proof is not written again."""
    file = ProofsFile(tmp_path / PROOFS_FILE)
    assert file.read() is None  # the first start with this version
    proofs = {TP(CL, 0): 150, TP(CL, 1): None, TP("other", 3): 7}
    file.write(proofs, recovered=True)
    saved = file.read()
    assert saved is not None
    assert (saved.proven, saved.recovered) == (proofs, True)
    (tmp_path / PROOFS_FILE).unlink()
    file.write(proofs, recovered=True)  # the same bytes: not written again
    assert not (tmp_path / PROOFS_FILE).exists()


def restart(app: faust.App, tmp_path: Path) -> faust.App:
    """The worker killed and started again: its handles gone, its disk as it was."""
    store = app.tables["totals"].data
    for db in store._dbs.values():
        db.close()
    store._dbs.clear()
    app.assignor._on_app_stop()
    return zombie_app(tmp_path)


def test_a_zombie_killed_before_it_rejoins_is_rewound_at_its_restart(
    tmp_path: Path, group: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The loss the file closes: killed -9 as a zombie (its writes after its last commit
    passed another worker's), the worker restarts; at its first assignment the last run's
    proofs count as those of a lost membership, so its recovery reads from its last commit."""
    app = zombie_app(tmp_path)
    g = group(app)

    async def before_the_kill() -> None:
        write(app, {0: 100, 1: 110})
        await g.join("m-1", 1)
        await g.recovered()
        write(app, {0: 150})
        assert await g.commit()  # proves 150 (and 110)
        g.expire()
        write(app, {0: 180, 1: 111})  # the zombie's writes; then kill -9

    asyncio.run(before_the_kill())
    app = restart(app, tmp_path)
    g = group(app)
    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        asyncio.run(g.join("m-7", 1))
    assert g.recovery_read[-1] == {HELD[0]: 150, HELD[1]: 110, HELD[2]: None, HELD[3]: None}
    assert rewind_warnings(caplog) == []  # a restart is no zombie by itself
    (line,) = restart_lines(caplog)
    assert line.startswith("this worker restarted: 2 table changelog partitions had")
    assert f"{CL}[0] 180 -> 150, {CL}[1] 111 -> 110" in line


def spread(app: faust.App, tmp_path: Path) -> set[int]:
    """A rebalance of ``app`` with three other workers: the changelog partitions it gets
    (actives and standbys), fewer than all."""
    others = {f"m{i}": zombie_app(tmp_path / f"other{i}").assignor for i in range(1, 4)}
    rebalance({"m0": app.assignor, **others}, counts=COUNTS)
    assignor = app.assignor
    here = {tp.partition for tp in assignor.assigned_actives() | assignor.assigned_standbys()}
    assert 0 < len(here & set(range(4))) < len(HELD)
    return {p for p in here if TP(CL, p) in HELD}


def kill_after_stale_writes(app: faust.App, g: Any) -> None:
    """Proven at 10 everywhere, each partition holding a key of its own; then writes past
    the proof (a zombie's, or a healthy worker's since its last commit) and kill -9."""

    async def run() -> None:
        await g.join("m-1", 1)
        await g.recovered()
        store = app.tables["totals"].data
        for p in range(4):
            store._db_for_partition(p).put(f"key-of-{p}".encode(), b"stale")
        write(app, {p: 10 for p in range(4)})
        assert await g.commit()
        write(app, {p: 20 for p in range(4)})

    asyncio.run(run())


def first_assignment(app: faust.App, member_id: str) -> None:
    """What the transport does before and after Faust's assignment callback, without the
    stand-in recovery (which reads every partition of ``HELD``)."""
    app.consumer.note_membership((member_id, 1))
    app.consumer._rewind_if_lost()
    app.consumer._prove_assignment()


def saved_proofs(app: faust.App) -> Any:
    state = app.assignor.state_path()
    assert state is not None
    return ProofsFile(state / PROOFS_FILE).read()


def test_the_restart_opens_no_database_faust_would_not_open(tmp_path: Path, group: Any) -> None:
    """The first assignment after a restart reads and rewinds only the
    partitions it gives the worker. Opening the others' databases in Faust's store left them
    open for the run, and Faust's reads outside an event (timers, tasks, web views) answered
    from their stale keys."""
    app = zombie_app(tmp_path)
    kill_after_stale_writes(app, group(app))
    app = restart(app, tmp_path)
    here = spread(app, tmp_path)
    away = set(range(4)) - here
    store = app.tables["totals"].data
    for p in here:
        store._db_for_partition(p)  # what Faust opens for this assignment
    group(app)
    first_assignment(app, "m-7")
    assert set(store._dbs) == here
    assert {p: store._get(f"key-of-{p}".encode()) for p in away} == dict.fromkeys(away)
    assert {p: persisted(app)[p] for p in here} == dict.fromkeys(here, 10)


def test_the_last_run_s_partitions_not_assigned_now_are_rewound_when_assigned_later(
    tmp_path: Path, group: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The partitions of the file the first assignment does not give the worker keep their
    proofs (in memory and in the file) and are rewound at the first assignment that gives
    them, whatever its member id; then they are dropped from the carried ones."""
    app = zombie_app(tmp_path)
    kill_after_stale_writes(app, group(app))
    app = restart(app, tmp_path)
    away = set(range(4)) - spread(app, tmp_path)
    g = group(app)
    first_assignment(app, "m-7")
    saved = saved_proofs(app)
    assert saved.carried == {TP(CL, p): 10 for p in away}
    rebalance({"m0": app.assignor}, counts=COUNTS)  # the others left: all of it here
    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        asyncio.run(g.join("m-7", 2))  # the same member id: no loss, but carried ones are due
    assert g.recovery_read[-1] == dict.fromkeys(HELD, 10)
    (line,) = restart_lines(caplog)
    assert all(f"{CL}[{p}] 20 -> 10" in line for p in away)
    assert saved_proofs(app).carried == {}
    assert app.consumer.proven_offsets.carried == {}


def test_a_loss_in_a_run_carries_the_held_partitions_assigned_elsewhere(
    tmp_path: Path, group: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Within a run too: after a lost membership the held partitions the new assignment does
    not give the worker are not opened; they are rewound when they come back."""
    app = zombie_app(tmp_path)
    g = group(app)
    kill_after_stale_writes(app, g)  # not killed: it goes on as a zombie
    g.expire()
    away = set(range(4)) - spread(app, tmp_path)
    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        first_assignment(app, "m-2")
    (warning,) = rewind_warnings(caplog)
    assert f"{len(away)} assigned elsewhere now are rewound when next assigned here" in warning
    assert app.consumer.proven_offsets.carried == {TP(CL, p): 10 for p in away}


def test_a_restart_during_a_restore_keeps_what_it_restored(tmp_path: Path, group: Any) -> None:
    """Killed before its recovery completed since the assignment, the last run processed
    nothing: its offsets are what it read, and the restore goes on from there."""
    app = zombie_app(tmp_path)
    g = group(app)

    async def before_the_kill() -> None:
        await g.join("m-1", 1)
        write(app, {0: 900})  # the recovery's reads; then kill -9

    asyncio.run(before_the_kill())
    app = restart(app, tmp_path)
    g = group(app)
    asyncio.run(g.join("m-7", 1))
    assert g.recovery_read[-1][HELD[0]] == 900


@pytest.mark.parametrize("content", [b"{not json", b"", b"[]"])
def test_a_damaged_proofs_file_restores_the_first_assignment_from_the_start(
    tmp_path: Path, group: Any, caplog: pytest.LogCaptureFixture, content: bytes
) -> None:
    """A proofs file that cannot be read or parsed (rare: it is written durably): which
    partitions the last run wrote is unknown, so every changelog partition of the first
    assignment is restored from the start (trusting the disk may lose records); one WARNING
    says so."""
    app = zombie_app(tmp_path)
    write(app, {0: 180, 2: 40})
    app = restart(app, tmp_path)
    state = app.assignor.state_path()
    assert state is not None
    (state / PROOFS_FILE).write_bytes(content)
    g = group(app)
    with caplog.at_level(logging.WARNING, logger="streamassign.faust"):
        asyncio.run(g.join("m-7", 1))
    assert g.recovery_read[-1] == {
        HELD[0]: NOTHING_APPLIED,
        HELD[1]: None,
        HELD[2]: NOTHING_APPLIED,
        HELD[3]: None,
    }
    assert any("cannot use the proven changelog offsets" in m for m in caplog.messages)


def test_no_proofs_file_changes_nothing(tmp_path: Path, group: Any) -> None:
    """The first start with this version (or a file deleted): the disk is read as before."""
    app = zombie_app(tmp_path)
    write(app, {0: 180})
    app = restart(app, tmp_path)
    g = group(app)
    asyncio.run(g.join("m-7", 1))
    assert g.recovery_read[-1][HELD[0]] == 180
    state = app.assignor.state_path()
    assert state is not None
    assert ProofsFile(state / PROOFS_FILE).read() is not None  # written at that assignment


def test_memory_tables_write_no_proofs_file(tmp_path: Path, group: Any) -> None:
    app = zombie_app(tmp_path, store="memory://")
    g = group(app)
    asyncio.run(g.join("m-1", 1))
    state = app.assignor.state_path()
    assert state is not None
    assert not (state / PROOFS_FILE).exists()


def test_exactly_once_rewinds_nothing(tmp_path: Path, group: Any) -> None:
    """Under exactly_once Faust persists offsets only after its transaction
    committed (a zombie's is fenced) and never calls ``_commit``: a rewind would only replay
    everything since the last rebalance."""
    app = zombie_app(tmp_path)
    app.conf.processing_guarantee = "exactly_once"
    g = group(app)

    async def run() -> None:
        write(app, {0: 100})
        await g.join("m-1", 1)
        await g.recovered()
        write(app, {0: 180})  # committed transactions
        g.expire()
        await g.join("m-2", 3)

    asyncio.run(run())
    assert g.recovery_read[-1][HELD[0]] == 180


def test_a_proofs_file_of_an_unknown_version_counts_as_none(
    tmp_path: Path, group: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A newer release's file, after a rollback, is no damage: the disk is
    trusted as with no file (one INFO line), not restored in full; this run's format replaces
    it."""
    app = zombie_app(tmp_path)
    write(app, {0: 180})
    app = restart(app, tmp_path)
    state = app.assignor.state_path()
    assert state is not None
    (state / PROOFS_FILE).write_bytes(b'{"version": 99, "something": "new"}')
    g = group(app)
    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        asyncio.run(g.join("m-7", 1))
    assert g.recovery_read[-1][HELD[0]] == 180
    assert not any(r.levelno >= logging.WARNING for r in caplog.records)
    assert any("version 99" in m for m in caplog.messages)
    assert saved_proofs(app).proven[HELD[0]] == 180


def test_a_run_under_exactly_once_removes_a_leftover_proofs_file(
    tmp_path: Path, group: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A run that keeps no proofs moves the offsets past the file's; a
    later at-least-once run applied them (1000000 -> 10: a replay of that whole run). Such a
    run removes the file, so the later one trusts the disk, as after a first start."""
    app = zombie_app(tmp_path)
    g = group(app)

    async def at_least_once() -> None:
        await g.join("m-1", 1)
        await g.recovered()
        write(app, {0: 10})
        assert await g.commit()

    asyncio.run(at_least_once())
    app = restart(app, tmp_path)
    app.conf.processing_guarantee = "exactly_once"
    g = group(app)
    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        asyncio.run(g.join("m-2", 1))
    assert saved_proofs(app) is None
    assert any("removed the proven changelog offsets" in m for m in caplog.messages)
    write(app, {0: 1_000_000})  # its committed transactions
    app = restart(app, tmp_path)
    g = group(app)
    asyncio.run(g.join("m-3", 1))
    assert g.recovery_read[-1][HELD[0]] == 1_000_000


def test_a_run_without_tables_on_disk_removes_a_leftover_proofs_file(
    tmp_path: Path, group: Any
) -> None:
    app = zombie_app(tmp_path)
    asyncio.run(group(app).join("m-1", 1))
    assert saved_proofs(app) is not None
    restart(app, tmp_path).assignor._on_app_stop()
    app = zombie_app(tmp_path, store="memory://")
    asyncio.run(group(app).join("m-2", 1))
    state = app.assignor.state_path()
    assert state is not None
    assert not (state / PROOFS_FILE).exists()


def test_offsets_moved_while_no_stream_offset_moves_are_replayed_at_a_restart(
    tmp_path: Path, group: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Offsets that move while no stream offset does (a global table applied on a worker
    whose streams are idle) are never proven (Faust calls the commit only with a committable
    offset, at its stop too), so any restart replays them: one INFO line, no WARNING."""
    app = zombie_app(tmp_path)
    g = group(app)

    async def run() -> None:
        await g.join("m-1", 1)
        await g.recovered()
        write(app, {0: 10})
        assert await g.commit()
        write(app, {0: 500})  # applied while nothing is committable

    asyncio.run(run())
    app = restart(app, tmp_path)
    g = group(app)
    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        asyncio.run(g.join("m-7", 1))
    assert g.recovery_read[-1][HELD[0]] == 10
    assert rewind_warnings(caplog) == []
    (line,) = restart_lines(caplog)
    assert f"{CL}[0] 500 -> 10" in line


def test_an_offset_unreadable_at_the_restart_keeps_its_proof(
    tmp_path: Path, group: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition of the file whose offset cannot be read at the first
    assignment (a lock, the disk) is not rewound then; its proof stays (carried, in the file)
    and the next assignment that can read it rewinds it, instead of trusting its disk."""
    app = zombie_app(tmp_path)
    kill_after_stale_writes(app, group(app))
    app = restart(app, tmp_path)
    store = app.tables["totals"].data
    real = type(store).persisted_offset
    failing = {HELD[2]}

    def flaky(self: Any, tp: TP) -> Any:
        if tp in failing:
            raise OSError("IO error: lock")
        return real(self, tp)

    monkeypatch.setattr(type(store), "persisted_offset", flaky)
    g = group(app)
    first_assignment(app, "m-7")
    assert saved_proofs(app).carried == {HELD[2]: 10}
    failing.clear()
    asyncio.run(g.join("m-7", 2))
    assert g.recovery_read[-1] == dict.fromkeys(HELD, 10)
    assert saved_proofs(app).carried == {}


def test_a_failed_write_is_warned_about_again_after_a_good_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One WARNING per episode of failed writes (a full disk), not per run."""
    file = ProofsFile(tmp_path / "state" / PROOFS_FILE)  # no directory: the write fails
    with caplog.at_level(logging.DEBUG, logger="streamassign.faust"):
        file.write({HELD[0]: 1}, recovered=True)
        file.write({HELD[0]: 2}, recovered=True)
        (tmp_path / "state").mkdir()
        file.write({HELD[0]: 3}, recovered=True)
        (tmp_path / "state" / PROOFS_FILE).unlink()
        (tmp_path / "state").rmdir()
        file.write({HELD[0]: 4}, recovered=True)
    told = [r.levelno for r in caplog.records if "cannot save" in r.getMessage()]
    assert told == [logging.WARNING, logging.DEBUG, logging.WARNING]


def test_the_proofs_file_is_written_durably(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An assignment's and a recovery's proofs are fsynced (the file and its directory), so a
    host crash leaves the old file or the new one, not an empty one (which would restore
    every partition in full)."""
    synced: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    ProofsFile(tmp_path / PROOFS_FILE).write({HELD[0]: 1}, recovered=True)
    assert len(synced) == 2  # the file, then its directory


def test_a_commit_s_proof_is_saved_without_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit's proof (every ~2.8 s) is written without the fsyncs, which a disk busy with
    compaction makes cost tens of milliseconds of Faust's event loop; a process that dies
    keeps it all the same (the page cache)."""
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    file = ProofsFile(tmp_path / PROOFS_FILE)
    proofs = ProvenOffsets(held=frozenset({HELD[0]}), held_as="m-1", file=file)
    proofs.prove({HELD[0]: 5})
    assert synced == []
    saved = ProofsFile(tmp_path / PROOFS_FILE).read()
    assert saved is not None and saved.proven == {HELD[0]: 5}
