"""The driver: the committer's bookkeeping, and a resumed run on the local engine."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import chute
from chute import ChuteError, FileSource, Job, JobStateError, Model, Sink, TableSource
from chute.coalesce import Coalescer
from chute.ledger import META_DIR, SUCCESS, Ledger
from chute.plan import Plan, build_plan
from chute.runner import Committer
from chute.runner import committer as committer_module
from chute.sinks import PartRecord, to_ipc
from chute.stages import KEY, decode, tag


def double(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"y": batch["x"] * 2}


def _plan(n: int = 10, unit_rows: int = 5) -> Plan:
    table = pa.table({"x": np.arange(n, dtype=np.int64)})
    return build_plan(Job(TableSource(table, unit_rows=unit_rows), (Model("m", double),)))


def _rec(unit: int, start: int, end: int, total: int = -1, path: str = "") -> PartRecord:
    return PartRecord(unit, start, end, total, path or f"part-{unit}-{start}-{end}", 1, 0.01)


# -- Committer ---------------------------------------------------------------------------


def test_commits_a_unit_once_its_parts_cover_all_rows(tmp_path: Path) -> None:
    plan = _plan()
    ledger = Ledger.open(str(tmp_path), "fp", {}, False)
    committer = Committer(plan, ledger, None)
    committer.add([_rec(0, 0, 2), _rec(0, 3, 5, 5)])
    assert committer.done == set()  # rows 2..3 are missing
    committer.add([_rec(1, 0, 5, 5)])
    assert committer.done == {1}
    committer.add([_rec(0, 2, 3)])
    assert committer.done == {0, 1}
    assert committer.missing() == []
    assert (committer.rows_out, committer.parts) == (10, 4)
    assert (committer.write.rows, committer.write.batches) == (10, 4)
    entries = Ledger.open(str(tmp_path), "fp", {}, False).entries
    assert entries == {
        "memory[5:10]": {
            "unit": "memory[5:10]",
            "index": 1,
            "rows": 5,
            "errors": 0,
            "parts": ["part-1-0-5"],
            "files": [["part-1-0-5", 5, 1]],
            "nulls": [],
        },
        "memory[0:5]": {
            "unit": "memory[0:5]",
            "index": 0,
            "rows": 5,
            "errors": 0,
            "parts": ["part-0-0-2", "part-0-3-5", "part-0-2-3"],
            "files": [["part-0-0-2", 2, 1], ["part-0-3-5", 2, 1], ["part-0-2-3", 1, 1]],
            "nulls": [],
        },
    }


def test_a_unit_that_arrives_short_of_its_planned_rows_is_never_committed(tmp_path: Path) -> None:
    """Whatever lost rows on the way (a reader, a stage, an engine), a unit whose parts
    cover fewer rows than the plan counted stops the run: not committed, no success."""
    ledger = Ledger.open(str(tmp_path), "fp", {}, False)
    committer = Committer(_plan(), ledger, None)
    with pytest.raises(chute.DataError, match=r"unit 'memory\[0:5\]' arrived with 4 rows where"):
        committer.add([_rec(0, 0, 4, 4)])  # the plan counted 5
    assert committer.done == set() and committer.rows_out == 0
    committer.flush()
    assert Ledger.open(str(tmp_path), "fp", {}, False).entries == {}


def test_the_unit_that_passes_the_failed_share_is_neither_counted_nor_committed(
    tmp_path: Path,
) -> None:
    """The units completed before it are committed; it is not, nor counted in the report
    (it was counted as done and left out of the ledger)."""
    from dataclasses import replace

    table = pa.table({"x": np.arange(10, dtype=np.int64)})
    job = Job(TableSource(table, unit_rows=5), (Model("m", double),), max_failed_fraction=0.4)
    ledger = Ledger.open(str(tmp_path), "fp", {}, False)
    committer = Committer(build_plan(job), ledger, None)
    failing = replace(_rec(1, 0, 5, 5), error_rows=5, errors_path="_errors/part-1")
    with pytest.raises(chute.ModelError, match=r"5 of the first 10 rows .* allows 40%"):
        committer.add([_rec(0, 0, 5, 5), failing])
    assert committer.done == {0}
    assert (committer.rows_in, committer.rows_failed) == (5, 0)
    committer.flush()
    assert list(Ledger.open(str(tmp_path), "fp", {}, False).entries) == ["memory[0:5]"]


def test_the_failed_share_is_of_the_units_in_input_order_not_as_they_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A unit whose rows all failed has no data file and commits at once, while the good
    units before it wait for their shared file: counted as they committed, one bad unit of
    four stopped the run as '5 of the 5 rows failed'."""
    from dataclasses import replace

    table = pa.table({"x": np.arange(20, dtype=np.int64)})
    job = Job(TableSource(table, unit_rows=5), (Model("m", double),), max_failed_fraction=0.4)
    monkeypatch.setattr(committer_module, "FAILURE_SAMPLE", 5)  # a unit: order decides
    committer = Committer(build_plan(job), Ledger.open(str(tmp_path), "fp", {}, False), None)
    committer.add([replace(_rec(2, 0, 5, 5), error_rows=5, errors_path="_errors/part-2")])
    committer.add([_rec(0, 0, 5, 5), _rec(1, 0, 5, 5), _rec(3, 0, 5, 5)])
    assert committer.done == {0, 1, 2, 3}
    assert (committer.rows_in, committer.rows_failed) == (20, 5)


