"""Interactive queries without a broker: key partitions, routes, staleness, the HTTP API.

Fake applications (a topology, host maps, in-memory copies of a store) stand in for ``App``;
``QueryServer``s of two of them answer over real HTTP on 127.0.0.1, forwarding to each other.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiokafka.partitioner import DefaultPartitioner
from hypothesis import given
from hypothesis import strategies as st

from streamassign import Subtopology, TaskId, TopicPartition, Topology
from streamassign.errors import BadQueryError, QueryError, QueryUnavailableError, UnknownTableError
from streamassign.protocol import AssignmentInfo
from streamassign.runtime import (
    MemoryStore,
    Queries,
    Query,
    QueryClient,
    QueryResult,
    RuntimeConfigError,
    StoreState,
)
from streamassign.runtime.queries import Role, Route, key_partition, plan_routes
from streamassign.runtime.query_server import QueryServer

PARTITIONS = 4
TOPOLOGY = Topology([Subtopology(0, ["in"], stores=["totals"])], name="q")
CHANGELOG = "q-totals-changelog"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FakeApp:
    """Host maps, and copies of ``totals`` per task: ``(role, state)``."""

    def __init__(self, endpoint: str, info: AssignmentInfo) -> None:
        self.topology = TOPOLOGY
        self.bootstrap_servers = "unused:1"
        self.host = SimpleNamespace(endpoint=endpoint, host_info=info)
        self.copies: dict[TaskId, tuple[Role, StoreState]] = {}
        #: How far the state updater read each changelog (exactly once), if known.
        self.read_positions: dict[TopicPartition, int] = {}

    def replica(self, task: TaskId, store: str) -> tuple[Role, StoreState] | None:
        return self.copies.get(task)

    async def changelog_read_position(self, changelog: TopicPartition) -> int | None:
        return self.read_positions.get(changelog)

    def hold(
        self,
        task: TaskId,
        role: Role,
        data: Mapping[bytes, bytes],
        position: int,
        end: int | None = None,
    ) -> StoreState:
        state = StoreState("totals", TopicPartition(CHANGELOG, task.partition), MemoryStore())
        state.store.write(dict(data), {})
        state.position, state.end = position, end
        self.copies[task] = (role, state)
        return state


def info(
    active: Mapping[str, set[TaskId]], standby: Mapping[str, set[TaskId]] | None = None
) -> AssignmentInfo:
    return AssignmentInfo(
        active_by_host={h: frozenset(ts) for h, ts in active.items()},
        standby_by_host={h: frozenset(ts) for h, ts in (standby or {}).items()},
        topics={0: {"in": PARTITIONS}},
    )


def key_in(partition: int) -> bytes:
    """A key whose default partition is ``partition``."""
    return next(
        k for k in (b"k%d" % i for i in range(1000)) if key_partition(k, PARTITIONS) == partition
    )


# -- key partitions, parameters, answers ---------------------------------------------------------


@given(st.binary(max_size=64), st.integers(1, 200))
def test_key_partition_is_kafkas_default_partitioner(key: bytes, partitions: int) -> None:
    everything = list(range(partitions))
    assert key_partition(key, partitions) == DefaultPartitioner()(key, everything, everything)


@given(
    st.binary(max_size=40),
    st.none() | st.integers(0, 10_000),
    st.none() | st.integers(0, 10**9),
    st.booleans(),
)
def test_query_parameters_round_trip(
    key: bytes, partition: int | None, max_lag: int | None, local: bool
) -> None:
    query = Query("totals", key, partition=partition, max_lag=max_lag, local_only=local)
    assert Query.from_params("totals", query.to_params()) == query


def test_text_keys_and_bad_parameters() -> None:
    assert Query.from_params("t", {"key": "alice"}).key == b"alice"
    for params in (
        {},
        {"key": "a", "key_hex": "61"},
        {"key_hex": "zz"},
        {"key": "a", "partition": "-1"},
        {"key": "a", "max_lag": "soon"},
        {"key": "a", "local": "maybe"},
    ):
        with pytest.raises(BadQueryError):
            Query.from_params("t", params)


@given(st.binary(max_size=30), st.none() | st.binary(max_size=30), st.integers(0, 10**6))
def test_answers_round_trip_through_json(key: bytes, value: bytes | None, lag: int) -> None:
    result = QueryResult("totals", key, TaskId(0, 3), value, "h:1", "standby", lag, lag > 0)
    assert QueryResult.from_json(result.to_json()) == result


def test_an_unreadable_answer_is_a_query_error() -> None:
    with pytest.raises(QueryError, match="unreadable"):
        QueryResult.from_json({"table": "t", "role": "leader"})


# -- routes ----------------------------------------------------------------------------------------

hosts = st.sampled_from(["a:1", "b:1", "c:1"])
task_sets = st.frozensets(st.builds(TaskId, st.just(0), st.integers(0, 3)), max_size=4)


@given(
    st.builds(TaskId, st.just(0), st.integers(0, 3)),
    hosts,
    st.none() | st.sampled_from(["active", "standby"]),
    st.dictionaries(hosts, task_sets),
    st.dictionaries(hosts, task_sets),
    st.booleans(),
    st.booleans(),
)
def test_route_order(
    task: TaskId,
    here: str,
    local: Role | None,
    active: dict[str, frozenset[TaskId]],
    standby: dict[str, frozenset[TaskId]],
    allow_standby: bool,
    local_only: bool,
) -> None:
    routes = plan_routes(
        task,
        here=here,
        local=local,
        active_by_host=active,
        standby_by_host=standby,
        allow_standby=allow_standby,
        local_only=local_only,
    )
    remote = [r for r in routes if r.endpoint is not None]
    # This process's copy first, and a standby only when the query allows one.
    local_ok = local == "active" or (local == "standby" and allow_standby)
    assert (
        (routes[:1] == [Route(None, local)])
        if local_ok
        else not routes[: len(routes) - len(remote)]
    )
    assert all(r.endpoint != here for r in remote)  # never forwarded to itself
    if local_only:
        assert not remote
        return
    # Then the actives' processes, then (allowed) the standbys', each as the host maps say.
    expected = [Route(h, "active") for h, ts in sorted(active.items()) if task in ts and h != here]
    if allow_standby:
        expected += [
            Route(h, "standby") for h, ts in sorted(standby.items()) if task in ts and h != here
        ]
    assert remote == expected


# -- the engine ------------------------------------------------------------------------------------


class Forwarder:
    """Forwards to other fake apps' engines, as the HTTP transport would."""

    def __init__(self) -> None:
        self.engines: dict[str, Queries] = {}
        self.calls: list[tuple[str, Query]] = []

    async def __call__(self, endpoint: str, query: Query) -> QueryResult:
        self.calls.append((endpoint, query))
        if endpoint not in self.engines:
            raise QueryUnavailableError(f"{endpoint} unreachable", code="unreachable")
        return await self.engines[endpoint].get(query)


