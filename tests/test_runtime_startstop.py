"""A stop asked while the runtime starts ends the start, in any of its steps, and leaves
nothing running. No broker: aiokafka's clients are real objects whose ``start`` connects to
nothing, so the first assignment never comes (as with a broker gone while joining)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from streamassign import Subtopology, Topology
from streamassign.aiokafka import ProcessHost
from streamassign.errors import StartStoppedError
from streamassign.runtime import App
from streamassign.runtime import app as app_module

ONE = Topology([Subtopology(0, ["events"], stores=["totals"])], name="app")
#: Seconds any scenario here may take (each takes milliseconds).
DEADLINE = 5.0


class Nothing:
    async def process(self, ctx: object, record: object) -> None: ...


class Clients:
    """Every aiokafka client started and stopped during a test: ``start`` connects to nothing
    (``hold`` makes it wait for the test first), ``stop`` is aiokafka's own, counted, and
    two stops of one client at the same time are recorded as ``overlapping``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.started: list[Any] = []
        self.stops: dict[int, int] = {}
        self.overlapping: list[Any] = []
        self.hold: asyncio.Event | None = None
        self._stopping: set[int] = set()
        for cls in (AIOKafkaConsumer, AIOKafkaProducer):
            monkeypatch.setattr(cls, "start", self._starter())
            monkeypatch.setattr(cls, "stop", self._stopper(cls.stop))

    def _starter(self) -> Callable[[Any], Awaitable[None]]:
        async def start(client: Any) -> None:
            if self.hold is not None:
                await self.hold.wait()
            self.started.append(client)

        return start

    def _stopper(self, stop: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Any]:
        async def stopped(client: Any) -> None:
            if id(client) in self._stopping:
                self.overlapping.append(client)
            self._stopping.add(id(client))
            self.stops[id(client)] = self.stops.get(id(client), 0) + 1
            try:
                await asyncio.sleep(0.01)  # a stop takes a moment: a second one would overlap
                await stop(client)
            finally:
                self._stopping.discard(id(client))

        return stopped

    def left_running(self) -> list[Any]:
        return [c for c in self.started if not c._closed]

    def stopped_twice(self) -> list[Any]:
        return [c for c in self.started if self.stops.get(id(c), 0) > 1]


@pytest.fixture
def clients(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clients]:
    yield Clients(monkeypatch)


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(DEADLINE):
        while not condition():
            await asyncio.sleep(0.001)


def joining(host: ProcessHost) -> bool:
    """Whether ``host.start`` waits for its consumers' first assignments."""
    return host._first_assignments is not None


# -- ProcessHost ---------------------------------------------------------------------------------


def test_stop_ends_a_host_start_waiting_for_its_first_assignment(
    tmp_path: Path, clients: Clients
) -> None:
    """The broker went away after the consumers connected: no assignment comes. ``stop``
    used to return while ``start`` waited on for ever; now ``start`` ends with
    ``StartStoppedError`` and each consumer is stopped once, never twice at the same time
    (the start's cleanup and ``stop`` both stop them)."""
    host = ProcessHost(ONE, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, threads=2)

    async def scenario() -> None:
        starting = asyncio.ensure_future(host.start())
        await until(lambda: joining(host))
        async with asyncio.timeout(DEADLINE):
            await host.stop()
        assert starting.done()
        with pytest.raises(StartStoppedError, match="first assignment"):
            starting.result()

    asyncio.run(scenario())
    assert len(clients.started) == 2
    assert clients.left_running() == [] and clients.stopped_twice() == []
    assert clients.overlapping == [] and host.consumers == []


