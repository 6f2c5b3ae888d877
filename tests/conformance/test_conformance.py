"""The conformance suite: what every registered engine must do, alike (issue 13).

Like Beam's ValidatesRunner tests, each test runs once per engine in
``chute.engines.ENGINES`` (the ``engine`` fixture) and checks the result against an
engine-free computation of what the job means — plain pyarrow and NumPy over the input,
and the metrics' own single-process accumulation — never against another engine's output.
So an engine passes by being right, and all engines then agree by construction:

* rows, values and column order, through a preprocess step and two models with carryover;
* metrics, equal to one accumulation over the whole output;
* the ledger: every unit once, with its rows; the manifest names exactly the parts;
* quarantine: exactly the rows a model raises on, in ``_errors/``, the rest predicted;
* every bad-input error: the same class and the same message on every engine;
* in-memory results, in input order;
* a job killed on one engine and resumed on another ends exactly once.
"""

from __future__ import annotations

import itertools
import json
import shutil
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import chute
from chute.engines import ENGINES
from chute.errors import ChuteError, ColumnNotFoundError, DataError, ModelError
from chute.ledger import Ledger
from chute.metrics import metric_from_spec
from chute.storage import resolve
from tests.chaos_job import METRICS, driver_env, make_data, reap, start_driver, wait_for
from tests.conftest import TAXI_ROWS
from tests.gated_job import ROWS_PER_UNIT, write_job

CARRY = ("trip_id", "payment_type")
TAXI_METRICS = [
    {"type": "mse", "label": "fare_amount", "prediction": "price_value"},
    {"type": "mean", "column": "tip_score", "by": "payment_type", "name": "tip_by_payment"},
    {"type": "histogram", "column": "price_value", "bins": 10, "range": [0, 100]},
]


# --------------------------------------------------------------------------- the job


def fare_per_mile(batch: pa.Table) -> dict[str, Any]:
    """The preprocess step: a new column from two input columns."""
    miles = pc.add(batch.column("trip_distance"), 1.0)
    return {"fare_per_mile": pc.divide(batch.column("fare_amount"), miles)}


def fare_model(batch: pd.DataFrame) -> dict[str, Any]:
    """A second model, on pandas, over the preprocess step's column."""
    return {"value": (batch["fare_per_mile"] * 3.5 + 1.0).to_numpy()}


