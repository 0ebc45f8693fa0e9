"""The report's answer, colours and page, rendered from aggregated data (no Spark, no browser).

``report_data.json`` is what ``spark.aggregate`` returns for a small real run (every assignor on
the orders join, the BUSY model; made by ``report_data.py``); ``test_spark.py`` aggregates that
run again and compares. The browser checks are in ``test_report_browser.py``.
"""

from __future__ import annotations

import copy
import html
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamassign.pipeline.assignors import GROUPS, SPECS
from streamassign.pipeline.report import (
    CSV_FILES,
    Outcome,
    _options_as_code,
    assignor_colour,
    outcomes,
    recommend,
    render_report,
)
from streamassign.text import counted, exact_number

pytest.importorskip("plotly")
pytest.importorskip("jinja2")

DATA = Path(__file__).with_name("report_data.json")


def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DATA.read_text())
    return data


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> str:
    return render_report(load(), tmp_path_factory.mktemp("report")).read_text()


def test_every_assignor_has_its_own_colour_in_every_run() -> None:
    names = [s.name for s in SPECS]
    colours = [assignor_colour(n) for n in names]
    assert len(set(colours)) == len(names) > 10
    # A name's colour does not depend on which others a run compares, or on the process.
    assert assignor_colour("task:ha") == colours[names.index("task:ha")]
    other = assignor_colour("my:custom")
    assert other == assignor_colour("my:custom") and re.fullmatch(r"#[0-9a-f]{6}", other)
    assert other not in colours


def test_the_answer_rules_out_split_joins_and_picks_the_least_restoring() -> None:
    data = load()
    found = {o.name: o for o in outcomes(data)}
    rec = recommend(list(found.values()), 10_000.0)
    # On the orders join, every consumer-level assignor but range splits joined tasks.
    splitters = {o.name for o, kind, _ in rec.ruled_out if kind == "splits"}
    assert splitters == {n for n, o in found.items() if o.level == "consumer" and o.split_mean > 0}
    assert "consumer:sticky" in splitters and "consumer:range" not in splitters
    assert found["consumer:sticky"].balanced_share == 1.0  # balanced, yet ruled out
    fit = [o for o in found.values() if o.name not in splitters]
    assert rec.best is not None
    assert rec.best.records_mean == min(o.records_mean for o in fit)
    assert rec.best.name == "task:ha"
    assert rec.best.records_mean < found["task:sticky"].records_mean
    text = " ".join(rec.reasons)
    assert "task:sticky" in text and "warmups" in text and "probing rebalances" in text
    assert [o.name for o in rec.ranked][: len(fit)] == sorted(
        (o.name for o in fit), key=lambda n: found[n].records_mean
    )


def test_no_fit_assignor_says_so(tmp_path: Path) -> None:
    data = load()
    data["by_assignor"] = [r for r in data["by_assignor"] if r["assignor"] == "consumer:sticky"]
    rec = recommend(outcomes(data), 10_000.0)
    assert rec.best is None and len(rec.ruled_out) == 1
    text = render_report(data, tmp_path).read_text()
    assert "No assignor compared here is fit for this topology" in text


def test_a_run_without_rebalances_says_so_and_picks_nothing(tmp_path: Path) -> None:
    """Every trace ended at step 0 (no event possible): no verdict, no empty charts."""
    data = load()
    data["by_assignor"], data["outcomes"] = [], []
    data["by_event"] = [r for r in data["by_event"] if r["event"] == "initial"]
    data["by_step"] = [r for r in data["by_step"] if r["step"] == 0]
    text = render_report(data, tmp_path).read_text()
    assert "Nothing to compare" in text and "no rebalances after the initial assignments" in text
    assert "fit for this topology" not in text and "Use <span" not in text
    assert 'id="answer-table"' not in text and 'id="by-assignor"' not in text
    assert 'class="figure"' not in text
    assert "0 rebalances per assignor after the initial ones" in text
    assert 'Simulate again with <code class="opt">--steps</code> N (N &gt;= 1)' in text


def test_options_in_the_pages_sentences_are_code_and_the_rest_is_escaped() -> None:
    """The answer's ``--assignors`` wrapped as ``--`` / ``assignors`` at 420 px;
    an option is a code span the page keeps on one line (``code.opt``), nothing else is."""
    marked = _options_as_code("compare <b>x</b> --assignors a,b & --steps N; x--y, -- and -x")
    assert str(marked) == (
        'compare &lt;b&gt;x&lt;/b&gt; <code class="opt">--assignors</code> a,b &amp; '
        '<code class="opt">--steps</code> N; x--y, -- and -x'
    )


