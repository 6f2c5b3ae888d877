"""Resource planning for the ray engine, as plain functions (tested without Ray).

Ray Data's read and preprocess tasks need CPUs while model actors hold theirs for the
whole job. If the actor pools take every CPU, reads starve and the job hangs (Ray issue
44687). So chute always keeps a reserve for tasks and fits every pool, at its largest,
into what is left:

* ``reserve`` = 1 CPU (half the cluster when it has fewer than 2);
* a read task asks for at most the reserve (:func:`read_cpus`): half a CPU on a 1-CPU
  cluster, where a whole one beside a model actor would never be free;
* a pool with no ``max`` gets an equal share of the rest;
* when pools would not fit, stages whose CPUs were not given are scaled to fractional
  CPUs (a scheduling token in Ray: the model still uses its threads); stages whose CPUs
  were given explicitly and still do not fit are refused with a ResourceError;
* a replica must fit on one node (its CPUs and GPUs together): where none has room, CPUs
  that were not given are lowered to the largest such node's, else the job is refused
  naming the nodes; a cluster without CPUs is refused before anything runs;
* a replica's intra-op threads (torch, ONNX Runtime, BLAS) come from what the cluster
  has, not from its CPU token (:func:`plan_threads`): the reserve is a scheduling token
  too, and reads rarely keep it busy, so the pools' threads together cover every CPU.
  Ray sets ``OMP_NUM_THREADS`` to an actor's whole CPUs (one for a fraction): a 1-CPU
  model actor on a 2-CPU machine ran single-threaded beside an idle CPU;
* a model with no pool or resources asked for is fused into the read tasks
  (:func:`plan_stages`): read, predict and write in one task, as the hand-written Ray
  task does, with no actor holding CPUs between batches (and so nothing that could
  starve the reads) and no block copied between processes. A class is built once per
  worker process and kept there for the run, so a node loads it as many times as it
  runs read tasks at once (its CPUs): an actor pool at its largest loads it one time
  fewer. On 2 CPUs that is two replicas of one thread each, where the pool had one
  replica of two: the MLP ran 4.7x faster and MiniLM 1.5x (benchmarks/RESULTS.md), the
  actor's process start and imports gone. A model too big for one per CPU is given a
  pool (``pool: 2``) or its memory (``resources: {memory: ...}``), and keeps actors.

The plan is made against the cluster as it is when a run starts; a cluster that loses
or gains nodes mid-run is watched by :mod:`chute.engines.ray.watchdog`, and the run plans
the units not done yet against the cluster as it is then.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from chute import artifacts
from chute.errors import ChuteError, ResourceError
from chute.job import Model, Pool, Resources
from chute.models import AdapterSpec
from chute.usercode import import_string

DEFAULT_ACTOR_CPUS = 1.0


@dataclass(frozen=True)
class Node:
    """One alive node of the cluster."""

    address: str
    cpus: float
    gpus: float = 0.0
    memory: float | None = None
    """Bytes Ray lets tasks and actors use on it (its ``memory`` resource), where known."""

    @classmethod
    def from_ray(cls, node: dict[str, Any]) -> Node:
        """From an entry of ``ray.nodes()``."""
        resources = node.get("Resources", {})
        memory = resources.get("memory")
        return cls(
            str(node.get("NodeManagerAddress", "?")),
            float(resources.get("CPU", 0.0)),
            float(resources.get("GPU", 0.0)),
            float(memory) if memory else None,
        )

    def __str__(self) -> str:
        gpus = f", {self.gpus:g} GPU" if self.gpus else ""
        return f"{self.address}: {self.cpus:g} CPU{gpus}"


@dataclass(frozen=True)
class Cluster:
    """What the cluster offers; ``nodes`` where known (an empty tuple: one pool of CPUs)."""

    cpus: float
    gpus: float = 0.0
    memory: float | None = None
    nodes: tuple[Node, ...] = ()

    @classmethod
    def from_ray(cls, resources: dict[str, Any], nodes: Sequence[dict[str, Any]] = ()) -> Cluster:
        """From ``ray.cluster_resources()`` and ``ray.nodes()`` (the alive ones are kept)."""
        return cls(
            cpus=float(resources.get("CPU", 0.0)),
            gpus=float(resources.get("GPU", 0.0)),
            memory=resources.get("memory"),
            nodes=tuple(Node.from_ray(n) for n in nodes if n.get("Alive", n.get("alive"))),
        )

    @property
    def reserve(self) -> float:
        """CPUs kept for read and preprocess tasks."""
        return 1.0 if self.cpus >= 2 else self.cpus / 2

    def describe(self) -> str:
        """``2 CPUs, 0 GPUs on 2 nodes (127.0.0.2: 0 CPU; 127.0.0.3: 2 CPU)``."""
        text = f"{self.cpus:g} CPUs, {self.gpus:g} GPUs"
        if not self.nodes:
            return text
        count = f"{len(self.nodes)} node{'s' if len(self.nodes) != 1 else ''}"
        return f"{text} on {count} ({'; '.join(str(n) for n in self.nodes)})"


def read_cpus(cluster: Cluster) -> float:
    """CPUs each read (and fused preprocess) task asks for: one, or the reserve where that
    is less (a 1-CPU cluster), never more than the largest node has (a task runs on one)."""
    largest = max((n.cpus for n in cluster.nodes), default=cluster.cpus)
    return _floor4(min(1.0, cluster.reserve, largest))


def check_cluster(cluster: Cluster) -> None:
    """A cluster no job can run on: refused before anything runs, saying why."""
    if cluster.cpus <= 0:
        raise ResourceError(
            f"the Ray cluster has no CPUs ({cluster.describe()}): read tasks and model "
            "actors need some. Add a node with CPUs (ray start --address <head> "
            "--num-cpus N), or start the head with --num-cpus."
        )


@dataclass(frozen=True)
class StageResources:
    """What one model stage gets on Ray."""

    name: str
    cpus: float
    gpus: float
    memory: int | None
    min: int
    max: int
    note: str = ""
    threads: int = 1
    """Intra-op threads of each replica (torch, ONNX Runtime, BLAS): see :func:`plan_threads`."""
    fused: bool = False
    """Runs inside the read tasks (no actors): see :func:`plan_stages`."""

    @property
    def replicas(self) -> str:
        """The pool's size: ``"2"``, or ``"1–2"`` for a range."""
        return f"{self.min:,}" if self.min == self.max else f"{self.min:,}–{self.max:,}"


