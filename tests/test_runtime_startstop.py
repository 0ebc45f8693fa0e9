"""A stop asked while the runtime starts ends the start, in any of its steps, and leaves
nothing running. No broker: aiokafka's clients are real objects whose ``start`` connects to
nothing, so the first assignment never comes (as with a broker gone while joining)."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError

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
    (``hold`` makes the starts that ``held`` picks wait for the test first; ``failing`` picks
    the starts that fail), ``stop`` is aiokafka's own, counted; a stop of a client still
    starting is recorded in ``stopped_starting``, two stops of one client at the same time
    in ``overlapping``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.started: list[Any] = []
        self.stops: dict[int, int] = {}
        self.overlapping: list[Any] = []
        self.stopped_starting: list[Any] = []
        self.hold: asyncio.Event | None = None
        self.held: Callable[[Any], bool] = lambda client: True
        self.failing: Callable[[Any], bool] = lambda client: False
        self.unwind: asyncio.Event | None = None
        self.cancelled: list[Any] = []
        self.unwind_outlives_a_cancel = False
        self.recancelled: list[Any] = []
        self._starting: set[int] = set()
        self._stopping: set[int] = set()
        for cls in (AIOKafkaConsumer, AIOKafkaProducer):
            monkeypatch.setattr(cls, "start", self._starter())
            monkeypatch.setattr(cls, "stop", self._stopper(cls.stop))

    def _starter(self) -> Callable[[Any], Awaitable[None]]:
        async def start(client: Any) -> None:
            self._starting.add(id(client))
            try:
                if self.failing(client):
                    raise KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 1)]")
                if self.hold is not None and self.held(client):
                    await self._held(client, self.hold)
            finally:
                self._starting.discard(id(client))
            self.started.append(client)

        return start

    async def _held(self, client: Any, hold: asyncio.Event) -> None:
        """Wait for ``hold``; cancelled, first wait for ``unwind`` if set (a start whose
        cleanup awaits; with ``unwind_outlives_a_cancel``, one that goes on when cancelled
        once more, recorded in ``recancelled``)."""
        try:
            await hold.wait()
        except asyncio.CancelledError:
            self.cancelled.append(client)
            if self.unwind is not None:
                try:
                    await self.unwind.wait()
                except asyncio.CancelledError:
                    if not self.unwind_outlives_a_cancel:
                        raise
                    self.recancelled.append(client)
                    await self.unwind.wait()
            raise

    def _stopper(self, stop: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Any]:
        async def stopped(client: Any) -> None:
            if id(client) in self._starting:
                self.stopped_starting.append(client)
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
    """No assignment comes (the broker went away after the consumers connected): ``stop``
    ends ``start`` with ``StartStoppedError``, and each consumer is stopped once, never
    twice at the same time (the start's cleanup and ``stop`` both stop them)."""
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


def test_a_coordinator_failure_in_the_turn_of_the_stop_is_logged(
    tmp_path: Path, clients: Clients, caplog: pytest.LogCaptureFixture
) -> None:
    """A consumer's first assignment fails (its group coordinator) in the same turn of the
    loop as the stop: the stop wins, and the failure is shown, not dropped: logged once at
    WARNING (``App.run`` only logs the stopped start at INFO) and the error's cause."""
    host = ProcessHost(ONE, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path)

    async def scenario() -> None:
        starting = asyncio.ensure_future(host.start())
        await until(lambda: joining(host))
        subscription = host.consumers[0]._subscription
        subscription._fetch_waiters = set()  # (only the assignment waiters are of interest)
        subscription.abort_waiters(RuntimeError("coordinator died"))
        stopping = asyncio.ensure_future(host.stop())
        async with asyncio.timeout(DEADLINE):
            await stopping
        with pytest.raises(StartStoppedError) as stopped:
            starting.result()
        assert repr(stopped.value.__cause__) == "RuntimeError('coordinator died')"

    with caplog.at_level(logging.WARNING, logger="streamassign.aiokafka"):
        asyncio.run(scenario())
    assert [r.getMessage() for r in caplog.records if "coordinator died" in r.getMessage()] == [
        "a consumer's first assignment failed as the host stopped: RuntimeError('coordinator died')"
    ]
    assert clients.left_running() == [] and clients.stopped_twice() == []


class LoopErrors:
    """What the event loop's exception handler is given (asyncio's "never retrieved",
    "Task was destroyed but it is pending" and the like), collected until the loop ends."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def run(self, scenario: Callable[[], Awaitable[None]]) -> None:
        async def watched() -> None:
            asyncio.get_running_loop().set_exception_handler(
                lambda loop, context: self.seen.append(str(context.get("message")))
            )
            await scenario()
            for _ in range(3):  # an unretrieved failure is reported when collected
                gc.collect()
                await asyncio.sleep(0.001)

        asyncio.run(watched())


def test_a_host_start_cancelled_from_outside_leaves_no_unretrieved_failure(
    tmp_path: Path, clients: Clients
) -> None:
    """The task running ``start`` is cancelled while the consumers wait for their first
    assignment (as ``asyncio.run`` does on Ctrl-C): the start ends cancelled, its consumers
    stopped, and asyncio reports nothing (the cancelled wait's outcome was retrieved)."""
    host = ProcessHost(ONE, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, threads=2)
    loop_errors = LoopErrors()

    async def scenario() -> None:
        starting = asyncio.ensure_future(host.start())
        await until(lambda: joining(host))
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            async with asyncio.timeout(DEADLINE):
                await starting

    loop_errors.run(scenario)
    assert loop_errors.seen == []
    assert len(clients.started) == 2 and clients.left_running() == []


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


def test_a_host_stopped_during_its_start_cannot_start_again(
    tmp_path: Path, clients: Clients
) -> None:
    host = ProcessHost(ONE, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path)

    async def scenario() -> None:
        starting = asyncio.ensure_future(host.start())
        await until(lambda: joining(host))
        async with asyncio.timeout(DEADLINE):
            await host.stop()
        with pytest.raises(StartStoppedError):
            starting.result()
        with pytest.raises(StartStoppedError, match="cannot start again: make a new one"):
            await host.start()

    asyncio.run(scenario())
    assert clients.left_running() == [] and host.consumers == []


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
def test_a_stop_while_clients_start_cancels_their_starts(
    tmp_path: Path, clients: Clients, monkeypatch: pytest.MonkeyPatch, guarantee: str
) -> None:
    """Stopped while its readers (and the shared producer) are starting, and their starts
    never end (the producer asks for its id while the broker is away): the stop cancels
    the starts, the start raises ``StartStoppedError``, the host is never started, and
    each client is stopped once, after its start ended."""
    Steps(monkeypatch)
    clients.hold = asyncio.Event()  # never set
    app = make_app(tmp_path, guarantee)

    async def scenario() -> None:
        starting = asyncio.ensure_future(app.start())
        await until(lambda: app._clients.changelog_reader is not None)
        async with asyncio.timeout(DEADLINE):
            await app.stop()
        with pytest.raises(StartStoppedError, match="while its clients started"):
            starting.result()

    asyncio.run(scenario())
    made = [app._clients.restorer, app._clients.changelog_reader, app._clients.producer]
    made = [client for client in made if client is not None]
    assert len(made) == (3 if guarantee == "at_least_once" else 2)
    assert all(client._closed for client in made) and clients.started == []
    assert clients.stopped_starting == [] and clients.overlapping == []
    assert all(clients.stops.get(id(client)) == 1 for client in made)
    assert app.host.consumers == []  # the host never started


def test_a_client_start_that_fails_cancels_the_other_starts(
    tmp_path: Path, clients: Clients, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The restore reader's start fails while the shared producer's never ends: the start
    raises that failure once the other starts are cancelled and ended, so the stop after
    it stops no client that is still starting."""
    Steps(monkeypatch)
    app = make_app(tmp_path)
    clients.hold = asyncio.Event()  # never set
    clients.failing = lambda client: client is app._clients.restorer

    async def scenario() -> None:
        with pytest.raises(KafkaConnectionError):
            async with asyncio.timeout(DEADLINE):
                await app.start()
        assert clients._starting == set()
        async with asyncio.timeout(DEADLINE):
            await app.stop()

    asyncio.run(scenario())
    assert clients.started == [] and clients.stopped_starting == []
    assert app._clients.producer is not None and app._clients.producer._closed


async def loop_turns(count: int) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


def test_a_second_stop_while_the_first_one_s_cut_expires_stops_every_client(
    tmp_path: Path, clients: Clients, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first stop cancelled just after its cut of the clients' starts fired, while they
    unwind: the second stop leaves the expiring cut alone (rescheduling it raises) and
    stops every client once their starts have ended."""
    Steps(monkeypatch)
    clients.hold, clients.unwind = asyncio.Event(), asyncio.Event()  # hold: never set
    app = make_app(tmp_path)

    async def scenario() -> None:
        starting = asyncio.ensure_future(app.start())
        await until(lambda: len(clients._starting) == 3)
        first = asyncio.ensure_future(app.stop())
        await until(lambda: app._clients_cut is not None and app._clients_cut.expired())
        first.cancel()
        await asyncio.wait([first])
        second = asyncio.ensure_future(app.stop())
        await loop_turns(2)  # the second stop is under way: the starts still unwind
        assert clients.unwind is not None and not second.done()
        clients.unwind.set()
        async with asyncio.timeout(DEADLINE):
            await second
        with pytest.raises(StartStoppedError):
            starting.result()

    asyncio.run(scenario())
    made = [app._clients.restorer, app._clients.changelog_reader, app._clients.producer]
    assert all(client is not None and client._closed for client in made)
    assert clients.stopped_starting == []


def test_a_stop_while_failed_starts_unwind_waits_for_them(
    tmp_path: Path,
    clients: Clients,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The restore reader's start fails and the other starts, cancelled, still unwind when
    a stop comes: the stop's cut is passed on to them, and the start still waits for them
    (the stop wins: ``StartStoppedError``), so the stop stops no client that is still
    starting. The failure is not hidden: it is the error's cause, and logged once at
    WARNING (``run()`` only logs the stopped start at INFO)."""
    Steps(monkeypatch)
    app = make_app(tmp_path)
    unwind = clients.unwind = asyncio.Event()
    clients.hold, clients.unwind_outlives_a_cancel = asyncio.Event(), True  # hold: never set
    clients.failing = lambda client: client is app._clients.restorer

    async def scenario() -> None:
        starting = asyncio.ensure_future(app.start())
        await until(lambda: len(clients.cancelled) == 2)
        stopping = asyncio.ensure_future(app.stop())
        try:  # (the unwinds end, should this fail: asyncio.run cancels them only once)
            await until(lambda: len(clients.recancelled) == 2)  # the cut, passed on
            await loop_turns(3)
            assert not starting.done()
        finally:
            unwind.set()
        async with asyncio.timeout(DEADLINE):
            await stopping
        with pytest.raises(StartStoppedError) as stopped:
            starting.result()
        assert isinstance(stopped.value.__cause__, KafkaConnectionError)

    with caplog.at_level(logging.WARNING, logger="streamassign.runtime"):
        asyncio.run(scenario())
    assert [r.getMessage() for r in caplog.records if "start failed" in r.getMessage()] == [
        "a client's start failed as the start was stopped: KafkaConnectionError("
        "\"Unable to bootstrap from [('127.0.0.1', 1)]\")"
    ]
    assert clients.stopped_starting == []
    assert app._clients.producer is not None and app._clients.producer._closed


def test_run_stopped_while_joining_returns_after_one_stop(
    tmp_path: Path,
    clients: Clients,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``run()`` with a SIGTERM handler calling ``stop()`` while the consumers join (the
    broker gone): ``run()`` returns without error (the stop was asked for), after one stop
    (its own ``stop()`` waits for the handler's), and no client is left running."""
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


def test_run_cancelled_from_outside_while_joining_leaves_nothing(
    tmp_path: Path, clients: Clients, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``asyncio.run(app.run())`` interrupted by Ctrl-C while the consumers join: the task
    is cancelled, ``run()``'s own stop closes every client, and asyncio reports nothing."""
    Steps(monkeypatch)
    app = make_app(tmp_path)
    loop_errors = LoopErrors()

    async def scenario() -> None:
        running = asyncio.ensure_future(app.run())
        await until(lambda: joining(app.host))
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            async with asyncio.timeout(DEADLINE):
                await running

    loop_errors.run(scenario)
    assert loop_errors.seen == []
    assert len(clients.started) == 4 and clients.left_running() == []


def test_an_app_stopped_after_its_start_cannot_start_again(
    tmp_path: Path, clients: Clients, monkeypatch: pytest.MonkeyPatch
) -> None:
    Steps(monkeypatch)
    app = make_app(tmp_path)

    async def scenario() -> None:
        starting = asyncio.ensure_future(app.start())
        await until(lambda: joining(app.host))
        async with asyncio.timeout(DEADLINE):
            await app.stop()
        with pytest.raises(StartStoppedError):
            await starting
        with pytest.raises(StartStoppedError, match="cannot start again: make a new App"):
            await app.start()

    asyncio.run(scenario())
    assert len(clients.started) == 4 and clients.left_running() == []


# -- the clients' starts together (_all_or_none) -------------------------------------------------


async def refused() -> None:
    raise KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 1)]")


@pytest.mark.parametrize("turn", ["same turn", "turn after"])
def test_a_cancel_as_a_start_fails_wins_and_keeps_the_failure(
    caplog: pytest.LogCaptureFixture, turn: str
) -> None:
    """A cancel (a stop's cut, Ctrl-C) landing in the turn after a start failed, before the
    starts' gather woke its waiter, comes out of the gather in place of the failure (the
    failure was lost without a line); one landing in the failure's own turn, before the
    gather's callback ran, is taken by the gather, which ends with the failure (the stop
    then raised the failure, Ctrl-C no KeyboardInterrupt). Either way the cancel wins,
    raised from the failure, which is logged once at WARNING."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        job: asyncio.Future[None] | None = None

        async def refused_then_cancel() -> None:
            # Queued before the gather's callbacks: the cancel lands before them, or in the
            # turn after them, once the gather is done and before its waiter runs.
            assert job is not None
            if turn == "same turn":
                loop.call_soon(job.cancel)
            else:
                loop.call_soon(loop.call_soon, job.cancel)
            await refused()

        job = asyncio.ensure_future(
            app_module._all_or_none([refused_then_cancel(), asyncio.Event().wait()])
        )
        with pytest.raises(asyncio.CancelledError) as cancelled:
            async with asyncio.timeout(DEADLINE):
                await job
        assert isinstance(cancelled.value.__cause__, KafkaConnectionError)

    with caplog.at_level(logging.WARNING, logger="streamassign.runtime"):
        asyncio.run(scenario())
    assert [r.getMessage() for r in caplog.records] == [
        "a client's start failed as the start was stopped: KafkaConnectionError("
        "\"Unable to bootstrap from [('127.0.0.1', 1)]\")"
    ]


def test_a_cancel_after_a_start_failed_reaches_a_start_that_caught_the_first() -> None:
    """A start failed and the others were cancelled; one catches that cancel and goes on
    (a cleanup that awaits). A later cancel (Ctrl-C) is passed on to it, as before any
    failure, rather than held until that start ends by itself."""
    seen: list[str] = []

    async def catches_the_first_cancel() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append("first cancel")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append("second cancel")
            raise

    async def scenario() -> None:
        job = asyncio.ensure_future(
            app_module._all_or_none([refused(), catches_the_first_cancel()])
        )
        await until(lambda: seen == ["first cancel"])
        job.cancel()
        await asyncio.wait([job], timeout=DEADLINE)  # (awaited, a held job would hold this)
        assert job.done(), "the cancel was held"
        with pytest.raises(asyncio.CancelledError) as cancelled:
            job.result()
        assert isinstance(cancelled.value.__cause__, KafkaConnectionError)

    asyncio.run(scenario())
    assert seen == ["first cancel", "second cancel"]


def test_the_failure_kept_is_the_first_not_one_a_cancel_caused() -> None:
    """A start fails; another, cancelled for it, fails in its own unwind once a stop's cut
    reaches it. The failure raised as the cancel's cause (and logged) is the first one, the
    cause of the stop, not the unwind's, whatever the order the starts were listed in."""
    unwinding = asyncio.Event()

    async def fails_in_its_unwind() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            unwinding.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                raise RuntimeError("its cleanup failed") from None

    async def scenario() -> None:
        job = asyncio.ensure_future(app_module._all_or_none([fails_in_its_unwind(), refused()]))
        await until(unwinding.is_set)
        job.cancel()
        with pytest.raises(asyncio.CancelledError) as cancelled:
            async with asyncio.timeout(DEADLINE):
                await job
        assert isinstance(cancelled.value.__cause__, KafkaConnectionError)

    asyncio.run(scenario())


def test_a_cancel_after_the_failure_keeps_the_first_failure_as_cause() -> None:
    """A cancel landing in the turn after the starts' gather ended with a start's failure
    wakes the caller in the failure's place, while a start listed earlier turned its own
    cancel into an error: the cause kept is still the failure the gather ended with."""

    async def errors_on_its_cancel() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("its cleanup failed") from None

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        job: asyncio.Future[None] | None = None

        async def refused_then_cancel() -> None:
            assert job is not None
            loop.call_soon(loop.call_soon, job.cancel)  # the turn after the gather's
            await refused()

        job = asyncio.ensure_future(
            app_module._all_or_none([errors_on_its_cancel(), refused_then_cancel()])
        )
        with pytest.raises(asyncio.CancelledError) as cancelled:
            async with asyncio.timeout(DEADLINE):
                await job
        assert isinstance(cancelled.value.__cause__, KafkaConnectionError)

    asyncio.run(scenario())


def test_cancels_without_a_failure_raise_no_cause_and_no_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No start failed: a start swallowing the first cancels and a second Ctrl-C end it as
    a plain cancel; no cancel is ever logged or kept as a start's failure."""

    async def swallows_two_cancels() -> None:
        swallowed = 0
        while True:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                if swallowed == 2:
                    raise
                swallowed += 1

    async def scenario() -> None:
        job = asyncio.ensure_future(
            app_module._all_or_none([swallows_two_cancels(), asyncio.Event().wait()])
        )
        await loop_turns(3)
        job.cancel()
        await loop_turns(5)
        job.cancel()
        with pytest.raises(asyncio.CancelledError) as cancelled:
            async with asyncio.timeout(DEADLINE):
                await job
        assert cancelled.value.__cause__ is None

    with caplog.at_level(logging.WARNING, logger="streamassign.runtime"):
        asyncio.run(scenario())
    assert caplog.records == []
