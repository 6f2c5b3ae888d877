"""The ray engine: Ray Data streaming execution.

::

    read tasks (one per unit) ─► [preprocess, fused into the read tasks]
        ─► model 1 actor pool ─► … ─► model N actor pool, which also writes its parts
        ─► the driver iterates over part records only

The units come from chute's own plan through a custom datasource, so Ray Data lists no
files itself. Each model's function or class and its constructor arguments are put in
the object store once and fetched by reference in each actor's constructor. Resources
are planned by :mod:`chute.engines.resources` so that reads can never starve.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pyarrow as pa

from chute.engines import EngineOptions, carried
from chute.engines.resources import Cluster, StageResources, plan_resources
from chute.errors import ChuteError, ConfigError
from chute.job import Model, Preprocess
from chute.plan import Plan, Reader, StagePlan
from chute.raydata import quiet_data
from chute.report import StageStats
from chute.sinks import Output, PartRecord, PartWriter, records_from_table, records_to_table
from chute.sources import DatasetSource, TableSource, Unit
from chute.stages import ModelStage, PrepareStage, PreprocessStage, preparer

log = logging.getLogger("chute")

SHIP_EXCLUDES = [".git", "__pycache__", "*.pyc", ".venv", "_chute"]
"""Never shipped with a job's directory (Ray also honours the directory's .gitignore)."""
_shipped: dict[str, str | None] = {"working_dir": None}
"""The local directory this process's Ray session ships to its workers, if any."""


def init_ray(
    address: str | None, verbose: bool, runtime_env: Mapping[str, Any] | None = None
) -> str | None:
    """Connect to ``address`` (or ``RAY_ADDRESS``), or start a quiet local Ray.

    ``runtime_env`` (the job's) applies to every worker; returns the local ``working_dir``
    the workers run in (a copy shipped by Ray), or ``None`` when no code is shipped.
    """
    import ray

    wanted = (runtime_env or {}).get("working_dir")
    if ray.is_initialized():
        if wanted and wanted != _shipped["working_dir"]:
            log.warning(
                "Ray was started before this job, so its runtime_env (working_dir %s) is not "
                "applied: pass runtime_env to ray.init() yourself, or let chute start Ray.",
                wanted,
            )
        return _shipped["working_dir"]
    address = address or os.environ.get("RAY_ADDRESS")
    if not verbose:
        # Ray Data hands every actor pool its transformer by reference, and Ray's core
        # worker logs an error line about it for each pool (ray#53727): noise for a user.
        os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
    if address:
        _check_reachable(address)
    try:
        with _quiet_stderr(not verbose):
            ray.init(
                # "local": a fresh instance of our own, never a `ray start` cluster (or a stale
                # record of one in /tmp/ray) that a bare ray.init() would try to join.
                address=address or "local",
                include_dashboard=False if address is None else None,
                log_to_driver=verbose,
                logging_level=logging.INFO if verbose else logging.ERROR,
                configure_logging=True,
                runtime_env=dict(runtime_env) if runtime_env else None,
            )
    except ray.exceptions.RuntimeEnvSetupError as exc:  # shipping the job's code failed
        reason = str(exc).replace("Failed to set up runtime environment.", "").strip()
        raise ConfigError(
            f"cannot set up the job's runtime_env on the workers: {reason} Keep data and large "
            "models in storage rather than beside the job, list them under runtime_env: "
            "{excludes: [...]}, or set runtime_env: {working_dir: null} to ship nothing."
        ) from exc
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = f"connect to the Ray cluster at {address!r}" if address else "start Ray"
        raise ConfigError(
            f"cannot {where}: {exc}. Check the address (the head's host:port "
            "as printed by 'ray start --head') and that the cluster is up, or unset RAY_ADDRESS "
            "to run locally."
        ) from exc
    _shipped["working_dir"] = wanted if isinstance(wanted, str) and "://" not in wanted else None
    return _shipped["working_dir"]


