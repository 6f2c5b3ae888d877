"""The model stage: one replica of a model, loaded once, appending its outputs to batches.

Rows a model raises on are isolated by bisection (``on_error: quarantine``) or reported
with their unit and position (``fail``); an out-of-memory error halves the batch; a call
past its ``timeout`` replaces the replica. How many rows each call takes is the replica's
:class:`~chute.stages.batching.BatchSizer`: fixed, or measured (``batch_size: auto``).
"""

from __future__ import annotations

import dataclasses
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa

from chute.deadline import BatchTimeout, Caller
from chute.errors import ChuteError, ColumnNotFoundError, ConfigError, DataError, ModelError
from chute.job import AUTO_BATCH_ROWS, DEFAULT_BATCH_ROWS, BatchFormat, Model
from chute.models import AdapterSpec, ReplicaContext
from chute.models.base import PREPARED, ROW, torch_threads
from chute.oom import is_out_of_memory
from chute.stages.batching import Batching, BatchSizer
from chute.stages.clock import StageClock
from chute.stages.convert import cast_exactly, to_columns, to_format, typed_by
from chute.stages.rows import (
    KEY,
    decode,
    healthy_rows,
    keep_mask,
    mark_failed,
    output_field,
    scatter,
)
from chute.usercode import check_callable, resolve, user_frame

ROW_ERROR = "_error"
"""The output a model may return to fail rows without raising: a message per row, null for
rows that succeeded (``{"p": p, "_error": messages}``)."""
TIMEOUT_RETRIES = 2
"""Fresh replicas a batch gets after its model timed out, before ``on_error`` applies."""


class RowError(Exception):
    """A row the model marked failed in its ``_error`` output."""


