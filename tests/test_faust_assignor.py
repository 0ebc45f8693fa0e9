"""``streamassign.faust:PartitionAssignor`` inside real Faust app objects (no broker): the aiokafka
assignor round trip, and everything Faust's tables, router and web views ask of ``app.assignor``.
The broker test with worker processes is tests/integration/test_faust_app.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import types
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import faust
import pytest
import rocksdict
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from faust.tables.recovery import Recovery
from faust.types import TP

from streamassign import TaskId
from streamassign.errors import ErrorCode
from streamassign.faust import CAPACITY_ENV, PROTOCOL_NAME, PartitionAssignor
from streamassign.faust import _damaged as damaged_module
from streamassign.faust import assignor as assignor_module
from streamassign.faust.leader import (
    CAPACITY_TAG,
    CHANGELOGS_TAG,
    GLOBAL_CHANGELOGS_TAG,
    MAX_CAPACITY,
    RECOVERED_TAG,
    assign_faust,
)
from streamassign.faust.topology import faust_style_topology
from streamassign.localstate import StateDirectory
from streamassign.protocol import LATEST_OFFSET, MAX_TASK_IDS, AssignmentInfo, SubscriptionInfo
from streamassign.streams import MemberSubscription

from .measure import best_of, peak_of

APP = "shop"
SRC = "orders"
CL = f"{APP}-totals-changelog"
SEEN_CL = f"{APP}-seen-changelog"  # a second table's, where a test adds one
GLOBAL_CL = f"{APP}-rates-changelog"
COUNTS = {SRC: 6, CL: 6, GLOBAL_CL: 2}


class Cluster:
    """The one thing ``assign`` reads of aiokafka's ClusterMetadata."""

    def __init__(self, counts: Mapping[str, int]) -> None:
        self.counts = counts

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        n = self.counts.get(topic)
        return set(range(n)) if n else None


def make_app(
    datadir: Path,
    port: int,
    store: str = "memory://",
    assignor: str | type[PartitionAssignor] = "streamassign.faust:PartitionAssignor",
    table_options: Mapping[str, Any] | None = None,
) -> faust.App:
    app = faust.App(
        APP,
        broker="kafka://localhost:1",
        datadir=str(datadir),
        store=store,
        canonical_url=f"http://127.0.0.1:{port}",
        PartitionAssignor=assignor,
        table_standby_replicas=1,
        topic_partitions=6,
    )
    app.Table("totals", default=int, options=dict(table_options) if table_options else None)
    app.GlobalTable("rates", default=int, partitions=2)
    return app


def rebalance(
    assignors: Mapping[str, PartitionAssignor],
    counts: Mapping[str, int] = COUNTS,
    garbage: Mapping[str, bytes] | None = None,
) -> dict[str, ConsumerProtocolMemberAssignment]:
    """One join/sync round: every member's metadata, the first member leads, all apply."""
    metadata = {m: a.metadata(set(counts)) for m, a in assignors.items()}
    for m, data in (garbage or {}).items():
        metadata[m] = ConsumerProtocolMemberMetadata(0, sorted(counts), data)
    leader = next(iter(assignors.values()))
    encoded = leader.assign(Cluster(counts), metadata)
    out = {m: ConsumerProtocolMemberAssignment.decode(raw) for m, raw in encoded.items()}
    for m, a in assignors.items():
        a.on_assignment(out[m])
    return out


@pytest.fixture
def workers(tmp_path: Path) -> dict[str, PartitionAssignor]:
    out = {}
    for i in range(3):
        assignor = make_app(tmp_path / f"w{i}", 7000 + i).assignor
        assert isinstance(assignor, PartitionAssignor)
        out[f"m{i}"] = assignor
    return out


def tps(pairs: Any, topic: str) -> set[int]:
    return {tp.partition for tp in pairs if tp.topic == topic}


def test_the_setting_picks_our_assignor(workers: dict[str, PartitionAssignor]) -> None:
    assignor = workers["m0"]
    assert assignor.replicas == 1
    assert assignor.name == "streamassign-faust"


def url(i: int) -> str:
    return f"http://127.0.0.1:{7000 + i}"


def key_partition_by_first_byte(app: faust.App, monkeypatch: pytest.MonkeyPatch) -> None:
    """Faust's producer hashes keys with cluster metadata it only has when connected; here a
    key's partition is its first byte (key_store's own work is what the tests check)."""
    monkeypatch.setattr(app.producer, "key_partition", lambda topic, key: TP(topic, key[0]))


def test_round_trip_serves_tables_router_and_views(
    workers: dict[str, PartitionAssignor], monkeypatch: pytest.MonkeyPatch
) -> None:
    result = rebalance(workers)
    actives = [tps(a.assigned_actives(), SRC) for a in workers.values()]
    assert sorted(p for ps in actives for p in ps) == list(range(6))
    assert all(len(ps) == 2 for ps in actives)
    for m, a in workers.items():
        kafka = {TP(t, p) for t, ps in result[m].assignment for p in ps}
        assert a.assigned_actives() <= kafka and a.assigned_standbys() <= kafka
        # Only a global table's partitions are both (as Faust does: recovered, and followed).
        assert {tp.topic for tp in a.assigned_actives() & a.assigned_standbys()} <= {GLOBAL_CL}
        # Changelog partitions follow their source partitions; standbys only of changelogs.
        assert tps(a.assigned_actives(), CL) == tps(a.assigned_actives(), SRC)
        assert {tp.topic for tp in a.assigned_standbys()} <= {CL, GLOBAL_CL}
        # A global table is kept whole on every worker.
        assert tps(a.assigned_actives(), GLOBAL_CL) == {0, 1}
        assert a.group_for_topic(SRC) == a.group_for_topic(CL)
    # Every source and changelog partition is active on exactly one worker; every changelog
    # partition is a standby on exactly one other worker; sources are never standbys.
    for p in range(6):
        assert sum(a.is_active(TP(SRC, p)) for a in workers.values()) == 1
        active_on = [m for m, a in workers.items() if a.is_active(TP(CL, p))]
        standby_on = [m for m, a in workers.items() if a.is_standby(TP(CL, p))]
        assert len(active_on) == len(standby_on) == 1 and active_on != standby_on
        assert not any(a.is_standby(TP(SRC, p)) for a in workers.values())

    a = workers["m1"]
    tables = a.tables_metadata()
    assert set(tables) == {url(i) for i in range(3)}
    for i, w in enumerate(workers.values()):
        assert set(tables[url(i)][CL]) == tps(w.assigned_actives(), CL)
    assert all(set(v) == {CL} for v in a.table_metadata(CL).values())
    external = a.external_topics_metadata()
    assert sorted(p for v in external.values() for p in v.get(SRC, [])) == list(range(6))
    # The router: a key's table partition (and topic partition) is served by its active worker.
    key_partition_by_first_byte(a.app, monkeypatch)
    owner = {
        p: url(i) for i, w in enumerate(workers.values()) for p in tps(w.assigned_actives(), SRC)
    }
    for p in range(6):
        assert str(a.key_store(CL, bytes([p]))) == owner[p]
        assert str(a.external_key_store(SRC, bytes([p]))) == owner[p]
    assert str(a.key_store(GLOBAL_CL, b"\x00")) == url(1)  # a global table: ask yourself


def test_restart_reports_what_the_worker_ran(
    workers: dict[str, PartitionAssignor], tmp_path: Path
) -> None:
    rebalance(workers)
    ran = workers["m2"].info.active
    # Same datadir as m2 after m2's process died (its lock is gone with it).
    assert workers["m2"]._state is not None
    workers["m2"]._state.close()
    restarted = make_app(tmp_path / "w2", 7002).assignor
    meta = restarted.metadata(set(COUNTS))
    info = SubscriptionInfo.decode(meta.user_data)
    assert info.previous_active == ran
    assert info.offset_sums == {}  # in-memory tables: nothing kept, the leader hands them back
    assert info.process_id == workers["m2"]._process_id
    survivors = {m: workers[m] for m in ("m0", "m1")}
    rebalance(survivors)
    rebalance({**survivors, "m2": restarted})
    assert restarted.info.active == ran