FUSED_NOTE = (
    "runs inside the read tasks, a replica per worker process, no actors "
    "(a pool or resources for it would give it actors)"
)
AFTER_POOL_NOTE = (
    "runs in tasks of its own after the preprocess step's pool, a replica per worker "
    "process, no actors: blocks pass between processes (a pool or resources for it would "
    "give it actors)"
)
"""A model that would be fused into the read tasks where a preprocess pool stands between
(``chute plan`` said "inside the read tasks" while Ray ran it in tasks after the pool)."""


FUSED_MEMORY_SHARE = 0.25
"""The most of a node's memory that a fused model's replicas, one per CPU, may take as far
as its files tell: a model whose files would take more keeps its actors."""


def fuses(model: Model, cluster: Cluster | None = None) -> bool:
    """Whether ``model`` runs inside the read tasks: on CPUs, with no pool or resources
    asked for (a user who sized a pool, or gave its CPUs or memory, gets that pool), not
    an adapter that serves from processes or connections a pool must bound (vLLM, an
    OpenAI-compatible server: :attr:`chute.models.base.Adapter.fuses`), and, on
    ``cluster``, not so big that a replica per CPU would not fit (:func:`too_big_to_fuse`).
    A model named by a string that does not import here (code only the cluster has)
    keeps its actors."""
    if model.pool != Pool() or model.resources != Resources():
        return False
    fn = model.fn
    if isinstance(fn, AdapterSpec):
        fusable = fn.load_class(check=False).fuses
    else:
        if isinstance(fn, str):
            try:
                fn = import_string(fn)
            except ChuteError:
                return False
        fusable = callable(fn)
    return fusable and (cluster is None or too_big_to_fuse(model, cluster) is None)


