"""What the driver learns of a written part: :class:`PartRecord`, small and of fixed
size, shipped as an Arrow table (:func:`records_to_table`), and the runs of a unit's rows
in a batch (:func:`runs`)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields

import numpy as np
import pyarrow as pa

from chute.stages import decode


@dataclass(frozen=True)
class PartRecord:
    """What the driver learns about one written part: small, fixed-size metadata."""

    unit: int
    """Index of the unit in the plan."""
    start: int
    """First row of the unit in this part."""
    end: int
    """One past the last row of the unit in this part."""
    unit_rows: int
    """The unit's total rows if this part holds its last row, else -1."""
    path: str
    """Part file name relative to the output root ("" for in-memory results)."""
    nbytes: int
    seconds: float
    """Time spent writing the part."""
    data: bytes = b""
    """Arrow IPC of the rows, only when the result is kept in memory."""
    errors_path: str = ""
    """The errors part holding the rows a model failed on (quarantine), if any."""
    error_rows: int = 0
    """How many of the part's rows went to the errors part instead of the output."""
    input_error_rows: int = 0
    """How many of those are input rows that could not be decoded (on_bad_input: skip),
    not rows a model failed on: they do not count toward ``max_failed_fraction``."""
    skipped: str = ""
    """Why the unit could not be read, for a skipped unit (on_bad_input: skip)."""
    metrics: bytes = b""
    """Metric states of the part's rows (the rows written, not the failed ones)."""
    errors_nbytes: int = 0
    """Bytes of the errors part."""
    table: str = ""
    """For a table output: the part's schema (and a Lance fragment), :func:`part_info`."""
    file_units: int = 1
    """How many units have rows in ``path``: more than one only for a file of whole units."""
    columns: str = ""
    """The part's columns and their types (:func:`describe_columns`), which the committer
    checks are every part's: replicas in other processes each type a model's outputs from
    the first batch they see."""


RECORD_SCHEMA = pa.schema(
    [
        ("unit", pa.int64()),
        ("start", pa.int64()),
        ("end", pa.int64()),
        ("unit_rows", pa.int64()),
        ("path", pa.string()),
        ("nbytes", pa.int64()),
        ("seconds", pa.float64()),
        ("data", pa.binary()),
        ("errors_path", pa.string()),
        ("error_rows", pa.int64()),
        ("input_error_rows", pa.int64()),
        ("skipped", pa.string()),
        ("metrics", pa.binary()),
        ("errors_nbytes", pa.int64()),
        ("table", pa.string()),
        ("file_units", pa.int64()),
        ("columns", pa.string()),
    ]
)


def describe_columns(schema: pa.Schema) -> str:
    """``[[name, type], ...]`` as JSON text: the columns a part writes (chute's own left out)."""
    return json.dumps(
        [[f.name, type_text(f.type)] for f in schema if not f.name.startswith("__chute")]
    )


_INNER_NAME = re.compile(r"\b(list|large_list|fixed_size_list)<[^<>:,\s]+: ")
_ENTRIES_NAME = re.compile(r" \('[^']*'\)>")


def canonical_text(text: str) -> str:
    """A type text as :func:`type_text` writes it, from ``str(type)`` as an older chute
    wrote it in its ledger (``list<item: double>``, ``map<string, int64 ('tags')>``): a
    resume of an embedding job that chute began took its own column for another type."""
    return _ENTRIES_NAME.sub(">", _INNER_NAME.sub(r"\1<", text))


def type_text(kind: pa.DataType) -> str:
    """A type as text, without the names Arrow gives the inner fields of a list or map:
    Arrow IPC (Ray's object store) names a map's entries ``entries`` where Parquet named
    them after the column, and the same column read on two engines was taken for two
    types (a resume on the other engine refused its own carried column)."""
    if pa.types.is_map(kind):
        return f"map<{type_text(kind.key_type)}, {type_text(kind.item_type)}>"
    if pa.types.is_fixed_size_list(kind):
        return f"fixed_size_list<{type_text(kind.value_type)}>[{kind.list_size}]"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        prefix = "large_list" if pa.types.is_large_list(kind) else "list"
        return f"{prefix}<{type_text(kind.value_type)}>"
    if pa.types.is_struct(kind):
        return f"struct<{', '.join(f'{f.name}: {type_text(f.type)}' for f in kind)}>"
    return str(kind)


