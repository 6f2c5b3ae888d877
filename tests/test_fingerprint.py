"""A changed model is a changed job: the fingerprint covers the source of the user code a
job names (model ``fn:`` files and the local modules they import, preprocess functions,
custom metrics), so a resume with edited code is refused, naming the part and the file."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from chute.errors import JobStateError
from chute.job import JobSpec, Model, Preprocess, Sink, describe_changes
from chute.job.fingerprint import fingerprint_of
from chute.sources import TableSource
from tests.test_cli import invoke, listing

ROWS_PER_FILE = 500
FILES = 4

MODEL = """
import numpy as np

from helpers import SCALE

def score(batch):
    return np.asarray(batch["x"]) * SCALE
"""
HELPERS = "SCALE = 2.0\n"
PREP = """
import numpy as np

def add(batch):
    return {"x2": np.asarray(batch["x"]) + 1}
"""
METRIC = """
class TopDecileLift:
    def columns(self):
        return ["x"]

    def init(self):
        return {"n": 0}

    def update(self, state, table):
        return {"n": state["n"] + table.num_rows}

    def merge(self, a, b):
        return {"n": a["n"] + b["n"]}

    def result(self, state):
        return {"rows": state["n"]}
"""
JOB = """
input: {path: data, format: parquet}
carryover: [id]
models:
  - name: m
    fn: model.py:score
    inputs: [id, x]
    batch_size: 100
