"""The public assignor: options, input checks, and one ``_Run`` per call."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Final, Literal

import attrs

from .._ids import TaskId, as_task
from ..assignment import ClientAssignment, ClientState
from ..errors import AssignmentInputError
from .run import _Run


def _non_negative(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise AssignmentInputError(f"{attribute.name} must be an int >= 0, got {value!r}")


_ID_TYPES = (TaskId, tuple)  # task ids the fast paths take as they are


def _task_collection(items: Iterable[TaskId]) -> Collection[TaskId]:
    """``items`` as is when it is a collection of TaskIds or tuples (judged by one element),
    else a list of ``as_task`` of each: other iterables, "s_p" text, lists of pairs."""
    if isinstance(items, (frozenset, set, list, tuple)) and (
        not items or type(next(iter(items))) in _ID_TYPES
    ):
        return items
    return list(map(as_task, items))


def tag_keys_option(value: Iterable[str] | None) -> tuple[str, ...] | None:
    """Converter of the ``rack_aware_tags`` option (shared with the HA assignor): a tuple, or
    None for every tag key clients report."""
    return None if value is None else tuple(value)


#: What ``StickyTaskAssignor`` balances: every subtopology and the total (default), or the
#: total only.
Balance = Literal["subtopology", "total"]
BALANCE_MODES: Final = ("subtopology", "total")


def balance_option(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    """Validator of the ``balance`` option (shared with the HA assignor)."""
    if value not in BALANCE_MODES:
        raise AssignmentInputError(
            f"{attribute.name} must be one of {', '.join(BALANCE_MODES)}, got {value!r}"
        )


@attrs.frozen
class StickyTaskAssignor:
    """Assigns active and standby tasks to clients; see the module docstring for the rules.

    ``num_standby_replicas`` is the number of standbys wanted for each stateful task (capped at
    ``clients - 1``, since one client never holds two copies of a task).
    """

    num_standby_replicas: int = attrs.field(default=0, validator=_non_negative)
    #: Lags up to this count as caught up: such holders rank equal (Kafka Streams' default).
    acceptable_recovery_lag: int = attrs.field(default=10_000, validator=_non_negative)
    #: Client tag keys a standby's placement avoids sharing values of with the task's other
    #: copies (KIP-708's ``rack.aware.assignment.tags``); ``None``: every key clients report.
    rack_aware_tags: tuple[str, ...] | None = attrs.field(default=None, converter=tag_keys_option)
    #: ``"subtopology"``: every client's actives of each subtopology, and its total, within
    #: floor and ceiling of its capacity share, with the fewest moves that allows.
    #: ``"total"``: only the total (fewer moves when a group's history is uneven per
    #: subtopology, e.g. each client ran a whole subtopology; docs/assignor.md).
    balance: Balance = attrs.field(default="subtopology", validator=balance_option)

    def assign(
        self,
        tasks: Iterable[TaskId],
        clients: Iterable[ClientState],
        stateful: Iterable[TaskId] | None = None,
        task_racks: Mapping[TaskId, str] | None = None,
    ) -> dict[str, ClientAssignment]:
        """Assignment per process id, for every client given.

        ``stateful=None`` treats every task as stateful. ``task_racks``, the rack of the
        leaders of each task's partitions, makes tasks that need a new client prefer one in
        that rack (cross-rack traffic, KIP-925) without changing how many any client gets.
        Tasks may also be given as ``"s_p"`` text or ``(subtopology, partition)`` pairs.
        Raises ``DuplicateProcessIdError`` or ``NoClientsError`` (both ``ValueError``s).
        """
        tasks = _task_collection(tasks)
        if stateful is not None:
            stateful = _task_collection(stateful)
        return _Run(
            tasks,
            clients,
            stateful,
            self.num_standby_replicas,
            self.acceptable_recovery_lag,
            rack_aware_tags=self.rack_aware_tags,
            task_racks=task_racks,
            by_subtopology=self.balance == "subtopology",
        ).result()
