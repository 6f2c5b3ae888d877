"""Stage logic shared by both engines: plain classes over Arrow tables, no engine inside.

Every row travels with one int64 *row key* column that says which unit it came from and
its position there (``unit << 40 | row``); the last row of a unit carries its key negated
(``-key - 1``) so that a writer can tell a unit's total even when the format did not say
it upfront. Engines re-batch freely; the key keeps the commit exact whatever they do.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa

from chute.deadline import BatchTimeout, Caller
from chute.errors import ChuteError, ConfigError, ModelError
from chute.job import BatchFormat, Model, Preprocess
from chute.models import AdapterSpec, ReplicaContext
from chute.models.base import PREPARED
from chute.oom import is_out_of_memory
from chute.usercode import resolve

KEY = "__chute_key"
ROW_BITS = 40
ROW_MASK = (1 << ROW_BITS) - 1


def tag(table: pa.Table, unit_index: int, start: int, unit_rows: int | None) -> pa.Table:
    """Append the row key for rows ``start..start+n`` of unit ``unit_index``."""
    keys = (unit_index << ROW_BITS) + np.arange(start, start + table.num_rows, dtype=np.int64)
    if unit_rows is not None and table.num_rows and start + table.num_rows == unit_rows:
        keys[-1] = -keys[-1] - 1
    return table.append_column(KEY, pa.array(keys, type=pa.int64()))


def decode(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split row keys into (unit index, row in unit, is-last-row-of-unit)."""
    last = keys < 0
    plain = np.where(last, -keys - 1, keys)
    return plain >> ROW_BITS, plain & ROW_MASK, last


def to_format(table: pa.Table, fmt: BatchFormat) -> Any:
    """The batch a user function receives."""
    if fmt == "pyarrow":
        return table
    if fmt == "pandas":
        return table.to_pandas()
    return {name: _to_numpy(table.column(name)) for name in table.column_names}


def _to_numpy(column: pa.ChunkedArray) -> np.ndarray:
    if isinstance(column.type, pa.FixedShapeTensorType):  # images: (rows, height, width, ch)
        return np.asarray(column.combine_chunks().to_numpy_ndarray())
    if pa.types.is_fixed_size_list(column.type):
        arr = column.combine_chunks()
        width = column.type.list_size
        return np.asarray(arr.flatten().to_numpy(zero_copy_only=False)).reshape(-1, width)
    return np.asarray(column.to_numpy())


def to_columns(out: Any, prefix: str | None, num_rows: int, who: str) -> dict[str, pa.Array]:
    """Normalize what a user function returned into named Arrow arrays of ``num_rows``."""
    if out is None:
        raise ModelError(
            f"{who} returned None; return a dict of columns, a DataFrame, an Arrow table or "
            "an array."
        )
    if isinstance(out, (pa.Table, pa.RecordBatch)):
        items: list[tuple[str | None, Any]] = list(zip(out.column_names, out.columns, strict=True))
    elif isinstance(out, dict):
        items = list(out.items())
    elif type(out).__name__ == "DataFrame":
        items = [(str(c), out[c].to_numpy()) for c in out.columns]
    else:
        items = [(None, out)]
    columns: dict[str, pa.Array] = {}
    for key, values in items:
        name = _column_name(prefix, key, who)
        array = _to_arrow(values, name, who)
        if len(array) != num_rows:
            raise ModelError(
                f"{who} returned {len(array)} values for column {name!r} but the batch has "
                f"{num_rows} rows: return one value per input row."
            )
        columns[name] = array
    return columns


def _column_name(prefix: str | None, key: str | None, who: str) -> str:
    if key is None:
        if prefix is None:
            raise ModelError(f"{who} must return named columns (a dict, DataFrame or table).")
        return prefix
    return f"{prefix}_{key}" if prefix else str(key)


def _to_arrow(values: Any, name: str, who: str) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks()
    if isinstance(values, pa.Array):
        return values
    if hasattr(values, "detach"):  # a torch tensor
        values = values.detach().cpu().numpy()
    try:
        arr = np.asarray(values)
        if arr.ndim == 2:
            flat = pa.array(np.ascontiguousarray(arr).ravel())
            return pa.FixedSizeListArray.from_arrays(flat, arr.shape[1])
        return pa.array(arr)
    except (TypeError, ValueError, pa.ArrowException) as exc:
        raise ModelError(f"{who}: cannot turn output {name!r} into a column: {exc}") from exc


