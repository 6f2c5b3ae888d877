"""A run never erases the output's history: each run appends its record, the report shows
the output as a whole, and a finished job run again says "nothing to do" and changes
nothing (issue 17, point 3)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from rich.console import Console

from chute.runner import run_job
from tests import reports
from tests.reports import BROKEN, ROWS_PER_UNIT, UNITS


def _report(out: Path) -> dict[str, object]:
    return dict(json.loads((out / "_chute" / "report.json").read_text()))


def _stat(out: Path) -> dict[str, tuple[int, bytes]]:
    """Every file of the output with its modification time and bytes."""
    found = {}
    for root, _, names in os.walk(out):
        for name in names:
            path = Path(root, name)
            found[str(path.relative_to(out))] = (path.stat().st_mtime_ns, path.read_bytes())
    return found


@pytest.mark.timeout(180)
def test_a_finished_job_run_again_says_nothing_to_do_and_changes_nothing(
    engine: str, tmp_path: Path
) -> None:
    out = reports.failures_report(tmp_path, engine)
    before = _stat(out)
    assert _report(out)["rows_failed"] == 83
    console = Console(file=io.StringIO(), width=200)
    again = run_job(
        reports.job(tmp_path / "data", out, engine=engine), progress=True, console=console
    )
    message = f"nothing to do: all {UNITS} units already committed"
    assert message in console.file.getvalue()  # type: ignore[attr-defined]
    assert again.stopped == message and message in again.render(width=200)
    assert (again.units_done, again.units_skipped, again.rows_out) == (0, UNITS, 0)
    assert again.totals["rows_failed"] == 83 and again.failures["rows"] == 83
    assert _stat(out) == before  # not a byte or a timestamp changed: report, _SUCCESS, parts


@pytest.mark.timeout(120)
def test_each_run_appends_its_record_and_the_report_shows_the_whole_output(
    tmp_path: Path,
) -> None:
    folder = reports.data(tmp_path / "data")
    out = tmp_path / "out"
    BROKEN.update(unit_from_row=3 * ROWS_PER_UNIT + 1_900, bad_rows=0)  # stops in unit 3
    try:
        with pytest.raises(Exception, match="the model broke at row"):
            reports.job(folder, out, on_error="fail").run()
        (out / "_chute" / "first.json").write_text((out / "_chute" / "report.json").read_text())
        BROKEN["unit_from_row"] = None
        final = reports.job(folder, out, on_error="fail").run()  # resumed: the rest
    finally:
        BROKEN.update(unit_from_row=None, bad_rows=1)
    first = json.loads((out / "_chute" / "first.json").read_text())
    assert first["complete"] is False
    assert str(first["stopped"]).startswith("ModelError: model 'm' raised RuntimeError")
    assert first["resume"]
    committed_first = first["totals"]["units"]  # type: ignore[index]
    # units 0 and 1 were read before unit 3 and passed the model before its last rows:
    # the failure does not take them down with it, however busy the machine
    assert 2 <= committed_first < UNITS

    saved = _report(out)
    runs = saved["runs"]
    assert isinstance(runs, list) and len(runs) == 2
    assert runs[0]["stopped"] == first["stopped"] and runs[1]["stopped"] == "complete"
    assert runs[0]["units_run"] == committed_first
    assert runs[1]["units_run"] == UNITS - committed_first == final.units_done
    for run in runs:
        assert run["started_at"] <= run["ended_at"] and run["engine"] == "local"
        assert set(run["stages"]) >= {"write"} and len(run["timeline"]) >= 2
    assert runs[0]["ended_at"] <= runs[1]["started_at"]
    # the output as a whole: every row, whichever run committed it
    total = UNITS * ROWS_PER_UNIT
    assert saved["totals"] == {
        "units": UNITS,
        "units_total": UNITS,
        "rows_in": total,
        "rows_out": total,
        "rows_failed": 0,
    }
    assert final.rows_in < total  # while the run's own figures are its own
    assert sum(r["rows"] for r in runs) == total
    page = (out / "_chute" / "report.html").read_text()
    runs_section = page.split("<section id='runs'>")[1].split("</section>")[0]
    assert runs_section.count("<tr>") == 3  # the header and one row per run
    assert "run 1" in page and "run 2" in page  # the timeline across both runs


@pytest.mark.timeout(120)
def test_a_failure_while_committing_the_finished_units_keeps_the_first_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model fails; keeping the units that finished before it fails too (the disk is
    full when the driver writes them): the model's error is the one raised, the second
    is a note on it, and the same command then finishes with every row once."""
    import threading

    from chute.coalesce import Coalescer

    real = Coalescer.flush

    def full_disk_on_the_driver(self: Coalescer, everything: bool = False) -> list[Any]:
        if threading.current_thread() is threading.main_thread():
            raise OSError(28, "No space left on device")
        return real(self, everything)

    folder = reports.data(tmp_path / "data")
    out = tmp_path / "out"
    BROKEN.update(unit_from_row=3 * ROWS_PER_UNIT + 1_900, bad_rows=0)
    try:
        with monkeypatch.context() as patch:
            patch.setattr(Coalescer, "flush", full_disk_on_the_driver)
            with pytest.raises(Exception, match="the model broke at row") as info:
                reports.job(folder, out, on_error="fail").run()
        notes = [n for e in (info.value, info.value.__cause__) for n in getattr(e, "__notes__", [])]
        assert any("were not committed" in n and "No space left" in n for n in notes), notes
        BROKEN["unit_from_row"] = None
        final = reports.job(folder, out, on_error="fail").run()
    finally:
        BROKEN.update(unit_from_row=None, bad_rows=1)
    assert final.complete
    ids = pq.read_table(out, columns=["id"]).column("id").to_pylist()
    assert sorted(ids) == list(range(UNITS * ROWS_PER_UNIT))
