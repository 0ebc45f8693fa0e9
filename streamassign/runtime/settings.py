"""The settings of a runtime application, checked once where they come in (``App`` only wires
its parts from them). A bad value raises ``RuntimeConfigError`` with one line (a topology
without a task or with invalid structure a ``TopologyError``)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import attrs

from ..errors import RuntimeConfigError
from ..protocol import LATEST_VERSION, MIN_VERSION, is_protocol_version
from ..topology import Topology
from .processing import ErrorPolicy
from .stores import (
    DEFAULT_ROCKSDB_MEMORY_MIB,
    MAX_ROCKSDB_MEMORY_MIB,
    MIN_ROCKSDB_MEMORY_MIB,
    STORE_KINDS,
    StoreKind,
    require_store_library,
)
from .tasks import ProcessorFactory

#: ``at_least_once`` (the default): commit markers in the changelogs, exact tables, outputs
#: at least once. ``exactly_once``: one transaction per task and commit (see
#: ``transactions.py`` and docs/runtime.md).
ProcessingGuarantee = Literal["at_least_once", "exactly_once"]
PROCESSING_GUARANTEES: tuple[ProcessingGuarantee, ...] = ("at_least_once", "exactly_once")
ERROR_POLICIES: tuple[ErrorPolicy, ...] = ("stop", "skip")

log = logging.getLogger("streamassign.runtime")

#: aiokafka's ``transaction_timeout_ms``, unless ``producer_config`` sets one.
TRANSACTION_TIMEOUT_MS = 60_000
#: Kafka Streams' default ``state.cleanup.delay.ms`` (10 minutes).
STATE_CLEANUP_DELAY_MS = 600_000
#: The longest ``state_cleanup_delay_ms`` (Kafka's, a Java long): longer ones overflow the
#: seconds arithmetic of the cleanup.
MAX_STATE_CLEANUP_DELAY_MS = 2**63 - 1


def _topology(value: Topology | str | os.PathLike[str]) -> Topology:
    """The topology ``App`` runs: one with a task (``TopologyError`` otherwise) and a name, its
    application id (App has no other). Checked here, where a file's path is still known, so
    that an empty or half-written file (a config map mounted empty) is one line naming it."""
    if isinstance(value, Topology):
        topology, source = value, ""
    else:
        topology, source = Topology.load(Path(value)), str(value)
    topology.check_has_tasks(source)
    if not topology.name:
        where = f"{source}: " if source else ""
        fix = 'add name = "..." to the file' if source else "build it with Topology(name=...)"
        raise RuntimeConfigError(
            f"{where}the topology has no name, and App runs it under its name (the application "
            f"id: its consumer group, the prefix of its internal topics); {fix}"
        )
    return topology


# (No module-level name ``_config`` here: attrs' generated ``__init__`` reads a global of
# that name.)
def _mapping(value: Mapping[str, Any] | None) -> dict[str, Any]:
    return dict(value or {})


def _processor_map(value: Mapping[int, ProcessorFactory]) -> dict[int, ProcessorFactory]:
    return dict(value)


def _consumer_config(value: Mapping[str, Any] | None) -> dict[str, Any]:
    # A new application reads its input from the start, as Kafka Streams does. In both modes
    # only what committed transactions wrote: an upstream transactional producer's aborted
    # records (or an exactly-once run's aborted repartition records) are never processed. On
    # a topic without transactions this reads exactly what read_uncommitted would (the last
    # stable offset is the high watermark).
    return {"auto_offset_reset": "earliest", "isolation_level": "read_committed", **(value or {})}


def _store_kind(settings: Settings, attribute: Any, kind: str) -> None:
    require_store_library(kind)
    if kind not in STORE_KINDS:
        raise RuntimeConfigError(f"store_kind must be one of {STORE_KINDS}, got {kind!r}")


def _processors(settings: Settings, attribute: Any, processors: Mapping[int, Any]) -> None:
    ids = set(settings.topology.subtopology_ids)
    if set(processors) != ids:
        raise RuntimeConfigError(
            f"processors are needed for exactly the subtopologies {sorted(ids)}, "
            f"got {sorted(processors)}"
        )


def _error_policy(settings: Settings, attribute: Any, policy: str) -> None:
    if policy not in ERROR_POLICIES:
        raise RuntimeConfigError("processing_errors must be 'stop' or 'skip'")


def _guarantee(settings: Settings, attribute: Any, guarantee: str) -> None:
    if guarantee not in PROCESSING_GUARANTEES:
        raise RuntimeConfigError(
            f"processing_guarantee must be one of {PROCESSING_GUARANTEES}, got {guarantee!r}"
        )


def _producer_config(settings: Settings, attribute: Any, config: Mapping[str, Any]) -> None:
    if "transactional_id" in config:
        raise RuntimeConfigError(
            "producer_config may not set transactional_id: with exactly_once each task's "
            "producer has its own, derived from the application id and the task id; at least "
            "once the shared producer writes no transactions (and the producers aborting an "
            "exactly-once run's open transactions derive theirs the same way)"
        )
    timeout = config.get("transaction_timeout_ms", TRANSACTION_TIMEOUT_MS)
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
        raise RuntimeConfigError(
            f"producer_config transaction_timeout_ms must be an int >= 1, got {timeout!r}"
        )


def _commit_interval(settings: Settings, attribute: Any, interval_ms: int) -> None:
    timeout_ms = settings.transaction_timeout_ms
    if settings.exactly_once and interval_ms >= timeout_ms:
        raise RuntimeConfigError(
            f"commit_interval_ms ({interval_ms}) must be below the producer's "
            f"transaction_timeout_ms ({timeout_ms}): the broker aborts a transaction "
            "open longer"
        )
    if interval_ms < 1:
        raise RuntimeConfigError(f"commit_interval_ms must be >= 1, got {interval_ms}")


def _cleanup_delay(settings: Settings, attribute: Any, delay_ms: int | None) -> None:
    if delay_ms is None:
        return
    is_int = isinstance(delay_ms, int) and not isinstance(delay_ms, bool)
    if not is_int or not 1 <= delay_ms <= MAX_STATE_CLEANUP_DELAY_MS:
        raise RuntimeConfigError(
            "state_cleanup_delay_ms must be an int >= 1 and <= 2**63 - 1 (milliseconds), or "
            f"None to keep the state of tasks no longer held for good, got {delay_ms!r}"
        )


def _rocksdb_memory(settings: Settings, attribute: Any, mib: int) -> None:
    is_int = isinstance(mib, int) and not isinstance(mib, bool)
    if not is_int or not MIN_ROCKSDB_MEMORY_MIB <= mib <= MAX_ROCKSDB_MEMORY_MIB:
        raise RuntimeConfigError(
            f"rocksdb_memory_mib must be an int >= {MIN_ROCKSDB_MEMORY_MIB} and <= "
            f"{MAX_ROCKSDB_MEMORY_MIB} (MiB for all RocksDB stores of the App: memtables "
            f"and block cache), got {mib!r}"
        )


def _protocol_version(settings: Settings, attribute: Any, version: int) -> None:
    if not is_protocol_version(version):
        raise RuntimeConfigError(
            f"max_version must be an int from {MIN_VERSION} to {LATEST_VERSION}, got {version!r}"
        )


def _isolation(settings: Settings, attribute: Any, config: Mapping[str, Any]) -> None:
    if settings.exactly_once and config["isolation_level"] != "read_committed":
        raise RuntimeConfigError(
            "exactly_once reads isolation_level='read_committed' only, got "
            f"{config['isolation_level']!r} in consumer_config"
        )


@attrs.frozen(kw_only=True)
class Settings:
    """What ``App`` checks of its arguments (validators run in this order, after every
    field is set), and what follows from them."""

    topology: Topology = attrs.field(converter=_topology)
    store_kind: StoreKind = attrs.field(validator=_store_kind)
    processors: Mapping[int, ProcessorFactory] = attrs.field(
        converter=_processor_map, validator=_processors
    )
    processing_errors: ErrorPolicy = attrs.field(validator=_error_policy)
    processing_guarantee: ProcessingGuarantee = attrs.field(validator=_guarantee)
    producer_config: Mapping[str, Any] = attrs.field(converter=_mapping, validator=_producer_config)
    commit_interval_ms: int = attrs.field(validator=_commit_interval)
    consumer_config: Mapping[str, Any] = attrs.field(
        converter=_consumer_config, validator=_isolation
    )
    #: Kafka Streams' ``state.cleanup.delay.ms``: the local state of a task this process has
    #: not held for that long is deleted (``cleanup.py``); None keeps it for good.
    state_cleanup_delay_ms: int | None = attrs.field(
        default=STATE_CLEANUP_DELAY_MS, validator=_cleanup_delay
    )
    #: MiB that all RocksDB stores of this App share for memtables and block cache (per
    #: App, not per process; ~4 MiB per open store at least: ``stores.RocksDBMemory``);
    #: checked whatever the store kind.
    rocksdb_memory_mib: int = attrs.field(
        default=DEFAULT_ROCKSDB_MEMORY_MIB, validator=_rocksdb_memory
    )
    #: The highest streams protocol version this process speaks (``ProcessHost``'s).
    max_version: int = attrs.field(default=LATEST_VERSION, validator=_protocol_version)

    def __attrs_post_init__(self) -> None:
        if self.exactly_once:
            return
        for sub in self.topology.subtopologies:
            if len(sub.stores) > 1:
                log.warning(
                    "subtopology %d has %d stores: each store's changelog commits on its own, "
                    "so a crash between their markers can leave them at different inputs "
                    "(see Limits in docs/runtime.md)",
                    sub.id,
                    len(sub.stores),
                )

    @property
    def exactly_once(self) -> bool:
        return self.processing_guarantee == "exactly_once"

    @property
    def transaction_timeout_ms(self) -> int:
        return int(self.producer_config.get("transaction_timeout_ms", TRANSACTION_TIMEOUT_MS))
