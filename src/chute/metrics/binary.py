"""Binary classification metrics: score sketches (AUC, PR-AUC), losses, confusion, calibration."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from chute.errors import ConfigError
from chute.metrics.base import (
    _EPS,
    MAX_CURVE_POINTS,
    Metric,
    _check_binary,
    _check_probabilities,
    _downsample,
    _floats,
    _is_list,
)
from chute.metrics.state import (
    Floats,
    Ints,
    State,
    _exact,
    _exact_sums,
    _object_ints,
    _ratio,
)

# -- binary classification ---------------------------------------------------------------


class _Binary(Metric):
    """Shared by binary metrics: a 0/1 label column and a score column."""

    def __init__(self, label: str, score: str, *, name: str | None = None) -> None:
        self.label = label
        self.score = score
        self.name = name or type(self).name

    def columns(self) -> list[str]:
        return [self.label, self.score]

    def column_kinds(self) -> dict[str, str]:
        return {self.label: "numeric", self.score: "numeric"}

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
    Once a score was clipped, the end bins hold scores that were not equal, and their
    pairs count in both bounds too: for logits or other unbounded scores, the bounds say
    how far off the sketch may be; set ``score_range`` so that ``clipped`` stays 0.
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
        ties = not state["clipped"]  # else the end bins hold scores that were not equal
        return {
            **_auc(pos, neg, ties),
            **_average_precision(pos, neg, ties),
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


def _auc(pos: Ints, neg: Ints, ties: bool = True) -> dict[str, float | None]:
    """AUC and its bound; ``ties``: the end bins hold only exact ties (nothing clipped)."""
    total_pos, total_neg = float(pos.sum()), float(neg.sum())
    if not total_pos or not total_neg:
        return {"auc_roc": None, "auc_error_bound": None}
    p, n = pos.astype(float), neg.astype(float)
    below = np.cumsum(n) - n
    pairs = total_pos * total_neg
    shared = p[1:-1] @ n[1:-1] if ties else p @ n
    return {
        "auc_roc": float(p @ (below + 0.5 * n) / pairs),
        "auc_error_bound": float(0.5 * shared / pairs),
    }


def _average_precision(pos: Ints, neg: Ints, ties: bool = True) -> dict[str, float | None]:
    p, n = pos[::-1].astype(float), neg[::-1].astype(float)
    total = p.sum()
    if not total:
        return {"pr_auc": None, "pr_auc_error_bound": None}
    inner = np.arange(len(p)) % (len(p) - 1) != 0 if ties else np.ones(len(p), bool)
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
