"""The part writer: contiguous runs of a unit become part files, renamed into place."""

from __future__ import annotations

import datetime
import itertools
import json
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import chute
from chute import Sink
from chute.plan import Output
from chute.sinks import (
    PartRecord,
    PartWriter,
    read_ipc,
    record_dict,
    records_from_table,
    records_to_table,
    runs,
)
from chute.sinks.records import describe_columns, type_text
from chute.sources import TableSource
from chute.stages import KEY, decode, tag


def _tagged(unit: int, start: int, n: int, total: int | None) -> pa.Table:
    """Rows ``start..start+n`` of a unit: carryover ``id``, a model output and a dropped column."""
    ids = np.arange(start, start + n, dtype=np.int64) + unit * 1000
    table = pa.table(
        {
            "id": ids,
            "unused": np.zeros(n),
            "m_score": ids.astype(np.float64) / 2,
            "m": ids * 10,
        }
    )
    return tag(table, unit, start, total)


def _keys(*tables: pa.Table) -> np.ndarray:
    return np.concatenate([t.column(KEY).to_numpy() for t in tables])


# -- runs --------------------------------------------------------------------------------


def test_runs_one_contiguous_unit() -> None:
    keys = _keys(_tagged(2, 0, 5, 5))
    assert runs(keys) == [(0, 5, 2, 0, 5)]


def test_runs_unit_total_unknown_without_last_row() -> None:
    keys = _keys(_tagged(2, 0, 5, 10))
    assert runs(keys) == [(0, 5, 2, 0, -1)]


def test_runs_split_on_unit_change() -> None:
    keys = _keys(_tagged(0, 3, 2, 5), _tagged(1, 0, 4, None))
    assert runs(keys) == [(0, 2, 0, 3, 5), (2, 6, 1, 0, -1)]


def test_runs_split_on_gap_within_a_unit() -> None:
    keys = _keys(_tagged(0, 0, 3, 10), _tagged(0, 5, 5, 10))
    assert runs(keys) == [(0, 3, 0, 0, -1), (3, 8, 0, 5, 10)]


def test_runs_split_when_a_unit_comes_back() -> None:
    keys = _keys(_tagged(0, 0, 2, 4), _tagged(1, 0, 1, 1), _tagged(0, 2, 2, 4))
    assert runs(keys) == [(0, 2, 0, 0, -1), (2, 3, 1, 0, 1), (3, 5, 0, 2, 4)]


def test_runs_split_on_out_of_order_rows() -> None:
    keys = _keys(_tagged(0, 2, 2, 4), _tagged(0, 0, 2, 4))
    assert runs(keys) == [(0, 2, 0, 2, 4), (2, 4, 0, 0, -1)]


def test_runs_cover_every_row_once() -> None:
    rng = np.random.default_rng(0)
    tables = [_tagged(u, s, 3, 9) for u in range(4) for s in (0, 3, 6)]
    order = rng.permutation(len(tables))
    keys = _keys(*[tables[i] for i in order])
    found = runs(keys)
    assert found[0][0] == 0 and found[-1][1] == len(keys)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(found))
    units, rows, _ = decode(keys)
    for lo, hi, unit, start, _total in found:
        assert (units[lo:hi] == unit).all()
        assert rows[lo:hi].tolist() == list(range(start, start + hi - lo))


# -- PartWriter --------------------------------------------------------------------------


def _writer(tmp_path: Path, fmt: str) -> tuple[PartWriter, Path]:
    root = tmp_path / "out"
    root.mkdir()
    output = Output(Sink(str(root), fmt), ("id",), ("m",))  # type: ignore[arg-type]
    return PartWriter(output), root


def _read(path: Path, fmt: str) -> pa.Table:
    if fmt == "parquet":
        return pq.read_table(path)
    if fmt == "csv":
        return pacsv.read_csv(path)
    return pa.Table.from_pylist([json.loads(line) for line in path.read_text().splitlines()])


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_part_writer_writes_one_part_per_run(tmp_path: Path, fmt: str) -> None:
    writer, root = _writer(tmp_path, fmt)
    batch = pa.concat_tables([_tagged(0, 2, 3, 5), _tagged(1, 0, 4, None)])
    records = writer.write(batch)
    assert [(r.unit, r.start, r.end, r.unit_rows) for r in records] == [(0, 2, 5, 5), (1, 0, 4, -1)]
    files = sorted(p.name for p in root.iterdir())
    assert files == sorted(r.path for r in records)
    assert all(not name.startswith(".") for name in files)  # no temporaries left
    for record in records:
        assert record.path.startswith(f"part-{record.unit:06d}-{record.start:010d}-")
        assert record.path.endswith("." + fmt)
        assert record.nbytes == (root / record.path).stat().st_size
        assert record.seconds >= 0
        assert record.data == b""
        part = _read(root / record.path, fmt)
        assert part.column_names == ["id", "m_score", "m"]
        expected = list(range(record.start, record.end))
        assert part.column("id").to_pylist() == [record.unit * 1000 + i for i in expected]
        assert part.column("m").to_pylist() == [10 * (record.unit * 1000 + i) for i in expected]