output: {path: out, file_rows: 500}  # a file a unit: forgetting one forgets it alone
"""


def _data(folder: Path) -> None:
    folder.mkdir()
    for i in range(FILES):
        ids = list(range(i * ROWS_PER_FILE, (i + 1) * ROWS_PER_FILE))
        pq.write_table(
            pa.table({"id": ids, "x": [float(v) for v in ids], "g": [v % 3 for v in ids]}),
            folder / f"{i}.parquet",
        )


def _job_dir(tmp_path: Path, extra: str = "") -> Path:
    _data(tmp_path / "data")
    (tmp_path / "model.py").write_text(MODEL)
    (tmp_path / "helpers.py").write_text(HELPERS)
    (tmp_path / "prep.py").write_text(PREP)
    (tmp_path / "my_metrics.py").write_text(METRIC)
    (tmp_path / "job.yaml").write_text(JOB + extra)
    return tmp_path / "job.yaml"


def _forget_last_unit(out: Path) -> None:
    """Leave the output as a run killed before its last unit committed would."""
    ledger = out / "_chute" / "ledger.jsonl"
    lines = ledger.read_text().splitlines(keepends=True)
    ledger.write_text("".join(lines[:-1]))
    (out / "_SUCCESS").unlink()


def _parts_and_ledger(out: Path) -> dict[str, bytes]:
    return {k: v for k, v in listing(out).items() if k.startswith(("part-", "_chute/ledger"))}


# -- through the command line -------------------------------------------------------------


@pytest.mark.timeout(120)
def test_resume_of_a_partial_run_with_an_edited_fn_file_is_refused(tmp_path: Path) -> None:
    job = _job_dir(tmp_path)
    assert invoke("run", str(job), "-q", "--engine", "local")[0] == 0
    _forget_last_unit(tmp_path / "out")
    before = _parts_and_ledger(tmp_path / "out")
    original = (tmp_path / "model.py").read_text()
    (tmp_path / "model.py").write_text(original.replace("* SCALE", "* SCALE + 1"))

    code, text = invoke("run", str(job), "-q", "--engine", "local")

    assert code == JobStateError.exit_code, text
    assert "changed: models[0].fn (model.py)" in text
    assert _parts_and_ledger(tmp_path / "out") == before  # nothing written, nothing removed
    (tmp_path / "model.py").write_text(original)  # the same code again: it resumes
    code, text = invoke("run", str(job), "-q", "--engine", "local")
    assert code == 0, text
    assert "1 run, 3 already done" in text
    result = pq.read_table(tmp_path / "out").sort_by("id")
    assert result.column("id").to_pylist() == list(range(FILES * ROWS_PER_FILE))
    assert result.column("m").to_pylist() == [2.0 * v for v in range(FILES * ROWS_PER_FILE)]


@pytest.mark.timeout(120)
def test_an_edited_module_the_model_imports_is_named(tmp_path: Path) -> None:
    job = _job_dir(tmp_path)
    assert invoke("run", str(job), "-q")[0] == 0
    (tmp_path / "helpers.py").write_text("SCALE = 3.0\n")
    code, text = invoke("run", str(job), "-q")
    assert code == JobStateError.exit_code, text
    assert "changed: models[0].fn (helpers.py)" in text


@pytest.mark.timeout(120)
def test_an_edited_preprocess_file_is_a_changed_job(tmp_path: Path) -> None:
    job = _job_dir(tmp_path, "preprocess: {fn: prep.py:add}\n")
    assert invoke("run", str(job), "-q")[0] == 0
    assert invoke("run", str(job), "-q")[0] == 0  # unchanged: resumes, nothing to redo
    (tmp_path / "prep.py").write_text(PREP.replace("+ 1", "+ 2"))
    code, text = invoke("run", str(job), "-q")
    assert code == JobStateError.exit_code, text
    assert "changed: preprocess.fn (prep.py)" in text


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "spec",
    [
        pytest.param("{type: my_metrics.py:TopDecileLift}", id="custom"),
        pytest.param("{type: my_metrics.py:TopDecileLift, by: g}", id="sliced"),
    ],
)
def test_an_edited_custom_metric_file_is_a_changed_job(tmp_path: Path, spec: str) -> None:
    job = _job_dir(tmp_path, f"metrics:\n  - {spec}\n")
    code, text = invoke("run", str(job), "-q")
    assert code == 0, text
    assert invoke("run", str(job), "-q")[0] == 0
    (tmp_path / "my_metrics.py").write_text(METRIC + "# counts rows\n")
    code, text = invoke("run", str(job), "-q")
    assert code == JobStateError.exit_code, text
    assert "changed: metrics[0] (my_metrics.py)" in text


# -- what the fingerprint covers -----------------------------------------------------------


def _spec(tmp_path: Path, preprocess: str | None = None) -> JobSpec:
    return JobSpec(
        source=TableSource(pa.table({"id": [1, 2], "x": [1.0, 2.0]})),
        models=(Model("m", f"{tmp_path / 'model.py'}:score", inputs=("id", "x")),),
        preprocess=Preprocess(preprocess) if preprocess else None,
    )


def test_a_comment_only_edit_changes_the_fingerprint(tmp_path: Path) -> None:
    _job_dir(tmp_path)
    before = _spec(tmp_path).describe()
    with open(tmp_path / "model.py", "a") as f:
        f.write("# a comment\n")
    after = _spec(tmp_path).describe()
    assert describe_changes(before, after) == "models[0].fn (model.py)"


def test_unrelated_files_and_installed_packages_are_not_covered(tmp_path: Path) -> None:
    _job_dir(tmp_path)
    spec = _spec(tmp_path, preprocess="chute.demo:tip_model")
    code = spec.describe()["code"]
    assert list(code) == ["models[0].fn"]  # not chute.demo: installed code is not covered
    assert sorted(code["models[0].fn"]) == ["helpers.py", "model.py"]
    before = spec.fingerprint()
    (tmp_path / "prep.py").write_text("# not imported by the model\n")
    (tmp_path / "data.json").write_text(json.dumps({"read": "at run time"}))
    assert _spec(tmp_path, preprocess="chute.demo:tip_model").fingerprint() == before


def test_a_function_given_in_python_is_covered_by_its_module_file(tmp_path: Path) -> None:
    from tests.test_job import _job as job_with_defaults

    code = job_with_defaults().describe()["code"]
    assert set(code["models[0].fn"]) >= {"tests/test_job.py", "tests/__init__.py"}


def test_changes_name_each_model_field() -> None:
    before = {"models": [{"name": "a", "kwargs": {}}, {"name": "b", "inputs": ["x"]}], "x": 1}
    after = {"models": [{"name": "a", "kwargs": {"k": 1}}, {"name": "b", "inputs": ["y"]}]}
    assert describe_changes(before, after) == "models[0].kwargs, models[1].inputs, x"


def test_a_model_added_or_removed_is_named_not_its_unchanged_file() -> None:
    """Adding ``n`` read ``changed: models[1].fn (cls.py), models``: as if cls.py changed."""
    one = {"models": [{"name": "m"}], "code": {"models[0].fn": {"cls.py": "1"}}}
    two = {
        "models": [{"name": "m"}, {"name": "n"}],
        "code": {"models[0].fn": {"cls.py": "1"}, "models[1].fn": {"cls.py": "1"}},
    }
    assert describe_changes(one, two) == "models (1 added: n)"
    assert describe_changes(two, one) == "models (1 removed: n)"
    first = {"models": [{"name": "n"}], "code": {"models[0].fn": {"cls.py": "1"}}}
    assert describe_changes(two, first) == "models (1 removed: m)"  # not the first's file"


def _doubles(batch: dict[str, object]) -> dict[str, object]:
    return {"m": batch["x"]}


def test_a_metric_option_changed_is_another_job() -> None:
    """A metric was described by its type, name and columns only: a resume after its
    threshold, bins or slice limit changed merged the old run's states, computed one way,
    with the new run's (found by review: resumed at 0.9, 4 true positives where a fresh run
    at 0.9 has 1). Every option is part of the fingerprint now."""
    from chute import metrics as M
    from chute.job import fingerprint_of

    def fingerprint(*metrics: object) -> str:
        spec = JobSpec(
            source=TableSource(pa.table({"y": [0, 1], "x": [1.0, 2.0], "g": [1, 2]})),
            models=(Model("m", _doubles, inputs=("x",)),),
            metrics=metrics,
        )
        return fingerprint_of(spec.describe())

    base = fingerprint(M.Confusion("y", "m", threshold=0.5))
    assert base == fingerprint(M.Confusion("y", "m", threshold=0.5))
    assert base != fingerprint(M.Confusion("y", "m", threshold=0.9))
    assert fingerprint(M.Calibration("y", "m", bins=10)) != fingerprint(
        M.Calibration("y", "m", bins=20)
    )
    sliced = M.Sliced(M.Confusion("y", "m", threshold=0.5), by="g")
    assert fingerprint(sliced) != fingerprint(M.Sliced(M.Confusion("y", "m"), by="g", max_groups=5))
    assert fingerprint(sliced) != fingerprint(
        M.Sliced(M.Confusion("y", "m", threshold=0.7), by="g")
    )


def test_a_changed_input_is_described_file_by_file() -> None:
    """It said only "changed: source": which files were added, removed or rewritten
    decides whether --overwrite is right."""
    files = [[f"/data/f{i}.parquet", 100, 1] for i in range(6)]
    before = {"source": {"kind": "files", "format": "parquet", "files": files}}
    after_files = [files[0], ["/data/f1.parquet", 100, 2], *files[3:], ["/data/new.parquet", 5, 1]]
    after = {"source": {"kind": "files", "format": "csv", "files": after_files}}
    assert describe_changes(before, after) == (
        "source (1 file added: new.parquet; 1 file removed: f2.parquet; "
        "1 file changed: f1.parquet; format)"
    )
    assert describe_changes({"source": {"kind": "memory"}}, {"source": {"kind": "x"}}) == "source"


def test_an_input_folder_moved_is_said_so() -> None:
    """A moved project read "30 files added: f000.csv, ...; 30 files removed: f000.csv, ..."."""
    files = [[f"/p/data/{name}", 100, 1] for name in ("a.csv", "b.csv", "sub/c.csv")]
    moved = [[f"/q/data/{path[len('/p/data/') :]}", *rest] for path, *rest in files]
    said = describe_changes({"source": {"files": files}}, {"source": {"files": moved}})
    assert said == (
        "source (the input moved from /p/data to /q/data: a job's files are named by where "
        "they are)"
    )
    day2 = [[f"/p/dt=2/{path[len('/p/data/') :]}", 7, 2] for path, *_ in files]
    other = describe_changes({"source": {"files": files}}, {"source": {"files": day2}})
    assert "input moved" not in other and "3 files added" in other  # other files: no move
    one = [["/p/a.csv", 1, 1]], [["/q/a.csv", 1, 1]]
    assert "moved from /p to /q" in describe_changes(
        {"source": {"files": one[0]}}, {"source": {"files": one[1]}}
    )


def _double(batch: dict[str, object]) -> dict[str, object]:
    return {"y": batch["x"]}


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_an_output_an_earlier_chute_began_in_text_is_not_finished_in_another_way(
    tmp_path: Path, fmt: str
) -> None:
    """CSV and JSON Lines now write durations and nested times otherwise: an output an
    earlier chute began would end with both in its files."""
    from chute import Job
    from chute.job import Sink, fingerprint_of

    out = tmp_path / "out"
    model = Model("m", _double, inputs=("x",), batch_format="numpy")
    source = TableSource(pa.table({"x": [1, 2, 3]}))
    job = Job(source, (model,), output=Sink(str(out), fmt), engine="local")  # type: ignore[arg-type]
    job.run()
    claim = out / "_chute" / "job.json"
    earlier = json.loads(claim.read_text())
    del earlier["job"]["text_version"]  # as the earlier chute described the job
    earlier["fingerprint"] = fingerprint_of(earlier["job"])
    claim.write_text(json.dumps(earlier))
    with pytest.raises(JobStateError, match=r"durations and nested times .* earlier chute"):
        job.run()
    assert job.run(overwrite=True).rows_out == 3


class Prompted:
    def __init__(self, prompt: str, table: object = None) -> None:
        self.prompt = prompt

    def __call__(self, batch: object) -> list[str]:
        return [self.prompt] * len(batch)  # type: ignore[arg-type]


class Opaque:
    """An argument whose repr names its address, new in every process."""


def test_a_long_text_changed_to_one_of_the_same_length_is_another_job() -> None:
    """Texts over 200 characters were kept as their length: a prompt with two words
    swapped resumed the output the old prompt began, and the run mixed both."""
    old = "Label the review as positive or negative, and answer with one word only. " * 3
    new = old.replace("positive or negative", "negative or positive")
    assert len(old) == len(new) > 200

    def job(prompt: str, options: dict[str, object] | None = None) -> JobSpec:
        model = Model("m", Prompted, kwargs={"prompt": prompt, **(options or {})})
        return JobSpec(TableSource(pa.table({"x": [1]})), (model,))

    assert job(old).fingerprint() != job(new).fingerprint()
    assert job(old).fingerprint() == job(old).fingerprint()
    assert "models[0].kwargs" in describe_changes(job(old).describe(), job(new).describe())
    assert (
        job(old, {"table": Opaque()}).fingerprint() == job(old, {"table": Opaque()}).fingerprint()
    )

    from chute import adapter

    def served(system: str) -> JobSpec:
        spec = adapter("openai", base_url="http://localhost:1/v1", model="x", system=system)
        return JobSpec(TableSource(pa.table({"x": ["a"]})), (Model("m", spec, inputs=("x",)),))

    assert served(old).fingerprint() != served(new).fingerprint()


def test_a_preprocess_step_s_inputs_and_batch_format_are_part_of_the_job() -> None:
    """NumPy batches make an integer column with a null float64: a resume after the step's
    batch format changed mixed two kinds of values."""

    def step(batch: object) -> object:
        return batch

    def job(**options: object) -> JobSpec:
        model = Model("m", Prompted, kwargs={"prompt": "p"})
        source = TableSource(pa.table({"x": [1]}))
        return JobSpec(source, (model,), preprocess=Preprocess(step, **options))  # type: ignore[arg-type]

    plain = job()
    assert isinstance(plain.describe()["preprocess"], str)  # as before: outputs resume
    for changed in (job(batch_format="numpy"), job(inputs=("x",))):
        assert changed.fingerprint() != plain.fingerprint()
        assert describe_changes(plain.describe(), changed.describe()) == "preprocess"


def test_a_format_change_is_not_explained_as_chute_s_text_encoding() -> None:
    def job(fmt: str) -> JobSpec:
        model = Model("m", Prompted, kwargs={"prompt": "p"})
        return JobSpec(TableSource(pa.table({"x": [1]})), (model,), Sink("out", fmt))  # type: ignore[arg-type]

    assert describe_changes(job("parquet").describe(), job("jsonl").describe()) == "format"


def test_a_set_argument_is_described_the_same_in_every_process() -> None:
    """A set's order is the process's hash seed: hashed as it printed, a long one made
    every resume a changed job."""
    script = (
        "from chute.job.fingerprint import _short_repr; "
        "print(_short_repr({'label_%d' % i for i in range(30)}), _short_repr({'b', 'a'}))"
    )
    seen = _printed_under_hash_seeds(script, ("1", "2", "3"))
    assert len(seen) == 1 and "{'a', 'b'}" in seen.pop()


def _printed_under_hash_seeds(script: str, seeds: tuple[str, ...]) -> set[str]:
    """What ``script`` prints in a process of each ``PYTHONHASHSEED``."""
    return {
        subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in seeds
    }


def test_an_output_an_earlier_chute_began_with_a_long_argument_says_why_it_is_refused() -> None:
    """An earlier chute kept such arguments by their length: the same job looked changed
    ('models[0].kwargs') with nothing changed."""
    import re

    model = Model("m", Prompted, kwargs={"prompt": "a long prompt. " * 20})
    new = JobSpec(TableSource(pa.table({"x": [1]})), (model,)).describe()
    old = json.loads(re.sub(r"(@\d+)#[0-9a-f]{16}", r"\1", json.dumps(new)))
    assert old != new
    assert describe_changes(old, new).startswith("none that can be told: an earlier chute")


# -- a model given as a Python object: its state, not only its code ------------------------


class Scaler:
    """A model object: its code is the same whatever factor it holds."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, batch: pa.Table) -> list[float]:
        return [x * self.factor for x in batch.column("x").to_pylist()]

    def predict(self, batch: pa.Table) -> list[float]:
        return self(batch)


