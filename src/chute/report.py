"""The progress bar and the final report.

The console and the clock are injected, so tests can check the output exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import pyarrow as pa
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text


@dataclass
class StageStats:
    """Busy time of one stage, summed over its replicas."""

    busy_seconds: float = 0.0
    rows: int = 0
    batches: int = 0
    oom_splits: int = 0
    """Batches a model split in half after running out of memory."""
    batch_rows: int | None = None
    """Rows per batch after those splits (the smallest over the replicas); ``None``: none."""

    def add(self, seconds: float, rows: int, batches: int = 1) -> None:
        self.busy_seconds += seconds
        self.rows += rows
        self.batches += batches

    def add_splits(self, splits: int, batch_rows: int | None) -> None:
        """Count out-of-memory splits, and the replica's rows per batch since."""
        self.oom_splits += splits
        if batch_rows is not None:
            self.batch_rows = min(batch_rows, self.batch_rows or batch_rows)

    @property
    def memory_note(self) -> str | None:
        """``"3 out-of-memory splits, batch now 1,024 rows"``, or ``None`` without splits."""
        if not self.oom_splits:
            return None
        plural = "s" if self.oom_splits != 1 else ""
        return (
            f"{self.oom_splits} out-of-memory split{plural}, "
            f"batch now {self.batch_rows or 0:,} rows"
        )


@dataclass
class Report:
    """What a run did. ``result`` holds the rows only for in-memory runs."""

    fingerprint: str
    engine: str
    engine_reason: str
    output: str | None
    units_total: int
    units_done: int
    units_skipped: int
    rows_in: int
    rows_out: int
    rows_skipped: int
    parts: int
    wall_seconds: float
    stages: dict[str, StageStats] = field(default_factory=dict)
    rows_failed: int = 0
    """Rows a model raised on, written to the errors dataset (quarantine)."""
    units_bad: list[dict[str, str]] = field(default_factory=list)
    """Input units that could not be read and were skipped (on_bad_input: skip)."""
    units_redone: list[str] = field(default_factory=list)
    """Units an earlier run committed whose files were missing or changed: recomputed."""
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Metric values by model (``dataset`` for input-only metrics), then by metric name."""
    plots: list[dict[str, Any]] = field(default_factory=list)
    """Plot specs for the HTML report (curves, calibration, histograms)."""
    timeline: list[tuple[float, int]] = field(default_factory=list)
    """(seconds since the start, rows committed), sampled at commits."""
    complete: bool = True
    result: pa.Table | None = None

    @property
    def rows_per_second(self) -> float:
        return self.rows_out / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("result")
        data["rows_per_second"] = round(self.rows_per_second, 1)
        data["wall_seconds"] = round(self.wall_seconds, 3)
        for stats in data["stages"].values():
            stats["busy_seconds"] = round(stats["busy_seconds"], 3)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        """A report read back from ``report.json``."""
        known = {f.name for f in fields(cls)} - {"result"}
        values = {k: v for k, v in data.items() if k in known}
        values["stages"] = {k: StageStats(**v) for k, v in data.get("stages", {}).items()}
        return cls(**values)

    def render(self) -> Table:
        """The summary as a rich table."""
        table = Table(title="chute report", show_header=False, title_justify="left")
        table.add_column(style="bold")
        table.add_column()
        table.add_row("engine", f"{self.engine} ({self.engine_reason})")
        table.add_row("output", self.output or "(in memory)")
        table.add_row(
            "units",
            f"{self.units_done} run, {self.units_skipped} already done, {self.units_total} in all",
        )
        table.add_row("rows in / out", f"{self.rows_in:,} / {self.rows_out:,}")
        for bad in self.units_bad:
            table.add_row("skipped input", f"{bad['unit']}: {bad['error']}")
        if self.units_redone:
            shown = ", ".join(self.units_redone[:3]) + (", …" if len(self.units_redone) > 3 else "")
            table.add_row(
                "units redone",
                f"{len(self.units_redone)} committed earlier had missing or changed files "
                f"({shown})",
            )
        if self.rows_failed:
            table.add_row("rows failed", f"{self.rows_failed:,} (in the errors dataset, _errors/)")
        if self.rows_skipped:
            table.add_row("rows already done", f"{self.rows_skipped:,}")
        table.add_row("wall time", f"{self.wall_seconds:.2f} s")
        table.add_row("throughput", f"{self.rows_per_second:,.0f} rows/s")
        for name, stats in self.stages.items():
            table.add_row(
                f"busy: {name}", f"{stats.busy_seconds:.2f} s over {stats.batches} batches"
            )
            if stats.memory_note:
                table.add_row(f"model {name}", stats.memory_note)
        for owner, metrics in self.metrics.items():
            for name, values in metrics.items():
                table.add_row(f"{owner}: {name}", _headline(values))
        table.add_row("status", "complete" if self.complete else "INCOMPLETE")
        return table


def memory_notes(report: dict[str, Any]) -> list[tuple[str, str]]:
    """(stage, "3 out-of-memory splits, batch now 1,024 rows") from a ``report.json``."""
    notes = []
    for name, data in (report.get("stages") or {}).items():
        known = {f.name for f in fields(StageStats)}
        note = StageStats(**{k: v for k, v in data.items() if k in known}).memory_note
        if note:
            notes.append((name, note))
    return notes


def _headline(values: dict[str, Any]) -> str:
    """The scalar values of a metric result, briefly."""
    if "groups" in values:  # sliced: the overall values, then the number of groups
        return (
            f"{_headline(values.get('all', {}))} (by {values.get('by')}: "
            f"{len(values['groups'])} groups)"
        )
    shown = [
        f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
        for k, v in values.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    ]
    return ", ".join(shown[:6])


class RateColumn(ProgressColumn):
    """Rows per second, averaged over the run."""

    def render(self, task: Task) -> Text:
        elapsed = task.elapsed or 0.0
        rate = task.completed / elapsed if elapsed > 0 else 0.0
        return Text(f"{rate:,.0f} rows/s", style="progress.data.speed")


class ProgressBar:
    """One bar: rows written out of the total, with rows/s and ETA."""

    def __init__(
        self,
        total: int | None,
        console: Console | None = None,
        clock: Callable[[], float] = time.monotonic,
        enabled: bool = True,
    ) -> None:
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            RateColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            get_time=clock,
            disable=not enabled,
            transient=False,
        )
        self._task = self._progress.add_task("units", total=total)

    def __enter__(self) -> ProgressBar:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def advance(self, rows: int) -> None:
        self._progress.advance(self._task, rows)

    def describe(self, text: str) -> None:
        self._progress.update(self._task, description=text)
