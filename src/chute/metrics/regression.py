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
    State,
    _exact,
    _exact_sums,
    _ratio,
)

# -- regression --------------------------------------------------------------------------


class Regression(Metric):
    """MSE, RMSE, MAE, R², mean prediction and mean label from one state of exact sums.

    R² follows scikit-learn: 1.0 for a perfect fit of constant labels, 0.0 for an
    imperfect one. Sums of y, y², ŷ, (ŷ-y)² and |ŷ-y| are exact, so R² suffers no
    cancellation beyond the rounding of each row's square.

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

    def init(self) -> State:
        return {"count": 0, "skipped": 0, **dict.fromkeys(self._SUMS, 0)}

    def summarize(self, table: pa.Table) -> State:
        y, y_ok = _floats(table, self.label, self.name)
        p, p_ok = _floats(table, self.prediction, self.name)
        ok = y_ok & p_ok
        y, p = y[ok], p[ok]
        error = p - y
        columns = (y, np.square(y), p, np.square(error), np.abs(error))
        sums = {
            key: _exact_sums(column)[0] for key, column in zip(self._SUMS, columns, strict=True)
        }
        return {"count": len(y), "skipped": int(len(ok) - len(y)), **sums}

    def result(self, state: State) -> dict[str, Any]:
        n = state["count"]
        mse = _ratio(state["squared_error"], n)
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
    return float(1 - residual / spread)
