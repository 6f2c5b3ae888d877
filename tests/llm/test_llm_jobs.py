"""LLM jobs end to end on the real engine: a prompt column on the local engine and on
Ray, ``chute run-batch`` with an OpenAI Batch file, and a run killed and resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: scripts/llm-tests runs these")

pytestmark = [pytest.mark.llm]

from click.testing import CliRunner  # noqa: E402
from tests.llm.conftest import ENGINE  # noqa: E402

from chute import Job, Model, adapter  # noqa: E402
from chute.cli import main  # noqa: E402
from chute.job import Sink  # noqa: E402
from chute.sources import TableSource  # noqa: E402

PROMPTS = [f"the cat sat {i}" for i in range(12)]


def prompt_job(model_dir: Path, output: Path, engine: str) -> Job:
    spec = adapter("vllm", path=str(model_dir), temperature=0, max_tokens=6, **ENGINE)
    table = pa.table({"id": list(range(len(PROMPTS))), "prompt": PROMPTS})
    return Job(
        source=TableSource(table, unit_rows=5),
        models=(Model("gen", spec, inputs=("prompt",)),),
        carryover=("id",),
        output=Sink(str(output), "parquet"),
        engine=engine,
    )


def greedy(llm: Any, prompts: list[str]) -> list[str]:
    from vllm import SamplingParams

    results = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)
    return [r.outputs[0].text for r in results]


@pytest.mark.timeout(300)
def test_prompt_job_on_the_local_engine(
    use_shared_llm: Any, tiny_llm: Path, tmp_path: Path
) -> None:
    report = prompt_job(tiny_llm, tmp_path / "out", "local").run()
    assert report.rows_out == len(PROMPTS)
    table = pq.read_table(tmp_path / "out").sort_by("id")
    assert table.column_names[:2] == ["id", "gen_text"]
    assert table.column("gen_text").to_pylist() == greedy(use_shared_llm, PROMPTS)
    assert table.column("gen_error").null_count == len(PROMPTS)


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_prompt_job_on_ray(
    ray_session: Any, shared_llm: Any, tiny_llm: Path, tmp_path: Path
) -> None:
    """The Ray actor loads its own engine (once) and gives the local engine's text."""
    report = prompt_job(tiny_llm, tmp_path / "out", "ray").run()
    assert report.rows_out == len(PROMPTS)
    table = pq.read_table(tmp_path / "out").sort_by("id")
    assert table.column("gen_text").to_pylist() == greedy(shared_llm, PROMPTS)


def requests_file(path: Path, count: int, extra: bool = True) -> list[str]:
    lines = []
    for i in range(count):
        body: dict[str, Any] = {"max_tokens": 5, "temperature": 1.0}
        if i % 2:
            url, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": f"q{i}"}]
        else:
            url, body["prompt"] = "/v1/completions", f"the dog {i}"
        lines.append({"custom_id": f"req-{i}", "method": "POST", "url": url, "body": body})
    if extra:
        lines.append({"custom_id": "bad-url", "method": "POST", "url": "/v1/x", "body": {}})
        long = {"prompt": "the cat " * 300}
        lines.append({"custom_id": "too-long", "url": "/v1/completions", "body": long})
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
        form = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        chat = [{"role": "user", "content": "json please"}]
        body = {"messages": chat, "response_format": form, "max_tokens": 40}
        lines.append({"custom_id": "json", "url": "/v1/chat/completions", "body": body})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return [line["custom_id"] for line in lines]


def answers(path: Path) -> dict[str, dict[str, Any]]:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    found = {line["custom_id"]: line for line in lines}
    assert len(found) == len(lines), "a request was answered twice"
    return found


def run_batch_args(requests: Path, output: Path, model: Path, *more: str) -> list[str]:
    flags = ["--max-model-len", "256", "--dtype", "bfloat16", "--enforce-eager"]
    return [
        "run-batch",
        "-i",
        str(requests),
        "-o",
        str(output),
        "--model",
        str(model),
        *flags,
        *more,
    ]


@pytest.mark.timeout(300)
def test_run_batch_answers_every_request_once(
    use_shared_llm: Any, tiny_llm: Path, tmp_path: Path
) -> None:
    ids = requests_file(tmp_path / "requests.jsonl", 8)
    out = tmp_path / "results.jsonl"
    args = run_batch_args(tmp_path / "requests.jsonl", out, tiny_llm, "--seed", "5", "-q")
    result = CliRunner().invoke(main, [*args, "--requests-per-unit", "3"])
    assert result.exit_code == 0, result.output
    found = answers(out)
    assert list(found) == ids  # input order, one line each
    ok = found["req-1"]["response"]
    assert ok["status_code"] == 200 and ok["body"]["object"] == "chat.completion"
    assert found["req-0"]["response"]["body"]["choices"][0]["text"]
    assert found["bad-url"]["response"]["status_code"] == 400
    assert "window" in found["too-long"]["error"]["message"]
    reply = found["json"]
    if reply["error"] is None:  # the schema held: the content parses
        content = reply["response"]["body"]["choices"][0]["message"]["content"]
        assert isinstance(json.loads(content)["ok"], bool)
    else:
        assert reply["response"]["status_code"] == 422
    # run again: everything is committed, nothing is generated, the file is the same
    before = out.read_bytes()
    result = CliRunner().invoke(main, [*args, "--requests-per-unit", "3"])
    assert result.exit_code == 0 and out.read_bytes() == before


@pytest.mark.timeout(600)
def test_run_batch_killed_and_resumed(use_shared_llm: Any, tiny_llm: Path, tmp_path: Path) -> None:
    """A run killed after its first commits, resumed: every request answered once, the
    committed parts untouched, and every text the one an uninterrupted run gives."""
    ids = requests_file(tmp_path / "requests.jsonl", 40, extra=False)
    out = tmp_path / "results.jsonl"
    args = run_batch_args(tmp_path / "requests.jsonl", out, tiny_llm, "--seed", "11", "-q")
    # units of 2 requests, one unit per engine call: the units commit one after another
    args += ["--requests-per-unit", "2", "--batch-size", "2", "--engine", "local"]
    child = subprocess.Popen([sys.executable, "-m", "chute", *args], start_new_session=True)
    ledger = Path(f"{out}.chute") / "_chute" / "ledger.jsonl"
    try:
        while child.poll() is None and not (
            ledger.exists() and ledger.read_text().count("\n") >= 2
        ):
            time.sleep(0.05)
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # chute and the vLLM processes it started
        child.wait()
    committed = [json.loads(x) for x in ledger.read_text().splitlines() if x.strip()]
    assert 2 <= len(committed) < 20, "the kill came too late to test a resume"
    parts = {p.name: p.read_bytes() for p in Path(f"{out}.chute").glob("part-*.jsonl")}
    assert not out.exists()

    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    resumed = answers(out)
    assert list(resumed) == ids
    for name, data in parts.items():  # parts of committed units are kept as they were
        path = Path(f"{out}.chute") / name
        if any(name in json.dumps(unit) for unit in committed):
            assert path.read_bytes() == data

    again = tmp_path / "again.jsonl"
    uninterrupted = [*args[:4], str(again), *args[5:]]
    assert CliRunner().invoke(main, uninterrupted).exit_code == 0

    def text(line: dict[str, Any]) -> str:
        choice = line["response"]["body"]["choices"][0]
        return str(choice.get("text", choice.get("message", {}).get("content")))

    assert {k: text(v) for k, v in resumed.items()} == {
        k: text(v) for k, v in answers(again).items()
    }
