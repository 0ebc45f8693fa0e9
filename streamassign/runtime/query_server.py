"""The HTTP side of interactive queries (aiohttp): ``QueryServer`` serves an ``App``'s tables on
its ``endpoint``, ``QueryClient`` asks any process of the application. The API is documented in
``docs/runtime.md`` ("Interactive queries"); the routing is ``queries.py``.

::

    app = App(topology, processors, ..., endpoint="10.0.0.5:8081")
    async with QueryServer(app):  # listens on the endpoint's port
        await app.run()

    async with QueryClient("10.0.0.5:8081") as client:
        result = await client.get("counts", b"alice", retry_for=10)
"""

from __future__ import annotations

from . import _query_extra  # noqa: F401 - before aiohttp: names the extra when it is missing

# isort: split
import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Protocol
from urllib.parse import quote

import aiohttp
from aiohttp import web
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTopicPartition

from .. import TopicPartition
from ..errors import BadQueryError, QueryError, QueryUnavailableError, UnknownTableError
from .app import RuntimeConfigError
from .queries import EndOffset, Queries, Query, QueryableApp, QueryResult

log = logging.getLogger("streamassign.runtime.queries")

API = "/v1"


class ServedApp(QueryableApp, Protocol):
    """What the server needs of an ``App``: the query side, and the broker to read end offsets."""

    bootstrap_servers: str


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) into its host and port."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise RuntimeConfigError(f"endpoint must be host:port, got {endpoint!r}")
    return host.strip("[]"), int(port)


def error_json(exc: QueryError) -> dict[str, Any]:
    body: dict[str, Any] = {"error": exc.code, "message": exc.message, "retryable": exc.retryable}
    if exc.retry_after is not None:
        body["retry_after"] = exc.retry_after
    return body


def error_from_json(status: int, body: Any, endpoint: str) -> QueryError:
    """The ``QueryError`` an error answer stands for."""
    data = body if isinstance(body, dict) else {}
    message = f"{endpoint}: {data.get('message', body)}"
    if status == 400:
        return BadQueryError(message)
    if status == 404:
        return UnknownTableError(message)
    if status == 503:
        retry_after = data.get("retry_after")
        return QueryUnavailableError(
            message,
            code=str(data.get("error", "unavailable")),
            retry_after=float(retry_after) if isinstance(retry_after, int | float) else 1.0,
        )
    return QueryError(f"{message} (HTTP {status})")


async def fetch_query(
    session: aiohttp.ClientSession, endpoint: str, query: Query, timeout: float
) -> QueryResult:
    """One HTTP query to one process; an unreachable process (refused, timed out, an answer
    that is not ours) is a retryable ``QueryUnavailableError`` (code ``unreachable``)."""
    url = f"http://{endpoint}{API}/tables/{quote(query.table, safe='')}"
    try:
        async with session.get(
            url, params=query.to_params(), timeout=aiohttp.ClientTimeout(total=timeout)
        ) as response:
            status = response.status
            body = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise QueryUnavailableError(
            f"{endpoint} unreachable: {exc!r}", code="unreachable", retry_after=0.25
        ) from exc
    if status == 200:
        return QueryResult.from_json(body)
    raise error_from_json(status, body, endpoint)


