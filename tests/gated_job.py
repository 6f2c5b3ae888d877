"""A model that a test holds at a gate: the first units go through, the rest wait.

A test starts a driver with this model, waits until the driver has committed the free
units (so it is known to be live and mid-run), does what it wants to the output location
meanwhile — start a second run, delete files — and then opens the gate by creating a
file. Named by file path in job files, so a driver subprocess imports it the same way.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve()
ROWS_PER_UNIT = 1_000
GATE_TIMEOUT = 120.0
"""The longest a batch waits for its gate: a forgotten gate fails, never hangs."""


class GatedModel:
    """``score = 2 * x + id``; once ``free`` units have passed it whole, every further batch
    waits until the file ``gate`` exists (and ``<gate>.reached`` says it is waiting).

    Counting whole units, rather than blocking on unit numbers, keeps it deterministic
    however the engine interleaves units: the free units always get through and commit.
    """

    def __init__(self, gate: str, free: int = 2, rows_per_unit: int = ROWS_PER_UNIT) -> None:
        self.gate = Path(gate)
        self.free = free
        self.rows_per_unit = rows_per_unit
        self.seen: Counter[int] = Counter()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids = batch["id"]
        whole = sum(1 for rows in self.seen.values() if rows == self.rows_per_unit)
        if whole >= self.free:
            self._wait()
        self.seen.update((ids // self.rows_per_unit).tolist())
        return {"score": batch["x"] * 2.0 + ids}

    def _wait(self) -> None:
        if not self.gate.exists():
            self.gate.with_suffix(".reached").touch()
        deadline = time.monotonic() + GATE_TIMEOUT
        while not self.gate.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the gate {self.gate} was never opened")
            time.sleep(0.01)


def write_job(
    path: Path, data: Path, out: str, gate: Path, engine: str = "local", **extra: Any
) -> Path:
    """A job file for :class:`GatedModel` over ``data`` (JSON is YAML)."""
    job = {
        "input": str(data),
        "carryover": ["id"],
        "models": [
            {
                "name": "m",
                "fn": f"{HERE}:GatedModel",
                "inputs": ["id", "x"],
                "batch_format": "numpy",
                "batch_size": 250,
                "pool": 1,
                "kwargs": {"gate": str(gate)},
            }
        ],
        # a file a unit, as before files were joined: tests lose or keep single units
        "output": {"path": out, "file_rows": ROWS_PER_UNIT},
        "engine": engine,
        **extra,
    }
    path.write_text(json.dumps(job, indent=2))
    return path
