"""``batch_size: auto``: the sizer moves toward its target, grows back after out-of-memory
splits without retrying a failing size, and never changes a prediction.

The sizer is tested with measured seconds given to it (a cost per row, as a model whose
time is linear in its rows has), and the stage with an injected clock the model advances;
``tests/conformance/test_adaptive_batches.py`` runs jobs on every engine."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner

import chute
from chute.cli import main
from chute.job import AUTO_BATCH_ROWS, BatchSize, BatchTarget
from chute.plan import build_plan
from chute.stages import BatchSizer, ModelStage, tag
from chute.stages.batching import GROW_AFTER_OOM, OOM_PROBES

TARGET = BatchTarget()


def _seconds(rows: int, per_row: float, overhead: float = 0.01) -> float:
    return overhead + rows * per_row


def _settle(sizer: BatchSizer, per_row: float, calls: int = 20) -> list[int]:
    """The sizes of ``calls`` calls of a model costing ``per_row`` seconds a row."""
    sizes = []
    for _ in range(calls):
        sizes.append(sizer.rows)
        sizer.fitted(sizer.rows, _seconds(sizer.rows, per_row), 0)
    return sizes


def test_a_cheap_model_grows_toward_the_target() -> None:
    sizer = BatchSizer(16, TARGET)
    sizes = _settle(sizer, per_row=1e-4)
    assert sizes[1] > sizes[0] and sizes == sorted(sizes)  # grows, never back down
    assert max(b / a for a, b in itertools.pairwise(sizes)) <= 4  # at most 4x a step
    assert TARGET.low <= _seconds(sizer.rows, 1e-4) <= TARGET.high  # settled in the band
    assert sizer.resizes == len(set(sizes)) - 1


def test_a_slow_model_shrinks_toward_the_target() -> None:
    sizer = BatchSizer(65_536, TARGET)
    sizes = _settle(sizer, per_row=1e-3)
    assert sizes[1] < sizes[0]
    assert TARGET.low <= _seconds(sizer.rows, 1e-3) <= TARGET.high
    assert sizer.resizes == 1  # once there, it stays


def test_a_size_within_the_band_is_kept() -> None:
    sizer = BatchSizer(1_000, TARGET)
    assert _settle(sizer, per_row=1e-3) == [1_000] * 20  # 1.01 s a call
    assert sizer.resizes == 0


def test_a_call_with_a_large_fixed_cost_grows_while_growing_pays() -> None:
    # 0.5 s a call whatever its rows (a remote call, a kernel launch): in the band from the
    # first call, yet each doubling halves the cost of a row, so the size doubles to the top.
    sizer = BatchSizer(1_024, TARGET)
    grown = []
    for _ in range(12):
        sizer.fitted(sizer.rows, 0.5, 0)
        grown.append(sizer.rows)
    assert grown[:7] == [2_048, 4_096, 8_192, 16_384, 32_768, 65_536, 65_536]
    assert grown[-1] == TARGET.max_rows and sizer.resizes == 6


def test_a_linear_model_in_the_band_doubles_once_then_stays() -> None:
    # 1 ms a row: 512 rows take 0.51 s, in the band's lower half: one doubling, to find out;
    # 1,024 rows take 1.03 s, above the half (a further doubling would leave the band): kept.
    sizer = BatchSizer(512, TARGET)
    sizer.fitted(512, 0.51, 0)
    assert sizer.rows == 1_024
    sizes = _settle(sizer, per_row=1e-3, calls=10)
    assert sizes == [1_024] * 10 and sizer.resizes == 1


def test_the_largest_size_is_a_read_batch() -> None:
    sizer = BatchSizer(1_024, TARGET)
    _settle(sizer, per_row=1e-9, calls=50)
    assert sizer.rows == TARGET.max_rows


def test_the_memory_cap_bounds_the_size() -> None:
    sizer = BatchSizer(1_024, TARGET)
    sizer.fitted(1_024, 0.001, 1_024 * 2**20)  # a MiB a row, in and out
    assert sizer.rows == TARGET.memory // 2**20  # 64 rows
    for _ in range(10):
        sizer.fitted(sizer.rows, 0.001, sizer.rows * 2**20)
    assert sizer.rows == 64


def test_a_tail_does_not_grow_the_size() -> None:
    sizer = BatchSizer(1_000, TARGET)
    sizer.fitted(10, 0.0001, 0)  # a unit's last 10 rows: too few to tell
    assert sizer.rows == 1_000


def test_a_timeout_lowers_the_target() -> None:
    assert BatchTarget().within(1.0).high == 0.25
    assert BatchTarget().within(None) == BatchTarget()
    sizer = BatchSizer(1_000, BatchTarget().within(1.0))
    sizer.fitted(1_000, 1.0, 0)  # 1 s: over a quarter of the timeout
    assert sizer.rows < 1_000


def test_a_fixed_size_does_not_move() -> None:
    sizer = BatchSizer(500)
    _settle(sizer, per_row=1e-6)
    _settle(sizer, per_row=1.0)
    assert (sizer.rows, sizer.resizes) == (500, 0)


class Capacity:
    """An allocator that holds ``capacity`` rows: more is an out-of-memory error."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.failed: list[int] = []

    def call(self, sizer: BatchSizer, rows: int) -> bool:
        if rows > self.capacity:
            self.failed.append(rows)
            sizer.out_of_memory(rows)
            return False
        sizer.fitted(rows, _seconds(rows, 1e-7), 0)
        return True


