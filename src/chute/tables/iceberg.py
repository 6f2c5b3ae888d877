"""Apache Iceberg through pyiceberg: any catalog it supports (its SQL catalog on SQLite
for local use and tests).

A batch is one fast append of the Parquet files the workers wrote, whose snapshot summary
carries chute's keys: what ``add_files`` would commit (the footers give the statistics, no
row is read), but each file's partition is the value its writer split it by, not one read
from the statistics. A resume looks for a batch's token in the summaries of the current
snapshot and its ancestors, back to one that emptied the table (a whole-table overwrite):
a snapshot rolled back is not in the table, and a table dropped and made again has none
of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.io.pyarrow import (
    UnsupportedPyArrowTypeException,
    _check_pyarrow_schema_compatible,
    _pyarrow_to_schema_without_ids,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    schema_to_pyarrow,
)
from pyiceberg.manifest import DataFile as IcebergDataFile
from pyiceberg.manifest import DataFileContent, FileFormat
from pyiceberg.partitioning import partition_record_value
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table import TableProperties
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation, Snapshot, ancestors_of
from pyiceberg.transforms import parse_transform
from pyiceberg.typedef import Record
from pyiceberg.utils.concurrent import ExecutorFactory
from pyiceberg.utils.properties import property_as_bool

from chute.errors import ConfigError
from chute.tables import (
    BATCH_KEY,
    IDENTITY,
    TRANSFORMS,
    DataFile,
    Lineage,
    PartitionField,
    TableSink,
    partition_fields,
    partition_value,
)

COMMIT_ATTEMPTS = 5
"""Tries of one append when another writer commits to the table at the same moment."""


class Iceberg:
    """The driver's handle on one Iceberg table."""

    def __init__(self, sink: TableSink, catalog: Catalog, table: IcebergTable | None) -> None:
        self.sink = sink
        self.catalog = catalog
        self._table = table
        namespace, _, name = sink.table.rpartition(".")
        self.location = (
            table.location()
            if table is not None
            else sink.path or _default_location(catalog, namespace, name)
        )

    def unsupported(self, schema: pa.Schema) -> list[pa.Field]:
        out = []
        for column in schema:
            try:
                _pyarrow_to_schema_without_ids(pa.schema([column]))
            except (UnsupportedPyArrowTypeException, ValueError):  # ValueError: the null type
                out.append(column)
        return out

    def schema(self) -> pa.Schema | None:
        table = self._load()
        return None if table is None else schema_to_pyarrow(table.schema(), include_field_ids=False)

    def lineage(self, tokens: set[str]) -> Lineage:
        """The tokens in the summaries of the current snapshot and its ancestors, back to
        the table's first commit (sequence number 1) or to a snapshot that emptied the
        table (:func:`_emptied`): whole where the walk ended at either, or the table has no
        snapshot. Nothing committed before a snapshot that left the table without a data
        file is in it, though its parents still name the job's batches: pyiceberg's
        ``overwrite`` of a whole table is such a ``delete`` snapshot, then an ``append`` of
        the new rows, the chain of parents kept (a walk through it found this job's
        batches, and a finished job run again said "nothing to do" over a table without
        its rows).

        Not "the oldest has no parent": a snapshot whose parent expired has none to walk
        to, and an overwrite whose ``delete`` snapshot expired, or a compaction, whose
        ancestors held this job's batches, looks just the same: not whole, trusted. A
        format v1 table numbers no snapshots: its history is taken as whole only while
        empty, or back to a snapshot that emptied it."""
        table = self._load()
        if table is None or not tokens:
            return Lineage(frozenset(), whole=True)
        found, oldest = set(), None
        for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
            oldest = snapshot
            token = snapshot.summary.get(BATCH_KEY) if snapshot.summary else None
            if token in tokens:
                found.add(token)
            if _emptied(snapshot):  # nothing older is in the table
                return Lineage(frozenset(found), whole=True)
        whole = oldest is None or oldest.sequence_number == 1
        return Lineage(frozenset(found), whole=whole)

    def holds(self, paths: set[str]) -> set[str]:
        """The data files a scan of the current snapshot reads. Not ``inspect.files()``:
        pyiceberg 0.12 fails on a snapshot without a manifest (the table replaced by its
        ``overwrite`` with no rows: "Must pass at least one table")."""
        table = self._load()
        if table is None or not paths or table.current_snapshot() is None:
            return set()
        current = {task.file.file_path for task in table.scan().plan_files()}
        return {p for p in paths if f"{self.location}/{p}" in current}

    def commit(self, files: Sequence[DataFile], schema: pa.Schema, meta: dict[str, str]) -> None:
        """One append of ``files``, each with the partition its writer gave it, not one
        pyiceberg's ``add_files`` would read from the footer's statistics: a string over
        4 KiB has none (the files recorded in a null partition, and a filter on the value
        finding none of their rows), a NaN none, and a file of 0.0 has -0.0 as its least."""
        table = self._load() or self._create(schema)
        paths = [f"{self.location}/{f.path}" for f in files]
        footers = _footers(table, paths)  # once: a retry builds the data files anew
        for attempt in range(COMMIT_ATTEMPTS):
            try:
                _append(table, files, paths, footers, meta)
                return
            except CommitFailedException:
                if attempt == COMMIT_ATTEMPTS - 1:
                    raise
                table = table.refresh()  # another writer committed first: append on top

    def finish(self) -> dict[str, Any]:
        table = self._load()
        snapshot = table.current_snapshot() if table is not None else None
        return {
            "format": "iceberg",
            "table": self.sink.table,
            "location": self.location,
            "snapshot": snapshot.snapshot_id if snapshot is not None else None,
        }

    def partitioning(self) -> tuple[str, ...] | None:
        table = self._load()
        if table is None:
            return None
        fields = []
        for spec_field in table.spec().fields:
            column = table.schema().find_column_name(spec_field.source_id)
            transform = str(spec_field.transform)
            if transform not in TRANSFORMS:
                raise ConfigError(
                    f"{self.sink.name} is partitioned by {transform}({column}), which chute "
                    f"cannot split parts by (it can: {', '.join(TRANSFORMS)}). Write to a new "
                    "table, or append to this one with pyiceberg itself."
                )
            fields.append(PartitionField(str(column), transform).text)
        return tuple(fields)

    def _load(self) -> IcebergTable | None:
        if self._table is None:
            try:
                self._table = self.catalog.load_table(self.sink.table)
            except NoSuchTableError:
                return None
        else:
            self._table = self._table.refresh()
        return self._table

    def _create(self, schema: pa.Schema) -> IcebergTable:
        namespace, _, _ = self.sink.table.rpartition(".")
        self.catalog.create_namespace_if_not_exists(namespace)
        if self.catalog.table_exists(self.sink.table):  # made since: another run's
            self._table = self.catalog.load_table(self.sink.table)
            return self._table
        # One commit: the table with its partition spec and sort order, or nothing. Three
        # (create, then spec, then order) left a table unpartitioned where the spec's step
        # failed or the run died between them, and every later run was refused for it.
        create = self.catalog.create_table_transaction(
            self.sink.table, schema=schema, location=self.location
        )
        fields = partition_fields(self.sink.partition_by)
        if fields:
            with create.update_spec() as update:
                for f in fields:
                    update.add_field(f.column, parse_transform(f.transform), _name(f))
        if self.sink.sort_by:
            with create.update_sort_order() as order:
                for column in self.sink.sort_by:
                    order.asc(column, _identity())
        create.commit_transaction()
        self._table = self.catalog.load_table(self.sink.table)
        return self._table


