"""aiokafka's lines repeated while a broker is away are held back, counted (``floods``)."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import resource
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, NamedTuple

import pytest
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaConnectionError, NodeNotReadyError
from aiokafka.producer.sender import Sender

from streamassign import Subtopology, Topology
from streamassign.aiokafka import floods
from streamassign.aiokafka.floods import (
    AIOKAFKA_LOGGER,
    EPISODE_GAP,
    LINES_WINDOW,
    REPEATING,
    BrokerAwayLines,
    back_off_metadata_updates,
)
from streamassign.errors import ExtraVersionError

from .waiting import readable_within

if TYPE_CHECKING:
    from streamassign.runtime import App, ProcessorFactory


class Runtime(NamedTuple):
    """What the tests of the filter under an ``App`` use of the runtime."""

    app_class: type[App]
    app_module: ModuleType
    adder: ProcessorFactory


@pytest.fixture
def runtime() -> Runtime:
    """The runtime, imported here: the tests using it skip where aiokafka is below the
    runtime's floor (scripts/lowest.py's faust profile installs the aiokafka extra's 0.11,
    and the runtime refuses it at import), the filter's own tests still run there. Not in CI,
    whose install (the dev extra) has the runtime's aiokafka: a refusal there fails, as
    scripts/test.sh fails CI rather than skip the browser test, never a silent skip."""
    try:
        from streamassign.runtime import App
        from streamassign.runtime import app as app_module

        from .test_runtime_processing import Adder
    except ExtraVersionError as refused:
        if os.environ.get("CI"):
            pytest.fail(f"CI's install refused by the runtime: {refused}")
        pytest.skip(str(refused))
    return Runtime(App, app_module, Adder)


@pytest.fixture(autouse=True)
def no_other_filter() -> Iterator[None]:
    """The process's filter, left on the loggers by other tests (on if they never stopped an
    ``App``), is taken off for each test, whose own first attach makes another; the loggers'
    lists are put back as they were after it."""
    loggers = [logging.getLogger(name) for name in REPEATING]
    kept = {logger: logger.filters for logger in loggers}
    for logger in loggers:
        logger.filters = [f for f in logger.filters if not isinstance(f, BrokerAwayLines)]
    yield
    for logger, filters in kept.items():
        logger.filters = filters


def ours(name: str) -> list[BrokerAwayLines]:
    """The line filters on the logger ``name``."""
    return [f for f in logging.getLogger(name).filters if isinstance(f, BrokerAwayLines)]


def users_filters() -> dict[str, list[logging.Filter | object]]:
    """Every other filter, by logger of ``REPEATING``."""
    return {
        name: [f for f in logging.getLogger(name).filters if not isinstance(f, BrokerAwayLines)]
        for name in REPEATING
    }


def switched_off() -> bool:
    """Whether the one shared filter is first on each logger of ``REPEATING``, switched off."""
    first = {logging.getLogger(name).filters[0] for name in REPEATING}
    return all(len(ours(name)) == 1 for name in REPEATING) and [
        isinstance(f, BrokerAwayLines) and not f.active for f in first
    ] == [True]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_repeated_line_is_logged_once_per_node_per_window_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A producer's metadata loop with the broker refusing: 2,000 lines in 1 s were logged
    (aiokafka's ``_sender_routine``); now 1 per node per window, the next one counting."""
    clock = Clock()
    lines = BrokerAwayLines(window=30.0, clock=clock)
    aiokafka = logging.getLogger(AIOKAFKA_LOGGER)
    aiokafka.addFilter(lines)
    try:
        with caplog.at_level(logging.WARNING, AIOKAFKA_LOGGER):
            for i in range(1000):
                clock.now = i / 1000
                aiokafka.error("Unable connect to node with id %s: %s", 1, "[Errno 111] refused")
                aiokafka.error("Unable to update metadata from %s", [1])
            aiokafka.error("Unable connect to node with id %s: %s", 2, "[Errno 111] refused")
            aiokafka.error("Topic %s not found", "events")  # not one of them: passes
            aiokafka.error("Topic %s not found", "events")
            clock.now = 31.0
            aiokafka.error("Unable connect to node with id %s: %s", 1, "[Errno 111] refused")
    finally:
        aiokafka.removeFilter(lines)
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "Unable connect to node with id 1: [Errno 111] refused",
        "Unable to update metadata from [1]",
        "Unable connect to node with id 2: [Errno 111] refused",
        "Topic events not found",
        "Topic events not found",
        "Unable connect to node with id 1: [Errno 111] refused "
        "(999 similar lines suppressed over 1.0 s)",
    ]
    assert lines.suppressed == 1998
    assert lines.summary() == (
        "aiokafka: 999 similar lines suppressed (999 failed connections and metadata updates; "
        "each line logged once per 30 s; broker unreachable?)"
    )
    assert lines.summary() is None


