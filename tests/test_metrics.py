"""Metric accumulators without any engine: results against scikit-learn and NumPy on a
million rows cut into 200 uneven chunks, merged in many orders and tree shapes; edge cases,
state sizes, serialisation, slices, custom metrics and the spec registry."""

from __future__ import annotations

import functools
import itertools
import json
import math
import re
import textwrap
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from sklearn import metrics as skm
from sklearn.calibration import calibration_curve

from chute.errors import ColumnNotFoundError, ConfigError, DataError
from chute.metrics import (
    METRICS,
    AucRoc,
    Brier,
    Calibration,
    ColumnStats,
    Confusion,
    Custom,
    Histogram,
    LogLoss,
    Metric,
    Multiclass,
    PrAuc,
    Regression,
    Sliced,
    State,
    dumps,
    loads,
    metric_from_spec,
    state_from_text,
    state_to_text,
)
from chute.metrics.state import _exact_sums, add_states

pytestmark = pytest.mark.timeout(120)

ROWS = 1_000_000
CHUNKS = 200
CLASSES = 5
EXACT = 1e-9

# -- data: one million labelled rows, with nulls, NaNs and scores of exactly 0 and 1 --------


def _make_data(rows: int, seed: int = 7) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.random(rows) < 0.3
    score = np.clip(rng.beta(2, 5, rows) + 0.3 * y, 0, 1)
    score[rng.random(rows) < 0.002] = 0.0
    score[rng.random(rows) < 0.002] = 1.0
    y_class = rng.integers(0, CLASSES, rows)
    logits = rng.normal(size=(rows, CLASSES))
    logits[np.arange(rows), y_class] += 1.0
    proba = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    target = rng.normal(50.0, 3.0, rows)
    return {
        "y": y,
        "score": score,
        "score_null": rng.random(rows) < 0.001,  # becomes null in the table
        "score_nan": rng.random(rows) < 0.001,  # becomes NaN in the table
        "y_class": y_class,
        "proba": proba,
        "target": target,
        "pred": target + rng.normal(0.0, 2.0, rows),
        "group": rng.choice(np.array([1, 2, 3, 4, 5]), rows, p=[0.6, 0.25, 0.1, 0.04, 0.01]),
    }


def _to_table(d: dict[str, np.ndarray]) -> pa.Table:
    score = np.where(d["score_nan"], np.nan, d["score"])
    return pa.table(
        {
            "y": d["y"],
            "score": pa.array(score, mask=d["score_null"]),
            "y_class": d["y_class"],
            "proba": pa.FixedSizeListArray.from_arrays(pa.array(d["proba"].ravel()), CLASSES),
            "target": d["target"],
            "pred": d["pred"],
            "group": d["group"],
        }
    )


@pytest.fixture(scope="module")
def data() -> dict[str, np.ndarray]:
    return _make_data(ROWS)


@pytest.fixture(scope="module")
def table(data: dict[str, np.ndarray]) -> pa.Table:
    return _to_table(data)


