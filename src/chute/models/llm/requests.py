"""Rows as LLM requests: a prompt, a chat ``messages`` list, or an OpenAI Batch request.

An adapter's batch holds one of three shapes of input, told apart by its columns:

- a string column: a prompt, sent as it is (``/v1/completions``), or rendered as one user
  message with the model's chat template when ``chat: true`` or a ``system:`` prompt is
  given;
- a list of ``{role, content}`` structs: a chat, rendered with the chat template (the
  ``system:`` prompt first, unless the chat starts with one of its own);
- ``url`` and ``body`` (JSON text) columns, and ``custom_id`` (what the ``openai-batch``
  input format reads): OpenAI Batch requests, each with its own endpoint and parameters.

An optional ``id`` column (``id: <column>``) names each row for its seed. A request that
cannot be made (an unknown url, a body without messages) carries its error and is never
sent to the engine.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from chute.errors import ModelError
from chute.models.base import ROW
from chute.models.llm.structured import Structured, structured

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
URLS = (CHAT, COMPLETIONS, EMBEDDINGS)
OPENAI_COLUMNS = ("custom_id", "url", "body")

# OpenAI body fields that map one to one onto vLLM sampling parameters
_BODY_SAMPLING = (
    "n",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "min_tokens",
    "ignore_eos",
)


@dataclass
class Request:
    """One request, before the engine sees it."""

    identity: str
    """What its seed is derived from: the custom_id, the ``id`` column, or the row."""
    endpoint: str = COMPLETIONS
    prompt: str | None = None
    """Text sent as it is (``/v1/completions``, ``/v1/embeddings``)."""
    messages: list[dict[str, str]] | None = None
    """A chat to render with the model's chat template."""
    sampling: dict[str, Any] = field(default_factory=dict)
    """This request's own sampling parameters (an OpenAI body's), over the job's."""
    structured: Structured | None = None
    """This request's own structure (an OpenAI ``response_format``), over the job's."""
    custom_id: str | None = None
    error: str | None = None
    """Why it cannot be made; it then gets an error line, and the engine never sees it."""


class BadRequest(ValueError):
    """A request body that cannot be served (its line gets status 400)."""


def requests_of(
    batch: pa.Table, chat: bool, system: str | None, id_column: str | None
) -> list[Request]:
    """The batch's rows as requests (see the module's docstring for the shapes)."""
    names = [n for n in batch.column_names if n != ROW]
    if "url" in names and "body" in names:
        return _openai_requests(batch)
    identities = _identities(batch, id_column)
    inputs = [n for n in names if n != id_column]
    if len(inputs) != 1:
        raise ModelError(
            f"an LLM model takes one prompt or messages column (and an id column), got "
            f"{names}: set `inputs: [<prompt column>]`."
        )
    column = batch.column(inputs[0])
    if _is_chat(column.type):
        return [
            _chat_request(identity, messages, system)
            for identity, messages in zip(identities, column.to_pylist(), strict=True)
        ]
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        raise ModelError(
            f"column {inputs[0]!r} is {column.type}: an LLM model takes a string prompt or "
            "a list of {role, content} messages per row."
        )
    if chat or system is not None:
        return [
            _chat_request(identity, None if text is None else [_user(text)], system)
            for identity, text in zip(identities, column.to_pylist(), strict=True)
        ]
    return [
        Request(identity, prompt=text) if text is not None else _missing(identity)
        for identity, text in zip(identities, column.to_pylist(), strict=True)
    ]


def _identities(batch: pa.Table, id_column: str | None) -> list[str]:
    """Each row's name for its seed: the ``id`` column, else its place in the input."""
    if id_column is None:
        if ROW not in batch.column_names:
            return [f"batch-row:{i}" for i in range(batch.num_rows)]
        return [f"row:{key}" for key in batch.column(ROW).to_pylist()]
    if id_column not in batch.column_names:
        raise ModelError(f"the id column {id_column!r} is not among the model's inputs.")
    return [str(v) for v in batch.column(id_column).to_pylist()]


def _is_chat(kind: pa.DataType) -> bool:
    listed = pa.types.is_list(kind) or pa.types.is_large_list(kind)
    return bool(listed and pa.types.is_struct(kind.value_type))


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def _missing(identity: str) -> Request:
    return Request(identity, error="the prompt is null")


