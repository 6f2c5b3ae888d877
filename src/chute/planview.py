"""What ``chute plan`` and ``chute status`` print."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

import chute.engines as engines
from chute.engines import EngineOptions
from chute.engines.resources import StageResources
from chute.errors import ChuteError, ConfigError, JobStateError
from chute.job import JobSpec, Model, describe_changes, fingerprint_of
from chute.lease import live_claims
from chute.ledger import Ledger
from chute.models import Adapter, AdapterSpec
from chute.plan import Plan, StagePlan, build_plan
from chute.preflight import check_job, check_machine
from chute.report import Report, model_notes
from chute.sinks import output_filesystem
from chute.stages import PreprocessStage
from chute.storage import META_DIR, StorageOptions, redact
from chute.tableledger import TableLedger, table_jobs
from chute.tables import JOBS_DIR, TableSink, open_table
from chute.terminal import Folded


def validate_job(job: JobSpec, overwrite: bool = False) -> list[str]:
    """What ``chute validate`` checks, one line each; raises the first problem found."""
    plan = build_plan(job)
    name, reason = engines.choose(job)
    engine = engines.create(name, EngineOptions(job.address))
    description = job.describe()
    rows = plan.total_rows
    lines = [
        f"{len(plan.units):,} unit(s), "
        + (f"{rows:,} rows" if rows is not None else "rows unknown until read")
        + f", {len(plan.stages):,} model(s); columns found in the data",
        f"engine {name} ({reason})",
    ]
    fingerprint = fingerprint_of(description)
    return lines + check_job(plan, fingerprint, description, engine=engine, overwrite=overwrite)


def render_plan(job: JobSpec) -> RenderableType:
    plan = build_plan(job)
    name, reason = engines.choose(job)
    engine = engines.create(name, EngineOptions(job.address))
    resources, basis = engine.stage_resources(plan)
    rows = plan.total_rows
    head = Table(show_header=False, title="chute plan", title_justify="left")
    head.add_column(style="bold", no_wrap=True)
    head.add_column()
    head.add_row("engine", Folded(f"{name} — {reason}"))
    head.add_row(
        "input",
        Folded(
            _source_line(job.source)
            + f": {len(plan.units):,} unit(s), "
            + (f"{rows:,} rows" if rows is not None else "rows unknown until read")
        ),
    )
    head.add_row("columns read", Folded(", ".join(plan.read_columns or []) or "all"))
    head.add_row("carryover", Folded(", ".join(plan.carryover) or "(none)"))
    head.add_row("output", Folded(_output(job)))
    head.add_row("resources for", Folded(basis))
    stages = Table(title="model stages", title_justify="left", show_header=False)
    stages.add_column(style="bold", no_wrap=True)
    for _ in plan.stages:
        stages.add_column()
    cells: dict[str, list[RenderableType]] = {}
    notes: list[RenderableType] = []
    for stage, res in zip(plan.stages, resources, strict=True):
        for key, value in _stage_cells(stage, res).items():
            cells.setdefault(key, []).append(value)
        notes.append(Text(f"{stage.model.name}: batch: {stage.batch_note}"))
        notes += [Text(f"{stage.model.name}: {note}") for note in _notes(stage.model, res, job)]
        notes += [Text(f"{stage.model.name}: {note}") for note in sample_notes(plan, stage)]
    for key, values in cells.items():
        stages.add_row(key, *values)
    return Group(head, stages, *notes)


def _stage_cells(stage: StagePlan, res: StageResources) -> dict[str, RenderableType]:
    """One model stage, by row of the stages table (a column per model)."""
    model = stage.model
    return {
        "model": Text(model.name, style="bold"),
        "runs": Folded(runs(model.fn)),
        "inputs": Folded(", ".join(stage.inputs)),
        "batch rows": f"{stage.batch_rows:,}" + (" to start (auto)" if stage.adaptive else ""),
        "batch format": stage.batch_format,
        "cpus / gpus": f"{res.cpus:g} / {res.gpus:g} per replica",
        "threads": f"{res.threads} per replica",
        "memory": f"{res.memory / 2**30:.1f} GiB" if res.memory else "-",
        "pool": _pool(res),
        "timeout": f"{model.timeout:g} s per batch" if model.timeout else "none",
    }


def _pool(res: StageResources) -> str:
    if res.fused:
        return "in the read tasks"
    return res.replicas


def _notes(model: Model, res: StageResources, job: JobSpec) -> list[str]:
    """Why a pool is smaller than asked, what the engine scaled, what will not fit."""
    notes = [res.note] if res.note else []
    asked = model.pool.max
    if asked is not None and res.max < asked:
        cpus = model.resources.cpus or 1.0
        cores = os.cpu_count() or 1
        if model.resources.gpus > 0 and res.max < cores // cpus:
            why = f"each replica takes {model.resources.gpus:g} GPU(s)"
        else:
            why = f"this machine has {cores:,} CPU(s) and each replica takes {cpus:g}"
        notes.append(
            f"pool capped at {res.max:,} of the {model.pool.min:,}–{asked:,} asked: {why} "
            "(resources.cpus)."
        )
    try:
        check_machine(replace(job, models=(model,)))
    except ChuteError as exc:
        notes.append(f"will not run: {exc}")
    return notes


SAMPLE_ROWS = 256
"""Rows of the first unit an adapter's plan notes see (an LLM's prompt tokens)."""


def sample_notes(plan: Plan, stage: StagePlan) -> list[str]:
    """What a built-in adapter says from a sample of its input (``Adapter.plan_notes``):
    the first rows of the first unit, preprocessed as the run would."""
    spec = stage.model.fn
    if not isinstance(spec, AdapterSpec):
        return []
    cls = spec.load_class(check=False)
    if cls.plan_notes.__func__ is Adapter.plan_notes.__func__:
        return []  # reads nothing for an adapter that has nothing to say
    unit = next((u for u in plan.units if not u.error), None)
    if unit is None:
        return []
    batch = next(iter(plan.reader(unit)), None)
    if batch is None:
        return []
    sample = batch.slice(0, SAMPLE_ROWS)
    pre = plan.preprocess
    if pre is not None:
        sample = PreprocessStage(pre.spec, pre.inputs, pre.protected)(sample)
    inputs = [c for c in stage.inputs if c in sample.column_names]
    return cls.plan_notes(spec.options, sample.select(inputs), plan.total_rows)


def _source_line(source: object) -> str:
    """``parquet: data/taxi`` or ``memory``: what the input is, briefly."""
    paths = getattr(source, "paths", None)
    if isinstance(paths, list) and paths:
        where = redact(str(paths[0])) + (f" (+{len(paths) - 1} more)" if len(paths) > 1 else "")
        return f"{getattr(source, 'format', None) or 'files'} at {where}"
    return "in-memory data"


def runs(fn: object) -> str:
    """What a model stage runs: a built-in adapter and its artifact, or the code's name."""
    if isinstance(fn, AdapterSpec):
        path = fn.options.get("path")
        return f"{fn.kind}: {os.path.basename(str(path))}" if path else fn.kind
    if isinstance(fn, str):
        return fn if len(fn) <= 60 else "…" + fn[-59:]
    target = fn if isinstance(fn, type) or hasattr(fn, "__qualname__") else type(fn)
    return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', '?')}"


