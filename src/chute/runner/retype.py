"""Parquet files of an output written before a column's type was known, retyped before the
output is marked finished.

A model that returns only nulls in its first batches (``None`` for every row) gives an
Arrow column of the ``null`` type, or one that holds it (only empty lists: ``list<null>``;
a struct's field always ``None``: ``struct<a: null>``); once a later batch has values,
the column has their type (:meth:`chute.stages.ModelStage._typed`), but the files written
before keep ``null``. A reader of the whole output takes the first file's schema, and
cannot cast a later file's ``double`` to ``null``: ``pandas.read_parquet("out/")`` failed
on a finished output. So before ``_SUCCESS``, each such file is written again with the
type the other files have (only its null places typed: nothing changes but the type),
under a new name, and its units' ledger lines name the new file
(:meth:`chute.ledger.Ledger.replace_file`)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pyarrow as pa
import pyarrow.parquet as pq

from chute.ledger import Ledger, entry_files
from chute.retry import retrying
from chute.sinks.files import write_parquet
from chute.stages import cast_exactly, holds_null, typed_by
from chute.storage import put

READERS = 16
"""Footers read at once (an object store answers each in tens of milliseconds)."""


def retype_null_columns(ledger: Ledger) -> list[str]:
    """Write again the data files whose column is ``null`` where other files have a type;
    the names of the files replaced. Only the footers of the files the ledger lines mark
    (``"nulls"``) are read, and of others until each such column's type is found; the
    files of a line without the mark (an older chute's) are all read."""
    paths = sorted(
        {
            f["path"]
            for entry in ledger.entries.values()
            for f in entry_files(entry)
            if not f["path"].startswith(f"{ledger.errors_dir}/")
        }
    )
    marked = {
        p
        for entry in ledger.entries.values()
        for p in (entry["nulls"] if "nulls" in entry else [f["path"] for f in entry_files(entry)])
    }
    suspects = [p for p in paths if p in marked]
    with ThreadPoolExecutor(READERS) as pool:
        schemas = dict(zip(suspects, pool.map(partial(_schema, ledger), suspects), strict=True))
        final = _types(schemas.values(), {})
        untyped = {f.name for s in schemas.values() for f in s if holds_null(f.type)}
        others = [p for p in paths if p not in schemas]
        while others and any(holds_null(final[name]) for name in untyped):  # a few typed
            chunk, others = others[:READERS], others[READERS:]  # files tell the type
            _types(pool.map(partial(_schema, ledger), chunk), final)
    replaced = []
    for path, schema in schemas.items():
        wanted = {
            f.name: final[f.name]
            for f in schema
            if holds_null(f.type) and f.type != final[f.name] == typed_by(f.type, final[f.name])
        }
        if wanted:
            ledger.replace_file(path, *_rewrite(ledger, path, wanted))
            replaced.append(path)
    return replaced


def _types(schemas: Iterable[pa.Schema], final: dict[str, pa.DataType]) -> dict[str, pa.DataType]:
    """Each column's type in ``final``, with where it is ``null`` (or holds it: ``list<null>``)
    typed as ``schemas`` have it (:func:`~chute.stages.convert.typed_by`)."""
    for schema in schemas:
        for field in schema:
            known = final.setdefault(field.name, field.type)
            final[field.name] = typed_by(known, field.type)
    return final


def _schema(ledger: Ledger, path: str) -> pa.Schema:
    full = f"{ledger.root}/{path}"
    return retrying(lambda: pq.read_schema(ledger.fs.open_input_file(full)), f"reading {path}")


def _rewrite(ledger: Ledger, path: str, wanted: dict[str, pa.DataType]) -> tuple[str, int]:
    """The file again, its columns that hold ``null`` of the ``wanted`` types (their
    values as they were: nulls, empty lists), under a new name (the same unit and row,
    another tag): its new name and size."""
    full = f"{ledger.root}/{path}"
    table = retrying(lambda: pq.read_table(ledger.fs.open_input_file(full)), f"reading {path}")
    for name, kind in wanted.items():
        index = table.schema.get_field_index(name)
        typed = cast_exactly(table.column(index), kind)  # only the null places change
        table = table.set_column(index, pa.field(name, kind), typed)
    renamed = re.sub(r"-[0-9a-f]{8}(\.parquet)$", rf"-{uuid.uuid4().hex[:8]}\1", path)
    target = f"{ledger.root}/{renamed}"
    size = retrying(
        lambda: put(ledger.fs, target, partial(write_parquet, table)), f"writing {renamed}"
    )
    return renamed, size
