"""A job sent to a Ray cluster by address: a real head node started on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from chute.demo import generate
from tests.loopback_cluster import LoopbackCluster

pytestmark = [pytest.mark.slow, pytest.mark.ray]

JOB = """
input: taxi
carryover: [trip_id]
models:
  - {name: tip, fn: chute.demo:tip_model, inputs: [passenger_count], batch_format: numpy}
output: out
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackCluster]:
    """A one-node Ray cluster in its own processes, started with ``ray start --head``."""
    cluster = LoopbackCluster(tmp_path_factory.mktemp("ray-head"), head_cpus=2).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _chute(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chute", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )


@pytest.mark.timeout(400)
def test_a_job_runs_unchanged_on_a_cluster_given_by_address(
    tmp_path: Path, cluster: LoopbackCluster
) -> None:
    generate(str(tmp_path / "taxi"), total=30_000)
    (tmp_path / "job.yaml").write_text(JOB)
    env = {k: v for k, v in cluster.env.items() if k != "RAY_ADDRESS"}
    plan = _chute("plan", str(tmp_path / "job.yaml"), "--address", cluster.address, env=env)
    assert plan.returncode == 0, plan.stderr
    assert "a cluster address was given" in plan.stdout
    run = _chute(
        "run", str(tmp_path / "job.yaml"), "-q", env={**env, "RAY_ADDRESS": cluster.address}
    )
    assert run.returncode == 0, run.stderr
    assert "ray (a cluster address was given" in " ".join(run.stdout.split())
    result = pd.read_parquet(tmp_path / "out")
    assert sorted(result.trip_id) == list(range(30_000))
    taxi = pd.read_parquet(tmp_path / "taxi")
    assert result.tip_score.sum() == (taxi.passenger_count >= 2).sum()


@pytest.mark.timeout(120)
def test_an_unreachable_address_is_a_clear_error(tmp_path: Path) -> None:
    generate(str(tmp_path / "taxi"), total=1_200)
    (tmp_path / "job.yaml").write_text(JOB)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    run = _chute("run", str(tmp_path / "job.yaml"), "--address", "127.0.0.9:1", env=env)
    assert run.returncode == 2
    assert "cannot connect to the Ray cluster at '127.0.0.9:1'" in " ".join(run.stderr.split())
    assert "Traceback" not in run.stderr
