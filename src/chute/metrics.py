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

import base64
import inspect
import json
import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from chute.errors import ConfigError, DataError, did_you_mean, missing_columns_error

State = dict[str, Any]
"""A metric's partial result: numbers, NumPy arrays and nested dicts of those."""

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]

MAX_CURVE_POINTS = 1000
_EPS = float(np.finfo(np.float64).eps)

# -- exact sums of floats ----------------------------------------------------------------

_EXP_BIAS = 1073  # np.frexp exponents run from -1073 (subnormals) to 1024
_N_EXP = 2098
_UNIT = 1126  # sums are integers in units of 2**-1126 (the smallest step of m * 2**(e-53))
_LIMB = 26
_CHUNK = 1 << 25  # keeps every bincount total below 2**53, so float64 adds them exactly


def _exact_sums(x: Floats, groups: Ints | None = None, n_groups: int = 1) -> list[int]:
    """Exact sums of finite float64 ``x`` per group, as integers in units of 2**-1126.

    Each value is ``mant * 2**(e-53)`` with an integer ``mant < 2**53``; the mantissas are
    split into two limbs and summed per (group, exponent) with ``bincount``. Integer sums
    make the merge exactly associative and commutative.
    """
    totals = [0] * n_groups
    for start in range(0, len(x), _CHUNK):
        _add_chunk(totals, x[start : start + _CHUNK], groups, start, n_groups)
    return totals


def _add_chunk(totals: list[int], x: Floats, groups: Ints | None, start: int, n: int) -> None:
    frac, exp = np.frexp(x)
    mant = (frac * 2.0**53).astype(np.int64)
    key = exp.astype(np.int64) + _EXP_BIAS
    if groups is not None:
        key += groups[start : start + len(x)] * _N_EXP
    size = n * _N_EXP
    high = np.bincount(key, weights=mant >> _LIMB, minlength=size)
    low = np.bincount(key, weights=mant & ((1 << _LIMB) - 1), minlength=size)
    for k in np.flatnonzero((high != 0) | (low != 0)).tolist():
        group, shift = divmod(k, _N_EXP)
        totals[group] += ((int(high[k]) << _LIMB) + int(low[k])) << shift


def _exact(total: int) -> Fraction:
    return Fraction(total, 1 << _UNIT)


def _ratio(total: int, count: int) -> float | None:
    """``total / count`` correctly rounded, or None when nothing was counted."""
    return total / (count << _UNIT) if count else None


def _object_ints(values: list[int]) -> npt.NDArray[np.object_]:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


# -- states: merging and (de)serialising -------------------------------------------------


def add_states(a: State, b: State) -> State:
    """Merge two states by adding them field by field (nested dicts recursively)."""
    out = dict(a)
    for key, value in b.items():
        if key not in out:
            out[key] = value
        elif isinstance(value, dict):
            out[key] = add_states(out[key], value)
        else:
            out[key] = out[key] + value
    return out


_MAGIC = b"chute-metric-state/1\n"


def dumps(state: State) -> bytes:
    """Serialise a state compactly (zlib'd JSON header + raw arrays; no pickle)."""
    blobs: list[bytes] = []
    header = json.dumps(_encode(state, blobs), separators=(",", ":")).encode()
    raw = _MAGIC + len(header).to_bytes(8, "little") + header + b"".join(blobs)
    return zlib.compress(raw, 6)


def loads(data: bytes) -> State:
    """Rebuild a state written by ``dumps``."""
    try:
        raw = zlib.decompress(data)
    except zlib.error as exc:
        raise DataError(f"not a chute metric state ({exc}); was it written by dumps()?") from exc
    if not raw.startswith(_MAGIC):
        raise DataError("not a chute metric state (bad header); was it written by dumps()?")
    size = int.from_bytes(raw[len(_MAGIC) : len(_MAGIC) + 8], "little")
    start = len(_MAGIC) + 8
    header = json.loads(raw[start : start + size])
    state = _Reader(memoryview(raw)[start + size :]).read(header)
    if not isinstance(state, dict):
        raise DataError("not a chute metric state (its root is not a dict).")
    return state


