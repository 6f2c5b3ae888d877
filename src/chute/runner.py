"""The driver: plan, skip what is done, hand the plan to an engine, commit what comes back.

The driver sees only :class:`~chute.sinks.PartRecord` rows — never row data, unless the
caller asked for the result in memory.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
from rich.console import Console

import chute.engines as engines
from chute import history
from chute.engines import Engine, EngineOptions
from chute.errors import ChuteError, JobStateError, ModelError, translate
from chute.evaluation import from_text, to_text
from chute.job import JobSpec, fingerprint_of
from chute.lease import Lease
from chute.ledger import Ledger
from chute.metrics import State
from chute.plan import Plan, build_plan
from chute.preflight import check_job
from chute.report import ProgressBar, Report, StageStats
from chute.sinks import PartRecord, read_ipc
from chute.sources import Unit
from chute.stages import KEY
from chute.storage import redact
from chute.tableledger import TableLedger
from chute.tables import Table, TableSink, check_schema, resolve

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
        """(seconds since start, rows written) as parts arrive: the rate over the run."""
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
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def __enter__(self) -> Committer:
        """Flush due ledger batches on a timer too: a unit that completed must not wait
        for the next one to complete before it is committed (object stores batch)."""
        if self.ledger is not None and self.ledger.batch_seconds > 0:
            threading.Thread(target=self._tick, name="chute-commit", daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()

    def _tick(self) -> None:
        assert self.ledger is not None
        while not self._stop.wait(min(0.25, self.ledger.batch_seconds)):
            with self._lock:
                if self._pending and self._due():
                    try:
                        self._flush()
                    except Exception:  # the driver's next commit or final flush retries
                        log.debug("a timed ledger flush failed", exc_info=True)

    def _due(self) -> bool:
        waited, elapsed = time.monotonic() - self._flushed, time.perf_counter() - self._started
        return self.ledger is None or self.ledger.flush_due(waited, elapsed)

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
        if records:
            self.timeline.append((round(time.perf_counter() - self._started, 3), self.write.rows))
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
        with self._lock:
            self._pending.extend(entries)
            if self._due():
                self._flush()
        if self.bar is not None:
            self.bar.describe(f"units {len(self.done)}/{len(self.units)}")

    def flush(self) -> None:
        """Write the completed units to the ledger: only now are they committed."""
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        if self.ledger is not None and self._pending:
            self.ledger.commit(self._pending)  # kept pending if this raises
        self._pending = []
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
        tables = [json.loads(p.table) for p in parts if p.table]
        if tables:  # a table output: the parts' schemas (and Lance fragments) to commit
            entry["table"] = tables
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
    job: JobSpec,
    *,
    progress: bool = False,
    overwrite: bool = False,
    verbose: bool = False,
    limit: int | None = None,
    console: Console | None = None,
) -> Report:
    """Plan and run ``job``; resume from its ledger when the output already holds part of it."""
    started, started_at = time.perf_counter(), time.time()
    if limit is not None:
        job = replace(job, output=None)  # a trial run: rows come back, nothing is written
    plan = build_plan(job, limit=limit)
    name, reason = engines.choose(job)
    engine = engines.create(name, EngineOptions(job.address, verbose))
    engine.prepare(plan)  # GPUs the machine lacks, an unreachable cluster: before any write
    description = job.describe()  # once: it hashes in-memory data and model arguments
    run = _Run(plan, fingerprint_of(description), started, name, reason, started_at)
    check_job(plan, run.fingerprint, description, overwrite=overwrite)  # before any write
    if job.output is None:
        return _execute(run, engine, None, progress, console)
    table = _table(plan, run.fingerprint)
    assert plan.job.output is not None
    with Ledger.claim(plan.job.output.path, plan.job.output.storage) as lease:
        ledger = _open_ledger(run, description, lease, overwrite, table)
        return _execute(run, engine, ledger, progress, console)


@dataclass
class _Run:
    """One run of a plan: what the report says besides the committer's counts."""

    plan: Plan
    fingerprint: str
    started: float
    engine: str
    engine_reason: str
    started_at: float
    redone: list[str] = field(default_factory=list)
    """Committed units whose files were missing or changed, so recomputed."""
    previous: dict[str, Any] | None = None
    """The output's report before this run (its runs are kept)."""

    @property
    def nothing_to_do(self) -> bool:
        """Every unit is committed, verified, and the last run finished the output."""
        done = bool(self.previous and self.previous.get("complete", True))
        return done and not self.plan.pending and not self.redone


