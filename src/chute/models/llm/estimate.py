"""``chute plan``'s token estimate for an LLM model: a sample of its rows, tokenized.

Only the tokenizer loads (``transformers``, from the model directory or ``tokenizer:``),
never the engine: the sample's prompts are made into requests exactly as the adapter
makes them (chat template, ``system:`` prompt, OpenAI bodies), counted, and scaled to the
input's rows.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from chute.artifacts import local_path
from chute.models.llm.requests import requests_of


def prompt_token_notes(
    options: Mapping[str, Any], sample: pa.Table, rows: int | None, window: int | None
) -> list[str]:
    """``prompt tokens ≈ 1,234,000 (mean 12.3, max 40 over a sample of 100 rows)``, and how
    many sampled prompts do not fit the window; a line saying why when it cannot tell."""
    path = options.get("tokenizer") or options.get("path")
    if not isinstance(path, str) or "://" in path or not os.path.isdir(os.path.expanduser(path)):
        return ["prompt tokens: not estimated (give tokenizer: a local tokenizer directory)"]
    try:
        from transformers import AutoTokenizer

        from chute.models.llm.engine import encode_all
        from chute.models.sbert import offline_hub

        offline_hub()
        tokenizer = AutoTokenizer.from_pretrained(local_path(path))
        requests = requests_of(
            sample, bool(options.get("chat")), options.get("system"), options.get("id")
        )
        encoded = encode_all(tokenizer, [r for r in requests if r.error is None])
        counts = [len(ids) for ids in encoded if not isinstance(ids, Exception)]
    except Exception as exc:  # a sample the model could not take is the run's error, not ours
        return [f"prompt tokens: not estimated ({exc})"]
    if not counts:
        return ["prompt tokens: not estimated (no servable request in the sample)"]
    mean = sum(counts) / len(counts)
    scope = f"≈ {mean * rows:,.0f} in all" if rows is not None else "per row"
    notes = [
        f"prompt tokens {scope} (mean {mean:,.1f}, max {max(counts):,} over a sample of "
        f"{len(counts):,} rows)"
    ]
    too_long = sum(c >= window for c in counts) if window else 0
    if too_long:
        notes.append(
            f"{too_long:,} of {len(counts):,} sampled prompts do not fit max_model_len "
            f"{window:,}: those rows will fail (raise max_model_len or shorten them)"
        )
    return notes
