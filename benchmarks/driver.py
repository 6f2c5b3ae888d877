"""The driver's cost per unit on the ray engine: peak memory and CPU at many small files.

For each count N it writes N small Parquet files (4 rows each), runs ``chute run`` on the
ray engine in a child process (a local Ray of its own), and reads the child's own peak RSS
and CPU time from ``getrusage`` — the driver alone, not Ray's raylet, GCS or workers —
then checks every row is in the output exactly once. The per-unit figures are the slopes
between the counts, so the fixed cost (Python, Ray's start, chute's imports) drops out.

    python benchmarks/driver.py                          # 1,000 / 10,000 / 100,000 files
    python benchmarks/driver.py --units 1000,4000 --before /tmp/chute-before/src

``--before DIR`` runs the same counts with chute imported from DIR too (a source tree of
an older revision, e.g. ``git archive HEAD~1 src | tar -x -C /tmp/chute-before``).
A measurement, not a test: ``tests/test_driver_scale.py`` checks what a read task carries.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROWS_PER_FILE = 4
JOB = """\
input: {input}
carryover: [trip_id]
models:
  - {{name: tip, fn: chute.demo:tip_model, inputs: [passenger_count], batch_format: numpy}}
output: {output}
engine: ray
"""


def write_files(folder: Path, count: int) -> None:
    """``count`` Parquet files of ROWS_PER_FILE rows, trip ids 0 … count*ROWS_PER_FILE-1."""
    if (folder / "_done").exists():
        return
    folder.mkdir(parents=True, exist_ok=True)

    def write(i: int) -> None:
        ids = pa.array(range(i * ROWS_PER_FILE, (i + 1) * ROWS_PER_FILE), pa.int64())
        table = pa.table({"trip_id": ids, "passenger_count": pa.array([1, 2, 3, 4], pa.int64())})
        pq.write_table(table, folder / f"part-{i:07d}.parquet")

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(write, range(count)))
    (folder / "_done").write_text("")


def child(job: str, result: str) -> None:
    """Run the job in this process and write this process's own peak memory and CPU."""
    from chute.cli import main

    began = time.perf_counter()
    sys.argv = ["chute", "run", job, "-q"]
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    Path(result).write_text(
        json.dumps(
            {
                "exit": code,
                "wall_s": time.perf_counter() - began,
                "peak_mb": usage.ru_maxrss / 1024,
                "cpu_s": usage.ru_utime + usage.ru_stime,
            }
        )
    )


def measure(root: Path, count: int, src: str | None, label: str) -> dict[str, float]:
    data = root / f"files-{count}"
    write_files(data, count)
    out = root / f"out-{label}-{count}"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    job = root / f"job-{label}-{count}.yaml"
    job.write_text(JOB.format(input=data, output=out))
    result = root / f"result-{label}-{count}.json"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    if src is not None:
        env["PYTHONPATH"] = src
    command = [sys.executable, __file__, "--child", str(job), str(result)]
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    found = json.loads(result.read_text())
    ids = pq.read_table(out, columns=["trip_id"]).column("trip_id").to_pylist()
    found["exact"] = sorted(ids) == list(range(count * ROWS_PER_FILE))
    return dict(found)


def report(label: str, results: dict[int, dict[str, float]]) -> None:
    print(f"\n{label}: driver process alone (getrusage of the chute process)")
    print("| units | exit | exact | wall s | driver peak MB | driver CPU s | per unit (slope) |")
    print("|---:|---:|---|---:|---:|---:|---|")
    previous: tuple[int, dict[str, float]] | None = None
    for count, r in sorted(results.items()):
        slope = ""
        if previous is not None:
            n0, r0 = previous
            units = count - n0
            slope = (
                f"{(r['peak_mb'] - r0['peak_mb']) * 2**20 / units:,.0f} B, "
                f"{(r['cpu_s'] - r0['cpu_s']) * 1000 / units:.2f} ms"
            )
        print(
            f"| {count:,} | {r['exit']} | {r['exact']} | {r['wall_s']:.1f} | "
            f"{r['peak_mb']:,.0f} | {r['cpu_s']:.1f} | {slope} |"
        )
        previous = (count, r)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", default="1000,10000,100000")
    parser.add_argument("--out", default="bench-out/driver")
    parser.add_argument("--before", help="a src/ directory of an older chute to compare")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    root = Path(args.out).resolve()
    root.mkdir(parents=True, exist_ok=True)
    counts = [int(n) for n in args.units.split(",")]
    print(f"load average before: {os.getloadavg()}")
    variants = [("this tree", None)] + ([("before", args.before)] if args.before else [])
    for label, src in variants:
        tag = "now" if src is None else "before"
        report(label, {n: measure(root, n, src, tag) for n in counts})
    print(f"\nload average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
