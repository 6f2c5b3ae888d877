"""Table sinks — Apache Iceberg, Delta Lake, Lance — written exactly once.

Workers write data files as for a directory output (Parquet for Iceberg and Delta, Lance
data files for Lance) into the table's data folder; the driver commits completed units to
the table in batches, one table transaction each, and writes into that transaction's own
metadata (Iceberg's snapshot summary, Delta's commit info, Lance's transaction properties)
the job, the batch's token and the units it holds (:data:`JOB_KEY`, :data:`BATCH_KEY`,
:data:`UNITS_KEY`). :mod:`chute.tableledger` keeps chute's side of that protocol.

This module holds what the formats share: :class:`TableSink` (the spec), the
:class:`Table` protocol each format implements for the driver, the registry that imports
a format's library only when a job uses it, and the schema check on append.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import importlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from chute.errors import ConfigError, DataError
from chute.job import Sink
from chute.storage import META_DIR, StorageOptions

TableFormat = Literal["iceberg", "delta", "lance"]
TABLE_FORMATS: dict[str, str] = {
    "iceberg": "pyiceberg",
    "delta": "deltalake",
    "lance": "lance",
}
"""Each table format and the package it is written with (imported when a job uses it)."""
JOB_KEY = "chute.job"
"""In a table commit's metadata: which chute job (the fingerprint's first 16 digits)."""
BATCH_KEY = "chute.batch"
"""In a table commit's metadata: the commit batch's token, as chute's ledger names it."""
UNITS_KEY = "chute.units"
"""In a table commit's metadata: the indexes of the units it holds (``0-7,9``)."""
JOBS_DIR = "jobs"
"""``_chute/jobs/<job>/``: a job's ledger, report and quarantined rows."""
DATA_DIR = "data"
"""The folder of a table's data files, inside its location (Iceberg's and Lance's own)."""


@dataclass(frozen=True)
class Index:
    """A vector index built once, at the end of a run (Lance only).

    >>> Index("embedding", type="ivf_pq", num_partitions=4, num_sub_vectors=8)  # doctest: +SKIP
    """

    column: str
    type: str = "ivf_pq"
    """Lance's index type: ``ivf_pq``, ``ivf_flat``, ``ivf_hnsw_sq``, ..."""
    metric: str = "l2"
    """``l2``, ``cosine`` or ``dot``."""
    num_partitions: int | None = None
    num_sub_vectors: int | None = None


