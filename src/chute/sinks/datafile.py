"""A data file of a file sink while it is written: :class:`DataFile`.

Runs of rows are appended as they come, so a writer holds no more than the run in hand
however large the file grows; for Parquet, runs smaller than a row group's worth
(:data:`GROUP_ROWS` rows or :data:`GROUP_BYTES`) are held until they make one, then
written as one row group (a model's batches of 64 rows were each a row group: 3,125 of
them and a 660 KB footer for 200,000 rows, which every reader pays for). Readers see the
file only once :meth:`DataFile.close` has put it under its name. Locally the rows go
straight into a temporary file beside it (``.part-….tmp``, an orphan that the ledger
removes should the process die), renamed into place; on an object store, whose upload
completes when its stream closes, into an in-memory buffer of the encoded bytes (at most
a file's worth, compressed), uploaded in one PUT.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from chute.errors import ModelError
from chute.formats import check_csv, csv_ready
from chute.retry import retrying
from chute.sinks.files import as_written, encode, parquet_options
from chute.sinks.records import PartRecord, describe_columns
from chute.stages import holds_null, typed_by
from chute.storage import is_local, put, settle, writing


def unheld(table: pa.Table, fmt: str, exc: Exception) -> ModelError:
    """The error for output columns of a type ``fmt`` cannot hold (an interval in Parquet
    or CSV): each column written alone, those that fail named. It was an ``Arrow could not
    handle the data`` (exit 3, bad input) naming no column."""
    bad = []
    for name in table.column_names:
        one = table.select([name]).slice(0, 1)
        try:
            sink = pa.BufferOutputStream()
            if fmt == "parquet":
                pq.write_table(one, sink)
            elif fmt == "csv":
                pacsv.write_csv(one, sink)
        except pa.ArrowNotImplementedError:
            bad.append(f"{name!r} ({one.schema.field(name).type})")
    which = ", ".join(bad) or "a column"
    return ModelError(
        f"the output format {fmt} cannot hold {which}: {exc}. Return another type from the "
        "model (a struct, a string, a number), or write JSON Lines (output: {format: jsonl})."
    )


GROUP_ROWS = 65_536
"""Rows that make a Parquet row group worth writing (the runs before are held)."""
GROUP_BYTES = 8 * 2**20
"""Or Arrow bytes (wide rows: embeddings)."""


class DataFile:
    """One output data file: the runs appended to it, and their records once it is closed.

    The sizes used to decide what goes in the file (:attr:`rows`, :attr:`nbytes`, Arrow's
    in-memory bytes as :class:`~chute.job.FileTarget` counts them) are those *planned* for
    it, so a coalescer can decide under its own lock and append under :attr:`lock`.
    """

    def __init__(
        self,
        fs: pafs.FileSystem,
        root: str,
        name: str,
        fmt: str,
        fenced: Callable[[], None] = lambda: None,
    ) -> None:
        self.name = name
        self._fenced = fenced
        """Raises if the run no longer holds the output: called before the file is put."""
        self.lock = threading.Lock()
        """Held while appending or closing: a file takes one writer at a time, in order."""
        self.rows = 0
        self.nbytes = 0
        self.schema: pa.Schema | None = None
        self._fs, self._path, self._fmt = fs, f"{root}/{name}", fmt
        self._records: list[PartRecord] = []
        self._out: Any = None
        self._tmp = ""
        self._encoder: Any = None
        self._seconds = 0.0
        self._given_up = False
        self._held: list[pa.Table] = []
        """Parquet runs not yet written: fewer than a row group's worth so far."""
        self._held_rows = self._held_bytes = 0

    def takes(self, table: pa.Table) -> bool:
        """Whether ``table``'s rows can follow those planned: the same columns and types, a
        column of the ``null`` type (all its values null) taking the file's type."""
        return self.schema is None or typed_like(table.schema, self.schema).equals(self.schema)

    def plan(self, record: PartRecord, table: pa.Table) -> tuple[PartRecord, pa.Table]:
        """Count a run of rows about to be appended; the run as the file takes it (its
        ``null`` columns of the file's type, see :func:`nulls_typed`)."""
        self.rows += table.num_rows
        self.nbytes += table.nbytes
        if self.schema is None:
            self.schema = table.schema
            return record, table
        return nulls_typed(record, table, self.schema)

    def append(self, records: Sequence[PartRecord], tables: Sequence[pa.Table]) -> None:
        """Write the runs' rows after those already in the file (the caller holds ``lock``)."""
        began = time.perf_counter()
        with self._aborting():
            if self._out is None:
                self._open()
            if self._fmt != "parquet":
                for table in tables:
                    self._encode(table)
            else:
                self._held += tables
                self._held_rows += sum(t.num_rows for t in tables)
                self._held_bytes += sum(t.nbytes for t in tables)
                if self._held_rows >= GROUP_ROWS or self._held_bytes >= GROUP_BYTES:
                    self._write_held()
        self._records += records
        self._seconds += time.perf_counter() - began

    def close(self) -> list[PartRecord]:
        """Finish the file and put it under its name; the records of its runs, naming it
        (the caller holds ``lock``)."""
        began = time.perf_counter()
        with self._aborting():
            self._write_held()
            if self._encoder is not None:
                self._encoder.close()
            size = int(self._out.tell())
            self._fenced()
            if self._tmp:
                self._out.close()
                settle(self._tmp, self._path)  # on the disk before its ledger line
            else:
                data = self._out.getvalue()
                retrying(lambda: put(self._fs, self._path, data), f"writing {self.name}")
        seconds = self._seconds + time.perf_counter() - began
        units = len({r.unit for r in self._records})
        rows = max(sum(r.end - r.start for r in self._records), 1)
        return [
            replace(
                r,
                path=self.name,
                nbytes=size,
                seconds=r.seconds + seconds * (r.end - r.start) / rows,
                file_units=units,
            )
            for r in self._records
        ]

    def discard(self) -> None:
        """Give the file up (a failed run): its temporary is removed, nothing is put. A
        writer stuck in it keeps it (the temporary is then an orphan the ledger removes)."""
        if self.lock.acquire(timeout=5):
            try:
                self._abort()
            finally:
                self.lock.release()

    def _open(self) -> None:
        if is_local(self._fs):
            directory, _, base = self._path.rpartition("/")
            self._tmp = f"{directory}/.{base}.{uuid.uuid4().hex[:8]}.tmp"
            self._out = self._fs.open_output_stream(self._tmp)
        else:  # closing an object store's stream completes the upload: bytes first
            self._out = pa.BufferOutputStream()

    def _encode(self, table: pa.Table) -> None:
        try:
            self._encode_as(table)
        except pa.ArrowNotImplementedError as exc:  # not the input's fault: its output's
            raise unheld(table, self._fmt, exc) from exc

    def _encode_as(self, table: pa.Table) -> None:
        if self._fmt == "csv":
            table = csv_ready(table)
        elif self._fmt == "parquet":
            table = as_written(table)
        if self._encoder is None and self._fmt == "parquet":
            options = parquet_options(table)
            self._encoder = pq.ParquetWriter(self._out, table.schema, **options)
        elif self._encoder is None and self._fmt == "csv":
            check_csv(table.schema)  # a list column the plan could not foresee
            self._encoder = pacsv.CSVWriter(self._out, table.schema)
        if self._encoder is not None:
            self._encoder.write_table(table)
        else:  # lines: JSON Lines, OpenAI Batch output
            self._out.write(encode(table, self._fmt))

    @contextlib.contextmanager
    def _aborting(self) -> Any:
        """Translate a write's ``OSError`` (a full disk) and give the file up on any error."""
        if self._given_up:
            raise RuntimeError(
                f"{self.name} was given up after an earlier error: its units are not "
                "committed, and the resume writes them again"
            )
        try:
            with writing(self._path):
                yield
        except BaseException:
            self._abort()
            raise

    def _write_held(self) -> None:
        """The held runs as one row group (or as many as they fill)."""
        held, self._held = self._held, []
        self._held_rows = self._held_bytes = 0
        if len(held) > 1:
            self._encode(pa.concat_tables(held))
        elif held:
            self._encode(held[0])

    def _abort(self) -> None:
        self._given_up = True
        self._held = []
        out, encoder, self._out, self._encoder = self._out, self._encoder, None, None
        if encoder is not None:
            with contextlib.suppress(Exception):  # else it would finish itself when collected
                encoder.close()
        if out is not None:
            with contextlib.suppress(Exception):
                out.close()
        if self._tmp:
            with contextlib.suppress(OSError):  # what a full disk holds of it, freed
                self._fs.delete_file(self._tmp)
            self._tmp = ""


def typed_like(schema: pa.Schema, like: pa.Schema) -> pa.Schema:
    """``schema`` with each column of the ``null`` type, or that holds it (a model's empty
    lists, ``list<null>``), of the type ``like`` has for it, where that is the column's
    with only its null places typed (:func:`~chute.stages.convert.typed_by`)."""
    fields = []
    for field in schema:
        index = like.get_field_index(field.name)
        typed = like.field(index).type if index >= 0 else field.type
        fits = holds_null(field.type) and typed_by(field.type, typed) == typed
        fields.append(field.with_type(typed) if fits else field)
    return pa.schema(fields, schema.metadata)


def nulls_typed(
    record: PartRecord, table: pa.Table, like: pa.Schema
) -> tuple[PartRecord, pa.Table]:
    """A run whose model returned only ``None`` (a column of the ``null`` type), or only
    empty lists (``list<null>``), with that column of ``like``'s type, its values as they
    were: a Parquet writer takes one schema, and a run of the ``null`` type beside a typed
    one in a file stopped the run. The record's columns say the type written (the
    committer checks them)."""
    typed = typed_like(table.schema, like)
    if typed.equals(table.schema):
        return record, table
    return replace(record, columns=describe_columns(typed)), table.cast(typed)
