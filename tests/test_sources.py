"""Sources: files, directories, globs and in-memory data, split into units from metadata."""

from __future__ import annotations

import errno
import json
import re
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

import chute
import chute.sources.files
from chute import ConfigError, DataError, FileSource, TableSource
from chute.sources import as_source, check_columns, iter_slices


def _table(n: int, first: int = 0) -> pa.Table:
    ids = np.arange(first, first + n, dtype=np.int64)
    return pa.table({"id": ids, "value": ids * 0.5, "label": [f"r{i}" for i in ids]})


def _parquet(path: Path, n: int, first: int = 0, row_group_size: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(_table(n, first), path, row_group_size=row_group_size)
    return path


def _csv(path: Path, n: int, first: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    _table(n, first).to_pandas().to_csv(path, index=False)
    return path


def _jsonl(path: Path, n: int, first: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = _table(n, first).to_pylist()
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _read_all(source: Any, columns: list[str] | None = None) -> pa.Table:
    return pa.concat_tables([source.read(u, columns) for u in source.plan()])


# -- which files -------------------------------------------------------------------------


def test_single_file(tmp_path: Path) -> None:
    path = _parquet(tmp_path / "a.parquet", 10)
    source = FileSource(str(path))
    assert source.files() == [str(path)]
    assert source.format == "parquet"
    (unit,) = source.plan()
    assert (unit.index, unit.id, unit.rows, unit.path, unit.row_groups) == (
        0, str(path), 10, str(path), (0,),
    )  # fmt: skip
    assert source.read(unit, None).equals(_table(10))


def test_directory_is_listed_recursively_skipping_hidden_and_empty(tmp_path: Path) -> None:
    _parquet(tmp_path / "data" / "b.parquet", 3, 100)
    _parquet(tmp_path / "data" / "a.parquet", 2)
    _parquet(tmp_path / "data" / "sub" / "c.parquet", 4, 200)
    _parquet(tmp_path / "data" / ".hidden.parquet", 1)
    _parquet(tmp_path / "data" / "_meta" / "x.parquet", 1)
    (tmp_path / "data" / "empty.parquet").write_bytes(b"")
    source = FileSource(str(tmp_path / "data"))
    names = [Path(f).relative_to(tmp_path / "data").as_posix() for f in source.files()]
    assert names == ["a.parquet", "b.parquet", "sub/c.parquet"]
    units = source.plan()
    assert [u.index for u in units] == [0, 1, 2]
    assert [u.rows for u in units] == [2, 3, 4]
    assert _read_all(source).column("id").to_pylist() == [0, 1, 100, 101, 102, 200, 201, 202, 203]


def test_relative_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _parquet(tmp_path / "data" / "a.parquet", 2)
    monkeypatch.chdir(tmp_path)
    assert FileSource("data").files() == [str(tmp_path / "data" / "a.parquet")]


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
def test_glob(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, relative: bool) -> None:
    _parquet(tmp_path / "d" / "x1.parquet", 1)
    _parquet(tmp_path / "d" / "x2.parquet", 2, 10)
    _parquet(tmp_path / "d" / "y.parquet", 3)
    _csv(tmp_path / "d" / "x3.csv", 3)
    monkeypatch.chdir(tmp_path)
    pattern = "d/x*.parquet" if relative else str(tmp_path / "d" / "x*.parquet")
    source = FileSource(pattern)
    assert [Path(f).name for f in source.files()] == ["x1.parquet", "x2.parquet"]
    assert [u.rows for u in source.plan()] == [1, 2]


def test_a_file_whose_name_looks_like_a_glob_is_read_as_named(tmp_path: Path) -> None:
    """``day[1].parquet`` was the pattern matching ``day1.parquet``: another file's rows,
    and the run "complete"."""
    _parquet(tmp_path / "day[1].parquet", 2)
    _parquet(tmp_path / "day1.parquet", 3)
    assert FileSource(str(tmp_path / "day[1].parquet")).files() == [
        str(tmp_path / "day[1].parquet")
    ]
    assert FileSource(str(tmp_path / "day[0-9].parquet")).files() == [
        str(tmp_path / "day1.parquet")
    ]


def test_a_path_whose_existence_cannot_be_told_is_not_taken_for_a_glob() -> None:
    """An error checking ``day[1].parquet`` read it as the pattern: another file's rows."""
    from chute.sources.files import is_glob

    class Refusing(pafs.FSSpecHandler):
        def get_file_info(self, paths: Any) -> Any:
            raise PermissionError(errno.EACCES, "refused")

    with pytest.raises(OSError):
        is_glob(pafs.PyFileSystem(Refusing(fsspec.filesystem("memory"))), "/d/day[1].parquet")


def test_a_remote_file_is_named_as_addressed_without_credentials() -> None:
    source = FileSource("s3://KEY:SECRET@bkt/photos/")
    assert source.uri("bkt/photos/a.png") == "s3://bkt/photos/a.png"
    web = FileSource("https://example.com/cat.png")  # fsspec's path is the URL itself
    assert web.uri("https://example.com/cat.png") == "https://example.com/cat.png"


def test_a_glob_matches_within_a_folder_and_never_a_hidden_name(tmp_path: Path) -> None:
    """``*`` stays within a folder and never matches a leading ``.`` or ``_`` (a Spark
    job's ``_temporary/`` attempts, chute's ``_errors/``, editors' dot files): before, all
    of these were read, and a Spark attempt's rows came out twice. ``**`` crosses folders;
    a name spelled with its ``_`` is matched."""
    d = tmp_path / "d"
    for name in [
        "a.parquet",
        "sub/b.parquet",
        ".hidden.parquet",
        "_errors.parquet",
        ".staging/c.parquet",
        "sub/_temporary/0/part-attempt.parquet",
        "_staging/s.parquet",
    ]:
        _parquet(d / name, 1)

    def names(pattern: str) -> list[str]:
        return [str(Path(f).relative_to(d)) for f in FileSource(str(d / pattern)).files()]

    assert names("*.parquet") == ["a.parquet"]
    assert names("*/*.parquet") == ["sub/b.parquet"]
    assert names("**/*.parquet") == ["a.parquet", "sub/b.parquet"]
    assert names("_staging/*.parquet") == ["_staging/s.parquet"]
    assert names("[a-z].parquet") == ["a.parquet"]


def test_a_folder_reached_twice_through_a_link_is_read_once(tmp_path: Path) -> None:
    """``latest -> 2024-06-02`` beside the dated folders, and a link back up (a loop):
    each file is one unit, its rows once (before: 6 rows planned of 4, and a loop listed
    121 files of 2)."""
    daily = tmp_path / "daily"
    _parquet(daily / "2024-06-01" / "events.parquet", 2)
    _parquet(daily / "2024-06-02" / "events.parquet", 2, 10)
    (daily / "latest").symlink_to("2024-06-02")
    (daily / "2024-06-01" / "loop").symlink_to("..")
    source = FileSource(str(daily))
    assert [str(Path(f).relative_to(daily)) for f in source.files()] == [
        "2024-06-01/events.parquet",
        "2024-06-02/events.parquet",
    ]
    assert sum(u.rows or 0 for u in source.plan()) == 4


def test_dot_dot_after_a_link_is_the_folder_the_system_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``latest -> archive/06``: ``latest/../05`` is ``archive/05`` to the system and to
    pyarrow; cut as text it was ``data/05``, another folder, whose rows were read."""
    _parquet(tmp_path / "archive" / "05" / "a.parquet", 3, first=100)
    _parquet(tmp_path / "data" / "05" / "a.parquet", 3)
    (tmp_path / "archive" / "06").mkdir()
    (tmp_path / "data" / "latest").symlink_to(tmp_path / "archive" / "06")
    for given in (f"{tmp_path}/data/latest/../05/", "latest/../05"):
        monkeypatch.chdir(tmp_path / "data")
        ids = _read_all(FileSource(given)).column("id").to_pylist()
        assert ids == [100, 101, 102], given


def test_file_uris_are_decoded_as_the_system_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Path.as_uri()`` gives ``file:///.../my%20data``: it named a folder "my%20data"
    (an output written beside the one meant); ``file://localhost/x`` was ``./localhost/x``."""
    monkeypatch.chdir(tmp_path)
    _parquet(tmp_path / "my data" / "a.parquet", 4)
    folder = tmp_path / "my data"
    for uri in (folder.as_uri(), f"file://localhost{folder}", f"file:{folder}", "file://./my data"):
        assert _read_all(FileSource(uri)).num_rows == 4, uri
    for uri, named in [
        ("file://elsewhere/data", "names the host 'elsewhere'"),
        (f"file://{folder}#2", "begins a query or a fragment"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(named)):
            FileSource(uri).files()
    out = tmp_path / "my out"
    job = chute.Job(
        source=TableSource(_table(5)),
        models=(chute.Model("m", lambda b: {"y": b["value"]}, inputs=("value",)),),
        output=chute.Sink(out.as_uri()),
        engine="local",
    )
    job.run()
    assert (out / "_SUCCESS").exists() and not (tmp_path / "my%20out").exists()
    assert not (tmp_path / "localhost").exists()


def test_a_file_named_by_two_of_the_paths_is_read_once(tmp_path: Path) -> None:
    a = _parquet(tmp_path / "a.parquet", 2)
    _parquet(tmp_path / "b.parquet", 3, 10)
    source = FileSource([str(a), str(tmp_path / "*.parquet")])
    assert source.files() == [str(a), str(tmp_path / "b.parquet")]
    assert _read_all(source, ["id"]).column("id").to_pylist() == [0, 1, 10, 11, 12]


def test_list_of_paths_keeps_the_order_given(tmp_path: Path) -> None:
    b = _parquet(tmp_path / "b.parquet", 2, 10)
    a = _parquet(tmp_path / "a.parquet", 1)
    source = FileSource([str(b), str(a)])
    assert source.files() == [str(b), str(a)]
    assert _read_all(source, ["id"]).column("id").to_pylist() == [10, 11, 0]


def test_source_survives_pickling(tmp_path: Path) -> None:
    import pickle

    path = _parquet(tmp_path / "a.parquet", 3)
    source = FileSource(str(path))
    (unit,) = source.plan()
    clone = pickle.loads(pickle.dumps(source))
    assert clone.read(unit, ["id"]).column("id").to_pylist() == [0, 1, 2]


# -- parquet units -----------------------------------------------------------------------


def test_parquet_split_by_row_groups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _parquet(tmp_path / "big.parquet", 50, row_group_size=10)
    assert pq.read_metadata(path).num_row_groups == 5
    monkeypatch.setattr(chute.sources.files, "UNIT_TARGET_ROWS", 20)
    units = FileSource(str(path)).plan()
    assert [u.row_groups for u in units] == [(0, 1), (2, 3), (4,)]
    assert [u.rows for u in units] == [20, 20, 10]
    assert [u.id for u in units] == [f"{path}#rg0-1", f"{path}#rg2-3", f"{path}#rg4-4"]
    assert all(u.nbytes and u.nbytes > 0 for u in units)
    source = FileSource(str(path))
    reads = [source.read(u, ["id"]).column("id").to_pylist() for u in units]
    assert reads == [list(range(0, 20)), list(range(20, 40)), list(range(40, 50))]


def test_parquet_units_are_indexed_across_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _parquet(tmp_path / "a.parquet", 30, row_group_size=10)
    _parquet(tmp_path / "b.parquet", 5, 100)
    monkeypatch.setattr(chute.sources.files, "UNIT_TARGET_ROWS", 15)
    units = FileSource(str(tmp_path)).plan()
    assert [u.index for u in units] == [0, 1, 2]
    assert [u.rows for u in units] == [20, 10, 5]
    assert units[2].id == str(tmp_path / "b.parquet")  # a whole file keeps its plain id


def test_parquet_small_file_is_one_unit(tmp_path: Path) -> None:
    path = _parquet(tmp_path / "a.parquet", 50, row_group_size=10)
    (unit,) = FileSource(str(path)).plan()
    assert unit.row_groups == (0, 1, 2, 3, 4)
    assert unit.id == str(path)
    assert unit.rows == 50


def test_parquet_empty_file_is_a_zero_row_unit(tmp_path: Path) -> None:
    path = _parquet(tmp_path / "a.parquet", 0)
    (unit,) = FileSource(str(path)).plan()
    assert unit.rows == 0


def test_parquet_schema_from_footer(tmp_path: Path) -> None:
    path = _parquet(tmp_path / "a.parquet", 3)
    assert FileSource(str(path)).schema().names == ["id", "value", "label"]


def test_parquet_projection(tmp_path: Path) -> None:
    source = FileSource(str(_parquet(tmp_path / "a.parquet", 4)))
    (unit,) = source.plan()
    table = source.read(unit, ["label", "id"])
    assert sorted(table.column_names) == ["id", "label"]
    assert table.num_rows == 4


# -- csv and jsonl -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("writer", "ext", "fmt"),
    [
        pytest.param(_csv, "csv", "csv", id="csv"),
        pytest.param(_jsonl, "jsonl", "jsonl", id="jsonl"),
        pytest.param(_jsonl, "json", "jsonl", id="json-extension"),
        pytest.param(_jsonl, "ndjson", "jsonl", id="ndjson-extension"),
    ],
)
def test_text_formats_one_unit_per_file(tmp_path: Path, writer: Any, ext: str, fmt: str) -> None:
    writer(tmp_path / f"a.{ext}", 3)
    writer(tmp_path / f"b.{ext}", 2, 10)
    source = FileSource(str(tmp_path))
    units = source.plan()
    assert source.format == fmt
    assert [(u.index, u.rows, u.row_groups) for u in units] == [(0, None, None), (1, None, None)]
    assert [Path(u.id).name for u in units] == [f"a.{ext}", f"b.{ext}"]
    assert source.schema().names == ["id", "value", "label"]
    full = _read_all(source)
    assert full.column("id").to_pylist() == [0, 1, 2, 10, 11]
    assert full.column("label").to_pylist() == ["r0", "r1", "r2", "r10", "r11"]


@pytest.mark.parametrize("writer", [_csv, _jsonl], ids=["csv", "jsonl"])
def test_text_formats_projection(tmp_path: Path, writer: Any) -> None:
    path = writer(tmp_path / ("a.csv" if writer is _csv else "a.jsonl"), 3)
    source = FileSource(str(path))
    (unit,) = source.plan()
    table = source.read(unit, ["value", "id"])
    assert table.column_names == ["value", "id"]
    assert table.column("id").to_pylist() == [0, 1, 2]


def test_explicit_format_overrides_the_extension(tmp_path: Path) -> None:
    path = tmp_path / "data.txt"
    _csv(path, 2)
    source = FileSource(str(path), format="csv")
    (unit,) = source.plan()
    assert source.read(unit, ["id"]).column("id").to_pylist() == [0, 1]


# -- errors ------------------------------------------------------------------------------


def test_missing_path_is_a_data_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.parquet")
    with pytest.raises(DataError, match=re.escape(f"input path '{missing}' does not exist.")):
        FileSource(missing).plan()


def test_glob_matching_nothing_is_a_data_error(tmp_path: Path) -> None:
    _parquet(tmp_path / "a.parquet", 1)
    pattern = str(tmp_path / "*.csv")
    with pytest.raises(DataError, match=re.escape(f"the glob '{pattern}' matches no files.")):
        FileSource(pattern).files()


def test_unknown_extension_is_a_data_error(tmp_path: Path) -> None:
    path = tmp_path / "data.bin"
    path.write_bytes(b"1234")
    with pytest.raises(DataError, match=r"cannot tell the input format .* jsonl or images"):
        FileSource(str(path)).schema()


def test_mixed_formats_is_a_data_error(tmp_path: Path) -> None:
    _parquet(tmp_path / "a.parquet", 1)
    _csv(tmp_path / "b.csv", 1)
    with pytest.raises(DataError, match="cannot tell the input format"):
        FileSource(str(tmp_path)).plan()


def test_empty_directory_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no input files under"):
        FileSource(str(tmp_path)).files()


def test_no_paths_is_a_data_error() -> None:
    with pytest.raises(DataError, match="no input path given"):
        FileSource([])


def test_corrupt_parquet_is_a_data_error(tmp_path: Path) -> None:
    """Planned as a unit that failed (the job names it, or skips it); no schema from it."""
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"this is not parquet at all")
    (unit,) = FileSource(str(path)).plan()
    assert unit.error.startswith(f"cannot read the Parquet footer of {str(path)!r}")
    with pytest.raises(DataError, match="cannot read the schema"):
        FileSource(str(path)).schema()


def test_check_columns_names_missing_and_available() -> None:
    schema = pa.schema([("fare_amount", pa.float64()), ("tip", pa.float64())])
    check_columns(schema, ["tip"], "x")
    with pytest.raises(chute.ColumnNotFoundError, match=r"x: column\(s\) 'fare' not found"):
        check_columns(schema, ["fare"], "x")
    with pytest.raises(chute.ColumnNotFoundError, match="Did you mean 'fare_amount'"):
        check_columns(schema, ["fare_amont"], "carryover")


# -- in-memory data ----------------------------------------------------------------------


def test_table_source_units(monkeypatch: pytest.MonkeyPatch) -> None:
    source = TableSource(_table(10), unit_rows=4)
    units = source.plan()
    assert [(u.index, u.id, u.rows, u.offset) for u in units] == [
        (0, "memory[0:4]", 4, 0),
        (1, "memory[4:8]", 4, 4),
        (2, "memory[8:10]", 2, 8),
    ]
    assert source.read(units[2], ["id"]).column("id").to_pylist() == [8, 9]
    assert _read_all(source).equals(_table(10))


def test_table_source_refuses_empty_data() -> None:
    with pytest.raises(DataError, match="has no rows"):
        TableSource(_table(0))


def test_table_source_given_a_frame_says_how_to_pass_it() -> None:
    frame = pd.DataFrame({"a": [1, 2, 3]})
    with pytest.raises(ConfigError, match=r"got DataFrame: pass pa\.Table\.from_pandas\(frame\)"):
        TableSource(frame)  # type: ignore[arg-type]


def test_as_source_dataframe() -> None:
    frame = pd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]}, index=[10, 11, 12])
    source = as_source(frame)
    assert isinstance(source, TableSource)
    assert source.schema().names == ["a", "b"]  # the index is not a column
    assert _read_all(source).column("b").to_pylist() == ["x", "y", "z"]


