"""The one place that touches aiokafka internals (with ``listed``, which asks the group's
coordinator through the consumer's client): asking the group coordinator to rejoin, reading
the member id and generation it holds, watching its heartbeats, refreshing a consumer's cluster
metadata, and waiting for a consumer's next assignment.

aiokafka (0.11-0.14) has no public way for a member to start a rebalance. Its
``GroupCoordinator.request_rejoin()`` does it, reached through ``consumer._coordinator`` — both
unchanged across the supported range. It must be called after SyncGroup (from
``on_assignment`` or later): a call made during the join is discarded when aiokafka resets its
rejoin future. A follower must also change its subscription user data, or the broker hands it
the current generation back without a rebalance; the assignors' ``join_epoch`` does that.

aiokafka fetches metadata of subscribed topics when the subscription changes and then only every
``metadata_max_age_ms`` (5 min by default): a topic created later stays unknown that long, and a
rejoin does not refresh it (the topics did not change). ``MetadataWatch`` re-fetches it with
growing pauses through the consumer's client (``consumer._client``); aiokafka's leader rejoins by
itself when a refresh changes the partition count of a subscribed topic (0 -> n).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
from aiokafka.errors import UnknownMemberIdError

from .listed import LISTED, UNTOLD, Listing, member_listed

log = logging.getLogger("streamassign.aiokafka")


def request_rejoin(consumer: Any) -> bool:
    """Ask ``consumer``'s group coordinator for a new rebalance; False when it cannot."""
    coordinator = getattr(consumer, "_coordinator", None)
    request = getattr(coordinator, "request_rejoin", None)
    if request is None:
        return False
    request()
    return True


def membership(consumer: Any) -> tuple[str, int] | None:
    """``consumer``'s member id and generation as its group coordinator holds them (aiokafka
    resets them to ``("", -1)`` when the broker answers UnknownMemberId or IllegalGeneration);
    None when they cannot be read."""
    coordinator = getattr(consumer, "_coordinator", None)
    member_id = getattr(coordinator, "member_id", None)
    generation = getattr(coordinator, "generation", None)
    if not isinstance(member_id, str) or not isinstance(generation, int):
        return None
    return member_id, generation


def member_id(consumer: Any) -> str | None:
    """``consumer``'s member id (:func:`membership`; "" after a reset, until it joins again);
    None when it cannot be read."""
    held = membership(consumer)
    return held[0] if held is not None else None


