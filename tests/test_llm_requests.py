"""The LLM pieces that need no engine: structured output parsing, OpenAI Batch requests
and lines, per-request seeds, and the openai-batch source's refusals (vLLM's own tests
are in tests/llm)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from chute.cli import main
from chute.errors import ConfigError, DataError, ModelError
from chute.models.base import ROW
from chute.models.llm.requests import openai_request, requests_of
from chute.models.llm.responses import Outcome, line
from chute.models.llm.sampling import request_seed
from chute.models.llm.structured import structured
from chute.sources.openai_batch import OpenAIBatchSource

SCHEMA = {
    "type": "object",
    "properties": {"label": {"enum": ["a", "b"]}, "n": {"type": "integer"}},
    "required": ["label"],
}


def test_a_json_schema_makes_a_typed_column() -> None:
    spec = structured({"json": SCHEMA})
    assert spec is not None
    assert spec.arrow_type() == pa.struct([("label", pa.string()), ("n", pa.int64())])
    assert spec.parse('{"label": "a", "n": 3}') == {"label": "a", "n": 3}
    for bad, why in [('{"label": "c"}', "not one of"), ('{"n": 1}', "requires"), ("{", "not JSON")]:
        with pytest.raises(ValueError, match=why):
            spec.parse(bad)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param({"json": SCHEMA, "regex": "x"}, id="two-kinds"),
        pytest.param({"grammar": "x"}, id="unknown-kind"),
        pytest.param({"regex": "("}, id="bad-regex"),
        pytest.param({"choice": []}, id="no-choices"),
    ],
)
def test_bad_structure_is_refused_before_loading(value: object) -> None:
    with pytest.raises(ConfigError, match="structured"):
        structured(value)


def test_seeds_depend_on_the_job_seed_and_the_request_only() -> None:
    assert request_seed(1, "a") == request_seed(1, "a")
    assert len({request_seed(1, f"r{i}") for i in range(100)}) == 100
    assert request_seed(1, "a") != request_seed(2, "a")


def test_openai_bodies_become_requests() -> None:
    body = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "max_completion_tokens": 7,
        "stop": "x",
        "response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}},
    }
    request = openai_request("c1", "/v1/chat/completions", json.dumps(body))
    assert request.messages == [{"role": "user", "content": "hi"}]
    assert request.sampling == {"max_tokens": 7, "stop": ["x"]}
    assert request.structured is not None and request.structured.kind == "json"


def test_bad_requests_get_an_error_line_each() -> None:
    batch = pa.table(
        {
            "custom_id": ["u", "b", "m"],
            "url": ["/v1/nope", "/v1/completions", "/v1/chat/completions"],
            "body": ["{}", "not json", '{"messages": []}'],
        }
    )
    requests = requests_of(batch, chat=False, system=None, id_column=None)
    errors = [r.error for r in requests]
    assert all(errors) and "unknown url" in str(errors[0]) and "not JSON" in str(errors[1])
    lines = [json.loads(line(r, Outcome(error=r.error, status=400), "m")) for r in requests]
    assert [x["custom_id"] for x in lines] == ["u", "b", "m"]
    assert all(x["response"]["status_code"] == 400 and x["error"]["message"] for x in lines)
    assert lines[0]["id"] == json.loads(line(requests[0], Outcome(), "m"))["id"]  # stable


def test_a_body_field_of_the_wrong_kind_is_that_requests_400() -> None:
    """``"top_logprobs": "3x"`` made int() raise for the whole batch: the job stopped
    on it, every resume the same way, and under quarantine the request had no line; a
    float where vLLM takes an integer (``"seed": 1.5``) killed its engine's input thread
    and hung the run for good."""
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    bodies = {
        "text": {**chat, "top_k": "3x"},
        "seed": {**chat, "seed": 1.5},
        "bool": {**chat, "max_tokens": True},
        "temp": {**chat, "temperature": "hot"},
        "stop": {**chat, "stop": [1]},
        "bias": {**chat, "logit_bias": {"a": 1}},
        "good": {**chat, "max_tokens": 100.0, "seed": 7, "stop": "x", "logit_bias": {"50": 5}},
    }
    batch = pa.table(
        {
            "custom_id": list(bodies),
            "url": ["/v1/chat/completions"] * len(bodies),
            "body": [json.dumps(b) for b in bodies.values()],
        }
    )
    requests = {r.custom_id: r for r in requests_of(batch, chat=False, system=None, id_column=None)}
    for name in ("text", "seed", "bool", "temp", "stop", "bias"):
        assert requests[name].error is not None, name
    assert "seed must be an integer, got 1.5" in str(requests["seed"].error)
    good = requests["good"]
    assert good.error is None
    assert good.sampling == {"max_tokens": 100, "seed": 7, "stop": ["x"], "logit_bias": {50: 5.0}}
    assert isinstance(good.sampling["max_tokens"], int)


@pytest.mark.parametrize(
    ("url", "extra", "why"),
    [
        ("/v1/chat/completions", {"tools": [{"type": "function"}]}, "'tools'"),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 2}, "'logprobs'"),
        ("/v1/completions", {"echo": True, "suffix": "x"}, "'echo', 'suffix'"),
        ("/v1/completions", {"best_of": 3}, "'best_of'"),
        ("/v1/embeddings", {"dimensions": 4}, "'dimensions'"),
        ("/v1/embeddings", {"encoding_format": "base64"}, "as floats"),
        ("/v1/completions", {"stream": True}, "cannot stream"),
    ],
)
def test_a_field_the_batch_would_ignore_is_that_requests_400(
    url: str, extra: dict[str, object], why: str
) -> None:
    """They were answered 200 as if honoured: logprobs computed and written as null,
    embeddings of the model's width whatever ``dimensions`` said."""
    if url == "/v1/chat/completions":
        body: dict[str, object] = {"messages": [{"role": "user", "content": "hi"}]}
    else:
        body = {"input": "x"} if url == "/v1/embeddings" else {"prompt": "x"}

    def error(fields: dict[str, object]) -> str | None:
        table = pa.table({"custom_id": ["r"], "url": [url], "body": [json.dumps(fields)]})
        return requests_of(table, chat=False, system=None, id_column=None)[0].error

    assert why in str(error({**body, **extra}))
    neutral = {"logprobs": False, "tools": [], "best_of": 1, "stream": False, "model": "gpt-4o"}
    neutral |= {"encoding_format": None, "tool_choice": "auto", "stream_options": None}
    assert error({**body, **neutral}) is None


