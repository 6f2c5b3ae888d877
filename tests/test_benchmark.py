"""The benchmark runs end to end, each run without Ray in a process of its own, and prints
its side-by-side tables of medians and the goals met or missed (tiny sizes; no timing
checked)."""

from __future__ import annotations

import os
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
            "--repeat",  # one run each, no warm-up: the table is checked, not the times
            "1",
            "--warmup",
            "0",
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
        "## taxi: 20,000 rows, medians of 1 runs",
        "## mlp: 20,000 rows, medians of 1 runs",
        "chute local / pyarrow loop",
        "## Goals (issue 14, point 1)",
        "each run below in a process of its own",
        "chute local peak ≤ 2.0× loop's",
    ):
        assert line in done.stdout


@pytest.mark.timeout(120)
def test_a_variant_that_fails_in_its_process_stops_the_bench_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run in a process of its own that dies (here: a workload the bench does not know)
    ends the bench with an error naming the workload and the variant, and what the
    process printed: never a table without that run."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.setattr(os, "environ", dict(os.environ))  # the bench's defaults stay its own
    import bench

    workload = bench.Workload("nonesuch", 10, local={"chute local": lambda out: None})
    args = bench.parse_args(["--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="nonesuch/chute local failed in its process") as err:
        bench.run_isolated(workload, args)
    assert "cannot read 'nonesuch=10'" in str(err.value)  # the process's own words


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_codec_floor_prints_decode_encode_and_what_chute_adds(tmp_path: Path) -> None:
    command = [sys.executable, str(ROOT / "benchmarks" / "codec_floor.py")]
    command += ["--rows", "20000", "--repeat", "1", "--out", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=160)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "## taxi, 20,000 rows" in done.stdout
    for name in ("decode", "encode", "chute local", "pyarrow decode + encode"):
        assert f"\n{name} " in done.stdout, done.stdout
    assert "chute beyond the codecs" in done.stdout
