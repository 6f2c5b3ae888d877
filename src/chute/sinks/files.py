"""The files of a file sink: which runs of rows share a data file (:func:`file_groups`;
whole units together, never part of a unit beside another), rows in key order, and the
bytes of a file in each format (:func:`encode`)."""

from __future__ import annotations

import functools
import io
import itertools
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from chute.formats import check_csv, csv_ready, openai_lines, to_jsonl
from chute.job import FileTarget
from chute.sinks.records import PartRecord, Run, runs
from chute.stages import KEY

EXTENSIONS = {"parquet": ".parquet", "csv": ".csv", "jsonl": ".jsonl", "openai-batch": ".jsonl"}


def in_key_order(table: pa.Table, found: list[Run] | None = None) -> pa.Table:
    """``table`` with its rows by unit, then row (pieces joined as they came may not be).

    The rows of a unit arrive in runs of consecutive rows, so the runs are put in order,
    not the rows: slices of ``table``, nothing copied. ``found``: its runs, if known."""
    found = runs(table.column(KEY).to_numpy()) if found is None else found
    if in_order(found):
        return table
    pieces = sorted(found, key=_place)
    return concat([table.slice(lo, hi - lo) for lo, hi, *_ in pieces])


def in_order(found: list[Run]) -> bool:
    """Whether runs (see :func:`runs`) come by unit, then row."""
    return all(_place(a) < _place(b) for a, b in itertools.pairwise(found))


def _place(run: Run) -> tuple[int, int]:
    """Where a run belongs: its unit, then its first row."""
    return run[2], run[3]


def file_groups(
    records: Sequence[PartRecord], rows: Sequence[pa.Table | None], target: FileTarget
) -> list[list[int]]:
    """Which runs share a data file (indexes into ``records``; runs without rows in none).

    Units whose every row is here (``whole``) are packed, in order, into files up to
    ``target``; the runs of any other unit into files of their own. A file is never part
    of one unit beside another, so its units are complete once it is written.
    """
    by_unit: dict[int, list[int]] = {}
    for i, record in enumerate(records):
        if rows[i] is not None:
            by_unit.setdefault(record.unit, []).append(i)

    def joined(held: list[int]) -> bool:  # whole, and not larger than a file
        tables = [t for t in (rows[i] for i in held) if t is not None]
        small = sum(t.nbytes for t in tables) <= target.bytes
        fewer = sum(t.num_rows for t in tables) <= (target.rows or sys.maxsize)
        return small and fewer and _whole([records[i] for i in held])

    groups = _pack([held for held in by_unit.values() if joined(held)], rows, target)
    for held in by_unit.values():
        if not joined(held):
            groups += _pack([[i] for i in held], rows, target)
    return groups


def cut(
    records: list[PartRecord], rows: list[pa.Table | None], target: FileTarget
) -> tuple[list[PartRecord], list[pa.Table | None]]:
    """Runs larger than a file cut into runs of a file each (a run with failed rows is
    left whole: its rows no longer match its row range)."""
    out_records: list[PartRecord] = []
    out_rows: list[pa.Table | None] = []
    for record, table in zip(records, rows, strict=True):
        step = 0 if table is None else target.rows_for(table.nbytes, table.num_rows)
        while table is not None and not record.error_rows and table.num_rows > step:
            (head, first), (record, table) = split_run(record, table, step)
            out_records.append(head)
            out_rows.append(first)
        out_records.append(record)
        out_rows.append(table)
    return out_records, out_rows


def split_run(
    record: PartRecord, table: pa.Table, rows: int
) -> tuple[tuple[PartRecord, pa.Table], tuple[PartRecord, pa.Table]]:
    """A run's first ``rows`` rows and the rest, each with its record (the first keeps the
    run's metrics and errors part; the rest keeps the unit's row count, if the run had it).
    A run with failed rows is never split: its rows no longer match its row range."""
    head = replace(record, end=record.start + rows, unit_rows=-1)
    tail = replace(record, start=record.start + rows, metrics=b"", errors_path="", errors_nbytes=0)
    return (head, table.slice(0, rows)), (tail, table.slice(rows))


def _whole(records: list[PartRecord]) -> bool:
    """Whether the runs hold every row of their unit: 0 to its last row, without a gap."""
    reached = 0
    for record in sorted(records, key=lambda r: r.start):
        if record.start != reached:
            return False
        reached = record.end
    return any(r.unit_rows == reached for r in records)


def _pack(
    items: list[list[int]], rows: Sequence[pa.Table | None], target: FileTarget
) -> list[list[int]]:
    """Consecutive items (each a list of runs kept together) in groups up to ``target``."""
    groups: list[list[int]] = []
    group: list[int] = []
    size = count = 0
    for item in items:
        tables = [t for t in (rows[i] for i in item) if t is not None]
        nbytes, n = sum(t.nbytes for t in tables), sum(t.num_rows for t in tables)
        if group and (size + nbytes > target.bytes or count + n > (target.rows or count + n)):
            groups.append(group)
            group, size, count = [], 0, 0
        group += item
        size, count = size + nbytes, count + n
    if group:
        groups.append(group)
    return groups


def concat(tables: list[pa.Table]) -> pa.Table:
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables, promote_options="permissive")


def encode(table: pa.Table, fmt: str) -> bytes:
    """The bytes of a part file in ``fmt``."""
    buf = io.BytesIO()
    if fmt == "parquet":
        write_parquet(table, buf)
    elif fmt == "csv":
        check_csv(table.schema)  # a list column the plan could not foresee
        pacsv.write_csv(csv_ready(table), buf)
    elif fmt == "openai-batch":
        return openai_lines(table)
    else:
        return to_jsonl(table)
    return buf.getvalue()


