"""`streamassign plan`: tables and JSON on shipped topologies, clear errors on bad input."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from streamassign import ClientState, TaskId
from streamassign.cli import load_clients, main
from streamassign.errors import ClientsFileError

ROOT = Path(__file__).resolve().parent.parent
ORDERS = str(ROOT / "topology" / "orders-join.toml")
CLICKSTREAM = str(ROOT / "topology" / "clickstream-repartition.toml")
CLIENTS = str(ROOT / "examples" / "clients.toml")


def plan(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["plan", *args])
    return result.exit_code, result.output


def test_plan_json_on_shipped_topology_and_clients() -> None:
    code, out = plan(ORDERS, "--clients", CLIENTS, "--standbys", "1", "--json")
    assert code == 0, out
    data = json.loads(out)
    assert len(data["tasks"]) == 16
    assert data["tasks"]["0_3"] == [["customers", 3], ["orders", 3]]
    m = data["metrics"]
    assert m["active_balanced"] and m["moves"] == m["move_lower_bound"]
    assert m["standbys_placed"] == m["standbys_required"] == 12
    actives = [t for a in data["assignment"].values() for t in a["active"]]
    assert sorted(actives) == sorted(data["tasks"])
    # p2 has 4 threads: its tasks are split over all of them, loads within one of each other.
    threads = data["assignment"]["p2"]["threads"].values()
    loads = [len(t["active"]) + len(t["standby"]) for t in threads]
    assert len(loads) == 4 and max(loads) - min(loads) <= 1


def test_plan_tables_with_fresh_clients_and_partition_override() -> None:
    code, out = plan(ORDERS, "--num-clients", "3", "--threads", "2", "-p", "orders=6,customers=6")
    assert code == 0, out
    assert "Tasks of orders-enricher (10)" in out
    assert "moves / lower bound" in out


def table_rows(out: str) -> list[list[str]]:
    """The body rows of rich's tables in ``out``, as lists of stripped cell texts."""
    return [
        [c.strip() for c in line.strip().strip("│").split("│")]
        for line in out.splitlines()
        if line.lstrip().startswith("│")
    ]


def test_plan_tables_with_a_clients_file(tmp_path: Path) -> None:
    clients = tmp_path / "clients.toml"
    clients.write_text(
        '[[client]]\nprocess_id = "alpha"\ncapacity = 1\n'
        'prev_active = ["0_0", "1_0"]\nprev_standby = ["0_1"]\n\n'
        '[[client]]\nprocess_id = "beta"\ncapacity = 2\n'
        'prev_active = ["0_1", "1_1"]\nprev_standby = ["0_0"]\nlags = { "0_0" = 0 }\n'
    )
    # Wide and colourless whatever the terminal of the test run, so that rows are not wrapped.
    result = CliRunner().invoke(
        main,
        [
            "plan",
            ORDERS,
            "--clients",
            str(clients),
            "-p",
            "orders=2,customers=2,returns=3",
            "--standbys",
            "1",
        ],
        env={"COLUMNS": "160", "FORCE_COLOR": None, "TTY_COMPATIBLE": None},
    )
    assert result.exit_code == 0, result.output
    out = result.output
    assert "Tasks of orders-enricher (5)" in out
    rows = table_rows(out)
    assert ["0_0", "customers[0], orders[0]"] in rows
    assert ["1_2", "returns[2]"] in rows
    # One row per client id: threads, actives, standbys (count: ids), per-thread loads. Both keep
    # their previous tasks; the new task 1_2 goes to beta, which has two threads.
    assert ["alpha", "1", "2: 0_0, 1_0", "1: 0_1", "3"] in rows
    assert ["beta", "2", "3: 0_1, 1_1, 1_2", "1: 0_0", "2/2"] in rows
    metrics = {r[0]: r[1] for r in rows if len(r) == 2}
    assert metrics["tasks / clients"] == "5 / 2"
    assert metrics["actives balanced in total (floor/ceil of share)"] == "yes"
    assert metrics["actives balanced per subtopology"] == "yes"
    assert metrics["moves / lower bound"] == "0 / 0"
    assert metrics["standbys placed / required"] == "2 / 2"
    assert metrics["previous standbys kept / dropped (not counting any now active)"] == "2 / 0"
    assert metrics["takeovers warm / cold"] == "0 / 0"


