"""The writer of a stage's output: :class:`Output` (which columns, where) and
:class:`PartWriter`, which writes a batch's rows (quarantined rows apart) and describes
what it wrote (:class:`~chute.sinks.records.PartRecord`)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from chute.errors import ConfigError, DataError
from chute.evaluation import Evaluation
from chute.job import FileTarget, Sink
from chute.lease import Fence
from chute.retry import retrying
from chute.sinks.datafile import DataFile
from chute.sinks.files import (
    EXTENSIONS,
    cut,
    encode,
    file_groups,
    in_key_order,
    in_order,
    write_parquet,
)
from chute.sinks.records import PartRecord, describe_columns, runs, to_ipc
from chute.stages import (
    EMPTY,
    ERROR_COLUMNS,
    ERROR_MESSAGE,
    ERROR_MODEL,
    KEY,
    OUTPUT_OF,
    SKIPPED,
    UNREADABLE,
)
from chute.storage import StorageOptions, is_local, make_dir, put, resolve
from chute.tables import (
    TableSink,
    part_info,
    partition_fields,
    partition_row,
    partition_values,
    split,
)

ERRORS_DIR = "_errors"
"""Where rows a model failed on go, inside the output location (readers skip ``_`` names)."""


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
    fence: Fence | None = None
    """The run's claim on a file output: checked before each file is put in place."""

    def columns(self, available: pa.Schema | Sequence[str]) -> list[str]:
        """Carryover columns, then each model's outputs in model order: the columns its
        stage marked as its own (:data:`~chute.stages.OUTPUT_OF`, in a batch's schema);
        where there is no such mark for a model, the columns named ``<model>`` or
        ``<model>_*`` that are not input columns."""
        marked: dict[str, list[str]] = {}
        for column in available if isinstance(available, pa.Schema) else ():
            owner = (column.metadata or {}).get(OUTPUT_OF)
            if owner is not None:
                marked.setdefault(owner.decode(), []).append(column.name)
        names = available.names if isinstance(available, pa.Schema) else list(available)
        owned = {c for names in marked.values() for c in names}
        produced: list[str] = []
        for model in self.models:
            produced += marked.get(model) or [
                c
                for c in names
                if (c == model or c.startswith(model + "_"))
                and c not in self.carryover
                and c not in self.source_columns
                and c not in owned
                and c not in produced
                and c != KEY
            ]
        return [*self.carryover, *produced]


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
        prepared = self.prepare(table)
        if not self.joins:
            return [record for record, _ in prepared]
        records, rows = cut([r for r, _ in prepared], [t for _, t in prepared], self.target)
        return self._write_files(records, rows)

    def prepare(self, table: pa.Table) -> list[tuple[PartRecord, pa.Table | None]]:
        """Each run of a unit's rows in ``table`` (in key order) with its record: the run's
        failed rows written as an errors part, its metrics measured, and its rows when they
        are left to a data file (a file sink; else ``None``: written as a part already, or
        no rows to write)."""
        if table.num_rows == 0:
            return []
        found = runs(table.column(KEY).to_numpy())
        if self.joins and not in_order(found):
            table = in_key_order(table, found)
            found = runs(table.column(KEY).to_numpy())
        errors = None
        if ERROR_MODEL in table.column_names:
            errors = _select(table, [*self.output.carryover, *ERROR_COLUMNS])
        full, table = table, _select(table, [*self.output.columns(table.schema), KEY])
        prepared = []
        for lo, hi, unit, start, total in found:
            record, healthy = self._write_run(
                table.slice(lo, hi - lo), _slice(errors, lo, hi), unit, start, total
            )
            if self.output.evaluation and record.end > record.start and not record.skipped:
                written = _healthy(full.slice(lo, hi - lo))
                record = replace(record, metrics=self.output.evaluation.measure(written))
            prepared.append((record, None if healthy is None else healthy.drop_columns([KEY])))
        return prepared

    def new_file(self, unit: int, start: int) -> DataFile:
        """A data file of the sink, named after the first run it will hold."""
        assert self.sink is not None
        fs, root = self._filesystem()
        name = self._name(unit, start, self.sink.format)
        return DataFile(fs, root, name, self.sink.format, self._fenced)

    def _fenced(self) -> None:
        """Raise if the run no longer holds the output (:class:`~chute.lease.Fence`)."""
        if self.output.fence is not None:
            self.output.fence.check(*self._filesystem())

    def _write_files(
        self, records: list[PartRecord], rows: list[pa.Table | None]
    ) -> list[PartRecord]:
        """Write the runs' rows as files (see :func:`file_groups`); each record names its file."""
        out = list(records)
        for group in file_groups(records, rows, self.target):
            file = self.new_file(records[group[0]].unit, records[group[0]].start)
            with file.lock:
                file.append([records[i] for i in group], [t for i in group if (t := rows[i])])
                for i, record in zip(group, file.close(), strict=True):
                    out[i] = record
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
        input_rows = 0
        if failed is None or errors is None:
            errors = None
        else:
            part = part.filter(pa.array(~failed))
            errors = errors.filter(pa.array(failed))
            input_rows = _unreadable_rows(errors)  # by chute's own column: a carried "model"
            errors = errors.rename_columns(
                [*self.output.carryover, "model", "error_type", "error_message"]
            )
        error_rows = 0 if errors is None else errors.num_rows
        if self.sink is None:
            data = to_ipc(part)
            record = PartRecord(
                unit,
                start,
                end,
                total,
                "",
                len(data),
                0.0,
                data,
                error_rows=error_rows,
                input_error_rows=input_rows,
                columns=describe_columns(part.schema) if part.num_rows else "",
            )
            return record, None
        path, size, table = "", 0, ""  # a file sink's rows go to a file with others'
        if isinstance(self.sink, TableSink) and part.num_rows:
            path, size, table = self._put_table(part, unit, start)
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
            input_error_rows=input_rows,
            errors_nbytes=bad_size,
            table=table,
            columns=describe_columns(part.schema) if part.num_rows else "",
        )
        return record, part if self.joins and part.num_rows else None

    def _put_table(self, part: pa.Table, unit: int, start: int) -> tuple[str, int, str]:
        """A table sink's part (sorted as the sink says): its first file, bytes, info."""
        assert isinstance(self.sink, TableSink)
        data = part.drop_columns([KEY])
        if self.sink.sort_by:
            data = _sorted(data, self.sink.sort_by)
        data = _not_null(data, self.sink, unit)
        if self.sink.format == "lance":
            return self._put_lance(data)
        data = _microseconds_utc(data)
        if self.sink.partition_by:
            return self._put_partitioned(data, unit, start)
        path, size = self._put(data, unit, start, self._folder(errors=False))
        return path, size, part_info(data.schema)

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
        Delta keeps partition values in its log, not in the files. Iceberg keeps them in
        the files too, and each file's value goes to the driver with it: the table records
        the file's partition from it, as its footer's statistics cannot tell (none for a
        long string, a NaN's or a zero's sign lost)."""
        assert isinstance(self.sink, TableSink)
        fields = partition_fields(self.sink.partition_by)
        in_log = [f.column for f in fields] if self.sink.format == "delta" else []
        pieces = split(data, fields)
        # all first: a value refused after some pieces' files were put would leave them as
        # orphans until the next run
        values = [
            partition_values(piece, fields) if in_log else partition_row(piece, fields)
            for piece in pieces
        ]
        files = []
        for piece, value in zip(pieces, values, strict=True):
            stored = piece.drop_columns(in_log)
            path, size = self._put(stored, unit, start, self._folder(errors=False))
            files.append((path, piece.num_rows, size, value))
        info = part_info(data.schema, files=files)
        return files[0][0], sum(f[2] for f in files), info

    def _put(self, table: pa.Table, unit: int, start: int, folder: str) -> tuple[str, int]:
        """Write ``table`` whole under a unique name; its path and size."""
        assert self.sink is not None
        fmt = "parquet" if isinstance(self.sink, TableSink) else self.sink.format
        name = self._name(unit, start, fmt)
        relative = f"{folder}/{name}" if folder else name
        fs, root = self._filesystem()
        if folder and is_local(fs):  # object stores have no directories to make
            make_dir(fs, f"{root}/{folder}")
        if fmt == "parquet":  # streamed into the file: no copy of the file in memory
            delta = not isinstance(self.sink, TableSink)  # see parquet_options
            payload: bytes | Callable[[pa.NativeFile], None] = partial(
                write_parquet, table, delta=delta
            )
        else:
            payload = encode(table, fmt)
        self._fenced()
        size = retrying(lambda: put(fs, f"{root}/{relative}", payload), f"writing {relative}")
        return relative, size

    @staticmethod
    def _name(unit: int, start: int, fmt: str) -> str:
        """A part's unique name: its first unit and row, then a random tag."""
        return f"part-{unit:06d}-{start:010d}-{uuid.uuid4().hex[:8]}{EXTENSIONS[fmt]}"


