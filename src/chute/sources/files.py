"""Files as a source: Parquet, CSV and JSON Lines, local or on object stores.

One listing finds the files (a file, a folder, a glob or a list); Parquet footers, read in
parallel, give row counts and split big files into units of whole row groups. Nothing
here reads data rows until an engine asks for a unit.
"""

from __future__ import annotations

import contextlib
import datetime
import difflib
import errno
import functools
import json
import math
import os
import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.json as pajson
import pyarrow.parquet as pq

from chute.errors import (
    INPUT_CHANGED,
    ChuteError,
    ConfigError,
    DataError,
    InputChanged,
    did_you_mean,
)
from chute.retry import retrying
from chute.sources.base import (
    FORMATS,
    READ_BATCH_ROWS,
    UNIT_TARGET_ROWS,
    Unit,
    unreadable,
)
from chute.storage import (
    META_DIR,
    S3_SCHEMES,
    SUCCESS,
    StorageOptions,
    as_given,
    check,
    is_local,
    is_remote,
    odd_segment,
    open_input_file,
    parquet_metadata,
    permanent,
    read_row_groups,
    redact,
    resolve,
    scheme_of,
    storage_error,
)

STREAM_BUFFER = 64 * 2**10
"""Bytes a streamed local Parquet read asks for at a time: it reads a column chunk page by
page, not whole (a 1 M-row row group's five columns took 20 MiB of Arrow memory per
reader, 11 MiB like this, as much as a 140 k-row group's)."""


def _filesystem(path: str, storage: StorageOptions | None = None) -> tuple[pafs.FileSystem, str]:
    return resolve(path, storage)


def _refuse_unaddressable(fs: pafs.FileSystem, paths: list[str], uri: Any) -> None:
    """An S3 key with an empty, ``.`` or ``..`` segment (``in//a.parquet``) is listed as
    it is but read as another key, or not at all: such a file is refused by name, never
    read or left out as a bad file."""
    if not isinstance(fs, pafs.S3FileSystem):
        return
    odd = [p for p in paths if odd_segment(p) is not None]
    if odd:
        shown = ", ".join(repr(uri(p)) for p in odd[:3]) + (", ..." if len(odd) > 3 else "")
        raise ConfigError(
            f"the input holds {len(odd)} S3 key(s) with an empty, '.' or '..' segment "
            f"({shown}): the S3 client reads such a key as another, or not at all. Rename "
            "them, or move them out of the input."
        )


def _storage_of(path: str) -> str:
    scheme = scheme_of(path)
    return "s3" if scheme in S3_SCHEMES else scheme if is_remote(path) else "local"


def has_glob(path: str) -> bool:
    return any(ch in path for ch in "*?[")


def is_glob(fs: pafs.FileSystem, path: str) -> bool:
    """Whether ``path`` is a pattern: it holds ``*``, ``?`` or ``[`` and names nothing
    that exists. A file or folder named so is read as named (``day[1].parquet`` was the
    pattern matching ``day1.parquet``: another file's rows, and the run "complete")."""
    if not has_glob(path):
        return False
    info = retrying(lambda: fs.get_file_info(path), f"checking {path}")  # an error is no
    return bool(info.type == pafs.FileType.NotFound)  # answer: a glob read another file


def _list_files(
    fs: pafs.FileSystem,
    path: str,
    original: str,
    keep_empty: bool = False,
    underscore_files: bool = True,
) -> list[pafs.FileInfo]:
    """The files of a path, directory or glob: one recursive listing (paginated on an
    object store: one request per 1,000 objects), never a request per file."""
    try:
        return retrying(
            lambda: _listing(fs, path, original, keep_empty, underscore_files),
            f"listing {redact(original)}",
        )
    except ChuteError:
        raise
    except OSError as exc:
        if permanent(exc):
            raise storage_error(exc, original, "input") from exc
        raise DataError(f"cannot list the input {redact(original)!r}: {exc}") from exc


def _listing(
    fs: pafs.FileSystem,
    path: str,
    original: str,
    keep_empty: bool = False,
    underscore_files: bool = True,
) -> list[pafs.FileInfo]:
    """A folder's files leave out hidden ones (:func:`_hidden`) and, unless
    ``keep_empty``, 0-byte ones."""
    if is_glob(fs, path):
        base = path[: min(path.find(ch) for ch in "*?[" if ch in path)].rsplit("/", 1)[0]
        if fs.get_file_info(base or "/").type == pafs.FileType.NotFound:
            folder = original[: len(original) - (len(path) - len(base))] if base else "/"
            raise DataError(
                f"the glob {redact(original)!r} looks in the folder {redact(folder)!r}, which "
                f"does not exist.{_near(fs, base, folder)} Check the path."
            )
        infos = fs.get_file_info(pafs.FileSelector(base or "/", recursive=True))
        matches = _glob(path, underscore_files).fullmatch
        files = [i for i in infos if i.is_file and matches(i.path)]
        if not files:
            raise DataError(f"the glob {redact(original)!r} matches no files. Check the pattern.")
        _refuse_unfinished(infos, files, original)
        return sorted(files, key=lambda i: i.path)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise DataError(
            f"input path {redact(original)!r} does not exist.{_near(fs, path, original)} "
            "Check the path."
        )
    as_folder = original.endswith("/") and not isinstance(fs, pafs.LocalFileSystem)
    if info.type == pafs.FileType.File and not as_folder:
        return [info]
    # "data/" on an object store with an object "data" beside the keys "data/...": the
    # folder, as written (a 0-byte "data" is an S3 console's folder marker); the object
    # only where no key is under "data/"
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    except NotADirectoryError:  # fsspec's stores: a file is no folder, "data.parquet/" too
        if info.type != pafs.FileType.File:
            raise
        infos = []
    if info.type == pafs.FileType.File and info.size and not any(i.is_file for i in infos):
        return [info]
    _refuse_dangling(fs, path, infos, underscore_files)
    files = [
        i
        for i in infos
        if i.is_file
        and not _hidden(i.path[len(path) :], underscore_files)
        and (keep_empty or (i.size or 0) > 0)
    ]
    _refuse_unfinished(infos, files, original)
    return sorted(files, key=lambda i: i.path)


def _refuse_unfinished(
    infos: list[pafs.FileInfo], files: list[pafs.FileInfo], original: str
) -> None:
    """Refuse input files inside the output of a chute job that has not finished (its
    ``_chute/job.json`` is there, its ``_SUCCESS`` not yet): a pipeline started before the
    job it reads from would take the rows committed so far, and the parts a stopped run
    left, for the whole result, and report itself complete."""
    marker, done = f"/{META_DIR}/job.json", f"/{SUCCESS}"
    outputs = {i.path[: -len(marker)] for i in infos if i.path.endswith(marker)}
    unfinished = outputs - {i.path[: -len(done)] for i in infos if i.path.endswith(done)}
    for output in sorted(unfinished, key=len):
        if any(i.path.startswith(f"{output}/") for i in files):
            shown = redact(as_given(original, output))
            raise DataError(
                f"input {redact(original)!r} reads the output of a chute job that has not "
                f"finished ({shown!r} has no {SUCCESS}): it holds only the rows committed so "
                "far. Run this job once that one has finished (`chute status "
                "<its output>` tells), or finish it first (run it again: it resumes)."
            )