def pair(ends: dict[TopicPartition, int] | None = None) -> tuple[FakeApp, FakeApp, Forwarder]:
    """Two processes: a runs 0_0 and 0_1, b runs 0_2 and 0_3; each has the other's standbys."""
    active = {"a:1": {TaskId(0, 0), TaskId(0, 1)}, "b:1": {TaskId(0, 2), TaskId(0, 3)}}
    standby = {"a:1": active["b:1"], "b:1": active["a:1"]}
    a, b = FakeApp("a:1", info(active, standby)), FakeApp("b:1", info(active, standby))
    forward = Forwarder()

    async def end_offset(tp: TopicPartition) -> int:
        return (ends or {})[tp]

    for app in (a, b):
        forward.engines[app.host.endpoint] = Queries(app, forward=forward, end_offset=end_offset)
    return a, b, forward


def run(engine: Queries, query: Query) -> QueryResult:
    return asyncio.run(engine.get(query))


def test_a_local_active_answers_its_committed_state() -> None:
    a, _, forward = pair()
    task = TaskId(0, 0)
    key = key_in(0)
    state = a.hold(task, "active", {key: b"3"}, position=10, end=14)
    state.pending[key] = b"4"  # not committed: not visible
    result = run(forward.engines["a:1"], Query("totals", key))
    assert (result.value, result.role, result.served_by, result.task) == (
        b"3",
        "active",
        "a:1",
        task,
    )
    assert (result.lag, result.stale) == (4, False)  # 4 records not committed yet
    assert not forward.calls


def test_a_key_elsewhere_is_routed_to_the_active() -> None:
    a, b, forward = pair()
    key = key_in(2)
    b.hold(TaskId(0, 2), "active", {key: b"7"}, position=5, end=5)
    a.hold(TaskId(0, 2), "standby", {key: b"6"}, position=3)  # no max_lag: not used
    result = run(forward.engines["a:1"], Query("totals", key))
    assert (result.value, result.role, result.served_by, result.lag) == (b"7", "active", "b:1", 0)
    assert forward.calls == [("b:1", Query("totals", key, partition=2, local_only=True))]


