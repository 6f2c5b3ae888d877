"""Sources: where rows come from, split into units that can be read independently.

A unit is a file, a range of Parquet row groups, or a slice of in-memory data. It has a
stable id (the ledger records committed units by id) and, where the format allows, a
row count known from metadata alone. Planning never reads data rows.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.json as pajson
import pyarrow.parquet as pq

from chute.errors import ChuteError, ConfigError, DataError, missing_columns_error
from chute.retry import retrying
from chute.storage import (
    StorageOptions,
    check,
    is_local,
    open_input_file,
    parquet_metadata,
    permanent,
    read_row_groups,
    redact,
    resolve,
    storage_error,
)

FORMATS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
}
UNIT_TARGET_ROWS = 1_000_000
"""Parquet files larger than this are split into units of whole row groups."""
READ_BATCH_ROWS = 65_536
"""Rows per batch handed downstream by a reader; units are read whole, then sliced."""
MEMORY_UNIT_ROWS = 262_144
"""Rows per unit for in-memory data."""


class UnreadableRows(DataError):
    """Some rows of a unit cannot be decoded (an image file, say); the others can.

    ``table`` holds every row of the unit (placeholders where bad), ``bad`` the positions
    and reasons: under ``on_bad_input: skip`` the reader sends the bad rows to the errors
    dataset and the rest on.
    """

    def __init__(self, message: str, table: pa.Table, bad: Sequence[tuple[int, str]]) -> None:
        super().__init__(message)
        self.table = table
        self.bad = list(bad)

    def __reduce__(self) -> tuple[Any, ...]:
        """Across processes (a failed Ray task) it travels as the DataError it is, without
        the rows: only the reader that caught it needs those."""
        return (DataError, (str(self),))


@dataclass(frozen=True)
class Unit:
    """An independently readable piece of the input."""

    index: int
    """Position in the plan; rows are tagged with it on their way to the writer."""
    id: str
    """Stable across runs of the same job: the ledger's key."""
    rows: int | None
    """Row count from metadata, or ``None`` where the format cannot tell without reading."""
    nbytes: int | None = None
    """Uncompressed size estimate, for batch sizes given in bytes."""
    path: str | None = None
    row_groups: tuple[int, ...] | None = None
    offset: int = 0
    ref: Any = field(default=None, compare=False)
    """A Ray object reference holding the unit's table (Ray Dataset input)."""
    files: tuple[str, ...] = ()
    """The files of a unit that groups several (images), so that a read task gets only its own."""
    error: str = ""
    """Why the unit cannot be read, where planning found out (a Parquet footer): the job
    fails naming it, or skips it (``on_bad_input``)."""


class Source(Protocol):
    """What the engines need from a source. Implementations must be picklable."""

    def schema(self) -> pa.Schema:
        """Columns and types, from metadata."""
        ...

    def plan(self) -> list[Unit]:
        """Split the input into units; metadata only."""
        ...

    def read(self, unit: Unit, columns: Sequence[str] | None) -> pa.Table:
        """Read one unit, projected to ``columns``."""
        ...

    def describe(self) -> dict[str, Any]:
        """What identifies the input, for the job fingerprint."""
        ...


def iter_slices(table: pa.Table, rows: int = READ_BATCH_ROWS) -> Iterator[pa.Table]:
    """Zero-copy slices of at most ``rows`` rows."""
    for start in range(0, table.num_rows, rows):
        yield table.slice(start, rows)


def _filesystem(path: str, storage: StorageOptions | None = None) -> tuple[pafs.FileSystem, str]:
    return resolve(path, storage)


def _has_glob(path: str) -> bool:
    return any(ch in path for ch in "*?[")


def _list_files(fs: pafs.FileSystem, path: str, original: str) -> list[pafs.FileInfo]:
    """The files of a path, directory or glob: one recursive listing (paginated on an
    object store: one request per 1,000 objects), never a request per file."""
    try:
        return retrying(lambda: _listing(fs, path, original), f"listing {redact(original)}")
    except ChuteError:
        raise
    except OSError as exc:
        if permanent(exc):
            raise storage_error(exc, original, "input") from exc
        raise DataError(f"cannot list the input {redact(original)!r}: {exc}") from exc