def _output(job: JobSpec) -> str:
    """``out (parquet) · files of about 128 MiB``: where, the format and the file target."""
    sink = job.output
    if sink is None:
        return "memory"
    where = f"{redact(sink.path)} ({sink.format})"
    if isinstance(sink, TableSink):
        return where  # a table keeps a data file per part
    return f"{where} · files of about {sink.target.describe()}"


def output_of(job: JobSpec) -> tuple[str, StorageOptions | None, str | None]:
    """Where a job's results are, how to reach them, and for a table output, which job
    folder in it is this job's (the fingerprint's first 16 digits)."""
    sink = job.output
    assert sink is not None  # a job file always names its output
    if not isinstance(sink, TableSink):
        return sink.path, sink.storage, None
    return open_table(sink).location, sink.storage, fingerprint_of(job.describe())[:16]


def output_ledgers(
    output: str, storage: StorageOptions | None = None, job: str | None = None
) -> list[Ledger]:
    """The ledgers an output location holds, read only: a directory's own, or a table's,
    one per job, the most recently started first (only ``job``'s, by a fingerprint prefix);
    none when it holds no chute results."""
    fs, root = output_filesystem(output, storage)
    if fs.get_file_info(f"{root}/{META_DIR}/job.json").is_file:
        return [Ledger(fs, root)]
    jobs = table_jobs(fs, root)
    if not jobs:
        return []
    prefix = (job or "")[:16]
    chosen = [j for j in jobs if j.job.startswith(prefix)]
    if not chosen:
        raise JobStateError(
            f"{redact(output)!r} holds no results of job {prefix!r} (it holds jobs "
            f"{', '.join(j.job for j in jobs)}). Run the job first, or give one of those."
        )
    return list(chosen)


