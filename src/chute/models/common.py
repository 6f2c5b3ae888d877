"""What the file-based adapters (sklearn, boosters, ONNX, Keras) share.

Every such adapter takes ``path`` (resolved through :func:`chute.artifacts.local_path`),
``outputs`` (a mapping that renames output columns, ``null`` drops one) and
``trust_pickle``; its options are checked when the job is planned, before anything loads.
Conventions for what comes out (the model's name prefixes each column):

- classification: ``label`` (the class), ``score`` (binary: the probability of the
  positive class; multiclass: the probability of ``label``), and for more than two classes
  ``proba``, a fixed-size list of float32, one per class in the model's class order;
- regression: ``value``;
- features / embeddings / raw tensors: fixed-size lists of float32.
"""

from __future__ import annotations

import numbers
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from chute.artifacts import local_path
from chute.errors import ChuteError, ConfigError, DataError, ModelError, did_you_mean
from chute.models.base import Adapter, ReplicaContext
from chute.models.pickles import refuse_untrusted, trusts_pickle

COMMON_OPTIONS = ("path", "outputs", "trust_pickle")


class FileAdapter(Adapter):
    """An adapter that loads one model file (``path``) and names its outputs.

    Subclasses list their own ``OPTIONS`` and the ``OUTPUTS`` they can produce (empty when
    the names come from the model file), load in :meth:`load` and predict in
    :meth:`predict`.
    """

    OPTIONS: ClassVar[tuple[str, ...]] = ()
    OUTPUTS: ClassVar[tuple[str, ...]] = ()

    def __init__(self, context: ReplicaContext, **options: Any) -> None:
        self.check(options)
        super().__init__(context, **options)
        self.path = local_path(str(options["path"]))
        refuse_untrusted(self.kind, self.path, options)  # a remote file, now it is here
        self.trust_pickle = trusts_pickle(options)
        self.renames: dict[str, str | None] = dict(options.get("outputs") or {})
        self.load()

    def load(self) -> None:
        """Load the model from ``self.path`` (once per replica)."""
        raise NotImplementedError

    def predict(self, batch: pa.Table) -> dict[str, Any]:
        """Output columns (unprefixed, before renames) for one batch."""
        raise NotImplementedError

    def __call__(self, batch: pa.Table) -> Mapping[str, Any]:
        return rename(self.predict(batch), self.renames)

    @classmethod
    def check(cls, options: Mapping[str, Any]) -> None:
        """Refuse bad options, a missing file and an untrusted pickle, before anything runs."""
        allowed = (*COMMON_OPTIONS, *cls.OPTIONS)
        for key in options:
            if key not in allowed:
                raise ConfigError(
                    f"model type {cls.kind!r} has no option {key!r}."
                    f"{did_you_mean(key, allowed)} Its options: {', '.join(allowed)}."
                )
        path = options.get("path")
        if not isinstance(path, str) or not path:
            raise ConfigError(
                f"model type {cls.kind!r} needs path: the model file to load "
                f"(adapter({cls.kind!r}, path=...) in Python)."
            )
        if "://" not in path and not os.path.exists(os.path.expanduser(path)):
            raise ConfigError(f"model file {path!r} does not exist: check the path.")
        cls._check_renames(options.get("outputs"))
        refuse_untrusted(cls.kind, path, options)

    @classmethod
    def _check_renames(cls, renames: Any) -> None:
        if renames is None:
            return
        if not isinstance(renames, Mapping) or not all(
            isinstance(v, str) or v is None for v in renames.values()
        ):
            raise ConfigError(
                f"outputs must map output names to new names (or null to drop one), got "
                f"{renames!r}; e.g. outputs: {{score: p_tip}}."
            )
        for key in renames:
            if cls.OUTPUTS and key not in cls.OUTPUTS:
                raise ConfigError(
                    f"outputs: model type {cls.kind!r} has no output {key!r}."
                    f"{did_you_mean(str(key), cls.OUTPUTS)} Its outputs: {', '.join(cls.OUTPUTS)}."
                )
        _one_each(list(renames), renames, ConfigError)  # the rest: as outputs come


