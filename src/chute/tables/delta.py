"""Delta Lake through deltalake (delta-rs).

A batch is one write transaction of ``add`` actions for the Parquet files the workers
wrote (the table is created by the first one); chute's keys go into the commit info's
custom metadata, which ``DeltaTable.history()`` gives back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import TableNotFoundError
from deltalake.transaction import (
    AddAction,
    CommitProperties,
    RemoveAction,
    create_table_with_add_actions,
)

from chute.storage import StorageOptions, scheme_of
from chute.tables import BATCH_KEY, DataFile, TableSink


class Delta:
    """The driver's handle on one Delta table."""

    def __init__(self, sink: TableSink) -> None:
        self.sink = sink
        self.location = sink.path.rstrip("/")
        self.options = storage_options(sink.path, sink.storage)

    def _load(self) -> DeltaTable | None:
        try:
            return DeltaTable(self.location, storage_options=self.options or None)
        except TableNotFoundError:
            return None

    def schema(self) -> pa.Schema | None:
        table = self._load()
        return None if table is None else pa.schema(table.schema().to_arrow())

    def committed(self, tokens: set[str]) -> set[str]:
        table = self._load()
        if table is None or not tokens:
            return set()
        return {c[BATCH_KEY] for c in table.history() if c.get(BATCH_KEY) in tokens}

    def commit(self, files: Sequence[DataFile], schema: pa.Schema, meta: dict[str, str]) -> None:
        now = int(time.time() * 1000)
        actions: list[AddAction | RemoveAction] = [
            AddAction(f.path, f.bytes, {}, now, True, json.dumps({"numRecords": f.rows}))
            for f in files
        ]
        properties = CommitProperties(custom_metadata=meta)
        table = self._load()
        if table is None:
            create_table_with_add_actions(
                self.location,
                DeltaSchema.from_arrow(schema),
                [a for a in actions if isinstance(a, AddAction)],
                mode="append",
                storage_options=self.options or None,
                commit_properties=properties,
            )
            return
        table.create_write_transaction(
            actions, "append", table.schema(), commit_properties=properties
        )

    def finish(self) -> dict[str, Any]:
        table = self._load()
        return {
            "format": "delta",
            "location": self.location,
            "version": table.version() if table is not None else None,
        }


def storage_options(path: str, storage: StorageOptions | None) -> dict[str, str]:
    """delta-rs's (and Lance's) object-store options for ``path``: the endpoint and region
    only; credentials come from the environment, as for every chute location."""
    if scheme_of(path) not in ("s3", "s3a") or storage is None:
        return {}
    options: dict[str, str] = {}
    if storage.endpoint_url:
        options["aws_endpoint"] = storage.endpoint_url
        if storage.endpoint_url.startswith("http://"):
            options["allow_http"] = "true"
    if storage.region:
        options["aws_region"] = storage.region
    return options


def open_table(sink: TableSink) -> Delta:
    return Delta(sink)
