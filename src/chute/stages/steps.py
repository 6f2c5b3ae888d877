"""The CPU steps before the models: the job's preprocess, and an adapter's prepare step."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from chute.errors import ConfigError, ModelError
from chute.job import BatchFormat, Model, Preprocess
from chute.models import AdapterSpec
from chute.models.base import PREPARED
from chute.stages.clock import StageClock
from chute.stages.convert import same_values, to_columns, to_format
from chute.stages.rows import KEY, healthy_rows, keep_mask, scatter
from chute.usercode import resolve, user_frame


class PreprocessStage:
    """The optional CPU step before the models."""

    def __init__(
        self,
        spec: Preprocess,
        inputs: Sequence[str],
        protected: Sequence[str],
    ) -> None:
        self.fn: Callable[[Any], Any] = resolve(spec.fn)
        self.inputs = list(inputs)
        self.batch_format: BatchFormat = spec.batch_format
        self.protected = set(protected)
        self.clock = StageClock()

    def __call__(self, table: pa.Table) -> pa.Table:
        started = time.perf_counter()
        # The step gets rows of data only: an empty or unreadable unit's place (a marker
        # row without the data's columns) is not one; the step raised on it ("Field 'id'
        # does not exist"), and the job stopped on a file documented as a unit of 0 rows.
        healthy = healthy_rows(table)
        if healthy is not None and not len(healthy):
            return table
        view = table if healthy is None else table.filter(keep_mask(healthy, table.num_rows))
        try:
            given = to_format(view.select(self.inputs), self.batch_format)
            out = self.fn(given)
        except (Exception, SystemExit) as exc:  # sys.exit() in user code: it raised
            raise ModelError(
                f"preprocess raised {type(exc).__name__}: {exc}{user_frame(exc)}"
            ) from exc
        columns = to_columns(out, None, view.num_rows, "preprocess", given)
        if healthy is not None:  # null in the places' rows
            columns = scatter([(0, view.num_rows, columns)], healthy, table.num_rows)
        for name, array in columns.items():
            if name in self.protected or name == KEY:
                if name in table.column_names and _unchanged(array, table.column(name)):
                    continue  # a pandas frame returned whole: its carried columns as read
                was = table.column(name).type if name in table.column_names else None
                typed = f" (as {array.type}, read as {was})" if was and was != array.type else ""
                raise ConfigError(
                    f"preprocess returned column {name!r}, which is a carryover column, with "
                    f"other values{typed}: carryover columns pass through untouched (pandas "
                    "makes an integer column holding a null float64). Return it under another "
                    "name, or leave it out of what the step returns."
                )
            # a copy: NumPy's values become Arrow's without one, and a step that fills one
            # buffer every call (np.add(x, 1, out=BUF)) rewrote the batches still waiting
            array = pa.concat_arrays([array]) if len(array) else array
            if name in table.column_names:
                table = table.set_column(table.column_names.index(name), name, array)
            else:
                table = table.append_column(name, array)
        self.clock.record(time.perf_counter() - started, table.num_rows)
        return table


def _unchanged(array: pa.Array, column: pa.ChunkedArray) -> bool:
    """Whether a returned column holds the values read (the same type; NaN for a null, as
    pandas gives a float column back, is the same: the column read is what is kept)."""
    returned = pa.chunked_array([array])
    if array.type != column.type:
        return False
    if pa.types.is_floating(column.type):
        nan = pa.scalar(float("nan"), column.type)
        returned, column = pc.fill_null(returned, nan), pc.fill_null(column, nan)
    return same_values(returned, column)


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
