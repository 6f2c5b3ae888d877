"""Table sinks (issue 16): Iceberg (pyiceberg's SQL catalog on SQLite), Delta Lake
(deltalake) and Lance (pylance), written exactly once.

Every table is read back with its own reader (a pyiceberg scan, deltalake and DuckDB,
lance) and compared with the Parquet output of the same job; the table's history is
checked to hold every unit in exactly one commit, also after drivers killed at random
moments and at injected points around the table commit (``tests/table_chaos.py``).
"""

from __future__ import annotations

import decimal
import json
import math
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import chute
from chute.config import load_job
from chute.lease import Lease
from chute.tableledger import TableLedger
from chute.tables import JOB_KEY, UNITS_KEY, Index, Lineage, TableSink, units_of
from tests import s3server
from tests.chaos_job import HERE, driver_env, make_data, reap, start_driver, wait_for
from tests.s3server import FaultProxy, MotoS3, list_keys

pytest.importorskip("pyiceberg")
pytest.importorskip("deltalake")
pytest.importorskip("lance")

moto_s3 = s3server.moto_s3  # the fixtures: a moto server, the proxy, an empty bucket
s3_proxy = s3server.s3_proxy
s3 = s3server.s3

UNITS = 8
ROWS_PER_UNIT = 500
ROWS = UNITS * ROWS_PER_UNIT
FORMATS = ["iceberg", "delta", "lance"]
TABLE_CHAOS = Path(__file__).with_name("table_chaos.py")


class Embed:
    """A deterministic model with a score and a 4-d float32 embedding."""

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = batch["x"]
        vec = np.stack([x, x * 2, np.sin(x), np.cos(x)], axis=1).astype(np.float32)
        return {"score": x * 3.0 + 1.0, "vec": vec}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_data(tmp_path_factory.mktemp("tables-data"), UNITS, ROWS_PER_UNIT)


def table_sink(fmt: str, where: Path, **kwargs: Any) -> TableSink:
    """A sink for a table of ``fmt`` under ``where`` (an Iceberg catalog on SQLite)."""
    if fmt == "iceberg":
        where.mkdir(parents=True, exist_ok=True)
        catalog = {"type": "sql", "uri": f"sqlite:///{where}/catalog.db"}
        catalog["warehouse"] = f"file://{where}/warehouse"
        return TableSink(format="iceberg", table="db.preds", catalog=catalog, **kwargs)
    return TableSink(str(where / f"preds.{fmt}"), format=fmt, **kwargs)  # type: ignore[arg-type]


def job(
    data: Path,
    output: chute.Sink,
    engine: str = "local",
    carryover: tuple[str, ...] = ("id", "tag"),
) -> chute.Job:
    model = chute.Model("m", Embed(), inputs=("id", "x"), batch_format="numpy", batch_size=200)
    return chute.Job(
        source=chute.FileSource(str(data)),
        models=(model,),
        carryover=carryover,
        output=output,
        engine=engine,
    )


def read_table(sink: TableSink) -> pd.DataFrame:
    """The table as its own reader gives it, sorted by id."""
    if sink.format == "iceberg":
        frame = _iceberg(sink).scan().to_arrow().to_pandas()
    elif sink.format == "delta":
        from deltalake import DeltaTable

        table = DeltaTable(sink.path, storage_options=_options(sink))
        if sink.path.startswith("s3://"):  # the files the log names (see _delta_history)
            frame = _read_files(sink, table.file_uris()).to_pandas()
        else:
            frame = table.to_pandas()
    else:
        import lance

        frame = lance.dataset(sink.path, storage_options=_options(sink)).to_table().to_pandas()
    return frame.sort_values("id").reset_index(drop=True)


def _options(sink: TableSink) -> dict[str, str] | None:
    """The object-store options of a Delta or Lance table (an S3 endpoint), as chute's."""
    from chute.tables.delta import storage_options

    return storage_options(sink.path, sink.storage) or None


def history(sink: TableSink) -> list[dict[str, str]]:
    """chute's keys of every commit in the table's history that has them."""
    if sink.format == "iceberg":
        from pyiceberg.table.snapshots import ancestors_of

        table = _iceberg(sink)
        metas = [dict(s.summary.additional_properties) for s in ancestors_of(
            table.current_snapshot(), table.metadata)]  # fmt: skip
    elif sink.format == "delta":
        from deltalake import DeltaTable

        table = DeltaTable(sink.path, storage_options=_options(sink))
        metas = _delta_history(sink) if sink.path.startswith("s3://") else table.history()
    else:
        import lance

        transactions = lance.dataset(sink.path, storage_options=_options(sink)).get_transactions(
            1000
        )
        metas = [dict(t.transaction_properties or {}) for t in transactions if t]
    return [m for m in metas if UNITS_KEY in m]


def _delta_history(sink: TableSink) -> list[dict[str, Any]]:
    """The commit infos of a Delta table's log, read from its JSON files: deltalake 1.6.6's
    own ``history()`` fails with ``Generic S3 error`` against moto, and its ``to_pandas()``
    there takes minutes of retries (object_store's 3-minute retry timeout), where loading
    the table and writing to it work."""
    from chute.storage import read, resolve

    fs, root = resolve(sink.path, sink.storage)
    infos = []
    for version in range(_delta_version(sink) + 1):
        log = read(fs, f"{root}/_delta_log/{version:020d}.json") or b""
        infos += [json.loads(line)["commitInfo"] for line in log.decode().splitlines()
                  if '"commitInfo"' in line]  # fmt: skip
    return infos


def _delta_version(sink: TableSink) -> int:
    from deltalake import DeltaTable

    return int(DeltaTable(sink.path, storage_options=_options(sink)).version())


def _read_files(sink: TableSink, uris: list[str]) -> pa.Table:
    import pyarrow.parquet as pq

    from chute.storage import resolve

    fs, _ = resolve(sink.path, sink.storage)
    return pa.concat_tables(
        [pq.read_table(uri.removeprefix("s3://"), filesystem=fs) for uri in uris]
    )


def _iceberg(sink: TableSink) -> Any:
    from pyiceberg.catalog import load_catalog

    from chute.tables.iceberg import catalog_properties

    return load_catalog("default", **catalog_properties(sink)).load_table(sink.table)


def _location(sink: TableSink) -> Path:
    if sink.format == "iceberg":
        return Path(_iceberg(sink).location().removeprefix("file://"))
    return Path(sink.path)


def check_once(sink: TableSink, expected: pd.DataFrame) -> None:
    """Every input row once, as the Parquet output has it; every unit in one commit."""
    frame = read_table(sink)
    assert frame.id.is_unique and len(frame) == ROWS
    got = frame[list(expected.columns)]
    got = got.assign(m_vec=got.m_vec.map(list))
    pd.testing.assert_frame_equal(got, expected.assign(m_vec=expected.m_vec.map(list)))
    units = Counter(u for m in history(sink) for u in units_of(m[UNITS_KEY]))
    assert units == Counter(range(UNITS)), f"a unit committed twice or never: {units}"


