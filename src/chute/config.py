"""YAML job files → :class:`~chute.job.Job`, with errors that point at the offending key.

Relative paths (input, output, and ``file.py:name`` model references) are resolved
against the directory of the job file, so a job runs the same from any working directory.

.. code-block:: yaml

    input: {path: data/taxi/, format: parquet}
    carryover: [trip_id]
    models:
      - name: tip
        fn: chute.demo:tip_model
        inputs: [passenger_count]
        batch_size: 16384          # rows, or a size such as "8MiB"
        resources: {cpus: 1, gpus: 0, memory: 2GiB}
        pool: {min: 1, max: 4}     # or an int: a fixed size
        timeout: 5m                # per batch; none by default
    output: {path: out/, format: parquet}
"""

from __future__ import annotations

import os
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from chute import engines
from chute.api import Job
from chute.errors import ChuteError, ConfigError, did_you_mean
from chute.job import (
    BatchSize,
    Model,
    Pool,
    Preprocess,
    Resources,
    Sink,
    parse_bytes,
    parse_seconds,
)
from chute.sources import file_source
from chute.storage import StorageOptions
from chute.usercode import add_code_dir

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
    batch_size: int | str = 16_384
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
    index: IndexConfig | None = None
    commit_seconds: float = Field(default=5.0, ge=0)


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
    metrics: list[dict[str, Any]] = []
    """Each ``{type: auc_roc, label: …, score: …, by: …}``; see :mod:`chute.metrics`."""
    storage: StorageConfig = StorageConfig()
    runtime_env: dict[str, Any] = {}
    """Ray's runtime environment; ``working_dir`` defaults to the job file's directory when
    the job names code that lives there (``working_dir: null`` ships nothing)."""

    @field_validator("engine")
    @classmethod
    def _registered(cls, name: str) -> str:
        allowed = (engines.AUTO, *engines.names())
        if name not in allowed:
            hint = did_you_mean(name, allowed)
            raise PydanticCustomError("engine", f"not one of {', '.join(allowed)}.{hint}")
        return name


def load_job(path: str, **overrides: Any) -> Job:
    """Read a YAML job file; ``overrides`` (input, output, batch_size, pool, engine,
    address) replace what the file says."""
    raw = read_yaml(path)
    return job_from_dict(raw, base=os.path.dirname(os.path.abspath(path)), **overrides)


def read_yaml(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            raw = yaml.safe_load(f)
    except FileNotFoundError as exc:
        raise ConfigError(f"job file {path!r} does not exist.") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(yaml_problem(path, exc)) from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"job file {path!r} must be a mapping with input, models and output.")
    return raw


_OPENED = {
    "flow sequence": "the '[' opened",
    "flow mapping": "the '{' opened",
    "quoted scalar": "the quote opened",
}


def yaml_problem(path: str, exc: yaml.YAMLError) -> str:
    """Where the YAML went wrong: for an unclosed bracket or quote, the line that opened
    it (the parser only notices at a later line), else the line of the problem."""
    problem, mark = getattr(exc, "problem", None), getattr(exc, "problem_mark", None)
    context, opened = getattr(exc, "context", None) or "", getattr(exc, "context_mark", None)
    what = next((v for k, v in _OPENED.items() if context.endswith(k)), None)
    if what and opened is not None:
        stopped = f" (the parser stopped at line {mark.line + 1}: {problem})" if mark else ""
        return (
            f"job file {path!r} is not valid YAML: {what} at line {opened.line + 1}, column "
            f"{opened.column + 1} is never closed{stopped}.\n{_snippet(path, opened)}"
            "Close it on that line, or quote the value."
        )
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return f"job file {path!r} is not valid YAML{where}: {exc}"


def _snippet(path: str, mark: Any) -> str:
    """The marked line of the file with a caret under the column."""
    try:
        with open(path) as f:
            line = f.read().splitlines()[mark.line]
    except (OSError, IndexError):
        return ""
    return f"  {line}\n  {' ' * mark.column}^\n"


def job_from_dict(raw: dict[str, Any], base: str = ".", **overrides: Any) -> Job:
    """Validate a job description (as read from YAML) and build the Job."""
    try:
        config = JobConfig.model_validate(_expand_shorthands(raw))
    except ValidationError as exc:
        raise ConfigError(format_errors(exc)) from exc
    try:
        return _build(config, base, {k: v for k, v in overrides.items() if v is not None})
    except ChuteError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from exc