def test_counts_of_one_are_singular(tmp_path: Path) -> None:
    assert [counted(n, "task") for n in (0, 1, 1.5, 2, 1_234_567, 2_000_000.0)] == [
        "0 tasks",
        "1 task",
        "1.5 tasks",
        "2 tasks",
        "1,234,567 tasks",
        "2,000,000 tasks",
    ]
    data = load()
    data["manifest"] |= {"scenarios": 1, "standby_replicas": 1}
    text = render_report(data, tmp_path).read_text()
    assert "1 simulated deployment," in text and "1 standby replica." in text


def test_failures_rule_an_assignor_out() -> None:
    data = load()
    data["errors"] = [{"assignor": "task:ha", "errors": 2, "example": "ValueError: boom"}]
    rec = recommend(outcomes(data), 10_000.0)
    assert rec.best is not None and rec.best.name != "task:ha"
    assert any(o.name == "task:ha" and kind == "fails" for o, kind, _ in rec.ruled_out)


def test_page_answers_first_and_explains_what_users_lack(page: str) -> None:
    answer = page.index('id="answer"')
    assert answer < page.index('id="figures"') < page.index('id="tables"')
    assert "Use <span" in page and "<strong>task:ha</strong>" in page
    for words in ("records restored", "task downtime", "split joins", "balanced", "probing"):
        assert words in page
    # HA's warmups, probing rounds and time to balance, in the answer table.
    assert "warmups, probing" in page and "time to balance" in page
    # Balance per subtopology: in the answer's reasons and table, and in the detail tables.
    answer_section = page[answer : page.index('id="figures"')]
    assert answer_section.count("per subtopology") >= 3
    assert "balanced per subtopology" in page[page.index('id="tables"') :]
    assert "worst subtopology spread" in page
    assert "DESIGN" not in page  # users do not have the design notes
    assert "negative when the assignor left the group unbalanced" in page
    assert "a note from the run" in page
    for name in CSV_FILES:
        assert f'href="{name}"' in page


def test_page_says_the_levels_move_bounds_differ(page: str, tmp_path: Path) -> None:
    """Task rows bound moves by balance per subtopology and in total, consumer rows by partitions
    balanced in total: the page says which, and not to compare them across levels."""
    answer = page[page.index('id="answer"') : page.index('id="figures"')]
    assert "compare them within a level" in answer
    glossary = page[page.index('class="glossary"') :]
    assert "balanced per subtopology and in total" in glossary
    assert "compare within a level only" in glossary
    assert "partitions balanced in total over consumers" in page  # the consumer moves figure
    data = load()
    data["by_assignor"] = [r for r in data["by_assignor"] if r["level"] == "task"]
    alone = render_report(data, tmp_path).read_text()
    assert "compare them within a level" not in alone  # one level: nothing to compare


def test_plotly_is_embedded_once_and_nothing_is_fetched(page: str) -> None:
    figures = len(re.findall(r'<div class="figure">', page))
    assert figures >= 5
    # The figures' calls: plotly.js's own bundle names Plotly.newPlot( in a message (5.20).
    assert len(re.findall(r'Plotly\.newPlot\(\s*"fig-', page)) == figures
    assert len(re.findall(r"plotly\.js v\d", page)) == 1  # the library's banner, once
    assert not re.search(r"<script[^>]+src=", page)
    assert not re.search(r"<link[^>]+href=\"https?:", page)


def figure_json(page: str, anchor: str) -> list[dict[str, Any]]:
    """The traces of figure ``fig-<anchor>`` as plotly serialised them into the page."""
    found = re.search(rf'Plotly\.newPlot\(\s*"fig-{re.escape(anchor)}",\s*', page)
    assert found is not None, anchor
    traces, _ = json.JSONDecoder().raw_decode(page, found.end())
    assert isinstance(traces, list)
    return traces


