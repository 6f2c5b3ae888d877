"""Nothing a user keeps is deleted or read back by mistake: an output and its input never
overlap, a run (``--overwrite`` included) deletes only what chute wrote, paths typed on
the command line are the shell's, and a ``sys.exit()`` in user code fails the run instead
of ending it with exit 0 and rows missing."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import chute
from chute.cli import main
from chute.engines.growth import growth_for, shared_object

pytestmark = pytest.mark.timeout(120)

MODEL = """
import sys


def double(batch):
    return {"y": batch.column("x").to_numpy() * 2}


def ids(batch):
    return {"y": batch.column("id")}


def halves(batch):
    return {"y": batch.column("x").to_numpy() / 2}


def leaves(batch):
    if batch.column("id")[0].as_py() >= 20:
        sys.exit(0)
    return {"y": batch.column("x")}


def plants(batch):  # another writer, adding a folder inside this job's output
    from pathlib import Path

    folder = Path(__file__).parent / "out" / "sub"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "part-0.parquet").write_bytes(b"PAR1")
    return {"y": batch.column("x")}


def broken(batch):
    return {"y": _lookup({})}


def _lookup(table):
    return table["nope"]


class FailsToLoad:
    def __init__(self):
        raise RuntimeError("weights not found")

    def __call__(self, batch):
        return {"y": batch.column("x")}


class ExitsAsItLoads:
    def __init__(self):
        raise SystemExit(0)

    def __call__(self, batch):
        return {"y": batch.column("x")}
