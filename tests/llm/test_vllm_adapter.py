"""The vllm adapter on the real engine (vLLM's CPU build, the tiny model): prompts, chats,
sampling, per-request seeds, structured output and per-row errors."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: scripts/llm-tests runs these")

pytestmark = [pytest.mark.llm, pytest.mark.timeout(600)]

from chute.models.base import ROW  # noqa: E402

MESSAGES = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))


def prompts(*texts: str, rows: list[int] | None = None) -> pa.Table:
    table = pa.table({"prompt": pa.array(list(texts), pa.string())})
    keys = rows if rows is not None else list(range(len(texts)))
    return table.append_column(ROW, pa.array(keys, pa.int64()))


def test_greedy_text_equals_plain_vllm(llm_adapter: Any, shared_llm: Any) -> None:
    from vllm import SamplingParams

    adapter = llm_adapter(temperature=0, max_tokens=12, ignore_eos=True)
    texts = ["the cat sat", "hello world", "one two three"]
    out = adapter(prompts(*texts))
    plain = shared_llm.generate(
        texts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    )
    assert out["text"].to_pylist() == [r.outputs[0].text for r in plain]
    assert out["completion_tokens"].to_pylist() == [12, 12, 12]
    assert out["prompt_tokens"].to_pylist() == [len(r.prompt_token_ids) for r in plain]
    assert out["finish_reason"].to_pylist() == ["length"] * 3
    assert out["error"].null_count == 3


def test_seeds_follow_the_row_not_the_batch(llm_adapter: Any) -> None:
    adapter = llm_adapter(temperature=1.0, max_tokens=10, seed=7)
    whole = adapter(prompts("a", "a", "a", rows=[0, 1, 2]))["text"].to_pylist()
    assert len(set(whole)) == 3  # the same prompt, three rows, three seeds
    alone = adapter(prompts("a", rows=[2]))["text"].to_pylist()
    assert alone == whole[2:]  # row 2 redone by itself: the same text
    other = llm_adapter(temperature=1.0, max_tokens=10, seed=8)(prompts("a", rows=[2]))
    assert other["text"].to_pylist() != alone


def test_chat_with_a_system_prompt(llm_adapter: Any, shared_llm: Any) -> None:
    from vllm import SamplingParams

    adapter = llm_adapter(temperature=0, max_tokens=8, system="be brief")
    chat = [[{"role": "user", "content": "hello"}]]
    out = adapter(pa.table({"messages": pa.array(chat, MESSAGES)}))
    rendered = "<|system|>be brief<|end|>\n<|user|>hello<|end|>\n<|assistant|>"
    tokens = shared_llm.get_tokenizer().encode(rendered, add_special_tokens=False)
    plain = shared_llm.generate(
        [{"prompt_token_ids": tokens}], SamplingParams(temperature=0, max_tokens=8)
    )
    assert out["text"].to_pylist() == [plain[0].outputs[0].text]
    assert out["prompt_tokens"].to_pylist() == [len(tokens)]
    as_prompt = adapter(pa.table({"prompt": ["hello"]}))  # a prompt becomes a user message
    assert as_prompt["text"].to_pylist() == out["text"].to_pylist()


@pytest.mark.parametrize(
    ("structure", "kind", "check"),
    [
        pytest.param(
            {"choice": ["yes", "no"]}, pa.string(), lambda v: v in ("yes", "no"), id="choice"
        ),
        pytest.param(
            {"regex": "[0-9]{3}"}, pa.string(), lambda v: len(v) == 3 and v.isdigit(), id="regex"
        ),
        pytest.param(
            {
                "json": {
                    "type": "object",
                    "properties": {"label": {"enum": ["a", "b"]}, "ok": {"type": "boolean"}},
                    "required": ["label", "ok"],
                    "additionalProperties": False,
                }
            },
            pa.struct([("label", pa.string()), ("ok", pa.bool_())]),
            lambda v: v["label"] in ("a", "b") and isinstance(v["ok"], bool),
            id="json-schema",
        ),
    ],
)
def test_structured_output_lands_in_a_typed_column(
    llm_adapter: Any, structure: dict[str, Any], kind: pa.DataType, check: Any
) -> None:
    adapter = llm_adapter(temperature=1.0, max_tokens=64, seed=1, structured=structure)
    out = adapter(prompts("label this", "and this", "and that"))
    assert out["value"].type == kind
    parsed = [
        v
        for v, e in zip(out["value"].to_pylist(), out["error"].to_pylist(), strict=True)
        if e is None
    ]
    assert parsed and all(check(v) for v in parsed)


def test_a_reply_cut_short_is_that_rows_error(llm_adapter: Any) -> None:
    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    adapter = llm_adapter(temperature=1.0, max_tokens=3, seed=1, structured={"json": schema})
    out = adapter(prompts("x", "y"))
    errors = out["error"].to_pylist()
    assert all(e is not None and "cut at max_tokens" in e for e in errors), errors
    assert out["value"].null_count == 2


def test_a_prompt_longer_than_the_window_fails_alone(llm_adapter: Any) -> None:
    adapter = llm_adapter(temperature=0, max_tokens=4)
    out = adapter(prompts("short", "the cat " * 300, "also short"))
    errors = out["error"].to_pylist()
    assert errors[0] is None and errors[2] is None
    assert "window (max_model_len) is 256" in errors[1]
    assert out["text"].to_pylist()[1] is None and out["text"].null_count == 1


def test_n_and_logprobs(llm_adapter: Any) -> None:
    adapter = llm_adapter(temperature=1.0, max_tokens=5, seed=3, n=2, logprobs=0, ignore_eos=True)
    out = adapter(prompts("hi"))
    assert len(out["texts"].to_pylist()[0]) == 2
    assert out["completion_tokens"].to_pylist() == [10]
    assert len(out["logprobs"].to_pylist()[0]) == 5


def openai_table(bodies: dict[str, tuple[str, dict[str, Any]]]) -> pa.Table:
    """OpenAI Batch requests by custom_id: (url, body)."""
    return pa.table(
        {
            "custom_id": list(bodies),
            "url": [u for u, _ in bodies.values()],
            "body": [json.dumps(b) for _, b in bodies.values()],
        }
    )


def test_openai_requests_answer_every_line(llm_adapter: Any) -> None:
    adapter = llm_adapter(temperature=0, max_tokens=6)
    bodies = {
        "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        "comp": ("/v1/completions", {"prompt": "the cat", "max_tokens": 3}),
        "url": ("/v1/nothing", {"prompt": "x"}),
        "body": ("/v1/chat/completions", {"prompt": "no messages"}),
        "emb": ("/v1/embeddings", {"input": "x"}),
    }
    out = adapter(openai_table(bodies))
    lines = {json.loads(x)["custom_id"]: json.loads(x) for x in out["line"].to_pylist()}
    assert list(lines) == list(bodies)
    chat = lines["chat"]["response"]
    assert chat["status_code"] == 200 and lines["chat"]["error"] is None
    assert chat["body"]["object"] == "chat.completion"
    usage = chat["body"]["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert chat["body"]["choices"][0]["message"]["role"] == "assistant"
    comp = lines["comp"]["response"]["body"]
    assert comp["usage"]["completion_tokens"] <= 3 and "text" in comp["choices"][0]
    for bad in ("url", "body", "emb"):
        assert lines[bad]["response"]["status_code"] == 400
        assert lines[bad]["error"]["message"]
    assert out["status_code"].to_pylist() == [200, 200, 400, 400, 400]


def test_openai_requests_vllm_refuses_get_their_own_400_and_the_rest_are_served(
    llm_adapter: Any,
) -> None:
    """One request vLLM's own checks refuse (an empty prompt, a token id it does not have)
    failed the whole call, the run and every resume; a request without max_tokens was
    cut at SamplingParams' 16 tokens, where OpenAI and vLLM's server give the rest of the
    window."""
    adapter = llm_adapter(temperature=0)
    chat = [{"role": "user", "content": "hi"}]
    bodies = {
        "long": ("/v1/completions", {"prompt": "the cat", "min_tokens": 20, "ignore_eos": True}),
        "empty": ("/v1/completions", {"prompt": ""}),
        "vocab": (
            "/v1/completions",
            {"prompt": "a", "max_tokens": 2, "logit_bias": {"9999999": 5}},
        ),
        "whole": ("/v1/completions", {"prompt": "a", "max_tokens": 3.0}),
        "chat": ("/v1/chat/completions", {"messages": chat, "max_tokens": 2, "logprobs": False}),
    }
    out = adapter(openai_table(bodies))
    lines = {json.loads(x)["custom_id"]: json.loads(x) for x in out["line"].to_pylist()}
    assert out["status_code"].to_pylist() == [200, 400, 400, 200, 200]
    long = lines["long"]["response"]["body"]
    assert long["usage"]["completion_tokens"] > 16  # the window's rest, not 16
    assert "empty" in lines["empty"]["error"]["message"]
    assert "logit_bias" in lines["vocab"]["error"]["message"]
    assert lines["whole"]["response"]["body"]["usage"]["completion_tokens"] <= 3
