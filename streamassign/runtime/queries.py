"""Interactive queries: read a key of a table (a store) from any process of the application.

A key lives in one task: task ``s_p`` of the store's subtopology ``s``, where ``p`` is the key's
partition (Kafka's default partitioner: murmur2 of the key, modulo the store's partition count,
which is what a producer used for the input record of that key; pass ``partition`` when a
processor keys its store otherwise). ``Queries.get`` answers from this process's copy when it
has one, else asks the process the group's host maps name (``app.host.host_info``, the
``endpoint`` of each process) over HTTP (``query_server.py``), as Kafka Streams' interactive
queries and Faust's table routing do. The order (``plan_routes``):

1. the active task here; 2. a standby here (only with ``max_lag``); 3. the active's process;
4. with ``max_lag``, the processes holding standbys. A forwarded query is answered locally or
not at all (``local_only``), so queries never loop.

**What a copy answers**: its *committed* state (the local store, never the active's
uncommitted writes): what a restore after a crash would rebuild too.

**Staleness** is measured in changelog records: ``lag`` = the changelog partition's end offset
minus the position the copy has applied (the offset after the last commit marker it applied).
For a standby the end offset is read from the broker at the query (one ``ListOffsets`` request,
shared by concurrent queries of the partition); a standby answers only if ``lag <= max_lag``,
and its answer is flagged ``stale`` when ``lag > 0`` (it may miss committed writes; the lag also
counts the active's writes not committed yet). An active's lag is its own writes not committed
yet (no I/O); it is never stale: nothing committed is missing from it.

Errors are ``QueryError`` subclasses (``streamassign.errors``): unknown table (404), bad query
(400), and ``QueryUnavailableError`` (503, retryable: no owner yet, a copy moving or restoring,
a process unreachable, standbys too far behind).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, Protocol

import attrs
from aiokafka.partitioner import murmur2

from .. import TaskId, TopicPartition
from ..errors import BadQueryError, QueryError, QueryUnavailableError, UnknownTableError
from ..protocol import AssignmentInfo
from ..topology import Topology
from .changelog import StoreState

Role = Literal["active", "standby"]

#: Asks another process (its endpoint) a query; raises ``QueryError`` subclasses.
Forward = Callable[[str, "Query"], Awaitable["QueryResult"]]
#: Reads a changelog partition's end offset from the broker.
EndOffset = Callable[[TopicPartition], Awaitable[int]]


class _Host(Protocol):
    endpoint: str | None
    host_info: AssignmentInfo


class QueryableApp(Protocol):
    """What queries need of an ``App`` (public attributes only)."""

    topology: Topology

    @property
    def host(self) -> _Host: ...

    def replica(self, task: TaskId, store: str) -> tuple[Role, StoreState] | None: ...

    async def changelog_read_position(self, changelog: TopicPartition) -> int | None: ...


def key_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner (Java's and aiokafka's) gives ``key``."""
    return int(murmur2(key) & 0x7FFFFFFF) % partitions


@attrs.frozen
class Query:
    """One key of one table. ``partition``: None to compute it from the key; ``max_lag``:
    None for the active only, else a standby behind by at most that many changelog records
    may answer; ``local_only``: answer from this process or fail (forwarded queries)."""

    table: str
    key: bytes
    partition: int | None = None
    max_lag: int | None = None
    local_only: bool = False

    def to_params(self) -> dict[str, str]:
        """HTTP query parameters (the key as hex: any bytes survive)."""
        params = {"key_hex": self.key.hex()}
        if self.partition is not None:
            params["partition"] = str(self.partition)
        if self.max_lag is not None:
            params["max_lag"] = str(self.max_lag)
        if self.local_only:
            params["local"] = "true"
        return params

    @classmethod
    def from_params(cls, table: str, params: Mapping[str, str]) -> Query:
        """Read HTTP query parameters (see docs/runtime.md, "Interactive queries")."""
        if ("key" in params) == ("key_hex" in params):
            raise BadQueryError("give exactly one of key (UTF-8 text) and key_hex")
        if "key" in params:
            key = params["key"].encode()
        else:
            try:
                key = bytes.fromhex(params["key_hex"])
            except ValueError:
                raise BadQueryError(f"key_hex is not hex: {params['key_hex']!r}") from None
        local = params.get("local", "false").lower()
        if local not in ("true", "false", "1", "0"):
            raise BadQueryError(f"local must be true or false, got {local!r}")
        return cls(
            table,
            key,
            partition=_natural(params, "partition"),
            max_lag=_natural(params, "max_lag"),
            local_only=local in ("true", "1"),
        )


