"""sentence-transformers models from a local directory: one text column in, embeddings out.

    model: {type: sentence-transformers, path: models/all-MiniLM-L6-v2, normalize: true}

The output is ``<model>_embedding``, an Arrow fixed-size list of float32 (one list of the
model's dimension per row). ``normalize`` scales each embedding to unit length;
``batch_size`` is the encoder's own batch (default 64) inside chute's batch. The model
runs on the replica's device (``cuda`` when it holds a GPU). Nothing is downloaded: the
directory must hold the whole model (``HF_HUB_OFFLINE=1`` is set while it loads).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from chute.artifacts import local_path
from chute.errors import ConfigError, ModelError
from chute.models.base import Adapter, ReplicaContext
from chute.models.common import rename, renamed
from chute.models.torchmodel import check_options, fixed_size_list


def offline_hub() -> None:
    """Never reach for the Hugging Face hub: every model is loaded from a local path."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def text_column(batch: pa.Table, model: str) -> list[str]:
    """The batch's one text column as Python strings."""
    if batch.num_columns != 1:
        raise ModelError(
            f"model {model!r} takes one text column, got {batch.column_names}: "
            "set `inputs: [<text column>]`."
        )
    return [str(text) for text in batch.column(0).to_pylist()]


class SentenceTransformersAdapter(Adapter):
    """A ``SentenceTransformer`` loaded once per replica; ``embedding`` per row."""

    kind: ClassVar[str] = "sentence-transformers"
    extra: ClassVar[str | None] = "sentence-transformers"

    @classmethod
    def check(cls, options: Mapping[str, Any]) -> None:
        """Known options and a ``path`` (before anything loads)."""
        super().check(options)
        check_options(cls.kind, options, ("path", "normalize", "batch_size", "outputs"))

    @classmethod
    def list_outputs(cls, options: Mapping[str, Any]) -> list[str]:
        """``embedding``: a fixed-size list per row."""
        return renamed(["embedding"], options)

    def __init__(self, context: ReplicaContext, **options: Any) -> None:
        super().__init__(context, **options)
        offline_hub()
        import torch
        from sentence_transformers import SentenceTransformer

        if "path" not in options:
            raise ConfigError(
                f"model {context.model!r} (sentence-transformers): give `path`, the model "
                "directory."
            )
        if context.device == "cpu":
            torch.set_num_threads(context.threads)
        self.model = SentenceTransformer(local_path(str(options["path"])), device=context.device)
        self.normalize = bool(options.get("normalize", False))
        self.batch_size = int(options.get("batch_size", 64))

    def __call__(self, batch: pa.Table) -> Mapping[str, Any]:
        texts = text_column(batch, self.context.model)
        embeddings = self.model.encode(
            texts,
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=self.normalize,
            show_progress_bar=False,
        )
        columns = {"embedding": fixed_size_list(np.asarray(embeddings, dtype=np.float32))}
        return rename(columns, self.options.get("outputs") or {})