def state_to_text(state: State) -> str:
    """``base64(dumps(state))``, for a JSON ledger."""
    return base64.b64encode(dumps(state)).decode("ascii")


def state_from_text(text: str) -> State:
    """Inverse of ``state_to_text``."""
    return loads(base64.b64decode(text))


def _encode(value: Any, blobs: list[bytes]) -> Any:
    if isinstance(value, dict):
        return ["d", {str(k): _encode(v, blobs) for k, v in value.items()}]
    if isinstance(value, np.ndarray):
        return _encode_array(value, blobs)
    if isinstance(value, bool | np.bool_):
        return ["b", bool(value)]
    if isinstance(value, int | np.integer):
        return ["i", hex(int(value))]
    if isinstance(value, float | np.floating):
        return ["f", float(value).hex()]
    if value is None or isinstance(value, str):
        return ["s", value]
    raise TypeError(f"a metric state holds numbers, arrays and dicts, not {type(value).__name__}")


def _encode_array(array: npt.NDArray[Any], blobs: list[bytes]) -> Any:
    if array.dtype == object:
        return ["o", list(array.shape), [hex(int(v)) for v in array.ravel()]]
    if array.dtype.kind not in "biuf":
        raise TypeError(f"a metric state cannot hold arrays of dtype {array.dtype}")
    stored = _compact_dtype(array)
    data = np.ascontiguousarray(array, dtype=stored).tobytes()
    blobs.append(data)
    return ["a", array.dtype.str, stored.str, list(array.shape), len(data)]


def _compact_dtype(array: npt.NDArray[Any]) -> np.dtype[Any]:
    """The smallest unsigned dtype for non-negative integer arrays (counts)."""
    if array.dtype.kind not in "iu" or array.size == 0 or array.min() < 0:
        return array.dtype.newbyteorder("<")
    return np.min_scalar_type(int(array.max())).newbyteorder("<")


class _Reader:
    """Walks a decoded header, taking array bytes from the blob in order."""

    def __init__(self, blob: memoryview) -> None:
        self.blob = blob
        self.offset = 0

    def read(self, node: Any) -> Any:
        tag, *rest = node
        if tag == "d":
            return {key: self.read(child) for key, child in rest[0].items()}
        if tag == "a":
            return self.array(*rest)
        if tag == "o":
            return np.array([int(v, 16) for v in rest[1]], dtype=object).reshape(rest[0])
        return _SCALARS[tag](rest[0])

    def array(self, dtype: str, stored: str, shape: list[int], size: int) -> npt.NDArray[Any]:
        chunk = self.blob[self.offset : self.offset + size]
        self.offset += size
        flat = np.frombuffer(chunk, dtype=np.dtype(stored))
        return flat.astype(np.dtype(dtype)).reshape(shape)


_SCALARS: dict[str, Callable[[Any], Any]] = {
    "b": bool,
    "i": lambda v: int(v, 16),
    "f": float.fromhex,
    "s": lambda v: v,
}


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
    return bool(
        pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_boolean(type_)
    )


def _is_list(type_: pa.DataType) -> bool:
    return bool(
        pa.types.is_fixed_size_list(type_)
        or pa.types.is_list(type_)
        or pa.types.is_large_list(type_)
    )


def _floats(table: pa.Table, name: str, metric: str) -> tuple[Floats, Mask]:
    """The column as float64 and the mask of its usable (non-null, finite) rows."""
    column = _column(table, name, metric)
    if not _is_numeric(column.type):
        raise ConfigError(
            f"metric {metric!r} needs a numeric column, but {name!r} is {column.type}: "
            "point the metric at a numeric column."
        )
    values = np.asarray(pc.fill_null(pc.cast(column, pa.float64()), 0.0).to_numpy(), np.float64)
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


# -- binary classification ---------------------------------------------------------------


