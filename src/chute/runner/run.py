"""One run, from the job to its report: plan, check, claim the output, verify what is
committed, hand the pending units to an engine, commit, finish."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

import pyarrow as pa
from rich.console import Console

import chute.engines as engines
from chute import history
from chute.engines import Engine, EngineOptions
from chute.errors import ChuteError, JobStateError, ModelError, translate
from chute.job import JobSpec, fingerprint_of
from chute.lease import Lease
from chute.ledger import Ledger
from chute.plan import Plan, build_plan
from chute.preflight import check_job, check_memory
from chute.report import ProgressBar, Report
from chute.runner.committer import Committer
from chute.runner.reporting import Run, report_of
from chute.runner.retype import retype_null_columns
from chute.tableledger import TableLedger
from chute.tables import (
    Table,
    TableSink,
    check_not_null,
    check_schema,
    check_storable,
    resolve,
)

log = logging.getLogger("chute")


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
    check_memory(job)  # more than a local Ray would offer: refused before one is started
    engine.prepare(plan)  # GPUs the machine lacks, an unreachable cluster: before any write
    description = job.describe()  # once: it hashes in-memory data and model arguments
    run = Run(plan, fingerprint_of(description), started, name, reason, started_at)
    check_job(plan, run.fingerprint, description, overwrite=overwrite)  # before any write
    if job.output is None:
        return _execute(run, engine, None, progress, console)
    try:
        table = _table(plan, run.fingerprint)
    except ChuteError:
        raise
    except Exception as exc:  # opening the table: the same boundary as the run's
        raise translate(exc) from exc
    assert plan.job.output is not None
    with Ledger.claim(plan.job.output.path, plan.job.output.storage) as lease:
        ledger = _open_ledger(run, description, lease, overwrite, table)
        if table is None:  # a table's readers see only the files it commits
            plan.fence = lease.fence()
        return _execute(run, engine, ledger, progress, console)


def _table(plan: Plan, fingerprint: str) -> Table | None:
    """For a table output: its table, the plan's sink resolved to the table's location,
    and the carried columns checked against the table's (before any compute)."""
    sink = plan.job.output
    if not isinstance(sink, TableSink):
        return None
    sink, table, existing = resolve(sink, fingerprint[:16])
    plan.job = replace(plan.job, output=sink)
    models = [stage.model.name for stage in plan.stages]

    def writes(name: str) -> bool:
        outputs = (name == m or name.startswith(f"{m}_") for m in models)
        return name in plan.carryover or any(outputs)

    check_not_null(sink, existing, writes)
    check_writable = getattr(table, "check_writable", None)
    if existing is not None and check_writable is not None:
        check_writable()
    if plan.schema is not None:
        carried = [plan.schema.field(c) for c in plan.carryover if c in plan.schema.names]
        check_storable(table, pa.schema(carried), sink.name)
        if existing is not None:
            check_schema(existing, pa.schema(carried), sink.name)
    return table


