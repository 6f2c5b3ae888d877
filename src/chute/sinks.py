"""Writers: each data file is written whole under a unique name (locally under a temporary
name and renamed into place; on an object store in one upload, which is atomic); the writer
returns one small record per run of a unit's rows in it, never the rows (unless the result
is wanted in memory).

A file sink's data file holds either the whole of one or more units, or rows of a single
unit (a large unit spans several files): never part of a unit beside another unit. So the
units of a file are all complete the moment it is written and commit together, and a unit
whose files are not all in place shares none of them with a committed unit (see
:mod:`chute.ledger`). Files grow up to the sink's :class:`~chute.job.FileTarget`; the
records of one file name it and say how many units it holds (``file_units``).
"""

from __future__ import annotations

import io
import itertools
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from chute.evaluation import Evaluation
from chute.formats import check_csv, openai_lines, to_jsonl
from chute.job import FileTarget, Sink
from chute.retry import retrying
from chute.stages import (
    EMPTY,
    ERROR_COLUMNS,
    ERROR_MESSAGE,
    ERROR_MODEL,
    KEY,
    SKIPPED,
    decode,
)
from chute.storage import StorageOptions, is_local, make_dir, put, resolve
from chute.tables import TableSink, part_info, partition_fields, partition_values, split

ERRORS_DIR = "_errors"
"""Where rows a model failed on go, inside the output location (readers skip ``_`` names)."""
EXTENSIONS = {"parquet": ".parquet", "csv": ".csv", "jsonl": ".jsonl", "openai-batch": ".jsonl"}


@dataclass(frozen=True)
class Output:
    """Which columns are written, and where; small and picklable, shipped to writers."""

    sink: Sink | None
    carryover: tuple[str, ...]
    models: tuple[str, ...]
    source_columns: tuple[str, ...] = ()
    """Input columns: one named like a model output (``tip_amount``) is not one."""
    evaluation: Evaluation = field(default_factory=lambda: Evaluation({}))
    """The metrics writers compute over the rows they write."""

    def columns(self, available: Sequence[str]) -> list[str]:
        """Carryover columns, then each model's outputs in model order."""
        produced: list[str] = []
        for name in self.models:
            produced += [
                c
                for c in available
                if (c == name or c.startswith(name + "_"))
                and c not in self.carryover
                and c not in self.source_columns
                and c not in produced
                and c != KEY
            ]
        return [*self.carryover, *produced]


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
        ("skipped", pa.string()),
        ("metrics", pa.binary()),
        ("errors_nbytes", pa.int64()),
        ("table", pa.string()),
        ("file_units", pa.int64()),
    ]
)


def records_to_table(records: Sequence[PartRecord]) -> pa.Table:
    """Records as a small Arrow table (what Ray ships back to the driver)."""
    columns = {f.name: [getattr(r, f.name) for r in records] for f in fields(PartRecord)}
    return pa.Table.from_pydict(columns, schema=RECORD_SCHEMA)


def records_from_table(table: pa.Table) -> list[PartRecord]:
    return [PartRecord(**row) for row in table.to_pylist()]


def runs(keys: np.ndarray) -> list[tuple[int, int, int, int, int]]:
    """Contiguous runs of one unit: (first index, last index + 1, unit, start row, unit_rows)."""
    units, rows, last = decode(keys)
    breaks = np.flatnonzero((np.diff(units) != 0) | (np.diff(rows) != 1)) + 1
    bounds = [0, *breaks.tolist(), len(keys)]
    out = []
    for lo, hi in itertools.pairwise(bounds):
        total = int(rows[hi - 1]) + 1 if last[hi - 1] else -1
        out.append((lo, hi, int(units[lo]), int(rows[lo]), total))
    return out