def too_big_to_fuse(model: Model, cluster: Cluster) -> str | None:
    """Why ``model`` keeps its actors on ``cluster`` though it could be fused: the files a
    replica loads (an adapter's artifacts; the local paths among a class's constructor
    arguments), once per CPU of a node, would take more than :data:`FUSED_MEMORY_SHARE`
    of the node's memory. ``None`` where they fit, or the sizes are not known."""
    size = load_bytes(model)
    if not size:
        return None
    nodes = [n for n in cluster.nodes if n.cpus > 0] or [
        Node("", cluster.cpus, cluster.gpus, cluster.memory)
    ]
    reads = read_cpus(cluster)
    for node in nodes:
        copies = math.ceil(node.cpus / reads - 1e-9)
        if node.memory and size * copies > FUSED_MEMORY_SHARE * node.memory:
            return (
                f"on actors, not in the read tasks: its files ({_gib(size)}) loaded once per "
                f"CPU would take {_gib(size * copies)} of a node's {_gib(node.memory)}"
            )
    return None


def load_bytes(model: Model) -> int:
    """Bytes of the files a replica of ``model`` loads, as far as planning can tell without
    loading it: an adapter's artifacts, or the local files and directories named by a
    class's constructor arguments (arrays given as arguments are shared, not counted)."""
    fn = model.fn
    if isinstance(fn, AdapterSpec):
        found = fn.load_class(check=False).artifacts(fn.options)
        return sum(artifacts.size(str(p)) for p in found)
    values = [*model.args, *model.kwargs.values()]
    paths = [v for v in values if isinstance(v, str | os.PathLike) and os.path.exists(v)]
    return sum(artifacts.size(os.fspath(p)) for p in paths)


def _gib(size: float) -> str:
    return f"{size / 2**30:.1f} GiB"


def plan_stages(
    models: Sequence[Model], cluster: Cluster, preprocess_pool: bool = False
) -> list[StageResources]:
    """Every model stage on ``cluster``: fused into the read tasks where :func:`fuses`
    says so (asking for a read's CPUs), the others' actor pools by :func:`plan_resources`,
    which then share the CPUs among fewer pools. The first pool's note says whether Ray
    Data will fuse the reads into its actors (``preprocess_pool``: a preprocess step of
    its own stands between them)."""
    # why a model that could be fused keeps its actors here: its files, sized once
    too_big = {m.name: too_big_to_fuse(m, cluster) for m in models if fuses(m)}
    actors = [m for m in models if m.name not in too_big or too_big[m.name]]
    planned = iter(plan_resources(actors, cluster) if actors else [])
    check_cluster(cluster)
    reads = read_cpus(cluster)
    stages = []
    for m in models:
        if m not in actors:
            note = AFTER_POOL_NOTE if preprocess_pool else FUSED_NOTE
            stages.append(StageResources(m.name, reads, 0, None, 0, 0, note, 1, fused=True))
            continue
        stage, why = next(planned), too_big.get(m.name)
        stages.append(replace(stage, note=why) if why and not stage.note else stage)
    first = next((i for i, stage in enumerate(stages) if not stage.fused), None)
    if first is not None and not preprocess_pool:
        stage = stages[first]
        note = _read_fusion(stage, reads)
        stages[first] = replace(stage, note=f"{stage.note}; {note}" if stage.note else note)
    return stages


