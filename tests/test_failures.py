"""Bad records: on_error fail (stop, show the unit and the row) and quarantine (isolate)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import chute
from chute.cli import main

ROWS = 100_000
BAD = (17, 54_321, 99_999)


class Picky:
    """Raises on a batch that holds any of the bad ids (a model that chokes on some rows)."""

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids = batch["id"]
        found = np.intersect1d(ids, BAD)
        if found.size:
            raise ValueError(f"cannot score id {int(found[0])}")
        return {"score": ids * 2.0}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """100,000 rows over four Parquet files."""
    root = tmp_path_factory.mktemp("bad-records")
    ids = np.arange(ROWS)
    for i, chunk in enumerate(np.array_split(ids, 4)):
        table = pa.table({"id": chunk, "label": pa.array([f"r{v}" for v in chunk])})
        pq.write_table(table, root / f"part{i}.parquet")
    return root


def _job(data: Path, out: Path, engine: str, **model: Any) -> chute.Job:
    scorer = chute.Model("m", Picky, inputs=("id",), batch_format="numpy", **model)
    follow = chute.Model("n", lambda b: np.asarray(b["m_score"]) + 1, inputs=("m_score",))
    return chute.Job(
        source=chute.FileSource(str(data)),
        models=(scorer, follow),
        carryover=("id", "label"),
        output=chute.Sink(str(out)),
        engine=engine,  # type: ignore[arg-type]
    )


@pytest.mark.timeout(240)
def test_quarantine_isolates_exactly_the_rows_that_raise(
    data: Path, tmp_path: Path, engine: str
) -> None:
    report = _job(data, tmp_path / "out", engine, on_error="quarantine").run()
    out = pd.read_parquet(tmp_path / "out")
    errors = pd.read_parquet(tmp_path / "out" / "_errors")
    assert len(out) == ROWS - len(BAD) == report.rows_out
    assert sorted(out.id) == sorted(set(range(ROWS)) - set(BAD))
    assert (out.m_score == out.id * 2.0).all() and (out.n == out.m_score + 1).all()
    assert sorted(errors.id) == list(BAD)
    assert list(errors.columns) == ["id", "label", "model", "error_type", "error_message"]
    assert set(errors.model) == {"m"} and set(errors.error_type) == {"ValueError"}
    assert {f"cannot score id {i}" for i in BAD} == set(errors.error_message)
    assert errors.set_index("id").label.to_dict() == {i: f"r{i}" for i in BAD}
    assert (report.rows_in, report.rows_failed) == (ROWS, len(BAD))
    assert (tmp_path / "out" / "_SUCCESS").exists()
    status = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["status", str(tmp_path / "out")])
    assert "rows failed │ 3 (in _errors/)" in " ".join(status.output.split())


@pytest.mark.timeout(240)
def test_fail_stops_naming_the_unit_and_showing_the_row(
    data: Path, tmp_path: Path, engine: str
) -> None:
    with pytest.raises(chute.ModelError) as info:
        _job(data, tmp_path / "out", engine).run()
    message = str(info.value)
    # Whichever bad row a replica meets first (units run at once; the local engine's
    # readers race): the message names that row, its unit and its file.
    found = re.search(r"model 'm' raised ValueError: cannot score id (\d+)", message)
    assert found is not None, message
    bad = int(found.group(1))
    assert bad in BAD
    unit, row = divmod(bad, ROWS // 4)  # four files of 25,000 rows, a unit each
    assert f"on row {row} of unit {unit}" in message and f"part{unit}.parquet" in message
    assert f"'id': {bad}" in message and f"'label': 'r{bad}'" in message
    assert "on_error: quarantine" in message
    assert not (tmp_path / "out" / "_SUCCESS").exists()


def test_a_model_that_fails_on_every_row_of_a_batch_is_quarantined_whole() -> None:
    def refuse(batch: pa.Table) -> Any:
        raise RuntimeError("nope")

    stage = chute.Model("m", refuse, inputs=("x",), on_error="quarantine")
    table = pa.table({"x": [1, 2, 3]})
    job = chute.Job(
        source=chute.TableSource(table),
        models=(stage,),
        carryover=("x",),
        max_failed_fraction=1.0,  # asked never to stop for failed rows
    )
    report = job.run()
    assert (report.rows_in, report.rows_out, report.rows_failed) == (3, 0, 3)
    # by default a model that fails most rows stops the run: it ended "complete", empty
    with pytest.raises(chute.ModelError, match=r"3 of the first 3 rows .* max_failed_fraction"):
        dataclasses.replace(job, max_failed_fraction=0.5).run()


def _typed_by_environment(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """int64 scores, or float64 ones where CHUTE_TEST_FLOAT is set."""
    import os

    if os.environ.get("CHUTE_TEST_FLOAT"):
        return {"v": batch["id"] + 0.5}
    return {"v": batch["id"] * 2}


def _four_units(tmp_path: Path, model: Any) -> chute.Job:
    """A job of four 100-row Parquet files, each unit's rows in a file of their own."""
    data = tmp_path / "in"
    data.mkdir()
    for i in range(4):
        pq.write_table(pa.table({"id": np.arange(i * 100, i * 100 + 100)}), data / f"{i}.parquet")
    return chute.Job(
        source=chute.FileSource(str(data)),
        models=(chute.Model("m", model, inputs=("id",), batch_format="numpy"),),
        carryover=("id",),
        output=chute.Sink(str(tmp_path / "out"), file_rows=100),  # a file a unit
        engine="local",
    )


