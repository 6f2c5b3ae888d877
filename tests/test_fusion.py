"""A model with no pool or resources asked for runs inside Ray's read tasks; others on actors.

The hand-written Ray task reads, predicts and writes in one task. chute does the same for
a model with no pool or resources asked for (``plan_stages``): no actor holds a CPU
between batches, so nothing can starve the reads, and nothing is copied between
processes. A class is built once per worker process and kept for the run. A sized pool,
given CPUs or memory, or an adapter that serves from processes of its own (vLLM, an
OpenAI-compatible server) keeps its actors.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import uuid
import weakref
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import chute
from chute import Model, Pool, Resources
from chute.engines.ray import operators
from chute.engines.ray.engine import RayEngine
from chute.engines.resources import (
    AFTER_POOL_NOTE,
    FUSED_NOTE,
    Cluster,
    Node,
    fuses,
    plan_stages,
)
from chute.models import AdapterSpec
from chute.plan import build_plan

HERE = Path(__file__).resolve()


def double(batch: dict[str, Any]) -> dict[str, Any]:
    return {"y": np.asarray(batch["x"]) * 2}


class Triple:
    """A class: built once per replica."""

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {"y": np.asarray(batch["x"]) * 3}


class Counted:
    """A class that leaves a file named after its process each time it is built."""

    def __init__(self, where: str) -> None:
        Path(where, f"{os.getpid()}-{uuid.uuid4().hex}").touch()

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {"y": np.asarray(batch["x"]) * 3}


def _model(name: str, fn: Any, **options: Any) -> Model:
    return Model(name, fn, inputs=["x"], batch_format="numpy", **options)


@pytest.mark.parametrize(
    ("model", "fused"),
    [
        pytest.param(_model("f", double), True, id="function"),
        pytest.param(_model("f", f"{HERE}:double"), True, id="function-by-path"),
        pytest.param(_model("f", "tests.test_fusion:double"), True, id="function-by-module"),
        pytest.param(_model("c", Triple), True, id="class"),
        pytest.param(_model("c", f"{HERE}:Triple"), True, id="class-by-path"),
        pytest.param(_model("c", Triple()), True, id="callable-object"),
        pytest.param(_model("a", AdapterSpec("sklearn", {"path": "m.skops"})), True, id="sklearn"),
        pytest.param(_model("a", AdapterSpec("vllm", {"model": "m"})), False, id="vllm"),
        pytest.param(_model("a", AdapterSpec("openai", {"model": "m"})), False, id="openai"),
        pytest.param(_model("f", double, pool=Pool.fixed(2)), False, id="pool-asked-for"),
        pytest.param(_model("c", Triple, pool=Pool(1, 4)), False, id="class-pool-asked-for"),
        pytest.param(_model("f", double, resources=Resources(cpus=1)), False, id="cpus-given"),
        pytest.param(_model("c", Triple, resources=Resources(memory=2**30)), False, id="memory"),
        pytest.param(_model("f", "no_such_module_here:fn"), False, id="does-not-import-here"),
    ],
)
def test_models_without_a_pool_fuse_and_the_others_keep_actors(model: Model, fused: bool) -> None:
    assert fuses(model) is fused


def test_fused_stages_leave_the_cpus_to_the_actor_pools() -> None:
    pooled = _model("c", Triple, pool=Pool(1, 8))
    plan = plan_stages([_model("f", double), pooled], Cluster(cpus=4))
    assert [(s.fused, s.note == FUSED_NOTE) for s in plan] == [(True, True), (False, False)]
    assert plan[0].cpus == 1.0  # a read task's CPUs
    assert plan[1].cpus * plan[1].max == 3.0  # the pool alone shares what reads leave


def test_a_model_after_a_preprocess_pool_is_not_said_to_run_in_the_read_tasks() -> None:
    """With a preprocess step of its own (cpus: 1), Ray ran the model in tasks after that
    step's pool while chute plan said "runs inside the read tasks"."""
    (stage,) = plan_stages([_model("f", double)], Cluster(cpus=4), preprocess_pool=True)
    assert stage.fused and stage.note == AFTER_POOL_NOTE
    assert "after the preprocess step's pool" in stage.note


def _actors() -> set[str]:
    """Ids of the model actors this Ray session has ever made (alive or dead)."""
    import ray

    found = ray._private.state.actors().values()
    return {str(a["ActorID"]) for a in found if "ModelActor" in str(a.get("ActorClassName"))}


