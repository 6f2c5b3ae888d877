"""What a model counts (``take_counters``: an LLM's tokens, finish reasons, errors by kind)
is summed over its replicas and batches into the report, on every engine, and shown on the
progress line."""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.console import Console

import chute
from chute import Model
from chute.report import counter_lines, progress_note
from chute.runner import run_job


class CountingModel:
    """Doubles ``x``; counts its rows as requests, ``x`` as tokens, odd rows as errors."""

    def __init__(self) -> None:
        self.counted: dict[str, float] = {}

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = batch["x"]
        odd = float(np.sum(x % 2))
        for name, value in {
            "requests": float(len(x)),
            "generated_tokens": float(np.sum(x)),
            "finish/stop": len(x) - odd,
            "error/odd": odd,
        }.items():
            self.counted[name] = self.counted.get(name, 0.0) + value
        return {"y": x * 2}

    def take_counters(self) -> dict[str, float]:
        counted, self.counted = self.counted, {}
        return counted


@pytest.mark.timeout(300)
def test_the_report_sums_what_the_model_counted(engine: str, tmp_path: Path) -> None:
    x = np.arange(1000)
    pq.write_table(pa.table({"x": x}), tmp_path / "a.parquet", row_group_size=100)
    job = chute.Job(
        source=chute.FileSource(str(tmp_path / "a.parquet")),
        models=(Model("m", CountingModel, batch_format="numpy", batch_size=64),),
        output=chute.Sink(str(tmp_path / "out")),
        engine=engine,  # type: ignore[arg-type]
    )
    log = io.StringIO()
    report = run_job(job, progress=True, console=Console(file=log, width=200))
    assert f"units 1/1 · {x.sum():,} tokens out" in log.getvalue()  # the progress line
    assert report.stages["m"].counters == {
        "requests": 1000.0,
        "generated_tokens": float(x.sum()),
        "finish/stop": 500.0,
        "error/odd": 500.0,
    }
    text = report.render(width=200)
    assert "1,000 requests (" in text and f"{x.sum():,} generated tokens (" in text
    assert "finish: m" in text and "stop 500" in text and "odd 500" in text
    again = chute.Report.from_dict(report.to_dict())  # report.json keeps them
    assert again.stages["m"].counters == report.stages["m"].counters


def test_counter_lines_and_progress_note() -> None:
    counters = {"generated_tokens": 96.0, "requests": 12.0, "prompt_tokens": 1024.0}
    counters |= {"finish/length": 2.0, "finish/stop": 10.0, "error/prompt_too_long": 1.0}
    assert counter_lines(counters, 4.0) == [
        (
            "counted",
            "12 requests (3.0/s), 1,024 prompt tokens (256.0/s), 96 generated tokens (24.0/s)",
        ),
        ("error", "prompt_too_long 1"),
        ("finish", "length 2, stop 10"),
    ]
    assert progress_note(counters, 2.0) == "96 tokens out, 48 tok/s"
    assert progress_note({"requests": 3.0}, 2.0) == "" and counter_lines({}, 1.0) == []


class SlowToLoad:
    """Adds one to ``x``; takes ``LOAD`` seconds to build, as a big model would."""

    LOAD = 0.2

    def __init__(self) -> None:
        time.sleep(self.LOAD)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"y": batch[next(iter(batch))] + 1}


@pytest.mark.timeout(300)
def test_the_report_says_how_long_each_model_took_to_load(engine: str, tmp_path: Path) -> None:
    """Both models of a chain, the first one's figures travelling with its rows on Ray."""
    pq.write_table(pa.table({"x": np.arange(1000)}), tmp_path / "a.parquet", row_group_size=100)
    job = chute.Job(
        source=chute.FileSource(str(tmp_path / "a.parquet")),
        models=(
            Model("first", SlowToLoad, inputs=("x",), batch_format="numpy"),
            Model("second", SlowToLoad, inputs=("first_y",), batch_format="numpy"),
        ),
        output=chute.Sink(str(tmp_path / "out")),
        engine=engine,  # type: ignore[arg-type]
    )
    report = job.run()
    text = report.render(width=200)
    again = chute.Report.from_dict(report.to_dict())  # report.json keeps them
    for name in ("first", "second"):
        stats = report.stages[name]
        assert stats.loads >= 1  # one a replica (Ray may build one in each read worker)
        assert stats.load_seconds >= SlowToLoad.LOAD * stats.loads
        assert f"model {name}" in text and stats.load_note in text
        assert (again.stages[name].loads, again.stages[name].load_seconds) == (
            stats.loads,
            round(stats.load_seconds, 3),
        )


def test_the_load_note_says_one_load_or_their_mean() -> None:
    one = chute.report.StageStats(loads=1, load_seconds=9.843)
    assert one.load_note == "loaded in 9.84 s"
    assert one.notes == ["loaded in 9.84 s"]
    three = chute.report.StageStats(loads=3, load_seconds=29.4)
    assert three.load_note == "3 loads, 9.80 s each on average (29.40 s in all)"
    assert chute.report.StageStats().load_note is None  # a step, or no batch reported


def test_a_function_is_not_loaded(tmp_path: Path) -> None:
    """A plain function has nothing to build: the report says nothing of loading it."""
    job = chute.Job(
        source=chute.TableSource(pa.table({"x": np.arange(10)})),
        models=(Model("f", lambda b: {"y": b["x"]}, batch_format="numpy"),),
        output=chute.Sink(str(tmp_path / "out")),
        engine="local",
    )
    report = job.run()
    assert report.stages["f"].loads == 0 and report.stages["f"].load_note is None