def test_a_late_first_unit_does_not_let_a_broken_model_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The share is over the units from the first on; while the first is late (on Ray
    units finish out of order), units whose rows all failed stop the run once even a good
    first unit could not bring the share under the limit."""
    from dataclasses import replace

    table = pa.table({"x": np.arange(20, dtype=np.int64)})
    job = Job(TableSource(table, unit_rows=5), (Model("m", double),), max_failed_fraction=0.4)
    monkeypatch.setattr(committer_module, "FAILURE_SAMPLE", 5)
    committer = Committer(build_plan(job), Ledger.open(str(tmp_path), "fp", {}, False), None)

    def failing(unit: int) -> PartRecord:
        return replace(_rec(unit, 0, 5, 5), error_rows=5, errors_path=f"_errors/part-{unit}")

    # unit 0 not in: 5 failed of 10 rows even if its 5 are good, 50% > 40%
    with pytest.raises(chute.ModelError, match=r"5 of the first 10 rows .* allows 40%"):
        committer.add([failing(1)])
    assert committer.done == set() and (committer.rows_in, committer.rows_failed) == (0, 0)
    committer.add([_rec(0, 0, 5, 5)])  # the state as it was: the first unit still commits
    assert committer.done == {0}


def test_unit_total_comes_from_the_last_part() -> None:
    committer = Committer(_plan(), None, None)
    committer.add([_rec(0, 0, 5)])  # all rows, but no part says it holds the last one
    assert committer.done == set()
    committer.add([_rec(1, 0, 5, 5)])
    assert committer.done == {1}
    assert [u.index for u in committer.missing()] == [0]


def test_last_part_arriving_first() -> None:
    committer = Committer(_plan(), None, None)
    committer.add([_rec(0, 4, 5, 5)])
    committer.add([_rec(0, 0, 4)])
    assert committer.done == {0}


def test_parts_whose_columns_or_types_disagree_stop_the_run() -> None:
    """Each replica types a model's outputs from its first batch, and on Ray each worker
    process has its own: int64 parts from one and double parts from another made an
    output whose files disagree (pandas could not read it back), and the run succeeded."""
    from dataclasses import replace

    from chute.sinks.records import describe_columns

    def rec(unit: int, **types: pa.DataType) -> PartRecord:
        return replace(_rec(unit, 0, 5, 5), columns=describe_columns(pa.schema(types.items())))

    committer = Committer(_plan(), None, None)
    committer.add([rec(0, x=pa.int64(), m_y=pa.null())])  # all null: any type
    committer.add([rec(1, x=pa.int64(), m_y=pa.int64())])
    with pytest.raises(chute.ModelError, match=r"'m_y' is int64 .* but double in unit 0's"):
        Committer(_plan(), None, None).add(
            [rec(1, x=pa.int64(), m_y=pa.int64()), rec(0, x=pa.int64(), m_y=pa.float64())]
        )
    with pytest.raises(chute.ModelError, match="the columns m_y, m_z, x, the parts before"):
        Committer(_plan(), None, None).add(
            [
                rec(1, x=pa.int64(), m_y=pa.int64()),
                rec(0, x=pa.int64(), m_y=pa.int64(), m_z=pa.int8()),
            ]
        )


def test_duplicates_after_commit_are_ignored() -> None:
    committer = Committer(_plan(), None, None)
    committer.add([_rec(0, 0, 5, 5)])
    committer.add([_rec(0, 0, 5, 5, path="part-again"), _rec(0, 0, 2, path="part-again-2")])
    assert committer.done == {0}
    assert (committer.rows_out, committer.parts) == (5, 1)
    assert committer.again == {0}  # the report says one unit was computed again


def test_duplicates_before_commit_are_ignored(tmp_path: Path) -> None:
    ledger = Ledger.open(str(tmp_path), "fp", {}, False)
    committer = Committer(_plan(), ledger, None)
    committer.add([_rec(0, 0, 2, path="first")])
    committer.add([_rec(0, 0, 2, path="retry")])  # a retried task wrote the same rows
    committer.add([_rec(0, 2, 5, 5, path="rest")])
    assert committer.done == {0}
    assert committer.rows_out == 5
    assert ledger.entries["memory[0:5]"]["parts"] == ["first", "rest"]
    assert committer.again == {0}


def test_redo_forgets_the_parts_of_units_not_complete_and_names_them(tmp_path: Path) -> None:
    """An engine that plans its work again (the cluster changed) runs the units not done
    again, cut into other parts: the parts of the attempt it abandoned are forgotten, so
    that the new ones complete the unit alone and the ledger names only them."""
    ledger = Ledger.open(str(tmp_path), "fp", {}, False)
    committer = Committer(_plan(), ledger, None)
    committer.add([_rec(1, 0, 5, 5), _rec(0, 0, 3, path="abandoned")])
    assert committer.redo() == {0}
    committer.add([_rec(0, 0, 2, path="new-a"), _rec(0, 2, 5, 5, path="new-b")])
    assert committer.done == {0, 1} and committer.rows_out == 10
    assert ledger.entries["memory[0:5]"]["parts"] == ["new-a", "new-b"]
    assert committer.parts == 3  # the abandoned part is an orphan: not counted
    assert committer.redo() == set()
    assert committer.again == set()  # run again after a new plan: not a second copy


def test_records_of_units_not_pending_are_ignored() -> None:
    plan = _plan()
    plan.pending = plan.units[1:]
    committer = Committer(plan, None, None)
    committer.add([_rec(0, 0, 5, 5), _rec(7, 0, 1, 1)])
    assert committer.done == set()
    assert committer.parts == 0


def test_in_memory_result_is_in_input_order() -> None:
    committer = Committer(_plan(), None, None)
    table = pa.table({"x": np.arange(10, dtype=np.int64)})

    def part(unit: int, start: int, end: int, total: int) -> PartRecord:
        rows = tag(table.slice(unit * 5 + start, end - start), unit, start, total)
        data = to_ipc(rows)
        return PartRecord(unit, start, end, total, "", len(data), 0.0, data)

    committer.add([part(1, 3, 5, 5), part(0, 0, 5, 5)])
    committer.add([part(1, 0, 3, -1), part(1, 0, 3, -1)])  # a duplicate, in memory too
    result, rows = committer.result()
    assert result is not None and rows is not None
    assert result.column_names == ["x"]
    assert result.column("x").to_pylist() == list(range(10))
    assert rows.tolist() == list(range(10))  # each row's place in the input


def test_no_result_without_in_memory_parts() -> None:
    assert Committer(_plan(), None, None).result() == (None, None)


# -- a resumed run on the local engine ---------------------------------------------------


def _data(root: Path, files: int = 3, rows: int = 5) -> Path:
    root.mkdir()
    for i in range(files):
        ids = np.arange(i * 100, i * 100 + rows, dtype=np.int64)
        pq.write_table(
            pa.table({"id": ids, "x": ids * 3, "noise": ids * 0.0}), root / f"{i}.parquet"
        )
    return root


def _job(data: Path, out: Path, model: Model | None = None, file_rows: int | None = 5) -> Job:
    """Files of at most ``file_rows`` rows: by default a file a unit, so a unit's line in
    the ledger stands alone (``None``: the default target, one file the units share)."""
    model = model or Model("m", double, inputs=("x",), batch_format="numpy", batch_size=4)
    sink = Sink(str(out), file_rows=file_rows)
    return Job(FileSource(str(data)), (model,), output=sink, carryover=("id",), engine="local")


def _ledger_lines(out: Path) -> list[dict[str, Any]]:
    text = (out / META_DIR / "ledger.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def _check_output(out: Path, ids: list[int]) -> None:
    table = pq.read_table(out).sort_by("id")  # part files only: _chute and _SUCCESS are skipped
    assert table.column_names == ["id", "m_y"]
    assert table.column("id").to_pylist() == ids  # every row exactly once
    assert table.column("m_y").to_pylist() == [i * 6 for i in ids]
    parts = {p.name for p in out.glob("part-*")}
    latest = {e["unit"]: e for e in _ledger_lines(out)}  # a unit's later line replaces it
    assert parts == {name for e in latest.values() for name in e["parts"]}


ALL_IDS = [*range(0, 5), *range(100, 105), *range(200, 205)]


@pytest.mark.timeout(60)
def test_run_writes_parts_ledger_and_success(tmp_path: Path) -> None:
    data, out = _data(tmp_path / "data"), tmp_path / "out"
    report = _job(data, out).run()
    assert (report.engine, report.units_total, report.units_done, report.units_skipped) == (
        "local", 3, 3, 0,
    )  # fmt: skip
    assert (report.rows_out, report.rows_skipped) == (15, 0)
    assert report.result is None
    assert (out / SUCCESS).is_file()
    assert json.loads((out / META_DIR / "report.json").read_text())["rows_out"] == 15
    assert sorted(e["unit"] for e in _ledger_lines(out)) == sorted(
        str(p) for p in data.glob("*.parquet")
    )
    assert not list(out.glob(".*"))  # no temporaries
    _check_output(out, ALL_IDS)


@pytest.mark.timeout(60)
def test_resume_recomputes_only_the_uncommitted_unit(tmp_path: Path) -> None:
    data, out = _data(tmp_path / "data"), tmp_path / "out"
    _job(data, out).run()
    lines = _ledger_lines(out)
    lost = next(e for e in lines if e["unit"].endswith("1.parquet"))
    kept = [e for e in lines if e is not lost]
    (out / META_DIR / "ledger.jsonl").write_text("".join(json.dumps(e) + "\n" for e in kept))
    assert all((out / p).exists() for p in lost["parts"])  # written, but never committed
    (out / SUCCESS).unlink()

    report = _job(data, out).run()

    assert (report.units_total, report.units_done, report.units_skipped) == (3, 1, 2)
    assert (report.rows_out, report.rows_skipped) == (5, 10)
    # the output in all, earlier runs' committed (and failed) rows with it: a killed run
    # leaves no record of its own, and its quarantined rows were left out of the summary
    assert dict(report.rows())["output holds"].startswith("15 rows, 0 failed")
    assert not any((out / p).exists() for p in lost["parts"])  # orphans removed
    assert (out / SUCCESS).is_file()
    _check_output(out, ALL_IDS)
    redone = [e for e in _ledger_lines(out) if e["unit"] == lost["unit"]]
    assert len(redone) == 1 and redone[0]["rows"] == 5


@pytest.mark.timeout(60)
def test_a_writer_done_first_leaves_the_others_file_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last unit reaches its writer late: the other writer, done with its input, does
    not close the shared files under it (which made one more, smaller file, and failed the
    test below once in CI). Two writers: never more than two files."""
    add = Coalescer.add

    def slow_for_the_last_unit(self: Coalescer, batch: pa.Table) -> list[PartRecord]:
        units, _, _ = decode(batch.column(KEY).to_numpy())
        if 2 in units.tolist():
            time.sleep(0.5)  # the other writer has seen the end of the input by now
        return add(self, batch)

    monkeypatch.setattr(Coalescer, "add", slow_for_the_last_unit)
    data, out = _data(tmp_path / "data"), tmp_path / "out"
    _job(data, out, file_rows=None).run()
    assert len(list(out.glob("part-*"))) <= 2
    _check_output(out, ALL_IDS)


