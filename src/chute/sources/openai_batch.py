"""OpenAI Batch files as a source: one request per line, ``{custom_id, method, url, body}``.

Each path is a file, a folder or a glob (listed as any input is: its files, sorted). The
files are read and checked once, when the job is planned: every line must be a JSON
object with a string ``custom_id`` and, where it says, ``method`` POST, in UTF-8 text; no
``custom_id`` may repeat (a repeat is refused before any compute, naming the ids, their
files and lines). A request whose ``url`` or ``body`` is wrong is still a row: the model
answers it with an error line, and the rest go on.

Rows have three columns: ``custom_id``, ``url`` and ``body`` (the body as JSON text). The
rows are split into units of :data:`REQUESTS_PER_UNIT` requests, committed one by one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from chute.errors import DataError
from chute.sources.memory import TableSource
from chute.storage import StorageOptions, is_remote, redact, resolve

REQUESTS_PER_UNIT = 256
"""Requests per unit: what a kill can cost at most per unit in flight."""
COLUMNS = ("custom_id", "url", "body")


class OpenAIBatchSource(TableSource):
    """The requests of one or more OpenAI Batch input files (JSON Lines)."""

    def __init__(
        self,
        paths: str | Sequence[str],
        storage: StorageOptions | None = None,
        unit_rows: int = REQUESTS_PER_UNIT,
    ) -> None:
        self.paths = [paths] if isinstance(paths, str) else list(paths)
        files = [(path, read_requests(path, storage)) for path in input_files(self.paths, storage)]
        check_unique(files)
        rows = [row for _, requests in files for row in requests]
        table = pa.table(
            {
                name: pa.array([row[i] for row in rows], pa.string())
                for i, name in enumerate(COLUMNS)
            }
        )
        super().__init__(table, unit_rows)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "openai-batch",
            "paths": [redact(p) for p in self.paths],
            "content": self.digest(),
            "unit_rows": self.unit_rows,
        }


LINE = '{"custom_id": "...", "method": "POST", "url": "/v1/...", "body": {...}}'
"""What each line of a batch input is."""

Request = tuple[str, str | None, str | None, int]
"""``(custom_id, url, body as JSON text, line number)``."""


def input_files(paths: Sequence[str], storage: StorageOptions | None = None) -> list[str]:
    """The files the paths name: a file as it is; a folder's or a glob's files, listed as
    any input is (sorted, hidden ones left out)."""
    from chute.sources.files import FileSource, has_glob  # a source beside this one

    files: list[str] = []
    for path in paths:
        fs, where = resolve(path, storage)
        try:
            kind = fs.get_file_info(where).type
        except OSError:
            kind = None  # read as a file: its error names it
        # "reqs/" on an object store: the folder, as FileSource reads it, where an object
        # "reqs" sits beside the keys "reqs/..."
        folder = kind == pafs.FileType.Directory or (path.endswith("/") and is_remote(path))
        if not (folder or (has_glob(where) and kind == pafs.FileType.NotFound)):
            files.append(path)
            continue
        source = FileSource(path, storage=storage, format="jsonl")
        files += [source.uri(f) for f in source.files()]  # s3://…, as addressed
    return files


def read_requests(path: str, storage: StorageOptions | None = None) -> list[Request]:
    """``(custom_id, url, body as JSON text, line number)`` for each request of a file."""
    fs, where = resolve(path, storage)
    try:
        with fs.open_input_stream(where) as stream:
            data = stream.read()
    except FileNotFoundError:
        raise DataError(
            f"the batch input {redact(path)!r} does not exist: check the path."
        ) from None
    except OSError as exc:
        raise DataError(f"cannot read the batch input {redact(path)!r}: {exc}") from exc
    data = data.removeprefix(b"\xef\xbb\xbf")  # a BOM, as JSON Lines input allows
    rows = []
    for number, line in enumerate(data.split(b"\n"), start=1):  # not U+2028 in a string
        if line.strip():
            rows.append(_request(line, number, path))
    if not rows:
        raise DataError(f"the batch input {redact(path)!r} holds no requests.")
    return rows


def _request(data: bytes, number: int, path: str) -> Request:
    where = f"{redact(path)}, line {number}"
    try:
        line = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{where} is not UTF-8 text (byte {exc.start + 1} of the line): batch input is "
            "UTF-8 JSON Lines. Re-encode the file."
        ) from None
    try:
        request = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where} is not JSON ({exc.msg}): each line is one request.") from None
    if not isinstance(request, dict) or "custom_id" not in request:
        raise DataError(f"{where} has no custom_id: each line is {LINE}.")
    custom_id = request["custom_id"]
    if not isinstance(custom_id, str):
        raise DataError(
            f"{where} has custom_id {custom_id!r}, a {type(custom_id).__name__}: a custom_id "
            f"is a string (each line is {LINE})."
        )
    method = request.get("method", "POST")
    if method != "POST":
        raise DataError(
            f"{where} has method {method!r}: batch requests are POST (as OpenAI's Batch API "
            "takes them). Fix the line."
        )
    url = request.get("url")
    body = request.get("body")
    text = None if body is None else json.dumps(body, ensure_ascii=False)
    try:  # JSON's \ud800 escapes decode to text that no UTF-8 writer can take
        for field in (custom_id, url, text):
            if isinstance(field, str):
                field.encode("utf-8")
    except UnicodeEncodeError:
        raise DataError(
            f"{where} holds a lone surrogate escape (such as \\ud800), which is no character "
            "and cannot be written as UTF-8: fix the line."
        ) from None
    return (custom_id, url if isinstance(url, str) else None, text, number)


def check_unique(files: Sequence[tuple[str, Sequence[Request]]]) -> None:
    """Refuse repeated ``custom_id``s, naming their files and lines: each request must get
    exactly one answer."""
    seen: dict[str, list[str]] = {}
    several = len(files) > 1
    for path, rows in files:
        for row in rows:
            where = f"{redact(path)} line {row[3]}" if several else str(row[3])
            seen.setdefault(row[0], []).append(where)
    repeated = {cid: places for cid, places in seen.items() if len(places) > 1}
    if repeated:
        shown = "; ".join(
            f"{cid!r} ({'' if several else 'lines '}{', '.join(places)})"
            for cid, places in list(repeated.items())[:5]
        )
        raise DataError(
            f"{len(repeated)} custom_id(s) repeat in the batch input: {shown}. Each request "
            "needs its own custom_id, so that it gets exactly one answer: rename the repeats."
        )
