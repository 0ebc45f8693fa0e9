"""``streamassign explain``: every task that moved between two saved assignments (or at the last
rebalance of one snapshot), and the rule that moved it."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .. import TaskId
from ..compare import landing_state
from ..explain import (
    Explanation,
    Snapshot,
    claim_conflicts,
    explain,
    likely_zombies,
    named_as_after,
)
from ..streams import (
    FAUST_PROTOCOL_NAME,
)
from .console import _Stdout
from .group import main
from .labels import _process_labels
from .options import _EXISTING_FILE, _acceptable_lag_option, _json_option
from .snapshots import _compared_with, _read_saved
from .views import _moves_json, _print_moves, _warn_conflicts


@main.command(name="explain")
@click.argument("files", nargs=-1, type=_EXISTING_FILE, metavar="BEFORE AFTER | --last NOW")
@click.option(
    "--last",
    is_flag=True,
    help="Explain the last rebalance from one describe --json snapshot NOW: its members' offset "
    "sums give each process's actives before it (active moves only).",
)
@_acceptable_lag_option(
    "acceptable_recovery_lag of the group's leader (ProcessHost's; the Faust assignor's is the "
    "default): a restarted process further behind is not handed a task back."
)
@_json_option("tables")
def explain_command(
    files: tuple[Path, ...], last: bool, acceptable_lag: int, as_json: bool
) -> None:
    """Every task that moved from BEFORE to AFTER, and the rule that moved it.

    Both are saved assignments ('plan --json' or 'describe --json' output). The offset sums
    in AFTER (describe --json) tell a landing on local state from a cold one. The tables name
    processes by unique prefixes, as describe's do; --json has the full ids.
    """
    if len(files) != (1 if last else 2):
        raise click.UsageError(
            "give one snapshot with --last" if last else "give BEFORE and AFTER, or --last NOW"
        )
    if last:
        now = _read_last(files[0])
        moves, processes, contested = _last_moves(now, files[0], acceptable_lag)
        names = None  # --last refuses consumer groups: no reports
    else:
        contested = {}
        new = _read_saved(files[1])
        compared = _compared_with(_read_saved(files[0]), new, files[0], files[1])
        old = compared.before
        # BEFORE's processes as AFTER names them: a clash of a shared process id that starts
        # or ends between the two renames the original (P <-> P#endpoint), which moved nothing.
        before_views = named_as_after(old.views, old.process_members, new.process_members)
        # AFTER's previous_active date from its last join: a hand-back made at that rebalance.
        moves = explain(
            before_views,
            new.views,
            landing_state(old, new),
            returned=new.handed_back(acceptable_lag),
        )
        processes = [*before_views, *new.views]
        names = compared.names
    if as_json:
        data = _moves_json(moves, names)
        click.echo(json.dumps({"moves": data["moves"]} if last else data, indent=2))
    else:
        # Labelled as describe labels them, unique among every process of the files.
        _print_moves(
            _Stdout(),
            moves,
            standbys=not last,
            labels=_process_labels(processes),
            uncertain_hand_backs=(now if last else new).protocol != FAUST_PROTOCOL_NAME,
            names=names,
            contested=contested,
            zombies_named=(now if last else new).protocol == FAUST_PROTOCOL_NAME,
        )


def _last_moves(
    now: Snapshot, path: Path, acceptable_lag: int
) -> tuple[Explanation, list[str], dict[TaskId, tuple[str, ...]]]:
    """``explain --last``'s moves of ``now`` (read from ``path``), every process they name,
    and the tasks whose owner before was picked by the sticky assignor's tie-break among
    several claimants not taken as likely zombies (with those claimants); its warnings
    of claims no assignment can hold said on stderr."""
    before = now.before_last_join()
    # Two processes reporting one task running: a zombie beside its task's new owner.
    zombies = likely_zombies(before, now.protocol)
    processes = [*before, *now.views]
    conflicts = claim_conflicts(before, zombies=zombies)
    _warn_conflicts(conflicts, f"{path} (before its last rebalance)", _process_labels(processes))
    # The tie-break's candidates: a likely zombie's claim is read as state it holds.
    candidates = {
        task: tuple(pid for pid in claimants if pid not in zombies)
        for task, claimants, _ in conflicts.duplicate_actives
    }
    contested = {task: pids for task, pids in candidates.items() if len(pids) > 1}
    moves = explain(
        before,
        now.views,
        now.local_state(),
        from_last_join=True,
        returned=now.handed_back(acceptable_lag),
        zombies=zombies,
    )
    return moves, processes, contested


def _read_last(path: Path) -> Snapshot:
    """``explain --last``'s snapshot; refused unless its members report offset sums."""
    now = _read_saved(path)
    if not now.reports or now.family not in (None, "streams"):
        family = f" (protocol family {now.family})" if now.family else ""
        raise click.ClickException(
            f"{path}: no member reports offset sums{family}: --last needs a describe "
            "--json snapshot of a streams-protocol group (ProcessHost, the Faust drop-in "
            "assignor)"
        )
    return now