def job_runtime_env(plan: Plan) -> dict[str, Any]:
    """The job's runtime_env, with its output, its inputs and build debris excluded."""
    env = dict(plan.job.runtime_env)
    root = env.get("working_dir")
    if not isinstance(root, str) or "://" in root:
        return env
    paths = [plan.job.output.path] if plan.job.output is not None else []
    paths += list(getattr(plan.source, "paths", []))
    inside = [os.path.relpath(p, root) for p in paths if "://" not in p and _under(p, root)]
    env["excludes"] = [*env.get("excludes", []), *SHIP_EXCLUDES, *(f"/{p}" for p in inside)]
    return env


def portable(target: Any, shipped: str | None) -> Any:
    """A ``file.py:name`` target inside the shipped directory, relative to it: the workers
    run in their copy of that directory, where the driver's absolute path does not exist."""
    if not isinstance(target, str) or shipped is None:
        return target
    module, sep, attr = target.rpartition(":")
    if sep and module.endswith(".py") and os.path.isabs(module) and _under(module, shipped):
        return f"{os.path.relpath(module, shipped)}:{attr}"
    return target


def _under(path: str, root: str) -> bool:
    path, root = os.path.abspath(path), os.path.abspath(root)
    return os.path.commonpath([path, root]) == root


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail at once on a head that does not answer (``ray.init`` retries for minutes)."""
    host, sep, port = address.rpartition(":")
    if "://" in address or not sep or not port.isdigit():
        return  # ray://, auto, or a form Ray resolves itself
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return
    except OSError as exc:
        raise ConfigError(
            f"cannot connect to the Ray cluster at {address!r}: {exc}. Check the address (the "
            "head's host:port as printed by 'ray start --head') and that the cluster is up, or "
            "unset RAY_ADDRESS to run locally."
        ) from exc


@contextmanager
def _quiet_stderr(quiet: bool) -> Iterator[None]:
    """Silence what Ray's C++ core prints on file descriptor 2 while it starts."""
    if not quiet:
        yield
        return
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def cluster() -> Cluster:
    import ray

    return Cluster.from_ray(ray.cluster_resources())


class UnitDatasource:
    """A Ray Data datasource with one read task per pending unit."""

    def __new__(cls, reader: Reader, units: list[Unit]) -> Any:
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
                    ReadTask(
                        _read_fn(reader, unit),
                        BlockMetadata(unit.rows, unit.nbytes, None, None),
                    )
                    for unit in units
                ]

        return _Units()


def _read_fn(reader: Reader, unit: Unit) -> Callable[[], Iterator[pa.Table]]:
    def read() -> Iterator[pa.Table]:
        began = time.perf_counter()
        for batch in reader(unit):
            yield carried.carry(batch, "read", time.perf_counter() - began)
            began = time.perf_counter()

    return read


class _PreprocessTask:
    """Preprocess as a stateless task function (Ray fuses it into the read tasks)."""

    def __init__(self, spec: Preprocess, inputs: list[str], carryover: list[str]) -> None:
        self.spec, self.inputs, self.carryover = spec, inputs, carryover

    def __call__(self, table: pa.Table) -> pa.Table:
        stage = PreprocessStage(self.spec, self.inputs, self.carryover)
        return carried.carry(stage(table), "preprocess", stage.clock.busy)


class _PrepareTask:
    """An adapter's CPU step as a stateless task function (its processor is cached per
    worker process by the adapter)."""

    def __init__(self, stage: PrepareStage) -> None:
        self.stage = stage

    def __call__(self, table: pa.Table) -> pa.Table:
        out = carried.carry(self.stage(table), f"{self.stage.name}.prepare", self.stage.clock.busy)
        self.stage.clock.busy = 0.0
        return out