def _listing(fs: pafs.FileSystem, path: str, original: str) -> list[pafs.FileInfo]:
    if _has_glob(path):
        base = path[: min(path.find(ch) for ch in "*?[" if ch in path)].rsplit("/", 1)[0]
        infos = fs.get_file_info(pafs.FileSelector(base or "/", recursive=True))
        files = [i for i in infos if i.is_file and fnmatch.fnmatch(i.path, path)]
        if not files:
            raise DataError(f"the glob {redact(original)!r} matches no files. Check the pattern.")
        return sorted(files, key=lambda i: i.path)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise DataError(f"input path {redact(original)!r} does not exist. Check the path.")
    if info.type == pafs.FileType.File:
        return [info]
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    files = [
        i for i in infos if i.is_file and not _hidden(i.path[len(path) :]) and i.size and i.size > 0
    ]
    return sorted(files, key=lambda i: i.path)


def _hidden(relative: str) -> bool:
    return any(part.startswith((".", "_")) for part in relative.split("/") if part)


def _format_of(path: str) -> str | None:
    return FORMATS.get(os.path.splitext(path)[1].lower())


class FileSource:
    """Parquet, CSV or JSON Lines files: one file, a directory or a glob.

    >>> FileSource("data/*.parquet").plan()  # doctest: +SKIP
    """

    def __init__(
        self,
        path: str | Sequence[str],
        format: str | None = None,
        storage: StorageOptions | None = None,
    ) -> None:
        self.paths = [path] if isinstance(path, str) else list(path)
        if not self.paths:
            raise DataError("no input path given: name a file, a directory or a glob.")
        self.format = format
        self.storage = (storage or StorageOptions()).with_env()
        """How to reach remote storage; carried to workers, which rebuild the filesystem."""
        self._files: list[str] | None = None
        self._stamps: dict[str, tuple[int | None, int | None]] = {}
        self._fs: pafs.FileSystem | None = None
        self._bad: dict[str, str] = {}
        """Files found unreadable while planning, and why."""

    def __getstate__(self) -> dict[str, Any]:
        return {
            "paths": self.paths,
            "format": self.format,
            "_files": self._files,
            "_stamps": getattr(self, "_stamps", {}),
            "storage": self.storage,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._fs = None
        self._bad = {}

    @property
    def filesystem(self) -> pafs.FileSystem:
        if self._fs is None:
            self._fs = _filesystem(self.paths[0], self.storage)[0]
        return self._fs

    def files(self) -> list[str]:
        """Every input file, sorted; listed once."""
        if self._files is None:
            found: list[pafs.FileInfo] = []
            for original in self.paths:
                check(original, self.storage)  # a missing bucket, refused credentials
                fs, path = _filesystem(original, self.storage)
                self._fs = fs
                found.extend(_list_files(fs, path, original))
            if not found:
                where = ", ".join(redact(p) for p in self.paths)
                raise DataError(f"no input files under {where}: nothing to do.")
            self._stamps = {i.path: (i.size, i.mtime_ns) for i in found}
            self._files = [i.path for i in found]
            self.format = self.format or self._infer_format(self._files)
        return self._files

    def _infer_format(self, files: list[str]) -> str:
        formats = {_format_of(f) for f in files}
        if len(formats) == 1 and None not in formats:
            return str(formats.pop())
        raise DataError(
            f"cannot tell the input format of {redact(self.paths[0])!r} from its file names "
            f"({files[0]}). Set the format: parquet, csv or jsonl."
        )

    def _open(self, path: str) -> Any:
        """Open a file for random access."""
        return open_input_file(self.filesystem, path)

    def schema(self) -> pa.Schema:
        """The columns of the first file that can be read (for CSV and JSON Lines, of the
        first with rows: a header alone has no types). A file that cannot be read is
        planned as a unit that failed (:attr:`Unit.error`); the job names it or skips it."""
        fallback: pa.Schema | None = None
        for path in self.files():
            if path in self._bad:
                continue
            try:
                schema, rows = self._schema_of(path)
            except DataError as exc:
                self._bad[path] = str(exc)
                continue
            if rows != 0:
                return schema
            fallback = fallback or schema
        if fallback is not None:
            return fallback
        raise DataError(next(iter(self._bad.values())))

    def _schema_of(self, path: str) -> tuple[pa.Schema, int | None]:
        """A file's columns, and its rows where that took reading them (CSV, JSON Lines)."""
        try:
            if self.format == "parquet":
                return retrying(lambda: pq.read_schema(self._open(path)), f"reading {path}"), None
            table = retrying(lambda: self._read_file(path, None), f"reading {path}")
            return table.schema, table.num_rows
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"cannot read the schema of {path!r}: {exc}") from exc

    def plan(self) -> list[Unit]:
        files = self.files()
        if self.format != "parquet":
            return [
                Unit(i, self._unit_id(f), None, None, path=f, error=self._bad.get(f, ""))
                for i, f in enumerate(files)
            ]
        with ThreadPoolExecutor(max_workers=16) as pool:
            metas = list(pool.map(self._footer, files))
        units: list[Unit] = []
        for path, meta in zip(files, metas, strict=True):
            if isinstance(meta, DataError):
                uid = self._unit_id(path)
                units.append(Unit(len(units), uid, None, path=path, error=str(meta)))
            else:
                units.extend(self._parquet_units(path, meta, len(units)))
        return units

    def _footer(self, path: str) -> pq.FileMetaData | DataError:
        """The file's footer, or the error that says why it cannot be read."""
        try:
            size = self._stamps.get(path, (None, None))[0]
            return retrying(
                lambda: parquet_metadata(self.filesystem, path, size), f"reading {path}"
            )
        except (pa.ArrowException, OSError) as exc:
            return DataError(f"cannot read the Parquet footer of {path!r}: {exc}")

    def _parquet_units(self, path: str, meta: pq.FileMetaData, start: int) -> list[Unit]:
        units: list[Unit] = []
        group: list[int] = []
        rows = nbytes = 0
        for rg in range(meta.num_row_groups):
            group.append(rg)
            rows += meta.row_group(rg).num_rows
            nbytes += meta.row_group(rg).total_byte_size
            if rows >= UNIT_TARGET_ROWS or rg == meta.num_row_groups - 1:
                whole = len(group) == meta.num_row_groups
                uid = self._unit_id(path) + ("" if whole else f"#rg{group[0]}-{group[-1]}")
                units.append(Unit(start + len(units), uid, rows, nbytes, path, tuple(group)))
                group, rows, nbytes = [], 0, 0
        if meta.num_row_groups == 0:
            units.append(Unit(start, self._unit_id(path), 0, 0, path, ()))
        return units

    def _unit_id(self, path: str) -> str:
        return path

    def read(self, unit: Unit, columns: Sequence[str] | None) -> pa.Table:
        """Read a unit; columns the file lacks are left out (the reader names the drift)."""
        assert unit.path is not None
        if self.format is None:
            self.files()  # infers the format: never read Parquet as JSON
        path = unit.path
        try:
            return retrying(lambda: self._read_unit(path, unit, columns), f"reading {path}")
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"cannot read input file {path!r}: {exc}") from exc

    def _read_unit(self, path: str, unit: Unit, columns: Sequence[str] | None) -> pa.Table:
        if self.format == "parquet":
            size = self._stamps.get(path, (None, None))[0]
            groups = list(unit.row_groups or ())
            cols = list(columns) if columns is not None else None
            if size is not None and not is_local(self.filesystem):  # no HEAD per object
                return read_row_groups(self.filesystem, path, size, groups, cols)
            pf = pq.ParquetFile(self._open(path))
            if cols is not None:
                cols = [c for c in cols if c in pf.schema_arrow.names]
            return pf.read_row_groups(groups, columns=cols)
        return self._read_file(path, columns)

    def _read_file(self, path: str, columns: Sequence[str] | None) -> pa.Table:
        with self._open(path) as handle:
            if self.format == "csv":
                opts = pacsv.ConvertOptions(
                    include_columns=list(columns) if columns else None,
                    include_missing_columns=True,
                )
                table = pacsv.read_csv(handle, convert_options=opts)
            else:
                table = pajson.read_json(io.BytesIO(handle.read()))
        if columns is None:
            return table
        return table.select([c for c in columns if c in table.column_names])

    def describe(self) -> dict[str, Any]:
        files = self.files()
        return {
            "kind": "files",
            "format": self.format,
            "files": [[f, *self._stamps.get(f, (None, None))] for f in files],
        }


