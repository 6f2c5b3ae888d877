"""The progress bar and the final report.

The console and the clock are injected, so tests can check the output exactly.
"""

from __future__ import annotations

import html
import io
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import pyarrow as pa
from rich import get_console
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from chute.terminal import PROGRESS_EVERY, Folded, ProgressLines


@dataclass
class StageStats:
    """Busy time of one stage, summed over its replicas."""

    busy_seconds: float = 0.0
    rows: int = 0
    batches: int = 0
    oom_splits: int = 0
    """Model calls split in half after running out of memory."""
    batch_rows: int | None = None
    """The rows of a model's next call at the end (the latest a replica reported);
    ``None``: no model call."""
    resizes: int = 0
    """Changes of batch size a measurement made (``batch_size: auto``, or growing back
    after an out-of-memory split)."""
    calls: int = 0
    """Model calls that fitted (the mean batch is ``rows / calls``)."""
    batch_start: int | None = None
    """The rows the plan started each replica at."""
    batch_auto: bool = False
    """Whether the size was measured and moved (``batch_size: auto``)."""
    loads: int = 0
    """Times its replicas built the model (once each at its start, again after a timeout),
    as reported with their batches."""
    load_seconds: float = 0.0
    """Their seconds, summed: imports, weights, device set-up. Not in ``busy_seconds``."""
    counters: dict[str, float] = field(default_factory=dict)
    """What the stage's model counted (``Adapter.take_counters``), summed: an LLM's
    ``requests``, ``prompt_tokens``, ``generated_tokens``, ``finish/<reason>``,
    ``error/<kind>``."""

    def add(self, seconds: float, rows: int, batches: int = 1) -> None:
        self.busy_seconds += seconds
        self.rows += rows
        self.batches += batches

    def add_counters(self, counters: Mapping[str, float]) -> None:
        add_counters(self.counters, counters)

    def add_batching(
        self,
        splits: int,
        resizes: int,
        calls: int,
        rows: int | None,
        loads: int = 0,
        load_seconds: float = 0.0,
    ) -> None:
        """Count a replica's out-of-memory splits, resizes, model calls and loads, and keep
        the size it reports now (the latest report wins)."""
        self.oom_splits += splits
        self.resizes += resizes
        self.calls += calls
        self.loads += loads
        self.load_seconds += load_seconds
        if rows is not None:
            self.batch_rows = rows

    @property
    def load_note(self) -> str | None:
        """How long the model took to load: ``"loaded in 9.84 s"``, ``"3 loads, 9.80 s
        each on average (29.40 s in all)"``; ``None`` where no replica reported one."""
        if not self.loads:
            return None
        if self.loads == 1:
            return f"loaded in {self.load_seconds:,.2f} s"
        return (
            f"{self.loads:,} loads, {self.load_seconds / self.loads:,.2f} s each on average "
            f"({self.load_seconds:,.2f} s in all)"
        )

    @property
    def notes(self) -> list[str]:
        """What the report says of a model stage: its load time, its batch size."""
        return [note for note in (self.load_note, self.batch_note) if note]

    @property
    def batch_note(self) -> str | None:
        """What a model's batch size settled on: ``"batch settled at 2,048 rows (auto,
        from 1,024: 3 resizes, no out-of-memory split; 1,843 rows a batch on average)"``;
        ``None`` for a fixed size that never changed."""
        if not (self.batch_auto or self.oom_splits or self.resizes) or self.batch_rows is None:
            return None
        splits = _count(self.oom_splits, "out-of-memory split")
        # by batch: the calls counted are whole ones, without quarantine's bisection halves
        mean = f"{self.rows / self.batches:,.0f} rows a batch on average" if self.batches else ""
        if self.batch_auto:
            start = f", from {self.batch_start:,}" if self.batch_start else ""
            return (
                f"batch settled at {self.batch_rows:,} rows (auto{start}: "
                f"{_count(self.resizes, 'resize')}, {splits}; {mean})"
            )
        return (
            f"{splits}, batch now {self.batch_rows:,} rows "
            f"({_count(self.resizes, 'resize')}; {mean})"
        )


