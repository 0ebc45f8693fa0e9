"""Changelogs that go missing under a running application, on a real broker (one worker
process, no standby): a deleted changelog stops the application with a typed error and its
restart is refused with the local state untouched (before: the restart recreated the topic
and wiped the local stores, every key wrong); source partitions added while running stop the
application with a typed error naming the counts and the remedy (before: the new tasks stayed
"restoring" forever). In the test's process: a start creates the changelogs of a brand-new
application, and refuses to recreate one that a local checkpoint holds data of."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from streamassign import Subtopology, TaskId, TopicPartition, Topology
from streamassign.errors import MissingChangelogError
from streamassign.localstate import StateDirectory
from streamassign.runtime import ensure_internal_topics
from streamassign.runtime._topics import ChangelogCheck
from streamassign.runtime.end_offsets import high_watermarks

from .conftest import GroupIdFactory, TopicFactory, _create_topic, _delete_topics, kafka_script
from .test_runtime import PARTITIONS, Feeder, Runtime, runtime_fixture, wait_caught_up

#: Seconds the application may take to stop once a changelog is gone (end lookups time out
#: after 5 s, the metadata check takes less than 10 s, the stop itself some more).
STOP_DEADLINE = 45.0

T = TypeVar("T")


def wait_for(what: Callable[[], T], timeout: float, describe: str) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"{describe} not within {timeout:g} s")


def local_state(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under the tasks' directories: size and modification time (ns)."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted((root / "tasks").rglob("*"))
        if p.is_file()
    }


async def _topic_partitions(bootstrap: str, topic: str) -> int | None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        found = (await admin.describe_topics([topic]))[0]
        return len(found["partitions"]) if found["error_code"] == 0 else None
    finally:
        await admin.close()


async def _add_partitions(bootstrap: str, topic: str, total: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_partitions({topic: NewPartitions(total_count=total)})
    finally:
        await admin.close()


runtime = runtime_fixture("topics", args=["--standbys", "0", "--status-interval", "0.2"])


def _running_with_state(runtime: Runtime, total: int) -> None:
    runtime.start("p1")
    runtime.settle()
    feeder = Feeder(runtime.bootstrap, runtime.source, total, 500, 0.01)
    feeder.start()
    feeder.finish()
    wait_caught_up(runtime.bootstrap, runtime.app, runtime.source)


def _stopped(runtime: Runtime, name: str, timeout: float) -> dict[str, Any]:
    lines = wait_for(lambda: runtime.events(name, "stopped"), timeout, f"{name} stopping")
    runtime.procs[name].proc.wait(timeout=30)
    runtime.stop(name)
    return lines[0]


def _refused_start(runtime: Runtime, name: str) -> str:
    """Start ``name`` again; it must exit with an error: returns its log."""
    log = runtime.tmp / f"{name}.log"
    before = log.stat().st_size
    runtime.start(name)
    code = runtime.procs[name].proc.wait(timeout=STOP_DEADLINE)
    runtime.stop(name)
    assert code != 0
    return log.read_text()[before:]


def test_a_deleted_changelog_stops_the_application_and_refuses_its_restart(
    runtime: Runtime,
) -> None:
    _running_with_state(runtime, 3000)
    changelog = f"{runtime.app}-totals-changelog"
    asyncio.run(_delete_topics(runtime.bootstrap, [changelog]))
    deleted = time.monotonic()
    more = Feeder(runtime.bootstrap, runtime.source, 3300, 100, 0.05, first=3000)
    more.start()  # records processed: their sends find the changelog gone
    log = runtime.tmp / "p1.log"
    line = f"failed; stopping the application: changelog topic(s) {changelog} deleted"
    found = wait_for(lambda: line in log.read_text(), STOP_DEADLINE, "the typed error line")
    took = time.monotonic() - deleted
    assert found and "MissingChangelogError" not in log.read_text().split(line)[0]
    lines = len(log.read_text().splitlines())
    # The producer's stop then waits request_timeout_ms (40 s) for the batches the deleted
    # topic cannot take (not this test's concern): the process is killed instead.
    runtime.stop("p1", signal.SIGKILL)
    more.join(60)

    state = local_state(runtime.tmp / "p1")
    assert any(name.endswith("checkpoint") for name in state)
    refused = _refused_start(runtime, "p1")
    assert "MissingChangelogError: changelog topic(s) missing" in refused
    assert f"{changelog}: tasks 0_" in refused and "restore the topic" in refused
    assert local_state(runtime.tmp / "p1") == state  # nothing wiped, nothing rewritten
    assert asyncio.run(_topic_partitions(runtime.bootstrap, changelog)) is None  # not created
    print(f"typed error {took:.1f} s after the deletion; log {lines} lines by then")


def test_source_partitions_added_while_running_stop_the_application(runtime: Runtime) -> None:
    _running_with_state(runtime, 1000)
    changelog = f"{runtime.app}-totals-changelog"
    asyncio.run(_add_partitions(runtime.bootstrap, runtime.source, PARTITIONS + 2))
    added = time.monotonic()
    stopped = _stopped(runtime, "p1", 60.0)
    took = time.monotonic() - added
    assert stopped["failure"].startswith("MissingChangelogError("), stopped
    assert (
        f"{changelog} has {PARTITIONS} partitions, its tasks need {PARTITIONS + 2}"
        in (stopped["failure"])
    )
    assert "kafka-topics.sh --bootstrap-server B --alter" in stopped["failure"]

    refused = _refused_start(runtime, "p1")
    assert f"{changelog} has {PARTITIONS}, needs {PARTITIONS + 2}" in refused
    assert "kafka-topics.sh --bootstrap-server B --alter" in refused
    print(f"stopped {took:.1f} s after the partitions were added")


def test_a_start_creates_changelogs_unless_local_state_holds_data_of_them(
    kafka_bootstrap: str,
    kafka_topic_factory: TopicFactory,
    kafka_group_id_factory: GroupIdFactory,
    tmp_path: Path,
) -> None:
    source = kafka_topic_factory(2, prefix="events")
    app = kafka_group_id_factory("fresh")
    changelog = f"{app}-totals-changelog"
    topology = Topology([Subtopology(0, [source], stores=["totals"])], name=app)
    state = StateDirectory(tmp_path)
    try:  # a brand-new application: created
        assert asyncio.run(ensure_internal_topics(topology, kafka_bootstrap, state=state)) == {
            changelog: 2
        }
        asyncio.run(_delete_topics(kafka_bootstrap, [changelog]))
        wait_for(
            lambda: asyncio.run(_topic_partitions(kafka_bootstrap, changelog)) is None,
            30,
            "the deletion",
        )
        state.write_checkpoint(TaskId(0, 1), {TopicPartition(changelog, 1): 7})
        with pytest.raises(MissingChangelogError, match=f"{changelog}: tasks 0_1"):
            asyncio.run(ensure_internal_topics(topology, kafka_bootstrap, state=state))
        assert asyncio.run(_topic_partitions(kafka_bootstrap, changelog)) is None

        state.write_checkpoint(TaskId(0, 1), {TopicPartition(changelog, 1): 0})  # no data
        asyncio.run(ensure_internal_topics(topology, kafka_bootstrap, state=state))
        assert asyncio.run(_topic_partitions(kafka_bootstrap, changelog)) == 2
    finally:
        state.close()


@pytest.fixture(scope="module")
def auto_create_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A second broker with ``auto.create.topics.enable=true`` (Kafka's default; the suite's
    broker has it off), for this module only."""
    broker = kafka_script().start_broker(
        data_dir=tmp_path_factory.mktemp("kafka-autocreate"),
        auto_create_topics=True,
        die_with_parent=True,
    )
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