class _ModelActor:
    """One replica of a model stage in a Ray actor; the last stage also writes.

    It gets whole blocks and cuts them into batches of ``rows`` itself: asked for batches,
    Ray Data would bundle blocks until they hold a batch, so that a unit's last block
    waited for blocks of other units, and the unit for its commit (see
    :meth:`RayEngine._model_stage`).
    """

    def __init__(
        self,
        model: Model,
        inputs: list[str],
        target: Any,
        ctor: Any,
        output: Output | None,
        rows: int,
    ) -> None:
        import ray

        self.failed: ChuteError | None = None
        try:
            self.stage = ModelStage(
                model,
                inputs,
                target=ray.get(target) if target is not None else None,
                ctor=ray.get(ctor) if ctor is not None else None,
            )
        except ChuteError as exc:
            # Raised here, it would kill the actor, and Ray hands the driver only the text of
            # a constructor's error; raised from a batch it arrives as the error it is.
            self.failed = exc
        self.writer = PartWriter(output) if output is not None else None
        self.rows = rows

    def __call__(self, block: pa.Table) -> pa.Table:
        if self.failed is not None:
            raise self.failed
        starts = range(0, max(block.num_rows, 1), self.rows)
        outs = [self._batch(block.slice(start, self.rows)) for start in starts]
        return outs[0] if len(outs) == 1 else pa.concat_tables(outs, promote_options="permissive")

    def _batch(self, table: pa.Table) -> pa.Table:
        out = self.stage(table)
        clock, name = self.stage.clock, self.stage.name
        busy, clock.busy = clock.busy, 0.0
        if self.writer is None:  # a later stage writes: the stats travel with the rows
            return carried.carry(out, name, busy, clock.take_splits())
        out, totals = carried.collect(out)
        splits, batch_rows = clock.take_splits()
        mine = {"busy": busy, "batches": 1.0, "rows": float(out.num_rows), "splits": splits}
        carried.add(totals, {name: {**mine, "batch_rows": float(batch_rows or 0)}})
        records = records_to_table(self.writer.write(out))
        text = [carried.encode(totals)] + [""] * (records.num_rows - 1)
        return records.append_column(carried.STAGES, pa.array(text[: records.num_rows]))


