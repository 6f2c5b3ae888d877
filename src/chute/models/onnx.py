"""ONNX models on ONNX Runtime, on the replica's device and with its CPU count as threads.

.. code-block:: yaml

    model: {type: onnx, path: model.onnx}
    resources: {gpus: 1}               # CUDAExecutionProvider, or a clear error without it

Inputs: a graph with one input gets the model's input columns side by side (fixed-size
list columns spread into their values), cast to the input's element type and reshaped to
its static shape (``[N, 3, 32, 32]`` from a 3,072-value list column). A graph with several
inputs gets the columns named like its inputs, or what ``feeds`` says:
``feeds: {input_ids: ids, dense: [x1, x2]}``.

Outputs are named after the graph's outputs (``output_label``, ``output_probability``;
characters other than letters, digits and ``_`` become ``_``), renamed or dropped with
``outputs: {output_probability: proba, output_label: null}``. A ``(N, 1)`` output becomes
a plain column, a ``(N, k)`` float output a float32 list, higher ranks are flattened per
row, and scikit-learn's ZipMap (a list of dicts) becomes a float32 list in class order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from chute.errors import ConfigError, DataError, ModelError, ResourceError, did_you_mean
from chute.models.common import FileAdapter, feature_matrix, float32_rows, rename

_TYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int16)": np.int16,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
    "tensor(string)": np.object_,
}


class OnnxAdapter(FileAdapter):
    """An ONNX graph run by ONNX Runtime (CUDA when the replica holds a GPU, else CPU)."""

    kind: ClassVar[str] = "onnx"
    extra: ClassVar[str | None] = "onnx"
    OPTIONS: ClassVar[tuple[str, ...]] = ("feeds",)

    @classmethod
    def check(cls, options: Mapping[str, Any]) -> None:
        super().check(options)
        feeds = options.get("feeds", {})
        if not isinstance(feeds, Mapping) or not all(
            isinstance(v, str) or (isinstance(v, list) and all(isinstance(c, str) for c in v))
            for v in feeds.values()
        ):
            raise ConfigError(
                f"feeds must map graph input names to a column or a list of columns, got {feeds!r}."
            )

    def load(self) -> None:
        import onnxruntime

        settings = onnxruntime.SessionOptions()
        settings.intra_op_num_threads = self.context.threads
        settings.inter_op_num_threads = 1
        providers = self._providers(onnxruntime.get_available_providers())
        self.session = onnxruntime.InferenceSession(self.path, settings, providers=providers)
        if providers[0] not in self.session.get_providers():
            raise ResourceError(
                f"model {self.context.model!r}: onnxruntime could not start {providers[0]} "
                f"(it runs on {', '.join(self.session.get_providers())}): check the CUDA and "
                "cuDNN libraries onnxruntime-gpu needs, or set gpus: 0."
            )
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.feeds = self._check_feeds(dict(self.options.get("feeds") or {}))
        graph_outputs = [o.name for o in self.session.get_outputs()]
        self._check_outputs(graph_outputs)
        self.fetch = [n for n in graph_outputs if self.renames.get(n, n) is not None]

    def _providers(self, available: Sequence[str]) -> list[str]:
        if self.context.device != "cuda":
            return ["CPUExecutionProvider"]
        if "CUDAExecutionProvider" not in available:
            raise ResourceError(
                f"model {self.context.model!r} asks for a GPU, but this onnxruntime has no "
                f"CUDAExecutionProvider (it has {', '.join(available)}): pip install "
                "onnxruntime-gpu in place of onnxruntime, or set the model's gpus: 0."
            )
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]

    def _check_feeds(self, feeds: dict[str, Any]) -> dict[str, list[str]]:
        for name in feeds:
            if name not in self.inputs:
                raise ConfigError(
                    f"feeds: the graph has no input {name!r}.{did_you_mean(name, self.inputs)} "
                    f"Its inputs: {', '.join(self.inputs)}."
                )
        return {k: [v] if isinstance(v, str) else list(v) for k, v in feeds.items()}

    def _check_outputs(self, graph_outputs: list[str]) -> None:
        for name in self.renames:
            if name not in graph_outputs:
                raise ConfigError(
                    f"outputs: the graph has no output {name!r}."
                    f"{did_you_mean(name, graph_outputs)} Its outputs: {', '.join(graph_outputs)}."
                )

    def __call__(self, batch: pa.Table) -> Mapping[str, Any]:
        out = rename(self.predict(batch), self.renames)
        return {_identifier(name): values for name, values in out.items()}

    def predict(self, batch: pa.Table) -> dict[str, Any]:
        values = self.session.run(self.fetch, self._feed(batch))
        return {name: _column(v) for name, v in zip(self.fetch, values, strict=True)}

    def _feed(self, batch: pa.Table) -> dict[str, np.ndarray]:
        if self.feeds:
            columns = self.feeds
        elif len(self.inputs) == 1:
            columns = {next(iter(self.inputs)): batch.column_names}
        else:
            columns = {name: [name] for name in self.inputs}
        feed = {}
        for name, cols in columns.items():
            missing = [c for c in cols if c not in batch.column_names]
            if missing:
                raise ModelError(
                    f"graph input {name!r} needs column(s) {missing}, which are not among the "
                    f"model's inputs ({', '.join(batch.column_names)}): add them, or map the "
                    "graph's inputs to columns with feeds: {input: column}."
                )
            feed[name] = _tensor(batch.select(cols), self.inputs[name])
        return feed


def _refuse_nulls(table: pa.Table, graph_input: Any) -> None:
    """A text or bool graph input has no missing value: a null would reach the graph as
    the text "None" (an unseen category, predicted on in silence) or as False."""
    for name in table.column_names:
        column = table.column(name)
        if column.null_count:
            row = column.is_null().index(True).as_py()
            raise DataError(
                f"column {name!r} holds a null at row {row} of the batch, and graph input "
                f"{graph_input.name!r} ({graph_input.type}) has no missing value: fill such "
                "rows in a preprocess step, or set on_error: quarantine to set them aside."
            )


def _tensor(table: pa.Table, graph_input: Any) -> np.ndarray:
    """Columns → the graph input's element type and static shape."""
    dtype = _TYPES.get(graph_input.type)
    if dtype is None:
        raise ModelError(
            f"graph input {graph_input.name!r} has type {graph_input.type}: unsupported."
        )
    shape = list(graph_input.shape)
    if table.num_columns == 1 and isinstance(table.column(0).type, pa.FixedShapeTensorType):
        return _image_tensor(table.column(0), shape, graph_input.name).astype(dtype, copy=False)
    if np.dtype(dtype).kind in "bOSU":  # None became the text "None", or False
        _refuse_nulls(table, graph_input)
    matrix = feature_matrix(table, dtype)
    if len(shape) == 1:
        return matrix.reshape(-1)
    static = [d if isinstance(d, int) else -1 for d in shape[1:]]
    if len(shape) > 2 and static.count(-1) <= 1:
        return matrix.reshape(len(matrix), *static)
    return matrix