def test_a_standby_within_max_lag_answers_here_and_is_flagged_stale() -> None:
    tp = TopicPartition(CHANGELOG, 2)
    a, b, forward = pair({tp: 9})
    key = key_in(2)
    b.hold(TaskId(0, 2), "active", {key: b"7"}, position=9, end=9)
    a.hold(TaskId(0, 2), "standby", {key: b"6"}, position=3)
    engine = forward.engines["a:1"]
    result = run(engine, Query("totals", key, max_lag=6))
    assert (result.value, result.role, result.served_by) == (b"6", "standby", "a:1")
    assert (result.lag, result.stale) == (6, True)
    assert not forward.calls
    # Further behind than allowed: the active answers instead.
    result = run(engine, Query("totals", key, max_lag=5))
    assert (result.value, result.role, result.served_by, result.stale) == (
        b"7",
        "active",
        "b:1",
        False,
    )
    # A caught-up standby is not stale.
    a.hold(TaskId(0, 2), "standby", {key: b"7"}, position=9)
    result = run(engine, Query("totals", key, max_lag=0))
    assert (result.value, result.role, result.lag, result.stale) == (b"7", "standby", 0, False)


def test_exactly_once_a_caught_up_standby_skips_the_transaction_marker() -> None:
    """Exactly once, the changelog ends with the transaction marker after the last commit
    marker: the standby's position stops one short of the end, its reader does not."""
    tp = TopicPartition(CHANGELOG, 2)
    a, b, forward = pair({tp: 10})
    key = key_in(2)
    b.hold(TaskId(0, 2), "active", {key: b"7"}, position=9, end=9)
    a.hold(TaskId(0, 2), "standby", {key: b"7"}, position=9)
    engine = forward.engines["a:1"]
    result = run(engine, Query("totals", key, max_lag=0))
    assert result.role == "active"  # not known to be caught up: lag 1
    a.read_positions[tp] = 10
    result = run(engine, Query("totals", key, max_lag=0))
    assert (result.value, result.role, result.lag, result.stale) == (b"7", "standby", 0, False)
    a.copies[TaskId(0, 2)][1].unclosed.append((key, b"8"))  # a transaction under way
    result = run(engine, Query("totals", key, max_lag=0))
    assert result.role == "active"


def test_a_remote_standby_answers_when_the_active_cannot() -> None:
    tp = TopicPartition(CHANGELOG, 0)
    _, b, forward = pair({tp: 20})
    key = key_in(0)
    b.hold(TaskId(0, 0), "standby", {key: b"1"}, position=18)  # a has no copy (restoring)
    engine = forward.engines["b:1"]
    with pytest.raises(QueryUnavailableError) as caught:
        run(engine, Query("totals", key))  # the active only: a cannot answer yet
    assert caught.value.code == "not_here" and caught.value.retry_after == 0.25
    result = run(forward.engines["a:1"], Query("totals", key, max_lag=2))
    assert (result.served_by, result.role, result.lag, result.stale) == ("b:1", "standby", 2, True)
    with pytest.raises(QueryUnavailableError) as caught:
        run(forward.engines["a:1"], Query("totals", key, max_lag=1))
    assert caught.value.code == "too_stale"  # the only route left: b's standby


def test_unknown_tables_partitions_and_owners() -> None:
    a, _, forward = pair()
    engine = forward.engines["a:1"]
    with pytest.raises(UnknownTableError, match="tables: totals"):
        run(engine, Query("counts", b"x"))
    with pytest.raises(BadQueryError, match="4 partitions"):
        run(engine, Query("totals", b"x", partition=4))
    a.host.host_info = AssignmentInfo()  # before the first assignment
    with pytest.raises(QueryUnavailableError) as caught:
        run(engine, Query("totals", b"x"))
    assert caught.value.code == "no_assignment"
    a.host.host_info = info({"b:1": {TaskId(0, 2)}})
    with pytest.raises(QueryUnavailableError) as caught:
        run(engine, Query("totals", b"x", partition=1))
    assert caught.value.code == "no_owner"


def test_an_unreachable_owner_is_retryable() -> None:
    _, _, forward = pair()
    del forward.engines["b:1"]  # b is down, the host maps do not know yet
    with pytest.raises(QueryUnavailableError) as caught:
        run(forward.engines["a:1"], Query("totals", key_in(3)))
    assert caught.value.code == "unreachable"


def test_a_copy_that_moves_during_the_end_offset_lookup_is_read_as_it_is_now() -> None:
    a, _, _ = pair()
    task = TaskId(0, 2)
    key = key_in(2)
    a.hold(task, "standby", {key: b"6"}, position=3)

    async def promoted(tp: TopicPartition) -> int:  # the standby becomes active meanwhile
        a.hold(task, "active", {key: b"7"}, position=9, end=9)
        return 9

    engine = Queries(a, end_offset=promoted)
    result = run(engine, Query("totals", key, max_lag=100))
    assert (result.value, result.role, result.lag, result.stale) == (b"7", "active", 0, False)