def renamed(names: Sequence[str], options: Mapping[str, Any]) -> list[str]:
    """Output names after the ``outputs:`` option's renames (``None`` drops one)."""
    renames = options.get("outputs") or {}
    if not isinstance(renames, Mapping):
        return list(names)
    return [str(new) for name in names if (new := renames.get(name, name)) is not None]


def rename(columns: Mapping[str, Any], renames: Mapping[str, str | None]) -> dict[str, Any]:
    """Apply ``outputs:``: rename columns, drop those mapped to ``None``."""
    _one_each(list(columns), renames, ModelError)
    return {new: v for name, v in columns.items() if (new := renames.get(name, name)) is not None}


def _one_each(
    names: Sequence[str], renames: Mapping[str, str | None], error: type[ChuteError]
) -> None:
    """Refuse renames that give two outputs one name: one would replace the other."""
    seen: dict[str, str] = {}
    for name in names:
        new = renames.get(name, name)
        if new is None:
            continue
        if new in seen:
            raise error(
                f"outputs: {seen[new]!r} and {name!r} would both be named {new!r}, and one "
                "would replace the other: give each its own name (or null to drop one)."
            )
        seen[new] = name


def column_matrix(column: pa.ChunkedArray | pa.Array, name: str) -> np.ndarray:
    """One column as a 2-D array: a scalar column is one feature, a fixed-size list many."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if isinstance(array.type, pa.FixedShapeTensorType):  # an image: its values, row by row
        return np.asarray(array.to_numpy_ndarray()).reshape(len(array), -1)
    if pa.types.is_fixed_size_list(array.type):
        width = array.type.list_size
        if array.null_count:  # flatten() leaves a null list out: every later row would shift
            raise DataError(
                f"column {name!r} holds a null list at row "
                f"{array.is_null().index(True).as_py()} of the batch: a model's features "
                "need a value in every row. Fill or drop such rows in a preprocess step, or "
                "set on_error: quarantine to set them aside."
            )
        flat = np.asarray(array.flatten().to_numpy(zero_copy_only=False))
        return flat.reshape(len(array), width)
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        raise ModelError(
            f"column {name!r} holds variable-length lists: a model input needs one value or a "
            "fixed-size list per row (cast it to pa.list_(type, size))."
        )
    return np.asarray(array.to_numpy(zero_copy_only=False)).reshape(len(array), 1)


def feature_matrix(batch: pa.Table, dtype: Any = None) -> np.ndarray:
    """The input columns side by side, in the order of the model's ``inputs``."""
    blocks = [column_matrix(batch.column(n), n) for n in batch.column_names]
    if not blocks:
        raise ModelError("the model has no input columns: list them in the model's inputs.")
    if dtype is not None and np.dtype(dtype).kind in "iu":  # cast one by one, each checked
        blocks = [
            _integers(b, np.dtype(dtype), n)
            for b, n in zip(blocks, batch.column_names, strict=True)
        ]
    if dtype is not None and np.dtype(dtype).kind == "b":
        blocks = [_booleans(b, n) for b, n in zip(blocks, batch.column_names, strict=True)]
    if dtype is not None and np.dtype(dtype).kind in "fc":
        blocks = [
            _numbers(b, np.dtype(dtype), n) for b, n in zip(blocks, batch.column_names, strict=True)
        ]
    matrix = np.hstack(blocks) if len(blocks) > 1 else blocks[0]
    return matrix.astype(dtype, copy=False) if dtype is not None else matrix


def _numbers(block: np.ndarray, dtype: np.dtype[Any], name: str) -> np.ndarray:
    """``block`` as the numbers a model's input takes; text that is not a number is refused
    naming its column ("could not convert string to float: 't0'" named none, and blamed
    the model)."""
    if block.dtype.kind not in "OSU":
        return block
    try:
        return block.astype(dtype)
    except (TypeError, ValueError) as exc:
        raise DataError(
            f"column {name!r} holds {_first_non_number(block)!r}, not a number, and the model "
            f"takes {dtype} features ({exc}): encode the column as numbers in a preprocess "
            "step, or leave it out of the model's inputs."
        ) from exc