def _image_tensor(column: pa.ChunkedArray, shape: list[Any], name: str) -> np.ndarray:
    """An image column ``(N, H, W, C)`` for a graph that takes it channels-last as it is, or
    channels-first (``(N, C, H, W)``, as torch exports) transposed."""
    images = np.asarray(column.combine_chunks().to_numpy_ndarray())
    if images.ndim == 3:
        images = images[..., np.newaxis]  # mode L: one channel
    wanted = [d if isinstance(d, int) else None for d in shape[1:]]

    def fits(dims: tuple[int, ...]) -> bool:
        if len(wanted) != len(dims):
            return False
        return all(w in (None, d) for w, d in zip(wanted, dims, strict=True))

    _, height, width, channels = images.shape
    if fits((height, width, channels)):
        return images
    if fits((channels, height, width)):
        return np.ascontiguousarray(images.transpose(0, 3, 1, 2))
    raise ModelError(
        f"graph input {name!r} has shape {shape}, but the images are {list(images.shape)} "
        "(rows, height, width, channels): set the source's size and mode to match the model."
    )


def _column(values: Any) -> Any:
    """A graph output as a column (see the module docstring)."""
    if isinstance(values, list) and values and isinstance(values[0], dict):
        return np.array([list(row.values()) for row in values], dtype=np.float32)
    return float32_rows(np.asarray(values))


def _identifier(name: str) -> str:
    return re.sub(r"\W", "_", name)
