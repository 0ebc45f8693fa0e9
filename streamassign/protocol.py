"""Wire formats of the streams protocol: subscription and assignment user data (DESIGN §4).

Both start with ``[int32 version][int32 latest_supported_version]`` (big-endian), so any leader
can read at least that much from any member. The rest is compact: unsigned LEB128 varints for
every count and number, strings as varint length + UTF-8, task lists and host maps as
per-subtopology partition runs over a dictionary of topics sent once per assignment. A later
version only appends fields to the one before, so a leader that knows version ``n`` reads the
version-``n`` prefix of a newer member's data, and members one version ahead of the leader keep
working; the leader answers at the highest version every member supports (``common_version``)
and members up- or downgrade to it.

Version 1 — subscription: process id (16-byte UUID), endpoint (``host:port`` or empty), task
offset sums (``LATEST_OFFSET`` for a running active, else the sum of checkpointed changelog
offsets), the consumer's own previous active tasks (kept across a restart in the state
directory: thread stickiness, and which tasks a restarted process ran), a join nonce (changes on
every join, so a rejoin with otherwise identical metadata still rebalances), an error code.
Assignment: error code, next rebalance (``NEVER``, ``NOW`` or a wall-clock time in ms), the
member's active and standby tasks, the topic dictionary and host maps (endpoint -> tasks, for
actives and for standbys); the dictionary is sent whenever it is not empty, also without host
maps (a section without hosts).

Version 2 appends — subscription: rack, client tags. Assignment: warmup tasks.

Version 3 appends — subscription: per subtopology id of the member's topology, its source
topics as indices into the member's sorted subscribed topics (which the JoinGroup metadata
carries by name: ``streamassign.versions.subtopology_topic_indices``), so a leader gives the
tasks of one of its ids only to processes whose task of that id reads every partition the
leader gives for it (a rolling deploy that changes the topology). Assignment: nothing.

Garbage or truncated bytes raise ``ProtocolError``; the leader treats such a member as having
no history. Decoding is bounded by ``MAX_TASK_IDS``, so a few bytes of garbage cannot cost gigabytes
or minutes; the writer refuses whatever the reader would refuse (a ``ValueError``), so a leader
fails loudly instead of sending every member an assignment it cannot read. The leader decodes
subscriptions tighter still (``task_counts``: claims on tasks that do not exist are never made;
``max_previous_active``: a limit per member from the group's size), so that a rebalance, not
just one decode, is bounded (``streamassign.streams.decode_subscriptions``).
"""

from __future__ import annotations

import operator
import struct
import uuid
import zlib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TypeVar

import attrs

from ._ids import TaskId, TopicPartition
from .errors import EncodeError, ErrorCode
from .errors import ProtocolError as ProtocolError  # its old home: still importable from here

LATEST_VERSION = 3
MIN_VERSION = 1


def is_protocol_version(value: object) -> bool:
    """Whether ``value`` is a streams protocol version this library speaks: an int (not a
    bool) from ``MIN_VERSION`` to ``LATEST_VERSION``. A pin outside that range (0, say) made
    every assignment look like an upgrade, and each rejoin rebalanced the whole group."""
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    return MIN_VERSION <= value <= LATEST_VERSION


#: Offset sum reported for a task the client is running as an active (Kafka Streams' -2).
LATEST_OFFSET = -2

#: ``next_rebalance_ms`` values besides a wall-clock time.
NEVER = -1
NOW = 0

#: Task ids one decode may produce, over all its task lists, offset sums and host maps (the
#: topic names, endpoints and dictionary entries of a host section count as one each too, so no
#: decode loops much past it). Run lengths and counts are charged before ids are made: without
#: a total, 63 bytes decoded to 8.4M ids (1.2 GB). Far above any real group: Kafka Streams' own
#: scale tests stop at 100k tasks, whose host maps with two standbys hold 300k ids.
MAX_TASK_IDS = 1 << 20

