"""A Faust transport that uses the app's assignor also when the app has no tables.

Faust's aiokafka driver hands the consumer ``app.assignor`` only when the app has changelog
tables or ``table_standby_replicas > 0``; otherwise it silently uses aiokafka's round robin. With
``broker="streamassign://host:9092"`` (this transport, registered under the ``faust.transports``
entry point) the worker's consumer always uses ``app.assignor`` first, and offers second what
Faust would use (``PartitionAssignor.fallback_assignors``), so workers can be switched to or
from Faust's assignor one at a time. Everything else is Faust's aiokafka transport unchanged.
"""

from __future__ import annotations

import logging
from typing import Any

from faust.transport.drivers import aiokafka as faust_aiokafka

__all__ = ["Transport"]

log = logging.getLogger("streamassign.faust")


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, *args: Any, **kwargs: Any) -> Any:
        # (transport) in faust-streaming 0.15, (transport, loop) in older releases.
        consumer = super()._create_worker_consumer(*args, **kwargs)
        assignor = self.app.assignor
        if self._assignor is not assignor:  # Faust picked round robin: the app has no tables
            log.info("stateless app: using %s instead of round robin", type(assignor).__name__)
            self._assignor = assignor
        # Ours first, then what Faust would use (a rolling switch, see fallback_assignors).
        # aiokafka reads the strategy list when the consumer starts, which is after this.
        fallbacks = getattr(assignor, "fallback_assignors", lambda: ())()
        consumer._partition_assignment_strategy = (assignor, *fallbacks)
        return consumer


class _Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> _ConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class Transport(faust_aiokafka.Transport):
    """Faust's aiokafka transport whose consumer always uses ``app.assignor``."""

    Consumer = _Consumer
