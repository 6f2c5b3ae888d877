"""LLM generation with vLLM: a prompt column in, a text column out, on GPUs.

    model:
      type: vllm
      path: models/qwen2-0.5b-instruct      # a local model directory; nothing is downloaded
      temperature: 0.0
      max_tokens: 128
      top_p: 1.0
      seed: 0
    resources: {gpus: 1}

``pip install 'chute[vllm]'``. The output is ``<model>_text``, the first completion of each
prompt (a string). Sampling parameters (``temperature``, ``max_tokens``, ``top_p``,
``top_k``, ``min_p``, ``seed``, ``stop``, ``presence_penalty``, ``frequency_penalty``,
``repetition_penalty``) are given directly or under ``sampling:``. The replica must hold a
GPU: with ``gpus: N`` (N >= 1) the model is split over the N GPUs
(``tensor_parallel_size``); with a fraction, vLLM is told to use that share of the GPU's
memory (``gpu_memory_utilization``), so that several models can share one GPU. Other
engine settings: ``dtype``, ``max_model_len``, ``enforce_eager``,
``gpu_memory_utilization``, ``tensor_parallel_size``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import pyarrow as pa

from chute.artifacts import local_path
from chute.errors import ConfigError, did_you_mean
from chute.models.base import Adapter, ReplicaContext
from chute.models.common import rename
from chute.models.sbert import offline_hub, text_column

SAMPLING = (
    "temperature",
    "max_tokens",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)
ENGINE = (
    "dtype",
    "max_model_len",
    "enforce_eager",
    "gpu_memory_utilization",
    "tensor_parallel_size",
)
OPTIONS = ("path", "outputs", "sampling", *SAMPLING, *ENGINE)


def sampling_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The job's sampling parameters: the top-level ones over ``sampling:``."""
    merged = dict(options.get("sampling") or {})
    merged.update({k: options[k] for k in SAMPLING if k in options})
    for key in merged:
        if key not in SAMPLING:
            raise ConfigError(
                f"model type 'vllm': unknown sampling parameter {key!r}."
                f"{did_you_mean(key, SAMPLING)} Known: {', '.join(SAMPLING)}."
            )
    return merged


def engine_options(options: Mapping[str, Any], context: ReplicaContext) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments: the GPUs the replica holds decide the split."""
    gpus = context.resources.gpus
    settings: dict[str, Any] = {"tensor_parallel_size": max(1, int(gpus))}
    if gpus < 1:
        settings["gpu_memory_utilization"] = round(0.9 * gpus, 3)
    settings.update({k: options[k] for k in ENGINE if k in options})
    return settings


class VLLMAdapter(Adapter):
    """A vLLM engine per replica; ``text`` per prompt."""

    kind: ClassVar[str] = "vllm"
    extra: ClassVar[str | None] = "vllm"

    def __init__(self, context: ReplicaContext, **options: Any) -> None:
        super().__init__(context, **options)
        self.check(options)
        if context.device != "cuda":
            raise ConfigError(
                f"model {context.model!r} (vllm) needs a GPU: give it resources: {{gpus: 1}} "
                "(or a fraction to share one)."
            )
        offline_hub()
        from vllm import LLM, SamplingParams

        path = local_path(str(options["path"]))
        self.llm = LLM(model=path, **engine_options(options, context))
        self.sampling = SamplingParams(**sampling_options(options))

    @classmethod
    def check(cls, options: Mapping[str, Any]) -> None:
        """Known options and sampling parameters, and a model directory (before loading)."""
        super().check(options)
        for key in options:
            if key not in OPTIONS and key != "trust_pickle":
                raise ConfigError(
                    f"model type 'vllm' has no option {key!r}.{did_you_mean(key, OPTIONS)} "
                    f"Its options: {', '.join(OPTIONS)}."
                )
        if not isinstance(options.get("path"), str):
            raise ConfigError("model type 'vllm' needs path: the local model directory.")
        sampling_options(options)

    def __call__(self, batch: pa.Table) -> Mapping[str, Any]:
        prompts = text_column(batch, self.context.model)
        results = self.llm.generate(prompts, self.sampling, use_tqdm=False)
        columns = {"text": pa.array([r.outputs[0].text for r in results], pa.string())}
        return rename(columns, self.options.get("outputs") or {})
