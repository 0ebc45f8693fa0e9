"""The runtime on a cluster with ACLs, without a broker: what the broker refuses (error 29 for
a topic, a group or a write not authorized) is reported as a ``NotAuthorizedError`` naming the
resource and the ACL to grant, never as a missing or deleted topic or a raw aiokafka error;
the producers get the TLS/SASL settings of ``consumer_config`` like every other client.
Measured on a SASL_SSL broker with ACLs: docs/runtime.md, "Secured clusters"."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)

from streamassign import Subtopology, TaskId, TopicPartition, Topology
from streamassign.errors import (
    GroupNotAuthorizedError,
    InternalTopicNotAuthorizedError,
    MissingChangelogError,
    MissingTopicsError,
    NotAuthorizedError,
    OutputNotAuthorizedError,
    OutputWriteError,
    ProducerStartError,
    SourceTopicsNotAuthorizedError,
    TransactionalIdNotAuthorizedError,
)
from streamassign.localstate import StateDirectory
from streamassign.runtime import App, _topics
from streamassign.runtime import app as app_module
from streamassign.runtime._clients import with_connection
from streamassign.runtime._topics import ChangelogCheck, _topic_limits, ensure_internal_topics
from streamassign.runtime.changelog import StoreState
from streamassign.runtime.stores import MemoryStore
from streamassign.runtime.tasks import ActiveTask
from streamassign.runtime.transactions import TaskProducers

from .test_runtime_transactions import Rec, TxnProducer, fail_sends, make

CHANGELOG = "rt-totals-changelog"
TOPOLOGY = Topology([Subtopology(0, ["r6"], stores=["totals"])], name="rt")
SECURED = {
    "security_protocol": "SASL_SSL",
    "sasl_mechanism": "SCRAM-SHA-512",
    "sasl_plain_username": "runtime",
    "sasl_plain_password": "secret",
}


def partitions(count: int) -> list[dict[str, int]]:
    return [{"partition": p, "leader": 1} for p in range(count)]


class AclAdmin:
    """An admin client on a broker with ACLs: topics in ``denied`` answer error 29 (whether
    they exist or not), ``topics`` are described, others are unknown; CreateTopics answers
    ``create_code`` for each topic asked."""

    def __init__(
        self, topics: dict[str, int], denied: set[str], create_code: int = 0, **kw: Any
    ) -> None:
        self.topics, self.denied, self.create_code = topics, denied, create_code
        self.created: list[str] = []

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def _send_request(self, request: Any) -> Any:
        described = []
        for t in request.request._topics:
            if t in self.denied:
                described.append({"topic": t, "error_code": 29, "partitions": []})
            elif t in self.topics:
                described.append({"topic": t, "error_code": 0, "partitions": partitions(4)})
            else:
                described.append({"topic": t, "error_code": 3, "partitions": []})
        return SimpleNamespace(to_object=lambda: {"topics": described})

    async def create_topics(self, new: list[Any]) -> Any:
        self.created += [t.name for t in new]
        if not self.create_code:
            self.topics.update(dict.fromkeys((t.name for t in new), 4))
        errors = [(t.name, self.create_code, "Authorization failed.") for t in new]
        return SimpleNamespace(topic_errors=errors)


def use_admin(monkeypatch: pytest.MonkeyPatch, admin: AclAdmin) -> AclAdmin:
    monkeypatch.setattr(_topics, "AIOKafkaAdminClient", lambda **kw: admin)
    monkeypatch.setattr(_topics, "_READY_TIMEOUT", 0.5)  # a wrong wait fails fast
    return admin


def test_a_source_topic_not_authorized_is_not_reported_as_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Measured: ``MissingTopicsError: missing source topics ...: r6`` for an existing topic
    the principal lacked READ on. Now one line naming the topic, READ and the principal;
    still a ``MissingTopicsError`` for callers catching that."""
    use_admin(monkeypatch, AclAdmin({}, denied={"r6"}))
    with pytest.raises(SourceTopicsNotAuthorizedError) as refused:
        asyncio.run(ensure_internal_topics(TOPOLOGY, "x:1", admin_config=SECURED))
    message = str(refused.value)
    assert message.startswith("source topics not authorized for User:runtime: r6: grant READ")
    assert "missing" not in message
    assert refused.value.topics == ("r6",)
    assert isinstance(refused.value, MissingTopicsError)
    assert isinstance(refused.value, NotAuthorizedError)


