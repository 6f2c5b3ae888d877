"""chute: offline batch inference, streaming, resumable, in one process or on Ray.

>>> import chute
>>> report = chute.run("data/", chute.Model("tip", "model.py:tip"), "out/")  # doctest: +SKIP
>>> clf = chute.Model("clf", chute.adapter("onnx", path="model.onnx"), inputs=["x", "y"])
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from chute.errors import (
    ChuteError,
    ColumnNotFoundError,
    ConfigError,
    DataError,
    InputChanged,
    JobStateError,
    ModelError,
    ResourceError,
    StallError,
    StorageError,
)

if TYPE_CHECKING:
    from chute.api import Job, predict, run
    from chute.job import BatchSize, Model, Pool, Preprocess, Resources, Sink
    from chute.models import adapter
    from chute.report import Report
    from chute.sources import DatasetSource, FileSource, ImageSource, TableSource

_LAZY = {
    "Job": "chute.api",
    "predict": "chute.api",
    "run": "chute.api",
    "BatchSize": "chute.job",
    "Model": "chute.job",
    "Pool": "chute.job",
    "Preprocess": "chute.job",
    "Resources": "chute.job",
    "Sink": "chute.job",
    "adapter": "chute.models",
    "Report": "chute.report",
    "DatasetSource": "chute.sources",
    "FileSource": "chute.sources",
    "ImageSource": "chute.sources",
    "TableSource": "chute.sources",
}
"""Public names whose modules (Arrow, NumPy, rich, ...) load on first use: ``import
chute`` stays cheap, and a script that only handles :class:`ChuteError` pays nothing."""


def __getattr__(name: str) -> Any:
    """A public name, or a submodule (``chute.sources``), imported when first asked for."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    try:
        return importlib.import_module(f"chute.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"chute.{name}":
            raise
        raise AttributeError(f"module 'chute' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    """The public surface (what ``__all__`` lists), loaded or not yet."""
    return sorted([*__all__, "__version__"])


__all__ = [
    "BatchSize",
    "ChuteError",
    "ColumnNotFoundError",
    "ConfigError",
    "DataError",
    "DatasetSource",
    "FileSource",
    "ImageSource",
    "InputChanged",
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
    "StallError",
    "StorageError",
    "TableSource",
    "adapter",
    "predict",
    "run",
]
__version__ = "0.1.0"
