"""Sources: where rows come from, split into units that can be read independently.

* :mod:`~chute.sources.base` — :class:`Unit` and the :class:`Source` protocol;
* :mod:`~chute.sources.files` — Parquet, CSV and JSON Lines files, local or remote;
* :mod:`~chute.sources.images` — folders of images, decoded in the read stage;
* :mod:`~chute.sources.memory` — Arrow tables, pandas, NumPy and Ray Datasets.

:func:`as_source` turns whatever a user hands to chute into one of these.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from chute.errors import ConfigError, DataError
from chute.sources.base import (
    FORMATS,
    MEMORY_UNIT_ROWS,
    READ_BATCH_ROWS,
    UNIT_TARGET_ROWS,
    Source,
    Unit,
    UnreadableRows,
    check_columns,
    iter_slices,
    stream,
)
from chute.sources.files import FileSource
from chute.sources.images import ImageSource, looks_like_images
from chute.sources.memory import DatasetSource, TableSource, table_from_dict
from chute.storage import StorageOptions


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
        return TableSource(table_from_dict(data))
    if type(data).__module__.startswith("pandas"):
        return TableSource(pa.Table.from_pandas(data, preserve_index=False))
    if type(data).__module__.startswith("ray.data"):
        return DatasetSource(data)
    raise DataError(
        f"cannot read input of type {type(data).__name__}: give a path, a glob, a pandas "
        "DataFrame, a pyarrow Table, a dict of NumPy arrays or a ray.data.Dataset."
    )


def file_source(
    paths: str | Sequence[str],
    format: str | None = None,
    storage: StorageOptions | None = None,
    column_types: Mapping[str, str] | None = None,
    **options: Any,
) -> FileSource | TableSource:
    """Files as a source (an OpenAI Batch file with ``format="openai-batch"``); image files
    (``format="images"``, or named ``.jpg``/``.png``, or a folder of them) become an
    :class:`~chute.sources.images.ImageSource` taking ``options``; CSV and JSON Lines
    take ``column_types``."""
    images = format == "images" or (format is None and looks_like_images(paths))
    if column_types and (format in ("openai-batch", "parquet") or images):
        raise ConfigError(
            "column_types: an option of CSV and JSON Lines input, which carry no types; "
            f"{'image' if images else format} input does. Leave it out."
        )
    if format == "openai-batch":
        from chute.sources.openai_batch import OpenAIBatchSource

        return OpenAIBatchSource(paths, storage=storage)
    if images:
        return ImageSource(paths, storage=storage, **options)
    if any(v is not None for v in options.values()):
        raise ConfigError(
            f"{', '.join(options)}: options of image inputs, but the input is "
            f"{f'{format}, not images' if format else 'not images'}. Set format: images, or "
            "leave the options out."
        )
    return FileSource(paths, format, storage, column_types)


__all__ = [
    "FORMATS",
    "MEMORY_UNIT_ROWS",
    "READ_BATCH_ROWS",
    "UNIT_TARGET_ROWS",
    "DatasetSource",
    "FileSource",
    "ImageSource",
    "Source",
    "TableSource",
    "Unit",
    "UnreadableRows",
    "as_source",
    "check_columns",
    "file_source",
    "iter_slices",
    "looks_like_images",
    "stream",
]
