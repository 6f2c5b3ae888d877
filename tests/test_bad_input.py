"""Bad input units (corrupt, drifted) and transient read errors, on both engines."""

from __future__ import annotations

import errno
import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import chute
from chute.retry import retrying, transient


def _write(path: Path, ids: range, x: Any) -> None:
    pq.write_table(pa.table({"id": np.asarray(ids), "x": x}), path)


@pytest.fixture
def messy(tmp_path: Path) -> Path:
    """Six files: three good, one corrupt, one without column x, one with x as strings."""
    root = tmp_path / "in"
    root.mkdir()
    for i in range(3):
        _write(root / f"f{i}.parquet", range(i * 100, i * 100 + 100), np.arange(100.0))
    _write(root / "f3.parquet", range(300, 400), np.arange(100.0))
    with open(root / "f3.parquet", "r+b") as f:
        f.seek(30)
        f.write(b"garbage!" * 20)
    pq.write_table(
        pa.table({"id": np.arange(400, 500), "y": np.arange(100.0)}), root / "f4.parquet"
    )
    _write(root / "f5.parquet", range(500, 600), pa.array(["a"] * 100))
    return root


def _job(source: chute.FileSource, out: Path, engine: str, policy: str = "fail") -> chute.Job:
    model = chute.Model("m", lambda b: np.asarray(b["x"]) * 2, inputs=("x",))
    return chute.Job(
        source=source,
        models=(model,),
        carryover=("id",),
        output=chute.Sink(str(out)),
        engine=engine,
        on_bad_input=policy,  # type: ignore[arg-type]
    )


@pytest.mark.timeout(180)
def test_skip_leaves_bad_units_out_and_lists_them(messy: Path, tmp_path: Path, engine: str) -> None:
    report = _job(chute.FileSource(str(messy)), tmp_path / "out", engine, "skip").run()
    out = pd.read_parquet(tmp_path / "out")
    assert sorted(out.id) == list(range(300))
    assert (out.m == out.id % 100 * 2.0).all()
    bad = {b["unit"].rsplit("/", 1)[1]: b["error"] for b in report.units_bad}
    assert sorted(bad) == ["f3.parquet", "f4.parquet", "f5.parquet"]
    assert "cannot read input file" in bad["f3.parquet"]
    assert "column 'x' is in" in bad["f4.parquet"] and "f0.parquet" in bad["f4.parquet"]
    assert "double in" in bad["f5.parquet"] and "but string in" in bad["f5.parquet"]
    assert (report.rows_in, report.units_done) == (300, 6)
    resumed = _job(chute.FileSource(str(messy)), tmp_path / "out", engine, "skip").run()
    assert resumed.units_done == 0 and resumed.units_skipped == 6


@pytest.mark.timeout(120)
def test_a_resumed_run_reports_the_inputs_an_earlier_run_left_out(
    messy: Path, tmp_path: Path
) -> None:
    """The resumed run's report named no skipped input, and counted the unreadable files'
    planned rows as "already done": 10,000 rows said for 9,500 written."""
    import json

    out = tmp_path / "out"
    _job(chute.FileSource(str(messy)), out, "local", "skip").run()
    ledger = out / "_chute" / "ledger.jsonl"
    lines = ledger.read_text().splitlines()
    good = next(i for i, line in enumerate(lines) if "skipped" not in json.loads(line))
    ledger.write_text("\n".join(lines[:good] + lines[good + 1 :]) + "\n")  # one to redo
    resumed = _job(chute.FileSource(str(messy)), out, "local", "skip").run()
    assert resumed.units_done >= 1  # (the units sharing its file with it too)
    assert resumed.rows_in + resumed.rows_skipped == 300  # the bad files hold no rows
    bad = sorted(b["unit"].rsplit("/", 1)[1] for b in resumed.units_bad)
    assert bad == ["f3.parquet", "f4.parquet", "f5.parquet"]


