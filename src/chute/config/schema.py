"""The keys a job file may have (pydantic models), and its problems named by key."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from chute import engines
from chute.errors import did_you_mean

Format = Literal["parquet", "csv", "jsonl", "openai-batch", "iceberg", "delta", "lance"]
Fmt = Literal["pyarrow", "pandas", "numpy"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ResourcesConfig(_Strict):
    cpus: float | None = Field(default=None, gt=0)
    gpus: float = Field(default=0.0, ge=0)
    memory: int | str | None = None


class PoolConfig(_Strict):
    min: int = Field(default=1, ge=1)
    max: int | None = Field(default=None, ge=1)


class ModelConfig(_Strict):
    name: str
    fn: str | None = None
    model: dict[str, Any] | None = None
    """A built-in adapter: ``{type: onnx, path: model.onnx, ...options}``."""
    inputs: list[str] | None = None
    batch_format: Fmt = "pyarrow"
    batch_size: int | str = "auto"
    resources: ResourcesConfig = ResourcesConfig()
    pool: PoolConfig = PoolConfig()
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    on_error: Literal["fail", "quarantine"] = "fail"
    timeout: Any = None
    """Seconds per batch (``30``, ``"30s"``, ``"5m"``); none by default. Parsed by
    :func:`~chute.job.parse_seconds`, whose error names the key."""


class PreprocessConfig(_Strict):
    fn: str
    inputs: list[str] | None = None
    batch_format: Fmt = "pyarrow"
    cpus: float | None = Field(default=None, gt=0)


class InputConfig(_Strict):
    path: str | list[str]
    format: Literal["parquet", "csv", "jsonl", "images", "openai-batch"] | None = None
    column_types: dict[str, str] | None = None
    """CSV and JSON Lines only: a type per column (``{zip: string}``) over the inferred one."""
    size: list[int] | None = None
    """Images only: ``[height, width]`` to resize every image to (:mod:`chute.sources.images`)."""
    mode: Literal["RGB", "L"] | None = None
    """Images only: ``RGB`` or ``L`` (grayscale)."""


class IndexConfig(_Strict):
    """A vector index built at the end of a run (lance tables)."""

    column: str
    type: str = "ivf_pq"
    metric: Literal["l2", "cosine", "dot"] = "l2"
    num_partitions: int | None = Field(default=None, ge=1)
    num_sub_vectors: int | None = Field(default=None, ge=1)


class OutputConfig(_Strict):
    path: str | None = None
    """A directory, or a Delta/Lance table's location (an Iceberg table's is its catalog's)."""
    format: Format = "parquet"
    table: str | None = None
    """Iceberg: ``namespace.name`` in the catalog."""
    catalog: dict[str, Any] = {}
    """Iceberg: the catalog's properties (``type: sql``, ``uri``, ``warehouse``, ...)."""
    sort_by: list[str] = []
    partition_by: list[str] = []
    """A new table's partitions: columns (Iceberg, Delta) or Iceberg transforms such as
    ``day(pickup_at)``."""
    index: IndexConfig | None = None
    commit_seconds: float = Field(default=5.0, ge=0)
    file_size: int | str | None = None
    """The target size of a data file: ``128MiB`` (the default) or bytes; checked by
    :class:`~chute.job.FileTarget`, whose error names the key."""
    file_rows: int | None = Field(default=None, ge=1)
    """At most this many rows a data file, as well."""


class StorageConfig(_Strict):
    """How to reach remote storage (input and output). No credentials here: they come
    from the standard chain (environment, ~/.aws files, instance roles)."""

    endpoint_url: str | None = None
    region: str | None = None
    anonymous: bool = False
    retries: int = Field(default=6, ge=1)
    connect_timeout: float | None = Field(default=None, gt=0)
    request_timeout: float | None = Field(default=None, gt=0)
    options: dict[str, Any] = {}


class JobConfig(_Strict):
    input: InputConfig
    models: list[ModelConfig] = Field(min_length=1)
    carryover: list[str] = []
    preprocess: PreprocessConfig | None = None
    output: OutputConfig
    engine: str = "auto"
    """``auto`` or a registered engine (:data:`chute.engines.ENGINES`)."""
    address: str | None = None
    on_bad_input: Literal["fail", "skip"] = "fail"
    max_failed_fraction: float = 0.5
    metrics: list[dict[str, Any]] = []
    """Each ``{type: auc_roc, label: …, score: …, by: …}``; see :mod:`chute.metrics`."""
    storage: StorageConfig = StorageConfig()
    runtime_env: dict[str, Any] = {}
    """Ray's runtime environment; ``working_dir`` defaults to the job file's directory when
    the job names code that lives there (``working_dir: null`` ships nothing)."""

    @field_validator("carryover", mode="before")
    @classmethod
    def _one_name(cls, value: Any) -> Any:
        """``carryover: "*"`` (every column) or ``carryover: id``: one name is a list of one."""
        return [value] if isinstance(value, str) else value

    @field_validator("engine")
    @classmethod
    def _registered(cls, name: str) -> str:
        allowed = (engines.AUTO, *engines.names())
        if name not in allowed:
            hint = did_you_mean(name, allowed)
            raise PydanticCustomError("engine", f"not one of {', '.join(allowed)}.{hint}")
        return name


def format_errors(exc: ValidationError) -> str:
    """One line per problem: the key's path, what is wrong and what is allowed."""
    lines = [f"the job file has {exc.error_count()} problem(s):"]
    for error in exc.errors():
        loc = _loc(error["loc"])
        if error["type"] == "extra_forbidden":
            lines.append(f"  {loc}: unknown key.{_known_keys(error['loc'])}")
        elif error["type"] == "missing":
            lines.append(f"  {loc}: required key is missing.")
        else:
            lines.append(f"  {loc}: {error['msg']} (got {error.get('input')!r}).")
    return "\n".join(lines)


def _loc(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int) and not isinstance(item, bool) and parts:
            parts[-1] = f"{parts[-1]}[{item}]"
        else:  # a key that is not text (``5: x``, ``true: x`` at the top): no list to index
            parts.append(str(item) if isinstance(item, str) else f"key {item!r}")
    return ".".join(parts) or "(top level)"


def _known_keys(loc: tuple[int | str, ...]) -> str:
    schema: type[BaseModel] | None = JobConfig
    for item in loc[:-1]:
        if schema is None or isinstance(item, int):
            continue
        field = schema.model_fields.get(str(item))
        schema = _model_of(field.annotation) if field else None
    if schema is None:
        return ""
    allowed = list(schema.model_fields)
    return f"{did_you_mean(str(loc[-1]), allowed)} Allowed keys: {', '.join(allowed)}."


def _model_of(annotation: Any) -> type[BaseModel] | None:
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        inner = getattr(candidate, "__args__", None)
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
        for arg in inner or ():
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                return arg
    return None