def test_an_app_holds_the_lines_back_from_start_to_stop_only(
    runtime: Runtime,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Attached by ``start()`` and switched off by ``stop()`` (here: ``run()`` after a failed
    start, the broker away) with one line counting what it held back; no other filter
    changes."""
    topology = Topology([Subtopology(0, ["events"], stores=[])], name="app")
    app = runtime.app_class(
        topology, {0: runtime.adder}, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path
    )
    aiokafka = logging.getLogger(AIOKAFKA_LOGGER)
    before = users_filters()

    async def broker_away(*args: object, **kwargs: object) -> None:
        for _ in range(500):
            aiokafka.error("Unable to update metadata from %s", [1])
        raise KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 1)]")

    monkeypatch.setattr(runtime.app_module, "ensure_internal_topics", broker_away)
    with caplog.at_level(logging.WARNING), pytest.raises(KafkaConnectionError):
        asyncio.run(app.run())
    said = [r.getMessage() for r in caplog.records]
    assert users_filters() == before and switched_off()
    assert [m for m in said if m.startswith("Unable to update metadata")] == [
        "Unable to update metadata from [1]"
    ]
    assert (
        "aiokafka: 499 similar lines suppressed (499 failed connections and metadata updates; "
        "each line logged once per 30 s; broker unreachable?)" in said
    )


NOT_READY = NodeNotReadyError("Attempt to send a request to node which is not ready (node id 1).")
CLOSED = KafkaConnectionError("Connection at 127.0.0.1:9092 closed")


def retries(round_: int) -> None:
    """One round of the retries of aiokafka's clients while node 1 is away, as measured (a
    runtime with 3 tasks, exactly once, the broker stopped): on the clients' own loggers."""
    fetcher = logging.getLogger("aiokafka.consumer.fetcher")
    fetcher.error("Failed fetch messages from %s: %s", 1, NOT_READY)
    logging.getLogger("aiokafka.consumer.group_coordinator").error(
        "Group Coordinator Request failed: %s", NOT_READY
    )
    logging.getLogger("aiokafka.producer.sender").warning(
        "Got error produce response: %s", NOT_READY
    )
    if round_ == 5:  # another cause, another node: the first of their own
        fetcher.error("Failed fetch messages from %s: %s", 1, CLOSED)
        fetcher.error("Failed fetch messages from %s: %s", 2, NOT_READY)
        # Not one of the repeating lines: passes each time.
        logging.getLogger("aiokafka.consumer.group_coordinator").warning(
            "Marking the coordinator dead (node %s)for group %s.", 1, "app"
        )


