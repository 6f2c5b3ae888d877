"""Engines move batches between the stages a plan describes; the stage logic is elsewhere.

An engine maps a :class:`~chute.plan.Plan` onto a mechanism — threads joined by bounded
channels (``local``), Ray Data operators and actor pools (``ray``) — and decides nothing
a user can see in the output: the rows, values, parts, metrics and ledger come from the
shared stages, writer and committer. The runner talks to engines only through
:class:`Engine` and this registry, which imports an engine's module when it is used.

Adding an engine is one module with a class that has the methods of :class:`Engine` and
a ``from_options`` constructor, and one line in :data:`ENGINES`.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from chute.errors import ConfigError, did_you_mean
from chute.sources import DatasetSource

if TYPE_CHECKING:
    from chute.engines.resources import StageResources
    from chute.job import JobSpec
    from chute.plan import Plan
    from chute.report import StageStats
    from chute.sinks import PartRecord

Counters = Mapping[str, Mapping[str, float]]
"""What the models counted, by stage (see ``Adapter.take_counters``)."""


class Commit(Protocol):
    """What an engine hands each batch of part records to (the driver's committer), with
    what the models counted since the last call, for the progress line (optional: the
    report's totals come from the stage statistics), and a ``status`` to show in place of
    the ETA while the engine waits (``"waiting for resources: …"``; ``""`` clears it)."""

    def __call__(
        self,
        records: list[PartRecord],
        counters: Counters | None = None,
        status: str | None = None,
    ) -> None: ...

    def redo(self) -> set[int]:
        """Forget the parts of every unit not complete yet (an engine that stopped its
        work midway runs them again) and return their indexes: the units still to run."""
        ...


@dataclass(frozen=True)
class EngineOptions:
    """How to reach the engine's machines, and how much of it to show."""

    address: str | None = None
    """A cluster to run on (``RAY_ADDRESS`` when ``None``), for engines that have one."""
    verbose: bool = False
    """Show the engine's own progress bars and logs."""


class Engine(Protocol):
    """Runs a plan's pending units and hands the part records back as they come."""

    def prepare(self, plan: Plan) -> None:
        """Fail before anything is written if the plan cannot run here (GPUs the machine
        lacks, pools that cannot fit, an unreachable cluster)."""
        ...

    def execute(self, plan: Plan, commit: Commit) -> dict[str, StageStats]:
        """Run ``plan.pending``; call ``commit`` with part records as they are written;
        return the busy time of each stage."""
        ...

    def stage_resources(self, plan: Plan) -> tuple[list[StageResources], str]:
        """The resources each model stage would get, and on what basis (``chute plan``)."""
        ...

    def events(self) -> list[str]:
        """What happened to the machines during the last :meth:`execute`, for the report:
        nodes lost (and when), where the engine's own messages went; ``[]`` for none."""
        ...


@dataclass(frozen=True)
class _Entry:
    module: str
    attribute: str
    requires: str | None = None
    """A package the engine needs, and so the extra that installs it."""
    clusters: bool = False
    """Whether the engine runs on a cluster given by an address."""
    local_memory: str | None = None
    """A function of the module that says how much memory (bytes) the engine offers
    replicas when it runs on this machine; ``None``: the machine's."""


ENGINES: dict[str, _Entry] = {
    "local": _Entry("chute.engines.local", "LocalEngine"),
    "ray": _Entry(
        "chute.engines.ray", "RayEngine", requires="ray", clusters=True, local_memory="local_memory"
    ),
}
"""Every engine by name; the first is the embedded default."""


def names() -> tuple[str, ...]:
    """The registered engines' names."""
    return tuple(ENGINES)


AUTO = "auto"
"""The engine name that lets :func:`choose` pick."""


def check_name(name: str) -> str:
    """``name`` if it is ``auto`` or a registered engine; else a :class:`ConfigError` that
    lists them, with a did-you-mean."""
    allowed = (AUTO, *ENGINES)
    if name not in allowed:
        raise ConfigError(
            f"engine {name!r} is not one of {', '.join(allowed)}.{did_you_mean(name, allowed)}"
        )
    return name


def create(name: str, options: EngineOptions | None = None) -> Engine:
    """The engine called ``name``, its module imported now."""
    if check_name(name) == AUTO:
        raise ValueError("'auto' names no engine: pass the name choose() returns")
    entry = ENGINES[name]
    if entry.requires and importlib.util.find_spec(entry.requires) is None:
        raise ConfigError(
            f"the {name} engine needs {entry.requires}, which is not installed: "
            f"pip install 'chute[{entry.requires}]'."
        )
    cls = getattr(importlib.import_module(entry.module), entry.attribute)
    engine: Engine = cls.from_options(options or EngineOptions())
    return engine


def local_memory(name: str) -> tuple[int, str] | None:
    """The memory (bytes) the engine ``name`` offers replicas on this machine, and what
    that is, where it is less than the machine's; ``None`` where it is the machine's or
    the engine is not installed."""
    entry = ENGINES[name]
    if entry.local_memory is None:
        return None
    if entry.requires and importlib.util.find_spec(entry.requires) is None:
        return None
    offered: Callable[[], tuple[int, str] | None]
    offered = getattr(importlib.import_module(entry.module), entry.local_memory)
    return offered()


def choose(job: JobSpec) -> tuple[str, str]:
    """Which engine runs ``job``, and why (``chute plan`` and the report say it)."""
    if check_name(job.engine) != AUTO:
        named = job.address and job.address != os.environ.get("RAY_ADDRESS")  # a node's own
        if named and not ENGINES[job.engine].clusters:
            raise ConfigError(  # else the job ran here, not on the cluster it named
                f"the job asks for the {job.engine} engine, which runs in this process, and "
                f"for the cluster {job.address}: drop the address, or set engine: auto (or "
                f"{', '.join(n for n, e in ENGINES.items() if e.clusters)}) to run there."
            )
        return job.engine, f"the job asks for the {job.engine} engine"
    if job.address:
        return "ray", f"a cluster address was given ({job.address})"
    if os.environ.get("RAY_ADDRESS"):
        return "ray", "RAY_ADDRESS is set"
    if isinstance(job.source, DatasetSource):
        return "ray", "the input is a Ray Dataset"
    return "local", "no cluster address: the embedded local engine runs in-process, no start-up"
