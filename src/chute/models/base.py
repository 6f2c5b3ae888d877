"""The small protocol every built-in adapter follows: load once, predict a batch.

An adapter is a class. A model stage builds it once per replica (a thread on the local
engine, an actor on Ray) with the replica's :class:`ReplicaContext` and the options the
job gave (``path``, ``method``, ...), then calls it with Arrow tables of the model's input
columns. It returns a mapping of output column (without the model-name prefix) to values.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa

from chute.job import Resources


@dataclass(frozen=True)
class ReplicaContext:
    """What a replica knows about where it runs."""

    model: str
    """The model's name, for messages."""
    resources: Resources = field(default_factory=Resources)
    """The resources reserved for this replica (its CPUs and GPUs)."""
    gpu: int | None = None
    """The GPU this replica uses on the local engine, which spreads replicas over the
    machine's GPUs; ``None`` on Ray, where the replica sees only the GPU Ray gave it."""
    planned_threads: int | None = None
    """Intra-op threads the engine planned for this replica from the cluster (see
    :func:`chute.engines.resources.plan_threads`); ``None``: from its CPUs."""

    @property
    def device(self) -> str:
        """``"cuda"`` (``"cuda:<gpu>"`` locally) when the replica holds a GPU, else ``"cpu"``."""
        if self.resources.gpus <= 0:
            return "cpu"
        return "cuda" if self.gpu is None else f"cuda:{self.gpu}"

    @property
    def threads(self) -> int:
        """Intra-op threads: as planned by the engine, else matched to the replica's CPUs
        (at least one)."""
        if self.planned_threads is not None:
            return max(1, self.planned_threads)
        cpus = self.resources.cpus if self.resources.cpus is not None else os.cpu_count() or 1
        return max(1, int(cpus))


THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
"""What BLAS and OpenMP libraries read, once, when they load."""


def limit_threads(threads: int) -> None:
    """Give this process's numeric libraries ``threads`` intra-op threads: the variables
    that libraries loaded later read, and torch's setting if torch is loaded (a user's
    class that uses torch, but never sets its threads, runs on what Ray gave an actor:
    ``OMP_NUM_THREADS=1`` for one CPU or less)."""
    for name in THREAD_VARIABLES:
        os.environ[name] = str(threads)
    torch_threads(threads)


