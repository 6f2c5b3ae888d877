"""Ray resource planning as plain functions: actor pools never take the CPU kept for reads."""

from __future__ import annotations

import ctypes
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chute import Model, Pool, ResourceError, Resources
from chute.engines.resources import (
    Cluster,
    Node,
    StageResources,
    gpu_slots,
    local_replicas,
    local_threads,
    local_writers,
    plan_resources,
    read_cpus,
)

GiB = 2**30


def fn(batch: Any) -> Any:
    return batch


def _models(*specs: dict[str, Any]) -> list[Model]:
    return [Model(f"m{i}", fn, **spec) for i, spec in enumerate(specs)]


def _actor_cpus(plan: list[StageResources]) -> float:
    """CPUs the actor pools hold at their largest."""
    return sum(s.cpus * s.max for s in plan)


# -- a 2-CPU cluster with default resources ----------------------------------------------


@pytest.mark.parametrize(
    "pools",
    [
        pytest.param([Pool()], id="one-model"),
        pytest.param([Pool(), Pool()], id="two-models"),
        pytest.param([Pool(), Pool(), Pool()], id="three-models"),
        pytest.param([Pool.fixed(2)], id="one-fixed-2"),
        pytest.param([Pool.fixed(3)], id="one-fixed-3"),
        pytest.param([Pool.fixed(6)], id="one-fixed-6"),
        pytest.param([Pool(min=1, max=7)], id="one-range-1-7"),
        pytest.param([Pool(min=2)], id="one-min-2-no-max"),
        pytest.param([Pool(min=1, max=4), Pool()], id="range-and-default"),
        pytest.param([Pool.fixed(3), Pool.fixed(3)], id="two-fixed-3"),
        pytest.param([Pool(min=2, max=3), Pool.fixed(1), Pool(min=1, max=2)], id="three-mixed"),
    ],
)
def test_two_cpu_cluster_keeps_one_cpu_for_reads(pools: list[Pool]) -> None:
    models = _models(*({"pool": p} for p in pools))
    plan = plan_resources(models, Cluster(cpus=2))
    assert [s.name for s in plan] == [m.name for m in models]
    assert _actor_cpus(plan) <= 1.0
    for stage, pool in zip(plan, pools, strict=True):
        assert stage.cpus > 0
        assert stage.min == pool.min
        assert stage.max >= stage.min
        if pool.max is not None:
            assert stage.max == pool.max


def test_one_default_model_gets_one_whole_cpu() -> None:
    (stage,) = plan_resources(_models({}), Cluster(cpus=2))
    assert (stage.cpus, stage.min, stage.max, stage.note) == (1.0, 1, 1, "")


def test_scaled_stages_say_so() -> None:
    plan = plan_resources(_models({}, {}), Cluster(cpus=2))
    assert [s.cpus for s in plan] == [0.5, 0.5]
    assert all("so that reads keep 1 CPU" in s.note for s in plan)


def test_big_cluster_gives_default_pools_a_share_each() -> None:
    plan = plan_resources(_models({}, {}), Cluster(cpus=9))
    assert [(s.cpus, s.max) for s in plan] == [(1.0, 4), (1.0, 4)]
    assert _actor_cpus(plan) <= 9 - 1


@pytest.mark.parametrize(
    ("cpus", "reserve"),
    [
        pytest.param(1, 0.5, id="one-cpu"),
        pytest.param(2, 1.0, id="two-cpus"),
        pytest.param(64, 1.0, id="many-cpus"),
    ],
)
def test_reserve(cpus: float, reserve: float) -> None:
    cluster = Cluster(cpus=cpus)
    assert cluster.reserve == reserve
    plan = plan_resources(_models({}, {}), cluster)
    assert _actor_cpus(plan) <= cpus - reserve


# -- explicit CPUs -----------------------------------------------------------------------


def test_explicit_cpus_that_fit_are_kept() -> None:
    plan = plan_resources(_models({"resources": Resources(cpus=0.25)}), Cluster(cpus=2))
    assert [(s.cpus, s.max) for s in plan] == [(0.25, 4)]


def test_explicit_cpus_keep_their_value_and_others_scale() -> None:
    models = _models({"resources": Resources(cpus=0.5)}, {}, {})
    plan = plan_resources(models, Cluster(cpus=2))
    assert plan[0].cpus == 0.5
    assert plan[0].note == ""
    assert plan[1].cpus == plan[2].cpus == 0.25
    assert _actor_cpus(plan) <= 1.0


