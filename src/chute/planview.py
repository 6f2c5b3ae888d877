"""What ``chute plan`` and ``chute status`` print."""

from __future__ import annotations

import os
from dataclasses import replace

import pyarrow.fs as pafs
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

import chute.engines as engines
from chute.engines import EngineOptions
from chute.engines.resources import StageResources
from chute.errors import ChuteError, JobStateError
from chute.job import JobSpec, Model, fingerprint_of
from chute.ledger import META_DIR, SUCCESS, Ledger
from chute.models import AdapterSpec
from chute.plan import StagePlan, build_plan
from chute.preflight import check_job, check_machine
from chute.report import Report, memory_notes
from chute.sinks import output_filesystem
from chute.storage import StorageOptions, redact
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
    head.add_row(
        "output",
        Folded(f"{redact(job.output.path)} ({job.output.format})" if job.output else "memory"),
    )
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
        notes += [Text(f"{stage.model.name}: {note}") for note in _notes(stage.model, res, job)]
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
        "batch rows": f"{stage.batch_rows:,}" + (" (auto)" if model.batch_size.auto else ""),
        "batch format": stage.batch_format,
        "cpus / gpus": f"{res.cpus:g} / {res.gpus:g} per replica",
        "memory": f"{res.memory / 2**30:.1f} GiB" if res.memory else "-",
        "pool": f"{res.min:,}" if res.min == res.max else f"{res.min:,}–{res.max:,}",
        "timeout": f"{model.timeout:g} s per batch" if model.timeout else "none",
    }


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


def rewrite_report(output: str, storage: StorageOptions | None = None) -> tuple[Report, str]:
    """The last report of ``output`` (complete or partial), with its HTML rewritten."""
    fs, root = output_filesystem(output, storage)
    ledger = Ledger(fs, root)
    data = ledger.report()
    if data is None:
        raise JobStateError(
            f"{output!r} holds no report yet: the run has not committed anything, or it was "
            "killed before it could write one. `chute status` shows what the ledger holds."
        )
    ledger.save_report(data)
    return Report.from_dict(data), f"{ledger.meta}/report.html"


def render_status(output: str, storage: StorageOptions | None = None) -> RenderableType:
    fs, root = output_filesystem(output, storage)
    if fs.get_file_info(f"{root}/{META_DIR}/job.json").type != pafs.FileType.File:
        raise JobStateError(f"{output!r} holds no chute results (no {META_DIR}/job.json).")
    ledger = Ledger(fs, root)
    owner = ledger.read_json("job.json") or {}
    entries = ledger.read_entries()
    report = ledger.report()
    finished = fs.get_file_info(f"{root}/{SUCCESS}").type == pafs.FileType.File
    total = owner.get("units_total")
    table = Table(show_header=False, title=f"chute status: {redact(output)}", title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("job", str(owner.get("fingerprint")))
    table.add_row("units committed", f"{len(entries)}" + (f" of {total}" if total else ""))
    if total:
        table.add_row("units pending", str(total - len(entries)))
    table.add_row("rows committed", f"{sum(e['rows'] for e in entries.values()):,}")
    failed = sum(e.get("errors", 0) for e in entries.values())
    table.add_row("rows failed", f"{failed:,}" + (" (in _errors/)" if failed else ""))
    skipped = [e["unit"] for e in entries.values() if e.get("skipped")]
    table.add_row("inputs skipped", ", ".join(skipped) if skipped else "0")
    table.add_row("finished", "yes" if finished else "no — run the job again to resume")
    parts: list[RenderableType] = [table]
    if report:
        parts.append(
            Text(
                f"last report: {report.get('rows_out', 0):,} rows in "
                f"{report.get('wall_seconds', 0):.2f} s on {report.get('engine')}"
            )
        )
        parts += [Text(f"model {name}: {note}") for name, note in memory_notes(report)]
    return Group(*parts)
