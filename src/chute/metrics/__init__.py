"""Evaluation metrics as small mergeable states, computed in the same pass as inference.

A metric never sees the whole data set. It keeps a *state*, a plain dict of numbers and
NumPy arrays (dicts may nest, for slices), whose size does not depend on the row count:

    state = metric.init()
    state = metric.update(state, batch)       # a pyarrow.Table; vectorised, any batch size
    state = metric.merge(state, other_state)  # associative and commutative
    metric.result(state)                      # a JSON-able dict

Writers compute a state per unit, the driver merges them as they arrive, and the ledger
keeps each unit's state as ``base64(dumps(state))`` so that a resumed job merges exactly
what an uninterrupted one would. Sums of floats are kept *exactly* (as integers in units
of 2**-1126, see ``_exact_sums``), so a merged state, and every result computed from it,
is bit-for-bit the same whatever the batch size, the number of units or the order in
which they are merged.

Missing values: a row is used only when every column the metric reads is non-null and
finite (not NaN, not ±inf); the others are counted in the result's ``skipped``. The
generic ``ColumnStats`` instead reports nulls and NaNs as ``null_count`` / ``nan_count``
and includes ±inf in its sums. Binary labels must be 0/1 (or booleans) and multiclass
labels integers in ``[0, num_classes)``; anything else raises ``DataError``.

Sketched metrics state their error bound and compute it from the state: ``AucRoc`` and
``PrAuc`` bin scores finely and report ``auc_error_bound`` / ``pr_auc_error_bound``, the
largest possible distance from the exact value (see ``ScoreSketch``). All other metrics
are exact.

A custom metric subclasses ``Metric`` (or is any object with init/update/merge/result):

    class PositiveRate(Metric):
        name = "positive_rate"

        def __init__(self, label: str) -> None:
            self.label = label

        def columns(self) -> list[str]:
            return [self.label]

        def init(self) -> State:
            return {"n": 0, "pos": 0}

        def update(self, state: State, table: pa.Table) -> State:
            y = table.column(self.label).to_numpy()
            return self.merge(state, {"n": len(y), "pos": int(y.sum())})

        def result(self, state: State) -> dict[str, Any]:
            return {"positive_rate": state["pos"] / state["n"] if state["n"] else None}

and is named in a job's YAML as ``{type: "my_pkg.metrics:PositiveRate", label: is_tip}``
(``merge`` defaults to adding the states field by field).
"""

from __future__ import annotations

from chute.metrics.base import MAX_CURVE_POINTS, Metric, MetricLike
from chute.metrics.binary import AucRoc, Brier, Calibration, Confusion, LogLoss, PrAuc, ScoreSketch
from chute.metrics.columns import ColumnStats, Histogram, NumericStats
from chute.metrics.multiclass import Multiclass
from chute.metrics.registry import METRICS, Custom, Sliced, metric_from_spec
from chute.metrics.regression import Regression
from chute.metrics.state import (
    Floats,
    Ints,
    Mask,
    State,
    add_states,
    dumps,
    loads,
    state_from_text,
    state_to_text,
)

__all__ = [
    "MAX_CURVE_POINTS",
    "METRICS",
    "AucRoc",
    "Brier",
    "Calibration",
    "ColumnStats",
    "Confusion",
    "Custom",
    "Floats",
    "Histogram",
    "Ints",
    "LogLoss",
    "Mask",
    "Metric",
    "MetricLike",
    "Multiclass",
    "NumericStats",
    "PrAuc",
    "Regression",
    "ScoreSketch",
    "Sliced",
    "State",
    "add_states",
    "dumps",
    "loads",
    "metric_from_spec",
    "state_from_text",
    "state_to_text",
]