def _expand_shorthands(raw: dict[str, Any]) -> dict[str, Any]:
    """``input: path`` → ``input: {path: path}``; ``pool: 2`` → ``pool: {min: 2, max: 2}``."""
    raw = dict(raw)
    for key in ("input", "output"):
        if isinstance(raw.get(key), (str, list)):
            raw[key] = {"path": raw[key]}
    models = raw.get("models")
    if isinstance(models, list):
        raw["models"] = [_expand_pool(m) for m in models]
    return raw


def _sink(
    output: OutputConfig, base: str, overrides: dict[str, Any], storage: StorageOptions
) -> Sink:
    """The job's output: a directory of part files, or a table."""
    path = overrides.get("output", output.path)
    if output.format in ("parquet", "csv", "jsonl", "openai-batch"):
        if not path:
            raise ConfigError("output: needs a `path` (the directory results go to).")
        return Sink(_resolve(path, base), output.format, storage)
    from chute.tables import Index, TableSink

    index = Index(**output.index.model_dump()) if output.index else None
    return TableSink(
        _resolve(path, base) if path else "",
        output.format,  # type: ignore[arg-type]
        storage,
        table=output.table or "",
        catalog=output.catalog,
        sort_by=tuple(output.sort_by),
        index=index,
        commit_seconds=output.commit_seconds,
    )


def _expand_pool(model: Any) -> Any:
    if isinstance(model, dict) and isinstance(model.get("pool"), int):
        return {**model, "pool": {"min": model["pool"], "max": model["pool"]}}
    return model


def _build(config: JobConfig, base: str, overrides: dict[str, Any]) -> Job:
    runtime_env = _runtime_env(config, base)  # first: it lets the job's own modules import
    source, output = config.input, config.output
    paths = overrides.get("input", source.path)
    paths = [paths] if isinstance(paths, str) else list(paths)
    storage = StorageOptions(**config.storage.model_dump())
    return Job(
        source=file_source(
            [_resolve(p, base) for p in paths],
            source.format,
            storage,
            **source.model_dump(include={"size", "mode"}, exclude_none=True),
        ),
        models=tuple(_model(i, m, base, overrides) for i, m in enumerate(config.models)),
        output=_sink(output, base, overrides, storage),
        carryover=tuple(config.carryover),
        preprocess=_preprocess(config.preprocess, base),
        engine=overrides.get("engine", config.engine),
        address=overrides.get("address", config.address),
        on_bad_input=config.on_bad_input,
        metrics=tuple(_metric(i, spec, base) for i, spec in enumerate(config.metrics)),
        runtime_env=runtime_env,
    )


def _runtime_env(config: JobConfig, base: str) -> dict[str, Any]:
    """The job's runtime environment: its directory ships with it when its code lives there."""
    env = dict(config.runtime_env)
    if "working_dir" not in env and any(_lives_in(t, base) for t in _code_targets(config)):
        env["working_dir"] = base
    elif isinstance(env.get("working_dir"), str) and "://" not in env["working_dir"]:
        env["working_dir"] = _resolve(env["working_dir"], base)
    if env.get("working_dir", "") is None:
        del env["working_dir"]
    if isinstance(env.get("working_dir"), str) and os.path.isdir(env["working_dir"]):
        add_code_dir(env["working_dir"])  # the driver imports from there as the workers will
    return env


def _code_targets(config: JobConfig) -> list[str]:
    """Every ``module:name`` the job imports: models, preprocess, custom metrics."""
    targets = [str(m.fn) for m in config.models if isinstance(getattr(m, "fn", None), str)]
    if config.preprocess is not None:
        targets.append(config.preprocess.fn)
    targets += [str(s["type"]) for s in config.metrics if ":" in str(s.get("type", ""))]
    return targets


def _lives_in(target: str, base: str) -> bool:
    """Whether ``target`` names a file or module inside ``base`` (not an installed package)."""
    module = target.rpartition(":")[0]
    if module.endswith(".py"):
        path = _resolve(module, base)
        return os.path.commonpath([path, base]) == base
    top = module.split(".")[0]
    return os.path.exists(os.path.join(base, f"{top}.py")) or os.path.exists(
        os.path.join(base, top, "__init__.py")
    )


