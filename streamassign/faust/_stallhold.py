"""Hold a stalled worker's changelog sends until its group membership is resolved (a zombie's
stale writes, docs/faust.md).

A worker stopped past its session timeout (SIGSTOP, a GC pause, a frozen VM) resumes as a
zombie: for some milliseconds its agents process the events already in their queues and
change their tables from their state before the stall, and Faust sends those changes to the
changelog after the new owner's (``Table.send_changelog``, ``faust/tables/base.py:266``). No
fencing applies under at-least-once, so the stale values land last and every replay keeps
them: counts lost.

The stall is seen where the sends are made, deterministically: a main-loop tick stamps
``time.monotonic()`` (CLOCK_MONOTONIC counts on while the process is stopped), and each
changelog send first compares the time since the last stamp with ``threshold``: the broker
expires a session ``broker_session_timeout`` after the last heartbeat it got, which was sent
at most ``broker_heartbeat_interval`` before the stall began (one tick less, for the stamp's
age). Whichever comes first after the resume (the tick or a send) starts the hold. A worker
cut off by the network is the same zombie with its loop running: a silence, no heartbeat the
broker accepted (any answer of a known member, recorded always) for longer than ``threshold``
since the later of that heartbeat's send and the start of aiokafka's heartbeat routine (none
runs during a join, so a rebalance counts no silence), starts the hold too. The tick resolves
it:

- a heartbeat the broker accepted, sent after the hold began, under the member id of before
  the stall, and the group's coordinator listing that member id when asked right after it:
  the membership survived; the held sends go out in their order (released). The heartbeat
  alone proves nothing: Kafka accepts heartbeats blindly while it loads the group, after
  every coordinator move (``streamassign.aiokafka.listed``). Only while a proof is wanted (a
  hold, or the lost membership's sends being dropped) is the coordinator asked;
- aiokafka's member id reset ("", after UnknownMemberId or IllegalGeneration) or changed:
  the membership was lost; the held sends are dropped. Their events' offsets were not
  committed (Faust flushes the producer before it commits, and this producer's flush waits
  for the hold), so the partition's next owner processes them again: duplicates, not loss.
  It is the reset, not the next assignment, that resolves it: Faust's revoke awaits the
  producer's flush before the join;
- neither: the hold goes on, however long. Dropping on a timer could lose writes of a
  membership that survived (a coordinator failover, a heartbeat failing for other reasons),
  and every way the membership ends comes back as one of the two answers above once a
  coordinator answers; past ``deadline`` (a session timeout and a heartbeat interval) one
  WARNING says the hold goes on. Should the tick itself fail, a flush releases the hold
  past that deadline rather than wait forever (a stale write is possible then, no loss);
- the worker stops: its stop flushes the producer (Faust's commits and ``App.on_stop``),
  which must not wait for a coordinator a cut keeps away, so the hold ends as lost for
  this worker (dropped), and the consumer commits nothing from then on: a commit could pass
  the dropped sends' events while the membership may still stand.

Every send, drain and tick also reads the member id: a reset (or another id) of the known
one ends the membership then, a hold on or not, and the changelog sends are dropped from then
until a new member id (a zombie wrote 9 ms after a reset, before any tick).

A dropped send's future never completes (its Faust future neither): ``_on_changelog_sent``
does not run for it, so its offset is never recorded as persisted, and no "exception never
retrieved" or callback error is logged for it. Records handed to aiokafka before the stall
wait in its accumulator, and its sender may drain them before anything else runs after the
resume: each drain runs the hold's check first and keeps the changelog's batches back while
a hold is on (``streamassign.aiokafka.accumulator``, ``_stall_drain_rule``). A batch drained
just before the stall goes into a request made on the loop's next step, after the resume: that
request runs the same check, and hands the changelog's batches back to the accumulator or
drops them (``streamassign.aiokafka.sender``). A changelog request already written when a
silence hold begins is still in this host's buffers (the link is dead): its connections are
reset, discarding those bytes, and aiokafka hands its batches back to the gated accumulator.
A send that found its partition's batch full waits in aiokafka for that batch to leave, which
a hold keeps from happening: when aiokafka gives up (``producer_request_timeout``, 20 min in
Faust) during a hold, the send joins the held sends rather than crash Faust's producer buffer
(timed out as a release let its batch go, it is sent again once).
Under exactly_once transactions fence the zombie, and with ``producer_threaded`` the sends
leave on another thread: nothing is held there.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import inspect
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiokafka
import attrs
from aiokafka.errors import KafkaTimeoutError
from faust.exceptions import ProducerSendError
from faust.transport.drivers import aiokafka as faust_aiokafka

from ..aiokafka import closing
from ..aiokafka.accumulator import DROP, HOLD, SEND, drop_gated, gate_drains, wake_sender
from ..aiokafka.closing import release_producer, retrieve_failure, stop_within
from ..aiokafka.rejoin import (
    HeartbeatAnswers,
    heartbeat_task,
    member_id,
    refuse_commits_without_membership,
    watch_heartbeats,
)
from ..aiokafka.sender import abort_in_flight, gate_sends
from ._app import aiokafka_consumer, exactly_once

__all__ = ["DROPPED", "RELEASED", "StallHold", "StallHoldProducer"]

log = logging.getLogger("streamassign.faust")

#: Seconds between the main loop's stamps.
TICK = 0.1

RELEASED = "released"
DROPPED = "dropped"
GAP = "gap"
SILENCE = "silence"


@attrs.define(eq=False)
class HeldSend:
    """A changelog send held: ``send()`` hands it to aiokafka; ``result`` is the future Faust
    got in its place; ``began`` when Faust made it (the hold's clock); ``number`` its place
    among the changelog sends made (``StallHold.number``: a clock may read the same twice);
    ``signalled`` once Faust's send ran for it (its ``on_produce_message`` sent: not again
    when sent again)."""

    send: Callable[[], Awaitable[Awaitable[Any]]]
    result: asyncio.Future[Any]
    began: float
    number: int
    signalled: bool = False


@attrs.define(eq=False)
class StallHold:
    """The hold's states, on one clock (``time.monotonic()``), without an event loop."""

    #: A gap between stamps longer than this (seconds) starts a hold.
    threshold: float
    #: A heartbeat silence longer than this (seconds) starts a hold. Measured from the last
    #: accepted heartbeat's own send time, so no heartbeat interval is taken off: a healthy
    #: worker's silence reaches a heartbeat interval plus a round trip before each answer,
    #: which with an interval near half the session would pass the gap's threshold.
    silence_threshold: float
    #: A hold unresolved this long (seconds) after it began is told to go on (one WARNING).
    deadline: float
    #: The last stamp, and the member id read then (None: not readable).
    stamp: float | None = None
    stamped_as: str | None = None
    #: When the current hold began (None: no hold), the gap that began it, the member id of
    #: before the gap, and whether its sends are being released.
    since: float | None = None
    gap: float = 0.0
    held_as: str | None = None
    releasing: bool = False
    #: Whether the current hold was logged, and its going on past the deadline.
    told: bool = False
    told_long: bool = False
    #: The member id a dropped hold lost (None: none lost), and the changelog sends dropped
    #: since, while aiokafka's member id is still that one or "" (the zombie goes on
    #: processing queued events until Faust's revoke stops its flow).
    lost_as: str | None = None
    lost_at: float = 0.0
    dropped_since_lost: int = 0
    #: How many times a membership was lost (``lose()``): changelog sends may have been
    #: dropped since a count the consumer noted (its acknowledged offsets are then forgotten).
    losses: int = 0
    #: When the last release of held sends ended (``_stall_release``; not a drop): a send
    #: timing out in aiokafka then had its batch kept back until that moment
    #: (``_send_or_hold``).
    released_at: float = float("-inf")
    #: Holds begun so far (the current one's number, while one is on).
    holds: int = 0
    #: Changelog sends made so far (``number``: each send's ``HeldSend.number``).
    made: int = 0
    #: The ``number`` of the latest changelog send handed to aiokafka (``_faust_send``): one
    #: sent again after a later one was handed out would land behind it (a stale value).
    latest_handed: int = 0
    #: The sends held, in order (a deque: a release after a long cut hands out thousands).
    held: collections.deque[HeldSend] = attrs.field(factory=collections.deque)
    #: The latest send time of a heartbeat the broker accepted, its member id then listed
    #: (``watch_heartbeats``; written by the consumer's thread: one float assignment).
    heartbeat_sent: float = float("-inf")
    #: Every heartbeat the broker accepted (listed or not, proof wanted or not) and the
    #: heartbeat routine's start: the silence a cut-off worker's heartbeats make.
    heartbeats: HeartbeatAnswers = attrs.field(factory=HeartbeatAnswers)
    #: The last non-empty member id seen while the membership was not lost (None: none yet).
    known_as: str | None = None
    #: What began the current hold: GAP (the loop did not run) or SILENCE (no heartbeat
    #: accepted while the heartbeat routine ran: cut off from the coordinator).
    cause: str = ""
    #: Set for the rest of a stop when the worker stops with a hold on (``_stall_stopped``:
    #: the held sends were dropped while the membership may still stand, the coordinator
    #: unreachable) or its flush at the stop got no acknowledgement (``_flush_cut_at_stop``):
    #: no commit may pass those events. While the membership stays lost no hold starts again
    #: (the silence would count afresh, and the sends are dropped anyway).
    commits_refused: bool = False

    @property
    def holding(self) -> bool:
        return self.since is not None

    def check(self, now: float) -> bool:
        """Is a hold on at ``now``? A gap past the threshold since the last stamp starts one,
        and so does a heartbeat silence past it."""
        if self.since is None:
            if self.commits_refused and self.lost_as is not None:
                return False  # stopping: its changelog sends are dropped until proven
            gap = now - self.stamp if self.stamp is not None else 0.0
            silence = self.heartbeats.silence(now)
            if gap > self.threshold:
                self.gap, self.cause = gap, GAP
            elif silence > self.silence_threshold:
                self.gap, self.cause = silence, SILENCE
            else:
                return False
            self.since, self.held_as = now, self.stamped_as
            self.holds += 1
        return True

    def membership_ended(self, member: str | None) -> bool:
        """Did the membership end with ``member`` read now: the known member id reset ("")
        or replaced by another, while not lost already? Remembers a new known one."""
        if member is None or self.lost_as is not None:
            return False
        if self.known_as and member != self.known_as:
            return True
        if member:
            self.known_as = member
        return False

    def tick(self, now: float, member: str | None) -> None:
        """The main loop ran at ``now`` with ``member`` as its member id (not while holding:
        the hold keeps the member id of before the gap)."""
        if not self.check(now):
            self.stamp, self.stamped_as = now, member

    def wants_proof(self) -> bool:
        """Whether an accepted heartbeat is looked at now (read on the consumer's thread):
        during a hold, or while the lost membership's sends are dropped (``still_lost``)."""
        return self.since is not None or self.lost_as is not None

    def heartbeat_accepted(self, sent: float) -> None:
        if sent > self.heartbeat_sent:
            self.heartbeat_sent = sent

    def verdict(self, now: float, member: str | None) -> str | None:
        """RELEASED, DROPPED or None (not yet, or no hold, or its release under way)."""
        if self.since is None or self.releasing:
            return None
        if not self.held_as or (member is not None and member != self.held_as):
            return DROPPED
        if member == self.held_as and self.heartbeat_sent >= self.since:
            return RELEASED
        return None

    def number(self) -> int:
        """The next changelog send's ``HeldSend.number``."""
        self.made += 1
        return self.made

    def hold_late(self, late: HeldSend) -> None:
        """Hold ``late``, a send made before sends held already (it waited in aiokafka): it
        goes out ahead of those made after it, so a key's writes keep their order."""
        after = next((i for i, held in enumerate(self.held) if held.number > late.number), None)
        self.held.insert(len(self.held) if after is None else after, late)

    def end(self, now: float) -> list[HeldSend]:
        """End the hold; the sends it held, in order. ``now`` is the next gap's start."""
        held, self.held = list(self.held), collections.deque()
        self.since, self.releasing, self.stamp = None, False, now
        self.told = self.told_long = False
        since = self.heartbeats.routine_since
        if since is not None:  # a silence counts afresh (a release on a timer)
            self.heartbeats.routine_since = max(since, now)
        return held

    def lose(self, now: float) -> list[HeldSend]:
        """End the hold as lost: its sends are dropped, and so are those that follow while the
        membership stays lost (``still_lost``)."""
        lost = self.held_as if self.holding else self.known_as
        self.lost_as, self.lost_at, self.dropped_since_lost = lost or "", now, 0
        self.losses += 1
        return self.end(now)

    def still_lost(self, member: str | None) -> bool:
        """Does a changelog send now come from the lost membership? Yes while aiokafka's
        member id is "" or the lost one (or unreadable); no once it joined again as another
        (the revoke before that join stopped Faust's flow), or a heartbeat was accepted under
        the same one since (a hold that began without a member id: ``heartbeat_accepted``)."""
        if self.lost_as is None:
            return False
        if member is None or member == "":
            return True
        return member == self.lost_as and self.heartbeat_sent < self.lost_at


