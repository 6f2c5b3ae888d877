"""What the output formats can hold, and JSON Lines written faithfully.

JSON Lines keeps every float exactly: a float is written as the shortest text that reads
back as the same number (``repr``; float32 values as float32), so ``-1.8644377440187592``
stays ``-1.8644377440187592``. NaN and ±infinity, which JSON cannot hold, are written as
``null``, like a missing value. Timestamps are ISO 8601 strings, dates ``YYYY-MM-DD``,
at any depth; durations are ISO 8601 durations (``PT1.5S``), here and in CSV, which would
write a bare count of the column's unit; decimals are strings (exact); lists and structs
are JSON arrays and objects, maps arrays of ``[key, value]`` pairs (keys of any type, kept
in order).

CSV holds flat text columns only: a list, tensor or struct column cannot be written to
it, nor a binary one (Arrow writes bytes as they are: those that are not UTF-8 stopped the
write at the unit that held them, after earlier units had committed); :func:`csv_error`,
raised when the job is planned where the column is known, else by the writer.
"""

from __future__ import annotations

import base64
import datetime
import json
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chute.errors import ConfigError, ModelError

NULL = "null"


def nested(kind: pa.DataType) -> bool:
    """Whether a column of ``kind`` holds lists, tensors, structs or maps."""
    if isinstance(kind, pa.BaseExtensionType):
        return nested(kind.storage_type)
    return bool(pa.types.is_nested(kind))


def binary(kind: pa.DataType) -> bool:
    """Whether a column of ``kind`` holds bytes (binary of any width, or a dictionary of
    them)."""
    if isinstance(kind, pa.BaseExtensionType):
        return binary(kind.storage_type)
    if pa.types.is_dictionary(kind):
        return binary(kind.value_type)
    return bool(
        pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_fixed_size_binary(kind)
        or pa.types.is_binary_view(kind)
    )


def csv_error(columns: Iterable[tuple[str, pa.DataType | str]]) -> ConfigError:
    """CSV cannot hold these columns (nested or binary, or a string saying what they
    hold): name them and the formats that can."""
    columns = list(columns)
    named = ", ".join(f"{name!r} ({kind})" for name, kind in columns)
    of_bytes = sum(not isinstance(kind, str) and binary(kind) for _, kind in columns)
    held = [("lists or tensors", of_bytes < len(columns)), ("bytes", of_bytes > 0)]
    what = " and ".join(name for name, some in held if some)
    return ConfigError(
        f"the output format is csv, but column(s) {named} hold {what}, which "
        "CSV cannot hold. Write Parquet or JSON Lines instead (output: {path: …, format: "
        "parquet} or format: jsonl; JSON Lines writes bytes as base64 text), or leave the "
        "column out of the output."
    )


def check_csv(schema: pa.Schema) -> None:
    """Raise :func:`csv_error` for the columns of ``schema`` CSV cannot hold, if any."""
    bad = [(f.name, f.type) for f in schema if not csv_holds(f.type)]
    if bad:
        raise csv_error(bad)


def csv_holds(kind: pa.DataType) -> bool:
    """Whether CSV holds a column of ``kind``: flat, and not bytes."""
    return not (nested(kind) or binary(kind))


def csv_ready(table: pa.Table) -> pa.Table:
    """``table`` as CSV writes it faithfully: durations as ISO 8601 text (Arrow's CSV
    writer gives a bare count, ``1500`` for 1.5 s in milliseconds, its unit lost), zoned
    times whose offsets have seconds in UTC (:func:`in_whole_minutes`)."""
    for i, field in enumerate(table.schema):
        if pa.types.is_duration(field.type):
            text = iso_durations(table.column(i).combine_chunks())
            table = table.set_column(i, pa.field(field.name, pa.string()), text)
        elif pa.types.is_timestamp(field.type) and field.type.tz:
            times = in_whole_minutes(table.column(i).combine_chunks())
            table = table.set_column(i, field.with_type(times.type), times)
    return table


SCALES = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}
"""Counts of a duration's unit in a second."""


def iso_durations(array: pa.Array) -> pa.Array:
    """Durations as ISO 8601 text (``PT1.5S``, ``-PT0.001S``); nulls stay null."""
    scale = SCALES[array.type.unit]
    counts = array.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False).tolist()
    text = [_iso_duration(count, scale) for count in counts]
    return pa.array(text, pa.string(), mask=np.asarray(array.is_null()))


def _iso_duration(count: int, scale: int) -> str:
    whole, fraction = divmod(abs(count), scale)
    seconds = str(whole)
    if fraction:
        seconds += "." + f"{fraction:0{len(str(scale)) - 1}d}".rstrip("0")
    return f"{'-' if count < 0 else ''}PT{seconds}S"


