"""Identifiers shared by every layer: tasks and topic partitions.

Both are ``NamedTuple``s on purpose: the assignors hash and sort hundreds of thousands of them
inside a rebalance, and tuples do both in C (an ``attrs`` class with ``order=True`` sorted 60x
slower in our measurement). They are immutable and ordered like a frozen attrs class.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import index
from typing import NamedTuple

from .errors import InvalidTaskIdError, TaskIdTypeError


class TaskId(NamedTuple):
    """A unit of work: partition ``partition`` of every source topic of ``subtopology``.

    Written ``"s_p"`` (``str(TaskId(0, 3)) == "0_3"``); ``TaskId.parse`` reads it back.
    """

    subtopology: int
    partition: int

    def __str__(self) -> str:
        return f"{self.subtopology}_{self.partition}"

    def __repr__(self) -> str:
        return f"TaskId({self.subtopology}, {self.partition})"

    @classmethod
    def parse(cls, text: str) -> TaskId:
        """Read ``"s_p"``; ``InvalidTaskIdError`` (a ``ValueError``) naming the text when it is
        not that form."""
        head, sep, tail = text.strip().partition("_")
        if not sep or not head.isdigit() or not tail.isdigit():
            raise InvalidTaskIdError(f"not a task id (expected 's_p', e.g. '0_3'): {text!r}")
        return cls(int(head), int(tail))


def as_task(value: TaskId | Sequence[int] | str) -> TaskId:
    """``value`` as a ``TaskId``: a ``TaskId`` as is, ``"s_p"`` text, or any pair of integers
    (a tuple, a list, a numpy row); ``TaskIdTypeError`` (a ``TypeError``) naming anything else
    (``InvalidTaskIdError``, a ``ValueError``, for malformed text)."""
    if type(value) is TaskId:
        return value
    if isinstance(value, str):
        return TaskId.parse(value)
    try:
        subtopology, partition = value
        return TaskId(index(subtopology), index(partition))
    except (TypeError, ValueError):
        raise TaskIdTypeError(
            f"not a task id: {value!r} (expected TaskId, (subtopology, partition) or 's_p')"
        ) from None


class TopicPartition(NamedTuple):
    """A topic partition; equal to (and interchangeable with) aiokafka's ``TopicPartition``."""

    topic: str
    partition: int
