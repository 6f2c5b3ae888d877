"""From a job to a plan: units, columns to read, stages and their batch sizes.

Planning reads metadata only (Parquet footers, a directory listing) — except when a
batch size is given in bytes, where a few rows of the first unit are read to learn the
row width. Every column the job names is checked here, before any compute.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from chute.errors import (
    INPUT_CHANGED,
    ColumnNotFoundError,
    ConfigError,
    DataError,
    InputChanged,
    missing_columns_error,
)
from chute.evaluation import Evaluation
from chute.formats import csv_error, csv_holds
from chute.job import BatchFormat, JobSpec, Model, Preprocess, Sink
from chute.job.values import show_bytes
from chute.lease import Fence
from chute.metrics import Metric, Sliced
from chute.metrics.base import check_column_kind
from chute.models import AdapterSpec
from chute.sinks import Output
from chute.sources import (
    READ_BATCH_ROWS,
    FileSource,
    Source,
    Unit,
    UnreadableRows,
    check_columns,
    stream,
)
from chute.stages import (
    UNREADABLE,
    cast_exactly,
    empty_marker,
    mark_failed,
    skip_marker,
    tag,
)
from chute.storage import is_local


@dataclass(frozen=True)
class StagePlan:
    """One model stage as the engines will run it."""

    model: Model
    inputs: tuple[str, ...]
    batch_rows: int
    """The rows of a replica's first model call (``auto`` moves from there)."""
    batch_format: BatchFormat
    batch_note: str = ""
    """Why it starts there, and what ``auto`` aims for (``chute plan`` says it)."""
    adaptive: bool = False
    """Whether replicas measure their calls and move the size (``batch_size: auto``)."""


@dataclass(frozen=True)
class PreprocessPlan:
    """The preprocess step as every engine runs it: the same columns in, the same
    parallelism out.

    ``copies`` is how many batches are preprocessed at once: ``None`` (the job set no
    ``cpus``) runs the step beside each read, as parallel as the reads are (the local
    engine's reader threads; on Ray, fused into each read task); a number is that many on
    every engine (threads locally; on Ray, tasks of their own, ``cpus_each`` CPU each).
    """

    spec: Preprocess
    inputs: tuple[str, ...]
    protected: tuple[str, ...]
    """Carryover columns: the step may not replace them."""
    copies: int | None
    cpus_each: float

    @classmethod
    def of(
        cls,
        spec: Preprocess,
        inputs: Sequence[str],
        protected: Sequence[str],
    ) -> PreprocessPlan:
        copies = None if spec.cpus is None else max(1, int(spec.cpus))
        cpus_each = 1.0 if spec.cpus is None else min(spec.cpus, 1.0)
        return cls(spec, tuple(inputs), tuple(protected), copies, cpus_each)


@dataclass
class Plan:
    """Everything an engine needs to run a job."""

    job: JobSpec
    units: list[Unit]
    read_columns: list[str] | None
    carryover: list[str]
    stages: list[StagePlan]
    pending: list[Unit] = field(default_factory=list)
    source_columns: list[str] = field(default_factory=list)
    """The input's columns: written only when carried over, never as model outputs."""
    fence: Fence | None = None
    """The run's claim on a file output, which its writers check (set once claimed)."""

    @property
    def source(self) -> Source:
        return self.job.source

    @property
    def total_rows(self) -> int | None:
        counts = [u.rows for u in self.units]
        return None if any(c is None for c in counts) else sum(c or 0 for c in counts)

    @property
    def pending_rows(self) -> int | None:
        counts = [u.rows for u in self.pending]
        return None if any(c is None for c in counts) else sum(c or 0 for c in counts)

    @property
    def output(self) -> Output:
        return Output(
            self.job.output,
            tuple(self.carryover),
            tuple(m.name for m in self.job.models),
            tuple(self.source_columns),
            self.evaluation,
            self.fence,
        )

    @property
    def preprocess(self) -> PreprocessPlan | None:
        spec = self.job.preprocess
        if spec is None:
            return None
        inputs = spec.inputs or self.read_columns or self.source.schema().names
        return PreprocessPlan.of(spec, inputs, self.carryover)

    @property
    def evaluation(self) -> Evaluation:
        names = [m.name for m in self.job.models]
        return Evaluation.of(self.job.metrics, names, self.source_columns)

    schema: pa.Schema | None = None
    """The columns read, as the first input file has them (those in :attr:`dictionary` as
    Arrow dictionaries)."""
    reference: str | None = None
    """The file ``schema`` comes from."""
    dictionary: tuple[str, ...] = ()
    """Carried text columns read and written as dictionaries (:func:`_passed_through`)."""

    @property
    def reader(self) -> Reader:
        skip = self.job.on_bad_input == "skip"
        every = self.job.carryover == ("*",)
        return Reader(
            self.source,
            self.read_columns,
            self.schema,
            self.reference,
            skip,
            every,
            self.dictionary,
        )


