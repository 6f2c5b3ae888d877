"""Delta Lake through deltalake (delta-rs).

A batch is one write transaction of ``add`` actions for the Parquet files the workers
wrote (the table is created by the first one); chute's keys go into the commit info's
custom metadata, which ``DeltaTable.history()`` gives back. A look for a batch follows the
log back from the current version, and a RESTORE back to the version it restored.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote

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

from chute.errors import DataError
from chute.storage import StorageOptions, read, resolve, scheme_of
from chute.tables import BATCH_KEY, DataFile, Lineage, TableSink

LOG_READS = 1_000
"""How many of the latest commits a look for a job's batches reads (every run looks for
its confirmed batches: :meth:`chute.tableledger.TableLedger._forget_lost`); past it, the
history counts as cut short, and the batches are trusted."""


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

    def unsupported(self, schema: pa.Schema) -> list[pa.Field]:
        out = []
        for column in schema:
            try:
                DeltaSchema.from_arrow(pa.schema([column]))
            except Exception:  # deltalake's own (a bare Exception: "Invalid data type")
                out.append(column)
        return out

    def schema(self) -> pa.Schema | None:
        table = self._load()
        return None if table is None else pa.schema(table.schema().to_arrow())

    def check_writable(self) -> None:
        """Refuse, before any compute, a table whose own rules chute's commits (add actions
        of files chute wrote) would bypass: CHECK constraints and generated columns Delta
        would not enforce on them, and column mapping (its files name columns otherwise).
        (NOT NULL columns: see :attr:`chute.tables.TableSink.required`.)"""
        table = self._load()
        if table is None:
            return
        config = table.metadata().configuration
        rules = sorted(k for k in config if k.startswith("delta.constraints."))
        rules += [
            f"generated column {f.name!r}"
            for f in table.schema().fields
            if "delta.generationExpression" in (f.metadata or {})
        ]
        if config.get("delta.columnMapping.mode", "none") != "none":
            rules.append(f"delta.columnMapping.mode={config['delta.columnMapping.mode']}")
        if rules:
            raise DataError(
                f"{self.sink.name} has rules chute's commits would not keep ({', '.join(rules)}): "
                "chute adds the files it wrote to the table as they are. Write to a table "
                "without them, or write Parquet files and load them with the table's own tools."
            )

    def lineage(self, tokens: set[str]) -> Lineage:
        """The tokens among the commit infos of the commits the current version descends
        from, read from the log's own JSON files, newest first, until every token is found
        (at most :data:`LOG_READS` files). A RESTORE goes back to the version it restored:
        the commits between are not in the table. Whole where version 0 was read.

        Not ``DeltaTable.history()``: deltalake 1.6 answers it with ``Generic S3 error``
        against moto's S3 (where loading and writing the table work), and a resume must
        not depend on it."""
        table = self._load()
        if table is None or not tokens:
            return Lineage(frozenset(), whole=True)
        fs, root = resolve(self.location, self.sink.storage)
        found: set[str] = set()
        version, until = table.version(), None
        for _ in range(LOG_READS):
            if version < 0 or found == tokens:
                return Lineage(frozenset(found), whole=True)
            log = read(fs, f"{root}/_delta_log/{version:020d}.json")
            if log is None:  # cleaned up (a checkpoint holds the state): history ends here
                break
            info = _commit_info(log)
            if until is not None and int(info.get("timestamp") or 0) > until:
                version -= 1  # after the time a RESTORE went back to
                continue
            until = None
            if info.get("operation") == "RESTORE":
                restored = _restored(info, version)
                if restored is None:  # a RESTORE whose target cannot be read: trust
                    break
                version, until = restored
                continue
            found |= {t for t in _tokens(log) if t in tokens}
            if _replaces(info):  # made again in place: nothing before it is in the table
                return Lineage(frozenset(found), whole=True)
            version -= 1
        return Lineage(frozenset(found), whole=found == tokens)

    def holds(self, paths: set[str]) -> set[str]:
        table = self._load()
        if table is None or not paths:
            return set()
        added = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
        current = {unquote(a) for a in added} | set(added)  # the log's paths are URL-encoded
        return paths & current

    def commit(self, files: Sequence[DataFile], schema: pa.Schema, meta: dict[str, str]) -> None:
        now = int(time.time() * 1000)
        actions: list[AddAction | RemoveAction] = [
            AddAction(f.path, f.bytes, dict(f.partition or {}), now, True, _stats(f.rows))
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
                partition_by=list(self.sink.partition_by) or None,
                storage_options=self.options or None,
                commit_properties=properties,
            )
            return
        table.create_write_transaction(
            actions, "append", table.schema(), commit_properties=properties
        )

    def partitioning(self) -> tuple[str, ...] | None:
        table = self._load()
        return None if table is None else tuple(table.metadata().partition_columns)

    def finish(self) -> dict[str, Any]:
        table = self._load()
        return {
            "format": "delta",
            "location": self.location,
            "version": table.version() if table is not None else None,
        }


def _stats(rows: int) -> str:
    return json.dumps({"numRecords": rows})


def _commit_info(log: bytes) -> dict[str, Any]:
    """One commit file's ``commitInfo`` (empty where it has none)."""
    for line in log.decode().splitlines():
        if '"commitInfo"' in line:
            info = json.loads(line).get("commitInfo")
            return info if isinstance(info, dict) else {}
    return {}


def _restored(info: dict[str, Any], version: int) -> tuple[int, int | None] | None:
    """Where a RESTORE commit at ``version`` went back to: the version it restored, or
    (restored to a time) the version before it and the time, in milliseconds, that the
    commits it kept are no later than; ``None`` where the commit says neither in a form
    read here (Spark writes its parameters as JSON text: ``"null"``, a quoted time)."""
    params = info.get("operationParameters") or {}
    target = _parameter(params.get("version"))
    if target is not None:
        try:
            return int(target), None
        except (TypeError, ValueError):
            return None
    when = _parameter(params.get("datetime")) or _parameter(params.get("timestamp"))
    try:
        return version - 1, int(when or 0)
    except (TypeError, ValueError):
        try:  # a time as text: "2024-01-01 00:00:00"
            stamp = datetime.datetime.fromisoformat(str(when))
        except ValueError:
            return None
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=datetime.timezone.utc)
        return version - 1, int(stamp.timestamp() * 1000)


def _parameter(value: Any) -> Any:
    """An operation parameter, as given or as the JSON text Spark writes (``"null"``,
    ``"\\"2024-01-01\\""``); ``None`` for none."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    return value


def _replaces(info: dict[str, Any]) -> bool:
    """Whether a commit replaced the whole table (``mode="overwrite"`` without a
    predicate, ``CREATE OR REPLACE TABLE``): the table made again in place, its history
    kept, its earlier rows gone."""
    operation = info.get("operation")
    params = info.get("operationParameters") or {}
    if operation in ("CREATE OR REPLACE TABLE", "REPLACE TABLE", "REPLACE TABLE AS SELECT"):
        return True
    mode = str(_parameter(params.get("mode")) or "").lower()
    predicate = _parameter(params.get("predicate"))
    return operation == "WRITE" and mode == "overwrite" and predicate in (None, "", [])


def _tokens(log: bytes) -> list[str]:
    """chute's batch tokens in one commit file's ``commitInfo`` (custom metadata is kept
    at its top level)."""
    tokens = []
    for line in log.decode().splitlines():
        info = json.loads(line).get("commitInfo") if '"commitInfo"' in line else None
        if info and isinstance(info.get(BATCH_KEY), str):
            tokens.append(info[BATCH_KEY])
    return tokens


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
