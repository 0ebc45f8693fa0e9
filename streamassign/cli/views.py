"""What ``plan``, ``explain`` and ``describe`` print of an assignment: moves (tables and JSON),
standby rows, and the warnings about claims and standbys that cannot be held."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from .. import TaskId
from ..compare import (
    PartitionNames,
)
from ..explain import (
    ClaimConflicts,
    Explanation,
    Reason,
    StandbyMove,
)
from ..text import counted, listed
from .console import _say, _say_wrapped


def _tasks_cell(tasks: frozenset[TaskId]) -> str:
    """A table cell of tasks: ``3: 0_1, 0_4, 1_2``, or ``0`` for none."""
    return f"{len(tasks)}: {listed(sorted(tasks))}" if tasks else "0"


def _too_few_for_standbys(
    standbys: int, clients: int, stateful_count: int, noun: tuple[str, str] = ("client", "clients")
) -> str | None:
    """What ``standbys`` replicas per stateful task cannot be with ``clients`` clients (or
    processes, ``noun``: singular and plural): a copy never sits beside its active, so each task
    gets at most clients - 1 (the metrics count against that cap); None when they fit."""
    if not stateful_count or standbys <= clients - 1:
        return None
    return (
        f"--standbys {standbys} needs {counted(standbys + 1, *noun)}; with {clients} each "
        f"stateful task gets {counted(max(0, clients - 1), 'standby')}"
    )


def _warn_conflicts(
    conflicts: ClaimConflicts, where: str, labels: Mapping[str, str] | None = None
) -> None:
    """One warning line (on stderr) per kind of claim no assignment can hold, naming the tasks
    and clients and saying how they are read; ``where`` (a file) starts each line. With
    ``labels`` (how the tables name processes) the lines name them so, wrapped to the
    terminal's width: full ids made one line of hundreds of characters."""
    prefix = f"warning: {where}: " if where else "warning: "

    def name(pid: str) -> str:
        return pid if labels is None else labels.get(pid, pid)

    def say(line: str) -> None:
        (_say if labels is None else _say_wrapped)(line)

    duplicates = conflicts.duplicate_actives
    if conflicts.zombies:
        zombies = listed([name(pid) for pid in conflicts.zombies])
        noun = "likely a zombie" if len(conflicts.zombies) == 1 else "likely zombies"
        say(
            f"{prefix}{zombies}: {noun}, a guess: every task it reported running another "
            "process reports too, as when a worker paused past its session comes back; its "
            "claims are read as state it holds, the other claimants' as the tasks' owners"
        )
    if duplicates:
        among = " among those not likely zombies" if conflicts.zombies else ""
        kept_by = f"the sticky assignor keeps{among} (smallest lag, then process id)"
        claims = listed(
            [
                f"{task} on {', '.join(map(name, pids))} ({name(kept)} kept)"
                for task, pids, kept in duplicates
            ],
            separator="; ",
        )
        say(
            f"{prefix}{counted(len(duplicates), 'task')} active on several clients: "
            f"{claims}; each is taken as run by the claimant {kept_by}, the others as "
            "holding its state"
        )
    both = conflicts.active_and_standby
    if both:
        claims = listed([f"{task} on {name(pid)}" for task, pid in both])
        say(
            f"{prefix}{counted(len(both), 'task')} both active and standby on one client: "
            f"{claims}; counted as active there"
        )


def _ids(tasks: frozenset[TaskId]) -> list[str]:
    return [str(t) for t in sorted(tasks)]


def _moves_json(moves: Explanation, names: PartitionNames | None = None) -> dict[str, Any]:
    """``--json``'s moves; with ``names`` (a consumer group) each says its partition."""

    def task(t: TaskId) -> dict[str, Any]:
        return {"task": str(t)} if names is None else names.as_json(t)

    return {
        "moves": [
            task(m.task)
            | {
                "from": m.source,
                "to": m.destination,
                "reason": str(m.reason),
                "landing": None if m.landing is None else str(m.landing),
            }
            for m in moves.actives
        ],
        "standby_moves": [
            task(c.task) | {"from": c.source, "to": c.destination, "reason": str(c.reason)}
            for c in moves.standbys
        ],
    }


#: Below a moves table with a hand-back: what one snapshot cannot confirm of it.
_HANDED_BACK_NOTE = (
    "handed back: the new owner ran the task before it restarted and reported a checkpoint of "
    "it; the leader hands a task back only when that checkpoint is caught up (within "
    "acceptable_recovery_lag), which a snapshot cannot confirm (it holds no end offsets): if "
    "not, it was a balance move"
)