#: Bytes per ``MAX_TASK_IDS`` entry a compressed host section may inflate to. The leader writes
#: 2-4 bytes per task (active host index, standby count) and 1-3 per standby; the rest leaves
#: room for topic and endpoint names. Anything larger is a bomb, not a map.
_SECTION_BYTES_PER_ENTRY = 16

_HEAD = struct.Struct(">ii")
_T = TypeVar("_T")
_UINT_LIMIT = 1 << 64  # varints carry 64 bits (Kafka's varlong), zig-zag ones an int64


class _RoomExceeded(Exception):
    """A task set declares more than the reader's ``room`` (reported as a ``ProtocolError``
    by the decode that set the room)."""


# -- primitives ------------------------------------------------------------------------------


class _Writer:
    __slots__ = ("budget", "buf")

    def __init__(
        self, version: int | None = None, latest: int = 0, budget: int | None = None
    ) -> None:
        """A writer starting with the version header, or with nothing (``version=None``);
        ``budget`` is what is left of ``MAX_TASK_IDS`` (all of it by default)."""
        self.buf = bytearray(_HEAD.pack(version, latest) if version is not None else b"")
        self.budget = MAX_TASK_IDS if budget is None else budget

    def take(self, n: int) -> None:
        """Charge ``n`` entries as the reader will, refusing data it would refuse."""
        if n > self.budget:
            raise EncodeError(
                f"user data would hold more than MAX_TASK_IDS = {MAX_TASK_IDS} task ids and "
                "entries, which readers refuse"
            )
        self.budget -= n

    def uint(self, n: int) -> None:
        if not 0 <= n < _UINT_LIMIT:
            raise EncodeError(f"cannot encode {n} as a 64-bit unsigned varint")
        while n >= 0x80:
            self.buf.append((n & 0x7F) | 0x80)
            n >>= 7
        self.buf.append(n)

    def sint(self, n: int) -> None:
        if not -(1 << 63) <= n < 1 << 63:
            raise EncodeError(f"cannot encode {n} as a signed 64-bit varint")
        self.uint(~(n << 1) if n < 0 else n << 1)

    def string(self, s: str) -> None:
        data = s.encode()
        self.uint(len(data))
        self.buf += data

    def tasks(self, tasks: Iterable[TaskId]) -> None:
        """Tasks as ``[subtopology count] {subtopology, runs}``."""
        by_sub: dict[int, list[int]] = {}
        for t in tasks:
            by_sub.setdefault(t.subtopology, []).append(t.partition)
        self.uint(len(by_sub))
        for sub in sorted(by_sub):
            self.uint(sub)
            self.runs(by_sub[sub])

    def runs(self, partitions: Iterable[int]) -> None:
        """Sorted partitions as ``[run count] {gap from previous end, length - 1}``."""
        runs: list[tuple[int, int]] = []
        unique = sorted(set(partitions))
        self.take(len(unique))
        for p in unique:
            if runs and p == runs[-1][0] + runs[-1][1]:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1)
            else:
                runs.append((p, 1))
        self.uint(len(runs))
        end = 0
        for first, length in runs:
            self.uint(first - end)
            self.uint(length - 1)
            end = first + length

    def finish(self) -> bytes:
        return bytes(self.buf)