def rewrite_report(
    output: str,
    storage: StorageOptions | None = None,
    job: str | None = None,
    expected: dict[str, Any] | None = None,
) -> tuple[Report, str]:
    """The last report of ``output`` (complete or partial), with its HTML rewritten; of a
    table, the report of its most recently started job (or of ``job``). Where the ledger
    has moved on since (a run killed before its report, an ``--overwrite`` that stopped),
    or the output holds another job than ``expected`` (a job file's description), the
    report says so among its events, not as if it were current."""
    ledgers = output_ledgers(output, storage, job)
    data = ledgers[0].report() if ledgers else None
    if not ledgers or data is None:
        raise JobStateError(
            f"{redact(output)!r} holds no report yet: the run has not committed anything, or "
            "it was killed before it could write one. `chute status` shows what the ledger "
            "holds."
        )
    events = [e for e in data.get("events") or [] if not str(e).startswith(LATER)]
    running = live_claims(ledgers[0].fs, ledgers[0].meta)
    if running:  # its ledger moves as we look, and its report is its own to write
        notes = [f"a run is writing this output now ({running[0].describe()}): this is the "
                 "report of the run before it"]  # fmt: skip
    else:
        owner = ledgers[0].read_json("job.json") or {}
        notes = _later(ledgers[0], data, _entries(ledgers[0])) + _other_job(owner, expected)
    data = {**data, "events": events + [f"{LATER}{note}" for note in notes]}
    html = f"{ledgers[0].meta}/report.html"
    if not running:
        try:
            ledgers[0].save_report(data)
        except ConfigError:  # an output this user may read but not write: shown all the same
            kept = (
                "this user cannot write to the output: report.json and report.html are as "
                "the run left them"
            )
            data["events"] = [*data["events"], f"{LATER}{kept}"]
    return Report.from_dict(data), html


LATER = "since this report: "
"""How ``chute report`` begins what it adds to an old report's events."""


def _entries(ledger: Ledger) -> dict[str, dict[str, Any]]:
    """The units committed to ``ledger`` (a table's: those its table confirms)."""
    return ledger.committed()[0] if isinstance(ledger, TableLedger) else ledger.read_entries()


def _later(ledger: Ledger, report: dict[str, Any], entries: dict[str, dict[str, Any]]) -> list[str]:
    """What the ledger says that the last report does not: units a later run committed
    (it was killed before its report), or the finished mark gone (a later run, an
    ``--overwrite`` say, began and stopped)."""
    reported = (report.get("totals") or {}).get("units")
    notes = []
    if isinstance(reported, int) and len(entries) != reported:
        notes.append(
            f"the ledger holds {len(entries):,} committed units against this report's "
            f"{reported:,}: a later run committed and stopped before it could report. "
            "`chute status` counts from the ledger; running the job again finishes it."
        )
    if report.get("complete") and not ledger.finished():
        notes.append(
            "the output is no longer marked finished: a later run (an --overwrite, or another "
            "run of the job) began and stopped. Run that job again to finish it."
        )
    return notes


