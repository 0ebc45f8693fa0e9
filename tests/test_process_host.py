"""ProcessHost's bookkeeping without a broker: task change reports survive failures."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from aiokafka.errors import KafkaConnectionError

from streamassign import Subtopology, TaskId, Topology
from streamassign.aiokafka import ProcessHost, TaskListener, closing
from streamassign.errors import ConfigError, ErrorCode
from streamassign.localstate import StateDirectory, StateDirectoryLockedError
from streamassign.protocol import LATEST_OFFSET, AssignmentInfo, SubscriptionInfo

TOPOLOGY = Topology([Subtopology(0, ["in"], stores=["s"])], name="app")
T0, T1, T2 = TaskId(0, 0), TaskId(0, 1), TaskId(0, 2)


class Recorder(TaskListener):
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, frozenset[TaskId]]] = []
        self.fail = fail

    async def on_active_revoked(self, consumer: int, tasks: frozenset[TaskId]) -> None:
        self.calls.append(("revoked", tasks))
        if self.fail:
            raise RuntimeError("listener bug")

    async def on_active_assigned(self, consumer: int, tasks: frozenset[TaskId]) -> None:
        self.calls.append(("assigned", tasks))


def host(tmp_path: Path, listener: TaskListener) -> ProcessHost:
    return ProcessHost(
        TOPOLOGY, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, listener=listener
    )


def test_changes_are_reported_once_and_even_when_a_callback_fails(tmp_path: Path) -> None:
    rec = Recorder(fail=True)
    h = host(tmp_path, rec)
    h.assignors[0].info = AssignmentInfo(active=frozenset({T0}))
    asyncio.run(h._assigned(0))
    h.assignors[0].info = AssignmentInfo(active=frozenset({T1}))
    asyncio.run(h._assigned(0))  # the revoke callback raises; the assign still runs
    asyncio.run(h._assigned(0))  # nothing changed: nothing reported
    assert rec.calls == [
        ("assigned", {T0}),
        ("revoked", {T0}),
        ("assigned", {T1}),
    ]
    assert h.offset_sums() == {T1: LATEST_OFFSET}


def test_a_failing_state_write_loses_no_report(tmp_path: Path) -> None:
    rec = Recorder()
    h = host(tmp_path, rec)

    def full(actives: object) -> None:
        raise OSError(28, "No space left on device")

    h.state.write_assignment = full  # type: ignore[method-assign]
    h.assignors[0].info = AssignmentInfo(active=frozenset({T0}))
    asyncio.run(h._assigned(0))
    assert rec.calls == [("assigned", {T0})]


def test_restart_reports_previous_actives_until_the_first_assignment(tmp_path: Path) -> None:
    h = host(tmp_path, Recorder())
    h.assignors[0].info = AssignmentInfo(active=frozenset({T0, T1}))
    asyncio.run(h._assigned(0))
    h.state.close()
    again = host(tmp_path, Recorder())
    assert again.process_id == h.process_id
    assert again.restored_active(0) == {T0, T1}
    assert again.offset_sums() == {}  # nothing running yet, no checkpoints written


def test_restored_claims_hold_until_every_consumer_is_assigned(tmp_path: Path) -> None:
    """A rebalance that saw only consumer 0 of a restarted process gave it a one-thread share:
    what it could not take back yet stays claimed (and saved) until consumer 1 joins too."""
    first = ProcessHost(TOPOLOGY, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, threads=2)
    first.assignors[0].info = AssignmentInfo(active=frozenset({T0, T2}))
    first.assignors[1].info = AssignmentInfo(active=frozenset({T1}))
    asyncio.run(first._assigned(0))
    asyncio.run(first._assigned(1))
    first.state.close()

    h = ProcessHost(TOPOLOGY, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, threads=2)
    h.assignors[0].info = AssignmentInfo(active=frozenset({T2}))  # only consumer 0 joined
    asyncio.run(h._assigned(0))
    # T2 came back (settled, it runs here); T0 did not fit: still claimed
    assert h.restored_active(0) == {T0} and h.restored_active(1) == {T1}
    claimed = SubscriptionInfo.decode(h.assignors[0].metadata(["in"]).user_data)
    assert claimed.previous_active == {T0, T2}
    h.state.close()
    crashed = ProcessHost(TOPOLOGY, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, threads=2)
    assert crashed.restored_active(0) == {T0, T2} and crashed.restored_active(1) == {T1}
    h = crashed

    h.assignors[0].info = AssignmentInfo(active=frozenset({T0, T2}))  # both joined
    h.assignors[1].info = AssignmentInfo(active=frozenset({T1}))
    asyncio.run(h._assigned(0))
    assert h.restored_active(1) == {T1}  # consumer 1 not assigned yet
    asyncio.run(h._assigned(1))
    assert h.restored_active(0) == frozenset() and h.restored_active(1) == frozenset()
    h.assignors[0].info = AssignmentInfo(active=frozenset({T2}))
    claimed = SubscriptionInfo.decode(h.assignors[0].metadata(["in"]).user_data)
    assert claimed.previous_active == {T2}  # settled: only what it runs


def test_a_claim_handed_back_is_not_made_again_once_the_task_moves_on(tmp_path: Path) -> None:
    """Consumer 0 of a restarted process got T0 back while consumer 1 had not joined yet;
    the leader then gave T0 to another restarted process that claimed it too. The process
    claims T0 no more (nor after a crash): it would take it back a round later, a bounce.
    What it has not got back yet (T2) stays claimed."""
    first = ProcessHost(TOPOLOGY, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, threads=2)
    first.assignors[0].info = AssignmentInfo(active=frozenset({T0, T2}))
    first.assignors[1].info = AssignmentInfo(active=frozenset({T1}))
    asyncio.run(first._assigned(0))
    asyncio.run(first._assigned(1))
    first.state.close()

    h = ProcessHost(TOPOLOGY, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, threads=2)
    h.assignors[0].info = AssignmentInfo(active=frozenset({T0}))  # only consumer 0 joined
    asyncio.run(h._assigned(0))
    h.assignors[0].info = AssignmentInfo()  # T0 went to another process
    asyncio.run(h._assigned(0))
    claimed = SubscriptionInfo.decode(h.assignors[0].metadata(["in"]).user_data)
    assert claimed.previous_active == {T2}
    assert h.restored_active(1) == {T1}
    h.state.close()
    crashed = ProcessHost(TOPOLOGY, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, threads=2)
    assert crashed.restored_active(0) == {T2} and crashed.restored_active(1) == {T1}


def test_a_stopping_process_takes_no_new_tasks_and_claims_none(tmp_path: Path) -> None:
    """While ``stop`` runs, consumers leave one by one and one still in the group can be handed
    its siblings' tasks: it reports only what it gives up, and the restart claims only what
    the process ran before it began stopping."""
    rec = Recorder()
    h = ProcessHost(
        TOPOLOGY, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, threads=2, listener=rec
    )
    h.assignors[0].info = AssignmentInfo(active=frozenset({T0}))
    h.assignors[1].info = AssignmentInfo(active=frozenset({T1}))
    asyncio.run(h._assigned(0))
    asyncio.run(h._assigned(1))
    asyncio.run(h.stop())  # no consumers started: only the flag and the state directory
    h.assignors[1].info = AssignmentInfo(active=frozenset({T0, T2}))  # consumer 0 left first
    asyncio.run(h._assigned(1))
    assert rec.calls == [("assigned", {T0}), ("assigned", {T1}), ("revoked", {T1})]
    assert h.tasks(1).active == frozenset()
    again = host(tmp_path, Recorder())
    assert again.restored_active(0) == {T0} and again.restored_active(1) == {T1}


def test_begin_stop_marks_the_process_stopping_before_stop(tmp_path: Path) -> None:
    """``begin_stop`` alone (what ``App.stop`` calls before its grace period) already keeps
    an assignment from handing the process new tasks or saving them as claims."""
    rec = Recorder()
    h = host(tmp_path, rec)
    h.assignors[0].info = AssignmentInfo(active=frozenset({T0}))
    asyncio.run(h._assigned(0))
    assert not h.stopping
    h.begin_stop()
    assert h.stopping
    h.assignors[0].info = AssignmentInfo(active=frozenset({T0, T1}))  # a sibling left
    asyncio.run(h._assigned(0))
    assert rec.calls == [("assigned", {T0})] and h.tasks(0).active == {T0}
    h.state.close()
    assert host(tmp_path, Recorder()).restored_active(0) == {T0}


def test_concurrent_saves_leave_the_newest_assignment(tmp_path: Path) -> None:
    """Both consumers of a process are assigned at once and save in threads: a slow first
    save must not land after the second and leave a task the process handed back claimed."""
    h = ProcessHost(TOPOLOGY, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, threads=2)
    h.assignors[0].info = AssignmentInfo(active=frozenset({T0, T2}))
    h.assignors[1].info = AssignmentInfo(active=frozenset({T1}))
    asyncio.run(h._assigned(0))
    asyncio.run(h._assigned(1))
    write, calls = h.state.write_assignment, []

    def slow_first(actives: dict[int, frozenset[TaskId]]) -> None:
        calls.append(actives)
        if len(calls) == 1:
            time.sleep(0.3)  # the thread of the first save is descheduled
        write(actives)

    h.state.write_assignment = slow_first  # type: ignore[method-assign]
    h.assignors[0].info = AssignmentInfo(active=frozenset({T0}))  # T2 handed back
    h.assignors[1].info = AssignmentInfo(active=frozenset())  # T1 handed back

    async def both() -> None:
        await asyncio.gather(h._assigned(1), h._assigned(0))

    asyncio.run(both())
    assert h.state.read_assignment() == {0: {T0}, 1: frozenset()}


def test_state_directory_is_locked_to_one_process(tmp_path: Path) -> None:
    first = StateDirectory(tmp_path)
    with pytest.raises(StateDirectoryLockedError, match="in use by another process"):
        StateDirectory(tmp_path)
    first.close()
    StateDirectory(tmp_path).close()


def test_leader_racks_come_from_the_cluster_metadata_and_never_fail_the_assignment() -> None:
    from types import SimpleNamespace

    from aiokafka.structs import BrokerMetadata

    from streamassign import TopicPartition
    from streamassign.aiokafka.streams import _leader_racks

    brokers = {1: BrokerMetadata(1, "h1", 9092, "east"), 2: BrokerMetadata(2, "h2", 9092, None)}
    cluster = SimpleNamespace(
        leader_for_partition=lambda tp: 1 if tp.partition == 0 else 2,
        broker_metadata=brokers.get,
    )
    assert _leader_racks(cluster, {"orders": 2}) == {TopicPartition("orders", 0): "east"}
    assert _leader_racks(SimpleNamespace(), {"orders": 2}) == {}  # unreadable: no hint


class MetadataClient:
    """What ``MetadataWatch`` and ``refresh_metadata`` reach: the client's forced refreshes
    (counted) and its cluster metadata (``known`` topics have 1 partition)."""

    def __init__(self, known: set[str]) -> None:
        self.refreshes = 0
        self.known = known
        self.cluster = self

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return {0} if topic in self.known else None

    def add_topic(self, topic: str) -> None: ...

    def force_metadata_update(self) -> None:
        self.refreshes += 1


class StubConsumer:
    def __init__(self, known: set[str]) -> None:
        self._client = MetadataClient(known)
        self._coordinator = SimpleNamespace(request_rejoin=lambda: None)

    async def stop(self) -> None: ...


def test_missing_topics_are_logged_once_and_their_metadata_refetched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Answers of INCOMPLETE_SOURCE_TOPIC_METADATA: one ERROR line naming the topic this
    consumer lacks too (not one per retry); its metadata re-fetched, and again at each join
    (a leader waits for that refresh before assigning); one INFO line when tasks arrive."""
    topology = Topology([Subtopology(0, ["in"]), Subtopology(1, ["gone"])], name="app")
    h = ProcessHost(topology, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path)
    consumer = StubConsumer({"in"})
    h.consumers.append(consumer)  # type: ignore[arg-type]
    assignor = h.assignors[0]
    assignor.rejoiner.bind(consumer)
    incomplete = AssignmentInfo(error_code=ErrorCode.INCOMPLETE_SOURCE_TOPIC_METADATA).encode()

    async def scenario() -> tuple[int, int, int]:
        for _ in range(3):
            assignor.on_assignment(ConsumerProtocolMemberAssignment(0, [], incomplete))
        assert assignor.metadata_watch.topics == {"gone"}
        watched = consumer._client.refreshes
        assignor.metadata(["gone", "in"])
        joined = consumer._client.refreshes
        consumer._client.known.add("gone")
        assignor.on_assignment(ConsumerProtocolMemberAssignment(0, [], AssignmentInfo().encode()))
        assignor.metadata(["gone", "in"])
        after = consumer._client.refreshes
        assert assignor.metadata_watch._timer is None  # tasks came: no more re-fetches
        await h.stop()
        return watched, joined, after

    with caplog.at_level(logging.DEBUG, "streamassign.aiokafka"):
        watched, joined, after = asyncio.run(scenario())
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    assert "INCOMPLETE_SOURCE_TOPIC_METADATA" in errors[0]
    assert "source topics missing here too: gone" in errors[0]
    assert watched == 1  # the watch started once, not again at each retry
    assert joined == watched + 1 and after == joined  # only a member in error refreshes
    assert "tasks assigned after 3 rebalance(s) answered INCOMPLETE" in caplog.text