@pytest.mark.parametrize(
    ("keep", "message"),
    [
        pytest.param("f3", "cannot read input file", id="corrupt"),
        pytest.param("f4", "schema drift: column 'x' is in", id="missing-column"),
        pytest.param("f5", "schema drift: column 'x' is double in", id="retyped-column"),
    ],
)
@pytest.mark.timeout(180)
def test_fail_names_the_bad_file(
    messy: Path, tmp_path: Path, engine: str, keep: str, message: str
) -> None:
    for name in ("f3", "f4", "f5"):
        if name != keep:
            (messy / f"{name}.parquet").unlink()
    with pytest.raises(chute.DataError) as info:
        _job(chute.FileSource(str(messy)), tmp_path / "out", engine).run()
    assert message in str(info.value)
    assert f"{keep}.parquet" in str(info.value)
    if keep != "f3":
        assert "f0.parquet" in str(info.value)  # drift names both files
    assert not (tmp_path / "out" / "_SUCCESS").exists()


class FlakySource(chute.FileSource):
    """Each file fails to open twice with a transient I/O error, then opens (across processes:
    the count is kept in a file next to the data)."""

    def _open(self, path: str) -> Any:
        tally = Path(path + ".opens")
        count = int(tally.read_text()) if tally.exists() else 0
        tally.write_text(str(count + 1))
        if count < 2:
            raise OSError(errno.EIO, f"simulated flaky read of {path}")
        return super()._open(path)


@pytest.mark.timeout(180)
def test_transient_read_errors_are_retried(tmp_path: Path, engine: str) -> None:
    root = tmp_path / "in"
    root.mkdir()
    for i in range(3):
        _write(root / f"f{i}.parquet", range(i * 10, i * 10 + 10), np.arange(10.0))
    report = _job(FlakySource(str(root)), tmp_path / "out", engine).run()
    assert sorted(pd.read_parquet(tmp_path / "out").id) == list(range(30))
    assert report.rows_out == 30
    opens = sorted(int(t.read_text()) for t in root.glob("*.opens"))
    assert len(opens) == 3 and min(opens) > 2  # two failures each, then success


class OutageSource(chute.FileSource):
    """f1.parquet cannot be read while ``outage`` exists beside the data: the storage
    answers 503 (a SlowDown), whatever the retries."""

    def _open(self, path: str) -> Any:
        if path.endswith("f1.parquet") and (Path(path).parent / "outage").exists():
            raise OSError(f"AWS Error SLOW_DOWN during GetObject operation: 503 ({path})")
        return super()._open(path)


@pytest.mark.timeout(180)
def test_a_storage_outage_is_never_a_bad_file_to_skip(tmp_path: Path, engine: str) -> None:
    """Under on_bad_input: skip, a 503 after retries committed the file as skipped: its
    rows were lost for good, and the run succeeded (the next said nothing to do)."""
    root = tmp_path / "in"
    root.mkdir()
    for i in range(3):
        _write(root / f"f{i}.parquet", range(i * 10, i * 10 + 10), np.arange(10.0))
    (root / "outage").write_text("")
    source = OutageSource(str(root / "*.parquet"))
    with pytest.raises(chute.ChuteError, match="the file is not at fault") as info:
        _job(source, tmp_path / "out", engine, "skip").run()
    assert not isinstance(info.value, chute.DataError) and info.value.exit_code == 1
    assert not (tmp_path / "out" / "_SUCCESS").exists()
    (root / "outage").unlink()
    report = _job(OutageSource(str(root / "*.parquet")), tmp_path / "out", engine, "skip").run()
    assert report.complete and not report.units_bad
    assert sorted(pd.read_parquet(tmp_path / "out").id) == list(range(30))


def test_retrying_backs_off_then_gives_up() -> None:
    waits: list[float] = []
    calls = []

    def flaky() -> int:
        calls.append(1)
        raise ConnectionResetError("reset by peer")

    with pytest.raises(ConnectionResetError):
        retrying(flaky, "x", attempts=4, base_delay=0.1, sleep=waits.append)
    assert len(calls) == 4 and waits == [0.1, 0.2, 0.4]


def test_permanent_errors_are_not_retried() -> None:
    calls = []

    def missing() -> None:
        calls.append(1)
        raise FileNotFoundError("gone")

    with pytest.raises(FileNotFoundError):
        retrying(missing, "x", sleep=lambda _: None)
    assert len(calls) == 1


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        pytest.param(ConnectionResetError(), True, id="connection-reset"),
        pytest.param(TimeoutError(), True, id="timeout"),
        pytest.param(OSError(errno.EIO, "i/o"), True, id="eio"),
        pytest.param(OSError("AWS Error SLOW_DOWN during GetObject"), True, id="s3-throttle"),
        pytest.param(OSError("HTTP 503 Service Unavailable"), True, id="http-503"),
        pytest.param(OSError("Corrupt snappy compressed data."), False, id="corrupt-data"),
        pytest.param(FileNotFoundError("x"), False, id="missing-file"),
        pytest.param(PermissionError("x"), False, id="access-denied"),
        pytest.param(ValueError("x"), False, id="not-io"),
    ],
)
def test_transient_classification(exc: BaseException, expected: bool) -> None:
    assert transient(exc) is expected


