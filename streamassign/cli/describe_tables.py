"""``describe``'s tables of a live group: processes, members, tasks, offset sums and the
assignment's quality."""

from __future__ import annotations

import sys
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from .. import TaskId
from ..streams import (
    merge_offset_sums,
)
from ..text import counted, partitions_by_topic
from .labels import _member_labels, _process_labels
from .views import _tasks_cell


def _client_at_host(member: Any) -> str:
    return f"{member.client_id}@{_host(member)}"


def _host(member: Any) -> str:
    """A member's host as Kafka gives it, without the leading slash (``/127.0.0.1``)."""
    return str(member.client_host.lstrip("/"))


def _state_note(state: str) -> str:
    if state in ("PreparingRebalance", "CompletingRebalance"):
        return f"{state} (rebalancing: the assignment is not readable until it is Stable)"
    if state == "Empty":
        return "Empty (no members)"
    return state


def _view_labels(view: Any, others: Iterable[str] = ()) -> dict[str, str]:
    """How ``view``'s tables name its processes (and ``others``, named in the same output),
    each unique among them all (``_process_labels``)."""
    return _process_labels([*view.processes(), *(m.process for m in view.members), *others])


def _print_group(
    console: Console, view: Any, score: Any, labels: Mapping[str, str] | None = None
) -> None:
    """``describe``'s tables of ``view``; ``labels`` name its processes (default:
    ``_view_labels``)."""
    members = len(view.members)
    processes = view.processes()
    member_labels = _member_labels(m.member_id for m in view.members)
    if not view.readable:
        _print_rebalancing(console, view, None)
        return
    # The group and protocol names are the members' choice: styled parts, never markup
    # (``escape`` gets a trailing backslash wrong).
    heading = (
        f": {view.state}, protocol {view.protocol or '-'} ({view.family}), {members} member(s) "
        f"in {len(processes)} process(es)"
    )
    leader_version = view.leader_version()
    if leader_version is not None:  # protocol 3: members announce theirs, named in the table
        heading += f", leader's topology version {leader_version}"
    console.print(Text.assemble((view.group, "bold"), heading))
    console.print(_stable_caveat(str(view.family)), style="dim", markup=False)
    labels = dict(labels or _view_labels(view))
    _print_processes(console, processes, view.endpoints(), labels)
    _print_members(console, view.members, labels | member_labels)
    _print_tasks(console, view.tasks, processes, labels)
    _print_offset_sums(console, view.members_by_process(), labels)
    # Consumer groups have no standbys: their standby row would only say 0 / 0; their "task"
    # t_p is partition p of topic t, named so.
    consumer = str(view.family) == "consumer"
    topics = {t.subtopology: tp.topic for t, ps in view.tasks.items() for tp in ps}
    _print_quality(console, score, has_standbys=not consumer, topics=topics if consumer else None)
    if score.metrics.load_imbalance > 0:
        console.print(_load_note(processes, labels), markup=False)


def _load_note(processes: Mapping[str, Any], labels: Mapping[str, str]) -> str:
    """What the quality table's load imbalance measures, with the two processes that set it:
    tasks held (active, standby, warmup) per thread. Where every process holds every task (as
    many standbys as processes - 1), the thread counts alone set it: say so, or a 2+1-thread
    app's 3.00 reads as an assignment to fix."""

    def per_thread(pid: str) -> float:
        return float(processes[pid].assignment.load / (processes[pid].capacity or 1))

    def held(pid: str) -> str:
        c = processes[pid]
        return f"{c.assignment.load}/{c.capacity or 1} = {per_thread(pid):.2f} on {labels[pid]}"

    ordered = sorted(processes, key=lambda pid: (per_thread(pid), pid))
    text = (
        "load imbalance: tasks held (active, standby, warmup) per thread, most "
        f"{held(ordered[-1])}, fewest {held(ordered[0])}"
    )
    a = [c.assignment for c in processes.values()]
    every = set().union(*(x.active | x.standby | x.warmup for x in a))
    if all(x.load == len(every) for x in a):
        text += (
            "; every process holds every task (an active or a standby copy), so the thread "
            "counts alone set it: no assignment with these standbys evens it"
        )
    return text