def _count(n: int, thing: str) -> str:
    """``"no resize"``, ``"1 resize"``, ``"3 resizes"``."""
    return f"no {thing}" if n == 0 else f"{n:,} {thing}" + ("s" if n != 1 else "")


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
    events: list[str] = field(default_factory=list)
    """What happened to the machines and replicas: nodes lost, a replica added for speed
    that could not load, where the engine's own messages went."""
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Metric values by model (``dataset`` for input-only metrics), then by metric name."""
    plots: list[dict[str, Any]] = field(default_factory=list)
    """Plot specs for the HTML report (curves, calibration, histograms)."""
    timeline: list[tuple[float, int]] = field(default_factory=list)
    """(seconds since the start, rows committed), sampled at commits."""
    complete: bool = True
    started_at: float = 0.0
    """When the run started and ended (seconds since the epoch)."""
    ended_at: float = 0.0
    stopped: str = "complete"
    """Why the run stopped: ``complete``, ``nothing to do: ...``, or the error that ended it."""
    resume: str = ""
    """For a partial run: the command that resumes it."""
    job: dict[str, Any] = field(default_factory=dict)
    """What ran: input, models, output (for the report's header)."""
    chute_version: str = ""
    totals: dict[str, int] = field(default_factory=dict)
    """The output as a whole (every run's committed units): units, rows_in, rows_out,
    rows_failed; empty for in-memory runs."""
    runs: list[dict[str, Any]] = field(default_factory=list)
    """Every run of this output that wrote a report, oldest first (:mod:`chute.history`)."""
    failures: dict[str, Any] = field(default_factory=dict)
    """Failed rows of the whole output by model and exception type, with sample messages."""
    html: str = ""
    """Where ``report.html`` was written, if it was."""
    result: pa.Table | None = None
    result_rows: Any = None
    """Each row of ``result``'s place (a NumPy array): its row in the data given in memory,
    or in its file for files read (numbered from 0 in each file); rows a model failed on
    are not in ``result``."""

    @property
    def rows_per_second(self) -> float:
        return self.rows_out / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("result")
        data.pop("result_rows")
        data["rows_per_second"] = round(self.rows_per_second, 1)
        data["wall_seconds"] = round(self.wall_seconds, 3)
        for stats in data["stages"].values():
            stats["busy_seconds"] = round(stats["busy_seconds"], 3)
            stats["load_seconds"] = round(stats["load_seconds"], 3)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        """A report read back from ``report.json``."""
        known = {f.name for f in fields(cls)} - {"result", "result_rows"}
        values = {k: v for k, v in data.items() if k in known}
        stage_fields = {f.name for f in fields(StageStats)}  # a newer chute's extra keys
        values["stages"] = {
            k: StageStats(**{f: x for f, x in v.items() if f in stage_fields})
            for k, v in data.get("stages", {}).items()
        }
        return cls(**values)

    def render(self, width: int = 100) -> str:
        """The summary as plain text, as ``print(report)`` shows it."""
        console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
        console.print(self.table())
        lines = console.export_text().rstrip().splitlines()
        return "\n".join(line.rstrip() for line in lines) + "\n"

    def __str__(self) -> str:
        return self.render()

    def __rich__(self) -> Table:
        """``console.print(report)``: the summary table."""
        return self.table()

    def _repr_html_(self) -> str:
        """The summary as an HTML table, for Jupyter."""
        cells = "".join(
            f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
            f"<td style='text-align:left'>{html.escape(v)}</td></tr>"
            for k, v in self.rows()
        )
        return f"<table><caption style='text-align:left'>chute report</caption>{cells}</table>"

    def table(self) -> Table:
        """The summary as a rich table."""
        table = Table(title="chute report", show_header=False, title_justify="left")
        table.add_column(style="bold", no_wrap=True)
        table.add_column()
        for name, value in self.rows():
            table.add_row(name, Folded(value))
        return table

    @property
    def metric_errors(self) -> list[str]:
        """The errors of the metrics that could not compute their results (the output
        is finished all the same): ``chute run`` then exits 1."""
        return [
            values["error"]
            for owned in self.metrics.values()
            for values in owned.values()
            if isinstance(values, dict) and isinstance(values.get("error"), str)
        ]

    def rows(self) -> list[tuple[str, str]]:
        """The summary, one (name, value) pair a line."""
        rows = [
            ("engine", f"{self.engine} ({self.engine_reason})"),
            ("output", self.output or "(in memory)"),
            (
                "units",
                f"{self.units_done:,} run, {self.units_skipped:,} already done, "
                f"{self.units_total:,} in all",
            ),
            ("rows in / out", f"{self.rows_in:,} / {self.rows_out:,}"),
        ]
        rows += [("skipped input", f"{bad['unit']}: {bad['error']}") for bad in self.units_bad]
        if self.units_redone:
            shown = ", ".join(self.units_redone[:3]) + (", …" if len(self.units_redone) > 3 else "")
            rows.append(
                (
                    "units redone",
                    f"{len(self.units_redone):,} committed earlier had missing or changed "
                    f"files ({shown})",
                )
            )
        rows += [("events", event) for event in self.events]
        if self.rows_failed:
            where = (self.failures or {}).get("path") or "_errors/"  # a table's: its job's
            kept = f"in the errors dataset, {where}" if self.output else "not in the result"
            rows.append(("rows failed", f"{self.rows_failed:,} ({kept})"))
        if self.totals and (len(self.runs) > 1 or self.units_skipped):
            # what the output holds in all, where earlier runs (a killed one leaves no
            # record of its own) committed part of it: their failed rows too
            runs = (
                f"from {len(self.runs):,} runs"
                if len(self.runs) > 1
                else "with what earlier runs committed"
            )
            rows.append(
                (
                    "output holds",
                    f"{self.totals['rows_out']:,} rows, {self.totals['rows_failed']:,} failed, "
                    f"{runs}",
                )
            )
        if self.rows_skipped:
            rows.append(("rows already done", f"{self.rows_skipped:,}"))
        rows.append(("wall time", f"{self.wall_seconds:,.2f} s"))
        rows.append(("throughput", f"{self.rows_per_second:,.0f} rows/s"))
        for name, stats in self.stages.items():
            rows.append(
                (
                    f"busy: {name}",
                    f"{stats.busy_seconds:,.2f} s over {stats.batches:,} batches "
                    "(summed over its replicas or threads)",
                )
            )
            rows += [(f"model {name}", note) for note in stats.notes]
            rows += [
                (f"{kind}: {name}", text)
                for kind, text in counter_lines(stats.counters, self.wall_seconds)
            ]
        failed = (self.totals or {}).get("rows_failed", self.rows_failed)
        if self.metrics and failed:  # a failed row is in no metric, input-only ones included
            rows.append(("metrics", f"over the rows written: the {failed:,} failed left out"))
        for owner, metrics in self.metrics.items():
            rows += [(f"{owner}: {name}", _headline(values)) for name, values in metrics.items()]
        rows.append(("status", "complete" if self.complete else "INCOMPLETE"))
        if self.stopped not in ("complete", ""):
            rows.append(("stopped", self.stopped))
        if self.resume and not self.complete:
            rows.append(("resume with", self.resume))
        if self.html:
            rows.append(("HTML report", self.html))
        return rows


def add_counters(into: dict[str, float], counters: Mapping[str, float]) -> None:
    """Sum ``counters`` into ``into``."""
    for name, value in counters.items():
        into[name] = into.get(name, 0.0) + value


RATED = ("requests", "prompt_tokens", "generated_tokens")
"""Counters shown with their rate over the run's wall time."""


def counter_lines(counters: Mapping[str, float], seconds: float) -> list[tuple[str, str]]:
    """A model's counters as report lines: ``("tokens", "12 requests (3.1/s), 1,024
    prompt tokens (...), 96 generated tokens (24.6/s)")``, then ``("finish", "stop 10,
    length 2")`` and ``("errors", "prompt_too_long 1")`` for the ``kind/value`` ones."""
    if not counters:
        return []
    plain: list[str] = []
    grouped: dict[str, list[str]] = {}
    for name in sorted(counters, key=lambda n: (RATED.index(n) if n in RATED else 9, n)):
        value = counters[name]
        group, _, key = name.partition("/")
        if key:
            grouped.setdefault(group, []).append(f"{key} {value:,.0f}")
            continue
        rate = f" ({value / seconds:,.1f}/s)" if name in RATED and seconds > 0 else ""
        plain.append(f"{value:,.0f} {name.replace('_', ' ')}{rate}")
    lines = [("counted", ", ".join(plain))] if plain else []
    return lines + [(group, ", ".join(values)) for group, values in grouped.items()]


def progress_note(counters: Mapping[str, float], seconds: float) -> str:
    """The progress line's token figure: ``"1,920 tokens out, 641 tok/s"`` (or ``""``)."""
    generated = counters.get("generated_tokens")
    if generated is None:
        return ""
    rate = generated / seconds if seconds > 0 else 0.0
    return f"{generated:,.0f} tokens out, {rate:,.0f} tok/s"


def model_notes(report: dict[str, Any]) -> list[tuple[str, str]]:
    """(stage, "loaded in 9.84 s"), (stage, "batch settled at 2,048 rows (auto, ...)")
    from a ``report.json``."""
    known = {f.name for f in fields(StageStats)}
    return [
        (name, note)
        for name, data in (report.get("stages") or {}).items()
        for note in StageStats(**{k: v for k, v in data.items() if k in known}).notes
    ]


def _headline(values: dict[str, Any]) -> str:
    """The scalar values of a metric result, briefly."""
    if isinstance(values.get("error"), str):  # its result() raised (Evaluation.results)
        return f"error: {values['error']}"
    if "groups" in values:  # sliced: the overall values, then the number of groups
        return (
            f"{_headline(values.get('all', {}))} (by {values.get('by')}: "
            f"{len(values['groups'])} groups)"
        )
    scalars = [
        (k, v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
    ]
    first = scalars[:6]
    # what a value leaves out is never cut: rows skipped (null or NaN), scores clipped
    warned = [(k, v) for k, v in scalars[6:] if k in CAVEATS and v]
    return ", ".join(
        f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in first + warned
    )


CAVEATS = frozenset({"skipped", "clipped", "not_probabilities", "nan_count"})
"""Metric values that say what a result leaves out or bent: shown whenever not zero."""


class RowsColumn(ProgressColumn):
    """Rows written out of the total, with thousands separators: ``512,000/1,710,629``."""

    def render(self, task: Task) -> Text:
        total = f"{int(task.total):,}" if task.total is not None else "?"
        return Text(f"{int(task.completed):,}/{total}", style="progress.download")


class RateColumn(ProgressColumn):
    """Rows per second, averaged over the run so far; blank once every row is written,
    when the report's throughput is the run's one figure."""

    def render(self, task: Task) -> Text:
        if task.finished:
            return Text("")
        elapsed = task.elapsed or 0.0
        rate = task.completed / elapsed if elapsed > 0 else 0.0
        return Text(f"{rate:,.0f} rows/s", style="progress.data.speed")


class EtaColumn(TimeRemainingColumn):
    """``ETA 0:01:02``, or what the run waits for while it waits (an ETA would be a guess)."""

    def render(self, task: Task) -> Text:
        waiting = str(task.fields.get("waiting") or "")
        if waiting:
            return Text(waiting, style="yellow")
        return Text.assemble("ETA ", super().render(task))


class ProgressBar:
    """One bar: rows written out of the total, with rows/s and ETA. When the console is
    not a terminal (a CI log), a plain line every ``every`` seconds instead."""

    def __init__(
        self,
        total: int | None,
        console: Console | None = None,
        clock: Callable[[], float] = time.monotonic,
        enabled: bool = True,
        every: float = PROGRESS_EVERY,
    ) -> None:
        console = console or get_console()
        self._lines = (
            ProgressLines(total, console, clock, every)
            if enabled and not console.is_terminal
            else None
        )
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=24),
            RowsColumn(),
            RateColumn(),
            TimeElapsedColumn(),
            EtaColumn(),
            console=console,
            get_time=clock,
            disable=not enabled or self._lines is not None,
            transient=False,
        )
        self._task = self._progress.add_task("units", total=total)
        self._ticker = threading.Event()

    def __enter__(self) -> ProgressBar:
        self._progress.start()
        if self._lines is not None:
            self._lines.start()
            threading.Thread(target=self._tick, name="chute-progress", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ticker.set()
        self._progress.stop()
        if self._lines is not None:
            self._lines.finish()

    def _tick(self) -> None:
        """A line every few seconds even while no rows arrive (a slow model)."""
        assert self._lines is not None
        while not self._ticker.wait(0.5):
            self._lines.tick()

    def advance(self, rows: int) -> None:
        self._progress.advance(self._task, rows)
        if self._lines is not None:
            self._lines.advance(rows)

    def describe(self, text: str) -> None:
        self._progress.update(self._task, description=text)
        if self._lines is not None:
            self._lines.describe(text)

    def waiting(self, text: str) -> None:
        """Show ``text`` (``"waiting for resources: …"``) instead of the ETA; ``""`` ends it."""
        self._progress.update(self._task, waiting=text)
        if self._lines is not None:
            self._lines.waiting = text
            self._lines.tick()