def test_a_changelog_not_authorized_is_not_taken_for_a_deleted_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Local state holds data of the changelog; the principal may not describe it. Before,
    the changelog counted as absent: ``MissingChangelogError`` said it was deleted."""
    use_admin(monkeypatch, AclAdmin({"r6": 4, CHANGELOG: 4}, denied={CHANGELOG}))
    state = StateDirectory(tmp_path)
    try:
        state.write_checkpoint(TaskId(0, 1), {TopicPartition(CHANGELOG, 1): 5})
        with pytest.raises(InternalTopicNotAuthorizedError) as refused:
            asyncio.run(ensure_internal_topics(TOPOLOGY, "x:1", admin_config=SECURED, state=state))
    finally:
        state.close()
    message = str(refused.value)
    assert f"internal topics not authorized for User:runtime: {CHANGELOG}: grant READ" in message
    assert "deleted?" not in message and "restore the topic" not in message


def test_a_changelog_not_authorized_is_neither_created_nor_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No local state, CREATE allowed: before, CreateTopics answered TopicAlreadyExists
    (accepted) and the start waited for leaders it could not see, then said "no leaders
    after creation"."""
    admin = use_admin(monkeypatch, AclAdmin({"r6": 4}, denied={CHANGELOG}))
    with pytest.raises(InternalTopicNotAuthorizedError, match="READ and WRITE on them"):
        asyncio.run(ensure_internal_topics(TOPOLOGY, "x:1"))
    assert admin.created == []