"""


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, " ".join(result.output.split())


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """data/ (3 files of 10 rows), model.py, and job.yaml whose output the test sets."""
    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        ids = np.arange(i * 10, (i + 1) * 10)
        pq.write_table(pa.table({"id": ids, "x": ids * 1.5}), data / f"f{i}.parquet")
    (tmp_path / "model.py").write_text(MODEL)
    return tmp_path


def job(
    project: Path, output: str, fn: str = "double", name: str = "job.yaml", engine: str = "local"
) -> Path:
    path = project / name
    path.write_text(
        f"input: data/\noutput: {output}\nengine: {engine}\ncarryover: [id]\n"
        f"models: [{{name: m, fn: 'model.py:{fn}', inputs: [id, x], batch_size: 10}}]\n"
    )
    return path


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize(
    ("output", "why"),
    [
        (".", "the input file .* is inside the output"),  # --overwrite emptied the project
        ("data/out", "the output .* is inside the input folder"),  # the next run read it
    ],
)
def test_an_output_that_overlaps_its_input_is_refused_before_anything_is_written(
    project: Path, command: str, output: str, why: str
) -> None:
    spec = job(project, output)
    before = files(project)
    quiet = ["-q"] if command == "run" else []
    code, out = invoke(command, str(spec), *quiet, "--overwrite")
    assert code == 2, out
    assert re.search(why, out), out
    assert files(project) == before


@pytest.mark.parametrize(
    ("output", "why"),
    [
        ("/dev/null", "the output '/dev/null' is not a folder"),  # a NotADirectoryError
        # FileNotFoundError as root; as another user, /proc is not writable to begin with
        ("/proc/chute-out", "(cannot make the output folder|permission denied writing) '?/proc"),
    ],
)
def test_an_output_no_folder_can_be_made_at_is_a_clear_error(
    project: Path, output: str, why: str
) -> None:
    """Both ended in a traceback (exit 1), after ``validate`` had said the output was new."""
    if not Path(output).parent.is_dir():
        pytest.skip(f"{Path(output).parent} is not on this system")
    code, out = invoke("run", str(job(project, output)), "-q")
    assert code == 2, out
    assert re.search(why, out) and "Traceback" not in out, out


def test_an_output_beside_the_input_or_hidden_inside_it_is_fine(project: Path) -> None:
    assert invoke("run", str(job(project, "data/_out")), "-q")[0] == 0
    assert invoke("run", str(job(project, "data/_out")), "-q")[0] == 0  # resumes: not read
    assert pq.read_table(project / "data" / "_out").num_rows == 30


def test_overwrite_deletes_only_what_chute_wrote(project: Path) -> None:
    spec = job(project, "out")
    assert invoke("run", str(spec), "-q")[0] == 0
    (project / "out" / "notes.txt").write_text("mine")
    before = files(project / "out")
    code, out = invoke("run", str(spec), "-q", "--overwrite")
    assert code == 5, out
    assert "holds files that chute did not write beside the results of a chute job" in out
    assert "'notes.txt'" in out
    assert files(project / "out") == before  # the earlier results too


def test_overwrite_keeps_the_earlier_results_until_the_new_run_commits(
    project: Path, engine: str
) -> None:
    """--overwrite deleted the earlier results before the new job's model loaded: a model
    that could not load left the user with neither. They now go at the first commit."""
    first = job(project, "out", engine=engine)
    assert invoke("run", str(first), "-q")[0] == 0
    kept = files(project / "out")
    failing = job(project, "out", "FailsToLoad", "failing.yaml", engine)
    code, out = invoke("run", str(failing), "-q", "--overwrite")
    assert code == 4 and "weights not found" in out, out
    now = files(project / "out")
    # every part, the ledger, job.json and the report as they were; no _SUCCESS: being
    # written again, no reader takes it as finished
    assert now == {k: v for k, v in kept.items() if k != "_SUCCESS"}
    code, out = invoke("run", str(job(project, "other", "double", "other.yaml")), "-q")
    assert code == 0, out
    code, out = invoke("run", str(first), "-q")  # the earlier job, finished again as it was
    assert code == 0, out
    assert (project / "out" / "_SUCCESS").exists()
    assert sorted(pq.read_table(project / "out").column("id").to_pylist()) == list(range(30))
    halved = job(project, "out", "halves", "halved.yaml", engine)
    code, out = invoke("run", str(halved), "-q", "--overwrite")
    assert code == 0, out
    table = pq.read_table(project / "out")
    assert table.num_rows == 30  # the new job's rows only: every earlier part is gone
    assert sorted(table.column("m_y").to_pylist()) == sorted(i * 0.75 for i in range(30))


def test_a_claimed_output_that_committed_nothing_keeps_files_added_since(project: Path) -> None:
    """A run stopped before its first commit leaves job.json: the next job used to wipe
    the folder as its own, files added since included."""
    spec = job(project, "out")
    assert invoke("run", str(spec), "-q")[0] == 0
    for part in (project / "out").glob("part-*"):
        part.unlink()
    (project / "out" / "_chute" / "ledger.jsonl").unlink()
    (project / "out" / "keep").mkdir()
    (project / "out" / "keep" / "notes.txt").write_text("mine")
    other = job(project, "out", name="other.yaml")
    other.write_text(other.read_text().replace("batch_size: 10", "batch_size: 5"))
    for args in (["validate"], ["run", "-q"]):
        code, out = invoke(args[0], str(other), *args[1:])
        assert code == 5 and "'keep'" in out, out
    assert (project / "out" / "keep" / "notes.txt").read_text() == "mine"


def test_paths_typed_on_the_command_line_are_from_the_current_directory(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = project / "jobs"
    jobs.mkdir()
    spec = jobs / "job.yaml"
    spec.write_text(
        "input: ../data/\noutput: out\nengine: local\n"
        "models: [{name: m, fn: '../model.py:double', inputs: [x]}]\n"
    )
    monkeypatch.chdir(project)
    code, out = invoke("run", str(spec), "-q", "--output", "results", "--input", "data")
    assert code == 0, out
    assert pq.read_table(project / "results").num_rows == 30
    assert not (jobs / "out").exists() and not (jobs / "results").exists()


def test_a_home_relative_output_is_the_home_folder(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(project / "home"))
    code, out = invoke("run", str(job(project, "~/out")), "-q")
    assert code == 0, out
    assert (project / "home" / "out" / "_SUCCESS").exists() and not (project / "~").exists()


@pytest.mark.parametrize("fn", ["leaves", "ExitsAsItLoads"])
def test_a_model_that_calls_sys_exit_fails_the_run(project: Path, fn: str) -> None:
    """It ended the run with exit 0, a third of the rows missing and no word said."""
    code, out = invoke("run", str(job(project, "out", fn)), "-q")
    assert code == 4, out
    assert "sys.exit(0)" in out
    assert not (project / "out" / "_SUCCESS").exists()


def test_sys_exit_as_a_model_file_imports_is_a_model_error(project: Path) -> None:
    (project / "model.py").write_text("import sys\nsys.exit(3)\n" + MODEL)
    code, out = invoke("run", str(job(project, "out")), "-q")
    assert code == 4, out
    assert "raised SystemExit: 3" in out


class Staged:
    """A model object that keeps a staging buffer between calls (as an ONNX I/O binding
    does): two threads calling it at once would mix their batches."""

    def __init__(self) -> None:
        self.buffer = np.zeros(0)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.buffer = batch["x"].copy()
        return {"y": self.buffer * 2}


STAGED = Staged()


def staged(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The usual way to hand over a model object: a function that calls it."""
    return STAGED(batch)


