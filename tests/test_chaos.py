"""Failures survived exactly once (issue 3): the driver SIGKILLed at several points and
resumed, Ctrl-C, a model actor's process killed, a worker node of a two-node cluster lost.

Every job here is real: a driver subprocess (``python -m chute run job.yaml``), its own
local Ray or a loopback cluster, Parquet files in and out. The model
(:class:`tests.chaos_job.SlowModel`) sleeps a little per batch so that a job takes a few
seconds, logs which units it scores (so a test can tell what a run computed) and leaves
its process id behind (so a test can kill it). Each test checks the final output against
an uninterrupted run: every row id exactly once, the same predictions, ``_SUCCESS``, and
no part file that the ledger does not name.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
import psutil
import pytest

import chute
from chute.config import load_job
from chute.metrics import metric_from_spec
from tests.chaos_job import (
    HERE,
    METRICS,
    ROWS_PER_UNIT,
    computed_again,
    driver_env,
    finish_or_kill,
    ledger_lines,
    ledger_units,
    make_data,
    reap,
    seen_units,
    session_processes,
    start_driver,
    wait_for,
    write_job,
)
from tests.loopback_cluster import HEAD_IP, LoopbackCluster

pytestmark = pytest.mark.slow

UNITS = 16
ROWS = UNITS * ROWS_PER_UNIT
ALL_UNITS = set(range(UNITS))


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 Parquet files (one unit each) of 1,000 rows; ids 0..15,999."""
    return make_data(tmp_path_factory.mktemp("chaos-data"), UNITS)