def _natural(params: Mapping[str, str], name: str) -> int | None:
    raw = params.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise BadQueryError(f"{name} must be an integer >= 0, got {raw!r}")
    return value


@attrs.frozen
class QueryResult:
    """An answer. ``value`` None: the key is absent from the copy that answered.
    ``served_by``: that copy's process (its endpoint); ``lag`` and ``stale``: see the module
    docstring."""

    table: str
    key: bytes
    task: TaskId
    value: bytes | None
    served_by: str
    role: Role
    lag: int
    stale: bool

    @property
    def found(self) -> bool:
        return self.value is not None

    @property
    def partition(self) -> int:
        return self.task.partition

    def to_json(self) -> dict[str, Any]:
        value = self.value
        text = None
        if value is not None:
            try:
                text = value.decode()
            except UnicodeDecodeError:
                text = None
        return {
            "table": self.table,
            "key_hex": self.key.hex(),
            "partition": self.task.partition,
            "task": str(self.task),
            "found": value is not None,
            "value": None if value is None else base64.b64encode(value).decode(),
            "value_text": text,
            "served_by": self.served_by,
            "role": self.role,
            "lag": self.lag,
            "stale": self.stale,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> QueryResult:
        try:
            raw = data["value"]
            role = data["role"]
            if role not in ("active", "standby"):
                raise QueryError(f"unreadable query answer (role {role!r}): {dict(data)!r}")
            return cls(
                table=str(data["table"]),
                key=bytes.fromhex(data["key_hex"]),
                task=TaskId.parse(str(data["task"])),
                value=None if raw is None else base64.b64decode(raw, validate=True),
                served_by=str(data["served_by"]),
                role=role,
                lag=int(data["lag"]),
                stale=bool(data["stale"]),
            )
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise QueryError(f"unreadable query answer ({exc!r}): {dict(data)!r}") from exc


@attrs.frozen
class Route:
    """Where to ask: ``endpoint`` None is this process; ``role`` the copy expected there."""

    endpoint: str | None
    role: Role


def plan_routes(
    task: TaskId,
    *,
    here: str | None,
    local: Role | None,
    active_by_host: Mapping[str, frozenset[TaskId]],
    standby_by_host: Mapping[str, frozenset[TaskId]],
    allow_standby: bool,
    local_only: bool,
) -> list[Route]:
    """Where to ask for a key of ``task``, in order (see the module docstring). ``local``: the
    copy this process has. The host maps may be a rebalance behind: the caller tries the next
    route when one cannot answer."""
    routes = []
    if local == "active" or (local == "standby" and allow_standby):
        routes.append(Route(None, local))
    if local_only:
        return routes
    routes += [Route(h, "active") for h, ts in sorted(active_by_host.items()) if task in ts]
    if allow_standby:
        routes += [Route(h, "standby") for h, ts in sorted(standby_by_host.items()) if task in ts]
    return [r for r in routes if r.endpoint is None or r.endpoint != here]


class Queries:
    """Answers queries for one ``App`` (see the module docstring). ``forward`` asks another
    process (None: local answers only); ``end_offset`` reads a changelog end offset (None: no
    standby answers); ``retry_after``: seconds a retryable error suggests waiting."""

    def __init__(
        self,
        app: QueryableApp,
        *,
        forward: Forward | None = None,
        end_offset: EndOffset | None = None,
        retry_after: float = 0.25,
    ) -> None:
        self.app = app
        self.forward = forward
        self.end_offset = end_offset
        self.retry_after = retry_after
        self._ends: dict[TopicPartition, asyncio.Future[int]] = {}

    def tables(self) -> dict[str, int]:
        """Every table (store) of the application and its subtopology."""
        topology = self.app.topology
        return {s: topology.subtopology_of_store(s) for s in sorted(topology.stores)}

    def partitions(self, table: str) -> int | None:
        """The table's partition count (its subtopology's task count), from the host maps;
        None before this process had an assignment with host maps."""
        counts = self.app.host.host_info.topics.get(self._subtopology(table), {})
        return max(counts.values()) if counts else None

    def task_of(self, query: Query) -> TaskId:
        """The task holding ``query``'s key (validates the table and the partition)."""
        subtopology = self._subtopology(query.table)
        count = self.partitions(query.table)
        partition = query.partition
        if partition is None:
            if count is None:
                raise self._unavailable(
                    "no_assignment", "the table's partition count is not known yet (no assignment)"
                )
            partition = key_partition(query.key, count)
        elif count is not None and partition >= count:
            raise BadQueryError(
                f"table {query.table!r} has {count} partitions, not {partition + 1}"
            )
        return TaskId(subtopology, partition)

    async def get(self, query: Query) -> QueryResult:
        """Answer ``query`` here or through the process that can (see the module docstring)."""
        task = self.task_of(query)
        query = attrs.evolve(query, partition=task.partition)
        info = self.app.host.host_info
        local = self.app.replica(task, query.table)
        local_only = query.local_only or self.forward is None
        routes = plan_routes(
            task,
            here=self.app.host.endpoint,
            local=None if local is None else local[0],
            active_by_host=info.active_by_host,
            standby_by_host=info.standby_by_host,
            allow_standby=query.max_lag is not None,
            local_only=local_only,
        )
        failures: list[QueryUnavailableError] = []
        for route in routes:
            try:
                if route.endpoint is None:
                    return await self._answer(task, query)
                assert self.forward is not None
                return await self.forward(route.endpoint, attrs.evolve(query, local_only=True))
            except QueryUnavailableError as exc:
                failures.append(exc)
        if failures:
            reasons = "; ".join(e.message for e in failures)
            raise self._unavailable(failures[0].code, f"task {task}: {reasons}")
        if local_only:
            raise self._unavailable("not_here", f"no copy of task {task} here can answer")
        if any(task in ts for ts in info.active_by_host.values()):  # here, by the host maps
            raise self._unavailable("not_ready", f"task {task} is being restored or moved here")
        raise self._unavailable("no_owner", f"task {task} has no active process yet")

    async def _answer(self, task: TaskId, query: Query) -> QueryResult:
        """From this process's copy (committed state), or QueryUnavailableError."""
        found = self.app.replica(task, query.table)
        if found is not None and found[0] == "standby":
            if query.max_lag is None:
                raise self._unavailable("not_here", f"only a standby of task {task} here")
            end = await self._end_of(found[1].changelog)
            found = self.app.replica(task, query.table)  # it may have changed meanwhile
        if found is None:
            raise self._unavailable("not_here", f"no copy of task {task} here")
        role, state = found
        if role == "active":
            lag = max(0, state.end - state.position) if state.end is not None else 0
        else:
            lag = max(0, end - state.position)
            if lag == 1 and not state.unclosed:
                # Exactly once: a transaction marker follows the last commit marker, and a
                # store's position never counts it. Read past it, the standby is caught up.
                read = await self.app.changelog_read_position(state.changelog)
                if read is not None and read >= end:
                    lag = 0
            if query.max_lag is not None and lag > query.max_lag:
                raise self._unavailable(
                    "too_stale", f"the standby of task {task} here is {lag} records behind"
                )
        return QueryResult(
            table=query.table,
            key=query.key,
            task=task,
            value=state.store.get(query.key),
            served_by=self.app.host.endpoint or "",
            role=role,
            lag=lag,
            stale=role == "standby" and lag > 0,
        )

    async def _end_of(self, changelog: TopicPartition) -> int:
        """The changelog's end offset now; concurrent queries of a partition share a fetch."""
        if self.end_offset is None:
            raise self._unavailable("lag_unknown", "no end offsets here: standbys cannot answer")
        pending = self._ends.get(changelog)
        if pending is None:
            pending = asyncio.ensure_future(self.end_offset(changelog))
            self._ends[changelog] = pending
            pending.add_done_callback(lambda _: self._ends.pop(changelog, None))
        try:
            return await asyncio.shield(pending)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise self._unavailable(
                "lag_unknown", f"end offset of {changelog.topic}[{changelog.partition}]: {exc!r}"
            ) from exc

    def _subtopology(self, table: str) -> int:
        topology = self.app.topology
        if table not in topology.stores:
            known = ", ".join(sorted(topology.stores)) or "none"
            raise UnknownTableError(f"no table {table!r} (tables: {known})")
        return topology.subtopology_of_store(table)

    def _unavailable(self, code: str, message: str) -> QueryUnavailableError:
        return QueryUnavailableError(message, code=code, retry_after=self.retry_after)
