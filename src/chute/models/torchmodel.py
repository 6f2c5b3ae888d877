"""PyTorch models: TorchScript, ``torch.export`` programs, or a module class plus weights.

    model: {type: torch, path: mlp.ts}                                # TorchScript
    model: {type: torch, path: mlp.pt2}                               # torch.export program
    model: {type: torch, path: mlp.safetensors, module: "nets.py:MLP", kwargs: {width: 64}}
    model: {type: torch, path: mlp_state.pt, module: "nets:MLP", task: classification}

Which loader is used follows from the artifact: with ``module`` the file holds the
weights (safetensors, or a state dict read with ``weights_only=True``); without it a
``.pt2`` file or an archive holding an exported program is ``torch.export.load``-ed, and
a TorchScript archive is ``torch.jit.load``-ed. A fully pickled module
(``torch.save(model)``) runs code when it is read: it is loaded only with
``trust_pickle: true``.

Inputs: a single fixed-size-list (or fixed-shape tensor) column is used as the batch
tensor as it is (nested fixed-size lists keep their shape; ``channels_first: true`` turns
``(N, H, W, C)`` images, as the image source decodes them, into ``(N, C, H, W)``; ``uint8``
pixels become floats of ``dtype``, unscaled); otherwise the input columns
are stacked, in order, into one ``(rows, columns)`` float tensor. Inputs and model are
moved to the replica's device (``cuda`` when it holds a GPU) and cast to ``dtype``
(``float32`` unless told ``float16`` or ``bfloat16``).

Outputs (named ``<model>_<column>``):

* a 1-D output, or 2-D with one column: ``value`` (float32; integers stay integers);
  with ``task: classification`` it is a binary classifier's logit: ``logits`` (it),
  ``label`` (1 where it is positive, or its name from ``labels``: the negative class
  first) and ``score`` (the positive class's probability: its sigmoid);
* a 2-D output: ``output``, a fixed-size list of float32 (``embedding`` with
  ``task: embedding``); with ``task: classification`` instead ``logits`` (that list),
  ``label`` (the argmax, or its name from ``labels``) and ``score`` (its softmax
  probability);
* more dimensions: ``output``, the trailing dimensions flattened into a fixed-size list;
* a tuple or dict of tensors: one column per element (``output_0``, ... or the keys),
  each shaped as above.
"""

from __future__ import annotations

import os
import warnings
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chute.artifacts import local_path
from chute.errors import ConfigError, DataError, ModelError, did_you_mean
from chute.models.base import Adapter, ReplicaContext
from chute.models.common import check_choice, rename
from chute.models.pickles import trusts_pickle, untrusted_error
from chute.usercode import import_string

DTYPES = ("float32", "float16", "bfloat16")
TASKS = ("regression", "classification", "embedding")
OPTIONS = (
    "path",
    "module",
    "args",
    "kwargs",
    "strict",
    "task",
    "dtype",
    "labels",
    "outputs",
    "channels_first",
)
COMMON = ("trust_pickle",)


def check_options(kind: str, options: Mapping[str, Any], allowed: Sequence[str]) -> None:
    """Refuse an option the adapter does not know, with "Did you mean"."""
    for key in options:
        if key not in allowed and key not in COMMON:
            raise ConfigError(
                f"model type {kind!r} has no option {key!r}.{did_you_mean(key, allowed)} "
                f"Its options: {', '.join(allowed)}."
            )
    if not isinstance(options.get("path"), str) or not options["path"]:
        raise ConfigError(
            f"model type {kind!r} needs path: the model to load "
            f"(adapter({kind!r}, path=...) in Python)."
        )