@pytest.mark.timeout(60)
def test_a_shared_file_is_trusted_only_with_all_its_units(tmp_path: Path) -> None:
    """Units share a file; the ledger loses one of their lines. The file is not trusted
    for the others either (its rows would be written twice): they are all redone, and the
    old file removed."""
    data, out = _data(tmp_path / "data"), tmp_path / "out"
    _job(data, out, file_rows=None).run()
    lines = _ledger_lines(out)
    holders: dict[str, list[dict[str, Any]]] = {}
    for entry in lines:
        for part in entry["parts"]:
            holders.setdefault(part, []).append(entry)
    # All three, unless the machine stalled for the hold time (5 s) between them.
    shared, units = max(holders.items(), key=lambda item: len(item[1]))
    assert len(units) >= 2, holders
    lost = units[0]
    kept = [e for e in lines if e is not lost]
    (out / META_DIR / "ledger.jsonl").write_text("".join(json.dumps(e) + "\n" for e in kept))
    (out / SUCCESS).unlink()

    report = _job(data, out, file_rows=None).run()

    redone = len(units)
    assert (report.units_done, report.units_skipped) == (redone, 3 - redone)
    assert report.rows_out == 5 * redone
    assert not (out / shared).exists()
    _check_output(out, ALL_IDS)


