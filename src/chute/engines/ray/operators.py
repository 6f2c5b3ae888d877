"""What runs inside Ray: the datasource with one read task per unit, the preprocess and
prepare steps as task functions, and the model actor that predicts and, last, writes."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa

from chute.engines import carried
from chute.errors import ChuteError, ConfigError, ModelError
from chute.job import AUTO_MAX_ROWS, Model, Preprocess
from chute.job.spec import DEFAULT_FILE_SIZE
from chute.models.base import keep_freed_memory, limit_threads
from chute.plan import Reader
from chute.sinks import Output, PartWriter, records_to_table
from chute.sources import Unit
from chute.stages import KEY, ModelStage, PrepareStage, PreprocessStage, rows
from chute.usercode import forget_interrupted_imports


class UnitDatasource:
    """A Ray Data datasource with one read task per pending unit, or per few small units
    (see :func:`read_groups`)."""

    def __new__(cls, reader: Reader, units: list[Unit], run: str = "") -> Any:
        from ray.data import Datasource, ReadTask
        from ray.data.block import BlockMetadata

        class _Units(Datasource):  # type: ignore[misc]
            def get_name(self) -> str:
                return "ChuteUnits"

            def estimate_inmemory_data_size(self) -> int | None:
                sizes = [u.nbytes for u in units]
                return None if None in sizes else sum(s or 0 for s in sizes)

            def get_read_tasks(self, parallelism: int, **_: Any) -> list[Any]:
                return [
                    ReadTask(ReadUnits(reader, group, run), _metadata(group, BlockMetadata))
                    for group in read_groups(units)
                ]

        return _Units()


GROUP_ROWS = 65_536
"""Units with fewer rows than this together share a read task (row counts from metadata)."""
GROUP_UNITS = 64
"""Most units one read task reads."""
MIN_READ_TASKS = 256
"""Grouping never leaves fewer read tasks than this (or than units, if fewer)."""


def read_groups(units: Sequence[Unit]) -> list[tuple[Unit, ...]]:
    """Consecutive units in read tasks: a unit alone, or small ones (rows known, fewer than
    :data:`GROUP_ROWS` together, at most :data:`GROUP_UNITS`) side by side.

    Ray Data's driver spends milliseconds on every task and every block (an actor call,
    its metrics); a task over many tiny files pays that once for them, yielding them as one
    block. Each unit is still read, tagged, written and committed on its own, but a group's
    units reach the model, and so commit, together: grouping only starts past
    :data:`MIN_READ_TASKS` units, and takes no more units a task than it needs to bring
    the tasks down to about that many. A job of a few hundred units keeps a task a unit
    (what streams and commits unit by unit); 1,000 take four a task, 100,000 sixty-four.
    """
    most = min(GROUP_UNITS, max(1, len(units) // MIN_READ_TASKS))
    groups: list[tuple[Unit, ...]] = []
    group: list[Unit] = []
    rows = 0
    for unit in units:
        small = unit.rows is not None and unit.rows < GROUP_ROWS
        if group and (not small or rows + (unit.rows or 0) > GROUP_ROWS or len(group) == most):
            groups.append(tuple(group))
            group, rows = [], 0
        group.append(unit)
        rows += unit.rows or 0
        if not small:
            groups.append(tuple(group))
            group, rows = [], 0
    if group:
        groups.append(tuple(group))
    return groups


def _metadata(group: Sequence[Unit], cls: Any) -> Any:
    rows = [u.rows for u in group]
    sizes = [u.nbytes for u in group]
    return cls(
        None if None in rows else sum(r or 0 for r in rows),
        None if None in sizes else sum(s or 0 for s in sizes),
        None,
        None,
    )


class ReadUnits:
    """One read task's function: the reader and its own units, nothing else.

    Ray puts every read task in the object store from the driver, so what one carries is
    paid once per task: a class pickled by reference and a source pickled without its
    listing keep it about a kilobyte (a closure holding the listing made it grow with the
    units, and the driver's work with their square).
    """

    __name__ = "read_units"  # Ray Data names the read function in its size warning

    def __init__(self, reader: Reader, units: Sequence[Unit], run: str = "") -> None:
        self.reader, self.units, self.run = reader, tuple(units), run

    def __call__(self) -> Iterator[pa.Table]:
        check_runs(lambda: [unit.index for unit in self.units])
        if self.run:
            begin(self.run, [unit.index for unit in self.units])
        tables = self._tables()
        if len(self.units) == 1:  # a unit alone: blocks of up to BLOCK_BYTES
            yield from _joined(tables, BLOCK_BYTES)
            return
        run: list[pa.Table] = []  # small units: one block, one model call, one record batch
        for table in tables:
            if run and table.schema != run[0].schema:  # a skip marker: a block of its own
                yield pa.concat_tables(run)
                run = []
            run.append(table)
        if run:
            yield pa.concat_tables(run)

    def _tables(self) -> Iterator[pa.Table]:
        began = time.perf_counter()
        for unit in self.units:
            for batch in self.reader(unit):
                yield carried.mark(carried.carry(batch, "read", time.perf_counter() - began))
                began = time.perf_counter()


BEGUN = b"chute.begun"
"""The namespace, in Ray's key-value store (in the GCS), of the read tasks that began: a
key per task, ``<run>/<node>/<unit>,<unit>…``, and nothing in the value."""


def begin(run: str, units: list[int]) -> None:
    """Note in the GCS that a read task of attempt ``run`` began ``units`` on this node: when
    the run is planned again, the driver then tells the units in flight (computed again by
    the new plan) from those not begun, though none of their rows has reached it. One
    small write a task; a failed one is only a line of the report lost."""
    import ray
    from ray.experimental import internal_kv

    node = ray.util.get_node_ip_address()
    key = f"{run}/{node}/{','.join(map(str, units))}"
    try:
        internal_kv._internal_kv_put(key, b"", namespace=BEGUN)
    except Exception:  # the GCS busy or gone: the run goes on, the note is lost
        return


def begun(run: str) -> dict[int, set[str]] | None:
    """The units read tasks of attempt ``run`` began, and the nodes (more than one when Ray
    ran a task again elsewhere); the notes are removed. ``None`` if the GCS did not say."""
    from ray.experimental import internal_kv

    if not run:
        return None
    found: dict[int, set[str]] = {}
    try:
        keys = internal_kv._internal_kv_list(f"{run}/", namespace=BEGUN)
        internal_kv._internal_kv_del(f"{run}/", del_by_prefix=True, namespace=BEGUN)
    except Exception:  # the GCS gone: nothing to name
        return None
    for key in keys:
        _, node, units = key.decode().split("/", 2)
        for unit in units.split(","):
            found.setdefault(int(unit), set()).add(node)
    return found


MOST_RUNS = 4
"""Runs of one task whose worker died before it finished (a crash, the process killed)
after which the run stops: Ray Data would run it again forever, as long as the process
dies (Ray Core's own default is 4 runs, 3 retries)."""


MOST_RESTARTS = MOST_RUNS
"""Restarts of a model's actor (in a pool) after which its next start stops the run: Ray
Data restarts an actor that dies at every start, or at every batch, for ever (and sends
the batch again as a new task, so :func:`check_runs` never counts it)."""


def restarts() -> int:
    """How many times Ray restarted the actor this runs in (0: its first start, or not in
    an actor). From Ray's actor table (a private module: ``tests/test_carried.py`` checks
    it is still there and counts)."""
    import ray

    context = ray.get_runtime_context()
    if context.get_actor_id() is None or not context.was_current_actor_reconstructed:
        return 0
    from ray._private import state

    return int(state.actors(context.get_actor_id()).get("NumRestarts", 0))


def _died(model: str, times: int) -> str:
    return (
        f"a replica of model {model!r} (a Ray actor) died {times} times, restarted by Ray "
        "after each: a crash in native code (the model, a framework), os._exit, or the "
        "process killed for its memory. Ray's workers log why in the Ray session's logs "
        "folder (/tmp/ray/session_latest/logs on each node). The units committed are "
        "kept: fix the cause and run the job again to resume."
    )


def check_runs(units_of_task: Callable[[], list[int]]) -> None:
    """Stop, naming the units, a task Ray has run :data:`MOST_RUNS` times already: each
    run ended with its worker gone. Called first by each function chute runs as a task
    (the read, and each step or model Ray fused into it or runs as tasks of their own),
    where :func:`~chute.engines.carried.attempt` counts the runs before."""
    runs = carried.attempt()
    if runs < MOST_RUNS:
        return
    units = units_of_task()
    if not units:
        return
    more = f" (and {len(units) - 1:,} other unit(s) of its task)" if len(units) > 1 else ""
    raise ModelError(
        f"Ray ran the task of unit {units[0]}{more} {runs} times and its worker process "
        "died every time before it finished: a crash in native code (the model, a "
        "framework, a reader), os._exit, or the process killed for its memory. Ray's "
        "workers log why in the Ray session's logs folder (/tmp/ray/session_latest/logs "
        "on each node). The units committed are kept: fix the cause and run the job again "
        "to resume.",
        unit=units[0],
    )


def _units_of(table: pa.Table) -> list[int]:
    if KEY not in table.column_names:
        return []
    return [int(u) for u in np.unique(rows.decode(table.column(KEY).to_numpy())[0])]


BLOCK_BYTES = DEFAULT_FILE_SIZE
"""A unit's read batches are joined into blocks of up to this many bytes (Ray Data's own
largest block, 128 MiB): the writer writes a block's rows as one file, or as files of the
sink's target (:func:`chute.sinks.file_groups`), where batch by batch made a file a batch."""


def _joined(tables: Iterator[pa.Table], most: int) -> Iterator[pa.Table]:
    """Consecutive tables joined while they stay under ``most`` bytes."""
    run: list[pa.Table] = []
    size = 0
    for table in tables:
        if run and size + table.nbytes > most:
            yield pa.concat_tables(run)
            run, size = [], 0
        run.append(table)
        size += table.nbytes
    if run:
        yield pa.concat_tables(run)


class PreprocessTask:
    """Preprocess as a stateless task function (Ray fuses it into the read tasks); a
    function given as an object comes through the object store (see :func:`shipped`)."""

    def __init__(
        self,
        spec: Preprocess,
        inputs: list[str],
        carryover: list[str],
        fn: Any = None,
    ) -> None:
        self.spec, self.inputs, self.carryover, self.fn = spec, inputs, carryover, fn

    def __call__(self, table: pa.Table) -> pa.Table:
        check_runs(lambda: _units_of(table))
        if self.fn is not None:  # once per task: the instance is unpickled with it
            self.spec, self.fn = replace(self.spec, fn=shipped(self.fn, "the preprocess fn")), None
        stage = PreprocessStage(self.spec, self.inputs, self.carryover)
        return carried.carry(stage(table), "preprocess", stage.clock.busy)


class PrepareTask:
    """An adapter's CPU step as a stateless task function (its processor is cached per
    worker process by the adapter)."""

    def __init__(self, stage: PrepareStage) -> None:
        self.stage = stage

    def __call__(self, table: pa.Table) -> pa.Table:
        check_runs(lambda: _units_of(table))
        out = carried.carry(self.stage(table), f"{self.stage.name}.prepare", self.stage.clock.busy)
        self.stage.clock.busy = 0.0
        return out


class ModelActor:
    """One replica of a model stage in a Ray actor; the last stage also writes.

    It gets whole blocks and its stage cuts them into model calls itself, ``rows`` at first,
    then at the size its sizer settles on (:mod:`chute.stages.batching`): asked for batches,
    Ray Data would bundle blocks until they hold a batch, so that a unit's last block
    waited for blocks of other units, and the unit for its commit (see
    :meth:`RayEngine._model_stage`). A block goes through the stage, and is written, in
    pieces of at most :data:`~chute.job.AUTO_MAX_ROWS` rows (or ``rows``, if more): one
    part per piece, however small the model's calls. Its intra-op threads are the plan's
    (:func:`chute.engines.resources.plan_threads`), not the ``OMP_NUM_THREADS`` Ray set
    from its CPU token.
    """

    def __init__(
        self,
        model: Model,
        inputs: list[str],
        target: Any,
        ctor: Any,
        output: Output | None,
        rows: int,
        threads: int = 1,
    ) -> None:
        import ray

        self.failed: ChuteError | None = None
        self.node = ray.util.get_node_ip_address()
        self.writer = PartWriter(output) if output is not None else None
        self.rows = rows
        times = restarts()
        if times >= MOST_RESTARTS:  # raised from a batch, as below
            self.failed = ModelError(_died(model.name, times))
            return
        keep_freed_memory()  # a Ray worker is chute's process: its malloc is tuned
        limit_threads(threads)  # before the model's libraries load: they read it once
        try:
            if target is not None:
                target = shipped(target, f"model {model.name!r}")
            if ctor is not None:
                ctor = shipped(ctor, f"the arguments of model {model.name!r}")
            self.stage = ModelStage(
                model,
                inputs,
                target=target,
                ctor=ctor,
                threads=threads,
                rows=rows,
            )
            limit_threads(threads)  # torch, if the model loaded it (or it came unpickled)
        except ChuteError as exc:
            # Raised here, it would kill the actor, and Ray hands the driver only the text of
            # a constructor's error; raised from a batch it arrives as the error it is.
            self.failed = exc

    def __call__(self, block: pa.Table) -> pa.Table:
        if self.failed is not None:
            raise self.failed
        # whole batches a piece: a fixed batch size's calls stay full across pieces
        step = self.rows * max(1, AUTO_MAX_ROWS // self.rows)
        starts = range(0, max(block.num_rows, 1), step)
        outs = [self._batch(block.slice(start, step)) for start in starts]
        return outs[0] if len(outs) == 1 else pa.concat_tables(outs, promote_options="permissive")

    def _batch(self, table: pa.Table) -> pa.Table:
        out = self.stage(table)
        clock, name = self.stage.clock, self.stage.name
        busy, clock.busy = clock.busy, 0.0
        counters = clock.take_counters()
        batching = self.stage.take_batching()
        if self.writer is None:  # a later stage writes: the stats travel with the rows
            return carried.mark(carried.carry(out, name, busy, batching, counters))
        out, totals = carried.collect(out)
        out, again = carried.retried(out)
        mine = {
            "busy": busy,
            "batches": carried.model_batches(batching),
            "rows": float(out.num_rows),
        }
        mine.update(carried.batching_entry(batching))
        mine.update({carried.COUNTED + k: v for k, v in counters.items()})
        carried.add(totals, {name: mine})
        records = records_to_table(self.writer.write(out))
        text = [carried.encode(totals)] + [""] * (records.num_rows - 1)
        records = records.append_column(carried.STAGES, pa.array(text[: records.num_rows]))
        units = records.column("unit").to_pylist()
        records = records.append_column(carried.AGAIN, pa.array([u in again for u in units]))
        return records.append_column(carried.NODE, pa.array([self.node] * records.num_rows))


def shipped(ref: Any, what: str) -> Any:
    """A user object the driver put in the object store (a model's class or function, its
    arguments, a preprocess function), loaded by chute in this worker rather than by Ray.

    Ray Data retries a task whose code raises ``RaySystemError``, forever, and that is
    what a failed unpickling raises: a model whose module the workers cannot import hung
    the job, Ray's tracebacks going to its log. Loaded here, the failure is a
    :class:`~chute.errors.ConfigError` that stops the run and says what to do. A process
    that an interrupted import left half-loaded (a task Ray cancelled while it imported,
    in an earlier run) forgets the leftovers and loads once more
    (:func:`~chute.usercode.forget_interrupted_imports`).
    """
    import ray

    try:
        return ray.get(ref)
    except ray.exceptions.RaySystemError as exc:
        error: BaseException = exc
    if forget_interrupted_imports():
        try:
            return ray.get(ref)
        except ray.exceptions.RaySystemError as exc:
            error = exc
    cause = getattr(error, "client_exc", None)
    cause = cause if isinstance(cause, BaseException) else error
    raise ConfigError(_unloadable(what, cause, ray.util.get_node_ip_address())) from cause


def _unloadable(what: str, cause: BaseException, node: str) -> str:
    if isinstance(cause, ModuleNotFoundError):
        return (
            f"{what} cannot be loaded on the Ray worker at {node}: it needs the module "
            f"{cause.name!r}, which is not importable there. Ray's workers import the "
            "modules of the code they are sent by name: install the module on every node, "
            "or ship it with the job (runtime_env={'working_dir': '<its folder>'} or "
            "{'py_modules': ['<its folder>']}; see docs/cluster.md)."
        )
    return (
        f"{what} cannot be loaded on the Ray worker at {node}: importing its code there "
        f"raised {type(cause).__name__}: {cause}. The workers must import the same code "
        "and packages as this process; check what differs on that node."
    )


_replicas: dict[tuple[str, str], ModelActor] = {}
"""The fused models this worker process has built, by (run, stage), for the latest run only."""


class ModelTask:
    """A model fused into the read tasks (see :func:`chute.engines.resources.fuses`): the
    same replica as :class:`ModelActor`, made once per worker process and kept there for
    the run's later tasks, as an actor would keep it. The first task of a new ``run``
    drops the replicas of earlier runs, and frees them before it builds its own: a class
    may hold a big model, and a process keeps none it will not use again."""

    __name__ = "predict"  # Ray Data names the fused operator after it

    def __init__(self, run: str, stage: str, **actor: Any) -> None:
        self.key, self.actor = (run, stage), actor

    def __call__(self, block: pa.Table) -> pa.Table:
        check_runs(lambda: _units_of(block))
        replica = _replicas.get(self.key)
        if replica is None:
            _drop([key for key in _replicas if key[0] != self.key[0]])
            replica = _replicas[self.key] = ModelActor(**self.actor)
        return replica(block)


def _drop(keys: list[tuple[str, str]]) -> None:
    """Forget these replicas, and free their models before the next one is built: a
    model that refers to itself outlives its replica until the cycle collector runs, which
    costs a worker process 50-100 ms, so it runs only for such a model."""
    stages = [getattr(_replicas.pop(key), "stage", None) for key in keys]  # None: it failed
    built = [stage.built() for stage in stages if stage is not None]
    del stages
    if any(ref is not None and ref() is not None for ref in built):
        gc.collect()


class ObjectStoreSource:
    """Units already in the object store: in-memory data is put there once, by the driver."""

    def __init__(self, schema: pa.Schema) -> None:
        self._schema = schema

    def schema(self) -> pa.Schema:
        return self._schema

    def plan(self) -> list[Unit]:
        raise NotImplementedError("units are planned by the source they were taken from")

    def read(self, unit: Unit, columns: Sequence[str] | None) -> pa.Table:
        import ray

        table: pa.Table = ray.get(unit.ref)
        return table if columns is None else table.select(list(columns))

    def describe(self) -> dict[str, Any]:
        return {"kind": "object-store"}


def in_object_store(reader: Reader, units: list[Unit]) -> tuple[Reader, list[Unit]]:
    import ray

    stored = [replace(u, ref=ray.put(reader.source.read(u, reader.columns))) for u in units]
    return Reader(ObjectStoreSource(reader.source.schema()), None), stored
