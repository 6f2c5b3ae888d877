"""The engine registry: engines by name, imported when used, each with the protocol."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

import chute
from chute import engines
from chute.config import load_job
from chute.engines import EngineOptions
from chute.errors import ConfigError


def test_every_registered_engine_has_the_protocol() -> None:
    for name in engines.names():
        engine = engines.create(name, EngineOptions())
        for method in ("prepare", "execute", "stage_resources"):
            assert callable(getattr(engine, method)), (name, method)


def test_an_unknown_engine_says_which_exist_and_guesses() -> None:
    with pytest.raises(ConfigError, match=r"not one of auto, local, ray\. Did you mean 'ray'\?"):
        engines.create("rya")


def test_importing_chute_imports_no_engine() -> None:
    code = "import sys, chute; print(sorted(m for m in sys.modules if 'engines.' in m))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.timeout(120)
def test_an_engine_is_one_line_in_the_registry(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Registered under a new name, an engine is accepted by the job file and runs the job:
    nothing else lists the engines."""
    monkeypatch.setitem(engines.ENGINES, "threads", engines.ENGINES["local"])
    pd.DataFrame({"x": range(100)}).to_parquet(tmp_path / "in.parquet")
    (tmp_path / "job.yaml").write_text(
        "input: {path: in.parquet}\n"
        "models: [{name: double, fn: 'tests.test_registry:double'}]\n"
        "output: {path: out}\n"
        "engine: threads\n"
    )
    report = load_job(str(tmp_path / "job.yaml")).run()
    assert (report.engine, report.rows_out) == ("threads", 100)
    assert sorted(pd.read_parquet(tmp_path / "out")["double"]) == [2 * x for x in range(100)]


def double(batch: dict[str, object]) -> object:
    import numpy as np

    return np.asarray(batch["x"]) * 2


def test_a_misspelt_engine_in_a_job_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(
        "input: {path: in.parquet}\nmodels: [{name: m, fn: 'x:y'}]\noutput: {path: out}\n"
        "engine: rya\n"
    )
    with pytest.raises(ConfigError, match=r"engine: not one of auto, local, ray\. Did you mean"):
        load_job(str(tmp_path / "job.yaml"))


def test_an_in_process_engine_with_a_cluster_address_is_refused() -> None:
    """``engine: local`` with ``--address head:6379`` ran here without a word."""
    model = chute.Model("m", lambda batch: batch, inputs=("x",))
    job = chute.Job(
        source=chute.TableSource(pa.table({"x": [1]})),
        models=(model,),
        engine="local",
        address="head:6379",
    )
    with pytest.raises(ConfigError, match="the local engine, which runs in this process, and"):
        engines.choose(job)
    assert engines.choose(dataclasses.replace(job, engine="auto"))[0] == "ray"


def test_no_module_outside_the_engines_compares_an_engine_name() -> None:
    """Which engine runs a job is decided in ``chute.engines`` only (``storage.py``'s
    ``"local"`` is a filesystem scheme, not an engine)."""
    root = Path(chute.__file__).parent
    found = []
    for path in root.rglob("*.py"):
        if "engines" in path.relative_to(root).parts or path.name == "storage.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                names = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant)}
                if names & set(engines.names()):
                    found.append(f"{path.name}:{node.lineno}")
    assert found == []