def _read_fusion(stage: StageResources, reads: float) -> str:
    """Whether Ray Data fuses the read tasks (and what runs in them) into ``stage``'s
    actors: only where the two ask for the same resources, as Ray Data requires."""
    if stage.cpus == reads and not stage.gpus and not stage.memory:
        return (
            "the read tasks fuse into its actors (they ask the same CPUs): each replica reads, "
            "predicts and writes, and no block travels between processes"
        )
    asked = f"{stage.cpus:g} CPU" + (f", {stage.gpus:g} GPU" if stage.gpus else "")
    asked += ", memory" if stage.memory else ""
    return (
        f"its actors take blocks from read tasks of their own (a replica asks {asked}, a read "
        f"{reads:g} CPU): each block is passed between processes"
    )


def plan_resources(models: list[Model], cluster: Cluster) -> list[StageResources]:
    """Fit every model's actor pool into the cluster, keeping the task reserve free."""
    check_cluster(cluster)
    _check_gpus(models, cluster)
    _check_gpus_together(models, cluster)
    _check_memory(models, cluster)
    budget = cluster.cpus - cluster.reserve
    cpus = [_fit_node(m, m.resources.cpus or DEFAULT_ACTOR_CPUS, cluster) for m in models]
    sizes = [
        _max_size(m, c, budget / len(models), cluster) for m, c in zip(models, cpus, strict=True)
    ]
    needed = sum(c * n for c, n in zip(cpus, sizes, strict=True))
    notes = [_lowered(m, c) for m, c in zip(models, cpus, strict=True)]
    if needed > budget + 1e-9:
        cpus, scaled = _scale(models, cpus, sizes, budget, cluster.reserve)
        notes = [s or n for s, n in zip(scaled, notes, strict=True)]
    threads = plan_threads(models, cpus, sizes, cluster)
    return [
        StageResources(
            m.name, round(c, 4), m.resources.gpus, m.resources.memory, m.pool.min, n, note, t
        )
        for m, c, n, note, t in zip(models, cpus, sizes, notes, threads, strict=True)
    ]


def plan_threads(
    models: Sequence[Model], cpus: Sequence[float], sizes: Sequence[int], cluster: Cluster
) -> list[int]:
    """Intra-op threads per replica: the cluster's CPUs shared among the replicas of every
    pool at its largest, in proportion to their CPUs, whole and at least one, never more
    than a node has; CPUs a user gave are a floor.

    One model on 2 CPUs: one 1-CPU replica (the other CPU kept for reads) with 2 threads.
    On 16: fifteen replicas with one thread each. A replica of ``cpus: 4``: 4 threads.
    """
    largest = max((n.cpus for n in cluster.nodes), default=cluster.cpus)
    total = sum(c * n for c, n in zip(cpus, sizes, strict=True))
    threads = []
    for model, token in zip(models, cpus, strict=True):
        share = token * cluster.cpus / total if total > 0 else 1.0
        floor = model.resources.cpus or 1.0
        threads.append(max(1, int(min(max(share, floor), max(largest, 1.0)) + 1e-9)))
    return threads


def _fit_node(model: Model, cpus: float, cluster: Cluster) -> float:
    """A replica's CPUs, lowered to what the largest node with its GPUs has when they were
    not given (a GPU-only worker: 0); refused, naming the nodes, when they were."""
    gpus, memory = model.resources.gpus, model.resources.memory
    big = [n for n in cluster.nodes if not memory or n.memory is None or n.memory >= memory]
    if cluster.nodes and memory and not big:
        largest = max(n.memory or 0 for n in cluster.nodes)
        raise ResourceError(
            f"model {model.name!r} asks for {memory / 2**30:.1f} GiB of memory per replica, "
            f"but no node of the cluster has that (the largest: {largest / 2**30:.1f} GiB): a "
            "replica runs on one node. Lower memory, or add a node with more."
        )
    hosts = [n for n in big if n.gpus >= gpus - 1e-9]
    room = max((n.cpus for n in hosts), default=0.0)
    if not cluster.nodes or cpus <= room + 1e-9:
        return cpus
    if model.resources.cpus is None and hosts:
        return _floor4(room)
    needs = f"{cpus:g} CPU" + (f" and {gpus:g} GPU" if gpus else "")
    fix = f"Lower cpus to {room:g} or less, or add" if hosts else "Add"
    raise ResourceError(
        f"model {model.name!r} asks for {needs} per replica, but no node of the cluster "
        f"has that ({'; '.join(str(n) for n in cluster.nodes)}): a replica runs on one node. "
        f"{fix} a node with {needs}."
    )