def test_as_source_arrow_table_and_record_batch() -> None:
    table = _table(3)
    source = as_source(table)
    assert isinstance(source, TableSource)
    assert source.table is table
    batch_source = as_source(table.to_batches()[0])
    assert isinstance(batch_source, TableSource)
    assert _read_all(batch_source).equals(table)


def test_as_source_dict_of_numpy_with_2d() -> None:
    data = {
        "x": np.arange(3, dtype=np.int32),
        "emb": np.arange(6, dtype=np.float32).reshape(3, 2),
        "img": np.zeros((3, 2, 2), dtype=np.uint8),
    }
    table = _read_all(as_source(data))
    assert table.schema.field("x").type == pa.int32()
    assert table.schema.field("emb").type == pa.list_(pa.float32(), 2)
    assert table.column("emb").to_pylist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    assert table.schema.field("img").type == pa.list_(pa.uint8(), 4)


def test_as_source_paths(tmp_path: Path) -> None:
    path = _parquet(tmp_path / "a.parquet", 2)
    assert isinstance(as_source(str(path)), FileSource)
    assert isinstance(as_source(path), FileSource)
    many = as_source([str(path), str(path)])
    assert isinstance(many, FileSource)
    assert len(many.files()) == 1  # a file is one unit, however often it is named
    existing = TableSource(_table(1))
    assert as_source(existing) is existing


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(42, id="int"),
        pytest.param({1, 2}, id="set"),
        pytest.param([1, 2, 3], id="list-of-ints"),
        pytest.param([], id="empty-list"),
        pytest.param(np.arange(3), id="bare-array"),
    ],
)
def test_as_source_unsupported_type(data: Any) -> None:
    with pytest.raises(DataError, match=r"cannot read input of type \w+: give a path, a glob"):
        as_source(data)