def _first_non_number(block: np.ndarray) -> Any:
    for value in block.ravel():
        try:
            float(value)
        except (TypeError, ValueError):
            return value
    return block.ravel()[0]


def _integers(block: np.ndarray, dtype: np.dtype[Any], name: str) -> np.ndarray:
    """``block`` as the integers a model's input takes, refused unless every value is one
    (a cast would cut 1.7 to 1, and make a null or NaN the smallest integer)."""
    cast = block.astype(dtype)
    same = cast.astype(block.dtype) == block
    if block.dtype.kind in "iu":  # uint64 past 2**63 wraps to a negative and back again
        info = np.iinfo(dtype)
        same &= (block >= info.min) & (block <= info.max)
    if same.all():
        return cast
    row = int(np.flatnonzero(~same.all(axis=1))[0])
    raise DataError(
        f"column {name!r} holds {block[row].tolist()!r} at row {row} of the batch, where the "
        f"model takes {dtype} integers: a null, NaN, fraction or out-of-range value is no "
        "such integer. Fill or round it in a preprocess step, or give the model a "
        "floating-point input."
    )


def _booleans(block: np.ndarray, name: str) -> np.ndarray:
    """``block`` as the booleans a model's input takes: a bool column as it is, numbers
    only where each is 0 or 1 (a cast made 0.3, NaN and a null True)."""
    if block.dtype.kind == "b":
        return block
    with np.errstate(invalid="ignore"):
        same = (block == 0) | (block == 1)
    if np.all(same):
        return block.astype(bool)
    row = int(np.flatnonzero(~np.asarray(same).reshape(len(block), -1).all(axis=1))[0])
    raise DataError(
        f"column {name!r} holds {block[row].tolist()!r} at row {row} of the batch, where the "
        "model takes booleans: only true/false, or 0 and 1, are such a value (a null, NaN or "
        "other number is not). Fill or map it in a preprocess step."
    )


_UNNAMED = re.compile(r"(?:Column_|f)\d+")
"""Feature names a booster makes up for features given without names (LightGBM's
``Column_0``, XGBoost's ``f0``): they say nothing of which column is which."""


def ordered_by_names(batch: pa.Table, names: Sequence[str] | None) -> pa.Table:
    """The batch's columns in the order the model was trained on, when it knows their
    names and the inputs have them; the columns as given (by position) when the model
    does not know them, or the inputs have none of them (names the input calls
    otherwise). Inputs that have some of them but lack others are refused: taken by
    position, another column would stand in for a missing one, in silence."""
    if not names:
        return batch
    missing = [n for n in names if n not in batch.column_names]
    if not missing:  # f0, f1 too: by name whenever the inputs have them all
        return batch.select(list(names))
    if len(missing) == len(names) or all(_UNNAMED.fullmatch(n) for n in names):
        return batch
    if missing:
        shown = ", ".join(repr(n) for n in missing[:5])
        raise ModelError(
            f"the model was trained on features named {list(names)[:8]}, and the inputs lack "
            f"{shown} (they give {batch.column_names[:8]}): name the model's inputs as its "
            "features (rename columns in a preprocess step if the input calls them otherwise)."
        )
    return batch.select(list(names))


def classify(
    proba: np.ndarray,
    classes: Sequence[Any] | np.ndarray | None = None,
    threshold: float | None = None,
) -> dict[str, Any]:
    """Class probabilities → ``label`` and ``score`` (+ ``proba`` for more than two classes).

    ``proba`` is one column per class, or one value per row (the positive class's
    probability). Binary labels are the positive class when its probability is above the
    negative one's, or at least ``threshold`` when one is given.
    """
    proba = np.asarray(proba)
    if proba.ndim == 2 and proba.shape[1] == 1:
        proba = proba[:, 0]
    labels = np.asarray(classes) if classes is not None else None
    if proba.ndim == 1 or proba.shape[1] == 2:
        positive = proba if proba.ndim == 1 else proba[:, 1]
        negative = 1.0 - positive if proba.ndim == 1 else proba[:, 0]
        chosen = positive >= threshold if threshold is not None else positive > negative
        index = chosen.astype(np.int64)
        return {"label": _labels(index, labels), "score": positive.astype(np.float64)}
    index = np.argmax(proba, axis=1)
    return {
        "label": _labels(index, labels),
        "score": proba[np.arange(len(proba)), index].astype(np.float64),
        "proba": np.ascontiguousarray(proba, dtype=np.float32),
    }


