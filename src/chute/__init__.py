"""chute: offline batch inference, streaming, resumable, in one process or on Ray.

>>> import chute
>>> report = chute.run("data/", chute.Model("tip", "model.py:tip"), "out/")  # doctest: +SKIP
>>> clf = chute.Model("clf", chute.adapter("onnx", path="model.onnx"), inputs=["x", "y"])
"""

from chute.api import Job, predict, run
from chute.errors import (
    ChuteError,
    ColumnNotFoundError,
    ConfigError,
    DataError,
    JobStateError,
    ModelError,
    ResourceError,
)
from chute.job import BatchSize, Model, Pool, Preprocess, Resources, Sink
from chute.models import adapter
from chute.report import Report
from chute.sources import DatasetSource, FileSource, ImageSource, TableSource

__all__ = [
    "BatchSize",
    "ChuteError",
    "ColumnNotFoundError",
    "ConfigError",
    "DataError",
    "DatasetSource",
    "FileSource",
    "ImageSource",
    "Job",
    "JobStateError",
    "Model",
    "ModelError",
    "Pool",
    "Preprocess",
    "Report",
    "ResourceError",
    "Resources",
    "Sink",
    "TableSource",
    "adapter",
    "predict",
    "run",
]
__version__ = "0.1.0"
