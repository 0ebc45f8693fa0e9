"""Every reader of JSON from outside on arbitrary JSON and bytes: ``files.loads_json`` itself,
``describe``'s decoder of Faust's own protocol (documented "never raises"), the runtime's
commit marker decoder (a raise fails every restore of the task) and the Faust assignor's state
file reader (documented "logged, never raised"). Python's ``json`` reads ``NaN``,
``Infinity`` and ``1e999`` (a float infinity), which ``int()`` turns into ``OverflowError``,
and deep nesting into ``RecursionError``: neither may escape.

Documents are Faust-, marker- and state-shaped with any JSON value (or a raw number token such
as ``1e999``) at any leaf, then also damaged with ``damage.damaged``."""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from streamassign import TaskId, TopicPartition
from streamassign.aiokafka.describe import FAUST_OWN_PROTOCOL_NAME, RawMember, decode_member
from streamassign.aiokafka.wire import encode_assignment
from streamassign.errors import DamagedStateError, ProtocolError
from streamassign.faust.assignor import _read_state
from streamassign.files import loads_json
from streamassign.protocol import AssignmentInfo
from streamassign.runtime.changelog import read_marker

from ..test_describe import meta
from .damage import EXAMPLE_CPU_SECONDS, FUZZ, damaged, within_cpu

