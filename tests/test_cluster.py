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
    """A two-node Ray cluster in its own processes (``ray start``): a head without CPUs, so
    every task and actor runs on the second node, a process tree of its own."""
    cluster = LoopbackCluster(tmp_path_factory.mktemp("ray-head"), head_cpus=0).start()
    try:
        cluster.add_node(cpus=2)
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


SCORER = """
import os

import ray

from features import fare_per_mile  # a sibling module: the whole directory ships

HERE = os.path.dirname(os.path.abspath(__file__))


class Scorer:
    def __init__(self):
        with open(os.path.join(HERE, "threshold.txt")) as f:  # a data file beside the code
            self.threshold = float(f.read())
        self.node = ray.util.get_node_ip_address()

    def __call__(self, batch):
        rate = fare_per_mile(batch["fare_amount"], batch["trip_distance"])
        return {"high": rate > self.threshold, "node": [self.node] * len(rate)}
"""

FEATURES = """
import numpy as np


def fare_per_mile(fare, miles):
    return np.asarray(fare) / np.maximum(np.asarray(miles), 0.1)
"""

LOCAL_CODE_JOB = """
input: ../data
carryover: [trip_id]
models:
  - name: fare
    fn: scorer:Scorer
    inputs: [fare_amount, trip_distance]
    batch_format: numpy
    batch_size: 2000
    pool: 1
output: ../out
"""


@pytest.mark.timeout(400)
@pytest.mark.parametrize("ship", [True, False], ids=["shipped", "working_dir-null"])
def test_a_job_whose_model_is_a_local_module_ships_its_directory_to_the_cluster(
    tmp_path: Path, cluster: LoopbackCluster, ship: bool
) -> None:
    """The cluster's nodes run in another directory and cannot import the job's module
    unless Ray ships the job's directory: the driver too runs from elsewhere."""
    generate(str(tmp_path / "data"), total=60_000)
    code = tmp_path / "job"
    code.mkdir()
    (code / "scorer.py").write_text(SCORER)
    (code / "features.py").write_text(FEATURES)
    (code / "threshold.txt").write_text("2.5")
    opt_out = "" if ship else "runtime_env: {working_dir: null}\n"
    (code / "job.yaml").write_text(LOCAL_CODE_JOB + opt_out)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in cluster.env.items() if k != "RAY_ADDRESS"}
    command = ["run", str(code / "job.yaml"), "-q", "--address", cluster.address]
    run = subprocess.run(
        [sys.executable, "-m", "chute", *command],
        capture_output=True,
        text=True,
        env=env,
        cwd=elsewhere,
        timeout=300,
    )
    if not ship:  # the test can fail: without shipping, nothing finds the module
        assert run.returncode == 2
        assert "cannot import 'scorer:Scorer': no module named 'scorer'" in run.stderr
        return
    assert run.returncode == 0, run.stderr
    result = pd.read_parquet(tmp_path / "out")
    taxi = pd.read_parquet(tmp_path / "data").set_index("trip_id")
    assert sorted(result.trip_id) == list(range(60_000))
    rate = taxi.fare_amount / taxi.trip_distance.clip(lower=0.1)
    expected = (rate > 2.5).loc[result.trip_id].to_numpy()
    assert (result.fare_high.to_numpy() == expected).all()
    # The head has no CPUs: the model ran on the second node, which imported the module.
    assert set(result.fare_node) == {"127.0.0.3"}


@pytest.mark.timeout(180)
def test_a_directory_too_big_to_ship_is_a_clear_error_before_anything_is_written(
    tmp_path: Path,
) -> None:
    """Ray refuses a working_dir package over its limit (lowered here to 1 MB, as the real
    512 MiB would take long to fill): chute names the fix and writes nothing."""
    generate(str(tmp_path / "data"), total=1_200)
    code = tmp_path / "job"
    code.mkdir()
    (code / "scorer.py").write_text(SCORER)
    (code / "features.py").write_text(FEATURES)
    (code / "threshold.txt").write_text("2.5")
    (code / "weights.bin").write_bytes(os.urandom(1_500_000))  # incompressible
    (code / "job.yaml").write_text(LOCAL_CODE_JOB)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_max_grpc_message_size"] = "1000000"
    run = subprocess.run(
        [sys.executable, "-m", "chute", "run", str(code / "job.yaml"), "--engine", "ray", "-q"],
        capture_output=True,
        text=True,
        env=env,
        timeout=150,
    )
    message = " ".join(run.stderr.split())
    assert run.returncode == 2, run.stderr
    assert "cannot set up the job's runtime_env on the workers" in message
    assert "exceeds the maximum size" in message and "excludes" in message
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "out").exists()


def test_a_ray_started_before_the_job_keeps_its_runtime_env_and_says_so(
    ray_session: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from chute.engines.ray import init_ray

    with caplog.at_level("WARNING", logger="chute"):
        shipped = init_ray(None, False, {"working_dir": str(tmp_path)})
    assert shipped is None  # file targets stay absolute: nothing was shipped
    assert "runtime_env" in caplog.text and str(tmp_path) in caplog.text