def test_the_clients_retry_lines_are_held_back_on_their_own_loggers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The fetchers', coordinators' and senders' retries (about 50 lines/s while a broker was
    away) are logged on child loggers, whose records the ``aiokafka`` logger's filters never
    see: the shared filter is on each. Per node and cause; the summary names each kind."""
    clock = Clock()
    lines = BrokerAwayLines.attach()
    lines._clock = clock
    try:
        with caplog.at_level(logging.INFO, AIOKAFKA_LOGGER):
            for round_ in range(300):  # 30 s of retries every 100 ms
                clock.now = round_ / 10
                retries(round_)
            clock.now = 30.0
            retries(300)
    finally:
        summary = lines.detach()
    said = [r.getMessage() for r in caplog.records]
    window_ended = " (299 similar lines suppressed over 30 s)"
    assert said == [
        f"Failed fetch messages from 1: {NOT_READY}",
        f"Group Coordinator Request failed: {NOT_READY}",
        f"Got error produce response: {NOT_READY}",
        f"Failed fetch messages from 1: {CLOSED}",
        f"Failed fetch messages from 2: {NOT_READY}",
        "Marking the coordinator dead (node 1)for group app.",
        f"Failed fetch messages from 1: {NOT_READY}{window_ended}",
        f"Group Coordinator Request failed: {NOT_READY}{window_ended}",
        f"Got error produce response: {NOT_READY}{window_ended}",
    ]
    assert lines.suppressed == 897
    assert summary is None  # all said by the lines after the window
    assert switched_off() and all(ours(name) == [lines] for name in REPEATING)


def test_the_summary_counts_each_kind_of_line_held_back() -> None:
    lines = BrokerAwayLines.attach()
    try:
        for round_ in range(10):
            retries(round_)
            logging.getLogger(AIOKAFKA_LOGGER).error("Unable to update metadata from %s", [1])
    finally:
        summary = lines.detach()
    assert summary == (
        "aiokafka: 36 similar lines suppressed (9 failed fetches, 9 failed coordinator lookups, "
        "9 failed produce requests, 9 failed connections and metadata updates; each line "
        "logged once per 30 s; broker unreachable?)"
    )


def test_lines_of_nodes_long_gone_are_forgotten() -> None:
    """A long-running process meets many nodes and errors: only lines in their window, or
    with a count not yet said, are kept."""
    clock = Clock()
    lines = BrokerAwayLines(clock=clock)
    fetcher = logging.getLogger("aiokafka.consumer.fetcher")
    for node in range(100):
        clock.now = node * 31.0
        record = fetcher.makeRecord(
            fetcher.name, logging.ERROR, __file__, 1, "Failed fetch messages from %s: %s",
            (node, NOT_READY), None,
        )  # fmt: skip
        assert lines.filter(record)
    assert len(lines._lines) <= 2  # swept once per window


def test_two_apps_share_one_filter_which_the_last_to_stop_switches_off(
    runtime: Runtime,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two ``App``s in one process (tests; one process running two topologies). With one
    filter each, the first held back every repeat and the second counted none. Now: one
    filter; each ``App``'s stop says what was held back and not yet said; the first to stop
    leaves it to the other; the last switches it off."""
    topology = Topology([Subtopology(0, ["events"], stores=[])], name="app")
    first, second = (
        runtime.app_class(
            topology, {0: runtime.adder}, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path / name
        )
        for name in ("first", "second")
    )
    before = users_filters()
    second_stopped = asyncio.Event()
    attached: list[list[BrokerAwayLines]] = []

    async def broker_away(*args: object, **kwargs: object) -> None:
        attached.append(
            [
                f
                for f in logging.getLogger(AIOKAFKA_LOGGER).filters
                if isinstance(f, BrokerAwayLines)
            ]
        )
        if len(attached) == 1:  # the first: started until the second has stopped
            await second_stopped.wait()
        for round_ in range(50):
            retries(round_)
        raise KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 1)]")

    async def second_then_first() -> None:
        running = asyncio.ensure_future(first.run())
        while not attached:
            await asyncio.sleep(0)
        with pytest.raises(KafkaConnectionError):
            await second.run()
        assert all(f.active for name in REPEATING for f in ours(name))
        second_stopped.set()
        with pytest.raises(KafkaConnectionError):
            await running

    monkeypatch.setattr(runtime.app_module, "ensure_internal_topics", broker_away)
    with caplog.at_level(logging.WARNING):
        asyncio.run(second_then_first())
    assert len(attached[1]) == 1 and attached[1] == attached[0]
    summaries = [r.getMessage() for r in caplog.records if "suppressed" in r.getMessage()]
    # The second's lines: the first of each cause passed, the rest held back; the first's:
    # all held back, their windows not ended (with the other cause and node of round 5).
    assert summaries == [
        "aiokafka: 147 similar lines suppressed (49 failed fetches, 49 failed coordinator "
        "lookups, 49 failed produce requests; each line logged once per 30 s; broker "
        "unreachable?)",
        "aiokafka: 152 similar lines suppressed (52 failed fetches, 50 failed coordinator "
        "lookups, 50 failed produce requests; each line logged once per 30 s; broker "
        "unreachable?)",
    ]
    assert users_filters() == before and switched_off()


def filtered(lines: BrokerAwayLines, logger: str, msg: str, *args: object) -> bool:
    """Whether ``lines`` passes one record of ``logger``."""
    record = logging.getLogger(logger).makeRecord(
        logger, logging.ERROR, __file__, 1, msg, args, None
    )
    return lines.filter(record)


