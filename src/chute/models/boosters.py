"""Gradient-boosted trees from their native model files: XGBoost and LightGBM.

.. code-block:: yaml

    model: {type: xgboost, path: model.json, threshold: 0.3}
    model: {type: lightgbm, path: model.txt, classes: [cat, dog, fish]}

The outputs follow the model's objective:

- binary (XGBoost ``binary:*``, LightGBM ``binary`` / ``cross_entropy``): ``score`` (the
  probability, or the margin for ``binary:logitraw``) and ``label`` (1 when ``score`` is
  above 0.5, or at least ``threshold`` when one is given, or 0 for a margin);
- multiclass with probabilities (``multi:softprob``, ``multiclass``, ``multiclassova``):
  ``label`` (the argmax), ``score`` (its probability) and ``proba`` (a float32 list, one per
  class); ``multi:softmax`` gives ``label`` only;
- anything else (regression, counts, ranking): ``value``.

Labels are class indices, or the names in ``classes`` (index order). Features are matched
by name when the model file names them, else by position (also when the inputs have none
of the names); inputs that have some of the names but lack others are refused. A model
saved by XGBoost's scikit-learn wrapper (pickled, or its ``.json``) predicts with the trees
up to its early-stopping best iteration, and a pickled wrapper's ``missing`` value, as the
wrapper's ``predict`` does; a booster of ``xgboost.train`` predicts with all its trees, as
``Booster.predict`` does. Features trained as pandas categories are given as categories of
their values, which the library codes by those its file stores.
XGBoost and LightGBM run with the replica's CPU count as threads; XGBoost predicts on the
GPU when the replica holds one. Files are native (``.json``/``.ubj`` for XGBoost, ``.txt``
for LightGBM); pickled scikit-learn wrappers (``XGBClassifier``, ``LGBMClassifier``) load
only with ``trust_pickle: true``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from chute.errors import ConfigError, ModelError, ResourceError
from chute.models.common import (
    FileAdapter,
    check_classes,
    check_threshold,
    classify,
    feature_matrix,
    ordered_by_names,
)
from chute.models.pickles import is_pickle, load_pickle

BOOSTER_OUTPUTS = ("label", "score", "proba", "value")


class _Booster(FileAdapter):
    OPTIONS: ClassVar[tuple[str, ...]] = ("threshold", "classes")
    OUTPUTS: ClassVar[tuple[str, ...]] = BOOSTER_OUTPUTS
    task: str = "value"
    """``binary``, ``multiclass``, ``softmax`` (labels only) or ``value``."""
    dtype: Any = np.float64
    """What the framework compares thresholds in: a cast must not move a row across one."""

    @classmethod
    def check(cls, options: Mapping[str, Any]) -> None:
        super().check(options)
        check_threshold(options.get("threshold"))
        check_classes(options.get("classes"))

    def load(self) -> None:
        self.classes: list[Any] | None = check_classes(self.options.get("classes"))
        self.threshold = check_threshold(self.options.get("threshold"))
        self.missing = np.nan
        """The value that stands for a missing feature (a wrapper's ``missing``)."""
        if is_pickle(self.path):
            self._from_wrapper(load_pickle(self.kind, self.path, self.options))
        else:
            self._from_file()

    def _from_file(self) -> None:
        raise NotImplementedError

    def _from_wrapper(self, model: Any) -> None:
        raise NotImplementedError

    def _raw(self, features: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _names(self) -> list[str] | None:
        raise NotImplementedError

    categorical: tuple[int, ...] = ()
    """The features the model splits on as categories (trained from pandas ``category``
    columns): given as pandas categories, which the library codes by the categories it
    stored at training, as it does for a user's frame. Their values taken as numbers were
    read as category codes: every row an unseen category's score."""

    def predict(self, batch: pa.Table) -> dict[str, Any]:
        table = ordered_by_names(batch, self._names())
        out = np.asarray(
            self._raw(self._frame(table) if self.categorical else feature_matrix(table, self.dtype))
        )
        if self.task == "binary":
            threshold = self.threshold if self.threshold is not None else self._cut()
            return classify(out, self.classes, threshold)
        if self.task == "multiclass":
            return classify(out, self.classes, self.threshold)
        if self.task == "softmax":
            index = out.astype(np.int64)
            return {"label": np.asarray(self.classes)[index] if self.classes else index}
        return {"value": out}

    def _cut(self) -> float | None:
        return None  # a probability: the positive class when it is above 0.5

    def _frame(self, table: pa.Table) -> Any:
        """The features as a pandas frame: categorical ones as pandas categories of their
        values (a null is a missing value), the others as numbers."""
        import pandas as pd

        if max(self.categorical) >= table.num_columns:
            return feature_matrix(table, self.dtype)  # too few columns: _raw names the count
        columns: dict[str, Any] = {}
        for i, name in enumerate(table.column_names):
            column = table.column(i)
            if i in self.categorical:
                if pa.types.is_dictionary(column.type):
                    column = column.cast(column.type.value_type)
                # Python's values: an int64 column with a null stays ints (through pandas it
                # became floats, which XGBoost refuses as categories)
                columns[name] = pd.Categorical(column.to_pylist())
            else:
                columns[name] = feature_matrix(table.select([i]), self.dtype)[:, 0]
        return pd.DataFrame(columns)


class XGBoostAdapter(_Booster):
    """An XGBoost booster from a ``.json`` / ``.ubj`` model file."""

    kind: ClassVar[str] = "xgboost"
    extra: ClassVar[str | None] = "xgboost"
    dtype = np.float32  # XGBoost splits on float32 values

    def _from_file(self) -> None:
        import xgboost

        self.booster = xgboost.Booster()
        try:
            self.booster.load_model(self.path)
        except xgboost.core.XGBoostError as exc:  # its message ends in a C++ stack trace
            reason = str(exc).split("Stack trace:")[0].strip().splitlines()[-1:]
            raise ConfigError(
                f"{self.path!r} is not an XGBoost model file ({' '.join(reason)}): save one "
                "with booster.save_model('model.json') (or .ubj)."
            ) from exc
        self._setup()

    def _from_wrapper(self, model: Any) -> None:
        if not hasattr(model, "get_booster"):
            raise ModelError(f"{self.path!r} holds a {type(model).__name__}, not an XGBoost model.")
        self.booster = model.get_booster()
        if self.classes is None and getattr(model, "classes_", None) is not None:
            self.classes = list(model.classes_)
        missing = getattr(model, "missing", np.nan)
        self.missing = np.nan if missing is None else float(missing)
        self._setup()

    def _setup(self) -> None:
        # What the scikit-learn wrapper's predict uses (pickled, or saved by it: its
        # file says so): the trees up to the best iteration of early stopping. A
        # booster of xgboost.train predicts with all its trees, as Booster.predict does.
        best = self.booster.attr("best_iteration")
        wrapped = is_pickle(self.path) or self.booster.attr("scikit_learn") is not None
        self.trees = (0, int(best) + 1) if best is not None and wrapped else (0, 0)
        params: dict[str, Any] = {"nthread": self.context.threads}
        if self.context.device == "cuda":
            _check_xgboost_cuda(self.context.model)
            params["device"] = "cuda"
        self.booster.set_param(params)
        types = self.booster.feature_types or []
        categorical = tuple(i for i, kind in enumerate(types) if kind == "c")
        self.categorical = categorical if categorical and _stores_categories(self.booster) else ()
        config = json.loads(self.booster.save_config())
        self.objective = str(config["learner"]["objective"]["name"])
        self.task = _xgboost_task(self.objective)

    def _names(self) -> list[str] | None:
        names = self.booster.feature_names
        return list(names) if names else None

    def _raw(self, features: Any) -> np.ndarray:
        self._check_width(features.shape[1], self.booster.num_features())
        predicted = self.booster.inplace_predict(
            features, iteration_range=self.trees, missing=self.missing, validate_features=False
        )
        return np.asarray(predicted)

    def _cut(self) -> float | None:
        return 0.0 if self.objective == "binary:logitraw" else None

    def _check_width(self, got: int, want: int) -> None:
        if got != want:
            raise ModelError(
                f"{self.path!r} expects {want} features but the model's inputs give {got}: "
                "list the features the model was trained on, in order, as its inputs."
            )


def _stores_categories(booster: Any) -> bool:
    """Whether an XGBoost model stores the categories it was trained on (3.1+, trained on
    pandas categories); one trained on codes (arrays) stores none, and takes codes."""
    get = getattr(booster, "get_categories", None)
    if get is None:
        return False
    try:
        return not get(export_to_arrow=True).empty()
    except Exception:  # a release without them: codes, as before
        return False


def _check_xgboost_cuda(model: str) -> None:
    """XGBoost without CUDA would quietly predict on the CPU: say so instead."""
    import xgboost

    if not xgboost.build_info().get("USE_CUDA"):
        raise ResourceError(
            f"model {model!r} asks for a GPU, but this xgboost was built without CUDA (the "
            "xgboost-cpu wheel): pip install xgboost, or set the model's gpus: 0."
        )


def _xgboost_task(objective: str) -> str:
    if objective.startswith("binary:"):
        return "binary"
    if objective == "multi:softprob":
        return "multiclass"
    if objective == "multi:softmax":
        return "softmax"
    return "value"


class LightGBMAdapter(_Booster):
    """A LightGBM booster from a ``.txt`` model file."""

    kind: ClassVar[str] = "lightgbm"
    extra: ClassVar[str | None] = "lightgbm"

    def _from_file(self) -> None:
        import lightgbm

        try:
            self.booster = lightgbm.Booster(model_file=self.path)
        except lightgbm.basic.LightGBMError as exc:
            raise ConfigError(
                f"{self.path!r} is not a LightGBM model file ({exc}): save one with "
                "booster.save_model('model.txt')."
            ) from exc
        self._setup()

    def _from_wrapper(self, model: Any) -> None:
        booster = getattr(model, "booster_", model)
        if not hasattr(booster, "feature_name"):
            raise ModelError(f"{self.path!r} holds a {type(model).__name__}, not a LightGBM model.")
        self.booster = booster
        if self.classes is None and getattr(model, "classes_", None) is not None:
            self.classes = list(model.classes_)
        self._setup()

    def _setup(self) -> None:
        self.task = _lightgbm_task(_lightgbm_objective(self.booster, self.path))
        self.categorical = _lightgbm_categorical(self.booster, self.path)

    def _names(self) -> list[str] | None:
        return list(self.booster.feature_name())

    def _raw(self, features: Any) -> np.ndarray:
        want = self.booster.num_feature()
        if features.shape[1] != want:
            raise ModelError(
                f"{self.path!r} expects {want} features but the model's inputs give "
                f"{features.shape[1]}: list the features it was trained on as its inputs."
            )
        return np.asarray(self.booster.predict(features, num_threads=self.context.threads))


def _lightgbm_objective(booster: Any, path: str) -> str:
    """The objective's name: from the loaded parameters, else the model file's header."""
    objective = (getattr(booster, "params", None) or {}).get("objective")
    if objective:
        return str(objective).split()[0]
    with open(path) as f:
        for line in f:
            if line.startswith("objective="):
                return line.split("=", 1)[1].split()[0]
            if line.startswith("Tree="):
                break
    return "regression"


def _lightgbm_categorical(booster: Any, path: str) -> tuple[int, ...]:
    """The features a model trained on a pandas frame took as categories (its
    ``pandas_categorical``; LightGBM codes them by those categories when given a frame);
    ``()`` for one trained on arrays, whose category features are given as codes."""
    if not getattr(booster, "pandas_categorical", None):
        return ()
    text = booster.model_to_string()
    found = re.search(r"^\[categorical_feature: ([0-9,]*)\]$", text, re.M)
    indices = tuple(int(i) for i in found.group(1).split(",") if i) if found else ()
    # The categories belong to the frame's category columns, which the file does not name:
    # taken as its categorical features, each one's codes must fit its categories (an int
    # column named categorical by index beside a category column the model took as numbers)
    ranges = re.search(r"^feature_infos=(.*)$", text, re.M)
    infos = ranges.group(1).split() if ranges else []
    names = booster.feature_name()
    fits = len(indices) == len(booster.pandas_categorical) and all(
        i < len(infos) and _largest_code(infos[i]) < len(categories)
        for i, categories in zip(indices, booster.pandas_categorical, strict=False)
    )
    if not fits:
        raise ConfigError(
            f"{path!r} stores the categories of {len(booster.pandas_categorical)} pandas "
            "category column(s) and splits on "
            f"{[names[i] for i in indices if i < len(names)]} as categorical, and does not "
            "say which columns the categories belong to: chute cannot code them as LightGBM "
            "did. Train with categorical_feature='auto' on a pandas frame, or on codes "
            "without pandas categories."
        )
    return indices


def _largest_code(info: str) -> float:
    """The largest value of a LightGBM ``feature_infos`` entry: ``[min:max]`` for a numeric
    feature, ``a:b:c`` (its codes) for a categorical one, ``none`` for an unused one."""
    values = [float(v) for v in info.strip("[]").split(":") if v not in ("", "none")]
    return max(values, default=0.0)


def _lightgbm_task(objective: str) -> str:
    if objective in ("binary", "cross_entropy", "xentropy"):
        return "binary"
    if objective in ("multiclass", "softmax", "multiclassova", "multiclass_ova", "ova", "ovr"):
        return "multiclass"
    return "value"
