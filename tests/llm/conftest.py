"""Fixtures of the LLM tests: one tiny model and one vLLM engine per session.

Loading vLLM takes half a minute on two CPUs, so the tests share one real engine: the
``shared_llm`` fixture loads it once, and ``llm_adapter`` builds adapters (each with its
own options) on top of it. Jobs on the local engine use it too (``use_shared_llm``);
a Ray job and a killed subprocess load their own. Nothing here is a stand-in for vLLM.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: the tiny model needs little
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

ENGINE = {"dtype": "bfloat16", "max_model_len": 256, "enforce_eager": True}
"""The engine settings every test uses (a Ray job loads its own engine with these)."""


@pytest.fixture(scope="session")
def tiny_llm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Llama and its tokenizer, made once per session."""
    from tests.llm.tinymodel import build_llm

    return build_llm(tmp_path_factory.mktemp("tiny-llm"))


@pytest.fixture(scope="session")
def shared_llm(tiny_llm: Path) -> Iterator[Any]:
    """One real ``vllm.LLM`` of the tiny model for the whole session."""
    from chute.job import Resources
    from chute.models.base import ReplicaContext
    from chute.models.llm.engine import load_llm

    llm = load_llm(str(tiny_llm), ENGINE, ReplicaContext("tiny", Resources()), "generate")
    yield llm
    del llm


@pytest.fixture
def use_shared_llm(monkeypatch: pytest.MonkeyPatch, shared_llm: Any) -> Any:
    """Jobs in this process get the session's engine instead of loading their own (the
    adapter still checks its options and reads the model directory)."""
    import chute.models.llm as llm_module

    monkeypatch.setattr(llm_module, "load_llm", lambda *args, **kwargs: shared_llm)
    return shared_llm


@pytest.fixture
def llm_adapter(use_shared_llm: Any, tiny_llm: Path) -> Callable[..., Any]:
    """``llm_adapter(temperature=0, ...)``: a vllm adapter over the shared engine."""
    from chute.job import Resources
    from chute.models.base import ReplicaContext
    from chute.models.llm import VLLMAdapter

    def build(**options: Any) -> Any:
        return VLLMAdapter(ReplicaContext("llm", Resources()), path=str(tiny_llm), **options)

    return build
