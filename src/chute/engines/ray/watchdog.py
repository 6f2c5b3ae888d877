"""The stall watchdog: a run on Ray never hangs in silence.

A Ray cluster that loses a node can be left unable to run what a job still needs: the
restarted model actor takes the last CPU and the read tasks wait for one forever (Ray issue
44687), or no node with CPUs is left at all. Ray waits; nothing fails. The watchdog samples
the cluster every second while the run streams, and when

* no part record has reached the driver for :data:`STALL_SECONDS`, and
* all that time Ray has had tasks or actors pending that no alive node can ever run (their
  CPUs and GPUs exceed what the node has, less what chute's model actors hold there),

it stops the run with a :class:`~chute.errors.StallError` that says what is pending, what
the cluster has (and which nodes it lost) and what to do. Units committed so far stay
committed: the same command resumes, planning against the cluster as it is then. Until
then, once such demand has waited :data:`WAITING_SECONDS` (or half the bound), the
progress line says "waiting for resources" instead of an ETA.

A watchdog that may ``adapt`` asks for a new plan instead, without waiting out the bound:
when a node was lost and such demand has waited :data:`WAITING_SECONDS` while CPUs are
left, or when a node joined the cluster (and ``grow()`` says enough work is left to use
it). It stops the run the same way, with :attr:`Watchdog.replan` saying why; the engine
plans the units not yet done against the cluster as it is now and goes on in the same
run. A cluster with no CPU left cannot be planned for: that still waits out the bound.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from chute.engines.resources import Cluster, Node
from chute.errors import StallError

log = logging.getLogger("chute")

STALL_SECONDS = 60.0
"""No progress for this long while demand no node can run waits: the run stops.
``CHUTE_STALL_SECONDS`` overrides it (tests use a few seconds)."""
WAITING_SECONDS = 5.0
"""Demand that waited this long shows on the progress line."""
POLL_SECONDS = 1.0
_POOL_ACTOR = "MapWorker("
_RAY_ITERATOR = "iter_threaded"
"""The name of the threads in which Ray Data's ``iter_batches`` pulls blocks."""


def stall_seconds() -> float:
    """The bound in force: ``CHUTE_STALL_SECONDS`` if set, else :data:`STALL_SECONDS`."""
    value = os.environ.get("CHUTE_STALL_SECONDS")
    return float(value) if value else STALL_SECONDS


class Stalled(Exception):
    """Raised in the thread that pulls Ray Data's output to stop the run; the engine turns
    it into the watchdog's :class:`StallError`. An Exception: Ray Data's iterator thread
    hands exceptions on to the consumer, as it does a failed batch's."""


@dataclass(frozen=True)
class Sample:
    """What the cluster looked like at one moment."""

    pending: list[dict[str, float]]
    """Resource shapes Ray has tasks or actors waiting for (one entry a shape)."""
    nodes: tuple[Node, ...]
    held: dict[str, float] = field(default_factory=dict)
    """CPUs held by chute's model actors, by node address."""

    def hopeless(self) -> list[dict[str, float]]:
        """The pending shapes no alive node can run even when its tasks have finished."""
        return [
            shape for shape in self.pending if not any(self._fits(shape, n) for n in self.nodes)
        ]

    def _fits(self, shape: Mapping[str, float], node: Node) -> bool:
        cpus = node.cpus - self.held.get(node.address, 0.0)
        return shape.get("CPU", 0.0) <= cpus + 1e-9 and shape.get("GPU", 0.0) <= node.gpus + 1e-9


def sample(actor_cpus: float) -> Sample:
    """Ray's pending demand, alive nodes and model actors now (through the GCS: no dashboard)."""
    import ray
    from ray.autoscaler.v2.sdk import get_cluster_status

    status = get_cluster_status(ray.get_runtime_context().gcs_address)
    pending = [
        dict(request.bundle)
        for demand in status.resource_demands.ray_task_actor_demand
        for request in demand.bundles_by_count
        if request.count > 0
    ]
    nodes = tuple(Node.from_ray(n) for n in ray.nodes() if n.get("Alive"))
    return Sample(pending, nodes, _held(actor_cpus))


