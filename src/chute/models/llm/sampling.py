"""Sampling parameters, engine settings and per-request seeds of an LLM job.

Every field of vLLM's ``SamplingParams`` may be given, at the top of the model's options
(``temperature: 0``) or under ``sampling:``; where vLLM is installed its own field list
decides what is known, so a new vLLM's parameters work at once.

**Seeds.** With ``seed: S`` each request gets its own sampling seed, derived from ``S``
and the request's identity (its ``custom_id``, an ``id`` column, or its row), never from
its place in a batch. A request redone after a resume therefore gets the text an
uninterrupted run gave it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from chute.errors import ConfigError, did_you_mean

SAMPLING = (
    "n",
    "temperature",
    "max_tokens",
    "min_tokens",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "logprobs",
    "prompt_logprobs",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
)
"""The sampling parameters known without vLLM installed (vLLM's own list wins where it is)."""

ENGINE = (
    "dtype",
    "max_model_len",
    "enforce_eager",
    "gpu_memory_utilization",
    "tensor_parallel_size",
    "max_num_seqs",
    "max_num_batched_tokens",
)
"""``vllm.LLM`` settings given at the top of the options; ``engine:`` takes any other."""

SEED_BITS = 31
"""Derived seeds are below 2**31: every sampler takes them."""


def known_sampling() -> tuple[str, ...]:
    """vLLM's ``SamplingParams`` fields when vLLM is installed, else :data:`SAMPLING`."""
    try:
        from vllm import SamplingParams
    except ImportError:
        return SAMPLING
    fields = getattr(SamplingParams, "__struct_fields__", ())
    public = tuple(f for f in fields if not f.startswith("_") and f != "structured_outputs")
    return public or SAMPLING


def sampling_options(
    options: Mapping[str, Any], known: tuple[str, ...] = SAMPLING
) -> dict[str, Any]:
    """The job's sampling parameters: the top-level ones over ``sampling:``."""
    nested = options.get("sampling") or {}
    if not isinstance(nested, Mapping):
        raise ConfigError(f"sampling must be a mapping of parameters, got {nested!r}.")
    merged = dict(nested)
    merged.update({k: options[k] for k in known if k in options})
    for key in merged:
        if key not in known:
            raise ConfigError(
                f"model type 'vllm': unknown sampling parameter {key!r}."
                f"{did_you_mean(key, known)} Known: {', '.join(known)}."
            )
    return merged


def engine_options(options: Mapping[str, Any], gpus: float) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments. On GPUs, the GPUs the replica holds decide the split
    (``gpus: 2`` is tensor parallel over two, ``gpus: 0.5`` half of one GPU's memory); on a
    CPU (vLLM's CPU build) neither applies."""
    settings: dict[str, Any] = {}
    if gpus > 0:
        settings["tensor_parallel_size"] = max(1, int(gpus))
        if gpus < 1:
            settings["gpu_memory_utilization"] = round(0.9 * gpus, 3)
    extra = options.get("engine") or {}
    if not isinstance(extra, Mapping):
        raise ConfigError(f"engine must be a mapping of vllm.LLM arguments, got {extra!r}.")
    settings.update(extra)
    settings.update({k: options[k] for k in ENGINE if k in options})
    return settings


def request_seed(seed: int, identity: str) -> int:
    """The sampling seed of one request: a hash of the job's seed and its identity.

    >>> request_seed(0, "req-1") == request_seed(0, "req-1") != request_seed(1, "req-1")
    True
    """
    digest = hashlib.blake2b(f"{seed}\x00{identity}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (1 << SEED_BITS)
