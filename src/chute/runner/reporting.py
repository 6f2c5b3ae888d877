"""What a run says about itself: :class:`Run` (the facts besides the committer's counts)
and the :class:`~chute.report.Report` built from both."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from chute import history
from chute.plan import Plan
from chute.report import Report, StageStats
from chute.runner.committer import Committer
from chute.storage import redact


@dataclass
class Run:
    """One run of a plan: what the report says besides the committer's counts."""

    plan: Plan
    fingerprint: str
    started: float
    engine: str
    engine_reason: str
    started_at: float
    redone: list[str] = field(default_factory=list)
    """Committed units whose files were missing or changed, so recomputed."""
    finished: bool = False
    """The output's success marker was there when the run began."""
    previous: dict[str, Any] | None = None
    """The output's report before this run (its runs are kept)."""
    events: list[str] = field(default_factory=list)
    """What the engine saw happen to the machines (:meth:`Engine.events`)."""

    @property
    def nothing_to_do(self) -> bool:
        """Every unit is committed, verified, and the last run finished the output."""
        done = self.finished and bool(self.previous and self.previous.get("complete", True))
        return done and not self.plan.pending and not self.redone


def thin(points: list[tuple[float, int]], most: int = 200) -> list[tuple[float, int]]:
    """At most ``most`` points, evenly picked, always keeping the last."""
    if len(points) <= most:
        return points
    step = len(points) / most
    return [points[int(i * step)] for i in range(most - 1)] + [points[-1]]


def report_of(run: Run, committer: Committer, stages: dict[str, StageStats]) -> Report:
    plan = run.plan
    pending = {u.index for u in plan.pending}  # a set: a list made this O(units²)
    skipped = [u for u in plan.units if u.index not in pending]
    stats = dict(stages)
    for stage in plan.stages:  # what the sizes started at, and whether they could move
        stat = stats.get(stage.model.name)
        if stat is not None:
            stat.batch_start, stat.batch_auto = stage.batch_rows, stage.adaptive
    stats["write"] = committer.write
    # What earlier runs committed, as their ledger says (not as planned: a unit an earlier
    # run left out as unreadable holds no rows, and its input is still to be named).
    earlier = committer.ledger.entries if committer.ledger is not None else {}
    before = [earlier.get(u.id) for u in skipped]
    rows_skipped = sum(
        int(e.get("rows", 0)) if e is not None else (u.rows or 0)
        for u, e in zip(skipped, before, strict=True)
    )
    bad = [
        {"unit": str(e["unit"]), "error": str(e["skipped"])}
        for e in before
        if e and e.get("skipped")
    ]
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
        units_bad=bad + committer.skipped,
        timeline=thin(committer.timeline),
        metrics=committer.evaluation.results(committer.metric_states),
        plots=committer.evaluation.plots(committer.metric_states),
        rows_skipped=rows_skipped,
        parts=committer.parts,
        wall_seconds=time.perf_counter() - run.started,
        units_redone=run.redone,
        events=list(run.events),
        stages=stats,
        started_at=run.started_at,
        ended_at=time.time(),
        job=header(plan),
        chute_version=history.chute_version(),
    )


def header(plan: Plan) -> dict[str, Any]:
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
