"""A model that loads nothing runs inside Ray's read tasks; every other model on actors.

The hand-written Ray task reads, predicts and writes in one task. chute does the same for
a plain function with no pool or resources asked for (``plan_stages``): no actor holds a
CPU between batches, so nothing can starve the reads, and nothing is copied between
processes. A class, an adapter or a sized pool keeps its actors: it loads once per replica.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import chute
from chute import Model, Pool, Resources
from chute.engines.resources import FUSED_NOTE, Cluster, fuses, plan_stages

HERE = Path(__file__).resolve()


def double(batch: dict[str, Any]) -> dict[str, Any]:
    return {"y": np.asarray(batch["x"]) * 2}


class Triple:
    """A class: loaded once per replica, so it keeps an actor."""

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
        pytest.param(_model("c", Triple), False, id="class"),
        pytest.param(_model("c", f"{HERE}:Triple"), False, id="class-by-path"),
        pytest.param(_model("f", double, pool=Pool.fixed(2)), False, id="pool-asked-for"),
        pytest.param(_model("f", double, resources=Resources(cpus=1)), False, id="cpus-given"),
        pytest.param(_model("f", "no_such_module_here:fn"), False, id="does-not-import-here"),
    ],
)
def test_plain_functions_fuse_and_everything_else_keeps_actors(model: Model, fused: bool) -> None:
    assert fuses(model) is fused


def test_fused_stages_leave_the_cpus_to_the_actor_pools() -> None:
    plan = plan_stages([_model("f", double), _model("c", Triple)], Cluster(cpus=4))
    assert [(s.fused, s.note == FUSED_NOTE) for s in plan] == [(True, True), (False, False)]
    assert plan[0].cpus == 1.0  # a read task's CPUs
    assert plan[1].cpus * plan[1].max == 3.0  # the class alone shares what reads leave


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
        pytest.param(["double", "Triple"], 1, id="fused-then-actor"),
        pytest.param(["Triple", "double"], 1, id="actor-then-task"),
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
    fns = {"double": double, "Triple": Triple}
    job = chute.Job(
        chute.FileSource(str(tmp_path / "in")),
        tuple(_model(f"m{i}_{name.lower()}", fns[name]) for i, name in enumerate(models)),
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