@pytest.mark.timeout(60)
def test_rerun_of_a_finished_job_does_nothing(tmp_path: Path) -> None:
    data, out = _data(tmp_path / "data"), tmp_path / "out"
    _job(data, out).run()
    before = sorted(p.name for p in out.glob("part-*"))
    report = _job(data, out).run()
    assert (report.units_done, report.units_skipped, report.rows_out) == (0, 3, 0)
    assert sorted(p.name for p in out.glob("part-*")) == before
    _check_output(out, ALL_IDS)


@pytest.mark.timeout(60)
def test_changed_job_is_refused_then_overwritten(tmp_path: Path) -> None:
    data, out = _data(tmp_path / "data"), tmp_path / "out"
    _job(data, out).run()
    other = Model("m", double, inputs=("x",), batch_format="numpy", kwargs={})
    changed = Job(FileSource(str(data)), (other,), output=Sink(str(out)), engine="local")
    with pytest.raises(JobStateError, match=r"changed: carryover"):
        changed.run()
    report = changed.run(overwrite=True)
    assert report.units_done == 3
    assert pq.read_table(out).column_names == ["m_y"]


@pytest.mark.timeout(60)
def test_model_error_leaves_no_success_marker(tmp_path: Path) -> None:
    data, out = _data(tmp_path / "data"), tmp_path / "out"

    def broken(batch: Any) -> Any:
        raise ValueError("nope")

    job = _job(data, out, Model("m", broken, inputs=("x",)))
    with pytest.raises(ChuteError, match="model 'm' raised ValueError: nope"):
        job.run()
    assert not (out / SUCCESS).exists()


