"""Metrics in the same pass: which metrics a job computes, and how their states travel.

Writers compute a state per part from the rows they write (rows a model failed on are
left out); the driver merges part states into a state per unit, keeps it in the ledger
with the unit, and merges units into the job's totals — so a resumed job reports exactly
what an uninterrupted one would. Each metric is reported under the model whose output it
scores (``tip_score`` → ``tip``), or under ``dataset`` when it reads no model output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from chute.errors import ChuteError, ConfigError
from chute.metrics import (
    Calibration,
    Histogram,
    Metric,
    ScoreSketch,
    Sliced,
    State,
    dumps,
    loads,
    state_from_text,
    state_to_text,
)

DATASET = "dataset"
"""Where metrics over input columns only are reported."""
MAX_SLICES_PLOTTED = 8
"""Slices whose curves are overlaid on a sliced metric's plots (the largest by rows)."""


@dataclass(frozen=True)
class Evaluation:
    """The job's metrics by key (``"<owner>/<name>"``); small and picklable."""

    metrics: Mapping[str, Metric]

    @classmethod
    def of(
        cls, metrics: Sequence[Metric], models: Sequence[str], inputs: Sequence[str] = ()
    ) -> Evaluation:
        keyed: dict[str, Metric] = {}
        for metric in metrics:
            key = f"{owner(metric, models, inputs)}/{metric.name}"
            if key in keyed:
                raise ConfigError(
                    f"two metrics are reported as {key!r}: give one of them another name."
                )
            keyed[key] = metric
        return cls(keyed)

    def __bool__(self) -> bool:
        return bool(self.metrics)

    def columns(self) -> set[str]:
        return {c for m in self.metrics.values() for c in m.columns()}

    def measure(self, table: pa.Table) -> bytes:
        """The serialized states of ``table``'s rows (a part), for its record."""
        if not self.metrics:
            return b""
        if table.num_rows == 0:  # every row failed (quarantined): a model's outputs may be
            return dumps({})  # missing altogether, and there is nothing to measure
        states = {
            key: _guarded(key, "measuring a batch", _measured, metric, table)
            for key, metric in self.metrics.items()
        }
        try:
            return dumps(states)
        except TypeError as exc:
            raise _unkeepable(states) from exc

    def merge(self, total: dict[str, State], blobs: Iterable[bytes | dict[str, State]]) -> None:
        """Merge part or unit states into ``total``, in place."""
        for blob in blobs:
            states = loads(blob) if isinstance(blob, bytes) else blob
            for key, state in states.items():
                metric = self.metrics.get(key)
                if metric is None:
                    continue
                if key in total:
                    state = _guarded(key, "merging states", metric.merge, total[key], state)
                total[key] = state

    def results(self, total: Mapping[str, State]) -> dict[str, dict[str, Any]]:
        """Metric values by owner, then by metric name. A metric whose ``result`` raises
        is reported as ``{"error": ...}``: the results come after every unit is committed,
        and one metric's failure must not keep the output from being finished."""
        out: dict[str, dict[str, Any]] = {}
        for key, metric in self.metrics.items():
            owner_name, name = key.split("/", 1)
            out.setdefault(owner_name, {})[name] = _result(key, metric, total)
        return out

    def plots(self, total: Mapping[str, State]) -> list[dict[str, Any]]:
        """Plot specs for the HTML report (see :mod:`chute.htmlreport`)."""
        specs: list[dict[str, Any]] = []
        drawn: set[tuple[str, ...]] = set()
        for key, metric in self.metrics.items():
            state = total.get(key)
            what = (type(_inner(metric)).__name__, *metric.columns())
            if isinstance(_inner(metric), ScoreSketch):
                what = ("score", *metric.columns())  # auc_roc and pr_auc: the same curves
            if state is not None and what not in drawn:
                drawn.add(what)
                try:
                    specs += _plots(key, metric, state)
                except Exception:  # its result is reported as an error (results())
                    continue
        return specs


def owner(metric: Metric, models: Sequence[str], inputs: Sequence[str] = ()) -> str:
    """The model whose output the metric reads, else :data:`DATASET`. An input column
    named like a model's output (``tip_amount`` beside model ``tip``) is not one; of two
    models whose names both prefix the column (``tip`` and ``tip_v2`` for
    ``tip_v2_score``), the longer name's (the other's would be ``tip_score``)."""
    for column in (c for c in metric.columns() if c not in inputs):
        makers = [m for m in models if column == m or column.startswith(m + "_")]
        if makers:
            return max(makers, key=len)
    return DATASET


def to_text(states: Mapping[str, State]) -> str:
    return state_to_text(dict(states)) if states else ""


def from_text(text: str) -> dict[str, State]:
    return state_from_text(text) if text else {}


def _measured(metric: Metric, table: pa.Table) -> State:
    return metric.update(metric.init(), table)


def _guarded(key: str, doing: str, call: Callable[..., State], *args: Any) -> State:
    """``call(*args)``, with what a metric raises besides chute's own errors (a custom metric's
    code: a KeyError, a TypeError) said to be that metric's, and how to fix it."""
    try:
        return call(*args)
    except ChuteError:
        raise
    except Exception as exc:
        raise ChuteError(
            f"metric {key!r} raised {type(exc).__name__} while {doing}: {exc}. Fix the "
            "metric's code or its options in the job. A metric sees the columns its "
            "columns() names (or its spec's columns:), every column when it names none."
        ) from exc


