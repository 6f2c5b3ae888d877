"""Text inputs keep their values: CSV and JSON Lines carry no types, so every file is
read with the types of the first (or those declared in ``column_types``), never inferred
again and cast; a cast between files' types never changes a value; a column a later file
adds, an empty image file, an unreadable header: each is refused by name, never lost."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import chute
from chute import DataError
from chute.config import load_job
from chute.errors import ConfigError
from chute.stages import cast_exactly

pytestmark = pytest.mark.timeout(60)


def ident(batch: pa.Table) -> dict[str, object]:
    return {"n": np.ones(batch.num_rows, dtype=np.int64)}


def _run(source: chute.FileSource, tmp_path: Path, carry: tuple[str, ...] = ("*",)) -> pa.Table:
    out = tmp_path / "out"
    chute.Job(
        source=source,
        models=(chute.Model("m", ident, inputs=("id",)),),
        carryover=carry,
        output=chute.Sink(str(out)),
        engine="local",
    ).run()
    return pq.read_table(out).sort_by("id")


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --------------------------------------------------------------------------- CSV types


def test_every_csv_file_is_read_with_the_first_files_types_so_no_value_is_rewritten(
    tmp_path: Path,
) -> None:
    """b.csv alone reads its zip codes as numbers: cast back to text they were '2139' and
    '501', its prices '1.5' for 1.50. Read with a.csv's types, they are the file's text."""
    data = tmp_path / "data"
    _write(data / "a.csv", "id,zip,price\n1,02134,1.50\n2,K1A0B1,x\n")
    _write(data / "b.csv", "id,zip,price\n3,02139,1.50\n4,00501,2.25\n")
    got = _run(chute.FileSource(str(data)), tmp_path)
    assert got.column("zip").to_pylist() == ["02134", "K1A0B1", "02139", "00501"]
    assert got.column("price").to_pylist() == ["1.50", "x", "1.50", "2.25"]


def test_a_later_file_whose_values_do_not_fit_the_first_files_types_names_column_types(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    _write(data / "a.csv", "id,zip\n1,02139\n2,00501\n")  # numbers, as Arrow reads them
    _write(data / "b.csv", "id,zip\n3,K1A0B1\n")
    with pytest.raises(
        DataError,
        match=r"'zip' is int64 in .*a\.csv but string in .*b\.csv.*column_types: \{zip: string\}",
    ):
        _run(chute.FileSource(str(data)), tmp_path)
    declared = chute.FileSource(str(data), column_types={"zip": "string"})
    got = _run(declared, tmp_path / "declared")
    assert got.column("zip").to_pylist() == ["02139", "00501", "K1A0B1"]


def test_integers_too_big_for_int64_in_a_later_file_are_told_to_be_read_as_text(
    tmp_path: Path,
) -> None:
    """The fix named was column_types: {v: double}, which rounds 9007199254740993 to
    9007199254740992.0: the values are integers, so text is the type that keeps them."""
    data = tmp_path / "data"
    _write(data / "a.csv", "id,v\n1,9007199254740993\n")
    _write(data / "b.csv", "id,v\n2,18446744073709551616\n")
    with pytest.raises(DataError, match=r"'v' is int64 .* double in .*b\.csv.*\{v: string\}"):
        _run(chute.FileSource(str(data)), tmp_path)
    got = _run(chute.FileSource(str(data), column_types={"v": "string"}), tmp_path / "text")
    assert got.column("v").to_pylist() == ["9007199254740993", "18446744073709551616"]
    _write(data / "b.csv", "id,v\n2,1.5\n")  # a fraction: double is still the fix named
    with pytest.raises(DataError, match=r"'v' is int64 .* double in .*b\.csv.*\{v: double\}"):
        _run(chute.FileSource(str(data)), tmp_path / "fraction")


def test_column_types_from_a_job_file_and_their_mistakes(tmp_path: Path) -> None:
    _write(tmp_path / "data" / "a.csv", "id,zip\n1,02139\n")
    job = tmp_path / "job.yaml"
    job.write_text(
        "input: {path: data, column_types: {zip: string}}\n"
        "models: [{name: m, fn: 'tests.test_input_types:ident', inputs: [id]}]\n"
        "carryover: [zip]\noutput: out\nengine: local\n"
    )
    report = load_job(str(job)).run()
    assert report.rows_out == 1
    assert pq.read_table(tmp_path / "out").column("zip").to_pylist() == ["02139"]
    with pytest.raises(ConfigError, match=r"'tiny' .*not an Arrow type name"):
        chute.FileSource(str(tmp_path / "data"), column_types={"zip": "tiny"})
    with pytest.raises(ConfigError, match=r"column_types names \['zipp'\].*Check the names"):
        chute.FileSource(str(tmp_path / "data"), column_types={"zipp": "string"}).schema()
    pq.write_table(pa.table({"id": [1]}), tmp_path / "p.parquet")
    with pytest.raises(ConfigError, match="column_types: an option of CSV and JSON Lines"):
        chute.sources.file_source(str(tmp_path / "p.parquet"), column_types={"id": "int8"}).schema()


def test_a_column_the_first_file_leaves_empty_takes_its_type_from_a_later_file(
    tmp_path: Path,
) -> None:
    """Arrow types an all-empty column null: a later file's text could not be read into
    it, and was refused as a column 'not in' that file."""
    data = tmp_path / "data"
    _write(data / "a.csv", "id,note\n1,\n2,\n")
    _write(data / "b.csv", "id,note\n3,hello\n4,\n")
    got = _run(chute.FileSource(str(data)), tmp_path)
    assert got.schema.field("note").type == pa.string()
    assert got.column("note").to_pylist() == ["", "", "hello", ""]


def test_json_lines_files_keep_text_that_looks_like_a_time(tmp_path: Path) -> None:
    """b.jsonl alone reads its times as timestamps: cast to text they lost their 'T'."""
    data = tmp_path / "data"
    _write(data / "a.jsonl", '{"id": 1, "t": "soon"}\n')
    _write(data / "b.jsonl", '{"id": 2, "t": "2024-01-05T10:00:00"}\n')
    got = _run(chute.FileSource(str(data)), tmp_path)
    assert got.column("t").to_pylist() == ["soon", "2024-01-05T10:00:00"]


# --------------------------------------------------------------------------- exact casts


@pytest.mark.parametrize(
    ("values", "want"),
    [
        (pa.array([1, 2], pa.int32()), pa.int64()),
        (pa.array([1.5, float("nan"), None], pa.float32()), pa.float64()),
        (pa.array(["a", None], pa.large_string()), pa.string()),
        (pa.array(["a", "b", "a"]).dictionary_encode(), pa.string()),
        (pa.array([1_000, 2_000], pa.timestamp("ms")), pa.timestamp("us")),
        (pa.nulls(3), pa.string()),
        (pa.array([b"a", None]), pa.string()),  # Parquet's binary beside string: UTF-8
        pytest.param(
            pa.array([0], pa.timestamp("s", "UTC")),
            pa.timestamp("ms", "+02:00"),
            id="another-zone-same-instant",
        ),
        pytest.param(pa.array([[1, None]], pa.list_(pa.int32())), pa.list_(pa.int64()), id="list"),
        pytest.param(pa.array([[]], pa.list_(pa.null())), pa.list_(pa.string()), id="json-[]"),
        pytest.param(pa.array([[b"a"]]), pa.large_list(pa.string()), id="list-of-utf8-bytes"),
        pytest.param(
            pa.array([{"b": 1, "a": "x"}]),
            pa.struct([("a", pa.string()), ("b", pa.int64())]),
            id="struct-fields-in-another-order",
        ),
        pytest.param(
            pa.array([{"t": 0}], pa.struct([("t", pa.timestamp("s", "UTC"))])),
            pa.struct([("t", pa.timestamp("us", "+02:00"))]),
            id="struct-instant-in-another-zone",
        ),
        pytest.param(
            pa.array([[("k", 1)]], pa.map_(pa.string(), pa.int32())),
            pa.map_(pa.large_string(), pa.int64()),
            id="map",
        ),
        pytest.param(  # an optional key no row of a later file has: null, as within a file
            pa.array([{"a": 1}]),
            pa.struct([("a", pa.int64()), ("b", pa.string())]),
            id="struct-field-missing",
        ),
    ],
)
def test_a_cast_that_keeps_every_value_is_made(values: pa.Array, want: pa.DataType) -> None:
    column = pa.chunked_array([values])
    cast = cast_exactly(column, want)
    assert cast.type == want and len(cast) == len(column)


@pytest.mark.parametrize(
    ("values", "want"),
    [
        (pa.array([2139, 501]), pa.string()),  # text is never made from numbers
        (pa.array(["0012"]), pa.int64()),  # nor numbers from text
        (pa.array([86_399], pa.timestamp("s")), pa.date32()),  # 23:59:59 is not midnight
        (pa.array([2**53 + 1]), pa.float64()),
        (pa.array([0.1]), pa.float32()),
        (pa.array([b"\xff"]), pa.string()),  # not UTF-8
        # a time without a zone is no instant, nor the other way round: 09:00 is not 09:00 UTC
        pytest.param(pa.array([0], pa.timestamp("s")), pa.timestamp("s", "UTC"), id="naive-zoned"),
        pytest.param(
            pa.array([0], pa.timestamp("s", "+02:00")), pa.timestamp("s"), id="zoned-naive"
        ),
        pytest.param(pa.array([0], pa.date32()), pa.timestamp("s", "UTC"), id="date-zoned"),
        # nested values obey the same rules as a column's
        pytest.param(pa.array([[2139]]), pa.list_(pa.string()), id="list-of-numbers-to-text"),
        pytest.param(pa.array([[b"\xff"]]), pa.list_(pa.string()), id="list-of-non-utf8"),
        pytest.param(
            pa.array([{"when": 0}], pa.struct([("when", pa.timestamp("s", "+02:00"))])),
            pa.struct([("when", pa.string())]),
            id="struct-instant-to-text",
        ),
        pytest.param(
            pa.array([{"a": [1]}]),
            pa.struct([("a", pa.list_(pa.timestamp("s")))]),
            id="struct-of-list-of-numbers-to-times",
        ),
        pytest.param(
            pa.array([[("k", 1)]], pa.map_(pa.string(), pa.int64())),
            pa.map_(pa.string(), pa.string()),
            id="map-of-numbers-to-text",
        ),
        # a field a later file adds (Arrow would drop it)
        pytest.param(
            pa.array([{"a": 1, "b": 2}]),
            pa.struct([("a", pa.int64())]),
            id="struct-field-added",
        ),
    ],
)
def test_a_cast_that_would_change_a_value_is_refused(values: pa.Array, want: pa.DataType) -> None:
    with pytest.raises(pa.ArrowInvalid):
        cast_exactly(pa.chunked_array([values]), want)


def test_parquet_files_whose_types_differ_by_kind_are_schema_drift(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"id": [1], "zip": ["02134"]}), data / "a.parquet")
    pq.write_table(pa.table({"id": [2], "zip": [2139]}), data / "b.parquet")
    with pytest.raises(DataError, match=r"schema drift: column 'zip' is string .* int64"):
        _run(chute.FileSource(str(data)), tmp_path)


def test_json_lines_files_whose_nested_values_differ_in_kind_are_schema_drift(
    tmp_path: Path,
) -> None:
    """Cast from the second file's types to the first's, its list of numbers was written as
    text (2139 as '2139'), its struct's time as text without its zone, and a struct field
    it added dropped."""
    cases = {
        "tags": ('["K1A0B1"]', "[2139, 1.50]", r"list<item: string> .* list<item: double>"),
        "s": ('{"when": "soon"}', '{"when": "2024-01-01T10:00:00+02:00"}', r"struct<when: str"),
        "p": ('{"x": 1}', '{"x": 3, "y": 2}', r"struct<x: int64> .* struct<x: int64, y: int64>"),
    }
    for name, (first, later, types) in cases.items():
        data = tmp_path / name / "data"
        _write(data / "a.jsonl", f'{{"id": 1, "{name}": {first}}}\n')
        _write(data / "b.jsonl", f'{{"id": 2, "{name}": {later}}}\n')
        drift = rf"schema drift: column '{name}' is {types}.* in .*b\.jsonl.*in Python"
        with pytest.raises(DataError, match=drift):
            _run(chute.FileSource(str(data)), tmp_path / name)


def test_json_lines_nested_values_of_one_kind_are_read_as_the_first_files(tmp_path: Path) -> None:
    """An empty list is a list of nulls, a struct's keys may come in another order."""
    data = tmp_path / "data"
    _write(data / "a.jsonl", '{"id": 1, "tags": ["x"], "s": {"a": 1, "b": "u"}}\n')
    _write(data / "b.jsonl", '{"id": 2, "tags": [], "s": {"b": "v", "a": 2}}\n')
    got = _run(chute.FileSource(str(data)), tmp_path)
    assert got.column("tags").to_pylist() == [["x"], []]
    assert got.column("s").to_pylist() == [{"a": 1, "b": "u"}, {"a": 2, "b": "v"}]