def _open_ledger(
    run: Run, description: dict[str, Any], lease: Lease, overwrite: bool, table: Table | None
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
    run.finished = ledger.finished()
    run.redone = ledger.reconcile()
    if run.redone:
        log.warning(
            "%d committed unit(s) had missing or changed files and are recomputed: %s",
            len(run.redone),
            ", ".join(run.redone[:5]),
        )
    _only_planned(ledger, plan)
    plan.pending = [u for u in plan.units if u.id not in ledger.entries]
    if not run.nothing_to_do:
        ledger.unfinish()  # the location is being written again
    return ledger


def _only_planned(ledger: Ledger, plan: Plan) -> None:
    """Refuse an output whose ledger commits units this plan does not have: written by a
    job that cut the same input into other units (the fingerprint missed what differs).
    Resumed, its rows and this plan's would both be in the output: some rows twice."""
    planned = {u.id for u in plan.units}
    foreign = sorted(unit for unit in ledger.entries if unit not in planned)
    if foreign:
        raise JobStateError(
            f"the output holds {len(foreign)} committed unit(s) this job does not plan "
            f"({', '.join(foreign[:3])}): it was written by a job that split its input "
            "otherwise. Nothing was written; run with --overwrite to start over, or write "
            "to another output."
        )


def _execute(
    run: Run, engine: Engine, ledger: Ledger | None, progress: bool, console: Console | None
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
        try:
            with bar, committer:
                stages = engine.execute(plan, committer) if plan.pending else {}
        finally:
            run.events = engine.events() if plan.pending else []
            run.events += _again(committer)
        committer.flush()
    except ModelError as exc:
        _save_partial(ledger, run, committer, exc)
        raise _located(exc, plan) from exc
    except ChuteError as exc:
        _save_partial(ledger, run, committer, exc)
        raise
    except (Exception, SystemExit) as exc:  # the one boundary: by type, on every engine
        # (SystemExit: a sys.exit() in code a run calls must not end it "successfully")
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
    report = report_of(run, committer, stages)
    if ledger is not None:
        _finish(ledger, run, report, committer.saw_null)
    report.result, report.result_rows = committer.result()
    return report


def _finish(ledger: Ledger, run: Run, report: Report, saw_null: bool = False) -> None:
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
    sink = run.plan.job.output
    files = not isinstance(sink, TableSink) and sink is not None  # a table holds its own
    strangers = ledger.strangers if files else []  # as reconcile listed them
    if strangers:  # written during the run (preflight refused any before it)
        report.complete, report.stopped = False, "files chute did not write appeared"
        _save(ledger, run, report)
        shown = ", ".join(repr(name) for name in strangers[:5])
        raise JobStateError(
            f"output {report.output!r} gained entries chute did not write during the run: "
            f"{shown}{' …' if len(strangers) > 5 else ''}. A reader of the folder would take "
            "them for results (another job writing inside this output?), so nothing is "
            "marked finished. Move them away, then run the job again: it finishes from its "
            "ledger."
        )
    if files and sink is not None and sink.format == "parquet":
        resumed = len(run.plan.pending) < len(run.plan.units)  # earlier runs' files too
        if saw_null or resumed:
            retype_null_columns(ledger)
    _history(ledger, run, report)
    ledger.finish(report.to_dict())  # report.html too: plain SVG, a few milliseconds


def _save_partial(
    ledger: Ledger | None, run: Run, committer: Committer, exc: BaseException
) -> None:
    """Report what the interrupted run committed and why it stopped (``chute report``
    shows it again)."""
    if ledger is None:
        return
    try:
        committer.flush()  # the parts of these units are in place: keep them
    except Exception as error:
        _warn("could not write the last ledger batch", error)
    report = report_of(run, committer, {})
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


def _history(ledger: Ledger, run: Run, report: Report) -> None:
    """Give ``report`` the output's history: earlier runs and this one, the whole
    output's totals and failures (:mod:`chute.history`)."""
    report.ended_at = time.time()
    report.runs = [*history.earlier_runs(run.previous), history.record(report)]
    report.totals = history.totals(ledger.entries.values(), len(run.plan.units))
    report.failures = history.failures(ledger, report.output or "")
    folder = ledger.meta.removeprefix(f"{ledger.root}/")  # _chute, or a table's job folder
    report.html = f"{report.output}/{folder}/report.html" if report.output else ""


def _save(ledger: Ledger, run: Run, report: Report) -> None:
    _history(ledger, run, report)
    ledger.save_report(report.to_dict())


def _nothing_to_do(
    run: Run, committer: Committer, ledger: Ledger, console: Console | None
) -> Report:
    """A finished job run again: say so and change nothing in the output."""
    report = report_of(run, committer, {})
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


def _located(exc: ModelError, plan: Plan) -> ModelError:
    """The model error with the failing unit named by its source (a file, a row range)."""
    unit = next((u for u in plan.units if u.index == exc.unit), None)
    if unit is None:
        return exc
    return ModelError(f"{exc}\n  unit {unit.index} is {unit.id}", unit=exc.unit, row=exc.row)


def _again(committer: Committer) -> list[str]:
    """The report's line for units computed a second time, if any."""
    if not committer.again:
        return []
    return [
        f"{len(committer.again):,} unit(s) computed again after their rows had arrived (a "
        "retried task, a block made again): the second copies were left out, and removed"
    ]