def test_identical_series_are_named_and_drawn_apart(page: str) -> None:
    lines = figure_json(page, "imbalance-consumer")
    by_name = {t["name"].split(" (same as")[0]: t for t in lines}
    same = [t for t in lines if "(same as " in t["name"]]
    assert same, "the fixture has consumer assignors with identical imbalance"
    for trace in same:
        assert trace["line"].get("dash") in ("dash", "dot", "dashdot", "longdash")
        assert trace["marker"]["symbol"].endswith("-open")
        original = trace["name"].split("(same as ")[1].rstrip(")")
        assert by_name[original]["y"] == trace["y"]
    bars = figure_json(page, "moves-consumer")
    hatched = [t for t in bars if t["type"] == "bar" and "(same as " in t["name"]]
    assert hatched and all(t["marker"]["pattern"]["shape"] == "/" for t in hatched)


def test_one_colour_per_assignor_on_every_figure(page: str) -> None:
    seen = 0
    for anchor in ("restore", "moves-task", "moves-consumer", "imbalance-task", "assign-time"):
        for trace in figure_json(page, anchor):
            name = trace["name"].split(" (same as")[0]
            if name in ("p99", "lower bound"):
                continue
            colour = trace["marker"].get("color") or trace.get("line", {}).get("color")
            assert colour == assignor_colour(name), (anchor, name)
            seen += 1
    assert seen > 20


def test_standby_coverage_is_a_sentence_when_every_standby_was_placed(tmp_path: Path) -> None:
    data = load()
    assert all(r["standby_coverage_min"] == 1.0 for r in data["by_step"] if r["level"] == "task")
    text = render_report(data, tmp_path / "full").read_text()
    assert "every task assignor placed every required standby" in text
    assert 'id="fig-coverage"' not in text
    short = copy.deepcopy(data)
    row = next(r for r in short["by_step"] if r["level"] == "task" and r["step"] == 3)
    row["standby_coverage_mean"] = row["standby_coverage_min"] = 0.5
    text = render_report(short, tmp_path / "short").read_text()
    assert 'id="fig-coverage"' in text


def test_csv_files_keep_their_columns(tmp_path: Path) -> None:
    data = load()
    render_report(data, tmp_path)
    for name, key in CSV_FILES.items():
        header = (tmp_path / name).read_text().splitlines()[0].split(",")
        assert header == data["columns"][key]


def only(data: dict[str, Any], names: set[str]) -> dict[str, Any]:
    kept = copy.deepcopy(data)
    for key in ("by_event", "by_assignor", "by_step", "outcomes"):
        kept[key] = [r for r in kept[key] if r["assignor"] in names]
    return kept


def test_one_level_or_one_assignor_still_renders_an_answer(tmp_path: Path) -> None:
    data = only(load(), {"task:sticky"})
    rec = recommend(outcomes(data), 10_000.0)
    assert rec.best is not None and rec.best.name == "task:sticky"
    assert any("only assignor fit" in r for r in rec.reasons)
    assert any("about the least any balanced assignment needs" in r for r in rec.reasons)
    text = render_report(data, tmp_path / "task").read_text()
    assert 'id="fig-moves-task"' in text and 'id="fig-moves-consumer"' not in text
    text = render_report(only(load(), {"consumer:range"}), tmp_path / "consumer").read_text()
    assert 'id="fig-imbalance-consumer"' in text and 'id="fig-imbalance-task"' not in text


def test_nothing_restored_is_said_not_plotted(tmp_path: Path) -> None:
    data = only(load(), {"task:sticky", "consumer:range"})
    for key in ("by_event", "by_assignor", "by_step"):
        for row in data[key]:
            for column in row:
                if column.startswith(("records_to_restore", "max_task_restore")):
                    row[column] = 0
    rec = recommend(outcomes(data), 10_000.0)
    # Equal restores: the balanced one wins, not the one moving less by staying unbalanced.
    assert rec.best is not None and rec.best.name == "task:sticky"
    assert "restore no changelog records" in rec.reasons[0]
    text = render_report(data, tmp_path).read_text()
    assert "Restores are not plotted" in text and 'id="fig-restore"' not in text


