"""The driver: plan, skip what is done, hand the plan to an engine, commit what comes back.

The driver sees only :class:`~chute.sinks.PartRecord` rows — never row data, unless the
caller asked for the result in memory.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa
from rich.console import Console

from chute.errors import ChuteError, ModelError
from chute.evaluation import from_text, to_text
from chute.job import Job, fingerprint_of
from chute.ledger import Ledger
from chute.metrics import State
from chute.plan import Plan, build_plan
from chute.report import ProgressBar, Report, StageStats
from chute.sinks import PartRecord, read_ipc
from chute.sources import Unit
from chute.stages import KEY
from chute.storage import redact

log = logging.getLogger("chute")


class Committer:
    """Collects part records and commits each unit once its parts cover all of its rows."""

    def __init__(self, plan: Plan, ledger: Ledger | None, bar: ProgressBar | None) -> None:
        self.plan = plan
        self.ledger = ledger
        self.bar = bar
        self.units: dict[int, Unit] = {u.index: u for u in plan.pending}
        self._parts: dict[int, list[PartRecord]] = defaultdict(list)
        self._totals: dict[int, int] = {}
        self.done: set[int] = set()
        self.rows_in = 0
        self.rows_out = 0
        self.rows_failed = 0
        self.skipped: list[dict[str, str]] = []
        self._started = time.perf_counter()
        self.timeline: list[tuple[float, int]] = [(0.0, 0)]
        """(seconds since start, rows committed) after each commit: throughput over the run."""
        self.parts = 0
        self.write = StageStats()
        self.evaluation = plan.evaluation
        self.metric_states: dict[str, State] = {}
        """The job's merged metric states (committed units only): size independent of rows."""
        self._unit_states: dict[int, dict[str, State]] = defaultdict(dict)
        self._tables: list[tuple[int, int, pa.Table]] = []
        self._pending: list[dict[str, Any]] = []
        """Completed units not yet in the ledger (object stores write them in batches)."""
        self._flushed = time.monotonic()

    def add(self, records: Sequence[PartRecord]) -> None:
        """Take records from the writers; commit the units they complete."""
        completed: list[int] = []
        for record in records:
            if record.unit in self.done or record.unit not in self.units:
                continue  # a duplicate from a retried task: its part is an orphan
            if any(p.start == record.start for p in self._parts[record.unit]):
                continue  # these rows were already written by another attempt: an orphan
            self._parts[record.unit].append(record)
            if record.unit_rows >= 0:
                self._totals[record.unit] = record.unit_rows
            self.parts += 1
            if record.metrics:
                self.evaluation.merge(self._unit_states[record.unit], [record.metrics])
            self.write.add(record.seconds, record.end - record.start)
            if record.data:
                self._tables.append((record.unit, record.start, read_ipc(record.data)))
            if self.bar is not None:
                self.bar.advance(record.end - record.start)
            if self._complete(record.unit):
                completed.append(record.unit)
        self._commit(completed)

    def _complete(self, index: int) -> bool:
        total = self._totals.get(index)
        if total is None:
            return False
        spans = sorted((p.start, p.end) for p in self._parts[index])
        reached = 0
        for start, end in spans:
            if start != reached:
                return False
            reached = end
        return reached == total

    def _commit(self, indexes: list[int]) -> None:
        if not indexes:
            return
        entries = [self._entry(index, self._parts.pop(index)) for index in indexes]
        self.timeline.append((round(time.perf_counter() - self._started, 3), self.rows_in))
        self._pending.extend(entries)
        waited, elapsed = time.monotonic() - self._flushed, time.perf_counter() - self._started
        if self.ledger is None or self.ledger.flush_due(waited, elapsed):
            self.flush()
        if self.bar is not None:
            self.bar.describe(f"units {len(self.done)}/{len(self.units)}")

    def flush(self) -> None:
        """Write the completed units to the ledger: only now are they committed."""
        pending, self._pending = self._pending, []
        if self.ledger is not None and pending:
            self.ledger.commit(pending)
        self._flushed = time.monotonic()

    def _entry(self, index: int, parts: list[PartRecord]) -> dict[str, Any]:
        """Count a complete unit and describe it for the ledger."""
        unit = self.units[index]
        skipped = next((p.skipped for p in parts if p.skipped), "")
        rows = 0 if skipped else self._totals[index]
        failed = sum(p.error_rows for p in parts)
        self.done.add(index)
        self.rows_in += rows
        self.rows_out += rows - failed
        self.rows_failed += failed
        entry: dict[str, Any] = {
            "unit": unit.id,
            "index": index,
            "rows": rows,
            "errors": failed,
            "parts": [f for p in parts for f in (p.path, p.errors_path) if f],
            "files": [
                [path, rows, size]
                for p in parts
                for path, rows, size in (
                    (p.path, p.end - p.start - p.error_rows, p.nbytes),
                    (p.errors_path, p.error_rows, p.errors_nbytes),
                )
                if path
            ],
        }
        states = self._unit_states.pop(index, {})
        if states:
            entry["metrics"] = to_text(states)
            self.evaluation.merge(self.metric_states, [states])
        if skipped:
            entry["skipped"] = skipped
            self.skipped.append({"unit": unit.id, "error": skipped})
        return entry

    def absorb(self, entries: Iterable[dict[str, Any]]) -> None:
        """Merge the metric states of units committed by earlier runs (a resume)."""
        self.evaluation.merge(
            self.metric_states, [from_text(e.get("metrics", "")) for e in entries]
        )

    def missing(self) -> list[Unit]:
        return [u for i, u in self.units.items() if i not in self.done]

    def result(self) -> pa.Table | None:
        """In-memory rows in input order (only for runs without an output location)."""
        if not self._tables:
            return None
        ordered = sorted(self._tables, key=lambda t: (t[0], t[1]))
        return pa.concat_tables([t for _, _, t in ordered]).drop_columns([KEY])


