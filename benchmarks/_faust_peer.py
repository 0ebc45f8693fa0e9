"""Faust's task assignor, driven exactly as Faust's own ``PartitionAssignor`` drives it.

``faust.assignor.PartitionAssignor._perform_assignment`` runs one ``CopartitionedAssignor`` per
co-partitioned group of topics. Each worker's history is the assignment it last received
(actives and standbys, echoed in its subscription metadata), which becomes a
``CopartitionedAssignment`` through ``ClientAssignment.copartitioned_assignment``; a restarted
worker reports an empty one. Here the group is one topic whose partitions are our tasks in sorted
order: Faust has no subtopologies and no threads (every worker weighs the same), and it places
standbys for every partition of the group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

try:
    from faust.assignor.client_assignment import ClientAssignment as FaustClientAssignment
    from faust.assignor.client_assignment import CopartitionedAssignment
    from faust.assignor.copartitioned_assignor import CopartitionedAssignor
except ImportError as exc:  # pragma: no cover - a setup problem, said plainly
    raise SystemExit(f"{exc}: install the peers first: pip install -e '.[bench]'") from exc

from streamassign import ClientAssignment, ClientState, TaskId

TOPIC = "source"

FaustInput = dict[str, CopartitionedAssignment]


def faust_input(tasks: Sequence[TaskId], clients: Sequence[ClientState]) -> FaustInput:
    """Each worker's previous group assignment, as Faust decodes it from its metadata.

    ``tasks`` must be sorted: task ``tasks[p]`` is partition ``p`` of the group.
    """
    partition = {t: p for p, t in enumerate(tasks)}

    def partitions(held: frozenset[TaskId]) -> list[int]:
        return sorted(partition[t] for t in held if t in partition)

    return {
        c.process_id: FaustClientAssignment(
            actives={TOPIC: partitions(c.prev_active)},
            standbys={TOPIC: partitions(c.prev_standby)},
        ).copartitioned_assignment({TOPIC})
        for c in clients
    }


def faust_assign(
    inputs: FaustInput, num_partitions: int, replicas: int
) -> Mapping[str, CopartitionedAssignment]:
    """One run of Faust's assignor over the group (mutates and returns ``inputs``)."""
    return CopartitionedAssignor(
        topics={TOPIC}, cluster_asgn=inputs, num_partitions=num_partitions, replicas=replicas
    ).get_assignment()


def to_ours(
    tasks: Sequence[TaskId], result: Mapping[str, CopartitionedAssignment]
) -> dict[str, ClientAssignment]:
    """Faust's result as our ``ClientAssignment``s, for ``streamassign.metrics``."""
    return {
        pid: ClientAssignment(
            active=frozenset(tasks[p] for p in got.actives),
            standby=frozenset(tasks[p] for p in got.standbys),
        )
        for pid, got in result.items()
    }
