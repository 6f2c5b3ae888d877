"""The ``openai`` model type's HTTP behaviour against a local HTTP server that answers as an
OpenAI-compatible one would when overloaded or failing: ``429`` with ``Retry-After``, a
request that hangs past the timeout, a ``400`` for one row, a server that stays down. The
real thing — ``vllm serve`` of the tiny model, killed and restarted mid-job — is in
tests/llm/test_openai_server.py; vLLM cannot be made to answer 429 on demand."""

from __future__ import annotations

import email.utils
import itertools
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("httpx")

import chute
from chute import Model, adapter
from chute.errors import ConfigError, ModelError
from chute.models.llm.server import backoff, retry_after


class Endpoint(ThreadingHTTPServer):
    """``/v1/completions`` that echoes the prompt, and fails as ``plan`` says: a list of
    (status, headers, delay seconds) for the first calls of each prompt."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.plan: dict[str, list[tuple[int, dict[str, str], float]]] = {}
        self.pages: dict[str, list[bytes]] = {}
        """Bodies to send with a 200, instead of an answer, for the first calls of a prompt."""
        self.calls: list[tuple[str, float, dict[str, str]]] = []
        self.missing: set[str] = set()
        """Paths answered 404, as FastAPI answers a route it lacks."""
        self.choices: dict[str, list[str]] = {}
        """The completions to answer a prompt with (``n > 1``), instead of its echo."""
        self.trickle: dict[str, float] = {}
        """Seconds between the bytes of a prompt's first answer."""
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class Handler(BaseHTTPRequestHandler):
    server: Endpoint

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = str(body.get("prompt", body.get("input")))
        usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        with self.server.lock:
            self.server.calls.append((prompt, time.monotonic(), dict(self.headers)))
            plan = self.server.plan.get(prompt) or []
            status, headers, delay = plan.pop(0) if plan else (200, {}, 0.0)
            pages = self.server.pages.get(prompt) or []
            page = pages.pop(0) if pages and status == 200 else None
            trickle = self.server.trickle.pop(prompt, 0.0)
        time.sleep(delay)
        reply: dict[str, Any]
        if self.path in self.server.missing:
            status, reply = 404, {"detail": "Not Found"}
        elif status != 200:
            reply = {"error": {"message": f"refused {prompt}", "type": "x", "code": status}}
        elif self.path.endswith("/embeddings"):
            reply = {"data": [{"index": 0, "embedding": [0.5, 0.25]}], "usage": usage}
        else:
            texts = self.server.choices.get(prompt) or [f"echo {prompt}"]
            choices = [
                {"index": i, "text": t, "finish_reason": "stop"} for i, t in enumerate(texts)
            ]
            reply = {"choices": choices, "usage": usage}
        data = json.dumps(reply).encode() if page is None else page
        try:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            step = 8 if trickle else len(data)  # a slow server: a few bytes at a time
            for i in range(0, len(data), step):
                self.wfile.write(data[i : i + step])
                self.wfile.flush()
                time.sleep(trickle)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout)
            pass


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    server = Endpoint()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def job(endpoint: Endpoint, out: Path, **options: Any) -> chute.Job:
    prompts = [f"p{i}" for i in range(6)]
    pq.write_table(pa.table({"id": range(6), "prompt": prompts}), out.parent / "in.parquet")
    spec = adapter("openai", base_url=endpoint.url, model="tiny", **options)
    return chute.Job(
        source=chute.FileSource(str(out.parent / "in.parquet")),
        models=(Model("gen", spec, inputs=("prompt",)),),
        carryover=("id",),
        output=chute.Sink(str(out)),
        engine="local",
    )


@pytest.mark.timeout(120)
def test_429_is_retried_no_sooner_than_retry_after(endpoint: Endpoint, tmp_path: Path) -> None:
    endpoint.plan["p2"] = [(429, {"Retry-After": "1"}, 0.0), (503, {"Retry-After": "1"}, 0.0)]
    report = job(endpoint, tmp_path / "out", backoff=0.01).run()
    table = pq.read_table(tmp_path / "out").sort_by("id")
    assert table.column("gen_text").to_pylist() == [f"echo p{i}" for i in range(6)]
    assert table.column("gen_error").null_count == 6
    times = [t for prompt, t, _ in endpoint.calls if prompt == "p2"]
    assert len(times) == 3 and all(b - a >= 1.0 for a, b in itertools.pairwise(times))
    counted = report.stages["gen"].counters
    assert counted["retries"] == 2 and counted["requests"] == 6
    assert counted["prompt_tokens"] == 18 and counted["generated_tokens"] == 12