def _settle(inner: asyncio.Future[Any], *, outer: asyncio.Future[Any]) -> None:
    """Give ``outer`` (Faust's) the outcome of ``inner`` (aiokafka's)."""
    if outer.done():
        return
    if inner.cancelled():
        outer.cancel()
    elif (exc := inner.exception()) is not None:
        outer.set_exception(exc)
    else:
        outer.set_result(inner.result())


@attrs.frozen
class _Stopping:
    """A client's original ``stop``, as ``closing.stop_within`` takes a client."""

    original: Callable[[], Awaitable[None]]

    async def stop(self) -> None:
        await self.original()


async def _stop_producer_within(
    producer: Any,
    stop: Callable[[], Awaitable[None]],
    refuse_commits: Callable[[], None],
    releasing: asyncio.Task[None] | None = None,
) -> None:
    """aiokafka's ``stop`` of the worker's ``producer`` within ``closing.CLOSE_TIMEOUT``, as the
    runtime's producers stop; cut, commits are refused (a commit still waiting on a flush
    would pass the writes failed next) and the batches it holds are failed, nothing of them
    sent later. The partitions' next owner writes them again. Faust logs one WARNING per
    failed write (``_on_published error``): held back and counted in one line instead, with
    those of a hold's release under way (``releasing``, which fails them in turn once
    aiokafka's are failed)."""
    consequence = "its writes not yet acknowledged are abandoned (their events are not committed)"
    if not await stop_within(PRODUCER_NAME, _Stopping(stop), consequence, log):
        refuse_commits()
        faust_topics_log = logging.getLogger("faust.topics")
        abandoned_writes = _AbandonedWrites()
        faust_topics_log.addFilter(abandoned_writes)
        try:
            await release_producer(PRODUCER_NAME, producer, log)
            if releasing is not None:  # each send left to it now fails at once
                await asyncio.wait({releasing}, timeout=RELEASE_ENDING)
            await abandoned_writes.all_told()
        finally:
            faust_topics_log.removeFilter(abandoned_writes)
        abandoned_writes.tell()


