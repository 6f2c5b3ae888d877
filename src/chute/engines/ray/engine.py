"""The Ray engine: maps a plan onto Ray Data operators and streams part records back."""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from chute.engines import Commit, EngineOptions, carried
from chute.engines.ray.operators import (
    ModelActor,
    ModelTask,
    ObjectStoreSource,
    PrepareTask,
    PreprocessTask,
    UnitDatasource,
    begun,
    in_object_store,
    read_groups,
)
from chute.engines.ray.release import drop_frames, released
from chute.engines.ray.session import cluster, init_ray, job_runtime_env, portable, ray_log
from chute.engines.ray.watchdog import Stalled, Watchdog
from chute.engines.resources import Cluster, StageResources, plan_stages, read_cpus
from chute.errors import ChuteError
from chute.plan import Plan, Reader, StagePlan
from chute.raydata import quiet_data
from chute.report import StageStats
from chute.sinks import Output, PartRecord, records_from_table
from chute.sources import DatasetSource, TableSource
from chute.stages import PrepareStage, preparer

REPLANS = 3
"""Most times one run plans its work again because the cluster changed; after that, a
stall stops it (the watchdog's error) and the next run plans afresh."""
GROW_UNITS = 2
"""A node that joins is used (the run planned again) while more units than this are left."""