def test_a_model_asking_for_gpus_this_machine_lacks_fails_before_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    gpu = chute.Model("m", lambda b: b["x"], resources=chute.Resources(gpus=0.5))
    job = chute.Job(
        source=chute.TableSource(pa.table({"x": [1, 2]})),
        models=(gpu,),
        output=chute.Sink(str(tmp_path / "out")),
        engine="local",
    )
    with pytest.raises(chute.ResourceError, match="this machine has 0"):
        job.run()
    assert not (tmp_path / "out").exists()


def test_a_location_whose_job_committed_nothing_can_be_taken_by_a_fixed_job(
    tmp_path: Path,
) -> None:
    def broken(batch: pa.Table) -> Any:
        raise ValueError("bug")

    def fixed(batch: pa.Table) -> Any:
        return batch["x"]

    source = chute.TableSource(pa.table({"x": [1, 2, 3]}))
    out = chute.Sink(str(tmp_path / "out"))
    with pytest.raises(chute.ModelError):
        chute.Job(source=source, models=(chute.Model("m", broken),), output=out).run()
    report = chute.Job(source=source, models=(chute.Model("m", fixed),), output=out).run()
    assert report.rows_out == 3


@pytest.mark.timeout(60)
def test_the_report_tells_what_happened_to_the_machines(tmp_path: Path) -> None:
    """Engine events (nodes lost, where Ray's own messages went) reach report.json, the
    report's summary and report.html; one process has none to tell."""
    from chute.htmlreport import render

    data, out = _data(tmp_path / "data"), tmp_path / "out"
    report = _job(data, out).run()
    assert report.events == []  # nothing computed twice either
    assert json.loads((out / META_DIR / "report.json").read_text())["events"] == []
    assert "events" not in dict(report.rows())
    report.events = ["lost node 127.0.0.3 (1 CPU) at 0:42", "Ray's own messages: /tmp/r.log"]
    assert [v for k, v in report.rows() if k == "events"] == report.events
    page = render(report.to_dict())
    assert "lost node 127.0.0.3 (1 CPU) at 0:42" in page and "/tmp/r.log" in page