def watch_heartbeats(
    consumer: Any,
    succeeded: Callable[[float], None],
    wanted: Callable[[], bool],
    clock: Callable[[], float] = time.monotonic,
    timeout: float = 1.0,
    answered: Callable[[float], None] | None = None,
) -> bool:
    """Have ``succeeded(sent)`` called (on the consumer's thread) after each heartbeat the
    broker accepted while ``wanted()``, once its group's coordinator also lists the member id
    the heartbeat was sent under (``listed``: Kafka accepts heartbeats blindly while it loads
    the group), with the ``clock()`` at which the heartbeat was about to be sent: proof that
    the broker still knew the member id then. ``timeout``: seconds the listing may take (the
    heartbeat routine waits for it). Nothing extra is sent while not ``wanted()``.
    ``answered(sent)`` is called for every accepted heartbeat, wanted or not, before any
    listing: a member cut off from its coordinator sees these stop.

    aiokafka (0.11-0.14) says a heartbeat succeeded only at DEBUG; its heartbeat routine calls
    ``self._do_heartbeat()`` (True on success, also for RebalanceInProgress: the member is
    still in the group), so it is wrapped on the instance, once; its answer passes through
    unchanged. False when it cannot be (no coordinator yet)."""
    coordinator: Any = getattr(consumer, "_coordinator", None)

    def watch(heartbeat: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
        proof = HeartbeatProof(coordinator, succeeded, wanted, timeout)

        async def watched() -> Any:
            sent, member = clock(), getattr(coordinator, "member_id", None)
            accepted = await heartbeat()
            if accepted is True:
                if answered is not None:
                    answered(sent)
                await proof.confirm(sent, member)
            return accepted

        return watched

    return _wrapped_once(coordinator, "_do_heartbeat", watch)


def heartbeat_task(consumer: Any) -> Any:
    """The task of ``consumer``'s heartbeat routine while it runs (aiokafka starts one after
    each join and stops it for the next: none during a JoinGroup/SyncGroup, nor once a member
    id reset ended it); None otherwise or when it cannot be read."""
    task = getattr(getattr(consumer, "_coordinator", None), "_heartbeat_task", None)
    done = getattr(task, "done", None)
    if done is None or done():
        return None
    return task


@attrs.define(eq=False)
class HeartbeatAnswers:
    """The count of a heartbeat silence, fed by whoever watches a consumer's heartbeats: the
    seconds since the send of the last heartbeat the broker accepted, or since the heartbeat
    routine started (its first heartbeat comes a heartbeat interval later); 0 while no
    routine runs (a join under way, no membership, a member id reset: nothing is due)."""

    #: The latest send time of a heartbeat the broker accepted (the consumer's thread: one
    #: float assignment).
    answered: float = float("-inf")
    #: The heartbeat routine's task last seen, and since when (None: none runs).
    routine: Any = None
    routine_since: float | None = None

    def answered_at(self, sent: float) -> None:
        if sent > self.answered:
            self.answered = sent

    def routine_seen(self, now: float, task: Any) -> None:
        """``task`` is the heartbeat routine's at ``now`` (None: none runs)."""
        if task is None:
            self.routine, self.routine_since = None, None
        elif task is not self.routine:
            self.routine, self.routine_since = task, now

    def silence(self, now: float) -> float:
        if self.routine_since is None:
            return 0.0
        return now - max(self.answered, self.routine_since)


@attrs.define(eq=False)
class HeartbeatSilence:
    """How long a consumer's group coordinator has accepted none of its heartbeats: the seconds
    since the send of the last accepted one, or since the heartbeat routine started (its
    first heartbeat comes a heartbeat interval later). The broker expires a member after
    ``session_timeout_ms`` with no heartbeat, counted from the heartbeat's arrival, after its
    send: a silence near the session means the member is probably out of the group, though
    it hears so only when a request gets through. A healthy member's silence peaks at a
    heartbeat interval plus a round trip.

    It reads 0 while no heartbeat routine runs (during a join, or after a member id reset:
    nothing is due then), and always when it cannot watch the heartbeats (no coordinator
    yet, or ``_do_heartbeat`` already wrapped by another watcher, whose callbacks it would
    not get): never a silence it did not measure."""

    clock: Callable[[], float] = time.monotonic
    answers: HeartbeatAnswers = attrs.field(factory=HeartbeatAnswers)
    #: Whether this watcher's wrap is on the coordinator's ``_do_heartbeat``; False for good
    #: once found wrapped by another (None: not looked yet or no coordinator yet).
    watching: bool | None = None

    def seconds(self, consumer: Any) -> float:
        """The silence of ``consumer``'s heartbeats now (see the class docstring)."""
        if not self.watching:
            if self.watching is False:
                return 0.0
            self._watch(consumer)
            if not self.watching:
                return 0.0
        now = self.clock()
        self.answers.routine_seen(now, heartbeat_task(consumer))
        return self.answers.silence(now)

    def _watch(self, consumer: Any) -> None:
        heartbeat = getattr(getattr(consumer, "_coordinator", None), "_do_heartbeat", None)
        if heartbeat is None:
            return  # no coordinator yet: looked again next time
        if getattr(heartbeat, "_streamassign_wrapped", False):
            self.watching = False
            log.warning(
                "a consumer's heartbeats are watched by another part already: its heartbeat "
                "silence is not measured (taken as none)"
            )
            return
        self.watching = watch_heartbeats(
            consumer, _ignored, _never, self.clock, answered=self.answers.answered_at
        )


def _ignored(sent: float) -> None:
    """No proof asked for (``watch_heartbeats``' ``succeeded``)."""


def _never() -> bool:
    return False


def refuse_commits_without_membership(consumer: Any) -> bool:
    """Make ``consumer``'s offset commits fail as the broker fails them for a lost member
    (aiokafka's ``CommitFailedError``) while it subscribes and holds no membership (member id
    "" or generation -1: after a MEMBER_ID_REQUIRED answer aiokafka holds a new id with no
    generation yet): aiokafka (0.11-0.14) sends them with generation -1, and Kafka accepts
    such a commit when the group is Empty (as for a consumer without group management), which
    it is after a broker restart expired every member. A stall hold that dropped a lost
    membership's changelog writes then saw Faust commit their events' offsets: records lost.
    ``_do_commit_offsets`` is wrapped on the instance, once; False when it cannot be."""
    coordinator: Any = getattr(consumer, "_coordinator", None)

    def guard(commit: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any, Any], Awaitable[Any]]:
        async def guarded(assignment: Any, offsets: Any) -> Any:
            subscription = getattr(coordinator, "_subscription", None)
            auto = getattr(subscription, "partitions_auto_assigned", None)
            reset = coordinator.member_id == "" or coordinator.generation < 0
            if offsets and reset and auto is not None and auto():
                log.info(
                    "a commit of %d offset(s) refused: no membership (member id reset, or no "
                    "generation yet; the broker would take it if the group is Empty, for "
                    "partitions this consumer no longer owns)",
                    len(offsets),
                )
                raise UnknownMemberIdError(f"{coordinator.group_id}: no member id (reset)")
            return await commit(assignment, offsets)

        return guarded

    return _wrapped_once(coordinator, "_do_commit_offsets", guard)


