"""chute against the obvious alternatives, side by side, in one invocation.

Three workloads — the taxi tip model over the demo data, a 1,000,000 × 10 torch MLP over
an in-memory DataFrame, MiniLM sentence embeddings — each run as:

* ``chute local``      chute's embedded engine;
* ``pyarrow loop``     one process, file by file (or slice by slice): read → model → write;
* ``chute ray``        chute's ray engine;
* ``Ray Data``         ``read_parquet`` (or ``from_pandas``) → ``map_batches`` (a class on an
                       actor pool of one actor: it cannot starve reads on 2 CPUs) →
                       ``write_parquet``;
* ``Ray Core tasks``   one task per file (or slice), the model ``ray.put`` once;
* ``model alone``      MiniLM only: ``model.encode`` over the whole preloaded list.

Every run writes Parquet, and its output row count is checked. Times are wall-clock,
model loading included (except for ``model alone``). The variants without Ray run each
measured run in a Python process of its own, after an untimed warm-up run of the same
variant there (``--in-process``: one after another in this process); their peak memory is
the kernel's peak RSS of that process over its RSS before the run, their CPU time its
``getrusage``. The Ray variants share one Ray in this process: their memory is the peak
RSS of this process and all its descendants (Ray's included), sampled every 0.1 s, as the
increase over the level just before the run; their CPU time that of the same tree.
For chute, ``pipeline s`` is the report's ``wall_seconds`` (planning to the last commit,
without writing report.json/report.html). Ray is started once, before the first Ray run;
its start-up is timed on its own and excluded.

    python benchmarks/bench.py                                # everything, full size
    python benchmarks/bench.py --workloads taxi --rows 200000 --out /tmp/bench
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import glob
import importlib.util
import json
import logging
import os
import platform
import resource
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")

import numpy as np
import pandas as pd
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

import chute
from chute.demo import CARRYOVER, TOTAL_ROWS, generate, tip_model

ROOT = Path(__file__).resolve().parent.parent
MIB = 2**20
DEFAULT_ROWS = {
    "taxi": TOTAL_ROWS,
    "mlp": 1_000_000,
    "minilm": 5_000,
    "taxi-800MB": TOTAL_ROWS,
    "taxi-x10": 10 * TOTAL_ROWS,
}
MLP_BATCH = "4MiB"
MLP_SLICE_ROWS = 262_144  # rows per Ray Core task: chute's in-memory unit size
ENCODE_BATCH = 64  # sentences per forward pass inside model.encode, everywhere
# chute and Ray Data batches hold one file's rows, so that every variant hands model.encode
# the same number of sentences per call as the loop does (encode sorts a call's sentences
# by length: bigger calls pad less, and the batch size would decide the race otherwise).
MINILM_FILES = 4


def load_example(name: str) -> ModuleType:
    """``examples/<name>/run.py`` as a module whose classes Ray ships by value."""
    module_name = f"chute_example_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, ROOT / "examples" / name / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    try:
        from ray import cloudpickle

        cloudpickle.register_pickle_by_value(module)
    except ImportError:
        pass
    return module


# --------------------------------------------------------------------------- measuring


class Sampler:
    """Peak RSS and CPU time of a run.

    With a ``period``: of this process and all its descendants (Ray's included), sampled
    every ``period`` seconds by a thread. Without one: of this process alone, exactly and
    with no thread beside the run, from the kernel: the peak is ``VmHWM``, reset before
    the run through ``/proc/self/clear_refs``, and the CPU time ``getrusage`` (every
    thread). Where the kernel cannot reset the peak (not Linux), it samples every 5 ms.
    """

    def __init__(self, period: float | None = 0.1) -> None:
        self.exact = period is None and _reset_peak()
        self.period = 0.005 if period is None else period
        self.me = psutil.Process()
        self.base = self.peak = 0
        self._cpu: dict[int, list[float]] = {}  # pid -> [CPU s when first seen, latest]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._rusage = 0.0

    def _sample(self, first: bool = False) -> None:
        rss = 0
        for proc in [self.me, *self.me.children(recursive=True)]:
            try:
                with proc.oneshot():
                    rss += proc.memory_info().rss
                    times = proc.cpu_times()
            except psutil.Error:
                continue
            used = times.user + times.system
            self._cpu.setdefault(proc.pid, [used if first else 0.0, used])[1] = used
        self.peak = max(self.peak, rss)
        if first:
            self.base = rss

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            self._sample()

    @property
    def cpu_seconds(self) -> float:
        """CPU time the tree used during the block (processes that ended between two
        samples lose their last fraction of a period)."""
        if self.exact:
            return self._rusage
        return sum(last - first for first, last in self._cpu.values())

    def __enter__(self) -> Sampler:
        if self.exact:
            _reset_peak()
            self.base = self.me.memory_info().rss
            self._rusage = -_cpu_of_self()
            return self
        self._sample(first=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.exact:
            self._rusage += _cpu_of_self()
            self.peak = _kernel_peak()
            return
        self._stop.set()
        self._thread.join()
        self._sample()


def _reset_peak() -> bool:
    """Set this process's peak RSS (``VmHWM``) to its RSS now; whether the kernel can."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _kernel_peak() > 0
    except OSError:
        return False


def _kernel_peak() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _cpu_of_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Result:
    workload: str
    variant: str
    rows: int
    seconds: float
    cpu: float  # CPU seconds of the process tree
    peak: int  # bytes above the level before the run
    pipeline: float | None = None  # chute only: Report.wall_seconds (before the report files)

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        return (
            f"  {self.workload:<11}{self.variant:<16}{self.seconds:8.2f} s {self.rate:>12,.0f} "
            f"rows/s {self.cpu:7.1f} CPU s  peak +{self.peak / MIB:,.0f} MiB"
        )


def output_rows(directory: str) -> int:
    files = [
        f
        for f in glob.glob(os.path.join(directory, "**", "*.parquet"), recursive=True)
        if "/_" not in f[len(directory) :] and "/." not in f[len(directory) :]
    ]
    return sum(pq.read_metadata(f).num_rows for f in files)


def release_memory() -> None:
    """Hand freed memory back to the OS, so the next run's peak starts from live data."""
    gc.collect()
    pa.default_memory_pool().release_unused()
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


LOCAL_PERIOD = None
"""Variants in this process are measured by the kernel, exactly (:class:`Sampler`): their
runs last a fraction of a second; sampled at 0.1 s a peak was caught or missed by chance
(MLP peaks of one build moved from 45 to 104 MiB between runs), and a thread sampling
every 5 ms took 12-14% of every variant's time (MLP, 1 M rows, 7 runs of each)."""
RAY_PERIOD = 0.1
"""The same for Ray's variants: a sample walks every Ray process, which would cost CPU."""


def measure(
    workload: str,
    variant: str,
    fn: Callable[[str], Any],
    out: str,
    expected: int,
    period: float | None = RAY_PERIOD,
    show: bool = True,
) -> Result:
    """One run of ``fn(out)``, from an empty ``out``; its output rows are checked."""
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    release_memory()
    with Sampler(period) as sampler:
        started = time.perf_counter()
        returned = fn(out)
        seconds = time.perf_counter() - started
    rows = expected if variant == "model alone" else output_rows(out)
    if rows != expected:
        raise SystemExit(f"{workload}/{variant} wrote {rows} rows, expected {expected}")
    pipeline = getattr(returned, "wall_seconds", None)
    result = Result(
        workload, variant, rows, seconds, sampler.cpu_seconds, sampler.peak - sampler.base, pipeline
    )
    if show:
        print(result.line(), flush=True)
    return result


def run_all(
    workload: Workload,
    variants: dict[str, Callable[[str], Any]],
    base: str,
    repeat: int,
    period: float | None = RAY_PERIOD,
) -> list[Result]:
    """Each variant ``repeat`` times, interleaved (so a change in the machine's load hits
    them alike); every run, for :func:`summarize` to take the median of."""
    runs: list[Result] = []
    for _ in range(repeat):
        for variant, fn in variants.items():
            out = os.path.join(base, workload.name, variant.replace(" ", "-"))
            runs.append(measure(workload.name, variant, fn, out, workload.rows, period))
    return runs


def run_isolated(workload: Workload, args: argparse.Namespace) -> list[Result]:
    """The local variants as :func:`run_all` runs them, but each run in a Python process of
    its own (:func:`child`), after ``--warmup`` untimed runs of the same variant there: no
    variant inherits another's allocator state. In one process the loop's MLP took either
    0.10 or 0.21 s, by whether an earlier variant's frees had raised glibc's mmap
    threshold (RESULTS.md, "The MLP, the loop and glibc's malloc"): a user's job runs in a
    process that only it has warmed."""
    return [_in_own_process(workload, v, args) for _ in range(args.repeat) for v in workload.local]


def _in_own_process(workload: Workload, variant: str, args: argparse.Namespace) -> Result:
    """One measured run of ``variant`` by :func:`child` in a new process; printed."""
    name = workload.name
    command = [sys.executable, os.path.abspath(__file__), "--child", f"{name}:{variant}"]
    command += ["--rows", f"{name}={workload.rows}", "--out", args.out]
    command += ["--warmup", str(args.warmup)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    found = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not found:
        raise SystemExit(
            f"{name}/{variant} failed in its process (exit {done.returncode}):\n"
            f"{done.stdout[-2000:]}{done.stderr[-4000:]}"
        )
    result = Result(**json.loads(found[-1].removeprefix("RESULT ")))
    print(result.line(), flush=True)
    return result


CHILD_TIMEOUT = 3600
"""Seconds a variant's process may take, its warm-up runs included."""


def child(spec: str, args: argparse.Namespace) -> None:
    """``--child WORKLOAD:VARIANT``: build the workload (its data is on disk already, or
    made again the same way), run the variant ``--warmup`` times untimed, then once
    measured; print that run as ``RESULT {json}`` for :func:`run_isolated`."""
    name, _, variant = spec.partition(":")
    rows = parse_rows(args.rows)[name]
    workload = WORKLOADS[name](args.out, rows)
    fn = workload.local[variant]
    out = os.path.join(args.out, "results", name, variant.replace(" ", "-"))
    for _ in range(args.warmup):
        measure(name, variant, fn, out, rows, LOCAL_PERIOD, show=False)
    result = measure(name, variant, fn, out, rows, LOCAL_PERIOD, show=False)
    print("RESULT " + json.dumps(asdict(result)), flush=True)


@dataclass
class Summary:
    """The runs of one variant of one workload: medians, and the spread of the seconds."""

    workload: str
    variant: str
    rows: int
    seconds: float  # median
    fastest: float
    slowest: float
    cpu: float  # median CPU seconds of the process tree
    peak: int  # median peak, bytes above the level before the run
    pipeline: float | None
    runs: int

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def summarize(runs: list[Result]) -> list[Summary]:
    """One :class:`Summary` per (workload, variant), in the order first run."""
    groups: dict[tuple[str, str], list[Result]] = {}
    for r in runs:
        groups.setdefault((r.workload, r.variant), []).append(r)
    summaries = []
    for (workload, variant), group in groups.items():
        seconds = [r.seconds for r in group]
        pipelines = [r.pipeline for r in group if r.pipeline is not None]
        summaries.append(
            Summary(
                workload,
                variant,
                group[0].rows,
                float(np.median(seconds)),
                min(seconds),
                max(seconds),
                float(np.median([r.cpu for r in group])),
                int(np.median([r.peak for r in group])),
                float(np.median(pipelines)) if pipelines else None,
                len(group),
            )
        )
    return summaries


# --------------------------------------------------------------------------- workloads


@dataclass
class Workload:
    """A dataset, a model, and the variants that run it."""

    name: str
    rows: int
    local: dict[str, Callable[[str], Any]] = field(default_factory=dict)
    ray: dict[str, Callable[[str], Any]] = field(default_factory=dict)


# -- taxi: the demo's tip model over 12 Parquet files ----------------------------------


class TipActor:
    """Plain Ray Data: the tip model (or ``model_class(*args)``) on an actor, over Arrow
    batches."""

    def __init__(
        self,
        model_class: type | None = None,
        args: tuple[Any, ...] = (),
        inputs: tuple[str, ...] = ("passenger_count",),
    ) -> None:
        self.model = model_class(*args) if model_class is not None else tip_model
        self.inputs = inputs

    def __call__(self, batch: pa.Table) -> pa.Table:
        score = self.model({name: batch.column(name).to_numpy() for name in self.inputs})
        return batch.append_column("tip_score", pa.array(score["score"]))


def _taxi_file(model: Callable[..., Any], path: str, out: str, inputs: tuple[str, ...]) -> int:
    table = pq.read_table(path, columns=list(CARRYOVER))
    score = model({name: table.column(name).to_numpy() for name in inputs})["score"]
    table = table.append_column("tip_score", pa.array(score))
    pq.write_table(table, os.path.join(out, os.path.basename(path)))
    return int(table.num_rows)


def with_daft(variants: dict[str, Callable[[str], Any]], run: Callable[[str], Any]) -> None:
    """Add the ``Daft`` variant when Daft is installed (the ``bench`` extra)."""
    if importlib.util.find_spec("daft") is not None:
        variants["Daft"] = run


def daft_native() -> ModuleType:
    """Daft on its native (single-machine, multi-threaded) runner."""
    import daft

    with contextlib.suppress(Exception):  # raises once a runner is set: it already is
        daft.set_runner_native()
    return daft


def _numpy(series: Any) -> np.ndarray:
    """A Daft Series as a NumPy array."""
    return np.asarray(series.to_arrow().to_numpy(zero_copy_only=False))


def taxi(base: str, rows: int) -> Workload:
    return _taxi_workload("taxi", base, rows, tip_model, ("passenger_count",))


def _taxi_workload(
    name: str,
    base: str,
    rows: int,
    scorer: Callable[..., Any],
    inputs: tuple[str, ...],
    *,
    model_class: type | None = None,
    model_args: tuple[Any, ...] = (),
) -> Workload:
    """The taxi job with ``scorer`` (a function), or with ``model_class(*model_args)`` built
    once per replica (``scorer`` is then an instance of it, for the variants that share one
    model object)."""
    data = os.path.join(base, "data", f"taxi-{rows}")
    files = generate(data, rows)
    fn: Any = model_class if model_class is not None else scorer
    model = chute.Model("tip", fn, inputs=list(inputs), batch_format="numpy", args=model_args)

    def chute_run(engine: str) -> Callable[[str], Any]:
        def run(out: str) -> Any:
            job = chute.Job(
                chute.FileSource(data),
                (model,),
                output=chute.Sink(out),
                carryover=CARRYOVER,
                engine=engine,
            )
            return job.run(overwrite=True)

        return run

    def built() -> Callable[..., Any]:
        return model_class(*model_args) if model_class is not None else scorer

    def loop(out: str) -> None:
        os.makedirs(out)
        loaded = built()
        for path in files:
            _taxi_file(loaded, path, out, inputs)

    def daft_run(out: str) -> None:
        daft = daft_native()

        @daft.cls
        class DaftTip:
            def __init__(self) -> None:
                self.model = built()

            @daft.method.batch(return_dtype=daft.DataType.float32())
            def __call__(self, *columns: Any) -> np.ndarray:
                batch = {name: _numpy(c) for name, c in zip(inputs, columns, strict=True)}
                return np.asarray(self.model(batch)["score"], dtype=np.float32)

        df = daft.read_parquet(os.path.join(data, "*.parquet")).select(*CARRYOVER)
        df = df.with_column("tip_score", DaftTip()(*[df[name] for name in inputs]))
        df.write_parquet(out)

    def ray_data(out: str) -> None:
        import ray

        ds = ray.data.read_parquet(data).select_columns(list(CARRYOVER))
        ds = ds.map_batches(
            TipActor,
            fn_constructor_args=(model_class, model_args, inputs),
            batch_size=16_384,
            batch_format="pyarrow",
            concurrency=1,
        )
        ds.write_parquet(out)

    def ray_core(out: str) -> None:
        import ray

        os.makedirs(out)
        task = ray.remote(_taxi_file)
        ref = ray.put(built())  # once: the tasks map its arrays zero-copy
        ray.get([task.remote(ref, path, out, inputs) for path in files])

    local = {"chute local": chute_run("local"), "pyarrow loop": loop}
    with_daft(local, daft_run)
    return Workload(
        name,
        rows,
        local=local,
        ray={"chute ray": chute_run("ray"), "Ray Data": ray_data, "Ray Core tasks": ray_core},
    )


# -- taxi-800MB: the taxi job with a model that holds 800 MB of weights ----------------

WEIGHTS_MB = 800


class HeavyTip:
    """The tip model plus a lookup table of float32 weights (~800 MB), read from a ``.npy``
    file in the constructor, so once per replica: score = tip + table[trip_id % size]."""

    def __init__(self, path: str) -> None:
        self.table = np.load(path)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tip = tip_model(batch)["score"]
        return {"score": tip + self.table[batch["trip_id"] % len(self.table)]}


def write_weights(path: str, megabytes: int) -> str:
    """A ``.npy`` of ``megabytes`` MB of float32 weights (kept if already there)."""
    size = megabytes * 10**6 // 4
    if os.path.exists(path) and np.load(path, mmap_mode="r").shape == (size,):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    table = np.lib.format.open_memmap(path + ".tmp.npy", mode="w+", dtype=np.float32, shape=(size,))
    step = 10_000_000
    for start in range(0, size, step):
        stop = min(size, start + step)
        table[start:stop] = (np.arange(start, stop) % 7) / np.float32(100)
    table.flush()
    del table
    os.replace(path + ".tmp.npy", path)
    return path


def taxi_800mb(base: str, rows: int) -> Workload:
    path = write_weights(os.path.join(base, "data", f"weights-{WEIGHTS_MB}MB.npy"), WEIGHTS_MB)
    return _taxi_workload(
        "taxi-800MB",
        base,
        rows,
        tip_model,
        ("passenger_count", "trip_id"),
        model_class=HeavyTip,
        model_args=(path,),
    )


# -- taxi-x10: the taxi job over 10× the data, to see chute local's memory stay flat ----


def taxi_x10(base: str, rows: int) -> Workload:
    workload = taxi(base, rows)
    workload.name = "taxi-x10"
    workload.local = {"chute local": workload.local["chute local"]}
    workload.ray = {}
    return workload


# -- mlp: a torch MLP over an in-memory DataFrame --------------------------------------


class MLPActor:
    """Plain Ray Data: the example's MLP on an actor, over NumPy batches."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.model = load_example("torch_mlp").MLP(state)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"mlp": self.model(batch)}


def _mlp_slice(model: Any, frame: pd.DataFrame, out: str, index: int) -> int:
    scores = model({name: frame[name].to_numpy() for name in frame.columns})
    pq.write_table(pa.table({"mlp": scores}), os.path.join(out, f"part-{index:05d}.parquet"))
    return len(frame)


def mlp(base: str, rows: int) -> Workload:
    example = load_example("torch_mlp")
    frame = example.make_features(rows)
    state = example.build_mlp().state_dict()
    model = chute.Model(
        "mlp",
        example.MLP,
        inputs=example.FEATURES,
        batch_format="numpy",
        batch_size=MLP_BATCH,
        kwargs={"state_dict": state},
    )
    batch_rows = model.batch_size.rows_for(4 * len(example.FEATURES))

    def chute_run(engine: str) -> Callable[[str], Any]:
        return lambda out: chute.run(frame, model, out, engine=engine)

    def loop(out: str) -> None:
        os.makedirs(out)
        scorer = example.MLP(state)
        for i, start in enumerate(range(0, rows, batch_rows)):
            _mlp_slice(scorer, frame.iloc[start : start + batch_rows], out, i)

    def daft_run(out: str) -> None:
        daft = daft_native()

        @daft.cls
        class DaftMLP:
            def __init__(self) -> None:
                self.model = example.MLP(state)

            @daft.method.batch(return_dtype=daft.DataType.float32(), batch_size=batch_rows)
            def __call__(self, *columns: Any) -> np.ndarray:
                pairs = zip(example.FEATURES, columns, strict=True)
                return np.asarray(self.model({name: _numpy(c) for name, c in pairs}))

        df = daft.from_pandas(frame)
        df = df.select(DaftMLP()(*[df[name] for name in example.FEATURES]).alias("mlp"))
        df.write_parquet(out)

    def ray_data(out: str) -> None:
        import ray

        ds = ray.data.from_pandas(frame).map_batches(
            MLPActor,
            fn_constructor_args=(state,),
            batch_size=batch_rows,
            batch_format="numpy",
            concurrency=1,
        )
        ds.write_parquet(out)

    def ray_core(out: str) -> None:
        import ray

        os.makedirs(out)
        task = ray.remote(_mlp_slice)
        ref = ray.put(example.MLP(state))
        starts = range(0, rows, MLP_SLICE_ROWS)
        ray.get(
            [
                task.remote(ref, frame.iloc[s : s + MLP_SLICE_ROWS], out, i)
                for i, s in enumerate(starts)
            ]
        )

    local = {"chute local": chute_run("local"), "pyarrow loop": loop}
    with_daft(local, daft_run)
    return Workload(
        "mlp",
        rows,
        local=local,
        ray={"chute ray": chute_run("ray"), "Ray Data": ray_data, "Ray Core tasks": ray_core},
    )


# -- minilm: sentence embeddings over a text column ------------------------------------


class EmbedActor:
    """Plain Ray Data: the example's embedder on an actor, over Arrow batches."""

    def __init__(self, path: str) -> None:
        self.embed = load_example("minilm").Embedder(path, ENCODE_BATCH)

    def __call__(self, batch: pa.Table) -> pa.Table:
        return _with_embeddings(batch.select(["id"]), self.embed(batch))


def _vectors(embeddings: np.ndarray) -> pa.FixedSizeListArray:
    flat = pa.array(np.ascontiguousarray(embeddings, dtype=np.float32).ravel())
    return pa.FixedSizeListArray.from_arrays(flat, embeddings.shape[1])


def _with_embeddings(table: pa.Table, embeddings: np.ndarray) -> pa.Table:
    return table.append_column("embedding", _vectors(embeddings))


def _embed_file(model: Any, path: str, out: str) -> int:
    table = pq.read_table(path)
    vectors = model.encode(
        table.column("text").to_pylist(),
        batch_size=ENCODE_BATCH,
        convert_to_numpy=True,
        show_progress_bar=False,
    )
    pq.write_table(
        _with_embeddings(table.select(["id"]), vectors), os.path.join(out, os.path.basename(path))
    )
    return int(table.num_rows)


def minilm(base: str, rows: int) -> Workload:
    example = load_example("minilm")
    data = os.path.join(base, "data", f"sentences-{rows}")
    sentences = example.make_sentences(rows)
    if output_rows(data) != rows:
        example.write_sentences(data, sentences, files=MINILM_FILES)
    files = sorted(glob.glob(os.path.join(data, "*.parquet")))
    file_rows = -(-rows // MINILM_FILES)
    path = example.model_dir()
    model = chute.Model(
        "embedding",
        example.Embedder,
        inputs=["text"],
        batch_size=file_rows,
        args=(path, ENCODE_BATCH),
    )
    preloaded = example.load_model(path)

    def alone(out: str) -> None:
        preloaded.encode(
            sentences, batch_size=ENCODE_BATCH, convert_to_numpy=True, show_progress_bar=False
        )

    def chute_run(engine: str) -> Callable[[str], Any]:
        return lambda out: chute.run(data, model, out, carryover=["id"], engine=engine)

    def loop(out: str) -> None:
        os.makedirs(out)
        loaded = example.load_model(path)
        for file in files:
            _embed_file(loaded, file, out)

    def daft_run(out: str) -> None:
        daft = daft_native()
        vector = daft.DataType.fixed_size_list(daft.DataType.float32(), example.DIM)

        @daft.cls
        class DaftEmbedder:
            def __init__(self) -> None:
                self.model = example.load_model(path)

            @daft.method.batch(return_dtype=vector, batch_size=file_rows)
            def __call__(self, text: Any) -> pa.Array:
                vectors = self.model.encode(
                    text.to_pylist(),
                    batch_size=ENCODE_BATCH,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                )
                return _vectors(vectors)

        df = daft.read_parquet(os.path.join(data, "*.parquet"))
        df = df.select(df["id"], DaftEmbedder()(df["text"]).alias("embedding"))
        df.write_parquet(out)

    def ray_data(out: str) -> None:
        import ray

        ds = ray.data.read_parquet(data).map_batches(
            EmbedActor,
            fn_constructor_args=(path,),
            batch_size=file_rows,
            batch_format="pyarrow",
            concurrency=1,
        )
        ds.write_parquet(out)

    def ray_core(out: str) -> None:
        import ray

        os.makedirs(out)
        task = ray.remote(_embed_file)
        ref = ray.put(example.load_model(path))
        ray.get([task.remote(ref, file, out) for file in files])

    one = replace(model, pool=chute.Pool.fixed(1))  # the local pool before it grew

    def chute_one(out: str) -> Any:
        return chute.run(data, one, out, carryover=["id"], engine="local")

    local = {
        "model alone": alone,
        "chute local": chute_run("local"),
        "chute 1 replica": chute_one,
        "pyarrow loop": loop,
    }
    with_daft(local, daft_run)
    return Workload(
        "minilm",
        rows,
        local=local,
        ray={"chute ray": chute_run("ray"), "Ray Data": ray_data, "Ray Core tasks": ray_core},
    )


WORKLOADS: dict[str, Callable[[str, int], Workload]] = {
    "taxi": taxi,
    "mlp": mlp,
    "minilm": minilm,
    "taxi-800MB": taxi_800mb,
    "taxi-x10": taxi_x10,
}


# --------------------------------------------------------------------------- report


COMPARISONS = [
    ("chute local", "pyarrow loop"),
    ("chute local", "model alone"),
    ("chute local", "Daft"),
    ("chute local", "chute 1 replica"),
    ("chute ray", "Daft"),
    ("chute ray", "Ray Data"),
    ("chute ray", "Ray Core tasks"),
]

SPEED_GOALS = [  # (ours, baseline, lowest rows/s ratio that meets the goal): issue 14, point 1
    ("chute ray", "Ray Core tasks", 1.0),
    ("chute ray", "Ray Data", 1.3),
    ("chute local", "pyarrow loop", 1.0),
    ("chute local", "Daft", 1.0),
]
MLP_MEMORY_GOAL = 2.0  # chute local's peak ≤ 2× the loop's on the MLP
FLAT_MEMORY_GOAL = 1.3  # chute local's peak on taxi-x10 ≤ 1.3× its peak on taxi


def print_tables(
    results: list[Summary],
    ray_start: float | None,
    comparisons: list[tuple[str, str]] = COMPARISONS,
) -> None:
    workloads = list(dict.fromkeys(r.workload for r in results))
    head = (
        f"{'variant':<16}{'seconds':>8}{'(min–max)':>15}{'rows/s':>12}{'CPU s':>7}"
        f"{'peak MiB':>9}{'pipeline s':>11}"
    )
    for name in workloads:
        rows = [r for r in results if r.workload == name]
        print(f"\n## {name}: {rows[0].rows:,} rows, medians of {rows[0].runs} runs\n")
        print(head)
        print("-" * len(head))
        for r in rows:
            pipeline = "" if r.pipeline is None else f"{r.pipeline:.2f}"
            spread = f"({r.fastest:.2f}–{r.slowest:.2f})"
            print(
                f"{r.variant:<16}{r.seconds:>8.2f}{spread:>15}{r.rate:>12,.0f}{r.cpu:>7.1f}"
                f"{r.peak / MIB:>9,.0f}{pipeline:>11}"
            )
        by = {r.variant: r for r in rows}
        lines = []
        for ours, theirs in comparisons:
            if ours not in by or theirs not in by:
                continue
            a, b = by[ours], by[theirs]
            small = b.peak < 16 * MIB  # a ratio of two noise levels means nothing
            mem = "-" if small else f"{a.peak / b.peak:.2f}×"
            cpu = f"{a.cpu / b.cpu:.2f}×" if b.cpu > 0 else "-"
            lines.append(f"{ours + ' / ' + theirs:<30}{a.rate / b.rate:>7.2f}×{cpu:>8}{mem:>10}")
        if lines:
            print(f"\n{'chute / baseline':<30}{'rows/s':>8}{'CPU s':>8}{'peak':>10}")
            print("\n".join(lines))
    print(
        "\nseconds: median wall time of the whole run, fastest and slowest in brackets. "
        "pipeline s (chute):\nthe report's wall_seconds, from planning to the last commit; "
        "the rest of 'seconds' is writing\nreport.json and report.html."
    )
    if ray_start is not None:
        print(
            f"Ray start-up (ray.init + a first Ray Data job), not in any time above: "
            f"{ray_start:.2f} s"
        )


def goals(results: list[Summary]) -> list[tuple[str, str, str, str]]:
    """(goal, workload, measured, met/missed) for each goal of issue 14's point 1 that these
    results can decide."""
    by = {(r.workload, r.variant): r for r in results}
    rows: list[tuple[str, str, str, str]] = []
    for workload in dict.fromkeys(r.workload for r in results):
        for ours, theirs, floor in SPEED_GOALS:
            a, b = by.get((workload, ours)), by.get((workload, theirs))
            if a is not None and b is not None:
                ratio = a.rate / b.rate
                verdict = "met" if ratio >= floor else "missed"
                rows.append((f"{ours} ≥ {floor}× {theirs}", workload, f"{ratio:.2f}×", verdict))
    ours, loop = by.get(("mlp", "chute local")), by.get(("mlp", "pyarrow loop"))
    if ours is not None and loop is not None and loop.peak > 0:
        ratio = ours.peak / loop.peak
        verdict = "met" if ratio <= MLP_MEMORY_GOAL else "missed"
        measured = f"{ratio:.2f}× ({ours.peak / MIB:,.0f} / {loop.peak / MIB:,.0f} MiB)"
        rows.append((f"chute local peak ≤ {MLP_MEMORY_GOAL}× loop's", "mlp", measured, verdict))
    small, big = by.get(("taxi", "chute local")), by.get(("taxi-x10", "chute local"))
    if small is not None and big is not None and small.peak > 0:
        ratio = big.peak / small.peak
        verdict = "met" if ratio <= FLAT_MEMORY_GOAL else "missed"
        measured = f"{ratio:.2f}× ({big.peak / MIB:,.0f} / {small.peak / MIB:,.0f} MiB)"
        goal = f"chute local peak flat (≤ {FLAT_MEMORY_GOAL}×) at 10× the input"
        rows.append((goal, "taxi → taxi-x10", measured, verdict))
    return rows


def print_goals(results: list[Summary]) -> None:
    found = goals(results)
    if not found:
        return
    print("\n## Goals (issue 14, point 1): medians, rows/s ratio unless said\n")
    width = max(len(g) for g, *_ in found)
    for goal, workload, measured, verdict in found:
        print(f"{goal:<{width}}  {workload:<16}{measured:>28}  {verdict}")


def start_ray() -> float:
    import ray

    started = time.perf_counter()
    ray.init(
        address="local",
        num_cpus=os.cpu_count(),
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
    )
    from ray.data import DataContext

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    ray.data.range(8).map_batches(lambda b: b).materialize()  # Ray Data's own actors
    return time.perf_counter() - started


# --------------------------------------------------------------------------- main


def parse_rows(text: str | None) -> dict[str, int]:
    rows = dict(DEFAULT_ROWS)
    if not text:
        return rows
    if text.replace("_", "").isdigit():
        return {name: int(text) for name in rows}
    for item in text.split(","):
        name, _, value = item.partition("=")
        if name not in rows or not value.replace("_", "").isdigit():
            raise SystemExit(f"--rows: cannot read {item!r}; write 100000 or taxi=100000,mlp=...")
        rows[name] = int(value)
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help=f"comma-separated: {', '.join(WORKLOADS)} (default: all)",
    )
    parser.add_argument(
        "--rows",
        default=None,
        help="rows for every workload (100000) or per workload "
        "(taxi=1710629,mlp=1000000,minilm=10000, the defaults)",
    )
    parser.add_argument(
        "--out",
        default=str(ROOT / "bench-out"),
        help="data and outputs (default: bench-out/ in the repo)",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per variant, interleaved; medians are shown"
    )
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray variants")
    parser.add_argument(
        "--variants", default=None, help="comma-separated variants to run (default: all)"
    )
    parser.add_argument("--json", default=None, help="also write every run to this file")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run the variants without Ray in this process, one after another (default: "
        "each run in a fresh process, after a warm-up run there)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed runs of a variant in its process before the measured one (default 1)",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def keep(workloads: list[Workload], variants: str | None) -> list[Workload]:
    """The workloads with only the ``--variants`` asked for: a variant one workload lacks
    (``model alone`` beside taxi) is skipped there; one that none has is an error."""
    if variants is None:
        return workloads
    wanted = {v.strip() for v in variants.split(",")}
    known = {v for w in workloads for v in (*w.local, *w.ray)}
    if wanted - known:
        raise SystemExit(f"unknown variants {sorted(wanted - known)}: choose from {sorted(known)}")
    for w in workloads:
        w.local = {k: v for k, v in w.local.items() if k in wanted}
        w.ray = {k: v for k, v in w.ray.items() if k in wanted}
    return workloads


def header(args: argparse.Namespace) -> str:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"chute benchmark · {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC · commit {commit()}\n"
        f"{cpu_model()} · {os.cpu_count()} CPUs · "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB · Python {platform.python_version()} · "
        f"load average before: {load}"
    )


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def commit() -> str:
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "?"
    return done.stdout.strip() or "?"


def chosen(args: argparse.Namespace) -> Iterator[tuple[str, int]]:
    rows = parse_rows(args.rows)
    for name in args.workloads.split(","):
        if name not in WORKLOADS:
            raise SystemExit(f"unknown workload {name!r}: choose from {', '.join(WORKLOADS)}")
        yield name, rows[name]


def main(argv: list[str] | None = None) -> list[Summary]:
    args = parse_args(argv)
    if args.child:
        child(args.child, args)
        return []
    print(header(args), flush=True)
    if importlib.util.find_spec("daft") is None:
        print("Daft is not installed (pip install -e '.[bench]'): no Daft variant", flush=True)
    print("preparing data ...", flush=True)
    workloads = keep(
        [WORKLOADS[name](args.out, rows) for name, rows in chosen(args)], args.variants
    )
    results: list[Result] = []
    outputs = os.path.join(args.out, "results")
    if not args.in_process and any(w.local for w in workloads):
        print(
            f"each run below in a process of its own, after {args.warmup} untimed run(s) of "
            "the same variant there",
            flush=True,
        )
    for w in workloads:  # everything without Ray first, so no idle Ray process is counted
        if args.in_process:
            results += run_all(w, w.local, outputs, args.repeat, LOCAL_PERIOD)
        else:
            results += run_isolated(w, args)
    ray_start = None
    if not args.no_ray and any(w.ray for w in workloads):
        ray_start = start_ray()
        print(f"  Ray started in {ray_start:.2f} s", flush=True)
        for w in workloads:
            results += run_all(w, w.ray, outputs, args.repeat)
    order = [
        "model alone",
        "chute local",
        "chute 1 replica",
        "pyarrow loop",
        "Daft",
        "chute ray",
        "Ray Data",
        "Ray Core tasks",
    ]
    summaries = summarize(results)
    summaries.sort(
        key=lambda r: ([w.name for w in workloads].index(r.workload), order.index(r.variant))
    )
    print_tables(summaries, ray_start)
    print_goals(summaries)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=1))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\nload average after: {load}")
    return summaries


if __name__ == "__main__":
    main(sys.argv[1:])
