"""Consumer-group partition assignors: pure functions of (partitions per topic, subscriptions).

Kafka's built-ins (range, round robin, sticky, cooperative sticky) and the custom assignors of
the literature (failover, weighted, shuffled) in one framework: every assignor takes
``partitions_per_topic`` and ``{member_id: Subscription}`` and returns
``{member_id: [TopicPartition]}`` with every member present. Adapters for aiokafka live
in ``streamassign.aiokafka``.
"""

from ._common import Assignment, ConsumerAssignor, Subscription
from .simple import FailoverAssignor, RangeAssignor, RoundRobinAssignor, ShuffledAssignor
from .sticky import CooperativeStickyAssignor, RebalancePlan, StickyAssignor, WeightedAssignor
from .userdata import MemberData, UserDataError, read_member_data

__all__ = [
    "Assignment",
    "ConsumerAssignor",
    "CooperativeStickyAssignor",
    "FailoverAssignor",
    "MemberData",
    "RangeAssignor",
    "RebalancePlan",
    "RoundRobinAssignor",
    "ShuffledAssignor",
    "StickyAssignor",
    "Subscription",
    "UserDataError",
    "WeightedAssignor",
    "read_member_data",
]
