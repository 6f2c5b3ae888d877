"""Generic column metrics: ColumnStats and Histogram."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chute.errors import ConfigError
from chute.metrics.base import (
    Metric,
    _column,
    _floats,
    _is_numeric,
)
from chute.metrics.state import (
    _UNIT,
    Floats,
    State,
    _exact,
    _exact_sums,
    _ratio,
    _to_float,
    add_states,
)

# -- generic columns ---------------------------------------------------------------------


class ColumnStats(Metric):
    """Rows, count, null count, NaN count, sum, mean, min and max of any column.

    ``count`` counts values that are neither null nor NaN; sum/mean/min/max cover the
    numeric ones (±inf included) and are None for a non-numeric column or no values.

    >>> ColumnStats(column="fare_amount")
    <ColumnStats 'column_stats' on fare_amount>
    """

    name = "column_stats"

    def __init__(self, column: str, *, name: str | None = None) -> None:
        self.column = column
        self.name = name or type(self).name

    def columns(self) -> list[str]:
        return [self.column]

    def init(self) -> State:
        return {
            **dict.fromkeys(("rows", "count", "null_count", "nan_count", "numeric"), 0),
            **dict.fromkeys(("sum", "plus_inf", "minus_inf"), 0),
            "min": math.inf,
            "max": -math.inf,
        }

    def summarize(self, table: pa.Table) -> State:
        column = _column(table, self.column, self.name)
        nulls = int(column.null_count)
        counts = {"rows": len(column), "null_count": nulls, "count": len(column) - nulls}
        if not _is_numeric(column.type):
            return {**self.init(), **counts}
        if pa.types.is_integer(column.type):  # exact: ids and nanoseconds exceed 2**53
            return {**counts, "nan_count": 0, **_integer_stats(column)}
        x, _ = _floats(table, self.column, self.name)
        x = x[~np.asarray(pc.is_null(column).to_numpy(), bool)]
        nan = np.isnan(x)
        return {**counts, "nan_count": int(nan.sum()), **_value_stats(x[~nan])}

    def merge(self, a: State, b: State) -> State:
        extremes = {"min": min(a["min"], b["min"]), "max": max(a["max"], b["max"])}
        return {**add_states(a, b), **extremes}

    def result(self, state: State) -> dict[str, Any]:
        n = state["numeric"]
        total = _column_sum(state)
        return {
            "count": state["count"],
            "sum": total,
            "mean": None if total is None else _mean(state, total),
            "min": state["min"] if n else None,
            "max": state["max"] if n else None,
            "null_count": state["null_count"],
            "nan_count": state["nan_count"],
            "rows": state["rows"],
        }


class NumericStats(ColumnStats):
    """``ColumnStats`` of a column that must hold numbers: the ``sum``, ``mean``, ``min``
    and ``max`` metric types. Of a text column those would be null without a word, so
    planning refuses one; decimals are read as floats.

    >>> NumericStats(column="fare_amount", name="mean")
    <NumericStats 'mean' on fare_amount>
    """

    def column_kinds(self) -> dict[str, str]:
        return {self.column: "numeric"}


def _value_stats(x: Floats) -> State:
    """The numeric part of a ``ColumnStats`` state, for non-NaN values (±inf included)."""
    return {
        "count": len(x),
        "numeric": len(x),
        "sum": _exact_sums(x[np.isfinite(x)])[0],
        "plus_inf": int(np.count_nonzero(x == math.inf)),
        "minus_inf": int(np.count_nonzero(x == -math.inf)),
        "min": float(x.min()) if len(x) else math.inf,
        "max": float(x.max()) if len(x) else -math.inf,
    }


def _integer_stats(column: pa.ChunkedArray | pa.Array) -> State:
    """The numeric part of a ``ColumnStats`` state for an integer column, exactly: the sum
    in two 32-bit limbs (no int64 overflow), the extremes as Python ints."""
    wide = pa.uint64() if pa.types.is_unsigned_integer(column.type) else pa.int64()
    x = np.asarray(pc.drop_null(column).cast(wide).to_numpy())
    if not len(x):
        return {
            "count": 0,
            "numeric": 0,
            "sum": 0,
            "plus_inf": 0,
            "minus_inf": 0,
            "min": math.inf,
            "max": -math.inf,
        }
    total = 0
    for start in range(0, len(x), 1 << 30):  # limb sums stay below 2**62
        chunk = x[start : start + (1 << 30)]
        high, low = (chunk >> 32).astype(np.int64), (chunk & 0xFFFFFFFF).astype(np.int64)
        total += (int(high.sum()) << 32) + int(low.sum())
    return {
        "count": len(x),
        "numeric": len(x),
        "sum": total << _UNIT,
        "plus_inf": 0,
        "minus_inf": 0,
        "min": int(x.min()),
        "max": int(x.max()),
    }


def _column_sum(state: State) -> float | None:
    if not state["numeric"]:
        return None
    if state["plus_inf"] or state["minus_inf"]:
        return math.nan if state["plus_inf"] and state["minus_inf"] else _inf_sign(state)
    return _to_float(_exact(state["sum"]))  # two values of 1e308 add up to inf


def _inf_sign(state: State) -> float:
    return math.inf if state["plus_inf"] else -math.inf


def _mean(state: State, total: float) -> float | None:
    """An infinite value makes the mean infinite (or NaN); a sum beyond the float range
    does not: the mean of finite values is finite."""
    if state["plus_inf"] or state["minus_inf"]:
        return total
    return _ratio(state["sum"], state["numeric"])


class Histogram(Metric):
    """Counts of a numeric column over ``bins`` equal bins of ``range``.

    Bins are NumPy's (``[a, b)``, the last one ``[a, b]``); values below and above the
    range are counted as ``underflow`` / ``overflow``; null and NaN values as ``skipped``.

    >>> Histogram(column="tip_score", bins=50, range=(0.0, 1.0))
    <Histogram 'histogram' on tip_score>
    """

    name = "histogram"

    def __init__(
        self,
        column: str,
        *,
        bins: int = 50,
        range: Sequence[float] = (0.0, 1.0),  # NumPy's name for it
        name: str | None = None,
    ) -> None:
        self.column = column
        self.name = name or type(self).name
        low, high = (float(v) for v in range)
        if bins < 1 or not low < high:
            raise ConfigError(f"metric {self.name!r}: need bins >= 1 and range low < high.")
        self.edges = np.linspace(low, high, int(bins) + 1)

    def column_kinds(self) -> dict[str, str]:
        return {self.column: "numeric"}

    def columns(self) -> list[str]:
        return [self.column]

    def init(self) -> State:
        counts = np.zeros(len(self.edges) - 1, np.int64)
        return {"counts": counts, "underflow": 0, "overflow": 0, "skipped": 0}

    def summarize(self, table: pa.Table) -> State:
        x, ok = _floats(table, self.column, self.name)
        ok |= np.isinf(x)
        x = x[ok]
        bins = len(self.edges) - 1
        index = np.searchsorted(self.edges, x, side="right") - 1
        index[x == self.edges[-1]] = bins - 1
        inside = (index >= 0) & (index < bins)
        return {
            "counts": np.bincount(index[inside], minlength=bins).astype(np.int64),
            "underflow": int(np.count_nonzero(x < self.edges[0])),
            "overflow": int(np.count_nonzero(x > self.edges[-1])),
            "skipped": int(len(ok) - len(x)),
        }

    def result(self, state: State) -> dict[str, Any]:
        return {
            "edges": self.edges.tolist(),
            "counts": state["counts"].tolist(),
            "underflow": state["underflow"],
            "overflow": state["overflow"],
            "skipped": state["skipped"],
        }