@pytest.mark.parametrize(
    ("specs", "needed"),
    [
        pytest.param([{"resources": Resources(cpus=2)}], "2", id="two-cpus-one-replica"),
        pytest.param([{"resources": Resources(cpus=1), "pool": Pool.fixed(2)}], "2",
                     id="one-cpu-two-replicas"),
        pytest.param([{"resources": Resources(cpus=0.75)}, {"resources": Resources(cpus=0.5)}],
                     "1.25", id="two-explicit"),
        pytest.param([{"resources": Resources(cpus=1)}, {}], "2", id="explicit-leaves-no-room"),
    ],
)  # fmt: skip
def test_explicit_cpus_that_do_not_fit(specs: list[dict[str, Any]], needed: str) -> None:
    with pytest.raises(ResourceError) as info:
        plan_resources(_models(*specs), Cluster(cpus=2))
    text = str(info.value)
    assert f"the model pools need {needed} CPUs at their largest" in text
    assert "but only 1 can go to model actors" in text
    assert "Ray issue 44687" in text


# -- GPUs --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpus", "pool", "cluster_gpus", "asked"),
    [
        pytest.param(1.0, Pool(), 0, "1", id="one-gpu-on-cpu-cluster"),
        pytest.param(0.5, Pool(), 0, "0.5", id="fraction-on-cpu-cluster"),
        pytest.param(1.0, Pool.fixed(3), 2, "3", id="pool-min-too-big"),
    ],
)
def test_gpus_the_cluster_lacks(gpus: float, pool: Pool, cluster_gpus: float, asked: str) -> None:
    models = _models({"resources": Resources(gpus=gpus), "pool": pool})
    message = f"model 'm0' asks for {asked} GPU(s)"
    with pytest.raises(ResourceError, match=re.escape(message)) as info:
        plan_resources(models, Cluster(cpus=8, gpus=cluster_gpus))
    assert f"the cluster has {cluster_gpus:g}" in str(info.value)
    assert "gpus: 0" in str(info.value)


@pytest.mark.parametrize(
    ("gpus", "pool", "replicas"),
    [
        pytest.param(0.25, Pool(), 4, id="quarter-gpus-four-replicas"),
        pytest.param(0.5, Pool(min=1, max=8), 2, id="half-gpus-capped"),
        pytest.param(1.0, Pool(), 1, id="whole-gpu"),
        pytest.param(0.3, Pool(), 3, id="thirds-round-down"),
    ],
)
def test_fractional_gpus_share_one_gpu(gpus: float, pool: Pool, replicas: int) -> None:
    models = _models({"resources": Resources(gpus=gpus), "pool": pool})
    (stage,) = plan_resources(models, Cluster(cpus=16, gpus=1))
    assert stage.gpus == gpus
    assert stage.max == replicas
    assert stage.gpus * stage.max <= 1.0 + 1e-9


def test_gpu_model_next_to_cpu_model() -> None:
    models = _models({"resources": Resources(gpus=1)}, {})
    plan = plan_resources(models, Cluster(cpus=2, gpus=1))
    assert [s.gpus for s in plan] == [1.0, 0.0]
    assert _actor_cpus(plan) <= 1.0


def test_gpu_models_whose_pools_need_more_gpus_together_than_the_cluster_has() -> None:
    """Each fit on its own: the second pool waited forever for the GPU the first held."""
    models = _models({"resources": Resources(gpus=1)}, {"resources": Resources(gpus=1)})
    with pytest.raises(ResourceError, match=r"together ask for 2 GPU.*'m0' 1 × 1, 'm1' 1 × 1"):
        plan_resources(models, Cluster(cpus=4, gpus=1))
    halves = _models({"resources": Resources(gpus=0.5)}, {"resources": Resources(gpus=0.5)})
    assert len(plan_resources(halves, Cluster(cpus=4, gpus=1))) == 2


# -- memory ------------------------------------------------------------------------------


