"""Runtime application setup that needs no broker: configuration errors and internal topics."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
from aiokafka.errors import TopicAuthorizationFailedError

from streamassign import Subtopology, TaskId, Topology
from streamassign.aiokafka import closing
from streamassign.errors import CopartitioningError, OutputWriteError, TopologyError
from streamassign.protocol import LATEST_VERSION, SubscriptionInfo
from streamassign.runtime import App, ProcessingError, RuntimeConfigError, internal_topics
from streamassign.runtime import app as runtime_app
from streamassign.runtime._clients import (
    BATCH_HEADROOM,
    SHARED_BATCH_BYTES,
    Clients,
    batch_ceiling,
    capped_batches,
)
from streamassign.runtime._topics import _topic_limits, written_topics
from streamassign.runtime.settings import Settings
from streamassign.runtime.tasks import ActiveTask


class Nothing:
    async def process(self, ctx: object, record: object) -> None: ...


def topology() -> Topology:
    return Topology(
        [
            Subtopology(0, ["sentences"], sink_topics=["app-words"]),
            Subtopology(1, ["app-words"], stores=["counts"]),
            Subtopology(2, ["orders", "customers"], stores=["customers"]),
        ],
        copartition_groups=[["orders", "customers"]],
        repartition_topics={"app-words": None},
        name="app",
    )


def test_internal_topics_follow_the_topology() -> None:
    counts = internal_topics(topology(), {"sentences": 6, "orders": 3, "customers": 3})
    assert counts == {"app-words": 6, "app-counts-changelog": 6, "app-customers-changelog": 3}
    with pytest.raises(CopartitioningError):
        internal_topics(topology(), {"sentences": 6, "orders": 3, "customers": 4})


def test_every_subtopology_needs_a_processor(tmp_path: Path) -> None:
    with pytest.raises(RuntimeConfigError, match=r"\[0, 1, 2\]"):
        App(topology(), {0: Nothing, 1: Nothing}, bootstrap_servers="x:1", state_dir=tmp_path)


@pytest.mark.parametrize(
    "options",
    [{"store_kind": "lmdb"}, {"processing_errors": "ignore"}, {"commit_interval_ms": 0}],
)
def test_bad_options_are_refused(tmp_path: Path, options: dict[str, object]) -> None:
    processors = {0: Nothing, 1: Nothing, 2: Nothing}
    with pytest.raises(RuntimeConfigError):
        App(topology(), processors, bootstrap_servers="x:1", state_dir=tmp_path, **options)  # type: ignore[arg-type]


def test_topology_from_a_toml_file(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    app = App(
        root / "topology" / "orders-join.toml",
        {0: Nothing, 1: Nothing},
        bootstrap_servers="x:1",
        state_dir=tmp_path,
    )
    assert app.topology.name == "orders-enricher"
    assert app.host.application_id == "orders-enricher"


@pytest.mark.parametrize(
    ("content", "error", "message"),
    [
        ("", TopologyError, "topology has no tasks (no subtopology)"),
        ('name = "orders"\n', TopologyError, "topology orders has no tasks (no subtopology)"),
        (
            '[[subtopology]]\nid = 0\nsource_topics = ["a"]\n',
            RuntimeConfigError,
            "the topology has no name, and App runs it under its name (the application id: its "
            'consumer group, the prefix of its internal topics); add name = "..." to the file',
        ),
    ],
)
def test_an_empty_or_half_written_topology_file_is_one_line_naming_it(
    tmp_path: Path, content: str, error: type[Exception], message: str
) -> None:
    """A file truncated to nothing, or holding only a name (a config map mounted empty, a
    template): refused when the App is built, not at start (aiokafka's "provide either topics
    or pattern"), nor with a hint at an ``application_id=`` App does not take."""
    path = tmp_path / "orders.toml"
    path.write_text(content)
    with pytest.raises(error) as refused:
        App(path, {0: Nothing}, bootstrap_servers="x:1", state_dir=tmp_path / "state")
    assert str(refused.value) == f"{path}: {message}"
    assert not (tmp_path / "state").exists()  # refused before the state directory is opened


def test_a_topology_object_without_tasks_or_name_is_refused_as_app_takes_it(
    tmp_path: Path,
) -> None:
    with pytest.raises(TopologyError, match=r"^topology x has no tasks \(no subtopology\)$"):
        App(Topology([], name="x"), {}, bootstrap_servers="x:1", state_dir=tmp_path)
    unnamed = Topology([Subtopology(0, ["a"])])
    with pytest.raises(
        RuntimeConfigError, match=r"^the topology has no name.*Topology\(name="
    ) as e:
        App(unnamed, {0: Nothing}, bootstrap_servers="x:1", state_dir=tmp_path)
    assert "application_id" not in str(e.value)


def standby_app(tmp_path: Path) -> App:
    one = Topology([Subtopology(0, ["events"], stores=["totals"])], name="app")
    return App(
        one,
        {0: Nothing},
        bootstrap_servers="x:1",
        state_dir=tmp_path,
        threads=2,
        store_kind="memory",
    )


@pytest.mark.parametrize("adds_first", [True, False])
def test_a_standby_moving_between_consumers_stays_in_any_callback_order(
    tmp_path: Path, adds_first: bool
) -> None:
    """The leader moves a standby from consumer 1 to consumer 0 of this process; each
    consumer reports its own change, in either order. The standby stays, with its stores."""
    app = standby_app(tmp_path)
    task = TaskId(0, 1)

    async def run() -> None:
        await app._add_standbys(1, frozenset({task}))
        stores = app._standbys.states[task]
        app._rebalancing |= {0, 1}
        if adds_first:
            await app._add_standbys(0, frozenset({task}))
            await app._rebalance_completed(0)
            await app._remove_standbys(1, frozenset({task}))
        else:
            await app._remove_standbys(1, frozenset({task}))
            await app._add_standbys(0, frozenset({task}))
            await app._rebalance_completed(0)
        await app._rebalance_completed(1)
        assert app._standbys.states.get(task) is stores  # the same open stores, not reopened
        await app._remove_standbys(1, frozenset({task}))  # consumer 1 no longer owns it
        assert app.standby_tasks == {task}
        await app._remove_standbys(0, frozenset({task}))
        assert app.standby_tasks == frozenset()

    asyncio.run(run())


class BrokenReader:
    """A changelog reader whose fetch fails (say, the store write under it)."""

    def assign(self, partitions: object) -> None: ...

    def seek(self, partition: object, offset: int) -> None: ...

    async def getmany(
        self, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[object, list[object]]:
        raise OSError("disk full")


def test_a_failing_standby_reader_stops_the_app(tmp_path: Path) -> None:
    app = standby_app(tmp_path)
    app._clients.changelog_reader = BrokenReader()  # type: ignore[assignment]

    async def run() -> None:
        await app._add_standbys(0, frozenset({TaskId(0, 0)}))
        await asyncio.wait_for(
            app._fail_on_error(app._state_updater_loop(), "the state updater"), 5
        )

    asyncio.run(run())
    assert isinstance(app.failure, OSError)
    assert app._stopped.is_set()


class Client:
    stopped = False

    async def stop(self) -> None:
        self.stopped = True


def test_a_failed_start_is_cleaned_up_and_task_changes_after_stop_do_nothing(
    tmp_path: Path,
) -> None:
    producer = Client()

    class FailingStart(App):
        async def start(self) -> None:
            self._clients.producer = producer  # type: ignore[assignment]  # started, then:
            raise ConnectionError("broker unreachable")

    one = Topology([Subtopology(0, ["events"], stores=["totals"])], name="app")
    app = FailingStart(one, {0: Nothing}, bootstrap_servers="x:1", state_dir=tmp_path)
    with pytest.raises(ConnectionError):
        asyncio.run(app.run())
    assert producer.stopped
    # A rebalance callback arriving while (or after) the app closes touches no store.
    asyncio.run(app.host.listener.on_standby_added(0, frozenset({TaskId(0, 0)})))
    assert app.standby_tasks == frozenset() and app.failure is None


def test_a_subtopology_with_two_stores_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    two = Topology([Subtopology(0, ["events"], stores=["a", "b"])], name="app")
    App(two, {0: Nothing}, bootstrap_servers="x:1", state_dir=tmp_path)
    assert "subtopology 0 has 2 stores" in caplog.text


def test_stop_marks_the_host_stopping_before_the_grace_period(tmp_path: Path) -> None:
    """A rebalance during ``App.stop``'s grace, commits and closes (other processes' consumers
    leaving) must find the host stopping: it hands this process nothing new then."""
    one = Topology([Subtopology(0, ["events"], stores=["totals"])], name="app")
    app = App(one, {0: Nothing}, bootstrap_servers="x:1", state_dir=tmp_path)
    seen: list[bool] = []

    async def loop() -> None:  # a processing loop finishing the record it is on
        await app._stopped.wait()
        seen.append(app.host.stopping)

    async def run() -> None:
        app._loops = [asyncio.create_task(loop())]
        await app.stop()

    asyncio.run(run())
    assert seen == [True]


class Undeliverable:
    """A client whose ``stop`` never ends: aiokafka's producer waiting for acks of batches
    the broker, down, never sends."""

    cancelled = False

    async def stop(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise


def test_stop_with_the_broker_down_ends_and_says_what_it_abandoned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At least once, ``stop()`` with the broker unreachable waited for ever for
    the shared producer (and a commit at stop for acks). Both are bounded now: the commit by
    ``stop_grace`` (its consumer's tasks torn: uncommitted, read again), each client's stop
    by ``CLOSE_TIMEOUT``, each with one line; the other clients still stop."""
    monkeypatch.setattr(closing, "CLOSE_TIMEOUT", 0.2)
    one = Topology([Subtopology(0, ["events"])], name="app")
    app = App(one, {0: Nothing}, bootstrap_servers="x:1", state_dir=tmp_path)
    app.stop_grace = 0.2
    task = ActiveTask(TaskId(0, 0), 0, {}, Nothing())
    app._actives[task.task_id] = task
    producer, reader = Undeliverable(), Client()
    app._clients.producer = producer  # type: ignore[assignment]
    app._clients.restorer = reader  # type: ignore[assignment]
    app.host.consumers.append(Client())  # type: ignore[arg-type]

    async def waits_for_acks(index: int) -> None:
        await asyncio.Event().wait()

    app._commits.commit_safely = waits_for_acks  # type: ignore[method-assign]
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="streamassign.runtime"):
        asyncio.run(asyncio.wait_for(app.stop(), 10))
    assert time.monotonic() - started < 5
    assert task.torn, "a task whose commit at stop did not end must be torn"
    assert producer.cancelled and reader.stopped
    assert (
        "consumer 0: its commit at stop did not end within 0.2 s after the consumer loops "
        "stopped (0."
    ) in caplog.text
    assert "the shared producer did not stop within 0.2 s" in caplog.text
    assert "unacknowledged writes are abandoned" in caplog.text


def test_stop_cancels_a_rebalance_commit_the_broker_never_acknowledges(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A rebalance callback committing when the broker went away waits for acks for ever
    (aiokafka never expires a batch whose partition leader is unreachable), and ``stop()``
    waited for it, so a SIGTERM never ended the process. Now the changes under way and the
    commits at stop share ``stop_grace``: the callback's commit is cancelled, its consumer's
    tasks torn (uncommitted: read again at restart), one line says so, and the callback
    returns to aiokafka (whose coordination task a consumer's stop waits for)."""
    one = Topology([Subtopology(0, ["events"])], name="app")
    app = App(one, {0: Nothing}, bootstrap_servers="x:1", state_dir=tmp_path)
    app.stop_grace = 0.2
    task = ActiveTask(TaskId(0, 0), 0, {}, Nothing())
    app._actives[task.task_id] = task
    app.host.consumers.append(Client())  # type: ignore[arg-type]
    committing = asyncio.Event()
    commits_cancelled: list[int] = []

    async def waits_for_acks(index: int) -> None:
        committing.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            commits_cancelled.append(index)
            raise

    app._commits.commit_safely = waits_for_acks  # type: ignore[method-assign]

    async def run() -> None:
        callback = asyncio.create_task(app.host.listener.on_rebalance_started(0))
        await asyncio.wait_for(committing.wait(), 5)
        started = time.monotonic()
        await asyncio.wait_for(app.stop(), 5)
        assert time.monotonic() - started < 3
        await asyncio.wait_for(callback, 1)  # returned, not cancelled nor failed

    with caplog.at_level(logging.WARNING, logger="streamassign.runtime"):
        asyncio.run(run())
    assert commits_cancelled == [0]
    assert task.torn, "a task whose rebalance commit was abandoned must be torn"
    assert app.failure is None
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("consumer 0")]
    # The grace runs from the loops' end, not from the stop's start: both are said.
    assert re.match(
        r"consumer 0: a task change \(starting a rebalance\) did not end within 0\.2 s after "
        r"the consumer loops stopped \(\d+\.\d s after the stop began; broker unreachable\?\)",
        line,
    ), line
    assert "its tasks are not committed" in line


def test_stop_waits_for_a_cancelled_change_to_unwind_only_so_long(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change cancelled at the stop's grace ends once its cleanups do; ``stop()`` waits
    for them ``UNWIND_TIMEOUT`` at most, and says so when it goes on without one. Its
    consumer's stores are then left open (they were once closed while the change
    could still write to them in a thread); another consumer's are closed, but for one its
    commit still holds (a task once moved to the sibling consumer while consumer 0's commit
    ran, ``running`` 0, its stores were closed under that commit's writes)."""
    monkeypatch.setattr(runtime_app, "UNWIND_TIMEOUT", 0.2)
    one = Topology([Subtopology(0, ["events"])], name="app")
    app = App(one, {0: Nothing}, bootstrap_servers="x:1", state_dir=tmp_path, threads=2)
    app.stop_grace = 0.2
    task = ActiveTask(TaskId(0, 0), 0, {}, Nothing())
    other = ActiveTask(TaskId(0, 1), 1, {}, Nothing())
    moved = ActiveTask(TaskId(0, 2), 1, {}, Nothing())
    moved.running = 0  # as ``commits.busy`` marks it until consumer 0's commit ends
    app._actives[task.task_id] = task
    app._actives[other.task_id] = other
    app._actives[moved.task_id] = moved
    closed: list[TaskId] = []

    async def close(task_id: TaskId, stores: object) -> None:
        closed.append(task_id)

    app._stores.close = close  # type: ignore[method-assign,assignment]
    unwind = asyncio.Event()

    async def slow_to_unwind(index: int) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await unwind.wait()  # a cleanup that waits for the unreachable broker
            raise

    app._commits.commit_safely = slow_to_unwind  # type: ignore[method-assign]

    async def run() -> None:
        callback = asyncio.create_task(app.host.listener.on_rebalance_started(0))
        await until(lambda: app._changes == 1)
        started = time.monotonic()
        await asyncio.wait_for(app.stop(), 5)
        assert time.monotonic() - started < 3
        assert task.torn
        unwind.set()
        await asyncio.wait_for(asyncio.gather(callback, return_exceptions=True), 1)

    with caplog.at_level(logging.WARNING, logger="streamassign.runtime"):
        asyncio.run(run())
    assert (
        "consumer 0: the cancelled task change (starting a rebalance) did not end within "
        "0.2 s of its cancel; stopping without waiting for it (its tasks' stores are left "
        "open"
    ) in caplog.text
    assert closed == [other.task_id]


def test_a_change_failing_while_stop_waits_for_it_stops_the_commits_at_stop(
    tmp_path: Path,
) -> None:
    """A rebalance commit waits for a write's ack when ``stop()`` begins; then the broker
    refuses the write for good and the change fails. ``stop()`` chose the consumers to
    commit before waiting for the change, committed the failed task again, and the
    ``OutputWriteError`` escaped ``stop()``: no client stopped, no consumer left the group.
    A failure during the wait must mean "commit nothing", as one before it."""
    one = Topology([Subtopology(0, ["events"])], name="app")
    app = App(one, {0: Nothing}, bootstrap_servers="x:1", state_dir=tmp_path)
    app.stop_grace = 2.0
    producer, consumer = Client(), Client()
    app._clients.producer = producer  # type: ignore[assignment]
    task = ActiveTask(TaskId(0, 0), 0, {}, Nothing())
    app._actives[task.task_id] = task
    app.host.consumers.append(consumer)  # type: ignore[arg-type]
    commits: list[int] = []
    commit_safely = app._commits.commit_safely

    async def counted(index: int) -> None:
        commits.append(index)
        await commit_safely(index)

    app._commits.commit_safely = counted  # type: ignore[method-assign]

    async def run() -> None:
        write = asyncio.get_running_loop().create_future()
        task.futures.append(write)
        callback = asyncio.create_task(app.host.listener.on_rebalance_started(0))
        await until(lambda: task.running is not None)  # the commit waits for the write's ack
        stop = asyncio.create_task(app.stop())
        await until(lambda: app._closing)  # stop() waits for the change under way
        write.set_exception(TopicAuthorizationFailedError())  # refused for good
        await asyncio.wait_for(stop, 5)  # raises nothing
        await asyncio.wait_for(callback, 1)

    asyncio.run(run())
    assert isinstance(app.failure, OutputWriteError)  # the change's failure stops the app
    assert commits == [0], "the rebalance's commit only: none at stop after a failure"
    assert consumer.stopped and producer.stopped


def test_a_failing_step_of_stop_skips_none_of_the_others(tmp_path: Path) -> None:
    """A commit at stop that fails must not leave the stores open (RocksDB's lock held: a
    new ``App`` of this process could not open them), the consumers in the group or the
    clients running; ``run()`` raises ``ProcessingError``, not the commit's own error."""
    task = TaskId(0, 0)
    producer, consumer = Client(), Client()

    class RefusedAtStop(App):
        async def start(self) -> None:
            self._stores.parked[task] = (self._stores.open(task), "kept")
            self._clients.producer = producer  # type: ignore[assignment]
            self.host.consumers.append(consumer)  # type: ignore[arg-type]
            self._stopped.set()  # a shutdown requested at once

    app = RefusedAtStop(one_store(), {0: Nothing}, bootstrap_servers="x:1", state_dir=tmp_path)

    async def refused(index: int) -> None:
        raise OutputWriteError("task 0_0: its transaction cannot be written")

    app._commits.commit_safely = refused  # type: ignore[method-assign]
    with pytest.raises(ProcessingError, match="cannot be written"):
        asyncio.run(app.run())
    assert consumer.stopped and producer.stopped
    opens_again(tmp_path, task)


def test_a_rebalance_callback_returns_once_its_change_has_ended(tmp_path: Path) -> None:
    """Each task change runs as its own task (so ``stop()`` can cancel only the change), but
    the callback still waits for it, as when it ran inline: aiokafka goes on with the
    rebalance only once the commit is done."""
    one = Topology([Subtopology(0, ["events"])], name="app")
    app = App(one, {0: Nothing}, bootstrap_servers="x:1", state_dir=tmp_path)
    acked = asyncio.Event()
    ended: list[int] = []

    async def commit_safely(index: int) -> None:
        await acked.wait()
        ended.append(index)

    app._commits.commit_safely = commit_safely  # type: ignore[method-assign]

    async def run() -> None:
        callback = asyncio.create_task(app.host.listener.on_rebalance_started(0))
        await until(lambda: app._changes == 1)
        await asyncio.sleep(0.05)
        assert not callback.done(), "returned while its commit waited for acks"
        acked.set()
        await asyncio.wait_for(callback, 1)
        assert ended == [0] and app._changes == 0 and app._changes_done.is_set()

    asyncio.run(run())


def test_a_cancelled_rebalance_callback_returns_once_its_change_has_unwound(
    tmp_path: Path,
) -> None:
    """aiokafka's coordination task cancelled (a bounded consumer stop) cancels the change
    too; the callback must not return, nor count the change as ended (``stop()`` waits for
    ``_changes_done``), while the change still unwinds (its local store writes finishing
    in their thread, as ``Commits`` lets them on a cancel)."""
    one = Topology([Subtopology(0, ["events"])], name="app")
    app = App(one, {0: Nothing}, bootstrap_servers="x:1", state_dir=tmp_path)
    unwound: list[int] = []

    async def commit_safely(index: int) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0.2)  # local writes finishing in their thread
            unwound.append(index)
            raise

    app._commits.commit_safely = commit_safely  # type: ignore[method-assign]

    async def run() -> None:
        callback = asyncio.create_task(app.host.listener.on_rebalance_started(0))
        await until(lambda: app._changes == 1)
        await asyncio.sleep(0.05)
        callback.cancel()
        await asyncio.wait_for(asyncio.gather(callback, return_exceptions=True), 5)
        assert callback.cancelled()
        assert unwound == [0], "the callback returned while its change still unwound"
        assert app._changes == 0 and app._changes_done.is_set() and not app._changing

    asyncio.run(run())


class FrozenProducer(Client):
    """The shared producer holding batches for an unreachable partition leader: its
    ``flush`` never ends (aiokafka never expires them)."""

    def __init__(self) -> None:
        self.flushing = asyncio.Event()

    async def flush(self) -> None:
        self.flushing.set()
        await asyncio.Event().wait()


def test_an_assignment_cancelled_at_stop_leaves_no_store_open(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A task kept open by a sibling consumer is assigned; before the task holds its stores
    the assignment waits for the shared producer's flush, which the broker never answers.
    ``stop()`` cancels it at its grace: the stores it took were held by nothing, so nothing
    closed them (RocksDB's lock held: a new ``App`` of this process could not open them)."""
    app = App(one_store(), {0: Nothing}, bootstrap_servers="x:1", state_dir=tmp_path)
    app.stop_grace = 0.2
    task = TaskId(0, 0)
    # Held here as in a process (the revoked task a record still runs on, the open under
    # way): unreferenced, the garbage collector would close them.
    states = app._stores.open(task)
    app._stores.parked[task] = (states, "kept")
    app.host.consumers.append(Client())  # type: ignore[arg-type]
    producer = FrozenProducer()
    app._clients.producer = producer  # type: ignore[assignment]

    async def run() -> None:
        callback = asyncio.create_task(app.host.listener.on_active_assigned(0, frozenset({task})))
        await asyncio.wait_for(producer.flushing.wait(), 5)
        await asyncio.wait_for(app.stop(), 5)
        await asyncio.wait_for(callback, 1)

    with caplog.at_level(logging.WARNING, logger="streamassign.runtime"):
        asyncio.run(run())
    assert "a task change (assigning tasks) did not end" in caplog.text
    opens_again(tmp_path, task)
    assert states


@pytest.mark.parametrize("change", ["adding standbys", "revoking tasks"])
def test_a_standby_change_cancelled_at_stop_leaves_no_store_open(
    tmp_path: Path, change: str
) -> None:
    """Adding a standby takes its stores (here: kept from a sibling consumer), revoking a
    task wanted as a standby here drops the active, and each then waits for the standbys'
    lock (held here by the test, as by the state updater reading a long batch). Cancelled
    there at stop, the stores belonged to no task and stayed open."""
    app = App(one_store(), {0: Nothing}, bootstrap_servers="x:1", state_dir=tmp_path)
    app.stop_grace = 0.2
    task = TaskId(0, 0)
    states = app._stores.open(task)  # held here (see the test above)
    listener = app.host.listener
    if change == "adding standbys":
        app._stores.parked[task] = (states, "kept")
        callback = listener.on_standby_added(0, frozenset({task}))
    else:
        app._actives[task] = ActiveTask(task, 0, states, Nothing())
        app._standbys.wanted[task] = 1
        callback = listener.on_active_revoked(0, frozenset({task}))

    async def run() -> None:
        async with app._standbys.lock:
            changing = asyncio.create_task(callback)
            await until(lambda: task not in app._stores.parked and task not in app._actives)
            await asyncio.wait_for(app.stop(), 5)
        await asyncio.wait_for(changing, 1)

    asyncio.run(run())
    assert app.failure is None
    opens_again(tmp_path, task)
    assert states  # (held until here, as above)


def one_store() -> Topology:
    return Topology([Subtopology(0, ["events"], stores=["totals"])], name="app")


def opens_again(state_dir: Path, task: TaskId) -> None:
    """A new ``App`` of this process opens ``task``'s stores: the last one closed them (else
    RocksDB's lock, held by this process, refuses the open)."""
    app = App(one_store(), {0: Nothing}, bootstrap_servers="x:1", state_dir=state_dir)
    for state in app._stores.open(task).values():
        state.store.close()


async def until(condition: Callable[[], bool], seconds: float = 5) -> None:
    async with asyncio.timeout(seconds):
        while not condition():
            await asyncio.sleep(0.01)


class JoiningConsumer:
    """A consumer in a join that never ends: ``getmany`` waits for an assignment."""

    def __init__(self) -> None:
        self.asked: list[tuple[object, ...]] = []
        self.cancelled = False

    async def getmany(self, *partitions: object, timeout_ms: int = 0) -> dict[object, list[object]]:
        self.asked.append(partitions)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return {}


def test_a_rebalancing_consumer_polls_for_no_partition_and_stops_without_a_failure(
    tmp_path: Path,
) -> None:
    """While its consumer rebalances, the loop polls (aiokafka rejoins only a
    consumer that polled within ``max_poll_interval_ms``) but asks for a partition never
    assigned, so it takes no record; a stop during that poll (a requested shutdown comes
    inside a rebalance) cancels it and ends the loop with no failure."""
    one = Topology([Subtopology(0, ["events"])], name="app")
    app = App(one, {0: Nothing}, bootstrap_servers="x:1", state_dir=tmp_path)
    consumer = JoiningConsumer()
    app.host.consumers.append(consumer)  # type: ignore[arg-type]
    app._rebalancing.add(0)

    async def run() -> None:
        loop = asyncio.create_task(app._fail_on_error(app._consume(0), "consumer 0"))
        while not consumer.asked:
            await asyncio.sleep(0.01)
        app._stopped.set()
        await asyncio.wait_for(loop, 5)

    asyncio.run(run())
    assert consumer.asked == [(runtime_app._NO_PARTITION,)]
    assert consumer.cancelled and app.failure is None


class _Started(Exception):
    """Raised by a recording consumer's start: the test has what it needs."""


def test_tls_and_sasl_settings_reach_every_client_of_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A secured cluster: the admin client, the restore and changelog readers and the
    high-availability end-offset consumer connect with the group's TLS/SASL settings (before,
    they got ``bootstrap_servers`` only and could not reach such a cluster)."""
    import streamassign.runtime.app as app_module
    import streamassign.runtime.end_offsets as end_offsets_module

    made: list[dict[str, object]] = []
    admins: list[object] = []

    class RecordingConsumer:
        def __init__(self, **config: object) -> None:
            made.append(config)

        async def start(self) -> None:
            raise _Started

    async def no_topics_to_create(
        *args: object, admin_config: object, **kw: object
    ) -> dict[str, int]:
        admins.append(admin_config)
        return {"app-words": 6, "app-counts-changelog": 6, "app-customers-changelog": 3}

    monkeypatch.setattr(app_module, "AIOKafkaConsumer", RecordingConsumer)
    monkeypatch.setattr(end_offsets_module, "AIOKafkaConsumer", RecordingConsumer)

    async def no_limits(*args: object, admin_config: object, **kw: object) -> dict[str, int]:
        admins.append(admin_config)
        return {}

    monkeypatch.setattr(app_module, "ensure_internal_topics", no_topics_to_create)
    monkeypatch.setattr(app_module, "max_message_bytes", no_limits)
    secured = {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "max_poll_records": 5}
    for high_availability in (True, False):
        app = App(
            topology(),
            {0: Nothing, 1: Nothing, 2: Nothing},
            bootstrap_servers="x:1",
            state_dir=tmp_path / str(high_availability),
            store_kind="memory",
            processing_guarantee="exactly_once",  # no shared producer to start
            consumer_config=secured,
            high_availability=high_availability,
        )
        with pytest.raises(_Started):
            asyncio.run(app.start())
    connection = {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN"}
    assert admins == [connection] * 3  # internal topics twice, limits (not HA: no _Started yet)
    assert len(made) == 3  # the end-offset consumer (HA), then the two readers
    for config in made:
        assert {k: config[k] for k in connection} == connection
        assert "max_poll_records" not in config  # the group's settings stay the group's


def test_producer_batches_are_capped_below_the_smallest_topic_limit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A full batch after a backlog must fit every topic written: the default batch size is
    capped below the smallest ``max.message.bytes`` (with headroom), a configured one too,
    with one warning naming the topic and its limit."""
    limits = {"out": 65_536, "app-counts-changelog": 1_048_588, "wide": 2_000_000}
    with caplog.at_level(logging.WARNING, "streamassign.runtime"):
        capped = capped_batches({"acks": "all"}, limits, SHARED_BATCH_BYTES)
        assert capped == {"acks": "all", "max_batch_size": batch_ceiling(65_536)}
        assert not caplog.records  # our default: capped silently
        assert batch_ceiling(65_536) == 65_536 - BATCH_HEADROOM
        assert capped_batches({}, {}, SHARED_BATCH_BYTES)["max_batch_size"] == SHARED_BATCH_BYTES
        small = capped_batches({"max_batch_size": 4096}, limits, SHARED_BATCH_BYTES)
        assert small["max_batch_size"] == 4096 and not caplog.records
        big = capped_batches({"max_batch_size": 1 << 20}, limits, SHARED_BATCH_BYTES)
    assert big["max_batch_size"] == batch_ceiling(65_536)
    (warning,) = caplog.records
    assert "'out'" in warning.getMessage() and "max.message.bytes=65536" in warning.getMessage()
    assert batch_ceiling(1000) == 500  # a tiny limit keeps half of it


def test_written_topics_are_changelogs_repartition_and_sink_topics() -> None:
    assert written_topics(topology()) == [
        "app-counts-changelog",
        "app-customers-changelog",
        "app-words",
    ]


def test_settings_are_checked_once_and_app_keeps_its_attributes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``Settings`` checks and derives; ``App`` exposes what it did before."""
    processors = {0: Nothing, 1: Nothing, 2: Nothing}
    settings = Settings(
        topology=topology(),
        store_kind="memory",
        processors=processors,
        processing_errors="skip",
        processing_guarantee="exactly_once",
        producer_config={"transaction_timeout_ms": 30_000},
        commit_interval_ms=500,
        consumer_config=None,
    )
    assert settings.transaction_timeout_ms == 30_000 and settings.exactly_once
    assert settings.consumer_config == {
        "auto_offset_reset": "earliest",
        "isolation_level": "read_committed",
    }
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        settings.commit_interval_ms = 1  # type: ignore[misc]
    with caplog.at_level(logging.WARNING, "streamassign.runtime"):
        app = App(
            topology(),
            processors,
            bootstrap_servers="x:1",
            state_dir=tmp_path,
            store_kind="memory",
            commit_interval_ms=500,
            consumer_config={"max_poll_records": 7},
        )
    assert not caplog.records  # one store per subtopology: nothing to warn about
    assert (app.commit_interval, app.transaction_timeout) == (0.5, 60.0)
    assert app.consumer_config["max_poll_records"] == 7
    assert app.producer_config == {} and app.processors == processors
    assert app.store_kind == "memory" and app.processing_errors == "stop"


def test_a_record_too_large_for_its_topic_is_refused_before_it_is_sent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``Clients.producer_for`` checks each record against its topic's limit: one too large
    even in a batch of its own raises ``OutputWriteError`` naming task, topic, size and
    limit, and is not sent; a topic without a known limit is not checked, and warned about
    once (list it in sink_topics)."""
    sent: list[tuple[str, int]] = []

    class Producer:
        async def send(self, topic: str, value: bytes, **kw: object) -> None:
            sent.append((topic, len(value)))

    async def scenario() -> None:
        clients = Clients(producer=Producer(), limits={"out": 10_000})  # type: ignore[arg-type]
        producer = await clients.producer_for(TaskId(0, 1))
        assert await clients.producer_for(TaskId(0, 1)) is producer  # one per task
        await producer.send("out", b"x" * (10_000 - 200), key=b"k")  # fits with its header
        with caplog.at_level(logging.WARNING, "streamassign.runtime"):
            for _ in range(2):  # limit unknown: the broker decides; one warning
                await producer.send("elsewhere", b"x" * 25_000)
        (warning,) = caplog.records
        assert "'elsewhere'" in warning.getMessage() and "sink_topics" in warning.getMessage()
        with pytest.raises(OutputWriteError) as refused:
            await producer.send("out", b"x" * 10_000, key=b"k")
        assert str(refused.value).startswith("task 0_1: a record of 10088 bytes to topic 'out'")
        assert "max.message.bytes (10000)" in str(refused.value)

    asyncio.run(scenario())
    assert sent == [("out", 9_800), ("elsewhere", 25_000), ("elsewhere", 25_000)]


def test_a_compressing_producer_leaves_the_size_check_to_the_broker() -> None:
    """The broker applies ``max.message.bytes`` to the compressed batch: a 100,000-byte
    record that compresses well is taken by a 64 KiB topic, so it is sent, not refused."""
    sent: list[int] = []

    class Producer:
        async def send(self, topic: str, value: bytes, **kw: object) -> None:
            sent.append(len(value))

    async def scenario() -> None:
        clients = Clients(producer=Producer(), limits={"out": 65_536}, compressed=True)  # type: ignore[arg-type]
        producer = await clients.producer_for(TaskId(0, 1))
        await producer.send("out", b"x" * 100_000, key=b"k")

    asyncio.run(scenario())
    assert sent == [100_000]


def test_one_topics_describe_error_keeps_the_other_limits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A topic whose config cannot be described (error 29, not authorised) is left out with
    one warning; the other topic's limit is kept (before, every limit was dropped)."""

    def resource(name: str, code: int, limit: int) -> dict[str, object]:
        entries = [{"config_names": "max.message.bytes", "config_value": str(limit)}]
        shown = entries if not code else []
        return {"resource_name": name, "error_code": code, "config_entries": shown}

    class Response:
        def to_object(self) -> dict[str, object]:
            return {"resources": [resource("ok", 0, 65_536), resource("secret", 29, 0)]}

    class Admin:
        async def describe_configs(self, resources: object) -> list[Response]:
            return [Response()]

    with caplog.at_level(logging.WARNING, "streamassign.runtime"):
        limits, missing = asyncio.run(_topic_limits(Admin(), ["ok", "secret"]))
    assert (limits, missing) == ({"ok": 65_536}, [])
    (warning,) = caplog.records
    assert "'secret'" in warning.getMessage()


def test_max_version_pins_the_protocol_every_consumer_speaks(tmp_path: Path) -> None:
    """The protocol pin: ``App(max_version=2)`` reaches every
    assignor, whose first subscription goes out at 2 and says 2 is the latest it supports;
    lowering ``host.max_version`` after construction caps the subscription too."""

    def sent(app: App) -> list[tuple[int, int]]:
        out = []
        for assignor in app.host.assignors:
            info = SubscriptionInfo.decode(
                assignor.metadata(sorted(app.topology.source_topics)).user_data
            )
            out.append((info.version, info.latest_supported_version))
        return out

    pinned = App(
        topology(),
        {0: Nothing, 1: Nothing, 2: Nothing},
        bootstrap_servers="x:1",
        state_dir=tmp_path / "pinned",
        store_kind="memory",
        threads=2,
        max_version=2,
    )
    try:
        assert pinned.host.max_version == 2
        assert sent(pinned) == [(2, 2), (2, 2)]
    finally:
        pinned.host.state.close()
    later = App(
        topology(),
        {0: Nothing, 1: Nothing, 2: Nothing},
        bootstrap_servers="x:1",
        state_dir=tmp_path / "later",
        store_kind="memory",
    )
    try:
        assert sent(later) == [(LATEST_VERSION, LATEST_VERSION)]
        later.host.max_version = 2
        assert sent(later) == [(2, 2)]
    finally:
        later.host.state.close()


@pytest.mark.parametrize("version", [0, -1, 4, True, "2"])
def test_a_protocol_version_no_process_speaks_is_refused(tmp_path: Path, version: object) -> None:
    """A pin outside 1..LATEST_VERSION (0, say) made every assignment look like an upgrade:
    each rejoin rebalanced the whole group. Refused at construction, naming the option."""
    with pytest.raises(RuntimeConfigError, match="max_version must be an int from 1 to 3"):
        App(
            topology(),
            {0: Nothing, 1: Nothing, 2: Nothing},
            bootstrap_servers="x:1",
            state_dir=tmp_path,
            store_kind="memory",
            max_version=version,  # type: ignore[arg-type]
        )
