"""Pooling tasks on vLLM's pooling runner, each on a tiny random model of its kind: ``embed``
(and ``/v1/embeddings`` in ``chute run-batch``) and ``score`` on an embedding
``LlamaModel``, ``classify`` on a ``LlamaForSequenceClassification``. Two engines in all,
each loaded once for the session (about 30 s each on two CPUs)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: scripts/llm-tests runs these")

pytestmark = [pytest.mark.llm]

from click.testing import CliRunner  # noqa: E402
from tests.llm.conftest import ENGINE  # noqa: E402

from chute import Job, Model, adapter  # noqa: E402
from chute.cli import main  # noqa: E402
from chute.job import Resources, Sink  # noqa: E402
from chute.models.base import ReplicaContext  # noqa: E402
from chute.sources import TableSource  # noqa: E402

TEXTS = [f"the cat sat on the mat {i}" for i in range(10)]
LONG = "dog " * 300


def _load(directory: Path, task: str) -> Any:
    from chute.models.llm.engine import load_llm

    return load_llm(str(directory), ENGINE, ReplicaContext("pool", Resources()), task)


@pytest.fixture(scope="session")
def embed_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any]]:
    from tests.llm.tinymodel import build_pooling

    directory = build_pooling(tmp_path_factory.mktemp("tiny-embed"), "embed")
    yield directory, _load(directory, "embed")


@pytest.fixture(scope="session")
def classify_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any]]:
    from tests.llm.tinymodel import build_pooling

    directory = build_pooling(tmp_path_factory.mktemp("tiny-classify"), "classify", labels=3)
    yield directory, _load(directory, "classify")


def _use(monkeypatch: pytest.MonkeyPatch, llm: Any) -> None:
    """Jobs in this process get the session's engine (the adapter still checks its options)."""
    import chute.models.llm as llm_module

    monkeypatch.setattr(llm_module, "load_llm", lambda *args, **kwargs: llm)


def _job(directory: Path, table: pa.Table, inputs: tuple[str, ...], out: Path, task: str) -> Job:
    spec = adapter("vllm", path=str(directory), task=task, **ENGINE)
    return Job(
        source=TableSource(table, unit_rows=4),
        models=(Model("m", spec, inputs=inputs),),
        carryover=("id",),
        output=Sink(str(out), "parquet"),
        engine="local",
    )


def close(got: Any, expected: Any) -> None:
    """Equal to bfloat16's precision (a batch of other rows may round a little apart)."""
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-2)


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


@pytest.mark.timeout(300)
def test_embed_job_equals_plain_llm_embed(
    monkeypatch: pytest.MonkeyPatch, embed_model: tuple[Path, Any], tmp_path: Path
) -> None:
    directory, llm = embed_model
    _use(monkeypatch, llm)
    table = pa.table({"id": list(range(11)), "text": [*TEXTS, LONG]})
    report = _job(directory, table, ("text",), tmp_path / "out", "embed").run()
    out = pq.read_table(tmp_path / "out").sort_by("id")
    plain = [list(r.outputs.embedding) for r in llm.embed(TEXTS, use_tqdm=False)]
    got = out.column("m_embedding").to_pylist()
    assert len(got[0]) == 128
    close(got[:10], plain)
    assert got[10] is None and "window" in out.column("m_error")[10].as_py()
    counted = report.stages["m"].counters
    assert counted["requests"] == 11 and counted["error/prompt_too_long"] == 1
    assert counted["prompt_tokens"] == sum(out.column("m_prompt_tokens").to_pylist()[:10])


