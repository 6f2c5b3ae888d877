"""Right-sized output files (issue 14, point 4): which rows share a file, when a held
unit is written, what a resume trusts of a shared file, and the option's bad values.
Engines run the same through ``tests/conformance`` and ``tests/test_chaos.py``."""

from __future__ import annotations

import dataclasses
import itertools
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import chute
from chute.coalesce import Coalescer
from chute.config import load_job
from chute.ledger import Ledger
from chute.runner.committer import _files
from chute.sinks import Output, PartWriter, datafile, in_key_order
from chute.sinks.records import runs
from chute.stages import KEY, tag
from chute.stages.rows import ROW_BITS, ROW_MASK


def piece(unit: int, start: int, rows: int, total: int) -> pa.Table:
    """Rows ``start..start+rows`` of a unit of ``total`` rows, with the model's output."""
    ids = pa.array(range(unit * 1000 + start, unit * 1000 + start + rows), pa.int64())
    return tag(pa.table({"id": ids, "m": ids}), unit, start, total)


def writer(out: Path, **target: int) -> PartWriter:
    return PartWriter(Output(chute.Sink(str(out), **target), ("id",), ("m",)))  # type: ignore[arg-type]


def on_disk(out: Path) -> dict[str, list[int]]:
    return {p.name: pq.read_table(p)["id"].to_pylist() for p in sorted(out.glob("part-*"))}


def test_whole_units_share_a_file_and_a_large_unit_spans_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    batch = pa.concat_tables(
        [piece(2, 0, 10, 10), piece(0, 0, 10, 10), piece(1, 0, 10, 10), piece(3, 0, 25, 25)]
    )
    records = writer(out, file_rows=20).write(batch)
    files = on_disk(out)
    # units 0 and 1 fill a file; unit 2 starts the next (in unit order); unit 3 is cut in 20s
    assert sorted(len(ids) for ids in files.values()) == [5, 10, 20, 20]
    shared = [r for r in records if r.file_units > 1]
    assert {r.unit for r in shared} == {0, 1} and len({r.path for r in shared}) == 1
    three = sorted((r.start, r.end, r.unit_rows) for r in records if r.unit == 3)
    assert three == [(0, 20, -1), (20, 25, 25)]
    ids = sorted(i for ids in files.values() for i in ids)
    assert ids == [*range(0, 10), *range(1000, 1010), *range(2000, 2010), *range(3000, 3025)]


def test_rows_are_put_in_key_order_by_runs_without_a_copy() -> None:
    # the pieces of three units as a writer gets them, interleaved; each run in order
    batch = pa.concat_tables(
        [piece(1, 4, 6, 10), piece(0, 0, 3, 3), piece(2, 0, 5, 5), piece(1, 0, 4, 10)]
    ).combine_chunks()
    ordered = in_key_order(batch)
    assert ordered["id"].to_pylist() == [0, 1, 2, *range(1000, 1010), *range(2000, 2005)]
    assert ordered.num_rows == batch.num_rows and ordered.schema == batch.schema
    source = batch["id"].chunk(0).buffers()[1].address
    for chunk in ordered["id"].chunks:  # slices of the batch's buffer: nothing copied
        assert chunk.buffers()[1].address == source


def runs_row_by_row(keys: list[int]) -> list[tuple[int, int, int, int, int]]:
    """Runs as defined: a row starts a new run unless it is the next row of the row
    before's unit and that row was not its unit's last."""
    found: list[list[int]] = []
    for i, key in enumerate(keys):
        last = key < 0
        plain = -key - 1 if last else key
        unit, row = plain >> ROW_BITS, plain & ROW_MASK
        if found and found[-1][2] == unit and found[-1][5] == row - 1 and not found[-1][6]:
            found[-1][1], found[-1][5], found[-1][6] = i + 1, row, last
        else:
            found.append([i, i + 1, unit, row, 0, row, last])
    return [(lo, hi, u, start, end + 1 if last else -1) for lo, hi, u, start, _, end, last in found]


def test_runs_decoded_from_the_few_keys_that_break_the_step_are_the_runs_of_every_row() -> None:
    rng = random.Random(14)
    for _ in range(2000):
        pieces = []
        for unit in range(rng.randint(1, 5)):
            total = rng.randint(1, 12)
            cuts = sorted({rng.randint(1, total) for _ in range(3)} | {total})
            for lo, hi in itertools.pairwise([0, *cuts]):
                # some pieces of another unit, or of a unit with a large index, or a
                # unit whose total is not known: every way rows can come
                owner = rng.choice([unit, unit, 7, 1 << 20])
                size = rng.choice([total, None])
                pieces.append(piece(owner, lo, hi - lo, size or 10**6))  # type: ignore[arg-type]
        rng.shuffle(pieces)
        keys = pa.concat_tables(pieces).column(KEY).to_pylist()
        assert runs(np.array(keys, dtype=np.int64)) == runs_row_by_row(keys)
    assert runs(np.array([], dtype=np.int64)) == []


