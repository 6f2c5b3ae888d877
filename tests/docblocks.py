"""The fenced code blocks of a Markdown file, with the directives that say how to test them.

A directive is an HTML comment (invisible on GitHub) just before a block:

* ``<!-- doc-test: skip: <reason> -->`` — the block cannot run here; the reason is
  required and becomes the skip message;
* ``<!-- doc-test: file <name> -->`` — the block is written to ``<name>`` in the
  document's working directory (a job file that later blocks run);
* ``<!-- doc-test: setup`` … ``-->`` — shell lines run before the block, in the same
  directory (data the block expects to find, say).

Python and shell blocks run; YAML blocks must parse; blocks without a language (trees,
diagrams) are text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

RUNS = {"python": "python", "py": "python", "bash": "shell", "sh": "shell", "shell": "shell"}
_DIRECTIVE = re.compile(r"<!--\s*doc-test:\s*(\w+)\s*:?\s*(.*?)\s*(-->)?\s*$", re.DOTALL)


@dataclass(frozen=True)
class Block:
    """One fenced block of a document."""

    doc: Path
    line: int
    """The line of the opening fence (1-based)."""
    lang: str
    code: str
    skip: str | None = None
    file: str | None = None
    setup: str = ""

    @property
    def kind(self) -> str | None:
        """``python``, ``shell``, ``yaml`` or ``None`` (text)."""
        return RUNS.get(self.lang, "yaml" if self.lang in ("yaml", "yml") else None)

    @property
    def id(self) -> str:
        return f"{self.doc.name}:{self.line}-{self.lang or 'text'}"


def blocks(doc: Path) -> list[Block]:
    """Every fenced block of ``doc``, with the directives written before it."""
    lines = doc.read_text().splitlines()
    found: list[Block] = []
    pending: dict[str, str] = {}
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("<!-- doc-test:"):
            i = _directive(lines, i, pending, doc)
            continue
        fence = re.match(r"^(\s*)```(\w*)\s*$", line)
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        code = "\n".join(lines[i + 1 : end]) + "\n"
        found.append(
            Block(
                doc,
                i + 1,
                fence.group(2).lower(),
                code,
                skip=pending.get("skip"),
                file=pending.get("file"),
                setup=pending.get("setup", ""),
            )
        )
        pending = {}
        i = end + 1
    return found


def _directive(lines: list[str], i: int, pending: dict[str, str], doc: Path) -> int:
    """Read the directive opening at line ``i``; return the line after it."""
    end = i
    while "-->" not in lines[end]:
        end += 1
    text = "\n".join(lines[i : end + 1])
    match = _DIRECTIVE.match(text.strip())
    if match is None or match.group(1) not in ("skip", "file", "setup"):
        raise ValueError(f"{doc}:{i + 1}: unknown doc-test directive: {text!r}")
    name, value = match.group(1), match.group(2).removesuffix("-->").strip()
    if name == "skip" and not value:
        raise ValueError(f"{doc}:{i + 1}: a skipped block must say why (skip: <reason>)")
    pending[name] = value
    return end + 1