def test_json_lines_lists_that_start_with_a_null_are_read(tmp_path: Path) -> None:
    """Arrow's reader made an invalid array of ``[null, "v"]``: the file was "not UTF-8"
    (exit 3), and left out, its rows missing, under on_bad_input: skip."""
    data = tmp_path / "data"
    _write(data / "a.jsonl", '{"id": 1, "tags": ["u"], "n": [3]}\n')
    _write(data / "b.jsonl", '{"id": 2, "tags": [null, "v"], "n": [null, 10]}\n')
    got = _run(chute.FileSource(str(data)), tmp_path)
    assert got.column("tags").to_pylist() == [["u"], [None, "v"]]
    assert got.column("n").to_pylist() == [[3], [None, 10]]


@pytest.mark.parametrize(
    ("first", "later", "types"),
    [
        ("2024-01-01T00:00:00", "2024-01-01T00:00:00+02:00", r"timestamp\[s\] .* timestamp\[s, tz"),
        (
            "2024-01-01T09:00:00Z",
            "2024-01-01T09:00:00",
            r"timestamp\[s, tz=UTC\] .* timestamp\[s\]",
        ),
    ],
    ids=["naive-then-zoned", "zoned-then-naive"],
)
def test_csv_files_with_and_without_a_time_zone_are_schema_drift(
    tmp_path: Path, first: str, later: str, types: str
) -> None:
    """The zoned file was written as a naive time (00:00+02:00 as 22:00 the day before);
    a naive 09:00 after a UTC file as 09:00 UTC. Declared as text, both are kept."""
    data = tmp_path / "data"
    _write(data / "a.csv", f"id,t\n1,{first}\n")
    _write(data / "b.csv", f"id,t\n2,{later}\n")
    drift = rf"schema drift: column 't' is {types}.* in .*b\.csv.*column_types: \{{t: string\}}"
    with pytest.raises(DataError, match=drift):
        _run(chute.FileSource(str(data)), tmp_path / "o1")
    declared = chute.FileSource(str(data), column_types={"t": "string"})
    assert _run(declared, tmp_path / "o2").column("t").to_pylist() == [first, later]


