"""The public surface: ``chute.__all__`` is exactly what the namespace offers, and
importing chute stays light."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import chute


def test_all_equals_public_names() -> None:
    public = {name for name in dir(chute) if not name.startswith("_")}
    assert all(not isinstance(getattr(chute, name), types.ModuleType) for name in public)
    assert set(chute.__all__) == public
    assert len(chute.__all__) == len(set(chute.__all__))
    assert chute.__all__ == sorted(chute.__all__)


def test_every_exported_name_is_defined_in_chute() -> None:
    for name in chute.__all__:
        value = getattr(chute, name)
        assert value.__module__.startswith("chute."), name


def test_version_is_a_string() -> None:
    assert isinstance(chute.__version__, str)


def test_import_chute_does_not_import_heavy_frameworks() -> None:
    code = (
        "import sys, json, chute; "
        "print(json.dumps(sorted(m for m in ('ray', 'torch', 'sentence_transformers', "
        "'transformers', 'onnxruntime', 'pandas', 'pyarrow', 'rich') if m in sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_public_names_load_on_first_use_and_submodules_too() -> None:
    code = (
        "import sys, chute; before = 'pyarrow' in sys.modules; chute.Job; "
        "print(before, 'pyarrow' in sys.modules, callable(chute.sources.as_source))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split() == ["False", "True", "True"]