class _Binary(Metric):
    """Shared by binary metrics: a 0/1 label column and a score column."""

    def __init__(self, label: str, score: str, *, name: str | None = None) -> None:
        self.label = label
        self.score = score
        self.name = name or type(self).name

    def columns(self) -> list[str]:
        return [self.label, self.score]

    def _inputs(self, table: pa.Table) -> tuple[Floats, Floats, int]:
        """(labels, scores, rows skipped) over the usable rows of ``table``."""
        if self.score in table.column_names and _is_list(table.column(self.score).type):
            raise ConfigError(
                f"metric {self.name!r}: score column {self.score!r} holds lists; for class "
                "probabilities use multiclass_accuracy, top_k_accuracy or cross_entropy."
            )
        y, y_ok = _floats(table, self.label, self.name)
        s, s_ok = _floats(table, self.score, self.name)
        ok = y_ok & s_ok
        y, s = y[ok], s[ok]
        _check_binary(y, self.name, self.label)
        return y, s, int(len(ok) - len(y))


class ScoreSketch(_Binary):
    """Positives and negatives counted per fine score bin: the state of AUC and PR-AUC.

    Scores are clipped to ``score_range`` (reported as ``clipped``) and binned into
    ``bins`` equal bins, plus one bin for each end of the range (scores of exactly 0 or 1,
    say), whose rows are exactly tied. Bins keep the order of scores, so only a positive
    and a negative that share an inner bin can be ordered differently from the exact
    computation: the bounds below sum over inner bins only.

    AUC bound. Exact AUC counts each (positive, negative) pair as 1 if the positive scores
    higher, 0.5 if tied, 0 otherwise; the sketch counts every pair sharing a bin as 0.5
    and every other pair exactly. So ``|AUC_sketch - AUC_exact| <= 0.5 * sum_b pos_b *
    neg_b / (P * N)``, reported as ``auc_error_bound``.

    PR-AUC bound. Average precision is ``sum over positives of precision at its score
    / P``. Walking bins from the highest score, let a bin hold p positives and n negatives
    with T, F counted above it. The sketch gives each of its positives the precision
    ``m = (T+p)/(T+F+p+n)``. Exactly, the j-th positive of the bin gets a precision
    between ``f(j) = (T+j)/(a+j)`` with ``a = T+F+n`` and ``h = (T+p)/(T+F+p)``. As 1/x is
    convex, ``sum_j 1/(a+j) <= ln((a+p+1/2)/(a+1/2))`` (midpoint rule), so the bin's
    exact total lies in ``[L, p*h]`` with ``L = p - (F+n) * ln((a+p+1/2)/(a+1/2))``, and
    ``|AP_sketch - AP_exact| <= sum_b max(p*h - p*m, p*m - L) / P``, reported as
    ``pr_auc_error_bound``. Both bounds are measured against scikit-learn in the tests;
    with 2**14 bins over well spread scores they are of order 1e-5 (AUC) and 1e-4 (AP).
    They hold against the exact values on the *clipped* scores: for logits or other
    unbounded scores, set ``score_range`` so that ``clipped`` stays 0.
    """

    name = "score_sketch"

    def __init__(
        self,
        label: str,
        score: str,
        *,
        bins: int = 2**14,
        score_range: Sequence[float] = (0.0, 1.0),
        name: str | None = None,
    ) -> None:
        super().__init__(label, score, name=name)
        low, high = (float(v) for v in score_range)
        if bins < 2 or not low < high:
            raise ConfigError(f"metric {self.name!r}: need bins >= 2 and score_range low < high.")
        self.bins, self.low, self.high = int(bins), low, high

    def init(self) -> State:
        zeros = np.zeros(self.bins + 2, np.int64)
        return {"positives": zeros, "negatives": zeros.copy(), "skipped": 0, "clipped": 0}

    def summarize(self, table: pa.Table) -> State:
        y, s, skipped = self._inputs(table)
        clipped = int(np.count_nonzero((s < self.low) | (s > self.high)))
        index = self._bin_index(np.clip(s, self.low, self.high))
        positive, size = y == 1, self.bins + 2
        return {
            "positives": np.bincount(index[positive], minlength=size).astype(np.int64),
            "negatives": np.bincount(index[~positive], minlength=size).astype(np.int64),
            "skipped": skipped,
            "clipped": clipped,
        }

    def _bin_index(self, s: Floats) -> npt.NDArray[np.intp]:
        """0 at the low end, ``bins + 1`` at the high end, inner bins between."""
        scaled = (s - self.low) * (self.bins / (self.high - self.low))
        inner = 1 + np.minimum(scaled.astype(np.intp), self.bins - 1)
        return np.where(s <= self.low, 0, np.where(s >= self.high, self.bins + 1, inner))

    def result(self, state: State) -> dict[str, Any]:
        pos, neg = state["positives"], state["negatives"]
        return {
            **_auc(pos, neg),
            **_average_precision(pos, neg),
            "positives": int(pos.sum()),
            "negatives": int(neg.sum()),
            "skipped": state["skipped"],
            "clipped": state["clipped"],
        }

    def roc_curve(self, state: State, max_points: int = MAX_CURVE_POINTS) -> tuple[Floats, Floats]:
        """(false positive rate, true positive rate), from (0, 0), at most ``max_points``."""
        tp, fp = _cumulative(state["positives"], state["negatives"])
        if not tp.size or not tp[-1] or not fp[-1]:
            return np.zeros(0), np.zeros(0)
        fpr, tpr = np.r_[0.0, fp / fp[-1]], np.r_[0.0, tp / tp[-1]]
        return _downsample(fpr, tpr, max_points=max_points)  # type: ignore[return-value]

    def pr_curve(self, state: State, max_points: int = MAX_CURVE_POINTS) -> tuple[Floats, Floats]:
        """(recall, precision), from (0, 1) as scikit-learn's, at most ``max_points``."""
        tp, fp = _cumulative(state["positives"], state["negatives"])
        if not tp.size or not tp[-1]:
            return np.zeros(0), np.zeros(0)
        recall, precision = np.r_[0.0, tp / tp[-1]], np.r_[1.0, tp / (tp + fp)]
        return _downsample(recall, precision, max_points=max_points)  # type: ignore[return-value]