def _lowered(model: Model, cpus: float) -> str:
    if model.resources.cpus is None and cpus < DEFAULT_ACTOR_CPUS:
        return f"cpus lowered to {cpus:g}: no node with its GPUs has more"
    return ""


def _max_size(model: Model, cpus: float, share: float, cluster: Cluster) -> int:
    if model.pool.max is not None:
        size = model.pool.max
    elif cpus <= 0:  # a GPU-only node's replica: its GPUs bound the pool
        size = model.pool.min if model.resources.gpus <= 0 else 1_000_000
    else:
        size = max(model.pool.min, math.floor(share / cpus + 1e-9))
    if model.resources.gpus > 0:
        size = min(size, max(model.pool.min, math.floor(cluster.gpus / model.resources.gpus)))
    return size


def _scale(
    models: list[Model], cpus: list[float], sizes: list[int], budget: float, reserve: float
) -> tuple[list[float], list[str]]:
    fixed = sum(
        c * n for m, c, n in zip(models, cpus, sizes, strict=True) if m.resources.cpus is not None
    )
    flexible = sum(
        c * n for m, c, n in zip(models, cpus, sizes, strict=True) if m.resources.cpus is None
    )
    if fixed > budget + 1e-9 or (flexible and fixed >= budget):
        raise ResourceError(
            f"the model pools need {fixed + flexible:g} CPUs at their largest, but only "
            f"{budget:g} can go to model actors: chute keeps the rest for reading, or the "
            "read tasks would starve and the job hang (Ray issue 44687). Lower the pool "
            "sizes or the cpus per model, or use a bigger cluster."
        )
    factor = (budget - fixed) / flexible
    scaled = [
        c if m.resources.cpus is not None else _floor4(c * factor)
        for m, c in zip(models, cpus, strict=True)
    ]
    keep = f"so that reads keep {reserve:g} CPU"
    notes = [
        "" if m.resources.cpus is not None else f"cpus scaled to {c:.3g} {keep}"
        for m, c in zip(models, scaled, strict=True)
    ]
    return scaled, notes


def _floor4(cpus: float) -> float:
    """Round down to Ray's 0.0001 CPU granularity: rounding up would eat the read reserve."""
    return math.floor(cpus * 10_000 + 1e-6) / 10_000


def local_threads(models: Sequence[Model], cores: int | None = None) -> list[int]:
    """Intra-op threads per replica thread of each model on the local engine: this
    machine's cores shared among every model's replicas, as :func:`plan_threads` does for
    a cluster (two torch models on 2 cores: one thread each, not two each on two cores).

    Each replica sets its model's on the thread that calls the model (torch keeps the
    setting per thread: :func:`chute.models.base.torch_threads`), a class or function of
    the user's as well as an adapter, so two torch models keep their own."""
    cores = cores or os.cpu_count() or 1
    sizes = [local_replicas(m, cores) for m in models]
    cpus = [m.resources.cpus or 1.0 for m in models]
    return plan_threads(models, cpus, sizes, Cluster(cpus=float(cores)))


