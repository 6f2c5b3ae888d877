"""The metric interface, and helpers that read and check a batch's columns."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chute.errors import ConfigError, DataError, missing_columns_error
from chute.metrics.state import (
    Floats,
    Mask,
    State,
    add_states,
)

MAX_CURVE_POINTS = 1000
_EPS = float(np.finfo(np.float64).eps)


# -- the metric interface ----------------------------------------------------------------


@runtime_checkable
class MetricLike(Protocol):
    """What a custom metric object needs; ``Metric`` subclasses have it all."""

    def init(self) -> State: ...

    def update(self, state: State, table: pa.Table) -> State: ...

    def merge(self, a: State, b: State) -> State: ...

    def result(self, state: State) -> dict[str, Any]: ...


class Metric:
    """Base class: a mergeable accumulator over Arrow batches.

    Subclasses give ``columns``, ``init``, ``result`` and either ``update`` or the batch
    summary ``summarize`` (``update`` then merges that summary in). ``merge`` adds states
    field by field unless overridden. No method changes the states it is given.
    """

    name: str = "metric"
    """The key the result is reported under."""

    def columns(self) -> list[str]:
        """The columns this metric reads from a batch."""
        return []

    def column_kinds(self) -> dict[str, str]:
        """What each column it reads must hold, one of :data:`KINDS`: planning checks the
        input columns against it, so a wrong type fails before any model loads."""
        return {}

    def init(self) -> State:
        """The state of no rows: the identity of ``merge``."""
        raise NotImplementedError

    def update(self, state: State, table: pa.Table) -> State:
        """``state`` with the rows of ``table`` added."""
        return self.merge(state, self.summarize(table))

    def summarize(self, table: pa.Table) -> State:
        """The state of the rows of ``table`` alone."""
        raise NotImplementedError

    def merge(self, a: State, b: State) -> State:
        """The state of the rows of both ``a`` and ``b``."""
        return add_states(a, b)

    def result(self, state: State) -> dict[str, Any]:
        """The metric's values, as a JSON-able dict."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} on {', '.join(self.columns())}>"


def _column(table: pa.Table, name: str, metric: str) -> pa.ChunkedArray:
    if name not in table.column_names:
        raise missing_columns_error([name], table.column_names, f"metric {metric!r}")
    return table.column(name)


def _is_numeric(type_: pa.DataType) -> bool:
    """Integers, floats, booleans and decimals (read as floats)."""
    return bool(
        pa.types.is_integer(type_)
        or pa.types.is_floating(type_)
        or pa.types.is_boolean(type_)
        or pa.types.is_decimal(type_)
    )


def _is_list(type_: pa.DataType) -> bool:
    return bool(
        pa.types.is_fixed_size_list(type_)
        or pa.types.is_list(type_)
        or pa.types.is_large_list(type_)
    )


KINDS = {
    "numeric": "numbers (integers, floats, booleans or decimals)",
    "integer": "integer class indexes",
    "class scores": "a list of per-class scores per row",
}
"""What a metric may need a column to hold (:meth:`Metric.column_kinds`), in words."""

_FIXES = {
    "numeric": "map it to numbers first (in a preprocess step), or point the metric at "
    "a numeric column",
    "integer": "map the classes to integers 0, 1, … first (in a preprocess step)",
    "class scores": "for one score per row use a binary metric (auc_roc, log_loss, …)",
}


def check_column_kind(metric: str, column: str, type_: pa.DataType, kind: str) -> None:
    """Refuse a column of ``type_`` where ``metric`` needs ``kind`` (see :data:`KINDS`).
    A column of the null type (every value missing) is any kind."""
    if pa.types.is_dictionary(type_):
        type_ = type_.value_type
    if pa.types.is_null(type_) or _holds(type_, kind):
        return
    hint = ""
    if kind == "numeric" and _is_list(type_):
        hint = " (for class probabilities use multiclass_accuracy, top_k_accuracy or cross_entropy)"
    raise ConfigError(
        f"metric {metric!r} needs {KINDS[kind]} in {column!r}, but the input column is "
        f"{type_}{hint}: {_FIXES[kind]}."
    )


def _holds(type_: pa.DataType, kind: str) -> bool:
    if kind == "integer":
        return bool(pa.types.is_integer(type_))
    if kind == "class scores":
        return _is_list(type_) and _is_numeric(type_.value_type)
    return _is_numeric(type_)


def _floats(table: pa.Table, name: str, metric: str) -> tuple[Floats, Mask]:
    """The column as float64 and the mask of its usable (non-null, finite) rows."""
    column = _column(table, name, metric)
    if pa.types.is_null(column.type):  # a batch whose values were all None: none usable
        return np.zeros(len(column)), np.zeros(len(column), bool)
    if not _is_numeric(column.type):
        raise ConfigError(
            f"metric {metric!r} needs a numeric column, but {name!r} is {column.type}: "
            "point the metric at a numeric column."
        )
    # an integer past 2**53 becomes the nearest float (a safe cast refused it, after compute)
    floats = pc.cast(column, pa.float64(), safe=False)
    values = np.asarray(pc.fill_null(floats, 0.0).to_numpy(), np.float64)
    return values, ~np.asarray(pc.is_null(column).to_numpy(), bool) & np.isfinite(values)


def _check_binary(y: Floats, metric: str, label: str) -> None:
    bad = (y != 0) & (y != 1)
    if bad.any():
        raise DataError(
            f"metric {metric!r}: label column {label!r} must hold 0/1 or booleans, "
            f"found {y[bad][0]!r}; map the labels to 0/1 first (e.g. in a Preprocess)."
        )


def _check_probabilities(s: Floats, metric: str, score: str) -> None:
    if len(s) and (s.min() < 0 or s.max() > 1):
        value = s.min() if s.min() < 0 else s.max()
        raise DataError(
            f"metric {metric!r}: score column {score!r} must hold probabilities in [0, 1], "
            f"found {value!r}; apply a sigmoid/softmax in the model, or use auc_roc."
        )


def _downsample(*curves: Floats, max_points: int = MAX_CURVE_POINTS) -> tuple[Floats, ...]:
    """Keep at most ``max_points`` evenly spaced points, always the first and the last."""
    if len(curves[0]) <= max_points:
        return curves
    keep = np.unique(np.linspace(0, len(curves[0]) - 1, max_points).round().astype(np.intp))
    return tuple(c[keep] for c in curves)
