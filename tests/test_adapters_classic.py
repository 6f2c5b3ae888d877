"""The classic adapters on real models trained here: scikit-learn, XGBoost, LightGBM, ONNX
(exported with skl2onnx, and built with onnx.helper), Keras 3 on the torch backend.

Each test compares chute's output with the framework called directly on the same rows:
labels exactly, floats to 1e-5, rows in input order, carryover columns intact.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import chute
from chute import ConfigError, Job, JobStateError, Model, ModelError, ResourceError
from chute.cli import main
from chute.job import Resources, Sink
from chute.models import ADAPTERS, ReplicaContext, adapter, register
from chute.models.pickles import is_pickle
from chute.sources import FileSource

ROWS = 600
FEATURES = ["x0", "x1", "x2", "x3"]
INPUTS = ["x0", "x1", "x2", "x3"]


@pytest.fixture(scope="module")
def data() -> dict[str, Any]:
    """Features, three kinds of target, and carryover columns (an id and a string)."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(ROWS, 4))
    binary = (x[:, 0] + 0.5 * x[:, 1] + rng.normal(scale=0.5, size=ROWS) > 0).astype(np.int64)
    multi = np.digitize(x[:, 0] + x[:, 2], [-0.7, 0.7]).astype(np.int64)
    value = 3.0 * x[:, 0] - 2.0 * x[:, 3] + rng.normal(scale=0.1, size=ROWS)
    table = pa.table(
        {
            "id": np.arange(ROWS, dtype=np.int64)[::-1].copy(),
            "name": [f"row-{i}" for i in range(ROWS)],
            **{f: x[:, i] for i, f in enumerate(FEATURES)},
        }
    )
    return {"x": x, "binary": binary, "multi": multi, "value": value, "table": table}


def run(data: dict[str, Any], spec: Any, engine: str = "local", **model: Any) -> pd.DataFrame:
    """chute.predict over the in-memory table; carryover id and name."""
    frame = chute.predict(
        data["table"],
        Model("m", spec, inputs=model.pop("inputs", INPUTS), **model),
        carryover=["id", "name"],
        engine=engine,  # type: ignore[arg-type]
    )
    assert list(frame["id"]) == list(data["table"]["id"].to_pylist())  # order and carryover
    assert list(frame["name"]) == data["table"]["name"].to_pylist()
    return frame


def lists(column: pd.Series) -> np.ndarray:
    return np.stack(column.to_numpy())


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, " ".join(result.output.split())


# --- scikit-learn ----------------------------------------------------------------------------


def _skops(tmp_path: Path, estimator: Any, name: str = "model.skops") -> str:
    import skops.io

    path = tmp_path / name
    skops.io.dump(estimator, path)
    return str(path)


@pytest.mark.timeout(120)
def test_sklearn_binary_classifier_label_and_score_on_both_engines(
    data: dict[str, Any], tmp_path: Path, engine: str
) -> None:
    from sklearn.linear_model import LogisticRegression

    clf = LogisticRegression().fit(data["x"], data["binary"])
    frame = run(data, adapter("sklearn", path=_skops(tmp_path, clf)), engine)
    assert list(frame.columns) == ["id", "name", "m_label", "m_score"]
    np.testing.assert_array_equal(frame["m_label"], clf.predict(data["x"]))
    np.testing.assert_allclose(frame["m_score"], clf.predict_proba(data["x"])[:, 1], atol=1e-5)


@pytest.mark.timeout(60)
def test_sklearn_multiclass_probabilities_as_a_float32_list(
    data: dict[str, Any], tmp_path: Path
) -> None:
    from sklearn.ensemble import RandomForestClassifier

    clf = RandomForestClassifier(n_estimators=10, random_state=0).fit(data["x"], data["multi"])
    frame = run(data, adapter("sklearn", path=_skops(tmp_path, clf)))
    proba = clf.predict_proba(data["x"])
    np.testing.assert_array_equal(frame["m_label"], clf.predict(data["x"]))
    np.testing.assert_allclose(lists(frame["m_proba"]), proba, atol=1e-5)
    np.testing.assert_allclose(frame["m_score"], proba.max(axis=1), atol=1e-5)
    table = chute.Job(
        chute.TableSource(data["table"]),
        [Model("m", adapter("sklearn", path=_skops(tmp_path, clf)), inputs=INPUTS)],
    ).run()
    assert table.result is not None
    assert table.result.schema.field("m_proba").type == pa.list_(pa.float32(), 3)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["mlp", "forest", "search"])
def test_a_classifier_fitted_on_several_labels_a_row_gives_its_labels(
    data: dict[str, Any], tmp_path: Path, kind: str
) -> None:
    """A multi-label MLPClassifier's predict_proba (each label's own probability) was read
    as one class among three: label 2 where predict says [1, 0, 1], exit 0; a forest's
    failed naming a "classes" option the adapter does not have."""
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.neural_network import MLPClassifier

    labels = np.stack([data["binary"], data["multi"] == 2, data["x"][:, 3] > 0], axis=1)
    labels = labels.astype(np.int64)
    from sklearn.model_selection import GridSearchCV

    mlp = MLPClassifier(hidden_layer_sizes=(8,), max_iter=300, random_state=0)
    clf = {
        "mlp": mlp,
        "forest": RandomForestClassifier(n_estimators=5, random_state=0),
        "search": GridSearchCV(mlp, {"alpha": [1e-4, 1e-3]}, cv=2),  # its best estimator's
    }[kind].fit(data["x"], labels)
    path = _skops(tmp_path, clf)
    frame = run(data, adapter("sklearn", path=path))
    np.testing.assert_array_equal(lists(frame["m_label"]), clf.predict(data["x"]))
    with pytest.raises(ConfigError, match=r"several labels a row .* Use method: predict"):
        run(data, adapter("sklearn", path=path, method="predict_proba"))


@pytest.mark.timeout(60)
def test_sklearn_string_labels_threshold_and_renamed_outputs(
    data: dict[str, Any], tmp_path: Path
) -> None:
    from sklearn.linear_model import LogisticRegression

    names = np.array(["no", "yes"])[data["binary"]]
    clf = LogisticRegression().fit(data["x"], names)
    spec = adapter("sklearn", path=_skops(tmp_path, clf), threshold=0.8, outputs={"score": "p_yes"})
    frame = run(data, spec)
    p_yes = clf.predict_proba(data["x"])[:, 1]
    assert list(frame.columns) == ["id", "name", "m_label", "m_p_yes"]
    np.testing.assert_array_equal(frame["m_label"], np.where(p_yes >= 0.8, "yes", "no"))
    np.testing.assert_allclose(frame["m_p_yes"], p_yes, atol=1e-5)
    # two outputs under one name: the probabilities replaced the labels in silence
    with pytest.raises(ModelError, match="'label' and 'score' would both be named 'label'"):
        run(data, adapter("sklearn", path=_skops(tmp_path, clf), outputs={"score": "label"}))
    with pytest.raises(ConfigError, match="'label' and 'score' would both be named 'p'"):
        run(
            data,
            adapter("sklearn", path=_skops(tmp_path, clf), outputs={"label": "p", "score": "p"}),
        )