#: Seconds a cut producer stop waits for a hold's release under way to hand out the rest
#: of its sends, each failed at once by the released producer (a loop turn for them all).
RELEASE_ENDING = 1.0

#: The worker's producer, as its stop's lines name it.
PRODUCER_NAME = "the worker's producer"

#: Once the stop's deadline has passed, how long a flush or commit of the stop still waits
#: for its answer, from when it saw the stop, while no commit was refused (a cut wait or a
#: dropped hold refuses them; ``StallHoldProducer._stop_wait_left``): a broker answering
#: within it is not refused, and the stop goes on. The first wait cut refuses commits, and a
#: wait begun after that ends at once (one under way keeps its grace): a stop cut off from its
#: start ends its flushes and commits this long after ``closing.CLOSE_TIMEOUT``; one answered
#: past its deadline, this long after the last wait begun before the first cut (twice this
#: after the first unanswered one began, should a flush and a commit overlap).
STOP_GRACE = 1.0


@attrs.define(eq=False)
class _AbandonedWrites:
    """A filter of Faust's ``faust.topics`` log while a cut producer stop is released: each
    write it fails (``closing.release_producer``: ``WritesAbandonedError``) gets Faust's
    ``_on_published error`` WARNING, one per write (35 in a measured stop with a
    repartition's writes in flight), and, once collected, its ``FutureMessage`` failure as
    "exception was never retrieved" with a trace (nobody awaits it at a stop). Those lines
    are held back: the writes are counted by topic and their messages' failures marked
    seen. Any other line passes (a send failing for another reason is still Faust's)."""

    by_topic: collections.Counter[str] = attrs.field(factory=collections.Counter)

    def __call__(self, record: logging.LogRecord) -> bool:
        found = _ON_PUBLISHED_ABANDONED.match(record.getMessage())
        if found is None:
            return True
        self.by_topic[found[1]] += 1
        message = _on_published_message()
        if message is not None:
            retrieve_failure(message)
        return False

    async def all_told(self) -> None:
        """Return once Faust's callbacks of the failed writes have run: a write handed to
        aiokafka is told one loop turn after its failure, a held changelog send released to
        it two (``_settle`` ends Faust's future on the next turn); then until a turn tells
        none (a callback of a callback)."""
        turns = 0
        while True:
            told = self.by_topic.total()
            await asyncio.sleep(0)
            turns += 1
            if turns >= _TURNS_TO_TELL and self.by_topic.total() == told:
                return

    def tell(self) -> None:
        if not self.by_topic:
            return
        log.warning(
            "%s was released with %d write(s) not acknowledged (some may have landed): %s; "
            'Faust\'s "_on_published error" WARNING for each is not logged',
            PRODUCER_NAME,
            self.by_topic.total(),
            ", ".join(f"{topic}: {count}" for topic, count in sorted(self.by_topic.items())),
        )