@pytest.mark.parametrize(
    ("topology", "partitions", "named"),
    [
        (ORDERS, "nosuch=3", "unknown topic(s) nosuch:"),
        (ORDERS, "orders=12,zz=1,customers=12,aa=2", "unknown topic(s) aa, zz:"),
        (
            CLICKSTREAM,
            "clickstream-user-sessions-repartition=3",
            "repartition topic(s) clickstream-user-sessions-repartition",
        ),
    ],
)
def test_plan_rejects_partitions_of_topics_the_topology_lacks(
    topology: str, partitions: str, named: str
) -> None:
    code, out = plan(topology, "--num-clients", "2", "-p", partitions)
    assert code == 2, out
    assert "Invalid value for '--partitions'" in out
    assert named in out
    externals = "customers, orders, returns" if topology == ORDERS else "clicks, user-profiles"
    assert f"external source topics only: {externals}" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-p", "orders=8", "--num-clients", "2"], "topics not co-partitioned"),
        (["-p", "orders=x", "--num-clients", "2"], "expected TOPIC=COUNT"),
        (["--num-clients", "2", "--clients", CLIENTS], "exactly one of --clients"),
        ([], "exactly one of --clients"),
        (["--clients", CLIENTS, "--threads", "4"], "--threads is for --num-clients"),
        (["-p", "orders=6,orders=8", "--num-clients", "2"], "orders given twice, as 6 and 8"),
    ],
)
def test_plan_bad_input_fails_with_a_message(args: list[str], message: str) -> None:
    code, out = plan(ORDERS, *args)
    assert code != 0
    assert message in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('name = "x"\n', "topology x has no tasks (no subtopology)"),
        ("", "topology empty has no tasks (no subtopology)"),
        (
            'name = "x"\n[[subtopology]]\nid = 0\nsource_topics = ["a"]\n',
            "topology x: no partition count for external topics a (add them to the file's "
            "[partitions] table or pass --partitions TOPIC=N)",
        ),
    ],
)
def test_plan_refuses_a_topology_without_tasks_as_simulate_does(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "empty.toml"
    path.write_text(content)
    code, out = plan(str(path), "--num-clients", "2")
    assert code == 1
    assert out == f"Error: {path}: {message}\n"


def test_the_same_count_twice_and_a_byte_order_mark_are_fine(tmp_path: Path) -> None:
    code, out = plan(ORDERS, "--num-clients", "2", "-p", "orders=6,customers=6", "-p", "orders=6")
    assert code == 0, out
    # Windows editors start UTF-8 files with a byte-order mark; TOML has none: it is skipped.
    marked = tmp_path / "bom.toml"
    marked.write_bytes(b"\xef\xbb\xbf" + Path(ORDERS).read_bytes())
    code, out = plan(str(marked), "--num-clients", "2")
    assert code == 0, out
    assert "Tasks of orders-enricher (16)" in out


def test_an_empty_standby_cell_is_a_plain_zero() -> None:
    result = CliRunner().invoke(
        main, ["plan", ORDERS, "--num-clients", "2"], env={"COLUMNS": "160", "FORCE_COLOR": None}
    )
    assert result.exit_code == 0, result.output
    rows = [r for r in table_rows(result.output) if r[0].startswith("client-")]
    assert len(rows) == 2 and all(r[3] == "0" for r in rows)


def test_clients_file(tmp_path: Path) -> None:
    clients = load_clients(CLIENTS)
    assert [c.process_id for c in clients] == ["p1", "p2", "p3"]
    assert clients[0] == ClientState(
        "p1",
        2,
        prev_active=["0_0", "0_1", "0_2", "0_3", "1_0", "1_1"],
        prev_standby=["0_4", "0_5", "0_8"],
        lags={"0_4": 0, "0_5": 12, "0_8": 40},
        rack="eu-west-1a",
    )
    assert TaskId(0, 5) in clients[0].lags
    bad = tmp_path / "bad.toml"
    bad.write_text('[[client]]\nprocess_id = "a"\nthreads = 3\n')
    with pytest.raises(ValueError, match=r"client #1: unknown keys \['threads'\]"):
        load_clients(bad)
    bad.write_text('[[client]]\nprocess_id = "a"\ncapacity = 0\n')
    with pytest.raises(ValueError, match=r"client #1 \('a'\): capacity must be an int >= 1"):
        load_clients(bad)
    code, out = plan(ORDERS, "--clients", str(bad))
    assert code != 0 and "capacity must be an int >= 1" in out
    numbered = tmp_path / "numbered.toml"
    numbered.write_text("[[client]]\nprocess_id = 7\n")
    assert load_clients(numbered) == [ClientState("7")]
    bad.write_text("[[client]]\nprocess_id = 1.5\n")
    with pytest.raises(ValueError, match=r"client #1 \(1.5\): process_id must be a str"):
        load_clients(bad)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("lags = 0", r"lags must be a mapping of task id -> int, got 0"),
        ('lags = {"0_1" = -1}', "lags: lag of task 0_1 must be an int >= 0"),
        ('lags = {"x" = 1}', r"lags: not a task id"),
        ("tags = {zone = [1]}", r"tags\['zone'\] must be a str, got \[1\]"),
        ("tags = 3", r"tags must be a mapping of str -> str"),
        ("rack = 1", r"rack must be a str or None, got 1"),
        ('prev_active = "0_1"', r"prev_active: expected a collection of task ids"),
        ("prev_standby = [[0]]", r"prev_standby: "),
        ("prev_active = " + "[" * 100_000 + "]" * 100_000, "nested too deep"),
    ],
)
def test_bad_clients_files_give_a_typed_error_naming_the_key(
    tmp_path: Path, body: str, message: str
) -> None:
    bad = tmp_path / "clients.toml"
    bad.write_text(f'[[client]]\nprocess_id = "a"\n{body}\n')
    with pytest.raises(ClientsFileError, match=message) as info:
        load_clients(bad)
    assert isinstance(info.value, ValueError)
    assert str(info.value).startswith(str(bad))
    code, out = plan(ORDERS, "--clients", str(bad))
    assert code != 0 and "Traceback" not in out


