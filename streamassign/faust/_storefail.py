"""Stop a worker whose table store failed a write, before any commit passes the record.

When a RocksDB write fails (a full disk: ``IO error: No space left on device``; an I/O error;
a read-only remount), the agent raises, Faust logs ``Crashed reason=...`` and restarts the
agent, and the stream acks the event it was on (its ``finally:``), so the next commit passes
a record whose table update never happened: lost. Faust's supervisor restarts the agent every
few seconds, each restart takes the next record and fails on it the same way, and the RocksDB
handle keeps its error after space is freed: records go on being lost until someone restarts
the worker, and nothing says so (a 4-minute run lost records on 19 of 24 keys; stock Faust
on 10).

``StoreFailureGuard`` watches each table store's writes (``_set``, ``_del``, the changelog
batches of a recovery or standby). At the first failure, before the
exception reaches the agent (so before Faust acks the event), it latches: the consumer then
refuses every commit (``_Consumer._commit_tps``, which every commit of Faust goes
through), one ERROR line names the table, its directory, RocksDB's status and what to do,
and the app is crashed (Faust's stop path: the worker exits non-zero), so that a supervisor
restarts it: the group moves its partitions meanwhile and they are processed again from the
last commit (at-least-once: duplicates, never a gap).

A table's source partition count that no longer matches its changelog's (partitions added to
the source while the app ran) ends the same way: Faust's check raises ``PartitionsMismatch``
in the agent, the stream acks the event and Faust's restarts of the agent commit past every
record that fails it (4,160 of 46,368 records committed unprocessed in a live run). The guard
latches on that check too (``watch_tables``), so the worker stops with nothing committed and
the records wait until the counts match.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
from collections.abc import Callable, Iterable
from typing import Any

import attrs
from faust.exceptions import PartitionsMismatch

from ._stores import keeps_state_on_disk

__all__ = [
    "GUARDED_WRITES",
    "SourceCountMismatch",
    "StoreFailure",
    "StoreFailureGuard",
    "crash_app",
    "is_store_failure",
]

log = logging.getLogger("streamassign.faust")

#: The methods of Faust's RocksDB store that write to its databases.
#: Not ``set_persisted_offset``: an offset not persisted loses no record (a restart restores
#: from the older offset, again), and it fails for passing reasons too (the lock of a revoked
#: partition's database still held by this process).
GUARDED_WRITES = ("_set", "_del", "apply_changelog_batch")


def is_store_failure(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a store write, is the database failing (not Faust's or the
    app's code around it: a write outside an event is an ``AssertionError``, a value of the
    wrong type a ``TypeError``). rocksdict raises a bare ``Exception`` carrying RocksDB's
    status (Faust itself catches ``Exception`` for it: ``ERRORS_ROCKS_IO_ERROR``),
    python-rocksdb its ``rocksdb.errors`` classes, and opening a partition's directory may
    raise ``OSError``.

    Every RocksDB status counts, not only ``IO error``: whatever the status, the write did
    not happen and Faust acks the event anyway, so the record is lost if the worker commits
    on. A full disk, an I/O error and a read-only remount all come as ``IO error``, but after
    one failed write RocksDB keeps a background error and may answer later writes with
    another status; and one that fails the same record at every restart stops the worker
    each time (loud, nothing lost) rather than skipping the record."""
    if isinstance(exc, OSError) or type(exc) is Exception:
        return True
    return type(exc).__module__.split(".")[0] == "rocksdb"


@attrs.frozen
class StoreFailure:
    """The first failed write: the table's name, its store's directory, RocksDB's status."""

    table: str
    directory: str
    status: str

    def line(self) -> str:
        return (
            f"table {self.table!r}: a write to its RocksDB store in {self.directory} failed "
            f"({self.status}); this worker commits no offset from now on (the record being "
            "processed and those after it are processed again, from the last commit, by "
            "whoever gets their partitions) and stops: free space (or fix the disk), then "
            "restart the worker"
        )