def _print_moves(
    console: Console,
    moves: Explanation,
    standbys: bool = True,
    labels: Mapping[str, str] | None = None,
    *,
    uncertain_hand_backs: bool = True,
    names: PartitionNames | None = None,
    contested: Mapping[TaskId, Sequence[str]] | None = None,
    zombies_named: bool = True,
) -> None:
    """A table of the actives that moved and one of the standbys; one line for either kind
    when none moved (an empty bordered table reads as missing data). Without ``standbys``
    (``explain --last``: previous standbys are not known) a line says why they are missing.
    ``labels``: how the tables name processes (``_process_labels``; None: by their ids).
    ``uncertain_hand_backs``: a line says what a snapshot cannot confirm of a hand-back (false
    for the Faust leader, which measures lags as a snapshot does, without end offsets).
    ``names``: a consumer group's tasks shown by partition. ``contested``: tasks whose owner
    before is the tie-break's pick among these claimants (``explain --last``), marked;
    ``zombies_named``: whether likely zombies were left out of them (Faust groups only)."""
    name = _labeller(labels)
    task = str if names is None else names.label
    first = "task" if names is None else "partition"
    if moves.actives:
        table = Table(title=f"Active tasks that moved ({len(moves.actives)})")
        for col in (first, "from", "to", "why", "state there"):
            table.add_column(col)
        for m in moves.actives:
            source = name(m.source) + (f" {_CONTESTED}" if m.task in (contested or {}) else "")
            table.add_row(task(m.task), source, name(m.destination), m.reason, m.landing or "-")
        console.print(table)
        # The rest had no owner in the group to move from: its owner left, or the task is new.
        console.print(
            f"{moves.moves} of {len(moves.actives)} taken off a process still in the group "
            "(the moves plan counts)"
        )
        if uncertain_hand_backs and any(m.reason == Reason.HANDED_BACK for m in moves.actives):
            console.print(_HANDED_BACK_NOTE)
    else:
        console.print("no active task moved")
    if contested:
        legend = _contested_legend(moves, contested, name, zombies_named=zombies_named)
        console.print(legend, markup=False)
    if not standbys:
        console.print(
            "standbys not shown: at a join a previous standby reports its state like any other "
            "local state (save BEFORE with describe --json to compare standbys)"
        )
    elif moves.standbys:
        _print_standby_moves(console, moves, _standby_rows(moves.standbys, name, task), first)
    else:
        console.print("no standby moved")


#: Beside a ``from`` the tie-break picked among several claimants (``_contested_legend``).
_CONTESTED = "(?)"


def _contested_legend(
    moves: Explanation,
    contested: Mapping[TaskId, Sequence[str]],
    name: Callable[[str], str],
    *,
    zombies_named: bool,
) -> str:
    """The line under the moves table that says what the ``_CONTESTED`` mark means, and which
    contested tasks show no move (their picked claimant runs them now: maybe a move all the
    same, from another claimant). ``contested``: each task's claimants not taken as likely
    zombies; ``zombies_named``: false where none is looked for (not a Faust group), which the
    line says, or a paused process's claims would read as checked."""
    moved = {m.task for m in moves.actives}
    still = [
        f"{t} ({' or '.join(map(name, pids))})"
        for t, pids in sorted(contested.items())
        if t not in moved
    ]
    parts = []
    if len(still) < len(contested):
        parts.append(
            f"{_CONTESTED}: reported running by several processes at the join: from is the "
            "claimant the tie-break keeps among those not taken as likely zombies (smallest "
            "lag, then process id), a guess"
        )
    if still:
        them = "them" if len(still) > 1 else "it"
        parts.append(
            f"contested and not listed (the claimant kept runs {them} now; a move from another "
            f"may hide): {listed(still)}"
        )
    if not zombies_named:
        parts.append(
            "zombies are looked for only in Faust groups: a paused process that came back "
            "reads like this too"
        )
    return "; ".join(parts)


def _print_standby_moves(
    console: Console, moves: Explanation, rows: Sequence[Sequence[str]], first: str
) -> None:
    """The table of standby copies dropped and placed (``rows``, ``_standby_rows``; ``first``:
    what its first column names), and how many of the drops became active there."""
    # Counted per change, not per row: a row of a copy that moved is one drop and one place.
    dropped = sum(1 for c in moves.standbys if c.source is not None)
    placed = len(moves.standbys) - dropped
    table = Table(title=f"Standby copies: {dropped} dropped, {placed} placed")
    for col in (first, "dropped by", "placed on", "why"):
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    # The plan's Quality table counts only the drops of copies not now active there.
    promoted = sum(1 for c in moves.standbys if c.reason == Reason.BECAME_ACTIVE)
    if promoted:
        console.print(
            f"{promoted} of the {dropped} dropped became active where they were (not counted "
            "as previous standbys dropped)"
        )


def _labeller(labels: Mapping[str, str] | None) -> Callable[[str | None], str]:
    """A moves table's name of a process (or ``-`` for none): its label, else its id."""

    def name(pid: str | None) -> str:
        return "-" if pid is None else (labels or {}).get(pid, pid)

    return name


def _standby_rows(
    copies: Sequence[StandbyMove],
    name: Callable[[str | None], str],
    task_name: Callable[[TaskId], str] = str,
) -> list[tuple[str, str, str, str]]:
    """Table rows of the standby changes: a task whose one dropped copy and one placed copy
    have the same reason is one row (the copy moved); anything else, one row per change.
    ``name``: a process as the table shows it (``_labeller``); ``task_name``: a task."""
    by_task: dict[TaskId, list[StandbyMove]] = {}
    for copy in copies:
        by_task.setdefault(copy.task, []).append(copy)
    rows = []
    for task, changes in by_task.items():
        if len(changes) == 2:
            drop, place = sorted(changes, key=lambda c: c.source is None)
            if drop.source and place.destination and drop.reason == place.reason:
                rows.append(
                    (task_name(task), name(drop.source), name(place.destination), str(drop.reason))
                )
                continue
        for c in changes:
            rows.append((task_name(task), name(c.source), name(c.destination), str(c.reason)))
    return rows
