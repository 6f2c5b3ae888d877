"""The job itself: its models, the preprocess, where it writes, and :class:`JobSpec`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from chute.errors import ConfigError, did_you_mean
from chute.job.fingerprint import (
    describe_metric,
    describe_model,
    describing,
    fingerprint_of,
    fn_name,
    metric_code,
)
from chute.job.values import (
    BATCH_FORMATS,
    NAME,
    ON_ERROR,
    OUTPUT_FORMATS,
    BatchFormat,
    BatchSize,
    EngineName,
    OnBadInput,
    OnError,
    OutputFormat,
    Pool,
    Resources,
    UserFn,
    check_timeout,
    parse_bytes,
)
from chute.usercode import code_files

if TYPE_CHECKING:
    from chute.sources import Source
    from chute.storage import StorageOptions


DEFAULT_FILE_SIZE = 128 * 2**20
"""The default target of an output file: 128 MiB of rows as Arrow holds them in memory."""
MIN_FILE_SIZE = 2**10


TEXT_VERSION = 2
"""How CSV and JSON Lines outputs write values text has no type for (2: durations and
times inside lists and structs as ISO 8601). In the fingerprint of such jobs, so that an
output an earlier chute began is never finished in another way (refused, with the fix)."""


@dataclass(frozen=True)
class FileTarget:
    """How large an output file grows before the writer starts the next one.

    ``bytes`` counts the rows as Arrow holds them in memory (the file on disk is smaller:
    Parquet compresses); ``rows``, when set, caps the rows too. Writers join consecutive
    small pieces, several units' rows among them, into one file up to the target.

    >>> FileTarget.parse("64MiB", None).bytes
    67108864
    """

    bytes: int = DEFAULT_FILE_SIZE
    rows: int | None = None

    @classmethod
    def parse(cls, size: object, rows: object) -> FileTarget:
        """From a job's ``file_size`` (``"128MiB"``, bytes) and ``file_rows`` (rows, or
        ``None``); a bad value is a :class:`~chute.errors.ConfigError` naming the key."""
        return cls(_file_size(size), _file_rows(rows))

    def rows_for(self, nbytes: int, num_rows: int) -> int:
        """How many rows of a table of ``num_rows`` rows and ``nbytes`` bytes fill a file."""
        by_size = self.bytes * num_rows // max(nbytes, 1) if num_rows else self.bytes
        return max(1, min(by_size, self.rows or by_size))

    def describe(self) -> str:
        """``128 MiB`` or ``128 MiB or 100,000 rows``: what ``chute plan`` shows."""
        size = _show_bytes(self.bytes)
        return f"{size} or {self.rows:,} rows" if self.rows else size


def _file_size(value: object) -> int:
    fix = "write it like '128MiB' (the default) or a number of bytes"
    if value is None:
        return DEFAULT_FILE_SIZE
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(f"output file_size {value!r} is not a size: {fix}.")
    try:
        size = parse_bytes(value)
    except ConfigError:
        raise ConfigError(f"output file_size {value!r} is not a size: {fix}.") from None
    if size < MIN_FILE_SIZE:
        raise ConfigError(
            f"output file_size {value!r} is under {MIN_FILE_SIZE} bytes: one file a few rows. "
            f"{fix[0].upper()}{fix[1:]}; to cap rows, set file_rows."
        )
    return size


def _file_rows(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"output file_rows {value!r} is not a positive number of rows: write it like "
            "100000, or leave it out to cut files by file_size only."
        )
    return value


def _show_bytes(value: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size and value % (size // 16) == 0:
            return f"{value / size:g} {unit}"
    return f"{value:,} bytes"


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
    """Columns the model sees; ``None`` means every column of the input as read (a column
    a preprocess step or an earlier model adds reaches a model only by name)."""
    batch_format: BatchFormat = "pyarrow"
    batch_size: BatchSize = field(default_factory=BatchSize.adaptive)
    """Rows per model call: ``auto`` (the default) measures each call and moves toward
    0.5–2 s and 64 MiB a call; a number of rows or a size such as ``"8MiB"`` is kept
    (see :class:`BatchSize`)."""
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
        object.__setattr__(self, "timeout", check_timeout(self.name, self.timeout))
        if self.on_error not in ON_ERROR:
            raise ConfigError(
                f"model {self.name!r}: on_error {self.on_error!r} is not one of "
                f"{', '.join(ON_ERROR)}."
            )
        if not NAME.match(self.name):
            raise ConfigError(
                f"model name {self.name!r} must be an identifier (letters, digits, '_'): "
                "it prefixes the output columns."
            )
        if self.name.startswith("__chute"):
            raise ConfigError(
                f"model name {self.name!r}: names that start with '__chute' are chute's own "
                "(its output columns would be taken for chute's marks of failed rows). "
                "Rename the model."
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
        if type(self.fn).__name__ == "AdapterSpec" and (self.args or self.kwargs):
            raise ConfigError(  # else never passed anywhere: the model ran without them
                f"model {self.name!r}: args/kwargs are the constructor arguments of a class "
                "given as fn; a built-in adapter takes its options in chute.adapter(kind, "
                "path=..., option=...) (in a job file, inside model:)."
            )
        pool: Any = self.pool
        if isinstance(pool, int) and not isinstance(pool, bool) and pool > 0:
            object.__setattr__(self, "pool", Pool.fixed(pool))  # pool=4: four replicas
        elif not isinstance(pool, Pool):
            raise ConfigError(
                f"model {self.name!r}: pool must be a number of replicas or chute.Pool(min=, "
                f"max=), got {pool!r}."
            )


@dataclass(frozen=True)
class Preprocess:
    """A CPU function run on each batch before the models; its columns are added.

    Returned columns with a new name are appended; a returned column that has the name
    of an input column replaces it (carryover columns can never be replaced).
    """

    fn: Callable[..., Any] | str
    inputs: tuple[str, ...] | None = None
    batch_format: BatchFormat = "pyarrow"
    cpus: float | None = None
    """How many batches are preprocessed at once, the same on every engine: unset, one
    beside each read (as parallel as reading); ``n`` ≥ 1, ``n`` at once with a CPU each;
    below 1, one at a time holding that share of a CPU (:class:`chute.plan.PreprocessPlan`)."""

    def __post_init__(self) -> None:
        if self.inputs is not None:
            object.__setattr__(self, "inputs", tuple(self.inputs))
        if self.cpus is not None and (isinstance(self.cpus, bool) or not self.cpus > 0):
            raise ConfigError(f"preprocess cpus must be a number > 0, not {self.cpus!r}.")
        if self.batch_format not in BATCH_FORMATS:
            raise ConfigError(f"preprocess batch_format {self.batch_format!r} is not valid.")


def _describe_preprocess(step: Preprocess | None) -> str | dict[str, Any] | None:
    """The step's function, and its inputs and batch format where they are not the
    defaults: NumPy or pandas batches make an integer column with a null float64, so a
    resume after one changed would mix two kinds of values. (Defaults: the function's name
    alone, as chute always wrote it, so outputs begun before still resume.)"""
    if step is None:
        return None
    if step.inputs is None and step.batch_format == "pyarrow":
        return fn_name(step.fn)
    inputs = list(step.inputs) if step.inputs is not None else None
    return {"fn": fn_name(step.fn), "inputs": inputs, "batch_format": step.batch_format}


@dataclass(frozen=True)
class Sink:
    """Where and how results are written: part files under ``path``."""

    path: str
    format: OutputFormat = "parquet"
    storage: StorageOptions | None = None
    """How to reach remote storage (endpoint, region, anonymous); never credentials.
    The endpoint is taken from ``AWS_ENDPOINT_URL(_S3)`` here, on the driver."""
    file_size: int | str | None = None
    """The target size of a data file (``"128MiB"``, the default, or bytes), counted as
    Arrow holds the rows in memory: writers join small pieces, several units' rows among
    them, into files up to this size (see :class:`~chute.job.values.FileTarget`). Not part
    of the job's fingerprint: a resume may write files of another size."""
    file_rows: int | None = None
    """At most this many rows a data file, as well (none by default)."""

    def __post_init__(self) -> None:
        from chute.storage import StorageOptions

        object.__setattr__(self, "storage", (self.storage or StorageOptions()).with_env())
        object.__setattr__(self, "file_size", self.target.bytes)  # checked, in bytes
        if self.format not in OUTPUT_FORMATS:
            raise ConfigError(
                f"output format {self.format!r} is not one of {', '.join(OUTPUT_FORMATS)}."
            )

    @property
    def target(self) -> FileTarget:
        """The size a data file grows to (``file_size``, ``file_rows``)."""
        return FileTarget.parse(self.file_size, self.file_rows)


