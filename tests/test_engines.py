"""End-to-end conformance: real jobs over real files, run on both engines.

Every test that can run on either engine takes the ``engine`` fixture (ids ``local`` and
``ray``); the Ray ones share the session's 2-CPU local Ray. Models, sources and helpers
live at module level so Ray workers can import them.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import chute
import chute.demo
from chute.engines.ray import live_pool_actors
from chute.sources import Unit

TEXT_COLUMNS = ["trip_id", "vendor_id", "passenger_count", "fare_amount", "trip_distance"]
EXT = {"parquet": "parquet", "csv": "csv", "jsonl": "jsonl"}


# --------------------------------------------------------------------------- helpers


class RecordingSource(chute.FileSource):
    """A FileSource that appends one JSON line per ``read()`` call to ``log``.

    Appends of one short line are atomic, so this counts reads across Ray worker processes.
    """

    def __init__(self, path: str | Sequence[str], log: Path, format: str | None = None):
        super().__init__(path, format)
        self.log = str(log)

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "log": self.log}

    def read(self, unit: Unit, columns: Sequence[str] | None) -> pa.Table:
        line = json.dumps({"unit": unit.id, "columns": None if columns is None else list(columns)})
        with open(self.log, "a") as f:
            f.write(line + "\n")
        return super().read(unit, columns)


def log_lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def read_log(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log_lines(log)]


def log_line(path: str, text: str) -> None:
    with open(path, "a") as f:
        f.write(text + "\n")


def taxi(taxi_dir: Path, columns: Sequence[str] | None = None) -> pa.Table:
    """All the taxi input, in file order."""
    files = sorted(taxi_dir.glob("*.parquet"))
    return pa.concat_tables(pq.read_table(f, columns=columns) for f in files)


def sort_by(table: pa.Table, column: str = "trip_id") -> pa.Table:
    return table.sort_by(column).combine_chunks()


def read_parts(out: Path, fmt: str = "parquet") -> pa.Table:
    """Every part file of an output location, as one table sorted by trip_id."""
    parts = sorted(out.glob(f"part-*.{EXT[fmt]}"))
    assert parts, f"no part files in {out}"
    if fmt == "parquet":
        tables = [pq.read_table(p) for p in parts]
    elif fmt == "csv":
        tables = [pacsv.read_csv(p) for p in parts]
    else:
        frames = [pd.read_json(p, lines=True) for p in parts]
        tables = [pa.Table.from_pandas(f, preserve_index=False) for f in frames]
    return sort_by(pa.concat_tables(tables, promote_options="permissive"))


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def column(table: pa.Table, name: str) -> np.ndarray:
    return np.asarray(table.column(name).to_numpy())


def taxi_job(
    taxi_dir: Path,
    models: Sequence[chute.Model],
    engine: str,
    out: Path | None = None,
    carryover: Sequence[str] = ("trip_id",),
    **job: Any,
) -> chute.Job:
    """A job over the taxi data, in memory unless ``out`` is given."""
    return chute.Job(
        source=chute.FileSource(str(taxi_dir)),
        models=tuple(models),
        carryover=tuple(carryover),
        output=chute.Sink(str(out)) if out is not None else None,
        engine=engine,
        **job,
    )


def tip_job(taxi_dir: Path, out: Path | None, engine: str, **model: Any) -> chute.Job:
    """The demo's tip model over the taxi data, carrying trip_id."""
    spec = {"fn": chute.demo.tip_model, "inputs": ("passenger_count",), "batch_format": "numpy"}
    return taxi_job(taxi_dir, [chute.Model("tip", **{**spec, **model})], engine, out)


def check_tips(table: pa.Table, taxi_dir: Path) -> None:
    expected = sort_by(taxi(taxi_dir, ["trip_id", "passenger_count"]))
    table = sort_by(table)
    np.testing.assert_array_equal(column(table, "trip_id"), column(expected, "trip_id"))
    score = (column(expected, "passenger_count") >= 2).astype(np.float32)
    np.testing.assert_array_equal(column(table, "tip_score"), score)


# ---------------------------------------------------------------------------- models


def score_and_columns(batch: pa.Table) -> dict[str, Any]:
    """fare × passengers, and the names of the columns the model was handed."""
    fare = np.asarray(batch.column("fare_amount").to_numpy(), dtype=np.float64)
    people = np.asarray(batch.column("passenger_count").to_numpy(), dtype=np.float64)
    seen = ",".join(batch.column_names)
    return {"score": fare * people, "seen": pa.array([seen] * batch.num_rows)}


def batch_rows(batch: Any) -> int:
    if isinstance(batch, dict):
        return len(next(iter(batch.values())))
    return len(batch)


def batch_probe(batch: Any) -> dict[str, Any]:
    """The batch's row count and the name of its type."""
    n = batch_rows(batch)
    return {"n": np.full(n, n, dtype=np.int64), "kind": pa.array([type(batch).__name__] * n)}


def batch_len(batch: Any) -> np.ndarray:
    """A single array: lands as the column named after the model."""
    n = batch_rows(batch)
    return np.full(n, n, dtype=np.int64)


def double_trip(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"x2": batch["trip_id"] * 2}


class Scaler:
    """A class model: its constructor logs once per replica."""

    def __init__(self, factor: int, *, log: str) -> None:
        log_line(log, str(os.getpid()))
        self.factor = factor

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"value": batch["trip_id"] * self.factor}


class Lookup:
    """Holds a big array given as a constructor argument; logs whether it is read-only."""

    def __init__(self, table: np.ndarray, *, log: str) -> None:
        log_line(log, "read-only" if not table.flags.writeable else "writeable")
        self.table = table

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"value": self.table[batch["trip_id"] % len(self.table)]}


