"""Hypothesis strategies for task-assignment inputs: tasks, clients and realistic histories."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import attrs
from hypothesis import strategies as st

from streamassign import ClientState, StickyTaskAssignor, TaskId
from streamassign.errors import ErrorCode
from streamassign.protocol import LATEST_OFFSET, AssignmentInfo, SubscriptionInfo


@st.composite
def task_sets(
    draw: st.DrawFn, max_subtopologies: int = 4, max_partitions: int = 12
) -> list[TaskId]:
    """Tasks of 1..n subtopologies, each with its own partition count."""
    counts = draw(st.lists(st.integers(1, max_partitions), min_size=1, max_size=max_subtopologies))
    return [TaskId(s, p) for s, n in enumerate(counts) for p in range(n)]


@st.composite
def fresh_clients(
    draw: st.DrawFn, max_clients: int = 8, max_capacity: int = 4
) -> list[ClientState]:
    """Clients with unique process ids, random capacities, no history."""
    pids = draw(
        st.lists(
            st.text("abcdefgh", min_size=1, max_size=3),
            min_size=1,
            max_size=max_clients,
            unique=True,
        )
    )
    return [ClientState(pid, capacity=draw(st.integers(1, max_capacity))) for pid in pids]


#: Racks and zone tag values ``placements`` draws from: few, so clients share them.
RACKS = ("r0", "r1", "r2")
ZONES = ("z0", "z1")


@st.composite
def placements(draw: st.DrawFn, clients: Sequence[ClientState]) -> list[ClientState]:
    """``clients`` with a rack (or none) and a ``zone`` tag (or none) each, history kept."""
    racks = st.one_of(st.none(), st.sampled_from(RACKS))
    zones = st.dictionaries(st.just("zone"), st.sampled_from(ZONES), max_size=1)
    return [attrs.evolve(c, rack=draw(racks), tags=draw(zones)) for c in clients]


@st.composite
def assignment_inputs(
    draw: st.DrawFn, placed: bool = False
) -> tuple[list[TaskId], list[ClientState], int, list[TaskId] | None]:
    """(tasks, clients with history, standbys, stateful) over the kinds of history we meet.

    History is one of: none; the assignor's own previous result on another membership (the
    realistic case: scale out/in, crash); or arbitrary claims (duplicates, stale tasks, random
    standbys and lags) as a zombie or a buggy peer would report. ``placed=True`` also gives
    the clients racks and zone tags (``placements``); by default they have none.
    """
    tasks = draw(task_sets())
    replicas = draw(st.integers(0, 3))
    stateful = draw(st.one_of(st.none(), st.lists(st.sampled_from(tasks), unique=True)))
    kind = draw(st.sampled_from(["fresh", "previous", "arbitrary"]))
    clients = draw(fresh_clients())
    if kind == "previous":
        old_tasks = draw(st.one_of(st.just(tasks), task_sets()))
        old_clients = draw(fresh_clients())
        old = StickyTaskAssignor(replicas).assign(old_tasks, old_clients, stateful)
        survivors = {c.process_id for c in old_clients}
        caps = {c.process_id: c.capacity for c in clients}
        # None: no lags reported (Faust-style metadata: the assignor's incremental set path).
        lags = draw(st.one_of(st.none(), st.integers(0, 1000)))
        clients = [
            ClientState(
                pid,
                capacity=caps.get(pid, c.capacity),
                prev_active=old[pid].active,
                prev_standby=old[pid].standby,
                lags={} if lags is None else {t: lags for t in old[pid].standby},
            )
            for c in old_clients
            if (pid := c.process_id) in survivors and draw(st.booleans())
        ] + [c for c in clients if c.process_id not in survivors]
        if not clients:
            clients = [ClientState("solo")]
    elif kind == "arbitrary":
        pool = [*tasks, TaskId(9, 0), TaskId(0, 99)]
        some = st.lists(st.sampled_from(pool), max_size=len(pool))
        clients = [
            ClientState(
                c.process_id,
                capacity=c.capacity,
                prev_active=draw(some),
                prev_standby=draw(some),
                lags=draw(
                    st.dictionaries(st.sampled_from(pool), st.integers(0, 10_000), max_size=6)
                ),
            )
            for c in clients
        ]
    if placed:
        clients = draw(placements(clients))
    return tasks, clients, replicas, stateful


def by_pid(clients: Sequence[ClientState]) -> dict[str, ClientState]:
    return {c.process_id: c for c in clients}


#: Offset sums a rejoining member reports of a task: running, or checkpoints on either side of
#: one another's acceptable recovery lag (10,000 by default).
REJOIN_SUMS = (LATEST_OFFSET, 0, 500, 5_000, 12_000, 20_000, 30_000)


@st.composite
def rejoining_members(
    draw: st.DrawFn, tasks: int = 5, max_processes: int = 4, max_members: int = 2
) -> dict[str, SubscriptionInfo]:
    """Per member id, its subscription as it joins a rebalance some processes restarted into:
    1..n processes of 1..m members each, every member running, holding a checkpoint of or
    knowing nothing of each of a few tasks and declaring some of them its previous actives.
    Member ids are drawn apart from process ids, so they sort unlike them (a member id is
    new at every restart). Few draws per member: CI runs thousands of examples."""
    sizes = draw(st.lists(st.integers(1, max_members), min_size=1, max_size=max_processes))
    processes = [uuid.UUID(int=1 + n) for n, size in enumerate(sizes) for _ in range(size)]
    member_ids = draw(st.permutations([f"m{n}" for n in range(len(processes))]))
    reports = st.lists(st.sampled_from((None, *REJOIN_SUMS)), min_size=tasks, max_size=tasks)
    members = {}
    for member, process in zip(member_ids, processes, strict=True):
        sums = draw(reports)
        previous = draw(st.integers(0, 2**tasks - 1))  # a bit per task
        members[member] = SubscriptionInfo(
            process,
            offset_sums={TaskId(0, p): s for p, s in enumerate(sums) if s is not None},
            previous_active=frozenset(TaskId(0, p) for p in range(tasks) if previous >> p & 1),
        )
    return members


# -- streams wire formats (valid user data: seeds for round trips and fuzzing) ---------------

wire_task_ids = st.builds(TaskId, st.integers(0, 2000), st.integers(0, 5000))
wire_task_sets = st.frozensets(wire_task_ids, max_size=40)
wire_names = st.text(min_size=1, max_size=12)
error_codes = st.sampled_from(list(ErrorCode))


@st.composite
def subscription_infos(draw: st.DrawFn) -> SubscriptionInfo:
    version = draw(st.sampled_from([1, 2, 3]))
    return SubscriptionInfo(
        uuid.UUID(int=draw(st.integers(0, 2**128 - 1))),
        endpoint=draw(st.one_of(st.none(), wire_names)),
        offset_sums=draw(
            st.dictionaries(wire_task_ids, st.one_of(st.just(LATEST_OFFSET), st.integers(0, 2**62)))
        ),
        previous_active=draw(wire_task_sets),
        join_nonce=draw(st.integers(0, 2**31)),
        error_code=draw(error_codes),
        rack=draw(st.one_of(st.none(), wire_names)) if version >= 2 else None,
        client_tags=draw(st.dictionaries(wire_names, wire_names, max_size=3))
        if version >= 2
        else {},
        version=version,
        latest_supported_version=draw(st.integers(version, 5)),
        subtopology_topic_indices=draw(
            st.dictionaries(
                st.integers(0, 2**31),
                st.frozensets(st.integers(0, 300), min_size=1, max_size=4),
                max_size=3,
            )
        )
        if version >= 3
        else {},
    )


@st.composite
def assignment_infos(draw: st.DrawFn, max_partitions: int = 300) -> AssignmentInfo:
    """Assignment data with host maps consistent with its topic dictionary, as the leader
    builds them: each task active on at most one host, standbys on others."""
    version = draw(st.sampled_from([1, 2]))
    topics = draw(
        st.dictionaries(
            st.integers(0, 50),
            st.dictionaries(wire_names, st.integers(1, max_partitions), min_size=1, max_size=3),
            max_size=4,
        )
    )
    tasks = [TaskId(s, p) for s, ts in topics.items() for p in range(max(ts.values()))]
    hosts = draw(st.lists(wire_names, max_size=6, unique=True)) if tasks else []
    active: dict[str, set[TaskId]] = {}
    standby: dict[str, set[TaskId]] = {}
    # Up to 1,200 tasks: one hypothesis draw per choice cost seconds per example, so the
    # per-task choices come from one drawn random generator (seeded, reproducible).
    rng = draw(st.randoms(use_true_random=False))
    for t in tasks:
        if hosts and rng.random() < 0.5:
            owner = rng.choice(hosts)
            active.setdefault(owner, set()).add(t)
            for h in rng.sample(hosts, rng.randint(0, min(2, len(hosts)))):
                if h != owner:
                    standby.setdefault(h, set()).add(t)
    return AssignmentInfo(
        active=draw(wire_task_sets),
        standby=draw(wire_task_sets),
        warmup=draw(wire_task_sets) if version >= 2 else frozenset(),
        active_by_host={h: frozenset(ts) for h, ts in active.items()},
        standby_by_host={h: frozenset(ts) for h, ts in standby.items()},
        topics=topics,
        error_code=draw(error_codes),
        next_rebalance_ms=draw(st.integers(-1, 2**50)),
        version=version,
        common_version=version,
    )


def varint(n: int) -> bytes:
    """``n`` as an unsigned LEB128 varint (the streams protocol's integers), for building
    damaged or hostile user data by hand."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
