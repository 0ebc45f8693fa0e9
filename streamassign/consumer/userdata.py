"""Subscription user data of the consumer assignors: member parameters and sticky history.

Wire format, big-endian, version 1 (every later version keeps this as its prefix, so a leader
reads what it knows from a newer member and ignores the rest):

    int32  version                  (1)
    int32  latest_supported_version (the newest version the member can read)
    int32  generation               (of owned partitions; -1: none)
    int32  priority                 (failover: highest wins)
    int32  weight                   (weighted: share of partitions, >= 1)
    int32  join_epoch               (changes on every join, so a rejoin always rebalances)
    partitions                      (owned partitions, see below)

where ``partitions`` is ``int32 topic_count, topic_count x { int16 name_length, utf-8 name,
int32 run_count, run_count x { int32 first_partition, int32 length } }``.

Owned partitions are run-length encoded per topic: a member owning partitions 0..499 of a topic
costs 8 bytes for them, not 2000. Garbage or truncated bytes, or runs adding up to more than
``MAX_PARTITIONS``, raise ``UserDataError``; callers treat such a member as having no history
and default parameters (``read_member_data``).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterable, Mapping

import attrs

from .. import TopicPartition
from ..errors import EncodeError, ErrorCode
from ..errors import UserDataError as UserDataError  # its old home: still importable from here

log = logging.getLogger("streamassign.consumer")

VERSION = 1
LATEST_SUPPORTED = 1

_HEAD = struct.Struct(">iiiiii")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_RUN = struct.Struct(">ii")


_INT32 = (-(2**31), 2**31 - 1)

#: Owned partitions one decode may expand to, summed over all runs and checked before any is
#: built: 8 bytes of runs can claim 2**31 partitions, so without a budget 43 bytes cost minutes
#: and gigabytes. 2**20 (about 0.5 s and 100 MB to build) still fits a failover primary owning
#: every partition of a 1M-partition group; more is garbage, not a member.
MAX_PARTITIONS = 1 << 20


def _int32(low: int = _INT32[0]) -> Callable[[object, attrs.Attribute[int], int], None]:
    """Validator: an int in ``[low, 2**31 - 1]`` (the wire carries int32)."""

    def check(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= _INT32[1]:
            raise EncodeError(
                f"{attribute.name} must be an int in [{low}, 2**31 - 1], got {value!r}"
            )

    return check


class _Sorted(tuple[TopicPartition, ...]):
    """Partitions the decoder built sorted, unique and in range: converted without a re-sort."""


def _partitions(value: Iterable[tuple[str, int]]) -> tuple[TopicPartition, ...]:
    """Sorted, de-duplicated partitions; each must be in the int32 range and >= 0."""
    if type(value) is _Sorted:
        return tuple(value)
    out = sorted({TopicPartition(*tp) for tp in value})
    for tp in out:
        if not isinstance(tp.partition, int) or not 0 <= tp.partition <= _INT32[1]:
            raise EncodeError(
                f"partition of {tp.topic!r} must be in [0, 2**31 - 1]: {tp.partition}"
            )
    for topic in {tp.topic for tp in out}:
        if len(topic.encode()) > 2**15 - 1:
            raise EncodeError(f"topic name too long for the wire: {topic[:40]!r}...")
    return tuple(out)


def _write_partitions(partitions: Iterable[TopicPartition]) -> bytes:
    """``int32 topic_count`` then per topic ``int16 name length, name, int32 run count, runs``."""
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    parts = [_I32.pack(len(by_topic))]
    for topic, numbers in by_topic.items():
        name = topic.encode()
        runs = list(_runs(numbers))
        parts.append(_I16.pack(len(name)) + name + _I32.pack(len(runs)))
        parts.extend(_RUN.pack(first, length) for first, length in runs)
    return b"".join(parts)


@attrs.frozen
class _Runs:
    """The partitions section as read and checked, before any partition is built."""

    runs: list[tuple[str, int, int]]  # (topic, first, stop)
    ordered: bool  # topics and runs strictly ascending (as _write_partitions writes them)

    def build(self, keep: Mapping[str, int] | None = None) -> Iterable[TopicPartition]:
        """The partitions; with ``keep`` (partition counts) only those that exist there."""
        make = TopicPartition._make
        out: list[TopicPartition] = []
        for topic, first, stop in self.runs:
            if keep is not None:
                stop = min(stop, keep.get(topic, 0))
            out.extend([make((topic, p)) for p in range(first, stop)])
        return _Sorted(out) if self.ordered else out


def _read_partitions(data: bytes, pos: int) -> tuple[_Runs, int]:
    """The inverse of ``_write_partitions``, unexpanded; the runs may cover at most
    ``MAX_PARTITIONS`` partitions in total."""
    (topics,) = _I32.unpack_from(data, pos)
    pos += 4
    if topics < 0 or topics > len(data) - pos:
        raise UserDataError(f"bad topic count {topics}")
    runs: list[tuple[str, int, int]] = []
    total = 0
    ordered = True
    last: tuple[str, int] | None = None  # (topic, last partition) of the previous run
    for _ in range(topics):
        (length,) = _I16.unpack_from(data, pos)
        pos += 2
        if length < 0 or pos + length > len(data):
            raise UserDataError("truncated topic name")
        topic = data[pos : pos + length].decode()
        pos += length
        (count,) = _I32.unpack_from(data, pos)
        pos += 4
        if count < 0 or pos + count * _RUN.size > len(data):
            raise UserDataError("truncated partition runs")
        for first, size in _RUN.iter_unpack(data[pos : pos + count * _RUN.size]):
            if first < 0 or size < 1 or first + size - 1 > _INT32[1]:
                raise UserDataError(f"bad partition run {first}+{size} of {topic!r}")
            total += size
            if total > MAX_PARTITIONS:
                raise UserDataError(f"more than {MAX_PARTITIONS} partitions")
            ordered = ordered and (last is None or (topic, first) > last)
            last = (topic, first + size - 1)
            runs.append((topic, first, first + size))
        pos += count * _RUN.size
    return _Runs(runs, ordered), pos


@attrs.frozen
class MemberData:
    """What a member tells the leader besides its topics. Fields are int32 on the wire and
    validated here, so encoding never fails."""

    priority: int = attrs.field(default=0, validator=_int32())
    weight: int = attrs.field(default=1, validator=_int32(1))
    owned_partitions: tuple[TopicPartition, ...] = attrs.field(default=(), converter=_partitions)
    generation: int = attrs.field(default=-1, validator=_int32())
    join_epoch: int = attrs.field(default=0, validator=_int32())
    version: int = VERSION
    latest_supported_version: int = LATEST_SUPPORTED

    def encode(self) -> bytes:
        head = _HEAD.pack(
            VERSION,
            LATEST_SUPPORTED,
            self.generation,
            self.priority,
            self.weight,
            self.join_epoch,
        )
        return head + _write_partitions(self.owned_partitions)

    @classmethod
    def decode(
        cls, data: bytes, *, partitions_per_topic: Mapping[str, int] | None = None
    ) -> MemberData:
        """Read ``data``; ``UserDataError`` says what is wrong with it.

        With ``partitions_per_topic`` (the leader's metadata), owned partitions that do not
        exist there are dropped unbuilt; ``{}`` reads the parameters only. Either way every
        byte is checked, so what raises does not depend on it."""
        try:
            version, latest, generation, priority, weight, epoch = _HEAD.unpack_from(data)
            if version < 1:
                raise UserDataError(f"unknown user data version {version}")
            if weight < 1:
                raise UserDataError(f"weight must be >= 1, got {weight}")
            owned, pos = _read_partitions(data, _HEAD.size)
            if version == VERSION and pos != len(data):
                raise UserDataError(f"{len(data) - pos} unexpected trailing bytes")
            return cls(
                priority,
                weight,
                owned.build(partitions_per_topic),
                generation,
                epoch,
                version,
                latest,
            )
        except UserDataError:
            raise
        except (struct.error, UnicodeDecodeError, ValueError) as exc:
            raise UserDataError(f"unreadable user data ({len(data)} bytes): {exc}") from exc


def _runs(partitions: Iterable[int]) -> Iterable[tuple[int, int]]:
    first = prev = None
    for p in sorted(set(partitions)):
        if prev is None or p != prev + 1:
            if first is not None and prev is not None:
                yield first, prev - first + 1
            first = p
        prev = p
    if first is not None and prev is not None:
        yield first, prev - first + 1


def read_member_data(
    member: str, data: bytes, *, partitions_per_topic: Mapping[str, int] | None = None
) -> MemberData:
    """Decode ``data`` of ``member``; empty or unreadable bytes give defaults (logged).

    ``partitions_per_topic``: as in ``MemberData.decode``."""
    if not data:
        return MemberData()
    try:
        return MemberData.decode(data, partitions_per_topic=partitions_per_topic)
    except UserDataError as exc:
        log.warning("member %s: %s; treating it as having no history", member, exc)
        return MemberData()


_ASSIGNMENT = struct.Struct(">iiihb")


@attrs.frozen
class AssignmentData:
    """Assignment user data of the consumer assignors (version 1, big-endian)::

        int32 version, int32 latest_supported_version, int32 generation,
        int16 error_code, int8 flags (bit 0: a follow-up rebalance is needed),
        partitions (pending: what this member gets once their owners have revoked them)

    ``generation`` is the leader's count of rebalances (the max reported by members, plus one),
    so owned partitions can be ordered across leaders (KIP-341) without aiokafka exposing its
    own generation to assignors. A member reports its pending partitions as owned in the
    follow-up round, so that round reproduces the plan instead of recomputing another one.
    """

    generation: int = attrs.field(default=-1, validator=_int32())
    error_code: ErrorCode = ErrorCode.NONE
    followup: bool = False
    pending: tuple[TopicPartition, ...] = attrs.field(default=(), converter=_partitions)

    def encode(self) -> bytes:
        flags = 1 if self.followup else 0
        head = _ASSIGNMENT.pack(VERSION, LATEST_SUPPORTED, self.generation, self.error_code, flags)
        return head + _write_partitions(self.pending)

    @classmethod
    def decode(cls, data: bytes) -> AssignmentData:
        try:
            version, _, generation, code, flags = _ASSIGNMENT.unpack_from(data)
            if version < 1:
                raise UserDataError(f"unknown assignment data version {version}")
            pending, pos = _read_partitions(data, _ASSIGNMENT.size)
            if version == VERSION and pos != len(data):
                raise UserDataError(f"{len(data) - pos} unexpected trailing bytes")
        except UserDataError:
            raise
        except (struct.error, UnicodeDecodeError, ValueError) as exc:
            raise UserDataError(f"unreadable assignment data ({len(data)} bytes): {exc}") from exc
        try:
            error = ErrorCode(code)
        except ValueError:
            error = ErrorCode.ASSIGNMENT_ERROR  # a code from a newer leader: still an error
        return cls(generation, error, bool(flags & 1), pending.build())
