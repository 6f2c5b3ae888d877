"""Table sinks against Parquet on the demo: seconds, table commits, data files.

    python benchmarks/tables.py [--rows 1000000] [--out /tmp/chute-bench-tables]

The same job (the demo's tip model, local engine) written once as Parquet files and once
into each table format (examples/tables/run.py does the work and checks that every table
reads back equal to the Parquet output). Commits are the table transactions chute made
(one per commit batch: completed units wait ``commit_seconds``, 5 s by default, and 2% of
the run so far, up to a minute); files are the data files the table references (one per
written part, as for Parquet). First runs: each output is new.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _example() -> object:
    path = HERE.parent / "examples" / "tables" / "run.py"
    spec = importlib.util.spec_from_file_location("tables_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tables_example"] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--out", default="/tmp/chute-bench-tables")
    args = parser.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    results = _example().run(args.rows, out.resolve())  # type: ignore[attr-defined]
    print("| output | rows | seconds | table commits | data files |")
    print("|---|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['output']} | {r['rows']:,} | {r['seconds']} | {r['commits']} | {r['files']} |")


if __name__ == "__main__":
    main()
