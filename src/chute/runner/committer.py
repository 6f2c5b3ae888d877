"""The committer: part records in, units committed to the ledger as soon as their parts
cover them, metric states merged as they commit."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from chute.errors import DataError, ModelError
from chute.evaluation import from_text, to_text
from chute.ledger import Ledger
from chute.metrics import State
from chute.plan import Plan
from chute.report import ProgressBar, StageStats, add_counters, progress_note
from chute.sinks import PartRecord, read_ipc
from chute.sinks.records import canonical_text, merged_text, text_holds_null
from chute.sources import Unit
from chute.stages import KEY, decode

log = logging.getLogger("chute")


FAILURE_SAMPLE = 1_000
"""Rows committed before ``max_failed_fraction`` is checked (all of them, when fewer)."""


class Committer:
    """Collects part records and commits each unit once its parts cover all of its rows."""

    def __init__(self, plan: Plan, ledger: Ledger | None, bar: ProgressBar | None) -> None:
        self.plan = plan
        self.ledger = ledger
        self.bar = bar
        self.units: dict[int, Unit] = {u.index: u for u in plan.pending}
        self._parts: dict[int, list[PartRecord]] = defaultdict(list)
        self._totals: dict[int, int] = {}
        self.done: set[int] = set()
        self.again: set[int] = set()
        """Units whose rows arrived a second time (computed again, on Ray after a lost
        node or task): the second copy is left out."""
        self.rows_in = 0
        self.rows_out = 0
        self.rows_failed = 0
        self._bad_rows = 0
        """Input rows that could not be decoded (on_bad_input: skip), among ``rows_failed``:
        the input's, which ``max_failed_fraction`` (a model's failures) leaves out."""
        self._order = sorted(self.units)
        """This run's units in input order: the failed share is taken over those from the
        first on that are all committed (:meth:`_check_failures`)."""
        self._counts: dict[int, tuple[int, int]] = {}
        """Rows and failed rows of each unit committed, until the prefix passes it."""
        self._prefix = (0, 0, 0)
        """Units in the prefix, their rows and their failed rows."""
        self.saw_null = False
        """Whether a part wrote a column of the ``null`` type (see :mod:`chute.runner.retype`)."""
        self.skipped: list[dict[str, str]] = []
        self._started = time.perf_counter()
        self.timeline: list[tuple[float, int]] = [(0.0, 0)]
        """(seconds since start, rows written) as parts arrive: the rate over the run."""
        self._files: set[str] = set()
        """The data files written (a file shared by several units counts once)."""
        self._columns: dict[str, str] | None = None
        """The columns and types of the parts accepted so far (all-null ones: "null"), those
        of earlier runs included (:meth:`absorb`)."""
        self._absorbed = False
        """Whether columns of parts an earlier run committed are among those known."""
        self.write = StageStats()
        self.counted: dict[str, float] = {}
        """What the models counted so far, over every stage (for the progress line)."""
        self.evaluation = plan.evaluation
        self.metric_states: dict[str, State] = {}
        """The job's merged metric states (committed units only): size independent of rows."""
        self._unit_states: dict[int, dict[str, State]] = defaultdict(dict)
        self._tables: list[tuple[int, int, pa.Table]] = []
        self._pending: list[dict[str, Any]] = []
        """Completed units not yet in the ledger (object stores write them in batches)."""
        self._flushed = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def __enter__(self) -> Committer:
        """Flush due ledger batches on a timer too: a unit that completed must not wait
        for the next one to complete before it is committed (object stores batch)."""
        if self.ledger is not None and self.ledger.batch_seconds > 0:
            threading.Thread(target=self._tick, name="chute-commit", daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()

    def _tick(self) -> None:
        assert self.ledger is not None
        while not self._stop.wait(min(0.25, self.ledger.batch_seconds)):
            with self._lock:
                if self._pending and self._due():
                    try:
                        self._flush()
                    except Exception:  # the driver's next commit or final flush retries
                        log.debug("a timed ledger flush failed", exc_info=True)

    def _due(self) -> bool:
        waited, elapsed = time.monotonic() - self._flushed, time.perf_counter() - self._started
        return self.ledger is None or self.ledger.flush_due(waited, elapsed)

    def _same_columns(self, record: PartRecord) -> None:
        """Every part writes the same columns with the same types: the files of one output
        agree (a part whose column is all null takes any type). Each replica types a
        model's outputs from the first batch it sees, and on Ray each worker process has
        its own: two of them may differ, where one replica would have refused the batch."""
        if record.columns:
            self.saw_null = self.saw_null or _has_null(record.columns)
            self._agree(json.loads(record.columns), f"unit {record.unit}'s part")

    def _agree(self, columns: list[list[str]], whose: str) -> None:
        """Take ``columns`` (name, type pairs) into those known, or refuse them. Those of
        the parts an earlier run committed are known too: without them a resume wrote a
        unit's column as float64 beside the int64 files before it, and the output, marked
        complete, could not be read as one dataset."""
        got = {name: kind for name, kind in columns}
        known = self._columns
        if known is None:
            self._columns = got
            return
        earlier = " (those an earlier run committed among them)" if self._absorbed else ""
        if set(got) != set(known):
            raise ModelError(
                f"{whose} has the columns {', '.join(sorted(got))}, the parts before it"
                f"{earlier} {', '.join(sorted(known))}: a model returned other columns there. "
                "Return the same columns in every batch (a value it has none for can be null)."
            )
        for name, kind in got.items():
            if kind == known[name]:
                continue
            agreed = merged_text(known[name], kind)  # null, list<null>: typed by the other
            if agreed is not None:
                known[name] = agreed
                continue
            raise ModelError(
                f"the output column {name!r} is {known[name]} in the parts written so far"
                f"{earlier} but {kind} in {whose}: a model returned another type there (each "
                "replica takes the type of the first batch it sees, and on Ray each worker "
                "process has its own), and the files of one output would disagree. Return one "
                "type in every batch (such as .astype('float64')), or give the model pyarrow "
                "batches (with numpy or pandas, an integer column with a null arrives as "
                "float64 in that batch only)"
                + ("; then run with --overwrite, or the parts committed stay." if earlier else ".")
            )

    def add(
        self,
        records: Sequence[PartRecord],
        counters: Mapping[str, Mapping[str, float]] | None = None,
        status: str | None = None,
    ) -> None:
        """Take records from the writers; commit the units they complete. ``counters``:
        what the models counted meanwhile (tokens), shown on the progress line; ``status``:
        what the engine waits for, shown in place of the ETA (``""``: no longer waiting)."""
        if status is not None and self.bar is not None:
            self.bar.waiting(status)
        if counters:
            for stage in counters.values():
                add_counters(self.counted, stage)
            self._describe()
        completed: list[int] = []
        for record in records:
            if record.unit not in self.units:
                continue
            if record.unit in self.done or any(
                p.start == record.start for p in self._parts[record.unit]
            ):  # these rows were already written: a retried task, a block made again
                self.again.add(record.unit)
                continue  # its part is an orphan, removed before the run finishes
            self._same_columns(record)
            self._parts[record.unit].append(record)
            if record.unit_rows >= 0:
                self._totals[record.unit] = record.unit_rows
            if record.path:
                self._files.add(record.path)
            if record.metrics:
                self.evaluation.merge(self._unit_states[record.unit], [record.metrics])
            self.write.add(record.seconds, record.end - record.start)
            if record.data:
                self._tables.append((record.unit, record.start, read_ipc(record.data)))
            if self.bar is not None:  # a unit left out (unreadable): its planned rows
                skipped = self.units[record.unit].rows or 0 if record.skipped else 0
                self.bar.advance(record.end - record.start + skipped)
            if self._complete(record.unit):
                self._check_rows(record.unit)
                completed.append(record.unit)
        if records:
            self.timeline.append((round(time.perf_counter() - self._started, 3), self.write.rows))
        self._commit(completed)

    __call__ = add

    def redo(self) -> set[int]:
        """Forget what arrived of the units not complete yet, and return their indexes:
        an engine that planned its work again runs them again, in parts of other sizes."""
        with self._lock:
            left = {index for index in self.units if index not in self.done}
            for index in left:
                self._files -= {p.path for p in self._parts.pop(index, [])}
                self._totals.pop(index, None)
                self._unit_states.pop(index, None)
            self._tables = [t for t in self._tables if t[0] not in left]
        return left

    @property
    def parts(self) -> int:
        """Data files written this run; a file several units share counts once."""
        return len(self._files)

    def _describe(self) -> None:
        """``units 3/12``, and the tokens generated when a model counts them."""
        if self.bar is None:
            return
        note = progress_note(self.counted, time.perf_counter() - self._started)
        units = f"units {len(self.done)}/{len(self.units)}"
        self.bar.describe(f"{units} · {note}" if note else units)

    def _complete(self, index: int) -> bool:
        total = self._totals.get(index)
        if total is None:
            return False
        spans = sorted((p.start, p.end) for p in self._parts[index])
        reached = 0
        for start, end in spans:
            if start != reached:
                return False
            reached = end
        return reached == total

    def _check_rows(self, index: int) -> None:
        """The last guard against a unit committed short: where the plan counted a unit's
        rows (Parquet footers, in-memory data), those that arrived must be as many.
        (Readers check as they read; this holds whatever happened on the way.)"""
        unit, arrived = self.units[index], self._totals[index]
        skipped = any(p.skipped for p in self._parts[index])
        if unit.rows is None or skipped or arrived == unit.rows:
            return
        raise DataError(
            f"unit {unit.id!r} arrived with {arrived:,} rows where the plan counted "
            f"{unit.rows:,}: it is not committed, and the run stops rather than report the "
            "output complete. If the input changed during the run, leave it as it is while a "
            "job runs and run the job again with --overwrite; if it did not, this is a bug "
            "in chute: please report it with the job."
        )

    def _commit(self, indexes: list[int]) -> None:
        if not indexes:
            return
        entries: list[dict[str, Any]] = []
        try:  # the units before one that stops the run (max_failed_fraction) are kept
            for index in indexes:
                entries.append(self._entry(index, self._parts.pop(index)))
        finally:
            with self._lock:
                self._pending.extend(entries)
        with self._lock:
            if self._due():
                self._flush()
        if self.bar is not None:
            self._describe()

    def flush(self) -> None:
        """Write the completed units to the ledger: only now are they committed."""
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        if self.ledger is not None and self._pending:
            self.ledger.commit(self._pending)  # kept pending if this raises
        self._pending = []
        self._flushed = time.monotonic()

    def _entry(self, index: int, parts: list[PartRecord]) -> dict[str, Any]:
        """Count a complete unit and describe it for the ledger."""
        unit = self.units[index]
        skipped = next((p.skipped for p in parts if p.skipped), "")
        rows = 0 if skipped else self._totals[index]
        failed = sum(p.error_rows for p in parts)
        bad_rows = sum(p.input_error_rows for p in parts)  # the input's, not a model's
        states = self._unit_states.pop(index, {})
        merged = dict(self.metric_states)  # a merge that raises (max_groups passed) must
        self.evaluation.merge(merged, [states])  # leave the unit uncounted, as uncommitted
        self._check_failures(index, rows - bad_rows, failed - bad_rows)
        self.metric_states.update(merged)
        self.done.add(index)  # counted only once it is to be committed
        self.rows_in += rows
        self.rows_out += rows - failed
        self.rows_failed += failed
        self._bad_rows += bad_rows
        entry: dict[str, Any] = {
            "unit": unit.id,
            "index": index,
            "rows": rows,
            "errors": failed,
            "parts": list(dict.fromkeys(f for p in parts for f in (p.path, p.errors_path) if f)),
            "files": _files(parts),
        }
        if states:
            entry["metrics"] = to_text(states)
        if skipped:
            entry["skipped"] = skipped
            self.skipped.append({"unit": unit.id, "error": skipped})
        # the files to type once the column's type is known (chute.runner.retype); on every
        # line, so that a line without it (an older chute's) has its files' footers read
        entry["nulls"] = sorted({p.path for p in parts if p.path and _has_null(p.columns)})
        if self._columns is not None:  # for a resume: on every line, as any may be dropped
            entry["columns"] = sorted(self._columns.items())
        tables = [json.loads(p.table) for p in parts if p.table]
        if tables:  # a table output: the parts' schemas (and Lance fragments) to commit
            entry["table"] = tables
        return entry

    def _check_failures(self, index: int, rows: int, failed: int) -> None:
        """Stop a run whose failed rows would pass the job's ``max_failed_fraction`` once
        1,000 rows (or all the planned ones) are in, before the unit that passes it is
        counted or committed: a model that raises on most rows is broken, and quarantining
        them all would end the run "complete" with the output empty.

        The share is of the run's units from the first on that are all committed, in input
        order, not of all committed so far: a unit whose rows all failed has no data file
        to wait for, and commits while the good units before it wait for their shared file
        (:data:`chute.coalesce.HOLD_SECONDS`); counted as they committed, one bad file of
        twenty stopped every run as "1,000 of 1,000 rows failed".

        ``rows`` and ``failed`` leave out input rows that could not be decoded (skipped as
        the job says, ``on_bad_input: skip``): a model that failed none was stopped as
        broken where most images of a folder were unreadable."""
        counts = self._counts
        counts[index] = (rows, failed)
        units, rows_in, failed_in = self._prefix
        passed: dict[int, tuple[int, int]] = {}
        while units < len(self._order) and (unit := self._order[units]) in counts:
            passed[unit] = counts.pop(unit)
            units, rows_in, failed_in = (
                units + 1,
                rows_in + passed[unit][0],
                failed_in + passed[unit][1],
            )
        share = self.plan.job.max_failed_fraction
        seen = min(FAILURE_SAMPLE, self.plan.pending_rows or FAILURE_SAMPLE)
        if failed_in and rows_in >= seen and failed_in > share * rows_in:
            counts.update(passed)  # as it was: this unit is neither counted nor committed
            del counts[index]
            self._fail(failed_in, rows_in, share)
        failed_all = self.rows_failed - self._bad_rows + failed  # the models' failures only
        rows_all = self.rows_in - self._bad_rows + rows
        if failed_all > share * rows_all:  # rare: only then is the bound below worth a look
            # a late first unit (Ray finishes units out of order) must not let a broken
            # model go on: stop where the share passes even if every row of the units not
            # yet in, before the last one committed, turns out good
            top, waiting = max(counts, default=index), 0
            for position in range(units, len(self._order)):
                unit = self._order[position]
                if unit > top or waiting < 0:
                    break
                if unit not in counts:  # rows not known before the read (CSV): no bound
                    known = self.units[unit].rows
                    waiting = waiting + known if known is not None else -1
            bound = rows_all + waiting
            if waiting >= 0 and bound >= seen and failed_all > share * bound:
                counts.update(passed)
                del counts[index]
                self._fail(failed_all, bound, share)
        self._prefix = (units, rows_in, failed_in)

    def _fail(self, failed: int, rows_in: int, share: float) -> None:
        then = (  # --limit and in-memory runs write no errors dataset and commit nothing
            "See the errors dataset (_errors/) for why, fix the model and run the job again "
            "(what was committed stays)"
            if self.ledger is not None
            else "Fix the model (a run with an output writes why each row failed to _errors/)"
        )
        raise ModelError(
            f"{failed:,} of the first {rows_in:,} rows of this run failed "
            f"({failed / rows_in:.0%}; the job allows {share:.0%}, "
            f"max_failed_fraction): a model that fails most rows is broken, not its rows. "
            f"{then}, or raise max_failed_fraction (1.0: never stop)."
        )

    def absorb(self, entries: Iterable[dict[str, Any]]) -> None:
        """Merge the metric states and the output columns of units committed by earlier
        runs (a resume)."""
        entries = list(entries)
        self.evaluation.merge(
            self.metric_states, [from_text(e.get("metrics", "")) for e in entries]
        )
        for entry in entries:
            if entry.get("columns"):
                columns = [[name, canonical_text(kind)] for name, kind in entry["columns"]]
                self._agree(columns, f"the parts of unit {entry['unit']!r}")
                self._absorbed = True

    def missing(self) -> list[Unit]:
        return [u for i, u in self.units.items() if i not in self.done]

    def result(self) -> tuple[pa.Table | None, np.ndarray | None]:
        """In-memory rows in input order (only for runs without an output location), and
        each one's place in the input (a unit's offset and its row in the unit): rows a
        model failed on are not among them, so the places tell which input row each is."""
        if not self._tables:
            return None, None
        ordered = sorted(self._tables, key=lambda t: (t[0], t[1]))
        table = pa.concat_tables([t for _, _, t in ordered])
        units, rows, _ = decode(table.column(KEY).to_numpy())
        offsets = np.zeros(max(u.index for u in self.plan.units) + 1, dtype=np.int64)
        for unit in self.plan.units:
            offsets[unit.index] = unit.offset
        return table.drop_columns([KEY]), offsets[units] + rows


def _has_null(columns: str) -> bool:
    """Whether a part's columns (:func:`~chute.sinks.records.describe_columns`) include one
    of the ``null`` type, or one that holds it (``list<null>``: a model's empty lists)."""
    return bool(columns) and any(text_holds_null(kind) for _, kind in json.loads(columns))


def _files(parts: list[PartRecord]) -> list[list[Any]]:
    """A unit's files for the ledger: ``[path, rows, bytes]``, the unit's rows in a file
    (its runs in one file added up) and the file's bytes; a file that holds other units
    too adds how many units it holds (``[path, rows, bytes, units]``, see
    :mod:`chute.ledger`)."""
    files: dict[str, list[Any]] = {}
    for p in parts:
        for path, rows, size, units in (
            (p.path, p.end - p.start - p.error_rows, p.nbytes, p.file_units),
            (p.errors_path, p.error_rows, p.errors_nbytes, 1),
        ):
            if not path:
                continue
            if path in files:
                files[path][1] += rows
            else:
                files[path] = [path, rows, size] + ([units] if units > 1 else [])
    return list(files.values())
