"""The Ray session a run uses: connect to a cluster or start a quiet local Ray, ship the
job's directory to the workers, and read what the cluster has."""

from __future__ import annotations

import logging
import os
import socket
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from chute.engines.resources import Cluster
from chute.errors import ConfigError
from chute.plan import Plan

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
    if not verbose:
        ray_lines_to(ray_log())
    _shipped["working_dir"] = wanted if isinstance(wanted, str) and "://" not in wanted else None
    return _shipped["working_dir"]


def ray_log() -> str:
    """The file this driver's Ray messages go to without ``--verbose``."""
    return os.path.join(tempfile.gettempdir(), "chute", f"ray-{os.getpid()}.log")


def ray_lines_to(path: str) -> None:
    """Send the lines Ray's driver prints about the cluster (``(raylet) … has been marked
    dead``, ``… infinite retries remaining``) to ``path`` instead of the terminal: Ray
    prints them from a thread of its own, through one function of its worker module."""
    from ray._private import worker

    def to_file(data: dict[str, Any], ignore_prefix: bool) -> None:
        with open(path, "a", encoding="utf-8") as log_file:
            worker.print_worker_logs(data, log_file, ignore_prefix)

    os.makedirs(os.path.dirname(path), exist_ok=True)
    if hasattr(worker, "print_to_stdstream") and hasattr(worker, "print_worker_logs"):
        worker.print_to_stdstream = to_file


def job_runtime_env(plan: Plan) -> dict[str, Any]:
    """The job's runtime_env, with its output, its inputs and build debris excluded."""
    env = dict(plan.job.runtime_env)
    root = env.get("working_dir")
    if not isinstance(root, str) or "://" in root:
        return env
    paths = [plan.job.output.path] if plan.job.output is not None else []
    paths += list(getattr(plan.source, "paths", []))
    paths = [p for p in paths if p]  # a catalog's table has no path of its own
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


def local_memory() -> tuple[int, str] | None:
    """The memory (bytes) a local Ray that chute starts offers tasks and actors, and what
    that is: what its object store (30% by default) leaves of the memory this machine has
    available now, by Ray's own estimate; ``None`` where Ray's estimate cannot be had, or
    where this process has a Ray already (the run checks against what it offers)."""
    import ray

    if ray.is_initialized():
        return None
    try:
        from ray._private.utils import estimate_available_memory, resolve_object_store_memory

        available = int(estimate_available_memory())
        offered = available - int(resolve_object_store_memory(available))
    except (ImportError, AttributeError, TypeError, ValueError):  # Ray's internals moved
        return None
    return offered, "a local Ray (what its object store leaves of the memory free now)"


def cluster() -> Cluster:
    """What the connected cluster has now: its totals and each alive node."""
    import ray

    return Cluster.from_ray(ray.cluster_resources(), ray.nodes())