def _wrapped_once(coordinator: Any, name: str, wrap: Callable[[Any], Any]) -> bool:
    """Replace aiokafka's ``coordinator.<name>`` method on the instance by ``wrap(method)``,
    once (a later call finds the wrapper marked); False when there is no such method (no
    coordinator yet)."""
    method = getattr(coordinator, name, None)
    if method is None:
        return False
    if not getattr(method, "_streamassign_wrapped", False):
        wrapper = wrap(method)
        wrapper._streamassign_wrapped = True
        setattr(coordinator, name, wrapper)
    return True


@attrs.define(eq=False)
class HeartbeatProof:
    """Confirms the heartbeats ``watch_heartbeats`` sees accepted, and says why not (each
    reason once in a row: it repeats at every heartbeat until the coordinator answers)."""

    coordinator: Any
    succeeded: Callable[[float], None]
    wanted: Callable[[], bool]
    timeout: float
    last_why: str | None = None

    async def confirm(self, sent: float, member: Any) -> None:
        """Never raises but CancelledError: the heartbeat routine must go on."""
        try:
            if not self.wanted():
                self.last_why = None  # the next proof wanted tells its reasons afresh
                return
            if not isinstance(member, str) or not member:
                return
            listing = await member_listed(self.coordinator, member, self.timeout)
            if listing.outcome == LISTED:
                self.last_why = None
                self.succeeded(sent)
                return
            if listing.outcome == UNTOLD:  # asking again will not mend it: as before listing
                self.succeeded(sent)
            self._tell(listing, member)
        except Exception:
            if self.last_why != "failed":
                self.last_why = "failed"
                log.exception("confirming an accepted heartbeat failed (repeats not logged)")

    def _tell(self, listing: Listing, member: str) -> None:
        if listing.why == self.last_why:
            return
        self.last_why = listing.why
        if listing.outcome == UNTOLD:
            log.warning(
                "a heartbeat of member %r was accepted, and its group's coordinator cannot say "
                "whether it lists the member (%s): the heartbeat counts alone, as proof that "
                "the membership survived (a coordinator loading the group accepts any)",
                member,
                listing.why,
            )
        else:
            log.info(
                "a heartbeat of member %r was accepted, but its group's coordinator does not "
                "list it (yet): %s; the next heartbeat asks again",
                member,
                listing.why,
            )


