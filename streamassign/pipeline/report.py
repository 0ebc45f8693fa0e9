"""The simulation report: CSV summaries and one self-contained, interactive HTML page.

Input is what ``spark.aggregate`` collects (plain dicts and lists: small, already aggregated), so
rendering needs neither Spark nor the rows. The page opens with the answer (which assignor to use
for this topology and churn model, and why, in records restored, restore time, moves, split joins
and balance), then interactive plotly figures (hover for numbers, click a legend entry to hide a
series), then the detailed tables. plotly.js is embedded once, so the file works offline and can
be mailed or attached to a ticket on its own. The page comes from the Jinja2 template
``report.html.j2`` next to this module.
"""

from __future__ import annotations

import csv
import io
import math
import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from ..text import counted, exact_number
from .assignors import SPECS, is_default_group
from .scenarios import EVENTS
from .simulate import PROBING_INTERVAL_S, RESTORE_RATE, WARMUPS

__all__ = [
    "CSV_FILES",
    "Outcome",
    "Recommendation",
    "assignor_colour",
    "csv_text",
    "outcomes",
    "recommend",
    "render_report",
    "write_csv",
]

#: The CSV files written next to the HTML page, and which aggregate each holds.
CSV_FILES: Final = {
    "summary_by_assignor.csv": "by_assignor",
    "summary_by_event.csv": "by_event",
    "by_step.csv": "by_step",
}

_TEMPLATE: Final = "report.html.j2"

# -- colours ---------------------------------------------------------------------------------------

#: One colour per assignor on every figure and table. The registry's assignors get the first
#: colours in registry order (so a name keeps its colour whichever others a run compares); any
#: other name gets one of the rest, picked by a stable hash of the name.
_COLOURS: Final = (
    "#1f77b4",  # task:sticky, blue
    "#2ca02c",  # task:ha, green
    "#ff7f0e",  # faust:copartitioned, orange
    "#d62728",  # consumer:range, red
    "#9467bd",  # consumer:roundrobin, purple
    "#8c564b",  # consumer:sticky, brown
    "#e377c2",  # consumer:cooperative-sticky, pink
    "#7f7f7f",  # consumer:shuffled, grey
    "#bcbd22",  # aiokafka:range, olive
    "#17becf",  # aiokafka:roundrobin, cyan
    "#393b79",  # aiokafka:sticky, navy
    "#e7ba52",
    "#637939",
    "#ad494a",
    "#a55194",
    "#6baed6",
)
_REGISTRY: Final = tuple(s.name for s in SPECS)


def assignor_colour(name: str) -> str:
    """The colour of ``name`` in every figure and table of every report."""
    if name in _REGISTRY:
        return _COLOURS[_REGISTRY.index(name)]
    spare = _COLOURS[len(_REGISTRY) :]
    return spare[zlib.crc32(name.encode()) % len(spare)]


# -- formatting ------------------------------------------------------------------------------------


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _fmt(value: Any, pattern: str) -> str:
    return "—" if _missing(value) else pattern.format(value)


def _records(value: Any) -> str:
    """A record count a reader takes in at a glance: 236 M, 34.1 k, 812."""
    if _missing(value):
        return "—"
    v = float(value)
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            shown = v / scale
            return f"{shown:.0f} {unit}" if abs(shown) >= 100 else f"{shown:.1f} {unit}"
    return f"{v:.0f}"


def _duration(seconds: Any) -> str:
    """``seconds`` as 0.4 s, 35 s, 4 min 10 s, 2 h 5 min."""
    if _missing(seconds):
        return "—"
    s = float(seconds)
    if s < 10:
        return f"{s:.1f} s"
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        m, rest = divmod(round(s), 60)
        return f"{m} min {rest} s" if rest else f"{m} min"
    h, rest = divmod(round(s / 60), 60)
    return f"{h} h {rest} min" if rest else f"{h} h"


def _share(value: Any) -> str:
    return _fmt(value, "{:.0%}")


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> None:
    """``rows`` as CSV with a header, in ``columns`` order (None written as empty)."""
    with path.open("w", newline="") as fh:
        fh.write(csv_text(rows, columns))


def csv_text(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """What :func:`write_csv` writes, as a string."""
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if row.get(c) is None else row.get(c) for c in columns])
    return text.getvalue()


# -- the answer ------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Outcome:
    """What one assignor did over every rebalance after the initial one, in a user's terms.

    Restore times are records over ``restore_per_s`` (one task restores at that rate):
    ``downtime_s`` is the task-seconds spent restoring per rebalance, ``longest_s`` the time
    until the slowest task of a rebalance runs again (p99 over rebalances).
    """

    name: str
    level: str
    rebalances: int
    records_mean: float
    records_p99: float
    downtime_s: float
    longest_s: float
    moves_mean: float
    bound_mean: float
    balanced_share: float
    #: share of rebalances balanced per subtopology, and the worst per-subtopology spread
    subtopology_balanced_share: float
    subtopology_imbalance_max: float
    split_mean: float
    split_share: float | None
    unassigned: int
    errors: int
    warmups: int | None
    probing_rebalances: int | None
    balanced_after_s: float | None
    never_balanced: int | None

    @property
    def unit(self) -> str:
        return "tasks" if self.level == "task" else "partitions"

    def flaw(self) -> tuple[str, str] | None:
        """Why this assignor is wrong for the topology whatever its costs, as (kind, why): kind
        ``splits`` (it breaks joins) or ``fails``; None if it is fit."""
        if self.errors:
            return "fails", f"failed {self.errors} rebalance(s) (see the run's notes)"
        if self.unassigned:
            return "fails", f"left {self.unassigned:,} {self.unit} without an owner"
        if self.split_mean > 0:
            balanced = "; balanced after every rebalance" if self.balanced_share >= 1.0 else ""
            return "splits", (
                f"{self.split_mean:.1f} joined tasks split per rebalance on average, in "
                f"{_share(self.split_share)} of rebalances{balanced}"
            )
        return None