def _sorted(data: pa.Table, columns: Sequence[str]) -> pa.Table:
    """``data`` sorted by the sink's ``sort_by``; a column it lacks, or one Arrow cannot
    order (a list), refused naming it (the message was Arrow's, with the part's rows)."""
    for name in columns:
        if name not in data.column_names:
            raise ConfigError(
                f"sort_by names {name!r}, which the job's output does not have (its columns: "
                f"{', '.join(data.column_names)}): sort by an output column, or write it."
            )
        kind = data.schema.field(name).type
        if pa.types.is_nested(kind) or isinstance(kind, pa.BaseExtensionType):
            raise ConfigError(
                f"sort_by names {name!r}, a {kind} column, which has no order: sort by a "
                "column of numbers, text, times or dates."
            )
    return data.sort_by([(c, "ascending") for c in columns])


def _not_null(table: pa.Table, sink: TableSink, unit: int) -> pa.Table:
    """``table`` with the table's NOT NULL columns marked so (Iceberg's ``add_files``
    refuses a file whose column may be null for a required one); a null in one is an
    error: the table's library never sees chute's rows, and Delta took them in silence."""
    if not sink.required:
        return table
    if missing := [name for name in sink.required if name not in table.column_names]:
        raise DataError(
            f"the rows of unit {unit} have no column {missing[0]!r}, which {sink.name} has "
            "NOT NULL: a model named for it did not return it. Return it from the model, carry "
            "it over from the input, or write to a table whose column may be null."
        )
    fields = []
    for column_field, column in zip(table.schema, table.columns, strict=True):
        if column_field.name in sink.required:
            if column.null_count:
                raise DataError(
                    f"column {column_field.name!r} is null in {column.null_count:,} row(s) of "
                    f"unit {unit}, but {sink.name} has it NOT NULL. Return a value in every "
                    "row (fill the nulls in the model or a preprocess step), or write to a "
                    "table whose column may be null."
                )
            column_field = column_field.with_nullable(False)
        fields.append(column_field)
    return table.cast(pa.schema(fields, table.schema.metadata))