# -- HTTP ------------------------------------------------------------------------------------------


def test_http_api_with_forwarding_and_errors() -> None:
    ports = free_port(), free_port()
    a_end, b_end = (f"127.0.0.1:{p}" for p in ports)
    active = {a_end: {TaskId(0, 0), TaskId(0, 1)}, b_end: {TaskId(0, 2), TaskId(0, 3)}}
    a, b = FakeApp(a_end, info(active)), FakeApp(b_end, info(active))
    a.hold(TaskId(0, 0), "active", {b"\xff\x00": b"\x01\x02"}, position=1, end=1)
    a.hold(TaskId(0, 1), "active", {}, position=0)
    key2 = key_in(2)
    b.hold(TaskId(0, 2), "active", {key2: b"two"}, position=1, end=1)

    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with QueryServer(a), QueryServer(b), QueryClient(a_end) as client:
            out["bytes"] = await client.get("totals", b"\xff\x00", partition=0)
            out["routed"] = await client.get("totals", key2)
            out["absent"] = await client.get("totals", b"nobody", partition=1)
            for name, call in (
                ("unknown", client.get("nope", "x")),
                ("bad", client.get("totals", "x", partition=9)),
                ("unavailable", client.get("totals", key2, local=True)),
            ):
                try:
                    await call
                except QueryError as exc:
                    out[name] = exc
            async with aiohttp.ClientSession() as session:
                url = f"http://{a_end}/v1/tables/totals"
                async with session.get(url, params={"key": key2.decode(), "local": "true"}) as r:
                    out["raw"] = (r.status, r.headers.get("Retry-After"), await r.json())
                async with session.get(f"http://{a_end}/v1/tables") as r:
                    out["tables"] = await r.json()
                async with session.get(f"http://{b_end}/v1/hosts") as r:
                    out["hosts"] = await r.json()
        # A stopped process: unreachable, retryable; retried until the deadline.
        async with QueryClient([a_end]) as client:
            try:
                await client.get("totals", key2, retry_for=0.3)
            except QueryUnavailableError as exc:
                out["down"] = exc
        return out

    out = asyncio.run(scenario())
    assert (out["bytes"].value, out["bytes"].served_by) == (b"\x01\x02", a_end)
    assert (out["routed"].value, out["routed"].served_by, out["routed"].role) == (
        b"two",
        b_end,
        "active",
    )
    assert out["absent"].value is None and not out["absent"].found
    assert isinstance(out["unknown"], UnknownTableError)
    assert isinstance(out["bad"], BadQueryError)
    assert isinstance(out["unavailable"], QueryUnavailableError)
    assert out["unavailable"].code == "not_here"
    status, retry_after, body = out["raw"]
    assert (status, retry_after, body["error"], body["retryable"]) == (503, "1", "not_here", True)
    assert out["tables"]["tables"] == {"totals": {"subtopology": 0, "partitions": PARTITIONS}}
    assert out["hosts"]["active"][b_end] == ["0_2", "0_3"]
    assert out["down"].code == "unreachable"


@pytest.mark.parametrize("endpoint", [None, "", "host", "host:port", ":80"])
def test_a_server_needs_an_endpoint(endpoint: str | None) -> None:
    app = FakeApp("x:1", AssignmentInfo())
    app.host.endpoint = endpoint
    with pytest.raises(RuntimeConfigError, match="endpoint"):
        QueryServer(app)


def test_standby_reads_without_a_broker_are_retryable_every_time() -> None:
    """The end offset consumer cannot start: each standby read says so (503 lag_unknown),
    and the next one tries a new consumer rather than waiting on the failed one."""
    endpoint = f"127.0.0.1:{free_port()}"
    app = FakeApp(endpoint, info({"elsewhere:1": {TaskId(0, 2)}}, {endpoint: {TaskId(0, 2)}}))
    app.bootstrap_servers = f"127.0.0.1:{free_port()}"  # nothing listens there
    app.hold(TaskId(0, 2), "standby", {b"k": b"v"}, position=3)

    async def scenario() -> list[QueryError]:
        errors = []
        async with QueryServer(app, forward_timeout=2.0), QueryClient(endpoint) as client:
            for _ in range(2):
                try:
                    await client.get("totals", b"k", partition=2, local=True, max_lag=100)
                except QueryError as exc:
                    errors.append(exc)
        return errors

    errors = asyncio.run(scenario())
    assert [(type(e), getattr(e, "code", None)) for e in errors] == [
        (QueryUnavailableError, "lag_unknown")
    ] * 2