@pytest.mark.timeout(60)
def test_sklearn_regressor_pipeline_fitted_on_a_dataframe_gets_columns_by_name(
    data: dict[str, Any], tmp_path: Path
) -> None:
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    frame_x = pd.DataFrame(data["x"], columns=FEATURES)
    reg = make_pipeline(StandardScaler(), Ridge()).fit(frame_x, data["value"])
    # the inputs in another order than the fit: columns are picked by name
    frame = run(data, adapter("sklearn", path=_skops(tmp_path, reg)), inputs=FEATURES[::-1])
    assert list(frame.columns) == ["id", "name", "m_value"]
    np.testing.assert_allclose(frame["m_value"], reg.predict(frame_x), atol=1e-5)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "method",
    [pytest.param("decision_function", id="decision"), pytest.param("transform", id="transform")],
)
def test_sklearn_decision_function_and_transform(
    data: dict[str, Any], tmp_path: Path, method: str
) -> None:
    from sklearn.decomposition import PCA
    from sklearn.svm import LinearSVC

    x = data["x"]
    if method == "transform":
        est = PCA(n_components=2).fit(x)
        frame = run(data, adapter("sklearn", path=_skops(tmp_path, est), method=method))
        np.testing.assert_allclose(lists(frame["m_features"]), est.transform(x), atol=1e-5)
        return
    est = LinearSVC().fit(x, data["multi"])
    frame = run(data, adapter("sklearn", path=_skops(tmp_path, est), method=method))
    np.testing.assert_array_equal(frame["m_label"], est.predict(x))
    np.testing.assert_allclose(lists(frame["m_scores"]), est.decision_function(x), atol=1e-5)


@pytest.mark.timeout(60)
def test_skops_types_outside_sklearn_must_be_listed_in_trusted(
    data: dict[str, Any], tmp_path: Path
) -> None:
    from sklearn.preprocessing import FunctionTransformer

    from tests.adapters_helpers import shifted

    est = FunctionTransformer(shifted).fit(data["x"])
    path = _skops(tmp_path, est)
    name = "tests.adapters_helpers.shifted"
    with pytest.raises(ConfigError, match=rf"not trusted: {name}.*trusted: \[{name}\]"):
        run(data, adapter("sklearn", path=path, method="transform"))
    frame = run(data, adapter("sklearn", path=path, method="transform", trusted=[name]))
    np.testing.assert_allclose(lists(frame["m_features"]), data["x"] + 1.0, atol=1e-5)


# --- untrusted pickles --------------------------------------------------------------------------


def _pickled(tmp_path: Path, obj: Any, name: str) -> str:
    import joblib

    path = tmp_path / name
    joblib.dump(obj, path)
    return str(path)


@pytest.mark.timeout(60)
def test_pickle_is_refused_before_anything_runs_with_the_risk_and_safe_formats(
    data: dict[str, Any], tmp_path: Path
) -> None:
    from sklearn.linear_model import LogisticRegression

    clf = LogisticRegression().fit(data["x"], data["binary"])
    out = tmp_path / "out"
    job = Job(
        FileSource(str(_parquet(tmp_path, data))),
        [Model("clf", adapter("sklearn", path=_pickled(tmp_path, clf, "clf.pkl")), inputs=INPUTS)],
        output=Sink(str(out)),
    )
    with pytest.raises(ConfigError) as info:
        job.run()
    text = str(info.value)
    assert "model 'clf'" in text and "clf.pkl" in text
    assert "arbitrary code" in text
    for safe in ("skops", "ONNX", "XGBoost .json", "LightGBM .txt", "safetensors", "TorchScript"):
        assert safe in text
    assert "trust_pickle: true" in text and "--trust-pickle" in text
    assert not out.exists()  # refused at plan time: nothing written, nothing loaded

    frame = run(data, adapter("sklearn", path=job.models[0].fn.options["path"], trust_pickle=True))
    np.testing.assert_array_equal(frame["m_label"], clf.predict(data["x"]))


@pytest.mark.timeout(60)
def test_any_file_that_is_a_pickle_is_refused_whatever_its_name(
    data: dict[str, Any], tmp_path: Path
) -> None:
    import xgboost

    wrapper = xgboost.XGBClassifier(n_estimators=5, max_depth=2).fit(data["x"], data["binary"])
    path = _pickled(tmp_path, wrapper, "booster.bin")  # no telling suffix: sniffed
    assert is_pickle(path)
    with pytest.raises(ConfigError, match="is a pickle/joblib file"):
        run(data, adapter("xgboost", path=path))
    frame = run(data, adapter("xgboost", path=path, trust_pickle=True))
    np.testing.assert_array_equal(frame["m_label"], wrapper.predict(data["x"]))
    np.testing.assert_allclose(frame["m_score"], wrapper.predict_proba(data["x"])[:, 1], atol=1e-5)


def test_pickle_sniffing_does_not_flag_safe_formats(tmp_path: Path) -> None:
    header = (0x0580).to_bytes(8, "little")  # a safetensors header length starting 0x80 0x05
    (tmp_path / "w.safetensors").write_bytes(header + b"{}")
    (tmp_path / "w.bin").write_bytes(header + b"{}")
    (tmp_path / "model.json").write_text("{}")
    assert not is_pickle(str(tmp_path / "w.safetensors"))
    assert not is_pickle(str(tmp_path / "w.bin"))
    assert not is_pickle(str(tmp_path / "model.json"))
    assert is_pickle(str(tmp_path / "model.joblib.gz"))


@pytest.mark.parametrize("compress", ["zlib", "gzip", "bz2", "lzma", "xz", None])
def test_pickle_sniffing_finds_joblib_files_under_any_name(tmp_path: Path, compress: Any) -> None:
    import joblib

    path = tmp_path / "weights.dat"
    joblib.dump({"w": np.arange(3)}, path, compress=(compress, 3) if compress else 0)
    assert is_pickle(str(path))


