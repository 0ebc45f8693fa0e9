"""Kafka Streams-style task assignment on aiokafka: one process, N consumers ("threads").

``ProcessHost`` runs N ``AIOKafkaConsumer``s of one process id in one asyncio process and is the
one place that knows the process's state: which tasks it runs (reported as ``LATEST_OFFSET``
once restored, on consumers still in the group), which it has on disk (offset sums: the
listener's store positions, else the checkpoints in its ``StateDirectory``), its endpoint, the
group's host maps, and the per-task callbacks. Each consumer has its own ``StreamsAssignor``
instance; the one on the elected leader runs ``streamassign.streams.assign_streams``.

Rebalances are eager in aiokafka (every consumer revokes everything before it joins). The host
therefore reports task changes only when the new assignment is known: a task that comes back to
the same consumer is neither revoked nor assigned; ``TaskListener`` hears only real changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import reprlib
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from .. import TaskId, TopicPartition
from ..assignment import ClientAssignment
from ..errors import ConfigError, ErrorCode, StartStoppedError
from ..ha import HighAvailabilityTaskAssignor
from ..localstate import StateDirectory
from ..protocol import (
    LATEST_OFFSET,
    LATEST_VERSION,
    MIN_VERSION,
    NEVER,
    NOW,
    AssignmentInfo,
    ProtocolError,
    SubscriptionInfo,
    is_protocol_version,
)
from ..repeats import Repeats
from ..streams import (
    ACCEPTABLE_RECOVERY_LAG,
    ProbingMemory,
    assign_streams,
    decode_subscriptions,
)
from ..topology import Topology, changelog_topic_name
from ..versions import (
    SubtopologyDifference,
    TaskMismatch,
    mismatch_error,
    mismatched_tasks,
    refused_subtopologies,
    subtopology_topic_indices,
)
from .closing import release_consumer, retrieve_failure, stop_within
from .rejoin import (
    MetadataWatch,
    Rejoiner,
    membership,
    next_assignment,
    refresh_metadata,
    unsized,
)
from .wire import encode_assignment, readable_subscriptions

log = logging.getLogger("streamassign.aiokafka")

PROTOCOL_NAME = "streamassign-streams"

_Answer = TypeVar("_Answer")


class TaskListener:
    """Callbacks per task change on one consumer; override what you need (all async)."""

    async def on_active_assigned(self, consumer: int, tasks: frozenset[TaskId]) -> None: ...

    async def on_active_revoked(self, consumer: int, tasks: frozenset[TaskId]) -> None: ...

    async def on_standby_added(self, consumer: int, tasks: frozenset[TaskId]) -> None: ...

    async def on_standby_removed(self, consumer: int, tasks: frozenset[TaskId]) -> None: ...

    async def on_error(self, consumer: int, code: ErrorCode) -> None:
        """The leader sent an error instead of tasks; the member retries with backoff."""

    async def on_shutdown_requested(self) -> None:
        """Some process requested the shutdown of the whole application."""

    async def on_rebalance_started(self, consumer: int) -> None:
        """aiokafka is about to revoke everything of ``consumer`` and rejoin (commit now)."""

    async def on_membership_lost(self, consumer: int) -> None:
        """``consumer`` dropped out of the group since its last assignment (the broker did not
        know its member id or generation any more: its session or rebalance timeout expired),
        so its tasks may have run elsewhere meanwhile. Heard before ``on_rebalance_started``
        when aiokafka already knows, else at the next assignment, before its task callbacks;
        its tasks are reported as usual (a task it gets back is neither revoked nor assigned)."""

    async def on_rebalance_completed(self, consumer: int) -> None:
        """``consumer``'s new assignment is in place, after its task callbacks."""

    # What the host reports at each join (``ProcessHost.offset_sums``): called on the event
    # loop while aiokafka builds the subscription, so they answer at once (no I/O, no await).

    def restoring_actives(self) -> Collection[TaskId]:
        """Active tasks of this process not restored and running: still restoring, or whose
        state was dropped (a lost membership, a failed commit) and awaits its restore. The
        host reports them by their offset sums, as local state, not as running (as Kafka
        Streams sends ``LATEST_OFFSET`` only for RUNNING tasks). Default: none (every active
        of a consumer still in the group runs)."""
        return ()

    def store_offset_sums(self) -> Mapping[TaskId, int]:
        """Per task whose stores are open here and that is not a running active (a standby or
        warmup, a restoring active, stores kept after a revoke), its stores' current
        changelog offsets summed: the host reports these rather than the checkpoints, which
        may be a commit interval old. Default: none (checkpoints only)."""
        return {}


def _offset_sums_of(answer: object) -> dict[TaskId, int] | None:
    """``TaskListener.store_offset_sums``' answer checked: task ids to offset sums of 0 or
    more (None otherwise: of the wrong shape; a negative sum would read as a sentinel, such as
    ``LATEST_OFFSET``, and is dropped, and so is one past the wire's signed 64 bits, which
    would fail the subscription's encoding)."""
    if not isinstance(answer, Mapping):
        return None
    sums = {}
    for task, total in answer.items():
        if not isinstance(task, TaskId) or not isinstance(total, int) or isinstance(total, bool):
            return None
        if 0 <= total < 1 << 63:
            sums[task] = total
    return sums


