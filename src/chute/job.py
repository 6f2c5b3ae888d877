"""The job: what to read, which models to run, what to carry and where to write.

Every piece is a small frozen value validated when it is built, so a bad job fails
before anything is read. ``chute.Job.run()`` hands the job to the runner.
"""

from __future__ import annotations

import hashlib
import json
import marshal
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from math import inf
from typing import TYPE_CHECKING, Any, Literal

from chute.errors import ConfigError
from chute.usercode import code_files

if TYPE_CHECKING:
    from chute.sources import Source
    from chute.storage import StorageOptions

BatchFormat = Literal["pyarrow", "pandas", "numpy"]
BATCH_FORMATS: tuple[str, ...] = ("pyarrow", "pandas", "numpy")
OutputFormat = Literal["parquet", "csv", "jsonl"]
OUTPUT_FORMATS: tuple[str, ...] = ("parquet", "csv", "jsonl")
EngineName = Literal["auto", "local", "ray"]
OnError = Literal["fail", "quarantine"]
OnBadInput = Literal["fail", "skip"]
ON_ERROR: tuple[str, ...] = ("fail", "quarantine")
ENGINES: tuple[str, ...] = ("auto", "local", "ray")

DEFAULT_BATCH_ROWS = 16_384
AUTO_BATCH_ROWS = 65_536
"""Where ``batch_size: auto`` starts: one read batch; out-of-memory errors halve it."""
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
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
class BatchSize:
    """A batch size in rows, or in bytes of the model's input columns, or ``"auto"``.

    Whatever the size, a model stage that runs out of memory (host ``MemoryError``, CUDA
    out of memory) splits the batch in half and retries, and keeps the smaller size for that
    replica. ``"auto"`` starts large (:data:`AUTO_BATCH_ROWS` rows) and relies on that.

    >>> BatchSize.parse("8MiB")
    BatchSize(rows=None, bytes=8388608, auto=False)
    >>> BatchSize.parse("auto").rows
    65536
    """

    rows: int | None = DEFAULT_BATCH_ROWS
    bytes: int | None = None
    auto: bool = False
    """Start at :data:`AUTO_BATCH_ROWS` rows and let out-of-memory splits find the size."""

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
            return cls(rows=AUTO_BATCH_ROWS, auto=True)
        if value.strip().isdigit():
            return cls(rows=int(value))
        return cls(rows=None, bytes=parse_bytes(value))

    def rows_for(self, bytes_per_row: float) -> int:
        """The batch size in rows, given the average input bytes per row."""
        if self.rows is not None:
            return self.rows
        assert self.bytes is not None
        return max(1, int(self.bytes // max(bytes_per_row, 1.0)))


UserFn = Callable[..., Any] | type | str


@dataclass(frozen=True)
class Model:
    """One model stage: replicas load it once, then map batches to output columns.

    ``fn`` is a function ``batch -> outputs``, a class whose constructor loads the model
    (called once per replica with ``args``/``kwargs``) and whose ``__call__`` maps a batch,
    an object with ``__call__`` (shared once, by reference, on Ray), or an import string
    ``"package.module:attr"`` / ``"path/to/file.py:attr"``.

    Outputs are a dict of columns, a DataFrame, an Arrow table, or one array. They are
    appended as ``<name>_<column>`` (a single array becomes ``<name>``).

    >>> Model("tip", lambda b: {"score": b["passenger_count"]}, inputs=["passenger_count"])
    ... # doctest: +ELLIPSIS
    Model(name='tip', ...)
    """

    name: str
    fn: UserFn
    inputs: tuple[str, ...] | None = None
    """Columns the model sees; ``None`` means every input column (after preprocess)."""
    batch_format: BatchFormat = "pyarrow"
    batch_size: BatchSize = field(default_factory=BatchSize)
    resources: Resources = field(default_factory=Resources)
    pool: Pool = field(default_factory=Pool)
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    on_error: OnError = "fail"
    """``fail`` stops the job on the first row the model raises on, and shows it;
    ``quarantine`` isolates such rows (bisecting the batch) into the errors dataset."""
    timeout: float | None = None
    """Seconds a replica may take over one batch; ``None`` (the default) waits forever.
    A replica that does not answer in time is replaced by a freshly loaded one and the
    batch retried (twice); then ``on_error`` applies: ``fail`` stops the job naming the
    unit, ``quarantine`` bisects the batch to the rows it hangs on. Not in the job's
    fingerprint: it cannot change a prediction."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "timeout", _check_timeout(self.name, self.timeout))
        if self.on_error not in ON_ERROR:
            raise ConfigError(
                f"model {self.name!r}: on_error {self.on_error!r} is not one of "
                f"{', '.join(ON_ERROR)}."
            )
        if not _NAME.match(self.name):
            raise ConfigError(
                f"model name {self.name!r} must be an identifier (letters, digits, '_'): "
                "it prefixes the output columns."
            )
        if self.batch_format not in BATCH_FORMATS:
            raise ConfigError(
                f"model {self.name!r}: batch_format {self.batch_format!r} is not one of "
                f"{', '.join(BATCH_FORMATS)}."
            )
        if self.inputs is not None:
            object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "batch_size", BatchSize.parse(self.batch_size))
        object.__setattr__(self, "args", tuple(self.args))


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


def _check_timeout(model: str, timeout: object) -> float | None:
    """A model's timeout as seconds (a number > 0), or ``None``."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < inf:
        raise ConfigError(
            f"model {model!r}: timeout must be a number of seconds > 0, or None for no "
            f"timeout; got {timeout!r}."
        )
    return float(timeout)


@dataclass(frozen=True)
class Preprocess:
    """A CPU function run on each batch before the models; its columns are added.

    Returned columns with a new name are appended; a returned column that has the name
    of an input column replaces it (carryover columns can never be replaced).
    """

    fn: Callable[..., Any] | str
    inputs: tuple[str, ...] | None = None
    batch_format: BatchFormat = "pyarrow"
    cpus: float = 1.0

    def __post_init__(self) -> None:
        if self.inputs is not None:
            object.__setattr__(self, "inputs", tuple(self.inputs))
        if self.batch_format not in BATCH_FORMATS:
            raise ConfigError(f"preprocess batch_format {self.batch_format!r} is not valid.")


@dataclass(frozen=True)
class Sink:
    """Where and how results are written: part files under ``path``."""

    path: str
    format: OutputFormat = "parquet"
    storage: StorageOptions | None = None
    """How to reach remote storage (endpoint, region, anonymous); never credentials.
    The endpoint is taken from ``AWS_ENDPOINT_URL(_S3)`` here, on the driver."""

    def __post_init__(self) -> None:
        from chute.storage import StorageOptions

        object.__setattr__(self, "storage", (self.storage or StorageOptions()).with_env())
        if self.format not in OUTPUT_FORMATS:
            raise ConfigError(
                f"output format {self.format!r} is not one of {', '.join(OUTPUT_FORMATS)}."
            )


@dataclass(frozen=True)
class JobSpec:
    """What a batch-inference job is: source, models, carryover, metrics, output.

    Plain data, validated when built; :class:`chute.Job` adds ``run()``. Planning and the
    engines see only this.
    """

    source: Source
    models: tuple[Model, ...]
    output: Sink | None = None
    """``None`` keeps the result in memory (``predict``); otherwise part files are written."""
    carryover: tuple[str, ...] = ()
    """Columns copied untouched into the output; ``("*",)`` means every input column."""
    preprocess: Preprocess | None = None
    engine: EngineName = "auto"
    address: str | None = None
    """A Ray cluster address; implies the ray engine."""
    metrics: tuple[Any, ...] = ()
    """:class:`chute.metrics.Metric` objects computed in the same pass, reported per model."""
    on_bad_input: OnBadInput = "fail"
    """``fail`` stops on an unreadable or drifted input unit, naming it; ``skip`` leaves it
    out and lists it in the report."""
    runtime_env: Mapping[str, Any] = field(default_factory=dict)
    """Ray's runtime environment for the job's workers when chute starts or joins Ray
    (``working_dir``, ``pip``, ``env_vars``, ...): how a job's own code reaches a cluster.
    Job files set ``working_dir`` to their directory when they name code that lives there."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "runtime_env", dict(self.runtime_env))
        object.__setattr__(self, "models", tuple(self.models))
        object.__setattr__(self, "carryover", tuple(self.carryover))
        object.__setattr__(self, "metrics", tuple(self.metrics))
        if self.on_bad_input not in ("fail", "skip"):
            raise ConfigError(f"on_bad_input {self.on_bad_input!r} is not one of fail, skip.")
        if self.engine not in ENGINES:
            raise ConfigError(f"engine {self.engine!r} is not one of {', '.join(ENGINES)}.")
        names = [m.name for m in self.models]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError(f"model names must be unique; repeated: {', '.join(dupes)}.")

    def describe(self) -> dict[str, Any]:
        """What determines the output, as plain data (kept in the ledger)."""
        return {
            "source": self.source.describe(),
            "models": [_describe_model(m) for m in self.models],
            "carryover": list(self.carryover),
            "preprocess": _fn_name(self.preprocess.fn) if self.preprocess else None,
            "format": self.output.format if self.output else None,
            "on_bad_input": self.on_bad_input,
            "metrics": [repr(m) for m in self.metrics],
            "code": self._code(),
        }

    def _code(self) -> dict[str, dict[str, str]]:
        """The source files of the user code each part names (:func:`code_files`), by the
        part's key: ``models[0].fn``, ``models[0].module``, ``preprocess.fn``, ``metrics[1]``."""
        parts: dict[str, Any] = {}
        for i, model in enumerate(self.models):
            options = getattr(model.fn, "options", None)
            if type(model.fn).__name__ == "AdapterSpec" and isinstance(options, Mapping):
                parts[f"models[{i}].module"] = options.get("module")
            else:
                parts[f"models[{i}].fn"] = model.fn
        if self.preprocess is not None:
            parts["preprocess.fn"] = self.preprocess.fn
        for i, metric in enumerate(self.metrics):
            parts[f"metrics[{i}]"] = _metric_code(metric)
        found = {key: code_files(target) for key, target in parts.items() if target is not None}
        return {key: files for key, files in found.items() if files}

    def fingerprint(self) -> str:
        """A stable hash of :meth:`describe`: a changed job gets another one."""
        return fingerprint_of(self.describe())


def fingerprint_of(description: Mapping[str, Any]) -> str:
    """The fingerprint of a job's :meth:`JobSpec.describe` (computed once per run: describing
    hashes in-memory data and constructor arguments)."""
    blob = json.dumps(description, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _metric_code(metric: Any) -> Any:
    """The user's own class inside a (sliced, adapted) metric: its code is what counts."""
    for attribute in ("metric", "inner"):  # Sliced wraps a metric; Custom adapts an object
        if type(metric).__module__.startswith("chute.") and hasattr(metric, attribute):
            return _metric_code(getattr(metric, attribute))
    return metric


def describe_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """What differs between two :meth:`JobSpec.describe` results, naming the model, field
    and source file: ``models[0].fn (model.py), carryover``."""
    changes: list[str] = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if old == new:
            continue
        if key == "code" and isinstance(old, Mapping) and isinstance(new, Mapping):
            changes += _code_changes(old, new)
        elif key == "models" and isinstance(old, list) and isinstance(new, list):
            changes += _model_changes(old, new)
        else:
            changes.append(key)
    named = [c for c in changes if not any(o.startswith(f"{c} (") for o in changes)]
    return ", ".join(named) or "the job description"


def _code_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """``models[0].fn (model.py, helpers.py)``: each part whose source files differ."""
    changes = []
    for part in sorted(set(old) | set(new)):
        files_old, files_new = old.get(part) or {}, new.get(part) or {}
        files = sorted(f for f in {*files_old, *files_new} if files_old.get(f) != files_new.get(f))
        if files:
            changes.append(f"{part} ({', '.join(files)})")
    return changes


def _model_changes(old: list[Any], new: list[Any]) -> list[str]:
    """``models[1].kwargs``: each field of each model that differs."""
    if len(old) != len(new) or not all(isinstance(m, Mapping) for m in [*old, *new]):
        return ["models"]
    return [
        f"models[{i}].{field}"
        for i, (a, b) in enumerate(zip(old, new, strict=True))
        for field in sorted(set(a) | set(b))
        if a.get(field) != b.get(field)
    ]


def _fn_name(fn: Any) -> str:
    """The function's import name and a hash of its code, so an edited model is a new job."""
    if isinstance(fn, str):
        return fn
    if type(fn).__name__ == "AdapterSpec":
        return _adapter_name(fn)
    named = isinstance(fn, type) or (callable(fn) and hasattr(fn, "__qualname__"))
    target = fn if named else type(fn)
    name = f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', repr(target))}"
    return f"{name}#{_code_hash(target)}"


_NOT_OUTPUT = frozenset({"trust_pickle"})
"""Adapter options that permit a load but cannot change a prediction: not in the fingerprint."""


def _adapter_name(spec: Any) -> str:
    """A built-in adapter: its kind, options and the identity of the artifacts it loads."""
    from chute.artifacts import identity

    options = {k: _short_repr(v) for k, v in sorted(spec.options.items()) if k not in _NOT_OUTPUT}
    artifacts = [identity(path) for path in spec.load_class(check=False).artifacts(spec.options)]
    blob = json.dumps([options, artifacts], sort_keys=True).encode()
    return f"adapter:{spec.kind}#{hashlib.sha256(blob).hexdigest()[:12]}"


def _code_hash(target: Any) -> str:
    """Hash the bytecode of a function, or of every function a class defines."""
    codes = (
        [target.__code__]
        if hasattr(target, "__code__")
        else [
            member.__code__
            for klass in getattr(target, "__mro__", ())[:-1]
            for member in vars(klass).values()
            if hasattr(member, "__code__")
        ]
    )
    digest = hashlib.sha256()
    for code in codes:
        digest.update(marshal.dumps(code))
    return digest.hexdigest()[:12]


def _describe_model(model: Model) -> dict[str, Any]:
    return {
        "name": model.name,
        "fn": _fn_name(model.fn),
        "inputs": list(model.inputs) if model.inputs is not None else None,
        "batch_format": model.batch_format,
        "on_error": model.on_error,
        "args": [_short_repr(a) for a in model.args],
        "kwargs": {k: _short_repr(v) for k, v in sorted(model.kwargs.items())},
    }


HASHED_ARRAY_BYTES = 64 * 2**20
"""Arrays and tensors in constructor arguments up to this size are hashed by content (a
state dict's weights); bigger payloads are described by shape and dtype only."""


def _short_repr(value: Any) -> str:
    """A cheap description of a constructor argument: small arrays by content, big ones by
    shape, mappings and sequences item by item."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k!r}: {_short_repr(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)) and len(value) <= 1000:
        return "[" + ", ".join(_short_repr(v) for v in value) + "]"
    shape = getattr(value, "shape", None)
    if shape is not None:
        return (
            f"{type(value).__name__}{tuple(shape)}:{getattr(value, 'dtype', '')}{_content(value)}"
        )
    text = repr(value)
    return text if len(text) <= 200 else f"{type(value).__name__}@{len(text)}"


def _content(array: Any) -> str:
    """``#<hash>`` of an array's or tensor's bytes when it is small enough, else ``""``."""
    import numpy as np

    nbytes = getattr(array, "nbytes", None)
    if not isinstance(nbytes, int) or nbytes > HASHED_ARRAY_BYTES:
        return ""
    if hasattr(array, "detach"):
        import torch  # a torch tensor: its raw bytes (NumPy has no bfloat16)

        array = array.detach().cpu().contiguous().flatten().view(torch.uint8).numpy()
    elif not isinstance(array, np.ndarray):
        return ""
    raw = np.ascontiguousarray(array).view(np.uint8)
    return "#" + hashlib.blake2b(raw.data, digest_size=8).hexdigest()
