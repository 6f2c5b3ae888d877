"""Right-sized output files, written as the rows arrive: which data file a writer appends
each run of rows to, and when a file is closed.

A model stage hands the writer one batch at a time; written as they came, a job of 12
input files wrote over a hundred small part files, and holding the rows until a file's
worth had arrived held the whole output of a small job in memory. A :class:`Coalescer`
holds a unit's rows only while it is still arriving and small, and appends the rest to
open :class:`~chute.sinks.DataFile` s:

* a unit whose rows have all arrived (*ready*), and which fits a file, is appended to a
  *shared* file of whole units (one per writer thread, so that they encode at once); a
  shared file is closed once it fills the sink's target (:class:`~chute.job.FileTarget`),
  once :data:`HOLD_SECONDS` have passed since its first unit, or when the input ends;
* a unit still arriving is held while all such units hold under :data:`UNIT_HOLD_BYTES`
  (and it has fewer rows than the target's); past that, the largest one's rows go to
  files of its own, appended as they come, a new file each time one fills, the last
  closed when its last row has arrived. A unit whose planned rows (``sizes``: a Parquet
  row group's, known before it is read) could never be held whole goes so from its first
  rows: holding them would only hold memory (each run is a row group of its own either
  way).

So the writer holds at most :data:`UNIT_HOLD_BYTES` of the units in flight (and the run
each thread is appending), however large the input and the files; a finished unit's
commit waits at most :data:`HOLD_SECONDS` (and the close) for its shared file, also while
the input stalls. A file holds whole units, or rows of a single unit, never part of a
unit beside another, so exactly-once holds as :mod:`chute.ledger` describes. The writer
threads of an engine share one coalescer: it decides under its lock and appends under
each file's lock, taken in the order decided, so a unit's rows reach its file in the
order they were handed over. It is a plain class, used without any engine in tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pyarrow as pa

from chute.sinks import DataFile, PartRecord, PartWriter
from chute.sinks.datafile import nulls_typed
from chute.sinks.files import split_run
from chute.stages import typed_by

HOLD_SECONDS = 5.0
"""The longest a shared file of whole units stays open for more units."""
UNIT_HOLD_BYTES = 16 * 2**20
"""The most of the units still arriving that is held in memory (Arrow bytes); past it the
largest unit's rows go to files of their own as they come."""

Run = tuple[PartRecord, pa.Table]
"""A run of a unit's rows and its record."""


@dataclass
class _Held:
    """One unit's rows not yet in a file."""

    runs: list[Run] = field(default_factory=list)
    rows: int = 0
    nbytes: int = 0
    covered: int = 0
    """Rows of the unit that its records have described so far (held, or gone on)."""
    total: int | None = None
    """The unit's rows, once its last row has arrived."""
    file: DataFile | None = None
    """The unit's own open file, once its rows outgrew the hold."""
    alone: bool = False
    """Its rows go to files of its own (they outgrew the hold, or were planned to): it
    never shares a file."""
    next: int = 0
    """The unit's row its files take next: runs go on in the unit's order, so a run that
    came early (another replica's batch) waits for the ones before it."""
    gaps: dict[int, int] = field(default_factory=dict)
    """Ranges of the unit with no row to write (every row failed), by start: their end."""

    @property
    def ready(self) -> bool:
        return self.total is not None and self.covered >= self.total


@dataclass
class _Step:
    """Runs to append to a file, and whether to close it after them."""

    file: DataFile
    runs: list[Run] = field(default_factory=list)
    close: bool = False