def test_a_broker_list_in_any_order_is_one_line() -> None:
    """aiokafka shuffles the brokers it names in ``Unable to update metadata from %s``: keyed
    on the list as given, a cluster of 6 brokers would pass 247 of 300 lines."""
    lines = BrokerAwayLines(clock=Clock())
    brokers = list(range(6))
    passed = 0
    for turn in range(300):
        shuffled = brokers[turn % 6 :] + brokers[: turn % 6]
        passed += filtered(lines, AIOKAFKA_LOGGER, "Unable to update metadata from %s", shuffled)
    assert passed == 1 and lines.suppressed == 299


def test_another_outage_passes_its_first_line_saying_what_the_last_held_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A second outage within 30 s of the first logs its first line, and the first's held
    count is said then, not left for the next line or the stop: after ``EPISODE_GAP`` s
    without the line, its next one passes with the count and the span of the last outage."""
    clock = Clock()
    lines = BrokerAwayLines(clock=clock)
    fetcher = logging.getLogger("aiokafka.consumer.fetcher")
    fetcher.addFilter(lines)
    try:
        with caplog.at_level(logging.ERROR, "aiokafka.consumer.fetcher"):
            for tenth in range(81):  # an outage of 8 s, a retry every 100 ms
                clock.now = tenth / 10
                fetcher.error("Failed fetch messages from %s: %s", 1, NOT_READY)
            clock.now = 8.0 + EPISODE_GAP + 1  # the broker came back; away again
            fetcher.error("Failed fetch messages from %s: %s", 1, NOT_READY)
    finally:
        fetcher.removeFilter(lines)
    assert [r.getMessage() for r in caplog.records] == [
        f"Failed fetch messages from 1: {NOT_READY}",
        f"Failed fetch messages from 1: {NOT_READY} (80 similar lines suppressed over 7.9 s)",
    ]


def test_churning_lines_are_swept_into_the_summary_and_do_not_pile_up() -> None:
    """An hour of new error texts, each logged twice: unswept, every line would be kept
    until the stop (36,000 kept). Lines whose episode ended are swept once per window, their
    counts kept per kind for the summary."""
    clock = Clock()
    lines = BrokerAwayLines(clock=clock)
    for second in range(3600):
        clock.now = float(second)
        for _ in range(2):
            filtered(
                lines, "aiokafka.consumer.fetcher", "Failed fetch messages from %s: %s", 1, second
            )
    assert len(lines._lines) <= 2 * (LINES_WINDOW + 1)
    assert lines.summary() == (
        "aiokafka: 3600 similar lines suppressed (3600 failed fetches; each line logged once "
        "per 30 s; broker unreachable?)"
    )


def test_a_count_said_by_the_summary_is_not_said_again_and_the_span_starts_after_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another ``App``'s stop says what was held back; the next line says only what came
    after, over the span it came in, not the window's whole span."""
    clock = Clock()
    lines = BrokerAwayLines(clock=clock)
    for tenth in range(100):
        clock.now = tenth / 10
        filtered(lines, "aiokafka.consumer.fetcher", "Failed fetch messages from %s: %s", 1, "x")
    assert lines.summary() is not None
    for tenth in range(100, 300):  # the outage goes on
        clock.now = tenth / 10
        filtered(lines, "aiokafka.consumer.fetcher", "Failed fetch messages from %s: %s", 1, "x")
    record = logging.getLogger("aiokafka.consumer.fetcher").makeRecord(
        "aiokafka.consumer.fetcher", logging.ERROR, __file__, 1,
        "Failed fetch messages from %s: %s", (1, "x"), None,
    )  # fmt: skip
    clock.now = 30.0
    assert lines.filter(record)
    said = "Failed fetch messages from 1: x (200 similar lines suppressed over 20 s)"
    assert record.getMessage() == said


def test_threads_logging_at_once_through_one_filter_count_every_line() -> None:
    """A Faust worker's consumer logs from its own thread: the filter's state is locked
    (unlocked, a sweep met a dict changing under it and raised out of ``logger.error``)."""
    lines = BrokerAwayLines()
    errors: list[BaseException] = []

    def log_many(node: int) -> None:
        try:
            for _ in range(20_000):
                filtered(lines, AIOKAFKA_LOGGER, "Unable connect to node with id %s: %s", node, "x")
        except BaseException as exc:  # what a thread raised is the failure
            errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=log_many, args=(node,)) for node in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == [] and lines.suppressed == 4 * 20_000 - 4


