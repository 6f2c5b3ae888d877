"""What pyarrow's Parquet codecs alone cost on the taxi job, beside chute's and Daft's
whole runs: the floor under any engine that reads and writes with pyarrow.

On 2 CPUs a sub-second job is bound by CPU time, not by how it is scheduled. This prints,
in CPU seconds (medians of ``--repeat`` runs, each after a warm-up in the same process):

* **decode**: reading the columns the job reads from every input file with pyarrow;
* **encode**: writing the job's output (those columns and a float32 score) with pyarrow
  and the encodings chute chooses (:func:`chute.sinks.files.parquet_options`);
* **chute local** and **Daft**: whole runs of ``bench.py``'s taxi variants, each in a
  process of its own (``bench.py --child``), as the bench measures them.

``chute beyond the codecs`` is chute's CPU less decode and encode: what chute itself
(threads, conversions, the ledger, the report) adds. Where decode + encode alone exceed
Daft's whole run, no engine built on pyarrow's Parquet can match Daft's CPU here.

    python benchmarks/codec_floor.py --out /tmp/bench-out       # 1.71 M rows, 5 runs each
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from chute.demo import CARRYOVER, TOTAL_ROWS, generate
from chute.sinks.files import parquet_options

BENCH = Path(__file__).resolve().parent / "bench.py"
INPUTS = ("passenger_count",)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """CPU and wall seconds of ``fn()`` in this process (every thread's CPU)."""
    cpu, wall = cpu_seconds(), time.perf_counter()
    fn()
    return cpu_seconds() - cpu, time.perf_counter() - wall


def decode(files: list[str]) -> list[pa.Table]:
    columns = list(dict.fromkeys([*CARRYOVER, *INPUTS]))
    return [pq.read_table(path, columns=columns) for path in files]


def scored(tables: list[pa.Table]) -> list[pa.Table]:
    """The output the job writes: the carried columns and a float32 score per row."""
    out = []
    for table in tables:
        score = np.asarray(table["passenger_count"].to_numpy(), dtype=np.float32) * 0.1
        out.append(table.select(list(CARRYOVER)).append_column("tip_score", pa.array(score)))
    return out


def encode(tables: list[pa.Table], directory: str) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    options = parquet_options(tables[0])
    for i, table in enumerate(tables):
        pq.write_table(table, os.path.join(directory, f"{i:03d}.parquet"), **options)


def whole_run(variant: str, rows: int, out: str) -> tuple[float, float]:
    """CPU and wall seconds of one measured run of the bench's taxi ``variant``."""
    command = [sys.executable, str(BENCH), "--child", f"taxi:{variant}"]
    command += ["--rows", f"taxi={rows}", "--out", out]
    env = {**os.environ, "PYTHONPATH": str(BENCH.parent)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    found = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not found:
        raise SystemExit(f"taxi/{variant} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    result = json.loads(found[-1].removeprefix("RESULT "))
    return result["cpu"], result["seconds"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(BENCH.parent.parent / "bench-out"))
    parser.add_argument("--rows", type=int, default=TOTAL_ROWS)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    files = generate(os.path.join(args.out, "data", f"taxi-{args.rows}"), args.rows)
    scratch = tempfile.mkdtemp(prefix="codec-floor-")
    try:
        tables = scored(decode(files))
        encode(tables, scratch)  # the warm-ups
        runs: dict[str, list[tuple[float, float]]] = {}
        daft = importlib.util.find_spec("daft") is not None  # the bench extra
        for _ in range(args.repeat):  # interleaved, as bench.py runs its variants
            runs.setdefault("decode", []).append(timed(lambda: decode(files)))
            runs.setdefault("encode", []).append(timed(lambda: encode(tables, scratch)))
            for variant in ("chute local", "Daft") if daft else ("chute local",):
                runs.setdefault(variant, []).append(whole_run(variant, args.rows, args.out))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    cpu = {name: statistics.median(c for c, _ in got) for name, got in runs.items()}
    wall = {name: statistics.median(w for _, w in got) for name, got in runs.items()}
    print(f"\n## taxi, {args.rows:,} rows, {os.cpu_count()} CPUs: medians of {args.repeat}\n")
    print(f"{'':32}{'CPU s':>8}{'wall s':>8}")
    for name in runs:
        print(f"{name:32}{cpu[name]:8.3f}{wall[name]:8.3f}")
    floor = cpu["decode"] + cpu["encode"]
    print(f"{'pyarrow decode + encode':32}{floor:8.3f}")
    print(f"{'chute beyond the codecs':32}{cpu['chute local'] - floor:8.3f}")
    if "Daft" in cpu:
        print(f"\npyarrow's codecs alone / Daft's whole run (CPU): {floor / cpu['Daft']:.2f}×")
    else:
        print("\nDaft is not installed (pip install -e '.[bench]'): no Daft run to compare.")


if __name__ == "__main__":
    main()
