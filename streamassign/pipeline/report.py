"""The simulation report: CSV summaries and one self-contained HTML page with plots.

Input is what ``spark.aggregate`` collects (plain dicts and lists: small, already aggregated), so
rendering needs neither Spark nor the rows. Plots use matplotlib's object API on the Agg canvas
(no pyplot, no global backend switch) and are embedded in the page as base64 PNGs: the HTML file
can be mailed or attached to a ticket on its own.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from .scenarios import EVENTS

__all__ = ["CSV_FILES", "render_report"]

#: The CSV files written next to the HTML page, and which aggregate each holds.
CSV_FILES: Final = {
    "summary_by_assignor.csv": "by_assignor",
    "summary_by_event.csv": "by_event",
    "by_step.csv": "by_step",
}

#: Columns of the HTML summary tables: (column, header, format).
_TABLE: Final = (
    ("rebalances", "rebalances", "{:.0f}"),
    ("balanced_share", "balanced", "{:.1%}"),
    ("optimal_moves_share", "moves = bound", "{:.1%}"),
    ("moves_mean", "moves (mean)", "{:.2f}"),
    ("excess_moves_mean", "excess moves (mean)", "{:.2f}"),
    ("active_imbalance_mean", "active imbalance", "{:.2f}"),
    ("load_imbalance_mean", "load imbalance", "{:.2f}"),
    ("standby_coverage_mean", "standby coverage", "{:.1%}"),
    ("warm_share", "warm takeovers", "{:.1%}"),
    ("records_to_restore_p50", "restore p50", "{:,.0f}"),
    ("records_to_restore_p99", "restore p99", "{:,.0f}"),
    ("split_tasks_mean", "split tasks", "{:.2f}"),
    ("assign_ms_p99", "assign p99 ms", "{:.2f}"),
)


def _fmt(value: Any, pattern: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return pattern.format(value)


def _warm_share(row: Mapping[str, Any]) -> float | None:
    total = (row.get("warm_takeovers") or 0) + (row.get("cold_takeovers") or 0)
    return None if not total else (row.get("warm_takeovers") or 0) / total


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> None:
    """``rows`` as CSV with a header, in ``columns`` order (None written as empty)."""
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(columns)
        for row in rows:
            writer.writerow(["" if row.get(c) is None else row.get(c) for c in columns])


# -- plots -----------------------------------------------------------------------------------------


def _png(fig: Any) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _figure(panels: int, height: float = 3.6) -> tuple[Any, list[Any]]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.2 * panels, height))
    axes = [fig.add_subplot(1, panels, i + 1) for i in range(panels)]
    return fig, axes


def _levels(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    return [lvl for lvl in ("task", "consumer") if any(r["level"] == lvl for r in rows)]


def _assignors(rows: Sequence[Mapping[str, Any]], level: str | None = None) -> list[str]:
    return sorted({r["assignor"] for r in rows if level is None or r["level"] == level})


def _events(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    seen = {r["event"] for r in rows}
    return [e for e in EVENTS if e in seen and e != "initial"]


def _grouped_bars(
    ax: Any,
    rows: Sequence[Mapping[str, Any]],
    assignors: Sequence[str],
    events: Sequence[str],
    value: Any,
    marker: Any = None,
) -> None:
    """Bars per event (x) and assignor (colour); ``marker`` draws a dash on each bar."""
    width = 0.8 / max(1, len(assignors))
    index = {(r["assignor"], r["event"]): r for r in rows}
    for k, name in enumerate(assignors):
        xs, ys, ms = [], [], []
        for i, event in enumerate(events):
            row = index.get((name, event))
            if row is None:
                continue
            xs.append(i - 0.4 + width * (k + 0.5))
            ys.append(value(row) or 0.0)
            ms.append(None if marker is None else marker(row))
        ax.bar(xs, ys, width=width * 0.95, label=name)
        for x, m in zip(xs, ms, strict=True):
            if m is not None:
                ax.hlines(m, x - width / 2, x + width / 2, colors="black", linewidth=2)
    ax.set_xticks(range(len(events)))
    ax.set_xticklabels([e.replace("_", " ") for e in events], rotation=30, ha="right")


def plot_moves_vs_bound(by_event: Sequence[Mapping[str, Any]]) -> str:
    """Mean moves per event and assignor; black dashes: the mean lower bound."""
    levels = _levels(by_event)
    fig, axes = _figure(len(levels) or 1)
    for ax, level in zip(axes, levels, strict=False):
        rows = [r for r in by_event if r["level"] == level]
        _grouped_bars(
            ax,
            rows,
            _assignors(rows),
            _events(rows),
            lambda r: r["moves_mean"],
            lambda r: r["bound_total"] / r["rebalances"] if r["rebalances"] else None,
        )
        unit = "tasks" if level == "task" else "partitions"
        ax.set_title(f"{level} level: mean moves ({unit}), dash = bound")
        ax.set_ylabel(f"mean moves ({unit})")
        ax.legend(fontsize=7)
    return _png(fig)


def plot_imbalance(by_step: Sequence[Mapping[str, Any]]) -> str:
    """Mean active imbalance (per thread, max - min) by rebalance number."""
    levels = _levels(by_step)
    fig, axes = _figure(len(levels) or 1)
    for ax, level in zip(axes, levels, strict=False):
        for name in _assignors(by_step, level):
            pts = sorted(
                (r["step"], r["active_imbalance_mean"])
                for r in by_step
                if r["assignor"] == name and r["level"] == level
            )
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name, linewidth=1.4)
        unit = "tasks per thread" if level == "task" else "partitions per consumer"
        ax.set_title(f"{level} level: active imbalance over time")
        ax.set_xlabel("rebalance (step)")
        ax.set_ylabel(f"mean max - min ({unit})")
        ax.legend(fontsize=7)
    return _png(fig)


def plot_restore(by_event: Sequence[Mapping[str, Any]]) -> str:
    """Records to restore per rebalance: p50 bars with p99 dashes, per event and assignor."""
    fig, axes = _figure(1, 4.0)
    ax = axes[0]
    _grouped_bars(
        ax,
        by_event,
        _assignors(by_event),
        _events(by_event),
        lambda r: r["records_to_restore_p50"],
        lambda r: r["records_to_restore_p99"],
    )
    ax.set_yscale("symlog", linthresh=1000)
    ax.set_title("records to restore per rebalance: bars p50, dashes p99")
    ax.set_ylabel("changelog records")
    ax.legend(fontsize=7, ncol=2)
    return _png(fig)


def plot_coverage(by_step: Sequence[Mapping[str, Any]]) -> str:
    """Standby coverage (placed / required) by rebalance number: mean and minimum."""
    fig, axes = _figure(1)
    ax = axes[0]
    for name in _assignors(by_step, "task"):
        pts = sorted(
            (r["step"], r["standby_coverage_mean"], r["standby_coverage_min"])
            for r in by_step
            if r["assignor"] == name and r["level"] == "task"
        )
        line = ax.plot([p[0] for p in pts], [p[1] for p in pts], label=f"{name} (mean)")
        ax.plot(
            [p[0] for p in pts],
            [p[2] for p in pts],
            linestyle="--",
            color=line[0].get_color(),
            linewidth=0.8,
            label=f"{name} (min)",
        )
    ax.set_ylim(0, 1.05)
    ax.set_title("standby coverage over time (task assignors)")
    ax.set_xlabel("rebalance (step)")
    ax.set_ylabel("standbys placed / required")
    ax.legend(fontsize=7)
    return _png(fig)


def plot_assign_time(by_assignor: Sequence[Mapping[str, Any]]) -> str:
    """Assignment wall time per assignor: p50 and p99."""
    fig, axes = _figure(1)
    ax = axes[0]
    names = [r["assignor"] for r in by_assignor]
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [r["assign_ms_p50"] or 0 for r in by_assignor], 0.4, label="p50")
    ax.bar([x + 0.2 for x in xs], [r["assign_ms_p99"] or 0 for r in by_assignor], 0.4, label="p99")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(names, rotation=30, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("milliseconds")
    ax.set_title("assignment time per rebalance")
    ax.legend(fontsize=7)
    return _png(fig)


# -- HTML ------------------------------------------------------------------------------------------

_STYLE: Final = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1300px; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: right; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
img { max-width: 100%; display: block; margin: 1em 0; }
.note { background: #fff8e1; padding: 0.5em 1em; border-left: 4px solid #f0b400; }
code { background: #f4f4f4; padding: 1px 4px; }
"""


