"""A model object carrying a large NumPy payload, on the ray engine: one shared copy.

The model is an *instance* holding an 800 MB float64 table (think: an embedding or a
lookup table) and is handed to chute as ``Model(fn=instance)``. On the ray engine chute
puts it in the object store once; every actor of the pool gets it by reference and
NumPy maps the table zero-copy from shared memory, so no actor holds a private copy.

The script measures that. Each scenario runs in a fresh local Ray so that the object
store's shared memory is measured exactly, while a background thread samples, every
20 ms:

* the driver: its RSS (reported) and its private memory (RSS minus shared pages, so the
  object store's pages it wrote are not counted twice);
* the object store: bytes allocated in this Ray's plasma shared-memory file;
* the model workers: the USS (unique set size) of every Ray worker running the model.

``copies`` = (peak of driver private + object store + model workers, minus the same for
a calibration run with a 1 MiB payload) / payload size. chute's total is about 2: the
driver's own array and the one object-store copy; the actors add nothing. The naive
comparison hands the model to Ray Core tasks *by value*, one task per file: Ray then
pickles and stores it once per task.

    python examples/big_payload/run.py                      # 800 MB payload, full taxi data
    python examples/big_payload/run.py --payload-mb 100 --rows 200000
"""

from __future__ import annotations

import argparse
import gc
import glob
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MIB = 2**20
CALIBRATION_MB = 1
ACTORS = 2


class LookupModel:
    """A model whose weights are one big float64 table: score = table[trip_id % size]."""

    def __init__(self, megabytes: float, seed: int = 0) -> None:
        size = max(1, int(megabytes * MIB) // 8)
        self.table = np.random.default_rng(seed).random(size)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"score": self.table[batch["trip_id"] % len(self.table)]}


# --------------------------------------------------------------------------- memory


def _plasma_file() -> str | None:
    """The /proc path of this Ray's object-store file (an unlinked file held by the raylet)."""
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.name() != "raylet":
                continue
            for fd in os.listdir(f"/proc/{proc.pid}/fd"):
                link = os.readlink(f"/proc/{proc.pid}/fd/{fd}")
                if "plasma" in link and not link.startswith("socket:"):
                    return f"/proc/{proc.pid}/fd/{fd}"
        except (psutil.Error, OSError):
            continue
    return None


class Sampler:
    """Samples the driver, the object store and the model workers in a background thread."""

    def __init__(self, marker: str, period: float = 0.02) -> None:
        self.marker = marker
        self.period = period
        self.me = psutil.Process()
        self.plasma = _plasma_file()
        self.base = self.sample()
        self.peak: dict[str, Any] = {"driver_rss": 0, "total": 0, "workers": {}}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def store(self) -> int:
        if self.plasma is None:
            return 0
        try:
            return os.stat(self.plasma).st_blocks * 512
        except OSError:
            return 0

    def sample(self) -> dict[str, Any]:
        info = self.me.memory_info()
        workers: dict[int, int] = {}
        for proc in self.me.children(recursive=True):
            try:
                if self.marker in " ".join(proc.cmdline()):
                    workers[proc.pid] = proc.memory_full_info().uss
            except psutil.Error:
                continue
        driver = info.rss - info.shared
        store = self.store()
        total = driver + store + sum(workers.values())
        return {
            "driver_rss": info.rss,
            "driver": driver,
            "store": store,
            "workers": workers,
            "total": total,
        }

    def _loop(self) -> None:
        while not self._stop.is_set():
            s = self.sample()
            self.peak["driver_rss"] = max(self.peak["driver_rss"], s["driver_rss"])
            for pid, uss in s["workers"].items():
                self.peak["workers"][pid] = max(self.peak["workers"].get(pid, 0), uss)
            if s["total"] > self.peak["total"]:
                self.peak.update(total=s["total"], at=s)
            self._stop.wait(self.period)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def result(self) -> dict[str, Any]:
        """Peaks, as increases over the sample taken before the run (bytes)."""
        at = self.peak.get("at", self.base)
        return {
            "total": self.peak["total"] - self.base["total"],
            "driver": at["driver"] - self.base["driver"],
            "store": at["store"] - self.base["store"],
            "workers": sum(at["workers"].values()),
            "driver_rss_peak": self.peak["driver_rss"],
            "worker_uss_peaks": sorted(self.peak["workers"].values()),
        }


# --------------------------------------------------------------------------- scenarios


def run_chute(data: str, out: str, megabytes: float) -> tuple[int, LookupModel]:
    """The model object on chute's ray engine, with a pool of two actors."""
    import chute

    model = LookupModel(megabytes)
    report = chute.run(
        data,
        chute.Model(
            "lookup", model, inputs=["trip_id"], batch_format="numpy", pool=chute.Pool.fixed(ACTORS)
        ),
        out,
        carryover=["trip_id"],
        engine="ray",
        overwrite=True,
    )
    return report.rows_out, model


def check_output(out: str, model: LookupModel) -> None:
    import pyarrow.parquet as pq

    table = pq.read_table(out, columns=["trip_id", "lookup_score"])
    ids = table.column("trip_id").to_numpy()
    expected = model.table[ids % len(model.table)]
    if not np.array_equal(table.column("lookup_score").to_numpy(), expected):
        raise SystemExit("wrong scores in the output")