class _Reader:
    __slots__ = ("budget", "data", "pos", "room")

    def __init__(self, data: bytes, start: int = _HEAD.size, budget: int | None = None) -> None:
        """A reader from ``start``; ``budget`` is what is left of ``MAX_TASK_IDS`` (all of it
        by default). ``room``, when set, is what task sets may still declare (a ``ProtocolError``
        past it, before the tasks are made)."""
        self.data = data
        self.pos = start
        self.budget = MAX_TASK_IDS if budget is None else budget
        self.room: int | None = None

    def take(self, n: int) -> int:
        """Charge ``n`` entries to this decode's budget before making them; returns ``n``."""
        if n > self.budget:
            raise ProtocolError(
                f"more than MAX_TASK_IDS = {MAX_TASK_IDS} task ids and entries in one decode "
                "(far more than any real group)"
            )
        self.budget -= n
        return n

    def uint(self) -> int:
        n = shift = 0
        data, pos = self.data, self.pos
        while True:
            if pos >= len(data):
                raise ProtocolError(f"truncated at byte {pos} of {len(data)}")
            b = data[pos]
            pos += 1
            n |= (b & 0x7F) << shift
            if b < 0x80:
                self.pos = pos
                return n
            shift += 7
            if shift == 63:  # the tenth byte holds the 64th bit, nothing else
                if pos >= len(data):
                    raise ProtocolError(f"truncated at byte {pos} of {len(data)}")
                if data[pos] > 1:
                    raise ProtocolError(f"varint too long (over 64 bits) at byte {self.pos}")
                self.pos = pos + 1
                return n | data[pos] << 63

    def uints(self, k: int) -> list[int]:
        """``k`` varints: ``uint`` inlined for those of up to three bytes (a v3 tail is mostly
        those, up to a budget's worth of them: ids below 2**21)."""
        out = []
        data, pos, end = self.data, self.pos, len(self.data)
        for _ in range(k):
            if pos < end and data[pos] < 0x80:
                out.append(data[pos])
                pos += 1
            elif pos + 1 < end and data[pos + 1] < 0x80:
                out.append((data[pos] & 0x7F) | data[pos + 1] << 7)
                pos += 2
            elif pos + 2 < end and data[pos + 2] < 0x80:
                out.append((data[pos] & 0x7F) | (data[pos + 1] & 0x7F) << 7 | data[pos + 2] << 14)
                pos += 3
            else:
                self.pos = pos
                out.append(self.uint())
                pos = self.pos
        self.pos = pos
        return out

    def sint(self) -> int:
        n = self.uint()
        return (n >> 1) ^ -(n & 1)

    def count(self) -> int:
        """A collection size, bounded by the bytes left (garbage cannot allocate gigabytes)."""
        n = self.uint()
        if n > len(self.data) - self.pos:
            raise ProtocolError(f"count {n} exceeds the {len(self.data) - self.pos} bytes left")
        return n

    def string(self) -> str:
        n = self.count()
        raw = self.data[self.pos : self.pos + n]
        self.pos += n
        try:
            return raw.decode()
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"invalid UTF-8 string: {exc}") from exc

    def tasks(self, counts: Mapping[int, int] | None = None) -> frozenset[TaskId]:
        """A task set; with ``counts`` (tasks per subtopology) only the tasks that exist there
        are made, though every run is charged as declared."""
        out: list[TaskId] = []
        for _ in range(self.count()):
            sub = self.uint()
            limit = None if counts is None else counts.get(sub, 0)
            out.extend(TaskId(sub, p) for p in self.runs(limit))
        return frozenset(out)

    def runs(self, limit: int | None = None) -> list[int]:
        """Partitions of a run list, below ``limit`` only when given (runs ascend, so a run is
        cut, never scanned)."""
        out: list[int] = []
        end = 0
        for _ in range(self.count()):
            first = end + self.uint()
            length = self.take(self.uint() + 1)
            if self.room is not None:
                if length > self.room:
                    raise _RoomExceeded
                self.room -= length
            end = first + length
            out.extend(range(first, end if limit is None else min(end, limit)))
        return out

    def done(self) -> bool:
        return self.pos >= len(self.data)


def read_header(data: bytes) -> tuple[int, int]:
    """``(version, latest_supported_version)`` of any user data; ``ProtocolError`` if absent."""
    if len(data) < _HEAD.size:
        raise ProtocolError(f"user data of {len(data)} bytes has no version header")
    version, latest = _HEAD.unpack_from(data)
    if version < MIN_VERSION or latest < version:
        raise ProtocolError(f"bad version header: version {version}, latest supported {latest}")
    return version, latest


def _decode(data: bytes, what: str, parse: Callable[[bytes], _T]) -> _T:
    """Run ``parse``, turning every low-level failure into a ``ProtocolError``."""
    try:
        return parse(data)
    except ProtocolError:
        raise
    except (struct.error, ValueError, IndexError, TypeError) as exc:
        raise ProtocolError(f"unreadable {what} ({len(data)} bytes): {exc}") from exc


