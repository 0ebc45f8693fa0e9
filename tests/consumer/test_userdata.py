"""Subscription user data (MemberData): round trips, run-length encoding, garbage handling."""

from __future__ import annotations

import logging
import os
import struct
import subprocess
import sys
import textwrap

import attrs
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from streamassign import TopicPartition
from streamassign.consumer import MemberData, UserDataError, read_member_data
from streamassign.consumer.userdata import MAX_PARTITIONS

from .strategies import GARBAGE_USER_DATA, member_data, patched

HEADER = len(MemberData().encode())  # fixed part; ends with int32 topic_count


def runs(partitions: set[int]) -> int:
    return sum(1 for p in partitions if p - 1 not in partitions)


def expansion(data: bytes) -> int | None:
    """Total partitions the owned-runs section of ``data`` declares (walking the documented
    layout), or None where the walk gets lost: lets random inputs skip gigantic expansions."""
    try:
        topics = int.from_bytes(data[HEADER - 4 : HEADER], "big", signed=True)
        pos, total = HEADER, 0
        for _ in range(max(topics, 0)):
            length = int.from_bytes(data[pos : pos + 2], "big", signed=True)
            pos += 2 + max(length, 0)
            count = int.from_bytes(data[pos : pos + 4], "big", signed=True)
            pos += 4
            for _ in range(max(min(count, (len(data) - pos) // 8), 0)):
                total += max(int.from_bytes(data[pos + 4 : pos + 8], "big", signed=True), 0)
                pos += 8
            if pos > len(data):
                return total
        return total
    except (IndexError, ValueError):
        return None


@given(member_data(), st.floats(0, 1, exclude_max=True))
def test_round_trip_size_and_truncation(data: MemberData, where: float) -> None:
    """decode(encode(x)) == x; the size is the header plus, per topic, its name and 8 bytes
    per run of consecutive partitions (counted independently); any strict prefix raises."""
    encoded = data.encode()
    assert MemberData.decode(encoded) == data
    by_topic: dict[str, set[int]] = {}
    for tp in data.owned_partitions:
        by_topic.setdefault(tp.topic, set()).add(tp.partition)
    expected = HEADER + sum(2 + len(t.encode()) + 4 + 8 * runs(ps) for t, ps in by_topic.items())
    assert len(encoded) == expected
    with pytest.raises(UserDataError):
        MemberData.decode(encoded[: int(where * len(encoded))])


def test_dense_range_costs_one_run() -> None:
    owned = [("orders", p) for p in range(500)]
    assert len(MemberData(owned_partitions=owned).encode()) == HEADER + 2 + 6 + 4 + 8
    scattered = [("orders", p) for p in range(0, 10, 2)]
    assert len(MemberData(owned_partitions=scattered).encode()) == HEADER + 2 + 6 + 4 + 5 * 8


def test_owned_partitions_in_any_order_encode_alike() -> None:
    owned = [("b", 3), ("a", 1), ("b", 1), ("a", 0), ("b", 2)]
    assert (
        MemberData(owned_partitions=owned).encode()
        == MemberData(owned_partitions=sorted(owned)).encode()
    )
    assert MemberData.decode(MemberData(owned_partitions=owned).encode()).owned_partitions == (
        TopicPartition("a", 0),
        TopicPartition("a", 1),
        TopicPartition("b", 1),
        TopicPartition("b", 2),
        TopicPartition("b", 3),
    )


def test_every_truncation_raises_exhaustively() -> None:
    encoded = MemberData(7, 3, [("t", 0), ("t", 1), ("t", 5), ("ü", 2)], 4).encode()
    for cut in range(len(encoded)):
        with pytest.raises(UserDataError):
            MemberData.decode(encoded[:cut])


def _decodes_or_user_data_error(data: bytes) -> None:
    try:
        result = MemberData.decode(data)
    except UserDataError:
        return
    assert isinstance(result, MemberData)
    assert result.weight >= 1
    assert result.version >= 1


@given(st.binary(max_size=120))
def test_random_bytes_decode_or_raise_user_data_error(data: bytes) -> None:
    declared = expansion(data)
    assume(declared is not None and declared <= 2_000)  # see test_huge_run_is_rejected
    _decodes_or_user_data_error(data)


@given(member_data(), st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=6))
def test_corrupted_encodings_decode_or_raise_user_data_error(
    data: MemberData, corruption: list[tuple[int, int]]
) -> None:
    """Random bytes rarely get past the header; corrupting real encodings reaches the rest."""
    raw = bytearray(data.encode())
    for pos, value in corruption:
        raw[pos % len(raw)] = value
    declared = expansion(bytes(raw))
    assume(declared is not None and declared <= 2_000)
    _decodes_or_user_data_error(bytes(raw))


@given(member_data(), st.binary(min_size=1, max_size=40), st.integers(2, 2**31 - 1))
def test_newer_version_with_trailing_bytes_decodes_its_v1_prefix(
    data: MemberData, trailing: bytes, version: int
) -> None:
    """A newer member's data (version > 1) is read up to what v1 knows; the same trailing
    bytes after a version 1 payload are an error."""
    with pytest.raises(UserDataError):
        MemberData.decode(data.encode() + trailing)
    newer = patched(patched(data.encode(), 0, version), 4, version) + trailing
    decoded = MemberData.decode(newer)
    assert decoded.version == version
    assert decoded.latest_supported_version == version
    assert attrs.evolve(decoded, version=data.version, latest_supported_version=1) == data


@pytest.mark.parametrize("garbage", GARBAGE_USER_DATA)
def test_garbage_raises_user_data_error(garbage: bytes) -> None:
    with pytest.raises(UserDataError):
        MemberData.decode(garbage)


def test_user_data_error_is_a_value_error() -> None:
    assert issubclass(UserDataError, ValueError)


@pytest.mark.parametrize("garbage", GARBAGE_USER_DATA)
def test_read_member_data_defaults_and_logs_on_garbage(
    garbage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="streamassign.consumer"):
        assert read_member_data("member-7", garbage) == MemberData()
    assert "member-7" in caplog.text


def test_read_member_data_empty_and_valid(caplog: pytest.LogCaptureFixture) -> None:
    data = MemberData(priority=4, weight=2, owned_partitions=[("t", 1)], generation=9)
    with caplog.at_level(logging.WARNING, logger="streamassign.consumer"):
        assert read_member_data("m", b"") == MemberData()
        assert read_member_data("m", data.encode()) == data
    assert not caplog.records


@pytest.mark.parametrize("weight", [0, -1, 1.5, "2"])
def test_invalid_weight_is_rejected(weight: object) -> None:
    with pytest.raises(ValueError):
        MemberData(weight=weight)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ known bugs

HUGE_RUN = """
import resource, struct
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from streamassign.consumer import MemberData, UserDataError
data = MemberData(owned_partitions=[("t", 0)]).encode()
data = data[:-8] + struct.pack(">ii", 2**31 - 1, 2**31 - 1)  # partitions up to 2**32 - 3
try:
    MemberData.decode(data)
except UserDataError:
    print("UserDataError")
"""


def run_capped(script: str) -> list[str]:
    """``script`` in a fresh interpreter (it caps its own memory at 2 GiB); the words it
    printed. A decode that does not end within 5 s fails the test."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(script)],
            capture_output=True,
            text=True,
            timeout=5,
            env=os.environ.copy(),
        )
    except subprocess.TimeoutExpired:
        pytest.fail("decode did not finish within 5 s")
    assert out.returncode == 0, out.stderr[-500:]
    return out.stdout.split()


@pytest.mark.skipif(sys.platform == "win32", reason="uses resource limits")
def test_huge_run_is_rejected_quickly() -> None:
    assert run_capped(HUGE_RUN) == ["UserDataError"]


def test_negative_partitions_are_rejected_both_ways() -> None:
    """Encoding refuses a negative partition; bytes that carry one (a run from -1) are garbage
    on decode, and a leader reading them falls back to no history."""
    with pytest.raises(ValueError, match="partition of 't'"):
        MemberData(owned_partitions=[("t", -1), ("t", 0), ("t", 1)])
    head = MemberData().encode()[:-4]  # without the empty partitions section
    data = head + struct.pack(">ih", 1, 1) + b"t" + struct.pack(">iii", 1, -1, 3)
    with pytest.raises(UserDataError, match="bad partition run -1"):
        MemberData.decode(data)
    assert read_member_data("m", data) == MemberData()


@pytest.mark.parametrize(
    "fields", [{"priority": 2**31}, {"generation": -(2**31) - 1}, {"weight": 2**31}]
)
def test_out_of_range_fields_are_rejected_with_value_error(fields: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        MemberData(**fields).encode()


# ------------------------------------------------------------------------------ decode budget

BOMB = """
import resource, struct
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from streamassign.consumer.userdata import (
    AssignmentData, MemberData, UserDataError, read_member_data,
)
runs = struct.pack(">ih", 1, 1) + b"t" + struct.pack(">iii", 1, 0, 1 << 24)  # t: 0..2**24-1
member = struct.pack(">iiiiii", 1, 1, -1, 0, 1, 0) + runs  # 43 bytes
assignment = struct.pack(">iiihb", 1, 1, 0, 0, 0) + runs
for decode, data in [(MemberData.decode, member), (AssignmentData.decode, assignment)]:
    try:
        decode(data)
    except UserDataError:
        print("UserDataError")
print(read_member_data("m", member) == MemberData())
"""


@pytest.mark.skipif(sys.platform == "win32", reason="uses resource limits")
def test_43_bytes_claiming_2_24_partitions_are_rejected_before_any_is_built() -> None:
    """Reproducer of the audit: this took 87 s and 3.4 GB. Now each decode raises at once,
    and read_member_data falls back to the defaults."""
    assert run_capped(BOMB) == ["UserDataError", "UserDataError", "True"]


def _with_runs(runs: dict[str, list[tuple[int, int]]]) -> bytes:
    """MemberData(priority=5, weight=2) with hand-written runs (any order, any overlap)."""
    data = MemberData(priority=5, weight=2).encode()[:-4] + struct.pack(">i", len(runs))
    for topic, pairs in runs.items():
        name = topic.encode()
        data += struct.pack(">h", len(name)) + name + struct.pack(">i", len(pairs))
        data += b"".join(struct.pack(">ii", first, length) for first, length in pairs)
    return data


def test_budget_is_the_total_over_all_runs_and_topics() -> None:
    """Room for a failover primary owning every partition of a 1M-partition group (as the
    docs promise); one partition more over several topics and runs is garbage."""
    assert MAX_PARTITIONS >= 1_000_000
    half = MAX_PARTITIONS // 2
    fits = _with_runs({"a": [(0, half - 1), (half, 1)], "b": [(0, MAX_PARTITIONS - half)]})
    assert MemberData.decode(fits, partitions_per_topic={}).weight == 2
    over = _with_runs({"a": [(0, half), (half + 1, 1)], "b": [(0, MAX_PARTITIONS - half)]})
    with pytest.raises(UserDataError, match="more than"):
        MemberData.decode(over, partitions_per_topic={})
    assert read_member_data("m", over, partitions_per_topic={}) == MemberData()


def test_partitions_per_topic_builds_only_existing_partitions() -> None:
    data = _with_runs({"t": [(0, 1000)], "u": [(0, 5)], "gone": [(0, 7)]})
    kept = MemberData.decode(data, partitions_per_topic={"t": 3, "u": 0})
    assert kept.owned_partitions == tuple(TopicPartition("t", p) for p in range(3))
    assert (kept.priority, kept.weight) == (5, 2)
    assert MemberData.decode(data, partitions_per_topic={}) == attrs.evolve(
        kept, owned_partitions=()
    )
    assert len(MemberData.decode(data).owned_partitions) == 1012


def test_runs_in_any_order_decode_sorted_and_unique() -> None:
    """What this library writes is sorted and decoded without a re-sort; anything else (another
    writer, overlapping runs) is still sorted and de-duplicated."""
    data = _with_runs({"b": [(5, 2), (0, 3), (1, 2)], "a": [(0, 1)]})
    owned = MemberData.decode(data).owned_partitions
    assert owned == tuple(
        TopicPartition(*tp) for tp in [("a", 0)] + [("b", p) for p in (0, 1, 2, 5, 6)]
    )
    canonical = MemberData.decode(MemberData(owned_partitions=owned).encode()).owned_partitions
    assert canonical == owned and type(canonical) is tuple
