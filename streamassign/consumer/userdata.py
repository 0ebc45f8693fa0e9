"""Subscription user data of the consumer assignors: member parameters and sticky history.

Wire format, big-endian, version 1 (every later version keeps this as its prefix, so a leader
reads what it knows from a newer member and ignores the rest):

    int32  version                  (1)
    int32  latest_supported_version (the newest version the member can read)
    int32  generation               (of owned partitions; -1: none)
    int32  priority                 (failover: highest wins)
    int32  weight                   (weighted: share of partitions, >= 1)
    int32  join_epoch               (changes on every join, so a rejoin always rebalances)
    int32  topic_count
    topic_count x { int16 name_length, utf-8 name, int32 run_count,
                    run_count x { int32 first_partition, int32 length } }   (owned partitions)

Owned partitions are run-length encoded per topic: a member owning partitions 0..499 of a topic
costs 8 bytes for them, not 2000. Garbage or truncated bytes raise ``UserDataError``; callers
treat such a member as having no history and default parameters (``read_member_data``).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterable

import attrs

from .._ids import TopicPartition
from ..errors import ErrorCode, StreamAssignError

log = logging.getLogger("streamassign.consumer")

VERSION = 1
LATEST_SUPPORTED = 1

_HEAD = struct.Struct(">iiiiiii")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_RUN = struct.Struct(">ii")


class UserDataError(StreamAssignError, ValueError):
    """Subscription user data that cannot be decoded (garbage, truncated, unknown version)."""


def _weight(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"weight must be an int >= 1, got {value!r}")


def _sorted_tps(value: Iterable[tuple[str, int]]) -> tuple[TopicPartition, ...]:
    return tuple(sorted(TopicPartition(*tp) for tp in value))


@attrs.frozen
class MemberData:
    """What a member tells the leader besides its topics."""

    priority: int = 0
    weight: int = attrs.field(default=1, validator=_weight)
    owned_partitions: tuple[TopicPartition, ...] = attrs.field(default=(), converter=_sorted_tps)
    generation: int = -1
    join_epoch: int = 0
    version: int = VERSION
    latest_supported_version: int = LATEST_SUPPORTED

    def encode(self) -> bytes:
        by_topic: dict[str, list[int]] = {}
        for tp in self.owned_partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        parts = [
            _HEAD.pack(
                VERSION,
                LATEST_SUPPORTED,
                self.generation,
                self.priority,
                self.weight,
                self.join_epoch,
                len(by_topic),
            )
        ]
        for topic, partitions in by_topic.items():
            name = topic.encode()
            runs = list(_runs(partitions))
            parts.append(_I16.pack(len(name)) + name + _I32.pack(len(runs)))
            parts.extend(_RUN.pack(first, length) for first, length in runs)
        return b"".join(parts)

    @classmethod
    def decode(cls, data: bytes) -> MemberData:
        """Read ``data``; ``UserDataError`` says what is wrong with it."""
        try:
            version, latest, generation, priority, weight, epoch, topics = _HEAD.unpack_from(data)
            if version < 1:
                raise UserDataError(f"unknown user data version {version}")
            if weight < 1:
                raise UserDataError(f"weight must be >= 1, got {weight}")
            pos = _HEAD.size
            owned: list[TopicPartition] = []
            for _ in range(topics):
                (length,) = _I16.unpack_from(data, pos)
                pos += 2
                if length < 0 or pos + length > len(data):
                    raise UserDataError("truncated topic name")
                topic = data[pos : pos + length].decode()
                pos += length
                (runs,) = _I32.unpack_from(data, pos)
                pos += 4
                if runs < 0 or pos + runs * _RUN.size > len(data):
                    raise UserDataError("truncated partition runs")
                for _ in range(runs):
                    first, count = _RUN.unpack_from(data, pos)
                    pos += _RUN.size
                    if first < 0 or count < 1:
                        raise UserDataError(f"bad partition run {first}+{count} of {topic!r}")
                    owned.extend(TopicPartition(topic, p) for p in range(first, first + count))
            if version == VERSION and pos != len(data):
                raise UserDataError(f"{len(data) - pos} unexpected trailing bytes")
            return cls(priority, weight, owned, generation, epoch, version, latest)
        except UserDataError:
            raise
        except (struct.error, UnicodeDecodeError, ValueError) as exc:
            raise UserDataError(f"unreadable user data ({len(data)} bytes): {exc}") from exc


def _runs(partitions: Iterable[int]) -> Iterable[tuple[int, int]]:
    first = prev = -2
    for p in sorted(set(partitions)):
        if p != prev + 1:
            if first >= 0:
                yield first, prev - first + 1
            first = p
        prev = p
    if first >= 0:
        yield first, prev - first + 1


def read_member_data(member: str, data: bytes) -> MemberData:
    """Decode ``data`` of ``member``; empty or unreadable bytes give defaults (logged)."""
    if not data:
        return MemberData()
    try:
        return MemberData.decode(data)
    except UserDataError as exc:
        log.warning("member %s: %s; treating it as having no history", member, exc)
        return MemberData()


_ASSIGNMENT = struct.Struct(">iiihb")


@attrs.frozen
class AssignmentData:
    """Assignment user data of the consumer assignors (version 1, big-endian)::

        int32 version, int32 latest_supported_version, int32 generation,
        int16 error_code, int8 flags (bit 0: a follow-up rebalance is needed)

    ``generation`` is the leader's count of rebalances (the max reported by members, plus one),
    so owned partitions can be ordered across leaders (KIP-341) without aiokafka exposing its
    own generation to assignors.
    """

    generation: int = -1
    error_code: ErrorCode = ErrorCode.NONE
    followup: bool = False

    def encode(self) -> bytes:
        flags = 1 if self.followup else 0
        return _ASSIGNMENT.pack(VERSION, LATEST_SUPPORTED, self.generation, self.error_code, flags)

    @classmethod
    def decode(cls, data: bytes) -> AssignmentData:
        try:
            version, _, generation, code, flags = _ASSIGNMENT.unpack_from(data)
        except struct.error as exc:
            raise UserDataError(f"unreadable assignment data ({len(data)} bytes): {exc}") from exc
        if version < 1:
            raise UserDataError(f"unknown assignment data version {version}")
        try:
            error = ErrorCode(code)
        except ValueError:
            error = ErrorCode.ASSIGNMENT_ERROR  # a code from a newer leader: still an error
        return cls(generation, error, bool(flags & 1))