def raises_on_some(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Raises on any batch holding a trip id divisible by 7919."""
    bad = batch["trip_id"][batch["trip_id"] % 7919 == 0]
    if len(bad):
        raise ValueError(f"cannot score trip {int(bad[0])}")
    return {"ok": batch["trip_id"] * 2}


def raises_on_one(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Raises on the batch holding trip 31,337 only: which error comes first is certain."""
    if (batch["trip_id"] == 31_337).any():
        raise ValueError("cannot score trip 31337")
    return {"ok": batch["trip_id"] * 2}


def taxi_job(taxi_dir: Path, out: Path | None, engine: str, **job: Any) -> chute.Job:
    models = (
        chute.Model("tip", chute.demo.tip_model, inputs=("passenger_count",),
                    batch_format="numpy", batch_size=4096),
        chute.Model("price", fare_model, inputs=("fare_per_mile",), batch_format="pandas"),
    )  # fmt: skip
    job.setdefault(
        "preprocess", chute.Preprocess(fare_per_mile, inputs=("fare_amount", "trip_distance"))
    )
    return chute.Job(
        source=chute.FileSource(str(taxi_dir)),
        models=models,
        carryover=CARRY,
        output=chute.Sink(str(out)) if out is not None else None,
        engine=engine,
        **job,
    )


def expected(taxi_dir: Path) -> pa.Table:
    """What the job means, computed without any engine, sorted by trip id."""
    table = pq.read_table(taxi_dir).sort_by("trip_id")
    per_mile = pc.divide(table["fare_amount"], pc.add(table["trip_distance"], 1.0))
    return pa.table(
        {
            "trip_id": table["trip_id"],
            "payment_type": table["payment_type"],
            "tip_score": (table["passenger_count"].to_numpy() >= 2).astype(np.float32),
            "price_value": pc.add(pc.multiply(per_mile, 3.5), 1.0),
        }
    )


def read_output(out: Path) -> pa.Table:
    """The rows of the files the manifest names, in file order, then sorted by trip id."""
    manifest = json.loads((out / "_chute" / "manifest.json").read_text())
    tables = [pq.read_table(out / f["path"]) for f in manifest["files"]]
    return pa.concat_tables(tables)


class Overlaps:
    """A preprocess that records when each call ran (as files: Ray runs it elsewhere)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def __call__(self, batch: pa.Table) -> dict[str, Any]:
        began = time.time()
        time.sleep(0.05)
        (self.directory / uuid.uuid4().hex).write_text(f"{began} {time.time()}")
        return fare_per_mile(batch)


def most_at_once(directory: Path) -> int:
    """The most calls recorded in ``directory`` that ran at the same moment."""
    events = []
    for path in directory.iterdir():
        began, ended = map(float, path.read_text().split())
        events += [(began, 1), (ended, -1)]
    running = peak = 0
    for _, step in sorted(events):  # an end sorts before a start at the same instant
        running += step
        peak = max(peak, running)
    return peak


# --------------------------------------------------------------------------- rows


@pytest.mark.timeout(120)
def test_rows_values_and_column_order(engine: str, taxi_dir: Path, tmp_path: Path) -> None:
    report = taxi_job(taxi_dir, tmp_path / "out", engine).run()
    table = read_output(tmp_path / "out")
    assert table.column_names == ["trip_id", "payment_type", "tip_score", "price_value"]
    assert report.rows_out == table.num_rows == expected(taxi_dir).num_rows
    assert table.sort_by("trip_id").equals(expected(taxi_dir))


@pytest.mark.timeout(120)
def test_metrics_equal_one_accumulation_over_the_output(
    engine: str, taxi_dir: Path, tmp_path: Path
) -> None:
    metrics = tuple(metric_from_spec(spec) for spec in TAXI_METRICS)
    report = taxi_job(taxi_dir, tmp_path / "out", engine, metrics=metrics).run()
    whole = pq.read_table(taxi_dir).join(expected(taxi_dir), "trip_id", right_suffix="_")
    for metric, spec in zip(metrics, TAXI_METRICS, strict=True):
        owner = spec.get("prediction", spec.get("column", "")).split("_")[0]
        reference = metric.result(metric.update(metric.init(), whole))
        reported = report.metrics[owner][metric.name]
        assert json.dumps(reported, sort_keys=True) == json.dumps(reference, sort_keys=True)


@pytest.mark.timeout(120)
def test_ledger_names_every_unit_once_and_the_manifest_every_part(
    engine: str, taxi_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    taxi_job(taxi_dir, out, engine).run()
    entries = Ledger(*resolve(str(out))).read_entries()
    files = sorted(taxi_dir.glob("*.parquet"))
    assert sorted(e["unit"] for e in entries.values()) == sorted(str(f) for f in files)
    rows = {str(f): pq.ParquetFile(f).metadata.num_rows for f in files}
    assert {e["unit"]: e["rows"] for e in entries.values()} == rows
    manifest = json.loads((out / "_chute" / "manifest.json").read_text())
    parts = {p.name for p in out.iterdir() if p.name.startswith("part-")}
    assert {f["path"] for f in manifest["files"]} == parts
    assert manifest["rows"] == sum(rows.values())


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("file_rows", "most"),
    [
        pytest.param(None, 12, id="default-target"),  # the demo: at most a file an input file
        pytest.param(2_500, None, id="small-target"),  # units (5,000 rows) span files
    ],
)
def test_output_files_are_right_sized_and_hold_every_row_once(
    engine: str, taxi_dir: Path, tmp_path: Path, file_rows: int | None, most: int | None
) -> None:
    out = tmp_path / "out"
    job = taxi_job(taxi_dir, None, engine)
    job = replace(job, output=chute.Sink(str(out), file_rows=file_rows))
    job.run()
    parts = sorted(p for p in out.iterdir() if p.name.startswith("part-"))
    sizes = [pq.ParquetFile(p).metadata.num_rows for p in parts]
    if most is not None:
        assert len(parts) <= most, f"{len(parts)} data files for 12 input files"
    if file_rows is not None:
        assert max(sizes) <= file_rows and len(parts) >= TAXI_ROWS // file_rows
    got = read_output(out).sort_by("trip_id")
    assert got.equals(expected(taxi_dir))  # every row once, with its values
    entries = Ledger(*resolve(str(out))).read_entries()
    named = {p for e in entries.values() for p in e["parts"]}
    assert named == {p.name for p in parts}  # no orphan, none missing


@pytest.mark.timeout(120)
def test_quarantine_isolates_exactly_the_rows_a_model_raises_on(
    engine: str, taxi_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    model = chute.Model("m", raises_on_some, inputs=("trip_id",), batch_format="numpy",
                        batch_size=2048, on_error="quarantine")  # fmt: skip
    job = chute.Job(chute.FileSource(str(taxi_dir)), (model,), output=chute.Sink(str(out)),
                    carryover=("trip_id",), engine=engine)  # type: ignore[arg-type]  # fmt: skip
    report = job.run()
    ids = pq.read_table(taxi_dir, columns=["trip_id"])["trip_id"].to_numpy()
    bad = np.sort(ids[ids % 7919 == 0])
    errors = pq.read_table(out / "_errors").sort_by("trip_id")
    assert errors.column_names == ["trip_id", "model", "error_type", "error_message"]
    assert (errors["trip_id"].to_numpy() == bad).all() and report.rows_failed == len(bad)
    assert set(errors["error_type"].to_pylist()) == {"ValueError"}
    good = read_output(out).sort_by("trip_id")
    assert (good["trip_id"].to_numpy() == np.setdiff1d(ids, bad)).all()
    assert (good["m_ok"].to_numpy() == good["trip_id"].to_numpy() * 2).all()


def raises_on_the_sixth_file(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    ids = batch["id"]
    if np.any((ids >= 5_000) & (ids < 6_000)):
        raise ValueError("a file the model cannot score")
    return {"ok": ids * 2}


@pytest.mark.timeout(120)
def test_one_bad_file_of_twenty_is_quarantined_not_taken_for_a_broken_model(
    engine: str, tmp_path: Path
) -> None:
    """The unit whose rows all failed has no data file and committed at once, while the
    good units before it waited for their shared file: the failed share was taken over it
    alone ('1,000 of the 1,000 rows committed so far failed') and every run stopped."""
    data = tmp_path / "data"
    data.mkdir()
    for i in range(20):
        ids = np.arange(i * 1_000, (i + 1) * 1_000)
        pq.write_table(pa.table({"id": ids}), data / f"part-{i:02d}.parquet")
    model = chute.Model("m", raises_on_the_sixth_file, inputs=("id",), batch_format="numpy",
                        on_error="quarantine")  # fmt: skip
    job = chute.Job(chute.FileSource(str(data)), (model,), output=chute.Sink(str(tmp_path / "out")),
                    carryover=("id",), engine=engine)  # type: ignore[arg-type]  # fmt: skip
    report = job.run()
    assert (report.rows_out, report.rows_failed) == (19_000, 1_000)
    assert pq.read_table(tmp_path / "out" / "_errors").num_rows == 1_000


# --------------------------------------------------------------------------- errors


def _missing_column(taxi_dir: Path, tmp_path: Path, engine: str) -> chute.Job:
    model = chute.Model("tip", chute.demo.tip_model, inputs=("passenger_cnt",))
    return chute.Job(chute.FileSource(str(taxi_dir)), (model,), engine=engine)  # type: ignore[arg-type]


def _corrupt_file(taxi_dir: Path, tmp_path: Path, engine: str) -> chute.Job:
    data = tmp_path / "data"
    shutil.copytree(taxi_dir, data)
    (data / "zz-broken.parquet").write_bytes(b"PAR1 not really parquet")
    return taxi_job(data, tmp_path / "out", engine)


def _model_raises(taxi_dir: Path, tmp_path: Path, engine: str) -> chute.Job:
    model = chute.Model("m", raises_on_one, inputs=("trip_id",), batch_format="numpy")
    return chute.Job(chute.FileSource(str(taxi_dir)), (model,), engine=engine)  # type: ignore[arg-type]


def _model_fails_to_load(taxi_dir: Path, tmp_path: Path, engine: str) -> chute.Job:
    model = chute.Model("m", "tests.conformance.no_such_module:Model", inputs=("trip_id",))
    return chute.Job(chute.FileSource(str(taxi_dir)), (model,), engine=engine)  # type: ignore[arg-type]


BAD = {
    "missing-column": (_missing_column, ColumnNotFoundError),
    "corrupt-file": (_corrupt_file, DataError),
    "model-raises": (_model_raises, ModelError),
    "model-fails-to-load": (_model_fails_to_load, ChuteError),
}
_MESSAGES: dict[str, tuple[type[BaseException], str]] = {}
"""The first engine's error per case: every later engine must raise the same."""


def _normal(text: str, tmp_path: Path) -> str:
    return text.replace(str(tmp_path), "<tmp>")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_gives_the_same_error_on_every_engine(
    engine: str, case: str, taxi_dir: Path, tmp_path: Path
) -> None:
    build, kind = BAD[case]
    with pytest.raises(kind) as info:
        build(taxi_dir, tmp_path, engine).run()
    seen = (type(info.value), _normal(str(info.value), tmp_path))
    assert _MESSAGES.setdefault(case, seen) == seen, f"{engine} differs from another engine"


@pytest.mark.timeout(120)
def test_a_column_named_like_a_model_is_not_taken_for_its_output(
    engine: str, taxi_dir: Path, tmp_path: Path
) -> None:
    """The preprocess step's ``fare_per_mile`` starts with the name of the model ``fare``
    that reads it: the output holds the model's column, not the step's (a writer took
    every ``fare_*`` column for the model's, and wrote the step's column too)."""
    model = chute.Model("fare", fare_model, inputs=("fare_per_mile",), batch_format="pandas")
    step = chute.Preprocess(fare_per_mile, inputs=("fare_amount", "trip_distance"))
    job = chute.Job(
        source=chute.FileSource(str(taxi_dir)),
        models=(model,),
        preprocess=step,
        carryover=("trip_id",),
        output=chute.Sink(str(tmp_path / "out")),
        engine=engine,
    )
    job.run()
    table = read_output(tmp_path / "out")
    assert table.column_names == ["trip_id", "fare_value"]
    want = expected(taxi_dir)
    assert table.sort_by("trip_id")["fare_value"].equals(want["price_value"])


# --------------------------------------------------------------------------- in memory


@pytest.mark.timeout(120)
def test_in_memory_results_come_back_in_input_order(engine: str, taxi_dir: Path) -> None:
    frame = pq.read_table(taxi_dir).to_pandas().sample(frac=1.0, random_state=3)
    frame["fare_per_mile"] = frame["fare_amount"] / (frame["trip_distance"] + 1.0)
    models = [
        chute.Model("tip", chute.demo.tip_model, inputs=["passenger_count"],
                    batch_format="numpy", batch_size=5000),
        chute.Model("price", fare_model, inputs=["fare_per_mile"], batch_format="pandas"),
    ]  # fmt: skip
    result = chute.predict(frame, models, carryover=["trip_id"], engine=engine)  # type: ignore[arg-type]
    assert result["trip_id"].tolist() == frame["trip_id"].tolist()
    np.testing.assert_array_equal(
        result["tip_score"], (frame["passenger_count"] >= 2).astype(np.float32)
    )
    np.testing.assert_array_equal(result["price_value"], frame["fare_per_mile"] * 3.5 + 1.0)


# --------------------------------------------------------------------------- resume

UNITS = 8
PAIRS = [
    pytest.param(a, b, id=f"{a}-then-{b}",
                 marks=[pytest.mark.ray] if "ray" in (ENGINES[a].requires, ENGINES[b].requires)
                 else [])
    for a, b in itertools.permutations(ENGINES, 2)
]  # fmt: skip


@pytest.fixture(scope="module")
def unit_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_data(tmp_path_factory.mktemp("conformance-units"), UNITS)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("first", "then"), PAIRS)
def test_killed_on_one_engine_resumed_on_another_ends_exactly_once(
    first: str, then: str, unit_data: Path, tmp_path: Path
) -> None:
    """A driver SIGKILLed mid-run on ``first`` (the model held at a gate after two whole
    units), then the same job file run with ``--engine then``: every row once, the values
    and metrics of an uninterrupted run, and the committed units not recomputed."""
    gate, out = tmp_path / "gate", tmp_path / "out"
    job = write_job(tmp_path / "job.yaml", unit_data, str(out), gate, metrics=METRICS)
    driver = start_driver(job, driver_env(), "--engine", first)
    try:
        # held at the gate, and the two free units committed (writers do not wait for it)
        def held() -> bool:
            reached = gate.with_suffix(".reached").exists()
            return reached and len(Ledger(*resolve(str(out))).read_entries()) >= 2

        if not wait_for(held, driver, 120):
            driver.kill()
            pytest.fail(driver.communicate(timeout=30)[1][-3000:])
        done = Ledger(*resolve(str(out))).read_entries()
    finally:
        reap(driver)
    gate.touch()
    resumed = start_driver(job, driver_env(), "--engine", then)
    _, err = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, err[-3000:]
    report = json.loads((out / "_chute" / "report.json").read_text())
    assert report["engine"] == then and report["units_skipped"] == len(done)
    table = read_output(out).sort_by("id")
    ids = table["id"].to_numpy()
    assert len(ids) == UNITS * ROWS_PER_UNIT and (ids == np.arange(len(ids))).all()
    source = pq.read_table(unit_data).sort_by("id")
    np.testing.assert_array_equal(table["m_score"], source["x"].to_numpy() * 2.0 + ids)
    whole = source.append_column("m_score", table["m_score"])
    for spec in METRICS:
        metric = metric_from_spec(spec)
        owner = "m" if "m_score" in (spec.get("prediction"), spec.get("column")) else "dataset"
        reference = metric.result(metric.update(metric.init(), whole))
        assert json.dumps(report["metrics"][owner][metric.name], sort_keys=True) == json.dumps(
            reference, sort_keys=True
        )


# --------------------------------------------------------------------------- resources


@pytest.mark.timeout(180)
def test_preprocess_cpus_mean_the_same_parallelism_on_every_engine(
    engine: str, taxi_dir: Path, tmp_path: Path
) -> None:
    """``Preprocess(cpus=0.5)`` is one batch at a time holding half a CPU, on every engine
    (the Ray engine once ran it fused into each read task, as many at once as fitted)."""
    calls = tmp_path / "calls"
    calls.mkdir()
    step = chute.Preprocess(Overlaps(calls), inputs=("fare_amount", "trip_distance"), cpus=0.5)
    small = chute.Resources(cpus=0.25)  # room beside the models for several reads at once
    job = taxi_job(taxi_dir, tmp_path / "out", engine, preprocess=step)
    job = replace(job, models=tuple(replace(m, resources=small) for m in job.models))
    assert job.run().rows_out == pq.read_table(taxi_dir).num_rows
    assert len(list(calls.iterdir())) > 1
    assert most_at_once(calls) == 1