class StreamsAssignor(AbstractPartitionAssignor):  # type: ignore[misc]
    """The aiokafka assignor of one consumer of a ``ProcessHost``."""

    def __init__(self, host: ProcessHost, index: int) -> None:
        self.host = host
        self.index = index
        self.rejoiner = Rejoiner()
        #: Re-fetches metadata of source topics this consumer's client does not know while
        #: the leader answers INCOMPLETE_SOURCE_TOPIC_METADATA (see ``_wait_for_topics``).
        self.metadata_watch = MetadataWatch()
        #: Changes only when this consumer wants a rebalance (``rejoin_now``, a failed
        #: assignment): a follower rejoining with unchanged metadata gets the current generation
        #: back without a rebalance, which is what aiokafka's own rejoins (e.g. after a commit
        #: answered RebalanceInProgress) need; changed on every join, each of them rebalanced
        #: the whole group (the Faust assignor's livelock, fixed the same way).
        self._join_epoch = 1
        #: This consumer's last assignment (tasks, host maps, error code).
        self.info = AssignmentInfo()
        #: Protocol version this consumer currently sends (version probing may lower it).
        self.version = host.max_version
        #: Milliseconds the last leader-side ``assign`` took on this consumer, if it led.
        self.last_assign_ms: float | None = None
        #: The scheduled probing rebalance, replaced by every new assignment.
        self._probe: asyncio.TimerHandle | None = None
        #: The error code the last subscription (``metadata``) carried to the leader.
        self._sent_error = ErrorCode.NONE

    @property
    def name(self) -> str:
        return PROTOCOL_NAME

    def metadata(self, topics: Sequence[str]) -> ConsumerProtocolMemberMetadata:
        info = SubscriptionInfo(
            self.host.process_id,
            endpoint=self.host.endpoint,
            offset_sums=self.host.offset_sums(),
            previous_active=self.info.active | self.host.restored_active(self.index),
            join_nonce=self._join_epoch,
            error_code=self.host.requested_error,
            rack=self.host.rack,
            client_tags=self.host.client_tags,
            # The host's pin, also when it was lowered after this assignor was built.
            version=min(self.version, self.host.max_version),
            latest_supported_version=self.host.max_version,
            # Each id's source topics, by their place in what this consumer subscribes to.
            subtopology_topic_indices=subtopology_topic_indices(self.host.topology, topics),
        )
        self._sent_error = info.error_code
        if self.index in self.host.errors and self.index < len(self.host.consumers):
            # The last answer was an error code (missing topics, wrong partition counts...):
            # fresh metadata now, which this consumer, if it leads this round, waits for before
            # it assigns, so a repair made since is seen without waiting metadata_max_age_ms.
            refresh_metadata(self.host.consumers[self.index])
        return ConsumerProtocolMemberMetadata(0, sorted(topics), info.encode())

    def assign(
        self, cluster: Any, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, bytes]:
        """Leader: decode, run ``assign_streams``, encode; never raises."""
        started = asyncio.get_running_loop().time() if _has_loop() else 0.0
        try:
            subscribed = readable_subscriptions(members)
            topics = {t for names, _ in subscribed.values() for t in names}
            counts = cluster_counts(cluster, sorted(topics))
            # Decoded against the tasks that exist: claims on others are never made.
            subscriptions = decode_subscriptions(
                self.host.topology, counts, subscribed, self.host.max_version
            )
            result = assign_streams(
                self.host.topology,
                counts,
                subscriptions,
                partition_racks=_leader_racks(cluster, counts),
                rack_aware_tags=self.host.rack_aware_tags,
                num_standby_replicas=self.host.num_standby_replicas,
                leader_version=self.host.max_version,
                end_offsets=self._end_offsets(),
                acceptable_recovery_lag=self.host.acceptable_recovery_lag,
                high_availability=self.host.high_availability,
                max_warmup_replicas=self.host.max_warmup_replicas,
                probing_rebalance_interval_ms=self.host.probing_rebalance_interval_ms,
                probing_memory=self.host.probing_memory,
                topology_errors=self.host.topology_errors,
                shared_ids=self.host.shared_ids,
                topology_versions=self.host.topology_versions,
                withheld=self.host.withheld,
            )
            out = {m: encode_assignment(a.partitions, a.info.encode()) for m, a in result.items()}
            self.host.led_generation = self._generation()
        except Exception:
            log.exception("streams assignment failed; sending ASSIGNMENT_ERROR to every member")
            failed = AssignmentInfo(error_code=ErrorCode.ASSIGNMENT_ERROR, version=1).encode()
            out = {m: encode_assignment((), failed) for m in members}
        if _has_loop():
            self.last_assign_ms = (asyncio.get_running_loop().time() - started) * 1000
        return out

    def _end_offsets(self) -> Mapping[TaskId, int] | None:
        """The host's changelog end offsets; None (lags unknown: no stateful active moves onto
        a warmup, see ``assign_streams``) when there is no callable or it fails, so a broken
        lookup never fails the whole group's assignment."""
        if self.host.end_offsets is None:
            return None
        try:
            return self.host.end_offsets()
        except Exception:
            log.exception("end_offsets failed; assigning with unknown lags (no warmup takes over)")
            return None

    def _generation(self) -> int | None:
        """The generation this consumer's coordinator holds (aiokafka sets it from the
        JoinGroup answer, before the leader assigns and before the assignment arrives)."""
        now = self.host.membership(self.index)
        return None if now is None else now[1]

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        if self.host.led_generation is None or self._generation() != self.host.led_generation:
            # Another process led this generation: its plan, not the remembered one, is the
            # last, even when it moved no active (only standbys or warmups). And what this one
            # logged as leader is old: leading again, an error or a process id clash is news
            # (an ERROR or WARNING, not DEBUG, as the Faust assignor logs it), and an incident
            # the other leader saw end gets no late INFO line.
            self.host.probing_memory.forget()
            self.host.topology_errors = Repeats()
            self.host.shared_ids = Repeats()
            self.host.topology_versions = Repeats()
            self.host.withheld = Repeats()
        try:
            info = AssignmentInfo.decode(assignment.user_data or b"", self.host.max_version)
        except ProtocolError as exc:
            log.error("unreadable assignment (%s); treating it as an assignment error", exc)
            info = AssignmentInfo(error_code=ErrorCode.ASSIGNMENT_ERROR)
        self.info = info
        if (
            self.host.requested_error == ErrorCode.SHUTDOWN_REQUESTED
            and self._sent_error != ErrorCode.SHUTDOWN_REQUESTED
            and info.error_code != ErrorCode.SHUTDOWN_REQUESTED
        ):
            # request_shutdown came while this join was under way: aiokafka dropped its rejoin
            # request before SyncGroup, and this subscription did not carry it. Once more.
            log.info("consumer %d: rejoining to send the shutdown request", self.index)
            self.rejoin_now()
        if info.error_code != ErrorCode.NONE:
            self.cancel_probe()  # the rejoin's backoff replaces the probing rebalance
            self.info = AssignmentInfo(version=info.version, common_version=info.common_version)
            if info.error_code == ErrorCode.SHUTDOWN_REQUESTED:
                self.host.shutdown_requested = True
                return
            self._join_epoch += 1  # the retry must start a rebalance
            self._report_error(info.error_code, self.rejoiner.failed())
            self.host.errors[self.index] = info.error_code
            return
        self._report_recovery()
        self.rejoiner.succeeded()
        self.metadata_watch.cancel()
        self.host.errors.pop(self.index, None)
        self.host.host_info = info  # the leader's host maps, whatever its version
        self.info = self._own_version_only(info, assignment.partitions())
        # Version probing: follow the leader down at once; going up needs one more rebalance
        # so that the leader sees the richer subscription.
        if info.common_version < self.version:
            log.info(
                "protocol version %d -> %d (leader's choice)", self.version, info.common_version
            )
            self.version = info.common_version
        elif min(info.common_version, self.host.max_version) > self.version:
            self.version = min(info.common_version, self.host.max_version)
            log.info("protocol version upgraded to %d; rejoining", self.version)
            self.rejoin_now()
        self._schedule(info.next_rebalance_ms)

    def _own_version_only(self, info: AssignmentInfo, assigned: Sequence[Any]) -> AssignmentInfo:
        """``info`` without the tasks that mean other partitions here than in the leader's
        topology (a leader of another topology version that reused a subtopology id): run, they
        would open the wrong stores and find no record of theirs. Every assigned partition of no
        task kept is paused (no fetch; committed offsets untouched); the next assignment starts
        unpaused. Checked whatever the leader's version: one ERROR line per episode."""
        topology = self.host.topology
        consumer = (
            self.host.consumers[self.index] if self.index < len(self.host.consumers) else None
        )
        counts = metadata_counts(consumer, topology.source_topics)
        every = info.active | info.standby | info.warmup
        mismatches = mismatched_tasks(topology, every, info.topics, counts)
        active = info.active - mismatches.keys()
        foreign = [tp for tp in assigned if not _runs_one_of(topology, tp, active)]
        if foreign and consumer is not None:
            with contextlib.suppress(Exception):  # no longer assigned: nothing to fetch
                consumer.pause(*foreign)
        self.host.report_topology_version(self.index, info.topics, mismatches, foreign)
        if not mismatches:
            return info
        return attrs.evolve(
            info,
            active=active,
            standby=info.standby - mismatches.keys(),
            warmup=info.warmup - mismatches.keys(),
        )

    def _report_error(self, code: ErrorCode, delay: float) -> None:
        """One ERROR line when the leader's answer turns to ``code``; the same answer again
        only at DEBUG (the retries back off to 30 s, and the leader logs its cause each time)."""
        missing = (
            self._wait_for_topics() if code == ErrorCode.INCOMPLETE_SOURCE_TOPIC_METADATA else ()
        )
        if self.host.errors.get(self.index) == code:
            log.debug("consumer %d: %s again; rejoining in %.0f s", self.index, code.name, delay)
            return
        detail = (
            f"; source topics missing here too: {', '.join(missing)} (re-fetching their metadata "
            "until they exist)"
            if missing
            else ""
        )
        log.error(
            "consumer %d: the leader sent %s instead of tasks%s; nothing assigned meanwhile, "
            "rejoining in %.0f s, then with growing backoff up to 30 s (repeats logged at DEBUG)",
            self.index,
            code.name,
            detail,
            delay,
        )

    def _wait_for_topics(self) -> tuple[str, ...]:
        """Source topics this consumer's client has no partitions of, watched until it has
        (the watch goes on across retries; restarting it at each would re-fetch more often)."""
        consumer = (
            self.host.consumers[self.index] if self.index < len(self.host.consumers) else None
        )
        if consumer is None:
            return ()
        missing = unsized(consumer, self.host.topology.source_topics)
        if missing != self.metadata_watch.topics:
            self.metadata_watch.watch(consumer, missing)
        return tuple(sorted(missing))

    def _report_recovery(self) -> None:
        """A line when tasks arrive after error answers (the ERROR line said they stopped)."""
        code = self.host.errors.get(self.index)
        if code is not None:
            log.info(
                "consumer %d: tasks assigned after %d rebalance(s) answered %s",
                self.index,
                self.rejoiner.failures,
                code.name,
            )

    def rejoin_now(self) -> bool:
        """Start a rebalance from this consumer: a new join nonce, so that the rejoin starts
        one even when this consumer is a follower. False when no consumer is bound."""
        self._join_epoch += 1
        return self.rejoiner.after(0)

    def cancel_probe(self) -> None:
        """Drop the scheduled probing rebalance, if any (a newer assignment, or shutdown)."""
        if self._probe is not None:
            self._probe.cancel()
            self._probe = None

    def _schedule(self, next_rebalance_ms: int) -> None:
        """Rejoin when the leader asks: now, or at a time (a probing rebalance). A new
        assignment replaces the time an older one set, so probes never pile up."""
        self.cancel_probe()
        if next_rebalance_ms == NOW:
            self.rejoin_now()
        elif next_rebalance_ms != NEVER:
            delay = next_rebalance_ms / 1000 - time.time()
            # The time is the leader's wall clock; a member whose clock runs ahead would see it
            # passed after every assignment and rebalance in a loop: wait a tenth at least.
            floor = self.host.probing_rebalance_interval_ms / 10_000
            if delay < floor:
                log.info("probing rebalance due in %.1f s by this clock; in %.1f s", delay, floor)
                delay = floor
            if _has_loop():
                loop = asyncio.get_running_loop()
                self._probe = loop.call_later(delay, self.rejoin_now)
            else:
                log.warning("no running event loop; the probing rebalance cannot be scheduled")


