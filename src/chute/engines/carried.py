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
from chute.stages import KEY, Batching, rows

PREFIX = "__chute_stats:"
_BUSY, _BATCHES, _SPLITS, _BATCH_ROWS = "busy", "batches", "splits", "batch_rows"
_RESIZES, _CALLS, _LOADS, _LOAD_SECONDS = "resizes", "calls", "loads", "load_seconds"
_SIZING = (_SPLITS, _RESIZES, _CALLS)
"""A model's sizing counts (summed); its size now, ``batch_rows``, is the latest one."""
_COUNTERS = "counters"
"""A model's counters travel as JSON in the first row of its batch (null in the others):
a slice holds it or not, a join keeps every one, so each batch's counters are summed once,
whatever names they have (the columns of a stage must not change from batch to batch)."""
COUNTED = "c."
"""The prefix of a counter in the totals (``c.generated_tokens``)."""
STAGES = "stages"
"""The column of a record table that holds the JSON totals (in its first row)."""
NODE = "node"
"""The column of a record table that names the node (its address) whose worker wrote it."""
RETRIED = "__chute_retried"
"""A row's mark that a Ray task on its way ran before (1; else 0): its node or worker was
lost, or its output was, and Ray ran it again. The read tasks add it, each later task that
ran again sets it, and the writer turns it into :data:`AGAIN`."""
AGAIN = "again"
"""The column of a record table that says whether its rows were computed again (see
:data:`RETRIED`): the driver names those units in the report."""


def attempt() -> int:
    """How many times Ray ran the task now running before this time (0: its first run, or
    not in a Ray task). Ray 2.60 keeps the number on its core worker only, with no public
    API (``tests/test_carried.py`` checks that it is still there and counts)."""
    try:
        from ray._private import worker

        return int(worker.global_worker.core_worker.get_current_task_attempt_number())
    except Exception:  # not in a Ray worker
        return 0


def mark(table: pa.Table) -> pa.Table:
    """``table`` with :data:`RETRIED` added (by a read) or set (by a task that ran again)."""
    again = attempt() > 0
    if RETRIED not in table.column_names:
        return table.append_column(RETRIED, pa.array(np.full(table.num_rows, again, np.bool_)))
    if not again:
        return table
    at = table.column_names.index(RETRIED)
    return table.set_column(at, RETRIED, pa.array(np.ones(table.num_rows, np.bool_)))


def retried(table: pa.Table) -> tuple[pa.Table, set[int]]:
    """``table`` without :data:`RETRIED`, and the units whose rows in it were computed
    again (every unit in it, if the task running now ran before)."""
    if RETRIED not in table.column_names:
        return table, set()
    flags = table.column(RETRIED).to_numpy(zero_copy_only=False)
    table = table.drop_columns([RETRIED])
    if attempt() > 0:
        flags = np.ones(len(flags), np.bool_)
    if not flags.any() or KEY not in table.column_names:
        return table, set()
    units, _, _ = rows.decode(table.column(KEY).to_numpy()[flags])
    return table, {int(u) for u in np.unique(units)}


def carry(
    table: pa.Table,
    stage: str,
    seconds: float,
    batching: Batching | None = None,
    counters: Mapping[str, float] | None = None,
) -> pa.Table:
    """``table`` with ``stage``'s busy time (and, for model stages that are not the last,
    its batch sizing and counters) spread over its rows. Every batch of a stage gets the
    same columns, so blocks that Ray Data joins always share a schema."""
    n = table.num_rows
    share = 1.0 / n if n else 0.0
    batches = 1.0 if batching is None else model_batches(batching)
    columns = {_BUSY: np.full(n, seconds * share), _BATCHES: np.full(n, batches * share)}
    if batching is not None:
        for kind, value in batching_entry(batching).items():
            columns[kind] = np.full(n, value if kind == _BATCH_ROWS else value * share)
    for kind, values in columns.items():
        table = table.append_column(f"{PREFIX}{stage}:{kind}", pa.array(values, pa.float32()))
    if batching is not None:
        text = [encode_counters(counters or {})] + [None] * (n - 1) if n else []
        table = table.append_column(f"{PREFIX}{stage}:{_COUNTERS}", pa.array(text, pa.string()))
    return table


def model_batches(batching: Batching) -> float:
    """The batches a model stage cut a block into: its calls that fitted, less those an
    out-of-memory split added (one per split), at least one. Counted as one a block, the
    report said "10,000 rows a batch on average" of ten calls over 60,000 rows."""
    return float(max(batching.calls - batching.oom_splits, 1))


def batching_entry(batching: Batching) -> dict[str, float]:
    """A model's sizing as totals: counts, and the rows of its next call (0: not known)."""
    return {
        _SPLITS: float(batching.oom_splits),
        _RESIZES: float(batching.resizes),
        _CALLS: float(batching.calls),
        _BATCH_ROWS: float(batching.rows or 0),
        _LOADS: float(batching.loads),
        _LOAD_SECONDS: batching.load_seconds,
    }


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
        if kind == _BATCH_ROWS:  # the latest size a row of the block knows
            sizes = values[values > 0]
            entry[kind] = float(sizes[-1]) if sizes.size else 0.0
        else:
            entry[kind] = float(np.sum(values, dtype=np.float64))
        if kind == _BUSY:
            entry["rows"] = float(table.num_rows)
    return table.drop_columns(carried), totals


def add(into: dict[str, dict[str, float]], totals: Mapping[str, Mapping[str, float]]) -> None:
    """Sum ``totals`` into ``into`` (a batch size: the later one, when known)."""
    for stage, entry in totals.items():
        mine = into.setdefault(stage, {})
        for kind, value in entry.items():
            if kind == _BATCH_ROWS:
                mine[kind] = value or mine.get(kind, 0.0)
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
        splits, resizes, calls = (round(entry.get(kind, 0.0)) for kind in _SIZING)
        size = round(rows) if rows else None
        loads, load_seconds = round(entry.get(_LOADS, 0.0)), entry.get(_LOAD_SECONDS, 0.0)
        stat.add_batching(splits, resizes, calls, size, loads, load_seconds)
        stat.add_counters(counted({stage: entry}).get(stage, {}))
        stats[stage] = stat
    return stats
