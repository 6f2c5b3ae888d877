"""A self-contained HTML report: tables and inline SVG plots, readable offline.

The page is built from a report dictionary (``Report.to_dict()``): the summary, the
metrics per model, the throughput over the run (from ``timeline``), the busy time per
stage, and any plots listed under ``plots`` — each a small spec::

    {"title": "ROC — tip", "kind": "line", "xlabel": "false positive rate",
     "ylabel": "true positive rate", "series": [{"label": "auc 0.91", "x": [...], "y": [...]}],
     "diagonal": true}

``kind`` is ``line``, ``bars`` (``labels`` + ``values``) or ``hist`` (``edges`` and one
``counts`` list per series). matplotlib draws them (``pip install 'chute[report]'``).
"""

from __future__ import annotations

import html
import io
from collections.abc import Iterable
from typing import Any

from chute.report import memory_notes

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: .5em 0; }
td, th { border: 1px solid #ddd; padding: 3px 9px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.plots { display: flex; flex-wrap: wrap; gap: 12px; }
.plot { border: 1px solid #eee; padding: 4px; }
.bad { color: #b00; }
"""


def render(report: dict[str, Any]) -> str:
    """The whole page."""
    plots = [*_run_plots(report), *report.get("plots", [])]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>chute report {html.escape(str(report.get('fingerprint', '')))}</title>",
        f"<style>{STYLE}</style></head><body>",
        "<h1>chute report</h1>",
        _summary(report),
        "<h2>Plots</h2><div class='plots'>",
        *(f"<div class='plot'>{_svg(spec)}</div>" for spec in plots),
        "</div>",
        _metrics(report.get("metrics", {})),
        "</body></html>",
    ]
    return "\n".join(parts)


def _summary(report: dict[str, Any]) -> str:
    rows = [
        ("engine", f"{report.get('engine')} ({report.get('engine_reason', '')})"),
        ("output", report.get("output") or "(in memory)"),
        (
            "units",
            f"{report.get('units_done', 0)} run, {report.get('units_skipped', 0)} "
            f"already done, {report.get('units_total', 0)} in all",
        ),
        ("rows in / out", f"{report.get('rows_in', 0):,} / {report.get('rows_out', 0):,}"),
        ("rows failed", f"{report.get('rows_failed', 0):,}"),
        ("wall time", f"{report.get('wall_seconds', 0):.2f} s"),
        ("throughput", f"{report.get('rows_per_second', 0):,.0f} rows/s"),
        ("status", "complete" if report.get("complete", True) else "INCOMPLETE"),
    ]
    rows += [("skipped input", f"{b['unit']}: {b['error']}") for b in report.get("units_bad", [])]
    rows += [(f"model {name}", note) for name, note in memory_notes(report)]
    body = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows
    )
    return f"<h2>Summary</h2><table>{body}</table>"


def _metrics(metrics: dict[str, dict[str, dict[str, Any]]]) -> str:
    if not metrics:
        return ""
    out = ["<h2>Metrics</h2>"]
    for model, by_name in metrics.items():
        out.append(f"<h3>{html.escape(model)}</h3><table><tr><th>metric</th><th>value</th></tr>")
        for name, values in by_name.items():
            for key, value in _scalars(values):
                label = name if key == name else f"{name} · {key}"
                out.append(
                    f"<tr><td>{html.escape(label)}</td><td class='num'>"
                    f"{html.escape(_fmt(value))}</td></tr>"
                )
        out.append("</table>")
    return "".join(out)


def _scalars(values: dict[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    """Scalar entries of a (possibly nested, possibly sliced) metric result."""
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _scalars(value, f"{name} · ")
        elif value is None or isinstance(value, (int, float, str, bool)):
            yield name, value


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return "—" if value is None else str(value)


def _run_plots(report: dict[str, Any]) -> list[dict[str, Any]]:
    plots: list[dict[str, Any]] = []
    timeline = report.get("timeline") or []
    if len(timeline) > 1:
        seconds = [float(t) for t, _ in timeline]
        rows = [int(r) for _, r in timeline]
        plots.append(
            {
                "title": "rows committed over the run",
                "kind": "line",
                "xlabel": "seconds",
                "ylabel": "rows",
                "series": [{"label": "rows committed", "x": seconds, "y": rows}],
            }
        )
    stages = report.get("stages") or {}
    if stages:
        plots.append(
            {
                "title": "busy time per stage",
                "kind": "bars",
                "ylabel": "seconds",
                "labels": list(stages),
                "values": [float(s.get("busy_seconds", 0)) for s in stages.values()],
            }
        )
    return plots


def _svg(spec: dict[str, Any]) -> str:
    """One plot as inline SVG (a note instead, where matplotlib is not installed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return (
            f"<p>{html.escape(spec.get('title', ''))}: install matplotlib to draw the "
            "plots (pip install 'chute[report]').</p>"
        )
    figure, axes = plt.subplots(figsize=(5.2, 3.6))
    try:
        _draw(axes, spec)
        axes.set_title(spec.get("title", ""), fontsize=11)
        axes.set_xlabel(spec.get("xlabel", ""))
        axes.set_ylabel(spec.get("ylabel", ""))
        figure.tight_layout()
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg")
    finally:
        plt.close(figure)
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _draw(axes: Any, spec: dict[str, Any]) -> None:
    kind = spec.get("kind", "line")
    if kind == "bars":
        axes.barh(spec["labels"], spec["values"], color="#4c78a8")
        return
    for series in spec.get("series", []):
        if kind == "hist":
            edges = series.get("edges", spec.get("edges"))
            axes.stairs(series["counts"], edges, label=series.get("label"), fill=False)
        else:
            axes.plot(
                series["x"],
                series["y"],
                label=series.get("label"),
                marker="o" if len(series["x"]) < 30 else None,
                markersize=3,
            )
    if spec.get("diagonal"):
        axes.plot([0, 1], [0, 1], linestyle=":", color="grey")
    if any(s.get("label") for s in spec.get("series", [])):
        axes.legend(fontsize=8)