class TorchAdapter(Adapter):
    """A PyTorch model on the replica's device, in eval and inference mode."""

    kind: ClassVar[str] = "torch"
    extra: ClassVar[str | None] = "torch"

    def __init__(self, context: ReplicaContext, **options: Any) -> None:
        super().__init__(context, **options)
        import torch

        self.task = check_choice(self.kind, "task", options.get("task", "regression"), TASKS)
        self.dtype = getattr(
            torch, check_choice(self.kind, "dtype", options.get("dtype", "float32"), DTYPES)
        )
        self.labels: list[Any] | None = options.get("labels")
        self.device = torch.device(context.device)
        if context.device == "cpu":
            torch.set_num_threads(context.threads)
        module = load_module(options, context.model)
        if hasattr(module, "to"):
            module = module.to(device=self.device, dtype=self.dtype)
        if hasattr(module, "eval") and not _is_exported(module):
            module.eval()
        self.module = module

    def __call__(self, batch: pa.Table) -> Mapping[str, Any]:
        import torch

        with torch.inference_mode():
            channels_first = bool(self.options.get("channels_first", False))
            tensor = to_tensor(batch, self.device, self.dtype, channels_first)
            out = self.module(tensor)
        return rename(self._columns(out), self.options.get("outputs") or {})

    def _columns(self, out: Any) -> dict[str, pa.Array]:
        if isinstance(out, Mapping):
            return {f"{k}_{c}": v for k, t in out.items() for c, v in self._columns(t).items()}
        if isinstance(out, (tuple, list)):
            return {
                f"output_{i}_{c}": v for i, t in enumerate(out) for c, v in self._columns(t).items()
            }
        return tensor_columns(out, self.task, self.labels)

    @classmethod
    def check(cls, options: Mapping[str, Any]) -> None:
        """Before anything loads: known options, and a pickled module refused unless
        ``trust_pickle``."""
        super().check(options)
        check_options(cls.kind, options, OPTIONS)
        check_choice(cls.kind, "task", options.get("task", "regression"), TASKS)
        check_choice(cls.kind, "dtype", options.get("dtype", "float32"), DTYPES)
        path = options.get("path")
        if (
            isinstance(path, str)
            and "://" not in path
            and not os.path.exists(os.path.expanduser(path))
        ):
            raise ConfigError(f"model file {path!r} does not exist: check the path.")
        if options.get("module") or not isinstance(path, str) or not os.path.isfile(path):
            return
        scripted = _is_exported_file(path) or _archive_holds(path, "/constants.pkl")
        if not scripted and not trusts_pickle(options):
            raise untrusted_error("torch", path)

    @classmethod
    def artifacts(cls, options: Mapping[str, Any]) -> Sequence[str]:
        """The weights file, and the module's source file when it is a ``file.py:Class``."""
        found = list(super().artifacts(options))
        module = str(options.get("module", ""))
        if module.partition(":")[0].endswith(".py"):
            found.append(module.partition(":")[0])
        return found


_TRAINING_ARGS = ("train", "training")
"""The names operators give the argument that makes them run as in training (dropout,
batch norm, RReLU, in every form: ``native_dropout``, ``_native_batch_norm_legit``…)."""
_RATES = ("p", "dropout")
"""The names of a dropout's rate (an LSTM's ``dropout``): at 0, training drops nothing."""


def _runs_as_training(given: Mapping[str, Any]) -> bool:
    """Whether an operator call, by the values of its arguments (``None``: not known until
    it runs), runs as in training and so depends on chance or on its batch."""
    if not any(given.get(name) is True for name in _TRAINING_ARGS):
        return False
    rate = next((given[name] for name in _RATES if name in given), None)
    return not (isinstance(rate, int | float) and rate == 0)


def _check_inference(program: Any, path: str, model: str) -> None:
    """Refuse a program exported in training mode: its dropout drops values at random and
    its batch norm normalizes by each batch, so a row's output would depend on the batch
    (an exported program keeps the flag: ``eval()`` cannot change it)."""
    for node in program.graph.nodes:
        schema = getattr(getattr(node, "target", None), "_schema", None)
        if node.op != "call_function" or schema is None:
            continue
        given = {
            a.name: node.args[i] if i < len(node.args) else node.kwargs.get(a.name)
            for i, a in enumerate(schema.arguments)
        }
        if _runs_as_training(given):
            raise _trained(path, model, schema.name, "exported")


def _check_traced(module: Any, path: str, model: str) -> None:
    """Refuse TorchScript whose dropout or batch norm was traced in training mode: tracing
    writes the flag into the graph as a constant, which ``eval()`` cannot change (a
    scripted module reads ``self.training``, which it can)."""
    graph = getattr(module, "inlined_graph", None)
    for node in graph.nodes() if graph is not None else ():
        try:
            import torch

            schema = torch._C.parse_schema(node.schema())
        except (RuntimeError, ValueError):  # no schema: not an operator call
            continue
        inputs = list(node.inputs())
        given = {
            a.name: value.toIValue() if value.node().kind() == "prim::Constant" else None
            for a, value in zip(schema.arguments, inputs, strict=False)
        }
        if _runs_as_training(given):
            raise _trained(path, model, schema.name, "traced")


def _trained(path: str, model: str, operator: str, how: str) -> ModelError:
    return ModelError(
        f"model {model!r}: {path!r} was {how} in training mode (its {operator} runs as in "
        "training, so each row's output would depend on its batch and on chance). "
        f"{'Trace' if how == 'traced' else 'Export'} it again after model.eval()."
    )