#: Loop turns from a write's failure to Faust's line, through ``_settle`` (``all_told``).
_TURNS_TO_TELL = 2


def _on_published_message() -> asyncio.Future[Any] | None:
    """The ``FutureMessage`` of the ``Topic._on_published`` call logging now (its ``message``,
    read from its frame: Faust's line names none of it)."""
    frame = inspect.currentframe()
    while frame is not None and frame.f_code.co_name != "_on_published":
        frame = frame.f_back
    message = frame.f_locals.get("message") if frame is not None else None
    return message if isinstance(message, asyncio.Future) else None


#: Faust's line for a write failed by ``closing.release_producer`` (``faust/topics.py``).
_ON_PUBLISHED_ABANDONED = re.compile(
    rf"_on_published error for message topic (\S+) error {re.escape(PRODUCER_NAME)} was released "
    "before these writes were acknowledged"
)


@attrs.define(eq=False)
class _BufferFullCount:
    """How often Faust's producer buffer was full during hold number ``hold``
    (``StallHold.holds``), and the most messages it held then (``_wait_until_ebb``)."""

    hold: int = 0
    times: int = 0
    largest: int = 0

    def tell(self) -> None:
        if self.times > 1:
            log.warning(
                "Faust's producer buffer was full %d times during the hold (up to %d "
                'messages: its changelog send waited for room): its "producer buffer full" '
                'WARNING and "producer flush took" INFO after the first were not logged',
                self.times,
                self.largest,
            )
        self.times = self.largest = 0


#: Set while a send made before is sent again (``_faust_send``): in that task only.
_SENT_AGAIN: contextvars.ContextVar[bool] = contextvars.ContextVar("sent_again", default=False)


@attrs.frozen
class _SignalOnce:
    """Faust's ``on_produce_message`` signal, not sent for a send made before and sent again
    (its message was signalled at its first try)."""

    signal: Callable[..., Any]

    def __call__(self, **message: Any) -> None:
        if not _SENT_AGAIN.get():
            self.signal(**message)


