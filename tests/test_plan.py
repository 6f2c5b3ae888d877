"""Planning: columns checked against the schema before any compute, units, batch sizes,
``--limit`` and the choice of engine."""

from __future__ import annotations

import os
import pickle
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from chute import (
    ColumnNotFoundError,
    ConfigError,
    DataError,
    FileSource,
    InputChanged,
    Job,
    Model,
    Preprocess,
    Sink,
    TableSource,
)
from chute.engines import choose as choose_engine
from chute.plan import Reader, build_plan
from chute.stages import KEY, decode


def ident(batch: Any) -> Any:
    return batch


def _table(n: int = 10) -> pa.Table:
    ids = np.arange(n, dtype=np.int64)
    return pa.table(
        {
            "trip_id": ids,
            "fare_amount": ids * 1.5,
            "passenger_count": (ids % 4).astype(np.int8),
            "vendor": [f"v{i % 3}" for i in ids],
        }
    )


def _job(*models: Model, n: int = 10, unit_rows: int = 4, **kwargs: Any) -> Job:
    models = models or (Model("m", ident, inputs=("fare_amount",)),)
    return Job(TableSource(_table(n), unit_rows=unit_rows), models, **kwargs)


# -- column checks -----------------------------------------------------------------------


def test_carryover_typo_says_did_you_mean() -> None:
    job = _job(carryover=("trip_id", "fare_amont"))
    with pytest.raises(ColumnNotFoundError) as info:
        build_plan(job)
    text = str(info.value)
    assert text.startswith("carryover: column(s) 'fare_amont' not found in the data.")
    assert "Did you mean 'fare_amount'?" in text
    assert "Available columns: trip_id, fare_amount, passenger_count, vendor." in text


def test_model_input_typo_names_the_model() -> None:
    job = _job(Model("tip", ident, inputs=("pasenger_count",)))
    with pytest.raises(
        ColumnNotFoundError, match=r"model 'tip' inputs: column\(s\) 'pasenger_count'"
    ):
        build_plan(job)
    with pytest.raises(ConfigError, match=r"Did you mean 'passenger_count'\?"):
        build_plan(job)


def test_missing_column_without_a_close_match_still_lists_columns() -> None:
    job = _job(Model("tip", ident, inputs=("zzz",)))
    with pytest.raises(ColumnNotFoundError, match="Available columns: trip_id, ") as info:
        build_plan(job)
    assert "Did you mean" not in str(info.value)


def test_chained_model_inputs_are_allowed() -> None:
    first = Model("embed", ident, inputs=("fare_amount",))
    second = Model("cls", ident, inputs=("embed_vector", "passenger_count"))
    third = Model("rank", ident, inputs=("cls",))
    plan = build_plan(_job(first, second, third, carryover=("trip_id",)))
    assert [s.inputs for s in plan.stages] == [
        ("fare_amount",),
        ("embed_vector", "passenger_count"),
        ("cls",),
    ]
    assert plan.read_columns == ["trip_id", "fare_amount", "passenger_count"]


def test_model_cannot_use_a_later_models_output() -> None:
    first = Model("cls", ident, inputs=("embed_vector",))
    second = Model("embed", ident, inputs=("fare_amount",))
    with pytest.raises(ConfigError, match="which model 'embed' makes, but 'embed' comes after"):
        build_plan(_job(first, second))


def test_carrying_a_column_the_preprocess_step_adds_says_why_it_cannot() -> None:
    """The error said 'not found, did you mean' of a column the step does add."""
    pre = Preprocess(ident, inputs=("vendor",))
    job = _job(Model("m", ident, inputs=("vendor_code",)), preprocess=pre)
    with pytest.raises(ColumnNotFoundError, match="reaches the output only if a model returns"):
        build_plan(replace(job, carryover=("vendor_code",)))


