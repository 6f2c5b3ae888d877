"""Lance through pylance: workers write fragments, the driver commits them.

A worker writes a part as Lance data files with ``lance.fragment.write_fragments`` (into
the dataset's ``data/`` folder; nothing is committed) and hands the fragment's metadata to
the driver in its part record. A batch is one ``LanceOperation.Append`` of those fragments
(``Overwrite`` creates the dataset), committed as a ``lance.Transaction`` whose
``transaction_properties`` carry chute's keys. A fixed-size list column (an embedding) is
a vector column; :class:`~chute.tables.Index` builds a vector index once, at the end.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("LANCE_LOG", "error")  # not a warning per fragment of a new dataset

import lance
import pyarrow as pa
import pyarrow.fs as pafs
from lance import LanceOperation
from lance.fragment import FragmentMetadata

from chute.storage import StorageOptions, resolve
from chute.tables import BATCH_KEY, DATA_DIR, DataFile, Lineage, TableSink, check_schema
from chute.tables.delta import storage_options

TRANSACTIONS_PER_READ = 1_000
"""How many recent transactions one look at the history reads (a batch being resolved
is always among the last few)."""


def write_fragments(
    table: pa.Table, location: str, storage: StorageOptions | None
) -> list[dict[str, Any]]:
    """Write ``table`` as Lance data files of the dataset at ``location`` (uncommitted);
    the fragments' metadata. Where the dataset's columns cannot take the table's, the
    error names the column and both types, as for Iceberg and Delta (Lance's own is an
    I/O error: "Append with different schema"); where they hold the same values in
    another layout (``large_string`` into ``string``, a dictionary, ``int32`` into
    ``int64``, a fixed-size list into a list), the rows are cast to the dataset's."""
    options = storage_options(location, storage) or None
    try:
        fragments = lance.fragment.write_fragments(
            table, location, schema=table.schema, storage_options=options
        )
    except OSError as error:
        if "schema" not in str(error).lower():
            raise
        try:  # a dataset's columns refused the rows; or a type Lance has no way to store
            dataset = lance.dataset(location, storage_options=options)
        except (OSError, ValueError):
            raise error from None
        check_schema(dataset.schema, table.schema, f"the lance table {location}", ordered=True)
        theirs = pa.schema([dataset.schema.field(name) for name in table.column_names])
        try:  # a safe cast: an overflow or a lost digit raises, and Lance's error stands
            table = table.cast(theirs)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise error from None
        fragments = lance.fragment.write_fragments(
            table, location, schema=theirs, storage_options=options
        )
    return [dict(f.to_json()) for f in fragments]


def fragment_files(fragment: dict[str, Any]) -> list[tuple[str, int]]:
    """The data files of a fragment, relative to the dataset, with their sizes."""
    return [
        (f"{DATA_DIR}/{f['path']}", int(f.get("file_size_bytes") or 0)) for f in fragment["files"]
    ]


class Lance:
    """The driver's handle on one Lance dataset."""

    def __init__(self, sink: TableSink) -> None:
        self.sink = sink
        self.location = sink.path.rstrip("/")
        self.options = storage_options(sink.path, sink.storage) or None

    def _load(self) -> lance.LanceDataset | None:
        """The dataset, or ``None`` where there is none yet (no ``_versions/``). Any other
        failure to open it is raised: taken for "no dataset", a transient error made the
        next commit an Overwrite, and the rows another tool had written were gone."""
        if not self._exists():
            return None
        return lance.dataset(self.location, storage_options=self.options)

    def _exists(self) -> bool:
        fs, root = resolve(self.location, self.sink.storage)
        selector = pafs.FileSelector(f"{root}/_versions", allow_not_found=True)
        return bool(fs.get_file_info(selector))

    def unsupported(self, schema: pa.Schema) -> list[pa.Field]:
        return []  # Lance's writer names a type it cannot hold (an interval) itself

    def schema(self) -> pa.Schema | None:
        dataset = self._load()
        return None if dataset is None else dataset.schema

    def lineage(self, tokens: set[str]) -> Lineage:
        """The tokens among the properties of the transactions the current version descends
        from (of the last :data:`TRANSACTIONS_PER_READ`): a ``Restore`` goes back to the
        version it restored, and the versions between are not in the dataset; an
        ``Overwrite`` (the dataset made, or made again in place) ends it. Whole where it
        ended so, or version 1 was read (none cleaned up)."""
        dataset = self._load()
        if dataset is None or not tokens:
            return Lineage(frozenset(), whole=True)
        latest = dataset.version
        recent = dataset.get_transactions(TRANSACTIONS_PER_READ)  # newest first, one a version
        transactions = {latest - i: t for i, t in enumerate(recent)}
        found: set[str] = set()
        version = latest
        while version >= 1 and (transaction := transactions.get(version)) is not None:
            if isinstance(transaction.operation, LanceOperation.Restore):
                version = transaction.operation.version
                continue
            props = transaction.transaction_properties or {}
            if props.get(BATCH_KEY) in tokens:
                found.add(props[BATCH_KEY])
            if isinstance(transaction.operation, LanceOperation.Overwrite):
                # the dataset made (again) here: nothing before it is in it, its history kept
                return Lineage(frozenset(found), whole=True)
            version -= 1
        return Lineage(frozenset(found), whole=version < 1)

    def holds(self, paths: set[str]) -> set[str]:
        dataset = self._load()
        if dataset is None or not paths:
            return set()
        current = {
            f"{DATA_DIR}/{f.path}" for frag in dataset.get_fragments() for f in frag.metadata.files
        }
        return paths & current

    def commit(self, files: Sequence[DataFile], schema: pa.Schema, meta: dict[str, str]) -> None:
        fragments = [FragmentMetadata.from_json(_json(f.fragment)) for f in files if f.fragment]
        dataset = self._load()
        if dataset is None:
            operation: LanceOperation.BaseOperation = LanceOperation.Overwrite(schema, fragments)
            version = 0
        else:
            operation, version = LanceOperation.Append(fragments), dataset.version
        transaction = lance.Transaction(version, operation, transaction_properties=meta)
        lance.LanceDataset.commit(
            self.location, transaction, read_version=version, storage_options=self.options
        )

    def partitioning(self) -> tuple[str, ...] | None:
        return None if self._load() is None else ()  # a Lance dataset has no partitions

    def finish(self) -> dict[str, Any]:
        dataset = self._load()
        report: dict[str, Any] = {"format": "lance", "location": self.location}
        index = self.sink.index
        if dataset is not None and index is not None:
            dataset.create_index(
                index.column,
                index.type.upper(),
                metric=index.metric,
                replace=True,
                num_partitions=index.num_partitions,
                num_sub_vectors=index.num_sub_vectors,
            )
            dataset = self._load()
            report["index"] = {
                "column": index.column,
                "type": index.type,
                "metric": index.metric,
                "rows": dataset.count_rows() if dataset is not None else 0,
            }
        report["version"] = dataset.version if dataset is not None else None
        return report


def _json(fragment: Any) -> str:
    import json

    return json.dumps(dict(fragment))


def open_table(sink: TableSink) -> Lance:
    return Lance(sink)