def _metric(index: int, spec: dict[str, Any], base: str) -> Any:
    from chute.metrics import metric_from_spec

    spec = dict(spec)
    if isinstance(spec.get("type"), str):
        spec["type"] = _resolve_fn(spec["type"], base)
    try:
        return metric_from_spec(spec)
    except ConfigError as exc:
        raise ConfigError(f"metrics[{index}]: {exc}") from exc


def _preprocess(config: PreprocessConfig | None, base: str) -> Preprocess | None:
    if config is None:
        return None
    inputs = tuple(config.inputs) if config.inputs is not None else None
    return Preprocess(_resolve_fn(config.fn, base), inputs, config.batch_format, config.cpus)


def _model(index: int, config: ModelConfig, base: str, overrides: dict[str, Any]) -> Model:
    where = "--batch-size" if "batch_size" in overrides else f"models[{index}].batch_size"
    batch_size = _batch_size(overrides.get("batch_size", config.batch_size), where)
    try:
        return _make_model(config, base, overrides, batch_size)
    except ConfigError as exc:
        raise ConfigError(f"models[{index}] ({config.name}): {exc}") from exc


def _batch_size(value: int | str, where: str) -> BatchSize:
    """The batch size, or an error naming the key and the forms it takes."""
    try:
        return BatchSize.parse(value)
    except ConfigError as exc:
        raise ConfigError(
            f"{where}: {value!r} is not a batch size ({str(exc).rstrip('.')}). Give rows "
            "(an int, e.g. 16384), a size in bytes of the model's input columns (e.g. '8MiB' "
            "or '1GB'), or 'auto'."
        ) from exc


def _make_model(
    config: ModelConfig, base: str, overrides: dict[str, Any], batch_size: BatchSize
) -> Model:
    pool = overrides.get("pool", config.pool)
    res = config.resources
    return Model(
        name=config.name,
        fn=_model_fn(config, base, overrides.get("trust_pickle", False)),
        inputs=tuple(config.inputs) if config.inputs is not None else None,
        batch_format=config.batch_format,
        batch_size=batch_size,
        resources=Resources(
            cpus=res.cpus,
            gpus=res.gpus,
            memory=parse_bytes(res.memory) if res.memory is not None else None,
        ),
        pool=Pool.fixed(pool) if isinstance(pool, int) else Pool(pool.min, pool.max),
        args=tuple(config.args),
        kwargs=dict(config.kwargs),
        on_error=config.on_error,
        timeout=_timeout(config.timeout),
    )


def _timeout(value: object) -> float | None:
    if value is None:
        return None
    try:
        return parse_seconds(value)
    except ConfigError as exc:
        raise ConfigError(f"timeout: {exc}") from exc


def _model_fn(config: ModelConfig, base: str, trust_pickle: bool) -> Any:
    """``fn:`` (a function or class to import) or ``model:`` (a built-in adapter)."""
    if (config.fn is None) == (config.model is None):
        raise ConfigError(
            "give either fn: (a Python function or class, 'module:name') or model: (a built-in "
            "adapter, {type: onnx, path: model.onnx}), not both or neither."
        )
    if config.fn is not None:
        return _resolve_fn(config.fn, base)
    from chute.models import ADAPTERS, adapter

    options = dict(config.model or {})
    kind = options.pop("type", None)
    if not isinstance(kind, str):
        raise ConfigError(f"model: needs type: one of {', '.join(sorted(ADAPTERS))}.")
    if isinstance(options.get("path"), str):
        options["path"] = _resolve(options["path"], base)
    if isinstance(options.get("module"), str):  # torch's module class, "nets.py:MLP"
        options["module"] = _resolve_fn(options["module"], base)
    if trust_pickle:
        options["trust_pickle"] = True  # --trust-pickle
    return adapter(kind, **options)


def _resolve(path: str, base: str) -> str:
    if "://" in path or os.path.isabs(path):
        return path
    return os.path.normpath(os.path.join(base, path))


def _resolve_fn(target: str, base: str) -> str:
    module, sep, attr = target.rpartition(":")
    if sep and module.endswith(".py"):
        return f"{_resolve(module, base)}:{attr}"
    return target


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
        if isinstance(item, int):
            parts[-1] = f"{parts[-1]}[{item}]" if parts else f"[{item}]"
        else:
            parts.append(str(item))
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
