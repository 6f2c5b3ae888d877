"""Built-in model adapters, looked up by name and imported only when a job uses them.

>>> spec = adapter("onnx", path="model.onnx")
>>> spec.kind
'onnx'

``Model("clf", adapter("sklearn", path="clf.skops", method="predict_proba"))`` in Python is
``model: {type: sklearn, path: clf.skops, method: predict_proba}`` in a job file.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from chute.errors import ConfigError, did_you_mean
from chute.models.base import Adapter, ReplicaContext

# kind -> (import path of the adapter class, the module it needs, the extra that installs it)
ADAPTERS: dict[str, tuple[str, str, str]] = {}


def register(kind: str, target: str, module: str, extra: str) -> None:
    """Make ``kind`` name the adapter class at ``target`` (``"package.module:Class"``)."""
    ADAPTERS[kind] = (target, module, extra)


@dataclass(frozen=True)
class AdapterSpec:
    """A built-in adapter chosen by name, with its options; the ``fn`` of a :class:`Model`."""

    kind: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in ADAPTERS:
            raise ConfigError(
                f"unknown model type {self.kind!r}{did_you_mean(self.kind, list(ADAPTERS))}; "
                f"the built-in types are {', '.join(sorted(ADAPTERS))}, or give a Python "
                "function or class."
            )
        object.__setattr__(self, "options", dict(self.options))

    def check_installed(self) -> None:
        """Fail with the ``pip install`` line when the adapter's framework is missing."""
        _, module, extra = ADAPTERS[self.kind]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(
                f"model type {self.kind!r} needs {module}, which is not installed: "
                f"pip install 'chute[{extra}]'"
            )

    def load_class(self, check: bool = True) -> type[Adapter]:
        """The adapter class. Adapter modules import their framework lazily, so ``check=False``
        gives the class (for its artifacts and docs) even where the framework is missing."""
        if check:
            self.check_installed()
        target, _, _ = ADAPTERS[self.kind]
        module, _, name = target.partition(":")
        cls: type[Adapter] = getattr(importlib.import_module(module), name)
        return cls

    def check(self) -> None:
        """Before anything runs (plan, ``chute validate``): the framework is installed and the
        adapter accepts the options (no untrusted pickle among its files, for one)."""
        self.check_installed()
        self.load_class().check(self.options)

    def build(self, context: ReplicaContext) -> Adapter:
        """Load the model for one replica."""
        return self.load_class()(context, **self.options)


def adapter(kind: str, **options: Any) -> AdapterSpec:
    """Choose a built-in adapter by name: ``adapter("onnx", path="model.onnx")``."""
    return AdapterSpec(kind, options)


__all__ = ["ADAPTERS", "Adapter", "AdapterSpec", "ReplicaContext", "adapter", "register"]

register("torch", "chute.models.torchmodel:TorchAdapter", "torch", "torch")
register("transformers", "chute.models.hf:TransformersAdapter", "transformers", "transformers")
register(
    "sentence-transformers",
    "chute.models.sbert:SentenceTransformersAdapter",
    "sentence_transformers",
    "sentence-transformers",
)
register("vllm", "chute.models.llm:VLLMAdapter", "vllm", "vllm")
register("openai", "chute.models.llm.server:OpenAIAdapter", "httpx", "openai")
register("sklearn", "chute.models.sklearn:SklearnAdapter", "sklearn", "sklearn")
register("xgboost", "chute.models.boosters:XGBoostAdapter", "xgboost", "xgboost")
register("lightgbm", "chute.models.boosters:LightGBMAdapter", "lightgbm", "lightgbm")
register("onnx", "chute.models.onnx:OnnxAdapter", "onnxruntime", "onnx")
register("keras", "chute.models.keras:KerasAdapter", "keras", "keras")
