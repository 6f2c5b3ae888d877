"""In-memory inputs as sources: Arrow tables (from pandas, NumPy too) and Ray Datasets."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from chute.errors import ConfigError, DataError
from chute.raydata import quiet_data
from chute.sources.base import MEMORY_UNIT_ROWS, Unit


class TableSource:
    """In-memory data held as one Arrow table, split into slices."""

    def __init__(self, table: pa.Table, unit_rows: int = MEMORY_UNIT_ROWS) -> None:
        if not isinstance(table, pa.Table):
            raise ConfigError(
                f"TableSource takes a pyarrow Table, got {type(table).__name__}: pass "
                "pa.Table.from_pandas(frame), or give the data to chute.run / chute.predict, "
                "which take frames, dicts and arrays."
            )
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
        described = {"kind": "memory", "rows": self.table.num_rows, "content": self.digest()}
        if self.unit_rows != MEMORY_UNIT_ROWS:  # the units' ids; the default's stays out, so
            described["unit_rows"] = self.unit_rows  # that earlier fingerprints still hold
        return described

    def digest(self) -> str:
        """A hash of the table's contents (one pass over its buffers, computed once)."""
        if self._digest is None:
            # Columns hashed on all cores at once: hashlib lets go of the GIL for big buffers.
            with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
                self._digest = _table_digest(self.table, pool.map).hex()[:32]
        return self._digest


def _column_digest(column: pa.ChunkedArray) -> bytes:
    h = hashlib.sha256()
    for chunk in column.chunks:
        for buffer in chunk.buffers():
            if buffer is not None:
                h.update(memoryview(buffer))
    return h.digest()


def _table_digest(table: pa.Table, mapping: Callable[..., Iterable[bytes]] = map) -> bytes:
    """A table's hash: its schema and every column's buffers (columns hashed by
    ``mapping``: a thread pool's ``map`` for a big table)."""
    h = hashlib.sha256(str(table.schema).encode())
    for digest in mapping(_column_digest, table.columns):
        h.update(digest)
    return h.digest()


class DatasetSource:
    """A Ray Dataset, materialized once; each of its blocks is a unit."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self._refs: list[Any] | None = None
        self._digest: str | None = None

    def _blocks(self) -> list[Any]:
        if self._refs is None:
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
        return {"kind": "ray-dataset", "blocks": len(self._blocks()), "content": self.digest()}

    def digest(self) -> str:
        """A hash of every block's contents, each hashed by a task where it lives (one pass
        over the data, as :meth:`TableSource.digest`): a Dataset changed since an output
        was written, even with as many blocks, is another job, never resumed into it."""
        if self._digest is None:
            import ray

            hashing = ray.remote(num_cpus=0.25)(_table_digest)
            digests = ray.get([hashing.remote(ref) for ref in self._blocks()])
            h = hashlib.sha256()
            for digest in digests:
                h.update(digest)
            self._digest = h.hexdigest()[:32]
        return self._digest


def table_from_dict(data: dict[str, Any]) -> pa.Table:
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