class RayEngine:
    """Runs a plan with Ray Data on a local Ray or on the cluster at ``address``."""

    def __init__(self, address: str | None = None, verbose: bool = False) -> None:
        self.address = address
        self.verbose = verbose
        self.shipped: str | None = None
        """The job directory the workers run in, when Ray ships it (see :func:`init_ray`)."""
        self._events: list[str] = []
        self._again: set[int] = set()
        """The units whose rows a Ray task computed again in the last run (see
        :data:`chute.engines.carried.RETRIED`)."""
        self._arrived: set[int] = set()
        """The units some rows of which reached the driver in the current attempt: those
        not committed when the run is planned again are computed again, and said so."""
        self._run = ""
        """The current attempt's id (see :meth:`_dataset`)."""
        self._begun: dict[int, set[str]] | None = None
        """The units the last attempt's read tasks began, and on which nodes (see
        :func:`~chute.engines.ray.operators.begin`)."""

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
        if self.address or os.environ.get("RAY_ADDRESS"):
            init_ray(self.address, verbose=False)
            found = cluster()
            return _stages(plan, found), (
                f"Ray cluster with {found.describe()}; reads take {read_cpus(found):g} CPU each"
            )
        here = Cluster(cpus=float(os.cpu_count() or 1))
        return _stages(plan, here), (
            f"a local Ray on this machine ({here.cpus:g} CPUs; reads take {read_cpus(here):g} "
            "CPU each)"
        )

    def resources(self, plan: Plan) -> list[StageResources]:
        self.shipped = init_ray(self.address, self.verbose, job_runtime_env(plan))
        return _stages(plan, cluster())

    def events(self) -> list[str]:
        """The nodes the last run lost (address, CPUs, when), and the file that holds Ray's
        own messages unless ``verbose`` sent them to the terminal."""
        return list(self._events)

    def execute(self, plan: Plan, commit: Commit) -> dict[str, StageStats]:
        """Run the pending units; when the cluster changes under the run (a node lost that
        leaves work no node can take, or a node that joins), plan the units not done yet
        against the cluster as it is then and go on, at most :data:`REPLANS` times."""
        self._events, self._again = [], set()
        totals: dict[str, dict[str, float]] = {}
        began, attempt, why = time.monotonic(), plan, None
        try:
            for replans in range(REPLANS + 1):
                # Planned again for a node that joined: its replicas start at once, not as
                # the pool's autoscaling gets round to them (the work left may not wait).
                joined = why is not None and why.startswith("node ")
                why = self._attempt(
                    attempt, commit, totals, began, adapt=replans < REPLANS, whole=joined
                )
                if why is None:
                    break
                left = commit.redo()
                minutes, seconds = divmod(int(time.monotonic() - began), 60)
                self._events.append(
                    f"planned again at {minutes}:{seconds:02d} ({why}): {len(left)} unit(s) "
                    f"left{_in_flight(plan, left, self._begun)}"
                    f"{_written(plan, left & self._arrived)}"
                )
                attempt = replace(plan, pending=[u for u in plan.pending if u.index in left])
                if not attempt.pending:
                    break
        finally:
            if self._again:
                self._events.append(_again(plan, self._again))
            if not self.verbose:
                self._events.append(f"Ray's own messages: {ray_log()}")
        return carried.stage_stats(totals)

    def _attempt(
        self,
        plan: Plan,
        commit: Commit,
        totals: dict[str, dict[str, float]],
        began: float,
        adapt: bool,
        whole: bool = False,
    ) -> str | None:
        """Run ``plan.pending`` on a plan made against the cluster as it is now (``whole``:
        each pool started at its largest size); ``None`` once all are done, or why the
        watchdog stopped the run to plan it again."""
        resources = self.resources(plan)
        if whole:
            resources = [replace(r, min=max(r.min, r.max)) for r in resources]
        found = cluster()
        ends = [0]  # units whose last rows arrived: a joined node is worth a new plan only
        # while more than a few are left (a new plan runs the units in flight again)
        self._arrived = set()

        def seen(records: list[PartRecord], counters: Any = None, status: Any = None) -> None:
            ends[0] += sum(1 for r in records if r.unit_rows >= 0)
            self._arrived.update(r.unit for r in records)
            commit(records, counters, status)

        watchdog = Watchdog(
            found,
            min((r.cpus for r in resources if not r.fused), default=0.0),
            waiting=lambda note: commit([], None, status=note),
            log_note="" if self.verbose else f" Ray's own messages: {ray_log()}.",
            adapt=adapt,
            grow=lambda: len(plan.pending) - ends[0] > GROW_UNITS,
            began=began,
        )
        release = released(
            wait=lambda: watchdog.error is None,
            kill=lambda: watchdog.replan is not None,
            free=lambda: not watchdog.lost,
            actors=not all(r.fused for r in resources),
        )
        try:
            with release, quiet_data(self.verbose), watchdog:
                dataset = self._dataset(plan, resources, read_cpus(found))
                self._stream(dataset, seen, totals, watchdog.progress)
        except Stalled:
            if watchdog.replan is not None:
                return watchdog.replan
            assert watchdog.error is not None
            raise watchdog.error from None
        finally:
            self._events += [f"lost node {lost}" for lost in watchdog.lost.values()]
            self._begun = begun(self._run)
        if watchdog.replan is not None:  # stopped, and Ray's iterator ended rather than raised
            return watchdog.replan
        if watchdog.error is not None:
            raise watchdog.error
        return None

    def _stream(
        self,
        dataset: Any,
        commit: Callable[[list[PartRecord], Any], None],
        totals: dict[str, dict[str, float]],
        progress: Callable[[set[str]], None],
    ) -> None:
        """Hand every part record to ``commit`` and sum the stage statistics that came with
        them into ``totals``; call ``progress`` with the nodes that wrote them as each batch
        arrives; translate a failed task to a chute error."""
        import ray

        # No prefetching: Ray Data would hand over each record block only once the next one
        # has arrived, so the last unit done would wait for another before its commit.
        batches = dataset.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=0)
        try:
            for batch in batches:
                progress(set(batch.column(carried.NODE).to_pylist()))
                counters: dict[str, dict[str, float]] = {}
                for text in batch.column(carried.STAGES).to_pylist():
                    carried.add(totals, carried.decode(text))
                    carried.add(counters, carried.counted(carried.decode(text)))
                again = batch.filter(batch.column(carried.AGAIN)).column("unit")
                self._again.update(again.to_pylist())
                records = batch.drop_columns([carried.STAGES, carried.NODE, carried.AGAIN])
                commit(records_from_table(records), counters)
        except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as exc:
            error = _unwrap(exc)
            drop_frames(exc)
            if error is exc:
                raise
            raise error from exc

    def _dataset(self, plan: Plan, resources: list[StageResources], reads: float) -> Any:
        """The plan as Ray Data operators; read tasks (and what fuses into them) ask for
        ``reads`` CPUs each."""
        import ray

        # This attempt: the replicas fused into its tasks are its own, and the notes of the
        # units its reads began.
        run = self._run = uuid.uuid4().hex
        reader, units = plan.reader, plan.pending
        if isinstance(plan.source, TableSource):
            reader, units = in_object_store(reader, units)
        elif isinstance(plan.source, DatasetSource):  # its blocks are in the store already
            reader = Reader(ObjectStoreSource(plan.source.schema()), plan.read_columns)
        dataset = ray.data.read_datasource(
            UnitDatasource(reader, units, run),
            override_num_blocks=len(read_groups(units)),
            num_cpus=reads,
        )
        pre = plan.preprocess
        if pre is not None:
            spec = replace(pre.spec, fn=portable(pre.spec.fn, self.shipped))
            fn = None if isinstance(spec.fn, str) else ray.put(spec.fn)
            if fn is not None:
                spec = replace(spec, fn="<object store>")
            # Unset copies: no limit, so Ray fuses the step into the read tasks.
            limit = {} if pre.copies is None else {"concurrency": pre.copies}
            dataset = dataset.map_batches(
                PreprocessTask(spec, list(pre.inputs), list(pre.protected), fn),
                batch_size=None,
                batch_format="pyarrow",
                num_cpus=reads if pre.copies is None else pre.cpus_each,
                zero_copy_batch=True,
                **limit,
            )
        for i, (stage, res) in enumerate(zip(plan.stages, resources, strict=True)):
            last = i == len(plan.stages) - 1
            step = preparer(stage.model)
            if step is not None:  # the adapter's CPU step (tokenizing), fused into the reads
                dataset = dataset.map_batches(
                    PrepareTask(PrepareStage(stage.model, stage.inputs, step)),
                    batch_size=None,
                    batch_format="pyarrow",
                    num_cpus=reads,
                    zero_copy_batch=True,
                )
            output = plan.output if last else None
            dataset = self._model_stage(dataset, stage, res, output, reads, run)
        # Ray Data's reservations per operator begin every run with no resources known
        # (Ray asks its autoscaling coordinator, an actor, and looks again a second later)
        # and then keep half the cluster for each operator: on 2 CPUs the fused reads ran
        # one task at a time for a taxi run's whole second. chute plans the CPUs of reads
        # and pools itself (chute.engines.resources), so they are left out.
        dataset.context.op_resource_reservation_enabled = False
        return dataset

    def _model_stage(
        self,
        dataset: Any,
        stage: StagePlan,
        res: StageResources,
        output: Output | None,
        reads: float,
        run: str,
    ) -> Any:
        """One model stage: fused into the read tasks (``run`` names this attempt, so a
        worker process keeps only its replicas), or an actor pool."""
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
        actor = {
            "model": stub,
            "inputs": list(stage.inputs),
            "target": target,
            "ctor": ctor,
            "output": output,
            "rows": stage.batch_rows,
            "threads": res.threads,
        }
        # Whole blocks, cut into batches by the actor: given a batch size, Ray Data holds a
        # unit's last block until blocks of other units fill a batch (a unit then commits
        # only when others arrive, or the input ends). The public map_batches refuses no
        # batch size with GPUs; map_batches_internal, where Ray has it, skips that check.
        if res.fused:  # tasks like the reads', which Ray fuses with them: one task per block
            return dataset.map_batches(
                ModelTask(run, model.name, **actor),
                batch_size=None,
                batch_format="pyarrow",
                zero_copy_batch=True,
                num_cpus=reads,
            )
        map_batches = getattr(dataset, "map_batches_internal", dataset.map_batches)
        return map_batches(
            ModelActor,
            fn_constructor_kwargs=actor,
            batch_size=None,
            batch_format="pyarrow",
            zero_copy_batch=True,
            compute=ray.data.ActorPoolStrategy(min_size=res.min, max_size=res.max),
            **remote_args,
        )


