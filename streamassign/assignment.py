"""Value types of a task assignment: what a client reports and what it receives.

Kept apart from the algorithms (like Kafka Streams' ``ClientState`` / ``TaskAssignor``) so that the
protocol layer can build them from wire metadata and the assignors stay plain functions of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from ._ids import TaskId, as_task
from .errors import AssignmentInputError, AssignmentTypeError


def _task_set(value: Iterable[TaskId | str]) -> frozenset[TaskId]:
    # Fast path: a frozenset of TaskIds (what the protocol and the pipeline build) is kept as
    # is; checking types costs a fifth of rebuilding every id.
    if type(value) is frozenset and all(type(t) is TaskId for t in value):
        return value
    return frozenset(map(as_task, value))


def _lag_map(value: Mapping[Any, int]) -> Mapping[TaskId, int]:
    if type(value) is dict and all(
        type(t) is TaskId and type(lag) is int and lag >= 0 for t, lag in value.items()
    ):
        return dict(value)  # already in converted form: a copy, so nothing aliases it
    out: dict[TaskId, int] = {}
    for task, lag in value.items():
        tid = as_task(task)
        if not isinstance(lag, int) or isinstance(lag, bool) or lag < 0:
            raise AssignmentInputError(f"lag of task {tid} must be an int >= 0, got {lag!r}")
        out[tid] = lag
    return out


def _tag_map(value: Mapping[str, str]) -> dict[str, str]:
    return dict(value)


def _text_id(instance: Any, attribute: Any, value: str) -> None:
    if not isinstance(value, str):
        raise AssignmentTypeError(
            f"process_id must be a str (the member's process id), got {value!r}"
        )


def _positive_capacity(instance: Any, attribute: Any, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise AssignmentInputError(
            f"client {instance.process_id!r}: capacity must be an int >= 1 (its thread count), "
            f"got {value!r}"
        )


@attrs.frozen
class ClientState:
    """One process ("client") as the leader sees it at a rebalance.

    ``capacity`` is its number of consumer threads. ``prev_active`` / ``prev_standby`` are the
    tasks it ran / kept replicas of before; ``lags`` holds, for tasks whose state it has on disk,
    how far behind the changelog end that state is (0 = caught up). ``rack`` and ``tags`` describe
    where it runs, for rack- and tag-aware standby placement.
    """

    process_id: str = attrs.field(validator=_text_id)
    capacity: int = attrs.field(default=1, validator=_positive_capacity)
    prev_active: frozenset[TaskId] = attrs.field(default=frozenset(), converter=_task_set)
    prev_standby: frozenset[TaskId] = attrs.field(default=frozenset(), converter=_task_set)
    lags: Mapping[TaskId, int] = attrs.field(factory=dict, converter=_lag_map)
    rack: str | None = None
    tags: Mapping[str, str] = attrs.field(factory=dict, converter=_tag_map)

    def has_state(self, task: TaskId) -> bool:
        """Whether this client holds local state of ``task`` (ran it, replicated it, or lags)."""
        return task in self.prev_active or task in self.prev_standby or task in self.lags


@attrs.frozen
class ClientAssignment:
    """What one client receives: tasks to run, replicas to keep, and warmups to catch up."""

    active: frozenset[TaskId] = frozenset()
    standby: frozenset[TaskId] = frozenset()
    warmup: frozenset[TaskId] = frozenset()

    @property
    def load(self) -> int:
        """Active plus standby plus warmup tasks: what the client must keep up with."""
        return len(self.active) + len(self.standby) + len(self.warmup)
