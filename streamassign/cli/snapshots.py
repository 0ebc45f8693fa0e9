"""Saved assignments read by ``plan --before``, ``explain`` and ``diff``."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import click

from ..compare import SnapshotsCompared, compare_snapshots
from ..errors import StreamAssignError
from ..explain import (
    Snapshot,
    claim_conflicts,
    load_snapshot,
)
from .console import _say_wrapped
from .views import _warn_conflicts

#: A saved assignment larger than this is refused before parsing: 100k tasks over 1,000 clients
#: take about 2 MB, so this is far past any real group and still cheap to read.
_MAX_SAVED_BYTES = 64 * 1024 * 1024


def _read_snapshot(path: Path, *, members: bool = True) -> Snapshot:
    """A saved assignment file, or one ``ClickException`` line saying what is wrong with it
    (``members`` False: its members' rows are not read, see ``load_snapshot``)."""
    try:
        if path.stat().st_size > _MAX_SAVED_BYTES:
            raise click.ClickException(f"{path}: larger than {_MAX_SAVED_BYTES} bytes")
        return load_snapshot(json.loads(path.read_bytes()), str(path), members=members)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise click.ClickException(f"{path}: cannot read a saved assignment: {reason}") from exc
    except StreamAssignError as exc:
        raise click.ClickException(str(exc)) from exc


def _read_saved(path: Path, *, members: bool = True) -> Snapshot:
    """:func:`_read_snapshot`, and a warning line per kind of claim in it that no assignment
    can hold."""
    snapshot = _read_snapshot(path, members=members)
    _warn_conflicts(claim_conflicts(snapshot.views), str(path))
    return snapshot


def _compared_with(old: Snapshot, new: Snapshot, before: Path, after: Path) -> SnapshotsCompared:
    """BEFORE (``old``) as ``explain``/``diff`` compare it with AFTER (``new``)
    (``compare.compare_snapshots``: a consumer group's tasks matched by partition), its note
    of a renumbering and its warnings that the files may not be one group's said on stderr."""
    compared = compare_snapshots(old, new, str(before), str(after))
    _say_wrapped(compared.switch_note)
    for line in compared.lines:
        click.echo(line, err=True)
    return compared


def _members_read_if_switched(
    old: Snapshot, new: Snapshot, before: Path, after: Path
) -> tuple[Snapshot, Snapshot]:
    """Two files read without their member rows (``diff``), given their processes' members
    when the two say other assignor protocols: only a member id or endpoint tells which
    process of one is which of the other then (``compare.compare_snapshots``). Rows that do
    not read leave a file as it was: its processes are then matched by key."""
    if old.protocol is None or new.protocol is None or old.protocol == new.protocol:
        return old, new
    read = []
    for snapshot, path in ((old, before), (new, after)):
        try:
            members = _read_snapshot(path).process_members
        except click.ClickException:
            members = snapshot.process_members
        read.append(attrs.evolve(snapshot, process_members=members))
    return read[0], read[1]
