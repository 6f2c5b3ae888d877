"""What an LLM request gives back: an :class:`Outcome` per request, and the same as the
bodies and lines of the OpenAI Batch output format.

An output line is ``{id, custom_id, response: {status_code, request_id, body}, error}``,
the body that of the OpenAI API (``choices``, ``usage``). A request that failed gets a line
too: its status (400 for a request that cannot be served, 422 for a reply that does not
have the requested structure), ``error: {code, message}``, and the error in ``body``.
The ids are derived from the ``custom_id``, so a redone request gets the same line.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from chute.models.llm.requests import CHAT, EMBEDDINGS, Request

if TYPE_CHECKING:
    from chute.models.llm.structured import Structured

BAD_REQUEST = 400
UNPARSED = 422


@dataclass
class Outcome:
    """What one request gave: its completions, tokens, parsed value, or its error."""

    texts: list[str] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    value: Any = None
    """The reply parsed into the structure (``None`` without one)."""
    logprobs: list[float] | None = None
    """The sampled tokens' log-probabilities of the first completion, when asked for."""
    embedding: list[float] | None = None
    error: str | None = None
    status: int = 200
    kind: str = ""
    """What kind of error (``bad_request``, ``prompt_too_long``, ``unparsed``, ...)."""
    created: int = 0

    def fail(self, error: str, status: int, kind: str) -> None:
        self.error, self.status, self.kind = error, status, kind

    @property
    def finish_reason(self) -> str | None:
        return self.finish_reasons[0] if self.finish_reasons else None


def parse_replies(outcome: Outcome, structure: Structured) -> None:
    """The reply parsed into the structure asked for: its value, the first completion's;
    a completion that does not hold the structure (``n > 1``: any of them) fails the
    request (422), naming which."""
    for i, text in enumerate(outcome.texts):
        try:
            value = structure.parse(text)
        except ValueError as exc:
            reasons = outcome.finish_reasons
            cut = " (cut at max_tokens)" if i < len(reasons) and reasons[i] == "length" else ""
            which = f"completion {i}: " if len(outcome.texts) > 1 else ""
            outcome.fail(f"{which}{exc}{cut}", UNPARSED, "unparsed")
            return
        if i == 0:
            outcome.value = value


def short_id(*parts: str) -> str:
    """A stable hex id for a request's output line."""
    return hashlib.blake2b("\x00".join(parts).encode(), digest_size=12).hexdigest()


def body(request: Request, outcome: Outcome, model: str) -> dict[str, Any]:
    """The OpenAI response body of a request that was answered."""
    rid = short_id("response", request.identity)
    usage = {
        "prompt_tokens": outcome.prompt_tokens or 0,
        "completion_tokens": outcome.completion_tokens,
        "total_tokens": (outcome.prompt_tokens or 0) + outcome.completion_tokens,
    }
    if request.endpoint == EMBEDDINGS:
        data = [{"object": "embedding", "index": 0, "embedding": outcome.embedding}]
        usage.pop("completion_tokens")
        usage["total_tokens"] = usage["prompt_tokens"]
        return {"object": "list", "data": data, "model": model, "usage": usage}
    choices = [
        _choice(request, i, text, reason)
        for i, (text, reason) in enumerate(zip(outcome.texts, outcome.finish_reasons, strict=True))
    ]
    chat = request.endpoint == CHAT
    return {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{rid}",
        "object": "chat.completion" if chat else "text_completion",
        "created": outcome.created,
        "model": model,
        "choices": choices,
        "usage": usage,
    }


def _choice(request: Request, index: int, text: str, reason: str) -> dict[str, Any]:
    if request.endpoint == CHAT:
        message = {"role": "assistant", "content": text}
        return {"index": index, "message": message, "logprobs": None, "finish_reason": reason}
    return {"index": index, "text": text, "logprobs": None, "finish_reason": reason}


def line(request: Request, outcome: Outcome, model: str) -> str:
    """The request's OpenAI Batch output line (JSON, no newline)."""
    custom_id = request.custom_id if request.custom_id is not None else request.identity
    error = None
    response_body: dict[str, Any]
    if outcome.error is not None:
        code = "invalid_request" if outcome.status == BAD_REQUEST else outcome.kind or "error"
        error = {"code": code, "message": outcome.error}
        response_body = {"error": {"message": outcome.error, "type": code, "code": code}}
        if outcome.texts and request.endpoint != EMBEDDINGS:  # what was generated is kept
            response_body = {**body(request, outcome, model), **response_body}
    else:
        response_body = body(request, outcome, model)
    return one_line(
        {
            "id": f"batch_req_{short_id('line', custom_id)}",
            "custom_id": custom_id,
            "response": {
                "status_code": outcome.status,
                "request_id": f"req_{short_id('request', custom_id)}",
                "body": response_body,
            },
            "error": error,
        }
    )


def one_line(value: Any) -> str:
    """``value`` as JSON on one line for every reader: U+2028 and U+2029, which JSON
    allows raw in a string but ``str.splitlines`` (and JavaScript) take for line breaks,
    escaped (a reply holding one was refused as two lines, at every run again)."""
    text = json.dumps(value, ensure_ascii=False)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def counters(outcomes: list[Outcome]) -> dict[str, float]:
    """What a batch of requests counts for the report: ``requests``, ``prompt_tokens``,
    ``generated_tokens``, ``finish/<reason>`` per completion, ``error/<kind>``."""
    out: dict[str, float] = {
        "requests": float(len(outcomes)),
        "prompt_tokens": float(sum(o.prompt_tokens or 0 for o in outcomes)),
        "generated_tokens": float(sum(o.completion_tokens for o in outcomes)),
    }
    for outcome in outcomes:
        for reason in outcome.finish_reasons:
            out[f"finish/{reason}"] = out.get(f"finish/{reason}", 0.0) + 1
        if outcome.error is not None:
            kind = f"error/{outcome.kind or 'other'}"
            out[kind] = out.get(kind, 0.0) + 1
    return out
