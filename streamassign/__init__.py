"""streamassign: Kafka Streams-grade task and partition assignment for Python stream processors.

The top level exports the pure assignment core (no aiokafka, Faust or Spark imports):
topology model, partition grouper, sticky task assignor and the value types they share.
"""

from ._ids import TaskId, TopicPartition
from .assignment import ClientAssignment, ClientState
from .errors import CopartitioningError, MissingTopicsError, StreamAssignError, TopologyError
from .sticky import StickyTaskAssignor

__all__ = [
    "ClientAssignment",
    "ClientState",
    "CopartitioningError",
    "MissingTopicsError",
    "StickyTaskAssignor",
    "StreamAssignError",
    "TaskId",
    "TopicPartition",
    "TopologyError",
]