@pytest.fixture(scope="module")
def chunks(table: pa.Table) -> list[pa.Table]:
    """200 chunks of very different sizes (a few of them empty)."""
    rng = np.random.default_rng(11)
    cuts = np.sort(rng.integers(0, ROWS, CHUNKS - 1) ** 2 // ROWS)
    bounds = [0, *cuts.tolist(), ROWS]
    return [table.slice(a, b - a) for a, b in itertools.pairwise(bounds)]


def _usable(d: dict[str, np.ndarray]) -> np.ndarray:
    """The binary rows the NaN policy keeps: score neither null nor NaN."""
    return ~(d["score_null"] | d["score_nan"])


# -- the metrics under test and their references ---------------------------------------

BUILD: dict[str, Callable[[], Metric]] = {
    "auc_roc": lambda: AucRoc("y", "score"),
    "pr_auc": lambda: PrAuc("y", "score"),
    "log_loss": lambda: LogLoss("y", "score"),
    "brier": lambda: Brier("y", "score"),
    "confusion": lambda: Confusion("y", "score", threshold=0.4),
    "calibration": lambda: Calibration("y", "score", bins=10),
    "multiclass": lambda: Multiclass("y_class", "proba", k=2),
    "regression": lambda: Regression("target", "pred"),
    "column_stats": lambda: ColumnStats("score"),
    "histogram": lambda: Histogram("target", bins=40, range=(40.0, 60.0)),
    "sliced_auc": lambda: Sliced(AucRoc("y", "score"), by="group"),
    "sliced_regression": lambda: Sliced(Regression("target", "pred"), by="group"),
}


@pytest.fixture(scope="module")
def chunk_states(chunks: list[pa.Table]) -> Callable[[str], tuple[Metric, list[State]]]:
    """Per metric: the state of every chunk, each through dumps/loads as in the ledger."""
    cache: dict[str, tuple[Metric, list[State]]] = {}

    def states(key: str) -> tuple[Metric, list[State]]:
        if key not in cache:
            metric = BUILD[key]()
            cache[key] = (metric, [loads(dumps(metric.update(metric.init(), c))) for c in chunks])
        return cache[key]

    return states


def _fold(metric: Metric, states: list[State]) -> State:
    return functools.reduce(metric.merge, states, metric.init())


def _balanced(metric: Metric, states: list[State]) -> State:
    while len(states) > 1:
        pairs = zip(states[::2], states[1::2], strict=False)
        states = [metric.merge(a, b) for a, b in pairs] + states[len(states) // 2 * 2 :]
    return states[0]


def _random_tree(metric: Metric, states: list[State], seed: int) -> State:
    """Merge two random states (in a random argument order) until one is left."""
    rng = np.random.default_rng(seed)
    states = list(states)
    while len(states) > 1:
        i, j = sorted(rng.choice(len(states), 2, replace=False).tolist())
        right, left = states.pop(j), states.pop(i)
        pair = (left, right) if rng.random() < 0.5 else (right, left)
        states.append(metric.merge(*pair))
    return states[0]


def _merged(chunk_states: Callable[[str], tuple[Metric, list[State]]], key: str) -> Any:
    metric, states = chunk_states(key)
    return metric.result(_fold(metric, states))


def _close(actual: float | None, expected: float, tolerance: float = EXACT) -> bool:
    return actual is not None and abs(actual - expected) <= tolerance


# -- every built-in against scikit-learn / NumPy ---------------------------------------


def test_auc_roc_within_its_computed_bound(data: dict[str, np.ndarray], chunk_states: Any) -> None:
    result = _merged(chunk_states, "auc_roc")
    ok = _usable(data)
    exact = skm.roc_auc_score(data["y"][ok], data["score"][ok])
    assert abs(result["auc_roc"] - exact) <= result["auc_error_bound"]
    assert 0 < result["auc_error_bound"] < 1e-4
    assert result["skipped"] == ROWS - ok.sum()
    assert result["positives"] == data["y"][ok].sum()


def test_pr_auc_within_its_computed_bound(data: dict[str, np.ndarray], chunk_states: Any) -> None:
    result = _merged(chunk_states, "pr_auc")
    ok = _usable(data)
    exact = skm.average_precision_score(data["y"][ok], data["score"][ok])
    assert abs(result["pr_auc"] - exact) <= result["pr_auc_error_bound"]
    assert 0 < result["pr_auc_error_bound"] < 1e-3


def test_sketch_bounds_hold_on_many_small_coarse_sketches() -> None:
    """With 2 to 9 bins the sketch errs a lot: the bound must still cover the error."""
    rng = np.random.default_rng(0)
    for trial in range(400):
        n = int(rng.integers(2, 200))
        y = np.r_[0, 1, rng.random(n) < rng.random()]
        draws = (rng.random(n + 2), np.round(rng.random(n + 2), 2), rng.beta(0.3, 0.3, n + 2))
        s = draws[trial % 3]
        s[rng.random(n + 2) < 0.1 * (trial % 2)] = 1.0
        sketch = AucRoc("y", "s", bins=int(rng.integers(2, 10)))
        result = sketch.result(sketch.update(sketch.init(), pa.table({"y": y, "s": s})))
        auc_error = abs(result["auc_roc"] - skm.roc_auc_score(y, s))
        pr_error = abs(result["pr_auc"] - skm.average_precision_score(y, s))
        assert auc_error <= result["auc_error_bound"] + 1e-12
        assert pr_error <= result["pr_auc_error_bound"] + 1e-12


NEGATIVES_FIRST_AP = sum(j / (10 + j) for j in range(1, 31)) / 30  # each positive below all


@pytest.mark.parametrize(
    ("positives", "negatives", "auc", "pr_auc"),
    [
        pytest.param((0.15, 0.24), (0.01, 0.1), 1.0, 1.0, id="positives-on-top"),
        pytest.param((0.01, 0.1), (0.15, 0.24), 0.0, NEGATIVES_FIRST_AP, id="negatives-on-top"),
    ],
)
def test_sketch_bounds_are_attained_in_the_worst_case(
    positives: tuple[float, float], negatives: tuple[float, float], auc: float, pr_auc: float
) -> None:
    """All rows in one inner bin, positives and negatives apart: the bounds are tight."""
    y = [1] * 30 + [0] * 10
    s = [*np.linspace(*positives, 30), *np.linspace(*negatives, 10)]
    sketch = AucRoc("y", "s", bins=4)
    result = sketch.result(sketch.update(sketch.init(), pa.table({"y": y, "s": s})))
    assert (result["auc_roc"], result["auc_error_bound"]) == (0.5, 0.5)
    assert skm.roc_auc_score(y, s) == auc  # the AUC error is the whole bound
    assert (result["pr_auc"], result["pr_auc_error_bound"]) == (0.75, 0.25)
    assert _close(skm.average_precision_score(y, s), pr_auc, 1e-12)
    assert abs(0.75 - pr_auc) <= 0.25  # attained on top; 0.1999 below (side bound 0.2000)


@pytest.mark.parametrize(
    ("key", "field", "reference"),
    [
        pytest.param("log_loss", "log_loss", skm.log_loss, id="log_loss"),
        pytest.param("brier", "brier", skm.brier_score_loss, id="brier"),
    ],
)
def test_probability_losses_equal_sklearn(
    data: dict[str, np.ndarray], chunk_states: Any, key: str, field: str, reference: Any
) -> None:
    ok = _usable(data)
    result = _merged(chunk_states, key)
    assert _close(result[field], reference(data["y"][ok], data["score"][ok]))
    assert result["count"] == ok.sum()


def test_confusion_metrics_equal_sklearn(data: dict[str, np.ndarray], chunk_states: Any) -> None:
    ok = _usable(data)
    truth, predicted = data["y"][ok], data["score"][ok] >= 0.4
    result = _merged(chunk_states, "confusion")
    assert _close(result["accuracy"], skm.accuracy_score(truth, predicted))
    assert _close(result["precision"], skm.precision_score(truth, predicted))
    assert _close(result["recall"], skm.recall_score(truth, predicted))
    assert _close(result["f1"], skm.f1_score(truth, predicted))
    counts = skm.confusion_matrix(truth, predicted).ravel().tolist()
    assert [result[k] for k in ("tn", "fp", "fn", "tp")] == counts


def test_calibration_equals_sklearn(data: dict[str, np.ndarray], chunk_states: Any) -> None:
    ok = _usable(data)
    y, s = data["y"][ok], data["score"][ok]
    result = _merged(chunk_states, "calibration")
    used = [b for b in result["bins"] if b["count"]]
    fraction, mean_score = calibration_curve(y, s, n_bins=10)
    np.testing.assert_allclose([b["fraction_positive"] for b in used], fraction, rtol=0, atol=EXACT)
    np.testing.assert_allclose([b["mean_score"] for b in used], mean_score, rtol=0, atol=EXACT)
    index = np.searchsorted(np.linspace(0, 1, 11)[1:-1], s)
    gaps = np.abs(np.bincount(index, weights=s) - np.bincount(index, weights=y))
    assert _close(result["ece"], gaps.sum() / len(s))


def test_multiclass_equals_sklearn(data: dict[str, np.ndarray], chunk_states: Any) -> None:
    y, proba = data["y_class"], data["proba"]
    result = _merged(chunk_states, "multiclass")
    assert _close(result["accuracy"], skm.accuracy_score(y, proba.argmax(axis=1)))
    assert _close(result["top_k_accuracy"], skm.top_k_accuracy_score(y, proba, k=2))
    assert _close(result["cross_entropy"], skm.log_loss(y, proba, labels=range(CLASSES)))
    assert result["confusion_matrix"] == skm.confusion_matrix(y, proba.argmax(axis=1)).tolist()


def test_regression_equals_sklearn(data: dict[str, np.ndarray], chunk_states: Any) -> None:
    y, p = data["target"], data["pred"]
    result = _merged(chunk_states, "regression")
    assert _close(result["mse"], skm.mean_squared_error(y, p))
    assert _close(result["rmse"], skm.root_mean_squared_error(y, p))
    assert _close(result["mae"], skm.mean_absolute_error(y, p))
    assert _close(result["r2"], skm.r2_score(y, p))
    assert _close(result["mean_prediction"], float(np.mean(p)))
    assert _close(result["mean_label"], float(np.mean(y)))


@pytest.mark.parametrize(
    ("offset", "spread"),
    [(1.7e9, 1.0), (1.7e9, 5.0), (1.7e18, 1e9), (0.0, 1.0)],
    ids=["epoch-seconds", "epoch-seconds-wide", "epoch-nanos", "plain"],
)
def test_r2_of_labels_with_a_large_offset_is_exact(offset: float, spread: float) -> None:
    """Each square rounded before it was summed: labels of 1.7e9 a second apart lost
    ``Σy² − (Σy)²/n`` in the rounding, and R² was 0.0 (or 0.9994) where it is 0.88."""
    rng = np.random.default_rng(7)
    y = offset + rng.random(4_000) * spread
    p = y + rng.normal(size=len(y)) * spread * 0.1
    metric = Regression(label="y", prediction="p")
    state = metric.init()
    for start in range(0, len(y), 250):  # units merged, as a run merges them
        piece = pa.table({"y": y[start : start + 250], "p": p[start : start + 250]})
        state = add_states(state, metric.summarize(piece))
    exact_y = [Fraction(v) for v in y.tolist()]
    mean = sum(exact_y) / len(y)
    residual = sum((Fraction(b) - a) ** 2 for a, b in zip(exact_y, p.tolist(), strict=True))
    total = sum((a - mean) ** 2 for a in exact_y)
    assert metric.result(state)["r2"] == float(1 - residual / total)


def test_r2_of_constant_labels_follows_sklearns_rule() -> None:
    """sklearn: 1.0 for a perfect fit of constant labels, 0.0 for an imperfect one (its own
    float sums make the spread of 0.3s not quite zero); chute said -6.5e14."""
    metric = Regression(label="y", prediction="p")
    y = np.full(1_000, 0.3)
    imperfect = metric.summarize(pa.table({"y": y, "p": y + 0.1}))
    perfect = metric.summarize(pa.table({"y": y, "p": y}))
    assert metric.result(imperfect)["r2"] == 0.0
    assert metric.result(perfect)["r2"] == 1.0


def test_column_stats_equal_numpy(data: dict[str, np.ndarray], chunk_states: Any) -> None:
    values = data["score"][~data["score_null"]]
    values = np.where(data["score_nan"][~data["score_null"]], np.nan, values)
    result = _merged(chunk_states, "column_stats")
    assert result["rows"] == ROWS
    assert result["null_count"] == data["score_null"].sum()
    assert result["nan_count"] == np.isnan(values).sum()
    assert result["count"] == (~np.isnan(values)).sum()
    assert _close(result["sum"], float(np.nansum(values)), EXACT * ROWS)  # a relative 1e-9
    assert _close(result["mean"], float(np.nanmean(values)))
    assert (result["min"], result["max"]) == (np.nanmin(values), np.nanmax(values)) == (0.0, 1.0)


def test_histogram_equals_numpy(data: dict[str, np.ndarray], chunk_states: Any) -> None:
    x = data["target"]
    result = _merged(chunk_states, "histogram")
    counts, edges = np.histogram(x, bins=40, range=(40.0, 60.0))
    assert result["counts"] == counts.tolist()
    assert result["edges"] == edges.tolist()
    assert result["underflow"] == (x < 40).sum() > 0
    assert result["overflow"] == (x > 60).sum() > 0


def test_sliced_groups_equal_sklearn_per_group(
    data: dict[str, np.ndarray], chunk_states: Any
) -> None:
    result = _merged(chunk_states, "sliced_auc")
    ok = _usable(data)
    assert result["by"] == "group"
    assert sorted(result["groups"]) == ["1", "2", "3", "4", "5"]
    for value, group in result["groups"].items():
        rows = ok & (data["group"] == int(value))
        exact = skm.roc_auc_score(data["y"][rows], data["score"][rows])
        assert abs(group["auc_roc"] - exact) <= group["auc_error_bound"]
    assert result["all"] == _merged(chunk_states, "auc_roc")


def test_sliced_regression_all_equals_unsliced(chunk_states: Any) -> None:
    result = _merged(chunk_states, "sliced_regression")
    assert result["all"] == _merged(chunk_states, "regression")
    assert sum(g["count"] for g in result["groups"].values()) == ROWS


# -- merge order, tree shape and batch size do not change a single bit -----------------


@pytest.mark.parametrize("key", list(BUILD))
def test_result_is_independent_of_merge_order_tree_and_batching(
    key: str, chunk_states: Any, table: pa.Table
) -> None:
    metric, states = chunk_states(key)
    expected = metric.result(_fold(metric, states))
    assert metric.result(_fold(metric, states[::-1])) == expected
    shuffled = [states[i] for i in np.random.default_rng(3).permutation(len(states))]
    assert metric.result(_fold(metric, shuffled)) == expected
    assert metric.result(_balanced(metric, states)) == expected
    assert metric.result(_balanced(metric, shuffled)) == expected
    assert metric.result(_random_tree(metric, states, seed=5)) == expected
    assert metric.result(metric.update(metric.init(), table)) == expected  # one batch


def test_merge_does_not_modify_its_arguments(chunk_states: Any) -> None:
    metric, states = chunk_states("sliced_auc")
    before = [dumps(s) for s in states[:3]]
    metric.merge(metric.merge(states[0], states[1]), states[2])
    assert [dumps(s) for s in states[:3]] == before


# -- edge cases ------------------------------------------------------------------------


@pytest.mark.parametrize("key", list(BUILD))
def test_empty_state_is_the_identity_and_reports_nothing(
    key: str, chunk_states: Any, table: pa.Table
) -> None:
    metric, states = chunk_states(key)
    state = states[1]
    for merged in (metric.merge(metric.init(), state), metric.merge(state, metric.init())):
        assert metric.result(merged) == metric.result(state)
    empty = metric.update(metric.init(), table.slice(0, 0))
    assert metric.result(metric.merge(empty, state)) == metric.result(state)
    for nothing in (metric.init(), empty):
        json.dumps(metric.result(nothing), allow_nan=False)  # JSON-able, no NaN


def _binary(y: list[Any], score: list[Any]) -> pa.Table:
    return pa.table({"y": pa.array(y), "score": pa.array(score, pa.float64())})


@pytest.mark.parametrize(
    ("labels", "auc", "pr_auc"),
    [
        pytest.param([0, 0, 0, 0], None, None, id="all-negative"),
        pytest.param([1, 1, 1, 1], None, 1.0, id="all-positive"),
    ],
)
def test_one_class_has_no_auc(labels: list[int], auc: Any, pr_auc: Any) -> None:
    table = _binary(labels, [0.1, 0.4, 0.6, 0.9])
    metric = AucRoc("y", "score")
    result = metric.result(metric.update(metric.init(), table))
    assert (result["auc_roc"], result["pr_auc"]) == (auc, pr_auc)
    losses = LogLoss("y", "score")
    expected = skm.log_loss(labels, [0.1, 0.4, 0.6, 0.9], labels=[0, 1])
    assert _close(losses.result(losses.update(losses.init(), table))["log_loss"], expected)


def test_scores_of_exactly_zero_and_one() -> None:
    y = [0, 1, 0, 1, 1, 0, 1, 0]
    s = [0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.5, 0.5]
    table = _binary(y, s)
    sketch = AucRoc("y", "score")
    result = sketch.result(sketch.update(sketch.init(), table))
    assert _close(result["auc_roc"], skm.roc_auc_score(y, s))  # only ties share a bin
    assert _close(result["pr_auc"], skm.average_precision_score(y, s))
    for metric, reference in ((LogLoss("y", "score"), skm.log_loss), (Brier("y", "score"), None)):
        value = metric.result(metric.update(metric.init(), table))
        expected = reference(y, s) if reference else float(np.mean((np.array(s) - y) ** 2))
        assert _close(value[metric.name], expected)


def test_calibration_bins_at_their_edges_equal_sklearn() -> None:
    y = [0, 1, 1, 0, 1, 0, 1, 1]
    s = [0.0, 0.1, 0.2, 0.2, 0.5, 0.7, 0.9, 1.0]  # on bin edges: closed on the right
    metric = Calibration("y", "score", bins=10)
    result = metric.result(metric.update(metric.init(), _binary(y, s)))
    fraction, mean_score = calibration_curve(y, s, n_bins=10)
    used = [b for b in result["bins"] if b["count"]]
    assert [b["fraction_positive"] for b in used] == fraction.tolist()
    assert [b["mean_score"] for b in used] == pytest.approx(mean_score.tolist(), abs=EXACT)


def test_rows_with_null_nan_or_inf_are_skipped_and_counted() -> None:
    clean = _binary([0, 1, 1, 0], [0.2, 0.7, 0.4, 0.1])
    dirty = _binary(
        [0, 1, None, 1, 1, 0, 0],
        [0.2, 0.7, 0.9, None, 0.4, math.nan, 0.1],
    )
    dirty = pa.concat_tables([dirty, _binary([1], [math.inf])])
    for metric in (AucRoc("y", "score"), LogLoss("y", "score"), Confusion("y", "score")):
        expected = metric.result(metric.update(metric.init(), clean))
        result = metric.result(metric.update(metric.init(), dirty))
        assert result.pop("skipped") == 4
        expected.pop("skipped")
        assert result == expected


def test_column_stats_policy_for_nulls_nans_infinities_and_strings() -> None:
    table = pa.table(
        {
            "x": pa.array([1.5, None, math.nan, math.inf, -2.0]),
            "name": pa.array(["a", None, "b", "c", None]),
        }
    )
    stats = ColumnStats("x")
    result = stats.result(stats.update(stats.init(), table))
    assert result == {
        "count": 3,
        "sum": math.inf,
        "mean": math.inf,
        "min": -2.0,
        "max": math.inf,
        "null_count": 1,
        "nan_count": 1,
        "rows": 5,
    }
    names = ColumnStats("name")
    result = names.result(names.update(names.init(), table))
    assert [result[k] for k in ("count", "null_count", "sum", "min")] == [3, 2, None, None]


@pytest.mark.parametrize(
    ("y", "p"),
    [
        pytest.param([1.0, 2.0, 3.0, 4.0], [4.0, 5.0, 6.0, 1e200], id="prediction-squares-to-inf"),
        pytest.param([1.0, 2.0, 3.0, 1e200], [4.0, 5.0, 6.0, 7.0], id="label-squares-to-inf"),
        pytest.param([1.0, -1e308, 3.0], [4.0, 1e308, 6.0], id="error-beyond-float-range"),
        pytest.param([1.0, 1e200, 3.0], [4.0, 1e200, 6.0], id="huge-but-exact"),
    ],
)
def test_regression_of_values_whose_squares_pass_the_float_range(
    y: list[float], p: list[float]
) -> None:
    # the squares were summed as inf, each one cast to a wrong integer in silence: every
    # prediction off by 3 and one of 1e200 reported mse=7.967; with labels of 1e200 the
    # result raised ValueError from math.sqrt of a negative mse
    regression = Regression("y", "p")
    result = regression.result(regression.update(regression.init(), pa.table({"y": y, "p": p})))
    errors = [Fraction(b) - Fraction(a) for a, b in zip(y, p, strict=True)]
    exact_mse = sum(e * e for e in errors) / len(y)
    mse = float(exact_mse) if exact_mse < Fraction(np.finfo(np.float64).max) else math.inf
    assert result["mse"] == mse
    assert result["rmse"] == math.sqrt(mse)
    assert result["mae"] == pytest.approx(float(sum(abs(e) for e in errors) / len(y)))
    assert result["r2"] is not None and not math.isnan(result["r2"])


def test_column_stats_sum_beyond_the_float_range_is_inf() -> None:
    # float() of the exact sum raised OverflowError, in the report, after every unit was
    # committed: the run could never be finished
    biggest = float(np.finfo(np.float64).max)
    stats = ColumnStats("x")
    result = stats.result(stats.update(stats.init(), pa.table({"x": [biggest, biggest]})))
    assert (result["sum"], result["mean"], result["max"]) == (math.inf, biggest, biggest)
    negative = stats.result(stats.update(stats.init(), pa.table({"x": [-biggest, -biggest]})))
    assert (negative["sum"], negative["mean"]) == (-math.inf, -biggest)


def test_exact_sums_refuse_values_that_are_not_finite() -> None:
    with pytest.raises(ValueError, match="finite"):
        _exact_sums(np.array([1.0, math.inf]))


def test_histogram_edges_and_out_of_range_values() -> None:
    x = [0.0, 0.5, 0.999, 1.0, -0.1, 1.1, math.nan, None, math.inf]
    hist = Histogram("x", bins=2, range=(0.0, 1.0))
    result = hist.result(hist.update(hist.init(), pa.table({"x": pa.array(x)})))
    assert result["counts"] == [1, 3]  # the last bin includes the upper edge, as NumPy's
    assert (result["underflow"], result["overflow"], result["skipped"]) == (1, 2, 2)


@pytest.mark.parametrize(
    ("metric", "table", "message"),
    [
        pytest.param(AucRoc("y", "score"), _binary([0, 2], [0.1, 0.2]), "0/1", id="label-not-0-1"),
        pytest.param(LogLoss("y", "score"), _binary([0, 1], [0.1, 3.0]), "[0, 1]", id="not-prob"),
        pytest.param(
            Multiclass("c", "p"),
            pa.table({"c": [0, 3], "p": [[0.5, 0.5], [0.2, 0.8]]}),
            "[0, 2)",
            id="class-out-of-range",
        ),
        pytest.param(
            Multiclass("c", "p"),
            pa.table({"c": [0, 1], "p": [[0.5, 0.5], [0.2, 0.3, 0.5]]}),
            "2 class scores",
            id="ragged-lists",
        ),
    ],
)
def test_bad_data_raises_data_error(metric: Metric, table: pa.Table, message: str) -> None:
    with pytest.raises(DataError, match=re.escape(message)):
        metric.update(metric.init(), table)


def test_missing_and_mistyped_columns_raise_config_errors() -> None:
    with pytest.raises(ColumnNotFoundError, match="Did you mean 'score'"):
        AucRoc("y", "scor").update(AucRoc("y", "scor").init(), _binary([0, 1], [0.1, 0.2]))
    table = pa.table({"y": [0, 1], "score": [[0.1, 0.9], [0.8, 0.2]]})
    with pytest.raises(ConfigError, match="multiclass"):
        Confusion("y", "score").update(Confusion("y", "score").init(), table)


def test_multiclass_infers_classes_from_list_columns_and_ranks_ties_as_sklearn() -> None:
    proba = [[0.2, 0.4, 0.4], [0.5, 0.25, 0.25], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]]
    y = [1, 2, 2, 0]
    metric = Multiclass("c", "p", k=2)
    state = metric.update(metric.init(), pa.table({"c": y, "p": proba}))  # list<double>
    result = metric.result(state)
    assert _close(result["top_k_accuracy"], skm.top_k_accuracy_score(y, proba, k=2))
    assert _close(result["cross_entropy"], skm.log_loss(y, proba))
    assert len(result["confusion_matrix"]) == 3
    with pytest.raises(DataError, match="number of classes"):
        metric.merge(state, metric.update(metric.init(), pa.table({"c": [0], "p": [[1.0, 0.0]]})))


# -- state sizes and serialisation -----------------------------------------------------


def _footprint(value: Any) -> int:
    """Bytes a state holds in memory: arrays' buffers, integers' bits, nested dicts."""
    if isinstance(value, dict):
        return sum(_footprint(v) for v in value.values())
    if isinstance(value, np.ndarray) and value.dtype == object:
        return sum(_footprint(int(v)) for v in value.ravel())
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, int):
        return max(8, (abs(value).bit_length() + 7) // 8)
    return 8


@pytest.mark.parametrize("key", list(BUILD))
def test_state_size_does_not_grow_with_rows(key: str, chunk_states: Any, table: pa.Table) -> None:
    metric, states = chunk_states(key)
    small = metric.update(metric.init(), table.slice(0, 10_000))
    large = _fold(metric, states)
    # Exact sums gain a bit per doubling of the rows; everything else has a fixed shape.
    assert _footprint(large) <= _footprint(small) + 64
    per_group = len(large["groups"]) if "groups" in large else 1
    assert len(dumps(large)) <= 32 * 1024 * per_group  # a score sketch is ~23 KB at 1e6 rows


def test_serialisation_round_trips_exactly(chunk_states: Any) -> None:
    for key in BUILD:
        metric, states = chunk_states(key)
        state = _fold(metric, states)
        again = state_from_text(state_to_text(state))
        assert metric.result(again) == metric.result(state)
        assert dumps(again) == dumps(state)


def test_serialisation_rejects_foreign_values_and_bytes() -> None:
    with pytest.raises(TypeError, match="list"):
        dumps({"values": [1, 2]})
    with pytest.raises(DataError, match="metric state"):
        loads(b"not a state")


# -- curves for the report -------------------------------------------------------------


def test_curves_are_downsampled_and_match_the_areas(chunk_states: Any) -> None:
    metric, states = chunk_states("auc_roc")
    state = _fold(metric, states)
    result = metric.result(state)
    fpr, tpr = AucRoc("y", "score").curve(state)
    recall, precision = PrAuc("y", "score").curve(state)
    for xs, ys in ((fpr, tpr), (recall, precision)):
        assert 2 < len(xs) <= 1000 and len(xs) == len(ys)
        assert np.all(np.diff(xs) >= 0) and xs[0] == 0 and xs[-1] == 1
    assert (tpr[0], tpr[-1], precision[0]) == (0.0, 1.0, 1.0)
    assert abs(np.trapezoid(tpr, fpr) - result["auc_roc"]) < 1e-3
    assert abs(np.sum(np.diff(recall) * precision[1:]) - result["pr_auc"]) < 1e-2


# -- slices ----------------------------------------------------------------------------


def test_slices_key_nulls_and_strings() -> None:
    table = pa.table(
        {
            "y": [0, 1, 1, 0, 1, 0],
            "score": [0.1, 0.8, 0.6, 0.3, 0.9, 0.7],
            "vendor": ["a", "a", None, None, "b", "b"],
        }
    )
    sliced = Sliced(Confusion("y", "score"), by="vendor")
    result = sliced.result(sliced.update(sliced.init(), table))
    assert sorted(result["groups"]) == ["a", "b", "null"]
    assert result["groups"]["b"]["tp"] == 1 and result["groups"]["b"]["fp"] == 1
    assert result["all"]["accuracy"] == 5 / 6


def test_too_many_groups_is_a_config_error_naming_metric_column_cap_and_fix() -> None:
    sliced = Sliced(AucRoc("y", "score", name="tip_auc"), by="trip_id", max_groups=100)
    table = pa.table({"y": [0, 1] * 60, "score": [0.5] * 120, "trip_id": list(range(120))})
    with pytest.raises(ConfigError) as info:
        sliced.update(sliced.init(), table)
    message = str(info.value)
    for part in ("'tip_auc'", "'trip_id'", "max_groups=100", "low-cardinality", "raise max_groups"):
        assert part in message
    # Two states within the cap can still exceed it together.
    first = sliced.update(sliced.init(), table.slice(0, 60))
    second = sliced.update(sliced.init(), table.slice(60))
    with pytest.raises(ConfigError, match="max_groups=100"):
        sliced.merge(first, second)


def test_exactly_max_groups_is_allowed() -> None:
    sliced = Sliced(ColumnStats("x"), by="g", max_groups=3)
    ok = sliced.update(sliced.init(), pa.table({"x": [1, 2, 3], "g": [1, 2, None]}))
    assert len(ok["groups"]) == 3
    with pytest.raises(ConfigError, match="max_groups=3"):
        sliced.update(ok, pa.table({"x": [4], "g": [4]}))


# -- custom metrics --------------------------------------------------------------------


class PositiveRate(Metric):
    """The documented example: a subclass with the default (adding) merge."""

    name = "positive_rate"

    def __init__(self, label: str) -> None:
        self.label = label

    def columns(self) -> list[str]:
        return [self.label]

    def init(self) -> State:
        return {"n": 0, "pos": 0}

    def update(self, state: State, table: pa.Table) -> State:
        y = table.column(self.label).to_numpy()
        return self.merge(state, {"n": len(y), "pos": int(y.sum())})

    def result(self, state: State) -> dict[str, Any]:
        return {"positive_rate": state["pos"] / state["n"] if state["n"] else None}


def test_custom_subclass_merges_and_slices(chunks: list[pa.Table], data: Any) -> None:
    metric = Sliced(PositiveRate("y"), by="group")
    states = [metric.update(metric.init(), c) for c in chunks[:50]]
    rows = sum(c.num_rows for c in chunks[:50])
    result = metric.result(_balanced(metric, states))
    assert _close(result["all"]["positive_rate"], data["y"][:rows].mean())
    for value, group in result["groups"].items():
        y = data["y"][:rows][data["group"][:rows] == int(value)]
        assert _close(group["positive_rate"], y.mean())


CUSTOM_FILE = """
    import numpy as np

    class MaxAbsError:  # not a Metric subclass: only init/update/merge/result
        def __init__(self, label, score):
            self.label, self.score = label, score

        def columns(self):
            return [self.label, self.score]

        def init(self):
            return {"max": 0.0}

        def update(self, state, table):
            gap = np.abs(table[self.score].to_numpy() - table[self.label].to_numpy())
            return self.merge(state, {"max": float(gap.max(initial=0.0))})

        def merge(self, a, b):
            return {"max": max(a["max"], b["max"])}

        def result(self, state):
            return {"max_abs_error": state["max"]}
"""


def test_custom_duck_typed_metric_from_spec(tmp_path: Path, data: Any, chunks: Any) -> None:
    path = tmp_path / "my_metrics.py"
    path.write_text(textwrap.dedent(CUSTOM_FILE))
    spec = {"type": f"{path}:MaxAbsError", "label": "target", "score": "pred", "name": "worst"}
    metric = metric_from_spec(spec)
    assert isinstance(metric, Custom) and metric.name == "worst"
    assert metric.columns() == ["target", "pred"]
    state = functools.reduce(metric.update, chunks, metric.init())
    expected = float(np.abs(data["pred"] - data["target"]).max())
    assert metric.result(loads(dumps(state))) == {"max_abs_error": expected}


def test_a_custom_metric_subclass_reads_the_columns_its_spec_lists(tmp_path: Path) -> None:
    # the spec's columns: was dropped for a Metric subclass without columns()
    path = tmp_path / "subclassed.py"
    path.write_text(
        "from chute.metrics import Metric\n"
        "class Rows(Metric):\n"
        "    def __init__(self, label):\n"
        "        self.label = label\n"
    )
    metric = metric_from_spec({"type": f"{path}:Rows", "label": "y", "columns": ["y"]})
    assert metric.columns() == ["y"] and metric.name == "Rows"
    assert metric_from_spec({"type": f"{path}:Rows", "label": "y"}).columns() == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        pytest.param({}, "not a metric", id="not-a-metric"),
        pytest.param({"label": "y"}, "takes no options", id="object-with-options"),
    ],
)
def test_custom_spec_errors(tmp_path: Path, options: dict[str, Any], message: str) -> None:
    path = tmp_path / "nothing.py"
    path.write_text("VALUE = 3\n")
    with pytest.raises(ConfigError, match=message):
        metric_from_spec({"type": f"{path}:VALUE", **options})


