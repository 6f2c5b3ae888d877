"""Stage statistics that travel with the rows, for the ray engine.

Each stage appends its busy time to the batch it emits as per-row shares (``seconds / n``
in every row, and ``1 / n`` of a batch). Ray Data cuts and joins blocks on their way to
the next actor pool, and shares survive that: a slice keeps its rows' shares, a join adds
them. The writing actor sums and drops these columns and hands the totals to the driver
with its part records. A stats actor would do the same at the cost of one more worker
process per run (0.2–0.6 s on a 2-CPU machine) and a call per batch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np
import pyarrow as pa

from chute.report import StageStats

PREFIX = "__chute_stats:"
_BUSY, _BATCHES, _SPLITS, _BATCH_ROWS = "busy", "batches", "splits", "batch_rows"
_COUNTERS = "counters"
"""A model's counters travel as JSON in the first row of its batch (null in the others):
a slice holds it or not, a join keeps every one, so each batch's counters are summed once,
whatever names they have (the columns of a stage must not change from batch to batch)."""
COUNTED = "c."
"""The prefix of a counter in the totals (``c.generated_tokens``)."""
STAGES = "stages"
"""The column of a record table that holds the JSON totals (in its first row)."""


def carry(
    table: pa.Table,
    stage: str,
    seconds: float,
    splits: tuple[int, int | None] | None = None,
    counters: Mapping[str, float] | None = None,
) -> pa.Table:
    """``table`` with ``stage``'s busy time (and, for model stages that are not the last,
    its out-of-memory splits and counters) spread over its rows. Every batch of a stage
    gets the same columns, so blocks that Ray Data joins always share a schema."""
    n = table.num_rows
    share = 1.0 / n if n else 0.0
    columns = {_BUSY: np.full(n, seconds * share), _BATCHES: np.full(n, share)}
    if splits is not None:
        count, rows = splits
        columns[_SPLITS] = np.full(n, count * share)
        columns[_BATCH_ROWS] = np.full(n, rows or 0.0)
    for kind, values in columns.items():
        table = table.append_column(f"{PREFIX}{stage}:{kind}", pa.array(values, pa.float32()))
    if splits is not None:
        text = [encode_counters(counters or {})] + [None] * (n - 1) if n else []
        table = table.append_column(f"{PREFIX}{stage}:{_COUNTERS}", pa.array(text, pa.string()))
    return table


def encode_counters(counters: Mapping[str, float]) -> str | None:
    return json.dumps(dict(counters), separators=(",", ":")) if counters else None


def counted(totals: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """The counters in ``totals``, by stage (without their prefix)."""
    out = {}
    for stage, entry in totals.items():
        mine = {k[len(COUNTED) :]: v for k, v in entry.items() if k.startswith(COUNTED)}
        if mine:
            out[stage] = mine
    return out


def collect(table: pa.Table) -> tuple[pa.Table, dict[str, dict[str, float]]]:
    """``table`` without the carried columns, and their totals per stage."""
    carried = [name for name in table.column_names if name.startswith(PREFIX)]
    totals: dict[str, dict[str, float]] = {}
    for name in carried:
        stage, _, kind = name[len(PREFIX) :].rpartition(":")
        entry = totals.setdefault(stage, {_BUSY: 0.0, _BATCHES: 0.0, "rows": 0.0})
        if kind == _COUNTERS:
            for text in table.column(name).drop_null().to_pylist():
                for counter, value in json.loads(text).items():
                    key = COUNTED + counter
                    entry[key] = entry.get(key, 0.0) + float(value)
            continue
        values = table.column(name).to_numpy()
        if kind == _BATCH_ROWS:
            sizes = values[values > 0]
            entry[kind] = float(sizes.min()) if sizes.size else 0.0
        else:
            entry[kind] = float(np.sum(values, dtype=np.float64))
        if kind == _BUSY:
            entry["rows"] = float(table.num_rows)
    return table.drop_columns(carried), totals


def add(into: dict[str, dict[str, float]], totals: Mapping[str, Mapping[str, float]]) -> None:
    """Sum ``totals`` into ``into`` (the smallest batch size wins)."""
    for stage, entry in totals.items():
        mine = into.setdefault(stage, {})
        for kind, value in entry.items():
            if kind == _BATCH_ROWS:
                known = [v for v in (mine.get(kind), value) if v]
                mine[kind] = min(known) if known else 0.0
            else:
                mine[kind] = mine.get(kind, 0.0) + value


def encode(totals: Mapping[str, Mapping[str, float]]) -> str:
    return json.dumps(totals, separators=(",", ":"))


def decode(text: str) -> dict[str, dict[str, float]]:
    return dict(json.loads(text)) if text else {}


def stage_stats(totals: Mapping[str, Mapping[str, float]]) -> dict[str, StageStats]:
    """The run's totals as the report's stage statistics."""
    stats = {}
    for stage, entry in totals.items():
        stat = StageStats()
        stat.add(
            entry.get(_BUSY, 0.0), round(entry.get("rows", 0.0)), round(entry.get(_BATCHES, 0))
        )
        rows = entry.get(_BATCH_ROWS)
        stat.add_splits(round(entry.get(_SPLITS, 0.0)), round(rows) if rows else None)
        stat.add_counters(counted({stage: entry}).get(stage, {}))
        stats[stage] = stat
    return stats
