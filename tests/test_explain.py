"""`streamassign explain` / `diff` / `plan --explain`: which tasks moved, from where, and why."""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import attrs
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from streamassign import ClientAssignment, ClientState, StickyTaskAssignor, TaskId, TopicPartition
from streamassign.cli import main
from streamassign.compare import CONSUMER_FAMILY, compare_snapshots
from streamassign.explain import (
    ClientView,
    Landing,
    Reason,
    Snapshot,
    claim_conflicts,
    explain,
    likely_zombies,
    load_snapshot,
    local_state,
    named_as_after,
    views_from_assignment,
    views_from_clients,
)
from streamassign.metrics import evaluate
from streamassign.protocol import LATEST_OFFSET, SubscriptionInfo, running_tasks
from streamassign.streams import (
    FAUST_PROTOCOL_NAME,
    MemberSubscription,
    client_states,
    merge_offset_sums,
)

from .cli_runner import cli_runner
from .strategies import assignment_inputs, rejoining_members
from .tables import assert_whole_tables

ROOT = Path(__file__).resolve().parent.parent
ORDERS = str(ROOT / "topology" / "orders-join.toml")
CLIENTS = str(ROOT / "examples" / "clients.toml")
WIDE = {"COLUMNS": "160", "FORCE_COLOR": None, "TTY_COMPATIBLE": None}


def view(capacity: int | None, active: str = "", standby: str = "", warmup: str = "") -> ClientView:
    def ids(text: str) -> frozenset[TaskId]:
        return frozenset(TaskId.parse(t) for t in text.split())

    return ClientView(capacity, ClientAssignment(ids(active), ids(standby), ids(warmup)))


def test_each_rule_is_named() -> None:
    before = {
        "a": view(2, "0_0 0_1 0_2", "0_3"),
        "b": view(2, "0_3 0_4", "0_0", warmup="0_1"),
        "gone": view(1, "0_5", "0_2"),
        "small": view(4, "1_0 1_1"),
    }
    after = {
        "a": view(2, "0_2 0_5", "0_0 0_3"),
        "b": view(2, "0_0 0_1 0_3", "0_2"),
        "small": view(1, "1_0", "0_5"),
        "new": view(1, "0_4 1_1 2_0"),
    }
    moves = {m.task: m for m in explain(before, after).actives}
    assert moves[TaskId(0, 0)].reason == Reason.BALANCE_QUOTA
    assert moves[TaskId(0, 0)].landing == Landing.STANDBY
    assert moves[TaskId(0, 1)].reason == Reason.WARMUP_DONE
    assert moves[TaskId(0, 1)].landing == Landing.WARMUP
    assert (moves[TaskId(0, 5)].source, moves[TaskId(0, 5)].reason) == ("gone", Reason.CLIENT_GONE)
    assert moves[TaskId(1, 1)].reason == Reason.CAPACITY_CHANGE  # small went from 4 threads to 1
    assert moves[TaskId(0, 4)].landing == Landing.COLD
    assert moves[TaskId(2, 0)].reason == Reason.NO_PREVIOUS_OWNER
    assert TaskId(0, 2) not in moves and TaskId(1, 0) not in moves
    copies = {(c.task, c.source, c.destination): c.reason for c in explain(before, after).standbys}
    assert copies[(TaskId(0, 0), "b", None)] == Reason.BECAME_ACTIVE
    assert copies[(TaskId(0, 0), None, "a")] == Reason.WAS_ACTIVE_HERE
    assert copies[(TaskId(0, 2), "gone", None)] == Reason.CLIENT_GONE
    assert copies[(TaskId(0, 2), None, "b")] == Reason.CLIENT_GONE


@given(assignment_inputs())
def test_moves_and_landings_agree_with_the_metrics(
    case: tuple[list[TaskId], list[ClientState], int, list[TaskId] | None],
) -> None:
    # Duplicate claims included: both take the claimant the assignor keeps as the owner, so a
    # task moved from it to another claimant is one (warm) move for both.
    tasks, clients, replicas, stateful = case
    result = StickyTaskAssignor(replicas).assign(tasks, clients, stateful)
    caps = {c.process_id: c.capacity for c in clients}
    lags = {c.process_id: c.lags for c in clients}
    explained = explain(
        views_from_clients(clients),
        views_from_assignment(result, caps),
        lags,
        stateful,
        claim_lags=lags,
    )
    metrics = evaluate(tasks, clients, result, replicas, stateful)
    assert explained.moves == metrics.moves
    landed = [m.landing for m in explained.actives if m.destination is not None]
    warm = (Landing.STANDBY, Landing.WARMUP, Landing.LOCAL)
    assert sum(landing in warm for landing in landed) == metrics.warm_takeovers
    assert landed.count(Landing.COLD) == metrics.cold_takeovers
    # Every task whose active changed is listed once, with its new owner.
    owner = {t: pid for pid, a in result.items() for t in a.active}
    for move in explained.actives:
        assert move.destination == owner.get(move.task)
    assert len({m.task for m in explained.actives}) == len(explained.actives)


def test_a_task_moved_off_the_kept_claimant_is_a_warm_move() -> None:
    # p1 and p2 both claim 0_0; p1 (smallest process id) is kept, so 0_0 on p2 is a move.
    before = {"p1": view(None, "0_0 0_1"), "p2": view(None, "0_0")}
    after = {"p1": view(1, "0_1"), "p2": view(1, "0_0")}
    (move,) = explain(before, after).actives
    assert (move.task, move.source, move.destination) == (TaskId(0, 0), "p1", "p2")
    assert move.landing == Landing.LOCAL
    assert explain(before, after).moves == 1
    # Left on the kept claimant: no move.
    assert explain(before, {"p1": view(1, "0_0 0_1"), "p2": view(1)}).actives == ()


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), env=WIDE)
    return result.exit_code, result.output


def test_plan_json_lists_moves_and_explain_reads_it_back(tmp_path: Path) -> None:
    code, out = run("plan", ORDERS, "--clients", CLIENTS, "--standbys", "1", "--json")
    assert code == 0, out
    data = json.loads(out)
    assert len(data["moves"]) == data["metrics"]["moves"] == 3
    assert all(m["reason"] == "balance quota" for m in data["moves"])
    # Stateful tasks land on standbys; the one stateless task (subtopology 1) needs no state.
    landings = {m["task"]: m["landing"] for m in data["moves"]}
    assert {t: land for t, land in landings.items() if t.startswith("0_")} == dict.fromkeys(
        (t for t in landings if t.startswith("0_")), "standby"
    )
    assert all(land == "no state needed" for t, land in landings.items() if t.startswith("1_"))
    assert data["assignment"]["p2"]["capacity"] == 4
    after = tmp_path / "after.json"
    after.write_text(out)
    # The same rebalance as a saved "before": the clients file's history.
    code, table = run("plan", ORDERS, "--clients", CLIENTS, "--standbys", "1", "--explain")
    assert code == 0, table
    assert "3 of 3 taken off a process still in the group (the moves plan counts)" in table
    code, diff = run("diff", str(after), str(after))
    assert code == 0 and "after.json -> after.json: no client changed" in diff


