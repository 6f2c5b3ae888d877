"""Hugging Face transformers models from a local directory, by pipeline task.

    model: {type: transformers, path: models/sst2, task: text-classification, batch_size: 32}

The tasks are those of ``transformers.pipeline``, with the same model classes and the same
post-processing, so each output equals the pipeline's on the same rows:

=====================  ============================================================
task                   outputs (prefixed ``<model>_``)
=====================  ============================================================
text-classification    ``label`` (string, ``config.id2label``), ``score`` (float32; a
                       regression head's raw score)
token-classification   ``entities``: a list of structs per row, ``entity``, ``score``,
                       ``index``, ``word``, ``start``, ``end`` — the pipeline's
                       ``aggregation_strategy="none"`` output, ``O`` tokens left out
feature-extraction     ``embedding``: fixed-size list of float32, the last hidden state
                       averaged over the row's tokens (``pooling: mean``, the default,
                       special tokens included as the pipeline returns them) or the first
                       token's (``pooling: cls``)
text-generation        ``text``: the generated continuation (the prompt left out);
                       ``max_new_tokens`` (default 32) and ``generate`` (keyword arguments
                       for ``model.generate``: ``do_sample``, ``temperature``, ...)
image-classification   ``label``, ``score`` (the top class); the input column holds
                       encoded image bytes, a file path, or an ``(H, W, C)`` uint8 array
=====================  ============================================================

The one input column is tokenized (or the images decoded and processed) by
:class:`Prepare`, a CPU step that chute runs *before* the model stage: on Ray in the CPU
tasks that read the data, locally in its own threads. GPU replicas then receive token ids
(or pixel values) and only pad, run the model and post-process. A model stage given rows
that were not prepared (called directly, say) prepares them itself.

``batch_size`` (default 32) is the forward batch inside chute's batch; rows are padded per
forward batch. ``dtype`` (``float32``, ``float16``, ``bfloat16``) casts the model; the
replica's device is ``cuda`` when it holds a GPU. ``max_length`` truncates long texts
(the default: no truncation, as the pipeline does).
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chute.artifacts import local_path
from chute.errors import ConfigError, ModelError, did_you_mean
from chute.models.base import Adapter, ReplicaContext, prepared_columns, unprepared
from chute.models.common import check_choice, check_counts, rename, text_column
from chute.models.sbert import LOADING, offline_hub
from chute.models.torchmodel import DTYPES, check_options, fixed_size_list, pad_lists

TASKS = (
    "text-classification",
    "token-classification",
    "feature-extraction",
    "text-generation",
    "image-classification",
)
OPTIONS = (
    "path",
    "task",
    "batch_size",
    "dtype",
    "max_length",
    "pooling",
    "max_new_tokens",
    "generate",
    "outputs",
)
POOLINGS = ("mean", "cls")

MODEL_CLASSES = {
    "text-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "feature-extraction": "AutoModel",
    "text-generation": "AutoModelForCausalLM",
    "image-classification": "AutoModelForImageClassification",
}
ENTITY = pa.struct(
    [
        ("entity", pa.string()),
        ("score", pa.float32()),
        ("index", pa.int32()),
        ("word", pa.string()),
        ("start", pa.int32()),
        ("end", pa.int32()),
    ]
)


def check_task(options: Mapping[str, Any]) -> str:
    """The ``task`` option, which must name one of :data:`TASKS`."""
    task = options.get("task")
    if task not in TASKS:
        raise ConfigError(
            f"model type 'transformers' needs task: one of {', '.join(TASKS)}; got {task!r}."
            f"{did_you_mean(str(task), TASKS)}"
        )
    return str(task)


@functools.lru_cache(maxsize=8)
def _processor(path: str, task: str) -> Any:
    """The tokenizer (or image processor), once per process and model directory."""
    offline_hub()
    with LOADING:
        import transformers

        if task == "image-classification":
            return transformers.AutoImageProcessor.from_pretrained(path)  # type: ignore[no-untyped-call]
        return transformers.AutoTokenizer.from_pretrained(path)


class Prepare:
    """The CPU step: one text (or image) column to token ids (or pixel values).

    Picklable and cheap to ship: the processor loads on first use in each process.
    Returns ``input_ids`` (a list of int32 per row, unpadded) and the tokenizer's other
    per-token lists, or ``pixel_values`` (a nested fixed-size list of float32 per row).
    """

    def __init__(self, model: str, options: Mapping[str, Any]) -> None:
        self.model = model
        self.path = local_path(str(options["path"]))
        self.task = check_task(options)
        length = options.get("max_length")
        self.max_length = None if length is None else int(length)

    def __call__(self, batch: pa.Table) -> dict[str, pa.Array]:
        if batch.num_columns != 1:
            raise ModelError(
                f"model {self.model!r} ({self.task}) takes one input column, got "
                f"{batch.column_names}: set `inputs: [<column>]`."
            )
        processor = _processor(self.path, self.task)
        if self.task == "image-classification":
            return self._images(processor, batch.column(0))
        return self._texts(processor, text_column(batch, self.model))

    def _texts(self, tokenizer: Any, texts: list[str]) -> dict[str, pa.Array]:
        limit = {"truncation": True, "max_length": self.max_length} if self.max_length else {}
        extra = (
            {"return_offsets_mapping": True, "return_special_tokens_mask": True}
            if self.task == "token-classification"
            else {}
        )
        encoded = tokenizer(texts, **limit, **extra)
        out = {"input_ids": _lists(encoded["input_ids"])}
        for key in ("token_type_ids", "special_tokens_mask"):
            if key in encoded:
                out[key] = _lists(encoded[key])
        if "offset_mapping" in encoded:  # token classification: where each token came from
            out["text"] = pa.array(texts, pa.string())
            out["starts"] = _lists([[s for s, _ in row] for row in encoded["offset_mapping"]])
            out["ends"] = _lists([[e for _, e in row] for row in encoded["offset_mapping"]])
        return out

    def _images(self, processor: Any, column: pa.ChunkedArray) -> dict[str, pa.Array]:
        images = [_image(value) for value in _image_values(column)]
        pixels = np.asarray(processor(images=images, return_tensors="np")["pixel_values"])
        return {"pixel_values": _nested_list(pixels.astype(np.float32))}


def _lists(rows: Sequence[Sequence[int]]) -> pa.Array:
    return pa.array(rows, type=pa.list_(pa.int32()))


def _nested_list(array: np.ndarray) -> pa.Array:
    values: pa.Array = pa.array(np.ascontiguousarray(array).reshape(-1))
    for size in reversed(array.shape[1:]):
        values = pa.FixedSizeListArray.from_arrays(values, size)
    return values


def _image_values(column: pa.ChunkedArray) -> list[Any]:
    if isinstance(column.type, pa.FixedShapeTensorType):  # decoded by the image source
        return list(column.combine_chunks().to_numpy_ndarray())
    if pa.types.is_fixed_size_list(column.type):
        from chute.models.torchmodel import nested_array

        return list(nested_array(column.combine_chunks()))
    return list(column.to_pylist())


def _image(value: Any) -> Any:
    """A PIL RGB image from encoded bytes, a file path or an ``(H, W, C)`` array."""
    from PIL import Image

    if isinstance(value, (bytes, bytearray)):
        return Image.open(io.BytesIO(value)).convert("RGB")
    if isinstance(value, str):
        return Image.open(local_path(value, "image")).convert("RGB")
    pixels = np.asarray(value, dtype=np.uint8)
    if pixels.ndim == 3 and pixels.shape[2] == 1:  # (H, W, 1): grey
        pixels = pixels[:, :, 0]
    return Image.fromarray(pixels).convert("RGB")


class TransformersAdapter(Adapter):
    """A transformers model for one pipeline task, fed prepared tensors."""

    kind: ClassVar[str] = "transformers"
    extra: ClassVar[str | None] = "transformers"

    def __init__(self, context: ReplicaContext, **options: Any) -> None:
        super().__init__(context, **options)
        offline_hub()
        self.prepare = Prepare(context.model, options)
        self.task = self.prepare.task
        self.batch_size = int(options.get("batch_size", 32))
        dtype = options.get("dtype", "float32")
        if dtype not in DTYPES:
            raise ConfigError(f"model {context.model!r}: dtype {dtype!r} is not one of {DTYPES}.")
        with LOADING:  # beside the CPU step, which loads the tokenizer at the same time
            import torch
            import transformers

            if context.device == "cpu":
                torch.set_num_threads(context.threads)
            self.device = torch.device(context.device)
            cls = getattr(transformers, MODEL_CLASSES[self.task])
            model = cls.from_pretrained(self.prepare.path).to(self.device, getattr(torch, dtype))
        self.model = model.eval()
        self.processor = _processor(self.prepare.path, self.task)

    @classmethod
    def check(cls, options: Mapping[str, Any]) -> None:
        """Known options and task (before anything loads)."""
        super().check(options)
        check_options(cls.kind, options, OPTIONS)
        check_task(options)
        check_counts(cls.kind, options, ("batch_size", "max_length", "max_new_tokens"))
        if "pooling" in options:
            check_choice(cls.kind, "pooling", options["pooling"], POOLINGS)

    @classmethod
    def preparer(cls, model: str, options: Mapping[str, Any]) -> Callable[[pa.Table], Any]:
        """Tokenization / image processing, for chute to run on CPUs before this stage."""
        return Prepare(model, options)

    def __call__(self, batch: pa.Table) -> Mapping[str, Any]:
        import torch

        columns = prepared_columns(batch)
        if columns is None:  # not prepared on a CPU worker (a direct call, a failed step)
            columns = self.prepare(unprepared(batch))
        with torch.inference_mode():
            out = self._run(columns, batch.num_rows)
        return rename(out, self.options.get("outputs") or {})

    def _run(self, columns: Mapping[str, Any], rows: int) -> dict[str, Any]:
        if self.task == "text-generation":
            return {"text": self._generate(columns["input_ids"])}
        parts = [
            self._forward({k: v.slice(lo, self.batch_size) for k, v in columns.items()})
            for lo in range(0, rows, self.batch_size)
        ]
        return {k: pa.concat_arrays([p[k] for p in parts]) for k in parts[0]} if parts else {}

    def _forward(self, chunk: Mapping[str, Any]) -> dict[str, pa.Array]:
        if self.task == "image-classification":
            pixels = _stacked(chunk["pixel_values"])
            logits = self.model(pixel_values=self._tensor(pixels, float_=True)).logits
            return self._classes(logits)
        pad = getattr(self.processor, "pad_token_id", None)
        if pad is None and len(set(pc.list_value_length(chunk["input_ids"]).to_pylist())) > 1:
            # no pad token: a filler id is a real token (a decoder's classifier reads the
            # row's last one by the config's pad id), so each row alone, as the pipeline does
            parts = [
                self._forward({k: v.slice(i, 1) for k, v in chunk.items()})
                for i in range(len(chunk["input_ids"]))
            ]
            return {k: pa.concat_arrays([part[k] for part in parts]) for k in parts[0]}
        ids, mask = pad_lists(chunk["input_ids"], 0 if pad is None else int(pad))
        inputs = {"input_ids": self._tensor(ids), "attention_mask": self._tensor(mask)}
        if "token_type_ids" in chunk:
            inputs["token_type_ids"] = self._tensor(pad_lists(chunk["token_type_ids"], 0)[0])
        out = self.model(**inputs)
        if self.task == "text-classification":
            return self._classes(out.logits)
        if self.task == "token-classification":
            return {"entities": self._entities(out.logits, chunk, mask)}
        return {"embedding": self._pool(out.last_hidden_state, mask)}

    def _tensor(self, array: np.ndarray, float_: bool = False) -> Any:
        import torch

        tensor = torch.from_numpy(array if array.flags.writeable else array.copy())
        tensor = tensor.to(self.device)
        return tensor.to(self.model.dtype) if float_ else tensor

    def _classes(self, logits: Any) -> dict[str, pa.Array]:
        """Top class and its probability, as the pipeline scores them."""
        scores = logits.float().cpu().numpy()
        config = self.model.config
        if config.problem_type == "regression":  # the pipeline's order: the raw score
            probs = scores
        elif config.num_labels == 1 or config.problem_type == "multi_label_classification":
            probs = 1.0 / (1.0 + np.exp(-scores))
        else:
            shifted = np.exp(scores - scores.max(axis=-1, keepdims=True))
            probs = shifted / shifted.sum(axis=-1, keepdims=True)
        index = probs.argmax(axis=-1)
        labels = [config.id2label[int(i)] for i in index]
        best = probs[np.arange(len(index)), index].astype(np.float32)
        return {"label": pa.array(labels, pa.string()), "score": pa.array(best)}

    def _pool(self, hidden: Any, mask: np.ndarray) -> pa.Array:
        states = hidden.float().cpu().numpy()
        if self.options.get("pooling", "mean") == "cls":
            return fixed_size_list(states[:, 0])
        weights = mask[:, :, None].astype(np.float32)
        return fixed_size_list((states * weights).sum(axis=1) / weights.sum(axis=1))

    def _entities(self, logits: Any, chunk: Mapping[str, Any], mask: np.ndarray) -> pa.Array:
        scores = logits.float().cpu().numpy()
        shifted = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = shifted / shifted.sum(axis=-1, keepdims=True)
        fields = ("input_ids", "special_tokens_mask", "starts", "ends", "text")
        rows = zip(*(chunk[f].to_pylist() for f in fields), strict=True)
        labels = self.model.config.id2label
        found = [self._row_entities(probs[i], row, labels) for i, row in enumerate(rows)]
        return pa.array(found, type=pa.list_(ENTITY))

    def _row_entities(
        self,
        probs: np.ndarray,
        row: tuple[Any, ...],
        labels: Mapping[int, str],
    ) -> list[dict[str, Any]]:
        """One row's tokens as the pipeline's entities (special and ``O`` tokens left out)."""
        ids, special, starts, ends, text = row
        unknown = getattr(self.processor, "unk_token_id", None)
        out = []
        for index, token in enumerate(ids):
            best = int(probs[index].argmax())
            if special[index] or labels[best] == "O":
                continue
            out.append(
                {
                    "entity": labels[best],
                    "score": float(probs[index, best]),
                    "index": index,
                    "word": text[starts[index] : ends[index]]
                    if token == unknown  # as the pipeline shows it
                    else self.processor.convert_ids_to_tokens(int(token)),
                    "start": starts[index],
                    "end": ends[index],
                }
            )
        return out

    def _generate(self, ids_column: pa.Array) -> pa.Array:
        """Rows grouped by prompt length and generated together: no padding, so each row's
        text is what the model generates for it alone."""
        rows = ids_column.to_pylist()
        texts: list[str | None] = [None] * len(rows)
        by_length: dict[int, list[int]] = {}
        for i, ids in enumerate(rows):
            by_length.setdefault(len(ids), []).append(i)
        for members in by_length.values():
            for lo in range(0, len(members), self.batch_size):
                group = members[lo : lo + self.batch_size]
                for i, text in zip(
                    group, self._generate_group([rows[i] for i in group]), strict=True
                ):
                    texts[i] = text
        return pa.array(texts, pa.string())

    def _generate_group(self, prompts: list[list[int]]) -> list[str]:
        import torch

        ids = torch.tensor(prompts, dtype=torch.long, device=self.device)
        kwargs = dict(self.options.get("generate") or {})
        kwargs.setdefault("max_new_tokens", int(self.options.get("max_new_tokens", 32)))
        if self.model.generation_config.pad_token_id is None:
            kwargs.setdefault("pad_token_id", self.model.generation_config.eos_token_id)
        out = self.model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        decode = self.processor.decode
        return [
            decode(seq, skip_special_tokens=True)[len(decode(p, skip_special_tokens=True)) :]
            for seq, p in zip(out.cpu().tolist(), prompts, strict=True)
        ]


def _stacked(column: pa.Array) -> np.ndarray:
    from chute.models.torchmodel import nested_array

    return np.ascontiguousarray(nested_array(column), dtype=np.float32)