def test_a_replica_needs_a_node_with_its_memory() -> None:
    """The cluster's total was checked: two 6 GiB nodes took an 8 GiB replica, which no
    node could place (a run that waited forever)."""
    models = _models({"resources": Resources(memory=8 * GiB)})
    nodes = (Node("a", 2, 0, 6 * GiB), Node("b", 2, 0, 6 * GiB))
    with pytest.raises(ResourceError, match=r"8\.0 GiB of memory per replica, but no node .*6\.0"):
        plan_resources(models, Cluster(cpus=4, memory=12 * GiB, nodes=nodes))


def test_memory_too_large() -> None:
    models = _models({"resources": Resources(memory=64 * GiB)})
    with pytest.raises(
        ResourceError,
        match=r"asks for 64\.0 GiB of memory but the cluster has 8\.0 .*lower resources\.memory",
    ):
        plan_resources(models, Cluster(cpus=2, memory=8 * GiB))


def test_memory_counts_the_minimum_pool() -> None:
    models = _models({"resources": Resources(memory=3 * GiB), "pool": Pool.fixed(3)})
    with pytest.raises(ResourceError, match=r"asks for 9\.0 GiB"):
        plan_resources(models, Cluster(cpus=8, memory=8 * GiB))


def test_memory_that_fits_is_passed_on() -> None:
    models = _models({"resources": Resources(memory=2 * GiB)})
    (stage,) = plan_resources(models, Cluster(cpus=2, memory=8 * GiB))
    assert stage.memory == 2 * GiB


def test_cluster_from_ray_resources() -> None:
    cluster = Cluster.from_ray({"CPU": 4.0, "GPU": 1.0, "memory": 1e9, "node:x": 1.0})
    assert cluster == Cluster(cpus=4.0, gpus=1.0, memory=1e9)
    assert Cluster.from_ray({}) == Cluster(cpus=0.0, gpus=0.0, memory=None)


@pytest.mark.parametrize(
    ("pool", "cpus", "cores", "replicas"),
    [
        pytest.param(Pool(), None, 8, 1, id="default-one"),
        pytest.param(Pool.fixed(3), 1.0, 2, 3, id="fixed-as-given"),
        pytest.param(Pool(min=1, max=8), 1.0, 2, 2, id="range-fits-the-cores"),
        pytest.param(Pool(min=1, max=8), 0.5, 2, 4, id="half-cpu-replicas"),
        pytest.param(Pool(min=3, max=8), 1.0, 2, 3, id="never-below-min"),
        pytest.param(Pool(min=1, max=2), 0.25, 16, 2, id="never-above-max"),
    ],
)
def test_local_replicas(pool: Pool, cpus: float | None, cores: int, replicas: int) -> None:
    model = Model("m", lambda b: b, pool=pool, resources=Resources(cpus=cpus))
    assert local_replicas(model, cores) == replicas