def refresh_metadata(consumer: Any) -> bool:
    """Start a refresh of ``consumer``'s cluster metadata (it runs in the background); False
    when it cannot. A leader that joins while one is under way waits for it before it assigns
    (aiokafka's ``_perform_assignment``), so it sees topics created since its last refresh
    instead of those of up to ``metadata_max_age_ms`` (5 min by default) ago."""
    client = getattr(consumer, "_client", None)
    force = getattr(client, "force_metadata_update", None)
    if force is None:
        return False
    force()
    return True


def next_assignment(consumer: Any) -> asyncio.Future[None] | None:
    """A future done at ``consumer``'s next assignment (failing if its group coordinator
    stops on an unexpected error): what ``AIOKafkaConsumer.start()`` awaits when it was
    subscribed before; None when it cannot be had. Ask before ``subscribe`` so that the
    first assignment cannot slip by."""
    subscription = getattr(consumer, "_subscription", None)
    wait = getattr(subscription, "wait_for_assignment", None)
    if wait is None:
        return None
    future: asyncio.Future[None] = wait()
    return future


def unsized(consumer: Any, topics: Iterable[str]) -> frozenset[str]:
    """Those of ``topics`` the consumer's client has no partitions of (all when unknown)."""
    cluster = getattr(getattr(consumer, "_client", None), "cluster", None)
    if cluster is None:
        return frozenset(topics)
    return frozenset(t for t in topics if not cluster.partitions_for_topic(t))


def current_assignment(consumer: Any) -> Any:
    """The assignment object ``consumer``'s fetcher works on (a new one at every rebalance);
    None when there is none or it cannot be read."""
    subscription = getattr(getattr(consumer, "_subscription", None), "subscription", None)
    return getattr(subscription, "assignment", None)


def rewind(consumer: Any, records: Mapping[Any, Sequence[Any]]) -> list[Any]:
    """Seek each partition of ``records`` (fetched records by partition, as
    ``fetched_records`` returns them) back to its first record, so that they are fetched
    again; partitions no longer assigned are left alone. Returns the partitions rewound. Call
    it in the consumer's event loop right after taking the records, before anything else can
    move the positions."""
    assigned = consumer.assignment()
    rewound = []
    for tp, batch in records.items():
        if batch and tp in assigned:
            consumer.seek(tp, batch[0].offset)
            rewound.append(tp)
    return rewound


def fetch_states(consumer: Any, tps: Iterable[Any]) -> dict[Any, str]:
    """aiokafka's view of fetching each of ``tps``, for a diagnosis: ``at N`` (its fetch
    position), plus ``paused``, ``awaiting reset``, ``buffered`` (records fetched and not
    handed out yet), or ``unassigned``; ``node N busy`` when a request to the partition's
    leader is in flight (the fetcher sends nothing else to it meanwhile). Empty when it cannot
    be read. Read without a lock, possibly from another thread: a snapshot, not a state."""
    assignment = current_assignment(consumer)
    fetcher = getattr(consumer, "_fetcher", None)
    state_value = getattr(assignment, "state_value", None)
    if state_value is None or fetcher is None:
        return {}
    # set() of a dict or set copies it without letting another thread run in between.
    buffered = set(getattr(fetcher, "_records", {}))
    in_flight = set(getattr(fetcher, "_in_flight", ()))
    cluster = getattr(getattr(consumer, "_client", None), "cluster", None)
    states = {}
    for tp in tps:
        state = state_value(tp)
        if state is None:
            states[tp] = "unassigned"
            continue
        words = [f"at {getattr(state, '_position', None)}"]
        words += [
            w
            for w, on in (
                ("paused", state.paused),
                ("awaiting reset", state.awaiting_reset),
                ("buffered", tp in buffered),
            )
            if on
        ]
        leader = cluster.leader_for_partition(tp) if cluster is not None else None
        if leader in in_flight:
            words.append(f"node {leader} busy")
        states[tp] = " ".join(words)
    return states


