"""Units commit as they finish (issue 12, point 3), on both engines.

The source stalls: it serves the first units, then every further read waits at a gate
that the test opens. While it waits, nothing holds the pipeline but the reads themselves,
so every unit that was read whole must reach the ledger: a kill at that moment would
redo only the units being read. A unit's tail rows must not wait for rows of units that
have not arrived to fill a batch (the local engine's re-batching, Ray Data's bundling of
blocks up to ``batch_size``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import chute
from chute.sources import Unit

ROWS_PER_UNIT = 1_000
UNITS = 8
FREE = 4
"""Units the source serves at once; the reads of the others wait at the gate."""
GATE_TIMEOUT = 120.0
"""The longest a read waits for its gate: a forgotten gate fails, never hangs."""


class StalledSource(chute.FileSource):
    """A FileSource whose reads of units ``free`` and later wait until ``gate`` exists."""

    def __init__(self, path: str, gate: str, free: int) -> None:
        super().__init__(path)
        self.gate = gate
        self.free = free

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "gate": self.gate, "free": self.free}

    def read(self, unit: Unit, columns: Sequence[str] | None) -> pa.Table:
        deadline = time.monotonic() + GATE_TIMEOUT
        while unit.index >= self.free and not Path(self.gate).exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the gate {self.gate} was never opened")
            time.sleep(0.01)
        return super().read(unit, columns)


def score(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"score": batch["x"] * 2.0 + batch["id"]}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``UNITS`` Parquet files of 1,000 rows; ids are unit * 1,000 + row."""
    directory = tmp_path_factory.mktemp("latency-data")
    for unit in range(UNITS):
        ids = np.arange(unit * ROWS_PER_UNIT, (unit + 1) * ROWS_PER_UNIT, dtype=np.int64)
        table = pa.table({"id": ids, "x": np.sin(ids.astype(np.float64))})
        pq.write_table(table, directory / f"unit-{unit:03d}.parquet")
    return directory


def committed(out: Path) -> set[int]:
    """The unit indexes in the ledger (a torn last line left out)."""
    path = out / "_chute" / "ledger.jsonl"
    if not path.exists():
        return set()
    found = set()
    for line in path.read_text().splitlines():
        try:
            found.add(int(json.loads(line)["index"]))
        except (json.JSONDecodeError, KeyError):
            continue
    return found


def wait_until(condition: Callable[[], bool], runner: threading.Thread, limit: float) -> bool:
    """Poll ``condition`` until it holds; ``False`` if the run ends first or ``limit``
    seconds pass (a safety net: the event awaited is the condition, not a time)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if condition():
            return True
        if not runner.is_alive():
            return condition()
        time.sleep(0.02)
    return False


def start(job: chute.Job) -> tuple[threading.Thread, list[BaseException]]:
    """Run ``job`` in a thread; what it raises lands in the returned list."""
    errors: list[BaseException] = []

    def body() -> None:
        try:
            job.run()
        except BaseException as exc:
            errors.append(exc)

    runner = threading.Thread(target=body, name="latency-run", daemon=True)
    runner.start()
    return runner, errors


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "batch_size",
    [
        pytest.param(450, id="tails"),  # a unit is two batches and a tail of 100 rows
        pytest.param(10_000, id="small-units"),  # a unit is one short batch
    ],
)
def test_finished_units_commit_while_the_input_stalls(
    engine: str, batch_size: int, data: Path, tmp_path: Path
) -> None:
    gate, out = tmp_path / "gate", tmp_path / "out"
    model = chute.Model("m", score, inputs=("id", "x"), batch_format="numpy", batch_size=batch_size)
    job = chute.Job(
        source=StalledSource(str(data), str(gate), FREE),
        models=(model,),
        carryover=("id",),
        output=chute.Sink(str(out)),
        engine=engine,  # type: ignore[arg-type]
    )
    runner, errors = start(job)
    try:
        # The units read whole reach the ledger while the other reads wait: only those
        # reads are in flight. Held tails never arrive, and the wait gives up.
        reached = wait_until(lambda: committed(out) >= set(range(FREE)), runner, 60.0)
        assert not errors, errors
        assert reached, f"read units not committed while the input stalls: {committed(out)}"
        assert committed(out) == set(range(FREE))
    finally:
        gate.touch()
        runner.join(timeout=120)
    assert not errors, errors
    assert committed(out) == set(range(UNITS))
    ids = pq.read_table(out, columns=["id"]).column("id").to_numpy()
    np.testing.assert_array_equal(np.sort(ids), np.arange(UNITS * ROWS_PER_UNIT))