outcome_values = st.builds(
    Outcome,
    name=st.sampled_from([s.name for s in SPECS]),
    level=st.sampled_from(["task", "consumer"]),
    rebalances=st.integers(1, 100),
    records_mean=st.floats(0, 1e8),
    records_p99=st.floats(0, 1e9),
    downtime_s=st.floats(0, 1e4),
    longest_s=st.floats(0, 1e4),
    moves_mean=st.floats(0, 100),
    bound_mean=st.floats(0, 100),
    balanced_share=st.floats(0, 1),
    subtopology_balanced_share=st.floats(0, 1),
    subtopology_imbalance_max=st.floats(0, 10),
    split_mean=st.sampled_from([0.0, 0.5, 12.0]),
    split_share=st.none() | st.floats(0, 1),
    unassigned=st.sampled_from([0, 0, 3]),
    errors=st.sampled_from([0, 0, 1]),
    warmups=st.none() | st.integers(0, 50),
    probing_rebalances=st.none() | st.integers(0, 50),
    balanced_after_s=st.none() | st.floats(0, 1e4),
    never_balanced=st.none() | st.integers(0, 100),
)


@given(st.lists(outcome_values, max_size=8, unique_by=lambda o: o.name))
def test_the_pick_is_fit_and_restores_least(found: list[Outcome]) -> None:
    rec = recommend(found, 10_000.0)
    fit = [o for o in found if o.flaw() is None]
    assert sorted(o.name for o in rec.ranked) == sorted(o.name for o in found)
    assert {o.name for o, _, _ in rec.ruled_out} == {o.name for o in found} - {o.name for o in fit}
    if not fit:
        assert rec.best is None
        return
    assert rec.best is not None and rec.best.flaw() is None
    assert rec.best.records_mean == min(o.records_mean for o in fit)
    assert rec.ranked[0] is rec.best and len(rec.reasons) == 4


@pytest.mark.parametrize(
    ("p99s", "axis"),
    [((1.96, 14.2, 2.5), "linear"), ((0.09, 3.46), "linear"), ((0.1, 14.2), "log")],
)
def test_assignment_time_is_linear_unless_it_spans_two_decades(
    p99s: tuple[float, ...], axis: str
) -> None:
    """Bars on a log axis misstate ratios (1.96 ms drawn at 1/20 of 14.2 ms): linear, with
    each p99 written on its bar, unless the slowest is over 100 times the fastest."""
    from streamassign.pipeline.report import _assign_time

    rows = [
        {"assignor": name, "assign_ms_p99": p99, "assign_ms_p50": p99 / 2, "assign_ms_max": p99}
        for name, p99 in zip(("task:sticky", "task:ha", "consumer:range"), p99s, strict=False)
    ]
    fig = _assign_time(rows)
    assert fig.layout.xaxis.type == axis
    assert sorted(bar.text[0] for bar in fig.data) == sorted(f"{p:.2f} ms" for p in p99s)
    assert ("logarithmic" in fig.layout.xaxis.title.text) == (axis == "log")


def test_the_restore_rate_is_the_runs_and_shown_in_its_details(tmp_path: Path) -> None:
    """Downtimes are records over the run's restore rate (``simulate --restore-rate``, in the
    manifest); a run written before the option has none and was simulated at the default,
    which its details say (shown as if recorded, it would be re-priced silently were the
    default to change). Rates are shown in full: ``:g`` showed 1234567 as 1.23457e+06."""
    data = load()
    old = render_report(data, tmp_path / "old").read_text()
    assert "at 10,000 records/s per task" in old
    assert (
        'replica restore rate</th><td class="l">10,000 records/s per task (default, not '
        "recorded by this run)</td>" in old
    )
    data["manifest"]["replica_restore_per_s"] = 40_000.0
    page = render_report(data, tmp_path / "new").read_text()
    assert "at 40,000 records/s per task" in page
    assert 'replica restore rate</th><td class="l">40,000 records/s per task</td>' in page
    slow, fast = outcomes(load()), outcomes(data)
    assert [o.downtime_s / 4 for o in slow] == pytest.approx([o.downtime_s for o in fast])
    data["manifest"]["replica_restore_per_s"] = 1_234_567.0
    page = render_report(data, tmp_path / "exact").read_text()
    assert "at 1,234,567 records/s per task" in page
    assert 'replica restore rate</th><td class="l">1,234,567 records/s per task</td>' in page


def test_the_churn_model_is_shown_as_its_options_take_it(tmp_path: Path) -> None:
    """``--param crash_per_client_hour=0.1234567`` showed as 0.123457 (``:g``), another value:
    the model line writes numbers as plan-standbys' next line does."""
    data = load()
    data["manifest"]["model"] |= {"crash_per_client_hour": 0.1234567, "scale_out_per_hour": 2.0}
    page = render_report(data, tmp_path).read_text()
    assert "2 scale-outs/h" in page and "0.1234567 crashes per client-hour" in page