#: What a group in PreparingRebalance waits for, said under its member list. A member killed
#: without leaving is dropped when its session expires: with aiokafka's and Faust's defaults
#: the rebalance timeout is as long, not with a Java member's (its max.poll.interval.ms).
_WAITS = (
    "the group waits until each member rejoins or is dropped, when its session expires or at "
    "the latest at the rebalance timeout"
)


#: Under a one-shot ``describe`` of a rebalancing group: why its members have no process.
_NO_PROCESSES = (
    "  processes not known: Kafka returns no subscriptions while a group rebalances; run "
    "describe again once it is Stable, or use --watch (it names them from the last Stable view)"
)
#: The same under a watch's first view (no Stable view before it to name them from).
_NO_PROCESSES_YET = (
    "  processes not known: Kafka returns no subscriptions while a group rebalances, and the "
    "watch started during one: it names them from its next Stable view on"
)


def rebalancing_members(view: Any, last: Any) -> list[dict[str, Any]]:
    """Each member of ``view`` (a group between assignments) as the last Stable view ``last``
    knew it: ``last_stable_process`` and the ``last_stable_active`` tasks it ran there (named
    so: carried over from that view, maybe generations old), or ``joining`` (not in
    ``last``); all three None when ``last`` is (not known, as in one ``describe``). A member
    ``last`` could not read has no process there (None), as in its Stable line."""
    known = {} if last is None else {m.member_id: m for m in last.members}
    out = []
    for m in sorted(view.members, key=lambda m: m.member_id):
        was = known.get(m.member_id)
        read = was if was is not None and was.assigned else None
        out.append(
            {
                "member_id": m.member_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "last_stable_process": None if read is None else read.process,
                "last_stable_active": None
                if read is None
                else [str(t) for t in sorted(read.active)],
                "joining": None if last is None else was is None,
            }
        )
    return out


def members_gone(view: Any, last: Any) -> int | None:
    """How many members of the last Stable view ``last`` are not in ``view`` (None: no
    ``last``)."""
    if last is None:
        return None
    return len({m.member_id for m in last.members} - {m.member_id for m in view.members})


def _print_rebalancing(
    console: Console, view: Any, last: Any, prefix: str = "", *, watching: bool = False
) -> None:
    """A group between assignments (``view``, not readable): its state, then each member,
    with the process and actives it had in ``last`` (the last Stable view ``--watch`` saw;
    None: not known, as in one ``describe`` or a watch's first view, which says so), a
    member that view lacks marked as joining; in PreparingRebalance, what the group waits
    for. ``prefix`` starts the first line (the watch's time); ``watching``: in a watch."""
    members = rebalancing_members(view, last)
    console.print(
        f"{prefix}{view.group}: {_state_note(view.state)}, {len(members)} member(s)", markup=False
    )
    processes = {} if last is None else _view_labels(last)
    labels = _member_labels(m["member_id"] for m in members)
    for m in members:
        line = f"  {labels[m['member_id']]}  {m['client_id']}@{m['client_host'].lstrip('/')}"
        if m["last_stable_process"] is not None:
            active = ", ".join(m["last_stable_active"]) or "none"
            line += f"  process {processes[m['last_stable_process']]}, ran {active}"
        elif m["joining"]:
            line += "  joining (not in the last Stable view)"
        console.print(line, markup=False)
    if last is None and members:
        console.print(_NO_PROCESSES_YET if watching else _NO_PROCESSES, markup=False)
    if view.state == "PreparingRebalance":
        gone = members_gone(view, last)
        left = f" ({counted(gone, 'member')} of the last Stable view gone)" if gone else ""
        console.print(f"  {_WAITS}{left}", markup=False)


def _stable_caveat(family: str) -> str:
    """What a Stable group's tables cannot tell, said under their heading: DescribeGroups
    returns the members of the last rebalance, not liveness, and nothing of restores."""
    restores = "" if family == "consumer" else "; a restoring task reads as active"
    return (
        "as of the last rebalance: a dead member shows until its session expires"
        f"{restores} (docs/operations.md, What it shows)"
    )


def _print_processes(
    console: Console,
    processes: Mapping[str, Any],
    endpoints: Mapping[str, str],
    labels: Mapping[str, str],
) -> None:
    """Each process (by its label, and its endpoint where it has one), its capacity and
    tasks."""
    table = Table(title="Processes")
    for col in ("process (endpoint)", "cap", "active", "standby", "warmup"):
        table.add_column(col, overflow="fold")
    for pid, client in processes.items():
        a = client.assignment
        table.add_row(
            labels[pid] + (f"\n({endpoints[pid]})" if pid in endpoints else ""),
            str(client.capacity),
            _tasks_cell(a.active),
            _tasks_cell(a.standby) if a.standby else "-",
            _tasks_cell(a.warmup) if a.warmup else "-",
        )
    console.print(table)