def test_a_stop_during_the_consumer_starts_waits_for_them_and_never_subscribes(
    tmp_path: Path, clients: Clients
) -> None:
    """Stopped while its consumers are still starting (bootstrapping), the host lets their
    starts end (a consumer stopped while starting would finish its start afterwards and run
    on), then stops them without subscribing them."""
    host = ProcessHost(ONE, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, threads=2)
    clients.hold = asyncio.Event()

    async def scenario() -> None:
        starting = asyncio.ensure_future(host.start())
        await until(lambda: len(host.consumers) == 2)
        stopping = asyncio.ensure_future(host.stop())
        await asyncio.sleep(0.02)
        assert not stopping.done() and clients.stops == {}  # nothing stopped mid-start
        assert clients.hold is not None
        clients.hold.set()
        async with asyncio.timeout(DEADLINE):
            await stopping
        with pytest.raises(StartStoppedError, match="before its consumers joined"):
            starting.result()

    asyncio.run(scenario())
    assert len(clients.started) == 2
    assert all(c.subscription() == set() for c in clients.started)
    assert clients.left_running() == [] and clients.stopped_twice() == []


def test_a_stop_as_the_first_assignment_arrives_still_ends_the_start(
    tmp_path: Path, clients: Clients
) -> None:
    """The assignment and the stop in the same turn of the loop: the stop wins (the caller
    asked for it), so ``start`` never reports a started host that is stopping."""
    host = ProcessHost(ONE, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path)

    async def scenario() -> None:
        starting = asyncio.ensure_future(host.start())
        await until(lambda: joining(host))
        host.consumers[0]._subscription._notify_assignment_waiters()  # assigned, and:
        stopping = asyncio.ensure_future(host.stop())
        async with asyncio.timeout(DEADLINE):
            await stopping
        with pytest.raises(StartStoppedError):
            starting.result()

    asyncio.run(scenario())
    assert clients.left_running() == [] and clients.stopped_twice() == []


def test_a_host_stopped_before_it_starts_makes_no_consumer(
    tmp_path: Path, clients: Clients
) -> None:
    host = ProcessHost(ONE, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path)

    async def scenario() -> None:
        await host.stop()
        with pytest.raises(StartStoppedError, match="before it started"):
            await host.start()

    asyncio.run(scenario())
    assert clients.started == [] and host.consumers == []


def test_concurrent_consumer_stops_run_one_after_the_other(
    tmp_path: Path, clients: Clients
) -> None:
    """Two stops of the consumers at once (a failed start's cleanup and ``stop``): the second
    waits for the first, which stopped them all; none is stopped twice."""
    host = ProcessHost(ONE, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, threads=2)

    async def scenario() -> None:
        starting = asyncio.ensure_future(host.start())
        await until(lambda: joining(host))
        async with asyncio.timeout(DEADLINE):
            await asyncio.gather(host._stop_consumers(), host._stop_consumers())
        host.begin_stop()
        with pytest.raises(StartStoppedError):
            await starting

    asyncio.run(scenario())
    assert len(clients.started) == 2
    assert clients.overlapping == [] and clients.stopped_twice() == []


# -- App -----------------------------------------------------------------------------------------