def _held(actor_cpus: float) -> dict[str, float]:
    """CPUs chute's model actors hold on each node (``actor_cpus`` each)."""
    import ray

    by_id = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    held: dict[str, float] = {}
    job = ray.JobID.from_hex(ray.get_runtime_context().get_job_id())
    for actor in ray._private.state.actors(job_id=job).values():
        name = str(actor.get("ActorClassName"))
        if actor.get("State") == "ALIVE" and name.startswith(_POOL_ACTOR) and "ModelActor" in name:
            address = by_id.get(actor.get("Address", {}).get("NodeID"), "?")
            held[address] = held.get(address, 0.0) + actor_cpus
    return held


@dataclass
class Watchdog:
    """Watches one run from a daemon thread; :meth:`progress` on every record that arrives.

    ``actor_cpus``: the least CPUs a model actor of the run holds (the conservative side:
    demand is called hopeless only when even that much would not leave room).
    """

    started: Cluster
    actor_cpus: float
    waiting: Callable[[str], None] = lambda _: None
    """Told what to show in place of the ETA: ``"waiting for resources: …"`` while demand
    waits, the nodes lost since the start (``"lost node 127.0.0.3 (1 CPU) at 0:42"``),
    ``""`` for nothing."""
    bound: float = field(default_factory=stall_seconds)
    poll: float = POLL_SECONDS
    probe: Callable[[float], Sample] = sample
    log_note: str = ""
    """Where Ray's own messages went, for the error (``" Ray's messages: …"``)."""
    adapt: bool = False
    """Ask for a new plan when a node is lost or joins (see the module's text)."""
    grow: Callable[[], bool] = lambda: True
    """Whether enough work is left to re-plan for a node that joined."""
    began: float = field(default_factory=time.monotonic)
    """When the run began (``time.monotonic()``), for the times of lost nodes."""
    error: StallError | None = None
    replan: str | None = None
    """Why the run was stopped to be planned again (``"lost node …"``, ``"node … joined"``)."""
    _last: float = field(default_factory=time.monotonic)
    _since: float | None = None
    _shown: bool = False
    lost: dict[str, str] = field(default_factory=dict)
    """Each node lost since the start, by address: ``"127.0.0.3 (1 CPU) at 0:42"``, and
    how long before Ray declared it dead its last output had arrived (``", 12 s after its
    last output"``), or, for a node whose workers wrote nothing (its reads fed a model on
    another node), the run's last output: the longest the run waited on Ray to say so."""
    heard: dict[str, float] = field(default_factory=dict)
    """When output last arrived from each node (``time.monotonic()``), by address."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _target: int = 0

    def __enter__(self) -> Watchdog:
        self._target = threading.get_ident()
        threading.Thread(target=self._watch, name="chute-watchdog", daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        with self._lock:  # from here on no Stalled is raised in this thread
            self._stop.set()

    def progress(self, nodes: Iterable[str] = ()) -> None:
        """Output arrived (from workers on ``nodes``, by address)."""
        self._last = time.monotonic()
        for node in nodes:
            self.heard[node] = self._last
        if self._shown:
            self._shown = False
            self.waiting(self._lost_note())

    def _lost_note(self) -> str:
        return f"lost node {', '.join(self.lost.values())}" if self.lost else ""

    def _note_lost(self, found: Sample, now: float) -> None:
        alive = {n.address for n in found.nodes}
        gone = [
            n for n in self.started.nodes if n.address not in alive and n.address not in self.lost
        ]
        for node in gone:
            minutes, seconds = divmod(int(now - self.began), 60)
            quiet = ""
            if node.address in self.heard:  # its workers wrote: how long it had been silent
                quiet = f", {now - self.heard[node.address]:.0f} s after its last output"
            elif self.heard:  # its reads fed others: how long the run had been waiting
                quiet = f", {now - max(self.heard.values()):.0f} s after the run's last output"
            self.lost[node.address] = (
                f"{node.address} ({node.cpus:g} CPU) at {minutes}:{seconds:02d}{quiet}"
            )
            log.info("lost node %s", self.lost[node.address])
        if gone and not self._shown:
            self.waiting(self._lost_note())

    def _watch(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                found = self.probe(self.actor_cpus)
            except Exception:  # a GCS that does not answer this once: look again
                log.debug("cannot sample the cluster", exc_info=True)
                continue
            if self.check(found, time.monotonic()):
                return

    def check(self, found: Sample, now: float) -> bool:
        """Look at one sample; True once the run is stopped."""
        self._note_lost(found, now)
        if self.adapt and (joined := self._joined(found)) and self.grow():
            return self._stop_run(replan=f"node {joined} joined")
        hopeless = found.hopeless()
        if not hopeless:
            self._since = None
            return False
        self._since = self._since if self._since is not None else now
        waited = now - max(self._since, self._last)
        patience = min(WAITING_SECONDS, self.bound / 2)
        if self.adapt and self.lost and waited >= patience and any(n.cpus for n in found.nodes):
            return self._stop_run(replan=self._lost_note())
        if waited >= patience and not self._shown:
            self._shown = True
            lost = self._lost_note()
            self.waiting(
                f"waiting for resources: {_shapes(hopeless)} pending"
                + (f" · {lost}" if lost else "")
            )
        if waited < self.bound:
            return False
        return self._stop_run(error=StallError(self.diagnose(found, hopeless)))

    def _joined(self, found: Sample) -> str:
        """Nodes with CPUs or GPUs that were not there at the start (``""``: none)."""
        if not self.started.nodes:  # nothing known to compare with
            return ""
        known = {n.address for n in self.started.nodes}
        new = [n for n in found.nodes if n.address not in known and (n.cpus or n.gpus)]
        return ", ".join(f"{n.address} ({n.cpus:g} CPU)" for n in new)

    def _stop_run(self, error: StallError | None = None, replan: str | None = None) -> bool:
        with self._lock:
            if self._stop.is_set():
                return True
            self.error, self.replan = error, replan
            if replan is not None:
                log.info("planning again: %s", replan)
            self._raise_in_target()
        return True

    def diagnose(self, found: Sample, hopeless: Sequence[Mapping[str, float]]) -> str:
        """What is pending, what the cluster has and lost, and what to do."""
        alive = {n.address for n in found.nodes}
        lost = [n for n in self.started.nodes if n.address not in alive]
        cpus, gpus = sum(n.cpus for n in found.nodes), sum(n.gpus for n in found.nodes)
        now = Cluster(cpus, gpus, nodes=found.nodes)
        held = sum(found.held.values())
        text = (
            f"no progress for {self.bound:g} s: Ray has {_shapes(hopeless)} pending (read tasks "
            f"or model actors) that no node can run. The cluster has {now.describe()}, "
            f"{held:g} CPU of it held by model actors"
        )
        if lost:
            text += f"; lost since the start: {'; '.join(str(n) for n in lost)}"
        return (
            f"{text}. Committed units are kept: add a node (or CPUs), then run the same "
            "command again; it resumes and plans against the cluster as it is then. "
            f"CHUTE_STALL_SECONDS sets how long to wait.{self.log_note}"
        )

    def _raise_in_target(self) -> None:
        """Stop the run: raise :class:`Stalled` in Ray Data's iterator threads, which poll
        in Python and hand it to the consumer (the engine's streaming loop, blocked on their
        queue, where an exception raised in it would wait for a batch that never comes);
        where Ray iterates in the consumer's own thread, in that thread."""
        ray_threads = [t.ident for t in threading.enumerate() if t.name == _RAY_ITERATOR]
        for ident in [i for i in ray_threads if i is not None] or [self._target]:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(ident), ctypes.py_object(Stalled)
            )


def _shapes(shapes: Sequence[Mapping[str, float]]) -> str:
    """``{CPU: 1}, {CPU: 1, GPU: 1, memory: 1.2 MiB}``."""
    return ", ".join("{" + ", ".join(_amounts(shape)) + "}" for shape in shapes)


def _amounts(shape: Mapping[str, float]) -> list[str]:
    return [
        f"{k}: {v / 2**20:.1f} MiB" if k == "memory" else f"{k}: {v:g}"
        for k, v in sorted(shape.items())
    ]