def _labels(index: np.ndarray, classes: np.ndarray | None) -> np.ndarray:
    if classes is None:
        return index.astype(np.int64)
    if index.size and int(index.max()) >= len(classes):
        raise ModelError(
            f"the model predicts class index {int(index.max())}, but classes lists only "
            f"{len(classes)} names: give one name per class."
        )
    return np.asarray(classes[index])


def check_threshold(value: Any) -> float | None:
    """``threshold`` is a probability (or score) cut for binary labels."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"threshold must be a number, got {value!r}.")
    return float(value)


def check_classes(value: Any) -> list[Any] | None:
    """``classes`` names the class indices a model predicts, in index order."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or len(value) < 2:
        raise ConfigError(f"classes must be a list of at least two class names, got {value!r}.")
    return list(value)


def check_choice(kind: str, option: str, value: Any, choices: Sequence[str]) -> str:
    """An option that takes one of a few words."""
    if value not in choices:
        raise ConfigError(
            f"model type {kind!r}: {option} {value!r} is not one of {', '.join(choices)}."
            f"{did_you_mean(str(value), choices)}"
        )
    return str(value)


def check_counts(kind: str, options: Mapping[str, Any], names: Sequence[str]) -> None:
    """Options that count something (``batch_size``, ``max_length``): whole numbers of at
    least one (``batch_size: -1`` made no forward pass: a run of rows without outputs)."""
    for name in names:
        value = options.get(name)
        whole = isinstance(value, numbers.Integral) or (
            isinstance(value, float) and value.is_integer()  # YAML's 32.0
        )
        if value is not None and (isinstance(value, bool) or not whole or value < 1):
            raise ConfigError(
                f"model type {kind!r}: {name} {value!r} is not a whole number of at least 1. "
                f"Give one (say {name}: 32), or leave it out for the default."
            )


def squeeze_columns(values: np.ndarray) -> np.ndarray:
    """A tensor output as a column: ``(n, 1)`` → ``(n,)``, ``(n, a, b, ...)`` → ``(n, a*b*...)``."""
    values = np.asarray(values)
    if values.ndim > 2:
        values = values.reshape(values.shape[0], -1)
    if values.ndim == 2 and values.shape[1] == 1:
        return values[:, 0]
    return values


def float32_rows(values: np.ndarray) -> np.ndarray:
    """2-D float outputs become float32 fixed-size lists (embeddings, features)."""
    values = squeeze_columns(values)
    if values.ndim == 2 and np.issubdtype(values.dtype, np.floating):
        return np.ascontiguousarray(values, dtype=np.float32)
    return values


def text_column(batch: pa.Table, model: str) -> list[str]:
    """The batch's one text column as Python strings; a null is the row's error (never the
    text ``'None'``), for ``on_error`` to stop the run or set the row aside."""
    if batch.num_columns != 1:
        raise ModelError(
            f"model {model!r} takes one text column, got {batch.column_names}: "
            "set `inputs: [<text column>]`."
        )
    column = batch.column(0)
    if column.null_count:
        raise DataError(
            f"model {model!r}: its text column {batch.column_names[0]!r} holds a null (row "
            f"{column.is_null().index(True).as_py()} of the batch); a null is no text, and "
            "'None' is not its text. Drop or fill such rows in a preprocess step, or set "
            "on_error: quarantine to set them aside."
        )
    return [str(text) for text in column.to_pylist()]
