"""A hung model does not hang the job forever (issue 12, point 6), on both engines.

A model with ``timeout`` that does not answer a batch in time gets a freshly loaded
replica and the batch again (twice); a batch that still hangs is handled by ``on_error``:
``quarantine`` bisects it to the rows the model hangs on, ``fail`` stops the job naming
the model, the timeout and the unit. Timeouts here are one second, so a test takes a few.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
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
from chute.config import job_from_dict
from chute.engines.ray import live_pool_actors

HERE = Path(__file__).resolve()
UNITS, ROWS_PER_UNIT = 3, 8
ROWS = UNITS * ROWS_PER_UNIT
HANG_ID = 13
"""The row the model hangs on: row 5 of unit 1."""
RELEASE = threading.Event()
"""Set when a test ends, so that hung calls in this process return (on Ray, the actors
that hold them are killed with the run)."""


class HangsOnRow:
    """``score = 2 * id``, but a batch holding ``HANG_ID`` never gets an answer."""

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if HANG_ID in batch["id"]:
            RELEASE.wait(600)
        return {"score": batch["id"] * 2.0}


class HangsOnce:
    """Hangs on the first batch any replica sees (``marker`` records it), then works;
    each load appends a line to ``loads``."""

    def __init__(self, marker: str, loads: str) -> None:
        self.marker = Path(marker)
        with open(loads, "a") as f:
            f.write(f"{os.getpid()}\n")

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            self.marker.touch(exist_ok=False)  # only the first call anywhere creates it
        except FileExistsError:
            return {"score": batch["id"] * 2.0}
        RELEASE.wait(600)
        return {"score": batch["id"] * 2.0}


@pytest.fixture(autouse=True)
def release() -> Iterator[None]:
    RELEASE.clear()
    yield
    RELEASE.set()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three Parquet files of eight rows; ids 0..23."""
    root = tmp_path_factory.mktemp("hang-data")
    for unit in range(UNITS):
        ids = np.arange(unit * ROWS_PER_UNIT, (unit + 1) * ROWS_PER_UNIT)
        pq.write_table(pa.table({"id": ids}), root / f"unit{unit}.parquet")
    return root


def _job(data: Path, out: Path, engine: str, fn: Any, **model: Any) -> chute.Job:
    scorer = chute.Model(
        "m",
        fn,
        inputs=("id",),
        batch_format="numpy",
        batch_size=4,
        pool=chute.Pool.fixed(1),
        timeout=1.0,
        **model,
    )
    return chute.Job(
        source=chute.FileSource(str(data)),
        models=(scorer,),
        carryover=("id",),
        output=chute.Sink(str(out)),
        engine=engine,  # type: ignore[arg-type]
    )


def _check_predicted(out: Path, ids: list[int]) -> None:
    table = pd.read_parquet(out)
    assert sorted(table.id) == ids  # each exactly once
    assert (table.m_score == table.id * 2.0).all()


@pytest.mark.timeout(120)
def test_a_row_the_model_hangs_on_is_quarantined(data: Path, tmp_path: Path, engine: str) -> None:
    out = tmp_path / "out"
    report = _job(data, out, engine, HangsOnRow, on_error="quarantine").run()
    _check_predicted(out, [i for i in range(ROWS) if i != HANG_ID])
    errors = pd.read_parquet(out / "_errors")
    assert errors.id.tolist() == [HANG_ID]
    assert errors.error_type.tolist() == ["BatchTimeout"]
    assert "model 'm' timed out after 1 s" in errors.error_message[0]
    assert (report.rows_in, report.rows_failed) == (ROWS, 1)
    assert (out / "_SUCCESS").exists()


@pytest.mark.timeout(120)
def test_a_model_that_hangs_fails_the_job_naming_the_timeout(
    data: Path, tmp_path: Path, engine: str
) -> None:
    job = tmp_path / "job.yaml"
    model = {"name": "m", "fn": f"{HERE}:HangsOnRow", "inputs": ["id"], "timeout": "1s"}
    model |= {"batch_format": "numpy", "batch_size": 4, "pool": 1}
    spec = {"input": str(data), "models": [model], "output": str(tmp_path / "out")}
    job.write_text(json.dumps({**spec, "engine": engine}))
    result = CliRunner().invoke(main, ["run", str(job), "-q"])
    assert result.exit_code == 4, result.output
    message = " ".join(result.output.split())
    assert "model 'm' timed out after 1 s, 3 times" in message
    assert "unit(s) 1" in message and "unit1.parquet" in message
    assert "Traceback" not in result.output
    assert not (tmp_path / "out" / "_SUCCESS").exists()
    # The replica's hung calls never return: on Ray its actor is killed with the failed run
    # (left to exit on its own, it never would, and would keep its CPU from the next run).
    assert engine == "local" or live_pool_actors() == 0