@pytest.mark.timeout(300)
def test_score_job_is_the_cosine_of_the_embeddings(
    monkeypatch: pytest.MonkeyPatch, embed_model: tuple[Path, Any], tmp_path: Path
) -> None:
    directory, llm = embed_model
    _use(monkeypatch, llm)
    documents = [f"a dog ran {i}" for i in range(len(TEXTS))]
    table = pa.table({"id": list(range(11)), "q": [*TEXTS, LONG], "d": [*documents, LONG]})
    _job(directory, table, ("q", "d"), tmp_path / "out", "score").run()
    out = pq.read_table(tmp_path / "out").sort_by("id")
    scores = out.column("m_score").to_pylist()
    plain = [r.outputs.score for r in llm.score(TEXTS, documents, use_tqdm=False)]
    close(scores[:10], plain)
    vectors = [list(r.outputs.embedding) for r in llm.embed([*TEXTS, *documents], use_tqdm=False)]
    cosines = [_cosine(vectors[i], vectors[10 + i]) for i in range(10)]
    close(scores[:10], cosines)
    assert scores[10] is None and "window" in out.column("m_error")[10].as_py()


@pytest.mark.timeout(300)
def test_classify_job_gives_probabilities_and_labels(
    monkeypatch: pytest.MonkeyPatch, classify_model: tuple[Path, Any], tmp_path: Path
) -> None:
    directory, llm = classify_model
    _use(monkeypatch, llm)
    table = pa.table({"id": list(range(11)), "text": [*TEXTS, LONG]})
    report = _job(directory, table, ("text",), tmp_path / "out", "classify").run()
    out = pq.read_table(tmp_path / "out").sort_by("id")
    probs = out.column("m_probs").to_pylist()
    plain = [list(r.outputs.probs) for r in llm.classify(TEXTS, use_tqdm=False)]
    close(probs[:10], plain)
    assert all(sum(p) == pytest.approx(1.0, abs=1e-3) and len(p) == 3 for p in probs[:10])
    labels = out.column("m_label").to_pylist()
    assert labels[:10] == [f"label{p.index(max(p))}" for p in probs[:10]]
    assert labels[10] is None and "window" in out.column("m_error")[10].as_py()
    assert report.stages["m"].counters["requests"] == 11


@pytest.mark.timeout(300)
def test_run_batch_serves_embeddings_requests(
    monkeypatch: pytest.MonkeyPatch, embed_model: tuple[Path, Any], tmp_path: Path
) -> None:
    """A file of /v1/embeddings requests is served by the pooling runner: OpenAI bodies
    (data[0].embedding, usage), and a chat request in it gets its own 400 line."""
    directory, llm = embed_model
    _use(monkeypatch, llm)
    lines = [
        {"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings", "body": {"input": t}}
        for i, t in enumerate(TEXTS[:5])
    ]
    requests = tmp_path / "requests.jsonl"
    requests.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "results.jsonl"
    args = ["run-batch", "-i", str(requests), "-o", str(out), "--model", str(directory), "-q"]
    result = CliRunner().invoke(main, [*args, "--max-model-len", "256", "--enforce-eager"])
    assert result.exit_code == 0, result.output
    answers = [json.loads(x) for x in out.read_text().splitlines()]
    assert [a["custom_id"] for a in answers] == [f"e{i}" for i in range(5)]
    plain = [list(r.outputs.embedding) for r in llm.embed(TEXTS[:5], use_tqdm=False)]
    for answer, vector in zip(answers, plain, strict=True):
        body = answer["response"]["body"]
        assert answer["response"]["status_code"] == 200 and body["object"] == "list"
        close(body["data"][0]["embedding"], vector)
        assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0

    mixed = tmp_path / "mixed.jsonl"
    chat = {"custom_id": "c", "url": "/v1/chat/completions", "body": {"messages": []}}
    # a completion was answered 200 with an embedding
    completion = {"custom_id": "p", "url": "/v1/completions", "body": {"prompt": "x"}}
    mixed.write_text(requests.read_text() + json.dumps(chat) + "\n" + json.dumps(completion) + "\n")
    args = ["run-batch", "-i", str(mixed), "-o", str(tmp_path / "m.jsonl"), "--model"]
    result = CliRunner().invoke(main, [*args, str(directory), "--task", "embed", "-q"])
    assert result.exit_code == 0, result.output
    last = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()[-2:]]
    assert [x["custom_id"] for x in last] == ["c", "p"]
    assert all(x["response"]["status_code"] == 400 for x in last)
