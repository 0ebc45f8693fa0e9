"""``PartitionAssignor`` for faust-streaming apps: ``faust.App(..., PartitionAssignor=
"streamassign.faust:PartitionAssignor")``.

It is both the aiokafka assignor of the worker's consumer (``name``, ``metadata``, ``assign``,
``on_assignment``) and what the rest of Faust asks of ``app.assignor``: assigned actives and
standbys (table recovery, rocksdb stores, the ``/stats`` views), ``is_active``/``is_standby`` and
``group_for_topic`` (transactions), ``key_store``/``external_key_store`` and the table and topic
metadata (``app.router`` and the ``/router`` web views). The leader's work is
``streamassign.faust.leader.assign_faust``.

Each worker keeps a small state directory ``<appdir>/streamassign`` (process id, its last
assignment), opened when its consumer first joins and closed when the app stops. After a restart
it reports the tasks it ran and the offsets its on-disk (RocksDB) tables persisted, so it gets its
partitions back. Each subscription also announces the app's changelog topics, so a leader running
another version of the app knows which topics are tables.

Through the ``streamassign://`` transport a worker also offers Faust's own assignor
(``FaustsOwnAssignor``) as its second protocol, for a rolling switch; while the group uses it,
Faust's tables and views read that assignor's assignment (``protocol_in_use``).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import hashlib
import importlib
import importlib.metadata
import json
import logging
import os
import struct
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import attrs
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from faust import transport as faust_transports
from faust.assignor import PartitionAssignor as FaustPartitionAssignor
from faust.types import TP, TransportT
from faust.types.assignor import HostToPartitionMap, PartitionAssignorT
from yarl import URL

from .. import TaskId
from ..aiokafka.rejoin import Rejoiner, member_id, membership
from ..aiokafka.wire import encode_assignment
from ..errors import ConfigError, ConfigTypeError, DamagedStateError, ErrorCode, StateDirectoryError
from ..files import loads_json, write_atomically
from ..localstate import StateDirectory
from ..protocol import (
    LATEST_OFFSET,
    LATEST_VERSION,
    AssignmentInfo,
    ProtocolError,
    SubscriptionInfo,
)
from ..repeats import Repeats
from ..streams import FAUST_PROTOCOL_NAME
from ._app import aiokafka_consumer, exactly_once, recovery_interrupted
from ._damaged import (
    Aside,
    DamagedTable,
    DamagedTables,
    NewerFormatTable,
    is_damaged_status,
    is_missing_file_status,
    is_newer_format_status,
    partition_dirs,
)
from ._eos import warn_if_exactly_once
from ._settables import warn_about_set_tables
from ._stores import disk_store, keeps_state_on_disk
from ._watch import JoinErrors, MetadataWatch, unsized
from .leader import (
    CAPACITY_TAG,
    CHANGELOGS_TAG,
    DISK_TABLES_TAG,
    GLOBAL_CHANGELOGS_TAG,
    MAX_CAPACITY,
    RECOVERED_TAG,
    assign_faust,
    check_copartition_groups,
    decode_members,
    parse_capacity,
)
from .transport import Transport

__all__ = ["CAPACITY_ENV", "PROTOCOL_NAME", "PartitionAssignor"]

log = logging.getLogger("streamassign.faust")

PROTOCOL_NAME = FAUST_PROTOCOL_NAME  # the core's: describe and explain know it by it

#: Environment variable giving this worker's capacity (weight); default: its consumer count (1).
CAPACITY_ENV = "STREAMASSIGN_CAPACITY"

_STATE_FILE = "faust-assignment.json"

#: Key under which Faust's RocksDB store keeps a partition's persisted changelog offset.
_OFFSET_KEY = b"__faust\0offset__"

#: Seconds of table directory reads at one join above which one INFO line says the join
#: waited for them: a read-only open replays any write-ahead log a kill -9 left unflushed
#: (about 3 ms per MB, up to 64 MB per directory), and a late join is otherwise silent.
_SLOW_DIRECTORY_READS_S = 1.0


@attrs.frozen
class _View:
    """Everything Faust's tables, router and web views read of the assignment, swapped in one
    assignment (the web server reads it from another thread)."""

    actives: frozenset[TP] = frozenset()
    standbys: frozenset[TP] = frozenset()
    topic_groups: Mapping[str, int] = attrs.field(factory=dict)
    tps_url: Mapping[TP, str] = attrs.field(factory=dict)
    external_tps_url: Mapping[TP, str] = attrs.field(factory=dict)
    changelog_distribution: HostToPartitionMap = attrs.field(factory=dict)
    external_topic_distribution: HostToPartitionMap = attrs.field(factory=dict)


@attrs.define
class RecoveryScope:
    """Whether this worker's recovery completed while its membership was still the group's,
    for ``RECOVERED_TAG``. Faust's ``recovery.completed`` is set once and never cleared, so a
    worker whose session expired in a stall (SIGSTOP, a long GC) and whose first recovery
    completed in the second before aiokafka noticed (``UnknownMemberId``, member id reset)
    said 1: the leader took it for a veteran and it got back only part of the tasks it had
    just restored. A completion counts from the aiokafka member id it
    happened under: a reset (a new or empty id) voids it, unless a later join under that id
    showed the membership outlived it; then it stays, as before (a veteran that expires
    restoring a cold takeover keeps the tie-break's answer). Without a member id
    to read (no consumer, another aiokafka), the tag is Faust's flag as before."""

    #: The member id of the last completion not yet outlived by a join; "" when it happened
    #: in no membership (after a reset, or at generation -1 under the id MEMBER_ID_REQUIRED
    #: gave it before the JoinGroup retry is answered).
    completed_as: str | None = None
    #: A completion's membership outlived it, or one happened without a member id to scope it.
    settled: bool = False

    def completed(self, member: tuple[str, int] | None) -> None:
        """Faust's recovery sent ``on_rebalance_complete`` while the member was ``member``
        (aiokafka's member id and generation; None: unreadable). At generation -1 the member is
        in no membership: aiokafka reset it, or MEMBER_ID_REQUIRED gave it an id (set at once,
        generation still -1) and its JoinGroup retry waits for the join phase to end; a
        completion then would be settled by that join though no membership outlived it."""
        if member is None:
            self.settled = True
        else:
            member_id, generation = member
            self.completed_as = member_id if generation >= 0 else ""

    def joined(self, member_id: str | None, flag_set: bool) -> None:
        """A join completed with ``member_id``: a completion under that id was the group's if it
        finished, Faust's ``completed`` being set (``flag_set``). Faust sends the signal before
        it awaits the tables' callbacks and a seek, then sets the flag; the assignment of this
        very join cancels a completion still in between, and without the check the join
        settled it. An earlier completion's flag stays set, so one cancelled
        after a reset's void completion still settles: that needs a hook after the flag."""
        if flag_set and member_id and member_id == self.completed_as:
            self.settled = True

    def recovered(self, flag_set: bool, member_id: str | None) -> bool:
        """The tag's value: Faust's ``completed`` (``flag_set``) scoped to ``member_id``."""
        if not flag_set:
            return False
        if self.settled or self.completed_as is None or member_id is None:
            return True  # nothing to scope it by: Faust's flag, as before
        return bool(member_id) and member_id == self.completed_as


def _warn_unless_our_transport(app: Any) -> bool:
    """One WARNING when the app's consumer does not run the ``streamassign://`` transport:
    Faust's own ``kafka://`` drops records around rebalances (Faust 0.15.3; docs/faust.md
    "Exactness"); a soak run lost 12 records with it under load, none with ours. Not
    refused: a rolling switch from Faust's assignor may run ``kafka://`` for a while.
    Whether it runs ours (an app not configured yet counts as ours: nothing is said)."""
    try:
        transport_class = _consumer_transport_class(app)
        url = app.conf.broker_consumer[0]
    except Exception:  # an app not configured yet (or a stand-in): nothing to say
        return True
    ours = issubclass(transport_class, Transport)
    if not ours:
        log.warning(
            "this worker consumes with %s (broker_consumer %s), Faust's own transport, which "
            "can drop records around rebalances (Faust 0.15.3); use "
            "broker='streamassign://host:port', and the same scheme in broker_consumer if set "
            '(docs/faust.md, "Exactness")',
            f"{transport_class.__module__}.{transport_class.__qualname__}",
            url,
        )
    return ours


def _consumer_transport_class(app: Any) -> type:
    """The class of the transport the app's consumer runs: the object's, when Faust has made
    it (or the user set ``app.transport``); else the class Faust makes it from, which is
    ``broker_consumer``'s first URL (``App._new_transport``; it falls back to ``broker``), not
    ``broker``: either can be set alone (``BROKER_CONSUMER_URL``)."""
    made = getattr(app, "_transport", None)  # read, not made: ``app.transport`` would make it
    if isinstance(made, TransportT):  # not a stand-in's attribute
        return type(made)
    found: type = faust_transports.by_url(app.conf.broker_consumer[0])
    return found


def _check_capacity(capacity: object) -> None:
    """Raises ``ConfigTypeError`` / ``ConfigError`` unless ``capacity`` (a subclass's
    ``capacity``) is None or an int from 1 to ``MAX_CAPACITY``."""
    if capacity is None:
        return
    if isinstance(capacity, bool) or not isinstance(capacity, int):
        raise ConfigTypeError(f"capacity must be an int or None, got {capacity!r}")
    if not 1 <= capacity <= MAX_CAPACITY:
        raise ConfigError(f"capacity must be from 1 to {MAX_CAPACITY}, got {capacity}")


class PartitionAssignor(AbstractPartitionAssignor, PartitionAssignorT):  # type: ignore[misc]
    """Kafka Streams-style assignment for a Faust app (see the module docstring).

    Subclass to declare co-partition groups (``copartition_groups``: only those topics are
    co-partitioned; default: Faust's rule) or a fixed ``capacity``. Both are checked when the
    app creates its assignor (``TypeError``/``ValueError``), not at the first rebalance.
    """

    #: Topics that must be co-partitioned; empty: Faust's rule (equal count, same subscribers).
    copartition_groups: ClassVar[Sequence[Sequence[str]]] = ()
    #: This worker's weight; ``None``: ``$STREAMASSIGN_CAPACITY``, else its consumer count.
    capacity: ClassVar[int | None] = None

    def __init__(self, app: Any, replicas: int = 0) -> None:
        check_copartition_groups(self.copartition_groups)
        _check_capacity(self.capacity)
        self.app = app
        self.replicas = replicas
        if not _warn_unless_our_transport(app):  # else its consumer's start says it
            warn_if_exactly_once(app)
        self.rejoiner = Rejoiner()
        #: Re-fetches metadata of subscribed topics this worker has none of (see ``_watch``).
        self.metadata_watch = MetadataWatch()
        #: Reports fatal join errors Faust never reads, so the worker joins again (``_watch``).
        self.join_errors = JoinErrors()
        self._forget_leader_logs()
        #: Which of its topics this member logged as missing: logged once (a retry comes every
        #: 1 to 30 s), the repeats at DEBUG, and their end once.
        self._member_missing = Repeats()
        #: The damaged table directories this member could not move aside (logged once per
        #: set, as every join finds them again; a set it moved is always news).
        self._damaged_kept = Repeats()
        #: The table directories written by a newer RocksDB, logged once per set as above.
        self._newer_format = Repeats()
        #: Whether this process has checked every table partition directory on disk (its
        #: first join: ``_check_unheld_tables``).
        self._unheld_checked = False
        #: Whether this worker led the round whose assignment it waits for.
        self._leading = False
        #: Changes only when this worker wants a rebalance (after a failed one): a rejoin with
        #: the same metadata does not start one (a follower gets the current generation back),
        #: and a nonce changed on every join made two workers starting together rebalance each
        #: other for minutes ("Updating metadata for member ... during CompletingRebalance").
        self._join_epoch = 1
        self._state: StateDirectory | None = None
        self._process_id: uuid.UUID | None = None
        self._restored: AssignmentInfo | None = None
        #: The previous actives the last subscription reported at 0 for want of readable
        #: table state (wiped, moved aside as damaged): named if they come back.
        self._no_local_state: frozenset[TaskId] = frozenset()
        #: The last assignment the leader sent without error: what this worker reports and
        #: saves. A failed or unreadable assignment never replaces it.
        self.info = AssignmentInfo()
        self._assigned = False
        self._view = _View()
        #: Faust's own assignor, offered second (``fallback_assignors``), and set here while
        #: the group uses it: Faust's tables and views then read its assignment.
        self._fausts: FaustsOwnAssignor | None = None
        self._fausts_in_use: FaustsOwnAssignor | None = None
        #: What this worker's app subscribes to (its last ``metadata``): the leader's own topics.
        self._own_topics: frozenset[str] | None = None
        #: Milliseconds the last leader-side ``assign`` took on this worker, if it led.
        self.last_assign_ms: float | None = None
        #: What ``RECOVERED_TAG`` says: Faust's recovery flag, scoped to the membership.
        self.recovery_scope = RecoveryScope()
        self._connect_to(app)

    def _connect_to(self, app: Any) -> None:
        """Receive ``app``'s stop and its recovery's completion, weakly: an app's signals keep
        their receivers in the class-level signal's table (mode's ``with_default_sender``
        shares it), so a strong receiver kept this assignor, and with it the app, alive for as
        long as the process once the app had stopped. The app holds this assignor, so the
        receivers fire while it lives."""
        app.on_before_shutdown.connect(self._on_app_stop, weak=True)
        if (recovery_done := getattr(app, "on_rebalance_complete", None)) is not None:
            recovery_done.connect(self._on_recovery_completed, weak=True)

    # -- aiokafka assignor ---------------------------------------------------------------------

    @property
    def name(self) -> str:
        return PROTOCOL_NAME

    @property
    def version(self) -> int:
        return LATEST_VERSION

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        """This worker's subscription; never raises (aiokafka's coordinator would die): on an
        unexpected error it joins as a member without history (logged)."""
        self._own_topics = frozenset(topics)
        self._leading = False  # a new round (JoinGroup): leading the last one ended with it
        if (consumer := self._consumer()) is not None:
            self.join_errors.joining(consumer)  # a join starts (see JoinErrors)
        try:
            data = self._subscription().encode()
        except Exception:
            log.exception("cannot describe this worker's state; joining without history")
            if self._process_id is None:
                self._process_id = uuid.uuid4()
            # Its URL still: routing, and telling workers with a copied state directory apart.
            url = self._url_or_none()
            data = SubscriptionInfo(
                self._process_id, endpoint=url, join_nonce=self._join_epoch
            ).encode()
        if log.isEnabledFor(logging.DEBUG):  # a hash per join only when someone reads it
            log.debug("joining with a subscription of %d bytes, sha1 %s", len(data), _digest(data))
        return ConsumerProtocolMemberMetadata(0, sorted(topics), data)

    def _url_or_none(self) -> str | None:
        """This worker's URL, None if the app cannot say (``metadata``'s fallback never raises)."""
        try:
            return str(self.app.conf.canonical_url)
        except Exception:  # whatever broke the subscription may break this too
            log.exception("cannot read this worker's URL; joining without one")
            return None

    def _subscription(self) -> SubscriptionInfo:
        self._open_state()
        restored = self._restored or AssignmentInfo()
        current = self.info if self._assigned else AssignmentInfo()
        previous = current.active if self._assigned else restored.active
        sums = {t: LATEST_OFFSET for t in current.active}
        held = current.standby | current.warmup | restored.active | restored.standby
        dictionary = {**restored.topics, **current.topics}
        following = current.standby | current.warmup
        unreadable: set[TaskId] = set()
        no_local_state: set[TaskId] = set()
        damaged = DamagedTables()
        started = time.perf_counter()
        try:
            for t in sorted(held - current.active):
                topics = dictionary.get(t.subtopology, {})
                offset = self._held_offset_sum(
                    t, topics, following, previous, damaged, no_local_state
                )
                if offset is _UNPARSED:  # Faust cannot open it either: no claim on it
                    unreadable.add(t)
                    sums[t] = 0
                elif offset is not None:
                    sums[t] = offset
            if not self._unheld_checked:
                self._unheld_checked = True
                warn_about_set_tables(self.app)  # Faust loses their members at restarts
                self._check_unheld_tables(held, dictionary, damaged)
        finally:  # a directory moved before an error is named all the same
            self._log_damaged(damaged)
            self._no_local_state = frozenset(no_local_state)
            _log_slow_reads(time.perf_counter() - started, damaged.directories_read)
        tags = {
            CHANGELOGS_TAG: ",".join(sorted(self._changelog_topics())),
            GLOBAL_CHANGELOGS_TAG: ",".join(sorted(self._global_changelog_topics())),
        }
        if c := self._capacity():
            tags[CAPACITY_TAG] = str(c)
        tags[RECOVERED_TAG] = "1" if self._recovery_completed() else "0"
        tags[DISK_TABLES_TAG] = "1" if self._has_disk_tables_at_all() else "0"
        return SubscriptionInfo(
            self._process_id or uuid.uuid4(),
            endpoint=str(self.app.conf.canonical_url),
            offset_sums=sums,
            previous_active=previous - unreadable,
            join_nonce=self._join_epoch,
            client_tags={k: v for k, v in tags.items() if v},
        )

    def assign(
        self, cluster: Any, member_metadata: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, bytes]:
        """Leader: decode every member, run ``assign_faust``, encode; never raises. An
        unexpected error answers ``ASSIGNMENT_ERROR`` to every member (see ``on_assignment``)."""
        started = time.perf_counter()
        self._leading = True
        sensors = self.app.sensors
        state = sensors.on_assignment_start(self)
        try:
            subscribed = {t for meta in member_metadata.values() for t in meta.subscription}
            counts = {}
            for topic in sorted(subscribed):
                if partitions := cluster.partitions_for_topic(topic):
                    counts[topic] = len(partitions)
            missing: frozenset[str] = frozenset(subscribed - counts.keys())
            self._watch_missing(missing)
            members = decode_members(
                {m: (meta.subscription, meta.user_data) for m, meta in member_metadata.items()},
                counts,
                changelog_topics=self._changelog_topics(),
                global_changelog_topics=self._global_changelog_topics(),
                copartition_groups=self.copartition_groups,
                own_topics=self._own_topics,
            )
            result = assign_faust(
                members,
                counts,
                num_standby_replicas=self.replicas,
                changelog_topics=self._changelog_topics(),
                global_changelog_topics=self._global_changelog_topics(),
                partitioner_changelog_topics=self._partitioner_changelog_topics(),
                copartition_groups=self.copartition_groups,
                own_topics=self._own_topics,
                required_topics=self._internal_topics(),
                missing_topics_level=self._missing_level(missing),
                topology_errors=self._leader_topology_errors,
                shared_ids=self._leader_shared_ids,
                lone_changelogs=self._leader_lone_changelogs,
            )
            out = {m: encode_assignment(a.partitions, a.info.encode()) for m, a in result.items()}
        except Exception as exc:
            log.exception("assignment failed; sending ASSIGNMENT_ERROR to every member")
            sensors.on_assignment_error(self, state, exc)
            failed = AssignmentInfo(error_code=ErrorCode.ASSIGNMENT_ERROR, version=1).encode()
            return {m: encode_assignment((), failed) for m in member_metadata}
        sensors.on_assignment_completed(self, state)
        self.last_assign_ms = (time.perf_counter() - started) * 1000
        return out

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        """Member: take the tasks and host maps; a bad or failed assignment never raises — the
        worker runs what Kafka assigned it, keeps its last good assignment (what it reports and
        saves) and its topic groups, and rejoins with backoff."""
        kafka = frozenset(TP(t, p) for t, ps in assignment.assignment for p in ps)
        led = self._leading
        self._end_round()
        try:
            info = AssignmentInfo.decode(assignment.user_data or b"")
        except ProtocolError as exc:
            log.error("unreadable assignment (%s); treating it as an assignment error", exc)
            info = AssignmentInfo(error_code=ErrorCode.ASSIGNMENT_ERROR)
        self._bind_rejoiner()
        self.join_errors.joined()
        self._recovery_joined()
        if self._fausts_in_use is not None:
            log.warning("the group uses %s again (every member offers it)", PROTOCOL_NAME)
            self._fausts_in_use = None
        if info.error_code == ErrorCode.NONE and (missing := _undescribed(info)):
            log.error(
                "the assignment names groups %s without their topics (an older leader?); "
                "treating it as an assignment error",
                missing,
            )
            info = attrs.evolve(info, error_code=ErrorCode.ASSIGNMENT_ERROR)
        if info.error_code == ErrorCode.NONE and not led:
            # The leader's snapshot is aiokafka's own, made from the same metadata. The counts
            # go in before the cache is cleared: an agent's write between the two would check
            # the old counts and keep that answer until the next assignment.
            self._share_partition_counts(info)
        self._reverify_table_sources()
        if info.error_code != ErrorCode.NONE:
            self._view = self._fallback_view(kafka)
            self._join_epoch += 1  # the rejoin must start a rebalance
            delay = self.rejoiner.failed()
            if info.error_code == ErrorCode.INCOMPLETE_SOURCE_TOPIC_METADATA:
                self._wait_for_topics(delay)
            else:
                log.error("the leader sent %s; rejoining in %.0f s", info.error_code.name, delay)
            return
        self.rejoiner.succeeded()
        if self._member_missing.ended():
            log.info("the topics waited for exist: partitions assigned again")
        self._view = self._build_view(info, kafka)
        self._log_restores_from_scratch(info)
        self.info = info
        self._assigned = True
        self._restored = None  # superseded: the state file now holds this assignment
        self._save()

    # -- what Faust asks of app.assignor -------------------------------------------------------
    # Each reads ``self._view`` once: a rebalance on the consumer thread swaps it whole.

    def group_for_topic(self, topic: str) -> int:
        if (fausts := self._fausts_in_use) is not None:
            return int(fausts.group_for_topic(topic))
        return self._view.topic_groups[topic]

    def assigned_actives(self) -> set[TP]:
        if (fausts := self._fausts_in_use) is not None:
            return set(fausts.assigned_actives())
        return set(self._view.actives)

    def assigned_standbys(self) -> set[TP]:
        if (fausts := self._fausts_in_use) is not None:
            return set(fausts.assigned_standbys())
        return set(self._view.standbys)

    def is_active(self, tp: TP) -> bool:
        if (fausts := self._fausts_in_use) is not None:
            return bool(fausts.is_active(tp))
        return tp in self._view.actives

    def is_standby(self, tp: TP) -> bool:
        if (fausts := self._fausts_in_use) is not None:
            return bool(fausts.is_standby(tp))
        return tp in self._view.standbys

    def key_store(self, topic: str, key: bytes) -> URL:
        """URL of the worker whose active task holds ``key`` of the table with changelog
        ``topic`` (``KeyError`` while unknown: the router answers 503)."""
        if (fausts := self._fausts_in_use) is not None:
            return URL(fausts.key_store(topic, key))
        if topic in self._global_changelog_topics():
            return URL(str(self.app.conf.canonical_url))  # every worker holds a global table
        return URL(self._view.tps_url[self.app.producer.key_partition(topic, key)])

    def external_key_store(self, topic: str, key: bytes) -> URL:
        if (fausts := self._fausts_in_use) is not None:
            return URL(fausts.external_key_store(topic, key))
        return URL(self._view.external_tps_url[self.app.producer.key_partition(topic, key)])

    def table_metadata(self, topic: str) -> HostToPartitionMap:
        if (fausts := self._fausts_in_use) is not None:
            return fausts.table_metadata(topic)
        return {
            host: {t: ps for t, ps in tps.items() if t == topic}
            for host, tps in self._view.changelog_distribution.items()
        }

    def tables_metadata(self) -> HostToPartitionMap:
        if (fausts := self._fausts_in_use) is not None:
            return fausts.tables_metadata()
        return self._view.changelog_distribution

    def external_topics_metadata(self) -> HostToPartitionMap:
        if (fausts := self._fausts_in_use) is not None:
            return fausts.external_topics_metadata()
        return self._view.external_topic_distribution

    # -- a rolling switch from and to Faust's own assignor ---------------------------------

    @property
    def protocol_in_use(self) -> str:
        """The group protocol of this worker's last assignment: ours, or Faust's own
        (``faust``) while some member of the group does not offer ours."""
        return str(self._fausts_in_use.name) if self._fausts_in_use is not None else PROTOCOL_NAME

    def fallback_assignors(self) -> tuple[Any, ...]:
        """What this worker offers after ours (``streamassign://`` transport): the assignor
        Faust itself would use (its own, or aiokafka's round robin for an app without tables),
        so a worker can join a group still on it and the group moves to ours once every member
        offers ours (Kafka picks the first protocol all members support)."""
        if self.replicas > 0 or self.app.tables.changelog_topics:
            if self._fausts is None:
                self._fausts = FaustsOwnAssignor(self)
            return (self._fausts,)
        return (RoundRobinPartitionAssignor,)

    def _on_fausts_assignment(self) -> None:
        self._end_round()
        self._reverify_table_sources()
        self.join_errors.joined()
        self._recovery_joined()
        if self._fausts_in_use is None:
            log.warning(
                "the group uses Faust's own assignor: some member does not offer %s yet",
                PROTOCOL_NAME,
            )
        self._fausts_in_use = self._fausts

    # -- internals -----------------------------------------------------------------------------

    def _end_round(self) -> None:
        """A round's assignment arrived: if another worker led it, forget what this one logged
        as leader, so that leading again logs a missing topic or a topology error as news (and
        does not announce, long after, the end of an incident another leader saw end)."""
        if not self._leading:
            self._forget_leader_logs()
        self._leading = False

    def _forget_leader_logs(self) -> None:
        """What this worker logged as leader, each logged once (a retry comes every 1 to 30 s),
        the repeats at DEBUG, and their end once: which topics it logged as missing, the
        topology error, the process ids announced with several URLs (copied state
        directories), and the table changelogs left without a topic of their partition count
        (partitions added to a source topic?). Forgotten after a round another worker led
        (``_end_round``): they would tell a later incident from one long ago."""
        self._leader_missing = Repeats()
        self._leader_topology_errors = Repeats()
        self._leader_shared_ids = Repeats()
        self._leader_lone_changelogs = Repeats()

    def _reverify_table_sources(self) -> None:
        """Make each table check its source topic's partition count against its changelog's
        again at its next write. Faust checks it once per process and caches the answer
        (``Table._verified_source_topics_for_partitions``): after partitions were added to a
        source topic, a running worker never checked again, and an assignment that parts a
        source partition from its table partition let it write values it built from an empty
        table (or write to a changelog partition that does not exist, which crashes Faust's
        producer). Checked again, the write raises Faust's own ``PartitionsMismatch`` naming
        both counts, before the store or the changelog is touched. Each assignment, on
        either protocol: the metadata that made it is the one the check reads. Another Faust
        version without the cache is left alone (getattr)."""
        for table in self._tables():
            verified = getattr(table, "_verified_source_topics_for_partitions", None)
            if isinstance(verified, set):
                verified.clear()

    def _share_partition_counts(self, info: AssignmentInfo) -> None:
        """Put the partition counts this assignment was made from (its topic dictionary) where
        Faust's table check reads them: Faust's driver answers ``topic_partitions`` from the
        aiokafka coordinator's metadata snapshot, which aiokafka keeps only on the group
        leader (a follower's is empty, or stale from a round it led), so the check passed on
        every follower. Live, after a source grew 6 -> 8, only the leader's agent raised
        ``PartitionsMismatch``; two followers wrote to changelog partition 6 (which does not
        exist) and exited. aiokafka compares the snapshot with fresh metadata only in a
        round its worker leads, and makes it anew in that round (a difference it meets first
        costs one more rebalance at most); this runs on aiokafka's own thread. Never raises:
        an aiokafka without the snapshot is left alone."""
        coordinator = getattr(self._consumer(), "_coordinator", None)
        snapshot = getattr(coordinator, "_metadata_snapshot", None)
        if isinstance(snapshot, dict):
            for topics in info.topics.values():
                snapshot.update(topics)

    def _fallback_view(self, kafka: frozenset[TP]) -> _View:
        """After a failed assignment: Kafka's partitions as actives, the last good topic groups
        and host maps (better stale routes than none; the rejoin replaces them)."""
        return attrs.evolve(self._view, actives=kafka, standbys=frozenset())

    def _build_view(self, info: AssignmentInfo, kafka: frozenset[TP]) -> _View:
        """Faust's views (actives, standbys, groups, host maps) of a good assignment."""
        globals_ = self._global_changelog_topics()
        from_tasks = frozenset(
            TP(topic, t.partition)
            for t in info.active
            for topic, count in info.topics.get(t.subtopology, {}).items()
            if t.partition < count
        )
        if not from_tasks <= kafka:
            log.warning(
                "tasks name partitions Kafka did not assign (%s); keeping Kafka's",
                sorted(from_tasks - kafka)[:5],
            )
            from_tasks &= kafka
        full_copy = {tp for tp in kafka if tp.topic in globals_}
        standbys = set(kafka - from_tasks)
        for table in self._tables():
            if table.is_global and (  # attributes of newer faust-streaming releases
                getattr(table, "synchronize_all_active_partitions", False)
                or getattr(table, "use_partitioner", False)
            ):
                topic = table.changelog_topic.get_topic_name()
                standbys.update(tp for tp in kafka if tp.topic == topic)
        changelogs = self._changelog_topics()
        tables: dict[str, dict[str, set[int]]] = {}
        external: dict[str, dict[str, set[int]]] = {}
        tps_url: dict[TP, str] = {}
        external_tps_url: dict[TP, str] = {}
        for key, tps in sorted(info.partitions_by_host().items()):
            url = key.split("#", 1)[0]
            tables.setdefault(url, {})
            external.setdefault(url, {})
            for topic, p in tps:
                kind, urls = (
                    (tables, tps_url) if topic in changelogs else (external, external_tps_url)
                )
                kind[url].setdefault(topic, set()).add(p)
                urls[TP(topic, p)] = url
        return _View(
            actives=from_tasks | full_copy,
            standbys=frozenset(standbys),
            topic_groups={
                topic: sub for sub, topics in sorted(info.topics.items()) for topic in topics
            },
            tps_url=tps_url,
            external_tps_url=external_tps_url,
            changelog_distribution=_lists(tables),
            external_topic_distribution=_lists(external),
        )

    def _tables(self) -> list[Any]:
        return list(self.app.tables.values())

    def _global_changelog_topics(self) -> frozenset[str]:
        return frozenset(t.changelog_topic.get_topic_name() for t in self._tables() if t.is_global)

    def _partitioner_changelog_topics(self) -> frozenset[str]:
        """Changelogs of this app's tables whose keys the producer's partitioner places
        (``use_partitioner``, an attribute of newer faust-streaming releases): their partition
        count is their own, and Faust never checks it against a source's."""
        return frozenset(
            t.changelog_topic.get_topic_name()
            for t in self._tables()
            if getattr(t, "use_partitioner", False)
        )

    def _changelog_topics(self) -> frozenset[str]:
        """Changelogs of this app's tables (global ones included)."""
        return frozenset(self.app.tables.changelog_topics)

    def _capacity(self) -> int | None:
        if self.capacity is not None:
            return self.capacity
        raw = os.environ.get(CAPACITY_ENV)
        if not raw:
            return None
        value = parse_capacity(raw)
        if value is None:
            log.warning(
                "ignoring %s=%r: not a whole number from 1 to %d", CAPACITY_ENV, raw, MAX_CAPACITY
            )
        return value

    def state_path(self) -> Path | None:
        """This worker's open ``<appdir>/streamassign`` directory (None before its first join,
        after the app stopped, or when it could not be opened): where the consumer keeps its
        proven changelog offsets (``_proven``)."""
        return None if self._state is None else self._state.path

    def _open_state(self) -> None:
        """Open ``<appdir>/streamassign`` once; without it (locked, unwritable, an unreadable
        ``process.id``) the worker runs this time with a temporary process id, not sticky
        (logged), the directory untouched: the next start after a fix uses its own id."""
        if self._process_id is not None:
            return
        path = Path(self.app.conf.appdir) / "streamassign"
        try:
            self._state = StateDirectory(path)
        except (StateDirectoryError, OSError) as exc:
            log.warning(
                "cannot use the state directory (%s); running this time with a temporary process "
                "id, so this run is not sticky (the partitions and state this worker had are not "
                "claimed back); the directory is left as it is",
                exc,
            )
            self._process_id = uuid.uuid4()
            return
        self._process_id = self._state.process_id
        self._restored = _read_state(self._state.path / _STATE_FILE)

    def _on_app_stop(self, sender: Any = None, **kwargs: Any) -> None:
        """Release the state directory's lock when the app stops (``on_before_shutdown``)."""
        self.metadata_watch.cancel()
        self.join_errors.cancel()
        self.rejoiner.cancel()
        state, self._state = self._state, None
        if state is not None:
            state.close()

    def _save(self) -> None:
        if self._state is None:
            return
        data = {
            "active": sorted(str(t) for t in self.info.active),
            "standby": sorted(str(t) for t in self.info.standby | self.info.warmup),
            "topics": {str(s): dict(ts) for s, ts in sorted(self.info.topics.items())},
        }
        file = self._state.path / _STATE_FILE
        try:  # atomic: every consumer thread of a worker may save at once
            write_atomically(file, json.dumps(data, sort_keys=True).encode())
        except OSError as exc:
            log.warning("cannot save the assignment to %s: %s", file, exc)

    def _held_offset_sum(
        self,
        task: TaskId,
        topics: Mapping[str, int],
        following: frozenset[TaskId],
        previous: frozenset[TaskId],
        damaged: DamagedTables,
        no_local_state: set[TaskId],
    ) -> int | Literal[_Unparsed.VALUE] | None:
        """The offset sum to report of ``task``, held but not run (``following``: a standby or
        warmup now; ``previous``: declared a previous active); ``None``: no state to report;
        ``_UNPARSED``: a declared previous active whose offset Faust cannot read either.

        A running standby's applied offsets (Faust's recovery starts them at the persisted
        ones) are fresher than the disk and cost no database open on this thread. A standby
        with nothing applied yet, and a declared previous active of a RocksDB table with
        nothing readable on disk (a wiped or unreadable table directory), are state at 0:
        without a sum the leader would take that task for stateless and hand it back whatever
        its lag, cold, though a caught-up holder exists; at 0 it comes back only
        if the whole changelog is within the acceptable recovery lag, as Kafka Streams counts
        a task a client reports no offset of (its lag is the end offset). In-memory tables
        and stateless tasks still report nothing (the leader hands those back). A table
        directory Faust would crash on (``_damaged``) is moved aside into ``damaged`` and
        counts as wiped; one that stays (this worker may have it open, or the rename failed)
        makes a declared previous active ``_UNPARSED``: reported at 0 (its lag is no reason to
        hand it back) and not claimed (a claim would bring it back whatever its lag). A
        previous active reported at 0 with nothing on disk (no directory, no offset key, moved
        aside as damaged) is added to ``no_local_state`` (``_log_restores_from_scratch`` names
        it if it comes back); not one only unreadable (``_UNREAD``): Faust opens that itself,
        and finds its offset or fails on it, which the line would misstate."""
        offset = self._standby_offset_sum(task, topics) if task in following else None
        if offset is None:
            on_disk = self._disk_offset_sum(task, topics, damaged, in_use=task in following)
        else:
            on_disk = offset
        if on_disk is _UNPARSED:
            if task in following:
                # A standby now that has applied nothing yet: state at 0, as below.
                return 0
            if task in previous:
                # Faust's own int() would crash the worker on it: the caller claims it not.
                return _UNPARSED
            # Held from the saved assignment, not claimed: state it cannot measure, no sum.
            return None
        if on_disk is not None and on_disk is not _UNREAD:
            return on_disk
        if task in following:
            # A standby now, nothing applied nor read on disk: 0, else the leader sees no state.
            return 0
        if task in previous and self._has_disk_tables(task, topics):
            # A RocksDB table wiped or unreadable: state at 0, not stateless (see above).
            if on_disk is None:  # nothing there: Faust restores it from the start
                no_local_state.add(task)
            return 0
        return None

    def _task_tables(self, task: TaskId, topics: Mapping[str, int]) -> list[Any]:
        """The (not global) tables with a changelog partition of ``task`` (``topics``: its
        group's topics and partition counts)."""
        return [
            table
            for table in self._tables()
            if not table.is_global
            and task.partition < topics.get(table.changelog_topic.get_topic_name(), 0)
        ]

    def _has_disk_tables_at_all(self) -> bool:
        """Whether a (not global) table of this app keeps its state on disk (RocksDB)."""
        return any(keeps_state_on_disk(disk_store(t)) for t in self._tables() if not t.is_global)

    def _has_disk_tables(self, task: TaskId, topics: Mapping[str, int]) -> bool:
        """Whether ``task`` has a table whose state survives a restart (RocksDB)."""
        return any(keeps_state_on_disk(disk_store(t)) for t in self._task_tables(task, topics))

    def _disk_offset_sum(
        self, task: TaskId, topics: Mapping[str, int], damaged: DamagedTables, in_use: bool
    ) -> int | Literal[_Unparsed.VALUE, _Unread.VALUE] | None:
        """Sum of the offsets this worker's on-disk (RocksDB) tables persisted for ``task``;
        ``None`` when it has none (in-memory tables keep nothing across a restart). A damaged
        table directory is moved aside (then it holds nothing) unless this worker may have
        it open (``in_use``: ``task`` is assigned to it now); ``_UNPARSED`` when one stays.
        One another process has open, or a newer RocksDB wrote, is no damage: nothing read;
        ``_UNREAD`` when no offset was read and such a directory (or one the disk or a lock
        kept from being read) may hold one."""
        found = []
        unparsed = unread = False
        for table in self._task_tables(task, topics):
            store = disk_store(table)
            if keeps_state_on_disk(store):
                damaged.directories_read += 1
            offset = _persisted_offset(store, task.partition)
            if isinstance(offset, DamagedTable):
                open_here = in_use or self._may_be_open(table, task.partition)
                reread = functools.partial(_still_damaged, store, task.partition)
                aside = damaged.move_aside(offset, open_here, reread)
                unparsed |= aside is Aside.KEPT
                unread |= aside is Aside.LIVE  # whole: a read raced another process's writes
            elif isinstance(offset, NewerFormatTable):  # not damage: nothing read
                damaged.newer.append(offset)
                unread = True
            elif offset is _UNREAD:
                unread = True
            elif offset is not None:
                found.append(offset)
        if unparsed:
            return _UNPARSED
        offset_sum = applied_offset_sum(found)
        return _UNREAD if offset_sum is None and unread else offset_sum

    def _check_unheld_tables(
        self,
        held: frozenset[TaskId],
        dictionary: Mapping[int, Mapping[str, int]],
        damaged: DamagedTables,
    ) -> None:
        """Move aside, as ``_disk_offset_sum`` does, every damaged table partition directory
        on disk that the report does not read (it reads those of the tasks in ``held``,
        with ``dictionary``: topic group -> its topics' partition counts): one of a partition
        this worker had before its last assignment, or a global table's. Assigned, Faust
        crashed on it,
        and each start moved only what the crashed one had been assigned (live: 3 crashes
        in a row; a global table's, in no report, at every start). Healthy ones are left
        alone and, unheld, not reported.

        Once per process, at its first join: Faust has opened nothing yet (one it may have
        open, ``_may_be_open``, is skipped all the same), and one damaged later is found by
        the next start, as a held one is. A read costs what a held one's does (2 to 5 ms
        flushed, 256 in 0.5 to 1.1 s on a loaded 2-core machine; after a kill -9 it replays
        the unflushed write-ahead log, about 3 ms per MB: ``_log_slow_reads``), and each
        directory on disk is read once either way, so a start costs no more than one that
        last held them all; unbounded.
        Not at each assignment, before Faust opens what it got: that would put the reads on
        every rebalance's path, on the consumer thread while Faust's main thread still has
        revoked databases open (closed when collected)."""
        reported_paths = {
            Path(disk_store(table).partition_path(task.partition))
            for task in held
            for table in self._task_tables(task, dictionary.get(task.subtopology, {}))
            if keeps_state_on_disk(disk_store(table))
        }
        for table in self._tables():
            if not keeps_state_on_disk(disk_store(table)):
                continue
            try:
                self._check_table_dirs(table, reported_paths, damaged)
            except Exception:  # an extra check: the join keeps its history whatever fails
                log.exception(
                    "cannot check the partition directories of table %s for damage; those "
                    "not in the last assignment are not checked at this start (Faust crashes "
                    "if assigned a damaged one)",
                    getattr(table, "name", table),
                )

    def _check_table_dirs(
        self, table: Any, reported_paths: set[Path], damaged: DamagedTables
    ) -> None:
        """``_check_unheld_tables`` of one table's directories, but those the report reads."""
        store = disk_store(table)
        for partition, path in partition_dirs(store.partition_path):
            if path in reported_paths or self._may_be_open(table, partition):
                continue
            damaged.directories_read += 1
            offset = _persisted_offset(store, partition)
            if isinstance(offset, DamagedTable):
                reread = functools.partial(_still_damaged, store, partition)
                damaged.move_aside(offset, False, reread)
            elif isinstance(offset, NewerFormatTable):
                damaged.newer.append(offset)

    def _may_be_open(self, table: Any, partition: int) -> bool:
        """Whether Faust may hold ``table``'s database of ``partition`` open in this process:
        its store has a handle to it, or the partition is in what Faust runs now (after a
        failed assignment, what Kafka assigned). Moved, it would lose what Faust writes.

        The view is what protects: Faust adds a handle to ``_dbs`` only once its open returns,
        and it opens only partitions in the view (set on this thread before Faust's callbacks
        run). ``lock_holder`` then sees a lock Faust took in this process, on Linux."""
        if partition in getattr(disk_store(table), "_dbs", {}):
            return True
        view = self._view
        return TP(table.changelog_topic.get_topic_name(), partition) in view.actives | view.standbys

    def _log_restores_from_scratch(self, info: AssignmentInfo) -> None:
        """One INFO line when this worker is given back previous actives it has no table
        state of: without it, an operator sees a restarted worker restore its own partitions
        from the start of their changelogs with nothing saying why."""
        cold = sorted(self._no_local_state & info.active)
        # Tidiness only: each metadata() recomputes it, so the line cannot repeat either way.
        self._no_local_state = frozenset()
        if cold:
            # Not "unflushed": a RocksDB write survives a kill -9 in its write-ahead log, so a
            # directory without an offset is one Faust wrote none to (it writes one when its
            # recovery applies changelog records or a changelog write is committed).
            log.info(
                "%d of the partitions assigned back to this worker have no local table state "
                "(no changelog offset recorded in their table directories: %s): restoring "
                "them from the start of their changelogs (%s)",
                len(cold),
                self._why_no_offset(),
                ", ".join(str(t) for t in cold),
            )

    def _why_no_offset(self) -> str:
        """Why a table directory holds no changelog offset. Under exactly_once Faust records
        an active's offset only when a recovery applies changelog records (its commit looks
        the pending offsets up by source partition), so a directory only this worker's actives
        wrote since it was made has none either: said beside the general reasons, which stay
        possible (a wipe is not hidden)."""
        general = (
            "wiped or ephemeral, moved aside as damaged, or none written before the worker stopped"
        )
        try:
            transactional = exactly_once(self.app)
        except Exception:  # an app not configured yet (or a stand-in): the general reasons
            transactional = False
        if transactional:
            return (
                f"{general}; under exactly_once also one no recovery applied records to since "
                "it was made, as Faust records an active's offset only through a recovery"
            )
        return general

    def _log_damaged(self, damaged: DamagedTables) -> None:
        """One line per join for every damaged table directory found: a WARNING when it moved
        some, or when those it could not move are news; their repeats at DEBUG. Likewise one
        for those a newer RocksDB wrote; those another process has open at DEBUG."""
        kept_news = self._damaged_kept.changed(damaged.kept_paths() or None)
        newer_news = self._newer_format.changed(damaged.newer_paths() or None)
        for found, holder in damaged.live:
            log.debug(
                "%s read as damaged (%s) is open in %s: not moved", found.path, found.why, holder
            )
        if (line := damaged.summary()) is not None:
            news = bool(damaged.moved) or (kept_news and bool(damaged.kept_paths()))
            log.log(logging.WARNING if news else logging.DEBUG, line)
        if (line := damaged.newer_summary()) is not None:
            log.log(logging.WARNING if newer_news else logging.DEBUG, line)

    def _recovery_completed(self) -> bool:
        """Whether Faust's recovery has completed (actives restored) since this worker started
        (its ``completed`` event is set then, and never cleared), in a membership the group
        still had then (``RecoveryScope``)."""
        return self.recovery_scope.recovered(self._recovery_flag_set(), self._member_id())

    def _recovery_flag_set(self) -> bool:
        """Faust's ``recovery.completed``: set once its recovery has first completed."""
        completed = getattr(getattr(self.app.tables, "recovery", None), "completed", None)
        return completed is not None and bool(completed.is_set())

    def _on_recovery_completed(self, sender: Any = None, **kwargs: Any) -> None:
        """Faust's ``on_rebalance_complete``, sent (on the main thread) just before its
        recovery sets ``completed``: note the membership it completes in, unless the restore
        was interrupted (``recovery_interrupted``: a worker whose earlier completion a reset
        voided would count it in its new membership, with the restore unfinished). Never
        raises: an error would go through Faust's ``Signal.send`` and stop its recovery."""
        try:
            if recovery_interrupted(self.app):
                log.debug("Faust's recovery announced the completion of an interrupted restore")
                return
            member = membership(self._consumer())
        except Exception:
            log.exception(
                "cannot read this worker's group membership as its recovery completes; its "
                "recovered tag is Faust's flag from now on"
            )
            member = None
        self.recovery_scope.completed(member)

    def _recovery_joined(self) -> None:
        """A join completed (under either protocol): the scope's ``joined``."""
        self.recovery_scope.joined(self._member_id(), self._recovery_flag_set())

    def _member_id(self) -> str | None:
        """The aiokafka member id of this worker ("" after a reset, until it joins again);
        None if there is no consumer, or its coordinator's membership cannot be read."""
        return member_id(self._consumer())

    def _standby_offset_sum(self, task: TaskId, topics: Mapping[str, int]) -> int | None:
        """Sum of the changelog offsets this running worker's standby replica of ``task`` has
        applied, as Faust's recovery tracks them; ``None`` when it tracks none of them yet.

        Only the task's own tables' changelogs, as on disk (``_task_tables``): a global
        table's changelog with the group's partition count is in the task's group, and with
        ``synchronize_all_active_partitions`` Faust tracks it as a standby; counted, a
        caught-up restarted worker's disk sum would look behind by the global's offset and
        lose its hand-back."""
        offsets = getattr(getattr(self.app.tables, "recovery", None), "standby_offsets", {})
        own = self._changelog_topics() - self._global_changelog_topics()
        return standby_offset_sum(
            offsets, task.partition, {t: n for t, n in topics.items() if t in own}
        )

    def _bind_rejoiner(self) -> None:
        if (consumer := self._consumer()) is not None:
            self.rejoiner.bind(consumer)

    def _consumer(self) -> Any:
        """The aiokafka consumer of this worker (on Faust's consumer thread), if started."""
        return aiokafka_consumer(self.app)

    def _internal_topics(self) -> frozenset[str]:
        """Topics this app creates itself (table changelogs, repartition topics, the leader
        topic): no group can be assigned right without them."""
        topics = set(self._changelog_topics())
        for channel in self.app.topics:  # Faust's conductor: every channel the app consumes
            if getattr(channel, "internal", False):
                topics.update(getattr(channel, "topics", ()))
        return frozenset(topics)

    def _watch_missing(self, topics: frozenset[str]) -> None:
        """Leader: keep re-fetching metadata of subscribed topics it cannot size; aiokafka
        rejoins by itself once a refresh shows them (their partition count changes)."""
        if (consumer := self._consumer()) is not None:
            self.metadata_watch.watch(consumer, topics)

    def _missing_level(self, missing: frozenset[str]) -> int:
        """Leader: the level to log subscribed topics without metadata at: WARNING for a set
        not logged yet, DEBUG for the same set again; one INFO line once none is missing."""
        if missing:
            return logging.WARNING if self._leader_missing.changed(missing) else logging.DEBUG
        if self._leader_missing.ended():
            log.info("every subscribed topic has metadata now")
        return logging.WARNING

    def _wait_for_topics(self, delay: float) -> None:
        """Member told the leader cannot size every topic: say which of its own topics it has
        no metadata for (once per set; repeats at DEBUG), and re-fetch them (it may lead the
        next round)."""
        consumer = self._consumer()
        missing = unsized(consumer, self._own_topics or ()) if consumer is not None else set()
        level = (
            logging.WARNING if self._member_missing.changed(frozenset(missing)) else logging.DEBUG
        )
        if missing:
            self.metadata_watch.watch(consumer, missing)
            log.log(
                level,
                "waiting for topics %s to exist (no metadata yet); nothing assigned meanwhile, "
                "rejoining in %.0f s or when they appear (repeats logged at DEBUG)",
                sorted(missing),
                delay,
            )
        else:
            log.log(
                level,
                "waiting for the group leader to see every subscribed topic (this worker sees "
                "them all); nothing assigned meanwhile, rejoining in %.0f s (repeats logged at "
                "DEBUG)",
                delay,
            )


class FaustsOwnAssignor(FaustPartitionAssignor):
    """Faust's own assignor (protocol ``faust``) as the second protocol a worker offers: it
    assigns and serves exactly as in Faust, and tells ``owner`` when the group uses it."""

    def __init__(self, owner: PartitionAssignor) -> None:
        super().__init__(owner.app, owner.replicas)
        self._owner = owner

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        super().on_assignment(assignment)
        self._owner._on_fausts_assignment()


def _digest(data: bytes) -> str:
    """A short fingerprint of user data for the logs (what changed between two joins)."""
    return hashlib.sha1(data).hexdigest()[:10]


def applied_offset_sum(offsets: Iterable[int]) -> int | None:
    """The offset sum a member reports of a task from its changelog partitions' offsets
    (``None``: none known). Each offset below 0 counts as 0: Faust tracks the log start
    offset - 1 for a partition it has applied nothing of (unread, or empty): ``-1`` where the
    log starts at 0 (above 0 where retention moved the start; still a right lag, but no
    sign of progress). Summed as is, a fresh standby of a task with two tables would report
    ``-1 + -1 = -2``, which is ``LATEST_OFFSET``: the leader would read it as running the
    task and hand it that task cold, or take it from its caught-up owner.
    So only a running active is ever reported below 0."""
    known = [max(int(offset), 0) for offset in offsets]
    return sum(known) if known else None


def standby_offset_sum(
    offsets: Mapping[TP, int | None], partition: int, topics: Mapping[str, int]
) -> int | None:
    """The offset sum a member reports of the standby of task ``partition`` of the group of
    ``topics`` (topic -> partition count) from Faust's ``recovery.standby_offsets``
    (changelog partition -> last offset applied, the log start offset - 1 for none: ``-1``
    for a log that starts at 0; ``None`` before recovery read it; ``None``: it tracks none of
    them yet)."""
    return applied_offset_sum(
        offset
        for topic, count in topics.items()
        if partition < count and (offset := offsets.get(TP(topic, partition))) is not None
    )


def _undescribed(info: AssignmentInfo) -> list[int]:
    """Groups of the member's tasks missing from the topic dictionary (it cannot map them)."""
    return sorted({t.subtopology for t in info.active | info.standby} - set(info.topics))


def _log_slow_reads(seconds: float, directories: int) -> None:
    """One INFO line when reading table directories held this join up (see
    ``_SLOW_DIRECTORY_READS_S``): the only trace of a late join otherwise is mode's "woke up
    too late" line of the blocked consumer thread."""
    if seconds > _SLOW_DIRECTORY_READS_S:
        log.info(
            "reading %d table partition director%s for this join took %.1f s (RocksDB "
            "replays the write-ahead log a kill -9 left unflushed, about 3 ms per MB): the "
            "join waited for it",
            directories,
            "y" if directories == 1 else "ies",
            seconds,
        )


class _Unparsed(enum.Enum):
    """A task with a damaged table directory this worker could not move aside: state it
    holds but cannot measure, and that Faust crashes on."""

    VALUE = enum.auto()


#: What ``_held_offset_sum`` answers of a task with a damaged directory left in place.
_UNPARSED: Literal[_Unparsed.VALUE] = _Unparsed.VALUE


class _Unread(enum.Enum):
    """A table partition directory on disk whose offset could not be read: a lock or the disk
    (``NOT_DAMAGE_STATUSES``: permissions, I/O errors), a newer RocksDB's files, or a database
    another process has open. Unlike one with nothing in it, Faust does not restore it from the
    start: it opens it and finds its offset, or fails on it (logged there)."""

    VALUE = enum.auto()


#: What ``_persisted_offset`` and ``_disk_offset_sum`` answer of such a directory.
_UNREAD: Literal[_Unread.VALUE] = _Unread.VALUE

#: Bytes RocksDB's TTL database (Faust's ``options={"ttl": ...}``, rocksdict's
#: ``AccessType.with_ttl``) appends to every value: the write time, a 32-bit integer. A
#: read-only handle (rocksdict has no read-only TTL open) returns them with the value.
_TTL_SUFFIX = 4

#: The earliest write time RocksDB's TTL database accepts in a value's suffix (its
#: ``kMinTimestamp``, 2013-05-10); a smaller one it reads as corruption.
_TTL_MIN_TIMESTAMP = 1368146402


def _still_damaged(store: Any, partition: int) -> bool:
    """Whether a second read of ``store``'s ``partition`` still finds it damaged."""
    return isinstance(_persisted_offset(store, partition), DamagedTable)


def _persisted_offset(
    store: Any, partition: int
) -> int | DamagedTable | NewerFormatTable | Literal[_Unread.VALUE] | None:
    """The changelog offset Faust's RocksDB ``store`` persisted for ``partition``, read through
    a private read-only handle that is closed right away.

    Never through the store's own ``persisted_offset``: that opens the database into the
    store's handle cache from this (the consumer's) thread, where the main thread does not
    expect it, and holds RocksDB's lock on partitions this worker may never get back. ``None``
    for other stores, a partition with nothing on disk or no offset key; ``_UNREAD`` for a
    database that cannot be read for a reason other than its files (logged at DEBUG); a
    ``DamagedTable`` for one Faust crashes
    on: RocksDB reports its files damaged, or it holds a value under the offset key that is
    no offset (Faust's own ``int()`` fails on it); a ``NewerFormatTable`` for one a newer
    RocksDB wrote.
    """
    if not keeps_state_on_disk(store):
        return None  # nothing survives a restart
    path = Path(store.partition_path(partition))
    try:  # in the try: ``exists`` raises on no permission to the table directory
        if not path.exists():
            return None
        raw = _read_settled(store, path)
    except Exception as exc:  # a lock or the disk: the operator's, no state to report
        why = str(exc).splitlines()[0][:200] if str(exc) else repr(exc)
        if is_newer_format_status(exc):
            return NewerFormatTable(path, why, _rocksdb_library(store))
        if is_damaged_status(exc, path):
            return DamagedTable(path, why)
        log.debug("cannot read the persisted offset in %s: %s", path, exc)
        return _UNREAD
    if raw is None:
        return None
    options = store.rocksdb_options
    # Faust opens a store with ``ttl`` as a TTL database only through rocksdict; with
    # python-rocksdb it ignores the option, and the values carry no suffix.
    ttl = getattr(options, "ttl", None) is not None and getattr(options, "use_rocksdict", True)
    value = _strip_ttl(raw) if ttl else raw
    with contextlib.suppress(ValueError):  # not a number: as a TTL value without its time
        if value is not None:
            return int(value)
    return DamagedTable(path, f"no offset under the offset key: {raw[:32]!r}")


def _strip_ttl(raw: bytes) -> bytes | None:
    """``raw`` without the write time RocksDB's TTL database appends, checked as RocksDB
    checks it (a little-endian 32-bit time, at least ``_TTL_MIN_TIMESTAMP``); None where that
    is no time (a value written before the table had ``ttl``: stripped blindly, ``b"50001"``
    would read as 5), as RocksDB reports corruption."""
    if len(raw) <= _TTL_SUFFIX:
        return None
    (written,) = struct.unpack("<i", raw[-_TTL_SUFFIX:])
    if written < _TTL_MIN_TIMESTAMP:
        return None
    return raw[:-_TTL_SUFFIX]


def _read_settled(store: Any, path: Path) -> bytes | None:
    """``_read_raw_offset``, again once when a file it needs is gone: a read-only open takes
    no lock, so it can read a database another process has open and race its compaction (an
    SST listed in the MANIFEST it read, deleted before it opened it); the second read finds
    the new MANIFEST. Damage stays: a file really missing is missing twice."""
    try:
        return _read_raw_offset(store, path)
    except Exception as exc:
        if not is_missing_file_status(exc):
            raise
    return _read_raw_offset(store, path)


def _rocksdb_library(store: Any) -> str:
    """The name and version of the RocksDB binding ``store`` reads with, for a log line."""
    if getattr(store.rocksdb_options, "use_rocksdict", True):
        names = ["rocksdict"]
    else:  # python-rocksdb, under the names of its forks
        names = ["faust-streaming-rocksdb", "python-rocksdb", "rocksdb"]
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return f"{name} {importlib.metadata.version(name)}"
    return names[0]


def _read_raw_offset(store: Any, path: Path) -> bytes | None:
    """The raw value under ``store``'s offset key in the database at ``path`` (``None``: no
    such key), through a private read-only handle; raises what the driver raises."""
    key = getattr(store, "offset_key", _OFFSET_KEY)
    if getattr(store.rocksdb_options, "use_rocksdict", True):
        rocksdict = importlib.import_module("rocksdict")
        db = rocksdict.Rdict(
            str(path),
            options=rocksdict.Options(raw_mode=True),
            access_type=rocksdict.AccessType.read_only(),
        )
        try:
            raw = db.get(key)
        finally:
            db.close()
    else:  # python-rocksdb (older faust-streaming); closed when collected
        rocksdb = importlib.import_module("rocksdb")
        raw = rocksdb.DB(str(path), rocksdb.Options(), read_only=True).get(key)
    return None if raw is None else bytes(raw)


def _lists(hosts: Mapping[str, Mapping[str, set[int]]]) -> HostToPartitionMap:
    return {
        url: {topic: sorted(ps) for topic, ps in sorted(tps.items())}
        for url, tps in sorted(hosts.items())
    }


def _read_state(file: Path) -> AssignmentInfo | None:
    """The assignment saved before a restart; ``None`` when missing or unreadable (any
    ``OSError``: a directory in its place, no permission — logged, never raised)."""
    try:
        data = loads_json(file.read_text(), DamagedStateError, "the JSON")
        return AssignmentInfo(
            active=frozenset(TaskId.parse(t) for t in data["active"]),
            standby=frozenset(TaskId.parse(t) for t in data["standby"]),
            topics={int(s): {t: int(n) for t, n in ts.items()} for s, ts in data["topics"].items()},
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("ignoring unreadable %s: %s", file, exc)
        return None