class Coalescer:
    """Writes the batches handed to it into files of about ``writer``'s target.

    >>> coalescer = Coalescer(writer)  # doctest: +SKIP
    >>> records = coalescer.add(batch)  # often [] : the rows are in files still open
    >>> records += coalescer.flush(everything=True)  # at the end of the input
    """

    def __init__(
        self,
        writer: PartWriter,
        hold: float = HOLD_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        unit_bytes: int = UNIT_HOLD_BYTES,
        sizes: Mapping[int, int] | None = None,
    ) -> None:
        self.writer = writer
        self.sizes = dict(sizes or {})
        """The planned rows of each unit, where the input says before it is read."""
        self.target = writer.target
        self.hold = hold
        self.unit_bytes = min(unit_bytes, self.target.bytes)
        self._clock = clock
        self._units: dict[int, _Held] = {}
        self._shared: dict[int, tuple[DataFile, float]] = {}
        """The open shared file of each writer thread (by its ident), and when it opened:
        threads that share one file would encode in turn."""
        self._lock = threading.Lock()

    def add(self, table: pa.Table) -> list[PartRecord]:
        """Take ``table``'s rows; the records of the files this closed."""
        if not self.writer.joins:  # a table or an in-memory result: a part per run, at once
            return self.writer.write(table)
        prepared = self.writer.prepare(table)  # errors parts and metrics: outside the lock
        done = [record for record, rows in prepared if rows is None]  # nothing to write
        with self._lock:
            for record, rows in prepared:
                self._hold(record, rows)
            steps = self._due()
            self._take_files(steps)
        return done + self._run(steps)

    def wait(self) -> float | None:
        """Seconds until a shared file is due to close (``None``: none is open)."""
        with self._lock:
            if not self._shared:
                return None
            since = min(since for _, since in self._shared.values())
            return max(0.0, since + self.hold - self._clock())

    def flush(self, everything: bool = False) -> list[PartRecord]:
        """Close the shared files now (``everything``: at the input's end, every file, with
        whatever is held, ready or not)."""
        with self._lock:
            steps: list[_Step] = []
            for unit in list(self._units) if everything else []:
                steps += self._alone(self._units.pop(unit), close=True)
            steps += [_Step(file, close=True) for file, _ in self._shared.values()]
            self._shared = {}
            self._take_files(steps)
        return self._run(steps)

    def discard(self) -> None:
        """Give up every open file (the run failed): their temporaries are removed."""
        with self._lock:
            files = [h.file for h in self._units.values() if h.file is not None]
            files += [file for file, _ in self._shared.values()]
            self._units, self._shared = {}, {}
        for file in files:
            file.discard()

    def _hold(self, record: PartRecord, rows: pa.Table | None) -> None:
        held = self._units.get(record.unit)
        if held is None:
            held = self._units[record.unit] = _Held()
            held.alone = rows is not None and self._never_held(record.unit, rows)
        held.covered += record.end - record.start
        if record.unit_rows >= 0:
            held.total = record.unit_rows
        if rows is None:
            held.gaps[record.start] = record.end
        else:
            held.runs.append((record, rows))
            held.rows += rows.num_rows
            held.nbytes += rows.nbytes

    def _never_held(self, unit: int, rows: pa.Table) -> bool:
        """Whether a unit's planned rows, at the bytes a row of ``rows`` takes, could never
        be held whole (nor share a file)."""
        planned = self.sizes.get(unit)
        if planned is None or not rows.num_rows:
            return False
        estimate = planned * rows.nbytes // rows.num_rows
        return estimate > self.unit_bytes or planned > (self.target.rows or planned)

    def _due(self) -> list[_Step]:
        """What to append and close now: ready units to the shared file (or, too large to
        share, alone), units that outgrew the hold to their own files, and the rows that
        came of units already there."""
        steps: list[_Step] = []
        for unit, held in list(self._units.items()):
            if held.ready:
                del self._units[unit]
                if held.alone or not self._fits(held.rows, held.nbytes, None):
                    steps += self._alone(held, close=True)
                elif held.runs:
                    steps += self._share(held)
            elif (held.alone and held.runs) or held.rows >= (self.target.rows or held.rows + 1):
                steps += self._alone(held, close=False)
        arriving = sorted(self._units.values(), key=lambda h: h.nbytes)
        held_bytes = sum(h.nbytes for h in arriving)
        while arriving and held_bytes >= self.unit_bytes:  # the largest goes on to its files
            held = arriving.pop()
            held_bytes -= held.nbytes
            steps += self._alone(held, close=False)
        for writer, (shared, since) in list(self._shared.items()):
            if self._clock() - since >= self.hold:
                steps.append(_Step(shared, close=True))
                del self._shared[writer]
        return steps

    def _fits(self, rows: int, nbytes: int, file: DataFile | None) -> bool:
        """Whether ``rows`` rows of ``nbytes`` still fit ``file`` (``None``: an empty one)."""
        rows += file.rows if file is not None else 0
        nbytes += file.nbytes if file is not None else 0
        return nbytes <= self.target.bytes and rows <= (self.target.rows or rows)

    def _full(self, file: DataFile) -> bool:
        return file.nbytes >= self.target.bytes or file.rows >= (self.target.rows or file.rows + 1)

    def _share(self, held: _Held) -> list[_Step]:
        """A whole unit appended to this writer thread's shared file (a new one if it does
        not fit)."""
        runs = _alike(sorted(held.runs, key=lambda run: run[0].start))
        if any(not rows.schema.equals(runs[0][1].schema) for _, rows in runs):
            return self._alone(held, close=True)  # a column of two types: a file for each
        steps = []
        writer = threading.get_ident()
        shared, since = self._shared.pop(writer, (None, self._clock()))
        if shared is not None and not (
            self._fits(held.rows, held.nbytes, shared) and all(shared.takes(t) for _, t in runs)
        ):
            steps.append(_Step(shared, close=True))
            shared = None
        if shared is None:
            shared, since = self.writer.new_file(runs[0][0].unit, runs[0][0].start), self._clock()
        step = _Step(shared, [shared.plan(record, rows) for record, rows in runs])
        step.close = self._full(shared)
        if not step.close:
            self._shared[writer] = (shared, since)
        return [*steps, step]

    def _alone(self, held: _Held, close: bool) -> list[_Step]:
        """The unit's held runs appended to its own files, a new one each time one fills
        (``close``: its last rows, so its last file is closed too)."""
        steps: list[_Step] = []
        pending, later = _in_order(held, _alike(sorted(held.runs, key=lambda r: r[0].start)), close)
        held.runs, held.alone = later, True
        held.rows = sum(rows.num_rows for _, rows in later)
        held.nbytes = sum(rows.nbytes for _, rows in later)
        while pending:
            record, rows = pending.pop(0)
            file = held.file
            if file is not None and not (file.takes(rows) and self._room(file, rows)):
                _close(steps, file)  # full, or other columns or types: the next file
                file = held.file = None
            if file is None:
                file = held.file = self.writer.new_file(record.unit, record.start)
            if not steps or steps[-1].file is not file:
                steps.append(_Step(file))
            room = self._room(file, rows)
            if room < rows.num_rows and not record.error_rows:  # the rest to the next file
                (record, rows), rest = split_run(record, rows, room)
                pending.insert(0, rest)
            steps[-1].runs.append(file.plan(record, rows))
            if self._full(file):
                _close(steps, file)
                held.file = None
        if close and held.file is not None:
            _close(steps, held.file)
            held.file = None
        return steps

    def _room(self, file: DataFile, rows: pa.Table) -> int:
        """How many of ``rows`` still fit ``file`` (at least one in an empty file)."""
        by_size = (self.target.bytes - file.nbytes) * int(rows.num_rows) // max(rows.nbytes, 1)
        room = min(by_size, (self.target.rows or by_size + file.rows) - file.rows)
        return max(int(room), 0 if file.rows else 1)

    def _take_files(self, steps: list[_Step]) -> None:
        """Take the steps' files' locks, in order (under the coalescer's lock)."""
        for file in _distinct(steps):
            file.lock.acquire()

    def _run(self, steps: list[_Step]) -> list[PartRecord]:
        """Append and close as decided; the records of the files closed."""
        records: list[PartRecord] = []
        try:
            for step in steps:
                if step.runs:
                    step.file.append([r for r, _ in step.runs], [t for _, t in step.runs])
                if step.close:
                    records += step.file.close()
        finally:
            for file in _distinct(steps):
                file.lock.release()
        return records


