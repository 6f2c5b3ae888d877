"""A small multi-unit job for the chaos tests, and the helpers that run and kill it.

The model is named by file path in the job file (``.../chaos_job.py:SlowModel``), so the
driver subprocess and every Ray worker import it the same way, whatever their
``PYTHONPATH``. Two settings let a test watch it from outside, each given as a model
keyword argument or, outside the job's fingerprint, as an environment variable of the
driver (which a driver's own local Ray hands to its workers; a running cluster does not):

* ``pids`` / ``CHAOS_PIDS``: a directory where each model replica creates a file named
  after its process id, holding its Ray node's address (so a test can find, and kill, an
  actor's process, and tell where it ran);
* ``seen`` / ``CHAOS_SEEN``: a file where each replica appends the units of every batch it
  scores (so a test can tell which units a run computed).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve()
ROWS_PER_UNIT = 1_000


class SlowModel:
    """A deterministic numpy model that sleeps a little per batch."""

    def __init__(
        self,
        delay: float = 0.0,
        rows_per_unit: int = ROWS_PER_UNIT,
        pids: str | None = None,
        seen: str | None = None,
    ) -> None:
        self.delay = delay
        self.rows_per_unit = rows_per_unit
        pids = pids or os.environ.get("CHAOS_PIDS")
        if pids:
            Path(pids).mkdir(parents=True, exist_ok=True)
            tmp = Path(pids) / f".{os.getpid()}"
            tmp.write_text(_node_ip())
            tmp.rename(Path(pids) / str(os.getpid()))
        self.seen = seen or os.environ.get("CHAOS_SEEN")

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids, x = batch["id"], batch["x"]
        if self.seen:
            units = sorted({int(u) for u in np.unique(ids // self.rows_per_unit)})
            with open(self.seen, "a") as f:  # one short line: an atomic append
                f.write(json.dumps(units) + "\n")
        if self.delay:
            time.sleep(self.delay)
        return {"score": np.sin(x) * 3.0 + (ids % 7), "rank": ids * 2 + 1}


def _node_ip() -> str:
    """The Ray node this replica runs on ("" outside Ray)."""
    try:
        import ray

        return str(ray.util.get_node_ip_address()) if ray.is_initialized() else ""
    except ImportError:
        return ""


METRICS: list[dict[str, Any]] = [
    {"type": "mse", "label": "x", "prediction": "m_score"},
    {"type": "mean", "column": "m_score", "by": "tag", "name": "score_by_tag"},
    {"type": "histogram", "column": "x", "bins": 8, "range": [-2, 2]},
]
"""Metrics of the chaos job: a resumed run must report exactly what an uninterrupted one does."""


def make_data(directory: Path, units: int, rows_per_unit: int = ROWS_PER_UNIT) -> Path:
    """``units`` Parquet files of ``rows_per_unit`` rows: ids are unit * rows_per_unit + row."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    for unit in range(units):
        ids = np.arange(unit * rows_per_unit, (unit + 1) * rows_per_unit, dtype=np.int64)
        table = pa.table({"id": ids, "x": rng.normal(size=rows_per_unit), "tag": ids % 3})
        pq.write_table(table, directory / f"unit-{unit:03d}.parquet")
    return directory


def write_job(
    path: Path,
    data: Path,
    out: Path,
    engine: str,
    batch_size: int = 250,
    pool: int | None = None,
    cpus: float | None = None,
    **kwargs: Any,
) -> Path:
    """A job file for :class:`SlowModel` over ``data`` writing to ``out`` (JSON is YAML)."""
    model: dict[str, Any] = {
        "name": "m",
        "fn": f"{HERE}:SlowModel",
        "inputs": ["id", "x"],
        "batch_format": "numpy",
        "batch_size": batch_size,
        "kwargs": kwargs,
    }
    if pool is not None:
        model["pool"] = pool
    if cpus is not None:
        model["resources"] = {"cpus": cpus}
    job = {
        "input": str(data),
        "carryover": ["id", "tag"],
        "models": [model],
        # A file a unit (as before files were joined): these tests kill the driver between
        # single units' commits; the chaos test's shared-files case sets its own target.
        "output": {"path": str(out), "file_rows": ROWS_PER_UNIT},
        "engine": engine,
        "metrics": METRICS,
    }
    path.write_text(json.dumps(job, indent=2))
    return path


def driver_env(**extra: str) -> dict[str, str]:
    """The environment of a driver subprocess: never joins another Ray by accident."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(extra)
    return env


def start_driver(job: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """``python -m chute run JOB -q`` in its own session (so its own Ray can be reaped)."""
    return subprocess.Popen(
        [sys.executable, "-m", "chute", "run", str(job), "-q", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_interruptible,
    )


def _interruptible() -> None:
    """Let Ctrl-C reach the driver as it would from a terminal: a shell starts background
    jobs (``.ci/run &``, ``nohup``) with SIGINT ignored, and Python keeps it ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def session_processes(sid: int) -> list[int]:
    """Process ids still alive in session ``sid`` (a driver and everything it started)."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == sid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return found


def reap(proc: subprocess.Popen[str]) -> list[str]:
    """SIGKILL the driver and whatever its session still runs; wait until all are gone.

    Returns the names of the processes that outlived the driver (a SIGKILLed driver's
    own local Ray leaves some behind)."""
    import psutil

    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=30)
    left = [psutil.Process(pid) for pid in session_processes(proc.pid) if pid != proc.pid]
    names = []
    for p in left:
        with contextlib.suppress(psutil.Error):
            names.append(p.name())
            p.kill()
    psutil.wait_procs(left, timeout=10)
    return names


def computed_again(events: list[str]) -> set[str]:
    """The units the report's one line names as computed again by Ray (a ValueError where
    there is no such line, or several)."""
    (line,) = [e for e in events if "computed again by Ray" in e]
    return set(line.split(" is written once): ", 1)[1].split(", "))


def ledger_lines(out: Path) -> int:
    path = out / "_chute" / "ledger.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def ledger_units(out: Path) -> list[dict[str, Any]]:
    """The committed entries, in the order they were appended (torn lines left out)."""
    path = out / "_chute" / "ledger.jsonl"
    if not path.exists():
        return []
    entries = []
    for line in path.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return entries


def wait_for(
    condition: Callable[[], bool], proc: subprocess.Popen[str] | None, timeout: float
) -> bool:
    """Poll ``condition`` until it holds (True) or ``proc`` exits or time runs out (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        if proc is not None and proc.poll() is not None:
            return condition()
        time.sleep(0.02)
    return False


def finish_or_kill(
    proc: subprocess.Popen[str], reached: Callable[[], bool] | None, n: int, timeout: float
) -> None:
    """Let run ``n`` finish (``reached`` is ``None``: it must exit 0), or SIGKILL it once
    ``reached`` holds (it must not have ended before)."""
    if reached is None:
        _, stderr = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, stderr
        return
    assert wait_for(reached, proc, timeout=timeout), f"run {n} never reached its kill point"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, f"run {n} ended before the kill"


def seen_units(path: Path) -> set[int]:
    """The units a run's model replicas scored (see ``CHAOS_SEEN``)."""
    if not path.exists():
        return set()
    return {u for line in path.read_text().splitlines() if line for u in json.loads(line)}
