"""Where a model actor runs, and whether it matters (issue 18, point 5): the same job on
loopback clusters of the same CPUs in other shapes, the actor on the head (with the
driver, the GCS and Ray Data's executor) or on a worker.

2,000 Parquet files of 500 rows, a model class of 1 CPU that records the node it ran on;
each shape runs ``chute run`` once per round, interleaved, and prints the wall time and
the rows each node computed. With ``--fused`` the model asks for no CPUs, so chute runs
it inside the read tasks on every node instead of on an actor.

    python benchmarks/placement.py --rounds 2
    python benchmarks/placement.py --rounds 2 --fused
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.loopback_cluster import LoopbackCluster

FILES, ROWS = 2_000, 500
SHAPES = ([2, 0], [0, 2], [1, 1])
"""CPUs of the head, then of the worker (0: no worker): 2 CPUs in all."""
MODEL = """
import numpy as np
import ray


class Work:
    def __call__(self, batch):
        x = np.asarray(batch["x"])
        for _ in range(2500):
            x = np.tanh(x) * 1.0001
        return {"y": x, "node": np.full(len(x), ray.util.get_node_ip_address())}
"""
JOB = """
input: data
carryover: [trip_id]
models:
  - name: m
    fn: "model:Work"
    inputs: [x]
    batch_format: numpy
    resources: {cpus: 1}
output: out
"""


def _prepare(root: Path, fused: bool) -> None:
    data = root / "data"
    data.mkdir()
    for i in range(FILES):
        ids = pa.array(range(i * ROWS, (i + 1) * ROWS), pa.int64())
        x = np.random.default_rng(i).normal(size=ROWS)
        pq.write_table(pa.table({"trip_id": ids, "x": x}), data / f"{i:04d}.parquet")
    (root / "model.py").write_text(MODEL)
    (root / "job.yaml").write_text(JOB.replace("    resources: {cpus: 1}\n", "") if fused else JOB)


def _run(root: Path, shape: list[int]) -> str:
    shutil.rmtree(root / "out", ignore_errors=True)
    cluster = LoopbackCluster(Path(tempfile.mkdtemp(prefix="pl", dir="/tmp")), shape[0]).start()
    try:
        if shape[1]:
            cluster.add_node(cpus=shape[1])
        env = {**cluster.env, "RAY_ADDRESS": cluster.address}
        began = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "chute", "run", "job.yaml", "-q"],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        wall = time.monotonic() - began
    finally:
        cluster.stop()
    if done.returncode != 0:
        return f"| {shape} | exit {done.returncode} | {done.stderr[-200:]} |"
    nodes = pq.read_table(root / "out", columns=["m_node"]).column("m_node").to_pylist()
    return f"| head {shape[0]}, worker {shape[1]} | {wall:.1f} | {dict(Counter(nodes))} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--fused", action="store_true", help="the model in the read tasks")
    parser.add_argument(
        "--shapes",
        default=";".join(",".join(map(str, shape)) for shape in SHAPES),
        help="CPUs of the head and the worker per shape: '2,0;0,2;1,1' (the default)",
    )
    args = parser.parse_args()
    shapes = [[int(c) for c in shape.split(",")] for shape in args.shapes.split(";")]
    root = Path(tempfile.mkdtemp(prefix="placement-"))
    try:
        _prepare(root, args.fused)
        print("| CPUs | seconds | rows computed on each node |\n|---|--:|---|")
        for _ in range(args.rounds):
            for shape in shapes:
                print(_run(root, shape), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