@pytest.mark.timeout(120)
def test_a_request_past_its_timeout_is_tried_again(endpoint: Endpoint, tmp_path: Path) -> None:
    endpoint.plan["p4"] = [(200, {}, 3.0)]  # hangs past the timeout once, then answers
    report = job(endpoint, tmp_path / "out", timeout=0.5, backoff=0.01).run()
    table = pq.read_table(tmp_path / "out").sort_by("id")
    assert table.column("gen_text").to_pylist()[4] == "echo p4"
    assert report.stages["gen"].counters["retries"] == 1


@pytest.mark.timeout(120)
def test_a_400_is_that_rows_error_and_the_key_stays_out_of_the_report(
    endpoint: Endpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHUTE_TEST_KEY", "sk-secret-123")
    endpoint.plan["p1"] = [(400, {}, 0.0)]
    report = job(endpoint, tmp_path / "out", api_key_env="CHUTE_TEST_KEY").run()
    table = pq.read_table(tmp_path / "out").sort_by("id")
    assert table.column("gen_error").to_pylist()[1] == "refused p1"
    assert table.column("gen_text").to_pylist()[1] is None
    assert table.column("gen_error").null_count == 5
    assert report.stages["gen"].counters["error/http_400"] == 1
    assert {h["Authorization"] for _, _, h in endpoint.calls} == {"Bearer sk-secret-123"}
    for path in (tmp_path / "out" / "_chute").rglob("*"):
        if path.is_file():
            assert b"sk-secret-123" not in path.read_bytes(), path


@pytest.mark.timeout(120)
def test_a_server_that_stays_down_stops_the_job_and_a_rerun_resumes(
    endpoint: Endpoint, tmp_path: Path
) -> None:
    endpoint.plan["p3"] = [(503, {}, 0.0)] * 3
    with pytest.raises(ModelError, match=r"kept failing after 3 tries \(HTTP 503"):
        job(endpoint, tmp_path / "out", max_retries=2, backoff=0.01).run()
    report = job(endpoint, tmp_path / "out", max_retries=2, backoff=0.01).run()
    assert report.rows_out + report.rows_skipped == 6
    table = pq.read_table(tmp_path / "out").sort_by("id")
    assert table.column("gen_text").to_pylist() == [f"echo p{i}" for i in range(6)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("status", [401, 403, 404, 307])
def test_a_refusal_no_request_gets_past_stops_the_job_and_a_rerun_answers(
    endpoint: Endpoint, tmp_path: Path, status: int
) -> None:
    """A wrong key (401, 403), a wrong model name or URL (404), a redirect: every request
    would get it, so the job stops at once, naming the status and what to check; no row
    gets it as its answer, and the rerun, once fixed, answers every request."""
    endpoint.plan["p3"] = [(status, {}, 0.0)]
    with pytest.raises(ModelError, match=rf"answered {status} .*Check the API key, the base URL"):
        job(endpoint, tmp_path / "out", backoff=0.01).run()
    assert sum(1 for prompt, *_ in endpoint.calls if prompt == "p3") == 1  # not retried
    job(endpoint, tmp_path / "out", backoff=0.01).run()
    table = pq.read_table(tmp_path / "out").sort_by("id")
    assert table.column("gen_text").to_pylist() == [f"echo p{i}" for i in range(6)]
    assert table.column("gen_error").null_count == 6


@pytest.mark.timeout(120)
def test_a_200_without_an_answer_is_tried_again_and_never_written_as_one(
    endpoint: Endpoint, tmp_path: Path
) -> None:
    """A proxy's page or an empty ``choices`` with status 200 is no answer: tried again
    like a 503; where it persists the job stops, and the rerun answers."""
    endpoint.pages["p2"] = [b"<html>down for maintenance</html>", b'{"choices": []}']
    report = job(endpoint, tmp_path / "out", backoff=0.01).run()
    assert report.stages["gen"].counters["retries"] == 2
    table = pq.read_table(tmp_path / "out").sort_by("id")
    assert table.column("gen_text").to_pylist()[2] == "echo p2"

    endpoint.pages["p5"] = [b'{"object": "list"}'] * 3
    with pytest.raises(ModelError, match=r"kept failing after 3 tries \(HTTP 200 without an"):
        job(endpoint, tmp_path / "again", max_retries=2, backoff=0.01).run()
    job(endpoint, tmp_path / "again", max_retries=2, backoff=0.01).run()
    table = pq.read_table(tmp_path / "again").sort_by("id")
    assert table.column("gen_text").to_pylist() == [f"echo p{i}" for i in range(6)]


def test_the_key_is_never_an_option_and_its_variable_must_be_set(tmp_path: Path) -> None:
    spec = adapter("openai", base_url="http://x/v1", model="m", api_key="sk-1")
    with pytest.raises(ConfigError, match="never put the API key in the job file"):
        spec.check()
    spec = adapter("openai", base_url="http://x/v1", model="m", api_key_env="CHUTE_NO_SUCH_VAR")
    with pytest.raises(ConfigError, match=r"'CHUTE_NO_SUCH_VAR' .* is not set"):
        spec.check()
    with pytest.raises(ConfigError, match="needs base_url"):
        adapter("openai", model="m").check()


def test_retry_after_and_backoff() -> None:
    assert retry_after("2") == 2.0 and retry_after(None) is None and retry_after("x") is None
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= (retry_after(later) or 0) <= 30
    assert backoff(0, 0.5, 3.0) == 3.0  # never sooner than the server asked
    assert all(0 <= backoff(10, 0.5, None) <= 30 for _ in range(100))


def test_concurrency_must_be_at_least_one() -> None:
    with pytest.raises(ConfigError, match="concurrency must be a whole number, at least 1"):
        adapter("openai", base_url="http://x/v1", model="m", concurrency=0).check()


@pytest.mark.timeout(120)
def test_openai_batch_lines_answer_their_own_requests(endpoint: Endpoint, tmp_path: Path) -> None:
    """Without custom_id among the model's inputs, every line was named by its row
    ("row:0") and the run was complete: no answer under its request's custom_id."""
    from chute.sources.openai_batch import OpenAIBatchSource

    path = tmp_path / "requests.jsonl"
    lines = [
        {"custom_id": f"r{i}", "url": "/v1/completions", "body": {"model": "m", "prompt": f"p{i}"}}
        for i in range(4)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    spec = adapter("openai", base_url=endpoint.url, model="tiny")

    def run(inputs: tuple[str, ...], out: str) -> None:
        chute.Job(
            source=OpenAIBatchSource(str(path)),
            models=(Model("gen", spec, inputs=inputs),),
            output=chute.Sink(str(tmp_path / out), "openai-batch"),
            engine="local",
        ).run()

    with pytest.raises(ModelError, match=r"line for request 'r0' names custom_id 'row:"):
        run(("url", "body"), "o1")
    assert not list((tmp_path / "o1").glob("part-*"))
    run(("custom_id", "url", "body"), "o2")
    answered = [json.loads(x) for p in sorted((tmp_path / "o2").glob("part-*")) for x in p.open()]
    assert sorted(a["custom_id"] for a in answered) == ["r0", "r1", "r2", "r3"]


def _batch_file(path: Path, requests: list[tuple[str, str, dict[str, Any]]]) -> Path:
    """An OpenAI Batch input of (custom_id, url, body) requests."""
    lines = [{"custom_id": c, "method": "POST", "url": u, "body": b} for c, u, b in requests]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _batch_job(endpoint: Endpoint, requests: Path, out: Path, **options: Any) -> chute.Job:
    from chute.sources.openai_batch import OpenAIBatchSource

    spec = adapter("openai", base_url=endpoint.url, model="tiny", backoff=0.01, **options)
    return chute.Job(
        source=OpenAIBatchSource(str(requests)),
        models=(Model("gen", spec, inputs=("custom_id", "url", "body")),),
        output=chute.Sink(str(out), "openai-batch"),
        engine="local",
    )


def _answers(out: Path) -> dict[str, dict[str, Any]]:
    lines = [json.loads(x) for p in sorted(out.glob("part-*")) for x in p.open()]
    return {line["custom_id"]: line for line in lines}


@pytest.mark.timeout(120)
def test_line_separators_in_a_reply_or_an_id_are_escaped_not_a_run_that_never_ends(
    endpoint: Endpoint, tmp_path: Path
) -> None:
    """U+2028 and U+2029 are line breaks to ``str.splitlines``: written raw, the answer was
    refused as two lines at every run (exit 4), its request paid for each time."""
    requests = _batch_file(
        tmp_path / "in.jsonl",
        [
            ("a\u2029b", "/v1/completions", {"prompt": "x\u2028y"}),
            ("c", "/v1/completions", {"prompt": "z"}),
        ],
    )
    _batch_job(endpoint, requests, tmp_path / "out").run()
    raw = b"".join(p.read_bytes() for p in sorted((tmp_path / "out").glob("part-*")))
    assert "\u2028".encode() not in raw and b"\\u2028" in raw and b"\\u2029" in raw
    assert len(raw.decode().splitlines()) == 2
    answers = _answers(tmp_path / "out")
    text = answers["a\u2029b"]["response"]["body"]["choices"][0]["text"]
    assert text == "echo x\u2028y"


@pytest.mark.timeout(120)
def test_a_path_the_server_does_not_serve_is_that_requests_error_once_another_answers(
    endpoint: Endpoint, tmp_path: Path
) -> None:
    """A file of chat or completions requests with one ``/v1/embeddings`` request, sent to
    a server that only generates: its 404 stopped the whole batch at every run."""
    endpoint.missing.add("/v1/embeddings")
    mixed = [(f"r{i}", "/v1/completions", {"prompt": f"p{i}"}) for i in range(5)]
    mixed.insert(2, ("e", "/v1/embeddings", {"input": "q"}))
    _batch_job(endpoint, _batch_file(tmp_path / "in.jsonl", mixed), tmp_path / "out").run()
    answers = _answers(tmp_path / "out")
    assert sorted(answers) == ["e", "r0", "r1", "r2", "r3", "r4"]
    assert answers["e"]["response"]["status_code"] == 404
    assert "does not serve that path" in answers["e"]["error"]["message"]
    assert "Not Found" in answers["e"]["error"]["message"]  # FastAPI's own detail
    assert all(answers[f"r{i}"]["error"] is None for i in range(5))
    # where no other path answers (a wrong base URL), the job stops, as before
    alone = _batch_file(tmp_path / "alone.jsonl", [("e", "/v1/embeddings", {"input": "q"})])
    with pytest.raises(ModelError, match=r"answered 404 \(Not Found\).*Check the API key"):
        _batch_job(endpoint, alone, tmp_path / "out2").run()
    assert not list((tmp_path / "out2").glob("part-*"))


@pytest.mark.timeout(120)
def test_timeout_bounds_the_whole_answer_of_a_server_that_sends_bytes_slowly(
    endpoint: Endpoint, tmp_path: Path
) -> None:
    """The client's timeout bounds each wait for bytes: a server sending a few bytes every
    0.2 s held a request with ``timeout: 1`` for as long as its answer took to arrive."""
    endpoint.trickle["p2"] = 0.2  # about 150 bytes: 4 s, once
    report = job(endpoint, tmp_path / "out", timeout=1.0, backoff=0.01).run()
    assert report.stages["gen"].counters["retries"] == 1
    table = pq.read_table(tmp_path / "out").sort_by("id")
    assert table.column("gen_text").to_pylist() == [f"echo p{i}" for i in range(6)]


@pytest.mark.timeout(120)
def test_a_200_of_another_shape_is_tried_again_not_a_crash(
    endpoint: Endpoint, tmp_path: Path
) -> None:
    """``usage`` as a list stopped the job with AttributeError, blaming the model, after
    halving the batch and sending the other requests again."""
    endpoint.pages["p2"] = [
        b'{"choices": [{"index": 0, "text": "x"}], "usage": [1, 2]}',
        b'{"choices": ["x"], "usage": {}}',
        b'{"choices": [{"message": "x"}]}',
    ]
    report = job(endpoint, tmp_path / "out").run()
    assert report.stages["gen"].counters["retries"] == 3
    assert sum(1 for prompt, *_ in endpoint.calls if prompt != "p2") == 5  # each once
    table = pq.read_table(tmp_path / "out").sort_by("id")
    assert table.column("gen_text").to_pylist() == [f"echo p{i}" for i in range(6)]


@pytest.mark.timeout(120)
def test_every_completion_must_hold_the_structure_asked_for(
    endpoint: Endpoint, tmp_path: Path
) -> None:
    """With ``n: 2`` only the first completion was parsed: a second one cut in the middle
    of its JSON was written as an answer (status 200)."""
    endpoint.choices["p1"] = ['{"a": 1}', '{"a": ']
    endpoint.choices["p4"] = ['{"a": 2}', '{"a": 3}']
    structure = {"json": {"type": "object", "properties": {"a": {"type": "integer"}}}}
    job(endpoint, tmp_path / "out", n=2, structured=structure).run()
    table = pq.read_table(tmp_path / "out").sort_by("id")
    errors = table.column("gen_error").to_pylist()
    assert errors[1] is not None and errors[1].startswith("completion 1: ")
    assert errors[4] is None and table.column("gen_value").to_pylist()[4] == {"a": 2}


def test_run_batch_refuses_an_output_that_is_its_input(tmp_path: Path) -> None:
    """The answers, put in place at the end, replaced the requests file without a word."""
    from chute.runbatch import BatchRun, run_batch

    requests = _batch_file(tmp_path / "in.jsonl", [("a", "/v1/completions", {"prompt": "x"})])
    before = requests.read_bytes()
    for output in (str(requests), f"{tmp_path}/./in.jsonl"):
        with pytest.raises(ConfigError, match=r"is the input file .*another file"):
            run_batch(BatchRun(str(requests), output, model=str(tmp_path), options={}))
    assert requests.read_bytes() == before
