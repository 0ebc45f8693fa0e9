"""Key-value stores of the runtime: in memory, or persistent in RocksDB (``rocksdict``).

A store holds committed state only: the runtime writes to it once the changelog has
acknowledged a commit, in one atomic batch with the store's metadata (the changelog position
it has reached and the input offsets it has applied). So a persistent store is always a prefix
of its changelog, also after ``kill -9`` (see ``docs/runtime.md``). Keys and values are bytes.
Pure: no Kafka here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NoReturn, Protocol

import attrs

from ..errors import (
    DamagedStateError,
    RuntimeConfigError,
    StoreIOError,
    StoreNotOpenError,
    require_extra,
)
from ..localstate import NOT_DAMAGE_STATUSES, not_a_directory
from ._extra import STORES

if TYPE_CHECKING:
    from rocksdict import Cache, Options, WriteBufferManager

log = logging.getLogger("streamassign.runtime")

StoreKind = Literal["memory", "rocksdb"]
STORE_KINDS: tuple[StoreKind, ...] = ("memory", "rocksdb")

#: Each RocksDB store's memtable size and count: at most 16 MiB of memtables per store, where
#: RocksDB's defaults (64 MiB, 2) let each open store grow to 128 MiB before the first flush
#: and Kafka Streams' (16 MiB, 3) to 48 MiB. The runtime's batches are small and keys repeat,
#: so bigger memtables mostly hold overwritten values; smaller ones only flush more often.
WRITE_BUFFER_BYTES = 8 << 20
MAX_WRITE_BUFFERS = 2
#: ``App``'s ``rocksdb_memory_mib``: what all RocksDB stores of one ``App`` share for
#: memtables and block cache (see ``RocksDBMemory``), and its limits.
DEFAULT_ROCKSDB_MEMORY_MIB = 128
#: One store's memtables (``WRITE_BUFFER_BYTES * MAX_WRITE_BUFFERS``) must fit in the half
#: of the budget they may take, or every write to a full memtable would force a flush.
MIN_ROCKSDB_MEMORY_MIB = 32
#: The memtable room each open store is given at least: a store being written holds a 1 MiB
#: arena block in its mutable memtable and another in the one flushing (the write buffer
#: manager counts whole blocks), and twice that leaves room to fill them. Under this, the
#: shared flush limit is hit on nearly every write.
ROCKSDB_STORE_FLOOR_MIB = 4
MAX_ROCKSDB_MEMORY_MIB = 1 << 20  # 1 TiB

_DATA = b"d"  # RocksDB key prefixes: user data and store metadata share one keyspace
_META = b"m"
#: A file in a store's directory saying a read found the store damaged (RocksDB's status).
_FOUND_DAMAGED = "STREAMASSIGN-DAMAGED"

#: RocksDB statuses (of an open or a read) that say the store's files are damaged (rocksdict
#: raises a plain ``Exception`` carrying the status): a corrupt or truncated file, or one its
#: MANIFEST names that is gone (a deleted CURRENT shows as "wal_dir contains existing log
#: file").
_DAMAGED_STATUSES = ("Corruption:", "IO error: No such file or directory")


class KeyValueStore(Protocol):
    """Committed state of one store of one task."""

    #: Whether the content survives the process (then its checkpoint is worth reporting).
    persistent: bool

    def get(self, key: bytes) -> bytes | None: ...

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every key and value, in key order."""
        ...

    def meta(self, name: str) -> bytes | None: ...

    def write(self, writes: Mapping[bytes, bytes | None], meta: Mapping[str, bytes]) -> None:
        """Apply ``writes`` (``None`` deletes) and set ``meta`` atomically."""
        ...

    def close(self) -> None: ...


class MemoryStore:
    """A dict; lost with the process, so it is always restored from its changelog."""

    persistent = False

    def __init__(self) -> None:
        self._data: dict[bytes, bytes] = {}
        self._meta: dict[str, bytes] = {}

    def get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        return iter(sorted(self._data.items()))

    def meta(self, name: str) -> bytes | None:
        return self._meta.get(name)

    def write(self, writes: Mapping[bytes, bytes | None], meta: Mapping[str, bytes]) -> None:
        for key, value in writes.items():
            if value is None:
                self._data.pop(key, None)
            else:
                self._data[key] = value
        self._meta.update(meta)

    def close(self) -> None:
        self._data.clear()


