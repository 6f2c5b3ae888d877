"""How long resuming a job that was 90% done takes, against the full run (local engine).

The job: a small NumPy MLP (16 → 64 → 1) over synthetic Parquet files, one unit per file,
three carried columns. Steps, each timed by wall clock in this process:

1. the full run into an empty output location;
2. "90% done": the ledger is cut back to its first 90% of units, ``_SUCCESS`` and the
   report removed — what a driver killed right after committing those units leaves
   (the parts of the other units stay behind, as the orphans a real kill leaves);
3. the resume: the same job again; it must skip the committed units, remove the orphans
   and compute only the rest;
4. a resume of the finished job (nothing left to do): the fixed cost of a resume.

    python benchmarks/resume.py                       # 20 units × 100,000 rows
    python benchmarks/resume.py --units 40 --rows-per-unit 50000 --out /tmp/resume
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import chute

FEATURES = 16


class MLP:
    """16 → 64 → 1 with fixed random weights: a model with real arithmetic per row."""

    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.w1 = rng.normal(size=(FEATURES, 64)).astype(np.float32)
        self.w2 = rng.normal(size=(64, 1)).astype(np.float32)

    def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        x = np.stack([batch[f"f{i}"] for i in range(FEATURES)], axis=1)
        return (np.maximum(x @ self.w1, 0.0) @ self.w2)[:, 0]


def make_data(directory: Path, units: int, rows: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    for unit in range(units):
        path = directory / f"part-{unit:04d}.parquet"
        if path.exists() and pq.read_metadata(path).num_rows == rows:
            continue
        ids = np.arange(unit * rows, (unit + 1) * rows, dtype=np.int64)
        columns = {"id": ids, "group": ids % 97, "label": rng.random(rows) < 0.5}
        columns |= {f"f{i}": rng.normal(size=rows).astype(np.float32) for i in range(FEATURES)}
        pq.write_table(pa.table(columns), path)


def job(data: Path, out: Path) -> chute.Job:
    return chute.Job(
        source=chute.FileSource(str(data)),
        models=(
            chute.Model(
                "mlp", MLP, batch_format="numpy", inputs=[f"f{i}" for i in range(FEATURES)]
            ),
        ),
        carryover=("id", "group", "label"),
        output=chute.Sink(str(out)),
        engine="local",
    )


def cut_back(out: Path, keep: int) -> None:
    """Leave the output as a driver killed after committing ``keep`` units would."""
    ledger = out / "_chute" / "ledger.jsonl"
    lines = ledger.read_text().splitlines(keepends=True)
    ledger.write_text("".join(lines[:keep]))
    (out / "_SUCCESS").unlink()
    (out / "_chute" / "report.json").unlink()


def timed(label: str, the_job: chute.Job) -> tuple[float, chute.Report]:
    began = time.perf_counter()
    report = the_job.run()
    seconds = time.perf_counter() - began
    print(
        f"{label:<26} {seconds:7.2f} s   units run {report.units_done:>3}, "
        f"skipped {report.units_skipped:>3}; rows written {report.rows_out:,}"
    )
    return seconds, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--units", type=int, default=20)
    parser.add_argument("--rows-per-unit", type=int, default=100_000)
    parser.add_argument(
        "--done", type=float, default=0.9, help="fraction committed before the resume"
    )
    parser.add_argument("--out", default="bench-out/resume")
    args = parser.parse_args()

    root = Path(args.out)
    data, out = root / "data", root / "out"
    make_data(data, args.units, args.rows_per_unit)
    shutil.rmtree(out, ignore_errors=True)
    total = args.units * args.rows_per_unit
    keep = round(args.units * args.done)
    print(
        f"{args.units} units × {args.rows_per_unit:,} rows = {total:,} rows; local engine; "
        f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}"
    )

    full, _ = timed("full run", job(data, out))
    cut_back(out, keep)
    orphans = sum(1 for p in out.iterdir() if p.name.startswith("part-")) - sum(
        len(json.loads(line)["parts"]) for line in (out / "_chute" / "ledger.jsonl").open()
    )
    print(f"cut back to {keep}/{args.units} units committed ({orphans} orphan parts left)")
    resume, report = timed(f"resume at {keep / args.units:.0%} done", job(data, out))
    assert (report.units_skipped, report.units_done) == (keep, args.units - keep)
    noop, _ = timed("resume when finished", job(data, out))
    print(
        f"\nresume of a {keep / args.units:.0%}-done job: {resume:.2f} s vs {full:.2f} s for the "
        f"full run = {resume / full:.0%} of it (compute left: {1 - keep / args.units:.0%}); "
        f"a resume with nothing left to do: {noop:.2f} s"
    )


if __name__ == "__main__":
    main()