def test_a_model_object_the_job_holds_keeps_one_local_replica() -> None:
    """Every local replica would call the one object the job holds, or the one a function
    calls (a review found 13,800 rows of 16,000 with another row's prediction once such a
    function's pool grew); a class, built once per replica, still grows its pool."""
    assert shared_object(chute.Model("m", Staged()))
    assert not growth_for(chute.Model("m", Staged()), 1, 2).grows
    assert growth_for(chute.Model("m", Staged), 1, 2).grows
    assert shared_object(chute.Model("m", Staged().__call__))  # its object's method
    for function in (staged, lambda batch: STAGED(batch), "tests.test_output_safety:staged"):
        assert shared_object(chute.Model("m", function))
        assert not growth_for(chute.Model("m", function), 1, 2).grows
    assert growth_for(chute.Model("m", staged, pool=chute.Pool(min=1, max=2)), 2, 1).most == 2
    assert not shared_object(chute.Model("m", len))  # a builtin holds nothing


def test_an_output_under_a_file_and_a_job_file_not_utf8_are_configuration_errors(
    project: Path,
) -> None:
    """Both were tracebacks with exit 1 (the first after validate said ok)."""
    (project / "f").write_text("a file")
    for args in (["validate"], ["run", "-q"]):
        code, out = invoke(args[0], str(job(project, "f/out")), *args[1:])
        assert code == 2 and "is a file, not a folder" in out, out
    latin = project / "latin.yaml"
    latin.write_bytes("# caf\u00e9\ninput: data/\n".encode("latin-1"))
    code, out = invoke("validate", str(latin))
    assert code == 2 and "is not UTF-8 text" in out, out


