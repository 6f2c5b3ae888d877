"""What Ray would retry forever, stopped: user code its workers cannot load stops the run
with what to do, a worker that an interrupted import left half-loaded loads it after all,
and a task whose worker dies at every run stops the run naming its unit."""

from __future__ import annotations

import importlib
import os
import re
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import chute
from chute.errors import ConfigError, ModelError
from chute.usercode import forget_interrupted_imports

ROWS = 400


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    (tmp_path / "in").mkdir()
    for i in range(4):
        ids = np.arange(i * ROWS // 4, (i + 1) * ROWS // 4)
        pq.write_table(pa.table({"id": ids, "x": ids * 1.0}), tmp_path / "in" / f"p{i}.parquet")
    return tmp_path


def _exactly_once(out: Path) -> None:
    table = pq.read_table(out, columns=["id", "m"]).sort_by("id")
    assert table.column("id").to_pylist() == list(range(ROWS))
    assert table.column("m").to_pylist() == [2.0 * i for i in range(ROWS)]


def _ray_job(
    job_dir: Path, model: chute.Model, preprocess: chute.Preprocess | None = None
) -> chute.Job:
    """The model over ``job_dir/in`` into ``job_dir/out``, ``id`` carried, on Ray."""
    return chute.Job(
        source=chute.FileSource(str(job_dir / "in")),
        models=(model,),
        preprocess=preprocess,
        carryover=("id",),
        output=chute.Sink(str(job_dir / "out")),
        engine="ray",
    )


def _pool(size: int | None) -> chute.Pool:
    return chute.Pool() if size is None else chute.Pool.fixed(size)


def _half_package(root: Path, arm: Path) -> str:
    """A package whose ``__init__`` imports a submodule, uses it, then raises while ``arm``
    exists (as fsspec's did when Ray cancelled the task importing it); its name."""
    name = f"halfpkg_{uuid.uuid4().hex[:8]}"
    (root / name).mkdir(parents=True)
    (root / name / "sub.py").write_text("FACTOR = 2.0\n")
    (root / name / "__init__.py").write_text(
        textwrap.dedent(
            f"""\
            import os
            import {name}.sub

            FACTOR = {name}.sub.FACTOR
            if os.path.exists({str(arm)!r}):
                raise RuntimeError("interrupted")
            """
        )
    )
    return name


def _import_from(folder: str, name: str) -> float:
    """Import package ``name`` from ``folder`` (a worker has it not on its path)."""
    if folder not in sys.path:
        sys.path.insert(0, folder)
    if name not in sys.modules and f"{name}.sub" in sys.modules:
        Path(folder, "met-half-loaded").touch()  # the test checks that a worker met it
    return float(importlib.import_module(name).FACTOR)


class Factor:
    """A constructor argument whose unpickling imports a package, as a model's class does
    when its module is imported by name on a worker."""

    def __init__(self, folder: str, name: str) -> None:
        self.folder, self.name = folder, name

    def __reduce__(self) -> tuple[Any, ...]:
        return (_import_from, (self.folder, self.name))


class Scale:
    def __init__(self, factor: float, column: str = "x") -> None:
        self.factor, self.column = factor, column

    def __call__(self, batch: pa.Table) -> np.ndarray:
        return np.asarray(batch[self.column]) * self.factor


def test_an_interrupted_import_leaves_the_package_unimportable_until_forgotten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    arm = tmp_path / "arm"
    arm.touch()
    name = _half_package(tmp_path, arm)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RuntimeError, match="interrupted"):
        importlib.import_module(name)
    arm.unlink()
    assert f"{name}.sub" in sys.modules and name not in sys.modules
    with pytest.raises(AttributeError, match="partially initialized module"):
        importlib.import_module(name)  # what every later import in the process meets
    assert forget_interrupted_imports() == [f"{name}.sub"]
    assert importlib.import_module(name).FACTOR == 2.0
    assert forget_interrupted_imports() == []
    for module in (name, f"{name}.sub"):
        sys.modules.pop(module, None)


def test_a_healthy_process_has_nothing_to_forget() -> None:
    import pandas  # noqa: F401  (a package of many submodules)

    assert forget_interrupted_imports() == []


def _driver_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A module this process imports from a folder Ray's workers do not have."""
    name = f"driver_only_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "driver-only"
    folder.mkdir()
    (folder / f"{name}.py").write_text(
        textwrap.dedent(
            """\
            import numpy as np


            class Double:
                def __call__(self, batch):
                    return np.asarray(batch["x"]) * 2.0


            def add_y(batch):
                return {"y": np.asarray(batch["x"]) + 1.0}


            class Setting:
                factor = 2.0
            """
        )
    )
    monkeypatch.syspath_prepend(str(folder))
    module = importlib.import_module(name)
    monkeypatch.setitem(sys.modules, name, module)  # forgotten after the test
    return module