@attrs.frozen
class SourceCountMismatch:
    """A table whose source topic's partition count differs from its changelog's (Faust's
    ``PartitionsMismatch``, which names both)."""

    table: str
    mismatch: str

    def line(self) -> str:
        return (
            f"table {self.table!r}: {_one_line(self.mismatch)}; this worker commits no offset "
            "from now on (the record being processed and those after it wait, from the last "
            "commit, until the counts match) and stops: partitions added to a source topic "
            "while the app ran? see docs/faust.md, 'Adding partitions to a topic on a live "
            "fleet'"
        )


def _one_line(message: str) -> str:
    """Faust's message on one line: it spans several and ends in ".\n", which split the
    ERROR so that a grep for it found the counts but not what to do."""
    return " ".join(message.split()).rstrip(".")


def _directory(store: Any) -> str:
    """Where the store keeps its partition databases (one directory each)."""
    try:
        return f"{store.path / store.basename}-<partition>.db"
    except Exception:  # a store without Faust's path attributes: still say which table
        return "(its directory is unknown)"


def _table_name(store: Any) -> str:
    table = getattr(store, "table", None)
    return str(getattr(table, "name", None) or getattr(store, "table_name", "?"))


@attrs.define(eq=False)
class StoreFailureGuard:
    """Latches the first failed table store write and calls ``on_failure`` with it, once."""

    on_failure: Callable[[StoreFailure | SourceCountMismatch, BaseException], None]
    failure: StoreFailure | SourceCountMismatch | None = None
    #: Failed writes after the first (logged at DEBUG: the line was given).
    later_failures: int = 0

    @property
    def failed(self) -> bool:
        return self.failure is not None

    def watch(self, stores: Iterable[Any]) -> None:
        """Guard the writes of each RocksDB store of ``stores`` (once per store)."""
        for store in stores:
            if keeps_state_on_disk(store):
                for name in GUARDED_WRITES:
                    self._guard(store, name)

    def watch_tables(self, tables: Iterable[Any]) -> None:
        """Latch when a table's check of its source topic's partition count fails (once per
        table): the check runs before the table's store or changelog is written."""
        for table in tables:
            check = getattr(table, "_verify_source_topic_partitions", None)
            if check is None or getattr(check, "_streamassign_guarded", False):
                continue

            def guarded(source_topic: str, *, table: Any = table, check: Any = check) -> None:
                try:
                    check(source_topic)
                except PartitionsMismatch as exc:
                    self._latch(SourceCountMismatch(str(table.name), str(exc)), exc)
                    raise

            guarded._streamassign_guarded = True  # type: ignore[attr-defined]
            table._verify_source_topic_partitions = guarded

    def _guard(self, store: Any, name: str) -> None:
        write = getattr(store, name, None)
        if write is None or getattr(write, "_streamassign_guarded", False):
            return

        @functools.wraps(write)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return write(*args, **kwargs)
            except Exception as exc:
                if is_store_failure(exc):
                    self.failed_write(store, exc)
                raise

        guarded._streamassign_guarded = True  # type: ignore[attr-defined]
        setattr(store, name, guarded)

    def failed_write(self, store: Any, exc: BaseException) -> None:
        self._latch(StoreFailure(_table_name(store), _directory(store), str(exc) or repr(exc)), exc)

    def _latch(self, failure: StoreFailure | SourceCountMismatch, exc: BaseException) -> None:
        if self.failure is not None:
            self.later_failures += 1
            log.debug("another table failure after the first: %r", exc)
            return
        self.failure = failure
        log.error("%s", failure.line())
        self.on_failure(failure, exc)


def crash_app(app: Any, exc: BaseException) -> concurrent.futures.Future[Any] | None:
    """Crash ``app`` (Faust's stop path for a fatal error: the worker exits non-zero) on its
    loop, from whichever thread the failed write ran in (the agent must raise first). The
    caller keeps the returned future: the loop keeps only weak references to tasks. None when
    the app's loop is not running (a test calling a store directly): nothing to stop."""
    loop: asyncio.AbstractEventLoop | None
    try:
        loop = asyncio.get_running_loop()  # the agent's: the app's loop
    except RuntimeError:  # a thread without a loop of its own: the app's
        loop = getattr(app, "loop", None)
        if loop is None or not loop.is_running():
            return None
    return asyncio.run_coroutine_threadsafe(app.crash(exc), loop)
