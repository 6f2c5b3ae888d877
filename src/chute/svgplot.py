"""Plots as inline SVG, drawn by chute: no plotting library, text that stays text.

A plot is a small spec (a dict, as the report keeps it in ``report.json``)::

    {"title": "ROC — tip", "kind": "line", "xlabel": "false positive rate",
     "ylabel": "true positive rate", "series": [{"label": "AUC 0.91", "x": [...], "y": [...]}],
     "diagonal": true}

``kind`` is ``line``, ``bars`` (``labels`` and ``values``: horizontal bars, the values on
the x axis) or ``hist`` (``edges`` and one ``counts`` list per series, drawn as steps).

Why not matplotlib: measured on this project's machine, it adds about 95 MB to an install
(matplotlib 36 MB, fonttools 30 MB, pillow 22 MB, kiwisolver 6 MB, ...) and 0.42 s of import
plus 0.11 s for a first figure to every report, and its SVG draws text as paths (not
selectable, not searchable) at a fixed size. These plots are a few kB of SVG each, scale to
the page's width (``viewBox``) and keep every label as ``<text>``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import Any

WIDTH, HEIGHT = 640, 380
LEFT, RIGHT, TOP, BOTTOM = 84, 34, 34, 56
COLORS = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#eeca3b", "#9d755d")
MAX_POINTS = 400
"""Points drawn per series; longer series are thinned evenly (ends kept)."""


def svg(spec: dict[str, Any]) -> str:
    """One plot as an ``<svg>`` element that scales to its container's width."""
    kind = spec.get("kind", "line")
    if kind == "bars":
        return _bars(spec)
    series = _series(spec)
    if not any(len(xs) for xs, _, _ in series):
        return _frame(spec, "", [], [], note="no data")
    xs = [x for s, _, _ in series for x in s]
    ys = [y for _, s, _ in series for y in s]
    if spec.get("diagonal"):
        xs, ys = [*xs, 0.0, 1.0], [*ys, 0.0, 1.0]
    x_ticks, y_ticks = ticks(min(xs), max(xs)), ticks(min(0.0, *ys), max(ys))
    scale = _Scale(x_ticks, y_ticks)
    body = []
    if spec.get("diagonal"):
        body.append(
            f"<line class='diagonal' x1='{scale.x(0):.1f}' y1='{scale.y(0):.1f}' "
            f"x2='{scale.x(1):.1f}' y2='{scale.y(1):.1f}' stroke='#999' stroke-dasharray='3 3'/>"
        )
    for i, (sx, sy, _) in enumerate(series):
        points = " ".join(f"{scale.x(x):.1f},{scale.y(y):.1f}" for x, y in _thin(sx, sy))
        body.append(
            f"<polyline class='series' points='{points}' fill='none' "
            f"stroke='{COLORS[i % len(COLORS)]}' stroke-width='1.8'/>"
        )
    labels = [label for _, _, label in series]
    return _frame(spec, "".join(body), x_ticks, y_ticks, scale=scale, legend=labels)


def ticks(low: float, high: float, most: int = 6) -> list[float]:
    """Round tick values covering ``[low, high]``: 1, 2 or 5 times a power of ten apart."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return [0.0, 1.0]
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / max(1, most - 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    start = math.floor(low / step + 1e-9) * step
    count = math.ceil((high - start) / step - 1e-9)
    return [round(start + i * step, 12) for i in range(count + 1)]


class _Scale:
    """Data coordinates to SVG coordinates, over the ticks' range."""

    def __init__(self, x_ticks: Sequence[float], y_ticks: Sequence[float]) -> None:
        self.x0, self.x1 = x_ticks[0], x_ticks[-1]
        self.y0, self.y1 = y_ticks[0], y_ticks[-1]

    def x(self, value: float) -> float:
        return LEFT + (value - self.x0) / (self.x1 - self.x0) * (WIDTH - LEFT - RIGHT)

    def y(self, value: float) -> float:
        return HEIGHT - BOTTOM - (value - self.y0) / (self.y1 - self.y0) * (HEIGHT - TOP - BOTTOM)


def _series(spec: dict[str, Any]) -> list[tuple[list[float], list[float], str]]:
    """(x, y, label) per series; a histogram becomes its step outline."""
    out = []
    for item in spec.get("series", []):
        label = str(item.get("label") or "")
        if spec.get("kind") == "hist":
            edges = [float(e) for e in item.get("edges", spec.get("edges", []))]
            counts = [float(c) for c in item["counts"]]
            xs = [edges[0], *(e for edge in edges[1:-1] for e in (edge, edge)), edges[-1]]
            ys = [c for count in counts for c in (count, count)]
            out.append((xs, ys, label))
        else:
            pairs = [
                (float(x), float(y))
                for x, y in zip(item["x"], item["y"], strict=True)
                if x is not None and y is not None and math.isfinite(x) and math.isfinite(y)
            ]
            out.append(([x for x, _ in pairs], [y for _, y in pairs], label))
    return out


def _thin(xs: list[float], ys: list[float]) -> list[tuple[float, float]]:
    if len(xs) <= MAX_POINTS:
        return list(zip(xs, ys, strict=True))
    step = (len(xs) - 1) / (MAX_POINTS - 1)
    return [(xs[round(i * step)], ys[round(i * step)]) for i in range(MAX_POINTS)]