def _empty_parquet(path: Path, row_groups: int) -> None:
    """A Parquet file with no rows: ``row_groups`` empty row groups (0: none at all)."""
    schema = pa.schema([("id", pa.int64()), ("x", pa.float64())])
    with pq.ParquetWriter(path, schema) as writer:
        for _ in range(row_groups):
            writer.write_table(schema.empty_table())


def _good_files(root: Path, suffix: str) -> None:
    """Three files of 100 rows (ids 0..299), as Parquet or CSV."""
    root.mkdir()
    for i in range(3):
        table = pa.table({"id": np.arange(i * 100, i * 100 + 100), "x": np.arange(100.0)})
        if suffix == ".csv":
            table.to_pandas().to_csv(root / f"f{i}.csv", index=False)
        else:
            pq.write_table(table, root / f"f{i}.parquet")


def _ledger_rows(out: Path) -> dict[str, int]:
    lines = (out / "_chute" / "ledger.jsonl").read_text().splitlines()
    return {json.loads(line)["unit"].rsplit("/", 1)[1]: json.loads(line)["rows"] for line in lines}


@pytest.mark.parametrize(
    ("name", "make"),
    [
        pytest.param("f1a.parquet", lambda p: _empty_parquet(p, 1), id="parquet-empty"),
        pytest.param("f1a.parquet", lambda p: _empty_parquet(p, 3), id="parquet-empty-groups"),
        pytest.param("f1a.parquet", lambda p: _empty_parquet(p, 0), id="parquet-no-groups"),
        pytest.param("f1a.csv", lambda p: p.write_text("id,x\n"), id="csv-header-only"),
        pytest.param("e.csv", lambda p: p.write_text("id,x\n"), id="csv-header-only-first"),
    ],
)
@pytest.mark.timeout(180)
def test_zero_row_files_are_done_units(
    tmp_path: Path, engine: str, name: str, make: Callable[[Path], None]
) -> None:
    root, out = tmp_path / "in", tmp_path / "out"
    _good_files(root, Path(name).suffix)
    make(root / name)
    report = _job(chute.FileSource(str(root)), out, engine).run()
    assert (report.units_done, report.rows_in, report.units_bad) == (4, 300, [])
    assert sorted(pd.read_parquet(out).id) == list(range(300))
    assert _ledger_rows(out)[name] == 0 and (out / "_SUCCESS").exists()
    resumed = _job(chute.FileSource(str(root)), out, engine).run()
    assert (resumed.units_done, resumed.units_skipped) == (0, 4)


def _truncated(path: Path) -> None:
    _write(path, range(900, 1000), np.arange(100.0))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # no footer


def _bad_magic(path: Path) -> None:
    _write(path, range(900, 1000), np.arange(100.0))
    data = path.read_bytes()
    path.write_bytes(data[:-4] + b"XXXX")


def _a_name_twice(path: Path) -> None:
    ids, x = pa.array(np.arange(900, 1000)), pa.array(np.arange(100.0))
    pq.write_table(pa.Table.from_arrays([ids, x, x], names=["id", "x", "x"]), path)


UNREADABLE = [
    pytest.param("f1a.parquet", _truncated, id="truncated"),
    pytest.param("a.parquet", _truncated, id="truncated-first"),
    pytest.param("f1a.parquet", _bad_magic, id="bad-magic"),
    pytest.param("f1a.parquet", lambda p: p.write_bytes(b"\x00garbage" * 64), id="garbage"),
    pytest.param("f1a.parquet", _a_name_twice, id="parquet-a-name-twice"),
    pytest.param("a.parquet", _a_name_twice, id="parquet-a-name-twice-first"),
    pytest.param("f1a.csv", lambda p: p.write_text('id,x\n1,2\n3,"4\n5\n'), id="csv-unparsable"),
    pytest.param("f1a.csv", lambda p: p.write_text("id,x\n1,2,3,4\n"), id="csv-ragged"),
]