@pytest.mark.timeout(120)
def test_a_model_that_hangs_once_is_replaced_and_the_batch_retried(
    data: Path, tmp_path: Path, engine: str
) -> None:
    out, loads = tmp_path / "out", tmp_path / "loads.log"
    kwargs = {"marker": str(tmp_path / "hung"), "loads": str(loads)}
    report = _job(data, out, engine, HangsOnce, kwargs=kwargs).run()
    _check_predicted(out, list(range(ROWS)))
    assert not (out / "_errors").exists() and report.rows_failed == 0
    assert len(loads.read_text().splitlines()) == 2  # the first replica, and its replacement


def test_timeout_is_checked_and_kept_out_of_the_fingerprint(data: Path) -> None:
    source = chute.FileSource(str(data))
    jobs = [
        chute.Job(source, (chute.Model("m", HangsOnRow, timeout=t),), engine="local")
        for t in (None, 1, 30.0)
    ]
    assert len({job.fingerprint() for job in jobs}) == 1
    for bad in (0, -1.0, "30s", True):
        with pytest.raises(chute.ConfigError, match="timeout must be a number of seconds"):
            chute.Model("m", HangsOnRow, timeout=bad)
    spec = {"input": str(data), "output": "out", "models": [{"name": "m", "fn": "x:y"}]}
    for text, seconds in (("30", 30.0), (45, 45.0), ("30s", 30.0), ("5m", 300.0)):
        spec["models"][0]["timeout"] = text  # type: ignore[index]
        assert job_from_dict(spec).models[0].timeout == seconds
    spec["models"][0]["timeout"] = "lots"  # type: ignore[index]
    with pytest.raises(chute.ConfigError, match=r"models\[0\] \(m\): timeout: cannot read 'lots'"):
        job_from_dict(spec)


def test_plan_shows_the_timeout(data: Path, tmp_path: Path) -> None:
    model = {"name": "m", "fn": f"{HERE}:HangsOnRow", "inputs": ["id"], "timeout": "5m"}
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps({"input": str(data), "models": [model], "output": "out"}))
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["plan", str(job)])
    assert result.exit_code == 0, result.output
    assert "timeout" in result.output and "300 s" in result.output


class WedgedDevice:
    """The first replica's call hangs, and so does loading another (a device that stopped
    answering)."""

    built = 0

    def __init__(self) -> None:
        type(self).built += 1
        if type(self).built > 1:
            RELEASE.wait(600)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        RELEASE.wait(600)
        return {"score": batch["id"] * 2.0}


@pytest.mark.timeout(60)
def test_a_replica_that_hangs_as_it_reloads_fails_the_run_instead_of_hanging_it(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reload after a hung call had no deadline: the run hung forever."""
    monkeypatch.setattr("chute.stages.model.RELOAD_DEADLINE", 1.0)
    WedgedDevice.built = 0
    job = _job(data, tmp_path / "out", "local", WedgedDevice, on_error="quarantine")
    with pytest.raises(chute.ModelError, match="did not load within 1 s either"):
        job.run()
    assert WedgedDevice.built == 2


class Locked:
    """An object the job holds, whose calls take a lock: a call that hangs keeps it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self.lock:
            if HANG_ID in batch["id"]:
                RELEASE.wait(600)
            return {"score": batch["id"] * 2.0}


@pytest.mark.timeout(60)
def test_an_object_whose_hung_call_holds_it_fails_the_run_instead_of_failing_every_row(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It cannot be loaded afresh: every call after the hung one timed out, and under
    quarantine the run "succeeded" with every row after it in the errors dataset."""
    monkeypatch.setattr("chute.stages.model.HUNG_IN_A_ROW", 3)  # 9: its bisection needs it
    job = _job(data, tmp_path / "out", "local", Locked(), on_error="quarantine")
    with pytest.raises(chute.ModelError, match=r"timed out on \d+ calls in a row.*give the class"):
        job.run()


class SlowPerRow:
    """3 ms a row: 1,024 rows take 3 s, past a one-second timeout; 128 take 0.4 s."""

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        RELEASE.wait(0.003 * len(batch["id"]))
        return {"score": batch["id"] * 2.0}


@pytest.mark.timeout(60)
def test_a_measured_batch_that_times_out_is_retried_smaller(tmp_path: Path) -> None:
    """``batch_size: auto`` learned only from calls that answered: the 1,024-row start
    timed out three times and the job failed, though smaller batches answer in time."""
    pq.write_table(pa.table({"id": np.arange(3_000)}), tmp_path / "in.parquet")
    model = chute.Model("m", SlowPerRow, inputs=("id",), batch_format="numpy", timeout=1.0)
    job = chute.Job(
        source=chute.FileSource(str(tmp_path / "in.parquet")),
        models=(model,),
        carryover=("id",),
        output=chute.Sink(str(tmp_path / "out")),
        engine="local",
    )
    report = job.run()
    _check_predicted(tmp_path / "out", list(range(3_000)))
    assert report.rows_failed == 0
    assert report.stages["m"].batch_rows <= 1_024 // 4