def _carryover(columns: Any) -> tuple[str, ...]:
    """The carried columns as names: one name alone is that column (not its letters); a
    name twice would write two columns of one name (files no reader takes); ``*`` is every
    column and stands alone."""
    carry = (columns,) if isinstance(columns, str) else tuple(columns)
    odd = [c for c in carry if not isinstance(c, str) or not c]
    if odd:
        raise ConfigError(f"carryover takes column names, got {odd[0]!r}.")
    twice = sorted({c for c in carry if carry.count(c) > 1})
    if twice:
        raise ConfigError(
            f"carryover names {', '.join(repr(c) for c in twice)} more than once: the output "
            "would have two columns of one name, which readers refuse. Name each column once."
        )
    if "*" in carry and len(carry) > 1:
        raise ConfigError(
            "carryover '*' already means every input column: give '*' alone, or list the "
            "columns to carry."
        )
    return carry


def _check_runtime_env(env: Mapping[str, Any]) -> None:
    """Ray takes a key it does not know for the name of a plugin, and goes on without it:
    ``env_var:`` (for ``env_vars:``) set nothing, and the run was complete. Checked against
    the keys the installed Ray knows."""
    if not env:
        return
    try:
        from ray.runtime_env import RuntimeEnv
    except ImportError:  # no Ray here: the engine that needs it says so
        return
    known = sorted(k for k in RuntimeEnv.known_fields if not k.startswith("_"))
    for key in env:
        if key not in RuntimeEnv.known_fields:
            raise ConfigError(
                f"runtime_env has no key {key!r}.{did_you_mean(key, known)} Ray's keys: "
                f"{', '.join(known)}."
            )