class LoggedTip:
    """The tip model, logging each construction (to prove nothing was computed)."""

    def __init__(self, *, log: str) -> None:
        log_line(log, "constructed")

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return chute.demo.tip_model(batch)


def fails_on_big_trips(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if (batch["trip_id"] > 30_000).any():
        raise ValueError("trip too far")
    return {"ok": batch["trip_id"]}


def add_fare_per_mile(batch: pa.Table) -> dict[str, Any]:
    fare = pc.cast(batch.column("fare_amount"), pa.float64())
    miles = pc.add(pc.cast(batch.column("trip_distance"), pa.float64()), 1.0)
    return {"fare_per_mile": pc.divide(fare, miles)}


def times_ten(batch: pd.DataFrame) -> dict[str, Any]:
    return {
        "value": batch["fare_per_mile"].to_numpy() * 10,
        "seen": [",".join(batch.columns)] * len(batch),
    }


def plus_one(name: str) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    def model(batch: dict[str, np.ndarray]) -> np.ndarray:
        return batch[name] + 1

    return model


# -------------------------------------------------------------------- 1. file inputs


@pytest.fixture(scope="session")
def text_inputs(taxi_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first three taxi months as Parquet, CSV and JSON Lines: ``<root>/<fmt>/taxi-<i>``."""
    root = tmp_path_factory.mktemp("inputs")
    files = sorted(taxi_dir.glob("*.parquet"))[:3]
    for fmt in EXT:
        (root / fmt).mkdir()
        for i, path in enumerate(files):
            table = pq.read_table(path, columns=TEXT_COLUMNS)
            target = root / fmt / f"taxi-{i}.{EXT[fmt]}"
            if fmt == "parquet":
                pq.write_table(table, target)
            elif fmt == "csv":
                pacsv.write_csv(table, target)
            else:
                table.to_pandas().to_json(target, orient="records", lines=True)
    return root


def text_paths(root: Path, fmt: str, layout: str) -> tuple[str, list[int]]:
    """The path for ``layout`` and the indexes of the files it names."""
    folder = root / fmt
    if layout == "file":
        return str(folder / f"taxi-1.{EXT[fmt]}"), [1]
    if layout == "directory":
        return str(folder), [0, 1, 2]
    return str(folder / f"taxi-[02].{EXT[fmt]}"), [0, 2]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("layout", ["file", "directory", "glob"])
@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_file_inputs_with_projection(
    engine: str, fmt: str, layout: str, text_inputs: Path, tmp_path: Path
) -> None:
    path, indexes = text_paths(text_inputs, fmt, layout)
    log = tmp_path / "reads.jsonl"
    job = chute.Job(
        source=RecordingSource(path, log),
        models=(chute.Model("m", score_and_columns, inputs=("passenger_count", "fare_amount")),),
        carryover=("trip_id",),
        engine=engine,
    )
    result = job.run().result
    assert result is not None

    expected = sort_by(
        pa.concat_tables(
            pq.read_table(text_inputs / "parquet" / f"taxi-{i}.parquet") for i in indexes
        )
    )
    got = sort_by(result)
    assert got.column_names == ["trip_id", "m_score", "m_seen"]
    np.testing.assert_array_equal(column(got, "trip_id"), column(expected, "trip_id"))
    want = column(expected, "fare_amount") * column(expected, "passenger_count")
    np.testing.assert_allclose(column(got, "m_score"), want)
    # The model sees only its inputs; only carryover + inputs were asked of the source.
    assert set(got.column("m_seen").to_pylist()) == {"passenger_count,fare_amount"}
    reads = read_log(log)
    assert len(reads) == len(indexes)
    assert all(set(r["columns"]) == {"trip_id", "passenger_count", "fare_amount"} for r in reads)


# ---------------------------------------------------------------- 2. in-memory inputs

MEMORY_ROWS = 300_000  # more than one in-memory unit (262,144 rows)


def memory_frame() -> pd.DataFrame:
    rng = np.random.default_rng(7)
    return pd.DataFrame({"x": np.arange(MEMORY_ROWS, dtype=np.int64), "w": rng.random(MEMORY_ROWS)})


def x_times_w(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"y": batch["x"] * batch["w"]}


def check_memory_result(df: pd.DataFrame, frame: pd.DataFrame) -> None:
    assert list(df.columns) == ["x", "w", "m_y"]
    np.testing.assert_array_equal(df["x"].to_numpy(), frame["x"].to_numpy())  # input order
    np.testing.assert_array_equal(df["m_y"].to_numpy(), (frame["x"] * frame["w"]).to_numpy())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["pandas", "arrow", "numpy-dict"])
def test_predict_in_memory(engine: str, kind: str) -> None:
    frame = memory_frame()
    data: Any = {
        "pandas": frame,
        "arrow": pa.Table.from_pandas(frame, preserve_index=False),
        "numpy-dict": {"x": frame["x"].to_numpy(), "w": frame["w"].to_numpy()},
    }[kind]
    model = chute.Model("m", x_times_w, batch_format="numpy", batch_size=50_000)
    check_memory_result(chute.predict(data, model, engine=engine), frame)


def scale_in_place(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``torch.from_numpy`` ignores a read-only flag: it scales the batch's own buffer."""
    import torch

    x = torch.from_numpy(batch["x"])
    x.div_(10.0)
    return {"y": x.numpy().copy()}


def centre_in_place(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import torch

    x = torch.from_numpy(batch["x"])
    x.sub_(5.0)
    return {"xc": x.numpy().copy()}


def seen(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"x": batch["x"].copy()}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["model", "preprocess"])
def test_a_function_writing_into_its_numpy_batch_changes_no_carried_column(
    engine: str, where: str, tmp_path: Path
) -> None:
    """A NumPy batch's arrays are read-only views of the batch's buffers, but
    ``torch.from_numpy(x).div_(10)`` writes through them: the carried ``x`` and a later
    model's input were written divided, and the run was complete."""
    pytest.importorskip("torch")
    x = np.arange(6_000, dtype=np.float64) * 10.0
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": np.arange(6_000), "x": x}), source)
    first = chute.Model("n", scale_in_place, inputs=("x",), batch_format="numpy", batch_size=500)
    later = chute.Model("s", seen, inputs=("x",), batch_format="numpy")
    step = chute.Preprocess(centre_in_place, inputs=("x",), batch_format="numpy")
    chute.Job(
        source=chute.FileSource(str(source)),
        models=(first, later) if where == "model" else (later,),
        preprocess=step if where == "preprocess" else None,
        carryover=("id", "x"),
        output=chute.Sink(str(tmp_path / "out")),
        engine=engine,
    ).run()
    out = pq.read_table(tmp_path / "out").sort_by("id")
    np.testing.assert_array_equal(out.column("x").to_numpy(), x)  # carried as read
    np.testing.assert_array_equal(out.column("s_x").to_numpy(), x)  # the later model's
    if where == "model":
        np.testing.assert_array_equal(out.column("n_y").to_numpy(), x / 10.0)


def scale_or_fail(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Scales its input in place (``torch.from_numpy`` writes into a read-only array all
    the same), then fails a batch that holds the row ``x == 7``."""
    import torch

    x = batch["x"]
    torch.from_numpy(x).mul_(10.0)
    if (x == 70.0).any():
        raise ValueError("row 7")
    return {"y": x.copy()}


@pytest.mark.timeout(120)
def test_a_call_retried_after_writing_into_its_batch_gets_the_rows_as_read(engine: str) -> None:
    """A bisection (``on_error: quarantine``) gave the retried halves the buffer the failed
    call had scaled: every good row of the batch was written 100 x, not 10 x, exit 0; and
    the caller's own array was left scaled."""
    pytest.importorskip("torch")
    x = np.arange(16, dtype=np.float64)
    given = x.copy()
    model = chute.Model(
        "m", scale_or_fail, inputs=("x",), batch_format="numpy", batch_size=16,
        on_error="quarantine",
    )  # fmt: skip
    frame = chute.predict({"id": np.arange(16), "x": given}, model, engine=engine, carryover="id")
    np.testing.assert_array_equal(given, x)  # the caller's data: untouched
    good = frame[frame["id"] != 7].sort_values("id")
    np.testing.assert_array_equal(good["m_y"].to_numpy(), good["id"].to_numpy() * 10.0)


@pytest.mark.timeout(60)
def test_predict_numpy_dict_with_2d_array(engine: str) -> None:
    emb = np.arange(30_000, dtype=np.float32).reshape(10_000, 3)
    data = {"id": np.arange(10_000), "emb": emb}

    def norm(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert batch["emb"].shape[1:] == (3,)
        return {"sum": batch["emb"].sum(axis=1), "twice": batch["emb"] * 2}

    model = chute.Model("e", norm, inputs=("emb",), batch_format="numpy", batch_size=3000)
    df = chute.predict(data, model, engine=engine)
    assert list(df.columns) == ["id", "emb", "e_sum", "e_twice"]
    np.testing.assert_array_equal(df["id"].to_numpy(), np.arange(10_000))
    np.testing.assert_array_equal(df["e_sum"].to_numpy(), emb.sum(axis=1))
    np.testing.assert_array_equal(np.stack(df["e_twice"].to_numpy()), emb * 2)


@pytest.mark.timeout(60)
def test_predict_ray_dataset(engine: str, ray_session: Any) -> None:
    frame = memory_frame().iloc[:40_000]
    table = pa.Table.from_pandas(frame, preserve_index=False)
    dataset = ray_session.data.from_arrow(
        [table.slice(i, 10_000) for i in range(0, 40_000, 10_000)]
    )
    model = chute.Model("m", x_times_w, batch_format="numpy", batch_size=7_000)
    df = chute.predict(dataset, model, engine=engine)
    check_memory_result(df, frame)


def halves(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"half": batch["id"] / 2}


@pytest.mark.timeout(120)
def test_a_ray_dataset_changed_since_its_output_was_written_is_another_job(
    ray_session: Any, tmp_path: Path
) -> None:
    """The fingerprint hashes a Ray Dataset's blocks where they live: the same Dataset
    again resumes (nothing to do); one value changed, with as many blocks, is refused as
    a different job (before, only the block count was compared, and the changed data
    was resumed into the old output)."""
    from chute.sources import DatasetSource

    def dataset(bump: int) -> Any:
        ids = np.arange(1_000)
        tables = [
            pa.table({"id": ids[i : i + 250] + (bump if i == 500 else 0)})
            for i in range(0, 1_000, 250)
        ]
        return ray_session.data.from_arrow(tables)

    model = chute.Model("m", halves, inputs=("id",), batch_format="numpy")
    out = str(tmp_path / "out")
    first = DatasetSource(dataset(0)).describe()
    assert first == DatasetSource(dataset(0)).describe()
    assert first["content"] != DatasetSource(dataset(1)).describe()["content"]
    chute.Job(DatasetSource(dataset(0)), (model,), output=chute.Sink(out), engine="local").run()
    again = chute.Job(DatasetSource(dataset(0)), (model,), output=chute.Sink(out), engine="local")
    assert again.run().units_done == 0
    changed = chute.Job(DatasetSource(dataset(1)), (model,), output=chute.Sink(out), engine="local")
    with pytest.raises(chute.JobStateError, match="holds the results of a different job"):
        changed.run()


def sorted_twice(batch: Any) -> Any:
    """A pandas model that sorts its rows before it answers (its index still names them)."""
    ordered = batch.sort_values("x", ascending=False)
    return ordered.assign(twice=ordered["x"] * 2)[["twice"]]


@pytest.mark.timeout(60)
def test_a_pandas_model_that_reorders_its_rows_gets_each_answer_on_its_own_row(
    engine: str,
) -> None:
    """Taken by position, a reordered result was attached to other rows: 80, 60, 40, 20
    beside x = 10, 20, 30, 40. Its index names the rows: it is put back in order."""
    frame = pd.DataFrame({"x": np.arange(1, 1_001) * 10})
    model = chute.Model("m", sorted_twice, inputs=("x",), batch_format="pandas", batch_size=64)
    got = chute.predict(frame, model, engine=engine).sort_values("x")
    np.testing.assert_array_equal(got["m_twice"].to_numpy(), got["x"].to_numpy() * 2)


def columns_seen(batch: Any) -> Any:
    return {"n": np.full(len(batch), len(batch.columns))}


def twice_by_dict(batch: Any) -> Any:
    """A dict of Series, one of them sorted: each value is put back in order by its index."""
    ordered = batch["x"].sort_values(ascending=False)
    return {"twice": ordered * 2}


@pytest.mark.timeout(60)
def test_a_pandas_batch_never_takes_the_index_pandas_stored_in_the_file(
    engine: str, tmp_path: Path
) -> None:
    """A file pandas wrote from a shuffled frame stores its index (__index_level_0__):
    given to the batch, a result with positions for its index was put back "in order" by
    those labels, every answer on another row. And a dict's sorted Series was taken by
    position."""
    frame = pd.DataFrame({"x": np.arange(1, 501) * 10}).sample(frac=1, random_state=0)
    frame.to_parquet(tmp_path / "shuffled.parquet")
    fresh = chute.Model(
        "m",
        lambda batch: pd.DataFrame({"twice": batch["x"].to_numpy() * 2}),
        batch_format="pandas",
    )
    by_dict = chute.Model("d", twice_by_dict, batch_format="pandas", batch_size=64)
    width = chute.Model("w", columns_seen, batch_format="pandas")
    source = chute.FileSource(str(tmp_path / "shuffled.parquet"))
    got = chute.predict(source, (width, fresh, by_dict), engine=engine)
    assert (got["w_n"] == 1).all()  # the stored index is not a column the model sees
    np.testing.assert_array_equal(got["m_twice"].to_numpy(), got["x"].to_numpy() * 2)
    np.testing.assert_array_equal(got["d_twice"].to_numpy(), got["x"].to_numpy() * 2)


def sorted_from_arrow(batch: Any) -> Any:
    """An Arrow-batch model that answers through pandas, sorted: its index is the rows'
    places (0..n-1) in another order."""
    return batch.to_pandas()["x"].sort_values(ascending=False) * 2


def two_outputs(batch: Any) -> Any:
    return batch["x"] * 2, batch["x"] * 3


@pytest.mark.timeout(60)
def test_an_arrow_model_answering_in_pandas_order_and_a_tuple_are_not_taken_by_position() -> None:
    """The sorted Series of an Arrow batch was taken by position (every row got another
    row's answer); a tuple of two outputs from a batch of two rows was transposed (row 0
    got both rows' first output)."""
    table = pa.table({"x": np.arange(1, 1_001) * 10})
    model = chute.Model("m", sorted_from_arrow, inputs=("x",), batch_format="pyarrow")
    got = chute.predict(table, model, engine="local").sort_values("x")
    np.testing.assert_array_equal(got["m"].to_numpy(), got["x"].to_numpy() * 2)
    model = chute.Model("m", two_outputs, inputs=("x",), batch_format="numpy", batch_size=2)
    with pytest.raises(chute.ModelError, match="returned a tuple of 2; return a dict"):
        chute.predict(table, model, engine="local")


# ------------------------------------------------------------------ 3. kinds of model


@pytest.mark.timeout(60)
def test_model_function(engine: str, taxi_dir: Path) -> None:
    report = tip_job(taxi_dir, None, engine).run()
    assert report.engine == engine
    assert report.result is not None
    assert report.result.column_names == ["trip_id", "tip_score"]
    check_tips(report.result, taxi_dir)


@pytest.mark.timeout(60)
def test_model_class_loads_once_per_replica(engine: str, taxi_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "constructed.log"
    model = chute.Model(
        "scaled",
        Scaler,
        inputs=("trip_id",),
        batch_format="numpy",
        batch_size=2_000,
        pool=chute.Pool.fixed(2),
        args=(3,),
        kwargs={"log": str(log)},
    )
    job = taxi_job(taxi_dir, [model], engine)
    report = job.run()
    assert report.result is not None
    got = sort_by(report.result)
    np.testing.assert_array_equal(column(got, "scaled_value"), column(got, "trip_id") * 3)
    # Once per replica, never per batch. Ray Data may finish with the first actor before
    # the second one is up, and then never constructs it.
    constructions = len(log_lines(log))
    assert constructions == 2 if engine == "local" else 1 <= constructions <= 2
    assert report.stages["scaled"].calls >= 30  # 60,000 rows in model calls of 2,000


@pytest.mark.timeout(60)
def test_model_import_string(engine: str, taxi_dir: Path, tmp_path: Path) -> None:
    module = tmp_path / "tip_from_file.py"
    module.write_text(
        "import numpy as np\n\n\n"
        "def tip(batch):\n"
        "    return {'score': (batch['passenger_count'] >= 2).astype(np.float32)}\n"
    )
    report = tip_job(taxi_dir, None, engine, fn=f"{module}:tip").run()
    assert report.result is not None
    check_tips(report.result, taxi_dir)


# ------------------------------------------------------- 4. batch formats and sizes


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("batch_format", "kind"),
    [("pyarrow", "Table"), ("pandas", "DataFrame"), ("numpy", "dict")],
)
def test_batch_format(engine: str, taxi_dir: Path, batch_format: str, kind: str) -> None:
    model = chute.Model(
        "p", batch_probe, inputs=("trip_id",), batch_format=batch_format, batch_size=5_000
    )
    job = taxi_job(taxi_dir, [model], engine)
    result = job.run().result
    assert result is not None and result.num_rows == 60_000
    assert set(result.column("p_kind").to_pylist()) == {kind}
    assert pc.max(result.column("p_n")).as_py() == 5_000


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("batch_size", "rows"),
    [pytest.param(1_000, 1_000, id="rows"), pytest.param("16KiB", 1_024, id="bytes")],
)
def test_batch_size(engine: str, taxi_dir: Path, batch_size: Any, rows: int) -> None:
    # trip_id (int64) and fare_amount (float64): 16 bytes a row, so 16 KiB is 1,024 rows.
    model = chute.Model("p", batch_len, inputs=("trip_id", "fare_amount"), batch_size=batch_size)
    job = taxi_job(taxi_dir, [model], engine)
    result = job.run().result
    assert result is not None and result.num_rows == 60_000
    sizes = column(result, "p")
    assert sizes.max() == rows
    assert sizes.min() >= 1


# --------------------------------------------------------- 5. several models, one read


@pytest.mark.timeout(90)
def test_two_models_read_input_once(engine: str, taxi_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "reads.jsonl"
    source = RecordingSource(str(taxi_dir), log)
    units = [u.id for u in chute.FileSource(str(taxi_dir)).plan()]
    job = chute.Job(
        source=source,
        models=(
            chute.Model("a", batch_len, inputs=("trip_id",), batch_size=1_000),
            chute.Model("b", batch_probe, inputs=("fare_amount",), batch_size=3_000),
        ),
        carryover=("trip_id",),
        output=chute.Sink(str(tmp_path / "out")),
        engine=engine,
    )
    report = job.run()
    assert report.rows_out == 60_000
    out = read_parts(tmp_path / "out")
    assert out.column_names == ["trip_id", "a", "b_n", "b_kind"]
    assert column(out, "a").max() == 1_000
    assert column(out, "b_n").max() == 3_000
    np.testing.assert_array_equal(column(out, "trip_id"), np.arange(60_000))
    reads = Counter(r["unit"] for r in read_log(log))
    assert reads == dict.fromkeys(units, 1), "each unit read exactly once"


# ------------------------------------------------------------------------ 6. carryover

CARRY = ("trip_id", "vendor_id", "pickup_at", "passenger_count")


@pytest.mark.timeout(60)
def test_carryover_lands_untouched(engine: str, taxi_dir: Path, tmp_path: Path) -> None:
    def seen(batch: pa.Table) -> dict[str, Any]:
        return {"cols": pa.array([",".join(batch.column_names)] * batch.num_rows)}

    model = chute.Model("m", seen, inputs=("fare_amount",))
    job = taxi_job(taxi_dir, [model], engine, tmp_path / "out", carryover=CARRY)
    job.run()
    out = read_parts(tmp_path / "out")
    expected = sort_by(taxi(taxi_dir, list(CARRY)))
    assert out.column_names == [*CARRY, "m_cols"]
    carried = out.select(list(CARRY))
    assert carried.schema == expected.schema  # including timestamp[s], string and int8
    assert carried.equals(expected)
    assert set(out.column("m_cols").to_pylist()) == {"fare_amount"}


# ----------------------------------------------------------------------- 7. preprocess


PRE = chute.Preprocess(add_fare_per_mile, inputs=("fare_amount", "trip_distance"))


@pytest.mark.timeout(60)
def test_every_stage_reports_its_busy_time_over_every_row(
    engine: str, taxi_dir: Path, tmp_path: Path
) -> None:
    """Read, preprocess and two model stages, on both engines: each stage's rows add up to
    the input, over at least one batch, in measured time (on Ray they travel with the rows)."""
    first = chute.Model("a", times_ten, inputs=("fare_per_mile",), batch_format="pandas")
    second = chute.Model("b", times_ten, inputs=("fare_per_mile",), batch_format="pandas")
    job = taxi_job(
        taxi_dir, [first, second], engine, tmp_path / "out", ("trip_id",), preprocess=PRE
    )
    report = job.run()
    assert {"read", "preprocess", "a", "b"} <= set(report.stages)
    for name in ("read", "preprocess", "a", "b"):
        stats = report.stages[name]
        assert stats.rows == 60_000, name
        assert stats.batches >= 1 and stats.busy_seconds > 0, name
    written = read_parts(tmp_path / "out").column_names
    assert written == ["trip_id", "a_value", "a_seen", "b_value", "b_seen"]  # no statistics


@pytest.mark.timeout(60)
def test_preprocess_feeds_model(engine: str, taxi_dir: Path, tmp_path: Path) -> None:
    model = chute.Model("m", times_ten, inputs=("fare_per_mile",), batch_format="pandas")
    job = taxi_job(
        taxi_dir, [model], engine, tmp_path / "out", ("trip_id", "fare_amount"), preprocess=PRE
    )
    report = job.run()
    assert report.stages["preprocess"].rows == 60_000
    out = read_parts(tmp_path / "out")
    # The preprocess column fed the model but is not written: it was not carried.
    assert out.column_names == ["trip_id", "fare_amount", "m_value", "m_seen"]
    expected = sort_by(taxi(taxi_dir, ["trip_id", "fare_amount", "trip_distance"]))
    want = column(expected, "fare_amount") / (column(expected, "trip_distance") + 1.0) * 10
    np.testing.assert_allclose(column(out, "m_value"), want)
    assert out.column("fare_amount").equals(expected.column("fare_amount"))
    assert set(out.column("m_seen").to_pylist()) == {"fare_per_mile"}


def tens(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"p": batch["id"] * 10}


def shout(batch: pd.DataFrame) -> dict[str, Any]:
    return {"u": batch["s"].str.upper(), "q": batch["p"] + 1}


@pytest.mark.timeout(90)
def test_a_preprocess_step_over_an_empty_and_an_unreadable_file(
    engine: str, tmp_path: Path
) -> None:
    """A 0-row file (a finished unit of 0 rows) or one skipped under on_bad_input: skip
    stopped a job with a preprocess step, which was handed the unit's place and raised
    "Field 'id' does not exist" (exit 4). The text a pandas model returns for rows of two
    files joined in one batch (pandas' Arrow-backed text, in chunks) stopped the local
    engine on an unexpected TypeError."""
    data = tmp_path / "in"
    data.mkdir()
    for name, ids in [("a", [0, 1, 2]), ("b", []), ("d", [3, 4, 5])]:
        table = pa.table({"id": pa.array(ids, pa.int64()), "s": [f"row{i}" for i in ids]})
        pq.write_table(table, data / f"{name}.parquet")
    (data / "c.parquet").write_bytes(b"PAR1 not a Parquet file PAR1")
    report = chute.Job(
        chute.FileSource(str(data)),
        [chute.Model("m", shout, inputs=("s", "p"), batch_format="pandas", batch_size=128)],
        chute.Sink(str(tmp_path / "out")),
        carryover=("id",),
        preprocess=chute.Preprocess(tens, inputs=("id",), batch_format="numpy"),
        on_bad_input="skip",
        engine=engine,  # type: ignore[arg-type]
    ).run()
    assert report.stopped == "complete" and report.rows_out == 6
    assert [bad["unit"] for bad in report.units_bad] == [str(data / "c.parquet")]
    out = pq.read_table(tmp_path / "out").sort_by("id")
    assert out.column("id").to_pylist() == list(range(6))
    assert out.column("m_u").to_pylist() == [f"ROW{i}" for i in range(6)]
    assert out.column("m_q").to_pylist() == [i * 10 + 1 for i in range(6)]


# ------------------------------------------------------------------- 8. output formats


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_output_formats(engine: str, taxi_dir: Path, tmp_path: Path, fmt: str) -> None:
    out = tmp_path / "out"
    job = tip_job(taxi_dir, None, engine)
    job = chute.Job(job.source, job.models, chute.Sink(str(out), fmt), job.carryover, engine=engine)
    report = job.run()
    assert report.result is None  # no rows came back to the driver, only part records
    assert report.rows_out == 60_000 and report.units_done == 12
    assert report.parts >= 1  # data files: the local writer joins small units into one
    names = [p.name for p in out.rglob("*")]
    assert not [n for n in names if n.startswith(".")], "temporary files left behind"
    assert (out / "_SUCCESS").is_file()
    parts = sorted(p.name for p in out.glob("part-*"))
    assert len(parts) == report.parts and all(p.endswith("." + EXT[fmt]) for p in parts)
    ledger = [json.loads(line) for line in log_lines(out / "_chute" / "ledger.jsonl")]
    assert len(ledger) == 12
    assert sorted({p for e in ledger for p in e["parts"]}) == parts  # a shared file: once
    assert sum(e["rows"] for e in ledger) == 60_000
    assert json.loads((out / "_chute" / "report.json").read_text())["parts"] == report.parts
    check_tips(read_parts(out, fmt), taxi_dir)


# ---------------------------------------------------------- 9. same result, both engines


def mixed_job(taxi_dir: Path, out: Path, engine: str) -> chute.Job:
    """A preprocess, two models with their own batch sizes, four carried columns."""
    models = [
        chute.Model(
            "tip",
            chute.demo.tip_model,
            inputs=("passenger_count",),
            batch_format="numpy",
            batch_size=4_000,
        ),
        chute.Model(
            "m", times_ten, inputs=("fare_per_mile",), batch_format="pandas", batch_size=7_000
        ),
    ]
    return taxi_job(taxi_dir, models, engine, out, CARRY, preprocess=PRE)


@pytest.mark.timeout(90)
def test_same_result_on_both_engines(taxi_dir: Path, tmp_path: Path, ray_session: Any) -> None:
    reports = {e: mixed_job(taxi_dir, tmp_path / e, e).run() for e in ("local", "ray")}
    local, ray = read_parts(tmp_path / "local"), read_parts(tmp_path / "ray")
    assert local.num_rows == 60_000
    assert local.equals(ray)
    assert reports["local"].fingerprint == reports["ray"].fingerprint
    for field in ("rows_in", "rows_out", "units_done", "units_total"):
        assert getattr(reports["local"], field) == getattr(reports["ray"], field)

    def committed(root: Path) -> dict[str, int]:
        lines = log_lines(root / "_chute" / "ledger.jsonl")
        return {e["unit"]: e["rows"] for e in map(json.loads, lines)}

    assert committed(tmp_path / "local") == committed(tmp_path / "ray")


# -------------------------------------------------------------------- 10. no deadlock


@pytest.mark.timeout(120)
def test_no_deadlock_one_model(engine: str, taxi_dir: Path, tmp_path: Path) -> None:
    report = tip_job(taxi_dir, tmp_path / "out", engine).run()
    assert report.rows_out == 60_000
    check_tips(read_parts(tmp_path / "out"), taxi_dir)


@pytest.mark.timeout(120)
def test_no_deadlock_three_chained_models(engine: str, taxi_dir: Path, tmp_path: Path) -> None:
    models = (
        chute.Model("a", plus_one("trip_id"), inputs=("trip_id",), batch_format="numpy"),
        chute.Model("b", plus_one("a"), inputs=("a",), batch_format="numpy", batch_size=5_000),
        chute.Model("c", plus_one("b"), inputs=("b",), batch_format="numpy", batch_size=3_000),
    )
    job = taxi_job(taxi_dir, models, engine, tmp_path / "out")
    assert job.run().rows_out == 60_000
    out = read_parts(tmp_path / "out")
    np.testing.assert_array_equal(column(out, "c"), column(out, "trip_id") + 3)


@pytest.mark.timeout(120)
def test_no_deadlock_explicit_pool_of_two(engine: str, taxi_dir: Path, tmp_path: Path) -> None:
    report = tip_job(
        taxi_dir, tmp_path / "out", engine, pool=chute.Pool(min=2, max=2), batch_size=4_000
    ).run()
    assert report.rows_out == 60_000
    check_tips(read_parts(tmp_path / "out"), taxi_dir)


@pytest.mark.timeout(60)
def test_impossible_cpus_fail_at_once(ray_session: Any, taxi_dir: Path, tmp_path: Path) -> None:
    job = tip_job(
        taxi_dir,
        tmp_path / "out",
        "ray",
        resources=chute.Resources(cpus=2),
        pool=chute.Pool.fixed(2),
    )
    with pytest.raises(chute.ResourceError, match="CPUs"):
        job.run()
    assert not list((tmp_path / "out").glob("part-*"))


# ------------------------------------------------------------------ 11. GPUs on Ray


@pytest.mark.timeout(60)
def test_gpu_on_gpuless_ray_fails_fast(ray_session: Any, taxi_dir: Path, tmp_path: Path) -> None:
    job = tip_job(taxi_dir, tmp_path / "out", "ray", resources=chute.Resources(gpus=1))
    with pytest.raises(chute.ResourceError) as excinfo:
        job.run()
    message = str(excinfo.value)
    assert "'tip'" in message and "GPU" in message
    assert "the cluster has 0" in message


# --------------------------------------------------------------------- 12. bad input


def _good_job(ctx: dict[str, Path]) -> chute.Job:
    return chute.Job(
        source=chute.FileSource(str(ctx["taxi"])),
        models=(
            chute.Model(
                "tip",
                LoggedTip,
                inputs=("passenger_count",),
                batch_format="numpy",
                kwargs={"log": str(ctx["log"])},
            ),
        ),
        carryover=("trip_id",),
        output=chute.Sink(str(ctx["out"])),
    )


def _with(job: chute.Job, **changes: Any) -> chute.Job:
    fields = {
        "source": job.source,
        "models": job.models,
        "carryover": job.carryover,
        "output": job.output,
        "engine": job.engine,
        **changes,
    }
    return chute.Job(**fields)


def _bad_model(job: chute.Job, **changes: Any) -> chute.Job:
    model = job.models[0]
    spec = {
        "name": model.name,
        "fn": model.fn,
        "inputs": model.inputs,
        "batch_format": model.batch_format,
        "kwargs": model.kwargs,
        **changes,
    }
    return _with(job, models=(chute.Model(**spec),))


BAD_INPUTS: list[Any] = [
    pytest.param(
        lambda job, ctx: _with(job, source=chute.FileSource(str(ctx["tmp"] / "nowhere"))),
        chute.DataError,
        ["does not exist", "nowhere"],
        id="missing-path",
    ),
    pytest.param(
        lambda job, ctx: _with(job, source=chute.FileSource(str(ctx["empty"]))),
        chute.DataError,
        ["no input files"],
        id="empty-directory",
    ),
    pytest.param(
        lambda job, ctx: _bad_model(job, inputs=("pasenger_count",)),
        chute.ColumnNotFoundError,
        ["'pasenger_count'", "Did you mean 'passenger_count'?", "Available columns:", "trip_id"],
        id="missing-model-input",
    ),
    pytest.param(
        lambda job, ctx: _with(job, carryover=("trip_id", "vendorid")),
        chute.ColumnNotFoundError,
        ["'vendorid'", "Did you mean 'vendor_id'?", "Available columns:", "fare_amount"],
        id="missing-carryover",
    ),
    pytest.param(
        lambda job, ctx: _bad_model(job, batch_size=0),
        chute.ConfigError,
        ["batch size must be > 0"],
        id="batch-size-0",
    ),
    pytest.param(
        lambda job, ctx: _with(job, carryover=("trip_id", "vendor_id")),
        chute.JobStateError,
        ["different job", "carryover"],
        id="another-jobs-output",
    ),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("make", "error", "words"), BAD_INPUTS)
def test_bad_input_fails_before_compute(
    engine: str,
    taxi_dir: Path,
    tmp_path: Path,
    make: Callable[[chute.Job, dict[str, Path]], chute.Job],
    error: type[Exception],
    words: list[str],
) -> None:
    ctx = {
        "taxi": taxi_dir,
        "tmp": tmp_path,
        "out": tmp_path / "out",
        "log": tmp_path / "earlier.log",
        "empty": tmp_path / "empty",
    }
    ctx["empty"].mkdir()
    assert _good_job(ctx).run().rows_out == 60_000  # the earlier results (local engine)
    before = snapshot(ctx["out"])
    ctx["log"] = tmp_path / "constructed.log"

    with pytest.raises(error) as excinfo:
        _with(make(_good_job(ctx), ctx), engine=engine).run()
    for word in words:
        assert word in str(excinfo.value)
    assert snapshot(ctx["out"]) == before, "the earlier output was touched"
    assert not ctx["log"].exists(), "a model was loaded before the error"


# --------------------------------------------------------------- 13. a model that fails


@pytest.mark.timeout(90)
def test_model_error_names_the_model(engine: str, taxi_dir: Path, tmp_path: Path) -> None:
    model = chute.Model(
        "fragile", fails_on_big_trips, inputs=("trip_id",), batch_format="numpy", batch_size=5_000
    )
    job = taxi_job(taxi_dir, [model], engine, tmp_path / "out")
    with pytest.raises(chute.ModelError) as excinfo:
        job.run()
    assert type(excinfo.value) is chute.ModelError, f"got {type(excinfo.value).__mro__}"
    assert "'fragile'" in str(excinfo.value)
    assert "ValueError" in str(excinfo.value) and "trip too far" in str(excinfo.value)
    assert not (tmp_path / "out" / "_SUCCESS").exists()


# ------------------------------------------------ 14. a large constructor argument

LARGE = 50 * 2**20 // 8  # 50 MiB of float64


@pytest.mark.timeout(90)
def test_large_constructor_argument(engine: str, taxi_dir: Path, tmp_path: Path) -> None:
    payload = np.arange(LARGE, dtype=np.float64)[::-1].copy()
    log = tmp_path / "constructed.log"
    model = chute.Model(
        "lookup",
        Lookup,
        inputs=("trip_id",),
        batch_format="numpy",
        pool=chute.Pool.fixed(2),
        args=(payload,),
        kwargs={"log": str(log)},
    )
    job = taxi_job(taxi_dir, [model], engine)
    assert len(json.dumps(job.describe())) < 2_000  # the fingerprint does not hash the payload
    result = job.run().result
    assert result is not None
    got = sort_by(result)
    np.testing.assert_array_equal(column(got, "lookup_value"), LARGE - 1 - column(got, "trip_id"))
    constructions = log_lines(log)
    assert len(constructions) == 2 if engine == "local" else 1 <= len(constructions) <= 2
    if engine == "ray":  # read zero-copy from the object store, not unpickled per actor
        assert set(constructions) == {"read-only"}


def all_cpus_free(ray: Any) -> bool:
    """Whether the session Ray's 2 CPUs are free and no pool actor of this driver lives.

    No waiting here: a run returns only once its actors have exited and Ray shows their
    CPUs free again (:func:`chute.engines.ray.released`), so this holds the moment it does.
    """
    return live_pool_actors() == 0 and ray.available_resources().get("CPU", 0) == 2


def test_a_finished_fused_run_does_not_wait_for_rays_view(
    ray_session: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of tasks only (every model fused into the reads) that finished has nothing
    left holding CPUs: it returns without polling Ray's view of them. One with actors, and
    a failed one (tasks may still run), wait."""
    from chute.engines.ray import release

    waits: list[str] = []
    monkeypatch.setattr(release, "_wait_for", lambda condition, seconds: waits.append("w"))
    with release.released(actors=False):
        pass
    assert waits == []
    with pytest.raises(KeyError), release.released(actors=False):
        raise KeyError("a failed run")
    assert waits == ["w", "w"]
    with release.released(actors=True):
        pass
    assert waits == ["w"] * 4


@pytest.mark.timeout(240)  # the engine waits up to 70 s per run for its actors to go
def test_ray_run_gives_its_cpus_back(ray_session: Any, taxi_dir: Path) -> None:
    # Otherwise the next run in this process (a notebook) finds CPUs taken: its reads
    # starve and it hangs.
    tip_job(taxi_dir, None, "ray", pool=chute.Pool.fixed(2)).run()
    assert all_cpus_free(ray_session), (
        f"CPUs still held after a finished run: {ray_session.available_resources()}, "
        f"{live_pool_actors()} pool actor(s) alive"
    )

    model = chute.Model("fragile", fails_on_big_trips, inputs=("trip_id",), batch_format="numpy")
    with pytest.raises(chute.ModelError) as excinfo:
        taxi_job(taxi_dir, [model], "ray").run()
    # A notebook keeps its last exception: it must not keep the failed run's actors.
    assert all_cpus_free(ray_session), (
        f"CPUs still held after a failed run: {ray_session.available_resources()}, "
        f"{live_pool_actors()} pool actor(s) alive"
    )
    assert "'fragile'" in str(excinfo.value)


class BrokenLoad:
    def __init__(self) -> None:
        raise RuntimeError("no weights here")

    def __call__(self, batch: Any) -> Any:
        return batch


@pytest.mark.timeout(90)
def test_model_that_fails_to_load(engine: str, taxi_dir: Path) -> None:
    job = tip_job(taxi_dir, None, engine, fn=BrokenLoad)
    with pytest.raises(chute.ModelError) as excinfo:
        job.run()
    assert type(excinfo.value) is chute.ModelError, f"got {type(excinfo.value).__mro__}"
    assert "'tip' failed to load" in str(excinfo.value)
    assert "no weights here" in str(excinfo.value)