def _footers(table: IcebergTable, paths: list[str]) -> list[tuple[pq.FileMetaData, int]]:
    """Each file's Parquet footer and size, read as ``add_files`` reads them (in parallel)."""

    def read(path: str) -> tuple[pq.FileMetaData, int]:
        source = table.io.new_input(path)
        with source.open() as stream:
            footer = pq.read_metadata(stream)
        return footer, len(source)

    return list(ExecutorFactory.get_or_create().map(read, paths))


def _append(
    table: IcebergTable,
    files: Sequence[DataFile],
    paths: list[str],
    footers: list[tuple[pq.FileMetaData, int]],
    meta: dict[str, str],
) -> None:
    """What ``add_files`` commits, in one snapshot whose summary holds ``meta`` (chute's
    batch token), each file's partition set from the value chute wrote it for. Nothing
    is committed where a file is refused. chute's tokens keep files from being added
    twice: no scan of every file the table holds."""
    with table.transaction() as tx:
        if tx.table_metadata.name_mapping() is None:  # chute's files have no field ids
            mapping = tx.table_metadata.schema().name_mapping.model_dump_json()
            tx.set_properties({TableProperties.DEFAULT_NAME_MAPPING: mapping})
        metadata = tx.table_metadata
        data_files = [
            _data_file(metadata, path, footer, size, f.partition)
            for f, path, (footer, size) in zip(files, paths, footers, strict=True)
        ]
        merge = property_as_bool(
            metadata.properties,
            TableProperties.MANIFEST_MERGE_ENABLED,
            TableProperties.MANIFEST_MERGE_ENABLED_DEFAULT,
        )
        update = tx.update_snapshot(snapshot_properties=meta)
        with update.merge_append() if merge else update.fast_append() as append:
            for data_file in data_files:
                append.append_data_file(data_file)


