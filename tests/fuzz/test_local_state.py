"""State directories holding random trees: checkpoints, ``assignment.json`` and ``process.id``
with damaged bytes (from valid ones, and tests/test_localstate.py's documents), files where
directories belong, directories where files belong, links that lead nowhere or in a loop,
oddly named task directories. Opening the directory, ``offset_sums()`` and
``read_assignment()`` never raise; what they return is plausible (task ids int32s >= 0, sums in
``[0, 2**63)``) and the same after a reopen; nothing is deleted: every path the tree held is
still there, or moved aside as a ``.damaged-*`` sibling with its content; within the
per-example CPU-time bound and ``STATE_PEAK`` bytes (tracemalloc)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from streamassign import TaskId
from streamassign.localstate import StateDirectory

from ..test_localstate import DEEP, DOCUMENTS
from .damage import FUZZ, bounded, damaged

#: What opening and reading one of these small trees may allocate.
STATE_PEAK = 4 << 20
ID_LIMIT, OFFSET_LIMIT = 2**31, 2**63

TASK_NAMES = ["0_0", "0_1", "1_3", "2147483647_0", "2147483648_0", "0_01", "-1_0", "x", "0_0 "]
#: Where an entry may sit: the files the directory holds, task directories and their content.
PLACES = st.one_of(
    st.sampled_from(["process.id", "assignment.json", "tasks", "notes.txt"]),
    st.sampled_from(TASK_NAMES).map(lambda t: f"tasks/{t}"),
    st.tuples(
        st.sampled_from(TASK_NAMES), st.sampled_from(["checkpoint", "checkpoint/x", "y"])
    ).map(lambda tc: f"tasks/{tc[0]}/{tc[1]}"),
)
CHECKPOINT = json.dumps({"orders-changelog": {"0": 12, "1": 2**62}}).encode()
ASSIGNMENT = json.dumps({"0": ["0_0", "1_3"], "1": []}).encode()
PROCESS_ID = str(uuid.UUID(int=7)).encode()
#: Valid contents of every file kind, for ``damaged`` to work on.
SEEDS = st.sampled_from([CHECKPOINT, ASSIGNMENT, PROCESS_ID])
CONTENTS = st.one_of(
    damaged(SEEDS),
    DOCUMENTS.map(lambda d: d.encode("utf-8", "surrogatepass")),
    st.sampled_from([DEEP.encode(), b"", b"\xff\xfe", b"1e400", b"NaN"]),
)
#: An entry: where, what (a file, a directory, a link to nowhere or to itself) and content.
DAMAGED = st.tuples(
    PLACES, st.sampled_from(["file", "file", "file", "dir", "dangling", "loop", "lock"]), CONTENTS
)
#: Valid state next to the damage, so reads have something to return and to keep.
VALID = st.one_of(
    st.sampled_from(["0_0", "0_1", "1_3", "2147483647_0"]).map(
        lambda t: (f"tasks/{t}/checkpoint", "file", CHECKPOINT)
    ),
    st.just(("assignment.json", "file", ASSIGNMENT)),
    st.just(("process.id", "file", PROCESS_ID)),
)
ENTRIES = st.lists(st.one_of(DAMAGED, VALID), max_size=12)


def build(root: Path, entries: list[tuple[str, str, bytes]]) -> None:
    """Create each entry that still fits (its parents are directories or can be made)."""
    for place, kind, content in entries:
        path = root / (".lock" if kind == "lock" else place)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if os.path.lexists(path):
                continue
            if kind == "lock":  # a directory where the lock file belongs
                path.mkdir()
                (path / "x").write_bytes(content)
            elif kind == "file":
                path.write_bytes(content)
            elif kind == "dir":
                path.mkdir()
            elif kind == "dangling":
                path.symlink_to(root / "nowhere")
            else:
                path.symlink_to(path)
        except OSError:  # a file or a looping link where a parent directory would go
            continue


def snapshot(root: Path) -> dict[Path, bytes | None]:
    """Every path under ``root`` (relative) and a file's content (``None``: a dir or link)."""
    found: dict[Path, bytes | None] = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory, name)
            regular = path.is_file() and not path.is_symlink()
            found[path.relative_to(root)] = path.read_bytes() if regular else None
    return found


def whereabouts(root: Path, relative: Path) -> list[Path]:
    """Where ``relative`` may be now: in place, or under moved-aside ancestors (itself
    included); a path set aside and made anew (``process.id``, ``tasks``) is in both."""
    candidates = [root]
    for part in relative.parts:
        candidates = [
            found
            for base in candidates
            for found in [base / part, *base.glob(f"{part}.damaged-*")]
            if os.path.lexists(found)
        ]
    return candidates


def plausible(task: TaskId) -> bool:
    return 0 <= task.subtopology < ID_LIMIT and 0 <= task.partition < ID_LIMIT


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as directory:
        yield Path(directory)


@FUZZ
@given(ENTRIES)
def test_damaged_state_directories(workdir: Path, tree: list[tuple[str, str, bytes]]) -> None:
    root = workdir / uuid.uuid4().hex
    root.mkdir()
    build(root, tree)
    before = snapshot(root)
    try:
        with bounded(STATE_PEAK):
            state = StateDirectory(root)
            sums = state.offset_sums()
            last = state.read_assignment()
        state.close()
        event(f"{len(sums)} sums, {len(last)} consumers")
        assert all(plausible(t) and 0 <= s < OFFSET_LIMIT for t, s in sums.items()), sums
        assert all(0 <= i < ID_LIMIT and all(plausible(t) for t in ts) for i, ts in last.items()), (
            last
        )
        for relative, content in before.items():
            now = whereabouts(root, relative)
            assert now, f"{relative} is gone"
            if content is not None:
                kept = [p for p in now if p.is_file() and p.read_bytes() == content]
                assert kept, f"{relative}: its content is gone"
        again = StateDirectory(root)  # what was set aside stays aside; the rest reads the same
        assert (again.process_id, again.offset_sums(), again.read_assignment()) == (
            state.process_id,
            sums,
            last,
        )
        again.close()
    finally:
        shutil.rmtree(root)