def torch_threads(threads: int) -> None:
    """torch's intra-op threads for the calling thread, if torch is loaded. torch keeps
    the setting per thread (OpenMP's, and MKL's with it): a thread that never set it takes
    the last value set anywhere, the first time it computes. So each model's replica sets
    its own on the thread that calls it, and two models in one process keep their own."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


MALLOC_MMAP_THRESHOLD = 32 * 1024 * 1024
"""Buffers up to this size come from malloc's heaps, to be reused (glibc's largest)."""
MALLOC_TRIM_THRESHOLD = 2 * MALLOC_MMAP_THRESHOLD
"""Free memory a heap keeps for reuse before it gives memory back (glibc's own rule)."""
_malloc_tuned = False


def keep_freed_memory() -> None:
    """Let glibc's malloc keep the big buffers a model frees, to reuse for the next batch
    (once per process; ``CHUTE_MALLOC_TUNING=0`` leaves malloc as it is). The Ray engine's
    replicas call it in Ray's worker processes, the local engine when a run starts.

    glibc maps a buffer above its threshold (128 KiB at first) from the kernel and unmaps
    it when freed, so each batch's arrays (numpy's, torch's tensors) are mapped and
    faulted in afresh, page by page. glibc raises the threshold by itself as big buffers
    are freed, up to 32 MiB; these settings start from there (32 MiB, and 64 MiB of free
    memory a heap keeps before it gives any back). Measured on the MLP example (1 M rows,
    4 MiB batches, 27 MiB of activations a call), medians of 5 in fresh processes: on Ray,
    where the model runs on the worker's main thread, 0.25 s → 0.19 s a run; on the local
    engine, whose models run on threads, 0.29–0.37 s → 0.24–0.25 s, and the taxi job at
    10x its rows 1.96–2.21 s → 1.72–1.78 s (the tip model's NumPy arrays), with the same
    peak memory (``benchmarks/RESULTS.md``, 2026-11-27 22:22). glibc would raise its
    threshold so far by itself once it unmapped a buffer of 32 MiB; a thread's heap only
    keeps what its own frees give it, so without the setting a model thread maps its
    activations afresh for most batches of a run. The cost: up to 64 MiB of free memory
    held per heap. Arrow's buffers come from its own allocator and are not affected; nor
    is a C library other than glibc.
    """
    global _malloc_tuned
    if _malloc_tuned or os.environ.get("CHUTE_MALLOC_TUNING") == "0":
        return
    _malloc_tuned = True
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # pragma: no cover - a libc without mallopt
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    mallopt(m_mmap_threshold, MALLOC_MMAP_THRESHOLD)
    mallopt(m_trim_threshold, MALLOC_TRIM_THRESHOLD)


ROW = "__chute_row"
"""A column holding each row's place in the input (``unit << 40 | row``: the same for the
same row in every run), handed to adapters whose class sets ``wants_rows = True``."""

PREPARED = "__chute_prepared_"
"""Prefix of the columns an adapter's :meth:`Adapter.preparer` step added."""


def prepared_columns(batch: pa.Table) -> dict[str, pa.Array] | None:
    """The columns a preparer made for this batch (without the prefix), or ``None`` where
    any row is not prepared: the model stage joins batches whose step failed (passed on
    without these columns) with prepared ones, and the join fills their columns with nulls,
    which a model took for empty inputs (zero tokens: another row's prediction). A preparer
    never makes a null (it raises instead), so the adapter prepares such a batch itself."""
    found = {
        name[len(PREPARED) :]: batch.column(name).combine_chunks()
        for name in batch.column_names
        if name.startswith(PREPARED)
    }
    if any(column.null_count for column in found.values()):
        return None
    return found or None


def unprepared(batch: pa.Table) -> pa.Table:
    """``batch`` without the columns a preparer made: what the adapter prepares itself."""
    return batch.drop_columns([n for n in batch.column_names if n.startswith(PREPARED)])


class Adapter:
    """Base class of built-in adapters; subclasses load in ``__init__`` and map in ``__call__``.

    >>> class Double(Adapter):
    ...     kind = "double"
    ...     def __call__(self, batch):
    ...         return {"value": batch.column(0).to_numpy() * 2}
    """

    kind: ClassVar[str] = ""
    """The name jobs use for it: ``model: {type: <kind>, ...}``."""
    extra: ClassVar[str | None] = None
    """The pip extra that installs its framework: ``pip install 'chute[<extra>]'``."""
    wants_rows: ClassVar[bool] = False
    """Whether batches carry the :data:`ROW` column (rows named by place, for seeds)."""
    auto_batch_rows: ClassVar[int | None] = None
    """What ``batch_size: auto`` (the default) means for this adapter: ``None``, measured
    toward a latency and memory target (:mod:`chute.stages.batching`); a number of rows,
    that size fixed, for an engine that schedules its own batches and wants many rows at
    once (vLLM, an OpenAI-compatible server)."""
    fuses: ClassVar[bool] = True
    """Whether, on Ray, a replica may run inside the read tasks (one per worker process)
    when the job asks for no pool or resources. ``False`` for an adapter that serves from
    processes or connections of its own, whose number a pool must bound (vLLM, an
    OpenAI-compatible server's client)."""

    def __init__(self, context: ReplicaContext, **options: Any) -> None:
        self.context = context
        self.options = options

    def __call__(self, batch: pa.Table) -> Mapping[str, Any]:
        raise NotImplementedError

    def take_counters(self) -> dict[str, float]:
        """What the adapter counted since the last call (an LLM's ``prompt_tokens``,
        ``generated_tokens``, ``requests``, ``finish/<reason>``, ``error/<kind>``), reset.
        The stage calls it after every batch; the report and the progress line sum them
        over the replicas (see :func:`chute.report.counter_lines`). Default: nothing."""
        return {}

    @classmethod
    def plan_notes(
        cls, options: Mapping[str, Any], sample: pa.Table, rows: int | None
    ) -> list[str]:
        """What ``chute plan`` can say from a sample of the model's input rows (``rows``: the
        input's rows in all, when known), without loading the model: an LLM's prompt
        tokens, for one. Default: nothing."""
        return []

    @classmethod
    def check(cls, options: Mapping[str, Any]) -> None:
        """Refuse bad options before anything runs (planning, ``chute validate``). By default:
        a ``path`` that is a pickle, unless ``trust_pickle: true`` (see :mod:`.pickles`)."""
        from chute.models.pickles import refuse_untrusted

        if isinstance(options.get("path"), str):
            refuse_untrusted(cls.kind, options["path"], options)

    @classmethod
    def list_outputs(cls, options: Mapping[str, Any]) -> list[str]:
        """Output columns (unprefixed, after ``outputs:`` renames) that hold lists or tensors
        whatever the model file says: the plan refuses them for CSV output. Default: none
        known before the model loads."""
        return []

    @classmethod
    def preparer(cls, model: str, options: Mapping[str, Any]) -> Callable[[pa.Table], Any] | None:
        """A CPU step (tokenization, image decoding) that chute runs before the model stage,
        on CPU workers, so that GPU replicas get tensors. It maps the model's input columns
        to named columns, which the adapter then finds with :func:`prepared_columns`. It
        must be picklable; ``None`` (the default) means the adapter has none."""
        return None

    @classmethod
    def artifacts(cls, options: Mapping[str, Any]) -> Sequence[str]:
        """The files the adapter loads, so that a changed artifact makes a changed job."""
        path = options.get("path")
        return [str(path)] if path else []
