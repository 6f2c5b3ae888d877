"""Units and the source protocol: what every reader of input data shares.

A unit is a file, a range of Parquet row groups, or a slice of in-memory data. It has a
stable id (the ledger records committed units by id) and, where the format allows, a
row count known from metadata alone. Planning never reads data rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from chute.errors import ChuteError, DataError, StorageError, missing_columns_error
from chute.retry import ATTEMPTS, transient

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
    size: int | None = None
    """The file's size in bytes when it was listed: a remote read asks for its byte ranges
    without a request for the size (the unit carries it, not the listing)."""
    stamp: int | None = None
    """The file's modification time (ns) when it was listed: a local file read with another
    was rewritten since, even at the same size."""
    listed: tuple[tuple[int | None, int | None], ...] = ()
    """The ``(size, stamp)`` of each of :attr:`files` when it was listed: each file of a unit
    that groups several is checked as it is read, as :attr:`size` and :attr:`stamp` are for
    a unit of one file."""


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


def stream(
    source: Source, unit: Unit, columns: Sequence[str] | None, dictionary: Sequence[str] = ()
) -> Iterator[pa.Table] | None:
    """A unit's rows in batches as they are decoded, where its source can (an optional
    ``stream`` method, as :class:`~chute.sources.FileSource` has for local Parquet);
    ``None``: the unit is read whole. ``dictionary``: columns read as Arrow dictionaries
    (a :class:`~chute.sources.FileSource`'s only)."""
    method = getattr(source, "stream", None)
    if method is None:
        return None
    batches: Iterator[pa.Table] | None = (
        method(unit, columns, dictionary=dictionary) if dictionary else method(unit, columns)
    )
    return batches


def iter_slices(table: pa.Table, rows: int = READ_BATCH_ROWS) -> Iterator[pa.Table]:
    """Zero-copy slices of at most ``rows`` rows."""
    for start in range(0, table.num_rows, rows):
        yield table.slice(start, rows)


def check_columns(schema: pa.Schema, wanted: Sequence[str], where: str) -> None:
    """Fail before any compute if a named column does not exist."""
    missing = [c for c in wanted if c not in schema.names]
    if missing:
        raise missing_columns_error(missing, schema.names, where)


def unreadable(what: str, exc: BaseException) -> ChuteError:
    """Why ``what`` (``input file 'x.parquet'``) could not be read: a :class:`DataError`
    for the file's own fault (corrupt, truncated: skipped under ``on_bad_input: skip``),
    a :class:`StorageError` for storage that would not answer after retries (a 503, a
    dropped connection): skipped, its rows would be lost while the run succeeds."""
    if transient(exc):
        return StorageError(
            f"reading {what} failed after {ATTEMPTS} tries: {exc}. The storage did not "
            "answer, the file is not at fault: nothing was skipped for it. Run the job again "
            "to resume once the storage answers."
        )
    return DataError(f"cannot read {what}: {exc}")
