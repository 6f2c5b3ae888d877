"""An output's history: every run's record, the output as a whole, and its failures.

A run never erases what earlier runs of the same job wrote about the output. ``report.json``
keeps a list ``runs``, one record per run that got as far as writing a report (finished,
failed, interrupted), oldest first; each new run reads that list back and appends its own.
A run killed outright (SIGKILL, a lost machine) writes no report, so it has no record; the
units it committed are still counted in ``totals``, which come from the ledger.

``totals`` and ``failures`` describe the output as a whole (every committed unit, whichever
run committed it). ``failures`` is read from the errors dataset (``_errors/``): its rows
are counted by model and exception type with three sample messages each. That read costs
time and memory in proportion to the failed rows, never to the output.
"""

from __future__ import annotations

import functools
import importlib.metadata
import io
import os
import shlex
import sys
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from chute.ledger import Ledger
from chute.report import Report
from chute.storage import read

SAMPLES = 3
"""Sample messages kept per (model, exception type)."""
ERROR_COLUMNS = ("model", "error_type", "error_message")


def record(report: Report) -> dict[str, Any]:
    """This run's own record: when, on what, what it did and why it stopped."""
    return {
        "started_at": report.started_at,
        "ended_at": report.ended_at,
        "engine": report.engine,
        "units_run": report.units_done,
        "rows": report.rows_in,
        "rows_failed": report.rows_failed,
        "wall_seconds": round(report.wall_seconds, 3),
        "stages": {name: round(s.busy_seconds, 3) for name, s in report.stages.items()},
        "stopped": report.stopped,
        "timeline": [list(point) for point in report.timeline],
    }


def earlier_runs(previous: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The runs an earlier ``report.json`` lists (a report from before there were run
    records counts as one run, as far as it says)."""
    if not previous:
        return []
    if "runs" in previous:
        return list(previous["runs"])
    old = Report.from_dict(previous)
    old.stopped = "complete" if old.complete else "stopped"
    return [record(old)]


def totals(entries: Iterable[dict[str, Any]], units_total: int) -> dict[str, int]:
    """The output as a whole, from the ledger: units and rows committed by every run."""
    units = rows = failed = 0
    for entry in entries:
        units += 1
        rows += int(entry.get("rows") or 0)
        failed += int(entry.get("errors") or 0)
    return {
        "units": units,
        "units_total": units_total,
        "rows_in": rows,
        "rows_out": rows - failed,
        "rows_failed": failed,
    }


def failures(ledger: Ledger, output: str) -> dict[str, Any]:
    """Failed rows of the whole output, by model and exception type, with samples."""
    paths = [
        path
        for entry in ledger.entries.values()
        for path in entry.get("parts", [])
        if path.startswith(f"{ledger.errors_dir}/")
    ]
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(paths):
        table = _read_errors(ledger, path)
        if table is not None:
            _count(groups, table)
    ordered = sorted(groups.values(), key=lambda g: (-g["rows"], g["model"], g["error_type"]))
    return {
        "rows": sum(g["rows"] for g in ordered),
        "path": f"{output.rstrip('/')}/{ledger.errors_dir}/",
        "groups": ordered,
    }


def _read_errors(ledger: Ledger, path: str) -> pa.Table | None:
    """The error columns of one errors part (Parquet, CSV or JSON Lines)."""
    data = read(ledger.fs, f"{ledger.root}/{path}")
    if data is None:
        return None
    if path.endswith(".parquet"):
        table = pq.read_table(pa.BufferReader(data), columns=list(ERROR_COLUMNS))
    elif path.endswith(".csv"):
        table = pacsv.read_csv(io.BytesIO(data))
    else:
        table = pajson.read_json(io.BytesIO(data))
    if not set(ERROR_COLUMNS) <= set(table.column_names):
        return None
    return table.select(list(ERROR_COLUMNS))


def _count(groups: dict[tuple[str, str], dict[str, Any]], table: pa.Table) -> None:
    counts = table.group_by(["model", "error_type"]).aggregate([([], "count_all")])
    for row in counts.to_pylist():
        key = (str(row["model"]), str(row["error_type"]))
        group = groups.setdefault(
            key, {"model": key[0], "error_type": key[1], "rows": 0, "samples": []}
        )
        group["rows"] += row["count_all"]
        if len(group["samples"]) < SAMPLES:
            _sample(group, table)


def _sample(group: dict[str, Any], table: pa.Table) -> None:
    """Add distinct messages of this group's rows, up to :data:`SAMPLES`."""
    mine = pc.and_(
        pc.equal(table["model"], group["model"]), pc.equal(table["error_type"], group["error_type"])
    )
    for message in table.filter(mine).column("error_message").slice(0, 64).to_pylist():
        if len(group["samples"]) >= SAMPLES:
            return
        if str(message) not in group["samples"]:
            group["samples"].append(str(message))


def resume_command() -> str:
    """The command that resumes this job: the same command line when it came from the
    ``chute`` CLI (less ``--overwrite``, which would start over), else a Python hint."""
    program = os.path.basename(sys.argv[0]) if sys.argv else ""
    if program in ("chute", "__main__.py") and len(sys.argv) > 1:
        args = [a for a in sys.argv[1:] if a != "--overwrite"]
        return shlex.join(["chute", *args])
    return "run the same job again (job.run(), or chute run JOB_FILE): committed units are kept"


@functools.cache
def chute_version() -> str:
    """The installed chute's version (``unknown`` when run from a bare source tree); read
    once per process (a metadata lookup walks ``sys.path``: milliseconds a run)."""
    try:
        return importlib.metadata.version("chute")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