def run_job(
    job: Job,
    *,
    progress: bool = False,
    overwrite: bool = False,
    verbose: bool = False,
    limit: int | None = None,
    console: Console | None = None,
) -> Report:
    """Plan and run ``job``; resume from its ledger when the output already holds part of it."""
    started = time.perf_counter()
    if limit is not None:
        job = replace(job, output=None)  # a trial run: rows come back, nothing is written
    plan = build_plan(job, limit=limit)
    engine = _engine(plan, verbose)
    engine.prepare(plan)  # GPUs the machine lacks, an unreachable cluster: before any write
    ledger = None
    description = job.describe()  # once: it hashes in-memory data and model arguments
    fingerprint = fingerprint_of(description)
    if job.output is not None:
        ledger = Ledger.open(
            job.output.path,
            fingerprint,
            description,
            overwrite,
            len(plan.units),
            storage=job.output.storage,
        )
        done = ledger.entries
        plan.pending = [u for u in plan.units if u.id not in done]
        ledger.remove_orphans()
        ledger.unfinish()
    bar = ProgressBar(plan.pending_rows, console=console, enabled=progress)
    committer = Committer(plan, ledger, bar)
    if ledger is not None:
        committer.absorb(ledger.entries.values())
    try:
        with bar:
            stages = engine.execute(plan, committer.add) if plan.pending else {}
        committer.flush()
    except ModelError as exc:
        _save_partial(ledger, plan, committer, started, fingerprint)
        raise _located(exc, plan) from exc
    except BaseException:  # Ctrl-C too: what was committed is reported, then resumed
        _save_partial(ledger, plan, committer, started, fingerprint)
        raise
    missing = committer.missing()
    if missing:
        names = ", ".join(u.id for u in missing[:5])
        raise ChuteError(
            f"{len(missing)} unit(s) did not complete ({names}); the ledger holds the rest. "
            "Run the job again to finish them."
        )
    report = _report(plan, committer, stages, time.perf_counter() - started, fingerprint)
    if ledger is not None:
        ledger.remove_orphans()
        # The HTML (matplotlib: ~0.7 s) comes with runs that have metrics to plot;
        # `chute report OUTPUT` writes it for any run.
        ledger.finish(report.to_dict(), html=bool(plan.evaluation))
    report.result = committer.result()
    return report


def _save_partial(
    ledger: Ledger | None, plan: Plan, committer: Committer, started: float, fingerprint: str
) -> None:
    """Report what the interrupted run committed (``chute report`` shows it again)."""
    if ledger is None:
        return
    try:
        committer.flush()  # the parts of these units are in place: keep them
    except Exception:
        log.warning("could not write the last ledger batch", exc_info=True)
    report = _report(plan, committer, {}, time.perf_counter() - started, fingerprint)
    report.complete = False
    try:
        ledger.save_report(report.to_dict(), html=bool(plan.evaluation))
    except Exception:
        log.warning("could not write the partial report", exc_info=True)


def _thin(points: list[tuple[float, int]], most: int = 200) -> list[tuple[float, int]]:
    """At most ``most`` points, evenly picked, always keeping the last."""
    if len(points) <= most:
        return points
    step = len(points) / most
    return [points[int(i * step)] for i in range(most - 1)] + [points[-1]]


def _located(exc: ModelError, plan: Plan) -> ModelError:
    """The model error with the failing unit named by its source (a file, a row range)."""
    unit = next((u for u in plan.units if u.index == exc.unit), None)
    if unit is None:
        return exc
    return ModelError(f"{exc}\n  unit {unit.index} is {unit.id}", unit=exc.unit, row=exc.row)


def _engine(plan: Plan, verbose: bool) -> Any:
    if plan.engine == "ray":
        from chute.engines.ray import RayEngine

        return RayEngine(address=plan.job.address, verbose=verbose)
    from chute.engines.local import LocalEngine

    return LocalEngine()


def _report(
    plan: Plan,
    committer: Committer,
    stages: dict[str, StageStats],
    wall: float,
    fingerprint: str,
) -> Report:
    skipped = [u for u in plan.units if u not in plan.pending]
    stats = dict(stages)
    stats["write"] = committer.write
    return Report(
        fingerprint=fingerprint,
        engine=plan.engine,
        engine_reason=plan.engine_reason,
        output=redact(plan.job.output.path) if plan.job.output else None,
        units_total=len(plan.units),
        units_done=len(committer.done),
        units_skipped=len(skipped),
        rows_in=committer.rows_in,
        rows_out=committer.rows_out,
        rows_failed=committer.rows_failed,
        units_bad=committer.skipped,
        timeline=_thin(committer.timeline),
        metrics=committer.evaluation.results(committer.metric_states),
        plots=committer.evaluation.plots(committer.metric_states),
        rows_skipped=sum(u.rows or 0 for u in skipped),
        parts=committer.parts,
        wall_seconds=wall,
        stages=stats,
    )
