"""A Faust transport that uses the app's assignor also when the app has no tables.

Faust's aiokafka driver hands the consumer ``app.assignor`` only when the app has changelog
tables or ``table_standby_replicas > 0``; otherwise it silently uses aiokafka's round robin. With
``broker="streamassign://host:9092"`` (this transport, registered under the ``faust.transports``
entry point) the worker's consumer always uses ``app.assignor``. With
``STREAMASSIGN_FAUST_SWITCH=1`` in the worker's environment (a rolling switch) it offers second
what Faust would use (``PartitionAssignor.fallback_assignors``), so workers can be switched to
or from Faust's assignor one at a time. Only then: aiokafka up to 0.14 sends one JoinGroup per
offered protocol at every join (the first with ours alone, then with both; aio-libs/aiokafka
pull request 1168), the broker takes the second for changed metadata and starts another
rebalance, and a group of such workers can rebalance without end (docs/faust.md).

Its consumer also closes a window in which Faust 0.15 drops records around every rebalance
(docs/faust.md, "Exactness"): after recovery Faust resumes fetching the stream (source)
partitions, seeks them to their committed offsets, and only then resumes flow control, which
empties every agent's queue. Records fetched in between (the one at the committed offset first)
are thrown away unprocessed, and Faust's commit check lets the next commit pass a gap of one
offset, so that record is lost. This consumer keeps a stream partition paused when Faust
resumes it, until the next ``resume_flow()`` (which Faust calls right after resuming flow
control), so nothing is fetched for it before the queues are emptied. Everything else is Faust's
aiokafka transport unchanged.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

__all__ = ["SWITCH_ENV", "Transport"]

log = logging.getLogger("streamassign.faust")

#: Set to 1 in a worker's environment to offer Faust's protocol after ours (a rolling switch).
SWITCH_ENV = "STREAMASSIGN_FAUST_SWITCH"


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, *args: Any, **kwargs: Any) -> Any:
        # (transport) in faust-streaming 0.15, (transport, loop) in older releases.
        consumer = super()._create_worker_consumer(*args, **kwargs)
        assignor = self.app.assignor
        if self._assignor is not assignor:  # Faust picked round robin: the app has no tables
            log.info("stateless app: using %s instead of round robin", type(assignor).__name__)
            self._assignor = assignor
        # Ours, then what Faust would use while switching (see fallback_assignors). aiokafka
        # reads the strategy list when the consumer starts, which is after this.
        fallbacks: tuple[Any, ...] = ()
        if os.environ.get(SWITCH_ENV, "").strip() == "1":
            fallbacks = getattr(assignor, "fallback_assignors", lambda: ())()
            log.info("%s=1: offering %s after ours", SWITCH_ENV, [f.name for f in fallbacks])
        consumer._partition_assignment_strategy = (assignor, *fallbacks)
        return consumer


class _Consumer(faust_aiokafka.Consumer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Stream partitions Faust resumed, held paused until the next ``resume_flow()``.
        self._held_streams: set[TP] = set()

    def _new_consumer_thread(self) -> _ConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    def resume_partitions(self, tps: Iterable[TP]) -> None:
        """Changelog partitions at once; stream partitions at the next ``resume_flow()``.

        Faust resumes the stream partitions before it seeks them and resumes flow control
        (which empties the agents' queues): what the fetcher delivered in between would be
        dropped unprocessed and then committed past (see the module docstring)."""
        tps = set(tps)
        changelogs = self.app.tables.changelog_topics
        streams = {tp for tp in tps if tp.topic not in changelogs}
        self._held_streams |= streams
        super().resume_partitions(tps - streams)

    def pause_partitions(self, tps: Iterable[TP]) -> None:
        tps = set(tps)
        self._held_streams -= tps
        super().pause_partitions(tps)

    def resume_flow(self) -> None:
        super().resume_flow()
        held, self._held_streams = self._held_streams, set()
        if held:
            super().resume_partitions(held)


class Transport(faust_aiokafka.Transport):
    """Faust's aiokafka transport whose consumer always uses ``app.assignor``."""

    Consumer = _Consumer