def _refuse_dangling(
    fs: pafs.FileSystem, path: str, infos: list[pafs.FileInfo], underscore_files: bool
) -> None:
    """Refuse a symbolic link in a local input folder whose target does not exist. Arrow's
    listing leaves such a link out without a word, so the file it stood for was in neither
    the output nor the report. One look at each folder Arrow listed (Arrow's own walk
    guards against link loops)."""
    if not isinstance(fs, pafs.LocalFileSystem):
        return
    folders = [path, *(i.path for i in infos if i.type == pafs.FileType.Directory)]
    for folder in folders:
        if _hidden(folder[len(path) :] + "/x", underscore_files):
            continue
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            for entry in entries:
                hidden = _hidden(f"{folder[len(path) :]}/{entry.name}", underscore_files)
                if entry.is_symlink() and not hidden and _points_nowhere(entry.path):
                    raise DataError(
                        f"input {entry.path!r} is a symbolic link to "
                        f"{os.readlink(entry.path)!r}, which does not exist: the file it "
                        "stands for cannot be read. Point the link at the file, or remove it."
                    )


def _points_nowhere(link: str) -> bool:
    """Whether a link's target does not exist (not: a loop of links Arrow walked into,
    too deep to resolve, whose files its walk lists once it is cut)."""
    try:
        os.stat(link)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


def _glob(pattern: str, underscore_files: bool = True) -> re.Pattern[str]:
    """A glob as a shell reads it: ``*``, ``?`` and ``[...]`` within one path segment,
    ``**`` any number of folders; a wildcard never matches a name's leading ``.`` or ``_``
    (hidden files, a Spark job's ``_temporary/`` attempts, chute's ``_errors/``), which
    only a segment spelled with it names. Without ``underscore_files`` a file's own leading
    ``_`` is matched, as a folder's listing keeps it (an image source: ``_DSC0001.JPG``)."""
    out: list[str] = []
    segments = pattern.split("/")
    for k, segment in enumerate(segments):
        if segment == "**":
            out.append(r"(?:(?![._])[^/]+/)*")
            continue
        last = k == len(segments) - 1
        out.append(_glob_segment(segment, hidden="." if last and not underscore_files else "._"))
        if k < len(segments) - 1:
            out.append("/")
    return re.compile("".join(out))


def _glob_segment(segment: str, hidden: str = "._") -> str:
    out: list[str] = []
    i = 0
    while i < len(segment):
        c = segment[i]
        lead = rf"(?![{hidden}])" if i == 0 else ""
        if c == "*":
            out.append(lead + "[^/]*")
        elif c == "?":
            out.append(lead + "[^/]")
        elif c == "[" and (end := segment.find("]", i + 2)) != -1:
            body = segment[i + 1 : end]
            body = "^" + body[1:] if body.startswith("!") else body
            out.append(lead + "[" + body.replace("\\", "\\\\") + "]")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def _distinct(infos: list[pafs.FileInfo], fs: pafs.FileSystem) -> list[pafs.FileInfo]:
    """Each file once, by path and, locally, by what it is: a folder reached again through
    a symbolic link (``latest -> 2024-06-02``), a link loop, the same file named by two of
    the input's paths. Read twice, its rows would be in the output twice. Of the names of
    one file, the one without links (else the shortest) is kept, in its place."""
    local = is_local(fs)
    names: dict[object, list[int]] = {}
    for position, info in enumerate(infos):
        key: object = info.path
        if local:
            try:
                stat = os.stat(info.path)
                key = (stat.st_dev, stat.st_ino)
            except OSError as exc:
                if exc.errno == errno.ELOOP:  # only a link loop reaches it: not a file
                    continue
        names.setdefault(key, []).append(position)

    def rank(position: int) -> tuple[bool, int]:
        path = infos[position].path
        return (local and os.path.realpath(path) != path, len(path))

    kept = [ps[0] if len(ps) == 1 else min(ps, key=rank) for ps in names.values()]
    return [infos[position] for position in sorted(kept)]


def _near(fs: pafs.FileSystem, path: str, original: str) -> str:
    """`` Did you mean 'data/taxi/'?``: the closest name in the nearest folder that exists,
    written as the user wrote the path."""
    stripped = path.rstrip("/")
    folder, _, name = stripped.rpartition("/")
    try:
        infos = fs.get_file_info(pafs.FileSelector(folder or "/", allow_not_found=True))
    except OSError:
        return ""
    matches = difflib.get_close_matches(name, [i.base_name for i in infos], n=1, cutoff=0.6)
    if not matches:
        return ""
    head = original.rstrip("/")
    head = head[: len(head) - len(name)] if head.endswith(name) else ""
    slash = "/" if original.endswith("/") else ""
    return f" Did you mean {redact(head + matches[0] + slash)!r}?"


def _empty_files(fs: pafs.FileSystem, path: str) -> list[pafs.FileInfo]:
    """The 0-byte files of a directory (what :func:`_listing` leaves out)."""
    if fs.get_file_info(path).type != pafs.FileType.Directory:  # a file, or a glob
        return []
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    return [i for i in infos if i.is_file and not i.size and not _hidden(i.path[len(path) :])]


def _empty_error(path: str, count: int) -> DataError:
    others = f" (and {count - 1} more empty file(s))" if count > 1 else ""
    return DataError(
        f"input file {redact(path)!r} is empty (0 bytes){others}: there is nothing to read. "
        "Check that the file was written completely, or remove it."
    )


def _when(ns: int | None) -> str:
    """A file's modification time, for an error message (UTC, to the millisecond)."""
    if ns is None:
        return "unknown"
    at = datetime.datetime.fromtimestamp(ns / 1e9, datetime.timezone.utc)
    return at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _real(path: str) -> str:
    """A local path with its links resolved (the file it names, however it is spelled)."""
    return os.path.realpath(path)


def _same(path: str) -> str:
    return path


