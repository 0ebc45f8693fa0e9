"""Kafka Streams-style assignment for faust-streaming apps, by changing one setting:

    app = faust.App("orders", PartitionAssignor="streamassign.faust:PartitionAssignor")

Needs the ``faust`` extra (``pip install 'streamassign[faust]'``). ``docs/faust.md`` says what
it changes and how to configure capacities and co-partition groups.
"""

from . import _extra  # noqa: F401 - before the rest: names the extra when it is missing
from .assignor import CAPACITY_ENV, PROTOCOL_NAME, PartitionAssignor
from .leader import assign_faust, faust_topology
from .topology import faust_style_topology

__all__ = [
    "CAPACITY_ENV",
    "PROTOCOL_NAME",
    "PartitionAssignor",
    "assign_faust",
    "faust_style_topology",
    "faust_topology",
]