def _print_members(console: Console, members: Sequence[Any], labels: Mapping[str, str]) -> None:
    """Each member (consumer): its client, process, task counts, versions, generation; below
    the table, error codes and undecodable bytes, one line each (long text in a column
    squeezed the others to one character per line). ``labels``: of member and process ids."""
    ordered = sorted(members, key=lambda m: (m.process, m.member_id))
    # A table wider than the console folds client@host at the column's edge, mid-address
    # (127.0.0 / .1): then the host goes on a line of its own, whole, below its client id;
    # where even that column cannot be as wide as the longest host beside the others (an
    # IPv6 address is up to 40 characters with its @), the hosts go below the table, one
    # member a line, and the column holds the client id alone.
    unbounded = console.options.update_width(sys.maxsize)  # its natural width, not cut
    for layout in ("one line", "host below", "hosts after"):
        table = _members_table(ordered, labels, layout)
        if layout == "hosts after":  # the last resort: client ids cut to fit, not folded
            table = _client_ids_cut_to_fit(console, ordered, labels)
            break
        if layout == "one line":
            width = Measurement.get(console, unbounded, table).maximum
        else:
            width = _rendered_width(console, table)
        if width <= console.width:
            break
    console.print(table)
    for m in ordered if layout == "hosts after" else ():
        # A space before the @: a line too long for the console breaks there, not mid-host.
        console.print(f"member {labels[m.member_id]}: {m.client_id} @{_host(m)}", markup=False)
    for m in ordered:
        if m.undecodable is not None:
            # Read all the same: the leader assigns such a member, as a process of its own.
            kept = "; its assignment is read (a process of its own)" if m.assigned else ""
            console.print(f"member {m.member_id}: undecodable: {m.undecodable}{kept}")
        elif m.error not in ("", "NONE"):
            console.print(
                f"member {labels[m.member_id]} (process {labels[m.process]}): error {m.error}",
                markup=False,
            )


def _client_ids_cut_to_fit(
    console: Console, ordered: Sequence[Any], labels: Mapping[str, str]
) -> Table:
    """The ``"hosts after"`` Members table with each client id cut to the longest length at
    which the table fits in the fewest lines (``faust-0.1…``, or ``faust…ker-a`` where only
    the tails differ), no two different ids cut alike: a folded id (``faust-0.15.`` / ``3``)
    doubled each row at 60 columns. Each id is printed whole below the table. Ids are left
    whole where no cut fits, or where a cut saves no line (a row another cell folds is as
    tall either way, and the cut would only hide part of the id)."""
    ids = {m.client_id for m in ordered}
    whole = _members_table(ordered, labels, "hosts after")
    whole_lines = _rendered_lines(console, whole)
    if _fits(console, whole_lines, ids):
        return whole

    def rendered(width: int) -> tuple[Table, list[str], bool] | None:
        shortened = _cut(ids, width)
        if shortened is None:  # too short to tell them apart
            return None
        table = _members_table(ordered, labels, "hosts after", shortened)
        lines = _rendered_lines(console, table)
        return table, lines, _fits(console, lines, shortened.values())

    # The shortest cut leaves the other columns the most room, so the fewest lines; the
    # longest cut that fits in as few is a binary search away (fitting only grows as ids
    # shorten), a render each, not a render of every length.
    longest = max(map(len, ids), default=0) - 1
    shortest = next((w for w in range(4, longest + 1) if _cut(ids, w) is not None), 0)
    best = rendered(shortest) if shortest else None
    if best is None or not best[2]:
        return whole
    fewest, low, high = len(best[1]), shortest + 1, longest
    while low <= high:
        width = (low + high) // 2
        tried = rendered(width)
        if tried is not None and tried[2] and len(tried[1]) == fewest:
            best, low = tried, width + 1
        else:
            high = width - 1
    cropped = max(map(cell_len, whole_lines), default=0) > console.width
    return best[0] if cropped or fewest < len(whole_lines) else whole


