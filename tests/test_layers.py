"""The layers contract (pyproject.toml, checked by import-linter in CI) names every module,
so a new module has to be given its place in the layers to exist."""

from __future__ import annotations

import re
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


def _documented() -> list[set[str]]:
    """The layers as docs/architecture.md draws them: one line a layer (a line that starts
    with a space continues the one above), modules before the description."""
    page = (ROOT.parents[1] / "docs" / "architecture.md").read_text()
    block = page.split("## The layers", 1)[1].split("```", 2)[1]
    layers: list[set[str]] = []
    for line in block.strip("\n").splitlines():
        names = set(re.findall(r"chute(?:\.\w+)?(?=\s|$|\|)", line.split("   ")[0]))
        if line.startswith(" "):
            layers[-1] |= names
        else:
            layers.append(names)
    return layers


def test_the_architecture_page_draws_the_layers_of_the_contract() -> None:
    config = tomllib.loads((ROOT.parents[1] / "pyproject.toml").read_text())
    contract = config["tool"]["importlinter"]["contracts"][0]
    layers = [{name.strip() for name in layer.split("|")} for layer in contract["layers"]]
    assert _documented() == layers, "docs/architecture.md: redraw 'The layers' from pyproject"
