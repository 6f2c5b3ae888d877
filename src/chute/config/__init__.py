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
        batch_size: auto           # the default: measured; or rows, or a size such as "8MiB"
        resources: {cpus: 1, gpus: 0, memory: 2GiB}
        pool: {min: 1, max: 4}     # or an int: a fixed size
        timeout: 5m                # per batch; none by default
    output: {path: out/, format: parquet}
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import ValidationError

from chute.api import Job
from chute.config.build import build, expand_shorthands
from chute.config.schema import JobConfig, format_errors
from chute.config.yamlfile import read_yaml, yaml_problem
from chute.errors import ChuteError, ConfigError
from chute.storage import local_absolute

__all__ = ["JobConfig", "format_errors", "job_from_dict", "load_job", "read_yaml", "yaml_problem"]


def load_job(path: str, **overrides: Any) -> Job:
    """Read a YAML job file; ``overrides`` (input, output, batch_size, pool, engine,
    address) replace what the file says."""
    raw = read_yaml(path)
    return job_from_dict(raw, base=os.path.dirname(local_absolute(path)), **overrides)


def job_from_dict(raw: dict[str, Any], base: str = ".", **overrides: Any) -> Job:
    """Validate a job description (as read from YAML) and build the Job."""
    try:
        config = JobConfig.model_validate(expand_shorthands(raw))
    except ValidationError as exc:
        raise ConfigError(format_errors(exc)) from exc
    try:
        return build(config, base, {k: v for k, v in overrides.items() if v is not None})
    except ChuteError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from exc
