"""Sliced metrics, custom metrics, and the registry of built-in metric types."""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chute.errors import ConfigError, did_you_mean
from chute.metrics.base import (
    Metric,
    MetricLike,
    _column,
)
from chute.metrics.binary import AucRoc, Brier, Calibration, Confusion, LogLoss, PrAuc
from chute.metrics.columns import ColumnStats, Histogram, NumericStats
from chute.metrics.multiclass import Multiclass
from chute.metrics.regression import Regression
from chute.metrics.state import (
    State,
)
from chute.usercode import import_string

# -- slices ------------------------------------------------------------------------------


class Sliced(Metric):
    """One state of ``metric`` per value of the column ``by`` (null is a value too).

    The result holds ``all`` (the merge of every group, so the unsliced metric) and
    ``groups``, keyed by the value (strings as they are, other values as JSON, null as
    ``null``, the string "null" as ``'"null"'``: see :func:`_group_label`). More than
    ``max_groups`` values raise ``ConfigError``: slice by a low-cardinality column.

    >>> Sliced(AucRoc(label="is_tip", score="tip_score"), by="payment_type")
    <Sliced 'auc_roc' on is_tip, tip_score, payment_type>
    """

    def __init__(self, metric: Metric, by: str, *, max_groups: int = 100) -> None:
        self.metric, self.by, self.max_groups = metric, by, int(max_groups)
        self.name = metric.name

    def columns(self) -> list[str]:
        return [*self.metric.columns(), self.by]

    def column_kinds(self) -> dict[str, str]:
        return self.metric.column_kinds()

    def init(self) -> State:
        return {"groups": {}}

    def summarize(self, table: pa.Table) -> State:
        values = _column(table, self.by, self.name).combine_chunks()
        if pa.types.is_dictionary(values.type):  # a pandas categorical: by its values (a
            values = values.dictionary_decode()  # null, a repeated or unused category)
        encoded = pc.dictionary_encode(values, null_encoding="encode")
        keys = [json.dumps(v, default=str) for v in encoded.dictionary.to_pylist()]
        self._check_cap(keys)
        codes = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), np.int64)
        order = np.argsort(codes, kind="stable")
        ends = np.cumsum(np.bincount(codes, minlength=len(keys))).tolist()
        needed = self.metric.columns()  # custom metrics may not say: then take them all
        rows = (table.select(needed) if needed else table).take(pa.array(order))
        groups: dict[str, State] = {}
        for key, start, end in zip(keys, [0, *ends][:-1], ends, strict=True):
            if end > start:
                groups[key] = self.metric.update(self.metric.init(), rows.slice(start, end - start))
        return {"groups": groups}

    def merge(self, a: State, b: State) -> State:
        groups = dict(a["groups"])
        for key, state in b["groups"].items():
            groups[key] = self.metric.merge(groups[key], state) if key in groups else state
        self._check_cap(groups)
        return {"groups": groups}

    def result(self, state: State) -> dict[str, Any]:
        groups = state["groups"]
        every = self.metric.init()
        for key in sorted(groups):
            every = self.metric.merge(every, groups[key])
        return {
            "by": self.by,
            "all": self.metric.result(every),
            "groups": {_group_label(k): self.metric.result(groups[k]) for k in sorted(groups)},
        }

    def _check_cap(self, keys: Sequence[str] | Mapping[str, Any]) -> None:
        if len(keys) > self.max_groups:
            raise ConfigError(
                f"metric {self.name!r} sliced by {self.by!r}: the column has more than "
                f"max_groups={self.max_groups} distinct values ({len(keys)} seen so far). "
                "Slice by a low-cardinality column, or raise max_groups in the metric's spec "
                "(each group keeps its own state): that changes the job, so run it again "
                "with --overwrite (a resume is refused; every unit is computed again)."
            )


def _group_label(key: str) -> str:
    """A group's name in the result: a string as it is, any other value as JSON, null as
    ``null``. A string that would read like null, or like JSON text (the string ``"null"``,
    one starting with a quote), is shown as JSON, quotes included, so that no two groups
    share a name."""
    value = json.loads(key)
    if not isinstance(value, str):
        return key
    return key if value == "null" or value.startswith('"') else value


# -- custom metrics and the registry -----------------------------------------------------


class Custom(Metric):
    """Adapts any object with init/update/merge/result to ``Metric``; ``columns`` (the
    spec's ``columns:``) say what it reads when the object's ``columns()`` names nothing."""

    def __init__(self, inner: MetricLike, name: str, columns: Sequence[str] = ()) -> None:
        self.inner, self.name, self._columns = inner, name, list(columns)

    def columns(self) -> list[str]:
        """What the object's ``columns()`` names, else the spec's ``columns:``."""
        found = getattr(self.inner, "columns", None)
        return (list(found()) if callable(found) else []) or self._columns

    def init(self) -> State:
        return self.inner.init()

    def update(self, state: State, table: pa.Table) -> State:
        return self.inner.update(state, table)

    def merge(self, a: State, b: State) -> State:
        return self.inner.merge(a, b)

    def result(self, state: State) -> dict[str, Any]:
        return self.inner.result(state)


METRICS: dict[str, type[Metric]] = {
    "auc_roc": AucRoc,
    "pr_auc": PrAuc,
    "average_precision": PrAuc,
    "log_loss": LogLoss,
    "brier": Brier,
    "accuracy": Confusion,
    "precision": Confusion,
    "recall": Confusion,
    "f1": Confusion,
    "calibration": Calibration,
    "multiclass_accuracy": Multiclass,
    "top_k_accuracy": Multiclass,
    "cross_entropy": Multiclass,
    "confusion_matrix": Multiclass,
    "mse": Regression,
    "rmse": Regression,
    "mae": Regression,
    "r2": Regression,
    "mean_prediction": Regression,
    "mean_label": Regression,
    "count": ColumnStats,
    "sum": NumericStats,
    "mean": NumericStats,
    "min": NumericStats,
    "max": NumericStats,
    "null_count": ColumnStats,
    "histogram": Histogram,
}
"""Built-in metric types by name. Names of one family share a class and its result."""