def _null_at(text: str, i: int) -> bool:
    """Whether ``text`` (a :func:`type_text`) has the ``null`` type at ``i``: where a type
    goes (the start, after ``<``, a field's ``: `` or a map's ``, ``), and ending there."""
    if not text.startswith("null", i) or text[i + 4 : i + 5] not in ("", ",", ">"):
        return False
    return i == 0 or text[i - 1] == "<" or text[i - 2 : i] in (": ", ", ")


def _type_end(text: str, i: int) -> int:
    """Where the type that begins at ``i`` of ``text`` ends (a :func:`type_text`): at the
    first ``,`` or ``>`` outside its own brackets, or the end."""
    depth = 0
    for at in range(i, len(text)):
        if text[at] in "<([":
            depth += 1
        elif text[at] in ">)]":
            if depth == 0:
                return at
            depth -= 1
        elif text[at] == "," and depth == 0:
            return at
    return len(text)


def text_holds_null(text: str) -> bool:
    """Whether a type as :func:`type_text` writes it is ``null`` or holds it at any depth
    (``list<null>``: a model's empty lists), a type not yet known there."""
    return any(_null_at(text, i) for i in range(len(text)))


def merged_text(a: str, b: str) -> str | None:
    """The type two parts' columns (as :func:`type_text` writes them) agree on, where
    each holds ``null`` (all its values null: a model's ``None``, its empty lists) only
    where the other has that type or ``null`` too: ``list<null>`` and ``list<double>``
    give ``list<double>``. ``None`` where they differ elsewhere."""
    out: list[str] = []
    i = j = 0
    while i < len(a) or j < len(b):
        if _null_at(a, i) and not _null_at(b, j):
            end = _type_end(b, j)
            if end == j:
                return None
            out.append(b[j:end])
            i, j = i + 4, end
        elif _null_at(b, j) and not _null_at(a, i):
            end = _type_end(a, i)
            if end == i:
                return None
            out.append(a[i:end])
            i, j = end, j + 4
        elif i < len(a) and j < len(b) and a[i] == b[j]:
            out.append(a[i])
            i, j = i + 1, j + 1
        else:
            return None
    return "".join(out)


def records_to_table(records: Sequence[PartRecord]) -> pa.Table:
    """Records as a small Arrow table (what Ray ships back to the driver)."""
    columns = {f.name: [getattr(r, f.name) for r in records] for f in fields(PartRecord)}
    return pa.Table.from_pydict(columns, schema=RECORD_SCHEMA)


def records_from_table(table: pa.Table) -> list[PartRecord]:
    return [PartRecord(**row) for row in table.to_pylist()]


Run = tuple[int, int, int, int, int]
"""A run of one unit's consecutive rows in a batch: (first index, last index + 1, unit,
start row, unit_rows: the unit's total if the run holds its last row, else -1)."""


def runs(keys: np.ndarray) -> list[Run]:
    """The runs of consecutive rows of one unit in a batch's row keys, as they come.

    Within a run each key is the one before it plus one, but for a unit's last row (its
    key negated, and so the end of a run): a run can only end where that fails, so only
    those few keys are decoded, not every row's."""
    if len(keys) == 0:
        return []
    odd = np.flatnonzero((np.diff(keys) != 1) | (keys[:-1] < 0)) + 1
    if len(odd):
        units, rows, _ = decode(keys[odd])
        before, previous, ended = decode(keys[odd - 1])
        odd = odd[(units != before) | (rows != previous + 1) | ended]
    firsts = np.concatenate(([0], odd))
    lasts = np.concatenate((odd, [len(keys)])) - 1
    units, starts, _ = decode(keys[firsts])
    _, ends, last = decode(keys[lasts])
    totals = np.where(last, ends + 1, -1)
    return list(
        zip(
            firsts.tolist(),
            (lasts + 1).tolist(),
            units.tolist(),
            starts.tolist(),
            totals.tolist(),
            strict=True,
        )
    )


def record_dict(record: PartRecord) -> dict[str, object]:
    """A record as it is kept in the ledger (without any row data)."""
    row = asdict(record)
    row.pop("data")
    return row


def to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def read_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()