def test_create_not_authorized_names_the_acl_or_how_to_create_the_topic(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Measured: ``creating internal topic 'rtE-totals-changelog': ('rtE-totals-changelog',
    29, 'Authorization failed.')``. Now the ACL, or the topic to create beforehand."""
    use_admin(monkeypatch, AclAdmin({"r6": 4}, denied=set(), create_code=29))
    with pytest.raises(InternalTopicNotAuthorizedError) as refused:
        asyncio.run(ensure_internal_topics(TOPOLOGY, "x:1", admin_config=SECURED))
    assert str(refused.value) == (
        f"creating internal topic {CHANGELOG!r} not authorized for User:runtime: grant CREATE "
        "on it (a PREFIXED ACL on '<application id>-' covers every internal topic), or create "
        "it beforehand: 4 partition(s), the broker's default replication factor, "
        "cleanup.policy=compact"
    )


def test_the_running_check_says_not_authorized_not_deleted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A changelog the principal lost DESCRIBE on while running stops the application (a
    ``MissingChangelogError`` still) with a line saying so; a source topic it may not
    describe is left out of the check, as before."""
    use_admin(monkeypatch, AclAdmin({}, denied={CHANGELOG, "r6"}))
    check = ChangelogCheck(TOPOLOGY, "x:1", admin_config=SECURED)
    with pytest.raises(MissingChangelogError) as refused:
        asyncio.run(check.refuse_missing([TopicPartition(CHANGELOG, 0)]))
    assert isinstance(refused.value, InternalTopicNotAuthorizedError)
    assert "deleted" not in str(refused.value).replace("not taken for deleted", "")
    use_admin(monkeypatch, AclAdmin({CHANGELOG: 4}, denied={"r6"}))
    found = asyncio.run(check.refuse_missing([TopicPartition(CHANGELOG, 0)]))
    assert found == {CHANGELOG: partitions(4)}


def test_describe_configs_not_authorized_names_the_acl(caplog: pytest.LogCaptureFixture) -> None:
    """Measured: ``max.message.bytes of topic ... not known (describe error 29)``."""

    class Admin:
        async def describe_configs(self, resources: object) -> list[Any]:
            found = {"resource_name": CHANGELOG, "error_code": 29, "config_entries": []}
            return [SimpleNamespace(to_object=lambda: {"resources": [found]})]

    with caplog.at_level(logging.WARNING, "streamassign.runtime"):
        assert asyncio.run(_topic_limits(Admin(), [CHANGELOG])) == ({}, [])
    (warning,) = caplog.records
    assert warning.getMessage() == (
        f"max.message.bytes of topic {CHANGELOG!r} not known (not authorized: grant "
        f"DESCRIBE_CONFIGS on topic {CHANGELOG!r}): batches not capped for it"
    )


class Nothing:
    async def process(self, ctx: object, record: object) -> None: ...


def made_producers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, guarantee: str, producer_config: Any
) -> list[dict[str, Any]]:
    """The configurations ``App._make_producers`` gives its producers."""
    configs: list[dict[str, Any]] = []

    async def no_limits(*args: object, **kw: object) -> dict[str, int]:
        return {}

    def recording(*args: Any, **kw: Any) -> None:
        configs.append(args[2] if len(args) > 2 else args[1])

    monkeypatch.setattr(app_module, "max_message_bytes", no_limits)
    monkeypatch.setattr(app_module, "TaskProducers", recording)
    monkeypatch.setattr(app_module, "OrphanTransactions", recording)
    monkeypatch.setattr(app_module.Clients, "shared_producer", recording)
    app = App(
        TOPOLOGY,
        {0: Nothing},
        bootstrap_servers="x:1",
        state_dir=tmp_path / guarantee,
        store_kind="memory",
        processing_guarantee=guarantee,  # type: ignore[arg-type]
        consumer_config={**SECURED, "max_poll_records": 5},
        producer_config=producer_config,
    )
    asyncio.run(app._make_producers())
    return configs


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_producers_get_the_security_settings_of_consumer_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, guarantee: str
) -> None:
    """Measured: security settings in ``consumer_config`` only, and ``App.start`` failed
    with a bare ``KafkaConnectionError: Unable to bootstrap`` from the producer."""
    configs = made_producers(tmp_path, monkeypatch, guarantee, {"linger_ms": 20})
    assert configs  # at least once: the shared producer and the orphan check
    for config in configs:
        assert {k: config[k] for k in SECURED} == SECURED
        assert config["linger_ms"] == 20 and "max_poll_records" not in config


def test_a_producer_config_with_its_own_security_settings_keeps_them() -> None:
    """The producers' own principal (or any connection key set) is taken as complete: none
    of the consumers' settings is mixed in."""
    own = {"security_protocol": "SSL", "acks": 1}
    assert with_connection(own, SECURED) == own
    assert with_connection({"acks": 1}, SECURED) == {**SECURED, "acks": 1}
    assert with_connection({}, {}) == {}


def test_a_group_not_authorized_at_start_names_the_acl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Measured: ``App.start`` raised aiokafka's ``GroupAuthorizationFailedError: rtG``."""

    class Reader:
        def __init__(self, **config: object) -> None: ...

        async def start(self) -> None: ...

        async def stop(self) -> None: ...

    async def topics(*args: object, **kw: object) -> dict[str, int]:
        return {CHANGELOG: 4}

    monkeypatch.setattr(app_module, "ensure_internal_topics", topics)
    monkeypatch.setattr(app_module, "max_message_bytes", topics)
    monkeypatch.setattr(app_module, "AIOKafkaConsumer", Reader)
    app = App(
        TOPOLOGY,
        {0: Nothing},
        bootstrap_servers="x:1",
        state_dir=tmp_path,
        store_kind="memory",
        processing_guarantee="exactly_once",  # no shared producer to start
        consumer_config=SECURED,
    )

    async def refused() -> None:
        raise GroupAuthorizationFailedError("rt")

    async def start_and_stop() -> None:
        try:
            await app.start()
        finally:
            await app.stop()

    app.host.start = refused  # type: ignore[method-assign]
    with pytest.raises(GroupNotAuthorizedError) as refusal:
        asyncio.run(start_and_stop())
    assert str(refusal.value).startswith(
        "consumer group 'rt' not authorized for User:runtime: grant READ on group 'rt'"
    )
    assert isinstance(refusal.value.__cause__, GroupAuthorizationFailedError)


