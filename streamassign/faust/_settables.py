"""A worker's warning about the app's set tables stored in RocksDB (docs/faust.md, "Set
tables"), logged once per process at its first join.

Faust's set tables (``app.SetTable``, ``app.SetGlobalTable``) on RocksDB lose members at every
restart, clean or not, whatever the assignor (measured with Faust's own as with ours): each
change stores the set from before the change (``ChangeloggedObjectManager.
send_changelog_event``), members restored from the changelog are applied in memory only
(``apply_changelog_batch``), and the stale stored sets replace the replayed ones when the
recovery completes (``sync_from_storage``). With ``value_type`` set, the stored set (a list) is
decoded as one member: ``ValueDecodeError`` in a task nobody awaits, and the table starts empty
while the worker reports ready (faust-streaming issue #261). Fixing that means patching Faust's
set manager, which the drop-in does not do: it says so instead, without changing anything.

Every faust-streaming version the drop-in supports (0.12 to 0.15) has that code: the store write
came with 0.10.14 (PR #522), and upstream ``main`` still had it in August 2026. So the warning is
not gated on the version; whoever widens the supported range past a Faust that fixes it gates it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import attrs
from faust import stores as faust_stores
from faust.stores.rocksdb import Store as RocksDBStore
from faust.tables.sets import ChangeloggedSetManager, SetTable

from ._app import faust_version

__all__ = ["SetTableStorage", "set_tables_on_disk", "warn_about_set_tables"]

log = logging.getLogger("streamassign.faust")


@attrs.frozen
class SetTableStorage:
    """A set table that Faust stores in RocksDB, and what the warning says of it."""

    name: str
    #: The declared member type (``value_type=``), None if none: it starts empty at a restart.
    value_type: str | None = None
    #: The table asks for memory (``store="memory://"``) but Faust uses the app's store.
    memory_ignored: bool = False

    def describe(self) -> str:
        """The table's name, and that its ``store="memory://"`` is ignored if it is."""
        if not self.memory_ignored:
            return self.name
        return f"{self.name} (its store='memory://' is ignored: write 'memory:///')"


def warn_about_set_tables(app: Any) -> None:
    """One WARNING naming the app's set tables stored in RocksDB, and one ERROR naming those
    with a ``value_type``; nothing when there are none. Never raises: it runs in the join, and a
    worker must not stop for a warning (logged)."""
    try:
        on_disk = set_tables_on_disk(app.tables.values(), app.conf.store)
    except Exception:
        log.exception("cannot check this app's set tables for a RocksDB store")
        return
    if on_disk:
        _log_lost_members(on_disk)
    if typed := [t for t in on_disk if t.value_type is not None]:
        _log_empty_at_restart(typed)


def set_tables_on_disk(tables: Iterable[Any], app_store: Any) -> list[SetTableStorage]:
    """The set tables among ``tables`` that Faust stores in RocksDB, by name: each table's own
    ``store=``, or ``app_store`` (``app.conf.store``) when it has none or a false one."""
    found = []
    for table in tables:
        if not _is_set_table(table):
            continue
        own_store = getattr(table, "_store", None)
        # Faust's own choice (tables/base.py ``_new_store``, tables/objects.py ``storage``):
        # ``URL("memory://")`` has no host nor path, is false, and falls back to the app's.
        store_url = own_store or app_store
        if not issubclass(faust_stores.by_url(store_url), RocksDBStore):
            continue
        value_type = getattr(table, "value_type", None)
        found.append(
            SetTableStorage(
                name=str(table.name),
                value_type=None if value_type is None else _type_name(value_type),
                memory_ignored=_memory_ignored(own_store),
            )
        )
    return sorted(found, key=lambda t: t.name)


def _is_set_table(table: Any) -> bool:
    """Whether ``table`` keeps its values in Faust's set manager: a ``SetTable`` or
    ``SetGlobalTable`` (its subclass), or a table already holding one (a custom table class)."""
    made = getattr(table, "_data", None)  # read, not made: ``table.data`` would make it
    return isinstance(table, SetTable) or isinstance(made, ChangeloggedSetManager)


def _memory_ignored(own_store: Any) -> bool:
    """Whether a table's ``own_store`` asks for memory but Faust uses the app's store."""
    return own_store is not None and not own_store and getattr(own_store, "scheme", "") == "memory"


def _type_name(value_type: Any) -> str:
    return str(getattr(value_type, "__qualname__", value_type))


def _log_lost_members(on_disk: Sequence[SetTableStorage]) -> None:
    log.warning(
        "set table%s %s %s stored in RocksDB, where Faust (faust-streaming %s) loses members "
        "at every restart, clean or not, with any assignor: each key's stored set lacks its "
        "last change, and members restored from the changelog never reach the disk; streamassign "
        "cannot repair it. Workaround without windows: store='memory:///' on the set table "
        "(three slashes: 'memory://' is ignored) and a changelog retention that keeps the "
        "whole history (retention.ms=-1: such a changelog is not compacted, and the broker "
        "deletes after 7 days by default); a windowed set table has none: use a Table whose "
        "value is the whole set "
        '(docs/faust.md, "Set tables")',
        "" if len(on_disk) == 1 else "s",
        ", ".join(t.describe() for t in on_disk),
        "is" if len(on_disk) == 1 else "are",
        faust_version(),
    )


def _log_empty_at_restart(typed: Sequence[SetTableStorage]) -> None:
    log.error(
        "set table%s %s in RocksDB with value_type set come%s back EMPTY at every restart "
        "while the worker reports ready: Faust decodes each whole stored set as one member "
        "(ValueDecodeError, logged as 'Task exception was never retrieved'; faust-streaming "
        "issue #261), and the next change to a key stores over its members on disk. "
        "Drop value_type: it names the member type, and Faust stores whole sets "
        '(docs/faust.md, "Set tables")',
        "" if len(typed) == 1 else "s",
        ", ".join(f"{t.name} (value_type={t.value_type})" for t in typed),
        "s" if len(typed) == 1 else "",
    )
