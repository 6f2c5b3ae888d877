"""Batch sizing: ``batch_size: auto``, and the split-and-retry on out-of-memory errors
(which grows back: see also ``tests/test_adaptive_batches.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from click.testing import CliRunner
from rich.console import Console

import chute
from chute.cli import main
from chute.config import job_from_dict
from chute.job import AUTO_BATCH_ROWS
from chute.oom import is_out_of_memory
from chute.stages import ModelStage, tag
from chute.stages.batching import OOM_PROBES

ROWS = 5_000
CAPACITY = 300
"""Rows the workspace models below hold: a batch of 1,024 splits to 512, then to 256."""


class WorkspaceModel:
    """A linear model that predicts inside a workspace allocated once, as a GPU model does.

    A batch larger than the workspace does not fit: the model raises ``MemoryError``, the
    way an allocator with a fixed pool does. ``seen`` counts the rows it predicted.
    """

    def __init__(self, capacity: int = CAPACITY, bad: tuple[int, ...] = ()) -> None:
        self.workspace = np.empty(capacity, dtype=np.float64)
        self.bad = np.asarray(bad, dtype=np.int64)
        self.seen: list[int] = []

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = np.asarray(batch["x"], dtype=np.float64)
        if len(x) > len(self.workspace):
            raise MemoryError(
                f"cannot allocate {len(x) * 8} bytes: the workspace holds {len(self.workspace)}"
            )
        found = np.intersect1d(batch["id"], self.bad)
        if found.size:
            raise ValueError(f"cannot score id {int(found[0])}")
        out = self.workspace[: len(x)]
        np.multiply(x, 3.0, out=out)
        out += 1.0
        self.seen.extend(int(i) for i in batch["id"])
        return {"score": out.copy(), "batch": np.full(len(x), len(x), dtype=np.int64)}


class TorchOomModel(WorkspaceModel):
    """The same model, raising the error torch raises when CUDA memory runs out."""

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        if len(batch["x"]) > len(self.workspace):
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.7 GiB total)"
            )
        return super().__call__(batch)


def _table(rows: int = ROWS) -> pa.Table:
    ids = np.arange(rows, dtype=np.int64)
    return pa.table({"id": ids, "x": (ids % 97).astype(np.float64) / 7.0})


def _run(model: chute.Model, engine: str, out: Path) -> chute.Report:
    """``model`` over the table, carrying ``id``, written to ``out``."""
    job = chute.Job(
        source=chute.TableSource(_table()),
        models=(model,),
        carryover=("id",),
        output=chute.Sink(str(out)),
        engine=engine,  # type: ignore[arg-type]
    )
    return job.run()


def _stage(model: type, table: pa.Table, **kwargs: Any) -> tuple[ModelStage, pa.Table]:
    spec = chute.Model(
        "m",
        model,
        inputs=("id", "x"),
        batch_format="numpy",
        kwargs=kwargs.pop("ctor", {}),
        **kwargs,
    )
    return ModelStage(spec, ["id", "x"], rows=1_024), tag(table, 0, 0, table.num_rows)


def _expected(ids: np.ndarray) -> np.ndarray:
    return (ids % 97).astype(np.float64) / 7.0 * 3.0 + 1.0


@pytest.mark.parametrize("model", [WorkspaceModel, TorchOomModel], ids=["memory", "torch"])
def test_a_batch_that_does_not_fit_is_split_then_grows_back(model: type) -> None:
    stage, table = _stage(model, _table(8_000), batch_size=1_024)
    first = stage(table.slice(0, 1_024))
    assert stage.take_batching().oom_splits == 2  # 1,024 → 512 → 256
    assert first.column("m_batch").to_numpy().max() == 256
    second = stage(table.slice(1_024))  # probes between 256 and what failed
    out = pa.concat_tables([first, second])
    ids = out.column("id").to_numpy()
    assert list(ids) == list(range(8_000))  # the order is kept
    assert sorted(stage._fn.seen) == list(range(8_000))  # type: ignore[attr-defined]
    np.testing.assert_array_equal(out.column("m_score").to_numpy(), _expected(ids))
    assert 256 < out.column("m_batch").to_numpy().max() <= CAPACITY  # grew back


def test_splitting_equals_predicting_row_by_row() -> None:
    stage, table = _stage(WorkspaceModel, _table(777))
    whole = stage(table).column("m_score").to_numpy()
    single, _ = _stage(WorkspaceModel, _table(777))
    by_row = [single(table.slice(i, 1)).column("m_score")[0].as_py() for i in range(777)]
    np.testing.assert_array_equal(whole, np.asarray(by_row))


def test_a_single_row_that_does_not_fit_is_a_clear_model_error() -> None:
    stage, table = _stage(WorkspaceModel, _table(10), ctor={"capacity": 0}, on_error="quarantine")
    with pytest.raises(chute.ModelError) as info:
        stage(table)
    message = str(info.value)
    assert "model 'm' ran out of memory (MemoryError" in message
    assert "on a single row: row 0 of unit 0" in message
    assert "more memory" in message and "fewer replicas per GPU" in message
    assert isinstance(info.value.__cause__, MemoryError)


def test_out_of_memory_under_quarantine_fails_no_row() -> None:
    bad = (17, 1_500)
    stage, table = _stage(WorkspaceModel, _table(2_000), ctor={"bad": bad}, on_error="quarantine")
    out = stage(table)
    failed = out.column("__chute_error_model").to_numpy(zero_copy_only=False)
    assert list(np.flatnonzero(failed != None)) == list(bad)  # noqa: E711
    assert stage.take_batching().oom_splits >= 2  # 1,024 → 512 → 256


@pytest.mark.parametrize(
    "error, oom",
    [
        pytest.param(MemoryError(), True, id="memory"),
        pytest.param(RuntimeError("CUDA out of memory. Tried to allocate 20 MiB"), True, id="cuda"),
        pytest.param(ValueError("out of memory"), False, id="user-valueerror"),
        pytest.param(RuntimeError("shape mismatch"), False, id="runtime"),
    ],
)
def test_out_of_memory_is_recognised_conservatively(error: BaseException, oom: bool) -> None:
    assert is_out_of_memory(error) is oom


def test_an_error_raised_from_an_out_of_memory_error_counts() -> None:
    try:
        try:
            raise MemoryError("arena")
        except MemoryError as inner:
            raise chute.ModelError("adapter failed") from inner
    except chute.ModelError as exc:
        assert is_out_of_memory(exc)


def test_onnxruntime_out_of_memory_is_recognised() -> None:
    ort = pytest.importorskip("onnxruntime")
    error_type = ort.capi.onnxruntime_pybind11_state.RuntimeException
    failure = error_type("Failed to allocate memory for requested buffer of size 8589934592")
    assert is_out_of_memory(failure)
    assert not is_out_of_memory(error_type("Invalid input shape"))


@pytest.mark.timeout(180)
def test_out_of_memory_split_end_to_end(tmp_path: Path, engine: str) -> None:
    model = chute.Model(
        "m",
        TorchOomModel,
        inputs=("id", "x"),
        batch_format="numpy",
        batch_size=1_024,
        pool=chute.Pool.fixed(1),
    )
    out = tmp_path / "out"
    report = _run(model, engine, out)
    frame = pd.read_parquet(out).sort_values("id")
    assert list(frame.id) == list(range(ROWS))
    np.testing.assert_array_equal(frame.m_score.to_numpy(), _expected(frame.id.to_numpy()))
    assert frame.m_batch.max() <= CAPACITY
    stats = report.stages["m"]
    # 1,024 → 512 → 256 fits; then probes toward 1,024 below what failed, at most
    # OOM_PROBES of them failing: it settles above 256 and never past the capacity
    assert 2 < stats.oom_splits <= 2 + OOM_PROBES
    assert stats.batch_rows is not None and 256 < stats.batch_rows <= CAPACITY
    note = f"{stats.oom_splits} out-of-memory splits, batch now {stats.batch_rows:,} rows"
    console = Console(width=200, record=True)
    console.print(report.render())
    text = " ".join(console.export_text().split())
    assert f"model m │ {note}" in text
    saved = json.loads((out / "_chute" / "report.json").read_text())
    assert saved["stages"]["m"]["oom_splits"] == stats.oom_splits
    assert saved["stages"]["m"]["batch_rows"] == stats.batch_rows
    status = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["status", str(out)])
    assert f"model m: {note}" in status.output
    assert CliRunner().invoke(main, ["report", str(out)]).exit_code == 0  # writes report.html
    html = (out / "_chute" / "report.html").read_text()
    assert note in html


def test_auto_parses_in_python_and_yaml() -> None:
    auto = chute.BatchSize.parse("auto")
    assert (auto.rows, auto.auto) == (AUTO_BATCH_ROWS, True)
    assert chute.Model("m", len, batch_size="auto").batch_size == auto  # type: ignore[arg-type]
    job = job_from_dict(
        {
            "input": "in.parquet",
            "models": [{"name": "m", "fn": "chute.demo:tip_model", "batch_size": "auto"}],
            "output": "out/",
        }
    )
    assert job.models[0].batch_size == auto


class CudaScratchModel:
    """A torch model that needs 1 GiB of GPU scratch memory per row: a large batch runs
    the GPU out of memory for real (``torch.OutOfMemoryError`` from the CUDA allocator)."""

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        x = torch.as_tensor(batch["x"], device="cuda")
        scratch = torch.ones((len(x), 2**28), device="cuda")  # 1 GiB of float32 per row
        out = (scratch[:, :1].squeeze(1) * x * 3.0 + 1.0).cpu().numpy()
        del scratch
        return {"score": out, "batch": np.full(len(x), len(x), dtype=np.int64)}


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU: a real CUDA out-of-memory")
def test_a_real_cuda_out_of_memory_is_split() -> None:
    import torch

    gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    rows = int(gib) * 4  # four times what fits
    stage, table = _stage(CudaScratchModel, _table(rows))
    out = stage(table)
    sizing = stage.take_batching()
    assert sizing.oom_splits >= 2 and sizing.rows is not None and sizing.rows < gib
    ids = out.column("id").to_numpy()
    assert list(ids) == list(range(rows))
    np.testing.assert_allclose(out.column("m_score").to_numpy(), _expected(ids), rtol=1e-6)


def test_an_error_raised_while_handling_an_out_of_memory_error_counts() -> None:
    def wrap() -> None:
        try:
            raise MemoryError("arena")
        except MemoryError:
            raise chute.ModelError("adapter failed")  # noqa: B904 - implicit context

    with pytest.raises(chute.ModelError) as info:
        wrap()
    assert is_out_of_memory(info.value)
    try:
        try:
            raise MemoryError("arena")
        except MemoryError:
            raise ValueError("unrelated") from None
    except ValueError as exc:
        assert not is_out_of_memory(exc)


@pytest.mark.timeout(180)
def test_out_of_memory_under_quarantine_end_to_end(tmp_path: Path, engine: str) -> None:
    bad = (3, 2_500, 4_999)
    model = chute.Model(
        "m",
        WorkspaceModel,
        inputs=("id", "x"),
        batch_format="numpy",
        batch_size=2_048,
        pool=chute.Pool.fixed(1),
        on_error="quarantine",
        kwargs={"bad": bad},
    )
    out = tmp_path / "out"
    report = _run(model, engine, out)
    frame = pd.read_parquet(out)
    errors = pd.read_parquet(out / "_errors")
    assert sorted(errors.id) == list(bad) and set(errors.error_type) == {"ValueError"}
    assert sorted(frame.id) == sorted(set(range(ROWS)) - set(bad))
    assert (report.rows_failed, report.rows_out) == (len(bad), ROWS - len(bad))
    stats = report.stages["m"]
    assert stats.oom_splits >= 3 and stats.batch_rows is not None
    assert 256 <= stats.batch_rows <= CAPACITY