# --- boosters -----------------------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("objective", "target", "suffix"),
    [
        pytest.param("binary:logistic", "binary", "json", id="binary-json"),
        pytest.param("multi:softprob", "multi", "ubj", id="multiclass-ubj"),
        pytest.param("reg:squarederror", "value", "json", id="regression-json"),
    ],
)
def test_xgboost_native_files(
    data: dict[str, Any], tmp_path: Path, objective: str, target: str, suffix: str
) -> None:
    import xgboost

    params: dict[str, Any] = {"objective": objective, "max_depth": 3, "nthread": 1}
    if target == "multi":
        params["num_class"] = 3
    train = xgboost.DMatrix(data["x"], label=data[target])
    booster = xgboost.train(params, train, num_boost_round=8)
    path = tmp_path / f"model.{suffix}"
    booster.save_model(path)
    frame = run(data, adapter("xgboost", path=str(path)))
    direct = booster.predict(xgboost.DMatrix(data["x"]))
    if target == "binary":
        np.testing.assert_allclose(frame["m_score"], direct, atol=1e-5)
        np.testing.assert_array_equal(frame["m_label"], (direct > 0.5).astype(int))
    elif target == "multi":
        np.testing.assert_allclose(lists(frame["m_proba"]), direct, atol=1e-5)
        np.testing.assert_array_equal(frame["m_label"], direct.argmax(axis=1))
    else:
        assert list(frame.columns) == ["id", "name", "m_value"]
        np.testing.assert_allclose(frame["m_value"], direct, atol=1e-5)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("objective", "target"),
    [
        pytest.param("binary", "binary", id="binary"),
        pytest.param("multiclass", "multi", id="multiclass"),
        pytest.param("regression", "value", id="regression"),
    ],
)
def test_lightgbm_native_files(
    data: dict[str, Any], tmp_path: Path, objective: str, target: str
) -> None:
    import lightgbm

    params: dict[str, Any] = {"objective": objective, "verbose": -1, "num_threads": 1}
    if target == "multi":
        params["num_class"] = 3
    names = ["a", "b", "c", "d"]
    train = lightgbm.Dataset(pd.DataFrame(data["x"], columns=names), label=data[target])
    booster = lightgbm.train(params, train, num_boost_round=8)
    booster.save_model(tmp_path / "model.txt")
    spec = adapter("lightgbm", path=str(tmp_path / "model.txt"), classes=["lo", "mid", "hi"])
    if target != "multi":
        spec = adapter("lightgbm", path=str(tmp_path / "model.txt"))
    frame = run(data, spec)  # the file's names (a..d) are not columns: by position
    direct = booster.predict(data["x"])
    if target == "binary":
        np.testing.assert_allclose(frame["m_score"], direct, atol=1e-5)
        np.testing.assert_array_equal(frame["m_label"], (direct > 0.5).astype(int))
    elif target == "multi":
        np.testing.assert_allclose(lists(frame["m_proba"]), direct, atol=1e-5)
        labels = np.array(["lo", "mid", "hi"])[direct.argmax(axis=1)]
        np.testing.assert_array_equal(frame["m_label"], labels)
    else:
        np.testing.assert_allclose(frame["m_value"], direct, atol=1e-5)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["xgboost", "lightgbm"])
def test_a_booster_trained_on_pandas_categories_codes_them_as_its_library_does(
    tmp_path: Path, kind: str
) -> None:
    """Trained on ``pd.Categorical([10, 20, 30])`` and ``["oslo", "rome"]``, the file
    stores the categories: an int64 ``zone`` column was fed as category codes (every row
    an unseen category's score, "complete"), a text one failed as "could not convert"."""
    rng = np.random.default_rng(3)
    n = 300
    zone = rng.choice([10, 20, 30], n)
    city = rng.choice(["oslo", "rome"], n).astype(object)
    city[::17] = None  # a missing category
    train = pd.DataFrame(
        {"a": rng.normal(size=n), "zone": pd.Categorical(zone), "city": pd.Categorical(city)}
    )
    label = ((zone == 20) ^ (city == "rome")).astype(int)
    if kind == "xgboost":
        import xgboost

        dtrain = xgboost.DMatrix(train, label=label, enable_categorical=True)
        booster: Any = xgboost.train({"objective": "binary:logistic"}, dtrain, 10)
        path = tmp_path / "model.json"
    else:
        import lightgbm

        params = {"objective": "binary", "verbose": -1, "min_data_in_leaf": 5}
        booster = lightgbm.train(params, lightgbm.Dataset(train, label), 10)
        path = tmp_path / "model.txt"
    booster.save_model(str(path))
    direct = (
        booster.predict(xgboost.DMatrix(train, enable_categorical=True))
        if kind == "xgboost"
        else booster.predict(train)
    )
    table = pa.table({"id": np.arange(n), "a": train["a"].to_numpy(), "zone": zone, "city": city})
    frame = chute.predict(  # int64 and text columns, as a Parquet file would give them
        table,
        Model("m", adapter(kind, path=str(path)), inputs=["a", "zone", "city"], batch_size=7),
        carryover=["id"],
    )
    assert list(frame["id"]) == list(range(n))
    np.testing.assert_allclose(frame["m_score"], direct, rtol=1e-6)
    assert len(np.unique(direct.round(4))) > 1  # the categories matter
    # a null in an int64 category column is a missing value, as in the library's frame
    nulled = table.set_column(2, "zone", pa.array([None, *zone[1:].tolist()], pa.int64()))
    frame = chute.predict(
        nulled, Model("m", adapter(kind, path=str(path)), inputs=["a", "zone", "city"])
    )
    missing = train.assign(zone=train["zone"].where(np.arange(n) > 0))
    want = (
        booster.predict(xgboost.DMatrix(missing, enable_categorical=True))
        if kind == "xgboost"
        else booster.predict(missing)
    )
    np.testing.assert_allclose(frame["m_score"], want, rtol=1e-6)
    if kind == "lightgbm":  # an int column named categorical by index beside a category one
        store = rng.integers(0, 5, n)
        frame2 = train.assign(store=store)
        data = lightgbm.Dataset(frame2, label, categorical_feature=[3])
        lightgbm.train(params, data, 5).save_model(str(path))
        spec = adapter(kind, path=str(path))
        with pytest.raises(ConfigError, match=r"splits on \['store'\] as categorical"):
            chute.predict(
                table.append_column("store", pa.array(store)),
                Model("m", spec, inputs=["a", "zone", "city", "store"]),
            )
    if kind == "xgboost":  # trained on codes (arrays): the file stores no categories
        codes = np.c_[train["a"], pd.Categorical(zone).codes].astype(np.float64)
        dcodes = xgboost.DMatrix(codes, label, feature_types=["q", "c"], enable_categorical=True)
        booster = xgboost.train({"objective": "binary:logistic"}, dcodes, 10)
        booster.save_model(str(path))
        table = pa.table({"a": codes[:, 0], "zone": codes[:, 1].astype(np.int64)})
        frame = chute.predict(
            table, Model("m", adapter(kind, path=str(path)), inputs=["a", "zone"], batch_size=7)
        )
        np.testing.assert_allclose(frame["m_score"], booster.inplace_predict(codes), rtol=1e-6)


