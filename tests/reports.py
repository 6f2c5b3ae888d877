"""Real runs that leave the reports the report tests look at: the demo, metrics with
slices, a partial run, and a run with quarantined rows.

Each builder runs a real job on the local engine into ``folder`` and returns the output
directory; its ``_chute/report.html`` is the page under test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import chute
from chute.demo import demo_job
from chute.metrics import metric_from_spec

UNITS, ROWS_PER_UNIT = 4, 2_000
REGIONS = ("central", "east", "north", "south", "west")
BROKEN: dict[str, int | None] = {"unit_from_row": None, "bad_rows": 1}
"""Set ``unit_from_row`` to a row id: the model then raises from that row on, as a model
that breaks midway; ``bad_rows`` 0: it raises on no row marked bad."""


def data(folder: Path) -> Path:
    """``UNITS`` Parquet files: id, x, bad (a row the model raises on), region, label."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(17)
    for unit in range(UNITS):
        ids = np.arange(unit * ROWS_PER_UNIT, (unit + 1) * ROWS_PER_UNIT)
        x = rng.normal(size=ROWS_PER_UNIT)
        region = rng.choice(REGIONS, ROWS_PER_UNIT)
        shift = np.array([REGIONS.index(r) for r in region]) * 0.3
        label = (x + shift + rng.normal(scale=1.0, size=ROWS_PER_UNIT) > 0.5).astype(np.int8)
        table = pa.table(
            {
                "id": ids,
                "x": x,
                "bad": ids % 97 == 5,
                "region": region,
                "label": label,
            }
        )
        pq.write_table(table, folder / f"part-{unit}.parquet")
    return folder


def score(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A probability from ``x``; raises on rows marked ``bad`` (and, when BROKEN says so,
    from a given row on, as a model that breaks midway)."""
    stop = BROKEN["unit_from_row"]
    if stop is not None and (batch["id"] >= stop).any():
        raise RuntimeError(f"the model broke at row {int(batch['id'][batch['id'] >= stop][0])}")
    if BROKEN["bad_rows"] and batch["bad"].any():
        row = int(batch["id"][batch["bad"]][0])
        kind = KeyError if row % 2 else ValueError
        raise kind(f"cannot score row {row}: x={float(batch['x'][batch['bad']][0]):.3f}")
    return {"p": (1 / (1 + np.exp(-2 * batch["x"]))).astype(np.float64)}


def job(
    folder: Path,
    out: Path,
    *,
    metrics: bool = False,
    on_error: str = "quarantine",
    engine: str = "local",
) -> chute.Job:
    specs: list[dict[str, Any]] = [
        {"type": "auc_roc", "label": "label", "score": "m_p"},
        {"type": "pr_auc", "label": "label", "score": "m_p"},
        {"type": "log_loss", "label": "label", "score": "m_p"},
        {"type": "auc_roc", "label": "label", "score": "m_p", "by": "region", "name": "auc_s"},
        {"type": "pr_auc", "label": "label", "score": "m_p", "by": "region", "name": "pr_s"},
        {"type": "log_loss", "label": "label", "score": "m_p", "by": "region", "name": "ll_s"},
    ]
    return chute.Job(
        source=chute.FileSource(str(folder)),
        models=(
            chute.Model(
                "m",
                score,
                inputs=("id", "x", "bad"),
                batch_format="numpy",
                batch_size=500,
                on_error=on_error,  # type: ignore[arg-type]
            ),
        ),
        carryover=("id", "region", "label"),
        output=chute.Sink(str(out), file_rows=500),  # files as rows come: a rate over time
        metrics=tuple(metric_from_spec(s) for s in specs) if metrics else (),
        engine=engine,  # type: ignore[arg-type]
    )


def demo_report(folder: Path, rows: int = 60_000) -> Path:
    """The demo, smaller."""
    job_ = demo_job(str(folder), engine="local", rows=rows)
    job_.run(overwrite=True)
    assert job_.output is not None
    return Path(job_.output.path)


def metrics_report(folder: Path) -> Path:
    """Metrics overall and sliced by region (with quarantined rows)."""
    out = folder / "out"
    job(data(folder / "data"), out, metrics=True).run()
    return out


def failures_report(folder: Path, engine: str = "local") -> Path:
    """Quarantined rows of two exception types."""
    out = folder / "out"
    job(data(folder / "data"), out, engine=engine).run()
    return out


def partial_report(folder: Path) -> Path:
    """A run the model stops midway (fatal error), then nothing more."""
    out = folder / "out"
    BROKEN.update(unit_from_row=3 * ROWS_PER_UNIT + 1_900, bad_rows=0)
    try:
        job(data(folder / "data"), out, on_error="fail").run()
    except chute.ModelError:
        pass
    finally:
        BROKEN.update(unit_from_row=None, bad_rows=1)
    return out
