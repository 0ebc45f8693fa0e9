"""``processing_guarantee="exactly_once"`` on a real broker (issue 21 §3 and §4).

The summing worker of ``test_runtime.py`` with ``--guarantee exactly_once --output``: every
input record makes one output record naming it (``<partition>:<offset>:<count>,<sum>``).
Outputs and changelogs are read with ``read_committed`` and must hold every input record's
effect exactly once: each input offset in exactly one output, each key's counts 1, 2, ..., n
(so the output agrees with the table that made it), the tables the last process holds and a
cold replay of the changelog equal to the table computed from the input.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTopicPartition

from streamassign import TaskId, TopicPartition
from streamassign.errors import ProducerStartError
from streamassign.runtime.changelog import COMMIT_KEY, encode_marker
from streamassign.runtime.transactions import (
    OrphanTransactions,
    TaskProducers,
    rejoin_cures,
    transactional_id,
)

from .conftest import GroupIdFactory, TopicFactory
from .test_runtime import (
    PARTITIONS,
    TASKS,
    Feeder,
    Runtime,
    TopicEnds,
    _read_changelog,
    _read_topic,
    busiest,
    expected_table,
    key_of,
    tables,
    topic_ends,
    wait_caught_up,
)
from .test_runtime_membership import _backward_markers, freeze_and_wake, wait_for


@pytest.fixture
def eos(
    kafka_bootstrap: str,
    kafka_topic_factory: TopicFactory,
    kafka_group_id_factory: GroupIdFactory,
    tmp_path: Path,
) -> Iterator[tuple[Runtime, str]]:
    yield from eos_runtime(
        kafka_bootstrap, kafka_topic_factory, kafka_group_id_factory("eos"), tmp_path
    )


def eos_runtime(
    bootstrap: str, topic_factory: TopicFactory, group: str, tmp_path: Path, *args: str
) -> Iterator[tuple[Runtime, str]]:
    """The exactly-once summing worker's runtime (more worker options ``args``) and its
    output topic, closed after."""
    source = topic_factory(PARTITIONS, prefix="events")
    output = topic_factory(PARTITIONS, prefix="totals-out")
    rt = Runtime(bootstrap, group, source, tmp_path)
    rt.args = ["--guarantee", "exactly_once", "--output", output, "--status-interval", "0.1"]
    rt.args += args
    yield rt, output
    rt.close()


async def _input_offsets(bootstrap: str, topic: str) -> set[tuple[int, int]]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        tps = [KafkaTopicPartition(topic, p) for p in range(PARTITIONS)]
        ends = await consumer.end_offsets(tps)
        return {(tp.partition, o) for tp in tps for o in range(ends[tp])}
    finally:
        await consumer.stop()


def check_outputs_exactly_once(runtime: Runtime, output: str) -> int:
    """Committed outputs hold every input record exactly once and every key's counts
    1..n; returns how many output records aborted transactions left in the topic."""
    bootstrap = runtime.bootstrap
    committed = asyncio.run(_read_topic(bootstrap, output, "read_committed"))
    everything = asyncio.run(_read_topic(bootstrap, output, "read_uncommitted"))
    inputs = asyncio.run(_input_offsets(bootstrap, runtime.source))
    seen: Counter[tuple[int, int]] = Counter()
    for value in committed:
        partition, offset, _ = value.decode().split(":")
        seen[(int(partition), int(offset))] += 1
    twice = [k for k, n in seen.items() if n > 1]
    missing = inputs - set(seen)
    assert not twice, f"{len(twice)} input records output more than once, e.g. {twice[:5]}"
    assert not missing, f"{len(missing)} input records never output, e.g. {sorted(missing)[:5]}"
    assert set(seen) == inputs
    return len(everything) - len(committed)


async def _counts_by_key(bootstrap: str, topic: str) -> dict[bytes, list[int]]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", isolation_level="read_committed"
    )
    await consumer.start()
    try:
        tps = [KafkaTopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        out: dict[bytes, list[int]] = {}
        todo = {tp for tp in tps if ends[tp] > 0}
        while todo:
            for records in (await consumer.getmany(*todo, timeout_ms=500)).values():
                for r in records:
                    count = int(r.value.decode().split(":")[2].split(",")[0])
                    out.setdefault(r.key, []).append(count)
            todo = {tp for tp in todo if await consumer.position(tp) < ends[tp]}
        return out
    finally:
        await consumer.stop()


def check_exact(runtime: Runtime, output: str, total: int) -> int:
    """Stop every process but the last, which then runs every task; its tables, a
    read_committed replay of the changelog and the outputs must be exact. Returns the
    aborted output records."""
    expected = expected_table(total)
    *first, last = list(runtime.procs)
    for name in first:
        runtime.stop(name)
    wait_for("the last process runs every task", lambda: runtime.actives(last) == TASKS)
    held = tables(runtime.stop(last))
    short = {k: (held.get(k), v) for k, v in expected.items() if held.get(k) != v}
    assert not short, f"{len(short)} keys differ (held, expected), e.g. {list(short.items())[:5]}"
    assert held == expected
    changelog = f"{runtime.app}-totals-changelog"
    replay, _ = asyncio.run(_read_changelog(runtime.bootstrap, changelog, "read_committed"))
    assert replay == expected
    backward = asyncio.run(_backward_markers(runtime.bootstrap, changelog, "read_committed"))
    assert not backward, f"commit markers went backwards: {backward[:10]}"
    aborted = check_outputs_exactly_once(runtime, output)
    counts = asyncio.run(_counts_by_key(runtime.bootstrap, output))
    wrong = {k: c for k, c in counts.items() if sorted(c) != list(range(1, len(c) + 1))}
    assert not wrong, f"{len(wrong)} keys with counts not 1..n, e.g. {list(wrong)[:3]}"
    assert {k.decode(): len(c) for k, c in counts.items()} == {
        k: int(v.split(",")[0]) for k, v in expected.items()
    }
    return aborted


class StableAndHigh:
    """Each partition's last stable offset and high watermark, looked at again and again
    through two consumers kept open; a context manager."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._high = TopicEnds(bootstrap, topic, "read_uncommitted")
        try:
            self._stable = TopicEnds(bootstrap, topic, "read_committed")
        except BaseException:
            self._high.__exit__()
            raise

    def look(self) -> dict[int, tuple[int, int]]:
        """The high watermarks are read first: records written in between (not
        transactional) would look like a transaction the other way round."""
        high = self._high.look()
        stable = self._stable.look()
        return {p: (stable[p], high[p]) for p in high}

    def __enter__(self) -> StableAndHigh:
        return self

    def __exit__(self, *_: object) -> None:
        try:
            self._stable.__exit__()
        finally:
            self._high.__exit__()


