"""Where a GPU replica's time goes, in this process and in Ray workers of several shapes.

``gpu.py`` found every Ray variant (chute's and the hand-written ones) at about half the
single-process rate on one GPU. This probe runs the same work in the driver and in Ray
actors and tasks, and prints for each: the process's settings (threads, CPU affinity,
niceness, environment), a pure-Python loop (the CPU's speed there), the model's load
(imports, weights, the CUDA context), tokenizing alone, forward passes alone on
tokenized batches, and ``model.encode`` end to end. The driver and the first actor are
also profiled (cProfile: their ``encode`` is slower for it).

    python benchmarks/gpu_probe.py                 # 30,000 sentences on the GPU
    python benchmarks/gpu_probe.py --device cpu --sentences 3000    # a dry run
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import sys
import threading
import time
from pathlib import Path
from typing import Any

import gpu  # this folder's gpu.py (the script's own folder is on sys.path)

BATCH = 256
OMP16 = {"OMP_NUM_THREADS": "16"}
VARIABLES = (
    "OMP_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "TOKENIZERS_PARALLELISM",
    "RAYON_NUM_THREADS",
    "CUDA_LAUNCH_BLOCKING",
    "MALLOC_ARENA_MAX",
    "PYTORCH_CUDA_ALLOC_CONF",
)


def probe(path: str, sentences: list[str], device: str, label: str, profile: bool) -> dict:
    """The figures of one process (see the module's text)."""
    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if "nice 0" in label:  # Ray starts its workers at niceness 15
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    info: dict[str, Any] = {
        "label": label,
        "torch threads": torch.get_num_threads(),
        "CPUs it may run on": len(os.sched_getaffinity(0)),
        "niceness": os.nice(0),
        "Python threads": [t.name for t in threading.enumerate()],
        "environment": {k: os.environ[k] for k in VARIABLES if k in os.environ},
        "gc thresholds": gc.get_threshold(),
    }
    began = time.perf_counter()
    total = 0
    for i in range(3_000_000):
        total += i
    info["pure Python s"] = round(time.perf_counter() - began, 3)
    began = time.perf_counter()
    model = gpu.load(path, device)
    info["load s"] = round(time.perf_counter() - began, 2)
    gpu.encode(model, sentences[:2_000], BATCH)  # warm
    began = time.perf_counter()
    batches = [model.tokenize(sentences[i : i + BATCH]) for i in range(0, len(sentences), BATCH)]
    info["tokenize s"] = round(time.perf_counter() - began, 2)
    began = time.perf_counter()
    with torch.inference_mode():
        for features in batches:
            moved = {k: v.to(device) if hasattr(v, "to") else v for k, v in features.items()}
            model.forward(moved)["sentence_embedding"].cpu()
    if device == "cuda":
        torch.cuda.synchronize()
    info["forward s"] = round(time.perf_counter() - began, 2)
    profiler = cProfile.Profile() if profile else None
    began = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    gpu.encode(model, sentences, BATCH)
    if profiler is not None:
        profiler.disable()
    info["encode s"] = round(time.perf_counter() - began, 2)
    info["encode rows/s"] = round(len(sentences) / info["encode s"])
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(12)
        info["profile"] = text.getvalue()
    return info


class Prober:
    """The probe in a Ray actor."""

    def run(self, *args: Any) -> dict:
        return probe(*args)


def show(info: dict) -> None:
    profile = info.pop("profile", None)
    print(f"---- {info.pop('label')}")
    for name, value in info.items():
        print(f"  {name}: {value}")
    if profile:
        print(profile)
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=30_000)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--out", default=str(gpu.bench.ROOT / "bench-out" / "gpu-probe"))
    args = parser.parse_args(argv)
    import ray

    sentences = gpu.bench.load_example("minilm").make_sentences(args.sentences)
    path = gpu.minilm_shaped(Path(args.out) / "minilm-shaped", sentences)
    show(probe(path, sentences, args.device, "this process", True))
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    gpus = 1 if args.device == "cuda" else 0
    shared = ray.put(sentences)
    shapes: list[tuple[str, dict[str, Any], bool]] = [
        ("actor, num_gpus=1 (one CPU), profiled", {}, False),
        ("actor, num_gpus=1, num_cpus=4", {"num_cpus": 4}, False),
        ("actor, num_gpus=1, OMP_NUM_THREADS=16", {"runtime_env": {"env_vars": OMP16}}, False),
        ("task, num_gpus=1", {}, True),
        ("actor, num_gpus=1, nice 0", {}, False),
    ]
    for label, options, as_task in shapes:
        if options.get("num_cpus", 1) >= (os.cpu_count() or 1):
            continue
        call = (path, shared, args.device, label, "profiled" in label)
        if as_task:
            info = ray.get(ray.remote(num_gpus=gpus, **options)(probe).remote(*call))
        else:
            actor = ray.remote(num_gpus=gpus, **options)(Prober).remote()
            info = ray.get(actor.run.remote(*call))
            ray.kill(actor)
        show(info)


if __name__ == "__main__":
    main(sys.argv[1:])
