"""Quarantine's cost: the demo with 0%, 0.1% and 3% bad rows, spread and clustered.

The demo's tip model, made to raise on the rows whose ``trip_id`` is bad (``on_error:
quarantine``), against the clean run (the plain model); and a model that marks the same
rows in an ``_error`` output instead of raising. Prints seconds, model calls, the calls per
bad row and the ratio to the clean run::

    python benchmarks/quarantine.py                      # the full demo (1,710,629 rows)
    python benchmarks/quarantine.py --rows 300000 --out /tmp/q
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import time
from typing import Any

import numpy as np

import chute
from chute.demo import CARRYOVER, TOTAL_ROWS, generate

CALLS = {"n": 0}


class Raising:
    """The tip model; raises on a batch that holds a bad ``trip_id``."""

    def __init__(self, bad: np.ndarray) -> None:
        self.bad = np.zeros(int(bad.max(initial=0)) + 1, bool)  # a lookup, O(batch) per call
        self.bad[bad] = True

    def hit(self, ids: np.ndarray) -> np.ndarray:
        inside = ids < len(self.bad)
        return inside & self.bad[np.where(inside, ids, 0)]

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        CALLS["n"] += 1
        hit = self.hit(batch["trip_id"])
        if hit.any():
            raise ValueError(f"bad trip {int(batch['trip_id'][hit][0])}")
        return {"score": (batch["passenger_count"] >= 2).astype(np.float32)}


class Marking(Raising):
    """The same rows, marked in ``_error`` instead of raised."""

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        CALLS["n"] += 1
        hit = self.hit(batch["trip_id"])
        score = (batch["passenger_count"] >= 2).astype(np.float32)
        return {"score": score, "_error": np.where(hit, "bad trip", None)}


def bad_ids(rows: int, fraction: float, layout: str, seed: int = 17) -> np.ndarray:
    count = round(rows * fraction)
    if layout == "spread":
        return np.random.default_rng(seed).choice(rows, count, replace=False)
    start = rows // 3
    return np.arange(start, start + count)


def run(data: str, out: str, model: Any) -> tuple[float, int, int]:
    shutil.rmtree(out, ignore_errors=True)
    CALLS["n"] = 0
    job = chute.Job(
        source=chute.FileSource(data),
        models=(
            chute.Model(
                "tip",
                model,
                inputs=("trip_id", "passenger_count"),
                batch_format="numpy",
                on_error="quarantine",
            ),
        ),
        carryover=CARRYOVER,
        output=chute.Sink(out),
        engine="local",
    )
    started = time.perf_counter()
    report = job.run()
    return time.perf_counter() - started, CALLS["n"], report.rows_failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=TOTAL_ROWS)
    parser.add_argument("--out", default="bench-out/quarantine")
    args = parser.parse_args()
    data = os.path.join(args.out, "taxi")
    generate(data, args.rows)
    clean_s, clean_calls, _ = run(data, os.path.join(args.out, "o"), Raising(np.empty(0, int)))
    print(f"rows {args.rows:,}; clean run {clean_s:.2f} s, {clean_calls} calls")
    print("| bad rows | layout | model | seconds | × clean | calls | calls per bad row |")
    print("|---|---|---|---|---|---|---|")
    for fraction in (0.0, 0.001, 0.03):
        for layout in ("spread", "clustered") if fraction else ("-",):
            bad = bad_ids(args.rows, fraction, layout)
            for kind, model in (("raises", Raising(bad)), ("marks _error", Marking(bad))):
                seconds, calls, failed = run(data, os.path.join(args.out, "o"), model)
                assert failed == len(bad), (failed, len(bad))
                per = (calls - clean_calls) / len(bad) if len(bad) else math.nan
                print(
                    f"| {fraction:.1%} ({len(bad):,}) | {layout} | {kind} | {seconds:.2f} | "
                    f"{seconds / clean_s:.1f} | {calls:,} | {per:.1f} |"
                )


if __name__ == "__main__":
    main()
