"""Where the driver's memory per unit goes: chute's own Python objects against the rest.

Runs the job of ``driver.py`` (N Parquet files of 4 rows) in this process under
``tracemalloc`` and prints the Python heap at the end and at its peak, per unit, with the
lines that hold the most. What ``tracemalloc`` does not see (Ray's C++ core worker, Arrow
buffers) is the difference from the peak RSS that ``driver.py`` measures.

    python benchmarks/driver_heap.py --units 10000 --engine ray
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import driver

import chute
from chute.demo import tip_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=10_000)
    parser.add_argument("--engine", default="ray", choices=["local", "ray"])
    parser.add_argument("--out", default="/tmp/chute-driver-heap")
    args = parser.parse_args()
    data = Path(args.out) / f"in-{args.units}"
    driver.write_files(data, args.units)
    tracemalloc.start(25)
    model = chute.Model("tip", tip_model, inputs=["passenger_count"], batch_format="numpy")
    job = chute.Job(
        chute.FileSource(str(data)),
        (model,),
        output=chute.Sink(str(Path(args.out) / f"out-{args.units}")),
        carryover=("trip_id",),
        engine=args.engine,
    )
    began = time.monotonic()
    job.run(overwrite=True)
    now, peak = tracemalloc.get_traced_memory()
    print(
        f"{args.units:,} units on {args.engine}: {time.monotonic() - began:.1f} s; Python heap "
        f"{now / 1e6:.1f} MB at the end ({now / args.units:,.0f} B a unit), "
        f"{peak / 1e6:.1f} MB at its peak ({peak / args.units:,.0f} B a unit)"
    )
    for stat in tracemalloc.take_snapshot().statistics("lineno")[:12]:
        print(f"  {stat}")


if __name__ == "__main__":
    main()