def _text(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


TIME_UNIT = "s"
"""The unit of a timestamp Arrow infers from JSON text (it infers whole seconds only)."""


def _texted(t: pa.DataType) -> pa.DataType | None:
    """``t`` with each timestamp in it, at any depth, as text; ``None`` if it has none."""
    if pa.types.is_timestamp(t):
        return pa.string()
    if pa.types.is_struct(t):
        fields = [t.field(i) for i in range(t.num_fields)]
        texted = [_texted(f.type) for f in fields]
        if all(x is None for x in texted):
            return None
        return pa.struct([f.with_type(x or f.type) for f, x in zip(fields, texted, strict=True)])
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        value = _texted(t.value_type)
        if value is None:
            return None
        field = t.value_field.with_type(value)
        return pa.list_(field) if pa.types.is_list(t) else pa.large_list(field)
    return None


def _timed(column: pa.ChunkedArray | pa.Array) -> pa.DataType:
    """The type of a column read with its time text as text (:func:`_texted`): each text
    that Arrow took for a timestamp is one with a zone (UTC) where every value has an
    offset, without one where none has, and stays text where both occur; as a CSV reader
    infers them. Nothing else changes."""
    t = column.type
    if _text(t):
        for kind in (pa.timestamp(TIME_UNIT, "UTC"), pa.timestamp(TIME_UNIT)):
            try:
                column.cast(kind)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                continue
            return kind
        return t
    if pa.types.is_struct(t):
        fields = [t.field(i) for i in range(t.num_fields)]
        kinds = [_timed(pc.struct_field(column, [i])) for i in range(t.num_fields)]
        return pa.struct([f.with_type(k) for f, k in zip(fields, kinds, strict=True)])
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        field = t.value_field.with_type(_timed(pc.list_flatten(column)))
        return pa.list_(field) if pa.types.is_list(t) else pa.large_list(field)
    return t


def _hidden(relative: str, underscore_files: bool = True) -> bool:
    """Whether a path under an input folder is left out of its listing: under a folder, or
    named, with a leading '.' or '_' (hidden files, Spark's ``_SUCCESS``, chute's
    ``_errors/``). Without ``underscore_files`` a file's own leading '_' keeps it (an image
    source: a camera names photos ``_DSC0001.JPG``)."""
    parts = [part for part in relative.split("/") if part]
    if any(part.startswith((".", "_")) for part in parts[:-1]):
        return True
    return bool(parts) and parts[-1].startswith((".", "_") if underscore_files else ".")


WHOLE_BLOCK_MAX = 1 << 30
"""The largest block a CSV / JSON Lines file is parsed in when its records outgrow Arrow's
1 MiB blocks (a block is parsed on one thread, and Arrow caps a block under 2 GiB)."""
LOOKAHEAD_FILES = 8
"""Further files read while planning for the type of a column the first file leaves empty."""


def _arrow_types(declared: Mapping[str, str | pa.DataType]) -> dict[str, pa.DataType]:
    """``column_types`` as Arrow types: a type, or its name (``string``, ``timestamp[ms]``)."""
    types: dict[str, pa.DataType] = {}
    for name, given in declared.items():
        if isinstance(given, pa.DataType):
            types[name] = given
            continue
        try:
            types[name] = pa.type_for_alias(str(given))
        except (ValueError, KeyError) as exc:
            raise ConfigError(
                f"column_types: {given!r} (column {name!r}) is not an Arrow type name. Use "
                "string, int64, float64, bool, date32, timestamp[ms], ..."
            ) from exc
    return types


def _check_names(schema: pa.Schema, path: str) -> None:
    """A CSV header or JSON keys that name a column twice: Arrow keeps both, chute could
    not tell them apart."""
    try:
        names = schema.names
    except UnicodeDecodeError as exc:
        raise DataError(
            f"input file {path!r} is not UTF-8: its column names do not decode ({exc}). "
            "Save the file as UTF-8."
        ) from exc
    seen: set[str] = set()
    twice = sorted({n for n in names if n in seen or seen.add(n)})  # type: ignore[func-returns-value]
    if twice:
        raise DataError(
            f"input file {path!r} names the column(s) {', '.join(map(repr, twice))} more than "
            "once. Rename them so that each name is unique."
        )


class _CsvStream:
    """A CSV file's bytes as Arrow's reader takes them, noting on the way what its parse
    does not tell: the number of lines (line breaks counted with ``bytes.count`` over blocks
    read anyway: ``\n``, ``\r`` and ``\r\n`` one each, as Arrow ends a record), and the
    number of quotes, and the first block, which holds the header (the whole of it, where
    the parse keeps only some columns: :func:`_csv_header`). More lines than records (and
    the header) means a value holds a line break (or a line is blank): only then is the
    file looked at for a quote left open (:func:`_quote_trouble`); so is it where the count
    of quotes is odd and the last value holds a line break (:func:`_swallowed`)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.breaks = 0
        self.quotes = 0
        self.first = b""
        self.tail = b""

    def read(self, size: int = -1) -> bytes:
        data: bytes = self.stream.read(size)
        if data:
            breaks = data.count(b"\n")
            if b"\r" in data:
                breaks += data.count(b"\r") - data.count(b"\r\n")
            if self.tail[-1:] == b"\r" and data[:1] == b"\n":
                breaks -= 1  # a \r\n cut by the block's end
            self.breaks += breaks
            self.quotes += data.count(b'"')
            self.tail = (self.tail + data[-64:])[-64:]
            self.first = self.first or data
        return data

    @property
    def lines(self) -> int:
        """The file's lines, the last one counted where no line break ends it."""
        return self.breaks + (self.tail[-1:] not in (b"", b"\n", b"\r"))

    @property
    def closed_at_end(self) -> bool:
        """Whether the file ends with a quote that closes a field (line breaks after it
        aside): a field never closed ends with none, or with quotes in pairs (``""``)."""
        end = self.tail.rstrip(b"\r\n")
        return (len(end) - len(end.rstrip(b'"'))) % 2 == 1

    @property
    def closed(self) -> bool:
        return bool(self.stream.closed)

    def readable(self) -> bool:
        return True


def _csv_header(first: bytes) -> pa.Schema:
    """The columns a CSV file's header names, from its first block: parsed 64 KiB at first
    (0.5 ms; the last row there, cut short, is let go), the whole block for a longer header."""
    text = first + b"\n"  # a header without a line break after it is "an empty block"
    skip = pacsv.ParseOptions(newlines_in_values=True, invalid_row_handler=lambda row: "skip")

    def header(block: int) -> pa.Schema:
        read = pacsv.ReadOptions(block_size=block)
        return pacsv.open_csv(pa.BufferReader(text), read_options=read, parse_options=skip).schema

    try:
        return header(1 << 16)
    except pa.ArrowInvalid:
        return header(len(text) + 1)


def _suspect(
    table: pa.Table,
    names: Sequence[str],
    opened: Callable[[], Any],
    broken: bool,
    closed_at_end: bool,
) -> bool:
    """Whether a quote may have been left open, taking lines into one value: where the last
    row's last value holds a line break and the file does not end with a closing quote (a
    field never closed takes the rest of the file; Arrow takes it silently only in the last
    column: anywhere else the row falls short of columns, which Arrow refuses), or, where
    some value holds one (``broken``), its lines after a break look like the rows a stray
    quote takes in (:func:`_record_lines`). Vectorised over the values; only then does
    :func:`_quote_trouble` look at the file. A parse of the columns left out, as text, where
    some were."""
    if table.num_rows == 0:
        return False
    if not set(names) <= set(table.column_names):
        with opened() as stream:
            table = pacsv.read_csv(
                stream,
                parse_options=pacsv.ParseOptions(newlines_in_values=True),
                convert_options=pacsv.ConvertOptions(
                    include_columns=list(names) if broken else [names[-1]],
                    column_types={n: pa.string() for n in names},
                ),
            )
    value = table.column(names[-1])[-1].as_py() if table.num_rows else None
    if not closed_at_end and isinstance(value, str) and ("\n" in value or "\r" in value):
        return True
    if not broken:
        return False
    n = len(names)
    return any(
        pc.any(
            pc.match_substring_regex(table.column(name), _record_lines(n, names.index(name)))
        ).as_py()
        for name in table.column_names
        if _text(table.schema.field(name).type)
    )


def _record_lines(n: int, j: int) -> str:
    """A value in column ``j`` of ``n`` holding the lines a stray quote would take: a whole
    line after a break with the ``n`` fields of a record, or a last line with the ``j``
    fields (or more, where a quoted field after it holds the delimiter) that a quote in
    column ``j`` of a later line, closing it, leaves before it."""
    field = r"[^,\r\n]*"
    return rf"[\r\n](?:(?:{field},){{{n - 1}}}{field}[\r\n]|(?:{field},){{{j},}}{field}$)"


_SPANNING = re.compile(
    # the fields whose quotes open and close on one line, and any quote that is text (one
    # not at a field's start, as Arrow reads it: ``5'11"``), passed over in C ...
    rb'(?:[^"]++|"(?<=[^,\r\n]")|"(?<![^,\r\n]")(?:[^"\r\n]++|"")*+")*+'
    # ... up to the next quoted field that holds a line break (or is never closed):
    # its text ("" inside it is one quote), and its closing quote where it has one
    rb'"(?<![^,\r\n]")((?:[^"]++|"")*+)("?)'
)


def _quote_trouble(
    data: bytes, names: Sequence[str], types: Mapping[str, pa.DataType]
) -> tuple[int, str] | None:
    """Where a quoted CSV field holding a line break looks like a quote left open, and why
    (``None``: none does). Arrow reads a field opened by a quote up to the next quote that
    is not doubled, whatever lines are between, and says nothing; so does Python's csv. A
    stray quote so takes the rows after it into one value: to the end of the file, or, where
    a second stray quote follows, up to it. Refused:

    * a field never closed (its line breaks: the rest of the file);
    * a field whose closing quote is followed by more of the value (``4,"Bye`` closing the
      field that ``2,"Hello`` opened: rows 3 and 4 in it), as no well-formed field is;
    * a field with a line after a line break that reads as a record of the file: the
      header's number of fields, with a value in some column of a type other than text
      that converts to that type (``3,c`` under ``id,desc`` with integer ids). Text alone
      is no evidence (``Springfield, IL`` in a two-column file of text).

    A pair of stray quotes in a file of text columns alone, the second closing its field
    (``2,"Hello`` ... ``4,5 inch"``), reads as a value that holds line breaks, as it may.
    One regular expression over the file: run only where a value holds a line break."""
    start = 3 if data.startswith(b"\xef\xbb\xbf") else 0  # a UTF-8 byte-order mark
    text = data[start:] if start else data
    at = 0
    while (found := _SPANNING.match(text, at)) is not None:
        opened, inside, at = found.start(1) - 1 + start, found.group(1), found.end()
        if not found.group(2):
            return (opened, "never closed") if re.search(rb"[\r\n]", inside) else None
        if text[at : at + 1] not in (b"", b",", b"\r", b"\n"):
            return opened, "closed inside a value"
        for line in re.split(rb"\r\n|\r|\n", inside)[1:]:
            if line.count(b",") + 1 == len(names) and _a_record(line, names, types):
                return opened, "a record"
    return None


def _a_record(line: bytes, names: Sequence[str], types: Mapping[str, pa.DataType]) -> bool:
    """Whether a line reads as a record of the file: a value in a column of a type other
    than text, converted as Arrow converts the file's."""
    untyped = (_text, pa.types.is_binary, pa.types.is_large_binary, pa.types.is_null)
    typed = {n: t for n, t in types.items() if n in names and not any(u(t) for u in untyped)}
    if not typed:
        return False
    try:
        row = pacsv.read_csv(
            pa.BufferReader(line + b"\n"),
            read_options=pacsv.ReadOptions(column_names=list(names)),
            convert_options=pacsv.ConvertOptions(
                column_types={n: typed.get(n, pa.string()) for n in names}
            ),
        )
    except pa.ArrowInvalid:
        return False
    return row.num_rows == 1 and any(row.column(n)[0].is_valid for n in typed)


def _quote_error(path: str, data: bytes, opened: int, why: str) -> DataError:
    line_start = data.rfind(b"\n", 0, opened) + 1
    line = data.count(b"\n", 0, opened) + 1
    shown = data[line_start : line_start + 60].split(b"\n", 1)[0].decode("utf-8", "replace")
    if why == "never closed":
        what = (
            f"a quote that is never closed: the field that opens it on line {line} "
            f"({shown!r}) would run to the end of the file, taking every line after it"
        )
    elif why == "closed inside a value":
        what = (
            f"a quote left open: the field that opens it on line {line} ({shown!r}) runs "
            "over line breaks up to a quote in the middle of a later value, taking the lines "
            "between into one value"
        )
    else:
        what = (
            f"a quote that looks left open: the field that opens it on line {line} "
            f"({shown!r}) runs over line breaks, and a line in it reads as a record of its "
            "own (its values fit the file's column types), which would be taken into one value"
        )
    return DataError(
        f"input file {path!r} has {what}. Close the quote (a quote inside a quoted value "
        'is written twice: ""), or set on_bad_input: skip to leave the file out.'
    )


def _conversion(exc: pa.ArrowInvalid) -> bool:
    """Whether Arrow failed to convert a value to its column's type (where a parse error,
    a ragged row or a JSON line cut short, is no matter of types)."""
    text = str(exc)
    return (
        "CSV conversion error" in text
        or "Failed to convert JSON" in text
        or re.search(r"Column\(/[^)]*\) changed from", text) is not None
    )


def _holds_text(t: pa.DataType) -> bool:
    """Whether a column's values hold text, at any depth (a list of strings, a struct's)."""
    return _text(t) or any(_holds_text(t.field(i).type) for i in range(t.num_fields))


def _valid(column: pa.ChunkedArray) -> bool:
    try:
        column.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def _check_utf8(table: pa.Table, path: str) -> None:
    """JSON Lines text that is not UTF-8: Arrow's JSON reader keeps its bytes as they are
    (its CSV reader refuses them), and the Parquet written from them cannot be read back.
    Arrow's full validation, of the text columns only."""
    for name, column in zip(table.column_names, table.columns, strict=True):
        if not _holds_text(column.type):
            continue
        try:
            column.validate(full=True)
        except pa.ArrowInvalid as exc:
            raise DataError(
                f"input file {path!r} is not UTF-8: column {name!r} holds text that does not "
                f"decode ({exc}). Save the file as UTF-8."
            ) from exc


def _check_csv_text(table: pa.Table, path: str, declared: Collection[str]) -> None:
    """A CSV column Arrow inferred as ``binary``: its text does not decode as UTF-8 (the
    only reason Arrow's inference gives that type). Written as bytes, every file's values
    of it would be bytes, the UTF-8 ones too: refused, unless declared so."""
    for name, column in zip(table.column_names, table.columns, strict=True):
        if name in declared or not pa.types.is_binary(column.type):
            continue
        row, value = next((i, v) for i, v in enumerate(column.to_pylist()) if not _decodes(v))
        raise DataError(
            f"input file {path!r} is not UTF-8: column {name!r} holds text that does not "
            f"decode (its row {row + 1}: {value!r}), which would be read as bytes. Save the "
            f"file as UTF-8, or declare column_types: {{{name}: binary}} to keep the bytes."
        )


def _decodes(value: bytes | None) -> bool:
    if value is not None:
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            return False
    return True


def _rounded(table: pa.Table, declared: Collection[str]) -> list[str]:
    """The float64 columns (inferred, not declared) whose values are all whole and some of
    them 2**53 or more in size: where Arrow, finding whole numbers too large for int64 in a
    column, read it as floats. A cheap look at the values; :func:`_check_rounded` then
    reads the column's text."""
    suspects = []
    for name, column in zip(table.column_names, table.columns, strict=True):
        if name in declared or not pa.types.is_float64(column.type):
            continue
        largest = pc.max(pc.abs(column)).as_py()
        if largest is None or not math.isfinite(largest) or largest < 2**53:
            continue
        if pc.all(pc.equal(column, pc.floor(column))).as_py():
            suspects.append(name)
    return suspects


def _check_rounded(path: str, fmt: str, name: str, opened: Callable[[], Any]) -> None:
    """Refuse a column of whole numbers that float64 cannot hold: two ids that differ in
    their last digits would be written as one value (``18446744073709551615`` as
    ``18446744073709551616``), and the run would finish with every row altered."""
    for text in _whole_number_texts(fmt, name, opened):
        if int(text) == int(float(text)):
            continue
        fits = 0 <= int(text) < 2**64
        if fmt == "csv":
            fix = f"column_types: {{{name}: {'uint64' if fits else 'string'}}}"
        elif fits:
            fix = f"column_types: {{{name}: uint64}}"
        else:
            fix = 'write them as JSON strings ("1234...") and column_types: {' + name + ": string}"
        raise DataError(
            f"input file {path!r}: column {name!r} holds whole numbers too large for int64 "
            f"(such as {text.strip()}), which Arrow reads as float64, rounding them "
            f"({text.strip()} would be written as {int(float(text))}). Declare the column's "
            f"type for every file: input: {fix}."
        )


def _whole_number_texts(fmt: str, name: str, opened: Callable[[], Any]) -> Iterator[str]:
    """The texts of column ``name``'s whole numbers of 16 digits or more, as the file
    writes them."""
    if fmt == "csv":
        with opened() as stream:
            column = pacsv.read_csv(
                stream,
                parse_options=pacsv.ParseOptions(newlines_in_values=True),
                convert_options=pacsv.ConvertOptions(
                    include_columns=[name], column_types={name: pa.string()}
                ),
            ).column(0)
        yield from pc.filter(column, pc.match_substring_regex(column, _LONG_WHOLE)).to_pylist()
        return
    with opened() as stream:
        data = stream.read()
    key = json.dumps(name, ensure_ascii=False).encode()  # as files write keys: raw UTF-8
    pattern = re.escape(key) + rb"\s*:\s*(-?[0-9]{16,})(?=\s*[,}])"
    for found in re.finditer(pattern, data):
        yield found.group(1).decode()


_LONG_WHOLE = r"^\s*[+-]?[0-9]{16,}\s*$"


COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".zstd": "zstd", ".lz4": "lz4"}
"""A CSV or JSON Lines file named with one of these is read through Arrow's codec
(``trips.csv.gz``); Parquet compresses its pages itself."""


