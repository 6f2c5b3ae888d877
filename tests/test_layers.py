"""The layers contract (pyproject.toml, checked by import-linter in CI) names every module,
so a new module has to be given its place in the layers to exist."""

from __future__ import annotations

from pathlib import Path

import tomllib

import chute

ROOT = Path(chute.__file__).parent


def _layered() -> set[str]:
    config = tomllib.loads((ROOT.parents[1] / "pyproject.toml").read_text())
    contract = config["tool"]["importlinter"]["contracts"][0]
    return {name.strip() for layer in contract["layers"] for name in layer.split("|")}


def test_every_module_has_a_layer() -> None:
    modules = {
        f"chute.{path.stem if path.is_file() else path.name}"
        for path in ROOT.iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").exists()
    }
    assert modules - _layered() == set(), "give these modules a layer in pyproject.toml"
    assert _layered() - modules == set(), "these layers name modules that do not exist"
