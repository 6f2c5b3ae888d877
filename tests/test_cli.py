"""The command line, driven through click's CliRunner, on real files."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from chute.cli import main
from chute.demo import TOTAL_ROWS, generate

JOB = """
input: {path: taxi, format: parquet}
carryover: [trip_id, passenger_count]
models:
  - name: tip
    fn: chute.demo:tip_model
    inputs: [passenger_count]
    batch_format: numpy
    batch_size: 5000
  - name: double
    fn: models.py:double
    inputs: [tip_score]
output: {path: out}
"""

MODELS = """
import numpy as np

def double(batch):
    return np.asarray(batch["tip_score"]) * 2
"""


@pytest.fixture(scope="module")
def taxi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("taxi-data") / "taxi"
    generate(str(data), total=24_000)
    return data


@pytest.fixture
def job_dir(tmp_path: Path, taxi: Path) -> Path:
    (tmp_path / "taxi").symlink_to(taxi)
    (tmp_path / "job.yaml").write_text(JOB)
    (tmp_path / "models.py").write_text(MODELS)
    return tmp_path


def invoke(*args: str) -> tuple[int, str]:
    """Exit code and output, with rich's line wrapping undone."""
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, " ".join(result.output.split())


def listing(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.timeout(120)
def test_run_writes_every_row_with_chained_models(job_dir: Path) -> None:
    code, out = invoke("run", str(job_dir / "job.yaml"), "-q")
    assert code == 0, out
    result = pd.read_parquet(job_dir / "out").sort_values("trip_id")
    assert list(result.columns) == ["trip_id", "passenger_count", "tip_score", "double"]
    assert len(result) == 24_000
    assert result.trip_id.tolist() == list(range(24_000))
    assert (result.double == 2 * (result.passenger_count >= 2)).all()
    assert (job_dir / "out" / "_SUCCESS").exists()
    assert (job_dir / "out" / "_chute" / "report.json").exists()
    assert "rows in / out" in out


@pytest.mark.timeout(60)
def test_run_from_another_directory_resolves_paths_against_the_job_file(
    job_dir: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    code, out = invoke("run", str(job_dir / "job.yaml"), "-q")
    assert code == 0, out
    assert (job_dir / "out" / "_SUCCESS").exists()


@pytest.mark.timeout(60)
def test_overrides_replace_input_output_batch_size_and_pool(job_dir: Path, taxi: Path) -> None:
    first = sorted(taxi.glob("*.parquet"))[0]
    code, out = invoke(
        "run",
        str(job_dir / "job.yaml"),
        "-q",
        "--input",
        str(first),
        "--output",
        str(job_dir / "other"),
        "--batch-size",
        "1000",
        "--pool",
        "2",
    )
    assert code == 0, out
    assert len(pd.read_parquet(job_dir / "other")) == pq.read_metadata(first).num_rows
    assert not (job_dir / "out").exists()


@pytest.mark.timeout(60)
def test_limit_prints_rows_and_writes_nothing(job_dir: Path) -> None:
    code, out = invoke("run", str(job_dir / "job.yaml"), "--limit", "7")
    assert code == 0, out
    assert "first rows of 7" in out
    assert "tip_score" in out
    assert not (job_dir / "out").exists()


@pytest.mark.timeout(60)
def test_validate_and_plan_run_nothing(job_dir: Path) -> None:
    code, out = invoke("validate", str(job_dir / "job.yaml"))
    assert code == 0 and "is valid" in out
    code, out = invoke("plan", str(job_dir / "job.yaml"))
    assert code == 0, out
    assert "12 unit(s), 24,000 rows" in out
    assert "parquet at " in out  # what the input is
    assert "local" in out and "tip" in out and "double" in out
    assert "chute.demo:tip_model" in " ".join(out.split()).replace(" ", "")  # what it runs
    code, out = invoke("plan", str(job_dir / "job.yaml"), "--engine", "ray")
    assert code == 0, out
    assert "ray" in out and "a local Ray on this machine" in out
    assert not (job_dir / "out").exists()


@pytest.mark.timeout(60)
def test_status_shows_progress_of_a_location(job_dir: Path) -> None:
    (job_dir / "out").mkdir()
    code, out = invoke("status", str(job_dir / "out"))
    assert code == 5 and "holds no chute results" in out
    invoke("run", str(job_dir / "job.yaml"), "-q")
    code, out = invoke("status", str(job_dir / "out"))
    assert code == 0, out
    assert "12 of 12" in out and "24,000" in out and "yes" in out
    assert "rows failed │ 0" in out and "inputs skipped │ 0" in out


BAD_JOBS = [
    pytest.param(
        "enigne: local\n", "enigne: unknown key. Did you mean 'engine'?", 2, id="unknown-key"
    ),
    pytest.param(
        "models:\n  - {name: tip, fn: chute.demo:tip_model, resources: {gpu: 1}}\n",
        "models[0].resources.gpu: unknown key. Did you mean 'gpus'?",
        2,
        id="nested-unknown-key",
    ),
    pytest.param(
        "models:\n  - {name: tip, fn: chute.demo:tip_model, batch_size: 0}\n",
        "batch size must be > 0",
        2,
        id="zero-batch-size",
    ),
    pytest.param(
        "models:\n  - {name: tip, fn: chute.demo:tip_model, pool: {min: 0}}\n",
        "models[0].pool.min: Input should be greater than or equal to 1",
        2,
        id="bad-pool",
    ),
    pytest.param(
        "models:\n  - {name: tip, fn: chute.demo:tip_model, inputs: [pasenger_count]}\n",
        "Did you mean 'passenger_count'?",
        2,
        id="misspelt-column",
    ),
    pytest.param("carryover: [trip]\n", "Did you mean 'trip_id'?", 2, id="missing-carryover"),
    pytest.param("input: nowhere/\n", "does not exist", 3, id="missing-input"),
    pytest.param("models: [\n", "not valid YAML at line", 2, id="yaml-syntax"),
    # the last output: won in silence, and the results went elsewhere
    pytest.param("output: elsewhere\n", "the key 'output' is given twice", 2, id="key-twice"),
]


@pytest.mark.parametrize(("patch", "message", "code"), BAD_JOBS)
@pytest.mark.timeout(60)
def test_bad_jobs_fail_before_compute_and_touch_nothing(
    job_dir: Path, patch: str, message: str, code: int
) -> None:
    assert invoke("run", str(job_dir / "job.yaml"), "-q")[0] == 0
    before = listing(job_dir / "out")
    text = JOB
    key = patch.split(":", 1)[0]
    if key in ("models", "carryover", "input"):
        text = "\n".join(
            line
            for line in JOB.splitlines()
            if not line.startswith(key) and not (key == "models" and line.startswith("  "))
        )
    (job_dir / "job.yaml").write_text(text + "\n" + patch)
    exit_code, out = invoke("run", str(job_dir / "job.yaml"), "-q")
    assert exit_code == code, out
    assert message in out
    assert listing(job_dir / "out") == before


@pytest.mark.timeout(60)
def test_an_output_holding_another_job_is_refused_and_kept(job_dir: Path) -> None:
    assert invoke("run", str(job_dir / "job.yaml"), "-q")[0] == 0
    before = listing(job_dir / "out")
    (job_dir / "job.yaml").write_text(JOB.replace("trip_id, passenger_count", "trip_id"))
    code, out = invoke("run", str(job_dir / "job.yaml"), "-q")
    assert code == 5, out
    assert "different job" in out and "carryover" in out and "--overwrite" in out
    assert listing(job_dir / "out") == before
    code, out = invoke("run", str(job_dir / "job.yaml"), "-q", "--overwrite")
    assert code == 0, out
    assert list(pd.read_parquet(job_dir / "out").columns) == ["trip_id", "tip_score", "double"]


@pytest.mark.timeout(60)
def test_an_output_holding_foreign_files_is_refused(job_dir: Path) -> None:
    (job_dir / "out").mkdir()
    (job_dir / "out" / "precious.csv").write_text("a,b\n1,2\n")
    code, out = invoke("run", str(job_dir / "job.yaml"), "-q")
    assert code == 5, out
    assert "did not write" in out
    assert (job_dir / "out" / "precious.csv").read_text() == "a,b\n1,2\n"


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("engine", ["local", pytest.param("ray", marks=pytest.mark.ray)])
def test_demo_scores_every_trip_once(
    tmp_path_factory: pytest.TempPathFactory, engine: str, request: pytest.FixtureRequest
) -> None:
    if engine == "ray":
        request.getfixturevalue("ray_session")
    directory = tmp_path_factory.getbasetemp() / "demo"
    code, out = invoke("demo", "--dir", str(directory), "--engine", engine)
    assert code == 0, out
    taxi = pd.read_parquet(directory / "taxi", columns=["trip_id", "passenger_count"])
    scores = pd.read_parquet(directory / "tip-scores")
    assert len(taxi) == TOTAL_ROWS == len(scores)
    assert scores.trip_id.is_unique
    assert set(scores.trip_id) == set(taxi.trip_id)
    assert scores.tip_score.sum() == (taxi.passenger_count >= 2).sum()
    assert "1,710,629 / 1,710,629" in out
    assert len(os.listdir(directory / "taxi")) == 12


@pytest.mark.timeout(60)
def test_report_prints_a_run_again_and_writes_its_html(job_dir: Path) -> None:
    (job_dir / "out").mkdir()
    code, out = invoke("report", str(job_dir / "out"))
    assert code == 5 and "holds no report yet" in out
    assert invoke("run", str(job_dir / "job.yaml"), "-q")[0] == 0
    html = job_dir / "out" / "_chute" / "report.html"
    html.unlink()  # every run writes it (plain SVG, no plotting library): `report` rewrites it
    code, out = invoke("report", str(job_dir / "out"))
    assert code == 0, out
    assert "rows in / out │ 24,000 / 24,000" in out and "report.html" in out
    page = html.read_text()
    assert "rows written, cumulative" in page and "<svg" in page


@pytest.mark.timeout(120)
def test_status_and_report_say_what_changed_since_the_last_report(job_dir: Path) -> None:
    """After a run's report: the job file changed (status said 'finished yes' for an
    output `chute run` refused), a run killed before its report (report reprinted the old
    totals as current), an --overwrite that stopped (report said complete without _SUCCESS),
    and a run writing the output now (status said 'run the job again')."""
    import json

    from chute.lease import Lease
    from chute.sinks import output_filesystem

    spec, out = job_dir / "job.yaml", job_dir / "out"
    assert invoke("run", str(spec), "-q")[0] == 0
    code, text = invoke("status", str(spec))
    assert code == 0 and "another job's results" not in text and "since this report" not in text

    report = out / "_chute" / "report.json"
    data = json.loads(report.read_text())
    data["totals"]["units"] = 9  # as a run killed after 3 more commits leaves it
    report.write_text(json.dumps(data))
    code, text = invoke("report", str(out))
    assert code == 0 and "the ledger holds 12 committed units against this report's 9" in text
    assert "the ledger holds 12" in (out / "_chute" / "report.html").read_text()

    (job_dir / "models.py").write_text(MODELS + "\n# an edit\n")
    code, text = invoke("status", str(spec))
    assert code == 0 and "another job's results than the job file's (changed:" in text

    (job_dir / "failing.py").write_text("def broken(batch):\n    raise ValueError\n")
    failing = spec.read_text().replace("models.py:double", "failing.py:broken")
    (job_dir / "other.yaml").write_text(failing)
    assert invoke("run", str(job_dir / "other.yaml"), "-q", "--overwrite")[0] != 0
    assert not (out / "_SUCCESS").exists()
    code, text = invoke("report", str(out))
    assert code == 0 and "the output is no longer marked finished" in text

    fs, root = output_filesystem(str(out))
    lease = Lease.acquire(fs, f"{root}/_chute", str(out))
    try:
        code, text = invoke("status", str(out))
        assert code == 0 and "no — a run is writing it now" in text, text
        assert "began and stopped" not in text
        before = report.read_bytes()
        code, text = invoke("report", str(out))
        assert code == 0 and "a run is writing this output now" in text, text
        assert report.read_bytes() == before  # that run's report is its own to write
    finally:
        lease.release()


@pytest.mark.timeout(120)
def test_limit_says_how_many_rows_failed_and_a_newer_report_still_prints(job_dir: Path) -> None:
    """--limit printed the rows that passed and nothing of those quarantined; a report.json
    with a stage field this chute does not know (a newer chute's) was a traceback."""
    import json

    (job_dir / "odd.py").write_text(
        "import numpy as np\n\ndef odd(batch):\n"
        "    s = np.asarray(batch['tip_score'])\n"
        "    if len(s) == 1 and int(batch['trip_id'][0]) % 2:\n        raise ValueError('odd')\n"
        "    if len(s) > 1 and (np.asarray(batch['trip_id']) % 2).any():\n"
        "        raise ValueError('odd')\n    return s\n"
    )
    text = (job_dir / "job.yaml").read_text().replace("models.py:double", "odd.py:odd")
    text = text.replace(
        "inputs: [tip_score]", "inputs: [tip_score, trip_id]\n    on_error: quarantine"
    )
    (job_dir / "odd.yaml").write_text(text + "max_failed_fraction: 1.0\n")
    code, out = invoke("run", str(job_dir / "odd.yaml"), "--limit", "20")
    assert code == 0, out
    assert "first rows of 10, 10 failed" in out and "10 of the rows tried failed" in out

    assert invoke("run", str(job_dir / "job.yaml"), "-q")[0] == 0
    report = job_dir / "out" / "_chute" / "report.json"
    data = json.loads(report.read_text())
    for stage in data["stages"].values():
        stage["a_newer_field"] = 1
    report.write_text(json.dumps(data))
    code, out = invoke("report", str(job_dir / "out"))
    assert code == 0 and "rows in / out │ 24,000 / 24,000" in out, out


@pytest.mark.timeout(60)
def test_a_path_that_does_not_exist_is_named_so(tmp_path: Path) -> None:
    """status and report said 'holds no chute results' / 'the run has not committed
    anything' of a mistyped folder or job file."""
    for command in ("status", "report"):
        code, out = invoke(command, str(tmp_path / "nope"))
        assert code == 5 and "does not exist: give the output location of a run" in out
        code, out = invoke(command, str(tmp_path / "nope.yaml"))
        assert code == 2 and "the job file" in out and "does not exist" in out


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("models", "message"),
    [
        (
            "[{name: a, fn: 'models.py:double', inputs: [b_tip]}, "
            "{name: b, fn: chute.demo:tip_model, inputs: [passenger_count]}]",
            "model 'a' reads 'b_tip', which model 'b' makes, but 'b' comes after it",
        ),
        (
            "[{name: t, fn: chute.demo:tip_model, inputs: [passenger_count], pool: true}]",
            "models[0].pool: Input should be a valid dictionary",
        ),
    ],
    ids=["chained-out-of-order", "pool-true"],
)
def test_a_job_file_mistake_is_named(job_dir: Path, models: str, message: str) -> None:
    """A model listed before the one whose output it reads got 'not found, did you mean';
    `pool: true` was taken as a pool of one."""
    (job_dir / "bad.yaml").write_text(f"input: taxi\nmodels: {models}\noutput: out\n")
    code, out = invoke("validate", str(job_dir / "bad.yaml"))
    assert code == 2 and message in out, out


def _model_only_job(folder: Path, input_: str, fmt: str = "parquet", carry: str = "[]") -> Path:
    (folder / "models.py").write_text(MODELS)
    job = folder / "job.yaml"
    job.write_text(
        f"input: {input_}\ncarryover: {carry}\nmodels:\n  - name: double\n"
        f"    fn: models.py:double\n    inputs: [tip_score]\noutput: {{path: out, format: {fmt}}}\n"
    )
    return job


@pytest.mark.timeout(60)
def test_an_empty_csv_is_named_as_empty(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "rows.csv").write_bytes(b"")
    for where in ("in", "in/rows.csv"):
        code, out = invoke("validate", str(_model_only_job(tmp_path, where)))
        assert code == 3, out
        assert f"input file '{tmp_path / 'in' / 'rows.csv'}' is empty (0 bytes)" in out
        assert "no input files" not in out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", ["validate", "plan", "run"])
def test_a_list_column_sent_to_csv_is_refused_before_any_compute(
    tmp_path: Path, command: str
) -> None:
    (tmp_path / "in").mkdir()
    table = pa.table({"tip_score": [0.5, 1.0], "emb": [[1.0, 2.0], [3.0, 4.0]]})
    pq.write_table(table, tmp_path / "in" / "a.parquet")
    job = _model_only_job(tmp_path, "in", fmt="csv", carry="[emb, tip_score]")
    code, out = invoke(command, str(job))
    assert code == 2, out
    assert "column(s) 'emb' (list<" in out
    assert "Write Parquet or JSON Lines instead" in out
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "kind", [pa.binary(), pa.large_binary(), pa.binary(2)], ids=["binary", "large", "fixed"]
)
def test_a_binary_column_sent_to_csv_is_refused_before_any_compute(
    tmp_path: Path, kind: pa.DataType
) -> None:
    """Carried bytes passed validate; the run wrote those that were UTF-8 as if text and
    stopped at the first unit with others on Arrow's "Invalid UTF8 payload", naming no
    column, after the units before it had committed."""
    (tmp_path / "in").mkdir()
    table = pa.table({"tip_score": [0.5, 1.0], "raw": pa.array([b"ok", b"\xff\xfe"], kind)})
    pq.write_table(table, tmp_path / "in" / "a.parquet")
    job = _model_only_job(tmp_path, "in", fmt="csv", carry="[raw, tip_score]")
    for command in ("validate", "plan", "run"):
        code, out = invoke(command, str(job))
        assert code == 2, out
        assert f"column(s) 'raw' ({kind}) hold bytes" in " ".join(out.split())
        assert "JSON Lines writes bytes as base64" in " ".join(out.split())
        assert not (tmp_path / "out").exists()