def test_a_process_id_twice_in_a_clients_file_names_the_file_and_both_clients(
    tmp_path: Path,
) -> None:
    clients = tmp_path / "clients.toml"
    clients.write_text('[[client]]\nprocess_id = "p1"\n[[client]]\nprocess_id = "p1"\n')
    code, out = plan(ORDERS, "--clients", str(clients))
    assert code == 1
    assert out == (
        f"Error: {clients}: clients #1 and #2 have the same process_id 'p1' (each process of a "
        "group has its own)\n"
    )


def test_a_directory_as_clients_file_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(ClientsFileError, match="cannot read clients file"):
        load_clients(tmp_path)


def test_help_texts_show_no_rst_markup() -> None:
    """Docstrings of commands are --help text: no ``double backticks`` there."""
    for command in sorted(main.commands):
        result = CliRunner().invoke(main, [command, "--help"])
        assert result.exit_code == 0, result.output
        assert "``" not in result.output, f"{command} --help: {result.output}"


def test_simulate_assignors_help_reads_whole_at_80_columns() -> None:
    """At 80 columns click broke ``--assignors``' shown default as ``[default:`` /
    ``default]``; the help says its default group in its text, each name whole on a line."""
    result = CliRunner().invoke(main, ["simulate", "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    start = next(n for n, line in enumerate(lines) if line.lstrip().startswith("--assignors"))
    end = next(n for n in range(start + 1, len(lines)) if lines[n].lstrip().startswith("--"))
    block = lines[start:end]
    assert all(len(line) <= 80 for line in block), block
    assert not any(line.rstrip().endswith("[default:") for line in block), block
    text = " ".join(" ".join(block).split())
    assert "groups default (when not given), all, task, consumer, aiokafka, peers." in text
    for name in ("task:sticky", "faust:copartitioned", "consumer:range", "aiokafka:sticky"):
        assert any(name in line for line in block), name


#: A line ending in ``[default`` cut short: a word broken where it would not fit.
_CUT_LABEL = re.compile(r"\[(?:d(?:e(?:f(?:a(?:u(?:lt?)?)?)?)?)?)?$")


@pytest.mark.parametrize("columns", [80, 60, 50])
def test_every_options_shown_default_reads_whole_on_one_line(columns: int) -> None:
    """Click wrapped an option's ``[default: 1.0; x>=0.1]`` as words,
    leaving ``[default:`` at a line's end (describe --interval, explain --acceptable-lag,
    plan-standbys --scenarios and --standbys at 80 columns; more at 60). Every command's
    options keep theirs on one line, at the width click takes in such a terminal. At 50
    (click's least, a 16-column text) ``[default: PLAINTEXT`` cannot fit: ``[default:`` ends
    a line only then, and an extra too wide for the column is still broken between words,
    never inside one (not as ``[defa`` / ``ult: 200; x>=1]``). No line is wider than
    the help: click wrote ``--security-protocol [PLAINTEXT|SSL|SASL_PLAINTEXT|SASL_SSL]``
    whole, 61 columns, at 60 (and ``--sasl-mechanism``'s, 54, at 50)."""
    width = max(min(columns, 80) - 2, 50)  # click's HelpFormatter: 2 short, 80 at most
    for name, command in [("streamassign", main), *main.commands.items()]:
        ctx = command.context_class(command, info_name=name, terminal_width=width)
        lines = command.get_help(ctx).splitlines()
        assert not [line for line in lines if len(line) > width], name
        assert not [line for line in lines if _CUT_LABEL.search(line.rstrip())], name
        for line, below in itertools.pairwise(lines):
            if line.rstrip().endswith("[default:"):  # the next word fit nowhere beside it
                text_width = width - (len(below) - len(below.lstrip()))
                assert len(f"[default: {below.split()[0]}") > text_width, (name, line, below)
        for param in command.get_params(ctx):
            record = param.get_help_record(ctx)
            extra = record[1].rpartition("  ")[2] if record else ""
            if extra.startswith("[default: ") and len(extra) <= width - 36:
                assert any(extra in line for line in lines), (name, record)


def test_the_cli_loads_no_pipeline_module_when_it_starts() -> None:
    # The pipeline package (and its report module) costs ~40 ms to import: only its commands
    # load it.
    code = (
        "import sys, streamassign.cli; "
        "print([m for m in sys.modules if m.startswith('streamassign.pipeline')])"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_plan_standbys_help_gives_the_exit_status_of_a_missed_target() -> None:
    result = CliRunner().invoke(main, ["plan-standbys", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "exit status 3 (the plan still printed) when no candidate reaches it" in " ".join(
        result.output.split()
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["simulate", "--steps", "0"], "'--steps': 0 is not in the range x>=1"),
        (["plan-standbys", "--steps", "0"], "'--steps': 0 is not in the range x>=1"),
        (["plan-standbys", "--probing-interval", "30"], "'--probing-interval': at least 60 s"),
        (["plan-standbys", "--restore-rate", "0"], "'--restore-rate': 0.0 is not in"),
        (["plan-standbys", "--detection", "-1"], "'--detection': -1.0 is not in the range"),
        (["plan-standbys", "--target", "1"], "'--target': 1.0 is not in the range 0<x<1"),
    ],
)
def test_pipeline_numbers_out_of_range_are_usage_errors_naming_the_option(
    args: list[str], message: str
) -> None:
    command, *options = args
    result = CliRunner().invoke(main, [command, ORDERS, *options])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_a_missing_extra_is_one_line_naming_it() -> None:
    """Without aiokafka (or pyspark) installed, as in a fresh environment: the command names
    the extra to install instead of an ImportError's trace."""
    script = (
        "import sys\n"
        "sys.modules['aiokafka'] = sys.modules['pyspark'] = None  # as if not installed\n"
        "from streamassign.cli import main\n"
        f"for args in (['describe', 'g', '-b', '127.0.0.1:1'], ['simulate', {ORDERS!r}]):\n"
        "    try:\n"
        "        main(args)\n"
        "    except SystemExit as exit:\n"
        "        print('exit', exit.code, file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stderr.splitlines() == [
        "Error: streamassign describe needs aiokafka, from the aiokafka extra: pip install "
        "'streamassign[aiokafka]'",
        "exit 1",
        "Error: streamassign simulate needs pyspark, from the spark extra: pip install "
        "'streamassign[spark]'",
        "exit 1",
    ]


def with_closed_stdout(script: str) -> subprocess.CompletedProcess[str]:
    """``python -c script`` whose stdout's reader is gone before the first write (``| head``
    that already exited): every write to stdout fails."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-c", script],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize("as_json", [False, True])
def test_a_closed_stdout_ends_the_command_quietly(as_json: bool) -> None:
    """``streamassign plan ... | head -1``: the reader is gone before the output is; the
    command finishes with status 0 and nothing on stderr, tables and JSON alike."""
    args = [ORDERS, "--clients", CLIENTS, *(["--json"] if as_json else [])]
    done = with_closed_stdout(f"from streamassign.cli import main\nmain(['plan', *{args!r}])\n")
    assert (done.returncode, done.stderr) == (0, "")


def test_a_closed_stdout_still_writes_the_plan_and_keeps_the_exit_status(tmp_path: Path) -> None:
    """A review found ``plan-standbys --out DIR --target T | head -1`` exiting 0 with no files
    after the whole Spark run: the broken pipe ended the command at its first output. The
    evaluation is stubbed (no Spark): a plan that misses its target."""
    row = {
        "standbys": 1,
        "warmups": 0,
        "availability": 0.9,
        "standby_load": 1.0,
        "warmup_load": 0.0,
        "convergence_s": 0.0,
        "outage_per_day_s": 1.0,
        "worst_outage_p99_s": 1.0,
        "bootstrap_per_hour": 1.0,
    }
    plan = {
        "candidates": [row],
        "recommended": row,
        "why": "-",
        "knobs": [],
        "target_reached": False,
        "assignor": "task:sticky",
        "assignor_why": "-",
        "without_warmups": None,
    }
    script = (
        "from streamassign import cli\n"
        "from streamassign.cli import plan_standbys\n"
        "plan_standbys._evaluate_standby_candidates = lambda *a: None\n"
        f"plan_standbys._standby_plan = lambda *a: ({plan!r}, {row!r})\n"
        f"cli.main(['plan-standbys', {ORDERS!r}, '--out', {str(tmp_path)!r}, '--target', '0.99'])\n"
    )
    done = with_closed_stdout(script)
    assert done.returncode == 3, done.stderr
    assert "note: no candidate reaches --target 0.99" in done.stderr
    for name in ("plan.csv", "plan.json"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o644  # a result to share
    assert json.loads((tmp_path / "plan.json").read_text())["target_reached"] is False


def test_a_missing_jinja2_is_one_line_before_spark_starts(tmp_path: Path) -> None:
    """A new user's audit: with pyspark and plotly but no jinja2, `simulate --report` ran the
    whole Spark job, then ended in a ModuleNotFoundError trace; `report` too. Now both say
    what to install before any Spark work (no session: nothing about starting Spark)."""
    pytest.importorskip("pyspark")
    pytest.importorskip("plotly")
    script = (
        "import sys\n"
        "sys.modules['jinja2'] = None  # as if not installed\n"
        "from streamassign.cli import main\n"
        f"for args in (['simulate', {ORDERS!r}, '--report', '--out', {str(tmp_path / 'r')!r}],"
        f" ['report', {str(tmp_path)!r}]):\n"
        "    try:\n"
        "        main(args)\n"
        "    except SystemExit as exit:\n"
        "        print('exit', exit.code, file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stderr.splitlines() == [
        "Error: the report needs jinja2, from the spark extra: pip install 'streamassign[spark]'",
        "exit 1",
        "Error: streamassign report needs jinja2, from the spark extra: pip install "
        "'streamassign[spark]'",
        "exit 1",
    ]
    assert list(tmp_path.iterdir()) == []


def _described(standbys: int | None) -> tuple[Any, Any]:
    """The quality of a 2-process streams group with one standby per stateful task, scored
    against ``standbys`` (None: inferred), as describe scores it."""
    from streamassign.aiokafka.describe import describe_bytes, quality
    from streamassign.aiokafka.streams import PROTOCOL_NAME

    from .test_describe import P1, P2, streams_member

    raw = [
        streams_member("m1", P1, "0_0 0_1", "0_2 0_3", {"0_2": 5}),
        streams_member("m2", P2, "0_2 0_3", "0_0 0_1", {"0_0": 5}),
    ]
    view = describe_bytes("orders", "Stable", "consumer", PROTOCOL_NAME, raw)
    return view, quality(view, standbys)


def test_describe_standbys_past_processes_warns_as_plan_does() -> None:
    """A new user's audit: `describe --standbys 2` of a 2-process group printed "(2 per
    stateful task) 4 / 4" and nothing else, read as full replication; plan warned. Now
    describe gives plan's warning (processes for clients) and the row says the cap."""
    from streamassign.cli.console import _Stdout
    from streamassign.cli.describe import _standby_cap_warning
    from streamassign.cli.describe_tables import _print_group

    view, score = _described(2)
    assert _standby_cap_warning(score) == (
        "warning: --standbys 2 needs 3 processes; with 2 each stateful task gets 1 standby"
    )
    console = _Stdout(width=80, record=True)
    _print_group(console, view, score)
    # On one line at 80 columns (a review: the row wrapped in a pipe or narrow terminal).
    rows = [line for line in console.export_text().splitlines() if "standbys placed" in line]
    assert len(rows) == 1 and len(rows[0]) <= 80, rows
    row = " ".join(rows[0].split())
    assert "│ standbys placed / required (2 per stateful task; 1 fits) │ 4 / 4 │" in row
    # plan's line for the same case, from the same function.
    code, out = plan(ORDERS, "--num-clients", "2", "--standbys", "2", "--json")
    assert code == 0
    assert "warning: --standbys 2 needs 3 clients; with 2 each stateful task gets 1 standby" in out
    # Within the cap (given or inferred): no warning, no cap in the row.
    for fits in (1, None):
        view, score = _described(fits)
        assert _standby_cap_warning(score) is None
        console = _Stdout(width=120, record=True)
        _print_group(console, view, score)
        assert "per stateful task;" not in console.export_text()


@pytest.mark.parametrize("address", ["garbage::::", "h:x", "127.0.0.1:99999", "a:1,b:x"])
def test_describe_names_a_bootstrap_address_that_is_not_host_port(address: str) -> None:
    """A new user's audit: `-b 'garbage::::'` said "cannot reach garbage::::: invalid literal
    for int() with base 10: ''". Now a usage error names the address, before any connection."""
    pytest.importorskip("aiokafka")
    result = CliRunner().invoke(main, ["describe", "g", "-b", address])
    assert result.exit_code == 2, result.output
    bad = address.split(",")[-1]
    assert result.output.splitlines()[-1] == (
        f"Error: Invalid value for '--bootstrap': {bad!r} is not HOST:PORT (e.g. "
        "localhost:9092; several: HOST:PORT,HOST:PORT)"
    )


@pytest.mark.parametrize(
    ("bootstrap", "where"), [("localhost:9092,", "after"), (",localhost:9092", "before")]
)
def test_describe_names_an_empty_bootstrap_address_beside_a_comma(
    bootstrap: str, where: str
) -> None:
    """A review: `-b 'localhost:9092,'` said "'' is not HOST:PORT", which hides the cause (a
    stray comma). The error names it."""
    pytest.importorskip("aiokafka")
    result = CliRunner().invoke(main, ["describe", "g", "-b", bootstrap])
    assert result.exit_code == 2, result.output
    assert result.output.splitlines()[-1] == (
        f"Error: Invalid value for '--bootstrap': {bootstrap!r} has an empty address {where} a "
        "comma (several: HOST:PORT,HOST:PORT)"
    )


def test_spark_tasks_help_gives_each_commands_own_meaning_and_default() -> None:
    """plan-standbys writes no report: its --spark-tasks help says nothing of one. A new
    user's audit: report's help gave simulate's default (4 x the default parallelism), which
    report never uses; it gives the session's shuffle partitions."""
    split = "Spark tasks to split the work into (default: 4 x the default parallelism"
    aggregation = "partitions of its aggregation's shuffles (default there: the session's)"
    for command, splits, report in (
        ("plan-standbys", True, ""),
        ("simulate", True, aggregation),
        ("report", False, "Partitions of the aggregation's shuffles (default: the session's"),
    ):
        result = CliRunner().invoke(main, [command, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        text = " ".join(result.output.split())
        assert (split in text) == splits, command
        if report:
            assert report in text, command
        else:
            assert "aggregation" not in text, command


def _consumer_view(
    topics: list[str], owners: dict[str, list[tuple[str, int]]], undecodable: Sequence[str] = ()
) -> Any:
    """A Stable plain consumer group (roundrobin) subscribed to ``topics``, its members
    ``owners`` reading those partitions, decoded as ``describe`` decodes the group's bytes;
    the members ``undecodable`` sent bytes nobody can read."""
    from streamassign import TopicPartition
    from streamassign.aiokafka.describe import RawMember, describe_bytes
    from streamassign.aiokafka.wire import encode_assignment

    from .test_describe import meta

    raw = [
        RawMember(
            member,
            "c",
            "h",
            meta(topics, b""),
            encode_assignment([TopicPartition(t, p) for t, p in parts], b""),
        )
        for member, parts in owners.items()
    ]
    raw += [RawMember(m, "c", "h", b"\x00\x07garbage", b"\xff\xff") for m in undecodable]
    return describe_bytes("billing", "Stable", "consumer", "roundrobin", raw)


def _watched(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, views: list[Any]
) -> tuple[list[dict[str, Any]], list[str]]:
    """``describe --watch --json`` over ``views``: its lines, and its stderr's notes."""
    from .test_describe import _watch_with

    stderr, out = tmp_path / "err.txt", tmp_path / "out.jsonl"
    with stderr.open("w") as err, out.open("w") as stdout:
        monkeypatch.setattr(sys, "stderr", err)
        _watch_with(monkeypatch, views, stdout, forever=False)
    notes = [n for n in stderr.read_text().splitlines() if n.startswith("note: ")]
    return [json.loads(line) for line in out.read_text().splitlines()], notes


def test_watch_matches_a_consumer_groups_views_by_partition(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Seen on a live group: a topic that sorts first subscribed mid-watch renumbered every
    id, and ``describe --watch`` matched the views by id: the orders partitions, kept by their
    owners, read as new (or as balance moves and removals when the new topic had fewer
    partitions), the new ones were missing. It matches by partition as ``explain`` does, names
    partitions, and says so at each renumbering."""
    pytest.importorskip("aiokafka")
    from .test_describe import _watch_with

    orders = {"m1": [("orders", 0), ("orders", 1)], "m2": [("orders", 2), ("orders", 3)]}
    grown = {"m1": [*orders["m1"], ("a-new", 0)], "m2": [*orders["m2"], ("a-new", 1)]}
    views = [
        _consumer_view(["orders"], orders),
        _consumer_view(["a-new", "orders"], grown),
        _consumer_view(["orders"], orders),
        _consumer_view(["a-new", "orders"], grown),  # the same renumbering again: said again
    ]
    assert views[1].tasks[TaskId(0, 0)] == {("a-new", 0)}  # the shift the review saw
    stderr, out = tmp_path / "err.txt", tmp_path / "out.jsonl"
    with (
        stderr.open("w") as err,
        out.open("w") as stdout,
        (tmp_path / "out.txt").open("w") as text_out,
    ):
        monkeypatch.setattr(sys, "stderr", err)
        _watch_with(monkeypatch, views, stdout, forever=False)
        # The tables name partitions too.
        _watch_with(monkeypatch, views[:2], text_out, forever=False, as_json=False)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    moves = [
        [(m["task"], m["partition"], m["from"], m["to"]) for m in line["moves"]]
        for line in lines[1:]
    ]
    assert moves == [
        [("0_0", ["a-new", 0], None, "m1"), ("0_1", ["a-new", 1], None, "m2")],
        [(None, ["a-new", 0], "m1", None), (None, ["a-new", 1], "m2", None)],
        [("0_0", ["a-new", 0], None, "m1"), ("0_1", ["a-new", 1], None, "m2")],
    ]
    text = (tmp_path / "out.txt").read_text()
    moved = text[text.index("Active tasks that moved") :].splitlines()
    assert [line.split()[1] for line in moved if line.startswith("│")] == ["a-new-0", "a-new-1"]
    notes = [n for n in stderr.read_text().splitlines() if n.startswith("note: tasks matched")]
    assert [n.rpartition(" by ")[2] for n in notes] == [
        "a change of topics (added topic a-new)",
        "a change of topics (removed topic a-new); a removed topic numbered past every id "
        "there: a-new as 1_p",
        "a change of topics (added topic a-new)",
        "a change of topics (added topic a-new)",  # the second watch's
    ]


def test_the_core_names_describes_consumer_family() -> None:
    """A review: ``compare.CONSUMER_FAMILY`` repeats ``describe.Family.CONSUMER`` (the core may
    not import aiokafka, nor may explain of files); pinned together, they cannot drift."""
    pytest.importorskip("aiokafka")
    from streamassign.aiokafka.describe import Family
    from streamassign.compare import CONSUMER_FAMILY

    assert Family.CONSUMER.value == CONSUMER_FAMILY


def test_watch_names_a_kept_topics_partition_by_its_id_when_its_owner_is_undecodable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A partition whose only owner became undecodable read as
    ``"task": null`` in ``--json``, the mark of a gone topic's partition, though its topic is
    still read and numbered in the new view. Only a gone topic's partitions have no id."""
    pytest.importorskip("aiokafka")
    orders = {"m1": [("orders", 0), ("orders", 1)], "m2": [("orders", 2), ("orders", 3)]}
    grown = {"m1": [*orders["m1"], ("a-new", 0)]}
    views = [
        _consumer_view(["orders"], orders),
        _consumer_view(["a-new", "orders"], grown, undecodable=["m2"]),
    ]
    assert views[1].tasks.keys() == {TaskId(0, 0), TaskId(1, 0), TaskId(1, 1)}
    lines, _ = _watched(monkeypatch, tmp_path, views)
    assert [(m["task"], m["partition"], m["from"], m["to"]) for m in lines[1]["moves"]] == [
        ("0_0", ["a-new", 0], None, "m1"),
        ("1_2", ["orders", 2], "m2", None),
        ("1_3", ["orders", 3], "m2", None),
    ]


def _renumbered_by(notes: list[str]) -> list[str]:
    """What each renumbering note says renumbered the ids."""
    return [n.partition(" renumbered by ")[2] for n in notes]


def test_watch_says_a_topic_only_an_undecodable_member_read_may_be_hidden_not_removed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """When the only member reading a topic became undecodable, the
    note said "removed topic a-x", though the topic was still read: what is known is that
    nobody readable reads it, and that the undecodable member's topics are unknown. Said
    both ways, as the member's bytes turn unreadable and readable again. The topic has no
    number in the new view, so its partition has no id in ``--json`` (as docs/operations.md
    says) and reads ``task removed``."""
    pytest.importorskip("aiokafka")
    m1 = {"m1": [("orders", 0), ("orders", 1)]}
    both = _consumer_view(["a-x", "orders"], {**m1, "m2": [("a-x", 0)]})
    hidden = _consumer_view(["orders"], m1, undecodable=["m2"])
    lines, notes = _watched(monkeypatch, tmp_path, [both, hidden, both])
    assert [(m["task"], m["partition"], m["from"], m["reason"]) for m in lines[1]["moves"]] == [
        (None, ["a-x", 0], "m2", "task removed")
    ]
    assert _renumbered_by(notes) == [
        "a change of topics (topic a-x removed or hidden by 1 undecodable member); a removed "
        "or hidden topic numbered past every id there: a-x as 1_p",
        "a change of topics (topic a-x added or no longer hidden by 1 undecodable member)",
    ]


def test_watch_names_the_subscribed_topic_without_partitions_that_renumbered_the_ids(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A topic subscribed with no partition (a typo, not created yet)
    renumbers every id; the watch's note used the files' wording, "a subscribed topic with
    no partition assigned (or an edited file)", though a view is no file and its members
    name their topics. It names the topic, at each renumbering (not only the first)."""
    pytest.importorskip("aiokafka")
    orders = {"m1": [("orders", 0), ("orders", 1)], "m2": [("orders", 2), ("orders", 3)]}
    plain, typo = _consumer_view(["orders"], orders), _consumer_view(["0-typo", "orders"], orders)
    lines, notes = _watched(monkeypatch, tmp_path, [plain, typo, plain, typo])
    assert [line["moves"] for line in lines[1:]] == [[], [], []]
    assert _renumbered_by(notes) == ["a subscribed topic with no partition assigned (0-typo)"] * 3


@pytest.mark.parametrize("command", ["simulate", "plan-standbys"])
def test_pipeline_defaults_show_their_values_in_help(command: str) -> None:
    """Defaults read from the pipeline's constants show the value, never click's
    ``(dynamic)`` (click 8.1, which Faust 0.12 and 0.13 pin, wrote that for them)."""
    from streamassign.pipeline import simulate
    from streamassign.text import exact_number

    result = CliRunner().invoke(main, [command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "(dynamic)" not in result.output
    for constant in (simulate.RESTORE_RATE, simulate.PROBING_INTERVAL_S):
        assert f"[default: {exact_number(constant)}" in result.output, constant


def test_a_consumer_groups_quality_rows_name_its_topics() -> None:
    """A plain consumer group has no subtopologies: its row read ``subtopology 0`` where the
    docs say each topic is scored."""
    pytest.importorskip("aiokafka")
    from .test_describe import printed

    view = _consumer_view(
        ["orders", "a-new"], {"m1": [("orders", 0), ("a-new", 0)], "m2": [("orders", 1)]}
    )
    text = printed(view)
    assert "topic a-new: actives per process (of 1)" in text
    assert "topic orders: actives per process (of 2)" in text
    assert "subtopology" not in text