def test_run_details_show_task_ha_s_warmups_and_probing(tmp_path: Path) -> None:
    """task:ha's warmups and probing interval change its balance times: a run records them
    (``simulate --warmups --probing-interval``) and its details show them; a run that did not
    was simulated at the defaults, and says so; a run without task:ha shows neither. One
    parenthesis and one unit each: they read "2 (task:ha) (default; ...)" and "probing
    interval s 600 s"."""
    data = load()
    details = render_report(data, tmp_path / "old").read_text()
    details = details[details.index('id="run"') :]
    unrecorded = "default, not recorded by this run"
    assert f'max warmup replicas</th><td class="l">2 (task:ha; {unrecorded})</td>' in details
    assert f'probing interval</th><td class="l">600 s (task:ha; {unrecorded})</td>' in details
    data["manifest"] |= {"max_warmup_replicas": 4, "probing_interval_s": 60.25}
    details = render_report(data, tmp_path / "new").read_text()
    assert 'max warmup replicas</th><td class="l">4 (task:ha)</td>' in details
    assert 'probing interval</th><td class="l">60.25 s (task:ha)</td>' in details
    data["manifest"]["assignors"].remove("task:ha")
    details = render_report(data, tmp_path / "sticky").read_text()
    details = details[details.index('id="run"') :]
    assert "max warmup replicas" not in details and "probing interval" not in details
    # A damaged manifest's "assignors": null is no list of assignors, not a TypeError.
    data["manifest"]["assignors"] = None
    details = render_report(data, tmp_path / "null").read_text()
    details = details[details.index('id="run"') :]
    assert "max warmup replicas" not in details and "replica restore rate" in details


def test_the_answer_says_what_task_ha_changes(tmp_path: Path) -> None:
    """plan-standbys' warmups need task:ha, which simulate's default group leaves out: a report
    without it says so; with it, and when the run shows it, that task:ha takes over crashed
    tasks cold less often (the sticky assignor's least moves leave some cold despite standbys)."""

    def answer_of(data: dict[str, Any], name: str) -> str:
        page = html.unescape(render_report(data, tmp_path / name).read_text())
        return page[page.index('id="answer"') : page.index('id="figures"')]

    # report_data.json, 9 crashes: task:sticky 22 warm, 8 cold; task:ha 37 warm, 0 cold.
    assert (
        "At crashes, task:sticky restored 0.89 stateful tasks per crash from scratch, standbys "
        "or not (8 tasks over 9 crashes), task:ha 0 (0 over 9)." in answer_of(load(), "both")
    )
    data = load()
    for key in ("by_assignor", "by_event", "by_step", "outcomes"):
        data[key] = [r for r in data[key] if r["assignor"] != "task:ha"]
    # A run of simulate's default group (peers not installed left out of its manifest).
    for default in (list(GROUPS["default"]), ["task:sticky", "consumer:range", "consumer:sticky"]):
        data["manifest"]["assignors"] = default
        answer = answer_of(data, "default")
        assert "Use <span" in answer and "<strong>task:sticky</strong>" in answer
        assert (
            "task:ha, the high-availability assignor, was not among this run's assignors "
            "(simulate's default group leaves it out)" in answer
        )
        # The option as code, kept on one line (it broke at its hyphens at 420 px).
        assert '<code class="opt">--assignors</code> default,task:ha' in answer
        assert "At crashes" not in answer
    # Assignors the user chose (plan-standbys' line for a plan without warmups runs
    # task:sticky alone): no cause claimed, no warmups advised against the plan.
    for chosen in (["task:sticky"], ["task:sticky", "consumer:range"], None):
        data["manifest"]["assignors"] = chosen
        answer = answer_of(data, "chosen")
        assert "task:ha, the high-availability assignor, was not among this run's assignors." in (
            answer
        )
        assert "default group" not in answer and "--assignors" not in answer
        assert "warmups need it" not in answer