def _scaled(batch: pa.Table, factor: float = 1.0) -> list[float]:
    return [x * factor for x in batch.column("x").to_pylist()]


def _closure(factor: float) -> Any:
    def scaled(batch: pa.Table) -> list[float]:
        return _scaled(batch, factor)

    return scaled


def _described(fn: Any, **kwargs: Any) -> dict[str, Any]:
    model = Model("m", fn, inputs=("x",), kwargs=kwargs)
    return JobSpec(TableSource(pa.table({"x": [1.0]})), (model,)).describe()


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(Scaler, id="instance"),
        pytest.param(lambda f: Scaler(f).predict, id="bound-method"),
        pytest.param(lambda f: functools.partial(_scaled, factor=f), id="partial"),
        pytest.param(_closure, id="closure"),
    ],
)
def test_a_model_object_holding_other_values_is_another_job(make: Any) -> None:
    """Retrained, the same code held other values: a resume finished the job with two
    models' rows, "complete", and a rerun said nothing to do."""
    before, after = _described(make(2.0)), _described(make(3.0))
    assert fingerprint_of(before) != fingerprint_of(after)
    assert describe_changes(before, after).startswith("models[0].state (what the model object")
    assert _described(make(2.0)) == before  # the same values: the same job


def test_plain_functions_and_classes_keep_the_description_they_had() -> None:
    """No state for a name, a class or a function without captured values: an output an
    earlier chute began is still this job."""
    for fn in (Scaler, _scaled.__name__, _closure):
        assert "state" not in _described(fn)["models"][0]