def test_iter_slices() -> None:
    slices = list(iter_slices(_table(5), rows=2))
    assert [s.num_rows for s in slices] == [2, 2, 1]


def test_read_before_listing_infers_the_format(tmp_path: Path) -> None:
    path = _parquet(tmp_path / "a.parquet", 3)
    (unit,) = FileSource(str(path)).plan()
    fresh = FileSource(str(path))  # e.g. rebuilt elsewhere from the same arguments
    assert fresh.read(unit, ["id"]).column("id").to_pylist() == [0, 1, 2]


def _reader(source: FileSource, limit: int | None = None) -> tuple[Any, list[Any]]:
    from chute.plan import build_plan

    job = chute.Job(source, (chute.Model("m", lambda b: {"y": b["value"]}, inputs=["value"]),))
    plan = build_plan(job, limit=limit)
    return plan.reader, plan.pending


def test_a_local_parquet_unit_streams_in_batches_as_they_are_decoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from chute.stages import KEY, decode

    monkeypatch.setattr(chute.sources.files, "READ_BATCH_ROWS", 1_000)
    source = FileSource(str(_parquet(tmp_path / "a.parquet", 3_500, row_group_size=2_000)))
    (unit,) = source.plan()
    assert source.stream(unit, ["id"]) is not None
    reader, units = _reader(source)
    batches = list(reader(units[0]))
    assert [b.num_rows for b in batches] == [1_000, 1_000, 1_000, 500]  # not one 3,500
    keys = np.concatenate([b.column(KEY).to_numpy() for b in batches])
    index, rows, last = decode(keys)
    assert set(index.tolist()) == {0}
    assert rows.tolist() == list(range(3_500)) and last.tolist() == [False] * 3_499 + [True]
    ids = pa.concat_tables(batches).column("value").to_numpy()
    assert ids.tolist() == (np.arange(3_500) * 0.5).tolist()
    limited, pending = _reader(source, limit=1_234)  # --limit: the unit stops short
    assert sum(b.num_rows for b in limited(pending[0])) == 1_234


