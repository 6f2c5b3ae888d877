"""scikit-learn estimators and pipelines, from skops files (or trusted pickles).

.. code-block:: yaml

    model: {type: sklearn, path: clf.skops, method: predict_proba}

``method`` (default ``auto``: ``predict_proba`` for a classifier that has it, else
``predict``, else ``transform``) decides the outputs:

- ``predict_proba`` → ``label``, ``score`` (binary: probability of ``classes_[1]``;
  multiclass: probability of ``label``), and ``proba`` (float32 list in ``classes_`` order)
  for more than two classes; ``threshold`` cuts binary labels at a probability;
- ``decision_function`` → ``label`` and ``score`` (binary) or ``scores`` (a float32 list);
- ``predict`` → ``label`` for classifiers and clusterers (a list per row for one fitted
  on several labels a row, which ``auto`` picks ``predict`` for), ``value`` for regressors;
- ``transform`` → ``features``, a float32 list.

A ``.skops`` file loads with :func:`skops.io.load`: the types skops trusts and
scikit-learn's own classes load; any other type must be listed in ``trusted``. Any other
file is read with joblib, which runs code from the file: it needs ``trust_pickle: true``.
The estimator gets a DataFrame when it was fitted on one (``feature_names_in_``), its
columns picked by name, else a 2-D array of the input columns (``input_format`` forces
``numpy`` or ``pandas``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from chute.errors import ConfigError, ModelError
from chute.models.common import (
    FileAdapter,
    check_choice,
    check_threshold,
    classify,
    feature_matrix,
    float32_rows,
    renamed,
)
from chute.models.pickles import is_pickle, load_pickle, untrusted_error

_OTHER_KINDS = ((".json", "xgboost"), (".ubj", "xgboost"), (".txt", "lightgbm"), (".onnx", "onnx"))
"""The adapter a model file of these names is likely for."""
METHODS = ("auto", "predict", "predict_proba", "decision_function", "transform")
INPUT_FORMATS = ("auto", "numpy", "pandas")


class SklearnAdapter(FileAdapter):
    """A scikit-learn estimator (or pipeline) saved with skops, or a trusted pickle."""

    kind: ClassVar[str] = "sklearn"
    extra: ClassVar[str | None] = "sklearn"
    OPTIONS: ClassVar[tuple[str, ...]] = ("method", "threshold", "trusted", "input_format")
    OUTPUTS: ClassVar[tuple[str, ...]] = ("label", "score", "scores", "proba", "value", "features")

    @classmethod
    def check(cls, options: Mapping[str, Any]) -> None:
        super().check(options)
        check_choice(cls.kind, "method", options.get("method", "auto"), METHODS)
        check_choice(cls.kind, "input_format", options.get("input_format", "auto"), INPUT_FORMATS)
        check_threshold(options.get("threshold"))
        trusted = options.get("trusted", [])
        if not isinstance(trusted, list) or not all(isinstance(t, str) for t in trusted):
            raise ConfigError(f"trusted must be a list of type names, got {trusted!r}.")
        path = str(options["path"])
        if not path.endswith(".skops") and os.path.isfile(path) and not is_pickle(path):
            other = next((k for ends, k in _OTHER_KINDS if path.lower().endswith(ends)), None)
            raise ConfigError(
                f"model artifact {path!r} is neither a .skops file nor a pickle: type sklearn "
                "reads an estimator saved with skops.io.dump (or with joblib, given "
                "trust_pickle: true)." + (f" For this file, use type: {other}." if other else "")
            )
        if not path.endswith(".skops") and not options.get("trust_pickle", False):
            raise untrusted_error(cls.kind, path)

    @classmethod
    def list_outputs(cls, options: Mapping[str, Any]) -> list[str]:
        """``transform`` gives ``features``, a list per row."""
        return renamed(["features"], options) if options.get("method") == "transform" else []

    def load(self) -> None:
        self.estimator = _load_estimator(self.path, self.options)
        self.method = _choose_method(self.estimator, self.options.get("method", "auto"))
        self.threshold = check_threshold(self.options.get("threshold"))
        self.names = _feature_names(self.estimator, self.options.get("input_format", "auto"))

    def predict(self, batch: pa.Table) -> dict[str, Any]:
        out = getattr(self.estimator, self.method)(self._features(batch))
        if self.method == "predict_proba":
            return classify(out, self.estimator.classes_, self.threshold)
        if self.method == "decision_function":
            return _decisions(np.asarray(out), self.estimator.classes_)
        if self.method == "transform":
            return {"features": float32_rows(_dense(out))}
        if _is_classifier(self.estimator):
            return {"label": np.asarray(out)}
        return {"value": np.asarray(out)}

    def _features(self, batch: pa.Table) -> Any:
        if self.names is None:
            return feature_matrix(batch)
        missing = [n for n in self.names if n not in batch.column_names]
        if missing:
            raise ModelError(
                f"the estimator was fitted on columns {self.names}, but the model's inputs "
                f"lack {missing}: add them to the model's inputs."
            )
        return batch.select(self.names).to_pandas()


def _load_estimator(path: str, options: Mapping[str, Any]) -> Any:
    if not path.endswith(".skops") or is_pickle(path):  # a trusted pickle, whatever its name
        return load_pickle(SklearnAdapter.kind, path, options)
    import skops.io

    found = skops.io.get_untrusted_types(file=path)
    allowed = options.get("trusted", [])
    untrusted = [t for t in found if not t.startswith("sklearn.") and t not in allowed]
    if untrusted:
        raise ConfigError(
            f"skops file {path!r} holds types that are not trusted: {', '.join(untrusted)}. "
            "Loading them may run their code: if you trust them, list them in the model's "
            f"trusted option (trusted: [{', '.join(untrusted)}])."
        )
    return skops.io.load(path, trusted=found)  # scikit-learn's own, and those listed


def _choose_method(estimator: Any, method: str) -> str:
    several = _is_classifier(estimator) and _several_labels(estimator)
    if method == "auto":
        if _is_classifier(estimator) and hasattr(estimator, "predict_proba") and not several:
            return "predict_proba"
        return "predict" if hasattr(estimator, "predict") else "transform"
    if several and method in ("predict_proba", "decision_function"):
        raise ConfigError(
            f"{type(estimator).__name__} was fitted on several labels a row (multi-label or "
            f"multi-output): its {method}() scores each label on its own, not one class "
            "among classes_, so no label or score can be drawn from it. Use method: "
            "predict (each row's labels, as a list)."
        )
    if not hasattr(estimator, method):
        raise ConfigError(
            f"{type(estimator).__name__} has no {method}(): choose a method it has "
            f"({', '.join(m for m in METHODS[1:] if hasattr(estimator, m))})."
        )
    return method


def _several_labels(estimator: Any) -> bool:
    """Whether a classifier (a pipeline's last step, a search's best estimator) was fitted
    on several labels a row:
    its classes are a list (trees, forests, MultiOutputClassifier), it has several outputs
    (k-neighbours), or it binarized a label indicator matrix (MLPClassifier, one-vs-rest)."""
    final = estimator
    for _ in range(10):  # a pipeline's last step, a search's best estimator, nested
        inner = final.steps[-1][1] if hasattr(final, "steps") else None
        inner = getattr(final, "best_estimator_", inner)
        if inner is None:
            break
        final = inner
    if isinstance(getattr(final, "classes_", None), list):
        return True
    if getattr(final, "n_outputs_", 1) > 1 or getattr(final, "outputs_2d_", False):
        return True
    if getattr(final, "multilabel_", False) is True:
        return True
    binarizer = getattr(final, "_label_binarizer", None)
    return getattr(binarizer, "y_type_", "") == "multilabel-indicator"


def _is_classifier(estimator: Any) -> bool:
    from sklearn.base import is_classifier

    try:
        from sklearn.base import is_clusterer
    except ImportError:  # scikit-learn < 1.6
        return bool(is_classifier(estimator) or estimator._estimator_type == "clusterer")
    return bool(is_classifier(estimator) or is_clusterer(estimator))


def _feature_names(estimator: Any, input_format: str) -> list[str] | None:
    names = getattr(estimator, "feature_names_in_", None)
    if input_format == "numpy" or (input_format == "auto" and names is None):
        return None
    if names is None:
        raise ConfigError(
            f"input_format: pandas needs an estimator fitted on a DataFrame, but "
            f"{type(estimator).__name__} has no feature_names_in_."
        )
    return [str(n) for n in names]


def _decisions(scores: np.ndarray, classes: np.ndarray) -> dict[str, Any]:
    """What ``predict`` does with decision values: the sign (binary) or the argmax."""
    if scores.ndim == 1:
        return {"label": classes[(scores > 0).astype(np.int64)], "score": scores}
    return {
        "label": classes[np.argmax(scores, axis=1)],
        "scores": np.ascontiguousarray(scores, dtype=np.float32),
    }


def _dense(values: Any) -> np.ndarray:
    return np.asarray(values.toarray() if hasattr(values, "toarray") else values)