def _error_code(n: int) -> ErrorCode:
    try:
        return ErrorCode(n)
    except ValueError:
        return ErrorCode.ASSIGNMENT_ERROR  # a code from a newer peer: still an error


# -- subscription ----------------------------------------------------------------------------


def running_tasks(offset_sums: Mapping[TaskId, int]) -> frozenset[TaskId]:
    """The tasks of a member's offset sums it runs as actives (``LATEST_OFFSET``)."""
    return frozenset(t for t, s in offset_sums.items() if s == LATEST_OFFSET)


@attrs.frozen
class SubscriptionInfo:
    """What one consumer of a streams process tells the leader when it joins."""

    process_id: uuid.UUID
    endpoint: str | None = None
    offset_sums: Mapping[TaskId, int] = attrs.field(factory=dict)
    previous_active: frozenset[TaskId] = frozenset()
    join_nonce: int = 0
    error_code: ErrorCode = ErrorCode.NONE
    rack: str | None = None
    client_tags: Mapping[str, str] = attrs.field(factory=dict)
    version: int = LATEST_VERSION
    latest_supported_version: int = LATEST_VERSION
    #: Subtopology id -> its source topics in the member's topology, as indices into the
    #: member's sorted subscribed topics (version 3; empty: not announced, an older member,
    #: whose topology the leader cannot compare). ``versions.announced_sources`` names them.
    subtopology_topic_indices: Mapping[int, frozenset[int]] = attrs.field(
        factory=dict, kw_only=True
    )

    @property
    def running(self) -> frozenset[TaskId]:
        """Tasks the process runs as actives (offset sum ``LATEST_OFFSET``)."""
        return running_tasks(self.offset_sums)

    def encode(self) -> bytes:
        w = _Writer(self.version, self.latest_supported_version)
        w.buf += self.process_id.bytes
        w.string(self.endpoint or "")
        by_sub: dict[int, list[tuple[int, int]]] = {}
        for t, offset in self.offset_sums.items():
            by_sub.setdefault(t.subtopology, []).append((t.partition, offset))
        w.uint(len(by_sub))
        w.take(len(self.offset_sums))
        for sub in sorted(by_sub):
            entries = sorted(by_sub[sub])
            w.uint(sub)
            w.uint(len(entries))
            prev = 0
            for p, offset in entries:
                w.uint(p - prev)
                w.sint(offset)
                prev = p
        w.tasks(self.previous_active)
        w.uint(self.join_nonce)
        w.uint(self.error_code)
        if self.version >= 2:
            w.string(self.rack or "")
            w.uint(len(self.client_tags))
            for key in sorted(self.client_tags):
                w.string(key)
                w.string(self.client_tags[key])
        if self.version >= 3:
            _write_topic_indices(w, self.subtopology_topic_indices)
        return w.finish()

    @classmethod
    def decode(
        cls,
        data: bytes,
        max_version: int = LATEST_VERSION,
        *,
        task_counts: Mapping[int, int] | None = None,
        max_previous_active: int | None = None,
        announced_ids: Collection[int] | None = None,
        announcements: AnnouncementMemo | None = None,
    ) -> SubscriptionInfo:
        """Read up to ``max_version`` (a newer member's extra fields are skipped).
        ``announced_ids`` (the leader's subtopology ids): the announced topics of other ids are
        dropped unmade but for the first (it keeps the member one that announces), so a
        hostile tail of many ids costs its bytes, not their sets.

        The leader's bounds: with ``task_counts`` (tasks per subtopology: task ``s_p`` exists
        when ``p < task_counts[s]``) offset sums and previous actives of other tasks are
        dropped unmade; past ``max_previous_active`` previous actives declared (counted
        before clipping: the runs' lengths, the one field where a few bytes claim much), a
        ``ProtocolError``. Every byte is read and every entry charged either way, so whether
        a decode raises does not depend on ``task_counts``.

        ``announcements``: a leader's memo of the version 3 tails it read this round with
        these ``announced_ids`` (:class:`AnnouncementMemo`); the result is the same with or
        without it."""
        return _decode(
            data,
            "subscription",
            lambda d: cls._decode(
                d, max_version, task_counts, max_previous_active, announced_ids, announcements
            ),
        )

    @classmethod
    def _decode(
        cls,
        data: bytes,
        max_version: int,
        task_counts: Mapping[int, int] | None = None,
        max_previous_active: int | None = None,
        announced_ids: Collection[int] | None = None,
        announcements: AnnouncementMemo | None = None,
    ) -> SubscriptionInfo:
        version, latest = read_header(data)
        r = _Reader(data)
        if len(data) < r.pos + 16:
            raise ProtocolError("truncated process id")
        process_id = uuid.UUID(bytes=data[r.pos : r.pos + 16])
        r.pos += 16
        endpoint = r.string() or None
        sums = _read_offset_sums(r, task_counts)
        r.room = max_previous_active
        try:
            previous = r.tasks(task_counts)
        except _RoomExceeded:
            raise ProtocolError(
                f"claims more than the {max_previous_active} previous active tasks the leader "
                "allows one member of this group (one per task, plus slack)"
            ) from None
        r.room = None
        nonce = r.uint()
        error = _error_code(r.uint())
        rack, tags = None, {}
        read_version = min(version, max_version)
        if read_version >= 2:
            rack = r.string() or None
            tags = {r.string(): r.string() for _ in range(r.count())}
        indices = {}
        if read_version >= 3:
            # Through a leader's memo when it keeps one: the same result, each tail read once.
            read = _read_topic_indices if announcements is None else announcements.read
            indices = read(r, announced_ids)
        if version == read_version and not r.done():
            raise ProtocolError(f"{len(data) - r.pos} unexpected trailing bytes")
        return cls(
            process_id,
            endpoint,
            sums,
            previous,
            nonce,
            error,
            rack,
            tags,
            version,
            latest,
            subtopology_topic_indices=indices,
        )


