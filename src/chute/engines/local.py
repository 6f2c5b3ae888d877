"""The embedded local engine: the whole job in one process.

A streaming pipeline of threads joined by bounded channels::

    readers ──► [preprocess] ──► model 1 replicas ──► … ──► model N replicas ──► writers
                                                                                   │
    driver thread ◄──────────────────── part records ◄────────────────────────────┘

Arrow, NumPy, PyTorch and ONNX Runtime release the GIL, so reading, inference and
writing overlap on every core. Each replica thread loads its model once; a pool left as
it is grows while its newest replica is the bottleneck (:mod:`chute.engines.growth`).
Channels are bounded, so memory stays flat however large the input is.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import astuple
from functools import partial

import pyarrow as pa

from chute.coalesce import Coalescer
from chute.engines import Commit, EngineOptions
from chute.engines.channels import Channel, Idle, Rebatcher, Stopped
from chute.engines.growth import GROW_NOTE, Growth, available_bytes, growth_for, resident_bytes
from chute.engines.resources import (
    StageResources,
    check_local,
    gpu_slots,
    local_replicas,
    local_threads,
    local_writers,
)
from chute.job import Model
from chute.models.base import keep_freed_memory
from chute.plan import Plan, StagePlan
from chute.report import StageStats, add_counters
from chute.sinks import PartRecord, PartWriter
from chute.sources import Unit
from chute.stages import ModelStage, OutputTypes, PrepareStage, PreprocessStage, preparer

CHANNEL_BATCHES = 4
"""Batches a channel holds before its producers wait."""
END_WAIT = 5.0
"""Seconds, in all, that a run stopping on an error waits for its threads."""


class LocalEngine:
    """Runs a plan on threads in this process."""

    def __init__(self, readers: int | None = None, writers: int | None = None) -> None:
        self.readers = readers or min(4, os.cpu_count() or 2)
        self.writers = writers or local_writers()
        self._notes: list[str] = []

    @classmethod
    def from_options(cls, options: EngineOptions) -> LocalEngine:
        """The engine the registry makes (the local engine has no address to reach)."""
        return cls()

    def prepare(self, plan: Plan) -> None:
        """Fail before anything is written if the plan cannot run here."""
        check_local([s.model for s in plan.stages])

    def stage_resources(self, plan: Plan) -> tuple[list[StageResources], str]:
        """Each model's replicas are threads here, with the CPUs and GPUs it asks for."""
        models = [s.model for s in plan.stages]
        stages = [
            _local_resources(m, t) for m, t in zip(models, local_threads(models), strict=True)
        ]
        return stages, "the local engine: replicas are threads in this process"

    def events(self) -> list[str]:
        """What the report should tell of the last run: a replica grown for speed that
        could not load (the run went on without it)."""
        return list(self._notes)

    def execute(self, plan: Plan, commit: Commit) -> dict[str, StageStats]:
        run = _Run(plan, self.readers, self.writers)
        self._notes = run.notes
        return run.drive(commit)