def local_replicas(model: Model, cores: int | None = None) -> int:
    """Replica threads of ``model`` on the local engine: a fixed pool as given; an
    autoscaling range as many as this machine's cores hold at the model's CPUs per replica,
    within the range (``max: None`` means ``min``: one replica by default, which
    :mod:`chute.engines.growth` may grow while the run goes)."""
    pool = model.pool
    if pool.max is None or pool.max == pool.min:
        return pool.min
    cores = cores or os.cpu_count() or 1
    fit = int(cores // (model.resources.cpus or 1.0))
    return max(pool.min, min(pool.max, fit))


def local_writers(cores: int | None = None) -> int:
    """Writer threads of the local engine: one per four cores, and two at least. A writer
    encodes its own open file, and pyarrow's Parquet encoder runs on the thread that calls
    it. On 16 cores the taxi job at 10x took 1.74 s with two writers, 1.18 s with four and
    1.10 s with eight, whose peak was 255 MiB against four's 173 (``benchmarks/RESULTS.md``);
    on 2 cores more than two were slower. A writer opens a file only for a unit it is
    handed (:mod:`chute.coalesce`), so a job of few units still writes few files."""
    cores = cores or os.cpu_count() or 2
    return max(2, cores // 4)


def gpu_slots(model: Model, replicas: int) -> list[int | None]:
    """The local GPU of each replica: replicas of ``gpus: 0.5`` pair up on one GPU,
    replicas of ``gpus: 1`` take one each, round the machine's GPUs."""
    if model.resources.gpus <= 0:
        return [None] * replicas
    count = max(1, local_gpus())
    return [int(i * model.resources.gpus) % count for i in range(replicas)]


def local_gpus() -> int:
    """GPUs this process can see: ``CUDA_VISIBLE_DEVICES`` if set, else ``nvidia-smi -L``."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))


def check_local(models: list[Model]) -> None:
    """The local engine's check: a model that asks for GPUs this machine lacks fails now."""
    if any(m.resources.gpus > 0 for m in models):
        here = Cluster(cpus=float(os.cpu_count() or 1), gpus=float(local_gpus()))
        _check_gpus(models, here, "this machine")


def _check_gpus(models: list[Model], cluster: Cluster, where: str = "the cluster") -> None:
    for model in models:
        wanted = model.resources.gpus * model.pool.min
        if wanted > cluster.gpus + 1e-9:
            raise ResourceError(
                f"model {model.name!r} asks for {wanted:g} GPU(s) ({model.resources.gpus:g} "
                f"per replica × {model.pool.min}) but {where} has {cluster.gpus:g}. "
                "Run on a cluster with GPUs, or set gpus: 0 to run on CPUs."
            )


def _check_gpus_together(models: list[Model], cluster: Cluster) -> None:
    """Ray gives each replica its GPUs to itself: the replicas every model starts with must
    fit the cluster's GPUs together, or one pool waits forever for a GPU another holds."""
    asking = [m for m in models if m.resources.gpus]
    wanted = sum(m.resources.gpus * m.pool.min for m in asking)
    if len(asking) > 1 and wanted > cluster.gpus + 1e-9:
        each = ", ".join(f"{m.name!r} {m.resources.gpus:g} × {m.pool.min}" for m in asking)
        raise ResourceError(
            f"the models together ask for {wanted:g} GPU(s) to start ({each}) but the cluster "
            f"has {cluster.gpus:g}, and a replica holds its GPUs for the whole run: one pool "
            "would wait forever. Share GPUs (gpus: 0.5 puts two replicas on one), or add GPUs."
        )


def _check_memory(models: list[Model], cluster: Cluster) -> None:
    for model in models:
        memory = model.resources.memory
        if memory and cluster.memory and memory * model.pool.min > cluster.memory:
            raise ResourceError(
                f"model {model.name!r} asks for {memory * model.pool.min / 2**30:.1f} GiB "
                f"of memory but the cluster has {cluster.memory / 2**30:.1f} GiB (a local "
                "Ray offers what its object store leaves of the machine's): lower "
                "resources.memory or the pool, or run on a cluster that has the memory "
                "(--address)."
            )
