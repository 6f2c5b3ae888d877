"""Node-loss trials on real loopback clusters: random kills, every row checked.

Each trial starts a cluster (``ray start`` on 127.0.0.x, as ``tests/loopback_cluster.py``),
runs the job of ``tests/test_cluster_shapes.py`` (16 files × 40,000 rows, a model with
0.5 s of work a batch), SIGKILLs one worker node after a random number of committed units,
and then, as a user would, runs the same command again until it finishes (adding a node
back first when the run stopped with exit 7). It prints, per trial, the moment of the kill,
every run's exit code and seconds, the units and rows each run committed (their sum is the
input's when no committed unit was computed again), when a run planned its work again
around the lost node (and the units then in flight, which the new plan computes again),
how long after the lost node's last output Ray declared it dead, the units Ray computed
again after their rows had arrived, and whether every row is in the output exactly once.

    python benchmarks/chaos_cluster.py --trials 6
    python benchmarks/chaos_cluster.py --trials 3 --shape 0,1,1 --seed 7
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.loopback_cluster import LoopbackCluster
from tests.test_cluster_shapes import (
    FILES,
    _chute,
    _committed,
    _exactly_once,
    _finish,
    _job,
    _start,
)


def trial(root: Path, shape: list[int], kill_after: int, cpus: float | None) -> dict[str, Any]:
    work = root / "work"
    work.mkdir()
    job = _job(work, sleep=0.5, cpus=cpus)
    cluster: LoopbackCluster = _start(root / "ray", head_cpus=shape[0], workers=shape[1:])
    outcome: dict[str, Any] = {"shape": shape, "kill_after": kill_after, "runs": []}
    try:
        began = time.monotonic()
        run = _chute(job, cluster, stall=15)
        while len(_committed(work / "out")) < kill_after and run.poll() is None:
            time.sleep(0.1)
        victim = random.choice(cluster.nodes[1:])
        cluster.kill_node(victim)
        outcome["killed"] = f"{victim} at {len(_committed(work / 'out'))} units"
        for _attempt in range(4):
            code, _ = _finish(run, timeout=900)
            runs = outcome["runs"]
            assert isinstance(runs, list)
            runs.append((code, round(time.monotonic() - began, 1)))
            if code == 0:
                break
            if code == 7:
                cluster.add_node(cpus=max(shape[1:]))  # a node returns
            began = time.monotonic()
            run = _chute(job, cluster, stall=15)
        report = json.loads((work / "out" / "_chute" / "report.json").read_text())
        committed = [int(r.get("rows", 0)) for r in report.get("runs", [])]
        outcome["committed"] = committed
        outcome["units"] = [r.get("units_run") for r in report["runs"]]
        outcome["stopped"] = [r.get("stopped") for r in report["runs"]]
        outcome["redone"] = len(report.get("units_redone") or [])
        outcome["replanned"] = [  # the last run's events: the run that finished
            e.split(" (")[0].removeprefix("planned again at ") + _in_flight(e)
            for e in report.get("events", [])
            if e.startswith("planned again at ")
        ]
        outcome["lost"] = [  # how long after the node's last output Ray declared it dead
            e.removeprefix("lost node ") for e in report.get("events", []) if e.startswith("lost")
        ]
        outcome["again"] = [e for e in report.get("events", []) if "computed again by Ray" in e]
        try:
            _exactly_once(work)
            outcome["exact"] = True
        except AssertionError as exc:
            outcome["exact"] = f"NO: {exc}"
    finally:
        cluster.stop()
    return outcome


def _in_flight(line: str) -> str:
    """What a ``planned again`` line says of the units in flight, briefly: `` (3 in flight:
    2 on 127.0.0.3, 1 on 127.0.0.2)``, `` (none begun)``."""
    if ", none of them begun" in line:
        return " (none begun)"
    head, found, tail = line.partition(" of them in flight, computed again (")
    if not found:
        return ""
    return f" ({head.rsplit(' ', 1)[1]} in flight: {tail.split('): ', 1)[0]})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--shape", default="1,1", help="CPUs of the head, then each worker")
    parser.add_argument("--cpus", type=float, default=0.5, help="CPUs per model replica")
    parser.add_argument("--seed", type=int, default=18)
    args = parser.parse_args()
    random.seed(args.seed)
    shape = [int(c) for c in args.shape.split(",")]
    print(f"load average before: {', '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    print(
        "| trial | shape | kill | runs (exit, s) | stopped | units run | rows committed "
        "| units redone | planned again at | lost node (report) | computed again | once |"
    )
    print("|---:|---|---|---|---|---|---|---:|---|---|---|---|")
    for i in range(args.trials):
        root = Path(tempfile.mkdtemp(prefix="cc", dir="/tmp"))
        try:
            found = trial(root, shape, random.randint(1, FILES - 2), args.cpus)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print(
            f"| {i + 1} | {found['shape']} | {found.get('killed')} | {found['runs']} | "
            f"{found.get('stopped')} | {found.get('units')} | {found.get('committed')} | "
            f"{found.get('redone')} | {', '.join(found.get('replanned') or []) or '—'} | "
            f"{'; '.join(found.get('lost') or []) or '—'} | "
            f"{len(found.get('again') or [])} | {found.get('exact')} |",
            flush=True,
        )
    print(f"load average after: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