@pytest.mark.ray
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("models", "actors"),
    [
        pytest.param(["double"], 0, id="fused"),
        pytest.param(["double", "Triple"], 0, id="fused-function-then-class"),
        pytest.param(["double", "Pooled"], 1, id="fused-then-actor"),
        pytest.param(["Pooled", "double"], 1, id="actor-then-task"),
    ],
)
def test_a_fused_job_makes_no_actor_and_writes_every_row_once(
    ray_session: Any, tmp_path: Path, models: list[str], actors: int
) -> None:
    rows = 5_000
    for i in range(4):
        part = pa.table({"id": np.arange(i * rows, (i + 1) * rows), "x": np.arange(rows) * 1.0})
        pq.write_table(part, tmp_path / f"in-{i}.parquet")
    (tmp_path / "in").mkdir()
    for path in tmp_path.glob("in-*.parquet"):
        path.rename(tmp_path / "in" / path.name)
    fns: dict[str, tuple[Any, dict[str, Any]]] = {
        "double": (double, {}),
        "Triple": (Triple, {}),
        "Pooled": (Triple, {"pool": Pool.fixed(1)}),
    }
    job = chute.Job(
        chute.FileSource(str(tmp_path / "in")),
        tuple(
            _model(f"m{i}_{name.lower()}", fns[name][0], **fns[name][1])
            for i, name in enumerate(models)
        ),
        output=chute.Sink(str(tmp_path / "out")),
        carryover=("id", "x"),
        engine="ray",
    )
    before = _actors()
    result = job.run()
    assert len(_actors() - before) == actors
    out = pq.read_table(tmp_path / "out").to_pandas().sort_values("id")
    assert result.rows_out == len(out) == 4 * rows
    assert out["id"].tolist() == list(range(4 * rows))  # every row once
    for i, name in enumerate(models):
        factor = 2 if name == "double" else 3
        assert (out[f"m{i}_{name.lower()}_y"] == out["x"] * factor).all()


@pytest.mark.ray
@pytest.mark.timeout(240)
def test_a_fused_class_is_built_once_per_worker_process_each_run(
    ray_session: Any, tmp_path: Path
) -> None:
    """Twelve files, twelve read tasks on 2 CPUs: the class is built once in each worker
    process that ran them, not once a task; a second run builds its own."""
    (tmp_path / "in").mkdir()
    for i in range(12):
        part = pa.table({"id": np.arange(i * 100, (i + 1) * 100), "x": np.arange(100) * 1.0})
        pq.write_table(part, tmp_path / "in" / f"in-{i:02d}.parquet")
    for run in ("one", "two"):
        built = tmp_path / f"built-{run}"
        built.mkdir()
        model = Model(
            "m", Counted, inputs=["x"], batch_format="numpy", kwargs={"where": str(built)}
        )
        job = chute.Job(
            chute.FileSource(str(tmp_path / "in")),
            (model,),
            output=chute.Sink(str(tmp_path / f"out-{run}")),
            carryover=("id", "x"),
            engine="ray",
        )
        before = _actors()
        result = job.run()
        assert _actors() == before  # no actor
        per_process = Counter(p.name.split("-")[0] for p in built.iterdir())
        assert per_process and set(per_process.values()) == {1}, per_process
        out = pq.read_table(tmp_path / f"out-{run}").to_pandas().sort_values("id")
        assert result.rows_out == len(out) == 1_200
        assert out["id"].tolist() == list(range(1_200))
        assert (out["m_y"] == out["x"] * 3).all()


def _task_args(fn: Any) -> dict[str, Any]:
    """What a fused model task is built with, for ``fn`` on column ``x``, writing nothing."""
    return {
        "model": _model("m", fn),
        "inputs": ["x"],
        "target": None,
        "ctor": None,
        "output": None,
        "rows": 100,
    }


def test_a_new_run_drops_the_replicas_of_earlier_runs(ray_session: Any) -> None:
    """A worker process keeps the fused replicas of the latest run only: a class may hold
    a big model, and an earlier run's is never used again."""
    actor = _task_args(f"{HERE}:Triple")
    block = pa.table({"x": np.arange(10.0)})
    operators._replicas.clear()
    operators.ModelTask("run1", "a", **actor)(block)
    operators.ModelTask("run1", "b", **actor)(block)
    first = operators._replicas["run1", "a"]
    operators.ModelTask("run1", "a", **actor)(block)
    assert operators._replicas["run1", "a"] is first  # built once for the run
    operators.ModelTask("run2", "a", **actor)(block)
    assert sorted(operators._replicas) == [("run2", "a")]
    operators._replicas.clear()


