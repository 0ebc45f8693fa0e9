"""What a Faust worker's consumer needs that neither aiokafka nor Faust does: re-fetching
metadata of subscribed topics it has none of (``MetadataWatch``, shared with ``ProcessHost`` and
defined in ``streamassign.aiokafka.rejoin``), and taking the fatal join errors aiokafka keeps for
its user (``JoinErrors``). (A retry's news from its repeats, so that a worker waiting for
topics logs each distinct wait once: ``streamassign.repeats.Repeats``, shared with
``ProcessHost``'s leader.)

aiokafka fetches metadata of its subscribed topics when the subscription changes and then only
every ``metadata_max_age_ms`` (Faust: 5 minutes): a topic that did not exist yet at the
subscription (Faust creates changelog, repartition and leader topics while the workers join)
stays unknown that long, and a rejoin does not refresh it either (the topics did not change).
So a worker that misses topics asks its client for fresh metadata with growing pauses until it
has them all. On the group leader that is all a repair needs: aiokafka's leader rejoins by
itself when a refresh changes the partition count of a subscribed topic (0 -> n).

The client and coordinator are reached through ``consumer._client`` and
``consumer._coordinator`` (aiokafka 0.11-0.14, like ``streamassign.aiokafka.rejoin``), and only
with ``getattr`` guards.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..aiokafka.rejoin import MetadataWatch, unsized

__all__ = ["JoinErrors", "MetadataWatch", "unsized"]

log = logging.getLogger("streamassign.faust")


class JoinErrors:
    """Takes a fatal error aiokafka keeps for its user while the worker joins, logs it, and so
    lets it try again.

    aiokafka hands such an error to whoever polls the consumer, and its coordinator waits until
    someone takes it: ``InconsistentGroupProtocolError`` (the group's members use another
    assignor) at a join, and a group authorization failure already at the coordinator lookup,
    before any join. Faust's fetcher reads records without polling, so nobody did: the worker
    sat idle and alive, outside its group, for good.
    ``joining`` (at the subscription and at each join attempt) schedules a look after a pause;
    ``joined`` (an assignment arrived) ends the looks. An error taken is logged and aiokafka
    tries again at once; the looks go on, the pause doubling from ``first`` to ``longest``
    seconds while the attempts fail.
    """

    def __init__(self, first: float = 1.0, longest: float = 30.0) -> None:
        self._first, self._longest = first, longest
        self._pause = first
        self._timer: asyncio.TimerHandle | None = None

    def joining(self, consumer: Any) -> None:
        self.cancel()
        coordinator = getattr(consumer, "_coordinator", None)
        if getattr(coordinator, "check_errors", None) is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (unit tests call the assignor directly)
            return
        self._timer = loop.call_later(self._pause, self._check, coordinator)

    def joined(self) -> None:
        self.cancel()
        self._pause = self._first

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self, coordinator: Any) -> None:
        self._timer = None
        try:
            coordinator.check_errors()
        except Exception as exc:  # anything aiokafka kept for its user is reported here
            self._pause = min(self._pause * 2, self._longest)
            log.error(
                "%s; trying again", _join_error_line(exc, getattr(coordinator, "group_id", None))
            )
        # Look again later: a join attempt resets the look (joining()), but a failed coordinator
        # lookup makes none, and an assignment ends the looks (joined()).
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._pause, self._check, coordinator)


def _join_error_line(exc: Exception, group: object) -> str:
    """What a user reads for a fatal join error: the error, and what to do about it."""
    kind = type(exc).__name__
    if kind == "GroupAuthorizationFailedError":
        return (
            f"not authorized to the group {group!r} ({kind}): grant the app's principal READ "
            "on the group"
        )
    hint = ""
    if kind == "InconsistentGroupProtocolError":
        hint = (
            " (its members use another assignor: start every worker with "
            "broker='streamassign://...' and STREAMASSIGN_FAUST_SWITCH=1 to switch one at a "
            "time)"
        )
    return f"cannot join the group: {exc!r}{hint}"
