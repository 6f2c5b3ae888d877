"""Tokens are the unit of account: the report and the progress line count an LLM job's
requests, prompt and generated tokens, finish reasons and errors by kind, and ``chute
plan`` estimates the prompt tokens from a sample (the tokenizer only, no engine)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: scripts/llm-tests runs these")

pytestmark = [pytest.mark.llm]

from rich.console import Console  # noqa: E402
from tests.llm.conftest import ENGINE  # noqa: E402

from chute import FileSource, Job, Model, adapter  # noqa: E402
from chute.job import Sink  # noqa: E402
from chute.planview import render_plan  # noqa: E402
from chute.runner import run_job  # noqa: E402

PROMPTS = [f"the cat sat on the mat {i} " * (1 + i % 5) for i in range(40)] + ["dog " * 300]


def token_job(model_dir: Path, tmp_path: Path) -> Job:
    pq.write_table(pa.table({"prompt": PROMPTS}), tmp_path / "prompts.parquet")
    spec = adapter("vllm", path=str(model_dir), max_tokens=8, seed=3, **ENGINE)
    return Job(
        source=FileSource(str(tmp_path / "prompts.parquet")),
        models=(Model("gen", spec, inputs=("prompt",)),),
        output=Sink(str(tmp_path / "out"), "parquet"),
        engine="local",
    )


@pytest.mark.timeout(300)
def test_tokens_in_the_report_the_progress_line_and_the_plan(
    use_shared_llm: Any, tiny_llm: Path, tmp_path: Path
) -> None:
    job = token_job(tiny_llm, tmp_path)
    shown = Console(file=io.StringIO(), width=200, record=True)
    shown.print(render_plan(job))
    plan_text = shown.export_text()

    log = io.StringIO()
    report = run_job(job, progress=True, console=Console(file=log, width=200))
    table = pq.read_table(tmp_path / "out")
    counted = report.stages["gen"].counters
    prompt_tokens = sum(n or 0 for n in table.column("gen_prompt_tokens").to_pylist())
    generated = sum(table.column("gen_completion_tokens").to_pylist())
    reasons = [r for r in table.column("gen_finish_reason").to_pylist() if r]
    assert counted["requests"] == len(PROMPTS)
    assert counted["prompt_tokens"] == prompt_tokens > 0
    assert counted["generated_tokens"] == generated > 0
    assert sum(v for k, v in counted.items() if k.startswith("finish/")) == len(reasons)
    assert counted["error/prompt_too_long"] == 1  # the 300-word prompt: its row's error
    text = report.render(width=200)
    assert f"{generated:,} generated tokens (" in text and "prompt_too_long 1" in text
    assert "tokens out" in log.getvalue() and "tok/s" in log.getvalue()

    # the plan's estimate: the sample is the whole input here, so it is the exact count
    # (the too-long prompt included, which the plan also names)
    assert "1 of 41 sampled prompts do not fit max_model_len 256" in plan_text
    too_long = len(use_shared_llm.get_tokenizer().encode(PROMPTS[-1]))
    assert f"prompt tokens ≈ {prompt_tokens + too_long:,} in all" in plan_text
