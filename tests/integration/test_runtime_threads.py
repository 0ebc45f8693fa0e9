"""Exactly once with several consumers per process (``threads=2``) on a real broker (issue 21).

The summing worker of ``test_runtime.py`` with ``--guarantee exactly_once --output`` (see
``test_runtime_eos.py``): outputs read ``read_committed`` must hold every input record once,
and the tables must be exact. Inside one process the consumers share each task's transactional
producer, so when a task moves between two of them no broker fencing tells the old one to stop:
the runtime's ownership check does (``Processing.process_batch``).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import GroupIdFactory, TopicFactory
from .test_runtime import TASKS, Feeder, Runtime, busiest, wait_caught_up
from .test_runtime_eos import StableAndHigh, check_exact, eos_runtime
from .test_runtime_membership import wait_for


@pytest.fixture
def threads(
    kafka_bootstrap: str,
    kafka_topic_factory: TopicFactory,
    kafka_group_id_factory: GroupIdFactory,
    tmp_path: Path,
) -> Iterator[tuple[Runtime, str]]:
    group = kafka_group_id_factory("threads")
    yield from eos_runtime(kafka_bootstrap, kafka_topic_factory, group, tmp_path, "--threads", "2")


def test_kill9_with_two_consumers_per_process_outputs_every_record_once(
    threads: tuple[Runtime, str],
) -> None:
    runtime, output = threads
    total = 30_000
    before = runtime.start_two()
    victim, survivor = busiest(before)
    feeder = Feeder(runtime.bootstrap, runtime.source, total, chunk=2000, pause=0.1)
    feeder.start()
    wait_for("10,000 records produced", lambda: feeder.acked >= 10_000)
    # A crash with transactions open: the victim stops committing, processes a little more,
    # then dies; its tasks move to the survivor's two consumers while records flow.
    runtime.procs[victim].proc.send_signal(signal.SIGUSR2)
    changelog = f"{runtime.app}-totals-changelog"
    partitions = sorted(int(t.split("_")[1]) for t in before[victim])
    with StableAndHigh(runtime.bootstrap, changelog) as changelog_ends:

        def left_open() -> bool:
            """A transaction of the victim's stays open across two looks 0.3 s apart (its
            last stable offset unchanged, records after it): it will never commit."""
            before = changelog_ends.look()
            time.sleep(0.3)
            now = changelog_ends.look()
            return any(now[p][0] == before[p][0] < now[p][1] for p in partitions)

        wait_for("the victim processes records it will not commit", left_open)
    runtime.stop(victim, signal.SIGKILL)
    assert runtime.settle()[survivor] == TASKS
    feeder.finish()
    wait_caught_up(runtime.bootstrap, runtime.app, runtime.source)
    aborted = check_exact(runtime, output, total)
    assert aborted > 0, "the kill left no open transaction: the crash path did not run"


def test_a_task_moved_to_a_sibling_consumer_mid_record_is_processed_once(
    threads: tuple[Runtime, str],
) -> None:
    """One process, two consumers. The processor of task 0_0 awaits on one record of a large
    batch longer than ``max_poll_interval_ms``: its consumer leaves the group, the sibling
    consumer takes every task, task 0_0 included, while the first is still inside its batch.
    The stall lasts until the sibling has had a batch with the record's partition in it (or
    paused). The first then drops the record and the rest of its batch; the sibling
    processes them, once."""
    runtime, output = threads
    total = 20_000
    feeder = Feeder(runtime.bootstrap, runtime.source, total, chunk=5000, pause=0.0)
    feeder.start()
    feeder.finish()  # a backlog: the first fetch is a large batch
    runtime.args += ["--stall", "0:100:40", "--max-poll-ms", "3000"]
    runtime.start("p1")
    wait_for("the stall began", lambda: runtime.events("p1", "stall"))
    wait_for("the stall ended", lambda: runtime.events("p1", "stalled"))
    (stalled,) = runtime.events("p1", "stalled")
    assert stalled["moved"], "task 0_0 did not move to the sibling consumer during the stall"
    # The sibling had its chance to process the stalled record (without the checks it does,
    # and the stalled consumer then processes it again: counts and outputs twice).
    assert stalled["sibling_batches"] > 0, "the sibling consumer fetched nothing meanwhile"
    wait_caught_up(runtime.bootstrap, runtime.app, runtime.source)
    check_exact(runtime, output, total)  # tables, changelog replay, every output once