def _recorded(manifest: Mapping[str, Any], key: str) -> float | None:
    """The run's setting ``key``, or None when its manifest has none (a run written before
    simulate recorded it) or no positive number there."""
    value = manifest.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def _restore_rate(manifest: Mapping[str, Any]) -> float:
    """The run's restore rate; a run written before ``simulate --restore-rate`` existed has
    none in its manifest and was simulated at the default."""
    rate = _recorded(manifest, "replica_restore_per_s")
    return RESTORE_RATE if rate is None else rate


def _number(value: float) -> str:
    """``value`` in full, thousands separated: ``:g`` keeps 6 digits (1,234,567 reads as
    1.23457e+06)."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,}"


def outcomes(data: Mapping[str, Any]) -> list[Outcome]:
    """One :class:`Outcome` per (level, assignor) of ``data`` (``spark.aggregate``'s result)."""
    rate = _restore_rate(data.get("manifest", {}))
    extra = {(r["level"], r["assignor"]): r for r in data.get("outcomes", [])}
    errors = {e["assignor"]: int(e["errors"]) for e in data.get("errors", [])}
    result = []
    for row in data["by_assignor"]:
        more = extra.get((row["level"], row["assignor"]), {})
        n = int(row["rebalances"] or 0)
        task = row["level"] == "task"
        result.append(
            Outcome(
                name=row["assignor"],
                level=row["level"],
                rebalances=n,
                records_mean=float(row["records_to_restore_mean"] or 0.0),
                records_p99=float(row["records_to_restore_p99"] or 0.0),
                downtime_s=float(row["records_to_restore_mean"] or 0.0) / rate,
                longest_s=float(row["max_task_restore_p99"] or 0.0) / rate,
                moves_mean=float(row["moves_mean"] or 0.0),
                bound_mean=float(row["bound_total"] or 0) / n if n else 0.0,
                balanced_share=float(row["balanced_share"] or 0.0),
                subtopology_balanced_share=float(row.get("subtopology_balanced_share") or 0.0),
                subtopology_imbalance_max=float(row.get("subtopology_imbalance_max") or 0.0),
                split_mean=float(row["split_tasks_mean"] or 0.0),
                split_share=more.get("split_share"),
                unassigned=int(row["unassigned_total"] or 0),
                errors=errors.get(row["assignor"], 0),
                warmups=more.get("warmups_total") if task else None,
                probing_rebalances=more.get("probing_rebalances_total") if task else None,
                balanced_after_s=more.get("balanced_after_s_mean") if task else None,
                never_balanced=more.get("never_balanced") if task else None,
            )
        )
    return result


@attrs.frozen
class Recommendation:
    """The assignor to use, the reasons in numbers, and why others are ruled out."""

    best: Outcome | None
    reasons: tuple[str, ...]
    #: (outcome, kind, why) per assignor unfit for the topology; kinds as in ``Outcome.flaw``.
    ruled_out: tuple[tuple[Outcome, str, str], ...]
    ranked: tuple[Outcome, ...]


def _rank_key(o: Outcome) -> tuple[float, float, float]:
    # Moving less than the bound means staying unbalanced: balance before moves on a tie.
    return (o.records_mean, -o.balanced_share, o.moves_mean)


def _moves_reason(o: Outcome) -> str:
    """The moves of ``o`` against the least a balanced assignment needs, in words."""
    moves = f"It moves {o.moves_mean:.1f} {o.unit} per rebalance"
    if o.moves_mean < o.bound_mean - 0.05:
        how = (
            f"fewer than the {o.bound_mean:.1f} that balancing at once would take: it defers "
            "moves until the new owners are caught up"
            if o.warmups
            else f"fewer than the {o.bound_mean:.1f} that balancing would take: it stays "
            "unbalanced instead"
        )
    elif o.moves_mean <= o.bound_mean + 0.05:
        how = "about the least any balanced assignment needs"
    else:
        how = f"more than the {o.bound_mean:.1f} a balanced assignment needs"
    return f"{moves}, {how}; it never splits a joined task."


def _restore_reason(best: Outcome, restore_per_s: float) -> str:
    if best.records_p99 <= 0:
        return "Its rebalances restore no changelog records (nothing stateful changed hands)."
    return (
        f"It restores {_records(best.records_mean)} changelog records per rebalance on average "
        f"(p99 {_records(best.records_p99)}): about {_duration(best.downtime_s)} of task "
        f"downtime per rebalance at {_number(restore_per_s)} records/s per task, and the slowest "
        f"task is back within {_duration(best.longest_s)} in 99% of rebalances."
    )


def _runner_up_reason(best: Outcome, second: Outcome | None) -> str:
    if second is None:
        return (
            "It is the only assignor fit for this topology in this run; compare more with "
            "--assignors (e.g. all)."
        )
    if second.records_mean > 0 and best.records_mean < second.records_mean:
        ratio = second.records_mean / max(best.records_mean, 1.0)
        return (
            f"The next best, {second.name}, restores {_records(second.records_mean)} "
            f"({ratio:,.1f}x as much; {_duration(second.downtime_s)} of downtime)."
        )
    edge = (
        f"is balanced more often ({_share(best.balanced_share)} against "
        f"{_share(second.balanced_share)})"
        if best.balanced_share > second.balanced_share
        else f"moves fewer {best.unit} ({best.moves_mean:.1f} against {second.moves_mean:.1f})"
    )
    return f"{second.name} restores as little; {best.name} {edge}."


def _subtopology_balance(o: Outcome) -> str:
    """How evenly ``o`` spreads each subtopology (joins and stores live per subtopology)."""
    return (
        f"per subtopology after {_share(o.subtopology_balanced_share)} (at worst "
        f"{counted(o.subtopology_imbalance_max, 'more task')} of one subtopology per thread on one "
        "owner than on another)"
    )


def _balance_reason(best: Outcome) -> str:
    if not best.warmups:
        return (
            f"Its actives are balanced in total after {_share(best.balanced_share)} of "
            f"rebalances, and {_subtopology_balance(best)}."
        )
    return (
        f"The price: it balances later. It keeps tasks on caught-up state and warms up their "
        f"new owners first ({best.warmups:,} warmups and {best.probing_rebalances or 0:,} "
        f"probing rebalances in all). Actives were balanced right after "
        f"{_share(best.balanced_share)} of the events and {_duration(best.balanced_after_s)} "
        f"after the event on average; {best.never_balanced or 0} of {best.rebalances} "
        "rebalances were still unbalanced when the next event came. Right after the event, "
        f"actives were balanced {_subtopology_balance(best)}."
    )


def recommend(found: Sequence[Outcome], restore_per_s: float) -> Recommendation:
    """Rule out assignors that break the topology (split joins, unowned units, failures), then
    pick the one restoring the fewest records per rebalance — restores are what keep tasks
    down —, ties to more balance, then fewer moves."""
    ruled_out = tuple((o, *flaw) for o in found if (flaw := o.flaw()) is not None)
    fit = sorted((o for o in found if o.flaw() is None), key=_rank_key)
    ranked = (*fit, *sorted((o for o, _, _ in ruled_out), key=_rank_key))
    if not fit:
        return Recommendation(None, (), ruled_out, ranked)
    best = fit[0]
    reasons = (
        _restore_reason(best, restore_per_s),
        _runner_up_reason(best, fit[1] if len(fit) > 1 else None),
        _moves_reason(best),
        _balance_reason(best),
    )
    return Recommendation(best, reasons, ruled_out, ranked)


def _cold_at_crashes(by_event: Sequence[Mapping[str, Any]], name: str) -> tuple[int, int] | None:
    """The stateful tasks ``name`` took over cold (restoring from scratch) at crashes, and the
    crashes (their rebalances); None if the run has no crash for it."""
    for row in by_event:
        if (row["level"], row["assignor"], row["event"]) == ("task", name, "crash"):
            crashes = int(row["rebalances"] or 0)
            return (int(row["cold_takeovers"] or 0), crashes) if crashes else None
    return None


def ha_reasons(
    rec: Recommendation, by_event: Sequence[Mapping[str, Any]], assignors: object = None
) -> tuple[str, ...]:
    """What the high-availability assignor would change, for a task-level pick: that it was not
    among the run's ``assignors`` (the manifest's), with how to compare it only when the run
    used simulate's default group, which leaves it out (an assignor list the user chose, as
    plan-standbys' line for a plan without warmups does, was chosen); or, when the run shows
    it, that it takes over crashed tasks cold less often than the sticky assignor (whose
    least-moves rule places an orphan cold rather than move a kept task)."""
    best = rec.best
    if best is None or best.level != "task":
        return ()
    compared = {o.name: o for o in rec.ranked if o.flaw() is None}
    if "task:ha" not in {o.name for o in rec.ranked}:
        missing = "task:ha, the high-availability assignor, was not among this run's assignors"
        if not is_default_group(assignors):
            return (f"{missing}.",)
        return (
            f"{missing} (simulate's default group leaves it out): it keeps tasks on caught-up "
            "state while warmups restore, and plan-standbys' warmups need it; compare it with "
            "--assignors default,task:ha.",
        )
    other = next((o for o in rec.ranked if o.level == "task" and o.name != "task:ha"), None)
    if "task:ha" not in compared or other is None or other.name not in compared:
        return ()
    # Per crash, not as shares of takeovers: in a crash's rebalance task:ha also moves tasks
    # onto caught-up owners (warm), which would dilute its share of cold ones.
    ha, theirs = (_cold_at_crashes(by_event, n) for n in ("task:ha", other.name))
    if ha is None or theirs is None or not ha[0] / ha[1] < theirs[0] / theirs[1]:
        return ()
    # Counts of tasks over crashes: "1 in 2 crashes" read as one crash of two.
    cold, crashes = theirs
    return (
        f"At crashes, {other.name} restored {_per_crash(cold, crashes)} stateful tasks per "
        f"crash from scratch, standbys or not ({counted(cold, 'task')} over "
        f"{counted(crashes, 'crash', 'crashes')}), task:ha {_per_crash(*ha)} "
        f"({ha[0]:,} over {ha[1]:,}).",
    )


def _per_crash(cold: int, crashes: int) -> str:
    """``cold / crashes`` to 2 significant digits, never as an exponent (``.2g`` wrote 99.5
    as 1e+02)."""
    if not cold:
        return "0"
    per = cold / crashes
    decimals = max(0, 1 - math.floor(math.log10(per)))
    shown = f"{per:,.{decimals}f}"
    return shown.rstrip("0").rstrip(".") if "." in shown else shown


# -- figures ---------------------------------------------------------------------------------------

#: Legends go under the plot, where they cover no data; the figure grows with its entries so
#: that the plot keeps its height when the legend wraps on a narrow screen. Placed at the foot
#: of the figure (``yref="container"``), plotly reserves the legend's height there and lays the
#: x axis out above it: a legend placed under the plot area instead (``y`` < 0 in the plot's
#: coordinates) stays put while the axis grows, and on a narrow screen the rotated tick labels
#: and the axis title ran over it.
_LEGEND: Final = {
    "orientation": "h",
    "yref": "container",
    "yanchor": "bottom",
    "y": 0,
    "xanchor": "left",
    "x": 0,
}
_DASHES: Final = ("dash", "dot", "dashdot", "longdash")
_SYMBOLS: Final = ("circle-open", "diamond-open", "square-open", "triangle-up-open")


def _same_as(series: Sequence[tuple[str, Sequence[Any]]]) -> dict[str, str]:
    """For each series identical to an earlier one, the earlier one's name."""
    first: dict[tuple[Any, ...], str] = {}
    same: dict[str, str] = {}
    for name, values in series:
        key = tuple(None if _missing(v) else round(float(v), 9) for v in values)
        if key in first:
            same[name] = first[key]
        else:
            first[key] = name
    return same


def _layout(fig: Any, y_title: str, x_title: str = "", log: bool = False) -> Any:
    entries = sum(1 for t in fig.data if t.showlegend is not False)
    fig.update_layout(
        template="plotly_white",
        height=380 + 18 * entries,
        margin={"l": 60, "r": 20, "t": 20, "b": 20},
        legend=_LEGEND,
        hoverlabel={"namelength": -1},
    )
    fig.update_yaxes(title_text=y_title, automargin=True)
    if log:  # powers of ten only: minor labels crowd the axis
        fig.update_yaxes(type="log", dtick=1, tickformat="~s")
    fig.update_xaxes(title_text=x_title, automargin=True)
    return fig


def _events(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    seen = {r["event"] for r in rows}
    return [e for e in EVENTS if e in seen and e != "initial"]


def _by_event_bars(
    rows: Sequence[Mapping[str, Any]],
    value: str,
    mark: Callable[[Mapping[str, Any]], float | None],
    mark_name: str,
    y_title: str,
    log: bool = False,
) -> Any:
    """Bars per event (x) and assignor (colour), placed by hand so that a mark (a lower bound,
    a p99) sits on its own bar; identical assignors are named in the legend."""
    import plotly.graph_objects as go

    events = _events(rows)
    names = sorted({r["assignor"] for r in rows}, key=_order)
    index = {(r["assignor"], r["event"]): r for r in rows}
    same = _same_as([(n, [(index.get((n, e)) or {}).get(value) for e in events]) for n in names])
    width = 0.8 / max(1, len(names))
    fig = go.Figure()
    marks_x: list[float] = []
    marks_y: list[float] = []
    for k, name in enumerate(names):
        xs, ys, data = [], [], []
        for i, event in enumerate(events):
            row = index.get((name, event))
            if row is None or _missing(row.get(value)):
                continue
            x = i - 0.4 + width * (k + 0.5)
            xs.append(x)
            ys.append(row[value])
            data.append([event.replace("_", " "), *_hover_values(row)])
            y = mark(row)
            if y is not None and not math.isnan(y):
                marks_x.append(x)
                marks_y.append(float(y))
        _add_assignor_bars(fig, name, same.get(name), xs, ys, data, width)
    if marks_x:
        _add_marks(fig, marks_x, marks_y, mark_name, width)
    fig.update_xaxes(
        tickvals=list(range(len(events))), ticktext=[e.replace("_", " ") for e in events]
    )
    return _layout(fig, y_title, "event that caused the rebalance", log)


def _add_assignor_bars(
    fig: Any,
    name: str,
    same_as: str | None,
    xs: list[float],
    ys: list[Any],
    data: list[list[Any]],
    width: float,
) -> None:
    """One assignor's bars (hatched, and named so in the legend, when another assignor gave
    identical values: ``same_as``)."""
    label = f"{name} (same as {same_as})" if same_as is not None else name
    fig.add_bar(
        x=xs,
        y=ys,
        width=width * 0.92,
        name=label,
        marker={
            "color": assignor_colour(name),
            "pattern": {"shape": "/" if same_as is not None else ""},
        },
        customdata=data,
        hovertemplate=f"<b>{name}</b><br>%{{customdata[0]}}<br>{_BAR_HOVER}<extra></extra>",
    )


def _add_marks(fig: Any, xs: list[float], ys: list[float], name: str, width: float) -> None:
    """Black dashes as wide as the bars at ``xs``: one legend entry for all of them."""
    fig.add_scatter(
        x=xs,
        y=ys,
        mode="markers",
        name=name,
        marker={"symbol": "line-ew-open", "size": max(8, 60 * width), "color": "black"},
        marker_line_width=3,
        hovertemplate=f"{name}: %{{y:,.2f}}<extra></extra>",
        showlegend=True,
    )


def _hover_values(row: Mapping[str, Any]) -> list[Any]:
    """The customdata of a per-event bar, in the order ``_BAR_HOVER`` reads it (after the
    event's name)."""
    n = row["rebalances"] or 1
    return [
        row["rebalances"],
        row["moves_mean"],
        (row["bound_total"] or 0) / n,
        _records(row["records_to_restore_mean"]),
        _records(row["records_to_restore_p50"]),
        _records(row["records_to_restore_p99"]),
        row["split_tasks_mean"],
    ]


_BAR_HOVER: Final = (
    "%{customdata[1]} rebalances<br>moves: %{customdata[2]:.2f} (bound %{customdata[3]:.2f})"
    "<br>records restored: mean %{customdata[4]}, p50 %{customdata[5]}, p99 %{customdata[6]}"
    "<br>joined tasks split: %{customdata[7]:.2f}"
)


def _bound(row: Mapping[str, Any]) -> float | None:
    """The mean lower bound of the moves of a summary row."""
    return None if not row["rebalances"] else float(row["bound_total"] or 0) / row["rebalances"]


def _order(name: str) -> tuple[int, str]:
    return (_REGISTRY.index(name) if name in _REGISTRY else len(_REGISTRY), name)


def _over_steps(
    rows: Sequence[Mapping[str, Any]], level: str, value: str, y_title: str, fmt: str
) -> Any:
    """One line per assignor of ``level`` over the rebalance number; an assignor identical to an
    earlier one is drawn dashed with open markers and named 'same as' in the legend."""
    import plotly.graph_objects as go

    names = sorted({r["assignor"] for r in rows if r["level"] == level}, key=_order)
    series = {
        n: sorted((r["step"], r[value]) for r in rows if r["assignor"] == n and r["level"] == level)
        for n in names
    }
    same = _same_as([(n, [v for _, v in pts]) for n, pts in series.items()])
    fig = go.Figure()
    repeats: dict[str, int] = {}
    for name in names:
        pts = series[name]
        line: dict[str, Any] = {"color": assignor_colour(name), "width": 2}
        marker: dict[str, Any] = {"size": 5}
        label = name
        if name in same:  # dashed, with open markers growing per repeat: rings around the first
            k = repeats[same[name]] = repeats.get(same[name], -1) + 1
            line |= {"dash": _DASHES[k % len(_DASHES)]}
            marker = {"symbol": _SYMBOLS[k % len(_SYMBOLS)], "size": 9 + 4 * k}
            label = f"{name} (same as {same[name]})"
        fig.add_scatter(
            x=[p[0] for p in pts],
            y=[p[1] for p in pts],
            mode="lines+markers",
            name=label,
            line=line,
            marker=marker,
            hovertemplate=f"{name}: %{{y:{fmt}}}<extra></extra>",
        )
    fig.update_layout(hovermode="x unified")
    return _layout(fig, y_title, "rebalance number in the trace (0: initial assignment)")


#: The assignment-time axis turns logarithmic only past this ratio of slowest to fastest p99:
#: bars on a log axis misstate ratios (1.96 ms drawn at 1/20 of 14.2 ms), and over a narrower
#: span a log axis labels one tick at most.
_LOG_AXIS_SPAN: Final = 100.0


def _assign_time(by_assignor: Sequence[Mapping[str, Any]]) -> Any:
    """One horizontal bar per assignor, its p99 written on it; a linear axis unless the
    times span more than two decades."""
    import plotly.graph_objects as go

    fig = go.Figure()
    rows = sorted(by_assignor, key=lambda r: _order(r["assignor"]), reverse=True)
    for row in rows:
        name = row["assignor"]
        fig.add_bar(
            y=[name],
            x=[row["assign_ms_p99"] or 0.0],
            orientation="h",
            name=name,
            marker_color=assignor_colour(name),
            text=[f"{row['assign_ms_p99'] or 0.0:.2f} ms"],
            textposition="auto",
            customdata=[[row["assign_ms_p50"] or 0.0, row["assign_ms_max"] or 0.0]],
            hovertemplate=(
                f"<b>{name}</b><br>p99 %{{x:.2f}} ms<br>p50 %{{customdata[0]:.2f}} ms"
                "<br>max %{customdata[1]:.2f} ms<extra></extra>"
            ),
        )
    times = [r["assign_ms_p99"] for r in rows if r["assign_ms_p99"]]
    log = bool(times) and max(times) > _LOG_AXIS_SPAN * min(times)
    fig.update_layout(
        showlegend=False,
        template="plotly_white",
        height=120 + 28 * len(rows),
        margin={"l": 20, "r": 20, "t": 10, "b": 20},
    )
    fig.update_yaxes(automargin=True)
    fig.update_xaxes(
        title_text="milliseconds per assignor call (p99)" + (", logarithmic scale" if log else ""),
        type="log" if log else "linear",
        tickformat="~g",
        automargin=True,
        **({"dtick": 1} if log else {"rangemode": "tozero"}),
    )
    return fig


@attrs.frozen
class Figure:
    """One figure of the page: anchor, heading, caption and the plotly figure."""

    anchor: str
    heading: str
    caption: str
    figure: Any


def _restore_figure(by_event: Sequence[Mapping[str, Any]]) -> Figure | str:
    """Records restored per event, or why there is nothing to plot."""
    if not any(r["records_to_restore_mean"] for r in by_event if r["event"] != "initial"):
        return "Restores are not plotted: no rebalance restored any changelog record."
    return Figure(
        "restore",
        "Records restored per rebalance, by event",
        "Changelog records the new owners of stateful tasks must restore before the tasks run "
        "again (mean per rebalance; black marks: p99). Log scale: no bar means nothing was "
        "restored. Hover for the median and the moves.",
        _by_event_bars(
            by_event,
            "records_to_restore_mean",
            lambda r: r["records_to_restore_p99"],
            "p99",
            "records restored per rebalance (mean)",
            log=True,
        ),
    )


#: What a balanced assignment means for each level's move bound (``move_lower_bound``).
_BOUND_TARGET: Final = {
    "task": "balanced per subtopology and in total",
    "consumer": "with partitions balanced in total over consumers",
}


def _moves_figure(by_event: Sequence[Mapping[str, Any]], level: str) -> Figure:
    rows = [r for r in by_event if r["level"] == level]
    unit = "tasks" if level == "task" else "partitions"
    return Figure(
        f"moves-{level}",
        f"Moves against their lower bound ({level} level: {unit})",
        f"Mean {unit} taken from an owner that is still in the group. Black marks: the least any "
        f"assignment {_BOUND_TARGET[level]} needs. A bar below its mark means the assignor left "
        "the group unbalanced to move less.",
        _by_event_bars(rows, "moves_mean", _bound, "lower bound", f"{unit} moved"),
    )


def _imbalance_figure(by_step: Sequence[Mapping[str, Any]], level: str) -> Figure:
    unit = "tasks per thread" if level == "task" else "partitions per consumer"
    return Figure(
        f"imbalance-{level}",
        f"Imbalance over the trace ({level} level)",
        f"Most minus fewest active {unit}, mean over scenarios at each rebalance number; 0 or 1 "
        "is as even as whole units allow on equal threads.",
        _over_steps(by_step, level, "active_imbalance_mean", f"max - min {unit}", ".2f"),
    )


def _coverage_figure(by_step: Sequence[Mapping[str, Any]]) -> Figure | str | None:
    """Standby coverage over the trace; a sentence when it is 100 % throughout (a flat line);
    None without task-level rows."""
    task_steps = [r for r in by_step if r["level"] == "task"]
    if not task_steps:
        return None
    if all(
        not _missing(r["standby_coverage_min"]) and r["standby_coverage_min"] >= 1.0
        for r in task_steps
    ):
        return (
            "Standby coverage is not plotted: every task assignor placed every required standby "
            "in every rebalance (100 %)."
        )
    return Figure(
        "coverage",
        "Standby coverage over the trace (task level)",
        "Standbys placed over those required (min(standbys, clients - 1) per stateful task), "
        "mean over scenarios.",
        _over_steps(by_step, "task", "standby_coverage_mean", "placed / required", ".1%"),
    )


#: What the page says instead of an answer, figures and the ranking when a run holds no
#: rebalance after the initial assignments (every trace ended at step 0).
NO_REBALANCES: Final = (
    "This run has no rebalances after the initial assignments (every trace ended at step 0: "
    "steps = 0, or no event was possible under the churn model), so there is nothing to "
    "compare the assignors on. Simulate again with --steps N (N >= 1) and an event rate > 0."
)


def _figures(data: Mapping[str, Any]) -> tuple[list[Figure], list[str]]:
    """The page's figures, and sentences standing in for figures that would show nothing."""
    if not data["by_assignor"]:  # no rebalance after the initial ones: every figure empty
        return [], ["No figures: this run has no rebalances after the initial assignments."]
    by_event, by_step = data["by_event"], data["by_step"]
    levels = [lvl for lvl in ("task", "consumer") if any(r["level"] == lvl for r in by_step)]
    timing = Figure(
        "assign-time",
        "Assignment time",
        "Wall time of one assignor call, p99 over rebalances (hover for p50 and max). Measured "
        "on the executors, so compare assignors within one run only.",
        _assign_time(data["by_assignor"]),
    )
    made = [
        _restore_figure(by_event),
        *(_moves_figure(by_event, level) for level in levels),
        *(_imbalance_figure(by_step, level) for level in levels),
        _coverage_figure(by_step),
        timing,
    ]
    figures = [m for m in made if isinstance(m, Figure)]
    notes = [m for m in made if isinstance(m, str)]
    return figures, notes


def _figure_html(fig: Figure) -> str:
    html: str = fig.figure.to_html(
        full_html=False,
        include_plotlyjs=False,
        div_id=f"fig-{fig.anchor}",
        default_width="100%",
        config={"displaylogo": False, "responsive": True},
    )
    return html


# -- tables ----------------------------------------------------------------------------------------

#: Columns of the detailed tables: (column, header, explanation, format).
_DETAIL: Final = (
    ("rebalances", "rebalances", "rebalances after the initial one", "{:,.0f}"),
    (
        "balanced_share",
        "balanced",
        "share of rebalances after which every owner held the floor or ceiling of its capacity "
        "share of active units",
        "{:.0%}",
    ),
    (
        "subtopology_balanced_share",
        "balanced per subtopology",
        "share of rebalances after which every owner held the floor or ceiling of its capacity "
        "share of each subtopology's active tasks (consumer level: a task counts for the "
        "consumer holding its partition of the subtopology's first topic; split joins are "
        "counted apart)",
        "{:.0%}",
    ),
    (
        "subtopology_imbalance_max",
        "worst subtopology spread",
        "largest spread of one subtopology's active tasks per thread (most minus fewest) after "
        "any rebalance",
        "{:g}",
    ),
    (
        "optimal_moves_share",
        "moves = bound",
        "share of rebalances moving exactly the least a balanced assignment needs: at task "
        f"level, an assignment {_BOUND_TARGET['task']}; at consumer level, one "
        f"{_BOUND_TARGET['consumer']} (a weaker target: compare within a level only)",
        "{:.0%}",
    ),
    ("moves_mean", "moves", "units taken from an owner still in the group, mean", "{:.2f}"),
    (
        "excess_moves_mean",
        "moves - bound",
        "moves above the least any balanced assignment needs, mean; negative when the assignor "
        "left the group unbalanced, moving less than balancing would take",
        "{:+.2f}",
    ),
    ("active_imbalance_mean", "imbalance", "most minus fewest active units per thread", "{:.2f}"),
    (
        "load_imbalance_mean",
        "load imbalance",
        "most minus fewest active and standby units per thread",
        "{:.2f}",
    ),
    (
        "standby_coverage_mean",
        "standbys",
        "standbys placed over required, mean (task level)",
        "{:.0%}",
    ),
    (
        "warm_share",
        "warm",
        "stateful tasks placed on a new owner that has local state of them, of all placed on a "
        "new owner; new tasks (the initial assignment's, a partition expansion's) count among "
        "the others (no client has their state), so those events and the totals read lower "
        "than takeovers alone",
        "{:.0%}",
    ),
    ("records_to_restore_p50", "restore p50", "records restored per rebalance, median", "{:,.0f}"),
    ("records_to_restore_p99", "restore p99", "records restored per rebalance, p99", "{:,.0f}"),
    (
        "split_tasks_mean",
        "split joins",
        "tasks whose co-partitioned partitions went to different consumers, mean",
        "{:.2f}",
    ),
    ("assign_ms_p99", "assign p99 ms", "assignor call wall time, p99", "{:.2f}"),
)


@attrs.frozen
class Cell:
    """One table cell: its text, an assignor's colour swatch, a second smaller line."""

    text: str
    colour: str | None = None
    sub: str = ""


def _warm_share(row: Mapping[str, Any]) -> float | None:
    total = (row.get("warm_takeovers") or 0) + (row.get("cold_takeovers") or 0)
    return None if not total else (row.get("warm_takeovers") or 0) / total


def _detail_rows(rows: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> list[list[Cell]]:
    table = []

    def key(row: Mapping[str, Any]) -> tuple[Any, ...]:
        event = row.get("event")
        at = EVENTS.index(event) if event in EVENTS else len(EVENTS)
        return (row["level"] != "task", _order(row["assignor"]), at)

    for row in sorted(rows, key=key):
        full = {**row, "warm_share": _warm_share(row)}
        cells = [Cell(row["assignor"], assignor_colour(row["assignor"]))]
        cells += [Cell(str(full[k]).replace("_", " ")) for k in keys if k != "assignor"]
        cells += [Cell(_fmt(full.get(c), f)) for c, _, _, f in _DETAIL]
        table.append(cells)
    return table


#: Columns of the answer table: (header, explanation).
_ANSWER_COLUMNS: Final = (
    ("assignor", ""),
    ("records restored", "changelog records new owners restore per rebalance: mean, and p99"),
    ("task downtime", "task-seconds spent restoring per rebalance, at the restore rate"),
    ("slowest task back", "p99 time until the last restoring task of a rebalance runs again"),
    (
        "moves",
        "units taken from an owner still in the group per rebalance; and the least any balanced "
        f"assignment needs (task level: {_BOUND_TARGET['task']}; consumer level: partitions "
        "balanced in total)",
    ),
    ("split joins", "joined tasks whose partitions went to different consumers, per rebalance"),
    (
        "balanced",
        "share of rebalances after which actives are balanced in total; below it, per "
        "subtopology (each subtopology's tasks spread evenly too)",
    ),
    ("warmups, probing", "warmup replicas placed, and probing rebalances run (task:ha)"),
    ("time to balance", "mean time from the event until actives are balanced"),
    ("unbalanced at next event", "rebalances not yet balanced when the next event came"),
)


def _balance_time(o: Outcome) -> str:
    """Mean time to balance over the rebalances that got there before the next event."""
    if o.balanced_after_s != 0:
        return _duration(o.balanced_after_s)
    return "at once, if at all" if o.never_balanced else "at once"


def _answer_rows(rec: Recommendation) -> list[tuple[str, list[Cell]]]:
    """(row class, cells) per assignor, best first; unfit ones last."""
    kinds = {o.name: kind for o, kind, _ in rec.ruled_out}
    rows = []
    for o in rec.ranked:
        task = o.level == "task"
        verdict = "use" if o is rec.best else ("splits joins" if o.split_mean > 0 else "")
        cls = "best" if o is rec.best else ("unfit" if o.name in kinds else "")
        rows.append(
            (
                cls,
                [
                    Cell(o.name, assignor_colour(o.name), verdict),
                    Cell(_records(o.records_mean), sub=f"p99 {_records(o.records_p99)}"),
                    Cell(_duration(o.downtime_s)),
                    Cell(_duration(o.longest_s)),
                    Cell(f"{o.moves_mean:.1f} {o.unit}", sub=f"bound {o.bound_mean:.1f}"),
                    Cell(f"{o.split_mean:.1f}"),
                    Cell(
                        _share(o.balanced_share),
                        sub=f"per subtopology {_share(o.subtopology_balanced_share)}",
                    ),
                    Cell(f"{o.warmups or 0:,}, {o.probing_rebalances or 0:,}" if task else "—"),
                    Cell(_balance_time(o) if task else "—"),
                    Cell(
                        f"{o.never_balanced} of {o.rebalances}"
                        if task and o.never_balanced is not None
                        else "—"
                    ),
                ],
            )
        )
    return rows


# -- the page --------------------------------------------------------------------------------------

_MANIFEST_KEYS: Final = (
    "run_id",  # what simulate printed, and every row's run_id: joins runs read together
    "topology",
    "topology_file",
    "partitions",
    "scenarios",
    "seed",
    "assignors",
    "standby_replicas",
    "acceptable_recovery_lag",
    "replica_restore_per_s",
    "max_warmup_replicas",
    "probing_interval_s",
    "rows",
    "master",
    "elapsed_s",
    "streamassign",
    "code_sha256",  # the code that wrote the rows: a rerun keeps the run only for the same
    "pyspark",  # runs that do not record their libraries
    "libraries",  # pyspark and the peers whose assignors wrote rows, with their versions
    "created",
)


def _plain(value: Any) -> str:
    """A manifest value as a reader writes it: lists comma-separated, mappings as k=v."""
    if isinstance(value, Mapping):  # a list inside reads as threads=1,2,4
        return ", ".join(
            f"{k}={','.join(map(str, v)) if isinstance(v, list | tuple) else _plain(v)}"
            for k, v in value.items()
        )
    if isinstance(value, list | tuple):
        return ", ".join(_plain(v) for v in value)
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return _number(value)  # 31,000 rows, as the rest of the page writes counts
    return str(value)


#: The simulation's settings a manifest may lack (runs written before simulate recorded them,
#: simulated at the default): (key, default, unit, whether only task:ha uses it).
_SETTINGS: Final = (
    ("replica_restore_per_s", RESTORE_RATE, " records/s per task", False),
    ("max_warmup_replicas", WARMUPS, "", True),
    ("probing_interval_s", PROBING_INTERVAL_S, " s", True),
)
#: Run details' labels where the key's words would repeat the unit ("probing interval s 600 s").
_LABELS: Final = {
    "replica_restore_per_s": "replica restore rate",
    "probing_interval_s": "probing interval",
    "code_sha256": "code fingerprint",
}


def _run_details(manifest: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The run details table (label, value): the manifest's keys a reader needs; the restore
    rate always (the downtimes above depend on it), task:ha's settings when it ran (only
    then); a setting the run did not record shown at the default, saying so."""
    shown = dict(manifest)
    assignors = manifest.get("assignors") or []  # null in a damaged manifest: none known
    ha = isinstance(assignors, list) and "task:ha" in assignors
    for key, default, unit, ha_only in _SETTINGS:
        if ha_only and not ha:  # recorded by every run, used by task:ha only
            shown.pop(key, None)
            continue
        value = _recorded(manifest, key)
        notes = ["task:ha"] if ha_only else []
        notes += [] if value is not None else ["default, not recorded by this run"]
        why = f" ({'; '.join(notes)})" if notes else ""
        shown[key] = f"{_number(default if value is None else value)}{unit}{why}"
    fingerprint = shown.get("code_sha256")
    if isinstance(fingerprint, str):  # as simulate's refusals name it: 64 digits would not fit
        shown["code_sha256"] = f"{fingerprint[:12]}…"
    if "libraries" in shown:  # pyspark's version is among them
        shown.pop("pyspark", None)
    return [
        # A seed is an identifier, given to --seed as written, not a count.
        (_LABELS.get(k, k.replace("_", " ")), str(shown[k]) if k == "seed" else _plain(shown[k]))
        for k in _MANIFEST_KEYS
        if k in shown
    ]


def _run_summary(manifest: Mapping[str, Any], rebalances: int) -> str:
    model = manifest.get("model", {})
    scenarios = manifest.get("scenarios")
    deployments = "simulated deployment"
    parts = [counted(scenarios, deployments) if isinstance(scenarios, int) else f"? {deployments}s"]
    if "steps" in model:
        parts.append(f"up to {model['steps']} rebalances each")
    parts.append(f"{rebalances:,} rebalances per assignor after the initial ones")
    if "standby_replicas" in manifest:
        parts.append(counted(manifest["standby_replicas"], "standby replica"))
    return ", ".join(parts)


def _churn(model: Mapping[str, Any]) -> str:
    """The churn model in one line: what happens how often."""
    names = (
        ("scale_out_per_hour", "scale-outs/h"),
        ("scale_in_per_hour", "scale-ins/h"),
        ("crash_per_client_hour", "crashes per client-hour"),
        ("rolling_restart_per_hour", "rolling restarts/h"),
        ("expansion_per_hour", "partition expansions/h"),
        ("rack_loss_per_hour", "rack losses/h"),
    )
    shown = [f"{exact_number(model[k])} {label}" for k, label in names if k in model]
    if "min_clients" in model and "max_clients" in model:
        shown.append(f"{model['min_clients']}-{model['max_clients']} clients")
    return ", ".join(shown)


#: A command-line option in the page's sentences (``--assignors``).
_OPTION = re.compile(r"(?<![\w-])--[a-z][a-z-]*")


def _options_as_code(text: str) -> Any:
    """``text`` escaped, each command-line option in it as ``<code class="opt">``, which the
    page keeps on one line: a browser broke ``--assignors`` at its hyphens on a narrow
    screen (``--`` / ``assignors``); the value after it still wraps."""
    from markupsafe import Markup, escape

    escaped = str(escape(text))  # the pattern matches no escaped character
    return Markup(_OPTION.sub(lambda m: f'<code class="opt">{m.group(0)}</code>', escaped))


def _template() -> Any:
    """The page's Jinja2 template, autoescaping everything not marked safe (the ``options``
    filter escapes, then marks options up)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["options"] = _options_as_code
    return env.get_template(_TEMPLATE)


def render_report(data: Mapping[str, Any], out_dir: str | Path) -> Path:
    """Write the CSV summaries and ``report.html`` into ``out_dir``; return the HTML path."""
    import plotly.offline
    from markupsafe import Markup

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    columns: Mapping[str, Sequence[str]] = data["columns"]
    for name, key in CSV_FILES.items():
        write_csv(out / name, data[key], columns[key])

    manifest: Mapping[str, Any] = data.get("manifest", {})
    notes = _report_notes(data, manifest)
    rate = _restore_rate(manifest)
    found = outcomes(data)
    rec = recommend(found, rate)
    ha = ha_reasons(rec, data["by_event"], manifest.get("assignors"))
    rec = attrs.evolve(rec, reasons=(*rec.reasons, *ha))
    figures, figure_notes = _figures(data)
    page = _template().render(
        topology=manifest.get("topology", "?"),
        run_summary=_run_summary(manifest, max((o.rebalances for o in found), default=0)),
        churn=_churn(manifest.get("model", {})),
        rate=_number(rate),
        rec=rec,
        no_rebalances=NO_REBALANCES if not found else "",
        splitters=[(o, why) for o, kind, why in rec.ruled_out if kind == "splits"],
        failures=[(o, why) for o, kind, why in rec.ruled_out if kind == "fails"],
        colour=assignor_colour,
        answer_columns=_ANSWER_COLUMNS,
        answer_rows=_answer_rows(rec),
        has_ha=any(o.warmups for o in found),
        both_levels={o.level for o in found} >= {"task", "consumer"},
        figures=[(f, Markup(_figure_html(f))) for f in figures],
        figure_notes=figure_notes,
        detail_columns=_DETAIL,
        by_assignor=_detail_rows(data["by_assignor"], ("level",)),
        by_event=_detail_rows(data["by_event"], ("level", "event")),
        notes=notes,
        manifest=_run_details(manifest),
        model=_plain(manifest.get("model", {})),
        csv_files=list(CSV_FILES),
        plotlyjs=Markup(plotly.offline.get_plotlyjs()),
    )
    path = out / "report.html"
    path.write_text(page, encoding="utf-8")
    return path


def _report_notes(data: Mapping[str, Any], manifest: Mapping[str, Any]) -> list[str]:
    """The report's notes: the run's own, failed rebalances, approximate percentiles."""
    notes = [
        *manifest.get("notes", []),
        *(
            f"{err['assignor']}: {err['errors']} failed rebalance(s), e.g. {err['example']}"
            for err in data.get("errors", [])
        ),
    ]
    if data.get("exact_percentiles") is False:
        notes.append(
            "Percentiles (p50, p90, p99) are approximate: this run has more rows than the "
            "report computes exact ones for (percentile_approx: each value's rank within "
            "1/10,000 of the rows of the exact one)."
        )
    return notes