def test_out_of_memory_splits_then_grows_back_without_retrying_a_failing_size() -> None:
    sizer, memory = BatchSizer(1_024, TARGET), Capacity(300)
    sizes = []
    for _ in range(500):
        sizes.append(sizer.rows)
        memory.call(sizer, sizer.rows)
    assert memory.failed[:2] == [1_024, 512]  # split: 1,024 → 512 → 256
    assert sizes[2] == 256
    assert 256 < sizer.rows <= 300  # grew back above the split size, below what fails
    assert len(memory.failed) <= 2 + OOM_PROBES  # bounded, however many calls follow
    assert len(set(memory.failed)) == len(memory.failed)  # no failing size tried twice
    assert all(s < min(memory.failed[: i + 1]) for i, s in enumerate(memory.failed[1:]))
    assert sizes[-100:] == [sizer.rows] * 100  # settled


def test_growing_back_waits_for_calls_that_fit() -> None:
    sizer, memory = BatchSizer(512, TARGET), Capacity(300)
    memory.call(sizer, 512)
    sizes = []
    for _ in range(GROW_AFTER_OOM + 1):
        sizes.append(sizer.rows)
        memory.call(sizer, sizer.rows)
    assert sizes[:GROW_AFTER_OOM] == [256] * GROW_AFTER_OOM
    assert sizes[GROW_AFTER_OOM] == 384  # then it probes halfway to what failed


def test_a_probe_that_has_not_run_is_not_reported_as_the_size() -> None:
    # Found on an H200 (139 GiB, 1 GiB a row): 556 → 278 → 139 rows, four calls of 139
    # fitted and the rows ran out; the report said 208 rows, the probe no call had tried.
    sizer, memory = BatchSizer(556), Capacity(139)
    memory.call(sizer, 556)
    memory.call(sizer, 278)
    for _ in range(GROW_AFTER_OOM):
        memory.call(sizer, sizer.rows)
    assert sizer.rows == 208  # the next call would probe halfway to what failed
    assert sizer.take().rows == 139  # what it reports: the largest size that fitted
    memory.call(sizer, sizer.rows)  # the probe fails: back to what fitted
    assert sizer.take().rows == 139
    memory.capacity = 300
    memory.call(sizer, sizer.rows)
    assert sizer.take().rows == sizer.rows  # a probe that fitted is the size


def test_a_fixed_size_grows_back_to_the_size_asked_for() -> None:
    sizer, memory = BatchSizer(1_000), Capacity(10_000)
    memory.capacity = 400  # a passing squeeze: a few large rows, say
    memory.call(sizer, 1_000)
    assert sizer.rows == 500
    memory.call(sizer, 500)
    assert sizer.rows == 250
    memory.capacity = 10_000
    for _ in range(50):
        memory.call(sizer, sizer.rows)
    assert 250 < sizer.rows < 500  # grew back, below the smallest size that failed
    assert sizer.rows <= 1_000


class Linear:
    """A model that takes ``per_row`` seconds of the injected clock per row."""

    now = 0.0

    def __init__(self, per_row: float) -> None:
        self.per_row = per_row
        self.calls: list[int] = []

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls.append(len(batch["x"]))
        Linear.now += 0.005 + self.per_row * len(batch["x"])
        return {"y": batch["x"] * 2.0}


def _stage(per_row: float, start: int) -> ModelStage:
    model = chute.Model("m", Linear, batch_format="numpy", kwargs={"per_row": per_row})
    return ModelStage(model, ["x"], rows=start, timer=lambda: Linear.now)


