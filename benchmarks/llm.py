"""chute's vllm adapter against one plain ``LLM.generate`` over all prompts (issue 15).

For each model — the tiny random Llama of the tests (hidden 128, 2 layers) and a larger
random one where generation dominates (hidden 512, 8 layers, 8 heads) — the same prompts,
``temperature: 0``, ``max_tokens`` fixed and ``ignore_eos`` (every prompt generates
exactly ``max_tokens``: the same work on both sides):

* ``plain``: ``llm.generate(all prompts)``, the engine already loaded;
* ``chute``: a job over the same prompts (a Parquet file, the local engine, output
  written and committed), the same loaded engine handed to the adapter, so that model
  load is excluded on both sides; its time is the whole ``job.run()``, with planning,
  reading, writing and committing in it. Time to first committed row from the report;
* ``chute, units of 64``: the same in units of 64 rows (each committed when done: an
  earlier first row, smaller engine calls);
* ``ray.data.llm``: its vLLM processor over the same prompts, where it runs at all.

Variants alternate, ``--repeat`` times each; the table keeps each one's best.
Run it in the LLM environment (``scripts/llm-tests`` builds it):

    .venv-llm/bin/python benchmarks/llm.py
    .venv-llm/bin/python benchmarks/llm.py --models tiny --prompts 256 --repeat 2
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ENGINE = {"dtype": "bfloat16", "max_model_len": 256, "enforce_eager": True}
UNIT_ROWS = 64
VARIANTS = ("plain", "chute", f"chute, units of {UNIT_ROWS}")
MODELS = {"tiny": {}, "large": {"hidden": 512, "layers": 8, "heads": 8, "kv_heads": 2}}


def prompts(count: int) -> list[str]:
    words = [
        "the",
        "cat",
        "sat",
        "on",
        "a",
        "red",
        "mat",
        "by",
        "the",
        "blue",
        "river",
        "near",
        "one",
        "green",
        "tree",
    ]
    return [" ".join(words[(i + j) % len(words)] for j in range(8 + i % 9)) for i in range(count)]


def plain(llm: Any, texts: list[str], max_tokens: int) -> dict[str, float]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    began = time.perf_counter()
    results = llm.generate(texts, params, use_tqdm=False)
    seconds = time.perf_counter() - began
    tokens = sum(len(r.outputs[0].token_ids) for r in results)
    return {"seconds": seconds, "tokens": tokens, "first_row": float("nan")}


def chute_run(
    llm: Any, model_dir: Path, texts: list[str], max_tokens: int, out: Path, unit_rows: int = 0
) -> dict[str, float]:
    """The job; ``unit_rows``: the input in units of that many rows (committed one by one),
    else one Parquet file, one unit."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import chute.models.llm as llm_module
    from chute import FileSource, Job, Model, adapter
    from chute.job import Sink
    from chute.sources import TableSource

    llm_module.load_llm = lambda *args, **kwargs: llm  # type: ignore[assignment]
    source = out.parent / "prompts.parquet"
    if not source.exists():
        pq.write_table(pa.table({"id": range(len(texts)), "prompt": texts}), source)
    spec = adapter(
        "vllm", path=str(model_dir), temperature=0, max_tokens=max_tokens, ignore_eos=True,
        **ENGINE,
    )  # fmt: skip
    table = pq.read_table(source)
    job = Job(
        source=TableSource(table, unit_rows=unit_rows) if unit_rows else FileSource(str(source)),
        models=(Model("gen", spec, inputs=("prompt",)),),
        carryover=("id",),
        output=Sink(str(out), "parquet"),
        engine="local",
    )
    began = time.perf_counter()
    report = job.run(overwrite=True)
    seconds = time.perf_counter() - began
    first = next((t for t, rows in report.timeline if rows > 0), float("nan"))
    tokens = report.stages["gen"].counters.get("generated_tokens", 0.0)
    return {"seconds": seconds, "tokens": tokens, "first_row": first}


