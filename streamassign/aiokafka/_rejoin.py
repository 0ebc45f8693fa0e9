"""The one place that touches aiokafka internals: asking the group coordinator to rejoin.

aiokafka (0.11-0.14) has no public way for a member to start a rebalance. Its
``GroupCoordinator.request_rejoin()`` does it, reached through ``consumer._coordinator`` — both
unchanged across the supported range. It must be called after SyncGroup (from
``on_assignment`` or later): a call made during the join is discarded when aiokafka resets its
rejoin future. A follower must also change its subscription user data, or the broker hands it
the current generation back without a rebalance; the assignors' ``join_epoch`` does that.
"""

from __future__ import annotations

from typing import Any


def request_rejoin(consumer: Any) -> bool:
    """Ask ``consumer``'s group coordinator for a new rebalance; False when it cannot."""
    coordinator = getattr(consumer, "_coordinator", None)
    request = getattr(coordinator, "request_rejoin", None)
    if request is None:
        return False
    request()
    return True