def test_the_stage_moves_its_calls_toward_the_target_and_keeps_every_prediction() -> None:
    table = tag(pa.table({"x": np.arange(200_000, dtype=np.float64)}), 0, 0, 200_000)
    grows, shrinks = _stage(1e-5, 64), _stage(1e-3, 20_000)
    for stage in (grows, shrinks):
        out = stage(table)
        np.testing.assert_array_equal(out.column("m_y").to_numpy(), np.arange(200_000) * 2.0)
    up = grows._fn.calls  # type: ignore[attr-defined]
    down = shrinks._fn.calls  # type: ignore[attr-defined]
    assert up[0] == 64 and max(up) > 64 * 16  # grew within the one table
    assert down[0] == 20_000 and down[1] < 20_000 / 4  # 20 s a call: shrank at once
    assert grows.take_batching().resizes >= 2


def test_auto_is_the_default() -> None:
    model = chute.Model("m", len)
    assert model.batch_size.auto and model.batch_size.rows == AUTO_BATCH_ROWS
    assert model.batch_size == BatchSize.parse("auto")
    custom = BatchSize.adaptive(seconds=(0.1, 0.4), memory="8MiB", start=64)
    assert (custom.rows, custom.target.low, custom.target.memory) == (64, 0.1, 8 * 2**20)


def test_bad_targets_are_refused() -> None:
    for seconds in ((0.0, 1.0), (2.0, 1.0)):
        try:
            BatchSize.adaptive(seconds=seconds)
        except chute.ConfigError as exc:
            assert "seconds must be two numbers" in str(exc)
        else:
            raise AssertionError(f"{seconds} was accepted")


def _job(tmp_path: Path, **model: object) -> chute.Job:
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"x": np.arange(100, dtype=np.float64)}), path)
    return chute.Job(
        source=chute.FileSource(str(path)),
        models=(chute.Model("m", Linear, kwargs={"per_row": 0.0}, **model),),  # type: ignore[arg-type]
        output=chute.Sink(str(tmp_path / "out")),
    )


def test_the_plan_says_where_auto_starts_and_why(tmp_path: Path) -> None:
    (stage,) = build_plan(_job(tmp_path)).stages
    assert (stage.batch_rows, stage.adaptive) == (1_024, True)
    assert stage.batch_note.startswith("auto: starts at 1,024 rows (small, so a slow model")
    assert "0.5–2 s of model time and at most 64 MiB of input and output" in stage.batch_note
    capped = _job(tmp_path, batch_size=BatchSize.adaptive(memory="4KiB"))
    (stage,) = build_plan(capped).stages
    assert stage.batch_rows == 512  # 4 KiB at 8 bytes a row
    assert "(4 KiB at 8 input bytes a row)" in stage.batch_note
    (fixed,) = build_plan(_job(tmp_path, batch_size=100)).stages
    assert (fixed.batch_rows, fixed.adaptive, fixed.batch_note) == (
        100,
        False,
        "100 rows a call, fixed",
    )


def test_chute_plan_shows_the_start(tmp_path: Path) -> None:
    pq.write_table(pa.table({"passenger_count": np.arange(10)}), tmp_path / "in.parquet")
    (tmp_path / "job.yaml").write_text(
        "input: {path: in.parquet}\n"
        "models: [{name: tip, fn: 'chute.demo:tip_model', inputs: [passenger_count]}]\n"
        "output: {path: out/}\n"
    )
    result = CliRunner(env={"COLUMNS": "240"}).invoke(main, ["plan", str(tmp_path / "job.yaml")])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "1,024 to start (auto)" in text
    assert "tip: batch: auto: starts at 1,024 rows" in text
    assert "0.5–2 s of model time" in text


def test_a_timed_out_size_shrinks_and_the_measured_size_stays_inside_the_timeout() -> None:
    sizer = BatchSizer(1_024, TARGET.within(1.0))  # calls aim at 1/8 s
    assert not sizer.timed_out(6, 1.0) and sizer.rows == 1_024  # a tail says nothing of it
    assert sizer.timed_out(1_024, 1.0)
    assert sizer.rows == 128  # 1,024 rows took over 1 s: 1/8 of them
    sizes = _settle(sizer, 1.0 / 1_024, calls=50)  # a model linear in its rows
    assert max(sizes) < 1_024  # never grows back to where it timed out
    _settle(sizer, 1e-7, calls=50)  # a model that got fast: no ceiling holds it down
    assert sizer.rows > 1_024
    fixed = BatchSizer(1_024)
    assert not fixed.timed_out(1_024, 1.0) and fixed.rows == 1_024  # a size given is kept