def _rendered_lines(console: Console, table: Table) -> list[str]:
    """``table`` rendered at the console's width, line by line."""
    lines = Segment.split_lines(console.render(table, console.options))
    return ["".join(segment.text for segment in line) for line in lines]


def _fits(console: Console, lines: Sequence[str], texts: Iterable[str]) -> bool:
    """Whether the rendered ``lines`` fit the console and show each of ``texts`` whole on
    one line (a folded cell splits it over two)."""
    if max(map(cell_len, lines), default=0) > console.width:
        return False
    return all(any(text in line for line in lines) for text in texts)


def _cut(ids: Collection[str], width: int) -> dict[str, str] | None:
    """Each of ``ids`` at most ``width`` characters: a longer one's head, an ellipsis and
    as short a tail as keeps every id apart (none: the head alone); None when none does."""
    for tail in range(width - 1):
        cut = {
            c: c if len(c) <= width else c[: width - 1 - tail] + "…" + c[len(c) - tail :]
            for c in ids
        }
        if len(set(cut.values())) == len(ids):
            return cut
    return None


def _rendered_width(console: Console, table: Table) -> int:
    """The widest line of ``table`` rendered at the console's width. Not its measured minimum:
    rich widens a column squeezed below its ``min_width`` back to it after the squeeze, so a
    table whose minimum fits can still render wider than the console, which crops it."""
    lines = Segment.split_lines(console.render(table, console.options))
    return max((Segment.get_line_length(line) for line in lines), default=0)


def _members_table(
    ordered: Sequence[Any],
    labels: Mapping[str, str],
    layout: str,
    shortened: Mapping[str, str] | None = None,
) -> Table:
    """The Members table with client@host as ``layout`` says: on ``"one line"``, the host
    ``"host below"`` the client id (the column as wide as the longest host or client id: both
    whole), or the client id alone (``"hosts after"``: the caller prints the hosts below the
    table, each with its client id whole; ``shortened``: each client id as that layout shows
    it, by default whole)."""
    longest = max((max(len(_host(m)) + 1, len(m.client_id)) for m in ordered), default=0)
    table = Table(title="Members")
    # The generation only consumer assignors' user data carries: a column of "-" otherwise,
    # which a narrow terminal cropped along with the table's right border.
    generations = any(m.generation is not None for m in ordered)
    columns = ("member", "client@host", "process", "a+s+w", "versions", "gen")
    for col in columns if generations else columns[:-1]:
        # The process folds too: a URL no shorter label names (a scheme apart) is long.
        wraps = col in ("client@host", "process", "versions")
        # Versions wrap between their halves ("sub v3/3" / "asg v3/3").
        least = {"client@host": 12, "versions": 8}.get(col)
        if col == "client@host" and layout == "hosts after":
            least = None  # the client id alone: each is printed whole below the table
        if col == "client@host" and layout == "host below":
            least = max(12, longest)
        table.add_column(col, overflow="fold", no_wrap=not wraps, min_width=least)
    for m in ordered:
        client_at_host = {
            "one line": _client_at_host(m),
            "host below": f"{m.client_id}\n@{_host(m)}",
            "hosts after": (shortened or {}).get(m.client_id, m.client_id),
        }[layout]
        table.add_row(
            labels[m.member_id],
            client_at_host,
            labels[m.process] if m.assigned else "?",
            f"{len(m.active)}+{len(m.standby)}+{len(m.warmup)}" if m.assigned else "undecodable",
            (m.versions or "-")
            + (f"\ntopology {m.topology_version}" if m.topology_version else ""),
            *(["-" if m.generation is None else str(m.generation)] if generations else []),
        )
    return table


def _print_tasks(
    console: Console,
    view_tasks: Mapping[TaskId, Any],
    processes: Mapping[str, Any],
    labels: Mapping[str, str],
) -> None:
    """Each task's active and standby processes, and its partitions."""
    owners: dict[TaskId, tuple[list[str], list[str]]] = {}
    for pid, client in processes.items():
        a, name = client.assignment, labels[pid]
        for kind, tasks, label in (
            (0, a.active, name),
            (1, a.standby, name),
            (1, a.warmup, f"{name} (warmup)"),
        ):
            for t in tasks:
                owners.setdefault(t, ([], []))[kind].append(label)
    table = Table(title=f"Tasks ({len(view_tasks)})")
    for col in ("task", "active on", "standbys on", "partitions"):
        table.add_column(col, overflow="fold")
    for t, parts in view_tasks.items():
        active, standby = owners.get(t, ([], []))
        table.add_row(
            str(t),
            ", ".join(active) or "NONE",
            ", ".join(standby) or "-",
            partitions_by_topic(parts),
        )
    console.print(table)