def test_only_the_first_attach_changes_the_loggers_filters() -> None:
    """An attach or detach that replaced every logger's list of filters would lose a user's
    ``addFilter`` or ``removeFilter`` in another thread between our read and our assignment
    (1 add lost and 19 removes undone in 4,385 rounds). So only the first attach of a process
    puts the filter on the loggers and nothing else ever replaces a list: starts and stops
    only switch it on and off, and the user's filters, changed in place meanwhile, stay as
    the user left them."""
    lines = BrokerAwayLines.attach()
    lists = {name: logging.getLogger(name).filters for name in REPEATING}
    fetcher = logging.getLogger("aiokafka.consumer.fetcher")
    users = logging.Filter()
    try:
        other = BrokerAwayLines.attach()  # a second App
        fetcher.addFilter(users)
        lines.detach()
        assert other is lines and lines.active  # one user left
        other.detach()
        assert not lines.active
        assert BrokerAwayLines.attach() is lines and lines.active
        fetcher.removeFilter(users)
    finally:
        lines.detach()
    assert all(logging.getLogger(name).filters is lists[name] for name in REPEATING)
    assert fetcher.filters == [lines] and switched_off()


def test_a_detached_filter_passes_every_line_and_forgets_the_outage() -> None:
    """Switched off, the filter stays on the loggers for good: it passes every line unchanged
    and keeps nothing (no memory of the outage it saw: attached again, it starts afresh)."""
    clock = Clock()
    lines = BrokerAwayLines.attach()
    lines._clock = clock
    away = ("aiokafka.consumer.fetcher", "Failed fetch messages from %s: %s", 1, NOT_READY)
    try:
        assert [filtered(lines, *away) for _ in range(10)] == [True] + [False] * 9
    finally:
        summary = lines.detach()
    assert summary is not None and "9 failed fetches" in summary
    assert all(filtered(lines, *away) for _ in range(1000))  # passed, unchanged
    assert lines.suppressed == 9 and lines._lines == {} and lines._unsaid == {}
    clock.now += 5  # the same outage's window, were it remembered
    assert BrokerAwayLines.attach() is lines
    try:
        record = logging.getLogger(away[0]).makeRecord(
            away[0], logging.ERROR, __file__, 1, away[1], away[2:], None
        )
        assert lines.filter(record) and "suppressed" not in record.getMessage()
        assert not filtered(lines, *away)
    finally:
        assert lines.detach() is not None


class Said(logging.Handler):
    """The messages of the records it handles."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


#: A descriptor ``select.select`` refuses (it takes those below 1024 only).
HIGH_DESCRIPTOR = 1030


def forked(child: Callable[[], object], seconds: float = 30.0) -> object:
    """What ``child()`` returns (as JSON) in a forked child of this process; a child still
    running after ``seconds`` (stuck on a lock) is killed and fails the test."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answers through the pipe and ends without pytest's teardown
        code = 1
        try:
            os.close(read_end)
            os.write(write_end, json.dumps(child()).encode())
            code = 0
        except BaseException:
            # os._exit ends the child before Python would print why it failed
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(code)
    os.close(write_end)
    answer = b""
    deadline = time.monotonic() + seconds
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not readable_within(read_end, left):
                os.kill(pid, signal.SIGKILL)
                pytest.fail(f"the forked child gave no answer within {seconds} s")
            if not (chunk := os.read(read_end, 65536)):
                break
            answer += chunk
    finally:
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
    exit_code = os.waitstatus_to_exitcode(status)
    assert exit_code == 0, f"the forked child failed (exit code {exit_code}); see its stderr"
    return json.loads(answer)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")
