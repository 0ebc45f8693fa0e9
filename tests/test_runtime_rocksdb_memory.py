"""RocksDB memory of the runtime's stores: bounded memtables per store, and one budget (block
cache and write buffer manager) shared by all stores of an ``App`` (``rocksdb_memory_mib``)."""

from __future__ import annotations

import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from streamassign import Subtopology, Topology
from streamassign.runtime import App, MemoryStore, RuntimeConfigError
from streamassign.runtime.stores import (
    DEFAULT_ROCKSDB_MEMORY_MIB,
    KEPT_INFO_LOGS,
    MAX_WRITE_BUFFERS,
    ROCKSDB_STORE_FLOOR_MIB,
    WRITE_BUFFER_BYTES,
    KeyValueStore,
    RocksDBMemory,
    RocksDBStore,
    StoreIOError,
)

pytest.importorskip("rocksdict")

VALUE = b"v" * 1000


class Nothing:
    async def process(self, ctx: object, record: object) -> None: ...


def topology() -> Topology:
    return Topology([Subtopology(0, ["clicks"], stores=["counts"])], name="app")


def options_file(store: Path) -> dict[str, str]:
    """The options RocksDB wrote beside the store (its latest OPTIONS file), by name."""
    latest = max(store.glob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1]))
    pairs = (line.strip().split("=", 1) for line in latest.read_text().splitlines())
    return {pair[0]: pair[1] for pair in pairs if len(pair) == 2}