def _cumulative(pos: Ints, neg: Ints) -> tuple[Floats, Floats]:
    """Cumulative (positives, negatives) from the highest non-empty bin down."""
    keep = (pos + neg)[::-1] > 0
    return np.cumsum(pos[::-1])[keep].astype(float), np.cumsum(neg[::-1])[keep].astype(float)


def _auc(pos: Ints, neg: Ints) -> dict[str, float | None]:
    total_pos, total_neg = float(pos.sum()), float(neg.sum())
    if not total_pos or not total_neg:
        return {"auc_roc": None, "auc_error_bound": None}
    p, n = pos.astype(float), neg.astype(float)
    below = np.cumsum(n) - n
    pairs = total_pos * total_neg
    return {
        "auc_roc": float(p @ (below + 0.5 * n) / pairs),
        "auc_error_bound": float(0.5 * (p[1:-1] @ n[1:-1]) / pairs),  # end bins: exact ties
    }


def _average_precision(pos: Ints, neg: Ints) -> dict[str, float | None]:
    p, n = pos[::-1].astype(float), neg[::-1].astype(float)
    total = p.sum()
    if not total:
        return {"pr_auc": None, "pr_auc_error_bound": None}
    inner = np.arange(len(p)) % (len(p) - 1) != 0  # the end bins hold exact ties
    keep = p > 0
    tp, fp = np.cumsum(p)[keep], np.cumsum(n)[keep]
    p, n = p[keep], n[keep]
    mid = tp / (tp + fp)  # m; tp and fp include the bin: tp = T + p, fp = F + n
    high = tp / (tp + fp - n)  # h
    a = tp - p + fp  # T + F + n
    low = p - fp * np.log((a + p + 0.5) / (a + 0.5))  # L
    error = np.maximum(p * (high - mid), p * mid - low) * inner[keep]
    return {"pr_auc": float(p @ mid / total), "pr_auc_error_bound": float(error.sum() / total)}


