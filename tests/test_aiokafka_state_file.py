"""``GroupAssignor(state_file=...)`` when saving fails: one warning per episode, naming the file."""

from __future__ import annotations

import errno
import logging
from pathlib import Path
from typing import Any

import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

from streamassign.aiokafka import GroupAssignor
from streamassign.aiokafka import consumer as adapter
from streamassign.consumer import StickyAssignor
from streamassign.consumer.userdata import MemberData


class Cluster:
    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return set(range(4)) if topic == "t" else None


def rebalance(member: GroupAssignor) -> None:
    """One round led by ``member`` alone, ending in its ``on_assignment`` (which saves)."""
    out = member.assign(Cluster(), {"a": member.metadata(["t"])})
    member.on_assignment(ConsumerProtocolMemberAssignment.decode(out["a"]))


def state_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if "assignor state" in r.message]


def test_a_full_disk_is_said_once_and_its_end_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "member.state"
    full = [True]
    real_write = adapter.write_atomically

    def write(path: Any, data: bytes, **kw: Any) -> None:
        if full[0]:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(path, data, **kw)

    monkeypatch.setattr(adapter, "write_atomically", write)
    member = GroupAssignor(StickyAssignor(), state_file=state)
    caplog.set_level(logging.INFO, logger="streamassign.aiokafka")
    for _ in range(3):
        rebalance(member)
    assert state_lines(caplog) == [
        (
            logging.WARNING,
            f"cannot save assignor state to {state}: No space left on device (said once until "
            "a save works)",
        )
    ]
    assert not state.exists()

    caplog.clear()
    full[0] = False
    rebalance(member)
    rebalance(member)
    assert state_lines(caplog) == [(logging.INFO, f"assignor state saved to {state} again")]
    assert MemberData.decode(state.read_bytes()).generation == member._generation

    caplog.clear()
    full[0] = True
    rebalance(member)  # a new episode is said again
    assert [level for level, _ in state_lines(caplog)] == [logging.WARNING]


def test_a_missing_folder_is_reported_by_the_state_files_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "nodir" / "member.state"
    member = GroupAssignor(StickyAssignor(), state_file=state)
    caplog.set_level(logging.INFO, logger="streamassign.aiokafka")
    rebalance(member)
    rebalance(member)
    lines = state_lines(caplog)
    assert lines == [
        (
            logging.WARNING,
            f"cannot save assignor state to {state}: No such file or directory (said once "
            "until a save works)",
        )
    ]
    assert ".tmp" not in lines[0][1]

    caplog.clear()
    state.parent.mkdir()
    rebalance(member)
    assert state_lines(caplog) == [(logging.INFO, f"assignor state saved to {state} again")]
    restarted = GroupAssignor(StickyAssignor(), state_file=state)
    assert len(MemberData.decode(restarted.metadata(["t"]).user_data).owned_partitions) == 4
