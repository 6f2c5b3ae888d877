"""``chute validate`` knows everything that can be known before compute, and ``chute run``
refuses the same job before it writes anything into the output (chute.preflight)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from chute.cli import main
from chute.demo import generate
from chute.engines.resources import local_gpus
from chute.ledger import Ledger

JOB = """\
input: {path: data/taxi/, format: parquet}
carryover: [trip_id, pickup_at]
models:
  - name: tip
    fn: chute.demo:tip_model
    inputs: [passenger_count]
    batch_format: numpy
output: {path: out/tips/, format: parquet}
"""


@pytest.fixture(scope="module")
def taxi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("validate-data") / "taxi"
    generate(str(data), total=1_200)
    return data


@pytest.fixture
def job_dir(tmp_path: Path, taxi: Path) -> Path:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "taxi").symlink_to(taxi)
    (tmp_path / "job.yaml").write_text(JOB)
    return tmp_path


def invoke(*args: str) -> tuple[int, str]:
    """Exit code and output, with rich's line wrapping undone."""
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, " ".join(result.output.split())


def edit(job_dir: Path, old: str, new: str) -> str:
    text = (job_dir / "job.yaml").read_text()
    assert old in text
    (job_dir / "job.yaml").write_text(text.replace(old, new))
    return str(job_dir / "job.yaml")


CASES = [
    pytest.param(
        "fn: chute.demo:tip_model",
        "fn: my_model:tip_model",
        2,
        [
            "model 'tip': fn: cannot import 'my_model:tip_model': no module named 'my_model'",
            "'module:name', the module imported from sys.path",
            "'file.py:name', a file relative to the job file",
        ],
        id="fn-module-missing",
    ),
    pytest.param(
        "fn: chute.demo:tip_model",
        "fn: chute.demo:tip_modle",
        2,
        ["has no attribute 'tip_modle'. Did you mean 'tip_model'?"],
        id="fn-attribute-misspelt",
    ),
    pytest.param(
        "fn: chute.demo:tip_model",
        "fn: chute.demoo:tip_model",
        2,
        ["no module named 'chute.demoo' on sys.path. Did you mean 'chute.demo'?"],
        id="fn-module-misspelt",
    ),
    pytest.param(
        "fn: chute.demo:tip_model",
        "fn: tip_modle.py:tip_model",
        2,
        ["the file", "tip_modle.py does not exist. Did you mean", "tip_model.py'?"],
        id="fn-file-misspelt",
    ),
    pytest.param(
        "batch_format: numpy",
        f"batch_format: numpy\n    resources: {{cpus: {(os.cpu_count() or 1) + 1}}}",
        6,
        [f"asks for {(os.cpu_count() or 1) + 1} CPUs per replica but this machine has"],
        id="cpus-over-the-machine",
    ),
    pytest.param(  # validate said it fit: the local engine neither checked nor used it
        "batch_format: numpy",
        "batch_format: numpy\n    resources: {memory: 100TiB}",
        6,
        ["asks for 100 TiB of memory (1 replica(s) of 100 TiB) but this machine has"],
        id="memory-over-the-machine",
    ),
    pytest.param(
        "data/taxi/",
        "data/taxii/",
        3,
        ["data/taxii' does not exist. Did you mean", "data/taxi'?"],
        id="input-misspelt",
    ),
    pytest.param(
        "inputs: [passenger_count]",
        "inputs: [passenger_count\n",
        2,
        ["the '[' opened at line 6, column 13 is never closed", "inputs: [passenger_count ^"],
        id="yaml-bracket-left-open",
    ),
    pytest.param(
        "carryover: [trip_id, pickup_at]",
        "carryover: [trip_id, pickup_at]\nmetrics:\n  - {type: mean, column: tip_amout}",
        2,
        ["metrics: column(s) 'tip_amout' not found", "Did you mean 'tip_amount'?"],
        id="metric-column-misspelt",
    ),
]