def _chat_request(identity: str, messages: Any, system: str | None) -> Request:
    if not messages:
        return Request(identity, CHAT, error="the chat has no messages")
    try:
        chat = [_message(m) for m in messages]
    except BadRequest as exc:
        return Request(identity, CHAT, error=str(exc))
    if system is not None and chat[0]["role"] != "system":
        chat.insert(0, {"role": "system", "content": system})
    return Request(identity, CHAT, messages=chat)


def _message(message: Any) -> dict[str, str]:
    """``{role, content}``; content given as OpenAI's list of text parts is joined."""
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        raise BadRequest(f"a message must be {{role, content}}, got {message!r}")
    content = message.get("content")
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, Mapping)]
        if not all(isinstance(t, str) for t in texts) or len(texts) != len(content):
            raise BadRequest("only text parts ({type: text, text: ...}) are supported")
        content = "".join(t for t in texts if isinstance(t, str))
    if not isinstance(content, str):
        raise BadRequest(f"a message's content must be text, got {content!r}")
    return {"role": message["role"], "content": content}


def _openai_requests(batch: pa.Table) -> list[Request]:
    # Without a custom_id column, a request is named by its row in the input: unique and
    # the same on a resume (a batch's own positions repeat from batch to batch).
    ids = (
        [str(i) for i in batch.column("custom_id").to_pylist()]
        if "custom_id" in batch.column_names
        else _identities(batch, None)
    )
    urls = batch.column("url").to_pylist()
    bodies = batch.column("body").to_pylist()
    out = []
    for custom_id, url, body in zip(ids, urls, bodies, strict=True):
        try:
            request = openai_request(custom_id, url, body)
        except BadRequest as exc:
            request = Request(custom_id, str(url), custom_id=custom_id, error=str(exc))
        out.append(request)
    return out


def openai_request(custom_id: str, url: Any, body_text: Any) -> Request:
    """One OpenAI Batch request; :class:`BadRequest` when it cannot be served."""
    if url not in URLS:
        raise BadRequest(f"unknown url {url!r}: this batch serves {', '.join(URLS)}")
    try:
        body = json.loads(body_text) if isinstance(body_text, str) else None
    except json.JSONDecodeError as exc:
        raise BadRequest(f"the body is not JSON: {exc.msg}") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    request = Request(custom_id, url, custom_id=custom_id)
    if url == CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("a chat completion needs messages: a list of {role, content}")
        request.messages = [_message(m) for m in messages]
    else:
        request.prompt = _single_text(body.get("input" if url == EMBEDDINGS else "prompt"), url)
    try:  # a field of the wrong kind ("top_logprobs": "3x") is this request's 400
        request.sampling = _body_sampling(body, url)
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"the body's sampling fields cannot be read: {exc}") from None
    request.structured = _body_structured(body)
    return request


def _single_text(value: Any, url: str) -> str:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, str):
        what = "input" if url == EMBEDDINGS else "prompt"
        raise BadRequest(f"{url} needs {what}: one string per request, got {value!r}")
    return value


_INTEGERS = ("n", "top_k", "seed", "min_tokens", "max_tokens", "max_completion_tokens")
_NUMBERS = (
    "temperature",
    "top_p",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)
_SERVED = {  # what a body may hold: a field this batch would not honour is the request's 400
    "common": {"model", "user", "metadata", "store", "service_tier", "stream"},
    EMBEDDINGS: {"input", "encoding_format"},
    COMPLETIONS: {"prompt", *_BODY_SAMPLING, "max_tokens", "response_format"},
    CHAT: {"messages", *_BODY_SAMPLING, "max_tokens", "max_completion_tokens"}
    | {"response_format", "structured_outputs"},
}
_SERVED[COMPLETIONS].add("structured_outputs")