def test_a_unit_never_shares_a_file_while_part_of_it_is_elsewhere(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    batch = pa.concat_tables([piece(0, 5, 5, 10), piece(1, 0, 10, 10), piece(2, 0, 4, 10)])
    records = writer(out).write(batch)
    assert all(r.file_units == 1 for r in records)
    assert len({r.path for r in records}) == 3  # the tail of 0, the whole of 1, the head of 2


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_ready_units_wait_for_a_full_file_or_the_hold_time_and_the_end(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    clock = Clock()
    files = Coalescer(writer(out, file_rows=30), hold=5.0, clock=clock)
    assert files.add(piece(0, 0, 10, 10)) == []  # ready, held for others
    assert files.add(piece(1, 0, 5, 10)) == []  # not ready: waits for its rows
    assert files.wait() == 5.0
    clock.now = 4.0
    assert files.add(piece(2, 0, 10, 10)) == []
    clock.now = 5.0
    assert files.wait() == 0.0
    written = files.flush()  # the hold time passed: the ready units 0 and 2, in one file
    assert {r.unit for r in written} == {0, 2} and len({r.path for r in written}) == 1
    assert files.wait() is None  # nothing ready is held
    assert [r.unit for r in files.add(piece(1, 5, 5, 10))] == []  # ready now, held
    assert files.add(piece(4, 0, 10, 10)) == []
    full = files.add(piece(5, 0, 10, 10))  # 30 rows of ready units: a full file at once
    assert sorted({r.unit for r in full}) == [1, 4, 5]
    assert files.add(piece(6, 0, 3, 10)) == []
    last = files.flush(everything=True)  # the input ended: what is held goes, ready or not
    assert [(r.unit, r.start, r.end) for r in last] == [(6, 0, 3)]


def test_a_unit_larger_than_a_file_goes_on_in_pieces(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    files = Coalescer(writer(out, file_rows=20), clock=Clock())
    written = [r for start in range(0, 50, 10) for r in files.add(piece(0, start, 10, 50))]
    written += files.flush(everything=True)
    spans: dict[str, tuple[int, int]] = {}
    for r in written:  # a file's runs: from its first row to its last
        first, last = spans.get(r.path, (r.start, r.end))
        spans[r.path] = (min(first, r.start), max(last, r.end))
    assert sorted(spans.values()) == [(0, 20), (20, 40), (40, 50)]
    assert sorted(len(ids) for ids in on_disk(out).values()) == [10, 20, 20]


def test_a_unit_still_arriving_goes_on_to_an_open_file_not_into_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(datafile, "GROUP_ROWS", 100)  # each run a row group's worth
    out = tmp_path / "out"
    out.mkdir()
    one = piece(0, 0, 100, 1000).nbytes  # the Arrow bytes of 100 rows
    files = Coalescer(writer(out), clock=Clock(), unit_bytes=one)
    assert files.add(piece(0, 0, 100, 1000)) == []  # under the hold: in memory
    assert list(out.iterdir()) == []
    sizes = []
    for start in range(100, 900, 100):
        assert files.add(piece(0, start, 100, 1000)) == []  # appended, nothing closed
        assert not on_disk(out)  # readers see no file yet...
        (tmp,) = out.glob(".part-*.tmp")  # ...while the rows are in its temporary
        sizes.append(tmp.stat().st_size)
    assert sizes[-1] > sizes[0]  # the file grew as the unit arrived
    assert files._units[0].nbytes < one  # and memory held under the hold
    written = files.add(piece(0, 900, 100, 1000))  # the last rows: the file is closed
    assert len({r.path for r in written}) == 1 and max(r.end for r in written) == 1000
    assert list(on_disk(out).values()) == [list(range(1000))]  # every row once, in order
    assert not list(out.glob(".*"))  # no temporary left


def test_a_unit_planned_too_large_to_hold_goes_to_its_own_file_from_its_first_rows(
    tmp_path: Path,
) -> None:
    """Held until the hold filled, a large unit was written in runs of the hold's size:
    memory that bought nothing (each run is a row group of its own either way). A unit
    whose planned rows (a Parquet row group's) could never be held whole, and a unit that
    went on to files of its own, are appended as their rows come."""
    out = tmp_path / "out"
    out.mkdir()
    hold = piece(0, 0, 100, 1000).nbytes * 3  # 300 rows' worth
    files = Coalescer(writer(out), clock=Clock(), unit_bytes=hold, sizes={0: 1000, 1: 200})
    assert files.add(piece(0, 0, 100, 1000)) == []
    assert 0 not in files._units or not files._units[0].runs  # in its file, not in memory
    assert len(list(out.glob(".part-*.tmp"))) == 1  # unit 0's own file, open
    assert files.add(piece(1, 0, 100, 200)) == []  # 200 rows fit the hold: held
    assert files._units[1].nbytes > 0
    unknown = Coalescer(writer(tmp_path / "o2"), clock=Clock(), unit_bytes=hold)
    (tmp_path / "o2").mkdir()
    start = 0
    while not unknown._units.get(0, None) or not unknown._units[0].alone:
        assert start < 500  # no planned rows: held until the hold is full...
        unknown.add(piece(0, start, 100, 1000))
        start += 100
    assert not unknown._units[0].runs
    unknown.add(piece(0, start, 100, 1000))  # ...then on to its file as the rows come
    assert not unknown._units[0].runs and unknown._units[0].file is not None
    written = files.add(piece(0, 100, 900, 1000)) + files.flush(everything=True)
    assert {r.unit for r in written} == {0, 1}
    assert sorted(i for ids in on_disk(out).values() for i in ids) == [
        *range(1000),
        *range(1000, 1100),
    ]


def test_a_unit_in_files_of_its_own_is_written_in_its_order_whatever_order_runs_come_in(
    tmp_path: Path,
) -> None:
    """Appended as they came, the runs of a large unit from several replicas went into
    its file out of order: readers of a part file expect its rows in key order. A run
    that comes early waits for those before it; a range whose rows all failed is no gap."""
    out = tmp_path / "out"
    out.mkdir()
    files = Coalescer(writer(out), clock=Clock(), unit_bytes=1, sizes={0: 500})
    assert files.add(piece(0, 200, 100, 500)) == []  # early: waits for rows 0-199
    assert files._units[0].runs
    assert files.add(piece(0, 0, 100, 500)) == []  # 0-99 goes on; 200-299 still waits
    assert [r.start for r, _ in files._units[0].runs] == [200]
    record = files.writer.prepare(piece(0, 100, 100, 500))[0][0]  # rows 100-199 all
    files._hold(dataclasses.replace(record, error_rows=100), None)  # failed: a record only
    steps = files._due()
    files._take_files(steps)
    files._run(steps)
    assert not files._units[0].runs  # 200-299 followed the gap
    written = files.add(piece(0, 400, 100, 500)) + files.add(piece(0, 300, 100, 500))
    assert max(r.end for r in written) == 500
    (ids,) = on_disk(out).values()
    assert ids == [*range(0, 100), *range(200, 500)]  # in order, without the failed rows


def test_whole_units_are_appended_to_the_shared_file_as_they_finish(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    clock = Clock()
    files = Coalescer(writer(out, file_rows=25), hold=5.0, clock=clock)
    assert files.add(piece(0, 0, 10, 10)) == []
    (tmp,) = out.glob(".part-*.tmp")  # unit 0 is in the open shared file already
    assert files.add(piece(1, 0, 10, 10)) == []
    closed = files.add(piece(2, 0, 10, 10))  # would pass 25 rows: 0 and 1 are closed
    assert sorted({r.unit for r in closed}) == [0, 1] and not tmp.exists()
    assert sorted(map(len, on_disk(out).values())) == [20]
    clock.now = 5.0
    assert files.wait() == 0.0  # unit 2 waited its longest in the next shared file
    assert [r.unit for r in files.flush()] == [2]
    assert files.wait() is None


def test_a_unit_whose_columns_change_type_goes_on_in_a_new_file(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    files = Coalescer(writer(out, file_rows=20), clock=Clock())
    first = piece(0, 0, 20, 30)
    later = piece(0, 20, 10, 30)
    later = later.set_column(1, "m", later.column("m").cast(pa.float64()))
    written = files.add(first) + files.add(later)
    assert len({r.path for r in written}) == 2  # an int64 file and a float64 one
    assert sorted(i for ids in on_disk(out).values() for i in ids) == list(range(30))


def scored(unit: int, start: int, rows: int, total: int, known: bool) -> pa.Table:
    """Like :func:`piece`, its output a float64 score, or (not ``known``) all ``None``: a
    column of the ``null`` type, as a model returning only ``None`` in a batch gives."""
    table = piece(unit, start, rows, total)
    score = table.column("m").cast(pa.float64()) if known else pa.nulls(rows)
    return table.set_column(1, "m", score)


@pytest.mark.parametrize(
    ("pieces", "file_rows", "files"),
    [
        pytest.param([(0, 0, 10, 20, False), (0, 10, 10, 20, True)], 100, 1, id="null-then-typed"),
        pytest.param([(0, 0, 10, 20, True), (0, 10, 10, 20, False)], 100, 1, id="typed-then-null"),
        pytest.param(
            [(0, 10, 10, 30, True), (0, 20, 10, 30, False), (0, 0, 10, 30, False)],
            100,
            1,
            id="out-of-order",
        ),
        pytest.param([(0, 0, 10, 10, True), (1, 0, 10, 10, False)], 100, 1, id="open-file"),
        pytest.param(
            [(0, 0, 8, -1, False), (0, 8, 8, -1, True), (0, 16, 8, 24, False)],
            10,
            3,
            id="spans-files",
        ),
    ],
)
def test_a_column_null_in_some_runs_is_written_with_the_type_of_the_others(
    tmp_path: Path, pieces: list[tuple[int, int, int, int, bool]], file_rows: int, files: int
) -> None:
    """A model returned ``None`` for a unit's first rows, then numbers: the runs of the
    ``null`` type and of float64 were planned into one Parquet file, and the writer stopped
    the run ("Table schema does not match schema used to create file")."""
    out = tmp_path / "out"
    out.mkdir()
    coalescer = Coalescer(writer(out, file_rows=file_rows), clock=Clock())
    records = [r for args in pieces for r in coalescer.add(scored(*args))]
    records += coalescer.flush(everything=True)
    written = {p.name: pq.read_table(p) for p in out.glob("part-*")}
    assert len(written) == files
    assert sum(t.num_rows for t in written.values()) == sum(args[2] for args in pieces)
    typed = {
        name
        for name, table in written.items()
        if not pa.types.is_null(table.schema.field("m").type)
    }
    assert all(str(t.schema.field("m").type) == "double" for n, t in written.items() if n in typed)
    for record in records:  # a file still of the null type is marked for the retype
        assert ('"null"' in record.columns) == (record.path not in typed)
    every = pa.concat_tables(written.values(), promote_options="permissive")
    scores = dict(zip(every["id"].to_pylist(), every["m"].to_pylist(), strict=True))
    known = {
        u * 1000 + i for u, start, rows, _, has in pieces if has for i in range(start, start + rows)
    }
    assert scores == {i: float(i) if i in known else None for i in scores}


def test_discard_gives_up_the_open_files_and_leaves_no_temporary(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    files = Coalescer(writer(out, file_rows=5), clock=Clock())
    assert files.add(piece(0, 0, 3, 3)) == []  # in the shared file
    assert files.add(piece(1, 0, 8, 20)) != []  # a file of unit 1's first 5 rows, closed
    assert files.add(piece(1, 8, 1, 20)) == []  # and its next rows in an open one
    assert len(list(out.glob(".part-*.tmp"))) == 2
    files.discard()  # the run failed: units 0 and 1 are not committed, nor their files
    assert not list(out.glob(".part-*.tmp"))
    assert files.flush(everything=True) == []


@pytest.mark.parametrize("group_rows", [1, 65_536], ids=["written", "held"])
def test_a_file_whose_append_fails_is_removed_and_refuses_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, group_rows: int
) -> None:
    """Runs written at once fail at their append; runs held for a row group, at the
    append that writes them or at the close: either way before any record names the file."""
    monkeypatch.setattr(datafile, "GROUP_ROWS", group_rows)
    out = tmp_path / "out"
    out.mkdir()
    first = piece(0, 0, 5, 5)
    records, rows = zip(*writer(out).prepare(first), strict=True)
    file = writer(out).new_file(0, 0)
    with file.lock:
        file.append(records, rows)
        assert len(list(out.glob(".part-*.tmp"))) == 1
        other = pa.table({"id": pa.array(["x"]), "m": pa.array(["y"])})  # not its schema
        with pytest.raises(ValueError, match=r"(?i)schema"):
            file.append(records, [other])
            file.close()
        assert not list(out.iterdir())  # its temporary is gone, nothing under its name
        with pytest.raises(RuntimeError, match="given up after an earlier error"):
            file.close()


@pytest.mark.parametrize("wide", [False, True])
def test_small_runs_are_written_as_row_groups_of_a_useful_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wide: bool
) -> None:
    """Each run was a row group: a model's batches of 64 rows made 3,125 row groups and a
    660 KB footer for 200,000 rows. Runs are held until a row group's worth (rows, or
    Arrow bytes for wide rows), and the last ones go with the close."""
    out = tmp_path / "out"
    out.mkdir()
    runs = [writer(out).prepare(piece(0, start, 10, 1000))[0] for start in range(0, 1000, 10)]
    if wide:
        monkeypatch.setattr(datafile, "GROUP_BYTES", sum(t.nbytes for _, t in runs[:25]))
    else:
        monkeypatch.setattr(datafile, "GROUP_ROWS", 250)
    file = writer(out).new_file(0, 0)
    with file.lock:
        for record, rows in runs:
            assert rows is not None
            file.append([record], [rows])
        file.close()
    (path,) = out.glob("part-*")
    meta = pq.ParquetFile(path).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [250] * 4
    assert pq.read_table(path)["id"].to_pylist() == list(range(1000))


def test_a_resume_trusts_a_shared_file_only_with_all_its_units(tmp_path: Path) -> None:
    out = tmp_path / "out"
    ledger = Ledger.open(str(out), "f", {}, overwrite=False)
    records = writer(out).write(pa.concat_tables([piece(0, 0, 10, 10), piece(1, 0, 10, 10)]))
    alone = writer(out).write(piece(2, 0, 10, 10))
    line = {r.unit: {"unit": f"u{r.unit}", "index": r.unit, "rows": 10, "parts": [r.path],
                     "files": _files([r])} for r in records + alone}  # fmt: skip
    assert line[0]["files"][0][3] == 2  # [path, rows, bytes, units]
    ledger.commit([line[0], line[2]])  # a torn commit: unit 1's line never made it
    ledger = Ledger.open(str(out), "f", {}, overwrite=False)
    assert ledger.reconcile() == ["u0"]  # forgotten: its file holds rows of unit 1 too
    assert sorted(ledger.entries) == ["u2"]
    assert list(on_disk(out)) == [alone[0].path]  # the shared file was an orphan, removed
    ledger.commit([line[2]])
    manifest = ledger.manifest()
    assert manifest["rows"] == 10 and len(manifest["files"]) == 1


def test_a_shared_file_is_listed_once_in_the_manifest(tmp_path: Path) -> None:
    out = tmp_path / "out"
    ledger = Ledger.open(str(out), "f", {}, overwrite=False)
    records = writer(out).write(pa.concat_tables([piece(0, 0, 10, 10), piece(1, 0, 7, 7)]))
    ledger.commit(
        [
            {
                "unit": f"u{r.unit}",
                "index": r.unit,
                "rows": r.end,
                "parts": [r.path],
                "files": _files([r]),
            }
            for r in records
        ]
    )
    assert ledger.reconcile() == []
    manifest = ledger.manifest()
    assert manifest["rows"] == 17 and [f["rows"] for f in manifest["files"]] == [17]


@pytest.mark.parametrize(
    ("output", "named"),
    [
        pytest.param({"file_size": "12XB"}, "file_size '12XB' is not a size", id="unreadable"),
        pytest.param({"file_size": 100}, "file_size 100 is under 1024 bytes", id="tiny"),
        pytest.param({"file_size": "0.5KiB"}, "is under 1024 bytes", id="half-a-kib"),
        pytest.param({"file_rows": 0}, "output.file_rows", id="zero-rows"),
        pytest.param({"file_rows": "many"}, "output.file_rows", id="rows-not-a-number"),
    ],
)
def test_bad_file_targets_are_config_errors_naming_the_key(
    tmp_path: Path, output: dict[str, object], named: str
) -> None:
    import json

    job = {
        "input": str(tmp_path),
        "models": [{"name": "m", "fn": "chute.demo:tip_model", "inputs": ["x"]}],
        "output": {"path": str(tmp_path / "out"), **output},
    }
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(job))
    with pytest.raises(chute.ConfigError, match="file_") as caught:
        load_job(str(path))
    assert named in str(caught.value)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", ["plan", "validate"])
def test_plan_and_validate_name_the_file_target(
    taxi_dir: Path, tmp_path: Path, command: str
) -> None:
    import json

    from click.testing import CliRunner

    from chute.cli import main

    job = {
        "input": str(taxi_dir),
        "models": [{"name": "tip", "fn": "chute.demo:tip_model", "inputs": ["passenger_count"],
                    "batch_format": "numpy"}],
        "output": {"path": str(tmp_path / "out"), "file_size": "64MiB", "file_rows": 100000},
        "engine": "local",
    }  # fmt: skip
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(job))
    result = CliRunner().invoke(main, [command, str(path)], terminal_width=200)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.replace("│", " ").split())  # a long path wraps the cell
    assert "files of about 64 MiB or 100,000 rows" in text