def test_the_crash_comparison_counts_per_crash_not_per_takeover(tmp_path: Path) -> None:
    """In a crash's rebalance task:ha also moves tasks onto caught-up owners, all warm: as a
    share of its takeovers, its cold ones looked fewer than they were. Here task:ha takes over
    9 cold of 209 (4%) against task:sticky's 8 of 30 (27%), but more per crash: no claim."""
    data = load()
    crash = next(r for r in data["by_event"] if (r["assignor"], r["event"]) == ("task:ha", "crash"))
    crash |= {"warm_takeovers": 200, "cold_takeovers": 9}
    page = html.unescape(render_report(data, tmp_path / "more").read_text())
    assert "At crashes" not in page[page.index('id="answer"') : page.index('id="figures"')]
    crash |= {"cold_takeovers": 4}
    page = html.unescape(render_report(data, tmp_path / "fewer").read_text())
    assert (
        "At crashes, task:sticky restored 0.89 stateful tasks per crash from scratch, standbys "
        "or not (8 tasks over 9 crashes), task:ha 0.44 (4 over 9)." in page
    )
    # Counts of tasks, not of crashes ("1 in 2 crashes" read as one crash of two), and no
    # exponent (".2g" wrote 199 tasks over 2 crashes as 1e+02).
    sticky = next(
        r for r in data["by_event"] if (r["assignor"], r["event"]) == ("task:sticky", "crash")
    )
    sticky |= {"cold_takeovers": 199, "rebalances": 2}
    crash |= {"cold_takeovers": 1, "rebalances": 2}
    page = html.unescape(render_report(data, tmp_path / "many").read_text())
    assert (
        "At crashes, task:sticky restored 100 stateful tasks per crash from scratch, standbys "
        "or not (199 tasks over 2 crashes), task:ha 0.5 (1 over 2)." in page
    )


def test_run_details_name_the_run_and_its_versions(tmp_path: Path) -> None:
    """The run id simulate prints (and every row carries) identifies the run a report is of,
    the code fingerprint the code that wrote it (as simulate's refusals name it)."""
    data = load()
    data["manifest"] |= {"pyspark": "4.0.1", "code_sha256": "7da48dd157f8" + "0" * 52}
    page = render_report(data, tmp_path).read_text()
    details = page[page.index('id="run"') :]
    assert '<th class="l">run id</th><td class="l">report-data</td>' in details
    assert '<th class="l">pyspark</th><td class="l">4.0.1</td>' in details
    assert '<th class="l">code fingerprint</th><td class="l">7da48dd157f8…</td>' in details


def test_run_details_write_counts_with_thousands_separators(tmp_path: Path) -> None:
    """A new user's audit: Run details said rows 31000 and acceptable recovery lag 10000 where
    the rest of the page writes 31,000; a seed is written as --seed takes it."""
    data = load()
    data["manifest"] |= {"rows": 31000, "acceptable_recovery_lag": 10000, "seed": 123456}
    page = render_report(data, tmp_path).read_text()
    details = page[page.index('id="run"') :]
    assert '<th class="l">rows</th><td class="l">31,000</td>' in details
    assert '<th class="l">acceptable recovery lag</th><td class="l">10,000</td>' in details
    assert '<th class="l">seed</th><td class="l">123456</td>' in details


def test_the_warm_share_says_new_tasks_count_as_cold(page: str) -> None:
    """cold_takeovers counts every stateful task placed on a new owner without its state, the
    new tasks of a partition expansion included (not takeovers: they had no owner): the column
    and the schema say so, or an expansion's low warm share reads as a failure to keep state."""
    from streamassign.pipeline.simulate import COLUMNS

    glossary = html.unescape(page[page.index('class="glossary"') :])
    assert "new tasks (the initial assignment's, a partition expansion's) count among" in glossary
    cold = next(meaning for name, _, _, meaning in COLUMNS if name == "cold_takeovers")
    assert (
        "or new (every task of the initial assignment, a partition expansion's new tasks)" in cold
    )


def test_exact_number_parses_back_and_stays_short() -> None:
    """A whole float was written as all its digits: --restore-rate 1e300 became a 301-digit
    word in the next line and the knob lines. Past 1e16 (floats no longer hold every integer)
    repr, as exact and short."""
    assert exact_number(1234567.0) == "1234567" and exact_number(60.25) == "60.25"
    assert exact_number(-0.0) == "0" and exact_number(9999999999999998.0) == "9999999999999998"
    assert exact_number(1e16) == "1e+16" and exact_number(1e300) == "1e+300"
    assert exact_number(-1e21) == "-1e+21" and exact_number(5) == "5"
    for value in (1e16, 1e300, -1e21, 9999999999999998.0, 0.1 + 0.2, 1e-7):
        assert float(exact_number(value)) == value
