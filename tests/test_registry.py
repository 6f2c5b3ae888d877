"""The engine registry: engines by name, imported when used, each with the protocol."""

from __future__ import annotations

import subprocess
import sys

import pytest

from chute import engines
from chute.engines import EngineOptions
from chute.errors import ConfigError


def test_every_registered_engine_has_the_protocol() -> None:
    for name in engines.names():
        engine = engines.create(name, EngineOptions())
        for method in ("prepare", "execute", "stage_resources"):
            assert callable(getattr(engine, method)), (name, method)


def test_an_unknown_engine_says_which_exist_and_guesses() -> None:
    with pytest.raises(ConfigError, match=r"not one of local, ray\. Did you mean 'ray'\?"):
        engines.create("rya")


def test_importing_chute_imports_no_engine() -> None:
    code = "import sys, chute; print(sorted(m for m in sys.modules if 'engines.' in m))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
