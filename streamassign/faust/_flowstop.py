"""Whether a rebalance that stopped Faust's flow is stuck: the logic of the ``streamassign://``
consumer's stopped-flow watch (``streamassign.faust.transport``), apart from Faust and the
event loop, so that it can be tested on a fake clock.

While Faust's flow is stopped a worker processes nothing and logs nothing of its own: a
rebalance whose join never completes, a Faust callback or table recovery set-up that never
returns, or a group that rebalances without end leaves a frozen worker and a quiet log. The
recovery watch (which follows a recovery reading its changelogs, with the flow resumed) and
the hold watch (stream partitions never released) do not see it."""

from __future__ import annotations

import time
from collections.abc import Hashable

import attrs

__all__ = ["ASSIGNING", "JOINING", "RECOVERING", "REVOKING", "FlowStop", "Step"]


@attrs.frozen
class Step:
    """A step of a rebalance during which Faust's flow is stopped."""

    #: What the worker waits for during this step.
    waits_for: str
    #: Where an operator finds why this step does not end.
    look_at: str


REVOKING = Step(
    "Faust's on_partitions_revoked to return (agents finishing the events they hold, the "
    "producer's flush)",
    "this worker's agents (one blocked in its current event holds the rebalance) and Faust's "
    "flight recorder warning for the revoke in this worker's log",
)
JOINING = Step(
    "the group's new assignment (JoinGroup/SyncGroup)",
    "the group's other members (one slow to rejoin holds the join up to its rebalance timeout; "
    "workers that rebalance without end: docs/faust.md), the group's state "
    "(kafka-consumer-groups.sh --describe --state) and this worker's aiokafka log",
)
ASSIGNING = Step(
    "Faust's on_partitions_assigned (agents, topics, tables) to return",
    "Faust's flight recorder warning for the assignment in this worker's log (and Faust's "
    "lines that a table's RocksDB partition is locked: another process holds its files)",
)
RECOVERING = Step(
    "Faust's table recovery to resume the flow (producer flush, changelog highwaters and "
    "offsets, seeks)",
    "Faust's recovery log lines and this worker's connection to the brokers (each of those "
    "requests may take up to broker_request_timeout)",
)


@attrs.define
class FlowStop:
    """One episode of Faust's flow stopped for a rebalance, from Faust's revoke (which stops
    the flow, or finds nothing assigned to stop) to the ``resume_flow()`` of its last
    rebalance's recovery: its steps, how long the current one may make no progress, how long
    the flow may stay stopped through rebalance after rebalance, and whether it was reported
    (once per episode). Times are the event
    loop's (``now``); ``since_wall`` dates the line."""

    #: When the episode began (Faust's revoke).
    since: float
    #: The same moment on the wall clock (``time.time()``), for the line.
    since_wall: float
    #: How long the flow may stay stopped through more than one rebalance, however their steps
    #: move: a group rebalancing without end gets a new generation every few seconds but never
    #: resumes the flow. One rebalance is bounded by its steps' bounds alone.
    episode_bound: float
    #: What the worker waits for now, since when, and how long that may make no progress.
    step: Step = REVOKING
    step_since: float = 0.0
    step_bound: float = 0.0
    #: What the last look saw of the rebalance (rebalance count, generation, recovery state):
    #: a change is progress and restarts the step's clock.
    progress: Hashable = None
    #: Rebalances seen during the episode (the one that stopped the flow included).
    rebalances: int = 1
    #: Whether this episode was reported.
    told: bool = False

    def enter(self, step: Step, now: float, bound: float, *, new_rebalance: bool = False) -> None:
        """The rebalance moved on to ``step``, which may make no progress for ``bound`` s."""
        self.step, self.step_since, self.step_bound = step, now, bound
        if new_rebalance:
            self.rebalances += 1

    def look(self, now: float, progress: Hashable) -> str | None:
        """The WARNING line if the episode is stuck and was not reported yet, else None."""
        if progress != self.progress:
            self.progress, self.step_since = progress, now
        waited, stopped = now - self.step_since, now - self.since
        endless = self.rebalances > 1 and stopped >= self.episode_bound
        if self.told or (waited < self.step_bound and not endless):
            return None
        self.told = True
        at = time.strftime("%H:%M:%S", time.localtime(self.since_wall))
        head = f"worker stuck in a rebalance since {at} ({stopped:.1f} s, processing nothing)"
        if waited >= self.step_bound:
            return (
                f"{head}: it has waited {waited:.1f} s for {self.step.waits_for}; look at "
                f"{self.step.look_at}; restart this worker if it does not move"
            )
        return (
            f"{head}: {self.rebalances} rebalances and the flow never resumed (now waiting for "
            f"{self.step.waits_for}); the group may be rebalancing without end: look at "
            f"{JOINING.look_at}"
        )