def _in_order(held: _Held, runs: list[Run], everything: bool) -> tuple[list[Run], list[Run]]:
    """The runs that go on now, from the unit's next row without a gap, and those that
    wait for a run before them (``everything``: the unit's last rows are in, all go on)."""
    if everything:
        return runs, []
    at = held.next
    for i, (record, _) in enumerate(runs):
        while at in held.gaps:
            at = held.gaps.pop(at)
        if record.start != at:
            held.next = at
            return runs[:i], runs[i:]
        at = record.end
    held.next = at
    return runs, []


def _alike(runs: list[Run]) -> list[Run]:
    """A unit's runs with each column that some of them have of the ``null`` type (a model
    returned only ``None`` for their rows), or holding it (only empty lists:
    ``list<null>``), of the type the others have for it: a file takes
    one schema, and the unit's rows go on in one file, not a new one each time the type
    changes (:mod:`chute.runner.retype` types the files written before a type was known)."""
    types: dict[str, pa.Field] = {}
    for _, rows in runs:
        for column in rows.schema:
            known = types.setdefault(column.name, column)
            types[column.name] = known.with_type(typed_by(known.type, column.type))
    like = pa.schema(list(types.values()))
    return [nulls_typed(record, rows, like) for record, rows in runs]


def _close(steps: list[_Step], file: DataFile) -> None:
    """Close ``file`` after what the steps already append to it."""
    if steps and steps[-1].file is file:
        steps[-1].close = True
    else:
        steps.append(_Step(file, close=True))


def _distinct(steps: list[_Step]) -> list[DataFile]:
    return list({id(step.file): step.file for step in steps}.values())