def _table(plan: Plan, fingerprint: str) -> Table | None:
    """For a table output: its table, the plan's sink resolved to the table's location,
    and the carried columns checked against the table's (before any compute)."""
    sink = plan.job.output
    if not isinstance(sink, TableSink):
        return None
    sink, table = resolve(sink, fingerprint[:16])
    plan.job = replace(plan.job, output=sink)
    existing = table.schema()
    if existing is not None and plan.schema is not None:
        carried = [plan.schema.field(c) for c in plan.carryover if c in plan.schema.names]
        check_schema(existing, pa.schema(carried), sink.name)
    return table


def _open_ledger(
    run: _Run, description: dict[str, Any], lease: Lease, overwrite: bool, table: Table | None
) -> Ledger:
    """The output's ledger, verified: units whose parts are missing or changed are
    forgotten (and so recomputed), orphans removed; ``plan.pending`` is what is left."""
    plan = run.plan
    output = plan.job.output
    assert output is not None
    args = (run.fingerprint, description, overwrite, len(plan.units))
    if isinstance(output, TableSink) and table is not None:
        ledger: Ledger = TableLedger.open_table(output, table, *args, lease=lease)
    else:
        ledger = Ledger.open(output.path, *args, storage=output.storage, lease=lease)
    run.previous = ledger.report()
    run.redone = ledger.reconcile()
    if run.redone:
        log.warning(
            "%d committed unit(s) had missing or changed files and are recomputed: %s",
            len(run.redone),
            ", ".join(run.redone[:5]),
        )
    plan.pending = [u for u in plan.units if u.id not in ledger.entries]
    if not run.nothing_to_do:
        ledger.unfinish()  # the location is being written again
    return ledger


def _execute(
    run: _Run, engine: Engine, ledger: Ledger | None, progress: bool, console: Console | None
) -> Report:
    """Run the pending units, commit them as they finish, and write the report."""
    plan = run.plan
    bar = ProgressBar(plan.pending_rows, console=console, enabled=progress)
    committer = Committer(plan, ledger, bar)
    if ledger is not None:
        committer.absorb(ledger.entries.values())
    if ledger is not None and run.nothing_to_do:
        return _nothing_to_do(run, committer, ledger, console if progress else None)
    try:
        with bar, committer:
            stages = engine.execute(plan, committer.add) if plan.pending else {}
        committer.flush()
    except ModelError as exc:
        _save_partial(ledger, run, committer, exc)
        raise _located(exc, plan) from exc
    except ChuteError as exc:
        _save_partial(ledger, run, committer, exc)
        raise
    except Exception as exc:  # the one boundary: by type, the same on every engine
        _save_partial(ledger, run, committer, translate(exc))
        raise translate(exc) from exc
    except BaseException as exc:  # Ctrl-C too: what was committed is reported, then resumed
        _save_partial(ledger, run, committer, exc)
        raise
    missing = committer.missing()
    if missing:
        names = ", ".join(u.id for u in missing[:5])
        raise ChuteError(
            f"{len(missing)} unit(s) did not complete ({names}); the ledger holds the rest. "
            "Run the job again to finish them."
        )
    report = _report(run, committer, stages)
    if ledger is not None:
        _finish(ledger, run, report)
    report.result = committer.result()
    return report


