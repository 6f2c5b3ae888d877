"""Keras 3 models (``.keras`` files) on whichever backend is installed.

.. code-block:: yaml

    model: {type: keras, path: model.keras, head: classifier, classes: [no, yes]}

``KERAS_BACKEND`` is honoured. When it is unset (and Keras not yet imported), chute picks
an installed backend: TensorFlow, else JAX, else PyTorch, so a Keras model runs with only
``torch`` installed, no TensorFlow. Models load with Keras' ``safe_mode`` (no Python code
from ``Lambda`` layers); ``trust_pickle: true`` turns it off.

Inputs: a single-input model gets the input columns side by side, reshaped to the model's
static input shape, as the input's type (integers as they are, checked to fit; floats as
float32, or float64 where the input is); a model with several inputs (a list, or a dict
of named inputs) gets the columns named like its inputs, or what ``feeds`` maps:
``feeds: {image: pixels, meta: [age, size]}``.

Outputs: one output is ``value`` (a plain column when it has one unit, else a float32
list); with ``head: classifier`` the output is read as class probabilities and gives
``label``, ``score`` and (more than two classes) ``proba``, like the other adapters, with
``classes`` naming the class indices and ``threshold`` cutting a one-unit sigmoid. Several
outputs are named after the model's outputs.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from chute.errors import ConfigError, ModelError
from chute.models.common import (
    FileAdapter,
    check_choice,
    check_classes,
    check_threshold,
    classify,
    feature_matrix,
    float32_rows,
)

HEADS = ("value", "classifier")
BACKENDS = (("tensorflow", "tensorflow"), ("jax", "jax"), ("torch", "torch"))


class KerasAdapter(FileAdapter):
    """A Keras 3 model from a ``.keras`` file."""

    kind: ClassVar[str] = "keras"
    extra: ClassVar[str | None] = "keras"
    OPTIONS: ClassVar[tuple[str, ...]] = ("feeds", "head", "classes", "threshold")

    @classmethod
    def check(cls, options: Mapping[str, Any]) -> None:
        super().check(options)
        check_choice(cls.kind, "head", options.get("head", "value"), HEADS)
        check_classes(options.get("classes"))
        check_threshold(options.get("threshold"))
        feeds = options.get("feeds", {})
        if not isinstance(feeds, Mapping):
            raise ConfigError(f"feeds must map model input names to columns, got {feeds!r}.")

    def load(self) -> None:
        keras = import_keras()
        self.model = keras.saving.load_model(
            self.path, compile=False, safe_mode=not self.trust_pickle
        )
        self.head = self.options.get("head", "value")
        self.classes = check_classes(self.options.get("classes"))
        self.threshold = check_threshold(self.options.get("threshold"))
        feeds = dict(self.options.get("feeds") or {})
        self.feeds = {k: [v] if isinstance(v, str) else list(v) for k, v in feeds.items()}
        structure = getattr(self.model, "input", None)
        self.named = isinstance(structure, Mapping)  # keras.Model(inputs={"a": ..., "b": ...})
        tensors = (
            list(structure.items())
            if isinstance(structure, Mapping)
            else [(t.name, t) for t in self.model.inputs]
        )
        self.input_shapes = {str(name): tuple(t.shape) for name, t in tensors}
        self.input_dtypes = {str(name): _input_dtype(t.dtype) for name, t in tensors}

    def predict(self, batch: pa.Table) -> dict[str, Any]:
        out = self.model.predict_on_batch(self._inputs(batch))
        if isinstance(out, dict):
            return {str(k): float32_rows(np.asarray(v)) for k, v in out.items()}
        if isinstance(out, (list, tuple)):
            names = list(getattr(self.model, "output_names", None) or [])
            names = names if len(names) == len(out) else [f"output_{i}" for i in range(len(out))]
            return {n: float32_rows(np.asarray(v)) for n, v in zip(names, out, strict=True)}
        if self.head == "classifier":
            return classify(np.asarray(out), self.classes, self.threshold)
        return {"value": float32_rows(np.asarray(out))}

    def _inputs(self, batch: pa.Table) -> Any:
        if len(self.input_shapes) == 1 and not self.feeds:  # the columns side by side
            ((name, shape),) = self.input_shapes.items()
            matrix = _shaped(feature_matrix(batch, self.input_dtypes[name]), shape)
            return {name: matrix} if self.named else matrix
        tensors = {}
        for name, shape in self.input_shapes.items():
            columns = self.feeds.get(name, [name])
            missing = [c for c in columns if c not in batch.column_names]
            if missing:
                raise ModelError(
                    f"Keras input {name!r} needs column(s) {missing}, not among the model's "
                    f"inputs ({', '.join(batch.column_names)}): add them or map it with feeds."
                )
            matrix = feature_matrix(batch.select(columns), self.input_dtypes[name])
            tensors[name] = _shaped(matrix, shape)
        return tensors if self.named else list(tensors.values())


def _input_dtype(kind: Any) -> np.dtype[Any]:
    """The NumPy type a model input takes: its integers as they are (ids past 2**24 were
    rounded through float32), float64 where it asks for it, else float32."""
    try:
        dtype = np.dtype(str(kind))
    except TypeError:  # bfloat16, string: float32, as before
        return np.dtype(np.float32)
    if dtype.kind in "iub" or dtype == np.float64:
        return dtype
    return np.dtype(np.float32)


def _shaped(matrix: np.ndarray, shape: tuple[Any, ...]) -> np.ndarray:
    """Reshape to a model input's static shape (its first dimension is the batch)."""
    dims = [d if isinstance(d, int) else -1 for d in shape[1:]]
    if len(dims) > 1 and dims.count(-1) <= 1:
        return matrix.reshape(len(matrix), *dims)
    return matrix


def import_keras() -> Any:
    """Import Keras, on ``KERAS_BACKEND`` or else the first installed backend."""
    if "keras" not in sys.modules and "KERAS_BACKEND" not in os.environ:
        for backend, module in BACKENDS:
            if importlib.util.find_spec(module) is not None:
                os.environ["KERAS_BACKEND"] = backend
                break
        else:
            raise ConfigError(
                "Keras needs a backend and none is installed: pip install torch (or jax, "
                "or tensorflow), e.g. pip install 'chute[keras,torch]'."
            )
    import keras

    return keras