@pytest.mark.timeout(120)
def test_a_replica_over_what_a_local_ray_offers_is_refused_before_ray_starts(
    job_dir: Path,
) -> None:
    """A local Ray offers what its object store leaves of the free memory: ``validate``
    compared with the machine's, passed, and the run then refused (after starting Ray)."""
    pytest.importorskip("ray")
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    asked = int(machine * 0.9)  # fits the machine, never a local Ray's 70% of what is free
    memory = f"batch_format: numpy\n    resources: {{memory: {asked}}}"
    job = edit(job_dir, "batch_format: numpy", memory)
    job = edit(job_dir, "output:", "engine: ray\noutput:")
    for command in (["validate", job], ["run", job, "-q"]):  # a process without a Ray yet
        env = {**os.environ, "COLUMNS": "200"}
        done = subprocess.run(
            [sys.executable, "-m", "chute", *command],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        out = " ".join((done.stdout + done.stderr).split())
        assert done.returncode == 6, out
        assert "but a local Ray (what its object store leaves of the memory free now) has" in out
        assert not (job_dir / "out").exists(), f"{command[0]} wrote into the output"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("old", "new", "code", "said"), CASES)
def test_validate_and_run_refuse_before_writing(
    job_dir: Path, old: str, new: str, code: int, said: list[str]
) -> None:
    (job_dir / "tip_model.py").write_text("def tip_model(batch):\n    return batch\n")
    job = edit(job_dir, old, new)
    for command in (["validate", job], ["run", job, "-q"]):
        exit_code, out = invoke(*command)
        assert exit_code == code, out
        for text in said:
            assert text in out, out
        assert not (job_dir / "out").exists(), f"{command[0]} wrote into the output"


@pytest.mark.timeout(60)
@pytest.mark.skipif(local_gpus() > 0, reason="this machine has a GPU")
def test_gpus_the_machine_lacks(job_dir: Path) -> None:
    job = edit(job_dir, "batch_format: numpy", "batch_format: numpy\n    resources: {gpus: 1}")
    for command in (["validate", job], ["run", job, "-q"]):
        exit_code, out = invoke(*command)
        assert exit_code == 6, out
        assert "asks for 1 GPU(s)" in out and "this machine has 0" in out
        assert not (job_dir / "out").exists()


@pytest.mark.timeout(60)
def test_an_output_that_is_a_file(job_dir: Path) -> None:
    (job_dir / "out").write_text("not a directory")
    job = edit(job_dir, "out/tips/", "out")
    for command in (["validate", job], ["run", job, "-q"]):
        exit_code, out = invoke(*command)
        assert exit_code == 5, out
        assert "is a file; give a directory" in out
    assert (job_dir / "out").read_text() == "not a directory"


@pytest.mark.timeout(120)
def test_an_output_of_another_job_or_run(job_dir: Path) -> None:
    job = str(job_dir / "job.yaml")
    assert invoke("run", job, "-q")[0] == 0
    exit_code, out = invoke("validate", job)
    assert exit_code == 0, out
    assert "holds 12 committed unit(s) of this job: resumes" in out
    with Ledger.claim(str(job_dir / "out" / "tips")):  # a live run owns it
        exit_code, out = invoke("validate", job)
        assert exit_code == 5, out
        assert "is in use by another chute run: pid" in out
    edit(job_dir, "carryover: [trip_id, pickup_at]", "carryover: [trip_id]")
    exit_code, out = invoke("validate", job)
    assert exit_code == 5, out
    assert "holds the results of a different job (changed: carryover)" in out
    assert invoke("validate", job, "--overwrite")[0] == 0


@pytest.mark.timeout(60)
def test_validate_says_what_it_checked(job_dir: Path) -> None:
    exit_code, out = invoke("validate", str(job_dir / "job.yaml"))
    assert exit_code == 0, out
    for text in (
        "12 unit(s), 1,200 rows, 1 model(s)",
        "code imports: chute.demo:tip_model",
        f"resources fit this machine ({os.cpu_count():,} CPUs)",
        "pools: tip 1 replica(s)",  # a function: every replica would call what it calls
        "out/tips is new",
        "is valid.",
    ):
        assert text in out, out


@pytest.mark.timeout(60)
def test_a_remote_cluster_may_have_code_this_machine_lacks(
    job_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from chute.config import load_job
    from chute.preflight import check_code

    edit(job_dir, "fn: chute.demo:tip_model", "fn: cluster_only_package:Model")
    job = load_job(str(job_dir / "job.yaml"), address="ray://head:10001")
    assert check_code(job, remote=True) == "code imports: cluster_only_package:Model"
    assert "the cluster may have it" in caplog.text