def stable_and_high(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    """One look of ``StableAndHigh``."""
    with StableAndHigh(bootstrap, topic) as ends:
        return ends.look()


def open_transactions(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    """The partitions of ``topic`` with an open transaction: last stable offset below the
    high watermark (both returned)."""
    ends = stable_and_high(bootstrap, topic)
    return {p: (stable, high) for p, (stable, high) in ends.items() if stable < high}


def hold_until_uncommitted(
    runtime: Runtime, name: str, topic: str, partitions: set[int]
) -> tuple[dict[int, int], set[int]]:
    """Make process ``name`` stop committing (SIGUSR2) and wait, on the broker, until it has
    written to one of ``partitions`` of ``topic`` (partitions only its tasks write) since no
    commit of it could be under way: what it wrote there is never committed, so a kill
    leaves it behind. Returns the ends when it stopped committing, and the partitions it
    wrote since."""
    runtime.procs[name].proc.send_signal(signal.SIGUSR2)
    wait_for(f"{name} stops committing", lambda: bool(runtime.events(name, "holding")))
    grown: set[int] = set()
    with TopicEnds(runtime.bootstrap, topic) as topic_ends_now:
        held = topic_ends_now.look()

        def wrote_more() -> bool:
            ends = topic_ends_now.look()
            grown.update(p for p in partitions if ends[p] > held[p])
            return bool(grown)

        wait_for(f"{name} writes to {topic} after its last commit", wrote_more)
    return held, grown


def hold_until_open_transaction(
    runtime: Runtime, name: str, topic: str, partitions: set[int]
) -> set[int]:
    """``hold_until_uncommitted`` for an exactly-once process: its records written since are
    in transactions it never commits, so a kill leaves them open (asserted on the broker:
    the last stable offset is held back). Returns the partitions in that state."""
    held, grown = hold_until_uncommitted(runtime, name, topic, partitions)
    still_open = open_transactions(runtime.bootstrap, topic)
    assert all(p in still_open and still_open[p][0] <= held[p] for p in grown), (
        f"records written after the last commit are not in an open transaction: {still_open}"
    )
    return grown


def check_exact_at_least_once(
    runtime: Runtime, output: str, total: int
) -> Counter[tuple[int, int]]:
    """Stop every process but ``p2``, which then runs every task: its tables and a
    read_committed replay of the changelog equal the table computed from the input, and the
    committed outputs hold every input record (at least once). Returns how many committed
    outputs each input record (partition, offset) has."""
    expected = expected_table(total)
    for name in [n for n in runtime.procs if n != "p2"]:
        runtime.stop(name)
    wait_for("p2 runs every task", lambda: runtime.actives("p2") == TASKS)
    assert tables(runtime.stop("p2")) == expected
    changelog = f"{runtime.app}-totals-changelog"
    replay, _ = asyncio.run(_read_changelog(runtime.bootstrap, changelog, "read_committed"))
    assert replay == expected
    outputs = asyncio.run(_read_topic(runtime.bootstrap, output, "read_committed"))
    seen: Counter[tuple[int, int]] = Counter()
    for value in outputs:
        partition, offset, _ = value.decode().split(":")
        seen[(int(partition), int(offset))] += 1
    assert set(seen) == asyncio.run(_input_offsets(runtime.bootstrap, runtime.source))
    return seen


def test_kill9_while_records_flow_outputs_every_record_once(eos: tuple[Runtime, str]) -> None:
    runtime, output = eos
    total = 100_000
    before = runtime.start_two()
    victim, survivor = busiest(before)
    feeder = Feeder(runtime.bootstrap, runtime.source, total, chunk=5000, pause=0.2)
    feeder.start()
    wait_for("30,000 records produced", lambda: feeder.acked >= 30_000)
    # A crash with a transaction open: the victim stops committing, writes a little more
    # (its outputs and changelog writes go out in the open transactions), then dies.
    mine = {int(t.split("_")[1]) for t in before[victim]}
    hold_until_open_transaction(runtime, victim, f"{runtime.app}-totals-changelog", mine)
    runtime.stop(victim, signal.SIGKILL)
    state = runtime.settle()
    assert state[survivor] == TASKS
    feeder.finish()
    wait_caught_up(runtime.bootstrap, runtime.app, runtime.source)
    takeovers = {e["task"] for e in runtime.events(survivor, "restore") if e["source"] == "standby"}
    assert takeovers >= before[victim]
    aborted = check_exact(runtime, output, total)
    print(f"\n{aborted} output records of aborted transactions hidden by read_committed")
    assert aborted > 0, "the kill left no open transaction: the crash path did not run"


def test_frozen_member_writes_nothing_once_fenced(eos: tuple[Runtime, str]) -> None:
    """SIGSTOP past the session timeout while records flow, SIGCONT once the survivor has
    taken over: the woken member's producers are fenced (the survivor initialised their
    transactional ids), so nothing it writes reaches read_committed readers."""
    runtime, output = eos
    total = 60_000
    frozen = freeze_and_wake(runtime, total)  # a transaction open when frozen
    victim, before = frozen.victim, frozen.before
    assert frozen.after[victim] == before[victim], "the woken member did not get its tasks back"
    frozen.feeder.finish()
    wait_caught_up(runtime.bootstrap, runtime.app, runtime.source)
    restored = {e["task"] for e in runtime.events(victim, "restore") if e["t"] > frozen.woke}
    log = (runtime.tmp / f"{victim}.log").read_text()
    aborted = check_exact(runtime, output, total)
    fenced = log.count("transaction failed")
    noticed = log.count("was out of the group") + log.count("left the group (evicted)")
    print(
        f"\n{aborted} output records of aborted transactions hidden; the woken member "
        f"restored {sorted(restored)}; fenced: {fenced} time(s), membership loss noticed: "
        f"{noticed} time(s)"
    )
    # It found out one way or the other (a fenced transaction, or aiokafka's reset member
    # id) and restored what it got back: the zombie path ran.
    assert fenced + noticed > 0
    assert restored == before[victim]  # restored with new producers, never resumed


CUSTOMERS = 600


class OrderFeeder(Feeder):
    """Orders ``first .. total-1`` (key ``c<o % CUSTOMERS>``, value ``{"order": o}``)."""

    async def _produce(self) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=20)
        await producer.start()
        try:
            for start in range(self.first, self.total, self.chunk):
                futures = [
                    await producer.send(
                        self.topic, json.dumps({"order": o}).encode(), key=customer_key(o)
                    )
                    for o in range(start, min(start + self.chunk, self.total))
                ]
                await asyncio.gather(*futures)
                self.acked = min(start + self.chunk, self.total)
                await asyncio.sleep(self.pause)
        finally:
            await producer.stop()


def customer_key(order: int) -> bytes:
    return b"c%d" % (order % CUSTOMERS)


async def _produce_customers(bootstrap: str, topic: str) -> dict[str, str]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    await producer.start()
    try:
        customers = {
            f"c{c}": json.dumps({"id": c, "name": f"customer {c}"}) for c in range(CUSTOMERS)
        }
        for key, value in customers.items():
            await producer.send(topic, value.encode(), key=key.encode())
        await producer.flush()
        return customers
    finally:
        await producer.stop()


def test_join_example_kill9_joins_every_order_once(
    kafka_bootstrap: str,
    kafka_topic_factory: TopicFactory,
    kafka_group_id_factory: GroupIdFactory,
    tmp_path: Path,
) -> None:
    """The orders/customers join of ``examples/orders_join`` under exactly once: a process
    killed (with open transactions) while orders flow; every order comes out once, joined."""
    orders = kafka_topic_factory(PARTITIONS, prefix="orders")
    customers_topic = kafka_topic_factory(PARTITIONS, prefix="customers")
    output = kafka_topic_factory(PARTITIONS, prefix="enriched")
    runtime = Runtime(kafka_bootstrap, kafka_group_id_factory("eos-join"), orders, tmp_path)
    runtime.args = [
        *["--guarantee", "exactly_once", "--output", output, "--join", customers_topic],
        *["--status-interval", "0.1"],
    ]
    total = 30_000
    try:
        customers = asyncio.run(_produce_customers(kafka_bootstrap, customers_topic))
        before = runtime.start_two()
        wait_caught_up(kafka_bootstrap, runtime.app, customers_topic)
        victim, survivor = busiest(before)
        feeder = OrderFeeder(kafka_bootstrap, orders, total, chunk=1000, pause=0.1)
        feeder.start()
        wait_for("10,000 orders produced", lambda: feeder.acked >= 10_000)
        # No more commits, then killed with open transactions. Output partition p is written
        # by task 0_p only (orders and enriched orders are keyed by customer, and partitioned
        # alike), so the victim's open transactions show there.
        mine = {int(t.split("_")[1]) for t in before[victim]}
        hold_until_open_transaction(runtime, victim, output, mine)
        runtime.stop(victim, signal.SIGKILL)
        assert runtime.settle()[survivor] == TASKS
        feeder.finish()
        wait_caught_up(kafka_bootstrap, runtime.app, orders)
        table = tables(runtime.stop(survivor))
        assert table == customers  # the customers table, exact
        committed = asyncio.run(_read_topic(kafka_bootstrap, output, "read_committed"))
        everything = asyncio.run(_read_topic(kafka_bootstrap, output, "read_uncommitted"))
    finally:
        runtime.close()
    seen = Counter(json.loads(v)["order"] for v in committed)
    assert [o for o, n in seen.items() if n > 1] == []
    assert set(seen) == set(range(total))
    unjoined = [
        e
        for e in map(json.loads, committed)
        if e["customer"] != json.loads(customers[customer_key(e["order"]).decode()])
    ]
    assert unjoined == []
    print(f"\n{len(everything) - len(committed)} enriched orders of aborted transactions hidden")
    assert len(everything) > len(committed), "the kill left no open transaction"


def test_a_renewed_producer_fences_the_previous_one(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory
) -> None:
    """Two owners of one task's transactional id: the second's init (``renew``) aborts the
    first's open transaction and fences it; its later sends or commit fail with a fencing
    error (a rejoin cures it) and nothing it wrote is visible ``read_committed``. A record the
    broker rejects (keyless, to a compacted topic) is not taken for fencing."""
    topic = kafka_topic_factory(PARTITIONS, prefix="fenced")
    compacted = kafka_topic_factory(1, prefix="compacted", config={"cleanup.policy": "compact"})
    app_id = f"fence-{topic}"
    task = TaskId(0, 0)

    async def run() -> None:
        zombie = TaskProducers(app_id, kafka_bootstrap, {})
        owner = TaskProducers(app_id, kafka_bootstrap, {})
        try:
            await zombie.renew(task)
            sending = await zombie.sending(task)
            await (await sending.send(topic, b"zombie-1", partition=0))
            await owner.renew(task)
            with pytest.raises(Exception) as fenced:
                await (await sending.send(topic, b"zombie-2", partition=0))
                await zombie.commit(task, {}, app_id)
            assert rejoin_cures(fenced.value), repr(fenced.value)
            producer = await owner.sending(task)
            await (await producer.send(topic, b"owner", partition=0))
            await owner.commit(task, {}, app_id)
            assert await _read_topic(kafka_bootstrap, topic, "read_committed") == [b"owner"]
            producer = await owner.sending(task)
            with pytest.raises(Exception) as rejected:
                await (await producer.send(compacted, b"no key", partition=0))
            assert not rejoin_cures(rejected.value), repr(rejected.value)
        finally:
            await asyncio.gather(zombie.stop(), owner.stop())

    asyncio.run(asyncio.wait_for(run(), 60))


def test_at_least_once_aborts_only_open_transactions_of_the_tasks_it_starts(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory
) -> None:
    """``OrphanTransactions``: a transaction left open under task 0_0's transactional id in
    its changelog partition is aborted (its records hidden, the last stable offset at the high
    watermark again) and its producer fenced; a task whose partition holds only plain writes
    gets no producer; a producer that cannot start is logged, not raised."""
    changelog = kafka_topic_factory(PARTITIONS, prefix="orphans")
    app_id = f"orphans-{changelog}"
    crashed, plain = TaskId(0, 0), TaskId(0, 1)

    async def run() -> None:
        stable = AIOKafkaConsumer(
            bootstrap_servers=kafka_bootstrap, isolation_level="read_committed"
        )
        zombie = AIOKafkaProducer(
            bootstrap_servers=kafka_bootstrap, transactional_id=transactional_id(app_id, crashed)
        )
        writer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        orphans = OrphanTransactions(app_id, kafka_bootstrap, {}, {})
        refused = OrphanTransactions(app_id, kafka_bootstrap, {"transaction_timeout_ms": 10**6}, {})
        await asyncio.gather(stable.start(), zombie.start(), writer.start())
        try:
            await zombie.begin_transaction()
            await zombie.send_and_wait(changelog, b"uncommitted", key=b"k", partition=0)
            await writer.send_and_wait(changelog, b"plain", key=b"k", partition=1)
            tasks = {
                crashed: [TopicPartition(changelog, 0)],
                plain: [TopicPartition(changelog, 1)],
            }
            assert await refused.abort(stable, tasks) == set()  # logged; the restore goes on
            assert await orphans.abort(stable, tasks) == {crashed}
            stable_ends = await topic_ends(kafka_bootstrap, changelog, "read_committed")
            assert stable_ends == await topic_ends(kafka_bootstrap, changelog, "read_uncommitted")
            assert await _read_topic(kafka_bootstrap, changelog, "read_committed") == [b"plain"]
            with pytest.raises(Exception) as fenced:
                await zombie.send_and_wait(changelog, b"later", key=b"k", partition=0)
                await zombie.commit_transaction()
            assert rejoin_cures(fenced.value), repr(fenced.value)
            assert await orphans.abort(stable, tasks) == set()  # nothing open any more
        finally:
            await asyncio.gather(
                orphans.stop(),
                refused.stop(),
                stable.stop(),
                writer.stop(),
                zombie.stop(),
                return_exceptions=True,
            )

    asyncio.run(asyncio.wait_for(run(), 60))


def test_a_transaction_timeout_the_broker_rejects_stops_at_once(kafka_bootstrap: str) -> None:
    """``transaction_timeout_ms`` above the broker's ``transaction.max.timeout.ms`` (15 min
    by default): one ``ProducerStartError``, no retries."""

    async def run() -> None:
        producers = TaskProducers("too-long", kafka_bootstrap, {"transaction_timeout_ms": 10**6})
        try:
            with pytest.raises(ProducerStartError, match="InvalidTransactionTimeout"):
                await producers.renew(TaskId(0, 0))
        finally:
            await producers.stop()

    asyncio.run(asyncio.wait_for(run(), 60))


def test_a_joining_process_warms_up_and_takes_over_at_lag_0(eos: tuple[Runtime, str]) -> None:
    """High availability with exactly once: a process joins while records flow, gets
    warmups, and takes tasks over once they are caught up, with ``acceptable_recovery_lag``
    0: a caught-up copy's lag must be 0 although each changelog ends with a transaction
    marker its store position never counts."""
    runtime, output = eos
    runtime.args += ["--standbys", "0", "--ha", "--lag", "0", "--probing-ms", "1500"]
    total = 30_000
    runtime.start_two()
    feeder = Feeder(runtime.bootstrap, runtime.source, total, chunk=1000, pause=0.05)
    feeder.start()
    wait_for("10,000 records produced", lambda: feeder.acked >= 10_000)
    runtime.start("p3")
    wait_for("the newcomer has warmups", lambda: bool(_last_status(runtime, "p3")["warmup"]))
    feeder.finish()  # no more writes: the warmups can reach lag 0 exactly
    wait_for("the newcomer runs two tasks", lambda: len(runtime.actives("p3")) == 2)
    after = runtime.settle()
    moved = after["p3"]
    statuses = runtime.events("p3", "status")
    warmed = {t for s in statuses if not s["active"] for t in s["warmup"]}
    assert moved <= warmed  # warmups first, never the actives at once
    restores = {e["task"]: e for e in runtime.events("p3", "restore") if e["task"] in moved}
    assert set(restores) == moved
    for task, event in restores.items():
        assert (event["source"], event["records"]) == ("standby", 0), (task, event)
    wait_caught_up(runtime.bootstrap, runtime.app, runtime.source)
    check_exact(runtime, output, total)


def _last_status(runtime: Runtime, name: str) -> dict[str, Any]:
    statuses = runtime.events(name, "status")
    return statuses[-1] if statuses else {"warmup": [], "active": []}


def test_switching_modes_with_every_process_stopped_keeps_state_exact(
    eos: tuple[Runtime, str],
) -> None:
    """at_least_once, then exactly_once, then at_least_once again, every process stopped
    (SIGTERM) between two modes and restarted with the other: each restart resumes from the
    local stores and the changelog written in the other mode, and the tables, the changelog
    (replayed read_committed) and the outputs (every input, at least once) stay exact. An
    aborted commit left in the changelog by exactly once is never applied by at least once."""
    runtime, output = eos
    base = ["--output", output, "--status-interval", "0.1"]
    fed = 0
    for guarantee in ("at_least_once", "exactly_once", "at_least_once"):
        runtime.args = [*base, "--guarantee", guarantee]
        runtime.start_two()
        feeder = Feeder(runtime.bootstrap, runtime.source, fed + 10_000, 1000, 0.02, first=fed)
        feeder.start()
        feeder.finish()
        fed = feeder.total
        wait_caught_up(runtime.bootstrap, runtime.app, runtime.source)
        if guarantee == "at_least_once" and fed > 10_000:
            break  # the last phase: check_exact below stops the processes
        for name in list(runtime.procs):
            runtime.stop(name)
        if guarantee == "exactly_once":  # what a crash between a commit's markers and its end
            changelog = f"{runtime.app}-totals-changelog"
            asyncio.run(_abort_a_commit(runtime.bootstrap, changelog, key_of(0).encode()))
    check_exact_at_least_once(runtime, output, fed)


async def _abort_a_commit(bootstrap: str, changelog: str, key: bytes) -> None:
    """A commit's changelog write and its store marker in a transaction then aborted (as a
    crash between the markers' acks and ``EndTxn`` leaves them, once the task's next
    producer initialises): no restore, in either mode, may apply them."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id="switch-test")
    await producer.start()
    try:
        await producer.begin_transaction()
        sent = await producer.send_and_wait(changelog, b"1000000,1000000", key=key)
        marker = encode_marker({})
        await producer.send_and_wait(changelog, marker, key=COMMIT_KEY, partition=sent.partition)
        await producer.abort_transaction()
    finally:
        await producer.stop()


def test_a_rolling_switch_between_modes_keeps_state_exact(eos: tuple[Runtime, str]) -> None:
    """exactly_once to at_least_once and back, one process at a time while records flow
    (the group runs both modes meanwhile): the tables and the changelog stay exact and
    every input reaches the outputs (at least once: the roll is not exactly once)."""
    runtime, output = eos
    base = ["--output", output, "--status-interval", "0.1"]
    total = 40_000
    runtime.start_two()
    feeder = Feeder(runtime.bootstrap, runtime.source, total, chunk=250, pause=0.1)
    feeder.start()
    flowing = []  # records produced at each restart
    for guarantee in ("at_least_once", "exactly_once"):
        for name in ("p1", "p2"):
            flowing.append(feeder.acked)
            runtime.stop(name)
            runtime.args = [*base, "--guarantee", guarantee]
            runtime.start(name)
            runtime.settle()
    feeder.finish()
    print(f"\nrecords produced at each restart: {flowing} of {total}")
    wait_caught_up(runtime.bootstrap, runtime.app, runtime.source)
    check_exact_at_least_once(runtime, output, total)


class Flow(Feeder):
    """Records ``first``, ``first + 1``, ... as ``Feeder`` makes them, until ``finish``
    (then ``total`` is one past the last)."""

    def __init__(self, bootstrap: str, topic: str, chunk: int, pause: float) -> None:
        super().__init__(bootstrap, topic, 0, chunk, pause)
        self.acked = 0
        self.stopping = threading.Event()

    async def _produce(self) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=20)
        await producer.start()
        try:
            while not self.stopping.is_set():
                start = self.acked
                futures = [
                    await producer.send(self.topic, str(i % 100).encode(), key=key_of(i).encode())
                    for i in range(start, start + self.chunk)
                ]
                await asyncio.gather(*futures)
                self.acked = start + self.chunk
                await asyncio.sleep(self.pause)
        finally:
            await producer.stop()
            self.total = self.acked

    def finish(self) -> None:
        self.stopping.set()
        super().finish()


def _rebalances(runtime: Runtime) -> dict[str, int]:
    """Rebalances each live process has seen (from its last status line)."""
    return {n: runtime.events(n, "status")[-1]["rebalances"] for n in runtime.procs}


def _processed(runtime: Runtime) -> int:
    return sum(runtime.events(n, "status")[-1]["processed"] for n in runtime.procs)


def test_switching_to_at_least_once_right_after_an_exactly_once_crash(
    eos: tuple[Runtime, str],
) -> None:
    """exactly_once while records flow; one process killed (kill -9) with open transactions,
    then the other; both restarted at once in at_least_once. The crashed owner's open
    transactions hold its changelogs' last stable offsets back (until the broker's
    transaction timeout, 60 s): each task that meets one initialises and closes a producer
    with its transactional id before its restore, which aborts them. Without that, every
    commit of those tasks failed its end check and the group rebalanced every commit
    interval. Asserted: few rebalances, none once settled over many commit intervals, exact
    tables and changelog, every input in the outputs (at least once)."""
    runtime, output = eos
    base = ["--output", output, "--status-interval", "0.1"]
    changelog = f"{runtime.app}-totals-changelog"
    before = runtime.start_two()
    victim, survivor = busiest(before)
    mine = {int(t.split("_")[1]) for t in before[victim]}
    flow = Flow(runtime.bootstrap, runtime.source, chunk=200, pause=0.1)
    flow.start()
    wait_for("5,000 records produced", lambda: flow.acked >= 5000)
    hold_until_open_transaction(runtime, victim, changelog, mine)
    runtime.stop(victim, signal.SIGKILL)
    # The whole application down, the survivor too (killed: a clean stop could take longer
    # than the session timeout, after which it would take the victim's tasks and abort them).
    runtime.stop(survivor, signal.SIGKILL)
    left_open = open_transactions(runtime.bootstrap, changelog)
    assert set(left_open) & mine, f"no open transaction left at the switch: {left_open}"
    runtime.args = [*base, "--guarantee", "at_least_once"]
    runtime.start_two()
    settled = _rebalances(runtime)
    processed = _processed(runtime)
    # Records flowing and committed every 0.2 s: 5,000 more records are many commits.
    wait_for("5,000 more records processed", lambda: _processed(runtime) >= processed + 5000)
    after = _rebalances(runtime)
    logs = "".join((runtime.tmp / f"{n}.log").read_text() for n in runtime.procs)
    print(
        f"\nopen transactions at the switch: {left_open}; rebalances seen at settling "
        f"{settled}, {after} after 5,000 more records"
    )
    assert after == settled, "rebalances go on after the restart settled"
    assert sum(after.values()) <= 6, f"a rebalance storm after the restart: {after}"
    assert "open transactions aborted" in logs
    assert not open_transactions(runtime.bootstrap, changelog)
    flow.finish()
    wait_caught_up(runtime.bootstrap, runtime.app, runtime.source)
    check_exact_at_least_once(runtime, output, flow.total)


def test_a_crash_in_each_mode_during_a_rolling_switch_keeps_state_exact(
    eos: tuple[Runtime, str],
) -> None:
    """at_least_once to exactly_once, one process at a time while records flow, each of the
    two processes killed (kill -9) mid-roll: first p1, just switched to exactly once, with
    open transactions (p2, still at least once, takes its tasks over and aborts them), then
    p2, still at least once, with an uncommitted tail (p1, exactly once again, takes its
    tasks over and undoes the tail); p2 comes back in exactly once.

    Asserted: tables and the changelog's read_committed replay exact; every input record in
    the committed outputs at least once (at-least-once tasks send outputs outside
    transactions, and the at-least-once crash makes duplicates); and every input record
    produced after the last at-least-once process died in exactly one committed output, as
    from then on only exactly-once tasks (fenced, transactional) process records."""
    runtime, output = eos
    base = ["--output", output, "--status-interval", "0.1"]
    changelog = f"{runtime.app}-totals-changelog"
    runtime.args = [*base, "--guarantee", "at_least_once"]
    runtime.start("p1")
    runtime.start("p2")
    flow = Flow(runtime.bootstrap, runtime.source, chunk=200, pause=0.1)
    flow.start()
    wait_for("both processes run tasks", lambda: all(map(runtime.actives, ("p1", "p2"))))
    runtime.stop("p1")
    runtime.args = [*base, "--guarantee", "exactly_once"]
    runtime.start("p1")
    p1_tasks = runtime.settle()["p1"]
    hold_until_open_transaction(runtime, "p1", changelog, {int(t[2:]) for t in p1_tasks})
    runtime.stop("p1", signal.SIGKILL)
    wait_for("p2 runs every task", lambda: runtime.actives("p2") == TASKS)
    assert "open transactions aborted" in (runtime.tmp / "p2.log").read_text()
    runtime.start("p1")
    p2_tasks = runtime.settle()["p2"]
    hold_until_uncommitted(runtime, "p2", changelog, {int(t[2:]) for t in p2_tasks})
    runtime.stop("p2", signal.SIGKILL)
    # From here on no at-least-once process is left: whatever comes later in the input is
    # processed by exactly-once tasks only.
    no_alos = asyncio.run(topic_ends(runtime.bootstrap, runtime.source, "read_uncommitted"))
    wait_for("p1 runs every task", lambda: runtime.actives("p1") == TASKS)
    runtime.start("p2")
    later = sum(no_alos.values()) + 3000
    wait_for("3,000 more records produced", lambda: flow.acked >= later)
    flow.finish()
    wait_caught_up(runtime.bootstrap, runtime.app, runtime.source)
    undone = [e for e in runtime.events("p1", "restore") if e["task"] in p2_tasks]
    seen = check_exact_at_least_once(runtime, output, flow.total)
    twice = sorted(k for k, n in seen.items() if n > 1)
    after = [k for k, n in seen.items() if k[1] >= no_alos[k[0]]]
    print(
        f"\n{flow.total} records; {len(twice)} output twice or more (at least once), "
        f"{len(after)} produced after the last at-least-once process died; p1 undid "
        f"{sum(e['compensated'] for e in undone)} writes of p2's uncommitted tail"
    )
    assert after, "no record came after the roll"
    assert [k for k in after if seen[k] != 1] == []
    assert sum(e["compensated"] for e in undone) > 0, "p2's crash left nothing to undo"