async def _stop_consumer(index: int, consumer: AIOKafkaConsumer) -> None:
    """Stop one consumer within ``CLOSE_TIMEOUT``. Its stop waits for the coordination task:
    after a rebalance callback aiokafka sends a JoinGroup before it sees the consumer
    closing, and an unanswering broker answers it only at ``request_timeout_ms`` (40 s by
    default); then the LeaveGroup. Cut, the member is left to the group coordinator, which
    drops it at its session timeout, as a crashed one (its tasks were committed, or not,
    before: the host's stop comes after the runtime's commits)."""
    abandoned = "its group requests are abandoned (the group drops it at its session timeout)"
    if not await stop_within(f"consumer {index}", consumer, abandoned, log):
        await release_consumer(f"consumer {index}", consumer, log)


def _leader_racks(cluster: Any, counts: Mapping[str, int]) -> dict[TopicPartition, str]:
    """The rack of each source partition's leader, where the broker reports one (KIP-925).
    Only a hint: metadata it cannot read gives no racks rather than a failed assignment."""
    racks: dict[TopicPartition, str] = {}
    try:
        for topic, n in counts.items():
            for p in range(n):
                tp = TopicPartition(topic, p)
                leader = cluster.leader_for_partition(tp)
                broker = cluster.broker_metadata(leader) if leader is not None else None
                if broker is not None and broker.rack:
                    racks[tp] = broker.rack
    except (AttributeError, KeyError, TypeError) as exc:
        log.warning("no partition leader racks (%s); placing without them", exc)
        return {}
    return racks