def test_a_sink_topic_not_authorized_is_an_output_write_error(tmp_path: Path) -> None:
    """Measured: the application stopped with aiokafka's
    ``TopicAuthorizationFailedError('sinkK')``, raised by ``send`` while it waits for the
    topic's metadata (before any acknowledgement, where refusals were translated)."""

    class Sender:
        async def process(self, ctx: Any, record: Any) -> None:
            ctx.store("totals").put(record.key, record.value)
            ctx.send("sinkK", record.value, key=record.key)

    class Unauthorized:
        async def send(self, topic: str, value: bytes, **kw: object) -> asyncio.Future[None]:
            if topic == "sinkK":
                raise TopicAuthorizationFailedError(topic)
            acked: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            acked.set_result(None)
            return acked

    app = App(TOPOLOGY, {0: Sender}, bootstrap_servers="x:1", state_dir=tmp_path)
    app._clients.producer = Unauthorized()  # type: ignore[assignment]
    state = StoreState.open("totals", TopicPartition(CHANGELOG, 0), MemoryStore())
    task = ActiveTask(TaskId(0, 0), 0, {"totals": state}, Sender())
    record = SimpleNamespace(
        topic="r6", partition=0, offset=0, timestamp=0, key=b"k", value=b"1", headers=()
    )
    with pytest.raises(OutputWriteError) as refused:
        asyncio.run(app._processing.process(task, record))
    assert isinstance(refused.value, OutputNotAuthorizedError)
    assert str(refused.value).startswith(
        "task 0_0: writing to topic 'sinkK' not authorized for the application's principal: "
        "grant WRITE on topic 'sinkK'"
    )
    app.state.close()