@pytest.mark.parametrize(("name", "make"), UNREADABLE)
@pytest.mark.timeout(180)
def test_skip_leaves_every_unreadable_file_out(
    tmp_path: Path, engine: str, name: str, make: Callable[[Path], None]
) -> None:
    root, out = tmp_path / "in", tmp_path / "out"
    _good_files(root, Path(name).suffix)
    make(root / name)
    report = _job(chute.FileSource(str(root)), out, engine, "skip").run()
    assert sorted(pd.read_parquet(out).id) == list(range(300))
    assert [b["unit"].rsplit("/", 1)[1] for b in report.units_bad] == [name]
    assert name in report.units_bad[0]["error"]
    assert (report.units_done, report.rows_in) == (4, 300)
    saved = json.loads((out / "_chute" / "report.json").read_text())
    assert [b["unit"] for b in saved["units_bad"]] == [b["unit"] for b in report.units_bad]
    resumed = _job(chute.FileSource(str(root)), out, engine, "skip").run()
    assert (resumed.units_done, resumed.units_skipped) == (0, 4)


@pytest.mark.parametrize(("name", "make"), UNREADABLE)
@pytest.mark.timeout(180)
def test_fail_names_the_unreadable_file(
    tmp_path: Path, engine: str, name: str, make: Callable[[Path], None]
) -> None:
    root, out = tmp_path / "in", tmp_path / "out"
    _good_files(root, Path(name).suffix)
    make(root / name)
    with pytest.raises(chute.DataError) as info:
        _job(chute.FileSource(str(root)), out, engine).run()
    assert str(root / name) in str(info.value)
    assert not (out / "_SUCCESS").exists()


def _named_csv(path: Path, ids: range, stray: int | None = None) -> None:
    """``id,name`` rows (name is text); row ``stray`` opens a quote it never closes."""
    rows = [f'{i},"n{i}' if i == stray else f"{i},n{i}" for i in ids]
    text = "id,name\n" + "\n".join(rows) + "\n"
    opener: Any = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt") as f:
        f.write(text)


@pytest.mark.parametrize("suffix", [".csv", ".csv.gz"])
@pytest.mark.timeout(180)
def test_a_csv_quote_left_open_is_a_bad_file_not_lost_rows(
    tmp_path: Path, engine: str, suffix: str
) -> None:
    """Arrow reads a quote open at the end of the file as one value holding every line
    after it: 51 of 100 rows, and no error."""
    root = tmp_path / "in"
    root.mkdir()
    for i in range(2):
        _named_csv(root / f"f{i}{suffix}", range(i * 100, i * 100 + 100))
    _named_csv(root / f"f2{suffix}", range(200, 300), stray=250)

    def job(out: str, policy: str) -> chute.Job:
        model = chute.Model("m", lambda b: np.ones(b.num_rows), inputs=("name",))
        return chute.Job(
            source=chute.FileSource(str(root)),
            models=(model,),
            carryover=("id",),
            output=chute.Sink(str(tmp_path / out)),
            engine=engine,
            on_bad_input=policy,  # type: ignore[arg-type]
        )

    with pytest.raises(chute.DataError, match=r"f2\.csv.*quote that is never closed.*line 52"):
        job("o1", "fail").run()
    report = job("o2", "skip").run()
    assert sorted(pd.read_parquet(tmp_path / "o2").id) == list(range(200))
    assert [b["unit"].rsplit("/", 1)[1] for b in report.units_bad] == [f"f2{suffix}"]


def test_a_quote_inside_a_csv_value_that_does_not_open_it_is_text(tmp_path: Path) -> None:
    """An odd number of quotes, none left open: Arrow reads ``5'11"`` as text."""
    path = tmp_path / "a.csv"
    path.write_text('id,height,note\n1,5\'11","a ""b"", c"\n2,6\'0",x"y\n')
    source = chute.FileSource(str(path))
    table = pa.concat_tables(source.read(u, None) for u in source.plan())
    assert table.column("height").to_pylist() == ["5'11\"", "6'0\""]
    assert table.column("note").to_pylist() == ['a "b", c', 'x"y']


