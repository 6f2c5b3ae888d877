"""A validated job file → :class:`~chute.api.Job`: shorthands expanded, paths resolved
against the job file's directory, overrides from the command line applied."""

from __future__ import annotations

import os
from typing import Any

from chute.api import Job
from chute.config.schema import JobConfig, ModelConfig, OutputConfig, PreprocessConfig
from chute.errors import ConfigError
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
from chute.storage import StorageOptions, local_absolute
from chute.usercode import add_code_dir


def expand_shorthands(raw: dict[str, Any]) -> dict[str, Any]:
    """``input: path`` → ``input: {path: path}``; ``pool: 2`` → ``pool: {min: 2, max: 2}``."""
    raw = dict(raw)
    for key in ("input", "output"):
        if isinstance(raw.get(key), (str, list)):
            raw[key] = {"path": raw[key]}
    models = raw.get("models")
    if isinstance(models, list):
        raw["models"] = [_expand_pool(m) for m in models]
    return raw


TABLE_KEYS = ("table", "catalog", "sort_by", "partition_by", "index", "commit_seconds")
"""``output:`` keys that only a table output takes."""


def _sink(
    output: OutputConfig, base: str, overrides: dict[str, Any], storage: StorageOptions
) -> Sink:
    """The job's output: a directory of part files, or a table."""
    path = overrides.get("output", output.path)
    if output.format in ("parquet", "csv", "jsonl", "openai-batch"):
        if not path:
            raise ConfigError("output: needs a `path` (the directory results go to).")
        given = output.model_fields_set & set(TABLE_KEYS)  # a template's `partition_by: []`
        defaults = {k: type(output).model_fields[k].default for k in given}
        tables_only = sorted(k for k in given if getattr(output, k) != defaults[k])
        if tables_only:  # else taken in silence: files neither partitioned nor sorted
            what = "is an option" if len(tables_only) == 1 else "are options"
            raise ConfigError(
                f"output: {', '.join(tables_only)} {what} of table outputs (format: iceberg, "
                f"delta or lance), not of a {output.format} output's files. Remove it, or "
                "write a table."
            )
        return Sink(
            _resolve(path, base), output.format, storage, output.file_size, output.file_rows
        )
    from chute.tables import Index, TableSink

    index = Index(**output.index.model_dump()) if output.index else None
    return TableSink(
        _resolve(path, base) if path else "",
        output.format,  # type: ignore[arg-type]
        storage,
        table=output.table or "",
        catalog=output.catalog,
        sort_by=tuple(output.sort_by),
        partition_by=tuple(output.partition_by),
        index=index,
        commit_seconds=output.commit_seconds,
        file_size=output.file_size,
        file_rows=output.file_rows,
    )


def _expand_pool(model: Any) -> Any:
    pool = model.get("pool") if isinstance(model, dict) else None
    if isinstance(pool, int) and not isinstance(pool, bool):  # `pool: true` is no size
        return {**model, "pool": {"min": model["pool"], "max": model["pool"]}}
    return model


def build(config: JobConfig, base: str, overrides: dict[str, Any]) -> Job:
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
            source.column_types,
            **source.model_dump(include={"size", "mode"}, exclude_none=True),
        ),
        models=tuple(_model(i, m, base, overrides) for i, m in enumerate(config.models)),
        output=_sink(output, base, overrides, storage),
        carryover=tuple(config.carryover),
        preprocess=_preprocess(config.preprocess, base),
        engine=overrides.get("engine", config.engine),
        address=overrides.get("address", config.address),
        on_bad_input=config.on_bad_input,
        max_failed_fraction=config.max_failed_fraction,
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
        path, folder = (os.path.realpath(p) for p in (_resolve(module, base), base))
        return os.path.commonpath([path, folder]) == folder
    top = module.split(".")[0]
    return os.path.exists(os.path.join(base, f"{top}.py")) or os.path.exists(
        os.path.join(base, top, "__init__.py")
    )


def _metric(index: int, spec: dict[str, Any], base: str) -> Any:
    from chute.metrics import metric_from_spec
    from chute.metrics.registry import bad_option

    spec = dict(spec)
    if isinstance(spec.get("type"), str):
        spec["type"] = _resolve_fn(spec["type"], base)
    problem = bad_option(spec)
    if problem is not None:
        raise ConfigError(f"metrics[{index}].{problem[0]}: {problem[1]}")
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
    path = path if "://" in path else os.path.expanduser(path)  # ~/data: the home folder's
    if "://" in path or os.path.isabs(path):
        return path
    return local_absolute(os.path.join(base, path))  # ".." as the system reads it


def _resolve_fn(target: str, base: str) -> str:
    module, sep, attr = target.rpartition(":")
    if sep and module.endswith(".py"):
        return f"{_resolve(module, base)}:{attr}"
    return target