class AucRoc(ScoreSketch):
    """Area under the ROC curve from a score sketch; see ``ScoreSketch`` for the bound.

    >>> AucRoc(label="is_tip", score="tip_score")
    <AucRoc 'auc_roc' on is_tip, tip_score>
    """

    name = "auc_roc"

    def curve(self, state: State, max_points: int = MAX_CURVE_POINTS) -> tuple[Floats, Floats]:
        """The ROC curve: (false positive rate, true positive rate)."""
        return self.roc_curve(state, max_points)


class PrAuc(ScoreSketch):
    """Average precision (area under the PR curve) from a score sketch; see ``ScoreSketch``.

    >>> PrAuc(label="is_tip", score="tip_score")
    <PrAuc 'pr_auc' on is_tip, tip_score>
    """

    name = "pr_auc"

    def curve(self, state: State, max_points: int = MAX_CURVE_POINTS) -> tuple[Floats, Floats]:
        """The precision-recall curve: (recall, precision)."""
        return self.pr_curve(state, max_points)


class _MeanLoss(_Binary):
    """A per-row loss averaged exactly over the usable rows."""

    key = "loss"

    def init(self) -> State:
        return {"count": 0, "loss": 0, "skipped": 0}

    def summarize(self, table: pa.Table) -> State:
        y, s, skipped = self._inputs(table)
        _check_probabilities(s, self.name, self.score)
        return {"count": len(y), "loss": _exact_sums(self._losses(y, s))[0], "skipped": skipped}

    def _losses(self, y: Floats, s: Floats) -> Floats:
        raise NotImplementedError

    def result(self, state: State) -> dict[str, Any]:
        return {
            self.key: _ratio(state["loss"], state["count"]),
            "count": state["count"],
            "skipped": state["skipped"],
        }


class LogLoss(_MeanLoss):
    """Binary cross-entropy; probabilities are clipped to [eps, 1-eps] as scikit-learn does.

    >>> LogLoss(label="is_tip", score="tip_score")
    <LogLoss 'log_loss' on is_tip, tip_score>
    """

    name = key = "log_loss"

    def _losses(self, y: Floats, s: Floats) -> Floats:
        chosen = np.clip(np.where(y == 1, s, 1 - s), _EPS, 1 - _EPS)
        return np.asarray(-np.log(chosen), np.float64)


class Brier(_MeanLoss):
    """Brier score: the mean squared difference between probability and label.

    >>> Brier(label="is_tip", score="tip_score")
    <Brier 'brier' on is_tip, tip_score>
    """

    name = key = "brier"

    def _losses(self, y: Floats, s: Floats) -> Floats:
        return np.square(s - y)


class Confusion(_Binary):
    """Accuracy, precision, recall and F1 from one confusion count at ``score >= threshold``.

    A ratio with a zero denominator (no predicted positives, say) is None.

    >>> Confusion(label="is_tip", score="tip_score", threshold=0.5)
    <Confusion 'confusion' on is_tip, tip_score>
    """

    name = "confusion"

    def __init__(
        self, label: str, score: str, *, threshold: float = 0.5, name: str | None = None
    ) -> None:
        super().__init__(label, score, name=name)
        self.threshold = float(threshold)

    def init(self) -> State:
        return {"tp": 0, "fp": 0, "tn": 0, "fn": 0, "skipped": 0}

    def summarize(self, table: pa.Table) -> State:
        y, s, skipped = self._inputs(table)
        truth, predicted = y == 1, s >= self.threshold
        counts = np.bincount(truth * 2 + predicted, minlength=4).tolist()
        return {
            "tn": counts[0],
            "fp": counts[1],
            "fn": counts[2],
            "tp": counts[3],
            "skipped": skipped,
        }

    def result(self, state: State) -> dict[str, Any]:
        tp, fp, tn, fn = (state[k] for k in ("tp", "fp", "tn", "fn"))
        return {
            "accuracy": _div(tp + tn, tp + fp + tn + fn),
            "precision": _div(tp, tp + fp),
            "recall": _div(tp, tp + fn),
            "f1": _div(2 * tp, 2 * tp + fp + fn),
            "threshold": self.threshold,
            **{k: state[k] for k in ("tp", "fp", "tn", "fn", "skipped")},
        }


