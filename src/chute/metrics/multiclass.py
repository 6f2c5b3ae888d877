"""Multiclass classification: accuracy, top-k accuracy, cross-entropy, confusion matrix."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chute.errors import ConfigError, DataError
from chute.metrics.base import (
    _EPS,
    Metric,
    _column,
    _is_list,
    _is_numeric,
)
from chute.metrics.binary import _div
from chute.metrics.state import (
    Floats,
    Ints,
    State,
    _exact_sums,
    _ratio,
    add_states,
)

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

    def column_kinds(self) -> dict[str, str]:
        return {self.label: "integer", self.score: "class scores"}

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
