"""sentence-transformers models from a local directory: one text column in, embeddings out.

    model: {type: sentence-transformers, path: models/all-MiniLM-L6-v2, normalize: true}

The output is ``<model>_embedding``, an Arrow fixed-size list of float32 (one list of the
model's dimension per row). ``normalize`` scales each embedding to unit length;
``batch_size`` is the encoder's own batch (default 64) inside chute's batch. The model
runs on the replica's device (``cuda`` when it holds a GPU). Nothing is downloaded: the
directory must hold the whole model (``HF_HUB_OFFLINE=1`` is set while it loads).

Tokenizing is a CPU step (:class:`Tokenize`) that chute runs before the model stage: on
Ray in the CPU tasks that read the data, locally in its own thread. The replica then only
pads, runs the forward passes (rows sorted by length, as ``encode`` sorts them) and copies
the embeddings back once per batch, so a GPU is not left waiting for the tokenizer. The
step tokenizes as the model's first module does (its ``sentence_bert_config.json``:
``max_seq_length``, ``do_lower_case``); each replica checks that on the first rows it is
given against the model's own tokenizing, and calls ``encode`` on the text instead when
they differ, or when the model is not a text transformer with a known length.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np
import pyarrow as pa

from chute.artifacts import local_path
from chute.errors import ConfigError
from chute.models.base import PREPARED, Adapter, ReplicaContext, prepared_columns
from chute.models.common import check_counts, rename, renamed, text_column
from chute.models.torchmodel import check_options, fixed_size_list, pad_lists

log = logging.getLogger(__name__)
CHECKED_ROWS = 64
"""Rows of its first prepared batch that a replica tokenizes again itself, to compare."""
PROBES = (" a leading space", "a trailing space ", "\ttabs\tand  two  spaces\n", "ΟΔΟΣ", "İSTANBUL")
"""Texts a replica also compares on, whatever its first rows hold: where tokenizing has
changed between sentence-transformers releases (edges stripped or kept, Python's or the
tokenizer's lowercasing of a final Σ). A step that differed only on rows past the first
64 embedded them wrongly without a word."""


LOADING = threading.RLock()
"""Held while a Hugging Face library is imported or a model or tokenizer loads. Its lazy
modules, imported by two threads at once (a replica and the CPU step beside it), handed
one of them a module not yet filled in (``module 'transformers' has no attribute
'AutoTokenizer'``), and the step's first batches went to the replica as text."""


def offline_hub() -> None:
    """Never reach for the Hugging Face hub: every model is loaded from a local path."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


@functools.lru_cache(maxsize=8)
def _tokenizer(path: str) -> tuple[Any, int, bool] | None:
    """(tokenizer, max_seq_length, do_lower_case) of the model's first module when it is a
    text transformer whose length is written down; ``None`` otherwise. Once per process
    and ``path`` (a remote one is listed and fetched here, not for every batch)."""
    root = Path(local_path(path))
    try:
        first = json.loads((root / "modules.json").read_text())[0]
        folder = root / str(first.get("path", ""))
        config = json.loads((folder / "sentence_bert_config.json").read_text())
        prompts = root / "config_sentence_transformers.json"
        settings = json.loads(prompts.read_text()) if prompts.exists() else {}
        prompt = settings.get("default_prompt_name")  # encode would prepend it
    except (OSError, ValueError, LookupError, AttributeError):
        return None
    length = config.get("max_seq_length")
    if not str(first.get("type", "")).endswith(".Transformer") or not length or prompt:
        return None
    offline_hub()
    with LOADING:
        import transformers

        tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    return tokenizer, int(length), bool(config.get("do_lower_case", False))


@functools.cache
def _lowercase() -> Callable[[str], str]:
    """Lowercasing as the tokenizers library does, which sentence-transformers 6 uses (a
    final Σ as σ; Python's ``str.lower`` gives ς): one normalizer per process."""
    from tokenizers.normalizers import Lowercase

    return cast(Callable[[str], str], Lowercase().normalize_str)


class Tokenize:
    """The CPU step: the text column to token ids, unpadded (``input_ids`` and, where the
    tokenizer makes them, ``token_type_ids``: int32 lists), or nothing for a model it
    cannot tokenize for (the replica then encodes the text itself). Picklable: the
    tokenizer loads on first use in each process (under :data:`LOADING`). A batch it
    raises on goes on as text, and the replica encodes it."""

    def __init__(self, model: str, options: Mapping[str, Any]) -> None:
        self.model = model
        self.path = str(options["path"])

    def __call__(self, batch: pa.Table) -> dict[str, pa.Array]:
        found = _tokenizer(self.path)
        if found is None:
            return {}
        tokenizer, length, lower = found
        texts = text_column(batch, self.model)  # as given: sentence-transformers 6 keeps edges
        encoded = tokenizer(
            list(map(_lowercase(), texts)) if lower else texts,
            truncation="longest_first",
            max_length=length,
        )
        lists = pa.list_(pa.int32())
        out = {"input_ids": pa.array(encoded["input_ids"], lists)}
        if "token_type_ids" in encoded:
            out["token_type_ids"] = pa.array(encoded["token_type_ids"], lists)
        return out


class SentenceTransformersAdapter(Adapter):
    """A ``SentenceTransformer`` loaded once per replica; ``embedding`` per row."""

    kind: ClassVar[str] = "sentence-transformers"
    extra: ClassVar[str | None] = "sentence-transformers"

    @classmethod
    def check(cls, options: Mapping[str, Any]) -> None:
        """Known options and a ``path`` (before anything loads)."""
        super().check(options)
        check_options(cls.kind, options, ("path", "normalize", "batch_size", "outputs"))
        check_counts(cls.kind, options, ("batch_size",))

    @classmethod
    def list_outputs(cls, options: Mapping[str, Any]) -> list[str]:
        """``embedding``: a fixed-size list per row."""
        return renamed(["embedding"], options)

    def __init__(self, context: ReplicaContext, **options: Any) -> None:
        super().__init__(context, **options)
        offline_hub()
        if "path" not in options:
            raise ConfigError(
                f"model {context.model!r} (sentence-transformers): give `path`, the model "
                "directory."
            )
        path = local_path(str(options["path"]))
        with LOADING:
            import torch
            from sentence_transformers import SentenceTransformer

            if context.device == "cpu":
                torch.set_num_threads(context.threads)
            self.model = SentenceTransformer(path, device=context.device)
        self.normalize = bool(options.get("normalize", False))
        self.batch_size = int(options.get("batch_size", 64))
        self.tokens_match: bool | None = None
        """Whether :class:`Tokenize` tokenizes as this model does (``None``: not checked)."""

    @classmethod
    def preparer(cls, model: str, options: Mapping[str, Any]) -> Callable[[pa.Table], Any]:
        """Tokenizing, for chute to run on CPUs before this stage."""
        return Tokenize(model, options)

    def __call__(self, batch: pa.Table) -> Mapping[str, Any]:
        inputs = [name for name in batch.column_names if not name.startswith(PREPARED)]
        texts = text_column(batch.select(inputs), self.context.model)
        columns = prepared_columns(batch)
        if columns and "input_ids" in columns and self._tokens_match(texts, columns):
            embeddings = self._embed(columns)
        else:
            embeddings = self.model.encode(
                texts,
                batch_size=self.batch_size,
                convert_to_numpy=True,
                normalize_embeddings=self.normalize,
                show_progress_bar=False,
            )
        out = {"embedding": fixed_size_list(np.asarray(embeddings, dtype=np.float32))}
        return rename(out, self.options.get("outputs") or {})

    def _tokens_match(self, texts: list[str], columns: Mapping[str, pa.Array]) -> bool:
        """Once per replica: the step's token ids of the first rows are the model's own."""
        if self.tokens_match is None:
            rows = min(len(texts), CHECKED_ROWS)
            step = Tokenize(self.context.model, self.options)(pa.table({"text": PROBES}))
            columns = {
                key: pa.concat_arrays([columns[key].slice(0, rows), step[key]])
                for key in columns
                if key in step
            }
            preprocess = getattr(self.model, "preprocess", None) or self.model.tokenize
            own = preprocess([*texts[:rows], *PROBES])
            mask = own["attention_mask"].bool()
            keys = {"input_ids", "token_type_ids"} & (set(own) | set(columns))
            same = all(key in own and key in columns for key in keys) and all(
                own[key][i][mask[i]].tolist() == columns[key][i].as_py()
                for key in keys
                for i in range(rows + len(PROBES))
            )
            self.tokens_match = bool(same)
            if not same:
                log.warning(
                    "model %r: the CPU step tokenizes differently from the model; its "
                    "replicas tokenize themselves (model.encode)",
                    self.context.model,
                )
        return self.tokens_match

    def _embed(self, columns: Mapping[str, pa.Array]) -> np.ndarray:
        """The forward passes over prepared rows: longest first, ``batch_size`` at a time,
        the embeddings kept on the device until the batch is done."""
        import pyarrow.compute as pc
        import torch

        ids = columns["input_ids"]
        order = np.argsort(-pc.list_value_length(ids).to_numpy(), kind="stable")
        pad = getattr(self.model.tokenizer, "pad_token_id", None) or 0
        device = self.model.device
        parts = []
        with torch.inference_mode():
            for lo in range(0, len(order), self.batch_size):
                take = pa.array(order[lo : lo + self.batch_size])
                tokens, mask = pad_lists(ids.take(take), pad)
                features = {
                    "input_ids": torch.from_numpy(tokens).to(device),
                    "attention_mask": torch.from_numpy(mask).to(device),
                }
                if "token_type_ids" in columns:
                    types = pad_lists(columns["token_type_ids"].take(take), 0)[0]
                    features["token_type_ids"] = torch.from_numpy(types).to(device)
                embedding = self.model(features)["sentence_embedding"]
                if self.normalize:
                    embedding = torch.nn.functional.normalize(embedding, p=2, dim=1)
                parts.append(embedding)
            if not parts:
                return np.zeros((0, self.model.get_sentence_embedding_dimension() or 0))
            done = torch.cat(parts).float().cpu().numpy()
        embeddings = np.empty_like(done)
        embeddings[order] = done
        return embeddings