#: Number tokens as they appear in JSON text, the non-finite ones included (``json.dumps``
#: writes ``Infinity`` and ``NaN`` but never ``1e999``), and nesting past the parser's limit.
NUMBER_TOKENS = st.sampled_from(
    [
        "0",
        "1",
        "-1",
        "2.5",
        "2147483648",
        "9" * 40,
        "1e999",
        "-1e999",
        "1e-999",
        "Infinity",
        "-Infinity",
        "NaN",
        "[" * 3000 + "]" * 3000,
    ]
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
#: A leaf of a shaped document: a number token, or any JSON value as ``json.dumps`` writes it;
#: a small number (a partition, a group, an offset) weighted up, so that some documents decode.
SMALL = st.integers(0, 3).map(str)
LEAVES = st.one_of(SMALL, SMALL, SMALL, NUMBER_TOKENS, JSON_VALUES.map(json.dumps))
TOPICS = st.sampled_from(['"words"', '"other"', '""'])


@st.composite
def faust_assignments(draw: st.DrawFn) -> str:
    """Faust's ``ClientMetadata`` assignment JSON with drawn leaves."""

    def parts() -> str:
        entries = draw(st.lists(st.tuples(TOPICS, st.lists(LEAVES, max_size=3)), max_size=2))
        return ", ".join(f"{t}: [{', '.join(ps)}]" for t, ps in entries)

    groups = ", ".join(f"{t}: {g}" for t, g in draw(st.lists(st.tuples(TOPICS, LEAVES))))
    body = draw(
        st.one_of(st.just(f'{{"actives": {{{parts()}}}, "standbys": {{{parts()}}}}}'), LEAVES)
    )
    return f'{{"assignment": {body}, "topic_groups": {{{groups}}}}}'


#: The bounds of an applied offset (a repartition position reaches 2**83), either side.
POSITION_BOUNDS = st.sampled_from([str(2**83 - 1), str(2**83), str(2**63)])


@st.composite
def markers(draw: st.DrawFn) -> str:
    offsets = st.one_of(LEAVES, POSITION_BOUNDS)
    applied = ", ".join(f"{t}: {o}" for t, o in draw(st.lists(st.tuples(TOPICS, offsets))))
    return f'{{"applied": {{{applied}}}}}'


@st.composite
def state_files(draw: st.DrawFn) -> str:
    """The Faust assignor's saved assignment (``_save``) with drawn leaves."""
    task = st.one_of(st.sampled_from(['"0_1"', '"1_0"']), LEAVES)
    tasks = st.lists(task, max_size=2).map(", ".join)
    subtopology = st.one_of(SMALL, st.text(max_size=3)).map(json.dumps)
    topics = ", ".join(
        f"{s}: {{{t}: {n}}}"
        for s, t, n in draw(st.lists(st.tuples(subtopology, TOPICS, LEAVES), max_size=2))
    )
    return f'{{"active": [{draw(tasks)}], "standby": [{draw(tasks)}], "topics": {{{topics}}}}}'


def _texts(shaped: st.SearchStrategy[str]) -> st.SearchStrategy[bytes]:
    """Shaped documents, any JSON value, and both damaged (random bytes included); shaped
    ones weighted up, so that some decode."""
    seeds = st.one_of(shaped, shaped, JSON_VALUES.map(json.dumps)).map(str.encode)
    return st.one_of(seeds, seeds, damaged(seeds))


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True


@FUZZ
@given(_texts(st.one_of(faust_assignments(), markers(), state_files())))
def test_loads_json_returns_finite_json_or_raises_its_error(data: bytes) -> None:
    try:
        with within_cpu(EXAMPLE_CPU_SECONDS):
            value = loads_json(data, ProtocolError, "JSON")
    except ProtocolError as exc:
        event(str(exc).split(",")[0][:30])
        return
    assert _finite(value)


@FUZZ
@given(JSON_VALUES.filter(_finite))
def test_loads_json_reads_every_finite_json_value_back(value: Any) -> None:
    with within_cpu(EXAMPLE_CPU_SECONDS):
        read = loads_json(json.dumps(value), ProtocolError, "JSON")
    assert read == value


@FUZZ
@given(_texts(faust_assignments()), _texts(st.just('{"url": "http://w1:6066"}')))
def test_describe_decodes_any_faust_json_or_says_why_never_raises(
    assignment: bytes, subscription: bytes
) -> None:
    raw = RawMember(
        "w1",
        metadata=meta(["words"], subscription),
        assignment=encode_assignment([TopicPartition("words", 0)], zlib.compress(assignment)),
    )
    with within_cpu(EXAMPLE_CPU_SECONDS):
        view = decode_member(FAUST_OWN_PROTOCOL_NAME, raw)
    event("undecodable" if view.undecodable else "decoded")
    if view.undecodable is None:
        assert all(isinstance(t, TaskId) for t in view.active | view.standby)


@FUZZ
@given(_texts(markers()))
def test_a_commit_marker_decodes_to_its_offsets_or_is_unreadable_never_raises(
    data: bytes,
) -> None:
    """Unreadable only without an ``applied`` object; else its offsets an owner writes, ints
    in [0, 2**83), exactly, and every other one refused (``int()`` took ``2.5``, ``true``,
    ``"12"``, ``-7``, 40 digits: a huge one made the store skip every later input record)."""
    try:
        with within_cpu(EXAMPLE_CPU_SECONDS):
            marker = read_marker(data)
    except DamagedStateError:
        event("unreadable")
        return
    event("some refused" if marker.refused else "offsets" if marker.applied else "none applied")
    assert all(type(o) is int and 0 <= o < 2**83 for o in marker.applied.values())
    written = json.loads(data)["applied"]
    owners = {t: (type(o), o) for t, o in written.items() if type(o) is int and 0 <= o < 2**83}
    assert {t: (type(o), o) for t, o in marker.applied.items()} == owners
    assert len(marker.refused) == len(written) - len(owners)


@pytest.fixture(scope="module")
def state_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One file every example overwrites (a directory per example cost seconds in CI)."""
    return tmp_path_factory.mktemp("faust-state") / "faust-assignment.json"


@FUZZ
@given(data=_texts(state_files()))
def test_the_faust_state_file_reads_or_is_ignored_never_raises(
    state_file: Path, data: bytes
) -> None:
    state_file.write_bytes(data)
    with within_cpu(EXAMPLE_CPU_SECONDS):
        info = _read_state(state_file)
    event("read" if info is not None else "ignored")
    assert info is None or isinstance(info, AssignmentInfo)