def test_max_tokens_beside_a_null_max_completion_tokens_counts() -> None:
    body = json.dumps({"prompt": "x", "max_tokens": 50, "max_completion_tokens": None})
    assert openai_request("r", "/v1/completions", body).sampling == {"max_tokens": 50}


def test_requests_without_a_custom_id_are_named_by_their_row_not_their_place() -> None:
    """Without a custom_id column each request is named by its row of the input: two
    batches never give two requests one name (before: ``row-0`` in every batch)."""
    body = json.dumps({"prompt": "x"})

    def batch(rows: list[int]) -> pa.Table:
        return pa.table(
            {ROW: rows, "url": ["/v1/completions"] * len(rows), "body": [body] * len(rows)}
        )

    named = [
        r.custom_id
        for b in (batch([0, 1]), batch([2, 3]))
        for r in requests_of(b, False, None, None)
    ]
    assert len(set(named)) == 4
    again = [r.custom_id for r in requests_of(batch([2, 3]), False, None, None)]
    assert again == named[2:]  # the same on a resume


def test_a_line_separator_inside_a_request_is_not_a_new_line(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    body = {"prompt": "one\u2028two\u2029three\x85four"}
    text = json.dumps(
        {"custom_id": "a", "url": "/v1/completions", "body": body}, ensure_ascii=False
    )
    path.write_text(text + "\n", encoding="utf-8")
    (row,) = OpenAIBatchSource(str(path)).table.to_pylist()
    assert row["custom_id"] == "a" and json.loads(row["body"]) == body


def test_a_dead_vllm_engine_stops_the_job_and_an_errored_request_is_no_answer() -> None:
    """vLLM's ``EngineDeadError`` becomes a ModelError (which a model stage never bisects
    or quarantines: before, every row left was quarantined as if it had failed and the run
    succeeded); a request vLLM ended with ``finish_reason: error`` gets a 500 line, not a
    200 with whatever text it had."""
    from types import SimpleNamespace

    from chute.errors import ModelError
    from chute.models.llm.engine import _fill, engine_alive

    class EngineDeadError(Exception):  # vLLM's, by name (vllm.v1.engine.exceptions)
        pass

    with pytest.raises(ModelError, match="vLLM's engine died"), engine_alive():
        raise EngineDeadError("EngineCore encountered an issue")
    with pytest.raises(KeyError), engine_alive():  # anything else is left as it is
        raise KeyError("x")

    def result(reason: str) -> SimpleNamespace:
        done = SimpleNamespace(text="hal", token_ids=[1, 2], finish_reason=reason, logprobs=None)
        return SimpleNamespace(outputs=[done])

    failed, fine = Outcome(), Outcome()
    _fill(failed, result("error"), None)
    _fill(fine, result("stop"), None)
    assert failed.error and failed.status == 500 and fine.error is None
    request = openai_request("c", "/v1/completions", json.dumps({"prompt": "x"}))
    assert json.loads(line(request, failed, "m"))["response"]["status_code"] == 500


def test_a_repeated_custom_id_is_refused_before_any_compute(tmp_path: Path) -> None:
    lines = [{"custom_id": c, "url": "/v1/completions", "body": {"prompt": "x"}} for c in "aba"]
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(DataError, match=r"'a' \(lines 1, 3\)"):
        OpenAIBatchSource(str(path))
    out = tmp_path / "results.jsonl"
    args = ["run-batch", "-i", str(path), "-o", str(out), "--model", str(tmp_path)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 3 and "repeat" in result.output  # bad data, not a bad job
    assert not out.exists() and not (tmp_path / "results.jsonl.chute").exists()
    first, second = tmp_path / "one" / "a.jsonl", tmp_path / "one" / "b.jsonl"
    first.parent.mkdir()
    first.write_text("".join(json.dumps({**lines[0], "custom_id": c}) + "\n" for c in "ab"))
    second.write_text("".join(json.dumps({**lines[0], "custom_id": c}) + "\n" for c in "cb"))
    with pytest.raises(DataError, match=r"'b' \(.*a\.jsonl line 2, .*b\.jsonl line 2\)"):
        OpenAIBatchSource([str(first), str(second)])


def test_a_folder_or_a_glob_of_batch_files_is_read_as_any_input_is(tmp_path: Path) -> None:
    """A folder was 'is a directory'; a glob 'does not exist: check the path'."""
    folder = tmp_path / "batch"
    folder.mkdir()
    for name, ids in (("b.jsonl", "cd"), ("a.jsonl", "ab"), (".hidden.jsonl", "x")):
        text = "".join(
            json.dumps({"custom_id": c, "url": "/v1/completions", "body": {}}) + "\n" for c in ids
        )
        (folder / name).write_text(text)
    for path in (str(folder), str(folder / "*.jsonl")):
        source = OpenAIBatchSource(path)
        assert source.table.column("custom_id").to_pylist() == ["a", "b", "c", "d"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b'{"custom_id": 1, "url": "/v1/completions"}', r"custom_id 1, a int: a custom_id is a"),
        (b'{"custom_id": "a", "method": "GET"}', r"method 'GET': batch requests are POST"),
        (b'{"custom_id": "\\ud800"}', r"lone surrogate escape"),
        (b'{"custom_id": "a", "body": {"prompt": "\\udfff"}}', r"lone surrogate escape"),
        (b'{"custom_id": "a", "url": "/v1/\\ud800"}', r"lone surrogate escape"),
        (b'{"custom_id": "\xff"}', r"line 2 is not UTF-8 text \(byte 16 of the line\)"),
    ],
    ids=["number-id", "get", "surrogate-id", "surrogate-body", "surrogate-url", "not-utf8"],
)
def test_a_bad_batch_line_is_named_with_what_to_fix(
    tmp_path: Path, line: bytes, message: str
) -> None:
    """A numeric custom_id was 'has no custom_id'; a lone surrogate a bare codec error,
    naming no file nor line, with exit 2; GET was answered as if POST."""
    path = tmp_path / "requests.jsonl"
    path.write_bytes(b'{"custom_id": "z", "url": "/v1/completions", "body": {}}\n' + line + b"\n")
    with pytest.raises(DataError, match=rf"requests\.jsonl, line 2 .*{message}|{message}"):
        OpenAIBatchSource(str(path))


