"""Quarantine at a bounded cost (issue 17, point 6): isolating failing rows costs model calls
in proportion to the failing rows, not to the batch, and a model that marks its failed rows
itself (an ``_error`` output) costs no extra call."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import chute
from chute import Model
from chute.stages import ModelStage, tag
from chute.stages.rows import ERROR_MESSAGE, ERROR_TYPE, healthy_rows
from tests.runs import local_run

N = 4_096


class Counting:
    """Raises on the rows whose ``x`` is in ``bad``; counts its calls."""

    def __init__(self, bad: set[int]) -> None:
        self.bad, self.calls = np.array(sorted(bad)), 0

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls += 1
        hit = np.isin(batch["x"], self.bad)
        if hit.any():
            raise ValueError(f"bad row {int(batch['x'][hit][0])}")
        return {"p": batch["x"] * 2}


def _run(model: Counting | object, on_error: str = "quarantine") -> pa.Table:
    stage = ModelStage(
        Model("m", model, batch_format="numpy", on_error=on_error),  # type: ignore[arg-type]
        ["x"],
        rows=N,  # the whole table in one call: the bisection's call counts are exact
    )
    table = tag(pa.table({"x": np.arange(N, dtype=np.int64)}), 0, 0, N)
    return stage(table)


def _failed(out: pa.Table) -> list[int]:
    healthy = healthy_rows(out)
    assert healthy is not None
    return sorted(set(range(out.num_rows)) - set(healthy.tolist()))


@pytest.mark.parametrize(
    "bad",
    [
        {1_000},
        set(range(0, N, N // 4)),  # spread
        set(range(2_000, 2_040)),  # clustered
        set(range(7, N, 33)),  # 3% spread
    ],
    ids=["one", "spread", "clustered", "three-percent"],
)
def test_calls_grow_with_the_bad_rows_not_the_batch(bad: set[int]) -> None:
    model = Counting(bad)
    out = _run(model)
    assert _failed(out) == sorted(bad)
    bound = 1 + len(bad) * (2 * math.log2(N) + 1)  # the bound the docstring states
    assert model.calls <= bound
    if len(bad) == 1:  # one bad row: about log2(N) calls, not the 2*log2(N) of plain halving
        assert model.calls <= math.log2(N) * 1.5 + 2


def test_a_model_can_mark_failed_rows_without_raising() -> None:
    calls = []

    def marking(batch: dict[str, np.ndarray]) -> dict[str, object]:
        calls.append(len(batch["x"]))
        errors = np.where(batch["x"] % 100 == 3, "x ends in 03", None)
        return {"p": batch["x"] * 2, "_error": errors}

    out = _run(marking)
    assert calls == [N]  # one call: no bisection
    want = [i for i in range(N) if i % 100 == 3]
    assert _failed(out) == want
    assert "m__error" not in out.column_names
    failed = out.take(pa.array(want))
    assert set(failed.column(ERROR_TYPE).to_pylist()) == {"RowError"}
    assert set(failed.column(ERROR_MESSAGE).to_pylist()) == {"x ends in 03"}
    with pytest.raises(chute.ModelError, match="x ends in 03"):
        _run(marking, on_error="fail")


def _mark_odd_ids(batch: dict[str, np.ndarray]) -> dict[str, object]:
    return {"p": batch["x"] * 2.0, "_error": np.where(batch["x"] % 2 == 1, "odd", None)}


@pytest.mark.timeout(180)
def test_marked_rows_go_to_the_errors_dataset(engine: str, tmp_path: Path) -> None:
    pq.write_table(pa.table({"x": np.arange(1_000, dtype=np.int64)}), tmp_path / "a.parquet")
    job = chute.Job(
        source=chute.FileSource(str(tmp_path / "a.parquet")),
        models=(Model("m", _mark_odd_ids, batch_format="numpy", on_error="quarantine"),),
        carryover=("x",),
        output=chute.Sink(str(tmp_path / "out")),
        engine=engine,  # type: ignore[arg-type]
    )
    report = job.run()
    assert (report.rows_out, report.rows_failed) == (500, 500)
    errors = pq.read_table(tmp_path / "out" / "_errors")
    assert sorted(errors.column("x").to_pylist()) == list(range(1, 1_000, 2))
    assert set(errors.column("error_type").to_pylist()) == {"RowError"}
    assert report.failures["groups"][0]["samples"] == ["odd"]


def test_a_model_that_writes_into_its_batch_gets_fresh_rows_on_every_call() -> None:
    def doubling_in_place(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = batch["x"]
        x *= 2  # into the batch it was given
        if (x == 2 * 1_000).any():
            raise ValueError("row 1000")
        return {"p": x}

    out = _run(doubling_in_place)
    assert _failed(out) == [1_000]
    p = out.column("m_p").to_pylist()
    assert [p[i] for i in (0, 999, 1_001, N - 1)] == [0, 1_998, 2_002, 2 * (N - 1)]


def _sums(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"s": batch["v"].sum(axis=1)}


@pytest.mark.timeout(60)
def test_a_null_list_is_that_rows_error_not_a_shift_of_every_later_row(tmp_path: Path) -> None:
    """flatten() left a null list out of a NumPy batch: the model got one row fewer, the
    error blamed the model, and under quarantine the whole job failed."""
    lists = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(16, dtype=np.float32)), 2)
    vectors = pa.array([None if i == 5 else v for i, v in enumerate(lists.to_pylist())], lists.type)
    table = pa.table({"id": np.arange(8), "v": vectors})
    model = Model("m", _sums, inputs=["v"], batch_format="numpy", on_error="quarantine")
    out = tmp_path / "out"
    assert local_run(table, model, out).rows_failed == 1
    errors = pq.read_table(out / "_errors")
    assert errors.column("id").to_pylist() == [5]
    assert "column 'v'" in errors.column("error_message")[0].as_py()
    got = pq.read_table(out).sort_by("id")
    assert got.column("id").to_pylist() == [0, 1, 2, 3, 4, 6, 7]
    assert got.column("m_s").to_pylist() == [4.0 * i + 1 for i in (0, 1, 2, 3, 4, 6, 7)]


def _fails_below_ten(batch: pa.Table) -> dict[str, pa.Array]:
    if pc.any(pc.less(batch["x"], 10)).as_py():
        raise ValueError("x below 10")
    return {"y": pc.add(batch["x"], 0.5)}


def _halves(batch: pa.Table) -> dict[str, pa.Array]:
    return {"z": pc.divide(batch["m1_y"], 2.0)}


@pytest.mark.timeout(180)
def test_a_batch_whose_rows_all_failed_in_one_model_is_left_alone_by_the_next(
    engine: str, tmp_path: Path
) -> None:
    """``m2`` reads ``m1``'s output: a file whose every row fails in ``m1`` has none of it.
    That stopped the job as a wrong ``inputs`` (exit 2) at every run."""
    source = tmp_path / "in"
    source.mkdir()
    pq.write_table(pa.table({"x": np.arange(5, 105, dtype=np.int64)}), source / "a.parquet")
    pq.write_table(pa.table({"x": np.arange(0, 5, dtype=np.int64)}), source / "b.parquet")
    job = chute.Job(
        source=chute.FileSource(str(source)),
        models=(
            Model("m1", _fails_below_ten, on_error="quarantine"),
            Model("m2", _halves, inputs=["m1_y"]),
        ),
        carryover=("x",),
        output=chute.Sink(str(tmp_path / "out")),
        engine=engine,  # type: ignore[arg-type]
        max_failed_fraction=0.5,
    )
    report = job.run()
    assert (report.rows_out, report.rows_failed) == (95, 10)
    got = pq.read_table(tmp_path / "out").sort_by("x")
    assert got.column("x").to_pylist() == list(range(10, 105))
    assert got.column("m2_z").to_pylist() == [(x + 0.5) / 2 for x in range(10, 105)]
    errors = pq.read_table(tmp_path / "out" / "_errors")
    assert sorted(errors.column("x").to_pylist()) == list(range(10))


LOOKUP = np.arange(100, dtype=np.float64) * 3


def _looks_up(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"v": LOOKUP[batch["k"]]}  # an index: a float64 batch (a null's) raises


def test_a_null_in_an_integer_input_fails_its_row_only() -> None:
    """A NumPy batch with a null integer is float64; the bisection's slices without the
    null were cut from that one conversion, so the whole batch failed."""
    keys = pa.array([i % 100 if i != 500 else None for i in range(N)], pa.int64())
    table = tag(pa.table({"k": keys}), 0, 0, N)
    stage = ModelStage(
        Model("m", _looks_up, batch_format="numpy", on_error="quarantine"), ["k"], rows=N
    )
    out = stage(table)
    assert _failed(out) == [500]
    values = out.column("m_v").to_pylist()
    assert values[499] == 3.0 * 99 and values[501] == 3.0 * 1 and values[500] is None


def test_every_call_is_measured_when_every_batch_holds_a_failing_row() -> None:
    """Calls whose batch held a bad row went unmeasured: the report said no call was made."""
    model = Counting(set(range(0, N, 512)))
    stage = ModelStage(Model("m", model, batch_format="numpy", on_error="quarantine"), ["x"])
    stage(tag(pa.table({"x": np.arange(N, dtype=np.int64)}), 0, 0, N))
    batching = stage.take_batching()
    assert batching.calls > 0 and batching.rows is not None