class MetadataWatch:
    """Re-fetches metadata after ``first``, then doubling pauses up to ``longest`` seconds,
    until the client knows every watched topic; ``watch`` replaces what is watched."""

    def __init__(self, first: float = 0.5, longest: float = 10.0) -> None:
        self._first, self._longest = first, longest
        self._timer: asyncio.TimerHandle | None = None
        self.topics: frozenset[str] = frozenset()

    def watch(self, consumer: Any, topics: Iterable[str]) -> None:
        """Watch ``topics`` (nothing: stop) on ``consumer``'s client; refreshes right away."""
        self.cancel()
        self.topics = frozenset(topics)
        if self.topics:
            self._refresh(consumer, self._first)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _refresh(self, consumer: Any, pause: float) -> None:
        client: Any = getattr(consumer, "_client", None)
        if getattr(client, "force_metadata_update", None) is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop to wait on (unit tests call the assignor directly)
            return
        for topic in sorted(self.topics):
            client.add_topic(topic)  # tracked (a member may not subscribe to it yet)
        client.force_metadata_update()
        self._timer = loop.call_later(pause, self._check, consumer, pause)

    def _check(self, consumer: Any, pause: float) -> None:
        self._timer = None
        missing = unsized(consumer, self.topics)
        if not missing:
            log.info("metadata of %s arrived", sorted(self.topics))
            self.topics = frozenset()
            return
        self.topics = missing
        log.debug("still no metadata for %s; asking again", sorted(missing))
        self._refresh(consumer, min(pause * 2, self._longest))


class Rejoiner:
    """When a member asks its consumer for a rebalance: now, after a delay, at a time, or
    after an error with growing backoff (1, 2, 4, ... 30 s) so a failing group never
    crash-loops. Holds the consumer weakly; does nothing until bound."""

    def __init__(self, backoff: tuple[float, float] = (1.0, 30.0)) -> None:
        self._consumer: weakref.ref[Any] | None = None
        self._backoff = backoff
        self.failures = 0
        #: Delayed rejoins not run yet (``cancel`` drops them).
        self._pending: set[asyncio.TimerHandle] = set()

    def bind(self, consumer: Any) -> None:
        self._consumer = weakref.ref(consumer)

    def after(self, delay: float) -> bool:
        """Rejoin after ``delay`` seconds (0: right away); False when unbound."""
        consumer = self._consumer() if self._consumer is not None else None
        if consumer is None:
            log.warning("assignor not bound to its consumer (bind()); cannot ask for a rebalance")
            return False
        if delay <= 0:
            return request_rejoin(consumer)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no running loop: nothing to schedule on
            log.warning("no running event loop; cannot schedule a rebalance in %.1f s", delay)
            return False

        def run() -> None:
            self._pending.discard(handle)
            request_rejoin(consumer)

        handle = loop.call_later(delay, run)
        self._pending.add(handle)
        return True

    def cancel(self) -> None:
        """Drop every delayed rejoin not run yet (shutdown)."""
        for handle in self._pending:
            handle.cancel()
        self._pending.clear()

    def at(self, epoch_ms: int) -> bool:
        """Rejoin at a wall-clock time (ms since the epoch)."""
        return self.after(max(0.0, epoch_ms / 1000 - time.time()))

    def failed(self) -> float:
        """Count a failed rebalance and schedule the retry; returns the delay. The retry
        replaces one an earlier failure scheduled: each retry starts a rebalance, and stale
        ones would add rebalances that every member answers with yet another retry."""
        self.cancel()
        self.failures += 1
        delay: float = min(self._backoff[0] * 2.0 ** (self.failures - 1), self._backoff[1])
        self.after(delay)
        return delay

    def succeeded(self) -> None:
        """A good rebalance: the backoff starts over, and a retry an earlier failure scheduled
        is moot (it would only cost an eager revoke/assign cycle)."""
        self.failures = 0
        self.cancel()
