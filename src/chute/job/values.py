"""The small values a job is made of: sizes, durations, resources, pools and batch sizes,
each validated when it is built."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from math import inf
from typing import Any, Literal

from chute.errors import ConfigError

BatchFormat = Literal["pyarrow", "pandas", "numpy"]
BATCH_FORMATS: tuple[str, ...] = ("pyarrow", "pandas", "numpy")
OutputFormat = Literal["parquet", "csv", "jsonl", "openai-batch"]
OUTPUT_FORMATS: tuple[str, ...] = ("parquet", "csv", "jsonl", "openai-batch")
EngineName = str
"""``auto`` or a registered engine's name (:data:`chute.engines.ENGINES`), checked when
the job runs or is planned."""
OnError = Literal["fail", "quarantine"]
OnBadInput = Literal["fail", "skip"]
ON_ERROR: tuple[str, ...] = ("fail", "quarantine")

DEFAULT_BATCH_ROWS = 16_384
"""The rows of ``BatchSize()``, and what ``auto`` means for an adapter whose engine
schedules its own batches (vLLM, an OpenAI-compatible server)."""
AUTO_BATCH_ROWS = 1_024
"""Where ``batch_size: auto`` starts (fewer when its memory cap says so); it then moves
toward :class:`BatchTarget` (see :mod:`chute.stages.batching`)."""
AUTO_MAX_ROWS = 65_536
"""The largest batch ``auto`` grows to: one read batch."""
AUTO_MEMORY = 64 * 2**20
"""Bytes of Arrow input and output one ``auto`` batch may hold."""
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B)\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS.update({"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40})


def parse_bytes(value: str | int) -> int:
    """Parse ``"64MiB"``, ``"1.5GB"`` or an int into a number of bytes.

    >>> parse_bytes("2KiB")
    2048
    """
    if isinstance(value, int):
        return value
    match = _SIZE.match(value)
    if not match:
        raise ConfigError(f"cannot read {value!r} as a size: write it like '64MiB' or '1GB'.")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def show_bytes(size: float) -> str:
    """``"64 MiB"``, ``"4 KiB"``, ``"512 bytes"``.

    >>> show_bytes(3 * 2**20)
    '3 MiB'
    """
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            value = size / scale  # three digits, never as 1.02e+03
            return f"{value:,.0f} {unit}" if value >= 100 else f"{value:.3g} {unit}"
    return f"{size:,.0f} bytes"


@dataclass(frozen=True)
class Resources:
    """What one replica of a stage needs.

    >>> Resources(gpus=0.5)
    Resources(cpus=None, gpus=0.5, memory=None)
    """

    cpus: float | None = None
    """CPUs per replica; ``None`` lets the engine plan it (never more than the machine has)."""
    gpus: float = 0.0
    """GPUs per replica; fractions let several replicas share one GPU."""
    memory: int | None = None
    """Bytes of memory reserved per replica, so concurrency is bounded by memory."""

    def __post_init__(self) -> None:
        if self.cpus is not None and self.cpus <= 0:
            raise ConfigError(f"cpus must be > 0, got {self.cpus}.")
        if self.gpus < 0:
            raise ConfigError(f"gpus must be >= 0, got {self.gpus}.")
        if self.memory is not None and self.memory <= 0:
            raise ConfigError(f"memory must be > 0 bytes, got {self.memory}.")


@dataclass(frozen=True)
class Pool:
    """How many replicas of a model run: a fixed size or an autoscaling range.

    >>> Pool.fixed(2)
    Pool(min=2, max=2)
    """

    min: int = 1
    """Replicas started at once."""
    max: int | None = None
    """Most replicas; ``None`` lets the engine scale as far as resources allow."""

    def __post_init__(self) -> None:
        if self.min < 1:
            raise ConfigError(f"pool min must be >= 1, got {self.min}.")
        if self.max is not None and self.max < self.min:
            raise ConfigError(f"pool max ({self.max}) must be >= pool min ({self.min}).")

    @classmethod
    def fixed(cls, size: int) -> Pool:
        """A pool of exactly ``size`` replicas."""
        return cls(min=size, max=size)


@dataclass(frozen=True)
class BatchTarget:
    """What ``batch_size: auto`` aims for; see :mod:`chute.stages.batching`.

    >>> BatchTarget().describe()
    '0.5–2 s of model time and at most 64 MiB of input and output per batch, at most 65,536 rows'
    """

    low: float = 0.5
    """Seconds per call below which the size grows."""
    high: float = 2.0
    """Seconds per call above which the size shrinks."""
    memory: int = AUTO_MEMORY
    """Bytes of Arrow input and output a call may hold."""
    max_rows: int = AUTO_MAX_ROWS
    """The largest size."""

    @property
    def aim(self) -> float:
        """The seconds a resize aims at: the band's geometric middle (1 s for 0.5–2 s)."""
        return float((self.low * self.high) ** 0.5)

    def within(self, timeout: float | None) -> BatchTarget:
        """The target for a model with a ``timeout``: a call aims at a quarter of it at most."""
        if timeout is None or self.high <= timeout / 4:
            return self
        high = timeout / 4
        return BatchTarget(min(self.low, high / 4), high, self.memory, self.max_rows)

    def describe(self) -> str:
        return (
            f"{self.low:g}–{self.high:g} s of model time and at most {show_bytes(self.memory)} "
            f"of input and output per batch, at most {self.max_rows:,} rows"
        )

    def __post_init__(self) -> None:
        if not 0 < self.low <= self.high < inf:
            raise ConfigError(
                f"batch_size auto: seconds must be two numbers 0 < low <= high, got "
                f"{self.low!r}, {self.high!r}."
            )
        if self.memory <= 0 or self.max_rows <= 0:
            raise ConfigError("batch_size auto: memory and max_rows must be > 0.")