def test_forked_answers_on_a_pipe_above_descriptor_1024() -> None:
    """Run in one process after tests that leave descriptors open (the Faust tests' event
    loops and state-directory locks), ``forked``'s pipe gets descriptors above 1024, which
    ``select.select`` refuses: its wait must not. The soft limit is raised for the test when the
    hard one allows (1024 is a common soft default)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = HIGH_DESCRIPTOR + 64
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"at most {hard} open files here")
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    held: list[int] = []
    try:
        while not held or held[-1] < HIGH_DESCRIPTOR:  # the lowest free ones, held
            held.append(os.open(os.devnull, os.O_RDONLY))
        assert forked(lambda: "answered") == "answered"
    finally:
        for descriptor in held:
            os.close(descriptor)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")
def test_a_forked_child_s_filter_is_unlocked_unused_and_holds_back_its_own_lines() -> None:
    """Forked while a thread held the attach lock and the filter's own (here the test holds
    both across the fork) and an ``App`` of the parent used the filter, the child attaches the
    same filter, which passes the first of its lines (the parent's window is not the child's)
    and holds back the rest, and its one detach switches it off and says only what the child
    held back. Without the at-fork reset the child's attach would wait forever on the locks,
    and the parent's user, still counted, would keep the filter on after the child's last
    detach."""
    lines = BrokerAwayLines.attach()
    aiokafka = logging.getLogger(AIOKAFKA_LOGGER)
    said = Said()
    aiokafka.addHandler(said)
    refused = ("Unable connect to node with id %s: %s", 1, "[Errno 111] refused")

    def child() -> object:
        said.messages.clear()
        attached = BrokerAwayLines.attach()
        for _ in range(5):
            aiokafka.error(*refused)
        summary = attached.detach()
        return [attached is lines, said.messages, summary, attached.active, attached.users]

    try:
        for _ in range(3):
            aiokafka.error(*refused)
        with floods._ATTACHING, lines._lock:
            answer = forked(child)
    finally:
        aiokafka.removeHandler(said)
        lines.detach()
    assert answer == [
        True,
        ["Unable connect to node with id 1: [Errno 111] refused"],
        "aiokafka: 4 similar lines suppressed (4 failed connections and metadata updates; "
        "each line logged once per 30 s; broker unreachable?)",
        False,
        0,
    ]
    assert said.messages == ["Unable connect to node with id 1: [Errno 111] refused"]
    assert lines.suppressed == 2  # the parent's filter is as it was


def test_the_filter_goes_before_the_user_s_own_filters() -> None:
    """A user's filter that renders the message first (redaction, structured logging) would
    leave ours nothing to recognise."""
    fetcher = logging.getLogger("aiokafka.consumer.fetcher")
    users = logging.Filter()
    fetcher.addFilter(users)
    lines = BrokerAwayLines.attach()
    try:
        assert fetcher.filters[0] is lines and users in fetcher.filters
    finally:
        lines.detach()
        fetcher.removeFilter(users)


@pytest.mark.parametrize("step", ["attach", "detach"])
def test_attaching_or_detaching_while_a_record_goes_through_the_filters_skips_none_of_them(
    step: str,
) -> None:
    """Another thread attaches or detaches (an ``App`` or a Faust worker starting or
    stopping) while a record goes through a logger's filters: changed in place, the list
    would shift under the loop, which would apply the user's next filter twice (an insert)
    or skip it (a removal). Here the switch comes from inside the loop, at the user's first
    filter: the same interleaving, every time."""
    fetcher = logging.getLogger("aiokafka.consumer.fetcher")
    held: list[BrokerAwayLines] = [BrokerAwayLines.attach()] if step == "detach" else []
    seen: list[str] = []

    def switching(record: logging.LogRecord) -> bool:
        seen.append("switching")
        if step == "attach":
            held.append(BrokerAwayLines.attach())
        else:
            held.pop().detach()
        return True

    def counting(record: logging.LogRecord) -> bool:
        seen.append("counting")
        return True

    fetcher.addFilter(switching)
    fetcher.addFilter(counting)
    try:
        record = fetcher.makeRecord(fetcher.name, logging.INFO, __file__, 1, "a line", (), None)
        assert fetcher.filter(record)
        assert seen == ["switching", "counting"]
        assert fetcher.filters == [*ours(fetcher.name), switching, counting]  # ours first
        assert [f.active for f in ours(fetcher.name)] == [step == "attach"]
    finally:
        fetcher.removeFilter(switching)
        fetcher.removeFilter(counting)
        for lines in held:
            lines.detach()


def test_a_failed_start_detaches_the_filter(
    runtime: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``start()`` raising with no ``stop()`` after it (a caller that does not use ``run()``)
    detaches the filter: a user left counted would keep it switched on for ever."""
    topology = Topology([Subtopology(0, ["events"], stores=[])], name="app")
    app = runtime.app_class(
        topology, {0: runtime.adder}, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path
    )
    before = users_filters()

    async def broker_away(*args: object, **kwargs: object) -> None:
        raise KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 1)]")

    monkeypatch.setattr(runtime.app_module, "ensure_internal_topics", broker_away)
    for _ in range(3):
        with pytest.raises(KafkaConnectionError):
            asyncio.run(app.start())
    assert users_filters() == before and switched_off()