def metadata_counts(consumer: Any, topics: Iterable[str]) -> dict[str, int]:
    """Partition counts of ``topics`` the consumer's client knows (none when it has no
    metadata)."""
    cluster = getattr(getattr(consumer, "_client", None), "cluster", None)
    return {} if cluster is None else cluster_counts(cluster, topics)


def cluster_counts(cluster: Any, topics: Iterable[str]) -> dict[str, int]:
    """Partition counts of those of ``topics`` that ``cluster`` (aiokafka's metadata) knows
    partitions of, in the order of ``topics``."""
    counts = {}
    for topic in topics:
        partitions = cluster.partitions_for_topic(topic)
        if partitions:
            counts[topic] = len(partitions)
    return counts


@attrs.frozen
class _VersionReport:
    """One consumer's part of an assignment as the topology-version check saw it."""

    #: The generation it belongs to (None: unknown).
    generation: int | None
    #: The subtopology ids whose tasks would be refused (``refused_subtopologies``).
    differences: frozenset[SubtopologyDifference]
    #: The tasks refused (each names its task).
    mismatches: frozenset[TaskMismatch]
    #: The partitions paused (assigned, of no task kept).
    paused: frozenset[TopicPartition]
    #: Whether the assignment carried the leader's topic dictionary (else it tells nothing).
    informative: bool


def _runs_one_of(topology: Topology, partition: Any, tasks: frozenset[TaskId]) -> bool:
    """Whether ``partition`` (an aiokafka topic partition) belongs, in ``topology``, to one
    of ``tasks``."""
    tp = TopicPartition(partition.topic, partition.partition)
    return tp.topic in topology.source_topics and topology.task_of(tp) in tasks


def _store_changelogs(
    topology: Topology,
    application_id: str,
    declared: Mapping[int, Collection[str]] | None = None,
) -> dict[int, frozenset[str]]:
    """Each subtopology's changelog topics, the only checkpoint entries its offset sums
    count: ``declared`` ones (``ProcessHost(changelog_topics=...)``), else
    ``<prefix>-<store>-changelog`` for its stores, under the topology's name (the runtime's)
    and the application id (a host given another ``application_id`` may name them after it);
    a stateless subtopology has none."""
    declared = dict(declared or {})
    _check_changelog_topics(declared)
    ids = {sub.id for sub in topology.subtopologies}
    unknown = sorted(declared.keys() - ids)
    if unknown:
        raise ConfigError(
            f"changelog_topics names subtopologies {unknown} the topology does not have "
            f"(it has {sorted(ids)})"
        )
    prefixes = {p for p in (topology.name, application_id) if p}
    defaults = {
        sub.id: frozenset(changelog_topic_name(p, s) for p in prefixes for s in sub.stores)
        for sub in topology.subtopologies
    }
    return defaults | {sub: frozenset(topics) for sub, topics in declared.items()}


def _check_changelog_topics(declared: Mapping[Any, Any]) -> None:
    """``ProcessHost(changelog_topics=...)`` is a map of subtopology ids (ints) to collections
    of topic names (strs): anything else fails at construction, not at every later join."""
    for sub, topics in declared.items():
        if not isinstance(sub, int) or isinstance(sub, bool):
            raise ConfigError(f"changelog_topics: subtopology id {sub!r} is not an int")
        if isinstance(topics, str | bytes) or not isinstance(topics, Collection):
            raise ConfigError(
                f"changelog_topics[{sub}]: give a collection of topic names, not {topics!r}"
            )
        if not all(isinstance(topic, str) for topic in topics):
            raise ConfigError(f"changelog_topics[{sub}]: topic names must be strs: {topics!r}")


def _has_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, host: ProcessHost, index: int) -> None:
        self.host = host
        self.index = index

    async def on_partitions_revoked(self, revoked: object) -> None:
        """Eager revocation: no task change to report yet (see ``ProcessHost``)."""
        if self.host.member_lost(self.index):
            await self.host._notify(self.host.listener.on_membership_lost, self.index)
        await self.host._notify(self.host.listener.on_rebalance_started, self.index)

    async def on_partitions_assigned(self, assigned: object) -> None:
        await self.host._assigned(self.index)