def test_fitted_estimators_frames_and_tables_in_arguments_are_described_by_content() -> None:
    """A fitted estimator was its repr (``LinearRegression()``), a DataFrame or Arrow
    table its shape: retrained or edited, the same job."""
    pytest.importorskip("sklearn")
    import numpy as np
    import pandas as pd
    from sklearn.linear_model import LinearRegression

    x = np.arange(10.0).reshape(-1, 1)
    values = [
        (LinearRegression().fit(x, 2 * x[:, 0]), LinearRegression().fit(x, 3 * x[:, 0])),
        (pd.DataFrame({"a": [1, 2]}), pd.DataFrame({"a": [1, 3]})),
        (pa.table({"a": [1, 2]}), pa.table({"a": [1, 3]})),
    ]
    for old, new in values:
        before, after = _described(Scaler, payload=old), _described(Scaler, payload=new)
        assert describe_changes(before, after) == "models[0].kwargs"


def test_a_refusal_names_the_attributes_that_changed() -> None:
    pytest.importorskip("sklearn")
    import numpy as np
    from sklearn.linear_model import LinearRegression

    x = np.arange(10.0).reshape(-1, 1)
    before = _described(LinearRegression().fit(x, 2 * x[:, 0]).predict)
    after = _described(LinearRegression().fit(x, 3 * x[:, 0]).predict)
    assert describe_changes(before, after).startswith(
        "models[0].state (what the model object holds: coef_;"
    )