def _div(a: int, b: int) -> float | None:
    return a / b if b else None


class Calibration(_Binary):
    """Expected calibration error and reliability bins over ``bins`` equal score bins.

    Bins are scikit-learn's ``calibration_curve(strategy="uniform")`` bins (closed on the
    right); ``ece = sum_b count_b / N * |mean_score_b - fraction_positive_b|``, exact.

    >>> Calibration(label="is_tip", score="tip_score", bins=10)
    <Calibration 'calibration' on is_tip, tip_score>
    """

    name = "calibration"

    def __init__(self, label: str, score: str, *, bins: int = 10, name: str | None = None) -> None:
        super().__init__(label, score, name=name)
        if bins < 1:
            raise ConfigError(f"metric {self.name!r}: bins must be at least 1, not {bins}.")
        self.bins = int(bins)
        self.edges = np.linspace(0.0, 1.0, self.bins + 1)

    def init(self) -> State:
        zeros = np.zeros(self.bins, np.int64)
        scores = _object_ints([0] * self.bins)
        return {"count": zeros, "positives": zeros.copy(), "score_sum": scores, "skipped": 0}

    def summarize(self, table: pa.Table) -> State:
        y, s, skipped = self._inputs(table)
        _check_probabilities(s, self.name, self.score)
        index = np.searchsorted(self.edges[1:-1], s).astype(np.int64)
        return {
            "count": np.bincount(index, minlength=self.bins).astype(np.int64),
            "positives": np.bincount(index[y == 1], minlength=self.bins).astype(np.int64),
            "score_sum": _object_ints(_exact_sums(s, index, self.bins)),
            "skipped": skipped,
        }

    def result(self, state: State) -> dict[str, Any]:
        count, positives, sums = state["count"], state["positives"], state["score_sum"]
        total = int(count.sum())
        gaps = [abs(_exact(int(s)) - int(p)) for s, p in zip(sums, positives, strict=True)]
        return {
            "ece": float(sum(gaps, Fraction(0)) / total) if total else None,
            "max_calibration_error": _max_gap(gaps, count),
            "bins": [
                self._bin(i, int(count[i]), int(positives[i]), int(sums[i]))
                for i in range(self.bins)
            ],
            "count": total,
            "skipped": state["skipped"],
        }

    def _bin(self, i: int, count: int, positives: int, score_sum: int) -> dict[str, Any]:
        return {
            "lower": float(self.edges[i]),
            "upper": float(self.edges[i + 1]),
            "count": count,
            "mean_score": _ratio(score_sum, count),
            "fraction_positive": _div(positives, count),
        }


def _max_gap(gaps: list[Fraction], count: Ints) -> float | None:
    used = [gap / int(c) for gap, c in zip(gaps, count, strict=True) if c]
    return float(max(used)) if used else None


# -- multiclass --------------------------------------------------------------------------