def _body_sampling(body: Mapping[str, Any], url: str) -> dict[str, Any]:
    """The body's sampling fields, each checked: a float where vLLM takes an integer
    (``"seed": 1.5``) killed its engine's input thread and hung the run; a field this batch
    would ignore (``tools``, ``echo``, ``logprobs``, ``dimensions``) is refused, never
    answered as if it had been honoured."""
    served = _SERVED["common"] | _SERVED[url]
    unknown = sorted(k for k, v in body.items() if k not in served and not _neutral(k, v))
    if unknown:
        raise BadRequest(
            f"{url} here does not serve {', '.join(repr(k) for k in unknown)} (it would be "
            "ignored): leave it out of the body"
        )
    if body.get("stream"):
        raise BadRequest("a batch request cannot stream: leave out stream or set it false")
    if (body.get("encoding_format") or "float") != "float":
        raise BadRequest("embeddings are returned as floats: encoding_format must be 'float'")
    sampling = {k: body[k] for k in _BODY_SAMPLING if body.get(k) is not None}
    limit = body.get("max_completion_tokens")
    limit = body.get("max_tokens") if limit is None else limit
    if limit is not None:
        sampling["max_tokens"] = limit
    for name in _INTEGERS:
        if name in sampling:
            sampling[name] = _integer(name, sampling[name])
    for name in _NUMBERS:
        if name in sampling and not _is_number(sampling[name]):
            raise BadRequest(f"{name} must be a number, got {sampling[name]!r}")
    if "ignore_eos" in sampling and not isinstance(sampling["ignore_eos"], bool):
        raise BadRequest(f"ignore_eos must be true or false, got {sampling['ignore_eos']!r}")
    if isinstance(sampling.get("stop"), str):
        sampling["stop"] = [sampling["stop"]]
    stop = sampling.get("stop", [])
    if not isinstance(stop, list) or not all(isinstance(t, str) for t in stop):
        raise BadRequest(f"stop must be a string or a list of strings, got {stop!r}")
    if "logit_bias" in sampling:
        sampling["logit_bias"] = _logit_bias(sampling["logit_bias"])
    return sampling


def _neutral(name: str, value: Any) -> bool:
    """A field set to what asks for nothing (``"logprobs": false``, ``"tools": []``,
    ``"best_of": 1``): there is nothing to ignore."""
    if name == "best_of":
        return value in (None, 1)
    if name in ("parallel_tool_calls", "tool_choice", "stream_options"):
        return True  # mean nothing without tools, or without streaming (both refused)
    if name == "top_logprobs":  # without logprobs it asks for nothing
        return value in (None, 0)
    return (
        value is None
        or value is False
        or (not isinstance(value, bool) and value in ([], {}, "none"))
    )


def _integer(name: str, value: Any) -> int:
    """An integer field's value: an integer, or a float that is one (``100.0``, as pandas
    writes it)."""
    if isinstance(value, bool) or not _is_number(value) or value != int(value):
        raise BadRequest(f"{name} must be an integer, got {value!r}")
    return int(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _logit_bias(value: Any) -> dict[int, float]:
    """OpenAI's ``{"50256": -100}`` (token ids as JSON's string keys) as vLLM's int keys."""
    if not isinstance(value, Mapping):
        raise BadRequest(f"logit_bias must map token ids to numbers, got {value!r}")
    bias: dict[int, float] = {}
    for token, amount in value.items():
        if not _is_number(amount) or not str(token).isdigit():
            raise BadRequest(f"logit_bias must map token ids to numbers, got {token!r}: {amount!r}")
        bias[int(token)] = float(amount)
    return bias


def _body_structured(body: Mapping[str, Any]) -> Structured | None:
    """``response_format`` (json_schema, json_object) or vLLM's ``structured_outputs``."""
    try:
        extra = body.get("structured_outputs")
        if extra is not None:
            return structured(extra)
        form = body.get("response_format")
        if not isinstance(form, Mapping) or form.get("type") in (None, "text"):
            return None
        if form["type"] == "json_object":
            return structured({"json": {"type": "object"}})
        schema = (form.get("json_schema") or {}).get("schema")
        if form["type"] == "json_schema" and isinstance(schema, Mapping):
            return structured({"json": schema})
    except Exception as exc:
        raise BadRequest(f"response_format: {exc}") from None
    raise BadRequest(f"response_format {form!r} is not text, json_object or json_schema")


def merged_sampling(job: Mapping[str, Any], request: Request) -> dict[str, Any]:
    """The job's sampling parameters with the request's own over them."""
    return {**job, **request.sampling}
