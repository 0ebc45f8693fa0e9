"""streamassign: Kafka Streams-grade task and partition assignment for Python stream processors.

The top level exports the pure assignment core (no aiokafka, Faust or Spark imports):
topology model, partition grouper, sticky and high-availability task assignors and the value
types they share.
"""

from ._ids import TaskId, TopicPartition
from .assignment import ClientAssignment, ClientState
from .errors import (
    CopartitioningError,
    InvalidPartitionCountsError,
    MissingTopicsError,
    RepartitionResolutionError,
    StreamAssignError,
    TopologyError,
)
from .grouper import PartitionGrouper
from .ha import HighAvailabilityPlan, HighAvailabilityTaskAssignor
from .sticky import StickyTaskAssignor
from .topology import Subtopology, Topology

__all__ = [
    "ClientAssignment",
    "ClientState",
    "CopartitioningError",
    "HighAvailabilityPlan",
    "HighAvailabilityTaskAssignor",
    "InvalidPartitionCountsError",
    "MissingTopicsError",
    "PartitionGrouper",
    "RepartitionResolutionError",
    "StickyTaskAssignor",
    "StreamAssignError",
    "Subtopology",
    "TaskId",
    "TopicPartition",
    "Topology",
    "TopologyError",
]