def test_run_cleans_up_a_failed_start_under_the_filter(
    runtime: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run()``'s ``stop()`` after a failed start (a broker away: its clients retry and
    log while they close) still has the line filter; it is switched off at the end."""
    topology = Topology([Subtopology(0, ["events"], stores=[])], name="app")
    app = runtime.app_class(
        topology, {0: runtime.adder}, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path
    )
    before = users_filters()
    filtered_during_stop: list[bool] = []
    stop_steps = app._stop_steps

    async def broker_away(*args: object, **kwargs: object) -> None:
        raise KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 1)]")

    async def recording_stop_steps() -> None:
        filtered_during_stop.append(any(f.active for f in ours(next(iter(REPEATING)))))
        await stop_steps()

    monkeypatch.setattr(runtime.app_module, "ensure_internal_topics", broker_away)
    monkeypatch.setattr(app, "_stop_steps", recording_stop_steps)
    with pytest.raises(KafkaConnectionError):
        asyncio.run(app.run())
    assert filtered_during_stop == [True]
    assert users_filters() == before and switched_off()


class RefusedClient:
    """A client whose every metadata update fails at once (its broker refuses connections),
    as aiokafka's does: one pending update shared by callers, ending False."""

    def __init__(self) -> None:
        self.updates = 0
        self._retry_backoff = 0.1
        self._pending: asyncio.Future[bool] | None = None

    def force_metadata_update(self) -> asyncio.Future[bool]:
        if self._pending is None:
            self.updates += 1
            self._pending = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(self._fail)
        return self._pending

    def _fail(self) -> None:
        assert self._pending is not None
        self._pending.set_result(False)
        self._pending = None


class Producer:
    def __init__(self) -> None:
        self.client = RefusedClient()


async def sender_loop(producer: Producer, seconds: float) -> None:
    """aiokafka's ``_sender_routine`` while a batch's leader is unknown: update, wait, again."""
    deadline = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < deadline:
        await asyncio.wait([producer.client.force_metadata_update()])


def test_a_producer_waits_its_backoff_between_failed_metadata_updates() -> None:
    """Without a backoff the sender's loop ran a metadata update each time the last one failed
    (2,900/s against a refused port, 57% of a core); now one per ``retry_backoff_ms``."""

    async def run() -> tuple[int, int]:
        spinning, backed_off = Producer(), Producer()
        back_off_metadata_updates(backed_off)
        await asyncio.gather(sender_loop(spinning, 1.0), sender_loop(backed_off, 1.0))
        return spinning.client.updates, backed_off.client.updates

    spinning, backed_off = asyncio.run(run())
    assert 1 <= backed_off <= 12  # every 0.1 s: 10 in 1 s (fewer on a loaded machine)
    assert spinning > 10 * backed_off and spinning > 100


def test_a_successful_metadata_update_ends_the_backoff() -> None:
    async def run() -> list[bool]:
        producer = Producer()
        back_off_metadata_updates(producer)
        force = producer.client.force_metadata_update
        assert (await force()) is False  # failed: the next waits
        within = force()
        assert producer.client.updates == 1 and not within.done()
        assert (await within) is False and producer.client.updates == 1
        ok: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        producer.client._pending = ok  # the next one succeeds
        update = force()
        ok.set_result(True)
        producer.client._pending = None
        return [await update, force() is not update, producer.client.updates == 2]

    assert asyncio.run(run()) == [True, True, True]


def test_aiokafka_s_sender_asks_its_client_for_metadata_through_the_instance() -> None:
    """``back_off_metadata_updates`` replaces the method on the client instance: aiokafka
    must still call it through ``self.client`` and keep ``_retry_backoff``."""
    routine = inspect.getsource(Sender._sender_routine)
    assert "self.client.force_metadata_update()" in routine
    assert "self._retry_backoff =" in inspect.getsource(AIOKafkaClient.__init__)
