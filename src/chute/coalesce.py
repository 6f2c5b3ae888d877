"""Right-sized output files: the rows a writer holds until a file's worth has arrived.

A model stage hands the writer one batch at a time; written as they come, a job of 12
input files wrote over a hundred small part files. A :class:`Coalescer` holds the
batches per unit and hands the :class:`~chute.sinks.PartWriter` several at once:

* a unit whose rows have all arrived (*ready*) waits for others, and the ready units are
  written together once they fill the sink's target (:class:`~chute.job.FileTarget`),
  once the first of them has waited :data:`HOLD_SECONDS`, or when the input ends;
* a unit still arriving is written, in pieces of about the target, only when it alone
  fills one (a large unit spans several files), and otherwise waits for its last rows;
* held rows never pass twice the target (beyond that everything held is written).

So a finished unit's commit waits at most :data:`HOLD_SECONDS` (and the write) for the
writer, also while the input stalls; the files' contents follow
:func:`chute.sinks.file_groups` (whole units together, never part of a unit beside
another), so exactly-once holds as :mod:`chute.ledger` describes. The writer threads of
an engine share one coalescer; it is a plain class, used without any engine in tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa

from chute.sinks import PartRecord, PartWriter, runs
from chute.stages import KEY

HOLD_SECONDS = 5.0
"""The longest a ready unit's rows wait for other units to fill a file."""


@dataclass
class _Held:
    """One unit's rows in the coalescer."""

    pieces: list[pa.Table] = field(default_factory=list)
    rows: int = 0
    nbytes: int = 0
    taken: int = 0
    """Rows of the unit already handed to the writer."""
    total: int | None = None
    """The unit's rows, once its last row has arrived."""

    @property
    def ready(self) -> bool:
        return self.total is not None and self.taken + self.rows >= self.total


class Coalescer:
    """Holds batches for ``writer`` and writes them in files of about its target.

    >>> coalescer = Coalescer(writer)  # doctest: +SKIP
    >>> records = coalescer.add(batch)  # often [] : the rows are held
    >>> records += coalescer.flush(everything=True)  # at the end of the input
    """

    def __init__(
        self,
        writer: PartWriter,
        hold: float = HOLD_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.writer = writer
        self.target = writer.target
        self.hold = hold
        self._clock = clock
        self._units: dict[int, _Held] = {}
        self._ready_since: float | None = None
        self._lock = threading.Lock()

    def add(self, table: pa.Table) -> list[PartRecord]:
        """Hold ``table``'s rows; write, and describe, whatever is due now."""
        if not self.writer.joins:  # a table or an in-memory result: a part per run, at once
            return self.writer.write(table)
        with self._lock:
            self._hold(table)
            due = self._due()
        return self._write(due)

    def wait(self) -> float | None:
        """Seconds until held rows are due by time (``None``: none are ready to wait)."""
        with self._lock:
            if self._ready_since is None:
                return None
            return max(0.0, self._ready_since + self.hold - self._clock())

    def flush(self, everything: bool = False) -> list[PartRecord]:
        """Write the ready units now (``everything``: all rows held, at the input's end)."""
        with self._lock:
            units = list(self._units) if everything else self._ready()
            due = [self._take(unit) for unit in units]
        return self._write(due)

    def _hold(self, table: pa.Table) -> None:
        for lo, hi, unit, start, total in runs(table.column(KEY).to_numpy()):
            held = self._units.setdefault(unit, _Held())
            piece = table.slice(lo, hi - lo)
            held.pieces.append(piece)
            held.rows += piece.num_rows
            held.nbytes += piece.nbytes
            if total >= 0:
                held.total = start + piece.num_rows
            if held.ready and self._ready_since is None:
                self._ready_since = self._clock()

    def _due(self) -> list[pa.Table | None]:
        """What to write now: a file's worth of ready units, or of one unit's rows."""
        held = self._units.values()
        if sum(h.nbytes for h in held) >= 2 * self.target.bytes:  # the memory bound
            return [self._take(unit) for unit in list(self._units)]
        due = [self._piece(unit) for unit, h in self._units.items() if not h.ready]
        ready = self._ready()
        waited = self._ready_since is not None and self._clock() - self._ready_since >= self.hold
        if waited or self._fills([self._units[u] for u in ready]):
            due += [self._take(unit) for unit in ready]
        return due

    def _fills(self, held: list[_Held]) -> bool:
        rows, nbytes = sum(h.rows for h in held), sum(h.nbytes for h in held)
        return nbytes >= self.target.bytes or rows >= (self.target.rows or rows + 1)

    def _piece(self, unit: int) -> pa.Table | None:
        """The first file's worth of a unit still arriving, if it holds one."""
        held = self._units[unit]
        if not self._fills([held]):
            return None
        taken: list[pa.Table] = []
        rows = nbytes = 0
        while held.pieces and (not taken or self._fits(rows, nbytes, held.pieces[0])):
            piece = held.pieces.pop(0)
            taken.append(piece)
            rows, nbytes = rows + piece.num_rows, nbytes + piece.nbytes
        held.rows, held.nbytes = held.rows - rows, held.nbytes - nbytes
        held.taken += rows
        return _concat(taken)

    def _fits(self, rows: int, nbytes: int, piece: pa.Table) -> bool:
        """Whether ``piece`` still fits a file that holds ``rows`` rows of ``nbytes``."""
        rows, nbytes = rows + piece.num_rows, nbytes + piece.nbytes
        return nbytes <= self.target.bytes and rows <= (self.target.rows or rows)

    def _ready(self) -> list[int]:
        return [unit for unit, held in self._units.items() if held.ready]

    def _take(self, unit: int) -> pa.Table | None:
        """All that is held of ``unit`` (``None``: nothing, its rows went on in pieces)."""
        held = self._units.pop(unit)
        if not any(h.ready for h in self._units.values()):
            self._ready_since = None
        return _concat(held.pieces) if held.pieces else None

    def _write(self, due: list[pa.Table | None]) -> list[PartRecord]:
        tables = [t for t in due if t is not None and t.num_rows]
        return self.writer.write(_concat(tables)) if tables else []


def _concat(tables: list[pa.Table]) -> pa.Table:
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables, promote_options="permissive")
