"""The ``openai`` model type: each row a request to an OpenAI-compatible server.

    model:
      type: openai
      base_url: http://127.0.0.1:8000/v1   # vllm serve, SGLang, a hosted API
      model: qwen2-0.5b                    # the served model's name
      api_key_env: MY_API_KEY              # the key's environment variable, never the key
      concurrency: 16                      # requests in flight per replica
      timeout: 60                          # seconds for a request's whole answer
      max_retries: 8
      backoff: 0.5                         # seconds, doubling per try (with jitter) ...
      backoff_max: 30                      # ... up to this
      temperature: 0
      max_tokens: 64

Rows become requests exactly as for the ``vllm`` type (:mod:`.requests`: a prompt, a chat,
an OpenAI Batch request; ``system``, ``chat``, ``id``, ``seed``, ``structured``), and the
outputs are the same columns. A request is retried, with exponential backoff and jitter,
on ``429``, ``408``, a ``5xx``, a timeout or a connection error (the server down or
restarting), waiting at least what a ``Retry-After`` header asks; any other ``4xx`` (a
prompt longer than the window, a bad body) is that row's error. A request still failing
after ``max_retries`` stops the job, naming the server; run it again to resume. The key
is read from the environment on each replica: it is never in the job file, its
fingerprint or the report. httpx is the client (``pip install 'chute[openai]'``).
"""

from __future__ import annotations

import email.utils
import json
import os
import random
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, ClassVar

import pyarrow as pa

from chute.errors import ConfigError, ModelError, did_you_mean
from chute.job import DEFAULT_BATCH_ROWS
from chute.models.base import Adapter, ReplicaContext
from chute.models.common import rename, renamed
from chute.models.llm.engine import columns
from chute.models.llm.requests import CHAT, EMBEDDINGS, Request, requests_of
from chute.models.llm.responses import BAD_REQUEST, Outcome, counters, parse_replies
from chute.models.llm.sampling import SAMPLING, request_seed, sampling_options
from chute.models.llm.structured import Structured, structured

OWN = (
    "base_url",
    "model",
    "api_key_env",
    "concurrency",
    "timeout",
    "max_retries",
    "backoff",
    "backoff_max",
    "headers",
    "extra_body",
    "sampling",
    "system",
    "chat",
    "id",
    "structured",
    "tokenizer",
    "outputs",
)
RETRIED = frozenset({408, 409, 429})
"""Statuses worth another try besides every 5xx."""
REFUSED = frozenset({401, 403, 404, 405, 407})
"""Statuses no request gets past (a wrong key, base URL or model name), like any redirect:
the job stops, never an error line for every request that a resume would keep."""
NOT_SERVED = frozenset({404, 405})
"""Of those, the ones a server gives for a path it does not serve (``/v1/embeddings`` on a
server that only generates): once another path of it has answered, that request's error
(a file that mixes endpoints), not a reason to stop."""
BACKOFF_MAX = 30.0


class ServerDown(ModelError):
    """A request that kept failing with retriable errors: the job stops (and resumes)."""


class Refused(ServerDown):
    """A status no request gets past, for one path of the server."""

    def __init__(self, message: str, path: str, status: int, reply: Any) -> None:
        super().__init__(message)
        self.path, self.status, self.reply = path, status, reply