def test_a_fitted_estimator_with_text_arrays_is_described() -> None:
    """Fitted on a DataFrame, an estimator keeps its feature names in an object array:
    describing it raised TypeError, a traceback before the run."""
    pytest.importorskip("sklearn")
    import numpy as np
    import pandas as pd
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import OneHotEncoder

    frame = pd.DataFrame({"a": ["x", "y", "x", "y"], "b": [1.0, 2.0, 3.0, 4.0]})
    fitted = LogisticRegression().fit(frame[["b"]], [0, 1, 0, 1])
    assert "feature_names_in_" in _described(fitted.predict)["models"][0]["state"]
    one, other = OneHotEncoder().fit(frame[["a"]]), OneHotEncoder().fit(frame[["a"]].iloc[:1])
    assert _described(Scaler, enc=one) != _described(Scaler, enc=other)
    assert np.asarray(fitted.feature_names_in_).dtype == object


def test_a_torch_module_is_its_weights_not_its_attributes() -> None:
    """A transformers model keeps ``hash()`` of a text in its generation config, new in
    every process (every resume was refused), and ``training`` flips when it runs."""
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):  # type: ignore[misc]
        def __init__(self, seed: int) -> None:
            super().__init__()
            torch.manual_seed(seed)
            self.linear = torch.nn.Linear(3, 2)
            self.noise = hash(f"differs between processes {seed}") if seed else 0

    net = Net(1)
    before = _described(net)
    net.eval()
    net.noise += 1
    assert _described(net) == before
    assert describe_changes(before, _described(Net(2))).startswith(
        "models[0].state (what the model object holds: linear.bias, linear.weight;"
    )