class RayEngine:
    """Runs a plan with Ray Data on a local Ray or on the cluster at ``address``."""

    def __init__(self, address: str | None = None, verbose: bool = False) -> None:
        self.address = address
        self.verbose = verbose
        self.shipped: str | None = None
        """The job directory the workers run in, when Ray ships it (see :func:`init_ray`)."""

    @classmethod
    def from_options(cls, options: EngineOptions) -> RayEngine:
        """The engine the registry makes."""
        return cls(address=options.address, verbose=options.verbose)

    def prepare(self, plan: Plan) -> None:
        """Connect, and fail before anything is written if the cluster cannot run the plan."""
        self.resources(plan)

    def stage_resources(self, plan: Plan) -> tuple[list[StageResources], str]:
        """As :meth:`resources` would plan them: on the cluster when there is an address,
        else on the local Ray this machine would start (without starting it)."""
        models = [s.model for s in plan.stages]
        if self.address or os.environ.get("RAY_ADDRESS"):
            init_ray(self.address, verbose=False)
            found = cluster()
            return plan_resources(models, found), (
                f"Ray cluster with {found.cpus:g} CPUs, {found.gpus:g} GPUs"
            )
        here = Cluster(cpus=float(os.cpu_count() or 1))
        return plan_resources(models, here), f"a local Ray on this machine ({here.cpus:g} CPUs)"

    def resources(self, plan: Plan) -> list[StageResources]:
        self.shipped = init_ray(self.address, self.verbose, job_runtime_env(plan))
        return plan_resources([s.model for s in plan.stages], cluster())

    def execute(
        self, plan: Plan, commit: Callable[[list[PartRecord]], None]
    ) -> dict[str, StageStats]:

        resources = self.resources(plan)
        totals: dict[str, dict[str, float]] = {}
        with released(), quiet_data(self.verbose):
            self._stream(self._dataset(plan, resources), commit, totals)
        return carried.stage_stats(totals)

    def _stream(
        self,
        dataset: Any,
        commit: Callable[[list[PartRecord]], None],
        totals: dict[str, dict[str, float]],
    ) -> None:
        """Hand every part record to ``commit`` and sum the stage statistics that came with
        them into ``totals``; translate a failed task to a chute error."""
        import ray

        # No prefetching: Ray Data would hand over each record block only once the next one
        # has arrived, so the last unit done would wait for another before its commit.
        batches = dataset.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=0)
        try:
            for batch in batches:
                for text in batch.column(carried.STAGES).to_pylist():
                    carried.add(totals, carried.decode(text))
                commit(records_from_table(batch.drop_columns([carried.STAGES])))
        except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as exc:
            error = _unwrap(exc)
            _drop_frames(exc)
            if error is exc:
                raise
            raise error from exc

    def _dataset(self, plan: Plan, resources: list[StageResources]) -> Any:
        import ray

        reader, units = plan.reader, plan.pending
        if isinstance(plan.source, TableSource):
            reader, units = _in_object_store(reader, units)
        elif isinstance(plan.source, DatasetSource):  # its blocks are in the store already
            reader = Reader(ObjectStoreSource(plan.source.schema()), plan.read_columns)
        dataset = ray.data.read_datasource(
            UnitDatasource(reader, units), override_num_blocks=len(units)
        )
        spec = plan.job.preprocess
        if spec is not None:
            spec = replace(spec, fn=portable(spec.fn, self.shipped))
            inputs = list(spec.inputs or plan.read_columns or plan.source.schema().names)
            dataset = dataset.map_batches(
                _PreprocessTask(spec, inputs, plan.carryover),
                batch_size=None,
                batch_format="pyarrow",
                num_cpus=min(spec.cpus, 1.0),
                zero_copy_batch=True,
            )
        for i, (stage, res) in enumerate(zip(plan.stages, resources, strict=True)):
            last = i == len(plan.stages) - 1
            step = preparer(stage.model)
            if step is not None:  # the adapter's CPU step (tokenizing), fused into the reads
                dataset = dataset.map_batches(
                    _PrepareTask(PrepareStage(stage.model, stage.inputs, step)),
                    batch_size=None,
                    batch_format="pyarrow",
                    num_cpus=1.0,
                    zero_copy_batch=True,
                )
            dataset = self._model_stage(dataset, stage, res, plan.output if last else None)
        return dataset

    def _model_stage(
        self,
        dataset: Any,
        stage: StagePlan,
        res: StageResources,
        output: Output | None,
    ) -> Any:
        import ray

        model = stage.model
        target = None if isinstance(model.fn, str) else ray.put(model.fn)
        ctor = ray.put((model.args, dict(model.kwargs))) if model.args or model.kwargs else None
        stub = replace(
            model,
            fn=portable(model.fn, self.shipped) if isinstance(model.fn, str) else "<object store>",
            args=(),
            kwargs={},
        )
        remote_args: dict[str, Any] = {"num_cpus": res.cpus}
        if res.gpus:
            remote_args["num_gpus"] = res.gpus
        if res.memory:
            remote_args["memory"] = res.memory
        # Whole blocks, cut into batches by the actor: given a batch size, Ray Data holds a
        # unit's last block until blocks of other units fill a batch (a unit then commits
        # only when others arrive, or the input ends). The public map_batches refuses no
        # batch size with GPUs; map_batches_internal, where Ray has it, skips that check.
        map_batches = getattr(dataset, "map_batches_internal", dataset.map_batches)
        return map_batches(
            _ModelActor,
            fn_constructor_kwargs={
                "model": stub,
                "inputs": list(stage.inputs),
                "target": target,
                "ctor": ctor,
                "output": output,
                "rows": stage.batch_rows,
            },
            batch_size=None,
            batch_format="pyarrow",
            zero_copy_batch=True,
            compute=ray.data.ActorPoolStrategy(min_size=res.min, max_size=res.max),
            **remote_args,
        )


EXIT_SECONDS = 60.0
"""Most seconds a run waits for its actors to exit after it ends."""
FREE_SECONDS = 10.0
"""Then, most seconds it waits for Ray's view of free CPUs and GPUs to show them back."""
_POOL_ACTOR = "MapWorker("
"""How the class names of Ray Data's pool actors start in Ray's actor table (followed by
the operator's name, which holds ``_ModelActor`` for chute's model stages)."""