def _finish(ledger: Ledger, run: _Run, report: Report) -> None:
    """Verify the result once more, then write the manifest and ``_SUCCESS``."""
    vanished = ledger.reconcile()
    unrecorded = [u.id for u in run.plan.units if u.id not in ledger.entries]
    if unrecorded and not vanished:  # the last guard before _SUCCESS: never a silent loss
        raise ChuteError(
            f"{len(unrecorded)} unit(s) are not in the ledger after the run "
            f"({', '.join(unrecorded[:5])}); nothing is marked finished. Run the job again."
        )
    if vanished:
        report.complete, report.stopped = False, "committed files vanished during the run"
        _save(ledger, run, report)
        raise JobStateError(
            f"{len(vanished)} committed unit(s) lost files during the run "
            f"({', '.join(vanished[:5])}): something else deletes or rewrites files in "
            f"{report.output!r}. Nothing is marked finished; run the job again to redo them."
        )
    _history(ledger, run, report)
    ledger.finish(report.to_dict())  # report.html too: plain SVG, a few milliseconds


def _save_partial(
    ledger: Ledger | None, run: _Run, committer: Committer, exc: BaseException
) -> None:
    """Report what the interrupted run committed and why it stopped (``chute report``
    shows it again)."""
    if ledger is None:
        return
    try:
        committer.flush()  # the parts of these units are in place: keep them
    except Exception as error:
        _warn("could not write the last ledger batch", error)
    report = _report(run, committer, {})
    report.complete, report.stopped = False, _why(exc)
    report.resume = history.resume_command()
    try:
        _save(ledger, run, report)
    except Exception as error:
        _warn("could not write the partial report", error)


def _why(exc: BaseException) -> str:
    """Why a run stopped, in one line: ``interrupted (Ctrl-C)``, ``ModelError: ...``."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _history(ledger: Ledger, run: _Run, report: Report) -> None:
    """Give ``report`` the output's history: earlier runs and this one, the whole
    output's totals and failures (:mod:`chute.history`)."""
    report.ended_at = time.time()
    report.runs = [*history.earlier_runs(run.previous), history.record(report)]
    report.totals = history.totals(ledger.entries.values(), len(run.plan.units))
    report.failures = history.failures(ledger, report.output or "")
    report.html = f"{report.output}/_chute/report.html" if report.output else ""


def _save(ledger: Ledger, run: _Run, report: Report) -> None:
    _history(ledger, run, report)
    ledger.save_report(report.to_dict())


def _nothing_to_do(
    run: _Run, committer: Committer, ledger: Ledger, console: Console | None
) -> Report:
    """A finished job run again: say so and change nothing in the output."""
    report = _report(run, committer, {})
    report.stopped = f"nothing to do: all {len(run.plan.units):,} units already committed"
    previous = run.previous or {}
    report.runs = list(previous.get("runs", []))
    report.totals = history.totals(ledger.entries.values(), len(run.plan.units))
    report.failures = dict(previous.get("failures", {}))
    report.html = str(previous.get("html", ""))
    if console is not None:
        console.print(report.stopped, highlight=False)
    return report


def _warn(what: str, exc: Exception) -> None:
    """A failure met while stopping: a chute error (a full disk) in one line, anything
    else with its traceback."""
    if isinstance(exc, ChuteError):
        log.warning("%s: %s", what, exc)
    else:
        log.warning(what, exc_info=exc)


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


def _report(run: _Run, committer: Committer, stages: dict[str, StageStats]) -> Report:
    plan = run.plan
    skipped = [u for u in plan.units if u not in plan.pending]
    stats = dict(stages)
    stats["write"] = committer.write
    return Report(
        fingerprint=run.fingerprint,
        engine=run.engine,
        engine_reason=run.engine_reason,
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
        wall_seconds=time.perf_counter() - run.started,
        units_redone=run.redone,
        stages=stats,
        started_at=run.started_at,
        ended_at=time.time(),
        job=_header(plan),
        chute_version=history.chute_version(),
    )


def _header(plan: Plan) -> dict[str, Any]:
    """What the report's header says the job is: input, models, output."""
    job = plan.job
    paths = getattr(job.source, "paths", None)
    source = ", ".join(redact(str(p)) for p in paths) if paths else type(job.source).__name__
    return {
        "input": source,
        "models": [m.name for m in job.models],
        "output": redact(job.output.path) if job.output else "(in memory)",
        "units": len(plan.units),
    }