class TableSource:
    """In-memory data held as one Arrow table, split into slices."""

    def __init__(self, table: pa.Table, unit_rows: int = MEMORY_UNIT_ROWS) -> None:
        if table.num_rows == 0:
            raise DataError("the input data has no rows: nothing to predict.")
        self.table = table
        self.unit_rows = unit_rows
        self._digest: str | None = None

    def schema(self) -> pa.Schema:
        return self.table.schema

    def plan(self) -> list[Unit]:
        return [
            Unit(i, f"memory[{start}:{start + n}]", n, None, offset=start)
            for i, start in enumerate(range(0, self.table.num_rows, self.unit_rows))
            for n in [min(self.unit_rows, self.table.num_rows - start)]
        ]

    def read(self, unit: Unit, columns: Sequence[str] | None) -> pa.Table:
        table = self.table if columns is None else self.table.select(list(columns))
        return table.slice(unit.offset, unit.rows)

    def describe(self) -> dict[str, Any]:
        return {"kind": "memory", "rows": self.table.num_rows, "content": self.digest()}

    def digest(self) -> str:
        """A hash of the table's contents (one pass over its buffers, computed once)."""
        if self._digest is None:
            # Columns hashed on all cores at once: hashlib lets go of the GIL for big buffers.
            with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
                columns = list(pool.map(_column_digest, self.table.columns))
            h = hashlib.sha256(str(self.table.schema).encode())
            for digest in columns:
                h.update(digest)
            self._digest = h.hexdigest()[:32]
        return self._digest