def test_a_line_without_custom_id_is_named(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text('{"custom_id": "a", "url": "/v1/completions", "body": {}}\n{"url": 1}\n')
    with pytest.raises(DataError, match="line 2 has no custom_id"):
        OpenAIBatchSource(str(path))


def test_an_openai_batch_output_refuses_quarantine(tmp_path: Path) -> None:
    """A quarantined request went to _errors/ and had no line in the output, while the run
    succeeded: a request left unanswered."""
    import chute

    path = tmp_path / "requests.jsonl"
    path.write_text(json.dumps({"custom_id": "a", "url": "/v1/completions", "body": {}}) + "\n")
    job = chute.Job(
        source=OpenAIBatchSource(str(path)),
        models=(chute.Model("llm", lambda b: {"line": b["custom_id"]}, on_error="quarantine"),),
        output=chute.Sink(str(tmp_path / "out"), "openai-batch"),
        engine="local",
    )
    with pytest.raises(ConfigError, match="on_error: quarantine, but an openai-batch output"):
        job.run()
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "answer",
    [
        None,
        "answered",
        '{"id": "x"}',
        '{"custom_id": "a",\n"response": null}',
        '{"custom_id": "a",\r"response": null}',
    ],
    ids=["null", "not-json", "no-custom-id", "two-lines", "a-carriage-return"],
)
def test_an_openai_batch_output_takes_only_batch_lines(tmp_path: Path, answer: Any) -> None:
    """A model of the user's own gave the line column: None was written as 'None', text
    with a newline as two lines, any text as an answer; the run reported success."""
    import chute

    path = tmp_path / "requests.jsonl"
    path.write_text(json.dumps({"custom_id": "a", "url": "/v1/completions", "body": {}}) + "\n")
    job = chute.Job(
        source=OpenAIBatchSource(str(path)),
        models=(chute.Model("llm", lambda b: {"line": [answer] * b.num_rows}),),
        output=chute.Sink(str(tmp_path / "out"), "openai-batch"),
        engine="local",
    )
    with pytest.raises(ModelError, match=r"each must be one JSON object with its \"custom_id\""):
        job.run()
    good = json.dumps({"custom_id": "a", "response": None, "error": None})
    job = dataclasses.replace(
        job, models=(chute.Model("llm", lambda b: {"line": [good] * b.num_rows}),)
    )
    job.run()
    assert (tmp_path / "out").is_dir()