@dataclass(frozen=True)
class TableSink(Sink):
    """Results appended to a table, exactly once.

    >>> TableSink(format="iceberg", table="db.predictions",
    ...           catalog={"type": "sql", "uri": "sqlite:///cat.db", "warehouse": "file:///wh"})
    ... # doctest: +SKIP
    >>> TableSink("out/vectors.lance", format="lance", index=Index("emb"))  # doctest: +SKIP
    """

    path: str = ""
    """The table's location (Delta, Lance); found from the catalog for Iceberg."""
    format: TableFormat = "iceberg"  # type: ignore[assignment]
    table: str = ""
    """Iceberg: the table's identifier in the catalog, ``namespace.name``."""
    catalog: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """Iceberg: the catalog's properties as ``pyiceberg.catalog.load_catalog`` takes them
    (``type: sql``, ``uri``, ``warehouse``, ...). Never stored or printed."""
    sort_by: tuple[str, ...] = ()
    """Columns each data file is sorted by (and, for a new Iceberg table, its sort order)."""
    partition_by: tuple[str, ...] = ()
    """A new table's partitions: columns, or (Iceberg) ``year(c)``, ``month(c)``,
    ``day(c)``, ``hour(c)``. Workers write one data file per partition value of a part.
    A table that exists keeps its own partitions (:func:`resolve`)."""
    index: Index | None = None
    """Lance: a vector index built at the end of the run."""
    commit_seconds: float = 5.0
    """Completed units wait at least this long to be committed together: one table
    transaction (and its metadata files) per batch, not per unit. See
    :meth:`chute.tableledger.TableLedger.flush_due`."""
    job_dir: str = ""
    """Set by :func:`resolve`: the folder of this job's data files inside the table."""
    errors_dir: str = ""
    """Set by :func:`resolve`: where rows a model failed on go (quarantine), in Parquet."""
    required: tuple[str, ...] = ()
    """Set by :func:`resolve`: the table's NOT NULL (Iceberg: required) columns. Parts
    write them as such, and a null in one stops the run (:func:`chute.sinks.writer`):
    chute adds its files to the table as they are, so the table's library never checks."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "storage", (self.storage or StorageOptions()).with_env())
        object.__setattr__(self, "sort_by", tuple(self.sort_by))
        if self.format not in TABLE_FORMATS:
            raise ConfigError(
                f"table format {self.format!r} is not one of {', '.join(TABLE_FORMATS)}."
            )
        if self.format == "iceberg" and not self.table:
            raise ConfigError("an iceberg output needs `table: namespace.name` (and a `catalog`).")
        if self.format != "iceberg" and not self.path:
            raise ConfigError(f"a {self.format} output needs `path:` (the table's location).")
        if self.commit_seconds < 0:
            raise ConfigError(f"commit_seconds must be >= 0, got {self.commit_seconds}.")
        # chute takes an object key as written; delta-rs and Lance parse it as a URL ("%20"
        # a space, "?v=2" dropped), and delta-rs a local path's "%41" as "A": its log and
        # chute's files would part ways, and the table could never be read
        odd = "%?#" if "://" in (self.path or "") else "%" if self.format == "delta" else ""
        if self.path and any(c in self.path for c in odd):
            raise ConfigError(
                f"a {self.format} table's location {self.path!r} holds "
                f"{' or '.join(repr(c) for c in odd if c in self.path)}, which the table's own "
                "library reads otherwise than chute: choose a path without it."
            )
        object.__setattr__(self, "partition_by", tuple(self.partition_by))
        fields = partition_fields(self.partition_by)  # a malformed entry: refused here
        if fields and self.format == "lance":
            raise ConfigError(
                "lance tables have no partitions: leave out `partition_by` (a scalar index "
                "on the column serves the same filters), or write an iceberg or delta table."
            )
        transformed = [f.text for f in fields if f.transform != IDENTITY]
        if transformed and self.format != "iceberg":
            raise ConfigError(
                f"partition_by {', '.join(transformed)}: {self.format} tables are partitioned "
                "by columns only; add the derived column in the model or preprocess step and "
                "partition by it."
            )
        if self.index is not None and self.format != "lance":
            raise ConfigError(
                f"`index` is built for lance tables only; {self.format} has no vector index."
            )

    @property
    def name(self) -> str:
        """How messages name the table."""
        return f"{self.format} table {self.table or self.path!r}"


@dataclass(frozen=True)
class DataFile:
    """One data file a commit adds, its path relative to the table's location."""

    path: str
    rows: int
    bytes: int
    fragment: Mapping[str, Any] | None = None
    """Lance: the fragment's metadata (its JSON form), as the worker wrote it."""
    partition: Mapping[str, str | None] | None = None
    """Delta: the file's partition values, as the log writes them. Iceberg: its first row
    of each partition column (:func:`partition_row`)."""


IDENTITY = "identity"
TRANSFORMS = (IDENTITY, "year", "month", "day", "hour")
"""The partition transforms chute splits parts by (Iceberg's time transforms; Delta has
columns only)."""


@dataclass(frozen=True)
class PartitionField:
    """One field of a partition spec: a column, and how its values group."""

    column: str
    transform: str = IDENTITY

    @property
    def text(self) -> str:
        """As a job writes it: ``column`` or ``day(column)``."""
        return self.column if self.transform == IDENTITY else f"{self.transform}({self.column})"