def _read_offset_sums(r: _Reader, task_counts: Mapping[int, int] | None) -> dict[TaskId, int]:
    """What :meth:`SubscriptionInfo.encode` wrote of the offset sums: per subtopology, its
    partitions (as steps from the last) and their sums. With ``task_counts`` (the leader's),
    sums of tasks outside them are read and charged but not kept."""
    sums: dict[TaskId, int] = {}
    for _ in range(r.count()):
        sub = r.uint()
        p = 0
        limit = None if task_counts is None else task_counts.get(sub, 0)
        for _ in range(r.take(r.count())):
            p += r.uint()
            offset = r.sint()
            if limit is None or p < limit:
                sums[TaskId(sub, p)] = offset
    return sums


def _write_topic_indices(w: _Writer, indices: Mapping[int, Iterable[int]]) -> None:
    """``[id count] {id, [index count] {index}}``, ids and indices ascending, each entry
    charged as the reader charges it; an id with no index is refused (the reader's garbage)."""
    w.take(len(indices))
    w.uint(len(indices))
    for sub in sorted(indices):
        topics = sorted(set(indices[sub]))
        if not topics:
            raise EncodeError(f"subtopology {sub} announced with no topic")
        w.take(len(topics))
        w.uint(sub)
        w.uint(len(topics))
        for index in topics:
            w.uint(index)


class AnnouncementMemo:
    """The version 3 tails (announced topologies) one leader read in one round, by their
    bytes: the members of one topology version send the same tail, which took a wide app's
    leader most of its decode (300 members x 1,000 topics: 1.4 of 2.1 s profiled). A tail
    read again is charged to the decode's budget as when it was read, so whether a decode
    raises does not change. Only tails that read cleanly and end their data are kept, and
    bytes are compared only where their length is a kept tail's: trailing bytes (a newer
    member's fields, garbage) are neither copied nor hashed. One memo per ``announced_ids``."""

    def __init__(self) -> None:
        #: Per length, a tail's bytes -> (what they announce, entries it charged).
        self._by_length: dict[int, dict[bytes, tuple[dict[int, frozenset[int]], int]]] = {}

    def read(self, r: _Reader, kept: Collection[int] | None) -> dict[int, frozenset[int]]:
        """:func:`_read_topic_indices` of ``r``, from the memo when these bytes were read."""
        start, budget = r.pos, r.budget
        same_length = self._by_length.get(len(r.data) - start)
        if same_length and (found := same_length.get(r.data[start:])) is not None:
            indices, charged = found
            r.take(charged)
            r.pos = len(r.data)
            return indices
        indices = _read_topic_indices(r, kept)
        if r.done():
            tails = self._by_length.setdefault(len(r.data) - start, {})
            tails[r.data[start:]] = (indices, budget - r.budget)
        return indices