@pytest.mark.parametrize(
    ("gpus", "visible", "replicas", "slots"),
    [
        pytest.param(0.0, "0,1", 2, [None, None], id="cpu-model"),
        pytest.param(1.0, "0,1", 2, [0, 1], id="one-each"),
        pytest.param(0.5, "0,1", 4, [0, 0, 1, 1], id="halves-pair-up"),
        pytest.param(1.0, "0", 3, [0, 0, 0], id="round-one-gpu"),
    ],
)
def test_local_replicas_spread_over_the_machines_gpus(
    monkeypatch: pytest.MonkeyPatch,
    gpus: float,
    visible: str,
    replicas: int,
    slots: list[int | None],
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    model = Model("m", lambda b: b, resources=Resources(gpus=gpus))
    assert gpu_slots(model, replicas) == slots


def test_a_replica_context_names_its_device() -> None:
    from chute.models import ReplicaContext

    assert ReplicaContext("m").device == "cpu"
    assert ReplicaContext("m", Resources(gpus=0.5)).device == "cuda"  # on Ray: the one it sees
    assert ReplicaContext("m", Resources(gpus=1), gpu=1).device == "cuda:1"


# -- cluster shapes (issue 18): reads always get CPU, or the plan says why not --------------


def _nodes(*shapes: tuple[float, float]) -> Cluster:
    nodes = tuple(Node(f"127.0.0.{i + 2}", c, g) for i, (c, g) in enumerate(shapes))
    return Cluster(sum(n.cpus for n in nodes), sum(n.gpus for n in nodes), nodes=nodes)


@pytest.mark.parametrize(
    ("cluster", "reads"),
    [
        pytest.param(_nodes((1, 0)), 0.5, id="one-1-cpu-node"),
        pytest.param(_nodes((0, 0), (1, 0)), 0.5, id="0-cpu-head-1-cpu-worker"),
        pytest.param(_nodes((0, 0), (2, 0)), 1.0, id="0-cpu-head-2-cpu-worker"),
        pytest.param(_nodes((1, 0), (4, 0), (2, 0)), 1.0, id="nodes-of-different-sizes"),
        pytest.param(Cluster(cpus=1.5), 0.75, id="one-and-a-half-cpus"),
    ],
)
def test_a_read_task_and_the_pools_fit_every_shape(cluster: Cluster, reads: float) -> None:
    plan = plan_resources(_models({}), cluster)
    assert read_cpus(cluster) == reads
    assert _actor_cpus(plan) + reads <= cluster.cpus + 1e-9  # was 0.5 + 1 on one 1-CPU node
    largest = max((n.cpus for n in cluster.nodes), default=cluster.cpus)
    assert all(s.cpus <= largest for s in plan)  # every replica fits on one node


def test_a_cluster_without_cpus_is_refused_saying_so() -> None:
    with pytest.raises(ResourceError) as info:
        plan_resources(_models({}), _nodes((0, 0)))
    text = str(info.value)
    assert "the Ray cluster has no CPUs (0 CPUs, 0 GPUs on 1 node (127.0.0.2: 0 CPU))" in text
    assert "Add a node with CPUs" in text
    assert "Lower the pool sizes" not in text  # which cannot help there


def test_a_gpu_only_worker_takes_replicas_with_no_cpu() -> None:
    (stage,) = plan_resources(_models({"resources": Resources(gpus=1)}), _nodes((2, 0), (0, 1)))
    assert (stage.cpus, stage.gpus, stage.max) == (0.0, 1.0, 1)
    assert "cpus lowered to 0: no node with its GPUs has more" in stage.note


def test_cpus_given_that_no_node_holds_are_refused_naming_the_nodes() -> None:
    models = _models({"resources": Resources(cpus=1, gpus=1)})
    with pytest.raises(ResourceError) as info:
        plan_resources(models, _nodes((2, 0), (0, 1)))
    text = " ".join(str(info.value).split())
    assert "model 'm0' asks for 1 CPU and 1 GPU per replica, but no node" in text
    assert "(127.0.0.2: 2 CPU; 127.0.0.3: 0 CPU, 1 GPU)" in text
    assert "Lower cpus to 0 or less, or add a node with 1 CPU and 1 GPU." in text


def test_cluster_nodes_from_ray() -> None:
    alive = {"Alive": True, "NodeManagerAddress": "127.0.0.3", "Resources": {"CPU": 2.0}}
    dead = {"Alive": False, "NodeManagerAddress": "127.0.0.4", "Resources": {"CPU": 1.0}}
    cluster = Cluster.from_ray({"CPU": 2.0}, [alive, dead])
    assert cluster.nodes == (Node("127.0.0.3", 2.0),)
    assert cluster.describe() == "2 CPUs, 0 GPUs on 1 node (127.0.0.3: 2 CPU)"


# -- intra-op threads follow the cluster, not the CPU token ------------------------------


@pytest.mark.parametrize(
    ("cluster", "specs", "threads"),
    [
        # one 1-CPU actor beside the read reserve: both CPUs as threads (Ray's token: 1)
        pytest.param(Cluster(cpus=2), [{}], [2], id="2-cpus-one-model"),
        pytest.param(Cluster(cpus=2), [{}, {}], [1, 1], id="2-cpus-two-models"),
        pytest.param(Cluster(cpus=16), [{}], [1], id="16-cpus-fifteen-replicas"),
        pytest.param(Cluster(cpus=16), [{"pool": Pool.fixed(2)}], [8], id="16-cpus-fixed-2"),
        # three replicas of 4 CPUs: the 16 CPUs shared, 5 threads each
        pytest.param(Cluster(cpus=16), [{"resources": Resources(cpus=4)}], [5], id="cpus-4"),
        pytest.param(
            Cluster(cpus=16, nodes=(Node("a", 4), Node("b", 12))),
            [{"pool": Pool.fixed(1)}],
            [12],
            id="never-more-than-a-node",
        ),
        pytest.param(Cluster(cpus=1), [{}], [1], id="1-cpu"),
        # one GPU, one replica: the node's CPUs for its CPU side
        pytest.param(Cluster(cpus=8, gpus=1), [{"resources": Resources(gpus=1)}], [8], id="gpu"),
    ],
)
def test_threads_share_the_clusters_cpus_among_the_replicas(
    cluster: Cluster, specs: list[dict[str, Any]], threads: list[int]
) -> None:
    plan = plan_resources(_models(*specs), cluster)
    assert [s.threads for s in plan] == threads
    assert sum(s.threads * s.max for s in plan) <= max(cluster.cpus, len(plan))


def test_local_threads_share_the_cores_among_every_models_replicas() -> None:
    assert local_threads(_models({}), cores=2) == [2]
    assert local_threads(_models({}, {}), cores=2) == [1, 1]  # was 2 each: 4 on 2 cores
    assert local_threads(_models({"pool": Pool(min=1, max=4)}), cores=2) == [1]  # 2 replicas
    assert local_threads(_models({}, {"resources": Resources(cpus=3)}), cores=8) == [2, 6]


@pytest.mark.parametrize(("cores", "writers"), [(1, 2), (2, 2), (8, 2), (12, 3), (16, 4), (64, 16)])
def test_local_writers_one_per_four_cores_two_at_least(cores: int, writers: int) -> None:
    assert local_writers(cores) == writers


class TorchThreads:
    """A user's class that uses torch but never sets its threads: it reports torch's."""

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import numpy as np
        import torch

        return {"threads": np.full(len(batch["x"]), torch.get_num_threads())}


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_a_ray_actor_runs_on_the_planned_threads_not_its_cpu_token(
    ray_session: Any, tmp_path: Any
) -> None:
    """On 2 CPUs the one model actor holds a 1-CPU token (Ray sets OMP_NUM_THREADS=1 from
    it) and gets 2 threads from the plan: torch in the user's class sees 2. Without the
    pool, the class is fused into the read tasks, one per CPU: one thread each."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import chute

    pq.write_table(pa.table({"x": [1.0, 2.0, 3.0]}), tmp_path / "in.parquet")
    for pool, threads in ((Pool.fixed(1), 2), (Pool(), 1)):
        model = Model("m", TorchThreads, inputs=["x"], batch_format="numpy", pool=pool)
        job = chute.Job(
            chute.FileSource(str(tmp_path / "in.parquet")),
            (model,),
            output=chute.Sink(str(tmp_path / f"out-{threads}")),
            engine="ray",
        )
        if pool != Pool():
            assert [s.threads for s in plan_resources([model], Cluster(cpus=2))] == [2]
        job.run()
        out = pq.read_table(tmp_path / f"out-{threads}")
        assert set(out.column("m_threads").to_pylist()) == {threads}


@pytest.mark.timeout(120)
def test_two_torch_models_in_one_local_job_each_keep_their_threads() -> None:
    """torch keeps its thread setting per thread, so each replica sets its model's on the
    thread that calls it: two models on 2 cores get one thread each; one of ``cpus: 2``
    beside one of ``cpus: 1`` get 2 and 1 (the shares of 3 CPUs on 2 cores, whole), also
    when a timeout makes another thread call the model. Before, both ran on what was set
    last anywhere in the process."""
    import numpy as np
    import pyarrow as pa
    import torch

    import chute

    table = pa.table({"x": np.arange(4_000, dtype=np.float64)})
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # what a user's code elsewhere in the process set
        for resources, expected, timeout in (
            ((None, None), (1, 1), None),
            ((2.0, 1.0), (2, 1), None),
            ((2.0, 1.0), (2, 1), 60.0),
        ):
            models = [
                Model(
                    name,
                    TorchThreads,
                    inputs=["x"],
                    batch_format="numpy",
                    batch_size=500,
                    resources=Resources(cpus=cpus),
                    timeout=timeout,
                )
                for name, cpus in zip(("a", "b"), resources, strict=True)
            ]
            assert local_threads(models, cores=2) == list(expected)
            report = chute.Job(chute.TableSource(table), tuple(models), engine="local").run()
            assert report.result is not None
            seen = [set(report.result.column(f"{m}_threads").to_pylist()) for m in "ab"]
            assert seen == [{expected[0]}, {expected[1]}], (resources, timeout)
    finally:
        torch.set_num_threads(before)


class Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def malloc_16mib() -> dict[str, int]:
    """Allocate and free 16 MiB with glibc's malloc (as a batch's activations are): the
    bytes it mapped for them, and the bytes its heaps keep free after."""
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = Mallinfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    before = libc.mallinfo2()
    buffer = libc.malloc(16 * 1024 * 1024)
    mapped = libc.mallinfo2().hblkhd - before.hblkhd
    libc.free(buffer)
    return {"mapped": int(mapped), "kept": int(libc.mallinfo2().fordblks - before.fordblks)}


MIB = 1024 * 1024
GLIBC = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="tunes glibc's malloc: Linux with glibc only",
)


@GLIBC
@pytest.mark.parametrize("tuning", ["1", "0"])
def test_tuned_malloc_keeps_a_batchs_big_buffers_for_the_next(tuning: str) -> None:
    """In a fresh process, once tuned, a 16 MiB buffer comes from malloc's heap and stays
    there, free, when released, rather than being mapped and unmapped (and faulted in
    again by the next batch). ``CHUTE_MALLOC_TUNING=0`` leaves glibc's own behaviour,
    which maps it."""
    probe = (
        "import json\n"
        "from chute.models.base import keep_freed_memory\n"
        "from tests.test_resources import malloc_16mib\n"
        "keep_freed_memory()\n"
        "print(json.dumps(malloc_16mib()))\n"
    )
    seen = _in_a_fresh_process(probe, tuning)
    if tuning == "1":
        assert seen["mapped"] < 4 * MIB and seen["kept"] >= 12 * MIB
    else:
        assert seen["mapped"] >= 16 * MIB and seen["kept"] < 4 * MIB


def _in_a_fresh_process(probe: str, tuning: str) -> Any:
    """What ``probe`` prints last (JSON), run in a Python process of its own with
    ``CHUTE_MALLOC_TUNING=tuning``."""
    env = {**os.environ, "CHUTE_MALLOC_TUNING": tuning}
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).parent.parent,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


class MallocProbe:
    """A model that reports, for each row, what malloc did with a 16 MiB buffer in the
    process it runs in."""

    def __call__(self, batch: Any) -> dict[str, Any]:
        seen = malloc_16mib()
        rows = len(batch["x"])
        return {"mapped": [seen["mapped"]] * rows, "kept": [seen["kept"]] * rows}


@GLIBC
@pytest.mark.parametrize("tuning", ["1", "0"])
def test_a_local_run_tunes_its_processs_malloc(tuning: str) -> None:
    """The local engine's model threads get the same as a Ray worker: a 16 MiB buffer
    from the thread's heap, not mapped afresh (in a process of its own, which the run
    tunes when it starts); ``CHUTE_MALLOC_TUNING=0`` leaves the process's malloc alone."""
    probe = (
        "import json\n"
        "import numpy as np, pyarrow as pa\n"
        "import chute\n"
        "from tests.test_resources import MallocProbe\n"
        "model = chute.Model('m', MallocProbe, inputs=['x'], batch_format='numpy')\n"
        "table = pa.table({'x': np.arange(100)})\n"
        "report = chute.Job(chute.TableSource(table), (model,), engine='local').run()\n"
        "print(json.dumps(max(report.result.column('m_mapped').to_pylist())))\n"
    )
    mapped = _in_a_fresh_process(probe, tuning)
    if tuning == "1":
        assert mapped < 4 * MIB
    else:
        assert mapped >= 16 * MIB


@GLIBC
@pytest.mark.ray
@pytest.mark.timeout(120)
def test_a_ray_replica_tunes_its_workers_malloc(ray_session: Any) -> None:
    import numpy as np
    import pyarrow as pa

    import chute

    table = pa.table({"x": np.arange(100)})
    for pool in (Pool(), Pool.fixed(1)):  # fused into the read tasks, and an actor
        model = Model("m", MallocProbe, inputs=["x"], batch_format="numpy", pool=pool)
        report = chute.Job(chute.TableSource(table), (model,), engine="ray").run()
        assert report.result is not None
        assert max(report.result.column("m_mapped").to_pylist()) < 4 * MIB, pool