def test_json_lines_time_text_keeps_its_zone_at_any_depth(tmp_path: Path) -> None:
    """Arrow's JSON reader took every ISO time for a time without a zone: 00:00+02:00 was
    written as a naive 22:00 the day before, a UTC time lost its zone. Read as a CSV reader
    reads them: with an offset, a UTC instant; without, a naive time; both, text."""
    data = tmp_path / "data"
    rows = [
        {
            "id": i,
            "zoned": f"2024-01-01T0{i}:00:00+02:00",
            "naive": f"2024-01-01T0{i}:00:00",
            "mixed": "2024-01-01T00:00:00Z" if i else "2024-01-01T00:00:00",
            "s": {"at": f"2024-01-01T0{i}:00:00Z", "zip": "02139"},
            "l": [{"at": "2024-01-01T00:00:00-05:00"}],
        }
        for i in range(2)
    ]
    _write(data / "a.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    got = _run(chute.FileSource(str(data)), tmp_path)
    assert got.column_names[:6] == ["id", "zoned", "naive", "mixed", "s", "l"]  # file order
    zoned = got.column("zoned")
    assert zoned.type.tz == "UTC"
    assert [t.isoformat() for t in zoned.to_pylist()] == [
        "2023-12-31T22:00:00+00:00",
        "2023-12-31T23:00:00+00:00",
    ]
    assert got.schema.field("naive").type.tz is None
    assert [t.isoformat() for t in got.column("naive").to_pylist()] == [
        "2024-01-01T00:00:00",
        "2024-01-01T01:00:00",
    ]
    assert got.column("mixed").to_pylist() == ["2024-01-01T00:00:00", "2024-01-01T00:00:00Z"]
    s = got.column("s").to_pylist()
    assert [r["at"].isoformat() for r in s] == ["2024-01-01T00:00:00+00:00"] * 1 + [
        "2024-01-01T01:00:00+00:00"
    ]
    assert [r["zip"] for r in s] == ["02139", "02139"]
    assert got.column("l").to_pylist()[0][0]["at"].isoformat() == "2024-01-01T05:00:00+00:00"


def test_json_lines_files_with_and_without_a_time_zone_are_schema_drift(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _write(data / "a.jsonl", '{"id": 1, "t": "2024-01-01T00:00:00"}\n')
    _write(data / "b.jsonl", '{"id": 2, "t": "2024-01-01T00:00:00+02:00"}\n')
    drift = r"schema drift: column 't' is timestamp\[s\] .* timestamp\[s, tz=UTC\].* in .*b\.jsonl"
    with pytest.raises(DataError, match=drift):
        _run(chute.FileSource(str(data)), tmp_path / "o1")
    declared = chute.FileSource(str(data), column_types={"t": "string"})
    assert _run(declared, tmp_path / "o2").column("t").to_pylist() == [
        "2024-01-01T00:00:00",
        "2024-01-01T00:00:00+02:00",
    ]


def test_parquet_files_in_two_time_zones_keep_each_instant(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    at = pa.array([1_704_067_200], pa.timestamp("s", "UTC"))  # 2024-01-01T00:00Z
    pq.write_table(pa.table({"id": [1], "t": at}), data / "a.parquet")
    pq.write_table(
        pa.table({"id": [2], "t": at.cast(pa.timestamp("s", "+02:00"))}), data / "b.parquet"
    )
    got = _run(chute.FileSource(str(data)), tmp_path)
    assert got.schema.field("t").type.tz == "UTC"
    assert [t.timestamp() for t in got.column("t").to_pylist()] == [1_704_067_200] * 2


# --------------------------------------------------------------------------- columns


def test_a_column_only_a_later_file_has_is_refused_when_every_column_is_carried(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    _write(data / "a.jsonl", '{"id": 1}\n')
    _write(data / "b.jsonl", '{"id": 2, "comment": "keep me"}\n')
    with pytest.raises(DataError, match=r"'comment' is in .*b.jsonl but not in .*a.jsonl"):
        _run(chute.FileSource(str(data)), tmp_path)
    # carrying named columns, the extra one is not asked for: no drift
    assert _run(chute.FileSource(str(data)), tmp_path / "named", ("id",)).num_rows == 2


def test_a_header_that_is_not_utf8_or_names_a_column_twice_is_a_data_error(
    tmp_path: Path,
) -> None:
    latin = tmp_path / "latin" / "a.csv"
    latin.parent.mkdir()
    latin.write_bytes("id,pr\u00e9nom\n1,Ann\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"is not UTF-8.*Save the file as UTF-8"):
        _run(chute.FileSource(str(latin)), tmp_path / "o1")
    twice = _write(tmp_path / "twice" / "a.csv", "id,x,x\n1,2,3\n")
    with pytest.raises(DataError, match="names the column\\(s\\) 'x' more than once"):
        _run(chute.FileSource(str(twice)), tmp_path / "o2")


def test_a_csv_that_names_a_column_twice_is_refused_when_only_some_columns_are_read(
    tmp_path: Path,
) -> None:
    """Arrow's ``include_columns`` took the first ``x`` and dropped the other in silence."""
    data = tmp_path / "data"
    _write(data / "a.csv", "id,x\n1,a\n")
    _write(data / "b.csv", "id,x,y,x\n2,B1,yy,B2\n")
    with pytest.raises(DataError, match=r"b\.csv' names the column\(s\) 'x' more than once"):
        _run(chute.FileSource(str(data)), tmp_path, ("id", "x"))


@pytest.mark.parametrize(
    "record",
    [
        pytest.param({"x": "caf\u00e9"}, id="top-level"),
        pytest.param({"s": {"x": "caf\u00e9"}}, id="in-a-struct"),
        pytest.param({"tags": ["ok", "caf\u00e9"]}, id="in-a-list"),
    ],
)
def test_a_json_lines_value_that_is_not_utf8_is_a_data_error(
    tmp_path: Path, record: dict[str, object]
) -> None:
    """Arrow's JSON reader keeps such bytes as they are: the Parquet written from them was
    invalid, and the run said it succeeded."""
    path = tmp_path / "data" / "a.jsonl"
    path.parent.mkdir()
    lines = [json.dumps({"id": 1}), json.dumps({"id": 2, **record}, ensure_ascii=False)]
    path.write_bytes("\n".join(lines).encode("latin-1") + b"\n")
    with pytest.raises(DataError, match=r"a\.jsonl' is not UTF-8: column '(x|s|tags)'.*UTF-8"):
        _run(chute.FileSource(str(path)), tmp_path)


def test_an_empty_file_named_by_a_glob_is_refused_by_name_or_skipped(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _write(data / "a.csv", "id\n1\n")
    _write(data / "b.csv", "")
    with pytest.raises(DataError, match=r"b\.csv' is empty \(0 bytes\)"):
        _run(chute.FileSource(str(data / "*.csv")), tmp_path / "o1")
    out = tmp_path / "o2"
    report = chute.Job(
        source=chute.FileSource(str(data / "*.csv")),
        models=(chute.Model("m", ident, inputs=("id",)),),
        output=chute.Sink(str(out)),
        engine="local",
        on_bad_input="skip",
    ).run()
    assert (report.rows_out, len(report.units_bad)) == (1, 1)


def test_limit_over_csv_files_shorter_than_the_limit_reads_them_all(tmp_path: Path) -> None:
    """Planned as the limit's rows, a 3-row file read as one that changed since planning."""
    data = tmp_path / "data"
    for i in range(3):
        _write(data / f"f{i}.csv", "id\n" + "".join(f"{i * 3 + k}\n" for k in range(3)))
    job = chute.Job(
        source=chute.FileSource(str(data)),
        models=(chute.Model("m", ident, inputs=("id",)),),
        carryover=("id",),
        engine="local",
    )
    report = job.run(limit=20)
    assert report.result is not None
    assert report.result.column("id").to_pylist() == list(range(9))
    cut = job.run(limit=4)
    assert cut.result is not None and cut.result.column("id").to_pylist() == [0, 1, 2, 3]


# --------------------------------------------------------------------------- images


def _png(path: Path, value: int) -> None:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.full((4, 4, 3), value, dtype=np.uint8)).save(buffer, format="PNG")
    path.write_bytes(buffer.getvalue())


def test_an_empty_image_in_a_folder_is_a_row_that_fails_not_one_that_vanishes(
    tmp_path: Path,
) -> None:
    pytest.importorskip("PIL")
    folder = tmp_path / "img"
    folder.mkdir()
    for i in range(3):
        _png(folder / f"img{i}.png", i)
    (folder / "img3.png").write_bytes(b"")
    job = chute.Job(
        source=chute.ImageSource(str(folder)),
        models=(chute.Model("m", ident, inputs=("path",)),),
        carryover=("path",),
        output=chute.Sink(str(tmp_path / "out")),
        engine="local",
        on_bad_input="skip",
    )
    report = job.run()
    assert (report.rows_in, report.rows_out, report.rows_failed) == (4, 3, 1)


def test_the_image_shape_comes_from_the_first_file_that_decodes(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    folder = tmp_path / "img"
    folder.mkdir()
    (folder / "a.png").write_bytes(b"not a png")
    _png(folder / "b.png", 7)
    source = chute.ImageSource(str(folder))
    assert source.tensor_shape == (4, 4, 3)


# --------------------------------------------------------------------------- OpenAI Batch


def test_an_openai_batch_file_may_start_with_a_byte_order_mark(tmp_path: Path) -> None:
    from chute.sources.openai_batch import read_requests

    line = {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": {}}
    path = tmp_path / "batch.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(line).encode() + b"\n")
    ((custom_id, url, _, number),) = read_requests(str(path))
    assert (custom_id, url, number) == ("r1", "/v1/chat/completions", 1)


def test_records_longer_than_arrows_blocks_and_quoted_line_breaks_are_read(
    tmp_path: Path,
) -> None:
    """Arrow parses in blocks of 1 MiB: a JSON line longer than one failed ("straddles two
    block boundaries"), and a CSV of over 1 MiB whose quoted fields hold line breaks was
    cut at a block boundary: 40,000 rows read, one of them in two pieces, in silence."""
    long = tmp_path / "long" / "a.jsonl"
    _write(long, json.dumps({"id": 0, "text": "x" * 1_500_000}) + "\n" + '{"id": 1, "text": "y"}\n')
    got = _run(chute.FileSource(str(long)), tmp_path / "o1")
    assert [len(t) for t in got.column("text").to_pylist()] == [1_500_000, 1]
    rows = [f'{i},"line one of {i}\nline two, with a comma"\n' for i in range(40_000)]
    quoted = _write(tmp_path / "quoted" / "a.csv", "id,text\n" + "".join(rows))
    assert quoted.stat().st_size > 1 << 20
    got = _run(chute.FileSource(str(quoted)), tmp_path / "o2")
    assert got.column("id").to_pylist() == list(range(40_000))
    assert got.column("text")[39_999].as_py() == "line one of 39999\nline two, with a comma"


@pytest.mark.parametrize(("name", "codec"), [("a.csv.gz", "gzip"), ("a.jsonl.zst", "zstd")])
def test_compressed_text_files_are_read_through_their_codec(
    tmp_path: Path, name: str, codec: str
) -> None:
    """A .csv.gz was "of no known format"; told it was CSV, its bytes were parsed as text."""
    text = (
        "id,zip\n1,02139\n2,00501\n"
        if name.startswith("a.csv")
        else '{"id": 1, "zip": "02139"}\n{"id": 2, "zip": "00501"}\n'
    )
    path = tmp_path / "data" / name
    path.parent.mkdir()
    with pa.CompressedOutputStream(str(path), codec) as out:
        out.write(text.encode())
    source = chute.FileSource(str(path.parent), column_types={"zip": "string"})
    got = _run(source, tmp_path)
    assert got.column("zip").to_pylist() == ["02139", "00501"]
    pq.write_table(pa.table({"id": [1]}), tmp_path / "p.parquet")
    with pa.CompressedOutputStream(str(tmp_path / "p.parquet.gz"), "gzip") as out:
        out.write((tmp_path / "p.parquet").read_bytes())
    with pytest.raises(DataError, match=r"compressed Parquet file.*Decompress it"):
        chute.FileSource(str(tmp_path / "p.parquet.gz")).schema()


def _two_files(tmp_path: Path, ext: str, a: dict[str, object], b: dict[str, object]) -> Path:
    """data/a.EXT and data/b.EXT of one row each (CSV: a header, then the values)."""
    data = tmp_path / "data"
    for name, row in (("a", a), ("b", b)):
        if ext == "csv":
            text = ",".join(row) + "\n" + ",".join(str(v) for v in row.values()) + "\n"
        else:
            text = json.dumps(row) + "\n"
        _write(data / f"{name}.{ext}", text)
    return data


@pytest.mark.parametrize("ext", ["csv", "jsonl"])
def test_a_column_a_later_file_lacks_is_drift_not_nulls(tmp_path: Path, ext: str) -> None:
    """Read with the planned types, a file that lacks a column had it filled with nulls:
    b's rows were written with no x, and the run succeeded."""
    data = _two_files(tmp_path, ext, {"id": 1, "x": "a"}, {"id": 2, "x_renamed": "b"})
    with pytest.raises(DataError, match=rf"column 'x' is in .*a\.{ext} but not in .*b\.{ext}"):
        _run(chute.FileSource(str(data)), tmp_path, ("id", "x"))


@pytest.mark.parametrize("ext", ["csv", "jsonl"])
def test_a_big_integer_is_never_rounded_into_the_first_files_float_column(
    tmp_path: Path, ext: str
) -> None:
    data = _two_files(tmp_path, ext, {"id": 1, "c": 1.5}, {"id": 2, "c": 12345678901234567})
    with pytest.raises(DataError, match=r"'c' is double .* but int64 .*without changing values"):
        _run(chute.FileSource(str(data)), tmp_path)


def test_an_output_inside_a_folder_of_images_is_fine(tmp_path: Path) -> None:
    """Its part files are not images: never read back; the images in it are never the
    output's to delete."""
    pytest.importorskip("PIL")
    folder = tmp_path / "img"
    folder.mkdir()
    for i in range(2):
        _png(folder / f"img{i}.png", i)
    job = chute.Job(
        source=chute.ImageSource(str(folder)),
        models=(chute.Model("m", ident, inputs=("path",)),),
        carryover=("path",),
        output=chute.Sink(str(folder / "preds")),
        engine="local",
    )
    assert job.run().rows_out == 2
    assert job.run().units_done == 0  # a resume: nothing new


def test_a_later_json_lines_file_without_an_optional_nested_key_has_it_null(
    tmp_path: Path,
) -> None:
    """Refused as drift for a while: a job file cannot declare a nested type, so JSON whose
    optional key no row of one file has could not be read at all."""
    data = tmp_path / "data"
    _write(data / "a.jsonl", '{"id": 1, "meta": {"a": 1, "b": "x"}}\n')
    _write(data / "b.jsonl", '{"id": 2, "meta": {"a": 2}}\n')
    got = _run(chute.FileSource(str(data)), tmp_path).sort_by("id")
    assert got.column("meta").to_pylist() == [{"a": 1, "b": "x"}, {"a": 2, "b": None}]
