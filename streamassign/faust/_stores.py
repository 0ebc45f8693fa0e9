"""Where a Faust table keeps its partitions: the one accessor of a table's store for the
assignor (offset sums, damaged directories) and the zombie rewind (``_proven``)."""

from __future__ import annotations

from typing import Any

__all__ = ["disk_store", "keeps_state_on_disk"]


def disk_store(table: Any) -> Any:
    """The store that keeps ``table``'s partition databases: ``table.data`` itself, but for a
    set table (``app.SetTable``, ``app.SetGlobalTable``), whose ``data`` is Faust's
    ``ChangeloggedSetManager`` with the RocksDB store one level down (its ``storage``): read
    at ``table.data``, those tables had no offset sum and no damage check (a damaged
    directory crashed every start)."""
    data = table.data
    if getattr(data, "partition_path", None) is None:
        return getattr(data, "storage", data)
    return data


def keeps_state_on_disk(store: Any) -> bool:
    """Whether ``store`` is Faust's RocksDB store (what the offset reader can open)."""
    return (
        getattr(store, "rocksdb_options", None) is not None
        and getattr(store, "partition_path", None) is not None
    )