def openai_lines(table: pa.Table) -> bytes:
    """The OpenAI Batch output lines an LLM model made (its ``line`` column), one per row.
    A table of rows a model failed on (the errors dataset) is written as JSON Lines."""
    lines = [n for n in table.column_names if n == "line" or n.endswith("_line")]
    if len(lines) != 1:
        if {"model", "error_type", "error_message"} <= set(table.column_names):
            return to_jsonl(table)
        raise ConfigError(
            "the output format openai-batch writes the OpenAI Batch lines of an LLM model "
            f"(a `line` column), but the output has {', '.join(table.column_names)}: read "
            "the input with format: openai-batch and run a vllm model over it, or choose "
            "another output format."
        )
    texts = table.column(lines[0]).to_pylist()
    asked = (
        table.column("custom_id").to_pylist()
        if "custom_id" in table.column_names
        else [None] * len(texts)
    )
    for row, (text, custom_id) in enumerate(zip(texts, asked, strict=True)):
        _check_batch_line(text, lines[0], row, custom_id)
    return "".join(f"{text}\n" for text in texts).encode()


def _check_batch_line(text: Any, column: str, row: int, custom_id: Any = None) -> None:
    """One OpenAI Batch output line: a JSON object with its ``custom_id``, on one line,
    and that ``custom_id`` its request's (the row's, where the input has one). A model of
    the user's own that returns a ``line`` column could give ``None`` (written as
    ``None``), text with a newline (two lines, neither an answer), any other text, or the
    lines of its batch in another order (each answer under another request's name)."""
    try:
        one_line = isinstance(text, str) and not any(c in text for c in "\n\r\u2028\u2029")
        line = json.loads(text) if one_line else None
    except ValueError:
        line = None
    if not isinstance(line, dict) or not isinstance(line.get("custom_id"), str):
        raise ModelError(
            f"the openai-batch output takes {column!r} as OpenAI Batch output lines, but its "
            f"value {row + 1:,} of a part is {str(text)[:80]!r}: each must be one JSON object "
            'with its "custom_id", on one line (as the vllm and openai models write them). '
            "Return such lines, or choose another output format."
        )
    if custom_id is not None and line["custom_id"] != str(custom_id):  # as the adapters name it
        raise ModelError(
            f"the openai-batch output line for request {custom_id!r} names custom_id "
            f"{line['custom_id']!r}: each line must answer its own row's request, in the "
            "order of the batch. With the vllm or openai model type, put custom_id in the "
            "model's inputs (inputs: [custom_id, url, body]); a model of your own must "
            "return each row's line in its row."
        )


def to_jsonl(table: pa.Table) -> bytes:
    """The rows of ``table`` as JSON Lines, one object per row, floats exact."""
    if table.num_rows == 0:
        return b""
    pieces: list[Any] = []
    for i, name in enumerate(table.column_names):
        pieces.append(("{" if i == 0 else ",") + json.dumps(name) + ":")
        pieces.append(_json_values(table.column(name).combine_chunks()))
    pieces.append("}\n")
    rows = pc.binary_join_element_wise(*pieces, "")
    return _concatenated(rows)


def _concatenated(rows: pa.Array) -> bytes:
    """The values of a string array without nulls, one after another (its data buffer)."""
    width = np.int64 if pa.types.is_large_string(rows.type) else np.int32
    offsets = np.frombuffer(rows.buffers()[1], width)[rows.offset : rows.offset + len(rows) + 1]
    start, end = int(offsets[0]), int(offsets[-1])
    return bytes(rows.buffers()[2].slice(start, end - start).to_pybytes())


def _json_values(array: pa.Array) -> pa.Array:
    """One JSON text per value (``null`` for missing ones), as a string array."""
    kind = array.type
    if isinstance(kind, pa.BaseExtensionType):
        array, kind = array.storage, kind.storage_type
    if pa.types.is_dictionary(kind):
        return _json_values(array.dictionary_decode())
    if pa.types.is_floating(kind):
        text = _float_text(array)
    elif pa.types.is_integer(kind):
        text = pc.cast(array, pa.string())
    elif pa.types.is_boolean(kind):
        text = pc.if_else(array, "true", "false")
    elif pa.types.is_duration(kind):
        quoted = pc.binary_join_element_wise('"', iso_durations(array), '"', "")
        text = pc.cast(quoted, pa.string())
    elif pa.types.is_null(kind):
        return pa.array([NULL] * len(array), pa.string())
    elif (pa.types.is_string(kind) or pa.types.is_large_string(kind)) and _plain_text(array):
        array = array.cast(pa.string()) if pa.types.is_large_string(kind) else array
        escaped = pc.replace_substring(pc.replace_substring(array, "\\", "\\\\"), '"', '\\"')
        text = pc.cast(pc.binary_join_element_wise('"', escaped, '"', ""), pa.string())
    else:
        text = pa.array([_dumps(v) for v in _plain(array)], pa.string())
    return pc.fill_null(text, NULL)