def fill(store: KeyValueStore, mib: int, prefix: bytes = b"") -> None:
    """Write ``mib`` MiB of distinct keys, in commit-sized batches."""
    for batch in range(mib * 1024 // 100):
        store.write({prefix + b"%08d" % (batch * 100 + i): VALUE for i in range(100)}, {})


def sst_files(root: Path) -> list[Path]:
    return list(root.rglob("*.sst"))


@pytest.mark.parametrize("shared", [False, True])
def test_every_store_opens_with_bounded_memtables(tmp_path: Path, shared: bool) -> None:
    memory = RocksDBMemory.of(DEFAULT_ROCKSDB_MEMORY_MIB) if shared else None
    store = RocksDBStore(tmp_path / "s.rocksdb", memory)
    store.close()
    options = options_file(tmp_path / "s.rocksdb")
    assert int(options["write_buffer_size"]) == WRITE_BUFFER_BYTES == 8 << 20
    assert int(options["max_write_buffer_number"]) == MAX_WRITE_BUFFERS == 2
    # With the shared budget, index and filter blocks are charged to its cache too.
    assert options["cache_index_and_filter_blocks"] == ("true" if shared else "false")


def test_the_stores_of_a_process_are_charged_to_one_budget(tmp_path: Path) -> None:
    memory = RocksDBMemory.of(64)
    assert memory.write_buffers.get_buffer_size() == 32 << 20  # memtables: half the budget
    first = RocksDBStore(tmp_path / "a.rocksdb", memory)
    second = RocksDBStore(tmp_path / "b.rocksdb", memory)
    before = memory.write_buffers.get_usage()
    fill(first, 2)
    after_first = memory.write_buffers.get_usage()
    fill(second, 2)
    after_second = memory.write_buffers.get_usage()
    assert after_first - before >= 2 << 20
    assert after_second - after_first >= 2 << 20
    assert memory.cache.get_usage() >= after_second  # memtables cost cache space
    first.close()
    second.close()


def test_the_shared_budget_flushes_stores_none_of_which_is_full(tmp_path: Path) -> None:
    """Three stores of 6 MiB each: below each one's 8 MiB write buffer, so alone none would
    flush; together above 90% of the 16 MiB of memtables a 32 MiB budget allows."""
    alone = [RocksDBStore(tmp_path / "alone" / f"{n}.rocksdb") for n in range(3)]
    for store in alone:
        fill(store, 6)
    assert sst_files(tmp_path / "alone") == []
    memory = RocksDBMemory.of(32)
    shared = [RocksDBStore(tmp_path / "shared" / f"{n}.rocksdb", memory) for n in range(3)]
    for store in shared:
        fill(store, 6)
    deadline = time.monotonic() + 20  # flushes run in RocksDB's background threads
    while not sst_files(tmp_path / "shared") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sst_files(tmp_path / "shared")
    for store in alone + shared:
        store.close()


def test_the_app_owns_the_budget_and_its_stores_share_it(tmp_path: Path) -> None:
    app = App(
        topology(),
        {0: Nothing},
        bootstrap_servers="x:1",
        state_dir=tmp_path / "one",
        rocksdb_memory_mib=48,
    )
    other = App(topology(), {0: Nothing}, bootstrap_servers="x:1", state_dir=tmp_path / "two")
    assert app.rocksdb_memory is not None and other.rocksdb_memory is not None
    assert app.rocksdb_memory.total_bytes == 48 << 20
    assert other.rocksdb_memory.total_bytes == DEFAULT_ROCKSDB_MEMORY_MIB << 20
    assert app._stores.rocksdb_memory is app.rocksdb_memory
    store = app._stores.open_store("rocksdb", tmp_path / "s.rocksdb")
    before = app.rocksdb_memory.write_buffers.get_usage()
    fill(store, 1)
    assert app.rocksdb_memory.write_buffers.get_usage() - before >= 1 << 20
    assert other.rocksdb_memory.write_buffers.get_usage() < 1 << 20  # no budget is shared
    store.close()


def test_in_memory_stores_get_no_budget(tmp_path: Path) -> None:
    app = App(
        topology(), {0: Nothing}, bootstrap_servers="x:1", state_dir=tmp_path, store_kind="memory"
    )
    assert app.rocksdb_memory is None
    assert isinstance(app._stores.open_store("memory", tmp_path / "s"), MemoryStore)


@pytest.mark.parametrize("mib", [0, 31, -64, True, 64.0, "64", None, 2**20 + 1])
@pytest.mark.parametrize("kind", ["rocksdb", "memory"])
def test_a_bad_budget_is_refused_naming_the_value(tmp_path: Path, mib: object, kind: str) -> None:
    """Checked whatever the store kind: a typo shows before a switch to RocksDB, not after."""
    expected = (
        rf"^rocksdb_memory_mib must be an int >= 32 and <= 1048576 .*, got {re.escape(repr(mib))}$"
    )
    with pytest.raises(RuntimeConfigError, match=expected):
        App(
            topology(),
            {0: Nothing},
            bootstrap_servers="x:1",
            state_dir=tmp_path,
            store_kind=kind,  # type: ignore[arg-type]
            rocksdb_memory_mib=mib,  # type: ignore[arg-type]
        )


def test_stores_opened_and_written_in_threads_share_the_budget(tmp_path: Path) -> None:
    """The runtime opens and closes stores in a thread pool (``TaskStores``), while the
    budget is made on the event loop's thread."""
    memory = RocksDBMemory.of(32)
    with ThreadPoolExecutor(4) as pool:
        stores = list(pool.map(lambda n: RocksDBStore(tmp_path / f"{n}", memory), range(4)))
        list(pool.map(lambda store: fill(store, 1, b"t"), stores))
        assert memory.write_buffers.get_usage() >= 4 << 20
        list(pool.map(lambda store: store.close(), stores))
    assert memory.write_buffers.get_usage() < 1 << 20  # closed stores give their memtables back


def test_the_memtable_limit_grows_with_the_open_stores_and_warns_as_they_double(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Past ``mib / 2 / 4`` open stores, each store gets 4 MiB of memtable room (else the shared
    limit forces a flush on nearly every write: the test of 200 stores below); past ``mib / 4``
    a warning names the stores and the budget to set, and again as the open stores double (so
    the last names about the value for them all). Closing gives the room back."""
    memory = RocksDBMemory.of(32)
    caplog.set_level(logging.WARNING, "streamassign.runtime")
    stores = [RocksDBStore(tmp_path / f"{n}", memory) for n in range(20)]
    assert memory.write_buffers.get_buffer_size() == 20 * ROCKSDB_STORE_FLOOR_MIB << 20
    warnings = [r.getMessage() for r in caplog.records if "RocksDB stores" in r.getMessage()]
    assert len(warnings) == 2  # at the 9th store (36 MiB > 32) and at the 18th
    assert "9 RocksDB stores" in warnings[0] and "rocksdb_memory_mib=36 or more" in warnings[0]
    assert "18 RocksDB stores" in warnings[1] and "rocksdb_memory_mib=72 or more" in warnings[1]
    for store in stores:
        store.close()
    assert memory.open_stores == 0
    assert memory.write_buffers.get_buffer_size() == 16 << 20  # back to half the budget


class ClosingSeen:
    """A store's database whose close notes the memtable limit while it runs (a close
    flushes the store's memtable), then closes the real one or fails as a full disk would."""

    def __init__(self, db: object, memory: RocksDBMemory, fails: bool) -> None:
        self.db, self.memory, self.fails = db, memory, fails
        self.limits: list[int] = []

    def close(self) -> None:
        self.limits.append(self.memory.write_buffers.get_buffer_size())
        self.db.close()  # type: ignore[attr-defined]
        if self.fails:
            raise OSError("No space left on device")


@pytest.mark.parametrize("fails", [False, True])
def test_a_store_s_memtable_room_is_given_back_after_its_close(tmp_path: Path, fails: bool) -> None:
    """The limit was lowered before the closing store's database was closed, so
    its memtable, flushed by the close, was charged against a limit already without its
    room. A close that fails still gives the room back."""
    memory = RocksDBMemory.of(32)
    stores = [RocksDBStore(tmp_path / f"{n}", memory) for n in range(10)]
    closing = ClosingSeen(stores[0]._db, memory, fails)
    stores[0]._db = closing  # type: ignore[assignment]
    if fails:
        with pytest.raises(StoreIOError, match="the close failed: No space left"):
            stores[0].close()
    else:
        stores[0].close()
    assert closing.limits == [10 * ROCKSDB_STORE_FLOOR_MIB << 20]
    assert memory.open_stores == 9
    assert memory.write_buffers.get_buffer_size() == 9 * ROCKSDB_STORE_FLOOR_MIB << 20
    for store in stores[1:]:
        store.close()


def test_one_busy_store_among_200_is_never_stopped_at_the_default_budget(tmp_path: Path) -> None:
    """200 stores at the default budget, 199 written a little and one a lot,
    as the event loop writes them. With a fixed memtable limit (64 MiB) under the stores'
    ~2 MiB each, nearly every write flushed a tiny memtable, the flushes queued, and the
    busy store's writes stopped ("Stopping writes" in its LOG) for 0.4-0.9 s, ~30 times in
    300 rounds (~10 in these 100). Now none stops; the bound on a write is generous for a
    loaded 2-core machine."""
    memory = RocksDBMemory.of(DEFAULT_ROCKSDB_MEMORY_MIB)
    stores = [RocksDBStore(tmp_path / f"s{n}", memory) for n in range(200)]
    busy, slowest = stores[0], 0.0
    try:
        for round_ in range(100):
            for store in stores[1:]:
                store.write({b"%08d" % (round_ * 20 + i): b"c" * 100 for i in range(20)}, {})
            started = time.perf_counter()
            busy.write({b"%09d" % (round_ * 1000 + i): b"h" * 1000 for i in range(1000)}, {})
            slowest = max(slowest, time.perf_counter() - started)
    finally:
        for store in stores:
            store.close()
    stops = [log for log in tmp_path.glob("s*/LOG") if "Stopping writes" in log.read_text()]
    assert stops == []
    assert slowest < 1.0


def test_reopening_a_store_keeps_a_few_info_logs_not_one_per_open(tmp_path: Path) -> None:
    """RocksDB writes an info log per open and by default keeps 1,000 older ones: a process
    restarted often would fill its disk with them. A store keeps ``KEPT_INFO_LOGS``."""
    for opened in range(KEPT_INFO_LOGS + 4):
        store = RocksDBStore(tmp_path / "s")
        store.write({b"k": str(opened).encode()}, {})
        store.close()
    logs = [p.name for p in (tmp_path / "s").iterdir() if p.name.startswith("LOG")]
    assert 1 < len(logs) <= KEPT_INFO_LOGS
