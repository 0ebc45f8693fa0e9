"""aiokafka integration (needs the ``aiokafka`` extra).

- ``GroupAssignor``: the consumer-group assignors of ``streamassign.consumer`` for aiokafka.
- ``ProcessHost`` / ``StreamsAssignor``: Kafka Streams-style tasks over N consumers per process.
"""

from . import _extra  # noqa: F401 - before the rest: names the extra when it is missing
from .consumer import ASSIGNORS, GroupAssignor, LeaderRound, validate
from .streams import PROTOCOL_NAME, ProcessHost, StreamsAssignor, TaskListener

__all__ = [
    "ASSIGNORS",
    "PROTOCOL_NAME",
    "GroupAssignor",
    "LeaderRound",
    "ProcessHost",
    "StreamsAssignor",
    "TaskListener",
    "validate",
]