def load_module(options: Mapping[str, Any], model: str) -> Any:
    """The ``torch.nn.Module`` (or scripted / exported module) the options describe."""
    if "path" not in options:
        raise ConfigError(f"model {model!r} (torch): give `path`, the model file to load.")
    path = local_path(str(options["path"]))
    if options.get("module"):
        return _from_weights(path, options, model)
    if _is_exported_file(path):
        import torch

        program = torch.export.load(path)
        _check_inference(program, path, model)
        return program.module()
    if _archive_holds(path, "/constants.pkl"):
        import torch

        with warnings.catch_warnings():  # deprecated in favour of torch.export, still served
            warnings.simplefilter("ignore", DeprecationWarning)
            scripted = torch.jit.load(path, map_location="cpu")  # type: ignore[no-untyped-call]
        _check_traced(scripted, path, model)
        return scripted
    return _pickled(path, options, model)


def _from_weights(path: str, options: Mapping[str, Any], model: str) -> Any:

    cls = import_string(str(options["module"]))
    module = cls(*options.get("args", ()), **dict(options.get("kwargs", {})))
    state = _state_dict(path)
    try:
        keys = module.load_state_dict(state, strict=bool(options.get("strict", True)))
    except RuntimeError as exc:
        raise ModelError(
            f"model {model!r} (torch): the weights in {path!r} do not fit "
            f"{options['module']}: {exc}"
        ) from exc
    expected = module.state_dict()
    if expected and len(keys.missing_keys) == len(expected):  # strict: false, none matched
        names = ", ".join(list(state)[:3])
        raise ModelError(
            f"model {model!r} (torch): no weight in {path!r} fits {options['module']} "
            f"(its keys: {names}, …; the module's: {', '.join(list(expected)[:3])}, …), so "
            "every weight would stay as the class made it. Save the state dict of the module "
            "itself (a DataParallel or Lightning checkpoint prefixes its keys: strip "
            "'module.' or 'model.')."
        )
    return module


def _state_dict(path: str) -> Mapping[str, Any]:
    import torch

    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # the safe unpickler refuses anything but tensors and containers
        raise ConfigError(
            f"{path!r} is not a plain state dict (torch.load with weights_only=True refused "
            f"it: {exc}); save `model.state_dict()` or use safetensors."
        ) from exc
    if not isinstance(state, Mapping):
        raise ConfigError(f"{path!r} holds a {type(state).__name__}, not a state dict.")
    return state


def _pickled(path: str, options: Mapping[str, Any], model: str) -> Any:
    import torch

    if not trusts_pickle(options):
        raise untrusted_error("torch", path)
    module = torch.load(path, map_location="cpu", weights_only=False)
    if not callable(module):
        raise ConfigError(
            f"model {model!r} (torch): {path!r} holds a {type(module).__name__}, not a module; "
            "for a state dict give `module: 'pkg.mod:Net'`."
        )
    return module


def _is_exported_file(path: str) -> bool:
    return path.endswith(".pt2") or _archive_holds(path, "/archive_format")


def _archive_holds(path: str, suffix: str) -> bool:
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(name.endswith(suffix) for name in archive.namelist())


def _is_exported(module: Any) -> bool:
    """Modules from ``torch.export`` refuse ``eval()``: they were traced in inference form."""
    return type(module).__module__.startswith("torch.fx")


def to_numpy(batch: pa.Table) -> np.ndarray:
    """The batch as one array: a list/tensor column as it is, else the columns stacked."""
    if batch.num_columns == 1:
        column = batch.column(0).combine_chunks()
        if isinstance(column.type, pa.FixedShapeTensorType):
            return np.asarray(column.to_numpy_ndarray())
        if pa.types.is_fixed_size_list(column.type):
            return nested_array(column)
    return np.column_stack(
        [_float32(c, name) for c, name in zip(batch.columns, batch.column_names, strict=True)]
    ).reshape(batch.num_rows, batch.num_columns)


FLOAT32_EXACT = 2**24
"""The largest integer from which float32 holds every integer exactly."""


