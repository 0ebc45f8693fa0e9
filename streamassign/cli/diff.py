"""``streamassign diff``: per client, the tasks gained and lost between two saved assignments."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.table import Table

from ..assignment import ClientAssignment
from .console import _Stdout
from .group import main
from .labels import _process_labels
from .options import _EXISTING_FILE, _json_option
from .snapshots import _compared_with, _members_read_if_switched, _read_saved
from .views import _ids


@main.command()
@click.argument("before", type=_EXISTING_FILE)
@click.argument("after", type=_EXISTING_FILE)
@_json_option("a table")
def diff(before: Path, after: Path, as_json: bool) -> None:
    """Per client: tasks gained (+) and lost (-) from BEFORE to AFTER (saved assignments)."""
    old_file, new_file = _members_read_if_switched(
        _read_saved(before, members=False), _read_saved(after, members=False), before, after
    )
    old_file = _compared_with(old_file, new_file, before, after).before
    old, new = old_file.views, new_file.views
    rows = {}
    for pid in sorted(old.keys() | new.keys()):
        was = old[pid].assignment if pid in old else ClientAssignment()
        now = new[pid].assignment if pid in new else ClientAssignment()
        changes = {
            f"{sign}{kind}": _ids(frozenset(getattr(a, kind)) - getattr(b, kind))
            for kind in ("active", "standby", "warmup")
            for sign, a, b in (("+", now, was), ("-", was, now))
        }
        if any(changes.values()) or (pid in old) != (pid in new):
            status = "joined" if pid not in old else "left" if pid not in new else "changed"
            rows[pid] = {"status": status, **changes}
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(f"{before.name} -> {after.name}: no client changed")
        return
    # Named as describe and explain name them (unique among every client of both, as there):
    # rich cut the ids' heads at 80 columns.
    labels = _process_labels(old.keys() | new.keys())
    table = Table(title=f"{before.name} -> {after.name}: {len(rows)} client(s) changed")
    for col in ("client", "status", "active", "standby", "warmup"):
        table.add_column(col)
    for pid, row in rows.items():
        cells = [
            " ".join([*(f"+{t}" for t in row[f"+{k}"]), *(f"-{t}" for t in row[f"-{k}"])]) or "="
            for k in ("active", "standby", "warmup")
        ]
        table.add_row(labels[pid], str(row["status"]), *cells)
    _Stdout().print(table)