def test_losing_the_group_while_running_stops_with_one_line_naming_the_acl(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Measured: the group's READ taken away while running stopped the application with
    aiokafka's ``GroupAuthorizationFailedError('rtO')`` as ``failure`` (logged with a trace)."""
    app = App(TOPOLOGY, {0: Nothing}, bootstrap_servers="x:1", state_dir=tmp_path)

    async def polling() -> None:
        raise GroupAuthorizationFailedError("rt")

    with caplog.at_level(logging.ERROR, "streamassign.runtime"):
        asyncio.run(app._fail_on_error(polling(), "consumer 0"))
    assert isinstance(app.failure, GroupNotAuthorizedError)
    assert isinstance(app.failure.__cause__, GroupAuthorizationFailedError)
    assert app._stopped.is_set()
    (line,) = caplog.records
    assert line.getMessage().startswith(
        "consumer 0 failed; stopping the application: consumer group 'rt' not authorized for "
        "the application's principal: grant READ on group 'rt'"
    )
    assert line.exc_info is None
    app.state.close()


def test_a_write_refused_at_its_ack_is_an_output_not_authorized_error() -> None:
    """A principal that may describe an output topic but not write it is refused at the
    ack, not at the send: the same typed error, naming the ACL."""
    from aiokafka.errors import TopicAuthorizationFailedError

    from streamassign.errors import OutputNotAuthorizedError
    from streamassign.runtime.commits import _acks

    async def refused() -> None:
        raise TopicAuthorizationFailedError("sinkK")

    async def run() -> None:
        await _acks(0, [asyncio.ensure_future(refused())])

    with pytest.raises(OutputNotAuthorizedError, match="grant WRITE on the topics its tasks"):
        asyncio.run(run())


def test_a_transactional_id_not_authorized_at_start_names_the_acl() -> None:
    """Measured: ``ProducerStartError: task 0_0: its transactional producer cannot start:
    TransactionalIdAuthorizationFailed('rtH-0_0')``, naming neither the ACL nor the
    principal. Now one line with both; still a ``ProducerStartError``, and not retried."""
    producers = TaskProducers("rt", "unused:1", {}, principal="User:runtime")
    starts: list[TaskId] = []

    async def refused(task: TaskId) -> Any:
        starts.append(task)
        raise TransactionalIdAuthorizationFailed("rt-0_0")

    producers._start = refused  # type: ignore[method-assign]
    with pytest.raises(TransactionalIdNotAuthorizedError) as refusal:
        asyncio.run(producers.renew(TaskId(0, 0)))
    assert str(refusal.value) == (
        "task 0_0: its transactional producer cannot start: transactional id 'rt-0_0' not "
        "authorized for User:runtime: grant WRITE on transactional id 'rt-0_0' (a PREFIXED "
        "ACL on 'rt-' covers every task's producer)"
    )
    assert isinstance(refusal.value, ProducerStartError)
    assert isinstance(refusal.value, NotAuthorizedError)
    assert starts == [TaskId(0, 0)]


def test_the_task_producers_know_the_principal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def no_limits(*args: object, **kw: object) -> dict[str, int]:
        return {}

    monkeypatch.setattr(app_module, "max_message_bytes", no_limits)
    app = App(
        TOPOLOGY,
        {0: Nothing},
        bootstrap_servers="x:1",
        state_dir=tmp_path,
        store_kind="memory",
        processing_guarantee="exactly_once",
        consumer_config=SECURED,
    )
    asyncio.run(app._make_producers())
    assert app._clients.task_producers is not None
    assert app._clients.task_producers.principal == "User:runtime"
    app.state.close()


def refuse_id_at_commit(fake: TxnProducer) -> None:
    """``fake``'s commit is refused as aiokafka's sender reports WRITE on the transactional
    id taken away: the EndTxn (or AddOffsetsToTxn) answer kills the sender routine, and the
    transaction fails with the error."""

    async def commit_transaction() -> None:
        raise TransactionalIdAuthorizationFailed("app-0_0")

    fake.commit_transaction = commit_transaction  # type: ignore[method-assign]


@pytest.mark.parametrize("where", ["ack", "commit"])
def test_a_transactional_id_refused_while_running_names_the_acl(tmp_path: Path, where: str) -> None:
    """Before: ``OutputWriteError: task 0_0: its transaction cannot be written
    (TransactionalIdAuthorizationFailed('app-0_0')); ...``. Now the ACL and the principal,
    whether the refusal fails the task's writes (the sender routine fails every pending batch
    with it) or its commit; an ``OutputWriteError`` still, the application stops."""
    app, tasks, fakes, rejoins = make(tmp_path)
    assert app._clients.task_producers is not None
    app._clients.task_producers.principal = "User:runtime"
    if where == "ack":
        fail_sends(fakes[0], TransactionalIdAuthorizationFailed("app-0_0"))
    else:
        refuse_id_at_commit(fakes[0])

    async def run() -> None:
        await app._processing.process(tasks[0], Rec(0, 0, b"k"))
        with pytest.raises(OutputNotAuthorizedError) as refusal:
            await app._commits.commit_safely(0)
        assert str(refusal.value) == (
            "task 0_0: its transaction cannot be written: transactional id 'app-0_0' not "
            "authorized for User:runtime: grant WRITE on transactional id 'app-0_0' (a "
            "PREFIXED ACL on 'app-' covers every task's producer); aborted, stopping (it "
            "would be refused again)"
        )
        await asyncio.gather(*app._clients.task_producers.closing)  # type: ignore[union-attr]

    asyncio.run(run())
    assert rejoins == [] and tasks[0].torn
    app.state.close()