def _print_offset_sums(
    console: Console, by_process: Mapping[str, Sequence[Any]], labels: Mapping[str, str]
) -> None:
    """The offset sums each process reported at the last join (when any did)."""
    sums = {pid: merge_offset_sums(m.offset_sums for m in ms) for pid, ms in by_process.items()}
    if any(sums.values()):
        table = Table(title="Offset sums reported at the last join (running: active then)")
        table.add_column("process", overflow="fold")
        table.add_column("task=offset sum", overflow="fold")
        for pid, by_task in sums.items():
            text = ", ".join(
                f"{t}={'running' if v == -2 else v}" for t, v in sorted(by_task.items())
            )
            table.add_row(labels[pid], text or "none reported")
        console.print(table)


def _balance_rows(score: Any, topics: Mapping[int, str] | None) -> list[tuple[str, str]]:
    """The quality table's row per subtopology (per topic of a consumer group: ``topics``)."""
    rows = []
    for b in score.per_subtopology:
        # Withheld processes (another topology version) are left out: no task of it is theirs.
        withheld = f"; {counted(b.withheld, 'process', 'processes')} withheld" if b.withheld else ""
        named = f"subtopology {b.subtopology}"
        if topics is not None and b.subtopology in topics:
            named = f"topic {topics[b.subtopology]}"
        rows.append(
            (
                f"{named}: actives per process (of {b.tasks}{withheld})",
                f"{b.fewest}-{b.most} {'balanced' if b.balanced else 'UNBALANCED'}",
            )
        )
    return rows


def _print_quality(
    console: Console,
    score: Any,
    has_standbys: bool = True,
    topics: Mapping[int, str] | None = None,
) -> None:
    """The quality table of a described group; ``topics``: a consumer group's topic per
    number, which its rows name instead of subtopologies (None: a streams group's)."""
    m = score.metrics
    table = Table(title="Quality of the current assignment")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("tasks / processes", f"{m.tasks} / {m.clients}")
    for row in _balance_rows(score, topics):
        table.add_row(*row)
    table.add_row("actives balanced in total", "yes" if m.active_balanced else "NO")
    table.add_row("load imbalance (per thread, max - min)", f"{m.load_imbalance:.2f}")
    inferred = ", inferred" if score.standbys_inferred else ""
    # Required counts at most processes - 1 per task (``evaluate``): say so beside a larger R,
    # or "2 per stateful task ... 4 / 4" reads as two copies each. Short: the row fits 80
    # columns (describe piped, a narrow terminal); stderr's warning says why.
    cap = max(0, m.clients - 1)
    fit = f"{cap} fits" if cap == 1 else f"{cap} fit"
    capped = f"; {fit}" if score.num_standby_replicas > cap else ""
    if has_standbys or not score.standbys_inferred:
        table.add_row(
            f"standbys placed / required ({score.num_standby_replicas} per stateful task"
            f"{inferred}{capped})",
            f"{m.standbys_placed} / {m.standbys_required}",
        )
    if score.standbys_on_active_rack is not None:
        table.add_row("standbys on their active's rack", str(score.standbys_on_active_rack))
    console.print(table)
    if score.standbys_inferred and has_standbys:
        console.print(
            "inferred: the most standbys any task has (a lost one can hide); --standbys R "
            "checks against the app's num_standby_replicas",
            markup=False,
        )
    if score.warmups:
        console.print(
            f"{counted(score.warmups, 'warmup')} in flight: the HA assignor keeps actives on "
            "caught-up processes until the warmups catch up, so imbalance until the next "
            "probing rebalance is expected.",
            markup=False,
        )
    for problem in score.problems[:20]:
        # Styled parts, not markup: a problem names topics and ids ([b], a trailing \\).
        console.print(Text.assemble(("problem:", "red"), " ", problem))
    if len(score.problems) > 20:
        console.print(f"[red]... and {len(score.problems) - 20} more problems[/]", markup=True)
    for note in score.notes:  # a doubt that affects no task: not red, not a problem
        console.print(Text.assemble("note:", " ", note))
