"""The job: what to read, which models to run, what to carry and where to write.

Every piece is a small frozen value validated when it is built, so a bad job fails
before anything is read; ``chute.Job.run()`` hands the job to the runner.

- :mod:`~chute.job.values`: sizes, durations, resources, pools, batch sizes;
- :mod:`~chute.job.spec`: :class:`Model`, :class:`Preprocess`, :class:`Sink`, :class:`JobSpec`;
- :mod:`~chute.job.fingerprint`: what determines the output, and its fingerprint.
"""

from chute.job.fingerprint import describe_changes, fingerprint_of
from chute.job.spec import FileTarget, JobSpec, Model, Preprocess, Sink
from chute.job.values import (
    AUTO_BATCH_ROWS,
    AUTO_MAX_ROWS,
    AUTO_MEMORY,
    BATCH_FORMATS,
    DEFAULT_BATCH_ROWS,
    ON_ERROR,
    OUTPUT_FORMATS,
    BatchFormat,
    BatchSize,
    BatchTarget,
    EngineName,
    OnBadInput,
    OnError,
    OutputFormat,
    Pool,
    Resources,
    UserFn,
    parse_bytes,
    parse_seconds,
)

__all__ = [
    "AUTO_BATCH_ROWS",
    "AUTO_MAX_ROWS",
    "AUTO_MEMORY",
    "BATCH_FORMATS",
    "DEFAULT_BATCH_ROWS",
    "ON_ERROR",
    "OUTPUT_FORMATS",
    "BatchFormat",
    "BatchSize",
    "BatchTarget",
    "EngineName",
    "FileTarget",
    "JobSpec",
    "Model",
    "OnBadInput",
    "OnError",
    "OutputFormat",
    "Pool",
    "Preprocess",
    "Resources",
    "Sink",
    "UserFn",
    "describe_changes",
    "fingerprint_of",
    "parse_bytes",
    "parse_seconds",
]