class QueryServer:
    """Serves ``app``'s tables over HTTP on its endpoint (``App(endpoint="host:port")``: the
    address the group's host maps carry, so other processes can forward queries here).

    ``bind``: the address to listen on (default: the endpoint's host; ``"0.0.0.0"`` for every
    interface); ``retry_after``: seconds a 503 answer suggests waiting; ``forward_timeout``:
    the longest a forwarded query or an end offset lookup may take; ``end_offset``: how to read
    a changelog end offset (default: a plain consumer, started at the first standby query).
    """

    def __init__(
        self,
        app: ServedApp,
        *,
        bind: str | None = None,
        retry_after: float = 0.25,
        forward_timeout: float = 5.0,
        end_offset: EndOffset | None = None,
    ) -> None:
        endpoint = app.host.endpoint
        if not endpoint:
            raise RuntimeConfigError(
                "queries need the process's endpoint: App(..., endpoint='host:port')"
            )
        host, self.port = split_endpoint(endpoint)
        self.bind = bind or host
        self.app = app
        self.forward_timeout = forward_timeout
        self.queries = Queries(
            app,
            forward=self._forward,
            end_offset=end_offset or self._end_offset,
            retry_after=retry_after,
        )
        self._session: aiohttp.ClientSession | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._consumer_started: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        """Listen (before or after ``app.start()``: until the app has its tasks, queries get
        a retryable 503)."""
        self._session = aiohttp.ClientSession()
        web_app = web.Application()
        web_app.add_routes(
            [
                web.get(f"{API}/tables", self._tables),
                web.get(f"{API}/tables/{{table}}", self._get),
                web.get(f"{API}/hosts", self._hosts),
            ]
        )
        self._runner = web.AppRunner(web_app, access_log=None)
        try:
            await self._runner.setup()
            await web.TCPSite(self._runner, self.bind, self.port).start()
        except BaseException:
            await self.stop()
            raise
        log.info("queries served on %s:%d (endpoint %s)", self.bind, self.port, self.endpoint)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = self._consumer_started = None

    async def __aenter__(self) -> QueryServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def endpoint(self) -> str:
        return self.app.host.endpoint or ""

    async def _forward(self, endpoint: str, query: Query) -> QueryResult:
        assert self._session is not None
        return await fetch_query(self._session, endpoint, query, self.forward_timeout)

    async def _end_offset(self, changelog: TopicPartition) -> int:
        started = self._consumer_started
        if started is not None and started.done() and (started.cancelled() or started.exception()):
            failed, self._consumer = self._consumer, None  # the broker was away: a new one
            if failed is not None:
                with contextlib.suppress(Exception):
                    await failed.stop()
        if self._consumer is None:  # the first standby query: one consumer, shared
            self._consumer = AIOKafkaConsumer(
                bootstrap_servers=self.app.bootstrap_servers,
                enable_auto_commit=False,
                # The stable end, as standbys read changelogs (an open transaction of an
                # exactly-once run is not "behind"; without transactions it is the end).
                isolation_level="read_committed",
                **getattr(self.app, "connection_config", {}),
            )
            self._consumer_started = asyncio.ensure_future(self._consumer.start())
        consumer, started = self._consumer, self._consumer_started
        assert started is not None
        await asyncio.wait_for(asyncio.shield(started), self.forward_timeout)
        tp = KafkaTopicPartition(*changelog)
        ends = await asyncio.wait_for(consumer.end_offsets([tp]), self.forward_timeout)
        return int(ends[tp])

    # -- handlers ---------------------------------------------------------------------------------

    async def _get(self, request: web.Request) -> web.Response:
        try:
            query = Query.from_params(request.match_info["table"], request.query)
            result = await self.queries.get(query)
        except QueryError as exc:
            return _error_response(exc)
        except Exception as exc:  # a bug: one clear answer, and the log has the trace
            log.exception("query failed")
            return _error_response(QueryError(f"internal error: {exc!r}"))
        return web.json_response(result.to_json())

    async def _tables(self, request: web.Request) -> web.Response:
        tables = {
            name: {"subtopology": sub, "partitions": self.queries.partitions(name)}
            for name, sub in self.queries.tables().items()
        }
        return web.json_response({"endpoint": self.endpoint, "tables": tables})

    async def _hosts(self, request: web.Request) -> web.Response:
        info = self.app.host.host_info

        def listed(hosts: Any) -> dict[str, list[str]]:
            return {h: sorted(map(str, ts)) for h, ts in sorted(hosts.items())}

        return web.json_response(
            {
                "endpoint": self.endpoint,
                "active": listed(info.active_by_host),
                "standby": listed(info.standby_by_host),
            }
        )


def _error_response(exc: QueryError) -> web.Response:
    headers = {}
    if exc.retryable and exc.retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))  # whole seconds in HTTP
    return web.json_response(error_json(exc), status=exc.status, headers=headers)


class QueryClient:
    """Asks any process of an application for a key of a table (see ``QueryServer``).

    ``endpoints``: one or more processes' ``host:port``; a query goes to the first and moves
    on to the next when one is unreachable. ``timeout``: seconds per HTTP request.
    """

    def __init__(self, endpoints: str | Sequence[str], *, timeout: float = 5.0) -> None:
        self.endpoints = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        if not self.endpoints:
            raise BadQueryError("a QueryClient needs at least one endpoint")
        self.timeout = timeout
        self._next = 0
        self._session: aiohttp.ClientSession | None = None

    async def get(
        self,
        table: str,
        key: bytes | str,
        *,
        partition: int | None = None,
        max_lag: int | None = None,
        local: bool = False,
        retry_for: float = 0.0,
    ) -> QueryResult:
        """The value of ``key`` in ``table`` (``result.value``, None when absent), with who
        answered and how stale. ``max_lag``: a standby at most that many changelog records
        behind may answer; ``local``: only the process asked may answer; ``retry_for``:
        seconds to keep retrying retryable errors (a rebalance), waiting what they suggest.
        Raises ``QueryError`` subclasses."""
        if isinstance(key, str):
            key = key.encode()
        query = Query(table, key, partition=partition, max_lag=max_lag, local_only=local)
        deadline = time.monotonic() + retry_for
        if self._session is None:
            self._session = aiohttp.ClientSession()
        while True:
            endpoint = self.endpoints[self._next % len(self.endpoints)]
            try:
                return await fetch_query(self._session, endpoint, query, self.timeout)
            except QueryUnavailableError as exc:
                if exc.code == "unreachable":
                    self._next += 1
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                await asyncio.sleep(min(exc.retry_after or 0.25, left))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> QueryClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