def _plain_text(array: pa.Array) -> bool:
    """Whether no string holds a control character (those need ``\\u`` escapes)."""
    return not pc.any(pc.match_substring_regex(array, "[\\x00-\\x1f]")).as_py()


def _float_text(array: pa.Array) -> pa.Array:
    """Floats as their shortest round-trip text; NaN and infinities as null."""
    values = np.asarray(array.fill_null(0).to_numpy(zero_copy_only=False))
    if values.dtype == np.float64:
        text = pa.array([repr(v) for v in values.tolist()], pa.string())
    else:  # float32 and float16: the shortest text that reads back as the same float32
        text = pa.array(values.astype(np.float32).astype(str).astype(object), pa.string())
    finite = pa.array(np.isfinite(values)) if values.size else pa.array([], pa.bool_())
    return pc.if_else(pc.and_(finite, array.is_valid()), text, pa.scalar(None, pa.string()))


def _plain(array: pa.Array) -> list[Any]:
    """Python values of any other column: temporal values as ISO text, NaN as None."""
    kind = array.type
    if pa.types.is_timestamp(kind):
        array = in_whole_minutes(array)
        zone = "%z" if kind.tz else ""
        return list(pc.strftime(array, format=f"%Y-%m-%dT%H:%M:%S{zone}").to_pylist())
    if pa.types.is_date(kind) or pa.types.is_time(kind):
        return list(pc.cast(array, pa.string()).to_pylist())
    texted = _nanotimes_as_text(kind)
    if texted != kind:  # Python's time holds microseconds: 00:00:00.000000001 was 00:00:00
        array = array.cast(texted)
    return [_finite(v) for v in array.to_pylist()]


def in_whole_minutes(array: pa.Array) -> pa.Array:
    """Zoned timestamps as their text can say them: a zone whose offset has seconds at
    some instant (a local mean time before 1972: Monrovia's -00:44:30) written as ``%z``
    (``-0044``) named another instant, 30 s off; such a column is given in UTC."""
    kind = array.type
    if not (pa.types.is_timestamp(kind) and kind.tz) or len(array) == array.null_count:
        return array
    local = pc.local_timestamp(array).cast(pa.int64()).fill_null(0)
    offsets = np.asarray(local) - np.asarray(array.cast(pa.int64()).fill_null(0))
    if not np.any(offsets % (60 * SCALES[kind.unit])):
        return array
    return array.cast(pa.timestamp(kind.unit, "UTC"))


def _nanotimes_as_text(kind: pa.DataType) -> pa.DataType:
    """``kind`` with every ``time64[ns]`` inside it as text (Arrow's, as at the top)."""
    if kind == pa.time64("ns"):
        return pa.string()
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        inner = kind.value_field.with_type(_nanotimes_as_text(kind.value_type))
        return pa.list_(inner) if pa.types.is_list(kind) else pa.large_list(inner)
    if pa.types.is_fixed_size_list(kind):
        inner = kind.value_field.with_type(_nanotimes_as_text(kind.value_type))
        return pa.list_(inner, kind.list_size)
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(_nanotimes_as_text(f.type)) for f in kind])
    if pa.types.is_map(kind):
        key, item = kind.key_field, kind.item_field
        return pa.map_(
            key.with_type(_nanotimes_as_text(key.type)),
            item.with_type(_nanotimes_as_text(item.type)),
        )
    return kind


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities (at any depth) made None."""
    if isinstance(value, float):
        return value if np.isfinite(value) else None
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, tuple):  # a map's (key, value) pairs
        return [_finite(v) for v in value]
    return value


def _dumps(value: Any) -> str | None:
    if value is None:
        return None
    return json.dumps(
        value, default=_json_default, allow_nan=False, ensure_ascii=False, separators=(",", ":")
    )


def _json_default(value: Any) -> Any:
    """Bytes as base64 text (as BigQuery and Spark write binary to JSON: decoded with
    backslash escapes, ``b'\\xff'`` and the text ``\\xff`` were one string); times inside
    lists and structs as at the top (ISO 8601); anything else JSON lacks as its text."""
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, datetime.timedelta):
        nanos = getattr(value, "value", None)  # pandas' Timedelta: a count of nanoseconds
        if isinstance(nanos, int):
            return _iso_duration(nanos, 10**9)
        micros = (value.days * 86_400 + value.seconds) * 10**6 + value.microseconds
        return _iso_duration(micros, 10**6)
    if isinstance(value, datetime.date | datetime.time):  # datetimes too
        return value.isoformat()
    return str(value)
