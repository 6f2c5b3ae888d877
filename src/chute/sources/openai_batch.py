"""OpenAI Batch files as a source: one request per line, ``{custom_id, method, url, body}``.

The file is read and checked once, when the job is planned: every line must be a JSON
object with a string ``custom_id``, and no ``custom_id`` may repeat (a repeat is refused
before any compute, naming the ids and their lines). A request whose ``url`` or ``body``
is wrong is still a row: the model answers it with an error line, and the rest go on.

Rows have three columns: ``custom_id``, ``url`` and ``body`` (the body as JSON text). The
rows are split into units of :data:`REQUESTS_PER_UNIT` requests, committed one by one.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from chute.errors import ConfigError, DataError
from chute.sources.memory import TableSource
from chute.storage import StorageOptions, redact, resolve

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
        rows = [row for path in self.paths for row in read_requests(path, storage)]
        check_unique(rows)
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


def read_requests(
    path: str, storage: StorageOptions | None = None
) -> list[tuple[str, str | None, str | None, int]]:
    """``(custom_id, url, body as JSON text, line number)`` for each request of a file."""
    fs, where = resolve(path, storage)
    try:
        with fs.open_input_stream(where) as stream:
            text = stream.read().decode("utf-8-sig")  # a BOM, as JSON Lines input allows
    except FileNotFoundError:
        raise DataError(
            f"the batch input {redact(path)!r} does not exist: check the path."
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read the batch input {redact(path)!r}: {exc}") from exc
    rows = []
    for number, line in enumerate(text.split("\n"), start=1):  # not U+2028 inside a string
        if line.strip():
            rows.append(_request(line, number, path))
    if not rows:
        raise DataError(f"the batch input {redact(path)!r} holds no requests.")
    return rows


def _request(line: str, number: int, path: str) -> tuple[str, str | None, str | None, int]:
    where = f"{redact(path)}, line {number}"
    try:
        request = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where} is not JSON ({exc.msg}): each line is one request.") from None
    if not isinstance(request, dict) or not isinstance(request.get("custom_id"), str):
        raise DataError(
            f"{where} has no custom_id: each line is "
            '{"custom_id": "...", "method": "POST", "url": "/v1/...", "body": {...}}.'
        )
    url = request.get("url")
    body = request.get("body")
    return (
        request["custom_id"],
        url if isinstance(url, str) else None,
        None if body is None else json.dumps(body, ensure_ascii=False),
        number,
    )


def check_unique(rows: Sequence[tuple[str, Any, Any, int]]) -> None:
    """Refuse repeated ``custom_id``s: each request must get exactly one answer."""
    counts = Counter(row[0] for row in rows)
    repeated = [cid for cid, n in counts.items() if n > 1]
    if repeated:
        lines = {cid: [row[3] for row in rows if row[0] == cid] for cid in repeated[:5]}
        shown = "; ".join(f"{cid!r} (lines {', '.join(map(str, n))})" for cid, n in lines.items())
        raise ConfigError(
            f"{len(repeated)} custom_id(s) repeat in the batch input: {shown}. Each request "
            "needs its own custom_id, so that it gets exactly one answer: rename the repeats."
        )