class Multiclass(Metric):
    """Accuracy, top-k accuracy, cross-entropy and the confusion matrix of a classifier.

    ``label`` is an integer class in ``[0, num_classes)``; ``score`` a list column of
    per-class probabilities (a fixed-size list, as a model's 2-D output becomes, or a list
    of equal lengths). ``num_classes`` defaults to the list size. The prediction is the
    first arg-max; top-k ranks ties as scikit-learn does (higher class index first).
    Cross-entropy clips probabilities to [eps, 1-eps] and is None if some row's scores
    are not probabilities (counted in ``not_probabilities``). The confusion matrix has a
    row per true class and a column per predicted class.

    >>> Multiclass(label="species", score="clf_proba", k=3)
    <Multiclass 'multiclass' on species, clf_proba>
    """

    name = "multiclass"

    def __init__(
        self,
        label: str,
        score: str,
        *,
        num_classes: int | None = None,
        k: int = 5,
        name: str | None = None,
    ) -> None:
        if k < 1 or (num_classes is not None and num_classes < 2):
            raise ConfigError(f"metric {name or self.name!r}: need k >= 1 and num_classes >= 2.")
        self.label, self.score, self.k = label, score, int(k)
        self.num_classes = num_classes
        self.name = name or type(self).name

    def columns(self) -> list[str]:
        return [self.label, self.score]

    def init(self) -> State:
        size = self.num_classes or 0
        return {
            "confusion": np.zeros((size, size), np.int64),
            "top_k": 0,
            "cross_entropy": 0,
            "not_probabilities": 0,
            "skipped": 0,
        }

    def summarize(self, table: pa.Table) -> State:
        y, probs, skipped = self._inputs(table)
        size = probs.shape[1]
        rows = np.arange(len(y))
        chosen = probs[rows, y]
        confusion = np.bincount(y * size + probs.argmax(axis=1), minlength=size * size)
        losses = -np.log(np.clip(chosen, _EPS, 1 - _EPS))
        return {
            "confusion": confusion.reshape(size, size).astype(np.int64),
            "top_k": int(np.count_nonzero(_rank(probs, y, chosen) < self.k)),
            "cross_entropy": _exact_sums(losses)[0],
            "not_probabilities": int(np.count_nonzero(((probs < 0) | (probs > 1)).any(axis=1))),
            "skipped": skipped,
        }

    def merge(self, a: State, b: State) -> State:
        if not a["confusion"].size:
            a = {**a, "confusion": np.zeros_like(b["confusion"])}
        if not b["confusion"].size:
            b = {**b, "confusion": np.zeros_like(a["confusion"])}
        if a["confusion"].shape != b["confusion"].shape:
            raise DataError(
                f"metric {self.name!r}: batches disagree on the number of classes "
                f"({len(a['confusion'])} vs {len(b['confusion'])}); set num_classes."
            )
        return add_states(a, b)

    def result(self, state: State) -> dict[str, Any]:
        confusion = state["confusion"]
        count = int(confusion.sum())
        invalid = state["not_probabilities"]
        return {
            "accuracy": _div(int(np.trace(confusion)), count),
            "top_k_accuracy": _div(state["top_k"], count),
            "k": self.k,
            "cross_entropy": None if invalid else _ratio(state["cross_entropy"], count),
            "confusion_matrix": confusion.tolist(),
            "count": count,
            "not_probabilities": invalid,
            "skipped": state["skipped"],
        }

    def _inputs(self, table: pa.Table) -> tuple[Ints, Floats, int]:
        """(labels, probabilities of shape (rows, classes), rows skipped)."""
        labels = _column(table, self.label, self.name)
        scores = _column(table, self.score, self.name)
        if not _is_list(scores.type) or not _is_numeric(scores.type.value_type):
            raise ConfigError(
                f"metric {self.name!r}: score column {self.score!r} is {scores.type}, not a "
                "list of per-class probabilities; for one score per row use a binary metric."
            )
        ok = ~np.asarray(pc.or_(pc.is_null(labels), pc.is_null(scores)).to_numpy(), bool)
        probs = self._matrix(scores.filter(pa.array(ok)))
        finite = np.isfinite(probs).all(axis=1)
        y = self._labels(labels.filter(pa.array(ok)), probs.shape[1])
        return y[finite], probs[finite], int(len(ok) - np.count_nonzero(finite))

    def _matrix(self, scores: pa.ChunkedArray) -> Floats:
        array = scores.combine_chunks()
        size = self.num_classes or _list_size(array, self.name, self.score)
        if len(array) and not (pc.list_value_length(array).to_numpy() == size).all():
            raise DataError(
                f"metric {self.name!r}: every row of {self.score!r} must hold {size} class "
                "scores (num_classes), but some rows have another length."
            )
        values = pc.cast(array.flatten(), pa.float64()).to_numpy(zero_copy_only=False)
        return np.asarray(values, np.float64).reshape(len(array), size)

    def _labels(self, labels: pa.ChunkedArray, size: int) -> Ints:
        if not pa.types.is_integer(labels.type):
            raise ConfigError(
                f"metric {self.name!r}: label column {self.label!r} is {labels.type}; "
                "multiclass labels are integer class indexes."
            )
        y = np.asarray(labels.to_numpy(), np.int64)
        bad = (y < 0) | (y >= size)
        if bad.any():
            raise DataError(
                f"metric {self.name!r}: label {int(y[bad][0])} in {self.label!r} is not a class "
                f"index in [0, {size}); set num_classes or fix the labels."
            )
        return y