def test_units_computed_again_are_counted_in_the_report() -> None:
    from chute.runner.run import _again

    committer = Committer(_plan(), None, None)
    assert _again(committer) == []
    committer.add([_rec(0, 0, 5, 5), _rec(1, 0, 5, 5)])
    committer.add([_rec(1, 0, 5, 5, path="made-again")])  # a block made again on Ray
    assert _again(committer) == [
        "1 unit(s) computed again after their rows had arrived (a retried task, a block "
        "made again): the second copies were left out, and removed"
    ]


def doubles(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"y": batch["x"] * 2}


@pytest.mark.timeout(120)
def test_a_run_over_units_cut_otherwise_is_refused_never_written_twice(
    engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release of chute changes how in-memory input is cut into units (its default
    ``unit_rows``, which the fingerprint leaves out so that it stays the same): the
    output's ledger names units the new plan does not have. Run, both sets would be in
    the output, rows twice (found by review: 10 rows came out as 20). The run is refused,
    nothing written, until ``--overwrite``."""
    import chute.sources.memory as memory

    table = pa.table({"x": np.arange(40)})
    out = tmp_path / "out"

    def job(rows: int) -> Job:
        monkeypatch.setattr(memory, "MEMORY_UNIT_ROWS", rows)
        model = Model("m", doubles, inputs=("x",), batch_format="numpy")
        return Job(TableSource(table, rows), (model,), output=Sink(str(out)), engine=engine)

    job(4).run()
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    with pytest.raises(JobStateError, match=r"9 committed unit\(s\) this job does not plan"):
        job(6).run()
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    report = job(6).run(overwrite=True)
    assert report.rows_out == 40
    assert sorted(pq.read_table(out).column("m_y").to_pylist()) == list(range(0, 80, 2))