class ProcessHost:
    """N consumers of one process id in one asyncio process (see the module docstring).

    ``consumer_config`` goes to every ``AIOKafkaConsumer`` (session timeouts and the like);
    ``max_version`` caps the protocol version this process speaks (for rolling upgrades).

    ``high_availability=True`` makes this process, when it leads, use the high-availability
    assignor (``streamassign.ha``): actives move only onto caught-up state, warmups go to their
    targets (run them like standbys: they arrive through ``on_standby_added``), and members
    rejoin for a probing rebalance ``probing_rebalance_interval_ms`` later. ``end_offsets``
    (a callable giving each stateful task's summed changelog end offsets) makes lags exact;
    without it a copy's lag is measured against the most advanced copy reported, and with high
    availability a task without an end offset never moves to a warmup (lag unknown). Give every
    process the same settings: whichever leads decides.

    ``changelog_topics`` (subtopology id -> the changelog topics its tasks' checkpoints name,
    for a host managing its own stores) replaces, for the subtopologies it names, the
    default ``<topology name or application_id>-<store>-changelog`` of their declared stores:
    offset sums count only those entries (``offset_sums``).
    """

    def __init__(
        self,
        topology: Topology,
        *,
        bootstrap_servers: str,
        state_dir: str | os.PathLike[str],
        threads: int = 1,
        application_id: str | None = None,
        endpoint: str | None = None,
        num_standby_replicas: int = 0,
        rack: str | None = None,
        client_tags: Mapping[str, str] | None = None,
        listener: TaskListener | None = None,
        consumer_config: Mapping[str, Any] | None = None,
        max_version: int = LATEST_VERSION,
        high_availability: bool = False,
        acceptable_recovery_lag: int = ACCEPTABLE_RECOVERY_LAG,
        max_warmup_replicas: int = 2,
        probing_rebalance_interval_ms: int = 600_000,
        end_offsets: Callable[[], Mapping[TaskId, int]] | None = None,
        rack_aware_tags: Sequence[str] | None = None,
        changelog_topics: Mapping[int, Collection[str]] | None = None,
    ) -> None:
        if threads < 1:
            raise ConfigError(f"threads must be >= 1, got {threads}")
        if not is_protocol_version(max_version):
            raise ConfigError(
                f"max_version must be an int from {MIN_VERSION} to {LATEST_VERSION}, "
                f"got {max_version!r}"
            )
        topology.check_has_tasks()  # else start() would subscribe to no topic, and fail there
        self._set_leader_options(
            num_standby_replicas,
            high_availability,
            acceptable_recovery_lag,
            max_warmup_replicas,
            probing_rebalance_interval_ms,
            end_offsets,
            rack_aware_tags,
        )
        self.topology = topology
        self.application_id = application_id or topology.name
        if not self.application_id:
            raise ConfigError("an application id is needed (application_id= or a topology name)")
        self.bootstrap_servers = bootstrap_servers
        #: Each subtopology's changelog topics: the only local state offset sums count.
        self._changelogs = _store_changelogs(topology, self.application_id, changelog_topics)
        self.state = StateDirectory(Path(state_dir))
        self.process_id = self.state.process_id
        self.threads = threads
        self.endpoint = endpoint
        self.num_standby_replicas = num_standby_replicas
        self.rack = rack
        self.client_tags = dict(client_tags or {})
        self.listener = listener or TaskListener()
        self.consumer_config = dict(consumer_config or {})
        self.max_version = max_version
        self._init_group_state(threads)

    def _set_leader_options(
        self,
        num_standby_replicas: int,
        high_availability: bool,
        acceptable_recovery_lag: int,
        max_warmup_replicas: int,
        probing_rebalance_interval_ms: int,
        end_offsets: Callable[[], Mapping[TaskId, int]] | None,
        rack_aware_tags: Sequence[str] | None,
    ) -> None:
        """Check and keep the options this process assigns with when it leads."""
        # Checked here, not at the first rebalance this process leads.
        HighAvailabilityTaskAssignor(
            num_standby_replicas,
            acceptable_recovery_lag,
            max_warmup_replicas,
            probing_rebalance_interval_ms,
        )
        if high_availability and end_offsets is None:
            log.warning(
                "high_availability without end_offsets: lags are unknown, so no stateful "
                "active ever moves to a warmup (pass end_offsets= to let warmups take over)"
            )
        self.high_availability = high_availability
        self.acceptable_recovery_lag = acceptable_recovery_lag
        self.max_warmup_replicas = max_warmup_replicas
        self.probing_rebalance_interval_ms = probing_rebalance_interval_ms
        self.end_offsets = end_offsets
        self.rack_aware_tags = rack_aware_tags

    def _init_group_state(self, threads: int) -> None:
        """What the process tracks of the group: errors, host maps, its consumers' assignments
        (the restored ones from the state directory until every consumer is assigned)."""
        self.requested_error = ErrorCode.NONE
        self.shutdown_requested = False
        self.errors: dict[int, ErrorCode] = {}
        #: The latest good assignment user data of any consumer: the group's host maps.
        self.host_info = AssignmentInfo()
        #: The last high-availability plan this process made as leader, whichever of its
        #: consumers led: its target is offered to the next plan in a probing round.
        self.probing_memory = ProbingMemory()
        #: The topology error this process last logged as leader, whichever of its consumers
        #: led: the same one at the next rebalances (members retry every 1 to 30 s while a
        #: topic is missing) is logged at DEBUG only; forgotten when another process leads.
        self.topology_errors = Repeats()
        #: The process ids this process last logged as leader as announced with several
        #: endpoints (copied state directories): each clash is logged at WARNING once;
        #: forgotten when another process leads.
        self.shared_ids = Repeats()
        #: The topology versions this process last logged as leader as sharing the group: a
        #: mixed-version episode is logged once; forgotten when another process leads.
        self.topology_versions = Repeats()
        #: The tasks this process last logged as leader as withheld (no member subscribing to
        #: their topics may run them): logged at ERROR once per episode.
        self.withheld = Repeats()
        #: The subtopologies the last leader's topology reads other topics in than this
        #: process's (another topology version in the group): logged once per episode.
        self.version_mismatch = Repeats()
        #: Each consumer's part of the last assignment, as the version check saw it: the
        #: process logs one line once every consumer's part of a generation is in.
        self._version_reports: dict[int, _VersionReport] = {}
        #: The generation this process last led (None: none, or unknown), so that an
        #: assignment another process computed makes ``probing_memory`` forget.
        self.led_generation: int | None = None
        self.assignors = [StreamsAssignor(self, i) for i in range(threads)]
        self.consumers: list[AIOKafkaConsumer] = []
        self._known = [ClientAssignment() for _ in range(threads)]
        self._restored = self.state.read_assignment(self._changelogs.keys())
        #: Consumers assigned since start: the restored claims hold until all of them are.
        self._joined: set[int] = set()
        self.rebalances = 0
        #: Member id and generation of each consumer at its last assignment.
        self._memberships: list[tuple[str, int] | None] = [None] * threads
        #: Set by ``stop``: assignments that still arrive only take tasks away.
        self._stopping = False
        self._save_lock = asyncio.Lock()
        #: Done when the ``start`` under way has ended (None: none began).
        self._start_ended: asyncio.Future[None] | None = None
        #: The first assignments ``start`` waits for (``begin_stop`` cancels the wait).
        self._first_assignments: asyncio.Future[Any] | None = None
        #: Done when the consumers' stop under way has ended (None: none is).
        self._consumers_stopped: asyncio.Future[None] | None = None

    # -- state the protocol reports --------------------------------------------------------------

    @property
    def running(self) -> frozenset[TaskId]:
        """Active tasks of this process, over all its consumers."""
        return frozenset().union(*(a.active for a in self._known))

    def tasks(self, consumer: int) -> ClientAssignment:
        """Active, standby and warmup tasks of one consumer."""
        return self._known[consumer]

    def restored_active(self, consumer: int) -> frozenset[TaskId]:
        """What ``consumer`` ran before this process restarted and the process has not run
        since, until every consumer of the process has had an assignment: a rebalance that
        saw only some of them gave the process a smaller share, and the tasks it could not take
        back then stay claimed for the next. A task handed back is no longer claimed, even
        once it leaves the process again (see ``_settle_claims``)."""
        return self._restored.get(consumer, frozenset())

    def offset_sums(self) -> dict[TaskId, int]:
        """``LATEST_OFFSET`` for the actives restored and running (``reported_running``); for
        other local state (of this topology's stores only) its offset sum: the stores' current
        one where the listener knows it (``TaskListener.store_offset_sums``), else the
        checkpoint's (``StateDirectory.offset_sums``).

        An active still restoring, or kept through a lost membership, is local state with a
        real lag, as in Kafka Streams (and ``metadata`` keeps it among ``previous_active``):
        the leader gives it back where its lag is within ``acceptable_recovery_lag``, else
        weighs it by that lag. Reported running, it would be a second running claim beside
        the interim owner's, which the leader would settle by process id."""
        sums = self.state.offset_sums(self._changelogs)
        no_sums: Mapping[TaskId, int] = {}
        answer = self._ask_listener(self.listener.store_offset_sums, no_sums)  # logs a failure
        live = _offset_sums_of(answer)
        if live is None:
            log.error(
                "a task listener's answer for the subscription could not be used: "
                "store_offset_sums returned %s",
                reprlib.repr(answer),
            )
        for task, total in (live or {}).items():
            if task.subtopology in self._changelogs:
                sums[task] = total
        for t in self.reported_running():
            sums[t] = LATEST_OFFSET
        return sums

    def reported_running(self) -> frozenset[TaskId]:
        """The actives this process reports running: those of its consumers still in the group
        since their last assignment (``left_group``), less those the listener says are
        restoring (``TaskListener.restoring_actives``)."""
        kept = [a.active for i, a in enumerate(self._known) if not self.left_group(i)]
        restoring = self._ask_listener(lambda: frozenset(self.listener.restoring_actives()), None)
        return frozenset().union(*kept) - (restoring or frozenset())

    def left_group(self, consumer: int) -> bool:
        """Whether ``consumer``'s member id is no longer the one of its last assignment:
        aiokafka reset it (the broker answered UnknownMemberId or IllegalGeneration to a
        heartbeat, a commit or a join), or it has joined again under a new one. Its tasks
        may have run elsewhere meanwhile. Unlike ``member_lost``, also right during a rejoin:
        a rebalance the consumer takes part in changes its generation only."""
        before = self._memberships[consumer]
        now = self.membership(consumer)
        return before is not None and now is not None and now[0] != before[0]

    def _ask_listener(self, question: Callable[[], _Answer], fallback: _Answer) -> _Answer:
        """The listener's answer, or ``fallback`` when it fails or answers in the wrong shape:
        a subscription is built whatever a listener does (logged with its trace; raising
        here would end aiokafka's coordination task, and the consumer would never rejoin)."""
        try:
            return question()
        except Exception:
            log.exception("a task listener's answer for the subscription could not be used")
            return fallback

    def membership(self, consumer: int) -> tuple[str, int] | None:
        """``consumer``'s member id and generation as aiokafka holds them; None before it
        exists or when they cannot be read."""
        return membership(self.consumers[consumer]) if consumer < len(self.consumers) else None

    def member_lost(self, consumer: int) -> bool:
        """Whether ``consumer`` no longer has the member id and generation of its last
        assignment (aiokafka reset them: the broker answered UnknownMemberId or
        IllegalGeneration). Only meaningful between assignments, not during a rejoin."""
        before = self._memberships[consumer]
        now = self.membership(consumer)
        return before is not None and now is not None and now != before

    def report_topology_version(
        self,
        consumer: int,
        leader_topics: Mapping[int, Mapping[str, int]],
        mismatches: Mapping[TaskId, TaskMismatch],
        paused: Sequence[Any],
    ) -> None:
        """Record what ``consumer`` refused of its assignment; once every consumer of this
        process has reported for the same generation, log a leader of another topology
        version once per episode (one ERROR naming every refused task of the process, then
        DEBUG at each rebalance of it) and its end once (INFO); a leader of another version
        that assigns no task of the differing ids here gets one INFO line. Assignments without the
        leader's topic dictionary tell nothing either way."""
        membership = self.membership(consumer)
        self._version_reports[consumer] = _VersionReport(
            None if membership is None else membership[1],
            refused_subtopologies(self.topology, leader_topics, mismatches.values()),
            frozenset(mismatches.values()),
            frozenset(TopicPartition(tp.topic, tp.partition) for tp in paused),
            bool(leader_topics),
        )
        generation = self._version_reports[consumer].generation
        reports = [self._version_reports.get(i) for i in range(self.threads)]
        if any(r is None or r.generation != generation for r in reports):
            log.debug("consumer %d: refused %s", consumer, sorted(mismatches) or "no task")
            return  # the other consumers' part of this generation is still to come
        self._log_topology_version([r for r in reports if r is not None])

    def _log_topology_version(self, reports: Sequence[_VersionReport]) -> None:
        """The process's line for one generation (see ``report_topology_version``)."""
        if not any(r.informative for r in reports):
            return
        differences = frozenset().union(*(r.differences for r in reports))
        mismatches = {m.task: m for r in reports for m in r.mismatches}
        if mismatches:
            news = self.version_mismatch.changed(differences)
            paused = frozenset().union(*(r.paused for r in reports))
            error = mismatch_error(differences, mismatches, paused)
            log.log(logging.ERROR if news else logging.DEBUG, "%s", error)
        elif differences:  # a leader that moved those ids' tasks elsewhere: nothing refused
            news = self.version_mismatch.changed(("none refused", differences))
            log.log(
                logging.INFO if news else logging.DEBUG,
                "the group's leader runs another topology version (subtopology ids %s read "
                "other topics there); no task of them is assigned here, every assigned task runs",
                ", ".join(str(sub) for sub, _, _ in sorted(differences)),
            )
        elif self.version_mismatch.ended():
            log.info(
                "the leader's topology reads the same topics per subtopology id as this "
                "process's again (or a subset): every assigned task runs"
            )

    def request_rejoin(self, consumer: int) -> None:
        """Start a rebalance from ``consumer`` (its tasks then go through the callbacks)."""
        self.assignors[consumer].rejoin_now()

    def host_for(self, partition: TopicPartition) -> str | None:
        """Endpoint of the process running ``partition``'s task (interactive queries)."""
        task = self.topology.task_of(partition)
        for host, tasks in self.host_info.active_by_host.items():
            if task in tasks:
                return host
        return None

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Create and start the consumers, then subscribe them; returns once each has had its
        first assignment (tasks, or an error code such as INCOMPLETE_SOURCE_TOPIC_METADATA).

        Subscribed before ``start``, aiokafka would first wait for every source topic to exist
        (re-fetching metadata every ``retry_backoff_ms``, logging each miss) and fail after
        ``request_timeout_ms`` without ever joining; subscribed after, a missing topic is the
        leader's to report. A failed start stops the consumers it started.

        The first assignment has no deadline (the broker may be away for a while, as Kafka
        Streams waits for it); ``begin_stop`` or ``stop`` during ``start`` ends it: it stops
        the consumers it started and raises ``StartStoppedError``."""
        if self._stopping:
            started = self._start_ended is not None
            raise StartStoppedError.refusing_start("the process host", started, "make a new one")
        self._start_ended = asyncio.get_running_loop().create_future()
        try:
            await self._start_consumers()
        finally:
            self._start_ended.set_result(None)

    async def _start_consumers(self) -> None:
        """``start``'s steps: create and start the consumers, subscribe, wait to be assigned."""
        for assignor in self.assignors:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap_servers,
                group_id=self.application_id,
                partition_assignment_strategy=(assignor,),
                enable_auto_commit=False,
                **self.consumer_config,
            )
            assignor.rejoiner.bind(consumer)
            self.consumers.append(consumer)
        try:
            # Every start is awaited to its end, even after one failed: a consumer still
            # starting when stopped would finish its start afterwards and run on, closed.
            started = await asyncio.gather(
                *(c.start() for c in self.consumers), return_exceptions=True
            )
            for outcome in started:
                if isinstance(outcome, BaseException):
                    raise outcome
            self._raise_if_stopping("before its consumers joined the group")
            await self._subscribe()
        except BaseException:
            await self._stop_consumers()
            raise

    def _raise_if_stopping(self, when: str) -> None:
        if self._stopping:
            raise StartStoppedError(f"the process host's start was stopped {when}")

    async def _subscribe(self) -> None:
        """Subscribe every started consumer to the source topics; wait for their first
        assignments, or for ``begin_stop``."""
        topics = sorted(self.topology.source_topics)
        first: list[asyncio.Future[None]] = []
        for i, consumer in enumerate(self.consumers):
            waiter = next_assignment(consumer)  # asked before subscribing: none slips by
            consumer.subscribe(topics, listener=_Listener(self, i))
            if waiter is not None:
                first.append(waiter)
        assigned = self._first_assignments = asyncio.gather(*first)
        # A cancelled gather ends with CancelledError as its failure (not as cancelled); when
        # the task running start is cancelled, nobody looks at it again and asyncio would log
        # it ("_GatheringFuture exception was never retrieved") once collected.
        assigned.add_done_callback(retrieve_failure)
        try:
            # Waited on, not awaited: begin_stop cancels the gather, and that must end the
            # wait, not look like a cancel of the task running start.
            await asyncio.wait([assigned])
        finally:
            self._first_assignments = None
            assigned.cancel()  # no-op once done; else this task was cancelled: stop waiting
        if self._stopping:  # asked while waiting, or in the turn the last assignment came
            failure = None if assigned.cancelled() else assigned.exception()
            if isinstance(failure, asyncio.CancelledError):
                failure = None
            if failure is not None:  # the stop was asked for and wins; the failure is shown
                log.warning("a consumer's first assignment failed as the host stopped: %r", failure)
            raise StartStoppedError(
                "the process host's start was stopped while its consumers waited for their "
                "first assignment"
            ) from failure
        assigned.result()  # a consumer's group coordinator failed

    def begin_stop(self) -> None:
        """Mark the process as stopping (``stop`` does too): from now on an assignment only
        takes tasks away, and is not saved as the restarted process's claim. Call it first
        when stopping takes a while before ``stop`` (grace, commits, closing stores). A
        ``start`` under way ends (``StartStoppedError``) instead of waiting for its first
        assignment."""
        self._stopping = True
        if self._first_assignments is not None:
            self._first_assignments.cancel()

    @property
    def stopping(self) -> bool:
        """Whether ``begin_stop`` (or ``stop``) was called."""
        return self._stopping

    async def stop(self) -> None:
        """Stop the consumers (leaving the group) and close the state directory. A ``start``
        under way is let end first (``begin_stop`` ends its wait for the first assignment;
        its consumers' starts end at their client timeouts): it stops what it started, and
        no consumer is stopped while it is still starting."""
        self.begin_stop()
        if self._start_ended is not None and not self._start_ended.done():
            await asyncio.wait([self._start_ended])
        await self._stop_consumers()
        self.state.close()

    async def _stop_consumers(self) -> None:
        """Cancel the assignors' timers (a probe, a retry, a metadata watch would otherwise
        act on closed consumers) and stop every consumer, together, each within
        ``closing.CLOSE_TIMEOUT``. One at a time: a second caller (a failed start's cleanup
        and ``stop``) waits for the stop under way, then stops what is left (nothing, unless
        that stop was cancelled)."""
        while self._consumers_stopped is not None:
            await asyncio.wait([self._consumers_stopped])
        self._consumers_stopped = asyncio.get_running_loop().create_future()
        try:
            for assignor in self.assignors:
                assignor.cancel_probe()
                assignor.rejoiner.cancel()
                assignor.metadata_watch.cancel()
            await asyncio.gather(*(_stop_consumer(i, c) for i, c in enumerate(self.consumers)))
            self.consumers.clear()
        finally:
            self._consumers_stopped.set_result(None)
            self._consumers_stopped = None

    async def request_shutdown(self) -> None:
        """Ask every process of the application to shut down (through the protocol)."""
        self.requested_error = ErrorCode.SHUTDOWN_REQUESTED
        for assignor in self.assignors:
            assignor.rejoin_now()

    async def poll(self, timeout_ms: int = 100) -> dict[int, dict[TopicPartition, list[Any]]]:
        """One fetch on every consumer: records by consumer index and partition. Keeps the
        consumers inside ``max.poll.interval``; the runtime builds its loop on this."""
        batches = await asyncio.gather(*(c.getmany(timeout_ms=timeout_ms) for c in self.consumers))
        return {i: {TopicPartition(*tp): rs for tp, rs in b.items()} for i, b in enumerate(batches)}

    async def _assigned(self, index: int) -> None:
        """After aiokafka's assignment: report what really changed on this consumer.

        Every callback runs even if an earlier one fails (failures are logged), so no change
        is ever lost; the last assignment is saved off the event loop, only when it changed.
        """
        self.rebalances += 1
        left = self.left_group(index)
        self._memberships[index] = self.membership(index)
        if self.shutdown_requested:
            await self._notify(self.listener.on_shutdown_requested)
            return
        if index in self.errors:
            await self._notify(self.listener.on_error, index, self.errors[index])
        if left:  # a new member id: the old one was dropped from the group, unnoticed until now
            await self._notify(self.listener.on_membership_lost, index)
        info = self.assignors[index].info
        before = self._known[index]
        now = ClientAssignment(info.active, info.standby, info.warmup)
        if self._stopping:
            # Consumers leave one by one, so one still in the group can be handed its
            # siblings' tasks. It leaves in a moment: starting them would be wasted restores,
            # and saving them would make the restarted process claim tasks it never ran.
            now = ClientAssignment(
                now.active & before.active,
                now.standby & before.standby,
                now.warmup & before.warmup,
            )
        self._known[index] = now
        self._joined.add(index)
        settled = self._settle_claims()
        joined = bool(self._restored) and len(self._joined) == self.threads
        if joined:
            self._restored.clear()
        # A settled claim is saved too: a crash must not bring it back (the task it names
        # usually came with this consumer's new actives, saved anyway, but may be a sibling's).
        if (before.active != now.active or joined or settled) and not self._stopping:
            await self._save_assignment()
        standby_before, standby_now = before.standby | before.warmup, now.standby | now.warmup
        for callback, tasks in (
            (self.listener.on_active_revoked, before.active - now.active),
            (self.listener.on_standby_removed, standby_before - standby_now),
            (self.listener.on_active_assigned, now.active - before.active),
            (self.listener.on_standby_added, standby_now - standby_before),
        ):
            if tasks:
                await self._notify(callback, index, tasks)
        await self._notify(self.listener.on_rebalance_completed, index)

    def _settle_claims(self) -> bool:
        """Drop the restored claims on tasks the process runs now; whether any was dropped.

        A claim the leader honoured has done its work: the task runs here, and the consumer
        running it reports it among its actives anyway. Kept, it would outlive the task here:
        once the leader gives the task to another restarted process that also claims it (it
        cannot tell this process won it back from one that ran it meanwhile), the claim would
        take it back a round later, a bounce. Claims on tasks not handed back yet (the
        process's share was smaller while some consumers had not joined) stay."""
        running = self.running
        if not any(claimed & running for claimed in self._restored.values()):
            return False
        self._restored = {i: c - running for i, c in self._restored.items() if c - running}
        return True

    async def _save_assignment(self) -> None:
        """Save every consumer's actives, and the claims not yet settled (a crash now must not
        forget them), off the event loop.

        Consumers of one process are assigned at nearly the same time. Each save reads the
        newest state only once it holds the lock, so the last write is the newest: two saves
        racing in threads once left an older one in place, and the restarted process then
        claimed a task it had already handed back.
        """
        async with self._save_lock:
            actives = {
                i: a.active | self._restored.get(i, frozenset()) for i, a in enumerate(self._known)
            }
            try:
                await asyncio.to_thread(self.state.write_assignment, actives)
            except OSError as exc:
                log.warning("cannot save the assignment to %s: %s", self.state.path, exc)

    async def _notify(self, callback: Any, *args: Any) -> None:
        try:
            await callback(*args)
        except Exception:
            log.exception("task listener %s failed", getattr(callback, "__name__", callback))