@pytest.mark.timeout(60)
def test_booster_features_matched_by_name_and_width_checked(
    data: dict[str, Any], tmp_path: Path
) -> None:
    import xgboost

    train = xgboost.DMatrix(data["x"], label=data["value"], feature_names=FEATURES)
    booster = xgboost.train({"nthread": 1}, train, num_boost_round=4)
    booster.save_model(tmp_path / "m.json")
    frame = run(data, adapter("xgboost", path=str(tmp_path / "m.json")), inputs=FEATURES[::-1])
    direct = booster.predict(xgboost.DMatrix(data["x"], feature_names=FEATURES))
    np.testing.assert_allclose(frame["m_value"], direct, atol=1e-5)
    with pytest.raises(ModelError, match=r"trained on features named .* lack 'x2', 'x3'"):
        run(data, adapter("xgboost", path=str(tmp_path / "m.json")), inputs=["x0", "x1"])
    data = {**data, "table": data["table"].append_column("y1", data["table"].column("x1"))}
    with pytest.raises(ModelError, match=r"lack 'x1'"):
        run(
            data, adapter("xgboost", path=str(tmp_path / "m.json")), inputs=["x0", "y1", "x2", "x3"]
        )
    unnamed = xgboost.train({"nthread": 1}, xgboost.DMatrix(data["x"], data["value"]), 4)
    unnamed.save_model(tmp_path / "unnamed.json")
    with pytest.raises(ModelError, match="expects 4 features but the model's inputs give 2"):
        run(data, adapter("xgboost", path=str(tmp_path / "unnamed.json")), inputs=["x0", "x1"])


@pytest.mark.timeout(60)
def test_features_named_like_f0_are_still_taken_by_name(
    data: dict[str, Any], tmp_path: Path
) -> None:
    """Names that look made up (f0, f1) are names all the same when the inputs have them."""
    import xgboost

    names = ["f0", "f1", "f2", "f3"]
    table = data["table"].rename_columns(["id", "name", *names])
    train = xgboost.DMatrix(pd.DataFrame(data["x"], columns=names), label=data["value"])
    booster = xgboost.train({"nthread": 1}, train, num_boost_round=4)
    booster.save_model(tmp_path / "m.json")
    spec = adapter("xgboost", path=str(tmp_path / "m.json"))
    frame = run({**data, "table": table}, spec, inputs=names[::-1])
    np.testing.assert_allclose(frame["m_value"], booster.predict(train), atol=1e-5)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["xgboost", "lightgbm"])
def test_a_named_feature_the_inputs_lack_is_refused_not_taken_by_position(
    data: dict[str, Any], tmp_path: Path, kind: str
) -> None:
    """Trained on [x0, x1, x2] and given [x3, x1, x2], the booster took x3 for x0."""
    names = FEATURES[:3]
    frame = pd.DataFrame(data["x"][:, :3], columns=names)
    if kind == "xgboost":
        import xgboost

        train = xgboost.DMatrix(frame, label=data["binary"])
        xgboost.train({"objective": "binary:logistic"}, train, 4).save_model(tmp_path / "m.json")
        path = str(tmp_path / "m.json")
    else:
        import lightgbm

        booster = lightgbm.train(
            {"objective": "binary", "verbose": -1}, lightgbm.Dataset(frame, data["binary"]), 4
        )
        path = str(booster.save_model(tmp_path / "m.txt") and tmp_path / "m.txt")
    assert run(data, adapter(kind, path=path), inputs=names[::-1])["m_label"].notna().all()
    with pytest.raises(ModelError, match=r"lack 'x0' .* name the model's inputs as its features"):
        run(data, adapter(kind, path=path), inputs=["x3", "x1", "x2"])


@pytest.mark.timeout(60)
def test_an_xgboost_wrapper_predicts_as_its_predict_does(
    data: dict[str, Any], tmp_path: Path
) -> None:
    """Early stopping's best iteration and the wrapper's missing value were ignored: labels
    and scores differed from the wrapper's own predict."""
    import xgboost

    x = data["x"].copy()
    x[::7, 1] = -1.0  # what the wrapper is told stands for a missing value
    table = data["table"].set_column(3, "x1", pa.array(x[:, 1]))
    wrapper = xgboost.XGBClassifier(n_estimators=200, early_stopping_rounds=2, missing=-1.0)
    wrapper.fit(x[:400], data["binary"][:400], eval_set=[(x[400:], data["binary"][400:])])
    assert 0 < wrapper.best_iteration < wrapper.get_booster().num_boosted_rounds() - 1
    wrapper.save_model(tmp_path / "m.json")
    expected = wrapper.predict_proba(x)[:, 1]
    pickled = _pickled(tmp_path, wrapper, "m.pkl")
    for spec, want in (
        (adapter("xgboost", path=pickled, trust_pickle=True), expected),
        (adapter("xgboost", path=str(tmp_path / "m.json")), None),  # missing: not in a file
    ):
        model = Model("m", spec, inputs=INPUTS)
        frame = chute.predict(table, model, engine="local")
        if want is None:  # the file's trees are the best iteration's, as the wrapper's
            loaded = xgboost.XGBClassifier()
            loaded.load_model(tmp_path / "m.json")
            want = loaded.predict_proba(x)[:, 1]
        np.testing.assert_allclose(frame["m_score"], want, atol=1e-6)
    booster = wrapper.get_booster()
    booster.set_attr(scikit_learn=None)  # an xgboost.train booster: all its trees
    booster.save_model(tmp_path / "trained.json")
    frame = chute.predict(
        table, Model("m", adapter("xgboost", path=str(tmp_path / "trained.json")), inputs=INPUTS)
    )
    direct = booster.predict(xgboost.DMatrix(x))
    np.testing.assert_allclose(frame["m_score"], direct, atol=1e-6)


def test_xgboost_gpu_request_without_cuda_build_fails_clearly(
    data: dict[str, Any], tmp_path: Path
) -> None:
    import xgboost

    from chute.models.boosters import XGBoostAdapter

    if xgboost.build_info().get("USE_CUDA"):
        pytest.skip("this xgboost has CUDA: the GPU path is tested on a GPU")
    xgboost.train({}, xgboost.DMatrix(data["x"], data["value"]), 2).save_model(tmp_path / "m.json")
    context = ReplicaContext("reg", Resources(cpus=1, gpus=1))
    with pytest.raises(ResourceError, match=r"built without CUDA.*pip install xgboost"):
        XGBoostAdapter(context, path=str(tmp_path / "m.json"))


