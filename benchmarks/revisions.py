"""chute before and after a change, on the same data in one run: ``bench.py``'s chute
variants for two revisions, interleaved.

The older revision is checked out in a temporary git worktree and imported through
``PYTHONPATH`` (Ray's workers inherit it); the newer is this working tree. Both are run
by this tree's ``bench.py``, so the harness, the data and the baselines are the same.
Each round runs every revision once, the order swapped each round, so that a change in
the machine's load hits both alike; the table gives the median of the rounds and their
spread.

    python benchmarks/revisions.py --base 65ab6bc --repeat 3
    python benchmarks/revisions.py --base HEAD~5 --workloads taxi --rows taxi=200000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = "chute local,chute ray"
Samples = dict[tuple[str, str, str], list[dict[str, float]]]
"""(workload, variant, revision) → one result per round."""


@contextmanager
def worktree(revision: str) -> Iterator[Path]:
    """``revision`` checked out in a temporary directory, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="chute-rev-") as parent:
        path = Path(parent) / "tree"
        git("worktree", "add", "--detach", "--quiet", str(path), revision)
        try:
            yield path
        finally:
            git("worktree", "remove", "--force", str(path))


def git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def bench(src: Path, args: argparse.Namespace, out: Path) -> list[dict[str, float]]:
    """One run of this tree's bench.py with the chute found in ``src``."""
    result = out / "result.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "bench.py"), "--variants", VARIANTS]
    command += ["--repeat", "1"]  # the rounds are this script's
    command += ["--workloads", args.workloads, "--out", str(out), "--json", str(result)]
    command += ["--rows", args.rows] if args.rows else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(ROOT)])}
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    loaded: list[dict[str, float]] = json.loads(result.read_text())
    return loaded


def collect(args: argparse.Namespace, trees: dict[str, Path], data: Path) -> Samples:
    samples: Samples = defaultdict(list)
    names = list(trees)
    for round_ in range(args.repeat):
        for name in names if round_ % 2 == 0 else names[::-1]:
            print(f"round {round_ + 1}/{args.repeat}: {name}", flush=True)
            for r in bench(trees[name] / "src", args, data):
                samples[(str(r["workload"]), str(r["variant"]), name)].append(r)
    return samples


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def table(samples: Samples, base: str, head: str) -> str:
    lines = [
        f"| workload | variant | {base} s | {head} s | speed {head}/{base} "
        f"| peak MiB {base} | peak MiB {head} |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    for workload, variant in dict.fromkeys((w, v) for w, v, _ in samples):
        old, new = samples[(workload, variant, base)], samples[(workload, variant, head)]
        before = [r["seconds"] for r in old]
        after = [r["seconds"] for r in new]
        speed = statistics.median(before) / statistics.median(after)
        peaks = [statistics.median(r["peak"] for r in rs) / 2**20 for rs in (old, new)]
        lines.append(
            f"| {workload} | {variant} | {spread(before)} | {spread(after)} | {speed:.2f}× "
            f"| {peaks[0]:,.0f} | {peaks[1]:,.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the older revision (a commit, a tag)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--workloads", default="taxi,mlp,minilm")
    parser.add_argument("--rows", default=None, help="as bench.py's --rows")
    parser.add_argument("--out", default=str(ROOT / "bench-out" / "revisions"))
    args = parser.parse_args(argv)
    base = git("rev-parse", "--short", args.base)
    head = git("describe", "--always", "--dirty")
    print(f"chute {base} against {head} · load average {os.getloadavg()[0]:.1f}", flush=True)
    with worktree(base) as old:
        samples = collect(args, {base: old, head: ROOT}, Path(args.out))
    print(table(samples, base, head))
    print(f"medians of {args.repeat} rounds (min–max); load average now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