def test_plan_explain_names_processes_as_describe_does(tmp_path: Path) -> None:
    """An audit: ``plan --explain`` printed full process ids, which rich cut at 80 columns to
    ``3f2a9c1e-0b7d-4…`` (an ambiguous cut of a UUID); ``describe`` and ``explain`` show each
    by its shortest unique label (``_process_labels``)."""
    from streamassign.cli.labels import _process_labels

    pids = {
        "p1": "3f2a9c1e-0b7d-4c55-9a0e-1d2b3c4d5e61",
        "p2": "3f2a9c1e-77aa-4c55-9a0e-1d2b3c4d5e62",
        "p3": "8b1d0e44-0b7d-4c55-9a0e-1d2b3c4d5e63",
    }
    text = Path(CLIENTS).read_text()
    for short, pid in pids.items():
        text = text.replace(f'"{short}"', f'"{pid}"')
    clients = tmp_path / "clients.toml"
    clients.write_text(text)
    args = ["plan", ORDERS, "--clients", str(clients), "--standbys", "1", "--explain"]
    result = CliRunner().invoke(main, args, env={**WIDE, "COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    moves = result.output[result.output.index("Active tasks that moved") :]
    labels = _process_labels(pids.values())
    assert sorted(labels.values()) == ["3f2a9c1e-0", "3f2a9c1e-7", "8b1d0e44"]
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in moves.splitlines()]
    named = {cell for row in rows if len(row) >= 3 for cell in row[1:3]} - {"-"}
    assert named == set(labels.values()), moves
    assert "…" not in moves
    assert_whole_tables(moves, ["from", "to", "why", "state there"])


def test_plan_explain_never_names_two_processes_alike(tmp_path: Path) -> None:
    """A review: a plain id ``3f2a9c1e`` beside a UUID starting with it both showed as
    ``3f2a9c1e``: "0_1 from 3f2a9c1e to 3f2a9c1e", a task moved to where it was."""
    pids = {
        "p1": "3f2a9c1e",
        "p2": "3f2a9c1e-0b7d-4c55-9a0e-1d2b3c4d5e61",
        "p3": "8b1d0e44-0b7d-4c55-9a0e-1d2b3c4d5e63",
    }
    text = Path(CLIENTS).read_text()
    for short, pid in pids.items():
        text = text.replace(f'"{short}"', f'"{pid}"')
    clients = tmp_path / "clients.toml"
    clients.write_text(text)
    args = ["plan", ORDERS, "--clients", str(clients), "--standbys", "1", "--explain"]
    result = CliRunner().invoke(main, args, env={**WIDE, "COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    moves = result.output[result.output.index("Active tasks that moved") :]
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in moves.splitlines()]
    moved = [row[1:3] for row in rows if len(row) >= 3 and row[1] not in ("from", "-", "")]
    assert moved, moves
    assert all(source != target for source, target in moved), moves
    named = {cell for row in moved for cell in row} - {"-"}
    assert named == {"3f2a9c1e", pids["p2"], "8b1d0e44"}, moves


def test_explain_says_in_one_line_when_nothing_moved(tmp_path: Path) -> None:
    saved = tmp_path / "plan.json"
    code, out = run("plan", ORDERS, "--num-clients", "3", "--standbys", "1", "--json")
    saved.write_text(out)
    code, out = run("explain", str(saved), str(saved))
    assert code == 0, out
    assert out.splitlines() == ["no active task moved", "no standby moved"]


def test_explain_and_diff_between_two_saved_plans(tmp_path: Path) -> None:
    first, second = tmp_path / "three.json", tmp_path / "four.json"
    code, out = run("plan", ORDERS, "--num-clients", "3", "--json")
    first.write_text(out)
    saved = json.loads(out)
    # A fourth client joins: feed the first plan back as history.
    clients = tmp_path / "clients.toml"
    clients.write_text(
        "".join(
            f'[[client]]\nprocess_id = "{pid}"\nprev_active = {json.dumps(a["active"])}\n'
            for pid, a in saved["assignment"].items()
        )
        + '[[client]]\nprocess_id = "client-9"\n'
    )
    code, out = run("plan", ORDERS, "--clients", str(clients), "--json")
    assert code == 0, out
    second.write_text(out)
    code, out = run("explain", str(first), str(second), "--json")
    assert code == 0, out
    moves = json.loads(out)["moves"]
    assert moves and all(m["to"] == "client-9" and m["reason"] == "balance quota" for m in moves)
    code, out = run("diff", str(first), str(second), "--json")
    assert code == 0, out
    rows = json.loads(out)
    assert rows["client-9"]["status"] == "joined"
    assert sorted(rows["client-9"]["+active"]) == sorted(m["task"] for m in moves)


def test_explain_of_a_snapshot_and_its_what_if_lands_as_plan_explain_does(
    tmp_path: Path,
) -> None:
    # The reviewer's crash2.json -> p2.json: p1 crashed (deleted from the snapshot); the
    # what-if plan gives its tasks to p3, which reported a checkpoint of 0_2 (not of 0_3).
    topology = tmp_path / "clicks.toml"
    topology.write_text(CLICKS + "[partitions]\nclicks = 4\n")
    crash = snapshot(
        tmp_path / "crash.json",
        {"p2": {"capacity": 1, "active": ["0_0", "0_1"]}, "p3": {"capacity": 1}},
        {"p2": {"0_0": -2, "0_1": -2, "0_3": 310}, "p3": {"0_2": 652}},
    )
    code, out = run("plan", str(topology), "--clients", crash, "--json")
    assert code == 0, out
    planned = {m["task"]: (m["to"], m["landing"]) for m in json.loads(out)["moves"]}
    what_if = tmp_path / "p2.json"
    what_if.write_text(out)
    code, out = run("explain", crash, str(what_if), "--json")
    assert code == 0, out
    explained = {m["task"]: (m["to"], m["landing"]) for m in json.loads(out)["moves"]}
    assert explained == planned
    assert explained == {"0_2": ("p3", "local state"), "0_3": ("p3", "cold")}


@pytest.mark.parametrize(
    ("content", "named"),
    [
        (b"\xff\xfe garbage", "cannot read a saved assignment"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (
            b'{"tasks": {}}',
            "no 'assignment' table (expected plan --json or describe --json output)",
        ),
        (b'{"assignment": {"p1": {"active": ["zero"]}}}', "not a task id"),
        (b'{"assignment": {"p1": {"active": [1]}}}', "active must be a list of task ids"),
        (b'{"assignment": {"p1": {"capacity": 0}}}', "capacity must be an int >= 1"),
        (b'{"assignment": {"p1": 3}}', "client 'p1': expected a table"),
    ],
)
def test_damaged_saved_files_give_one_line(tmp_path: Path, content: bytes, named: str) -> None:
    bad, good = tmp_path / "bad.json", tmp_path / "good.json"
    bad.write_bytes(content)
    good.write_text('{"assignment": {}}')
    for command in ("explain", "diff"):
        code, out = run(command, str(good), str(bad))
        assert code == 1, out
        assert named in out and "Traceback" not in out
        assert len(out.strip().splitlines()) == 1


def test_plan_warns_about_input_it_ignores(tmp_path: Path) -> None:
    clients = tmp_path / "clients.toml"
    clients.write_text('[[client]]\nprocess_id = "a"\nprev_active = ["7_0", "0_99"]\n')
    result = cli_runner().invoke(
        main, ["plan", ORDERS, "--clients", str(clients), "--standbys", "2"], env=WIDE
    )
    assert result.exit_code == 0, result.output
    assert "client 'a' reports 2 tasks the topology does not have (ignored): 0_99, 7_0" in (
        result.stderr
    )
    assert "--standbys 2 needs 3 clients; with 1 each stateful task gets 0 standbys" in (
        result.stderr
    )


def test_plan_warns_of_no_conflict_over_a_task_outside_the_topology(tmp_path: Path) -> None:
    clients = tmp_path / "clients.toml"
    client = '[[client]]\nprocess_id = "{}"\nprev_active = ["9_0"]\n'
    clients.write_text(client.format("p1") + client.format("p2"))
    result = cli_runner().invoke(main, ["plan", ORDERS, "--clients", str(clients)], env=WIDE)
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        f"warning: client '{pid}' reports 1 task the topology does not have (ignored): 9_0"
        for pid in ("p1", "p2")
    ]


def test_conflict_warnings_list_twelve_tasks_then_how_many_more(tmp_path: Path) -> None:
    clients = tmp_path / "clients.toml"
    claims = json.dumps([f"0_{p}" for p in range(12)] + ["1_0"])
    client = '[[client]]\nprocess_id = "{}"\nprev_active = {}\nprev_standby = {}\n'
    clients.write_text(client.format("p1", claims, claims) + client.format("p2", claims, "[]"))
    result = cli_runner().invoke(main, ["plan", ORDERS, "--clients", str(clients)], env=WIDE)
    assert result.exit_code == 0, result.output
    duplicates, both = result.stderr.splitlines()
    assert duplicates.startswith("warning: 13 tasks active on several clients: 0_0 on p1, p2")
    assert "; 0_11 on p1, p2 (p1 kept); … (+1); each is taken" in duplicates
    assert both.startswith("warning: 13 tasks both active and standby on one client: 0_0 on p1")
    assert ", 0_11 on p1, … (+1); counted as active there" in both


DUPLICATE = "1 task active on several clients: 0_1 on p1, p2 ({kept} kept)"
BOTH = "1 task both active and standby on one client: 0_1 on p1; counted as active there"


def saved(path: Path, assignment: dict[str, dict[str, list[str]]]) -> str:
    path.write_text(json.dumps({"assignment": assignment}))
    return str(path)


def test_explain_and_diff_warn_about_conflicting_claims(
    tmp_path: Path,
) -> None:
    both = {"p1": {"active": ["0_1"]}, "p2": {"active": ["0_1"]}}
    before = saved(tmp_path / "before.json", both)
    stayed = saved(tmp_path / "stayed.json", {"p1": {"active": []}, "p2": {"active": ["0_1"]}})
    moved = saved(tmp_path / "moved.json", {"p1": {}, "p2": {}, "p3": {"active": ["0_1"]}})
    for command in ("explain", "diff"):
        result = cli_runner().invoke(main, [command, before, stayed, "--json"], env=WIDE)
        assert result.exit_code == 0, result.output
        warnings = result.stderr.splitlines()
        assert warnings == [
            f"warning: {before}: {DUPLICATE.format(kept='p1')}; each is taken as run by the "
            "claimant the sticky assignor keeps (smallest lag, then process id), the others "
            "as holding its state"
        ]
    # p2 ran 0_1 before too, and runs it after: a move off the kept claimant p1, as the
    # metrics count it, landing where its state is.
    result = cli_runner().invoke(main, ["explain", before, stayed, "--json"], env=WIDE)
    assert [
        (m["task"], m["from"], m["to"], m["landing"]) for m in json.loads(result.stdout)["moves"]
    ] == [("0_1", "p1", "p2", "local state")]
    # It moves away from both: from the claimant kept, p1.
    result = cli_runner().invoke(main, ["explain", before, moved, "--json"], env=WIDE)
    assert [(m["task"], m["from"], m["to"]) for m in json.loads(result.stdout)["moves"]] == [
        ("0_1", "p1", "p3")
    ]
    # A standby beside its own active counts as the active only: no "became active" standby.
    odd = saved(tmp_path / "odd.json", {"p1": {"active": ["0_1"], "standby": ["0_1"]}})
    plain = saved(tmp_path / "plain.json", {"p1": {"active": ["0_1"]}})
    result = cli_runner().invoke(main, ["explain", odd, plain, "--json"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"moves": [], "standby_moves": []}
    assert result.stderr == f"warning: {odd}: {BOTH}\n"


def test_plan_warns_about_conflicting_claims_and_keeps_them_as_the_assignor_does(
    tmp_path: Path,
) -> None:
    clients = tmp_path / "clients.toml"
    clients.write_text(
        '[[client]]\nprocess_id = "p1"\nprev_active = ["0_1"]\nprev_standby = ["0_1"]\n'
        'lags = {"0_1" = 50}\n'
        '[[client]]\nprocess_id = "p2"\nprev_active = ["0_1"]\nlags = {"0_1" = 0}\n'
    )
    args = ["plan", ORDERS, "--clients", str(clients), "-p", "orders=2,customers=2,returns=1"]
    result = cli_runner().invoke(main, [*args, "--json"], env=WIDE)
    assert result.exit_code == 0, result.output
    # p2 reports the smaller lag: the assignor keeps 0_1 there, and the warning says so.
    assert result.stderr.splitlines() == [
        f"warning: {DUPLICATE.format(kept='p2')}; each is taken as run by the claimant the "
        "sticky assignor keeps (smallest lag, then process id), the others as holding its state",
        f"warning: {BOTH}",
    ]
    data = json.loads(result.stdout)
    assert "0_1" in data["assignment"]["p2"]["active"]
    assert "0_1" not in [m["task"] for m in data["moves"]]


@given(assignment_inputs())
def test_a_move_comes_from_the_kept_claimant_and_lands_warm_on_another(
    inputs: tuple[list[TaskId], list[ClientState], int, list[TaskId] | None],
) -> None:
    """Whatever the clients report (duplicate claims included), a listed move comes from the
    claimant the assignor kept, never lands where it came from, and lands on local state when
    its new owner was another claimant."""
    tasks, clients, standbys, stateful = inputs
    result = StickyTaskAssignor(standbys).assign(tasks, clients, stateful)
    before, lags = views_from_clients(clients), {c.process_id: c.lags for c in clients}
    moves = explain(before, views_from_assignment(result, {}), lags, claim_lags=lags)
    kept = {task: holder for task, _, holder in claim_conflicts(before, lags).duplicate_actives}
    for move in moves.actives:
        assert move.source != move.destination
        if move.task in kept:
            assert move.source == kept[move.task]
        if move.destination is not None and move.task in before[move.destination].assignment.active:
            assert move.landing == Landing.LOCAL


def snapshot(
    path: Path,
    assignment: dict[str, dict[str, list[str]]],
    sums: dict[str, dict[str, int]],
    state: str = "Stable",
    previous: dict[str, list[str]] | None = None,
    protocol: str | None = None,
) -> str:
    """A ``describe --json`` file (the keys explain reads): one member per process, with
    the offset sums it sent at its last join (-2: running) and its ``previous`` actives;
    ``protocol``: the group's assignor (None: none in the file, read as ProcessHost's)."""
    members = [
        {
            "process": pid,
            "topics": ["clicks"],
            "offset_sums": sums.get(pid, {}),
            "previous_active": (previous or {}).get(pid, []),
            "undecodable": None,
        }
        for pid in assignment
    ]
    data = {"state": state, "assignment": assignment, "members": members}
    path.write_text(json.dumps(data | ({} if protocol is None else {"protocol": protocol})))
    return str(path)


def test_diff_names_clients_as_describe_and_explain_do(tmp_path: Path) -> None:
    """An audit: at 80 columns diff cut aiokafka member ids from the right (their shared
    client-id head, ``aiokafka-0.14.0-4950d175-6078-4237…``) while describe and explain show
    each by its unique tail (``_process_labels``): no row of one could be matched to the
    other's."""
    from streamassign.cli.labels import _process_labels

    stayed, joined = (f"aiokafka-0.14.0-{uuid.UUID(int=n)}" for n in (0x4950D175, 0x1783F862))
    before = snapshot(tmp_path / "a.json", {stayed: {"active": ["0_0", "0_1"]}}, {})
    after = snapshot(
        tmp_path / "b.json", {stayed: {"active": ["0_0"]}, joined: {"active": ["0_1"]}}, {}
    )
    result = CliRunner().invoke(main, ["diff", before, after], env={**WIDE, "COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in result.output.splitlines()]
    labels = _process_labels([stayed, joined])
    assert labels == {stayed: "…4950d175", joined: "…1783f862"}
    assert [row[:2] for row in rows if row] == [
        [labels[joined], "joined"],
        [labels[stayed], "changed"],
    ]


def test_explain_of_two_snapshots_lands_on_the_local_state_the_after_side_reported(
    tmp_path: Path,
) -> None:
    # The auditor's incident (mid.json -> fin.json): p3 left and came back with its state
    # directory; it reported a checkpoint of 0_2 at its join, none of 0_3. describe --watch
    # said "local state" for 0_2. 0_5 it reported running, alone: it took 0_5 at a rebalance
    # between the two snapshots, with a state no report tells (not "local", not "cold").
    before = snapshot(
        tmp_path / "mid.json",
        {"p1": {"active": ["0_2", "0_4", "0_5"]}, "p2": {"active": ["0_0", "0_1", "0_3"]}},
        {"p1": {"0_2": -2, "0_4": -2}, "p2": {"0_0": -2}},
    )
    after = snapshot(
        tmp_path / "fin.json",
        {
            "p1": {"active": ["0_4"]},
            "p2": {"active": ["0_0", "0_1"]},
            "p3": {"active": ["0_2", "0_3", "0_5"]},
        },
        {"p1": {"0_2": -2, "0_4": -2}, "p2": {"0_0": -2}, "p3": {"0_2": 652, "0_5": -2}},
    )
    code, out = run("explain", before, after, "--json")
    assert code == 0, out
    landings = {m["task"]: (m["to"], m["landing"]) for m in json.loads(out)["moves"]}
    assert landings == {
        "0_2": ("p3", "local state"),
        "0_3": ("p3", "cold"),
        "0_5": ("p3", "earlier rebalance: state unknown"),
    }


# The reviewer's ground truth (/work/scratch/audit-ops, watch4.jsonl and the workers' logs):
# generation 3 (g3): c9 runs 0_1 0_3 0_5, 44 runs 0_0 0_2 0_4. At g4 c9 was evicted (a zombie
# that kept running its tasks) and bd joined, taking 0_3 and 0_5 cold; 44 took 0_1. At g5 c9
# came back reporting its old tasks running beside bd: 0_3 stayed on bd, 0_5 went to c9 (its
# state kept). At g6 c9 left and 44 took 0_4 (its disk had it); nobody saved g4's successor.
_G3 = {"c9": {"active": ["0_1", "0_3", "0_5"]}, "44": {"active": ["0_0", "0_2", "0_4"]}}
_G3_SUMS = {"c9": {"0_3": 310}, "44": {t: -2 for t in ("0_0", "0_2", "0_4")}}
_G4 = {"bd": {"active": ["0_3", "0_5"]}, "44": {"active": ["0_0", "0_1", "0_2", "0_4"]}}
_G4_SUMS = {"bd": {}, "44": {"0_0": -2, "0_1": 464, "0_2": -2, "0_4": -2}}
_G5 = {
    "44": {"active": ["0_0", "0_1", "0_2"]},
    "bd": {"active": ["0_3"]},
    "c9": {"active": ["0_4", "0_5"]},
}
_G5_SUMS = {
    "bd": {"0_3": -2, "0_4": 712, "0_5": -2},
    "c9": {"0_1": -2, "0_3": -2, "0_4": 712, "0_5": -2},
    "44": {"0_0": -2, "0_1": -2, "0_2": -2, "0_4": -2},
}
_G7 = {"44": {"active": ["0_0", "0_1", "0_2", "0_3", "0_4", "0_5"]}}
_G7_SUMS = {"44": {"0_0": -2, "0_1": -2, "0_2": -2, "0_3": 310, "0_4": -2, "0_5": 372}}


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        # g3 -> g5: bd took 0_3 cold at g4; at g5 it and the zombie c9 both reported 0_3
        # running, but 44 reported running 0_1, which g3 gave to c9: g3 is not the assignment
        # right before g5, so bd's report dates from g4.
        ((_G3, _G3_SUMS), (_G5, _G5_SUMS), {"0_3": "earlier rebalance: state unknown"}),
        # g4 -> g5: the zombie c9 ran 0_5 beside bd right up to g5 and kept its state.
        ((_G4, _G4_SUMS), (_G5, _G5_SUMS), {"0_4": "local state", "0_5": "local state"}),
        # g5 -> g7 (g6 missed): 44 reported 0_4 running alone at g7: it took 0_4 at g6.
        ((_G5, _G5_SUMS), (_G7, _G7_SUMS), {"0_4": "earlier rebalance: state unknown"}),
    ],
)
def test_a_running_report_is_local_state_only_when_it_dates_from_the_last_rebalance(
    tmp_path: Path, before: tuple, after: tuple, expected: dict[str, str]
) -> None:
    old = snapshot(tmp_path / "before.json", *before)
    new = snapshot(tmp_path / "after.json", *after)
    code, out = run("explain", old, new, "--json")
    assert code == 0, out
    landings = {m["task"]: m["landing"] for m in json.loads(out)["moves"]}
    assert {t: landings[t] for t in expected} == expected
    code, text = run("explain", old, new)
    assert code == 0
    for landing in expected.values():
        assert landing.split(":")[0] in text


def test_a_process_runs_a_task_one_of_its_members_reported_running() -> None:
    """Two members of one process, one running 0_0 and one with a checkpoint of it: the
    process ran 0_0 whichever member comes last (as the leaders merge them)."""
    t = TaskId(0, 0)
    reports = [("P", {t: LATEST_OFFSET}), ("P", {t: 500, TaskId(0, 1): 7}), ("Q", {t: 9})]
    for order in (reports, reports[::-1]):
        assert local_state(order) == {"P": {t: LATEST_OFFSET, TaskId(0, 1): 7}, "Q": {t: 9}}


def test_diff_reads_a_snapshot_whose_members_rows_it_does_not_use(tmp_path: Path) -> None:
    # h_nullsums.json: a member's offset_sums null. diff reads the assignment only; explain
    # reads the offset sums, so it still refuses, in one line.
    good = snapshot(tmp_path / "good.json", {"p1": {"active": ["0_0"]}}, {})
    data = json.loads(Path(good).read_text())
    data["members"][0]["offset_sums"] = None
    data["assignment"]["p1"]["active"] = ["0_0", "0_1"]
    bad = tmp_path / "nullsums.json"
    bad.write_text(json.dumps(data))
    code, out = run("diff", good, str(bad), "--json")
    assert code == 0, out
    assert json.loads(out)["p1"]["+active"] == ["0_1"]
    code, out = run("explain", good, str(bad))
    assert code == 1
    assert out.splitlines() == [
        f'Error: {bad}: member #1: offset_sums must map task ids like "0_3" to ints'
    ]


@pytest.mark.parametrize("state", ["PreparingRebalance", "CompletingRebalance", "Empty", "Dead"])
def test_explain_and_diff_refuse_a_snapshot_not_taken_in_state_stable(
    tmp_path: Path, state: str
) -> None:
    good = snapshot(tmp_path / "good.json", {"p1": {"active": ["0_0"]}}, {})
    # What describe --json saves during a rebalance: members without a process, no assignment.
    bad = tmp_path / "rebal.json"
    bad.write_text(json.dumps({"group": "app", "state": state, "assignment": {}, "members": []}))
    for command in ("explain", "diff"):
        for args in ((good, str(bad)), (str(bad), good)):
            code, out = run(command, *args)
            assert code == 1, out
            assert out.splitlines() == [
                f"Error: {bad}: saved in group state {state!r}, not 'Stable' (during a "
                "rebalance, or with no members): it holds no assignment; save one while the "
                "group is Stable"
            ]
    # describe --watch --json's in-between line: its state named, not a missing table.
    bad.write_text(json.dumps({"group": "app", "state": "PreparingRebalance"}))
    code, out = run("explain", good, str(bad))
    assert code == 1 and "saved in group state 'PreparingRebalance'" in out


@pytest.mark.parametrize(
    ("members", "named"),
    [
        ("{}", "members must be a list"),
        ("[3]", "member #1: expected a table"),
        (
            '[{"process": "p1", "topics": ["t"], "offset_sums": {"0_0": "x"}}]',
            'member #1: offset_sums must map task ids like "0_3" to ints',
        ),
        (
            '[{"process": "p1", "topics": ["t"], "offset_sums": {"zero": 1}}]',
            "not a task id",
        ),
        (
            '[{"process": "p1", "topics": ["t"], "member_id": 5}]',
            "member_id and endpoint must be strings",
        ),
        (
            '[{"process": "p1", "topics": ["t"], "member_id": "m1", "endpoint": ["w0", 80]}]',
            "member_id and endpoint must be strings",
        ),
    ],
)
def test_damaged_members_of_a_snapshot_give_one_line(
    tmp_path: Path, members: str, named: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(f'{{"state": "Stable", "assignment": {{}}, "members": {members}}}')
    code, out = run("explain", str(bad), str(bad))
    assert code == 1, out
    assert named in out and len(out.strip().splitlines()) == 1


@pytest.mark.parametrize("clashes", ['"m1"', '[{"members": "m1"}]', "[[1]]"])
def test_damaged_shared_process_ids_of_a_snapshot_give_one_line(
    tmp_path: Path, clashes: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(
        f'{{"state": "Stable", "assignment": {{}}, "members": [], "shared_process_ids": {clashes}}}'
    )
    code, out = run("explain", str(bad), str(bad))
    assert code == 1, out
    assert "bad.json: shared_process_ids must be a list" in out
    assert len(out.strip().splitlines()) == 1


CLICKS = '[[subtopology]]\nid = 0\nsource_topics = ["clicks"]\nstores = ["totals"]\n'


def _renamed(before: dict[str, str], after: dict[str, str]) -> dict[str, str]:
    """Old key -> the key ``named_as_after`` gives it, the processes given as ``key:
    "member@endpoint ..."`` (each holding a task of its own, to tell them apart)."""

    def members(side: dict[str, str]) -> dict[str, frozenset[tuple[str, str]]]:
        return {k: frozenset(tuple(m.split("@")) for m in v.split()) for k, v in side.items()}

    views = {key: view(1, f"0_{n}") for n, key in enumerate(before)}
    renamed = named_as_after(views, members(before), members(after))
    return {key: next(k for k, v in renamed.items() if v == views[key]) for key in before}


def test_a_process_rekeyed_by_a_clash_is_found_by_its_members_else_its_endpoint() -> None:
    """A clash of a shared process id starting (P -> P#w0) or ending (P#w0 -> P) renames the
    original; it is found by its member ids, or by its endpoint after a restart. Never
    guessed: a merged process that splits, two that merge, another process id, or no member
    or endpoint in common keep their keys (their tasks read as moved)."""
    assert _renamed({"P": "m1@w0"}, {"P#w0": "m1@w0", "P#w2": "m2@w2"}) == {"P": "P#w0"}
    assert _renamed({"P#w0": "m1@w0", "P#w2": "m2@w2"}, {"P": "m1@w0"}) == {
        "P#w0": "P",
        "P#w2": "P#w2",
    }
    assert _renamed({"P": "m1@w0"}, {"P#w0": "m9@w0", "P#w2": "m2@w2"}) == {"P": "P#w0"}
    # split: P held both (a file from before the split) -- which one is it?
    assert _renamed({"P": "m1@w0 m2@w2"}, {"P#w0": "m1@w0", "P#w2": "m2@w2"}) == {"P": "P"}
    assert _renamed({"P#w0": "m1@w0", "P#w2": "m2@w0"}, {"P": "m1@w0 m2@w0"}) == {
        "P#w0": "P#w0",
        "P#w2": "P#w2",
    }
    assert _renamed({"P": "m1@w0"}, {"Q#w0": "m1@w0", "Q#w2": "m2@w2"}) == {"P": "P"}
    assert _renamed({"P": "m1@w0"}, {"P#w1": "m8@w1", "P#w2": "m2@w2"}) == {"P": "P"}
    # P stays (a member without an endpoint keeps the plain key): no rename, though m1 moved
    # to P#w0 (its tasks read as moved: documented)
    assert _renamed({"P": "m1@w0 mX@"}, {"P": "mX@", "P#w0": "m1@w0", "P#w2": "m2@w2"}) == {
        "P": "P"
    }
    # never onto a key BEFORE already has (a file missing a process's member rows): one of
    # the two processes' tasks would be dropped
    assert _renamed({"P#w0": "m1@w0", "P#w2": "m2@w2", "P": "mX@"}, {"P": "m1@w0 mX@"}) == {
        "P#w0": "P#w0",
        "P#w2": "P#w2",
        "P": "P",
    }


def test_a_snapshot_read_as_clients_runs_what_the_group_runs_now(tmp_path: Path) -> None:
    now = snapshot(
        tmp_path / "now.json",
        {
            "p1": {"capacity": 2, "active": ["0_0", "0_1"], "standby": ["0_2"]},
            "p2": {"capacity": 1, "active": ["0_2"], "standby": ["0_0"], "warmup": ["0_1"]},
        },
        # Sums from the last join: p1 ran 0_0 and held 0_2 and 0_3 at 500 and 400; p2 held
        # 0_0 at 300, 0_1 at 100 (its warmup now) and 0_2 at 700 (which it runs now), and ran
        # 0_3, which it gave up at that rebalance: the closed task's state is the freshest.
        {
            "p1": {"0_0": -2, "0_2": 500, "0_3": 400},
            "p2": {"0_0": 300, "0_1": 100, "0_2": 700, "0_3": -2},
        },
    )
    clients = load_snapshot(json.loads(Path(now).read_text()), now).clients()
    assert clients == [
        ClientState("p1", 2, {"0_0", "0_1"}, {"0_2"}, {TaskId(0, 2): 200, TaskId(0, 3): 0}),
        ClientState(
            "p2", 1, {"0_2"}, {"0_0", "0_1"}, {TaskId(0, 0): 0, TaskId(0, 1): 0, TaskId(0, 3): 0}
        ),
    ]


def test_plan_takes_a_describe_snapshot_as_its_clients_for_a_what_if(tmp_path: Path) -> None:
    topology = tmp_path / "clicks.toml"
    topology.write_text(CLICKS + "[partitions]\nclicks = 4\n")
    assignment = {
        "p1": {"capacity": 1, "active": ["0_0", "0_1"], "standby": ["0_2", "0_3"]},
        "p2": {"capacity": 1, "active": ["0_2", "0_3"], "standby": ["0_0", "0_1"]},
    }
    now = snapshot(tmp_path / "now.json", assignment, {})
    # The group as it runs: the assignor keeps it as it is.
    code, out = run("plan", str(topology), "--clients", now, "--standbys", "1", "--json")
    assert code == 0, out
    data = json.loads(out)
    assert {p: (a["active"], a["standby"]) for p, a in data["assignment"].items()} == {
        p: (a["active"], a["standby"]) for p, a in assignment.items()
    }
    assert data["moves"] == [] and data["standby_moves"] == []
    # What if a third process joined: one active moves to it, cold.
    joined = tmp_path / "joined.json"
    grown = json.loads(Path(now).read_text())
    grown["assignment"]["p3"] = {"capacity": 1}
    joined.write_text(json.dumps(grown))
    code, out = run("plan", str(topology), "--clients", str(joined), "--standbys", "1", "--json")
    assert code == 0, out
    moves = json.loads(out)["moves"]
    assert [(m["to"], m["reason"], m["landing"]) for m in moves] == [
        ("p3", "balance quota", "cold")
    ]


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ('{"state": "Stable", "assignment": {}}', "no process in its 'assignment' table"),
        ('{"state": "Empty", "assignment": {}}', "saved in group state 'Empty'"),
        ('{"assignment": {"p1": {"capacity": 0}}}', "capacity must be an int >= 1"),
        ("{ garbage", "cannot read a saved assignment"),
        ('\ufeff{"tasks": {}}', "no 'assignment' table"),
        ("garbage", "invalid TOML"),
        # JSON past 64 bytes of whitespace, a JSON array or string: a JSON error, not TOML's.
        (" \n" * 40 + '{"state": "Stable", "assignment": {}}', "no process in its 'assignment'"),
        ('["p1", "p2"]', "no 'assignment' table"),
        ('"p1"', "no 'assignment' table"),
        ('[[client]]\nprocess_id = "p1"\ncapacity = 0\n', "capacity"),  # TOML still
        # Task ids of consumer and Faust-own groups are not the topology's: refused, not mapped.
        *(
            (
                json.dumps(
                    {"state": "Stable", "family": family, "assignment": {"m1": {"active": ["0_0"]}}}
                ),
                f"a snapshot of a group of protocol family {family}, whose task ids do not name",
            )
            for family in ("consumer", "faust")
        ),
    ],
)
def test_plan_refuses_a_bad_snapshot_as_clients_in_one_line(
    tmp_path: Path, content: str, named: str
) -> None:
    topology, clients = tmp_path / "clicks.toml", tmp_path / "now.json"
    topology.write_text(CLICKS + "[partitions]\nclicks = 4\n")
    clients.write_text(content)
    code, out = run("plan", str(topology), "--clients", str(clients))
    assert code == 1, out
    assert named in out and len(out.strip().splitlines()) == 1


def test_explain_last_reads_the_last_rebalance_from_one_snapshot(tmp_path: Path) -> None:
    # fin.json's shape: p1 and p2 reported the tasks they ran at the join (-2); p3 came back
    # and reported its checkpoints. The last rebalance moved 0_2 and 0_3 to p3.
    now = snapshot(
        tmp_path / "now.json",
        {
            "p1": {"active": ["0_4"], "standby": ["0_0"]},
            "p2": {"active": ["0_0"], "standby": ["0_2"]},
            "p3": {"active": ["0_2", "0_3"], "standby": ["0_4"]},
        },
        {
            "p1": {"0_2": -2, "0_4": -2, "0_0": 496},
            "p2": {"0_0": -2, "0_3": -2, "0_2": 652},
            "p3": {"0_2": 652, "0_4": 712},
        },
    )
    code, out = run("explain", "--last", now, "--json")
    assert code == 0, out
    assert json.loads(out) == {
        "moves": [
            {
                "task": "0_2",
                "from": "p1",
                "to": "p3",
                "reason": "balance quota",
                "landing": "local state",
            },
            {"task": "0_3", "from": "p2", "to": "p3", "reason": "balance quota", "landing": "cold"},
        ]
    }
    code, out = run("explain", "--last", now)
    assert code == 0, out
    assert "standbys not shown: at a join a previous standby reports its state" in out


def test_explain_last_hands_a_restarted_process_its_previous_actives(tmp_path: Path) -> None:
    # The reviewer's restart.json: P restarted quickly and reported checkpoints of 0_0 and 0_1
    # (and, in its subscription, that it ran them before); the leader handed them back. Nothing
    # moved. 0_4 P ran before too, but Q ran it meanwhile (reported running): Q's, and moved.
    assignment = {"P": {"active": ["0_0", "0_1", "0_4"]}, "Q": {"active": ["0_2", "0_3"]}}
    sums = {"P": {"0_0": 500, "0_1": 480, "0_4": 90}, "Q": {"0_2": -2, "0_3": -2, "0_4": -2}}
    now = snapshot(
        tmp_path / "restart.json", assignment, sums, previous={"P": ["0_0", "0_1", "0_4"]}
    )
    code, out = run("explain", "--last", now, "--json")
    assert code == 0, out
    assert json.loads(out)["moves"] == [
        {
            "task": "0_4",
            "from": "Q",
            "to": "P",
            "reason": "handed back to previous owner",
            "landing": "local state",
        }
    ]
    # A snapshot saved before describe --json carried previous_active still reads (as before).
    old = tmp_path / "old.json"
    data = json.loads(Path(now).read_text())
    for member in data["members"]:
        del member["previous_active"]
    old.write_text(json.dumps(data))
    code, out = run("explain", "--last", str(old), "--json")
    assert code == 0, out
    moves = json.loads(out)["moves"]
    assert [(m["from"], m["reason"]) for m in moves] == [
        (None, "no owner reported"),  # not "no previous owner": P may have run them
        (None, "no owner reported"),
        ("Q", "balance quota"),
    ]


def test_explain_last_says_the_leader_handed_a_task_back_to_its_caught_up_owner(
    tmp_path: Path,
) -> None:
    """The leader's rule (``client_states``): a restarted process that ran a task before it
    stopped and is caught up on it is the task's previous owner again, and the process that ran
    it meanwhile only a warm holder. ``--last`` read that as a balance move off the interim
    owner; it names the hand-back (not a move the plan counts), and says in one line what the
    snapshot cannot confirm. Without a checkpoint ProcessHost's leader cannot hand a task back
    (the Faust leader can: see the next test)."""
    p, q = uuid.UUID(int=1), uuid.UUID(int=2)
    t = TaskId.parse
    restarted = SubscriptionInfo(
        p,
        offset_sums={t("0_0"): 500, t("0_4"): 90},
        previous_active=frozenset({t("0_0"), t("0_4")}),
    )
    interim = SubscriptionInfo(q, offset_sums={t(x): -2 for x in ("0_1", "0_2", "0_3", "0_4")})
    members = {"m1": MemberSubscription({"clicks"}, restarted)}
    members["m2"] = MemberSubscription({"clicks"}, interim)
    clients, _, _ = client_states(members)
    tasks = [t(f"0_{i}") for i in range(5)]
    result = StickyTaskAssignor().assign(tasks, clients)
    assert t("0_4") in result[str(p)].active  # the leader handed it back
    assignment = {pid: {"active": [str(x) for x in sorted(a.active)]} for pid, a in result.items()}
    sums = {
        str(i.process_id): {str(x): s for x, s in i.offset_sums.items()}
        for i in (restarted, interim)
    }
    now = snapshot(tmp_path / "now.json", assignment, sums, previous={str(p): ["0_0", "0_4"]})
    code, out = run("explain", "--last", now, "--json")
    assert code == 0, out
    assert json.loads(out)["moves"] == [
        {
            "task": "0_4",
            "from": str(q),
            "to": str(p),
            "reason": "handed back to previous owner",
            "landing": "local state",
        }
    ]
    result = CliRunner().invoke(main, ["explain", "--last", now], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "0 of 1 taken off a process still in the group" in result.stdout
    text = " ".join(result.stdout.split())
    assert text.count("handed back: the new owner ran the task before it restarted") == 1
    assert "which a snapshot cannot confirm (it holds no end offsets)" in text
    # No checkpoint of 0_4 on P: for ProcessHost's leader (no protocol in the file, or
    # streamassign-streams), whatever moved it there, not the hand-back rule.
    bare = {"P": {"0_0": 500}, "Q": {"0_4": -2}}
    layout = {"P": {"active": ["0_0", "0_4"]}, "Q": {"active": ["0_1"]}}
    now = snapshot(tmp_path / "bare.json", layout, bare, previous={"P": ["0_4"]})
    code, out = run("explain", "--last", now, "--json")
    assert [(m["task"], m["reason"]) for m in json.loads(out)["moves"]] == [
        ("0_0", "no owner reported"),
        ("0_1", "no owner reported"),
        ("0_4", "balance quota"),
    ]
    protocol = "streamassign-streams"
    streams = snapshot(
        tmp_path / "streams.json", layout, bare, previous={"P": ["0_4"]}, protocol=protocol
    )
    code, out = run("explain", "--last", streams, "--json")
    assert [m["reason"] for m in json.loads(out)["moves"]][-1] == "balance quota"


def _faust_leader_round(
    infos: list[SubscriptionInfo], tasks: list[TaskId]
) -> dict[str, ClientAssignment]:
    """What the Faust leader assigns ``tasks`` to the members ``infos`` (one per worker): its
    client states, its hand-back of stateless tasks, the sticky assignor."""
    from streamassign.faust.leader import _offset_sums, _return_restarted

    members = {f"m{i}": MemberSubscription({"clicks"}, info) for i, info in enumerate(infos)}
    clients, by_process, _ = client_states(members)
    sums = _offset_sums(members, by_process)
    return StickyTaskAssignor().assign(tasks, _return_restarted(clients, members, by_process, sums))


def _saved_round(
    path: Path,
    infos: list[SubscriptionInfo],
    result: dict[str, ClientAssignment],
    protocol: str | None = None,
) -> str:
    """``result`` saved as describe --json saves it, each member's last join from ``infos``."""
    return snapshot(
        path,
        {pid: {"active": [str(x) for x in sorted(a.active)]} for pid, a in result.items()},
        {str(i.process_id): {str(x): s for x, s in i.offset_sums.items()} for i in infos},
        previous={str(i.process_id): [str(x) for x in i.previous_active] for i in infos},
        protocol=protocol,
    )


def test_explain_last_names_the_faust_leaders_hand_back_of_tasks_without_state(
    tmp_path: Path,
) -> None:
    """The Faust leader (``faust.leader._return_restarted``) hands a restarted worker that runs
    nothing the tasks it ran that it has no offset sum of (stateless tasks, in-memory tables),
    whatever their lag. explain read them as balance moves off the interim owner (3 moves where
    the leader made 1); they read as hand-backs, certain ones (no note)."""
    p, q = uuid.UUID(int=1), uuid.UUID(int=2)
    t = TaskId.parse
    tasks = [t(f"0_{i}") for i in range(6)]
    infos = [
        SubscriptionInfo(p, offset_sums={}, previous_active=frozenset({t("0_0"), t("0_4")})),
        SubscriptionInfo(q, offset_sums=dict.fromkeys(tasks, LATEST_OFFSET)),
    ]
    result = _faust_leader_round(infos, tasks)
    assert {t("0_0"), t("0_4")} < result[str(p)].active  # the leader handed them back
    now = _saved_round(tmp_path / "faust.json", infos, result, "streamassign-faust")
    code, out = run("explain", "--last", now, "--json")
    assert code == 0, out
    reasons = {m["task"]: m["reason"] for m in json.loads(out)["moves"]}
    assert reasons == {
        "0_0": "handed back to previous owner",
        "0_4": "handed back to previous owner",
        "0_5": "balance quota",
    }
    shown = CliRunner().invoke(main, ["explain", "--last", now], env=WIDE)
    assert "1 of 3 taken off a process still in the group" in shown.stdout
    assert "which a snapshot cannot confirm" not in " ".join(shown.stdout.split())
    # The same file without the Faust protocol: ProcessHost's leader has no such rule.
    plain = _saved_round(tmp_path / "plain.json", infos, result)
    code, out = run("explain", "--last", plain, "--json")
    assert {m["reason"] for m in json.loads(out)["moves"]} == {"balance quota"}


@pytest.mark.parametrize("protocol", [None, "streamassign-faust"])
def test_explain_last_names_no_hand_back_the_reported_sums_rule_out(
    tmp_path: Path, protocol: str | None
) -> None:
    """P restarted with a checkpoint of 0_4 at 90 while R reported one at 50,000: the leader's
    lag of P's copy is at least 49,910 (end offsets are at least every reported sum), over
    acceptable_recovery_lag, so the leader did not hand 0_4 back, and the sticky assignor moved
    it to P for balance. explain called it a hand-back (2 moves, not 3)."""
    p, q, r = (uuid.UUID(int=i) for i in (1, 2, 3))
    t = TaskId.parse
    tasks = [t(f"0_{i}") for i in range(9)]
    infos = [
        SubscriptionInfo(p, offset_sums={t("0_4"): 90}, previous_active=frozenset({t("0_4")})),
        SubscriptionInfo(q, offset_sums={t(f"0_{i}"): LATEST_OFFSET for i in range(5)}),
        SubscriptionInfo(
            r, offset_sums={t(f"0_{i}"): LATEST_OFFSET for i in range(5, 9)} | {t("0_4"): 50_000}
        ),
    ]
    result = _faust_leader_round(infos, tasks)
    assert t("0_4") in result[str(p)].active
    now = _saved_round(tmp_path / "now.json", infos, result, protocol)
    code, out = run("explain", "--last", now, "--json")
    assert code == 0, out
    moves = json.loads(out)["moves"]
    assert {m["task"]: m["reason"] for m in moves}["0_4"] == "balance quota"
    assert Counter(m["reason"] for m in moves) == {"balance quota": 3}
    # A leader configured with an acceptable lag this far (--acceptable-lag) may have.
    code, out = run("explain", "--last", now, "--json", "--acceptable-lag", "50000")
    assert {m["task"]: m["reason"] for m in json.loads(out)["moves"]}["0_4"] == (
        "handed back to previous owner"
    )


@settings(max_examples=max(10, settings.default.max_examples // 4))
@given(rejoining_members(), st.sampled_from([None, FAUST_PROTOCOL_NAME]))
def test_explain_names_the_hand_backs_the_leaders_made(
    infos: dict[str, SubscriptionInfo], protocol: str | None
) -> None:
    """Whatever the members reported when they joined, the tasks explain reads as handed back
    (from a describe --json file: members by process id) are the ones the leader handed back
    (``client_states``, ProcessHost's leader without end offsets; plus ``_return_restarted``,
    the Faust leader's): the previous actives it gave a process that did not run them. Member
    ids sort unlike process ids, as after a restart."""
    from streamassign.faust.leader import _offset_sums, _return_restarted

    members = {m: MemberSubscription({"clicks"}, i) for m, i in infos.items()}
    clients, by_process, _ = client_states(members)
    if protocol == FAUST_PROTOCOL_NAME:
        process_sums = _offset_sums(members, by_process)
        clients = _return_restarted(clients, members, by_process, process_sums)
    leader: dict[TaskId, str] = {}
    for c in clients:
        sums = merge_offset_sums(infos[m].offset_sums for m in by_process[c.process_id])
        ran = running_tasks(sums)
        leader |= dict.fromkeys(c.prev_active - ran, c.process_id)
    rows = [
        {
            "process": str(infos[m].process_id),
            "member_id": m,
            "topics": ["clicks"],
            "offset_sums": {str(t): s for t, s in infos[m].offset_sums.items()},
            "previous_active": [str(t) for t in infos[m].previous_active],
        }
        for m in sorted(infos, key=lambda m: (str(infos[m].process_id), m))
    ]
    data = {"state": "Stable", "protocol": protocol, "assignment": {}, "members": rows}
    assert load_snapshot(data, "now.json").handed_back() == leader


def test_explain_bounds_lags_by_each_members_checkpoint_as_the_leaders_do() -> None:
    """One member of process 1 runs 0_0, its other holds a checkpoint of 30,000; restarted
    process 2 claims 0_0 with 15,000. The leaders measure against each member's report, so 2
    is 15,000 behind and not handed 0_0 back: explain neither says so nor, in a what-if, gives
    2 a caught-up copy, whichever order the members were saved in."""
    p1, p2 = (str(uuid.UUID(int=i)) for i in (1, 2))
    rows = [
        {"process": p1, "member_id": "a", "topics": ["clicks"], "offset_sums": {"0_0": -2}},
        {"process": p1, "member_id": "b", "topics": ["clicks"], "offset_sums": {"0_0": 30_000}},
        {
            "process": p2,
            "member_id": "c",
            "topics": ["clicks"],
            "offset_sums": {"0_0": 15_000},
            "previous_active": ["0_0"],
        },
    ]
    assert LATEST_OFFSET == -2
    for order in (rows, rows[::-1]):
        assignment = {p1: {"active": ["0_0"]}, p2: {"active": []}}
        data = {"state": "Stable", "assignment": assignment, "members": order}
        snapshot = load_snapshot(data, "now.json")
        assert snapshot.handed_back() == {}
        lags = {c.process_id: c.lags for c in snapshot.clients()}
        assert lags[p2] == {TaskId(0, 0): 15_000}


def test_explain_of_two_snapshots_says_the_leader_handed_a_task_back_at_80_columns(
    tmp_path: Path,
) -> None:
    """BEFORE: the restarted process P was down, Q ran all. AFTER: the leader handed P back
    the task it declared it ran before and reported a caught-up checkpoint of. explain read it
    as a balance move off Q (as it is for the other task P took, its share); it names the
    hand-back, as explain --last does (one rule), and its table names the processes by
    unique prefixes, unfolded at 80 columns."""
    p = uuid.UUID("3f2a9c1e-7b44-4d2a-9e0c-5a1b2c3d4e5f")
    q = uuid.UUID("bbb0d247-4e44-4a7c-8aee-caababc63138")
    t = TaskId.parse
    tasks = [t(f"0_{i}") for i in range(4)]
    running = dict.fromkeys(tasks, LATEST_OFFSET)
    restarted = SubscriptionInfo(p, offset_sums={t("0_3"): 90}, previous_active={t("0_3")})
    members = {"m1": MemberSubscription({"clicks"}, restarted)}
    members["m2"] = MemberSubscription({"clicks"}, SubscriptionInfo(q, offset_sums=running))
    result = StickyTaskAssignor().assign(tasks, client_states(members)[0])
    assert result[str(p)].active == {t("0_2"), t("0_3")}  # 0_3 handed back, 0_2 its share
    sums = {str(q): {str(x): LATEST_OFFSET for x in tasks}}
    before = snapshot(tmp_path / "before.json", {str(q): {"active": list(map(str, tasks))}}, sums)
    after = snapshot(
        tmp_path / "after.json",
        {pid: {"active": [str(x) for x in sorted(a.active)]} for pid, a in result.items()},
        sums | {str(p): {"0_3": 90}},
        previous={str(p): ["0_3"]},
    )
    code, out = run("explain", before, after, "--json")
    assert code == 0, out
    assert json.loads(out)["moves"] == [
        {"task": "0_2", "from": str(q), "to": str(p), "reason": "balance quota", "landing": "cold"},
        {
            "task": "0_3",
            "from": str(q),
            "to": str(p),
            "reason": "handed back to previous owner",
            "landing": "local state",
        },
    ]
    shown = CliRunner().invoke(main, ["explain", before, after], env=WIDE | {"COLUMNS": "80"})
    assert shown.exit_code == 0, shown.output
    text = shown.stdout
    assert_whole_tables(text, ("task", "from", "to", "why", "state there"))
    assert str(p)[:9] not in text and str(q)[:9] not in text  # labels, not ids cut short
    assert re.search(r"│ 0_3\s+│ bbb0d247\s+│ 3f2a9c1e\s+│ handed back to", text), text
    assert re.search(r"│ 0_2\s+│ bbb0d247\s+│ 3f2a9c1e\s+│ balance quota", text)
    assert "1 of 2 taken off a process still in the group" in text


def test_explain_last_warns_of_a_task_two_processes_reported_running(tmp_path: Path) -> None:
    # now.json: the zombie c9 and bd both reported 0_3 running at the last join.
    now = snapshot(
        tmp_path / "now.json",
        {"bd": {"active": ["0_3"]}, "c9": {"active": ["0_5"]}},
        {"bd": {"0_3": -2, "0_5": -2}, "c9": {"0_3": -2, "0_5": -2}},
    )
    result = cli_runner().invoke(main, ["explain", "--last", now], env=WIDE)
    assert result.exit_code == 0, result.output
    # Wrapped to the terminal, as the zombie's warning had one line of hundreds of characters.
    assert " ".join(result.stderr.split()) == (
        f"warning: {now} (before its last rebalance): 2 tasks active on several clients: "
        "0_3 on bd, c9 (bd kept); 0_5 on bd, c9 (bd kept); each is taken as run by the "
        "claimant the sticky assignor keeps (smallest lag, then process id), the others as "
        "holding its state"
    )
    assert "0_5" in result.stdout and "local state" in result.stdout


def test_explain_last_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    consumer = tmp_path / "consumer.json"
    consumer.write_text(
        json.dumps(
            {
                "state": "Stable",
                "family": "consumer",
                "assignment": {"m1": {"active": ["0_0"]}},
                "members": [{"process": "m1", "topics": ["t"], "offset_sums": {}}],
            }
        )
    )
    plan = saved(tmp_path / "plan.json", {"p1": {"active": ["0_0"]}})
    for path, family in ((consumer, " (protocol family consumer)"), (plan, "")):
        code, out = run("explain", "--last", str(path))
        assert code == 1, out
        assert out.splitlines() == [
            f"Error: {path}: no member reports offset sums{family}: --last needs a describe "
            "--json snapshot of a streams-protocol group (ProcessHost, the Faust drop-in "
            "assignor)"
        ]
    for args in (["--last", plan, plan], [plan]):
        code, out = run("explain", *args)
        assert code == 2 and ("give one snapshot with --last" in out or "give BEFORE" in out)


def test_a_removed_task_lands_nowhere_and_a_moved_standby_is_one_row(tmp_path: Path) -> None:
    before = saved(
        tmp_path / "before.json",
        {"p1": {"active": ["0_0", "0_1"], "standby": ["0_2"]}, "p2": {"active": ["0_2"]}},
    )
    after = saved(
        tmp_path / "after.json",
        {"p1": {"active": ["0_0"]}, "p2": {"active": ["0_2"]}, "p3": {"standby": ["0_2"]}},
    )
    code, out = run("explain", before, after, "--json")
    assert code == 0, out
    assert json.loads(out)["moves"] == [
        {"task": "0_1", "from": "p1", "to": None, "reason": "task removed", "landing": None}
    ]
    code, out = run("explain", before, after)
    assert code == 0, out
    assert "0 of 1 taken off a process still in the group (the moves plan counts)" in out
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert [[cell.strip() for cell in row.split("│")[1:-1]] for row in rows] == [
        ["0_1", "p1", "-", "task removed", "-"],
        ["0_2", "p1", "p3", "standby balance"],
    ]


def test_plan_explain_and_diff_print_process_ids_and_file_names_verbatim(tmp_path: Path) -> None:
    """Process ids and file names are the user's: rich read ``[/]`` in a table cell or title
    as a closing tag (MarkupError, exit 1) and ``[fd00::1]`` as a tag (the host dropped),
    ``:fire:`` as an emoji code (a flame printed)."""
    ids = ["etl[/]", "[fd00::1]:8080", "c[red]x", "q:fire:x"]
    clients = tmp_path / "clients.toml"
    clients.write_text("".join(f'[[client]]\nprocess_id = "{pid}"\n' for pid in ids))
    code, table = run("plan", ORDERS, "--clients", str(clients))
    assert code == 0, table
    assert all(pid in table for pid in ids), table
    first, second = tmp_path / "a[red]b.json", tmp_path / "[b]c.json"
    code, out = run("plan", ORDERS, "--clients", str(clients), "--json")
    first.write_text(out)
    clients.write_text(clients.read_text() + '[[client]]\nprocess_id = "d[/]"\n')
    code, out = run("plan", ORDERS, "--clients", str(clients), "--json")
    second.write_text(out)
    code, moves = run("explain", str(first), str(second))
    assert code == 0 and "d[/]" in moves, moves
    code, diff = run("diff", str(first), str(second))
    assert code == 0 and "a[red]b.json -> [b]c.json" in diff and "d[/]" in diff, diff


def _live(
    path: Path, group: str, topic: str, standbys: int | None = 1, inferred: bool = True
) -> str:
    """A ``describe --json`` file of a 2-process group reading ``topic`` (4 partitions), one
    standby per task, ``quality.num_standby_replicas`` = ``standbys`` (None: no quality),
    ``inferred`` by describe or not."""
    assignment = {
        "p1": {"capacity": 1, "active": ["0_0", "0_1"], "standby": ["0_2", "0_3"]},
        "p2": {"capacity": 1, "active": ["0_2", "0_3"], "standby": ["0_0", "0_1"]},
    }
    members = [
        {
            "member_id": f"m-{pid}",
            "process": pid,
            "topics": [topic],
            "active": entry["active"],
            "standby": entry["standby"],
            "offset_sums": {},
            "undecodable": None,
        }
        for pid, entry in assignment.items()
    ]
    data: dict[str, object] = {
        "group": group,
        "state": "Stable",
        "family": "streams",
        "tasks": {f"0_{n}": [[topic, n]] for n in range(4)},
        "assignment": assignment,
        "members": members,
    }
    if standbys is not None:
        data["quality"] = {
            "num_standby_replicas": standbys,
            "num_standby_replicas_inferred": inferred,
        }
    path.write_text(json.dumps(data))
    return str(path)


_COUNTS = "[partitions]\nclicks = 4\npromos = 4\n"


def _invoke(*args: str) -> tuple[int, str, str]:
    result = cli_runner().invoke(main, list(args), env=WIDE)
    return result.exit_code, result.stdout, result.stderr


def test_plan_from_a_snapshot_of_other_topics_warns(tmp_path: Path) -> None:
    """A new user's audit: `plan topology.toml --clients after.json` where the snapshot's group
    reads other topics gave a plausible plan (tasks matched by id alone) and no warning."""
    topology = tmp_path / "clicks.toml"
    topology.write_text(CLICKS + "[partitions]\nclicks = 4\n")
    other = _live(tmp_path / "other.json", "views-app", "views")
    code, _, err = _invoke("plan", str(topology), "--clients", other)
    assert code == 0
    assert (
        f"warning: 4 tasks read other partitions in the topology than in {other} (topics of "
        f"{other}: views; of the topology: clicks); tasks are matched by id alone: is it the "
        "same application?"
    ) in err.splitlines()
    same = _live(tmp_path / "same.json", "clicks-app", "clicks")
    code, _, err = _invoke("plan", str(topology), "--clients", same)
    assert code == 0 and "warning" not in err


def test_a_topic_added_mid_roll_is_a_topology_change_not_another_application(
    tmp_path: Path,
) -> None:
    """A review: adding a source topic to a subtopology during a roll (the moment a what-if or
    an explain is run) asked "is it the same application?". Sharing a topic (and no names that
    differ) makes it one application's topology change, said with the topics added and
    removed (two names that differ still ask: the next test)."""
    now, added = _clicks_and_promos(tmp_path)
    code, _, err = _invoke("plan", str(added), "--clients", now)
    assert code == 0
    assert err.splitlines()[-1] == (
        f"warning: 4 tasks read other partitions in the topology than in {now}: a topology "
        "change (added topic promos); tasks are matched by id"
    )
    # Named as the group (its application id), and sharing its topic: a change.
    grown = tmp_path / "grown.toml"
    grown.write_text('name = "clicks-app"\n' + added.read_text())
    code, _, err = _invoke("plan", str(grown), "--clients", now)
    assert code == 0 and err.splitlines()[-1].endswith(
        "a topology change (added topic promos); tasks are matched by id"
    )
    # explain of one group's snapshots across the change.
    later = json.loads(Path(now).read_text())
    later["tasks"] = {f"0_{n}": [["clicks", n], ["promos", n]] for n in range(4)}
    after = tmp_path / "after.json"
    after.write_text(json.dumps(later))
    for command in ("explain", "diff"):
        code, _, err = _invoke(command, now, str(after))
        assert (code, err.splitlines()) == (
            0,
            [
                f"warning: 4 tasks read other partitions in {after} than in {now}: a topology "
                "change (added topic promos); tasks are matched by id"
            ],
        )


def _clicks_and_promos(tmp_path: Path) -> tuple[str, Path]:
    """A snapshot of group clicks-app reading clicks, and an unnamed topology of it that
    reads promos too (the shared topic tells they are one application's)."""
    now = _live(tmp_path / "now.json", "clicks-app", "clicks")
    added = tmp_path / "added.toml"
    added.write_text(CLICKS.replace('["clicks"]', '["clicks", "promos"]') + _COUNTS)
    return now, added


def test_a_topology_of_another_name_or_no_topic_shared_asks(tmp_path: Path) -> None:
    """A review: two names that differ ask, naming them (plan prints no group line). A later
    review: one name with no topic shared may be another environment's application
    (application ids are often kept across them): asked too, saying so."""
    now, added = _clicks_and_promos(tmp_path)
    # Named as the group, but every topic replaced (staging.clicks vs prod.clicks): asked.
    renamed = tmp_path / "renamed.toml"
    renamed.write_text('name = "clicks-app"\n' + CLICKS.replace('"clicks"', '"hits", "views"'))
    renamed.write_text(renamed.read_text() + "[partitions]\nhits = 4\nviews = 4\n")
    code, _, err = _invoke("plan", str(renamed), "--clients", now)
    assert code == 0
    assert err.splitlines()[-1] == (
        f"warning: 4 tasks read other partitions in the topology than in {now} (both named "
        f"'clicks-app', no topic shared; topics of {now}: clicks; of the topology: hits, "
        "views); tasks are matched by id alone: is it the same application?"
    )
    # Another application's name, topics shared: asked, naming both.
    other = tmp_path / "other.toml"
    other.write_text('name = "promos-app"\n' + added.read_text())
    code, _, err = _invoke("plan", str(other), "--clients", now)
    assert code == 0
    assert err.splitlines()[-1] == (
        f"warning: 4 tasks read other partitions in the topology than in {now} ({now} is of "
        "group 'clicks-app', the topology of 'promos-app'; topics of "
        f"{now}: clicks; of the topology: clicks, promos); tasks are matched by id alone: is "
        "it the same application?"
    )


def test_explain_and_diff_of_two_groups_warn(tmp_path: Path) -> None:
    """A new user's audit: explain / diff of snapshots of two different groups told a normal
    story. Now a warning names both groups, and another names tasks of other partitions."""
    before = _live(tmp_path / "before.json", "clicks-app", "clicks")
    after = _live(tmp_path / "after.json", "payments-prod", "payments")
    for command in ("explain", "diff"):
        code, _, err = _invoke(command, before, after)
        assert code == 0
        lines = err.splitlines()
        assert lines[0] == (
            f"warning: {before} is of group 'clicks-app', {after} of group 'payments-prod': "
            "compared as one group's"
        )
        assert lines[1] == (
            f"warning: 4 tasks read other partitions in {after} than in {before} (topics of "
            f"{before}: clicks; of {after}: payments); tasks are matched by id alone: is it the "
            "same application?"
        )
    code, _, err = _invoke("explain", before, before)
    assert (code, err) == (0, "")


def test_a_what_if_from_a_snapshot_keeps_its_standby_count(tmp_path: Path) -> None:
    """A new user's audit: `plan --clients now.json` without --standbys planned 0 standbys,
    so every current standby read as dropped. Now the snapshot's count is the default, said
    on stderr; a file stating none plans 0 with a warning; --standbys wins."""
    topology = tmp_path / "clicks.toml"
    topology.write_text(CLICKS + "[partitions]\nclicks = 4\n")
    now = _live(tmp_path / "now.json", "clicks-app", "clicks", inferred=False)
    code, out, err = _invoke("plan", str(topology), "--clients", now, "--json")
    assert code == 0
    assert err.splitlines() == [
        f"note: --standbys 1 from {now} (its num_standby_replicas); give --standbys for the app's"
    ]
    data = json.loads(out)
    assert data["standby_moves"] == [] and data["metrics"]["standbys_dropped"] == 0
    assert data["metrics"]["num_standby_replicas"] == 1
    # plan --json states its count: a what-if of the what-if keeps it too.
    planned = tmp_path / "planned.json"
    planned.write_text(out)
    code, _, err = _invoke("plan", str(topology), "--clients", str(planned))
    assert code == 0 and err.startswith(f"note: --standbys 1 from {planned}")
    assert json.loads(out)["metrics"]["num_standby_replicas_inferred"] is False
    code, out, err = _invoke("plan", str(topology), "--clients", now, "--standbys", "0", "--json")
    assert (code, err) == (0, "") and json.loads(out)["metrics"]["standbys_dropped"] == 4
    unstated = _live(tmp_path / "unstated.json", "clicks-app", "clicks", standbys=None)
    code, out, err = _invoke("plan", str(topology), "--clients", unstated, "--json")
    assert code == 0 and json.loads(out)["metrics"]["standbys_dropped"] == 4
    assert err.splitlines() == [
        f"warning: {unstated} states no num_standby_replicas and --standbys is not given: "
        "planned with 0, which drops its standbys (up to 1 per task); give --standbys"
    ]


def test_a_what_if_says_when_the_snapshot_may_hold_fewer_standbys_than_the_app(
    tmp_path: Path,
) -> None:
    """A review: a what-if silently planned fewer standbys than the app runs. An inferred
    count at the cap the snapshot's processes set (0 from one process) gets a note naming
    --standbys, also for 0 and when the what-if adds a process; a stated count below what
    the file holds, a warning. An inferred count below the cap keeps the plain note."""
    topology = tmp_path / "clicks.toml"
    topology.write_text(CLICKS + "[partitions]\nclicks = 4\n")
    solo = json.loads(Path(_live(tmp_path / "x.json", "clicks-app", "clicks", 0)).read_text())
    solo["assignment"] = {"p1": {"capacity": 1, "active": [f"0_{n}" for n in range(4)]}}
    solo["members"] = solo["members"][:1]
    solo["assignment"]["new-host"] = {"capacity": 1}  # the docs' scale-out what-if
    scale_out = tmp_path / "scale-out.json"
    scale_out.write_text(json.dumps(solo))
    code, out, err = _invoke("plan", str(topology), "--clients", str(scale_out), "--json")
    # plan --json says describe inferred it: a what-if of this what-if says so too.
    metrics = json.loads(out)["metrics"]
    assert code == 0 and (
        metrics["num_standby_replicas"],
        metrics["num_standby_replicas_inferred"],
    ) == (0, True)
    assert err.splitlines() == [
        f"note: --standbys 0 from {scale_out}, which describe inferred from 1 process (none "
        "fit): the app may run more; give --standbys N for the app's"
    ]
    # A what-if of that plan --json (2 processes in its table) said nothing; it
    # states the processes describe counted, so it keeps the note.
    assert metrics["num_standby_replicas_processes"] == 1
    planned = tmp_path / "planned.json"
    planned.write_text(out)
    code, _, err = _invoke("plan", str(topology), "--clients", str(planned))
    assert code == 0 and err.splitlines() == [
        f"note: --standbys 0 from {planned}, which describe inferred from 1 process (none "
        "fit): the app may run more; give --standbys N for the app's"
    ]
    # A review: a topology without state places no standby: no count can matter, none said.
    stateless = tmp_path / "stateless.toml"
    stateless.write_text(topology.read_text().replace('stores = ["totals"]\n', ""))
    for snapshot in (str(scale_out), _live(tmp_path / "unstated.json", "c", "clicks", None)):
        code, out, err = _invoke("plan", str(stateless), "--clients", snapshot, "--json")
        assert (code, err) == (0, ""), err
        assert json.loads(out)["metrics"]["num_standby_replicas"] == 0
    # At the cap of 2 processes (1 per task fit): a note too.
    at_cap = _live(tmp_path / "at-cap.json", "clicks-app", "clicks")
    code, _, err = _invoke("plan", str(topology), "--clients", at_cap)
    assert code == 0 and err.splitlines()[0].endswith(
        "which describe inferred from 2 processes (at most 1 per task fit): the app may run "
        "more; give --standbys N for the app's"
    )
    # Below the cap (a third process): the plain note.
    three = json.loads(Path(at_cap).read_text())
    three["assignment"]["p3"] = {"capacity": 1}
    three["members"].append({**three["members"][0], "member_id": "m-p3", "process": "p3"})
    below = tmp_path / "below.json"
    below.write_text(json.dumps(three))
    code, _, err = _invoke("plan", str(topology), "--clients", str(below))
    assert code == 0 and err.splitlines() == [
        f"note: --standbys 1 from {below} (its num_standby_replicas, which describe inferred: "
        "the most any task had); give --standbys for the app's"
    ]
    # describe --standbys 0 of a group running 1 per task: planned with 0, warned.
    stated = _live(tmp_path / "stated.json", "clicks-app", "clicks", 0, inferred=False)
    code, out, err = _invoke("plan", str(topology), "--clients", stated, "--json")
    assert code == 0 and json.loads(out)["metrics"]["standbys_dropped"] == 4
    assert err.splitlines() == [
        f"warning: {stated} states num_standby_replicas 0 but holds up to 1 per task: planned "
        "with 0, which drops standbys; give --standbys for the app's"
    ]


def test_a_scale_in_what_if_keeps_the_processes_describe_inferred_standbys_over(
    tmp_path: Path,
) -> None:
    """A what-if deleting a process's member rows too (a scale-in) said the count
    was inferred from 2 processes, at their cap, when describe saw 3 (1 of at most 2 fit):
    describe's own count (``quality.clients``) stands, whatever rows a what-if deletes."""
    topology = tmp_path / "clicks.toml"
    topology.write_text(CLICKS + "[partitions]\nclicks = 4\n")
    three = json.loads(Path(_live(tmp_path / "x.json", "clicks-app", "clicks")).read_text())
    three["quality"]["clients"] = 3  # describe's metrics: the processes it saw
    scale_in = tmp_path / "scale-in.json"
    scale_in.write_text(json.dumps(three))  # p3 gone from the table and the member rows
    code, out, err = _invoke("plan", str(topology), "--clients", str(scale_in), "--json")
    assert code == 0 and err.splitlines() == [
        f"note: --standbys 1 from {scale_in} (its num_standby_replicas, which describe "
        "inferred: the most any task had); give --standbys for the app's"
    ]
    assert json.loads(out)["metrics"]["num_standby_replicas_processes"] == 3
    # Told the count (describe --standbys), none is inferred and none passed on.
    stated = _live(tmp_path / "stated.json", "clicks-app", "clicks", inferred=False)
    code, out, _ = _invoke("plan", str(topology), "--clients", stated, "--json")
    assert code == 0 and json.loads(out)["metrics"]["num_standby_replicas_processes"] is None


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (-1, "-1"),
        (10**30, "1000000000000000000000000000000"),
        (2**31, "2147483648"),
        ("3", '"3"'),
        (1.0, "1.0"),
        (True, "true"),
        ([1], "[1]"),
        ("x" * 100, '"' + "x" * 36 + "..."),
    ],
)
def test_a_what_if_with_a_bad_process_count_is_one_line(
    tmp_path: Path, value: object, shown: str
) -> None:
    """A ``metrics.num_standby_replicas_processes`` (or ``quality.clients``) that
    is not a count of processes was ignored without a word, or taken (a huge one hid the
    cap note): one line naming the file, the key and the value, exit 1, no plan. Absent,
    null and 0 (none counted) are a file that does not say, as before the key."""
    topology = tmp_path / "clicks.toml"
    topology.write_text(CLICKS + "[partitions]\nclicks = 4\n")
    live = json.loads(Path(_live(tmp_path / "x.json", "clicks-app", "clicks", 0)).read_text())
    for key, name in (("quality", "clients"), ("metrics", "num_standby_replicas_processes")):
        bad = json.loads(json.dumps(live))
        if key == "metrics":  # as plan --json states it: no describe quality table
            del bad["quality"]
        bad.setdefault(key, {})[name] = value
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(bad))
        code, out, err = _invoke("plan", str(topology), "--clients", str(path))
        assert (code, out) == (1, "")
        assert err.splitlines() == [
            f"Error: {path}: {key}.{name} is {shown}, not a count of processes (a whole number "
            "from 0 to 2,147,483,647, or null)"
        ]
    for unsaid in (None, 0):
        live["quality"]["clients"] = unsaid
        path = tmp_path / "unsaid.json"
        path.write_text(json.dumps(live))
        code, _, err = _invoke("plan", str(topology), "--clients", str(path))
        assert code == 0 and "not a count" not in err


def test_a_crash_what_if_names_the_lost_process(tmp_path: Path) -> None:
    """A new user's audit: the docs' crash what-if (`jq del(.assignment[P])`) listed P's tasks
    `from -`, `no previous owner`. Its member rows still say what P ran: `client gone`."""
    topology = tmp_path / "clicks.toml"
    topology.write_text(CLICKS + "[partitions]\nclicks = 4\n")
    now = Path(_live(tmp_path / "now.json", "clicks-app", "clicks"))
    crash = json.loads(now.read_text())
    del crash["assignment"]["p1"]
    lost = tmp_path / "crash.json"
    lost.write_text(json.dumps(crash))
    code, out, _ = _invoke("plan", str(topology), "--clients", str(lost), "--json")
    assert code == 0
    data = json.loads(out)
    assert {(m["task"], m["from"], m["reason"], m["landing"]) for m in data["moves"]} == {
        ("0_0", "p1", "client gone", "standby"),
        ("0_1", "p1", "client gone", "standby"),
    }
    assert {(c["task"], c["from"], c["reason"]) for c in data["standby_moves"]} == {
        ("0_2", "p1", "client gone"),
        ("0_3", "p1", "client gone"),
        ("0_0", "p2", "became active"),
        ("0_1", "p2", "became active"),
    }
    assert data["metrics"]["moves"] == 0


def test_the_standby_table_title_counts_drops_and_placings() -> None:
    """A new user's audit: "Standby copies dropped or placed: 2" over one row (a copy that
    moved is one row, a drop and a placing). The title says each count."""
    from streamassign.cli.console import _Stdout
    from streamassign.cli.views import _print_moves

    before = {"a": view(1, "0_0", "0_1"), "b": view(1, "0_1")}
    after = {"a": view(1, "0_0"), "b": view(1, "0_1"), "c": view(1, "", "0_1")}
    console = _Stdout(width=100, record=True)
    _print_moves(console, explain(before, after))
    text = console.export_text()
    assert "Standby copies: 1 dropped, 1 placed" in text
    assert sum(1 for line in text.splitlines() if line.startswith("│ 0_1")) == 1


def test_plan_explain_counts_standbys_the_quality_table_leaves_out() -> None:
    """A new user's audit: plan --standbys 1 --explain said "kept / dropped 5 / 3" in its
    Quality table and "Standby copies: 5 dropped, 7 placed" under it. The two drops the table
    leaves out are standbys that became active there: each count says what it counts."""
    from click.testing import CliRunner

    from streamassign.cli import main

    args = ["plan", str(ROOT / "topology" / "orders-join.toml"), "--clients"]
    args += [str(ROOT / "examples" / "clients.toml"), "--standbys", "1", "--explain"]
    result = CliRunner().invoke(main, args, env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert "previous standbys kept / dropped (not counting any now active) │   5 / 3" in (
        result.output
    )
    assert "Standby copies: 5 dropped, 7 placed" in result.output
    assert (
        "2 of the 5 dropped became active where they were (not counted as previous standbys "
        "dropped)\n"
    ) in result.output


def _consumer_group(path: Path, topics: list[str], owners: dict[str, list[str]]) -> str:
    """A ``describe --json`` file of consumer group ``billing`` (protocol ``range``) whose
    processes ``owners`` read the partitions named ``topic-p``, numbered as ``describe``
    numbers a consumer group's tasks: ``t_p`` is partition ``p`` of the ``t``-th topic of
    ``topics`` in name order."""
    number = {topic: t for t, topic in enumerate(sorted(topics))}

    def task(name: str) -> str:
        topic, _, partition = name.rpartition("-")
        return f"{number[topic]}_{partition}"

    owned = [name for names in owners.values() for name in names]
    data = {
        "group": "billing",
        "state": "Stable",
        "protocol_type": "consumer",
        "protocol": "range",
        "family": "consumer",
        "tasks": {task(n): [n.rpartition("-")[::2]] for n in owned},
        "assignment": {
            pid: {"capacity": 1, "active": sorted(map(task, names)), "standby": [], "warmup": []}
            for pid, names in owners.items()
        },
        "members": [],
    }
    for parts in data["tasks"].values():  # type: ignore[attr-defined]
        parts[0] = [parts[0][0], int(parts[0][1])]
    path.write_text(json.dumps(data, indent=1))
    return str(path)


#: A consumer-group pair (cons-before.json, cons-after.json): topic a-new added to the
#: subscription of group billing; no partition of orders changed owner.
_A, _B = "aaaaaaaa-0000-0000-0000-000000000001", "bbbbbbbb-0000-0000-0000-000000000002"
_ORDERS_BEFORE = {_A: ["orders-0", "orders-1"], _B: ["orders-2", "orders-3"]}
_ORDERS_AFTER = {
    _A: ["a-new-2", "a-new-3", "orders-0", "orders-1"],
    _B: ["a-new-0", "a-new-1", "orders-2", "orders-3"],
}


def test_a_consumer_groups_tasks_are_matched_by_partition_across_a_new_topic(
    tmp_path: Path,
) -> None:
    """A review: a consumer group's t_p is partition p of its t-th topic in name order, so a
    subscribed topic that sorts first renumbered every task: explain / diff of one group's
    snapshots listed orders' partitions as moved (balance quota) and the warning called it a
    topology change whose ids still match. Its tasks are matched by partition, named as in
    AFTER, said in a note: only the new topic's partitions are placed, nothing moved."""
    before = _consumer_group(tmp_path / "cons-before.json", ["orders"], _ORDERS_BEFORE)
    after = _consumer_group(tmp_path / "cons-after.json", ["a-new", "orders"], _ORDERS_AFTER)
    # The fixture numbers as describe does (t_p: partition p of the t-th topic in name order).
    assert json.loads(Path(after).read_text())["tasks"]["1_0"] == [["orders", 0]]
    note = (
        f"note: tasks matched by partition, named as in {after}: a consumer group's task t_p is "
        "partition p of its t-th topic in name order, renumbered by a change of topics (added "
        "topic a-new)"
    )
    code, out, err = _invoke("explain", before, after, "--json")
    assert (code, err.splitlines()) == (0, [note])
    moves = json.loads(out)["moves"]
    assert {m["task"]: (m["from"], m["to"]) for m in moves} == {
        "0_0": (None, _B),
        "0_1": (None, _B),
        "0_2": (None, _A),
        "0_3": (None, _A),
    }
    code, out, err = _invoke("explain", before, after)
    assert code == 0 and "0 of 4 taken off a process still in the group" in out
    code, out, err = _invoke("diff", before, after, "--json")
    assert (code, err.splitlines()) == (0, [note])
    assert {pid: (row["+active"], row["-active"]) for pid, row in json.loads(out).items()} == {
        _A: (["0_2", "0_3"], []),
        _B: (["0_0", "0_1"], []),
    }
    # A partition that did move is still one move, under AFTER's id, and ids that do not
    # shift need no note (a topic removed: test_a_removed_topics_partitions_are_shown_by_...).
    swapped = {
        _A: ["a-new-2", "a-new-3", "orders-0", "orders-2"],
        _B: ["a-new-0", "a-new-1", "orders-1", "orders-3"],
    }
    moved = _consumer_group(tmp_path / "moved.json", ["a-new", "orders"], swapped)
    code, out, err = _invoke("explain", before, moved, "--json")
    assert (code, err) == (0, note.replace(after, moved) + "\n")
    assert [(m["task"], m["reason"]) for m in json.loads(out)["moves"] if m["from"]] == [
        ("1_1", "balance quota"),
        ("1_2", "balance quota"),
    ]
    code, out, err = _invoke("explain", before, before, "--json")
    assert (code, err, json.loads(out)["moves"]) == (0, "", [])


def test_only_two_consumer_groups_well_formed_tasks_are_renumbered(tmp_path: Path) -> None:
    """Comparing two files renames BEFORE's tasks (its table, assignment, member rows) only
    when both files are consumer groups' and their tables are one partition per task,
    numbered by topic: a streams group's ids follow its subtopologies, and a hand-edited table
    that breaks the rule is compared by id, as before."""
    before = json.loads(
        Path(_consumer_group(tmp_path / "b.json", ["orders"], _ORDERS_BEFORE)).read_text()
    )
    before["members"] = [
        {"member_id": "m", "process": _A, "topics": ["orders"], "active": ["0_0", "0_1"]}
    ]
    del before["assignment"][_A]  # a removed process: its member rows say what it ran
    after = json.loads(
        Path(_consumer_group(tmp_path / "a.json", ["a-new", "orders"], _ORDERS_AFTER)).read_text()
    )
    old, new = load_snapshot(before, "b"), load_snapshot(after, "a")

    def numbered_as(before: Snapshot, after: Snapshot) -> Snapshot:
        """BEFORE as the comparison with AFTER names its tasks."""
        return compare_snapshots(before, after, "b", "a").before

    renamed = numbered_as(old, new)
    assert renamed.tasks == {k: v for k, v in new.tasks.items() if k.subtopology == 1}
    assert renamed.views[_B].assignment.active == {TaskId(1, 2), TaskId(1, 3)}
    assert renamed.departed[_A].assignment.active == {TaskId(1, 0), TaskId(1, 1)}
    two_partitions = dict(new.tasks)
    two_partitions[TaskId(0, 0)] |= new.tasks[TaskId(1, 0)]
    off_by_one = dict(old.tasks) | {TaskId(0, 1): old.tasks[TaskId(0, 2)]}
    unknown = {_B: view(1, "0_2 0_3 5_0")}  # a task of a topic its table lacks
    for family in ("streams", None):
        assert numbered_as(old, attrs.evolve(new, family=family)) is old
        other = attrs.evolve(old, family=family)
        assert numbered_as(other, new) is other
    assert numbered_as(old, attrs.evolve(new, tasks=two_partitions)) is old
    for damaged in (attrs.evolve(old, tasks=off_by_one), attrs.evolve(old, views=unknown)):
        assert numbered_as(damaged, new) is damaged


def test_explain_asks_of_one_groups_name_with_no_topic_shared(tmp_path: Path) -> None:
    """A review: application ids are often kept across environments while topics differ
    (staging.clicks, prod.clicks); the same group name with no topic shared read as "a
    topology change". It asks, saying what the two have in common and not."""
    before = _live(tmp_path / "staging.json", "clicks-app", "staging.clicks")
    after = _live(tmp_path / "prod.json", "clicks-app", "prod.clicks")
    code, _, err = _invoke("explain", before, after)
    assert (code, err.splitlines()) == (
        0,
        [
            f"warning: 4 tasks read other partitions in {after} than in {before} (both named "
            f"'clicks-app', no topic shared; topics of {before}: staging.clicks; of {after}: "
            "prod.clicks); tasks are matched by id alone: is it the same application?"
        ],
    )


def _table(*partitions: str) -> dict[TaskId, frozenset[TopicPartition]]:
    """A consumer group's ``tasks`` table of ``t_p=topic-p`` entries."""
    table = {}
    for entry in partitions:
        task, _, name = entry.partition("=")
        topic, _, partition = name.rpartition("-")
        table[TaskId.parse(task)] = frozenset([TopicPartition(topic, int(partition))])
    return table


def test_a_consumer_groups_tasks_are_numbered_as_the_other_table_numbers_its_topics() -> None:
    """``explain`` and ``diff`` number a consumer group's BEFORE as AFTER numbers its topics
    (``describe --watch`` shares the rule), a pure function of the two tables: a shared topic
    takes AFTER's number, a removed one a number past every id AFTER names (a hand-edited id
    outside its table too); other tables are matched by id."""

    def consumer_group(*partitions: str) -> Snapshot:
        return Snapshot({}, family=CONSUMER_FAMILY, tasks=_table(*partitions))

    def numbered(before: Snapshot, after: Snapshot) -> Mapping[TaskId, frozenset[TopicPartition]]:
        """BEFORE's table as the comparison with AFTER numbers it."""
        return compare_snapshots(before, after, "b", "a").before.tasks

    orders = consumer_group("0_0=orders-0", "0_1=orders-1")
    grown = consumer_group("0_0=a-new-0", "1_0=orders-0", "1_1=orders-1")
    assert numbered(orders, grown) == _table("1_0=orders-0", "1_1=orders-1")
    past_orders = _table("0_0=orders-0", "0_1=orders-1", "1_0=a-new-0")
    assert numbered(grown, orders) == past_orders
    named_1_0 = attrs.evolve(orders, views={_A: view(1, "1_0")})  # an id outside its table
    assert numbered(grown, named_1_0) == _table("0_0=orders-0", "0_1=orders-1", "2_0=a-new-0")
    assert compare_snapshots(orders, orders, "b", "a").before is orders
    two = {TaskId(0, 0): frozenset([TopicPartition("a", 0), TopicPartition("b", 0)])}
    for damaged in (attrs.evolve(orders, tasks=two), consumer_group("0_1=orders-0")):
        assert compare_snapshots(damaged, grown, "b", "a").before is damaged
        assert compare_snapshots(grown, damaged, "b", "a").before is grown


def test_a_removed_topics_partitions_are_shown_by_partition(tmp_path: Path) -> None:
    """A review: a removed topic's partitions got ids past AFTER's, which name other
    partitions (or nothing) in either file: a reader looking them up found partitions that
    did not move. A consumer group's moves name partitions; --json gives no id for those
    and the note says the numbers ``diff`` shows them under."""
    before = _consumer_group(tmp_path / "before.json", ["a-new", "orders"], _ORDERS_AFTER)
    after = _consumer_group(tmp_path / "after.json", ["orders"], _ORDERS_BEFORE)
    code, out, err = _invoke("explain", before, after, "--json")
    assert code == 0
    assert err.endswith(
        "(removed topic a-new); a removed topic numbered past every id there: a-new as 1_p\n"
    )
    assert [(m["task"], m["partition"], m["to"]) for m in json.loads(out)["moves"]] == [
        (None, ["a-new", p], None) for p in range(4)
    ]
    code, out, _ = _invoke("explain", before, after)
    rows = [line.split()[1] for line in out.splitlines() if line.startswith("│")]
    assert rows == ["a-new-0", "a-new-1", "a-new-2", "a-new-3"] and "partition" in out
    # Hand-edited: AFTER names 1_0 outside its table; a-new is numbered past it, not onto it.
    edited = json.loads(Path(after).read_text())
    edited["assignment"][_B]["active"].append("1_0")
    Path(after).write_text(json.dumps(edited))
    code, out, err = _invoke("explain", before, after, "--json")
    assert code == 0 and err.endswith("a-new as 2_p\n")
    moves = {(m["task"], m["from"], m["to"], m["reason"]) for m in json.loads(out)["moves"]}
    assert ("1_0", None, _B, "no previous owner") in moves
    assert not any(source and to for _, source, to, _ in moves)  # no move onto _B


def test_a_subscribed_topic_without_partitions_says_so(tmp_path: Path) -> None:
    """A review: a topic subscribed that has no partition (not created yet, a typo) renumbers
    every id though both tables have the same topics; the note said "renumbered by the two
    files". It names the likely cause."""
    before = _consumer_group(tmp_path / "before.json", ["orders"], _ORDERS_BEFORE)
    after = _consumer_group(tmp_path / "after.json", ["0-missing", "orders"], _ORDERS_BEFORE)
    code, out, err = _invoke("explain", before, after, "--json")
    assert (code, json.loads(out)["moves"]) == (0, [])
    assert err.endswith(
        "renumbered by a subscribed topic with no partition assigned (or an edited file)\n"
    )


#: ``describe --json`` of a two-worker Faust app in a rolling switch from Faust's own assignor
#: (``faust``: topic-group ids, URL keys) to the drop-in (``streamassign-faust``: ids by
#: partition count, UUID keys): each worker kept its source partitions; only the leader
#: topic's partition moved, from the worker on 6082 to the one on 6081.
SWITCH_MIXED = Path(__file__).parent / "data" / "faust_switch_mixed.json"
SWITCH_AFTER = Path(__file__).parent / "data" / "faust_switch_after.json"


def test_explain_across_an_assignor_switch_matches_tasks_by_partition_and_workers_by_url() -> None:
    """Matched by id and key, every task read as removed and every worker as gone (17 moves
    that never were, and a "topology change" warning); matched by partition and endpoint,
    the one real move is left, and a note says the protocol changed."""
    result = CliRunner().invoke(main, ["explain", str(SWITCH_MIXED), str(SWITCH_AFTER), "--json"])
    assert result.exit_code == 0, result.output
    moves = json.loads(result.stdout)["moves"]
    assert [(m["task"], m["from"], m["to"]) for m in moves] == [
        ("1_0", "b7a91592-84b1-4ee4-9174-d00fceeec9b6", "712a242c-4b4e-4e83-802c-bf08fb5c4c09")
    ]
    assert " ".join(result.stderr.split()) == (
        "note: the assignor protocol changed from faust to streamassign-faust, which name tasks "
        "and processes differently: 9 of 9 tasks matched by partition, 2 of 2 processes by "
        "member id or endpoint"
    )


def test_a_switch_that_also_changes_the_topology_says_how_few_tasks_matched(
    tmp_path: Path,
) -> None:
    """The switch also gives each 8_p a second changelog: no later task reads the same
    partitions, every one read as removed and taken by a task of no previous owner, and the
    note, one line of 200 characters, counted only processes."""
    after = json.loads(SWITCH_AFTER.read_text())
    for task, partitions in after["tasks"].items():
        if task.startswith("8_"):
            partitions.append(["stock-other-changelog", int(task[2:])])
    changed = tmp_path / "after.json"
    changed.write_text(json.dumps(after))
    result = CliRunner().invoke(
        main, ["explain", str(SWITCH_MIXED), str(changed)], env={"COLUMNS": "60"}
    )
    assert result.exit_code == 0, result.output
    note = result.stderr[: result.stderr.index("\n", result.stderr.index("endpoint"))]
    assert "1 of 9 tasks matched by partition" in " ".join(note.split())
    assert max(map(len, note.splitlines())) <= 60


def test_diff_across_an_assignor_switch_shows_each_worker_changed_not_left() -> None:
    """``diff`` reads no member rows, but needs them to tell which UUID a worker's URL
    became."""
    result = CliRunner().invoke(main, ["diff", str(SWITCH_MIXED), str(SWITCH_AFTER), "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert {pid: row["status"] for pid, row in rows.items()} == {
        "712a242c-4b4e-4e83-802c-bf08fb5c4c09": "changed",
        "b7a91592-84b1-4ee4-9174-d00fceeec9b6": "changed",
    }
    assert rows["712a242c-4b4e-4e83-802c-bf08fb5c4c09"]["+active"] == ["1_0"]


def _workers_on_one_url(tmp_path: Path) -> tuple[str, str]:
    """The switch's two files as workers on ``web_host="0.0.0.0"`` give them: before, both
    workers one process ``http://0.0.0.0:6066`` of two members; after, the worker on 6082
    stopped for its restart and 712a242c runs every task."""
    url, kept = "http://0.0.0.0:6066", "712a242c-4b4e-4e83-802c-bf08fb5c4c09"
    mixed, after = (json.loads(p.read_text()) for p in (SWITCH_MIXED, SWITCH_AFTER))
    merged = {"capacity": 1, "active": [], "standby": [], "warmup": [], "members": []}
    for row in mixed["assignment"].values():
        for field in ("active", "members"):
            merged[field] = sorted({*merged[field], *row[field]})
    mixed["assignment"] = {url: merged}
    for member in mixed["members"]:
        member["process"] = member["endpoint"] = url
    every = sorted({t for row in after["assignment"].values() for t in row["active"]})
    after["assignment"] = {kept: {**after["assignment"][kept], "active": every, "standby": []}}
    after["members"] = [
        {**m, "endpoint": url, "active": every, "standby": []}
        for m in after["members"]
        if m["process"] == kept
    ]
    paths = (tmp_path / "mixed.json", tmp_path / "after.json")
    for path, data in zip(paths, (mixed, after), strict=True):
        path.write_text(json.dumps(data))
    return str(paths[0]), str(paths[1])


def test_workers_sharing_one_url_are_not_matched_across_an_assignor_switch(
    tmp_path: Path,
) -> None:
    """Two Faust workers behind one URL read as one process; matched by that URL to the one
    worker left after the switch, every task of the stopped worker read as kept: "no active
    task moved" and "no client changed", where 1_0 and 8_4..8_7 moved."""
    mixed, after = _workers_on_one_url(tmp_path)
    code, out, err = _invoke("explain", mixed, after, "--json")
    assert code == 0, err
    moved = {m["task"] for m in json.loads(out)["moves"]}
    assert {"1_0", "8_4", "8_5", "8_6", "8_7"} <= moved
    assert " ".join(err.split()).endswith(
        "0 of 1 process by member id or endpoint; 1 process of several workers on one "
        "endpoint left unmatched"
    )
    code, out, err = _invoke("diff", mixed, after, "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert {row["status"] for row in rows.values()} == {"left", "joined"}


def test_workers_alone_on_a_wildcard_url_are_not_matched_across_an_assignor_switch() -> None:
    """A rolling switch of two workers on ``web_host="0.0.0.0"``: before, one worker alone on
    Faust's protocol (``http://0.0.0.0:6066``); after, the other alone on ours, on the same
    URL. Matched by that URL, the tasks that moved read as kept ("no active task moved")."""
    data = Path(__file__).parent / "data"
    before, after = (
        str(data / f"faust_switch_wildcard_alone_{side}.json") for side in ("before", "after")
    )
    code, out, err = _invoke("explain", before, after, "--json")
    assert code == 0, err
    assert len(json.loads(out)["moves"]) == 9
    code, out, err = _invoke("diff", before, after, "--json")
    assert code == 0, err
    assert {row["status"] for row in json.loads(out).values()} == {"left", "joined"}


def test_an_endpoint_that_cannot_be_parsed_is_matched_on_by_no_switch(tmp_path: Path) -> None:
    """A member advertises any string as its endpoint: one that is no URL (an unbalanced IPv6
    bracket) tells no worker, and explain and diff still answer across a switch."""
    data = Path(__file__).parent / "data"
    paths = []
    for side in ("before", "after"):
        snapshot = json.loads((data / f"faust_switch_wildcard_alone_{side}.json").read_text())
        for member in snapshot["members"]:
            member["endpoint"] = "http://[::1:6066"
        paths.append(tmp_path / f"{side}.json")
        paths[-1].write_text(json.dumps(snapshot))
    code, out, err = _invoke("explain", str(paths[0]), str(paths[1]), "--json")
    assert code == 0, err
    assert len(json.loads(out)["moves"]) == 9
    code, out, err = _invoke("diff", str(paths[0]), str(paths[1]), "--json")
    assert code == 0, err
    assert {row["status"] for row in json.loads(out).values()} == {"left", "joined"}


def test_explain_last_credits_no_task_to_a_zombie_and_names_it_in_short() -> None:
    """A Faust worker (a031c13c) paused past its session came back still running 8_2, 8_4 and
    8_6, which the group had given to 9986b500 and dbcab4d7; the rebalance then gave it 8_0,
    8_4 and 8_6. Taken by process id, its claim of 8_6 hid dbcab4d7's, and the move of 8_6
    was lost; the warning was one line of full UUIDs."""
    saved = Path(__file__).parent / "data" / "faust_zombie_back.json"
    result = CliRunner().invoke(
        main, ["explain", "--last", str(saved), "--json"], env={"COLUMNS": "80"}
    )
    assert result.exit_code == 0, result.output
    moves = [(m["task"], m["from"][:8], m["to"][:8]) for m in json.loads(result.stdout)["moves"]]
    assert moves == [
        ("8_0", "9986b500", "a031c13c"),
        ("8_4", "9986b500", "a031c13c"),
        ("8_6", "dbcab4d7", "a031c13c"),
    ]
    warned = result.stderr
    assert "a031c13c: likely a zombie, a guess" in warned
    assert "8_6 on a031c13c, dbcab4d7 (dbcab4d7 kept)" in " ".join(warned.split())
    assert "a031c13c-" not in warned and "dbcab4d7-" not in warned  # no full process ids
    assert max(map(len, warned.splitlines())) <= 80


def test_explain_last_names_no_zombie_where_a_restoring_owner_does_not_contest(
    tmp_path: Path,
) -> None:
    """A runtime group: Z, paused past its session, comes back still running 0_1 and 0_2;
    H1, given 0_1 meanwhile, is still restoring it (the runtime reports that as an offset
    sum, not as running), and H2 ran 0_2 alone. Every task H2 ran read as contested, so H2
    was named a likely zombie and 0_2 as moved onto it from Z."""
    after = snapshot(
        tmp_path / "after.json",
        {"Z": {"active": []}, "H1": {"active": ["0_1", "0_3"]}, "H2": {"active": ["0_2"]}},
        {"Z": {"0_1": -2, "0_2": -2}, "H1": {"0_3": -2, "0_1": 500}, "H2": {"0_2": -2}},
        previous={"Z": ["0_1", "0_2"], "H1": ["0_1", "0_3"], "H2": ["0_2"]},
    )
    code, out, err = _invoke("explain", "--last", after, "--json")
    assert code == 0, err
    assert "zombie" not in err
    moves = [(m["task"], m["from"], m["to"]) for m in json.loads(out)["moves"]]
    assert moves == [("0_1", "Z", "H1")]


def test_no_zombie_is_named_where_two_processes_claim_only_each_others_tasks() -> None:
    """Two processes claiming the same tasks: either may be the one paused."""

    def ran(*tasks: str) -> ClientView:
        return ClientView(None, ClientAssignment(frozenset(map(TaskId.parse, tasks))))

    def named(view: Mapping[str, ClientView]) -> frozenset[str]:
        return likely_zombies(view, FAUST_PROTOCOL_NAME)

    assert named({"a": ran("0_0", "0_1"), "b": ran("0_0", "0_1")}) == frozenset()
    assert named({"a": ran("0_0"), "b": ran("0_0", "0_1")}) == {"a"}
    assert named({"a": ran("0_0"), "b": ran("0_1")}) == frozenset()


def test_plan_of_a_faust_snapshot_names_processes_short_and_calls_no_changelog_removed(
    tmp_path: Path,
) -> None:
    """A what-if of a Faust drop-in snapshot (its tasks list each table's changelog
    partition, which the drop-in assigns with the task) warned of a topology change that
    removed the changelog topic, and its Assignment table cut the ids as ``9986b500-c048…``
    where the moves named them ``9986b500``."""
    topology = tmp_path / "fleeta.toml"
    topology.write_text(
        'name = "fleeta"\n'
        '[[subtopology]]\nid = 1\nsource_topics = ["fleeta-__assignor-__leader"]\n'
        '[[subtopology]]\nid = 8\nsource_topics = ["fleeta-src"]\nstores = ["counts"]\n'
        '[partitions]\n"fleeta-__assignor-__leader" = 1\nfleeta-src = 8\n'
    )
    saved = Path(__file__).parent / "data" / "faust_dropin_crash.json"
    result = CliRunner().invoke(
        main, ["plan", str(topology), "--clients", str(saved), "--explain"], env=WIDE
    )
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr
    assignment = result.stdout[result.stdout.index("Assignment") :]
    rows = [line.split("│")[1].strip() for line in assignment.splitlines() if "│ 1 " in line]
    assert rows == ["9986b500", "a031c13c"]


def test_explain_last_marks_a_contested_task_the_tie_break_credited(tmp_path: Path) -> None:
    """A runtime group names no zombie, so a task two processes reported running is credited
    to the claimant the tie-break keeps: its row read as any other move, and a contested task
    that claimant runs now was not shown at all. The row is marked, a line says what the mark
    means, and the unlisted one is named."""
    after = snapshot(
        tmp_path / "after.json",
        {
            "Z": {"active": []},
            "H1": {"active": ["0_1", "0_3", "0_4"]},
            "H2": {"active": ["0_2"]},
        },
        {
            "Z": {"0_1": -2, "0_2": -2, "0_4": -2},
            "H1": {"0_3": -2},
            "H2": {"0_2": -2, "0_4": -2},
        },
    )
    code, out, err = _invoke("explain", "--last", after)
    assert code == 0, err
    rows = [
        [cell.strip() for cell in line.split("│")[1:-1]]
        for line in out.splitlines()
        if "│ 0_" in line
    ]
    assert [row[:3] for row in rows] == [["0_1", "Z", "H1"], ["0_4", "H2 (?)", "H1"]]
    assert " ".join(out.split()).endswith(
        f"{_CONTESTED_LEGEND}; contested and not listed (the claimant kept runs it now; a "
        f"move from another may hide): 0_2 (H2 or Z); {_NO_ZOMBIES_LOOKED_FOR} {_NO_STANDBYS}"
    )


#: ``explain --last``'s legend of a contested task's mark, and what follows it.
_CONTESTED_LEGEND = (
    "(?): reported running by several processes at the join: from is the claimant the "
    "tie-break keeps among those not taken as likely zombies (smallest lag, then process id), "
    "a guess"
)
_NO_ZOMBIES_LOOKED_FOR = (
    "zombies are looked for only in Faust groups: a paused process that came back reads like "
    "this too"
)
_NO_STANDBYS = (
    "standbys not shown: at a join a previous standby reports its state like any other local "
    "state (save BEFORE with describe --json to compare standbys)"
)


def _moved_rows(out: str) -> list[list[str]]:
    """The task, from and to of each row of ``explain``'s moves table."""
    rows = [line.split("│")[1:4] for line in out.splitlines() if "│ 0_" in line]
    return [[cell.strip() for cell in row] for row in rows]


def test_explain_last_legend_leaves_a_likely_zombie_out_of_a_contested_task(
    tmp_path: Path,
) -> None:
    """A Faust group: Z claims only 0_1, which H1 and H2 claim too, so Z is a likely zombie
    and the tie-break picks between H1 and H2. The legend said "none a likely zombie" two
    lines below the warning naming Z, and listed Z among the candidates of an unlisted task."""
    assignment = {"H1": {"active": ["0_2"]}, "H2": {"active": ["0_1", "0_3"]}, "Z": {"active": []}}
    sums = {"H1": {"0_1": -2, "0_2": -2}, "H2": {"0_1": -2, "0_3": -2}, "Z": {"0_1": -2}}
    path = snapshot(tmp_path / "moved.json", assignment, sums, protocol=FAUST_PROTOCOL_NAME)
    code, out, err = _invoke("explain", "--last", path)
    assert code == 0, err
    assert "Z: likely a zombie" in " ".join(err.split())
    assert _moved_rows(out) == [["0_1", "H1 (?)", "H2"]]
    assert " ".join(out.split()).endswith(f"{_CONTESTED_LEGEND} {_NO_STANDBYS}")
    # 0_1 stays with H1, the claimant kept: not listed, and its candidates leave Z out.
    assignment |= {"H1": {"active": ["0_1", "0_2"]}, "H2": {"active": ["0_3"]}}
    path = snapshot(tmp_path / "kept.json", assignment, sums, protocol=FAUST_PROTOCOL_NAME)
    code, out, err = _invoke("explain", "--last", path)
    assert code == 0, err
    assert " ".join(out.split()).endswith(
        "no active task moved contested and not listed (the claimant kept runs it now; a move "
        f"from another may hide): 0_1 (H1 or H2) {_NO_STANDBYS}"
    )


def test_explain_last_legend_of_a_runtime_group_says_no_zombie_was_looked_for(
    tmp_path: Path,
) -> None:
    """A runtime group: every claim of A0 is contested, a zombie's pattern, but zombies are
    looked for only in Faust groups; the legend said "none a likely zombie" all the same."""
    assignment = {"A0": {"active": []}, "H1": {"active": ["0_1", "0_2"]}, "H2": {"active": ["0_3"]}}
    sums = {"A0": {"0_1": -2, "0_3": -2}, "H1": {"0_1": -2, "0_2": -2}, "H2": {"0_3": -2}}
    path = snapshot(tmp_path / "after.json", assignment, sums, protocol="streamassign-streams")
    code, out, err = _invoke("explain", "--last", path)
    assert code == 0, err
    assert _moved_rows(out) == [["0_1", "A0 (?)", "H1"], ["0_3", "A0 (?)", "H2"]]
    assert " ".join(out.split()).endswith(
        f"{_CONTESTED_LEGEND}; {_NO_ZOMBIES_LOOKED_FOR} {_NO_STANDBYS}"
    )