def test_a_job_for_the_local_engine_is_checked_here_whatever_ray_address_says(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.255.255.1:6379")
    code, out = invoke("validate", str(job(project, "out", "doubel")))
    assert code == 2 and "doubel" in out and "the cluster may have it" not in out, out


def test_a_model_file_named_like_a_module_python_has_is_refused(project: Path) -> None:
    """Imported as 'json', it replaced the json module for everything in the process: a
    traceback from chute's own code, exit 1."""
    (project / "json.py").write_text(MODEL)
    spec = job(project, "out")
    spec.write_text(spec.read_text().replace("model.py:double", "json.py:double"))
    code, out = invoke("run", str(spec), "-q")
    assert code == 2, out
    assert "named like the module 'json', which Python already has: rename the file" in out


def test_a_model_error_says_where_in_the_users_code_it_was_raised(project: Path) -> None:
    """The message named the exception and the row, never the line: the traceback was
    only in the error's cause, which the command line does not show."""
    code, out = invoke("run", str(job(project, "out", "broken")), "-q")
    assert code == 4, out
    line = MODEL.splitlines().index('    return table["nope"]') + 1
    assert f"raised KeyError: 'nope' (at model.py:{line} in _lookup)" in out


def test_a_copy_of_chutes_files_in_a_folder_chute_never_claimed_is_the_users(
    project: Path,
) -> None:
    """A part named like chute's, in a folder without _chute/job.json (the user's copy of
    an earlier result), was deleted as an orphan and the run succeeded."""
    out = project / "combined"
    out.mkdir()
    copy = out / "part-000007-0000000000-deadbeef.parquet"
    pq.write_table(pa.table({"id": [1]}), copy)
    (out / "_errors").mkdir()
    before = files(out)
    for args in (["validate"], ["run", "-q"], ["run", "-q", "--overwrite"]):
        code, text = invoke(args[0], str(job(project, "combined")), *args[1:])
        assert code == 5 and "part-000007-0000000000-deadbeef.parquet" in text, text
    assert files(out) == before


def test_an_output_inside_another_jobs_output_is_refused(project: Path) -> None:
    """A job writing into ``out/sub`` beside a finished ``out`` ran, exit 0: a reader of
    ``out`` (``pandas.read_parquet``) then read both jobs' rows as ``out``'s."""
    assert invoke("run", str(job(project, "out")), "-q")[0] == 0
    before = files(project / "out")
    for command in (["validate"], ["run", "-q"]):
        code, out = invoke(command[0], str(job(project, "out/sub", name="b.yaml")), *command[1:])
        assert code == 5, out
        assert "is inside the output of another chute job" in out and "/out'" in out, out
    assert files(project / "out") == before
    assert pq.read_table(project / "out").num_rows == 30


def openai_lines(batch: dict[str, np.ndarray]) -> dict[str, list[str]]:
    return {"line": [
        json.dumps({"id": "x", "custom_id": str(c), "response": {"status_code": 200}})
        for c in batch["id"]
    ]}  # fmt: skip


def test_an_openai_batch_output_inside_another_jobs_output_is_refused(project: Path) -> None:
    """The check above was skipped for the OpenAI Batch format: its folder was left inside
    the finished output."""
    assert invoke("run", str(job(project, "out")), "-q")[0] == 0
    nested = chute.Job(
        source=chute.FileSource(str(project / "data")),
        models=(chute.Model("m", openai_lines, inputs=("id",), batch_format="numpy"),),
        output=chute.Sink(str(project / "out" / "batch"), "openai-batch"),
        engine="local",
    )
    with pytest.raises(chute.ChuteError, match="is inside the output of another chute job"):
        nested.run(progress=False)
    assert not (project / "out" / "batch").exists()


def test_entries_another_writer_adds_during_a_run_are_never_marked_finished(
    project: Path,
) -> None:
    """A folder another job made inside the output while it ran: the run wrote
    ``_SUCCESS`` over it, and the folder read as twice the rows."""
    spec = job(project, "out", fn="plants")
    code, out = invoke("run", str(spec), "-q")
    assert code == 5, out
    assert "gained entries chute did not write during the run: 'sub'" in out, out
    assert not (project / "out" / "_SUCCESS").exists()
    shutil.rmtree(project / "out" / "sub")
    assert invoke("run", str(job(project, "out")), "-q", "--overwrite")[0] == 0
    assert pq.read_table(project / "out").num_rows == 30


@pytest.mark.parametrize("given", ["out/", "out/*.parquet"])
def test_an_input_that_is_an_unfinished_jobs_output_is_refused(project: Path, given: str) -> None:
    """A job reading another's output before it finished took the parts committed so far
    for the whole input, and reported itself complete."""
    assert invoke("run", str(job(project, "out")), "-q")[0] == 0
    (project / "out" / "_SUCCESS").unlink()  # as while that job still runs
    reader = project / "b.yaml"
    reader.write_text(
        f"input: {given}\noutput: out2\nengine: local\ncarryover: [id]\n"
        "models: [{name: n, fn: 'model.py:ids', inputs: [id]}]\n"
    )
    code, out = invoke("run", str(reader), "-q")
    assert code == 3, out
    assert "reads the output of a chute job that has not finished" in out, out
    assert not (project / "out2").exists()
    (project / "out" / "_SUCCESS").touch()  # finished: its parts are its result
    assert invoke("run", str(reader), "-q")[0] == 0
    assert pq.read_table(project / "out2").num_rows == 30