def test_the_leader_logs_a_missing_source_topic_once_whichever_consumer_leads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The leader logged "cannot assign tasks" at ERROR at every rebalance while a source
    topic was missing (members retry every 1 to 30 s): once per process now, whichever of its
    consumers leads, the repeats at DEBUG, and one INFO line once the topic exists."""
    topology = Topology([Subtopology(0, ["in"]), Subtopology(1, ["gone"])], name="app")
    h = ProcessHost(topology, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, threads=2)
    members = {
        f"m{i}": ConsumerProtocolMemberMetadata(
            0, ["gone", "in"], SubscriptionInfo(uuid.UUID(int=i)).encode()
        )
        for i in (1, 2)
    }
    counts = {"in": 2}
    cluster = SimpleNamespace(partitions_for_topic=lambda t: set(range(counts.get(t, 0))))
    with caplog.at_level(logging.DEBUG, "streamassign.streams"):
        for leader in (0, 0, 1):
            h.assignors[leader].assign(cluster, members)
        counts["gone"] = 2
        h.assignors[1].assign(cluster, members)
    logged = [
        (r.levelno, r.getMessage()) for r in caplog.records if r.name == "streamassign.streams"
    ]
    assert [level for level, _ in logged] == [
        logging.ERROR,
        logging.DEBUG,
        logging.DEBUG,
        logging.INFO,
    ]
    assert "missing source topics (no partition count known): gone" in logged[0][1]
    assert "assigning tasks again" in logged[3][1]
    h.state.close()


def test_the_leader_logs_a_topology_error_as_news_after_another_process_led(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What this process logged as leader is forgotten once another process leads (as the
    Faust assignor forgets it): the same incident later, this process leading again, is at
    ERROR, not DEBUG, and an incident another leader saw end gets no late INFO line."""
    topology = Topology([Subtopology(0, ["in"]), Subtopology(1, ["gone"])], name="app")
    h = ProcessHost(topology, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, threads=1)
    subscription = SubscriptionInfo(uuid.UUID(int=1)).encode()
    members = {"m1": ConsumerProtocolMemberMetadata(0, ["gone", "in"], subscription)}
    counts = {"in": 2}
    cluster = SimpleNamespace(partitions_for_topic=lambda t: set(range(counts.get(t, 0))))
    led_elsewhere = ConsumerProtocolMemberAssignment(0, [], AssignmentInfo().encode())
    with caplog.at_level(logging.DEBUG, "streamassign.streams"):
        h.assignors[0].assign(cluster, members)  # ERROR
        h.assignors[0].on_assignment(led_elsewhere)  # a generation another process led
        h.assignors[0].assign(cluster, members)  # the same incident, leading again: ERROR
        h.assignors[0].on_assignment(led_elsewhere)
        counts["gone"] = 2  # ended while another process led
        h.assignors[0].assign(cluster, members)
    logged = [r.levelno for r in caplog.records if r.name == "streamassign.streams"]
    assert logged == [logging.ERROR, logging.ERROR]
    h.state.close()