def _table(rows: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> str:
    head = "".join(f'<th class="l">{k}</th>' for k in keys) + "".join(
        f"<th>{html.escape(h)}</th>" for _, h, _ in _TABLE
    )
    body = []
    for row in rows:
        full = {**row, "warm_share": _warm_share(row)}
        cells = "".join(f'<td class="l">{html.escape(str(full[k]))}</td>' for k in keys)
        cells += "".join(f"<td>{_fmt(full.get(c), f)}</td>" for c, _, f in _TABLE)
        body.append(f"<tr>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _manifest_html(manifest: Mapping[str, Any]) -> str:
    if not manifest:
        return "<p>No manifest found.</p>"
    items = []
    for key in (
        "topology",
        "topology_file",
        "scenarios",
        "seed",
        "assignors",
        "standby_replicas",
        "acceptable_recovery_lag",
        "rows",
        "master",
        "elapsed_s",
        "streamassign",
    ):
        if key in manifest:
            items.append(
                f"<tr><th class='l'>{key}</th><td class='l'>"
                f"{html.escape(str(manifest[key]))}</td></tr>"
            )
    model = manifest.get("model", {})
    params = ", ".join(f"{k}={v}" for k, v in model.items())
    items.append(
        f"<tr><th class='l'>scenario model</th><td class='l'>{html.escape(params)}</td></tr>"
    )
    return f"<table>{''.join(items)}</table>"


def render_report(data: Mapping[str, Any], out_dir: str | Path) -> Path:
    """Write the CSV summaries and ``report.html`` into ``out_dir``; return the HTML path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    columns: Mapping[str, Sequence[str]] = data["columns"]
    for name, key in CSV_FILES.items():
        write_csv(out / name, data[key], columns[key])

    manifest: Mapping[str, Any] = data.get("manifest", {})
    by_event, by_assignor, by_step = data["by_event"], data["by_assignor"], data["by_step"]
    notes = list(manifest.get("notes", []))
    for err in data.get("errors", []):
        notes.append(
            f"{err['assignor']}: {err['errors']} failed rebalance(s), e.g. {err['example']}"
        )
    plots = [
        (
            "Moves against their lower bound",
            plot_moves_vs_bound(by_event),
            "A move is a unit whose previous owner is still in the group but lost it; the bound is "
            "the least any balanced assignment needs (DESIGN §3.3).",
        ),
        (
            "Imbalance over time",
            plot_imbalance(by_step),
            "Max minus min active units per thread (task level) or per consumer (consumer level).",
        ),
        (
            "Restore cost",
            plot_restore(by_event),
            "Changelog records the new owners must restore before their tasks run again.",
        ),
    ]
    if any(r["level"] == "task" for r in by_step):
        plots.append(
            (
                "Standby coverage",
                plot_coverage(by_step),
                "Standbys placed over min(standbys, clients - 1) per stateful task.",
            )
        )
    plots.append(("Assignment time", plot_assign_time(by_assignor), ""))
    title = f"streamassign simulation: {manifest.get('topology', '')}"
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
        _manifest_html(manifest),
    ]
    if notes:
        parts.append("<div class='note'>" + "<br>".join(html.escape(n) for n in notes) + "</div>")
    parts += [
        "<h2>Per assignor (all rebalances after the initial one)</h2>",
        _table(by_assignor, ("level", "assignor")),
    ]
    for heading, png, caption in plots:
        parts.append(f"<h2>{html.escape(heading)}</h2><p>{html.escape(caption)}</p>")
        parts.append(f"<img alt='{html.escape(heading)}' src='data:image/png;base64,{png}'>")
    parts += [
        "<h2>Per assignor and event</h2>",
        _table(by_event, ("level", "assignor", "event")),
        "<p>CSV: " + ", ".join(f"<a href='{n}'>{n}</a>" for n in CSV_FILES) + ". Columns and "
        "models: docs/pipeline.md.</p></body></html>",
    ]
    page = out / "report.html"
    page.write_text("\n".join(parts), encoding="utf-8")
    return page