def _read_topic_indices(r: _Reader, kept: Collection[int] | None) -> dict[int, frozenset[int]]:
    """What :func:`_write_topic_indices` wrote. Counts are bounded by the bytes left and
    charged to the decode's budget before anything is made; ids or indices not ascending (an
    id or index twice among them), or an id with no index, are garbage. Whether an index names
    a subscribed topic is the leader's check (``versions.announced_sources``: the names travel
    beside the user data). Ids outside ``kept`` (when given) but the first are read, not kept."""
    out: dict[int, frozenset[int]] = {}
    foreign = False
    previous = -1
    for _ in range(r.take(r.count())):
        sub, n = r.uints(2)  # one call for both: a hostile tail is mostly these
        if sub <= previous:
            raise ProtocolError(f"subtopology {sub} announced after {previous} (ids ascend)")
        previous = sub
        if n > len(r.data) - r.pos:
            raise ProtocolError(f"count {n} exceeds the {len(r.data) - r.pos} bytes left")
        indices = r.uints(r.take(n))
        if not indices:
            raise ProtocolError(f"subtopology {sub} announced with no topic")
        if n > 1 and any(map(operator.ge, indices, indices[1:])):
            raise ProtocolError(f"subtopology {sub}'s topic indices do not ascend")
        if kept is None or sub in kept or not foreign:
            foreign = foreign or (kept is not None and sub not in kept)
            out[sub] = frozenset(indices)
    return out


# -- assignment ------------------------------------------------------------------------------


def _host_map(value: Mapping[str, Iterable[TaskId]]) -> dict[str, frozenset[TaskId]]:
    """Host maps without empty entries (a host with no tasks carries no information)."""
    return {host: frozenset(tasks) for host, tasks in value.items() if tasks}