def _stages(plan: Plan, found: Cluster) -> list[StageResources]:
    """The plan's model stages on ``found`` (a preprocess step with copies of its own
    stands between the reads and the first pool: Ray Data cannot fuse them)."""
    pooled = plan.preprocess is not None and plan.preprocess.copies is not None
    return plan_stages([s.model for s in plan.stages], found, pooled)


def _again(plan: Plan, again: set[int]) -> str:
    """The report's line for the units a Ray task computed again (a node, a worker or a
    task's output lost): at best only the units in flight there."""
    count, named = _named(plan, again)
    return (
        f"{count:,} unit(s) computed again by Ray, their tasks run a second time after a "
        f"node, worker or output was lost (each row is written once): {named}"
    )


def _in_flight(plan: Plan, left: set[int], began: dict[int, set[str]] | None) -> str:
    """What the ``planned again`` line says of the units left that a read task had begun:
    in flight when the run stopped, on any node, so computed again by the new plan
    (``began``: ``None`` if the GCS could not say which)."""
    if began is None:
        return ", those in flight computed again"
    flight = {u for u in left if u in began}
    if not flight:
        return ", none of them begun"
    count, named = _named(plan, flight)
    nodes = Counter(node for unit in flight for node in began[unit])
    where = ", ".join(f"{n:,} on {node}" for node, n in sorted(nodes.items()))
    return f"; {count:,} of them in flight, computed again ({where}): {named}"


def _written(plan: Plan, units: set[int]) -> str:
    """What the ``planned again`` line adds of the units in flight that had rows written
    (dropped: the new plan writes them again)."""
    if not units:
        return ""
    count, named = _named(plan, units)
    return f"; {count:,} of them had rows written, dropped: {named}"


def _named(plan: Plan, units: set[int]) -> tuple[int, str]:
    """How many of the plan's units ``units`` are, and the first five by id."""
    ids = [u.id for u in plan.pending if u.index in units]
    more = f" and {len(ids) - 5:,} more" if len(ids) > 5 else ""
    return len(ids), ", ".join(ids[:5]) + more


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