class _Run:
    """One execution: the threads, their channels and the first error any of them hit."""

    def __init__(self, plan: Plan, readers: int, writers: int) -> None:
        keep_freed_memory()  # model threads keep their batches' big buffers (opt-out: env)
        self.plan = plan
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.notes: list[str] = []
        """Events for the report (:meth:`LocalEngine.events`)."""
        self.outputs = {s.model.name: OutputTypes() for s in plan.stages}
        """Each model's output types, one for all its replicas (:class:`OutputTypes`)."""
        self.records: queue.Queue[list[PartRecord] | None] = queue.Queue()
        """Part records for the driver; ``None`` each time a thread ends."""
        self.threads: list[threading.Thread] = []
        self.stats: dict[str, StageStats] = {}
        self.counted: dict[str, dict[str, float]] = {}
        """What the models counted since the driver's last commit (for the progress line)."""
        self._stats_lock = threading.Lock()
        self._units: Iterator[Unit] = iter(plan.pending)
        self._units_lock = threading.Lock()
        self.readers = readers = max(1, min(readers, len(plan.pending)))
        models = [s.model for s in plan.stages]
        self.intra_op = {m.name: t for m, t in zip(models, local_threads(models), strict=True)}
        """Each model's intra-op threads (a replica's share of this machine's cores)."""
        channel = self._channel(readers)
        self._spawn("read", readers, partial(self._read, channel))
        channel = self._preprocess(channel)
        for stage in plan.stages:
            channel = self._model(stage, channel)
        sizes = {u.index: u.rows for u in plan.pending if u.rows is not None}
        self.files = Coalescer(PartWriter(plan.output), sizes=sizes)  # shared by the writers
        self.written = channel
        self._writing = writers
        """Writer threads not finished: the last one closes the files still open."""
        self._spawn("write", writers, partial(self._write, channel, self.files))

    def _channel(self, producers: int) -> Channel:
        return Channel(CHANNEL_BATCHES, producers, self.stop)

    def _spawn(self, name: str, count: int, body: Callable[[], None]) -> None:
        self.stats.setdefault(name, StageStats())
        for i in range(count):
            thread = threading.Thread(
                target=self._guard, args=(body,), name=f"chute-{name}-{i}", daemon=True
            )
            self.threads.append(thread)

    def _guard(self, body: Callable[[], None]) -> None:
        try:
            body()
        except Stopped:
            pass
        except BaseException as exc:
            self.errors.append(exc)
            self.stop.set()
        finally:
            self.records.put(None)  # this thread is done: the driver stops waiting at once

    def _record(self, name: str, seconds: float, rows: int) -> None:
        with self._stats_lock:
            self.stats[name].add(seconds, rows)

    def _next_unit(self) -> Unit | None:
        with self._units_lock:
            return next(self._units, None)

    def _read(self, out: Channel) -> None:
        reader = self.plan.reader
        try:
            while (unit := self._next_unit()) is not None:
                began = time.perf_counter()
                for batch in reader(unit):
                    self._record("read", time.perf_counter() - began, batch.num_rows)
                    out.put(batch)
                    began = time.perf_counter()
        finally:
            out.close()

    def _preprocess(self, channel: Channel) -> Channel:
        pre = self.plan.preprocess
        if pre is None:
            return channel
        stage = PreprocessStage(pre.spec, pre.inputs, pre.protected)
        workers = pre.copies or self.readers  # unset: one beside each reader
        out = self._channel(workers)
        self._spawn("preprocess", workers, partial(self._map, stage, "preprocess", channel, out))
        return out

    def _model(self, stage: StagePlan, channel: Channel) -> Channel:
        step = preparer(stage.model)
        if step is not None:  # the adapter's CPU step (tokenizing), in its own thread
            prepare = PrepareStage(stage.model, stage.inputs, step)
            name, prepared = f"{stage.model.name}.prepare", self._channel(1)
            self._spawn(name, 1, partial(self._map, prepare, name, channel, prepared))
            channel = prepared
        replicas = local_replicas(stage.model)
        growth = growth_for(stage.model, replicas, self.intra_op[stage.model.name])
        out = self._channel(growth.most)
        batches = Rebatcher(channel, stage.batch_rows)
        slots = iter(enumerate(gpu_slots(stage.model, growth.most)))
        body = partial(self._replica, stage, batches, out, growth, lambda: next(slots))
        self._spawn(stage.model.name, growth.most, body)
        return out

    def _replica(
        self,
        stage: StagePlan,
        batches: Rebatcher,
        out: Channel,
        growth: Growth,
        slot: Callable[[], tuple[int, int | None]],
    ) -> None:
        """One replica thread: it waits for its turn (:class:`Growth`), loads the model,
        says what the load added to the process, then serves batches, saying how busy
        it is."""
        mine, gpu = slot()
        try:
            if not growth.wait(mine, self.stop):
                return
            before = resident_bytes()
            try:
                model = ModelStage(
                    stage.model,
                    stage.inputs,
                    gpu=gpu,
                    threads=growth.build_threads(mine),
                    rows=stage.batch_rows,
                    outputs=self.outputs[stage.model.name],
                )
            except Exception as exc:
                if not (growth.grows and mine > 0):
                    raise
                # A replica the user never asked for (the pool grew for speed) that cannot
                # load, where the first one did (a port, a lock, a device held): the run
                # goes on with those loaded.
                growth.failed(mine)
                self.notes.append(
                    f"model {stage.model.name!r}: a replica added for speed could not load "
                    f"({exc}); the run went on with {mine}"
                )
                return
            after = resident_bytes()
            added = None if before is None or after is None else max(0, after - before)
            growth.loaded(mine, added, available_bytes() if growth.grows else None, self.stop)
            try:
                self._serve(stage, model, batches, out, growth, mine)
            finally:
                model.close()
        finally:
            growth.ended(mine)  # done, or failed: the replicas still waiting never start
            out.close()

    def _serve(
        self,
        stage: StagePlan,
        model: ModelStage,
        batches: Rebatcher,
        out: Channel,
        growth: Growth,
        mine: int,
    ) -> None:
        while (batch := batches.take(model.batch_rows)) is not None:  # the replica's size now
            model.threads = growth.threads_each()  # fewer, once more replicas have started
            growth.calling(mine)
            began = time.perf_counter()
            result = model(batch)
            took = time.perf_counter() - began
            growth.called(mine, took)
            self._record(stage.model.name, took, batch.num_rows)
            counters = model.clock.take_counters()
            with self._stats_lock:
                self.stats[stage.model.name].add_batching(*astuple(model.take_batching()))
                if counters:
                    self.stats[stage.model.name].add_counters(counters)
                    add_counters(self.counted.setdefault(stage.model.name, {}), counters)
            out.put(result)

    def _map(
        self, fn: Callable[[pa.Table], pa.Table], name: str, source: Channel, out: Channel
    ) -> None:
        try:
            while (batch := source.get()) is not None:
                began = time.perf_counter()
                result = fn(batch)
                self._record(name, time.perf_counter() - began, batch.num_rows)
                out.put(result)
        finally:
            out.close()

    def _write(self, source: Channel, files: Coalescer) -> None:
        """Hand batches to the shared coalescer; write what it holds when it is due (a
        ready unit waited its longest) and, once the last writer is through, everything.
        (A writer that closed every file as soon as the input ended could close the one
        another writer was about to append its last batch to: one more, smaller file.)"""
        while True:
            try:
                batch = source.get(timeout=files.wait())
            except Idle:
                self._send(files.flush())
                continue
            if batch is None:
                break
            self._send(files.add(batch))
        with self._stats_lock:
            self._writing -= 1
            last = self._writing == 0
        if last:
            self._send(files.flush(everything=True))

    def _send(self, records: list[PartRecord]) -> None:
        if records:
            self.records.put(records)

    def drive(self, commit: Commit) -> dict[str, StageStats]:
        """Start the threads and commit records on this (the driver) thread until done."""
        for thread in self.threads:
            thread.start()
        running = len(self.threads)
        try:
            while running:
                self._raise_first_error()
                try:
                    records = self.records.get(timeout=0.1)  # a timeout: Ctrl-C gets through
                except queue.Empty:
                    continue
                if records is None:
                    running -= 1
                else:
                    with self._stats_lock:
                        counted, self.counted = self.counted, {}
                    commit(records, counted)
            self._raise_first_error()
        except BaseException as exc:
            self._end_threads()
            if self.errors:  # a stage failed: the units that finished before it still count
                try:
                    self._commit_finished(commit)
                except Exception as late:  # the first error is the one to tell
                    exc.add_note(f"The units finished before it were not committed ({late}).")
            self.files.discard()  # the files still open hold units not finished
            raise
        self._end_threads()
        self.stats.pop("write", None)
        return self.stats

    def _end_threads(self) -> None:
        """Stop every thread; wait for them a few seconds in all (one inside a model call
        cannot be stopped: it ends when the call returns, taking no more work)."""
        self.stop.set()
        deadline = time.monotonic() + END_WAIT
        for thread in self.threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def _commit_finished(self, commit: Commit) -> None:
        """After a stage failed: commit the parts already written, and write and commit
        the finished units still on their way to the writer or held by the coalescer for
        company, so that the resume redoes only what had not finished (it would redo them
        all the same, correctly, but a model that fails an hour in should not cost the
        hour)."""
        records: list[PartRecord] = []
        with contextlib.suppress(queue.Empty):
            while True:
                records += self.records.get_nowait() or []
        while (batch := self.written.poll()) is not None:  # through every model already
            records += self.files.add(batch)
        records += self.files.flush()
        if records:
            commit(records)

    def _raise_first_error(self) -> None:
        if self.errors:
            raise self.errors[0]


def _local_resources(model: Model, threads: int) -> StageResources:
    replicas = local_replicas(model)
    growth = growth_for(model, replicas, threads)
    res = model.resources
    cpus = res.cpus or 1.0
    note = GROW_NOTE if growth.grows else ""
    return StageResources(
        model.name, cpus, res.gpus, res.memory, replicas, growth.most, note, threads=threads
    )