def test_long_lists_and_big_arrays_are_described_by_content_cheaply() -> None:
    """5 million texts took 30 s item by item; an array over 64 MiB was its shape only,
    so the 800 MB table of examples/big_payload edited throughout was the same job."""
    import numpy as np

    words = [f"w{i}" for i in range(200_000)]
    edited = [*words[:-1], "other"]
    assert _described(Scaler, vocab=words) != _described(Scaler, vocab=edited)
    table = np.zeros(9 * 2**20)  # 72 MiB
    before = _described(Scaler, table=table)
    table += 1.0
    assert _described(Scaler, table=table) != before


def test_an_output_begun_without_the_object_s_state_says_why_it_is_refused() -> None:
    """Begun by an earlier chute (or with the model as a class), the description has no
    state: comparing it raised KeyError, a traceback."""
    before, after = _described(Scaler, factor=2.0), _described(Scaler(2.0))
    assert "state" not in before["models"][0]
    assert "whether it changed cannot be told" in describe_changes(before, after)


def test_what_belongs_to_the_process_is_not_the_model_s_state() -> None:
    """A logger was described through every logger of the process, a thread pool by how
    many pools the process made before it: each resume was refused."""
    import logging
    from concurrent.futures import ThreadPoolExecutor

    class Logged(Scaler):
        def __init__(self, factor: float) -> None:
            super().__init__(factor)
            self.log = logging.getLogger("chute.test.model")
            self.pool = ThreadPoolExecutor(1)

    model = Logged(2.0)
    before = _described(model)
    logging.getLogger("chute.test.other").addHandler(logging.NullHandler())
    ThreadPoolExecutor(1).shutdown()
    model.pool.shutdown()
    model.pool = ThreadPoolExecutor(1)
    assert _described(model) == before
    model.pool.shutdown()