@pytest.fixture(scope="module")
def expected(data: Path, tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    """The same job's Parquet output, sorted by id."""
    out = tmp_path_factory.mktemp("tables-parquet") / "out"
    report = job(data, chute.Sink(str(out))).run()
    assert report.rows_out == ROWS
    return pd.read_parquet(out).sort_values("id").reset_index(drop=True)


# --------------------------------------------------------------------------- readers agree


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fmt", FORMATS)
def test_table_holds_what_parquet_holds(
    fmt: str, engine: str, data: Path, expected: pd.DataFrame, tmp_path: Path
) -> None:
    sink = table_sink(fmt, tmp_path, commit_seconds=0)
    report = job(data, sink, engine).run()
    assert (report.units_done, report.rows_out) == (UNITS, ROWS)
    check_once(sink, expected)
    assert all(m[JOB_KEY] == report.fingerprint[:16] for m in history(sink))
    saved = json.loads(next(_location(sink).glob("_chute/jobs/*/report.json")).read_text())
    assert saved["table"]["format"] == fmt and saved["table"]["commits"] == len(history(sink))
    for path in _location(sink).rglob("*.parquet"):  # no encoding an engine may refuse
        meta = pq.ParquetFile(path).metadata
        chunks = [c for g in range(meta.num_row_groups) for c in _chunks(meta, g)]
        used = {e for c in chunks for e in c.encodings}
        assert "DELTA_BINARY_PACKED" not in used, path


def _chunks(meta: pq.FileMetaData, group: int) -> list[pq.ColumnChunkMetaData]:
    row_group = meta.row_group(group)
    return [row_group.column(i) for i in range(row_group.num_columns)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_commit_whose_confirmation_failed_is_never_added_twice(
    fmt: str,
    engine: str,
    data: Path,
    expected: pd.DataFrame,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ledger's confirmation of a batch the table took fails once (a moment's I/O
    error): the batch is tried again, by the next commit or by the failed run's last
    flush, and finds its transaction in the table: it is confirmed, not added again. The
    run ends well, or fails and its resume does: either way every unit is in the table
    once (before, a run could report success with a batch's rows in the table twice)."""
    real = TableLedger._confirm
    calls: list[list[str]] = []

    def flaky(self: TableLedger, tokens: list[str]) -> None:
        calls.append(tokens)
        if len(calls) == 1:
            raise OSError(5, "the ledger's disk failed for a moment")
        real(self, tokens)

    monkeypatch.setattr(TableLedger, "_confirm", flaky)
    sink = table_sink(fmt, tmp_path, commit_seconds=0)
    try:
        report = job(data, sink, engine).run()
    except chute.ChuteError as exc:
        assert "the ledger's disk failed" in str(exc)
        report = job(data, sink, engine).run()  # the resume
    assert calls and report.units_done + report.units_skipped == UNITS
    check_once(sink, expected)


TABLE_CLASSES = {
    "iceberg": "chute.tables.iceberg.Iceberg",
    "delta": "chute.tables.delta.Delta",
    "lance": "chute.tables.lance.Lance",
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_landed_batch_the_history_no_longer_shows_is_found_by_its_files(
    fmt: str, data: Path, expected: pd.DataFrame, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run stops with batches the table took but the ledger never confirmed; by the
    resume the table's history no longer shows their commits (snapshots expired, more
    than a thousand commits since). The table still names their files: the resume
    confirms them, adds nothing twice and removes none of the table's files."""

    def broken(self: TableLedger, tokens: list[str]) -> None:
        raise OSError(5, "the ledger's disk is gone")

    with monkeypatch.context() as patch:
        patch.setattr(TableLedger, "_confirm", broken)
        sink = table_sink(fmt, tmp_path, commit_seconds=0)
        with pytest.raises(chute.ChuteError, match="the ledger's disk is gone"):
            job(data, sink).run()
    assert history(sink), "the first run's batches should be in the table"
    unknown = Lineage(frozenset(), whole=False)  # the history cannot tell
    monkeypatch.setattr(f"{TABLE_CLASSES[fmt]}.lineage", lambda self, tokens: unknown)
    report = job(data, sink).run()
    assert report.units_done + report.units_skipped == UNITS
    check_once(sink, expected)


@pytest.mark.timeout(120)
def test_duckdb_reads_the_files_the_delta_log_names(
    data: Path, expected: pd.DataFrame, tmp_path: Path
) -> None:
    import duckdb

    sink = table_sink("delta", tmp_path)
    job(data, sink).run()
    from deltalake import DeltaTable

    files = DeltaTable(sink.path).file_uris()  # what the log names (DuckDB's delta
    assert len(files) >= UNITS  # extension would be downloaded: no network here)
    frame = duckdb.sql(f"SELECT id, m_score FROM read_parquet({files!r}) ORDER BY id").df()
    np.testing.assert_array_equal(frame.id, expected.id)
    np.testing.assert_array_equal(frame.m_score, expected.m_score)


@pytest.mark.timeout(120)
def test_a_vector_column_and_its_index_in_lance(data: Path, tmp_path: Path) -> None:
    import lance

    index = Index("m_vec", type="ivf_pq", num_partitions=2, num_sub_vectors=2)
    sink = table_sink("lance", tmp_path, index=index)
    report = job(data, sink).run()
    dataset = lance.dataset(sink.path)
    assert dataset.schema.field("m_vec").type == pa.list_(pa.float32(), 4)
    [described] = dataset.describe_indices()
    assert described.field_names == ["m_vec"] and described.num_rows_indexed == ROWS
    saved = json.loads(next(_location(sink).glob("_chute/jobs/*/report.json")).read_text())
    assert saved["table"]["index"]["column"] == "m_vec"
    assert report.rows_out == ROWS


# --------------------------------------------------------------------------- appending


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_second_job_appends_and_a_rerun_adds_nothing(
    fmt: str, data: Path, expected: pd.DataFrame, tmp_path: Path
) -> None:
    sink = table_sink(fmt, tmp_path)
    first = job(data, sink).run()
    again = job(data, sink).run()  # the same job, finished: nothing to do
    assert (again.units_skipped, again.rows_out) == (UNITS, 0)
    check_once(sink, expected)
    more = tmp_path / "more"  # another day's input: another job, its rows appended
    more.mkdir()
    ids = np.arange(ROWS, ROWS + ROWS_PER_UNIT, dtype=np.int64)
    pq.write_table(pa.table({"id": ids, "x": ids * 0.1, "tag": ids % 3}), more / "new.parquet")
    second = job(more, sink).run()
    assert second.fingerprint != first.fingerprint and second.rows_out == ROWS_PER_UNIT
    assert len(read_table(sink)) == ROWS + ROWS_PER_UNIT
    with pytest.raises(chute.JobStateError, match="over the same input"):
        job(data / "unit-000.parquet", sink).run()  # rows the table holds already


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", FORMATS)
def test_appending_checks_the_schema_before_any_compute(
    fmt: str, data: Path, tmp_path: Path
) -> None:
    sink = table_sink(fmt, tmp_path)
    seed = pa.table({"id": pa.array(["a"]), "tag": pa.array([1], pa.int64())})
    _create(sink, seed)
    with pytest.raises(chute.DataError, match=r"column 'id' is int64 .* but (large_)?string in"):
        job(data, sink).run()
    assert not list(_location(sink).glob("data/chute-*/part-*"))  # nothing was computed


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_model_output_the_table_cannot_take_is_a_schema_error(
    fmt: str, data: Path, tmp_path: Path
) -> None:
    """Known only once the model has run: the same error on every format, naming the
    column and both types (Lance's writer refused it first, as an I/O error), and the
    table's rows as they were."""
    sink = table_sink(fmt, tmp_path)
    seed = pa.table(
        {
            "id": pa.array([-1], pa.int64()),
            "tag": pa.array([0], pa.int64()),
            "m_score": pa.array(["high"]),
            "m_vec": pa.array([[0.0] * 4], pa.list_(pa.float32())),
        }
    )
    _create(sink, seed)
    with pytest.raises(chute.DataError, match=r"column 'm_score' is double .* but (large_)?string"):
        job(data, sink).run()
    assert read_table(sink).id.tolist() == [-1]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_map_column_carried_into_a_table_runs_again(fmt: str, tmp_path: Path) -> None:
    """The tables name a map's entries otherwise than Arrow's Parquet reader does: the
    schema check took ``map<string, int64 ('tags')>`` and ``map<string, int64>`` for two
    types, and every second run (a resume, a finished job run again) was refused."""
    root = tmp_path / "in"
    root.mkdir()
    ids = np.arange(200, dtype=np.int64)
    tags = pa.array([[("k", int(i))] for i in ids], pa.map_(pa.string(), pa.int64()))
    pq.write_table(pa.table({"id": ids, "x": ids * 0.1, "tags": tags}), root / "a.parquet")
    sink = table_sink(fmt, tmp_path / "t")

    def tagged() -> chute.Job:
        model = chute.Model("m", Embed(), inputs=("id", "x"), batch_format="numpy")
        source = chute.FileSource(str(root))
        return chute.Job(source, (model,), carryover=("id", "tags"), output=sink)

    assert tagged().run().rows_out == 200
    assert tagged().run().rows_out == 0  # the same job again: nothing to do
    frame = read_table(sink)
    assert sorted(frame.id) == list(range(200))
    assert [dict(t) for t in frame.sort_values("id").tags] == [{"k": i} for i in range(200)]


class _Elapsed:
    """A model whose output is a duration, which Iceberg and Delta cannot hold."""

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Array:
        return pa.array(batch["id"] * 1000, pa.duration("ms"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
@pytest.mark.parametrize("where", ["carried", "model"])
def test_a_column_type_the_table_cannot_hold_is_named(fmt: str, where: str, tmp_path: Path) -> None:
    """A duration passed everything, computed every unit, and died at the commit with the
    format's own error (Delta: "External error: Schema error: Invalid data type", Rust's
    backtrace). Carried, it is refused before any compute; from a model, at the commit,
    naming the column and the fix."""
    root = tmp_path / "in"
    root.mkdir()
    ids = np.arange(100, dtype=np.int64)
    took = pa.array(ids * 1000, pa.duration("ms"))
    pq.write_table(pa.table({"id": ids, "x": ids * 0.1, "took": took}), root / "a.parquet")
    sink = table_sink(fmt, tmp_path / "t")
    model = chute.Model("m", _Elapsed(), inputs=("id",), batch_format="numpy")
    carried = ("id", "took") if where == "carried" else ("id",)
    run = chute.Job(chute.FileSource(str(root)), (model,), carryover=carried, output=sink)
    column = "'took' (duration[ms])" if where == "carried" else "'m' (duration[ms])"
    with pytest.raises(chute.DataError, match=re.escape(f"cannot hold the column(s) {column}")):
        run.run()
    if where == "carried":  # nothing was computed
        assert not list((tmp_path / "t").rglob("part-*"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", FORMATS)
def test_times_in_seconds_and_a_column_of_nulls_carried_into_a_new_table(
    fmt: str, tmp_path: Path
) -> None:
    """A CSV's times are read as seconds, which Delta refuses: every unit was computed,
    then the commit died with Rust's backtrace. A column null in every row has no type a
    table could take: named, with what to do (Iceberg's converter raised a bare
    ValueError before any compute)."""
    root = tmp_path / "in"
    root.mkdir()
    ids = np.arange(100, dtype=np.int64)
    at = pa.array(ids * 60, pa.timestamp("s"))
    columns = {"id": ids, "x": ids * 0.1, "at": at, "z": pa.nulls(100)}
    pq.write_table(pa.table(columns), root / "a.parquet")
    model = chute.Model("m", Embed(), inputs=("id", "x"), batch_format="numpy")

    def carrying(*names: str) -> chute.Job:
        sink = table_sink(fmt, tmp_path / "-".join(names))
        return chute.Job(chute.FileSource(str(root)), (model,), carryover=names, output=sink)

    timed = carrying("id", "at")
    assert timed.run().rows_out == 100
    assert isinstance(timed.output, TableSink)
    frame = read_table(timed.output)
    assert list(frame.sort_values("id")["at"]) == list(pd.to_datetime(ids * 60, unit="s"))
    with pytest.raises(chute.ModelError, match=r"'z' is null in every row .* carried input"):
        carrying("id", "z").run()


class _Interval:
    """A model whose output is an interval, which Lance's writer cannot store."""

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Array:
        return pa.array([(1, 2, 3)] * len(batch["id"]), pa.month_day_nano_interval())


@pytest.mark.timeout(120)
def test_a_type_lance_cannot_store_is_lances_own_error_not_a_missing_dataset(
    tmp_path: Path,
) -> None:
    """The first write to a new dataset: the error asked for the dataset's columns, which
    a dataset not yet made has none of, and said "Dataset ... was not found"."""
    root = tmp_path / "in"
    root.mkdir()
    pq.write_table(pa.table({"id": np.arange(10)}), root / "a.parquet")
    model = chute.Model("m", _Interval(), inputs=("id",), batch_format="numpy")
    sink = table_sink("lance", tmp_path)
    job = chute.Job(chute.FileSource(str(root)), (model,), carryover=("id",), output=sink)
    with pytest.raises(chute.ChuteError) as info:
        job.run()
    assert "Unsupported data type" in str(info.value)
    assert "was not found" not in str(info.value)


def _create(sink: TableSink, table: pa.Table) -> None:
    if sink.format == "iceberg":
        from pyiceberg.catalog import load_catalog

        catalog = load_catalog("default", **dict(sink.catalog))
        catalog.create_namespace_if_not_exists("db")
        catalog.create_table("db.preds", schema=table.schema).append(table)
    elif sink.format == "delta":
        from deltalake import write_deltalake

        write_deltalake(sink.path, table)
    else:
        import lance

        lance.write_dataset(table, sink.path)


@pytest.mark.timeout(120)
def test_a_lance_table_takes_the_same_values_in_another_layout(tmp_path: Path) -> None:
    """``large_string`` (as polars writes text), a dictionary, ``int32`` and a fixed-size
    list into a dataset's ``string``, ``int64`` and list columns: chute's check let them
    through, and Lance's append stopped the run after compute as "an I/O error"."""
    import lance

    source = tmp_path / "in.parquet"
    tags = pa.array(["a", "b", "a", "c"], pa.large_string())
    pq.write_table(
        pa.table({"id": pa.array(range(4), pa.int32()), "tag": tags, "x": [0.5, 1.5, 2.5, 3.5]}),
        source,
    )
    sink = table_sink("lance", tmp_path)
    mine = pa.table(
        {
            "id": pa.array([-1], pa.int64()),
            "tag": pa.array(["z"], pa.string()),
            "m_score": [0.0],
            "m_vec": pa.array([[0.0] * 4], pa.list_(pa.float32())),
        }
    )
    _create(sink, mine)
    report = job(source, sink).run()
    assert report.complete
    table = lance.dataset(sink.path).to_table().sort_by("id")
    assert table.schema == mine.schema  # the dataset's own types
    assert table.column("id").to_pylist() == [-1, 0, 1, 2, 3]
    assert table.column("tag").to_pylist() == ["z", "a", "b", "a", "c"]
    assert table.column("m_vec").to_pylist()[2] == pytest.approx(
        [1.5, 3.0, np.sin(1.5), np.cos(1.5)]
    )


# --------------------------------------------------------------------------- one run per table


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_second_run_on_a_table_is_refused(fmt: str, data: Path, tmp_path: Path) -> None:
    sink = table_sink(fmt, tmp_path)
    job(data, sink).run()
    import pyarrow.fs as pafs

    lease = Lease.acquire(pafs.LocalFileSystem(), f"{_location(sink)}/_chute", "the table")
    with lease, pytest.raises(chute.JobStateError, match="in use by another chute run"):
        job(data, sink).run()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fmt", ["iceberg", "lance"])
def test_an_unfinished_job_is_not_mixed_with_another(fmt: str, data: Path, tmp_path: Path) -> None:
    """A job killed half-way and a changed job on the same table: refused, naming the
    change and that the first job's rows of the same input would be in the table a second
    time; --overwrite leaves the first unfinished (its rows stay), appends, and warns. (The
    refusal did not say so, and --overwrite's help said it replaced the earlier results.)"""
    sink = table_sink(fmt, tmp_path, commit_seconds=0)
    path = _job_file(tmp_path / "job.json", data, sink, delay=0.2)
    proc = start_driver(path, driver_env())
    try:
        assert wait_for(lambda: len(_safe_history(sink)) >= 2, proc, timeout=120)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        reap(proc)
    held = sum(len(units_of(m[UNITS_KEY])) for m in history(sink))
    assert 0 < held < UNITS
    changed = _job_file(tmp_path / "changed.json", data, sink, delay=0.0)
    refused = _run(["-m", "chute", "run", str(changed), "-q"])
    assert refused.returncode == 5
    said = " ".join(refused.stderr.split())
    assert "unfinished chute job (changed: models[0]" in said
    assert "would be in the table a second time" in said
    done = _run(["-m", "chute", "run", str(changed), "-q", "--overwrite"])
    assert done.returncode == 0, done.stderr
    assert "those rows are in the table twice" in " ".join(done.stderr.split())
    assert len(read_table(sink)) == ROWS + held * ROWS_PER_UNIT
    helped = _run(["-m", "chute", "run", "--help"])
    assert "A table's rows are never deleted" in " ".join(helped.stdout.split())


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_job_left_unfinished_by_overwrite_is_not_finished_over_the_newer_rows(
    fmt: str, data: Path, tmp_path: Path
) -> None:
    """Job A killed after two commits; job B (a model setting changed) run with
    --overwrite, which leaves A unfinished, and finished. A run again without a flag
    resumed and added its other units on top of B's rows (8,000 rows of 4,000 ids, exit
    0): it is refused, naming why, and the table is left as it is."""
    sink = table_sink(fmt, tmp_path, commit_seconds=0)
    first = _job_file(tmp_path / "a.json", data, sink)
    died = _run([str(TABLE_CHAOS), "committed", "2", str(first)])
    assert died.returncode == -signal.SIGKILL, died.stderr
    changed = _job_file(tmp_path / "b.json", data, sink, delay=0.0)
    done = _run(["-m", "chute", "run", str(changed), "-q", "--overwrite"])
    assert done.returncode == 0, done.stderr
    rows = len(read_table(sink))
    again = _run(["-m", "chute", "run", str(first), "-q"])
    assert again.returncode == 5, again.stderr
    said = " ".join(again.stderr.split())
    assert "left unfinished" in said and "would add them again" in said
    assert len(read_table(sink)) == rows


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fmt", FORMATS)
def test_overwrite_after_a_kill_before_the_first_table_commit_starts_over(
    fmt: str, data: Path, tmp_path: Path
) -> None:
    """The killed run left its first batch staged, none of it in the table: --overwrite was
    refused as if "the table already holds rows of this job", telling the user to delete
    rows that were not there. After a commit landed it is still refused."""
    sink = table_sink(fmt, tmp_path, commit_seconds=0)
    path = _job_file(tmp_path / "job.json", data, sink)
    died = _run([str(TABLE_CHAOS), "staged", "1", str(path)])
    assert died.returncode == -signal.SIGKILL, died.stderr
    done = _run(["-m", "chute", "run", str(path), "-q", "--overwrite"])
    assert done.returncode == 0, done.stderr
    _check_chaos(sink)
    again = _run(["-m", "chute", "run", str(path), "-q", "--overwrite"])
    assert again.returncode == 5 and "cannot redo it" in " ".join(again.stderr.split())


# --------------------------------------------------------------------------- kills


def _job_file(
    path: Path,
    data: Path,
    sink: TableSink,
    delay: float = 0.05,
    carryover: tuple[str, ...] = ("id", "tag"),
) -> Path:
    """A job file (JSON is YAML) writing the chaos model's output to ``sink``'s table."""
    output: dict[str, Any] = {"format": sink.format, "commit_seconds": sink.commit_seconds}
    if sink.format == "iceberg":
        output.update(table=sink.table, catalog=dict(sink.catalog))
    else:
        output["path"] = sink.path
    if sink.partition_by:
        output["partition_by"] = list(sink.partition_by)
    spec = {
        "input": str(data),
        "carryover": list(carryover),
        "models": [
            {
                "name": "m",
                "fn": f"{HERE}:SlowModel",
                "inputs": ["id", "x"],
                "batch_format": "numpy",
                "batch_size": 250,
                "kwargs": {"delay": delay, "rows_per_unit": ROWS_PER_UNIT},
            }
        ],
        "output": output,
        "engine": "local",
    }
    path.write_text(json.dumps(spec, indent=2))
    return path


def _safe_history(sink: TableSink) -> list[dict[str, str]]:
    try:
        return history(sink)
    except Exception:  # not created yet, or a commit being written
        return []


def _check_chaos(sink: TableSink) -> None:
    frame = read_table(sink)
    assert frame.id.is_unique and len(frame) == ROWS, "a row lost or doubled"
    np.testing.assert_array_equal(frame.id, np.arange(ROWS))
    units = Counter(u for m in history(sink) for u in units_of(m[UNITS_KEY]))
    assert units == Counter(range(UNITS)), f"a unit committed twice or never: {units}"


def _run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        env=env or driver_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("point", ["staged", "committed"])
def test_a_driver_killed_around_the_table_commit_resumes_exactly_once(
    fmt: str, point: str, data: Path, tmp_path: Path
) -> None:
    sink = table_sink(fmt, tmp_path, commit_seconds=0)
    path = _job_file(tmp_path / "job.json", data, sink)
    landed = 0
    for n in (1, 3):  # the first commit (which creates the table), and a later one
        died = _run([str(TABLE_CHAOS), point, str(n), str(path)])
        assert died.returncode == -signal.SIGKILL, died.stderr
        landed += n if point == "committed" else n - 1
        assert len(_safe_history(sink)) == landed
    done = _run(["-m", "chute", "run", str(path), "-q"])
    assert done.returncode == 0, done.stderr
    _check_chaos(sink)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_driver_killed_at_random_moments_resumes_exactly_once(
    fmt: str, data: Path, tmp_path: Path
) -> None:
    sink = table_sink(fmt, tmp_path, commit_seconds=0)
    path = _job_file(tmp_path / "job.json", data, sink)
    rng = np.random.default_rng(16)
    for _ in range(4):
        proc = start_driver(path, driver_env())
        try:
            time.sleep(float(rng.uniform(1.0, 4.0)))  # start-up takes about a second
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            reap(proc)
    done = _run(["-m", "chute", "run", str(path), "-q"])
    assert done.returncode == 0, done.stderr
    _check_chaos(sink)


def _restore(sink: TableSink, to: str) -> None:
    """Another tool takes the table back to an earlier version: to before its last commit
    (``to="last"``), or to its first commit (``to="first"``: chute's first batch)."""
    if sink.format == "iceberg":
        table = _iceberg(sink)
        current = table.current_snapshot()
        first = table.snapshots()[0].snapshot_id
        with table.manage_snapshots() as snapshots:
            snapshots.rollback_to_snapshot(current.parent_snapshot_id if to == "last" else first)
    elif sink.format == "delta":
        from deltalake import DeltaTable

        table = DeltaTable(sink.path)
        table.restore(table.version() - 1 if to == "last" else 0)
    else:
        import lance

        version = lance.dataset(sink.path).version - 1 if to == "last" else 1
        lance.dataset(sink.path, version=version).restore()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("to", ["last", "first"])
def test_a_batch_a_restore_undid_is_not_taken_for_committed(
    fmt: str, to: str, data: Path, tmp_path: Path
) -> None:
    """The driver dies after its third batch landed, before confirming it; the table is
    then restored to an earlier version: before that batch, or to the first (before two
    confirmed batches). A commit in the history that the current version no longer
    descends from is not in the table: its units are computed again. (Delta and Lance found
    the unconfirmed batch's token in a flat list of recent commits and lost its 500 rows;
    confirmed batches were trusted on every format, and 1,000 rows lost.)"""
    sink = table_sink(fmt, tmp_path, commit_seconds=0)
    path = _job_file(tmp_path / "job.json", data, sink)
    died = _run([str(TABLE_CHAOS), "committed", "3", str(path)])
    assert died.returncode == -signal.SIGKILL, died.stderr
    _restore(sink, to)
    done = _run(["-m", "chute", "run", str(path), "-q"])
    assert done.returncode == 0, done.stderr
    frame = read_table(sink)
    assert frame.id.is_unique and len(frame) == ROWS, "a row lost or doubled"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("by", ["version", "time"])
def test_a_delta_restore_by_version_or_time_ends_the_lineage_of_what_it_undid(
    by: str, tmp_path: Path
) -> None:
    """Three batches, the table restored to the first (by version, or by the time of its
    commit): only the first is in the table, and the log back to version 0 says so."""
    from deltalake import CommitProperties, DeltaTable, write_deltalake

    from chute.tables import BATCH_KEY
    from chute.tables.delta import Delta

    sink = table_sink("delta", tmp_path)
    for token in ("a", "b", "c"):
        meta = CommitProperties(custom_metadata={BATCH_KEY: token})
        write_deltalake(sink.path, pa.table({"id": [1]}), mode="append", commit_properties=meta)
    table = DeltaTable(sink.path)
    first = min(table.history(), key=lambda h: h["version"])
    table.restore(0 if by == "version" else pd.Timestamp(first["timestamp"], unit="ms", tz="UTC"))
    assert Delta(sink).lineage({"a", "b", "c"}) == Lineage(frozenset({"a"}), whole=True)


# --------------------------------------------------------------------------- partitions

START = np.datetime64("2024-03-01T00:00:00", "us")


@pytest.fixture(scope="module")
def dated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chaos data with a pickup time (a minute per id: 4,000 minutes, three days, so
    units cross midnight) and its date."""
    directory = make_data(tmp_path_factory.mktemp("tables-dated"), UNITS, ROWS_PER_UNIT)
    for path in directory.iterdir():
        table = pq.read_table(path)
        at = START + table.column("id").to_numpy() * np.timedelta64(1, "m")
        table = table.append_column("pickup_at", pa.array(at, pa.timestamp("us", tz="UTC")))
        table = table.append_column("pickup_date", pa.array(at.astype("datetime64[D]")))
        pq.write_table(table, path)
    return directory


DATED = ("id", "tag", "pickup_at", "pickup_date")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("fmt", "spec"),
    [("iceberg", "day(pickup_at)"), ("iceberg", "tag"), ("delta", "pickup_date")],
)
def test_a_partitioned_table_is_split_by_partition_value_and_resumes_exactly_once(
    fmt: str, spec: str, dated: Path, tmp_path: Path
) -> None:
    """A new table created with a partition spec: every data file holds one partition
    value; a driver killed after its second commit and resumed; the table's reader gives
    every row once, the partition columns as the input has them."""
    from chute.tables import partition_fields, split

    sink = table_sink(fmt, tmp_path, commit_seconds=0, partition_by=(spec,))
    path = _job_file(tmp_path / "job.yaml", dated, sink, carryover=DATED)
    died = _run([str(TABLE_CHAOS), "committed", "2", str(path)])
    assert died.returncode == -signal.SIGKILL, died.stderr
    assert len(_safe_history(sink)) == 2
    done = _run(["-m", "chute", "run", str(path), "-q"])
    assert done.returncode == 0, done.stderr
    _check_chaos(sink)
    frame, inputs = read_table(sink), pd.read_parquet(dated).sort_values("id")
    np.testing.assert_array_equal(frame.m_rank, inputs.id * 2 + 1)
    np.testing.assert_array_equal(frame.tag, inputs.tag)
    np.testing.assert_array_equal(frame.pickup_at, inputs.pickup_at)
    assert [str(d) for d in frame.pickup_date] == [str(d) for d in inputs.pickup_date]
    fields = partition_fields([spec])
    if fmt == "iceberg":
        table = _iceberg(sink)
        [field] = table.spec().fields
        assert str(field.transform) == fields[0].transform
        files = table.inspect.files().column("file_path").to_pylist()
        values = {str(p) for p in table.inspect.files().column("partition").to_pylist()}
    else:
        from deltalake import DeltaTable

        table = DeltaTable(sink.path)
        assert table.metadata().partition_columns == ["pickup_date"]
        files = table.file_uris()
        actions = pa.table(table.get_add_actions(flatten=True))
        values = set(actions.column("partition.pickup_date").to_pylist())
    distinct = len(split(pa.Table.from_pandas(inputs), fields))
    assert len(values) == distinct > 1 and len(files) >= UNITS + distinct - 1
    for uri in files:  # one partition value in each file
        stored = pq.read_table(uri.removeprefix("file://"))
        if fmt == "delta":  # Delta keeps partition values in its log, not in the files
            assert "pickup_date" not in stored.column_names
        else:
            assert len(split(stored, fields)) == 1


LONG = "long-" + "x" * 4_995  # 5,000 bytes: over the 4 KiB pyarrow keeps statistics of


def _same(a: Any, b: Any) -> bool:
    """Equal as a partition value: a NaN is a NaN, and 0.0 is not -0.0."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and str(a) == str(b))
    return bool(a == b)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "values",
    [["short", LONG, None, LONG + "y"], [math.nan, 0.0, 1.5, -0.0]],
    ids=["long-string", "nan-and-zero"],
)
def test_an_iceberg_partition_is_the_value_not_what_the_footer_suggests(
    values: list[Any], tmp_path: Path
) -> None:
    """Each file's partition is the value its rows hold, not one pyiceberg's ``add_files``
    read from the footer's statistics: those have no string over 4 KiB (its files were
    recorded in the null partition, and a filter on the value found none of their rows),
    no NaN (null again), and -0.0 as the least of a file of 0.0."""
    from pyiceberg.expressions import EqualTo, IsNaN, IsNull

    source = tmp_path / "in.parquet"
    ids = list(range(40))
    column = [values[i % len(values)] for i in ids]
    pq.write_table(pa.table({"id": ids, "x": [i / 2 for i in ids], "p": column}), source)
    sink = table_sink("iceberg", tmp_path, partition_by=("p",))
    assert job(source, sink, carryover=("id", "p")).run().rows_out == len(ids)

    table = _iceberg(sink)
    for value in values:
        if value is None:
            where: Any = IsNull("p")
        elif isinstance(value, float) and math.isnan(value):
            where = IsNaN("p")
        else:
            where = EqualTo("p", value)
        got = sorted(table.scan(row_filter=where).to_arrow().column("id").to_pylist())
        want = [i for i, v in zip(ids, column, strict=True) if v == value or _same(v, value)]
        assert got == want, str(value)[:20]
    files = table.inspect.files().to_pylist()
    assert len(files) == len(values)
    for entry in files:  # the manifest's partition is the value its file holds
        held = pq.read_table(entry["file_path"].removeprefix("file://")).column("p").to_pylist()
        assert all(_same(v, held[0]) for v in held)
        assert _same(entry["partition"]["p"], held[0]), (entry["partition"], held[0])


@pytest.mark.timeout(120)
def test_an_empty_string_in_a_delta_partition_column_is_refused(tmp_path: Path) -> None:
    """Delta keeps an empty partition value as null: the rows were read back with null
    in that column, and the run was complete."""
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [0, 1, 2], "x": [0.5, 1.5, 2.5], "s": ["a", "", "b"]}), source)
    sink = table_sink("delta", tmp_path, partition_by=("s",))
    with pytest.raises(chute.DataError, match="partition column 's' holds an empty string"):
        job(source, sink, carryover=("id", "s")).run()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", [pa.binary(), pa.large_binary()])
def test_a_binary_delta_partition_column_is_refused(tmp_path: Path, kind: pa.DataType) -> None:
    """Delta's log holds partition values as text: b'a' was written as the text "b'a'" and
    read back as b"b'a'", in every row with a value, and the run was complete."""
    source = tmp_path / "in.parquet"
    column = pa.array([b"a", b"\x00\xff", None], kind)
    pq.write_table(pa.table({"id": [0, 1, 2], "x": [0.5, 1.5, 2.5], "b": column}), source)
    sink = table_sink("delta", tmp_path, partition_by=("b",))
    with pytest.raises(chute.DataError, match=rf"partition column 'b' is {kind}: a delta table"):
        job(source, sink, carryover=("id", "b")).run()


@pytest.mark.timeout(120)
def test_a_negative_fractional_decimal_delta_partition_is_refused(tmp_path: Path) -> None:
    """delta-rs reads the partition value "-0.500000" back as "0.-500000": the run was
    complete and the table could not be read any more."""
    source = tmp_path / "in.parquet"
    column = pa.array([decimal.Decimal(v) for v in ("12.5", "-12", "-0.5")], pa.decimal128(24, 6))
    pq.write_table(pa.table({"id": [0, 1, 2], "x": [0.5, 1.5, 2.5], "d": column}), source)
    sink = table_sink("delta", tmp_path, partition_by=("d",))
    with pytest.raises(chute.DataError, match=r"'d' holds -0.500000, a negative decimal"):
        job(source, sink, carryover=("id", "d")).run()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", ["iceberg", "delta", "lance"])
def test_a_sort_by_column_the_output_lacks_or_cannot_order_is_named(
    fmt: str, tmp_path: Path
) -> None:
    """``sort_by: [nosuch]`` failed after compute with Arrow's message and every row of the
    part in it, as a data error (exit 3); a list column, with "Sorting not supported"."""
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [0, 1, 2], "x": [0.5, 1.5, 2.5], "tag": list("abc")}), source)
    for column, named in [
        ("nosuch", "which the job's output does not have"),
        ("m_vec", "has no order"),
    ]:
        sink = table_sink(fmt, tmp_path / column, sort_by=(column,))
        with pytest.raises(chute.ConfigError, match=rf"sort_by names '{column}'.* {named}") as err:
            job(source, sink).run()
        assert "0.5" not in str(err.value)  # no rows in the message


def test_partition_specs_a_format_cannot_hold_are_refused() -> None:
    with pytest.raises(chute.ConfigError, match="lance tables have no partitions"):
        TableSink("t.lance", format="lance", partition_by=("tag",))
    with pytest.raises(chute.ConfigError, match="delta tables are partitioned by columns only"):
        TableSink("t.delta", format="delta", partition_by=("day(pickup_at)",))
    with pytest.raises(chute.ConfigError, match=r"'bucket\(4, x\)': write a column, or a"):
        TableSink(format="iceberg", table="db.t", partition_by=("bucket(4, x)",))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_a_table_keeps_its_partitions(fmt: str, dated: Path, tmp_path: Path) -> None:
    """A job asking for other partitions than the table has is refused before any
    compute; one that does not say appends split by the table's own."""
    first = table_sink(fmt, tmp_path, partition_by=("pickup_date",))
    job(dated / "unit-000.parquet", first, carryover=DATED).run()
    other = table_sink(fmt, tmp_path, partition_by=("tag",))
    with pytest.raises(chute.ConfigError, match=r"partitioned by \['pickup_date'\], the job"):
        job(dated, other, carryover=DATED).run()
    # over the first job's input too: its rows again, as told (overwrite)
    report = job(dated, table_sink(fmt, tmp_path), carryover=DATED).run(overwrite=True)
    assert report.rows_out == ROWS
    assert len(read_table(first)) == ROWS + ROWS_PER_UNIT


# --------------------------------------------------------------------------- status, report


def _cli(*args: str) -> str:
    """``chute ARGS`` through click's runner (exit 0 required); the output on one line."""
    from click.testing import CliRunner

    from chute.cli import main

    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return " ".join(result.output.replace("│", " ").split())


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("fmt", FORMATS)
def test_status_and_report_on_a_table_through_the_cli(fmt: str, data: Path, tmp_path: Path) -> None:
    """A run killed after its first table commit, its batch staged: `chute status` says
    what is committed and unresolved; resumed, finished; then a second job on the table:
    status shows both, --job and the job file pick one, `chute report` the latest."""
    sink = table_sink(fmt, tmp_path, commit_seconds=0)
    path = _job_file(tmp_path / "job.yaml", data, sink, delay=0.0)  # JSON is YAML
    died = _run([str(TABLE_CHAOS), "staged", "2", str(path)])
    assert died.returncode == -signal.SIGKILL, died.stderr
    where = str(_location(sink))
    held = sum(len(units_of(m[UNITS_KEY])) for m in history(sink))
    staged = _cli("status", where)
    assert f"units committed {held} of {UNITS}" in staged and "finished no" in staged
    assert "units unresolved" in staged and "(table), job " in staged
    assert _run(["-m", "chute", "run", str(path), "-q"]).returncode == 0
    done = _cli("status", where)
    assert f"units committed {UNITS} of {UNITS}" in done and f"rows committed {ROWS:,}" in done
    assert "finished yes" in done and "unresolved" not in done
    assert f"{fmt} table:" in done and "the last run made" in done
    first = next(
        iter(json.loads(p.read_text()) for p in _location(sink).glob("_chute/jobs/*/job.json"))
    )
    job_id = str(first["fingerprint"])[:16]
    assert f"job {job_id}" in done

    other = _job_file(tmp_path / "other.yaml", data / "unit-000.parquet", sink, delay=0.0)
    assert _run(["-m", "chute", "run", str(other), "-q", "--overwrite"]).returncode == 0
    both = _cli("status", where)
    assert both.count("chute status:") == 2 and both.count("finished yes") == 2
    assert both.index(f"job {job_id}") > both.index("chute status:", 1), "latest job first"
    mine = _cli("status", str(path))  # the job file: its table, its job
    assert mine.count("chute status:") == 1 and f"job {job_id}" in mine
    picked = _cli("status", where, "--job", job_id[:8])
    assert picked.partition("(table)")[2] == mine.partition("(table)")[2]
    report = _cli("report", where)  # the latest job: the one unit of the second
    assert f"{ROWS_PER_UNIT:,}" in report and "report.html" in report
    report = _cli("report", str(path))  # the first job's last run: the resume
    assert f"{UNITS - held} run, {held} already done, {UNITS} in all" in report
    html = f"/_chute/jobs/{job_id}/report.html"
    assert report.count(html) == 2  # in the report, and the one rewritten now
    assert (_location(sink) / "_chute" / "jobs" / job_id / "report.html").is_file()


def _mark_odd_ids(batch: dict[str, np.ndarray]) -> dict[str, object]:
    return {"p": batch["id"] * 2.0, "_error": np.where(batch["id"] % 2 == 1, "odd", None)}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", FORMATS)
def test_quarantined_rows_of_a_table_job_are_in_its_folder_and_its_report(
    fmt: str, data: Path, tmp_path: Path
) -> None:
    """Rows a model marks failed go to the job's errors/ folder, not the table; the
    report's failures and `chute status` count them there."""
    model = chute.Model("m", _mark_odd_ids, inputs=("id",), batch_format="numpy")
    sink = table_sink(fmt, tmp_path)
    report = chute.Job(
        source=chute.FileSource(str(data)),
        models=(replace(model, on_error="quarantine"),),
        carryover=("id",),
        output=sink,
    ).run()
    assert (report.rows_out, report.rows_failed) == (ROWS // 2, ROWS // 2)
    assert (read_table(sink).id % 2 == 0).all() and len(read_table(sink)) == ROWS // 2
    job_id = report.fingerprint[:16]
    folder = _location(sink) / "_chute" / "jobs" / job_id
    errors = pq.read_table(folder / "errors")
    assert sorted(errors.column("id").to_pylist()) == list(range(1, ROWS, 2))
    assert report.failures["rows"] == ROWS // 2
    assert report.failures["path"].endswith(f"_chute/jobs/{job_id}/errors/")
    assert f"_chute/jobs/{job_id}/errors/)" in dict(report.rows())["rows failed"]  # not _errors/
    manifest = json.loads((folder / "manifest.json").read_text())
    assert sum(f["rows"] for f in manifest["errors"]) == ROWS // 2
    assert sum(f["rows"] for f in manifest["files"]) == ROWS // 2
    status = _cli("status", str(_location(sink)))
    assert f"rows failed {ROWS // 2:,} (in errors/ of the job's folder)" in status


# --------------------------------------------------------------------------- S3


def s3_sink(fmt: str, tmp_path: Path, **kwargs: Any) -> TableSink:
    """A table in the moto bucket (an Iceberg catalog on local SQLite, its warehouse in
    the bucket); the endpoint comes from AWS_ENDPOINT_URL, as for any chute location."""
    if fmt == "iceberg":
        catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db"}
        catalog["warehouse"] = "s3://bucket/warehouse"
        return TableSink(format="iceberg", table="db.preds", catalog=catalog, **kwargs)
    return TableSink(f"s3://bucket/tables/preds.{fmt}", format=fmt, **kwargs)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_table_on_s3_is_written_read_back_and_resumed_exactly_once(
    fmt: str, s3: FaultProxy, moto_s3: MotoS3, data: Path, tmp_path: Path
) -> None:
    """The table, its data files and chute's _chute/ in the bucket: a driver killed after
    its second table commit (before chute's confirmation), resumed; each format's reader
    gives every input row once with the model's values, every unit in one commit."""
    sink = s3_sink(fmt, tmp_path, commit_seconds=0)
    path = _job_file(tmp_path / "job.yaml", data, sink)
    env = driver_env(AWS_ENDPOINT_URL=s3.endpoint)
    died = _run([str(TABLE_CHAOS), "committed", "2", str(path)], env)
    assert died.returncode == -signal.SIGKILL, died.stderr
    assert len(_safe_history(sink)) == 2
    done = _run(["-m", "chute", "run", str(path), "-q"], env)
    assert done.returncode == 0, done.stderr
    _check_chaos(sink)
    frame, inputs = read_table(sink), pd.read_parquet(data).sort_values("id")
    np.testing.assert_allclose(frame.m_score, np.sin(inputs.x) * 3.0 + inputs.id % 7)
    np.testing.assert_array_equal(frame.m_rank, inputs.id * 2 + 1)
    prefix = "warehouse/db/preds/" if fmt == "iceberg" else f"tables/preds.{fmt}/"
    keys = list_keys(moto_s3, "bucket", prefix)
    [job] = {k.split("/")[-2] for k in keys if k.endswith("/job.json")}
    assert f"{prefix}_chute/jobs/{job}/_SUCCESS" in keys
    assert any(k.startswith(f"{prefix}_chute/jobs/{job}/ledger/") for k in keys)
    data_files = [k for k in keys if k.startswith(f"{prefix}data/")]
    assert len(data_files) >= UNITS
    status = _cli_env(s3.endpoint, "status", f"s3://bucket/{prefix}")
    assert f"units committed {UNITS} of {UNITS}" in status and "finished yes" in status


def _cli_env(endpoint: str, *args: str) -> str:
    from click.testing import CliRunner

    from chute.cli import main

    runner = CliRunner(env={"COLUMNS": "200", "AWS_ENDPOINT_URL": endpoint})
    result = runner.invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return " ".join(result.output.replace("│", " ").split())


# --------------------------------------------------------------------------- MiniLM


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_nearest_neighbour_over_minilm_embeddings_in_lance(tmp_path: Path) -> None:
    """The sentences of the test data embedded by all-MiniLM-L6-v2 into a Lance table
    with a vector index: a paraphrase finds its sentence."""
    import lance
    from sentence_transformers import SentenceTransformer

    from chute.models import adapter
    from tests.test_adapters_hf import SENTENCES, minilm_dir

    path = minilm_dir()
    texts = pa.table({"id": np.arange(len(SENTENCES)), "text": SENTENCES})
    model = chute.Model(
        "emb",
        adapter("sentence-transformers", path=path, normalize=True),
        inputs=["text"],
        batch_size=4,
    )
    index = Index("emb_embedding", type="ivf_flat", metric="cosine", num_partitions=1)
    sink = table_sink("lance", tmp_path, index=index)
    job = chute.Job(
        source=chute.TableSource(texts, unit_rows=3),
        models=(model,),
        carryover=("id", "text"),
        output=sink,
    )
    assert job.run().rows_out == len(SENTENCES)
    dataset = lance.dataset(sink.path)
    assert dataset.schema.field("emb_embedding").type == pa.list_(pa.float32(), 384)
    query = SentenceTransformer(path, device="cpu").encode(
        "a puppy running through the park", normalize_embeddings=True
    )
    nearest = dataset.to_table(
        columns=["text"], nearest={"column": "emb_embedding", "q": query, "k": 1}
    )
    assert nearest.column("text").to_pylist() == ["a big dog ran in the park"]


@pytest.mark.timeout(240)
def test_the_tables_example_runs_and_reads_back(tmp_path: Path) -> None:
    """examples/tables/run.py: every output holds the same rows (it checks), each table
    in one commit on this small run; a second run adds nothing."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "examples" / "tables" / "run.py"
    spec = importlib.util.spec_from_file_location("tables_example", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    first = example.run(5_000, tmp_path)
    assert [r["output"] for r in first] == ["parquet", "iceberg", "delta", "lance"]
    assert all(r["rows"] == 5_000 for r in first)
    assert [r["commits"] for r in first[1:]] == [1, 1, 1]
    again = example.run(5_000, tmp_path)
    assert all(r["rows"] == 0 for r in again) and [r["commits"] for r in again[1:]] == [1, 1, 1]


# --------------------------------------------------------------------------- reruns, drops


def _other_job(data: Path, output: chute.Sink) -> chute.Job:
    """The same input, model and columns; another job (a metric added)."""
    from chute.metrics import metric_from_spec

    spec = {"type": "mean", "column": "m_score"}
    return replace(job(data, output), metrics=(metric_from_spec(spec),))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_finished_job_run_again_after_any_change_is_refused_not_appended_twice(
    data: Path, tmp_path: Path, fmt: str
) -> None:
    """A metric added, a comment edited, the input files touched: a new job, which wrote
    every row a second time into the table (60 rows of 30 unique), and said complete."""
    sink = table_sink(fmt, tmp_path)
    assert job(data, sink).run().rows_out == ROWS
    with pytest.raises(chute.JobStateError, match="already holds the rows of another chute job"):
        _other_job(data, sink).run()
    assert len(read_table(sink)) == ROWS
    again = _other_job(data, sink).run(overwrite=True)  # told to: the rows again, on purpose
    assert again.rows_out == ROWS and len(read_table(sink)) == 2 * ROWS


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_table_dropped_since_its_job_finished_is_written_again(
    data: Path, tmp_path: Path, fmt: str
) -> None:
    """Its units were taken as committed: "nothing to do", and no table."""
    import shutil

    sink = table_sink(fmt, tmp_path)
    assert job(data, sink).run().rows_out == ROWS
    if fmt == "iceberg":
        _iceberg(sink).catalog.drop_table("db.preds")
    else:
        for name in ("_delta_log", "_versions", "data"):
            shutil.rmtree(Path(sink.path) / name, ignore_errors=True)
    report = job(data, sink).run()
    assert report.units_done == UNITS
    frame = read_table(sink)
    assert len(frame) == ROWS and frame.id.is_unique


def _make_again(sink: TableSink) -> None:
    """Another tool drops the table and makes it again, empty, with the same columns."""
    import shutil

    if sink.format == "iceberg":
        table = _iceberg(sink)
        table.catalog.drop_table("db.preds")
        table.catalog.create_table("db.preds", schema=table.schema())
    elif sink.format == "delta":
        from deltalake import DeltaTable, write_deltalake

        schema = pa.schema(DeltaTable(sink.path).schema().to_arrow())
        shutil.rmtree(Path(sink.path) / "_delta_log")
        write_deltalake(sink.path, schema.empty_table(), mode="overwrite")
    else:
        import lance

        schema = lance.dataset(sink.path).schema
        for name in ("_versions", "_transactions", "data"):
            shutil.rmtree(Path(sink.path) / name, ignore_errors=True)
        lance.write_dataset(schema.empty_table(), sink.path, mode="create")


def _overwrite_in_place(sink: TableSink) -> None:
    """The table made again where it is, empty, by its own writer: its history kept."""
    if sink.format == "iceberg":  # a snapshot that deletes every file, then an empty append
        table = _iceberg(sink)
        table.overwrite(table.scan().to_arrow().slice(0, 0))
    elif sink.format == "delta":
        from deltalake import DeltaTable, write_deltalake

        schema = pa.schema(DeltaTable(sink.path).schema().to_arrow())
        write_deltalake(sink.path, schema.empty_table(), mode="overwrite")
    else:
        import lance

        schema = lance.dataset(sink.path).schema
        lance.write_dataset(schema.empty_table(), sink.path, mode="overwrite")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("change", ["made again", "rolled back", "overwritten in place"])
def test_a_finished_job_whose_table_lost_its_rows_writes_them_again(
    data: Path, tmp_path: Path, fmt: str, change: str
) -> None:
    """The table made again (empty, same columns; or in place by its own writer, which
    keeps the history: the walk went through the overwrite to the job's commits), or
    rolled back to the job's first commit: running the finished job again said "nothing
    to do", and the output held 4,000 rows, over a table that held none (or 500). (An
    Iceberg table overwritten by pyiceberg keeps its chain of parents too.)"""
    sink = table_sink(fmt, tmp_path, commit_seconds=0)
    assert job(data, sink).run().rows_out == ROWS
    last = _version(sink)
    if change == "made again":
        _make_again(sink)
    elif change == "overwritten in place":
        _overwrite_in_place(sink)
    else:
        _restore(sink, "first")
    assert len(read_table(sink)) < ROWS
    report = job(data, sink).run()
    assert report.units_done > 0
    frame = read_table(sink)
    assert len(frame) == ROWS and frame.id.is_unique
    if change == "rolled back":  # the version rolled back from still reads: its files kept
        _set_version(sink, last)
        frame = read_table(sink)
        assert len(frame) == ROWS and frame.id.is_unique


def _other_rows(table: Any) -> pa.Table:
    """Ten rows of another writer's, with the table's columns (ids no job here has)."""
    rows = table.scan(limit=10).to_arrow()
    at = rows.schema.get_field_index("id")
    return rows.set_column(at, rows.schema.field(at), pc.add(rows.column(at), 10 * ROWS))


ICEBERG_CHANGES = {
    # what another writer does with pyiceberg: whether the job's rows are all gone
    "overwritten with other rows": True,  # a delete snapshot of every file, then an append
    "every row deleted": True,
    "overwritten where every id matched": True,
    "overwritten where some ids matched": False,  # a delete of some rows: not written again
    "a row of every file deleted": False,  # every file rewritten without it (copy-on-write)
    "appended to": False,
}


def _change_iceberg(sink: TableSink, change: str) -> tuple[int, int]:
    """Another writer changes the job's table with pyiceberg: how many of the job's rows it
    left, and how many of its own it wrote."""
    table = _iceberg(sink)
    other = _other_rows(table)
    every_unit = ", ".join(str(u * ROWS_PER_UNIT) for u in range(UNITS))
    if change == "overwritten with other rows":
        table.overwrite(other)
    elif change == "every row deleted":
        table.delete(f"id < {ROWS}")
        return 0, 0
    elif change == "overwritten where every id matched":
        table.overwrite(other, overwrite_filter=f"id < {ROWS}")
    elif change == "overwritten where some ids matched":
        table.overwrite(other, overwrite_filter=f"id < {ROWS_PER_UNIT}")
        return ROWS - ROWS_PER_UNIT, len(other)
    elif change == "a row of every file deleted":
        table.delete(f"id in ({every_unit})")
        return ROWS - UNITS, 0
    else:
        table.append(other)
    return 0 if ICEBERG_CHANGES[change] else ROWS, len(other)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("change", list(ICEBERG_CHANGES))
def test_an_iceberg_table_another_writer_changed_since_its_job_finished(
    data: Path, tmp_path: Path, change: str, caplog: pytest.LogCaptureFixture
) -> None:
    """pyiceberg's ``overwrite`` of the whole table is a snapshot that deletes every file,
    then an append, its parents kept: the walk went on to the job's commits, and running
    the finished job again said "nothing to do" over a table without its rows. A table
    emptied ends the walk, and the job's units are computed again; a delete of some rows
    (one that rewrote every file included) or another writer's append leaves them."""
    sink = table_sink("iceberg", tmp_path, commit_seconds=0)
    assert job(data, sink).run().rows_out == ROWS
    left, theirs = _change_iceberg(sink, change)
    with caplog.at_level("WARNING", logger="chute"):
        report = job(data, sink).run()
    frame = read_table(sink)
    ours, others = frame[frame.id < ROWS], frame[frame.id >= ROWS]
    assert len(others) == theirs
    if ICEBERG_CHANGES[change]:
        assert report.units_done == UNITS and report.rows_out == ROWS
        assert len(ours) == ROWS and ours.id.is_unique
        assert "overwritten whole" in caplog.text
    else:
        assert report.units_done == 0  # nothing to do: the rows another writer left stay
        assert len(ours) == left and ours.id.is_unique
        assert "no longer holds" not in caplog.text


def _version(sink: TableSink) -> int:
    """The table's current snapshot (Iceberg) or version."""
    if sink.format == "iceberg":
        return int(_iceberg(sink).current_snapshot().snapshot_id)
    if sink.format == "delta":
        from deltalake import DeltaTable

        return int(DeltaTable(sink.path).version())
    import lance

    return int(lance.dataset(sink.path).version)


def _set_version(sink: TableSink, version: int) -> None:
    """Another tool makes an older snapshot or version the table's current one again."""
    if sink.format == "iceberg":
        with _iceberg(sink).manage_snapshots() as snapshots:
            snapshots.set_current_snapshot(snapshot_id=version)
    elif sink.format == "delta":
        from deltalake import DeltaTable

        DeltaTable(sink.path).restore(version)
    else:
        import lance

        lance.dataset(sink.path, version=version).restore()


def _upkeep(sink: TableSink) -> None:
    """Routine upkeep by the table's own tools: its files compacted (rewritten), then its
    old snapshots, log entries or versions cleaned up."""
    import datetime

    if sink.format == "iceberg":  # pyiceberg has no compaction: its files rewritten whole
        table = _iceberg(sink)
        table.overwrite(table.scan().to_arrow())
        table = _iceberg(sink)
        current = table.current_snapshot().snapshot_id
        old = [s.snapshot_id for s in table.snapshots() if s.snapshot_id != current]
        table.maintenance.expire_snapshots().by_ids(old).commit()
    elif sink.format == "delta":
        from deltalake import DeltaTable

        DeltaTable(sink.path).optimize.compact()
        table = DeltaTable(sink.path)
        table.create_checkpoint()
        table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
        table.cleanup_metadata()
    else:
        import lance

        lance.dataset(sink.path).optimize.compact_files()
        lance.dataset(sink.path).cleanup_old_versions(
            older_than=datetime.timedelta(0), delete_unverified=True
        )


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_finished_job_is_not_redone_after_its_table_is_compacted_and_cleaned_up(
    data: Path, tmp_path: Path, fmt: str
) -> None:
    """Compaction rewrote the job's files and the history before it is gone: nothing says
    the job's batches are in the table, and nothing says they are not: they are trusted.
    (The current snapshot of an Iceberg table rewritten with pyiceberg's ``overwrite``,
    the rest expired, has no parent left, which looked like the table's first, and the
    job's rows were written a second time. Its snapshot that emptied the table expired
    with the rest: an ``overwrite`` whose snapshots are kept writes them again, as one of
    other rows must: see test_an_iceberg_table_another_writer_changed_since_its_job_finished.)"""
    sink = table_sink(fmt, tmp_path, commit_seconds=0)
    assert job(data, sink).run().rows_out == ROWS
    _upkeep(sink)
    report = job(data, sink).run()
    assert report.units_done == 0
    assert len(read_table(sink)) == ROWS


@pytest.mark.timeout(120)
def test_a_lance_dataset_that_fails_to_open_is_never_replaced(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any error opening it was taken for "no dataset yet", and the commit overwrote the
    rows another tool had written."""
    import lance

    sink = table_sink("lance", tmp_path)
    theirs = pa.table({"id": pa.array([10**6], pa.int64()), "tag": pa.array([0], pa.int64())})
    vec = pa.FixedSizeListArray.from_arrays(pa.array([0.0] * 4, pa.float32()), 4)
    theirs = theirs.append_column("m_score", pa.array([0.0])).append_column("m_vec", vec)
    lance.write_dataset(theirs, sink.path)
    real = lance.dataset

    def flaky(*args: Any, **kwargs: Any) -> Any:
        raise OSError("connection reset")

    monkeypatch.setattr(lance, "dataset", flaky)
    with pytest.raises(chute.ChuteError):
        job(data, sink).run()
    monkeypatch.setattr(lance, "dataset", real)
    assert 10**6 in read_table(sink).id.tolist()


@pytest.mark.timeout(120)
def test_a_column_null_in_every_row_cannot_make_a_table_column(tmp_path: Path) -> None:
    """A new Delta or Lance table was made with a "void" column, and no later rows with
    values could go in: every resume failed."""
    table = pa.table({"id": range(10), "x": [float(i) for i in range(10)]})
    where = tmp_path
    nulls = chute.Model("m", lambda b: {"score": pa.nulls(b.num_rows)}, inputs=("x",))
    bad = chute.Job(
        source=chute.TableSource(table),
        models=(nulls,),
        carryover=("id",),
        output=table_sink("delta", where),
        engine="local",
    )
    with pytest.raises(chute.ModelError, match=r"'m_score' is null in every row .*typed nulls"):
        bad.run()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_lists_empty_in_every_row_cannot_make_a_table_column(fmt: str, tmp_path: Path) -> None:
    """A part whose lists were all empty (``list<null>``) made a Delta table of that type,
    and the later parts' ``list<double>`` were refused; Iceberg named a type it has none
    of. Refused as a column null in every row is, before anything is written."""
    table = pa.table({"id": range(20)})

    def found(batch: pa.Table) -> pa.Array:
        ids = batch.column("id").to_pylist()
        return pa.array([[] if ids[0] < 10 else [float(i)] for i in ids])

    sink = table_sink(fmt, tmp_path)
    bad = chute.Job(
        source=chute.TableSource(table),
        models=(chute.Model("m", found, inputs=("id",), batch_size=10),),
        carryover=("id",),
        output=sink,
        engine="local",
    )
    with pytest.raises(chute.ModelError, match=r"'m' is list<item: null>: only nulls or empty"):
        bad.run()
    if fmt == "delta":
        assert not (tmp_path / "preds.delta" / "_delta_log").exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_nanosecond_and_zoned_timestamps_are_stored_as_these_tables_store_them(
    tmp_path: Path, fmt: str
) -> None:
    """pandas' nanoseconds made a Delta table its own reader could not read, and Iceberg
    failed after the compute; a zone other than UTC failed the same way."""
    frame = pd.DataFrame(
        {
            "id": range(4),
            "at": pd.date_range("2024-01-05", periods=4, freq="h"),  # nanoseconds
            "local": pd.date_range("2024-01-05", periods=4, freq="h", tz="America/New_York"),
        }
    )
    sink = table_sink(fmt, tmp_path)
    model = chute.Model("m", lambda b: {"n": pa.array([1] * b.num_rows)}, inputs=("id",))
    chute.Job(
        source=chute.TableSource(pa.Table.from_pandas(frame, preserve_index=False)),
        models=(model,),
        carryover=("id", "at", "local"),
        output=sink,
        engine="local",
    ).run()
    got = read_table(sink)
    assert got["at"].tolist() == frame["at"].tolist()
    assert got["local"].tolist() == frame["local"].tolist()  # the same instants, in UTC


@pytest.mark.timeout(60)
def test_a_nanosecond_that_a_table_cannot_hold_is_refused_never_rounded(tmp_path: Path) -> None:
    stamps = pa.array([1_700_000_000_000_000_001], pa.timestamp("ns"))
    sink = table_sink("delta", tmp_path)
    model = chute.Model("m", lambda b: {"n": pa.array([1] * b.num_rows)}, inputs=("id",))
    job = chute.Job(
        source=chute.TableSource(pa.table({"id": [0], "at": stamps})),
        models=(model,),
        carryover=("id", "at"),
        output=sink,
        engine="local",
    )
    with pytest.raises(chute.DataError, match="finer than a microsecond"):
        job.run()


@pytest.mark.timeout(60)
def test_a_delta_table_whose_rules_chute_would_bypass_is_refused_before_any_compute(
    data: Path, tmp_path: Path
) -> None:
    """chute adds its files to the log as they are: a CHECK constraint took 15 rows that
    broke it, and a NOT NULL column the job does not write took nulls."""
    from deltalake import DeltaTable, write_deltalake

    sink = table_sink("delta", tmp_path)
    seed = job(data, sink).run()
    assert seed.rows_out == ROWS
    DeltaTable(sink.path).alter.add_constraint({"ids": "id >= 0"})
    with pytest.raises(chute.DataError, match=r"rules chute's commits would not keep \(delta"):
        _other_job(data, sink).run(overwrite=True)
    assert len(read_table(sink)) == ROWS  # nothing added
    strict = tmp_path / "strict.delta"
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("note", pa.string(), False)])
    write_deltalake(str(strict), pa.table({"id": [0], "note": ["x"]}, schema=schema))
    with pytest.raises(chute.DataError, match="NOT NULL column 'note' the job does not write"):
        job(data, TableSink(str(strict), format="delta"), carryover=("id",)).run()


@pytest.mark.parametrize(
    ("path", "held"),
    [
        ("s3://bucket/t%20x", "'%'"),
        ("s3://bucket/t?v=2", "'?'"),
        ("s3://bucket/t#2", "'#'"),
        ("/data/a%41b.delta", "'%'"),  # delta-rs reads a local path's %41 as A
    ],
)
def test_a_table_location_the_tables_library_would_read_otherwise_is_refused(
    path: str, held: str
) -> None:
    """chute takes an S3 key as written; delta-rs and Lance parse it as a URL: the table's
    log and chute's files would be under two prefixes. Locally delta-rs decodes ``%41``:
    the first commit went to ``a%41b.delta``, the table was read from ``aAb.delta``, and no
    run could ever finish."""
    from chute.tables import TableSink

    with pytest.raises(chute.ConfigError, match=rf"holds {re.escape(held)}, which the table's"):
        TableSink(format="delta", path=path)
    if "://" not in path:
        TableSink(format="lance", path=path.replace(".delta", ".lance"))  # Lance reads it so


def _twice(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"p": batch["id"] * 2.0}


@pytest.mark.timeout(120)
def test_a_table_jobs_record_cut_short_is_named_with_what_to_do(data: Path, tmp_path: Path) -> None:
    """A job.json of 0 bytes (a failed upload) gave a JSONDecodeError traceback on every
    run, and the advice for file outputs (--overwrite) could not help a table."""
    sink = table_sink("delta", tmp_path)
    model = chute.Model("m", _twice, inputs=("id",), batch_format="numpy")
    job = chute.Job(
        source=chute.FileSource(str(data)), models=(model,), carryover=("id",), output=sink
    )
    report = job.run()
    (_location(sink) / "_chute" / "jobs" / report.fingerprint[:16] / "job.json").write_bytes(b"")
    for overwrite, why in ((False, "is not what chute wrote"), (True, "cannot redo it")):
        with pytest.raises(chute.JobStateError, match=why) as info:
            job.run(overwrite=overwrite)
        assert "table's own tools" in str(info.value)
    assert len(read_table(sink)) == ROWS  # no row added twice


def _scores(batch: dict[str, np.ndarray], holes: bool = False) -> dict[str, list[float | None]]:
    return {"score": [None if holes and i % 7 == 3 else i / 2 for i in batch["id"].tolist()]}


def _strict_table(fmt: str, sink: TableSink, *more: pa.Field) -> None:
    """A table whose columns are NOT NULL (Iceberg: required), holding one row."""
    fields = [pa.field("id", pa.int64(), False), pa.field("m_score", pa.float64(), False)]
    schema = pa.schema(fields + list(more))
    seed = pa.table(
        {"id": [-1], "m_score": [0.0], **{f.name: pa.array([[1.0]], f.type) for f in more}},
        schema=schema,
    )
    if fmt == "iceberg":
        from pyiceberg.catalog import load_catalog

        from chute.tables.iceberg import catalog_properties

        catalog = load_catalog("default", **catalog_properties(sink))
        catalog.create_namespace("db")
        catalog.create_table(sink.table, schema=schema).append(seed)
    elif fmt == "delta":
        from deltalake import write_deltalake

        write_deltalake(sink.path, seed)
    else:
        import lance

        lance.write_dataset(seed, sink.path)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", FORMATS)
def test_not_null_columns_are_written_as_such_and_a_null_stops_the_run(
    fmt: str, tmp_path: Path
) -> None:
    """chute adds its own files to a table, so the table's library never checked them:
    Delta took nulls into a NOT NULL column and reported the run complete, Lance failed
    with an I/O error, and Iceberg refused every file for a required column, null or not."""
    sink = table_sink(fmt, tmp_path)
    _strict_table(fmt, sink)

    def scores(holes: bool, carryover: tuple[str, ...] = ("id",)) -> chute.Job:
        model = chute.Model(
            "m", partial(_scores, holes=holes), inputs=("id",), batch_format="numpy"
        )
        source = chute.TableSource(pa.table({"id": np.arange(100)}), unit_rows=50)
        return chute.Job(source, (model,), carryover=carryover, output=sink, engine="local")

    with pytest.raises(chute.DataError, match=r"NOT NULL column 'id' the job does not write"):
        scores(holes=False, carryover=()).run()
    with pytest.raises(chute.DataError, match=r"'m_score' is null in 7 row\(s\) of unit \d, but"):
        scores(holes=True).run()
    assert read_table(sink).id.tolist() == [-1]  # nothing added
    assert scores(holes=False).run(overwrite=True).rows_out == 100
    frame = read_table(sink)
    assert frame.id.tolist() == list(range(-1, 100))
    assert frame.m_score.tolist() == [0.0] + [i / 2 for i in range(100)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_not_null_column_no_model_returns_and_nested_not_null_values_are_refused(
    fmt: str, tmp_path: Path
) -> None:
    """A NOT NULL ``m_extra`` looked written (model ``m`` might return it) and was not: Delta
    took nulls there and the run was complete. A list whose elements are NOT NULL: Iceberg
    refused every file, Delta took null elements."""
    model = chute.Model("m", _scores, inputs=("id",), batch_format="numpy")
    source = chute.TableSource(pa.table({"id": np.arange(10)}))
    extra = pa.field("m_extra", pa.list_(pa.float64()), False)
    sink = table_sink(fmt, tmp_path / "extra")
    _strict_table(fmt, sink, extra)
    job = chute.Job(source, (model,), carryover=("id",), output=sink, engine="local")
    with pytest.raises(chute.DataError, match=r"no column 'm_extra', which .* has NOT NULL"):
        job.run()
    nested = pa.field("m_vec", pa.list_(pa.field("element", pa.float64(), False)))
    sink = table_sink(fmt, tmp_path / "nested")
    _strict_table(fmt, sink, nested)
    job = chute.Job(source, (model,), carryover=("id",), output=sink, engine="local")
    with pytest.raises(chute.DataError, match=r"column 'm_vec' holds values that may not be null"):
        job.run()
    assert read_table(sink).id.tolist() == [-1]


def test_delta_operation_parameters_are_read_as_spark_writes_them_too() -> None:
    """Spark writes a commit's parameters as JSON text: int("null") raised in every later
    run on the table once the history walk met such a RESTORE."""
    pytest.importorskip("deltalake")
    from chute.tables.delta import _replaces, _restored

    def restore(**params: Any) -> dict[str, Any]:
        return {"operation": "RESTORE", "operationParameters": params}

    assert _restored(restore(version="3"), 9) == (3, None)
    assert _restored(restore(version=3), 9) == (3, None)
    at = _restored(restore(version="null", timestamp='"2024-01-01 00:00:00"'), 9)
    assert at == (8, 1_704_067_200_000)
    assert _restored(restore(timestamp=1_704_067_200_000), 9) == (8, 1_704_067_200_000)
    assert _restored(restore(version="soon"), 9) is None
    write = {"operation": "WRITE", "operationParameters": {"mode": "Overwrite"}}
    assert _replaces(write)
    assert _replaces({"operation": "WRITE", "operationParameters": {"mode": '"Overwrite"'}})
    kept = {"mode": "Overwrite", "predicate": "id < 10"}
    assert not _replaces({"operation": "WRITE", "operationParameters": kept})
    assert not _replaces({"operation": "WRITE", "operationParameters": {"mode": "Append"}})
    assert _replaces({"operation": "CREATE OR REPLACE TABLE", "operationParameters": {}})


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_a_ray_job_run_from_its_folder_writes_an_iceberg_table(
    ray_session: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job file with its model file beside it (its folder is shipped to Ray's workers)
    and an Iceberg table, run from that folder: a traceback ("no path specified"), exit 1,
    because the table has no path of its own to leave out of what is shipped."""
    (tmp_path / "data").mkdir()
    pq.write_table(pa.table({"id": [1, 2, 3]}), tmp_path / "data" / "a.parquet")
    (tmp_path / "m.py").write_text("def f(batch):\n    return {'n': batch.column('id')}\n")
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db"}
    catalog["warehouse"] = f"file://{tmp_path}/warehouse"
    spec = {
        "input": "data/", "carryover": ["id"], "engine": "ray",
        "models": [{"name": "m", "fn": "m.py:f", "inputs": ["id"]}],
        "output": {"format": "iceberg", "table": "db.preds", "catalog": catalog},
    }  # fmt: skip
    (tmp_path / "job.yaml").write_text(json.dumps(spec))  # JSON is YAML
    monkeypatch.chdir(tmp_path)
    report = load_job("job.yaml").run(progress=False)
    assert report.complete
    rows = read_table(TableSink(format="iceberg", table="db.preds", catalog=catalog))
    assert sorted(zip(rows["id"], rows["m_n"], strict=True)) == [(1, 1), (2, 2), (3, 3)]
