"""aiokafka integration (needs the ``aiokafka`` extra): consumer-group assignor adapters."""

from .consumer import ASSIGNORS, GroupAssignor, LeaderRound, validate

__all__ = ["ASSIGNORS", "GroupAssignor", "LeaderRound", "validate"]