def _list_size(array: pa.Array, metric: str, column: str) -> int:
    if pa.types.is_fixed_size_list(array.type):
        return int(array.type.list_size)
    if not len(array):
        return 0
    size = int(pc.list_value_length(array)[0].as_py())
    if size < 2:
        raise DataError(f"metric {metric!r}: {column!r} must hold two or more class scores.")
    return size


def _rank(probs: Floats, y: Ints, chosen: Floats) -> Ints:
    """Place of the true class when classes are sorted by score, ties by higher index."""
    above = (probs > chosen[:, None]).sum(axis=1)
    tied_after = ((probs == chosen[:, None]) & (np.arange(probs.shape[1]) > y[:, None])).sum(axis=1)
    return np.asarray(above + tied_after, np.int64)


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


def _column_sum(state: State) -> float | None:
    if not state["numeric"]:
        return None
    if state["plus_inf"] or state["minus_inf"]:
        return math.nan if state["plus_inf"] and state["minus_inf"] else _inf_sign(state)
    return float(_exact(state["sum"]))


def _inf_sign(state: State) -> float:
    return math.inf if state["plus_inf"] else -math.inf


def _mean(state: State, total: float) -> float | None:
    if math.isfinite(total):
        return _ratio(state["sum"], state["numeric"])
    return total


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


# -- slices ------------------------------------------------------------------------------


class Sliced(Metric):
    """One state of ``metric`` per value of the column ``by`` (null is a value too).

    The result holds ``all`` (the merge of every group, so the unsliced metric) and
    ``groups``, keyed by the value (non-strings as JSON, null as ``"null"``). More than
    ``max_groups`` values raise ``ConfigError``: slice by a low-cardinality column.

    >>> Sliced(AucRoc(label="is_tip", score="tip_score"), by="payment_type")
    <Sliced 'auc_roc' on is_tip, tip_score, payment_type>
    """

    def __init__(self, metric: Metric, by: str, *, max_groups: int = 100) -> None:
        self.metric, self.by, self.max_groups = metric, by, int(max_groups)
        self.name = metric.name

    def columns(self) -> list[str]:
        return [*self.metric.columns(), self.by]

    def init(self) -> State:
        return {"groups": {}}

    def summarize(self, table: pa.Table) -> State:
        encoded = pc.dictionary_encode(
            _column(table, self.by, self.name).combine_chunks(), null_encoding="encode"
        )
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
                f"Slice by a low-cardinality column, or raise max_groups in the metric's spec "
                f"(each group keeps its own state)."
            )


def _group_label(key: str) -> str:
    value = json.loads(key)
    return value if isinstance(value, str) else key


# -- custom metrics and the registry -----------------------------------------------------


class Custom(Metric):
    """Adapts any object with init/update/merge/result to ``Metric``."""

    def __init__(self, inner: MetricLike, name: str, columns: Sequence[str] = ()) -> None:
        self.inner, self.name, self._columns = inner, name, list(columns)

    def columns(self) -> list[str]:
        found = getattr(self.inner, "columns", None)
        return list(found()) if callable(found) else self._columns

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
    "sum": ColumnStats,
    "mean": ColumnStats,
    "min": ColumnStats,
    "max": ColumnStats,
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
    by, max_groups = options.pop("by", None), options.pop("max_groups", 100)
    metric = _builtin(kind, options) if ":" not in kind else _custom(kind, options)
    return Sliced(metric, by, max_groups=max_groups) if by is not None else metric


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
    except TypeError as exc:
        raise ConfigError(f"metric {kind!r}: {exc}") from exc


def _custom(kind: str, options: dict[str, Any]) -> Metric:
    from chute.stages import import_string  # lazy: the stages will import this module

    name = options.pop("name", None) or kind.rpartition(":")[2]
    columns = options.pop("columns", ())
    made = _instantiate(import_string(kind), kind, options)
    if isinstance(made, Metric):
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