def test_part_writer_names_are_unique(tmp_path: Path) -> None:
    writer, root = _writer(tmp_path, "parquet")
    first = writer.write(_tagged(0, 0, 3, 3))
    second = writer.write(_tagged(0, 0, 3, 3))  # a retried task writes the same rows again
    assert first[0].path != second[0].path
    assert len(list(root.iterdir())) == 2


def test_part_writer_empty_batch_writes_nothing(tmp_path: Path) -> None:
    writer, root = _writer(tmp_path, "parquet")
    assert writer.write(_tagged(0, 0, 0, None)) == []
    assert list(root.iterdir()) == []


def test_part_writer_keeps_fixed_size_lists_in_parquet(tmp_path: Path) -> None:
    writer, root = _writer(tmp_path, "parquet")
    flat = pa.array(np.arange(6, dtype=np.float32))
    table = pa.table({"id": [1, 2, 3], "m_emb": pa.FixedSizeListArray.from_arrays(flat, 2)})
    (record,) = writer.write(tag(table, 0, 0, 3))
    part = pq.read_table(root / record.path)
    assert part.schema.field("m_emb").type == pa.list_(pa.float32(), 2)


def test_in_memory_writer_returns_ipc_rows(tmp_path: Path) -> None:
    writer = PartWriter(Output(None, ("id",), ("m",)))
    batch = pa.concat_tables([_tagged(3, 0, 2, 4), _tagged(3, 2, 2, 4)])
    (record,) = writer.write(batch)
    assert (record.unit, record.start, record.end, record.unit_rows) == (3, 0, 4, 4)
    assert record.path == ""
    assert record.nbytes == len(record.data) > 0
    rows = read_ipc(record.data)
    assert rows.column_names == ["id", "m_score", "m", KEY]
    assert rows.column("id").to_pylist() == [3000, 3001, 3002, 3003]
    assert rows.column(KEY).to_pylist() == batch.column(KEY).to_pylist()
    assert list(tmp_path.iterdir()) == []


# -- records -----------------------------------------------------------------------------


def test_records_round_trip_through_arrow() -> None:
    records = [
        PartRecord(0, 0, 10, 10, "part-a.parquet", 123, 0.5),
        PartRecord(1, 5, 7, -1, "", 9, 0.0, b"\x00\x01"),
    ]
    table = records_to_table(records)
    assert table.num_rows == 2
    assert records_from_table(table) == records


def test_record_dict_drops_row_data() -> None:
    row = record_dict(PartRecord(1, 0, 2, 2, "p", 5, 0.1, b"rows"))
    assert "data" not in row
    assert row["path"] == "p"
    assert row["unit_rows"] == 2


def test_output_columns_order() -> None:
    output = Output(None, ("b", "a"), ("m", "n"))
    available = ["a", "b", "n_x", "m", "m_y", "mx", "n", KEY, "c"]
    assert output.columns(available) == ["b", "a", "m", "m_y", "n_x", "n"]


def test_output_columns_never_take_an_input_column_for_a_model_output() -> None:
    output = Output(None, (), ("tip",), source_columns=("tip_amount", "x"))
    assert output.columns(["x", "tip_amount", KEY, "tip", "tip_p"]) == ["tip", "tip_p"]
    carried = Output(None, ("tip_amount",), ("tip",), source_columns=("tip_amount", "x"))
    assert carried.columns(["x", "tip_amount", "tip"]) == ["tip_amount", "tip"]


# -- faithful output ----------------------------------------------------------------------


def _floats(n: int = 2_000) -> np.ndarray:
    """Random float64 values of every magnitude, with subnormals, extremes and -0.0."""
    rng = np.random.default_rng(12)
    bits = rng.integers(0, 2**63, n, dtype=np.uint64) | (rng.integers(0, 2, n, np.uint64) << 63)
    values = bits.view(np.float64)
    values = values[np.isfinite(values)]
    special = [5e-324, 2.2250738585072014e-308 / 3, 1e308, -1e308, -0.0, 0.0]
    return np.concatenate([special, [-1.8644377440187592, 0.1, 1 / 3], values])