@pytest.mark.timeout(120)
def test_a_resume_writes_the_types_of_the_parts_an_earlier_run_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each run compared types only among its own parts: units committed as int64, then a
    run that redid one of them with a model giving float64 ended complete with files of
    both types, and the output could not be read as one dataset."""
    job = _four_units(tmp_path, _typed_by_environment)
    job.run()
    parts = sorted((tmp_path / "out").glob("part-*"))
    assert len(parts) == 4
    parts[-1].unlink()  # that unit is computed again by the next run, the others kept
    monkeypatch.setenv("CHUTE_TEST_FLOAT", "1")
    refused = r"'m_v' is int64 in the parts written so far \(those an earlier run committed"
    with pytest.raises(chute.ModelError, match=refused):
        job.run()
    job.run(overwrite=True)
    table = pq.read_table(tmp_path / "out")
    assert table.schema.field("m_v").type == pa.float64() and table.num_rows == 400


def _pairs(batch: dict[str, np.ndarray]) -> dict[str, Any]:
    """A list column (an embedding's shape) and a struct holding one."""
    ids = batch["id"].astype(np.float64)
    pairs = pa.array([[v, -v] for v in ids], pa.list_(pa.float64()))
    return {"v": pairs, "s": pa.StructArray.from_arrays([pairs], names=["a"])}


@pytest.mark.timeout(120)
def test_a_resume_of_a_ledger_that_spells_types_as_arrow_does(tmp_path: Path) -> None:
    """An older chute noted ``list<item: double>`` where it now notes ``list<double>``: a
    job it began, resumed, took its own list column for another type (exit 4)."""
    job = _four_units(tmp_path, _pairs)
    job.run()
    ledger = tmp_path / "out" / "_chute" / "ledger.jsonl"
    lines = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert any(["m_v", "list<double>"] in line.get("columns", []) for line in lines)
    old = json.dumps(lines).replace("list<double>", "list<item: double>")
    ledger.write_text("".join(json.dumps(line) + "\n" for line in json.loads(old)))
    sorted((tmp_path / "out").glob("part-*"))[-1].unlink()  # that unit is computed again
    again = job.run()
    assert again.units_done == 1
    table = pq.read_table(tmp_path / "out")
    assert table.schema.field("m_v").type == pa.list_(pa.float64()) and table.num_rows == 400