async def _existing(bootstrap: str, topic: str) -> tuple[int, str] | None:
    """Partition count and cleanup.policy of ``topic``, None when it does not exist; asked
    without creating it (listing every topic)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        if topic not in await admin.list_topics():
            return None
        described = await admin._client.fetch_all_metadata()
        resource = ConfigResource(ConfigResourceType.TOPIC, topic, {"cleanup.policy": None})
        (response,) = await admin.describe_configs([resource])
        (entry,) = response.to_object()["resources"][0]["config_entries"]
        return len(described.partitions_for_topic(topic) or ()), entry["config_value"]
    finally:
        await admin.close()


def test_internal_topics_on_a_broker_that_creates_topics_when_asked(
    auto_create_bootstrap: str, tmp_path: Path
) -> None:
    """Before, describing a missing topic created it (one partition, not compacted): a
    brand-new application did not start ("no leaders after creation" after 30 s), and a
    refused start left the deleted changelog recreated wrong."""
    bootstrap = auto_create_bootstrap
    source, app = "events", "autocreated"
    changelog = f"{app}-totals-changelog"
    asyncio.run(_create_topic(bootstrap, source, 3, {}))
    topology = Topology([Subtopology(0, [source], stores=["totals"])], name=app)
    state = StateDirectory(tmp_path)
    try:
        started = time.monotonic()
        assert asyncio.run(ensure_internal_topics(topology, bootstrap, state=state)) == {
            changelog: 3
        }
        print(f"brand-new application's topics in {time.monotonic() - started:.1f} s")
        assert asyncio.run(_existing(bootstrap, changelog)) == (3, "compact")

        asyncio.run(_delete_topics(bootstrap, [changelog]))
        wait_for(lambda: asyncio.run(_existing(bootstrap, changelog)) is None, 30, "the deletion")
        state.write_checkpoint(TaskId(0, 1), {TopicPartition(changelog, 1): 7})
        with pytest.raises(MissingChangelogError, match=f"{changelog}: tasks 0_1"):
            asyncio.run(ensure_internal_topics(topology, bootstrap, state=state))
        check = ChangelogCheck(topology, bootstrap)
        with pytest.raises(MissingChangelogError, match="deleted while the application ran"):
            asyncio.run(check.refuse_missing([TopicPartition(changelog, 1)]))
        assert asyncio.run(_existing(bootstrap, changelog)) is None  # not recreated
    finally:
        state.close()


def test_high_watermarks_read_past_an_open_transaction(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory
) -> None:
    """A read_committed consumer's end offsets stop at the last stable offset (an open
    transaction); ``high_watermarks`` gives the log end (what a store past it is past)."""
    topic = kafka_topic_factory(1, prefix="marks")
    tp = KafkaTopicPartition(topic, 0)

    async def run() -> tuple[int, dict[KafkaTopicPartition, int]]:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=topic)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=kafka_bootstrap, isolation_level="read_committed"
        )
        await producer.start()
        await consumer.start()
        try:
            await producer.begin_transaction()
            for i in range(3):
                await producer.send_and_wait(topic, b"%d" % i, partition=0)
            stable = (await consumer.end_offsets([tp]))[tp]
            return stable, await high_watermarks(consumer, [tp])
        finally:
            await consumer.stop()
            await producer.stop()

    stable, marks = asyncio.run(run())
    assert stable == 0 and marks == {tp: 3}