def _other_job(owner: dict[str, Any], expected: dict[str, Any] | None) -> list[str]:
    """Whether the output holds another job than the job file describes (``owner``: its
    ``job.json``; ``chute run`` would refuse it, exit 5)."""
    if expected is None or owner.get("fingerprint") in (None, fingerprint_of(expected)):
        return []
    changes = describe_changes(owner.get("job") or {}, expected)
    return [
        f"this output holds another job's results than the job file's (changed: {changes}): "
        "`chute run` refuses it; --overwrite replaces them."
    ]


def render_status(
    output: str,
    storage: StorageOptions | None = None,
    job: str | None = None,
    expected: dict[str, Any] | None = None,
) -> RenderableType:
    """What an output location holds; for a table, each of its jobs (or ``job``). With
    ``expected`` (a job file's description), whether it is that job's."""
    ledgers = output_ledgers(output, storage, job)
    if not ledgers:
        raise JobStateError(
            f"{redact(output)!r} holds no chute results (neither {META_DIR}/job.json nor a "
            f"table's {META_DIR}/{JOBS_DIR}/)."
        )
    parts = [_job_status(output, ledger, expected) for ledger in ledgers]
    return Group(*parts)


def _job_status(
    output: str, ledger: Ledger, expected: dict[str, Any] | None = None
) -> RenderableType:
    owner = ledger.read_json("job.json") or {}
    waiting, finished = 0, "yes" if ledger.finished() else "no — run the job again to resume"
    running = live_claims(ledger.fs, ledger.meta)
    if running:
        finished = f"no — a run is writing it now: {running[0].describe()}"
    title = f"chute status: {redact(output)}"
    if isinstance(ledger, TableLedger):
        entries, waiting = ledger.committed()
        title += f" (table), job {ledger.job}"
        if finished != "yes" and ledger.abandoned():
            finished = "no — left unfinished: a later run was told --overwrite"
    else:
        entries = ledger.read_entries()
    total = owner.get("units_total")
    table = Table(show_header=False, title=title, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("job", str(owner.get("fingerprint")))
    for note in _other_job(owner, expected):
        table.add_row("job file", note)
    table.add_row("units committed", f"{len(entries)}" + (f" of {total}" if total else ""))
    if total:
        table.add_row("units pending", str(total - len(entries)))
    if waiting:
        table.add_row("units unresolved", f"{waiting} (staged; the next run asks the table)")
    table.add_row("rows committed", f"{sum(e['rows'] for e in entries.values()):,}")
    failed = sum(e.get("errors", 0) for e in entries.values())
    errors = "errors/ of the job's folder" if isinstance(ledger, TableLedger) else "_errors/"
    table.add_row("rows failed", f"{failed:,}" + (f" (in {errors})" if failed else ""))
    skipped = [e["unit"] for e in entries.values() if e.get("skipped")]
    table.add_row("inputs skipped", ", ".join(skipped) if skipped else "0")
    table.add_row("finished", finished)
    parts: list[RenderableType] = [table]
    report = ledger.report()
    if report:
        parts.append(
            Text(
                f"last report: {report.get('rows_out', 0):,} rows in "
                f"{report.get('wall_seconds', 0):.2f} s on {report.get('engine')}"
            )
        )
        parts += [Text(f"model {name}: {note}") for name, note in model_notes(report)]
        parts += _table_lines(report.get("table"))
        if not running:
            parts += [Text(f"{LATER}{note}") for note in _later(ledger, report, entries)]
    return Group(*parts)


def _table_lines(table: dict[str, Any] | None) -> list[RenderableType]:
    """What the last report says about the table: its commits, version, vector index."""
    if not table:
        return []
    version = table.get("snapshot") or table.get("version")
    line = f"{table.get('format')} table: the last run made {table.get('commits', 0)} commit(s)"
    line += f", ending at {'snapshot' if 'snapshot' in table else 'version'} {version}"
    index = table.get("index")
    if index:
        line += f"; {index.get('type')} index on {index.get('column')} ({index.get('metric')})"
    return [Text(line)]