class ModelStage:
    """One replica of a model: loads it once, then appends its outputs to each batch.

    With a ``timeout``, each call of the model runs on a thread of its own
    (:class:`chute.deadline.Caller`) and the replica stops waiting when the time is up: it
    abandons that thread, loads the model afresh and tries the batch again, at most
    :data:`TIMEOUT_RETRIES` times. Then a batch that still hangs is a failure:
    ``fail`` stops the job naming the unit; ``quarantine`` bisects it like a batch that
    raises, one timeout per halving, so only the rows the model hangs on are lost.
    """

    def __init__(
        self,
        model: Model,
        inputs: Sequence[str],
        target: Any = None,
        ctor: tuple[tuple[Any, ...], dict[str, Any]] | None = None,
        gpu: int | None = None,
        rows: int | None = None,
        timer: Callable[[], float] = time.perf_counter,
        threads: int | None = None,
        outputs: OutputTypes | None = None,
    ) -> None:
        """``target`` and ``ctor`` replace ``model.fn`` and its arguments when an engine
        ships them separately (on Ray: through the object store, once); ``gpu`` is the
        local GPU a replica of the local engine uses, ``threads`` the intra-op threads the
        engine planned for it (see :class:`ReplicaContext`); ``outputs``, the output
        columns' types the replicas of one stage in a process share (:meth:`_typed`)."""
        self.name = model.name
        self._gpu = gpu
        self.threads = threads
        """The intra-op threads each model call sets (torch's, on the calling thread); an
        engine may change them between calls (the local engine, as its pool grows)."""
        self.inputs = list(inputs)
        self.batch_format: BatchFormat = model.batch_format
        self.on_error = model.on_error
        self.clock = StageClock()
        target = resolve(model.fn) if target is None else target
        args, kwargs = ctor if ctor is not None else (model.args, dict(model.kwargs))
        self.sizer = sizer_for(model, rows, target)
        """Rows per model call: ``rows`` (the plan's start) kept, or moved (``auto``)."""
        self._timer = timer
        self._prepared: str | None = None
        """Prefix of the columns an adapter's preparer made for this model."""
        self.timeout = model.timeout
        self._made_with = (model, target, args, kwargs)
        """What :meth:`_reload` builds the model from (kept as data, not as a bound method:
        a stage that referred to itself would free a big model only at the next collection)."""
        self._loads, self._load_seconds = 0, 0.0
        """Model loads not yet reported (:meth:`take_batching`), and their seconds."""
        began = time.perf_counter()
        self._fn = self._reload()
        self._first_load = time.perf_counter() - began
        self._hung = 0
        """Calls in a row that timed out."""
        self._widest = 0
        """The most rows of a call so far (a quarantine's bisection of it times out once a
        level, on the way to a row that hangs)."""
        self._outputs = outputs or OutputTypes()
        self._caller = self._new_caller()

    def _new_caller(self) -> Caller | None:
        return None if self.timeout is None else Caller(f"chute-{self.name}-call")

    def close(self) -> None:
        """Let the thread that calls the model (with a timeout) end."""
        if self._caller is not None:
            self._caller.close()

    def built(self) -> Callable[[], object] | None:
        """A weak reference to the model this stage built (a class's instance, an
        adapter), to tell whether it outlives the stage (a model that refers to itself is
        freed only by the cycle collector); ``None`` where it built nothing (a function,
        an object the job holds), or a reference that never dies where it cannot be
        watched."""
        if not self._builds():
            return None
        try:
            return weakref.ref(self._fn)
        except TypeError:  # no weak references to it: take it for alive
            fn = self._fn
            return lambda: fn

    def _builds(self) -> bool:
        """Whether this stage builds its model (a class, an adapter), not a function or
        object the job holds."""
        return isinstance(self._made_with[1], type | AdapterSpec)

    def _reload(self) -> Callable[[Any], Any]:
        began = time.perf_counter()
        fn = self._load(*self._made_with)
        if self._builds():
            self._loads += 1
            self._load_seconds += time.perf_counter() - began
        return fn

    def _load(
        self, model: Model, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Callable[[Any], Any]:
        if isinstance(target, AdapterSpec):
            return self._load_adapter(model, target)
        check_callable(f"model {model.name!r}", target, bool(args or kwargs))
        if not isinstance(target, type):
            return target  # type: ignore[no-any-return]
        try:
            instance = target(*args, **kwargs)
        except (Exception, SystemExit) as exc:  # sys.exit() in user code: a failure too
            raise ModelError(f"model {model.name!r} failed to load: {_named(exc)}") from exc
        if not callable(instance):
            raise ConfigError(f"model {model.name!r}: {target.__name__} has no __call__.")
        return instance  # type: ignore[no-any-return]

    def _load_adapter(self, model: Model, spec: AdapterSpec) -> Callable[[Any], Any]:
        """A built-in adapter gets Arrow batches whatever ``batch_format`` says: it converts."""
        self.batch_format = "pyarrow"
        self._prepared = f"{PREPARED}{model.name}__"
        try:
            return spec.build(ReplicaContext(model.name, model.resources, self._gpu, self.threads))
        except ChuteError:
            raise
        except (Exception, SystemExit) as exc:
            raise ModelError(
                f"model {model.name!r} ({spec.kind}) failed to load: {_named(exc)}"
            ) from exc

    def __call__(self, table: pa.Table) -> pa.Table:
        """Append this model's outputs; rows it raises on are failed (quarantine) or fatal."""
        started = time.perf_counter()
        healthy = healthy_rows(table)
        missing = [c for c in self.inputs if c not in table.column_names]
        have = ", ".join(c for c in table.column_names if not c.startswith("__chute"))
        if missing and have and (healthy is None or len(healthy)):
            # the plan checks the input's columns; a step's are known now (a batch with
            # none of the data's columns is chute's: a skipped unit's place; one whose rows
            # all failed in an earlier model has none of that model's outputs)
            raise ColumnNotFoundError(
                f"model {self.name!r} reads {', '.join(map(repr, missing))}, which the batch "
                f"does not have (its columns: {have}): "
                "neither the input nor the preprocess step makes it, nor a model listed "
                "before this one. Fix the model's inputs, or make the column first."
            )
        view = table if healthy is None else table.filter(keep_mask(healthy, table.num_rows))
        pieces, failures = self._predict_isolating(view)
        positions = np.arange(view.num_rows) if healthy is None else healthy
        done = np.concatenate([positions[lo:hi] for lo, hi, _ in pieces] or [np.empty(0, int)])
        for name, array in scatter(pieces, done, table.num_rows).items():
            if name in table.column_names or name.startswith("__chute_"):
                raise ModelError(  # chute's own columns: its row keys and failure marks
                    f"model {self.name!r} returned column {name!r}, but "
                    + (
                        "names that start with '__chute_' are chute's own"
                        if name.startswith("__chute_")
                        else "the batch already has a column of that name"
                    )
                    + ": rename the model or its output."
                )
            table = table.append_column(output_field(self.name, name, array), array)
        if failures:
            table = mark_failed(
                table, positions[[i for i, _ in failures]], self.name, [exc for _, exc in failures]
            )
        self.clock.record(time.perf_counter() - started, table.num_rows)
        take = getattr(self._fn, "take_counters", None)
        if callable(take):  # an adapter's counters (an LLM's tokens): the report sums them
            self.clock.count(take())
        return table

    @property
    def batch_rows(self) -> int:
        """The rows this replica's next model call takes."""
        return self.sizer.rows

    def take_batching(self) -> Batching:
        """What the sizing did since the last call (resizes, out-of-memory splits, calls),
        the size now, and the model loads since."""
        loads, self._loads = self._loads, 0
        seconds, self._load_seconds = self._load_seconds, 0.0
        return dataclasses.replace(self.sizer.take(), loads=loads, load_seconds=seconds)

    def _predict(self, view: pa.Table, batch: Any = None) -> dict[str, pa.Array]:
        if batch is None:
            batch = to_format(self._model_view(view), self.batch_format)
        self._widest = max(self._widest, view.num_rows)
        out = self._call(batch)
        columns = to_columns(out, self.name, view.num_rows, f"model {self.name!r}", batch)
        return self._typed(columns)

    def _typed(self, columns: dict[str, pa.Array]) -> dict[str, pa.Array]:
        """Each output column as the type it had in this replica's first batch that had
        values: NumPy and pandas make an integer column with a null ``float64`` in that
        batch only, and the files of one output would then disagree (or one file could not
        take the batch). A batch whose values that type cannot hold exactly is an error
        that says what to return instead; all-null values take the type. A type that
        holds ``null`` (all-null values, or empty lists: ``list<null>``, a struct's field
        that was always ``None``) is not yet known there: a later batch's type fills it in
        (:func:`~chute.stages.convert.typed_by`). The columns themselves must be the same
        in every batch."""
        marks = f"{self.name}_{ROW_ERROR}"  # rows it failed: a column of some batches only
        names = sorted(c for c in columns if c != marks)
        known = self._outputs
        with known.lock:
            if known.names is None:
                known.names = names
                known.order = [c for c in columns if c != marks]
            wanted, types, order = known.names, known.types, list(known.order)
            for name, array in columns.items():
                if name != marks:  # a type not yet known (null, list<null>...) takes this one's
                    types[name] = typed_by(types[name], array.type) if name in types else array.type
            types = dict(types)
        if names != wanted:
            raise ModelError(
                f"model {self.name!r} returned the columns {', '.join(names)} in this batch "
                f"and {', '.join(wanted)} in an earlier one: return the same columns "
                "every time (a value it has none for can be null)."
            )
        for name, array in columns.items():
            if name == marks:
                continue
            want = types[name]
            if array.type == want:
                continue
            try:
                columns[name] = cast_exactly(pa.chunked_array([array]), want).combine_chunks()
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                fix = (
                    "Return one type in every batch (such as .astype('float64')), or give "
                    "the model pyarrow batches (with numpy or pandas, an integer column with "
                    "a null arrives as float64 in that batch only)."
                )
                if pa.types.is_fixed_size_list(want) and pa.types.is_list(array.type):
                    fix = (  # rows that happened to be of one length in the first batch
                        "An earlier batch's rows were all of one length, so they became a "
                        "fixed-size list; return the rows as an Arrow list column "
                        "(pa.array(rows, pa.list_(pa.float64())), say) in every batch."
                    )
                raise ModelError(
                    f"model {self.name!r} returned {name!r} as {array.type} in this batch and "
                    f"as {want} in an earlier one, and these values cannot be {want} ({exc}): "
                    f"the files of one output would disagree. {fix}"
                ) from exc
        # in the first batch's order: files whose columns come in two orders are read
        # wrong by whatever takes columns by position (a CSV read without its header)
        ordered = {name: columns[name] for name in order}
        if marks in columns:
            ordered[marks] = columns[marks]
        return ordered

    def _slicer(self, view: pa.Table) -> Callable[[int, int], Any]:
        """Batches of rows ``lo..hi`` of ``view`` for bisection: NumPy batches are cut from
        one conversion of the whole view (a copy of the slice each, so a model that writes
        into its input cannot change a later call's rows); other formats as usual."""
        if self.batch_format != "numpy":
            return lambda lo, hi: None
        inputs = self._model_view(view)
        if any(column.null_count for column in inputs.columns):
            # an integer column with a null is float64 in the slices that hold it only:
            # which rows fail must not depend on where the null sits in the batch
            return lambda lo, hi: None
        try:
            whole = to_format(inputs, "numpy")
        except DataError:  # a row no array can hold (a null list): each slice on its own
            return lambda lo, hi: None
        return lambda lo, hi: {name: array[lo:hi].copy() for name, array in whole.items()}

    def _call(self, batch: Any) -> Any:
        """The model's outputs for ``batch``; past the timeout, :class:`BatchTimeout` and a
        freshly loaded replica for the next call."""
        fn = self._fn if self.threads is None else partial(_with_threads, self.threads, self._fn)
        if self._caller is None or self.timeout is None:
            return fn(batch)
        try:
            out = self._caller.call(fn, batch, self.timeout)
        except BatchTimeout:
            self._caller.close()  # its thread ends if the hung call ever returns
            self._caller = self._new_caller()
            self._hung += 1
            self._replace_hung()
            raise BatchTimeout(
                f"model {self.name!r} timed out after {self.timeout:g} s (no answer; the "
                "replica was replaced)"
            ) from None
        self._hung = 0
        return out

    def _replace_hung(self) -> None:
        """A fresh replica after a call that hung, loaded under a deadline too (a device
        that stopped answering hangs the load as well: the run fails, naming the model).
        A function or object the job holds cannot be loaded afresh: the hung call may hold
        it (a lock), and every call after would time out, so a few in a row fail the run."""
        assert self._caller is not None and self.timeout is not None
        if not self._builds():
            bisection = TIMEOUT_RETRIES + 1 + 2 * self._widest.bit_length()
            if self._hung >= max(HUNG_IN_A_ROW, bisection):
                raise ModelError(
                    f"model {self.name!r} timed out on {self._hung} calls in a row. It is "
                    "a function or an object the job holds, which chute cannot load afresh "
                    "when a call hangs (the hung call may still hold it): give the class "
                    "instead (each replica builds its own), or fix what hangs."
                )
            return
        deadline = max(self.timeout, RELOAD_DEADLINE, 10 * self._first_load)
        try:
            self._fn = self._caller.call(lambda _: self._reload(), None, deadline)
        except BatchTimeout:
            raise ModelError(
                f"model {self.name!r} hung on a call (timeout {self.timeout:g} s), and a fresh "
                f"replica did not load within {deadline:g} s either: the machine (a GPU that "
                "stopped answering?) or the model is stuck. Check it, then run the job again: "
                "it resumes."
            ) from None

    def _model_view(self, view: pa.Table) -> pa.Table:
        """The model's input columns, and what its adapter's preparer made for it."""
        batch = view.select(self.inputs)
        if getattr(self._fn, "wants_rows", False):  # an LLM's seeds: the row, not the batch
            keys = view.column(KEY).to_numpy()
            batch = batch.append_column(ROW, pa.array(np.where(keys < 0, -keys - 1, keys)))
        prefix = self._prepared
        if prefix is None:
            return batch
        for name in view.column_names:
            if name.startswith(prefix):
                batch = batch.append_column(PREPARED + name[len(prefix) :], view.column(name))
        return batch

    def _predict_isolating(
        self, view: pa.Table
    ) -> tuple[list[tuple[int, int, dict[str, pa.Array]]], list[tuple[int, Exception]]]:
        """Predict ``view``; on an exception, bisect to the rows that raise.

        Returns the predicted pieces as (first row, end row, columns) and the failed rows.
        Under ``fail`` the first failing row is found and raised with its position.

        The cost is bounded by the bad rows, not the batch: a failing range is halved, the
        lower half tried first, and when the lower half succeeds the upper one is known to
        hold a failing row, so it is halved again without a call. Isolating ``k`` failing
        rows in a batch of ``n`` takes at most ``1 + k * (2 * log2(n) + 1)`` calls (about
        ``1.5 * log2(n / k)`` per row when they are spread out). A model that marks its
        failed rows itself (an ``_error`` column: a message, or null) costs no extra call.

        An out-of-memory error is no row's fault: the range is halved and retried, and the
        replica's sizer keeps the smaller size until it grows back (:mod:`.batching`).
        Rows are cut into calls as they come, at the size of the moment, so a size that
        changes applies to the next call; every call that answers (a bisection's halves
        too) is timed and measured for the sizer, and a whole call that times out shrinks
        a measured size (:meth:`BatchSizer.timed_out`).
        """
        pieces: list[tuple[int, int, dict[str, pa.Array]]] = []
        failures: list[tuple[int, Exception]] = []
        lower_ok: list[bool | None] = []  # per split: did its lower half succeed?
        pending = [(0, view.num_rows, -1, -1)] if view.num_rows else []
        retries = TIMEOUT_RETRIES
        slicer: Callable[[int, int], Any] | None = None  # made at the first failure
        while pending:
            lo, hi, reports, after = pending.pop()
            if hi - lo > self.sizer.rows:  # cut the next call at the size of the moment
                pending += [(a, b, -1, -1) for a, b in self._chunks(lo, hi)]
                continue
            if after >= 0 and lower_ok[after] and hi - lo > 1:  # known to hold a bad row
                pending += self._halves(lo, hi, lower_ok)
                continue
            try:
                began = self._timer()
                batch = slicer(lo, hi) if slicer is not None else None
                columns = self._predict(view.slice(lo, hi - lo), batch)
                took = self._timer() - began
            except (Exception, SystemExit) as caught:
                exc = _as_exception(caught)
                if slicer is None and not is_out_of_memory(exc):
                    slicer = self._slicer(view)
                if reports >= 0:
                    lower_ok[reports] = False
                if is_out_of_memory(exc):
                    halves = self._split_for_memory(view, lo, hi, exc)
                    pending += [(a, b, -1, -1) for a, b in halves]
                elif isinstance(exc, ModelError):
                    raise
                elif isinstance(exc, BatchTimeout) and retries:
                    retries -= 1  # the same rows, a fresh replica; a measured size shrinks
                    if reports < 0 and after < 0 and self.sizer.timed_out(hi - lo, self.timeout):
                        pending += [(a, b, -1, -1) for a, b in self._chunks(lo, hi)]
                    else:
                        pending.append((lo, hi, reports, after))
                elif isinstance(exc, BatchTimeout) and self.on_error == "fail":
                    raise self._timed_out(view, lo, hi) from exc
                elif hi - lo > 1:
                    pending += self._halves(lo, hi, lower_ok)
                elif self.on_error == "quarantine":
                    failures.append((lo, exc))
                else:
                    raise self._fatal(view, lo, exc) from exc
                continue
            if reports >= 0:
                lower_ok[reports] = True
            # every call that answered, a bisection's halves too (a job whose every batch
            # holds a failing row is measured all the same)
            self.sizer.fitted(hi - lo, took, _nbytes(view, self.inputs, lo, hi, columns))
            failures += self._marked(view, lo, columns)
            if pending:  # more calls before the pieces are joined: their arrays, Arrow's
                # wrapping of the model's own (no copy), would be overwritten by a model
                # that refills one buffer each call (a static output tensor, ``out=``)
                columns = {name: pa.concat_arrays([a]) for name, a in columns.items()}
            pieces.append((lo, hi, columns))
        pieces.sort(key=lambda piece: piece[0])
        return pieces, sorted(failures, key=lambda failure: failure[0])

    @staticmethod
    def _halves(lo: int, hi: int, lower_ok: list[bool | None]) -> list[tuple[int, int, int, int]]:
        """The two halves of a failing range, lower last (popped first); the upper one
        learns whether the lower succeeded (then it holds the failing row)."""
        mid, split = (lo + hi) // 2, len(lower_ok)
        lower_ok.append(None)
        return [(mid, hi, -1, split), (lo, mid, split, -1)]

    def _marked(
        self, view: pa.Table, lo: int, columns: dict[str, pa.Array]
    ) -> list[tuple[int, Exception]]:
        """Rows the model marked failed in its ``_error`` column (removed from its outputs)."""
        marks = columns.pop(f"{self.name}_{ROW_ERROR}", None)
        if marks is None or marks.null_count == len(marks):
            return []
        valid = np.flatnonzero(marks.is_valid().to_numpy(zero_copy_only=False))
        texts = marks.take(pa.array(valid)).cast(pa.string()).to_pylist()
        failed: list[tuple[int, Exception]] = [
            (lo + int(i), RowError(str(text))) for i, text in zip(valid, texts, strict=True)
        ]
        if self.on_error != "quarantine":
            row, exc = failed[0]
            raise self._fatal(view, row, exc) from exc
        return failed

    def _chunks(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The next call's rows (``lo`` and the sizer's rows on) and the rest after them,
        the call last (popped first)."""
        cut = min(lo + self.sizer.rows, hi)
        return [(cut, hi), (lo, cut)] if cut < hi else [(lo, hi)]

    def _split_for_memory(
        self, view: pa.Table, lo: int, hi: int, exc: Exception
    ) -> list[tuple[int, int]]:
        """Halve the replica's batch after an out-of-memory error on rows ``lo..hi``."""
        if hi - lo == 1:
            raise self._out_of_memory(view, lo, exc) from exc
        self.sizer.out_of_memory(hi - lo)
        return self._chunks(lo, hi)

    def _out_of_memory(self, view: pa.Table, row: int, exc: Exception) -> ModelError:
        unit, position, text = self._row(view, row)
        return ModelError(
            f"model {self.name!r} ran out of memory ({type(exc).__name__}: {exc}) on a single "
            f"row: row {position} of unit {unit}; the row: {text}. Make the inputs smaller, "
            "give the model more memory, or run fewer replicas per GPU.",
            unit=unit,
            row=position,
        )

    def _timed_out(self, view: pa.Table, lo: int, hi: int) -> ModelError:
        unit, position, _ = self._row(view, lo)
        units = sorted({int(u) for u in decode(view.column(KEY).to_numpy()[lo:hi])[0]})
        return ModelError(
            f"model {self.name!r} timed out after {self.timeout:g} s, {TIMEOUT_RETRIES + 1} "
            f"times (a freshly loaded replica each time), on a batch of {hi - lo} row(s) of "
            f"unit(s) {', '.join(map(str, units))} from row {position} of unit {unit}. Make "
            "the model answer sooner, raise its timeout, or set on_error: quarantine to write "
            "the rows it hangs on to the errors dataset and go on.",
            unit=unit,
            row=position,
        )

    def _fatal(self, view: pa.Table, row: int, exc: Exception) -> ModelError:
        unit, position, text = self._row(view, row)
        return ModelError(
            f"model {self.name!r} raised {type(exc).__name__}: {exc}{user_frame(exc)} — on "
            f"row {position}"
            f" of unit {unit}; the row: {text}. Fix the model or the data, or set "
            "on_error: quarantine to write such rows to the errors dataset and go on.",
            unit=unit,
            row=position,
        )

    @staticmethod
    def _row(view: pa.Table, row: int) -> tuple[int, int, str]:
        """The unit and position of ``row`` in ``view``, and the row shown briefly."""
        keys = view.column(KEY).to_numpy()[row : row + 1]
        unit, position, _ = decode(keys)
        shown = {  # the row as the job knows it: never chute's own bookkeeping columns
            k: v
            for k, v in view.slice(row, 1).to_pylist()[0].items()
            if not k.startswith("__chute")
        }
        text = repr(shown)
        text = text if len(text) <= 500 else text[:500] + "…"
        return int(unit[0]), int(position[0]), text


class OutputTypes:
    """A model's output columns and their types, as its first batches with values had
    them: one for the replicas of a stage in a process (:meth:`ModelStage._typed`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.names: list[str] | None = None
        self.order: list[str] = []
        """The columns in the order of the first batch: every batch's, so every file's."""
        self.types: dict[str, pa.DataType] = {}


HUNG_IN_A_ROW = 16
"""Calls in a row that may time out on a model chute cannot load afresh (a function, an
object the job holds) before the run fails; at least as many as a quarantine's bisection
takes to reach a row that hangs in the widest call (its retries, and two a level)."""
RELOAD_DEADLINE = 60.0
"""The least seconds a replica reloaded after a hung call may take (else ten times its first
load, or the call's timeout, whichever is longest)."""


def sizer_for(model: Model, rows: int | None = None, target: Any = None) -> BatchSizer:
    """The sizer of a replica: from ``rows`` (the plan's start, or the model's own size),
    measured toward the model's target under ``auto`` — unless the model is an adapter
    whose engine schedules its own batches (``Adapter.auto_batch_rows``): then fixed."""
    size = model.batch_size
    if isinstance(target, str) or target is None:
        target = model.fn
    own = None
    if isinstance(target, AdapterSpec):
        own = target.load_class(check=False).auto_batch_rows
    if not size.auto or own is not None:
        return BatchSizer(rows or own or size.rows or DEFAULT_BATCH_ROWS)
    return BatchSizer(rows or size.rows or AUTO_BATCH_ROWS, size.target.within(model.timeout))


def _nbytes(view: pa.Table, inputs: list[str], lo: int, hi: int, out: dict[str, pa.Array]) -> int:
    """Bytes of a call's input columns and its outputs, as Arrow holds them."""
    held = view.slice(lo, hi - lo).select(inputs).nbytes
    return int(held + sum(array.nbytes for array in out.values()))


def _with_threads(threads: int, fn: Callable[[Any], Any], batch: Any) -> Any:
    """``fn(batch)`` with the replica's torch threads set on the thread that runs it (the
    replica's own, or the one that calls it with a timeout)."""
    torch_threads(threads)
    return fn(batch)


def _named(exc: BaseException) -> str:
    """``Kind: message`` (a repr drops what an OSError says: the file it could not open)."""
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r})"
    return f"{type(exc).__name__}: {exc}"


def _as_exception(exc: BaseException) -> Exception:
    """What a call raised, a ``sys.exit()`` in the model made an error like any other (it
    must fail the call, never end the run as if it had finished)."""
    if isinstance(exc, Exception):
        return exc
    return RuntimeError(f"the model called sys.exit({getattr(exc, 'code', None)!r})")