def test_preprocess_may_produce_model_inputs() -> None:
    pre = Preprocess(ident, inputs=("vendor",))
    job = _job(Model("m", ident, inputs=("vendor_code", "fare_amount")), preprocess=pre)
    plan = build_plan(job)
    assert plan.read_columns == ["fare_amount", "vendor"]


def test_preprocess_input_typo() -> None:
    job = _job(preprocess=Preprocess(ident, inputs=("vendr",)))
    with pytest.raises(ColumnNotFoundError, match=r"preprocess inputs.*Did you mean 'vendor'"):
        build_plan(job)


def test_no_models_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="the job has no models"):
        build_plan(Job(TableSource(_table()), ()))


# -- projection --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("carryover", "inputs", "expected"),
    [
        pytest.param((), ("fare_amount",), ["fare_amount"], id="inputs-only"),
        pytest.param(("vendor",), ("fare_amount",), ["fare_amount", "vendor"], id="union"),
        pytest.param(("fare_amount",), ("fare_amount",), ["fare_amount"], id="overlap"),
        pytest.param(("vendor", "trip_id"), ("passenger_count",),
                     ["trip_id", "passenger_count", "vendor"], id="schema-order"),
        pytest.param(("*",), ("fare_amount",),
                     ["trip_id", "fare_amount", "passenger_count", "vendor"], id="star"),
        pytest.param(("trip_id",), None, None, id="inputs-unknown-reads-all"),
    ],
)  # fmt: skip
def test_read_columns_are_carryover_plus_inputs(
    carryover: tuple[str, ...], inputs: tuple[str, ...] | None, expected: list[str] | None
) -> None:
    plan = build_plan(_job(Model("m", ident, inputs=inputs), carryover=carryover))
    assert plan.read_columns == expected


def test_star_carryover_carries_every_column() -> None:
    plan = build_plan(_job(carryover=("*",)))
    assert plan.carryover == ["trip_id", "fare_amount", "passenger_count", "vendor"]


def test_model_without_inputs_sees_every_column() -> None:
    plan = build_plan(_job(Model("m", ident)))
    assert plan.stages[0].inputs == ("trip_id", "fare_amount", "passenger_count", "vendor")


def test_output_never_writes_uncarried_input_columns() -> None:
    plan = build_plan(_job(Model("fare", ident), carryover=("trip_id",)))
    columns = plan.output.columns(["trip_id", "fare_amount", "vendor", "fare", "fare_x", KEY])
    assert columns == ["trip_id", "fare", "fare_x"]


# -- batch sizes -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("inputs", "size", "rows"),
    [
        pytest.param(("trip_id", "fare_amount"), "800B", 50, id="two-int64"),
        pytest.param(("passenger_count",), "1KiB", 1024, id="int8"),
        pytest.param(("trip_id",), 7, 7, id="rows"),
        pytest.param(("trip_id",), "3", 3, id="rows-string"),
        pytest.param(("trip_id",), "4B", 1, id="at-least-one"),
    ],
)
def test_batch_size_in_bytes_becomes_rows(inputs: tuple[str, ...], size: Any, rows: int) -> None:
    plan = build_plan(_job(Model("m", ident, inputs=inputs, batch_size=size)))
    assert plan.stages[0].batch_rows == rows


def test_batch_size_in_bytes_samples_variable_width_columns() -> None:
    table = pa.table({"text": ["x" * 100] * 20})
    job = Job(TableSource(table), (Model("m", ident, inputs=("text",), batch_size="10KiB"),))
    rows = build_plan(job).stages[0].batch_rows
    assert 80 <= rows <= 100  # about 104 bytes a row: 100 characters plus an offset


def test_batch_size_in_bytes_counts_columns_of_earlier_models() -> None:
    first = Model("a", ident, inputs=("trip_id",))
    second = Model("b", ident, inputs=("trip_id", "a"), batch_size="160B")
    assert build_plan(_job(first, second)).stages[1].batch_rows == 10  # 8 + 8 bytes a row


# -- units and --limit -------------------------------------------------------------------


