"""Fair shares of a total over weighted bins: the integer arithmetic behind every balanced
assignment here, public for the layers that balance anything of their own (the consumer-group
assignors, the simulation pipeline) so they use the same rule as the task assignor.

- ``share_bounds(total, weights)``: floor and ceiling of each bin's exact share
  ``total * weight / sum(weights)``; an assignment is balanced when every bin lies within them.
- ``apportion(total, weights, priority=None)``: one quota per bin, each the floor or the ceiling
  of its share, summing to ``total``; ``priority`` says which bins get the ceilings.
"""

from ._balance import apportion, share_bounds

__all__ = ["apportion", "share_bounds"]
