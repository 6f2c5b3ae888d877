"""Writers: each data file appears whole under a unique name (locally written under a
temporary name and renamed into place; on an object store in one upload, which is
atomic); the writer returns one small record per run of a unit's rows in it, never the
rows (unless the result is wanted in memory).

A file sink's data file holds either the whole of one or more units, or rows of a single
unit (a large unit spans several files): never part of a unit beside another unit. So the
units of a file are all complete the moment it is written and commit together, and a unit
whose files are not all in place shares none of them with a committed unit (see
:mod:`chute.ledger`). Files grow up to the sink's :class:`~chute.job.FileTarget`; the
records of one file name it and say how many units it holds (``file_units``).

- :mod:`chute.sinks.records`: :class:`PartRecord`, what the driver learns of a part;
- :mod:`chute.sinks.files`: which rows share a file, and a file's bytes in each format;
- :mod:`chute.sinks.datafile`: :class:`DataFile`, a data file open for appends;
- :mod:`chute.sinks.writer`: :class:`Output` and :class:`PartWriter`.
"""

from chute.sinks.datafile import DataFile
from chute.sinks.files import EXTENSIONS, encode, file_groups, in_key_order
from chute.sinks.records import (
    RECORD_SCHEMA,
    PartRecord,
    read_ipc,
    record_dict,
    records_from_table,
    records_to_table,
    runs,
    to_ipc,
)
from chute.sinks.writer import ERRORS_DIR, Output, PartWriter, output_filesystem

__all__ = [
    "ERRORS_DIR",
    "EXTENSIONS",
    "RECORD_SCHEMA",
    "DataFile",
    "Output",
    "PartRecord",
    "PartWriter",
    "encode",
    "file_groups",
    "in_key_order",
    "output_filesystem",
    "read_ipc",
    "record_dict",
    "records_from_table",
    "records_to_table",
    "runs",
    "to_ipc",
]