def test_sources_that_stream_nothing_are_read_whole(tmp_path: Path) -> None:
    class Doubled(FileSource):  # a read of its own: the contract, never bypassed
        def read(self, unit: Any, columns: Any) -> pa.Table:
            return super().read(unit, columns)

    path = _parquet(tmp_path / "a.parquet", 10)
    (unit,) = Doubled(str(path)).plan()
    assert Doubled(str(path)).stream(unit, None) is None
    csv = FileSource(str(_csv(tmp_path / "b.csv", 10)))
    assert csv.stream(csv.plan()[0], None) is None


def test_a_file_that_shrinks_during_the_run_is_a_data_error_naming_it(tmp_path: Path) -> None:
    path = _parquet(tmp_path / "a.parquet", 100)
    reader, units = _reader(FileSource(str(path)))
    _parquet(path, 60)  # rewritten between planning and reading
    with pytest.raises(DataError, match=r"a\.parquet.* bytes where it was .* when the job was"):
        list(reader(units[0]))


@pytest.mark.parametrize(("given", "hint"), [("text", ""), ("Parquet", " Did you mean 'parquet'?")])
def test_an_unknown_input_format_is_named(given: str, hint: str) -> None:
    """Anything but csv was parsed as JSON: 'JSON parse error' of a Parquet file."""
    with pytest.raises(ConfigError, match=f"input format '{given}' is not one chute reads"):
        FileSource("data/", format=given)
    with pytest.raises(ConfigError) as info:
        FileSource("data/", format=given)
    assert str(info.value).endswith(f"in a job file).{hint}")


def test_a_link_to_a_file_that_does_not_exist_is_named(tmp_path: Path) -> None:
    """Arrow's listing leaves such a link out without a word: the file it stood for was
    in neither the output nor the report, and the run was complete."""
    root = tmp_path / "in"
    (root / "day").mkdir(parents=True)
    pq.write_table(pa.table({"x": [1.0]}), root / "a.parquet")
    (root / ".hidden.parquet").symlink_to(tmp_path / "nowhere.parquet")  # not an input
    assert [Path(u.id).name for u in FileSource(str(root)).plan()] == ["a.parquet"]
    (root / "day" / "b.parquet").symlink_to(tmp_path / "gone.parquet")
    with pytest.raises(DataError, match=r"day/b\.parquet' is a symbolic link to .*gone\.parquet"):
        FileSource(str(root)).plan()