@contextmanager
def released() -> Iterator[None]:
    """On the way out of a run, finished or failed, wait until its actors have exited and
    their CPUs and GPUs are free again, so that the next run in this process (a notebook,
    a test) never finds them taken: its reads would starve.

    Ray Data lets go of an actor pool by dropping its handles (never ``ray.kill``), and Ray
    ends the actors asynchronously; on a loaded machine that can take many seconds. The
    wait is for this driver's pool actors to be dead in Ray's actor table, then for the
    free CPUs and GPUs to be at least what they were when the run started (both bounded:
    a slow cluster delays the return, never fails the job).
    """
    import ray

    before = _free(ray.available_resources())
    try:
        yield
    except BaseException as exc:
        # The frames a failed run's error passed through hold its dataset, and through it
        # the tasks in flight on its actors: the actors would live as long as the error.
        traceback.clear_frames(exc.__traceback__)
        raise
    finally:
        gc.collect()  # Ray Data's executor and operators hold each other: a cycle to free
        _wait_for(lambda: live_pool_actors() == 0, EXIT_SECONDS)
        _wait_for(lambda: _at_least(_free(ray.available_resources()), before), FREE_SECONDS)


def _free(available: Mapping[str, float]) -> dict[str, float]:
    return {kind: float(available.get(kind, 0.0)) for kind in ("CPU", "GPU")}


def _at_least(now: Mapping[str, float], before: Mapping[str, float]) -> bool:
    return all(now[kind] >= before[kind] - 1e-6 for kind in before)


def live_pool_actors() -> int:
    """This driver's Ray Data pool actors that are not dead yet (0 if Ray cannot say)."""
    import ray

    try:
        job = ray.JobID.from_hex(ray.get_runtime_context().get_job_id())
        table = ray._private.state.actors(job_id=job)  # the GCS actor table; no dashboard
    except Exception:  # not every Ray has it: then the wait for free resources alone
        log.debug("cannot read Ray's actor table", exc_info=True)
        return 0
    return sum(
        1
        for actor in table.values()
        if _is_model_pool(str(actor.get("ActorClassName"))) and actor.get("State") != "DEAD"
    )


def _is_model_pool(name: str) -> bool:
    return name.startswith(_POOL_ACTOR) and _ModelActor.__name__ in name


def _wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            log.debug("gave up after %g s waiting for a run's actors to go", seconds)
            return False
        time.sleep(0.05)
    return True


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


def _in_object_store(reader: Reader, units: list[Unit]) -> tuple[Reader, list[Unit]]:
    import ray

    stored = [replace(u, ref=ray.put(reader.source.read(u, reader.columns))) for u in units]
    return Reader(ObjectStoreSource(reader.source.schema()), None), stored


def _unwrap(exc: Exception) -> BaseException:
    """The exception a stage raised inside a Ray task, as it was raised (a chute error, an
    Arrow error, ...): the runner translates it as it would on any engine. A Ray error
    that carries none (a lost actor, say) comes back as it is."""
    found: BaseException = exc
    cause = getattr(exc, "cause", None)
    while cause is not None:
        if not type(cause).__module__.startswith("ray."):
            found = cause  # the innermost error that is not Ray's own wrapper
        if isinstance(cause, ChuteError):
            break
        cause = getattr(cause, "__cause__", None) or getattr(cause, "cause", None)
    if isinstance(found, ChuteError):
        # Ray Data appends its retry advice to the message in place: not chute's advice.
        text = str(found).split("\nFailed to apply ")[0]
        found.args = (text, *found.args[1:])
    return found


def _drop_frames(exc: BaseException | None) -> None:
    """Forget the Ray Data frames an error (and the errors it arose from) holds: they keep
    the failed run's actors, and their CPUs, alive for as long as the error is referenced,
    so that the next run in the same process (a notebook) would starve its reads and hang.
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.__traceback__ = None
        exc = exc.__context__
