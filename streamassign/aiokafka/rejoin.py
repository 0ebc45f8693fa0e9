"""The one place that touches aiokafka internals: asking the group coordinator to rejoin, and
reading the member id and generation it holds.

aiokafka (0.11-0.14) has no public way for a member to start a rebalance. Its
``GroupCoordinator.request_rejoin()`` does it, reached through ``consumer._coordinator`` — both
unchanged across the supported range. It must be called after SyncGroup (from
``on_assignment`` or later): a call made during the join is discarded when aiokafka resets its
rejoin future. A follower must also change its subscription user data, or the broker hands it
the current generation back without a rebalance; the assignors' ``join_epoch`` does that.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from typing import Any

log = logging.getLogger("streamassign.aiokafka")


def request_rejoin(consumer: Any) -> bool:
    """Ask ``consumer``'s group coordinator for a new rebalance; False when it cannot."""
    coordinator = getattr(consumer, "_coordinator", None)
    request = getattr(coordinator, "request_rejoin", None)
    if request is None:
        return False
    request()
    return True


def membership(consumer: Any) -> tuple[str, int] | None:
    """``consumer``'s member id and generation as its group coordinator holds them (aiokafka
    resets them to ``("", -1)`` when the broker answers UnknownMemberId or IllegalGeneration);
    None when they cannot be read."""
    coordinator = getattr(consumer, "_coordinator", None)
    member_id = getattr(coordinator, "member_id", None)
    generation = getattr(coordinator, "generation", None)
    if not isinstance(member_id, str) or not isinstance(generation, int):
        return None
    return member_id, generation


class Rejoiner:
    """When a member asks its consumer for a rebalance: now, after a delay, at a time, or
    after an error with growing backoff (1, 2, 4, ... 30 s) so a failing group never
    crash-loops. Holds the consumer weakly; does nothing until bound."""

    def __init__(self, backoff: tuple[float, float] = (1.0, 30.0)) -> None:
        self._consumer: weakref.ref[Any] | None = None
        self._backoff = backoff
        self.failures = 0
        #: Delayed rejoins not run yet (``cancel`` drops them).
        self._pending: set[asyncio.TimerHandle] = set()

    def bind(self, consumer: Any) -> None:
        self._consumer = weakref.ref(consumer)

    def after(self, delay: float) -> bool:
        """Rejoin after ``delay`` seconds (0: right away); False when unbound."""
        consumer = self._consumer() if self._consumer is not None else None
        if consumer is None:
            log.warning("assignor not bound to its consumer (bind()); cannot ask for a rebalance")
            return False
        if delay <= 0:
            return request_rejoin(consumer)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no running loop: nothing to schedule on
            log.warning("no running event loop; cannot schedule a rebalance in %.1f s", delay)
            return False

        def run() -> None:
            self._pending.discard(handle)
            request_rejoin(consumer)

        handle = loop.call_later(delay, run)
        self._pending.add(handle)
        return True

    def cancel(self) -> None:
        """Drop every delayed rejoin not run yet (shutdown)."""
        for handle in self._pending:
            handle.cancel()
        self._pending.clear()

    def at(self, epoch_ms: int) -> bool:
        """Rejoin at a wall-clock time (ms since the epoch)."""
        return self.after(max(0.0, epoch_ms / 1000 - time.time()))

    def failed(self) -> float:
        """Count a failed rebalance and schedule the retry; returns the delay."""
        self.failures += 1
        delay: float = min(self._backoff[0] * 2.0 ** (self.failures - 1), self._backoff[1])
        self.after(delay)
        return delay

    def succeeded(self) -> None:
        """A good rebalance: the backoff starts over, and a retry an earlier failure scheduled
        is moot (it would only cost an eager revoke/assign cycle)."""
        self.failures = 0
        self.cancel()