def _check_parts(job: JobSpec) -> None:
    """A part of the wrong kind (a path where a sink goes, a function where a model goes)
    named for what it is, not an AttributeError from deep inside planning."""
    if not (callable(getattr(job.source, "plan", None)) and hasattr(job.source, "schema")):
        raise ConfigError(
            f"source must be a chute source (chute.FileSource('data/'), chute.TableSource"
            f"(table), ...), got {type(job.source).__name__} {job.source!r:.80}."
        )
    for model in job.models:
        if not isinstance(model, Model):
            raise ConfigError(
                f"models must be chute.Model objects, got {type(model).__name__} {model!r:.80}:"
                " wrap it, chute.Model('name', fn)."
            )
    if job.output is not None and not isinstance(job.output, Sink):
        raise ConfigError(
            f"output must be a chute sink (chute.Sink('out/'), a table's sink) or None, got "
            f"{type(job.output).__name__} {job.output!r:.80}."
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
    max_failed_fraction: float = 0.5
    """Under ``on_error: quarantine``, the largest share of a run's rows that the models
    may fail on: past it (once 1,000 rows, or all, are committed) the run stops with a
    :class:`ModelError`, since a model that fails most rows is broken, not its rows. Input
    rows that cannot be decoded (``on_bad_input: skip``) are the input's, not the models':
    they count in neither part of the share. ``1.0`` never stops. Not part of the job's
    identity: changing it resumes the job."""
    runtime_env: Mapping[str, Any] = field(default_factory=dict)
    """Ray's runtime environment for the job's workers when chute starts or joins Ray
    (``working_dir``, ``pip``, ``env_vars``, ...): how a job's own code reaches a cluster.
    Job files set ``working_dir`` to their directory when they name code that lives there."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "runtime_env", dict(self.runtime_env))
        _check_runtime_env(self.runtime_env)
        object.__setattr__(self, "models", tuple(self.models))
        object.__setattr__(self, "carryover", _carryover(self.carryover))
        object.__setattr__(self, "metrics", tuple(self.metrics))
        _check_parts(self)
        if self.on_bad_input not in ("fail", "skip"):
            raise ConfigError(f"on_bad_input {self.on_bad_input!r} is not one of fail, skip.")
        share = self.max_failed_fraction
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
            raise ConfigError(
                f"max_failed_fraction must be a share of the rows above 0 and at most 1 "
                f"(1.0: never stop), got {share!r}."
            )
        if not isinstance(self.engine, str) or not self.engine:
            raise ConfigError(f"engine must be 'auto' or an engine's name, not {self.engine!r}.")
        names = [m.name for m in self.models]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError(f"model names must be unique; repeated: {', '.join(dupes)}.")

    def describe(self) -> dict[str, Any]:
        """What determines the output, as plain data (kept in the ledger)."""
        text = self.output is not None and self.output.format in ("csv", "jsonl")
        describing()  # a budget of bytes hashed whole, for this description
        return {
            **({"text_version": TEXT_VERSION} if text else {}),
            "source": self.source.describe(),
            "models": [describe_model(m) for m in self.models],
            "carryover": list(self.carryover),
            "preprocess": _describe_preprocess(self.preprocess),
            "format": self.output.format if self.output else None,
            "on_bad_input": self.on_bad_input,
            "metrics": [describe_metric(m) for m in self.metrics],
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
            parts[f"metrics[{i}]"] = metric_code(metric)
        found = {key: code_files(target) for key, target in parts.items() if target is not None}
        return {key: files for key, files in found.items() if files}

    def fingerprint(self) -> str:
        """A stable hash of :meth:`describe`: a changed job gets another one."""
        return fingerprint_of(self.describe())