def _read_csv(path: Path, text: bytes, columns: list[str] | None = None) -> pa.Table:
    path.write_bytes(text)
    source = chute.FileSource(str(path))
    return pa.concat_tables(source.read(u, columns) for u in source.plan())


@pytest.mark.parametrize(
    ("text", "line", "why"),
    [
        # the second stray quote closes the field the first opened: rows 3 and 4 in it
        (b'id,desc\n1,a\n2,"Hello\n3,c\n4,"Bye\n5,e\n6,f\n', 3, "middle of a later value"),
        (b'id,desc,z\n1,a,z\n2,"Hello,z\n3,c,z\n4,"Bye,z\n5,e,z\n', 3, "middle of a later"),
        (b'id,desc,z\n1,a,z\n2,"b,z\n3,c"x,z\n4,d,z\n', 3, "middle of a later value"),
        # closed at the end of a value: the line after the break reads as a record
        (b'id,desc\n1,a\n2,"Hello\n3,c\n4,5 inch"\n5,e\n', 3, "reads as a record"),
        # open to the end, beside a quote that is text: the count of quotes is even
        (b'id,desc\n1,5" screen\n2,"open\n3,c\n4,d\n', 3, "never closed"),
        (b'id,desc,z\n1,5"x,z\n2,a,"open\n3,c,z\n4,d,z\n', 3, "never closed"),
        (b'\xef\xbb\xbfid,desc\r\n1,a\r\n2,"Hello\r\n3,c\r\n4,"Bye\r\n', 3, "later value"),
    ],
    ids=[
        "two-open",
        "two-open-middle",
        "closed-by-stray",
        "record",
        "beside-text",
        "beside-text-middle",
        "crlf-bom",
    ],
)
@pytest.mark.parametrize("columns", [None, ["id"]])
def test_quotes_left_open_in_pairs_are_refused_not_rows_merged(
    tmp_path: Path, text: bytes, line: int, why: str, columns: list[str] | None
) -> None:
    """Only an odd count of quotes was looked at: a second stray quote closed the field
    the first opened, and the rows between were read as one value, in silence (4 rows of
    6, exit 0), under on_bad_input fail and skip alike."""
    with pytest.raises(chute.DataError, match=r"a\.csv' has a quote") as info:
        _read_csv(tmp_path / "a.csv", text, columns)
    assert f"on line {line} " in str(info.value)
    assert why in str(info.value)


def test_a_pair_of_open_quotes_leaves_its_file_out_under_skip(tmp_path: Path) -> None:
    root = tmp_path / "in"
    root.mkdir()
    (root / "a.csv").write_text("id,desc\n1,a\n2,b\n")
    (root / "b.csv").write_text('id,desc\n3,"c\n4,d\n5,"e\n6,f\n')
    model = chute.Model("m", lambda b: np.ones(b.num_rows), inputs=("desc",))
    job = chute.Job(
        source=chute.FileSource(str(root)),
        models=(model,),
        carryover=("id",),
        output=chute.Sink(str(tmp_path / "out")),
        engine="local",
        on_bad_input="skip",
    )
    report = job.run()
    assert sorted(pd.read_parquet(tmp_path / "out").id) == [1, 2]
    assert [b["unit"].rsplit("/", 1)[1] for b in report.units_bad] == ["b.csv"]


@pytest.mark.parametrize(
    ("text", "values"),
    [
        (b'id,addr\n1,"12 Main St\nSpringfield, IL"\n2,x\n', ["12 Main St\nSpringfield, IL", "x"]),
        (b'k,text\nk1,"Hi,\nthanks, bye"\nk2,x\n', ["Hi,\nthanks, bye", "x"]),
        (b'id,text\r\n1,"p1\r\n\r\np2, ""q""\r\n"\r\n\r\n2,z\r\n', ['p1\r\n\r\np2, "q"\r\n', "z"]),
        (b'id,text,n\n1,"a\n2,b",3\n2,"x\n",4\n', ["a\n2,b", "x\n"]),
    ],
    ids=["address", "text-only", "crlf-paragraphs", "middle-column"],
)
def test_quoted_values_holding_line_breaks_are_read(
    tmp_path: Path, text: bytes, values: list[str]
) -> None:
    """A line after the break with the header's number of fields is no evidence alone:
    its values must also convert to a column that is not text (``2,b`` has 2 fields of
    3 in the last case)."""
    table = _read_csv(tmp_path / "a.csv", text)
    assert table.column(1).to_pylist() == values