def partition_fields(spec: Sequence[str]) -> list[PartitionField]:
    """``["pickup_date", "day(pickup_at)"]`` as fields; anything else a ConfigError."""
    fields = []
    for text in spec:
        name, _, rest = text.strip().partition("(")
        column, transform = (
            (rest.removesuffix(")").strip(), name.strip()) if rest else (name, IDENTITY)
        )
        if transform not in TRANSFORMS or not column or (rest and not rest.endswith(")")):
            raise ConfigError(
                f"partition_by {text!r}: write a column, or a transform of one: "
                f"{', '.join(f'{t}(column)' for t in TRANSFORMS[1:])}."
            )
        fields.append(PartitionField(column, transform))
    return fields


def split(table: pa.Table, fields: Sequence[PartitionField]) -> list[pa.Table]:
    """``table``'s rows split by partition value, each piece in the rows' order."""
    if not fields:
        return [table]
    for f in fields:
        if f.column not in table.column_names:
            raise DataError(
                f"the table is partitioned by column {f.column!r} (the job's partition_by, "
                "or the partitions of the table that exists), which the job's output does not "
                f"have (its columns: {', '.join(table.column_names)}). Write that column (carry "
                "it over, or return it from the model), or write to another table."
            )
    keys = {f"key{i}": _key(table.column(f.column), f.transform) for i, f in enumerate(fields)}
    index = pa.table({**keys, "row": pa.array(range(table.num_rows), pa.int64())})
    groups = index.group_by(list(keys), use_threads=False).aggregate([("row", "list")])
    rows = groups.column("row_list").combine_chunks()
    return [table.take(rows[i].values) for i in range(len(rows))]


def _key(column: pa.ChunkedArray, transform: str) -> pa.ChunkedArray:
    """What rows of one partition share: the value, or its UTC year/month/day/hour."""
    if transform == IDENTITY:
        return column
    kind = column.type
    if not (pa.types.is_timestamp(kind) or pa.types.is_date(kind)):
        raise DataError(
            f"partition_by {transform}(...) needs a date or timestamp column; it is {kind}."
        )
    if pa.types.is_timestamp(kind) and kind.tz:  # Iceberg's transforms work in UTC
        column = column.cast(pa.timestamp(kind.unit))
    return pc.floor_temporal(column, unit=transform)


def partition_values(piece: pa.Table, fields: Sequence[PartitionField]) -> dict[str, str | None]:
    """A piece's value of each identity field, as Delta's log writes partition values.

    An empty string is refused: Delta reads an empty partition value as null, so the rows
    would be read back with null in that column (and filtered as null)."""
    values = {}
    for f in fields:
        if f.transform == IDENTITY:
            kind = piece.schema.field(f.column).type
            if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
                raise DataError(
                    f"partition column {f.column!r} is {kind}: a delta table keeps partition "
                    "values as text, and binary ones are read back altered (b'a' as "
                    "b\"b'a'\"; delta-rs reads its own back altered too). Partition by "
                    "another column, or by a text form of this one (its hex) made in a "
                    "preprocess step."
                )
            value = piece.column(f.column)[0].as_py()
            if value == "":
                raise DataError(
                    f"partition column {f.column!r} holds an empty string, which a delta "
                    "table keeps as null: its rows would be read back with null there. Give "
                    "them a value (or null) in the model or preprocess step, or partition by "
                    "another column."
                )
            fraction = isinstance(value, decimal.Decimal) and value != value.to_integral_value()
            if fraction and value < 0:
                raise DataError(
                    f"partition column {f.column!r} holds {value}, a negative decimal with a "
                    "fraction: delta-rs reads such a partition value back as no number "
                    "('0.-500000' for -0.5), so the table could not be read. Partition by "
                    "another column, or by a text or scaled integer form of this one made "
                    "in a preprocess step."
                )
            values[f.column] = _partition_text(value)
    return values