class Steps:
    """``App.start``'s steps that talk to the broker, faked: each is recorded, and the one
    named ``held`` waits for the test (as a step does while the broker does not answer)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, held: str | None = None) -> None:
        self.ran: list[str] = []
        self.held = held
        self.release = asyncio.Event()
        self.reached = asyncio.Event()
        monkeypatch.setattr(app_module, "ensure_internal_topics", self._topics)
        monkeypatch.setattr(app_module, "max_message_bytes", self._limits)

    async def _step(self, name: str) -> None:
        self.ran.append(name)
        if name == self.held:
            self.reached.set()
            await self.release.wait()

    async def _topics(self, *args: object, **kw: object) -> dict[str, int]:
        await self._step("topics")
        return {"app-totals-changelog": 1}

    async def _limits(self, *args: object, **kw: object) -> dict[str, int]:
        await self._step("limits")
        return {}


def make_app(tmp_path: Path, guarantee: str = "at_least_once") -> App:
    return App(
        ONE,
        {0: Nothing},
        bootstrap_servers="127.0.0.1:1",
        state_dir=tmp_path,
        store_kind="memory",
        processing_guarantee=guarantee,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("held", ["topics", "limits"])
def test_a_stop_during_a_start_step_ends_the_start_after_that_step(
    tmp_path: Path, clients: Clients, monkeypatch: pytest.MonkeyPatch, held: str
) -> None:
    """``stop()`` while a step of the start waits on the broker: it waits for that step to
    end (not cut in the middle), then the start raises ``StartStoppedError`` before its next
    step, and the stop runs: no client is ever made."""
    steps = Steps(monkeypatch, held)
    app = make_app(tmp_path)

    async def scenario() -> None:
        starting = asyncio.ensure_future(app.start())
        await asyncio.wait_for(steps.reached.wait(), DEADLINE)
        stopping = asyncio.ensure_future(app.stop())
        await asyncio.sleep(0.02)
        assert not stopping.done()  # waits for the step under way
        steps.release.set()
        async with asyncio.timeout(DEADLINE):
            await stopping
        with pytest.raises(StartStoppedError):
            starting.result()

    asyncio.run(scenario())
    assert steps.ran[-1] == held  # nothing after it
    assert clients.started == [] and app.failure is None


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_a_stop_while_clients_start_stops_each_once_after_its_start(
    tmp_path: Path, clients: Clients, monkeypatch: pytest.MonkeyPatch, guarantee: str
) -> None:
    """Stopped while its readers (and the shared producer) are starting: the stop waits for
    their starts, the host is never started, and each client is stopped once."""
    Steps(monkeypatch)
    clients.hold = asyncio.Event()
    app = make_app(tmp_path, guarantee)

    async def scenario() -> None:
        starting = asyncio.ensure_future(app.start())
        await until(lambda: app._clients.changelog_reader is not None)
        stopping = asyncio.ensure_future(app.stop())
        await asyncio.sleep(0.02)
        assert not stopping.done() and clients.stops == {}
        assert clients.hold is not None
        clients.hold.set()
        async with asyncio.timeout(DEADLINE):
            await stopping
        with pytest.raises(StartStoppedError, match="before joining the group"):
            starting.result()

    asyncio.run(scenario())
    assert len(clients.started) == (3 if guarantee == "at_least_once" else 2)
    assert app.host.consumers == []  # the host never started
    assert clients.left_running() == [] and clients.stopped_twice() == []


def test_run_stopped_while_joining_returns_after_one_stop(
    tmp_path: Path,
    clients: Clients,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The sighting: ``run()`` with a SIGTERM handler calling ``stop()``, the broker gone
    while the consumers join. ``stop()`` returned and ``run()`` waited for ever; now
    ``run()`` returns (no error: the stop was asked for), after one stop (its own
    ``stop()`` waits for the handler's), and no client is left running."""
    Steps(monkeypatch)
    app = make_app(tmp_path)

    async def scenario() -> None:
        running = asyncio.ensure_future(app.run())
        await until(lambda: joining(app.host))
        handler = asyncio.ensure_future(app.stop())  # loop.add_signal_handler's callback
        async with asyncio.timeout(DEADLINE):
            await running
            await handler

    with caplog.at_level(logging.INFO, logger="streamassign.runtime"):
        asyncio.run(scenario())
    assert len(clients.started) == 4  # the readers, the shared producer, the consumer
    assert clients.left_running() == [] and clients.stopped_twice() == []
    assert clients.overlapping == [] and app.failure is None
    assert caplog.text.count(f"process {app.host.process_id} stopped") == 1
    assert "the start was stopped" in caplog.text


def test_an_app_stopped_before_it_starts_starts_nothing(
    tmp_path: Path, clients: Clients, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = Steps(monkeypatch)
    app = make_app(tmp_path)

    async def scenario() -> None:
        await app.stop()
        with pytest.raises(StartStoppedError, match="before it started"):
            await app.start()

    asyncio.run(scenario())
    assert steps.ran == [] and clients.started == []