@dataclass(frozen=True)
class Reader:
    """Reads units into tagged batches; small and picklable, shipped to read tasks.

    Every unit is conformed to ``schema`` (the planned columns, from the first file): a
    column that is missing, or whose values a cast would change, is schema drift, named
    with both files. With ``every`` (the job carries every column) a column the planned
    ones lack is drift too: it would be dropped. With ``skip_bad`` a unit that cannot be
    read becomes a skip marker.
    """

    source: Source
    columns: list[str] | None
    schema: pa.Schema | None = None
    reference: str | None = None
    skip_bad: bool = False
    every: bool = False
    dictionary: tuple[str, ...] = ()
    """Columns read as Arrow dictionaries (:func:`_passed_through`)."""

    @property
    def _wanted(self) -> list[str] | None:
        """The columns asked of the source: all of them when every column is carried, so
        that one the planned columns lack is seen (and refused), not left unread."""
        return None if self.every else self.columns

    def __call__(self, unit: Unit) -> Iterator[pa.Table]:
        if unit.error and not self.skip_bad:
            raise DataError(unit.error)
        batches = None
        if unit.rows and not unit.error and not self.skip_bad:
            batches = stream(self.source, unit, self._wanted, self.dictionary)
        if batches is not None:  # under skip, a unit is read whole first: skipped or not
            yield from self._streamed(unit, batches)
            return
        try:
            table = None if unit.error or unit.rows == 0 else self._read(unit)
            if table is not None and unit.rows is not None and table.num_rows < unit.rows:
                raise InputChanged(_changed(unit, table.num_rows))  # never committed short
        except DataError as exc:
            if not self.skip_bad or isinstance(exc, InputChanged):
                raise  # a file changed since planning is no bad input: never left out
            table, unit = None, replace(unit, error=str(exc))
        if table is None or table.num_rows == 0:  # unreadable (skipped), or no rows
            yield skip_marker(unit.index, unit.error) if unit.error else empty_marker(unit.index)
            return
        if unit.rows is not None and table.num_rows > unit.rows:
            table = table.slice(0, unit.rows)  # a --limit cut this unit short
        total = table.num_rows
        for start in range(0, total, READ_BATCH_ROWS):
            yield tag(table.slice(start, READ_BATCH_ROWS), unit.index, start, total)

    def _streamed(self, unit: Unit, batches: Iterator[pa.Table]) -> Iterator[pa.Table]:
        """Tag a unit's batches as they are decoded; its rows are known from the plan (a
        ``--limit`` may stop the unit short)."""
        assert unit.rows is not None
        start = 0
        for table in batches:
            table = table.slice(0, unit.rows - start)
            if table.num_rows:
                yield tag(self._conform(table, unit), unit.index, start, unit.rows)
                start += table.num_rows
            if start == unit.rows:
                return
        raise InputChanged(_changed(unit, start))

    def _read(self, unit: Unit) -> pa.Table:
        """The unit's rows, conformed to the planned schema (none: not conformed)."""
        try:
            table = (
                self.source.read(unit, self._wanted, dictionary=self.dictionary)
                if isinstance(self.source, FileSource) and self.dictionary
                else self.source.read(unit, self._wanted)
            )
        except UnreadableRows as exc:  # some rows only (an image file): the others go on
            if not self.skip_bad:
                raise
            rows = np.array([row for row, _ in exc.bad], dtype=np.int64)
            reasons = [DataError(reason) for _, reason in exc.bad]
            return mark_failed(self._conform(exc.table, unit), rows, UNREADABLE, reasons)
        return self._conform(table, unit) if table.num_rows else table

    def _conform(self, table: pa.Table, unit: Unit) -> pa.Table:
        if self.schema is None:
            return table
        here = unit.path or unit.id
        if self.every and (extra := [c for c in table.column_names if c not in self.schema.names]):
            raise DataError(
                f"schema drift: column {extra[0]!r} is in {here} but not in {self.reference}, "
                "whose columns the job carries ('*'): it would be dropped. Make the files "
                "agree, or list the columns to carry, or set on_bad_input: skip to leave such "
                "files out."
            )
        columns = []
        for want in self.schema:
            if want.name not in table.column_names:
                raise DataError(
                    f"schema drift: column {want.name!r} is in {self.reference} but not in "
                    f"{here}. Make the files agree, or drop the column from the job, or set "
                    "on_bad_input: skip to leave such files out."
                )
            column = table.column(want.name)
            if column.type != want.type:
                try:
                    column = cast_exactly(column, want.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise DataError(_drift(want, column, self.reference, here, exc)) from exc
            columns.append(column)
        return pa.Table.from_arrays(columns, schema=self.schema)


def _drift(
    want: pa.Field, column: pa.ChunkedArray, reference: str | None, here: str, exc: Exception
) -> str:
    """Schema drift of one column, with the fixes."""
    got = column.type
    if pa.types.is_dictionary(want.type):  # text read as a dictionary: named as the text
        want = want.with_type(want.type.value_type)
    declare = _declare(want, got, _whole(column))
    if pa.types.is_null(want.type):
        return (
            f"schema drift: column {want.name!r} has no values in {reference} (nor in the "
            f"files read after it while planning), so its type is unknown; {here} has "
            f"{got} values in it. Give it a type: {declare}."
        )
    return (
        f"schema drift: column {want.name!r} is {want.type} in {reference} but {got} in "
        f"{here}, and cannot be made {want.type} without changing values ({exc}). Make the "
        f"files agree, or {declare}, or set on_bad_input: skip to leave such files out."
    )


def _whole(column: pa.ChunkedArray) -> bool:
    """Whether a float column holds whole numbers only: integers too big for int64, which
    Arrow read as floats (rounded past 2**53)."""
    if not pa.types.is_floating(column.type):
        return False
    values = column.to_numpy(zero_copy_only=False)
    values = values[np.isfinite(values)]
    return bool(np.all(values == np.floor(values)))


def _declare(want: pa.Field, got: pa.DataType, whole: bool = False) -> str:
    """How to give a drifting column one type for every file: the later file's where a job
    file can name both files' types, else text (a time with a zone beside one without:
    Arrow reads neither as the other; integers too big for int64, which a float would
    round: 9007199254740993 as 9007199254740992.0), or in Python for a nested type (a job
    file names none)."""
    if pa.types.is_nested(got):
        return (
            "declare its type for every file (JSON Lines, in Python: FileSource(..., "
            f"column_types={{{want.name!r}: <a pyarrow type>}}))"
        )
    named = got if _named(got) and (_named(want.type) or pa.types.is_null(want.type)) else "string"
    if whole and (pa.types.is_integer(want.type) or pa.types.is_null(want.type)):
        named = "string"
    return (
        f"declare its type for every file (CSV and JSON Lines: input: column_types: "
        f"{{{want.name}: {named}}})"
    )


def _named(kind: pa.DataType) -> bool:
    """Whether a job file's column_types can name the type (``timestamp[ms]``, not one
    with a zone, nor the null type)."""
    if pa.types.is_null(kind):
        return False
    try:
        return bool(pa.type_for_alias(str(kind)) == kind)
    except (ValueError, KeyError):
        return False


def _changed(unit: Unit, rows: int) -> str:
    """The error of a unit whose input holds fewer rows than the plan counted."""
    return (
        f"input {unit.path or unit.id!r} has {rows:,} rows in its unit where it had "
        f"{unit.rows:,} when the job was planned: {INPUT_CHANGED}"
    )


def build_plan(job: JobSpec, limit: int | None = None) -> Plan:
    """Validate the job against the data's schema and split it into units."""
    if not job.models:
        raise ConfigError("the job has no models: name at least one model to run.")
    for model in job.models:
        _check_adapter(model)
    schema = job.source.schema()
    carry = _carryover(job, schema)
    _check_csv(job, schema, carry)
    _check_answers(job)
    read_columns = _read_columns(job, schema, carry)
    _check_metric_types(job, schema)
    units = job.source.plan()
    if not units:
        raise DataError("the input has no units to read: the dataset is empty.")
    readable = [u for u in units if not u.error]
    if len(readable) < len(units) and job.on_bad_input == "fail":
        raise DataError(
            f"{next(u.error for u in units if u.error)} Replace or remove the file, or set "
            "on_bad_input: skip to leave such files out."
        )
    if all(u.rows == 0 for u in readable):
        raise DataError("the input dataset has no rows: nothing to predict.")
    if limit is not None:
        units = _limit(readable, limit, job.source, job.on_bad_input == "skip")
    stages = [_stage(job, m, schema, readable) for m in job.models]
    plan = Plan(job, units, read_columns, carry, stages, list(units))
    plan.source_columns = list(schema.names)
    _ = plan.evaluation  # two metrics reported under one name fail here, before any compute
    plan.schema = (
        schema if read_columns is None else pa.schema([schema.field(c) for c in read_columns])
    )
    plan.reference = getattr(job.source, "reference", None) or readable[0].path or readable[0].id
    plan.dictionary = _passed_through(job, plan, readable[0])
    for name in plan.dictionary:
        index = plan.schema.get_field_index(name)
        kind = pa.dictionary(pa.int32(), plan.schema.field(name).type)
        plan.schema = plan.schema.set(index, plan.schema.field(name).with_type(kind))
    return plan


DICTIONARY_BYTES = 64 * 1024
"""The largest dictionary page of a column :func:`_passed_through` keeps as a dictionary."""


def _passed_through(job: JobSpec, plan: Plan, first: Unit) -> tuple[str, ...]:
    """The carried text columns that nothing reads and that the input stores with a small
    dictionary (a vendor, a flag, a category): read as Arrow dictionaries and written as
    they are, the Parquet writer takes the dictionary as it is instead of hashing every
    value again. On the taxi demo this saved about a tenth of chute's CPU time
    (``benchmarks/RESULTS.md``). Only where the reading and the writing are both chute's
    own Parquet on a local input, with no preprocess step (which sees every column); the
    output reads back with the same types (:func:`chute.sinks.files.write_parquet`)."""
    source, output = job.source, job.output
    if (
        type(source) is not FileSource  # a subclass may read otherwise
        or source.format != "parquet"
        or not is_local(source.filesystem)
        or type(output) is not Sink
        or output.format != "parquet"
        or job.preprocess is not None
        or plan.schema is None
        or first.path is None
        or any(_reads_every_column(m) for m in job.metrics)  # it sees the values as read
    ):
        return ()
    read = {c for m in job.models for c in m.inputs or ()} | _metric_columns(job, plan.schema)
    text = [
        c
        for c in plan.carryover
        if c not in read and c in plan.schema.names and plan.schema.field(c).type == pa.string()
    ]
    if not text or any(m.inputs is None for m in job.models):
        return ()
    try:
        metadata = pq.read_metadata(first.path, filesystem=source.filesystem)
    except (OSError, pa.ArrowException):
        return ()
    if metadata.num_row_groups == 0:
        return ()
    group = metadata.row_group(0)
    paths = {group.column(i).path_in_schema: group.column(i) for i in range(group.num_columns)}
    chosen = []
    for name in text:
        chunk = paths.get(name)
        if chunk is None or not chunk.has_dictionary_page:
            continue
        if chunk.data_page_offset - (chunk.dictionary_page_offset or 0) <= DICTIONARY_BYTES:
            chosen.append(name)
    return tuple(chosen)


def _check_csv(job: JobSpec, schema: pa.Schema, carry: list[str]) -> None:
    """CSV output cannot hold list, tensor or binary columns: refuse those known now
    (carried input columns, adapter outputs that are always lists); the writer refuses the
    rest (a model's bytes) before it writes any of them."""
    if job.output is None or job.output.format != "csv":
        return
    bad = [(c, schema.field(c).type) for c in carry if not csv_holds(schema.field(c).type)]
    for model in job.models:
        if isinstance(model.fn, AdapterSpec):
            listed = model.fn.load_class().list_outputs(model.fn.options)
            bad += [(f"{model.name}_{name}", "a list per row") for name in listed]
    if bad:
        raise csv_error(bad)


def _check_answers(job: JobSpec) -> None:
    """An OpenAI Batch output answers every request in its file: a request that fails is
    its own error line (the adapters write one). Quarantined, it would be in ``_errors/``
    and in no line of the output: a request left unanswered while the run succeeds."""
    if job.output is None or job.output.format != "openai-batch":
        return
    quarantined = [m.name for m in job.models if m.on_error == "quarantine"]
    if quarantined:
        raise ConfigError(
            f"model {quarantined[0]!r} has on_error: quarantine, but an openai-batch output "
            "answers every request in its file (a failing request gets its error line): a "
            "quarantined request would get none. Leave on_error at fail."
        )


def _check_adapter(model: Model) -> None:
    """A built-in adapter's framework is installed and its options are sound (no untrusted
    pickle), before any data is read or any model loaded."""
    if isinstance(model.fn, AdapterSpec):
        try:
            model.fn.check()
        except ConfigError as exc:
            raise ConfigError(f"model {model.name!r}: {exc}") from exc


ERROR_COLUMNS = ("model", "error_type", "error_message")
"""The columns the errors dataset adds to the carried ones (``sinks.writer``)."""


def _carryover(job: JobSpec, schema: pa.Schema) -> list[str]:
    inner = [c for c in schema.names if c.startswith("__chute_")]
    if inner:
        raise ConfigError(
            f"the input has a column named {inner[0]!r}: names that start with '__chute_' "
            "are chute's own, for the rows it tracks. Rename the column."
        )
    carry = list(schema.names) if job.carryover == ("*",) else list(job.carryover)
    batch = job.output is not None and job.output.format == "openai-batch"
    if batch and "custom_id" in schema.names and "custom_id" not in carry:
        carry.append("custom_id")  # each line's custom_id is checked against its request's
    if job.carryover != ("*",):
        try:
            check_columns(schema, job.carryover, "carryover")
        except ColumnNotFoundError as exc:
            if job.preprocess is None:
                raise
            raise ColumnNotFoundError(  # the step's new columns are the models' inputs only
                f"{exc} Carried columns come from the input as it is read; a column the "
                "preprocess step adds reaches the output only if a model returns it."
            ) from exc
    failing = job.on_bad_input == "skip" or any(m.on_error == "quarantine" for m in job.models)
    taken = [c for c in carry if c in ERROR_COLUMNS]
    if failing and taken:
        raise ConfigError(
            f"the carried column {taken[0]!r} has the name of a column the errors dataset "
            f"adds ({', '.join(ERROR_COLUMNS)}): a failed row could not be written. Rename "
            "it in a preprocess step, or leave it out of carryover."
        )
    return carry


def _read_columns(job: JobSpec, schema: pa.Schema, carry: list[str]) -> list[str] | None:
    wanted: set[str] = set(carry) | (_metric_columns(job, schema) & set(schema.names))
    if any(_reads_every_column(m) for m in job.metrics):
        return None
    pre = job.preprocess
    if pre is not None:
        if pre.inputs is None:
            return None
        check_columns(schema, pre.inputs, "preprocess inputs")
        wanted |= set(pre.inputs)
    earlier: list[str] = []
    for model in job.models:
        if model.inputs is None:
            return None
        known = [c for c in model.inputs if c in schema.names]
        produced = [c for c in model.inputs if _made_by(c, earlier)]
        later = [m.name for m in job.models[len(earlier) + 1 :]]
        early = [c for c in model.inputs if c not in known and c not in produced]
        for column in early if pre is None else []:  # else the step may make it
            maker = next((name for name in later if _made_by(column, [name])), None)
            if maker is not None:
                raise ConfigError(
                    f"model {model.name!r} reads {column!r}, which model {maker!r} makes, "
                    f"but {maker!r} comes after it: models run in the order listed. List "
                    f"{maker!r} first."
                )
        if pre is None:
            wanted_from_source = [c for c in model.inputs if c not in produced]
            check_columns(schema, wanted_from_source, f"model {model.name!r} inputs")
        wanted |= set(known)
        earlier.append(model.name)
    return [c for c in schema.names if c in wanted]


def _metric_columns(job: JobSpec, schema: pa.Schema) -> set[str]:
    """The columns the job's metrics read; each must come from the input or a model."""
    models = [m.name for m in job.models]
    columns = {c for metric in job.metrics for c in metric.columns()}
    unknown = sorted(
        c
        for c in columns
        if c not in schema.names and (not _made_by(c, models) or _misspelt(c, schema.names))
    )
    if unknown and job.preprocess is None:
        raise missing_columns_error(
            unknown, [*schema.names, *(f"{m}_…" for m in models)], "metrics"
        )
    return columns


def _check_metric_types(job: JobSpec, schema: pa.Schema) -> None:
    """Each input column a metric reads holds what the metric needs (numbers, integer
    labels, lists of class scores): a string label failed only once the models had loaded
    and the first batches run. A preprocess step may remake the columns: then the writers'
    batches say."""
    if job.preprocess is not None:
        return
    for metric in job.metrics:
        for column, kind in metric.column_kinds().items():
            if column in schema.names:
                check_column_kind(metric.name, column, schema.field(column).type, kind)


def _reads_every_column(metric: Metric) -> bool:
    """A metric that names no columns (a custom one without ``columns()`` or ``columns:``
    in its spec) is given every column, as the README's own example expects: read only
    the carried and model columns, its label was missing after the whole compute."""
    inner = metric.metric if isinstance(metric, Sliced) else metric
    return not inner.columns()


def _misspelt(column: str, names: Sequence[str]) -> bool:
    """A near-miss of an input column (``tip_amout``), not a model output (``tip_score``)."""
    return bool(difflib.get_close_matches(column, names, n=1, cutoff=0.9))


def _made_by(column: str, models: Sequence[str]) -> bool:
    """Whether ``column`` is an output of one of ``models`` (which run earlier)."""
    return any(column == m or column.startswith(m + "_") for m in models)


def _stage(
    job: JobSpec,
    model: Model,
    schema: pa.Schema,
    units: list[Unit],
) -> StagePlan:
    inputs = model.inputs if model.inputs is not None else tuple(schema.names)
    size = model.batch_size
    if size.auto:
        rows, note, adaptive = _auto_start(model, inputs, schema)
        return StagePlan(model, tuple(inputs), rows, model.batch_format, note, adaptive)
    if size.rows is not None:
        rows, note = size.rows, f"{size.rows:,} rows a call, fixed"
    else:
        width = _row_bytes(job, inputs, schema, units)
        rows = size.rows_for(width)
        note = f"{rows:,} rows a call, fixed: {size.bytes:,} bytes at ~{width:,.0f} bytes a row"
    return StagePlan(model, tuple(inputs), rows, model.batch_format, note)


def _auto_start(model: Model, inputs: Sequence[str], schema: pa.Schema) -> tuple[int, str, bool]:
    """Where ``batch_size: auto`` starts, why, and whether it is measured: the adapter's own
    fixed size (an engine that batches by itself), or :data:`~chute.job.AUTO_BATCH_ROWS`
    rows, fewer if the memory cap says so for inputs of known width (others are measured
    at the first call: reading a sample here would cost every plan a read)."""
    size = model.batch_size
    if isinstance(model.fn, AdapterSpec):
        own = model.fn.load_class(check=False).auto_batch_rows
        if own is not None:
            note = f"auto: {own:,} rows a call, fixed: {model.fn.kind} schedules its own batches"
            return own, note, False
    target = size.target.within(model.timeout)
    aims = f"then measures each call and moves toward {target.describe()}"
    assert size.rows is not None
    small = f"auto: starts at {size.rows:,} rows (small, so a slow model's first call is short)"
    widths = [_fixed_width(schema.field(c).type) for c in inputs if c in schema.names]
    if len(widths) < len(inputs) or None in widths:
        return size.rows, f"{small}, {aims}", True
    width = sum(w or 0 for w in widths)
    cap = max(1, target.memory // max(width, 1))
    if cap >= size.rows:
        return size.rows, f"{small}, {aims}", True
    note = (
        f"auto: starts at {cap:,} rows ({show_bytes(target.memory)} at {width:,} input "
        f"bytes a row), {aims}"
    )
    return cap, note, True


def _fixed_width(t: pa.DataType) -> int | None:
    """Bytes a value of ``t`` takes, where every value takes the same: a number, or a
    fixed-shape tensor (an image: its shape times its element's bytes, known from the
    schema, so ``batch_size: auto`` starts within its memory cap, not at 1,024 photos);
    ``None`` for text, lists and the like."""
    if isinstance(t, pa.FixedShapeTensorType):
        element = _fixed_width(t.value_type)
        return None if element is None else element * math.prod(t.shape)
    return t.bit_width // 8 or 1 if pa.types.is_primitive(t) else None


def _row_bytes(job: JobSpec, inputs: Sequence[str], schema: pa.Schema, units: list[Unit]) -> float:
    known = [c for c in inputs if c in schema.names]
    widths = [_fixed_width(schema.field(c).type) for c in known]
    if None not in widths:
        width = sum(w or 0 for w in widths)
    else:
        first = next((u for u in units if u.rows != 0), units[0])
        sample = job.source.read(first, known).slice(0, 1024)
        width = int(sample.nbytes / max(sample.num_rows, 1))
    return float(width + 8 * (len(inputs) - len(known)))


def _limit(units: list[Unit], limit: int, source: Source, skip: bool) -> list[Unit]:
    """The first ``limit`` rows' units, the last one cut short. A unit whose rows the plan
    does not know (CSV, JSON Lines) is counted by reading it: planned as ``limit`` rows, one
    that holds fewer would read as an input that changed since planning. One that cannot
    be read is the reader's to fail or (``skip``) to leave out."""
    if limit <= 0:
        raise ConfigError(f"--limit must be > 0, got {limit}.")
    chosen: list[Unit] = []
    left = limit
    for unit in units:
        if left <= 0:
            break
        try:
            rows = unit.rows if unit.rows is not None else source.read(unit, None).num_rows
        except DataError as exc:
            if not skip or isinstance(exc, InputChanged):
                raise
            chosen.append(replace(unit, error=str(exc)))
            continue
        take = min(left, rows)
        chosen.append(replace(unit, rows=take))
        left -= take
    return chosen