def _data_file(
    metadata: TableMetadata,
    path: str,
    footer: pq.FileMetaData,
    size: int,
    known: Mapping[str, str | None] | None,
) -> IcebergDataFile:
    """pyiceberg's ``parquet_file_to_data_file``, but for the partition: from the values
    the writer gave the file (``known``, :func:`chute.tables.partition_row`), each field's
    transform applied. A field without one (the table partitioned since the run began) is
    read from the footer's statistics, as ``add_files`` does."""
    schema = metadata.schema()
    _check_pyarrow_schema_compatible(
        schema, footer.schema.to_arrow_schema(), format_version=metadata.format_version
    )
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=footer,
        stats_columns=compute_statistics_plan(schema, metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    spec = metadata.spec()
    values: list[Any] = []
    inferred: Record | None = None
    for i, spec_field in enumerate(spec.fields):
        column = schema.find_column_name(spec_field.source_id)
        text = (known or {}).get(str(column))
        if text is None:
            inferred = inferred or statistics.partition(spec, schema)
            values.append(inferred[i])
            continue
        source = schema.find_field(spec_field.source_id).field_type
        value = partition_record_value(spec_field, partition_value(text), schema)
        values.append(spec_field.transform.transform(source)(value))
    return IcebergDataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=Record(*values),
        file_size_in_bytes=size,
        sort_order_id=None,
        spec_id=metadata.default_spec_id,
        equality_ids=None,
        key_metadata=None,
        **statistics.to_serialized_dict(),
    )


def _emptied(snapshot: Snapshot) -> bool:
    """Whether this snapshot removed data files and left the table with none: the table
    emptied, by a whole-table ``overwrite`` (its ``delete`` snapshot), a delete of every
    row, or an ``overwrite`` whose filter matched every row. A delete of some rows keeps
    the table's other files (or rewrites them: an ``overwrite`` snapshot that removes
    every file its parent held and adds what is left), and a compaction (``replace``)
    rewrites files without a row less: neither empties it, and the job's batches older
    than them are trusted, as rows another writer deleted are not written again. A
    summary without the counts (a writer that keeps none) empties nothing."""
    summary = snapshot.summary
    if summary is None or summary.operation == Operation.REPLACE:
        return False
    deleted, left = summary.get("deleted-data-files"), summary.get("total-data-files")
    return deleted not in (None, "0") and left == "0"


def _name(field: PartitionField) -> str:
    """The partition field's name: the column's, or ``pickup_at_day``."""
    return field.column if field.transform == IDENTITY else f"{field.column}_{field.transform}"


def _identity() -> Any:
    from pyiceberg.transforms import IdentityTransform

    return IdentityTransform()


def _default_location(catalog: Catalog, namespace: str, name: str) -> str:
    """Where the catalog puts a new table (its warehouse), so workers can write there."""
    resolve = getattr(catalog, "_resolve_table_location", None)
    if resolve is None:
        raise ConfigError(
            f"the catalog of iceberg table {namespace}.{name!r} does not say where a new table "
            "goes: create the table first, or give the output a `path:` (its location)."
        )
    return str(resolve(None, namespace, name)).rstrip("/")


def catalog_properties(sink: TableSink) -> dict[str, str]:
    """The catalog's properties as the job gives them, with the job's S3 endpoint and
    region (its ``storage:`` section, ``AWS_ENDPOINT_URL``) where they do not name their
    own: pyiceberg reads and writes the table's metadata and footers through them."""
    properties = {k: str(v) for k, v in sink.catalog.items()}
    storage = sink.storage
    if storage is not None and storage.endpoint_url:
        properties.setdefault("s3.endpoint", storage.endpoint_url)
        properties.setdefault("s3.region", storage.region or "us-east-1")
    elif storage is not None and storage.region:
        properties.setdefault("s3.region", storage.region)
    return properties


def open_table(sink: TableSink) -> Iceberg:
    properties = catalog_properties(sink)
    if "." not in sink.table:
        raise ConfigError(
            f"iceberg table {sink.table!r} needs a namespace: write it like 'db.{sink.table}'."
        )
    catalog = load_catalog(properties.pop("name", "default"), **properties)
    catalog.create_namespace_if_not_exists(sink.table.rpartition(".")[0])
    try:
        table: IcebergTable | None = catalog.load_table(sink.table)
    except NoSuchTableError:
        table = None
    return Iceberg(sink, catalog, table)
