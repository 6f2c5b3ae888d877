"""Batch formats: the batch a user function receives, and its output back as columns."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from chute.errors import DataError, ModelError
from chute.job import BatchFormat


def to_format(table: pa.Table, fmt: BatchFormat) -> Any:
    """The batch a user function receives. NumPy arrays are the function's own (copies
    where Arrow would give a read-only view of the batch's buffer): ``torch.from_numpy``
    writes into a read-only array all the same, and a model that scaled its input in place
    changed the carried column, the rows a retried call (a bisection, an out-of-memory
    split) was given again, and the table a caller passed to ``chute.run``."""
    if fmt == "pyarrow":
        return table
    if fmt == "pandas":
        # pandas' metadata kept (its dtypes: Int64 stays Int64; a stored index stays an
        # index, not a column), but the index is the batch's row positions, never the one
        # pandas stored in the file: a result is put back in order by it
        import pandas as pd

        frame = table.to_pandas()
        frame.index = pd.RangeIndex(len(frame))
        return frame
    arrays = {name: _to_numpy(table.column(name), name) for name in table.column_names}
    return {
        name: array if array.flags.writeable else array.copy() for name, array in arrays.items()
    }


def _to_numpy(column: pa.ChunkedArray, name: str) -> np.ndarray:
    if isinstance(column.type, pa.FixedShapeTensorType):  # images: (rows, height, width, ch)
        return np.asarray(column.combine_chunks().to_numpy_ndarray())
    if pa.types.is_fixed_size_list(column.type):
        arr = column.combine_chunks()
        width = column.type.list_size
        if arr.null_count:  # flatten() leaves a null list out: every later row would shift
            row = arr.is_null().index(True).as_py()
            raise DataError(
                f"column {name!r} ({column.type}) holds a null list at row {row} of the batch: "
                "a model's array needs a value in every row. Fill or drop such rows in a "
                "preprocess step, or set on_error: quarantine to set them aside."
            )
        return np.asarray(arr.flatten().to_numpy(zero_copy_only=False)).reshape(-1, width)
    return np.asarray(column.to_numpy())


def to_columns(
    out: Any, prefix: str | None, num_rows: int, who: str, batch: Any = None
) -> dict[str, pa.Array]:
    """Normalize what a user function returned into named Arrow arrays of ``num_rows``
    (given the pandas ``batch`` it was called with, a result in another row order is put
    back in the batch's: :func:`_in_batch_order`)."""
    out = _in_batch_order(out, batch, num_rows)
    if out is None:
        raise ModelError(
            f"{who} returned None; return a dict of columns, a DataFrame, an Arrow table or "
            "an array."
        )
    if isinstance(out, tuple):  # `return a, b`: two outputs, or two rows? Never guessed
        raise ModelError(
            f"{who} returned a tuple of {len(out)}; return a dict that names each output "
            "({'a': ..., 'b': ...}), or one array (a list or array of one value per row)."
        )
    if isinstance(out, (pa.Table, pa.RecordBatch)):
        items: list[tuple[str | None, Any]] = list(zip(out.column_names, out.columns, strict=True))
    elif isinstance(out, dict):
        items = list(out.items())
    elif type(out).__name__ == "DataFrame":  # by position: a repeated name is one column each
        items = [(str(c), out.iloc[:, i]) for i, c in enumerate(out.columns)]
    else:
        items = [(None, out)]
    columns: dict[str, pa.Array] = {}
    for key, values in items:
        name = _column_name(prefix, key, who)
        if name in columns:  # {1: a, "1": b}, or a frame's repeated column: one would be lost
            raise ModelError(
                f"{who} returned two outputs that both become the column {name!r} (a repeated "
                "column name, or keys such as 1 and '1'): one would replace the other. Give "
                "each output a name of its own."
            )
        array = _to_arrow(values, name, who)
        if len(array) != num_rows:
            raise ModelError(
                f"{who} returned {len(array)} values for column {name!r} but the batch has "
                f"{num_rows} rows: return one value per input row."
            )
        columns[name] = array
    return columns


def _in_batch_order(out: Any, batch: Any, num_rows: int) -> Any:
    """A pandas result whose index is the batch's in another order (a sort, a groupby, a
    shuffle inside the model) in the batch's order: taken by position, its values would
    be attached to other rows. The batch's index is its own for a pandas batch, else the
    rows' places (``0..n-1``, as ``to_pandas()`` gives them). Any other index is the
    model's own: taken by position. A dict's Series values are each put in order the same
    way."""
    if isinstance(out, dict):  # {"y": series.sort_values()}: each value by its index too
        return {key: _in_batch_order(value, batch, num_rows) for key, value in out.items()}
    if type(out).__name__ not in ("DataFrame", "Series"):
        return out
    import pandas as pd

    index = out.index
    wanted = batch.index if type(batch).__name__ == "DataFrame" else pd.RangeIndex(num_rows)
    if index.equals(wanted) or len(index) != len(wanted) or not index.is_unique:
        return out
    if not wanted.is_unique or not index.isin(wanted).all():
        return out
    return out.reindex(wanted)


def _column_name(prefix: str | None, key: str | None, who: str) -> str:
    if key is None:
        if prefix is None:
            raise ModelError(f"{who} must return named columns (a dict, DataFrame or table).")
        return prefix
    return f"{prefix}_{key}" if prefix else str(key)


def _to_arrow(values: Any, name: str, who: str) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        return _unviewed(values)
    if hasattr(values, "detach"):  # a torch tensor
        values = _tensor_numpy(values, name, who)
    if type(values).__name__ in ("Series", "Index") and hasattr(values, "dtype"):
        if isinstance(values.dtype, np.dtype) and values.dtype != object:
            values = values.to_numpy()  # NumPy's own dtypes: as NumPy (a NaN stays a number)
        else:  # nullable, Arrow-backed, zoned, categorical, text: through NumPy, Int64 with
            try:  # <NA> was float64 (2**53 + 1 rounded), a zone's nanoseconds were lost
                return _plain(pa.array(values, from_pandas=True))
            except (TypeError, ValueError, pa.ArrowException) as exc:
                raise ModelError(
                    f"{who}: cannot turn output {name!r} into a column: {exc}"
                ) from exc
    if isinstance(values, (list, tuple)) and any(isinstance(v, np.ma.MaskedArray) for v in values):
        values = _masked_rows(values)  # a list of np.ma.masked, or of rows' masked arrays
    if isinstance(values, np.ma.MaskedArray):  # masked values are nulls, not their fill data
        return _masked(values, name, who)
    try:
        try:
            arr = np.asarray(values)
        except ValueError:  # rows of several lengths: NumPy refuses them, Arrow has lists
            if not isinstance(values, (list, tuple)):
                raise
            return pa.array([v.detach().cpu().numpy() if hasattr(v, "detach") else v
                             for v in values])  # fmt: skip
        if arr.dtype.kind in "SU" and arr.ndim in (1, 2):
            return _text(values if isinstance(values, (list, tuple)) else arr.tolist(), arr)
        if arr.ndim == 2:
            flat = pa.array(np.ascontiguousarray(arr).ravel())
            return pa.FixedSizeListArray.from_arrays(flat, arr.shape[1])
        return pa.array(arr)
    except (TypeError, ValueError, pa.ArrowException) as exc:
        raise ModelError(f"{who}: cannot turn output {name!r} into a column: {exc}") from exc


def _tensor_numpy(tensor: Any, name: str, who: str) -> np.ndarray:
    """A torch tensor as NumPy; ``bfloat16``, which NumPy lacks, as the ``float32`` that
    holds each of its values exactly."""
    try:
        tensor = tensor.detach().cpu()
        if str(tensor.dtype) == "torch.bfloat16":
            tensor = tensor.float()
        return np.asarray(tensor.numpy())
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ModelError(f"{who}: cannot turn output {name!r} into a column: {exc}") from exc


def _unviewed(array: pa.Array) -> pa.Array:
    """Arrow's view layouts (Polars' text is ``string_view``) as the plain ones every
    output format writes: CSV refused a ``string_view`` column as bad input, after compute."""
    kind = array.type
    if kind == pa.string_view():
        return array.cast(pa.string())
    if kind == pa.binary_view():
        return array.cast(pa.binary())
    return array  # a list view stays one: Arrow 26's cast of it to a list is invalid


def _plain(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A pandas column's array with the types its values had through NumPy: pandas' text
    (Arrow's ``large_string``) as ``string``, a categorical's values, not a dictionary;
    one array where pandas held Arrow's chunks (text read from several files and joined)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if pa.types.is_large_string(array.type):
        return array.cast(pa.string())
    if pa.types.is_large_binary(array.type):
        return array.cast(pa.binary())
    return array


def _text(rows: Any, arr: np.ndarray) -> pa.Array:
    """Bytes or text from Python's values, not NumPy's fixed-width ones: Arrow reads those
    up to their first NUL (a PNG's bytes were written as its first 8), and a list made
    into one loses its values' trailing NULs."""
    kind = pa.binary() if arr.dtype.kind == "S" else pa.string()
    if arr.ndim == 1:
        return pa.array(list(rows), kind)
    flat = pa.array([value for row in rows for value in row], kind)
    return pa.FixedSizeListArray.from_arrays(flat, arr.shape[1])


def _masked_rows(values: list[Any] | tuple[Any, ...]) -> Any:
    """A list that holds masked values, with its masks kept: ``np.asarray`` turns
    ``np.ma.masked`` into NaN (a number the model did not return) and drops the masks of
    rows' masked arrays. Rows of one length become one masked array (a fixed-size list
    column, as such rows without masks do); anything else a list, masked values ``None``."""
    rows = all(isinstance(v, np.ndarray) and v.ndim == 1 for v in values)
    if rows and len({len(v) for v in values}) == 1:
        return np.ma.stack(values)
    return [v.tolist() if isinstance(v, np.ma.MaskedArray) else v for v in values]


def _masked(values: np.ma.MaskedArray, name: str, who: str) -> pa.Array:
    data, mask = np.ascontiguousarray(values.data), np.ma.getmaskarray(values)
    try:
        if data.ndim == 2:
            flat = pa.array(data.ravel(), mask=mask.ravel())
            return pa.FixedSizeListArray.from_arrays(flat, data.shape[1])
        return pa.array(data, mask=mask)
    except (TypeError, ValueError, pa.ArrowException) as exc:
        raise ModelError(f"{who}: cannot turn output {name!r} into a column: {exc}") from exc


def cast_exactly(column: pa.ChunkedArray, want: pa.DataType) -> pa.ChunkedArray:
    """``column`` as ``want``, where that changes no value: all-null values take any type;
    otherwise both types must hold the same kind of value (numbers, text, instants...) at
    every depth (:func:`_same_kind`), Arrow's safe cast must accept it (no overflow, no
    truncation) and casting back must give the values read. Text is never made from
    numbers (``02139`` read as 2139 would come back as ``"2139"``), instants never lose
    their time of day and a time without a zone never gains one (nor loses its own);
    bytes become text where they are UTF-8 (Arrow's cast checks), and text bytes.

    A struct may lack fields ``want`` has (they are null: a model's batch of dicts, or a
    JSON Lines file, that never has an optional key, as a row without it in one batch or
    file); never one ``want`` lacks (Arrow would drop it)."""
    got = column.type
    if pa.types.is_null(got):
        return pa.chunked_array([pa.nulls(len(column), want)], want)
    if pa.types.is_dictionary(got):
        column, got = column.cast(got.value_type), got.value_type
    plain = want.value_type if pa.types.is_dictionary(want) else want
    if not _same_kind(got, plain):
        raise pa.ArrowInvalid(f"{got} values are not {plain} values")
    typed = _nulls_typed(got, plain)  # nulls inside: no cast back to the null type
    if typed != got:
        column, got = column.cast(typed), typed
    cast = column.cast(want)
    if got != plain and not same_values(cast.cast(plain).cast(got), column):
        raise pa.ArrowInvalid(f"the cast to {plain} would change values")
    return cast


def _same_kind(got: pa.DataType, want: pa.DataType) -> bool:
    """Whether ``got``'s values are ``want``'s kind of value at every depth: a list's
    values, a map's keys and items, a struct's fields by name, in any order (Arrow casts a
    struct's fields by name, fills a field it lacks with nulls and drops one it has over:
    so ``got`` may lack fields, never add one). Nulls are of any kind (a JSON ``[]`` is a
    list of nulls); bytes are text's kind, where they are UTF-8 (Arrow's cast checks)."""
    if pa.types.is_null(got):
        return True
    if pa.types.is_dictionary(got):
        got = got.value_type
    if pa.types.is_dictionary(want):
        want = want.value_type
    if _kind(got) != _kind(want) and {_kind(got), _kind(want)} != {"text", "bytes"}:
        return False
    have, wanted = _children(got), dict(_children(want))
    names, wanted_names = {name for name, _ in have}, set(wanted)
    if not (names <= wanted_names if _kind(got) == "struct" else names == wanted_names):
        return False
    return all(_same_kind(child, wanted[name]) for name, child in have)


def holds_null(t: pa.DataType) -> bool:
    """Whether ``t`` is the ``null`` type or holds it at any depth (a list's values, a
    map's keys or items, a struct's field): a batch whose values were all null there (a
    model's empty lists, ``list<null>``), whose type is not yet known in that place."""
    if pa.types.is_null(t):
        return True
    if pa.types.is_dictionary(t):
        return holds_null(t.value_type)
    return any(holds_null(child) for _, child in _children(t))


def typed_by(known: pa.DataType, got: pa.DataType) -> pa.DataType:
    """``known`` with the places it holds only nulls (the ``null`` type, at any depth: a
    model's first batches of ``None`` or of empty lists) of ``got``'s types there, where
    ``got``'s values can be that type (:func:`_same_kind`); else ``known``. ``null``
    itself takes ``got`` whole. A type already known is never changed: ``list<double>``
    stays, and a later ``list<null>`` is cast to it."""
    if pa.types.is_null(known):
        return got
    if got == known or not holds_null(known):
        return known
    typed = _nulls_typed(known, got)
    return typed if _same_kind(got, typed) else known


def _kind(t: pa.DataType) -> str:
    """What a type's values are, whatever their width or unit (a nested type's own kind:
    its children's are :func:`_children`). A timestamp with a zone is an instant; one
    without, or a date, is a time on some unknown clock: which instant it is depends on a
    zone no file says, so neither is made the other."""
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "text"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return "bytes"
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "number"
    if pa.types.is_timestamp(t) and t.tz is not None:
        return "instant"
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        return "local time"
    if _is_list(t):
        return "list"
    if pa.types.is_map(t):
        return "map"
    if pa.types.is_struct(t):
        return "struct"
    return str(t.id)


def _children(t: pa.DataType) -> list[tuple[str, pa.DataType]]:
    """A nested type's children by name (a list's values, a map's keys and items, a
    struct's fields); none for any other type."""
    if _is_list(t):
        return [("values", t.value_type)]
    if pa.types.is_map(t):
        return [("keys", t.key_type), ("items", t.item_type)]
    if pa.types.is_struct(t):
        return [(t.field(i).name, t.field(i).type) for i in range(t.num_fields)]
    return []


def _nulls_typed(got: pa.DataType, want: pa.DataType) -> pa.DataType:
    """``got`` with ``want``'s types where it holds only nulls, at any depth (a JSON ``[]``
    is a list of nulls): those stay nulls, and the rest is as read."""
    if pa.types.is_null(got):
        return want.value_type if pa.types.is_dictionary(want) else want
    if pa.types.is_dictionary(want):
        want = want.value_type
    wanted = dict(_children(want))
    have = _children(got)
    typed = [(name, _nulls_typed(child, wanted.get(name, child))) for name, child in have]
    return got if typed == have else _nested(got, [child for _, child in typed])


def _nested(t: pa.DataType, children: list[pa.DataType]) -> pa.DataType:
    """Nested type ``t`` with other children (as :func:`_children` orders them)."""
    if pa.types.is_map(t):
        key, item = t.key_field.with_type(children[0]), t.item_field.with_type(children[1])
        return pa.map_(key, item, keys_sorted=t.keys_sorted)
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(c) for i, c in enumerate(children)])
    values = t.value_field.with_type(children[0])
    if pa.types.is_fixed_size_list(t):
        return pa.list_(values, t.list_size)
    if pa.types.is_large_list(t):
        return pa.large_list(values)
    if pa.types.is_list_view(t):
        return pa.list_view(values)
    if pa.types.is_large_list_view(t):
        return pa.large_list_view(values)
    return pa.list_(values)


def _is_list(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
        or pa.types.is_list_view(t)
        or pa.types.is_large_list_view(t)
    )


def same_values(a: pa.ChunkedArray, b: pa.ChunkedArray) -> bool:
    """Equal values at every row, a null against a null and NaN against NaN included."""
    import pyarrow.compute as pc

    if (a.null_count or b.null_count) and pc.any(pc.xor(pc.is_null(a), pc.is_null(b))).as_py():
        return False
    try:
        equal = pc.equal(a, b)
    except pa.ArrowNotImplementedError:  # nested values: Arrow's own comparison
        return bool(a.equals(b))
    if pa.types.is_floating(a.type):
        equal = pc.or_kleene(equal, pc.and_(pc.is_nan(a), pc.is_nan(b)))
    return bool(pc.all(pc.fill_null(equal, True)).as_py())
