"""A torch MLP over 1,000,000 × 10 float32 features held in a pandas DataFrame.

The batch size is given in bytes of the model's input columns ("4MiB" of 10 float32
columns is 104,857 rows); chute cuts the in-memory DataFrame into units, rebatches them
to that size and hands each batch to the model as a dict of NumPy arrays. The result
comes back as a DataFrame in input order and is checked against calling the network
directly on the whole array.

    python examples/torch_mlp/run.py                       # local engine, 1,000,000 rows
    python examples/torch_mlp/run.py --engine ray --batch-size 1MiB
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np
import pandas as pd
import torch

FEATURES = [f"f{i}" for i in range(10)]


def build_mlp(seed: int = 0) -> torch.nn.Module:
    """The network: 10 → 64 → 1, initialized from a fixed seed."""
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(10, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    return net.eval()


class MLP:
    """The model stage: the constructor loads the weights once per replica."""

    def __init__(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.net = build_mlp()
        self.net.load_state_dict(state_dict)

    def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        x = np.column_stack([batch[name] for name in FEATURES]).astype(np.float32, copy=False)
        with torch.inference_mode():
            return self.net(torch.from_numpy(x)).numpy()[:, 0]


def make_features(rows: int, seed: int = 0) -> pd.DataFrame:
    """``rows`` × 10 standard-normal float32 features."""
    data = np.random.default_rng(seed).standard_normal((rows, len(FEATURES)), dtype=np.float32)
    return pd.DataFrame(data, columns=FEATURES)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch-size", default="4MiB", help="rows, or bytes like 4MiB")
    parser.add_argument("--engine", choices=["local", "ray", "auto"], default="local")
    parser.add_argument("--pool", type=int, default=1, help="model replicas")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import chute

    args = parse_args(argv)
    df = make_features(args.rows)
    weights = build_mlp().state_dict()
    model = chute.Model(
        "mlp",
        MLP,
        inputs=FEATURES,
        batch_format="numpy",
        batch_size=args.batch_size,
        pool=chute.Pool.fixed(args.pool),
        kwargs={"state_dict": weights},
    )
    job = chute.Job(chute.sources.as_source(df), (model,), engine=args.engine)
    started = time.perf_counter()
    report = job.run()
    seconds = time.perf_counter() - started
    assert report.result is not None
    result = report.result.to_pandas()

    with torch.inference_mode():
        x = np.ascontiguousarray(df.to_numpy(dtype=np.float32))
        expected = build_mlp()(torch.from_numpy(x)).numpy()[:, 0]
    diff = float(np.max(np.abs(result["mlp"].to_numpy() - expected)))
    ok = len(result) == len(df) and diff <= 1e-5
    batches = report.stages["mlp"].calls  # model calls (a Ray actor writes a block whole)
    batch_rows = model.batch_size.rows_for(4 * len(FEATURES))
    print(
        f"{report.rows_out:,} rows on the {report.engine} engine in {seconds:.2f} s "
        f"({report.rows_out / seconds:,.0f} rows/s); batch size {args.batch_size} of "
        f"float32 × {len(FEATURES)} = {batch_rows:,} rows, {batches} batches"
    )
    print(f"max |chute - direct| = {diff:.2e}: {'OK' if ok else 'MISMATCH'}")
    if not ok:
        raise SystemExit(1)
    return {
        "rows": report.rows_out,
        "engine": report.engine,
        "max_abs_diff": diff,
        "batches": batches,
        "batch_rows": batch_rows,
        "result": result,
        "expected": expected,
    }


if __name__ == "__main__":
    main(sys.argv[1:])
