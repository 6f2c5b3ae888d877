"""Regression metrics: MSE, RMSE, MAE, R² from exact sums."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa

from chute.metrics.base import (
    Metric,
    _floats,
)
from chute.metrics.state import (
    _UNIT,
    Floats,
    State,
    _exact,
    _exact_sums,
    _ratio,
    _square_units,
    _to_float,
)

# -- regression --------------------------------------------------------------------------


class Regression(Metric):
    """MSE, RMSE, MAE, R², mean prediction and mean label from one state of exact sums.

    R² follows scikit-learn: 1.0 for a perfect fit of constant labels, 0.0 for an
    imperfect one. Sums of y, y², ŷ, (ŷ-y)² and |ŷ-y| are exact (each square too), so R²
    suffers no cancellation: labels of 1.7e9 a second apart give scikit-learn's value.
    A finite value whose square (or error) passes the float range is summed exactly too;
    a mean beyond it is inf.

    >>> Regression(label="tip_amount", prediction="tip_pred")
    <Regression 'regression' on tip_amount, tip_pred>
    """

    name = "regression"
    _SUMS = ("label", "label_sq", "prediction", "squared_error", "absolute_error")

    def __init__(self, label: str, prediction: str, *, name: str | None = None) -> None:
        self.label, self.prediction = label, prediction
        self.name = name or type(self).name

    def columns(self) -> list[str]:
        return [self.label, self.prediction]

    def column_kinds(self) -> dict[str, str]:
        return {self.label: "numeric", self.prediction: "numeric"}

    def init(self) -> State:
        return {"count": 0, "skipped": 0, **dict.fromkeys(self._SUMS, 0)}

    def summarize(self, table: pa.Table) -> State:
        y, y_ok = _floats(table, self.label, self.name)
        p, p_ok = _floats(table, self.prediction, self.name)
        ok = y_ok & p_ok
        y, p = y[ok], p[ok]
        with np.errstate(over="ignore"):
            error = p - y
        return {
            "count": len(y),
            "skipped": int(len(ok) - len(y)),
            "label": _exact_sums(y)[0],
            "label_sq": _square_sum(y),
            "prediction": _exact_sums(p)[0],
            **_error_sums(p, y, error),
        }

    def result(self, state: State) -> dict[str, Any]:
        n = state["count"]
        mse = _ratio(state["squared_error"], n)  # inf where it passes the float range
        return {
            "mse": mse,
            "rmse": math.sqrt(mse) if mse is not None else None,
            "mae": _ratio(state["absolute_error"], n),
            "r2": _r2(state) if n else None,
            "mean_prediction": _ratio(state["prediction"], n),
            "mean_label": _ratio(state["label"], n),
            "count": n,
            "skipped": state["skipped"],
        }


def _r2(state: State) -> float:
    n, total = state["count"], _exact(state["label"])
    spread = _exact(state["label_sq"]) - total * total / n
    residual = _exact(state["squared_error"])
    if spread <= 0:
        return 1.0 if residual == 0 else 0.0
    return _to_float(1 - residual / spread)


_SPLIT = 2.0**27 + 1
"""Veltkamp's constant for float64: ``x`` splits into two halves of 26 bits each."""
_TINY = 2.0**-400
"""Below this a value's square is summed as NumPy rounds it (its exact square is finer
than the sums' unit, and negligible beside any other)."""


def _square_sum(x: Floats) -> int:
    """The exact sum of the values' squares. Each square rounded to a float first, labels
    with a large common offset and a small spread (epoch seconds: ~1.7e9, a second apart)
    had ``Σy² − (Σy)²/n`` lost in the rounding (up to 256 a square), and R² came out 0.0
    where scikit-learn says 0.88. So each value is split exactly into two halves of 26 bits
    (``hi + lo``), whose products ``hi·hi``, ``2·hi·lo`` and ``lo·lo`` are exact floats,
    summed exactly. A square beyond the float range (of a finite value past 1.3e154) is
    added exactly too: as inf it would make the sum wrong."""
    with np.errstate(over="ignore"):
        squares = np.square(x)
    over = ~np.isfinite(squares)
    fits = x[~over]
    split = np.abs(fits) >= _TINY
    whole = fits[split]
    scaled = whole * _SPLIT
    hi = scaled - (scaled - whole)
    lo = whole - hi
    exact = sum(_exact_sums(part)[0] for part in (hi * hi, 2.0 * hi * lo, lo * lo))
    tiny = _exact_sums(np.square(fits[~split]))[0]
    return exact + tiny + sum(_square_units(v) for v in x[over].tolist())


def _error_sums(p: Floats, y: Floats, error: Floats) -> State:
    """Exact sums of ``|p - y|`` and ``(p - y)**2``. A difference beyond the float range
    (``1e308 - -1e308``) is taken exactly: both values are then integers."""
    over = ~np.isfinite(error)
    wide = [int(a) - int(b) for a, b in zip(p[over].tolist(), y[over].tolist(), strict=True)]
    return {
        "squared_error": _square_sum(error[~over]) + sum(d * d << _UNIT for d in wide),
        "absolute_error": _exact_sums(np.abs(error[~over]))[0] + sum(abs(d) << _UNIT for d in wide),
    }
