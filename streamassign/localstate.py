"""A process's state directory: its persistent process id and the checkpoints of its tasks.

Kafka Streams keeps the process id in the state directory, so a restarted process is the same
client to the leader, and reports, for every task whose state it has on disk, the sum of the
checkpointed changelog offsets; that is what makes restarts sticky. Same here:

    <state_dir>/process.id                  the process id (a UUID), created once
    <state_dir>/tasks/<s_p>/checkpoint      JSON {"<changelog topic>": {"<partition>": offset}}
    <state_dir>/assignment.json             JSON {"<consumer index>": ["<s_p>", ...]}: the
                                            active tasks each consumer ran last, reported
                                            after a restart so the process gets them back

A lock file keeps two processes from sharing one directory (they would report each other's
state). Pure standard library; the runtime writes checkpoints, the protocol reads the sums.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from ._ids import TaskId, TopicPartition
from .errors import StreamAssignError

log = logging.getLogger("streamassign.localstate")


class StateDirectoryLockedError(StreamAssignError):
    """Another live process holds the state directory."""


class StateDirectory:
    """The state directory of one process; ``close()`` releases its lock."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        (self.path / "tasks").mkdir(parents=True, exist_ok=True)
        self._lock: IO[bytes] | None = (self.path / ".lock").open("wb")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            self._lock.close()
            raise StateDirectoryLockedError(
                f"state directory {self.path} is in use by another process"
            ) from exc
        self.process_id = self._process_id()

    def _process_id(self) -> uuid.UUID:
        file = self.path / "process.id"
        try:
            return uuid.UUID(file.read_text().strip())
        except FileNotFoundError:
            pass
        except ValueError:
            log.warning("unreadable %s; starting as a new process", file)
        pid = uuid.uuid4()
        tmp = file.with_suffix(".tmp")
        tmp.write_text(str(pid))
        tmp.replace(file)
        return pid

    def task_dir(self, task: TaskId) -> Path:
        return self.path / "tasks" / str(task)

    def write_checkpoint(self, task: TaskId, offsets: Mapping[TopicPartition, int]) -> None:
        """Record the changelog offsets ``task``'s local state has reached (atomically)."""
        data: dict[str, dict[str, int]] = {}
        for tp, offset in offsets.items():
            data.setdefault(tp.topic, {})[str(tp.partition)] = offset
        directory = self.task_dir(task)
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / "checkpoint.tmp"
        tmp.write_text(json.dumps(data, sort_keys=True))
        tmp.replace(directory / "checkpoint")

    def read_checkpoint(self, task: TaskId) -> dict[TopicPartition, int]:
        """The checkpointed offsets of ``task`` (empty when none or unreadable)."""
        file = self.task_dir(task) / "checkpoint"
        try:
            data = json.loads(file.read_text())
            return {
                TopicPartition(topic, int(p)): int(offset)
                for topic, parts in data.items()
                for p, offset in parts.items()
            }
        except FileNotFoundError:
            return {}
        except (ValueError, TypeError, AttributeError) as exc:
            log.warning("ignoring unreadable checkpoint %s: %s", file, exc)
            return {}

    def delete_checkpoint(self, task: TaskId) -> None:
        """Forget ``task``'s checkpoint (its local state is gone, e.g. an in-memory store)."""
        (self.task_dir(task) / "checkpoint").unlink(missing_ok=True)

    def offset_sums(self) -> dict[TaskId, int]:
        """Sum of checkpointed changelog offsets of every task with local state."""
        sums: dict[TaskId, int] = {}
        for directory in sorted((self.path / "tasks").iterdir()):
            try:
                task = TaskId.parse(directory.name)
            except ValueError:
                continue
            offsets = self.read_checkpoint(task)
            if offsets:
                sums[task] = sum(offsets.values())
        return sums

    def write_assignment(self, actives: Mapping[int, frozenset[TaskId]]) -> None:
        """Remember each consumer's active tasks (atomically)."""
        data = {str(i): sorted(str(t) for t in tasks) for i, tasks in actives.items()}
        tmp = self.path / "assignment.json.tmp"
        tmp.write_text(json.dumps(data, sort_keys=True))
        tmp.replace(self.path / "assignment.json")

    def read_assignment(self) -> dict[int, frozenset[TaskId]]:
        """The active tasks each consumer ran before the process stopped (empty if unknown)."""
        file = self.path / "assignment.json"
        try:
            data = json.loads(file.read_text())
            return {int(i): frozenset(TaskId.parse(t) for t in ts) for i, ts in data.items()}
        except FileNotFoundError:
            return {}
        except (ValueError, TypeError, AttributeError) as exc:
            log.warning("ignoring unreadable %s: %s", file, exc)
            return {}

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None