def test_an_openai_batch_output_line_must_answer_its_own_rows_request(tmp_path: Path) -> None:
    """A model of the user's own that answered its batch in another order wrote each
    answer under another request's custom_id, and the run was complete."""
    import chute

    path = tmp_path / "requests.jsonl"
    path.write_text(
        "".join(
            json.dumps({"custom_id": f"r{i}", "url": "/v1/completions", "body": {}}) + "\n"
            for i in range(5)
        )
    )

    def reversed_lines(batch: pa.Table) -> dict[str, list[str]]:
        ids = batch.column("custom_id").to_pylist()[::-1]
        return {"line": [json.dumps({"custom_id": c, "response": None}) for c in ids]}

    job = chute.Job(
        source=OpenAIBatchSource(str(path)),
        models=(chute.Model("llm", reversed_lines, inputs=("custom_id", "url", "body")),),
        output=chute.Sink(str(tmp_path / "out"), "openai-batch"),
        engine="local",
    )
    with pytest.raises(ModelError, match="line for request 'r0' names custom_id 'r4'"):
        job.run()
    assert not list((tmp_path / "out").glob("part-*"))
    # ids a CSV reads as numbers: the adapters name each line by the id's text
    pq.write_table(pa.table({"custom_id": [0, 1], "url": ["u", "u"]}), tmp_path / "n.parquet")

    def named(batch: pa.Table) -> dict[str, list[str]]:
        ids = batch.column("custom_id").to_pylist()
        return {"line": [json.dumps({"custom_id": str(c), "response": None}) for c in ids]}

    chute.Job(
        source=chute.FileSource(str(tmp_path / "n.parquet")),
        models=(chute.Model("llm", named, inputs=("custom_id", "url")),),
        output=chute.Sink(str(tmp_path / "numbers"), "openai-batch"),
        engine="local",
    ).run()


def test_the_single_file_is_assembled_in_input_order_past_a_million_units(
    tmp_path: Path,
) -> None:
    """Names sorted as text put part-1000000 before part-999999; a seven-digit unit was not
    taken for a part at all. The count is checked before anything is put in place."""
    from chute.errors import JobStateError
    from chute.runbatch import assemble

    parts = tmp_path / "parts"
    parts.mkdir()
    for unit, lines in ((1_000_000, "c\nd\n"), (999_999, "a\nb\n"), (2, "0\n")):
        (parts / f"part-{unit:06d}-0000000000-0123abcd.jsonl").write_text(lines)
    (parts / "notes.jsonl").write_text("not a part\n")
    assemble(str(parts), str(tmp_path / "out.jsonl"), 5)
    assert (tmp_path / "out.jsonl").read_text() == "0\na\nb\nc\nd\n"
    with pytest.raises(JobStateError, match="5 answer lines for 6 requests"):
        assemble(str(parts), str(tmp_path / "short.jsonl"), 6)
    assert not (tmp_path / "short.jsonl").exists()


def test_a_reply_that_does_not_parse_keeps_its_text_and_its_own_code() -> None:
    """A structured reply cut at max_tokens was a 422 with no text (its tokens were spent
    all the same), and every status but 400 was labelled unparsed_reply."""
    request = openai_request("r", "/v1/completions", json.dumps({"prompt": "x"}))
    cut = Outcome(texts=['{"label": "a'], finish_reasons=["length"], completion_tokens=4)
    cut.fail("not JSON (cut at max_tokens)", 422, "unparsed")
    answer = json.loads(line(request, cut, "m"))
    assert answer["error"]["code"] == "unparsed"
    assert answer["response"]["body"]["choices"][0]["text"] == '{"label": "a'
    assert answer["response"]["body"]["usage"]["completion_tokens"] == 4
    ended = Outcome()
    ended.fail("vLLM ended the request with an error", 500, "engine_error")
    assert json.loads(line(request, ended, "m"))["error"]["code"] == "engine_error"