@pytest.mark.parametrize("columns", [None, ["id"]])
def test_an_odd_quote_count_alone_does_not_read_the_file_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, columns: list[str] | None
) -> None:
    """One inch mark in a file made every read scan the whole file in Python, from memory
    (9 times slower on a million rows): the rest of a file taken by an open quote can only
    be in the last row's last value, so only a line break there is worth a look."""
    from chute.sources import files

    def never(*args: object) -> None:
        raise AssertionError("the file was scanned for an open quote")

    monkeypatch.setattr(files, "_quote_trouble", never)
    path = tmp_path / "a.csv"
    rows = "".join(f'{i},"{i}",x\n' for i in range(1_000))
    path.write_text(f"id,quoted,note\n0,5'11\",x\n{rows}")
    source = chute.FileSource(str(path))
    table = pa.concat_tables(source.read(u, columns) for u in source.plan())
    assert table.num_rows == 1_001


@pytest.mark.parametrize(
    ("name", "good", "bad", "said"),
    [
        ("b.csv", b"id,d\n1,a\n", b"id,d\n3,c\n4,d,e\n", "Expected 2 columns, got 3: 4,d,e"),
        ("b.csv", b"id,d\n1,a\n", b"id,d\n3,c\n \n5,f\n", "Expected 2 columns, got 1"),
        ("b.csv", b"id,d\n1,a\n", b"id,d\n2,caf\xe9\n", "is not UTF-8"),
        ("b.jsonl", b'{"id":1,"v":"a"}\n', b'{"id":2,"v":"b"}\n{"id":3,"v":"c', "closing quot"),
        ("b.jsonl", b'{"id":1,"v":"a"}\n', b'{"id":2,"v":"b"}\n[3]\n', "changed from object"),
    ],
    ids=["ragged", "whitespace-line", "not-utf8", "json-cut-short", "json-array"],
)
def test_a_later_file_that_does_not_parse_is_not_blamed_on_column_types(
    tmp_path: Path, name: str, good: bytes, bad: bytes, said: str
) -> None:
    """Any Arrow error in a file after the first was reported as a column-type problem
    ("cannot read ... with the column types of a.csv ... Declare the column's type")."""
    (tmp_path / f"a{Path(name).suffix}").write_bytes(good)
    (tmp_path / name).write_bytes(bad)
    source = chute.FileSource(str(tmp_path))
    source.schema()  # planned from a: its text columns are read as text in b
    units = source.plan()
    with pytest.raises(chute.DataError) as info:
        source.read(units[1], None)
    assert name in str(info.value)
    assert said in str(info.value)
    assert "column types" not in str(info.value)
    assert "column_types" not in str(info.value)


