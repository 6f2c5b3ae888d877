"""The HTML report: one self-contained page, readable offline, from a ``report.json``.

Sections, each a ``<section id=...>`` (``tests/test_browser.py`` renders them in Chromium):
the header (job, dates, chute version, status), ``output`` (the output as a whole and this
run), ``stopped`` (a partial run: why, and the command that resumes it), ``runs`` (every
run of the output), ``throughput`` (rows/s over time, cumulative rows), ``stages`` (busy
time per stage), ``failures`` (failed rows by model and exception type, sample messages,
the ``_errors/`` path), ``metrics`` (tables; sliced metrics as slice × metric) and
``plots`` (the metrics' curves). Plots are SVG drawn by :mod:`chute.svgplot`; the page
fits a 420 px phone as well as a 1,440 px screen.
"""

from __future__ import annotations

import html
import itertools
import time
from collections.abc import Iterable, Sequence
from typing import Any

from chute.report import model_notes
from chute.svgplot import svg

RATE_POINTS = 40
"""Intervals the rows/s plot divides a run into (fewer when a run has fewer samples)."""
HIDDEN_IN_SLICES = ("_error_bound", "skipped", "clipped")
"""Values a slice × metric table leaves out (they stay in report.json)."""
RUNS_PLOTTED = 8
"""The most recent runs drawn as their own series (earlier ones only shift the axes)."""

STYLE = """
* { box-sizing: border-box; }
body { font: 15px/1.5 system-ui, sans-serif; margin: 0 auto; padding: 1em;
  max-width: 1200px; color: #222; overflow-wrap: break-word; }
h1 { font-size: 1.5em; margin: .2em 0; }
h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
h3 { font-size: 1.05em; }
.meta { color: #555; margin: .2em 0; }
.status { display: inline-block; padding: 0 .5em; border-radius: 4px; font-weight: 600; }
.complete { background: #e3f4e1; color: #1e6b1a; } .partial { background: #fde8e6; color: #a11; }
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; margin: .5em 0; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.data td, table.data th { white-space: nowrap; }
table.data td.sample { white-space: pre-wrap; min-width: 16em; }
table.pairs th { white-space: nowrap; } table.pairs td { overflow-wrap: anywhere; }
@media (max-width: 600px) {
  body { font-size: 14px; padding: .6em; }
  svg.chart text { font-size: 19px; } svg.chart text.title { font-size: 22px; }
}
.plots { display: grid; grid-template-columns: repeat(auto-fit, minmax(min(100%, 420px), 1fr));
  gap: 12px; }
figure { margin: 0; border: 1px solid #eee; padding: 4px; min-width: 0; }
svg.chart { width: 100%; height: auto; display: block; }
figcaption, .note { color: #555; font-size: .9em; }
code { background: #f4f4f4; padding: 1px 4px; border-radius: 3px; }
.sample { font-family: ui-monospace, monospace; font-size: .85em; white-space: pre-wrap; }
"""


def render(report: dict[str, Any]) -> str:
    """The whole page."""
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>chute report {_e(report.get('fingerprint', ''))[:16]}</title>",
        f"<style>{STYLE}</style></head><body>",
        _header(report),
        _output(report),
        _stopped(report),
        _runs(report),
        _throughput(report),
        _stages(report),
        _failures(report),
        _metrics(report.get("metrics", {})),
        _plots(report.get("plots", [])),
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p)


def _e(value: Any) -> str:
    return html.escape(str(value))


def _when(seconds: Any) -> str:
    if not seconds:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(seconds)))


def _header(report: dict[str, Any]) -> str:
    job = report.get("job") or {}
    runs = report.get("runs") or []
    first = runs[0].get("started_at") if runs else report.get("started_at")
    last = runs[-1].get("ended_at") if runs else report.get("ended_at")
    complete = report.get("complete", True)
    status = (
        "<span class='status complete'>complete</span>"
        if complete
        else "<span class='status partial'>partial</span>"
    )
    models = ", ".join(job.get("models") or []) or "—"
    return (
        f"<header><h1>chute report {status}</h1>"
        f"<p class='meta'><b>input</b> {_e(job.get('input', '—'))} → <b>models</b> "
        f"{_e(models)} → <b>output</b> {_e(job.get('output') or report.get('output'))}</p>"
        f"<p class='meta'>{_e(_when(first))} – {_e(_when(last))} · {len(runs):,} run(s) · "
        f"chute {_e(report.get('chute_version') or '?')} · job "
        f"{_e(str(report.get('fingerprint', ''))[:16])}</p></header>"
    )