def test_ctrl_c_says_how_to_resume_only_where_there_is_something_to_resume(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`chute validate` and `chute plan` write nothing: they said committed units were kept."""
    from chute.cli import handle_errors

    def interrupted() -> None:
        raise KeyboardInterrupt

    for name, resumes in (("run", True), ("validate", False), ("plan", False)):
        interrupted.__name__ = name
        with pytest.raises(SystemExit) as exit_:
            handle_errors(interrupted)()
        assert exit_.value.code == 130
        said = " ".join(capsys.readouterr().err.split())
        assert said.startswith("interrupted.")
        assert ("run the same command again to resume" in said) is resumes


@pytest.mark.timeout(60)
def test_a_metric_that_cannot_compute_its_result_fails_the_command(tmp_path: Path) -> None:
    """The output is finished (the rows are all there), but a CI that reads only the exit
    code saw 0 for a job whose metric values were missing."""
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"tip_score": [0.5, 1.0, 0.25]}), tmp_path / "in" / "a.parquet")
    job = _model_only_job(tmp_path, "in")
    (tmp_path / "broken.py").write_text(
        "from chute.metrics import ColumnStats\n\n\n"
        "class Broken(ColumnStats):\n"
        "    def result(self, state):\n"
        "        raise OverflowError('too large')\n"
    )
    job.write_text(job.read_text() + "metrics:\n  - {type: broken.py:Broken, column: tip_score}\n")
    code, out = invoke("run", str(job), "-q")
    assert code == 1, out
    assert "1 metric(s) could not compute their results" in out and "OverflowError" in out
    assert (tmp_path / "out" / "_SUCCESS").exists()
    assert pd.read_parquet(tmp_path / "out").double.tolist() == [1.0, 2.0, 0.5]


# ------------------------------------------------ bad input found by a review (2026-11-28)


@pytest.mark.parametrize("key", ["5", "true"])
def test_a_top_level_key_that_is_not_text_is_named_not_a_traceback(job_dir: Path, key: str) -> None:
    (job_dir / "job.yaml").write_text(JOB + f"{key}: x\n")
    code, out = invoke("validate", str(job_dir / "job.yaml"))
    assert code == 2 and "key " in out and "Keys should be strings" in out, out


@pytest.mark.parametrize(
    ("model", "said"),
    [
        ("    fn: m.py:FIVE\n", "FIVE"),
        ("    fn: m.py:f\n    args: [2]\n", "args/kwargs are constructor arguments"),
        ("    fn: m.py:NoCall\n", "the class NoCall has no __call__ method"),
        ("    model: {type: torch, path: weights.pt}\n", "weights.pt' does not exist"),
    ],
    ids=["not-callable", "args-for-a-function", "class-without-call", "torch-weights-missing"],
)
def test_validate_refuses_what_the_run_would_refuse_at_load(
    job_dir: Path, model: str, said: str
) -> None:
    """These passed `chute validate` (exit 0); `chute run` then refused them at load, after
    claiming the output."""
    (job_dir / "m.py").write_text("FIVE = 5\ndef f(b):\n    return b\nclass NoCall:\n    pass\n")
    text = f"input: {{path: taxi}}\nmodels:\n  - name: tip\n{model}output: {{path: out}}\n"
    (job_dir / "job.yaml").write_text(text)
    code, out = invoke("validate", str(job_dir / "job.yaml"))
    assert code == 2 and said in out, out
    code, out = invoke("run", str(job_dir / "job.yaml"), "-q")
    assert code == 2 and said in out, out
    assert not (job_dir / "out").exists()  # refused before the output was claimed


def test_a_runtime_env_key_ray_does_not_know_is_refused() -> None:
    """Ray takes an unknown key for a plugin's name and goes on: ``env_var:`` (for
    ``env_vars:``) set nothing, with exit 0."""
    pytest.importorskip("ray")
    import chute

    with pytest.raises(chute.ConfigError, match=r"no key 'env_var'\. Did you mean 'env_vars'"):
        chute.Job(
            source=chute.TableSource(pa.table({"x": [1]})),
            models=(chute.Model("m", lambda b: b["x"]),),
            runtime_env={"env_var": {"A": "1"}},
        )


def test_a_glob_in_a_folder_that_does_not_exist_says_which_and_what_is_near(
    job_dir: Path,
) -> None:
    (job_dir / "job.yaml").write_text(JOB.replace("path: taxi,", "path: taxii/*.parquet,"))
    code, out = invoke("validate", str(job_dir / "job.yaml"))
    assert code == 3, out
    assert "looks in the folder" in out and "which does not exist" in out and "taxi'?" in out


def test_demo_into_a_file_is_refused_before_anything(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    code, out = invoke("demo", "--dir", str(tmp_path / "afile"), "--rows", "100")
    assert code == 2 and "is a file" in out, out


def _as_another_user(command: list[str]) -> list[str]:
    """``command`` without the power to read or write what this user cannot: as root, with
    the file-permission capabilities dropped (capsh); as any other user, as it is."""
    if os.geteuid() != 0:
        return command
    capsh = shutil.which("capsh")
    if capsh is None:
        pytest.skip("root without capsh: file permissions cannot be made to apply")
    drop = "--drop=cap_dac_override,cap_dac_read_search"
    return [capsh, drop, "--", "-c", " ".join(shlex.quote(c) for c in command)]


@pytest.mark.timeout(180)
def test_unreadable_and_unwritable_files_are_named_not_tracebacks(job_dir: Path) -> None:
    """An unreadable job file (`status`), an output's unreadable ledger (`status`,
    `validate`), an unreadable model file (`validate`): PermissionError tracebacks, exit 1.
    `chute report` on an output it cannot write printed nothing, exit 2."""
    code, out = invoke("run", str(job_dir / "job.yaml"), "-q")
    assert code == 0, out
    chute_cli = [sys.executable, "-m", "chute"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = _as_another_user([*chute_cli, *args])
        return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=job_dir)

    job, ledger, models = (
        job_dir / "job.yaml",
        job_dir / "out/_chute/ledger.jsonl",
        job_dir / "models.py",
    )
    for path, args, said in [
        (job, ["status", str(job)], "job file"),
        (ledger, ["status", "out"], "permission denied reading"),
        (ledger, ["validate", str(job)], "permission denied reading"),
        (models, ["validate", str(job)], "is not readable by this user"),
    ]:
        path.chmod(0)
        try:
            done = run(*args)
        finally:
            path.chmod(0o644)
        assert done.returncode == 2, (args, done.stderr[-2000:])
        assert "Traceback" not in done.stderr and said in " ".join(done.stderr.split()), said
    meta = job_dir / "out" / "_chute"
    meta.chmod(0o555)
    try:
        done = run("report", "out")
    finally:
        meta.chmod(0o755)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "cannot write to the output" in " ".join(done.stdout.split())