@attrs.frozen
class AssignmentInfo:
    """What the leader sends one consumer: its tasks, the group's host maps and error state.

    ``topics`` is the dictionary the host maps refer to: per subtopology, its source topics
    with their partition counts, so a member turns ``endpoint -> tasks`` back into partitions
    (``partitions_by_host``) without the leader spelling out every partition.
    """

    active: frozenset[TaskId] = frozenset()
    standby: frozenset[TaskId] = frozenset()
    warmup: frozenset[TaskId] = frozenset()
    active_by_host: Mapping[str, frozenset[TaskId]] = attrs.field(factory=dict, converter=_host_map)
    standby_by_host: Mapping[str, frozenset[TaskId]] = attrs.field(
        factory=dict, converter=_host_map
    )
    topics: Mapping[int, Mapping[str, int]] = attrs.field(factory=dict)
    error_code: ErrorCode = ErrorCode.NONE
    next_rebalance_ms: int = NEVER
    version: int = LATEST_VERSION
    common_version: int = LATEST_VERSION

    def partitions_by_host(self, standby: bool = False) -> dict[str, frozenset[TopicPartition]]:
        """Host map in partitions: endpoint -> source partitions of its active (or standby)
        tasks."""
        hosts = self.standby_by_host if standby else self.active_by_host
        out: dict[str, frozenset[TopicPartition]] = {}
        for host, tasks in hosts.items():
            out[host] = frozenset(
                TopicPartition(topic, t.partition)
                for t in tasks
                for topic, count in self.topics.get(t.subtopology, {}).items()
                if t.partition < count
            )
        return out

    def encode(self) -> bytes:
        w = _Writer(self.version, self.common_version)
        w.uint(self.error_code)
        w.sint(self.next_rebalance_ms)
        w.tasks(self.active)
        w.tasks(self.standby)
        if self.active_by_host or self.standby_by_host or self.topics:
            # The dictionary travels even without host maps: members map their own tasks
            # with it (same format: a section with no hosts reads as such in every version).
            section = zlib.compress(self._host_section(w), 9)
            w.uint(len(section))
            w.buf += section
        else:
            w.uint(0)
        if self.version >= 2:
            w.tasks(self.warmup)
        return w.finish()

    def _host_section(self, parent: _Writer) -> bytes:
        """Dictionaries and host maps as owner vectors: per subtopology, per task, the active's
        host (index + 1, 0: none) and its standbys' hosts. The sticky assignor deals tasks
        round robin, so runs would degenerate; a vector costs one byte per task, and zlib
        takes the rest (endpoint names repeat their shape). Charged to ``parent``'s budget."""
        w = _Writer(budget=parent.budget)
        self._write_topic_dictionary(w)
        hosts = sorted(set(self.active_by_host) | set(self.standby_by_host))
        w.take(len(hosts))
        w.uint(len(hosts))
        for host in hosts:
            w.string(host)
        active, standby = self._host_indices(hosts)
        self._write_owner_vectors(w, active, standby)
        parent.budget = w.budget
        if len(w.buf) > _section_limit():
            raise EncodeError(
                f"host section of {len(w.buf)} bytes: readers refuse more than "
                f"{_SECTION_BYTES_PER_ENTRY} bytes per MAX_TASK_IDS entry"
            )
        return w.finish()

    def _write_topic_dictionary(self, w: _Writer) -> None:
        """Topic names, then each subtopology's source topics as (name index, partition count)."""
        names = sorted({name for topics in self.topics.values() for name in topics})
        index = {name: i for i, name in enumerate(names)}
        w.take(len(names))
        w.uint(len(names))
        for name in names:
            w.string(name)
        w.take(len(self.topics))
        w.uint(len(self.topics))
        for sub in sorted(self.topics):
            w.uint(sub)
            w.take(len(self.topics[sub]))
            w.uint(len(self.topics[sub]))
            for name in sorted(self.topics[sub]):
                w.uint(index[name])
                w.uint(self.topics[sub][name])

    def _host_indices(
        self, hosts: Sequence[str]
    ) -> tuple[dict[TaskId, int], dict[TaskId, list[int]]]:
        """Each task's active host and standby hosts, as indices into ``hosts``."""
        active: dict[TaskId, int] = {}
        standby: dict[TaskId, list[int]] = {}
        for h, host in enumerate(hosts):
            for t in self.active_by_host.get(host, ()):
                if t in active:
                    raise EncodeError(f"task {t} active on two hosts: {hosts[active[t]]}, {host}")
                active[t] = h
            for t in self.standby_by_host.get(host, ()):
                standby.setdefault(t, []).append(h)
        return active, standby

    def _write_owner_vectors(
        self, w: _Writer, active: Mapping[TaskId, int], standby: Mapping[TaskId, list[int]]
    ) -> None:
        """Per subtopology of the dictionary, every task's active host, then its standby hosts."""
        counts = _task_counts(self.topics)
        w.take(sum(counts.values()))  # before looping over them: the count may be absurd
        w.take(sum(map(len, standby.values())))
        outside = sorted(
            t for t in (*active, *standby) if t.partition >= counts.get(t.subtopology, 0)
        )
        if outside:
            raise EncodeError(f"host maps name tasks outside the topic dictionary: {outside[:5]}")
        for sub in sorted(counts):
            for p in range(counts[sub]):
                w.uint(active.get(TaskId(sub, p), -1) + 1)
            for p in range(counts[sub]):
                owners = standby.get(TaskId(sub, p), [])
                w.uint(len(owners))
                for h in owners:
                    w.uint(h)

    @classmethod
    def decode(cls, data: bytes, max_version: int = LATEST_VERSION) -> AssignmentInfo:
        return _decode(data, "assignment", lambda d: cls._decode(d, max_version))

    @classmethod
    def _decode(cls, data: bytes, max_version: int) -> AssignmentInfo:
        version, common = read_header(data)
        r = _Reader(data)
        error = _error_code(r.uint())
        next_rebalance = r.sint()
        active, standby = r.tasks(), r.tasks()
        size = r.count()
        topics: dict[int, dict[str, int]] = {}
        maps: tuple[dict[str, frozenset[TaskId]], ...] = ({}, {})
        if size:
            section = _Reader(_inflate(data[r.pos : r.pos + size]), start=0, budget=r.budget)
            topics, maps = _read_host_section(section)
            r.budget = section.budget
            r.pos += size
        warmup: frozenset[TaskId] = frozenset()
        read_version = min(version, max_version)
        if read_version >= 2:
            warmup = r.tasks()
        if version == read_version and not r.done():
            raise ProtocolError(f"{len(data) - r.pos} unexpected trailing bytes")
        return cls(
            active,
            standby,
            warmup,
            maps[0],
            maps[1],
            topics,
            error,
            next_rebalance,
            version,
            common,
        )


