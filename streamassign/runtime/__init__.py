"""A Faust-like stream processing runtime on aiokafka (needs the ``runtime`` extra).

``App`` runs a topology's processors over N consumers of one process, with per-task state
stores (in memory or RocksDB) backed by changelog topics, standby replicas kept up to date by
a restore consumer, exact table state under at-least-once delivery (or exactly-once
processing: one Kafka transaction per task and commit), and interactive queries over the
tables (``QueryServer``, ``QueryClient``). See
``docs/runtime.md``. ``stores`` and ``changelog`` are pure (no Kafka) and tested alone.
"""

from typing import TYPE_CHECKING, Any

from ..errors import ReservedKeyError, StoreKeyTypeError
from . import _extra  # before the rest: names the extra when it is missing
from ._topics import InternalTopicError, ensure_internal_topics, internal_topics
from .app import (
    App,
    ProcessingError,
    ProcessingGuarantee,
    Processor,
    ProcessorFactory,
    Record,
    RestoreEvent,
    RuntimeConfigError,
    Table,
    TaskContext,
)
from .changelog import COMMIT_KEY, StoreState
from .queries import Queries, Query, QueryResult, key_partition
from .stores import KeyValueStore, MemoryStore, RocksDBStore, StoreKind, open_store

__all__ = [
    "COMMIT_KEY",
    "App",
    "InternalTopicError",
    "KeyValueStore",
    "MemoryStore",
    "ProcessingError",
    "ProcessingGuarantee",
    "Processor",
    "ProcessorFactory",
    "Queries",
    "Query",
    "QueryClient",
    "QueryResult",
    "QueryServer",
    "Record",
    "ReservedKeyError",
    "RestoreEvent",
    "RocksDBStore",
    "RuntimeConfigError",
    "StoreKeyTypeError",
    "StoreKind",
    "StoreState",
    "Table",
    "TaskContext",
    "ensure_internal_topics",
    "internal_topics",
    "key_partition",
    "open_store",
]

if TYPE_CHECKING:
    from .query_server import QueryClient, QueryServer


def __getattr__(name: str) -> Any:
    """The HTTP side of queries, imported on first use (aiohttp takes a while to import)."""
    if name in ("QueryClient", "QueryServer"):
        _extra.require_queries(f"streamassign.runtime.{name}")  # names what was read
        from . import query_server

        # Kept as the module's own: later reads find them without this function's check.
        globals().update(QueryClient=query_server.QueryClient, QueryServer=query_server.QueryServer)
        return getattr(query_server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
