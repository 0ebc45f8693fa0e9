"""A Faust-like stream processing runtime on aiokafka (needs the ``runtime`` extra).

``App`` runs a topology's processors over N consumers of one process, with per-task state
stores (in memory or RocksDB) backed by changelog topics, standby replicas kept up to date by
a restore consumer, and exact table state under at-least-once delivery. See
``docs/runtime.md``. ``stores`` and ``changelog`` are pure (no Kafka) and tested alone.
"""

from ..errors import ReservedKeyError, StoreKeyTypeError
from ._topics import InternalTopicError, ensure_internal_topics, internal_topics
from .app import (
    App,
    ProcessingError,
    Processor,
    ProcessorFactory,
    Record,
    RestoreEvent,
    RuntimeConfigError,
    Table,
    TaskContext,
)
from .changelog import COMMIT_KEY, StoreState
from .stores import KeyValueStore, MemoryStore, RocksDBStore, StoreKind, open_store

__all__ = [
    "COMMIT_KEY",
    "App",
    "InternalTopicError",
    "KeyValueStore",
    "MemoryStore",
    "ProcessingError",
    "Processor",
    "ProcessorFactory",
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
    "open_store",
]