def metric_from_spec(spec: Mapping[str, Any]) -> Metric:
    """Build a metric from a job's spec, sliced when it names ``by``.

    >>> metric_from_spec({"type": "auc_roc", "label": "is_tip", "score": "tip_score",
    ...                   "by": "payment_type", "max_groups": 20})
    <Sliced 'auc_roc' on is_tip, tip_score, payment_type>
    """
    options = dict(spec)
    kind = options.pop("type", None)
    if not isinstance(kind, str):
        raise ConfigError(f"metric spec {dict(spec)!r} needs a 'type' (one of {_names()}).")
    problem = bad_option(spec)
    if problem is not None:
        raise ConfigError(f"metric {kind!r} option {problem[0]}: {problem[1]}")
    by, max_groups = options.pop("by", None), options.pop("max_groups", 100)
    metric = _builtin(kind, options) if ":" not in kind else _custom(kind, options)
    return Sliced(metric, by, max_groups=max_groups) if by is not None else metric


_WHOLE = {"bins": 1, "k": 1, "num_classes": 2, "max_groups": 1}
"""Options of built-in metrics that take a whole number, and the least each takes."""
MAX_BINS = 2**20
"""The most bins a metric keeps: each unit's state holds them in the ledger, and
``bins: 1000000000`` allocated arrays of gigabytes per batch (auc_roc's default: 2**14)."""
_TEXT = ("label", "score", "prediction", "column", "by", "name")
"""Options that name a column (or the metric)."""


def bad_option(spec: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first option of a metric spec whose value a built-in option cannot take, as
    (key, what is wrong and what it takes); None when all are sound. Without this,
    ``max_groups: abc`` said "invalid literal for int()" and ``bins: 2.7`` became 2."""
    builtin = ":" not in str(spec.get("type", ""))
    for key, value in spec.items():
        if key == "type" or (not builtin and key not in ("by", "max_groups")):
            continue  # a custom metric's constructor takes its own options
        what = _option_problem(key, value)
        if what is not None:
            return key, f"{value!r} is not {what}."
    return None


def _option_problem(key: str, value: Any) -> str | None:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if key in _WHOLE and not (value is None and key == "num_classes"):
        least = _WHOLE[key]
        if not (number and math.isfinite(value) and value == int(value) and value >= least):
            return f"a whole number of at least {least} (e.g. {key}: {max(least, 10)})"
        if key == "bins" and value > MAX_BINS:
            return f"at most {MAX_BINS:,} bins (each unit's state keeps them)"
    if key == "threshold" and not (number and math.isfinite(value)):
        return "a finite number (e.g. threshold: 0.5)"
    if key in ("range", "score_range"):
        pair = isinstance(value, list | tuple) and len(value) == 2
        if not pair or not all(_option_problem("threshold", v) is None for v in value):
            return f"two finite numbers, low and high (e.g. {key}: [0, 1])"
    if key in _TEXT and not isinstance(value, str) and not (key == "name" and value is None):
        return "a column name" if key != "name" else "a name"
    return None


def _names() -> str:
    return ", ".join(sorted(METRICS))


def _builtin(kind: str, options: dict[str, Any]) -> Metric:
    if kind not in METRICS:
        raise ConfigError(
            f"unknown metric type {kind!r}.{did_you_mean(kind, METRICS)} Built-in types: "
            f"{_names()}; or name your own as 'package.module:Class'."
        )
    factory = METRICS[kind]
    options.setdefault("name", kind)
    if factory is Regression and "score" in options:
        options["prediction"] = options.pop("score")
    metric: Metric = _construct(factory, kind, options)
    return metric


def _construct(factory: Callable[..., Any], kind: str, options: dict[str, Any]) -> Any:
    accepted = inspect.signature(factory).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in accepted.values())
    unknown = [key for key in options if key not in accepted and not takes_any]
    if unknown:
        hint = did_you_mean(unknown[0], accepted)
        raise ConfigError(
            f"metric {kind!r} has no option {unknown[0]!r}.{hint} "
            f"Its options: {', '.join(accepted)}, by, max_groups."
        )
    try:
        return factory(**options)
    except (TypeError, ValueError) as exc:  # a custom metric's constructor, say
        raise ConfigError(f"metric {kind!r}: {exc}") from exc


def _custom(kind: str, options: dict[str, Any]) -> Metric:

    name = options.pop("name", None) or kind.rpartition(":")[2]
    columns = options.pop("columns", ())
    made = _instantiate(import_string(kind), kind, options)
    if isinstance(made, Metric) and (made.columns() or not columns):
        made.name = name
        return made
    if not isinstance(made, MetricLike):
        raise ConfigError(
            f"metric {kind!r} is not a metric: it needs init(), update(state, table), "
            "merge(a, b) and result(state); subclass chute.metrics.Metric."
        )
    return Custom(made, name, columns)


def _instantiate(target: Any, kind: str, options: dict[str, Any]) -> Any:
    if inspect.isclass(target):
        return _construct(target, kind, options)
    if options:
        raise ConfigError(
            f"metric {kind!r} is an object, not a class: it takes no options "
            f"({', '.join(options)}); name a class, or drop the options."
        )
    return target