def _float32(column: pa.ChunkedArray, name: str) -> np.ndarray:
    """A column of the stacked float tensor; an integer float32 would round (an id of
    16,777,217 read as 16,777,216) is refused naming it: that row's error."""
    if pa.types.is_integer(column.type) and len(column) > column.null_count:
        bounds = pc.min_max(column)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if max(abs(low), abs(high)) > FLOAT32_EXACT:
            value = high if abs(high) >= abs(low) else low
            raise DataError(
                f"column {name!r} holds {value:,}, which the stacked float32 input rounds "
                f"(integers beyond 2**24 are not all exact in float32): give such a column "
                "as its own tensor input (a fixed-size list keeps its integer type), or "
                "scale it in a preprocess step."
            )
    return np.asarray(column.to_numpy(), dtype=np.float32)


def nested_array(column: pa.Array) -> np.ndarray:
    shape = [len(column)]
    values = column
    while pa.types.is_fixed_size_list(values.type):
        shape.append(values.type.list_size)
        values = values.flatten()
    return np.asarray(values.to_numpy(zero_copy_only=False)).reshape(shape)


def to_tensor(batch: pa.Table, device: Any, dtype: Any, channels_first: bool = False) -> Any:
    """The batch as a tensor on ``device``. Floating and ``uint8`` (image) inputs are cast
    to ``dtype``; other integers (token ids) are kept. ``channels_first`` turns
    ``(N, H, W, C)`` images into ``(N, C, H, W)``."""
    import torch

    array = np.ascontiguousarray(to_numpy(batch))
    tensor = torch.from_numpy(array if array.flags.writeable else array.copy())
    if tensor.is_floating_point() or tensor.dtype == torch.uint8:
        tensor = tensor.to(device=device, dtype=dtype)
    else:
        tensor = tensor.to(device=device)
    if channels_first and tensor.ndim == 4:
        tensor = tensor.permute(0, 3, 1, 2).contiguous()
    return tensor


def tensor_columns(out: Any, task: str, labels: Sequence[Any] | None = None) -> dict[str, pa.Array]:
    """Output columns for one output tensor (see the module docstring)."""
    import torch

    tensor = out.detach().cpu()
    array = tensor.float().numpy() if tensor.is_floating_point() else tensor.numpy()
    one = array.ndim == 1 or (array.ndim == 2 and array.shape[1] == 1)
    if one and task == "classification" and tensor.is_floating_point():
        return _binary_columns(array.reshape(-1), labels)  # a softmax of one is always 1
    if one:
        return {"value": pa.array(array.reshape(-1))}
    values = fixed_size_list(array.reshape(array.shape[0], -1))
    if task == "embedding":
        return {"embedding": values}
    if task != "classification" or array.ndim != 2:
        return {"output": values}
    probs = torch.softmax(tensor.float(), dim=1).numpy()
    index = probs.argmax(axis=1)
    score = pa.array(probs[np.arange(len(index)), index].astype(np.float32))
    label = pa.array([labels[i] for i in index]) if labels else pa.array(index.astype(np.int64))
    return {"logits": values, "label": label, "score": score}


def _binary_columns(logit: np.ndarray, labels: Sequence[Any] | None) -> dict[str, pa.Array]:
    """One logit a row (a binary classifier): ``label`` 1 where it is positive, ``score``
    the positive class's probability (its sigmoid), as every binary classifier's."""
    if labels is not None and len(labels) != 2:
        raise ModelError(
            f"a classifier with one output (a logit) has two classes, but labels lists "
            f"{len(labels)}: give two names, the negative class first."
        )
    score = (1.0 / (1.0 + np.exp(-logit.astype(np.float64)))).astype(np.float32)
    index = (logit > 0).astype(np.int64)
    label = pa.array([labels[i] for i in index]) if labels else pa.array(index)
    return {"logits": pa.array(logit.astype(np.float32)), "label": label, "score": pa.array(score)}


def pad_lists(column: pa.Array, value: int) -> tuple[np.ndarray, np.ndarray]:
    """Variable-length id lists → a right-padded ``(rows, longest)`` int64 array and its
    mask (1 where a row has a token)."""
    import pyarrow.compute as pc

    lengths = pc.list_value_length(column).fill_null(0).to_numpy()
    mask = np.arange(int(lengths.max(initial=0)))[None, :] < lengths[:, None]
    ids = np.full(mask.shape, value, dtype=np.int64)
    ids[mask] = column.flatten().to_numpy(zero_copy_only=False)
    return ids, mask.astype(np.int64)


def fixed_size_list(matrix: np.ndarray) -> pa.FixedSizeListArray:
    """A ``(rows, width)`` array as a fixed-size list column of float32."""
    flat = pa.array(np.ascontiguousarray(matrix, dtype=np.float32).reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, matrix.shape[1])
