"""ProcessHosts without a broker, for tests that drive their assignors by hand (a leader's
``assign``, each member's ``on_assignment``), as aiokafka would."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from streamassign import Subtopology, TaskId, Topology
from streamassign.aiokafka import ProcessHost

#: One stateful subtopology, whose store's changelog is :data:`CHANGELOG`.
TOPOLOGY = Topology([Subtopology(0, ["in"], stores=["s"])], name="app")
CHANGELOG = "app-s-changelog"
#: A bootstrap address where no broker listens: these hosts never connect.
NO_BROKER = "127.0.0.1:1"


def with_process_id(path: Path, pid: int) -> Path:
    """``path``, made, holding ``uuid.UUID(int=pid)`` as the process id a host reads there."""
    path.mkdir()
    (path / "process.id").write_text(str(uuid.UUID(int=pid)))
    return path


def ends_at(end: int, task_count: int) -> dict[TaskId, int]:
    """The changelog end offsets of :data:`TOPOLOGY`'s first ``task_count`` tasks, all ``end``."""
    return {TaskId(0, p): end for p in range(task_count)}


def brokerless(
    path: Path, end_offsets: Mapping[TaskId, int] | None = None, **options: Any
) -> ProcessHost:
    """A host of :data:`TOPOLOGY` keeping its state in ``path`` (its process id too, if
    :func:`with_process_id` put one there), whose leader reads ``end_offsets`` as the
    changelogs' end offsets (None: unknown); ``options``: ``ProcessHost``'s others."""
    return ProcessHost(
        TOPOLOGY,
        bootstrap_servers=NO_BROKER,
        state_dir=path,
        end_offsets=None if end_offsets is None else lambda: dict(end_offsets),
        **options,
    )
