"""The ray engine: Ray Data streaming execution.

::

    read tasks (one per unit) ─► [preprocess, fused into the read tasks]
        ─► model 1 actor pool ─► … ─► model N actor pool, which also writes its parts
        ─► the driver iterates over part records only

The units come from chute's own plan through a custom datasource, so Ray Data lists no
files itself. Each model's function or class and its constructor arguments are put in
the object store once and fetched by reference in each actor's constructor. Resources
are planned by :mod:`chute.engines.resources` so that reads can never starve.

Modules: :mod:`~chute.engines.ray.session` (connecting, shipping code),
:mod:`~chute.engines.ray.operators` (what runs in Ray's tasks and actors),
:mod:`~chute.engines.ray.engine` (the plan mapped onto Ray Data),
:mod:`~chute.engines.ray.release` (giving a run's actors and CPUs back).
"""

from chute.engines.ray.engine import RayEngine
from chute.engines.ray.release import live_pool_actors, released
from chute.engines.ray.session import (
    SHIP_EXCLUDES,
    cluster,
    init_ray,
    job_runtime_env,
    local_memory,
    portable,
)

__all__ = [
    "SHIP_EXCLUDES",
    "RayEngine",
    "cluster",
    "init_ray",
    "job_runtime_env",
    "live_pool_actors",
    "local_memory",
    "portable",
    "released",
]