def naive_score(model: LookupModel, path: str, out: str) -> int:
    """One file: read, score, write (the model arrives by value, once per task)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["trip_id"])
    scores = model({"trip_id": table.column("trip_id").to_numpy()})["score"]
    table = table.append_column("lookup_score", pa.array(scores))
    pq.write_table(table, os.path.join(out, os.path.basename(path)))
    return table.num_rows


def run_naive(data: str, out: str, megabytes: float, tasks: int) -> tuple[int, LookupModel]:
    """Ray Core tasks, one per file, with the model passed by value to every call."""
    import ray

    os.makedirs(out, exist_ok=True)
    files = sorted(glob.glob(os.path.join(data, "*.parquet")))[:tasks]
    model = LookupModel(megabytes)
    remote = ray.remote(naive_score)
    return sum(ray.get([remote.remote(model, f, out) for f in files])), model


def measure(
    marker: str, fn: Callable[[], tuple[int, LookupModel]], cpus: int, out: str | None = None
) -> dict[str, Any]:
    """Run ``fn`` in a fresh local Ray and return its memory peaks; then check the scores
    it wrote to ``out``, if given (outside the measured window)."""
    import ray

    ray.init(
        address="local",
        num_cpus=cpus,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
    )
    try:
        gc.collect()
        time.sleep(0.5)
        started = time.perf_counter()
        with Sampler(marker) as sampler:
            rows, model = fn()
            time.sleep(0.1)
        result = sampler.result()
        result["rows"], result["seconds"] = rows, time.perf_counter() - started
        if out is not None:
            check_output(out, model)
        del model
    finally:
        ray.shutdown()
        gc.collect()
    return result


def copies(run: dict[str, Any], calibration: dict[str, Any], megabytes: float) -> float:
    return float((run["total"] - calibration["total"]) / (megabytes * MIB))


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--payload-mb",
        type=float,
        default=800.0,
        help="size of the model's NumPy payload in MiB (default 800)",
    )
    parser.add_argument(
        "--data",
        default=os.path.join(ROOT, "chute-demo", "taxi"),
        help="taxi Parquet directory (generated if missing)",
    )
    parser.add_argument(
        "--rows",
        type=int,
        default=None,
        help="rows to generate when --data does not exist (default: all)",
    )
    parser.add_argument(
        "--out",
        default=os.path.join(ROOT, "chute-demo", "big-payload"),
        help="where the outputs go",
    )
    parser.add_argument(
        "--naive-tasks",
        type=int,
        default=4,
        help="files scored by the naive by-value Ray Core tasks (0: skip)",
    )
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--json", default=None, help="also write the measurements here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
    from chute.demo import TOTAL_ROWS, generate

    if not glob.glob(os.path.join(args.data, "*.parquet")):
        generate(args.data, args.rows or TOTAL_ROWS)
    mb = args.payload_mb
    chute_out = os.path.join(args.out, "chute")
    results: dict[str, Any] = {"payload_mb": mb, "cpus": args.cpus, "actors": ACTORS}
    results["chute_calibration"] = measure(
        "ModelActor", lambda: run_chute(args.data, chute_out, CALIBRATION_MB), args.cpus
    )
    results["chute"] = measure(
        "ModelActor", lambda: run_chute(args.data, chute_out, mb), args.cpus, out=chute_out
    )
    results["chute"]["copies"] = copies(results["chute"], results["chute_calibration"], mb)
    if args.naive_tasks > 0:
        naive_out = os.path.join(args.out, "naive")
        results["naive_calibration"] = measure(
            "naive_score",
            lambda: run_naive(args.data, naive_out, CALIBRATION_MB, args.naive_tasks),
            args.cpus,
        )
        results["naive"] = measure(
            "naive_score",
            lambda: run_naive(args.data, naive_out, mb, args.naive_tasks),
            args.cpus,
            out=naive_out,
        )
        results["naive"]["copies"] = copies(results["naive"], results["naive_calibration"], mb)
    print_table(results, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


def print_table(results: dict[str, Any], args: argparse.Namespace) -> None:
    mb = results["payload_mb"]
    print(
        f"\npayload {mb:g} MiB · {results['chute']['rows']:,} rows · {args.cpus} CPUs · "
        "memory peaks as increases over the idle Ray, in MiB\n"
    )
    head = (
        f"{'run':<34}{'rows':>10}{'driver':>9}{'store':>9}{'workers':>9}{'total':>9}"
        f"{'copies':>8}   driver RSS peak · model worker USS peaks"
    )
    print(head)
    print("-" * len(head))
    rows = [
        ("chute_calibration", f"chute, ray engine ({CALIBRATION_MB} MiB payload)"),
        ("chute", f"chute, ray engine, {ACTORS} actors"),
        ("naive_calibration", f"naive ({CALIBRATION_MB} MiB payload)"),
        ("naive", f"naive: by value, {args.naive_tasks} tasks"),
    ]
    for key, label in rows:
        if key not in results:
            continue
        r = results[key]
        n = r.get("copies")
        print(
            f"{label:<34}{r['rows']:>10,}{r['driver'] / MIB:>9.0f}{r['store'] / MIB:>9.0f}"
            f"{r['workers'] / MIB:>9.0f}{r['total'] / MIB:>9.0f}"
            f"{'' if n is None else f'{n:.2f}':>8}   {r['driver_rss_peak'] / MIB:.0f} · "
            + ", ".join(f"{u / MIB:.0f}" for u in r["worker_uss_peaks"])
        )
    print(
        f"\ncopies = (total - calibration total) / {mb:g} MiB. chute: the driver's own array "
        "plus one object-store copy,\nshared zero-copy by every actor. naive: one more "
        "object-store copy per task."
    )


if __name__ == "__main__":
    main(sys.argv[1:])