class PartWriter:
    """Writes the output columns of a batch: to files of whole units and of single units'
    rows up to the sink's target (a file sink), or one part per contiguous run of a unit
    (a table, or the result kept in memory)."""

    def __init__(self, output: Output) -> None:
        self.output = output
        self.sink = output.sink
        self.target = output.sink.target if output.sink is not None else FileTarget()
        self._fs: pafs.FileSystem | None = None
        self._root = ""

    @property
    def joins(self) -> bool:
        """Whether runs of several units may share a file (a file sink, not a table)."""
        return self.sink is not None and not isinstance(self.sink, TableSink)

    def _filesystem(self) -> tuple[pafs.FileSystem, str]:
        if self._fs is None:
            assert self.sink is not None
            self._fs, self._root = output_filesystem(self.sink.path, self.sink.storage)
        return self._fs, self._root

    def _folder(self, errors: bool) -> str:
        """Where parts go, relative to the output (a table's: its job's data folder)."""
        if isinstance(self.sink, TableSink):
            return self.sink.errors_dir if errors else self.sink.job_dir
        return ERRORS_DIR if errors else ""

    def write(self, table: pa.Table) -> list[PartRecord]:
        """Write ``table`` (rows of one or more units, in any order) and describe it."""
        if table.num_rows == 0:
            return []
        if self.joins:
            table = in_key_order(table)
        keys = table.column(KEY).to_numpy()
        errors = None
        if ERROR_MODEL in table.column_names:
            errors = _select(table, [*self.output.carryover, *ERROR_COLUMNS])
        full, table = table, _select(table, [*self.output.columns(table.column_names), KEY])
        records, rows = [], []
        for lo, hi, unit, start, total in runs(keys):
            record, healthy = self._write_run(
                table.slice(lo, hi - lo), _slice(errors, lo, hi), unit, start, total
            )
            if self.output.evaluation and record.end > record.start and not record.skipped:
                written = _healthy(full.slice(lo, hi - lo))
                record = replace(record, metrics=self.output.evaluation.measure(written))
            records.append(record)
            rows.append(healthy)
        if not self.joins:
            return records
        return self._write_files(*_cut(records, rows, self.target))

    def _write_files(
        self, records: list[PartRecord], rows: list[pa.Table | None]
    ) -> list[PartRecord]:
        """Write the runs' rows as files (see :func:`file_groups`); each record names its file."""
        out = list(records)
        for group in file_groups(records, rows, self.target):
            began = time.perf_counter()
            first = records[group[0]]
            data = _concat([rows[i] for i in group if rows[i] is not None])
            path, size = self._put(data.drop_columns([KEY]), first.unit, first.start, "")
            seconds = time.perf_counter() - began
            units = len({records[i].unit for i in group})
            for i in group:
                share = seconds * (records[i].end - records[i].start) / max(data.num_rows, 1)
                out[i] = replace(
                    records[i],
                    path=path,
                    nbytes=size,
                    seconds=records[i].seconds + share,
                    file_units=units,
                )
        return out

    def _write_run(
        self, part: pa.Table, errors: pa.Table | None, unit: int, start: int, total: int
    ) -> tuple[PartRecord, pa.Table | None]:
        """A run's errors part written, and its record; its healthy rows too when they are
        left to :meth:`_write_files` (a file sink), else written here as a part."""
        began = time.perf_counter()
        end = start + part.num_rows
        marker = errors.column(ERROR_MODEL)[0].as_py() if errors is not None else None
        if errors is not None and marker == SKIPPED:
            reason = str(errors.column(ERROR_MESSAGE)[0].as_py())  # an unreadable unit
            return PartRecord(unit, 0, 0, 0, "", 0, 0.0, skipped=reason), None  # no rows
        if marker == EMPTY:  # a unit without rows: done, with nothing to write
            return PartRecord(unit, 0, 0, 0, "", 0, 0.0), None
        failed = _failed_mask(errors)
        if failed is None or errors is None:
            errors = None
        else:
            part = part.filter(pa.array(~failed))
            errors = errors.filter(pa.array(failed)).rename_columns(
                [*self.output.carryover, "model", "error_type", "error_message"]
            )
        error_rows = 0 if errors is None else errors.num_rows
        if self.sink is None:
            data = _ipc(part)
            record = PartRecord(
                unit, start, end, total, "", len(data), 0.0, data, error_rows=error_rows
            )
            return record, None
        if self.joins:  # the rows go to a file with others' (_write_files)
            bad, bad_size = self._put_errors(errors, unit, start)
            seconds = time.perf_counter() - began
            record = PartRecord(
                unit,
                start,
                end,
                total,
                "",
                0,
                seconds,
                errors_path=bad,
                error_rows=error_rows,
                errors_nbytes=bad_size,
            )
            return record, part if part.num_rows else None
        data, table = part.drop_columns([KEY]), ""
        if isinstance(self.sink, TableSink) and part.num_rows:
            if self.sink.sort_by:
                data = data.sort_by([(c, "ascending") for c in self.sink.sort_by])
            table = part_info(data.schema)
        if isinstance(self.sink, TableSink) and self.sink.format == "lance" and part.num_rows:
            path, size, table = self._put_lance(data)
        elif isinstance(self.sink, TableSink) and self.sink.partition_by and part.num_rows:
            path, size, table = self._put_partitioned(data, unit, start)
        else:
            folder = self._folder(errors=False)
            path, size = self._put(data, unit, start, folder) if part.num_rows else ("", 0)
        bad, bad_size = self._put_errors(errors, unit, start)
        seconds = time.perf_counter() - began
        record = PartRecord(
            unit,
            start,
            end,
            total,
            path,
            size,
            seconds,
            errors_path=bad,
            error_rows=error_rows,
            errors_nbytes=bad_size,
            table=table,
        )
        return record, None

    def _put_errors(self, errors: pa.Table | None, unit: int, start: int) -> tuple[str, int]:
        """A run's failed rows as an errors part of its own (quarantine); ``("", 0)``: none."""
        if errors is None:
            return "", 0
        return self._put(errors, unit, start, self._folder(errors=True))

    def _put_lance(self, data: pa.Table) -> tuple[str, int, str]:
        """Write a part as Lance fragments (uncommitted): its first file, bytes, info."""
        from chute.tables.lance import fragment_files, write_fragments

        assert self.sink is not None
        fragments = write_fragments(data, self.sink.path, self.sink.storage)
        files = [f for fragment in fragments for f in fragment_files(fragment)]
        info = part_info(data.schema, fragments)
        return files[0][0], sum(size for _, size in files), info

    def _put_partitioned(self, data: pa.Table, unit: int, start: int) -> tuple[str, int, str]:
        """Write a part as one file per partition value: its first file, bytes, info.
        Delta keeps partition values in its log, not in the files."""
        assert isinstance(self.sink, TableSink)
        fields = partition_fields(self.sink.partition_by)
        in_log = [f.column for f in fields] if self.sink.format == "delta" else []
        files = []
        for piece in split(data, fields):
            stored = piece.drop_columns(in_log)
            path, size = self._put(stored, unit, start, self._folder(errors=False))
            files.append((path, piece.num_rows, size, partition_values(piece, fields)))
        info = part_info(data.schema, files=files)
        return files[0][0], sum(f[2] for f in files), info

    def _put(self, table: pa.Table, unit: int, start: int, folder: str) -> tuple[str, int]:
        """Write ``table`` whole under a unique name; its path and size."""
        assert self.sink is not None
        fmt = "parquet" if isinstance(self.sink, TableSink) else self.sink.format
        name = f"part-{unit:06d}-{start:010d}-{uuid.uuid4().hex[:8]}{EXTENSIONS[fmt]}"
        relative = f"{folder}/{name}" if folder else name
        fs, root = self._filesystem()
        if folder and is_local(fs):  # object stores have no directories to make
            make_dir(fs, f"{root}/{folder}")
        if fmt == "parquet":  # streamed into the file: no copy of the file in memory
            payload: bytes | Callable[[pa.NativeFile], None] = partial(_parquet, table)
        else:
            payload = encode(table, fmt)
        size = retrying(lambda: put(fs, f"{root}/{relative}", payload), f"writing {relative}")
        return relative, size