class OpenAIAdapter(Adapter):
    """Requests to an OpenAI-compatible endpoint, ``concurrency`` at a time per replica."""

    kind: ClassVar[str] = "openai"
    fuses: ClassVar[bool] = False  # its requests in flight are bounded by the pool
    extra: ClassVar[str | None] = "openai"
    wants_rows: ClassVar[bool] = True
    auto_batch_rows: ClassVar[int | None] = DEFAULT_BATCH_ROWS  # it batches by itself

    def __init__(self, context: ReplicaContext, **options: Any) -> None:
        import httpx

        super().__init__(context, **options)
        self.check(options)
        self.sampling = sampling_options(options, SAMPLING)
        self.seed: int | None = self.sampling.pop("seed", None)
        self.structure = structured(options.get("structured"))
        self.system: str | None = options.get("system")
        self.chat = bool(options.get("chat", False))
        self.id_column: str | None = options.get("id")
        self.renames = dict(options.get("outputs") or {})
        self.model_name = str(options["model"])
        self.concurrency = int(options.get("concurrency", 16))
        self.max_retries = int(options.get("max_retries", 8))
        self.backoff = float(options.get("backoff", 0.5))
        self.backoff_max = float(options.get("backoff_max", BACKOFF_MAX))
        self.extra_body = dict(options.get("extra_body") or {})
        headers = dict(options.get("headers") or {})
        if options.get("api_key_env"):
            headers["Authorization"] = f"Bearer {os.environ[options['api_key_env']]}"
        limits = httpx.Limits(max_connections=self.concurrency)
        self.timeout = float(options.get("timeout", 60))
        self.client = httpx.Client(
            base_url=str(options["base_url"]).rstrip("/") + "/",
            headers=headers,
            timeout=self.timeout,  # each wait for bytes; the whole answer's: _answer
            limits=limits,
        )
        self.answered: set[str] = set()
        """The paths of the server that have answered (a 200 with an answer)."""
        self.pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="chute-openai")
        self.counted: dict[str, float] = {}

    @classmethod
    def check(cls, options: Mapping[str, Any]) -> None:
        if "api_key" in options:
            raise ConfigError(
                "model type 'openai': never put the API key in the job file; name the "
                "environment variable that holds it: api_key_env: MY_API_KEY."
            )
        for key in options:
            if key not in (*OWN, *SAMPLING):
                raise ConfigError(
                    f"model type 'openai' has no option {key!r}."
                    f"{did_you_mean(key, (*OWN, *SAMPLING))} Its options: {', '.join(OWN)} "
                    "and the sampling parameters; server-specific fields go under extra_body."
                )
        for key in ("base_url", "model"):
            if not isinstance(options.get(key), str) or not options[key]:
                raise ConfigError(
                    f"model type 'openai' needs {key}: the server's URL (http://host:8000/v1) "
                    "and the name of the model it serves."
                )
        name = options.get("api_key_env")
        if name is not None and not os.environ.get(str(name)):
            raise ConfigError(
                f"model type 'openai': the environment variable {name!r} (api_key_env) is not "
                "set: export it where the job runs."
            )
        for key, least in (("concurrency", 1), ("max_retries", 0)):
            value = options.get(key, least)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(
                    f"model type 'openai': {key} must be a whole number, at least {least}; "
                    f"got {value!r}."
                )
        sampling_options(options, SAMPLING)
        structured(options.get("structured"))

    @classmethod
    def list_outputs(cls, options: Mapping[str, Any]) -> list[str]:
        names = ["texts", "embedding"]
        if isinstance(options.get("structured"), Mapping) and "json" in options["structured"]:
            names.append("value")
        return renamed(names, options)

    @classmethod
    def plan_notes(
        cls, options: Mapping[str, Any], sample: pa.Table, rows: int | None
    ) -> list[str]:
        from chute.models.llm.estimate import prompt_token_notes

        return prompt_token_notes(options, sample, rows, None)

    def take_counters(self) -> dict[str, float]:
        counted, self.counted = self.counted, {}
        return counted

    def __call__(self, batch: pa.Table) -> Mapping[str, Any]:
        requests = requests_of(batch, self.chat, self.system, self.id_column)
        refusals: list[Refused] = []
        outcomes = list(self.pool.map(partial(self._serve, refusals=refusals), requests))
        for refusal in refusals:  # a path not served, where no other path has answered:
            if refusal.status not in NOT_SERVED or not self.answered - {refusal.path}:
                raise refusal  # a wrong key, base URL or model name
        for name, value in counters(outcomes).items():
            self.counted[name] = self.counted.get(name, 0.0) + value
        n = int(self.sampling.get("n", 1) or 1)
        out = columns(outcomes, requests, self.structure, n, self.model_name)
        if any(r.endpoint == EMBEDDINGS for r in requests):
            out["embedding"] = pa.array([o.embedding for o in outcomes], pa.list_(pa.float32()))
        return rename(out, self.renames)

    def _serve(self, request: Request, refusals: list[Refused]) -> Outcome:
        outcome = Outcome(created=int(time.time()))
        if request.error is not None:
            outcome.fail(request.error, BAD_REQUEST, "bad_request")
            return outcome
        try:
            status, reply = self._post(request.endpoint.removeprefix("/v1/"), self._body(request))
        except Refused as refused:  # decided once the batch's other requests are answered
            refusals.append(refused)
            detail = _message(refused.reply) or "no message"
            outcome.fail(
                f"the server answered {refused.status} to {refused.path} ({detail}): it does "
                "not serve that path, though it answers others",
                refused.status,
                f"http_{refused.status}",
            )
            return outcome
        if status != 200:
            message = _message(reply) or f"the server answered {status}"
            outcome.fail(
                message, status, "prompt_too_long" if _too_long(message) else f"http_{status}"
            )
            return outcome
        _fill(outcome, request, reply, request.structured or self.structure)
        return outcome

    def _body(self, request: Request) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model_name, **self.extra_body}
        if request.endpoint == EMBEDDINGS:
            return {**body, "input": request.prompt}
        body.update({**self.sampling, **request.sampling})
        if self.seed is not None and "seed" not in request.sampling:
            body["seed"] = request_seed(self.seed, request.identity)
        if request.endpoint == CHAT:
            body["messages"] = request.messages
        else:
            body["prompt"] = request.prompt
        structure = request.structured or self.structure
        if structure is not None and structure.kind == "json":
            schema = {"name": "reply", "schema": structure.spec}
            body["response_format"] = {"type": "json_schema", "json_schema": schema}
        elif structure is not None:  # vLLM's extension; other servers may refuse it
            body["structured_outputs"] = structure.params()
        return body

    def _post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        """The status and JSON of the answer, after retrying what is worth retrying."""
        import httpx

        attempt = 0
        while True:
            wait: float | None = None
            try:
                response, reply = self._answer(path, body)
                status = response.status_code
                if status in REFUSED or 300 <= status < 400:
                    served = "" if status not in NOT_SERVED else " (or it does not serve this path)"
                    raise Refused(
                        f"{self.client.base_url}{path} answered {status} "
                        f"({_message(reply) or 'no message'}): no request gets past that"
                        f"{served}. Check the API key, the base URL and the model name, then "
                        "run the job again to resume.",
                        path,
                        status,
                        reply,
                    )
                if status == 200 and not _answered(path, reply):  # a proxy's page, say
                    why = f"HTTP 200 without an answer: {json.dumps(reply)[:200]}"
                elif status not in RETRIED and status < 500:
                    if status == 200:
                        self.answered.add(path)
                    return status, reply
                else:
                    why = f"HTTP {status}: {_message(reply) or ''}".strip()
                    wait = retry_after(response.headers.get("retry-after"))
            except httpx.TransportError as exc:  # refused, reset, timed out
                why = f"{type(exc).__name__}: {exc}"
            if attempt >= self.max_retries:
                raise ServerDown(
                    f"{self.client.base_url}{path} kept failing after {attempt + 1} tries "
                    f"({why}): the job stops here; run it again to resume once the server "
                    "answers."
                )
            self.counted["retries"] = self.counted.get("retries", 0.0) + 1
            time.sleep(backoff(attempt, self.backoff, wait, self.backoff_max))
            attempt += 1

    def _answer(self, path: str, body: dict[str, Any]) -> tuple[Any, Any]:
        """The response to one POST and its JSON, whole within ``timeout`` seconds: the
        client's own timeout bounds each wait for bytes, and a server that sends them
        slowly (a byte a second) would otherwise hold the request, and the job, forever."""
        import httpx

        deadline = time.monotonic() + self.timeout
        with self.client.stream("POST", path, json=body) as response:
            chunks = []
            for chunk in response.iter_bytes():
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise httpx.ReadTimeout(f"no whole answer within {self.timeout:g} s")
        data = b"".join(chunks)
        try:
            return response, json.loads(data)
        except ValueError:
            return response, {"error": {"message": data.decode("utf-8", "replace")[:500]}}

    def __del__(self) -> None:
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.shutdown(wait=False)