def echo(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model output is the input, unchanged."""
    return {"v": batch["x"]}


def _same_bits(got: list[float | None], want: np.ndarray) -> None:
    got_bits = np.asarray(got, np.float64).view(np.uint64)
    np.testing.assert_array_equal(got_bits, want.view(np.uint64))


@pytest.mark.timeout(300)
def test_jsonl_output_keeps_every_float_exactly(engine: str, tmp_path: Path) -> None:
    import chute

    values = _floats()
    table = pa.table({"id": np.arange(len(values)), "x": values})
    model = chute.Model("m", echo, inputs=("x",), batch_format="numpy")
    out = tmp_path / "out"
    chute.Job(
        source=TableSource(table),
        models=[model],
        carryover=["id", "x"],
        engine=engine,
        output=Sink(str(out), "jsonl"),
    ).run()

    rows = sorted(
        (json.loads(line) for p in out.glob("part-*.jsonl") for line in p.read_text().splitlines()),
        key=lambda r: r["id"],
    )
    assert [r["id"] for r in rows] == list(range(len(values)))
    _same_bits([r["x"] for r in rows], values)  # carried over
    _same_bits([r["m_v"] for r in rows], values)  # a model output


def count(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """An integer model output: the input's row ids, doubled."""
    return {"n": batch["id"] * 2}


@pytest.mark.timeout(300)
def test_parquet_output_encodes_each_column_by_its_kind_and_keeps_every_value(
    engine: str, tmp_path: Path
) -> None:
    """Ids, times and integer outputs delta-encoded, repeating labels in a dictionary,
    scores plain; read back, every value is the one written, nulls and extremes included."""
    import chute

    n = 20_000
    rng = np.random.default_rng(3)
    wide = rng.integers(-(2**63), 2**63 - 1, n)
    table = pa.table(
        {
            "id": np.arange(n, dtype=np.int64),
            "at": pa.array(np.arange(n) * 1_000 + 1_700_000_000_000_000, pa.timestamp("us", "UTC")),
            "day": pa.array(np.arange(n, dtype=np.int32) % 20_000, pa.date32()),
            "wide": pa.array([None if i % 7 == 0 else int(v) for i, v in enumerate(wide)]),
            "label": pa.array(rng.choice(["cat", "dog", None], n)),
            "x": rng.normal(size=n),
        }
    )
    model = chute.Model("m", count, inputs=("id",), batch_format="numpy")
    out = tmp_path / "out"
    chute.Job(
        source=TableSource(table),
        models=[model],
        carryover=["id", "at", "day", "wide", "label", "x"],
        engine=engine,
        output=Sink(str(out), "parquet"),
    ).run()

    files = sorted(out.glob("part-*.parquet"))
    back = pa.concat_tables(pq.read_table(f) for f in files).sort_by("id")
    assert back.select(table.column_names).equals(table)
    assert back["m_n"].to_pylist() == [2 * i for i in range(n)]
    meta = pq.ParquetFile(files[0]).metadata.row_group(0)
    encodings = {
        meta.column(i).path_in_schema: set(meta.column(i).encodings)
        for i in range(meta.num_columns)
    }
    for name in ("id", "at", "day", "wide", "m_n"):
        assert "DELTA_BINARY_PACKED" in encodings[name], (name, encodings[name])
    assert "RLE_DICTIONARY" in encodings["label"]
    assert encodings["x"] == {"PLAIN", "RLE"}


def test_jsonl_writes_nan_and_infinity_as_null_and_keeps_float32_short() -> None:
    from chute.sinks import encode

    table = pa.table(
        {
            "f": [float("nan"), float("inf"), -float("inf"), None, 1.5],
            "f32": pa.array([0.1, None, 2.5, 3.0, float("nan")], pa.float32()),
            "s": ['a"b', "c\\d", None, "e\nf", "null"],
            "l": [[1.0, float("nan")], None, [], [0.1], [2.0]],
        }
    )
    rows = [json.loads(line) for line in encode(table, "jsonl").decode().splitlines()]
    assert [r["f"] for r in rows] == [None, None, None, None, 1.5]
    assert [r["f32"] for r in rows] == [0.1, None, 2.5, 3.0, None]
    assert [r["s"] for r in rows] == ['a"b', "c\\d", None, "e\nf", "null"]
    assert [r["l"] for r in rows] == [[1.0, None], None, [], [0.1], [2.0]]


def tensor(batch: dict[str, np.ndarray]) -> np.ndarray:
    """One list of two floats per row: a column CSV cannot hold."""
    return np.stack([batch["x"], batch["x"]], axis=1)


@pytest.mark.timeout(300)
def test_a_list_column_the_plan_cannot_see_is_refused_by_the_csv_writer(
    engine: str, tmp_path: Path
) -> None:
    import chute
    from chute.errors import ConfigError

    table = pa.table({"id": np.arange(100), "x": np.arange(100, dtype=np.float64)})
    model = chute.Model("m", tensor, inputs=("x",), batch_format="numpy")
    out = tmp_path / "out"
    job = chute.Job(
        source=TableSource(table), models=[model], engine=engine, output=Sink(str(out), "csv")
    )
    with pytest.raises(ConfigError) as info:
        job.run()
    assert "column(s) 'm'" in str(info.value)
    assert "Write Parquet or JSON Lines instead" in str(info.value)
    assert not list(out.glob("part-*"))


def _bytes(batch: dict[str, np.ndarray]) -> dict[str, pa.Array]:
    """Bytes per row, UTF-8 in most rows but not in row 50."""
    return {"raw": pa.array([b"\xff" if i == 50 else b"%d" % i for i in batch["x"]], pa.binary())}


@pytest.mark.timeout(300)
def test_a_binary_column_the_plan_cannot_see_is_refused_by_the_csv_writer(
    engine: str, tmp_path: Path
) -> None:
    """A model's bytes that were UTF-8 were written as if text, and the unit with others
    stopped the run on Arrow's "Invalid UTF8 payload", naming no column (on Ray, with Ray's
    advice to retry)."""
    import chute
    from chute.errors import ConfigError

    table = pa.table({"id": np.arange(100), "x": np.arange(100)})
    model = chute.Model("m", _bytes, inputs=("x",), batch_format="numpy", batch_size=10)
    out = tmp_path / "out"
    job = chute.Job(
        source=TableSource(table, unit_rows=10),
        models=[model],
        engine=engine,
        output=Sink(str(out), "csv"),
    )
    with pytest.raises(ConfigError) as info:
        job.run()
    assert "column(s) 'm_raw' (binary) hold bytes" in str(info.value)
    assert "JSON Lines writes bytes as base64" in str(info.value)
    assert "UTF8" not in str(info.value) and "retried_map_errors" not in str(info.value)
    assert not list(out.glob("part-*"))


def _swaps(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    a, b = batch["id"] * 1.0, batch["id"] * 2.0
    return {"a": a, "b": b} if batch["id"][0] % 20 == 0 else {"b": b, "a": a}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_every_file_has_the_columns_in_one_order(tmp_path: Path, fmt: str) -> None:
    """A model returning {a, b} in one batch and {b, a} in another wrote files whose
    columns came in two orders: a reader taking them by position swapped the values."""
    table = pa.table({"id": np.arange(40), "t": pa.array(["x"] * 40, pa.large_string())})
    model = chute.Model("m", _swaps, inputs=("id",), batch_format="numpy", batch_size=10)
    job = chute.Job(
        source=chute.TableSource(table, unit_rows=10),
        models=(model,),
        carryover=("id", "t"),  # large_string: the JSON Lines writer could not join it
        output=chute.Sink(str(tmp_path / "out"), fmt, file_rows=10),  # type: ignore[arg-type]
        engine="local",
    )
    job.run()
    files = sorted((tmp_path / "out").glob("part-*"))
    assert len(files) >= 2
    orders = set()
    for path in files:
        if fmt == "csv":
            orders.add(tuple(path.read_text().splitlines()[0].replace('"', "").split(",")))
        elif fmt == "jsonl":
            orders.add(tuple(json.loads(path.read_text().splitlines()[0])))
        else:
            orders.add(tuple(pq.read_schema(path).names))
    # one order in every file: that of whichever batch came first (replicas run at once)
    assert orders in ({("id", "t", "m_a", "m_b")}, {("id", "t", "m_b", "m_a")}), orders


@pytest.mark.parametrize(
    ("column", "why"),
    [("error_type", "errors dataset adds"), ("__chute_key", "chute's own")],
)
def test_a_carried_column_named_like_chutes_own_is_refused_before_compute(
    tmp_path: Path, column: str, why: str
) -> None:
    """Carried beside a quarantined row, 'error_type' made the errors part's columns
    collide after the data was committed; '__chute_key' failed with a KeyError."""
    table = pa.table({"id": np.arange(4), column: ["x"] * 4})
    model = chute.Model("m", _swaps, inputs=("id",), batch_format="numpy", on_error="quarantine")
    job = chute.Job(
        source=chute.TableSource(table),
        models=(model,),
        carryover=("*",),
        output=chute.Sink(str(tmp_path / "out")),
        engine="local",
    )
    with pytest.raises(chute.ConfigError, match=why):
        job.run()
    assert not (tmp_path / "out").exists()


def test_a_pool_of_a_number_is_that_many_replicas() -> None:
    assert chute.Model("m", len, pool=3).pool == chute.Pool.fixed(3)
    with pytest.raises(chute.ConfigError, match="pool must be"):
        chute.Model("m", len, pool=0)


def _nulls_first(batch: dict[str, np.ndarray]) -> dict[str, object]:
    ids = batch["id"]
    return {"y": pa.nulls(len(ids)) if ids[0] < 20 else ids * 1.0}


@pytest.mark.timeout(120)
def test_files_written_before_a_columns_type_was_known_get_it(tmp_path: Path, engine: str) -> None:
    """A model returning only nulls in its first batches wrote files of the null type; a
    reader of the finished output took the first file's schema and failed on the rest
    ("Unsupported cast from double to null")."""
    import pandas as pd

    out = tmp_path / "out"
    job = chute.Job(
        source=chute.TableSource(pa.table({"id": np.arange(40)}), unit_rows=10),
        models=(
            chute.Model("m", _nulls_first, inputs=("id",), batch_format="numpy", batch_size=10),
        ),
        carryover=("id",),
        output=chute.Sink(str(out), file_rows=10),
        engine=engine,  # type: ignore[arg-type]
    )
    job.run()
    assert {str(pq.read_schema(p).field("m_y").type) for p in out.glob("part-*")} == {"double"}
    frame = pd.read_parquet(out).sort_values("id")
    assert frame["m_y"].isna().sum() == 20 and frame["m_y"].iloc[-1] == 39.0
    assert len(list(out.glob("part-*"))) == 4  # the files replaced are gone
    assert "nothing to do" in (job.run().stopped or "")  # the ledger names the new files


def _one_unit_nulls_first(sink: chute.Sink, engine: str) -> chute.Job:
    """One unit of four 10-row batches, the first two all ``None``."""
    return chute.Job(
        source=chute.TableSource(pa.table({"id": np.arange(40)}), unit_rows=40),
        models=(
            chute.Model("m", _nulls_first, inputs=("id",), batch_format="numpy", batch_size=10),
        ),
        carryover=("id",),
        output=sink,
        engine=engine,  # type: ignore[arg-type]
    )


@pytest.mark.timeout(120)
def test_a_unit_whose_first_batches_are_all_null_is_written_typed(
    tmp_path: Path, engine: str
) -> None:
    """One unit of four batches, the first two all ``None``: on the local engine the runs
    of the ``null`` type and of float64 went into one Parquet file and every attempt
    stopped ("Table schema does not match schema used to create file")."""
    import pandas as pd

    out = tmp_path / "out"
    assert _one_unit_nulls_first(chute.Sink(str(out)), engine).run().complete
    assert {str(pq.read_schema(p).field("m_y").type) for p in out.glob("part-*")} == {"double"}
    frame = pd.read_parquet(out).sort_values("id")
    assert frame["m_y"].isna().sum() == 20 and frame["m_y"].tolist()[20:] == list(range(20, 40))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_unit_whose_first_batches_are_all_null_is_written_as_text(
    tmp_path: Path, fmt: str
) -> None:
    """The same unit as text: an empty CSV field, a JSON ``null``, then the numbers."""
    import pandas as pd

    out = tmp_path / "out"
    sink = chute.Sink(str(out), format=fmt)  # type: ignore[arg-type]
    assert _one_unit_nulls_first(sink, "local").run().complete
    (path,) = out.glob("part-*")
    frame = pd.read_csv(path) if fmt == "csv" else pd.read_json(path, lines=True)
    assert frame["m_y"].isna().sum() == 20 and frame["m_y"].tolist()[20:] == list(range(20, 40))


def _empty_lists_first(batch: pa.Table, late: bool = False) -> pa.Array:
    """Lists for the rows' ids: empty (``list<null>``, as Arrow takes ``[[], []]``) in the
    first batches, one value each after (``late``: the other way round); every 7th null."""
    ids = batch.column("id").to_pylist()
    empty = (ids[0] >= 20) if late else (ids[0] < 20)
    return pa.array([None if i % 7 == 0 else [] if empty else [float(i)] for i in ids])


def _lists_expected(late: bool) -> list[list[float] | None]:
    empty = (lambda i: i >= 20) if late else (lambda i: i < 20)
    return [None if i % 7 == 0 else [] if empty(i) else [float(i)] for i in range(40)]


def _lists_job(
    out: Path, engine: str, unit_rows: int, late: bool, fmt: str = "parquet"
) -> chute.Job:
    model = partial(_empty_lists_first, late=late)
    files = {"file_rows": 10} if unit_rows == 10 else {}  # one unit's runs in one file
    return chute.Job(
        source=chute.TableSource(pa.table({"id": np.arange(40)}), unit_rows=unit_rows),
        models=(chute.Model("m", model, inputs=("id",), batch_size=10),),
        carryover=("id",),
        output=chute.Sink(str(out), format=fmt, **files),  # type: ignore[arg-type]
        engine=engine,  # type: ignore[arg-type]
    )


@pytest.mark.timeout(180)
@pytest.mark.parametrize("unit_rows", [10, 40])
@pytest.mark.parametrize("late", [False, True])
def test_a_model_whose_first_lists_are_all_empty_writes_one_list_type(
    tmp_path: Path, engine: str, unit_rows: int, late: bool
) -> None:
    """An object detector's first batches found nothing (``[[] for _ in rows]``, which
    Arrow takes for ``list<null>``), a later one did (``list<double>``): the run stopped
    after computing, on every output format ("returned 'm' as list<item: double> in this
    batch and as list<item: null> in an earlier one"). The type is not known until a list
    has a value: the files written before are retyped, and empty lists stay empty."""
    import pandas as pd

    out = tmp_path / "out"
    job = _lists_job(out, engine, unit_rows, late)
    report = job.run()
    assert report.complete and report.rows_out == 40
    files = list(out.glob("part-*"))
    assert {str(pq.read_schema(p).field("m").type) for p in files} == {"list<element: double>"}
    if engine == "local" and unit_rows == 40:  # the unit's runs typed as they go in, not
        assert len(files) == 1  # a file for the empty lists' type and one for the values'
    table = pq.read_table(out).sort_by("id")
    assert table.schema.field("m").type == pa.list_(pa.float64())
    assert table.column("id").to_pylist() == list(range(40))
    assert table.column("m").to_pylist() == _lists_expected(late)
    frame = pd.read_parquet(out).sort_values("id")
    assert [None if v is None else list(v) for v in frame["m"]] == _lists_expected(late)
    assert "nothing to do" in (job.run().stopped or "")  # the ledger names the files kept


@pytest.mark.timeout(120)
def test_a_model_whose_first_lists_are_all_empty_writes_json_lines(tmp_path: Path) -> None:
    """The same lists as JSON Lines: ``[]``, ``null``, then the values."""
    out = tmp_path / "out"
    assert _lists_job(out, "local", 10, False, fmt="jsonl").run().complete
    rows = [json.loads(line) for p in out.glob("part-*") for line in p.read_text().splitlines()]
    assert [r["m"] for r in sorted(rows, key=lambda r: r["id"])] == _lists_expected(False)


def _nested_nulls_first(batch: pa.Table, kind: str) -> pa.Array:
    """A struct whose field ``a`` is ``None`` in the first batches (``struct<a: null>``),
    or a map whose values are (``map<string, null>``), a float after."""
    ids = batch.column("id").to_pylist()
    early = ids[0] < 20
    if kind == "struct":
        return pa.array([{"a": None if early else float(i), "b": i} for i in ids])
    items = pa.null() if early else pa.float64()
    values = [[("k", None if early else float(i))] for i in ids]
    return pa.array(values, pa.map_(pa.string(), items))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["struct", "map"])
def test_a_struct_field_or_map_value_null_in_the_first_batches_gets_its_type(
    tmp_path: Path, engine: str, kind: str
) -> None:
    """``struct<a: null, b: int64>`` then ``struct<a: double, b: int64>`` (a dict's value
    ``None`` in the first batches): the run stopped as for lists of nulls; now the
    files agree on the later type, the nulls kept."""
    out = tmp_path / "out"
    job = chute.Job(
        source=chute.TableSource(pa.table({"id": np.arange(40)}), unit_rows=10),
        models=(
            chute.Model(
                "m", partial(_nested_nulls_first, kind=kind), inputs=("id",), batch_size=10
            ),
        ),
        carryover=("id",),
        output=chute.Sink(str(out), file_rows=10),
        engine=engine,  # type: ignore[arg-type]
    )
    assert job.run().complete
    want = (
        pa.struct([("a", pa.float64()), ("b", pa.int64())])
        if kind == "struct"
        else pa.map_(pa.string(), pa.float64())
    )
    written = {type_text(pq.read_schema(p).field("m").type) for p in out.glob("part-*")}
    assert written == {type_text(want)}  # a map's entries are named after the column
    table = pq.read_table(out).sort_by("id")
    early = [None if i < 20 else float(i) for i in range(40)]
    if kind == "struct":
        assert table.column("m").to_pylist() == [{"a": a, "b": i} for i, a in enumerate(early)]
    else:
        assert table.column("m").to_pylist() == [[("k", a)] for a in early]


@pytest.mark.timeout(120)
def test_a_batch_cut_to_isolate_a_failure_joins_empty_lists_and_values(tmp_path: Path) -> None:
    """A batch bisected around a failing row: one piece's lists all empty (``list<null>``),
    another's with values; joining them stopped the run ("arrays to be concatenated must
    be identically typed")."""

    def detector(batch: pa.Table) -> pa.Array:
        ids = batch.column("id").to_pylist()
        if 7 in ids:
            raise ValueError("no image")
        return pa.array([[] if i < 5 else [float(i)] for i in ids])

    out = tmp_path / "out"
    job = chute.Job(
        source=chute.TableSource(pa.table({"id": np.arange(20)})),
        models=(chute.Model("m", detector, inputs=("id",), batch_size=10, on_error="quarantine"),),
        carryover=("id",),
        output=chute.Sink(str(out)),
        engine="local",
    )
    assert job.run().complete
    table = pq.read_table(out).sort_by("id")
    assert table.column("id").to_pylist() == [i for i in range(20) if i != 7]
    assert table.column("m").to_pylist() == [
        [] if i < 5 else [float(i)] for i in range(20) if i != 7
    ]


def test_types_holding_null_are_typed_by_a_later_one() -> None:
    """The committer's view of each part's columns (type texts): ``null`` anywhere is a
    type not yet known, typed by another part; other differences are refused."""
    from chute.sinks.records import merged_text, text_holds_null
    from chute.stages import holds_null, typed_by

    assert merged_text("list<null>", "list<double>") == "list<double>"
    assert merged_text("list<double>", "list<null>") == "list<double>"
    assert merged_text("null", "map<string, double>") == "map<string, double>"
    assert merged_text("struct<a: null, b: double>", "struct<a: int64, b: null>") == (
        "struct<a: int64, b: double>"
    )
    assert merged_text("fixed_size_list<null>[3]", "fixed_size_list<float>[3]") == (
        "fixed_size_list<float>[3]"
    )
    for a, b in [
        ("list<null>", "large_list<double>"),
        ("fixed_size_list<null>[3]", "fixed_size_list<float>[4]"),
        ("list<null>", "struct<a: double>"),
        ("struct<null: double>", "struct<null: int64>"),  # a field named null
        ("list<double>", "list<int64>"),
    ]:
        assert merged_text(a, b) is None and merged_text(b, a) is None
    assert text_holds_null("map<string, struct<a: null>>")
    assert not text_holds_null("struct<null: double>")

    struct = pa.struct([("a", pa.null()), ("b", pa.float64())])
    assert holds_null(pa.map_(pa.string(), struct)) and not holds_null(pa.list_(pa.int8()))
    assert typed_by(pa.list_(pa.null()), pa.list_(pa.float64())) == pa.list_(pa.float64())
    assert typed_by(pa.list_(pa.float64()), pa.list_(pa.null())) == pa.list_(pa.float64())
    assert typed_by(pa.list_(pa.null()), pa.string()) == pa.list_(pa.null())
    later = pa.struct([("a", pa.int64()), ("b", pa.null())])
    assert typed_by(struct, later) == pa.struct([("a", pa.int64()), ("b", pa.float64())])


@pytest.mark.parametrize("marked", [True, False])
def test_only_the_files_the_ledger_marks_null_have_their_footers_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, marked: bool
) -> None:
    """Every resumed run read the footer of every file of the output (on an object store,
    10,000 files are 10,000 requests) to find the few written before a type was known:
    each ledger line names those of its unit, and a few typed files tell the type. The
    files of lines without the mark (an older chute's) are all read."""
    from chute.ledger import Ledger
    from chute.runner import retype

    typed = pa.table({"id": pa.array([1], pa.int64()), "m_y": pa.array([1.5])})
    names = [f"part-{i:06d}-{0:010d}-0000000{i % 10}.parquet" for i in range(40)]
    ledger = Ledger.open(str(tmp_path), "fp", {}, False)
    for i, name in enumerate(names):
        table = typed.set_column(1, "m_y", pa.nulls(1)) if i == 7 else typed
        pq.write_table(table, tmp_path / name)
        size = (tmp_path / name).stat().st_size
        entry = {"unit": f"u{i}", "index": i, "rows": 1, "errors": 0, "parts": [name]}
        nulls = {"nulls": [name] if i == 7 else []} if marked or i % 2 else {}
        ledger.commit([{**entry, "files": [[name, 1, size]], **nulls}])
    read: list[str] = []
    schema = retype._schema
    monkeypatch.setattr(retype, "_schema", lambda led, path: read.append(path) or schema(led, path))

    assert retype.retype_null_columns(ledger) == [names[7]]
    assert len(read) == (1 + retype.READERS if marked else 21)  # unmarked: the even lines, +7
    retyped = [p for p in tmp_path.glob("part-*") if p.name not in names]
    assert [str(pq.read_schema(p).field("m_y").type) for p in retyped] == ["double"]
    assert not (tmp_path / names[7]).exists()
    if marked:
        assert ledger.entries["u7"]["nulls"] == []  # the new file is typed