def _microseconds_utc(table: pa.Table) -> pa.Table:
    """Timestamps as Iceberg and Delta store them: microseconds (a Delta table made with
    pandas' nanoseconds needs a reader feature its own reader lacks; Iceberg refuses them;
    Delta refuses seconds, which a CSV's times are read as), and, where zoned, in UTC (the
    same instants). A nanosecond value that microseconds cannot hold is refused, never
    rounded."""
    for i, column_field in enumerate(table.schema):
        kind = column_field.type
        if not pa.types.is_timestamp(kind) or (kind.unit == "us" and kind.tz in (None, "UTC")):
            continue
        want = pa.timestamp("us", tz=kind.tz and "UTC")
        try:
            column = table.column(i).cast(want)  # safe: a lost nanosecond raises
        except pa.ArrowInvalid as exc:
            raise DataError(
                f"column {column_field.name!r} holds timestamps finer than a microsecond, which a "
                f"table stores as microseconds ({exc}). Round them in a preprocess step or "
                "the model, or write Parquet files."
            ) from exc
        table = table.set_column(i, column_field.with_type(want), column)
    return table


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


def _unreadable_rows(errors: pa.Table) -> int:
    """How many failed rows (by chute's own error columns) are input rows that could not
    be decoded, not a model's failures."""
    models = errors.column(ERROR_MODEL).to_numpy(zero_copy_only=False)
    return int(np.count_nonzero(models == UNREADABLE))


def _failed_mask(errors: pa.Table | None) -> np.ndarray | None:
    """Which rows a model failed on, or ``None`` when none did."""
    if errors is None:
        return None
    failed = errors.column(ERROR_MODEL).is_valid().to_numpy(zero_copy_only=False)
    return failed if failed.any() else None


def output_filesystem(
    path: str, storage: StorageOptions | None = None
) -> tuple[pafs.FileSystem, str]:
    """The filesystem and root path of an output location (local or a URI)."""
    return resolve(path, storage)