def backoff(
    attempt: int, base: float, retry_after: float | None, most: float = BACKOFF_MAX
) -> float:
    """Seconds before try ``attempt + 1``: exponential from ``base`` with full jitter,
    at most ``most``, and never less than the server's ``Retry-After``."""
    delay = random.uniform(0, min(most, base * 2**attempt))
    return max(delay, retry_after or 0.0)


def retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` header in seconds: a number of seconds, or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _answered(path: str, reply: Any) -> bool:
    """Whether a 200's body is an answer of the shape read from it: choices (or an
    embedding) and usage, not an error page or a body of another shape."""
    usage = (reply.get("usage") or {}) if isinstance(reply, Mapping) else None
    if not isinstance(reply, Mapping) or not isinstance(usage, Mapping):
        return False
    if not all(_count(usage.get(k)) for k in ("prompt_tokens", "completion_tokens")):
        return False
    if path == EMBEDDINGS.removeprefix("/v1/"):
        data = reply.get("data")
        return (
            isinstance(data, list)
            and bool(data)
            and isinstance(data[0], Mapping)
            and isinstance(data[0].get("embedding"), list)
        )
    choices = reply.get("choices")
    return (
        isinstance(choices, list)
        and bool(choices)
        and all(
            isinstance(c, Mapping) and isinstance(c.get("message") or {}, Mapping) for c in choices
        )
    )


def _count(value: Any) -> bool:
    """Whether a usage count is a number (or absent; some proxies send ``3.0``)."""
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def _message(reply: Any) -> str | None:
    if isinstance(reply, Mapping):
        error = reply.get("error")
        if isinstance(error, Mapping):
            return str(error.get("message"))
        if "message" in reply:
            return str(reply["message"])
        if isinstance(reply.get("detail"), str):  # FastAPI's (vllm serve's) own errors
            return str(reply["detail"])
    return None


def _too_long(message: str) -> bool:
    lowered = message.lower()
    return "context length" in lowered or "max_model_len" in lowered or "too long" in lowered


def _fill(outcome: Outcome, request: Request, reply: Any, structure: Structured | None) -> None:
    usage = reply.get("usage") or {}
    outcome.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    if request.endpoint == EMBEDDINGS:
        outcome.embedding = [float(x) for x in reply["data"][0]["embedding"]]
        return
    choices = sorted(reply.get("choices") or [], key=lambda c: c.get("index", 0))
    outcome.texts = [
        str((c.get("message") or {}).get("content") or "")
        if request.endpoint == CHAT
        else str(c.get("text") or "")
        for c in choices
    ]
    outcome.finish_reasons = [str(c.get("finish_reason")) for c in choices]
    outcome.completion_tokens = int(usage.get("completion_tokens") or 0)
    if structure is not None:
        parse_replies(outcome, structure)
