"""Table sinks against Parquet on the demo: seconds, table commits, data files.

    python benchmarks/tables.py [--rows 1000000] [--rounds 3] [--out /tmp/chute-bench-tables]

The same job (the demo's tip model, local engine) written as Parquet files and into each
table format (examples/tables/run.py does the work and checks that every table reads back
equal to the Parquet output), each output new in every round; the demo data is generated
once, before any timing. Seconds are the median of the rounds (min-max beside it).
Commits are the table transactions chute made: completed units wait ``commit_seconds``
(5 s by default) and 2% of the run so far (up to a minute) to be committed together; the
``commit_seconds: 0`` rows commit as soon as units complete, to show what batching saves.
Files are the data files the table references (one per written part, as for Parquet).
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from chute.demo import generate

HERE = Path(__file__).resolve().parent


def _example() -> Any:
    path = HERE.parent / "examples" / "tables" / "run.py"
    spec = importlib.util.spec_from_file_location("tables_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tables_example"] = module
    spec.loader.exec_module(module)
    return module


def _clear(out: Path) -> None:
    """Every output of a round gone; the demo data kept."""
    for path in out.iterdir():
        if path.name != "taxi":
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="/tmp/chute-bench-tables")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    generate(str(out / "taxi"), args.rows)  # not timed
    example = _example()
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for _ in range(args.rounds):
        for commit_seconds, label in ((None, ""), (0.0, " (commit_seconds 0)")):
            _clear(out)
            for line in example.run(args.rows, out, commit_seconds):
                if label and line["output"] == "parquet":
                    continue
                runs[line["output"] + label].append(line)
    print("| output | rows | seconds (median) | min-max | table commits | data files |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, lines in runs.items():
        seconds = [line["seconds"] for line in lines]
        commits = (
            "-" if name == "parquet" else "/".join(sorted({str(ln["commits"]) for ln in lines}))
        )
        files = "/".join(sorted({str(line["files"]) for line in lines}))
        print(
            f"| {name} | {lines[0]['rows']:,} | {statistics.median(seconds):.2f} | "
            f"{min(seconds):.2f}-{max(seconds):.2f} | {commits} | {files} |"
        )


if __name__ == "__main__":
    main()
