"""``chute run-batch``: an OpenAI Batch file in, one answer line per request out.

The same as ``vllm run-batch`` — ``-i requests.jsonl -o results.jsonl --model DIR`` —
but a job like any other: the requests are the rows of an ``openai-batch`` source, a
``vllm`` model answers them, and the answers are written as parts and committed unit by
unit in chute's ledger. Kill it and run it again: the committed units are kept, the
others redone, and every request is answered exactly once.

A file whose every request is ``/v1/embeddings`` is served by the model's pooling
runner (``task: embed``), as ``vllm run-batch`` does; ``--task`` says so explicitly.

``-o`` naming a directory gives the parts themselves (``part-*.jsonl``, in input order by
name). ``-o`` naming a file: the parts go to ``<file>.chute/`` (the job's resumable state)
and, once every request is answered, the file is assembled from them in input order and
put in place at once (a temporary name, then a rename).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from chute.api import Job
from chute.errors import ConfigError, JobStateError
from chute.job import BatchSize, Model, Sink
from chute.ledger import PART_NAME
from chute.models import adapter
from chute.models.llm.requests import EMBEDDINGS
from chute.report import Report
from chute.sources.openai_batch import REQUESTS_PER_UNIT, OpenAIBatchSource, input_files
from chute.storage import is_local, put, resolve

MODEL = "llm"
"""The model's name in the job (its columns are ``llm_text``, ``llm_line``, ...)."""
STATE_SUFFIX = ".chute"
"""Where a single-file output's parts and ledger live: next to it, ``<file>.chute/``."""


@dataclass(frozen=True)
class BatchRun:
    """A ``run-batch`` invocation: where from, where to, which model and how."""

    input: str
    output: str
    model: str
    """The local model directory."""
    options: Mapping[str, Any]
    """The vllm adapter's options besides ``path`` (seed, max_model_len, ...)."""
    engine: str = "auto"
    requests_per_unit: int = REQUESTS_PER_UNIT
    batch_size: int | None = None
    """Requests per ``LLM.generate`` call; ``None``: chute's default (large: vLLM is
    fastest when it sees many prompts at once)."""

    @property
    def single_file(self) -> bool:
        """Whether ``output`` names one file (else a directory of parts)."""
        return not (self.output.endswith("/") or os.path.isdir(self.output))

    @property
    def parts(self) -> str:
        """The directory the job writes its parts and ledger to."""
        return self.output + STATE_SUFFIX if self.single_file else self.output

    def job(self) -> Job:
        """The batch as a chute job."""
        source = OpenAIBatchSource(self.input, unit_rows=self.requests_per_unit)
        options = dict(self.options)
        urls = set(source.table.column("url").to_pylist())
        if "task" not in options and urls == {EMBEDDINGS}:
            options["task"] = "embed"  # as vllm run-batch: a file of embeddings requests
        spec: Any = adapter("vllm", path=self.model, **options)
        model = Model(MODEL, spec, inputs=("custom_id", "url", "body"))
        if self.batch_size is not None:
            model = replace(model, batch_size=BatchSize(rows=self.batch_size))
        return Job(
            source=source,
            models=(model,),
            # A file a unit: answers cost seconds of generation each, so a unit commits as
            # it finishes instead of waiting for others to fill a shared file.
            output=Sink(self.parts, "openai-batch", file_rows=self.requests_per_unit),
            engine=self.engine,
        )


def from_flags(
    input_file: str,
    output_file: str,
    model: str,
    engine: str = "auto",
    requests_per_unit: int = REQUESTS_PER_UNIT,
    batch_size: int | None = None,
    **flags: Any,
) -> BatchRun:
    """A :class:`BatchRun` from the command line's flags (``None`` means not given)."""
    options = {k: v for k, v in flags.items() if v is not None and v is not False}
    return BatchRun(input_file, output_file, model, options, engine, requests_per_unit, batch_size)


def run_batch(batch: BatchRun, progress: bool = True, overwrite: bool = False) -> Report:
    """Run the batch (resuming what an earlier run committed); assemble a single file."""
    _check_output(batch)
    job = batch.job()
    report = job.run(progress=progress, overwrite=overwrite)
    if batch.single_file:
        assert isinstance(job.source, OpenAIBatchSource)
        assemble(batch.parts, batch.output, job.source.table.num_rows)
    return report


def _check_output(batch: BatchRun) -> None:
    """Refuse an output file that is one of the input files: the answers, put in place at
    the end, would replace the requests."""
    if not batch.single_file:
        return
    out_fs, out = resolve(batch.output)
    for path in input_files([batch.input]):
        fs, where = resolve(path)
        if fs.type_name == out_fs.type_name and _same_file(where, out, fs):
            raise ConfigError(
                f"run-batch: the output {batch.output!r} is the input file {path!r}: its "
                "requests would be replaced by the answers. Write the answers to another file."
            )


def _same_file(a: str, b: str, fs: pafs.FileSystem) -> bool:
    if is_local(fs):
        return os.path.realpath(a) == os.path.realpath(b)
    return a == b


COPY_CHUNK = 8 * 1024 * 1024
"""Bytes read from a part at a time while the single output file is assembled."""


def assemble(parts: str, output: str, requests: int) -> None:
    """Join the parts' lines in input order into ``output``, put in place at once."""
    fs, root = resolve(parts)
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=False))
    parts_of = [i.path for i in infos if i.is_file and PART_NAME.fullmatch(i.base_name)]
    # in input order: by unit, then first row, as numbers (part-1000000 after part-999999)
    names = sorted(parts_of, key=lambda p: [int(n) for n in p.rsplit("/", 1)[-1].split("-")[1:3]])

    def copy(out: pa.NativeFile) -> None:
        """Part by part (a local file never holds the whole in memory), counting lines:
        a count that is not the requests' leaves nothing in place."""
        lines = 0
        for name in names:
            with fs.open_input_stream(name) as stream:
                while chunk := stream.read(COPY_CHUNK):
                    lines += chunk.count(b"\n")
                    out.write(chunk)
        if lines != requests:
            raise JobStateError(
                f"{parts} holds {lines} answer lines for {requests} requests: it was "
                "changed by hand. Run again with --overwrite to answer every request afresh."
            )

    out_fs, target = resolve(output)
    put(out_fs, target, copy)