@attrs.define(eq=False)
class RocksDBMemory:
    """One ``App``'s bound on the memory of its RocksDB stores (Kafka Streams' recommended
    ``RocksDBConfigSetter``): one block cache of ``total_bytes`` shared by every store, and
    one write buffer manager that charges every memtable to that cache and flushes once the
    memtables take their limit: half the budget, or ``ROCKSDB_STORE_FLOOR_MIB`` per open
    store if that is more (``opened``). A fixed limit below ~2 MiB per written store makes
    nearly every write flush its own tiny memtable, and a busy store's writes then stop for
    up to seconds behind the queued flushes, on the event loop. So the
    stores' memory stays near ``total_bytes`` up to ``total_bytes / 4 MiB`` open stores, and
    grows to about open stores x 4 MiB beyond (warned when first short, and again each time
    the open stores double, so the advice follows the real count); each store's memtables
    are also at most 16 MiB. Not a hard limit (RocksDB's cache may overshoot briefly; index
    and filter blocks in use stay pinned), and each open store has a fixed overhead outside
    it. Not shared between ``App``s: two ``App``s in one process have a budget each."""

    total_bytes: int
    cache: Cache
    write_buffers: WriteBufferManager
    #: RocksDB stores open within this budget (opened in threads, so under ``_lock``).
    open_stores: int = 0
    #: Open stores when the budget was last found short and said so (0: never): a new
    #: warning only once they double, so the last one names about the value to set.
    warned_at: int = 0
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    @classmethod
    def of(cls, mib: int) -> RocksDBMemory:
        from rocksdict import Cache, WriteBufferManager

        total = mib << 20
        cache = Cache(total)
        # allow_stall=False: over the limit RocksDB flushes; stalling writers would stall the
        # event loop (store writes run on it after each commit).
        manager = WriteBufferManager.new_write_buffer_manager_with_cache(total // 2, False, cache)
        return cls(total, cache, manager)

    def memtable_limit(self, stores: int) -> int:
        """Bytes the memtables of ``stores`` open stores may take before the manager
        flushes: half the budget, or the stores' floor if that is more."""
        return max(self.total_bytes // 2, stores * (ROCKSDB_STORE_FLOOR_MIB << 20))

    def opened(self) -> None:
        """Count a store opened: the memtable limit grows with it; when the stores' floor is
        first over the whole budget, and again each time the open stores double, a warning
        says what to set (stores open one by one: the first crossing alone named a value
        one store above the budget however many more were coming)."""
        with self._lock:
            self.open_stores += 1
            stores = self.open_stores
            self.write_buffers.set_buffer_size(self.memtable_limit(stores))
            floor_mib = stores * ROCKSDB_STORE_FLOOR_MIB
            short = floor_mib > self.total_bytes >> 20
            warn = short and (self.warned_at == 0 or stores >= 2 * self.warned_at)
            if warn:
                self.warned_at = stores
        if warn:
            log.warning(
                "%d RocksDB stores are open in this App, more than rocksdb_memory_mib=%d fits "
                "at %d MiB each: their memtables may take %d MiB and RocksDB's memory grows to "
                "about that; set rocksdb_memory_mib=%d or more to budget for them "
                "(docs/runtime.md, RocksDB memory)",
                stores,
                self.total_bytes >> 20,
                ROCKSDB_STORE_FLOOR_MIB,
                floor_mib,
                floor_mib,
            )

    def closed(self) -> None:
        """Count a store closed: its memtable room is given back."""
        with self._lock:
            self.open_stores -= 1
            self.write_buffers.set_buffer_size(self.memtable_limit(self.open_stores))


#: Info logs RocksDB keeps per store (the current one and older ones, one per open).
KEPT_INFO_LOGS = 3


def rocksdb_options(memory: RocksDBMemory | None) -> Options:
    """The options a runtime store opens with: bounded memtables (``WRITE_BUFFER_BYTES``,
    ``MAX_WRITE_BUFFERS``) and, given ``memory``, the App's shared cache and write buffer
    manager (without: RocksDB's own block cache, per store)."""
    from rocksdict import BlockBasedOptions, Options

    options = Options(raw_mode=True)
    options.set_write_buffer_size(WRITE_BUFFER_BYTES)
    options.set_max_write_buffer_number(MAX_WRITE_BUFFERS)
    # RocksDB keeps an info log per open (LOG.old.*, up to 1,000 by default): a process
    # restarted often filled its disk with them.
    options.set_keep_log_file_num(KEPT_INFO_LOGS)
    if memory is not None:
        table = BlockBasedOptions()
        table.set_block_cache(memory.cache)
        # Index and filter blocks in the cache too, else they grow outside the budget with
        # the number of SST files; level 0's pinned, as they are read on every lookup.
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        options.set_block_based_table_factory(table)
        options.set_write_buffer_manager(memory.write_buffers)
    return options


class RocksDBStore:
    """A RocksDB database in a directory (``rocksdict``, raw bytes mode); survives restarts.

    Data and metadata go through one ``WriteBatch``, so a crash leaves either both or neither.
    """

    persistent = True

    def __init__(self, path: str | Path, memory: RocksDBMemory | None = None) -> None:
        """Open (or create) the store in ``path``, within ``memory`` (``rocksdb_options``):
        ``DamagedStateError`` if its files are damaged (``is_damaged_store_status``),
        ``StoreIOError`` if it cannot be opened for another reason."""
        from rocksdict import Rdict

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # A link to a directory is fine; one that leads to none (nothing there: a disk not
        # mounted; a loop of links) would fail RocksDB's open with "File exists" at every
        # start, so it is damage: set aside, the store restores from its changelog.
        if not self.path.is_dir() and (self.path.exists() or self.path.is_symlink()):
            raise DamagedStateError(f"store {self.path}: {not_a_directory(self.path)}")
        with contextlib.suppress(OSError):  # unreadable: RocksDB's open says what is wrong
            found = (self.path / _FOUND_DAMAGED).read_text(errors="replace")[:1000]
            raise DamagedStateError(f"store {self.path}: a read found it damaged: {found}")
        try:
            self._db = Rdict(str(self.path), rocksdb_options(memory))
        except Exception as exc:  # rocksdict raises Exception("<RocksDB status>")
            if is_damaged_store_status(str(exc)):
                raise DamagedStateError(f"store {self.path}: {exc}") from exc
            raise StoreIOError(f"store {self.path} cannot be opened: {exc}") from None
        #: The budget this store counts in while open (None once closed, or without one).
        self._memory = memory
        if memory is not None:
            memory.opened()
        #: The directory opened (device, inode), to tell it moved (``moved``); None: unknown.
        self._opened: tuple[int, int] | None = None
        with contextlib.suppress(OSError):
            directory = os.stat(self.path)
            self._opened = (directory.st_dev, directory.st_ino)

    def moved(self) -> bool:
        """Whether the directory at the store's path is no longer the one it opened: renamed
        or deleted under the open store (with ``tasks/`` or its task's directory), or another
        one in its place. Its files are then elsewhere, and a checkpoint written beside the
        path would claim state that is not there. ``OSError`` if it cannot be told."""
        try:
            found = os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            return True
        return self._opened is not None and (found.st_dev, found.st_ino) != self._opened

    def _failed(self, what: str, exc: Exception) -> StoreIOError:
        """The typed error for a failed read, write or close (a full disk, an I/O error). It
        carries RocksDB's status in its message and is raised ``from None``: the bare
        ``Exception`` behind it adds a second traceback and nothing else. Damage found
        (``is_damaged_store_status``) is marked in the store's directory: its next open fails with
        ``DamagedStateError``, so the store is set aside and restored, not read again and
        again by restarts that each stop on it."""
        # A corrupt block a read found (the open does not read all).
        if is_damaged_store_status(str(exc)):
            with contextlib.suppress(OSError):  # e.g. a full disk: then it stays unmarked
                (self.path / _FOUND_DAMAGED).write_text(str(exc))
        return StoreIOError(f"store {self.path}: {what} failed: {exc}")

    def get(self, key: bytes) -> bytes | None:
        try:
            value = self._db.get(_DATA + key)
        except Exception as exc:
            raise self._failed("a read", exc) from None
        return None if value is None else bytes(value)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every key and value, in key order; ``StoreIOError`` if a block cannot be read.

        An explicit iterator, not ``Rdict.items()``: that one ends quietly at a corrupt
        block (the error is only in the iterator's status), so a scan, or a restore clearing
        the store, would go on with part of the keys."""
        try:
            cursor = self._db.iter()
            cursor.seek(_DATA)
            while cursor.valid():
                raw = bytes(cursor.key())
                if not raw.startswith(_DATA):
                    return
                yield raw[1:], bytes(cursor.value())
                cursor.next()
            cursor.status()  # raises the error that ended the iteration, if one did
        except Exception as exc:
            raise self._failed("a read", exc) from None

    def meta(self, name: str) -> bytes | None:
        try:
            value = self._db.get(_META + name.encode())
        except Exception as exc:
            raise self._failed("a read", exc) from None
        return None if value is None else bytes(value)

    def write(self, writes: Mapping[bytes, bytes | None], meta: Mapping[str, bytes]) -> None:
        from rocksdict import WriteBatch

        batch = WriteBatch(raw_mode=True)
        for key, value in writes.items():
            if value is None:
                batch.delete(_DATA + key)
            else:
                batch.put(_DATA + key, value)
        for name, value in meta.items():
            batch.put(_META + name.encode(), value)
        try:
            self._db.write(batch)
        except Exception as exc:
            raise self._failed("a write", exc) from None

    def close(self) -> None:
        memory, self._memory = self._memory, None
        try:
            self._db.close()
        except Exception as exc:  # a close flushes: a full disk shows here
            raise self._failed("the close", exc) from None
        finally:
            # After the close, which flushes this store's memtable: lowered before, the
            # limit would still charge it while the other stores are written. Even if the
            # close fails: its memory is released.
            if memory is not None:
                memory.closed()


def moved_away(store: KeyValueStore) -> bool:
    """Whether ``store`` keeps its files in a directory no longer at its path
    (``RocksDBStore.moved``; a store without files never moves)."""
    return isinstance(store, RocksDBStore) and store.moved()


def is_damaged_store_status(status: str) -> bool:
    """Whether a RocksDB status (of an open or a read) says a store's files are damaged (so
    the store is set aside and restored from its changelog), not that it is in use or that
    the disk is full or failing (those move nothing: the operator's to fix)."""
    return status.startswith(_DAMAGED_STATUSES) and not any(
        c in status for c in NOT_DAMAGE_STATUSES
    )


class UnopenedStore:
    """Stands in for a store being opened in a thread (``TaskStores.take``): opening a large
    RocksDB store takes seconds, which on the event loop would stall heartbeats. Its task is
    restoring meanwhile (input paused), so nothing reads or writes it; the state updater
    starts reading its changelog once the real store replaced it."""

    def __init__(self, persistent: bool, *, checkpointed: bool = False) -> None:
        self.persistent = persistent
        #: Whether its position until the open is its task checkpoint's (else 0: none read).
        self.checkpointed = checkpointed
        #: Why the open failed (None: still opening).
        self.error: BaseException | None = None

    def _refuse(self) -> NoReturn:
        raise StoreNotOpenError(
            "the store is not open yet" if self.error is None else f"opening failed: {self.error!r}"
        ) from self.error

    def get(self, key: bytes) -> bytes | None:
        self._refuse()

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        self._refuse()

    def meta(self, name: str) -> bytes | None:
        self._refuse()

    def write(self, writes: Mapping[bytes, bytes | None], meta: Mapping[str, bytes]) -> None:
        self._refuse()

    def close(self) -> None:
        """Nothing to close (whoever closes the task waits for the real store first)."""


def require_store_library(kind: str) -> None:
    """Fail at once, naming the extra, if a ``rocksdb`` store's library is missing: opening
    the store later fails inside every task and the application runs on without them."""
    if kind != "rocksdb":
        return
    require_extra("store_kind='rocksdb'", "runtime", STORES, "use store_kind='memory'")


def open_store(kind: StoreKind, path: Path, memory: RocksDBMemory | None = None) -> KeyValueStore:
    """A store of ``kind``; ``path`` is where a persistent one lives, ``memory`` the bound a
    RocksDB one shares with the process's others (``RocksDBMemory``)."""
    if kind == "memory":
        return MemoryStore()
    if kind == "rocksdb":
        return RocksDBStore(path, memory)
    raise RuntimeConfigError(f"unknown store kind {kind!r} (known: {', '.join(STORE_KINDS)})")


def wipe_store(path: Path) -> None:
    """Remove a persistent store's files (its state is worth nothing, e.g. it is corrupt)."""
    shutil.rmtree(path, ignore_errors=True)