def test_past_the_budget_big_weights_are_sampled_and_still_seen() -> None:
    """2 GB of 32 MiB weights were hashed whole, 4 s a run here: past 256 MiB each is
    hashed by 1 MiB of its bytes, and a change to all of them is still seen."""
    import numpy as np

    class Big(Scaler):
        def __init__(self, factor: float) -> None:
            super().__init__(factor)
            self.weights = [np.full(2**22, factor) for _ in range(12)]  # 12 x 32 MiB

    before, after = _described(Big(2.0)), _described(Big(3.0))
    assert before["models"][0]["state"]["weights"] != after["models"][0]["state"]["weights"]
    assert "#~" in before["models"][0]["state"]["weights"]
    assert _described(Big(2.0)) == before


def test_a_model_object_is_described_the_same_in_every_process() -> None:
    """Sets, dictionaries and addresses differ between processes (scikit-learn keeps
    ``id(stop_words)``): described as they print, every resume would be refused."""
    pytest.importorskip("sklearn")
    pytest.importorskip("torch")
    script = """
import torch
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from chute.job.fingerprint import fn_state

docs = ["a b c", "the cat sat", "a dog ran", "b c d"] * 5
pipe = make_pipeline(CountVectorizer(stop_words="english"), LogisticRegression())
pipe.fit(docs, [0, 1, 0, 1] * 5)
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
print(fn_state(pipe.predict), fn_state(net))
"""
    seen = _printed_under_hash_seeds(script, ("1", "2"))
    assert len(seen) == 1 and "CountVectorizer" in (text := seen.pop()) and "0.weight" in text


@pytest.mark.timeout(120)
def test_resume_with_a_retrained_model_object_is_refused(tmp_path: Path) -> None:
    """End to end, as the review ran it: two of four units committed with one model
    object, then the job run again with the object holding another factor."""
    _data(tmp_path / "data")
    out = tmp_path / "out"

    def job(factor: float) -> Any:
        import chute

        return chute.Job(
            chute.FileSource(str(tmp_path / "data")),
            (chute.Model("m", Scaler(factor), inputs=("x",)),),
            output=chute.Sink(str(out), file_rows=ROWS_PER_FILE),
            carryover=("id",),
            engine="local",
        )

    job(2.0).run()
    _forget_last_unit(out)
    with pytest.raises(JobStateError, match=r"changed: models\[0\]\.state \(what the model"):
        job(3.0).run()
    report = job(2.0).run()
    assert report.units_done == 1
    result = pq.read_table(out).sort_by("id")
    assert result.column("m").to_pylist() == [2.0 * v for v in range(FILES * ROWS_PER_FILE)]
