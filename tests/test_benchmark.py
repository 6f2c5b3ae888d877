"""The benchmark runs end to end and prints its side-by-side table (tiny sizes; no timing)."""

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
            "1",
            "--no-ray",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert done.returncode == 0, done.stderr
    for line in ("## taxi: 20,000 rows", "## mlp: 20,000 rows", "chute local / pyarrow loop"):
        assert line in done.stdout