def ray_data_llm(
    model_dir: Path | str, texts: list[str], max_tokens: int, fake_gpu: bool = False
) -> str:
    """Run ray.data.llm's vLLM processor; what happened, in a line. Its engine stage asks
    Ray for a GPU per replica: on a CPU-only machine it waits for one for ever, unless
    ``fake_gpu`` declares one to Ray (vLLM's CPU build then runs in the actor)."""
    try:
        import ray
        from ray.data.llm import (
            ChatTemplateStageConfig,
            build_processor,
            vLLMEngineProcessorConfig,
        )

        ray.init(
            num_cpus=os.cpu_count(),
            num_gpus=1 if fake_gpu else 0,
            include_dashboard=False,
            log_to_driver=False,
        )
        config = vLLMEngineProcessorConfig(
            model_source=str(model_dir),
            engine_kwargs=dict(ENGINE),
            concurrency=1,
            batch_size=64,
            chat_template_stage=ChatTemplateStageConfig(enabled=False),  # plain prompts
        )
        processor = build_processor(
            config,
            preprocess=lambda row: {
                "prompt": row["prompt"],
                "sampling_params": {
                    "temperature": 0,
                    "max_tokens": max_tokens,
                    "ignore_eos": True,
                },
            },
            postprocess=lambda row: {"text": row["generated_text"]},
        )
        began = time.perf_counter()
        rows = processor(ray.data.from_items([{"prompt": t} for t in texts])).take_all()
        seconds = time.perf_counter() - began
        return f"ran: {len(rows)} rows in {seconds:.1f} s (model load included)"
    except BaseException as exc:  # what happens is the result
        text = " ".join(traceback.format_exception_only(type(exc), exc)).split()
        return f"failed: {' '.join(text)[-700:]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,large")
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--ray-data", action="store_true", help="try ray.data.llm too")
    parser.add_argument("--ray-data-timeout", type=float, default=600)
    parser.add_argument("--only-ray-data", action="store_true")
    parser.add_argument(
        "--ray-fake-gpu", action="store_true", help="declare a GPU to Ray for ray.data.llm"
    )
    args = parser.parse_args()
    from tests.llm.tinymodel import build_llm
    from vllm import LLM

    texts = prompts(args.prompts)
    work = Path(tempfile.mkdtemp(prefix="chute-llm-bench-"))
    print(
        f"{args.prompts} prompts, max_tokens {args.max_tokens} (ignore_eos), {os.cpu_count()} CPUs"
    )
    for name in [] if args.only_ray_data else args.models.split(","):
        model_dir = build_llm(work / name, **MODELS[name])
        began = time.perf_counter()
        llm = LLM(model=str(model_dir), **ENGINE)
        load = time.perf_counter() - began
        llm.generate(texts[:8], use_tqdm=False)  # warm up
        best: dict[str, dict[str, float]] = {}
        for round_ in range(args.repeat):
            for variant in VARIANTS:
                out = work / f"{name}-out-{round_}-{len(best)}"
                if variant == "plain":
                    result = plain(llm, texts, args.max_tokens)
                elif variant == "chute":
                    result = chute_run(llm, model_dir, texts, args.max_tokens, out)
                else:
                    result = chute_run(llm, model_dir, texts, args.max_tokens, out, UNIT_ROWS)
                if variant not in best or result["seconds"] < best[variant]["seconds"]:
                    best[variant] = result
        print(f"\n## {name}: model load {load:.1f} s (excluded)\n")
        print("| variant | seconds | generated tokens | tokens/s | × plain | first committed row |")
        print("|---|---:|---:|---:|---:|---:|")
        base = best["plain"]["tokens"] / best["plain"]["seconds"]
        for variant, r in best.items():
            rate = r["tokens"] / r["seconds"]
            first = "-" if r["first_row"] != r["first_row"] else f"{r['first_row']:.2f} s"
            print(
                f"| {variant} | {r['seconds']:.2f} | {r['tokens']:,.0f} | {rate:,.0f} | "
                f"{rate / base:.2f} | {first} |"
            )
        del llm
    if args.ray_data:  # in a child process, with a time limit: it may wait forever for GPUs
        build_llm(work / "ray-tiny")
        code = (
            "import sys; sys.argv = ['x']; from benchmarks.llm import ray_data_llm, prompts; "
            f"print(ray_data_llm({str(work / 'ray-tiny')!r}, prompts({args.prompts}), "
            f"{args.max_tokens}, fake_gpu={args.ray_fake_gpu}))"
        )
        root = Path(__file__).resolve().parents[1]
        try:
            child = subprocess.run(
                [sys.executable, "-c", code],
                cwd=root,
                capture_output=True,
                text=True,
                timeout=args.ray_data_timeout,
            )
            lines = [x for x in child.stdout.splitlines() if x.startswith(("ran:", "failed:"))]
            said = lines[-1] if lines else f"exit {child.returncode}: {child.stderr[-700:]}"
        except subprocess.TimeoutExpired as exc:  # what it said while it waited
            out = exc.stdout if isinstance(exc.stdout, str) else (exc.stdout or b"").decode()
            err = exc.stderr if isinstance(exc.stderr, str) else (exc.stderr or b"").decode()
            hints = [x for x in (out + err).splitlines() if "GPU" in x or "nsufficient" in x]
            said = f"no result in {args.ray_data_timeout:g} s (killed); " + " | ".join(hints[-3:])
        print("\nray.data.llm:", said)


if __name__ == "__main__":
    main()
