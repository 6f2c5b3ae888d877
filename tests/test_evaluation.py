"""Metrics computed in the job's own pass: exact across engines, batching, pools, resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
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


def _job(
    taxi: Path,
    out: Path,
    engine: str,
    batch: int = 5_000,
    pool: int = 1,
    file_rows: int | None = None,
) -> chute.Job:
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
        output=chute.Sink(str(out), file_rows=file_rows),
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
    # files of one unit's rows: a unit's ledger line stands alone (a file the local writer
    # joins units into is trusted only with all of them, and the cut below splits them)
    _job(taxi, out, engine, file_rows=5_000).run()
    ledger = out / "_chute" / "ledger.jsonl"
    lines = ledger.read_text().splitlines()
    kept = lines[: len(lines) // 3]  # as if the driver died after a third of the units
    ledger.write_text("".join(line + "\n" for line in kept))
    (out / "_SUCCESS").unlink()
    resumed = _job(taxi, out, engine, file_rows=5_000).run()
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


MILLION = 1_000_000


def _sigmoid(v: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-v))


def binary(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"p": _sigmoid(batch["signal"])}


def multiclass(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    logits = np.stack([batch["signal"] * k for k in (-1.0, 0.0, 0.5, 1.0)], axis=1)
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return {"probs": e / e.sum(axis=1, keepdims=True)}


def regression(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"yhat": batch["signal"] * 1.5 + 0.25}


@pytest.fixture(scope="module")
def million(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1,000,000 labelled rows over 25 Parquet units."""
    root = tmp_path_factory.mktemp("million")
    rng = np.random.default_rng(11)
    signal = rng.normal(size=MILLION)
    table = pa.table(
        {
            "id": np.arange(MILLION),
            "signal": signal,
            "y": (rng.random(MILLION) < _sigmoid(2 * signal)).astype(np.int8),
            "cls": np.clip(np.round(signal + rng.normal(size=MILLION)) + 1, 0, 3).astype(np.int64),
            "target": signal * 1.4 + rng.normal(scale=0.3, size=MILLION),
        }
    )
    for i, start in enumerate(range(0, MILLION, MILLION // 25)):
        pq.write_table(table.slice(start, MILLION // 25), root / f"part-{i:02d}.parquet")
    return root


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_every_metric_family_on_a_million_rows_over_units_and_actors(
    million: Path, tmp_path: Path, ray_session: Any
) -> None:
    from sklearn.metrics import (
        average_precision_score,
        brier_score_loss,
        confusion_matrix,
        f1_score,
        mean_absolute_error,
        precision_score,
        r2_score,
        recall_score,
        top_k_accuracy_score,
    )

    models = (
        chute.Model(
            "bin",
            binary,
            inputs=("signal",),
            batch_format="numpy",
            batch_size=30_000,
            pool=chute.Pool.fixed(2),
        ),
        chute.Model(
            "multi", multiclass, inputs=("signal",), batch_format="numpy", batch_size=50_000
        ),
        chute.Model("reg", regression, inputs=("signal",), batch_format="numpy"),
    )
    metrics = (
        M.AucRoc("y", "bin_p"),
        M.LogLoss("y", "bin_p"),
        M.Brier("y", "bin_p"),
        M.Confusion("y", "bin_p", threshold=0.5),
        M.Calibration("y", "bin_p", bins=10),
        M.Multiclass("cls", "multi_probs", k=2),
        M.Regression("target", "reg_yhat"),
        M.ColumnStats("signal"),
        M.Histogram("signal", bins=20, range=(-3, 3)),
    )
    job = chute.Job(
        source=chute.FileSource(str(million)),
        models=models,
        carryover=("id",),
        metrics=metrics,
        output=chute.Sink(str(tmp_path / "out")),
        engine="ray",
    )
    got = job.run().metrics
    df = pd.read_parquet(million)
    y, s = df.y.to_numpy(), df.signal.to_numpy()
    p = _sigmoid(s)
    probs = multiclass({"signal": s})["probs"]
    yhat = regression({"signal": s})["yhat"]
    b, mc, rg = got["bin"], got["multi"]["multiclass"], got["reg"]["regression"]
    assert abs(b["auc_roc"]["auc_roc"] - roc_auc_score(y, p)) <= b["auc_roc"]["auc_error_bound"]
    assert (
        abs(b["auc_roc"]["pr_auc"] - average_precision_score(y, p))
        <= (b["auc_roc"]["pr_auc_error_bound"])
    )
    exact = pytest.approx
    assert b["log_loss"]["log_loss"] == exact(log_loss(y, p), rel=1e-9)
    assert b["brier"]["brier"] == exact(brier_score_loss(y, p), rel=1e-9)
    predicted = (p >= 0.5).astype(int)
    assert b["confusion"]["accuracy"] == exact(float((predicted == y).mean()), rel=1e-12)
    assert b["confusion"]["precision"] == exact(precision_score(y, predicted), rel=1e-12)
    assert b["confusion"]["recall"] == exact(recall_score(y, predicted), rel=1e-12)
    assert b["confusion"]["f1"] == exact(f1_score(y, predicted), rel=1e-12)
    bins = np.minimum((p * 10).astype(int), 9)
    ece = sum(
        abs(p[bins == k].mean() - y[bins == k].mean()) * (bins == k).mean()
        for k in range(10)
        if (bins == k).any()
    )
    assert b["calibration"]["ece"] == exact(ece, rel=1e-9)
    cls = df.cls.to_numpy()
    assert mc["accuracy"] == exact(float((probs.argmax(axis=1) == cls).mean()), rel=1e-12)
    assert mc["top_k_accuracy"] == exact(top_k_accuracy_score(cls, probs, k=2), rel=1e-12)
    assert mc["cross_entropy"] == exact(log_loss(cls, probs, labels=[0, 1, 2, 3]), rel=1e-9)
    assert np.array_equal(
        np.asarray(mc["confusion_matrix"]), confusion_matrix(cls, probs.argmax(1))
    )
    target = df.target.to_numpy()
    assert rg["mse"] == exact(mean_squared_error(target, yhat), rel=1e-9)
    assert rg["mae"] == exact(mean_absolute_error(target, yhat), rel=1e-9)
    assert rg["r2"] == exact(r2_score(target, yhat), rel=1e-9)
    stats = got["dataset"]["column_stats"]
    assert (stats["min"], stats["max"]) == (s.min(), s.max())
    assert stats["mean"] == exact(s.mean(), rel=1e-12) and stats["count"] == MILLION
    counts, _ = np.histogram(s[(s >= -3) & (s <= 3)], bins=20, range=(-3, 3))
    assert got["dataset"]["histogram"]["counts"] == counts.tolist()


def fails_from_ten(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if (batch["x"] >= 10).any():
        raise ValueError("bad row")
    return {"p": batch["x"] / 100.0}


@pytest.mark.timeout(120)
def test_a_batch_whose_rows_all_fail_is_measured_as_no_rows(engine: str, tmp_path: Path) -> None:
    """Under quarantine every row of the second unit's batch fails: that batch has no
    prediction column at all. Measuring it raised ``ColumnNotFoundError``, and the job,
    and every resume of it, stopped there. It counts no rows; the metric is the healthy
    unit's."""
    from chute.sources import TableSource

    table = pa.table({"x": np.arange(20, dtype=np.float64), "y": np.arange(20) % 2})
    model = chute.Model(
        "m", fails_from_ten, inputs=("x",), batch_format="numpy", batch_size=10,
        on_error="quarantine",
    )  # fmt: skip
    report = chute.Job(
        source=TableSource(table, unit_rows=10),
        models=(model,),
        carryover=("x",),
        metrics=(M.LogLoss("y", "m_p"),),
        engine=engine,
        output=chute.Sink(str(tmp_path / "out")),
    ).run()
    assert report.rows_failed == 10
    got = report.metrics["m"]["log_loss"]
    assert got["count"] == 10
    want = log_loss(np.arange(10) % 2, np.arange(10) / 100.0, labels=[0, 1])
    assert got["log_loss"] == pytest.approx(want, rel=1e-12)


def _scores_failing_on_sevens(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if (batch["x"] % 7 == 0).any():
        raise ValueError("a seven")
    return {"score": batch["x"] / 100}


def _score_again(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"score": 1 - batch["x"] / 100}


@pytest.mark.timeout(60)
def test_metrics_name_their_model_and_say_what_they_leave_out(tmp_path: Path) -> None:
    """A metric on tip_v2's column was reported as tip's (the first model whose name
    prefixed it); rows a model failed on left every metric without a word; a clipped
    logit gave AUC 0.763 with an error bound of 4e-7 (exact: 0.828)."""
    x = np.arange(100)
    table = pa.table({"x": x, "y": (x % 3 == 0).astype(np.int8)})
    models = (
        chute.Model(
            "tip",
            _scores_failing_on_sevens,
            inputs=("x",),
            batch_format="numpy",
            on_error="quarantine",
        ),
        chute.Model("tip_v2", _score_again, inputs=("x",), batch_format="numpy"),
    )
    metrics = (
        M.AucRoc("y", "tip_v2_score"),
        M.AucRoc("y", "tip_score", name="clipped", score_range=(0.0, 0.5)),
        M.ColumnStats("x"),
    )
    report = chute.Job(
        source=chute.TableSource(table), models=models, metrics=metrics, engine="local"
    ).run()
    assert set(report.metrics) == {"tip", "tip_v2", "dataset"}
    assert "auc_roc" in report.metrics["tip_v2"] and "clipped" in report.metrics["tip"]
    kept = x[x % 7 != 0]
    assert report.metrics["dataset"]["column_stats"]["count"] == len(kept)
    rows = dict(report.rows())
    assert rows["metrics"] == f"over the rows written: the {100 - len(kept)} failed left out"
    clipped = report.metrics["tip"]["clipped"]
    exact = roc_auc_score(kept % 3 == 0, kept / 100)
    assert clipped["clipped"] > 0 and "clipped=" in rows["tip: clipped"]
    assert abs(clipped["auc_roc"] - exact) <= clipped["auc_error_bound"]
    assert abs(clipped["auc_roc"] - exact) > 1e-3  # the bound is honest, not small


class _ResultFails(M.ColumnStats):
    def result(self, state: M.State) -> dict[str, Any]:
        raise OverflowError("integer division result too large for a float")


@pytest.mark.timeout(60)
def test_a_metric_whose_result_fails_is_reported_and_the_output_finished(tmp_path: Path) -> None:
    """The results come after every unit is committed: a mean over two DBL_MAX values
    raised OverflowError there, no _SUCCESS or report was written, and every rerun of the
    job crashed the same way. The metric is now an error in the report; the run finishes."""
    table = pa.table({"x": np.arange(10.0)})
    report = chute.Job(
        source=chute.TableSource(table, unit_rows=5),
        models=(chute.Model("m", _score_again, inputs=("x",), batch_format="numpy"),),
        metrics=(_ResultFails("x", name="broken"), M.ColumnStats("x")),
        output=chute.Sink(str(tmp_path / "out")),
        engine="local",
    ).run()
    error = report.metrics["dataset"]["broken"]["error"]
    assert "'dataset/broken'" in error and "OverflowError" in error
    assert report.metrics["dataset"]["column_stats"]["sum"] == 45.0
    assert (tmp_path / "out" / "_SUCCESS").exists()
    saved = json.loads((tmp_path / "out" / "_chute" / "report.json").read_text())
    assert saved["metrics"]["dataset"]["broken"] == {"error": error}
    assert dict(report.rows())["dataset: broken"] == f"error: {error}"


class _PositiveRate:
    """A custom metric as the README shows one: no columns(), reads its label by name."""

    def __init__(self, label: str) -> None:
        self.label = label

    def init(self) -> M.State:
        return {"n": 0, "pos": 0}

    def update(self, state: M.State, table: pa.Table) -> M.State:
        y = table.column(self.label).to_numpy()
        return self.merge(state, {"n": len(y), "pos": int(y.sum())})

    def merge(self, a: M.State, b: M.State) -> M.State:
        return {"n": a["n"] + b["n"], "pos": a["pos"] + b["pos"]}

    def result(self, state: M.State) -> dict[str, Any]:
        return {"positives": state["pos"], "n": state["n"]}


class _ListState(_PositiveRate):
    def update(self, state: M.State, table: pa.Table) -> M.State:
        return {**state, "seen": [table.num_rows]}


class _Missing(_PositiveRate):
    def columns(self) -> list[str]:
        return ["x"]


def _custom_job(tmp_path: Path, metric: M.Metric) -> chute.Job:
    x = np.arange(40.0)
    path = tmp_path / "in.parquet"
    tmp_path.mkdir(exist_ok=True)
    pq.write_table(pa.table({"x": x, "y": (x % 4 == 0).astype(np.int8), "z": x}), path)
    model = chute.Model("m", _score_again, inputs=("x",), batch_format="numpy")
    return chute.Job(
        source=chute.FileSource(str(path)),
        models=(model,),
        carryover=("z",),
        metrics=(metric,),
        output=chute.Sink(str(tmp_path / "out")),
        engine="local",
    )


@pytest.mark.timeout(60)
def test_a_custom_metric_that_names_no_columns_gets_every_input_column(tmp_path: Path) -> None:
    """Its label, neither carried nor a model's input, was not read: after the whole
    compute the run stopped on "unexpected KeyError: 'Field "y" does not exist'"."""
    report = _custom_job(tmp_path, M.Custom(_PositiveRate("y"), "rate")).run()
    assert report.metrics["dataset"]["rate"] == {"positives": 10, "n": 40}
    sliced = M.Sliced(M.Custom(_PositiveRate("y"), "rate"), "z")
    report = _custom_job(tmp_path / "sliced", sliced).run()
    assert report.metrics["dataset"]["rate"]["all"] == {"positives": 10, "n": 40}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("metric", "message"),
    [
        pytest.param(
            M.Custom(_ListState("y"), "listed"),
            "metric 'dataset/listed' returned a state chute cannot keep.*not list",
            id="state-holds-a-list",
        ),
        pytest.param(
            M.Custom(_Missing("y"), "missing"),
            "metric 'dataset/missing' raised KeyError while measuring a batch.*columns",
            id="reads-a-column-it-did-not-name",
        ),
    ],
)
def test_a_failing_custom_metric_is_named(tmp_path: Path, metric: M.Metric, message: str) -> None:
    """These were "unexpected" errors that named neither the metric nor the fix."""
    with pytest.raises(chute.ChuteError, match=message):
        _custom_job(tmp_path, metric).run()


def _never_called(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    raise AssertionError("the model ran: the metric's column type was not checked first")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("metric", "message"),
    [
        pytest.param(
            M.AucRoc("tag", "m_score"), "'auc_roc' needs numbers .* 'tag'.* string", id="auc"
        ),
        pytest.param(M.Regression("tag", "m_score", name="mse"), "'mse' needs numbers", id="mse"),
        pytest.param(M.Histogram("tag"), "'histogram' needs numbers", id="histogram"),
        pytest.param(
            M.Multiclass("x", "m_proba", name="multiclass_accuracy"),
            "needs integer class indexes in 'x', but the input column is double",
            id="multiclass-label",
        ),
        pytest.param(M.metric_from_spec({"type": "mean", "column": "tag"}), "'mean'", id="mean"),
        pytest.param(
            M.Sliced(M.LogLoss("tag", "m_score"), "x"), "'log_loss' needs numbers", id="sliced"
        ),
    ],
)
def test_a_metric_on_an_input_column_of_the_wrong_type_fails_before_compute(
    tmp_path: Path, metric: M.Metric, message: str
) -> None:
    """These failed only once the models had loaded and batches run; ``chute validate``
    and ``chute plan`` passed them (and ``mean`` of a string column reported null)."""
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"x": [1.0, 2.0], "tag": ["a", "b"]}), path)
    job = chute.Job(
        source=chute.FileSource(str(path)),
        models=(chute.Model("m", _never_called, inputs=("x",), batch_format="numpy"),),
        metrics=(metric,),
        output=chute.Sink(str(tmp_path / "out")),
        engine="local",
    )
    with pytest.raises(chute.ConfigError, match=message):
        job.run()
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(60)
def test_column_metrics_of_a_decimal_column_read_it_as_floats(tmp_path: Path) -> None:
    """``mean`` of a decimal column reported null without a word."""
    from decimal import Decimal

    prices = pa.array([Decimal("1.50"), Decimal("2.25"), None], pa.decimal128(10, 2))
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"x": [1.0, 2.0, 3.0], "price": prices}), path)
    specs = [{"type": kind, "column": "price"} for kind in ("mean", "sum", "min", "max")]
    report = chute.Job(
        source=chute.FileSource(str(path)),
        models=(chute.Model("m", _score_again, inputs=("x",), batch_format="numpy"),),
        metrics=(*map(M.metric_from_spec, specs), M.Regression("price", "m_score")),
        output=chute.Sink(str(tmp_path / "out")),
        engine="local",
    ).run()
    found = report.metrics["dataset"]
    assert (found["mean"]["mean"], found["sum"]["sum"]) == (1.875, 3.75)
    assert (found["min"]["min"], found["max"]["max"]) == (1.5, 2.25)
    assert report.metrics["m"]["regression"]["count"] == 2


@pytest.mark.timeout(60)
def test_max_groups_passed_mid_run_leaves_the_unit_uncounted(tmp_path: Path) -> None:
    """The unit whose merge passed max_groups was counted before the merge raised: the
    partial report said 4 units and 40 rows in where the ledger held 3."""
    x = np.arange(60.0)
    table = pa.table({"x": x, "y": (x % 2).astype(np.int8), "grp": (x // 10).astype(np.int64)})
    out = tmp_path / "out"
    job = chute.Job(
        source=chute.TableSource(table, unit_rows=10),  # one group per unit
        models=(chute.Model("m", probability_of_x, inputs=("x",), batch_format="numpy"),),
        metrics=(M.Sliced(M.LogLoss("y", "m_p"), "grp", max_groups=3),),
        output=chute.Sink(str(out)),
        engine="local",
    )
    with pytest.raises(chute.ConfigError, match=r"max_groups=3.*--overwrite"):
        job.run()
    committed = (out / "_chute" / "ledger.jsonl").read_text().splitlines()
    report = json.loads((out / "_chute" / "report.json").read_text())
    assert len(committed) == 3
    assert (report["units_done"], report["rows_in"]) == (3, 30)


def probability_of_x(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"p": batch["x"] / 100}