# --- ONNX ---------------------------------------------------------------------------------------


def _onnx_classifier(data: dict[str, Any], tmp_path: Path, zipmap: bool) -> tuple[Any, str]:
    from skl2onnx import to_onnx
    from sklearn.linear_model import LogisticRegression

    clf = LogisticRegression(max_iter=500).fit(data["x"], data["multi"])
    onx = to_onnx(clf, data["x"][:1].astype(np.float32), options={"zipmap": zipmap})
    path = tmp_path / ("zipmap.onnx" if zipmap else "clf.onnx")
    path.write_bytes(onx.SerializeToString())
    return clf, str(path)


def _parquet(tmp_path: Path, data: dict[str, Any]) -> Path:
    """The table in two Parquet files (two units)."""
    folder = tmp_path / "input"
    folder.mkdir(exist_ok=True)
    table = data["table"]
    pq.write_table(table.slice(0, ROWS // 2), folder / "a.parquet")
    pq.write_table(table.slice(ROWS // 2), folder / "b.parquet")
    return folder


@pytest.mark.timeout(180)
def test_onnx_from_skl2onnx_in_a_yaml_job_with_chute_run(
    data: dict[str, Any], tmp_path: Path, engine: str
) -> None:
    import onnxruntime

    clf, path = _onnx_classifier(data, tmp_path, zipmap=False)
    _parquet(tmp_path, data)
    (tmp_path / "job.yaml").write_text(
        textwrap.dedent(
            """\
            input: input/
            carryover: [id, name]
            models:
              - name: clf
                model:
                  type: onnx
                  path: clf.onnx
                  outputs: {probabilities: proba}
                inputs: [x0, x1, x2, x3]
            output: out/
            """
        )
    )
    code, text = invoke("run", str(tmp_path / "job.yaml"), "--engine", engine, "-q")
    assert code == 0, text
    result = pq.read_table(tmp_path / "out").sort_by("id").to_pandas()
    expected = data["table"].sort_by("id").to_pandas()
    assert list(result.columns) == ["id", "name", "clf_label", "clf_proba"]
    assert list(result["name"]) == list(expected["name"])
    x = expected[FEATURES].to_numpy(np.float32)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    label, proba = session.run(None, {session.get_inputs()[0].name: x})
    np.testing.assert_array_equal(result["clf_label"], label)
    np.testing.assert_allclose(lists(result["clf_proba"]), proba, atol=1e-5)
    np.testing.assert_allclose(lists(result["clf_proba"]), clf.predict_proba(x), atol=1e-4)


@pytest.mark.timeout(60)
def test_onnx_zipmap_output_and_graph_names(data: dict[str, Any], tmp_path: Path) -> None:
    clf, path = _onnx_classifier(data, tmp_path, zipmap=True)
    frame = run(data, adapter("onnx", path=path))
    assert list(frame.columns) == ["id", "name", "m_output_label", "m_output_probability"]
    x = data["x"].astype(np.float32)
    np.testing.assert_array_equal(frame["m_output_label"], clf.predict(x))
    np.testing.assert_allclose(
        lists(frame["m_output_probability"]), clf.predict_proba(x), atol=1e-4
    )
    dropped = run(data, adapter("onnx", path=path, outputs={"output_probability": None}))
    assert list(dropped.columns) == ["id", "name", "m_output_label"]
    with pytest.raises(ConfigError, match=r"no output 'output_proba'.*Did you mean"):
        run(data, adapter("onnx", path=path, outputs={"output_proba": "p"}))


def _two_input_graph(path: Path) -> None:
    """out = a * 2 + b: a is [N, 2], b is [N, 1]."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["a", "two"], ["doubled"]),
            helper.make_node("Add", ["doubled", "b"], ["out:0"]),
        ],
        "two_inputs",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 2]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 1]),
        ],
        [helper.make_tensor_value_info("out:0", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor("two", TensorProto.FLOAT, [1], [2.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


@pytest.mark.timeout(60)
def test_onnx_named_inputs_from_feeds(data: dict[str, Any], tmp_path: Path) -> None:
    _two_input_graph(tmp_path / "two.onnx")
    spec = adapter("onnx", path=str(tmp_path / "two.onnx"), feeds={"a": ["x0", "x1"], "b": "x3"})
    frame = run(data, spec, inputs=["x0", "x1", "x3"])
    x = data["x"].astype(np.float32)
    expected = x[:, :2] * 2 + x[:, 3:4]
    np.testing.assert_allclose(lists(frame["m_out_0"]), expected, atol=1e-5)
    with pytest.raises(ModelError, match="graph input 'a' needs column"):
        run(data, adapter("onnx", path=str(tmp_path / "two.onnx")), inputs=["x0", "x1", "x3"])


@pytest.mark.timeout(60)
def test_an_integer_graph_input_refuses_values_that_are_not_integers(tmp_path: Path) -> None:
    """[1, null, 3] gave [10, 0, 30] (a null became the smallest int64, times ten: 0) and
    [1.7, 2.2] gave [10, 20]: the cast to the graph's int64 was never checked."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "ten"], ["y"])],
        "times_ten",
        [helper.make_tensor_value_info("x", TensorProto.INT64, ["N", 1])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, ["N", 1])],
        [helper.make_tensor("ten", TensorProto.INT64, [1], [10])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "ten.onnx")
    spec = adapter("onnx", path=str(tmp_path / "ten.onnx"))

    def predict(values: list[Any]) -> list[Any]:
        table = pa.table({"v": values})
        frame = chute.predict(table, Model("m", spec, inputs=["v"]), engine="local")
        return list(frame["m_y"])

    assert predict([1, 2, 3]) == predict([1.0, 2.0, 3.0]) == [10, 20, 30]
    for values, shown in (
        ([1, None, 3], "nan"),
        ([1.7, 2.2], "1.7"),
        ([2.0**70], "1.18"),
        (pa.array([2**63 + 5], pa.uint64()), "9223372036854775813"),  # wrapped to negative
    ):
        with pytest.raises(chute.ChuteError, match=rf"column 'v' holds \[{shown}.* int64"):
            predict(values)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("kind", "values"), [("STRING", ["a", None, "c"]), ("BOOL", [True, None])])
def test_a_text_or_bool_graph_input_refuses_a_null(tmp_path: Path, kind: str, values: Any) -> None:
    """A null reached a string input as the text "None" (an unseen category to a one-hot
    encoder, predicted on in silence) and a bool input as False."""
    import onnx
    from onnx import TensorProto, helper

    element = getattr(TensorProto, kind)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "identity",
        [helper.make_tensor_value_info("x", element, ["N", 1])],
        [helper.make_tensor_value_info("y", element, ["N", 1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "identity.onnx")
    spec = adapter("onnx", path=str(tmp_path / "identity.onnx"))
    table = pa.table({"id": np.arange(len(values)), "v": values})
    given = [v for v in values if v is not None]
    frame = chute.predict(table.filter(table["v"].is_valid()), Model("m", spec, inputs=["v"]))
    assert list(frame["m_y"]) == given
    with pytest.raises(ModelError, match=r"column 'v' holds a null .* 'x' .* on row 1 of"):
        chute.predict(table, Model("m", spec, inputs=["v"]))
    frame = chute.predict(
        table, Model("m", spec, inputs=["v"], on_error="quarantine"), carryover=["id"]
    )
    assert list(frame["id"]) == [i for i, v in enumerate(values) if v is not None]
    assert list(frame["m_y"]) == given  # the null's row set aside, the others predicted


@pytest.mark.timeout(120)
def test_a_model_file_of_another_kind_or_a_text_feature_is_named(
    data: dict[str, Any], tmp_path: Path
) -> None:
    """sklearn given an XGBoost .json said "is a pickle"; xgboost given a LightGBM .txt
    printed a C++ stack trace; a text column among numeric features said "could not
    convert string to float", naming no column, blaming the model."""
    import lightgbm
    import xgboost

    booster = xgboost.train({}, xgboost.DMatrix(data["x"], label=data["value"]), 2)
    booster.save_model(tmp_path / "model.json")
    lgb = lightgbm.train({"verbose": -1}, lightgbm.Dataset(data["x"], data["value"]), 2)
    lgb.save_model(tmp_path / "model.txt")
    with pytest.raises(ConfigError, match=r"neither a \.skops file nor a pickle.*type: xgboost"):
        run(data, adapter("sklearn", path=str(tmp_path / "model.json")))
    with pytest.raises(chute.ChuteError, match=r"not an XGBoost model file \(.*\): save") as err:
        run(data, adapter("xgboost", path=str(tmp_path / "model.txt")))
    assert "Stack trace" not in str(err.value) and "[bt]" not in str(err.value)
    table = data["table"].append_column("s", pa.array([f"t{i}" for i in range(ROWS)]))
    spec = adapter("xgboost", path=str(tmp_path / "model.json"))
    with pytest.raises(ModelError, match=r"column 's' holds 't0', not a number"):
        chute.predict(table, Model("m", spec, inputs=[*INPUTS[:3], "s"]))


def _image_graph(path: Path) -> None:
    """total = sum of a [N, 1, 2, 2] image; scaled = the image times 3 (same shape)."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["image", "axes"], ["total"], keepdims=1),
            helper.make_node("Mul", ["image", "three"], ["scaled"]),
        ],
        "image",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 1, 2, 2])],
        [
            helper.make_tensor_value_info("total", TensorProto.FLOAT, ["N", 1, 1, 1]),
            helper.make_tensor_value_info("scaled", TensorProto.FLOAT, ["N", 1, 2, 2]),
        ],
        [
            helper.make_tensor("axes", TensorProto.INT64, [3], [1, 2, 3]),
            helper.make_tensor("three", TensorProto.FLOAT, [1], [3.0]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.save(model, path)


@pytest.mark.timeout(60)
def test_onnx_list_column_reshaped_to_the_input_shape(data: dict[str, Any], tmp_path: Path) -> None:
    _image_graph(tmp_path / "image.onnx")
    x = data["x"].astype(np.float32)
    pixels = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 4)
    table = data["table"].append_column("pixels", pixels)
    frame = run(
        {**data, "table": table},
        adapter("onnx", path=str(tmp_path / "image.onnx")),
        inputs=["pixels"],
    )
    np.testing.assert_allclose(frame["m_total"], x.sum(axis=1), atol=1e-5)  # (N,1,1,1) → plain
    np.testing.assert_allclose(lists(frame["m_scaled"]), x * 3, atol=1e-5)  # flattened per row


def test_onnx_gpu_request_without_cuda_provider_fails_clearly(
    data: dict[str, Any], tmp_path: Path
) -> None:
    import onnxruntime

    from chute.models.onnx import OnnxAdapter

    _, path = _onnx_classifier(data, tmp_path, zipmap=False)
    context = ReplicaContext("clf", Resources(cpus=1, gpus=1))
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider: the GPU path is tested on a GPU")
    with pytest.raises(ResourceError, match=r"no CUDAExecutionProvider.*onnxruntime-gpu"):
        OnnxAdapter(context, path=path)
    cpu = OnnxAdapter(ReplicaContext("clf", Resources(cpus=1)), path=path)
    assert cpu.session.get_providers() == ["CPUExecutionProvider"]
    assert cpu.session.get_session_options().intra_op_num_threads == 1


@pytest.mark.timeout(120)
def test_onnx_on_the_cuda_provider_when_a_gpu_is_assigned(
    data: dict[str, Any], tmp_path: Path
) -> None:
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        pytest.skip("no GPU path here: this onnxruntime has no CUDAExecutionProvider")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU on this machine")
    clf, path = _onnx_classifier(data, tmp_path, zipmap=False)
    spec = adapter("onnx", path=path)
    frame = run(data, spec, resources=Resources(cpus=1, gpus=1))
    np.testing.assert_array_equal(frame["m_label"], clf.predict(data["x"].astype(np.float32)))
    x = data["x"].astype(np.float32)
    np.testing.assert_allclose(lists(frame["m_probabilities"]), clf.predict_proba(x), atol=1e-4)


# --- Keras ----------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_keras_model_on_the_torch_backend_without_tensorflow(
    data: dict[str, Any], tmp_path: Path
) -> None:
    import importlib.util

    from chute.models.keras import import_keras

    chosen = os.environ.get("KERAS_BACKEND")
    fresh = "keras" not in sys.modules
    keras = import_keras()
    if chosen is not None:
        assert keras.backend.backend() == chosen  # KERAS_BACKEND is honoured
    elif fresh and not any(importlib.util.find_spec(m) for m in ("tensorflow", "jax")):
        assert keras.backend.backend() == "torch"  # no TensorFlow needed
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(3, activation="softmax"),
        ]
    )
    model.save(tmp_path / "m.keras")
    direct = np.asarray(model.predict_on_batch(data["x"].astype(np.float32)))
    frame = run(data, adapter("keras", path=str(tmp_path / "m.keras"), head="classifier"))
    np.testing.assert_allclose(lists(frame["m_proba"]), direct, atol=1e-5)
    np.testing.assert_array_equal(frame["m_label"], direct.argmax(axis=1))
    raw = run(data, adapter("keras", path=str(tmp_path / "m.keras")))
    np.testing.assert_allclose(lists(raw["m_value"]), direct, atol=1e-5)


@pytest.mark.timeout(120)
def test_keras_two_inputs_from_feeds_and_two_outputs(data: dict[str, Any], tmp_path: Path) -> None:
    from chute.models.keras import import_keras

    keras = import_keras()
    a, b = keras.Input((2,), name="a"), keras.Input((1,), name="b")
    joined = keras.layers.Concatenate()([a, b])
    model = keras.Model(
        [a, b],
        [keras.layers.Dense(1, name="price")(joined), keras.layers.Dense(2, name="emb")(joined)],
    )
    model.save(tmp_path / "two.keras")
    x = data["x"].astype(np.float32)
    price, emb = model.predict_on_batch([x[:, :2], x[:, 3:4]])
    spec = adapter("keras", path=str(tmp_path / "two.keras"), feeds={"a": ["x0", "x1"], "b": "x3"})
    frame = run(data, spec, inputs=["x0", "x1", "x3"])
    assert list(frame.columns) == ["id", "name", "m_price", "m_emb"]
    np.testing.assert_allclose(frame["m_price"], np.asarray(price)[:, 0], atol=1e-5)
    np.testing.assert_allclose(lists(frame["m_emb"]), np.asarray(emb), atol=1e-5)


def test_keras_dict_inputs_and_integer_ids_as_the_model_takes_them(tmp_path: Path) -> None:
    """A model of named inputs failed every batch (given a list); int64 ids went through
    float32, so 16,777,217 reached the model as 16,777,216."""
    from chute.models.keras import import_keras

    keras = import_keras()

    @keras.saving.register_keras_serializable(package="chute_tests")
    class Modulo(keras.layers.Layer):  # type: ignore[misc]
        def call(self, x: Any) -> Any:
            return keras.ops.cast(x % 1_000, "float32")  # exact on int64, not on float32

    ids = keras.Input((1,), name="ids", dtype="int64")
    scale = keras.Input((1,), name="scale")
    out = keras.layers.Multiply()([Modulo()(ids), scale])
    model = keras.Model(inputs={"scale": scale, "ids": ids}, outputs=out)
    model.save(tmp_path / "named.keras")
    values = np.array([16_777_217, 16_777_219, 123_456_789, 5, 1_099_511_627_777])
    table = pa.table({"id": values, "s": np.full(len(values), 2.0)})
    spec = adapter("keras", path=str(tmp_path / "named.keras"), feeds={"ids": "id", "scale": "s"})
    frame = chute.predict(table, Model("m", spec, inputs=["id", "s"]), engine="local")
    assert frame["m_value"].tolist() == [2.0 * (v % 1_000) for v in values]
    one = keras.Input((2,), name="features")  # one named input: the columns side by side
    keras.Model({"features": one}, keras.layers.Dense(1)(one)).save(tmp_path / "one.keras")
    spec = adapter("keras", path=str(tmp_path / "one.keras"))
    two = chute.predict(table, Model("m", spec, inputs=["id", "s"]), engine="local")
    assert len(two) == len(values) and two["m_value"].notna().all()


def test_a_keras_bool_input_takes_booleans_and_refuses_other_numbers(tmp_path: Path) -> None:
    """A bool input made 0.3, NaN and a null True: the model ran on them, exit 0."""
    from chute.models.keras import import_keras

    keras = import_keras()
    flag = keras.Input((1,), dtype="bool", name="flag")
    ones = keras.layers.Dense(1, kernel_initializer="ones", use_bias=False)
    keras.Model(flag, ones(keras.ops.cast(flag, "float32"))).save(tmp_path / "b.keras")
    model = Model("m", adapter("keras", path=str(tmp_path / "b.keras")), inputs=["flag"])
    fine = pa.table({"flag": [True, False], "n": [0.0, 1.0]})
    assert chute.predict(fine, model, engine="local")["m_value"].tolist() == [1.0, 0.0]
    as_numbers = Model("m", model.fn, inputs=["n"])
    assert chute.predict(fine, as_numbers, engine="local")["m_value"].tolist() == [0.0, 1.0]
    for value in (0.3, None, float("nan")):
        bad = pa.table({"n": pa.array([1.0, value], pa.float64())})
        with pytest.raises(chute.ChuteError, match=r"column 'n' holds .* the model takes booleans"):
            chute.predict(bad, as_numbers, engine="local")


# --- job files, validation, fingerprints --------------------------------------------------------


def _job(tmp_path: Path, model: str, name: str = "job.yaml") -> Path:
    (tmp_path / name).write_text(
        "input: input/\ncarryover: [id]\nmodels:\n  - name: clf\n"
        f"    model: {model}\n    inputs: [x0, x1, x2, x3]\noutput: out/\n"
    )
    return tmp_path / name


@pytest.mark.timeout(120)
def test_trust_pickle_flag_on_validate_and_run(data: dict[str, Any], tmp_path: Path) -> None:
    from sklearn.linear_model import LogisticRegression

    clf = LogisticRegression().fit(data["x"], data["binary"])
    _pickled(tmp_path, clf, "clf.joblib")
    _parquet(tmp_path, data)
    job = _job(tmp_path, "{type: sklearn, path: clf.joblib}")
    code, text = invoke("validate", str(job))
    assert code == 2 and "is a pickle/joblib file" in text and "--trust-pickle" in text
    code, text = invoke("run", str(job), "-q")
    assert code == 2 and "arbitrary code" in text
    assert not (tmp_path / "out").exists()
    code, text = invoke("validate", str(job), "--trust-pickle")
    assert code == 0, text
    code, text = invoke("run", str(job), "--trust-pickle", "-q")
    assert code == 0, text
    result = pq.read_table(tmp_path / "out").sort_by("id").to_pandas()
    x = data["table"].sort_by("id").to_pandas()[FEATURES].to_numpy()
    np.testing.assert_array_equal(result["clf_label"], clf.predict(x))
    trusted = _job(tmp_path, "{type: sklearn, path: clf.joblib, trust_pickle: true}", "t.yaml")
    assert invoke("validate", str(trusted))[0] == 0


@pytest.mark.timeout(60)
def test_job_file_errors_name_the_type_option_and_missing_extra(
    data: dict[str, Any], tmp_path: Path
) -> None:
    from sklearn.linear_model import LogisticRegression

    _skops(tmp_path, LogisticRegression().fit(data["x"], data["binary"]), "clf.skops")
    _parquet(tmp_path, data)
    code, text = invoke("validate", str(_job(tmp_path, "{type: sklaern, path: clf.skops}")))
    assert code == 2 and "unknown model type 'sklaern'" in text and "Did you mean 'sklearn'" in text
    code, text = invoke(
        "validate", str(_job(tmp_path, "{type: sklearn, path: clf.skops, methd: x}"))
    )
    assert code == 2 and "no option 'methd'" in text and "Did you mean 'method'" in text
    code, text = invoke("validate", str(_job(tmp_path, "{type: sklearn, path: nope.skops}")))
    assert code == 2 and "nope.skops" in text and "does not exist" in text
    code, text = invoke("validate", str(_job(tmp_path, "{path: clf.skops}")))
    assert code == 2 and "needs type" in text
    register("fakefw", "chute.models.sklearn:SklearnAdapter", "chute_no_such_framework", "fakefw")
    try:
        code, text = invoke("validate", str(_job(tmp_path, "{type: fakefw, path: clf.skops}")))
    finally:
        del ADAPTERS["fakefw"]
    assert code == 2
    assert "needs chute_no_such_framework, which is not installed" in text
    assert "pip install 'chute[fakefw]'" in text
    code, text = invoke("validate", str(_job(tmp_path, "{type: sklearn, path: clf.skops}")))
    assert code == 0, text


@pytest.mark.timeout(120)
def test_a_changed_model_file_is_a_changed_job(data: dict[str, Any], tmp_path: Path) -> None:
    import xgboost

    def save(rounds: int) -> None:
        train = xgboost.DMatrix(data["x"], label=data["value"])
        xgboost.train({"nthread": 1}, train, num_boost_round=rounds).save_model(tmp_path / "m.json")

    save(3)
    _parquet(tmp_path, data)
    job = _job(tmp_path, "{type: xgboost, path: m.json}")
    assert invoke("run", str(job), "-q")[0] == 0
    assert invoke("run", str(job), "-q")[0] == 0  # the same job again: nothing to redo
    save(5)
    code, text = invoke("run", str(job), "-q")
    assert code == JobStateError.exit_code, text
    assert "different job" in text


def test_import_chute_and_validate_import_no_framework(
    tmp_path: Path, data: dict[str, Any]
) -> None:
    from sklearn.linear_model import LogisticRegression

    _skops(tmp_path, LogisticRegression().fit(data["x"], data["binary"]), "clf.skops")
    _parquet(tmp_path, data)
    job = _job(tmp_path, "{type: sklearn, path: clf.skops}")
    script = (
        "import sys\n"
        "from chute.cli import main\n"
        f"main(['validate', {str(job)!r}], standalone_mode=False)\n"
        "heavy = ['sklearn', 'skops', 'xgboost', 'lightgbm', 'onnxruntime', 'keras', 'torch']\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


# --------------------------------------------------------------------------- image inputs


def _images(rows: int, height: int, width: int, channels: int) -> pa.ChunkedArray:
    pixels = np.arange(rows * height * width * channels, dtype=np.uint8)
    pixels = pixels.reshape(rows, height, width, channels)
    return pa.chunked_array([pa.FixedShapeTensorArray.from_numpy_ndarray(pixels)])


@pytest.mark.parametrize(
    ("graph_shape", "transposed"),
    [
        pytest.param(["batch", 4, 5, 3], False, id="channels-last-as-is"),
        pytest.param(["batch", 3, 4, 5], True, id="channels-first-transposed"),
        pytest.param([None, None, None, 3], False, id="dynamic-dims"),
    ],
)
def test_onnx_image_inputs_follow_the_graph_layout(
    graph_shape: list[Any], transposed: bool
) -> None:
    from chute.models.onnx import _image_tensor

    column = _images(2, 4, 5, 3)
    images = column.combine_chunks().to_numpy_ndarray()
    fed = _image_tensor(column, graph_shape, "image")
    expected = images.transpose(0, 3, 1, 2) if transposed else images
    assert fed.shape == expected.shape and (fed == expected).all()


def test_onnx_image_input_of_another_size_is_a_clear_error() -> None:
    from chute.models.onnx import _image_tensor

    with pytest.raises(
        ModelError, match=r"has shape \['batch', 3, 32, 32\].*set the source's size"
    ):
        _image_tensor(_images(2, 4, 5, 3), ["batch", 3, 32, 32], "image")


def test_image_columns_spread_into_features_for_tabular_models() -> None:
    from chute.models.common import column_matrix

    column = _images(2, 2, 2, 3)
    matrix = column_matrix(column, "image")
    assert matrix.shape == (2, 12)
    assert (matrix == column.combine_chunks().to_numpy_ndarray().reshape(2, 12)).all()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dump", ["joblib", "pickle"])
def test_a_pickle_named_skops_is_refused_by_its_first_bytes(
    data: dict[str, Any], tmp_path: Path, dump: str
) -> None:
    import pickle

    from sklearn.linear_model import LogisticRegression

    clf = LogisticRegression().fit(data["x"], data["binary"])
    if dump == "joblib":
        _pickled(tmp_path, clf, "clf.skops")
    else:
        (tmp_path / "clf.skops").write_bytes(pickle.dumps(clf))
    _parquet(tmp_path, data)
    job = _job(tmp_path, "{type: sklearn, path: clf.skops}")
    for command in ("validate", "plan", "run"):
        code, text = invoke(command, str(job))
        assert code == 2, text
        assert "is a pickle/joblib file" in text and "trust_pickle: true" in text
        assert "--trust-pickle" in text
    assert not (tmp_path / "out").exists()
    code, text = invoke("run", str(job), "--trust-pickle", "-q")  # trusted: loads as a pickle
    assert code == 0, text
    result = pq.read_table(tmp_path / "out").sort_by("id").to_pandas()
    x = data["table"].sort_by("id").to_pandas()[FEATURES].to_numpy()
    np.testing.assert_array_equal(result["clf_label"], clf.predict(x))


@pytest.mark.timeout(60)
def test_features_sent_to_csv_are_refused_when_planned(
    data: dict[str, Any], tmp_path: Path
) -> None:
    from sklearn.decomposition import PCA

    _skops(tmp_path, PCA(n_components=2).fit(data["x"]), "pca.skops")
    _parquet(tmp_path, data)
    job = _job(tmp_path, "{type: sklearn, path: pca.skops, method: transform}")
    job.write_text(job.read_text().replace("output: out/", "output: {path: out/, format: csv}"))
    code, text = invoke("validate", str(job))
    assert code == 2, text
    assert "column(s) 'clf_features' (a list per row)" in text
    assert "Write Parquet or JSON Lines instead" in text