def _led_by_consumer_0(h: ProcessHost) -> SimpleNamespace:
    """``h``'s one consumer with a coordinator whose generation a test sets: an assignment of
    the generation the host led is its own round, one of another generation another leader's."""
    coordinator = SimpleNamespace(member_id="m1", generation=1)
    h.consumers = [SimpleNamespace(_coordinator=coordinator)]  # type: ignore[list-item]
    return coordinator


def test_rounds_this_process_led_keep_what_it_logged_as_leader(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An assignment of a generation this process led is its own plan: what it logged then
    stays known, so the same missing topic at its next rounds is at DEBUG."""
    topology = Topology([Subtopology(0, ["in"]), Subtopology(1, ["gone"])], name="app")
    h = ProcessHost(topology, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, threads=1)
    coordinator = _led_by_consumer_0(h)
    subscription = SubscriptionInfo(uuid.UUID(int=1)).encode()
    members = {"m1": ConsumerProtocolMemberMetadata(0, ["gone", "in"], subscription)}
    cluster = SimpleNamespace(partitions_for_topic=lambda t: {0, 1} if t == "in" else set())
    with caplog.at_level(logging.DEBUG, "streamassign.streams"):
        for generation in (1, 2, 3):
            coordinator.generation = generation
            out = h.assignors[0].assign(cluster, members)
            h.assignors[0].on_assignment(ConsumerProtocolMemberAssignment.decode(out["m1"]))
    logged = [r.levelno for r in caplog.records if r.name == "streamassign.streams"]
    assert logged == [logging.ERROR, logging.DEBUG, logging.DEBUG]
    h.state.close()


def test_a_shared_process_id_is_news_again_after_another_process_led(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A clash (one process id, two endpoints) this process warned of as leader is forgotten
    once another process leads, as the topology error is (and as the Faust assignor forgets
    it): leading again, the same clash is a WARNING, not DEBUG; leading on, DEBUG."""
    h = ProcessHost(
        Topology([Subtopology(0, ["in"])], name="app"),
        bootstrap_servers="127.0.0.1:1",
        state_dir=tmp_path,
        threads=1,
    )
    coordinator = _led_by_consumer_0(h)
    pid = uuid.UUID(int=7)
    members = {
        m: ConsumerProtocolMemberMetadata(0, ["in"], SubscriptionInfo(pid, endpoint=e).encode())
        for m, e in (("m1", "a:1"), ("m2", "b:1"))
    }
    cluster = SimpleNamespace(partitions_for_topic=lambda t: {0, 1})
    led_elsewhere = ConsumerProtocolMemberAssignment(0, [], AssignmentInfo().encode()).encode()
    with caplog.at_level(logging.DEBUG, "streamassign.streams"):
        for generation, led_here in ((1, True), (2, False), (3, True), (4, True)):
            coordinator.generation = generation
            got = h.assignors[0].assign(cluster, members)["m1"] if led_here else led_elsewhere
            h.assignors[0].on_assignment(ConsumerProtocolMemberAssignment.decode(got))
    logged = [r.levelno for r in caplog.records if "announced with" in r.getMessage()]
    assert logged == [logging.WARNING, logging.WARNING, logging.DEBUG]
    h.state.close()


class Remembering(list[Any]):
    """A list that also keeps every item ever appended in ``seen``."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Any] = []

    def append(self, item: Any) -> None:
        self.seen.append(item)
        super().append(item)


def test_a_failed_start_stops_the_consumers_it_started(tmp_path: Path) -> None:
    """No broker answers: start raises aiokafka's error and leaves no consumer open."""
    h = ProcessHost(TOPOLOGY, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, threads=2)
    consumers = Remembering()
    h.consumers = consumers

    async def scenario() -> None:
        with pytest.raises(KafkaConnectionError):
            await h.start()

    asyncio.run(scenario())
    assert len(consumers.seen) == 2 and all(c._closed for c in consumers.seen)
    assert h.consumers == []


def test_a_failed_start_waits_for_the_other_starts_before_stopping(tmp_path: Path) -> None:
    """One consumer fails at once while another is still starting: the other is stopped only
    after its start ended (stopped before, it would finish starting and run on, closed)."""
    h = ProcessHost(TOPOLOGY, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, threads=2)
    events: list[str] = []

    class Instrumented(Remembering):
        def append(self, item: Any) -> None:
            index = len(self.seen)
            stop = item.stop

            async def start() -> None:
                if index == 0:
                    raise KafkaConnectionError("consumer 0 cannot start")
                await asyncio.sleep(0.2)  # a slower bootstrap
                events.append(f"started {index}")

            async def stopped() -> None:
                events.append(f"stop {index}")
                await stop()

            item.start, item.stop = start, stopped
            super().append(item)

    h.consumers = Instrumented()

    async def scenario() -> None:
        with pytest.raises(KafkaConnectionError, match="consumer 0"):
            await h.start()

    asyncio.run(scenario())
    assert events.index("started 1") < events.index("stop 1")
    assert h.consumers == []


class Closes:
    """aiokafka's consumer parts that ``closing.release_consumer`` closes, recording it."""

    def __init__(self, closed: list[str], name: str) -> None:
        self.closed, self.name = closed, name

    async def close(self) -> None:
        self.closed.append(self.name)

    async def _stop_heartbeat_task(self) -> None:
        self.closed.append("heartbeat")

    async def _stop_commit_offsets_refresh_task(self) -> None:
        self.closed.append("commit refresh")


class UnansweredStop:
    """A consumer whose stop waits for a broker that never answers (aiokafka's JoinGroup
    after a rebalance callback waits ``request_timeout_ms``, 40 s by default)."""

    def __init__(self) -> None:
        self.closed: list[str] = []
        self.cut = False
        self._coordinator = Closes(self.closed, "coordinator")
        self._fetcher = Closes(self.closed, "fetcher")
        self._client = Closes(self.closed, "client")

    async def stop(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cut = True
            raise


class PromptStop:
    def __init__(self) -> None:
        self.stopped = False

    async def stop(self) -> None:
        self.stopped = True


def test_stop_bounds_a_consumer_stop_the_broker_never_answers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``stop`` waited for every consumer's stop, which waits for the broker's answer to a
    JoinGroup (40 s) or for ever (a stub's). Each consumer's stop now takes at most
    ``CLOSE_TIMEOUT``: the one cut is named in one line and what it left running is closed
    (heartbeat, fetcher, connections); the other stops as before."""
    monkeypatch.setattr(closing, "CLOSE_TIMEOUT", 0.2)
    h = ProcessHost(TOPOLOGY, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, threads=2)
    hanging, prompt = UnansweredStop(), PromptStop()
    h.consumers.extend([hanging, prompt])  # type: ignore[list-item]
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, "streamassign.aiokafka"):
        asyncio.run(asyncio.wait_for(h.stop(), 10))
    assert time.monotonic() - started < 5
    assert hanging.cut and prompt.stopped
    assert hanging.closed == ["heartbeat", "commit refresh", "fetcher", "client"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "consumer 0 did not stop within 0.2 s (broker unreachable?): its group requests are "
        "abandoned (the group drops it at its session timeout)"
    ]
    assert h.consumers == []


@pytest.mark.parametrize("version", [0, -1, 4, True, "2"])
def test_a_protocol_version_no_process_speaks_is_refused(tmp_path: Path, version: object) -> None:
    """A pin outside 1..LATEST_VERSION made every assignment look like an upgrade, and each
    rejoin rebalanced the whole group: refused at construction, naming the option."""
    with pytest.raises(ConfigError, match="max_version must be an int from 1 to 3"):
        ProcessHost(
            TOPOLOGY,
            bootstrap_servers="127.0.0.1:1",
            state_dir=tmp_path,
            max_version=version,  # type: ignore[arg-type]
        )


def test_a_pinned_member_handed_a_higher_common_version_stays_without_a_rejoin(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A member pinned at 2 that a leader's assignment says could speak 3 stays at 2: an
    "upgrade" to its own version would rejoin, and rebalance the group, for nothing."""
    h = ProcessHost(TOPOLOGY, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, max_version=2)
    assignor = h.assignors[0]
    newer = AssignmentInfo(version=3, common_version=3).encode()
    with caplog.at_level(logging.INFO, "streamassign.aiokafka"):
        assignor.on_assignment(ConsumerProtocolMemberAssignment(0, [], newer))
    assert assignor.version == 2
    assert not [r for r in caplog.records if "upgraded" in r.getMessage()]
    h.state.close()
