"""The benchmark runs end to end, each run without Ray in a process of its own, and prints
its side-by-side tables of medians and the goals met or missed (tiny sizes; no timing
checked)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_benchmark_prints_its_table(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench.py"),
            "--workloads",
            "taxi,mlp",
            "--rows",
            "20000",
            "--repeat",
            "2",
            "--no-ray",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert done.returncode == 0, done.stderr
    for line in (
        "## taxi: 20,000 rows, medians of 2 runs",
        "## mlp: 20,000 rows, medians of 2 runs",
        "chute local / pyarrow loop",
        "## Goals (issue 14, point 1)",
        "each run below in a process of its own",
        "chute local peak ≤ 2.0× loop's",
    ):
        assert line in done.stdout