@dataclass(frozen=True)
class BatchSize:
    """A batch size in rows, or in bytes of the model's input columns, or ``"auto"``.

    ``"auto"`` (a model's default) starts at :data:`AUTO_BATCH_ROWS` rows and measures
    every model call, moving toward ``target``: 0.5–2 s of model time and at most 64 MiB of
    input and output per call (see :mod:`chute.stages.batching`). Whatever the size, a
    model stage that runs out of memory (host ``MemoryError``, CUDA out of memory) splits
    the batch in half and retries, then grows back, probing below the size that failed.

    >>> BatchSize.parse("8MiB")
    BatchSize(rows=None, bytes=8388608, auto=False)
    >>> BatchSize.parse("auto").rows
    1024
    >>> BatchSize.adaptive(seconds=(0.1, 0.4)).target.aim
    0.2
    """

    rows: int | None = DEFAULT_BATCH_ROWS
    bytes: int | None = None
    auto: bool = False
    """Start at ``rows`` and move toward ``target``, measuring every model call."""
    target: BatchTarget = field(default_factory=BatchTarget, repr=False)
    """What ``auto`` aims for; unused by a fixed size."""

    def __post_init__(self) -> None:
        if (self.rows is None) == (self.bytes is None):
            raise ConfigError("give a batch size in rows or in bytes, not both or neither.")
        size = self.rows if self.rows is not None else self.bytes
        if size is not None and size <= 0:
            raise ConfigError(f"batch size must be > 0, got {size}.")

    @classmethod
    def parse(cls, value: int | str | BatchSize) -> BatchSize:
        """Rows from an int, bytes from a size string like ``"64MiB"``, or ``"auto"``."""
        if isinstance(value, BatchSize):
            return value
        if isinstance(value, bool):
            raise ConfigError(f"batch size must be rows (an int) or a size string, got {value}.")
        if isinstance(value, int):
            return cls(rows=value)
        if value.strip().lower() == "auto":
            return cls.adaptive()
        if value.strip().isdigit():
            return cls(rows=int(value))
        return cls(rows=None, bytes=parse_bytes(value))

    @classmethod
    def adaptive(
        cls,
        seconds: tuple[float, float] = (0.5, 2.0),
        memory: int | str = AUTO_MEMORY,
        start: int = AUTO_BATCH_ROWS,
        max_rows: int = AUTO_MAX_ROWS,
    ) -> BatchSize:
        """``auto``, aiming for ``seconds`` (low, high) of model time per call and at most
        ``memory`` of Arrow input and output, from ``start`` rows up to ``max_rows``."""
        target = BatchTarget(float(seconds[0]), float(seconds[1]), parse_bytes(memory), max_rows)
        return cls(rows=min(start, max_rows), auto=True, target=target)

    def rows_for(self, bytes_per_row: float) -> int:
        """The batch size in rows, given the average input bytes per row."""
        if self.rows is not None:
            return self.rows
        assert self.bytes is not None
        return max(1, int(self.bytes // max(bytes_per_row, 1.0)))


UserFn = Callable[..., Any] | type | str
"""A model or preprocess: a function, a class, an import string or a built-in adapter."""

_SECONDS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$", re.IGNORECASE)
_SECOND_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_seconds(value: object) -> float:
    """Parse ``30``, ``"30s"``, ``"5m"``, ``"1h"`` or ``"500ms"`` into seconds.

    >>> parse_seconds("5m")
    300.0
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    match = _SECONDS.match(value) if isinstance(value, str) else None
    if not match:
        raise ConfigError(f"cannot read {value!r} as seconds: write it like 30, '30s' or '5m'.")
    return float(match.group(1)) * _SECOND_UNITS[(match.group(2) or "s").lower()]


def check_timeout(model: str, timeout: object) -> float | None:
    """A model's timeout as seconds (a number > 0), or ``None``."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < inf:
        raise ConfigError(
            f"model {model!r}: timeout must be a number of seconds > 0, or None for no "
            f"timeout; got {timeout!r}."
        )
    return float(timeout)