@pytest.fixture(scope="module")
def expected(data: Path, tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    """The output of an uninterrupted run (in process, local engine), sorted by id."""
    out = tmp_path_factory.mktemp("chaos-reference") / "out"
    model = chute.Model(
        "m", f"{HERE}:SlowModel", inputs=("id", "x"), batch_format="numpy", batch_size=250
    )
    job = chute.Job(
        source=chute.FileSource(str(data)),
        models=(model,),
        carryover=("id", "tag"),
        output=chute.Sink(str(out)),
        engine="local",
        metrics=tuple(metric_from_spec(spec) for spec in METRICS),
    )
    report = job.run()
    assert (report.units_done, report.rows_out) == (UNITS, ROWS)
    frame = _read(out)
    frame.attrs["metrics"] = json.loads(json.dumps(report.metrics))
    return frame


# --------------------------------------------------------------------------- checks


def _read(out: Path) -> pd.DataFrame:
    return pd.read_parquet(out).sort_values("id").reset_index(drop=True)


def check_exactly_once(out: Path, expected: pd.DataFrame) -> None:
    """The finished output holds every row once, as an uninterrupted run wrote it."""
    assert (out / "_SUCCESS").exists()
    entries = ledger_units(out)
    assert Counter(e["index"] for e in entries) == Counter(ALL_UNITS), "a unit lost or doubled"
    named = {p for e in entries for p in e["parts"]}
    on_disk = {p.name for p in out.iterdir() if p.name.startswith(("part-", ".part-"))}
    assert on_disk == named, f"orphans {sorted(on_disk - named)}, lost {sorted(named - on_disk)}"
    result = _read(out)
    assert result.id.is_unique and len(result) == ROWS
    pd.testing.assert_frame_equal(result[expected.columns], expected)


def final_report(out: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads((out / "_chute" / "report.json").read_text())
    return report


def committed(out: Path) -> set[int]:
    return {e["index"] for e in ledger_units(out)}


# --------------------------------------------------------------------------- 1. kill -9


def _reached(out: Path, point: str | int) -> bool:
    if point == "start":
        return (out / "_chute" / "job.json").exists()
    return ledger_lines(out) >= int(point)


KILL_POINTS = {
    # "start": the output was claimed (job.json written), nothing committed yet (on ray:
    # Ray is still starting); a number: once the ledger holds at least that many units.
    "local": ["start", 1, 4, 9, 14],
    "ray": ["start", 6],
}


@pytest.mark.timeout(280)
@pytest.mark.parametrize(
    ("driver_engine", "file_rows"),
    [
        pytest.param("local", None, id="local"),
        pytest.param("ray", None, id="ray", marks=pytest.mark.ray),
        # files of 2,500 rows: three whole units of 1,000 share one (local engine)
        pytest.param("local", 2_500, id="local-shared-files"),
        # files of 400 rows: a unit's rows go on to files of its own as they arrive, the
        # file open (a temporary) while the unit is still computed
        pytest.param("local", 400, id="local-streamed-files"),
    ],
)
def test_driver_sigkill_at_any_point_resumes_exactly_once(
    data: Path, expected: pd.DataFrame, tmp_path: Path, driver_engine: str, file_rows: int | None
) -> None:
    out = tmp_path / "out"
    job = write_job(tmp_path / "job.yaml", data, out, driver_engine, delay=0.05)
    if file_rows is not None:
        spec = json.loads(job.read_text())
        spec["output"] = {"path": str(out), "file_rows": file_rows}
        job.write_text(json.dumps(spec))
    leaked: list[str] = []
    runs = [*KILL_POINTS[driver_engine], None]  # None: the last run, left to finish
    for n, point in enumerate(runs):
        before = committed(out)
        seen = tmp_path / f"seen-{n}.jsonl"
        proc = start_driver(job, driver_env(CHAOS_SEEN=str(seen)))
        try:
            reached = None if point is None else partial(_reached, out, point)
            finish_or_kill(proc, reached, n, timeout=180 if point is None else 150)
        finally:
            leaked += reap(proc)
            assert not session_processes(proc.pid), "the driver's processes outlived it"
        after = committed(out)
        # A run never computes a unit committed before it started...
        assert not seen_units(seen) & before, f"run {n} recomputed committed units"
        # ...and never commits one twice.
        entries = ledger_units(out)
        assert len(entries) == len(after), f"run {n} committed a unit twice"
        if point is None:
            assert seen_units(seen) == ALL_UNITS - before
    report = final_report(out)
    if before == ALL_UNITS:
        # The last kill met a run that had just written its report: the last run had
        # nothing to do and left the output as it was; the report is the finished run's.
        assert report["units_done"] + report["units_skipped"] == UNITS
    else:
        assert (report["units_total"], report["units_skipped"]) == (UNITS, len(before))
        assert report["units_done"] == UNITS - len(before)
    check_exactly_once(out, expected)
    assert report["metrics"] == expected.attrs["metrics"]  # exactly, after every kill
    if file_rows == 2_500:  # files did hold several units: [path, rows, bytes, units]
        assert any(len(f) == 4 for e in ledger_units(out) for f in e["files"])
    if file_rows == 400:  # each unit in three files of its own
        assert all(len(e["files"]) == 3 for e in ledger_units(out))
    print(f"left behind by the killed drivers, and reaped: {Counter(leaked)}")


# --------------------------------------------------------------------------- 1b. torn ledger


@pytest.mark.timeout(120)
def test_a_torn_last_ledger_line_does_not_swallow_the_next_commit(
    data: Path, expected: pd.DataFrame, tmp_path: Path
) -> None:
    """A driver killed while appending to the ledger can leave a torn last line: the
    resumed run must redo that unit, and its own commits must not be glued onto the torn
    line (where they would be lost: parts on disk that no ledger line names)."""
    out = tmp_path / "out"
    job = write_job(tmp_path / "job.yaml", data, out, "local", delay=0.05)
    proc = start_driver(job, driver_env())
    try:
        assert wait_for(lambda: ledger_lines(out) >= 3, proc, timeout=120)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        reap(proc)
    ledger = out / "_chute" / "ledger.jsonl"
    whole = ledger.read_text().splitlines()
    assert 3 <= len(whole) < UNITS
    ledger.write_text("\n".join(whole[:-1]) + "\n" + whole[-1][: len(whole[-1]) // 2])

    proc = start_driver(job, driver_env())
    try:
        _, stderr = proc.communicate(timeout=120)
    finally:
        reap(proc)
    assert proc.returncode == 0, stderr
    assert final_report(out)["units_skipped"] == len(whole) - 1  # the torn unit was redone
    check_exactly_once(out, expected)


# --------------------------------------------------------------------------- 1c. --overwrite


def _fingerprint(out: Path) -> str:
    try:
        return str(json.loads((out / "_chute" / "job.json").read_text())["fingerprint"])
    except (OSError, ValueError, KeyError):
        return ""  # not there, or being written


@pytest.mark.timeout(240)
def test_an_overwrite_killed_at_any_point_loses_neither_results(
    data: Path, expected: pd.DataFrame, tmp_path: Path
) -> None:
    """``--overwrite`` over a finished output of another job, SIGKILLed: before its first
    commit the earlier results are all still there; once it has committed, running the
    same command again, or the job without ``--overwrite``, finishes the new job with every
    row once and nothing of the earlier one left."""
    out = tmp_path / "out"
    earlier = write_job(tmp_path / "earlier.yaml", data, out, "local")
    spec = json.loads(earlier.read_text())
    spec["carryover"] = ["id"]  # another job: its files have no "tag"
    earlier.write_text(json.dumps(spec))
    assert load_job(str(earlier)).run().complete
    old = ledger_units(out)
    old_files = {p for e in old for p in e["parts"]}
    old_print = _fingerprint(out)
    job = write_job(tmp_path / "job.yaml", data, out, "local", delay=0.05)

    def replacing() -> bool:  # claimed: _SUCCESS goes at once; the new job not yet written
        return not (out / "_SUCCESS").exists()

    def committed_new(units: int) -> Any:
        return lambda: _fingerprint(out) not in ("", old_print) and ledger_lines(out) >= units

    runs = [  # the flag the user runs it with, and when it is killed
        ("--overwrite", replacing),
        ("--overwrite", committed_new(2)),  # the same command again
        ("", committed_new(8)),  # or the job again, without the flag: it resumes
        ("", None),  # left to finish
    ]
    for n, (flag, point) in enumerate(runs):
        proc = start_driver(job, driver_env(), *([flag] if flag else []))
        try:
            finish_or_kill(proc, point, n, timeout=120)
        finally:
            reap(proc)
        if n == 0 and _fingerprint(out) == old_print:  # nothing committed: all still there
            assert ledger_units(out) == old
            assert old_files <= {p.name for p in out.iterdir()}
        elif n == 0:  # else it committed (the earlier results go at its first commit)
            assert ledger_lines(out) >= 1, "the earlier results went before any new commit"
    check_exactly_once(out, expected)
    assert not old_files & {p.name for p in out.iterdir()}


# --------------------------------------------------------------------------- 4. Ctrl-C


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    "driver_engine", ["local", pytest.param("ray", marks=pytest.mark.ray)], ids=str
)
def test_ctrl_c_stops_promptly_keeps_the_ledger_and_says_how_to_resume(
    data: Path, expected: pd.DataFrame, tmp_path: Path, driver_engine: str
) -> None:
    out = tmp_path / "out"
    job = write_job(tmp_path / "job.yaml", data, out, driver_engine, delay=0.1)
    proc = start_driver(job, driver_env())
    try:
        assert wait_for(lambda: ledger_lines(out) >= 2, proc, timeout=150)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends: the whole process group
        began = time.monotonic()
        # Prompt: well before the rest of the job (14+ units, 5+ s of model time) could run.
        _, stderr = proc.communicate(timeout=15)
        print(f"exited {time.monotonic() - began:.1f} s after Ctrl-C")
    finally:
        left = reap(proc)
    print(f"left behind by the interrupted driver, and reaped: {left}")
    assert proc.returncode == 130, stderr
    message = " ".join(stderr.split())
    assert "interrupted" in message and "run the same command again to resume" in message
    assert "Traceback" not in message
    kept = committed(out)
    assert 2 <= len(kept) < UNITS and len(ledger_units(out)) == len(kept)
    assert not (out / "_SUCCESS").exists()

    # The resume on the local engine: a Ray run resumed on Ray is the kill-9 test's, and
    # one resumed on the other engine the conformance suite's (this saves a Ray start).
    again = write_job(tmp_path / "again.yaml", data, out, "local", delay=0.1)
    seen = tmp_path / "seen.jsonl"
    proc = start_driver(again, driver_env(CHAOS_SEEN=str(seen)))
    try:
        _, stderr = proc.communicate(timeout=150)
    finally:
        reap(proc)
    assert proc.returncode == 0, stderr
    report = final_report(out)
    assert (report["units_skipped"], report["units_done"]) == (len(kept), UNITS - len(kept))
    assert seen_units(seen) == ALL_UNITS - kept
    check_exactly_once(out, expected)


# --------------------------------------------------------------------------- 2. actor killed


def replicas(pids: Path) -> dict[int, str]:
    """Model replicas by process id, with the node each ran on (see ``SlowModel``)."""
    if not pids.exists():
        return {}
    return {int(p.name): p.read_text() for p in pids.iterdir() if p.name.isdigit()}


@pytest.mark.ray
@pytest.mark.timeout(200)
def test_a_killed_model_actor_is_replaced_and_its_work_redone(
    ray_session: Any, data: Path, expected: pd.DataFrame, tmp_path: Path
) -> None:
    out, pids = tmp_path / "out", tmp_path / "pids"
    model = chute.Model(
        "m",
        f"{HERE}:SlowModel",
        inputs=("id", "x"),
        batch_format="numpy",
        batch_size=250,
        kwargs={"delay": 0.1, "pids": str(pids)},
    )
    job = chute.Job(
        source=chute.FileSource(str(data)),
        models=(model,),
        carryover=("id", "tag"),
        output=chute.Sink(str(out)),
        engine="ray",
    )
    killed: dict[int, int] = {}  # pid -> units committed when it was killed
    spared: list[str] = []
    committed: set[str] = set()  # the units committed before the kill

    def kill_the_actor() -> None:
        if not wait_for(lambda: ledger_lines(out) >= 3 and bool(replicas(pids)), None, 150):
            return
        for pid in replicas(pids):
            name = psutil.Process(pid).name()
            if pid == os.getpid() or not name.startswith("ray::"):
                spared.append(f"{pid} {name}")  # not an actor: never kill it
                continue
            committed.update(entry["unit"] for entry in ledger_units(out))
            killed[pid] = ledger_lines(out)
            os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_the_actor, daemon=True)
    killer.start()
    report = job.run()
    killer.join(timeout=10)
    assert killed and not spared, f"no model actor was killed (found {spared})"
    assert all(lines < UNITS for lines in killed.values()), "killed only after the job ended"
    replacements = set(replicas(pids)) - set(killed)
    assert replacements, "no new actor process took over"
    assert (report.units_done, report.rows_out, report.complete) == (UNITS, ROWS, True)
    check_exactly_once(out, expected)
    # the batches the actor had in hand were computed again, the report says which units
    # they were of, and none of them had been committed
    redone = computed_again(report.events)
    assert redone and not redone & committed, (redone, committed)


# --------------------------------------------------------------------------- 3. node lost


def _name(proc: psutil.Process) -> str:
    try:
        return str(proc.name())
    except psutil.Error:
        return ""


@pytest.fixture
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LoopbackCluster, str]]:
    """A head with 2 CPUs (so that it can finish the job alone) and a worker with 2."""
    cluster = LoopbackCluster(tmp_path_factory.mktemp("ray"), head_cpus=2)
    try:
        cluster.start()
        yield cluster, cluster.add_node(cpus=2)
    finally:
        cluster.stop()


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_losing_the_worker_node_mid_job_still_completes_exactly_once(
    two_nodes: tuple[LoopbackCluster, str], data: Path, expected: pd.DataFrame, tmp_path: Path
) -> None:
    cluster, worker = two_nodes
    out, pids = tmp_path / "out", tmp_path / "pids"
    # Two replicas of half a CPU: Ray Data spreads them, one on each node; after the loss
    # both fit on the head with a CPU left for the read tasks.
    job = write_job(
        tmp_path / "job.yaml", data, out, "ray", pool=2, cpus=0.5, delay=0.15, pids=str(pids)
    )
    env = {**cluster.env, "RAY_ADDRESS": cluster.address}
    proc = start_driver(job, env)
    try:
        assert wait_for(lambda: ledger_lines(out) >= 3, proc, timeout=180)
        before = replicas(pids)
        assert worker in before.values(), f"no model actor on the worker node: {before}"
        on_worker = {_name(p) for p in cluster.processes(worker)}
        assert "ray::_Stats" not in on_worker, "chute's stats actor would die with the node"
        at_kill = ledger_lines(out)
        assert cluster.kill_node(worker) > 0
        _, stderr = proc.communicate(timeout=200)
    finally:
        reap(proc)
    assert proc.returncode == 0, stderr
    assert at_kill < UNITS, "the node was lost only after the job ended"
    after = replicas(pids)
    assert set(after) - set(before), "the lost actor was not replaced"
    assert {after[pid] for pid in set(after) - set(before)} == {HEAD_IP}
    report = final_report(out)
    assert (report["units_done"], report["units_skipped"]) == (UNITS, 0)
    assert report["stages"]["m"]["rows"] >= ROWS  # chute's stats actor survived too
    check_exactly_once(out, expected)
