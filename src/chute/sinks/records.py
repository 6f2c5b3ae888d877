"""What the driver learns of a written part: :class:`PartRecord`, small and of fixed
size, shipped as an Arrow table (:func:`records_to_table`), and the runs of a unit's rows
in a batch (:func:`runs`)."""

from __future__ import annotations

import itertools
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