def test_a_later_file_whose_values_do_not_fit_is_still_a_type_problem(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_bytes(b"id,v\n1,K1A\n")
    (tmp_path / "b.csv").write_bytes(b"id,v\nx,02139\n")
    source = chute.FileSource(str(tmp_path), column_types={"id": "int64"})
    source.schema()
    units = source.plan()
    with pytest.raises(chute.DataError, match=r"b\.csv.*column types of .*a\.csv.*column_types"):
        source.read(units[1], None)


BIG_IDS = [18446744073709551615, 18446744073709551614, 12345678901234567890]
"""Whole numbers too large for int64, two of them one apart: as float64, one value."""


def _big_ids(path: Path, ids: list[int]) -> None:
    if path.suffix == ".csv":
        path.write_text("id,x\n" + "".join(f"{i},{n}\n" for n, i in enumerate(ids)))
    else:
        path.write_text("".join(f'{{"id": {i}, "x": {n}}}\n' for n, i in enumerate(ids)))


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
@pytest.mark.timeout(180)
def test_whole_numbers_too_large_for_int64_are_refused_not_rounded(
    tmp_path: Path, engine: str, suffix: str
) -> None:
    """Arrow reads a column of them as float64: the job finished complete with the ids
    18446744073709551615 and ...614 written as one value, 18446744073709551616."""
    path = tmp_path / f"a{suffix}"
    _big_ids(path, BIG_IDS)

    def job(out: str, **options: Any) -> chute.Job:
        model = chute.Model("m", lambda b: np.asarray(b["x"]) * 2, inputs=("x",))
        return chute.Job(
            source=chute.FileSource(str(path), **options),
            models=(model,),
            carryover=("id",),
            output=chute.Sink(str(tmp_path / out)),
            engine=engine,
        )

    with pytest.raises(chute.DataError) as info:
        job("o1").run()
    said = str(info.value)
    assert f"a{suffix}" in said and "column 'id'" in said and "too large for int64" in said
    assert "18446744073709551615 would be written as 18446744073709551616" in said
    assert "column_types: {id: uint64}" in said
    assert not (tmp_path / "o1" / "_SUCCESS").exists()
    # the fix the message names reads every digit
    job("o2", column_types={"id": "uint64"}).run()
    assert pq.read_table(tmp_path / "o2").column("id").to_pylist() == BIG_IDS


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_negative_whole_numbers_beyond_int64_name_text_as_the_fix(
    tmp_path: Path, suffix: str
) -> None:
    path = tmp_path / f"a{suffix}"
    _big_ids(path, [-18446744073709551615, 1])
    with pytest.raises(chute.DataError, match="too large for int64") as info:
        chute.FileSource(str(path)).schema()  # at planning: before anything is written
    fix = "column_types: {id: string}" if suffix == ".csv" else "as JSON strings"
    assert fix in str(info.value)
    if suffix == ".csv":
        source = chute.FileSource(str(path), column_types={"id": "string"})
        table = pa.concat_tables(source.read(u, None) for u in source.plan())
        assert table.column("id").to_pylist() == ["-18446744073709551615", "1"]


@pytest.mark.parametrize(
    "values",
    [
        ["1e20", "2.5"],  # floats, one of them whole
        ["100000000000000000000.0", "3.0"],  # written with a point: the file says float
        ["9007199254740993.5", "1"],  # not whole
        ["18446744073709551616", "1"],  # 2**64: beyond int64, and exact as float64
    ],
)
def test_large_floats_and_exact_whole_numbers_are_read_as_floats(
    tmp_path: Path, values: list[str]
) -> None:
    path = tmp_path / "a.csv"
    path.write_text("id,v\n" + "".join(f"{i},{v}\n" for i, v in enumerate(values)))
    source = chute.FileSource(str(path))
    table = pa.concat_tables(source.read(u, None) for u in source.plan())
    assert table.column("v").type == pa.float64()
    assert table.column("v").to_pylist() == [float(v) for v in values]


@pytest.mark.timeout(180)
def test_a_csv_column_that_is_not_utf8_in_the_first_file_is_refused_not_bytes(
    tmp_path: Path, engine: str
) -> None:
    """Arrow infers such a column as binary: every file's values of it, the UTF-8 ones
    too, were written as bytes, and the run finished complete."""
    root = tmp_path / "in"
    root.mkdir()
    (root / "a.csv").write_bytes(b"id,name,x\n1,tea,1\n2,caf\xe9,2\n")
    (root / "b.csv").write_bytes(b"id,name,x\n3,caf\xc3\xa9,3\n")

    def job(out: str, policy: str = "fail", **options: Any) -> chute.Job:
        model = chute.Model("m", lambda b: np.asarray(b["x"]) * 2, inputs=("x",))
        return chute.Job(
            source=chute.FileSource(str(root), **options),
            models=(model,),
            carryover=("id", "name"),
            output=chute.Sink(str(tmp_path / out)),
            engine=engine,
            on_bad_input=policy,  # type: ignore[arg-type]
        )

    with pytest.raises(chute.DataError) as info:
        job("o1").run()
    said = str(info.value)
    assert "a.csv' is not UTF-8: column 'name'" in said and "row 2: b'caf\\xe9'" in said
    assert "column_types: {name: binary}" in said
    skipped = job("o2", "skip").run()
    assert pq.read_table(tmp_path / "o2").to_pydict() == {"id": [3], "name": ["café"], "m": [6]}
    assert [b["unit"].rsplit("/", 1)[1] for b in skipped.units_bad] == ["a.csv"]
    job("o3", column_types={"name": "binary"}).run()  # the bytes, as the message offers
    kept = pq.read_table(tmp_path / "o3").sort_by("id")
    assert kept.column("name").to_pylist() == [b"tea", b"caf\xe9", "café".encode()]