def write_parquet(table: pa.Table, out: Any, *, delta: bool = True) -> None:
    """Write ``table`` as Parquet to the stream ``out`` (see :func:`parquet_options`)."""
    table = as_written(table)
    pq.write_table(table, out, **parquet_options(table, delta=delta))


def as_written(table: pa.Table) -> pa.Table:
    """``table`` as chute writes it to Parquet. A dictionary column (carried text read as
    one, :func:`chute.plan._passed_through`) is written as it is, its dictionary taken
    whole, without Arrow's stored schema: a reader sees the text column the input had, not
    a dictionary (pandas: not a ``Categorical``). Where the rest of the schema needs the
    stored schema to read back as written (a time zone, seconds, ``large_string``), the
    dictionaries are decoded instead."""
    if not any(pa.types.is_dictionary(f.type) for f in table.schema):
        return table
    if _reads_back(table.schema.serialize().to_pybytes()):
        return table.unify_dictionaries()  # one dictionary for the whole file
    fields = [f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f
              for f in table.schema]  # fmt: skip
    return table.cast(pa.schema(fields, table.schema.metadata))


@functools.lru_cache(maxsize=64)
def _reads_back(serialized: bytes) -> bool:
    """Whether a Parquet file of this schema's rows, written without Arrow's stored schema,
    reads back with this schema, its dictionaries as their values."""
    schema = pa.ipc.read_schema(pa.py_buffer(serialized))
    plain = pa.schema(
        [f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f for f in schema],
        schema.metadata,
    )
    buf = io.BytesIO()
    pq.write_table(plain.empty_table(), buf, store_schema=False)
    return bool(pq.read_schema(io.BytesIO(buf.getvalue())).equals(plain, check_metadata=True))


def parquet_options(table: pa.Table, *, delta: bool = True) -> dict[str, Any]:
    """How chute encodes a Parquet file of rows like ``table``'s (``pyarrow.parquet``'s
    writer options): a dictionary where values repeat (:func:`dictionary_columns`), delta
    encoding for the other integer and time columns (:func:`delta_columns`) unless
    ``delta`` is false, the rest plain; every page snappy-compressed.

    A table sink's data files go without delta encoding: a table is read by many engines,
    and Iceberg's own vectorized Parquet reader (Spark's by default) refused it until
    2025 ("Cannot support vectorized reads ... with encoding DELTA_BINARY_PACKED", Iceberg
    issue 7162)."""
    dictionary = dictionary_columns(table)
    chosen = delta_columns(table, dictionary) if delta else []
    encoding = dict.fromkeys(chosen, "DELTA_BINARY_PACKED")
    options: dict[str, Any] = {"use_dictionary": dictionary, "column_encoding": encoding or None}
    if any(pa.types.is_dictionary(f.type) for f in table.schema):  # see as_written
        options["store_schema"] = False
    return options


DICTIONARY_SAMPLE = 8_192
"""Rows of a table looked at to choose its dictionary columns."""


def dictionary_columns(table: pa.Table) -> list[str]:
    """The columns a Parquet dictionary is tried for: those whose values repeat (at most a
    quarter distinct in the first :data:`DICTIONARY_SAMPLE` rows: labels, categories,
    small counts). Scores, embeddings, ids and timestamps seldom repeat: trying one for them
    costs more than the rest of the encoding and saves nothing."""
    sample = table.slice(0, DICTIONARY_SAMPLE)
    chosen = []
    for field, column in zip(sample.schema, sample.columns, strict=True):
        if pa.types.is_dictionary(field.type):  # one already: taken as it is
            chosen.append(field.name)
            continue
        if _floating(field.type) or pa.types.is_nested(field.type):
            continue
        try:
            distinct = pc.count_distinct(column).as_py()
        except pa.ArrowException:  # a type without a hash kernel (an extension): plain
            continue
        if distinct * 4 <= max(sample.num_rows, 1):
            chosen.append(field.name)
    return chosen


def delta_columns(table: pa.Table, dictionary: Sequence[str] = ()) -> list[str]:
    """The top-level integer and time columns (ids, counts, timestamps, dates) without a
    dictionary: Parquet's ``DELTA_BINARY_PACKED`` stores each as its differences,
    bit-packed. On the demo's output that took the file from 21 to 9 MB, its encoding from
    0.25 to 0.19 CPU s and its decoding from 0.19 to 0.10; on random 64-bit values it is
    no larger and no slower than plain (``benchmarks/RESULTS.md``). Every reader of Parquet's
    version 2 encodings reads it (pyarrow, Spark 3.3 on, DuckDB, Polars, Trino)."""
    chosen = []
    for field in table.schema:
        if field.name in dictionary or "." in field.name:  # a dot would name a nested path
            continue
        if any(test(field.type) for test in _DELTA_TYPES):
            chosen.append(field.name)
    return chosen


_DELTA_TYPES = (
    pa.types.is_integer,
    pa.types.is_timestamp,
    pa.types.is_date,
    pa.types.is_time,
    pa.types.is_duration,
)
"""Types Parquet stores as 32- or 64-bit integers, which delta encoding takes."""


def _floating(kind: pa.DataType) -> bool:
    if pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind) or pa.types.is_large_list(kind):
        return _floating(kind.value_type)
    return bool(pa.types.is_floating(kind))