def partition_row(piece: pa.Table, fields: Sequence[PartitionField]) -> dict[str, str | None]:
    """A piece's first value of each partition field's column, for Iceberg: the column's
    first row as Arrow IPC, in base64 (:func:`partition_value` reads it back). Exact, of
    any type: the driver records the file's partition from it (its transform applied),
    where the footer's statistics are no guide (none for a value over 4 KiB, none for a
    NaN, -0.0 the least of a file of zeros)."""
    out: dict[str, str | None] = {}
    for f in fields:
        one = piece.select([f.column]).slice(0, 1)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, one.schema) as stream:
            stream.write_table(one)
        out[f.column] = base64.b64encode(sink.getvalue().to_pybytes()).decode()
    return out


def partition_value(text: str) -> Any:
    """The value :func:`partition_row` wrote, as Python (``as_py``)."""
    table = pa.ipc.open_stream(pa.py_buffer(base64.b64decode(text))).read_all()
    return table.column(0)[0].as_py()


def _partition_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, datetime.datetime):
        if value.tzinfo is not None:  # Delta reads a partition's text as UTC
            value = value.astimezone(datetime.timezone.utc)
        return str(value.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds"))
    return value.isoformat() if isinstance(value, datetime.date) else str(value)


@dataclass(frozen=True)
class Lineage:
    """What a table's history says of some batch tokens: those its current state descends
    from, and whether that was read back to the table's first commit.

    Only commits the current state descends from count: one a rollback or restore went back
    before is not in the table, though its entry is still in the history. Where the history
    is ``whole``, a token not ``held`` is not in the table (never taken, undone, or the table
    made again since); where it is not (snapshots expired, old log entries cleaned up, more
    commits than a look reads), the history cannot tell.
    """

    held: frozenset[str]
    whole: bool


class Table(Protocol):
    """A table as the driver sees it: one implementation per format."""

    location: str
    """The table's root URI (where its data files go)."""

    def schema(self) -> pa.Schema | None:
        """The table's schema as Arrow, or ``None`` while the table does not exist."""

    def lineage(self, tokens: set[str]) -> Lineage:
        """Which of these batch tokens a commit that the table's current state descends
        from holds (:class:`Lineage`)."""

    def holds(self, paths: set[str]) -> set[str]:
        """Which of these data files (relative to the table's location) the table's current
        state names: the answer where its history no longer shows a batch's commit."""

    def commit(self, files: Sequence[DataFile], schema: pa.Schema, meta: dict[str, str]) -> None:
        """Add ``files`` in one transaction whose metadata holds ``meta`` (creating the
        table with ``schema`` if it does not exist)."""

    def finish(self) -> dict[str, Any]:
        """End of a run (an index to build): what the report says about the table."""

    def partitioning(self) -> tuple[str, ...] | None:
        """The table's partitions as a job writes them (``day(pickup_at)``), or ``None``
        while the table does not exist."""

    def unsupported(self, schema: pa.Schema) -> list[pa.Field]:
        """The columns of ``schema`` whose type the format cannot hold (a duration in
        Iceberg or Delta)."""


def open_table(sink: TableSink) -> Table:
    """The driver's handle on ``sink``'s table; its format's package imported now."""
    package = TABLE_FORMATS[sink.format]
    try:
        module = importlib.import_module(f"chute.tables.{sink.format}")
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != package:
            raise
        raise ConfigError(
            f"writing {sink.format} tables needs the {package} package: "
            f"pip install 'chute[{sink.format}]'"
        ) from exc
    table: Table = module.open_table(sink)
    return table


def job_folder(job: str) -> str:
    """A job's folder in a table's location: its ledger, report and ``errors/``."""
    return f"{META_DIR}/{JOBS_DIR}/{job}"


def resolve(sink: TableSink, job: str) -> tuple[TableSink, Table, pa.Schema | None]:
    """``sink`` with its location and this job's data folder filled in, its table, and the
    table's schema (``None`` while the table does not exist)."""
    table = open_table(sink)
    folder = DATA_DIR if sink.format == "lance" else f"{DATA_DIR}/chute-{job}"
    errors = f"{job_folder(job)}/errors"
    existing = table.schema()
    resolved = replace(
        sink,
        path=table.location.rstrip("/"),
        job_dir=folder,
        errors_dir=errors,
        partition_by=_partitions(sink, table),
        required=tuple(f.name for f in existing if not f.nullable) if existing else (),
    )
    return resolved, table, existing


def check_not_null(
    sink: TableSink, existing: pa.Schema | None, writes: Callable[[str], bool]
) -> None:
    """Refuse, before any compute, a table whose NOT NULL columns the job cannot keep: one
    it does not write (``writes``: whether it writes a column), or NOT NULL values nested
    in a column (a list's elements, a struct's field), which chute does not write yet."""
    if existing is not None and (inner := [f.name for f in existing if _inner_not_null(f.type)]):
        raise DataError(
            f"{sink.name}'s column {inner[0]!r} holds values that may not be null (a list's "
            "elements, a struct's field): chute does not write such nested NOT NULL values yet "
            "and would add files the table refuses or that break its rule. Write to a table "
            "whose nested values may be null, or write Parquet files."
        )
    if unwritten := [name for name in sink.required if not writes(name)]:
        raise DataError(
            f"{sink.name} has "
            + ", ".join(f"NOT NULL column {name!r} the job does not write" for name in unwritten)
            + ": its rows would have none there. Carry the column over from the input, have "
            "a model return it, or write to another table."
        )


def _inner_not_null(kind: pa.DataType) -> bool:
    """Whether a value inside ``kind`` (a list's element, a struct's or map's field) is
    NOT NULL."""
    if isinstance(kind, pa.BaseExtensionType):
        kind = kind.storage_type
    if pa.types.is_struct(kind):
        inner = [kind.field(i) for i in range(kind.num_fields)]
    elif pa.types.is_map(kind):
        inner = [kind.item_field]  # the key is never null: Parquet's rule, not the table's
    elif (
        pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)
    ):
        inner = [kind.value_field]
    else:
        return False
    return any(not f.nullable or _inner_not_null(f.type) for f in inner)