def test_json_lines_write_bytes_as_base64_at_any_depth() -> None:
    """Decoded with backslash escapes, b'\\xff' and the text '\\xff' were one string, and
    bytes in a list were Python's repr ("b'a'")."""
    import base64

    from chute.formats import to_jsonl

    values = [b"\xff", b"\\xff", None]
    table = pa.table(
        {
            "b": pa.array(values, pa.binary()),
            "l": pa.array([[b"a"], None, []], pa.list_(pa.binary())),
        }
    )
    lines = [json.loads(line) for line in to_jsonl(table).splitlines()]
    assert [x["b"] and base64.b64decode(x["b"]) for x in lines] == values
    assert lines[0]["l"] == [base64.b64encode(b"a").decode()]


def _elapsed(batch: pa.Table, log: bool = True) -> dict[str, pa.Array]:
    seconds = pa.array([1.5, -2.0, None, 0.000001] * (batch.num_rows // 4))
    micros = pc.multiply(seconds, 1e6).cast(pa.int64()).cast(pa.duration("us"))
    out = {"took": micros.cast(pa.duration("ms"), safe=False), "exact": micros}
    if log:  # CSV holds no struct
        at = pa.array([datetime.datetime(2024, 1, 1, 12, 30)] * batch.num_rows)
        out["log"] = pa.StructArray.from_arrays([at], ["at"])
    return out


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_durations_keep_their_unit_and_nested_times_are_iso(tmp_path: Path, fmt: str) -> None:
    """CSV wrote a duration as a bare count of its unit (1500 for 1.5 s in milliseconds)
    and JSON Lines as Python's text ("0:00:01.500000"); a timestamp in a struct was Python's
    "2024-01-01 12:30:00" where one at the top is ISO 8601."""
    import pandas as pd

    fn = partial(_elapsed, log=fmt == "jsonl")
    job = chute.Job(
        source=chute.TableSource(pa.table({"id": np.arange(8)})),
        models=(chute.Model("m", fn, inputs=("id",), batch_format="pyarrow"),),
        carryover=("id",),
        output=chute.Sink(str(tmp_path / "out"), fmt),  # type: ignore[arg-type]
        engine="local",
    )
    job.run()
    files = sorted((tmp_path / "out").glob("part-*"))
    if fmt == "csv":
        frame = pd.concat(pd.read_csv(f) for f in files).sort_values("id")
        took, exact = frame.m_took.tolist(), frame.m_exact.tolist()
    else:
        lines = (json.loads(line) for f in files for line in f.read_text().splitlines())
        rows = sorted(lines, key=lambda r: int(r["id"]))
        took, exact = [r["m_took"] for r in rows], [r["m_exact"] for r in rows]
        assert {r["m_log"]["at"] for r in rows} == {"2024-01-01T12:30:00"}
    missing: object = float("nan") if fmt == "csv" else None
    assert str(took[:4]) == str(["PT1.5S", "-PT2S", missing, "PT0S"])  # whole milliseconds
    assert str(exact[:4]) == str(["PT1.5S", "-PT2S", missing, "PT0.000001S"])
    assert pd.to_timedelta(exact[0]) == pd.Timedelta(seconds=1.5)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_zoned_times_name_their_instant_and_text_views_are_text(tmp_path: Path, fmt: str) -> None:
    """A zone whose offset had seconds (Monrovia's -00:44:30 until 1972) was written with
    ``%z`` as -0044: read back, an instant 30 s off, in a carried column. Polars' text
    (``string_view``) was refused by CSV as bad input, after compute."""
    import pandas as pd

    utc = datetime.timezone.utc
    instants = [
        datetime.datetime(1970, 6, 1, 12, 0, tzinfo=utc),
        datetime.datetime(2020, 6, 1, 12, 0, tzinfo=utc),
    ]
    source = pa.table(
        {
            "id": [0, 1],
            "monrovia": pa.array(instants, pa.timestamp("us", "Africa/Monrovia")),
            "paris": pa.array(instants, pa.timestamp("us", "Europe/Paris")),
        }
    )
    model = chute.Model(
        "m",
        lambda b: pa.array(["a", None], pa.string_view()),
        inputs=("id",),
        batch_format="pyarrow",
    )
    job = chute.Job(
        source=chute.TableSource(source),
        models=(model,),
        carryover=("id", "monrovia", "paris"),
        output=chute.Sink(str(tmp_path / "out"), fmt),  # type: ignore[arg-type]
        engine="local",
    )
    job.run()
    files = sorted((tmp_path / "out").glob("part-*"))
    if fmt == "csv":
        rows = pd.concat(pd.read_csv(f, dtype=str) for f in files).to_dict("records")
    else:
        rows = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    rows = sorted(rows, key=lambda r: int(r["id"]))
    for row, instant in zip(rows, instants, strict=True):
        assert pd.Timestamp(row["monrovia"]) == pd.Timestamp(instant)
        assert pd.Timestamp(row["paris"]) == pd.Timestamp(instant)
    assert rows[1]["paris"].endswith("+0200")  # a zone in whole minutes keeps its offset
    assert rows[0]["m"] == "a"


def test_nested_nanosecond_times_keep_their_nanoseconds_in_json_lines() -> None:
    from chute.formats import to_jsonl

    kind = pa.struct([("t", pa.time64("ns")), ("ts", pa.list_(pa.time64("ns")))])
    column = pa.array([{"t": 1, "ts": [86_399_999_999_999]}, None], kind)
    lines = [json.loads(line) for line in to_jsonl(pa.table({"c": column})).splitlines()]
    assert lines[0]["c"] == {"t": "00:00:00.000000001", "ts": ["23:59:59.999999999"]}
    assert lines[1]["c"] is None


def test_a_column_described_alike_whichever_way_its_rows_came() -> None:
    """Arrow IPC (Ray's object store) names a map's entries otherwise than the Parquet
    reader: a job killed on one engine and resumed on the other refused its own carried
    map column as "a model returned another type there"."""
    tags = pa.array([[("k", 1)]], pa.map_(pa.string(), pa.int64()))
    lists = pa.array([[1.0]], pa.list_(pa.field("element", pa.float32())))
    table = pa.table({"tags": tags, "v": lists, "s": pa.array([{"a": [1]}])})
    buffer = pa.BufferOutputStream()
    pq.write_table(table, buffer)
    from_parquet = pq.read_table(pa.BufferReader(buffer.getvalue()))
    stream = pa.BufferOutputStream()
    with pa.ipc.new_stream(stream, from_parquet.schema) as writer:
        writer.write_table(from_parquet)
    from_ipc = pa.ipc.open_stream(stream.getvalue()).read_all()
    assert str(from_parquet.schema) != str(from_ipc.schema)  # as Arrow spells them
    described = describe_columns(from_parquet.schema)
    assert described == describe_columns(from_ipc.schema) == describe_columns(table.schema)
    assert json.loads(described) == [
        ["tags", "map<string, int64>"],
        ["v", "list<float>"],
        ["s", "struct<a: list<int64>>"],
    ]


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_an_output_type_the_format_cannot_hold_is_named_as_the_models(
    tmp_path: Path, fmt: str
) -> None:
    """An interval column stopped the run as "Arrow could not handle the data" (a
    DataError, exit 3: bad input), naming no column."""
    gaps = pa.array([pa.MonthDayNano([1, 2, 3])] * 2, pa.month_day_nano_interval())
    model = chute.Model(
        "m", lambda b: {"gap": gaps, "ok": pa.array([1, 2])}, inputs=("id",), batch_format="pyarrow"
    )
    job = chute.Job(
        source=chute.TableSource(pa.table({"id": [0, 1]})),
        models=(model,),
        carryover=("id",),
        output=chute.Sink(str(tmp_path / "out"), fmt),  # type: ignore[arg-type]
        engine="local",
    )
    with pytest.raises(chute.ModelError, match=rf"{fmt} cannot hold 'm_gap' \(month_day_nano"):
        job.run()
    assert not (tmp_path / "out" / "_SUCCESS").exists()