def _section_limit() -> int:
    """Bytes an inflated host section may hold (read at call time: tests lower the budget)."""
    return _SECTION_BYTES_PER_ENTRY * MAX_TASK_IDS


def _inflate(blob: bytes) -> bytes:
    """zlib-decompress, refusing to expand past ``_section_limit()`` bytes (a bomb, not a
    map)."""
    limit = _section_limit()
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(blob, limit + 1)  # room for the end marker at exactly limit
    except zlib.error as exc:
        raise ProtocolError(f"corrupt host map section: {exc}") from exc
    if len(out) > limit or inflater.unconsumed_tail or not inflater.eof:
        raise ProtocolError(f"host map section truncated or expands past {limit} bytes")
    return out


def _task_counts(topics: Mapping[int, Mapping[str, int]]) -> dict[int, int]:
    """Tasks per subtopology: its largest topic's partition count."""
    return {sub: max(entries.values(), default=0) for sub, entries in topics.items()}


def _read_host_section(
    r: _Reader,
) -> tuple[dict[int, dict[str, int]], tuple[dict[str, frozenset[TaskId]], ...]]:
    """Topic dictionary and host maps from an inflated section, charging every name, entry,
    task and standby to ``r``'s budget before reading it."""
    names = [r.string() for _ in range(r.take(r.count()))]
    topics: dict[int, dict[str, int]] = {}
    for _ in range(r.take(r.count())):
        sub = r.uint()
        entries = {}
        for _ in range(r.take(r.count())):
            i = r.uint()
            if i >= len(names):
                raise ProtocolError(f"topic index {i} outside the dictionary of {len(names)}")
            entries[names[i]] = r.uint()
        topics[sub] = entries
    hosts = [r.string() for _ in range(r.take(r.count()))]
    active: list[list[TaskId]] = [[] for _ in hosts]
    standby: list[list[TaskId]] = [[] for _ in hosts]
    counts = _task_counts(topics)
    r.take(sum(counts.values()))
    for sub, count in sorted(counts.items()):
        if count > len(r.data):
            raise ProtocolError(f"{count} tasks cannot fit in {len(r.data)} bytes")
        for p in range(count):
            h = r.uint()
            if h > len(hosts):
                raise ProtocolError(f"host index {h - 1} outside the dictionary of {len(hosts)}")
            if h:
                active[h - 1].append(TaskId(sub, p))
        for p in range(count):
            for _ in range(r.take(r.count())):
                h = r.uint()
                if h >= len(hosts):
                    raise ProtocolError(f"host index {h} outside the dictionary of {len(hosts)}")
                standby[h].append(TaskId(sub, p))
    if not r.done():
        raise ProtocolError("trailing bytes in the host map section")
    return topics, (
        {host: frozenset(ts) for host, ts in zip(hosts, active, strict=True) if ts},
        {host: frozenset(ts) for host, ts in zip(hosts, standby, strict=True) if ts},
    )