def _partitions(sink: TableSink, table: Table) -> tuple[str, ...]:
    """The partitions parts are split by: the table's own once it exists (the job's
    ``partition_by`` may repeat them, not change them)."""
    existing = table.partitioning()
    if existing is None:
        return sink.partition_by
    wanted = tuple(f.text for f in partition_fields(sink.partition_by))
    if wanted and wanted != existing:
        raise ConfigError(
            f"{sink.name} is partitioned by {list(existing) or 'nothing'}, the job asks for "
            f"{list(wanted)}: chute does not change a table's partitions. Leave out "
            "`partition_by`, or write to a new table."
        )
    return existing


# --------------------------------------------------------------------------- schemas


def schema_bytes(schema: pa.Schema) -> str:
    """An Arrow schema as text (for a part record)."""
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_from(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def check_schema(table: pa.Schema, written: pa.Schema, where: str, ordered: bool = False) -> None:
    """Refuse rows whose columns the table cannot take, naming the column and both types.

    Types are compared as the table formats store them: a string is a string however
    Arrow lays it out, and a fixed-size list (an embedding) is a list in Iceberg and Delta.
    ``ordered``: the columns must also come in the table's order (Lance).
    """
    have = {f.name: f.type for f in table}
    extra = [n for n in written.names if n not in have]
    if extra:
        raise DataError(
            f"the job writes column(s) {', '.join(map(repr, extra))} that {where} does not "
            f"have (its columns: {', '.join(table.names)}). Write to a new table, or leave "
            "them out of the job's output (carryover, model outputs)."
        )
    for f in written:
        if _kind(f.type) != _kind(have[f.name]) and not _widens(f.type, have[f.name]):
            raise DataError(
                f"column {f.name!r} is {f.type} in the job's output but {have[f.name]} in "
                f"{where}. Cast it in the model or preprocess step, or write to a new table."
            )
    if ordered and list(written.names) != list(table.names):
        raise DataError(
            f"{where} holds the columns {list(table.names)}, the job writes "
            f"{list(written.names)}: a lance table is appended to column for column, in order."
        )


def check_storable(table: Table, schema: pa.Schema, where: str) -> None:
    """Refuse columns whose type ``table``'s format cannot hold, naming them and the fix:
    the format's own error came from deep in a commit, after every unit was computed
    (Delta: "External error: Schema error: Invalid data type", with Rust's backtrace).
    Timestamps are left to the writer, which stores them in microseconds, and a column of
    the null type to the commit's check, which says what to do about it."""
    leave = (pa.types.is_timestamp, pa.types.is_null)  # the writer's, the commit's own check
    bad = [f for f in table.unsupported(schema) if not any(test(f.type) for test in leave)]
    if bad:
        names = ", ".join(f"{f.name!r} ({f.type})" for f in bad)
        raise DataError(
            f"{where} cannot hold the column(s) {names}: the table format has no such type. "
            "Cast them in the model or a preprocess step (a duration or a time of day to "
            "int64, float16 to float32), leave them out of the output, or write files."
        )


def _kind(kind: pa.DataType) -> str:
    """A type as a table stores it."""
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or _is(kind, "string_view"):
        return "string"
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return "binary"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return f"list<{_kind(kind.value_type)}>"
    if pa.types.is_map(kind):  # the names of its entries (Lance, Delta, Iceberg rename them)
        return f"map<{_kind(kind.key_type)}, {_kind(kind.item_type)}>"
    if pa.types.is_struct(kind):
        return f"struct<{', '.join(f'{f.name}: {_kind(f.type)}' for f in kind)}>"
    if pa.types.is_dictionary(kind):
        return _kind(kind.value_type)
    if pa.types.is_timestamp(kind):
        return f"timestamp[{'tz' if kind.tz else ''}]"
    return str(kind)


def _widens(written: pa.DataType, table: pa.DataType) -> bool:
    """A narrower signed integer into a wider one (Iceberg has no int8 or int16: a table
    created from them holds int32, and Parquet stores them as int32 anyway)."""
    signed = pa.types.is_signed_integer
    return bool(signed(written) and signed(table) and written.bit_width <= table.bit_width)


def _is(kind: pa.DataType, name: str) -> bool:
    test = getattr(pa.types, f"is_{name}", None)
    return bool(test(kind)) if test is not None else False


# --------------------------------------------------------------------------- commit metadata


def units_text(indexes: Sequence[int]) -> str:
    """Unit indexes as ranges: ``[0, 1, 2, 5]`` → ``"0-2,5"``."""
    out: list[str] = []
    ordered = sorted(set(indexes))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def units_of(text: str) -> list[int]:
    """The inverse of :func:`units_text`."""
    units: list[int] = []
    for piece in filter(None, text.split(",")):
        lo, _, hi = piece.partition("-")
        units += range(int(lo), int(hi or lo) + 1)
    return units


def commit_meta(job: str, token: str, units: Sequence[int]) -> dict[str, str]:
    """What a table commit's metadata says about the units it holds."""
    return {JOB_KEY: job, BATCH_KEY: token, UNITS_KEY: units_text(units)}


def part_info(
    schema: pa.Schema,
    fragments: Sequence[Mapping[str, Any]] = (),
    files: Sequence[Sequence[Any]] = (),
) -> str:
    """What a part record tells the driver for a table: the part's schema (and the Lance
    fragments it wrote, or its files split by partition: path, rows, bytes, values)."""
    info: dict[str, Any] = {"schema": schema_bytes(schema)}
    if fragments:
        info["fragments"] = [dict(f) for f in fragments]
    if files:
        info["files"] = [list(f) for f in files]
    return json.dumps(info, separators=(",", ":"))
