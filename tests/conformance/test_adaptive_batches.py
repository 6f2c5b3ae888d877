"""``batch_size: auto`` on every engine: the size moves the same way, the predictions equal
a fixed batch size's, and the report says what each model settled on."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import chute
from chute.job import BatchSize

ROWS = 6_000
PER_ROW = 1e-4
"""Seconds each row sleeps: a model whose time grows with its rows."""


def sleepy(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``PER_ROW`` seconds a row, and a value that depends on the row only."""
    x = batch["x"]
    time.sleep(PER_ROW * len(x))
    return {"y": np.sin(x) * 3.0 + x, "rows": np.full(len(x), len(x), dtype=np.int64)}


def _run(engine: str, out: Path, size: BatchSize | int) -> tuple[pd.DataFrame, chute.Report]:
    ids = np.arange(ROWS, dtype=np.int64)
    job = chute.Job(
        source=chute.TableSource(pa.table({"id": ids, "x": ids / 7.0})),
        models=(
            chute.Model(
                "m",
                sleepy,
                inputs=("x",),
                batch_format="numpy",
                batch_size=size,
                pool=chute.Pool.fixed(1),
            ),
        ),
        carryover=("id",),
        output=chute.Sink(str(out)),
        engine=engine,
    )
    report = job.run()
    return pd.read_parquet(out).sort_values("id").reset_index(drop=True), report


@pytest.mark.timeout(240)
def test_auto_grows_from_a_small_start_and_predicts_as_a_fixed_size(
    tmp_path: Path, engine: str
) -> None:
    auto = BatchSize.adaptive(seconds=(0.02, 0.08), start=16)  # ~400 rows a call
    frame, report = _run(engine, tmp_path / "auto", auto)
    assert list(frame.id) == list(range(ROWS))
    # what any fixed batch size gives: the model's value depends on its row only
    x = np.arange(ROWS, dtype=np.int64) / 7.0
    np.testing.assert_array_equal(frame.m_y.to_numpy(), np.sin(x) * 3.0 + x)
    assert frame.m_rows.iloc[0] == 16 and frame.m_rows.max() > 16 * 4  # grew
    stats = report.stages["m"]
    assert stats.batch_auto and stats.batch_start == 16 and stats.resizes >= 2
    assert stats.batch_rows is not None and stats.batch_rows > 16
    assert stats.oom_splits == 0 and stats.calls > 1
    assert stats.batches == stats.calls  # on Ray a block's calls, not one a block
    text = " ".join(report.render(width=240).split())
    assert f"batch settled at {stats.batch_rows:,} rows (auto, from 16: " in text
    assert "no out-of-memory split" in text and "rows a batch on average" in text


@pytest.mark.timeout(240)
def test_auto_shrinks_a_slow_start(tmp_path: Path, engine: str) -> None:
    auto = BatchSize.adaptive(seconds=(0.02, 0.08), start=4_096)  # 0.4 s a call at first
    frame, report = _run(engine, tmp_path / "auto", auto)
    assert list(frame.id) == list(range(ROWS))
    assert frame.m_rows.iloc[0] == 4_096 and frame.m_rows.iloc[-1] < 4_096 // 4
    stats = report.stages["m"]
    assert stats.batch_rows is not None and stats.batch_rows < 4_096 // 4
