"""The ``openai`` model type against a real ``vllm serve`` of the tiny model on 127.0.0.1,
started by the test (about 30 s), and killed and restarted in the middle of a job (30 s
more): every row answered once, none in error, the same text as the engine itself."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: scripts/llm-tests runs these")

pytestmark = [pytest.mark.llm]

import httpx  # noqa: E402

from chute import Job, Model, adapter  # noqa: E402
from chute.job import Preprocess, Sink  # noqa: E402
from chute.sources import TableSource  # noqa: E402

PROMPTS = [f"the cat sat {i}" for i in range(24)]


class Server:
    """``python -m vllm.entrypoints.openai.api_server`` of a model directory on a port."""

    def __init__(self, model: Path, port: int, log: Path) -> None:
        self.model, self.port, self.log = model, port, log
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        command = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model), "--served-model-name", "tiny",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--dtype", "bfloat16", "--max-model-len", "256", "--enforce-eager",
        ]  # fmt: skip
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait_ready(self, seconds: float = 240) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            assert self.process is not None and self.process.poll() is None, self.tail()
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"vllm serve did not start in {seconds} s: {self.tail()}")

    def kill(self) -> None:
        """SIGKILL, the server and the engine processes it started."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def server(tiny_llm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("vllm-serve") / "server.log"
    running = Server(tiny_llm, free_port(), log)
    running.start()
    try:
        running.wait_ready()
        yield running
    finally:
        running.kill()


def greedy(llm: Any, prompts: list[str], max_tokens: int) -> list[str]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    return [r.outputs[0].text for r in llm.generate(prompts, params, use_tqdm=False)]


def server_job(
    server: Server,
    tmp_path: Path,
    prompts: list[str],
    preprocess: Preprocess | None = None,
    **options: Any,
) -> Job:
    table = pa.table({"id": range(len(prompts)), "prompt": prompts})
    spec = adapter(
        "openai", base_url=server.url, model="tiny", temperature=0, max_tokens=6, **options
    )
    return Job(
        source=TableSource(table, unit_rows=4),
        models=(Model("gen", spec, inputs=("prompt",), batch_size=4),),
        carryover=("id",),
        output=Sink(str(tmp_path / "out"), "parquet"),
        engine="local",
        preprocess=preprocess,
    )


@pytest.mark.timeout(600)
def test_a_job_through_vllm_serve_equals_the_engine(
    server: Server, shared_llm: Any, tmp_path: Path
) -> None:
    prompts = [*PROMPTS[:8], "dog " * 300]
    report = server_job(server, tmp_path, prompts, concurrency=4).run()
    table = pq.read_table(tmp_path / "out").sort_by("id")
    assert table.column("gen_text").to_pylist()[:8] == greedy(shared_llm, prompts[:8], 6)
    errors = table.column("gen_error").to_pylist()
    assert errors[:8] == [None] * 8 and errors[8] is not None  # too long: the server's 400
    counted = report.stages["gen"].counters
    assert counted["requests"] == 9 and counted["error/prompt_too_long"] == 1
    generated = sum(table.column("gen_completion_tokens").to_pylist())
    assert counted["generated_tokens"] == generated > 0


REACHED, KILLED = threading.Event(), threading.Event()


def gate(batch: pa.Table) -> pa.Table:
    """The second half of the prompts waits until the test has killed the server."""
    if min(batch.column("id").to_pylist()) >= 12:
        REACHED.set()
        KILLED.wait(300)
    return pa.table({"gate": pa.nulls(batch.num_rows, pa.int8())})


@pytest.mark.timeout(600)
def test_the_server_killed_and_restarted_mid_job(
    server: Server, shared_llm: Any, tmp_path: Path
) -> None:
    gated = Preprocess(gate, inputs=("id",))
    job = server_job(
        server,
        tmp_path,
        PROMPTS,
        gated,
        concurrency=2,
        max_retries=10_000,  # the restart may take minutes on a loaded machine
        backoff=0.2,
        backoff_max=1.0,
    )
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["report"] = job.run()
        except BaseException as exc:
            outcome["error"] = exc

    runner = threading.Thread(target=run)
    runner.start()
    assert REACHED.wait(300), "the job never reached its second half"
    server.kill()  # mid-job: the first half may be committed, the second is not yet sent
    KILLED.set()
    server.start()  # the same port: the job's requests fail and retry until it answers
    server.wait_ready()
    runner.join(300)
    assert not runner.is_alive() and "error" not in outcome, outcome.get("error")
    report = outcome["report"]
    table = pq.read_table(tmp_path / "out").sort_by("id")
    assert table.column("id").to_pylist() == list(range(len(PROMPTS)))  # each row once
    assert table.column("gen_error").null_count == len(PROMPTS)
    assert table.column("gen_text").to_pylist() == greedy(shared_llm, PROMPTS, 6)
    assert report.stages["gen"].counters["retries"] >= 1