def _unkeepable(states: Mapping[str, State]) -> ChuteError:
    """The error for a state ``dumps`` cannot write, naming the metric that made it."""
    for key, state in states.items():
        try:
            dumps({key: state})
        except TypeError as exc:
            return ChuteError(
                f"metric {key!r} returned a state chute cannot keep in the ledger: {exc}. "
                "A state is a dict of numbers, strings, NumPy arrays of numbers and dicts of "
                "those: keep a list of numbers as a NumPy array."
            )
    return ChuteError("a metric returned a state chute cannot keep in the ledger.")


def _result(key: str, metric: Metric, total: Mapping[str, State]) -> dict[str, Any]:
    try:
        return dict(_jsonable(metric.result(total.get(key, metric.init()))))
    except Exception as exc:  # a custom metric may raise anything
        return {
            "error": f"metric {key!r} failed to compute its result: {type(exc).__name__}: {exc}"
        }


def _inner(metric: Metric) -> Metric:
    return metric.metric if isinstance(metric, Sliced) else metric


def _plots(key: str, metric: Metric, state: State) -> list[dict[str, Any]]:
    if isinstance(metric, Sliced):
        inner = metric.metric
        return _sliced_plots(key, metric, inner, state) if isinstance(inner, ScoreSketch) else []
    if isinstance(metric, ScoreSketch):
        return _sketch_plots(key, metric, state)
    if isinstance(metric, Calibration):
        bins = [b for b in metric.result(state)["bins"] if b.get("count")]
        return [
            {
                "title": f"calibration — {key}",
                "kind": "line",
                "diagonal": True,
                "xlabel": "mean predicted score",
                "ylabel": "fraction positive",
                "series": [
                    {
                        "label": "reliability",
                        "x": [b["mean_score"] for b in bins],
                        "y": [b["fraction_positive"] for b in bins],
                    }
                ],
            }
        ]
    if isinstance(metric, Histogram):
        result = metric.result(state)
        return [
            {
                "title": f"histogram — {key}",
                "kind": "hist",
                "edges": result["edges"],
                "xlabel": ", ".join(metric.columns()),
                "ylabel": "rows",
                "series": [{"label": None, "counts": result["counts"]}],
            }
        ]
    return []


def _sketch_plots(key: str, metric: ScoreSketch, state: State) -> list[dict[str, Any]]:
    fpr, tpr = metric.roc_curve(state)
    recall, precision = metric.pr_curve(state)
    result = metric.result(state)
    pos, neg = (np.asarray(state[k])[1:-1] for k in ("positives", "negatives"))  # inner bins
    width = max(1, len(pos) // 50)
    edges = np.linspace(metric.low, metric.high, len(_coarsen(pos, width)) + 1).tolist()
    return [
        {
            "title": f"ROC — {key}",
            "kind": "line",
            "diagonal": True,
            "legend": "lower right",
            "xlabel": "false positive rate",
            "ylabel": "true positive rate",
            "series": [
                {
                    "label": f"AUC {result.get('auc_roc', 0) or 0:.4f}",
                    "x": fpr.tolist(),
                    "y": tpr.tolist(),
                }
            ],
        },
        {
            "title": f"precision-recall — {key}",
            "kind": "line",
            "legend": "lower left",
            "xlabel": "recall",
            "ylabel": "precision",
            "series": [
                {
                    "label": f"AP {result.get('pr_auc', 0) or 0:.4f}",
                    "x": recall.tolist(),
                    "y": precision.tolist(),
                }
            ],
        },
        {
            "title": f"scores — {key}",
            "kind": "hist",
            "edges": edges,
            "xlabel": "score",
            "ylabel": "rows",
            "series": [
                {"label": "positives", "counts": _coarsen(pos, width)},
                {"label": "negatives", "counts": _coarsen(neg, width)},
            ],
        },
    ]


def _sliced_plots(
    key: str, sliced: Sliced, metric: ScoreSketch, state: State
) -> list[dict[str, Any]]:
    """ROC and precision-recall curves of the largest slices, overlaid on one plot each."""
    groups = state["groups"]
    sizes = {g: float(np.sum(s["positives"]) + np.sum(s["negatives"])) for g, s in groups.items()}
    shown = sorted(groups, key=lambda g: (-sizes[g], g))[:MAX_SLICES_PLOTTED]
    results = sliced.result(state)["groups"]
    labels = {g: label for g, label in zip(sorted(groups), results, strict=True)}
    roc, pr = [], []
    for group in shown:
        fpr, tpr = metric.roc_curve(groups[group], max_points=400)
        recall, precision = metric.pr_curve(groups[group], max_points=400)
        roc.append({"label": labels[group], "x": fpr.tolist(), "y": tpr.tolist()})
        pr.append({"label": labels[group], "x": recall.tolist(), "y": precision.tolist()})
    note = (
        f"the {len(shown)} largest of {len(groups)} slices by {sliced.by}"
        if len(groups) > len(shown)
        else f"every slice by {sliced.by}"
    )
    common = {"kind": "line", "note": note}
    return [
        {
            **common,
            "title": f"ROC by {sliced.by} — {key}",
            "diagonal": True,
            "legend": "lower right",
            "xlabel": "false positive rate",
            "ylabel": "true positive rate",
            "series": roc,
        },
        {
            **common,
            "title": f"precision-recall by {sliced.by} — {key}",
            "legend": "lower left",
            "xlabel": "recall",
            "ylabel": "precision",
            "series": pr,
        },
    ]


def _coarsen(counts: np.ndarray, width: int) -> list[int]:
    padded = np.pad(counts, (0, (-len(counts)) % width))
    return [int(c) for c in padded.reshape(-1, width).sum(axis=1)]


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value
