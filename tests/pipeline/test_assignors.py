"""Assignor names: groups, unknown names, and peers that are not installed."""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

import pytest

from streamassign.pipeline import PipelineError, resolve
from streamassign.pipeline.assignors import GROUPS, SPECS


def test_groups_expand_in_order_without_duplicates() -> None:
    got = resolve(["task:sticky,consumer", "task:sticky"])
    assert got.names[0] == "task:sticky"
    assert got.names[1:] == GROUPS["consumer"]
    assert {s.name for s in SPECS} == set(GROUPS["all"])


def test_unknown_names_are_errors_listing_the_known_ones() -> None:
    with pytest.raises(PipelineError, match=r"unknown assignor 'stiky'; known: task:sticky, "):
        resolve(["stiky"])
    with pytest.raises(PipelineError, match="no assignor given"):
        resolve([" , "])


def test_missing_peers_are_skipped_with_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def without_peers(name: str, *args: Any) -> Any:
        return None if name in ("faust", "aiokafka") else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_peers)
    for name in ("faust", "aiokafka"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    got = resolve(["default"])
    assert got.names == ("task:sticky", "consumer:range", "consumer:sticky")
    assert got.notes == (
        "faust:copartitioned skipped: faust is not installed (pip install 'streamassign[faust]')",
        "aiokafka:sticky skipped: aiokafka is not installed (pip install 'streamassign[aiokafka]')",
    )
    with pytest.raises(PipelineError, match="no assignor left to run: faust:copartitioned"):
        resolve(["faust:copartitioned"])


def test_peers_already_imported_count_as_installed() -> None:
    """faust sets its ``__spec__`` to None once imported, and ``find_spec`` then raises."""
    pytest.importorskip("faust")
    assert resolve(["all"]).names == resolve(["all"]).names == GROUPS["all"]


@pytest.mark.skipif(not os.environ.get("CI"), reason="a local run may lack a peer on purpose")
def test_ci_has_every_peer_installed() -> None:
    """In CI every peer runs: a missing one would only be a note, and the comparisons that
    need it would silently shrink to ours alone."""
    assert [s.missing() for s in SPECS if s.missing() is not None] == []


def test_is_default_group_reads_a_manifests_resolved_names() -> None:
    """The manifest keeps the resolved names, not the words given: the default group is its
    members in order, peers not installed left out; any other list was chosen."""
    from streamassign.pipeline.assignors import GROUPS, is_default_group

    assert is_default_group(list(GROUPS["default"]))
    assert is_default_group(["task:sticky", "consumer:range", "consumer:sticky"])
    assert is_default_group(
        ["task:sticky", "faust:copartitioned", "consumer:range", "consumer:sticky"]
    )
    for chosen in (["task:sticky"], ["consumer:range", "task:sticky", "consumer:sticky"], [], None):
        assert not is_default_group(chosen)
    assert not is_default_group([*GROUPS["default"], "task:ha"])