@pytest.mark.ray
@pytest.mark.timeout(120)
@pytest.mark.parametrize("what", ["model", "arguments", "preprocess"])
def test_code_the_workers_cannot_import_stops_the_run_with_what_to_do(
    what: str, job_dir: Path, ray_session: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _driver_only(job_dir, monkeypatch)
    model = chute.Model("m", Scale, inputs=("x",), kwargs={"factor": 2.0})
    preprocess = None
    if what == "model":
        model = chute.Model("m", module.Double, inputs=("x",))
    elif what == "arguments":
        model = chute.Model("m", Scale, inputs=("x",), kwargs={"factor": module.Setting()})
    else:
        preprocess = chute.Preprocess(module.add_y, inputs=("x",))
    job = _ray_job(job_dir, model, preprocess)
    with pytest.raises(ConfigError) as info:
        job.run()
    message = str(info.value)
    named = {
        "model": "model 'm'",
        "arguments": "the arguments of model 'm'",
        "preprocess": "the preprocess fn",
    }[what]
    assert message.startswith(f"{named} cannot be loaded on the Ray worker at ")
    assert f"the module {module.__name__!r}, which is not importable there" in message
    assert "'working_dir'" in message and "docs/cluster.md" in message
    assert not list((job_dir / "out").glob("part-*"))


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_a_worker_an_interrupted_import_left_half_loaded_loads_the_model_after_all(
    job_dir: Path, ray_session: Any
) -> None:
    arm = job_dir / "arm"
    arm.touch()
    name = _half_package(job_dir / "code", arm)

    def job() -> chute.Job:
        factor = Factor(str(job_dir / "code"), name)
        return _ray_job(job_dir, chute.Model("m", Scale, inputs=("x",), kwargs={"factor": factor}))

    # Each worker's import fails half-way and leaves the package's submodule behind.
    with pytest.raises(ConfigError, match="importing its code there raised RuntimeError"):
        job().run()
    arm.unlink()
    (job_dir / "code" / "met-half-loaded").unlink(missing_ok=True)  # run 1's later tasks
    job().run()  # the same workers: each meets 'partially initialized module' first
    assert (job_dir / "code" / "met-half-loaded").exists()
    _exactly_once(job_dir / "out")


class CrashOn150:
    """Ends its worker process (as a segfault would) on the batch holding id 150, while
    the file ``arm`` exists."""

    def __init__(self, arm: str) -> None:
        self.arm = arm

    def __call__(self, batch: pa.Table) -> np.ndarray:
        if 150 in batch["id"].to_pylist() and os.path.exists(self.arm):
            os._exit(3)
        return np.asarray(batch["x"]) * 2.0


@pytest.mark.ray
@pytest.mark.timeout(240)
@pytest.mark.parametrize("pool", [None, 1], ids=["fused", "actor"])
def test_a_task_whose_worker_dies_at_every_run_stops_the_run_naming_its_unit(
    pool: int | None, job_dir: Path, ray_session: Any
) -> None:
    arm = job_dir / "arm"
    arm.touch()

    def job() -> chute.Job:
        model = chute.Model(
            "m",
            CrashOn150,
            inputs=("id", "x"),
            kwargs={"arm": str(arm)},
            pool=_pool(pool),
        )
        return _ray_job(job_dir, model)

    with pytest.raises(ModelError) as info:
        job().run()
    task = str(info.value).startswith("Ray ran the task of unit 1 4 times and its worker ")
    if task:  # the read task holding the model (Ray may fuse the read into the actor too)
        assert f"unit 1 is {job_dir / 'in' / 'p1.parquet'}" in str(info.value)
    else:  # Ray Data sent the batch again as a new task: the actor's restarts were counted
        assert pool is not None
        assert str(info.value).startswith("a replica of model 'm' (a Ray actor) died 4 times")
    assert info.value.exit_code == 4
    arm.unlink()
    job().run()  # resumes: every row once
    _exactly_once(job_dir / "out")


class CrashAtStart:
    """Ends its worker process (as a segfault would) while it loads."""

    def __init__(self) -> None:
        os._exit(3)

    def __call__(self, batch: pa.Table) -> np.ndarray:  # pragma: no cover - never loads
        return np.asarray(batch["x"])


@pytest.mark.ray
@pytest.mark.timeout(240)
@pytest.mark.parametrize("pool", [None, 1], ids=["fused", "actor"])
def test_a_model_whose_process_dies_as_it_loads_stops_the_run(
    pool: int | None, job_dir: Path, ray_session: Any
) -> None:
    model = chute.Model(
        "m",
        CrashAtStart,
        inputs=("x",),
        pool=_pool(pool),
    )
    job = _ray_job(job_dir, model)
    with pytest.raises(ModelError) as info:
        job.run()
    task = re.match(r"Ray ran the task of unit \d 4 times and its worker ", str(info.value))
    if not task:  # an actor of its own (Ray may fuse the read into it, and count its runs)
        assert pool is not None
        assert str(info.value).startswith("a replica of model 'm' (a Ray actor) died 4 times")
    assert info.value.exit_code == 4


def crash_on_150(batch: pa.Table) -> dict[str, np.ndarray]:
    """A preprocess function that ends its worker process on the batch holding id 150."""
    if 150 in batch["id"].to_pylist():
        os._exit(3)
    return {"y": np.asarray(batch["x"]) + 1.0}


@pytest.mark.ray
@pytest.mark.timeout(240)
def test_a_preprocess_task_of_its_own_whose_worker_dies_at_every_run_stops_the_run(
    job_dir: Path, ray_session: Any
) -> None:
    """``cpus: 1`` runs the preprocess function as tasks of its own, not in the reads."""
    model = chute.Model("m", Scale, inputs=("y",), kwargs={"factor": 2.0, "column": "y"})
    preprocess = chute.Preprocess(crash_on_150, inputs=("id", "x"), cpus=1)
    job = _ray_job(job_dir, model, preprocess)
    with pytest.raises(ModelError) as info:
        job.run()
    assert str(info.value).startswith("Ray ran the task of unit 1 4 times and its worker ")
