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
resumes it during a rebalance (``app.rebalancing``), until the next ``resume_flow()`` (which
Faust calls right after resuming flow control), so nothing is fetched for it before the queues
are emptied; outside a rebalance a resume takes effect at once. Everything else is Faust's
aiokafka transport unchanged.
"""

from __future__ import annotations

import asyncio
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
        #: Warns when partitions stay held (Faust's recovery never resumed the flow).
        self._hold_watch: asyncio.TimerHandle | None = None

    def _new_consumer_thread(self) -> _ConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    def resume_partitions(self, tps: Iterable[TP]) -> None:
        """During a rebalance: changelog partitions at once, stream partitions at the next
        ``resume_flow()``; otherwise (the app pausing and resuming a partition itself) at once.

        Faust's recovery resumes the stream partitions before it seeks them and resumes flow
        control (which empties the agents' queues): what the fetcher delivered in between would
        be dropped unprocessed and then committed past (see the module docstring). Faust calls
        ``resume_flow()`` before ``app.on_rebalance_end()``, so the hold always ends first."""
        tps = set(tps)
        streams: set[TP] = set()
        if self.app.rebalancing:
            changelogs = self.app.tables.changelog_topics
            streams = {tp for tp in tps if tp.topic not in changelogs}
            self._hold(streams)
        super().resume_partitions(tps - streams)

    def pause_partitions(self, tps: Iterable[TP]) -> None:
        tps = set(tps)
        self._held_streams -= tps
        if not self._held_streams:
            self._stop_hold_watch()
        super().pause_partitions(tps)

    def resume_flow(self) -> None:
        super().resume_flow()
        held, self._held_streams = self._held_streams, set()
        self._stop_hold_watch()
        if held:  # only what is still assigned: a rebalance may have taken some away
            held &= set(self.assignment())
        if held:
            super().resume_partitions(held)

    def _hold(self, streams: set[TP]) -> None:
        if not streams:
            return
        self._held_streams |= streams
        if self._hold_watch is None:
            self._watch_hold(0.0)

    def _watch_hold(self, held_for: float) -> None:
        """Check once per ``broker_request_timeout`` (Faust's bound on its post-recovery seek)
        that the held partitions were released: if Faust's recovery stops between its resume and
        its ``resume_flow()`` (a seek that times out ends its recovery task), they would stay
        paused without a word."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on an event loop (no running app): nothing to watch
            return
        timeout = float(self.app.conf.broker_request_timeout)
        self._hold_watch = loop.call_later(timeout, self._on_hold_watch, held_for + timeout)

    def _on_hold_watch(self, held_for: float) -> None:
        self._hold_watch = None
        if not self._held_streams:
            return
        log.warning(
            "stream partitions %s still paused %.0f s after Faust's recovery resumed them: "
            "it has not resumed the flow (its recovery may have stopped, e.g. after a seek "
            "that timed out: see Faust's log above); restart this worker",
            sorted(self._held_streams)[:10],
            held_for,
        )
        self._watch_hold(held_for)

    def _stop_hold_watch(self) -> None:
        if self._hold_watch is not None:
            self._hold_watch.cancel()
            self._hold_watch = None


class Transport(faust_aiokafka.Transport):
    """Faust's aiokafka transport whose consumer always uses ``app.assignor``."""

    Consumer = _Consumer