def in_key_order(table: pa.Table) -> pa.Table:
    """``table`` with its rows by unit, then row (pieces joined as they came may not be).

    The rows of a unit arrive in runs of consecutive rows, so the runs are put in order,
    not the rows: slices of ``table``, nothing copied."""
    keys = table.column(KEY).to_numpy()
    order = np.where(keys < 0, -keys - 1, keys)
    if len(order) < 2 or bool((np.diff(order) > 0).all()):
        return table
    pieces = sorted(runs(keys), key=lambda run: (run[2], run[3]))
    return _concat([table.slice(lo, hi - lo) for lo, hi, *_ in pieces])


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

    def joined(runs: list[int]) -> bool:  # whole, and not larger than a file
        tables = [t for t in (rows[i] for i in runs) if t is not None]
        small = sum(t.nbytes for t in tables) <= target.bytes
        fewer = sum(t.num_rows for t in tables) <= (target.rows or sys.maxsize)
        return small and fewer and _whole([records[i] for i in runs])

    groups = _pack([runs for runs in by_unit.values() if joined(runs)], rows, target)
    for runs in by_unit.values():
        if not joined(runs):
            groups += _pack([[i] for i in runs], rows, target)
    return groups


def _cut(
    records: list[PartRecord], rows: list[pa.Table | None], target: FileTarget
) -> tuple[list[PartRecord], list[pa.Table | None]]:
    """Runs larger than a file cut into runs of a file each (a run with failed rows is
    left whole: its rows no longer match its row range)."""
    out_records: list[PartRecord] = []
    out_rows: list[pa.Table | None] = []
    for record, table in zip(records, rows, strict=True):
        step = 0 if table is None else target.rows_for(table.nbytes, table.num_rows)
        if table is None or record.error_rows or table.num_rows <= step:
            out_records.append(record)
            out_rows.append(table)
            continue
        for lo in range(0, table.num_rows, step):
            piece = table.slice(lo, step)
            last = lo + piece.num_rows == table.num_rows
            out_records.append(
                replace(
                    record,
                    start=record.start + lo,
                    end=record.start + lo + piece.num_rows,
                    unit_rows=record.unit_rows if last else -1,
                    metrics=record.metrics if lo == 0 else b"",
                    errors_path=record.errors_path if lo == 0 else "",
                    errors_nbytes=record.errors_nbytes if lo == 0 else 0,
                )
            )
            out_rows.append(piece)
    return out_records, out_rows


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