def _compression(path: str) -> str | None:
    return COMPRESSIONS.get(os.path.splitext(path)[1].lower())


def _format_of(path: str) -> str | None:
    if _compression(path):
        path = os.path.splitext(path)[0]
    return FORMATS.get(os.path.splitext(path)[1].lower())


class FileSource:
    """Parquet, CSV or JSON Lines files: one file, a directory or a glob.

    >>> FileSource("data/*.parquet").plan()  # doctest: +SKIP

    CSV and JSON Lines carry no types: Arrow infers them from the values of the first file
    with rows, and every other file reads its text columns as text (inferred again and
    cast, ``02139`` came back as ``2139``; :meth:`_read_file`). ``column_types`` declares a
    column's type instead (``{"zip": "string"}``).
    """

    READS_PARTS: ClassVar[bool] = True
    """Whether chute's part files would be read as input where a folder or glob of the
    input reaches them (Parquet, CSV, JSON Lines: yes; images: never, not being images)."""
    KEEPS_EMPTY_FILES: ClassVar[bool] = False
    KEEPS_UNDERSCORE_FILES: ClassVar[bool] = False
    """Whether a file whose own name starts with '_' is listed (images: ``_DSC0001.JPG``);
    folders that do are left out either way."""
    """Whether a folder's 0-byte files are listed: a table's hold no rows (left out); an
    image source's file is a row each, so one that is empty must be named, not lost."""

    def __init__(
        self,
        path: str | Sequence[str],
        format: str | None = None,
        storage: StorageOptions | None = None,
        column_types: Mapping[str, str | pa.DataType] | None = None,
    ) -> None:
        self.paths = [path] if isinstance(path, str) else list(path)
        if not self.paths:
            raise DataError("no input path given: name a file, a directory or a glob.")
        storages = {_storage_of(p) for p in self.paths}
        if len(storages) > 1:  # every file is read through one filesystem
            raise ConfigError(
                f"the input paths are on {len(storages)} storages ({', '.join(sorted(storages))}): "
                "one job reads one. Copy the files to one storage, or run a job for each."
            )
        known = sorted(set(FORMATS.values()))
        if format not in (None, "images", *known):  # else read as JSON: a parse error
            raise ConfigError(
                f"input format {format!r} is not one chute reads as files: {', '.join(known)} "
                "(images: chute.ImageSource; OpenAI Batch requests: format openai-batch in a "
                f"job file).{did_you_mean(str(format).lower(), known)}"
            )
        self.format = format
        self.storage = (storage or StorageOptions()).with_env()
        """How to reach remote storage; carried to workers, which rebuild the filesystem."""
        self.column_types = _arrow_types(column_types or {})
        """Declared types of CSV / JSON Lines columns (by name), over the inferred ones."""
        self._planned: pa.Schema | None = None
        """The columns every file is read with, once :meth:`schema` has found them."""
        self._reference: str | None = None
        """The file :meth:`schema` took the columns from."""
        self._files: list[str] | None = None
        self._stamps: dict[str, tuple[int | None, int | None]] = {}
        self._fs: pafs.FileSystem | None = None
        self._bad: dict[str, str] = {}
        """Files found unreadable while planning, and why."""

    def __getstate__(self) -> dict[str, Any]:
        """Without the listing: a read task gets its file and size from its unit, so that
        what each of a million read tasks carries does not grow with the number of files."""
        return {
            "paths": self.paths,
            "format": self.format,
            "_files": None,
            "_stamps": {},
            "storage": self.storage,
            "column_types": self.column_types,
            "_planned": self._planned,
            "_reference": self._reference,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._fs = None
        self._bad = {}

    @property
    def filesystem(self) -> pafs.FileSystem:
        if self._fs is None:
            self._fs = _filesystem(self.paths[0], self.storage)[0]
        return self._fs

    def uri(self, path: str) -> str:
        """A listed file as a user addresses it: ``s3://bucket/key`` where the
        filesystem's own path is ``bucket/key`` (``hdfs://nn:8020/x`` for ``/x``; an
        ``http://`` URL, which is its own path, as it is); a local path as it is."""
        return path if "://" in path else self._uri_prefix + path

    @functools.cached_property
    def _uri_prefix(self) -> str:
        """What the first path has before its filesystem's own path (``s3://``), no
        credentials; ``""`` for a local one."""
        first = self.paths[0]
        if not is_remote(first):
            return ""
        given, inner = first.rstrip("/"), _filesystem(first, self.storage)[1]
        prefix = given[: len(given) - len(inner)] if given.endswith(inner) else ""
        return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@", r"\1", prefix)

    def files(self) -> list[str]:
        """Every input file, sorted; listed once."""
        if self._files is None:
            found: list[pafs.FileInfo] = []
            for original in self.paths:
                check(original, self.storage)  # a missing bucket, refused credentials
                fs, path = _filesystem(original, self.storage)
                self._fs = fs
                hides = not self.KEEPS_UNDERSCORE_FILES
                found.extend(_list_files(fs, path, original, self.KEEPS_EMPTY_FILES, hides))
            if not found:
                raise self._nothing_found()
            found = _distinct(found, self.filesystem)
            _refuse_unaddressable(self.filesystem, [i.path for i in found], self.uri)
            self._stamps = {i.path: (i.size, i.mtime_ns) for i in found}
            self._files = [i.path for i in found]
            self.format = self.format or self._infer_format(self._files)
        return self._files

    def _nothing_found(self) -> DataError:
        """No file with bytes: name the empty ones (a listing skips them), if any."""
        empty = [
            i.path
            for original in self.paths
            for i in _empty_files(*_filesystem(original, self.storage))
        ]
        if empty:
            return _empty_error(empty[0], len(empty))
        where = ", ".join(redact(p) for p in self.paths)
        return DataError(f"no input files under {where}: nothing to do.")

    def _infer_format(self, files: list[str]) -> str:
        formats = {_format_of(f) for f in files}
        if len(formats) == 1 and None not in formats:
            found = str(formats.pop())
            if found == "parquet" and any(_compression(f) for f in files):
                raise DataError(
                    f"{redact(files[0])!r} is a compressed Parquet file: Parquet compresses "
                    "its pages itself, and is read from a plain file. Decompress it."
                )
            return found
        raise DataError(
            f"cannot tell the input format of {redact(self.paths[0])!r} from its file names "
            f"({files[0]}). Set the format: parquet, csv, jsonl or images (images reads the "
            ".jpg, .jpeg and .png files and leaves the others out)."
        )

    def _open(self, path: str) -> Any:
        """Open a file for random access."""
        return open_input_file(self.filesystem, path)

    def _open_unit(self, path: str, listed: int | None) -> Any:
        """Open a unit's file; one whose size is not the ``listed`` one (its unit's, from
        planning) changed since: its rows are not those planned, and it is not read."""
        handle = self._open(path)
        if listed is not None and (size := handle.size()) != listed:
            handle.close()
            raise InputChanged(
                f"input file {path!r} is {size:,} bytes where it was {listed:,} when the job "
                f"was planned: {INPUT_CHANGED}"
            )
        return handle

    def schema(self) -> pa.Schema:
        """The columns of the first file that can be read (for CSV and JSON Lines, of the
        first with rows: a header alone has no types). A file that cannot be read is
        planned as a unit that failed (:attr:`Unit.error`); the job names it or skips it."""
        if self._planned is not None:
            return self._planned
        files = self.files()
        if self.column_types and self.format not in ("csv", "jsonl"):
            raise ConfigError(
                f"column_types: an option of CSV and JSON Lines input, which carry no types; "
                f"{self.format} input does. Leave it out."
            )
        found: tuple[pa.Schema, str] | None = None
        fallback: tuple[pa.Schema, str] | None = None
        for k, path in enumerate(files):
            if path in self._bad:
                continue
            try:
                schema, rows = self._schema_of(path)
            except DataError as exc:
                self._bad[path] = str(exc)
                continue
            if rows != 0:
                found = (self._typed(schema, files[k + 1 :]), path)
                break
            fallback = fallback or (schema, path)
        found = found or fallback
        if found is None:
            raise DataError(next(iter(self._bad.values())))
        if self.column_types:
            undeclared = set(self.column_types) - set(found[0].names)
            if undeclared:
                raise ConfigError(
                    f"column_types names {sorted(undeclared)}, which {found[1]!r} does not "
                    f"have (its columns: {', '.join(found[0].names)}). Check the names."
                )
        self._planned, self._reference = found
        return self._planned

    def _typed(self, schema: pa.Schema, later: Sequence[str]) -> pa.Schema:
        """``schema`` with a type for each column whose values were all empty (Arrow's null
        type), from the next few files that have values in it: with the null type, a later
        file's values could not be read. One still unknown stays null (a later file with
        values there is refused, and says to declare the type)."""
        unknown = {f.name for f in schema if pa.types.is_null(f.type)}
        types: dict[str, pa.DataType] = {}
        for path in later[:LOOKAHEAD_FILES]:
            if not unknown - set(types):
                break
            try:
                other, _ = self._schema_of(path)
            except DataError:
                continue
            for name in unknown - set(types):
                if name in other.names and not pa.types.is_null(other.field(name).type):
                    types[name] = other.field(name).type
        typed = [f.with_type(types.get(f.name, f.type)) for f in schema]
        return pa.schema(typed, metadata=schema.metadata)  # pandas' own, for one

    @property
    def reference(self) -> str | None:
        """The file the planned columns come from (for a message naming two files)."""
        return self._reference

    def _schema_of(self, path: str) -> tuple[pa.Schema, int | None]:
        """A file's columns, and its rows where that took reading them (CSV, JSON Lines)."""
        if self._stamps.get(path, (None, None))[0] == 0:
            raise _empty_error(path, 1)
        try:
            if self.format == "parquet":
                schema = retrying(lambda: pq.read_schema(self._open(path)), f"reading {path}")
                _check_names(schema, path)
                return schema, None
            table = retrying(lambda: self._read_file(path, None), f"reading {path}")
            return table.schema, table.num_rows
        except (pa.ArrowException, OSError) as exc:
            raise unreadable(f"the schema of {path!r}", exc) from exc

    def plan(self) -> list[Unit]:
        files = self.files()
        if self.format != "parquet":
            return [
                Unit(
                    i,
                    self._unit_id(f),
                    None,
                    path=f,
                    error=self._bad.get(f, "") or self._empty(f),
                    size=self._size(f),
                    stamp=self._stamp(f),
                )
                for i, f in enumerate(files)
            ]
        units: list[Unit] = []
        with ThreadPoolExecutor(max_workers=16) as pool:
            # Each footer becomes units as it arrives and is let go: a footer object holds
            # kilobytes, so a list of all of them made planning a million files heavy.
            for path, meta in zip(files, pool.map(self._footer, files), strict=True):
                if isinstance(meta, DataError):
                    uid = self._unit_id(path)
                    units.append(Unit(len(units), uid, None, path=path, error=str(meta)))
                else:
                    units.extend(self._parquet_units(path, meta, len(units)))
        return units

    def _footer(self, path: str) -> pq.FileMetaData | DataError:
        """The file's footer, or the error that says why it cannot be read (a column named
        twice included: Arrow reads the file, chute could not tell the two apart)."""
        try:
            size = self._stamps.get(path, (None, None))[0]
            meta = retrying(
                lambda: parquet_metadata(self.filesystem, path, size), f"reading {path}"
            )
        except (pa.ArrowException, OSError) as exc:
            error = unreadable(f"the Parquet footer of {path!r}", exc)
            if not isinstance(error, DataError):
                raise error from exc  # not the file's fault: never a bad file to skip
            return error
        try:
            _check_names(meta.schema.to_arrow_schema(), path)
        except DataError as exc:
            return exc
        return meta

    def _parquet_units(self, path: str, meta: pq.FileMetaData, start: int) -> list[Unit]:
        units: list[Unit] = []
        group: list[int] = []
        rows = nbytes = 0
        size, stamp = self._stamps.get(path, (None, None))
        for rg in range(meta.num_row_groups):
            group.append(rg)
            rows += meta.row_group(rg).num_rows
            nbytes += meta.row_group(rg).total_byte_size
            if rows >= UNIT_TARGET_ROWS or rg == meta.num_row_groups - 1:
                whole = len(group) == meta.num_row_groups
                uid = self._unit_id(path) + ("" if whole else f"#rg{group[0]}-{group[-1]}")
                index = start + len(units)
                unit = Unit(index, uid, rows, nbytes, path, tuple(group), size=size, stamp=stamp)
                units.append(unit)
                group, rows, nbytes = [], 0, 0
        if meta.num_row_groups == 0:
            units.append(Unit(start, self._unit_id(path), 0, 0, path, (), size=size, stamp=stamp))
        return units

    def _size(self, path: str) -> int | None:
        return self._stamps.get(path, (None, None))[0]

    def _empty(self, path: str) -> str:
        """Why a listed 0-byte file (named alone, or by a glob) cannot be read; "" if not."""
        return f"input file {redact(path)!r} is empty (0 bytes)." if self._size(path) == 0 else ""

    def _stamp(self, path: str) -> int | None:
        return self._stamps.get(path, (None, None))[1]

    def _unchanged(self, unit: Unit) -> None:
        """Called once a unit's rows are read, before the last of them is handed on: a file
        whose size or modification time is not the listing's was rewritten since planning
        (even at its old size), and what was read may mix two versions of it.

        An object store is asked too (a HEAD a unit, beside the unit's own GETs): an object
        rewritten at its old size mid-run was read by the units after it with the new
        bytes and the row groups planned from the old, a complete run of two versions.
        There the time is compared to the second (what a HEAD says), so a rewrite at the
        same size within the listed second is not seen."""
        if unit.path is not None:
            self._as_listed(unit.path, unit.size, unit.stamp)

    def _as_listed(self, path: str, size: int | None, stamp: int | None) -> None:
        """:meth:`_unchanged` for one file, listed at ``size`` bytes and modified at
        ``stamp`` (ns); nothing to compare without the time."""
        if stamp is None:
            return
        local = is_local(self.filesystem)
        info = self.filesystem.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise InputChanged(
                f"input file {path!r} was removed after the job was planned: {INPUT_CHANGED}"
            )
        now = info.mtime_ns
        moved = now != stamp if local else now is not None and now // 10**9 != stamp // 10**9
        if moved or (size is not None and info.size != size):
            raise InputChanged(
                f"input file {path!r} was modified after the job was planned "
                f"({_when(stamp)} then, {_when(info.mtime_ns)} now): {INPUT_CHANGED}"
            )

    def _unit_id(self, path: str) -> str:
        return path

    def overlaps(self, fs: pafs.FileSystem, root: str, part_name: str) -> str | None:
        """Why an output directory at ``root`` on ``fs`` cannot go with this input (or
        ``None``): an input file inside it would be deleted by ``--overwrite`` and read
        back as output, and an output inside an input folder (or under a glob that would
        match its part files, named like ``part_name``) is read as input by the next run."""
        if fs.type_name != self.filesystem.type_name:
            return None
        real = _real if is_local(fs) else _same
        out = real(root)
        for path in self.files():
            if real(path) == out or real(path).startswith(out + "/"):
                return f"the input file {path!r} is inside the output {root!r}"
        part = f"{out}/{part_name}"
        for original in self.paths if self.READS_PARTS else ():
            fs, given = _filesystem(original, self.storage)
            try:
                globbed = is_glob(fs, given)
            except OSError:  # cannot tell: checked as the pattern it may be
                globbed = has_glob(given)
            given = real(given)
            if globbed:
                if _glob(given).fullmatch(part):
                    return f"the input glob {original!r} matches the output's files ({part})"
            elif out.startswith(given + "/") and not _hidden(out[len(given) :]):
                return f"the output {root!r} is inside the input folder {original!r}"
        return None

    def read(
        self, unit: Unit, columns: Sequence[str] | None, dictionary: Sequence[str] = ()
    ) -> pa.Table:
        """Read a unit; columns the file lacks are left out (the reader names the drift).
        ``dictionary``: Parquet columns read as Arrow dictionaries."""
        assert unit.path is not None
        if self.format is None:
            self.files()  # infers the format: never read Parquet as JSON
        path = unit.path
        try:
            table = retrying(
                lambda: self._read_unit(path, unit, columns, dictionary), f"reading {path}"
            )
        except (pa.ArrowException, OSError) as exc:
            if not is_local(self.filesystem):  # an object rewritten at another size: its
                with contextlib.suppress(OSError):  # planned ranges are past its end (416)
                    self._unchanged(unit)
            raise unreadable(f"input file {path!r}", exc) from exc
        self._unchanged(unit)
        return table

    def stream(
        self, unit: Unit, columns: Sequence[str] | None, dictionary: Sequence[str] = ()
    ) -> Iterator[pa.Table] | None:
        """A local Parquet unit's rows in batches of :data:`READ_BATCH_ROWS` as they are
        decoded, so a reader holds a batch, not the unit (``None``: another format or an
        object store, or a subclass with a :meth:`read` of its own: read it whole)."""
        if type(self).read is not FileSource.read:  # its read is the contract: not bypassed
            return None
        if self.format is None:
            self.files()
        if self.format != "parquet" or unit.path is None or not is_local(self.filesystem):
            return None
        return self._stream(unit, columns, dictionary)

    def _stream(
        self, unit: Unit, columns: Sequence[str] | None, dictionary: Sequence[str] = ()
    ) -> Iterator[pa.Table]:
        """The batches of :meth:`stream`; the file is checked (:meth:`_unchanged`) before its
        last planned row is handed on, so a unit read from a rewritten file never completes."""
        path, groups, left = str(unit.path), list(unit.row_groups or ()), unit.rows
        try:  # opening is retried; a local file that fails half-way fails its unit
            handle = retrying(lambda: self._open_unit(path, unit.size), f"reading {path}")
            with handle:
                pf = pq.ParquetFile(
                    handle,
                    buffer_size=STREAM_BUFFER,
                    pre_buffer=False,
                    read_dictionary=list(dictionary) or None,
                )
                names = pf.schema_arrow.names
                cols = None if columns is None else [c for c in columns if c in names]
                for batch in pf.iter_batches(READ_BATCH_ROWS, row_groups=groups, columns=cols):
                    if left is not None and (left := left - batch.num_rows) <= 0:
                        self._unchanged(unit)
                    yield pa.Table.from_batches([batch])
        except (pa.ArrowException, OSError) as exc:
            raise unreadable(f"input file {path!r}", exc) from exc

    def _read_unit(
        self, path: str, unit: Unit, columns: Sequence[str] | None, dictionary: Sequence[str] = ()
    ) -> pa.Table:
        if self.format == "parquet":
            size = unit.size if unit.size is not None else self._size(path)
            groups = list(unit.row_groups or ())
            cols = list(columns) if columns is not None else None
            if size is not None and not is_local(self.filesystem):  # no HEAD per object
                return read_row_groups(self.filesystem, path, size, groups, cols)
            pf = pq.ParquetFile(
                self._open_unit(path, size), read_dictionary=list(dictionary) or None
            )
            if cols is not None:
                cols = [c for c in cols if c in pf.schema_arrow.names]
            return pf.read_row_groups(groups, columns=cols)
        return self._read_file(path, columns, unit.size)

    def _read_file(
        self, path: str, columns: Sequence[str] | None, listed: int | None = None
    ) -> pa.Table:
        """A CSV or JSON Lines file (checked against its ``listed`` size: :meth:`_open_unit`).

        Its text columns (as planned: the first file's) and the declared ones
        (:attr:`column_types`) are read as such, never inferred again: Arrow would read
        ``02139`` as the number 2139, or ISO text as a timestamp, and the cast back would
        change the text. The others are inferred and conformed by the reader, whose casts
        change no value (a big integer is not rounded into a float column). A column the
        file lacks is left out, for the reader to name the drift (never filled with nulls)."""
        pinned = self._pinned()
        try:
            try:  # streamed from the file: its bytes are never all in memory at once
                table = self._parse(path, self._opener(path, listed), columns, pinned, None)
            except pa.ArrowInvalid:
                # Arrow parses in blocks of 1 MiB: a record longer than a block fails so
                # ("straddles two block boundaries"). Parsed again as one block; what
                # fails again is the file's own fault.
                data = self._bytes_of(path, listed)
                block = min(max(data.size, 1 << 20), WHOLE_BLOCK_MAX)
                table = self._parse(path, lambda: pa.BufferReader(data), columns, pinned, block)
        except pa.ArrowInvalid as exc:
            if "invalid UTF8" in str(exc):
                raise DataError(
                    f"input file {path!r} is not UTF-8 ({exc}). Save the file as UTF-8."
                ) from exc
            if not pinned or not _conversion(exc):
                raise  # the file's own fault (a ragged row, a JSON line cut short), named
            raise DataError(self._type_error(path, exc)) from exc
        _check_names(table.schema, path)
        if columns is not None:
            table = table.select([c for c in columns if c in table.column_names])
        if self.format == "jsonl":
            _check_utf8(table, path)
        else:
            _check_csv_text(table, path, self.column_types)
        for name in _rounded(table, self.column_types):
            _check_rounded(path, self.format or "csv", name, self._opener(path, listed))
        return table

    def _opener(self, path: str, listed: int | None) -> Callable[[], Any]:
        """Opens the file afresh at each call, through its codec (``.csv.gz``)."""
        codec = _compression(path)

        def opened() -> Any:
            handle = self._open_unit(path, listed)
            return handle if codec is None else pa.CompressedInputStream(handle, codec)

        return opened

    def _bytes_of(self, path: str, listed: int | None) -> pa.Buffer:
        """The file's bytes (decompressed through its codec), read whole."""
        with self._opener(path, listed)() as stream:
            return stream.read_buffer()

    def _parse(
        self,
        path: str,
        opened: Callable[[], Any],
        columns: Sequence[str] | None,
        pinned: dict[str, pa.DataType],
        block: int | None,
    ) -> pa.Table:
        """The file parsed (``opened`` gives a fresh stream of its bytes), in blocks of
        ``block`` bytes (``None``: Arrow's)."""
        if self.format == "csv":
            return self._parse_csv(path, opened, columns, pinned, block)
        read = pajson.ReadOptions(block_size=block) if block else None

        def parse(types: dict[str, pa.DataType]) -> pa.Table:
            options = pajson.ParseOptions(
                explicit_schema=pa.schema(types) if types else None,
                unexpected_field_behavior="infer",
            )
            with opened() as stream:
                return pajson.read_json(stream, read_options=read, parse_options=options)

        # Pinned first as declared only: a key no record of this file has stays absent
        # (drift), where an explicit schema would fill it with nulls. A text column that
        # came back as anything else (ISO text as a timestamp) is read again, as text.
        declared = {k: v for k, v in pinned.items() if k in self.column_types}
        table = parse(declared)
        again = {
            name: kind
            for name, kind in pinned.items()
            if name in table.column_names and table.schema.field(name).type != kind
        }
        # Arrow takes any ISO time text for a timestamp without a zone, moving a time with
        # an offset to UTC in silence ("00:00+02:00" became a naive 22:00 the day before):
        # such columns are read again as text and given the type their text says.
        timed = {
            f.name: texted
            for f in table.schema
            if f.name not in pinned and (texted := _texted(f.type)) is not None
        }
        # Arrow's JSON reader builds an invalid list where one starts with a null ([null,
        # "v"]: offsets past its values; the text was then "not UTF-8", the file left out
        # under skip): such columns are read again, given the type it inferred.
        broken = {
            f.name: f.type
            for f, column in zip(table.schema, table.columns, strict=True)
            if pa.types.is_nested(f.type) and not _valid(column)
        }
        if again or timed or broken:  # in the file's order (Arrow puts explicit ones first)
            table = parse({**declared, **again, **timed, **broken}).select(table.column_names)
        for name in timed:
            i = table.schema.get_field_index(name)
            column = table.column(i)
            kind = _timed(column)
            if kind != column.type:
                field = table.schema.field(i).with_type(kind)
                table = table.set_column(i, field, column.cast(kind))
        return table

    def _parse_csv(
        self,
        path: str,
        opened: Callable[[], Any],
        columns: Sequence[str] | None,
        pinned: dict[str, pa.DataType],
        block: int | None,
    ) -> pa.Table:
        def parse(include: list[str] | None) -> pa.Table:
            convert = pacsv.ConvertOptions(
                include_columns=include, include_missing_columns=False, column_types=pinned
            )
            with opened() as stream:
                counted = _CsvStream(stream)
                table = pacsv.read_csv(
                    counted,
                    read_options=pacsv.ReadOptions(block_size=block) if block else None,
                    # Always: without it Arrow's parallel parse cuts a quoted field that
                    # holds a line break at a block boundary, and may do so in silence (a
                    # 40,000-row file read back 40,000 rows, one of them cut in two)
                    parse_options=pacsv.ParseOptions(newlines_in_values=True),
                    convert_options=convert,
                )
            header = _csv_header(counted.first) if include is not None else table.schema
            if include is not None:  # a name twice among the columns left out
                _check_names(header, path)
            # more lines than records: a value holds a line break (or a line is blank); an
            # odd count of quotes: one may be open in the last record, which took its break
            broken = counted.lines > table.num_rows + 1
            if (broken or counted.quotes % 2) and _suspect(
                table, header.names, opened, broken, counted.closed_at_end
            ):
                with opened() as stream:  # the file read again, whole
                    data = stream.read()
                types = {f.name: f.type for f in self._planned or table.schema}
                if (trouble := _quote_trouble(data, header.names, types)) is not None:
                    raise _quote_error(path, data, *trouble)
            return table

        try:
            return parse(list(columns) if columns else None)
        except pa.ArrowKeyError:  # a column the file lacks: left out, for the reader to name
            with opened() as stream:
                header = pacsv.open_csv(stream).schema.names
            return parse([c for c in columns or () if c in header])

    def _pinned(self) -> dict[str, pa.DataType]:
        """The types read as such: the planned text columns, then the declared ones."""
        planned = self._planned
        text = {} if planned is None else {f.name: f.type for f in planned if _text(f.type)}
        return {**text, **self.column_types}

    def _type_error(self, path: str, exc: pa.ArrowInvalid) -> str:
        where = (
            "the column types declared in column_types"
            if self._reference is None
            else f"the column types of {self._reference!r} (inferred from its values"
            + (", and column_types)" if self.column_types else ")")
        )
        return (
            f"cannot read input file {path!r} with {where}: {exc}. Declare the column's type "
            "for every file (input: column_types: {name: string}; any Arrow type name: int64, "
            "float64, bool, date32, timestamp[ms], ...), or make the files agree, or set "
            "on_bad_input: skip to leave such files out."
        )

    def describe(self) -> dict[str, Any]:
        files = self.files()
        described: dict[str, Any] = {
            "kind": "files",
            "format": self.format,
            "files": [[f, *self._stamps.get(f, (None, None))] for f in files],
        }
        if self.column_types:  # only when set: the fingerprints of earlier jobs stay as they were
            described["column_types"] = {k: str(t) for k, t in self.column_types.items()}
        return described