class StageClock:
    """Busy seconds and rows of one stage replica, and its out-of-memory splits."""

    def __init__(self) -> None:
        self.busy = 0.0
        self.rows = 0
        self.batches = 0
        self.oom_splits = 0
        """Out-of-memory splits not yet reported (see :meth:`take_splits`)."""
        self.batch_rows: int | None = None
        """The most rows the replica predicts at once after a split; ``None`` before one."""

    def take_splits(self) -> tuple[int, int | None]:
        """The splits since the last call, and the rows per batch now; resets the count."""
        splits, self.oom_splits = self.oom_splits, 0
        return splits, self.batch_rows

    def record(self, seconds: float, rows: int) -> None:
        self.busy += seconds
        self.rows += rows
        self.batches += 1


TIMEOUT_RETRIES = 2
"""Fresh replicas a batch gets after its model timed out, before ``on_error`` applies."""


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
    ) -> None:
        """``target`` and ``ctor`` replace ``model.fn`` and its arguments when an engine
        ships them separately (on Ray: through the object store, once); ``gpu`` is the
        local GPU a replica of the local engine uses (see :class:`ReplicaContext`)."""
        self.name = model.name
        self._gpu = gpu
        self.inputs = list(inputs)
        self.batch_format: BatchFormat = model.batch_format
        self.on_error = model.on_error
        self.clock = StageClock()
        target = resolve(model.fn) if target is None else target
        args, kwargs = ctor if ctor is not None else (model.args, dict(model.kwargs))
        self._prepared: str | None = None
        """Prefix of the columns an adapter's preparer made for this model."""
        self.timeout = model.timeout
        self._reload: Callable[[], Callable[[Any], Any]] = partial(
            self._load, model, target, args, kwargs
        )
        self._fn = self._reload()
        self._caller = self._new_caller()

    def _new_caller(self) -> Caller | None:
        return None if self.timeout is None else Caller(f"chute-{self.name}-call")

    def close(self) -> None:
        """Let the thread that calls the model (with a timeout) end."""
        if self._caller is not None:
            self._caller.close()

    def _load(
        self, model: Model, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Callable[[Any], Any]:
        if isinstance(target, AdapterSpec):
            return self._load_adapter(model, target)
        if not isinstance(target, type):
            if args or kwargs:
                raise ConfigError(
                    f"model {model.name!r}: args/kwargs are constructor arguments, but "
                    f"{target!r} is not a class."
                )
            if not callable(target):
                raise ConfigError(f"model {model.name!r}: {target!r} is not callable.")
            return target  # type: ignore[no-any-return]
        try:
            instance = target(*args, **kwargs)
        except Exception as exc:
            raise ModelError(f"model {model.name!r} failed to load: {exc!r}") from exc
        if not callable(instance):
            raise ConfigError(f"model {model.name!r}: {target.__name__} has no __call__.")
        return instance  # type: ignore[no-any-return]

    def _load_adapter(self, model: Model, spec: AdapterSpec) -> Callable[[Any], Any]:
        """A built-in adapter gets Arrow batches whatever ``batch_format`` says: it converts."""
        self.batch_format = "pyarrow"
        self._prepared = f"{PREPARED}{model.name}__"
        try:
            return spec.build(ReplicaContext(model.name, model.resources, self._gpu))
        except ChuteError:
            raise
        except Exception as exc:
            raise ModelError(f"model {model.name!r} ({spec.kind}) failed to load: {exc!r}") from exc

    def __call__(self, table: pa.Table) -> pa.Table:
        """Append this model's outputs; rows it raises on are failed (quarantine) or fatal."""
        started = time.perf_counter()
        healthy = _healthy_rows(table)
        view = table if healthy is None else table.filter(_mask(healthy, table.num_rows))
        pieces, failures = self._predict_isolating(view)
        positions = np.arange(view.num_rows) if healthy is None else healthy
        done = np.concatenate([positions[lo:hi] for lo, hi, _ in pieces] or [np.empty(0, int)])
        for name, array in _scatter(pieces, done, table.num_rows).items():
            if name in table.column_names:
                raise ModelError(
                    f"model {self.name!r} returned column {name!r}, but the batch already has "
                    "a column of that name: rename the model or its output."
                )
            table = table.append_column(name, array)
        if failures:
            table = mark_failed(
                table, positions[[i for i, _ in failures]], self.name, [exc for _, exc in failures]
            )
        self.clock.record(time.perf_counter() - started, table.num_rows)
        return table

    def _predict(self, view: pa.Table) -> dict[str, pa.Array]:
        out = self._call(to_format(self._model_view(view), self.batch_format))
        return to_columns(out, self.name, view.num_rows, f"model {self.name!r}")

    def _call(self, batch: Any) -> Any:
        """The model's outputs for ``batch``; past the timeout, :class:`BatchTimeout` and a
        freshly loaded replica for the next call."""
        if self._caller is None or self.timeout is None:
            return self._fn(batch)
        try:
            return self._caller.call(self._fn, batch, self.timeout)
        except BatchTimeout:
            self._caller.close()  # its thread ends if the hung call ever returns
            self._fn = self._reload()
            self._caller = self._new_caller()
            raise BatchTimeout(
                f"model {self.name!r} timed out after {self.timeout:g} s (no answer; the "
                "replica was replaced)"
            ) from None

    def _model_view(self, view: pa.Table) -> pa.Table:
        """The model's input columns, and what its adapter's preparer made for it."""
        batch = view.select(self.inputs)
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

        An out-of-memory error is no row's fault: the range is halved and retried, and the
        replica keeps the smaller size (``clock.batch_rows``) for every later batch.
        """
        pieces: list[tuple[int, int, dict[str, pa.Array]]] = []
        failures: list[tuple[int, Exception]] = []
        pending = self._chunks(0, view.num_rows)
        retries = TIMEOUT_RETRIES
        while pending:
            lo, hi = pending.pop()
            if hi - lo > (self.clock.batch_rows or hi - lo):  # queued before a later split
                pending += self._chunks(lo, hi)
                continue
            try:
                pieces.append((lo, hi, self._predict(view.slice(lo, hi - lo))))
            except Exception as exc:
                if is_out_of_memory(exc):
                    pending += self._split_for_memory(view, lo, hi, exc)
                elif isinstance(exc, ModelError):
                    raise
                elif isinstance(exc, BatchTimeout) and retries:
                    retries -= 1
                    pending.append((lo, hi))  # the same rows again, on the fresh replica
                elif isinstance(exc, BatchTimeout) and self.on_error == "fail":
                    raise self._timed_out(view, lo, hi) from exc
                elif hi - lo > 1:
                    mid = (lo + hi) // 2
                    pending += [(mid, hi), (lo, mid)]  # the lower half is tried first
                elif self.on_error == "quarantine":
                    failures.append((lo, exc))
                else:
                    raise self._fatal(view, lo, exc) from exc
        pieces.sort(key=lambda piece: piece[0])
        return pieces, sorted(failures, key=lambda failure: failure[0])

    def _chunks(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """``lo..hi`` in pieces of at most ``clock.batch_rows``, the first piece last (popped
        first)."""
        step = self.clock.batch_rows or max(hi - lo, 1)
        return [(start, min(start + step, hi)) for start in range(lo, hi, step)][::-1]

    def _split_for_memory(
        self, view: pa.Table, lo: int, hi: int, exc: Exception
    ) -> list[tuple[int, int]]:
        """Halve the replica's batch after an out-of-memory error on rows ``lo..hi``."""
        if hi - lo == 1:
            raise self._out_of_memory(view, lo, exc) from exc
        half = (hi - lo + 1) // 2
        self.clock.batch_rows = min(half, self.clock.batch_rows or half)
        self.clock.oom_splits += 1
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
            f"model {self.name!r} raised {type(exc).__name__}: {exc} — on row {position}"
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


ERROR_MODEL = "__chute_error_model"
ERROR_TYPE = "__chute_error_type"
ERROR_MESSAGE = "__chute_error_message"
ERROR_COLUMNS = (ERROR_MODEL, ERROR_TYPE, ERROR_MESSAGE)


SKIPPED = "<input>"
"""The error "model" of a skip marker: a unit that could not be read (on_bad_input: skip)."""
EMPTY = "<empty>"
"""The error "model" of an empty marker: a unit that holds no rows."""


def skip_marker(unit_index: int, message: str) -> pa.Table:
    """One row standing for a whole unreadable unit; writers record it, nothing predicts it."""
    return _marker(unit_index, SKIPPED, "DataError", message)


def empty_marker(unit_index: int) -> pa.Table:
    """One row standing for a unit without rows: the row key of a last row needs a row, so
    this one carries the news that the unit is done; writers record 0 rows, nothing
    predicts it."""
    return _marker(unit_index, EMPTY, "", "the unit has no rows")


def _marker(unit_index: int, model: str, kind: str, message: str) -> pa.Table:
    key = -((unit_index << ROW_BITS) + 0) - 1  # row 0, and the last row: a unit of one
    return pa.table(
        {
            KEY: pa.array([key], pa.int64()),
            ERROR_MODEL: pa.array([model], pa.string()),
            ERROR_TYPE: pa.array([kind], pa.string()),
            ERROR_MESSAGE: pa.array([message], pa.string()),
        }
    )


def _healthy_rows(table: pa.Table) -> np.ndarray | None:
    """Positions of rows no earlier model failed on, or ``None`` when that is all rows."""
    if ERROR_MODEL not in table.column_names:
        return None
    failed = table.column(ERROR_MODEL).is_null().to_numpy(zero_copy_only=False)
    return None if failed.all() else np.flatnonzero(failed)


def _mask(positions: np.ndarray, num_rows: int) -> pa.Array:
    """A filter keeping ``positions`` (ascending): ``filter`` is as fast as ``take`` on plain
    columns and 40 times faster on fixed-shape tensors (images), where ``take`` copies
    element by element."""
    mask = np.zeros(num_rows, dtype=bool)
    mask[positions] = True
    return pa.array(mask)


def _scatter(
    pieces: list[tuple[int, int, dict[str, pa.Array]]], done: np.ndarray, num_rows: int
) -> dict[str, pa.Array]:
    """Full-length columns from predicted pieces, null where a row was not predicted."""
    if not pieces:
        return {}
    names = list(pieces[0][2])
    joined = {n: pa.concat_arrays([p[2][n] for p in pieces]) for n in names}
    if len(done) == num_rows:
        return joined
    index = np.full(num_rows, -1, dtype=np.int64)
    index[done] = np.arange(len(done))
    take = pa.array(index, mask=index < 0)
    return {n: column.take(take) for n, column in joined.items()}


def mark_failed(
    table: pa.Table, rows: np.ndarray, model: str, errors: Sequence[Exception]
) -> pa.Table:
    """Record that ``model`` raised ``errors`` on ``rows`` (positions in ``table``)."""
    columns = {}
    for name, values in zip(
        ERROR_COLUMNS,
        ([model] * len(errors), [type(e).__name__ for e in errors], [str(e) for e in errors]),
        strict=True,
    ):
        full = np.full(table.num_rows, None, dtype=object)
        if name in table.column_names:
            full[:] = table.column(name).to_numpy(zero_copy_only=False)
        full[rows] = values
        columns[name] = pa.array(full, type=pa.string())
    for name, array in columns.items():
        if name in table.column_names:
            table = table.set_column(table.column_names.index(name), name, array)
        else:
            table = table.append_column(name, array)
    return table


class PreprocessStage:
    """The optional CPU step before the models."""

    def __init__(self, spec: Preprocess, inputs: Sequence[str], protected: Sequence[str]) -> None:
        self.fn: Callable[[Any], Any] = resolve(spec.fn)
        self.inputs = list(inputs)
        self.batch_format: BatchFormat = spec.batch_format
        self.protected = set(protected)
        self.clock = StageClock()

    def __call__(self, table: pa.Table) -> pa.Table:
        started = time.perf_counter()
        try:
            out = self.fn(to_format(table.select(self.inputs), self.batch_format))
        except Exception as exc:
            raise ModelError(f"preprocess raised {type(exc).__name__}: {exc}") from exc
        for name, array in to_columns(out, None, table.num_rows, "preprocess").items():
            if name in self.protected or name == KEY:
                raise ConfigError(
                    f"preprocess returned column {name!r}, which is a carryover column: "
                    "carryover columns pass through untouched. Return it under another name."
                )
            if name in table.column_names:
                table = table.set_column(table.column_names.index(name), name, array)
            else:
                table = table.append_column(name, array)
        self.clock.record(time.perf_counter() - started, table.num_rows)
        return table


def preparer(model: Model) -> Callable[[pa.Table], Any] | None:
    """The CPU step a built-in adapter asks to run before its model stage, if any."""
    if not isinstance(model.fn, AdapterSpec):
        return None
    return model.fn.load_class().preparer(model.name, model.fn.options)


class PrepareStage:
    """An adapter's CPU step (tokenization, image decoding) before its model stage.

    Its columns travel as ``__chute_prepared_<model>__<key>``: the model stage hands them
    to the adapter, and no writer writes them. A batch the step raises on goes on
    unprepared: the model stage then prepares it itself, isolating the rows that fail.
    """

    def __init__(self, model: Model, inputs: Sequence[str], step: Callable[[pa.Table], Any]):
        self.name = model.name
        self.inputs = list(inputs)
        self.step = step
        self.clock = StageClock()

    def __call__(self, table: pa.Table) -> pa.Table:
        started = time.perf_counter()
        try:
            out = self.step(table.select(self.inputs))
        except Exception:
            return table
        for key, values in out.items():
            table = table.append_column(f"{PREPARED}{self.name}__{key}", values)
        self.clock.record(time.perf_counter() - started, table.num_rows)
        return table