def _concat(tables: list[pa.Table]) -> pa.Table:
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables, promote_options="permissive")


def _select(table: pa.Table, names: list[str]) -> pa.Table:
    """``table.select(names)``, with nulls for columns a batch lacks (a skip marker's)."""
    columns = [
        table.column(n) if n in table.column_names else pa.nulls(table.num_rows) for n in names
    ]
    return pa.Table.from_arrays(columns, names=names)


def _healthy(table: pa.Table) -> pa.Table:
    """The rows no model failed on."""
    if ERROR_MODEL not in table.column_names:
        return table
    return table.filter(table.column(ERROR_MODEL).is_null())


def _slice(table: pa.Table | None, lo: int, hi: int) -> pa.Table | None:
    return None if table is None else table.slice(lo, hi - lo)


def _failed_mask(errors: pa.Table | None) -> np.ndarray | None:
    """Which rows a model failed on, or ``None`` when none did."""
    if errors is None:
        return None
    failed = errors.column(ERROR_MODEL).is_valid().to_numpy(zero_copy_only=False)
    return failed if failed.any() else None


def encode(table: pa.Table, fmt: str) -> bytes:
    """The bytes of a part file in ``fmt``."""
    buf = io.BytesIO()
    if fmt == "parquet":
        _parquet(table, buf)
    elif fmt == "csv":
        check_csv(table.schema)  # a list column the plan could not foresee
        pacsv.write_csv(table, buf)
    elif fmt == "openai-batch":
        return openai_lines(table)
    else:
        return to_jsonl(table)
    return buf.getvalue()


def _parquet(table: pa.Table, out: Any) -> None:
    """Write ``table`` as Parquet to the stream ``out``."""
    # Scores and embeddings seldom repeat: trying a dictionary for them costs more than the
    # rest of the encoding. Carried-over keys and labels keep theirs.
    pq.write_table(table, out, use_dictionary=_dictionary_columns(table.schema))


def _dictionary_columns(schema: pa.Schema) -> list[str]:
    return [f.name for f in schema if not _floating(f.type)]


def _floating(kind: pa.DataType) -> bool:
    if pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind) or pa.types.is_large_list(kind):
        return _floating(kind.value_type)
    return bool(pa.types.is_floating(kind))


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def read_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def output_filesystem(
    path: str, storage: StorageOptions | None = None
) -> tuple[pafs.FileSystem, str]:
    """The filesystem and root path of an output location (local or a URI)."""
    return resolve(path, storage)


def record_dict(record: PartRecord) -> dict[str, object]:
    """A record as it is kept in the ledger (without any row data)."""
    row = asdict(record)
    row.pop("data")
    return row
