"""Metrics computed in the job's own pass: exact across engines, batching, pools, resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from sklearn.metrics import log_loss, mean_squared_error, roc_auc_score

import chute
from chute import metrics as M
from chute.demo import generate

ROWS = 120_000


def probability(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    fare, riders = batch["fare_amount"], batch["passenger_count"]
    return {"p": 1 / (1 + np.exp(-(fare - 12) / 6 - 0.2 * riders))}


def labels(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"is_tip": (batch["tip_amount"] > 0).astype(np.int8)}


@pytest.fixture(scope="module")
def taxi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("eval") / "taxi"
    generate(str(root), total=ROWS)
    return root


def _metrics() -> list[M.Metric]:
    return [
        M.AucRoc("is_tip", "tip_p"),
        M.LogLoss("is_tip", "tip_p"),
        M.Confusion("is_tip", "tip_p", threshold=0.4),
        M.Regression("tip_amount", "fare_tip"),
        M.Sliced(M.LogLoss("is_tip", "tip_p", name="log_loss_by_payment"), "payment_type"),
        M.ColumnStats("trip_distance"),
    ]


def _job(taxi: Path, out: Path, engine: str, batch: int = 5_000, pool: int = 1) -> chute.Job:
    tip = chute.Model(
        "tip",
        probability,
        inputs=("fare_amount", "passenger_count"),
        batch_format="numpy",
        batch_size=batch,
        pool=chute.Pool.fixed(pool),
    )
    fare = chute.Model(
        "fare",
        lambda b: {"tip": np.asarray(b["fare_amount"]) * 0.1},
        inputs=("fare_amount",),
        batch_size=batch * 3,
    )
    return chute.Job(
        source=chute.FileSource(str(taxi)),
        models=(tip, fare),
        carryover=("trip_id",),
        preprocess=chute.Preprocess(labels, inputs=("tip_amount",), batch_format="numpy"),
        metrics=tuple(_metrics()),
        output=chute.Sink(str(out)),
        engine=engine,  # type: ignore[arg-type]
    )


def _expected(taxi: Path) -> dict[str, Any]:
    df = pd.read_parquet(taxi)
    y = (df.tip_amount > 0).astype(int).to_numpy()
    p = probability({c: df[c].to_numpy() for c in ("fare_amount", "passenger_count")})["p"]
    loss = -(y * np.log(p) + (1 - y) * np.log(1 - p))  # per row; one group has one class only
    by_payment = {k: float(loss[g.index].mean()) for k, g in df.groupby("payment_type")}
    return {
        "auc": roc_auc_score(y, p),
        "log_loss": log_loss(y, p),
        "accuracy": float(((p >= 0.4) == y).mean()),
        "mse": mean_squared_error(df.tip_amount, df.fare_amount * 0.1),
        "distance_mean": float(df.trip_distance.mean()),
        "by_payment": by_payment,
    }


@pytest.mark.timeout(240)
def test_metrics_equal_scikit_learn(taxi: Path, tmp_path: Path, engine: str) -> None:
    report = _job(taxi, tmp_path / "out", engine).run()
    want = _expected(taxi)
    tip, fare = report.metrics["tip"], report.metrics["fare"]
    auc = tip["auc_roc"]
    assert abs(auc["auc_roc"] - want["auc"]) <= auc["auc_error_bound"]
    assert tip["log_loss"]["log_loss"] == pytest.approx(want["log_loss"], rel=1e-9)
    assert tip["confusion"]["accuracy"] == pytest.approx(want["accuracy"], rel=1e-12)
    assert fare["regression"]["mse"] == pytest.approx(want["mse"], rel=1e-9)
    assert report.metrics["dataset"]["column_stats"]["mean"] == pytest.approx(
        want["distance_mean"], rel=1e-12
    )
    groups = tip["log_loss_by_payment"]["groups"]
    assert {k: v["log_loss"] for k, v in groups.items()} == pytest.approx(
        want["by_payment"], rel=1e-9
    )
    saved = json.loads((tmp_path / "out" / "_chute" / "report.json").read_text())
    assert saved["metrics"] == json.loads(json.dumps(report.metrics))
    html = (tmp_path / "out" / "_chute" / "report.html").read_text()
    assert "ROC — tip/auc_roc" in html and "<svg" in html


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_metrics_do_not_depend_on_engine_batch_size_or_pool(
    taxi: Path, tmp_path: Path, ray_session: Any
) -> None:
    runs = [
        _job(taxi, tmp_path / "a", "local", batch=5_000).run().metrics,
        _job(taxi, tmp_path / "b", "local", batch=40_000, pool=2).run().metrics,
        _job(taxi, tmp_path / "c", "ray", batch=7_000, pool=2).run().metrics,
    ]
    assert runs[0] == runs[1] == runs[2]  # exactly: merges are exact, whatever the order


@pytest.mark.timeout(240)
def test_metrics_after_a_resume_equal_an_uninterrupted_run(
    taxi: Path, tmp_path: Path, engine: str
) -> None:
    whole = _job(taxi, tmp_path / "whole", engine).run().metrics
    out = tmp_path / "resumed"
    _job(taxi, out, engine).run()
    ledger = out / "_chute" / "ledger.jsonl"
    lines = ledger.read_text().splitlines()
    kept = lines[: len(lines) // 3]  # as if the driver died after a third of the units
    ledger.write_text("".join(line + "\n" for line in kept))
    (out / "_SUCCESS").unlink()
    resumed = _job(taxi, out, engine).run()
    assert resumed.units_skipped == len(kept) and resumed.units_done == len(lines) - len(kept)
    assert resumed.metrics == whole
    assert sorted(pd.read_parquet(out).trip_id) == list(range(ROWS))


def test_metric_state_size_does_not_grow_with_rows(taxi: Path, tmp_path: Path) -> None:
    _job(taxi, tmp_path / "out", "local").run()
    entries = [json.loads(line) for line in (tmp_path / "out/_chute/ledger.jsonl").open()]
    rows = [e["rows"] for e in entries]
    sizes = [len(e["metrics"]) for e in entries]
    assert max(sizes) < 64_000  # bytes per unit, whatever its rows
    assert all(pq.read_metadata(p).num_rows for p in taxi.glob("*.parquet"))
    assert len(rows) == 12


def test_a_metric_on_a_column_that_does_not_exist_fails_before_compute(
    taxi: Path, tmp_path: Path
) -> None:
    job = chute.Job(
        source=chute.FileSource(str(taxi)),
        models=(
            chute.Model(
                "tip", probability, inputs=("fare_amount", "passenger_count"), batch_format="numpy"
            ),
        ),
        metrics=(M.LogLoss("tip_amout", "tip_p"),),
        output=chute.Sink(str(tmp_path / "o")),
    )
    with pytest.raises(chute.ColumnNotFoundError, match="Did you mean 'tip_amount'"):
        job.run()
    assert not (tmp_path / "o").exists()