class StallHoldProducer(faust_aiokafka.Producer):
    """Faust's aiokafka producer, whose changelog sends a stall holds (the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # This producer's own buffer (Faust's conductor reads it at each assignment): no
        # filter on Faust's process-wide logger, which every app of the process logs to.
        ebb = getattr(self, "buffer", None)
        if ebb is not None and hasattr(ebb, "wait_until_ebb"):
            ebb.wait_until_ebb = functools.partial(self._wait_until_ebb, ebb.wait_until_ebb)

    def __post_init__(self) -> None:
        super().__post_init__()
        signal = getattr(self, "_send_on_produce_message", None)
        if signal is not None:  # Faust's send tells it (0.12-0.15); else nothing to skip
            self._send_on_produce_message = _SignalOnce(signal)
        conf = self.app.conf
        session = float(conf.broker_session_timeout)
        heartbeat = float(conf.broker_heartbeat_interval)
        self.stall_hold = StallHold(
            threshold=max(session - heartbeat - TICK, TICK),
            # The routine's start is seen up to a tick late, and the broker counts the
            # session from a heartbeat's arrival, after its send.
            silence_threshold=max(session - 2 * TICK, TICK),
            deadline=session + heartbeat,
        )
        self._stall_timer: asyncio.TimerHandle | None = None
        self._stall_releasing: asyncio.Task[None] | None = None
        self._stall_look_failed = False
        #: When the flushes and commits at the stop end (``until_stop_deadline``; None: no
        #: stop seen yet).
        self._stop_deadline: float | None = None
        #: This hold's wrap on the consumer's heartbeats once in place, and whether wrapping
        #: failed (told once; no silence is counted then: ``_stall_watch_heartbeats``).
        self._heartbeat_wrap: Any = None
        self._heartbeat_wrap_failed = False
        #: Whether aiokafka's accumulator drains are gated by the hold (``on_start``).
        self._stall_gated = False
        #: The hold's clock, also of the heartbeats' stamps (a test's stand-in).
        self.clock: Callable[[], float] = time.monotonic
        #: Faust's buffer full during the latest hold (``_wait_until_ebb``).
        self._buffer_full = _BufferFullCount()

    def _wait_until_ebb(self, faust_s: Callable[[], Awaitable[None]]) -> Awaitable[None]:
        """Faust's buffer's ``wait_until_ebb`` (``faust_s``), which logs ``producer buffer
        full size N`` (WARNING) and ``producer flush took S`` (INFO) each time it waits: once
        per event while its one sending task waits in aiokafka for room in a batch a hold
        keeps back, up to ``producer_request_timeout`` (8,085 lines in a measured 21-minute
        cut). During a hold the first time is Faust's; later ones wait the same, silently,
        counted in one WARNING once the hold ended (``_BufferFullCount.tell``). Faust's own
        coroutine otherwise (called once per event: no extra await)."""
        buffer = self.buffer
        if not self.stall_hold.holding or buffer.size <= buffer.max_messages:
            return faust_s()
        return self._wait_until_ebb_held(faust_s)

    async def _wait_until_ebb_held(self, faust_s: Callable[[], Awaitable[None]]) -> None:
        buffer, hold, full = self.buffer, self.stall_hold, self._buffer_full
        if full.hold != hold.holds:  # this hold's first: the last one's count is told
            full.tell()
            full.hold = hold.holds
        full.times += 1
        full.largest = max(full.largest, buffer.size)
        if full.times == 1:
            await faust_s()
        else:  # Faust's wait without its two lines (``test_faust_s_buffer_wait_is_...``)
            await buffer.flush_atmost(buffer.max_messages)

    def _holds_stalls(self) -> bool:
        return not exactly_once(self.app) and not self.app.conf.producer_threaded

    def _stall_on(self) -> bool:
        """Whether the hold is on duty now: its tick runs and the app has changelog topics (a
        worker without tables has nothing to hold: no hold, no flush waiting on one, no lost
        membership told). Read each time: tables are declared up to the tables' start."""
        return self._stall_timer is not None and bool(self.app.tables.changelog_topics)

    def _stopping(self) -> bool:
        """Whether the worker is stopping (Faust's app, or its consumer alone)."""
        return any(getattr(s, "should_stop", False) for s in (self.app, self.app.consumer))

    async def on_start(self) -> None:
        await super().on_start()
        # A restart in the same process (mode's ``restart``) joins again: the offsets
        # acknowledged before are forgotten at its next assignment (``losses``).
        self.stall_hold.commits_refused = False
        self._stop_deadline = None
        if self._holds_stalls():
            self._stall_timer = self.loop.call_later(TICK, self._stall_tick)
            self._stall_gate(self._producer)

    def _stall_gate(self, producer: Any) -> None:
        """Let the hold decide what aiokafka's ``producer`` sends of the changelog: each drain
        of its accumulator, and each produce request of batches drained before a stall (the
        request is made on a later step of the loop, which a stall can come before)."""
        self._stall_gated = gate_drains(
            getattr(producer, "_message_accumulator", None),
            self._stall_drain_rule,
            self._is_changelog,
        )
        if self._stall_gated:  # what the sender hands back, the drains must hold
            sender = getattr(producer, "_sender", None)
            gate_sends(sender, self._stall_drain_rule, self._is_changelog)

    def _accumulator(self) -> Any:
        return getattr(self._producer, "_message_accumulator", None)

    def _is_changelog(self, tp: Any) -> bool:
        return getattr(tp, "topic", None) in self.app.tables.changelog_topics

    def _stall_drain_rule(self) -> str:
        """What aiokafka's sender may drain, or put in a request, of the changelog now.
        Records handed to aiokafka before a stall are still in its accumulator at the resume,
        or drained into a request it makes on the loop's next step, and either may run before
        any tick or send: so each drain and each request runs the hold's own check (same
        clock, same threshold). While a hold is on they stay in (or go back to the front of)
        the accumulator, in order; released, they drain ahead of the released sends (appended
        behind them); while the membership stays lost they are dropped, as later sends are."""
        hold = self.stall_hold
        if not self._stall_on():
            return SEND
        if self._stall_dropping():
            return DROP
        if hold.check(self.clock()) and not hold.releasing:
            return HOLD
        return SEND

    async def on_stop(self) -> None:
        """Stop holding: the worker leaves its group; what is held is dropped (its events'
        offsets are not committed: the flush before the commit waited for the hold)."""
        timer, self._stall_timer = self._stall_timer, None
        if timer is not None:
            timer.cancel()
        if self.stall_hold.holding and not self.stall_hold.releasing:
            self._stall_stopped(self.clock())
        self._buffer_full.tell()
        producer = self._producer
        if producer is not None and self._holds_stalls():
            # Faust's stop below stops aiokafka's producer, which waits for every batch it
            # holds to be acknowledged: during a network cut, until the heal.
            producer.stop = functools.partial(
                _stop_producer_within,
                producer,
                producer.stop,
                self._refuse_commits,
                self._stall_releasing,  # no release starts after this: the tick is off
            )
        await super().on_stop()

    async def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None,
        timestamp: float | None,
        headers: Any,
        *,
        transactional_id: str | None = None,
    ) -> Awaitable[Any]:
        """Faust's; a changelog send during a hold is held (its future comes later)."""
        send = functools.partial(
            super().send,
            topic,
            key,
            value,
            partition,
            timestamp,
            headers,
            transactional_id=transactional_id,
        )
        if self._stall_timer is None or topic not in self.app.tables.changelog_topics:
            return await send()
        hold = self.stall_hold
        result: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self._stall_dropping():
            hold.dropped_since_lost += 1  # dropped at once: a flush does not wait for it
            return result
        now = self.clock()
        item = HeldSend(send, result, now, hold.number())
        if not hold.check(now):
            return await self._send_or_hold(item)
        hold.held.append(item)
        return result

    async def _send_or_hold(self, item: HeldSend) -> Awaitable[Any]:
        """Hand a changelog send to aiokafka now. Should it find its partition's batch full,
        aiokafka waits for that batch to leave, at most Faust's ``producer_request_timeout``
        (20 min), then raises KafkaTimeoutError, which would crash Faust's producer buffer:
        a hold keeps the batch in for as long as a cut lasts. Timed out (the send is not in
        aiokafka: no room) during a hold, it joins the held sends, or is dropped with the
        lost membership's; timed out within a tick of a release (its batch let go as its
        time ran out), it is sent again, once, unless a changelog send made after it went
        out meanwhile (``_may_send_again``). Any other error, or any other timeout, reaches
        Faust."""
        retried = False
        while True:
            try:
                return await self._faust_send(item)
            except ProducerSendError as exc:
                if not isinstance(exc.__cause__, KafkaTimeoutError):
                    raise
                if self._stall_dropping():
                    self.stall_hold.dropped_since_lost += 1
                    return item.result
                now = self.clock()
                if self.stall_hold.check(now):
                    self._hold_late(item, now, exc.__cause__)
                    return item.result
                if retried or not self._may_send_again(item, now):
                    raise
                retried = True
                log.info(
                    "a changelog send waited %.1f s in aiokafka for room in a batch a hold kept "
                    "back until %.1f s ago (aiokafka gave up: %r): sent again",
                    now - item.began,
                    now - self.stall_hold.released_at,
                    exc.__cause__,
                )

    def _may_send_again(self, item: HeldSend, now: float) -> bool:
        """Whether ``item``, timed out in aiokafka at ``now`` with no hold on, goes out again:
        a release ended after it began and at most a tick before ``now`` (aiokafka's time ran
        out as the hold let its batch go; a send still timing out later waited for something
        else, a partition leader away, and Faust's error stands), and no changelog send made
        after it was handed to aiokafka meanwhile, so it keeps its place among its key's
        writes. Faust's producer buffer sends the changelog writes one at a time, each
        awaited: while one waits, no later one is handed out."""
        hold = self.stall_hold
        released = item.began <= hold.released_at and now - hold.released_at <= TICK
        return released and hold.latest_handed <= item.number

    def _hold_late(self, item: HeldSend, now: float, why: BaseException) -> None:
        hold = self.stall_hold
        hold.hold_late(item)
        log.warning(
            "a changelog send waited %.1f s in aiokafka for room in a batch held back since "
            "%.1f s ago (aiokafka gave up: %r): it is held with the rest",
            now - item.began,
            now - (hold.since or now),
            why,
        )

    async def _faust_send(self, item: HeldSend) -> Awaitable[Any]:
        """Faust's send of ``item``; sent again (it timed out waiting in aiokafka, never
        added), without Faust's ``on_produce_message`` signal a second time (``_SignalOnce``:
        a handler may count or trace each message)."""
        hold = self.stall_hold
        hold.latest_handed = max(hold.latest_handed, item.number)
        if not item.signalled:
            item.signalled = True
            return await item.send()
        token = _SENT_AGAIN.set(True)
        try:
            return await item.send()
        finally:
            _SENT_AGAIN.reset(token)

    def _aiokafka_consumer(self) -> Any:
        return aiokafka_consumer(self.app)

    def _member_id(self) -> str | None:
        return member_id(self._aiokafka_consumer())

    def _stall_dropping(self) -> bool:
        """Are changelog sends dropped now: the membership lost and not back yet?"""
        member = self._stall_membership(self.clock())
        return self.stall_hold.lost_as is not None and self.stall_hold.still_lost(member)

    def _stall_membership(self, now: float) -> str | None:
        """aiokafka's member id now, seen by every send, drain and tick (a zombie's write can
        come milliseconds after the reset): a membership lost drops the changelog sends from
        now on, a hold or not, until the worker joins again as a new member."""
        hold, member = self.stall_hold, self._member_id()
        if hold.lost_as is not None and not hold.still_lost(member):
            hold.lost_as, hold.known_as = None, member
            self._stall_rejoined(member)
        if hold.membership_ended(member):
            why = f"aiokafka's member id is now {member!r}"
            if hold.holding and not hold.releasing:
                self._stall_resolve_dropped(now, why)
            else:
                self._stall_lost(now, why)
        return member

    def _stall_lost(self, now: float, why: str) -> None:
        lost = self.stall_hold.known_as
        self.stall_hold.lose(now)
        batches = drop_gated(self._accumulator(), self._is_changelog) if self._stall_gated else 0
        log.log(
            logging.INFO if self._stopping() else logging.WARNING,  # a stop leaves the group
            "this worker's group membership %r ended (%s): its changelog sends are dropped "
            "from now until it joins as a new member, and %d batch(es) aiokafka held; their "
            "events' offsets are not committed (no membership), so the partitions' next owner "
            "processes them again",
            lost,
            why,
            batches,
        )

    async def flush(self) -> None:
        """Faust's, once no hold is on: Faust commits the events' offsets after this, so
        their changelog writes must be out or dropped first. Faust's flush of its own buffer
        may start a hold (its sends can be the first to run after a resume, before any tick),
        so a hold is awaited before and after it. Once the worker stops, its flushes (one
        begun before the stop too: a timer commit's, which the stop's commit waits for) end
        by the stop's deadline (``until_stop_deadline``; then ``_flush_cut_at_stop``):
        aiokafka's flush waits for every batch, of any topic, until a cut heals."""
        if not self._holds_stalls():
            await self._flush_after_holds()
            return
        flushing = asyncio.ensure_future(self._flush_after_holds())
        if not await self.until_stop_deadline(flushing):
            self._flush_cut_at_stop()
            return
        flushing.result()

    def bounds_stops(self) -> bool:
        """Whether the worker's stop is bounded here (its flushes, its commits, its producer's
        stop): not under exactly_once or with a threaded producer, whose stops are Faust's."""
        return self._holds_stalls()

    async def until_stop_deadline(self, waited: asyncio.Future[Any]) -> bool:
        """Wait for ``waited``: as long as it takes while the worker runs (a slow broker cuts
        nothing short); once it stops, up to the stop's deadline, ``closing.CLOSE_TIMEOUT``
        after the stop was first seen here, shared by every flush and commit of the stop,
        or ``STOP_GRACE`` after this wait saw the stop if that is later and no commit was
        refused yet (``_stop_wait_left``). Returns whether it ended; cut, it is cancelled
        (and False)."""
        saw_stop: float | None = None
        try:
            while not waited.done():
                if self._stopping():
                    saw_stop = time.monotonic() if saw_stop is None else saw_stop
                    left = self._stop_wait_left(saw_stop)
                else:
                    left = TICK
                if left <= 0:
                    waited.cancel()
                    await asyncio.gather(waited, return_exceptions=True)
                    return False
                await asyncio.wait({waited}, timeout=left)
        finally:
            waited.cancel()  # the caller cancelled: so is what it waited for
        return True

    def _stop_wait_left(self, saw_stop: float) -> float:
        """Seconds left to a wait that first saw the stop at ``saw_stop``: to the stop's
        deadline (set by the first wait that saw the stop) or, while no commit was refused,
        to ``STOP_GRACE`` after ``saw_stop`` if that is later: a wait begun near or past the
        deadline by a stop still draining (Faust's ``wait_empty`` commits about once a
        second until its agents are done) is cut only if it got no answer in that time.
        Once a commit was refused, nothing later is committed: a wait begun then ends at the
        deadline (one under way keeps the grace it was given)."""
        now = time.monotonic()
        if self._stop_deadline is None:
            self._stop_deadline = now + closing.CLOSE_TIMEOUT
        if self.stall_hold.commits_refused:
            return self._stop_deadline - now
        grace = min(STOP_GRACE, closing.CLOSE_TIMEOUT)  # never more than the whole bound
        return max(self._stop_deadline, saw_stop + grace) - now

    async def _flush_after_holds(self) -> None:
        await self._hold_resolved()
        await super().flush()
        if self.stall_hold.holding:
            await self._hold_resolved()
            await super().flush()  # what the release handed to aiokafka

    async def _hold_resolved(self) -> None:
        """Return once no hold is on. The tick resolves a hold; should the tick fail (it logs
        why), the hold is released past its deadline, so a flush never waits forever. A
        worker that stops ends its hold as lost (``_stall_stopped``): a silence hold resolves
        only when the coordinator answers, which a cut may put off past any stop."""
        hold = self.stall_hold
        if not self._stall_on():
            return
        hold.check(self.clock())  # a stall that this flush is the first to see
        while hold.holding and self._stall_timer is not None:
            now = self.clock()
            if self._stopping() and not hold.releasing:
                self._stall_stopped(now)
                return
            past_deadline = now - (hold.since or now) > hold.deadline
            if self._stall_look_failed and past_deadline and not hold.releasing:
                hold.releasing = True
                await self._stall_release(now)
                return
            await asyncio.sleep(TICK)

    def _stall_tick(self) -> None:
        self._stall_timer = self.loop.call_later(TICK, self._stall_tick)
        try:
            self._stall_look(self.clock())
        except Exception:  # the tick goes on; a flush releases a hold past its deadline
            if not self._stall_look_failed:
                self._stall_look_failed = True
                log.exception("the stall hold's tick failed; it goes on (repeats not logged)")

    def _stall_look(self, now: float) -> None:
        """A tick: stamp, or tell of a hold just begun, or resolve it."""
        consumer = self._aiokafka_consumer()
        hold = self.stall_hold
        watched = self._stall_watch_heartbeats(consumer)
        refuse_commits_without_membership(consumer)
        if not self.app.tables.changelog_topics:  # nothing to hold (``_stall_on``)
            hold.stamp = now
            return
        # Unwatched, no accepted heartbeat would end a silence: none is counted then.
        hold.heartbeats.routine_seen(now, heartbeat_task(consumer) if watched else None)
        member = self._stall_membership(now)
        hold.tick(now, member)
        if not hold.holding:
            self._buffer_full.tell()
        if hold.holding and not hold.releasing and self._stopping():
            self._stall_stopped(now)  # its membership may be resolved only after the stop
            return
        if hold.holding and not hold.told:
            hold.told = True
            self._stall_tell(hold)
        verdict = hold.verdict(now, member)
        if verdict == RELEASED:
            hold.releasing = True
            if self._stall_gated:  # what aiokafka held from before the stall goes out first
                wake_sender(self._accumulator())
            self._stall_releasing = asyncio.get_running_loop().create_task(self._stall_release(now))
        elif verdict == DROPPED:
            self._stall_resolve_dropped(now, f"aiokafka's member id is now {member!r}")
        elif hold.holding and not hold.told_long and now - (hold.since or now) > hold.deadline:
            hold.told_long = True
            log.warning(
                "changelog sends held after a stall: still %d after %.1f s with no heartbeat "
                "accepted (its member listed) and the member id unchanged (%r); they go out "
                "when one is accepted under it, or are dropped when aiokafka resets it",
                len(hold.held),
                now - (hold.since or now),
                hold.held_as,
            )

    def _stall_watch_heartbeats(self, consumer: Any) -> bool:
        """Whether this hold's own wrap is on ``consumer``'s heartbeats (wrapped at the first
        tick with a coordinator): only then does a silence count. Unwatched, no accepted
        heartbeat would ever end one, and every worker would hold after the threshold, its
        flush and commits waiting, for good. One WARNING if it cannot be wrapped (another
        aiokafka's coordinator, or one another part wrapped already)."""
        coordinator = getattr(consumer, "_coordinator", None)
        if coordinator is None:  # not started: no heartbeat routine runs either
            return False
        current = getattr(coordinator, "_do_heartbeat", None)
        if current is not None and current is self._heartbeat_wrap:
            return True
        if self._heartbeat_wrap_failed:
            return False
        hold = self.stall_hold
        if not getattr(current, "_streamassign_wrapped", False) and watch_heartbeats(
            consumer,
            hold.heartbeat_accepted,
            hold.wants_proof,
            self.clock,
            timeout=float(self.app.conf.broker_heartbeat_interval),
            answered=hold.heartbeats.answered_at,
        ):
            self._heartbeat_wrap = getattr(coordinator, "_do_heartbeat", None)
            return True
        self._heartbeat_wrap_failed = True
        log.warning(
            "cannot watch this worker's heartbeats (aiokafka %s: its group coordinator has no "
            "_do_heartbeat, or another part wrapped it): silence holds are off, a network cut "
            "from the coordinator holds no changelog send (a stall of the event loop still "
            "does, and a member id reset still drops them)",
            aiokafka.__version__,
        )
        return False

    def _stall_tell(self, hold: StallHold) -> None:
        if hold.cause == SILENCE:
            reset = self._stall_abort()
            why = (
                f"no heartbeat of this worker was accepted for {hold.gap:.1f} s (more than "
                f"{hold.silence_threshold:.1f} s: cut off from the group's coordinator, the "
                f"broker may expire its session); reset {reset} connection(s) with a changelog "
                "request in flight (its unsent bytes discarded, its batches back to be held)"
            )
        else:
            why = (
                f"the event loop did not run for {hold.gap:.1f} s (more than "
                f"{hold.threshold:.1f} s: the broker may have expired this worker's group session)"
            )
        log.warning(
            "%s: %d changelog send(s) held so far, and every one until the membership of %r is "
            "proven (a heartbeat accepted, the member listed) or lost",
            why,
            len(hold.held),
            hold.held_as,
        )

    def _stall_abort(self) -> int:
        """Recall the changelog request aiokafka had written when the cut began: still in this
        host's buffers, it would reach the broker at the heal, after the new owner's writes.
        Not after a gap: the kernel sent the bytes while the process was stopped."""
        if not self._stall_gated:  # nothing would hold the batches it puts back
            return 0
        return abort_in_flight(self._producer, self._is_changelog)

    def _stall_rejoined(self, member: str | None) -> None:
        dropped, self.stall_hold.dropped_since_lost = self.stall_hold.dropped_since_lost, 0
        log.log(
            logging.WARNING if dropped else logging.INFO,
            "changelog sends after the lost membership: dropped %d more until this worker's "
            "membership was back (as %r)",
            dropped,
            member,
        )

    def _flush_cut_at_stop(self) -> None:
        """A flush at the stop got no acknowledgement by the stop's deadline
        (``_stop_wait_left``; a cut from a partition's leader: a sink's, a repartition's, a
        changelog's): Faust commits after it, which could pass events whose writes never
        land, so no commit goes out from now on, and the acknowledged offsets are forgotten
        (``losses``: a restart in the same process commits none of them). The producer's
        stop then fails what it holds."""
        if not self.stall_hold.commits_refused:
            log.warning(
                "this worker stops and its producer's flush got no acknowledgement %.1f s "
                "into the stop (broker unreachable?): no offset is committed from now on, so "
                "the partitions' next owner processes the events since the last commit again",
                self._stop_seconds(),
            )
        self._refuse_commits()

    def commit_cut_at_stop(self, offset_count: int) -> None:
        """A commit under way at the stop got no answer by the stop's deadline (aiokafka
        retries a request sent into a cut until a coordinator answers, and Faust's stop waits
        for a commit under way): it is abandoned, and no commit goes out from now on, as
        after a flush cut short. Its offsets' writes were flushed before it, so should it
        still land, it passes nothing unwritten. Told at INFO when commits were refused
        already (a dropped hold told why): it still says what the stop waited for."""
        log.log(
            logging.INFO if self.stall_hold.commits_refused else logging.WARNING,
            "this worker stops and its commit of %d offset(s) got no answer %.1f s into the "
            "stop (coordinator unreachable?): abandoned, and no offset is committed from now "
            "on, so the partitions' next owner processes the events since the last commit again",
            offset_count,
            self._stop_seconds(),
        )
        self._refuse_commits()

    def _stop_seconds(self) -> float:
        """Seconds since the stop was first seen by a flush or commit (its deadline set)."""
        if self._stop_deadline is None:
            return 0.0
        return time.monotonic() - (self._stop_deadline - closing.CLOSE_TIMEOUT)

    def _refuse_commits(self) -> None:
        """No commit from now on, and the acknowledged offsets forgotten (``losses``): writes
        of their events may never land (dropped, or failed by a cut-short stop)."""
        self.stall_hold.commits_refused = True
        self.stall_hold.losses += 1

    def _stall_stopped(self, now: float) -> None:
        """End the hold as lost for this worker, which stops: its membership may be resolved
        only after the stop (a silence hold lasts until the coordinator answers). The held
        sends and aiokafka's held batches are dropped, and the consumer commits nothing from
        now on (``commits_refused``; the membership may still stand, so aiokafka would send
        the commit): their events' offsets stay uncommitted, the next owner processes them."""
        hold = self.stall_hold
        since, member = hold.since or now, hold.held_as
        silence = hold.cause == SILENCE
        if silence:  # the silence now: none was accepted since the hold began
            cause = f"no heartbeat accepted for {hold.gap + now - since:.1f} s"
        else:
            cause = f"the event loop did not run for {hold.gap:.1f} s"
        # A silence hold begun during the stop was not told: its request in flight is
        # recalled here (the kernel would go on sending it after the process exits).
        reset = self._stall_abort() if silence and not hold.told else 0
        dropped = hold.lose(now)
        hold.commits_refused = True
        batches = drop_gated(self._accumulator(), self._is_changelog) if self._stall_gated else 0
        log.warning(
            "this worker stops while its changelog sends are held (%s, the membership %s "
            "unresolved after %.1f s): dropped %d held send(s) and %d "
            "batch(es) aiokafka held, reset %d connection(s) with a changelog request in "
            "flight, and no offset is committed from now on, so the partitions' next owner "
            "processes their events again",
            cause,
            repr(member) if member else "(no member id yet)",
            now - since,
            len(dropped),
            batches,
            reset,
        )

    def _stall_resolve_dropped(self, now: float, why: str) -> None:
        since = self.stall_hold.since or now
        dropped = self.stall_hold.lose(now)
        # now, not at the next drain: a flush right after must not wait on them
        batches = drop_gated(self._accumulator(), self._is_changelog) if self._stall_gated else 0
        log.log(
            logging.WARNING if dropped or batches else logging.INFO,
            "changelog sends held after a stall: dropped %d after %.1f s (%s), and %d batch(es) "
            "aiokafka held from before it; their events' offsets were not committed, so the "
            "partitions' next owner processes them again",
            len(dropped),
            now - since,
            why,
            batches,
        )

    async def _stall_release(self, proven: float) -> None:
        """Hand the held sends to aiokafka in order, with any held meanwhile; then end."""
        hold = self.stall_hold
        since, released = hold.since or proven, 0
        try:
            while hold.held:
                item = hold.held.popleft()
                released += 1
                try:
                    sent = asyncio.ensure_future(await self._faust_send(item))
                except Exception as exc:  # Faust's own path would end its buffer's task
                    if not item.result.done():  # cancelled by Faust meanwhile
                        item.result.set_exception(exc)
                else:
                    sent.add_done_callback(functools.partial(_settle, outer=item.result))
        finally:
            hold.released_at = self.clock()
            hold.end(hold.released_at)
            if self._stall_gated:
                wake_sender(self._accumulator())
        log.log(
            logging.WARNING if released else logging.INFO,
            "the membership survived (a heartbeat was accepted under it, the member listed): "
            "released %d held changelog send(s) after %.1f s",
            released,
            proven - since,
        )