class Cyclic:
    """A class whose instances hold a reference cycle, as many real models do: only the
    cycle collector frees one. Each records how many others were alive when it was built."""

    live: ClassVar[weakref.WeakSet[Cyclic]] = weakref.WeakSet()
    seen: ClassVar[list[int]] = []

    def __init__(self) -> None:
        Cyclic.seen.append(len(Cyclic.live))
        Cyclic.live.add(self)
        self.me = self

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {"y": np.asarray(batch["x"])}


def test_an_earlier_runs_replica_is_freed_before_the_next_one_is_built() -> None:
    """A big model loaded while the last run's copy is still held costs twice the memory
    and, measured, 13× the load time (800 MB of NumPy: 1.3 s against 0.1 s): the old
    replica is freed, cycles included, before the new one is built."""
    actor = _task_args(Cyclic)
    block = pa.table({"x": np.arange(10.0)})
    operators._replicas.clear()
    Cyclic.seen.clear()
    gc.collect()
    gc.disable()  # only chute's own collection may free the cycle
    try:
        for run in ("run1", "run2", "run3"):
            operators.ModelTask(run, "m", **actor)(block)
    finally:
        gc.enable()
        operators._replicas.clear()
    assert Cyclic.seen == [0, 0, 0]


@pytest.mark.parametrize(("fn", "collections"), [(Triple, 0), (double, 0), (Cyclic, 1)])
def test_the_cycle_collector_runs_only_for_a_model_that_outlives_its_replica(
    fn: Any, collections: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full collection costs a worker process 50-100 ms at the start of every run: only a
    model that outlived its dropped replica (a cycle) is worth one."""
    actor = _task_args(fn)
    block = pa.table({"x": np.arange(10.0)})
    operators._replicas.clear()
    operators.ModelTask("run1", "m", **actor)(block)
    calls: list[int] = []
    monkeypatch.setattr(operators.gc, "collect", lambda: calls.append(1) or 0)
    gc.disable()
    try:
        operators.ModelTask("run2", "m", **actor)(block)
    finally:
        gc.enable()
        operators._replicas.clear()
    assert len(calls) == collections


class Loads:
    """A class that would load the file it is given."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {"y": np.asarray(batch["x"])}


GIB = 2**30


def _sparse(path: Path, size: int) -> str:
    with open(path, "wb") as handle:
        handle.truncate(size)  # its size on paper: no disk used
    return str(path)


@pytest.mark.parametrize(
    ("make", "memory", "fused"),
    [
        pytest.param(lambda f: _model("c", Loads, args=(f,)), 64 * GIB, True, id="fits"),
        pytest.param(lambda f: _model("c", Loads, args=(f,)), 16 * GIB, False, id="too-big"),
        pytest.param(lambda f: _model("c", Loads, args=(f,)), None, True, id="memory-unknown"),
        pytest.param(
            lambda f: _model("c", Loads, kwargs={"path": f}), 16 * GIB, False, id="keyword"
        ),
        pytest.param(
            lambda f: _model("a", AdapterSpec("onnx", {"path": f})), 16 * GIB, False, id="adapter"
        ),
    ],
)
def test_a_model_whose_files_would_not_fit_once_per_cpu_keeps_its_actors(
    tmp_path: Path, make: Any, memory: float | None, fused: bool
) -> None:
    """2 GiB of files, a replica per CPU on a node of 4 CPUs: 8 GiB, over a quarter of
    16 GiB (actors) and under a quarter of 64 GiB (fused)."""
    model = make(_sparse(tmp_path / "weights.bin", 2 * GIB))
    cluster = Cluster(cpus=4, memory=memory, nodes=(Node("10.0.0.1", 4, 0, memory),))
    assert fuses(model) is True  # the files are what decides
    assert fuses(model, cluster) is fused
    stage = plan_stages([model], cluster)[0]
    assert stage.fused is fused
    if not fused:
        assert stage.note.startswith(
            "on actors, not in the read tasks: its files (2.0 GiB) loaded once per CPU "
            "would take 8.0 GiB of a node's 16.0 GiB; "
        )
        assert stage.max == 3  # the pool it gets instead: the CPUs reads leave


@pytest.mark.ray
@pytest.mark.timeout(120)
@pytest.mark.parametrize("pool", [Pool(), Pool.fixed(1)], ids=["fused", "actors"])
def test_chute_datasets_turn_ray_datas_reservations_off(
    ray_session: Any, tmp_path: Path, pool: Pool
) -> None:
    """Ray Data's per-operator reservations ran chute's fused read tasks one at a time on
    2 CPUs (benchmarks/RESULTS.md, 2026-11-26); chute plans reads and pools itself, so its
    datasets turn them off, through a field Ray Data must still have: if a Ray release
    drops it, setting it would do nothing, and this fails."""
    import dataclasses

    from ray.data import DataContext

    assert "op_resource_reservation_enabled" in {f.name for f in dataclasses.fields(DataContext)}
    pq.write_table(pa.table({"id": np.arange(10), "x": np.arange(10.0)}), tmp_path / "in.parquet")
    job = chute.Job(
        chute.FileSource(str(tmp_path / "in.parquet")),
        (_model("m", Triple, pool=pool),),
        output=chute.Sink(str(tmp_path / "out")),
        engine="ray",
    )
    plan = build_plan(job)
    engine = RayEngine()
    dataset = engine._dataset(plan, engine.resources(plan), 1.0)
    assert dataset.context.op_resource_reservation_enabled is False
    assert DataContext.get_current().op_resource_reservation_enabled is True  # others' as it was


@pytest.mark.ray
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("cpus", "fused"), [(1.0, True), (0.5, False)])
def test_reads_fuse_into_the_model_actors_that_ask_a_read_tasks_cpus(
    ray_session: Any, tmp_path: Path, cpus: float, fused: bool
) -> None:
    """Issue 18, point 5: a 2,000-file run took twice as long with the model's actor kept
    off the driver's node, or pinned to it, by a scheduling strategy (benchmarks/RESULTS.md,
    2026-11-26 20:30): Ray Data then no longer fused the read tasks into the actors, and
    every block went from a read task to an actor. chute sets nothing on its actors that
    keeps Ray Data from fusing the reads into them where the CPUs asked match."""
    pq.write_table(pa.table({"id": np.arange(10), "x": np.arange(10.0)}), tmp_path / "in.parquet")
    job = chute.Job(
        chute.FileSource(str(tmp_path / "in.parquet")),
        (_model("m", Triple, pool=Pool.fixed(1), resources=Resources(cpus=cpus)),),
        output=chute.Sink(str(tmp_path / "out")),
        engine="ray",
    )
    plan = build_plan(job)
    engine = RayEngine()
    resources = engine.resources(plan)
    dataset = engine._dataset(plan, resources, 1.0)
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        dataset.explain()
    optimized = shown.getvalue().split("Physical Plan (Optimized)")[1]
    one = "ActorPoolMapOperator[ReadChuteUnits->MapBatches(ModelActor)]" in optimized
    assert one is fused, optimized
    # and chute plan says which, as Ray Data decides it
    (note,) = [n for n in resources[0].note.split("; ") if "read tasks" in n]
    assert note.startswith("the read tasks fuse into its actors" if fused else "its actors take")


def test_the_first_pool_says_whether_the_reads_fuse_into_it() -> None:
    """Ray Data fuses the reads (and the models fused into them) into the first pool's
    actors only where they ask the same resources; a preprocess pool stands between."""
    cluster = Cluster(cpus=4, gpus=1, nodes=(Node("10.0.0.1", 4, 1),))

    def first_pool(resources: Resources, preprocess_pool: bool = False) -> str:
        models = [_model("a", double), _model("b", Triple, pool=Pool.fixed(1), resources=resources)]
        stages = plan_stages(models, cluster, preprocess_pool)
        assert stages[0].fused
        assert stages[0].note == (AFTER_POOL_NOTE if preprocess_pool else FUSED_NOTE)
        return stages[1].note

    assert first_pool(Resources(cpus=1)).startswith("the read tasks fuse into its actors")
    assert first_pool(Resources(cpus=0.5)).startswith(
        "its actors take blocks from read tasks of their own (a replica asks 0.5 CPU, a read 1 CPU)"
    )
    assert "(a replica asks 1 CPU, 1 GPU, a read 1 CPU)" in first_pool(Resources(cpus=1, gpus=1))
    assert first_pool(Resources(cpus=1), preprocess_pool=True) == ""