def _bars(spec: dict[str, Any]) -> str:
    """Horizontal bars: one per label, the values along the x axis."""
    labels, values = [str(v) for v in spec.get("labels", [])], spec.get("values", [])
    if not labels:
        return _frame(spec, "", [], [], note="no data")
    x_ticks = ticks(0.0, max([float(v) for v in values] + [0.0]))
    scale = _Scale(x_ticks, [0.0, 1.0])
    band = (HEIGHT - TOP - BOTTOM) / len(labels)
    body = []
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        top = TOP + i * band + band * 0.15
        width = scale.x(float(value)) - LEFT
        body.append(
            f"<rect class='bar' x='{LEFT}' y='{top:.1f}' width='{max(width, 0.5):.1f}' "
            f"height='{band * 0.7:.1f}' fill='{COLORS[0]}'><title>{escape(label)}: "
            f"{float(value):,.3g}</title></rect>"
            f"<text class='category' x='{LEFT - 6}' y='{top + band * 0.35:.1f}' "
            f"text-anchor='end' dominant-baseline='middle'>{escape(_short(label))}</text>"
        )
    return _frame(spec, "".join(body), x_ticks, [], scale=scale)


def _short(label: str, most: int = 11) -> str:
    return label if len(label) <= most else label[: most - 1] + "…"


def _frame(
    spec: dict[str, Any],
    body: str,
    x_ticks: Sequence[float],
    y_ticks: Sequence[float],
    *,
    scale: _Scale | None = None,
    legend: Sequence[str] = (),
    note: str = "",
) -> str:
    """Axes, ticks, labels, title and legend around ``body``."""
    title = escape(str(spec.get("title", "")))
    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 {WIDTH} {HEIGHT}' "
        f"role='img' aria-label='{title}' class='chart' font-family='system-ui, sans-serif' "
        f"font-size='13'><title>{title}</title>",
        f"<text class='title' x='{WIDTH / 2}' y='20' text-anchor='middle' font-size='15' "
        f"font-weight='600'>{title}</text>",
    ]
    if scale is not None:
        parts += _axes(scale, x_ticks, y_ticks)
    parts.append(body)
    parts.append(
        f"<text class='xlabel' x='{(LEFT + WIDTH - RIGHT) / 2}' y='{HEIGHT - 12}' "
        f"text-anchor='middle'>{escape(str(spec.get('xlabel', '')))}</text>"
    )
    mid = (TOP + HEIGHT - BOTTOM) / 2
    parts.append(
        f"<text class='ylabel' x='16' y='{mid}' text-anchor='middle' "
        f"transform='rotate(-90 16 {mid})'>{escape(str(spec.get('ylabel', '')))}</text>"
    )
    parts += _legend(legend, str(spec.get("legend", "upper right")))
    if note:
        parts.append(
            f"<text class='note' x='{WIDTH / 2}' y='{HEIGHT / 2}' text-anchor='middle' "
            f"fill='#777'>{escape(note)}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _axes(scale: _Scale, x_ticks: Sequence[float], y_ticks: Sequence[float]) -> list[str]:
    bottom, right = HEIGHT - BOTTOM, WIDTH - RIGHT
    parts = [
        f"<line x1='{LEFT}' y1='{bottom}' x2='{right}' y2='{bottom}' stroke='#444'/>",
        f"<line x1='{LEFT}' y1='{TOP}' x2='{LEFT}' y2='{bottom}' stroke='#444'/>",
    ]
    for value in x_ticks:
        x = scale.x(value)
        parts.append(
            f"<line x1='{x:.1f}' y1='{TOP}' x2='{x:.1f}' y2='{bottom}' stroke='#eee'/>"
            f"<text class='xtick' x='{x:.1f}' y='{bottom + 17}' text-anchor='middle' "
            f"font-size='12'>{_number(value, x_ticks)}</text>"
        )
    for value in y_ticks:
        y = scale.y(value)
        parts.append(
            f"<line x1='{LEFT}' y1='{y:.1f}' x2='{right}' y2='{y:.1f}' stroke='#eee'/>"
            f"<text class='ytick' x='{LEFT - 6}' y='{y:.1f}' text-anchor='end' "
            f"dominant-baseline='middle' font-size='12'>{_number(value, y_ticks)}</text>"
        )
    return parts


def _number(value: float, ticks: Sequence[float]) -> str:
    """A tick label with as many decimals as the step needs, thousands as k and M."""
    if value == 0:
        return "0"
    step = abs(ticks[1] - ticks[0]) if len(ticks) > 1 else 1.0
    for scale, suffix, above in ((1e6, "M", 1e6), (1e3, "k", 1e4)):
        if max(abs(t) for t in ticks) >= above and step >= scale / 10:
            return _decimals(value / scale, step / scale) + suffix
    return _decimals(value, step)


def _decimals(value: float, step: float) -> str:
    places = max(0, -math.floor(math.log10(step) + 1e-9)) if step > 0 else 0
    if abs(step * 10**places - round(step * 10**places)) > 1e-6:  # 2.5, 0.25
        places += 1
    return f"{value:,.{places}f}"


def _legend(labels: Sequence[str], where: str) -> list[str]:
    """Series names in a corner of the plot (``upper right``, ``lower right``, ...)."""
    if not any(labels):
        return []
    parts = []
    first = HEIGHT - BOTTOM - 10 - 17 * (len(labels) - 1) if "lower" in where else TOP + 8
    x = LEFT + 10 if "left" in where else WIDTH - RIGHT - 170
    for i, label in enumerate(labels):
        y = first + i * 17
        parts.append(
            f"<rect x='{x}' y='{y - 5}' width='12' height='4' fill='{COLORS[i % len(COLORS)]}'/>"
            f"<text class='legend' x='{x + 17}' y='{y}' dominant-baseline='middle' "
            f"font-size='12'>{escape(_short(label, 24))}</text>"
        )
    return parts
