"""A member that lost its membership, or a changelog written by someone else, without a broker.

One in-memory log stands in for the producer and the restore consumer (a unit test of the
commit and resume logic; ``tests/integration/test_runtime_membership.py`` runs the real
scenarios). Checked: no marker while another writer's records sit after the owner's (unless
the broker confirms the owner: then its values follow them), a marker that lands after them is
followed by the owner's values unless the broker refuses the member, a member the broker no
longer knows commits nothing, a task resumes without restore only if its changelog ends where
its owner's records end, and the host reports a lost membership.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.errors import (
    BrokerNotAvailableError,
    CommitFailedError,
    MessageSizeTooLargeError,
    NotEnoughReplicasError,
    RequestTimedOutError,
    TopicAuthorizationFailedError,
    UnknownError,
)

from streamassign import Subtopology, TaskId, TopicPartition, Topology
from streamassign.aiokafka import ProcessHost, TaskListener
from streamassign.assignment import ClientAssignment
from streamassign.errors import ChangelogReadTimeoutError, OutputWriteError
from streamassign.protocol import LATEST_OFFSET, AssignmentInfo
from streamassign.runtime import COMMIT_KEY, App, MemoryStore, StoreState
from streamassign.runtime import commits as commits_module
from streamassign.runtime.changelog import encode_marker
from streamassign.runtime.tasks import ActiveTask

from .test_runtime_processing import Adder, Committer, Rec

TASK = TaskId(0, 0)
CHANGELOG = ("app-totals-changelog", 0)


class Log:
    """Partitions in memory, written through ``send`` (a producer whose records are
    acknowledged at once) and read like a restore consumer."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, int], list[tuple[bytes | None, bytes | None]]] = defaultdict(
            list
        )
        self.assigned: list[KafkaTopicPartition] = []
        self.positions: dict[KafkaTopicPartition, int] = {}
        #: Called after each end offset lookup (another writer strikes then).
        self.after_ends: Any = None

    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Any = None,
    ) -> asyncio.Future[Any]:
        log = self.records[(topic, partition or 0)]
        log.append((key, value))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(SimpleNamespace(offset=len(log) - 1))
        return future

    async def flush(self) -> None:
        pass

    def assign(self, tps: list[KafkaTopicPartition]) -> None:
        """As aiokafka's: every partition starts without a position (even one assigned
        before)."""
        self.assigned = list(tps)
        self.positions = {}

    def seek(self, tp: KafkaTopicPartition, offset: int) -> None:
        self.positions[tp] = offset

    async def position(self, tp: KafkaTopicPartition) -> int:
        if tp not in self.assigned:  # as aiokafka's IllegalStateError
            raise AssertionError(f"{tp} is not assigned")
        while tp not in self.positions:  # aiokafka waits for a reset (a broker round trip)
            await asyncio.sleep(0.01)
            if tp in self.assigned:
                self.positions.setdefault(tp, 0)  # auto_offset_reset="earliest"
        return self.positions[tp]

    async def end_offsets(self, tps: list[KafkaTopicPartition]) -> dict[KafkaTopicPartition, int]:
        ends = {tp: len(self.records[(tp.topic, tp.partition)]) for tp in tps}
        if self.after_ends is not None:
            self.after_ends()
        return ends

    async def getmany(
        self, *tps: KafkaTopicPartition, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[Any, Any]:
        out = {}
        left = max_records if max_records is not None else float("inf")
        for tp in tps or self.assigned:
            start = self.positions.setdefault(tp, 0)  # auto_offset_reset="earliest"
            new = self.records[(tp.topic, tp.partition)][start:]
            new = new[: int(min(left, len(new)))]
            left -= len(new)
            out[tp] = [
                SimpleNamespace(offset=start + i, key=k, value=v) for i, (k, v) in enumerate(new)
            ]
            self.positions[tp] = start + len(new)
        return out

    def markers(self) -> int:
        return sum(1 for key, _ in self.records[CHANGELOG] if key == COMMIT_KEY)

    def replay(self) -> dict[bytes, bytes]:
        """The table a cold restore of the changelog gives."""
        state = StoreState.open("totals", TopicPartition(*CHANGELOG), MemoryStore())
        for offset, (key, value) in enumerate(self.records[CHANGELOG]):
            state.restore(offset, key, value)
        return dict(state.store.items())


def make(
    tmp_path: Path, stores: tuple[str, ...] = ("totals",), processor: Any = None
) -> tuple[App, Log, Committer, list[int]]:
    topology = Topology([Subtopology(0, ["events"], stores=list(stores))], name="app")
    app = App(
        topology,
        {0: processor or Adder},
        bootstrap_servers="unused:1",
        state_dir=tmp_path,
        store_kind="memory",
    )
    log = Log()
    app._clients.producer = log  # type: ignore[assignment]
    app._clients.restorer = log  # type: ignore[assignment]
    app._clients.changelog_reader = log  # type: ignore[assignment]
    committer = Committer()
    app.host.consumers.append(committer)  # type: ignore[arg-type]
    rejoins: list[int] = []
    app.host.request_rejoin = rejoins.append  # type: ignore[method-assign]
    return app, log, committer, rejoins


async def start(app: App) -> ActiveTask:
    await app._start_tasks(0, [(TASK, app._stores.open(TASK), "cold")])
    assert app._actives[TASK].restoring  # its input paused until the state updater is done
    await app._updater.settle()
    return app._actives[TASK]


async def commit_twice(app: App, log: Log, between: Callable[[], None]) -> ActiveTask:
    """The task commits k = 5, then processes k = 10 and commits again; ``between`` runs after
    that commit's changelog end check (another writer's records land there)."""
    task = await start(app)
    await app._processing.process(task, Rec(0, b"k", b"5"))
    await app._commits.commit(0)
    await app._processing.process(task, Rec(1, b"k", b"5"))
    log.after_ends = between
    await app._commits.commit(0)
    return task


def test_no_marker_when_another_writer_wrote_the_changelog(tmp_path: Path) -> None:
    app, log, committer, rejoins = make(tmp_path)

    async def run() -> ActiveTask:
        task = await start(app)
        await app._processing.process(task, Rec(0, b"k", b"5"))
        log.records[CHANGELOG].append((b"k", b"99"))  # a zombie's write
        await app._commits.commit(0)
        assert task.torn and log.markers() == 0 and committer.commits == []
        assert rejoins == [0]
        app._suspended[0] = frozenset({TASK})
        await app._rebalance_completed(0)  # the task stayed here: restored, not resumed
        await app._updater.settle()
        again = app._actives[TASK]
        assert again is not task and not again.torn
        await app._processing.process(again, Rec(0, b"k", b"5"))  # its input is read again
        await app._commits.commit(0)
        return again

    again = asyncio.run(run())
    assert app.restore_events[-1].compensated == 2  # ours and the zombie's key undone
    assert dict(again.stores["totals"].store.items()) == {b"k": b"5", b"k-copy": b"5"}
    assert log.replay() == {b"k": b"5", b"k-copy": b"5"}


def test_a_marker_landing_after_foreign_records_is_followed_by_the_owners_values(
    tmp_path: Path,
) -> None:
    app, log, committer, rejoins = make(tmp_path)

    def strike() -> None:  # between the owner's check and its marker
        log.records[CHANGELOG].append((b"k", b"99"))
        log.records[CHANGELOG].append((b"zombie-only", b"1"))
        log.after_ends = None

    async def run() -> ActiveTask:
        task = await start(app)
        await app._processing.process(task, Rec(0, b"k", b"5"))
        log.after_ends = strike
        await app._commits.commit(0)
        return task

    task = asyncio.run(run())
    state = task.stores["totals"]
    assert not task.torn and rejoins == []
    assert log.markers() == 2  # the one that closed the foreign records, and ours after them
    assert log.replay() == {b"k": b"5", b"k-copy": b"5"}  # the zombie's writes undone
    assert dict(state.store.items()) == log.replay()
    assert state.position == state.end == len(log.records[CHANGELOG])
    assert committer.commits == [{KafkaTopicPartition("events", 0): 1}]


class Fence(Committer):
    """A consumer whose offset commits the group coordinator refuses once ``refuse`` is set
    (an evicted member, a stale generation)."""

    refuse = False

    async def commit(self, offsets: dict[Any, int]) -> None:
        if self.refuse:
            raise CommitFailedError("the group has already rebalanced")
        await super().commit(offsets)


def fenced(
    tmp_path: Path, stores: tuple[str, ...] = ("totals",), processor: Any = None
) -> tuple[App, Log, Fence, list[int]]:
    app, log, _, rejoins = make(tmp_path, stores, processor)
    fence = Fence()
    app.host.consumers[0] = fence  # type: ignore[call-overload]
    return app, log, fence, rejoins


def applied(log: Log) -> dict[str, int]:
    """The applied offsets a cold restore of the changelog ends with."""
    state = StoreState.open("totals", TopicPartition(*CHANGELOG), MemoryStore())
    for offset, (key, value) in enumerate(log.records[CHANGELOG]):
        state.restore(offset, key, value)
    return state.applied


def test_a_zombie_whose_marker_lands_late_is_refused_and_writes_nothing_more(
    tmp_path: Path,
) -> None:
    """Frozen after its end check, the member's marker lands after the new owner's records:
    the broker refuses its fence (an offset commit it made already), so its stale values are
    not written again and its tasks are torn."""
    app, log, fence, rejoins = fenced(tmp_path)

    def new_owner() -> None:  # between the zombie's check and its marker
        log.records[CHANGELOG].append((b"k", b"7"))
        log.records[CHANGELOG].append((COMMIT_KEY, encode_marker({"events": 9})))
        log.after_ends = None
        fence.refuse = True

    task = asyncio.run(commit_twice(app, log, new_owner))
    records = log.records[CHANGELOG]
    # Its records (k, k-copy), the new owner's two, its marker, and nothing after it.
    assert records[-1][0] == COMMIT_KEY and records[-2] == (
        COMMIT_KEY,
        encode_marker({"events": 9}),
    )
    assert len(records) == 3 + 2 + 2 + 1  # first commit: 2 writes + marker
    assert task.torn and rejoins == [0]
    assert fence.commits == [{KafkaTopicPartition("events", 0): 1}]  # the input not committed
    assert task.stores["totals"].pending == {}


@pytest.mark.parametrize("accepted", [True, False])
def test_an_owner_finding_a_zombie_s_records_after_its_own_writes_its_state_after_them(
    tmp_path: Path, accepted: bool
) -> None:
    """A zombie's stale write and marker (older applied offsets) after the owner's
    uncommitted records: the owner the broker confirms keeps the task and writes its values
    and its marker after them, so a restore ends at its state and its applied offsets (no
    input applied twice); refused, it writes nothing and its tasks are torn."""
    app, log, fence, rejoins = fenced(tmp_path)

    async def run() -> ActiveTask:
        task = await start(app)
        await app._processing.process(task, Rec(0, b"k", b"5"))
        await app._commits.commit(0)
        await app._processing.process(task, Rec(1, b"k", b"5"))  # k = 10, not committed
        log.records[CHANGELOG].append((b"k", b"5"))  # the zombie's stale value
        log.records[CHANGELOG].append((COMMIT_KEY, encode_marker({"events": 0})))
        fence.refuse = not accepted
        await app._commits.commit(0)
        return task

    task = asyncio.run(run())
    offsets = [{KafkaTopicPartition("events", 0): o} for o in (1, 1, 1, 2)]
    if not accepted:
        assert task.torn and rejoins == [0] and log.markers() == 2  # its first, the zombie's
        assert fence.commits == offsets[:1]
        return
    state = task.stores["totals"]
    assert not task.torn and rejoins == []
    assert log.replay() == {b"k": b"10", b"k-copy": b"10"} == dict(state.store.items())
    assert applied(log) == {"events": 1}  # a restore skips both inputs
    assert state.position == state.end == len(log.records[CHANGELOG])
    # the fence commits again what was committed: at the end check and before writing over
    assert fence.commits == offsets
    # Its value of k (the only key whose last value was not its own), then one marker: no
    # marker of its own between the zombie's records and its values (a crash there would
    # restore the zombie's k).
    assert log.records[CHANGELOG][-2:] == [(b"k", b"10"), (COMMIT_KEY, encode_marker(applied(log)))]
    assert log.markers() == 3  # its first commit's, the zombie's, this commit's


def test_a_member_the_broker_no_longer_knows_commits_nothing(tmp_path: Path) -> None:
    app, log, committer, _ = make(tmp_path)
    app.host._memberships[0] = ("member-1", 3)
    committer._coordinator = SimpleNamespace(member_id="member-1", generation=3)  # type: ignore[attr-defined]

    async def run() -> ActiveTask:
        task = await start(app)
        await app._processing.process(task, Rec(0, b"k", b"5"))
        committer._coordinator.member_id, committer._coordinator.generation = "", -1  # type: ignore[attr-defined]
        await app._rebalance_started(0)  # aiokafka reset the membership, then revokes
        return task

    task = asyncio.run(run())
    assert task.torn and log.markers() == 0 and committer.commits == []
    assert task.stores["totals"].pending == {}


def test_a_task_resumes_without_restore_only_if_its_changelog_is_where_it_left_it(
    tmp_path: Path,
) -> None:
    app, log, _, _ = make(tmp_path)

    async def rebalance(foreign: bool) -> ActiveTask:
        task = app._actives[TASK]
        await app._processing.process(task, Rec(task.processed + 10 * foreign, b"k", b"1"))
        await app._rebalance_started(0)
        if foreign:  # another owner committed meanwhile
            await log.send(CHANGELOG[0], b"7", key=b"k", partition=0)
            await log.send(CHANGELOG[0], b'{"applied":{"events":50}}', key=COMMIT_KEY, partition=0)
        app._rebalancing.add(0)
        await app._rebalance_completed(0)
        await app._updater.settle()
        return app._actives[TASK]

    async def run() -> tuple[ActiveTask, ActiveTask, ActiveTask]:
        first = await start(app)
        return first, await rebalance(foreign=False), await rebalance(foreign=True)

    first, kept, restored = asyncio.run(run())
    assert kept is first  # resumed as it was
    assert restored is not first  # restored: it holds the other owner's write
    assert restored.stores["totals"].get(b"k") == b"7"
    assert [e.source for e in app.restore_events] == ["cold", "kept"]
    assert 0 not in app._rebalancing


class Lost(TaskListener):
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def on_membership_lost(self, consumer: int) -> None:
        self.calls.append("lost")

    async def on_active_assigned(self, consumer: int, tasks: frozenset[TaskId]) -> None:
        self.calls.append("assigned")


def test_the_host_reports_a_new_member_id_before_the_tasks(tmp_path: Path) -> None:
    listener = Lost()
    topology = Topology([Subtopology(0, ["events"], stores=["totals"])], name="app")
    host = ProcessHost(
        topology, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path, listener=listener
    )
    consumer = SimpleNamespace(_coordinator=SimpleNamespace(member_id="m1", generation=1))
    host.consumers.append(consumer)  # type: ignore[arg-type]
    host.assignors[0].info = AssignmentInfo(active=frozenset({TASK}))
    asyncio.run(host._assigned(0))
    assert not host.member_lost(0)
    consumer._coordinator.generation = 2  # a rebalance it took part in: same member
    asyncio.run(host._assigned(0))
    consumer._coordinator.member_id, consumer._coordinator.generation = "", -1
    assert host.member_lost(0)  # evicted, as aiokafka learnt from a heartbeat
    consumer._coordinator.member_id, consumer._coordinator.generation = "m2", 5
    host.assignors[0].info = AssignmentInfo(active=frozenset({TASK, TaskId(0, 1)}))
    asyncio.run(host._assigned(0))
    assert listener.calls == ["assigned", "lost", "assigned"]
    assert not host.member_lost(0)


def test_the_app_reports_its_restoring_and_torn_actives_by_their_store_positions(
    tmp_path: Path,
) -> None:
    """Through its host's subscription: an active still restoring, or torn because its
    consumer was out of the group, is local state at its store's position (not running, as
    Kafka Streams reports only running actives so); a restored one runs (``LATEST_OFFSET``)."""
    app, log, _, _ = make(tmp_path)
    app.host._known[0] = ClientAssignment(active=frozenset({TASK}))

    async def run() -> list[dict[TaskId, int]]:
        await log.send(CHANGELOG[0], b"3", key=b"k", partition=0)
        await log.send(CHANGELOG[0], b'{"applied":{"events":0}}', key=COMMIT_KEY, partition=0)
        await app._start_tasks(0, [(TASK, app._stores.open(TASK), "cold")])
        restoring = app.host.offset_sums()
        await app._updater.settle()
        task = app._actives[TASK]
        await app._processing.process(task, Rec(1, b"k", b"4"))
        await app._commits.commit(0)
        running = app.host.offset_sums()
        await app._membership_lost(0)
        return [restoring, running, app.host.offset_sums()]

    restoring, running, torn = asyncio.run(run())
    assert restoring == {TASK: 0}  # cold: nothing applied yet
    assert running == {TASK: LATEST_OFFSET}
    # Its committed position: past its own commit (its marker), not the restored one (2).
    assert (
        torn
        == {TASK: app._actives[TASK].stores["totals"].position}
        == {TASK: len(log.records[CHANGELOG])}
    )


def test_a_task_moved_between_consumers_is_checked_against_its_changelog(
    tmp_path: Path,
) -> None:
    """With two consumers, a task moves from consumer 0 (out of the group without noticing,
    its callbacks come later) to consumer 1 while another member wrote its changelog: it is
    restored, not resumed on consumer 0's stale state."""
    topology = Topology([Subtopology(0, ["events"], stores=["totals"])], name="app")
    app = App(
        topology,
        {0: Adder},
        bootstrap_servers="unused:1",
        state_dir=tmp_path,
        store_kind="memory",
        threads=2,
    )
    log = Log()
    app._clients.producer = log  # type: ignore[assignment]
    app._clients.restorer = log  # type: ignore[assignment]
    app._clients.changelog_reader = log  # type: ignore[assignment]
    app.host.consumers.extend([Committer(), Committer()])  # type: ignore[list-item]
    app.host.request_rejoin = lambda consumer: None  # type: ignore[method-assign]

    async def run() -> tuple[ActiveTask, ActiveTask]:
        first = await start(app)
        await app._processing.process(first, Rec(0, b"k", b"5"))
        await app._commits.commit(0)
        log.records[CHANGELOG].append((b"k", b"1000"))  # the other member's write and commit
        log.records[CHANGELOG].append((COMMIT_KEY, encode_marker({"events": 50})))
        await app._rebalance_started(1)
        await app._assign(1, frozenset({TASK}))  # consumer 1's callbacks first
        await app._rebalance_completed(1)
        await app._updater.settle()
        return first, app._actives[TASK]

    first, now = asyncio.run(run())
    assert first.torn and now is not first and now.consumer == 1
    assert now.stores["totals"].get(b"k") == b"1000"
    assert [e.source for e in app.restore_events] == ["cold", "kept"]


@pytest.mark.parametrize(
    ("error", "stops"),
    [
        (UnknownError, False),
        (BrokerNotAvailableError, False),
        (NotEnoughReplicasError, False),
        (MessageSizeTooLargeError, True),
        (TopicAuthorizationFailedError, True),
    ],
)
def test_only_a_permanent_refusal_of_a_write_stops_the_app(
    tmp_path: Path, error: type[Exception], stops: bool
) -> None:
    """A write the broker refuses for good stops the app (``OutputWriteError``); any other
    failed write tears the consumer's tasks, which are restored and retried."""
    app, log, committer, _ = make(tmp_path)

    async def run() -> ActiveTask:
        task = await start(app)
        failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        failed.set_exception(error())
        await app._processing.process(task, Rec(0, b"k", b"5"))
        task.futures.append(failed)
        await app._commits.commit_safely(0)
        return task

    if stops:
        with pytest.raises(OutputWriteError, match="refused a write"):
            asyncio.run(run())
    else:
        task = asyncio.run(run())
        assert task.torn and log.markers() == 0 and committer.commits == []


def test_a_zombie_whose_membership_was_reset_is_not_confirmed(tmp_path: Path) -> None:
    """aiokafka reset the zombie's membership as it woke (a heartbeat answered
    UnknownMemberId: generation -1, member ''); a group with no members accepts an offset
    commit of generation -1, so the accepted fence proves nothing: it must write no stale
    value after the new owner's records."""
    app, log, fence, _ = fenced(tmp_path)
    app.host._memberships[0] = ("member-1", 3)
    fence._coordinator = SimpleNamespace(member_id="member-1", generation=3)  # type: ignore[attr-defined]
    new_marker = (COMMIT_KEY, encode_marker({"events": 9}))

    def new_owner() -> None:  # between the zombie's check and its marker
        log.records[CHANGELOG].extend([(b"k", b"7"), new_marker])
        log.after_ends = None
        send = log.send

        async def then_reset(topic: str, value: Any, key: Any = None, **kw: Any) -> Any:
            future = await send(topic, value, key=key, **kw)
            if key == COMMIT_KEY:  # its marker is out; then the heartbeat resets it
                fence._coordinator.member_id, fence._coordinator.generation = "", -1  # type: ignore[attr-defined]
            return future

        log.send = then_reset  # type: ignore[method-assign]

    task = asyncio.run(commit_twice(app, log, new_owner))
    records = log.records[CHANGELOG]
    assert [r[0] for r in records[records.index(new_marker) + 1 :]] == [COMMIT_KEY]
    assert task.torn and task.stores["totals"].pending == {}
    assert fence.commits == [{KafkaTopicPartition("events", 0): 1}]  # no fence, no input


def test_a_new_owner_fences_with_the_group_s_offset_before_its_first_commit(
    tmp_path: Path,
) -> None:
    """The survivor took the task over (its restore: the zombie's k=5 at input 0, whose
    offset the zombie committed) and has committed nothing yet; the zombie's late marker
    closes the survivor's uncommitted k=10 (input 1) with applied {events: 0}. The fence
    commits the group's offset again (looked up): confirmed, the owner keeps the task and
    writes its values after that marker, so input 1 is counted once."""
    app, log, fence, rejoins = fenced(tmp_path)
    zombie_commit = {KafkaTopicPartition("events", 0): 1}
    fence.commits.append(zombie_commit)
    zombie_marker = (COMMIT_KEY, encode_marker({"events": 0}))
    log.records[CHANGELOG].extend([(b"k", b"5"), (b"k-copy", b"5"), zombie_marker])

    async def run() -> ActiveTask:
        task = await start(app)
        assert task.stores["totals"].get(b"k") == b"5"
        await app._processing.process(task, Rec(1, b"k", b"5"))  # k = 10, uncommitted
        log.records[CHANGELOG].append(zombie_marker)  # the zombie's, sent as it wakes
        await app._commits.commit(0)
        return task

    task = asyncio.run(run())
    state = task.stores["totals"]
    assert not task.torn and rejoins == []
    assert log.replay() == {b"k": b"10", b"k-copy": b"10"} == dict(state.store.items())
    assert applied(log) == {"events": 1}
    assert fence.commits == [zombie_commit, zombie_commit, {KafkaTopicPartition("events", 0): 2}]
    # Only a marker of the other writer's: every key's last value is the owner's already,
    # nothing is written again (its own marker, the last, closes them with its offsets).
    assert len(log.records[CHANGELOG]) == 3 + 2 + 1 + 1


def test_a_member_the_broker_does_not_answer_writes_nothing_over_another_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No answer to the fence (a partitioned member, the classic zombie) until the commit's
    patience runs out: the member writes nothing after the other writer's records, its
    tasks are torn and it rejoins (the owner's next commit writes its values after them)."""
    monkeypatch.setattr(commits_module, "REASSERT_PATIENCE", 0.2)
    monkeypatch.setattr(commits_module, "FENCE_BACKOFF", 0.05)
    app, log, fence, rejoins = fenced(tmp_path)
    tries = []
    new_marker = (COMMIT_KEY, encode_marker({"events": 9}))

    async def unanswered(offsets: dict[Any, int]) -> None:
        tries.append(offsets)
        raise RequestTimedOutError()

    def new_owner() -> None:
        log.records[CHANGELOG].extend([(b"k", b"7"), new_marker])
        log.after_ends = None
        fence.commit = unanswered  # type: ignore[method-assign]

    task = asyncio.run(commit_twice(app, log, new_owner))
    records = log.records[CHANGELOG]
    assert [r[0] for r in records[records.index(new_marker) + 1 :]] == [COMMIT_KEY]
    assert task.torn and rejoins == [0] and len(tries) >= 2  # tried again before giving up


def test_a_confirmed_owner_writes_over_records_between_its_own(tmp_path: Path) -> None:
    """Another writer's records between the owner's uncommitted ones (not only after them):
    the confirmed owner's commit leaves a changelog whose replay is its state."""
    app, log, _, rejoins = fenced(tmp_path)

    async def run() -> ActiveTask:
        task = await start(app)
        await app._processing.process(task, Rec(0, b"k", b"5"))
        await app._commits.commit(0)  # committed offsets exist: the fence can be asked
        await app._processing.process(task, Rec(1, b"k", b"5"))  # k = 10
        log.records[CHANGELOG].extend([(b"k", b"1"), (b"j", b"3")])  # a zombie's stale k, j
        await app._processing.process(task, Rec(2, b"m", b"4"))  # the owner's m after them
        log.records[CHANGELOG].append((b"m-copy", b"0"))
        await app._commits.commit(0)
        return task

    task = asyncio.run(run())
    assert not task.torn and rejoins == []
    assert log.replay() == dict(task.stores["totals"].store.items())
    assert applied(log) == {"events": 2}


def test_a_zombie_marker_ahead_of_the_owner_does_not_outlast_the_owner_s_marker(
    tmp_path: Path,
) -> None:
    """A frozen member processed input past the group's committed offset; its late marker
    carries applied offsets ahead of the owner's. The owner's later marker replaces them in
    any restore (another process, a standby, a cold replay), so no input is skipped."""
    app, log, _, _ = fenced(tmp_path)

    async def run() -> ActiveTask:
        task = await start(app)
        await app._processing.process(task, Rec(0, b"k", b"5"))
        await app._commits.commit(0)  # group offset 1, applied 0
        await app._processing.process(task, Rec(1, b"k", b"5"))  # k = 10, not committed
        log.records[CHANGELOG].append((COMMIT_KEY, encode_marker({"events": 5})))  # zombie's
        await app._commits.commit(0)  # confirmed: keeps the task, k = 10, applied 1
        # the task moves to another process, which restores it from the changelog
        other, _, _, _ = make(tmp_path / "other")
        other._clients.producer = other._clients.restorer = log  # type: ignore[assignment]
        other._clients.changelog_reader = log  # type: ignore[assignment]
        again = await start(other)
        for offset in (2, 3):  # input from the group's committed offset (2)
            await other._processing.process(again, Rec(offset, b"k", b"5"))
        await other._commits.commit(0)
        return again

    again = asyncio.run(run())
    assert dict(again.stores["totals"].store.items())[b"k"] == b"20"  # 4 records of 5
    assert applied(log) == {"events": 3}


class TwoStores:
    """Adds each record's value to its key in both stores of the task."""

    async def process(self, ctx: Any, record: Any) -> None:
        for name in ("totals", "other"):
            table = ctx.store(name)
            table.put(
                record.key, str(int(table.get(record.key) or b"0") + int(record.value)).encode()
            )


def test_a_member_found_lost_at_one_store_writes_nothing_for_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both changelogs of a task get another writer's records after the end check; the keys
    of the first cannot be read in time and the fence that follows is refused: the member
    writes neither its values nor a marker to the second store's changelog (only its
    marker already on its way lands)."""
    monkeypatch.setattr(commits_module, "REASSERT_PATIENCE", 0.3)
    monkeypatch.setattr(commits_module, "FENCE_BACKOFF", 0.05)
    app, log, fence, rejoins = fenced(tmp_path, ("totals", "other"), TwoStores)
    changelogs = [("app-totals-changelog", 0), ("app-other-changelog", 0)]
    new_marker = (COMMIT_KEY, encode_marker({"events": 9}))

    def new_owner() -> None:
        for changelog in changelogs:
            log.records[changelog].extend([(b"k", b"99"), new_marker])
        log.after_ends = None

    read_keys = app._commits.lookups.keys_written

    async def keys_written(tp: TopicPartition, first: int, end: int) -> Any:
        first_store = next(iter(app._actives[TASK].stores.values()))
        if tp == first_store.changelog:  # evicted while its keys could not be read
            fence.refuse = True
            await asyncio.sleep(0.05)
            raise ChangelogReadTimeoutError("slow")
        return await read_keys(tp, first, end)

    app._commits.lookups.keys_written = keys_written  # type: ignore[method-assign]

    task = asyncio.run(commit_twice(app, log, new_owner))
    assert task.torn and rejoins
    for changelog in changelogs:
        records = log.records[changelog]
        assert [r[0] for r in records[records.index(new_marker) + 1 :]] == [COMMIT_KEY]


def test_a_member_evicted_while_it_reads_the_keys_to_write_over_writes_nothing(
    tmp_path: Path,
) -> None:
    """The broker confirmed the owner at the end check, then evicts it while it reads the
    keys of the other writer's records: asked again before writing, it is refused and writes
    neither values nor a marker."""
    app, log, fence, rejoins = fenced(tmp_path)
    read_keys = app._commits.lookups.keys_written

    async def evicted_meanwhile(tp: TopicPartition, first: int, end: int) -> Any:
        fence.refuse = True
        return await read_keys(tp, first, end)

    async def run() -> ActiveTask:
        task = await start(app)
        await app._processing.process(task, Rec(0, b"k", b"5"))
        await app._commits.commit(0)
        await app._processing.process(task, Rec(1, b"k", b"5"))  # k = 10
        log.records[CHANGELOG].extend([(b"k", b"7"), (COMMIT_KEY, encode_marker({"events": 9}))])
        app._commits.lookups.keys_written = evicted_meanwhile  # type: ignore[method-assign]
        await app._commits.commit(0)
        return task

    task = asyncio.run(run())
    assert task.torn and rejoins == [0]
    assert log.records[CHANGELOG][-1] == (COMMIT_KEY, encode_marker({"events": 9}))


def test_a_member_evicted_while_it_reads_the_keys_after_a_late_marker_writes_nothing(
    tmp_path: Path,
) -> None:
    """The broker confirmed the member when its marker landed after another writer's
    records, then evicts it while it reads their keys: asked again before writing its
    values over them, it is refused and writes nothing after its marker."""
    app, log, fence, rejoins = fenced(tmp_path)
    read_keys = app._commits.lookups.keys_written

    async def evicted_meanwhile(tp: TopicPartition, first: int, end: int) -> Any:
        fence.refuse = True
        return await read_keys(tp, first, end)

    def new_owner() -> None:  # between this member's end check and its marker
        log.records[CHANGELOG].extend([(b"k", b"7"), (COMMIT_KEY, encode_marker({"events": 9}))])
        log.after_ends = None
        app._commits.lookups.keys_written = evicted_meanwhile  # type: ignore[method-assign]

    task = asyncio.run(commit_twice(app, log, new_owner))
    records = log.records[CHANGELOG]
    late = records.index((COMMIT_KEY, encode_marker({"events": 9}))) + 1
    assert [key for key, _ in records[late:]] == [COMMIT_KEY]  # its own marker, no values
    assert task.torn and set(rejoins) == {0}
