"""What chute prints to a terminal or a log, beyond rich's own pieces.

* :class:`Folded`: a name or path that a narrow table column folds at its ``/``, ``.``,
  ``:``, ``_``, ``-`` or ``,`` boundaries (``chute.demo:`` / ``tip_model``), never in
  the middle of a word, unless one piece alone is wider than the column;
* :class:`ProgressLines`: the progress of a run as one plain line every few seconds, for
  output that is not a terminal (CI logs, ``| tee``), where a live bar shows nothing until
  the end.

The clock is injected, so tests check the lines exactly.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.text import Text

_PIECE = re.compile(r"[^/.:_,\-\s]*(?:[/.:_,\-]|\s+|$)")
"""A piece of a name up to and including its boundary: ``chute.`` ``demo:`` ``tip_``."""

PROGRESS_EVERY = 5.0
"""Seconds between two progress lines when the output is not a terminal."""


def pieces(text: str) -> list[str]:
    """``"chute.demo:tip_model"`` → ``["chute.", "demo:", "tip_", "model"]``."""
    return [p for p in _PIECE.findall(text) if p]


def fold(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` cells: broken at spaces where a word fits on a
    line, else after a boundary inside the word; a piece wider than ``width`` is cut."""
    width = max(1, width)
    lines: list[str] = []
    for paragraph in text.split("\n"):
        line = ""
        for word in re.findall(r"\S+\s*", paragraph) or [""]:
            if cell_len((line + word).rstrip()) <= width:
                line += word
                continue
            if line and cell_len(word.rstrip()) <= width:
                lines.append(line.rstrip())
                line = word
                continue
            line = _fill(line, pieces(word), width, lines)
        lines.append(line.rstrip())
    return lines


def _fill(line: str, parts: list[str], width: int, lines: list[str]) -> str:
    """Add a long word's pieces to ``line``, starting new lines (into ``lines``) as needed."""
    for piece in parts:
        if line and cell_len((line + piece).rstrip()) > width:
            lines.append(line.rstrip())
            line = ""
        line += piece
        while cell_len(line.rstrip()) > width:
            lines.append(line[:width])
            line = line[width:]
    return line


@dataclass(frozen=True)
class Folded:
    """Text for a table cell that folds at name boundaries (see :func:`fold`)."""

    text: str
    style: str = ""

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        lines = self.text.split("\n")
        widest = max(cell_len(line) for line in lines)
        piece = max((cell_len(p.rstrip()) for line in lines for p in pieces(line)), default=1)
        return Measurement(min(piece, widest), widest).clamp(max_width=options.max_width)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for line in fold(self.text, options.max_width):
            yield Text(line, style=self.style, no_wrap=True, overflow="ignore")


@dataclass
class ProgressLines:
    """Plain progress lines: ``units 3/12 · 512,000 of 1,710,629 rows (30%) · 210,000
    rows/s · ETA 6 s``, one every ``every`` seconds of ``clock``, and one at the end
    (without a rate: the report gives the run's one throughput figure)."""

    total: int | None
    console: Console
    clock: Callable[[], float] = time.monotonic
    every: float = PROGRESS_EVERY
    description: str = "units"
    waiting: str = ""
    """What the run waits for, shown in place of the rate and ETA while it is set."""
    completed: int = 0
    _started: float = 0.0
    _last: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        self._started = self._last = self.clock()

    def advance(self, rows: int) -> None:
        with self._lock:
            self.completed += rows
        self.tick()

    def describe(self, text: str) -> None:
        self.description = text
        self.tick()

    def tick(self) -> None:
        """Print a line if ``every`` seconds have passed since the last one."""
        with self._lock:
            now = self.clock()
            if now - self._last < self.every:
                return
            self._last = now
            line = self.line(now)
        self.console.print(line, highlight=False, markup=False, soft_wrap=True)

    def finish(self) -> None:
        with self._lock:
            line = " · ".join(self._parts(self.clock(), rate=False))
        self.console.print(line, highlight=False, markup=False, soft_wrap=True)

    def line(self, now: float) -> str:
        return " · ".join(self._parts(now, rate=True))

    def _parts(self, now: float, rate: bool) -> Iterable[str]:
        elapsed = max(now - self._started, 0.0)
        yield self.description
        if self.total:
            share = 100 * self.completed / self.total
            yield f"{self.completed:,} of {self.total:,} rows ({share:.0f}%)"
        else:
            yield f"{self.completed:,} rows"
        speed = self.completed / elapsed if elapsed > 0 else 0.0
        if rate and self.waiting:
            yield self.waiting
        elif rate:
            yield f"{speed:,.0f} rows/s"
            if self.total and speed > 0:
                yield f"ETA {_duration((self.total - self.completed) / speed)}"
        yield f"{_duration(elapsed)} elapsed"


def _duration(seconds: float) -> str:
    """``7 s``, ``3 min 05 s``, ``2 h 01 min``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours:,} h {minutes:02d} min"