def _column_digest(column: pa.ChunkedArray) -> bytes:
    h = hashlib.sha256()
    for chunk in column.chunks:
        for buffer in chunk.buffers():
            if buffer is not None:
                h.update(memoryview(buffer))
    return h.digest()


class DatasetSource:
    """A Ray Dataset, materialized once; each of its blocks is a unit."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self._refs: list[Any] | None = None

    def _blocks(self) -> list[Any]:
        if self._refs is None:
            from chute.engines.ray import quiet_data

            options = self.dataset.context.execution_options  # a Dataset keeps its own context
            saved, options.preserve_order = options.preserve_order, True  # blocks in input order
            try:
                with quiet_data(verbose=False):
                    self._refs = list(self.dataset.materialize().to_arrow_refs())
            finally:
                options.preserve_order = saved
        return self._refs

    def schema(self) -> pa.Schema:
        import ray

        return ray.get(self._blocks()[0]).schema

    def plan(self) -> list[Unit]:
        return [Unit(i, f"block[{i}]", None, ref=ref) for i, ref in enumerate(self._blocks())]

    def read(self, unit: Unit, columns: Sequence[str] | None) -> pa.Table:
        import ray

        table: pa.Table = ray.get(unit.ref)
        return table if columns is None else table.select(list(columns))

    def describe(self) -> dict[str, Any]:
        return {"kind": "ray-dataset", "blocks": len(self._blocks())}


def as_source(data: Any, format: str | None = None) -> Source:
    """Turn a path, a glob, a DataFrame, an Arrow table, a dict of arrays or a Ray Dataset
    into a source."""
    if isinstance(data, (FileSource, TableSource, DatasetSource)):
        return data
    if isinstance(data, (str, os.PathLike)):
        return file_source(os.fspath(data), format)
    if isinstance(data, (list, tuple)) and data and all(isinstance(p, str) for p in data):
        return file_source(list(data), format)
    if isinstance(data, pa.Table):
        return TableSource(data)
    if isinstance(data, pa.RecordBatch):
        return TableSource(pa.Table.from_batches([data]))
    if isinstance(data, dict):
        return TableSource(_table_from_dict(data))
    if type(data).__module__.startswith("pandas"):
        return TableSource(pa.Table.from_pandas(data, preserve_index=False))
    if type(data).__module__.startswith("ray.data"):
        return DatasetSource(data)
    raise DataError(
        f"cannot read input of type {type(data).__name__}: give a path, a glob, a pandas "
        "DataFrame, a pyarrow Table, a dict of NumPy arrays or a ray.data.Dataset."
    )


def _table_from_dict(data: dict[str, Any]) -> pa.Table:
    import numpy as np

    columns: dict[str, pa.Array] = {}
    for name, values in data.items():
        arr = np.asarray(values)
        if arr.ndim > 1:
            flat = pa.array(arr.reshape(len(arr), -1).ravel())
            columns[name] = pa.FixedSizeListArray.from_arrays(flat, int(np.prod(arr.shape[1:])))
        else:
            columns[name] = pa.array(arr)
    return pa.table(columns)


def file_source(
    paths: str | Sequence[str],
    format: str | None = None,
    storage: StorageOptions | None = None,
    **options: Any,
) -> FileSource:
    """Files as a source; image files (``format="images"``, or named ``.jpg``/``.png``, or a
    folder of them) become a :class:`chute.images.ImageSource` taking ``options``."""
    from chute.images import ImageSource, looks_like_images

    if format == "images" or (format is None and looks_like_images(paths)):
        return ImageSource(paths, storage=storage, **options)
    if any(v is not None for v in options.values()):
        raise ConfigError(
            f"{', '.join(options)}: options of image inputs, but the input is {format or 'not'} "
            "images. Set format: images, or leave the options out."
        )
    return FileSource(paths, format, storage)


def check_columns(schema: pa.Schema, wanted: Sequence[str], where: str) -> None:
    """Fail before any compute if a named column does not exist."""
    missing = [c for c in wanted if c not in schema.names]
    if missing:
        raise missing_columns_error(missing, schema.names, where)