def test_units_and_totals() -> None:
    plan = build_plan(_job(n=10, unit_rows=4))
    assert [u.rows for u in plan.units] == [4, 4, 2]
    assert plan.pending == plan.units
    assert plan.total_rows == plan.pending_rows == 10


@pytest.mark.parametrize(
    ("limit", "rows"),
    [
        pytest.param(1, [1], id="one-row"),
        pytest.param(4, [4], id="one-unit"),
        pytest.param(6, [4, 2], id="part-of-second"),
        pytest.param(10, [4, 4, 2], id="everything"),
        pytest.param(1000, [4, 4, 2], id="more-than-everything"),
    ],
)
def test_limit_cuts_units(limit: int, rows: list[int]) -> None:
    plan = build_plan(_job(n=10, unit_rows=4), limit=limit)
    assert [u.rows for u in plan.units] == rows
    assert [u.index for u in plan.units] == list(range(len(rows)))
    assert plan.total_rows == sum(rows)


@pytest.mark.parametrize("limit", [0, -3])
def test_limit_must_be_positive(limit: int) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"--limit must be > 0, got {limit}.")):
        build_plan(_job(), limit=limit)


def test_limit_on_files_without_row_counts(tmp_path: Path) -> None:
    for name, first in (("a.csv", 0), ("b.csv", 100)):
        ids = np.arange(first, first + 5)
        pa.table({"x": ids}).to_pandas().to_csv(tmp_path / name, index=False)
    job = Job(FileSource(str(tmp_path)), (Model("m", ident, inputs=("x",)),))
    plan = build_plan(job, limit=3)
    assert [u.rows for u in plan.units] == [3]
    (batch,) = list(plan.reader(plan.units[0]))
    assert batch.column("x").to_pylist() == [0, 1, 2]
    _units, rows, last = decode(batch.column(KEY).to_numpy())
    assert rows.tolist() == [0, 1, 2]
    assert last.tolist() == [False, False, True]


def _changed_under_the_plan(
    tmp_path: Path, name: str, on_bad_input: str, how: str = "sized"
) -> list[pa.Table]:
    """Plan a job over one file of ten rows, rewrite it with six, read its unit with the
    reader as Ray ships it to a read task (pickled: the source without its listing).
    ``how``: ``sized``, the unit as planned; ``rows``, without its listed size and time,
    so that only the rows can tell; ``same size``, rewritten with its ten values reversed
    (the same size), a second later."""
    path = tmp_path / name
    write = (
        (lambda x: pq.write_table(pa.table({"x": x}), path, compression="none"))
        if name.endswith(".parquet")
        else (lambda x: pa.table({"x": x}).to_pandas().to_csv(path, index=False))
    )
    write(np.arange(10))
    job = Job(
        FileSource(str(tmp_path)),
        (Model("m", ident, inputs=("x",)),),
        on_bad_input=on_bad_input,  # type: ignore[arg-type]
    )
    plan = build_plan(job)
    before = path.stat()
    write(np.arange(10)[::-1] if how == "same size" else np.arange(6))  # Parquet: one group
    if how == "same size":
        assert path.stat().st_size == before.st_size
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))  # a tick later
    reader = pickle.loads(pickle.dumps(plan.reader))
    unit = plan.units[0] if how != "rows" else replace(plan.units[0], size=None, stamp=None)
    return list(reader(unit))


CHANGED = [
    pytest.param("a.parquet", "sized", "bytes where it was", id="parquet-size"),
    pytest.param("a.parquet", "rows", "has 6 rows in its unit where it had 10", id="parquet-rows"),
    pytest.param("a.parquet", "same size", "was modified after", id="parquet-same-size"),
    pytest.param("a.csv", "sized", "is 14 bytes where it was 22", id="csv-size"),
    pytest.param("a.csv", "same size", "was modified after", id="csv-same-size"),
]