# -- the spec registry -----------------------------------------------------------------


def _spec_for(kind: str) -> dict[str, Any]:
    cls = METRICS[kind]
    if issubclass(cls, (ColumnStats, Histogram)):
        return {"type": kind, "column": "score"}
    if cls is Multiclass:
        return {"type": kind, "label": "y_class", "score": "proba"}
    if cls is Regression:
        return {"type": kind, "label": "target", "score": "pred"}  # score= means prediction=
    return {"type": kind, "label": "y", "score": "score"}


@pytest.mark.parametrize("kind", sorted(METRICS))
def test_every_registered_type_builds_and_runs(kind: str, table: pa.Table) -> None:
    metric = metric_from_spec(_spec_for(kind))
    assert isinstance(metric, METRICS[kind]) and metric.name == kind
    result = metric.result(metric.update(metric.init(), table.slice(0, 1000)))
    json.dumps(result, allow_nan=False)


def test_spec_with_by_is_sliced_and_keeps_its_options(table: pa.Table) -> None:
    spec = {
        "type": "f1",
        "label": "y",
        "score": "score",
        "threshold": 0.7,
        "by": "group",
        "max_groups": 5,
        "name": "tip_f1",
    }
    metric = metric_from_spec(spec)
    assert isinstance(metric, Sliced) and metric.name == "tip_f1" and metric.max_groups == 5
    assert metric.columns() == ["y", "score", "group"]
    result = metric.result(metric.update(metric.init(), table.slice(0, 5000)))
    assert result["all"]["threshold"] == 0.7


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param({"type": "auc_rco", "label": "y"}, "Did you mean 'auc_roc'", id="type"),
        pytest.param(
            {"type": "accuracy", "label": "y", "score": "s", "treshold": 0.3},
            "Did you mean 'threshold'",
            id="option",
        ),
        pytest.param({"label": "y"}, "needs a 'type'", id="no-type"),
        pytest.param(
            {"type": "histogram", "column": "x", "bins": 0},
            "option bins: 0 is not a whole number of at least 1",
            id="value",
        ),
    ],
)
def test_bad_specs_raise_config_errors(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        metric_from_spec(spec)


def test_a_slice_keeps_null_and_the_string_null_apart() -> None:
    values = [None, "null", "a", "null", None, None, '"null"', "b"]
    table = pa.table({"g": values, "y": [float(i) for i in range(len(values))]})
    sliced = Sliced(ColumnStats("y", name="count"), by="g")
    result = sliced.result(sliced.update(sliced.init(), table))
    counts = {label: group["count"] for label, group in result["groups"].items()}
    assert counts == {"null": 3, '"null"': 2, "a": 1, '"\\"null\\""': 1, "b": 1}
    assert result["all"]["count"] == len(values)


def test_slices_by_a_categorical_column_count_every_row_once() -> None:
    """A pandas categorical arrives as an Arrow dictionary column: its nulls crashed
    (``bincount`` of a negative code), a category listed twice in its dictionary lost the
    rows of one of them, and categories no row uses counted against ``max_groups``."""
    from chute.metrics import LogLoss, Sliced

    dictionary = pa.array(["card", "cash", "card", *[f"unused{i}" for i in range(200)]])
    indices = pa.array([0, 1, 2, None, 0, 1, 2, None], pa.int32())
    by = pa.DictionaryArray.from_arrays(indices, dictionary)
    table = pa.table({"pay": by, "y": [1, 0, 1, 0, 1, 0, 1, 0], "p": [0.5] * 8})
    sliced = Sliced(LogLoss("y", "p"), by="pay", max_groups=5)
    result = sliced.result(sliced.update(sliced.init(), table))
    counts = {key: group["count"] for key, group in result["groups"].items()}
    assert counts == {"card": 4, "cash": 2, "null": 2}


def test_a_score_column_of_only_nulls_is_skipped_rows_not_a_wrong_type() -> None:
    """A batch whose predictions were all None has a null-typed column: the metric counts
    its rows as skipped, as it would any null score, instead of refusing the type."""
    from chute.metrics import LogLoss

    metric = LogLoss("y", "p")
    nulls = pa.table({"y": [0, 1], "p": pa.nulls(2)})
    result = metric.result(metric.update(metric.init(), nulls))
    assert result["count"] == 0 and result["skipped"] == 2