def test_a_locked_state_directory_is_no_crash(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = make_app(tmp_path / "same", 7000).assignor
    second = make_app(tmp_path / "same", 7001).assignor
    first.metadata({SRC})
    with caplog.at_level(logging.WARNING, "streamassign.faust"):
        meta = second.metadata({SRC})  # runs this time without restart stickiness
    assert SubscriptionInfo.decode(meta.user_data).process_id != first._process_id
    # One line that says what happens this run only (it said the worker "will not be sticky
    # across restarts" after an error saying it keeps its identity once fixed).
    [line] = [r.getMessage() for r in caplog.records if "state directory" in r.getMessage()]
    assert "running this time with a temporary process id" in line
    assert "across restarts" not in line


def test_garbage_member_and_garbage_assignment(workers: dict[str, PartitionAssignor]) -> None:
    faust_json = b'{"assignment": {"actives": {}, "standbys": {}}, "url": "http://x"}'
    result = rebalance(workers, garbage={"old-faust": faust_json})
    assert set(result) == {*workers, "old-faust"}
    assert result["old-faust"].assignment  # a member without history still gets work

    a = workers["m0"]
    bad = ConsumerProtocolMemberAssignment(0, [(SRC, [0, 1])], b"not ours")
    a.on_assignment(bad)
    assert a.assigned_actives() == {TP(SRC, 0), TP(SRC, 1)}
    assert a.assigned_standbys() == set()


def test_capacity_from_the_environment(
    workers: dict[str, PartitionAssignor], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CAPACITY_ENV, "2")
    info = SubscriptionInfo.decode(workers["m0"].metadata({SRC}).user_data)
    assert info.client_tags[CAPACITY_TAG] == "2"
    for bad in ("0", str(MAX_CAPACITY + 1)):
        monkeypatch.setenv(CAPACITY_ENV, bad)
        info = SubscriptionInfo.decode(workers["m0"].metadata({SRC}).user_data)
        assert CAPACITY_TAG not in info.client_tags


@pytest.mark.parametrize(
    ("capacity", "error"),
    [(0, ValueError), (-1, ValueError), (MAX_CAPACITY + 1, ValueError), ("2", TypeError)],
)
def test_a_bad_capacity_on_a_subclass_stops_the_app_at_start(
    tmp_path: Path, capacity: object, error: type[Exception]
) -> None:
    class Bad(PartitionAssignor):
        pass

    Bad.capacity = capacity  # type: ignore[assignment]
    with pytest.raises(error, match="capacity"):
        _ = make_app(tmp_path, 7000, assignor=Bad).assignor


def test_capacity_weights_the_share(workers: dict[str, PartitionAssignor]) -> None:
    class Heavy(PartitionAssignor):
        capacity = 2

    heavy = Heavy(workers["m0"].app, replicas=1)
    rebalance({**workers, "m0": heavy}, counts={SRC: 8})
    assert len(heavy.assigned_actives()) == 4
    assert [len(workers[m].assigned_actives()) for m in ("m1", "m2")] == [2, 2]


def test_a_stateless_app(tmp_path: Path) -> None:
    apps = [
        faust.App(
            "plain",
            broker="kafka://localhost:1",
            datadir=str(tmp_path / f"p{i}"),
            PartitionAssignor=PartitionAssignor,
        )
        for i in range(2)
    ]
    assignors = {f"m{i}": app.assignor for i, app in enumerate(apps)}
    rebalance(assignors, counts={"clicks": 5})
    assert sorted(len(a.assigned_actives()) for a in assignors.values()) == [2, 3]
    assert all(not a.assigned_standbys() for a in assignors.values())


def state_file(app: faust.App) -> Path:
    return Path(app.conf.appdir) / "streamassign" / "faust-assignment.json"


def reported(assignor: PartitionAssignor) -> SubscriptionInfo:
    return SubscriptionInfo.decode(assignor.metadata(set(COUNTS)).user_data)


def test_restart_reports_rocksdb_offsets_without_touching_faust_handles(tmp_path: Path) -> None:
    """After a restart the worker reports the offsets its RocksDB table persisted, read through
    private read-only handles: Faust's own store opens nothing (a handle the consumer thread
    put there would leak, and hold RocksDB's lock)."""
    first = make_app(tmp_path / "w0", 7000, store="rocksdb://")
    before = first.assignor
    rebalance({"m0": before}, counts={SRC: 6, CL: 6})
    ran = before.info.active
    store = first.tables["totals"].data
    for t in ran:
        store.set_persisted_offset(TP(CL, t.partition), 100 + t.partition)
    for db in store._dbs.values():  # what Faust does when the worker stops
        db.close()
    store._dbs.clear()
    asyncio.run(first.on_before_shutdown.send())  # releases the state directory

    app = make_app(tmp_path / "w0", 7000, store="rocksdb://")
    info = reported(app.assignor)
    assert info.previous_active == ran
    assert info.offset_sums == {t: 100 + t.partition for t in ran}
    assert app.tables["totals"].data._dbs == {}
    # While Faust's main thread has a database open (read-write), it is still read.
    t = min(ran)
    app.tables["totals"].data.set_persisted_offset(TP(CL, t.partition), 7)
    assert reported(app.assignor).offset_sums[t] == 7
    assert set(app.tables["totals"].data._dbs) == {t.partition}


SET_CL = f"{APP}-members-changelog"


def with_set_table(app: faust.App) -> faust.App:
    """``app`` with a RocksDB set table of 6 partitions (in the tasks' group, as ``totals``).
    Faust keeps a set table's RocksDB store one level down (``table.data.storage``)."""
    app.SetTable("members", value_type=int, start_manager=False)
    return app


def test_a_restart_reports_the_offsets_of_a_set_table(tmp_path: Path) -> None:
    """A set table's store was looked for at ``table.data`` (Faust's
    ``ChangeloggedSetManager``), so its offsets were never read: a task whose only state is a
    set table had no sum, and was handed back as stateless whatever its lag. Its offsets now
    count in the task's sum with the other tables', read without Faust's handles."""
    counts = {SRC: 6, CL: 6, SET_CL: 6}
    first = with_set_table(make_app(tmp_path / "w0", 7000, store="rocksdb://"))
    rebalance({"m0": first.assignor}, counts=counts)
    ran = first.assignor.info.active
    stores = [first.tables["totals"].data, first.tables["members"].data.storage]
    for t in ran:
        stores[0].set_persisted_offset(TP(CL, t.partition), 100 + t.partition)
        stores[1].set_persisted_offset(TP(SET_CL, t.partition), 1000 + t.partition)
    for store in stores:  # what Faust does when the worker stops
        for db in store._dbs.values():
            db.close()
        store._dbs.clear()
    asyncio.run(first.on_before_shutdown.send())

    app = with_set_table(make_app(tmp_path / "w0", 7000, store="rocksdb://"))
    info = reported(app.assignor)
    assert info.previous_active == ran
    assert info.offset_sums == {t: 1100 + 2 * t.partition for t in ran}
    assert app.tables["members"].data.storage._dbs == {}


def stopped_after_running_alone(
    datadir: Path, counts: Mapping[str, int], table_options: Mapping[str, Any] | None = None
) -> frozenset[TaskId]:
    """A RocksDB worker that ran every task alone, persisted an offset of each and stopped as
    Faust stops (databases closed, state directory released): the tasks it ran."""
    app = make_app(datadir, 7000, store="rocksdb://", table_options=table_options)
    rebalance({"m0": app.assignor}, counts=counts)
    ran = app.assignor.info.active
    store = app.tables["totals"].data
    for t in ran:
        store.set_persisted_offset(TP(CL, t.partition), 100 + t.partition)
    for db in store._dbs.values():
        db.close()
    store._dbs.clear()
    asyncio.run(app.on_before_shutdown.send())
    return frozenset(ran)


def wipe(tabledir: Path, how: str, keep: int) -> None:
    """Leave nothing readable of the table's partitions but ``keep``: ``removed`` deletes their
    directories (an ephemeral or replaced volume), ``damaged`` overwrites their files."""
    for partition_dir in tabledir.glob("*-*.db"):
        if partition_dir.name.endswith(f"-{keep}.db"):
            continue
        if how == "removed":
            shutil.rmtree(partition_dir)
        else:
            for file in partition_dir.iterdir():
                file.write_bytes(b"not rocksdb")


@pytest.mark.parametrize("how", ["removed", "damaged"])
def test_a_restart_with_nothing_readable_on_disk_reports_its_rocksdb_tasks_at_0(
    tmp_path: Path, how: str
) -> None:
    """With no sum the leader took a RocksDB task with nothing on disk for
    stateless and handed it back whatever its lag. At 0 its lag is the whole changelog; a
    partition still on disk reports its offset, an in-memory table nothing (test above)."""
    ran = stopped_after_running_alone(tmp_path / "w0", {SRC: 6, CL: 6})
    keep = min(ran).partition
    app = make_app(tmp_path / "w0", 7000, store="rocksdb://")
    wipe(Path(app.conf.tabledir), how, keep)
    info = reported(app.assignor)
    assert info.previous_active == ran
    assert info.offset_sums == {t: 100 + keep if t.partition == keep else 0 for t in ran}


@pytest.mark.parametrize("how", ["removed", "damaged"])
def test_a_worker_given_back_partitions_it_has_no_state_of_says_it_restores_them(
    tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A restarted worker reported its wiped (or damaged, moved aside) table
    partitions at 0, got them back and restored them from scratch with nothing in its log
    saying why. One INFO line at the assignment names those it restores; none for the
    partition still on disk, and none at the next join (it runs them then)."""
    counts = {SRC: 6, CL: 6}
    ran = stopped_after_running_alone(tmp_path / "w0", counts)
    keep = min(ran).partition
    app = make_app(tmp_path / "w0", 7000, store="rocksdb://")
    wipe(Path(app.conf.tabledir), how, keep)
    assignor = app.assignor
    assert isinstance(assignor, PartitionAssignor)

    def restoring_lines() -> list[str]:
        with caplog.at_level(logging.INFO, logger="streamassign.faust"):
            caplog.clear()
            rebalance({"m0": assignor}, counts=counts)
        return [r.getMessage() for r in caplog.records if "no local table state" in r.getMessage()]

    (line,) = restoring_lines()
    assert assignor.info.active == ran  # alone: every one comes back
    cold = sorted(t for t in ran if t.partition != keep)
    assert f"{len(cold)} of the partitions" in line
    assert "none written before the worker stopped" in line and "flushed" not in line
    assert line.endswith("(" + ", ".join(str(t) for t in cold) + ")")
    assert restoring_lines() == []


def test_under_exactly_once_the_restore_line_gives_faust_s_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Under exactly_once Faust records an active's changelog offset only through a
    recovery, so a directory only its actives wrote has none: the line says so beside the
    general reasons, which a wipe still is."""
    counts = {SRC: 6, CL: 6}
    ran = stopped_after_running_alone(tmp_path / "w0", counts)
    app = make_app(tmp_path / "w0", 7000, store="rocksdb://")
    app.conf.processing_guarantee = "exactly_once"
    wipe(Path(app.conf.tabledir), "removed", min(ran).partition)
    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        rebalance({"m0": app.assignor}, counts=counts)
    (line,) = restore_lines(caplog)
    assert "under exactly_once also one no recovery applied records to" in line
    assert "wiped" in line


def restore_lines(caplog: pytest.LogCaptureFixture, level: int = logging.INFO) -> list[str]:
    """The INFO lines naming partitions restored from the start, among ``caplog``'s records."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= level and "no local table state" in r.getMessage()
    ]


def test_the_restore_line_names_only_the_partitions_this_worker_gets_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A restarted worker with wiped tables shares them with a new worker; the
    line names those it got back, not those the leader gave the other."""
    counts = {SRC: 6, CL: 6}
    ran = stopped_after_running_alone(tmp_path / "w0", counts)
    keep = min(ran).partition
    app = make_app(tmp_path / "w0", 7000, store="rocksdb://")
    wipe(Path(app.conf.tabledir), "removed", keep)
    other = make_app(tmp_path / "w1", 7001, store="rocksdb://")
    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        rebalance({"m0": app.assignor, "m1": other.assignor}, counts=counts)
    cold = {t for t in ran if t.partition != keep}
    back = sorted(cold & app.assignor.info.active)
    assert back and cold - set(back)  # some come back, some go to the new worker
    (line,) = restore_lines(caplog)
    assert line.startswith(f"{len(back)} of the partitions")
    assert line.endswith("(" + ", ".join(str(t) for t in back) + ")")


@pytest.mark.parametrize(
    "status",
    [
        "IO error: While open a file for random read: /x/000009.sst: Input/output error",
        "Corruption: Corrupt or unsupported format_version: 7",
    ],
)
def test_the_restore_line_leaves_out_a_partition_it_could_not_read(
    tmp_path: Path, status: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk error or a newer RocksDB's files: nothing read, reported at 0 and
    claimed, and the line said it had no offset persisted and restored it from the start of
    its changelog. Faust fails to open it instead (or finds its offset): it is no cold
    restore."""
    counts = {SRC: 6, CL: 6}
    ran = stopped_after_running_alone(tmp_path / "w0", counts)
    unreadable = min(ran)
    read_settled = assignor_module._read_settled

    def read(store: Any, path: Path) -> bytes | None:
        if path.name.endswith(f"-{unreadable.partition}.db"):
            raise Exception(status)
        return read_settled(store, path)

    monkeypatch.setattr(assignor_module, "_read_settled", read)
    app = make_app(tmp_path / "w0", 7000, store="rocksdb://")
    assert reported(app.assignor).offset_sums[unreadable] == 0  # as before: state at 0
    with caplog.at_level(logging.INFO, logger="streamassign.faust"):
        rebalance({"m0": app.assignor}, counts=counts)
    assert unreadable in app.assignor.info.active
    assert restore_lines(caplog) == []


def test_the_restore_line_leaves_out_a_database_another_process_has_open(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read racing another process's compaction reads as damage; a held LOCK
    means none, and the directory stays, logged at DEBUG. The line above DEBUG said it had no
    offset persisted and was restored from scratch; the database is whole, and Faust resumes
    it from its offset once the lock is released."""
    counts = {SRC: 6, CL: 6}
    ran = stopped_after_running_alone(tmp_path / "w0", counts)
    live = min(ran).partition
    read_settled = assignor_module._read_settled

    def read(store: Any, path: Path) -> bytes | None:
        if path.name.endswith(f"-{live}.db"):
            raise Exception("Corruption: Can't access /x/000012.sst: IO error: No such file")
        return read_settled(store, path)

    monkeypatch.setattr(assignor_module, "_read_settled", read)
    monkeypatch.setattr(damaged_module, "lock_holder", lambda path: "pid 4242")
    app = make_app(tmp_path / "w0", 7000, store="rocksdb://")
    with caplog.at_level(logging.DEBUG, logger="streamassign"):
        rebalance({"m0": app.assignor}, counts=counts)
    assert any("is open in pid 4242" in r.getMessage() for r in caplog.records)
    assert restore_lines(caplog, logging.DEBUG) == []


def test_a_restart_reads_the_offsets_of_a_table_with_a_ttl(tmp_path: Path) -> None:
    """Faust opens a table with the ``ttl`` option as RocksDB's TTL database,
    which ends every value with its 4-byte write time, also the persisted offset's. Read as is
    it was no offset, and the restarted worker reported its healthy tasks at 0 (the whole
    changelog's lag) instead of their offsets."""
    ttl = {"ttl": 3600}
    ran = stopped_after_running_alone(tmp_path / "w0", {SRC: 6, CL: 6}, ttl)
    app = make_app(tmp_path / "w0", 7000, store="rocksdb://", table_options=ttl)
    info = reported(app.assignor)
    assert info.previous_active == ran
    assert info.offset_sums == {t: 100 + t.partition for t in ran}


def test_a_restart_moves_a_directory_whose_offset_it_cannot_parse_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A database that opens but holds, under the offset key, a value that is no offset is
    one Faust cannot read either (its ``int()`` raises when the partition is assigned, and
    the app crashes). Reported at 0 and not claimed, a short changelog would still bring it
    back and the worker would crash on every restart; it is moved
    aside (``<dir>.damaged-<UTC time>``) and counts as wiped: 0 and claimed, as a partition
    with nothing on disk, with one WARNING naming the directory; the others their offsets."""
    ran = sorted(stopped_after_running_alone(tmp_path / "w0", {SRC: 6, CL: 6}))
    unparsable, removed = ran[0], ran[1]
    app = make_app(tmp_path / "w0", 7000, store="rocksdb://")
    store = app.tables["totals"].data
    db = rocksdict.Rdict(
        str(store.partition_path(unparsable.partition)),
        options=rocksdict.Options(raw_mode=True),
    )
    db.put(store.offset_key, b"not an offset")
    db.close()
    shutil.rmtree(store.partition_path(removed.partition))
    with caplog.at_level(logging.DEBUG, logger="streamassign.faust.assignor"):
        info = reported(app.assignor)
    assert info.previous_active == frozenset(ran)
    assert info.offset_sums == {
        unparsable: 0,
        removed: 0,
        **{t: 100 + t.partition for t in ran[2:]},
    }
    path = store.partition_path(unparsable.partition)
    (aside,) = path.parent.glob(f"{path.name}.damaged-*")
    assert not path.exists()
    assert (
        rocksdict.Rdict(str(aside), options=rocksdict.Options(raw_mode=True)).get(store.offset_key)
        == b"not an offset"
    )  # kept as it was: evidence
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "offset key" in r.getMessage()
    ]
    assert len(warnings) == 1
    assert str(path) in warnings[0]
    assert aside.name in warnings[0]


def test_a_table_that_gained_a_ttl_after_its_data_reads_no_offset(tmp_path: Path) -> None:
    """RocksDB's TTL database checks a value's 4-byte suffix (a write time no
    earlier than 2013-05-10) and reports corruption otherwise. Stripped unchecked, a plain
    table's ``b"50001"`` read as offset 5 (a huge lag, still claimed); a value whose suffix is
    no write time is no offset (Faust's TTL database reports corruption reading it): moved
    aside and counted as wiped, as above."""
    ran = sorted(stopped_after_running_alone(tmp_path / "w0", {SRC: 6, CL: 6}))
    app = make_app(tmp_path / "w0", 7000, store="rocksdb://", table_options={"ttl": 3600})
    store = app.tables["totals"].data
    for t in ran:
        db = rocksdict.Rdict(
            str(store.partition_path(t.partition)), options=rocksdict.Options(raw_mode=True)
        )
        db.put(store.offset_key, b"50001")
        db.close()
    info = reported(app.assignor)
    assert info.previous_active == frozenset(ran)
    assert info.offset_sums == dict.fromkeys(ran, 0)
    assert len(list(Path(app.conf.tabledir).glob("totals-*.db.damaged-*"))) == len(ran)


def test_a_restart_with_wiped_tables_leaves_its_tasks_to_caught_up_holders(
    tmp_path: Path,
) -> None:
    """A worker restarted without its table data, end to end through its own subscription and
    leader: it restarts with its process id and last assignment but no table data; W runs every
    task caught up and V, idle, holds caught-up standbys of every task, their changelogs past
    the acceptable recovery lag. The restarted worker, the smallest process id, took its share
    as the previous owner (2 of 4, each restored from scratch); it takes 1, the least the
    balance allows, and every other task stays where a caught-up copy is."""
    counts = {SRC: 4, CL: 4}
    ran = stopped_after_running_alone(tmp_path / "w0", counts)
    app = make_app(tmp_path / "w0", 7000, store="rocksdb://")
    shutil.rmtree(app.conf.tabledir)
    restarted = app.assignor
    end = 20_000  # past the acceptable recovery lag (10,000)
    holders = {  # process ids above any uuid4: the restarted worker comes first
        "W": SubscriptionInfo(
            uuid.UUID(int=2**128 - 2),
            endpoint="http://127.0.0.1:7001",
            offset_sums=dict.fromkeys(ran, LATEST_OFFSET),
            previous_active=ran,
        ),
        "V": SubscriptionInfo(
            uuid.UUID(int=2**128 - 1),
            endpoint="http://127.0.0.1:7002",
            offset_sums=dict.fromkeys(ran, end),
        ),
    }
    metadata = {"X": restarted.metadata(set(counts))}
    for name, info in holders.items():
        metadata[name] = ConsumerProtocolMemberMetadata(0, sorted(counts), info.encode())
    encoded = restarted.assign(Cluster(counts), metadata)
    got = {
        m: AssignmentInfo.decode(ConsumerProtocolMemberAssignment.decode(raw).user_data)
        for m, raw in encoded.items()
    }
    assert len(got["X"].active) == 1
    assert {t for m in ("W", "V") for t in got[m].active} == ran - got["X"].active


def test_a_running_standby_reports_what_recovery_applied(tmp_path: Path) -> None:
    """A running standby's offsets come from Faust's recovery (fresher than the disk, and no
    database opened); a standby recovery does not track yet falls back to the disk, then 0."""
    apps = [make_app(tmp_path / f"w{i}", 7000 + i, store="rocksdb://") for i in range(2)]
    workers = {f"m{i}": app.assignor for i, app in enumerate(apps)}
    rebalance(workers, counts={SRC: 6, CL: 6})
    a = workers["m0"]
    tracked, on_disk, fresh = sorted(a.info.standby)
    store = apps[0].tables["totals"].data
    for t in (tracked, on_disk):
        store.set_persisted_offset(TP(CL, t.partition), 7)
    for db in store._dbs.values():
        db.close()
    store._dbs.clear()
    apps[0].tables.recovery.standby_offsets[TP(CL, tracked.partition)] = 55
    sums = reported(a).offset_sums
    assert {t: sums[t] for t in (tracked, on_disk, fresh)} == {tracked: 55, on_disk: 7, fresh: 0}
    assert store._dbs == {}


def test_a_standby_sum_leaves_out_a_global_table_in_the_tasks_group(tmp_path: Path) -> None:
    """A global table with the group's partition count is in the task's group
    (Faust-style grouping), and with ``synchronize_all_active_partitions`` Faust's recovery
    tracks its partitions as standbys. Summed into the task's standby, a caught-up standby
    read 30,000 ahead of a restarted worker's disk sum (which counts the task's own tables
    only), which then lost its hand-back. Only the task's own changelogs count."""
    fx_cl = f"{APP}-fx-changelog"
    counts = {SRC: 6, CL: 6, fx_cl: 6}
    apps = [make_app(tmp_path / f"w{i}", 7000 + i) for i in range(2)]
    for app in apps:
        app.GlobalTable("fx", default=int, partitions=6, synchronize_all_active_partitions=True)
    workers = {f"m{i}": app.assignor for i, app in enumerate(apps)}
    rebalance(workers, counts=counts)
    a = workers["m0"]
    assert any(fx_cl in topics for topics in a.info.topics.values())  # in the task's group
    offsets = apps[0].tables.recovery.standby_offsets
    for p in range(6):
        offsets[TP(fx_cl, p)] = 30_000
    for t in a.info.standby:
        offsets[TP(CL, t.partition)] = 100
    info = SubscriptionInfo.decode(a.metadata(set(counts)).user_data)
    assert a.info.standby
    assert {t: info.offset_sums[t] for t in a.info.standby} == dict.fromkeys(a.info.standby, 100)


def test_a_worker_says_whether_its_recovery_completed_since_it_started(tmp_path: Path) -> None:
    """The leader's test for a worker in its first recovery, read from offset
    sums, took a fresh standby of a changelog starting above 0 for progress. The member says
    it instead: ``RECOVERED_TAG`` 0 until Faust's recovery first completes, then 1."""
    app = make_app(tmp_path / "w0", 7000)
    assert reported(app.assignor).client_tags[RECOVERED_TAG] == "0"
    app.tables.recovery.completed.set()
    assert reported(app.assignor).client_tags[RECOVERED_TAG] == "1"


class Coordinator:
    """What the assignor reads of aiokafka's group coordinator: the member id, which aiokafka
    sets from JoinGroup and resets to "" (``reset_generation``) on ``UnknownMemberId`` or an
    illegal generation."""

    def __init__(self, member_id: str) -> None:
        self.member_id = member_id
        self.generation = 1  # -1 after a reset, until a JoinGroup response gives one


class Consumer:
    """The aiokafka consumer's ``_coordinator``, all the assignor reads of it here."""

    def __init__(self, member_id: str) -> None:
        self._coordinator = Coordinator(member_id)

    def set_member_id(self, member_id: str) -> None:
        self._coordinator.member_id = member_id


def with_consumer(
    app: faust.App, member_id: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[PartitionAssignor, Consumer]:
    assignor = app.assignor
    assert isinstance(assignor, PartitionAssignor)
    consumer = Consumer(member_id)
    monkeypatch.setattr(assignor, "_consumer", lambda: consumer)
    return assignor, consumer


def recovery_completes(app: faust.App) -> None:
    """What Faust's recovery does as it completes: the signal, then the flag."""
    asyncio.run(app.on_rebalance_complete.send())
    app.tables.recovery.completed.set()


def recovered_tag(assignor: PartitionAssignor) -> str:
    return reported(assignor).client_tags[RECOVERED_TAG]


def test_a_recovery_counts_in_the_membership_it_completed_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From start to a completed recovery: 0, then 1, still 1 at later rebalances (the
    member id stays)."""
    app = make_app(tmp_path / "w0", 7000)
    assignor, _ = with_consumer(app, "m-1", monkeypatch)
    assert recovered_tag(assignor) == "0"
    recovery_completes(app)
    assert recovered_tag(assignor) == "1"
    rebalance({"m0": assignor})
    assert recovered_tag(assignor) == "1"


def test_a_recovery_completed_as_the_membership_was_lost_does_not_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker stalled (SIGSTOP) in its first recovery; the recovery completed
    in the second between the stall's end and the failed heartbeat that reset its member id.
    It rejoins reporting the tasks it just restored and must say 0 (first recovery), else the
    leader takes it for a veteran and hands back only part of them. Its rejoin, under a new
    member id, says 0 until a recovery completes in that membership; then 1."""
    app = make_app(tmp_path / "w0", 7000)
    assignor, consumer = with_consumer(app, "m-1", monkeypatch)
    recovery_completes(app)
    consumer.set_member_id("")  # Heartbeat failed: UnknownMemberId, reset_generation()
    assert recovered_tag(assignor) == "0"
    consumer.set_member_id("m-2")  # MEMBER_ID_REQUIRED gave it a new id; JoinGroup again
    rebalance({"m0": assignor})
    assert recovered_tag(assignor) == "0"
    recovery_completes(app)  # Faust's recovery of the new assignment
    assert recovered_tag(assignor) == "1"


def test_a_recovery_the_membership_outlived_still_counts_after_a_reset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A veteran (its recovery completed, and it joined again under that member id)
    that expires while restoring a cold takeover still says 1, so the leader does not hand the
    cold task back to it."""
    app = make_app(tmp_path / "w0", 7000)
    assignor, consumer = with_consumer(app, "m-1", monkeypatch)
    recovery_completes(app)
    rebalance({"m0": assignor})  # joined again as m-1: the completion was the group's
    consumer.set_member_id("")
    assert recovered_tag(assignor) == "1"


def test_a_completion_with_no_member_id_to_read_counts_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another aiokafka (no ``_coordinator.member_id``), or no consumer: Faust's flag as is."""
    app = make_app(tmp_path / "w0", 7000)
    assignor = app.assignor
    assert isinstance(assignor, PartitionAssignor)
    monkeypatch.setattr(assignor, "_consumer", lambda: object())
    recovery_completes(app)
    assert recovered_tag(assignor) == "1"
    monkeypatch.setattr(assignor, "_consumer", lambda: Consumer(""))
    assert recovered_tag(assignor) == "1"  # a completion it could not scope stays


def test_a_completion_cancelled_after_its_signal_is_not_settled_by_the_join_that_cancelled_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Faust sends ``on_rebalance_complete`` ("Restore complete!"), then awaits the
    tables' callbacks and a seek before it sets ``completed``; a new assignment in between
    cancels the rest. That assignment's join under the same id settled the completion that
    never happened, so a later real one, completed just before a reset (a stall's, as above),
    said 1."""
    app = make_app(tmp_path / "w0", 7000)
    assignor, consumer = with_consumer(app, "m-1", monkeypatch)
    rebalance({"m0": assignor})  # generation 1: the first recovery starts
    asyncio.run(app.on_rebalance_complete.send())  # its completion sends the signal ...
    rebalance({"m0": assignor})  # ... and this join's assignment cancels it before the flag
    assert not app.tables.recovery.completed.is_set()
    assert recovered_tag(assignor) == "0"
    recovery_completes(app)  # the next recovery completes, in the second before ...
    consumer.set_member_id("")  # ... the failed heartbeat: no join outlived a completion
    assert recovered_tag(assignor) == "0"


def test_a_completion_while_the_join_phase_holds_a_new_id_is_in_no_membership(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a reset aiokafka's JoinGroup gets MEMBER_ID_REQUIRED and sets the new
    id at once (generation still -1), then waits for the join phase to end. A completion
    signalled then was recorded under the new id and settled by that join: the worker
    counted as a veteran though its only completion was in no membership."""
    app = make_app(tmp_path / "w0", 7000)
    assignor, consumer = with_consumer(app, "m-1", monkeypatch)
    rebalance({"m0": assignor})
    consumer.set_member_id("")  # expired before its first recovery completed
    consumer._coordinator.generation = -1
    assert recovered_tag(assignor) == "0"
    consumer.set_member_id("m-2")  # MEMBER_ID_REQUIRED; not a member yet
    recovery_completes(app)  # the lost membership's recovery completes in the join phase
    consumer._coordinator.generation = 5
    rebalance({"m0": assignor})  # joined as m-2
    assert recovered_tag(assignor) == "0"
    consumer.set_member_id("")  # expires again while it catches up in m-2
    consumer._coordinator.generation = -1
    assert recovered_tag(assignor) == "0"
    consumer.set_member_id("m-3")
    consumer._coordinator.generation = 6
    recovery_completes(app)  # a completion in a membership counts, as before
    assert recovered_tag(assignor) == "1"


class FaustConsumerStandIn:
    """What Faust's recovery calls on ``app.consumer`` from a restore's start to its end."""

    def __init__(self) -> None:
        #: How many times a restore resumed the changelog partitions to read them.
        self.restores = 0

    def assignment(self) -> set[TP]:
        return set()

    def pause_partitions(self, tps: Iterable[TP]) -> None:
        pass

    def resume_partitions(self, tps: Iterable[TP]) -> None:
        self.restores += any(tp.topic == CL for tp in tps)

    def resume_flow(self) -> None:
        pass

    async def perform_seek(self) -> None:
        pass


class FetcherStandIn:
    async def maybe_start(self) -> None:
        pass


async def until(condition: Callable[[], bool]) -> None:
    """Let the loop run until ``condition`` holds (Faust's recovery needs a few dozen steps)."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition did not hold within 1000 loop steps")


async def restore_interrupted_by_a_join(app: faust.App, monkeypatch: pytest.MonkeyPatch) -> int:
    """Faust's own recovery loop restores one active changelog partition, no standby (the
    broker's answers stood in for: 90 records left), until another member's join assigns the
    same again; returns once that restore has started over, with the records left."""
    recovery, consumer = app.tables.recovery, FaustConsumerStandIn()
    actives = {TP(CL, 0)}

    async def highwaters(consumer: Any, tps: set[TP], found: dict[TP, int], title: str) -> None:
        for tp in tps:
            found[tp] = 100

    async def offsets(consumer: Any, tps: set[TP], found: dict[TP, int], title: str) -> None:
        for tp in tps:
            found[tp] = 10

    async def seek(*args: Any) -> None:
        pass

    with monkeypatch.context() as patch:
        patch.setattr(recovery, "recovery_delay", 0)
        patch.setattr(recovery, "_build_highwaters", highwaters)
        patch.setattr(recovery, "_build_offsets", offsets)
        patch.setattr(recovery, "_seek_offsets", seek)
        patch.setattr(app, "_consumer", consumer)
        patch.setitem(app.__dict__, "_fetcher", FetcherStandIn())
        patch.setattr(app.assignor, "assigned_actives", lambda: actives)
        patch.setattr(app.assignor, "assigned_standbys", set)
        app.consumer_generation_id = 5
        await recovery.on_rebalance(actives, set(), actives, generation_id=5)
        restarts = asyncio.ensure_future(Recovery._restart_recovery(recovery))
        await until(lambda: consumer.restores == 1)  # reading, waiting for the actives
        app.consumer_generation_id = 6  # another member joined
        await recovery.on_rebalance(actives, set(), set(), generation_id=6)
        await until(lambda: consumer.restores == 2)
        restarts.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await restarts
    return recovery.active_remaining_total()


def test_a_restore_a_join_interrupts_is_no_completion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Faust's recovery swallows the restart a join signals while it waits for the actives
    (an ``except Exception`` around that wait, faust-streaming 0.15.3) and, with no standby
    partition to start, announces the completion (``on_rebalance_complete``) before it
    notices. Its flag stays unset, but a worker whose earlier completion a reset voided took
    the announcement for a completion in its new membership: 1 with 90 records to restore."""

    async def scenario() -> None:
        app = make_app(tmp_path / "w0", 7000)  # in the loop: Faust's services bind to it
        assignor, consumer = with_consumer(app, "m-1", monkeypatch)
        await app.on_rebalance_complete.send()  # the first recovery completes ...
        app.tables.recovery.completed.set()
        consumer.set_member_id("")  # ... then the session expires
        consumer._coordinator.generation = -1
        consumer.set_member_id("m-2")
        consumer._coordinator.generation = 5
        rebalance({"m0": assignor})  # rejoined: it restores its tasks again
        assert recovered_tag(assignor) == "0"
        with caplog.at_level(logging.INFO, "faust.tables.recovery"):
            assert await restore_interrupted_by_a_join(app, monkeypatch) == 90
        assert "Restore complete!" in caplog.text  # announced, unfinished
        assert recovered_tag(assignor) == "0"
        rebalance({"m0": assignor})  # and no later join under m-2 settles it
        assert recovered_tag(assignor) == "0"
        await app.on_rebalance_complete.send()  # a restore that finishes still counts
        assert recovered_tag(assignor) == "1"

    asyncio.run(scenario())


def test_a_join_under_fausts_protocol_settles_a_completion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a rolling switch the group runs Faust's protocol, whose assignment goes through
    ``_on_fausts_assignment``; its joins settled no completion, so a veteran whose recovery
    completed then and that expired before a join on ours said 0 (the case above of a veteran
    expiring: the leader counts its claims, a cold takeover's too, as caught up)."""
    app = make_app(tmp_path / "w0", 7000)
    assignor, consumer = with_consumer(app, "m-1", monkeypatch)
    recovery_completes(app)
    fausts = assignor.fallback_assignors()[0]
    answers = fausts.assign(Cluster(COUNTS), {"m-1": fausts.metadata(set(COUNTS))})
    fausts.on_assignment(answers["m-1"])  # m-1 joined again, on Faust's protocol
    assert assignor.protocol_in_use == "faust"
    consumer.set_member_id("")  # expires later, restoring a cold takeover
    assert recovered_tag(assignor) == "1"


def test_an_error_reading_the_membership_at_a_completion_does_not_stop_fausts_recovery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The handler runs inside Faust's recovery: an error through ``Signal.send`` would stop
    it. Logged instead, and the tag falls back to Faust's flag."""
    app = make_app(tmp_path / "w0", 7000)
    assignor = app.assignor
    assert isinstance(assignor, PartitionAssignor)

    def broken() -> None:
        raise RuntimeError("no consumer to read")

    monkeypatch.setattr(assignor, "_consumer", broken)
    with caplog.at_level(logging.ERROR, logger="streamassign.faust"):
        asyncio.run(app.on_rebalance_complete.send())
    assert any("group membership" in r.getMessage() for r in caplog.records)
    app.tables.recovery.completed.set()
    monkeypatch.setattr(assignor, "_consumer", lambda: Consumer(""))
    assert recovered_tag(assignor) == "1"


def test_aiokafkas_reset_empties_the_member_id_the_scope_reads() -> None:
    """The installed aiokafka's contract ``RecoveryScope`` relies on: its reset after a failed
    heartbeat (``UnknownMemberId``, an illegal generation) leaves ``member_id`` "" until the
    next JoinGroup response sets one."""
    stand_in = types.SimpleNamespace(generation=7, member_id="m-1", request_rejoin=lambda: None)
    GroupCoordinator.reset_generation(stand_in)
    assert stand_in.member_id == ""


def with_a_second_table(app: faust.App) -> faust.App:
    """``app`` with a second table, ``seen``: with the same partition count its changelog
    (``SEEN_CL``) is in the same co-partitioned group, so a task has two changelog partitions."""
    app.Table("seen", default=int)
    return app


def test_a_fresh_standby_of_two_tables_is_never_reported_running(tmp_path: Path) -> None:
    """Faust's recovery tracks -1 for each changelog partition a standby has
    applied nothing of (``Recovery._build_offsets``). Summed as is, a task with two tables
    reported -1 + -1 = -2 = ``LATEST_OFFSET``: running, so the leader handed such a worker
    tasks it had read nothing of. A fresh standby is state at 0; only actives run."""
    apps = [with_a_second_table(make_app(tmp_path / f"w{i}", 7000 + i)) for i in range(2)]
    workers = {f"m{i}": app.assignor for i, app in enumerate(apps)}
    rebalance(workers, counts={SRC: 6, CL: 6, SEEN_CL: 6})
    a = workers["m0"]
    fresh, *applied = sorted(a.info.standby)
    offsets = apps[0].tables.recovery.standby_offsets
    for t in a.info.standby:
        offsets[TP(CL, t.partition)] = offsets[TP(SEEN_CL, t.partition)] = -1
    for t in applied:  # one table read up to 40, the other nothing yet
        offsets[TP(CL, t.partition)] = 40
    info = reported(a)
    assert info.running == a.info.active
    assert {t: info.offset_sums[t] for t in a.info.standby} == {
        fresh: 0,
        **dict.fromkeys(applied, 40),
    }


def test_the_state_directory_is_released_when_the_app_stops(tmp_path: Path) -> None:
    app = make_app(tmp_path / "w0", 7000)
    app.assignor.metadata({SRC})
    asyncio.run(app.on_before_shutdown.send())
    StateDirectory(Path(app.conf.appdir) / "streamassign").close()  # not locked any more


def test_a_failed_assignment_keeps_history_and_groups(
    workers: dict[str, PartitionAssignor],
) -> None:
    """A failed (or unreadable) assignment runs Kafka's partitions but forgets nothing: the next
    join reports what the worker ran, and ``group_for_topic`` keeps answering."""
    rebalance(workers)
    a = workers["m0"]
    ran, group = a.info.active, a.group_for_topic(SRC)
    saved = state_file(a.app).read_text()
    for user_data in (
        AssignmentInfo(error_code=ErrorCode.ASSIGNMENT_ERROR).encode(),
        b"not ours",
    ):
        a.on_assignment(ConsumerProtocolMemberAssignment(0, [(SRC, [0, 1])], user_data))
        assert a.assigned_actives() == {TP(SRC, 0), TP(SRC, 1)}
        assert a.assigned_standbys() == set()
        assert a.group_for_topic(SRC) == group
        info = reported(a)
        assert info.previous_active == ran
        assert info.running == ran
        assert state_file(a.app).read_text() == saved


def test_an_assignment_without_its_topic_dictionary_is_an_error(
    workers: dict[str, PartitionAssignor],
) -> None:
    """An older leader dropped the dictionary when no member had an endpoint: the member
    cannot map its tasks, so it runs Kafka's partitions and rejoins (never runs nothing)."""
    a = workers["m0"]
    data = AssignmentInfo(active=frozenset({TaskId(0, 1)})).encode()
    a.on_assignment(ConsumerProtocolMemberAssignment(0, [(SRC, [1])], data))
    assert a.assigned_actives() == {TP(SRC, 1)}
    assert a.rejoiner.failures == 1


def test_an_unreadable_state_file_is_no_crash(tmp_path: Path) -> None:
    first = make_app(tmp_path / "w0", 7000)
    pid = reported(first.assignor).process_id
    asyncio.run(first.on_before_shutdown.send())
    state_file(first).mkdir()  # IsADirectoryError when read
    app = make_app(tmp_path / "w0", 7000)
    info = reported(app.assignor)
    assert info.process_id == pid and not info.previous_active


@pytest.mark.parametrize(
    "content",
    [
        '{"active": ["0_1"], "standby": [], "topics": {"0": {"clicks": 1e999}}}',
        '{"active": ["0_1"], "standby": [], "topics": {"0": {"clicks": Infinity}}}',
        "[" * 100_000 + "]" * 100_000,
    ],
)
def test_a_state_file_with_a_non_finite_number_or_deep_nesting_is_ignored_as_unreadable(
    tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The documented fallback line, not a traceback (OverflowError, RecursionError escaped
    the state file's reader before and were logged as "cannot describe this worker's state")."""
    first = make_app(tmp_path / "w0", 7000)
    pid = reported(first.assignor).process_id
    asyncio.run(first.on_before_shutdown.send())
    state_file(first).write_text(content)
    app = make_app(tmp_path / "w0", 7000)
    with caplog.at_level(logging.WARNING, "streamassign"):
        info = reported(app.assignor)
    assert info.process_id == pid and not info.previous_active
    transport = "can drop records"  # this test's app runs kafka:// (said once)
    (line,) = [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and transport not in r.getMessage()
    ]
    assert line.getMessage().startswith(f"ignoring unreadable {state_file(first)}: the JSON ")
    assert line.exc_info is None


def test_metadata_never_raises(
    workers: dict[str, PartitionAssignor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiokafka's coordinator dies on an exception from ``metadata``: any error joins the worker
    without history instead (same process id, and its URL: routing needs it, and the leader
    tells workers with a copied state directory apart by it)."""
    rebalance(workers)
    a = workers["m0"]
    pid = a._process_id

    def broken(*args: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(a, "_standby_offset_sum", broken)
    monkeypatch.setattr(a, "_disk_offset_sum", broken)
    info = reported(a)
    assert info.process_id == pid and not info.offset_sums
    assert info.endpoint == str(a.app.conf.canonical_url)


def test_web_views_never_see_half_an_assignment(tmp_path: Path) -> None:
    """The web server reads the views from another thread while a rebalance replaces them:
    whatever it reads mid-rebalance is one whole assignment (here: read at the moment the
    assignor looks at the app's tables, in the middle of building the new views)."""
    seen: list[tuple[set[int], set[int]]] = []

    class Watched(PartitionAssignor):
        watching = False

        def _tables(self) -> list[Any]:
            if self.watching:
                mine = self.tables_metadata().get(url(0), {})
                seen.append((tps(self.assigned_actives(), CL), set(mine.get(CL, ()))))
            return super()._tables()

    watched = make_app(tmp_path / "w0", 7000, assignor=Watched).assignor
    assert isinstance(watched, Watched)
    watched.watching = True
    others = {f"m{i}": make_app(tmp_path / f"w{i}", 7000 + i).assignor for i in (1, 2)}
    rebalance({"m0": watched, **others})
    rebalance({"m0": watched, "m1": others["m1"]})
    assert seen and all(actives == routed for actives, routed in seen), seen


def test_members_announce_changelogs_and_names_are_not_guessed(
    workers: dict[str, PartitionAssignor],
) -> None:
    """A source topic named like a changelog is no table (no standbys); a table only another
    app version has is stateful because its members announce its changelog."""
    info = reported(workers["m0"])
    assert info.client_tags[CHANGELOGS_TAG] == ",".join(sorted([CL, GLOBAL_CL]))
    assert info.client_tags[GLOBAL_CHANGELOGS_TAG] == GLOBAL_CL
    plain = f"{APP}-clicks-changelog"  # a source topic, 3 partitions: a group of its own
    rebalance(workers, counts={**COUNTS, plain: 3})
    assert not any(tps(a.assigned_standbys(), plain) for a in workers.values())
    assert sorted(p for a in workers.values() for p in tps(a.assigned_actives(), plain)) == [
        0,
        1,
        2,
    ]


def test_a_table_only_the_members_have_gets_standbys(tmp_path: Path) -> None:
    """The leader runs an app version without the ``seen`` table; the members' version has it."""
    seen = f"{APP}-seen-changelog"
    leader = make_app(tmp_path / "old", 7000).assignor
    news = {}
    for i in (1, 2):
        app = make_app(tmp_path / f"new{i}", 7000 + i)
        app.Table("seen", default=int, partitions=3)
        news[f"m{i}"] = app.assignor
    counts = {**COUNTS, seen: 3}
    metadata = {"m0": leader.metadata(set(COUNTS))}
    metadata.update({m: a.metadata(set(counts)) for m, a in news.items()})
    out = leader.assign(Cluster(counts), metadata)
    for m, a in news.items():
        a.on_assignment(ConsumerProtocolMemberAssignment.decode(out[m]))
    for p in range(3):
        assert [m for m, a in news.items() if a.is_standby(TP(seen, p))] != []
        assert sum(a.is_active(TP(seen, p)) for a in news.values()) == 1


def test_copartition_groups_must_be_lists_of_topics(tmp_path: Path) -> None:
    class Flat(PartitionAssignor):
        copartition_groups = (SRC, CL)  # a typo: one level short (a str is a sequence)

    with pytest.raises(TypeError, match="copartition_groups"):
        _ = make_app(tmp_path, 7000, assignor=Flat).assignor


# -- hostile members (issue 25 §1) -----------------------------------------------------------


def hostile(pid: int) -> bytes:
    """37 bytes: a version-2 subscription of process ``pid`` claiming ``MAX_TASK_IDS``
    previous actives (one run). Before the bounds one of them cost this leader 31 s / 277 MB."""
    run = bytes([1, 0, 1, 0, 0xFF, 0xFF, 0x3F])  # 1 group: id 0, 1 run from 0, 2**20 long
    assert MAX_TASK_IDS == 1 << 20
    return (2).to_bytes(4, "big") * 2 + uuid.UUID(int=pid).bytes + b"\x00\x00" + run + bytes(4)


def test_hostile_members_cost_what_a_clean_round_costs_and_have_no_history(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """8 of 12 members send 37 bytes claiming 2**20 previous actives each. The leader answers
    every member exactly as if those 8 had sent the same identity without history, warns once
    per hostile member, and costs about what a clean round of the group costs."""
    apps = {f"m{i:02d}": make_app(tmp_path / f"w{i}", 7000 + i) for i in range(12)}
    workers = {m: app.assignor for m, app in apps.items()}
    rebalance(workers)  # a second round: members report what they run
    leader = workers["m00"]
    clean = {m: a.metadata(set(COUNTS)) for m, a in workers.items()}
    targets = sorted(clean)[4:]

    def replaced(data: Callable[[int], bytes]) -> dict[str, ConsumerProtocolMemberMetadata]:
        return clean | {
            m: ConsumerProtocolMemberMetadata(0, sorted(COUNTS), data(2000 + n))
            for n, m in enumerate(targets)
        }

    attack = replaced(hostile)
    no_history = replaced(  # the same version as the hostile bytes: the same answer
        lambda pid: SubscriptionInfo(
            uuid.UUID(int=pid), version=2, latest_supported_version=2
        ).encode()
    )
    with caplog.at_level(logging.WARNING, logger="streamassign"):
        answers = leader.assign(Cluster(COUNTS), attack)
    warned = [r.getMessage() for r in caplog.records if "no history" in r.getMessage()]
    assert sorted(w.split()[1].rstrip(":") for w in warned) == targets
    assert answers == leader.assign(Cluster(COUNTS), no_history)
    decoded = [ConsumerProtocolMemberAssignment.decode(raw) for raw in answers.values()]
    assert all(AssignmentInfo.decode(d.user_data).error_code == ErrorCode.NONE for d in decoded)
    assert sorted(p for d in decoded for t, ps in d.assignment if t == SRC for p in ps) == list(
        range(6)
    )

    caplog.set_level(logging.CRITICAL, logger="streamassign")  # timing without log handling
    clean_time, attack_time = best_of(
        5,
        lambda: leader.assign(Cluster(COUNTS), clean),
        lambda: leader.assign(Cluster(COUNTS), attack),
    )
    assert attack_time < 3 * clean_time  # measured about 1x; before: 31 s for one such member
    assert peak_of(lambda: leader.assign(Cluster(COUNTS), attack)) < 2 * peak_of(
        lambda: leader.assign(Cluster(COUNTS), clean)
    )


def test_decoded_claims_past_the_limits_are_no_history() -> None:
    """``assign_faust`` itself bounds members decoded elsewhere: claims on tasks that do not
    exist are dropped, and a member claiming far more tasks than a group of this size allows
    is treated as having no history."""
    (group,) = {
        s for s in faust_style_topology({"a": set(COUNTS)}, COUNTS).subtopology_ids if s == 6
    }
    kw: dict[str, Any] = {
        "changelog_topics": {CL, GLOBAL_CL},
        "global_changelog_topics": {GLOBAL_CL},
    }

    def m0_gets(ran: range) -> set[int]:
        """What m0 gets after a restart in which it reports it ran ``ran`` (in-memory tables:
        previous actives, no offset sums)."""
        previous = frozenset(TaskId(group, p) for p in ran)
        infos = {
            "m0": SubscriptionInfo(uuid.UUID(int=1), previous_active=previous),
            "m1": SubscriptionInfo(uuid.UUID(int=2)),
        }
        members = {m: MemberSubscription(set(COUNTS), i) for m, i in infos.items()}
        return {t.partition for t in assign_faust(members, COUNTS, **kw)["m0"].info.active}

    assert m0_gets(range(3, 6)) == {3, 4, 5}  # what it ran
    assert m0_gets(range(3, 100)) == {3, 4, 5}  # clipped to tasks that exist
    assert m0_gets(range(3, 50_000)) == m0_gets(range(0)) != {3, 4, 5}  # no history


# -- rolling switch (issue 23 §3) --------------------------------------------------------------


def test_a_worker_offers_fausts_own_assignor_second_and_serves_its_assignment(
    workers: dict[str, PartitionAssignor], tmp_path: Path
) -> None:
    """While the group uses Faust's protocol (a member does not offer ours yet) Faust's tables
    and views read Faust's own assignor's assignment; our next assignment takes over again."""
    fallbacks = {m: a.fallback_assignors() for m, a in workers.items()}
    assert all(
        len(f) == 1 and f[0].name == "faust" and f[0] is workers[m].fallback_assignors()[0]
        for m, f in fallbacks.items()
    )
    fausts = {m: f[0] for m, f in fallbacks.items()}
    metadata = {m: f.metadata(set(COUNTS)) for m, f in fausts.items()}
    answers = fausts["m0"].assign(Cluster(COUNTS), metadata)
    for m, f in fausts.items():
        f.on_assignment(answers[m])
    for m, a in workers.items():
        assert a.protocol_in_use == "faust"
        assert a.assigned_actives() == fausts[m].assigned_actives()
        assert a.assigned_standbys() == fausts[m].assigned_standbys()
        assert a.tables_metadata() == fausts[m].tables_metadata()
    assert sorted(p for a in workers.values() for p in tps(a.assigned_actives(), SRC)) == list(
        range(6)
    )
    rebalance(workers)  # every member offers ours again: the group uses it
    assert all(a.protocol_in_use == PROTOCOL_NAME for a in workers.values())
    assert sorted(p for a in workers.values() for p in tps(a.assigned_actives(), SRC)) == list(
        range(6)
    )

    stateless = faust.App(
        "plain", broker="kafka://localhost:1", datadir=str(tmp_path / "plain"),
        PartitionAssignor="streamassign.faust:PartitionAssignor", table_standby_replicas=0,
    )  # fmt: skip
    assert stateless.assignor.fallback_assignors() == (RoundRobinPartitionAssignor,)


def test_metadata_changes_only_when_a_rebalance_is_wanted(
    workers: dict[str, PartitionAssignor],
) -> None:
    """A rejoin with changed metadata starts a rebalance: changed on every join, it made two
    workers starting together rebalance each other for minutes. It changes after a failed
    assignment only (the rejoin must then start one)."""
    a = workers["m0"]
    first = a.metadata(set(COUNTS)).user_data
    assert a.metadata(set(COUNTS)).user_data == first
    failed = AssignmentInfo(error_code=ErrorCode.ASSIGNMENT_ERROR).encode()
    a.on_assignment(ConsumerProtocolMemberAssignment(0, [], failed))
    assert a.metadata(set(COUNTS)).user_data != first


def test_a_worker_whose_session_expired_gets_back_the_partitions_it_restored(
    tmp_path: Path,
) -> None:
    """A 5th worker joins, its session expires while it restores its share, the group rebalances
    without it, and it rejoins without a restart. It still reports its first assignment (actives
    as running, standbys with nothing applied: Faust's -1 for each changelog partition, two
    tables here), and so do the workers that took those actives over: the leader hands them back
    rather than make it restore another set. Its process id is the largest, so it loses every
    duplicate claim's tie-break (before the fix: 0 of its 3 table partitions came back). Its
    fresh standbys are not running claims (summed as is, -1 + -1 = -2 = ``LATEST_OFFSET`` made
    them so, and it got standbys' tasks instead)."""
    counts = {SRC: 16, CL: 16, SEEN_CL: 16}
    apps = {}
    for i in range(5):
        app = with_a_second_table(make_app(tmp_path / f"w{i}", 7000 + i))
        ids = Path(app.conf.appdir) / "streamassign"
        ids.mkdir(parents=True)
        (ids / "process.id").write_text(str(uuid.UUID(int=i + 1)))
        apps[f"m{i}"] = app
    workers = {m: app.assignor for m, app in apps.items()}
    old = {m: a for m, a in workers.items() if m != "m4"}

    def standbys_at(group: Mapping[str, PartitionAssignor], offset: int) -> None:
        for m, a in group.items():
            for t in a.info.standby:
                for topic in (CL, SEEN_CL):
                    apps[m].tables.recovery.standby_offsets[TP(topic, t.partition)] = offset

    def standbys_catch_up(group: Mapping[str, PartitionAssignor]) -> None:
        standbys_at(group, 100)

    rebalance(old, counts)
    standbys_catch_up(old)
    rebalance(workers, counts)
    standbys_catch_up(old)
    standbys_at({"m4": workers["m4"]}, -1)  # what Faust's recovery tracks before reading them
    ran = workers["m4"].info.active
    assert ran
    rebalance(old, counts)  # m4 expired: not in this round
    standbys_catch_up(old)
    assert reported(workers["m4"]).running == ran  # its first assignment's actives only
    rejoined = rebalance(workers, counts)
    assert workers["m4"].info.active == ran
    kafka = {TP(topic, p) for topic, ps in rejoined["m4"].assignment for p in ps}
    assert tps(kafka, SRC) == {t.partition for t in ran}