@pytest.mark.parametrize(("name", "how", "says"), CHANGED)
@pytest.mark.parametrize("on_bad_input", ["fail", "skip"], ids=["streamed", "read-whole"])
def test_a_file_that_changed_after_planning_is_never_read_as_planned(
    tmp_path: Path, name: str, how: str, says: str, on_bad_input: str
) -> None:
    """A unit's file whose size or modification time is not the one listed when the job
    was planned, or (where neither is known) that holds fewer rows than the plan counted,
    changed during the run: its unit fails naming the file, never committed. Under
    ``skip`` (where a unit is read whole, as any is on an object store) it was skipped and
    the run finished complete without its rows, which no run of the job could compute
    again (the job run again is another one): it fails there too."""
    with pytest.raises(InputChanged, match=r"planned.*: it changed during the run") as caught:
        _changed_under_the_plan(tmp_path, name, on_bad_input, how)
    assert name in str(caught.value) and says in str(caught.value)


def test_reader_tags_rows_and_marks_the_last() -> None:
    plan = build_plan(_job(n=10, unit_rows=4))
    reader = plan.reader
    assert isinstance(reader, Reader)
    (batch,) = list(reader(plan.units[2]))
    assert batch.column_names == ["fare_amount", KEY]
    units, rows, last = decode(batch.column(KEY).to_numpy())
    assert units.tolist() == [2, 2]
    assert rows.tolist() == [0, 1]
    assert last.tolist() == [False, True]
    assert batch.column("fare_amount").to_pylist() == [12.0, 13.5]


def test_empty_parquet_dataset_is_a_data_error(tmp_path: Path) -> None:
    pq.write_table(_table(0), tmp_path / "a.parquet")
    pq.write_table(_table(0), tmp_path / "b.parquet")
    job = Job(FileSource(str(tmp_path)), (Model("m", ident, inputs=("fare_amount",)),))
    with pytest.raises(DataError, match="the input dataset has no rows: nothing to predict"):
        build_plan(job)


def test_empty_in_memory_data_is_a_data_error() -> None:
    with pytest.raises(DataError, match="no rows"):
        TableSource(_table(0))


def test_partly_empty_dataset_is_fine(tmp_path: Path) -> None:
    pq.write_table(_table(0), tmp_path / "a.parquet")
    pq.write_table(_table(3), tmp_path / "b.parquet")
    job = Job(FileSource(str(tmp_path)), (Model("m", ident, inputs=("fare_amount",)),))
    assert [u.rows for u in build_plan(job).units] == [0, 3]


# -- engine choice -----------------------------------------------------------------------