def _table(head: Sequence[str], rows: Iterable[Sequence[Any]], numeric: set[int]) -> str:
    """A table in a scrolling box: wide tables scroll inside it, never the page."""
    top = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join(
        "<tr>"
        + "".join(
            f"<td class='num'>{_e(v)}</td>" if i in numeric else f"<td>{_e(v)}</td>"
            for i, v in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<div class='scroll'><table class='data'><tr>{top}</tr>{body}</table></div>"


def _pairs(rows: Sequence[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    return f"<div class='scroll'><table class='pairs'>{body}</table></div>"


def _output(report: dict[str, Any]) -> str:
    totals = report.get("totals") or {}
    rows: list[tuple[str, Any]] = []
    if totals:
        rows += [
            ("units committed", f"{totals['units']:,} of {totals['units_total']:,}"),
            ("rows written", f"{totals['rows_out']:,}"),
            ("rows failed", f"{totals['rows_failed']:,}"),
        ]
    rows += [
        ("output", report.get("output") or "(in memory)"),
        ("engine", f"{report.get('engine')} ({report.get('engine_reason', '')})"),
        (
            "this run",
            f"{report.get('units_done', 0):,} units run, {report.get('units_skipped', 0):,} "
            f"already done; rows in / out {report.get('rows_in', 0):,} / "
            f"{report.get('rows_out', 0):,}, {report.get('rows_failed', 0):,} failed",
        ),
        ("wall time", f"{report.get('wall_seconds', 0):,.2f} s"),
        ("throughput", f"{report.get('rows_per_second', 0):,.0f} rows/s"),
    ]
    rows += [("skipped input", f"{b['unit']}: {b['error']}") for b in report.get("units_bad", [])]
    rows += [("events", event) for event in report.get("events", [])]
    rows += [(f"model {name}", note) for name, note in model_notes(report)]
    return f"<section id='output'><h2>Output</h2>{_pairs(rows)}</section>"


def _stopped(report: dict[str, Any]) -> str:
    if report.get("complete", True):
        return ""
    resume = report.get("resume") or "run the same job again: committed units are kept"
    return (
        "<section id='stopped'><h2>Stopped before the end</h2>"
        f"<p><b>Why:</b> {_e(report.get('stopped') or 'interrupted')}</p>"
        f"<p><b>To resume:</b> <code>{_e(resume)}</code> — the "
        f"{(report.get('totals') or {}).get('units', report.get('units_done', 0)):,} committed "
        "units are kept, the rest are run.</p></section>"
    )


def _runs(report: dict[str, Any]) -> str:
    runs = report.get("runs") or []
    if not runs:
        return ""
    rows = [
        (
            i + 1,
            _when(r.get("started_at")),
            _when(r.get("ended_at")),
            r.get("engine", ""),
            f"{r.get('units_run', 0):,}",
            f"{r.get('rows', 0):,}",
            f"{r.get('rows_failed', 0):,}",
            f"{r.get('wall_seconds', 0):,.2f} s",
            f"{_rate(r):,.0f}",
            r.get("stopped", ""),
        )
        for i, r in enumerate(runs)
    ]
    head = ["run", "started", "ended", "engine", "units", "rows", "failed", "wall", "rows/s"]
    table = _table([*head, "stopped"], rows, {0, 4, 5, 6, 7, 8})
    return f"<section id='runs'><h2>Runs</h2>{table}</section>"


def _rate(run: dict[str, Any]) -> float:
    wall = float(run.get("wall_seconds") or 0)
    return int(run.get("rows") or 0) / wall if wall > 0 else 0.0


def rates(timeline: Sequence[Sequence[float]], points: int = RATE_POINTS) -> list[list[float]]:
    """(seconds, rows/s) over equal intervals of a run, from its (seconds, rows) samples:
    the rows written in each interval over its length, at the interval's middle."""
    samples = [(float(t), float(r)) for t, r in timeline]
    if len(samples) < 2 or samples[-1][0] <= samples[0][0]:
        return []
    start, end = samples[0][0], samples[-1][0]
    count = max(1, min(points, len(samples) - 1))
    width = (end - start) / count
    edges = [start + i * width for i in range(count + 1)]
    rows = [_rows_at(samples, t) for t in edges]
    return [
        [round((a + b) / 2, 3), (rows[i + 1] - rows[i]) / width]
        for i, (a, b) in enumerate(itertools.pairwise(edges))
    ]


def _rows_at(samples: Sequence[tuple[float, float]], when: float) -> float:
    """Rows written by ``when``, linear between samples."""
    previous = samples[0]
    for sample in samples:
        if sample[0] >= when:
            span = sample[0] - previous[0]
            if span <= 0:
                return sample[1]
            return previous[1] + (sample[1] - previous[1]) * (when - previous[0]) / span
        previous = sample
    return samples[-1][1]


def _throughput(report: dict[str, Any]) -> str:
    runs = [r for r in report.get("runs") or [] if len(r.get("timeline") or []) > 1]
    if not runs and len(report.get("timeline") or []) > 1:
        runs = [{"timeline": report["timeline"], "rows": report.get("rows_in", 0)}]
    if not runs:
        return (
            "<section id='throughput'><h2>Throughput</h2>"
            "<p class='note'>No rows were written, so there is no rate to show.</p></section>"
        )
    offset_t, offset_rows = 0.0, 0.0
    rate_series, total_series = [], []
    shown = runs[-RUNS_PLOTTED:]
    for run in runs[: -len(shown)]:
        offset_t += float(run["timeline"][-1][0])
        offset_rows += float(run["timeline"][-1][1])
    first = len(runs) - len(shown) + 1
    for number, run in enumerate(shown, start=first):
        label = f"run {number}" if len(runs) > 1 else "rows/s"
        points = rates(run["timeline"])
        rate_series.append(
            {"label": label, "x": [offset_t + p[0] for p in points], "y": [p[1] for p in points]}
        )
        total_series.append(
            {
                "label": label if len(runs) > 1 else "rows",
                "x": [offset_t + float(t) for t, _ in run["timeline"]],
                "y": [offset_rows + float(r) for _, r in run["timeline"]],
            }
        )
        offset_t += float(run["timeline"][-1][0])
        offset_rows += float(run["timeline"][-1][1])
    xlabel = "seconds of run time" + (" (time between runs left out)" if len(runs) > 1 else "")
    rate: dict[str, Any] = {"title": "rows/s over time", "kind": "line", "xlabel": xlabel}
    total: dict[str, Any] = {"title": "rows written, cumulative", "kind": "line", "xlabel": xlabel}
    rate.update(ylabel="rows/s", series=rate_series)
    total.update(ylabel="rows", series=total_series, legend="lower right")
    note = (
        f"<p class='note'>Rows/s over {RATE_POINTS} equal intervals of each run (rows written by "
        "the writers in the interval over its length).</p>"
    )
    return (
        "<section id='throughput'><h2>Throughput</h2>"
        f"<div class='plots'>{_figure(rate)}{_figure(total)}</div>{note}</section>"
    )


def _stages(report: dict[str, Any]) -> str:
    stages = report.get("stages") or {}
    if not stages:
        return ""
    names = list(stages)
    values = [float(s.get("busy_seconds", 0)) for s in stages.values()]
    spec = {
        "title": "busy time per stage",
        "kind": "bars",
        "xlabel": "busy seconds (summed over replicas / threads)",
        "ylabel": "stage",
        "labels": names,
        "values": values,
    }
    wall = float(report.get("wall_seconds") or 0)
    rows = [
        (
            name,
            f"{float(s.get('busy_seconds', 0)):,.2f} s",
            f"{int(s.get('batches', 0)):,}",
            f"{int(s.get('rows', 0)):,}",
        )
        for name, s in stages.items()
    ]
    note = (
        "<p class='note'>Busy time is summed over each stage's replicas or threads (the "
        "writer's over its writer threads), so a stage that runs on several at once can be "
        f"busy longer than the run's wall time ({wall:,.2f} s). This run only.</p>"
    )
    table = _table(["stage", "busy", "batches", "rows"], rows, {1, 2, 3})
    return (
        f"<section id='stages'><h2>Stages</h2><div class='plots'>{_figure(spec)}"
        f"<div>{table}{note}</div></div></section>"
    )


def _failures(report: dict[str, Any]) -> str:
    failures = report.get("failures") or {}
    total = int(failures.get("rows") or report.get("rows_failed") or 0)
    if not total:
        return ""
    rows = [
        (g["model"], g["error_type"], f"{g['rows']:,}", "\n".join(g.get("samples", [])))
        for g in failures.get("groups", [])
    ]
    table = _table(["model", "exception", "rows", "sample messages"], rows, {2}).replace(
        "<td>", "<td class='sample'>"
    )
    where = failures.get("path") or "_errors/"
    return (
        f"<section id='failures'><h2>Failures</h2><p>{total:,} rows failed and were written "
        f"with their error to the errors dataset <code>{_e(where)}</code> (columns "
        f"<code>model</code>, <code>error_type</code>, <code>error_message</code>); every "
        f"other row was predicted.</p>{table}</section>"
    )


def _metrics(metrics: dict[str, dict[str, dict[str, Any]]]) -> str:
    if not metrics:
        return ""
    out = ["<section id='metrics'><h2>Metrics</h2>"]
    for model, by_name in metrics.items():
        out.append(f"<h3>{_e(model)}</h3>")
        plain = [(n, v) for n, v in by_name.items() if "groups" not in v]
        rows = [
            (name if key == name else f"{name} · {key}", _fmt(value))
            for name, values in plain
            for key, value in _scalars(values)
        ]
        if rows:
            out.append(_table(["metric", "value"], rows, {1}))
        out += _sliced([(n, v) for n, v in by_name.items() if "groups" in v])
    out.append("</section>")
    return "".join(out)


def _slice_value(values: dict[str, Any], label: str, key: str) -> str:
    found = values["all"] if label == "all" else values["groups"].get(label, {})
    return _fmt(dict(_scalars(found)).get(key))


def _sliced(metrics: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """One slice × metric table per slicing column: a row per slice (``all`` first)."""
    by_column: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for name, values in metrics:
        by_column.setdefault(str(values.get("by")), []).append((name, values))
    out = []
    for column, group in by_column.items():
        slices = ["all", *sorted({s for _, v in group for s in v["groups"]})]
        kept: list[tuple[str, str, list[str]]] = []  # (metric, value, a cell per slice)
        for name, values in group:
            for key, _ in _scalars(values.get("all", {})):
                if key.endswith(HIDDEN_IN_SLICES):
                    continue
                cells = [_slice_value(values, label, key) for label in slices]
                if all(k != key or c != cells for _, k, c in kept):  # auc_roc and pr_auc: once
                    kept.append((name, key, cells))
        keys = [key for _, key, _ in kept]
        head = [column, *(k if keys.count(k) == 1 else f"{n} · {k}" for n, k, _ in kept)]
        rows = [[label, *(c[i] for _, _, c in kept)] for i, label in enumerate(slices)]
        out.append(f"<h4>by {_e(column)}</h4>")
        out.append(_table(head, rows, set(range(1, len(head)))))
    return out


def _scalars(values: dict[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    """Scalar entries of a (possibly nested) metric result."""
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


def _plots(specs: list[dict[str, Any]]) -> str:
    if not specs:
        return ""
    figures = "".join(_figure(spec) for spec in specs)
    return f"<section id='plots'><h2>Plots</h2><div class='plots'>{figures}</div></section>"


def _figure(spec: dict[str, Any]) -> str:
    caption = f"<figcaption>{_e(spec['note'])}</figcaption>" if spec.get("note") else ""
    return f"<figure data-title='{_e(spec.get('title', ''))}'>{svg(spec)}{caption}</figure>"