@pytest.fixture
def no_ray_address(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return monkeypatch


def test_auto_engine_is_local_without_an_address(no_ray_address: pytest.MonkeyPatch) -> None:
    engine, reason = choose_engine(_job())
    assert engine == "local"
    assert reason.startswith("no cluster address")


def test_ray_address_env_selects_ray(no_ray_address: pytest.MonkeyPatch) -> None:
    no_ray_address.setenv("RAY_ADDRESS", "ray://head:10001")
    assert choose_engine(_job()) == ("ray", "RAY_ADDRESS is set")


def test_empty_ray_address_env_is_ignored(no_ray_address: pytest.MonkeyPatch) -> None:
    no_ray_address.setenv("RAY_ADDRESS", "")
    assert choose_engine(_job())[0] == "local"


def test_address_selects_ray(no_ray_address: pytest.MonkeyPatch) -> None:
    engine, reason = choose_engine(_job(address="ray://head:10001"))
    assert engine == "ray"
    assert reason == "a cluster address was given (ray://head:10001)"


@pytest.mark.parametrize(
    ("engine", "reason"),
    [
        pytest.param("local", "the job asks for the local engine", id="local"),
        pytest.param("ray", "the job asks for the ray engine", id="ray"),
    ],
)
def test_explicit_engine_wins(no_ray_address: pytest.MonkeyPatch, engine: str, reason: str) -> None:
    no_ray_address.setenv("RAY_ADDRESS", "auto")
    assert choose_engine(_job(engine=engine, address=None)) == (engine, reason)


# -- carried text read and written as dictionaries ---------------------------------------


def _labels(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"y": batch["x"] * 2}


def _vendor_job(tmp_path: Path, **changes: Any) -> Job:
    """Parquet in (a vendor column Parquet stores with a small dictionary, and a zoned
    time), Parquet out, the vendor carried and read by nothing."""
    data = tmp_path / "in"
    data.mkdir(exist_ok=True)
    for i in range(3):
        rows = 1_000
        table = pa.table(
            {
                "x": np.arange(rows) + i * rows,
                "vendor": pa.array(np.where(np.arange(rows) % 3, "CMT", "VTS")),
                "at": pa.array(np.arange(rows) + i * rows, pa.timestamp("s", tz="Europe/Paris")),
            }
        )
        pq.write_table(table, data / f"part-{i}.parquet")
    job = Job(
        FileSource(str(data)),
        (Model("m", _labels, inputs=("x",), batch_format="numpy"),),
        carryover=("x", "vendor"),
        output=Sink(str(tmp_path / "out")),
        engine="local",
    )
    return replace(job, **changes)


def test_carried_text_nothing_reads_is_passed_through_as_a_dictionary(tmp_path: Path) -> None:
    """Read as Arrow dictionaries and written as they are, the Parquet writer takes the
    input's dictionary instead of hashing every value; a reader sees the text column."""
    import pandas as pd

    job = _vendor_job(tmp_path)
    plan = build_plan(job)
    assert plan.dictionary == ("vendor",)
    assert pa.types.is_dictionary(plan.schema.field("vendor").type)  # type: ignore[union-attr]
    job.run()
    out = pq.read_table(tmp_path / "out").sort_by("x")
    assert out.schema.field("vendor").type == pa.string()
    assert out.column("vendor").to_pylist() == ["CMT" if x % 3 else "VTS" for x in range(1_000)] * 3
    assert pd.read_parquet(tmp_path / "out").vendor.dtype != "category"
    # read by a model, a metric, a preprocess step, or written to CSV: read as it is
    read = Model("m", _labels, inputs=("x", "vendor"), batch_format="numpy")
    zoned = _vendor_job(tmp_path, carryover=("x", "vendor", "at"))
    zoned.run(overwrite=True)  # written decoded (see the next test): read back as it was
    out = pq.read_table(tmp_path / "out").sort_by("x")
    assert (
        out.schema.field("at").type
        == pq.read_schema(tmp_path / "in" / "part-0.parquet").field("at").type
    )
    assert out.schema.field("vendor").type == pa.string()
    for other in (
        _vendor_job(tmp_path, models=(read,)),
        _vendor_job(tmp_path, output=Sink(str(tmp_path / "csv"), "csv")),
        _vendor_job(tmp_path, carryover=("x", "at")),
    ):
        assert build_plan(other).dictionary == ()


def test_a_dictionary_beside_a_zoned_time_is_written_decoded() -> None:
    """Without Arrow's stored schema a zoned time (or seconds) would read back otherwise:
    there the dictionaries are decoded before writing, and everything reads back as is."""
    import io

    from chute.sinks.files import write_parquet

    vendor = pa.array(["a", "b", "a"]).dictionary_encode()
    at = pa.array([1, 2, 3], pa.timestamp("s", tz="Europe/Paris"))
    for table in (pa.table({"vendor": vendor}), pa.table({"vendor": vendor, "at": at})):
        buf = io.BytesIO()
        write_parquet(table, buf)
        back = pq.read_table(io.BytesIO(buf.getvalue()))
        assert back.column("vendor").type == pa.string()
        assert back.column("vendor").to_pylist() == ["a", "b", "a"]
        if "at" in table.column_names:  # as pyarrow reads it back written alone
            alone = io.BytesIO()
            pq.write_table(table.select(["at"]), alone)
            assert back.column("at").type == pq.read_schema(alone).field("at").type
